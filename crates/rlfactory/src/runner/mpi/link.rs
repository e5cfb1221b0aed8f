//! The two ends of the async workflow between machines ([`crate::runner::train_rank`]): on an actor rank,
//! [`ActorLink`] stands where the batcher, the learner and the runner stand on one machine; on the learner rank,
//! [`LearnerLink`] stands where the rollout workers stand. Each link is an ordinary component on its rank's main loop;
//! its messages leave through a sending thread per destination rank ([`Postbox`]) and arrive through a receiving
//! thread, which writes what they carry into this rank's shared memory and emits the signals through [`Inlet`]s, as
//! the remote component would have.
//!
//! | actor rank → learner rank | learner rank → actor rank |
//! |---|---|
//! | `Started`: a rollout worker started | `Reclaimed`: the answer, its free slots |
//! | `Trajectory`: a finished slot, copied | `Released`: the learner trained on it, the slot is free |
//! | `Report`: frames and episodes | `Weights`: a new policy version (of several waiting, the newest) |
//! | `Stopped`: the last message of an actor rank | `Stop`: the last message to an actor rank |
//!
//! A slot stays with the learner rank until it is released, as on one machine: the actor rank's rollout workers run
//! out of slots when the learner falls behind, so the data in flight is bounded by the pools (back-pressure).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rlf_comm::Tag;
use rlf_shm::{SharedWeights, ShmArray};
use rlf_signal::{Component, Ctx, Inlet, Signal};
use serde::{Deserialize, Serialize};

use crate::data::{SlotCopy, TrajectoryPool};
use crate::error::{Result, RlfError};
use crate::learning::PolicyUpdated;
use crate::runner::adapters::or_fail;
use crate::sampling::{BufferReleased, RolloutReport, SlotsReclaimed, TrajectoryReady, WorkerStarted};

/// The tag of messages to the learner rank.
pub(crate) const TO_LEARNER: Tag = 1;
/// The tag of messages to an actor rank.
pub(crate) const TO_ACTOR: Tag = 2;

/// A message between ranks. Worker indices are the actor rank's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Wire {
    /// A rollout worker (re)started.
    Started(WorkerStarted),
    /// A finished trajectory: slot `buffer` of `worker`'s pool, every value and version of it.
    Trajectory { ready: TrajectoryReady, slot: SlotCopy },
    /// A rollout worker's progress.
    Report(RolloutReport),
    /// The actor rank stopped (its last message), with the reason if it stopped on its own, or the signal that
    /// stopped it.
    Stopped {
        error: Option<String>,
        signal: Option<i32>,
    },
    /// Slot `buffer` of `worker`'s pool is free again.
    Released { worker: usize, buffer: usize },
    /// The free slots of `worker`'s pool, the answer to [`Wire::Started`].
    Reclaimed {
        worker: usize,
        reclaimed: SlotsReclaimed,
    },
    /// Policy `policy`'s weights as of `version`.
    Weights {
        policy: usize,
        version: u64,
        #[serde(with = "crate::data::byte_strings::floats")]
        values: Vec<f32>,
    },
    /// The learner rank stopped: the last message to an actor rank.
    Stop,
    /// A heartbeat (every quarter of `--heartbeat_interval`, both ways).
    Alive,
}

impl Wire {
    /// The message's bytes.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        postcard::to_stdvec(self).map_err(|e| RlfError::Protocol {
            component: "mpi link",
            message: format!("cannot encode a message: {e}"),
        })
    }

    /// A message from its bytes.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        postcard::from_bytes(bytes).map_err(|e| RlfError::Protocol {
            component: "mpi link",
            message: format!("a message of {} bytes does not decode: {e}", bytes.len()),
        })
    }
}

/// A message for the sending thread: `bytes` to rank `dest` with `tag`.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub dest: usize,
    pub tag: Tag,
    pub bytes: Vec<u8>,
    /// `Some(policy)`: the message is policy `policy`'s weights, which a newer version waiting behind it for the same
    /// rank makes worthless (the sending thread drops it then: an actor rank only ever uses the newest weights).
    pub weights_of: Option<usize>,
}

impl Outgoing {
    /// `bytes` to rank `dest` with `tag`, sent whatever follows it.
    pub(crate) fn message(dest: usize, tag: Tag, bytes: Vec<u8>) -> Self {
        Self {
            dest,
            tag,
            bytes,
            weights_of: None,
        }
    }

