//! The runner: builds every component, wires all signals in one function ([`build_graph`]),
//! collects statistics, prints progress, decides when to stop, and summarises the run.
//!
//! ```text
//! RolloutWorker ──policy_requested──▶ InferenceWorker ──actions_ready──▶ RolloutWorker
//! RolloutWorker ──trajectory_ready──▶ Batcher ──batch_ready──▶ Learner
//! Learner ──policy_updated──▶ InferenceWorker, RolloutWorker (sync mode resumes)
//! RolloutWorker ──rollout_reported──▶ Runner ◀──training_reported── Learner
//! ```
//! In serial mode (the only mode so far) every component lives on the main event loop.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rlf_shm::{SharedWeights, SharedWeightsHandle, ShmArray, ShmArrayHandle};
use rlf_signal::{App, AppBuilder, BuildError, Component, Ctx, EmitError, Fault, Signal, WorkQueue};
use serde::{Deserialize, Serialize};

use crate::algo::appo::{Appo, TrainingState};
use crate::config::{config_file_args, Config};
use crate::env::EnvRegistry;
use crate::error::{Result, RlfError};
use crate::experiment::{CheckpointRequest, Checkpointer, ExperimentRun};
use crate::learning::{Batch, Batcher, Learner, PolicyUpdated, TrainingReport};
use crate::model::{ActorCritic, Policy, PolicyWeights};
use crate::sampling::{
    ActionsReady, BufferReleased, InferenceWorker, PolicyRequest, RolloutReport, RolloutWorker,
    SlotsReclaimed, StepOutcome, TrajectoryPool, TrajectoryPoolHandle, TrajectoryReady, TrajectoryShape,
    WorkerCounts, WorkerStarted,
};

/// Episodes the mean return is taken over.
const RETURN_WINDOW: usize = 100;

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `--train_for_env_steps` reached.
    EnvSteps,
    /// `--train_for_seconds` reached.
    Seconds,
    /// `--stop_at_reward` reached.
    Reward,
    /// A component failed.
    Failed,
    /// SIGINT or SIGTERM (a checkpoint was saved).
    Interrupted,
}

/// The outcome of a run, written by `--summary_json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Env frames simulated.
    pub env_frames: u64,
    /// Seconds from the kernel's start of the process (before `main`) to the end of training.
    pub wall_seconds: f64,
    /// Steady-state env frames per second: from the first rollout report after the warm-up
    /// ([`warm_up`]) to the last one counted (the overall rate if no report came after the warm-up).
    pub fps: f64,
    /// Env frames per second of training (from the start of sampling).
    pub fps_overall: f64,
    /// Mean return of the last 100 episodes (`null` before the first episode ends).
    pub mean_return: Option<f64>,
    /// Whether `--stop_at_reward` was reached.
    pub reached_reward: bool,
    /// Env frames when the reward was reached.
    pub frames_to_reward: Option<u64>,
    /// Seconds from the kernel's start of the process when the reward was reached.
    pub seconds_to_reward: Option<f64>,
    /// Episodes finished.
    pub episodes: u64,
    /// Final policy version (SGD steps).
    pub policy_version: u64,
    /// Why the run stopped.
    pub stop_reason: StopReason,
    /// The last training metrics.
    pub last_metrics: Vec<(String, f64)>,
    /// Digest of the first dataset trained on (16 hex digits; see `Dataset::digest`): runs that
    /// train on the same first data have the same.
    pub first_dataset_digest: Option<String>,
    /// The signal that interrupted the run (SIGINT = 2, SIGTERM = 15), if one did.
    pub signal: Option<i32>,
    /// Trajectories finished by the rollout workers.
    pub trajectories_produced: u64,
    /// Trajectories whose last sequence the learner trained on.
    pub trajectories_trained: u64,
    /// Trajectories the batcher dropped as wholly older than `--max_policy_lag` versions.
    pub trajectories_dropped: u64,
    /// Trajectories discarded at stop: signalled but unread, in the batcher, or in datasets not
    /// trained on. Produced = trained + dropped + in flight.
    pub trajectories_in_flight: u64,
    /// Env frames of unfinished trajectories of rollout-worker processes that died or hung.
    pub env_frames_lost: u64,
    /// Rollout-worker processes replaced after they died or hung.
    pub worker_restarts: u64,
    /// CPU seconds of each event loop: a component's process (rollout and inference workers, the
    /// learner with the batcher; for a replaced worker, its last process) or, for `main` (the
    /// runner, and every component in serial mode), the main thread.
    pub cpu_seconds: std::collections::BTreeMap<String, f64>,
}

/// Trajectory counters in shared memory, read by the main process after the run: per rollout
/// worker, its [`WorkerCounts`] (kept current after every step, so they outlive a dead process);
/// then the batcher's read, dropped, batched (last sequence in a dataset) and pending, and the
/// learner's trained, written when their loop stops.
#[derive(Debug, Clone, Copy)]
struct CounterLayout {
    workers: usize,
}

impl CounterLayout {
    const READ: usize = 0;
    const DROPPED: usize = 1;
    const BATCHED: usize = 2;
    const PENDING: usize = 3;
    const TRAINED: usize = 4;

    fn len(self) -> usize {
        WorkerCounts::LEN * self.workers + 5
    }

    fn worker(i: usize) -> usize {
        WorkerCounts::LEN * i
    }

    fn at(self, counter: usize) -> usize {
        WorkerCounts::LEN * self.workers + counter
    }

    /// Fills the trajectory counts of `summary` from the counters at the end of a run.
    fn summarise(self, counters: &ShmArray<u64>, summary: &mut Summary) {
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
    }
}

/// The start-up excluded from the steady-state FPS: 2 s, or a fifth of `--train_for_seconds` if
/// that is shorter.
pub fn warm_up(train_for_seconds: f64) -> Duration {
    Duration::from_secs_f64((train_for_seconds / 5.0).clamp(0.0, 2.0))
}

/// Statistics and stop conditions.
#[derive(Debug)]
pub struct Runner {
    process_start: Instant,
    sampling_start: Instant,
    warm_up: Duration,
    /// Time and env frames of the first rollout report after the warm-up.
    steady_from: Option<(Instant, u64)>,
    /// Time of the last rollout report counted.
    last_report: Instant,
    max_frames: u64,
    max_seconds: f64,
    stop_at_reward: Option<f64>,
    env_frames: u64,
    episodes: u64,
    returns: VecDeque<f64>,
    lengths: VecDeque<u64>,
    reached: Option<(u64, f64)>,
    version: u64,
    version_diff: f64,
    last_metrics: Vec<(String, f64)>,
    first_dataset_digest: Option<u64>,
    last_line: (Instant, u64),
    stop: Option<StopReason>,
}

