//! The fault matrix: every kind of run that exists, stopped at an arbitrary instant, resumes. APPO, DQN (prioritised)
//! and SAC, each in serial and parallel mode, Connect Four self-play (parallel, and serial without a kept state) and a
//! PBT population of two:
//! - SIGINT at an instant after the learner has trained: exit 130, no shared memory left, a last checkpoint with
//!   Adam's moments (and the target networks and replay buffer of DQN and SAC);
//! - SIGKILL of the main process at an instant after its first checkpoint: every process of the run goes, the
//!   reaper removes the shared memory, and the newest intact checkpoint is there;
//!
//! and then the same command with a larger budget resumes from that checkpoint, with every tensor it saved (a
//! checkpoint short of Adam's moments or SAC's critics would be said on the log), counts on from its frames and
//! policy version, and ends normally. The instants are spread over the first seconds of training by the case's
//! index, the same on every run of the test.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::{self, spawn, summary, temp_dir, text, BIN};

/// A kind of run: its name and its flags.
struct Case {
    name: &'static str,
    flags: &'static [&'static str],
    /// Tensor name prefixes its checkpoints hold, besides Adam's moments.
    tensors: &'static [&'static str],
    /// Frames the resume runs past the checkpoint. An APPO run's sampling may run up to its slots ahead of the
    /// learner (8 slots of 2,048 frames per worker) and a stop drops the batches not yet trained on, so its resume
    /// runs past that to be sure to train (PBT's two policies with 3,000 frames did not, 1 time in 6).
    more: u64,
}

const CASES: &[Case] = &[
    Case {
        name: "appo_serial",
        flags: &["--env=CartPole-v1", "--serial_mode"],
        tensors: &["action_head.", "value_head."],
        more: 40_000,
    },
    Case {
        name: "appo_parallel",
        flags: &["--env=CartPole-v1"],
        tensors: &["action_head.", "value_head."],
        more: 40_000,
    },
    Case {
        name: "dqn_serial",
        flags: &[
            "--env=CartPole-v1",
            "--algo=dqn",
            "--serial_mode",
            "--prioritized_replay",
        ],
        tensors: &["q_head.", "target.q_head."],
        more: 3_000,
    },
    Case {
        name: "dqn_parallel",
        flags: &["--env=CartPole-v1", "--algo=dqn"],
        tensors: &["q_head.", "target.q_head."],
        more: 3_000,
    },
    Case {
        name: "sac_serial",
        flags: &[
            "--env=Pendulum-v1",
            "--algo=sac",
            "--serial_mode",
            "--learning_starts=500",
        ],
        tensors: &["actor.", "critic.", "target.critic.", "log_alpha"],
        more: 3_000,
    },
    Case {
        name: "sac_parallel",
        flags: &["--env=Pendulum-v1", "--algo=sac", "--learning_starts=500"],
        tensors: &["actor.", "critic.", "target.critic.", "log_alpha"],
        more: 3_000,
    },
    Case {
        name: "self_play",
        flags: &[
            "--env=connect_four",
            "--self_play",
            "--snapshot_every_env_steps=2000",
        ],
        tensors: &["action_head.", "value_head."],
        more: 40_000,
    },
    // Serial mode without a kept state (self-play keeps none): the stop drains its loop, which must not go on
    // stepping the envs it drains.
    Case {
        name: "self_play_serial",
        flags: &[
            "--env=connect_four",
            "--self_play",
            "--snapshot_every_env_steps=2000",
            "--serial_mode",
        ],
        tensors: &["action_head.", "value_head."],
        more: 40_000,
    },
    Case {
        name: "pbt",
        flags: &[
            "--env=CartPole-v1",
            "--num_policies=2",
            "--with_pbt",
            "--pbt_period_env_steps=5000",
            "--pbt_start_mutation=0",
        ],
        tensors: &["action_head.", "value_head."],
        more: 40_000,
    },
];

/// The first progress line whose policy version is past 0, or the first `saved` line: what the signal waits for.
enum Ready {
    Trained,
    Saved,
}

