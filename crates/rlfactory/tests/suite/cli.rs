//! The command line: flag forms Sample Factory users type, and one clear error line (exit code 2)
//! for bad input, before anything starts.

use std::process::Command;

use crate::common;
use rlfactory::cli::{parse_invocation, Invocation};
use rlfactory::config::Config;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rlfactory"))
        .args(args)
        .output()
        .expect("run rlfactory");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn rejects(args: &[&str], needle: &str) {
    let (code, stderr) = run(args);
    assert_eq!(code, 2, "{args:?}: exit code {code}, stderr {stderr}");
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "{args:?}: one line, got {stderr}"
    );
    assert!(stderr.contains(needle), "{args:?}: {stderr:?} lacks {needle:?}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_input_is_one_clear_line_and_exit_code_2() {
    rejects(
        &["train", "--env", "CartPole-v1", "--no_such_flag", "3"],
        "--no_such_flag",
    );
    rejects(
        &["train", "--env", "CartPole-v1", "--rollout", "many"],
        "--rollout",
    );
    rejects(
        &["train", "--env", "CartPole-v1", "--with_vtrace=maybe"],
        "not a boolean",
    );
    rejects(
        &["train", "--env", "CartPole-v1", "--algo", "ppo"],
        "appo, dqn, sac",
    );
    rejects(&["train", "--rollout", "8"], "--env");
    rejects(
        &["train", "--env", "CartPole-v1", "--batch_size", "100"],
        "multiple of --rollout",
    );
    rejects(
        &[
            "train",
            "--env",
            "CartPole-v1",
            "--async_rl=false",
            "--batch_size",
            "64",
            "--rollout",
            "32",
        ],
        "--async_rl=false",
    );
    rejects(
        &[
            "train",
            "--env",
            "CartPole-v1",
            "--num_envs_per_worker",
            "5",
            "--worker_num_splits",
            "2",
        ],
        "--worker_num_splits",
    );
    rejects(&["train", "--env", "CartPole-v1", "--gamma", "1.5"], "--gamma");
    rejects(
        &["train", "--env", "CartPole-v1", "--self_play"],
        "--self_play needs a multi-agent env",
    );
    rejects(
        &[
            "train",
            "--env",
            "connect_four",
            "--self_play",
            "--async_rl=false",
        ],
        "--self_play needs --async_rl=true",
    );
    rejects(
        &[
            "train",
            "--env",
            "connect_four",
            "--num_policies",
            "2",
            "--self_play_exploiters",
            "1",
        ],
        "--self_play_exploiters needs --self_play",
    );
    let c4 = ["train", "--env", "connect_four", "--self_play"];
    for (flags, wanted) in [
        (
            &[
                "--self_play_builtin_opponents",
                "minimax",
                "--self_play_builtin_prob",
                "0.2",
            ][..],
            "connect_four has no built-in player `minimax` (it has: random, heuristic)",
        ),
        (
            &["--self_play_builtin_opponents", "heuristic"][..],
            "--self_play_builtin_opponents and --self_play_builtin_prob > 0 go together",
        ),
        (
            &["--self_play_builtin_prob", "0.2"][..],
            "--self_play_builtin_opponents and --self_play_builtin_prob > 0 go together",
        ),
        (
            &[
                "--self_play_builtin_opponents",
                "random",
                "--self_play_builtin_prob",
                "1.5",
            ][..],
            "--self_play_builtin_prob must be in [0, 1], got 1.5",
        ),
        (
            &["--self_play_pfsp_power=-1"][..],
            "--self_play_pfsp_power must be 0 or more, got -1",
        ),
        (
            &["--self_play_opponent_temperature", "0"][..],
            "--self_play_opponent_temperature must be more than 0, got 0",
        ),
        (
            &["--self_play_exploiters", "1"][..],
            "--self_play_exploiters (1) must leave at least one of --num_policies (1) a main policy",
        ),
        (
            &[
                "--num_policies",
                "2",
                "--self_play_exploiters",
                "1",
                "--self_play_exploiter_prob",
                "2",
            ][..],
            "--self_play_exploiter_prob must be in [0, 1], got 2",
        ),
        (
            &[
                "--num_policies",
                "2",
                "--self_play_exploiters",
                "1",
                "--agent_policy_map",
                "player_0=0,player_1=1",
            ][..],
            "--self_play_exploiters draws each env's policies itself: drop --agent_policy_map and --with_pbt",
        ),
        (
            &["--self_play_exploiter_reset", "0.7"][..],
            "--self_play_exploiter_reset needs --self_play_exploiters",
        ),
        (
            &[
                "--num_policies",
                "2",
                "--self_play_exploiters",
                "1",
                "--self_play_exploiter_reset",
                "1.5",
            ][..],
            "--self_play_exploiter_reset must be in [0, 1], got 1.5",
        ),
    ] {
        rejects(&[&c4[..], flags].concat(), wanted);
    }
    for (flags, wanted) in [
        (
            &["--env", "Pendulum-v1", "--algo", "dqn"][..],
            "--algo dqn needs Discrete actions; Pendulum-v1 has Box",
        ),
        (
            &["--env", "connect_four", "--algo", "dqn", "--self_play"][..],
            "--self_play is not supported with --algo dqn yet",
        ),
        (
            &["--env", "Pendulum-v1", "--algo", "sac", "--normalize_input"][..],
            "--normalize_input is not supported with --algo sac yet",
        ),
        (
            &["--env", "CartPole-v1", "--algo", "dqn", "--tau", "0"][..],
            "--tau must be in (0, 1], got 0",
        ),
        (
            &["--env", "Pendulum-v1", "--algo", "sac", "--lr_schedule", "kl_adaptive_epoch"][..],
            "--lr_schedule kl_adaptive_epoch adapts to APPO's KL divergence; --algo sac takes constant or linear_decay",
        ),
        (
            &["--env", "Pendulum-v1", "--algo", "sac", "--exploration_duration_mu", "2"][..],
            "--exploration_duration_mu holds DQN's ε-greedy exploratory actions; --algo sac explores otherwise",
        ),
        (
            &["--env", "CartPole-v1", "--algo", "dqn", "--exploration_duration_mu", "-1"][..],
            "--exploration_duration_mu must be 0 (plain ε-greedy) or more, got -1",
        ),
        (
            &[
                "--env",
                "CartPole-v1",
                "--algo",
                "dqn",
                "--replay_buffer_size",
                "10",
            ][..],
            "--replay_buffer_size (10) must hold at least one --batch_size (64)",
        ),
        (
            &[
                "--env",
                "CartPole-v1",
                "--algo",
                "dqn",
                "--exploration_final_eps",
                "2",
            ][..],
            "--exploration_final_eps must be in [0, 1], got 2",
        ),
    ] {
        rejects(&[&["train"][..], flags].concat(), wanted);
    }
    rejects(
        &[
            "train",
            "--env",
            "connect_four",
            "--self_play_builtin_opponents",
            "random",
            "--self_play_builtin_prob",
            "0.2",
        ],
        "--self_play_builtin_opponents needs --self_play",
    );
    rejects(
        &[
            "train",
            "--env",
            "CartPole-v1",
            "--with_pbt",
            "--num_policies",
            "1",
        ],
        "--with_pbt needs a population",
    );
    rejects(
        &[
            "train",
            "--env",
            "CartPole-v1",
            "--num_policies",
            "2",
            "--with_pbt",
            "--save_experiment=false",
        ],
        "--with_pbt copies weights through checkpoints",
    );
    rejects(
        &["train", "--env", "CartPole-v1", "--rescale_obs"],
        "--rescale_obs: invalid space: rescaling the observations of CartPole-v1: value 1 is bounded by [-3.4028235e38, \
         3.4028235e38], not within ±1e6",
    );
    rejects(
        &["train", "--env", "treasurehunt", "--rescale_obs"],
        "--rescale_obs rescales a single-agent env's observations; treasurehunt is a multi-agent env",
    );
    rejects(
        &[
            "train",
            "--env",
            "CartPole-v1",
            "--shared_policy_workers",
            "1",
            "--policy_workers_per_policy",
            "2",
        ],
        "--shared_policy_workers 1 and --policy_workers_per_policy 2: the shared workers replace the per-policy \
         ones, set one of them",
    );
    rejects(
        &["train", "--env", "CartPole-v1", "--learning_rate", "-1"],
        "--learning_rate",
    );
    rejects(
        &["train", "--env", "CartPole-v1", "--config", "/nonexistent/x.toml"],
        "/nonexistent/x.toml",
    );
    rejects(
        &["train", "--env", "NoSuchEnv-v0", "--train_for_env_steps", "10"],
        "NoSuchEnv-v0",
    );
}

