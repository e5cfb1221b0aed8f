//! SAC (`--algo sac`) end to end: rollout workers put each step, its action squashed into [−1, 1], into the replay
//! buffer in shared memory; the learner trains twin critics, the actor and the temperature at `--replay_ratio` and
//! publishes the actor; `eval` plays its mean action.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{
    child_of_loop, eval_mean_return, expect_failed_run, report, run, spawn, summary, temp_dir, text, Outcome,
    BIN,
};

fn eval(train_dir: &std::path::Path, episodes: usize) -> std::process::Output {
    run(&[
        "eval",
        "--env=Pendulum-v1",
        "--experiment=exp",
        &format!("--train_dir={}", train_dir.display()),
        &format!("--max_num_episodes={episodes}"),
        "--eval_deterministic",
    ])
}

/// The shipped SAC config for Pendulum-v1 (RL Zoo's hyper-parameters: 20K env steps, one SGD step of 256 per env
/// step after the first 100) on one seed: the learner kept the replay ratio, and the deterministic policy it ends
/// with swings the pendulum up and holds it (a mean return of at least −200 over 20 episodes; RL Zoo reports −157
/// at this budget, a random policy gets about −1,200). All five seeds: docs/benchmarks.md.
#[test]
#[ignore = "learning lane"]
fn sac_learns_pendulum_within_20k_steps() {
    let dir = temp_dir("sac-pendulum");
    let out = dir.path().join("summary.json");
    let output = run(&[
        "train",
        "--env=Pendulum-v1",
        "--algo=sac",
        "--seed=1",
        "--experiment=exp",
        &format!("--train_dir={}", dir.path().display()),
        &format!("--summary_json={}", out.display()),
        "--report_interval_sec=0",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let s = summary(&out);
    let frames = s["env_frames"].as_u64().expect("frames");
    assert!((20_000..20_100).contains(&frames), "{frames}");
    // 256 samples per insert of 256 per SGD step: one step per transition after the first 100.
    let steps = s["policy_version"].as_u64().expect("version") as f64;
    let due = (frames - 100) as f64;
    assert!(
        (steps / due - 1.0).abs() < 0.02,
        "{steps} SGD steps for {frames} frames\n{s}"
    );
    let output = eval(dir.path(), 20);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    let ret = eval_mean_return(&stdout);
    let outcome = Outcome {
        passed: ret >= -200.0,
        figure: format!("{ret:.2}"),
        target: "deterministic mean return >= -200 over 20 episodes after 20K frames".to_owned(),
    };
    report("sac_pendulum", 1, &outcome);
    assert!(outcome.passed, "the deterministic policy's mean return {ret}");
}

/// SIGTERM (a cluster's preemption) on a parallel SAC run, whose learner process waits on its replay buffer between
/// rounds: the run stops at once, without waiting out the stop timeout (it took those 20 s, exited 1 and saved the
/// published actor alone), exits 143, and its last checkpoint holds the actor, the critics, their targets, the
/// temperature and the three optimisers' moments, and its replay buffer is saved after it.
#[test]
fn sigterm_on_a_parallel_sac_run_saves_every_network_the_temperature_and_adams_moments() {
    common::assert_a_stop_saves_everything(
        &["--env=Pendulum-v1", "--algo=sac", "--learning_starts=500"],
        "TERM",
        143,
        &["actor.", "critic.", "target.critic.", "log_alpha"],
    );
}

/// Serial mode: the rollout worker, inference and the learner on one loop, the learner taking after each
/// trajectory the SGD steps its transitions are due (every env's last step waits for the next one to be a row).
#[test]
fn serial_sac_keeps_the_replay_ratio_on_one_loop() {
    let s = common::train_summary(&[
        "--env=Pendulum-v1".to_owned(),
        "--algo=sac".to_owned(),
        "--seed=2".to_owned(),
        "--serial_mode".to_owned(),
        "--train_for_env_steps=2000".to_owned(),
    ]);
    let cpu = s["cpu_seconds"].as_object().expect("cpu seconds");
    assert_eq!(cpu.keys().collect::<Vec<_>>(), ["main"], "{s}");
    let frames = s["env_frames"].as_u64().expect("frames");
    let due = (frames - 2 - 100) as f64;
    let steps = s["policy_version"].as_u64().expect("version") as f64;
    assert!(
        (steps / due - 1.0).abs() < 0.01,
        "{steps} SGD steps, {due} due\n{s}"
    );
}

/// A SAC learner killed mid-run: the run stops with one line naming it; the actor it last published is saved as a
/// checkpoint that `eval` loads; a resumed run continues from that actor, says that its critics and Adam's moments
/// start afresh, and trains on.
#[test]
fn a_dead_sac_learner_stops_the_run_and_its_actor_resumes() {
    let dir = temp_dir("sac-learner-kill");
    let train_dir = format!("--train_dir={}", dir.path().display());
    let mut command = Command::new(BIN);
    command.args([
        "train",
        "--env=Pendulum-v1",
        "--algo=sac",
        "--experiment=exp",
        "--heartbeat_interval=1",
        "--train_for_env_steps=10000000",
        "--report_interval_sec=0.2",
        &train_dir,
    ]);
    let run_ = spawn(&mut command);
    let mut seen = Vec::new();
    loop {
        let line = run_
            .lines
            .recv_timeout(Duration::from_secs(60))
            .expect("progress");
        let trained = line
            .split("version ")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|v| v > 200);
        seen.push(line);
        if trained {
            break;
        }
    }
    // Loops: main, rollout_worker_0, inference_worker_0, learner (3).
    let learner = child_of_loop(run_.pid, 3).expect("the learner's process");
    let status = Command::new("kill")
        .args(["-KILL", &learner.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let (error, log) = expect_failed_run(run_, dir.path());
    assert!(
        error.contains("loop learner") && error.contains("died"),
        "{error}\n{}\n{log}",
        seen.join("\n")
    );
    let output = eval(dir.path(), 2);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = dir.path().join("summary.json");
    let output = run(&[
        "train",
        "--env=Pendulum-v1",
        "--algo=sac",
        "--experiment=exp",
        "--train_for_seconds=4",
        "--report_interval_sec=0",
        &train_dir,
        &format!("--summary_json={}", out.display()),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let log = std::fs::read_to_string(dir.path().join("exp/log.txt")).expect("log");
    assert!(
        log.contains("Adam's moments (and SAC's critics) restart afresh"),
        "{log}"
    );
    let s = summary(&out);
    assert!(s["policy_version"].as_u64() > Some(200), "{s}");
}

/// `--algo sac` on an env with Discrete actions stops before anything starts, with one line naming the space.
#[test]
fn sac_refuses_discrete_actions() {
    let dir = temp_dir("sac-discrete");
    let output = run(&[
        "train",
        "--env=CartPole-v1",
        "--algo=sac",
        &format!("--train_dir={}", dir.path().display()),
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("--algo sac needs Box actions; CartPole-v1 has Discrete(2)"),
        "{stderr}"
    );
}
