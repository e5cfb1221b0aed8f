//! The experiment folder of real `rlfactory` runs: TensorBoard scalars read back by TensorBoard's own
//! reader, checkpoints, resume after SIGINT (frame count and LR schedule continue), fallback from a
//! corrupt checkpoint, enjoy / eval / export, and bad inputs. No `/dev/shm` segment of a run
//! survives it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{assert_no_segments, run, spawn, summary, temp_dir, text, BIN};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn train_args<'a>(dir: &'a Path, extra: &[&'a str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--env=CartPole-v1",
        "--experiment=exp",
        "--report_interval_sec=0.2",
        "--save_best_after=0",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push(format!("--train_dir={}", dir.display()));
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

fn python() -> String {
    let out = Command::new("bash")
        .arg(format!("{REPO}/crates/rlfactory/tests/setup_python_readers.sh"))
        .output()
        .expect("setup python readers");
    assert!(out.status.success(), "setup: {}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

/// The sidecars of the regular checkpoints, oldest first.
fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    common::checkpoint_sidecars(dir)
}

fn sidecar(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("sidecar")).expect("sidecar parses")
}

/// Every scalar of an event file as TensorBoard's own reader sees it: `(tag, step, value)`.
fn tensorboard_scalars(python: &str, events: &Path) -> Vec<(String, i64, f64)> {
    let script = "import sys, json\n\
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader\n\
        from tensorboard.util import tensor_util\n\
        out = []\n\
        for ev in EventFileLoader(sys.argv[1]).Load():\n\
        \x20   for v in ev.summary.value:\n\
        \x20       x = v.simple_value if v.HasField('simple_value') else float(tensor_util.make_ndarray(v.tensor))\n\
        \x20       out.append([v.tag, ev.step, x])\n\
        print(json.dumps(out))\n";
    let read = Command::new(python)
        .args(["-c", script])
        .arg(events)
        .output()
        .expect("python");
    assert!(read.status.success(), "{}", text(&read.stderr));
    serde_json::from_slice(&read.stdout).expect("json")
}

/// The event files of the experiment `exp` in `dir`.
fn event_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("exp/.summary/0"))
        .expect("summary dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// Connect Four with the one-ply lookahead (`--lookahead_coeff`): the learner trains with its loss, which the
/// run's scalars record as `train/lookahead_loss` along the run, a cross-entropy over the 7 columns (positive and
/// finite: the targets' entropy plus the policy's divergence from them).
#[test]
fn a_run_looking_ahead_records_its_lookahead_loss() {
    let python = python();
    let tmp = temp_dir("lookahead");
    let dir = tmp.path();
    let train_dir = format!("--train_dir={}", dir.display());
    let out = run(&[
        "train",
        "--env=connect_four",
        "--experiment=exp",
        &train_dir,
        "--lookahead_coeff=1",
        "--train_for_env_steps=20000",
        "--serial_mode",
        "--report_interval_sec=0",
    ]);
    assert!(out.status.success(), "train: {}", text(&out.stderr));
    let losses: Vec<f64> = event_files(dir)
        .iter()
        .flat_map(|f| tensorboard_scalars(&python, f))
        .filter(|(tag, _, _)| tag == "train/lookahead_loss")
        .map(|(_, _, v)| v)
        .collect();
    assert!(losses.len() >= 2, "{} lookahead losses", losses.len());
    assert!(
        losses.iter().all(|&v| v.is_finite() && v > 0.0 && v < 10.0),
        "{losses:?}"
    );
}

/// A run of 20K frames (about a tenth of a second of training here; it was a run of 0.5 s, whose content depended
/// on the machine's load) writes the return and the losses from its first episodes on, and its learning curve.
#[test]
fn a_short_run_records_its_learning_from_the_first_episode() {
    let python = python();
    let tmp = temp_dir("short");
    let dir = tmp.path();
    let summary_path = dir.join("summary.json");
    // No progress line: scalars, the curve and the summary do not depend on it.
    let args = train_args(
        dir,
        &[
            "--train_for_env_steps=20480",
            "--report_interval_sec=0",
            &format!("--summary_json={}", summary_path.display()),
        ],
    );
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "train: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        !stderr.contains("| fps "),
        "a progress line with --report_interval_sec 0: {stderr}"
    );
    let frames = summary(&summary_path)["env_frames"].as_u64().expect("frames");
    let events = event_files(dir);
    assert_eq!(events.len(), 1, "{events:?}");
    let theirs = tensorboard_scalars(&python, &events[0]);
    let steps = |tag: &str| -> Vec<i64> { theirs.iter().filter(|(t, _, _)| t == tag).map(|x| x.1).collect() };
    let returns = steps("reward/reward");
    let losses = steps("train/policy_loss");
    assert!(
        returns.len() >= 3 && losses.len() >= 3,
        "returns at {returns:?}, losses at {losses:?}"
    );
    // The first episodes end within the first few rollout reports (2,048 frames each).
    assert!(returns[0] <= 8_192, "first return at frame {}", returns[0]);
    assert!(returns.windows(2).all(|w| w[0] < w[1]), "{returns:?}");
    // The last values are those of the end of the run.
    assert_eq!(
        returns.last().copied(),
        Some(frames as i64),
        "{returns:?} vs {frames} frames"
    );
    // The curve is drawn from the same `reward/reward` points (`ExperimentRun::write_scalars`): not empty.
    let png = std::fs::read(dir.join("exp/learning_curve_p0.png")).expect("learning curve");
    assert_eq!(&png[1..4], b"PNG");
    let empty = dir.join("empty.png");
    rlf_experiment::plot_curve(&empty, &[], "CartPole-v1").expect("empty plot");
    let empty = std::fs::read(&empty).expect("empty plot");
    assert_ne!(png, empty, "the learning curve is an empty plot");
}

