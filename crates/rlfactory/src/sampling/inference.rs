//! The inference worker: every waiting request in, one batched forward pass, actions out, with the
//! newest weights the learner has published.
//!
//! Weights come through a seqlock in shared memory ([`rlf_shm::SharedWeights`]): before each batch
//! the worker compares the published version with its own and, when newer, copies the weights out
//! (a read that overlaps a write is discarded and retried at the next batch, never used).

use rlf_shm::SharedWeights;

use super::{ActionsReady, PolicyRequest};
use crate::error::{Result, RlfError};
use crate::model::{ActOutput, Policy, PolicyWeights};

/// Runs the policy for rollout workers and follows the learner's published weights.
pub struct InferenceWorker {
    policy: Box<dyn Policy>,
    weights: SharedWeights,
    scratch: PolicyWeights,
    version: u64,
    obs: Vec<f32>,
}

impl std::fmt::Debug for InferenceWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InferenceWorker")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl InferenceWorker {
    /// An inference worker with `policy` at version 0, following `weights`.
    pub fn new(policy: Box<dyn Policy>, weights: SharedWeights) -> Self {
        let scratch = PolicyWeights {
            values: vec![0.0; weights.len()],
        };
        Self {
            policy,
            weights,
            scratch,
            version: 0,
            obs: Vec::new(),
        }
    }

    /// The version of the weights in use.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Loads the published weights if they are newer than those in use.
    pub fn refresh_weights(&mut self) -> Result<()> {
        if self.weights.version() <= self.version {
            return Ok(());
        }
        if let Ok(version) = self.weights.try_read(&mut self.scratch.values) {
            if version > self.version {
                self.policy.load_weights(&self.scratch)?;
                self.version = version;
            }
        }
        Ok(())
    }

    /// Chooses actions for every request with one forward pass; one answer per request, in order.
    pub fn on_policy_requested(&mut self, requests: &[PolicyRequest]) -> Result<Vec<ActionsReady>> {
        self.refresh_weights()?;
        let obs_dim = self.policy.obs_dim();
        self.obs.clear();
        for r in requests {
            if obs_dim == 0 || r.obs.is_empty() || r.obs.len() % obs_dim != 0 {
                return Err(RlfError::Protocol {
                    component: "inference worker",
                    message: format!(
                        "worker {} split {}: {} observation values are not a batch of {obs_dim}",
                        r.worker,
                        r.split,
                        r.obs.len()
                    ),
                });
            }
            self.obs.extend_from_slice(&r.obs);
        }
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let out = self.policy.act(&self.obs, false)?;
        let a = self.policy.action_dim();
        let mut at = 0;
        Ok(requests
            .iter()
            .map(|r| {
                let n = r.obs.len() / obs_dim;
                let output = ActOutput {
                    actions: out.actions[at * a..(at + n) * a].to_vec(),
                    log_probs: out.log_probs[at..at + n].to_vec(),
                    values: out.values[at..at + n].to_vec(),
                };
                at += n;
                ActionsReady {
                    worker: r.worker,
                    split: r.split,
                    incarnation: r.incarnation,
                    version: self.version,
                    output,
                }
            })
            .collect())
    }
}
