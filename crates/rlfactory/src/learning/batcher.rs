//! The batcher: cuts trajectories into per-env sequences and releases a training dataset once it
//! holds `batch_size * num_batches_per_epoch` transitions. It moves no data: a dataset is a list
//! of column ranges of trajectory slots ([`Part`]), which the learner views as tensors.

use std::collections::VecDeque;

use super::{Batch, Part};

/// Assembles datasets from trajectories.
#[derive(Debug, Default)]
pub struct Batcher {
    sequences_per_dataset: usize,
    /// Columns of trajectories still waiting for a dataset, oldest first.
    pending: VecDeque<Part>,
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
        self.pending.len() as u64
    }

    /// Whether slot `buffer` of `worker` has sequences waiting for a dataset.
    pub fn holds(&self, worker: usize, buffer: usize) -> bool {
        self.pending
            .iter()
            .any(|p| (p.worker, p.buffer) == (worker, buffer))
    }

    /// Slot of `trajectory_ready`: adds the `num_envs` sequences of slot `buffer` of `worker`;
    /// returns the datasets now complete, in order.
    pub fn on_trajectory_ready(&mut self, worker: usize, buffer: usize, num_envs: usize) -> Vec<Batch> {
        if num_envs > 0 {
            self.pending.push_back(Part {
                worker,
                buffer,
                first_env: 0,
                num_envs,
                closes: true,
            });
        }
        let mut ready = Vec::new();
        while self.pending.iter().map(|p| p.num_envs).sum::<usize>() >= self.sequences_per_dataset {
            ready.push(self.release());
        }
        ready
    }

    fn release(&mut self) -> Batch {
        let mut parts = Vec::new();
        let mut missing = self.sequences_per_dataset;
        while missing > 0 {
            let Some(front) = self.pending.front_mut() else {
                break;
            };
            if front.num_envs <= missing {
                missing -= front.num_envs;
                parts.extend(self.pending.pop_front());
            } else {
                parts.push(Part {
                    num_envs: missing,
                    closes: false,
                    ..*front
                });
                front.first_env += missing;
                front.num_envs -= missing;
                missing = 0;
            }
        }
        Batch { parts }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(worker: usize, buffer: usize, first_env: usize, num_envs: usize, closes: bool) -> Part {
        Part {
            worker,
            buffer,
            first_env,
            num_envs,
            closes,
        }
    }

    #[test]
    fn trajectories_are_cut_into_datasets_of_whole_sequences_in_order() {
        // Datasets of 6 sequences of 4 steps from trajectories of 4 envs.
        let mut b = Batcher::new(24, 4);
        assert!(b.on_trajectory_ready(0, 1, 4).is_empty());
        assert!(b.holds(0, 1));
        let ready = b.on_trajectory_ready(1, 0, 4);
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].parts, [part(0, 1, 0, 4, true), part(1, 0, 0, 2, false)]);
        assert_eq!(ready[0].trajectories(), 1);
        assert!(!b.holds(0, 1) && b.holds(1, 0));
        let ready = b.on_trajectory_ready(0, 2, 4);
        assert_eq!(ready[0].parts, [part(1, 0, 2, 2, true), part(0, 2, 0, 4, true)]);
        assert_eq!(b.pending_trajectories(), 0);
    }

    #[test]
    fn one_trajectory_can_fill_several_datasets() {
        let mut b = Batcher::new(8, 4);
        let ready = b.on_trajectory_ready(0, 0, 5);
        assert_eq!(ready.len(), 2);
        assert_eq!(ready[1].parts, [part(0, 0, 2, 2, false)]);
        assert_eq!(b.pending_trajectories(), 1);
    }
}
