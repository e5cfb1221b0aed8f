//! Environments: `rlf_env`'s API; [`EnvSpec`] and [`Envs`], which make single-agent and
//! multi-agent envs look alike to the sampler (one column per agent of each env); and
//! [`ActionMapper`], which turns a policy's raw actions into what the env accepts.

pub mod group;

pub use rlf_env::{
    parse_kwargs, ActionBatch, EnvRegistry, EpisodeStats, Frame, MultiVecEnv, Ply, PlyModel, Space,
    StepBuffers, VecBuffers, VecEnv,
};

use std::sync::Arc;

use rlf_env::wrappers::{RescaleObservation, SelectObservation};
use rlf_env::Env;

use rand_pcg::Pcg64Mcg;

use self::group::{EnvGroup, GroupVecEnv};
use crate::config::{ContinuousActionMode, EnvConfig};
use crate::error::{Result, RlfError};

/// What the models and the trajectory slots are built from: each agent's spaces, the agents per
/// env (1 for a single-agent env) and the slots' widths.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EnvSpec {
    /// Each agent's observation space.
    pub observation_spaces: Vec<Space>,
    /// Each agent's action space.
    pub action_spaces: Vec<Space>,
    /// Agents per env: columns of the trajectory slots per env.
    pub num_agents: usize,
    /// The agents' names (`agent_0` for a single-agent env), which `--agent_policy_map` matches.
    pub agent_names: Vec<String>,
    /// Values per observation slot: the largest agent's observation.
    pub obs_dim: usize,
    /// The env's built-in players ([`rlf_env::MultiAgentEnv::builtin_players`]).
    pub builtin_players: Vec<String>,
    /// Each agent's team ([`rlf_env::MultiAgentEnv::team`]).
    pub teams: Vec<usize>,
    /// Why the env cannot save its state for an exact resume (`Env::save_state`); `None` when it can.
    pub cannot_save_state: Option<String>,
    /// Whether the env has its rules as a model (`rlf_env::MultiAgentEnv::ply_model`), which `--lookahead_coeff`
    /// looks ahead in.
    #[serde(default)]
    pub has_ply_model: bool,
}

impl EnvSpec {
    /// The spec of `cfg`'s env (`--env`, `--env_kwargs`), from a probe env.
    pub fn of(registry: &EnvRegistry, cfg: &EnvConfig) -> Result<Self> {
        if registry.is_multi_agent(&cfg.env) {
            if !cfg.obs_mask.trim().is_empty() {
                return Err(RlfError::Config(format!(
                    "--obs_mask hides values of a single-agent env's observations; {} is a multi-agent env",
                    cfg.env
                )));
            }
            if cfg.rescale_obs {
                return Err(RlfError::Config(format!(
                    "--rescale_obs rescales a single-agent env's observations; {} is a multi-agent env",
                    cfg.env
                )));
            }
            let env = registry.make_multi_agent(&cfg.env, &parse_kwargs(&cfg.env_kwargs)?)?;
            let n = env.num_agents();
            return Ok(Self {
                observation_spaces: (0..n).map(|a| env.agent_observation_space(a).clone()).collect(),
                action_spaces: (0..n).map(|a| env.agent_action_space(a).clone()).collect(),
                num_agents: n,
                agent_names: (0..n).map(|a| env.agent_name(a)).collect(),
                obs_dim: env.obs_dim(),
                builtin_players: env.builtin_players().iter().map(|&p| p.to_owned()).collect(),
                teams: (0..n).map(|a| env.team(a)).collect(),
                cannot_save_state: Some("multi-agent envs keep no exact state".into()),
                has_ply_model: env.ply_model().is_some(),
            });
        }
        if !cfg.env_kwargs.trim().is_empty() {
            return Err(RlfError::Config(format!(
                "--env_kwargs: {} is a single-agent env and takes no keyword arguments",
                cfg.env
            )));
        }
        let env = make_single(registry, cfg)?;
        Ok(Self {
            observation_spaces: vec![env.observation_space().clone()],
            action_spaces: vec![env.action_space().clone()],
            num_agents: 1,
            agent_names: vec!["agent_0".to_owned()],
            obs_dim: env.observation_space().flat_dim(),
            builtin_players: Vec::new(),
            teams: vec![0],
            cannot_save_state: env
                .save_state(&mut Vec::new())
                .err()
                .map(|e| format!("the env cannot save its state: {e}")),
            has_ply_model: false,
        })
    }

