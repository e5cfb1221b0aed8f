//! Sampling: [`RolloutWorker`]s step envs and record trajectories; the [`InferenceWorker`] chooses
//! their actions. The messages between them, and to the batcher and runner, are defined here.

mod inference;
mod policy_map;
mod rollout;

use serde::{Deserialize, Serialize};

pub use inference::{Exploration, InferenceWorker};
pub use policy_map::{PolicyAssigner, SelfPlay, RESAMPLE_EVERY_EPISODES};
pub use rollout::{ReplayWriter, RolloutWorker, StepOutcome, WorkerCounts, INACTIVE};

/// A split of a rollout worker wrote its observations at step `step` of slot `buffer` of its
/// pool and waits for actions (`policy_requested`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRequest {
    /// The rollout worker.
    pub worker: usize,
    /// The split of its envs.
    pub split: usize,
    /// Which process of the worker asked (a replacement ignores answers to its predecessor).
    pub incarnation: u32,
    /// The slot of the worker's pool.
    pub buffer: usize,
    /// The step of the trajectory.
    pub step: usize,
    /// The group of inference workers asked ([`crate::config::Config::inference_groups`]): with a group per
    /// policy, a split asks each group whose networks play one of its agents (and always group 0), and steps once
    /// every answer came.
    pub group: usize,
}

impl PolicyRequest {
    /// The answer to this request: its split's actions are in the slot.
    pub fn answer(&self) -> ActionsReady {
        ActionsReady {
            worker: self.worker,
            split: self.split,
            incarnation: self.incarnation,
        }
    }
}

/// The actions of a split are in its slot (`actions_ready`), written by an inference worker with
/// their log-probabilities, values and policy version (with a group per policy, the answer says
/// that the group's columns are there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionsReady {
    /// The rollout worker.
    pub worker: usize,
    /// The split of its envs.
    pub split: usize,
    /// The incarnation of the worker that asked.
    pub incarnation: u32,
}

/// A finished trajectory waiting in slot `buffer` of `worker`'s [`TrajectoryPool`](crate::data::TrajectoryPool) (`trajectory_ready`).
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
    /// Env frames the predecessors simulated and never handed on (unfinished trajectories).
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
    /// The true objective of each finished episode: the env's (`info["true_objective"]`), or its
    /// return when the env reports none (Sample Factory's rule).
    pub episode_objectives: Vec<f64>,
    /// Lengths of the finished episodes.
    pub episode_lengths: Vec<u64>,
    /// The policy that played each finished episode.
    pub episode_policies: Vec<usize>,
    /// The agent (its index in its env) of each finished episode.
    pub episode_agents: Vec<usize>,
    /// Agent steps since the previous report, by policy (its latest weights').
    pub policy_frames: Vec<u64>,
    /// Self-play episodes finished against snapshots.
    pub games: Vec<SelfPlayGame>,
}

/// One self-play episode of a policy's latest weights against a snapshot from its pool.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SelfPlayGame {
    /// The policy (its protagonist agent played the latest weights).
    pub policy: usize,
    /// The snapshot's network ([`crate::config::Config::snapshot_network`]).
    pub network: usize,
    /// 1 for a win (a higher episode return than the snapshot's agent), 0.5 a draw, 0 a loss.
    pub score: f64,
}

/// Every learner is to put a snapshot of its policy into its pool (`snapshot_requested`, from
/// the runner every `--snapshot_every_env_steps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRequest {
    /// The snapshot's number (1, 2, ...): it goes into slot [`crate::config::snapshot_slot`]`(number, ...)`.
    pub number: u64,
}

/// A learner put a snapshot of its policy into slot `slot` of the pool (`snapshot_taken`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotTaken {
    /// The policy.
    pub policy: usize,
    /// The slot of its pool.
    pub slot: usize,
    /// The snapshot's number (1 for the run's first snapshot of every policy, and so on).
    pub number: u64,
    /// The policy version the snapshot holds.
    pub version: u64,
}

impl RolloutReport {
    /// An empty report of rollout worker `worker` in a run of `num_policies` policies.
    pub fn new(worker: usize, num_policies: usize) -> Self {
        Self {
            worker,
            policy_frames: vec![0; num_policies.max(1)],
            ..Self::default()
        }
    }
}
