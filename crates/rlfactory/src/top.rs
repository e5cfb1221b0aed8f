//! `rlfactory top`: a live view of a running experiment, from another terminal on the same machine.
//!
//! A training run publishes a [`LiveView`] once a second on a [`SharedBoard`], a small shared-memory segment tagged
//! `top-<n>-<experiment>` (so that `top` finds it without a file and without the experiment folder; the segment goes
//! when the run does, and the shared-memory reaper removes it after a SIGKILL). The view holds what lives only in the
//! run's main process: its frame rate, each policy's version and lag, each loop's process, thread, heartbeat and
//! waiting messages (the inference workers' requests; the batcher's trajectories, on the learner's loop for APPO and
//! on the main loop for DQN and SAC), each replay buffer's fill and the inserts its rate limit held back. `top`
//! reads it and adds each loop's share of a core from `/proc`, which costs the run nothing. It waits for the next
//! frame on the run's process (a pidfd) with a deadline, so it ends as soon as the run's process does, or at the next
//! frame once the run removed its board (a run inside a longer-lived process, as a library's caller runs it).

use std::io::{IsTerminal, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use rlf_shm::{SharedBoard, TornRead};
use rlf_signal::{LoopStatus, Placement};
use serde::{Deserialize, Serialize};

use crate::error::{Result, RlfError};

/// The tag of every run's board begins so.
const TAG_PREFIX: &str = "top-";

/// Room for the view of a run of several hundred loops.
const BOARD_BYTES: usize = 1 << 18;

/// How often a run publishes its view.
pub const LIVE_PERIOD: Duration = Duration::from_secs(1);

/// What a run shows `top`, once a second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveView {
    /// `--experiment`.
    pub experiment: String,
    /// `--train_dir`.
    pub train_dir: PathBuf,
    /// The run's main process.
    pub pid: u32,
    /// Seconds since the process started.
    pub seconds: f64,
    /// Env frames so far.
    pub env_frames: u64,
    /// Env frames per second since the last view.
    pub fps: f64,
    /// Mean return over the last episodes of every policy.
    pub mean_return: Option<f64>,
    /// Episodes finished.
    pub episodes: u64,
    /// By policy index.
    pub policies: Vec<PolicyLive>,
    /// Every loop of the run, the main loop first.
    pub loops: Vec<LoopStatus>,
    /// The off-policy learners' replay buffers.
    pub replays: Vec<ReplayLive>,
    /// The run is stopping.
    pub stopping: bool,
}

/// One policy in a [`LiveView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyLive {
    /// Its learner's version.
    pub version: u64,
    /// Versions between the policy that acted and the one that learned, averaged over the learner's last dataset.
    pub lag: f64,
    /// Mean return of its last episodes.
    pub mean_return: Option<f64>,
    /// Agent steps it took.
    pub agent_steps: u64,
}

/// One replay buffer in a [`LiveView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayLive {
    /// Rows it holds.
    pub rows: usize,
    /// Rows it can hold.
    pub capacity: usize,
    /// Rows inserted so far.
    pub inserted: u64,
    /// Rows the learners sampled.
    pub sampled: u64,
    /// Inserts the rate limit held back (the learner was the slow side), and their seconds of waiting.
    pub stalls: u64,
    /// Seconds the held-back inserts waited in all.
    pub stalled_seconds: f64,
}

/// The run's side: its board, and the frames of its last view (for the frame rate).
#[derive(Debug)]
pub struct LiveBoard {
    board: SharedBoard,
    /// When the frame rate was last counted, the frames then, and the rate.
    last: Option<(Instant, u64, f64)>,
}

/// Boards made by this process so far (a process may run several trainings, as the tests do).
static BOARDS: AtomicU32 = AtomicU32::new(0);

