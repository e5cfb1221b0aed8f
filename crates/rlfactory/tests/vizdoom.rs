//! VizDoom through the Gymnasium bridge (feature `python`; `scripts/setup_python.sh` installs it): built-in
//! scenarios start and step with a Dict of the screen and the game variables and render their screen, and
//! `doom_basic` trains a thousand frames through the real binary with a convolutional encoder for the screen and an
//! MLP for the variables. A test binary of its own, apart from the suite: VizDoom's game crashes a process that ran
//! ALE (`suite/pixels.rs`) before it (a segfault in libpython when the two shared the suite's process).

mod common;

use common::train_summary;
use rlf_env::{Action, Env, EnvRegistry, Space};

/// The shape of the `Box` at `key` of a Dict observation space.
fn shape_of(space: &Space, key: &str) -> Vec<usize> {
    let Space::Dict(parts) = space else {
        panic!("not a Dict: {space}");
    };
    match &parts.iter().find(|(k, _)| k == key).expect("the key").1 {
        Space::Box(b) => b.shape().to_vec(),
        other => panic!("not a Box: {other}"),
    }
}

#[test]
fn vizdoom_starts_steps_screen_and_variables_and_trains() {
    for (id, variables) in [("doom_basic", 1), ("doom_defend_the_center", 2)] {
        let mut env = EnvRegistry::with_builtin()
            .make(id)
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let space = env.observation_space().clone();
        assert_eq!(shape_of(&space, "screen"), [72, 128, 3], "{id}");
        assert_eq!(shape_of(&space, "gamevariables"), [variables], "{id}");
        let mut obs = vec![0.0; space.flat_dim()];
        env.reset(Some(1), &mut obs).expect("reset");
        for _ in 0..30 {
            if env.step(Action::Discrete(1), &mut obs).expect("step").done() {
                env.reset(None, &mut obs).expect("reset");
            }
            assert!(
                obs.iter().all(|v| v.is_finite()),
                "{id}: an observation that is not finite"
            );
        }
        // The screen (after the variables) holds a picture: pixel values in [0, 255], not all alike.
        let screen = &obs[variables..];
        assert!(screen.iter().all(|v| (0.0..=255.0).contains(v)), "{id}");
        assert!(screen.iter().any(|&v| v != screen[0]), "{id}: a blank screen");
        // What a video of it shows (`enjoy --save_video`): the game's screen as Gymnasium's rgb_array render.
        let frame = env.render().expect("render").expect("a picture");
        assert!(
            frame.width >= 128 && frame.height >= 72,
            "{id}: {}x{}",
            frame.width,
            frame.height
        );
        assert_eq!(frame.rgb.len(), frame.width * frame.height * 3, "{id}");
        assert!(
            frame.rgb.iter().any(|&v| v != frame.rgb[0]),
            "{id}: a blank picture"
        );
    }
    let s = train_summary(&[
        "--env=doom_basic".to_owned(),
        "--encoder_conv_architecture=convnet_simple".to_owned(),
        "--num_envs_per_worker=4".to_owned(),
        "--rollout=32".to_owned(),
        "--batch_size=128".to_owned(),
        "--train_for_env_steps=1024".to_owned(),
    ]);
    eprintln!("doom_basic: {s}");
    assert!(s["env_frames"].as_u64().expect("frames") >= 1024, "{s}");
    assert!(s["trajectories_trained"].as_u64().expect("trained") >= 4, "{s}");
}