impl Runner {
    /// A runner for `cfg`; `process_start` is when the process started.
    pub fn new(cfg: &Config, process_start: Instant) -> Self {
        let now = Instant::now();
        Self {
            process_start,
            sampling_start: now,
            warm_up: warm_up(cfg.run.train_for_seconds),
            steady_from: None,
            last_report: now,
            max_frames: cfg.run.train_for_env_steps,
            max_seconds: cfg.run.train_for_seconds,
            stop_at_reward: cfg.run.stop_at_reward,
            env_frames: 0,
            episodes: 0,
            returns: VecDeque::with_capacity(RETURN_WINDOW),
            lengths: VecDeque::with_capacity(RETURN_WINDOW),
            reached: None,
            version: 0,
            version_diff: 0.0,
            last_metrics: Vec::new(),
            first_dataset_digest: None,
            last_line: (now, 0),
            stop: None,
        }
    }

    /// Mean return of the last 100 episodes.
    pub fn mean_return(&self) -> Option<f64> {
        (!self.returns.is_empty()).then(|| self.returns.iter().sum::<f64>() / self.returns.len() as f64)
    }

    /// Mean length of the last 100 episodes.
    pub fn mean_length(&self) -> Option<f64> {
        (!self.lengths.is_empty())
            .then(|| self.lengths.iter().sum::<u64>() as f64 / self.lengths.len() as f64)
    }

    /// Continues the counts of a resumed run: env frames, episodes and the policy version.
    pub fn resume_from(&mut self, env_frames: u64, episodes: u64, version: u64) {
        self.env_frames = env_frames;
        self.episodes = episodes;
        self.version = version;
        self.last_line = (Instant::now(), env_frames);
    }

    /// Slot of `rollout_reported`: counts frames and episodes; returns why to stop, if it is time.
    pub fn on_rollout_reported(&mut self, report: &RolloutReport) -> Option<StopReason> {
        self.env_frames += report.env_frames;
        let now = Instant::now();
        self.last_report = now;
        if self.steady_from.is_none() && now.duration_since(self.sampling_start) >= self.warm_up {
            self.steady_from = Some((now, self.env_frames));
        }
        for &r in &report.episode_returns {
            if self.returns.len() == RETURN_WINDOW {
                self.returns.pop_front();
            }
            self.returns.push_back(r);
            self.episodes += 1;
        }
        for &l in &report.episode_lengths {
            if self.lengths.len() == RETURN_WINDOW {
                self.lengths.pop_front();
            }
            self.lengths.push_back(l);
        }
        self.check_stop()
    }

    /// What a checkpoint saved now should record.
    pub fn checkpoint_request(&self) -> CheckpointRequest {
        CheckpointRequest {
            env_steps: self.env_frames,
            episodes: self.episodes,
            mean_return: self.mean_return(),
        }
    }

    /// Slot of `training_reported`.
    pub fn on_training_reported(&mut self, report: &TrainingReport) {
        self.version = report.version;
        if let Some((_, v)) = report.metrics.iter().find(|(k, _)| k == "train/version_diff_avg") {
            self.version_diff = *v;
        }
        self.last_metrics.clone_from(&report.metrics);
        if self.first_dataset_digest.is_none() {
            self.first_dataset_digest = report.dataset_digest;
        }
    }

    /// Checks the stop conditions.
    pub fn check_stop(&mut self) -> Option<StopReason> {
        if self.stop.is_some() {
            return self.stop;
        }
        let window_full = self.returns.len() == RETURN_WINDOW;
        if let (Some(target), Some(mean)) = (self.stop_at_reward, self.mean_return()) {
            if window_full && mean >= target {
                self.reached = Some((self.env_frames, self.process_start.elapsed().as_secs_f64()));
                self.stop = Some(StopReason::Reward);
            }
        }
        if self.stop.is_none() && self.env_frames >= self.max_frames {
            self.stop = Some(StopReason::EnvSteps);
        }
        if self.stop.is_none() && self.sampling_start.elapsed().as_secs_f64() >= self.max_seconds {
            self.stop = Some(StopReason::Seconds);
        }
        self.stop
    }

    /// The progress line: frames, FPS since the last line, mean return, policy lag.
    pub fn progress_line(&mut self) -> String {
        self.report().line
    }

    /// A progress report: the line, and the scalars for TensorBoard by Sample Factory's names
    /// (`perf/_fps`, `reward/reward`, `len/len`, `stats/episodes`, the learner's `train/...`).
    pub fn report(&mut self) -> Report {
        let now = Instant::now();
        let (then, frames) = self.last_line;
        let dt = now.duration_since(then).as_secs_f64().max(1e-9);
        let fps = self.env_frames.saturating_sub(frames) as f64 / dt;
        self.last_line = (now, self.env_frames);
        let mut scalars = vec![
            ("perf/_fps".to_owned(), fps),
            ("stats/episodes".to_owned(), self.episodes as f64),
            ("train/policy_version".to_owned(), self.version as f64),
        ];
        if let Some(r) = self.mean_return() {
            scalars.push(("reward/reward".to_owned(), r));
        }
        if let Some(l) = self.mean_length() {
            scalars.push(("len/len".to_owned(), l));
        }
        scalars.extend(self.last_metrics.iter().cloned());
        let ret = self
            .mean_return()
            .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.1}"));
        let line = format!(
            "frames {} | fps {:.0} | mean return {} ({} episodes) | policy lag {:.1} | version {}",
            self.env_frames, fps, ret, self.episodes, self.version_diff, self.version
        );
        Report {
            line,
            env_frames: self.env_frames,
            scalars,
        }
    }

    /// The summary of the run so far.
    pub fn summary(&self) -> Summary {
        let elapsed = self.sampling_start.elapsed().as_secs_f64().max(1e-9);
        let fps_overall = self.env_frames as f64 / elapsed;
        let steady = self.steady_from.and_then(|(t, frames)| {
            let dt = self.last_report.duration_since(t).as_secs_f64();
            (dt > 0.0).then(|| self.env_frames.saturating_sub(frames) as f64 / dt)
        });
        Summary {
            env_frames: self.env_frames,
            wall_seconds: self.process_start.elapsed().as_secs_f64(),
            fps: steady.unwrap_or(fps_overall),
            fps_overall,
            mean_return: self.mean_return(),
            reached_reward: self.reached.is_some(),
            frames_to_reward: self.reached.map(|r| r.0),
            seconds_to_reward: self.reached.map(|r| r.1),
            episodes: self.episodes,
            policy_version: self.version,
            stop_reason: self.stop.unwrap_or(StopReason::Failed),
            last_metrics: self.last_metrics.clone(),
            first_dataset_digest: self.first_dataset_digest.map(|d| format!("{d:016x}")),
            signal: None,
            trajectories_produced: 0,
            trajectories_trained: 0,
            trajectories_dropped: 0,
            trajectories_in_flight: 0,
            env_frames_lost: 0,
            worker_restarts: 0,
            cpu_seconds: std::collections::BTreeMap::new(),
        }
    }
}