/// Runs `train` with the case's flags in `dir` until `ready`, waits `delay`, sends `signal` to the main process,
/// and checks how the run ends: the status and the log.
fn stop(
    case: &Case,
    dir: &Path,
    ready: Ready,
    delay: Duration,
    signal: &str,
) -> (std::process::ExitStatus, String) {
    let tag = format!("RLF_FAULT_MATRIX={}-{}-{signal}", std::process::id(), case.name);
    let (name, value) = tag.split_once('=').expect("NAME=value");
    let run = spawn(
        Command::new(BIN)
            .args([
                "train",
                "--experiment=exp",
                "--seed=1",
                "--report_interval_sec=0.2",
                "--save_every_sec=1",
            ])
            .args(case.flags)
            .arg("--train_for_env_steps=100000000")
            .arg(format!("--train_dir={}", dir.display()))
            .args(common::extra_train_flags())
            .env(name, value),
    );
    let mut log = Vec::new();
    loop {
        let line = run
            .lines
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{}: not ready ({e}):\n{}", case.name, log.join("\n")));
        let trained = common::progress_version(&line).is_some_and(|v| v > 0);
        let saved = line.contains("[rlfactory] saved ");
        log.push(line);
        match ready {
            Ready::Trained if trained => break,
            Ready::Saved if saved => break,
            _ => {}
        }
    }
    std::thread::sleep(delay);
    let pids: Vec<u32> = common::processes_with(&tag)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect();
    let kill = Command::new("kill")
        .args([&format!("-{signal}"), &run.pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = run
        .exited
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{}: the run does not exit after SIG{signal}", case.name));
    // The workers and the reaper go after the main process, however it ended; the reaper removes the segments.
    common::wait_gone(&pids, Duration::from_secs(30));
    log.extend(run.lines.try_iter());
    let left: Vec<String> = pids
        .iter()
        .flat_map(|&pid| rlf_shm::region::segments_of(pid).expect("list /dev/shm"))
        .collect();
    assert!(
        left.is_empty(),
        "{}: shared memory left after SIG{signal}: {left:?}\n{}",
        case.name,
        log.join("\n")
    );
    (status, log.join("\n"))
}

/// The newest checkpoint of policy 0: its sidecar, env frames and policy version, after checking it loads and holds
/// Adam's moments and a tensor of each of the case's prefixes.
fn newest_checkpoint(case: &Case, dir: &Path) -> (std::path::PathBuf, u64, u64) {
    let newest = common::checkpoint_sidecars(dir)
        .pop()
        .unwrap_or_else(|| panic!("{}: no checkpoint", case.name));
    let ckpt = rlf_experiment::load_checkpoint(&newest)
        .unwrap_or_else(|e| panic!("{}: {} does not load: {e}", case.name, newest.display()));
    for prefix in case.tensors.iter().chain(&["adam."]) {
        assert!(
            ckpt.tensors.keys().any(|n| n.starts_with(prefix)),
            "{}: no {prefix}* in {}",
            case.name,
            newest.display()
        );
    }
    (newest, ckpt.meta.env_steps, ckpt.meta.policy_version)
}

/// Resumes the case's run in `dir` for its `more` frames past `frames`: it must load the checkpoint whole, count on
/// and end normally.
fn resume(case: &Case, dir: &Path, (sidecar, frames, version): (std::path::PathBuf, u64, u64)) {
    let more = case.more;
    let out = dir.join("resumed.json");
    let output = Command::new(BIN)
        .args(["train", "--experiment=exp", "--seed=1", "--report_interval_sec=0"])
        .args(case.flags)
        .arg(format!("--train_for_env_steps={}", frames + more))
        .arg(format!("--train_dir={}", dir.display()))
        .arg(format!("--summary_json={}", out.display()))
        .args(common::extra_train_flags())
        .output()
        .expect("resume");
    let log = text(&output.stderr);
    assert!(
        output.status.success(),
        "{}: the resumed run failed:\n{log}",
        case.name
    );
    let from = format!("resuming from {}", sidecar.display());
    assert!(log.contains(&from), "{}: not {from}:\n{log}", case.name);
    assert!(
        !log.contains("restart afresh"),
        "{}: part of the state was lost:\n{log}",
        case.name
    );
    let s = summary(&out);
    let resumed_frames = s["env_frames"].as_u64().expect("frames");
    assert!(
        resumed_frames >= frames + more,
        "{}: {resumed_frames} frames after {frames}",
        case.name
    );
    let resumed_version = s["policies"][0]["policy_version"]
        .as_u64()
        .or_else(|| s["policy_version"].as_u64())
        .expect("a policy version");
    assert!(
        resumed_version > version,
        "{}: version {resumed_version} after {version}",
        case.name
    );
}

/// The replay buffers' saves would not fit the experiment's disk (a 4-MiB tmpfs of its own, in a user and mount
/// namespace, as above): the run is refused with one line that names the flags to change, exit code 2, before it
/// prints its configuration or writes anything on that disk.
#[test]
fn replay_saves_that_cannot_fit_the_disk_are_refused_before_anything_is_written() {
    let dir = temp_dir("fault-replay-disk");
    let disk = dir.path().join("disk");
    std::fs::create_dir_all(&disk).expect("mount point");
    let script = r#"
        set -u
        mount -t tmpfs -o size=4m tmpfs "$DISK" || exit 90
        "$BIN" train --env=CartPole-v1 --algo=dqn --experiment=exp --train_dir="$DISK" \
            --replay_buffer_size=1000000 --train_for_env_steps=10000 >/dev/null 2>"$OUT/log"
        echo "$?" >"$OUT/status"
        ls -A "$DISK" >"$OUT/listing"
    "#;
    let output = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "bash", "-c", script])
        .env("DISK", &disk)
        .env("OUT", dir.path())
        .env("BIN", BIN)
        .output()
        .expect("unshare");
    assert!(
        output.status.success(),
        "this test mounts a small tmpfs in a user namespace of its own (unshare --user --map-root-user --mount), \
         which this machine refused: {}\n{}",
        output.status,
        text(&output.stderr)
    );
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).expect(name);
    let log = read("log");
    assert_eq!(read("status").trim(), "2", "the run's exit status:\n{log}");
    assert_eq!(
        log.trim().lines().count(),
        1,
        "one line, no configuration before it:\n{log}"
    );
    assert!(
        log.starts_with("error: ") && log.contains("--save_replay_buffer false") && log.contains("MiB free"),
        "{log}"
    );
    assert_eq!(read("listing").trim(), "", "nothing written on the disk");
}

