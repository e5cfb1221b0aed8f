//! Learning with each shipped config (`configs/<env>.toml`, applied by default), through the real
//! binary in parallel mode: one fixed seed per env reaches the README's target within its frame
//! budget. (CartPole: `ppo_cartpole.rs` and `parallel.rs`.)

mod common;

use common::train_summary;

/// Trains `env` with its shipped config until `target` or `budget` frames; asserts the target.
fn reaches(env: &str, seed: u64, target: f64, budget: u64) {
    let s = train_summary(&[
        format!("--env={env}"),
        format!("--seed={seed}"),
        format!("--stop_at_reward={target}"),
        format!("--train_for_env_steps={budget}"),
    ]);
    eprintln!("{env} seed {seed}: {s}");
    assert_eq!(
        s["reached_reward"], true,
        "{env}: mean return {} after {} frames",
        s["mean_return"], s["env_frames"]
    );
    assert!(s["env_frames"].as_u64().expect("frames") <= budget, "{s}");
}

/// One after the other: four parallel runs at once would share the two cores four ways.
#[test]
fn each_shipped_config_reaches_its_target_within_its_budget() {
    reaches("Acrobot-v1", 1, -100.0, 500_000);
    reaches("MountainCar-v0", 3, -130.0, 2_000_000);
    reaches("Pendulum-v1", 3, -250.0, 2_000_000);
    reaches("MountainCarContinuous-v0", 4, 90.0, 2_000_000);
}
