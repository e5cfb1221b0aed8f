//! A real crash test of the checkpoint store: the test binary re-runs itself as a writer process (role in
//! `RLF_CKPT_WRITER_DIR`) that resumes from the newest intact checkpoint and then saves large checkpoints in a loop,
//! printing `saved <step>` after each. The parent SIGKILLs it at a random moment within a save, many rounds in a row,
//! and after each kill checks that:
//!
//! - the last checkpoint the writer reported saved is intact, loadable and holds exactly what was saved;
//! - `load_latest` returns the newest intact checkpoint (that one, or the next if its save finished unreported);
//! - the next writer resumes right after it.
//!
//! It also counts the rounds where the kill cut a save short (a temporary or orphan file was left), so the test shows
//! that the kills landed mid-write, and at the end checks every milestone kept.

use libtest_mimic::{Failed, Trial};
use rlf_experiment::{
    load_checkpoint, Checkpoint, CheckpointConfig, CheckpointMeta, CheckpointStore, Tensor,
};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ROLE_VAR: &str = "RLF_CKPT_WRITER_DIR";
/// f32 values in the large tensor (16 MiB).
const BIG: usize = 4 << 20;
const ROUNDS: usize = 60;
const TIMEOUT: Duration = Duration::from_secs(60);

fn config() -> CheckpointConfig {
    CheckpointConfig {
        keep_checkpoints: 2,
        milestone_every_env_steps: Some(10_000),
    }
}

/// The checkpoint of `step`: every value derives from the step, so a torn or stale file cannot pass for it.
fn checkpoint(step: u64) -> Checkpoint {
    let mut ckpt = Checkpoint {
        meta: CheckpointMeta {
            train_step: step,
            env_steps: step * 1000,
            policy_version: step,
            metric: Some(step as f64 * 0.5),
            extra: serde_json::json!({ "optimizer_step": step, "obs_norm": { "count": step * 1000 } }),
        },
        ..Default::default()
    };
    let big = (0..BIG).map(|i| (i as u64 ^ step) as f32).collect();
    ckpt.tensors
        .insert("big".into(), Tensor::f32(&[BIG / 1024, 1024], big));
    ckpt.tensors.insert(
        "steps".into(),
        Tensor::i64(&[2], vec![step as i64, -(step as i64)]),
    );
    ckpt.tensors
        .insert("tag".into(), Tensor::u8(&[3], vec![step as u8, 1, 2]));
    ckpt
}

fn check(ckpt: &Checkpoint, step: u64, what: &str) -> Result<(), Failed> {
    if *ckpt != checkpoint(step) {
        return Err(format!("{what}: checkpoint of step {step} does not hold what was saved").into());
    }
    Ok(())
}

