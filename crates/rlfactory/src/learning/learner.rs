//! The learner: trains APPO on each dataset and publishes the new weights.

use super::{PolicyUpdated, TrainingReport};
use crate::algo::appo::{Appo, Dataset};
use crate::error::Result;
use crate::model::Policy;

/// Owns the training state (network, optimiser, version).
#[derive(Debug)]
pub struct Learner {
    appo: Appo,
}

impl Learner {
    /// A learner around an APPO state.
    pub fn new(appo: Appo) -> Self {
        Self { appo }
    }

    /// The current weights, for a `policy_updated` at start.
    pub fn publish(&self) -> Result<PolicyUpdated> {
        Ok(PolicyUpdated {
            version: self.appo.version(),
            weights: self.appo.model().weights()?,
        })
    }

    /// Slot of `batch_ready`: trains on the dataset; returns the new weights and the metrics.
    pub fn on_batch_ready(&mut self, dataset: &Dataset) -> Result<(PolicyUpdated, TrainingReport)> {
        let metrics = self.appo.train(dataset)?;
        let report = TrainingReport {
            version: self.appo.version(),
            metrics: metrics.into_iter().collect(),
        };
        Ok((self.publish()?, report))
    }

    /// Saves the weights and statistics.
    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        self.appo.model().save(path)
    }
}
