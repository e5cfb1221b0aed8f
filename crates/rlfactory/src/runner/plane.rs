//! The shared-memory data plane: the published weights of each policy, one trajectory pool per
//! rollout worker and the trajectory counters. The main process creates (and at the end removes) the regions;
//! every component maps them by their handles, which child processes receive inside the app's
//! configuration ([`GraphSpec`]).

use rlf_shm::{
    RateLimit, ReplayRing, ReplayRingHandle, SharedWeights, SharedWeightsHandle, ShmArray, ShmArrayHandle,
};
use serde::{Deserialize, Serialize};

use super::counters::CounterLayout;
use super::mpi::Ranks;
use super::summary::ReplaySummary;
use crate::config::Config;
use crate::data::{ObsLayout, TrajectoryPool, TrajectoryPoolHandle, TrajectoryShape, TransitionLayout};
use crate::error::{Result, RlfError};
use crate::model::{ActorCritic, Policy};
use crate::plan::RunPlan;
use crate::sampling::ReplayWriter;

/// Handles of the regions, for the processes that map them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct DataPlane {
    /// The published weights of each network: every policy's, by policy index, then the
    /// self-play snapshots ([`Config::snapshot_network`]).
    pub weights: Vec<SharedWeightsHandle>,
    pub pools: Vec<TrajectoryPoolHandle>,
    pub counters: ShmArrayHandle,
    /// Each policy's replay buffer (off-policy algorithms), by policy index.
    pub replays: Vec<ReplayRingHandle>,
    /// By policy index: the replay buffer was restored from the saved copy of this policy version
    /// ([`PlaneRegions::restore_replays`]).
    pub replays_restored: Vec<Option<u64>>,
}

impl DataPlane {
    /// Maps policy `policy`'s published weights.
    pub fn open_weights(&self, policy: usize) -> Result<SharedWeights> {
        let handle = self
            .weights
            .get(policy)
            .ok_or_else(|| crate::RlfError::Protocol {
                component: "data plane",
                message: format!("no weights for policy {policy}"),
            })?;
        Ok(SharedWeights::open(handle)?)
    }

    /// Maps policy `policy`'s replay buffer.
    pub fn open_replay(&self, policy: usize) -> Result<ReplayRing> {
        let handle = self
            .replays
            .get(policy)
            .ok_or_else(|| crate::RlfError::Protocol {
                component: "data plane",
                message: format!("no replay buffer for policy {policy}"),
            })?;
        Ok(ReplayRing::open(handle)?)
    }

    /// Maps every rollout worker's pool.
    pub fn open_pools(&self) -> Result<Vec<TrajectoryPool>> {
        self.pools.iter().map(TrajectoryPool::open).collect()
    }
}

/// What a child process rebuilds the graph from: the resolved config, the env's description (so that no child
/// builds an env to learn its spaces), the data plane and the part of the graph its rank runs.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct GraphSpec {
    pub plan: RunPlan,
    pub plane: DataPlane,
    pub part: RankPart,
}

/// The part of the component graph a process runs: all of it on one machine; under MPI's async workflow, the
/// batcher, learner and runner on the learner rank, the rollout and inference workers on each actor rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum RankPart {
    /// One machine.
    Whole,
    /// A learner rank: one pool per rollout worker of each actor rank that feeds it.
    Learner(Ranks),
    /// An actor rank: its own rollout workers' pools.
    Actor(Ranks),
}

impl RankPart {
    /// Whether this part steps envs.
    pub fn samples(self) -> bool {
        !matches!(self, RankPart::Learner(_))
    }

    /// Whether this part trains.
    pub fn learns(self) -> bool {
        !matches!(self, RankPart::Actor(_))
    }

    /// The rollout workers whose pools this part holds.
    pub fn pools(self, cfg: &Config) -> usize {
        match self {
            RankPart::Learner(r) => r.feeding_workers(),
            RankPart::Whole | RankPart::Actor(_) => cfg.sampling.num_workers,
        }
    }

    /// The rollout workers that feed this part's learner (on one machine, all of them).
    pub fn all_workers(self, cfg: &Config) -> usize {
        match self {
            RankPart::Learner(r) | RankPart::Actor(r) => r.feeding_workers(),
            RankPart::Whole => cfg.sampling.num_workers,
        }
    }

