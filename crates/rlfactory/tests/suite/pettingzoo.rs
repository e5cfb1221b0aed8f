//! PettingZoo envs trained through the real binary (`pz:<module>`, the Parallel API): every agent
//! acts at every step; one shared policy, or (agents with different spaces) one per kind of agent.

use crate::common;

use std::process::Command;

use common::{output, run, temp_dir, text, train_summary, train_with_module, BIN};

const SIMPLE_SPREAD: &str = "pz:pettingzoo.mpe.simple_spread_v3";

/// MPE's simple_spread (3 agents, 25 steps, 5 discrete actions, a shared reward for covering the
/// landmarks): the mean return per agent rises at least 3 above a random policy's (about -27)
/// within 600K agent steps on seed 1, in `--serial_mode` (a run repeats on the same binary and CPU:
/// in parallel mode the figure moved with the machine's load, -19.2 and -20.0 alone and once under
/// the threshold beside the rest of the suite). Measured on an Intel Xeon (random -26.09): seed 1
/// -20.58 natively and -20.05 with `ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE`, seed 2 -20.30
/// and -19.58, 56 s each; in parallel mode before, -25.5 in the first 78K agent steps, -22.2 after
/// 356K, -18.4 to -21.7 after 550-850K.
#[test]
#[ignore = "learning lane"]
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
        "--serial_mode".to_owned(),
    ]);
    eprintln!("simple_spread: {s}");
    let ret = s["mean_return"].as_f64().expect("a mean return");
    let outcome = common::Outcome {
        passed: ret >= random + 3.0,
        figure: format!(
            "mean return {ret:.2} (random {random:.2}) after {} agent steps",
            s["env_frames"]
        ),
        target: format!(
            "mean return per agent >= {:.2} (random's {random:.2} + 3) after 600K agent steps",
            random + 3.0
        ),
    };
    common::report("simple_spread", 1, &outcome);
    assert!(
        ret >= random + 3.0,
        "mean return per agent {ret} after {} agent steps (random {random:.1})",
        s["env_frames"]
    );
}

const SIMPLE_ADVERSARY: &str = "pz:pettingzoo.mpe.simple_adversary_v3";

/// MPE's simple_adversary: the adversary sees 8 values, the two good agents 10, so each kind
/// needs a policy of its own (`--agent_policy_map adversary=0,agent=1`). On seed 1, within 600K
/// agent steps, the adversary's return rises at least 5 above a random adversary's (measured:
/// random -28.2, trained -15.2; on an Intel Xeon -15.45 natively and -15.10 with two libtorch threads) while the good agents' policy trains on its 400K agent steps (their
/// return is no yardstick: it is highest against a random adversary, 7.5, and measured 4.5 at
/// first and 7.5 after 600K against the learning one). `enjoy --policy_index 1` then plays every
/// agent with its own policy and reports the good agents' episodes only.
#[test]
#[ignore = "learning lane"]
fn simple_adversary_trains_a_policy_per_kind_of_agent() {
    let random_adversary = common::random_return_of(SIMPLE_ADVERSARY, 5, 300, |a| a == 0);
    eprintln!("random adversary: {random_adversary:.1}");
    let dir = temp_dir("simple-adversary");
    let out = dir.path().join("summary.json");
    let train = run(&[
        "train",
        &format!("--env={SIMPLE_ADVERSARY}"),
        &format!("--train_dir={}", dir.path().display()),
        "--experiment=adv",
        &format!("--summary_json={}", out.display()),
        "--report_interval_sec=0",
        "--num_policies=2",
        "--agent_policy_map=adversary=0,agent=1",
        "--seed=1",
        "--num_envs_per_worker=16",
        "--worker_num_splits=2",
        "--rollout=25",
        "--batch_size=600",
        "--num_batches_per_epoch=2",
        "--num_epochs=4",
        "--learning_rate=0.0005",
        "--gamma=0.95",
        "--train_for_env_steps=600000",
    ]);
    assert!(train.status.success(), "{}", text(&train.stderr));
    let s = common::summary(&out);
    let ret = |p: usize| s["policies"][p]["mean_return"].as_f64().expect("a mean return");
    let outcome = common::Outcome {
        passed: ret(0) >= random_adversary + 5.0,
        figure: format!(
            "adversary {:.2} (random {random_adversary:.2}), good agents {:.2}",
            ret(0),
            ret(1)
        ),
        target: format!(
            "adversary's mean return >= {:.2} (a random adversary's {random_adversary:.2} + 5) after 600K agent \
             steps",
            random_adversary + 5.0
        ),
    };
    common::report("simple_adversary", 1, &outcome);
    assert!(
        ret(0) >= random_adversary + 5.0,
        "adversary {} (random {random_adversary:.1}): {s}",
        ret(0)
    );
    let good = &s["policies"][1];
    assert_eq!(good["agent_steps"].as_u64(), Some(400_000), "{s}");
    assert!(good["policy_version"].as_u64() > Some(1000), "{s}");
    assert!(ret(1).is_finite() && ret(1) > 0.0, "{s}");
    let enjoy = output(Command::new(BIN).args([
        "enjoy",
        &format!("--env={SIMPLE_ADVERSARY}"),
        &format!("--train_dir={}", dir.path().display()),
        "--experiment=adv",
        "--policy_index=1",
        "--max_num_episodes=4",
    ]));
    let stdout = text(&enjoy.stdout);
    assert!(enjoy.status.success(), "{}", text(&enjoy.stderr));
    assert_eq!(stdout.matches("episode ").count(), 4, "{stdout}");
    assert!(stdout.contains("mean return"), "{stdout}");
}

