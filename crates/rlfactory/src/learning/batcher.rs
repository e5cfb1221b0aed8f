//! The batcher: cuts trajectories into per-env sequences and releases a training dataset once it
//! holds `batch_size * num_batches_per_epoch` transitions. It moves no data: a dataset is a list
//! of column ranges of trajectory slots ([`Part`]), which the learner views as tensors.
//!
//! With several policies each policy has its own queue and its own datasets, for its own
//! learner: a trajectory's columns go to the policies that acted in them ([`Share`]), so one
//! slot may feed several learners.
//!
//! It also owns the slots' way back to the rollout workers: a trajectory wholly older than
//! `--max_policy_lag` versions (of the policy concerned) is dropped and its slot released at
//! once; any other slot stays with the batcher (waiting for a dataset) and then with the learners
//! (in datasets not yet trained on) until every dataset holding part of it is trained on. Each
//! learner trains its datasets in order, so each `training_reported` frees what the oldest
//! dataset of that policy in flight was the last to hold. A rollout worker's replacement gets
//! back every slot of its pool that none holds.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use super::{Batch, Part};

/// A trajectory slot: slot `buffer` of rollout worker `worker`'s pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Slot {
    /// The rollout worker (owner of the pool).
    pub worker: usize,
    /// The slot in its pool.
    pub buffer: usize,
}

/// The columns of a trajectory that one policy acted in, and the newest version of that policy
/// among its steps (`None`: no version recorded, never dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The policy.
    pub policy: usize,
    /// Ranges of env columns, in order.
    pub columns: Vec<Range<usize>>,
    /// The newest policy version among the policy's steps.
    pub newest: Option<u64>,
}

/// What a trajectory became: the datasets it completed and the slots free again.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Assembled {
    /// Datasets now complete, in order, each for the learner of its policy.
    pub datasets: Vec<(usize, Batch)>,
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
    /// Trajectories every dataset holding part of them was trained on (their slot released).
    pub trained: u64,
}

/// One policy's sequences waiting for a dataset and its datasets in flight.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Queue {
    /// Columns of trajectories still waiting for a dataset, oldest first.
    pending: VecDeque<Part>,
    /// Datasets handed to the learner and not yet trained on, oldest first, each with the slots
    /// whose last part (in this queue) it holds.
    in_flight: VecDeque<Vec<Slot>>,
    /// The learner's latest version.
    version: u64,
}

impl Queue {
    fn waiting(&self) -> usize {
        self.pending.iter().map(|p| p.num_envs).sum()
    }

    fn release(&mut self, sequences: usize) -> Batch {
        let mut parts = Vec::new();
        let mut missing = sequences;
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

/// Assembles datasets from trajectories, per policy, and tracks which slots it and the learners
/// hold. Its state is plain data, kept whole by a serial run that stops ([`rlf_signal::KeptState`]).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Batcher {
    sequences_per_dataset: usize,
    queues: Vec<Queue>,
    /// Per slot held: the queues whose pending parts or datasets in flight still hold part of it.
    held: HashMap<Slot, usize>,
    /// Per slot with parts waiting: the queues whose last part of it is not yet in a dataset.
    unbatched: HashMap<Slot, usize>,
    max_policy_lag: u64,
    read: u64,
    dropped: u64,
    batched: u64,
    trained: u64,
}

impl Batcher {
    /// A batcher for `num_policies` policies releasing datasets of `dataset_size` transitions made
    /// of sequences of `rollout` steps (`dataset_size` is a multiple of `rollout`), dropping a
    /// policy's share of a trajectory whose newest step is more than `max_policy_lag` versions
    /// behind that policy's learner.
    pub fn new(num_policies: usize, dataset_size: usize, rollout: usize, max_policy_lag: u64) -> Self {
        Self {
            sequences_per_dataset: (dataset_size / rollout.max(1)).max(1),
            queues: (0..num_policies.max(1)).map(|_| Queue::default()).collect(),
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
            pending: self.unbatched.len() as u64,
            trained: self.trained,
        }
    }

    /// Whether `slot` is held here or by a learner.
    pub fn holds(&self, slot: Slot) -> bool {
        self.held.contains_key(&slot)
    }

    /// The slots of `worker`'s pool of `num_buffers` that neither the batcher nor a learner
    /// holds: what a replacement of that worker's process starts with.
    pub fn free_slots(&self, worker: usize, num_buffers: usize) -> Vec<usize> {
        (0..num_buffers)
            .filter(|&buffer| !self.holds(Slot { worker, buffer }))
            .collect()
    }