    /// The whole job's index of this part's rollout worker `i`.
    pub fn global_worker(self, i: usize) -> usize {
        match self {
            RankPart::Actor(r) => r.run_worker(i),
            RankPart::Whole | RankPart::Learner(_) => i,
        }
    }

    /// Where the ranks are (one machine: a learner rank 0 and no actor ranks).
    pub fn ranks(self) -> Ranks {
        match self {
            RankPart::Learner(r) | RankPart::Actor(r) => r,
            RankPart::Whole => Ranks {
                learners: 1,
                actors: 0,
                per_env: 1,
                workers_per_actor: 1,
                me: 0,
            },
        }
    }
}

/// The regions behind a [`DataPlane`], owned (and removed at the end) by the main process.
pub(super) struct PlaneRegions {
    /// Each network's published weights (see [`DataPlane::weights`]).
    pub weights: Vec<SharedWeights>,
    pools: Vec<TrajectoryPool>,
    pub counters: ShmArray<u64>,
    /// Each policy's replay buffer (off-policy algorithms), removed with the plane, and its rows' layout.
    replays: Vec<(ReplayRing, TransitionLayout)>,
    pub plane: DataPlane,
}

/// Slots per rollout worker's trajectory pool: per split, one to fill and its share of the
/// slots that `--num_batches_to_accumulate` + 1 datasets hold (a slot stays with the batcher and
/// the learner until the dataset closing it is trained on). With several policies a slot feeds
/// each policy's datasets and stays until all are trained on: each policy's datasets in flight
/// hold their share. When the learners fall that far behind, the workers run out of slots and
/// wait: sampling stops.
fn buffers_per_worker(cfg: &Config, num_agents: usize, workers: usize) -> usize {
    let s = &cfg.sampling;
    let splits = s.worker_num_splits;
    let per_split = s.num_envs_per_worker / splits * num_agents;
    let per_dataset = cfg.dataset_size().div_ceil(s.rollout * per_split);
    let held =
        (per_dataset * (cfg.appo.num_batches_to_accumulate + 1) * s.num_policies).div_ceil(workers * splits);
    splits * (1 + held.max(1))
}

/// The sizes of a data plane, worked out before any region is created: the networks (whose sizes the published
/// weights take), the trajectory slots and the replay buffers.
pub(super) struct PlanePlan {
    models: Vec<Box<dyn Policy>>,
    shape: TrajectoryShape,
    obs_layout: ObsLayout,
    slots: usize,
    pools: usize,
    replays: Vec<TransitionLayout>,
}