impl LiveBoard {
    /// A board for the run of `experiment`.
    pub fn create(experiment: &str) -> Result<Self> {
        let n = BOARDS.fetch_add(1, Ordering::Relaxed);
        let readable: String = experiment
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
                _ => '_',
            })
            .take(rlf_shm::region::MAX_TAG - 24)
            .collect();
        let board = SharedBoard::create_tagged(&format!("{TAG_PREFIX}{n}-{readable}"), BOARD_BYTES)?;
        Ok(Self { board, last: None })
    }

    /// Publishes `view`, its frame rate counted since the last one; a view too large for the board is cut to its
    /// first loops.
    pub fn publish(&mut self, mut view: LiveView) -> Result<()> {
        let now = Instant::now();
        match self.last {
            // A view published out of turn (the run stopping) shows the last rate.
            Some((then, _, fps)) if now.duration_since(then) < LIVE_PERIOD / 2 => view.fps = fps,
            last => {
                if let Some((then, frames, _)) = last {
                    let dt = now.duration_since(then).as_secs_f64().max(1e-9);
                    view.fps = view.env_frames.saturating_sub(frames) as f64 / dt;
                }
                self.last = Some((now, view.env_frames, view.fps));
            }
        }
        loop {
            let bytes = serde_json::to_vec(&view).map_err(|e| RlfError::Io {
                what: "encoding the live view of",
                path: view.train_dir.join(&view.experiment),
                source: e.into(),
            })?;
            if self.board.publish(&bytes) {
                return Ok(());
            }
            if view.loops.is_empty() {
                return Err(RlfError::Protocol {
                    component: "live view",
                    message: format!(
                        "{} bytes do not fit its board of {}",
                        bytes.len(),
                        self.board.capacity()
                    ),
                });
            }
            view.loops.truncate(view.loops.len() / 2);
        }
    }
}

/// `rlfactory top`.
#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// The experiment to watch (its `--experiment`); without it, the one run on this machine.
    #[arg(long)]
    pub experiment: Option<String>,
    /// The run's process id, where several runs have the experiment's name.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Seconds between two frames.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Print one frame (one interval after attaching, so that the CPU shares are measured) and exit.
    #[arg(long)]
    pub once: bool,
}

impl TopArgs {
    /// Checks the values.
    pub fn check(&self) -> Result<()> {
        if !(self.interval.is_finite() && (0.05..=3600.0).contains(&self.interval)) {
            return Err(RlfError::Config(format!(
                "--interval must be between 0.05 and 3600 seconds, got {}",
                self.interval
            )));
        }
        Ok(())
    }
}

/// A run found on this machine: its process, its board and the board's segment.
struct Attached {
    pid: u32,
    board: SharedBoard,
    name: String,
    view: LiveView,
}

/// The boards of the runs on this machine that `args` names, each with its view.
fn find(args: &TopArgs) -> Result<Vec<Attached>> {
    let segments = rlf_shm::region::tagged(TAG_PREFIX).map_err(|e| RlfError::Io {
        what: "listing the runs in",
        path: "/dev/shm".into(),
        source: e,
    })?;
    let mut runs = Vec::new();
    for (pid, name) in segments {
        if args.pid.is_some_and(|p| p != pid) {
            continue;
        }
        // A run that ended between the listing and the opening is no longer there: skipped.
        let Ok(board) = SharedBoard::open_named(&name) else {
            continue;
        };
        let Some(view) = read(&board) else { continue };
        if args.experiment.as_ref().is_none_or(|e| *e == view.experiment) {
            runs.push(Attached {
                pid,
                board,
                name,
                view,
            });
        }
    }
    Ok(runs)
}

/// The board's view; `None` before the run's first one (or from a writer that died mid-write).
fn read(board: &SharedBoard) -> Option<LiveView> {
    // A read overlaps a write once in a long while (a write takes microseconds, once a second): read again.
    (0..100).find_map(|_| match board.try_read() {
        Ok(bytes) => Some(serde_json::from_slice(&bytes).ok()),
        Err(TornRead) => None,
    })?
}

