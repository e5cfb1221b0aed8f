//! APPO: asynchronous PPO with GAE or V-trace, read top to bottom.
//!
//! Implementation details, in the order they happen on each training dataset:
//! 1. The dataset is `S` sequences of `T` steps (one env's trajectory each), recorded with the
//!    policy version that acted ([`Dataset`]): tensors that view the rollout workers' shared
//!    trajectory slots, time-major as the slots are.
//! 2. Observation statistics (when `--normalize_input`) are updated with the dataset's observations.
//! 3. Bootstrap values are computed with the current network: for the observation after the last
//!    step of each sequence, and for the last observation of every truncated episode (a time
//!    limit is not a terminal state: its successor keeps its value). A terminated step's successor
//!    is worth 0.
//! 4. Each transition's policy lag (`learner version − acting version`) is measured; transitions
//!    lagging more than `--max_policy_lag`, and those the slot marks invalid (an inactive agent),
//!    are masked out of every loss (`train/valids_fraction`).
//! 5. Without V-trace: GAE(γ, λ) advantages from the behaviour values ([`gae`]); value targets are
//!    advantages + behaviour values. In a sequence with invalid steps (a multi-agent env's agent
//!    not acting), advantages run over the steps it acted in ([`ActedSteps`]): each bootstraps
//!    from the agent's next acted step, with the rewards it received in between folded in.
//!    Return statistics (when `--normalize_returns`) are updated
//!    with the targets, and the critic learns targets in normalised units.
//! 6. `--num_epochs` passes; each shuffles the dataset (transitions for GAE, whole sequences for
//!    V-trace) into `--num_batches_per_epoch` minibatches of `--batch_size` transitions. For GAE,
//!    a dataset with invalid steps is shuffled over its valid transitions only, into as many
//!    minibatches of fewer rows.
//! 7. With V-trace, targets and advantages are computed per minibatch from the current network's
//!    values and the importance ratios π/μ, truncated at ρ̄ and c̄ ([`vtrace`]), over the acted
//!    steps as in 5.
//! 8. Advantages are normalised per minibatch (`--normalize_advantage`).
//! 9. Policy loss: PPO's clipped surrogate, ratio clipped to `[1 − ε, 1 + ε]` (`--ppo_clip_ratio`).
//! 10. Value loss: ½ max((V − target)², (V_clipped − target)²), where V_clipped stays within
//!     `--ppo_clip_value` of the behaviour value (unclipped when that is 0), times
//!     `--value_loss_coeff`.
//! 11. Entropy bonus: `− --exploration_loss_coeff × entropy`. With `--lookahead_coeff` (a board game whose env has
//!     its rules as a model, [`PlyModel`]), plus that weight times the cross-entropy of the policy against a target
//!     computed once per dataset ([`Appo::lookahead_targets`]): the softmax of each legal move's value looked up in
//!     the rules, as AlphaZero's self-play trains its policy towards its search (a search one move deep, and with
//!     `--lookahead_plies 2` the opponent's replies that end the game, where a move that lets the opponent win takes
//!     none of the target while another does not; a win on offer takes the whole target, and its row leaves step 9's
//!     term to the lookahead: the rules know the outcome of every move there, and the sampled return only adds noise
//!     that held the win's probability down).
//! 12. Gradients are clipped to a global norm of `--max_grad_norm` ([`clip_grad_norm`](super::adam::clip_grad_norm)), then one
//!     Adam step ([`Adam`], whose moments go into checkpoints); the policy version increases by one
//!     per step.
//! 13. The learning rate follows `--lr_schedule` ([`LrSchedule`]): constant, linear decay to 0 at
//!     `--train_for_env_steps`, or KL-adaptive per minibatch or per epoch.
//! 14. Recurrent networks (`--use_rnn`): each step's observation goes through the recurrent core from the state
//!     the slot recorded for it ([`Dataset::states`]). Bootstrap values (3) come from unrolling each sequence from
//!     its first recorded state with the current weights. Minibatches (6) are whole chunks of `--recurrence` steps,
//!     in a random order, each unrolled from its first step's recorded state, the state zeroed after a step that
//!     ended its episode (as acting did), with invalid steps masked rather than dropped; backpropagation through
//!     time stops at the chunk's start ([`ActorCritic::forward_sequences`]). With V-trace a chunk is a sequence.
//! 15. Written out by hand: for the networks [`ActorCritic::dense`] covers (float32 MLP encoders, no recurrent core,
//!     one categorical action, masked or not, or a Gaussian of state-independent standard deviations) up to
//!     `HAND_WRITTEN_MAX_WIDTH` units wide, and GAE, each minibatch's forward pass, loss (8–11) and gradients are
//!     computed in Rust over Adam's flat parameters (`appo_dense`), matching autograd's, and
//!     Adam steps from them (12); any other network goes through autograd.
//! 16. Metrics carry Sample Factory's names: `train/policy_loss`, `train/value_loss`,
//!     `train/exploration_loss`, `train/entropy`, `train/kl_divergence`, `train/grad_norm`,
//!     `train/fraction_clipped`, `train/adv_mean`, `train/adv_std`, `train/version_diff_min`,
//!     `train/version_diff_avg`, `train/version_diff_max`, `train/valids_fraction`, `train/lr`, `train/loss`.

use std::collections::BTreeMap;
use std::sync::Arc;

use rlf_env::PlyModel;

use tch::{Kind, Tensor};

use super::adam::Adam;
use super::appo_dense::{self, DenseDataset};
use super::{OnPolicyAlgo, TrainingState};
use crate::config::{AppoConfig, Config, LearningConfig, LrScheduleKind, OptimizerConfig};
use crate::error::{Result, RlfError};
use crate::model::{
    ActorCritic, DenseActorCritic, DenseHead, Distribution, Draws, NamedTensor, Policy,
    HAND_WRITTEN_MAX_WIDTH,
};
use crate::pbt::Hyper;

/// APPO to the rest of the crate: an actor-critic acts; any action space is learned.
pub struct AppoAlgorithm;

impl super::Algorithm for AppoAlgorithm {
    fn name(&self) -> &'static str {
        "appo"
    }

    fn learns_from_replay(&self) -> bool {
        false
    }

    /// APPO takes every setting its learner reads; the config's own checks cover them.
    fn check_config(&self, _cfg: &Config) -> Result<()> {
        Ok(())
    }

    fn acting_network(
        &self,
        observation_space: &rlf_env::Space,
        action_space: &rlf_env::Space,
        cfg: &Config,
    ) -> Result<Box<dyn Policy>> {
        Ok(Box::new(ActorCritic::new(
            observation_space,
            action_space,
            &cfg.model,
            cfg.run.device,
        )?))
    }

    fn check_actions(&self, _env: &str, _action_spaces: &[rlf_env::Space]) -> Result<()> {
        Ok(())
    }

    fn on_policy_learner(
        &self,
        observation_space: &rlf_env::Space,
        action_space: &rlf_env::Space,
        cfg: &Config,
        seed: &dyn Fn(),
        rules: Option<Arc<dyn PlyModel>>,
    ) -> Result<Option<Box<dyn OnPolicyAlgo>>> {
        seed();
        let model = ActorCritic::new(observation_space, action_space, &cfg.model, cfg.run.device)?;
        let appo = Appo::new(model, cfg, cfg.run.train_for_env_steps)?;
        Ok(Some(Box::new(match rules {
            Some(rules) if cfg.appo.lookahead_coeff > 0.0 => appo.looking_ahead(rules),
            _ => appo,
        })))
    }

    fn off_policy_learner(
        &self,
        _observation_space: &rlf_env::Space,
        _action_space: &rlf_env::Space,
        _cfg: &Config,
        _seed: &dyn Fn(),
    ) -> Result<Option<Box<dyn super::OffPolicyAlgo>>> {
        Ok(None)
    }
}

// ---------------------------------------------------------------------------------------------
// 1. The data

