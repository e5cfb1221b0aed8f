//! `rlfactory top` attached to a real run from another process: it names every component with its process, CPU share
//! and queue, and it ends by itself when the run does.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{extra_train_flags, progress_version, spawn, temp_dir, text, BIN};

/// A frame's line of loop `name`: its fields (name, pid, CPU %, queued, heartbeat..., components).
fn loop_line<'a>(frame: &'a str, name: &str) -> Vec<&'a str> {
    let line = frame
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no line for loop {name} in\n{frame}"));
    line.split_whitespace().collect()
}

#[test]
fn top_shows_every_component_of_a_running_experiment_and_ends_with_it() {
    let dir = temp_dir("top");
    let experiment = format!("top_suite_{}", std::process::id());
    let mut args: Vec<String> = [
        "train",
        "--env=CartPole-v1",
        "--num_workers=2",
        "--report_interval_sec=0.2",
        "--train_for_env_steps=1000000000",
        "--save_experiment=false",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--experiment".into(), experiment.clone()]);
    args.extend(["--train_dir".into(), dir.path().display().to_string()]);
    args.extend(extra_train_flags());
    let run = spawn(Command::new(BIN).args(&args));
    loop {
        let line = run
            .lines
            .recv_timeout(Duration::from_secs(120))
            .expect("a progress line with a trained version");
        if progress_version(&line).is_some_and(|v| v > 0) {
            break;
        }
    }

    // One frame, one interval after attaching.
    let once = Command::new(BIN)
        .args(["top", "--experiment", &experiment, "--once", "--interval", "0.5"])
        .output()
        .expect("run top");
    let frame = text(&once.stdout);
    assert!(once.status.success(), "{}\n{frame}", text(&once.stderr));
    assert!(
        frame.starts_with(&format!("rlfactory top: {experiment} (pid {}", run.pid)),
        "{frame}"
    );
    assert!(frame.contains("policy 0: version "), "{frame}");
    let main = loop_line(&frame, "main");
    assert_eq!(
        main[1],
        run.pid.to_string(),
        "the runner's main loop is the run's process"
    );
    assert!(main.ends_with(&["runner"]), "{frame}");
    let learner = loop_line(&frame, "learner");
    assert!(learner.ends_with(&["batcher,", "learner"]), "{frame}");
    let cpu: f64 = learner[2].parse().expect("the learner's CPU share");
    assert!(cpu > 0.0, "the learner trains: {frame}");
    for name in [
        "rollout_worker_0",
        "rollout_worker_1",
        "inference_worker_0",
        "learner",
    ] {
        let fields = loop_line(&frame, name);
        let pid: u32 = fields[1].parse().expect("a process of its own");
        assert_ne!(pid, run.pid, "{name} runs in a process of its own");
        let _: f64 = fields[2]
            .parse()
            .unwrap_or_else(|_| panic!("{name}'s CPU share in\n{frame}"));
        let _: usize = fields[3]
            .parse()
            .unwrap_or_else(|_| panic!("{name}'s waiting messages in\n{frame}"));
        assert!(
            fields[4..].join(" ").contains(" s ago"),
            "{name}'s heartbeat in\n{frame}"
        );
    }

    // Attached until the run stops: it ends by itself, saying so.
    let mut watching = Command::new(BIN)
        .args(["top", "--experiment", &experiment, "--interval", "0.2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run top");
    let (tx, lines) = mpsc::channel();
    let stdout = watching.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    lines
        .recv_timeout(Duration::from_secs(30))
        .expect("top draws a frame");
    let kill = Command::new("kill")
        .args(["-INT", &run.pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    run.exited
        .recv_timeout(Duration::from_secs(60))
        .expect("the run stops on SIGINT");
    let (done_tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(watching.wait_with_output().expect("wait for top"));
    });
    let ended = done
        .recv_timeout(Duration::from_secs(30))
        .expect("top ends when the run does");
    assert!(ended.status.success(), "{}", text(&ended.stderr));
    let last = lines.iter().last().unwrap_or_default();
    assert_eq!(
        last,
        format!("the run of {experiment} (pid {}) has ended", run.pid)
    );

    // Nothing to attach to now: one line that says so.
    let none = Command::new(BIN)
        .args(["top", "--experiment", &experiment])
        .output()
        .expect("run top");
    assert_eq!(none.status.code(), Some(1));
    assert_eq!(
        text(&none.stderr).trim(),
        format!("error: top: no run named {experiment:?} is training on this machine (a run shows itself once it has started)")
    );
}
