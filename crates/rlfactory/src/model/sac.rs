//! Soft actor-critic's networks (`--algo sac`, `Box` actions):
//! - [`SacActor`]: an MLP encoder, then the mean and log standard deviation of a diagonal Gaussian whose sample is
//!   squashed by tanh, so each action value lies in [−1, 1] (the env's bounds are reached by scaling,
//!   [`crate::env::ActionMapper`]); the log standard deviation is clamped to [−20, 2] (Stable-Baselines3's bounds).
//!   What the actors run and the learner publishes.
//! - [`TwinQ`]: two Q-networks over the observation and the action side by side, for the clipped double-Q target.
//!
//! As a [`Policy`] the actor samples (its mean, squashed, when `deterministic`); before `--learning_starts` the
//! inference worker sets its exploration to 1 and it acts uniformly at random in [−1, 1], as Stable-Baselines3 does.

use std::f64::consts::{LN_2, PI};

use rand::RngExt;
use rlf_env::Space;
use tch::{nn, Kind, Tensor};

use super::encoder::{linear, Encoder};
use super::weights::{rows_tensor, to_vec, Variables};
use super::{ActOutput, Draws, Policy};
use crate::config::{DeviceKind, ModelConfig};
use crate::error::{Result, RlfError};

/// The log standard deviation's bounds.
const LOG_STD_MIN: f64 = -20.0;
const LOG_STD_MAX: f64 = 2.0;

fn torch_device(device: DeviceKind) -> tch::Device {
    match device {
        DeviceKind::Cpu => tch::Device::Cpu,
        DeviceKind::Gpu => tch::Device::Cuda(0),
    }
}

/// The squashed-Gaussian actor of SAC.
pub struct SacActor {
    vars: Variables,
    obs_dim: i64,
    action_dim: i64,
    encoder: Encoder,
    mean: nn::Linear,
    log_std: nn::Linear,
    /// The probability of a uniformly random action instead of a sample ([`Policy::set_exploration`]).
    uniform: f64,
    /// The action draws ([`Draws`]): the squashed Gaussian's noise and the uniform exploration's.
    draws: Draws,
}

impl std::fmt::Debug for SacActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SacActor")
            .field("obs_dim", &self.obs_dim)
            .field("action_dim", &self.action_dim)
            .field("uniform", &self.uniform)
            .finish_non_exhaustive()
    }
}

impl SacActor {
    /// The actor for an observation space and a `Box` action space (its variables are named `actor.…`).
    pub fn new(
        observation_space: &Space,
        action_space: &Space,
        cfg: &ModelConfig,
        device: DeviceKind,
    ) -> Result<Self> {
        let Space::Box(_) = action_space else {
            return Err(RlfError::UnsupportedSpace(format!(
                "SAC needs a Box action space, not {action_space} (use DQN or APPO for others)"
            )));
        };
        let action_dim = action_space.flat_dim() as i64;
        let obs_dim = observation_space.flat_dim() as i64;
        if obs_dim == 0 || action_dim == 0 {
            return Err(RlfError::UnsupportedSpace(format!(
                "SAC over observation space {observation_space} and action space {action_space}: one is empty"
            )));
        }
        let vs = nn::VarStore::new(torch_device(device));
        let root = vs.root() / "actor";
        let (encoder, hidden) = Encoder::new(&(&root / "encoder"), observation_space, obs_dim, cfg)?;
        let init = cfg.policy_initialization;
        let mean = linear(&root / "mean", hidden, action_dim, init, 0.01);
        let log_std = linear(&root / "log_std", hidden, action_dim, init, 0.01);
        Ok(Self {
            vars: Variables::of(vs),
            obs_dim,
            action_dim,
            encoder,
            mean,
            log_std,
            uniform: 0.0,
            draws: Draws::from_torch(),
        })
    }

    /// The device the network lives on.
    pub fn device(&self) -> tch::Device {
        self.vars.device()
    }

    /// Values per action.
    pub fn action_dim(&self) -> i64 {
        self.action_dim
    }

    /// The Gaussian's mean and clamped log standard deviation, `[n, action_dim]` each, before the squash.
    pub fn gaussian(&self, obs: &Tensor) -> (Tensor, Tensor) {
        let h = self.encoder.forward(obs);
        let log_std = h.apply(&self.log_std).clamp(LOG_STD_MIN, LOG_STD_MAX);
        (h.apply(&self.mean), log_std)
    }