    /// Whether a message in `waiting` (sent after this one) carries newer weights of the same policy to the same rank.
    pub(crate) fn superseded_in<'a>(&self, mut waiting: impl Iterator<Item = &'a Outgoing>) -> bool {
        self.weights_of
            .is_some_and(|policy| waiting.any(|o| o.dest == self.dest && o.weights_of == Some(policy)))
    }
}

/// Starts the sending thread of a destination rank: it sends what arrives on its receiver, in order.
type StartLane = dyn FnMut(usize, Receiver<Outgoing>) -> Result<()> + Send;

/// Where a rank's messages are posted: straight to the sending thread of their destination rank (its lane, started
/// at its first message), so that a peer that stops taking messages holds up its own messages only, not the
/// heartbeats and the `Stop` of the others. Clones post to the same lanes; a lane ends once every clone is dropped
/// and it has sent all it was given.
#[derive(Clone)]
pub(crate) struct Postbox {
    lanes: Arc<Mutex<Lanes>>,
}

struct Lanes {
    open: Vec<(usize, Sender<Outgoing>)>,
    start: Box<StartLane>,
}

impl std::fmt::Debug for Postbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postbox").finish_non_exhaustive()
    }
}

impl Postbox {
    /// Lanes started by `start`.
    pub(crate) fn new(start: impl FnMut(usize, Receiver<Outgoing>) -> Result<()> + Send + 'static) -> Self {
        Self {
            lanes: Arc::new(Mutex::new(Lanes {
                open: Vec::new(),
                start: Box::new(start),
            })),
        }
    }

    /// A postbox whose every post fails.
    pub(crate) fn detached() -> Self {
        Self::new(|dest, _| {
            Err(RlfError::Protocol {
                component: "mpi link",
                message: format!("no sending thread to rank {dest}: the link is detached"),
            })
        })
    }

    /// Hands `o` to its destination's lane, starting it at the first message; an error when the lane cannot start or
    /// has ended (it failed, and said why where the rank collects its threads' ends).
    pub(crate) fn send(&self, o: Outgoing) -> Result<()> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let dest = o.dest;
        let at = match lanes.open.iter().position(|(d, _)| *d == dest) {
            Some(at) => at,
            None => {
                let (lane, messages) = mpsc::channel();
                (lanes.start)(dest, messages)?;
                lanes.open.push((dest, lane));
                lanes.open.len() - 1
            }
        };
        lanes.open[at].1.send(o).map_err(|_| RlfError::Protocol {
            component: "mpi link",
            message: format!("the sending thread to rank {dest} stopped"),
        })
    }
}

/// Hands `message` to the sending thread of rank `dest`.
fn post(outgoing: &Postbox, dest: usize, tag: Tag, message: &Wire) -> Result<()> {
    outgoing.send(Outgoing::message(dest, tag, message.encode()?))
}

/// When each rank was last heard from (set by the receiving thread, read by the link's heartbeat check) and which
/// actor ranks said `Stopped`.
#[derive(Debug)]
pub(crate) struct Liveness {
    epoch: Instant,
    /// Microseconds from `epoch` to the last message of each rank, plus one (0: never heard from).
    heard: Vec<AtomicU64>,
    stopped: Vec<AtomicBool>,
}

