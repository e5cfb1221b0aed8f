//! [`RunStats`] on the main loop: stats, progress, TensorBoard scalars, the learning curve, the
//! checkpoint schedule and the stop.

use rlf_shm::{ReplayRing, ReplayRingHandle};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rlf_signal::{Component, Ctx, Signal};

use super::{or_fail, sent};
use crate::error::Result;
use crate::experiment::{CheckpointRequest, ExperimentRun};
use crate::learning::{PbtUpdate, TrainingReport};
use crate::pbt::{Decision, Pbt, PolicyState};
use crate::runner::stats::{RunStats, Scalars};
use crate::runner::summary::Summary;
use crate::sampling::{RolloutReport, SnapshotRequest, SnapshotTaken, WorkerStarted};
use crate::top::{LiveBoard, ReplayLive, LIVE_PERIOD};

/// Where the runner leaves the summary for the caller of `train`.
pub(in crate::runner) type SummarySlot = Arc<Mutex<Option<Summary>>>;

/// What the runner emits.
#[derive(Clone, Copy)]
pub(in crate::runner) struct RunnerSignals {
    pub checkpoint_requested: Signal<CheckpointRequest>,
    pub progress_reported: Signal<CheckpointRequest>,
    /// With `--self_play`.
    pub snapshot_requested: Option<Signal<SnapshotRequest>>,
    /// With `--with_pbt`.
    pub pbt_update: Option<Signal<PbtUpdate>>,
}

pub(in crate::runner) struct RunnerNode {
    runner: RunStats,
    /// The progress line's period (`None`: no line, `--report_interval_sec 0`).
    report_interval: Option<Duration>,
    save_every: Option<Duration>,
    experiment: Option<ExperimentRun>,
    signals: RunnerSignals,
    summary: SummarySlot,
    /// The final counts went to the learner and the app is stopping.
    stopping: bool,
    /// With `--with_pbt`: the population.
    pbt: Option<Pbt>,
    /// Off-policy: the replay buffers (their handles until the loop starts), closed when the run stops so that
    /// no writer or learner waits on them any longer.
    replay_handles: Vec<ReplayRingHandle>,
    replays: Vec<ReplayRing>,
    /// The experiment's name and folder, which `rlfactory top` shows.
    names: (String, PathBuf),
    /// The board `rlfactory top` reads (`None` until the loop starts, or if it could not be made).
    live: Option<LiveBoard>,
}

/// How often the runner checks the time limit, passes its counts to the learner and flushes the
/// event file when no progress line is printed.
const TICK: Duration = Duration::from_secs(1);

impl RunnerNode {
    pub fn new(
        runner: RunStats,
        report_interval: Option<Duration>,
        experiment: Option<ExperimentRun>,
        save_every: Duration,
        signals: RunnerSignals,
        summary: SummarySlot,
        pbt: Option<Pbt>,
    ) -> Self {
        let mut runner = runner;
        if let Some(pbt) = &pbt {
            let steps: Vec<u64> = pbt.states().iter().map(|s| s.agent_steps).collect();
            runner.resume_agent_steps(&steps);
        }
        Self {
            runner,
            report_interval,
            save_every: experiment.is_some().then_some(save_every),
            experiment,
            signals,
            summary,
            stopping: false,
            pbt,
            replay_handles: Vec::new(),
            replays: Vec::new(),
            names: (String::new(), PathBuf::new()),
            live: None,
        }
    }

    /// Shows the run to `rlfactory top` as the run of `experiment` in `train_dir`.
    pub fn with_live_view(self, experiment: &str, train_dir: PathBuf) -> Self {
        Self {
            names: (experiment.to_owned(), train_dir),
            ..self
        }
    }

    /// Every second: what `rlfactory top` shows of the run.
    fn publish_live(&mut self, ctx: &mut Ctx<'_, Self>) {
        let Some(live) = &mut self.live else {
            return;
        };
        let mut view = self.runner.live_view(&self.names.0, &self.names.1);
        view.loops = ctx.loops().unwrap_or_default();
        view.replays = self
            .replays
            .iter()
            .map(|r| {
                let (stalls, stalled) = r.stalls();
                ReplayLive {
                    rows: r.len(),
                    capacity: r.capacity(),
                    inserted: r.inserted(),
                    sampled: r.sampled(),
                    stalls,
                    stalled_seconds: stalled.as_secs_f64(),
                }
            })
            .collect();
        view.stopping |= self.stopping || ctx.stopping();
        if let Err(e) = live.publish(view) {
            eprintln!("[rlfactory] the live view for rlfactory top stops: {e}");
            self.live = None;
        }
    }