/// The plane of `cfg` for the part of the graph this process's rank runs.
pub(super) fn plan_plane(plan: &RunPlan, part: RankPart) -> Result<PlanePlan> {
    let (cfg, spec) = (&plan.config, &plan.env);
    // Each network's size: policies whose agents differ have networks of their own shapes.
    let models = (0..cfg.sampling.num_policies)
        .map(|p| new_policy(plan, p))
        .collect::<Result<Vec<_>>>()?;
    let s = &cfg.sampling;
    let num_agents = spec.num_agents;
    // One column per agent of each env, as wide as the largest agent's observation; byte parts stored as bytes.
    let obs_layout = ObsLayout::common(&spec.observation_spaces, spec.obs_dim);
    let shape = TrajectoryShape {
        rollout: s.rollout,
        num_envs: s.num_envs_per_worker / s.worker_num_splits * num_agents,
        obs_dim: spec.obs_dim,
        // As wide as the largest agent's action (policies whose agents differ in action kind or size fill the first
        // values of theirs).
        action_dim: models.iter().map(|m| m.action_dim()).max().unwrap_or(1),
        state_dim: models[0].state_dim(),
        obs_bytes: obs_layout.bytes(),
    };
    let replays = if plan.learns_from_replay {
        (0..models.len())
            .map(|p| transition_layout(plan, p))
            .collect::<Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    Ok(PlanePlan {
        slots: buffers_per_worker(cfg, num_agents, part.all_workers(cfg)),
        pools: part.pools(cfg),
        models,
        shape,
        obs_layout,
        replays,
    })
}

impl PlanePlan {
    /// The bytes of shared memory the trajectory slots and the replay buffers of `cfg` take (the published
    /// weights and the counters are small beside them).
    fn bytes(&self, cfg: &Config) -> (u128, u128) {
        let slots = self.shape.slot_bytes() as u128 * self.slots as u128 * self.pools as u128;
        let replays = self
            .replays
            .iter()
            .map(|l| {
                ReplayRing::footprint_of(cfg.off_policy.replay_buffer_size, l.row_words())
                    .map_or(u128::MAX, |b| b as u128)
            })
            .fold(0u128, u128::saturating_add);
        (slots, replays)
    }

    /// Refuses a plane larger than the shared memory (`/dev/shm`) has room for, naming the flags that size it.
    pub(super) fn check_fits(&self, cfg: &Config) -> Result<()> {
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            return Ok(());
        }
        let (slots, replays) = self.bytes(cfg);
        let free = rlf_experiment::free_bytes(shm)? as u128;
        if slots.saturating_add(replays) <= free {
            return Ok(());
        }
        let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
        Err(RlfError::Usage(format!(
            "the run needs {:.1} GiB of shared memory ({:.1} GiB of trajectory slots for --batch_size, --rollout, \
             --num_workers and --num_envs_per_worker; {:.1} GiB of replay buffers for --replay_buffer_size) and \
             /dev/shm has {:.1} GiB free",
            gib(slots.saturating_add(replays)),
            gib(slots),
            gib(replays),
            gib(free)
        )))
    }
}

/// Creates the regions of `plan` for `cfg`.
pub(super) fn create_plane(cfg: &Config, plan: PlanePlan) -> Result<PlaneRegions> {
    let sizes = plan
        .models
        .iter()
        .map(|m| Ok(m.weights()?.values.len()))
        .collect::<Result<Vec<_>>>()?;
    let weights = (0..cfg.num_networks())
        .map(|n| SharedWeights::create(sizes[cfg.policy_of_network(n)]))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let pools = (0..plan.pools)
        .map(|_| TrajectoryPool::with_layout(plan.shape, plan.obs_layout.clone(), plan.slots))
        .collect::<Result<Vec<_>>>()?;
    let counters = ShmArray::create(CounterLayout { workers: plan.pools }.len())?;
    let replays = plan
        .replays
        .into_iter()
        .map(|layout| {
            let ring = ReplayRing::create(
                cfg.off_policy.replay_buffer_size,
                layout.row_words(),
                rate_limit(cfg),
            )?;
            Ok((ring, layout))
        })
        .collect::<Result<Vec<_>>>()?;
    let plane = DataPlane {
        weights: weights.iter().map(SharedWeights::handle).collect(),
        pools: pools.iter().map(TrajectoryPool::handle).collect(),
        counters: counters.handle(),
        replays: replays.iter().map(|(ring, _)| ring.handle()).collect(),
        replays_restored: vec![None; replays.len()],
    };
    Ok(PlaneRegions {
        weights,
        pools,
        counters,
        replays,
        plane,
    })
}

