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
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rlf_signal::{App, AppBuilder, BuildError, Component, Ctx, Signal};
use serde::Serialize;

use crate::algo::appo::{Appo, Dataset};
use crate::config::Config;
use crate::env::EnvRegistry;
use crate::error::{Result, RlfError};
use crate::learning::{Batcher, Learner, PolicyUpdated, TrainingReport};
use crate::model::ActorCritic;
use crate::sampling::{
    ActionsReady, InferenceWorker, PolicyRequest, RolloutReport, RolloutWorker, Trajectory,
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
    /// A component failed, or the run was interrupted.
    Failed,
}

/// The outcome of a run, written by `--summary_json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Env frames simulated.
    pub env_frames: u64,
    /// Seconds from process start to the end of training.
    pub wall_seconds: f64,
    /// Env frames per second of training (from the start of sampling).
    pub fps: f64,
    /// Mean return of the last 100 episodes (`null` before the first episode ends).
    pub mean_return: Option<f64>,
    /// Whether `--stop_at_reward` was reached.
    pub reached_reward: bool,
    /// Env frames when the reward was reached.
    pub frames_to_reward: Option<u64>,
    /// Seconds from process start when the reward was reached.
    pub seconds_to_reward: Option<f64>,
    /// Episodes finished.
    pub episodes: u64,
    /// Final policy version (SGD steps).
    pub policy_version: u64,
    /// Why the run stopped.
    pub stop_reason: StopReason,
    /// The last training metrics.
    pub last_metrics: Vec<(String, f64)>,
}

/// Statistics and stop conditions.
#[derive(Debug)]
pub struct Runner {
    process_start: Instant,
    sampling_start: Instant,
    max_frames: u64,
    max_seconds: f64,
    stop_at_reward: Option<f64>,
    env_frames: u64,
    episodes: u64,
    returns: VecDeque<f64>,
    reached: Option<(u64, f64)>,
    version: u64,
    version_diff: f64,
    last_metrics: Vec<(String, f64)>,
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
            max_frames: cfg.run.train_for_env_steps,
            max_seconds: cfg.run.train_for_seconds,
            stop_at_reward: cfg.run.stop_at_reward,
            env_frames: 0,
            episodes: 0,
            returns: VecDeque::with_capacity(RETURN_WINDOW),
            reached: None,
            version: 0,
            version_diff: 0.0,
            last_metrics: Vec::new(),
            last_line: (now, 0),
            stop: None,
        }
    }

    /// Mean return of the last 100 episodes.
    pub fn mean_return(&self) -> Option<f64> {
        (!self.returns.is_empty()).then(|| self.returns.iter().sum::<f64>() / self.returns.len() as f64)
    }

    /// Slot of `rollout_reported`: counts frames and episodes; returns why to stop, if it is time.
    pub fn on_rollout_reported(&mut self, report: &RolloutReport) -> Option<StopReason> {
        self.env_frames += report.env_frames;
        for &r in &report.episode_returns {
            if self.returns.len() == RETURN_WINDOW {
                self.returns.pop_front();
            }
            self.returns.push_back(r);
            self.episodes += 1;
        }
        self.check_stop()
    }

    /// Slot of `training_reported`.
    pub fn on_training_reported(&mut self, report: &TrainingReport) {
        self.version = report.version;
        if let Some((_, v)) = report.metrics.iter().find(|(k, _)| k == "train/version_diff_avg") {
            self.version_diff = *v;
        }
        self.last_metrics.clone_from(&report.metrics);
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
        let now = Instant::now();
        let (then, frames) = self.last_line;
        let dt = now.duration_since(then).as_secs_f64().max(1e-9);
        let fps = (self.env_frames - frames) as f64 / dt;
        self.last_line = (now, self.env_frames);
        let ret = self
            .mean_return()
            .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.1}"));
        format!(
            "frames {} | fps {:.0} | mean return {} ({} episodes) | policy lag {:.1} | version {}",
            self.env_frames, fps, ret, self.episodes, self.version_diff, self.version
        )
    }

    /// The summary of the run so far.
    pub fn summary(&self) -> Summary {
        let elapsed = self.sampling_start.elapsed().as_secs_f64().max(1e-9);
        Summary {
            env_frames: self.env_frames,
            wall_seconds: self.process_start.elapsed().as_secs_f64(),
            fps: self.env_frames as f64 / elapsed,
            mean_return: self.mean_return(),
            reached_reward: self.reached.is_some(),
            frames_to_reward: self.reached.map(|r| r.0),
            seconds_to_reward: self.reached.map(|r| r.1),
            episodes: self.episodes,
            policy_version: self.version,
            stop_reason: self.stop.unwrap_or(StopReason::Failed),
            last_metrics: self.last_metrics.clone(),
        }
    }
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

