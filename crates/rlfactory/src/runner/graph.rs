//! The whole component graph and all its connections, in one place ([`build_graph`]).

use std::time::{Duration, Instant};

use rlf_shm::ShmArray;
use rlf_signal::{AppBuilder, BuildError};

use super::adapters::{
    BatcherNode, BatcherSignals, InferenceNode, LearnerNode, LearnerSignals, NextTurn, RolloutNode,
    RolloutSignals, RunnerNode, RunnerSignals, SummarySlot, TrainTick,
};
use super::counters::CounterLayout;
use super::mpi::{
    ActorLink, ActorLinkSignals, ActorStopped, LearnerLink, LearnerLinkSignals, LearnerSync, LinkEnds,
    LinkFailed, StopRequested,
};
use super::plane::{DataPlane, RankPart};
use super::stats::RunStats;
use super::summary::SavedSelfPlay;
use crate::config::Config;
use crate::env::group::EnvGroup;
use crate::env::EnvRegistry;
use crate::experiment::{CheckpointRequest, ExperimentRun};
use crate::learning::{Batch, Batcher, PbtUpdate, PbtWeightsSaved, PolicyUpdated, TrainingReport};
use crate::pbt::Pbt;
use crate::plan::RunPlan;
use crate::sampling::{
    ActionsReady, BufferReleased, PolicyRequest, RolloutReport, SlotsReclaimed, SnapshotRequest,
    SnapshotTaken, TrajectoryReady, WorkerStarted,
};

/// The loop (and object) name of policy `policy`'s learner: `learner` when it is the only one,
/// `learner_<i>` otherwise.
pub(super) fn learner_name(policy: usize, num_policies: usize) -> String {
    if num_policies == 1 {
        "learner".to_owned()
    } else {
        format!("learner_{policy}")
    }
}

/// With `--with_pbt`, the population, continuing the states saved in the experiment folder.
fn pbt_population(cfg: &Config, experiment: Option<&ExperimentRun>) -> Result<Option<Pbt>, BuildError> {
    let (true, Some(exp)) = (cfg.pbt.with_pbt, experiment) else {
        return Ok(None);
    };
    let saved = (0..cfg.sampling.num_policies)
        .map(|p| crate::experiment::read_policy_state(exp.dir(), p))
        .collect::<crate::Result<Vec<_>>>()
        .map_err(|e| BuildError::User(e.to_string()))?;
    Ok(Some(Pbt::new(
        &cfg.pbt,
        crate::pbt::Hyper::of(cfg),
        cfg.sampling.num_policies,
        &saved,
        cfg.env.seed,
    )))
}

/// Continues each policy's self-play record (Elo ratings and games) from its `self_play_<i>.json`, if the resumed
/// run saved one, and logs it. A record that cannot be read is logged and the ratings start afresh: they are
/// statistics, not what the run trains.
fn resume_self_play(
    stats: &mut RunStats,
    exp: &ExperimentRun,
    num_policies: usize,
) -> Result<(), BuildError> {
    let user = |e: crate::RlfError| BuildError::User(e.to_string());
    for p in 0..num_policies {
        let name = crate::experiment::self_play_file(p);
        let line = match crate::experiment::read_json::<SavedSelfPlay>(exp.dir(), &name, "a self-play record")
        {
            Ok(None) => continue,
            Err(e) => format!("self-play: policy {p}'s Elo ratings start again at 1200: {e}"),
            Ok(Some(saved)) => {
                let (frames, r) = (saved.env_frames, &saved.record);
                let latest = format!("latest weights {:.0} after {} games", r.elo, r.games);
                let snapshots = r.pool.len();
                let latest = if stats.resume_self_play(p, saved) {
                    latest
                } else {
                    format!(
                        "the latest weights start again at 1200: the record is of frame {frames}, not the resumed checkpoint's"
                    )
                };
                format!("self-play: policy {p} continues its Elo ratings from {name} ({latest}; {snapshots} snapshots rated)")
            }
        };
        exp.log(&line).map_err(user)?;
    }
    Ok(())
}

