//! The math of the algorithms, one file each, and what the off-policy ones share: a batch of transitions
//! ([`Transitions`]) and the face the off-policy learner sees ([`OffPolicyAlgo`]).

pub mod adam;
pub mod appo;
pub mod dqn;
pub mod sac;

use std::collections::BTreeMap;

use tch::Tensor;

use crate::error::{Result, RlfError};
use crate::learning::replay::TransitionLayout;
use crate::model::{NamedTensor, PolicyWeights};

/// A training batch of `B` n-step transitions `(s, a, R, d, s')` sampled from a replay buffer: `R` is the
/// discounted return of up to n agent steps, `d` the discount of what follows (`γ^k`, 0 after a terminal state),
/// `s'` the state to bootstrap from (see [`crate::learning::replay`]).
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
}

impl Transitions {
    /// The batch in `rows` (whole rows of `layout`), on `device`.
    pub fn from_rows(rows: &[f32], layout: TransitionLayout, device: tch::Device) -> Result<Self> {
        let w = layout.row_words();
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
            obs: column(0, layout.obs_dim),
            actions: column(layout.action_at(), layout.action_dim),
            returns: column(layout.return_at(), 1).squeeze_dim(1),
            discounts: column(layout.discount_at(), 1).squeeze_dim(1),
            next_obs: column(layout.next_obs_at(), layout.obs_dim),
        })
    }
}

/// What the off-policy learner ([`crate::learning::OffPolicyLearner`]) needs of an algorithm: SGD steps on sampled
/// transitions, the weights the actors run, and everything a checkpoint holds.
pub trait OffPolicyAlgo: std::fmt::Debug {
    /// One SGD step on `batch`; returns the metrics.
    fn train(&mut self, batch: &Transitions) -> Result<BTreeMap<String, f64>>;

    /// SGD steps taken (the policy version).
    fn version(&self) -> u64;

    /// The device the networks live on.
    fn device(&self) -> tch::Device;

    /// The learning rate.
    fn lr(&self) -> f64;

    /// The weights the actors run (what is published).
    fn acting_weights(&self) -> Result<PolicyWeights>;

    /// Every network's variables and the optimisers' moments, by name.
    fn state_tensors(&self) -> Result<Vec<NamedTensor>>;

    /// Continues from a checkpoint's `tensors` at `version`; returns whether everything it trains (optimiser
    /// moments included) was in it.
    fn restore(&mut self, tensors: &[NamedTensor], version: u64) -> Result<bool>;
}
