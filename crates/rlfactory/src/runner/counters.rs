//! Trajectory counters in shared memory, read by the main process after the run: per rollout
//! worker its [`WorkerCounts`] (kept current after every step, so they outlive a dead process),
//! then the batcher's [`BatcherCounts`], written when its loop stops.

use rlf_shm::ShmArray;

use super::summary::Summary;
use crate::learning::BatcherCounts;
use crate::sampling::WorkerCounts;

/// Where each count lives in the shared array.
#[derive(Debug, Clone, Copy)]
pub(super) struct CounterLayout {
    pub workers: usize,
}

impl CounterLayout {
    const READ: usize = 0;
    const DROPPED: usize = 1;
    const BATCHED: usize = 2;
    const PENDING: usize = 3;
    const TRAINED: usize = 4;

    /// Words in the array.
    pub fn len(self) -> usize {
        WorkerCounts::LEN * self.workers + 5
    }

    fn at(self, counter: usize) -> usize {
        WorkerCounts::LEN * self.workers + counter
    }

    /// Stores rollout worker `i`'s counts.
    pub fn store_worker(counters: &ShmArray<u64>, i: usize, counts: WorkerCounts) {
        counters.copy_from_slice(WorkerCounts::LEN * i, &counts.to_words());
    }

    /// Rollout worker `i`'s counts as its last process left them.
    pub fn load_worker(counters: &ShmArray<u64>, i: usize) -> WorkerCounts {
        let mut words = [0; WorkerCounts::LEN];
        counters.copy_to_slice(WorkerCounts::LEN * i, &mut words);
        WorkerCounts::from_words(words)
    }

    /// Stores the batcher's counts.
    pub fn store_batcher(self, counters: &ShmArray<u64>, c: BatcherCounts) {
        counters.copy_from_slice(
            self.at(Self::READ),
            &[c.read, c.dropped, c.batched, c.pending, c.trained],
        );
    }

    /// Fills the trajectory counts of `summary` from the counters at the end of a run.
    pub fn summarise(self, counters: &ShmArray<u64>, summary: &mut Summary) {
        let mut all = vec![0; self.len()];
        counters.copy_to_slice(0, &mut all);
        let workers = all[..self.at(0)]
            .chunks_exact(WorkerCounts::LEN)
            .filter_map(|w| Some(WorkerCounts::from_words(w.try_into().ok()?)));
        let total = workers.fold(WorkerCounts::default(), |t, w| WorkerCounts {
            produced: t.produced + w.produced,
            stepped_frames: t.stepped_frames + w.stepped_frames,
            handed_frames: t.handed_frames + w.handed_frames,
            lost_frames: t.lost_frames + w.lost_frames,
        });
        let c = |counter: usize| all[self.at(counter)];
        // Counts written by processes that may have died mid-write: never trusted to add up.
        let unread = total.produced.saturating_sub(c(Self::READ));
        let untrained = c(Self::BATCHED).saturating_sub(c(Self::TRAINED));
        summary.trajectories_produced = total.produced;
        summary.trajectories_trained = c(Self::TRAINED);
        summary.trajectories_dropped = c(Self::DROPPED);
        summary.trajectories_in_flight = unread + c(Self::PENDING) + untrained;
        summary.env_frames_lost = total.lost_frames;
        summary.env_frames_stepped = total.stepped_frames;
    }
}
