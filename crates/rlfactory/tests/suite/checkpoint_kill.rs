//! SIGKILL of a whole `rlfactory train` process group (runner, rollout and inference workers, learner) while the
//! learner checkpoints every 50 ms, on one experiment folder, each round resuming the previous one: 50 rounds, and
//! more (up to 200) until at least two kills have cut a write short. Even rounds kill at a random moment; odd rounds
//! kill within a millisecond (uniform) of the learner creating a checkpoint's temporary file (seen through inotify), so
//! that writes are hit however short a write is beside a training step on the machine that runs the test. After
//! every kill:
//!
//! - the checkpoint the run last reported saved still loads, and so does every checkpoint whose sidecar exists;
//! - the trainer's own loader (on a copy of the folder, so that the next run meets the debris) finds a newest
//!   intact checkpoint whose env frames and policy version never go backwards;
//! - the next round resumes from exactly that checkpoint, and its start reclaims the killed run's `/dev/shm`
//!   segments.
//!
//! A last, uninterrupted run resumes from the newest intact checkpoint, trains to its time limit, and leaves only
//! complete checkpoints and no shared memory. The rounds where the kill cut a write short (a temporary file or new
//! weights without a sidecar was left) are counted, so the output shows that kills landed mid-write.
//! `RLF_CKPT_KILL_SEED` replays the kill delays of a failed run (its seed is in every message).

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rlfactory::config::CheckpointKind;
use rlfactory::experiment;

use common::BIN;
/// Rounds run, at least; more follow (up to `MAX_ROUNDS`) until `MIN_CUT_SHORT` kills have cut a write short.
const ROUNDS: usize = 50;
const MAX_ROUNDS: usize = 200;
const MIN_CUT_SHORT: usize = 2;
/// Bound on every wait for the child: starting, its first checkpoint, dying after SIGKILL.
const TIMEOUT: Duration = Duration::from_secs(60);
/// An even round's kill comes this many milliseconds (uniform) after the round's first checkpoint.
const KILL_DELAY_MS: (u64, u64) = (10, 400);
/// An odd round's kill comes this many microseconds (uniform) after a checkpoint write begins: inside the write (the
/// weights' and the sidecar's, with their fsyncs, take a few milliseconds), or just past it.
const MID_WRITE_DELAY_US: (u64, u64) = (0, 1000);
const SEED_VAR: &str = "RLF_CKPT_KILL_SEED";
const TEMP_PREFIX: &str = ".tmp.";

/// The flags of every run. 256-wide layers make a checkpoint about 0.5 MB, so writing it (with its fsyncs) takes a
/// good part of the 50 ms save period; small batches make the policy version advance between saves.
const COMMON: [&str; 11] = [
    "train",
    "--env=CartPole-v1",
    "--experiment=exp",
    "--encoder_mlp_layers=256,256",
    "--num_envs_per_worker=16",
    "--batch_size=512",
    "--num_epochs=1",
    "--keep_checkpoints=2",
    "--restart_behavior=resume",
    "--report_interval_sec=0.5",
    "--save_best_after=0",
];

/// xorshift64: the kill delays, reproducible from the seed.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// Uniform in `lo..=hi` (up to a negligible modulo bias).
    fn in_range(&mut self, (lo, hi): (u64, u64)) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        lo + x % (hi - lo + 1)
    }
}

/// A started `rlfactory train`: its pid (also its process group), its stderr lines as they come, its exit status.
struct Run {
    pid: u32,
    lines: Receiver<String>,
    exited: Receiver<ExitStatus>,
    /// Every line received so far.
    seen: Vec<String>,
}

