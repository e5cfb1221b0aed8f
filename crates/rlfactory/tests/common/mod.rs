//! Helpers shared by the tests that run the `rlfactory` binary: temp dirs, spawning and
//! watching a run, reading its summary, and checking that it left no shared memory.
// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;

pub use tempfile::TempDir;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_rlfactory");

/// libtorch's random generator and its thread count are one per process: the tests that run libtorch in the test
/// process (seeding it, training, comparing what follows) take turns, or another test's draws or thread count in
/// between would change their numbers. Hold the guard for the whole test.
pub fn torch_rng() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The tests that start several training processes at once (MPI jobs, runs side by side) take turns: two of them
/// beside each other would put four or more runs on two cores, and each one's heartbeats, hang guards and parallel-mode
/// results would depend on the other's load. Hold the guard for the whole test.
pub fn several_runs() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fresh folder under the system temp dir, removed when dropped.
pub fn temp_dir(name: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("rlf-{name}-"))
        .tempdir()
        .expect("temp dir")
}

/// The JSON summary a run wrote (`--summary_json`).
pub fn summary(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("summary written")).expect("summary is JSON")
}

/// The last value of training metric `name` (`train/lr`) in a run's JSON summary; panics, showing the summary, when
/// it has none.
pub fn last_metric(summary: &serde_json::Value, name: &str) -> f64 {
    summary["last_metrics"]
        .as_array()
        .and_then(|m| m.iter().find(|p| p[0] == name))
        .and_then(|p| p[1].as_f64())
        .unwrap_or_else(|| panic!("no {name} in {summary}"))
}

/// Lossy UTF-8.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts that process `pid` left no `/dev/shm` segment.
pub fn assert_no_segments(pid: u32) {
    assert_eq!(
        rlf_shm::region::segments_of(pid).expect("list /dev/shm"),
        Vec::<String>::new(),
        "shared-memory segments left by {pid}"
    );
}

/// Runs `command` to the end; checks that it left no shared memory.
pub fn output(command: &mut Command) -> Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait");
    assert_no_segments(pid);
    out
}

/// Runs `rlfactory args` to the end; checks that it left no shared memory. A `train` gets the
/// [`extra_train_flags`] last.
pub fn run(args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.args(args);
    if args.first() == Some(&"train") {
        command.args(extra_train_flags());
    }
    output(&mut command)
}

/// libtorch's intra-op threads that `scripts/test_portability` gives every training run of the tests
/// (`RLF_TEST_NUM_THREADS`, which changes how its products are summed). None otherwise: the tests' own settings stand.
fn test_num_threads() -> Option<String> {
    std::env::var("RLF_TEST_NUM_THREADS")
        .ok()
        .filter(|n| !n.is_empty())
}

/// [`test_num_threads`] as a flag for a spawned run: `--num_threads=N`.
pub fn extra_train_flags() -> Vec<String> {
    test_num_threads()
        .map(|n| format!("--num_threads={n}"))
        .into_iter()
        .collect()
}

/// [`test_num_threads`] as a setting for `Config::for_env`: `num_threads = N`.
pub fn extra_train_settings() -> Vec<String> {
    test_num_threads()
        .map(|n| format!("num_threads = {n}"))
        .into_iter()
        .collect()
}

/// What one seed of a learning test reached: whether it met the test's target, the figure that decided it, and the
/// target itself.
pub struct Outcome {
    pub passed: bool,
    pub figure: String,
    /// The target the figure is held against, as a reader would say it, e.g. "mean return >= 475 within 150K
    /// frames": the threshold the test asserts and the budget it runs within.
    pub target: String,
}

/// Prints one seed's outcome as `learning: <test> seed <seed>: <figure> [target <target>] (pass|fail)`, the line
/// `scripts/test_portability` collects and `scripts/learning_lane` tabulates, each figure beside its target (with
/// `--nocapture`).
pub fn report(test: &str, seed: u64, outcome: &Outcome) {
    let verdict = if outcome.passed { "pass" } else { "fail" };
    eprintln!(
        "learning: {test} seed {seed}: {} [target {}] ({verdict})",
        outcome.figure, outcome.target
    );
}

