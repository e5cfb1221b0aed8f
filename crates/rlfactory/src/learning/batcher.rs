//! The batcher: cuts trajectories into per-env sequences and releases a training dataset once it
//! holds `batch_size * num_batches_per_epoch` transitions.

use std::collections::VecDeque;

use super::Batch;
use crate::algo::appo::Dataset;
use crate::error::{Result, RlfError};
use crate::sampling::Trajectory;

struct Sequence {
    obs: Vec<f32>,
    actions: Vec<f32>,
    log_probs: Vec<f32>,
    values: Vec<f32>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    final_obs: Vec<(usize, Vec<f32>)>,
    next_obs: Vec<f32>,
    versions: Vec<u64>,
    /// The last sequence of its trajectory.
    closes: bool,
}

/// Assembles datasets from trajectories.
#[derive(Default)]
pub struct Batcher {
    sequences_per_dataset: usize,
    pending: VecDeque<Sequence>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("sequences_per_dataset", &self.sequences_per_dataset)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl Batcher {
    /// A batcher releasing datasets of `dataset_size` transitions made of sequences of `rollout`
    /// steps (`dataset_size` is a multiple of `rollout`).
    pub fn new(dataset_size: usize, rollout: usize) -> Self {
        Self {
            sequences_per_dataset: (dataset_size / rollout.max(1)).max(1),
            pending: VecDeque::new(),
        }
    }

    /// Trajectories with sequences still waiting for a dataset.
    pub fn pending_trajectories(&self) -> u64 {
        self.pending.iter().filter(|s| s.closes).count() as u64
    }

    /// Slot of `trajectory_ready`: adds the trajectory; returns the datasets now complete, each
    /// with the trajectories whose last sequence it holds.
    pub fn on_trajectory_ready(&mut self, traj: &Trajectory) -> Result<Vec<Batch>> {
        let (n, t) = (traj.num_envs, traj.len);
        let steps = n * t;
        let obs_dim = traj.obs.len().checked_div(steps).unwrap_or(0);
        let action_dim = traj.actions.len().checked_div(steps).unwrap_or(0);
        let bad = [
            traj.obs.len() != steps * obs_dim,
            traj.actions.len() != steps * action_dim,
            traj.log_probs.len() != steps,
            traj.values.len() != steps,
            traj.rewards.len() != steps,
            traj.terminated.len() != steps,
            traj.truncated.len() != steps,
            traj.versions.len() != steps,
            traj.next_obs.len() != n * obs_dim,
            traj.final_obs
                .iter()
                .any(|(i, o)| *i >= steps || o.len() != obs_dim),
        ];
        if steps == 0 || bad.iter().any(|&b| b) {
            return Err(RlfError::Protocol {
                component: "batcher",
                message: format!(
                    "trajectory of worker {} split {} has inconsistent sizes",
                    traj.worker, traj.split
                ),
            });
        }
        for i in 0..n {
            let at = |k: usize| k * n + i;
            let mut seq = Sequence {
                obs: Vec::with_capacity(t * obs_dim),
                actions: Vec::with_capacity(t * action_dim),
                log_probs: (0..t).map(|k| traj.log_probs[at(k)]).collect(),
                values: (0..t).map(|k| traj.values[at(k)]).collect(),
                rewards: (0..t).map(|k| traj.rewards[at(k)]).collect(),
                terminated: (0..t).map(|k| traj.terminated[at(k)]).collect(),
                truncated: (0..t).map(|k| traj.truncated[at(k)]).collect(),
                final_obs: Vec::new(),
                next_obs: traj.next_obs[i * obs_dim..(i + 1) * obs_dim].to_vec(),
                versions: (0..t).map(|k| traj.versions[at(k)]).collect(),
                closes: i + 1 == n,
            };
            for k in 0..t {
                seq.obs
                    .extend_from_slice(&traj.obs[at(k) * obs_dim..(at(k) + 1) * obs_dim]);
                seq.actions
                    .extend_from_slice(&traj.actions[at(k) * action_dim..(at(k) + 1) * action_dim]);
            }
            seq.final_obs = traj
                .final_obs
                .iter()
                .filter(|(idx, _)| idx % n == i)
                .map(|(idx, o)| (idx / n, o.clone()))
                .collect();
            self.pending.push_back(seq);
        }
        let mut ready = Vec::new();
        while self.pending.len() >= self.sequences_per_dataset {
            ready.push(self.release(t));
        }
        Ok(ready)
    }

    fn release(&mut self, t: usize) -> Batch {
        let mut trajectories = 0;
        let mut d = Dataset {
            num_sequences: self.sequences_per_dataset,
            seq_len: t,
            ..Dataset::default()
        };
        for (q, seq) in self.pending.drain(..self.sequences_per_dataset).enumerate() {
            d.obs.extend(seq.obs);
            d.actions.extend(seq.actions);
            d.log_probs.extend(seq.log_probs);
            d.values.extend(seq.values);
            d.rewards.extend(seq.rewards);
            d.terminated.extend(seq.terminated);
            d.truncated.extend(seq.truncated);
            d.final_obs
                .extend(seq.final_obs.into_iter().map(|(k, o)| (q * t + k, o)));
            d.next_obs.extend(seq.next_obs);
            d.versions.extend(seq.versions);
            trajectories += u64::from(seq.closes);
        }
        Batch {
            dataset: d,
            trajectories,
        }
    }
}
