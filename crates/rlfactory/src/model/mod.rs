//! Networks, behind our own small [`Policy`] trait. They and the learners of [`crate::algo`] compute with tch's
//! tensors; elsewhere the crate names tch only to set its thread count and seed, to ask for a GPU, to wrap its
//! errors, and where trajectory slots become tensors (`data`).
//!
//! - [`ActorCritic`]: an MLP encoder built from the observation space, an action head built from
//!   the action space ([`ActionHead`]), a value head; shared or separate actor and critic;
//!   orthogonal initialisation; running normalisation of observations and returns, stored beside
//!   the weights.
//! - [`DenseActorCritic`]: an [`ActorCritic`] of MLPs seen as layers in a flat parameter buffer, its forward and
//!   backward passes written out in Rust (ndarray's products), for the APPO learner's hand-written step.
//! - [`QNetwork`]: the same encoders with one Q-value per action (or a dueling head), acting ε-greedily, for DQN.
//! - [`SacActor`] and [`TwinQ`]: soft actor-critic's squashed-Gaussian actor and its twin Q-networks (`Box` actions).
//! - [`Policy`]: what inference needs: act on a batch of observations, export and import weights,
//!   save and load; every network keeps its variables in one [`Variables`], which saves, loads, publishes and
//!   follows them by name ([`NamedTensor`]).

mod actor_critic;
mod custom;
mod dense;
mod dense_acting;
mod distribution;
mod draws;
mod encoder;
mod normalize;
mod q_network;
mod recurrent;
mod sac;
mod weights;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub(crate) use actor_critic::MASKED_LOGIT;
pub use actor_critic::{ActionHead, ActorCritic, ACTION_MASK_KEY};
pub use custom::{register_encoder, registered_encoder, EncoderBuilder, EncoderNet};
pub use dense::{DenseActorCritic, DenseForward};
pub(crate) use dense::{DenseHead, HAND_WRITTEN_MAX_WIDTH};
pub use distribution::Distribution;
pub use draws::Draws;
pub use normalize::RunningMeanStd;
pub use q_network::{QActivations, QNetwork};
pub use sac::{SacActor, TwinQ};
pub use weights::{NamedTensor, Variables};

use crate::error::Result;

/// What a policy returns for a batch of `n` observations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ActOutput {
    /// Raw actions, `n * action_dim` values: category indices for discrete heads, the unclipped
    /// Gaussian sample for continuous ones (see [`crate::env::ActionMapper`] for what the env gets).
    pub actions: Vec<f32>,
    /// Log-probability of each action under the policy that chose it.
    pub log_probs: Vec<f32>,
    /// Value estimate of each observation (in return units).
    pub values: Vec<f32>,
}

/// All the state of a policy (weights and normalisation statistics) as one flat vector, in a
/// fixed order: what the learner publishes and the inference worker loads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyWeights {
    /// The values, variable after variable in name order.
    pub values: Vec<f32>,
}

/// A policy as inference sees it.
pub trait Policy {
    /// Chooses actions for `obs`, a batch of observations of `obs_dim` values each: sampled, or the
    /// most likely ones when `deterministic`.
    fn act(&mut self, obs: &[f32], deterministic: bool) -> Result<ActOutput>;

    /// Values of recurrent state per observation: 0 for a policy without memory.
    fn state_dim(&self) -> usize {
        0
    }

    /// As [`act`](Policy::act), for a recurrent policy: `states` holds each observation's state
    /// before the step ([`state_dim`](Policy::state_dim) values each) and is overwritten with the
    /// state after it. A policy without memory takes no states.
    fn act_recurrent(&mut self, obs: &[f32], states: &mut [f32], deterministic: bool) -> Result<ActOutput> {
        if states.is_empty() {
            self.act(obs, deterministic)
        } else {
            Err(crate::RlfError::Protocol {
                component: "policy",
                message: format!("{} state values for a policy without memory", states.len()),
            })
        }
    }

    /// The state of the generator its actions are drawn with, for an exact resume; `None`, the default, when it draws
    /// from libtorch's global generator (whose state cannot be read).
    fn sampler_state(&self) -> Option<Vec<u8>> {
        None
    }

    /// Takes back what [`sampler_state`](Policy::sampler_state) returned.
    fn load_sampler_state(&mut self, state: &[u8]) -> Result<()> {
        let _ = state;
        Err(crate::error::RlfError::Config(
            "this policy draws its actions from libtorch's generator, which keeps no state for an exact resume".into(),
        ))
    }

