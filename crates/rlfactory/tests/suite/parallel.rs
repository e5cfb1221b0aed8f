//! The parallel architecture end to end, through the real binary: rollout workers, the inference
//! worker and the learner in processes of their own; dead and hung processes (SIGKILL, SIGSTOP):
//! rollout workers are replaced, the others stop the run with a checkpoint; workers left without
//! work (the learner stopped) make no wake-ups.

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{assert_no_segments, child_of_loop, spawn, summary, BIN};

/// A temp dir for a run, kept as a plain path (the test removes it at its end).
fn temp_dir(name: &str) -> PathBuf {
    common::temp_dir(&format!("parallel-{name}")).keep()
}

/// `rlfactory train --env=CartPole-v1 --report_interval_sec=0.1 <args>`, started with its pid,
/// stderr lines and exit status watched.
fn spawn_train(args: &[String]) -> (u32, mpsc::Receiver<String>, mpsc::Receiver<ExitStatus>) {
    let run = spawn(
        Command::new(BIN)
            .args(["train", "--env=CartPole-v1", "--report_interval_sec=0.1"])
            .args(args)
            .args(common::extra_train_flags()),
    );
    (run.pid, run.lines, run.exited)
}

/// CartPole-v1 with the default config in parallel mode reaches 475 within 1.5M frames on seed 1. Parallel mode does
/// not repeat a run (the processes interleave as the machine schedules them); frames to 475 on an Intel Xeon under the
/// CPU variations of `scripts/test_portability`: 287K natively, 238K with libtorch's plain kernels, 242K with its AVX2
/// ones, 149K with MKL's SSE2 path: the budget is five times the largest.
// lane: ci
#[test]
fn the_default_parallel_configuration_learns_cartpole() {
    let dir = temp_dir("learn");
    let out = dir.join("summary.json");
    let status = Command::new(BIN)
        .args([
            "train",
            "--env=CartPole-v1",
            "--save_experiment=false",
            "--report_interval_sec=0",
        ])
        .args([
            "--stop_at_reward=475",
            "--train_for_env_steps=1500000",
            "--seed=1",
        ])
        .arg(format!("--summary_json={}", out.display()))
        .args(common::extra_train_flags())
        .stderr(Stdio::null())
        .status()
        .expect("run");
    assert!(status.success());
    let s = summary(&out);
    let outcome = common::Outcome {
        passed: s["reached_reward"] == true && s["frames_to_reward"].as_u64().is_some_and(|f| f <= 1_500_000),
        figure: format!("475 after {} frames", s["frames_to_reward"]),
        target: "mean return >= 475 within 1.5M frames".to_owned(),
    };
    common::report("parallel_cartpole", 1, &outcome);
    assert!(outcome.passed, "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether `pid` is a fork of its parent rather than a re-executed binary: only the latter is told
/// its role in its environment (`/proc/<pid>/environ` is the one the program was executed with).
fn forked(pid: u32) -> bool {
    let env = std::fs::read(format!("/proc/{pid}/environ")).expect("the child's environment");
    !String::from_utf8_lossy(&env).contains("RLF_SIGNAL_CHILD=")
}

#[test]
fn with_no_replacement_allowed_killing_a_rollout_worker_stops_the_run_with_its_name() {
    let (pid, lines, exited) = spawn_train(&[
        "--save_experiment=false".into(),
        "--num_workers=2".into(),
        "--train_for_seconds=60".into(),
        "--max_worker_restarts=0".into(),
    ]);
    let mut seen = wait_for_progress(&lines);
    // Loop 1 is the first declared process loop: rollout_worker_0.
    let victim = child_of_loop(pid, 1).expect("the rollout worker's process");
    signal(victim, "-KILL");
    let status = exited
        .recv_timeout(Duration::from_secs(20))
        .expect("the run stops after the kill");
    assert!(!status.success(), "a dead worker is a failure");
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        seen.push(line);
    }
    assert!(
        seen.iter().any(|l| l.contains("rollout_worker_0")),
        "the message names the dead worker:\n{}",
        seen.join("\n")
    );
    assert_no_segments(pid);
}

#[test]
fn every_trajectory_is_trained_dropped_or_in_flight_at_stop() {
    let dir = temp_dir("accounting");
    let out = dir.join("summary.json");
    let status = Command::new(BIN)
        .args([
            "train",
            "--env=CartPole-v1",
            "--save_experiment=false",
            "--report_interval_sec=0",
            "--num_workers=2",
            "--max_policy_lag=1",
            "--train_for_env_steps=200000",
        ])
        .arg(format!("--summary_json={}", out.display()))
        .stderr(Stdio::null())
        .status()
        .expect("run");
    assert!(status.success());
    let s = summary(&out);
    let count = |key: &str| s[key].as_u64().unwrap_or_else(|| panic!("{key} in {s}"));
    let produced = count("trajectories_produced");
    let trained = count("trajectories_trained");
    let dropped = count("trajectories_dropped");
    let in_flight = count("trajectories_in_flight");
    assert!(trained >= 1, "{s}");
    assert_eq!(produced, trained + dropped + in_flight, "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits for the first progress line with frames simulated; returns every line seen.
fn wait_for_progress(lines: &mpsc::Receiver<String>) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no progress line ({e}):\n{}", seen.join("\n")));
        // A progress line (`frames N of M (...) | fps ...`) past the first frames, after every policy's learner
        // published weights (`| version N` above 0 for each): a learner killed before its first weights are whole
        // has none to save, whatever the test then expects of it.
        let published = line
            .split("| version ")
            .skip(1)
            .all(|rest| rest.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()) > Some(0));
        let started = line.contains("| fps ") && !line.contains("frames 0 ") && published;
        seen.push(line);
        if started {
            return seen;
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

// lane: ci
#[test]
fn dead_and_hung_rollout_workers_are_replaced_and_training_reaches_its_target() {
    let dir = temp_dir("heal");
    let out = dir.join("summary.json");
    let (pid, lines, exited) = spawn_train(&[
        "--save_experiment=false".into(),
        "--heartbeat_interval=1".into(),
        "--stop_at_reward=475".into(),
        "--train_for_env_steps=1500000".into(),
        "--seed=1".into(),
        format!("--summary_json={}", out.display()),
    ]);
    let mut seen = wait_for_progress(&lines);
    // Loop 1 is the (only) rollout worker: its first process is killed, its second frozen.
    let mut victims = Vec::new();
    for (incarnation, sig) in [(1, "-KILL"), (2, "-STOP")] {
        let victim = child_of_loop(pid, 1).expect("the rollout worker's process");
        // Replacements re-execute the binary. The first process is forked from the runner's, unless libtorch's
        // threads already run there (`RLF_TEST_NUM_THREADS` above 1: `scripts/test_portability threads2`), when
        // the runner cannot fork and re-executes the binary for it too.
        let first_forks = common::extra_train_flags().is_empty();
        assert_eq!(
            forked(victim),
            incarnation == 1 && first_forks,
            "process {victim}"
        );
        signal(victim, sig);
        victims.push(victim);
        let replaced = format!("rollout_worker_0 replaced by a new process (incarnation {incarnation})");
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("no replacement ({e}):\n{}", seen.join("\n")));
            let done = line.contains(&replaced);
            seen.push(line);
            if done {
                break;
            }
        }
    }
    // A hang guard: the budget's 1.5M frames take about a minute on a loaded 2-core machine.
    let status = exited
        .recv_timeout(Duration::from_secs(600))
        .expect("the run ends");
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        seen.push(line);
    }
    let log = seen.join("\n");
    assert!(status.success(), "{status}:\n{log}");
    assert!(
        seen.iter()
            .any(|l| l.contains("loop rollout_worker_0: no heartbeat for")),
        "the frozen worker is named hung:\n{log}"
    );
    let s = summary(&out);
    common::report_run(
        "healed_cartpole",
        1,
        s["reached_reward"] == true,
        "mean return >= 475 within 1.5M frames",
        &s,
    );
    assert_eq!(s["reached_reward"], true, "{s}\n{log}");
    assert_eq!(s["worker_restarts"], 2, "{s}");
    let count = |key: &str| s[key].as_u64().unwrap_or_else(|| panic!("{key} in {s}"));
    // What each replacement logged as its predecessor's unfinished frames is what the summary
    // counts as lost. (It may be 0: a worker killed while every split waits for a free slot has
    // handed on all it stepped.)
    let discarded: u64 = seen
        .iter()
        .filter(|l| l.contains("rollout_worker_0 replaced by a new process"))
        .map(|l| {
            l.split("discarded ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no discarded frames in {l:?}"))
        })
        .sum();
    assert_eq!(count("env_frames_lost"), discarded, "{s}\n{log}");
    assert_eq!(
        count("trajectories_produced"),
        count("trajectories_trained") + count("trajectories_dropped") + count("trajectories_in_flight"),
        "{s}"
    );
    for p in std::iter::once(pid).chain(victims) {
        assert_no_segments(p);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs a training with an experiment folder, kills (or freezes) the process of `loop_id` once it
/// makes progress, and returns the exit status, the stderr lines and the experiment folder.
fn lose_a_component(
    name: &str,
    loop_id: u32,
    sig: &str,
    extra: &[&str],
) -> (ExitStatus, Vec<String>, PathBuf) {
    let dir = temp_dir(name);
    let mut args = vec![
        "--experiment=exp".into(),
        "--heartbeat_interval=1".into(),
        "--train_for_seconds=60".into(),
        format!("--train_dir={}", dir.display()),
    ];
    args.extend(extra.iter().map(|&a| a.to_owned()));
    let (pid, lines, exited) = spawn_train(&args);
    let mut seen = wait_for_progress(&lines);
    let victim = child_of_loop(pid, loop_id).expect("the component's process");
    signal(victim, sig);
    let status = exited
        .recv_timeout(Duration::from_secs(30))
        .expect("the run stops");
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        seen.push(line);
    }
    for p in [pid, victim] {
        assert_no_segments(p);
    }
    (status, seen, dir)
}

