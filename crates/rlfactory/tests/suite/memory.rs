//! Memory: CartPole-v1 with its velocities hidden (`--obs_mask 0,2`) is a partially observed task. With the shipped
//! `configs/CartPole-v1-masked-gru.toml` (a GRU, serial mode: the same run on the same binary and CPU), 2 of the seeds
//! 1-4 reach a mean return of 400 over the last 100 episodes within the file's budget of 400K env frames (one seed in
//! five missed it in docs/appo.md's results); the same budget and settings without the GRU stay far below (an MLP sees
//! positions only and cannot tell which way the pole moves). Frames to 400: 197K, 330K, 273K, none (217 at 400K) and
//! 226K on seeds 1-5 on an AMD EPYC (Zen 4); 362K, 202K, 210K, 224K, 169K and 159K on seeds 1-6 on an Intel Xeon
//! (AVX-512); seeds 1 and 2 there with libtorch's plain kernels 279K and 226K, with MKL's SSE2 path 158K and 258K
//! (`scripts/test_portability`). The MLP: 43.0 to 45.8 at 400K.

use crate::common;

use std::path::Path;
use std::time::Instant;

use common::{assert_seeds_pass, extra_train_settings, report, short_count, Outcome};

use rlfactory::config::Config;
use rlfactory::runner::train;

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/CartPole-v1-masked-gru.toml");
const BUDGET: u64 = 400_000;

fn run(use_rnn: bool, seed: u64) -> rlfactory::runner::Summary {
    let mut flags = vec![
        format!("use_rnn = {use_rnn}"),
        format!("seed = {seed}"),
        "save_experiment = false".to_owned(),
        "report_interval_sec = 0".to_owned(),
    ];
    flags.extend(extra_train_settings());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cfg = Config::for_env_with_file("CartPole-v1", Path::new(CONFIG), &flags).expect("config");
    assert!(cfg.run.serial_mode && cfg.run.stop_at_reward == Some(400.0));
    assert_eq!(
        (cfg.run.train_for_env_steps, cfg.env.obs_mask.as_str()),
        (BUDGET, "0,2")
    );
    let summary = {
        let _turn = common::torch_rng();
        train(&cfg, Instant::now()).expect("training runs")
    };
    eprintln!(
        "use_rnn {use_rnn}: {} frames, {:.1} s, mean return {:?}",
        summary.env_frames, summary.wall_seconds, summary.mean_return
    );
    summary
}

#[test]
#[ignore = "learning lane"]
fn a_gru_balances_velocity_masked_cartpole_and_an_mlp_cannot() {
    assert_seeds_pass("memory_gru", 2, &[1, 2, 3, 4], 1, |seed| {
        let gru = run(true, seed);
        Outcome {
            passed: gru.reached_reward && gru.env_frames <= BUDGET,
            figure: format!(
                "mean return {:?} after {} frames",
                gru.mean_return, gru.env_frames
            ),
            target: format!("mean return >= 400 within {} frames", short_count(BUDGET)),
        }
    });
    let mlp = run(false, 1);
    let mean = mlp.mean_return.expect("episodes ended");
    let outcome = Outcome {
        passed: mlp.env_frames >= BUDGET && mean < 150.0,
        figure: format!("mean return {mean} after {} frames", mlp.env_frames),
        target: format!("mean return < 150 after {} frames", short_count(BUDGET)),
    };
    report("memory_mlp_cannot", 1, &outcome);
    assert!(outcome.passed, "the MLP: {}", outcome.figure);
}