/// A training dataset: `num_sequences` sequences of `seq_len` steps, time-major: row
/// `t * num_sequences + s` is step `t` of sequence `s` (as in the trajectory slots, which the
/// tensors view without a copy when the dataset is one slot).
#[derive(Debug)]
pub struct Dataset {
    /// Number of sequences `S`.
    pub num_sequences: usize,
    /// Steps per sequence `T`.
    pub seq_len: usize,
    /// Observations before each step, `[S * T, obs_dim]`.
    pub obs: Tensor,
    /// Raw actions, `[S * T, action_dim]`.
    pub actions: Tensor,
    /// Log-probabilities under the acting policy, `[S * T]`.
    pub log_probs: Tensor,
    /// Values under the acting policy, `[S * T]`.
    pub values: Tensor,
    /// Rewards, `[S * T]`.
    pub rewards: Tensor,
    /// 1 where the step ended its episode in a terminal state, `[S * T]`.
    pub terminated: Tensor,
    /// 1 where the step ended its episode by truncation, `[S * T]`.
    pub truncated: Tensor,
    /// 1 where the step is the agent's own experience, 0 where it is masked out of every loss
    /// (an inactive agent), `[S * T]`.
    pub valid: Tensor,
    /// 1 where `final_obs` holds the last observation of a truncated episode, `[S * T]`.
    pub has_final: Tensor,
    /// The last observation of each truncated episode, `[S * T, obs_dim]`.
    pub final_obs: Tensor,
    /// The observation after the last step of each sequence, `[S, obs_dim]`.
    pub next_obs: Tensor,
    /// 1 where the sequence's agent acts in the step after the last (`next_obs` is one of its
    /// decision points: always for a single-agent env), `[S]`.
    pub next_valid: Tensor,
    /// Policy version that chose each action, `S * T`.
    pub versions: Vec<u64>,
    /// With a recurrent network: the state each step started from when it was acted,
    /// `[S * T, state_dim]` (zero at an episode's first step).
    pub states: Option<Tensor>,
}

impl Dataset {
    /// Number of transitions.
    pub fn len(&self) -> usize {
        self.num_sequences * self.seq_len
    }