impl Liveness {
    /// No rank of `ranks` heard from yet.
    pub fn new(ranks: usize) -> Self {
        Self {
            epoch: Instant::now(),
            heard: (0..ranks).map(|_| AtomicU64::new(0)).collect(),
            stopped: (0..ranks).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// A message from `rank` arrived.
    pub fn heard(&self, rank: usize) {
        if let Some(h) = self.heard.get(rank) {
            h.store(self.epoch.elapsed().as_micros() as u64 + 1, Ordering::Relaxed);
        }
    }

    /// How long `rank` has been silent (since the start when never heard from).
    pub fn silent_for(&self, rank: usize) -> Duration {
        let last = self.heard.get(rank).map_or(0, |h| h.load(Ordering::Relaxed));
        self.epoch
            .elapsed()
            .saturating_sub(Duration::from_micros(last.saturating_sub(1)))
    }

    /// `rank` said `Stopped`.
    pub fn set_stopped(&self, rank: usize) {
        if let Some(s) = self.stopped.get(rank) {
            s.store(true, Ordering::Relaxed);
        }
    }

    /// Whether `rank` said `Stopped`.
    pub fn has_stopped(&self, rank: usize) -> bool {
        self.stopped.get(rank).is_some_and(|s| s.load(Ordering::Relaxed))
    }
}

/// What a link is built with in the rank's main process: the sending thread's queue and the receiving thread's
/// inlets' way in (a child process never runs a link's constructor: it gets [`LinkEnds::detached`]).
#[derive(Debug)]
pub(in crate::runner) struct LinkEnds {
    pub outgoing: Postbox,
    pub learner_inlets: Option<Sender<LearnerInlets>>,
    pub actor_inlets: Option<Sender<ActorInlets>>,
    pub liveness: Arc<Liveness>,
}

impl LinkEnds {
    /// Ends that lead nowhere: a link built with them fails at its start.
    pub fn detached() -> Self {
        Self {
            outgoing: Postbox::detached(),
            learner_inlets: None,
            actor_inlets: None,
            liveness: Arc::new(Liveness::new(0)),
        }
    }
}

/// Where the ranks are, as rank `me` sees them: the learner ranks come first, then the env groups of `per_env`
/// ranks each, whose first rank (the lead) is the group's actor rank and the others its members. Group `g` feeds
/// learner `g % learners` (each learner has actor ranks of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ranks {
    /// Learner ranks: `0..learners`.
    pub learners: usize,
    /// Actor ranks (env groups' leads): `learners + g * per_env` for `g` in `0..actors`.
    pub actors: usize,
    /// Ranks per env group (`--process_per_env`).
    pub per_env: usize,
    /// Rollout workers per actor rank.
    pub workers_per_actor: usize,
    /// This rank.
    pub me: usize,
}

impl Ranks {
    /// The env group of actor or member rank `rank`.
    fn group(&self, rank: usize) -> usize {
        (rank - self.learners) / self.per_env
    }

    /// The actor rank (lead) of env group `g`.
    fn lead(&self, g: usize) -> usize {
        self.learners + g * self.per_env
    }

    /// Whether this rank is a member of an env group but not its lead: it steps envs for the lead.
    pub fn is_member(&self) -> bool {
        self.me >= self.learners && (self.me - self.learners) % self.per_env != 0
    }

    /// The world ranks of this actor or member rank's env group, the lead first.
    pub fn my_group(&self) -> Vec<usize> {
        let lead = self.lead(self.group(self.me));
        (lead..lead + self.per_env).collect()
    }

    /// The learner of this rank: its own number on a learner rank.
    pub fn learner(&self) -> usize {
        if self.me < self.learners {
            self.me
        } else {
            self.group(self.me) % self.learners
        }
    }

    /// The ranks a learner rank hears from: those of its env groups, and every actor rank for learner 0 (their
    /// progress).
    pub fn heard_ranks(&self) -> Vec<usize> {
        let mut heard = self.group_ranks();
        if self.me == 0 {
            heard.extend((0..self.actors).map(|g| self.lead(g)));
            heard.sort_unstable();
            heard.dedup();
        }
        heard
    }

    /// Every rank of the env groups that feed this rank's learner: leads and members.
    pub fn group_ranks(&self) -> Vec<usize> {
        self.actor_ranks()
            .flat_map(|lead| lead..lead + self.per_env)
            .collect()
    }

    /// Whether actor rank `rank` (a lead) feeds this rank's learner.
    pub fn feeds_me(&self, rank: usize) -> bool {
        rank >= self.learners
            && (rank - self.learners) % self.per_env == 0
            && self.group(rank) % self.learners == self.learner()
    }

    /// The actor ranks (leads) that feed this rank's learner.
    pub fn actor_ranks(&self) -> impl Iterator<Item = usize> {
        let (learners, per_env) = (self.learners, self.per_env);
        (self.learner()..self.actors)
            .step_by(learners)
            .map(move |g| learners + g * per_env)
    }

    /// The rollout workers that feed this rank's learner (every actor rank of it has the same).
    pub fn feeding_workers(&self) -> usize {
        self.actor_ranks().count() * self.workers_per_actor
    }