    /// A reparameterised sample `a = tanh(μ + σ ε)`, `[n, action_dim]`, and its log-density `[n]`:
    /// the Gaussian's, minus `Σ log(1 − tanh² u)` (the squash's change of variables), computed as
    /// `2 (log 2 − u − softplus(−2u))`, which stays finite where tanh saturates.
    pub fn sample(&mut self, obs: &Tensor) -> (Tensor, Tensor) {
        let (mean, log_std) = self.gaussian(obs);
        let noise = self.draws.normal_like(&mean);
        let u = &mean + log_std.exp() * &noise;
        let gaussian = (noise.square() * -0.5 - &log_std - 0.5 * (2.0 * PI).ln()).sum_dim_intlist(
            -1,
            false,
            Kind::Float,
        );
        let squash = ((-&u - (&u * -2.0).softplus() + LN_2) * 2.0).sum_dim_intlist(-1, false, Kind::Float);
        (u.tanh(), gaussian - squash)
    }
}

impl Policy for SacActor {
    /// Samples (or squashes the mean when `deterministic`); with exploration `p`, each row is instead a uniformly
    /// random point of [−1, 1]^d with probability `p`. Values are 0: the actor has no critic of its own.
    fn act(&mut self, obs: &[f32], deterministic: bool) -> Result<ActOutput> {
        let obs = rows_tensor(obs, self.obs_dim, self.device())?;
        let n = obs.size()[0] as usize;
        let (actions, log_probs) = tch::no_grad(|| {
            if deterministic {
                let (mean, _) = self.gaussian(&obs);
                Ok::<_, RlfError>((to_vec(&mean.tanh())?, vec![0.0; n]))
            } else {
                let (a, log_prob) = self.sample(&obs);
                Ok((to_vec(&a)?, to_vec(&log_prob)?))
            }
        })?;
        let mut out = ActOutput {
            actions,
            log_probs,
            values: vec![0.0; n],
        };
        if !deterministic && self.uniform > 0.0 {
            let d = self.action_dim as usize;
            let uniform_log_prob = -(d as f64 * LN_2) as f32;
            for (row, lp) in out.actions.chunks_exact_mut(d).zip(&mut out.log_probs) {
                if self.draws.rng().random::<f64>() < self.uniform {
                    row.iter_mut()
                        .for_each(|a| *a = self.draws.rng().random_range(-1.0f32..=1.0));
                    *lp = uniform_log_prob;
                }
            }
        }
        Ok(out)
    }

    /// The generator of the noise and the uniform exploration.
    fn sampler_state(&self) -> Option<Vec<u8>> {
        Some(self.draws.state())
    }

    fn load_sampler_state(&mut self, state: &[u8]) -> Result<()> {
        self.draws.load(state)
    }

    fn obs_dim(&self) -> usize {
        self.obs_dim as usize
    }

    fn action_dim(&self) -> usize {
        self.action_dim as usize
    }

    fn variables(&self) -> &Variables {
        &self.vars
    }

    fn variables_mut(&mut self) -> &mut Variables {
        &mut self.vars
    }

    fn set_exploration(&mut self, epsilon: f64) {
        self.uniform = epsilon.clamp(0.0, 1.0);
    }
}

/// Twin Q-networks `Q₁, Q₂ : (observation, action) → ℝ`, each an MLP over the two side by side.
pub struct TwinQ {
    vars: Variables,
    q: [(Encoder, nn::Linear); 2],
}

impl std::fmt::Debug for TwinQ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwinQ")
            .field("variables", &self.vars)
            .finish_non_exhaustive()
    }
}

impl TwinQ {
    /// Two Q-networks over `obs_dim` observation and `action_dim` action values (variables `critic.q1.…` and
    /// `critic.q2.…`).
    pub fn new(obs_dim: i64, action_dim: i64, cfg: &ModelConfig, device: DeviceKind) -> Result<Self> {
        let vs = nn::VarStore::new(torch_device(device));
        let root = vs.root() / "critic";
        let one = |name: &str| {
            let path = &root / name;
            let (encoder, hidden) = Encoder::mlp_only(&path, obs_dim + action_dim, cfg);
            let head = linear(&path / "value", hidden, 1, cfg.policy_initialization, 1.0);
            (encoder, head)
        };
        let q = [one("q1"), one("q2")];
        Ok(Self {
            vars: Variables::of(vs),
            q,
        })
    }

