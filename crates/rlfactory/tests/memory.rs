//! Memory: CartPole-v1 with its velocities hidden (`--obs_mask 0,2`) is a partially observed task. With the shipped
//! `configs/CartPole-v1-masked-gru.toml` (a GRU, serial mode, so the run is the same every time), seed 1 reaches a
//! mean return of 400 over the last 100 episodes within the file's budget of 400K env frames; the same budget and
//! settings without the GRU stay far below (an MLP sees positions only and cannot tell which way the pole moves).

use std::time::Instant;

use rlfactory::config::Config;
use rlfactory::runner::train;

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/CartPole-v1-masked-gru.toml");
const BUDGET: u64 = 400_000;

fn run(use_rnn: bool) -> rlfactory::runner::Summary {
    let config = format!("--config={CONFIG}");
    let rnn = format!("--use_rnn={use_rnn}");
    let flags = [
        &*config,
        &*rnn,
        "--seed=1",
        "--save_experiment=false",
        "--report_interval_sec=0",
    ];
    let cfg = Config::for_env("CartPole-v1", &flags).expect("config");
    assert!(cfg.run.serial_mode && cfg.run.stop_at_reward == Some(400.0));
    assert_eq!(
        (cfg.run.train_for_env_steps, cfg.env.obs_mask.as_str()),
        (BUDGET, "0,2")
    );
    let summary = train(&cfg, Instant::now()).expect("training runs");
    eprintln!(
        "use_rnn {use_rnn}: {} frames, {:.1} s, mean return {:?}",
        summary.env_frames, summary.wall_seconds, summary.mean_return
    );
    summary
}

#[test]
fn a_gru_balances_velocity_masked_cartpole_and_an_mlp_cannot() {
    let gru = run(true);
    assert!(
        gru.reached_reward && gru.env_frames <= BUDGET,
        "the GRU: mean return {:?} after {} frames",
        gru.mean_return,
        gru.env_frames
    );
    let mlp = run(false);
    let mean = mlp.mean_return.expect("episodes ended");
    assert!(
        mlp.env_frames >= BUDGET && mean < 150.0,
        "the MLP: mean return {mean} after {} frames",
        mlp.env_frames
    );
}