    /// Whether the dataset holds no transitions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A 64-bit FNV-1a digest of every field, bit for bit: equal datasets have equal digests, so
    /// two runs can be checked to train on the same data.
    pub fn digest(&self) -> Result<u64> {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |word: u64| {
            for byte in word.to_le_bytes() {
                h = (h ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        eat(self.num_sequences as u64);
        eat(self.seq_len as u64);
        for t in [
            &self.obs,
            &self.actions,
            &self.log_probs,
            &self.values,
            &self.rewards,
            &self.terminated,
            &self.truncated,
            &self.valid,
            &self.has_final,
            &self.final_obs,
            &self.next_obs,
        ]
        .into_iter()
        .chain(&self.states)
        {
            let v = to_vec(t)?;
            eat(v.len() as u64);
            v.iter().for_each(|x| eat(u64::from(x.to_bits())));
        }
        self.versions.iter().for_each(|&v| eat(v));
        Ok(h)
    }
}

/// Sequence `q` of a time-major `[T * S]` array, as a vector of `T` values.
fn sequence<X: Copy>(v: &[X], s: usize, t: usize, q: usize) -> Vec<X> {
    (0..t).map(|j| v[j * s + q]).collect()
}

// ---------------------------------------------------------------------------------------------
// 2. Advantages and targets (per sequence, on plain numbers)

/// GAE(γ, λ) advantages of one sequence.
///
/// `next_values[t]` is the value of the state after step `t`: `V(s_{t+1})` inside an episode,
/// the value of the last observation after a truncation, 0 after termination. `ends[t]` cuts the
/// λ-trace after step `t` (end of an episode).
pub fn gae(
    rewards: &[f32],
    values: &[f32],
    next_values: &[f32],
    ends: &[bool],
    gamma: f32,
    lambda: f32,
) -> Vec<f32> {
    let mut advantages = vec![0.0; rewards.len()];
    let mut next_advantage = 0.0;
    for t in (0..rewards.len()).rev() {
        let delta = rewards[t] + gamma * next_values[t] - values[t];
        let carry = if ends[t] { 0.0 } else { next_advantage };
        next_advantage = delta + gamma * lambda * carry;
        advantages[t] = next_advantage;
    }
    advantages
}

/// The steps of one sequence that an agent acted in (the slots mark them valid), with what
/// happened to it in between folded in: a multi-agent env's agent that waits for its turn, or is
/// out until the next episode, has invalid steps (see `rlf_env::MultiAgentEnv`). Each acted step
/// `t` is one transition up to the agent's next acted step `t'`: its reward is the sum of the
/// rewards the agent received from `t` until `t'` or its episode's end (a turn-based game's loser
/// receives its −1 on the winner's move), its next value is `V` of the state at `t'` (or what
/// `next_values` holds at the step its episode ended: 0 or a truncation's bootstrap; or the
/// sequence's bootstrap when it does not act again in the sequence), and it ends the λ- or
/// c-trace when the episode ended in between. Invalid steps' values never enter, so
/// [`gae`] and [`vtrace`] over these arrays skip them.
///
/// When the agent does not act right after the sequence (a turn-based env's waiting player),
/// `next_obs` is no decision point of its own and cannot bootstrap its last acted step: that
/// step, unless its episode ended after it, is no transition here ([`bootstrap_only`]); its value
/// is the bootstrap of the acted step before it, and the learner masks it out.
#[derive(Debug, Clone, PartialEq)]
pub struct ActedSteps {
    /// Positions of the acted steps in the sequence.
    pub index: Vec<usize>,
    /// The reward of each acted step, with those received until the next one folded in.
    pub rewards: Vec<f32>,
    /// The value after each acted step.
    pub next_values: Vec<f32>,
    /// Whether the agent's episode ended before its next acted step.
    pub ends: Vec<bool>,
    /// The last acted step when it only bootstraps the one before it ([`bootstrap_only`]).
    pub bootstrap_only: Option<usize>,
}

/// The last acted step of a sequence (`valid`, `ends` as [`ActedSteps::new`] takes them) when
/// its agent does not act right after the sequence (`acts_next` false) and its episode did not
/// end after that step: it has no bootstrap of its own.
pub fn bootstrap_only(valid: &[bool], ends: &[bool], acts_next: bool) -> Option<usize> {
    if acts_next {
        return None;
    }
    let last = valid.iter().rposition(|&v| v)?;
    (!ends[last..].iter().any(|&e| e)).then_some(last)
}

impl ActedSteps {
    /// The acted steps of a sequence: `valid[t]` from the slots, `acts_next` whether the agent
    /// acts right after the sequence, the rest as [`gae`] takes them.
    pub fn new(valid: &[bool], rewards: &[f32], next_values: &[f32], ends: &[bool], acts_next: bool) -> Self {
        let n = valid.len();
        let index: Vec<usize> = (0..n).filter(|&t| valid[t]).collect();
        let mut acted = Self {
            index: Vec::with_capacity(index.len()),
            rewards: Vec::with_capacity(index.len()),
            next_values: Vec::with_capacity(index.len()),
            ends: Vec::with_capacity(index.len()),
            bootstrap_only: bootstrap_only(valid, ends, acts_next),
        };
        for (i, &t) in index.iter().enumerate() {
            let until = index.get(i + 1).copied().unwrap_or(n);
            let last = (t..until).find(|&k| ends[k]).unwrap_or(until - 1);
            acted.rewards.push(rewards[t..=last].iter().sum());
            acted.next_values.push(next_values[last]);
            acted.ends.push(ends[last]);
        }
        acted.index = index;
        if acted.bootstrap_only.is_some() {
            acted.index.pop();
            acted.rewards.pop();
            acted.next_values.pop();
            acted.ends.pop();
        }
        acted
    }

    /// `values` at the acted steps.
    pub fn gather(&self, values: &[f32]) -> Vec<f32> {
        self.index.iter().map(|&t| values[t]).collect()
    }
}

/// Discount and truncation levels of [`vtrace`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VtraceParams {
    /// Discount γ.
    pub gamma: f32,
    /// ρ̄: truncation of the importance weights in the targets and advantages.
    pub rho_bar: f32,
    /// c̄: truncation of the trace coefficients.
    pub c_bar: f32,
}

/// V-trace value targets `v_s` and policy-gradient advantages `ρ_s (r_s + γ v_{s+1} − V(x_s))` of
/// one sequence (Espeholt et al. 2018, IMPALA, §4.1), with `ρ_t = min(ρ̄, π/μ)` and
/// `c_t = min(c̄, π/μ)` from `log_rhos = log π − log μ`.
///
/// `values` are the current estimates `V(x_t)`; `next_values` and `ends` are as in [`gae`]
/// (`next_values[t]` is `V(x_{t+1})` inside an episode, which for the last step is the bootstrap).
pub fn vtrace(
    rewards: &[f32],
    values: &[f32],
    next_values: &[f32],
    ends: &[bool],
    log_rhos: &[f32],
    params: VtraceParams,
) -> (Vec<f32>, Vec<f32>) {
    let VtraceParams {
        gamma,
        rho_bar,
        c_bar,
    } = params;
    let n = rewards.len();
    let mut targets = vec![0.0; n];
    let mut advantages = vec![0.0; n];
    let mut correction = 0.0; // v_{t+1} − V(x_{t+1})
    for t in (0..n).rev() {
        let ratio = log_rhos[t].exp();
        let rho = ratio.min(rho_bar);
        let c = ratio.min(c_bar);
        let carry = if ends[t] { 0.0 } else { correction };
        let delta = rho * (rewards[t] + gamma * next_values[t] - values[t]);
        correction = delta + gamma * c * carry;
        targets[t] = values[t] + correction;
        let next_target = next_values[t] + carry; // v_{t+1}, or the bootstrap after an episode end
        advantages[t] = rho * (rewards[t] + gamma * next_target - values[t]);
    }
    (targets, advantages)
}

// ---------------------------------------------------------------------------------------------
// 3. The losses

/// Per-transition inputs of the loss on one minibatch (1-D tensors of equal length).
#[derive(Debug)]
pub struct LossInputs<'a> {
    /// log π(a|s) under the network being trained (with gradient).
    pub log_probs: &'a Tensor,
    /// log μ(a|s) under the acting policy.
    pub old_log_probs: &'a Tensor,
    /// Advantages (normalised here when the config says so).
    pub advantages: &'a Tensor,
    /// Values of the network being trained, normalised units (with gradient).
    pub values: &'a Tensor,
    /// Values of the acting policy, normalised units.
    pub old_values: &'a Tensor,
    /// Value targets, normalised units.
    pub targets: &'a Tensor,
    /// Entropy of the action distribution per transition (with gradient).
    pub entropy: &'a Tensor,
    /// 1 for transitions in the loss, 0 for masked ones (invalid, or too much policy lag).
    pub mask: &'a Tensor,
    /// The transitions of `mask` whose policy-gradient term counts, where that is fewer (the lookahead's rows with
    /// a win on offer leave it out); `None`: all of `mask`'s.
    pub policy_mask: Option<&'a Tensor>,
}

/// The loss terms of one minibatch (scalars).
#[derive(Debug)]
pub struct Losses {
    /// PPO clipped surrogate.
    pub policy: Tensor,
    /// ½ max of the clipped and unclipped squared errors (before the coefficient).
    pub value: Tensor,
    /// Mean entropy.
    pub entropy: Tensor,
    /// `policy + value_loss_coeff × value − exploration_loss_coeff × entropy`.
    pub total: Tensor,
    /// Approximate KL(μ‖π): mean of `(r − 1) − log r` (no gradient).
    pub kl: Tensor,
    /// Fraction of transitions whose ratio was clipped (no gradient).
    pub fraction_clipped: Tensor,
}

fn masked_mean(x: &Tensor, mask: &Tensor, count: &Tensor) -> Tensor {
    (x * mask).sum(Kind::Float) / count
}

/// APPO's loss on one minibatch. `value_clip` is in normalised value units (≤ 0: no clipping).
pub fn losses(inp: &LossInputs<'_>, cfg: &AppoConfig, value_clip: f64) -> Losses {
    let count = inp.mask.sum(Kind::Float).clamp_min(1.0);
    let (policy_mask, policy_count) = match inp.policy_mask {
        Some(m) => (m, m.sum(Kind::Float).clamp_min(1.0)),
        None => (inp.mask, count.shallow_clone()),
    };
    let advantages = if cfg.normalize_advantage {
        let mean = masked_mean(inp.advantages, policy_mask, &policy_count);
        let var = masked_mean(&(inp.advantages - &mean).square(), policy_mask, &policy_count);
        (inp.advantages - mean) / (var.sqrt() + 1e-8)
    } else {
        inp.advantages.shallow_clone()
    };
    let eps = cfg.ppo_clip_ratio;
    let log_ratio = inp.log_probs - inp.old_log_probs;
    let ratio = log_ratio.exp();
    let surrogate = &advantages * &ratio;
    let clipped = &advantages * ratio.clamp(1.0 - eps, 1.0 + eps);
    let policy = masked_mean(&(-surrogate.minimum(&clipped)), policy_mask, &policy_count);

    let error = (inp.values - inp.targets).square();
    let value_error = if value_clip > 0.0 {
        let v_clipped = inp.old_values + (inp.values - inp.old_values).clamp(-value_clip, value_clip);
        error.maximum(&(v_clipped - inp.targets).square())
    } else {
        error
    };
    let value = masked_mean(&value_error, inp.mask, &count) * 0.5;
    let entropy = masked_mean(inp.entropy, inp.mask, &count);
    let total = &policy + &value * cfg.value_loss_coeff - &entropy * cfg.exploration_loss_coeff;
    let (kl, fraction_clipped) = tch::no_grad(|| {
        let kl = masked_mean(&((&ratio - 1.0) - &log_ratio), inp.mask, &count);
        let outside = (&ratio - 1.0).abs().gt(eps).to_kind(Kind::Float);
        (kl, masked_mean(&outside, inp.mask, &count))
    });
    Losses {
        policy,
        value,
        entropy,
        total,
        kl,
        fraction_clipped,
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Gradient clipping and the learning-rate schedule

/// The learning rate over training.
#[derive(Debug, Clone)]
pub struct LrSchedule {
    kind: LrScheduleKind,
    base: f64,
    total_frames: f64,
    kl_threshold: f64,
    lr: f64,
}

/// Bounds of the KL-adaptive learning rate.
const KL_LR_RANGE: (f64, f64) = (1e-6, 1e-2);

impl LrSchedule {
    /// A schedule starting at `base`; linear decay reaches 0 at `total_frames`.
    pub fn new(kind: LrScheduleKind, base: f64, total_frames: u64, kl_threshold: f64) -> Self {
        Self {
            kind,
            base,
            total_frames: total_frames.max(1) as f64,
            kl_threshold,
            lr: base,
        }
    }

    /// The current learning rate.
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// Before a dataset: `frames` steps have been trained on so far (the steps agents acted in, see `Appo`'s
    /// `frames_trained`).
    pub fn on_progress(&mut self, frames: u64) {
        if self.kind == LrScheduleKind::LinearDecay {
            self.lr = self.base * (1.0 - frames as f64 / self.total_frames).max(0.0);
        }
    }

    fn adapt(&mut self, kl: f64) {
        if kl > 2.0 * self.kl_threshold {
            self.lr = (self.lr / 1.5).max(KL_LR_RANGE.0);
        } else if kl < 0.5 * self.kl_threshold {
            self.lr = (self.lr * 1.5).min(KL_LR_RANGE.1);
        }
    }

    /// After a minibatch whose KL divergence was `kl`.
    pub fn on_minibatch(&mut self, kl: f64) {
        if self.kind == LrScheduleKind::KlAdaptiveMinibatch {
            self.adapt(kl);
        }
    }

    /// After an epoch whose mean KL divergence was `kl`.
    pub fn on_epoch(&mut self, kl: f64) {
        if self.kind == LrScheduleKind::KlAdaptiveEpoch {
            self.adapt(kl);
        }
    }

    /// Continues a schedule that was at `lr` when it was saved.
    pub fn resume_at(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// Restarts the schedule from a new base rate (PBT), at `frames` env frames trained on.
    pub fn rebase(&mut self, base: f64, frames: u64) {
        self.base = base;
        self.lr = base;
        self.on_progress(frames);
    }

    /// Whether [`on_minibatch`](Self::on_minibatch) / [`on_epoch`](Self::on_epoch) need the KL.
    pub fn needs_kl(&self) -> bool {
        matches!(
            self.kind,
            LrScheduleKind::KlAdaptiveMinibatch | LrScheduleKind::KlAdaptiveEpoch
        )
    }
}

// ---------------------------------------------------------------------------------------------
// 5. The training step: epochs × minibatches

/// Metrics of one dataset, by Sample Factory's names (`train/...`).
pub type TrainMetrics = BTreeMap<String, f64>;

/// The APPO learner's state: the network, Adam, the schedule and the policy version.
pub struct Appo {
    /// The discount and the minibatch size.
    learning: LearningConfig,
    cfg: AppoConfig,
    optim: OptimizerConfig,
    model: ActorCritic,
    optimizer: Adam,
    schedule: LrSchedule,
    version: u64,
    /// The steps trained on in which an agent acted: a turn-based game's waiting agents' rows count nothing, so that
    /// a move is one step, as the run's budget counts it, and `--lr_schedule linear_decay` reaches 0 at its end.
    frames_trained: u64,
    /// Called after every SGD step (the learner's heartbeat during a long dataset).
    after_step: Option<Box<dyn FnMut() + Send>>,
    /// The minibatches' orders.
    draws: Draws,
    /// The network's layers in Adam's flat parameters when the step is differentiated by hand
    /// ([`appo_dense`](super::appo_dense)); `None` trains through autograd.
    dense: Option<DenseActorCritic>,
    /// The env's rules the lookahead loss looks ahead in (`--lookahead_coeff`, [`Appo::looking_ahead`]).
    rules: Option<Arc<dyn PlyModel>>,
    /// The memory each dataset's observations are laid out in ([`ActorCritic::staged_obs`]), kept from one dataset
    /// to the next.
    staging: Option<Tensor>,
}

impl std::fmt::Debug for Appo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Appo")
            .field("version", &self.version)
            .field("lr", &self.schedule.lr())
            .finish_non_exhaustive()
    }
}

fn tensor_f32(values: &[f32], device: tch::Device) -> Result<Tensor> {
    Ok(Tensor::f_from_slice(values)?.f_to_device(device)?)
}

/// Every value of `t`, flattened.
fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(Vec::<f32>::try_from(
        t.f_to_kind(Kind::Float)?
            .f_to_device(tch::Device::Cpu)?
            .f_reshape([-1])?,
    )?)
}

/// Everything per transition that the minibatches slice.
struct Prepared {
    /// The observations as [`ActorCritic::staged_obs`] lays them out.
    obs: Tensor,
    actions: Tensor,
    old_log_probs: Tensor,
    old_values_norm: Tensor,
    mask: Tensor,
    /// Whether each transition is trained on: valid in the slots and not only a bootstrap, row
    /// order.
    slot_valid: Vec<bool>,
    /// Whether the slots mark each transition valid (its agent acted), row order.
    acted: Vec<bool>,
    /// Whether each sequence's agent acts right after it.
    acts_next: Vec<bool>,
    /// GAE only: advantages and normalised targets.
    advantages: Tensor,
    targets_norm: Tensor,
    /// V-trace only, sequence-major (step `t` of sequence `q` at `q * T + t`): per-step next
    /// values in return units with the in-sequence ones left at 0, whether the next value is a
    /// bootstrap (end of episode or of sequence), rewards and episode ends.
    next_values: Vec<f32>,
    bootstrapped: Vec<bool>,
    rewards: Vec<f32>,
    ends: Vec<bool>,
    /// With the lookahead loss: each row's target distribution over the actions ([`Appo::lookahead_targets`]), and
    /// `mask` without the rows with a win on offer, the rows whose policy-gradient term counts (step 11).
    lookahead: Option<(Tensor, Tensor)>,
    /// Recurrent networks: the states steps started from, 1 where a step ended its episode, and 1
    /// where its agent acted (the slots' valid flags), all in row order.
    states: Option<Tensor>,
    ends_rows: Tensor,
    acted_rows: Tensor,
}

impl super::OnPolicyAlgo for Appo {
    fn train(&mut self, data: &Dataset) -> Result<TrainMetrics> {
        Appo::train(self, data)
    }

