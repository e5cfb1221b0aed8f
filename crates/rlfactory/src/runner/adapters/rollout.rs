//! [`RolloutWorker`] on its loop.

use rlf_shm::ShmArray;
use rlf_signal::{Component, Ctx, Signal, WorkQueue};

use super::{or_fail, sent, NextTurn};
use crate::data::TrajectoryPool;
use crate::env::group::{close_unused, EnvGroup};
use crate::env::EnvRegistry;
use crate::error::{Result, RlfError};
use crate::learning::PolicyUpdated;
use crate::plan::RunPlan;
use crate::runner::counters::CounterLayout;
use crate::runner::plane::{replay_writer, DataPlane};
use crate::sampling::{
    ActionsReady, BufferReleased, PolicyRequest, ReplayWriter, RolloutReport, RolloutWorker, SlotsReclaimed,
    SnapshotTaken, StepOutcome, TrajectoryReady, WorkerStarted,
};

/// What a rollout worker emits.
#[derive(Clone)]
pub(in crate::runner) struct RolloutSignals {
    /// By group of inference workers.
    pub policy_requested: Vec<WorkQueue<PolicyRequest>>,
    pub trajectory_ready: Signal<TrajectoryReady>,
    pub rollout_reported: Signal<RolloutReport>,
    pub worker_started: Signal<WorkerStarted>,
    /// To itself: submit the queued requests ([`RolloutNode::defer`]).
    pub next_turn: Signal<NextTurn>,
}

pub(in crate::runner) struct RolloutNode {
    index: usize,
    /// Its index among the whole run's rollout workers, and their number.
    place: (usize, usize),
    worker: Option<RolloutWorker>,
    counters: Option<ShmArray<u64>>,
    /// Requests waiting for the next turn of the loop (see [`RolloutNode::defer`]).
    queued: Vec<PolicyRequest>,
    scheduled: bool,
    /// The pool and the counters, mapped by the constructor; the worker is built in `on_start`,
    /// which knows the process's incarnation.
    setup: Option<Result<Mapped>>,
    plan: RunPlan,
    registry: EnvRegistry,
    signals: RolloutSignals,
    /// The env group its envs span (an env group's lead rank).
    group: Option<EnvGroup>,
    /// The stop kept this worker's state ([`Component::save`]): its replay rows and windows stay in it.
    kept: bool,
}

/// A rollout node's kept state: the requests it had not yet submitted, and its worker's.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptNode {
    queued: Vec<PolicyRequest>,
    scheduled: bool,
    worker: Vec<u8>,
}

/// What a rollout worker maps before it starts: its pool, the counters and, off-policy, the replay buffers.
pub(crate) type Mapped = (TrajectoryPool, ShmArray<u64>, Option<ReplayWriter>);

impl RolloutNode {
    /// What rollout worker `index` maps, in its loop's process (see [`Mapped`]).
    pub fn map(index: usize, plan: &RunPlan, plane: &DataPlane) -> Result<Mapped> {
        let pool = plane
            .pools
            .get(index)
            .ok_or_else(|| RlfError::Config(format!("no trajectory pool for rollout worker {index}")))
            .and_then(TrajectoryPool::open)?;
        let replay = replay_writer(plan, plane)?;
        Ok((pool, ShmArray::open(&plane.counters)?, replay))
    }

    /// Rollout worker `index`, in its loop's process, with what it mapped ([`RolloutNode::map`]): worker `place.0`
    /// of the `place.1` of the whole run (spread over MPI ranks, or `(index, --num_workers)` on one machine).
    pub fn new(
        index: usize,
        place: (usize, usize),
        plan: RunPlan,
        registry: EnvRegistry,
        setup: Result<Mapped>,
        signals: RolloutSignals,
        group: Option<EnvGroup>,
    ) -> Self {
        Self {
            index,
            place,
            worker: None,
            counters: None,
            queued: Vec::new(),
            scheduled: false,
            setup: Some(setup),
            plan,
            registry,
            signals,
            group,
            kept: false,
        }
    }

    /// Builds the worker as process `incarnation`, continuing the counts of its predecessors,
    /// and says so to the batcher (which answers with the free slots) and the runner.
    fn start(&mut self, ctx: &mut Ctx<'_, Self>) -> Result<()> {
        let Some(setup) = self.setup.take() else {
            return Ok(());
        };
        let (pool, counters, replay) = match setup {
            Ok(mapped) => mapped,
            Err(e) => {
                // No split of this worker will be made: its env group's members must not wait for them.
                if let Some(group) = &self.group {
                    let splits = self.plan.config.sampling.worker_num_splits;
                    for channel in self.index * splits..(self.index + 1) * splits {
                        let _ = close_unused(group, channel);
                    }
                }
                return Err(e);
            }
        };
        let incarnation = ctx.incarnation();
        let before = CounterLayout::load_worker(&counters, self.index);
        let counts = if incarnation == 0 {
            before
        } else {
            before.inherit()
        };
        let (global, workers) = self.place;
        let mut worker = RolloutWorker::new(
            self.index,
            &self.plan,
            &self.registry,
            pool,
            incarnation,
            counts,
            self.group.as_ref(),
        )?
        .in_run(&self.plan.config, global, workers);
        if let Some(replay) = replay {
            worker = worker.with_replay(replay);
        }
        worker.start()?;
        self.worker = Some(worker);
        self.counters = Some(counters);
        self.store_counts();
        let started = WorkerStarted {
            worker: self.index,
            incarnation,
            lost_frames: counts.lost_frames - before.lost_frames,
        };
        sent(ctx.emit(&self.signals.worker_started, &started))
    }