    /// Slot of `trajectory_ready`: the trajectory in `slot`, shared among policies as `shares`
    /// says. A share wholly older than `--max_policy_lag` versions of its policy is dropped; a
    /// trajectory with nothing left is dropped and its slot released. Otherwise its parts are
    /// queued, and the datasets now complete returned.
    pub fn on_trajectory_ready(&mut self, slot: Slot, shares: &[Share]) -> Assembled {
        self.read += 1;
        let mut taken = 0;
        let mut touched = Vec::new();
        for share in shares {
            let Some(queue) = self.queues.get_mut(share.policy) else {
                continue;
            };
            let columns: Vec<_> = share.columns.iter().filter(|r| !r.is_empty()).collect();
            let too_old = share
                .newest
                .is_some_and(|newest| queue.version.saturating_sub(newest) > self.max_policy_lag);
            if columns.is_empty() || too_old {
                continue;
            }
            for (i, r) in columns.iter().enumerate() {
                queue.pending.push_back(Part {
                    worker: slot.worker,
                    buffer: slot.buffer,
                    first_env: r.start,
                    num_envs: r.len(),
                    closes: i + 1 == columns.len(),
                });
            }
            taken += 1;
            touched.push(share.policy);
        }
        if taken == 0 {
            self.dropped += 1;
            return Assembled {
                datasets: Vec::new(),
                released: vec![slot],
            };
        }
        self.held.insert(slot, taken);
        self.unbatched.insert(slot, taken);
        let mut datasets = Vec::new();
        for policy in touched {
            while self.queues[policy].waiting() >= self.sequences_per_dataset {
                let dataset = self.queues[policy].release(self.sequences_per_dataset);
                let closed: Vec<Slot> = dataset
                    .parts
                    .iter()
                    .filter(|p| p.closes)
                    .map(Part::slot)
                    .collect();
                for s in &closed {
                    if let Some(left) = self.unbatched.get_mut(s) {
                        *left -= 1;
                        if *left == 0 {
                            self.unbatched.remove(s);
                            self.batched += 1;
                        }
                    }
                }
                self.queues[policy].in_flight.push_back(closed);
                datasets.push((policy, dataset));
            }
        }
        Assembled {
            datasets,
            released: Vec::new(),
        }
    }

