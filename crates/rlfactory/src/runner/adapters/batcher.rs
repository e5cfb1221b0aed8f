//! [`Batcher`] on the learner's loop.

use rlf_shm::ShmArray;
use rlf_signal::{Component, Ctx, Signal};

use super::{or_fail, sent};
use crate::error::{Result, RlfError};
use crate::learning::{Batch, Batcher, Slot, TrainingReport};
use crate::runner::counters::CounterLayout;
use crate::runner::plane::DataPlane;
use crate::sampling::{BufferReleased, SlotsReclaimed, TrajectoryPool, TrajectoryReady, WorkerStarted};

/// What the batcher emits.
pub(in crate::runner) struct BatcherSignals {
    pub batch_ready: Signal<Batch>,
    /// `buffer_released` of each rollout worker, by worker index.
    pub buffer_released: Vec<Signal<BufferReleased>>,
    /// `slots_reclaimed` of each rollout worker, by worker index.
    pub slots_reclaimed: Vec<Signal<SlotsReclaimed>>,
}

pub(in crate::runner) struct BatcherNode {
    batcher: Batcher,
    /// Every rollout worker's trajectory pool (read for the policy versions) and the counters.
    mapped: Result<(Vec<TrajectoryPool>, ShmArray<u64>)>,
    layout: CounterLayout,
    signals: BatcherSignals,
}

impl BatcherNode {
    /// The batcher, in its loop's process.
    pub fn new(batcher: Batcher, plane: &DataPlane, layout: CounterLayout, signals: BatcherSignals) -> Self {
        let mapped = plane
            .open_pools()
            .and_then(|pools| Ok((pools, ShmArray::open(&plane.counters)?)));
        Self {
            batcher,
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

    /// A trajectory is in its slot: the datasets it completes go to the learner, a slot freed
    /// (a trajectory too old) back to its worker.
    pub fn on_trajectory_ready(&mut self, ctx: &mut Ctx<'_, Self>, ready: &TrajectoryReady) {
        let result = self
            .pool(ready.worker)
            .and_then(|pool| Ok((pool.versions(ready.buffer)?, pool.shape().num_envs)))
            .and_then(|(versions, num_envs)| {
                let slot = Slot {
                    worker: ready.worker,
                    buffer: ready.buffer,
                };
                let assembled = self.batcher.on_trajectory_ready(slot, num_envs, &versions);
                self.release(ctx, &assembled.released)?;
                sent(ctx.emit_many(&self.signals.batch_ready, &assembled.datasets))
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

    /// The learner trained on the oldest dataset in flight: the slots it closes are free.
    pub fn on_training_reported(&mut self, ctx: &mut Ctx<'_, Self>, report: &TrainingReport) {
        let closed = self.batcher.on_training_reported(report.version);
        let released = self.release(ctx, &closed);
        or_fail(ctx, released);
    }
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
}
