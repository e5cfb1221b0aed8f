//! Environments: `rlf_env`'s API; [`EnvSpec`] and [`Envs`], which make single-agent and
//! multi-agent envs look alike to the sampler (one column per agent of each env); and
//! [`ActionMapper`], which turns a policy's raw actions into what the env accepts.

pub use rlf_env::{
    parse_kwargs, ActionBatch, EnvRegistry, EpisodeStats, MultiVecEnv, Space, StepBuffers, VecBuffers, VecEnv,
};

use crate::config::{ContinuousActionMode, EnvConfig};
use crate::error::{Result, RlfError};

/// What the models and the trajectory slots are built from: one agent's spaces and the agents per
/// env (1 for a single-agent env).
#[derive(Debug, Clone, PartialEq)]
pub struct EnvSpec {
    /// One agent's observation space.
    pub observation_space: Space,
    /// One agent's action space.
    pub action_space: Space,
    /// Agents per env: columns of the trajectory slots per env.
    pub num_agents: usize,
    /// The agents' names (`agent_0` for a single-agent env), which `--agent_policy_map` matches.
    pub agent_names: Vec<String>,
}

impl EnvSpec {
    /// The spec of `cfg`'s env (`--env`, `--env_kwargs`), from a probe env.
    pub fn of(registry: &EnvRegistry, cfg: &EnvConfig) -> Result<Self> {
        if registry.is_multi_agent(&cfg.env) {
            let env = registry.make_multi_agent(&cfg.env, &parse_kwargs(&cfg.env_kwargs)?)?;
            return Ok(Self {
                observation_space: env.observation_space().clone(),
                action_space: env.action_space().clone(),
                num_agents: env.num_agents(),
                agent_names: (0..env.num_agents()).map(|a| env.agent_name(a)).collect(),
            });
        }
        if !cfg.env_kwargs.trim().is_empty() {
            return Err(RlfError::Config(format!(
                "--env_kwargs: {} is a single-agent env and takes no keyword arguments",
                cfg.env
            )));
        }
        let env = registry.make(&cfg.env)?;
        Ok(Self {
            observation_space: env.observation_space().clone(),
            action_space: env.action_space().clone(),
            num_agents: 1,
            agent_names: vec!["agent_0".to_owned()],
        })
    }
}

/// A rollout worker's envs: `n` single-agent envs (one column each, every step valid, final
/// observations of truncated episodes kept) or `n` multi-agent envs (one column per agent; a
/// column is valid at a step when its agent acted in it).
#[derive(Debug)]
pub enum Envs {
    /// Single-agent envs.
    Single(VecEnv),
    /// Multi-agent envs.
    Multi(MultiVecEnv),
}

impl Envs {
    /// `n` envs of `cfg`'s env.
    pub fn make(registry: &EnvRegistry, cfg: &EnvConfig, n: usize) -> Result<Self> {
        if !registry.is_multi_agent(&cfg.env) {
            return Ok(Envs::Single(VecEnv::from_registry(registry, &cfg.env, n)?));
        }
        let kwargs = parse_kwargs(&cfg.env_kwargs)?;
        let envs = (0..n)
            .map(|_| registry.make_multi_agent(&cfg.env, &kwargs))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Envs::Multi(MultiVecEnv::new(envs)?))
    }

    /// Columns: envs × agents.
    pub fn num_columns(&self) -> usize {
        match self {
            Envs::Single(v) => v.num_envs(),
            Envs::Multi(m) => m.num_columns(),
        }
    }

    /// Agents per env (1 for single-agent envs).
    pub fn num_agents(&self) -> usize {
        match self {
            Envs::Single(_) => 1,
            Envs::Multi(m) => m.num_agents(),
        }
    }

    /// The agents' names (`agent_0` for a single-agent env).
    pub fn agent_names(&self) -> Vec<String> {
        match self {
            Envs::Single(_) => vec!["agent_0".to_owned()],
            Envs::Multi(m) => (0..m.num_agents()).map(|a| m.agent_name(a)).collect(),
        }
    }

    /// Values per column's observation.
    pub fn obs_dim(&self) -> usize {
        match self {
            Envs::Single(v) => v.obs_dim(),
            Envs::Multi(m) => m.obs_dim(),
        }
    }

    /// One agent's action space.
    pub fn action_space(&self) -> &Space {
        match self {
            Envs::Single(v) => v.action_space(),
            Envs::Multi(m) => m.action_space(),
        }
    }

    /// Resets every env (env `i` seeded `seed + i`).
    pub fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        match self {
            Envs::Single(v) => v.reset(seed, obs)?,
            Envs::Multi(m) => m.reset(seed, obs)?,
        }
        Ok(())
    }

    /// Steps every env with one action per column.
    pub fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<()> {
        match self {
            Envs::Single(v) => v.step(actions, out)?,
            Envs::Multi(m) => m.step(actions, out)?,
        }
        Ok(())
    }

    /// Whether column `c` acted in the last step (always, for single-agent envs).
    pub fn acted(&self, c: usize) -> bool {
        match self {
            Envs::Single(_) => true,
            Envs::Multi(m) => m.acted().get(c).copied().unwrap_or(false),
        }
    }

    /// Whether column `c` acts in the next step (always, for single-agent envs).
    pub fn acts_next(&self, c: usize) -> bool {
        match self {
            Envs::Single(_) => true,
            Envs::Multi(m) => m.active().get(c).copied().unwrap_or(false),
        }
    }

    /// The last observation of column `c`'s episode that the last step truncated, if kept.
    pub fn final_observation(&self, c: usize) -> Option<&[f32]> {
        match self {
            Envs::Single(v) => v.final_observation(c),
            Envs::Multi(_) => None,
        }
    }

    /// The statistics of column `c`'s episode that ended in the last step.
    pub fn finished(&self, c: usize) -> Option<EpisodeStats> {
        match self {
            Envs::Single(v) => v.infos().get(c).and_then(|i| i.episode),
            Envs::Multi(m) => m.finished().get(c).copied().flatten(),
        }
    }
}

