//! One Adam step (gradients clipped to a global norm, then the update) over the parameters of Atari's
//! `convnet_atari` actor-critic (1,687,719 values in 12 tensors, as a Pong learner steps them), from gradients
//! given per parameter as autograd hands them over.
//!
//! `cargo run --release -p rlfactory --example adam_bench -- [--steps N] [--threads T] [--max_grad_norm X]`: the
//! median and the fastest of 10 timings of N/10 steps each (N = 500), in µs per step. Nothing else runs between the
//! steps here; in a training run the forward and backward passes run between them.

use std::time::Instant;

use rlfactory::algo::adam::{Adam, AdamConfig};
use tch::{Device, Kind, Tensor};

/// convnet_atari's parameter shapes with a 6-action policy head and a value head.
const SHAPES: [&[i64]; 12] = [
    &[32, 4, 8, 8],
    &[32],
    &[64, 32, 4, 4],
    &[64],
    &[64, 64, 3, 3],
    &[64],
    &[512, 3136],
    &[512],
    &[6, 512],
    &[6],
    &[1, 512],
    &[1],
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str, default: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_owned())
    };
    let steps: usize = value("--steps", "500").parse().expect("--steps N");
    let max_norm: f64 = value("--max_grad_norm", "4.0")
        .parse()
        .expect("--max_grad_norm X");
    tch::set_num_threads(value("--threads", "2").parse().expect("--threads T"));
    tch::manual_seed(0);
    let opts = (Kind::Float, Device::Cpu);
    let params: Vec<(String, Tensor)> = SHAPES
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("p{i}"), Tensor::randn(*s, opts).set_requires_grad(true)))
        .collect();
    let grads: Vec<Tensor> = SHAPES.iter().map(|s| Tensor::randn(*s, opts)).collect();
    let values: i64 = SHAPES.iter().map(|s| s.iter().product::<i64>()).sum();
    let cfg = AdamConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-6,
    };
    let mut adam = Adam::new(params, cfg, 1e-4).expect("adam");
    let calls = (steps / 10).max(1);
    let mut times: Vec<f64> = (0..10)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..calls {
                adam.clip_and_step_with(&grads, max_norm).expect("step");
            }
            start.elapsed().as_secs_f64() * 1e6 / calls as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    println!(
        "adam step over {values} values: median {:.0} µs, fastest {:.0} µs",
        times[5], times[0]
    );
}
