//! The inference worker: every waiting request in, one batched forward pass, actions out, with the
//! newest weights the learner has published. Observations are read from, and actions,
//! log-probabilities, values and the policy version written into, the rollout workers' trajectory
//! slots; the answer (`actions_ready`) only says they are there.
//!
//! Weights come through a seqlock in shared memory ([`rlf_shm::SharedWeights`]): before each batch
//! the worker compares the published version with its own and, when newer, copies the weights out
//! (a read that overlaps a write is discarded and retried at the next batch, never used).

use rlf_shm::SharedWeights;

use super::{ActionsReady, Field, PolicyRequest, TrajectoryPool};
use crate::error::{Result, RlfError};
use crate::model::{Policy, PolicyWeights};

/// Runs the policy for rollout workers and follows the learner's published weights.
pub struct InferenceWorker {
    policy: Box<dyn Policy>,
    weights: SharedWeights,
    scratch: PolicyWeights,
    version: u64,
    /// Every rollout worker's trajectory pool, by worker index.
    pools: Vec<TrajectoryPool>,
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
    /// An inference worker with `policy` at version 0, following `weights`, for the rollout
    /// workers owning `pools` (by worker index).
    pub fn new(policy: Box<dyn Policy>, weights: SharedWeights, pools: Vec<TrajectoryPool>) -> Self {
        let scratch = PolicyWeights {
            values: vec![0.0; weights.len()],
        };
        Self {
            policy,
            weights,
            scratch,
            version: 0,
            pools,
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

    /// Chooses actions for every request with one forward pass and writes them into the
    /// requesters' slots; returns one answer per request, in order. Requests of a worker process
    /// that has since been replaced get no answer (their slot may be the replacement's now).
    pub fn on_policy_requested(&mut self, requests: &[PolicyRequest]) -> Result<Vec<ActionsReady>> {
        self.refresh_weights()?;
        let obs_dim = self.policy.obs_dim();
        let protocol = |message: String| RlfError::Protocol {
            component: "inference worker",
            message,
        };
        let mut live = Vec::with_capacity(requests.len());
        self.obs.clear();
        for r in requests {
            let pool = self
                .pools
                .get(r.worker)
                .ok_or_else(|| protocol(format!("a request from unknown rollout worker {}", r.worker)))?;
            if pool.owner() != u64::from(r.incarnation) {
                continue;
            }
            let shape = pool.shape();
            if shape.obs_dim != obs_dim {
                return Err(protocol(format!(
                    "worker {}: observations of {} values, the policy takes {obs_dim}",
                    r.worker, shape.obs_dim
                )));
            }
            let at = self.obs.len();
            self.obs.resize(at + shape.num_envs * obs_dim, 0.0);
            pool.get(r.buffer, Field::Obs, r.step, &mut self.obs[at..])?;
            live.push((r, shape.num_envs));
        }
        if live.is_empty() {
            return Ok(Vec::new());
        }
        let out = self.policy.act(&self.obs, false)?;
        let a = self.policy.action_dim();
        let mut at = 0;
        let mut answers = Vec::with_capacity(live.len());
        for (r, n) in live {
            let pool = &self.pools[r.worker];
            pool.put(
                r.buffer,
                Field::Actions,
                r.step,
                &out.actions[at * a..(at + n) * a],
            )?;
            pool.put(r.buffer, Field::LogProbs, r.step, &out.log_probs[at..at + n])?;
            pool.put(r.buffer, Field::Values, r.step, &out.values[at..at + n])?;
            pool.put_version(r.buffer, r.step, self.version)?;
            at += n;
            answers.push(ActionsReady {
                worker: r.worker,
                split: r.split,
                incarnation: r.incarnation,
            });
        }
        Ok(answers)
    }
}
