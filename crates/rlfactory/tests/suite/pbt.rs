//! Population-based training through the real binary: four CartPole policies, one of them started
//! with a learning rate too small to learn anything (seeded through its `policy_<i>_cfg.json`, the
//! file a resumed run continues from). Within two PBT periods it holds a better policy's weights and
//! mutated hyper-parameters, the log says so, and a resumed run keeps the population's state.

use crate::common;

use std::path::Path;

use common::{run, temp_dir, text};
use rlfactory::config::Config;
use rlfactory::pbt::{Hyper, PolicyState};

/// The learning rate of policy 3 (CartPole's shipped one is 0.008): its policy stays the random one
/// (a mean return of about 22) while the others learn (40-50 at the first decision). A rate that
/// diverges instead (1.0, until 2026-12-06) is no sure loser: its saturated policy scored 48.15 at a
/// decision where two learning policies scored 44.60 and 40.05, and kept its weights.
const STALLED_LR: f64 = 1e-7;

fn state(dir: &Path, policy: usize) -> PolicyState {
    let path = dir.join(format!("policy_{policy}_cfg.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("a policy state")
}

/// The lines of a run's log that tell its population's story (and any fault), for a failure's message: the whole
/// log is too long for a CI summary to keep.
fn story(log: &str) -> String {
    let told = ["pbt:", "resuming", "error", "fault", "hung", "died", "stopped"];
    log.lines()
        .filter(|l| told.iter().any(|t| l.contains(t)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `rlfactory train` of the population in `train_dir/exp` for `frames` env frames; returns stderr.
fn train(train_dir: &Path, frames: u64) -> String {
    let output = run(&[
        "train",
        "--env=CartPole-v1",
        "--seed=1",
        "--experiment=exp",
        &format!("--train_dir={}", train_dir.display()),
        "--num_policies=4",
        // Sync mode maps env e to policy e % 4: every policy takes a quarter of the steps.
        "--async_rl=false",
        "--batch_size=2048",
        "--with_pbt",
        "--pbt_period_env_steps=60000",
        "--pbt_start_mutation=0",
        "--pbt_mutation_rate=1",
        &format!("--train_for_env_steps={frames}"),
        "--report_interval_sec=0",
    ]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "the run failed:\n{}", story(&stderr));
    stderr
}

#[test]
fn a_stalled_policy_takes_a_better_ones_weights_and_a_resumed_run_keeps_the_population() {
    let dir = temp_dir("pbt");
    let exp = dir.path().join("exp");
    std::fs::create_dir_all(&exp).expect("experiment folder");
    let cfg = Config::for_env_defaults("CartPole-v1", "appo").expect("config");
    let mut hyper = Hyper::of(&cfg);
    hyper.learning_rate = STALLED_LR;
    let seeded = PolicyState {
        policy: 3,
        hyper,
        agent_steps: 0,
        last_update_agent_steps: 0,
        updates: 0,
        replaced: 0,
    };
    std::fs::write(
        exp.join("policy_3_cfg.json"),
        serde_json::to_vec(&seeded).expect("json"),
    )
    .expect("seed");

    // Two periods of policy 3: 2 x 60K of its agent steps, a quarter of the run's.
    let log = train(dir.path(), 480_000);
    assert!(
        log.contains(&format!(
            "pbt: policy 3 continues with its saved hyper-parameters (learning rate {STALLED_LR:e}"
        )),
        "{}",
        story(&log)
    );
    let took = log
        .lines()
        .find(|l| l.contains("pbt: policy 3 (objective") && l.contains("takes the weights"))
        .unwrap_or_else(|| panic!("policy 3 never took another policy's weights:\n{}", story(&log)));
    assert!(took.contains("mutated: "), "{took}");
    // The copy went through a checkpoint saved for policy 3 beside the source's regular ones, which the source's
    // later saves do not rotate away before policy 3's learner reads it.
    let loaded = log
        .lines()
        .find(|l| l.contains("pbt: policy 3 loaded "))
        .unwrap_or_else(|| panic!("the copy went through a checkpoint:\n{}", story(&log)));
    assert!(loaded.contains("/pbt_for_p3/checkpoint_"), "{loaded}");
    let after = state(&exp, 3);
    assert!(after.replaced >= 1 && after.updates >= 1, "{after:?}");
    assert!(
        after.hyper.learning_rate > STALLED_LR * 1e3,
        "policy 3 runs with a better policy's (mutated) learning rate: {after:?}"
    );
    for p in 0..4 {
        assert_eq!(state(&exp, p).policy, p);
    }

    // Resumed: the population's state comes back from the files and moves on from there.
    let before: Vec<PolicyState> = (0..4).map(|p| state(&exp, p)).collect();
    let log = train(dir.path(), 540_000);
    assert!(
        log.contains(&format!(
            "pbt: policy 3 continues with its saved hyper-parameters (learning rate {:e}",
            before[3].hyper.learning_rate
        )),
        "{}",
        story(&log)
    );
    // ... and its learner trains with it from its first update on.
    let taken = log
        .lines()
        .find(|l| l.contains("pbt: policy 3 trains with learning rate"))
        .unwrap_or_else(|| {
            panic!(
                "policy 3's learner never took its saved hyper-parameters:\n{}",
                story(&log)
            )
        });
    assert!(
        taken.ends_with(&format!("learning rate {:e}", before[3].hyper.learning_rate)),
        "{taken}\n{}",
        story(&log)
    );
    for (p, old) in before.iter().enumerate() {
        let now = state(&exp, p);
        assert!(
            now.updates >= old.updates,
            "policy {p}: {old:?} then {now:?}\n{}",
            story(&log)
        );
        assert!(
            now.last_update_agent_steps >= old.last_update_agent_steps,
            "policy {p}: {old:?} then {now:?}\n{}",
            story(&log)
        );
        // Its agent steps count on from the first run's (a quarter of 60K more frames).
        assert!(
            now.agent_steps >= old.agent_steps + 10_000,
            "policy {p}: {old:?} then {now:?}\n{}",
            story(&log)
        );
    }
}