/// [`report`]s a one-run learning test from its run's summary `s`: the mean return, the frames and why it stopped,
/// against `target`.
pub fn report_run(test: &str, seed: u64, passed: bool, target: &str, s: &serde_json::Value) {
    let figure = format!(
        "mean return {} after {} frames (stopped for {})",
        s["mean_return"], s["env_frames"], s["stop_reason"]
    );
    let outcome = Outcome {
        passed,
        figure,
        target: target.to_owned(),
    };
    report(test, seed, &outcome);
}

/// A count of frames or steps as a target says it: 150000 as `150K`, 1500000 as `1.5M`; exact, so any other count
/// as it is.
pub fn short_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 100_000 == 0 => format!("{}M", n as f64 / 1e6),
        n if n >= 1_000 && n % 100 == 0 => format!("{}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// Runs `attempt` on each of `seeds`, up to `at_once` at a time and never more than the cores (2 for runs in their own processes on 2 cores, 1 for
/// runs inside the test's process, which share libtorch's global state), fewer when `RLF_TEST_NUM_THREADS` gives each
/// run more than one libtorch thread (whose OpenMP threads spin at every barrier for one that is not running): the
/// results in the order of `seeds`.
pub fn each_seed<T: Send>(seeds: &[u64], at_once: usize, attempt: impl Fn(u64) -> T + Sync) -> Vec<T> {
    let attempt = &attempt;
    let threads = std::env::var("RLF_TEST_NUM_THREADS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1);
    // Never more runs at once than there are cores, so that no run's result depends on its neighbour's load.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    seeds
        .chunks((at_once.min(cores) / threads.max(1)).max(1))
        .flat_map(|batch| {
            std::thread::scope(|scope| {
                let runs: Vec<_> = batch
                    .iter()
                    .map(|&seed| scope.spawn(move || attempt(seed)))
                    .collect();
                runs.into_iter()
                    .map(|run| {
                        run.join()
                            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                    })
                    .collect::<Vec<T>>()
            })
        })
        .collect()
}

/// A learning test over several seeds: runs `attempt` on `seeds` in order, up to `at_once` at a time (as
/// [`each_seed`]) and never more than are still needed, until `needed` of them have passed or too few are left to
/// get there. Reports each seed's outcome; panics, with every seed's figure, when fewer than `needed` passed.
pub fn assert_seeds_pass(
    test: &str,
    needed: usize,
    seeds: &[u64],
    at_once: usize,
    attempt: impl Fn(u64) -> Outcome + Sync,
) {
    let mut outcomes: Vec<(u64, Outcome)> = Vec::new();
    let mut left = seeds;
    loop {
        let passed = outcomes.iter().filter(|(_, o)| o.passed).count();
        if passed >= needed || passed + left.len() < needed {
            break;
        }
        let (batch, rest) = left.split_at((needed - passed).min(at_once).min(left.len()));
        left = rest;
        let done = each_seed(batch, at_once, &attempt);
        for (seed, outcome) in batch.iter().zip(done) {
            report(test, *seed, &outcome);
            outcomes.push((*seed, outcome));
        }
    }
    let passed = outcomes.iter().filter(|(_, o)| o.passed).count();
    let figures: Vec<String> = outcomes
        .iter()
        .map(|(seed, o)| format!("seed {seed}: {}", o.figure))
        .collect();
    assert!(
        passed >= needed,
        "{test}: {passed} of the seeds {seeds:?} met the target, {needed} needed ({})",
        figures.join(", ")
    );
}

/// Runs `rlfactory train` with `flags`, no experiment folder and no progress line, to the end;
/// asserts it succeeded and returns its JSON summary.
pub fn train_summary(flags: &[String]) -> serde_json::Value {
    let dir = temp_dir("summary");
    let out = dir.path().join("summary.json");
    let mut args = vec![
        "train".to_owned(),
        "--save_experiment=false".to_owned(),
        "--report_interval_sec=0".to_owned(),
        format!("--summary_json={}", out.display()),
    ];
    args.extend_from_slice(flags);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run(&args);
    assert!(output.status.success(), "{}", text(&output.stderr));
    summary(&out)
}

/// The policy version a progress line reports (`… | version 12`), if it is one.
pub fn progress_version(line: &str) -> Option<u64> {
    line.split("| version ")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Starts `rlfactory args` (a `train` whose `--report_interval_sec` is short), waits until its learner has trained
/// (a progress line past version 0), sends it `signal` (`INT` or `TERM`, to the main process alone, as a terminal's
/// Ctrl-C reaches a shell's job) and waits for it to exit: its status and the seconds from the signal to the exit.
/// Checks that it left no shared memory.
pub fn interrupt_when_trained(args: &[String], signal: &str) -> (ExitStatus, f64) {
    let run = spawn(Command::new(BIN).args(args));
    loop {
        let line = run
            .lines
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("a progress line with a trained version");
        if progress_version(&line).is_some_and(|v| v > 0) {
            break;
        }
    }
    let sent = std::time::Instant::now();
    let kill = Command::new("kill")
        .args([&format!("-{signal}"), &run.pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = run
        .exited
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the run exits after the signal");
    let seconds = sent.elapsed().as_secs_f64();
    let log: Vec<String> = run.lines.try_iter().collect();
    eprintln!("{signal}: exit {status} after {seconds:.2} s\n{}", log.join("\n"));
    assert_no_segments(run.pid);
    (status, seconds)
}

/// The sidecars of policy 0's regular checkpoints of experiment `exp` in `train_dir`, oldest first.
pub fn checkpoint_sidecars(train_dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir(train_dir.join("exp/checkpoint_p0"))
        .expect("checkpoint dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("checkpoint_"))
        })
        .collect();
    found.sort();
    found
}

/// Trains `flags` (an env and an algorithm) in experiment `exp` until its learner has trained, stops it with
/// `signal` (`INT` or `TERM`), and checks that it exits with `code` (130 or 143) without waiting out the stop timeout
/// and that its last checkpoint holds Adam's moments and a tensor of each of `prefixes` (and, DQN or SAC, that the
/// replay buffer was saved after it).
pub fn assert_a_stop_saves_everything(flags: &[&str], signal: &str, code: i32, prefixes: &[&str]) {
    let dir = temp_dir("stop");
    let mut args: Vec<String> = [
        "train",
        "--experiment=exp",
        "--train_for_env_steps=10000000",
        "--report_interval_sec=0.2",
    ]
    .iter()
    .chain(flags)
    .map(|s| (*s).to_owned())
    .collect();
    args.push(format!("--train_dir={}", dir.path().display()));
    let (status, seconds) = interrupt_when_trained(&args, signal);
    assert_eq!(status.code(), Some(code), "exit {status} after {seconds:.2} s");
    assert!(seconds < 10.0, "{seconds:.2} s from SIG{signal} to the exit");
    let newest = checkpoint_sidecars(dir.path()).pop().expect("a checkpoint");
    let names: Vec<String> = rlf_experiment::load_checkpoint(&newest)
        .expect("the checkpoint loads")
        .tensors
        .into_keys()
        .collect();
    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&newest).expect("sidecar")).expect("sidecar is JSON");
    assert_eq!(sidecar["extra"]["adam_moments_saved"], true, "{sidecar}");
    for prefix in prefixes.iter().chain(&["adam."]) {
        assert!(
            names.iter().any(|n| n.starts_with(prefix)),
            "no {prefix}* in {names:?}"
        );
    }
    // An off-policy run's replay buffer is saved after its last checkpoint, named as it.
    if flags
        .iter()
        .any(|f| f.starts_with("--algo=dqn") || f.starts_with("--algo=sac"))
    {
        let replay = newest
            .parent()
            .expect("checkpoint dir")
            .join("replay_buffer")
            .join(newest.file_name().expect("sidecar name"));
        let replay =
            rlf_experiment::load_checkpoint(&replay).expect("the replay buffer of the last checkpoint loads");
        let rows = &replay.tensors["rows"];
        assert!(rows.shape[0] > 0, "an empty replay buffer: {:?}", rows.shape);
    }
}

/// The processes whose environment holds `var_eq` (`NAME=value`), with their whole environment.
pub fn processes_with(var_eq: &str) -> Vec<(u32, Vec<String>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: Vec<String> = environ
            .split(|&b| b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        if vars.iter().any(|v| v == var_eq) {
            found.push((pid, vars));
        }
    }
    found
}

/// Waits (blocking on each one's pidfd, up to `limit` in all) until every process of `pids` has exited.
pub fn wait_gone(pids: &[u32], limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    for &pid in pids {
        let Some(raw) = rustix::process::Pid::from_raw(pid as i32) else {
            continue;
        };
        let Ok(fd) = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) else {
            continue; // already gone
        };
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let timeout = rustix::event::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
        let ready = rustix::event::poll(&mut fds, Some(&timeout)).expect("poll a pidfd");
        assert_eq!(ready, 1, "process {pid} is still running {limit:?} later");
    }
}

/// A running process: its pid, its stderr lines and its exit status, each from a thread blocked
/// on it.
pub struct Watched {
    pub pid: u32,
    pub lines: mpsc::Receiver<String>,
    pub exited: mpsc::Receiver<ExitStatus>,
}

/// Watches `child` (started with a piped stderr).
pub fn watch(mut child: Child) -> Watched {
    let (line_tx, lines) = mpsc::channel();
    let (exit_tx, exited) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr");
    let pid = child.id();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = line_tx.send(line);
        }
    });
    std::thread::spawn(move || {
        let _ = exit_tx.send(child.wait().expect("wait"));
    });
    Watched { pid, lines, exited }
}

