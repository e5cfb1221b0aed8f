//! An env's own measure of an episode (`info["true_objective"]` on its last step, Sample
//! Factory's convention) through the Gymnasium and PettingZoo bridges into the run's statistics:
//! each policy's and each agent's mean true objective, and the best checkpoint under
//! `--save_best_metric true_objective`.

use crate::common;

use common::{temp_dir, train_with_module};

/// CartPole without a time limit whose true objective is minus the episode's length.
const SCORED: &str = r#"
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class Scored(CartPoleEnv):
    def reset(self, **kwargs):
        self.t = 0
        return super().reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.t += 1
        if terminated or truncated:
            info = dict(info, true_objective=-float(self.t))
        return obs, reward, terminated, truncated, info


gym.register("Scored-v0", entry_point="scored:Scored")
"#;

/// Two agents, four steps an episode, reward 1 for action 1; agent `a_k`'s true objective is
/// `10 k` (PettingZoo's Parallel API).
const TAGGED: &str = r#"
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class Tagged(ParallelEnv):
    metadata = {"name": "tagged_v0"}

    def __init__(self):
        self.possible_agents = ["a_0", "a_1"]
        self.agents = []
        self.t = 0

    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        done = self.t >= 4
        obs = {a: np.full(2, self.t / 4.0, np.float32) for a in self.agents}
        rewards = {a: float(actions[a]) for a in self.agents}
        flags = {a: done for a in self.agents}
        infos = {a: ({"true_objective": 10.0 * k} if done else {}) for k, a in enumerate(self.agents)}
        if done:
            self.agents = []
        return obs, rewards, flags, {a: False for a in flags}, infos


def parallel_env():
    return Tagged()
"#;

#[test]
fn a_gymnasium_envs_true_objective_is_averaged_and_picks_the_best_checkpoint() {
    let dir = temp_dir("true-objective-gym");
    let s = train_with_module(
        dir.path(),
        "scored",
        SCORED,
        &[
            "--env=gym:scored:Scored-v0",
            "--num_envs_per_worker=8",
            "--train_for_env_steps=30000",
            "--save_best_metric=true_objective",
            "--save_best_after=0",
        ],
    );
    let policy = &s["policies"][0];
    let (ret, objective) = (
        policy["mean_return"].as_f64().expect("a mean return"),
        policy["true_objective"].as_f64().expect("a true objective"),
    );
    // CartPole's return is its length: the objective is its negative, over the same episodes.
    assert!(ret > 5.0, "{s}");
    assert!(
        (objective + ret).abs() < 1e-9,
        "objective {objective}, return {ret}"
    );
    let best: Vec<_> = std::fs::read_dir(dir.path().join("exp/checkpoint_p0"))
        .expect("checkpoint folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("best_"))
        })
        .collect();
    assert_eq!(best.len(), 1, "{best:?}");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&best[0]).expect("read")).expect("json");
    let metric = meta["metric"].as_f64().expect("the best checkpoint's metric");
    assert!(
        metric < 0.0,
        "the best checkpoint ranked by return, not objective: {meta}"
    );
}

#[test]
fn each_pettingzoo_agents_true_objective_goes_to_its_policy() {
    let dir = temp_dir("true-objective-pz");
    let s = train_with_module(
        dir.path(),
        "tagged",
        TAGGED,
        &[
            "--env=pz:tagged",
            "--num_policies=2",
            "--agent_policy_map=a_0=0,a_1=1",
            "--num_envs_per_worker=8",
            "--rollout=8",
            "--batch_size=256",
            "--train_for_env_steps=20000",
        ],
    );
    for (k, expected) in [(0, 0.0), (1, 10.0)] {
        let policy = &s["policies"][k];
        let ret = policy["mean_return"].as_f64().expect("a mean return");
        assert!((0.0..=4.0).contains(&ret), "policy {k}: {policy}");
        assert_eq!(
            policy["true_objective"].as_f64(),
            Some(expected),
            "policy {k}: {policy}"
        );
        let agent = &s["agents"][k];
        assert_eq!(agent["name"].as_str(), Some(format!("a_{k}").as_str()), "{s}");
        assert_eq!(
            agent["true_objective"].as_f64(),
            Some(expected),
            "agent {k}: {agent}"
        );
        assert_eq!(agent["episodes"], policy["episodes"], "{s}");
    }
}
