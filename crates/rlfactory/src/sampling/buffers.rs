//! Trajectory buffers in shared memory: the data plane between rollout workers, inference workers
//! and the learner.
//!
//! Each rollout worker owns a [`TrajectoryPool`] of `num_buffers` slots; a slot holds one
//! trajectory of `rollout` steps of one split, field by field, time-major (step `t` of env `i` at
//! `t * num_envs + i`). A trajectory is written where it will be read, never copied between
//! processes; who may touch a slot is decided by the signals that carry its index:
//! 1. a split takes a free slot when it starts a trajectory. At each step the rollout worker
//!    writes the observations at step `t` and asks for actions with the slot and the step; the
//!    inference worker reads those observations and writes the actions, log-probabilities, values
//!    and its policy version at the same step; the rollout worker reads the actions, steps its
//!    envs and writes the rewards, episode ends and valid flags. After the last step it writes
//!    the next observations and emits `trajectory_ready` with the slot (the signal's queue
//!    orders every write before the batcher's reads);
//! 2. the learner trains on tensors that view the slot ([`TrajectoryPool::tensor`]); once every
//!    dataset holding part of it is trained on, the batcher emits `buffer_released` back to that
//!    worker alone, which puts the slot on its free list again. A split with no free slot waits
//!    for one (back-pressure, no polling).
//!
//! Floats and flags live in one `f32` array, policy versions in a `u64` array; one more word
//! holds the incarnation of the worker process that owns the pool, so an inference worker can
//! skip requests of a dead predecessor.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use rlf_shm::{ShmArray, ShmArrayHandle};

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
    /// Values of recurrent state per env (`--use_rnn`; 0 without).
    #[serde(default)]
    pub state_dim: usize,
}

/// A field of a trajectory slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Observations before each step (rollout worker).
    Obs,
    /// Raw actions (inference worker).
    Actions,
    /// Log-probabilities of the actions (inference worker).
    LogProbs,
    /// Values of the observations (inference worker).
    Values,
    /// Rewards (rollout worker).
    Rewards,
    /// 1 where the step ended its episode in a terminal state (rollout worker).
    Terminated,
    /// 1 where the step ended its episode by truncation (rollout worker).
    Truncated,
    /// 1 where the step is the agent's own experience, 0 where it only fills the slot (rollout
    /// worker). Every step of a single-agent env is valid; an agent of a multi-agent env is not
    /// while it is inactive. The learner masks invalid steps out of every loss.
    Valid,
    /// 1 where [`Field::FinalObs`] holds the episode's last observation (rollout worker).
    HasFinal,
    /// The last observation of an episode that ended at the step (rollout worker).
    FinalObs,
    /// Observations after the last step, one per env, no time axis (rollout worker).
    NextObs,
    /// 1 where the env's agent acts in the step after the last (its [`Field::NextObs`] is a
    /// decision point: always for a single-agent env), one per env, no time axis (rollout worker).
    NextValid,
    /// The policy controlling the column's agent at the step (rollout worker, with several
    /// policies; all 0 with one).
    Policy,
    /// The recurrent state each env's step starts from (`--use_rnn`; no values without): the
    /// inference worker writes the state after step `t` at step `t + 1`, and the rollout worker
    /// zeroes it when step `t` ended the env's episode, so the learner can start backpropagation
    /// through time at any step from what acting used.
    States,
    /// The recurrent state after the last step, one per env, no time axis (as [`Field::States`]);
    /// the rollout worker carries it into the split's next slot.
    NextStates,
}

impl Field {
    /// Whether the field holds one value per env after the last step (no time axis).
    pub fn is_after_last_step(self) -> bool {
        matches!(self, Field::NextObs | Field::NextValid | Field::NextStates)
    }

    const ALL: [Field; 15] = [
        Field::Obs,
        Field::Actions,
        Field::LogProbs,
        Field::Values,
        Field::Rewards,
        Field::Terminated,
        Field::Truncated,
        Field::Valid,
        Field::HasFinal,
        Field::FinalObs,
        Field::NextObs,
        Field::NextValid,
        Field::Policy,
        Field::States,
        Field::NextStates,
    ];
}

impl TrajectoryShape {
    fn steps(&self) -> usize {
        self.rollout * self.num_envs
    }

    /// Values per env per step of `field`.
    pub fn width(&self, field: Field) -> usize {
        match field {
            Field::Obs | Field::FinalObs | Field::NextObs => self.obs_dim,
            Field::Actions => self.action_dim,
            Field::States | Field::NextStates => self.state_dim,
            _ => 1,
        }
    }

    /// Steps of `field` (its time axis; 1 for [`Field::NextObs`] and [`Field::NextValid`]).
    fn field_steps(&self, field: Field) -> usize {
        if field.is_after_last_step() {
            1
        } else {
            self.rollout
        }
    }

    fn field_len(&self, field: Field) -> usize {
        self.field_steps(field) * self.num_envs * self.width(field)
    }

    /// Bytes of one slot (its values and policy versions).
    pub fn slot_bytes(&self) -> usize {
        self.floats() * std::mem::size_of::<f32>() + self.steps() * std::mem::size_of::<u64>()
    }