/// SIGINT at an instant after the learner trained: exit 130, then a resume.
#[test]
fn sigint_at_any_instant_of_any_run_saves_what_a_resume_needs() {
    let _turn = common::several_runs();
    common::each_seed(&(0..CASES.len() as u64).collect::<Vec<_>>(), 2, |i| {
        let case = &CASES[i as usize];
        let dir = temp_dir(&format!("fault-int-{}", case.name));
        let delay = Duration::from_millis(137 * i % 1000);
        let (status, log) = stop(case, dir.path(), Ready::Trained, delay, "INT");
        assert_eq!(status.code(), Some(130), "{}: {status}\n{log}", case.name);
        let newest = newest_checkpoint(case, dir.path());
        if case.flags.iter().any(|f| f.starts_with("--algo=")) {
            let replay = dir.path().join("exp/checkpoint_p0/replay_buffer");
            assert!(
                replay.join(newest.0.file_name().expect("name")).is_file(),
                "{}: no replay buffer",
                case.name
            );
        }
        resume(case, dir.path(), newest);
    });
}

/// SIGKILL of the main process at an instant after its first checkpoint: nothing left behind, and a resume from the
/// newest intact checkpoint.
#[test]
fn sigkill_at_any_instant_of_any_run_resumes_from_the_newest_intact_checkpoint() {
    let _turn = common::several_runs();
    common::each_seed(&(0..CASES.len() as u64).collect::<Vec<_>>(), 2, |i| {
        let case = &CASES[i as usize];
        let dir = temp_dir(&format!("fault-kill-{}", case.name));
        let delay = Duration::from_millis(211 * i % 1500);
        let (status, log) = stop(case, dir.path(), Ready::Saved, delay, "KILL");
        assert_eq!(status.code(), None, "{}: {status}\n{log}", case.name);
        let newest = newest_checkpoint(case, dir.path());
        resume(case, dir.path(), newest);
    });
}