/// The writer process: resume, then save for ever.
fn writer(dir: &Path) -> Result<(), String> {
    let mut store = CheckpointStore::open(dir, config()).map_err(|e| e.to_string())?;
    let start = match store.load_latest().map_err(|e| e.to_string())? {
        Some(l) => l.checkpoint.meta.train_step + 1,
        None => 1,
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "resumed {start}")
        .and_then(|_| out.flush())
        .map_err(|e| e.to_string())?;
    for step in start.. {
        store.save(&checkpoint(step)).map_err(|e| e.to_string())?;
        writeln!(out, "saved {step}")
            .and_then(|_| out.flush())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Numbered lines `<word> <n>` the child printed, as they come.
fn spawn_line_reader(stdout: std::process::ChildStdout) -> mpsc::Receiver<(String, u64)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let parsed = line
                .split_once(' ')
                .and_then(|(w, n)| Some((w.to_string(), n.parse().ok()?)));
            if let Some(msg) = parsed {
                if tx.send(msg).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

fn interrupted_leftovers(dir: &Path) -> Result<usize, Failed> {
    let mut n = 0;
    for d in [dir.to_path_buf(), dir.join("milestones")] {
        let Ok(read) = std::fs::read_dir(&d) else { continue };
        for e in read {
            let name = e
                .map_err(|e| e.to_string())?
                .file_name()
                .to_string_lossy()
                .into_owned();
            if name.starts_with(".tmp.") {
                n += 1;
            }
        }
    }
    Ok(n)
}

fn crash_rounds(rounds: usize, seed: u64) -> Result<(), Failed> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = tmp.path().join("checkpoint_p0");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut newest: Option<u64> = None;
    let mut save_time = Duration::from_millis(50);
    let (mut cut_short, mut reported_skips) = (0, 0);

    for round in 0..rounds {
        let mut child = Command::new(&exe)
            .env(ROLE_VAR, &dir)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn writer: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let lines = spawn_line_reader(stdout);
        let (word, start) = lines
            .recv_timeout(TIMEOUT)
            .map_err(|e| format!("round {round}: no resume line: {e}"))?;
        let expected_start = newest.map_or(1, |n| n + 1);
        if (word.as_str(), start) != ("resumed", expected_start) {
            return Err(format!(
                "round {round}: writer said `{word} {start}`, expected resume at {expected_start}"
            )
            .into());
        }
        // Let one save complete (so there is a previous checkpoint), then kill somewhere within the next ones.
        let t0 = Instant::now();
        let first = lines
            .recv_timeout(TIMEOUT)
            .map_err(|e| format!("round {round}: no save: {e}"))?;
        save_time = (save_time + t0.elapsed()) / 2;
        std::thread::sleep(save_time.mul_f64(rng.f64() * 1.5));
        child.kill().map_err(|e| format!("kill: {e}"))?;
        let (done_tx, done_rx) = mpsc::channel::<std::io::Result<ExitStatus>>();
        std::thread::spawn(move || {
            let _ = done_tx.send(child.wait());
        });
        let status = done_rx
            .recv_timeout(TIMEOUT)
            .map_err(|_| format!("round {round}: writer did not die"))?
            .map_err(|e| e.to_string())?;
        if status.success() {
            return Err(format!("round {round}: writer exited by itself ({status})").into());
        }
        let mut last_reported = first.1;
        while let Ok((word, step)) = lines.recv_timeout(TIMEOUT) {
            if word != "saved" {
                return Err(format!("round {round}: unexpected `{word} {step}`").into());
            }
            last_reported = step;
        }

        let leftovers = interrupted_leftovers(&dir)?;
        // The last reported checkpoint: intact and exactly what was saved.
        let reported = dir.join(format!(
            "checkpoint_{last_reported:09}_{}.json",
            last_reported * 1000
        ));
        let ckpt = load_checkpoint(&reported)
            .map_err(|e| format!("round {round}: previous checkpoint lost: {e}"))?;
        check(&ckpt, last_reported, "last reported")?;
        // load_latest: that one, or the next if its save completed before the kill but was not yet reported.
        let store = CheckpointStore::open(&dir, config()).map_err(|e| e.to_string())?;
        let loaded = store
            .load_latest()
            .map_err(|e| format!("round {round}: {e}"))?
            .ok_or_else(|| format!("round {round}: no checkpoint"))?;
        let step = loaded.checkpoint.meta.train_step;
        if step != last_reported && step != last_reported + 1 {
            return Err(format!("round {round}: latest is {step}, last reported {last_reported}").into());
        }
        check(&loaded.checkpoint, step, "latest")?;
        reported_skips += usize::from(!loaded.skipped.is_empty());
        cut_short += usize::from(leftovers > 0 || !loaded.skipped.is_empty());
        for s in &loaded.skipped {
            if !s
                .path
                .to_string_lossy()
                .contains(&format!("checkpoint_{:09}_", step + 1))
            {
                return Err(format!("round {round}: skipped an unexpected checkpoint: {s}").into());
            }
        }
        newest = Some(step);
    }

    let milestones = dir.join("milestones");
    let mut intact = 0;
    for e in std::fs::read_dir(&milestones).map_err(|e| e.to_string())? {
        let path = e.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "json") {
            let ckpt = load_checkpoint(&path).map_err(|e| format!("milestone: {e}"))?;
            check(&ckpt, ckpt.meta.train_step, "milestone")?;
            intact += 1;
        }
    }
    eprintln!(
        "{rounds} kills (seed {seed:#x}): {cut_short} left a save cut short, {reported_skips} made load_latest skip a \
         newer checkpoint; {intact} milestones intact; newest step {newest:?}; one save ≈ {save_time:?}"
    );
    if cut_short < rounds / 10 {
        return Err(format!("only {cut_short} of {rounds} kills landed during a write").into());
    }
    Ok(())
}

/// In a re-run as the writer process (`RLF_CKPT_WRITER_DIR` set), saves until killed, or exits 3 after saying why
/// it failed. Returns at once in the test process.
pub fn play_writer() {
    if let Some(dir) = std::env::var_os(ROLE_VAR) {
        let code = match writer(Path::new(&dir)) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("writer failed: {e}");
                3
            }
        };
        std::process::exit(code);
    }
}

/// This module's test, with the seed in `RLF_CKPT_SEED` or a random one.
pub fn trials() -> Vec<Trial> {
    let seed = std::env::var("RLF_CKPT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    vec![Trial::test(
        "checkpoint_crash::sigkill_during_checkpoint_writes_60_rounds",
        move || crash_rounds(ROUNDS, seed),
    )]
}
