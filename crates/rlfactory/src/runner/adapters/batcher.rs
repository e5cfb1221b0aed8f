//! [`Batcher`] on the learner's loop.

use rlf_shm::ShmArray;
use rlf_signal::{Component, Ctx, Signal};

use super::{or_fail, sent};
use crate::data::{Field, TrajectoryPool};
use crate::error::{Result, RlfError};
use crate::learning::{Batch, Batcher, Share, Slot, TrainingReport};
use crate::runner::counters::CounterLayout;
use crate::runner::plane::DataPlane;
use crate::sampling::{BufferReleased, SlotsReclaimed, TrajectoryReady, WorkerStarted};

/// What the batcher emits.
pub(in crate::runner) struct BatcherSignals {
    /// `batch_ready` of each policy's learner, by policy index.
    pub batch_ready: Vec<Signal<Batch>>,
    /// `buffer_released` of each rollout worker, by worker index.
    pub buffer_released: Vec<Signal<BufferReleased>>,
    /// `slots_reclaimed` of each rollout worker, by worker index.
    pub slots_reclaimed: Vec<Signal<SlotsReclaimed>>,
}

pub(in crate::runner) struct BatcherNode {
    batcher: Batcher,
    /// Networks the slots' columns may name (policies and self-play snapshots).
    num_networks: usize,
    /// Every rollout worker's trajectory pool (read for the policy versions) and the counters.
    mapped: Result<(Vec<TrajectoryPool>, ShmArray<u64>)>,
    layout: CounterLayout,
    signals: BatcherSignals,
}

impl BatcherNode {
    /// The batcher, in its loop's process.
    pub fn new(
        batcher: Batcher,
        num_networks: usize,
        plane: &DataPlane,
        layout: CounterLayout,
        signals: BatcherSignals,
    ) -> Self {
        let mapped = plane
            .open_pools()
            .and_then(|pools| Ok((pools, ShmArray::open(&plane.counters)?)));
        Self {
            batcher,
            num_networks,
            mapped,
            layout,
            signals,
        }
    }

    fn pool(&self, worker: usize) -> Result<&TrajectoryPool> {
        let unknown = || RlfError::Protocol {
            component: "batcher",
            message: format!("no rollout worker {worker}"),
        };
        match &self.mapped {
            Ok((pools, _)) => pools.get(worker).ok_or_else(unknown),
            Err(_) => Err(unknown()),
        }
    }

    fn release(&self, ctx: &mut Ctx<'_, Self>, slots: &[Slot]) -> Result<()> {
        slots.iter().try_for_each(|slot| {
            let signal = self
                .signals
                .buffer_released
                .get(slot.worker)
                .ok_or_else(|| RlfError::Protocol {
                    component: "batcher",
                    message: format!("no rollout worker {}", slot.worker),
                })?;
            sent(ctx.emit(signal, &BufferReleased { buffer: slot.buffer }))
        })
    }

    /// A trajectory is in its slot: the datasets it completes go to their policies' learners, a
    /// slot freed (a trajectory too old) back to its worker.
    pub fn on_trajectory_ready(&mut self, ctx: &mut Ctx<'_, Self>, ready: &TrajectoryReady) {
        let result = self
            .pool(ready.worker)
            .and_then(|pool| {
                shares(
                    pool,
                    ready.buffer,
                    self.signals.batch_ready.len(),
                    self.num_networks,
                )
            })
            .and_then(|shares| {
                let slot = Slot {
                    worker: ready.worker,
                    buffer: ready.buffer,
                };
                let assembled = self.batcher.on_trajectory_ready(slot, &shares);
                self.release(ctx, &assembled.released)?;
                assembled.datasets.iter().try_for_each(|(policy, dataset)| {
                    let signal = self
                        .signals
                        .batch_ready
                        .get(*policy)
                        .ok_or_else(|| RlfError::Protocol {
                            component: "batcher",
                            message: format!("no learner for policy {policy}"),
                        })?;
                    sent(ctx.emit(signal, dataset))
                })
            });
        or_fail(ctx, result);
    }

    /// A rollout worker's process started: its free slots are those neither this batcher nor the
    /// learner holds. Every trajectory a predecessor signalled was read before (one queue, in order).
    pub fn on_worker_started(&mut self, ctx: &mut Ctx<'_, Self>, started: &WorkerStarted) {
        let w = started.worker;
        let result = self.pool(w).and_then(|pool| {
            let signal = self
                .signals
                .slots_reclaimed
                .get(w)
                .ok_or_else(|| RlfError::Protocol {
                    component: "batcher",
                    message: format!("no rollout worker {w}"),
                })?;
            let reclaimed = SlotsReclaimed {
                incarnation: started.incarnation,
                free: self.batcher.free_slots(w, pool.num_buffers()),
            };
            sent(ctx.emit(signal, &reclaimed))
        });
        or_fail(ctx, result);
    }

