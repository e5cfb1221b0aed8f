//! [`Learner`] (APPO) or [`OffPolicyLearner`] (DQN, SAC) on its loop, with the experiment's checkpoints (one learner per
//! policy).

use std::time::{Duration, Instant};

use rlf_shm::SharedWeights;
use rlf_signal::{Component, Ctx, Signal};
use serde::{Deserialize, Serialize};

use super::{or_fail, sent};
use crate::algo::adam::GradientSync;
use crate::algo::allreduce::AllreduceGradients;
use crate::config::{snapshot_slot, LrScheduleKind};
use crate::env::{EnvRegistry, EnvSpec};
use crate::error::{Result, RlfError};
use crate::experiment::{CheckpointRequest, Checkpointer, PoolSnapshot, Resumed};
use crate::learning::{
    Batch, KeptLearner, Learner, OffPolicyLearner, PbtUpdate, PbtWeightsSaved, PolicyUpdated, Round,
    TrainingReport,
};
use crate::model::Draws;
use crate::plan::RunPlan;
use crate::runner::mpi::LearnerSync;
use crate::runner::plane::{seed_policy, transition_layout, DataPlane};
use crate::sampling::{RolloutReport, SnapshotRequest, SnapshotTaken};

/// What the learner emits.
#[derive(Clone, Copy)]
pub(in crate::runner) struct LearnerSignals {
    pub policy_updated: Signal<PolicyUpdated>,
    pub training_reported: Signal<TrainingReport>,
    /// With `--self_play`.
    pub snapshot_taken: Option<Signal<SnapshotTaken>>,
    /// With `--with_pbt`.
    pub pbt_weights_saved: Option<Signal<PbtWeightsSaved>>,
    /// Off-policy: the learner's signal to itself to train another round.
    pub train_tick: Option<Signal<TrainTick>>,
}

/// Train another round (an off-policy learner's signal to itself, so that its loop answers between rounds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::runner) struct TrainTick;

/// A learner's kept state besides its checkpoint (see [`Component::save`]).
#[derive(Serialize, Deserialize)]
enum KeptTrainer {
    OnPolicy((Draws, (u64, Vec<f32>))),
    OffPolicy(KeptLearner),
}

/// What the learner's loop builds in its process.
struct Setup {
    learner: Trainer,
    /// The slots of the policy's self-play pool.
    pool: Vec<SharedWeights>,
    /// With an experiment folder: the checkpointer and what the checkpoint resumed from holds besides the learner's
    /// state.
    checkpointer: Option<(Checkpointer, Resumed)>,
}

/// The learner of either kind.
enum Trainer {
    /// APPO, on the batcher's datasets.
    OnPolicy(Box<Learner>),
    /// DQN or SAC, on the policy's replay buffer.
    OffPolicy(Box<OffPolicyLearner>),
}

pub(in crate::runner) struct LearnerNode {
    learner: Option<Learner>,
    off_policy: Option<OffPolicyLearner>,
    /// How long an off-policy round waits for data before the loop answers messages again.
    round_wait: Duration,
    setup: Option<Result<Setup>>,
    signals: LearnerSignals,
    checkpointer: Option<Checkpointer>,
    /// The runner's latest counts, for the checkpoint saved at stop.
    progress: CheckpointRequest,
    /// The policy version of the last checkpoint saved.
    saved_version: Option<u64>,
    pool: Vec<SharedWeights>,
    /// What each slot of the pool holds (saved with the checkpoints).
    pool_snapshots: Vec<Option<PoolSnapshot>>,
    /// `--self_play_keep_first`.
    keep_first: bool,
    /// `--save_replay_buffer` (off-policy).
    save_replay: bool,
    /// The rollout workers of this process group that write into the policy's replay buffer: the last save waits
    /// for their last rows.
    replay_writers: u32,
}

/// How long an off-policy learner's last save waits for the rollout workers' last rows.
const WRITERS_WAIT: Duration = Duration::from_secs(1);

