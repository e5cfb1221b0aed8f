//! Native classic control against trajectories recorded from Gymnasium.
//!
//! Reads `tests/data/classic_control_public.jsonl` (a copy of the public reference file kept in the
//! repository) or the file named by `RLFACTORY_GOLDEN`, and fails when it is missing. Every episode starts from the recorded
//! internal state and is fed the recorded actions; every step must match: flags exactly,
//! observations and rewards to `f32` precision. Envs come from the registry, so truncation comes from
//! the registered time limits.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rlf_env::{Action, EnvRegistry};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(untagged)]
enum RecordedAction {
    Discrete(i64),
    Continuous(Vec<f32>),
}

#[derive(Deserialize)]
struct RecordedStep {
    obs: Vec<f32>,
    reward: f64,
    terminated: bool,
    truncated: bool,
}

#[derive(Deserialize)]
struct Episode {
    env: String,
    seed: u64,
    initial_state: Vec<f64>,
    initial_obs: Vec<f32>,
    actions: Vec<RecordedAction>,
    steps: Vec<RecordedStep>,
}

fn golden_path() -> PathBuf {
    match std::env::var_os("RLFACTORY_GOLDEN") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/classic_control_public.jsonl"),
    }
}

/// Equal to `f32` precision: relative 1e-5, absolute 1e-5 near zero.
fn close(actual: f32, expected: f32) -> bool {
    (actual - expected).abs() <= 1e-5 * expected.abs().max(1.0)
}

#[test]
fn native_classic_control_matches_gymnasium() {
    let path = golden_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the golden file {}: {e}", path.display()));
    let registry = EnvRegistry::with_builtin();
    // env id -> (episodes, steps) checked
    let mut checked: BTreeMap<String, (usize, usize)> = BTreeMap::new();

    for (line_no, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let ep: Episode = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}:{}: bad episode: {e}", path.display(), line_no + 1));
        let at = |step: usize| {
            format!(
                "{} line {} ({}, seed {}) step {step}",
                path.display(),
                line_no + 1,
                ep.env,
                ep.seed
            )
        };
        assert_eq!(ep.actions.len(), ep.steps.len(), "{}", at(0));

        let mut env = registry
            .make(&ep.env)
            .unwrap_or_else(|e| panic!("{}: {e}", at(0)));
        let mut obs = vec![0.0; env.observation_space().flat_dim()];
        env.reset(Some(ep.seed), &mut obs).unwrap();
        env.set_state(&ep.initial_state, &mut obs)
            .unwrap_or_else(|e| panic!("{}: {e}", at(0)));
        assert_eq!(obs.len(), ep.initial_obs.len(), "{}", at(0));
        for (a, e) in obs.iter().zip(&ep.initial_obs) {
            assert!(
                close(*a, *e),
                "{}: initial obs {obs:?} != {:?}",
                at(0),
                ep.initial_obs
            );
        }

        for (t, (action, expected)) in ep.actions.iter().zip(&ep.steps).enumerate() {
            let action = match action {
                RecordedAction::Discrete(a) => Action::Discrete(*a),
                RecordedAction::Continuous(x) => Action::Continuous(x),
            };
            let step = env
                .step(action, &mut obs)
                .unwrap_or_else(|e| panic!("{}: {e}", at(t + 1)));
            assert_eq!(
                (step.terminated, step.truncated),
                (expected.terminated, expected.truncated),
                "{}: flags",
                at(t + 1)
            );
            assert!(
                close(step.reward as f32, expected.reward as f32),
                "{}: reward {} != {}",
                at(t + 1),
                step.reward,
                expected.reward
            );
            assert_eq!(obs.len(), expected.obs.len(), "{}", at(t + 1));
            for (a, e) in obs.iter().zip(&expected.obs) {
                assert!(close(*a, *e), "{}: obs {obs:?} != {:?}", at(t + 1), expected.obs);
            }
        }
        let entry = checked.entry(ep.env.clone()).or_default();
        entry.0 += 1;
        entry.1 += ep.steps.len();
    }

    for (env, (episodes, steps)) in &checked {
        println!("{env}: {episodes} episodes, {steps} steps match Gymnasium");
    }
    if std::env::var_os("RLFACTORY_GOLDEN").is_none() {
        // The public file: 5 episodes per env, cut at 600 steps or at the episode's end.
        let expected: BTreeMap<String, (usize, usize)> = [
            ("Acrobot-v1", (5, 2500)),
            ("CartPole-v1", (5, 150)),
            ("MountainCar-v0", (5, 1000)),
            ("MountainCarContinuous-v0", (5, 3000)),
            ("Pendulum-v1", (5, 1000)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(checked, expected);
    } else {
        assert!(!checked.is_empty(), "{} holds no episodes", path.display());
    }
}
