//! Learning: with its shipped sample-efficient config (`configs/CartPole-v1-sample-efficient.toml`), CartPole-v1
//! reaches a mean return of 475 over the last 100 episodes within 150K env frames, on each fixed seed, through the
//! whole component graph. Frames to 475 on seeds 1-5 on an Intel Xeon under the CPU variations of
//! `scripts/test_portability`: 54.0K-72.7K natively and with libtorch's AVX2 kernels, 54.5K-120.1K with its plain ones,
//! 53.8K-100.9K with MKL's SSE2 path.

use crate::common;

use std::path::Path;
use std::time::Instant;

use common::{extra_train_settings, report, Outcome};
use rlfactory::config::Config;
use rlfactory::runner::train;

const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/configs/CartPole-v1-sample-efficient.toml"
);

// lane: ci
#[test]
fn cartpole_reaches_475_within_150k_frames_on_five_seeds() {
    let mut failures = Vec::new();
    for seed in [1, 2, 3, 4, 5] {
        let mut flags = vec![
            format!("seed = {seed}"),
            "save_experiment = false".to_owned(),
            "report_interval_sec = 0".to_owned(),
        ];
        flags.extend(extra_train_settings());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let cfg = Config::for_env_with_file("CartPole-v1", Path::new(CONFIG), &flags).expect("config");
        assert!(cfg.run.serial_mode && cfg.run.stop_at_reward == Some(475.0));
        assert_eq!(cfg.run.train_for_env_steps, 150_000);
        let summary = {
            let _turn = common::torch_rng();
            train(&cfg, Instant::now()).expect("training runs")
        };
        let outcome = Outcome {
            passed: summary.reached_reward && summary.env_frames <= 150_000,
            figure: format!(
                "{} frames, {:.1} s, mean return {:?}",
                summary.env_frames, summary.wall_seconds, summary.mean_return
            ),
            target: "mean return >= 475 within 150K frames".to_owned(),
        };
        report("ppo_cartpole", seed, &outcome);
        if !outcome.passed {
            failures.push((seed, summary.env_frames, summary.mean_return));
        }
    }
    assert!(
        failures.is_empty(),
        "seeds that did not reach 475 within 150K frames: {failures:?}"
    );
}
