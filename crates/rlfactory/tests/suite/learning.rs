//! Learning with each shipped config (`configs/<env>.toml`, applied by default), through the real binary in serial
//! mode: one fixed seed per env reaches its target (docs/appo.md's results) within its frame budget. (CartPole:
//! `ppo_cartpole.rs` and `parallel.rs`.) Serial mode repeats a run exactly on one binary and CPU, so the test does not
//! depend on its neighbours' load (in parallel mode MountainCar's seed 3 needed 107K frames alone and 1.10M or more
//! beside another run). Frames to the target in the test profile on an AMD EPYC (Zen 3, no AVX-512) as this CPU picks /
//! libtorch's AVX2 kernels / its plain ones / MKL's compatible path / MKL's AVX2 path / two libtorch threads: Acrobot
//! 94K, 94K, 102K, 92K, 121K, 82K (budget 500K); MountainCar 81K, 81K, 76K, 106K, 78K, 104K (budget 2M); Pendulum 105K,
//! 105K, 105K, 219K, 111K, 165K (budget 2M); MountainCarContinuous 172K, 172K, 178K, 140K, 129K, 152K (budget 2M). The
//! four runs take 22 s there.

use crate::common;

use common::{report, short_count, train_summary, Outcome};

/// Trains `env` with its shipped config until `target` or `budget` frames: whether it reached the target in time.
fn reaches(env: &str, seed: u64, target: f64, budget: u64) -> Outcome {
    let s = train_summary(&[
        format!("--env={env}"),
        format!("--seed={seed}"),
        format!("--stop_at_reward={target}"),
        format!("--train_for_env_steps={budget}"),
        "--serial_mode".to_owned(),
    ]);
    let frames = s["env_frames"].as_u64().expect("frames");
    let outcome = Outcome {
        passed: s["reached_reward"] == true && frames <= budget,
        figure: format!("mean return {} after {frames} frames", s["mean_return"]),
        target: format!("mean return >= {target} within {} frames", short_count(budget)),
    };
    report(&format!("shipped_{env}"), seed, &outcome);
    outcome
}

/// One after the other. Every env runs even when one misses its target.
// lane: ci
#[test]
fn each_shipped_config_reaches_its_target_within_its_budget() {
    let missed: Vec<String> = [
        ("Acrobot-v1", 1, -100.0, 500_000),
        ("MountainCar-v0", 3, -130.0, 2_000_000),
        ("Pendulum-v1", 3, -250.0, 2_000_000),
        ("MountainCarContinuous-v0", 4, 90.0, 2_000_000),
    ]
    .into_iter()
    .filter_map(|(env, seed, target, budget)| {
        let outcome = reaches(env, seed, target, budget);
        (!outcome.passed).then(|| format!("{env} seed {seed} (target {target}): {}", outcome.figure))
    })
    .collect();
    assert!(missed.is_empty(), "missed: {missed:?}");
}
