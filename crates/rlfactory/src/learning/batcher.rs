//! The batcher: cuts trajectories into per-env sequences and releases a training dataset once it
//! holds `batch_size * num_batches_per_epoch` transitions. It moves no data: a dataset is a list
//! of column ranges of trajectory slots ([`Part`]), which the learner views as tensors.
//!
//! It also owns the slots' way back to the rollout workers: a trajectory wholly older than
//! `--max_policy_lag` versions is dropped and its slot released at once; any other slot stays
//! with the batcher (waiting for a dataset) and then with the learner (in a dataset not yet
//! trained on) until the dataset that closes it is trained on. The learner trains datasets in
//! order, so each `training_reported` frees the slots of the oldest dataset in flight. A rollout
//! worker's replacement gets back every slot of its pool that neither holds.

use std::collections::VecDeque;

use super::{Batch, Part};

/// A trajectory slot: slot `buffer` of rollout worker `worker`'s pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The rollout worker (owner of the pool).
    pub worker: usize,
    /// The slot in its pool.
    pub buffer: usize,
}

/// What a trajectory became: the datasets it completed and the slots free again.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Assembled {
    /// Datasets now complete, in order, for the learner.
    pub datasets: Vec<Batch>,
    /// Slots to hand back to their rollout workers (a dropped trajectory's).
    pub released: Vec<Slot>,
}

/// The batcher's counts of trajectories, for the run's accounting.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatcherCounts {
    /// Trajectories read.
    pub read: u64,
    /// Trajectories dropped as wholly older than `--max_policy_lag` versions.
    pub dropped: u64,
    /// Trajectories whose last sequence went into a dataset.
    pub batched: u64,
    /// Trajectories with sequences still waiting for a dataset.
    pub pending: u64,
}

/// Assembles datasets from trajectories and tracks which slots it and the learner hold.
#[derive(Debug, Default)]
pub struct Batcher {
    sequences_per_dataset: usize,
    /// Columns of trajectories still waiting for a dataset, oldest first.
    pending: VecDeque<Part>,
    /// Datasets handed to the learner and not yet trained on, oldest first, each with the slots
    /// it closes.
    in_flight: VecDeque<Vec<Slot>>,
    /// The learner's latest version.
    version: u64,
    max_policy_lag: u64,
    read: u64,
    dropped: u64,
    batched: u64,
}