    /// Closes the replay buffers of `handles` when the run stops.
    pub fn with_replays(self, handles: Vec<ReplayRingHandle>) -> Self {
        Self {
            replay_handles: handles,
            ..self
        }
    }

    /// Closes the replay buffers: writers waiting for the learners and learners waiting for data stop waiting.
    fn close_replays(&self) {
        for replay in &self.replays {
            replay.close();
        }
    }

    /// Every policy's PBT state into its `policy_<i>_cfg.json`, with its agent steps so far.
    fn write_pbt_states(&mut self) -> Result<()> {
        let (Some(pbt), Some(exp)) = (&mut self.pbt, &self.experiment) else {
            return Ok(());
        };
        for p in 0..pbt.states().len() {
            pbt.set_agent_steps(p, self.runner.policy_agent_steps(p));
        }
        pbt.states().iter().try_for_each(|s| exp.write_policy_state(s))
    }

    /// Every policy's self-play record (Elo ratings, games) into its `self_play_<i>.json`, which a resumed run
    /// continues.
    fn write_self_play_records(&self) -> Result<()> {
        let Some(exp) = &self.experiment else {
            return Ok(());
        };
        self.runner
            .self_play_records()
            .iter()
            .try_for_each(|(p, record)| {
                exp.write_json(
                    &crate::experiment::self_play_file(*p),
                    record,
                    "the self-play record",
                )
            })
    }

    /// A resumed population: each policy whose state was saved continues with its saved hyper-parameters, which
    /// its learner takes from this update, sent before any decision's. The runner alone reads and writes
    /// `policy_<i>_cfg.json`: a learner that read the file at its start could find a decision of this run there.
    fn resume_pbt(&self, ctx: &mut Ctx<'_, Self>) -> Result<()> {
        let (Some(pbt), Some(signal)) = (&self.pbt, self.signals.pbt_update) else {
            return Ok(());
        };
        let resumed: Vec<PolicyState> = pbt.resumed().copied().collect();
        for state in resumed {
            self.log(&format!(
                "pbt: policy {} continues with its saved hyper-parameters (learning rate {:e}, {} updates)",
                state.policy, state.hyper.learning_rate, state.updates
            ))?;
            let update = PbtUpdate {
                policy: state.policy,
                replace_from: None,
                hyper: state.hyper,
            };
            sent(ctx.emit(&signal, &update))?;
        }
        Ok(())
    }

    /// The PBT updates due after a rollout report: each logged, written to its policy's
    /// TensorBoard folder and `policy_<i>_cfg.json`, and sent to the learners.
    fn pbt_step(&mut self, ctx: &mut Ctx<'_, Self>) -> Result<()> {
        let (Some(pbt), Some(signal)) = (&mut self.pbt, self.signals.pbt_update) else {
            return Ok(());
        };
        let n = pbt.states().len();
        let objectives: Vec<Option<f64>> = (0..n).map(|p| self.runner.policy_objective(p)).collect();
        let frames = self.runner.env_frames();
        let decisions: Vec<Decision> = (0..n)
            .filter_map(|p| pbt.on_progress(p, self.runner.policy_agent_steps(p), frames, &objectives))
            .collect();
        for p in 0..n {
            pbt.set_agent_steps(p, self.runner.policy_agent_steps(p));
        }
        let states = pbt.states().to_vec();
        for d in decisions {
            self.log(&pbt_line(&d))?;
            let mut values: Vec<(String, f64)> = d
                .after
                .named()
                .iter()
                .map(|(name, v)| (format!("pbt/{name}"), *v))
                .collect();
            values.push((
                "pbt/replaced_from".to_owned(),
                d.replace_from.map_or(-1.0, |p| p as f64),
            ));
            self.write(&[Scalars {
                policy: d.policy,
                env_frames: frames,
                values,
            }])?;
            if let Some(exp) = &self.experiment {
                exp.write_policy_state(&states[d.policy])?;
            }
            if d.replace_from.is_some() {
                self.runner.forget_recent_episodes(d.policy);
            }
            let update = PbtUpdate {
                policy: d.policy,
                replace_from: d.replace_from,
                hyper: d.after,
            };
            sent(ctx.emit(&signal, &update))?;
        }
        Ok(())
    }

