//! What a run reports at its end (`--summary_json`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `--train_for_env_steps` reached.
    EnvSteps,
    /// `--train_for_seconds` reached.
    Seconds,
    /// `--stop_at_reward` reached.
    Reward,
    /// A component failed.
    Failed,
    /// SIGINT or SIGTERM (a checkpoint was saved).
    Interrupted,
    /// Another learner rank of the policy stopped (several learners under MPI: they stop together).
    OtherLearner,
}

/// One policy's part of a run.
#[derive(Debug, Clone, Serialize)]
pub struct PolicySummary {
    /// Mean return of its last 100 episodes.
    pub mean_return: Option<f64>,
    /// Mean true objective of the same episodes (the return where the env reports none).
    pub true_objective: Option<f64>,
    /// Episodes its agents finished.
    pub episodes: u64,
    /// Agent steps it took.
    pub agent_steps: u64,
    /// Its final version (SGD steps).
    pub policy_version: u64,
    /// With `--self_play`: its record against its pool.
    pub self_play: Option<SelfPlaySummary>,
}

/// One agent's episodes (of every env, by its index in its env), for multi-agent envs.
#[derive(Debug, Clone, Serialize)]
pub struct AgentSummary {
    /// Its name (PettingZoo's agent id, `agent_<i>` otherwise).
    pub name: String,
    /// Mean return of its last `--stats_avg` episodes.
    pub mean_return: Option<f64>,
    /// Mean true objective of the same episodes.
    pub true_objective: Option<f64>,
    /// Its episodes finished.
    pub episodes: u64,
}

/// A policy's self-play record (also what `self_play_<i>.json` keeps across a resume).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SelfPlaySummary {
    /// Episodes its latest weights played against snapshots.
    pub games: u64,
    /// Mean score of the last 100 of them (win 1, draw 0.5, loss 0).
    pub win_rate_vs_pool: Option<f64>,
    /// The Elo rating of its latest weights (all start at 1200).
    pub elo: f64,
    /// The snapshots in its pool.
    pub pool: Vec<SnapshotSummary>,
    /// Its record against each built-in opponent (`--self_play_builtin_opponents`).
    pub builtin: Vec<BuiltinSummary>,
}

/// What `self_play_<i>.json` keeps across a resume: a policy's self-play record and the env frames it was taken at
/// (those of the checkpoint saved with it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedSelfPlay {
    /// Env frames of the run when the record was written.
    pub env_frames: u64,
    /// The record; its pool also lists the snapshots a resumed run had not put back yet.
    pub record: SelfPlaySummary,
}

/// An off-policy policy's replay buffer at the end of a run.
#[derive(Debug, Clone, Serialize)]
pub struct ReplaySummary {
    /// Rows it holds at most.
    pub capacity: usize,
    /// Transitions inserted (n-step rows).
    pub inserted: u64,
    /// Transitions its learner sampled (a batch counts its size).
    pub sampled: u64,
    /// Samples per transition inserted past `--learning_starts`: the measured `--replay_ratio` (none before then).
    pub samples_per_insert: Option<f64>,
    /// Writers that died holding its write lock (their rows never became visible).
    pub writer_deaths: u64,
}

/// A policy's games against a built-in opponent in self-play.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuiltinSummary {
    /// The player's name (`heuristic`).
    pub name: String,
    /// Episodes its latest weights played against it.
    pub games: u64,
    /// Mean score of the last 100 of them (win 1, draw 0.5, loss 0).
    pub win_rate: Option<f64>,
}

/// A snapshot in a self-play pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotSummary {
    /// Its slot in the pool.
    pub slot: usize,
    /// Its number (the run's n-th snapshot).
    pub number: u64,
    /// The policy version it holds.
    pub policy_version: u64,
    /// Its Elo rating (its policy's when it was taken, then moved by its games).
    pub elo: f64,
    /// Games it played against the latest weights.
    pub games: u64,
}

/// The outcome of a run, written by `--summary_json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Env frames simulated.
    pub env_frames: u64,
    /// Seconds from the kernel's start of the process (before `main`) to the end of training.
    pub wall_seconds: f64,
    /// Steady-state env frames per second: from the first rollout report after the warm-up
    /// ([`warm_up`](super::warm_up)) to the last one counted (the overall rate if no report came after the warm-up).
    pub fps: f64,
    /// Env frames per second of training (from the start of sampling).
    pub fps_overall: f64,
    /// Mean return of the last 100 episodes, whatever policy played them (`null` before the
    /// first episode ends).
    pub mean_return: Option<f64>,
    /// Each policy's returns, episodes, agent steps and version, by policy index.
    pub policies: Vec<PolicySummary>,
    /// Per agent of a multi-agent env (empty for a single-agent env).
    pub agents: Vec<AgentSummary>,
    /// Whether `--stop_at_reward` was reached.
    pub reached_reward: bool,
    /// Env frames when the reward was reached.
    pub frames_to_reward: Option<u64>,
    /// Seconds from the kernel's start of the process when the reward was reached.
    pub seconds_to_reward: Option<f64>,
    /// Episodes finished.
    pub episodes: u64,
    /// Final version (SGD steps) of policy 0.
    pub policy_version: u64,
    /// Why the run stopped.
    pub stop_reason: StopReason,
    /// The last training metrics of policy 0.
    pub last_metrics: Vec<(String, f64)>,
    /// Digest of the first dataset trained on (16 hex digits; see `Dataset::digest`): runs that
    /// train on the same first data have the same.
    pub first_dataset_digest: Option<String>,
    /// The signal that interrupted the run (SIGINT = 2, SIGTERM = 15), if one did.
    pub signal: Option<i32>,
    /// Trajectories finished by the rollout workers.
    pub trajectories_produced: u64,
    /// Trajectories whose last sequence the learner trained on (APPO; an off-policy run's trajectories go into its
    /// replay buffers as they finish, counted in `replay`, and this stays 0).
    pub trajectories_trained: u64,
    /// Trajectories the batcher dropped as wholly older than `--max_policy_lag` versions.
    pub trajectories_dropped: u64,
    /// Trajectories discarded at stop: signalled but unread, in the batcher, or in datasets not
    /// trained on. Produced = trained + dropped + in flight (APPO).
    pub trajectories_in_flight: u64,
    /// Off-policy: each policy's replay buffer at the end, by policy index (empty for APPO).
    pub replay: Vec<ReplaySummary>,
    /// Env frames of unfinished trajectories of rollout-worker processes that died or hung.
    pub env_frames_lost: u64,
    /// Env frames the rollout workers stepped, in their finished trajectories and in those a stop cut short (on one
    /// machine; `env_frames` counts the finished ones).
    pub env_frames_stepped: u64,
    /// Rollout-worker processes replaced after they died or hung.
    pub worker_restarts: u64,
    /// CPU seconds of each event loop: a component's process (rollout and inference workers, the
    /// learner with the batcher; for a replaced worker, its last process) or, for `main` (the
    /// runner, and every component in serial mode), the main thread.
    pub cpu_seconds: BTreeMap<String, f64>,
}