fn fail(shared: &SharedState, error: &dyn std::fmt::Display) {
    if let Ok(mut s) = shared.lock() {
        s.error.get_or_insert_with(|| error.to_string());
    }
}

struct RolloutNode {
    worker: Option<RolloutWorker>,
    /// Requests waiting for the next turn of the loop (see [`RolloutNode::defer`]).
    queued: Vec<PolicyRequest>,
    scheduled: bool,
    setup: Option<Result<RolloutWorker>>,
    policy_requested: Signal<PolicyRequest>,
    trajectory_ready: Signal<Trajectory>,
    rollout_reported: Signal<RolloutReport>,
    shared: SharedState,
}

impl RolloutNode {
    /// Queues requests for actions and emits them on the loop's next turn (a zero-delay timer)
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
        let requests = std::mem::take(&mut self.queued);
        if let Err(e) = ctx.emit_many(&self.policy_requested, &requests) {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }

    fn on_actions_ready(&mut self, ctx: &mut Ctx<'_, Self>, actions: &ActionsReady) {
        let Some(worker) = &mut self.worker else { return };
        let outcome = match worker.on_actions_ready(actions) {
            Ok(o) => o,
            Err(e) => {
                fail(&self.shared, &e);
                ctx.stop_app();
                return;
            }
        };
        let emitted = (|| {
            if let Some(t) = &outcome.trajectory {
                ctx.emit(&self.trajectory_ready, t)?;
            }
            if let Some(r) = &outcome.report {
                ctx.emit(&self.rollout_reported, r)?;
            }
            Ok::<(), rlf_signal::EmitError>(())
        })();
        if let Err(e) = emitted {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
        self.defer(ctx, outcome.request);
    }

    fn on_policy_updated(&mut self, ctx: &mut Ctx<'_, Self>, _update: &PolicyUpdated) {
        if let Some(worker) = &mut self.worker {
            let requests = worker.on_policy_updated();
            self.defer(ctx, requests);
        }
    }
}

impl Component for RolloutNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        let started = self.setup.take().map(|w| {
            w.and_then(|mut w| {
                let requests = w.start()?;
                Ok((w, requests))
            })
        });
        match started {
            Some(Ok((worker, requests))) => {
                self.worker = Some(worker);
                self.defer(ctx, requests);
            }
            Some(Err(e)) => {
                fail(&self.shared, &e);
                ctx.stop_app();
            }
            None => {}
        }
    }
}

struct InferenceNode {
    worker: InferenceWorker,
    actions_ready: Signal<ActionsReady>,
    shared: SharedState,
}

impl Component for InferenceNode {}

