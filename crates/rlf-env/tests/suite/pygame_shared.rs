//! pygame's state is one per process, and PettingZoo's MPE envs call `pygame.quit()` in `close`:
//! with several envs in one process (a worker's vector, tests on threads), the first to close used
//! to free the fonts and surfaces of the others, and the process aborted later in `malloc`. The
//! bridge lets pygame quit only when the last env closes.
//!
//! The test checks pygame's state in its process, so no other test's envs may be open there: it
//! re-runs the test binary to run alone in a process of its own (`RLF_PYGAME_ALONE` set), and
//! passes when that process passes.

use pyo3::prelude::*;
use rlf_env::pz::PettingZooEnv;
use rlf_env::{parse_kwargs, ActionBatch, MultiAgentEnv, VecBuffers};
use std::process::Command;

const SIMPLE_SPREAD: &str = "pz:pettingzoo.mpe.simple_spread_v3";
/// Set in the process that runs the test alone.
const ALONE_VAR: &str = "RLF_PYGAME_ALONE";

fn spread() -> PettingZooEnv {
    let kwargs = parse_kwargs("N=3, max_cycles=25, continuous_actions=False").unwrap();
    PettingZooEnv::from_id(SIMPLE_SPREAD, &kwargs).unwrap()
}

/// Whether pygame and its font module are initialised.
fn pygame_up() -> (bool, bool) {
    Python::attach(|py| {
        let pygame = py.import("pygame")?;
        let freetype = py.import("pygame.freetype")?;
        Ok::<_, PyErr>((
            pygame.call_method0("get_init")?.extract()?,
            freetype.call_method0("get_init")?.extract()?,
        ))
    })
    .unwrap()
}

/// Runs test `name` of this binary alone in a new process, and fails unless it ran there and passed.
fn run_alone(name: &str) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(&exe)
        .args(["--exact", name, "--test-threads=1"])
        .env(ALONE_VAR, "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} alone in a process ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn closing_one_mpe_env_leaves_pygame_to_the_others_and_the_last_one_quits_it() {
    if std::env::var_os(ALONE_VAR).is_none() {
        run_alone("pygame_shared::closing_one_mpe_env_leaves_pygame_to_the_others_and_the_last_one_quits_it");
        return;
    }
    let first = spread();
    let mut second = spread();
    assert_eq!(
        pygame_up(),
        (true, true),
        "MPE envs initialise pygame and its fonts"
    );
    drop(first);
    assert_eq!(
        pygame_up(),
        (true, true),
        "the first env's close must not quit pygame under the second"
    );
    let mut buf = VecBuffers::new(3, 18);
    second.reset(Some(0), &mut buf.obs).unwrap();
    for t in 0..30 {
        second
            .step(ActionBatch::Discrete(&[t % 5, 1, 2]), buf.view())
            .unwrap();
    }
    drop(second);
    assert_eq!(pygame_up(), (false, false), "the last env's close quits pygame");
}