    /// Queues requests for actions and submits them on the loop's next turn ([`NextTurn`]) rather than from inside
    /// a slot: on one loop, rollout and inference would otherwise answer each other without the loop ever turning,
    /// starving timers and stop requests.
    fn defer(&mut self, ctx: &mut Ctx<'_, Self>, requests: impl IntoIterator<Item = PolicyRequest>) {
        self.queued.extend(requests);
        if !self.scheduled && !self.queued.is_empty() {
            self.scheduled = true;
            let asked = sent(ctx.emit(&self.signals.next_turn, &NextTurn));
            or_fail(ctx, asked);
        }
    }

    /// Submits the queued requests, unless the run is stopping: its loop then only drains what is queued, as it
    /// would fire no timer.
    pub fn on_next_turn(&mut self, ctx: &mut Ctx<'_, Self>, _turn: &NextTurn) {
        if ctx.stopping() {
            return;
        }
        self.scheduled = false;
        let queued = std::mem::take(&mut self.queued);
        let submitted = queued.iter().try_for_each(|request| {
            let queue =
                self.signals
                    .policy_requested
                    .get(request.group)
                    .ok_or_else(|| RlfError::Protocol {
                        component: "rollout worker",
                        message: format!(
                            "a request for inference group {}, which the run has not",
                            request.group
                        ),
                    })?;
            sent(ctx.submit(queue, request))
        });
        or_fail(ctx, submitted);
    }

    /// The worker's counts into shared memory, where they outlive this process.
    fn store_counts(&self) {
        if let (Some(worker), Some(counters)) = (&self.worker, &self.counters) {
            CounterLayout::store_worker(counters, self.index, worker.counts());
        }
    }

    fn emit_outcome(&mut self, ctx: &mut Ctx<'_, Self>, outcome: Result<StepOutcome>) {
        self.store_counts();
        let emitted = outcome.and_then(|outcome| {
            if let Some(t) = &outcome.trajectory {
                sent(ctx.emit(&self.signals.trajectory_ready, t))?;
            }
            if let Some(r) = &outcome.report {
                sent(ctx.emit(&self.signals.rollout_reported, r))?;
            }
            Ok(outcome.requests)
        });
        match emitted {
            Ok(requests) => self.defer(ctx, requests),
            Err(e) => ctx.fail(e),
        }
    }

    fn emit_requests(&mut self, ctx: &mut Ctx<'_, Self>, requests: Result<Vec<PolicyRequest>>) {
        let outcome = requests.map(|requests| StepOutcome {
            requests,
            ..StepOutcome::default()
        });
        self.emit_outcome(ctx, outcome);
    }

    pub fn on_actions_ready(&mut self, ctx: &mut Ctx<'_, Self>, actions: &ActionsReady) {
        let Some(worker) = &mut self.worker else { return };
        let outcome = worker.on_actions_ready(actions);
        self.emit_outcome(ctx, outcome);
    }

    pub fn on_buffer_released(&mut self, ctx: &mut Ctx<'_, Self>, released: &BufferReleased) {
        let Some(worker) = &mut self.worker else { return };
        let requests = worker.on_buffer_released(released.buffer);
        self.emit_requests(ctx, requests);
    }

    pub fn on_slots_reclaimed(&mut self, ctx: &mut Ctx<'_, Self>, reclaimed: &SlotsReclaimed) {
        let Some(worker) = &mut self.worker else { return };
        let requests = worker.on_slots_reclaimed(reclaimed.incarnation, &reclaimed.free);
        self.emit_requests(ctx, requests);
    }

    pub fn on_snapshot_taken(&mut self, _ctx: &mut Ctx<'_, Self>, taken: &SnapshotTaken) {
        if let Some(worker) = &mut self.worker {
            worker.on_snapshot_taken(taken);
        }
    }

    pub fn on_policy_updated(&mut self, ctx: &mut Ctx<'_, Self>, _update: &PolicyUpdated) {
        let Some(worker) = &mut self.worker else { return };
        let requests = worker.on_policy_updated();
        self.emit_requests(ctx, requests);
    }
}

impl Component for RolloutNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        let started = self.start(ctx);
        or_fail(ctx, started);
    }

    fn on_stop(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.store_counts();
        if let Some(worker) = &mut self.worker {
            if self.kept {
                worker.finish_kept();
            } else {
                let finished = worker.finish_replay();
                or_fail(ctx, finished);
            }
        }
    }

    fn save(&mut self) -> std::result::Result<Option<Vec<u8>>, String> {
        let Some(worker) = &self.worker else {
            return Err("the rollout worker did not start".into());
        };
        let kept = KeptNode {
            queued: self.queued.clone(),
            scheduled: self.scheduled,
            worker: worker.save_state().map_err(|e| e.to_string())?,
        };
        self.kept = true;
        postcard::to_stdvec(&kept).map(Some).map_err(|e| e.to_string())
    }

    fn restore(&mut self, state: &[u8]) -> std::result::Result<(), String> {
        let kept: KeptNode = postcard::from_bytes(state).map_err(|e| e.to_string())?;
        let Some(worker) = &mut self.worker else {
            return Err("the rollout worker did not start".into());
        };
        worker.load_state(&kept.worker).map_err(|e| e.to_string())?;
        (self.queued, self.scheduled) = (kept.queued, kept.scheduled);
        self.store_counts();
        Ok(())
    }
}