    pub fn on_rollout_reported(&mut self, ctx: &mut Ctx<'_, Self>, report: &RolloutReport) {
        // Rollouts that arrive while the app stops are neither trained on nor counted, so that the summary and
        // the learner's last checkpoint hold the same counts.
        if self.stopping {
            return;
        }
        let stop = self.runner.on_rollout_reported(report);
        let mut done = self.write_due_scalars(false);
        // A decision at the report that ends the run is left to the run that resumes it: a weight copy would reach
        // learners that are already stopping, and the saved state would say it happened.
        if stop.is_none() {
            done = done.and_then(|()| self.pbt_step(ctx));
        }
        if let (Some(request), Some(signal)) = (self.runner.due_snapshot(), self.signals.snapshot_requested) {
            done = done.and_then(|()| sent(ctx.emit(&signal, &request)));
        }
        or_fail(ctx, done);
        if stop.is_some() {
            self.stop(ctx);
        }
    }

    pub fn on_training_reported(&mut self, ctx: &mut Ctx<'_, Self>, report: &TrainingReport) {
        self.runner.on_training_reported(report);
        let written = self.write_due_scalars(false);
        or_fail(ctx, written);
    }

    /// A learner put a snapshot into its pool: logged, and rated from now on.
    pub fn on_snapshot_taken(&mut self, ctx: &mut Ctx<'_, Self>, taken: &SnapshotTaken) {
        self.runner.on_snapshot_taken(taken);
        let logged = self.log(&format!(
            "self-play: snapshot {} of policy {} (version {}) in slot {} of its pool",
            taken.number, taken.policy, taken.version, taken.slot
        ));
        or_fail(ctx, logged);
    }

    /// Logs the replacement of a rollout worker's process and what its predecessor lost.
    pub fn on_worker_started(&mut self, ctx: &mut Ctx<'_, Self>, started: &WorkerStarted) {
        if started.incarnation == 0 {
            return;
        }
        let line = format!(
            "rollout_worker_{} replaced by a new process (incarnation {}); discarded {} env frames of the old one's unfinished trajectories",
            started.worker, started.incarnation, started.lost_frames
        );
        let logged = self.log(&line);
        or_fail(ctx, logged);
    }

    fn log(&self, line: &str) -> Result<()> {
        match &self.experiment {
            Some(exp) => exp.log(line),
            None => {
                crate::experiment::console(line);
                Ok(())
            }
        }
    }

    fn write(&mut self, scalars: &[Scalars]) -> Result<()> {
        match &mut self.experiment {
            Some(exp) => scalars
                .iter()
                .try_for_each(|s| exp.write_scalars(s.policy, s.env_frames, &s.values)),
            None => Ok(()),
        }
    }

    fn write_due_scalars(&mut self, force: bool) -> Result<()> {
        let due = self.runner.due_scalars(force);
        self.write(&due)
    }

    /// Stops the app after telling the learner the final counts (for its last checkpoint), once.
    fn stop(&mut self, ctx: &mut Ctx<'_, Self>) {
        if std::mem::replace(&mut self.stopping, true) {
            return;
        }
        let told = sent(ctx.emit(&self.signals.progress_reported, &self.runner.checkpoint_request()));
        or_fail(ctx, told);
        self.close_replays();
        ctx.stop_app();
    }

    /// Every `--report_interval_sec` (every second without a progress line): the line, the
    /// event file flushed, the time limit checked, the counts passed to the learner.
    fn tick(&mut self, ctx: &mut Ctx<'_, Self>) {
        let report = self.runner.report();
        let mut done = self.write(std::slice::from_ref(&report.scalars));
        if self.report_interval.is_some() {
            done = done.and_then(|()| self.log(&report.line));
        }
        if let Some(exp) = &mut self.experiment {
            done = done.and_then(|()| exp.flush());
        }
        or_fail(ctx, done);
        if self.runner.check_stop().is_some() {
            self.stop(ctx);
        } else {
            let told = sent(ctx.emit(&self.signals.progress_reported, &self.runner.checkpoint_request()));
            or_fail(ctx, told);
        }
    }

