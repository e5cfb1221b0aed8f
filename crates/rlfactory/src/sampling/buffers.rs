//! Trajectory buffers in shared memory: the data plane between rollout workers and the batcher.
//!
//! Each rollout worker owns a [`TrajectoryPool`] of `num_buffers` slots, each holding one trajectory of `rollout`
//! steps of one split (time-major, step `t` of env `i` at `t * num_envs + i`). Who may touch a slot is decided by the
//! signals that carry its index:
//! 1. the worker takes a free index from its free list, writes the trajectory and emits `trajectory_ready` with the
//!    index (the signal's queue orders the writes before the batcher's reads);
//! 2. the batcher copies the slot out and emits `buffer_released` back to that worker alone, which puts the index on
//!    its free list again. A worker with no free slot parks the finished split until a slot comes back
//!    (back-pressure, no polling).
//!
//! Floats and flags live in one `f32` array, policy versions in a `u64` array. Copies between the slots and the
//! process-local vectors are memcpys of a few hundred KB at most per trajectory.

use serde::{Deserialize, Serialize};

use rlf_shm::{ShmArray, ShmArrayHandle};

use super::Trajectory;
use crate::error::{Result, RlfError};

/// The shape of every slot of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrajectoryShape {
    /// Steps per trajectory.
    pub rollout: usize,
    /// Envs per split.
    pub num_envs: usize,
    /// Values per observation.
    pub obs_dim: usize,
    /// Values per raw action.
    pub action_dim: usize,
}

impl TrajectoryShape {
    fn steps(&self) -> usize {
        self.rollout * self.num_envs
    }

    /// `f32` values per slot: obs, actions, log-probs, values, rewards, terminated, truncated, has-final flags,
    /// final observations, next observations.
    fn floats(&self) -> usize {
        let s = self.steps();
        s * (2 * self.obs_dim + self.action_dim + 6) + self.num_envs * self.obs_dim
    }
}

/// Serialisable description of a [`TrajectoryPool`], for the other processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrajectoryPoolHandle {
    shape: TrajectoryShape,
    num_buffers: usize,
    floats: ShmArrayHandle,
    versions: ShmArrayHandle,
}

/// `num_buffers` trajectory slots of one rollout worker.
#[derive(Debug)]
pub struct TrajectoryPool {
    shape: TrajectoryShape,
    num_buffers: usize,
    floats: ShmArray<f32>,
    versions: ShmArray<u64>,
}

fn bools(v: &[bool]) -> Vec<f32> {
    v.iter().map(|&b| f32::from(u8::from(b))).collect()
}

impl TrajectoryPool {
    /// A pool of `num_buffers` zero-filled slots of `shape`.
    pub fn create(shape: TrajectoryShape, num_buffers: usize) -> Result<Self> {
        Ok(Self {
            shape,
            num_buffers,
            floats: ShmArray::create(shape.floats() * num_buffers)?,
            versions: ShmArray::create(shape.steps() * num_buffers)?,
        })
    }