#[test]
fn a_trained_experiment_has_scalars_checkpoints_and_runs_enjoy_eval_and_export() {
    let python = python();
    let tmp = temp_dir("trained");
    let dir = tmp.path();
    let summary_path = dir.join("summary.json");
    let args = train_args(
        dir,
        &[
            // Long enough for the 0.5 s checkpoint timer to fire before the final save, so that a previous
            // checkpoint exists for the corrupt-newest fallback below.
            "--train_for_env_steps=10000000",
            "--train_for_seconds=2",
            "--save_every_sec=0.5",
            &format!("--summary_json={}", summary_path.display()),
        ],
    );
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "train: {}", text(&out.stderr));
    let frames = summary(&summary_path)["env_frames"].as_u64().expect("frames");
    let exp = dir.join("exp");
    for file in ["config.json", "log.txt", "learning_curve_p0.png"] {
        assert!(exp.join(file).is_file(), "{file} missing");
    }
    let log = std::fs::read_to_string(exp.join("log.txt")).expect("log");
    assert!(log.contains("| fps ") && log.contains("saved "), "{log}");

    // TensorBoard's reader sees our tags at our steps with our values.
    let events = event_files(dir);
    assert_eq!(events.len(), 1, "{events:?}");
    let theirs = tensorboard_scalars(&python, &events[0]);
    let ours = rlf_experiment::read_scalars(&events[0]).expect("our reader");
    assert_eq!(theirs.len(), ours.len());
    for ((tag, step, value), (t, s, v)) in theirs.iter().zip(&ours) {
        assert_eq!((tag, step), (t, s));
        assert_eq!(*value as f32, *v, "{tag} at {step}");
    }
    for tag in [
        "train/policy_loss",
        "train/value_loss",
        "train/entropy",
        "train/kl_divergence",
        "train/grad_norm",
        "train/version_diff_min",
        "train/version_diff_avg",
        "train/version_diff_max",
        "train/lr",
        "perf/_fps",
        "reward/reward",
        "len/len",
    ] {
        assert!(theirs.iter().any(|(t, _, _)| t == tag), "no {tag}");
    }
    assert!(theirs.iter().all(|(_, s, _)| (0..=frames as i64).contains(s)));
    let rewards: Vec<f64> = theirs
        .iter()
        .filter(|(t, _, _)| t == "reward/reward")
        .map(|x| x.2)
        .collect();
    assert!(rewards.iter().all(|r| (1.0..=500.0).contains(r)), "{rewards:?}");

    // Checkpoints: the last one is saved at stop with the final counts.
    let ckpts = checkpoints(dir);
    assert_eq!(ckpts.len(), 2, "kept checkpoints: {ckpts:?}");
    let last = sidecar(ckpts.last().expect("a checkpoint"));
    assert_eq!(last["env_steps"].as_u64(), Some(frames));
    assert_eq!(last["extra"]["adam_moments_saved"], serde_json::json!(true));

    // enjoy (latest and best), eval with a CSV.
    let source = [
        "--env=CartPole-v1".to_owned(),
        "--experiment=exp".to_owned(),
        format!("--train_dir={}", dir.display()),
    ];
    let with = |cmd: &str, extra: &[&str]| -> Output {
        let mut a: Vec<&str> = vec![cmd];
        a.extend(source.iter().map(String::as_str));
        a.extend(extra);
        run(&a)
    };
    for kind in ["latest", "best"] {
        let out = with(
            "enjoy",
            &[
                "--max_num_episodes=3",
                "--eval_deterministic",
                &format!("--load_checkpoint_kind={kind}"),
            ],
        );
        assert!(out.status.success(), "enjoy: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with("episode ")).count(),
            3,
            "{stdout}"
        );
        assert!(stdout.contains("mean return"), "{stdout}");
    }
    let csv = dir.join("eval.csv");
    let out = with(
        "eval",
        &[
            "--max_num_episodes=6",
            "--num_envs=3",
            &format!("--csv={}", csv.display()),
        ],
    );
    assert!(out.status.success(), "eval: {}", text(&out.stderr));
    let rows = std::fs::read_to_string(&csv).expect("csv");
    let rows: Vec<&str> = rows.lines().collect();
    assert_eq!(rows[0], "episode,env,return,length");
    assert_eq!(rows.len(), 7);
    for row in &rows[1..] {
        let cols: Vec<&str> = row.split(',').collect();
        let (ret, len): (f64, f64) = (cols[2].parse().expect("return"), cols[3].parse().expect("length"));
        assert_eq!(ret, len, "CartPole's return is its length: {row}");
    }

    // export: Python's safetensors reads the same names, shapes and values as the checkpoint.
    let exported = dir.join("policy.safetensors");
    let out = with("export", &[&format!("--out={}", exported.display())]);
    assert!(out.status.success(), "export: {}", text(&out.stderr));
    let script = "import sys, json\n\
        from safetensors.numpy import load_file\n\
        print(json.dumps({k: [list(v.shape), str(v.dtype), v.ravel().tolist()] for k, v in load_file(sys.argv[1]).items()}))\n";
    let read = Command::new(&python)
        .args(["-c", script])
        .arg(&exported)
        .output()
        .expect("python");
    assert!(read.status.success(), "{}", text(&read.stderr));
    let theirs: std::collections::BTreeMap<String, (Vec<usize>, String, Vec<f32>)> =
        serde_json::from_slice(&read.stdout).expect("json");
    // The checkpoint also holds Adam's two moments of every trainable tensor; the export does not.
    let ckpt = rlf_experiment::load_checkpoint(ckpts.last().expect("a checkpoint")).expect("load");
    let (moments, policy): (Vec<&String>, Vec<&String>) =
        ckpt.tensors.keys().partition(|k| k.starts_with("adam."));
    assert_eq!(theirs.keys().collect::<Vec<_>>(), policy);
    for name in theirs
        .keys()
        .filter(|k| k.contains("weight") || k.contains("bias"))
    {
        for moment in ["exp_avg", "exp_avg_sq"] {
            let key = format!("adam.{moment}.{name}");
            assert!(moments.contains(&&key), "{key} in {moments:?}");
            assert_eq!(ckpt.tensors[&key].shape, ckpt.tensors[name].shape, "{key}");
        }
    }
    for (name, (shape, dtype, values)) in &theirs {
        let t = &ckpt.tensors[name];
        assert_eq!((shape, dtype.as_str()), (&t.shape, "float32"), "{name}");
        assert_eq!(Some(values.as_slice()), t.as_f32(), "{name}");
    }
    assert_eq!(theirs["actor_encoder.fc0.weight"].0, vec![64, 4]);
    // Its metadata says where each part of the observation lies (what `load_policy` needs for images and Dicts).
    let script = "import sys\n\
        from safetensors import safe_open\n\
        print(safe_open(sys.argv[1], 'numpy').metadata()['observation_layout'])\n";
    let read = Command::new(python)
        .args(["-c", script])
        .arg(&exported)
        .output()
        .expect("python");
    assert!(read.status.success(), "{}", text(&read.stderr));
    let layout: serde_json::Value = serde_json::from_slice(&read.stdout).expect("json");
    assert_eq!(
        layout,
        serde_json::json!([{"name": "obs", "offset": 0, "length": 4, "shape": [4]}])
    );

    // A corrupt newest checkpoint: resuming names it and continues from the previous one.
    let newest = ckpts.last().expect("a checkpoint").with_extension("safetensors");
    let mut bytes = std::fs::read(&newest).expect("weights");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&newest, bytes).expect("corrupt");
    let args = train_args(dir, &["--train_for_env_steps=20000", "--train_for_seconds=0.5"]);
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "resume: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let skipped = format!("skipped a broken checkpoint: {}", newest.display());
    assert!(stderr.contains(&skipped), "{stderr}");
    assert!(
        stderr.contains(&format!("resuming from {}", ckpts[0].display())),
        "{stderr}"
    );

    // Every regular checkpoint corrupt: --load_checkpoint_kind=latest falls back to the best one.
    for sidecar in checkpoints(dir) {
        // Truncated (flipping a byte again would repair the one corrupted above).
        let weights = sidecar.with_extension("safetensors");
        let bytes = std::fs::read(&weights).expect("weights");
        std::fs::write(&weights, &bytes[..bytes.len() / 2]).expect("corrupt");
    }
    let out = with(
        "enjoy",
        &["--max_num_episodes=1", "--load_checkpoint_kind=latest"],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "enjoy: {stderr}");
    assert!(stderr.contains("skipped a broken checkpoint"), "{stderr}");
    assert!(stderr.contains("loaded ") && stderr.contains("best_"), "{stderr}");
}