impl LearnerNode {
    /// The learner of policy `policy`, in its loop's process; with an experiment folder it
    /// continues from the policy's newest intact checkpoint.
    pub fn new(
        policy: usize,
        plan: &RunPlan,
        registry: &EnvRegistry,
        plane: &DataPlane,
        signals: LearnerSignals,
        sync: Option<LearnerSync>,
    ) -> Self {
        let cfg = &plan.config;
        let setup = if plan.learns_from_replay {
            off_policy_setup(policy, plan, plane)
        } else {
            on_policy_setup(policy, plan, registry, plane, sync)
        };
        Self {
            learner: None,
            off_policy: None,
            round_wait: Duration::from_secs_f64(cfg.run.heartbeat_interval / 5.0),
            setup: Some(setup),
            signals,
            checkpointer: None,
            progress: CheckpointRequest::default(),
            saved_version: None,
            pool: Vec::new(),
            pool_snapshots: Vec::new(),
            keep_first: cfg.sampling.self_play_keep_first,
            save_replay: cfg.off_policy.save_replay_buffer,
            replay_writers: 0,
        }
    }

    /// Off-policy: `writers` rollout workers of this process group write into the policy's replay buffer.
    pub fn with_replay_writers(self, writers: usize) -> Self {
        Self {
            replay_writers: writers as u32,
            ..self
        }
    }
}