impl Run {
    /// Starts `rlfactory` with `args` in a process group of its own.
    fn start(args: &[String]) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rlfactory");
        let pid = child.id();
        let stderr = child.stderr.take().expect("stderr");
        let (line_tx, lines) = mpsc::channel();
        let (exit_tx, exited) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line_tx.send(line).is_err() {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            let _ = exit_tx.send(child.wait().expect("wait rlfactory"));
        });
        Self {
            pid,
            lines,
            exited,
            seen: Vec::new(),
        }
    }

    /// The last lines received, for failure messages.
    fn tail(&self) -> String {
        let from = self.seen.len().saturating_sub(25);
        self.seen[from..].join("\n")
    }

    /// Receives lines until one is a checkpoint saved; returns its sidecar.
    fn next_saved(&mut self, ctx: &str) -> PathBuf {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let saved = saved_sidecar(&line);
                    self.seen.push(line);
                    if let Some(path) = saved {
                        return path;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "{ctx}: no checkpoint within {TIMEOUT:?}; stderr:\n{}",
                        self.tail()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "{ctx}: rlfactory ended before saving a checkpoint ({:?}); stderr:\n{}",
                    self.exited.recv_timeout(TIMEOUT),
                    self.tail()
                ),
            }
        }
    }

    /// Waits for the exit and for the end of stderr (every process of the run closed it); returns the status.
    fn finish(&mut self, ctx: &str) -> ExitStatus {
        let status = self
            .exited
            .recv_timeout(TIMEOUT)
            .unwrap_or_else(|e| panic!("{ctx}: rlfactory (pid {}) did not exit: {e}", self.pid));
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected) => return status,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{ctx}: a process of the run still holds stderr {TIMEOUT:?} after the exit")
                }
            }
        }
    }

    /// The sidecars of the checkpoints the run reported saved, in order.
    fn saved(&self) -> Vec<PathBuf> {
        self.seen.iter().filter_map(|l| saved_sidecar(l)).collect()
    }
}

/// The sidecar named by the learner's `saved <path>[ (new best)] in <n> ms` line; `None` for other lines and for a
/// line the kill cut short.
fn saved_sidecar(line: &str) -> Option<PathBuf> {
    let rest = line.strip_prefix("[rlfactory] saved ")?;
    let (path, _) = rest.strip_suffix(" ms")?.rsplit_once(" in ")?;
    Some(PathBuf::from(path.strip_suffix(" (new best)").unwrap_or(path)))
}

/// `(train_step, env_steps)` of a checkpoint file `checkpoint_<train_step>_<env_steps>.<ext>`: its age.
fn key(path: &Path) -> (u64, u64) {
    let name = file_name(path);
    let parsed = name
        .split_once('.')
        .and_then(|(stem, _)| stem.strip_prefix("checkpoint_"))
        .and_then(|rest| rest.split_once('_'))
        .and_then(|(t, e)| Some((t.parse().ok()?, e.parse().ok()?)));
    parsed.unwrap_or_else(|| panic!("{name} is not a regular checkpoint's name"))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Blocks until a temporary file is created in `dir` (a checkpoint write has begun), for at most `TIMEOUT`.
fn wait_for_a_write(dir: &Path, ctx: &str) {
    use rustix::fs::inotify;
    let fd =
        inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).expect("inotify_init");
    inotify::add_watch(&fd, dir, inotify::WatchFlags::CREATE)
        .unwrap_or_else(|e| panic!("{ctx}: watching {}: {e}", dir.display()));
    let deadline = Instant::now() + TIMEOUT;
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "{ctx}: no checkpoint write began within {TIMEOUT:?}"
        );
        let timeout = rustix::event::Timespec::try_from(left).expect("a timeout");
        let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => panic!("{ctx}: poll inotify: {e}"),
        }
        let mut events = inotify::Reader::new(&fd, &mut buf);
        loop {
            match events.next() {
                Ok(event) => {
                    let temp = event
                        .file_name()
                        .is_some_and(|n| n.to_bytes().starts_with(TEMP_PREFIX.as_bytes()));
                    if temp {
                        return;
                    }
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => break,
                Err(e) => panic!("{ctx}: read inotify: {e}"),
            }
        }
    }
}

/// Weights files (`checkpoint_*` or `best_*`) without their sidecar.
fn orphans(names: &[String]) -> BTreeSet<String> {
    names
        .iter()
        .filter(|n| !n.starts_with(TEMP_PREFIX))
        .filter_map(|n| n.strip_suffix(".safetensors"))
        .filter(|stem| !names.contains(&format!("{stem}.json")))
        .map(|stem| format!("{stem}.safetensors"))
        .collect()
}