    /// Bytes per env (column) per step of a slot: the observation, the actions, the recurrent state and the
    /// one-value fields.
    pub fn step_bytes(&self) -> usize {
        self.slot_bytes() / (self.rollout * self.num_envs).max(1)
    }

    /// Offset of `field` within a slot.
    fn field_offset(&self, field: Field) -> usize {
        Field::ALL
            .iter()
            .take_while(|&&f| f != field)
            .map(|&f| self.field_len(f))
            .sum()
    }

    /// `f32` values per slot.
    fn floats(&self) -> usize {
        Field::ALL.iter().map(|&f| self.field_len(f)).sum()
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
    /// Policy versions of every slot, then the owner's incarnation.
    versions: ShmArray<u64>,
}

impl TrajectoryPool {
    /// A pool of `num_buffers` zero-filled slots of `shape`.
    pub fn create(shape: TrajectoryShape, num_buffers: usize) -> Result<Self> {
        Ok(Self {
            shape,
            num_buffers,
            floats: ShmArray::create(shape.floats() * num_buffers)?,
            versions: ShmArray::create(shape.steps() * num_buffers + 1)?,
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
            || pool.versions.len() < handle.shape.steps() * handle.num_buffers + 1
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

    /// The shape of every slot.
    pub fn shape(&self) -> TrajectoryShape {
        self.shape
    }

    /// The element range of step `t` of `field` in slot `buffer`, if both exist and `len` fits it.
    fn range(&self, buffer: usize, field: Field, t: usize, len: usize) -> Result<usize> {
        let sh = &self.shape;
        let per_step = sh.num_envs * sh.width(field);
        if buffer >= self.num_buffers || t >= sh.field_steps(field) || len != per_step {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: format!(
                    "slot {buffer} of {}, {field:?} at step {t}: {len} values do not fit (a step holds {per_step})",
                    self.num_buffers
                ),
            });
        }
        Ok(buffer * sh.floats() + sh.field_offset(field) + t * per_step)
    }

    /// Writes step `t` of `field` (every env of the split) in slot `buffer`.
    pub fn put(&self, buffer: usize, field: Field, t: usize, values: &[f32]) -> Result<()> {
        let at = self.range(buffer, field, t, values.len())?;
        self.floats.copy_from_slice(at, values);
        Ok(())
    }

    /// Reads step `t` of `field` (every env of the split) of slot `buffer` into `out`.
    pub fn get(&self, buffer: usize, field: Field, t: usize, out: &mut [f32]) -> Result<()> {
        let at = self.range(buffer, field, t, out.len())?;
        self.floats.copy_to_slice(at, out);
        Ok(())
    }

    /// Records that `version` chose the actions of step `t` of slot `buffer`.
    pub fn put_version(&self, buffer: usize, t: usize, version: u64) -> Result<()> {
        let n = self.shape.num_envs;
        self.range(buffer, Field::LogProbs, t, n)?;
        let at = (buffer * self.shape.rollout + t) * n;
        self.versions.copy_from_slice(at, &vec![version; n]);
        Ok(())
    }

    /// Records the policy version that chose each column's action of step `t` of slot `buffer`
    /// (one version per column).
    pub fn put_versions(&self, buffer: usize, t: usize, versions: &[u64]) -> Result<()> {
        let n = self.shape.num_envs;
        self.range(buffer, Field::LogProbs, t, versions.len())?;
        self.versions
            .copy_from_slice((buffer * self.shape.rollout + t) * n, versions);
        Ok(())
    }

    /// The policy version of every step of slot `buffer`, time-major.
    pub fn versions(&self, buffer: usize) -> Result<Vec<u64>> {
        self.range(buffer, Field::LogProbs, 0, self.shape.num_envs)?;
        let s = self.shape.steps();
        let mut out = vec![0; s];
        self.versions.copy_to_slice(buffer * s, &mut out);
        Ok(out)
    }

    /// Records the incarnation of the worker process that now owns the pool.
    pub fn set_owner(&self, incarnation: u32) {
        self.versions
            .copy_from_slice(self.shape.steps() * self.num_buffers, &[u64::from(incarnation)]);
    }

    /// The incarnation of the worker process that owns the pool.
    pub fn owner(&self) -> u64 {
        let mut w = [0];
        self.versions
            .copy_to_slice(self.shape.steps() * self.num_buffers, &mut w);
        w[0]
    }

    /// A copy of slot `buffer`: its values (every field) and its steps' policy versions, for another machine's
    /// pool of the same shape ([`TrajectoryPool::write_slot`]).
    pub fn read_slot(&self, buffer: usize) -> Result<(Vec<f32>, Vec<u64>)> {
        let versions = self.versions(buffer)?;
        let n = self.shape.floats();
        let mut floats = vec![0.0; n];
        self.floats.copy_to_slice(buffer * n, &mut floats);
        Ok((floats, versions))
    }

    /// Writes a copy made by [`TrajectoryPool::read_slot`] into slot `buffer`.
    pub fn write_slot(&self, buffer: usize, floats: &[f32], versions: &[u64]) -> Result<()> {
        let n = self.shape.floats();
        let s = self.shape.steps();
        if buffer >= self.num_buffers || floats.len() != n || versions.len() != s {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: format!(
                    "a copied slot of {} values and {} versions does not fit slot {buffer} of {} ({n} values, {s} versions)",
                    floats.len(),
                    versions.len(),
                    self.num_buffers
                ),
            });
        }
        self.floats.copy_from_slice(buffer * n, floats);
        self.versions.copy_from_slice(buffer * s, versions);
        Ok(())
    }

