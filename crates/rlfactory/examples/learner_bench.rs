//! Learner step time: rlfactory's APPO learner against the same PPO step written directly on
//! libtorch (same network 4→64→64 actor and critic, tanh; batch 1024; Adam; gradient clipping).
//!
//! `cargo run --release -p rlfactory --example learner_bench -- [--json] [--steps N] [--only raw|1|10|products]`
//!
//! `products` times the step's matrix products alone, in float32 and in bfloat16: each layer's forward product
//! and its backward ones (the weight's gradient, and the input's for every layer but the first), the arithmetic
//! floor of the step on this machine (its FLOPs and the products' rate are printed).
//!
//! `--only` times one of them (raw libtorch, rlfactory with 1 or 10 epochs per dataset, the products) and
//! `--steps` sets how many timed steps (200): `scripts/bench_learner.sh` runs each under
//! callgrind with 0 and N steps, so that the difference counts the instructions of N steps alone,
//! a figure that the machine's load does not move.

use std::time::Instant;

use rlf_env::EnvRegistry;
use rlfactory::algo::appo::{Appo, Dataset};
use rlfactory::config::Config;
use rlfactory::model::ActorCritic;
use tch::nn::{self, OptimizerConfig};
use tch::{Kind, Tensor};

const BATCH: usize = 1024;
const SEQ: usize = 32;
const WARMUP: usize = 20;

fn dataset(obs_dim: usize) -> Dataset {
    let n = BATCH;
    let column = |v: Vec<f32>| Tensor::from_slice(&v);
    let obs: Vec<f32> = (0..n)
        .flat_map(|i| (0..obs_dim).map(move |k| ((i * 7 + k * 13) % 17) as f32 / 17.0 - 0.5))
        .collect();
    let terminated = (0..n).map(|i| f32::from(u8::from(i % 97 == 0))).collect();
    let d = obs_dim as i64;
    Dataset {
        num_sequences: n / SEQ,
        seq_len: SEQ,
        obs: column(obs).reshape([-1, d]),
        actions: column((0..n).map(|i| (i % 2) as f32).collect()).reshape([-1, 1]),
        log_probs: column(vec![-std::f32::consts::LN_2; n]),
        values: column(vec![0.1; n]),
        rewards: column(vec![1.0; n]),
        terminated: column(terminated),
        truncated: column(vec![0.0; n]),
        valid: column(vec![1.0; n]),
        has_final: column(vec![0.0; n]),
        final_obs: Tensor::zeros([n as i64, d], (Kind::Float, tch::Device::Cpu)),
        next_obs: Tensor::zeros([(n / SEQ) as i64, d], (Kind::Float, tch::Device::Cpu)),
        next_valid: Tensor::ones([(n / SEQ) as i64], (Kind::Float, tch::Device::Cpu)),
        versions: vec![0; n],
        states: None,
    }
}

/// One PPO step written directly on libtorch.
struct Raw {
    actor: nn::Sequential,
    critic: nn::Sequential,
    opt: nn::Optimizer,
    obs: Tensor,
    actions: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    returns: Tensor,
}

impl Raw {
    fn new(obs_dim: i64) -> anyhow::Result<Self> {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let mlp = |p: nn::Path<'_>, out: i64| {
            nn::seq()
                .add(nn::linear(&p / "l0", obs_dim, 64, Default::default()))
                .add_fn(|x| x.tanh())
                .add(nn::linear(&p / "l1", 64, 64, Default::default()))
                .add_fn(|x| x.tanh())
                .add(nn::linear(&p / "out", 64, out, Default::default()))
        };
        let actor = mlp(vs.root() / "actor", 2);
        let critic = mlp(vs.root() / "critic", 1);
        let opt = nn::Adam::default().build(&vs, 3e-4)?;
        let n = BATCH as i64;
        Ok(Self {
            actor,
            critic,
            opt,
            obs: Tensor::randn([n, obs_dim], (Kind::Float, tch::Device::Cpu)),
            actions: Tensor::randint(2, [n, 1], (Kind::Int64, tch::Device::Cpu)),
            old_log_probs: Tensor::full([n], -std::f64::consts::LN_2, (Kind::Float, tch::Device::Cpu)),
            advantages: Tensor::randn([n], (Kind::Float, tch::Device::Cpu)),
            returns: Tensor::randn([n], (Kind::Float, tch::Device::Cpu)),
        })
    }

    fn step(&mut self) {
        use tch::nn::Module;
        let logits = self.actor.forward(&self.obs);
        let log_probs_all = logits.log_softmax(-1, Kind::Float);
        let log_probs = log_probs_all.gather(-1, &self.actions, false).squeeze_dim(-1);
        let entropy = -(log_probs_all.exp() * &log_probs_all).sum_dim_intlist(-1, false, Kind::Float);
        let values = self.critic.forward(&self.obs).squeeze_dim(-1);
        let adv = (&self.advantages - self.advantages.mean(Kind::Float)) / (self.advantages.std(true) + 1e-8);
        let ratio = (&log_probs - &self.old_log_probs).exp();
        let policy = -(&adv * &ratio)
            .minimum(&(&adv * ratio.clamp(0.8, 1.2)))
            .mean(Kind::Float);
        let value = (values - &self.returns).square().mean(Kind::Float) * 0.5;
        let loss = policy + value * 0.5 - entropy.mean(Kind::Float) * 0.003;
        self.opt.zero_grad();
        loss.backward();
        self.opt.clip_grad_norm(0.5);
        self.opt.step();
    }
}