    /// Maps a pool created by another process.
    pub fn open(handle: &TrajectoryPoolHandle) -> Result<Self> {
        let pool = Self {
            shape: handle.shape,
            num_buffers: handle.num_buffers,
            floats: ShmArray::open(&handle.floats)?,
            versions: ShmArray::open(&handle.versions)?,
        };
        if pool.floats.len() < handle.shape.floats() * handle.num_buffers
            || pool.versions.len() < handle.shape.steps() * handle.num_buffers
        {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: "the shared arrays are smaller than the pool's shape".into(),
            });
        }
        Ok(pool)
    }

    /// The handle to pass to other processes.
    pub fn handle(&self) -> TrajectoryPoolHandle {
        TrajectoryPoolHandle {
            shape: self.shape,
            num_buffers: self.num_buffers,
            floats: self.floats.handle(),
            versions: self.versions.handle(),
        }
    }

    /// Slots in the pool.
    pub fn num_buffers(&self) -> usize {
        self.num_buffers
    }

    fn check(&self, buffer: usize, traj: Option<&Trajectory>) -> Result<()> {
        let sh = &self.shape;
        let fits = traj.is_none_or(|t| {
            let s = sh.steps();
            t.len == sh.rollout
                && t.num_envs == sh.num_envs
                && t.obs.len() == s * sh.obs_dim
                && t.actions.len() == s * sh.action_dim
                && [t.log_probs.len(), t.values.len(), t.rewards.len()] == [s; 3]
                && [t.terminated.len(), t.truncated.len(), t.versions.len()] == [s; 3]
                && t.next_obs.len() == sh.num_envs * sh.obs_dim
                && t.final_obs.iter().all(|(i, o)| *i < s && o.len() == sh.obs_dim)
        });
        if buffer >= self.num_buffers || !fits {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: format!(
                    "buffer {buffer} of {}: trajectory does not fit the slot",
                    self.num_buffers
                ),
            });
        }
        Ok(())
    }

    /// Writes `traj` into slot `buffer`.
    pub fn write(&self, buffer: usize, traj: &Trajectory) -> Result<()> {
        self.check(buffer, Some(traj))?;
        let (sh, s) = (&self.shape, self.shape.steps());
        let mut at = buffer * sh.floats();
        let mut put = |v: &[f32]| {
            self.floats.copy_from_slice(at, v);
            at += v.len();
        };
        put(&traj.obs);
        put(&traj.actions);
        put(&traj.log_probs);
        put(&traj.values);
        put(&traj.rewards);
        put(&bools(&traj.terminated));
        put(&bools(&traj.truncated));
        let mut has_final = vec![0.0; s];
        let mut final_obs = vec![0.0; s * sh.obs_dim];
        for (i, o) in &traj.final_obs {
            has_final[*i] = 1.0;
            final_obs[i * sh.obs_dim..(i + 1) * sh.obs_dim].copy_from_slice(o);
        }
        put(&has_final);
        put(&final_obs);
        put(&traj.next_obs);
        self.versions.copy_from_slice(buffer * s, &traj.versions);
        Ok(())
    }

    /// Reads slot `buffer` as the trajectory of `worker`'s `split`.
    pub fn read(&self, buffer: usize, worker: usize, split: usize) -> Result<Trajectory> {
        self.check(buffer, None)?;
        let (sh, s) = (&self.shape, self.shape.steps());
        let mut at = buffer * sh.floats();
        let mut take = |n: usize| {
            let mut v = vec![0.0; n];
            self.floats.copy_to_slice(at, &mut v);
            at += n;
            v
        };
        let obs = take(s * sh.obs_dim);
        let actions = take(s * sh.action_dim);
        let log_probs = take(s);
        let values = take(s);
        let rewards = take(s);
        let terminated = take(s).into_iter().map(|x| x != 0.0).collect();
        let truncated = take(s).into_iter().map(|x| x != 0.0).collect();
        let has_final = take(s);
        let final_dense = take(s * sh.obs_dim);
        let next_obs = take(sh.num_envs * sh.obs_dim);
        let final_obs = (0..s)
            .filter(|&i| has_final[i] != 0.0)
            .map(|i| (i, final_dense[i * sh.obs_dim..(i + 1) * sh.obs_dim].to_vec()))
            .collect();
        let mut versions = vec![0; s];
        self.versions.copy_to_slice(buffer * s, &mut versions);
        Ok(Trajectory {
            worker,
            split,
            num_envs: sh.num_envs,
            len: sh.rollout,
            obs,
            actions,
            log_probs,
            values,
            rewards,
            terminated,
            truncated,
            final_obs,
            next_obs,
            versions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trajectory_round_trips_through_a_slot() {
        let shape = TrajectoryShape {
            rollout: 3,
            num_envs: 2,
            obs_dim: 4,
            action_dim: 1,
        };
        let pool = TrajectoryPool::create(shape, 2).unwrap();
        let other = TrajectoryPool::open(&pool.handle()).unwrap();
        let f = |n: usize, k: f32| (0..n).map(|i| i as f32 * k).collect::<Vec<_>>();
        let traj = Trajectory {
            worker: 1,
            split: 0,
            num_envs: 2,
            len: 3,
            obs: f(24, 0.5),
            actions: f(6, 1.0),
            log_probs: f(6, -0.1),
            values: f(6, 2.0),
            rewards: f(6, 1.0),
            terminated: vec![false, true, false, false, false, false],
            truncated: vec![false, false, false, true, false, false],
            final_obs: vec![(3, vec![9.0; 4])],
            next_obs: f(8, 3.0),
            versions: vec![1, 2, 3, 4, 5, 6],
        };
        pool.write(1, &traj).unwrap();
        assert_eq!(other.read(1, 1, 0).unwrap(), traj);
        assert!(pool.write(2, &traj).is_err());
    }
}