impl Batcher {
    /// A batcher releasing datasets of `dataset_size` transitions made of sequences of `rollout`
    /// steps (`dataset_size` is a multiple of `rollout`), dropping trajectories whose newest step
    /// is more than `max_policy_lag` versions behind the learner.
    pub fn new(dataset_size: usize, rollout: usize, max_policy_lag: u64) -> Self {
        Self {
            sequences_per_dataset: (dataset_size / rollout.max(1)).max(1),
            max_policy_lag,
            ..Self::default()
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> BatcherCounts {
        BatcherCounts {
            read: self.read,
            dropped: self.dropped,
            batched: self.batched,
            pending: self.pending.len() as u64,
        }
    }

    /// Whether `slot` is held here or by the learner.
    pub fn holds(&self, slot: Slot) -> bool {
        self.pending.iter().any(|p| p.slot() == slot) || self.in_flight.iter().flatten().any(|&s| s == slot)
    }

    /// The slots of `worker`'s pool of `num_buffers` that neither the batcher nor the learner
    /// holds: what a replacement of that worker's process starts with.
    pub fn free_slots(&self, worker: usize, num_buffers: usize) -> Vec<usize> {
        (0..num_buffers)
            .filter(|&buffer| !self.holds(Slot { worker, buffer }))
            .collect()
    }

    /// Slot of `trajectory_ready`: the trajectory in `slot`, `num_envs` sequences whose steps were
    /// produced by policy `versions`. Dropped (its slot released) if wholly older than
    /// `--max_policy_lag` versions; otherwise added, and the datasets now complete returned.
    pub fn on_trajectory_ready(&mut self, slot: Slot, num_envs: usize, versions: &[u64]) -> Assembled {
        self.read += 1;
        let newest = versions.iter().copied().max().unwrap_or(self.version);
        if self.version.saturating_sub(newest) > self.max_policy_lag {
            self.dropped += 1;
            return Assembled {
                datasets: Vec::new(),
                released: vec![slot],
            };
        }
        if num_envs > 0 {
            self.pending.push_back(Part {
                worker: slot.worker,
                buffer: slot.buffer,
                first_env: 0,
                num_envs,
                closes: true,
            });
        }
        let mut datasets = Vec::new();
        while self.pending.iter().map(|p| p.num_envs).sum::<usize>() >= self.sequences_per_dataset {
            let dataset = self.release();
            self.batched += dataset.trajectories();
            self.in_flight.push_back(
                dataset
                    .parts
                    .iter()
                    .filter(|p| p.closes)
                    .map(Part::slot)
                    .collect(),
            );
            datasets.push(dataset);
        }
        Assembled {
            datasets,
            released: Vec::new(),
        }
    }

    /// Slot of `training_reported`: the learner, now at `version`, trained on the oldest dataset
    /// in flight; returns the slots that dataset closed.
    pub fn on_training_reported(&mut self, version: u64) -> Vec<Slot> {
        self.version = version;
        self.in_flight.pop_front().unwrap_or_default()
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

    fn slot(worker: usize, buffer: usize) -> Slot {
        Slot { worker, buffer }
    }

    #[test]
    fn trajectories_are_cut_into_datasets_of_whole_sequences_in_order() {
        // Datasets of 6 sequences of 4 steps from trajectories of 4 envs.
        let mut b = Batcher::new(24, 4, 100);
        assert_eq!(b.on_trajectory_ready(slot(0, 1), 4, &[0]), Assembled::default());
        assert!(b.holds(slot(0, 1)));
        let ready = b.on_trajectory_ready(slot(1, 0), 4, &[0]).datasets;
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].parts, [part(0, 1, 0, 4, true), part(1, 0, 0, 2, false)]);
        assert_eq!(ready[0].trajectories(), 1);
        // (0, 1) is in a dataset the learner has not trained on yet: still held.
        assert!(b.holds(slot(0, 1)) && b.holds(slot(1, 0)));
        let ready = b.on_trajectory_ready(slot(0, 2), 4, &[0]).datasets;
        assert_eq!(ready[0].parts, [part(1, 0, 2, 2, true), part(0, 2, 0, 4, true)]);
        assert_eq!(b.counts().pending, 0);
        assert_eq!(b.counts().batched, 3);
    }

    #[test]
    fn one_trajectory_can_fill_several_datasets() {
        let mut b = Batcher::new(8, 4, 100);
        let ready = b.on_trajectory_ready(slot(0, 0), 5, &[0]).datasets;
        assert_eq!(ready.len(), 2);
        assert_eq!(ready[1].parts, [part(0, 0, 2, 2, false)]);
        assert_eq!(b.counts().pending, 1);
    }

    #[test]
    fn trajectories_wholly_older_than_the_lag_are_dropped_and_their_slot_released() {
        let mut b = Batcher::new(8, 4, 2);
        // The learner is at version 10.
        assert!(b.on_training_reported(10).is_empty());
        // Newest step at version 7: 3 behind, more than the lag of 2.
        let dropped = b.on_trajectory_ready(slot(0, 3), 2, &[5, 6, 7]);
        assert_eq!(dropped.released, [slot(0, 3)]);
        assert!(dropped.datasets.is_empty() && !b.holds(slot(0, 3)));
        // Newest step at version 8: exactly the lag, kept (older steps are masked by the learner).
        let kept = b.on_trajectory_ready(slot(0, 4), 2, &[1, 8]);
        assert!(kept.released.is_empty() && kept.datasets.len() == 1);
        let counts = b.counts();
        assert_eq!((counts.read, counts.dropped, counts.batched), (2, 1, 1));
        // A trajectory with no versions is never dropped.
        assert!(b.on_trajectory_ready(slot(1, 0), 2, &[]).released.is_empty());
    }

    #[test]
    fn a_slot_is_released_once_the_dataset_closing_it_is_trained_on() {
        let mut b = Batcher::new(8, 4, 100);
        // Dataset 1 closes (0, 0) and (0, 1); dataset 2 closes (1, 0) and holds one column of (1, 1).
        assert!(b.on_trajectory_ready(slot(0, 0), 1, &[0]).datasets.is_empty());
        assert_eq!(b.on_trajectory_ready(slot(0, 1), 1, &[0]).datasets.len(), 1);
        assert!(b.on_trajectory_ready(slot(1, 0), 1, &[0]).datasets.is_empty());
        assert_eq!(b.on_trajectory_ready(slot(1, 1), 2, &[0]).datasets.len(), 1);
        assert_eq!(b.free_slots(0, 3), [2]);
        assert_eq!(b.on_training_reported(1), [slot(0, 0), slot(0, 1)]);
        assert_eq!(b.free_slots(0, 3), [0, 1, 2]);
        assert_eq!(b.on_training_reported(2), [slot(1, 0)]);
        // (1, 1) still has a column waiting for the next dataset.
        assert_eq!(b.free_slots(1, 2), [0]);
        assert!(b.on_training_reported(3).is_empty());
    }

    #[test]
    fn a_replacement_gets_every_slot_neither_the_batcher_nor_the_learner_holds() {
        let mut b = Batcher::new(16, 4, 100);
        // Worker 0's slots 1 (waiting for a dataset) and 3 (in a dataset in flight).
        let ready = b.on_trajectory_ready(slot(0, 3), 4, &[0]);
        assert!(ready.datasets.len() == 1 && b.holds(slot(0, 3)));
        assert!(b.on_trajectory_ready(slot(0, 1), 2, &[0]).datasets.is_empty());
        assert_eq!(b.free_slots(0, 5), [0, 2, 4]);
        // Another worker's slots are not worker 0's.
        assert_eq!(b.free_slots(1, 2), [0, 1]);
    }
}
