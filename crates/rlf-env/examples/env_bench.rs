//! Env stepping throughput: native CartPole-v1 (one env; a 64-env `VecEnv`) and, with the
//! `python` feature, Gymnasium's CartPole-v1 through the bridge.
//!
//! ```text
//! cargo run --release -p rlf-env --example env_bench -- --json [--seconds 3]
//! cargo run --release -p rlf-env --features python --example env_bench -- --json
//! ```
//! Prints one line per scenario (`{"scenario": ..., "steps_per_s": ...}` with `--json`). Random
//! actions come from a xorshift generator; episodes are reset as they end.

use std::time::{Duration, Instant};

use rlf_env::{Action, ActionBatch, EnvRegistry, VecBuffers, VecEnv};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct XorShift(u64);

impl XorShift {
    fn bit(&mut self) -> i64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32 & 1) as i64
    }
}

/// Runs `chunk` (which returns the env steps it made) until `duration` has passed; steps per second.
fn measure(duration: Duration, mut chunk: impl FnMut() -> Result<u64>) -> Result<f64> {
    chunk()?; // warm-up
    let start = Instant::now();
    let mut steps = 0;
    while start.elapsed() < duration {
        steps += chunk()?;
    }
    Ok(steps as f64 / start.elapsed().as_secs_f64())
}

fn single(registry: &EnvRegistry, id: &str, duration: Duration, chunk_steps: u64) -> Result<f64> {
    let mut env = registry.make(id)?;
    let mut obs = vec![0.0; env.observation_space().flat_dim()];
    env.reset(Some(0), &mut obs)?;
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    measure(duration, || {
        for _ in 0..chunk_steps {
            let step = env.step(Action::Discrete(rng.bit()), &mut obs)?;
            if step.terminated || step.truncated {
                env.reset(None, &mut obs)?;
            }
        }
        Ok(chunk_steps)
    })
}

fn vector(registry: &EnvRegistry, id: &str, n: usize, duration: Duration) -> Result<f64> {
    let mut envs = VecEnv::from_registry(registry, id, n)?;
    let mut buf = VecBuffers::new(n, envs.obs_dim());
    envs.reset(Some(0), &mut buf.obs)?;
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let mut actions = vec![0_i64; n];
    measure(duration, || {
        for _ in 0..256 {
            actions.iter_mut().for_each(|a| *a = rng.bit());
            envs.step(ActionBatch::Discrete(&actions), buf.view())?;
        }
        Ok(256 * n as u64)
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let seconds: f64 = match args.iter().position(|a| a == "--seconds") {
        Some(i) => args.get(i + 1).ok_or("--seconds needs a value")?.parse()?,
        None => 3.0,
    };
    let duration = Duration::from_secs_f64(seconds);
    let registry = EnvRegistry::with_builtin();

    let mut results = vec![
        (
            "cartpole_native_1",
            single(&registry, "CartPole-v1", duration, 4096)?,
        ),
        (
            "cartpole_native_vec64",
            vector(&registry, "CartPole-v1", 64, duration)?,
        ),
    ];
    if cfg!(feature = "python") {
        results.push((
            "cartpole_gym_bridge_1",
            single(&registry, "gym:CartPole-v1", duration, 256)?,
        ));
    }
    for (scenario, steps_per_s) in results {
        if json {
            println!("{{\"scenario\": \"{scenario}\", \"steps_per_s\": {steps_per_s:.0}}}");
        } else {
            println!("{scenario:<24} {steps_per_s:>14.0} steps/s");
        }
    }
    Ok(())
}