/// One progress report of the [`Runner`].
#[derive(Debug, Clone)]
pub struct Report {
    /// The progress line.
    pub line: String,
    /// Env frames (the TensorBoard step).
    pub env_frames: u64,
    /// Scalars by TensorBoard tag.
    pub scalars: Vec<(String, f64)>,
}

// ---------------------------------------------------------------------------------------------
// Components on the event loop: each wraps a component with the signals it emits.

/// What the graph hands back to the caller of [`train`].
#[derive(Debug, Default)]
struct Shared {
    summary: Option<Summary>,
    error: Option<String>,
}

type SharedState = Arc<Mutex<Shared>>;

/// An emit into the queue of a loop that is stopping is not an error: the run is ending (a loop
/// that died is reported by the supervisor as a fault).
fn sent(r: Result<(), EmitError>) -> Result<(), EmitError> {
    match r {
        Err(EmitError::Closed { .. }) => Ok(()),
        other => other,
    }
}

/// Records the first error of the run; also printed, since an error in a child process has no
/// other way out.
fn fail(shared: &SharedState, error: &dyn std::fmt::Display) {
    eprintln!("[rlfactory] error: {error}");
    if let Ok(mut s) = shared.lock() {
        s.error.get_or_insert_with(|| error.to_string());
    }
}

struct RolloutNode {
    index: usize,
    worker: Option<RolloutWorker>,
    counters: Option<ShmArray<u64>>,
    /// Requests waiting for the next turn of the loop (see [`RolloutNode::defer`]).
    queued: Vec<PolicyRequest>,
    scheduled: bool,
    /// The pool and the counters, mapped by the constructor; the worker is built in `on_start`,
    /// which knows the process's incarnation.
    setup: Option<Result<(TrajectoryPool, ShmArray<u64>)>>,
    cfg: Config,
    registry: EnvRegistry,
    policy_requested: WorkQueue<PolicyRequest>,
    trajectory_ready: Signal<TrajectoryReady>,
    rollout_reported: Signal<RolloutReport>,
    worker_started: Signal<WorkerStarted>,
    shared: SharedState,
}

impl RolloutNode {
    /// Queues requests for actions and submits them on the loop's next turn (a zero-delay timer)
    /// rather than from inside a slot: on one loop, rollout and inference would otherwise answer
    /// each other without the loop ever turning, starving timers and stop requests.
    fn defer(&mut self, ctx: &mut Ctx<'_, Self>, requests: impl IntoIterator<Item = PolicyRequest>) {
        self.queued.extend(requests);
        if !self.scheduled && !self.queued.is_empty() {
            self.scheduled = true;
            ctx.timer_once(Duration::ZERO, RolloutNode::flush_requests);
        }
    }

    fn flush_requests(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.scheduled = false;
        for request in std::mem::take(&mut self.queued) {
            if let Err(e) = sent(ctx.submit(&self.policy_requested, &request)) {
                fail(&self.shared, &e);
                ctx.stop_app();
                return;
            }
        }
    }

    /// The worker's counts into shared memory, where they outlive this process.
    fn store_counts(&self) {
        if let (Some(worker), Some(counters)) = (&self.worker, &self.counters) {
            counters.copy_from_slice(CounterLayout::worker(self.index), &worker.counts().to_words());
        }
    }

    fn emit_outcome(&mut self, ctx: &mut Ctx<'_, Self>, outcome: Result<StepOutcome>) {
        self.store_counts();
        let emitted = outcome.map_err(|e| e.to_string()).and_then(|outcome| {
            if let Some(t) = &outcome.trajectory {
                sent(ctx.emit(&self.trajectory_ready, t)).map_err(|e| e.to_string())?;
            }
            if let Some(r) = &outcome.report {
                sent(ctx.emit(&self.rollout_reported, r)).map_err(|e| e.to_string())?;
            }
            Ok(outcome.requests)
        });
        match emitted {
            Ok(request) => self.defer(ctx, request),
            Err(e) => {
                fail(&self.shared, &e);
                ctx.stop_app();
            }
        }
    }

    fn on_actions_ready(&mut self, ctx: &mut Ctx<'_, Self>, actions: &ActionsReady) {
        let Some(worker) = &mut self.worker else { return };
        let outcome = worker.on_actions_ready(actions);
        self.emit_outcome(ctx, outcome);
    }

    fn on_buffer_released(&mut self, ctx: &mut Ctx<'_, Self>, released: &BufferReleased) {
        let Some(worker) = &mut self.worker else { return };
        let requests = worker.on_buffer_released(released.buffer);
        self.emit_requests(ctx, requests);
    }

    fn on_slots_reclaimed(&mut self, ctx: &mut Ctx<'_, Self>, reclaimed: &SlotsReclaimed) {
        let Some(worker) = &mut self.worker else { return };
        let requests = worker.on_slots_reclaimed(reclaimed.incarnation, &reclaimed.free);
        self.emit_requests(ctx, requests);
    }

    fn emit_requests(&mut self, ctx: &mut Ctx<'_, Self>, requests: Result<Vec<PolicyRequest>>) {
        let requests = requests.map(|requests| StepOutcome {
            requests,
            ..StepOutcome::default()
        });
        self.emit_outcome(ctx, requests);
    }

    /// Builds the worker as process `incarnation`, continuing the counts of its predecessors,
    /// and says so to the batcher (which answers with the free slots) and the runner.
    fn start(&mut self, ctx: &mut Ctx<'_, Self>) -> Result<()> {
        let Some(setup) = self.setup.take() else {
            return Ok(());
        };
        let (pool, counters) = setup?;
        let incarnation = ctx.incarnation();
        let mut words = [0; WorkerCounts::LEN];
        counters.copy_to_slice(CounterLayout::worker(self.index), &mut words);
        let before = WorkerCounts::from_words(words);
        let counts = if incarnation == 0 {
            before
        } else {
            before.inherit()
        };
        let mut worker =
            RolloutWorker::new(self.index, &self.cfg, &self.registry, pool, incarnation, counts)?;
        worker.start()?;
        self.worker = Some(worker);
        self.counters = Some(counters);
        self.store_counts();
        let started = WorkerStarted {
            worker: self.index,
            incarnation,
            lost_frames: counts.lost_frames - before.lost_frames,
        };
        sent(ctx.emit(&self.worker_started, &started)).map_err(|e| RlfError::EventLoop(e.to_string()))
    }