/// Agents with different spaces need a policy each: no map, or a map that gives one policy
/// agents that differ, stops before anything starts with a line that names them.
#[test]
fn agents_with_different_spaces_on_one_policy_are_refused() {
    for (flags, wanted) in [
        (vec![], "the agents have different spaces (`adversary_0`"),
        (
            vec![
                "--num_policies=2",
                "--agent_policy_map=adversary=0,agent_0=1,agent_1=0",
            ],
            "policy 0 controls agents with different spaces, `adversary_0`",
        ),
    ] {
        let mut args = vec![
            "train".to_owned(),
            format!("--env={SIMPLE_ADVERSARY}"),
            "--save_experiment=false".to_owned(),
        ];
        args.extend(flags.iter().map(|f| (*f).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(
            err.contains(wanted) && err.contains("--agent_policy_map"),
            "{flags:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

/// Two agents whose action spaces differ in kind (PettingZoo's Parallel API, 8 steps an episode):
/// both see which of three targets is on (one-hot); `chooser` (`Discrete(3)`) earns 1 for naming it,
/// `mover` (a `Box` of two in [-1, 1]) earns minus its distance (L1) to the target's point.
const POINTER: &str = r#"
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

POINTS = np.array([[0.5, -0.5], [-0.5, 0.5], [0.0, 0.8]], np.float32)


class Pointer(ParallelEnv):
    metadata = {"name": "pointer_v0"}

    def __init__(self):
        self.possible_agents = ["chooser", "mover"]
        self.agents = []
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (3,), np.float32)

    def action_space(self, agent):
        if agent == "chooser":
            return spaces.Discrete(3)
        return spaces.Box(-1.0, 1.0, (2,), np.float32)

    def observe(self):
        self.target = int(self.rng.integers(3))
        obs = np.zeros(3, np.float32)
        obs[self.target] = 1.0
        return {a: obs.copy() for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        return self.observe(), {a: {} for a in self.agents}

    def step(self, actions):
        assert isinstance(actions["chooser"], (int, np.integer)), actions
        assert actions["mover"].shape == (2,), actions
        rewards = {
            "chooser": float(actions["chooser"] == self.target),
            "mover": -float(np.abs(actions["mover"] - POINTS[self.target]).sum()),
        }
        self.t += 1
        done = self.t >= 8
        obs = self.observe()
        flags = {a: done for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, flags, {a: False for a in flags}, {a: {} for a in flags}


def parallel_env():
    return Pointer()
"#;

/// Agents whose action spaces differ in kind, a `Discrete` one beside a `Box` one (Sample Factory
/// cannot: its issues #119 and #266), each with a policy of its own: the slots hold actions of two
/// values, the chooser's category in the first; each learner trains on its own agent's. Within 400K
/// agent steps both beat random play: the chooser names the target in most steps (random: 8/3 per
/// episode; measured 7.5 on seeds 1-3, release builds) and the mover moves towards the targets' points
/// (a unit Gaussian action clipped to the box, as at the start: -11.8 per episode by sampling; measured -7.2
/// to -7.4). On an Intel Xeon, natively and with two libtorch threads alike: chooser 7.51, mover -7.31.
#[test]
#[ignore = "learning lane"]
fn agents_whose_action_spaces_differ_in_kind_train_side_by_side() {
    let dir = temp_dir("pz-mixed-actions");
    let s = train_with_module(
        dir.path(),
        "rlf_pointer",
        POINTER,
        &[
            "--env=pz:rlf_pointer",
            "--num_policies=2",
            "--agent_policy_map=chooser=0,mover=1",
            "--seed=1",
            "--num_envs_per_worker=16",
            "--worker_num_splits=2",
            "--rollout=16",
            "--batch_size=256",
            "--train_for_env_steps=400000",
        ],
    );
    eprintln!("{}", s["agents"]);
    let agent = |name: &str| {
        s["agents"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["name"] == name))
            .and_then(|a| a["mean_return"].as_f64())
            .unwrap_or_else(|| panic!("{name}'s mean return in {s}"))
    };
    let outcome = common::Outcome {
        passed: agent("chooser") >= 6.5 && agent("mover") >= -9.0,
        figure: format!("chooser {:.2}, mover {:.2}", agent("chooser"), agent("mover")),
        target: "chooser's mean return >= 6.5 and mover's >= -9 after 400K agent steps".to_owned(),
    };
    common::report("mixed_action_spaces", 1, &outcome);
    assert!(agent("chooser") >= 6.5, "the chooser's return: {s}");
    assert!(agent("mover") >= -9.0, "the mover's return: {s}");
}