/// Starts `command` with stdout discarded and stderr watched.
pub fn spawn(command: &mut Command) -> Watched {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    watch(child)
}

/// Waits for a run that must fail on its own: exit code 1, exactly one `error: ` line, no panic,
/// a checkpoint sidecar in `<train_dir>/exp/checkpoint_p0`, no shared memory left. Returns the
/// error line and the whole stderr.
pub fn expect_failed_run(run: Watched, train_dir: &Path) -> (String, String) {
    let status = run
        .exited
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the run stops on its own");
    let lines: Vec<String> = run.lines.try_iter().collect();
    let log = lines.join("\n");
    assert_eq!(status.code(), Some(1), "{log}");
    let errors: Vec<&String> = lines.iter().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    let saved = std::fs::read_dir(train_dir.join("exp/checkpoint_p0"))
        .expect("checkpoint folder")
        .flatten()
        .any(|e| e.file_name().to_string_lossy().ends_with(".json"));
    assert!(saved, "the learner saved a checkpoint as the run stopped:\n{log}");
    assert_no_segments(run.pid);
    (errors[0].clone(), log)
}

/// A small deterministic generator for random baselines (xorshift64*).
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Mean return per agent and episode of uniformly random discrete actions (`0..num_actions`) on
/// 4 copies of the multi-agent env `id` (default keyword arguments), over `episodes` agent
/// episodes.
pub fn random_return_per_agent(id: &str, num_actions: u64, episodes: usize) -> f64 {
    random_return_of(id, num_actions, episodes, |_| true)
}