    fn policy(&self) -> &dyn Policy {
        &self.model
    }

    fn policy_mut(&mut self) -> &mut dyn Policy {
        &mut self.model
    }

    fn draws(&self) -> &Draws {
        &self.draws
    }

    fn set_draws(&mut self, draws: Draws) {
        self.draws = draws;
    }

    fn set_after_step(&mut self, f: Box<dyn FnMut() + Send>) {
        self.after_step = Some(f);
    }

    fn set_gradient_sync(&mut self, sync: Box<dyn super::adam::GradientSync>) {
        self.optimizer.set_gradient_sync(sync);
    }

    fn finish_sync(&mut self) -> Result<()> {
        self.optimizer.finish_sync()
    }

    fn training_state(&self) -> TrainingState {
        TrainingState {
            version: self.version,
            frames_trained: self.frames_trained,
            lr: self.schedule.lr(),
        }
    }

    fn restore_training_state(&mut self, tensors: &[NamedTensor], state: TrainingState) -> Result<bool> {
        self.version = state.version;
        self.frames_trained = state.frames_trained;
        self.schedule.resume_at(state.lr);
        self.optimizer.set_lr(state.lr);
        self.optimizer.load_state(tensors, state.version)
    }

    fn set_hyper(&mut self, hyper: &Hyper) {
        hyper.apply(&mut self.cfg, &mut self.learning, &mut self.optim);
        self.schedule.rebase(hyper.learning_rate, self.frames_trained);
        self.optimizer.set_lr(self.schedule.lr());
    }

    fn adopt(&mut self, tensors: &[NamedTensor]) -> Result<bool> {
        self.version += 1;
        self.optimizer.load_state(tensors, self.version)
    }

    fn optimizer_state(&self) -> Result<Vec<NamedTensor>> {
        self.optimizer.state()
    }

    fn version(&self) -> u64 {
        self.version
    }
}

impl Appo {
    /// A learner training `model` with Adam as `config`'s APPO, learning and optimiser sections say, for a run of
    /// `total_frames` env frames.
    pub fn new(model: ActorCritic, config: &Config, total_frames: u64) -> Result<Self> {
        let (cfg, optim) = (&config.appo, &config.optimizer);
        let optimizer = Adam::new(model.variables().trainable(), optim.into(), optim.learning_rate)?;
        let parameters = optimizer.values()?.len();
        let dense = model.dense(|t| optimizer.offset_of(t)).filter(|net| {
            !cfg.with_vtrace && net.len() == parameters && net.widest_layer() <= HAND_WRITTEN_MAX_WIDTH
        });
        Ok(Self {
            learning: config.learning.clone(),
            schedule: LrSchedule::new(
                optim.lr_schedule,
                optim.learning_rate,
                total_frames,
                optim.lr_schedule_kl_threshold,
            ),
            cfg: cfg.clone(),
            optim: optim.clone(),
            model,
            optimizer,
            version: 0,
            frames_trained: 0,
            after_step: None,
            draws: Draws::from_torch(),
            dense,
            rules: None,
            staging: None,
        })
    }

    /// The same learner with the lookahead loss over `rules` (the env's model of its moves), weighted by
    /// `--lookahead_coeff` (step 11 of the module doc); it trains through autograd.
    pub fn looking_ahead(self, rules: Arc<dyn PlyModel>) -> Self {
        Self {
            rules: Some(rules),
            dense: None,
            ..self
        }
    }

    /// The lookahead's target distribution of each row of `obs` that `trainable` marks (`[n, actions]`, zeros in the
    /// others; `None` without the lookahead loss): the softmax at `--lookahead_temperature` of each legal move's
    /// value looked up in `rules`, the mover's reward minus, when the game goes on, γ times the value of the position
    /// the opponent then moves in (a zero-sum game's value for the opponent is the mover's negated): the current
    /// critic's, or with `--lookahead_plies 2` the opponent's best reward from a reply that ends the game when that
    /// is higher. A row with a win on offer (a move that ends the game with a positive reward, the rules' rewards
    /// being the game's outcome) puts the whole target on its best winning moves, shared evenly: no continuation is
    /// worth more than γ times a win, and a softmax over values that close would spread the target over every move
    /// a trained critic already counts as won, teaching the policy to put its wins off. Likewise, with two plies, a
    /// move after which a reply of the opponent wins gets nothing while another move does not (the softmax at a
    /// temperature soft enough to spare the other rows the critic's noise would still give a blunder a share).
    pub fn lookahead_targets(&self, obs: &Tensor, trainable: &[bool]) -> Result<Option<Tensor>> {
        Ok(self.lookahead(obs, trainable)?.map(|(targets, _)| targets))
    }

    /// [`Appo::lookahead_targets`] and the rows with a win on offer.
    fn lookahead(&self, obs: &Tensor, trainable: &[bool]) -> Result<Option<(Tensor, Vec<i64>)>> {
        match &self.rules {
            Some(rules) if self.cfg.lookahead_coeff > 0.0 => Ok(Some(self.lookahead_targets_over(
                rules.as_ref(),
                obs,
                trainable,
            )?)),
            _ => Ok(None),
        }
    }