    /// `Q₁(s, a)` and `Q₂(s, a)`, `[n]` each, for observations `[n, obs_dim]` and actions `[n, action_dim]`.
    pub fn q_values(&self, obs: &Tensor, actions: &Tensor) -> (Tensor, Tensor) {
        let x = Tensor::cat(&[obs, actions], -1);
        let [q1, q2] = &self.q;
        let value = |(encoder, head): &(Encoder, nn::Linear)| encoder.forward(&x).apply(head).squeeze_dim(-1);
        (value(q1), value(q2))
    }

    /// Its variables (`critic.q1.…`, `critic.q2.…`).
    pub fn variables(&self) -> &Variables {
        &self.vars
    }

    /// Its variables, to replace.
    pub fn variables_mut(&mut self) -> &mut Variables {
        &mut self.vars
    }

    /// Copies `other` (of the same architecture) into this one, or moves `tau` of the way towards it.
    pub fn follow(&mut self, other: &TwinQ, tau: f64) -> Result<()> {
        self.vars.follow(&other.vars, tau)
    }
}

#[cfg(test)]
mod tests {
    use rlf_env::BoxSpace;

    use super::*;
    use crate::config::Config;

    fn unit_box(size: usize) -> Space {
        Space::Box(BoxSpace::uniform(-1.0, 1.0, vec![size]).expect("box"))
    }

    /// The squashed sample's log-density matches a direct computation (Gaussian density of `atanh(a)` minus
    /// `log(1 − a²)`); actions stay in [−1, 1]; deterministic acting is `tanh(μ)`; exploration 1 acts uniformly.
    #[test]
    fn squashed_gaussian_log_density_and_acting() {
        tch::manual_seed(0);
        let cfg = Config::for_env("Pendulum-v1", &[]).expect("config").model;
        let mut actor = SacActor::new(&unit_box(3), &unit_box(2), &cfg, DeviceKind::Cpu).expect("actor");
        let obs: Vec<f32> = (0..3 * 64).map(|i| ((i * 37) % 11) as f32 / 5.5 - 1.0).collect();
        let t = rows_tensor(&obs, 3, tch::Device::Cpu).expect("rows");
        let (a, log_prob) = actor.sample(&t);
        let (mean, log_std) = actor.gaussian(&t);
        let a64 = a.to_kind(Kind::Double);
        let u: Tensor = ((a64.ones_like() + &a64) / (a64.ones_like() - &a64)).log() * 0.5;
        let std = log_std.to_kind(Kind::Double).exp();
        let z = (&u - mean.to_kind(Kind::Double)) / &std;
        let direct =
            (z.square() * -0.5 - std.log() - 0.5 * (2.0 * PI).ln() - (a64.ones_like() - a64.square()).log())
                .sum_dim_intlist(-1, false, Kind::Double);
        let diff = f64::try_from((direct - log_prob.to_kind(Kind::Double)).abs().max()).expect("max");
        assert!(diff < 1e-3, "{diff}");
        let out = actor.act(&obs, true).expect("act");
        let want = to_vec(&mean.tanh()).expect("mean");
        assert_eq!(out.actions, want);
        actor.set_exploration(1.0);
        let out = actor.act(&obs, false).expect("act");
        assert!(out.actions.iter().all(|a| (-1.0..=1.0).contains(a)));
        let spread = out.actions.iter().map(|a| a.abs()).sum::<f32>() / out.actions.len() as f32;
        assert!((spread - 0.5).abs() < 0.1, "uniform actions' mean |a| {spread}");
        assert!(out
            .log_probs
            .iter()
            .all(|&lp| (lp + 2.0 * LN_2 as f32).abs() < 1e-6));
    }

    /// A Discrete action space is refused with a line naming it.
    #[test]
    fn a_discrete_action_space_is_refused() {
        let cfg = Config::for_env("Pendulum-v1", &[]).expect("config").model;
        let err = SacActor::new(
            &unit_box(3),
            &Space::Discrete { n: 2, start: 0 },
            &cfg,
            DeviceKind::Cpu,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("Box action space"), "{err}");
    }
}