/// As [`random_return_per_agent`], over the episodes of the agents (by index) that `keep` picks.
pub fn random_return_of(id: &str, num_actions: u64, episodes: usize, keep: impl Fn(usize) -> bool) -> f64 {
    let registry = rlf_env::EnvRegistry::with_builtin();
    let envs = (0..4)
        .map(|_| registry.make_multi_agent(id, &[]).expect("the env"))
        .collect();
    let mut envs = rlf_env::MultiVecEnv::new(envs).expect("vector");
    let mut buf = rlf_env::VecBuffers::new(envs.num_columns(), envs.obs_dim());
    envs.reset(Some(11), &mut buf.obs).expect("reset");
    let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
    let mut actions = vec![0_i64; envs.num_columns()];
    let mut returns = Vec::new();
    while returns.len() < episodes {
        for a in &mut actions {
            *a = rng.below(num_actions) as i64;
        }
        envs.step(rlf_env::ActionBatch::Discrete(&actions), buf.view())
            .expect("step");
        let agents = envs.num_agents();
        returns.extend(
            envs.finished()
                .iter()
                .enumerate()
                .filter(|(c, _)| keep(c % agents))
                .filter_map(|(_, e)| e.map(|e| e.episode_return)),
        );
    }
    returns.iter().sum::<f64>() / returns.len() as f64
}

