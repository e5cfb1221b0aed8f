//! A native env that goes wrong (NaN observations after a few thousand steps), in a worker
//! process of a binary of our own built on `rlfactory::cli::main` with its own registry: the run
//! stops with one error line naming the loop and the object, exit code 1, the learner's
//! checkpoint saved, no shared memory left.
//!
//! `harness = false`: this binary is the test (run without `RLF_NATIVE_FAULTS_ROLE`), the
//! training program it starts (with it), and that program's worker processes (which re-enter it
//! through `rlf_signal::child_entry`, inside `rlfactory::cli::main`).

mod common;

use std::process::{Command, ExitCode};

use common::{expect_failed_run, spawn, temp_dir};
use rlf_env::classic::CartPole;
use rlf_env::{Action, Env, EnvError, EnvRegistry, Space, Step};

const ROLE: &str = "RLF_NATIVE_FAULTS_ROLE";

/// CartPole whose observations turn NaN after 3,000 steps.
struct NanAfter {
    inner: CartPole,
    steps: u64,
}

impl Env for NanAfter {
    fn id(&self) -> &str {
        "NanAfter-v0"
    }
    fn observation_space(&self) -> &Space {
        self.inner.observation_space()
    }
    fn action_space(&self) -> &Space {
        self.inner.action_space()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let step = self.inner.step(action, obs)?;
        self.steps += 1;
        if self.steps > 3000 {
            obs[2] = f32::NAN;
        }
        Ok(step)
    }
}

fn registry() -> EnvRegistry {
    let mut registry = EnvRegistry::with_builtin();
    registry
        .register("NanAfter-v0", Some(500), || {
            Ok(Box::new(NanAfter {
                inner: CartPole::new(),
                steps: 0,
            }))
        })
        .expect("register");
    registry
}

fn main() -> ExitCode {
    if std::env::var_os(ROLE).is_some() {
        return rlfactory::cli::main(registry());
    }
    let dir = temp_dir("native-nan");
    let exe = std::env::current_exe().expect("this test's binary");
    let run = spawn(
        Command::new(exe)
            .env(ROLE, "train")
            .args([
                "train",
                "--env=NanAfter-v0",
                "--experiment=exp",
                "--num_envs_per_worker=4",
                "--save_every_sec=1000",
                "--train_for_seconds=120",
            ])
            .arg(format!("--train_dir={}", dir.path().display())),
    );
    let (error, _) = expect_failed_run(run, dir.path());
    assert!(
        error.contains("loop rollout_worker_0: object rollout_worker_0: ")
            && error.contains("NanAfter-v0: step returned an observation with NaN"),
        "{error}"
    );
    println!("test a_native_env_error_stops_the_run_with_its_loop_named_and_exit_code_1 ... ok");
    ExitCode::SUCCESS
}
