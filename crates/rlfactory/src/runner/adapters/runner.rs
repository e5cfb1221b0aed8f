//! [`Runner`] on the main loop: stats, progress, TensorBoard scalars, the learning curve, the
//! checkpoint schedule and the stop.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rlf_signal::{Component, Ctx, Signal};

use super::{or_fail, sent};
use crate::error::Result;
use crate::experiment::{CheckpointRequest, ExperimentRun};
use crate::learning::TrainingReport;
use crate::runner::stats::{Runner, Scalars};
use crate::runner::summary::Summary;
use crate::sampling::{RolloutReport, SnapshotRequest, SnapshotTaken, WorkerStarted};

/// Where the runner leaves the summary for the caller of `train`.
pub(in crate::runner) type SummarySlot = Arc<Mutex<Option<Summary>>>;

/// What the runner emits.
#[derive(Clone, Copy)]
pub(in crate::runner) struct RunnerSignals {
    pub checkpoint_requested: Signal<CheckpointRequest>,
    pub progress_reported: Signal<CheckpointRequest>,
    /// With `--self_play`.
    pub snapshot_requested: Option<Signal<SnapshotRequest>>,
}

pub(in crate::runner) struct RunnerNode {
    runner: Runner,
    /// The progress line's period (`None`: no line, `--report_interval_sec 0`).
    report_interval: Option<Duration>,
    save_every: Option<Duration>,
    experiment: Option<ExperimentRun>,
    signals: RunnerSignals,
    summary: SummarySlot,
    /// The final counts went to the learner and the app is stopping.
    stopping: bool,
}

/// How often the runner checks the time limit, passes its counts to the learner and flushes the
/// event file when no progress line is printed.
const TICK: Duration = Duration::from_secs(1);

impl RunnerNode {
    pub fn new(
        runner: Runner,
        report_interval: Option<Duration>,
        experiment: Option<ExperimentRun>,
        save_every: Duration,
        signals: RunnerSignals,
        summary: SummarySlot,
    ) -> Self {
        Self {
            runner,
            report_interval,
            save_every: experiment.is_some().then_some(save_every),
            experiment,
            signals,
            summary,
            stopping: false,
        }
    }

    pub fn on_rollout_reported(&mut self, ctx: &mut Ctx<'_, Self>, report: &RolloutReport) {
        // Rollouts that arrive while the app stops are neither trained on nor counted, so that the summary and
        // the learner's last checkpoint hold the same counts.
        if self.stopping {
            return;
        }
        let stop = self.runner.on_rollout_reported(report);
        let mut done = self.write_due_scalars(false);
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
                eprintln!("[rlfactory] {line}");
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
        let done = sent(ctx.emit(&self.signals.checkpoint_requested, &request)).and_then(|()| {
            match &self.experiment {
                Some(exp) => exp.plot(),
                None => Ok(()),
            }
        });
        or_fail(ctx, done);
    }

    /// The last scalars, the event file flushed, the curve drawn, the end logged.
    fn finish(&mut self, summary: &Summary) -> Result<()> {
        self.write_due_scalars(true)?;
        let Some(exp) = &mut self.experiment else {
            return Ok(());
        };
        exp.flush()?;
        exp.plot()?;
        let ret = summary
            .mean_return
            .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}"));
        exp.log(&format!(
            "stopped after {} env frames, mean return {ret}, policy version {}",
            summary.env_frames, summary.policy_version
        ))
    }
}

impl Component for RunnerNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        ctx.timer_periodic(self.report_interval.unwrap_or(TICK), RunnerNode::tick);
        if let Some(period) = self.save_every {
            ctx.timer_periodic(period, RunnerNode::request_checkpoint);
        }
    }

    fn on_stop(&mut self, ctx: &mut Ctx<'_, Self>) {
        let summary = self.runner.summary();
        let finished = self.finish(&summary);
        or_fail(ctx, finished);
        if let Ok(mut slot) = self.summary.lock() {
            *slot = Some(summary);
        }
    }
}