impl InferenceNode {
    fn on_policy_requested(&mut self, ctx: &mut Ctx<'_, Self>, request: &PolicyRequest) {
        let result = self
            .worker
            .on_policy_requested(request)
            .map_err(|e| e.to_string())
            .and_then(|a| ctx.emit(&self.actions_ready, &a).map_err(|e| e.to_string()));
        if let Err(e) = result {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }

    fn on_policy_updated(&mut self, ctx: &mut Ctx<'_, Self>, update: &PolicyUpdated) {
        if let Err(e) = self.worker.on_policy_updated(update) {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }
}

struct BatcherNode {
    batcher: Batcher,
    batch_ready: Signal<Dataset>,
    shared: SharedState,
}

impl Component for BatcherNode {}

impl BatcherNode {
    fn on_trajectory_ready(&mut self, ctx: &mut Ctx<'_, Self>, traj: &Trajectory) {
        let result = self
            .batcher
            .on_trajectory_ready(traj)
            .map_err(|e| e.to_string())
            .and_then(|ready| {
                ctx.emit_many(&self.batch_ready, &ready)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = result {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }
}

struct LearnerNode {
    learner: Learner,
    policy_updated: Signal<PolicyUpdated>,
    training_reported: Signal<TrainingReport>,
    save_to: Option<PathBuf>,
    shared: SharedState,
}

impl LearnerNode {
    fn on_batch_ready(&mut self, ctx: &mut Ctx<'_, Self>, dataset: &Dataset) {
        let result = self
            .learner
            .on_batch_ready(dataset)
            .map_err(|e| e.to_string())
            .and_then(|(update, report)| {
                ctx.emit(&self.policy_updated, &update)
                    .map_err(|e| e.to_string())?;
                ctx.emit(&self.training_reported, &report)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = result {
            fail(&self.shared, &e);
            ctx.stop_app();
        }
    }
}

impl Component for LearnerNode {
    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        if let Some(path) = &self.save_to {
            if let Err(e) = self.learner.save(path) {
                fail(&self.shared, &e);
            }
        }
    }
}

struct RunnerNode {
    runner: Runner,
    report_interval: Option<Duration>,
    shared: SharedState,
}

impl RunnerNode {
    fn on_rollout_reported(&mut self, ctx: &mut Ctx<'_, Self>, report: &RolloutReport) {
        if self.runner.on_rollout_reported(report).is_some() {
            ctx.stop_app();
        }
    }

    fn on_training_reported(&mut self, _ctx: &mut Ctx<'_, Self>, report: &TrainingReport) {
        self.runner.on_training_reported(report);
    }

    fn print_progress(&mut self, ctx: &mut Ctx<'_, Self>) {
        eprintln!("[rlfactory] {}", self.runner.progress_line());
        if self.runner.check_stop().is_some() {
            ctx.stop_app();
        }
    }
}

impl Component for RunnerNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Some(period) = self.report_interval {
            ctx.timer_periodic(period, RunnerNode::print_progress);
        }
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        if let Ok(mut s) = self.shared.lock() {
            s.summary = Some(self.runner.summary());
        }
    }
}

/// Everything the components are built from.
struct Parts {
    cfg: Config,
    registry: EnvRegistry,
    process_start: Instant,
    shared: SharedState,
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

/// The whole component graph and all its connections, in one place.
fn build_graph(app: &mut AppBuilder, parts: Parts) -> Result<(), BuildError> {
    let Parts {
        cfg,
        registry,
        process_start,
        shared,
    } = parts;
    app.set_serial(cfg.run.serial_mode);
    let main = app.main_loop();
    app.set_queue_bytes(main, 256 << 20);

    // Objects.
    let workers: Vec<_> = (0..cfg.sampling.num_workers)
        .map(|i| app.object::<RolloutNode>(main, &format!("rollout_worker_{i}")))
        .collect();
    let inference = app.object::<InferenceNode>(main, "inference_worker");
    let batcher = app.object::<BatcherNode>(main, "batcher");
    let learner = app.object::<LearnerNode>(main, "learner");
    let runner = app.object::<RunnerNode>(main, "runner");

    // Signals.
    let actions_ready = app.signal::<ActionsReady, _>(inference, "actions_ready");
    let batch_ready = app.signal::<Dataset, _>(batcher, "batch_ready");
    let policy_updated = app.signal::<PolicyUpdated, _>(learner, "policy_updated");
    let training_reported = app.signal::<TrainingReport, _>(learner, "training_reported");

    // Connections.
    app.connect(batch_ready, learner, LearnerNode::on_batch_ready);
    app.connect(policy_updated, inference, InferenceNode::on_policy_updated);
    app.connect(training_reported, runner, RunnerNode::on_training_reported);
    for (i, &w) in workers.iter().enumerate() {
        let policy_requested = app.signal::<PolicyRequest, _>(w, "policy_requested");
        let trajectory_ready = app.signal::<Trajectory, _>(w, "trajectory_ready");
        let rollout_reported = app.signal::<RolloutReport, _>(w, "rollout_reported");
        app.connect(policy_requested, inference, InferenceNode::on_policy_requested);
        app.connect(actions_ready, w, RolloutNode::on_actions_ready);
        app.connect(trajectory_ready, batcher, BatcherNode::on_trajectory_ready);
        app.connect(rollout_reported, runner, RunnerNode::on_rollout_reported);
        app.connect(policy_updated, w, RolloutNode::on_policy_updated);
        let (cfg, registry, shared) = (cfg.clone(), registry.clone(), Arc::clone(&shared));
        app.construct(w, move || RolloutNode {
            worker: None,
            queued: Vec::new(),
            scheduled: false,
            setup: Some(RolloutWorker::new(i, &cfg, &registry)),
            policy_requested,
            trajectory_ready,
            rollout_reported,
            shared,
        });
    }

    // Constructors: the learner's and the inference worker's networks start from the same seed,
    // so they start identical; the learner publishes every update afterwards.
    let model = |shared: &SharedState| {
        new_model(&cfg, &registry).map_err(|e| {
            fail(shared, &e);
            BuildError::Config {
                app: "rlfactory".into(),
                message: e.to_string(),
            }
        })
    };
    let learner_model = model(&shared)?;
    let appo =
        Appo::new(learner_model, &cfg.appo, cfg.run.train_for_env_steps).map_err(|e| BuildError::Config {
            app: "rlfactory".into(),
            message: e.to_string(),
        })?;
    let inference_model = model(&shared)?;
    let save_to = cfg.run.save_experiment.then(|| {
        cfg.run
            .train_dir
            .join(&cfg.run.experiment)
            .join("final.safetensors")
    });
    let s = Arc::clone(&shared);
    app.construct(inference, move || InferenceNode {
        worker: InferenceWorker::new(Box::new(inference_model)),
        actions_ready,
        shared: s,
    });
    let (batch_size, rollout) = (cfg.dataset_size(), cfg.sampling.rollout);
    let s = Arc::clone(&shared);
    app.construct(batcher, move || BatcherNode {
        batcher: Batcher::new(batch_size, rollout),
        batch_ready,
        shared: s,
    });
    let s = Arc::clone(&shared);
    app.construct(learner, move || LearnerNode {
        learner: Learner::new(appo),
        policy_updated,
        training_reported,
        save_to,
        shared: s,
    });
    let report_interval =
        (cfg.run.report_interval_sec > 0.0).then(|| Duration::from_secs_f64(cfg.run.report_interval_sec));
    let run = Runner::new(&cfg, process_start);
    app.construct(runner, move || RunnerNode {
        runner: run,
        report_interval,
        shared,
    });
    Ok(())
}

/// Trains as `cfg` says and returns the summary. `process_start` is when the process started
/// (the summary's `wall_seconds` counts from it).
pub fn train(cfg: &Config, process_start: Instant) -> Result<Summary> {
    tch::set_num_threads(cfg.run.num_threads);
    let registry = EnvRegistry::with_builtin();
    if cfg.run.save_experiment {
        let dir = cfg.run.train_dir.join(&cfg.run.experiment);
        std::fs::create_dir_all(&dir).map_err(|source| RlfError::Io {
            what: "creating the experiment folder",
            path: dir.clone(),
            source,
        })?;
        let path = dir.join("config.toml");
        std::fs::write(&path, cfg.to_toml()?).map_err(|source| RlfError::Io {
            what: "writing",
            path,
            source,
        })?;
    }
    let shared: SharedState = Arc::default();
    let parts = Parts {
        cfg: cfg.clone(),
        registry,
        process_start,
        shared: Arc::clone(&shared),
    };
    let outcome = App::new("rlfactory").run(move |app| build_graph(app, parts));
    let mut state = shared
        .lock()
        .map_err(|_| RlfError::EventLoop("a component panicked".into()))?;
    if let Some(error) = state.error.take() {
        return Err(RlfError::EventLoop(error));
    }
    let outcome = outcome.map_err(|e| RlfError::EventLoop(e.to_string()))?;
    if !outcome.success() {
        return Err(RlfError::EventLoop(outcome.to_string()));
    }
    state
        .summary
        .take()
        .ok_or_else(|| RlfError::EventLoop("the runner did not report a summary".into()))
}