/// The processes of process group `pgid`: the run's main process and the loops it spawned.
fn group_members(pgid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // After the command name in parentheses: state, ppid, pgrp.
            let pgrp: u32 = stat[stat.rfind(')')? + 1..]
                .split_whitespace()
                .nth(2)?
                .parse()
                .ok()?;
            (pgrp == pgid).then_some(pid)
        })
        .collect()
}

fn segments_of(pids: &[u32]) -> Vec<String> {
    pids.iter()
        .flat_map(|&pid| rlf_shm::region::segments_of(pid).expect("/dev/shm"))
        .collect()
}

/// The newest intact checkpoint as the trainer finds it.
struct Newest {
    /// Its sidecar's file name.
    file: String,
    env_steps: u64,
    version: u64,
    /// The file names of the newer checkpoints passed over.
    skipped: Vec<String>,
}

/// Copies the checkpoint folder to `scratch` (opening a store removes temporary files, which the next run must
/// meet) and loads its newest intact checkpoint with the library's and the trainer's loaders.
fn newest_intact(checkpoints: &Path, scratch: &Path, ctx: &str) -> Newest {
    let _ = std::fs::remove_dir_all(scratch);
    let copy = scratch.join("exp/checkpoint_p0");
    std::fs::create_dir_all(&copy).expect("scratch dir");
    for name in names(checkpoints) {
        std::fs::copy(checkpoints.join(&name), copy.join(&name))
            .unwrap_or_else(|e| panic!("{ctx}: copying {name}: {e}"));
    }
    let store = experiment::open_store(scratch, "exp", 0).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let loaded = store
        .load_latest()
        .unwrap_or_else(|e| panic!("{ctx}: load_latest: {e}"))
        .unwrap_or_else(|| panic!("{ctx}: load_latest found no checkpoint at all"));
    let restored = experiment::load(&store, CheckpointKind::Latest)
        .unwrap_or_else(|e| panic!("{ctx}: the trainer's loader: {e}"))
        .unwrap_or_else(|| panic!("{ctx}: the trainer's loader found no checkpoint"));
    assert_eq!(restored.path, loaded.path, "{ctx}: the two loaders disagree");
    let file = file_name(&loaded.path);
    assert!(
        !file.starts_with(TEMP_PREFIX),
        "{ctx}: a temporary file taken for a checkpoint: {file}"
    );
    let fc0 = restored
        .tensors
        .iter()
        .find(|t| t.name == "actor_encoder.fc0.weight")
        .unwrap_or_else(|| panic!("{ctx}: {file} has no actor_encoder.fc0.weight"));
    assert_eq!(fc0.shape, [256, 4], "{ctx}: {file}");
    assert_eq!(
        (restored.env_steps, restored.training.version),
        (
            loaded.checkpoint.meta.env_steps,
            loaded.checkpoint.meta.policy_version
        ),
        "{ctx}: {file}"
    );
    if names(&copy).iter().any(|n| n.starts_with("best_")) {
        let best = experiment::load(&store, CheckpointKind::Best)
            .unwrap_or_else(|e| panic!("{ctx}: the best checkpoint: {e}"));
        assert!(best.is_some(), "{ctx}: a best checkpoint exists but none loads");
    }
    Newest {
        file,
        env_steps: restored.env_steps,
        version: restored.training.version,
        skipped: loaded.skipped.iter().map(|s| file_name(&s.path)).collect(),
    }
}

