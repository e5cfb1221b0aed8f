//! The rollout worker: envs in `worker_num_splits` groups; each group steps when its actions
//! arrive, records the step, and hands a trajectory on every `rollout` steps, through a slot of its
//! shared-memory [`TrajectoryPool`]. A finished split with no free slot is parked until the batcher
//! releases one (back-pressure).
//!
//! A worker starts with no free slot: its first message (`worker_started`) asks the batcher which
//! slots of its pool it does not hold, and the answer (`slots_reclaimed`) is its free list. So a
//! replacement process (after its predecessor died or hung) never writes into a slot the batcher
//! still reads, and releases addressed to the predecessor are ignored until the answer comes.
//! Requests carry the worker's incarnation, so answers to the predecessor's requests are ignored too.

use super::{ActionsReady, PolicyRequest, RolloutReport, Trajectory, TrajectoryPool, TrajectoryReady};
use crate::config::Config;
use crate::env::{ActionMapper, EnvRegistry, VecBuffers, VecEnv};
use crate::error::{Result, RlfError};
use serde::{Deserialize, Serialize};

struct Split {
    envs: VecEnv,
    buf: VecBuffers,
    mapper: ActionMapper,
    trajectory: Trajectory,
    /// Trajectories handed on since the last policy update (sync mode pauses at `rounds_per_update`).
    since_update: usize,
    paused: bool,
    /// A finished trajectory waiting for a free slot.
    parked: Option<Trajectory>,
}

/// What a rollout worker emits after a step.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// The next request for actions (none while paused in sync mode).
    pub request: Option<PolicyRequest>,
    /// A finished trajectory, written into the pool.
    pub trajectory: Option<TrajectoryReady>,
    /// Progress since the last report, sent with each trajectory.
    pub report: Option<RolloutReport>,
}

/// A rollout worker's cumulative counts, kept in shared memory after every step so that they
/// outlive its process: a replacement continues them ([`WorkerCounts::inherit`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCounts {
    /// Trajectories finished (handed on or parked).
    pub produced: u64,
    /// Finished trajectories parked for want of a free slot.
    pub parked: u64,
    /// Env frames simulated.
    pub stepped_frames: u64,
    /// Env frames in trajectories handed on to the batcher.
    pub handed_frames: u64,
    /// Trajectories dead processes had parked.
    pub lost_trajectories: u64,
    /// Env frames dead processes had simulated but not handed on.
    pub lost_frames: u64,
}

impl WorkerCounts {
    /// Words in shared memory.
    pub const LEN: usize = 6;

    /// As words, in field order.
    pub fn to_words(self) -> [u64; Self::LEN] {
        [
            self.produced,
            self.parked,
            self.stepped_frames,
            self.handed_frames,
            self.lost_trajectories,
            self.lost_frames,
        ]
    }

    /// From words, in field order.
    pub fn from_words(w: [u64; Self::LEN]) -> Self {
        Self {
            produced: w[0],
            parked: w[1],
            stepped_frames: w[2],
            handed_frames: w[3],
            lost_trajectories: w[4],
            lost_frames: w[5],
        }
    }

    /// The counts a replacement continues from: what its predecessor had parked or not yet
    /// finished is lost.
    pub fn inherit(self) -> Self {
        Self {
            produced: self.produced,
            parked: 0,
            stepped_frames: self.stepped_frames,
            handed_frames: self.stepped_frames,
            lost_trajectories: self.lost_trajectories + self.parked,
            lost_frames: self.lost_frames + self.stepped_frames.saturating_sub(self.handed_frames),
        }
    }
}

/// Simulates `num_envs_per_worker` envs for the sampler.
pub struct RolloutWorker {
    index: usize,
    rollout: usize,
    seed: u64,
    splits: Vec<Split>,
    report: RolloutReport,
    /// In sync mode, trajectories per split before waiting for a new policy; `None` in async mode.
    rounds_per_update: Option<usize>,
    pool: TrajectoryPool,
    free: Vec<usize>,
    /// The batcher's answer to `worker_started` (the free list) arrived.
    reclaimed: bool,
    incarnation: u32,
    counts: WorkerCounts,
}

impl std::fmt::Debug for RolloutWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutWorker")
            .field("index", &self.index)
            .field("splits", &self.splits.len())
            .finish_non_exhaustive()
    }
}