    /// Every `--save_every_sec`: asks the learner for a checkpoint and redraws the learning curve.
    fn request_checkpoint(&mut self, ctx: &mut Ctx<'_, Self>) {
        let request = self.runner.checkpoint_request();
        let done = self
            .write_pbt_states()
            .and_then(|()| self.write_self_play_records())
            .and_then(|()| sent(ctx.emit(&self.signals.checkpoint_requested, &request)))
            .and_then(|()| match &self.experiment {
                Some(exp) => exp.plot(),
                None => Ok(()),
            });
        or_fail(ctx, done);
    }

    /// The last scalars, the event file flushed, the curve drawn, the end logged.
    fn finish(&mut self, summary: &Summary) -> Result<()> {
        self.write_due_scalars(true)?;
        self.write_pbt_states()?;
        self.write_self_play_records()?;
        let Some(exp) = &mut self.experiment else {
            return Ok(());
        };
        exp.flush()?;
        exp.plot()?;
        exp.close()?;
        let ret = summary
            .mean_return
            .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}"));
        exp.log(&format!(
            "stopped after {} env frames, mean return {ret}, policy version {}",
            summary.env_frames, summary.policy_version
        ))
    }
}

/// The log line of a PBT update.
fn pbt_line(d: &Decision) -> String {
    let p = d.policy;
    let mut line = format!("pbt: policy {p} (objective {:.2})", d.objectives[p]);
    let taken = if p == 0 {
        "the weights"
    } else {
        "the weights and hyper-parameters"
    };
    match d.replace_from {
        Some(from) => line.push_str(&format!(
            " takes {taken} of policy {from} (objective {:.2})",
            d.objectives[from]
        )),
        None => line.push_str(" keeps its weights"),
    }
    let changed: Vec<String> = d
        .before
        .named()
        .iter()
        .zip(d.after.named())
        .filter(|((_, a), (_, b))| a != b)
        .map(|((name, a), (_, b))| format!("{name} {a:.4e} -> {b:.4e}"))
        .collect();
    if p == 0 {
        line.push_str("; policy 0 keeps its hyper-parameters (the population's reference)");
    } else if changed.is_empty() {
        line.push_str("; hyper-parameters unchanged");
    } else {
        line.push_str(&format!("; mutated: {}", changed.join(", ")));
    }
    line
}

impl Component for RunnerNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        let written = self.write_pbt_states().and_then(|()| self.resume_pbt(ctx));
        or_fail(ctx, written);
        match self
            .replay_handles
            .iter()
            .map(ReplayRing::open)
            .collect::<std::result::Result<Vec<_>, _>>()
        {
            Ok(replays) => self.replays = replays,
            Err(e) => ctx.fail(e),
        }
        ctx.timer_periodic(self.report_interval.unwrap_or(TICK), RunnerNode::tick);
        // A run shows itself to `rlfactory top`; one that cannot (no room in /dev/shm) trains all the same.
        match LiveBoard::create(&self.names.0) {
            Ok(live) => self.live = Some(live),
            Err(e) => eprintln!("[rlfactory] no live view for rlfactory top: {e}"),
        }
        self.publish_live(ctx);
        ctx.timer_periodic(LIVE_PERIOD, RunnerNode::publish_live);
        if let Some(period) = self.save_every {
            ctx.timer_periodic(period, RunnerNode::request_checkpoint);
        }
    }

    /// The run begins to stop (SIGINT, SIGTERM, a fault, the end): the replay buffers close at once, which ends the
    /// off-policy learners' waits for data and the rollout workers' waits for the learners, in every process.
    fn on_stopping(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.close_replays();
        self.publish_live(ctx);
    }

    /// The counts the stop conditions read (env frames) and the checkpoints carry: a run restored from them stops
    /// where the uninterrupted run would have.
    fn save(&mut self) -> std::result::Result<Option<Vec<u8>>, String> {
        postcard::to_stdvec(&self.runner.counts())
            .map(Some)
            .map_err(|e| e.to_string())
    }

    fn restore(&mut self, state: &[u8]) -> std::result::Result<(), String> {
        let (frames, episodes, versions): (u64, u64, Vec<u64>) =
            postcard::from_bytes(state).map_err(|e| e.to_string())?;
        self.runner.resume_from(frames, episodes, &versions);
        Ok(())
    }

    fn on_stop(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.close_replays();
        let summary = self.runner.summary();
        let finished = self.finish(&summary);
        or_fail(ctx, finished);
        if let Ok(mut slot) = self.summary.lock() {
            *slot = Some(summary);
        }
    }
}