/// Watches the run `args` names until it ends (or for one frame with `--once`), writing frames to `out`.
pub fn top(args: &TopArgs, out: &mut impl Write) -> Result<()> {
    let mut runs = find(args)?;
    let run = match runs.len() {
        1 => runs.remove(0),
        0 => {
            let which = match (&args.experiment, args.pid) {
                (Some(e), _) => format!("named {e:?} "),
                (None, Some(pid)) => format!("with pid {pid} "),
                (None, None) => String::new(),
            };
            return Err(watch_error(format!(
                "no run {which}is training on this machine (a run shows itself once it has started)"
            )));
        }
        _ => {
            let list: Vec<String> = runs
                .iter()
                .map(|r| format!("{} (pid {})", r.view.experiment, r.pid))
                .collect();
            return Err(watch_error(format!(
                "{} runs match: {}; choose one with --experiment or --pid",
                runs.len(),
                list.join(", ")
            )));
        }
    };
    let ended = rustix::process::Pid::from_raw(run.pid as i32)
        .and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok())
        .ok_or_else(|| watch_error(format!("the run's process {} is gone", run.pid)))?;
    let interval = Duration::from_secs_f64(args.interval);
    let clear = !args.once && std::io::stdout().is_terminal();
    let mut cpu = CpuClock::default();
    cpu.sample(&run.view.loops);
    let mut view = run.view;
    let segment = PathBuf::from(format!("/dev/shm{}", run.name));
    loop {
        // The run ended: its process exited, or it removed its board (its runner stopped in a process that goes on).
        if wait_for_exit(&ended, interval)? || !segment.exists() {
            let _ = writeln!(out, "the run of {} (pid {}) has ended", view.experiment, run.pid);
            return Ok(());
        }
        if let Some(latest) = read(&run.board) {
            view = latest;
        }
        let shares = cpu.sample(&view.loops);
        let frame = render(&view, &shares);
        let written = if clear {
            write!(out, "\x1b[H\x1b[2J{frame}")
        } else {
            writeln!(out, "{frame}")
        };
        written.and_then(|()| out.flush()).map_err(|e| RlfError::Io {
            what: "writing the live view of",
            path: view.train_dir.join(&view.experiment),
            source: e,
        })?;
        if args.once {
            return Ok(());
        }
    }
}

/// What stops `top` (a run to watch is missing or ambiguous): `top: <message>`, exit code 1.
fn watch_error(message: String) -> RlfError {
    RlfError::Protocol {
        component: "top",
        message,
    }
}

/// Waits up to `interval` for the process of `pidfd` to exit; whether it has.
fn wait_for_exit(pidfd: &OwnedFd, interval: Duration) -> Result<bool> {
    let deadline = Instant::now() + interval;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = rustix::event::Timespec::try_from(left).map_err(|_| {
            watch_error(format!(
                "--interval {} s is too long to wait",
                interval.as_secs_f64()
            ))
        })?;
        let mut fds = [rustix::event::PollFd::new(pidfd, rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            // A signal (the terminal resized) ends the wait early: wait out the rest.
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(watch_error(format!("waiting for the run's process failed: {e}"))),
        }
    }
}

/// Each loop's CPU time at the last sample, for its share of a core since then.
#[derive(Default)]
struct CpuClock {
    last: Option<(Instant, Vec<Option<u64>>)>,
}

impl CpuClock {
    /// Each loop's share of one core since the last sample (`None`: the first sample, or the loop's process or
    /// thread could not be read).
    fn sample(&mut self, loops: &[LoopStatus]) -> Vec<Option<f64>> {
        let now = Instant::now();
        let ticks: Vec<Option<u64>> = loops.iter().map(cpu_ticks).collect();
        let per_second = rustix::param::clock_ticks_per_second() as f64;
        let shares = match &self.last {
            Some((then, before)) if before.len() == ticks.len() => {
                let dt = now.duration_since(*then).as_secs_f64().max(1e-9);
                ticks
                    .iter()
                    .zip(before)
                    .map(|(t, b)| Some((*t)?.saturating_sub((*b)?) as f64 / per_second / dt))
                    .collect()
            }
            _ => vec![None; ticks.len()],
        };
        self.last = Some((now, ticks));
        shares
    }
}