    fn lookahead_targets_over(
        &self,
        rules: &dyn PlyModel,
        obs: &Tensor,
        trainable: &[bool],
    ) -> Result<(Tensor, Vec<i64>)> {
        let (dim, k) = (rules.obs_dim(), rules.num_actions());
        let rows = to_vec(obs)?;
        if rows.len() != trainable.len() * dim {
            return Err(RlfError::Protocol {
                component: "learner",
                message: format!(
                    "the lookahead reads observations of {dim} values; the dataset's rows hold {}",
                    rows.len() / trainable.len().max(1)
                ),
            });
        }
        let mut q = vec![f32::NEG_INFINITY; trainable.len() * k];
        let mut wins = vec![false; q.len()];
        // Moves after which a reply of the opponent wins (looking two plies ahead).
        let mut lost = vec![false; q.len()];
        let (mut next, mut after_reply) = (vec![0.0; dim], vec![0.0; dim]);
        // Each successor's row of `q` and the opponent's best reward from a reply there that ends the game.
        let (mut successors, mut at) = (Vec::new(), Vec::new());
        for r in (0..trainable.len()).filter(|&r| trainable[r]) {
            for a in 0..k {
                if let Some(ply) = rules.ply(&rows[r * dim..(r + 1) * dim], a, &mut next) {
                    q[r * k + a] = ply.reward;
                    wins[r * k + a] = ply.ends && ply.reward > 0.0;
                    if !ply.ends {
                        let ending_reply = match self.cfg.lookahead_plies {
                            1 => f32::NEG_INFINITY,
                            _ => (0..k)
                                .filter_map(|b| rules.ply(&next, b, &mut after_reply))
                                .filter(|reply| reply.ends)
                                .map(|reply| reply.reward)
                                .fold(f32::NEG_INFINITY, f32::max),
                        };
                        lost[r * k + a] = ending_reply > 0.0;
                        successors.extend_from_slice(&next);
                        at.push((r * k + a, ending_reply));
                    }
                }
            }
        }
        if !at.is_empty() {
            let values = to_vec(&self.model.values(&self.model.obs_tensor(&successors)?))?;
            let gamma = self.learning.gamma as f32;
            for (&(i, ending_reply), v) in at.iter().zip(values) {
                q[i] -= gamma * v.max(ending_reply);
            }
        }
        let temperature = self.cfg.lookahead_temperature as f32;
        let mut targets = vec![0.0_f32; q.len()];
        let win_rows = (0..trainable.len() as i64)
            .filter(|&r| wins[r as usize * k..(r as usize + 1) * k].contains(&true))
            .collect();
        for (((qs, won), lose), out) in q
            .chunks_exact(k)
            .zip(wins.chunks_exact(k))
            .zip(lost.chunks_exact(k))
            .zip(targets.chunks_exact_mut(k))
        {
            // A move that loses at once gets nothing while another does not.
            let safe = qs.iter().zip(lose).any(|(&x, &l)| x > f32::NEG_INFINITY && !l);
            let counts = |l: bool| !(safe && l);
            let best = qs
                .iter()
                .zip(lose)
                .filter(|&(_, &l)| counts(l))
                .map(|(&x, _)| x)
                .fold(f32::NEG_INFINITY, f32::max);
            if best == f32::NEG_INFINITY {
                continue;
            }
            let best_win = qs
                .iter()
                .zip(won)
                .filter(|&(_, &w)| w)
                .map(|(&x, _)| x)
                .fold(f32::NEG_INFINITY, f32::max);
            for (((o, &x), &w), &l) in out.iter_mut().zip(qs).zip(won).zip(lose) {
                *o = if best_win > f32::NEG_INFINITY {
                    if w && x == best_win {
                        1.0
                    } else {
                        0.0
                    }
                } else if counts(l) {
                    ((x - best) / temperature).exp()
                } else {
                    0.0
                };
            }
            let sum: f32 = out.iter().sum();
            out.iter_mut().for_each(|o| *o /= sum);
        }
        let targets = Tensor::f_from_slice(&targets)?
            .f_reshape([trainable.len() as i64, k as i64])?
            .f_to_device(self.model.device())?;
        Ok((targets, win_rows))
    }

    /// How the lookahead's wins are learnt, before this dataset's steps: the share of the trainable rows with a win
    /// on offer, and the policy's mean probability of its winning moves there (not for a recurrent policy, whose
    /// rows need their states).
    fn lookahead_metrics(
        &self,
        obs: &Tensor,
        targets: &Tensor,
        win_rows: &[i64],
        trainable: &[bool],
        metrics: &mut TrainMetrics,
    ) -> Result<()> {
        let rows = trainable.iter().filter(|&&v| v).count();
        metrics.insert(
            "train/lookahead_win_rows".into(),
            win_rows.len() as f64 / rows.max(1) as f64,
        );
        if win_rows.is_empty() || self.model.state_dim() > 0 {
            return Ok(());
        }
        let idx = Tensor::f_from_slice(win_rows)?.f_to_device(self.model.device())?;
        let taken = tch::no_grad(|| -> Result<f64> {
            let (dist, _) = self.model.forward(&obs.f_index_select(0, &idx)?);
            let Distribution::Categorical { log_probs } = dist else {
                return Ok(f64::NAN);
            };
            let winning = targets.f_index_select(0, &idx)?.f_gt(0.0)?.to_kind(Kind::Float);
            let on_wins = (log_probs.exp() * winning).sum(Kind::Float);
            Ok(f64::try_from(&on_wins)? / win_rows.len() as f64)
        })?;
        metrics.insert("train/lookahead_win_prob".into(), taken);
        Ok(())
    }

    /// Whether the SGD steps are differentiated by hand (`appo_dense`) rather than by
    /// autograd.
    pub fn differentiates_by_hand(&self) -> bool {
        self.dense.is_some()
    }

    /// The dataset's rows for the hand-written step of `net`; an action that is not one of its categories is an
    /// error.
    fn dense_dataset(&self, net: &DenseActorCritic, p: &Prepared) -> Result<DenseDataset> {
        let obs = tch::no_grad(|| self.model.normalized_obs(&p.obs));
        let obs_dim = usize::try_from(obs.size().get(1).copied().unwrap_or(1)).unwrap_or(1);
        let actions = to_vec(&p.actions)?;
        let categories = net.action_out.outputs;
        let category = |a: f32| a.fract() == 0.0 && a >= 0.0 && (a as usize) < categories;
        let legal = match net.head {
            DenseHead::Categorical { mask } => {
                if let Some(a) = actions.iter().find(|&&a| !category(a)) {
                    return Err(RlfError::Protocol {
                        component: "learner",
                        message: format!("dataset action {a} is not one of the {categories} categories"),
                    });
                }
                match mask {
                    Some((offset, len)) => {
                        let allowed = p.obs.narrow(-1, offset as i64, len as i64).gt(0.5);
                        to_vec(&allowed.to_kind(Kind::Float))?
                            .into_iter()
                            .map(|a| a > 0.5)
                            .collect()
                    }
                    None => Vec::new(),
                }
            }
            DenseHead::Gaussian { .. } => Vec::new(),
        };
        Ok(DenseDataset {
            obs: to_vec(&obs)?,
            obs_dim,
            action_dim: crate::model::Policy::action_dim(&self.model),
            actions,
            old_log_probs: to_vec(&p.old_log_probs)?,
            advantages: to_vec(&p.advantages)?,
            targets: to_vec(&p.targets_norm)?,
            old_values: to_vec(&p.old_values_norm)?,
            mask: to_vec(&p.mask)?,
            legal,
        })
    }

    /// After an SGD step: the policy version, the heartbeat, and the KL-adaptive schedule (from `kl`, the
    /// step's KL divergence).
    fn after_sgd_step(&mut self, kl: impl FnOnce() -> Result<f64>, epoch_kl: &mut Vec<f64>) -> Result<()> {
        self.version += 1;
        if let Some(f) = &mut self.after_step {
            f();
        }
        if self.schedule.needs_kl() {
            let kl = kl()?;
            self.schedule.on_minibatch(kl);
            epoch_kl.push(kl);
        }
        Ok(())
    }

    /// The network being trained.
    pub fn model(&self) -> &ActorCritic {
        &self.model
    }

    /// The network being trained, mutably (to load weights).
    pub fn model_mut(&mut self) -> &mut ActorCritic {
        &mut self.model
    }

    /// Steps per chunk of backpropagation through time for sequences of `seq_len` steps.
    fn recurrence(&self, seq_len: usize) -> usize {
        usize::try_from(self.cfg.recurrence).map_or(seq_len, |r| r.max(1))
    }

    /// Rows of the chunks `(sequence, chunk)` of `len` steps each, chunk after chunk (row order of
    /// [`ActorCritic::forward_sequences`]), and the rows where each chunk starts.
    fn chunk_rows(&self, chunks: &[(usize, usize)], len: usize, data: &Dataset) -> Result<(Tensor, Tensor)> {
        let s = data.num_sequences;
        let rows: Vec<i64> = chunks
            .iter()
            .flat_map(|&(q, k)| (0..len).map(move |j| ((k * len + j) * s + q) as i64))
            .collect();
        let starts: Vec<i64> = chunks.iter().map(|&(q, k)| (k * len * s + q) as i64).collect();
        let device = self.model.device();
        Ok((
            Tensor::f_from_slice(&rows)?.f_to_device(device)?,
            Tensor::f_from_slice(&starts)?.f_to_device(device)?,
        ))
    }