    /// Samples its actions at temperature `temperature` from now on ([`Distribution::tempered`]; 1 is its own
    /// distribution, and greedy acting is unchanged). Only an actor-critic has one.
    fn set_temperature(&mut self, temperature: f64) -> Result<()> {
        let _ = temperature;
        Err(crate::error::RlfError::Config(
            "only an actor-critic policy samples at a temperature".into(),
        ))
    }

    /// Values per observation.
    fn obs_dim(&self) -> usize;

    /// Whether its learner may keep observations stored as bytes (Atari's frames) as bytes, which its networks
    /// convert in their first pass: four times fewer bytes to copy and select minibatches from than floats. `false`,
    /// the default, gives it floats.
    fn takes_bytes(&self) -> bool {
        false
    }

    /// Values per raw action.
    fn action_dim(&self) -> usize;

    /// Its weights and statistics.
    fn variables(&self) -> &Variables;

    /// Its weights and statistics, to replace.
    fn variables_mut(&mut self) -> &mut Variables;

    /// The current weights and statistics.
    fn weights(&self) -> Result<PolicyWeights> {
        self.variables().weights()
    }

    /// Replaces weights and statistics with `weights` (from a policy of the same architecture).
    fn load_weights(&mut self, weights: &PolicyWeights) -> Result<()> {
        self.variables_mut().load_weights(weights)
    }

    /// Saves weights and statistics to `path` (safetensors).
    fn save(&self, path: &Path) -> Result<()> {
        self.variables().save(path)
    }

    /// Loads weights and statistics saved by [`save`](Policy::save).
    fn load(&mut self, path: &Path) -> Result<()> {
        self.variables_mut().load(path)
    }

    /// Every variable by its PyTorch-style name, with its shape, in name order (what checkpoints hold).
    fn named_tensors(&self) -> Result<Vec<NamedTensor>> {
        self.variables().named_tensors()
    }

    /// Replaces every variable with the tensor of the same name in `tensors` (others there are ignored); a missing
    /// name or a wrong shape is an error naming the variable, and nothing is changed then.
    fn load_named_tensors(&mut self, tensors: &[NamedTensor]) -> Result<()> {
        self.variables_mut().load_named_tensors(tensors)
    }

    /// Sets ε, the exploration of an ε-greedy policy ([`QNetwork`]); a policy that samples from its
    /// distribution ignores it.
    fn set_exploration(&mut self, epsilon: f64) {
        let _ = epsilon;
    }

    /// As [`act`](Policy::act) (sampled), exploring in time (εz-greedy, [`QNetwork`]): `holds` holds each
    /// observation's exploratory action still to repeat, which the policy takes, counts down and sets anew when it
    /// explores (for a duration drawn from `durations`). A policy that samples from its distribution ignores them.
    fn act_holding(&mut self, obs: &[f32], holds: &mut [Hold], durations: &Durations) -> Result<ActOutput> {
        let _ = (holds, durations);
        self.act(obs, false)
    }
}

/// One column's exploratory action under temporally-extended ε-greedy ([`Policy::act_holding`]): the action and
/// the steps it is still to be repeated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hold {
    /// The action (an index into the `Discrete` space).
    pub action: u32,
    /// Steps left to repeat it (0: none; the policy chooses afresh).
    pub steps: u32,
}

/// The durations of εz-greedy's exploratory actions (Dabney, Ostrovski and Barreto, "Temporally-Extended
/// ε-Greedy Exploration", 2021): a zeta distribution, `P(n) ∝ n^−μ` for `1 ≤ n ≤` [`Durations::MAX`].
#[derive(Debug, Clone, PartialEq)]
pub struct Durations {
    /// `P(duration ≤ n + 1)`, by `n`.
    cdf: Vec<f64>,
}

impl Durations {
    /// The longest duration drawn (the paper's cap).
    pub const MAX: usize = 10_000;

    /// The zeta distribution of exponent `mu` (> 0), truncated at [`Durations::MAX`].
    pub fn zeta(mu: f64) -> Self {
        let weights: Vec<f64> = (1..=Self::MAX).map(|n| (n as f64).powf(-mu)).collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                sum += w / total;
                sum
            })
            .collect();
        Self { cdf }
    }

    /// A duration for the uniform draw `u` in `[0, 1)`.
    pub fn at(&self, u: f64) -> usize {
        (self.cdf.partition_point(|&c| c <= u) + 1).min(Self::MAX)
    }
}