    /// A tensor viewing `field` of slot `buffer` without a copy: `[rollout, num_envs, width]`
    /// (`[num_envs, width]` for [`Field::NextObs`]). The pool must live for the rest of the
    /// process (`Box::leak`), since the tensor does not keep it mapped.
    pub fn tensor(&'static self, buffer: usize, field: Field) -> Result<Tensor> {
        let sh = &self.shape;
        let at = self.range(buffer, field, 0, sh.num_envs * sh.width(field))?;
        let dims = [sh.num_envs as i64, sh.width(field) as i64];
        let shape: Vec<i64> = if field.is_after_last_step() {
            dims.to_vec()
        } else {
            [&[sh.rollout as i64][..], &dims].concat()
        };
        Ok(self.floats.tensor(at, &shape)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: TrajectoryShape = TrajectoryShape {
        rollout: 3,
        num_envs: 2,
        obs_dim: 4,
        action_dim: 1,
        state_dim: 0,
    };

    #[test]
    fn steps_written_by_one_mapping_are_read_and_viewed_through_another() {
        let pool = TrajectoryPool::create(SHAPE, 2).unwrap();
        let other: &'static TrajectoryPool =
            Box::leak(Box::new(TrajectoryPool::open(&pool.handle()).unwrap()));
        let view = other.tensor(1, Field::Obs).unwrap();
        for t in 0..3 {
            let obs: Vec<f32> = (0..8).map(|i| (t * 8 + i) as f32).collect();
            pool.put(1, Field::Obs, t, &obs).unwrap();
            pool.put(1, Field::Rewards, t, &[t as f32, 1.0]).unwrap();
            pool.put_version(1, t, 10 + t as u64).unwrap();
        }
        pool.put(1, Field::NextObs, 0, &[9.0; 8]).unwrap();
        pool.put(1, Field::Policy, 2, &[1.0, 0.0]).unwrap();
        let mut rewards = [0.0; 2];
        other.get(1, Field::Rewards, 2, &mut rewards).unwrap();
        assert_eq!(rewards, [2.0, 1.0]);
        assert_eq!(view.size(), [3, 2, 4]);
        assert_eq!(view.double_value(&[2, 1, 3]), 23.0);
        assert_eq!(other.tensor(1, Field::NextObs).unwrap().size(), [2, 4]);
        assert_eq!(other.versions(1).unwrap(), [10, 10, 11, 11, 12, 12]);
        other.put_versions(1, 1, &[20, 21]).unwrap();
        assert_eq!(pool.versions(1).unwrap(), [10, 10, 20, 21, 12, 12]);
        let mut policies = [0.0; 2];
        other.get(1, Field::Policy, 2, &mut policies).unwrap();
        assert_eq!(policies, [1.0, 0.0]);
        // Slot 0 is untouched by slot 1's writes.
        assert_eq!(
            other
                .tensor(0, Field::Obs)
                .unwrap()
                .abs()
                .sum(tch::Kind::Float)
                .double_value(&[]),
            0.0
        );
        pool.set_owner(3);
        assert_eq!(other.owner(), 3);
        // A slot copied into another pool of the same shape reads back the same.
        let (floats, versions) = pool.read_slot(1).unwrap();
        let copy = TrajectoryPool::create(SHAPE, 3).unwrap();
        copy.write_slot(2, &floats, &versions).unwrap();
        assert_eq!(copy.read_slot(2).unwrap(), (floats.clone(), versions.clone()));
        assert_eq!(copy.versions(2).unwrap(), [10, 10, 20, 21, 12, 12]);
        copy.get(2, Field::Rewards, 2, &mut rewards).unwrap();
        assert_eq!(rewards, [2.0, 1.0]);
        assert!(copy.write_slot(3, &floats, &versions).is_err());
        assert!(copy.write_slot(0, &floats[1..], &versions).is_err());
    }

    #[test]
    fn out_of_range_slots_steps_and_sizes_are_errors() {
        let pool = TrajectoryPool::create(SHAPE, 2).unwrap();
        assert!(pool.put(2, Field::Obs, 0, &[0.0; 8]).is_err());
        assert!(pool.put(0, Field::Obs, 3, &[0.0; 8]).is_err());
        assert!(pool.put(0, Field::Obs, 0, &[0.0; 7]).is_err());
        assert!(pool.put(0, Field::NextObs, 1, &[0.0; 8]).is_err());
        assert!(pool.put_version(0, 3, 1).is_err());
        assert!(pool.put_versions(0, 0, &[1]).is_err());
        assert!(pool.versions(2).is_err());
    }
}