#[derive(Debug, Clone)]
enum Mapping {
    Discrete {
        start: i64,
    },
    MultiDiscrete,
    Continuous {
        low: Vec<f32>,
        high: Vec<f32>,
        mode: ContinuousActionMode,
    },
}

/// Maps raw actions (`f32`: category indices, or an unbounded Gaussian sample) to an env's action
/// space: discrete values shifted by the space's start; continuous ones clipped to the bounds or
/// squashed into them with tanh.
#[derive(Debug, Clone)]
pub struct ActionMapper {
    mapping: Mapping,
    ints: Vec<i64>,
    floats: Vec<f32>,
}

impl ActionMapper {
    /// The mapper for `space`.
    pub fn new(space: &Space, mode: ContinuousActionMode) -> Result<Self> {
        let mapping = match space {
            Space::Discrete { start, .. } => Mapping::Discrete { start: *start },
            Space::MultiDiscrete(_) => Mapping::MultiDiscrete,
            Space::Box(b) => Mapping::Continuous {
                low: b.low().to_vec(),
                high: b.high().to_vec(),
                mode,
            },
            Space::Dict(_) | Space::Tuple(_) => {
                return Err(RlfError::UnsupportedSpace(format!("action space {space}")));
            }
        };
        Ok(Self {
            mapping,
            ints: Vec::new(),
            floats: Vec::new(),
        })
    }

    /// The env actions for `raw` (`n * action_dim` values).
    pub fn map(&mut self, raw: &[f32]) -> ActionBatch<'_> {
        match &self.mapping {
            Mapping::Discrete { start } => {
                self.ints.clear();
                self.ints.extend(raw.iter().map(|&a| a as i64 + start));
                ActionBatch::Discrete(&self.ints)
            }
            Mapping::MultiDiscrete => {
                self.ints.clear();
                self.ints.extend(raw.iter().map(|&a| a as i64));
                ActionBatch::MultiDiscrete(&self.ints)
            }
            Mapping::Continuous { low, high, mode } => {
                self.floats.clear();
                let d = low.len().max(1);
                self.floats.extend(raw.iter().enumerate().map(|(i, &a)| {
                    let (lo, hi) = (low[i % d], high[i % d]);
                    match mode {
                        ContinuousActionMode::Clip => a.clamp(lo, hi),
                        ContinuousActionMode::Tanh if lo.is_finite() && hi.is_finite() => {
                            lo + (a.tanh() + 1.0) * 0.5 * (hi - lo)
                        }
                        ContinuousActionMode::Tanh => a.tanh(),
                    }
                }));
                ActionBatch::Continuous(&self.floats)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_kind() {
        let mut m =
            ActionMapper::new(&Space::Discrete { n: 3, start: -1 }, ContinuousActionMode::Clip).unwrap();
        assert_eq!(m.map(&[0.0, 2.0]), ActionBatch::Discrete(&[-1, 1]));
        let space = Space::box_1d(vec![-2.0], vec![2.0]).unwrap();
        let mut clip = ActionMapper::new(&space, ContinuousActionMode::Clip).unwrap();
        assert_eq!(clip.map(&[5.0, -0.5]), ActionBatch::Continuous(&[2.0, -0.5]));
        let mut squash = ActionMapper::new(&space, ContinuousActionMode::Tanh).unwrap();
        assert_eq!(squash.map(&[0.0]), ActionBatch::Continuous(&[0.0]));
        let ActionBatch::Continuous(x) = squash.map(&[100.0]) else {
            panic!("continuous")
        };
        assert!((x[0] - 2.0).abs() < 1e-6);
    }
}
