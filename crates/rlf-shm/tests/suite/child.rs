//! Child processes of this test binary: it re-runs itself with a role (JSON in an environment variable named by the
//! module that spawns it) to act as one side of a multi-process test.

use libtest_mimic::Failed;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::process::{Child, Command, ExitStatus};
use std::time::Instant;

/// In a re-run with `var` set, plays the role it holds and exits: 0 on success, 3 (after saying why) on failure.
/// Returns at once when `var` is not set.
pub fn play_role<R: DeserializeOwned>(var: &str, run: fn(R) -> Result<(), String>) {
    let Ok(json) = std::env::var(var) else {
        return;
    };
    let code = match serde_json::from_str::<R>(&json)
        .map_err(|e| e.to_string())
        .and_then(run)
    {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("role failed: {e}");
            3
        }
    };
    std::process::exit(code);
}

/// Starts this binary again to play `role`, handed over in `var`.
pub fn spawn(var: &str, role: &impl Serialize) -> Result<Child, Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let json = serde_json::to_string(role).map_err(|e| e.to_string())?;
    Ok(Command::new(exe)
        .env(var, json)
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?)
}

/// Waits for a child until `deadline` (blocking in a helper thread); kills it and fails past it.
pub fn wait_deadline(mut child: Child, deadline: Instant, what: &str) -> Result<ExitStatus, Failed> {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(status) => Ok(status.map_err(|e| e.to_string())?),
        Err(_) => {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            Err(format!("{what} (pid {pid}) hung past its deadline").into())
        }
    }
}