    /// Checks a dataset's tensor shapes against the model.
    fn check(&self, data: &Dataset) -> Result<()> {
        let protocol = |message: String| RlfError::Protocol {
            component: "learner",
            message,
        };
        let n = data.len() as i64;
        let obs_dim = crate::model::Policy::obs_dim(&self.model) as i64;
        let action_dim = crate::model::Policy::action_dim(&self.model) as i64;
        let shapes = [
            ("obs", &data.obs, vec![n, obs_dim]),
            ("actions", &data.actions, vec![n, action_dim]),
            ("log_probs", &data.log_probs, vec![n]),
            ("values", &data.values, vec![n]),
            ("rewards", &data.rewards, vec![n]),
            ("terminated", &data.terminated, vec![n]),
            ("truncated", &data.truncated, vec![n]),
            ("valid", &data.valid, vec![n]),
            ("has_final", &data.has_final, vec![n]),
            ("final_obs", &data.final_obs, vec![n, obs_dim]),
            (
                "next_obs",
                &data.next_obs,
                vec![data.num_sequences as i64, obs_dim],
            ),
            ("next_valid", &data.next_valid, vec![data.num_sequences as i64]),
        ];
        // Observations may stay the bytes they were stored as, for a network that takes them.
        let bytes = crate::model::Policy::takes_bytes(&self.model);
        let kind_ok = |name: &str, kind: Kind| {
            kind == Kind::Float || (bytes && kind == Kind::Uint8 && name.ends_with("obs"))
        };
        if let Some((name, t, want)) = shapes
            .iter()
            .find(|(name, t, want)| t.size() != *want || !kind_ok(name, t.kind()))
        {
            return Err(protocol(format!(
                "dataset field {name} is {:?} {:?}, expected Float {want:?}",
                t.kind(),
                t.size()
            )));
        }
        let state_dim = self.model.state_dim();
        match &data.states {
            None if state_dim > 0 => {
                return Err(protocol(
                    "a dataset without recurrent states for a recurrent network".into(),
                ))
            }
            Some(states) if states.size() != [n, state_dim] || states.kind() != Kind::Float => {
                return Err(protocol(format!(
                    "dataset field states is {:?} {:?}, expected Float [{n}, {state_dim}]",
                    states.kind(),
                    states.size()
                )))
            }
            _ => {}
        }
        if state_dim > 0 && self.cfg.with_vtrace && self.recurrence(data.seq_len) != data.seq_len {
            return Err(protocol(format!(
                "V-trace runs over whole sequences: --recurrence {} must equal their {} steps",
                self.recurrence(data.seq_len),
                data.seq_len
            )));
        }
        if state_dim > 0 && data.seq_len % self.recurrence(data.seq_len) != 0 {
            return Err(protocol(format!(
                "--recurrence {} does not divide sequences of {} steps",
                self.recurrence(data.seq_len),
                data.seq_len
            )));
        }
        if data.versions.len() != data.len() {
            return Err(protocol(format!(
                "dataset field versions has {} values, expected {n}",
                data.versions.len()
            )));
        }
        if n == 0 {
            return Err(protocol("empty dataset".into()));
        }
        Ok(())
    }