#[test]
fn sigkill_during_checkpoint_writes_keeps_the_previous_checkpoint_and_resume_continues_from_the_newest() {
    let started = Instant::now();
    let seed = std::env::var(SEED_VAR)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let mut rng = XorShift::new(seed);
    let tmp = common::temp_dir("checkpoint-kill");
    let train_dir = tmp.path().join("train");
    let scratch = tmp.path().join("inspect");
    let checkpoints = train_dir.join("exp/checkpoint_p0");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = COMMON.iter().map(|s| (*s).to_owned()).collect();
        args.push(format!("--train_dir={}", train_dir.display()));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    let kill_args = args(&["--save_every_sec=0.05", "--train_for_seconds=600"]);

    let mut previous: Option<Newest> = None;
    let mut previous_group: Vec<u32> = Vec::new();
    let mut previous_orphans = BTreeSet::new();
    let (mut cut_short, mut temp_left, mut passed_over, mut shm_left) = (0, 0, 0, 0);
    let mut round_times = Vec::new();
    for round in 0..MAX_ROUNDS {
        if round >= ROUNDS && cut_short >= MIN_CUT_SHORT {
            break;
        }
        let round_start = Instant::now();
        let ctx = format!("round {round} (seed {seed}, {SEED_VAR} replays it)");
        let mut run = Run::start(&kill_args);
        let first = run.next_saved(&ctx);

        // The start reclaimed the previous killed run's segments, and resumed from the newest intact checkpoint.
        let left = segments_of(&previous_group);
        assert!(
            left.is_empty(),
            "{ctx}: segments of the killed run {previous_group:?} survive the next start: {left:?}"
        );
        if let Some(p) = &previous {
            let resumed = format!(
                "resuming from {} (env frames {}, policy version {}, ",
                checkpoints.join(&p.file).display(),
                p.env_steps,
                p.version
            );
            assert!(
                run.seen.iter().any(|l| l.contains(&resumed)),
                "{ctx}: expected `{resumed}`; stderr:\n{}",
                run.tail()
            );
            for skipped in &p.skipped {
                assert!(
                    run.seen
                        .iter()
                        .any(|l| l.contains("skipped a broken checkpoint: ")
                            && l.contains(&format!("/checkpoint_p0/{skipped}: "))),
                    "{ctx}: the run did not report skipping {skipped}; stderr:\n{}",
                    run.tail()
                );
            }
            assert!(
                key(&first) >= key(Path::new(&p.file)),
                "{ctx}: first save {} is older than the resumed {}",
                first.display(),
                p.file
            );
        }

        let group = group_members(run.pid);
        assert!(
            group.contains(&run.pid) && group.len() >= 2,
            "{ctx}: expected the run's several processes in group {}, found {group:?}",
            run.pid
        );
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_millis(rng.in_range(KILL_DELAY_MS)));
        } else {
            wait_for_a_write(&checkpoints, &ctx);
            std::thread::sleep(Duration::from_micros(rng.in_range(MID_WRITE_DELAY_US)));
        }
        let pgid = rustix::process::Pid::from_raw(run.pid as i32).expect("a pid");
        let kill = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        let status = run.finish(&ctx);
        assert!(
            kill.is_ok() && status.signal() == Some(9),
            "{ctx}: the run was not killed by SIGKILL (kill {kill:?}, exit {status}); stderr:\n{}",
            run.tail()
        );
        shm_left += usize::from(!segments_of(&group).is_empty());

        // The checkpoints written before the kill are intact.
        let saved = run.saved();
        assert!(
            saved.windows(2).all(|w| key(&w[0]) <= key(&w[1])),
            "{ctx}: saves out of order: {saved:?}"
        );
        let last = saved.last().expect("the first save was seen");
        let last_ckpt = rlf_experiment::load_checkpoint(last)
            .unwrap_or_else(|e| panic!("{ctx}: the last reported checkpoint does not load: {e}"));
        let now = names(&checkpoints);
        for sidecar in now
            .iter()
            .filter(|n| !n.starts_with(TEMP_PREFIX) && n.ends_with(".json"))
        {
            if let Err(e) = rlf_experiment::load_checkpoint(checkpoints.join(sidecar)) {
                panic!("{ctx}: {sidecar} has a sidecar but does not load: {e}; files {now:?}");
            }
        }
        let temps = now.iter().filter(|n| n.starts_with(TEMP_PREFIX)).count();
        let orphaned = orphans(&now);
        temp_left += usize::from(temps > 0);
        cut_short += usize::from(temps > 0 || orphaned.difference(&previous_orphans).next().is_some());

        // The newest intact checkpoint: at least the last reported one, never behind the previous round's.
        let newest = newest_intact(&checkpoints, &scratch, &ctx);
        passed_over += usize::from(!newest.skipped.is_empty());
        assert!(
            key(Path::new(&newest.file)) >= key(last),
            "{ctx}: newest intact {} is older than the last reported {}",
            newest.file,
            last.display()
        );
        assert!(
            newest.env_steps >= last_ckpt.meta.env_steps && newest.version >= last_ckpt.meta.policy_version,
            "{ctx}: newest intact {} is behind the last reported {}",
            newest.file,
            last.display()
        );
        if let Some(p) = &previous {
            assert!(
                newest.env_steps >= p.env_steps && newest.version >= p.version,
                "{ctx}: went backwards from {} (frames {}, version {}) to {} (frames {}, version {})",
                p.file,
                p.env_steps,
                p.version,
                newest.file,
                newest.env_steps,
                newest.version
            );
        }
        previous = Some(newest);
        previous_group = group;
        previous_orphans = orphaned;
        round_times.push(round_start.elapsed());
    }

    // An uninterrupted run resumes from the newest intact checkpoint and trains on.
    let ctx = format!("final run (seed {seed})");
    let last = previous.expect("rounds ran");
    let summary_path = tmp.path().join("summary.json");
    let mut run = Run::start(&args(&[
        "--save_every_sec=120",
        "--train_for_seconds=1",
        &format!("--summary_json={}", summary_path.display()),
    ]));
    let status = run.finish(&ctx);
    assert!(status.success(), "{ctx}: {status}; stderr:\n{}", run.tail());
    let resumed = format!(
        "resuming from {} (env frames {}, policy version {}, ",
        checkpoints.join(&last.file).display(),
        last.env_steps,
        last.version
    );
    assert!(
        run.seen.iter().any(|l| l.contains(&resumed)),
        "{ctx}: expected `{resumed}`; stderr:\n{}",
        run.tail()
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary_path).expect("summary json")).expect("summary parses");
    assert_eq!(summary["stop_reason"], "seconds", "{ctx}: {summary}");
    let frames = summary["env_frames"].as_u64().expect("env_frames");
    let version = summary["policy_version"].as_u64().expect("policy_version");
    assert!(
        frames >= last.env_steps && version >= last.version,
        "{ctx}: ended at frames {frames}, version {version}; resumed from {} (frames {}, version {})",
        last.file,
        last.env_steps,
        last.version
    );
    let end = names(&checkpoints);
    assert!(
        !end.iter().any(|n| n.starts_with(TEMP_PREFIX)) && orphans(&end).is_empty(),
        "{ctx}: debris left after a clean run: {end:?}"
    );
    let final_ckpt = newest_intact(&checkpoints, &scratch, &ctx);
    assert_eq!(
        final_ckpt.env_steps, frames,
        "{ctx}: the checkpoint saved at stop {}",
        final_ckpt.file
    );
    let mut pids = previous_group;
    pids.push(run.pid);
    let left = segments_of(&pids);
    assert!(left.is_empty(), "{ctx}: shared-memory segments left: {left:?}");

    let rounds = round_times.len();
    let mean = round_times.iter().sum::<Duration>() / rounds as u32;
    let slowest = round_times.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{rounds} kills (seed {seed}): {cut_short} cut a write short ({temp_left} left a temporary file), \
         {passed_over} made the loader pass over a newer checkpoint, {shm_left} left shared memory until the next \
         start; a round takes {mean:?} on average, {slowest:?} at most; final run at {frames} frames, version \
         {version}; {:?} in all",
        started.elapsed()
    );
    assert!(
        cut_short >= MIN_CUT_SHORT,
        "only {cut_short} of {rounds} kills cut a write short (seed {seed}): the test no longer hits writes"
    );
}
