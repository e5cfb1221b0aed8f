//! Learning: the [`Batcher`] assembles trajectories into training datasets; the [`Learner`] trains
//! on them and publishes new weights.

mod batcher;
mod learner;
mod off_policy;
mod prioritized;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::pbt::Hyper;

pub use batcher::{Assembled, Batcher, BatcherCounts, Share, Slot};
pub use learner::Learner;
pub use off_policy::{KeptLearner, OffPolicyLearner, ReplaySnapshot, Round};
pub use prioritized::SavedPriorities;

/// Sequences `first_env..first_env + num_envs` (env columns) of the trajectory in slot `buffer`
/// of rollout worker `worker`'s pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// The rollout worker (owner of the pool).
    pub worker: usize,
    /// The slot.
    pub buffer: usize,
    /// The first env column.
    pub first_env: usize,
    /// Env columns.
    pub num_envs: usize,
    /// The part holds the trajectory's last columns: once this dataset is trained on, the slot
    /// is free.
    pub closes: bool,
}

impl Part {
    /// The slot the part is taken from.
    pub fn slot(&self) -> Slot {
        Slot {
            worker: self.worker,
            buffer: self.buffer,
        }
    }
}

/// A training dataset as the slots it is made of (`batch_ready`): the learner views them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The parts, in order.
    pub parts: Vec<Part>,
}

/// The weights last published into `weights` and their version (for a kept state: one writer, which is the caller,
/// so the read is never torn).
fn read_published(weights: &rlf_shm::SharedWeights, policy: usize) -> crate::Result<(u64, Vec<f32>)> {
    let mut values = vec![0.0; weights.len()];
    let version = weights
        .try_read(&mut values)
        .map_err(|_| crate::RlfError::Protocol {
            component: "learner",
            message: format!("policy {policy}: its published weights were being written"),
        })?;
    Ok((version, values))
}

/// Publishes `values` as version `version` of policy `policy` into `weights` (which must hold as many).
fn publish_weights(
    weights: &rlf_shm::SharedWeights,
    policy: usize,
    version: u64,
    values: &[f32],
) -> crate::Result<PolicyUpdated> {
    if values.len() != weights.len() {
        return Err(crate::RlfError::WeightMismatch(format!(
            "{} values for a shared buffer of {}",
            values.len(),
            weights.len()
        )));
    }
    weights.publish(version, values);
    Ok(PolicyUpdated { policy, version })
}

/// New weights were published into shared memory after training (`policy_updated`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyUpdated {
    /// The policy.
    pub policy: usize,
    /// The policy version (SGD steps so far).
    pub version: u64,
}

/// Metrics of one training dataset (`training_reported`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingReport {
    /// The policy trained.
    pub policy: usize,
    /// The policy version after training.
    pub version: u64,
    /// Metrics by name (`train/policy_loss`, ...).
    pub metrics: Vec<(String, f64)>,
    /// [`Dataset::digest`](crate::algo::appo::Dataset::digest) of the dataset trained on, for the
    /// learner's first dataset.
    pub dataset_digest: Option<u64>,
}

/// A PBT update of policy `policy` (`pbt_update`, from the runner to every learner): it takes the
/// weights of `replace_from`, if any (whose learner saves a checkpoint for it first), and the
/// hyper-parameters `hyper`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PbtUpdate {
    /// The policy updated.
    pub policy: usize,
    /// The policy whose weights it takes.
    pub replace_from: Option<usize>,
    /// Its new hyper-parameters.
    pub hyper: Hyper,
}

/// The learner of `from` saved the checkpoint `path` for `policy` to take its weights from
/// (`pbt_weights_saved`, to every learner), with the update it answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PbtWeightsSaved {
    /// The update.
    pub update: PbtUpdate,
    /// The checkpoint's sidecar.
    pub path: PathBuf,
}
