//! The shared-memory data plane: the published weights of each policy, one trajectory pool per
//! rollout worker and the trajectory counters. The main process creates (and at the end removes) the regions;
//! every component maps them by their handles, which child processes receive inside the app's
//! configuration ([`GraphSpec`]).

use rlf_shm::{SharedWeights, SharedWeightsHandle, ShmArray, ShmArrayHandle};
use serde::{Deserialize, Serialize};

use super::counters::CounterLayout;
use crate::config::Config;
use crate::env::{EnvRegistry, EnvSpec};
use crate::error::Result;
use crate::model::{ActorCritic, Policy};
use crate::sampling::{TrajectoryPool, TrajectoryPoolHandle, TrajectoryShape};

/// Handles of the regions, for the processes that map them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct DataPlane {
    /// The published weights of each network: every policy's, by policy index, then the
    /// self-play snapshots ([`Config::snapshot_network`]).
    pub weights: Vec<SharedWeightsHandle>,
    pub pools: Vec<TrajectoryPoolHandle>,
    pub counters: ShmArrayHandle,
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

    /// Maps every rollout worker's pool.
    pub fn open_pools(&self) -> Result<Vec<TrajectoryPool>> {
        self.pools.iter().map(TrajectoryPool::open).collect()
    }
}

/// What a child process rebuilds the graph from: the resolved config and the data plane.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct GraphSpec {
    pub config: Config,
    pub plane: DataPlane,
}

/// The regions behind a [`DataPlane`], owned (and removed at the end) by the main process.
pub(super) struct PlaneRegions {
    /// Each network's published weights (see [`DataPlane::weights`]).
    pub weights: Vec<SharedWeights>,
    _pools: Vec<TrajectoryPool>,
    pub counters: ShmArray<u64>,
    pub plane: DataPlane,
}

/// Slots per rollout worker's trajectory pool: per split, one to fill and its share of the
/// slots that `--num_batches_to_accumulate` + 1 datasets hold (a slot stays with the batcher and
/// the learner until the dataset closing it is trained on). With several policies a slot feeds
/// each policy's datasets and stays until all are trained on: each policy's datasets in flight
/// hold their share. When the learners fall that far behind, the workers run out of slots and
/// wait: sampling stops.
fn buffers_per_worker(cfg: &Config, num_agents: usize) -> usize {
    let s = &cfg.sampling;
    let splits = s.worker_num_splits;
    let per_split = s.num_envs_per_worker / splits * num_agents;
    let per_dataset = cfg.dataset_size().div_ceil(s.rollout * per_split);
    let held = (per_dataset * (cfg.appo.num_batches_to_accumulate + 1) * s.num_policies)
        .div_ceil(s.num_workers * splits);
    splits * (1 + held.max(1))
}

/// Creates the regions for `cfg`.
pub(super) fn create_plane(cfg: &Config, registry: &EnvRegistry) -> Result<PlaneRegions> {
    // Each network's size: policies whose agents differ have networks of their own shapes.
    let models = (0..cfg.sampling.num_policies)
        .map(|p| new_model(cfg, registry, p))
        .collect::<Result<Vec<_>>>()?;
    let sizes = models
        .iter()
        .map(|m| Ok(m.weights()?.values.len()))
        .collect::<Result<Vec<_>>>()?;
    let weights = (0..cfg.num_networks())
        .map(|n| SharedWeights::create(sizes[cfg.policy_of_network(n)]))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let s = &cfg.sampling;
    let spec = EnvSpec::of(registry, &cfg.env)?;
    let num_agents = spec.num_agents;
    // One column per agent of each env, as wide as the largest agent's observation.
    let shape = TrajectoryShape {
        rollout: s.rollout,
        num_envs: s.num_envs_per_worker / s.worker_num_splits * num_agents,
        obs_dim: spec.obs_dim,
        action_dim: models[0].action_dim(),
    };
    let pools = (0..s.num_workers)
        .map(|_| TrajectoryPool::create(shape, buffers_per_worker(cfg, num_agents)))
        .collect::<Result<Vec<_>>>()?;
    let layout = CounterLayout {
        workers: s.num_workers,
    };
    let counters = ShmArray::create(layout.len())?;
    let plane = DataPlane {
        weights: weights.iter().map(SharedWeights::handle).collect(),
        pools: pools.iter().map(TrajectoryPool::handle).collect(),
        counters: counters.handle(),
    };
    Ok(PlaneRegions {
        weights,
        _pools: pools,
        counters,
        plane,
    })
}

/// The network of policy `policy` for `cfg`'s env, seeded by `--seed` and the policy: every
/// process that builds it starts from the same weights, and policies start from different ones.
pub(super) fn new_model(cfg: &Config, registry: &EnvRegistry, policy: usize) -> Result<ActorCritic> {
    let spec = EnvSpec::of(registry, &cfg.env)?;
    let mapping = cfg.policy_mapping(&spec.agent_names)?;
    let (observation_space, action_space) = spec.policy_spaces(policy, mapping.by_agent.as_deref())?;
    ActorCritic::seed(cfg.env.seed.wrapping_add(policy as u64 * 1_000_003));
    ActorCritic::new(observation_space, action_space, &cfg.model, cfg.run.device)
}
