//! [`MultiVecEnv`]: N multi-agent envs stepped in one call into contiguous buffers, one column
//! per agent of each env, as a rollout worker steps them.
//!
//! Column `e * num_agents + a` is agent `a` of env `e`: it owns `obs[c * obs_dim..(c + 1) *
//! obs_dim]`, `rewards[c]`, `terminated[c]`, `truncated[c]` and action chunk `c`. Each env keeps the
//! [`MultiAgentEnv`] contract: it resets itself when its episode ends, and
//! [`active`](MultiVecEnv::active) says which columns act in the next step (the others' actions
//! are ignored). After a step, [`acted`](MultiVecEnv::acted) says which columns acted in it and
//! [`finished`](MultiVecEnv::finished) holds the statistics of the agents' episodes that ended in
//! it (return: every reward the agent received; length: the steps it acted in).

use rand_pcg::Pcg64Mcg;

use crate::env::check_observation;
use crate::vector::in_slot;
use crate::{ActionBatch, AgentEpisodes, EnvError, EpisodeStats, MultiAgentEnv, Space, StepBuffers};

/// How agents' actions share the slots of a batch: every slot is as large as the largest agent's action
/// ([`Space::action_dim`]), and when the agents' action spaces differ in kind or size the batches are
/// [`ActionBatch::Mixed`] (each env reads its agents' slots by their spaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionSlots {
    /// Numbers per slot.
    pub size: usize,
    /// Whether the agents' action spaces differ in kind or size.
    pub mixed: bool,
}

/// The [`ActionSlots`] of agents with the action spaces `spaces` (one per agent): discrete, box or
/// multi-discrete; any other space, or no agent, is an error naming `env`.
pub fn action_slots(env: &str, spaces: &[Space]) -> Result<ActionSlots, EnvError> {
    let kind = |s: &Space| match s {
        Space::Discrete { .. } => Some(0),
        Space::Box(_) => Some(1),
        Space::MultiDiscrete(_) => Some(2),
        Space::Dict(_) | Space::Tuple(_) => None,
    };
    let Some(first) = spaces.first() else {
        return Err(EnvError::Unsupported {
            env: env.to_owned(),
            what: "an env of 0 agents".into(),
        });
    };
    let mut slots = ActionSlots {
        size: 0,
        mixed: false,
    };
    for space in spaces {
        let (Some(dim), Some(k)) = (space.action_dim(), kind(space)) else {
            return Err(EnvError::Unsupported {
                env: env.to_owned(),
                what: format!("the action space {space}"),
            });
        };
        slots.mixed |= Some(k) != kind(first) || Some(dim) != first.action_dim();
        slots.size = slots.size.max(dim);
    }
    Ok(slots)
}

/// N multi-agent envs with identical spaces and agent counts; see the module doc.
pub struct MultiVecEnv {
    envs: Vec<Box<dyn MultiAgentEnv>>,
    num_agents: usize,
    /// By agent.
    observation_spaces: Vec<Space>,
    action_spaces: Vec<Space>,
    obs_dim: usize,
    action_dim: usize,
    active: Vec<bool>,
    acted: Vec<bool>,
    episodes: Vec<AgentEpisodes>,
    finished: Vec<Option<EpisodeStats>>,
}

impl std::fmt::Debug for MultiVecEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiVecEnv")
            .field("num_envs", &self.envs.len())
            .field("num_agents", &self.num_agents)
            .field("observation_spaces", &self.observation_spaces)
            .field("action_spaces", &self.action_spaces)
            .finish_non_exhaustive()
    }
}

impl MultiVecEnv {
    /// Bundles `envs`, which must be non-empty and share their agents' spaces and agent counts (at
    /// least one agent each), with discrete, box or multi-discrete action spaces (see [`MultiAgentEnv`]'s contract and
    /// [`action_slots`]).
    pub fn new(envs: Vec<Box<dyn MultiAgentEnv>>) -> Result<Self, EnvError> {
        let Some(first) = envs.first() else {
            return Err(EnvError::Unsupported {
                env: "MultiVecEnv".into(),
                what: "a vector of 0 envs".into(),
            });
        };
        let num_agents = first.num_agents();
        if num_agents == 0 {
            return Err(EnvError::Unsupported {
                env: first.id().to_owned(),
                what: "an env of 0 agents".into(),
            });
        }
        let observation_spaces: Vec<Space> = (0..num_agents)
            .map(|a| first.agent_observation_space(a).clone())
            .collect();
        let action_spaces: Vec<Space> = (0..num_agents)
            .map(|a| first.agent_action_space(a).clone())
            .collect();
        let action_dim = action_slots(first.id(), &action_spaces)?.size;
        if let Some(i) = envs.iter().position(|e| {
            e.num_agents() != num_agents
                || (0..num_agents).any(|a| {
                    e.agent_observation_space(a) != &observation_spaces[a]
                        || e.agent_action_space(a) != &action_spaces[a]
                })
        }) {
            return Err(in_slot(i)(EnvError::InvalidSpace(format!(
                "{}: its agents or spaces differ from env 0's ({num_agents} agents, {}, {})",
                envs[i].id(),
                observation_spaces[0],
                action_spaces[0]
            ))));
        }
        let columns = envs.len() * num_agents;
        Ok(Self {
            obs_dim: first.obs_dim(),
            episodes: (0..envs.len()).map(|_| AgentEpisodes::new(num_agents)).collect(),
            envs,
            num_agents,
            observation_spaces,
            action_spaces,
            action_dim,
            active: vec![false; columns],
            acted: vec![false; columns],
            finished: vec![None; columns],
        })
    }