/// The win rate in `eval --opponent` output (`... (win rate 0.905); one-ply tactics: ...`).
pub fn win_rate(stdout: &str) -> f64 {
    stdout
        .split("win rate ")
        .nth(1)
        .and_then(|r| r.split(')').next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no win rate in {stdout}"))
}

/// The win rate of experiment `experiment` of `train_dir_flag` (`--train_dir=...`) against Connect Four's uniformly
/// random player: 200 games of its greedy policy, colours alternating, `eval`'s seed 7.
pub fn connect_four_win_rate_against_random(train_dir_flag: &str, experiment: &str) -> f64 {
    let output = run(&[
        "eval",
        "--env=connect_four",
        &format!("--experiment={experiment}"),
        train_dir_flag,
        "--opponent=random",
        "--max_num_episodes=200",
        "--eval_deterministic",
        "--seed=7",
    ]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    eprintln!("{stdout}");
    win_rate(&stdout)
}

/// `rlfactory train` with a Python module `name` (source `code`) on `PYTHONPATH`, in an
/// experiment folder `exp` under `dir`; asserts success and returns the JSON summary.
pub fn train_with_module(dir: &Path, name: &str, code: &str, flags: &[&str]) -> serde_json::Value {
    std::fs::write(dir.join(format!("{name}.py")), code).expect("write the env module");
    let python_path = match std::env::var("PYTHONPATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", dir.display()),
        _ => dir.display().to_string(),
    };
    let out = dir.join("summary.json");
    let run = output(
        Command::new(BIN)
            .env("PYTHONPATH", python_path)
            .args(["train", "--experiment=exp", "--report_interval_sec=0"])
            .arg(format!("--train_dir={}", dir.display()))
            .arg(format!("--summary_json={}", out.display()))
            .args(flags)
            .args(extra_train_flags()),
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    summary(&out)
}

/// The mean return `eval` printed.
pub fn eval_mean_return(stdout: &str) -> f64 {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("mean return "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no mean return in {stdout}"))
}

/// The process of `loop_id` among the children of `parent` (rlf-signal names each child's main thread
/// `rlf-loop-<id>`), if there is one.
pub fn child_of_loop(parent: u32, loop_id: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|pid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == format!("rlf-loop-{loop_id}"))
        })
}

/// A CartPole-shaped dataset of 8 sequences of 16 steps, `valid` per transition (row order).
pub fn cartpole_dataset(valid: &[f32]) -> rlfactory::algo::appo::Dataset {
    let (s, t, d) = (8_usize, 16_usize, 4_i64);
    let n = s * t;
    assert_eq!(valid.len(), n);
    let column = |f: &dyn Fn(usize) -> f32| tch::Tensor::from_slice(&(0..n).map(f).collect::<Vec<_>>());
    let obs: Vec<f32> = (0..n * 4).map(|i| ((i * 7) % 19) as f32 / 19.0 - 0.5).collect();
    rlfactory::algo::appo::Dataset {
        num_sequences: s,
        seq_len: t,
        obs: tch::Tensor::from_slice(&obs).reshape([-1, d]),
        actions: column(&|i| (i % 2) as f32).reshape([-1, 1]),
        log_probs: column(&|i| -0.5 - (i % 3) as f32 * 0.1),
        values: column(&|i| (i % 5) as f32 * 0.2),
        rewards: column(&|_| 1.0),
        terminated: column(&|i| f32::from(u8::from(i % 37 == 36))),
        truncated: column(&|_| 0.0),
        valid: tch::Tensor::from_slice(valid),
        has_final: column(&|_| 0.0),
        final_obs: tch::Tensor::zeros([n as i64, d], (tch::Kind::Float, tch::Device::Cpu)),
        next_obs: tch::Tensor::ones([s as i64, d], (tch::Kind::Float, tch::Device::Cpu)),
        next_valid: tch::Tensor::ones([s as i64], (tch::Kind::Float, tch::Device::Cpu)),
        versions: vec![0; n],
        states: None,
    }
}