impl PlaneRegions {
    /// With `--save_replay_buffer`, before any other process starts: each policy's replay buffer goes on from the
    /// copy its checkpoints saved, if any (its rows, counters and, read by the learner, priorities). Returns what to
    /// log: each buffer restored, or why one starts empty (a copy unreadable, or of other rows than this run's).
    pub(super) fn restore_replays(&mut self, cfg: &Config) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        if !cfg.off_policy.save_replay_buffer {
            return Ok(lines);
        }
        for (policy, (ring, _)) in self.replays.iter().enumerate() {
            let saved = match crate::experiment::load_replay(cfg, policy) {
                Ok(Some(saved)) => saved,
                Ok(None) => continue,
                Err(e) => {
                    lines.push(format!("policy {policy} starts with an empty replay buffer: {e}"));
                    continue;
                }
            };
            let r = &saved.snapshot;
            if r.row_words != ring.row_words() {
                lines.push(format!(
                    "policy {policy} starts with an empty replay buffer: {} holds rows of {} words, this run's take {}",
                    saved.path.display(),
                    r.row_words,
                    ring.row_words()
                ));
                continue;
            }
            let inserted = ring
                .restore(r.first, &r.rows, r.sampled)
                .map_err(|e| RlfError::Protocol {
                    component: "data plane",
                    message: format!("policy {policy}'s replay buffer: {e}"),
                })?;
            self.plane.replays_restored[policy] = Some(saved.version);
            lines.push(format!(
                "policy {policy}'s replay buffer goes on from {}: {} transitions (inserts {}..{inserted}), {} sampled",
                saved.path.display(),
                ring.len(),
                inserted - ring.len() as u64,
                r.sampled
            ));
        }
        Ok(lines)
    }

    /// Each replay buffer's counts (off-policy), by policy; `learning_starts` inserts come before sampling.
    pub(super) fn replay_summaries(&self, learning_starts: u64) -> Vec<ReplaySummary> {
        self.replays
            .iter()
            .map(|(ring, _)| {
                let (inserted, sampled) = (ring.inserted(), ring.sampled());
                let past = inserted.saturating_sub(learning_starts);
                ReplaySummary {
                    capacity: ring.capacity(),
                    inserted,
                    sampled,
                    samples_per_insert: (past > 0).then(|| sampled as f64 / past as f64),
                    writer_deaths: ring.writer_deaths(),
                }
            })
            .collect()
    }

    /// What the trajectory slots take in shared memory (none without pools): per env and step, per slot, in all;
    /// and each replay buffer: its rows, their observations' packing, in all.
    pub(super) fn memory_lines(&self) -> Vec<String> {
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        let replays = self.replays.iter().enumerate().map(|(p, (ring, layout))| {
            format!(
                "replay buffer of policy {p}: {} rows of {} B (2 observations of {} values in {} words{}) = {:.1} MiB of shared memory",
                ring.capacity(),
                4 * ring.row_words(),
                layout.obs_dim(),
                layout.obs_words(),
                if layout.packs() {
                    ", byte-valued parts packed four to a word"
                } else {
                    ""
                },
                mib(ring.footprint())
            )
        });
        let Some(first) = self.pools.first() else {
            return replays.collect();
        };
        let (shape, slots) = (first.shape(), first.num_buffers());
        std::iter::once(format!(
            "trajectory slots: {} B per env step ({} observation values, {} of them bytes, {} state values), {:.2} MiB per slot of {} steps x {} envs, {} slots per worker x {} workers = {:.1} MiB of shared memory",
            shape.step_bytes(),
            shape.obs_dim,
            shape.obs_bytes,
            shape.state_dim,
            mib(shape.slot_bytes()),
            shape.rollout,
            shape.num_envs,
            slots,
            self.pools.len(),
            mib(shape.slot_bytes() * slots * self.pools.len())
        ))
        .chain(replays)
        .collect()
    }
}

/// An off-policy rollout worker's writer into every policy's replay buffer (none for APPO).
pub(super) fn replay_writer(plan: &RunPlan, plane: &DataPlane) -> Result<Option<ReplayWriter>> {
    let cfg = &plan.config;
    if plane.replays.is_empty() {
        return Ok(None);
    }
    let mut rings = Vec::new();
    let mut layouts = Vec::new();
    for policy in 0..cfg.sampling.num_policies {
        let (ring, layout) = (plane.open_replay(policy)?, transition_layout(plan, policy)?);
        if ring.row_words() != layout.row_words() {
            return Err(crate::RlfError::Protocol {
                component: "rollout worker",
                message: format!(
                    "policy {policy}: replay rows of {} words, its transitions take {}",
                    ring.row_words(),
                    layout.row_words()
                ),
            });
        }
        rings.push(ring);
        layouts.push(layout);
    }
    Ok(Some(ReplayWriter::new(
        rings,
        layouts,
        cfg.off_policy.n_step,
        cfg.learning.gamma,
    )))
}

/// The rows of policy `policy`'s replay buffer for `cfg`'s env (`spec`): its agents' observations, byte-valued parts
/// packed as bytes.
pub(super) fn transition_layout(plan: &RunPlan, policy: usize) -> Result<TransitionLayout> {
    let (observation_space, action_space) = plan.policy_spaces(policy)?;
    Ok(TransitionLayout::new(
        ObsLayout::of(observation_space),
        action_space.action_dim().unwrap_or(1),
    ))
}