/// Context switches, voluntary and not, of every thread of process `pid` so far.
fn context_switches(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
    tasks
        .map(|task| {
            let status =
                std::fs::read_to_string(task.expect("thread").path().join("status")).expect("thread status");
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .map(|l| {
                    l.split_whitespace()
                        .last()
                        .and_then(|n| n.parse::<u64>().ok())
                        .expect("a count")
                })
                .sum::<u64>()
        })
        .sum()
}

#[test]
fn workers_with_nothing_to_do_make_no_wake_ups() {
    // Stopping the learner starves the rollout worker of slots and the inference worker of
    // requests. Heartbeats go out every minute (a fifth of the interval): no timer is due in the
    // window measured.
    let (pid, lines, exited) = spawn_train(&[
        "--save_experiment=false".into(),
        "--heartbeat_interval=300".into(),
        "--train_for_seconds=60".into(),
    ]);
    let mut seen = wait_for_progress(&lines);
    let [worker, inference, learner] =
        [1, 2, 3].map(|loop_id| child_of_loop(pid, loop_id).expect("the component's process"));
    signal(learner, "-STOP");
    // Time for the slots in flight to reach the stopped learner's queue.
    std::thread::sleep(Duration::from_secs(2));
    let before = [context_switches(worker), context_switches(inference)];
    std::thread::sleep(Duration::from_secs(3));
    let after = [context_switches(worker), context_switches(inference)];
    for ((name, b), a) in ["rollout worker", "inference worker"]
        .iter()
        .zip(before)
        .zip(after)
    {
        assert!(
            a - b <= 2,
            "the idle {name} switched context {} times in 3 s",
            a - b
        );
    }
    // Idle, not dead: the learner trains again once it runs.
    let version = |line: &str| -> Option<u64> { line.rsplit("version ").next()?.trim().parse().ok() };
    seen.extend(lines.try_iter());
    let paused_at = seen
        .iter()
        .filter_map(|l| version(l))
        .max()
        .expect("a version so far");
    signal(learner, "-CONT");
    loop {
        let line = lines.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|e| {
            panic!(
                "no training after the learner resumed ({e}):\n{}",
                seen.join("\n")
            )
        });
        let resumed = version(&line).is_some_and(|v| v > paused_at);
        seen.push(line);
        if resumed {
            break;
        }
    }
    signal(pid, "-INT");
    exited
        .recv_timeout(Duration::from_secs(30))
        .expect("the run stops on SIGINT");
    assert_no_segments(pid);
}