/// The CPU time (user and system, in clock ticks) of a loop: its whole process for a process loop (libtorch's
/// threads included, as the loop's own counters count it), its thread otherwise.
fn cpu_ticks(l: &LoopStatus) -> Option<u64> {
    let pid = l.pid?;
    let path = match l.placement {
        Placement::Process => format!("/proc/{pid}/stat"),
        Placement::Main | Placement::Thread => format!("/proc/{pid}/task/{}/stat", l.tid?),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields resume after the command name's closing parenthesis; utime and stime are fields 14 and 15.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// One frame of the view: the run's figures, a line per loop, a line per replay buffer.
fn render(view: &LiveView, cpu: &[Option<f64>]) -> String {
    let ret = |r: Option<f64>| r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.1}"));
    let mut s = format!(
        "rlfactory top: {} (pid {}, {}){}\n{:.1} s | {} env frames | fps {:.0} | mean return {} ({} episodes)\n",
        view.experiment,
        view.pid,
        view.train_dir.display(),
        if view.stopping { " stopping" } else { "" },
        view.seconds,
        view.env_frames,
        view.fps,
        ret(view.mean_return),
        view.episodes,
    );
    for (i, p) in view.policies.iter().enumerate() {
        s.push_str(&format!(
            "policy {i}: version {} | policy lag {:.1} | mean return {} | {} agent steps\n",
            p.version,
            p.lag,
            ret(p.mean_return),
            p.agent_steps
        ));
    }
    s.push_str(&format!(
        "{:<20} {:>8} {:>7} {:>7} {:>10}  {}\n",
        "loop", "pid", "cpu %", "queued", "heartbeat", "components"
    ));
    for (l, cpu) in view.loops.iter().zip(cpu.iter().chain(std::iter::repeat(&None))) {
        let pid = l.pid.map_or_else(|| "-".to_owned(), |p| p.to_string());
        let cpu = cpu.map_or_else(|| "-".to_owned(), |c| format!("{:.1}", 100.0 * c));
        let queued = l.queued.map_or_else(|| "-".to_owned(), |q| q.to_string());
        let beat = match (l.running, l.silent) {
            (false, _) => "stopped".to_owned(),
            (true, Some(silent)) => format!("{:.1} s ago", silent.as_secs_f64()),
            (true, None) => "-".to_owned(),
        };
        let restarted = match l.incarnation {
            0 => String::new(),
            n => format!(" (replaced {n}x)"),
        };
        s.push_str(&format!(
            "{:<20} {pid:>8} {cpu:>7} {queued:>7} {beat:>10}  {}{restarted}\n",
            l.name,
            l.objects.join(", ")
        ));
    }
    for (i, r) in view.replays.iter().enumerate() {
        s.push_str(&format!(
            "replay {i}: {} of {} rows | {} inserted, {} sampled | rate limit held {} inserts back for {:.1} s\n",
            r.rows, r.capacity, r.inserted, r.sampled, r.stalls, r.stalled_seconds
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(loops: Vec<LoopStatus>) -> LiveView {
        LiveView {
            experiment: "exp".into(),
            train_dir: "dir".into(),
            pid: std::process::id(),
            seconds: 1.5,
            env_frames: 1000,
            fps: 0.0,
            mean_return: Some(20.0),
            episodes: 3,
            policies: vec![PolicyLive {
                version: 7,
                lag: 1.5,
                mean_return: None,
                agent_steps: 1000,
            }],
            loops,
            replays: vec![ReplayLive {
                rows: 10,
                capacity: 100,
                inserted: 10,
                sampled: 40,
                stalls: 2,
                stalled_seconds: 0.25,
            }],
            stopping: false,
        }
    }

    fn main_loop() -> LoopStatus {
        LoopStatus {
            name: "main".into(),
            objects: vec!["runner".into(), "batcher".into()],
            placement: Placement::Main,
            pid: Some(std::process::id()),
            tid: Some(rustix::thread::gettid().as_raw_nonzero().get() as u32),
            silent: None,
            queued: Some(4),
            incarnation: 0,
            running: true,
        }
    }

    #[test]
    fn a_published_view_is_found_by_its_experiment_and_read_back() {
        let name = format!("top unit test {}", std::process::id());
        let mut board = LiveBoard::create(&name).unwrap();
        let mut published = view(vec![main_loop()]);
        published.experiment = name.clone();
        board.publish(published.clone()).unwrap();
        let args = TopArgs {
            experiment: Some(name),
            pid: None,
            interval: 1.0,
            once: true,
        };
        let found = find(&args).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].pid, std::process::id());
        assert_eq!(found[0].view, published);
        let none = TopArgs {
            experiment: Some("no such experiment".into()),
            ..args
        };
        let err = top(&none, &mut Vec::new()).unwrap_err().to_string();
        assert_eq!(
            err,
            "top: no run named \"no such experiment\" is training on this machine (a run shows itself once it has \
             started)"
        );
    }

    #[test]
    fn top_ends_when_a_run_in_a_process_that_goes_on_removes_its_board() {
        let name = format!("top ends {}", std::process::id());
        let mut board = LiveBoard::create(&name).unwrap();
        let mut published = view(vec![main_loop()]);
        published.experiment = name.clone();
        board.publish(published).unwrap();
        let args = TopArgs {
            experiment: Some(name.clone()),
            pid: None,
            interval: 0.05,
            once: false,
        };
        let watching = std::thread::spawn(move || {
            let mut out = Vec::new();
            top(&args, &mut out).map(|()| String::from_utf8(out).unwrap())
        });
        std::thread::sleep(Duration::from_millis(200));
        drop(board);
        let out = watching.join().unwrap().unwrap();
        assert!(out.contains(&format!("rlfactory top: {name} (pid ")), "{out}");
        assert!(
            out.ends_with(&format!(
                "the run of {name} (pid {}) has ended\n",
                std::process::id()
            )),
            "{out}"
        );
    }

    #[test]
    fn the_frame_rate_counts_the_frames_since_the_last_view() {
        let mut board = LiveBoard::create("fps").unwrap();
        board.publish(view(Vec::new())).unwrap();
        std::thread::sleep(LIVE_PERIOD / 2);
        let mut later = view(Vec::new());
        later.env_frames = 2000;
        board.publish(later.clone()).unwrap();
        let seen = read(&board.board).unwrap();
        assert!(seen.fps > 100.0 && seen.fps < 2000.0, "{}", seen.fps);
        // Out of turn (the run stopping), the last rate stands.
        later.env_frames = 2001;
        board.publish(later).unwrap();
        assert_eq!(read(&board.board).unwrap().fps, seen.fps);
    }

    #[test]
    fn a_frame_names_every_loop_and_component_with_its_cpu_share() {
        let mut worker = main_loop();
        worker.name = "rollout_worker_0".into();
        worker.objects = vec!["rollout_worker_0".into()];
        worker.placement = Placement::Process;
        worker.silent = Some(Duration::from_millis(300));
        worker.incarnation = 2;
        let frame = render(&view(vec![main_loop(), worker]), &[Some(0.5), None]);
        assert!(frame.contains("mean return 20.0 (3 episodes)"), "{frame}");
        assert!(frame.contains("policy 0: version 7 | policy lag 1.5"), "{frame}");
        let main = frame.lines().find(|l| l.starts_with("main ")).unwrap();
        assert!(
            main.contains(" 50.0 ") && main.ends_with("runner, batcher"),
            "{main}"
        );
        let worker = frame.lines().find(|l| l.starts_with("rollout_worker_0")).unwrap();
        assert!(
            worker.contains("0.3 s ago") && worker.ends_with("(replaced 2x)"),
            "{worker}"
        );
        assert!(
            frame.contains("rate limit held 2 inserts back for 0.2 s"),
            "{frame}"
        );
    }

    #[test]
    fn this_threads_cpu_time_is_read_and_grows() {
        let me = main_loop();
        let before = cpu_ticks(&me).unwrap();
        // Work until the thread's own CPU clock has run 50 ms (three clock ticks at 100 per second), however busy
        // the machine is.
        let clock = || rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        let start = clock();
        let mut x = 0u64;
        while Duration::try_from(clock()).unwrap()
            < Duration::try_from(start).unwrap() + Duration::from_millis(50)
        {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        assert!(x != 1);
        assert!(cpu_ticks(&me).unwrap() > before);
    }

    #[test]
    fn a_view_that_cannot_fit_its_board_is_an_error() {
        let mut board = LiveBoard::create("too large").unwrap();
        let mut huge = view(Vec::new());
        huge.experiment = "x".repeat(BOARD_BYTES);
        let err = board.publish(huge).unwrap_err().to_string();
        assert!(
            err.starts_with("live view: ") && err.contains("do not fit its board"),
            "{err}"
        );
    }
}
