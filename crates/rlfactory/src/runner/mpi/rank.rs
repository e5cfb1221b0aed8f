//! One rank of an MPI job in the async workflow (EXARL's async learner). The learner rank runs the batcher, the learner
//! and the runner; every actor rank runs rollout and inference workers over its own shared memory, as one machine does;
//! a link on each rank's main loop stands for the other side ([`super::link`]).
//! Each rank has threads of its own besides its event loops, each with its own handle on the world communicator
//! ([`WorldMaker`]): sending threads (one per destination rank) send what the link posts to them ([`Postbox`]), in
//! order; one receives, writes what arrives into this rank's shared memory and emits the signals. With
//! `--process_per_env` above 1 the member ranks of each env group run no component graph: they step their share of
//! their lead's envs ([`crate::env::group`]). The ranks end in a handshake that leaves no message unmatched: the
//! learner rank's last message to each rank of its env groups is `Stop`, each such rank's last is `Stopped` (a lead's
//! also to learner 0, which counts every lead's progress), and the learner rank's receiver runs until the `Stopped` of
//! every rank it hears from is in.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rlf_comm::{Comm, Layout, Role, Source, WorldMaker};
use rlf_shm::ShmArray;
use rlf_signal::{EmitError, Inlet};

use super::link::{
    ActorInlets, ActorStopped, LearnerInlets, LinkEnds, LinkFailed, Liveness, Outgoing, Postbox, Ranks,
    StopRequested, Wire, TO_ACTOR, TO_LEARNER,
};
use crate::config::Config;
use crate::env::group::{serve_share, EnvGroup, Shares, MAX_CHANNELS};
use crate::env::EnvRegistry;
use crate::error::{Result, RlfError};
use crate::learning::PolicyUpdated;
use crate::plan::RunPlan;
use crate::runner::counters::CounterLayout;
use crate::runner::plane::RankPart;
use crate::runner::summary::{StopReason, Summary};
use crate::sampling::{BufferReleased, WorkerCounts};

/// What the learner of a rank with several learner ranks averages its gradients with: its own handle on the world
/// communicator (it runs on a thread of the rank's main process), from which it splits the learner communicator.
#[derive(Clone)]
pub(in crate::runner) struct LearnerSync {
    pub maker: Arc<dyn WorldMaker>,
    pub rank: usize,
    pub check_every: u64,
}

impl std::fmt::Debug for LearnerSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearnerSync").field("rank", &self.rank).finish()
    }
}

impl LearnerSync {
    /// The learner communicator (a collective of the world: the actor ranks take part without a colour).
    pub fn learners(&self) -> Result<Box<dyn Comm>> {
        self.maker
            .world()
            .split(Some(0), self.rank)
            .map_err(comm_error)?
            .ok_or_else(|| RlfError::Protocol {
                component: "learner communicator",
                message: "a learner rank got no learner communicator".into(),
            })
    }
}

/// What the link's threads and the link share.
#[derive(Debug)]
struct Shared {
    traffic: Traffic,
    liveness: Arc<Liveness>,
    /// The learner rank's `Stop` arrived (an actor or member rank).
    stop_received: AtomicBool,
}

/// What crossed the network from this rank, counted by its two threads.
#[derive(Debug, Default)]
struct Traffic {
    sent_messages: AtomicU64,
    sent_bytes: AtomicU64,
    received_messages: AtomicU64,
    received_bytes: AtomicU64,
    /// Microseconds the receiver waited for a message.
    waiting_micros: AtomicU64,
    /// Weights not sent because newer ones of the same policy were waiting behind them.
    superseded_weights: AtomicU64,
}

impl Traffic {
    fn line(&self, rank: usize, seconds: f64, carrier: &str) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "[rlfactory] rank {rank} (pid {}): sent {} messages ({} bytes), received {} messages ({} bytes) in {seconds:.1} s \
             through {carrier}; waited {:.1} s for messages; {} weight updates superseded before sending",
            std::process::id(),
            get(&self.sent_messages),
            get(&self.sent_bytes),
            get(&self.received_messages),
            get(&self.received_bytes),
            get(&self.waiting_micros) as f64 / 1e6,
            get(&self.superseded_weights),
        )
    }
}

