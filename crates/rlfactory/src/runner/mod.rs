//! The runner: creates the shared-memory data plane, builds and wires every component
//! (`graph::build_graph`, one function), runs them, and turns the outcome into a [`Summary`] or
//! an error naming the component that failed.
//!
//! | module | job |
//! |---|---|
//! | `graph` | every loop, object, signal and connection, in one place |
//! | `adapters` | each component on its loop: signals in, calls, emits out |
//! | `stats` | [`RunStats`]: frames, episodes, metrics, scalars due, progress line, stop rules |
//! | `summary` | [`Summary`] and [`StopReason`] |
//! | `plane` | the shared-memory regions (weights, trajectory pools, counters) and their handles |
//! | `counters` | where each trajectory count lives in shared memory |
//! | `recovery` | the checkpoint of a lost learner's last published weights |
//! | `mpi` | one rank of an MPI job: its part of the graph and the link's sending and receiving threads |

mod adapters;
mod counters;
mod graph;
mod mpi;
mod plane;
mod recovery;
mod stats;
mod summary;

use std::sync::Arc;
use std::time::Instant;

use rlf_signal::{App, AppBuilder, BuildError, Fault, Outcome};

use self::counters::CounterLayout;
use self::graph::{build_graph, Parts};
use self::mpi::{LearnerSync, LinkEnds};
use self::plane::{create_plane, plan_plane, GraphSpec, RankPart};
use crate::config::Config;
use crate::env::group::EnvGroup;
use crate::env::EnvRegistry;
use crate::error::{Result, RlfError};
use crate::experiment::ExperimentRun;
use crate::plan::RunPlan;

pub use self::mpi::{train_mpi, train_rank};
pub use self::stats::{warm_up, Report, RunStats, Scalars};
pub use self::summary::{
    PolicySummary, ReplaySummary, SelfPlaySummary, SnapshotSummary, StopReason, Summary,
};

/// The build function of a child process, for the built-in envs (see [`child_build_with`]).
pub fn child_build(app: &mut AppBuilder) -> Result<(), BuildError> {
    child_build_with(app, EnvRegistry::with_builtin())
}

/// The build function of a child process whose envs come from `registry` (`rlf_signal::child_entry` with it comes
/// first in the binary's `main`, as [`crate::cli::main`] does): the same graph as the parent's, from the graph's spec
/// (the run plan and the data plane) in the app's configuration.
pub fn child_build_with(app: &mut AppBuilder, registry: EnvRegistry) -> Result<(), BuildError> {
    let spec: GraphSpec = app.config()?;
    tch::set_num_threads(spec.plan.config.run.num_threads);
    let parts = Parts {
        plan: spec.plan,
        registry,
        process_start: Instant::now(),
        plane: spec.plane,
        summary: Arc::default(),
        experiment: None,
        resumed: None,
        part: spec.part,
        link_ends: None,
        learner_sync: None,
        env_group: None,
        keep: false,
        restore: None,
    };
    build_graph(app, parts)
}

/// The policies whose learner's loop is among the faults' (its process died, hung or did not
/// stop).
fn lost_learners(outcome: &Outcome, num_policies: usize) -> Vec<usize> {
    (0..num_policies)
        .filter(|&p| {
            let name = graph::learner_name(p, num_policies);
            outcome.faults.iter().any(|f| {
                matches!(f, Fault::LoopDied { loop_name, .. } | Fault::Hung { loop_name, .. }
                    | Fault::StopTimeout { loop_name } if *loop_name == name)
            })
        })
        .collect()
}

/// Trains as `cfg` says and returns the summary. `process_start` is when the process started
/// (the summary's `wall_seconds` counts from it). A component's error, a dead or hung process
/// (other than a replaced rollout worker) stops the run after the learner's last checkpoint and
/// is returned as one line naming the loop and the object.
pub fn train(cfg: &Config, process_start: Instant) -> Result<Summary> {
    train_with(cfg, &EnvRegistry::with_builtin(), process_start)
}