    /// The learner rank's index of worker `worker` of actor rank `rank`.
    pub fn global_worker(&self, rank: usize, worker: usize) -> usize {
        self.group(rank) / self.learners * self.workers_per_actor + worker
    }

    /// The actor rank and its own index of the learner rank's worker `global`.
    pub fn actor_worker(&self, global: usize) -> (usize, usize) {
        let g = self.learner() + global / self.workers_per_actor * self.learners;
        (self.lead(g), global % self.workers_per_actor)
    }

    /// The whole job's index of this actor rank's worker `worker` (its envs are seeded by it).
    pub fn run_worker(&self, worker: usize) -> usize {
        self.group(self.me) * self.workers_per_actor + worker
    }
}

/// What arrived could not be delivered (`link_failed`, from a receiving thread to its link): the run stops with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LinkFailed {
    /// What went wrong, on one line.
    pub message: String,
}

/// An actor rank stopped on its own (`actor_stopped`, from the learner rank's receiving thread).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ActorStopped {
    /// The actor rank.
    pub rank: usize,
    /// Why, as it reported.
    pub error: Option<String>,
    /// The signal that stopped it (SIGTERM to every rank from `mpirun` or a scheduler, most often).
    pub signal: Option<i32>,
}

/// The inlets of the learner rank's receiving thread.
#[derive(Debug)]
pub(crate) struct LearnerInlets {
    /// The pools of every actor rank's workers, by the learner rank's worker index.
    pub pools: Vec<TrajectoryPool>,
    /// This rank's trajectory counters, where the receiving thread counts the remote workers' trajectories as
    /// they arrive (and their lost frames), for the run's summary.
    pub counters: ShmArray<u64>,
    pub trajectory_ready: Inlet<TrajectoryReady>,
    pub worker_started: Inlet<WorkerStarted>,
    pub rollout_reported: Inlet<RolloutReport>,
    pub actor_stopped: Inlet<ActorStopped>,
    pub link_failed: Inlet<LinkFailed>,
}

/// What both links have: where the ranks are, the sending thread's queue, and the heartbeats.
struct Peers {
    ranks: Ranks,
    outgoing: Postbox,
    liveness: Arc<Liveness>,
    heartbeat: Duration,
}

impl Peers {
    /// A heartbeat to `rank` (`what`, for the message, names its kind); an error when it has been silent for the
    /// whole heartbeat interval.
    fn beat(&self, rank: usize, tag: Tag, what: &str) -> Result<()> {
        post(&self.outgoing, rank, tag, &Wire::Alive)?;
        let silent = self.liveness.silent_for(rank);
        if silent > self.heartbeat {
            return Err(RlfError::Protocol {
                component: "mpi link",
                message: format!(
                    "{what} {rank} sent nothing for {:.1} s (--heartbeat_interval {:.1} s): it is hung or gone",
                    silent.as_secs_f64(),
                    self.heartbeat.as_secs_f64()
                ),
            });
        }
        Ok(())
    }
}

/// The learner rank's signals emitted on behalf of the actor ranks' rollout workers.
#[derive(Debug, Clone, Copy)]
pub(in crate::runner) struct LearnerLinkSignals {
    pub trajectory_ready: Signal<TrajectoryReady>,
    pub worker_started: Signal<WorkerStarted>,
    pub rollout_reported: Signal<RolloutReport>,
    pub actor_stopped: Signal<ActorStopped>,
    pub link_failed: Signal<LinkFailed>,
}

/// The learner rank's end: releases and new weights go to the actor ranks.
pub(in crate::runner) struct LearnerLink {
    peers: Peers,
    signals: LearnerLinkSignals,
    inlets: Option<Sender<LearnerInlets>>,
    pools: Option<Result<(Vec<TrajectoryPool>, ShmArray<u64>)>>,
    weights: Result<Vec<SharedWeights>>,
    scratch: Vec<f32>,
}