/// A learner on the trajectory slots (APPO's), continuing from the policy's newest checkpoint if any.
/// With `sync`, one of several learners of the policy (on MPI ranks): they start from the same seed, and none resumes.
fn on_policy_setup(
    policy: usize,
    plan: &RunPlan,
    registry: &EnvRegistry,
    plane: &DataPlane,
    sync: Option<LearnerSync>,
) -> Result<Setup> {
    let cfg = &plan.config;
    let rules = match cfg.appo.lookahead_coeff > 0.0 {
        true => EnvSpec::ply_model(registry, &cfg.env)?,
        false => None,
    };
    if cfg.run.learner_threads > 0 {
        // The learner's own process (in serial mode, the one loop's).
        tch::set_num_threads(cfg.run.learner_threads);
    }
    // With several learners, the collective that makes the learner communicator comes first, before anything that
    // can fail on one learner alone; after it, a learner that cannot go on tells the others (`finish`) before it
    // fails, or they would wait for it in their first allreduce.
    let mut sync = sync
        .map(|s| Ok::<_, RlfError>(AllreduceGradients::new(s.learners()?, s.check_every)))
        .transpose()?;
    let algorithm = plan.algorithm()?;
    let built = plan
        .policy_spaces(policy)
        .and_then(|(observation_space, action_space)| {
            let algo = algorithm
                .on_policy_learner(
                    observation_space,
                    action_space,
                    cfg,
                    &|| seed_policy(cfg, policy),
                    rules.clone(),
                )?
                .ok_or_else(|| {
                    RlfError::Config(format!("--algo {} learns from no trajectories", algorithm.name()))
                })?;
            let policies = (policy, cfg.num_networks());
            let mut learner = Learner::new(algo, policies, plane.open_weights(policy)?, plane.open_pools()?);
            if cfg.is_exploiter(policy) && cfg.sampling.self_play_exploiter_reset > 0.0 {
                learner.reset_when_winning(cfg.sampling.self_play_exploiter_reset)?;
            }
            let checkpointer = if cfg.run.save_experiment {
                Some(Checkpointer::open_and_resume(cfg, policy, &mut learner)?)
            } else {
                None
            };
            if sync.is_some() && learner.version() > 0 {
                return Err(RlfError::Config(
                "several learner ranks cannot resume a checkpoint yet (their Adam moments would differ): \
                 start a new experiment (--restart_behavior restart)"
                    .into(),
            ));
            }
            Ok((learner, checkpointer))
        });
    let (learner, checkpointer) = match (built, sync.take()) {
        (Ok((mut learner, checkpointer)), Some(sync)) => {
            learner.set_gradient_sync(Box::new(sync));
            (learner, checkpointer)
        }
        (Ok((learner, checkpointer)), None) => (learner, checkpointer),
        (Err(e), Some(mut sync)) => {
            // The network's size, for the collective the others wait in (a model that cannot be built fails on
            // every learner alike).
            let (observation_space, action_space) = plan.policy_spaces(policy)?;
            let parameters = algorithm
                .acting_network(observation_space, action_space, cfg)?
                .variables()
                .trainable()
                .iter()
                .map(|(_, t)| t.numel())
                .sum();
            sync.finish(parameters)?;
            return Err(e);
        }
        (Err(e), None) => return Err(e),
    };
    let slots = if cfg.sampling.self_play {
        cfg.sampling.opponent_pool_size
    } else {
        0
    };
    let pool = (0..slots)
        .map(|k| plane.open_weights(cfg.snapshot_network(policy, k)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Setup {
        learner: Trainer::OnPolicy(Box::new(learner)),
        pool,
        checkpointer,
    })
}

/// The transitions policy `policy`'s replay buffer takes over the run: its share of `--train_for_env_steps` (which
/// counts every agent's steps), by the agents `--agent_policy_map` gives it, else an even share of the policies.
fn expected_inserts(plan: &RunPlan, policy: usize) -> u64 {
    let mapping = &plan.mapping;
    let share = match &mapping.by_agent {
        Some(by_agent) => {
            by_agent.iter().filter(|&&p| p == policy).count() as f64 / by_agent.len().max(1) as f64
        }
        None => 1.0 / mapping.num_policies.max(1) as f64,
    };
    (plan.config.run.train_for_env_steps as f64 * share).ceil() as u64
}

/// A DQN or SAC learner on the policy's replay buffer, continuing from its newest checkpoint if any (weights, target
/// networks and Adam) and from the buffer the data plane restored (its priorities, counters and schedules).
fn off_policy_setup(policy: usize, plan: &RunPlan, plane: &DataPlane) -> Result<Setup> {
    let cfg = &plan.config;
    let o = &cfg.off_policy;
    let layout = transition_layout(plan, policy)?;
    let (observation_space, action_space) = plan.policy_spaces(policy)?;
    let seed = || seed_policy(cfg, policy);
    let algorithm = plan.algorithm()?;
    let algo = algorithm
        .off_policy_learner(observation_space, action_space, cfg, &seed)?
        .ok_or_else(|| {
            RlfError::Config(format!(
                "--algo {} learns from no replay buffer",
                algorithm.name()
            ))
        })?;
    let mut learner = OffPolicyLearner::new(
        algo,
        policy,
        plane.open_weights(policy)?,
        plane.open_replay(policy)?,
        layout,
        (cfg.learning.batch_size, o.learning_starts, o.publish_interval),
        cfg.env.seed.wrapping_add(policy as u64 * 7919),
    )?
    .with_replay_ratio(o.replay_ratio);
    if o.prioritized_replay {
        let exponents = (
            o.prioritized_replay_alpha,
            o.prioritized_replay_beta,
            o.prioritized_replay_eps,
        );
        learner = learner.with_prioritized_replay(exponents, expected_inserts(plan, policy));
    }
    if cfg.optimizer.lr_schedule == LrScheduleKind::LinearDecay {
        learner = learner.with_linear_lr_decay(cfg.optimizer.learning_rate, expected_inserts(plan, policy));
    }
    let mut checkpointer = if cfg.run.save_experiment {
        Some(Checkpointer::open_and_resume(cfg, policy, &mut learner)?)
    } else {
        None
    };
    if let (Some(Some(saved_at)), Some((checkpointer, _))) =
        (plane.replays_restored.get(policy), &mut checkpointer)
    {
        // The data plane restored the rows and counters; the priorities are the learner's.
        let saved = match o.prioritized_replay {
            true => crate::experiment::load_replay(cfg, policy)?,
            false => None,
        };
        let first = saved.as_ref().map_or(0, |s| s.snapshot.first);
        let priorities = saved.as_ref().and_then(|s| s.snapshot.priorities.as_ref());
        learner.continue_with_restored_buffer(first, priorities);
        if *saved_at != learner.version() {
            checkpointer.log(&format!(
                "policy {policy}: its replay buffer was saved at version {saved_at}, its checkpoint at {}",
                learner.version()
            ))?;
        }
    }
    Ok(Setup {
        learner: Trainer::OffPolicy(Box::new(learner)),
        pool: Vec::new(),
        checkpointer,
    })
}

impl LearnerNode {
    /// Every `--snapshot_every_env_steps` with `--self_play`: the current weights go into the
    /// next slot of the policy's pool (replacing the oldest snapshot once it is full, but the first with
    /// `--self_play_keep_first`).
    pub fn on_snapshot_requested(&mut self, ctx: &mut Ctx<'_, Self>, request: &SnapshotRequest) {
        let (Some(learner), Some(signal)) = (&self.learner, self.signals.snapshot_taken) else {
            return;
        };
        if self.pool.is_empty() || request.number == 0 {
            return;
        }
        let slot = snapshot_slot(request.number, self.pool.len(), self.keep_first);
        let taken = learner
            .snapshot(&self.pool[slot], request.number)
            .and_then(|version| {
                self.pool_snapshots[slot] = Some(PoolSnapshot {
                    slot,
                    number: request.number,
                    version,
                });
                let taken = SnapshotTaken {
                    policy: learner.policy(),
                    slot,
                    number: request.number,
                    version,
                };
                sent(ctx.emit(&signal, &taken))
            });
        or_fail(ctx, taken);
    }

    /// The pool's snapshots a resumed checkpoint holds go back into their slots, announced as if just taken (a
    /// snapshot whose slot or size no longer fits the pool, after a change of `--opponent_pool_size`, is left out
    /// and logged). A resumed run (`resuming`) with no snapshot to put back (a checkpoint from before pools were
    /// saved, or from a lost learner's weights) starts its pool with the resumed weights, snapshot 1, as a fresh run
    /// starts it with the initial ones (the runner's schedule continues after the resumed frames).
    fn restore_pool(
        &mut self,
        ctx: &mut Ctx<'_, Self>,
        snapshots: Vec<(PoolSnapshot, Vec<f32>)>,
        resuming: bool,
    ) -> Result<()> {
        let (Some(learner), Some(signal)) = (&self.learner, self.signals.snapshot_taken) else {
            return Ok(());
        };
        if self.pool.is_empty() {
            return Ok(());
        }
        let mut restored = Vec::new();
        for (snapshot, values) in snapshots {
            match self.pool.get(snapshot.slot) {
                Some(slot) if slot.len() == values.len() => {
                    slot.publish(snapshot.number, &values);
                    self.pool_snapshots[snapshot.slot] = Some(snapshot);
                    restored.push(snapshot.number.to_string());
                    let taken = SnapshotTaken {
                        policy: learner.policy(),
                        slot: snapshot.slot,
                        number: snapshot.number,
                        version: snapshot.version,
                    };
                    sent(ctx.emit(&signal, &taken))?;
                }
                _ => {
                    if let Some(checkpointer) = &mut self.checkpointer {
                        checkpointer.log(&format!(
                            "self-play: snapshot {} of policy {} does not fit a pool of {} slots; left out",
                            snapshot.number,
                            learner.policy(),
                            self.pool.len()
                        ))?;
                    }
                }
            }
        }
        if let (false, Some(checkpointer)) = (restored.is_empty(), &mut self.checkpointer) {
            checkpointer.log(&format!(
                "self-play: policy {} continues with the snapshots of its pool (numbers {})",
                learner.policy(),
                restored.join(", ")
            ))?;
        }
        if restored.is_empty() && resuming {
            self.on_snapshot_requested(ctx, &SnapshotRequest { number: 1 });
        }
        Ok(())
    }

    /// The pool's snapshots and their values, for a checkpoint (the learner alone writes the slots: a read is never
    /// torn).
    fn pool_state(&self) -> Result<Vec<(PoolSnapshot, Vec<f32>)>> {
        self.pool_snapshots
            .iter()
            .flatten()
            .map(|&snapshot| {
                let slot = &self.pool[snapshot.slot];
                let mut values = vec![0.0; slot.len()];
                slot.try_read(&mut values).map_err(|_| RlfError::Protocol {
                    component: "learner",
                    message: format!("self-play pool slot {} changed while read", snapshot.slot),
                })?;
                Ok((snapshot, values))
            })
            .collect()
    }

    pub fn on_batch_ready(&mut self, ctx: &mut Ctx<'_, Self>, batch: &Batch) {
        let Some(learner) = &mut self.learner else { return };
        let resets = learner.resets();
        let result = learner.on_batch_ready(batch).and_then(|(update, report)| {
            if let Some(checkpointer) = self.checkpointer.as_mut().filter(|_| learner.resets() > resets) {
                checkpointer.log(&format!(
                    "self-play: exploiter policy {} reached --self_play_exploiter_reset's win rate against the mains \
                     and went back to its initial weights (as its version {})",
                    update.policy, update.version
                ))?;
            }
            sent(ctx.emit(&self.signals.policy_updated, &update))?;
            sent(ctx.emit(&self.signals.training_reported, &report))
        });
        match result {
            // Another learner of the policy stopped (several learner ranks): so does this run.
            Err(RlfError::LearnersStopped) => ctx.stop_app(),
            result => or_fail(ctx, result),
        }
    }

    pub fn on_progress_reported(&mut self, _ctx: &mut Ctx<'_, Self>, progress: &CheckpointRequest) {
        self.progress.clone_from(progress);
    }

    /// Every `--save_every_sec`: saves, unless no SGD step was taken since the last checkpoint
    /// (requests that queued while the learner was busy then cost nothing).
    pub fn on_checkpoint_requested(&mut self, ctx: &mut Ctx<'_, Self>, request: &CheckpointRequest) {
        self.progress.clone_from(request);
        let version = self
            .learner
            .as_ref()
            .map(Learner::version)
            .or_else(|| self.off_policy.as_ref().map(OffPolicyLearner::version));
        if version.is_some() && version == self.saved_version {
            return;
        }
        let saved = self.save_checkpoint().map(drop);
        or_fail(ctx, saved);
    }

    fn save_checkpoint(&mut self) -> Result<Option<std::path::PathBuf>> {
        self.save_checkpoint_for(None)
    }

    /// Saves a checkpoint: a regular one, or with `Some(policy)` one handed to that policy's learner
    /// (see [`Checkpointer::save_for_policy`]).
    fn save_checkpoint_for(&mut self, to: Option<usize>) -> Result<Option<std::path::PathBuf>> {
        if self.checkpointer.is_none() {
            return Ok(None);
        }
        let (state, version) = match (&self.learner, &self.off_policy) {
            (Some(learner), _) => (learner.state()?, learner.version()),
            (None, Some(learner)) => (learner.state()?, learner.version()),
            (None, None) => return Ok(None),
        };
        let pool = self.pool_state()?;
        let Some(checkpointer) = &mut self.checkpointer else {
            return Ok(None);
        };
        let path = match to {
            Some(to) => checkpointer.save_for_policy(to, state, &self.progress, &pool)?,
            None => {
                let path = checkpointer.save(state, &self.progress, &pool)?;
                self.saved_version = Some(version);
                if let (true, Some(learner)) = (self.save_replay, &self.off_policy) {
                    checkpointer.save_replay(learner.replay_snapshot(), version, self.progress.env_steps)?;
                }
                path
            }
        };
        Ok(Some(path))
    }

    /// Off-policy in serial mode: after a trajectory, the SGD steps its transitions are due.
    pub fn on_rollout_reported(&mut self, ctx: &mut Ctx<'_, Self>, _report: &RolloutReport) {
        let Some(learner) = &mut self.off_policy else {
            return;
        };
        let result = learner.train_due().and_then(|round| match round {
            Round::Trained { report, update } => {
                if let Some(update) = update {
                    sent(ctx.emit(&self.signals.policy_updated, &update))?;
                }
                sent(ctx.emit(&self.signals.training_reported, &report))
            }
            Round::Waited | Round::Stopped => Ok(()),
        });
        or_fail(ctx, result);
    }

    /// Off-policy: one round of training (a wait for data, then SGD steps while the buffer allows), its report
    /// and publication emitted, and the next round asked for; none once the run stops (the buffer closed, or this
    /// loop told to stop: without a rate limit a round never waits), so that the loop drains and saves.
    pub fn on_train_tick(&mut self, ctx: &mut Ctx<'_, Self>, _tick: &TrainTick) {
        let (Some(learner), Some(tick)) = (&mut self.off_policy, self.signals.train_tick) else {
            return;
        };
        if ctx.stopping() {
            return;
        }
        let result = learner
            .train_round(Instant::now() + self.round_wait)
            .and_then(|round| match round {
                Round::Trained { report, update } => {
                    if let Some(update) = update {
                        sent(ctx.emit(&self.signals.policy_updated, &update))?;
                    }
                    sent(ctx.emit(&self.signals.training_reported, &report))?;
                    sent(ctx.emit(&tick, &TrainTick))
                }
                Round::Waited => sent(ctx.emit(&tick, &TrainTick)),
                Round::Stopped => Ok(()),
            });
        or_fail(ctx, result);
    }

    /// A PBT update: the learner of the policy whose weights are taken saves a checkpoint for it
    /// and says where; the updated policy's learner takes new hyper-parameters at once, or with
    /// those weights once they are saved.
    pub fn on_pbt_update(&mut self, ctx: &mut Ctx<'_, Self>, update: &PbtUpdate) {
        let Some(me) = self.learner.as_ref().map(Learner::policy) else {
            return;
        };
        let result = match update.replace_from {
            Some(from) if from == me && update.policy != me => {
                self.save_checkpoint_for(Some(update.policy)).and_then(|path| {
                    let (Some(path), Some(signal)) = (path, self.signals.pbt_weights_saved) else {
                        return Ok(());
                    };
                    sent(ctx.emit(
                        &signal,
                        &PbtWeightsSaved {
                            update: *update,
                            path,
                        },
                    ))
                })
            }
            None if update.policy == me => {
                if let Some(learner) = &mut self.learner {
                    learner.set_hyper(&update.hyper);
                }
                match &mut self.checkpointer {
                    Some(checkpointer) => checkpointer.log(&format!(
                        "pbt: policy {me} trains with learning rate {:e}",
                        update.hyper.learning_rate
                    )),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        };
        or_fail(ctx, result);
    }

    /// The checkpoint a PBT update of this policy takes its weights from is saved: loaded,
    /// adopted (published under this policy's next version) and the new hyper-parameters set.
    pub fn on_pbt_weights_saved(&mut self, ctx: &mut Ctx<'_, Self>, saved: &PbtWeightsSaved) {
        let Some(learner) = &mut self.learner else { return };
        if saved.update.policy != learner.policy() {
            return;
        }
        let result = crate::experiment::load_path(&saved.path).and_then(|state| {
            let update = learner.adopt(&state.tensors)?;
            learner.set_hyper(&saved.update.hyper);
            if let Some(checkpointer) = &mut self.checkpointer {
                checkpointer.log(&format!(
                    "pbt: policy {} loaded {} (policy {}'s weights) as its version {}",
                    update.policy,
                    saved.path.display(),
                    saved
                        .update
                        .replace_from
                        .map_or_else(|| "?".to_owned(), |p| p.to_string()),
                    update.version
                ))?;
            }
            sent(ctx.emit(&self.signals.policy_updated, &update))
        });
        or_fail(ctx, result);
    }
}

impl Component for LearnerNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        match self.setup.take() {
            Some(Ok(setup)) => {
                match setup.learner {
                    Trainer::OnPolicy(mut learner) => {
                        // A dataset can take longer than the heartbeat interval (pixels, many epochs): the
                        // learner beats between its SGD steps.
                        if let Some(mut pulse) = ctx.pulse() {
                            learner.set_after_step(Box::new(move || pulse.beat()));
                        }
                        self.learner = Some(*learner);
                    }
                    Trainer::OffPolicy(learner) => {
                        self.off_policy = Some(*learner);
                        if let Some(tick) = self.signals.train_tick {
                            let started = sent(ctx.emit(&tick, &TrainTick));
                            or_fail(ctx, started);
                        }
                    }
                }
                self.pool_snapshots = vec![None; setup.pool.len()];
                self.pool = setup.pool;
                if let Some((checkpointer, resumed)) = setup.checkpointer {
                    self.checkpointer = Some(checkpointer);
                    let resuming = resumed.progress.env_steps > 0;
                    self.progress = resumed.progress;
                    let restored = self.restore_pool(ctx, resumed.pool, resuming);
                    or_fail(ctx, restored);
                }
            }
            Some(Err(e)) => ctx.fail(e),
            None => {}
        }
    }

    /// The learner's state besides its checkpoint, and the counts its checkpoints carry.
    fn save(&mut self) -> std::result::Result<Option<Vec<u8>>, String> {
        let kept = match (&self.learner, &self.off_policy) {
            (Some(learner), _) => KeptTrainer::OnPolicy(learner.kept().map_err(|e| e.to_string())?),
            (None, Some(learner)) => KeptTrainer::OffPolicy(learner.kept().map_err(|e| e.to_string())?),
            (None, None) => return Err("the learner did not start".into()),
        };
        postcard::to_stdvec(&(kept, &self.progress))
            .map(Some)
            .map_err(|e| e.to_string())
    }

    fn restore(&mut self, state: &[u8]) -> std::result::Result<(), String> {
        let (kept, progress): (KeptTrainer, CheckpointRequest) =
            postcard::from_bytes(state).map_err(|e| e.to_string())?;
        match (kept, &mut self.learner, &mut self.off_policy) {
            (KeptTrainer::OnPolicy(kept), Some(learner), _) => learner.restore_kept(kept),
            (KeptTrainer::OffPolicy(kept), _, Some(learner)) => learner.restore_kept(kept),
            _ => return Err("the kept state is of another kind of learner".into()),
        }
        .map_err(|e| e.to_string())?;
        self.progress = progress;
        Ok(())
    }

    /// The last checkpoint, whatever stopped the run (the stop conditions, a fault elsewhere,
    /// SIGINT, SIGTERM).
    fn on_stop(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let (Some(learner), true, Some(_)) = (&self.off_policy, self.save_replay, &self.checkpointer) {
            // The rows and n-step windows the writers held as they stopped go into the saved buffer.
            learner.wait_for_writers(self.replay_writers, Instant::now() + WRITERS_WAIT);
        }
        let saved = self.save_checkpoint().map(drop);
        or_fail(ctx, saved);
        // After the checkpoint: with several learners this waits for the others' next collective.
        if let Some(learner) = &mut self.learner {
            let finished = learner.finish_sync();
            or_fail(ctx, finished);
        }
    }
}
