//! The math of the algorithms, one file each; what every algorithm tells the rest of the crate ([`Algorithm`],
//! registered in [`algorithm`]); the face the trajectory learner sees of an algorithm that learns from the trajectory
//! slots ([`OnPolicyAlgo`]: APPO), and what the off-policy ones share: a batch of transitions ([`Transitions`]) and
//! the face the off-policy learner sees ([`OffPolicyAlgo`]: DQN, SAC).

pub mod adam;
pub mod allreduce;
pub mod appo;
pub mod dqn;
pub mod sac;

use std::collections::BTreeMap;

use rlf_env::Space;
use serde::{Deserialize, Serialize};
use tch::Tensor;

use self::adam::GradientSync;
use self::appo::Dataset;
use crate::config::{Algo, Config};
use crate::data::TransitionLayout;
use crate::error::{Result, RlfError};
use crate::model::{Draws, NamedTensor, Policy, PolicyWeights};
use crate::pbt::Hyper;

/// What an algorithm tells the rest of the crate: the network that acts for a policy and the action spaces it can
/// learn. Each algorithm's implementation is in its own file; [`algorithm`] registers them.
pub trait Algorithm: Sync {
    /// A policy's acting network, with fresh weights, for the spaces of its agents: what the inference workers run
    /// and what `enjoy`, `eval`, `export` and a resume's check load a checkpoint into.
    fn acting_network(
        &self,
        observation_space: &Space,
        action_space: &Space,
        cfg: &Config,
    ) -> Result<Box<dyn Policy>>;

    /// Refuses an env (named `env`) whose action spaces it cannot learn, in one line naming `--algo`.
    fn check_actions(&self, env: &str, action_spaces: &[Space]) -> Result<()>;

    /// An algorithm that learns from the trajectory slots: its learner (network and optimiser, fresh) for a policy
    /// with these spaces, for a run of `cfg`; `None` for one that learns from a replay buffer. `seed` is called before
    /// each network that starts from the policy's seed.
    fn on_policy_learner(
        &self,
        observation_space: &Space,
        action_space: &Space,
        cfg: &Config,
        seed: &dyn Fn(),
    ) -> Result<Option<Box<dyn OnPolicyAlgo>>>;

    /// An off-policy algorithm's learner (its networks, targets and optimisers, fresh) for a policy with these
    /// spaces; `None` for one that learns from trajectories. `seed` is called before each network that starts from
    /// the policy's seed.
    fn off_policy_learner(
        &self,
        observation_space: &Space,
        action_space: &Space,
        cfg: &Config,
        seed: &dyn Fn(),
    ) -> Result<Option<Box<dyn OffPolicyAlgo>>>;
}

/// The algorithm `algo` names: the one registration of each.
pub fn algorithm(algo: Algo) -> &'static dyn Algorithm {
    match algo {
        Algo::Appo => &appo::AppoAlgorithm,
        Algo::Dqn => &dqn::DqnAlgorithm,
        Algo::Sac => &sac::SacAlgorithm,
    }
}

/// What a checkpoint keeps of a learner besides the networks and the optimisers' moments.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainingState {
    /// The policy version (SGD steps so far; also Adam's step count).
    pub version: u64,
    /// Env frames trained on (the linear-decay schedule's position; an off-policy learner's transitions sampled).
    pub frames_trained: u64,
    /// The learning rate the schedule had reached.
    pub lr: f64,
}

/// What the trajectory learner ([`crate::learning::Learner`]) needs of an algorithm that learns from the trajectory
/// slots: training on a dataset, the network it trains, and everything a checkpoint, PBT and several learners of
/// one policy ask of it.
pub trait OnPolicyAlgo: std::fmt::Debug {
    /// Trains on one dataset; returns its metrics (Sample Factory's `train/...` names).
    fn train(&mut self, data: &Dataset) -> Result<BTreeMap<String, f64>>;

    /// The network being trained.
    fn policy(&self) -> &dyn Policy;

    /// The network being trained, mutably (to load weights).
    fn policy_mut(&mut self) -> &mut dyn Policy;

    /// The policy version: the number of SGD steps taken.
    fn version(&self) -> u64;

    /// The generator of the minibatches' orders, for an exact resume.
    fn draws(&self) -> &Draws;

    /// Replaces the generator of the minibatches' orders (a kept one).
    fn set_draws(&mut self, draws: Draws);

    /// Calls `f` after every SGD step: a learner whose dataset takes longer than the heartbeat interval beats its
    /// loop's heartbeat there.
    fn set_after_step(&mut self, f: Box<dyn FnMut() + Send>);

    /// Trains as one of several learners of this policy: each SGD step's gradients are averaged with the others'
    /// through `sync`.
    fn set_gradient_sync(&mut self, sync: Box<dyn GradientSync>);

    /// This learner trains no more: tells the other learners of the policy.
    fn finish_sync(&mut self) -> Result<()>;

    /// Replaces the hyper-parameters PBT mutates.
    fn set_hyper(&mut self, hyper: &Hyper);

    /// Takes another policy's optimiser moments from a checkpoint's `tensors` (its weights loaded into the network
    /// by the caller), keeping this policy's version, which moves on by one so that the inference workers load the
    /// new weights. Returns whether the moments were there.
    fn adopt(&mut self, tensors: &[NamedTensor]) -> Result<bool>;