impl LearnerLink {
    /// The link of `ranks`, posting to `outgoing` and handing its inlets, the actor ranks' workers' `pools` and the
    /// rank's counters to the receiving thread through `inlets`; it reads each policy's published `weights`.
    pub fn new(
        ranks: Ranks,
        signals: LearnerLinkSignals,
        ends: LinkEnds,
        heartbeat: Duration,
        pools: Result<(Vec<TrajectoryPool>, ShmArray<u64>)>,
        weights: Result<Vec<SharedWeights>>,
    ) -> Self {
        Self {
            peers: Peers {
                ranks,
                outgoing: ends.outgoing,
                liveness: ends.liveness,
                heartbeat,
            },
            signals,
            inlets: ends.learner_inlets,
            pools: Some(pools),
            weights,
            scratch: Vec::new(),
        }
    }

    /// Every quarter of the heartbeat interval: a heartbeat to every rank of its env groups, and the run stops when
    /// one has been silent for the whole interval.
    fn beat(&mut self, ctx: &mut Ctx<'_, Self>) {
        for rank in self.peers.ranks.group_ranks() {
            let what = if self.peers.ranks.feeds_me(rank) {
                "actor rank"
            } else {
                "env group member rank"
            };
            if let Err(e) = self.peers.beat(rank, TO_ACTOR, what) {
                return ctx.fail(e);
            }
        }
    }

    /// The batcher released slot `released.buffer` of the learner rank's worker `global`.
    pub fn on_buffer_released(&mut self, ctx: &mut Ctx<'_, Self>, global: usize, released: &BufferReleased) {
        let (rank, worker) = self.peers.ranks.actor_worker(global);
        let message = Wire::Released {
            worker,
            buffer: released.buffer,
        };
        or_fail(ctx, post(&self.peers.outgoing, rank, TO_ACTOR, &message));
    }

    /// The batcher's answer to a started worker.
    pub fn on_slots_reclaimed(&mut self, ctx: &mut Ctx<'_, Self>, global: usize, reclaimed: &SlotsReclaimed) {
        let (rank, worker) = self.peers.ranks.actor_worker(global);
        let message = Wire::Reclaimed {
            worker,
            reclaimed: reclaimed.clone(),
        };
        or_fail(ctx, post(&self.peers.outgoing, rank, TO_ACTOR, &message));
    }

    /// A new policy version: its weights go to every actor rank (a newer publication may already have replaced
    /// them: the version read is the one sent).
    pub fn on_policy_updated(&mut self, ctx: &mut Ctx<'_, Self>, update: &PolicyUpdated) {
        let sent = self.send_weights(update.policy);
        or_fail(ctx, sent);
    }

    fn send_weights(&mut self, policy: usize) -> Result<()> {
        let weights = self.weights.as_ref().map_err(|e| RlfError::Protocol {
            component: "mpi link",
            message: e.to_string(),
        })?;
        let shared = weights.get(policy).ok_or_else(|| RlfError::Protocol {
            component: "mpi link",
            message: format!("no weights of policy {policy}"),
        })?;
        self.scratch.resize(shared.len(), 0.0);
        // A read that overlaps the learner's next publication is torn: the next `policy_updated` sends that one.
        let Ok(version) = shared.try_read(&mut self.scratch) else {
            return Ok(());
        };
        let message = Wire::Weights {
            policy,
            version,
            values: std::mem::take(&mut self.scratch),
        };
        let bytes = message.encode()?;
        if let Wire::Weights { values, .. } = message {
            self.scratch = values;
        }
        for dest in self.peers.ranks.actor_ranks() {
            self.peers.outgoing.send(Outgoing {
                dest,
                tag: TO_ACTOR,
                bytes: bytes.clone(),
                weights_of: Some(policy),
            })?;
        }
        Ok(())
    }

    /// The receiving thread could not deliver what arrived: the run stops.
    pub fn on_link_failed(&mut self, ctx: &mut Ctx<'_, Self>, failed: &LinkFailed) {
        ctx.fail(&failed.message);
    }

    /// An actor rank stopped while this one runs: the run stops, naming it. One stopped by a signal was asked to
    /// stop as this rank is (or soon will be): the run stops as if this rank had been asked, keeping everything.
    pub fn on_actor_stopped(&mut self, ctx: &mut Ctx<'_, Self>, stopped: &ActorStopped) {
        match (&stopped.error, stopped.signal) {
            (Some(e), _) => ctx.fail(format!("actor rank {} stopped: {e}", stopped.rank)),
            (None, Some(_)) if ctx.stopping() => {}
            (None, Some(signal)) => {
                eprintln!(
                    "[rlfactory] actor rank {} was stopped by signal {signal}: the run stops",
                    stopped.rank
                );
                ctx.stop_app();
            }
            (None, None) => ctx.fail(format!("actor rank {} stopped before the learner", stopped.rank)),
        }
    }
}