/// The newest checkpoint loads: `enjoy` runs an episode with it.
fn assert_checkpoint_loads(dir: &Path, log: &str) {
    assert_policy_checkpoint_loads(dir, 0, log);
}

fn assert_policy_checkpoint_loads(dir: &Path, policy: usize, log: &str) {
    let out = Command::new(BIN)
        .args([
            "enjoy",
            "--env=CartPole-v1",
            "--experiment=exp",
            "--max_num_episodes=1",
        ])
        .arg(format!("--policy_index={policy}"))
        .arg(format!("--train_dir={}", dir.display()))
        .output()
        .expect("enjoy");
    assert!(
        out.status.success(),
        "enjoy: {}\nrun:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_hung_inference_worker_stops_the_run_with_a_checkpoint() {
    // Loop 2 is inference_worker_0 (one rollout worker by default).
    let (status, seen, dir) = lose_a_component("inference", 2, "-STOP", &[]);
    let log = seen.join("\n");
    assert!(!status.success(), "a lost inference worker is a failure:\n{log}");
    assert!(
        seen.iter()
            .any(|l| l.contains("loop inference_worker_0: hung (no heartbeat for")),
        "the error names the hung inference worker:\n{log}"
    );
    let saved_after = seen
        .iter()
        .position(|l| l.contains("no heartbeat for"))
        .is_some_and(|hung| seen[hung..].iter().any(|l| l.contains("] saved ")));
    assert!(
        saved_after,
        "the learner saves a checkpoint as the run stops:\n{log}"
    );
    assert_checkpoint_loads(&dir, &log);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dead_learner_stops_the_run_with_a_checkpoint_of_its_published_weights() {
    // Loop 3 is the learner.
    let (status, seen, dir) = lose_a_component("learner", 3, "-KILL", &[]);
    let log = seen.join("\n");
    assert!(!status.success(), "a dead learner is a failure:\n{log}");
    assert!(
        seen.iter()
            .any(|l| l.contains("loop learner: process") && l.contains("died")),
        "the error names the dead learner:\n{log}"
    );
    assert!(
        seen.iter()
            .any(|l| l.contains("saved a checkpoint of the weights the learner last published")),
        "{log}"
    );
    assert_checkpoint_loads(&dir, &log);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dead_learner_of_one_policy_stops_the_run_with_every_policys_checkpoint() {
    // Loops: main, rollout_worker_0, inference_worker_p0_0, inference_worker_p1_0, learner_0, learner_1 (5).
    let (status, seen, dir) = lose_a_component("learner-p1", 5, "-KILL", &["--num_policies=2"]);
    let log = seen.join("\n");
    assert!(!status.success(), "a dead learner is a failure:\n{log}");
    assert!(
        seen.iter()
            .any(|l| l.contains("loop learner_1: process") && l.contains("died")),
        "the error names the dead learner:\n{log}"
    );
    assert!(
        seen.iter()
            .any(|l| l.contains("saved a checkpoint of the weights the learner_1 last published")),
        "{log}"
    );
    assert!(
        seen.iter()
            .any(|l| l.contains("/checkpoint_p0/") && l.contains("] saved ")),
        "the live learner saves its checkpoint as the run stops:\n{log}"
    );
    for policy in 0..2 {
        assert_policy_checkpoint_loads(&dir, policy, &log);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The digest of the first dataset a run trains on, in sync mode with one worker of one split (and `extra` flags).
fn first_dataset(serial: bool, seed: u64, extra: &[&str]) -> String {
    let dir = temp_dir(&format!("first-{serial}-{seed}-{}", extra.len()));
    let out = dir.join("summary.json");
    let status = Command::new(BIN)
        .args([
            "train",
            "--env=CartPole-v1",
            "--save_experiment=false",
            "--report_interval_sec=0",
            "--num_workers=1",
            "--worker_num_splits=1",
            "--num_envs_per_worker=8",
            "--async_rl=false",
            "--train_for_env_steps=4096",
        ])
        .args(extra)
        .arg(format!("--serial_mode={serial}"))
        .arg(format!("--seed={seed}"))
        .arg(format!("--summary_json={}", out.display()))
        .stderr(Stdio::null())
        .status()
        .expect("run");
    assert!(status.success());
    let s = summary(&out);
    let _ = std::fs::remove_dir_all(&dir);
    s["first_dataset_digest"]
        .as_str()
        .unwrap_or_else(|| panic!("a dataset was trained on: {s}"))
        .to_owned()
}

#[test]
fn serial_and_parallel_runs_train_on_the_same_first_dataset() {
    let serial = first_dataset(true, 3, &[]);
    assert_eq!(
        serial,
        first_dataset(false, 3, &[]),
        "same seed, same first dataset"
    );
    assert_ne!(serial, first_dataset(false, 4, &[]), "another seed, other data");
    // A recurrent policy's datasets hold the states its steps started from.
    let rnn = ["--use_rnn", "--rnn_type=lstm", "--obs_mask=0,2"];
    let serial = first_dataset(true, 3, &rnn);
    assert_eq!(
        serial,
        first_dataset(false, 3, &rnn),
        "a recurrent policy: the same first dataset"
    );
    assert_ne!(
        serial,
        first_dataset(true, 3, &rnn[..2]),
        "all four values observed: other data"
    );
}

/// SIGKILL of a parallel run's whole process group (a closed terminal, a batch system's kill): no process and no
/// shared-memory segment outlives it. The reaper every run starts (outside the group) removes the segments once the
/// run and every worker are gone; before, they stayed in `/dev/shm` until the next run started.
#[test]
fn sigkill_of_the_whole_group_leaves_no_shared_memory() {
    let tag = format!("RLF_GROUP_KILL_TEST={}", std::process::id());
    let (name, value) = tag.split_once('=').expect("NAME=value");
    let run = spawn(
        Command::new(BIN)
            .args([
                "train",
                "--env=CartPole-v1",
                "--save_experiment=false",
                "--train_for_seconds=60",
                "--report_interval_sec=0.2",
            ])
            .env(name, value)
            .process_group(0),
    );
    loop {
        let line = run
            .lines
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a progress line");
        if line.contains("| fps ") {
            break;
        }
    }
    let pids: Vec<u32> = common::processes_with(&tag)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect();
    // The run, its workers (a rollout worker, an inference worker, the learner) and the reaper.
    assert!(pids.len() >= 5, "{pids:?}");
    let group = rustix::process::Pid::from_raw(run.pid as i32).expect("a pid");
    rustix::process::kill_process_group(group, rustix::process::Signal::KILL).expect("kill the group");
    common::wait_gone(&pids, std::time::Duration::from_secs(30));
    for pid in pids {
        assert_no_segments(pid);
    }
}

/// A Gymnasium CartPole that writes the id of each process that builds one into `BUILDS`.
const COUNTED: &str = r#"
import os
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class Counted(CartPoleEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with open("BUILDS", "a") as f:
            f.write(f"{os.getpid()}\n")


gym.register("Counted-v0", entry_point="counted:Counted")
"#;

/// The env's spaces are learned once, by the main process, and reach every other process in the run plan: the
/// learner and the inference worker build no env, and each rollout worker builds only the envs it steps.
#[test]
fn only_the_main_process_builds_an_env_to_learn_its_spaces() {
    let dir = common::temp_dir("parallel-env-builds");
    let builds = dir.path().join("builds.txt");
    let code = COUNTED.replace("BUILDS", &builds.display().to_string());
    common::train_with_module(
        dir.path(),
        "counted",
        &code,
        &[
            "--env=gym:counted:Counted-v0",
            "--num_workers=2",
            "--num_envs_per_worker=3",
            "--train_for_env_steps=3000",
        ],
    );
    let pids: Vec<String> = std::fs::read_to_string(&builds)
        .expect("the envs wrote their builds")
        .lines()
        .map(str::to_owned)
        .collect();
    let mut per_process = std::collections::BTreeMap::<&str, usize>::new();
    for pid in &pids {
        *per_process.entry(pid).or_default() += 1;
    }
    let mut counts: Vec<usize> = per_process.values().copied().collect();
    counts.sort_unstable();
    assert_eq!(
        counts,
        [1, 3, 3],
        "one env in the main process, three in each rollout worker's, none elsewhere: {per_process:?}"
    );
}
