//! The learner: trains APPO on each dataset and publishes the new weights with their version into
//! shared memory (a seqlock the inference workers read between batches); `policy_updated` then
//! carries only the version.

use rlf_shm::SharedWeights;

use super::{PolicyUpdated, TrainingReport};
use crate::algo::appo::{Appo, Dataset, TrainingState};
use crate::error::Result;
use crate::model::{NamedTensor, Policy};

/// Owns the training state (network, optimiser, version).
#[derive(Debug)]
pub struct Learner {
    appo: Appo,
    weights: SharedWeights,
}

impl Learner {
    /// A learner around an APPO state, publishing into `weights`.
    pub fn new(appo: Appo, weights: SharedWeights) -> Self {
        Self { appo, weights }
    }

    /// The policy version (SGD steps taken).
    pub fn version(&self) -> u64 {
        self.appo.version()
    }

    /// Publishes the current weights and their version.
    pub fn publish(&self) -> Result<PolicyUpdated> {
        let version = self.appo.version();
        let values = self.appo.model().weights()?.values;
        if values.len() != self.weights.len() {
            return Err(crate::RlfError::WeightMismatch(format!(
                "{} values for a shared buffer of {}",
                values.len(),
                self.weights.len()
            )));
        }
        self.weights.publish(version, &values);
        Ok(PolicyUpdated { version })
    }

    /// Slot of `batch_ready`: trains on the dataset; returns the new weights and the metrics.
    pub fn on_batch_ready(&mut self, dataset: &Dataset) -> Result<(PolicyUpdated, TrainingReport)> {
        let metrics = self.appo.train(dataset)?;
        let report = TrainingReport {
            version: self.appo.version(),
            metrics: metrics.into_iter().collect(),
            dataset_digest: dataset.digest(),
        };
        Ok((self.publish()?, report))
    }

    /// What a checkpoint holds: the weights and statistics by name, Adam's moments (named
    /// `adam.exp_avg.<parameter>` and `adam.exp_avg_sq.<parameter>`), and the training state.
    pub fn state(&self) -> Result<(Vec<NamedTensor>, TrainingState)> {
        let mut tensors = self.appo.model().named_tensors()?;
        tensors.extend(self.appo.optimizer_state()?);
        Ok((tensors, self.appo.training_state()))
    }

    /// Continues from a checkpoint's weights, statistics, Adam's moments and training state.
    /// Returns whether the moments were in it (without them Adam starts afresh).
    pub fn restore(&mut self, tensors: &[NamedTensor], state: TrainingState) -> Result<bool> {
        self.appo.model_mut().load_named_tensors(tensors)?;
        self.appo.restore_training_state(tensors, state)
    }
}