fn lr_scalars(dir: &Path) -> Vec<(PathBuf, Vec<(i64, f32)>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("exp/.summary/0"))
        .expect("summary dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let lr = rlf_experiment::read_scalars(&f)
                .expect("scalars")
                .into_iter()
                .filter(|(t, _, _)| t == "train/lr")
                .map(|(_, s, v)| (s, v))
                .collect();
            (f, lr)
        })
        .collect()
}

#[test]
fn sigint_saves_a_checkpoint_and_the_resumed_run_continues_frames_and_lr_schedule() {
    let tmp = temp_dir("sigint");
    let dir = tmp.path();
    let total = 400_000;
    let first = dir.join("first.json");
    let common = [
        format!("--train_for_env_steps={total}"),
        "--lr_schedule=linear_decay".to_owned(),
        "--learning_rate=0.001".to_owned(),
        "--save_every_sec=100".to_owned(),
    ];
    let mut args = train_args(dir, &[]);
    args.extend(common.iter().cloned());
    args.push(format!("--summary_json={}", first.display()));
    let common::Watched { pid, lines, exited } = spawn(Command::new(BIN).args(&args));
    // Interrupt once training is under way (a progress line after the first policy update).
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a progress line");
        if line.contains("| fps ") && !line.contains("version 0") {
            break;
        }
    }
    let kill = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = exited
        .recv_timeout(Duration::from_secs(30))
        .expect("exits after SIGINT");
    assert_eq!(status.code(), Some(130), "exit code 128 + SIGINT");
    assert_no_segments(pid);
    let stopped = summary(&first);
    assert_eq!(stopped["stop_reason"], "interrupted");
    assert_eq!(stopped["signal"], 2);
    let simulated = stopped["env_frames"].as_u64().expect("frames");
    let ckpts = checkpoints(dir);
    assert_eq!(ckpts.len(), 1, "the checkpoint saved at SIGINT: {ckpts:?}");
    let saved = sidecar(&ckpts[0]);
    // On a signal every loop stops at once: the learner saves the counts of the runner's last progress message,
    // and rollouts reported after it (simulated, never trained on) are not in the checkpoint.
    let frames = saved["env_steps"].as_u64().expect("checkpoint frames");
    let version = saved["policy_version"].as_u64().expect("checkpoint version");
    assert!(
        frames > 0 && frames <= simulated,
        "checkpoint {frames} frames, run {simulated}"
    );
    assert!(version > 0 && version <= stopped["policy_version"].as_u64().expect("version"));
    assert_eq!(saved["extra"]["adam_moments_saved"], true, "{saved}");
    let saved_lr = saved["extra"]["training"]["lr"].as_f64().expect("lr");
    let trained = saved["extra"]["training"]["frames_trained"]
        .as_u64()
        .expect("frames trained");
    assert!(saved_lr < 0.001 && trained > 0 && trained <= simulated);

    // Resume to the end of the schedule: counts and the schedule continue.
    let second = dir.join("second.json");
    let mut args = train_args(dir, &[]);
    args.extend(common.iter().cloned());
    args.push(format!("--summary_json={}", second.display()));
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "resume: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "resuming from {} (env frames {frames}, policy version {version}",
            ckpts[0].display()
        )),
        "{stderr}"
    );
    let resumed = summary(&second);
    assert_eq!(resumed["stop_reason"], "env_steps");
    assert!(resumed["env_frames"].as_u64().expect("frames") >= total);
    assert!(resumed["policy_version"].as_u64().expect("version") > version);
    let runs = lr_scalars(dir);
    assert_eq!(runs.len(), 2, "one event file per start");
    let after = &runs[1].1;
    let (step, lr) = *after.first().expect("an lr scalar after resuming");
    assert!(step as u64 > frames);
    // Linear decay continues from the saved position, not from the base rate.
    assert!(
        f64::from(lr) <= saved_lr + 1e-9,
        "lr {lr} after resuming, {saved_lr} saved"
    );
    let expected = 0.001 * (1.0 - trained as f64 / total as f64);
    assert!((saved_lr - expected).abs() < 1e-4, "{saved_lr} vs {expected}");
}

