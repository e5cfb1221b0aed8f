//! A Gymnasium env that raises, run through the bridge in a rollout-worker process: the run stops
//! with one error line naming the loop and the object, exit code 1, the learner's checkpoint
//! saved, no shared memory left.

use crate::common;

use std::process::Command;

use common::{expect_failed_run, spawn, temp_dir, BIN};

const RAISER: &str = r#"
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class Raiser(CartPoleEnv):
    """CartPole that raises after 3,000 steps of its process."""

    steps = 0

    def step(self, action):
        Raiser.steps += 1
        if Raiser.steps > 3000:
            raise RuntimeError("raiser broke after 3000 steps")
        return super().step(action)


gym.register("Raiser-v0", entry_point="raiser:Raiser", max_episode_steps=500)
"#;

#[test]
fn a_raising_gymnasium_env_stops_the_run_with_its_loop_named_and_exit_code_1() {
    let dir = temp_dir("gym-raiser");
    std::fs::write(dir.path().join("raiser.py"), RAISER).expect("write the env module");
    let python_path = match std::env::var("PYTHONPATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", dir.path().display()),
        _ => dir.path().display().to_string(),
    };
    let run = spawn(
        Command::new(BIN)
            .env("PYTHONPATH", python_path)
            .args([
                "train",
                "--env=gym:raiser:Raiser-v0",
                "--experiment=exp",
                "--num_envs_per_worker=4",
                "--batch_size=256",
                "--rollout=32",
                "--save_every_sec=1000",
                "--train_for_seconds=120",
            ])
            .arg(format!("--train_dir={}", dir.path().display())),
    );
    let (error, log) = expect_failed_run(run, dir.path());
    assert!(
        error.contains("loop rollout_worker_0: object rollout_worker_0: ")
            && error.contains("Python raised during step")
            && error.contains("raiser broke after 3000 steps"),
        "{error}"
    );
    assert_eq!(log.matches("raiser broke").count(), 1, "said once:\n{log}");
}