    /// Number of envs.
    pub fn num_envs(&self) -> usize {
        self.envs.len()
    }

    /// Agents per env.
    pub fn num_agents(&self) -> usize {
        self.num_agents
    }

    /// The name of agent `agent` (the same in every env).
    pub fn agent_name(&self, agent: usize) -> String {
        self.envs
            .first()
            .map_or_else(|| format!("agent_{agent}"), |env| env.agent_name(agent))
    }

    /// The team of agent `agent` (the same in every env; [`MultiAgentEnv::team`]).
    pub fn team(&self, agent: usize) -> usize {
        self.envs.first().map_or(agent, |env| env.team(agent))
    }

    /// Columns: envs × agents.
    pub fn num_columns(&self) -> usize {
        self.active.len()
    }

    /// Values per agent's observation.
    pub fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    /// Numbers per agent's action.
    pub fn action_dim(&self) -> usize {
        self.action_dim
    }

    /// The action space of agent `agent` (of every env).
    pub fn agent_action_space(&self, agent: usize) -> Option<&Space> {
        self.action_spaces.get(agent)
    }

    /// The built-in players of the envs ([`MultiAgentEnv::builtin_players`]).
    pub fn builtin_players(&self) -> &[&'static str] {
        self.envs.first().map_or(&[], |env| env.builtin_players())
    }

    /// The action built-in player `player` takes as column `column`'s agent in its env's
    /// current state ([`MultiAgentEnv::builtin_action`]).
    pub fn builtin_action(&self, column: usize, player: usize, rng: &mut Pcg64Mcg) -> Option<usize> {
        let agents = self.num_agents.max(1);
        self.envs
            .get(column / agents)?
            .builtin_action(player, column % agents, rng)
    }

    /// Which columns act in the next step.
    pub fn active(&self) -> &[bool] {
        &self.active
    }

    /// Which columns acted in the last step.
    pub fn acted(&self) -> &[bool] {
        &self.acted
    }

    /// Per column, the statistics of the agent's episode that ended in the last step.
    pub fn finished(&self) -> &[Option<EpisodeStats>] {
        &self.finished
    }

    fn refresh_active(&mut self) {
        for (e, env) in self.envs.iter().enumerate() {
            for a in 0..self.num_agents {
                self.active[e * self.num_agents + a] = env.is_active(a);
            }
        }
    }