    /// The rules of `cfg`'s env as a model a learner looks ahead in ([`rlf_env::MultiAgentEnv::ply_model`]), from a
    /// probe env; `None` for an env without one.
    pub fn ply_model(registry: &EnvRegistry, cfg: &EnvConfig) -> Result<Option<Arc<dyn PlyModel>>> {
        if !registry.is_multi_agent(&cfg.env) {
            return Ok(None);
        }
        Ok(registry
            .make_multi_agent(&cfg.env, &parse_kwargs(&cfg.env_kwargs)?)?
            .ply_model())
    }

    /// Whether every agent has the same spaces.
    pub fn agents_alike(&self) -> bool {
        let same = |v: &[Space]| v.iter().all(|s| s == &v[0]);
        same(&self.observation_spaces) && same(&self.action_spaces)
    }

    /// The observation and action spaces of the network of `policy`, whose agents `by_agent`
    /// (`--agent_policy_map`, parsed) names: every agent's when they are alike; otherwise those of
    /// the agents mapped to it, which must be alike and at least one. Agents that differ without
    /// an explicit map, a policy mapped to agents that differ, and one mapped to none are errors.
    pub fn policy_spaces(&self, policy: usize, by_agent: Option<&[usize]>) -> Result<(&Space, &Space)> {
        let spaces = |a: usize| (&self.observation_spaces[a], &self.action_spaces[a]);
        if self.agents_alike() {
            return Ok(spaces(0));
        }
        let describe = |a: usize| {
            format!(
                "`{}` (observations {}, actions {})",
                self.agent_names[a], self.observation_spaces[a], self.action_spaces[a]
            )
        };
        let Some(by_agent) = by_agent else {
            let other = (1..self.num_agents)
                .find(|&a| spaces(a) != spaces(0))
                .unwrap_or(0);
            return Err(RlfError::Config(format!(
                "--agent_policy_map: the agents have different spaces ({} and {}); map them to separate \
                 policies by name, e.g. --num_policies 2 --agent_policy_map {}=0,{}=1",
                describe(0),
                describe(other),
                self.agent_names[0],
                self.agent_names[other]
            )));
        };
        let mut mine = (0..self.num_agents).filter(|&a| by_agent.get(a) == Some(&policy));
        let Some(first) = mine.next() else {
            return Err(RlfError::Config(format!(
                "--agent_policy_map: policy {policy} controls no agent, and the agents have different spaces \
                 (its network would have none to take)"
            )));
        };
        if let Some(other) = mine.find(|&a| spaces(a) != spaces(first)) {
            return Err(RlfError::Config(format!(
                "--agent_policy_map: policy {policy} controls agents with different spaces, {} and {}",
                describe(first),
                describe(other)
            )));
        }
        Ok(spaces(first))
    }
}