/// The disk fills up under a running experiment (a 4-MiB tmpfs of its own, mounted in a user and mount namespace,
/// filled once the first checkpoint is saved): the run stops with one line that says the disk is full and names the
/// checkpoint it resumes from; no temporary file is left; that checkpoint loads, and once the space is back the same
/// command resumes from it.
#[test]
fn a_full_disk_keeps_the_previous_checkpoint_and_says_so_in_one_line() {
    let dir = temp_dir("fault-disk-full");
    let (disk, out) = (dir.path().join("disk"), dir.path().join("out"));
    std::fs::create_dir_all(&disk).expect("mount point");
    std::fs::create_dir_all(&out).expect("out");
    // The run's stderr goes through `tee` to the log and to `grep`, which returns at the first save; then the disk
    // is filled, the rest of the output drained, and the experiment copied out of the namespace before it goes.
    let script = r#"
        set -u
        mount -t tmpfs -o size=4m tmpfs "$DISK" || exit 90
        "$BIN" train --env=CartPole-v1 --experiment=exp --seed=1 --train_dir="$DISK" --save_every_sec=0.5 \
            --report_interval_sec=0.5 --train_for_env_steps=100000000 2>&1 >/dev/null | tee "$OUT/log" \
            | { grep -m1 -q 'rlfactory\] saved '; dd if=/dev/zero of="$DISK/fill" bs=64k 2>/dev/null; cat >/dev/null; }
        echo "${PIPESTATUS[0]}" >"$OUT/status"
        rm -f "$DISK/fill"
        cp -a "$DISK/exp" "$OUT/exp"
    "#;
    let output = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "bash", "-c", script])
        .env("DISK", &disk)
        .env("OUT", &out)
        .env("BIN", BIN)
        .output()
        .expect("unshare");
    assert!(
        output.status.code() != Some(90) && output.status.success(),
        "this test mounts a small tmpfs in a user namespace of its own (unshare --user --map-root-user --mount), \
         which this machine refused: {}\n{}",
        output.status,
        text(&output.stderr)
    );
    let log = std::fs::read_to_string(out.join("log")).expect("log");
    let status = std::fs::read_to_string(out.join("status")).expect("status");
    assert_eq!(status.trim(), "1", "the run's exit status:\n{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{log}");
    let line = errors[0];
    assert!(
        line.starts_with("error: the disk is full (") && line.contains("No space left on device"),
        "{line}"
    );
    let experiment = out.join("exp");
    let mut debris = Vec::new();
    for sub in [experiment.clone(), experiment.join("checkpoint_p0")] {
        for entry in std::fs::read_dir(&sub).expect("experiment folder").flatten() {
            if entry.file_name().to_string_lossy().starts_with(".tmp.") {
                debris.push(entry.path());
            }
        }
    }
    assert!(debris.is_empty(), "temporary files left: {debris:?}");
    // The line names the checkpoint in the namespace's folder; its copy is here.
    let named = line
        .split("resumes from ")
        .nth(1)
        .and_then(|rest| rest.split(" (").next())
        .expect("the checkpoint it resumes from");
    let newest = experiment
        .join("checkpoint_p0")
        .join(Path::new(named).file_name().expect("a checkpoint file name"));
    assert_eq!(
        common::checkpoint_sidecars(&out).pop().as_deref(),
        Some(newest.as_path()),
        "{line}"
    );
    let ckpt = rlf_experiment::load_checkpoint(&newest).expect("the kept checkpoint loads");
    let case = &CASES[1];
    resume(
        case,
        &out,
        (newest, ckpt.meta.env_steps, ckpt.meta.policy_version),
    );
}