impl Component for LearnerLink {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        ctx.timer_periodic(self.peers.heartbeat / 4, LearnerLink::beat);
        let (pools, counters) = match self.pools.take() {
            Some(Ok(mapped)) => mapped,
            Some(Err(e)) => return ctx.fail(e),
            None => return,
        };
        let inlets = LearnerInlets {
            pools,
            counters,
            trajectory_ready: ctx.inlet(&self.signals.trajectory_ready),
            worker_started: ctx.inlet(&self.signals.worker_started),
            rollout_reported: ctx.inlet(&self.signals.rollout_reported),
            actor_stopped: ctx.inlet(&self.signals.actor_stopped),
            link_failed: ctx.inlet(&self.signals.link_failed),
        };
        if self.inlets.take().is_none_or(|to| to.send(inlets).is_err()) {
            ctx.fail("no receiving thread takes this link's inlets");
        }
    }
}

/// An actor rank's stop was asked for by the learner rank (`stop_requested`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StopRequested;

/// The inlets of an actor rank's receiving thread.
#[derive(Debug)]
pub(crate) struct ActorInlets {
    /// Each policy's published weights on this rank.
    pub weights: Vec<SharedWeights>,
    /// Each rollout worker's.
    pub buffer_released: Vec<Inlet<BufferReleased>>,
    /// Each rollout worker's.
    pub slots_reclaimed: Vec<Inlet<SlotsReclaimed>>,
    pub policy_updated: Inlet<PolicyUpdated>,
    pub stop_requested: Inlet<StopRequested>,
    pub link_failed: Inlet<LinkFailed>,
}

/// An actor rank's signals emitted on behalf of the learner rank.
#[derive(Debug, Clone)]
pub(in crate::runner) struct ActorLinkSignals {
    pub buffer_released: Vec<Signal<BufferReleased>>,
    pub slots_reclaimed: Vec<Signal<SlotsReclaimed>>,
    pub policy_updated: Signal<PolicyUpdated>,
    pub stop_requested: Signal<StopRequested>,
    pub link_failed: Signal<LinkFailed>,
}

/// An actor rank's end: its rollout workers' trajectories, starts and reports go to the learner rank.
pub(in crate::runner) struct ActorLink {
    peers: Peers,
    signals: ActorLinkSignals,
    inlets: Option<Sender<ActorInlets>>,
    pools: Result<Vec<TrajectoryPool>>,
    weights: Option<Result<Vec<SharedWeights>>>,
}

impl ActorLink {
    /// An actor rank's link, reading its workers' `pools`; the receiving thread publishes into `weights`.
    pub fn new(
        ranks: Ranks,
        signals: ActorLinkSignals,
        ends: LinkEnds,
        heartbeat: Duration,
        pools: Result<Vec<TrajectoryPool>>,
        weights: Result<Vec<SharedWeights>>,
    ) -> Self {
        Self {
            peers: Peers {
                ranks,
                outgoing: ends.outgoing,
                liveness: ends.liveness,
                heartbeat,
            },
            signals,
            inlets: ends.actor_inlets,
            pools,
            weights: Some(weights),
        }
    }

    /// Every quarter of the heartbeat interval: a heartbeat to the learner rank, and this rank stops when the learner
    /// rank has been silent for the whole interval.
    fn beat(&mut self, ctx: &mut Ctx<'_, Self>) {
        let rank = self.peers.ranks.learner();
        if let Err(e) = self.peers.beat(rank, TO_LEARNER, "the learner rank") {
            ctx.fail(e);
        }
    }

    fn to_learner(&self, message: &Wire) -> Result<()> {
        post(
            &self.peers.outgoing,
            self.peers.ranks.learner(),
            TO_LEARNER,
            message,
        )
    }

