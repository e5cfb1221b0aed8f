//! The inference worker: batches of observations in, actions out, with the current policy.

use super::{ActionsReady, PolicyRequest};
use crate::error::Result;
use crate::learning::PolicyUpdated;
use crate::model::Policy;

/// Runs the policy for rollout workers and follows the learner's published weights.
pub struct InferenceWorker {
    policy: Box<dyn Policy>,
    version: u64,
}

impl std::fmt::Debug for InferenceWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InferenceWorker")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl InferenceWorker {
    /// An inference worker with `policy` at version 0.
    pub fn new(policy: Box<dyn Policy>) -> Self {
        Self { policy, version: 0 }
    }

    /// The version of the weights in use.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Slot of `policy_requested`: chooses actions for the request's observations.
    pub fn on_policy_requested(&mut self, request: &PolicyRequest) -> Result<ActionsReady> {
        let output = self.policy.act(&request.obs, false)?;
        Ok(ActionsReady {
            worker: request.worker,
            split: request.split,
            version: self.version,
            output,
        })
    }

    /// Slot of `policy_updated`: loads newer weights.
    pub fn on_policy_updated(&mut self, update: &PolicyUpdated) -> Result<()> {
        if update.version >= self.version {
            self.policy.load_weights(&update.weights)?;
            self.version = update.version;
        }
        Ok(())
    }
}
