//! Sampling: [`RolloutWorker`]s step envs and record trajectories; the [`InferenceWorker`] chooses
//! their actions. The messages between them, and to the batcher and runner, are defined here.

mod buffers;
mod inference;
mod rollout;

use serde::{Deserialize, Serialize};

pub use buffers::{TrajectoryPool, TrajectoryPoolHandle, TrajectoryShape};
pub use inference::InferenceWorker;
pub use rollout::{RolloutWorker, StepOutcome, WorkerCounts};

use crate::model::ActOutput;

/// Observations of one split of a rollout worker, waiting for actions (`policy_requested`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRequest {
    /// The rollout worker.
    pub worker: usize,
    /// The split of its envs.
    pub split: usize,
    /// Which process of the worker asked (a replacement ignores answers to its predecessor).
    pub incarnation: u32,
    /// One observation per env of the split.
    pub obs: Vec<f32>,
}

/// Actions for one split (`actions_ready`), with the version of the policy that chose them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionsReady {
    /// The rollout worker.
    pub worker: usize,
    /// The split of its envs.
    pub split: usize,
    /// The incarnation of the worker that asked.
    pub incarnation: u32,
    /// The policy version.
    pub version: u64,
    /// Actions, log-probabilities and values.
    pub output: ActOutput,
}

/// A trajectory of `len` steps of the `num_envs` envs of one split (`trajectory_ready`), time-major:
/// step `t` of env `i` is at index `t * num_envs + i`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// The rollout worker.
    pub worker: usize,
    /// The split.
    pub split: usize,
    /// Envs in the split.
    pub num_envs: usize,
    /// Steps.
    pub len: usize,
    /// Observations before each step.
    pub obs: Vec<f32>,
    /// Raw actions.
    pub actions: Vec<f32>,
    /// Log-probabilities of the actions.
    pub log_probs: Vec<f32>,
    /// Values of the observations.
    pub values: Vec<f32>,
    /// Rewards.
    pub rewards: Vec<f32>,
    /// Terminal steps.
    pub terminated: Vec<bool>,
    /// Truncated steps.
    pub truncated: Vec<bool>,
    /// The last observation of each truncated episode: (index, observation).
    pub final_obs: Vec<(usize, Vec<f32>)>,
    /// Observations after the last step, one per env.
    pub next_obs: Vec<f32>,
    /// Policy version of each step.
    pub versions: Vec<u64>,
}

/// A finished trajectory waiting in slot `buffer` of `worker`'s [`TrajectoryPool`] (`trajectory_ready`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrajectoryReady {
    /// The rollout worker (owner of the pool).
    pub worker: usize,
    /// The split.
    pub split: usize,
    /// The slot.
    pub buffer: usize,
}

/// Slot `buffer` of a worker's pool is free again (`buffer_released`, to that worker alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferReleased {
    /// The slot.
    pub buffer: usize,
}

/// A rollout worker's process started (`worker_started`, to the batcher and the runner). The
/// batcher answers with [`SlotsReclaimed`]; a replacement (incarnation above 0) also says what
/// its predecessor lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStarted {
    /// The rollout worker.
    pub worker: usize,
    /// Its incarnation (0 for the first process).
    pub incarnation: u32,
    /// Trajectories the predecessors finished but never handed on (parked for a slot).
    pub lost_trajectories: u64,
    /// Env frames the predecessors simulated and never handed on (unfinished and parked trajectories).
    pub lost_frames: u64,
}

/// The slots of a worker's pool the batcher does not hold (`slots_reclaimed`), the answer to
/// [`WorkerStarted`]: the worker's free list. Releases the worker receives before it are already
/// counted in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotsReclaimed {
    /// The incarnation that asked.
    pub incarnation: u32,
    /// The free slots.
    pub free: Vec<usize>,
}

/// Progress of a rollout worker (`rollout_reported`): env frames simulated and episodes finished
/// since its previous report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutReport {
    /// The rollout worker.
    pub worker: usize,
    /// Env frames since the previous report.
    pub env_frames: u64,
    /// Returns of the finished episodes.
    pub episode_returns: Vec<f64>,
    /// Lengths of the finished episodes.
    pub episode_lengths: Vec<u64>,
}
