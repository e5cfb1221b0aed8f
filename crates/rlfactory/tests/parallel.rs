//! The parallel architecture end to end, through the real binary: rollout workers, the inference
//! worker and the learner in processes of their own.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_rlfactory");

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlf-parallel-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn summary(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("summary written")).expect("summary is JSON")
}

/// Stderr lines and the exit status of `child`, each from a thread blocked on it.
fn watch(mut child: Child) -> (mpsc::Receiver<String>, mpsc::Receiver<ExitStatus>) {
    let (line_tx, lines) = mpsc::channel();
    let (exit_tx, exited) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = line_tx.send(line);
        }
    });
    std::thread::spawn(move || {
        let _ = exit_tx.send(child.wait().expect("wait"));
    });
    (lines, exited)
}

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
        .stderr(Stdio::null())
        .status()
        .expect("run");
    assert!(status.success());
    let s = summary(&out);
    assert_eq!(s["reached_reward"], true, "{s}");
    assert!(s["frames_to_reward"].as_u64().expect("frames") <= 1_500_000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The process of `loop_id` among the children of `parent` (rlf-signal tells each its role in the environment).
fn child_of_loop(parent: u32, loop_id: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|pid: &u32| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| String::from_utf8_lossy(&env).contains(&format!("\"loop_id\":{loop_id},")))
                .unwrap_or(false)
        })
}

#[test]
fn killing_a_rollout_worker_stops_the_run_with_its_name() {
    let child = Command::new(BIN)
        .args([
            "train",
            "--env=CartPole-v1",
            "--save_experiment=false",
            "--report_interval_sec=0.1",
        ])
        .args(["--num_workers=2", "--train_for_seconds=60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (lines, exited) = watch(child);
    let mut seen = Vec::new();
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a progress line");
        let started = line.contains("frames ") && !line.contains("frames 0 ");
        seen.push(line);
        if started {
            break;
        }
    }
    // Loop 1 is the first declared process loop: rollout_worker_0.
    let victim = child_of_loop(pid, 1).expect("the rollout worker's process");
    let status = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
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
    assert_eq!(
        rlf_shm::region::segments_of(pid).expect("list /dev/shm"),
        Vec::<String>::new()
    );
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
