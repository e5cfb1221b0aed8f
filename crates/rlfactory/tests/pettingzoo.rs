//! PettingZoo envs trained through the real binary (`pz:<module>`, the Parallel API): every agent
//! acts at every step, one shared policy.

mod common;

use common::train_summary;

const SIMPLE_SPREAD: &str = "pz:pettingzoo.mpe.simple_spread_v3";

/// MPE's simple_spread (3 agents, 25 steps, 5 discrete actions, a shared reward for covering the
/// landmarks): the mean return per agent rises at least 3 above a random policy's (about -27)
/// within 600K agent steps on seed 1. Measured: -25.5 in the first 78K agent steps, -22.2 after
/// 356K, -18.4 to -21.7 after 550-850K.
#[test]
fn simple_spread_return_improves_over_random_play() {
    let random = common::random_return_per_agent(SIMPLE_SPREAD, 5, 300);
    eprintln!("random policy: {random:.1} per agent and episode");
    assert!(
        (-40.0..-15.0).contains(&random),
        "the random baseline {random} is implausible"
    );
    let s = train_summary(&[
        format!("--env={SIMPLE_SPREAD}"),
        "--seed=1".to_owned(),
        "--num_envs_per_worker=16".to_owned(),
        "--worker_num_splits=2".to_owned(),
        "--rollout=25".to_owned(),
        "--batch_size=600".to_owned(),
        "--num_batches_per_epoch=2".to_owned(),
        "--num_epochs=4".to_owned(),
        "--learning_rate=0.0005".to_owned(),
        "--gamma=0.95".to_owned(),
        "--train_for_env_steps=600000".to_owned(),
    ]);
    eprintln!("simple_spread: {s}");
    let ret = s["mean_return"].as_f64().expect("a mean return");
    assert!(
        ret >= random + 3.0,
        "mean return per agent {ret} after {} agent steps (random {random:.1})",
        s["env_frames"]
    );
}