    /// A learner trained on its oldest dataset in flight: the slots no other dataset holds are free.
    pub fn on_training_reported(&mut self, ctx: &mut Ctx<'_, Self>, report: &TrainingReport) {
        let closed = self.batcher.on_training_reported(report.policy, report.version);
        let released = self.release(ctx, &closed);
        or_fail(ctx, released);
    }
}

/// How the trajectory in slot `buffer` of `pool` is shared among `num_policies` policies: with
/// one network, all its columns; otherwise each policy's columns are those with a valid step its
/// latest weights played. Networks past the policies are self-play snapshots, never trained on.
fn shares(
    pool: &TrajectoryPool,
    buffer: usize,
    num_policies: usize,
    num_networks: usize,
) -> Result<Vec<Share>> {
    let versions = pool.versions(buffer)?;
    let shape = pool.shape();
    let n = shape.num_envs;
    if num_networks == 1 {
        return Ok(vec![Share {
            policy: 0,
            columns: std::iter::once(0..n).collect(),
            newest: versions.iter().copied().max(),
        }]);
    }
    let (mut policies, mut valid) = (vec![0.0; n], vec![0.0; n]);
    let mut played = vec![vec![false; n]; num_policies];
    let mut newest = vec![None; num_policies];
    for t in 0..shape.rollout {
        pool.get(buffer, Field::Policy, t, &mut policies)?;
        pool.get(buffer, Field::Valid, t, &mut valid)?;
        for c in (0..n).filter(|&c| valid[c] > 0.0) {
            let p = policies[c] as usize;
            let Some(columns) = played.get_mut(p) else {
                continue;
            };
            columns[c] = true;
            newest[p] = newest[p].max(Some(versions[t * n + c]));
        }
    }
    Ok(played
        .iter()
        .zip(newest)
        .enumerate()
        .map(|(policy, (columns, newest))| Share {
            policy,
            columns: runs(columns),
            newest,
        })
        .collect())
}

/// The runs of consecutive `true` columns, as ranges.
fn runs(columns: &[bool]) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for (c, _) in columns.iter().enumerate().filter(|(_, &on)| on) {
        match out.last_mut() {
            Some(r) if r.end == c => r.end += 1,
            _ => out.push(c..c + 1),
        }
    }
    out
}

impl Component for BatcherNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Err(e) = &self.mapped {
            ctx.fail(e);
        }
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        if let Ok((_, counters)) = &self.mapped {
            self.layout.store_batcher(counters, self.batcher.counts());
        }
    }

    fn save(&mut self) -> std::result::Result<Option<Vec<u8>>, String> {
        postcard::to_stdvec(&self.batcher)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    fn restore(&mut self, state: &[u8]) -> std::result::Result<(), String> {
        self.batcher = postcard::from_bytes(state).map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{runs, shares};
    use crate::data::{Field, TrajectoryPool, TrajectoryShape};
    use crate::learning::Share;

    #[test]
    fn each_policy_takes_the_columns_it_played_and_snapshots_none() {
        // 4 columns, 2 steps; policies 0 and 1, networks 2 and 3 are snapshots.
        let shape = TrajectoryShape {
            rollout: 2,
            num_envs: 4,
            obs_dim: 1,
            action_dim: 1,
            state_dim: 0,
            obs_bytes: 0,
        };
        let pool = TrajectoryPool::create(shape, 1).unwrap();
        // Column 0: policy 0 then (after its episode) policy 1. Column 1: a snapshot. Column 2:
        // policy 0, but its agent never acted. Column 3: policy 1.
        pool.put(0, Field::Policy, 0, &[0.0, 2.0, 0.0, 1.0]).unwrap();
        pool.put(0, Field::Policy, 1, &[1.0, 3.0, 0.0, 1.0]).unwrap();
        pool.put(0, Field::Valid, 0, &[1.0, 1.0, 0.0, 1.0]).unwrap();
        pool.put(0, Field::Valid, 1, &[1.0, 1.0, 0.0, 0.0]).unwrap();
        pool.put_versions(0, 0, &[5, 1, 5, 7]).unwrap();
        pool.put_versions(0, 1, &[8, 1, 6, 9]).unwrap();
        let got = shares(&pool, 0, 2, 4).unwrap();
        assert_eq!(
            got,
            [
                Share {
                    policy: 0,
                    columns: std::iter::once(0..1).collect(),
                    newest: Some(5)
                },
                Share {
                    policy: 1,
                    columns: vec![0..1, 3..4],
                    newest: Some(8)
                },
            ]
        );
        // One network: every column, whatever the flags.
        let one = shares(&pool, 0, 1, 1).unwrap();
        assert_eq!(
            (one.len(), &one[0].columns),
            (1, &std::iter::once(0..4).collect::<Vec<_>>())
        );
    }

    #[test]
    fn columns_become_ranges_of_consecutive_ones() {
        assert_eq!(
            runs(&[true, true, false, true, false, false, true]),
            [0..2, 3..4, 6..7]
        );
        assert!(runs(&[false, false]).is_empty());
    }
}