impl RolloutWorker {
    /// Process `incarnation` of rollout worker `index` of the run configured by `cfg`, with envs
    /// from `registry`, continuing `counts`. Its trajectories go through `pool`, whose free slots
    /// it learns from [`on_slots_reclaimed`](Self::on_slots_reclaimed).
    pub fn new(
        index: usize,
        cfg: &Config,
        registry: &EnvRegistry,
        pool: TrajectoryPool,
        incarnation: u32,
        counts: WorkerCounts,
    ) -> Result<Self> {
        let s = &cfg.sampling;
        let per_split = s.num_envs_per_worker / s.worker_num_splits;
        let mut splits = Vec::with_capacity(s.worker_num_splits);
        for _ in 0..s.worker_num_splits {
            let envs = VecEnv::from_registry(registry, &cfg.env.env, per_split)?;
            let mapper = ActionMapper::new(envs.action_space(), cfg.model.continuous_action_mode)?;
            splits.push(Split {
                buf: VecBuffers::new(per_split, envs.obs_dim()),
                envs,
                mapper,
                trajectory: Trajectory::default(),
                since_update: 0,
                paused: false,
                parked: None,
            });
        }
        let rounds_per_update =
            (!cfg.run.async_rl).then(|| cfg.dataset_size() / (cfg.total_envs() * s.rollout));
        Ok(Self {
            index,
            rollout: s.rollout,
            seed: cfg.env.seed + (index * s.num_envs_per_worker) as u64,
            splits,
            report: RolloutReport {
                worker: index,
                ..RolloutReport::default()
            },
            rounds_per_update,
            free: Vec::new(),
            reclaimed: false,
            incarnation,
            counts,
            pool,
        })
    }

    /// This worker's counts so far.
    pub fn counts(&self) -> WorkerCounts {
        WorkerCounts {
            parked: self.splits.iter().filter(|s| s.parked.is_some()).count() as u64,
            ..self.counts
        }
    }

    /// Writes split `k`'s finished trajectory into a free slot, or parks it when there is none.
    fn hand_on(&mut self, k: usize, traj: Trajectory) -> Result<Option<TrajectoryReady>> {
        let Some(buffer) = self.free.pop() else {
            self.splits[k].parked = Some(traj);
            return Ok(None);
        };
        self.pool.write(buffer, &traj)?;
        self.counts.handed_frames += (traj.len * traj.num_envs) as u64;
        Ok(Some(TrajectoryReady {
            worker: self.index,
            split: k,
            buffer,
        }))
    }

    fn request(&self, split: usize) -> PolicyRequest {
        PolicyRequest {
            worker: self.index,
            split,
            incarnation: self.incarnation,
            obs: self.splits[split].buf.obs.clone(),
        }
    }

    fn fresh_trajectory(&self, split: usize) -> Trajectory {
        let s = &self.splits[split];
        Trajectory {
            worker: self.index,
            split,
            num_envs: s.envs.num_envs(),
            ..Trajectory::default()
        }
    }

    /// Resets every env (env `i` of the worker seeded `seed + i`) and returns the first requests.
    pub fn start(&mut self) -> Result<Vec<PolicyRequest>> {
        let mut offset = self.seed;
        for (k, split) in self.splits.iter_mut().enumerate() {
            split.envs.reset(Some(offset), &mut split.buf.obs)?;
            offset += split.envs.num_envs() as u64;
            split.trajectory = Trajectory {
                worker: self.index,
                split: k,
                num_envs: split.envs.num_envs(),
                ..Trajectory::default()
            };
        }
        Ok((0..self.splits.len()).map(|k| self.request(k)).collect())
    }

