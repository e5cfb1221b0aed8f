//! The rollout worker: envs in `worker_num_splits` groups; each group steps when its actions
//! arrive, records the step, and hands a trajectory on every `rollout` steps, through a slot of its
//! shared-memory [`TrajectoryPool`]. A finished split with no free slot is parked until the batcher
//! releases one (back-pressure).

use super::{ActionsReady, PolicyRequest, RolloutReport, Trajectory, TrajectoryPool, TrajectoryReady};
use crate::config::Config;
use crate::env::{ActionMapper, EnvRegistry, VecBuffers, VecEnv};
use crate::error::{Result, RlfError};

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
    /// Trajectories finished so far (written into a slot or parked).
    produced: u64,
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
    /// Rollout worker `index` of the run configured by `cfg`, with envs from `registry`.
    /// Its trajectories go through `pool`, all of whose slots start free.
    pub fn new(index: usize, cfg: &Config, registry: &EnvRegistry, pool: TrajectoryPool) -> Result<Self> {
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
            free: (0..pool.num_buffers()).rev().collect(),
            produced: 0,
            pool,
        })
    }

    /// Writes split `k`'s finished trajectory into a free slot, or parks it when there is none.
    fn hand_on(&mut self, k: usize, traj: Trajectory) -> Result<Option<TrajectoryReady>> {
        let Some(buffer) = self.free.pop() else {
            self.splits[k].parked = Some(traj);
            return Ok(None);
        };
        self.pool.write(buffer, &traj)?;
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
        if actions.worker != self.index {
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

        let mut outcome = StepOutcome::default();
        if traj.len == rollout {
            traj.next_obs = split.buf.obs.clone();
            split.since_update += 1;
            if self.rounds_per_update.is_some_and(|r| split.since_update >= r) {
                split.paused = true;
            }
            let fresh = self.fresh_trajectory(k);
            let done = std::mem::replace(&mut self.splits[k].trajectory, fresh);
            self.produced += 1;
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

    /// Trajectories finished so far, and those of them parked now for want of a free slot.
    pub fn trajectory_counts(&self) -> (u64, u64) {
        let parked = self.splits.iter().filter(|s| s.parked.is_some()).count();
        (self.produced, parked as u64)
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
    /// trajectory on through it and resumes unless paused for a policy update.
    pub fn on_buffer_released(
        &mut self,
        buffer: usize,
    ) -> Result<(Option<TrajectoryReady>, Option<PolicyRequest>)> {
        if buffer >= self.pool.num_buffers() || self.free.contains(&buffer) {
            return Err(RlfError::Protocol {
                component: "rollout worker",
                message: format!("worker {}: buffer {buffer} released but not in use", self.index),
            });
        }
        self.free.push(buffer);
        let Some(k) = self.splits.iter().position(|s| s.parked.is_some()) else {
            return Ok((None, None));
        };
        let Some(traj) = self.splits[k].parked.take() else {
            return Ok((None, None));
        };
        let ready = self.hand_on(k, traj)?;
        let request = (!self.splits[k].paused).then(|| self.request(k));
        Ok((ready, request))
    }
}