/// Every tensor of the newest checkpoint of policy 0 in `dir`, by name.
fn newest_tensors(dir: &Path) -> std::collections::BTreeMap<String, rlf_experiment::checkpoint::Tensor> {
    let newest = common::checkpoint_sidecars(dir).pop().expect("a checkpoint");
    rlf_experiment::load_checkpoint(&newest)
        .unwrap_or_else(|e| panic!("{} does not load: {e}", newest.display()))
        .tensors
}

/// A kind of run for the exact resume: its name, flags and budget.
struct Exact {
    name: &'static str,
    flags: &'static [&'static str],
    frames: u64,
}

const EXACT: &[Exact] = &[
    Exact {
        name: "dqn-prioritized",
        flags: &["--env=CartPole-v1", "--algo=dqn", "--prioritized_replay"],
        frames: 9000,
    },
    Exact {
        name: "appo-normalised",
        flags: &["--env=CartPole-v1", "--normalize_input", "--normalize_returns"],
        frames: 300_000,
    },
    Exact {
        name: "appo-rnn",
        flags: &[
            "--env=CartPole-v1",
            "--use_rnn",
            "--num_envs_per_worker=32",
            "--rollout=16",
        ],
        frames: 60_000,
    },
    Exact {
        name: "sac",
        flags: &["--env=Pendulum-v1", "--algo=sac", "--learning_starts=500"],
        frames: 2500,
    },
];

/// Starts `rlfactory <args>`, waits for the first line of its log that `when` accepts (two minutes at most), then
/// `delay` seconds, and sends it `signal` (`kill`'s form: `-INT`); returns how it exited and its log.
fn signal_when(
    args: &[String],
    when: impl Fn(&str) -> bool,
    delay: f64,
    signal: &str,
) -> (std::process::ExitStatus, Vec<String>) {
    let run = spawn(Command::new(BIN).args(args));
    let mut log = Vec::new();
    loop {
        let line = run
            .lines
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("no awaited line ({e}):\n{}", log.join("\n")));
        let seen = when(&line);
        log.push(line);
        if seen {
            break;
        }
    }
    std::thread::sleep(Duration::from_secs_f64(delay));
    let kill = Command::new("kill")
        .args([signal, &run.pid.to_string()])
        .status()
        .expect("kill");
    assert!(
        kill.success(),
        "the run ended before the {signal}:\n{}",
        log.join("\n")
    );
    let status = run
        .exited
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("no exit within 60 s of the {signal}:\n{}", log.join("\n")));
    log.extend(run.lines.try_iter());
    (status, log)
}

/// A serial run whose stop cannot keep an exact state says why as it starts (the run plan learned it from the one
/// env it built): a multi-agent env, and a Gymnasium env (which cannot save its state); a native single-agent env's
/// run says it keeps one.
#[test]
fn a_serial_run_says_at_its_start_whether_a_stop_keeps_an_exact_state() {
    for (env, said) in [
        (
            "treasurehunt",
            "a stop keeps no exact state (multi-agent envs keep no exact state)",
        ),
        (
            "gym:CartPole-v1",
            "a stop keeps no exact state (the env cannot save its state: ",
        ),
        (
            "CartPole-v1",
            "a stop keeps every component's state in kept_state.bin for an exact resume",
        ),
    ] {
        let dir = temp_dir("says-exact");
        let out = common::run(&[
            "train",
            &format!("--env={env}"),
            "--serial_mode",
            "--experiment=exp",
            &format!("--train_dir={}", dir.path().display()),
            "--train_for_env_steps=2000",
            "--report_interval_sec=0",
        ]);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{env}: {stderr}");
        assert!(stderr.contains(said), "{env}: no `{said}` in\n{stderr}");
    }
}