    fn on_policy_updated(&mut self, ctx: &mut Ctx<'_, Self>, _update: &PolicyUpdated) {
        if let Some(worker) = &mut self.worker {
            let requests = worker.on_policy_updated();
            self.emit_requests(ctx, requests);
        }
    }
}

impl Component for RolloutNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Err(e) = self.start(ctx) {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        self.store_counts();
    }
}

struct InferenceNode {
    worker: Option<InferenceWorker>,
    setup: Option<Result<InferenceWorker>>,
    /// Requests taken since the last forward pass (see [`InferenceNode::flush`]).
    pending: Vec<PolicyRequest>,
    scheduled: bool,
    /// `actions_ready` of each rollout worker, by worker index.
    actions_ready: Vec<Signal<ActionsReady>>,
    shared: SharedState,
}

impl Component for InferenceNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        match self.setup.take() {
            Some(Ok(w)) => self.worker = Some(w),
            Some(Err(e)) => {
                fail(&self.shared, &e);
                ctx.stop_app();
            }
            None => {}
        }
    }
}

impl InferenceNode {
    /// Collects the request; every request taken in this turn of the loop goes into one forward
    /// pass on the next turn (a zero-delay timer).
    fn on_policy_requested(&mut self, ctx: &mut Ctx<'_, Self>, request: &PolicyRequest) {
        self.pending.push(*request);
        if !self.scheduled {
            self.scheduled = true;
            ctx.timer_once(Duration::ZERO, InferenceNode::flush);
        }
    }

    fn flush(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.scheduled = false;
        let Some(worker) = &mut self.worker else { return };
        let requests = std::mem::take(&mut self.pending);
        let result = worker
            .on_policy_requested(&requests)
            .map_err(|e| e.to_string())
            .and_then(|answers| {
                for a in &answers {
                    let signal = self.actions_ready.get(a.worker).ok_or_else(|| {
                        format!(
                            "inference worker: a request from unknown rollout worker {}",
                            a.worker
                        )
                    })?;
                    sent(ctx.emit(signal, a)).map_err(|e| e.to_string())?;
                }
                Ok(())
            });
        self.pending = requests;
        self.pending.clear();
        if let Err(e) = result {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }
}

struct BatcherNode {
    batcher: Batcher,
    /// Every rollout worker's trajectory pool, by worker index.
    pools: Vec<TrajectoryPool>,
    batch_ready: Signal<Batch>,
    /// `buffer_released` of each rollout worker, by worker index.
    buffer_released: Vec<Signal<BufferReleased>>,
    /// `slots_reclaimed` of each rollout worker, by worker index.
    slots_reclaimed: Vec<Signal<SlotsReclaimed>>,
    /// Datasets handed to the learner and not yet trained on, oldest first, each with the slots
    /// it closes (free once it is trained on: the learner trains in order).
    in_flight: VecDeque<Vec<(usize, usize)>>,
    /// The learner's latest version and `--max_policy_lag`: trajectories wholly older are dropped.
    version: u64,
    max_policy_lag: u64,
    /// Trajectories read, dropped as stale, and completed in datasets.
    read: u64,
    dropped: u64,
    batched: u64,
    counters: Option<(ShmArray<u64>, CounterLayout)>,
    shared: SharedState,
}

impl Component for BatcherNode {
    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        if let Some((counters, layout)) = &self.counters {
            let counts = [
                self.read,
                self.dropped,
                self.batched,
                self.batcher.pending_trajectories(),
            ];
            counters.copy_from_slice(layout.at(CounterLayout::READ), &counts);
        }
    }
}

impl BatcherNode {
    fn release(&self, ctx: &mut Ctx<'_, Self>, worker: usize, buffer: usize) -> Result<(), String> {
        let signal = self
            .buffer_released
            .get(worker)
            .ok_or_else(|| format!("batcher: no rollout worker {worker}"))?;
        sent(ctx.emit(signal, &BufferReleased { buffer })).map_err(|e| e.to_string())
    }