fn comm_error(e: rlf_comm::CommError) -> RlfError {
    RlfError::Protocol {
        component: "mpi link",
        message: e.to_string(),
    }
}

/// Sends `messages` in order, until their sender is dropped; weights that newer weights of the same policy wait
/// behind are dropped instead (a send blocks while the peer drains its buffers, and versions queue up meanwhile).
fn send_lane(comm: &dyn Comm, messages: &Receiver<Outgoing>, traffic: &Traffic) -> Result<()> {
    let mut waiting = VecDeque::new();
    while let Some(o) = waiting.pop_front().or_else(|| messages.recv().ok()) {
        waiting.extend(messages.try_iter());
        if o.superseded_in(waiting.iter()) {
            traffic.superseded_weights.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        comm.send(o.dest, o.tag, &o.bytes).map_err(comm_error)?;
        traffic.sent_messages.fetch_add(1, Ordering::Relaxed);
        traffic
            .sent_bytes
            .fetch_add(o.bytes.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// Receives the next message with `tag` from `source`.
/// Counted; a communication error is the outer one (the thread cannot go on), a message that does not decode the
/// inner one.
fn receive(
    comm: &dyn Comm,
    source: Source,
    tag: rlf_comm::Tag,
    traffic: &Traffic,
) -> Result<(usize, Result<Wire>)> {
    let start = Instant::now();
    let received = comm.recv(source, tag).map_err(comm_error)?;
    traffic
        .waiting_micros
        .fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
    traffic.received_messages.fetch_add(1, Ordering::Relaxed);
    traffic
        .received_bytes
        .fetch_add(received.bytes.len() as u64, Ordering::Relaxed);
    Ok((received.from, Wire::decode(&received.bytes)))
}

/// An emit into a loop that stopped is not an error: the rank is stopping.
fn emitted(r: std::result::Result<(), EmitError>) -> Result<()> {
    match r {
        Ok(()) | Err(EmitError::Closed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The learner rank's receiver: trajectories into the pools of the actor ranks' workers, and their signals, until
/// every actor rank it hears from (learner 0 hears every one's progress) said `Stopped`. A message it cannot deliver
/// stops the run (`link_failed`); it keeps receiving then (and drops what arrives), so that no actor rank is left
/// blocked in a send, and returns the first failure at the end.
fn receive_on_learner(
    comm: &dyn Comm,
    inlets: &Receiver<LearnerInlets>,
    ranks: Ranks,
    link: &Shared,
) -> Result<()> {
    let mut inlets = inlets.recv().ok();
    let mut counts = vec![WorkerCounts::default(); inlets.as_ref().map_or(0, |to| to.pools.len())];
    let mut first_error = None;
    let mut stopped = 0;
    let heard = ranks.heard_ranks().len();
    while stopped < heard {
        let (from, message) = receive(comm, Source::Any, TO_LEARNER, &link.traffic)?;
        link.liveness.heard(from);
        if matches!(message, Ok(Wire::Stopped { .. })) && !link.liveness.has_stopped(from) {
            stopped += 1;
            link.liveness.set_stopped(from);
        }
        let Some(to) = &inlets else { continue };
        let Ok(message) = message.map_err(|e| give_up(&mut first_error, e, &to.link_failed)) else {
            inlets = None;
            continue;
        };
        let delivered = match message {
            Wire::Alive => Ok(()),
            Wire::Started(mut started) => {
                started.worker = ranks.global_worker(from, started.worker);
                count(&mut counts, &to.counters, started.worker, |c| {
                    c.lost_frames += started.lost_frames;
                });
                emitted(to.worker_started.emit(&started))
            }
            Wire::Trajectory { mut ready, slot } => {
                ready.worker = ranks.global_worker(from, ready.worker);
                to.pools
                    .get(ready.worker)
                    .ok_or_else(|| RlfError::Protocol {
                        component: "mpi link",
                        message: format!("rank {from} sent a trajectory of a worker it does not have"),
                    })
                    .and_then(|pool| pool.write_slot(ready.buffer, &slot))
                    .and_then(|()| {
                        count(&mut counts, &to.counters, ready.worker, |c| c.produced += 1);
                        emitted(to.trajectory_ready.emit(&ready))
                    })
            }
            Wire::Report(mut report) => {
                report.worker = ranks.global_worker(from, report.worker);
                emitted(to.rollout_reported.emit(&report))
            }
            // Another learner's actor rank stops with its learner, which this one learns of from their allreduce.
            Wire::Stopped { error: None, .. } if !ranks.feeds_me(from) => Ok(()),
            Wire::Stopped { error, signal } => emitted(to.actor_stopped.emit(&ActorStopped {
                rank: from,
                error,
                signal,
            })),
            other => Err(RlfError::Protocol {
                component: "mpi link",
                message: format!("rank {from} sent the learner rank a message for an actor rank: {other:?}"),
            }),
        };
        if let Err(e) = delivered {
            give_up(&mut first_error, e, &to.link_failed);
            inlets = None;
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Changes the counts of the learner rank's worker `global` with `change` and stores them in `counters` (a worker
/// out of range was refused with its message).
fn count(
    counts: &mut [WorkerCounts],
    counters: &ShmArray<u64>,
    global: usize,
    change: impl FnOnce(&mut WorkerCounts),
) {
    if let Some(c) = counts.get_mut(global) {
        change(c);
        CounterLayout::store_worker(counters, global, *c);
    }
}

/// A receiving thread's first failure: it stops the run through the link (`link_failed`) and is kept for the end.
fn give_up(first_error: &mut Option<RlfError>, e: RlfError, link_failed: &Inlet<LinkFailed>) {
    let _ = link_failed.emit(&LinkFailed {
        message: e.to_string(),
    });
    first_error.get_or_insert(e);
}

/// An actor rank's receiver: released slots, new weights (published into this rank's shared memory) and their
/// signals, until the learner rank's `Stop`. A message it cannot deliver stops the rank (`link_failed`), as on the
/// learner rank.
fn receive_on_actor(
    comm: &dyn Comm,
    inlets: &Receiver<ActorInlets>,
    ranks: Ranks,
    link: &Shared,
) -> Result<()> {
    let mut inlets = inlets.recv().ok();
    let mut first_error = None;
    loop {
        let (from, message) = receive(comm, Source::Rank(ranks.learner()), TO_ACTOR, &link.traffic)?;
        link.liveness.heard(from);
        if matches!(message, Ok(Wire::Stop)) {
            link.stop_received.store(true, Ordering::Relaxed);
            if let Some(to) = &inlets {
                // The rank may already be stopping on its own.
                let _ = to.stop_requested.emit(&StopRequested);
            }
            break;
        }
        let Some(to) = &inlets else { continue };
        let Ok(message) = message.map_err(|e| give_up(&mut first_error, e, &to.link_failed)) else {
            inlets = None;
            continue;
        };
        let missing = |what: &str, index: usize| RlfError::Protocol {
            component: "mpi link",
            message: format!(
                "the learner rank sent a message for {what} {index}, which this rank does not have"
            ),
        };
        let delivered = match message {
            Wire::Alive => Ok(()),
            Wire::Released { worker, buffer } => to
                .buffer_released
                .get(worker)
                .ok_or_else(|| missing("worker", worker))
                .and_then(|inlet| emitted(inlet.emit(&BufferReleased { buffer }))),
            Wire::Reclaimed { worker, reclaimed } => to
                .slots_reclaimed
                .get(worker)
                .ok_or_else(|| missing("worker", worker))
                .and_then(|inlet| emitted(inlet.emit(&reclaimed))),
            Wire::Weights {
                policy,
                version,
                values,
            } => match to.weights.get(policy) {
                Some(shared) if shared.len() == values.len() => {
                    shared.publish(version, &values);
                    emitted(to.policy_updated.emit(&PolicyUpdated { policy, version }))
                }
                Some(shared) => Err(RlfError::Protocol {
                    component: "mpi link",
                    message: format!(
                        "the learner rank sent {} weights of policy {policy}, whose network here has {}",
                        values.len(),
                        shared.len()
                    ),
                }),
                None => Err(missing("policy", policy)),
            },
            other => Err(RlfError::Protocol {
                component: "mpi link",
                message: format!("the learner rank sent an actor rank a message for the learner: {other:?}"),
            }),
        };
        if let Err(e) = delivered {
            give_up(&mut first_error, e, &to.link_failed);
            inlets = None;
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Every rank but the first learner's (whose lines are the run's, and which keeps the experiment's `log.txt`) writes
/// its output and its workers' to `<train_dir>/<experiment>.ranks/rank_<r>.log`, after one line saying so. Nothing
/// when the run has no experiment folder (`--save_experiment=false`, `--benchmark`): every rank prints to the terminal.
fn log_to_own_file(cfg: &Config, rank: usize, learner: bool) -> Result<()> {
    if (learner && rank == 0) || !cfg.run.save_experiment {
        return Ok(());
    }
    let dir = cfg.run.train_dir.join(format!("{}.ranks", cfg.run.experiment));
    let path = dir.join(format!("rank_{rank}.log"));
    let io = |source| RlfError::Io {
        what: "opening the rank's log",
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    let file = std::fs::File::create(&path).map_err(io)?;
    // One write, so that the line is not cut by other ranks' output on mpirun's terminal.
    let line = format!("[rlfactory] rank {rank} logs to {}\n", path.display());
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    rustix::stdio::dup2_stdout(&file).map_err(|e| io(e.into()))?;
    rustix::stdio::dup2_stderr(&file).map_err(|e| io(e.into()))
}

/// EXARL's layout of `size` ranks, and what the workflows here need of it: as many actor ranks (env groups) as
/// learners at least, env groups the envs can be shared over, one learner in sync mode, and sync rounds that fill
/// whole datasets.
fn check_layout(plan: &RunPlan, registry: &EnvRegistry, size: usize, ranks: Ranks) -> Result<Layout> {
    let cfg = &plan.config;
    let d = &cfg.distributed;
    let layout =
        Layout::new(size, d.learner_procs, d.process_per_env).map_err(|e| RlfError::Config(e.to_string()))?;
    if layout.shared() && size > 1 {
        return Err(RlfError::Config(format!(
            "{size} ranks with --process_per_env {size}: the learner rank steps no envs here; \
             give the env groups ranks of their own (ranks = --learner_procs + a multiple of --process_per_env)"
        )));
    }
    if d.process_per_env > 1 {
        check_env_groups(cfg, registry, d.process_per_env)?;
    }
    if ranks.actors < ranks.learners {
        return Err(RlfError::Config(format!(
            "{size} ranks with --learner_procs {}: every learner needs an actor rank of its own (at least {} ranks)",
            ranks.learners,
            ranks.learners * (1 + ranks.per_env)
        )));
    }
    if d.learner_procs > 1 && !cfg.run.async_rl {
        return Err(RlfError::Config(
            "--workflow sync has one learner (EXARL's sync learner): --learner_procs 1".into(),
        ));
    }
    if !cfg.run.async_rl {
        let s = &cfg.sampling;
        let agents = plan.env.num_agents;
        let sampled = ranks.actors * s.num_workers * s.num_envs_per_worker * agents * s.rollout;
        if cfg.dataset_size() % sampled != 0 {
            return Err(RlfError::Config(format!(
                "--workflow sync: --batch_size * --num_batches_per_epoch ({}) must be a multiple of a round's \
                 transitions, actor ranks * --num_workers * --num_envs_per_worker * agents per env * --rollout ({sampled})",
                cfg.dataset_size()
            )));
        }
    }
    Ok(layout)
}

/// What envs that span the ranks of a group need: single-agent native envs, and at least one env per rank in every
/// split of a rollout worker.
fn check_env_groups(cfg: &Config, registry: &EnvRegistry, per_env: usize) -> Result<()> {
    let s = &cfg.sampling;
    let env = &cfg.env.env;
    if registry.is_multi_agent(env) || rlf_env::runs_python(env) {
        return Err(RlfError::Config(format!(
            "--process_per_env {per_env} spreads single-agent native envs (CartPole-v1, ...) over a group's ranks, \
             not {env}"
        )));
    }
    let per_split = s.num_envs_per_worker / s.worker_num_splits;
    if per_split < per_env {
        return Err(RlfError::Config(format!(
            "--process_per_env {per_env} shares each split's envs over {per_env} ranks: --num_envs_per_worker / \
             --worker_num_splits ({per_split}) must be at least {per_env}"
        )));
    }
    let channels = s.num_workers * s.worker_num_splits;
    if channels > MAX_CHANNELS {
        return Err(RlfError::Config(format!(
            "--process_per_env {per_env}: at most {MAX_CHANNELS} splits per actor rank (--num_workers * \
             --worker_num_splits is {channels})"
        )));
    }
    Ok(())
}

/// A member rank of an env group: it steps its share of the envs of every split of its lead's rollout workers, each
/// on a thread with the split's own communicator, until the lead closes them, and sends its learner a heartbeat
/// every quarter of `--heartbeat_interval` meanwhile. A communication error on a thread leaves its lead waiting in a
/// collective, and a lead that has not closed every split within the interval after the learner's `Stop` never will
/// (it failed before making them): either way the rank aborts the job.
fn serve_member(
    cfg: &Config,
    registry: &EnvRegistry,
    ranks: Ranks,
    maker: &Arc<dyn WorldMaker>,
    link: &Shared,
    outgoing: &Postbox,
) -> Result<Option<Summary>> {
    let s = &cfg.sampling;
    let group = EnvGroup {
        maker: Arc::clone(maker),
        members: ranks.my_group(),
    };
    let shares = Shares {
        total: s.num_envs_per_worker / s.worker_num_splits,
        ranks: ranks.per_env,
    };
    let channels = s.num_workers * s.worker_num_splits;
    let (done, served) = mpsc::channel();
    for channel in 0..channels {
        let (group, registry, env) = (group.clone(), registry.clone(), cfg.env.clone());
        let done = done.clone();
        thread::Builder::new()
            .name(format!("env_share_{channel}"))
            .spawn(move || {
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    group.comm(channel).and_then(|comm| {
                        serve_share(&*comm, shares, |n| crate::env::single_envs(&registry, &env, n))
                    })
                }))
                .unwrap_or_else(|_| {
                    Err(RlfError::EventLoop(format!(
                        "the thread of split {channel} panicked"
                    )))
                });
                let _ = done.send(served);
            })
            .map_err(|e| RlfError::EventLoop(format!("cannot start an env share's thread: {e}")))?;
    }
    drop(done);
    let heartbeat = Duration::from_secs_f64(cfg.run.heartbeat_interval);
    let alive = Wire::Alive.encode()?;
    let (mut steps, mut ended, mut stop_seen) = (0, 0, None);
    while ended < channels {
        if link.stop_received.load(Ordering::Relaxed) {
            let since = *stop_seen.get_or_insert_with(Instant::now);
            if since.elapsed() > heartbeat {
                eprintln!(
                    "[rlfactory] rank {}: the lead rank {} closed {ended} of its {channels} split(s) within \
                     --heartbeat_interval ({:.1} s) of the learner's stop: aborting the MPI job",
                    ranks.me,
                    group.members[0],
                    heartbeat.as_secs_f64()
                );
                maker.abort(1);
            }
        }
        match served.recv_timeout(heartbeat / 4) {
            Ok(Ok(n)) => {
                ended += 1;
                steps += n;
            }
            Ok(Err(e)) => {
                eprintln!(
                    "[rlfactory] rank {}: an env share of the group {:?} failed: {e}: aborting the MPI job",
                    ranks.me, group.members
                );
                maker.abort(1);
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = outgoing.send(Outgoing::message(ranks.learner(), TO_LEARNER, alive.clone()));
            }
            Err(RecvTimeoutError::Disconnected) => {
                eprintln!(
                    "[rlfactory] rank {}: {} of the group {:?}'s {channels} split threads ended without a word: \
                     aborting the MPI job",
                    ranks.me,
                    channels - ended,
                    group.members
                );
                maker.abort(1);
            }
        }
    }
    eprintln!(
        "[rlfactory] rank {}: stepped {steps} steps of {} env(s) in each of {channels} split(s) for lead rank {} \
         (group {:?})",
        ranks.me,
        shares.share(ranks.me - group.members[0]),
        group.members[0],
        group.members
    );
    Ok(None)
}

/// A thread's name and how it ended.
type Ended = (String, Result<()>);

/// Starts a named thread running `f`, which reports its end (a panic as an error) on `done`.
fn spawn<F>(name: String, done: &Sender<Ended>, f: F) -> Result<()>
where
    F: FnOnce() -> Result<()> + Send + 'static,
{
    let done = done.clone();
    thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                .unwrap_or_else(|_| Err(RlfError::EventLoop(format!("the {name} thread panicked"))));
            let _ = done.send((name, ended));
        })
        .map(drop)
        .map_err(|e| RlfError::EventLoop(format!("cannot start a thread of the link: {e}")))
}

/// Trains as `cfg` says as this process's rank of the world communicator `world` (`--mpi`): learner rank 0 returns
/// the run's summary, the other ranks `None`. Every rank must call it with the same `cfg`.
/// An impossible layout is an error on every rank. When the run is over, each rank waits up to
/// `--heartbeat_interval` for its peers' last messages; a peer that sends none is hung, and the rank aborts the job
/// (after the learner's checkpoint and this rank's shared memory are gone).
pub fn train_rank(
    plan: &RunPlan,
    registry: &EnvRegistry,
    process_start: Instant,
    world: &dyn Comm,
    maker: Arc<dyn WorldMaker>,
) -> Result<Option<Summary>> {
    let d = &plan.config.distributed;
    let (rank, size) = (world.rank(), world.size());
    let ranks = Ranks {
        learners: d.learner_procs,
        actors: size.saturating_sub(d.learner_procs) / d.process_per_env.max(1),
        per_env: d.process_per_env.max(1),
        workers_per_actor: plan.config.sampling.num_workers,
        me: rank,
    };
    // What every rank finds wrong alike is reported by rank 0 alone, in one write; every rank exits with an error,
    // but only after that line is out (the barrier): a rank that exits first has `mpirun` abort the job, rank 0 with
    // it, before rank 0 has said why.
    let layout = match check_layout(plan, registry, size, ranks) {
        Ok(layout) => layout,
        Err(e) => {
            if rank == 0 {
                let line = format!("error: {e}\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            }
            world.barrier().map_err(comm_error)?;
            return Err(RlfError::ReportedByRankZero);
        }
    };
    let learner = matches!(layout.role(rank), Role::Learner { .. });
    log_to_own_file(&plan.config, rank, learner)?;
    // With several learners, rank 0's owns the experiment folder and the summary; they average their gradients over
    // the learner communicator, which every rank takes part in making.
    let several = d.learner_procs > 1;
    let mut plan = plan.clone();
    if several && rank > 0 {
        plan.config.run.save_experiment = false;
        plan.config.run.summary_json = None;
    }
    let learner_sync = (several && learner).then(|| LearnerSync {
        maker: Arc::clone(&maker),
        rank,
        check_every: d.check_weights_every,
    });
    if several && !learner {
        world.split(None, rank).map_err(comm_error)?;
    }
    let (plan, cfg) = (&plan, &plan.config);
    let link = Arc::new(Shared {
        traffic: Traffic::default(),
        liveness: Arc::new(Liveness::new(size)),
        stop_received: AtomicBool::new(false),
    });
    let (done, finished) = mpsc::channel();
    let outgoing = {
        let (maker, link, done) = (Arc::clone(&maker), Arc::clone(&link), done.clone());
        Postbox::new(move |dest, messages| {
            let (maker, link) = (Arc::clone(&maker), Arc::clone(&link));
            spawn(format!("mpi_send_{dest}"), &done, move || {
                send_lane(&*maker.world(), &messages, &link.traffic)
            })
        })
    };
    let mut ends = LinkEnds {
        outgoing: outgoing.clone(),
        learner_inlets: None,
        actor_inlets: None,
        liveness: Arc::clone(&link.liveness),
    };
    let (maker_in, link_in) = (Arc::clone(&maker), Arc::clone(&link));
    let part = if learner {
        let (inlets, inlets_in) = mpsc::channel();
        ends.learner_inlets = Some(inlets);
        spawn("mpi_receive".into(), &done, move || {
            receive_on_learner(&*maker_in.world(), &inlets_in, ranks, &link_in)
        })?;
        RankPart::Learner(ranks)
    } else {
        let (inlets, inlets_in) = mpsc::channel();
        ends.actor_inlets = Some(inlets);
        spawn("mpi_receive".into(), &done, move || {
            receive_on_actor(&*maker_in.world(), &inlets_in, ranks, &link_in)
        })?;
        RankPart::Actor(ranks)
    };
    drop(done);
    let started = Instant::now();
    let result = if ranks.is_member() {
        drop(ends);
        serve_member(cfg, registry, ranks, &maker, &link, &outgoing)
    } else {
        let env_group = (ranks.per_env > 1 && !learner).then(|| EnvGroup {
            maker: Arc::clone(&maker),
            members: ranks.my_group(),
        });
        crate::runner::run_part(
            plan,
            registry,
            process_start,
            part,
            Some(ends),
            learner_sync,
            env_group,
        )
    };
    // The last messages: `Stop` to every actor rank, or `Stopped` to the learner rank.
    let last = if learner {
        ranks
            .group_ranks()
            .into_iter()
            .map(|dest| (dest, TO_ACTOR, Wire::Stop))
            .collect()
    } else {
        let error = result.as_ref().err().map(ToString::to_string);
        let signal = rlf_signal::stop_signal();
        let mut last = vec![(
            ranks.learner(),
            TO_LEARNER,
            Wire::Stopped {
                error: error.clone(),
                signal,
            },
        )];
        // Learner 0 hears every lead, not other learners' members.
        if ranks.learner() != 0 && !ranks.is_member() {
            last.push((0, TO_LEARNER, Wire::Stopped { error, signal }));
        }
        last
    };
    for (dest, tag, message) in last {
        let bytes = message.encode()?;
        // A sending thread that is gone has reported why on `finished`.
        let _ = outgoing.send(Outgoing::message(dest, tag, bytes));
    }
    drop(outgoing);
    // The threads end once the peers' last messages are in (the receiver) and every message is out (the senders,
    // now that the last postbox is gone): `finished` disconnects when they all have. Peers still sending heartbeats
    // (a learner saving its checkpoint) are waited for. One silent for the whole interval is hung or gone: the rank
    // aborts the job once the others have stopped or gone silent too, or after one more interval (a hung member holds
    // its lead in a collective, beating for ever), so that no peer is aborted in the middle of its own orderly end.
    let heartbeat = Duration::from_secs_f64(cfg.run.heartbeat_interval);
    let peers = if learner {
        ranks.heard_ranks()
    } else {
        vec![ranks.learner()]
    };
    let mut threads = Ok(());
    let waiting = Instant::now();
    // Waits on while no peer that has not stopped is silent, or while some still beat, for one interval at most.
    let wait_on = || {
        let live = |p: &usize| !link.liveness.has_stopped(*p);
        let silent = |p: &usize| link.liveness.silent_for(*p) > heartbeat;
        let some_silent = peers.iter().filter(|p| live(p)).any(silent);
        let some_beating = peers.iter().filter(|p| live(p)).any(|p| !silent(p));
        !some_silent || (some_beating && waiting.elapsed() <= heartbeat)
    };
    loop {
        match finished.recv_timeout(heartbeat / 4) {
            Ok((name, r)) => {
                threads = threads.and(r.map_err(|e| RlfError::Protocol {
                    component: "mpi link",
                    message: format!("{name}: {e}"),
                }));
            }
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) if wait_on() => {}
            Err(RecvTimeoutError::Timeout) => {
                let silent = if learner {
                    let hung: Vec<String> = ranks
                        .heard_ranks()
                        .into_iter()
                        .filter(|&r| !link.liveness.has_stopped(r))
                        .map(|r| r.to_string())
                        .collect();
                    format!("actor rank(s) {} did not stop", hung.join(", "))
                } else {
                    format!("the learner rank {} did not stop", ranks.learner())
                };
                eprintln!(
                    "{}",
                    link.traffic
                        .line(rank, started.elapsed().as_secs_f64(), maker.carrier())
                );
                if let Err(e) = &result {
                    eprintln!("error: {e}");
                }
                eprintln!(
                    "[rlfactory] rank {rank}: {silent} within --heartbeat_interval ({:.1} s): aborting the MPI job",
                    heartbeat.as_secs_f64()
                );
                maker.abort(1);
            }
        }
    }
    eprintln!(
        "{}",
        link.traffic
            .line(rank, started.elapsed().as_secs_f64(), maker.carrier())
    );
    let result = result.map(|summary| {
        let mut summary = summary?;
        // A learner stops with no reason of its own, and no fault, only when another learner stopped.
        if several && summary.stop_reason == StopReason::Failed {
            summary.stop_reason = StopReason::OtherLearner;
        }
        if rank == 0 {
            return Some(summary);
        }
        // The run's summary is learner 0's; another learner's goes to its own log.
        if let Ok(json) = serde_json::to_string(&summary) {
            eprintln!("[rlfactory] rank {rank} done: {json}");
        }
        None
    });
    result.and_then(|summary| threads.map(|()| summary))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::mpsc;

    use rlf_comm::{Comm, LocalWorld, Source};

    use super::{send_lane, Traffic};
    use crate::runner::mpi::link::{Outgoing, Wire, TO_ACTOR};

    fn weights(policy: usize, version: u64) -> Outgoing {
        let bytes = Wire::Weights {
            policy,
            version,
            values: vec![version as f32; 4],
        }
        .encode()
        .expect("encodes");
        Outgoing {
            dest: 1,
            tag: TO_ACTOR,
            bytes,
            weights_of: Some(policy),
        }
    }

    /// Weights waiting behind newer ones of the same policy are dropped; every other message, and the newest
    /// weights of each policy, go out in the order posted.
    #[test]
    fn a_sending_lane_drops_weights_that_newer_ones_wait_behind() {
        let mut world = LocalWorld::create(2);
        let (receiver, sender) = (world.pop().expect("rank 1"), world.pop().expect("rank 0"));
        let (post, messages) = mpsc::channel();
        let released = Wire::Released { worker: 0, buffer: 3 };
        for o in [
            weights(0, 1),
            Outgoing::message(1, TO_ACTOR, released.encode().expect("encodes")),
            weights(1, 1),
            weights(0, 2),
            weights(0, 3),
        ] {
            post.send(o).expect("the lane's receiver is here");
        }
        drop(post);
        let traffic = Traffic::default();
        send_lane(&sender, &messages, &traffic).expect("sent");
        let arrived: Vec<Wire> = (0..3)
            .map(|_| {
                let received = receiver.recv(Source::Rank(0), TO_ACTOR).expect("a message");
                Wire::decode(&received.bytes).expect("decodes")
            })
            .collect();
        let version = |w: &Wire| match w {
            Wire::Weights { policy, version, .. } => Some((*policy, *version)),
            _ => None,
        };
        assert_eq!(arrived[0], released);
        assert_eq!(version(&arrived[1]), Some((1, 1)));
        assert_eq!(version(&arrived[2]), Some((0, 3)));
        assert_eq!(traffic.sent_messages.load(Ordering::Relaxed), 3);
        assert_eq!(traffic.superseded_weights.load(Ordering::Relaxed), 2);
    }
}