    /// Steps 2–5 of the module doc: statistics, bootstrap values, validity and lag mask, GAE.
    fn prepare(&mut self, data: &Dataset, metrics: &mut TrainMetrics) -> Result<Prepared> {
        let device = self.model.device();
        let (s, t) = (data.num_sequences, data.seq_len);
        let n = s * t;
        let obs = data.obs.f_to_device(device)?;
        // Statistics learn from the steps the slots mark valid, and from none when there are none.
        let slot_valid = to_vec(&data.valid)?;
        let valid_rows: Option<Tensor> = if slot_valid.iter().all(|&v| v != 0.0) {
            None
        } else {
            let rows: Vec<i64> = (0..n as i64).filter(|&r| slot_valid[r as usize] != 0.0).collect();
            Some(Tensor::f_from_slice(&rows)?.f_to_device(device)?)
        };
        let of_valid = |x: &Tensor| -> Result<Option<Tensor>> {
            Ok(match &valid_rows {
                None => Some(x.shallow_clone()),
                Some(rows) if rows.numel() == 0 => None,
                Some(rows) => Some(x.f_index_select(0, rows)?),
            })
        };
        if let Some(obs) = of_valid(&obs)? {
            self.model.update_obs_stats(&obs);
        }

        // The per-step numbers, sequence-major for the recursions along each sequence.
        let flags = |x: &Tensor| -> Result<Vec<bool>> { Ok(to_vec(x)?.iter().map(|&v| v != 0.0).collect()) };
        let truncated_rows = flags(&data.truncated)?;
        let (rewards, values) = (to_vec(&data.rewards)?, to_vec(&data.values)?);
        let (terminated, truncated) = (flags(&data.terminated)?, truncated_rows.clone());
        let seq_major = |v: &[f32]| (0..s).flat_map(|q| sequence(v, s, t, q)).collect::<Vec<_>>();
        let (rewards, values) = (seq_major(&rewards), seq_major(&values));
        let ends: Vec<bool> = (0..s)
            .flat_map(|q| {
                let (a, b) = (sequence(&terminated, s, t, q), sequence(&truncated, s, t, q));
                a.into_iter().zip(b).map(|(a, b)| a || b).collect::<Vec<_>>()
            })
            .collect();

        // A sequence's last acted step that cannot be bootstrapped (its agent does not act right
        // after the sequence) trains nothing: it only bootstraps the acted step before it.
        let acts_next = flags(&data.next_valid)?;
        let acted: Vec<bool> = slot_valid.iter().map(|&v| v != 0.0).collect();
        let mut trainable = acted.clone();
        for (q, _) in acts_next.iter().enumerate().filter(|(_, &next)| !next) {
            let seq_valid = sequence(&acted, s, t, q);
            if let Some(j) = bootstrap_only(&seq_valid, &ends[q * t..(q + 1) * t], false) {
                trainable[j * s + q] = false;
            }
        }

        // Bootstrap values: after each sequence, and the last observation of truncated episodes.
        // A recurrent network sees them with the state after the step before (unrolled from each
        // sequence's first recorded state with the current weights).
        let ends_rows = data
            .terminated
            .f_add(&data.truncated)?
            .f_clamp_max(1.0)?
            .f_to_device(device)?;
        let acted_rows = data.valid.f_to_device(device)?;
        let states = match &data.states {
            Some(states) if self.model.state_dim() > 0 => Some(states.f_to_device(device)?),
            _ => None,
        };
        let after: Option<Tensor> = match &states {
            None => None,
            Some(states) => {
                let seqs: Vec<(usize, usize)> = (0..s).map(|q| (q, 0)).collect();
                let (rows, starts) = self.chunk_rows(&seqs, t, data)?;
                tch::no_grad(|| {
                    self.model
                        .forward_sequences(
                            &obs.index_select(0, &rows),
                            &states.index_select(0, &starts),
                            &ends_rows.index_select(0, &rows),
                            &acted_rows.index_select(0, &rows),
                            t as i64,
                        )
                        .2
                })
            }
        };
        // The value of `obs` after the steps `rows` (sequence-major) of a recurrent network.
        let values_after = |obs: &Tensor, rows: &[i64]| -> Result<Vec<f32>> {
            match &after {
                None => to_vec(&self.model.values(obs)),
                Some(after) => {
                    let rows = Tensor::f_from_slice(rows)?.f_to_device(device)?;
                    let state = after.f_index_select(0, &rows)?;
                    tch::no_grad(|| {
                        let value = self.model.forward_step(obs, Some(&state)).1;
                        to_vec(&self.model.unscale_value(&value))
                    })
                }
            }
        };
        let last_steps: Vec<i64> = (0..s).map(|q| (q * t + t - 1) as i64).collect();
        let tail = values_after(&data.next_obs.f_to_device(device)?, &last_steps)?;
        let mut next_values = vec![0.0_f32; n];
        let mut bootstrapped = vec![false; n];
        for (i, (nv, b)) in next_values.iter_mut().zip(bootstrapped.iter_mut()).enumerate() {
            if ends[i] {
                *b = true;
            } else if i % t == t - 1 {
                *nv = tail[i / t];
                *b = true;
            }
        }
        let has_final = to_vec(&data.has_final)?;
        let rows: Vec<i64> = (0..n)
            .filter(|&r| has_final[r] != 0.0 && truncated_rows[r])
            .map(|r| r as i64)
            .collect();
        if !rows.is_empty() {
            let idx = Tensor::f_from_slice(&rows)?.f_to_device(device)?;
            let finals = data.final_obs.f_to_device(device)?.f_index_select(0, &idx)?;
            let steps: Vec<i64> = rows
                .iter()
                .map(|&r| ((r as usize % s) * t + r as usize / s) as i64)
                .collect();
            for (&r, v) in rows.iter().zip(values_after(&finals, &steps)?) {
                let r = r as usize;
                next_values[(r % s) * t + r / s] = v;
            }
        }

        // Policy lag.
        let lags: Vec<u64> = data
            .versions
            .iter()
            .map(|&v| self.version.saturating_sub(v))
            .collect();
        let valid: Vec<f32> = lags
            .iter()
            .zip(&trainable)
            .map(|(&l, &v)| {
                if l <= self.cfg.max_policy_lag && v {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        // Over the steps this policy could train on: another policy's, a snapshot's or a
        // waiting agent's steps carry versions that are not this policy's.
        let own: Vec<u64> = lags
            .iter()
            .zip(&trainable)
            .filter_map(|(&l, &v)| v.then_some(l))
            .collect();
        metrics.insert(
            "train/version_diff_avg".into(),
            own.iter().sum::<u64>() as f64 / own.len().max(1) as f64,
        );
        metrics.insert(
            "train/version_diff_min".into(),
            own.iter().copied().min().unwrap_or(0) as f64,
        );
        metrics.insert(
            "train/version_diff_max".into(),
            own.iter().copied().max().unwrap_or(0) as f64,
        );
        metrics.insert(
            "train/valids_fraction".into(),
            valid.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64,
        );

        // GAE from the behaviour values, back in row order.
        let (mut advantages, mut targets) = (vec![0.0; n], vec![0.0; n]);
        if !self.cfg.with_vtrace {
            for q in 0..s {
                let r = q * t..(q + 1) * t;
                let next: Vec<f32> = r
                    .clone()
                    .map(|i| {
                        if bootstrapped[i] {
                            next_values[i]
                        } else {
                            values[i + 1]
                        }
                    })
                    .collect();
                let seq_valid = sequence(&acted, s, t, q);
                let (gamma, lambda) = (self.learning.gamma as f32, self.cfg.gae_lambda as f32);
                if acts_next[q] && seq_valid.iter().all(|&v| v) {
                    let adv = gae(
                        &rewards[r.clone()],
                        &values[r.clone()],
                        &next,
                        &ends[r.clone()],
                        gamma,
                        lambda,
                    );
                    for (j, a) in adv.into_iter().enumerate() {
                        advantages[j * s + q] = a;
                        targets[j * s + q] = a + values[q * t + j];
                    }
                } else {
                    // Invalid steps keep advantage 0 and their own value as target (both masked out).
                    for j in 0..t {
                        targets[j * s + q] = values[q * t + j];
                    }
                    let acted = ActedSteps::new(
                        &seq_valid,
                        &rewards[r.clone()],
                        &next,
                        &ends[r.clone()],
                        acts_next[q],
                    );
                    let seq_values = acted.gather(&values[r]);
                    let adv = gae(
                        &acted.rewards,
                        &seq_values,
                        &acted.next_values,
                        &acted.ends,
                        gamma,
                        lambda,
                    );
                    for ((&j, a), v) in acted.index.iter().zip(adv).zip(seq_values) {
                        advantages[j * s + q] = a;
                        targets[j * s + q] = a + v;
                    }
                }
            }
        }
        let old_values = data.values.f_to_device(device)?;
        let targets = tensor_f32(&targets, device)?;
        if !self.cfg.with_vtrace {
            if trainable.iter().all(|&v| v) {
                self.model.update_return_stats(&targets);
            } else {
                let rows: Vec<i64> = (0..n as i64).filter(|&r| trainable[r as usize]).collect();
                if !rows.is_empty() {
                    let rows = Tensor::f_from_slice(&rows)?.f_to_device(device)?;
                    self.model.update_return_stats(&targets.f_index_select(0, &rows)?);
                }
            }
        }
        let mask = tensor_f32(&valid, device)?;
        let lookahead = match self.lookahead(&obs, &trainable)? {
            Some((targets, win_rows)) => {
                self.lookahead_metrics(&obs, &targets, &win_rows, &trainable, metrics)?;
                let rows = Tensor::f_from_slice(&win_rows)?.f_to_device(device)?;
                let policy_mask = mask.f_index_fill(0, &rows, 0.0)?;
                Some((targets, policy_mask))
            }
            None => None,
        };
        Ok(Prepared {
            lookahead,
            obs: self.model.staged_obs(&obs, &mut self.staging),
            actions: data.actions.f_to_device(device)?,
            old_log_probs: data.log_probs.f_to_device(device)?,
            old_values_norm: tch::no_grad(|| self.model.scale_value(&old_values)),
            mask,
            slot_valid: trainable,
            acted,
            acts_next,
            advantages: tensor_f32(&advantages, device)?,
            targets_norm: tch::no_grad(|| self.model.scale_value(&targets)),
            next_values,
            bootstrapped,
            rewards,
            ends,
            states,
            ends_rows,
            acted_rows,
        })
    }

    /// V-trace targets (normalised) and advantages for the minibatch of whole sequences `seqs`.
    fn vtrace_minibatch(
        &mut self,
        data: &Dataset,
        p: &Prepared,
        seqs: &[usize],
        log_probs: &Tensor,
        values_norm: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let t = data.seq_len;
        let (current, log_rhos) = tch::no_grad(|| -> Result<_> {
            let current = to_vec(&self.model.unscale_value(values_norm))?;
            let idx = self.index(seqs, data)?;
            let log_rhos = to_vec(&(log_probs - p.old_log_probs.index_select(0, &idx)))?;
            Ok((current, log_rhos))
        })?;
        let (mut targets, mut advantages) = (
            Vec::with_capacity(current.len()),
            Vec::with_capacity(current.len()),
        );
        for (k, &q) in seqs.iter().enumerate() {
            let src = q * t..(q + 1) * t;
            let dst = k * t..(k + 1) * t;
            let next: Vec<f32> = (0..t)
                .map(|j| {
                    let i = q * t + j;
                    if p.bootstrapped[i] {
                        p.next_values[i]
                    } else {
                        current[k * t + j + 1]
                    }
                })
                .collect();
            let params = VtraceParams {
                gamma: self.learning.gamma as f32,
                rho_bar: self.cfg.vtrace_rho as f32,
                c_bar: self.cfg.vtrace_c as f32,
            };
            let seq_valid = sequence(&p.acted, data.num_sequences, t, q);
            if p.acts_next[q] && seq_valid.iter().all(|&v| v) {
                let (vs, adv) = vtrace(
                    &p.rewards[src.clone()],
                    &current[dst.clone()],
                    &next,
                    &p.ends[src],
                    &log_rhos[dst],
                    params,
                );
                targets.extend(vs);
                advantages.extend(adv);
            } else {
                // Invalid steps keep advantage 0 and their own value as target (both masked out).
                let first = targets.len();
                targets.extend_from_slice(&current[dst.clone()]);
                advantages.resize(first + t, 0.0);
                let acted = ActedSteps::new(
                    &seq_valid,
                    &p.rewards[src.clone()],
                    &next,
                    &p.ends[src],
                    p.acts_next[q],
                );
                let (vs, adv) = vtrace(
                    &acted.rewards,
                    &acted.gather(&current[dst.clone()]),
                    &acted.next_values,
                    &acted.ends,
                    &acted.gather(&log_rhos[dst]),
                    params,
                );
                for ((&j, v), a) in acted.index.iter().zip(vs).zip(adv) {
                    targets[first + j] = v;
                    advantages[first + j] = a;
                }
            }
        }
        let device = self.model.device();
        let mut valid_targets = Vec::with_capacity(targets.len());
        for (k, &q) in seqs.iter().enumerate() {
            for j in 0..t {
                if p.slot_valid[j * data.num_sequences + q] {
                    valid_targets.push(targets[k * t + j]);
                }
            }
        }
        if !valid_targets.is_empty() {
            self.model
                .update_return_stats(&tensor_f32(&valid_targets, device)?);
        }
        let targets = tensor_f32(&targets, device)?;
        let targets_norm = tch::no_grad(|| self.model.scale_value(&targets));
        Ok((tensor_f32(&advantages, device)?, targets_norm))
    }

    /// Rows of the transitions of sequences `seqs`, sequence by sequence.
    fn index(&self, seqs: &[usize], data: &Dataset) -> Result<Tensor> {
        let (s, t) = (data.num_sequences, data.seq_len);
        let idx: Vec<i64> = seqs
            .iter()
            .flat_map(|&q| (0..t).map(move |j| (j * s + q) as i64))
            .collect();
        Ok(Tensor::f_from_slice(&idx)?.f_to_device(self.model.device())?)
    }

    /// Trains on one dataset (steps 2–14 of the module doc) and returns its metrics.
    pub fn train(&mut self, data: &Dataset) -> Result<TrainMetrics> {
        self.check(data)?;
        let mut metrics = TrainMetrics::new();
        self.schedule.on_progress(self.frames_trained);
        let p = self.prepare(data, &mut metrics)?;
        let device = self.model.device();
        let (s, t) = (data.num_sequences, data.seq_len);
        let n = s * t;
        let mb_size = self.learning.batch_size.min(n);
        let mb_per_epoch = self.cfg.num_batches_per_epoch.min(n / mb_size).max(1);
        let value_clip = if self.cfg.ppo_clip_value > 0.0 {
            self.cfg.ppo_clip_value / self.model.value_unit()
        } else {
            0.0
        };
        // Without V-trace, minibatches are drawn from the transitions the slots mark valid only
        // (a turn-based env's waiting agents would otherwise fill most of each minibatch with
        // masked rows): the same number of SGD steps, on fewer rows each.
        // A recurrent network trains on whole chunks of `--recurrence` steps (invalid steps masked).
        let recurrent = p.states.is_some();
        let chunk = if recurrent { self.recurrence(t) } else { 1 };
        let acted_rows: Option<Vec<i64>> =
            if self.cfg.with_vtrace || recurrent || p.slot_valid.iter().all(|&v| v) {
                None
            } else {
                let rows: Vec<i64> = (0..n).filter(|&r| p.slot_valid[r]).map(|r| r as i64).collect();
                (!rows.is_empty()).then_some(rows)
            };
        let (units, mb_size) = match &acted_rows {
            Some(rows) => (rows.len(), rows.len().div_ceil(mb_per_epoch)),
            None if self.cfg.with_vtrace => (s, mb_size),
            None if recurrent => (s * (t / chunk), mb_size),
            None => (n, mb_size),
        };
        let whole = !self.cfg.with_vtrace && !recurrent && acted_rows.is_none() && mb_size == n;
        // On a machine of more than two CPUs, a separate critic's hand-written passes run on a second thread. On two
        // (docs/benchmarks.md) it made one process's CartPole 3-7% faster but took the CPU the rollout and
        // inference workers and another MPI rank need (1 learner + 1 actor rank: 90% of one process's FPS -> 74%).
        let two_threads = std::thread::available_parallelism().is_ok_and(|n| n.get() > 2);
        let dense_data = match &self.dense {
            Some(net) => Some(self.dense_dataset(net, &p)?),
            None => None,
        };
        let mut sums: Vec<Tensor> = Vec::new();
        let (mut grad_norm_sum, mut lookahead_sum) = (0.0, 0.0);
        let mut steps = 0usize;
        for _epoch in 0..self.cfg.num_epochs {
            let mut epoch_kl = Vec::new();
            // Transitions (GAE) or sequences (V-trace) in a random order.
            let order = if whole {
                None
            } else {
                let perm = self.draws.permutation(units);
                Some(match &acted_rows {
                    Some(rows) => perm.iter().map(|&i| rows[i as usize]).collect(),
                    None => perm,
                })
            };
            for mb in 0..mb_per_epoch {
                if let (Some(net), Some(rows)) = (&self.dense, &dense_data) {
                    let part = order
                        .as_deref()
                        .map(|o| &o[(mb * mb_size).min(units)..((mb + 1) * mb_size).min(units)]);
                    if part.is_some_and(<[i64]>::is_empty) {
                        continue;
                    }
                    let params = self.optimizer.values()?;
                    let (grads, row) =
                        appo_dense::gradients(net, &params, rows, part, (&self.cfg, value_clip), two_threads);
                    self.optimizer.set_lr(self.schedule.lr());
                    grad_norm_sum += self
                        .optimizer
                        .clip_and_step_flat(&grads, self.optim.max_grad_norm)?;
                    steps += 1;
                    self.after_sgd_step(|| Ok(f64::from(row[4])), &mut epoch_kl)?;
                    sums.push(Tensor::f_from_slice(&row)?);
                    continue;
                }
                // The minibatch's rows, its sequences (V-trace) and its chunks (recurrent).
                let (idx, seqs, chunks) = match &order {
                    None => (None, Vec::new(), Vec::new()),
                    Some(order) if self.cfg.with_vtrace => {
                        let per = (mb_size / t).max(1);
                        let seqs: Vec<usize> = order[mb * per..((mb + 1) * per).min(s)]
                            .iter()
                            .map(|&q| q as usize)
                            .collect();
                        let chunks = seqs.iter().map(|&q| (q, 0)).collect();
                        (Some(self.index(&seqs, data)?), seqs, chunks)
                    }
                    Some(order) if recurrent => {
                        let (per, k) = ((mb_size / chunk).max(1), t / chunk);
                        let part = &order[(mb * per).min(units)..((mb + 1) * per).min(units)];
                        if part.is_empty() {
                            continue;
                        }
                        let chunks: Vec<(usize, usize)> =
                            part.iter().map(|&u| (u as usize / k, u as usize % k)).collect();
                        (Some(self.chunk_rows(&chunks, chunk, data)?.0), Vec::new(), chunks)
                    }
                    Some(order) => {
                        let part = &order[(mb * mb_size).min(units)..((mb + 1) * mb_size).min(units)];
                        if part.is_empty() {
                            continue;
                        }
                        (
                            Some(Tensor::f_from_slice(part)?.f_to_device(device)?),
                            Vec::new(),
                            Vec::new(),
                        )
                    }
                };
                let pick = |x: &Tensor| match &idx {
                    Some(i) => x.index_select(0, i),
                    None => x.shallow_clone(),
                };
                let obs = pick(&p.obs);
                let (dist, values_norm) = match &p.states {
                    Some(states) => {
                        let starts = self.chunk_rows(&chunks, chunk, data)?.1;
                        let (dist, values, _) = self.model.forward_sequences(
                            &obs,
                            &states.index_select(0, &starts),
                            &pick(&p.ends_rows),
                            &pick(&p.acted_rows),
                            chunk as i64,
                        );
                        (dist, values)
                    }
                    None => self.model.forward(&obs),
                };
                let log_probs = dist.log_prob(&pick(&p.actions));
                let entropy = dist.entropy();
                let (advantages, targets_norm) = if self.cfg.with_vtrace {
                    self.vtrace_minibatch(data, &p, &seqs, &log_probs, &values_norm)?
                } else {
                    (pick(&p.advantages), pick(&p.targets_norm))
                };
                let old_log_probs = pick(&p.old_log_probs);
                let old_values = pick(&p.old_values_norm);
                let mask = pick(&p.mask);
                let lookahead = p
                    .lookahead
                    .as_ref()
                    .map(|(targets, policy_mask)| (pick(targets), pick(policy_mask)));
                let l = losses(
                    &LossInputs {
                        log_probs: &log_probs,
                        old_log_probs: &old_log_probs,
                        advantages: &advantages,
                        values: &values_norm,
                        old_values: &old_values,
                        targets: &targets_norm,
                        entropy: &entropy,
                        mask: &mask,
                        policy_mask: lookahead.as_ref().map(|(_, m)| m),
                    },
                    &self.cfg,
                    value_clip,
                );
                let total = match &lookahead {
                    Some((targets, _)) => {
                        let cross_entropy =
                            dist.cross_entropy(targets).ok_or_else(|| RlfError::Protocol {
                                component: "learner",
                                message: "the lookahead loss needs a categorical policy".into(),
                            })?;
                        let loss =
                            (cross_entropy * &mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0);
                        lookahead_sum += f64::try_from(&loss)?;
                        &l.total + loss * self.cfg.lookahead_coeff
                    }
                    None => l.total.shallow_clone(),
                };
                self.optimizer.set_lr(self.schedule.lr());
                grad_norm_sum += self.optimizer.minimize(&total, self.optim.max_grad_norm)?;
                steps += 1;
                self.after_sgd_step(|| Ok(f64::try_from(&l.kl)?), &mut epoch_kl)?;
                let row = Tensor::stack(
                    &[
                        l.policy.detach(),
                        l.value.detach(),
                        l.entropy.detach(),
                        total.detach(),
                        l.kl,
                        l.fraction_clipped,
                        advantages.mean(Kind::Float),
                        advantages.std(true),
                    ],
                    0,
                );
                sums.push(row);
            }
            if !epoch_kl.is_empty() {
                self.schedule
                    .on_epoch(epoch_kl.iter().sum::<f64>() / epoch_kl.len() as f64);
            }
        }
        self.frames_trained += p.acted.iter().filter(|&&a| a).count() as u64;
        let means = to_vec(&Tensor::stack(&sums, 0).mean_dim(0, false, Kind::Float))?;
        let names = [
            "train/policy_loss",
            "train/value_loss",
            "train/entropy",
            "train/loss",
            "train/kl_divergence",
            "train/fraction_clipped",
            "train/adv_mean",
            "train/adv_std",
        ];
        for (name, v) in names.iter().zip(&means) {
            metrics.insert((*name).into(), f64::from(*v));
        }
        let entropy = metrics.get("train/entropy").copied().unwrap_or(0.0);
        metrics.insert(
            "train/exploration_loss".into(),
            -entropy * self.cfg.exploration_loss_coeff,
        );
        metrics.insert("train/grad_norm".into(), grad_norm_sum / steps.max(1) as f64);
        if p.lookahead.is_some() {
            metrics.insert("train/lookahead_loss".into(), lookahead_sum / steps.max(1) as f64);
        }
        metrics.insert("train/lr".into(), self.schedule.lr());
        metrics.insert("train/sgd_steps".into(), steps as f64);
        Ok(metrics)
    }
}