/// Everything the components are built from.
pub(super) struct Parts {
    /// The run plan: the config, the env's description, the agent maps.
    pub plan: RunPlan,
    pub registry: EnvRegistry,
    pub process_start: Instant,
    pub plane: DataPlane,
    /// Where the runner leaves the summary (main process).
    pub summary: SummarySlot,
    /// The experiment folder (main process, `--save_experiment`).
    pub experiment: Option<ExperimentRun>,
    /// `(env frames, episodes, policy version)` of the checkpoint the run resumes from.
    pub resumed: Option<crate::experiment::ResumePoint>,
    /// Which part of the graph this process's rank runs.
    pub part: RankPart,
    /// The MPI link's threads (main process of an MPI rank).
    pub link_ends: Option<LinkEnds>,
    /// What the learner averages its gradients with (main process of one of several learner ranks).
    pub learner_sync: Option<LearnerSync>,
    /// The env group the rollout workers step their envs over (main process of a group's lead rank).
    pub env_group: Option<EnvGroup>,
    /// Serial mode: keep every component's state at the stop, for an exact resume.
    pub keep: bool,
    /// Serial mode: the state a stopped run kept, to continue from.
    pub restore: Option<rlf_signal::KeptState>,
}

/// The component graph:
///
/// ```text
/// RolloutWorker ──policy_requested──▶ InferenceWorker ──actions_ready──▶ RolloutWorker
/// RolloutWorker ──trajectory_ready──▶ Batcher ──batch_ready──▶ Learner
/// Batcher ──buffer_released, slots_reclaimed──▶ RolloutWorker ──worker_started──▶ Batcher, Runner
/// Learner ──policy_updated──▶ InferenceWorker, RolloutWorker (sync mode resumes)
/// Learner ──training_reported──▶ Batcher (frees slots), Runner
/// RolloutWorker ──rollout_reported──▶ Runner ──checkpoint_requested, progress_reported──▶ Learner
/// Runner ──snapshot_requested──▶ Learner ──snapshot_taken──▶ RolloutWorker, Runner (self-play)
/// ```
///
/// With several policies each has its own learner (`learner_<i>`) and its own `batch_ready`;
/// every learner's `policy_updated` and `training_reported` go where the single learner's do.
///
/// Serial mode puts every loop on the main loop; otherwise each rollout worker, each inference
/// worker and each learner (the batcher with the first, or on the main loop off-policy) get a process of their own,
/// and the runner stays on the main loop. Each constructor runs only in the process of its object's loop.
pub(super) fn build_graph(app: &mut AppBuilder, parts: Parts) -> Result<(), BuildError> {
    let Parts {
        plan,
        registry,
        process_start,
        plane,
        summary,
        experiment,
        resumed,
        part,
        link_ends,
        learner_sync,
        env_group,
        keep,
        restore,
    } = parts;
    let mut link_ends = link_ends;
    let (cfg, env) = (&plan.config, &plan.env);
    let s = &cfg.sampling;
    app.set_serial(cfg.run.serial_mode).keep_state(keep);
    if let Some(kept) = restore {
        app.restore_state(kept);
    }
    // Worker processes start as forks of this one, without libtorch's start-up again, unless an
    // embedded Python interpreter (Gymnasium's and PettingZoo's envs) or MPI (an MPI rank must
    // not fork after starting it) would have to survive the fork.
    app.set_fork(!rlf_env::runs_python(&cfg.env.env) && part == RankPart::Whole);
    app.set_heartbeat(Duration::from_secs_f64(cfg.run.heartbeat_interval));
    // A loop busy in one long slot (a learner training a dataset of pixels) is not hung until it has been silent
    // for a heartbeat interval: a graceful stop waits as long for it.
    app.set_stop_timeout(Duration::from_secs_f64(cfg.run.heartbeat_interval.max(5.0)));
    let main = app.main_loop();
    app.set_queue_bytes(main, 256 << 20);
    let (samples, learns) = (part.samples(), part.learns());
    let num_workers = part.pools(cfg);

    // Loops and objects. An MPI rank has only its half of them, and a link in place of the other.
    // An env group's lead steps its envs over MPI, which only the rank's main process may use: its rollout workers
    // run on threads.
    let in_group = part.ranks().per_env > 1;
    let workers: Vec<_> = (0..if samples { num_workers } else { 0 })
        .map(|i| {
            let name = format!("rollout_worker_{i}");
            let l = if in_group {
                app.thread_loop(&name)
            } else {
                let l = app.process_loop(&name);
                app.restart_on_failure(l, cfg.run.max_worker_restarts);
                l
            };
            app.object::<RolloutNode>(l, &name)
        })
        .collect();
    // Inference workers by group (one group per policy, or one for all): `inference_worker_<j>` with a single
    // group, `inference_worker_p<g>_<j>` with several.
    let groups = cfg.inference_groups();
    let inference: Vec<_> = (0..if samples { groups } else { 0 })
        .flat_map(|g| (0..cfg.workers_per_inference_group()).map(move |j| (g, j)))
        .map(|(g, j)| {
            let name = if groups == 1 {
                format!("inference_worker_{j}")
            } else {
                format!("inference_worker_p{g}_{j}")
            };
            let l = app.process_loop(&name);
            (g, app.object::<InferenceNode>(l, &name))
        })
        .collect();
    let num_policies = if learns { s.num_policies } else { 0 };
    // One of several learner ranks: its learner averages gradients over MPI, which only the rank's main process may
    // use: it runs on a thread.
    let several_learners = matches!(part, RankPart::Learner(r) if r.learners > 1);
    let learner_loops: Vec<_> = (0..num_policies)
        .map(|p| {
            let name = learner_name(p, num_policies);
            if several_learners {
                app.thread_loop(&name)
            } else {
                app.process_loop(&name)
            }
        })
        .collect();
    // An off-policy learner's loop sleeps on its replay buffer between rounds: a batcher there would hold back the
    // rollout workers' slots (at the start, until its first wait timed out). It has no batches to build: it runs on
    // the main loop. (A rank that does not learn has no learner loop and no batcher.)
    let batcher = learns.then(|| {
        let l = if plan.learns_from_replay {
            main
        } else {
            learner_loops[0]
        };
        app.object::<BatcherNode>(l, "batcher")
    });
    let learners: Vec<_> = learner_loops
        .iter()
        .enumerate()
        .map(|(p, &l)| app.object::<LearnerNode>(l, &learner_name(p, num_policies)))
        .collect();
    let runner = learns.then(|| app.object::<RunnerNode>(main, "runner"));
    let learner_link = (!samples).then(|| app.object::<LearnerLink>(main, "mpi_link"));
    let actor_link = (!learns).then(|| app.object::<ActorLink>(main, "mpi_link"));

    // Signals of the single components. Requests go through a work queue per group of inference workers, each
    // taken by one worker of the group.
    let policy_requested: Vec<_> = (0..groups)
        .map(|g| {
            let name = if groups == 1 {
                "policy_requested".to_owned()
            } else {
                format!("policy_requested_p{g}")
            };
            app.work_queue::<PolicyRequest>(&name, 1 << 20)
        })
        .collect();
    let batch_ready: Vec<_> = batcher
        .iter()
        .flat_map(|&b| (0..num_policies).map(move |p| (b, p)))
        .map(|(b, p)| app.signal::<Batch, _>(b, &format!("batch_ready_{p}")))
        .collect();
    let learner_signals: Vec<_> = learners
        .iter()
        .map(|&l| LearnerSignals {
            policy_updated: app.signal::<PolicyUpdated, _>(l, "policy_updated"),
            training_reported: app.signal::<TrainingReport, _>(l, "training_reported"),
            snapshot_taken: s
                .self_play
                .then(|| app.signal::<SnapshotTaken, _>(l, "snapshot_taken")),
            pbt_weights_saved: cfg
                .pbt
                .with_pbt
                .then(|| app.signal::<PbtWeightsSaved, _>(l, "pbt_weights_saved")),
            train_tick: (plan.learns_from_replay && !cfg.run.serial_mode)
                .then(|| app.signal::<TrainTick, _>(l, "train_tick")),
        })
        .collect();
    let runner_signals = runner.map(|runner| RunnerSignals {
        checkpoint_requested: app.signal::<CheckpointRequest, _>(runner, "checkpoint_requested"),
        progress_reported: app.signal::<CheckpointRequest, _>(runner, "progress_reported"),
        snapshot_requested: s
            .self_play
            .then(|| app.signal::<SnapshotRequest, _>(runner, "snapshot_requested")),
        pbt_update: cfg
            .pbt
            .with_pbt
            .then(|| app.signal::<PbtUpdate, _>(runner, "pbt_update")),
    });

    // Connections among them.
    for &(g, inf) in &inference {
        app.consume(policy_requested[g], inf, InferenceNode::on_policy_requested);
    }
    if let (Some(batcher), Some(runner), Some(runner_signals)) = (batcher, runner, &runner_signals) {
        for ((&learner, signals), &batch) in learners.iter().zip(&learner_signals).zip(&batch_ready) {
            app.connect(batch, learner, LearnerNode::on_batch_ready);
            if let Some(tick) = signals.train_tick {
                app.connect(tick, learner, LearnerNode::on_train_tick);
            }
            app.connect(
                signals.training_reported,
                batcher,
                BatcherNode::on_training_reported,
            );
            app.connect(
                signals.training_reported,
                runner,
                RunnerNode::on_training_reported,
            );
            app.connect(
                runner_signals.checkpoint_requested,
                learner,
                LearnerNode::on_checkpoint_requested,
            );
            app.connect(
                runner_signals.progress_reported,
                learner,
                LearnerNode::on_progress_reported,
            );
            if let Some(update) = runner_signals.pbt_update {
                app.connect(update, learner, LearnerNode::on_pbt_update);
            }
            for other in &learner_signals {
                if let Some(saved) = other.pbt_weights_saved {
                    app.connect(saved, learner, LearnerNode::on_pbt_weights_saved);
                }
            }
            if let (Some(requested), Some(taken)) =
                (runner_signals.snapshot_requested, signals.snapshot_taken)
            {
                app.connect(requested, learner, LearnerNode::on_snapshot_requested);
                app.connect(taken, runner, RunnerNode::on_snapshot_taken);
            }
            if let Some(link) = learner_link {
                app.connect(signals.policy_updated, link, LearnerLink::on_policy_updated);
            }
        }
    }

    // Who hands trajectories, starts and reports to the batcher and the runner: the rollout workers
    // on one machine, the link on the learner rank (for every actor rank's workers).
    let learner_link_signals = learner_link.map(|link| {
        let signals = LearnerLinkSignals {
            trajectory_ready: app.signal::<TrajectoryReady, _>(link, "trajectory_ready"),
            worker_started: app.signal::<WorkerStarted, _>(link, "worker_started"),
            rollout_reported: app.signal::<RolloutReport, _>(link, "rollout_reported"),
            actor_stopped: app.signal::<ActorStopped, _>(link, "actor_stopped"),
            link_failed: app.signal::<LinkFailed, _>(link, "link_failed"),
        };
        app.connect(signals.actor_stopped, link, LearnerLink::on_actor_stopped);
        app.connect(signals.link_failed, link, LearnerLink::on_link_failed);
        signals
    });
    let mut producers = Vec::new();
    if let Some(signals) = &learner_link_signals {
        producers.push((
            signals.trajectory_ready,
            signals.rollout_reported,
            signals.worker_started,
        ));
    }
    // Who releases slots and publishes policies to the rollout workers: the batcher and the learners
    // on one machine, the link on an actor rank (for the learner rank's).
    let actor_link_signals = actor_link.map(|link| {
        let signals = ActorLinkSignals {
            buffer_released: (0..num_workers)
                .map(|i| app.signal::<BufferReleased, _>(link, &format!("buffer_released_{i}")))
                .collect(),
            slots_reclaimed: (0..num_workers)
                .map(|i| app.signal::<SlotsReclaimed, _>(link, &format!("slots_reclaimed_{i}")))
                .collect(),
            policy_updated: app.signal::<PolicyUpdated, _>(link, "policy_updated"),
            stop_requested: app.signal::<StopRequested, _>(link, "stop_requested"),
            link_failed: app.signal::<LinkFailed, _>(link, "link_failed"),
        };
        app.connect(signals.stop_requested, link, ActorLink::on_stop_requested);
        app.connect(signals.link_failed, link, ActorLink::on_link_failed);
        signals
    });

    // Each rollout worker's signals and connections: actions and released slots go to the one
    // worker they concern.
    let mut actions_ready = vec![Vec::new(); inference.len()];
    let mut buffer_released = Vec::new();
    let mut slots_reclaimed = Vec::new();
    let mut worker_signals = Vec::new();
    for i in 0..num_workers {
        let (released, reclaimed) = match (batcher, &actor_link_signals) {
            (Some(batcher), _) => (
                app.signal::<BufferReleased, _>(batcher, &format!("buffer_released_{i}")),
                app.signal::<SlotsReclaimed, _>(batcher, &format!("slots_reclaimed_{i}")),
            ),
            (None, Some(link)) => (link.buffer_released[i], link.slots_reclaimed[i]),
            (None, None) => {
                return Err(BuildError::User(
                    "a rank without a batcher needs the actor link".into(),
                ))
            }
        };
        if let Some(link) = learner_link {
            app.connect(released, link, move |l: &mut LearnerLink, ctx, r| {
                l.on_buffer_released(ctx, i, r)
            });
            app.connect(reclaimed, link, move |l: &mut LearnerLink, ctx, r| {
                l.on_slots_reclaimed(ctx, i, r)
            });
        }
        if batcher.is_some() {
            buffer_released.push(released);
            slots_reclaimed.push(reclaimed);
        }
        let Some(&w) = workers.get(i) else { continue };
        for (j, &(_, inf)) in inference.iter().enumerate() {
            let actions = app.signal::<ActionsReady, _>(inf, &format!("actions_ready_{i}"));
            app.connect(actions, w, RolloutNode::on_actions_ready);
            actions_ready[j].push(actions);
        }
        app.connect(released, w, RolloutNode::on_buffer_released);
        app.connect(reclaimed, w, RolloutNode::on_slots_reclaimed);
        let signals = RolloutSignals {
            policy_requested: policy_requested.clone(),
            trajectory_ready: app.signal::<TrajectoryReady, _>(w, "trajectory_ready"),
            rollout_reported: app.signal::<RolloutReport, _>(w, "rollout_reported"),
            worker_started: app.signal::<WorkerStarted, _>(w, "worker_started"),
            next_turn: app.signal::<NextTurn, _>(w, "next_turn"),
        };
        app.connect(signals.next_turn, w, RolloutNode::on_next_turn);
        producers.push((
            signals.trajectory_ready,
            signals.rollout_reported,
            signals.worker_started,
        ));
        if let Some(link) = actor_link {
            app.connect(signals.trajectory_ready, link, ActorLink::on_trajectory_ready);
            app.connect(signals.rollout_reported, link, ActorLink::on_rollout_reported);
            app.connect(signals.worker_started, link, ActorLink::on_worker_started);
        }
        if plan.learns_from_replay && cfg.run.serial_mode {
            // On one loop the learners train what each trajectory's transitions allow, right after it.
            for &learner in &learners {
                app.connect(
                    signals.rollout_reported,
                    learner,
                    LearnerNode::on_rollout_reported,
                );
            }
        }
        for signals in &learner_signals {
            app.connect(signals.policy_updated, w, RolloutNode::on_policy_updated);
            if let Some(taken) = signals.snapshot_taken {
                app.connect(taken, w, RolloutNode::on_snapshot_taken);
            }
        }
        if let Some(link) = &actor_link_signals {
            app.connect(link.policy_updated, w, RolloutNode::on_policy_updated);
        }
        worker_signals.push(signals);
    }
    if let (Some(batcher), Some(runner)) = (batcher, runner) {
        for (trajectory_ready, rollout_reported, worker_started) in producers {
            app.connect(trajectory_ready, batcher, BatcherNode::on_trajectory_ready);
            app.connect(rollout_reported, runner, RunnerNode::on_rollout_reported);
            app.connect(worker_started, batcher, BatcherNode::on_worker_started);
            app.connect(worker_started, runner, RunnerNode::on_worker_started);
        }
    }

    // Constructors. The learner's and the inference workers' networks start from the same seed,
    // so they start identical; the learner publishes every update into the shared weights.
    for ((i, &w), signals) in workers.iter().enumerate().zip(worker_signals) {
        let (plan, registry, plane) = (plan.clone(), registry.clone(), plane.clone());
        let place = (part.global_worker(i), part.all_workers(cfg));
        let group = env_group.clone();
        app.construct(w, move || {
            let mapped = RolloutNode::map(i, &plan, &plane);
            RolloutNode::new(i, place, plan, registry, mapped, signals, group)
        });
    }
    for (&(g, inf), signals) in inference.iter().zip(actions_ready) {
        let (plan, plane) = (plan.clone(), plane.clone());
        let next_turn = app.signal::<NextTurn, _>(inf, "next_turn");
        app.connect(next_turn, inf, InferenceNode::on_next_turn);
        app.construct(inf, move || {
            InferenceNode::new(&plan, &plane, g, signals, next_turn)
        });
    }
    let heartbeat = Duration::from_secs_f64(cfg.run.heartbeat_interval);
    if let (Some(link), Some(signals)) = (actor_link, actor_link_signals) {
        let (ranks, plane) = (part.ranks(), plane.clone());
        let ends = link_ends.take().unwrap_or_else(LinkEnds::detached);
        let num_policies = s.num_policies;
        app.construct(link, move || {
            let weights = (0..num_policies).map(|p| plane.open_weights(p)).collect();
            ActorLink::new(ranks, signals, ends, heartbeat, plane.open_pools(), weights)
        });
    }
    if let (Some(link), Some(signals)) = (learner_link, learner_link_signals) {
        let (ranks, plane) = (part.ranks(), plane.clone());
        let ends = link_ends.take().unwrap_or_else(LinkEnds::detached);
        let num_policies = s.num_policies;
        app.construct(link, move || {
            let weights = (0..num_policies).map(|p| plane.open_weights(p)).collect();
            let mapped = plane
                .open_pools()
                .and_then(|pools| Ok((pools, ShmArray::open(&plane.counters)?)));
            LearnerLink::new(ranks, signals, ends, heartbeat, mapped, weights)
        });
    }
    let (Some(batcher), Some(runner), Some(runner_signals)) = (batcher, runner, runner_signals) else {
        return Ok(());
    };
    let layout = CounterLayout { workers: num_workers };
    let batcher_signals = BatcherSignals {
        batch_ready,
        buffer_released,
        slots_reclaimed,
    };
    let num_networks = cfg.num_networks();
    let assembler = Batcher::new(
        num_policies,
        cfg.dataset_size(),
        s.rollout,
        cfg.appo.max_policy_lag,
    );
    let batcher_plane = plane.clone();
    app.construct(batcher, move || {
        BatcherNode::new(assembler, num_networks, &batcher_plane, layout, batcher_signals)
    });
    // The rollout workers beside the learners write into their replay buffers (an MPI learner rank's link does).
    let replay_writers = if samples { workers.len() } else { 0 };
    for (p, (&learner, signals)) in learners.iter().zip(learner_signals).enumerate() {
        let (plan, registry, plane, sync) = (
            plan.clone(),
            registry.clone(),
            plane.clone(),
            learner_sync.clone(),
        );
        app.construct(learner, move || {
            LearnerNode::new(p, &plan, &registry, &plane, signals, sync).with_replay_writers(replay_writers)
        });
    }
    let mut stats = RunStats::new(cfg, process_start);
    // A multi-agent env's agents each get their statistics.
    if env.num_agents > 1 {
        stats.track_agents(&env.agent_names);
    }
    if let Some(point) = resumed {
        stats.resume_from(point.env_frames, point.episodes, &point.versions);
        if let (true, Some(exp)) = (cfg.sampling.self_play, &experiment) {
            resume_self_play(&mut stats, exp, cfg.sampling.num_policies)?;
        }
    }
    let report_interval =
        (cfg.run.report_interval_sec > 0.0).then(|| Duration::from_secs_f64(cfg.run.report_interval_sec));
    let save_every = Duration::from_secs_f64(cfg.checkpoint.save_every_sec);
    let pbt = pbt_population(cfg, experiment.as_ref())?;
    let replays = plane.replays.clone();
    let live_names = (cfg.run.experiment.clone(), cfg.run.train_dir.clone());
    app.construct(runner, move || {
        RunnerNode::new(
            stats,
            report_interval,
            experiment,
            save_every,
            runner_signals,
            summary,
            pbt,
        )
        .with_replays(replays)
        .with_live_view(&live_names.0, live_names.1.clone())
    });
    Ok(())
}