#[test]
fn bad_config_files_name_the_file_and_key() {
    let dir = std::env::temp_dir().join(format!("rlfactory-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unknown = dir.join("unknown.toml");
    std::fs::write(&unknown, "rollout = 16\nlearning_rat = 0.1\n").unwrap();
    rejects(
        &[
            "train",
            "--env",
            "CartPole-v1",
            "--config",
            unknown.to_str().unwrap(),
        ],
        "unknown key `learning_rat`",
    );
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "rollout = \"long\"\n").unwrap();
    rejects(
        &["train", "--env", "CartPole-v1", "--config", bad.to_str().unwrap()],
        "bad.toml",
    );
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "rollout = = 3\n").unwrap();
    rejects(
        &[
            "train",
            "--env",
            "CartPole-v1",
            "--config",
            broken.to_str().unwrap(),
        ],
        "broken.toml",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn parse(args: &[&str]) -> Config {
    let mut all = vec!["rlfactory".to_owned(), "train".to_owned()];
    all.extend(args.iter().map(|s| (*s).to_owned()));
    match parse_invocation(&all, &rlf_env::EnvRegistry::with_builtin()) {
        Ok(Invocation::Train(plan)) => plan.config,
        Ok(other) => panic!("{args:?}: not a train command: {other:?}"),
        Err(e) => panic!("{args:?}: {e:?}"),
    }
}

#[test]
fn boolean_and_value_forms() {
    let env = "--env=CartPole-v1";
    assert!(!parse(&[env]).appo.with_vtrace);
    assert!(parse(&[env, "--with_vtrace"]).appo.with_vtrace);
    assert!(
        parse(&[env, "--with_vtrace", "--rollout", "16", "--batch_size", "256"])
            .appo
            .with_vtrace
    );
    assert!(parse(&[env, "--with_vtrace=true"]).appo.with_vtrace);
    assert!(parse(&[env, "--with_vtrace=True"]).appo.with_vtrace);
    assert!(!parse(&[env, "--with_vtrace=False"]).appo.with_vtrace);
    assert!(parse(&[env, "--with_vtrace", "True"]).appo.with_vtrace);
    assert!(
        !parse(&[env, "--normalize_advantage", "false"])
            .appo
            .normalize_advantage
    );
    assert_eq!(
        parse(&["--env", "CartPole-v1", "--rollout", "16"])
            .sampling
            .rollout,
        16
    );
    assert_eq!(parse(&[env, "--rollout=16"]).sampling.rollout, 16);
    assert_eq!(
        parse(&[env, "--encoder_mlp_layers", "32,32,16"])
            .model
            .encoder_mlp_layers
            .0,
        [32, 32, 16]
    );
}

#[test]
fn shipped_file_and_command_line_layer_in_order() {
    // The shipped CartPole config sets num_batches_per_epoch 8 (the default is 1); a file overrides it; the
    // command line wins.
    let cfg = parse(&["--env=CartPole-v1"]);
    assert_eq!((cfg.sampling.rollout, cfg.appo.num_batches_per_epoch), (32, 8));
    let dir = std::env::temp_dir().join(format!("rlfactory-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(&file, "rollout = 16\nnum_epochs = 3\nwith_vtrace = true\n").unwrap();
    let path = file.to_str().unwrap();
    let cfg = parse(&["--env=CartPole-v1", "--config", path]);
    assert_eq!(
        (cfg.sampling.rollout, cfg.appo.num_epochs, cfg.appo.with_vtrace),
        (16, 3, true)
    );
    let cfg = parse(&["--env=CartPole-v1", "--config", path, "--num_epochs=5"]);
    assert_eq!((cfg.sampling.rollout, cfg.appo.num_epochs), (16, 5));
    // The resolved config round-trips through --config, as TOML and as an experiment's JSON.
    let saved = dir.join("resolved.toml");
    std::fs::write(&saved, cfg.to_toml().unwrap()).unwrap();
    let again = parse(&["--env=CartPole-v1", "--config", saved.to_str().unwrap()]);
    assert_eq!(again, cfg);
    let json = dir.join("config.json");
    std::fs::write(&json, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    assert_eq!(Config::from_file(&json).unwrap(), cfg);
    assert_eq!(
        parse(&["--env=CartPole-v1", "--config", json.to_str().unwrap()]),
        cfg
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn benchmark_reports_steady_state_fps_without_an_experiment_folder() {
    let dir = std::env::temp_dir().join(format!("rlf-cli-benchmark-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = dir.join("summary.json");
    let output = Command::new(env!("CARGO_BIN_EXE_rlfactory"))
        .current_dir(&dir)
        .args([
            "train",
            "--env",
            "CartPole-v1",
            "--benchmark",
            "--train_for_seconds",
            "2",
        ])
        .arg(format!("--summary_json={}", out.display()))
        .output()
        .expect("run rlfactory");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("[rlfactory] benchmark: steady-state fps"),
        "{stderr}"
    );
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("summary written")).expect("summary is JSON");
    assert!(s["fps"].as_f64().expect("fps") > 0.0, "{s}");
    assert!(s["fps_overall"].as_f64().expect("fps_overall") > 0.0, "{s}");
    assert!(s["env_frames"].as_u64().expect("env_frames") > 0, "{s}");
    assert_eq!(s["stop_reason"], "seconds", "{s}");
    assert!(
        !dir.join("train_dir").exists(),
        "--benchmark made an experiment folder"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Usage errors a user met only after the run had started, or not at all: each is one line and exit code 2 before any
/// work, and the train dir stays empty.
#[test]
fn usage_errors_are_found_before_any_work() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let train_dir = format!("--train_dir={}", tmp.path().display());
    let missing = tmp.path().join("missing/x.json");
    let summary = format!("--summary_json={}", missing.display());
    let folder = format!("--summary_json={}", tmp.path().display());
    let train = ["train", "--env=CartPole-v1", &train_dir];
    for (flags, wanted) in [
        (
            &["--train_for_env_steps=0"][..],
            "--train_for_env_steps must be at least 1",
        ),
        (
            &["--experiment=../escape"][..],
            "--experiment: invalid experiment name \"../escape\"",
        ),
        (
            &["--experiment="][..],
            "--experiment: invalid experiment name \"\"",
        ),
        (&["--learner_procs=2"][..], "add --mpi and start it under mpirun"),
        (
            &["--process_per_env=2"][..],
            "add --mpi and start it under mpirun",
        ),
        (&[summary.as_str()][..], "there is no folder"),
        (&[folder.as_str()][..], "is a folder, not a file"),
        // About 40 GB of trajectory slots, and a replay buffer of about 400 GB (it planned 438 GB of shared
        // memory, wrote the folder and a checkpoint, then failed with a message of the trajectory queue).
        (&["--batch_size=1000000000"][..], "GiB of shared memory"),
        (
            &["--algo=dqn", "--replay_buffer_size=10000000000"][..],
            "GiB of replay buffers for --replay_buffer_size",
        ),
    ] {
        rejects(&[&train[..], flags].concat(), wanted);
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("train dir")
            .flatten()
            .collect();
        assert!(left.is_empty(), "{flags:?} wrote {left:?}");
    }
    rejects(&[], "a command is required: train, enjoy, eval, export or top");
    rejects(&["train", "--rollout=8"], "--env is required");
    // `export --out` into a folder that does not exist: refused before the checkpoint is read (it was an
    // `IoError(Os { .. })` after).
    std::fs::create_dir_all(tmp.path().join("exp")).expect("experiment folder");
    std::fs::write(tmp.path().join("exp/config.json"), "{}").expect("config.json");
    let out = format!("--out={}", missing.with_extension("safetensors").display());
    let export = [
        "export",
        "--env=CartPole-v1",
        "--experiment=exp",
        &train_dir,
        &out,
    ];
    rejects(&export, "--out ");
    rejects(&export, "there is no folder");
}

/// A default run's terminal: one line saying what is trained and where it goes, progress
/// lines with the frames against the budget and the time left, and at the end the frames, time and return, the
/// folder and the commands that open the curves and play the policy (which works pasted into a new shell); no config
/// dump (`--verbose` prints it) and no
/// JSON (`--summary_json` writes it).
#[test]
fn a_default_run_says_what_it_trains_its_progress_and_what_to_run_next() {
    // The clone's `.venv` with TensorBoard (idempotent), which the end of a run names.
    let setup = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../rlf-experiment/tests/setup_tensorboard.sh"
    );
    assert!(Command::new("bash").arg(setup).status().unwrap().success());
    let dir = common::temp_dir("terminal");
    let train_dir = dir.path().display().to_string();
    let run = |extra: &[&str]| {
        let output = common::output(
            Command::new(common::BIN)
                .args([
                    "train",
                    "--env=CartPole-v1",
                    "--experiment=e",
                    "--train_for_env_steps=30000",
                ])
                .args(["--report_interval_sec=0.3", "--restart_behavior=overwrite"])
                .arg(format!("--train_dir={train_dir}"))
                .args(extra)
                // No `tensorboard` on PATH: the end names the clone's.
                .env("PATH", "/usr/bin:/bin"),
        );
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{stderr}");
        stderr
    };
    let stderr = run(&[]);
    let lines: Vec<&str> = stderr.lines().collect();
    let exp = format!("{train_dir}/e");
    assert_eq!(
        lines[0],
        format!(
            "[rlfactory] training CartPole-v1 with appo (budget: 30000 env frames), into {exp}; --verbose prints the \
             whole config"
        ),
        "{stderr}"
    );
    assert!(
        lines.iter().all(|l| l.starts_with("[rlfactory] ")),
        "every line is the program's:\n{stderr}"
    );
    assert!(
        !stderr.contains("lr_schedule") && !stderr.contains('{'),
        "no config dump, no JSON:\n{stderr}"
    );
    let progress: Vec<&&str> = lines.iter().filter(|l| l.contains("| fps ")).collect();
    assert!(
        progress
            .iter()
            .all(|l| l.contains(" of 30000 (") && l.contains("%, ETA ")),
        "{stderr}"
    );
    let tensorboard = std::fs::canonicalize(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../.venv/bin/tensorboard"
    ))
    .unwrap()
    .display()
    .to_string();
    let end = &lines[lines.len() - 4..];
    assert!(
        end[0].starts_with("[rlfactory] done: ")
            && end[0].contains(" env frames in ")
            && end[0].contains(" fps), mean return "),
        "{stderr}"
    );
    assert_eq!(
        end[1..],
        [
            format!("[rlfactory] saved in {exp}: config.json, checkpoints, TensorBoard scalars, the learning curve"),
            format!("[rlfactory] curves: {tensorboard} --logdir {exp}"),
            format!(
                "[rlfactory] watch the policy: {} enjoy --env CartPole-v1 --experiment e --train_dir {train_dir}",
                common::BIN
            ),
        ],
        "{stderr}"
    );
    assert!(lines.len() < 40, "{} lines:\n{stderr}", lines.len());
    // The commands to type next, pasted into a new shell: no LIBTORCH, no venv, no Python on PATH. TensorBoard (a
    // server that runs until stopped) is asked for its version.
    let curves = end[2].strip_prefix("[rlfactory] curves: ").unwrap();
    let pasted = common::output(
        Command::new("/bin/sh")
            .arg("-c")
            .arg(curves.replace(&format!(" --logdir {exp}"), " --version"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir.path()),
    );
    assert!(pasted.status.success(), "`{curves}` in a new shell: {pasted:?}");
    let watch = end[3].strip_prefix("[rlfactory] watch the policy: ").unwrap();
    let pasted = common::output(
        Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "{watch} --max_num_episodes 1 --save_video --video_frames 5"
            ))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir.path()),
    );
    let said = String::from_utf8_lossy(&pasted.stderr);
    assert!(pasted.status.success(), "`{watch}` in a new shell:\n{said}");
    assert!(
        dir.path().join("e/replay.mp4").is_file(),
        "no video, with ffmpeg found in the clone's venv:\n{said}"
    );
    let verbose = run(&["--verbose"]);
    assert!(
        verbose.starts_with("[rlfactory] training CartPole-v1 with:\n") && verbose.contains("lr_schedule = "),
        "{verbose}"
    );
}

/// `--with_wandb` needs an experiment folder (refused before the run), and the `wandb` package of the Python
/// environment: the repository's test venv has none, so the run stops at its start with one line saying how to get
/// it, and writes no checkpoint. (`scripts/test_package` logs a run offline where wandb is installed.)
#[test]
fn with_wandb_needs_an_experiment_folder_and_says_how_to_get_wandb() {
    rejects(
        &["train", "--env", "CartPole-v1", "--with_wandb", "--benchmark"],
        "--with_wandb needs an experiment folder",
    );
    let dir = tempfile::tempdir().unwrap();
    let train_dir = dir.path().to_str().unwrap();
    let (code, stderr) = run(&[
        "train",
        "--env",
        "CartPole-v1",
        "--with_wandb",
        "--train_dir",
        train_dir,
        "--train_for_env_steps",
        "10000",
    ]);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("cannot import wandb") && errors[0].contains("pip install wandb"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("default_experiment/checkpoint_p0").exists(),
        "nothing trained"
    );
}

/// The binaries moved to another folder (hard-linked there: the same files, at a path no build wrote into them), in a
/// new shell with no Python on PATH: they find the libtorch they were built against and train; with `LIBTORCH`
/// naming a folder that has no libtorch, the `rlfactory` command says so in one line, instead of the dynamic loader's
/// failure.
#[test]
fn moved_binaries_find_their_libtorch_or_say_in_one_line_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let built = std::path::Path::new(env!("CARGO_BIN_EXE_rlfactory"));
    for name in ["rlfactory", "rlfactory-core"] {
        let from = built.with_file_name(name);
        let to = dir.path().join(name);
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).unwrap();
        }
    }
    let moved = |libtorch: Option<&str>| {
        let mut cmd = Command::new(dir.path().join("rlfactory"));
        // No `python3` on PATH: no Python torch to find.
        cmd.env_clear()
            .env("PATH", dir.path())
            .current_dir(dir.path())
            .args([
                "train",
                "--env",
                "CartPole-v1",
                "--train_for_env_steps",
                "5000",
                "--save_experiment=false",
            ]);
        if let Some(l) = libtorch {
            cmd.env("LIBTORCH", l);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = moved(None);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("done: "), "{stderr}");
    let nowhere = dir.path().join("no-libtorch");
    let (code, stderr) = moved(Some(nowhere.to_str().unwrap()));
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!(
            "error: LIBTORCH={} has no lib/libtorch_cpu.so: point it at a libtorch 2.13 folder (or a torch 2.13 \
             package's folder, .../site-packages/torch)",
            nowhere.display()
        ),
    );
}

/// The book's page of flags is what `rlfactory config --markdown` generates from the command line `train` parses:
/// every flag of `train --help`, each once, in a table of its section.
#[test]
fn the_flags_page_is_what_the_program_generates() {
    let generated = common::output(Command::new(common::BIN).args(["config", "--markdown"]));
    assert!(generated.status.success(), "{}", common::text(&generated.stderr));
    let generated = common::text(&generated.stdout);
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/flags.md");
    let written = std::fs::read_to_string(&page).unwrap_or_default();
    assert!(
        written == generated,
        "docs/flags.md differs from what the program generates: write it again with \
         `./target/debug/rlfactory config --markdown > docs/flags.md`"
    );
    let help = common::output(Command::new(common::BIN).args(["train", "--help"]));
    let help = common::text(&help.stdout);
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|l| l.split([' ', '=', '[', '<']).next())
        .filter(|f| !["help"].contains(f))
        .collect();
    assert!(flags.len() > 100, "{help}");
    for flag in flags {
        let rows = generated
            .lines()
            .filter(|l| l.starts_with(&format!("| `--{flag}` |")))
            .count();
        assert_eq!(rows, 1, "--{flag} is in {rows} rows of the page");
    }
    assert!(generated.contains("\n## Environment and seeds\n"), "{generated}");
    let text = common::output(Command::new(common::BIN).arg("config"));
    assert!(text.status.success(), "{}", common::text(&text.stderr));
    let text = common::text(&text.stdout);
    assert!(
        text.starts_with("Settings files\n  --config <path>\n")
            && text.contains(
                "\nEnvironment and seeds\n  --env <text> [default: CartPole-v1]\n      Environment id: "
            ),
        "{text}"
    );
}