    /// The optimiser's moments as named tensors.
    fn optimizer_state(&self) -> Result<Vec<NamedTensor>>;

    /// The state to save beside the weights.
    fn training_state(&self) -> TrainingState;

    /// Continues from a saved [`TrainingState`] and the optimiser's moments among `tensors` (the weights are loaded
    /// separately). Returns whether the moments were there; without them the optimiser starts afresh.
    fn restore_training_state(&mut self, tensors: &[NamedTensor], state: TrainingState) -> Result<bool>;
}

/// A training batch of `B` n-step transitions `(s, a, R, d, s')` sampled from a replay buffer: `R` is the
/// discounted return of up to n agent steps, `d` the discount of what follows (`γ^k`, 0 after a terminal state),
/// `s'` the state to bootstrap from (see [`crate::data::transitions`]).
#[derive(Debug)]
pub struct Transitions {
    /// States, `[B, obs_dim]`.
    pub obs: Tensor,
    /// Raw actions taken, `[B, action_dim]` (a category index for discrete actions).
    pub actions: Tensor,
    /// n-step returns, `[B]`.
    pub returns: Tensor,
    /// Discounts of the bootstrap, `[B]`.
    pub discounts: Tensor,
    /// States to bootstrap from, `[B, obs_dim]`.
    pub next_obs: Tensor,
    /// Importance weights of prioritised replay, `[B]`: each transition's loss is weighted by them (none: equal).
    pub weights: Option<Tensor>,
}

impl Transitions {
    /// The batch in `rows` (whole rows of `layout`), on `device`.
    pub fn from_rows(rows: &[f32], layout: &TransitionLayout, device: tch::Device) -> Result<Self> {
        let w = layout.row_words();
        if layout.packs() {
            return Err(RlfError::Protocol {
                component: "learner",
                message: "replay rows with packed bytes must be decoded first".into(),
            });
        }
        if rows.is_empty() || rows.len() % w != 0 {
            return Err(RlfError::Protocol {
                component: "learner",
                message: format!("{} replay values are not whole rows of {w}", rows.len()),
            });
        }
        let all = Tensor::f_from_slice(rows)?
            .f_view([(rows.len() / w) as i64, w as i64])?
            .f_to_device(device)?;
        let column = |at: usize, len: usize| all.narrow(1, at as i64, len as i64);
        Ok(Self {
            obs: column(0, layout.obs_dim()),
            actions: column(layout.action_at(), layout.action_dim),
            returns: column(layout.return_at(), 1).squeeze_dim(1),
            discounts: column(layout.discount_at(), 1).squeeze_dim(1),
            next_obs: column(layout.next_obs_at(), layout.obs_dim()),
            weights: None,
        })
    }

    /// The same batch with importance `weights`, one per transition.
    pub fn weighted(self, weights: &[f32]) -> Result<Self> {
        let device = self.obs.device();
        Ok(Self {
            weights: Some(Tensor::f_from_slice(weights)?.f_to_device(device)?),
            ..self
        })
    }

    /// The mean of per-transition `losses` `[B]`, each weighted by its importance weight if there are any.
    pub fn weighted_mean(&self, losses: &Tensor) -> Result<Tensor> {
        Ok(match &self.weights {
            Some(w) => losses.f_mul(w)?.f_mean(tch::Kind::Float)?,
            None => losses.f_mean(tch::Kind::Float)?,
        })
    }
}

/// What the off-policy learner ([`crate::learning::OffPolicyLearner`]) needs of an algorithm: SGD steps on sampled
/// transitions, the weights the actors run, and everything a checkpoint holds.
pub trait OffPolicyAlgo: std::fmt::Debug {
    /// One SGD step on `batch`; returns the metrics. With `td_errors`, fills it with each transition's TD error
    /// (prioritised replay's new priorities).
    fn train(
        &mut self,
        batch: &Transitions,
        td_errors: Option<&mut Vec<f32>>,
    ) -> Result<BTreeMap<String, f64>>;

    /// SGD steps taken (the policy version).
    fn version(&self) -> u64;

    /// The device the networks live on.
    fn device(&self) -> tch::Device;

    /// The learning rate.
    fn lr(&self) -> f64;

    /// Sets the learning rate of the next steps (every optimiser's).
    fn set_lr(&mut self, lr: f64);

    /// The weights the actors run (what is published).
    fn acting_weights(&self) -> Result<PolicyWeights>;

    /// Every network's variables and the optimisers' moments, by name.
    fn state_tensors(&self) -> Result<Vec<NamedTensor>>;

    /// Continues from a checkpoint's `tensors` at `version`; returns whether everything it trains (optimiser
    /// moments included) was in it.
    fn restore(&mut self, tensors: &[NamedTensor], version: u64) -> Result<bool>;

    /// The state of the generator its training draws from (SAC's action noise), for an exact resume; `None`, the
    /// default, when training draws nothing.
    fn sampler_state(&self) -> Option<Vec<u8>> {
        None
    }

    /// Takes back what [`sampler_state`](OffPolicyAlgo::sampler_state) returned.
    fn load_sampler_state(&mut self, state: &[u8]) -> Result<()> {
        let _ = state;
        Ok(())
    }
}