/// The matrix products of one SGD step of the bench's actor and critic (obs_dim → 64 → 64 → 2 and → 1), alone.
struct Products {
    /// Per layer: its input `[B, in]`, its weight `[out, in]`, the gradient of its output `[B, out]`, and whether
    /// the input's gradient is computed (not for the observation).
    layers: Vec<(Tensor, Tensor, Tensor, bool)>,
}

impl Products {
    fn new(obs_dim: i64, kind: Kind) -> Self {
        let n = BATCH as i64;
        let opts = (kind, tch::Device::Cpu);
        let layers = [2, 1]
            .into_iter()
            .flat_map(|out| [(obs_dim, 64), (64, 64), (64, out)])
            .map(|(i, o)| {
                (
                    Tensor::randn([n, i], opts),
                    Tensor::randn([o, i], opts),
                    Tensor::randn([n, o], opts),
                    i != obs_dim,
                )
            })
            .collect();
        Self { layers }
    }

    /// Floating-point operations of one step (2 per multiply-add).
    fn flops(&self) -> f64 {
        self.layers
            .iter()
            .map(|(x, w, _, input_grad)| {
                let (b, [o, i]) = (x.size()[0], [w.size()[0], w.size()[1]]);
                (2 * b * i * o) as f64 * if *input_grad { 3.0 } else { 2.0 }
            })
            .sum()
    }

    fn step(&self) {
        for (x, w, dy, input_grad) in &self.layers {
            let _y = x.mm(&w.tr());
            let _dw = dy.tr().mm(x);
            if *input_grad {
                let _dx = dy.mm(w);
            }
        }
    }
}

fn time_per_step(
    mut f: impl FnMut() -> anyhow::Result<()>,
    steps: usize,
    steps_per_call: usize,
) -> anyhow::Result<f64> {
    for _ in 0..WARMUP {
        f()?;
    }
    let start = Instant::now();
    for _ in 0..steps {
        f()?;
    }
    Ok(start.elapsed().as_secs_f64() / (steps.max(1) * steps_per_call) as f64)
}

/// The value after `flag` on the command line.
fn arg(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> anyhow::Result<()> {
    // As the rlfactory binary does, for both the raw and our steps.
    rlf_shm::process::keep_freed_memory();
    let json = std::env::args().any(|a| a == "--json");
    let steps: usize = arg("--steps").map_or(Ok(200), |s| s.parse())?;
    let only = arg("--only");
    let wanted = |what: &str| only.as_deref().is_none_or(|o| o == what);
    tch::set_num_threads(1);
    tch::manual_seed(0);
    let env = EnvRegistry::with_builtin().make("CartPole-v1")?;
    let obs_dim = env.observation_space().flat_dim();

    let mut raw = Raw::new(obs_dim as i64)?;
    let raw_step = if wanted("raw") {
        time_per_step(
            || {
                raw.step();
                Ok(())
            },
            steps,
            1,
        )?
    } else {
        f64::NAN
    };

    let mut products = Vec::new();
    if wanted("products") {
        for (name, kind) in [("float32", Kind::Float), ("bfloat16", Kind::BFloat16)] {
            let p = Products::new(obs_dim as i64, kind);
            let s = time_per_step(
                || {
                    p.step();
                    Ok(())
                },
                steps,
                1,
            )?;
            products.push((name, p.flops(), s));
        }
    }

    let data = dataset(obs_dim);
    let mut results = Vec::new();
    for epochs in [1usize, 10] {
        if !wanted(&epochs.to_string()) {
            continue;
        }
        let cfg = Config::for_env(
            "CartPole-v1",
            &[
                "batch_size = 1024",
                "num_batches_per_epoch = 1",
                &format!("num_epochs = {epochs}"),
                "ppo_clip_value = 1.0",
                "exploration_loss_coeff = 0.003",
            ],
        )?;
        let model = ActorCritic::new(
            env.observation_space(),
            env.action_space(),
            &cfg.model,
            cfg.run.device,
        )?;
        let mut appo = Appo::new(model, &cfg, u64::MAX)?;
        let step = time_per_step(
            || appo.train(&data).map(drop).map_err(Into::into),
            steps / epochs,
            epochs,
        )?;
        results.push((epochs, step));
    }

    if json {
        let ours: Vec<String> = results
            .iter()
            .map(|(e, s)| {
                format!(
                    "{{\"num_epochs\": {e}, \"step_us\": {:.1}, \"overhead_pct\": {:.1}}}",
                    s * 1e6,
                    (s / raw_step - 1.0) * 100.0
                )
            })
            .collect();
        let products: Vec<String> = products
            .iter()
            .map(|(kind, flops, s)| {
                format!(
                    "{{\"kind\": \"{kind}\", \"flops\": {flops}, \"step_us\": {:.1}, \"gflops\": {:.1}}}",
                    s * 1e6,
                    flops / s / 1e9
                )
            })
            .collect();
        println!(
            "{{\"batch\": {BATCH}, \"raw_libtorch_step_us\": {:.1}, \"rlfactory\": [{}], \"products\": [{}]}}",
            raw_step * 1e6,
            ours.join(", "),
            products.join(", ")
        );
    } else {
        println!("batch {BATCH}: raw libtorch PPO step {:.1} µs", raw_step * 1e6);
        for (e, s) in &results {
            println!(
                "rlfactory Appo::train, {e} epoch(s) per dataset: {:.1} µs per SGD step ({:+.1}% vs raw)",
                s * 1e6,
                (s / raw_step - 1.0) * 100.0
            );
        }
        for (kind, flops, s) in &products {
            println!(
                "the step's matrix products alone, {kind}: {:.1} µs ({:.1} MFLOP, {:.1} GFLOP/s)",
                s * 1e6,
                flops / 1e6,
                flops / s / 1e9
            );
        }
    }
    Ok(())
}