    /// Slot of `actions_ready`: records the step of the split the actions are for, steps its envs,
    /// and says what to emit.
    pub fn on_actions_ready(&mut self, actions: &ActionsReady) -> Result<StepOutcome> {
        let protocol = |message: String| RlfError::Protocol {
            component: "rollout worker",
            message,
        };
        if actions.worker != self.index || actions.incarnation != self.incarnation {
            return Ok(StepOutcome::default());
        }
        let k = actions.split;
        let rollout = self.rollout;
        let Some(split) = self.splits.get_mut(k) else {
            return Err(protocol(format!("worker {}: no split {k}", self.index)));
        };
        let n = split.envs.num_envs();
        let out = &actions.output;
        if out.actions.len() != n * split.envs.action_dim()
            || out.log_probs.len() != n
            || out.values.len() != n
        {
            return Err(protocol(format!(
                "worker {} split {k}: actions for {} envs do not fit {n} envs",
                self.index,
                out.log_probs.len()
            )));
        }
        let t = split.trajectory.len;
        let traj = &mut split.trajectory;
        traj.obs.extend_from_slice(&split.buf.obs);
        traj.actions.extend_from_slice(&out.actions);
        traj.log_probs.extend_from_slice(&out.log_probs);
        traj.values.extend_from_slice(&out.values);
        traj.versions.extend(std::iter::repeat_n(actions.version, n));

        let env_actions = split.mapper.map(&out.actions);
        split.envs.step(env_actions, split.buf.view())?;

        traj.rewards.extend_from_slice(&split.buf.rewards);
        traj.terminated.extend_from_slice(&split.buf.terminated);
        traj.truncated.extend_from_slice(&split.buf.truncated);
        for i in 0..n {
            if split.buf.truncated[i] {
                if let Some(last) = split.envs.final_observation(i) {
                    traj.final_obs.push((t * n + i, last.to_vec()));
                }
            }
            if let Some(ep) = split.envs.infos()[i].episode {
                self.report.episode_returns.push(ep.episode_return);
                self.report.episode_lengths.push(ep.length);
            }
        }
        traj.len += 1;
        self.report.env_frames += n as u64;
        self.counts.stepped_frames += n as u64;

        let mut outcome = StepOutcome::default();
        if traj.len == rollout {
            traj.next_obs = split.buf.obs.clone();
            split.since_update += 1;
            if self.rounds_per_update.is_some_and(|r| split.since_update >= r) {
                split.paused = true;
            }
            let fresh = self.fresh_trajectory(k);
            let done = std::mem::replace(&mut self.splits[k].trajectory, fresh);
            self.counts.produced += 1;
            outcome.trajectory = self.hand_on(k, done)?;
            let paused = self.splits[k].paused || self.splits[k].parked.is_some();
            outcome.report = Some(std::mem::replace(
                &mut self.report,
                RolloutReport {
                    worker: self.index,
                    ..RolloutReport::default()
                },
            ));
            if paused {
                return Ok(outcome);
            }
        }
        outcome.request = Some(self.request(k));
        Ok(outcome)
    }

    /// Slot of `policy_updated`: in sync mode, resumes the splits waiting for a new policy.
    pub fn on_policy_updated(&mut self) -> Vec<PolicyRequest> {
        let mut resumed = Vec::new();
        for (k, split) in self.splits.iter_mut().enumerate() {
            split.since_update = 0;
            if std::mem::take(&mut split.paused) && split.parked.is_none() {
                resumed.push(k);
            }
        }
        resumed.into_iter().map(|k| self.request(k)).collect()
    }

    /// Slot of `buffer_released`: the slot is free again; a parked split (if any) hands its
    /// trajectory on through it and resumes unless paused for a policy update. Ignored until the
    /// free list came ([`on_slots_reclaimed`](Self::on_slots_reclaimed) counts it).
    pub fn on_buffer_released(&mut self, buffer: usize) -> Result<Vec<StepOutcome>> {
        if !self.reclaimed {
            return Ok(Vec::new());
        }
        if buffer >= self.pool.num_buffers() || self.free.contains(&buffer) {
            return Err(RlfError::Protocol {
                component: "rollout worker",
                message: format!("worker {}: buffer {buffer} released but not in use", self.index),
            });
        }
        self.free.push(buffer);
        self.unpark()
    }

    /// Slot of `slots_reclaimed`: the free list (slots the batcher does not hold); parked splits
    /// hand their trajectories on through it.
    pub fn on_slots_reclaimed(&mut self, incarnation: u32, free: &[usize]) -> Result<Vec<StepOutcome>> {
        if incarnation != self.incarnation || self.reclaimed {
            return Ok(Vec::new());
        }
        let n = self.pool.num_buffers();
        let mut free = free.to_vec();
        free.sort_unstable_by(|a, b| b.cmp(a));
        free.dedup();
        if free.iter().any(|&b| b >= n) {
            return Err(RlfError::Protocol {
                component: "rollout worker",
                message: format!("worker {}: reclaimed slots {free:?} outside its {n}", self.index),
            });
        }
        self.free = free;
        self.reclaimed = true;
        self.unpark()
    }

    /// Hands parked trajectories on while there are free slots; each split that does resumes
    /// unless paused for a policy update.
    fn unpark(&mut self) -> Result<Vec<StepOutcome>> {
        let mut outcomes = Vec::new();
        while !self.free.is_empty() {
            let Some(k) = self.splits.iter().position(|s| s.parked.is_some()) else {
                break;
            };
            let Some(traj) = self.splits[k].parked.take() else {
                break;
            };
            let trajectory = self.hand_on(k, traj)?;
            let request = (!self.splits[k].paused).then(|| self.request(k));
            outcomes.push(StepOutcome {
                trajectory,
                request,
                report: None,
            });
        }
        Ok(outcomes)
    }
}