    /// A trajectory is in its slot: dropped (and the slot released) if wholly older than
    /// `--max_policy_lag` versions, otherwise cut into datasets, which go to the learner.
    fn on_trajectory_ready(&mut self, ctx: &mut Ctx<'_, Self>, ready: &TrajectoryReady) {
        let result = self
            .pools
            .get(ready.worker)
            .ok_or_else(|| {
                format!(
                    "batcher: a trajectory from unknown rollout worker {}",
                    ready.worker
                )
            })
            .and_then(|pool| {
                let versions = pool.versions(ready.buffer).map_err(|e| e.to_string())?;
                Ok((versions, pool.shape().num_envs))
            })
            .and_then(|(versions, num_envs)| {
                self.read += 1;
                let newest = versions.iter().copied().max().unwrap_or(self.version);
                if self.version.saturating_sub(newest) > self.max_policy_lag {
                    self.dropped += 1;
                    return self.release(ctx, ready.worker, ready.buffer);
                }
                let datasets = self
                    .batcher
                    .on_trajectory_ready(ready.worker, ready.buffer, num_envs);
                for d in &datasets {
                    self.batched += d.trajectories();
                    let closes = d.parts.iter().filter(|p| p.closes).map(|p| (p.worker, p.buffer));
                    self.in_flight.push_back(closes.collect());
                }
                sent(ctx.emit_many(&self.batch_ready, &datasets)).map_err(|e| e.to_string())
            });
        if let Err(e) = result {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }

    /// A rollout worker's process started: its free slots are those this batcher does not hold.
    /// Every trajectory a predecessor signalled was read before (one queue, in order).
    fn on_worker_started(&mut self, ctx: &mut Ctx<'_, Self>, started: &WorkerStarted) {
        let w = started.worker;
        let result = match (self.pools.get(w), self.slots_reclaimed.get(w)) {
            (Some(pool), Some(signal)) => {
                let held = |b: usize| {
                    self.batcher.holds(w, b) || self.in_flight.iter().flatten().any(|&slot| slot == (w, b))
                };
                let free = (0..pool.num_buffers()).filter(|&b| !held(b)).collect();
                let reclaimed = SlotsReclaimed {
                    incarnation: started.incarnation,
                    free,
                };
                sent(ctx.emit(signal, &reclaimed)).map_err(|e| e.to_string())
            }
            _ => Err(format!("batcher: no rollout worker {w}")),
        };
        if let Err(e) = result {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }

    /// The learner trained on the oldest dataset in flight: the slots it closes are free.
    fn on_training_reported(&mut self, ctx: &mut Ctx<'_, Self>, report: &TrainingReport) {
        self.version = report.version;
        let closed = self.in_flight.pop_front().unwrap_or_default();
        let result = closed
            .into_iter()
            .try_for_each(|(worker, buffer)| self.release(ctx, worker, buffer));
        if let Err(e) = result {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }
}

struct LearnerNode {
    learner: Option<Learner>,
    setup: Option<Result<Learner>>,
    policy_updated: Signal<PolicyUpdated>,
    training_reported: Signal<TrainingReport>,
    checkpointer: Option<Checkpointer>,
    /// The runner's latest counts, for the checkpoint saved at stop.
    progress: CheckpointRequest,
    /// The policy version of the last checkpoint saved.
    saved_version: Option<u64>,
    /// Trajectories completed by the datasets trained on.
    trained: u64,
    counters: Option<(ShmArray<u64>, CounterLayout)>,
    shared: SharedState,
}

impl LearnerNode {
    fn on_batch_ready(&mut self, ctx: &mut Ctx<'_, Self>, batch: &Batch) {
        let Some(learner) = &mut self.learner else { return };
        let result = learner
            .on_batch_ready(batch)
            .map_err(|e| e.to_string())
            .and_then(|(update, report)| {
                self.trained += batch.trajectories();
                sent(ctx.emit(&self.policy_updated, &update)).map_err(|e| e.to_string())?;
                sent(ctx.emit(&self.training_reported, &report)).map_err(|e| e.to_string())
            });
        if let Err(e) = result {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }
}

impl LearnerNode {
    fn on_progress_reported(&mut self, _ctx: &mut Ctx<'_, Self>, progress: &CheckpointRequest) {
        self.progress = *progress;
    }

    /// Every `--save_every_sec`: saves, unless no SGD step was taken since the last checkpoint
    /// (requests that queued while the learner was busy then cost nothing).
    fn on_checkpoint_requested(&mut self, ctx: &mut Ctx<'_, Self>, request: &CheckpointRequest) {
        self.progress = *request;
        let version = self.learner.as_ref().map(Learner::version);
        if version.is_some() && version == self.saved_version {
            return;
        }
        if let Err(e) = self.save_checkpoint() {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }

    fn save_checkpoint(&mut self) -> Result<()> {
        match (&self.learner, &mut self.checkpointer) {
            (Some(learner), Some(checkpointer)) => {
                checkpointer.save(learner.state()?, &self.progress)?;
                self.saved_version = Some(learner.version());
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl Component for LearnerNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        match self.setup.take() {
            Some(Ok(l)) => self.learner = Some(l),
            Some(Err(e)) => {
                fail(&self.shared, &e);
                ctx.stop_app();
            }
            None => {}
        }
    }

    /// The last checkpoint, whatever stopped the run (the stop conditions, SIGINT, SIGTERM).
    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        if let Some((counters, layout)) = &self.counters {
            counters.copy_from_slice(layout.at(CounterLayout::TRAINED), &[self.trained]);
        }
        if let Err(e) = self.save_checkpoint() {
            fail(&self.shared, &e);
        }
    }
}

struct RunnerNode {
    runner: Runner,
    report_interval: Option<Duration>,
    save_every: Option<Duration>,
    experiment: Option<ExperimentRun>,
    checkpoint_requested: Signal<CheckpointRequest>,
    progress_reported: Signal<CheckpointRequest>,
    shared: SharedState,
    /// The final counts went to the learner and the app is stopping.
    stopping: bool,
}

impl RunnerNode {
    fn on_rollout_reported(&mut self, ctx: &mut Ctx<'_, Self>, report: &RolloutReport) {
        // Rollouts that arrive while the app stops are neither trained on nor counted, so that the summary and
        // the learner's last checkpoint hold the same counts.
        if !self.stopping && self.runner.on_rollout_reported(report).is_some() {
            self.stop(ctx);
        }
    }

    /// Stops the app after telling the learner the final counts (for its last checkpoint), once.
    fn stop(&mut self, ctx: &mut Ctx<'_, Self>) {
        if std::mem::replace(&mut self.stopping, true) {
            return;
        }
        if let Err(e) = sent(ctx.emit(&self.progress_reported, &self.runner.checkpoint_request())) {
            fail(&self.shared, &e);
        }
        ctx.stop_app();
    }

    fn on_training_reported(&mut self, _ctx: &mut Ctx<'_, Self>, report: &TrainingReport) {
        self.runner.on_training_reported(report);
    }

    /// Logs the replacement of a rollout worker's process and what its predecessor lost.
    fn on_worker_started(&mut self, ctx: &mut Ctx<'_, Self>, started: &WorkerStarted) {
        if started.incarnation == 0 {
            return;
        }
        let line = format!(
            "rollout_worker_{} replaced by a new process (incarnation {}); discarded {} env frames of the old one's unfinished trajectories",
            started.worker, started.incarnation, started.lost_frames
        );
        let logged = match &self.experiment {
            Some(exp) => exp.log(&line),
            None => {
                eprintln!("[rlfactory] {line}");
                Ok(())
            }
        };
        if let Err(e) = logged {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }

    /// The progress line to stderr and the log, the scalars to TensorBoard.
    fn print_progress(&mut self, ctx: &mut Ctx<'_, Self>) {
        let report = self.runner.report();
        let written = match &mut self.experiment {
            Some(exp) => exp
                .log(&report.line)
                .and_then(|()| exp.write_scalars(report.env_frames, &report.scalars)),
            None => {
                eprintln!("[rlfactory] {}", report.line);
                Ok(())
            }
        };
        if let Err(e) = written {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
        if self.runner.check_stop().is_some() {
            self.stop(ctx);
        } else if let Err(e) = sent(ctx.emit(&self.progress_reported, &self.runner.checkpoint_request())) {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }

    /// Every `--save_every_sec`: asks the learner for a checkpoint and redraws the learning curve.
    fn request_checkpoint(&mut self, ctx: &mut Ctx<'_, Self>) {
        let request = self.runner.checkpoint_request();
        let done = sent(ctx.emit(&self.checkpoint_requested, &request))
            .map_err(|e| e.to_string())
            .and_then(|()| match &self.experiment {
                Some(exp) => exp.plot().map_err(|e| e.to_string()),
                None => Ok(()),
            });
        if let Err(e) = done {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }
}

impl Component for RunnerNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Some(period) = self.report_interval {
            ctx.timer_periodic(period, RunnerNode::print_progress);
        }
        if let Some(period) = self.save_every {
            ctx.timer_periodic(period, RunnerNode::request_checkpoint);
        }
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        let summary = self.runner.summary();
        if let Some(exp) = &self.experiment {
            let ret = summary
                .mean_return
                .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}"));
            let logged = exp.plot().and_then(|()| {
                exp.log(&format!(
                    "stopped after {} env frames, mean return {ret}, policy version {}",
                    summary.env_frames, summary.policy_version
                ))
            });
            if let Err(e) = logged {
                fail(&self.shared, &e);
            }
        }
        if let Ok(mut s) = self.shared.lock() {
            s.summary = Some(summary);
        }
    }
}

/// Everything the components are built from.
struct Parts {
    cfg: Config,
    registry: EnvRegistry,
    process_start: Instant,
    shared: SharedState,
    plane: DataPlane,
    /// The experiment folder (main process, `--save_experiment`).
    experiment: Option<ExperimentRun>,
    /// `(env frames, episodes, policy version)` of the checkpoint the run resumes from.
    resumed: Option<(u64, u64, u64)>,
}

/// The shared-memory data plane, created by the main process and mapped by the others: the
/// published weights and one trajectory pool per rollout worker. Handed to child processes inside
/// the app's configuration ([`GraphSpec`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DataPlane {
    weights: SharedWeightsHandle,
    pools: Vec<TrajectoryPoolHandle>,
    counters: ShmArrayHandle,
}

/// What a child process rebuilds the graph from: the resolved config (as the TOML `--config`
/// reads) and the data plane.
#[derive(Debug, Serialize, Deserialize)]
struct GraphSpec {
    env: String,
    config_toml: String,
    plane: DataPlane,
}

/// The regions behind a [`DataPlane`], owned (and removed at the end) by the main process.
struct PlaneRegions {
    weights: SharedWeights,
    _pools: Vec<TrajectoryPool>,
    counters: ShmArray<u64>,
    plane: DataPlane,
}

/// Slots per rollout worker's trajectory pool: per split, one to fill and its share of the
/// slots that `--num_batches_to_accumulate` + 1 datasets hold (a slot stays with the batcher and
/// the learner until the dataset closing it is trained on). When the learner falls that far
/// behind, the workers run out of slots and wait: sampling stops.
fn buffers_per_worker(cfg: &Config) -> usize {
    let s = &cfg.sampling;
    let splits = s.worker_num_splits;
    let per_split = s.num_envs_per_worker / splits;
    let per_dataset = cfg.dataset_size().div_ceil(s.rollout * per_split);
    let held = (per_dataset * (cfg.appo.num_batches_to_accumulate + 1)).div_ceil(s.num_workers * splits);
    splits * (1 + held.max(1))
}

fn create_plane(cfg: &Config, registry: &EnvRegistry) -> Result<PlaneRegions> {
    let model = new_model(cfg, registry)?;
    let weights = SharedWeights::create(model.weights()?.values.len())?;
    let s = &cfg.sampling;
    let shape = TrajectoryShape {
        rollout: s.rollout,
        num_envs: s.num_envs_per_worker / s.worker_num_splits,
        obs_dim: model.obs_dim(),
        action_dim: model.action_dim(),
    };
    let pools = (0..s.num_workers)
        .map(|_| TrajectoryPool::create(shape, buffers_per_worker(cfg)))
        .collect::<Result<Vec<_>>>()?;
    let layout = CounterLayout {
        workers: s.num_workers,
    };
    let counters = ShmArray::create(layout.len())?;
    let plane = DataPlane {
        weights: weights.handle(),
        pools: pools.iter().map(TrajectoryPool::handle).collect(),
        counters: counters.handle(),
    };
    Ok(PlaneRegions {
        weights,
        _pools: pools,
        counters,
        plane,
    })
}

fn new_model(cfg: &Config, registry: &EnvRegistry) -> Result<ActorCritic> {
    let probe = registry.make(&cfg.env.env)?;
    ActorCritic::seed(cfg.env.seed);
    ActorCritic::new(
        probe.observation_space(),
        probe.action_space(),
        &cfg.model,
        cfg.run.device,
    )
}

/// The trajectory counters of a component, or `None` after recording why they cannot be mapped.
fn open_counters(
    handle: &ShmArrayHandle,
    layout: CounterLayout,
    shared: &SharedState,
) -> Option<(ShmArray<u64>, CounterLayout)> {
    match ShmArray::open(handle) {
        Ok(c) => Some((c, layout)),
        Err(e) => {
            fail(shared, &e);
            None
        }
    }
}

fn build_error(e: &dyn std::fmt::Display) -> BuildError {
    BuildError::Config {
        app: "rlfactory".into(),
        message: e.to_string(),
    }
}

/// The build function of a child process (`rlf_signal::child_entry(rlfactory::runner::child_build)`
/// comes first in the binary's `main`): the same graph as the parent's, from the [`GraphSpec`] in
/// the app's configuration.
pub fn child_build(app: &mut AppBuilder) -> Result<(), BuildError> {
    let spec: GraphSpec = app.config()?;
    let args = config_file_args(&spec.config_toml, Path::new("<resolved config of the parent>"))
        .map_err(|e| build_error(&e))?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cfg = Config::for_env(&spec.env, &args).map_err(|e| build_error(&e))?;
    tch::set_num_threads(cfg.run.num_threads);
    let parts = Parts {
        cfg,
        registry: EnvRegistry::with_builtin(),
        process_start: Instant::now(),
        shared: Arc::default(),
        plane: spec.plane,
        experiment: None,
        resumed: None,
    };
    build_graph(app, parts)
}

/// The whole component graph and all its connections, in one place. Serial mode puts every loop
/// on the main loop; otherwise each rollout worker, each inference worker and the learner (with
/// the batcher) get a process of their own, and the runner stays on the main loop.
fn build_graph(app: &mut AppBuilder, parts: Parts) -> Result<(), BuildError> {
    let Parts {
        cfg,
        registry,
        process_start,
        shared,
        plane,
        experiment,
        resumed,
    } = parts;
    app.set_serial(cfg.run.serial_mode);
    // Worker processes start as forks of this one, without libtorch's start-up again, unless an
    // embedded Python interpreter (Gymnasium's envs) would have to survive the fork.
    app.set_fork(!cfg.env.env.starts_with(rlf_env::GYM_PREFIX));
    app.set_heartbeat(Duration::from_secs_f64(cfg.run.heartbeat_interval));
    let main = app.main_loop();
    app.set_queue_bytes(main, 256 << 20);
    let s = &cfg.sampling;

    // Loops and objects.
    let workers: Vec<_> = (0..s.num_workers)
        .map(|i| {
            let l = app.process_loop(&format!("rollout_worker_{i}"));
            app.restart_on_failure(l, cfg.run.max_worker_restarts);
            app.object::<RolloutNode>(l, &format!("rollout_worker_{i}"))
        })
        .collect();
    let inference: Vec<_> = (0..s.policy_workers_per_policy)
        .map(|j| {
            let l = app.process_loop(&format!("inference_worker_{j}"));
            app.object::<InferenceNode>(l, &format!("inference_worker_{j}"))
        })
        .collect();
    let learner_loop = app.process_loop("learner");
    let batcher = app.object::<BatcherNode>(learner_loop, "batcher");
    let learner = app.object::<LearnerNode>(learner_loop, "learner");
    let runner = app.object::<RunnerNode>(main, "runner");

    // Signals and connections. Requests go through a work queue (each taken by one inference
    // worker); actions and released slots go to the one rollout worker they concern.
    let policy_requested = app.work_queue::<PolicyRequest>("policy_requested", 1 << 20);
    for &inf in &inference {
        app.consume(policy_requested, inf, InferenceNode::on_policy_requested);
    }
    let batch_ready = app.signal::<Batch, _>(batcher, "batch_ready");
    let layout = CounterLayout {
        workers: s.num_workers,
    };
    let policy_updated = app.signal::<PolicyUpdated, _>(learner, "policy_updated");
    let training_reported = app.signal::<TrainingReport, _>(learner, "training_reported");
    let checkpoint_requested = app.signal::<CheckpointRequest, _>(runner, "checkpoint_requested");
    let progress_reported = app.signal::<CheckpointRequest, _>(runner, "progress_reported");
    app.connect(
        checkpoint_requested,
        learner,
        LearnerNode::on_checkpoint_requested,
    );
    app.connect(progress_reported, learner, LearnerNode::on_progress_reported);
    app.connect(batch_ready, learner, LearnerNode::on_batch_ready);
    app.connect(training_reported, runner, RunnerNode::on_training_reported);
    app.connect(training_reported, batcher, BatcherNode::on_training_reported);
    let mut actions_ready = vec![Vec::new(); inference.len()];
    let mut buffer_released = Vec::new();
    let mut slots_reclaimed = Vec::new();
    for (i, &w) in workers.iter().enumerate() {
        for (j, &inf) in inference.iter().enumerate() {
            let signal = app.signal::<ActionsReady, _>(inf, &format!("actions_ready_{i}"));
            app.connect(signal, w, RolloutNode::on_actions_ready);
            actions_ready[j].push(signal);
        }
        let released = app.signal::<BufferReleased, _>(batcher, &format!("buffer_released_{i}"));
        app.connect(released, w, RolloutNode::on_buffer_released);
        buffer_released.push(released);
        let reclaimed = app.signal::<SlotsReclaimed, _>(batcher, &format!("slots_reclaimed_{i}"));
        app.connect(reclaimed, w, RolloutNode::on_slots_reclaimed);
        slots_reclaimed.push(reclaimed);
        let worker_started = app.signal::<WorkerStarted, _>(w, "worker_started");
        app.connect(worker_started, batcher, BatcherNode::on_worker_started);
        app.connect(worker_started, runner, RunnerNode::on_worker_started);
        let trajectory_ready = app.signal::<TrajectoryReady, _>(w, "trajectory_ready");
        let rollout_reported = app.signal::<RolloutReport, _>(w, "rollout_reported");
        app.connect(trajectory_ready, batcher, BatcherNode::on_trajectory_ready);
        app.connect(rollout_reported, runner, RunnerNode::on_rollout_reported);
        app.connect(policy_updated, w, RolloutNode::on_policy_updated);
        let (cfg, registry, shared) = (cfg.clone(), registry.clone(), Arc::clone(&shared));
        let (pool, counters) = (plane.pools.get(i).cloned(), plane.counters.clone());
        app.construct(w, move || RolloutNode {
            index: i,
            worker: None,
            counters: None,
            queued: Vec::new(),
            scheduled: false,
            setup: Some(
                pool.ok_or_else(|| RlfError::Config(format!("no trajectory pool for rollout worker {i}")))
                    .and_then(|h| TrajectoryPool::open(&h))
                    .and_then(|pool| Ok((pool, ShmArray::open(&counters)?))),
            ),
            cfg,
            registry,
            policy_requested,
            trajectory_ready,
            rollout_reported,
            worker_started,
            shared,
        });
    }

    // Constructors (each runs only in the process of its object's loop). The learner's and the
    // inference workers' networks start from the same seed, so they start identical; the learner
    // publishes every update into the shared weights afterwards.
    for (&inf, signals) in inference.iter().zip(actions_ready) {
        let (cfg, registry, shared, weights, pools) = (
            cfg.clone(),
            registry.clone(),
            Arc::clone(&shared),
            plane.weights.clone(),
            plane.pools.clone(),
        );
        app.construct(inf, move || InferenceNode {
            worker: None,
            setup: Some(new_model(&cfg, &registry).and_then(|model| {
                let weights = SharedWeights::open(&weights)?;
                let pools = pools
                    .iter()
                    .map(TrajectoryPool::open)
                    .collect::<Result<Vec<_>>>()?;
                Ok(InferenceWorker::new(Box::new(model), weights, pools))
            })),
            pending: Vec::new(),
            scheduled: false,
            actions_ready: signals,
            shared,
        });
    }
    let (dataset_size, rollout) = (cfg.dataset_size(), s.rollout);
    let (pools, sh, counters) = (plane.pools.clone(), Arc::clone(&shared), plane.counters.clone());
    let max_policy_lag = cfg.appo.max_policy_lag;
    app.construct(batcher, move || {
        let opened = pools.iter().map(TrajectoryPool::open).collect::<Result<Vec<_>>>();
        let pools = opened.unwrap_or_else(|e| {
            fail(&sh, &e);
            Vec::new()
        });
        let counters = open_counters(&counters, layout, &sh);
        BatcherNode {
            batcher: Batcher::new(dataset_size, rollout),
            pools,
            batch_ready,
            buffer_released,
            slots_reclaimed,
            in_flight: VecDeque::new(),
            version: 0,
            max_policy_lag,
            read: 0,
            dropped: 0,
            batched: 0,
            counters,
            shared: sh,
        }
    });
    let (c, r, sh, weights, counters, pools) = (
        cfg.clone(),
        registry.clone(),
        Arc::clone(&shared),
        plane.weights.clone(),
        plane.counters.clone(),
        plane.pools.clone(),
    );
    app.construct(learner, move || {
        let counters = open_counters(&counters, layout, &sh);
        // With an experiment folder, the learner continues from its newest intact checkpoint.
        let mut checkpointer = None;
        let mut progress = CheckpointRequest::default();
        let setup = new_model(&c, &r).and_then(|model| {
            let appo = Appo::new(model, &c.appo, c.run.train_for_env_steps)?;
            let pools = pools
                .iter()
                .map(TrajectoryPool::open)
                .collect::<Result<Vec<_>>>()?;
            let mut learner = Learner::new(appo, SharedWeights::open(&weights)?, pools);
            if c.run.save_experiment {
                let (opened, resumed) = Checkpointer::open_and_resume(&c, &mut learner)?;
                checkpointer = Some(opened);
                progress = resumed;
            }
            Ok(learner)
        });
        LearnerNode {
            learner: None,
            setup: Some(setup),
            policy_updated,
            training_reported,
            checkpointer,
            progress,
            saved_version: None,
            trained: 0,
            counters,
            shared: sh,
        }
    });
    let report_interval =
        (cfg.run.report_interval_sec > 0.0).then(|| Duration::from_secs_f64(cfg.run.report_interval_sec));
    let save_every = experiment
        .is_some()
        .then(|| Duration::from_secs_f64(cfg.checkpoint.save_every_sec));
    let mut run = Runner::new(&cfg, process_start);
    if let Some((frames, episodes, version)) = resumed {
        run.resume_from(frames, episodes, version);
    }
    app.construct(runner, move || RunnerNode {
        runner: run,
        report_interval,
        save_every,
        experiment,
        checkpoint_requested,
        progress_reported,
        shared,
        stopping: false,
    });
    Ok(())
}

/// After the learner's process died or hung: a checkpoint of the last weights it published (with
/// the normalisers), so that the run can resume from them. Adam starts afresh; the learning rate
/// is the last one the learner reported.
fn save_published(cfg: &Config, weights: &SharedWeights, summary: &Summary) -> Result<()> {
    let mut model = new_model(cfg, &EnvRegistry::with_builtin())?;
    let mut published = PolicyWeights {
        values: vec![0.0; weights.len()],
    };
    // Nobody writes any more: a torn read means the learner died while publishing.
    let version = weights.try_read(&mut published.values).map_err(|_| {
        RlfError::EventLoop("the learner died while publishing its weights; they are torn".into())
    })?;
    model.load_weights(&published)?;
    let lr = summary
        .last_metrics
        .iter()
        .find(|(name, _)| name == "train/lr")
        .map_or(cfg.appo.learning_rate, |(_, lr)| *lr);
    let training = TrainingState {
        version,
        frames_trained: summary.env_frames,
        lr,
    };
    let progress = CheckpointRequest {
        env_steps: summary.env_frames,
        episodes: summary.episodes,
        mean_return: summary.mean_return,
    };
    Checkpointer::open(cfg)?.save((model.named_tensors()?, training), &progress)
}

/// Trains as `cfg` says and returns the summary. `process_start` is when the process started
/// (the summary's `wall_seconds` counts from it).
pub fn train(cfg: &Config, process_start: Instant) -> Result<Summary> {
    tch::set_num_threads(cfg.run.num_threads);
    let registry = EnvRegistry::with_builtin();
    let (experiment, resumed) = if cfg.run.save_experiment {
        let experiment = ExperimentRun::prepare(cfg)?;
        let path = experiment.dir().join("config.toml");
        std::fs::write(&path, cfg.to_toml()?).map_err(|source| RlfError::Io {
            what: "writing",
            path,
            source,
        })?;
        (Some(experiment), crate::experiment::resume_counts(cfg)?)
    } else {
        (None, None)
    };
    let shared: SharedState = Arc::default();
    let regions = create_plane(cfg, &registry)?;
    let spec = GraphSpec {
        env: cfg.env.env.clone(),
        config_toml: cfg.to_toml()?,
        plane: regions.plane.clone(),
    };
    let parts = Parts {
        cfg: cfg.clone(),
        registry,
        process_start,
        shared: Arc::clone(&shared),
        plane: regions.plane.clone(),
        experiment,
        resumed,
    };
    let app = App::new("rlfactory")
        .with_config(&spec)
        .map_err(|e| RlfError::EventLoop(e.to_string()))?;
    let outcome = app.run(move |app| build_graph(app, parts));
    let layout = CounterLayout {
        workers: cfg.sampling.num_workers,
    };
    let mut state = shared
        .lock()
        .map_err(|_| RlfError::EventLoop("a component panicked".into()))?;
    // A fault (a dead process, a panic) comes first: the errors components record after it are
    // its consequences (queues of stopping loops are closed).
    let outcome = outcome.map_err(|e| RlfError::EventLoop(e.to_string()))?;
    if !outcome.faults.is_empty() {
        let mut message = outcome.to_string();
        let learner_lost = outcome.faults.iter().any(|f| {
            matches!(f, Fault::LoopDied { loop_name, .. } | Fault::Hung { loop_name, .. }
                | Fault::StopTimeout { loop_name } if loop_name == "learner")
        });
        if let (true, Some(summary)) = (learner_lost && cfg.run.save_experiment, &state.summary) {
            match save_published(cfg, &regions.weights, summary) {
                Ok(()) => message.push_str("saved a checkpoint of the weights the learner last published"),
                Err(e) => message.push_str(&format!("no checkpoint of the lost learner: {e}")),
            }
        }
        return Err(RlfError::EventLoop(message));
    }
    if let Some(error) = state.error.take() {
        return Err(RlfError::EventLoop(error));
    }
    let mut summary = state
        .summary
        .take()
        .ok_or_else(|| RlfError::EventLoop("the runner did not report a summary".into()))?;
    layout.summarise(&regions.counters, &mut summary);
    drop(regions);
    summary.cpu_seconds = outcome
        .loops
        .iter()
        .filter_map(|l| Some((l.name.clone(), l.stats?.cpu_micros as f64 / 1e6)))
        .collect();
    summary.worker_restarts = outcome
        .restarts
        .iter()
        .filter(|r| r.loop_name.starts_with("rollout_worker_"))
        .count() as u64;
    if let Some(signal) = outcome.interrupted {
        summary.signal = Some(signal);
        summary.stop_reason = StopReason::Interrupted;
    }
    Ok(summary)
}
