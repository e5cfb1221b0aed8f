//! The `rlfactory` binary: `rlfactory train --env <id> [flags]`, and `enjoy`, `eval`, `export` of a
//! trained experiment (see `rlfactory::enjoy`).

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use rlfactory::config::{parse_invocation, CliError, Invocation};

/// clap's error as one line: its message without the usage and tips.
fn one_line(text: &str) -> String {
    let parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:"))
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    parts.join(" ")
}

fn main() -> ExitCode {
    rlf_shm::process::keep_freed_memory();
    if let Some(code) = rlf_signal::child_entry(rlfactory::runner::child_build) {
        return code;
    }
    // Timings (`seconds_to_reward`, `wall_seconds`) count from the kernel's start of the process.
    let now = Instant::now();
    let process_start = rlf_shm::process::age()
        .and_then(|age| now.checked_sub(age))
        .unwrap_or(now);
    let args: Vec<String> = std::env::args().collect();
    let invocation = match parse_invocation(&args) {
        Ok(i) => i,
        Err(CliError::Clap(e)) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(CliError::Clap(e)) => {
            eprintln!("{}", one_line(&e.to_string()));
            return ExitCode::from(2);
        }
        Err(CliError::Invalid(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(invocation, process_start) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(signal)) => ExitCode::from(128u8.saturating_add(u8::try_from(signal).unwrap_or(0))),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command; returns the signal that interrupted a training run, if one did (the exit
/// code is then 128 + signal, after the last checkpoint was saved).
fn run(invocation: Invocation, process_start: Instant) -> anyhow::Result<Option<i32>> {
    let cfg = match invocation {
        Invocation::Train(cfg) => cfg,
        Invocation::Enjoy(args) => return rlfactory::enjoy::enjoy(&args).map(|_| None).map_err(Into::into),
        Invocation::Eval(args) => return rlfactory::enjoy::eval(&args).map(|_| None).map_err(Into::into),
        Invocation::Export(args) => {
            return rlfactory::enjoy::export(&args).map(|()| None).map_err(Into::into)
        }
    };
    eprintln!("[rlfactory] training {} with:\n{}", cfg.env.env, cfg.to_toml()?);
    let summary = rlfactory::runner::train(&cfg, process_start)?;
    let json = serde_json::to_string_pretty(&summary)?;
    eprintln!("[rlfactory] done: {json}");
    if cfg.run.benchmark {
        eprintln!(
            "[rlfactory] benchmark: steady-state fps {:.0} ({} env frames, overall fps {:.0})",
            summary.fps, summary.env_frames, summary.fps_overall
        );
    }
    if let Some(path) = &cfg.run.summary_json {
        std::fs::write(path, &json).with_context(|| format!("writing the summary to {}", path.display()))?;
    }
    Ok(summary.signal)
}