    /// A finished trajectory: its slot, copied, goes to the learner rank (the slot stays taken until released).
    pub fn on_trajectory_ready(&mut self, ctx: &mut Ctx<'_, Self>, ready: &TrajectoryReady) {
        let sent = self
            .pools
            .as_ref()
            .map_err(|e| RlfError::Protocol {
                component: "mpi link",
                message: e.to_string(),
            })
            .and_then(|pools| {
                let pool = pools.get(ready.worker).ok_or_else(|| RlfError::Protocol {
                    component: "mpi link",
                    message: format!("no pool of worker {}", ready.worker),
                })?;
                let slot = pool.read_slot(ready.buffer)?;
                self.to_learner(&Wire::Trajectory { ready: *ready, slot })
            });
        or_fail(ctx, sent);
    }

    pub fn on_worker_started(&mut self, ctx: &mut Ctx<'_, Self>, started: &WorkerStarted) {
        let sent = self.to_learner(&Wire::Started(*started));
        or_fail(ctx, sent);
    }

    /// Progress goes to this rank's learner and, with several learners, to learner 0 too, whose runner counts the
    /// whole job (its progress line, `--train_for_env_steps`, `--stop_at_reward`).
    pub fn on_rollout_reported(&mut self, ctx: &mut Ctx<'_, Self>, report: &RolloutReport) {
        let message = Wire::Report(report.clone());
        let mut sent = self.to_learner(&message);
        if self.peers.ranks.learner() != 0 {
            sent = sent.and_then(|()| post(&self.peers.outgoing, 0, TO_LEARNER, &message));
        }
        or_fail(ctx, sent);
    }

    /// The receiving thread could not deliver what arrived: the rank stops (and tells its learner why).
    pub fn on_link_failed(&mut self, ctx: &mut Ctx<'_, Self>, failed: &LinkFailed) {
        ctx.fail(&failed.message);
    }

    /// The learner rank stopped: so does this rank.
    pub fn on_stop_requested(&mut self, ctx: &mut Ctx<'_, Self>, _stop: &StopRequested) {
        ctx.stop_app();
    }
}

impl Component for ActorLink {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        ctx.timer_periodic(self.peers.heartbeat / 4, ActorLink::beat);
        let weights = match self.weights.take() {
            Some(Ok(weights)) => weights,
            Some(Err(e)) => return ctx.fail(e),
            None => return,
        };
        let inlets = ActorInlets {
            weights,
            buffer_released: self
                .signals
                .buffer_released
                .iter()
                .map(|s| ctx.inlet(s))
                .collect(),
            slots_reclaimed: self
                .signals
                .slots_reclaimed
                .iter()
                .map(|s| ctx.inlet(s))
                .collect(),
            policy_updated: ctx.inlet(&self.signals.policy_updated),
            stop_requested: ctx.inlet(&self.signals.stop_requested),
            link_failed: ctx.inlet(&self.signals.link_failed),
        };
        if self.inlets.take().is_none_or(|to| to.send(inlets).is_err()) {
            ctx.fail("no receiving thread takes this link's inlets");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Ranks;

    /// 2 learners and 3 env groups of 2 ranks (ranks 2-3, 4-5, 6-7): groups 0 and 2 feed learner 0, group 1
    /// learner 1; workers are numbered by learner, and back.
    #[test]
    fn ranks_of_env_groups() {
        let at = |me| Ranks {
            learners: 2,
            actors: 3,
            per_env: 2,
            workers_per_actor: 2,
            me,
        };
        assert_eq!(at(0).actor_ranks().collect::<Vec<_>>(), [2, 6]);
        assert_eq!(at(1).actor_ranks().collect::<Vec<_>>(), [4]);
        assert_eq!(at(0).group_ranks(), [2, 3, 6, 7]);
        assert_eq!(at(0).heard_ranks(), [2, 3, 4, 6, 7]);
        assert_eq!(at(1).heard_ranks(), [4, 5]);
        assert!(at(0).feeds_me(6) && !at(0).feeds_me(7) && !at(0).feeds_me(4));
        assert_eq!((at(7).learner(), at(5).learner()), (0, 1));
        assert!(at(7).is_member() && !at(6).is_member() && !at(1).is_member());
        assert_eq!(at(7).my_group(), [6, 7]);
        assert_eq!(at(0).global_worker(6, 1), 3);
        assert_eq!(at(0).actor_worker(3), (6, 1));
        assert_eq!(at(6).run_worker(1), 5);
    }
}
