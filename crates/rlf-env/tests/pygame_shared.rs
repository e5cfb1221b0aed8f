//! pygame's state is one per process, and PettingZoo's MPE envs call `pygame.quit()` in `close`:
//! with several envs in one process (a worker's vector, tests on threads), the first to close used
//! to free the fonts and surfaces of the others, and the process aborted later in `malloc`. The
//! bridge lets pygame quit only when the last env closes. A file of its own, so that no other
//! test's envs are open in this process.

use pyo3::prelude::*;
use rlf_env::pz::PettingZooEnv;
use rlf_env::{parse_kwargs, ActionBatch, MultiAgentEnv, VecBuffers};

const SIMPLE_SPREAD: &str = "pz:pettingzoo.mpe.simple_spread_v3";

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

#[test]
fn closing_one_mpe_env_leaves_pygame_to_the_others_and_the_last_one_quits_it() {
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