    /// Slot of `training_reported`: `policy`'s learner, now at `version`, trained on its oldest
    /// dataset in flight; returns the slots no queue or dataset holds any more.
    pub fn on_training_reported(&mut self, policy: usize, version: u64) -> Vec<Slot> {
        let Some(queue) = self.queues.get_mut(policy) else {
            return Vec::new();
        };
        queue.version = version;
        let mut released = Vec::new();
        for slot in queue.in_flight.pop_front().unwrap_or_default() {
            if let Some(left) = self.held.get_mut(&slot) {
                *left -= 1;
                if *left == 0 {
                    self.held.remove(&slot);
                    self.trained += 1;
                    released.push(slot);
                }
            }
        }
        released
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

    /// A trajectory of one policy: all `num_envs` columns, steps of `versions`.
    fn whole(b: &mut Batcher, slot: Slot, num_envs: usize, versions: &[u64]) -> Assembled {
        let share = Share {
            policy: 0,
            columns: std::iter::once(0..num_envs).collect(),
            newest: versions.iter().copied().max(),
        };
        b.on_trajectory_ready(slot, &[share])
    }

    /// A share of `policy`: columns `(start, end)`, end excluded.
    fn share(policy: usize, columns: &[(usize, usize)], newest: u64) -> Share {
        Share {
            policy,
            columns: columns.iter().map(|&(start, end)| start..end).collect(),
            newest: Some(newest),
        }
    }

    #[test]
    fn trajectories_are_cut_into_datasets_of_whole_sequences_in_order() {
        // Datasets of 6 sequences of 4 steps from trajectories of 4 envs.
        let mut b = Batcher::new(1, 24, 4, 100);
        assert_eq!(whole(&mut b, slot(0, 1), 4, &[0]), Assembled::default());
        assert!(b.holds(slot(0, 1)));
        let ready = whole(&mut b, slot(1, 0), 4, &[0]).datasets;
        assert_eq!(ready.len(), 1);
        assert_eq!(
            ready[0].1.parts,
            [part(0, 1, 0, 4, true), part(1, 0, 0, 2, false)]
        );
        assert_eq!(ready[0].1.parts.iter().filter(|p| p.closes).count(), 1);
        // (0, 1) is in a dataset the learner has not trained on yet: still held.
        assert!(b.holds(slot(0, 1)) && b.holds(slot(1, 0)));
        let ready = whole(&mut b, slot(0, 2), 4, &[0]).datasets;
        assert_eq!(ready[0].1.parts, [part(1, 0, 2, 2, true), part(0, 2, 0, 4, true)]);
        assert_eq!(b.counts().pending, 0);
        assert_eq!(b.counts().batched, 3);
    }

    #[test]
    fn one_trajectory_can_fill_several_datasets() {
        let mut b = Batcher::new(1, 8, 4, 100);
        let ready = whole(&mut b, slot(0, 0), 5, &[0]).datasets;
        assert_eq!(ready.len(), 2);
        assert_eq!(ready[1].1.parts, [part(0, 0, 2, 2, false)]);
        assert_eq!(b.counts().pending, 1);
    }

    #[test]
    fn trajectories_wholly_older_than_the_lag_are_dropped_and_their_slot_released() {
        let mut b = Batcher::new(1, 8, 4, 2);
        // The learner is at version 10.
        assert!(b.on_training_reported(0, 10).is_empty());
        // Newest step at version 7: 3 behind, more than the lag of 2.
        let dropped = whole(&mut b, slot(0, 3), 2, &[5, 6, 7]);
        assert_eq!(dropped.released, [slot(0, 3)]);
        assert!(dropped.datasets.is_empty() && !b.holds(slot(0, 3)));
        // Newest step at version 8: exactly the lag, kept (older steps are masked by the learner).
        let kept = whole(&mut b, slot(0, 4), 2, &[1, 8]);
        assert!(kept.released.is_empty() && kept.datasets.len() == 1);
        let counts = b.counts();
        assert_eq!((counts.read, counts.dropped, counts.batched), (2, 1, 1));
        // A trajectory with no versions is never dropped.
        assert!(whole(&mut b, slot(1, 0), 2, &[]).released.is_empty());
    }

    #[test]
    fn a_slot_is_released_once_the_dataset_closing_it_is_trained_on() {
        let mut b = Batcher::new(1, 8, 4, 100);
        // Dataset 1 closes (0, 0) and (0, 1); dataset 2 closes (1, 0) and holds one column of (1, 1).
        assert!(whole(&mut b, slot(0, 0), 1, &[0]).datasets.is_empty());
        assert_eq!(whole(&mut b, slot(0, 1), 1, &[0]).datasets.len(), 1);
        assert!(whole(&mut b, slot(1, 0), 1, &[0]).datasets.is_empty());
        assert_eq!(whole(&mut b, slot(1, 1), 2, &[0]).datasets.len(), 1);
        assert_eq!(b.free_slots(0, 3), [2]);
        assert_eq!(b.on_training_reported(0, 1), [slot(0, 0), slot(0, 1)]);
        assert_eq!(b.free_slots(0, 3), [0, 1, 2]);
        assert_eq!(b.on_training_reported(0, 2), [slot(1, 0)]);
        // (1, 1) still has a column waiting for the next dataset.
        assert_eq!(b.free_slots(1, 2), [0]);
        assert!(b.on_training_reported(0, 3).is_empty());
    }

    #[test]
    fn a_replacement_gets_every_slot_neither_the_batcher_nor_the_learner_holds() {
        let mut b = Batcher::new(1, 16, 4, 100);
        // Worker 0's slots 1 (waiting for a dataset) and 3 (in a dataset in flight).
        let ready = whole(&mut b, slot(0, 3), 4, &[0]);
        assert!(ready.datasets.len() == 1 && b.holds(slot(0, 3)));
        assert!(whole(&mut b, slot(0, 1), 2, &[0]).datasets.is_empty());
        assert_eq!(b.free_slots(0, 5), [0, 2, 4]);
        // Another worker's slots are not worker 0's.
        assert_eq!(b.free_slots(1, 2), [0, 1]);
    }

    #[test]
    fn each_policy_gets_its_own_datasets_and_a_slot_is_free_once_every_policy_trained_on_it() {
        // Datasets of 2 sequences; slots of 4 columns: policy 0 has columns 0 and 2, policy 1
        // columns 1 and 3, policy 2 none.
        let mut b = Batcher::new(3, 8, 4, 3);
        let shares = [
            share(0, &[(0, 1), (2, 3)], 0),
            share(1, &[(1, 2), (3, 4)], 0),
            share(2, &[], 0),
        ];
        let ready = b.on_trajectory_ready(slot(0, 0), &shares);
        assert!(ready.released.is_empty());
        assert_eq!(ready.datasets.len(), 2);
        assert_eq!(
            ready.datasets[0],
            (
                0,
                Batch {
                    parts: vec![part(0, 0, 0, 1, false), part(0, 0, 2, 1, true)]
                }
            )
        );
        assert_eq!(
            ready.datasets[1],
            (
                1,
                Batch {
                    parts: vec![part(0, 0, 1, 1, false), part(0, 0, 3, 1, true)]
                }
            )
        );
        assert_eq!(b.counts().batched, 1);
        // Policy 1's learner finishes first: policy 0 still holds the slot.
        assert!(b.on_training_reported(1, 1).is_empty());
        assert!(b.holds(slot(0, 0)));
        assert_eq!(b.on_training_reported(0, 1), [slot(0, 0)]);
        assert_eq!(b.counts().trained, 1);
        // A share too old for its policy is dropped, the rest kept; nothing left drops the slot.
        for _ in 0..5 {
            b.on_training_reported(1, 10);
        }
        let ready = b.on_trajectory_ready(slot(0, 1), &[share(0, &[(0, 2)], 9), share(1, &[(2, 4)], 2)]);
        assert_eq!(
            ready.datasets,
            [(
                0,
                Batch {
                    parts: vec![part(0, 1, 0, 2, true)]
                }
            )]
        );
        let ready = b.on_trajectory_ready(slot(0, 2), &[share(1, &[(0, 4)], 1)]);
        assert_eq!((ready.released, b.counts().dropped), (vec![slot(0, 2)], 1));
        assert_eq!(b.on_training_reported(0, 2), [slot(0, 1)]);
        let c = b.counts();
        assert_eq!((c.read, c.batched, c.trained, c.pending), (3, 2, 2, 0));
    }
}