/// The faults of a run (`<subject>: <what>` each) on one line, with what several subjects have in common said once:
/// a hundred workers that could not start are one clause, not a hundred.
fn faults_line(faults: &[String]) -> String {
    let mut groups: Vec<(Vec<&str>, &str)> = Vec::new();
    for fault in faults {
        let (subject, what) = fault.split_once(": ").unwrap_or((fault, ""));
        match groups.iter_mut().find(|(_, w)| !w.is_empty() && *w == what) {
            Some((subjects, _)) => subjects.push(subject),
            None => groups.push((vec![subject], what)),
        }
    }
    groups
        .iter()
        .map(|(subjects, what)| {
            let who = match subjects.len() {
                0..=3 => subjects.join(", "),
                n => format!("{}, {} and {} more", subjects[0], subjects[1], n - 2),
            };
            match what.is_empty() {
                true => who,
                false => format!("{who}: {what}"),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The one line of a run that stopped because a file did not fit its disk (no space left, or a quota), `None` for
/// other faults: what did not fit, and the checkpoint each policy resumes from (the saves that failed kept it).
fn disk_full_line(cfg: &Config, faults: &[String]) -> Option<String> {
    let full = [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT]
        .map(|e| std::io::Error::from_raw_os_error(e.raw_os_error()).to_string());
    let is = |f: &&String, end: bool| {
        full.iter().any(|m| {
            if end {
                f.ends_with(m.as_str())
            } else {
                f.contains(m.as_str())
            }
        })
    };
    // A write's own error ("loop <name>: object <name>: <path>: <reason>") rather than one a library wrapped.
    let fault = faults
        .iter()
        .find(|f| is(f, true))
        .or_else(|| faults.iter().find(|f| is(f, false)))?;
    let what = fault.rsplitn(3, ": ").take(2).collect::<Vec<_>>();
    let what = match what.as_slice() {
        [reason, path] => format!("{}: {reason}", path.replace("/.tmp.", "/")),
        _ => fault.clone(),
    };
    let experiment = cfg.run.train_dir.join(&cfg.run.experiment);
    let kept: Vec<String> = (0..cfg.sampling.num_policies)
        .map(|policy| {
            let dir = crate::experiment::checkpoint_dir(&experiment, policy);
            match rlf_experiment::CheckpointStore::open_read_only(&dir).and_then(|s| s.load_latest()) {
                Ok(Some(newest)) => format!(
                    "{} ({} frames)",
                    newest.path.display(),
                    newest.checkpoint.meta.env_steps
                ),
                _ => format!("no checkpoint in {}", dir.display()),
            }
        })
        .collect();
    Some(format!(
        "the disk is full ({what}): the run stopped; it resumes from {} when space is freed and the same command \
         runs again",
        kept.join(", ")
    ))
}

/// Refuses a run of `cfg` on one machine whose trajectory slots and replay buffers would not fit the shared memory
/// (`/dev/shm`) left free, or whose replay buffers' saves would not fit the experiment's disk: before the run
/// prints or writes anything.
pub fn check_resources(plan: &RunPlan) -> Result<()> {
    let cfg = &plan.config;
    plan_plane(plan, RankPart::Whole)?.check_fits(cfg)?;
    plane::check_replay_disk(plan).map(|_| ())
}

/// As [`train`], with the envs of `registry` (the binary's children must build their graph with
/// the same registry: see [`child_build_with`]).
pub fn train_with(cfg: &Config, registry: &EnvRegistry, process_start: Instant) -> Result<Summary> {
    train_planned(&RunPlan::resolve(cfg, registry)?, registry, process_start)
}

/// As [`train_with`], for a run already planned.
pub fn train_planned(plan: &RunPlan, registry: &EnvRegistry, process_start: Instant) -> Result<Summary> {
    run_part(plan, registry, process_start, RankPart::Whole, None, None, None)?
        .ok_or_else(|| RlfError::EventLoop("the runner did not report a summary".into()))
}

/// Whether a stop of this run keeps every component's state for an exact resume, or why not: a serial run on
/// single-agent envs that can save their state, without self-play or PBT.
fn keeps_exact_state(plan: &RunPlan, part: RankPart) -> std::result::Result<(), String> {
    let cfg = &plan.config;
    let why = if !cfg.run.serial_mode || part != RankPart::Whole {
        "not serial mode"
    } else if cfg.sampling.self_play || cfg.pbt.with_pbt {
        "self-play and PBT keep no exact state"
    } else if plan.learns_from_replay && !cfg.off_policy.save_replay_buffer {
        "the replay buffer is not saved (--save_replay_buffer false)"
    } else {
        return plan.env.cannot_save_state.clone().map_or(Ok(()), Err);
    };
    Err(why.into())
}

/// Runs `part` of the graph in this process (with `link_ends`, the MPI link's threads, on a rank, and
/// `learner_sync` on one of several learner ranks): the summary of
/// the part that learns, `None` for an actor rank's.
fn run_part(
    planned: &RunPlan,
    registry: &EnvRegistry,
    process_start: Instant,
    part: RankPart,
    link_ends: Option<LinkEnds>,
    learner_sync: Option<LearnerSync>,
    env_group: Option<EnvGroup>,
) -> Result<Option<Summary>> {
    let cfg = &planned.config;
    tch::set_num_threads(cfg.run.num_threads);
    // One run per experiment: the lock is this process's until the function returns (after the last saves).
    let lock = (cfg.run.save_experiment && part.learns())
        .then(|| rlf_experiment::ExperimentLock::acquire(&cfg.run.train_dir, &cfg.run.experiment))
        .transpose()?;
    if lock.is_some() && cfg.checkpoint.restart_behavior == crate::config::RestartBehaviorArg::Resume {
        plane::check_resumable(planned)?;
    }
    let plan = plan_plane(planned, part)?;
    plan.check_fits(cfg)?;
    let replay_save_bytes = match lock {
        Some(_) => plane::check_replay_disk(planned)?,
        None => 0,
    };
    let (experiment, resumed) = if cfg.run.save_experiment && part.learns() {
        let experiment = ExperimentRun::prepare(cfg)?;
        (Some(experiment), crate::experiment::resume_counts(cfg)?)
    } else {
        (None, None)
    };
    let exact = experiment.as_ref().map(|_| keeps_exact_state(planned, part));
    let (kept, kept_line) = match experiment {
        Some(_) => crate::experiment::read_kept_state(cfg, resumed.as_ref())?,
        None => (None, None),
    };
    let mut regions = create_plane(cfg, plan)?;
    // The shared memory's sizes: in the log file, and on the terminal with --verbose.
    for line in regions.memory_lines() {
        match &experiment {
            Some(e) if !cfg.run.verbose => e.note(&line)?,
            Some(e) => e.log(&line)?,
            None if cfg.run.verbose => crate::experiment::console(&line),
            None => {}
        }
    }
    let mut lines = Vec::new();
    match &exact {
        Some(Ok(())) => lines.push(format!(
            "a stop keeps every component's state in {} for an exact resume (serial mode)",
            crate::experiment::KEPT_STATE_FILE
        )),
        Some(Err(why)) if cfg.run.serial_mode => lines.push(format!(
            "a stop keeps no exact state ({why}): a resumed run continues its counters, schedules and buffers, and \
             its envs start new episodes"
        )),
        _ => {}
    }
    let keep = matches!(exact, Some(Ok(())));
    let restore = kept.filter(|_| keep);
    lines.extend(kept_line.filter(|_| keep));
    if experiment.is_some() {
        if replay_save_bytes > 0 {
            lines.push(format!(
                "the replay buffers are saved after each checkpoint: up to {:.1} MiB on disk (--save_replay_buffer false \
                 to skip)",
                replay_save_bytes as f64 / (1024.0 * 1024.0)
            ));
        }
        // A fresh or restarted experiment has no saved buffer (the restart moved it aside).
        lines.extend(regions.restore_replays(cfg)?);
    }
    for line in lines {
        match &experiment {
            Some(e) => e.log(&line)?,
            None => crate::experiment::console(&line),
        }
    }
    // Every process gets the plan: the config, and the env's description from the one env built to learn it.
    let spec = GraphSpec {
        plan: planned.clone(),
        plane: regions.plane.clone(),
        part,
    };
    let saves_experiment = experiment.is_some();
    let summary_slot = Arc::default();
    let parts = Parts {
        plan: planned.clone(),
        registry: registry.clone(),
        process_start,
        plane: regions.plane.clone(),
        summary: Arc::clone(&summary_slot),
        experiment,
        resumed,
        part,
        link_ends,
        learner_sync,
        env_group,
        keep,
        restore,
    };
    let app = App::new("rlfactory")
        .with_config(&spec)
        .map_err(|e| RlfError::EventLoop(e.to_string()))?;
    let mut outcome = app
        .run(move |app| build_graph(app, parts))
        .map_err(|e| RlfError::EventLoop(e.to_string()))?;
    // The run has run: the kept state it may have started from is behind its checkpoints now. After a fault it
    // stays for the next start, which checks it against the checkpoints.
    if saves_experiment && outcome.faults.is_empty() {
        crate::experiment::remove_kept_state(cfg)?;
    }
    let summary = summary_slot.lock().ok().and_then(|mut s| s.take());
    if !outcome.faults.is_empty() {
        let faults: Vec<String> = outcome.faults.iter().map(ToString::to_string).collect();
        if let Some(line) = disk_full_line(cfg, &faults) {
            return Err(RlfError::Component(line));
        }
        let mut message = faults_line(&faults);
        if let (true, Some(summary)) = (cfg.run.save_experiment, &summary) {
            let num_policies = cfg.sampling.num_policies;
            for policy in lost_learners(&outcome, num_policies) {
                let name = graph::learner_name(policy, num_policies);
                match recovery::save_published(planned, &regions.weights[policy], summary, policy) {
                    Ok(()) => message.push_str(&format!(
                        "; saved a checkpoint of the weights the {name} last published"
                    )),
                    Err(e) => message.push_str(&format!("; no checkpoint of the lost {name}: {e}")),
                }
            }
        }
        return Err(RlfError::Component(message));
    }
    if let (true, Some(kept)) = (keep, outcome.kept.take()) {
        crate::experiment::write_kept_state(cfg, kept)?;
    }
    if !part.learns() {
        return Ok(None);
    }
    let mut summary =
        summary.ok_or_else(|| RlfError::EventLoop("the runner did not report a summary".into()))?;
    CounterLayout {
        workers: part.pools(cfg),
    }
    .summarise(&regions.counters, &mut summary);
    if planned.learns_from_replay {
        // The batcher takes no part: the rollout workers' trajectories all went to the replay buffers.
        summary.trajectories_in_flight = 0;
        summary.replay = regions.replay_summaries(cfg.off_policy.learning_starts);
    }
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
    Ok(Some(summary))
}

#[cfg(test)]
mod tests {
    use super::faults_line;

    /// What a hundred loops share is said once, with two of them named; what one loop says stays its own.
    #[test]
    fn faults_that_say_the_same_are_one_clause() {
        let mut faults: Vec<String> = (0..100)
            .map(|i| {
                format!("loop rollout_worker_{i}: could not start: fork: Resource temporarily unavailable")
            })
            .collect();
        faults.push("loop learner: did not stop in time".into());
        faults
            .push("loop inference_worker_0: could not start: fork: Resource temporarily unavailable".into());
        assert_eq!(
            faults_line(&faults),
            "loop rollout_worker_0, loop rollout_worker_1 and 99 more: could not start: fork: Resource temporarily \
             unavailable; loop learner: did not stop in time"
        );
        assert_eq!(
            faults_line(&faults[..2]),
            "loop rollout_worker_0, loop rollout_worker_1: could not start: fork: Resource temporarily unavailable"
        );
    }
}
