//! A binary of our own built on `rlfactory::cli::main`, as a user with native envs and networks writes one: it
//! registers a native env and an encoder, then hands over to the CLI (worker processes re-enter it through
//! `rlf_signal::child_entry`, inside `rlfactory::cli::main`, and so see the same registrations).
//!
//! - A native env that goes wrong (NaN observations after a few thousand steps) in a worker process: the run stops
//!   with one error line naming the loop and the object, exit code 1, the learner's checkpoint saved, no shared
//!   memory left.
//! - An encoder of the user's own (`--encoder_custom`): APPO trains CartPole with it in parallel mode (its variables
//!   in the checkpoint, published to the inference worker), DQN builds its Q-network on it, and a name no binary
//!   registered is a usage error of one line.
//!
//! `harness = false`: this binary is the test (run without `RLF_OWN_BINARY_ROLE`), the training program it starts
//! (with it), and that program's worker processes.

mod common;

use std::process::{Command, ExitCode};

use common::{expect_failed_run, spawn, summary, temp_dir, text};
use rlf_env::classic::CartPole;
use rlf_env::{Action, Env, EnvError, EnvRegistry, Space, Step};
use rlfactory::model::{register_encoder, EncoderNet};
use tch::{nn, Tensor};

const ROLE: &str = "RLF_OWN_BINARY_ROLE";

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

/// The user's encoder: each observation value and its square, then one tanh layer of 64 units.
struct Squares {
    layer: nn::Linear,
}

impl EncoderNet for Squares {
    fn forward(&self, obs: &Tensor) -> Tensor {
        Tensor::cat(&[obs.shallow_clone(), obs.square()], -1)
            .apply(&self.layer)
            .tanh()
    }
}

fn register_squares() {
    register_encoder("squares", |path, _space, obs_dim, _cfg| {
        let layer = nn::linear(path / "squares", 2 * obs_dim, 64, Default::default());
        Ok((Box::new(Squares { layer }) as Box<dyn EncoderNet>, 64))
    });
}

/// `rlfactory args` through this binary, with its registrations.
fn own(args: &[&str]) -> std::process::Output {
    let exe = std::env::current_exe().expect("this test's binary");
    common::output(Command::new(exe).env(ROLE, "train").args(args))
}

fn a_native_env_error_stops_the_run_with_its_loop_named_and_exit_code_1() {
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
}

/// APPO on CartPole-v1 with the registered encoder, parallel mode (rollout workers, an inference worker and the
/// learner in processes of their own), seed 1: the checkpoint holds the encoder's variables for the actor and the
/// critic, and the policy learns: a mean return of at least 75 within 300K frames, more than three times a random
/// policy's 22 (parallel mode varies from run to run: 128.7, 458.7, 198.4, 421.7 alone on an Intel Xeon, 147.6 and
/// 108.9 with two runs at once beside the test suite, 120.6 with `ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE`;
/// `eval` then plays it).
// lane: ci
fn appo_trains_with_an_encoder_of_the_users_own() {
    let dir = temp_dir("own-encoder");
    let train_dir = format!("--train_dir={}", dir.path().display());
    let out = dir.path().join("summary.json");
    let train = own(&[
        "train",
        "--env=CartPole-v1",
        "--encoder_custom=squares",
        "--seed=1",
        "--experiment=exp",
        &train_dir,
        &format!("--summary_json={}", out.display()),
        "--train_for_env_steps=300000",
        "--report_interval_sec=0",
    ]);
    assert!(train.status.success(), "{}", text(&train.stderr));
    let s = summary(&out);
    let ret = s["mean_return"].as_f64().expect("a mean return");
    let verdict = if ret >= 75.0 { "pass" } else { "fail" };
    eprintln!(
        "learning: own_encoder seed 1: mean return {ret} after {} frames [target mean return >= 75 within 300K \
         frames] ({verdict})",
        s["env_frames"]
    );
    assert!(ret >= 75.0, "mean return {ret} after {} frames", s["env_frames"]);
    let ckpt_dir = dir.path().join("exp/checkpoint_p0");
    let newest = std::fs::read_dir(&ckpt_dir)
        .expect("the checkpoint folder")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .max()
        .expect("a checkpoint");
    let ckpt = rlf_experiment::checkpoint::load_checkpoint(&newest).expect("the checkpoint loads");
    for name in ["actor_encoder.squares.weight", "critic_encoder.squares.weight"] {
        let t = ckpt.tensors.get(name).unwrap_or_else(|| {
            panic!(
                "{name} is not in {}: {:?}",
                newest.display(),
                ckpt.tensors.keys().collect::<Vec<_>>()
            )
        });
        assert_eq!(t.shape, vec![64, 8], "{name}");
    }
    let enjoy = own(&[
        "eval",
        "--env=CartPole-v1",
        "--experiment=exp",
        &train_dir,
        "--max_num_episodes=3",
    ]);
    assert!(enjoy.status.success(), "{}", text(&enjoy.stderr));
}

/// DQN builds its Q-network on the registered encoder (learned by tch's autograd: the hand-written gradients
/// cover only the built-in MLP) and trains.
fn dqn_trains_with_an_encoder_of_the_users_own() {
    let dir = temp_dir("own-encoder-dqn");
    let out = dir.path().join("summary.json");
    let train = own(&[
        "train",
        "--env=CartPole-v1",
        "--algo=dqn",
        "--encoder_custom=squares",
        "--serial_mode",
        "--save_experiment=false",
        &format!("--summary_json={}", out.display()),
        "--train_for_env_steps=3000",
        "--report_interval_sec=0",
    ]);
    assert!(train.status.success(), "{}", text(&train.stderr));
    let s = summary(&out);
    assert!(s["policies"][0]["policy_version"].as_u64() > Some(100), "{s}");
}

/// A name no binary registered: exit 2, one line naming the flag and what is registered, before any work.
fn an_unregistered_encoder_is_a_usage_error() {
    let dir = temp_dir("own-encoder-unknown");
    let train = own(&[
        "train",
        "--env=CartPole-v1",
        "--encoder_custom=sqaures",
        "--experiment=exp",
        &format!("--train_dir={}", dir.path().display()),
    ]);
    let stderr = text(&train.stderr);
    assert_eq!(train.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("--encoder_custom sqaures: no encoder of that name is registered")
            && lines[0].contains("registered: squares"),
        "{stderr}"
    );
    assert!(!dir.path().join("exp").exists(), "no experiment folder");
}

fn main() -> ExitCode {
    if std::env::var_os(ROLE).is_some() {
        register_squares();
        rlfactory::cli::main(registry());
    }
    let tests: [(&str, fn()); 4] = [
        (
            "a_native_env_error_stops_the_run_with_its_loop_named_and_exit_code_1",
            a_native_env_error_stops_the_run_with_its_loop_named_and_exit_code_1,
        ),
        (
            "appo_trains_with_an_encoder_of_the_users_own",
            appo_trains_with_an_encoder_of_the_users_own,
        ),
        (
            "dqn_trains_with_an_encoder_of_the_users_own",
            dqn_trains_with_an_encoder_of_the_users_own,
        ),
        (
            "an_unregistered_encoder_is_a_usage_error",
            an_unregistered_encoder_is_a_usage_error,
        ),
    ];
    for (name, test) in tests {
        test();
        println!("test {name} ... ok");
    }
    println!(
        "\ntest result: ok. {} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        tests.len()
    );
    ExitCode::SUCCESS
}