/// The values `--obs_mask` keeps (none: all).
fn obs_mask(cfg: &EnvConfig) -> Result<Option<Vec<usize>>> {
    let mask = cfg.obs_mask.trim();
    if mask.is_empty() {
        return Ok(None);
    }
    mask.split(',')
        .map(|k| {
            k.trim().parse::<usize>().map_err(|_| {
                RlfError::Config(format!(
                    "--obs_mask {mask}: `{}` is not an observation index (0, 1, ...)",
                    k.trim()
                ))
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// One env of `cfg`'s single-agent env, showing the values `--obs_mask` keeps, rescaled onto [-1, 1] with
/// `--rescale_obs`.
pub fn make_single(registry: &EnvRegistry, cfg: &EnvConfig) -> Result<Box<dyn Env>> {
    let env = registry.make(&cfg.env)?;
    let env: Box<dyn Env> = match obs_mask(cfg)? {
        None => env,
        Some(keep) => Box::new(
            SelectObservation::new(env, keep)
                .map_err(|e| RlfError::Config(format!("--obs_mask {}: {e}", cfg.obs_mask)))?,
        ),
    };
    if !cfg.rescale_obs {
        return Ok(env);
    }
    Ok(Box::new(
        RescaleObservation::new(env).map_err(|e| RlfError::Config(format!("--rescale_obs: {e}")))?,
    ))
}

/// `n` envs of `cfg`'s single-agent env, stepped together.
pub fn single_envs(registry: &EnvRegistry, cfg: &EnvConfig, n: usize) -> Result<VecEnv> {
    Ok(VecEnv::new(
        (0..n)
            .map(|_| make_single(registry, cfg))
            .collect::<Result<_>>()?,
    )?)
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
    /// Single-agent envs stepped over an env group's ranks (`--process_per_env` under `--mpi`).
    Group(Box<GroupVecEnv>),
}

impl Envs {
    /// `n` envs of `cfg`'s env.
    pub fn make(registry: &EnvRegistry, cfg: &EnvConfig, n: usize) -> Result<Self> {
        if !registry.is_multi_agent(&cfg.env) {
            return Ok(Envs::Single(single_envs(registry, cfg, n)?));
        }
        let kwargs = parse_kwargs(&cfg.env_kwargs)?;
        let envs = (0..n)
            .map(|_| registry.make_multi_agent(&cfg.env, &kwargs))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Envs::Multi(MultiVecEnv::new(envs)?))
    }

    /// `n` envs of `cfg`'s single-agent env stepped over `group`'s ranks, on the communicator of the lead's split
    /// `channel` (the members serve it: [`crate::env::group::serve_share`]).
    pub fn make_in_group(
        registry: &EnvRegistry,
        cfg: &EnvConfig,
        n: usize,
        group: &EnvGroup,
        channel: usize,
    ) -> Result<Self> {
        let comm = group.comm(channel)?;
        let group = GroupVecEnv::lead(comm, n, |k| single_envs(registry, cfg, k))?;
        Ok(Envs::Group(Box::new(group)))
    }

    /// Env `i` of single-agent envs as a picture ([`rlf_env::Env::render`]); `None` for an env that draws nothing
    /// and for multi-agent envs and env groups.
    pub fn render(&mut self, i: usize) -> Result<Option<Frame>> {
        match self {
            Envs::Single(v) => Ok(v.render(i)?),
            Envs::Multi(_) | Envs::Group(_) => Ok(None),
        }
    }

    /// Appends the envs' whole state for an exact resume ([`rlf_env::Env::save_state`]): single-agent envs on this
    /// machine only.
    pub fn save_state(&self, out: &mut Vec<u8>) -> Result<()> {
        match self {
            Envs::Single(v) => Ok(v.save_state(out)?),
            Envs::Multi(_) | Envs::Group(_) => Err(RlfError::Config(
                "multi-agent envs and env groups keep no state for an exact resume".into(),
            )),
        }
    }

    /// Takes back what [`save_state`](Self::save_state) wrote.
    pub fn load_state(&mut self, input: &mut &[u8]) -> Result<()> {
        match self {
            Envs::Single(v) => Ok(v.load_state(input)?),
            Envs::Multi(_) | Envs::Group(_) => Err(RlfError::Config(
                "multi-agent envs and env groups keep no state for an exact resume".into(),
            )),
        }
    }

    /// Columns: envs × agents.
    pub fn num_columns(&self) -> usize {
        match self {
            Envs::Single(v) => v.num_envs(),
            Envs::Group(g) => g.num_envs(),
            Envs::Multi(m) => m.num_columns(),
        }
    }

    /// Agents per env (1 for single-agent envs).
    pub fn num_agents(&self) -> usize {
        match self {
            Envs::Single(_) | Envs::Group(_) => 1,
            Envs::Multi(m) => m.num_agents(),
        }
    }

    /// The agents' names (`agent_0` for a single-agent env).
    pub fn agent_names(&self) -> Vec<String> {
        match self {
            Envs::Single(_) | Envs::Group(_) => vec!["agent_0".to_owned()],
            Envs::Multi(m) => (0..m.num_agents()).map(|a| m.agent_name(a)).collect(),
        }
    }

    /// Each agent's team ([`rlf_env::MultiAgentEnv::team`]; 0 for a single-agent env).
    pub fn teams(&self) -> Vec<usize> {
        match self {
            Envs::Single(_) | Envs::Group(_) => vec![0],
            Envs::Multi(m) => (0..m.num_agents()).map(|a| m.team(a)).collect(),
        }
    }

    /// Values per column's observation.
    pub fn obs_dim(&self) -> usize {
        match self {
            Envs::Single(v) => v.obs_dim(),
            Envs::Group(g) => g.obs_dim(),
            Envs::Multi(m) => m.obs_dim(),
        }
    }

    /// Each agent's action space, by agent.
    pub fn action_spaces(&self) -> Vec<Space> {
        match self {
            Envs::Single(v) => vec![v.action_space().clone()],
            Envs::Group(g) => vec![g.action_space().clone()],
            Envs::Multi(m) => (0..m.num_agents())
                .filter_map(|a| m.agent_action_space(a).cloned())
                .collect(),
        }
    }

    /// The names of the envs' built-in players (none for single-agent envs).
    pub fn builtin_players(&self) -> &[&'static str] {
        match self {
            Envs::Single(_) | Envs::Group(_) => &[],
            Envs::Multi(m) => m.builtin_players(),
        }
    }

    /// The action (an index into its `Discrete` space) built-in player `player` takes as column
    /// `c`'s agent now; `None` when the agent does not act next.
    pub fn builtin_action(&self, c: usize, player: usize, rng: &mut Pcg64Mcg) -> Option<usize> {
        match self {
            Envs::Single(_) | Envs::Group(_) => None,
            Envs::Multi(m) => m.builtin_action(c, player, rng),
        }
    }

    /// Resets every env (env `i` seeded `seed + i`).
    pub fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        match self {
            Envs::Single(v) => v.reset(seed, obs)?,
            Envs::Group(g) => g.reset(seed, obs)?,
            Envs::Multi(m) => m.reset(seed, obs)?,
        }
        Ok(())
    }

    /// Steps every env with one action per column.
    pub fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<()> {
        match self {
            Envs::Single(v) => v.step(actions, out)?,
            Envs::Group(g) => g.step(actions, out)?,
            Envs::Multi(m) => m.step(actions, out)?,
        }
        Ok(())
    }

    /// Whether column `c` acted in the last step (always, for single-agent envs).
    pub fn acted(&self, c: usize) -> bool {
        match self {
            Envs::Single(_) | Envs::Group(_) => true,
            Envs::Multi(m) => m.acted().get(c).copied().unwrap_or(false),
        }
    }

    /// Whether column `c` acts in the next step (always, for single-agent envs).
    pub fn acts_next(&self, c: usize) -> bool {
        match self {
            Envs::Single(_) | Envs::Group(_) => true,
            Envs::Multi(m) => m.active().get(c).copied().unwrap_or(false),
        }
    }

    /// The last observation of column `c`'s episode that the last step truncated, if kept.
    pub fn final_observation(&self, c: usize) -> Option<&[f32]> {
        match self {
            Envs::Single(v) => v.final_observation(c),
            Envs::Group(g) => g.final_observation(c),
            Envs::Multi(_) => None,
        }
    }

    /// The statistics of column `c`'s episode that ended in the last step.
    pub fn finished(&self, c: usize) -> Option<EpisodeStats> {
        match self {
            Envs::Single(v) => v.infos().get(c).and_then(|i| i.episode),
            Envs::Group(g) => g.infos().get(c).and_then(|i| i.episode),
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
/// squashed into them with tanh. A multi-agent env's agents may differ in these: column `c` is mapped
/// by agent `c % agents`'s space, and agents whose spaces differ in kind or size get
/// [`ActionBatch::Mixed`] batches (each slot as large as the largest agent's action).
#[derive(Debug, Clone)]
pub struct ActionMapper {
    /// By agent.
    mappings: Vec<Mapping>,
    action_dim: usize,
    mixed: bool,
    ints: Vec<i64>,
    floats: Vec<f32>,
}

impl Mapping {
    fn of(space: &Space, mode: ContinuousActionMode) -> Result<Self> {
        Ok(match space {
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
        })
    }

    /// Value `k` of a raw action `a` as the env takes it, as an integer.
    fn int(&self, k: usize, a: f32) -> i64 {
        match self {
            Mapping::Discrete { start } if k == 0 => a as i64 + start,
            _ => a as i64,
        }
    }

    /// Value `k` of a raw action `a` as the env takes it, as a float (unchanged past a box's size).
    fn float(&self, k: usize, a: f32) -> f32 {
        let Mapping::Continuous { low, high, mode } = self else {
            return a;
        };
        let (Some(&lo), Some(&hi)) = (low.get(k), high.get(k)) else {
            return a;
        };
        match mode {
            ContinuousActionMode::Clip => a.clamp(lo, hi),
            ContinuousActionMode::Tanh if lo.is_finite() && hi.is_finite() => {
                lo + (a.tanh() + 1.0) * 0.5 * (hi - lo)
            }
            ContinuousActionMode::Tanh => a.tanh(),
            ContinuousActionMode::Scale if lo.is_finite() && hi.is_finite() => {
                lo + (a.clamp(-1.0, 1.0) + 1.0) * 0.5 * (hi - lo)
            }
            ContinuousActionMode::Scale => a.clamp(-1.0, 1.0),
        }
    }
}

impl ActionMapper {
    /// The mapper for one action space.
    pub fn new(space: &Space, mode: ContinuousActionMode) -> Result<Self> {
        Self::for_agents(std::slice::from_ref(space), mode)
    }

    /// The mapper for the agents' action spaces (by agent).
    pub fn for_agents(spaces: &[Space], mode: ContinuousActionMode) -> Result<Self> {
        let slots = rlf_env::action_slots("the action mapper", spaces)?;
        Ok(Self {
            mappings: spaces
                .iter()
                .map(|s| Mapping::of(s, mode))
                .collect::<Result<_>>()?,
            action_dim: slots.size,
            mixed: slots.mixed,
            ints: Vec::new(),
            floats: Vec::new(),
        })
    }

    /// Values per action slot: the largest agent's action.
    pub fn action_dim(&self) -> usize {
        self.action_dim
    }

    /// The env actions for `raw` (`n * action_dim` values).
    pub fn map(&mut self, raw: &[f32]) -> ActionBatch<'_> {
        let (agents, dim) = (self.mappings.len().max(1), self.action_dim.max(1));
        let mappings = &self.mappings;
        let of = |i: usize| (&mappings[(i / dim) % agents], i % dim);
        let ints = |ints: &mut Vec<i64>| {
            ints.clear();
            ints.extend(raw.iter().enumerate().map(|(i, &a)| {
                let (m, k) = of(i);
                m.int(k, a)
            }));
        };
        let floats = |floats: &mut Vec<f32>| {
            floats.clear();
            floats.extend(raw.iter().enumerate().map(|(i, &a)| {
                let (m, k) = of(i);
                m.float(k, a)
            }));
        };
        if self.mixed {
            ints(&mut self.ints);
            floats(&mut self.floats);
            return ActionBatch::Mixed {
                ints: &self.ints,
                floats: &self.floats,
            };
        }
        match &self.mappings[0] {
            Mapping::Discrete { .. } => {
                ints(&mut self.ints);
                ActionBatch::Discrete(&self.ints)
            }
            Mapping::MultiDiscrete => {
                ints(&mut self.ints);
                ActionBatch::MultiDiscrete(&self.ints)
            }
            Mapping::Continuous { .. } => {
                floats(&mut self.floats);
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
        let mut scale = ActionMapper::new(&space, ContinuousActionMode::Scale).unwrap();
        assert_eq!(
            scale.map(&[-1.0, 0.25, 3.0]),
            ActionBatch::Continuous(&[-2.0, 0.5, 2.0])
        );
    }

    #[test]
    fn each_column_takes_its_agents_mapping() {
        let spaces = [
            Space::Discrete { n: 3, start: 0 },
            Space::Discrete { n: 5, start: 10 },
        ];
        let mut m = ActionMapper::for_agents(&spaces, ContinuousActionMode::Clip).unwrap();
        assert_eq!(
            m.map(&[1.0, 1.0, 2.0, 4.0]),
            ActionBatch::Discrete(&[1, 11, 2, 14])
        );
        let boxes = [
            Space::box_1d(vec![-1.0, -1.0], vec![1.0, 1.0]).unwrap(),
            Space::box_1d(vec![0.0, 0.0], vec![5.0, 5.0]).unwrap(),
        ];
        let mut m = ActionMapper::for_agents(&boxes, ContinuousActionMode::Clip).unwrap();
        assert_eq!(
            m.map(&[3.0, -3.0, 3.0, -3.0]),
            ActionBatch::Continuous(&[1.0, -1.0, 3.0, 0.0])
        );
        // A discrete agent beside a box of two: slots of two, each read both ways, each agent's
        // values mapped by its own space (the discrete one shifted by its start, the box clipped).
        let mixed = [Space::Discrete { n: 3, start: 5 }, boxes[1].clone()];
        let mut m = ActionMapper::for_agents(&mixed, ContinuousActionMode::Clip).unwrap();
        let batch = m.map(&[2.0, 0.0, 7.0, -1.0]);
        assert_eq!(
            batch,
            ActionBatch::Mixed {
                ints: &[7, 0, 7, -1],
                floats: &[2.0, 0.0, 5.0, 0.0]
            }
        );
        assert_eq!(batch.get_as(0, 2, &mixed[0]), Some(rlf_env::Action::Discrete(7)));
        assert_eq!(
            batch.get_as(1, 2, &mixed[1]),
            Some(rlf_env::Action::Continuous(&[5.0, 0.0]))
        );
    }
}