/// `--replay_ratio` samples per insert once `--learning_starts` transitions are in, within a batch and a ratio's
/// worth either way (enough for the learner to take a batch and a writer a row: neither waits on the other for
/// ever); none with a ratio of 0.
///
/// In serial mode there is none: a writer waiting for the learner would wait for ever on their one loop; the learner
/// keeps the ratio itself ([`crate::learning::OffPolicyLearner::train_due`]).
fn rate_limit(cfg: &Config) -> Option<RateLimit> {
    let o = &cfg.off_policy;
    (o.replay_ratio > 0.0 && !cfg.run.serial_mode).then(|| RateLimit {
        samples_per_insert: o.replay_ratio,
        min_size_to_sample: o.learning_starts,
        error_buffer: 4.0 * cfg.learning.batch_size as f64 + o.replay_ratio.max(1.0),
    })
}

/// Before anything is written into the folder of a run that resumes: each policy's newest intact checkpoint fits
/// the network this run builds for it (every variable by name and shape), so that a resume with other layers or
/// another algorithm fails with the folder as it was.
pub(super) fn check_resumable(plan: &RunPlan) -> Result<()> {
    let cfg = &plan.config;
    for policy in 0..cfg.sampling.num_policies {
        let Some(state) = crate::experiment::resume_state(cfg, policy)? else {
            continue;
        };
        new_policy(plan, policy)?.load_named_tensors(&state.tensors).map_err(|e| {
            RlfError::Config(format!(
                "cannot resume from {}: {e}; nothing was changed (--restart_behavior restart starts the experiment \
                 anew)",
                state.path.display()
            ))
        })?;
    }
    Ok(())
}

/// With `--save_replay_buffer`, before anything is written into the experiment folder: the disk that holds it has
/// room for the largest copies of every replay buffer (each full, with its priorities, twice: a save writes the new
/// copy before it deletes the old). Returns the bytes one set of copies takes at most, for the log.
pub(super) fn check_replay_disk(plan: &RunPlan) -> Result<u64> {
    let cfg = &plan.config;
    let o = &cfg.off_policy;
    if !plan.learns_from_replay || !o.save_replay_buffer || !cfg.run.save_experiment {
        return Ok(0);
    }
    let mut bytes = 0u64;
    for policy in 0..cfg.sampling.num_policies {
        let row = 4 * transition_layout(plan, policy)?.row_words() as u64 + 8;
        bytes = bytes.saturating_add(row.saturating_mul(o.replay_buffer_size as u64));
    }
    let dir = cfg.run.train_dir.join(&cfg.run.experiment);
    let free = rlf_experiment::free_bytes(&dir)?;
    if free < bytes.saturating_mul(2) {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        return Err(RlfError::Usage(format!(
            "the replay buffers' saves need up to {:.0} MiB on the disk of {}, which has {:.0} MiB free: pass \
             --save_replay_buffer false or a smaller --replay_buffer_size",
            mib(bytes.saturating_mul(2)),
            dir.display(),
            mib(free)
        )));
    }
    Ok(bytes)
}

/// The acting network of policy `policy` for `cfg`'s algorithm ([`crate::algo::Algorithm::acting_network`]), seeded
/// by `--seed` and the policy ([`seed_policy`]): every process that builds it starts from the same weights.
pub(super) fn new_policy(plan: &RunPlan, policy: usize) -> Result<Box<dyn Policy>> {
    let cfg = &plan.config;
    let (observation_space, action_space) = plan.policy_spaces(policy)?;
    seed_policy(cfg, policy);
    plan.algorithm()?
        .acting_network(observation_space, action_space, cfg)
}

/// Seeds libtorch's generator for a network of policy `policy`: `--seed` and the policy, so that every process that
/// builds it starts from the same weights, and policies start from different ones.
pub(super) fn seed_policy(cfg: &Config, policy: usize) {
    ActorCritic::seed(cfg.env.seed.wrapping_add(policy as u64 * 1_000_003));
}
