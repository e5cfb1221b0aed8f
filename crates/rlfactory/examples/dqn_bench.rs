//! The learner's work per gradient step on the workload of sorrel's `treasurehunt_mp`
//! (`configs/treasurehunt-iqn-like.toml`): one DQN step on its network (625 → 250 → 250, dueling head of 4 actions,
//! batch 256, 3-step double-DQN targets, Polyak averaging every step), and drawing the batch from a full replay ring of
//! 1,024 rows and making tensors of it.
//!
//! `cargo run --release -p rlfactory --example dqn_bench -- [--steps N] [--precision highest|medium|auto]
//! [--threads T]`: the median and the fastest of 10 timings of N/10 steps each (N = 500), in µs per step (the
//! precision `auto` by default, as the config: bfloat16 on a CPU with AVX-512 BF16, float32 elsewhere). A ring this
//! size stays in the cache here, so the sampling figure is a lower bound of a training run's, where rollout and
//! inference evict it.

use std::time::Instant;

use rand::{RngExt, SeedableRng};
use rlf_env::{BoxSpace, Space};
use rlf_shm::replay::ReplayRing;
use rlfactory::algo::dqn::Dqn;
use rlfactory::algo::Transitions;
use rlfactory::config::{Config, DeviceKind};
use rlfactory::data::TransitionLayout;
use rlfactory::model::QNetwork;

const OBS: usize = 625;
const BATCH: usize = 256;
const CAPACITY: usize = 1024;

/// Median and minimum µs per call of `f`, over 10 timings of `calls` calls.
fn time(calls: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut times: Vec<f64> = (0..10)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..calls {
                f();
            }
            start.elapsed().as_secs_f64() * 1e6 / calls as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[5], times[0])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str, default: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_owned())
    };
    let steps: usize = value("--steps", "500").parse().expect("--steps N");
    let precision = value("--precision", "auto");
    tch::set_num_threads(value("--threads", "1").parse().expect("--threads T"));
    rlf_shm::process::keep_freed_memory();
    tch::manual_seed(0);
    let overrides = [
        "encoder_mlp_layers = '250,250'".to_owned(),
        "nonlinearity = 'relu'".to_owned(),
        format!("matmul_precision = '{precision}'"),
        "policy_initialization = 'torch_default'".to_owned(),
        "double_q = true".to_owned(),
        "target_update_interval = 1".to_owned(),
        "tau = 0.001".to_owned(),
        "max_grad_norm = 10".to_owned(),
        "learning_rate = 0.00025".to_owned(),
    ];
    let overrides: Vec<&str> = overrides.iter().map(String::as_str).collect();
    let cfg = Config::for_env("CartPole-v1", &overrides).expect("config");
    let obs = Space::Box(BoxSpace::uniform(0.0, 1.0, vec![OBS]).expect("box"));
    let actions = Space::Discrete { n: 4, start: 0 };
    let net = || QNetwork::new(&obs, &actions, &cfg.model, true, DeviceKind::Cpu).expect("network");
    let mut dqn = Dqn::new(net(), net(), &cfg.optimizer, &cfg.off_policy).expect("dqn");

    // A full ring of one-hot-like observations, as a gridworld's planes.
    let layout = TransitionLayout::floats(OBS, 1);
    let w = layout.row_words();
    let mut rows = vec![0.0f32; CAPACITY * w];
    for (i, row) in rows.chunks_exact_mut(w).enumerate() {
        let plane = |shift: usize| -> Vec<f32> {
            (0..OBS)
                .map(|k| f32::from(u8::from((i * 7 + k * shift) % 5 == 0)))
                .collect()
        };
        layout.write(
            row,
            &plane(13),
            &[(i % 4) as f32],
            (i % 3) as f32 * 0.1,
            0.97,
            &plane(3),
        );
    }
    let ring = ReplayRing::create(CAPACITY, w, None).expect("ring");
    ring.insert(&rows, None).expect("insert");
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(1);
    let (mut indices, mut sampled) = (Vec::new(), vec![0.0f32; BATCH * w]);

    let calls = (steps / 10).max(1);
    let (median, min) = time(calls, || {
        ring.sample_uniform(BATCH, |m| rng.random_range(0..m), &mut indices, &mut sampled);
    });
    println!("sample {BATCH} rows: median {median:.0} µs, fastest {min:.0} µs");
    let (median, min) = time(calls, || {
        Transitions::from_rows(&sampled, &layout, tch::Device::Cpu).expect("batch");
    });
    println!("tensors of them: median {median:.0} µs, fastest {min:.0} µs");
    let batch = Transitions::from_rows(&sampled, &layout, tch::Device::Cpu).expect("batch");
    for _ in 0..20 {
        dqn.train(&batch, None).expect("step");
    }
    let (median, min) = time(calls, || {
        dqn.train(&batch, None).expect("step");
    });
    println!("DQN step ({precision}): median {median:.0} µs, fastest {min:.0} µs");
}
