//! Learning: the [`Batcher`] assembles trajectories into training datasets; the [`Learner`] trains
//! on them and publishes new weights.

mod batcher;
mod learner;

use serde::{Deserialize, Serialize};

use crate::algo::appo::Dataset;

pub use batcher::Batcher;
pub use learner::Learner;

/// A training dataset and the trajectories whose last sequence it holds (`batch_ready`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// The dataset.
    pub dataset: Dataset,
    /// Trajectories completed by this dataset.
    pub trajectories: u64,
}

/// New weights were published into shared memory after training (`policy_updated`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyUpdated {
    /// The policy version (SGD steps so far).
    pub version: u64,
}

/// Metrics of one training dataset (`training_reported`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingReport {
    /// The policy version after training.
    pub version: u64,
    /// Metrics by name (`train/policy_loss`, ...).
    pub metrics: Vec<(String, f64)>,
    /// [`Dataset::digest`](crate::algo::appo::Dataset::digest) of the dataset trained on.
    pub dataset_digest: u64,
}