    /// Resets every env (env `e` with `seed + e` when seeded), writing every column's first
    /// observation into `obs`.
    pub fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        let per_env = self.num_agents * self.obs_dim;
        if obs.len() != self.envs.len() * per_env {
            return Err(EnvError::BufferSize {
                what: "MultiVecEnv observation buffer".into(),
                expected: self.envs.len() * per_env,
                got: obs.len(),
            });
        }
        for (e, (env, chunk)) in self.envs.iter_mut().zip(obs.chunks_mut(per_env)).enumerate() {
            env.reset(seed.map(|s| s + e as u64), chunk).map_err(in_slot(e))?;
            check_observation(env.id(), "reset", chunk).map_err(in_slot(e))?;
        }
        self.episodes = (0..self.envs.len())
            .map(|_| AgentEpisodes::new(self.num_agents))
            .collect();
        self.acted.fill(false);
        self.finished.fill(None);
        self.refresh_active();
        Ok(())
    }

    /// Steps every env with its chunk of `actions` (one action per column; inactive columns'
    /// are ignored) and writes every column's results into `out`. Errors name the env's slot.
    pub fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<(), EnvError> {
        let (agents, obs_dim) = (self.num_agents, self.obs_dim);
        out.check("MultiVecEnv", self.num_columns(), obs_dim)?;
        if actions.len() != self.num_columns() * self.action_dim {
            return Err(EnvError::BufferSize {
                what: "MultiVecEnv action batch".into(),
                expected: self.num_columns() * self.action_dim,
                got: actions.len(),
            });
        }
        self.acted.copy_from_slice(&self.active);
        let StepBuffers {
            obs,
            rewards,
            terminated,
            truncated,
        } = out;
        let chunks = obs
            .chunks_mut(agents * obs_dim)
            .zip(rewards.chunks_mut(agents))
            .zip(terminated.chunks_mut(agents))
            .zip(truncated.chunks_mut(agents));
        for (e, (((obs, rewards), terminated), truncated)) in chunks.enumerate() {
            let env = &mut self.envs[e];
            let env_actions = actions
                .chunk(e * agents, agents, self.action_dim)
                .ok_or_else(|| {
                    in_slot(e)(EnvError::Unsupported {
                        env: env.id().to_owned(),
                        what: "an action batch shorter than its agents".into(),
                    })
                })?;
            env.step(
                env_actions,
                StepBuffers {
                    obs: &mut *obs,
                    rewards: &mut *rewards,
                    terminated: &mut *terminated,
                    truncated: &mut *truncated,
                },
            )
            .map_err(in_slot(e))?;
            check_observation(env.id(), "step", obs).map_err(in_slot(e))?;
            for a in 0..agents {
                let c = e * agents + a;
                let done = terminated[a] || truncated[a];
                self.finished[c] = self.episodes[e]
                    .record(a, self.acted[c], rewards[a], done)
                    .map(|stats| EpisodeStats {
                        true_objective: env.true_objective(a),
                        ..stats
                    });
            }
        }
        self.refresh_active();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect_four::{ConnectFour, OBS_DIM};
    use crate::VecBuffers;

    fn two_games() -> MultiVecEnv {
        MultiVecEnv::new(vec![Box::new(ConnectFour::new()), Box::new(ConnectFour::new())]).expect("vector")
    }

    #[test]
    fn columns_are_agents_of_envs_and_only_the_active_ones_act() {
        let mut envs = two_games();
        assert_eq!(
            (envs.num_envs(), envs.num_agents(), envs.num_columns()),
            (2, 2, 4)
        );
        let mut buf = VecBuffers::new(4, OBS_DIM);
        envs.reset(Some(1), &mut buf.obs).expect("reset");
        assert_eq!(envs.active(), [true, false, true, false]);
        // Column 1 and 3 (player_1) are not to move: their out-of-range actions are ignored.
        envs.step(ActionBatch::Discrete(&[3, 99, 0, -4]), buf.view())
            .expect("step");
        assert_eq!(envs.acted(), [true, false, true, false]);
        assert_eq!(envs.active(), [false, true, false, true]);
        // player_1 of env 1 sees player_0's piece in the bottom row, column 0, on its plane 1.
        let seen = &buf.obs[3 * OBS_DIM..4 * OBS_DIM];
        assert_eq!(seen[7 + (5 * 7) * 2 + 1], 1.0);
        // An illegal move of an active column is an error naming its env.
        let err = envs
            .step(ActionBatch::Discrete(&[0, 9, 0, 0]), buf.view())
            .expect_err("illegal");
        assert!(matches!(err, EnvError::InSlot { index: 0, .. }), "{err}");
    }

    #[test]
    fn finished_episodes_are_reported_per_column_with_the_losers_reward() {
        let mut envs = two_games();
        let mut buf = VecBuffers::new(4, OBS_DIM);
        envs.reset(None, &mut buf.obs).expect("reset");
        // In both games player_0 plays column 0 four times, player_1 column 1: player_0 wins on
        // its fourth move (the 7th of the game).
        for k in 0..7 {
            let column = if k % 2 == 0 { 0 } else { 1 };
            envs.step(ActionBatch::Discrete(&[column; 4]), buf.view())
                .expect("step");
            if k < 6 {
                assert!(envs.finished().iter().all(Option::is_none), "move {k}");
            }
        }
        let won = EpisodeStats {
            episode_return: 1.0,
            length: 4,
            true_objective: None,
        };
        let lost = EpisodeStats {
            episode_return: -1.0,
            length: 3,
            true_objective: None,
        };
        assert_eq!(envs.finished(), [Some(won), Some(lost), Some(won), Some(lost)]);
        assert_eq!(&buf.rewards, &[1.0, -1.0, 1.0, -1.0]);
        // Both games reset themselves: player_0 to move on an empty board.
        assert_eq!(envs.active(), [true, false, true, false]);
        assert!(buf.obs[7..OBS_DIM].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn bad_buffers_and_batches_are_errors() {
        let mut envs = two_games();
        let mut small = VecBuffers::new(3, OBS_DIM);
        assert!(matches!(
            envs.reset(None, &mut small.obs),
            Err(EnvError::BufferSize { .. })
        ));
        let mut buf = VecBuffers::new(4, OBS_DIM);
        envs.reset(None, &mut buf.obs).expect("reset");
        assert!(matches!(
            envs.step(ActionBatch::Discrete(&[0, 0, 0]), buf.view()),
            Err(EnvError::BufferSize { .. })
        ));
        assert!(MultiVecEnv::new(Vec::new()).is_err());
    }
}