/// Stop and resume are exact: a serial run, stopped by SIGINT at an arbitrary instant, then its resume stopped again,
/// then a start SIGKILLed as it begins, then resumed to the end, ends with every tensor of its last checkpoint (the
/// networks, the targets, Adam's moments, the normalisers' statistics) bit-identical to those of the same run never
/// stopped: for DQN with prioritised replay, APPO with normalisers and with a GRU, and SAC. The stop keeps every
/// component's state (the envs mid-episode, the n-step windows, the generators, the trajectory slots, the batcher's
/// datasets, the undelivered messages); the same stop resumed without it ends elsewhere.
#[test]
fn a_serial_run_stopped_twice_by_sigint_ends_with_the_weights_of_one_never_stopped() {
    for case in EXACT {
        let budget = format!("--train_for_env_steps={}", case.frames);
        let args = |dir: &Path| -> Vec<String> {
            [
                "train",
                "--experiment=exp",
                "--serial_mode",
                "--seed=2",
                "--report_interval_sec=0.2",
                "--save_every_sec=0.5",
                &budget,
            ]
            .iter()
            .chain(case.flags)
            .map(|f| f.to_string())
            .chain([format!("--train_dir={}", dir.display())])
            .collect()
        };
        let whole = temp_dir(&format!("exact-{}", case.name));
        let output = Command::new(BIN)
            .args(args(whole.path()))
            .output()
            .expect("train");
        assert!(output.status.success(), "{}: {}", case.name, text(&output.stderr));
        let expected = newest_tensors(whole.path());
        // Two stops: once a progress line has passed a quarter of the budget, and in the resumed run once one has
        // passed 55% of it, each after a further delay.
        for delays in [[0.0, 0.3], [0.15, 0.05]] {
            let dir = temp_dir(&format!("exact-{}-{}", case.name, delays[0]));
            for (share, delay) in [0.25, 0.55].into_iter().zip(delays) {
                let past = |line: &str| {
                    line.split("frames ")
                        .nth(1)
                        .and_then(|f| f.split_whitespace().next())
                        .and_then(|f| f.parse::<f64>().ok())
                        .is_some_and(|f| f >= share * case.frames as f64)
                };
                let (status, log) = signal_when(&args(dir.path()), past, delay, "-INT");
                assert_eq!(status.code(), Some(130), "{}: {}", case.name, log.join("\n"));
                assert!(
                    dir.path().join("exp/kept_state.bin").is_file(),
                    "{}: the stop kept no state:\n{}",
                    case.name,
                    log.join("\n")
                );
            }
            // A start killed at once (SIGKILL as it begins, before it saves anything) leaves the kept state to the
            // next start.
            let begun = |line: &str| line.contains("resumes exactly where the run stopped");
            let (status, log) = signal_when(&args(dir.path()), begun, 0.0, "-KILL");
            assert_eq!(
                status.code(),
                None,
                "{}: the start ended before the SIGKILL:\n{}",
                case.name,
                log.join("\n")
            );
            let output = Command::new(BIN).args(args(dir.path())).output().expect("resume");
            let log = text(&output.stderr);
            assert!(
                output.status.success(),
                "{}: the resumed run failed:\n{log}",
                case.name
            );
            assert!(
                log.contains("resumes exactly where the run stopped"),
                "{}:\n{log}",
                case.name
            );
            let got = newest_tensors(dir.path());
            assert_eq!(
                got.keys().collect::<Vec<_>>(),
                expected.keys().collect::<Vec<_>>(),
                "{}: other tensors",
                case.name
            );
            let differ: Vec<&String> = expected
                .iter()
                .filter(|(k, v)| got.get(*k) != Some(v))
                .map(|(k, _)| k)
                .collect();
            assert!(
                differ.is_empty(),
                "{} stopped after {delays:?} s: tensors differ from the run never stopped: {differ:?}\n{log}",
                case.name
            );
        }
        // The control: the same stop resumed without its kept state ends elsewhere.
        let dir = temp_dir(&format!("exact-{}-control", case.name));
        let (status, _) = common::interrupt_when_trained(&args(dir.path()), "INT");
        assert_eq!(status.code(), Some(130));
        std::fs::remove_file(dir.path().join("exp/kept_state.bin")).expect("a kept state");
        let output = Command::new(BIN).args(args(dir.path())).output().expect("resume");
        assert!(output.status.success(), "{}", text(&output.stderr));
        assert_ne!(
            newest_tensors(dir.path()),
            expected,
            "{}: a resume without the kept state ended as the run never stopped",
            case.name
        );
    }
}