#[test]
fn bad_enjoy_inputs_are_one_clear_line_and_exit_code_2() {
    let tmp = temp_dir("bad");
    let train_dir = format!("--train_dir={}", tmp.path().display());
    for (args, needle) in [
        (
            vec!["enjoy", "--env=CartPole-v1", "--experiment=missing", &train_dir],
            "no experiment at",
        ),
        (
            vec!["eval", "--env=CartPole-v1", "--experiment=missing", &train_dir],
            "no experiment at",
        ),
        (
            vec![
                "enjoy",
                "--env=CartPole-v1",
                "--load_checkpoint_kind=newest",
                &train_dir,
            ],
            "--load_checkpoint_kind",
        ),
    ] {
        let out = run(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// One run per experiment: a second `train` on a folder in use exits 1 at once with one line naming the process that
/// holds it and changes nothing there, and the first run ends with all its checkpoints and its learning curve (the
/// two used to rotate away each other's checkpoints).
#[test]
fn a_second_run_on_a_running_experiment_is_refused_and_the_first_keeps_its_files() {
    let tmp = temp_dir("lock");
    let dir = tmp.path();
    let mut args = train_args(dir, &["--train_for_seconds=8", "--save_every_sec=1"]);
    args.push(format!("--summary_json={}", dir.join("first.json").display()));
    let first = spawn(Command::new(BIN).args(&args));
    loop {
        let line = first
            .lines
            .recv_timeout(Duration::from_secs(60))
            .expect("a progress line");
        if line.contains("| version ") {
            break;
        }
    }
    let config = std::fs::read(dir.join("exp/config.json")).expect("config.json");
    let second = run(&train_args(dir, &["--train_for_seconds=2", "--seed=7"])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    let log = text(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(
        errors[0].contains(&format!("is in use by process {}", first.pid)),
        "{}",
        errors[0]
    );
    assert!(!log.contains("panicked"), "{log}");
    assert_eq!(
        std::fs::read(dir.join("exp/config.json")).expect("config.json"),
        config
    );
    let status = first
        .exited
        .recv_timeout(Duration::from_secs(60))
        .expect("the first run ends");
    assert!(status.success(), "{status}");
    let done = summary(&dir.join("first.json"));
    assert_eq!(done["stop_reason"], "seconds", "{done}");
    let ckpts = checkpoints(dir);
    assert_eq!(
        ckpts.len(),
        2,
        "the first run's newest two checkpoints: {ckpts:?}"
    );
    let last = sidecar(ckpts.last().expect("a checkpoint"));
    assert_eq!(last["policy_version"], done["policy_version"], "{last}");
    assert!(dir.join("exp/learning_curve_p0.png").exists());
}

/// A run killed with SIGKILL leaves its lock to the kernel, which releases it with the process: the next run on the
/// experiment starts and resumes from the killed run's checkpoint.
#[test]
fn a_run_after_a_sigkilled_one_starts() {
    let tmp = temp_dir("lock-kill");
    let dir = tmp.path();
    let first =
        spawn(Command::new(BIN).args(train_args(dir, &["--train_for_seconds=60", "--save_every_sec=1"])));
    let mut progress = 0;
    while progress < 8 {
        let line = first
            .lines
            .recv_timeout(Duration::from_secs(60))
            .expect("a progress line");
        progress += usize::from(line.contains("| version "));
    }
    let kill = Command::new("kill")
        .args(["-KILL", &first.pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    first
        .exited
        .recv_timeout(Duration::from_secs(10))
        .expect("the killed run is gone");
    let second = run(&train_args(dir, &["--train_for_seconds=1"])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    let log = text(&second.stderr);
    assert!(second.status.success(), "{log}");
    assert!(log.contains("resuming from "), "{log}");
}

/// Every file under `dir` (recursively) with its bytes.
fn files_of(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).expect("read file"));
            }
        }
    }
    files
}

/// A resume whose checkpoint does not fit the network it would build (other layers, another algorithm) fails with
/// one line before it writes anything: every file of the experiment is byte-identical afterwards (`config.json` was
/// overwritten, and `enjoy`, `eval` and `export` failed until it was fixed by hand), and `eval` still plays it.
#[test]
fn a_resume_that_cannot_load_its_checkpoint_changes_no_file_of_the_experiment() {
    let tmp = temp_dir("failed-resume");
    let dir = tmp.path();
    let args = |extra: &[&str]| {
        let mut args = train_args(dir, &["--train_for_env_steps=20000"]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    let first = run(&args(&[]).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(first.status.success(), "{}", text(&first.stderr));
    let before = files_of(&dir.join("exp"));
    for flags in [
        &["--encoder_mlp_layers=32,32", "--train_for_env_steps=40000"][..],
        &["--algo=dqn", "--train_for_env_steps=40000"][..],
    ] {
        let out = run(&args(flags).iter().map(String::as_str).collect::<Vec<_>>());
        let log = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {log}");
        let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(errors.len(), 1, "{flags:?}: {log}");
        assert!(errors[0].contains("cannot resume from "), "{}", errors[0]);
        assert!(
            files_of(&dir.join("exp")) == before,
            "{flags:?} changed the experiment's files"
        );
    }
    let eval = run(&[
        "eval",
        "--env=CartPole-v1",
        "--experiment=exp",
        &format!("--train_dir={}", dir.display()),
        "--max_num_episodes=2",
    ]);
    assert!(eval.status.success(), "{}", text(&eval.stderr));
}
