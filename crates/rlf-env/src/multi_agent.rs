//! Multi-agent envs: several agents stepping in one env, each with its own observation, reward
//! and flags, as Sample Factory's multi-agent envs and PettingZoo's Parallel and AEC envs.
//!
//! The contract every env keeps is on [`MultiAgentEnv`].
//!
//! A single-agent [`Env`] is a multi-agent env of one through [`SingleAgent`].

use std::sync::Arc;

use rand_pcg::Pcg64Mcg;

use crate::env::check_action;
use crate::{ActionBatch, Env, EnvError, EpisodeStats, Space, StepBuffers};

/// An env with `num_agents` agents.
///
/// # Contract
/// - Buffers hold one slot per agent (see [`StepBuffers`]). Agents may have different spaces
///   ([`agent_observation_space`](MultiAgentEnv::agent_observation_space),
///   [`agent_action_space`](MultiAgentEnv::agent_action_space)): every observation slot is then
///   [`obs_dim`](MultiAgentEnv::obs_dim) values long (the largest agent's), an agent with a smaller
///   space writing its observation at the start of its slot and zeros after it. Action spaces may
///   differ too: every action slot is as large as the largest agent's action
///   ([`action_slots`](crate::action_slots)), and when they differ in kind or size (a `Discrete` agent
///   beside a `Box` one) the env gets [`ActionBatch::Mixed`] batches and reads each agent's slot with
///   [`ActionBatch::get_as`] and the agent's space.
/// - [`MultiAgentEnv::is_active`], after [`reset`](MultiAgentEnv::reset) or
///   [`step`](MultiAgentEnv::step), says whether an agent acts in the next step: its observation
///   slot is a decision point and its action will be applied. The actions of inactive agents are
///   ignored (pass any action of the space). A simultaneous env (PettingZoo's Parallel API) has
///   every live agent active; a turn-based one (the AEC API: board games, agents moving one after
///   another) has one.
/// - `step` writes, for every agent, what happened to it during the step: the reward it received
///   (acting or not: a turn-based game's loser gets its −1 on the winner's move), `terminated` or
///   `truncated` if its episode ended in this step, and its next observation. An agent whose
///   episode ended is inactive afterwards, until the env's episode ends.
/// - When every agent's episode has ended the env resets itself within the same step: the slots
///   then hold the new episode's first observations and `is_active` names its first actors.
pub trait MultiAgentEnv: Send {
    /// A short name for messages.
    fn id(&self) -> &str;

    /// Number of agents (fixed for the env's life).
    fn num_agents(&self) -> usize;

    /// The name of `agent` (PettingZoo's agent ids, such as `player_0`), which
    /// `--agent_policy_map` matches; `agent_<index>` unless the env names its agents.
    fn agent_name(&self, agent: usize) -> String {
        format!("agent_{agent}")
    }

    /// The team of `agent`: the agents of one team play on one side and win or lose together
    /// (two sides of Connect Four with several players each). Self-play gives an episode's
    /// protagonist's teammates its latest weights and each other team one opponent. Every agent
    /// is a team of its own unless the env says otherwise.
    fn team(&self, agent: usize) -> usize {
        agent
    }

    /// The space of one agent's observation (agent 0's when agents differ).
    fn observation_space(&self) -> &Space;

    /// The space of one agent's action (agent 0's when agents differ).
    fn action_space(&self) -> &Space;

    /// The observation space of `agent`: [`observation_space`](MultiAgentEnv::observation_space)
    /// unless the env's agents differ.
    fn agent_observation_space(&self, agent: usize) -> &Space {
        let _ = agent;
        self.observation_space()
    }

    /// The action space of `agent`: [`action_space`](MultiAgentEnv::action_space) unless the
    /// env's agents differ.
    fn agent_action_space(&self, agent: usize) -> &Space {
        let _ = agent;
        self.action_space()
    }

    /// Values per observation slot: the largest flat size of the agents' observation spaces.
    fn obs_dim(&self) -> usize {
        (0..self.num_agents())
            .map(|a| self.agent_observation_space(a).flat_dim())
            .max()
            .unwrap_or_else(|| self.observation_space().flat_dim())
    }

    /// Starts a new episode, writing `num_agents * obs_dim` values into `obs`.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError>;

    /// Applies one action per agent and writes every agent's results into `out`.
    fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<(), EnvError>;

    /// Whether `agent` acts in the next step (see the contract above).
    fn is_active(&self, agent: usize) -> bool;

    /// The true objective of `agent`'s episode if it ended in the last step and the env measures
    /// one (see [`EpisodeStats::true_objective`]); `None` by default.
    fn true_objective(&self, agent: usize) -> Option<f64> {
        let _ = agent;
        None
    }

    /// The names of the env's built-in players: scripted opponents (Connect Four's `random` and
    /// `heuristic`) that self-play can mix into an agent's opponents. None by default.
    fn builtin_players(&self) -> &[&'static str] {
        &[]
    }

    /// The action built-in player `player` (an index into
    /// [`builtin_players`](MultiAgentEnv::builtin_players)) takes as `agent` in the current
    /// state, as an index into the agent's `Discrete` action space, drawing any randomness from
    /// `rng`; `None` when `agent` does not act next or there is no such player.
    fn builtin_action(&self, player: usize, agent: usize, rng: &mut Pcg64Mcg) -> Option<usize> {
        let _ = (player, agent, rng);
        None
    }

    /// The game's rules as a [`PlyModel`] a learner can search, for a two-sided zero-sum turn-based game whose
    /// observations hold the whole position; `None` by default.
    fn ply_model(&self) -> Option<Arc<dyn PlyModel>> {
        None
    }
}

/// What one move does, read from the mover's observation: the rules of a two-sided, zero-sum, turn-based game
/// whose observation holds the whole position (a board game's), which a learner can look ahead in as
/// AlphaZero's self-play searches the game's rules. The sides alternate: after the mover's action, the other
/// side moves, and every reward of the game is the mover's or its negation.
pub trait PlyModel: Send + Sync + std::fmt::Debug {
    /// Values per observation (the env's flat observation).
    fn obs_dim(&self) -> usize;

    /// Number of actions (the agents' `Discrete` action space).
    fn num_actions(&self) -> usize;

    /// The outcome of `action` played by the agent that observes `obs` and is to move: `None` when it may not play
    /// it (an illegal action, or `obs` is no position that agent moves in); else the mover's reward and whether the
    /// game ends, and, when it goes on, the observation of the side that moves next written into `next`
    /// ([`obs_dim`](PlyModel::obs_dim) values).
    fn ply(&self, obs: &[f32], action: usize, next: &mut [f32]) -> Option<Ply>;
}

/// The outcome of one move ([`PlyModel::ply`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ply {
    /// The mover's reward for the move.
    pub reward: f32,
    /// Whether the game ended with it.
    pub ends: bool,
}

/// Adapts any single-agent [`Env`] into a [`MultiAgentEnv`] of one agent that is always active
/// and resets itself when its episode ends (the final observation is not kept: use a
/// [`VecEnv`](crate::VecEnv) when you need it).
#[derive(Debug, Clone)]
pub struct SingleAgent<E> {
    inner: E,
    /// The true objective the last step reported.
    objective: Option<f64>,
}

impl<E: Env> SingleAgent<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        Self {
            inner,
            objective: None,
        }
    }

    /// The wrapped env.
    pub fn into_inner(self) -> E {
        self.inner
    }
}

impl<E: Env> MultiAgentEnv for SingleAgent<E> {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn num_agents(&self) -> usize {
        1
    }
    fn observation_space(&self) -> &Space {
        self.inner.observation_space()
    }
    fn action_space(&self) -> &Space {
        self.inner.action_space()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<(), EnvError> {
        let space = self.inner.action_space();
        let Some(dim) = space.action_dim() else {
            return Err(EnvError::Unsupported {
                env: self.inner.id().to_owned(),
                what: format!("the action space {space}"),
            });
        };
        out.check(self.inner.id(), 1, self.inner.observation_space().flat_dim())?;
        let action = match actions.get(0, dim) {
            Some(a) if actions.len() == dim => a,
            _ => {
                return Err(EnvError::BufferSize {
                    what: format!("{} action batch", self.inner.id()),
                    expected: dim,
                    got: actions.len(),
                })
            }
        };
        check_action(self.inner.id(), space, action)?;
        let step = self.inner.step(action, out.obs)?;
        out.rewards[0] = step.reward as f32;
        out.terminated[0] = step.terminated;
        out.truncated[0] = step.truncated;
        self.objective = step.info.true_objective.filter(|_| step.done());
        if step.done() {
            self.inner.reset(None, out.obs)?;
        }
        Ok(())
    }
    fn is_active(&self, agent: usize) -> bool {
        agent == 0
    }
    fn true_objective(&self, agent: usize) -> Option<f64> {
        self.objective.filter(|_| agent == 0)
    }
}

/// Per-agent episode bookkeeping for a [`MultiAgentEnv`]: feed it every agent's output after each
/// step; it sums every reward an agent receives, counts the steps it acted in, and returns its
/// statistics when its episode ends.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentEpisodes {
    running: Vec<EpisodeStats>,
}

impl AgentEpisodes {
    /// Bookkeeping for `num_agents` agents.
    pub fn new(num_agents: usize) -> Self {
        Self {
            running: vec![EpisodeStats::default(); num_agents],
        }
    }

    /// Records `agent`'s part of a step: `acted` (it was active in that step), the reward it
    /// received (acting or not, as the contract says) and whether its episode ended; returns the
    /// finished episode's statistics (return, and length in steps it acted) when `done`. Unknown
    /// agent indices are ignored.
    pub fn record(&mut self, agent: usize, acted: bool, reward: f32, done: bool) -> Option<EpisodeStats> {
        let running = self.running.get_mut(agent)?;
        running.episode_return += f64::from(reward);
        running.length += u64::from(acted);
        done.then(|| std::mem::take(running))
    }

    /// The running (unfinished) episode of `agent`.
    pub fn running(&self, agent: usize) -> Option<EpisodeStats> {
        self.running.get(agent).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrappers::testing::Counter;
    use crate::{BoxSpace, VecBuffers};

    /// Three agents racing: agent `k` finishes after `k + 1` steps, earning `k + 1` per step; the
    /// env resets itself when all have finished.
    struct Race {
        t: u64,
        finished: [bool; 3],
        active: [bool; 3],
        observation_space: Space,
        action_space: Space,
    }

    impl Race {
        fn new() -> Self {
            Self {
                t: 0,
                finished: [false; 3],
                active: [true; 3],
                observation_space: Space::Box(BoxSpace::uniform(0.0, 10.0, vec![1]).unwrap()),
                action_space: Space::discrete(2),
            }
        }
    }

    impl MultiAgentEnv for Race {
        fn id(&self) -> &str {
            "Race"
        }
        fn num_agents(&self) -> usize {
            3
        }
        fn observation_space(&self) -> &Space {
            &self.observation_space
        }
        fn action_space(&self) -> &Space {
            &self.action_space
        }
        fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
            self.t = 0;
            self.finished = [false; 3];
            self.active = [true; 3];
            obs.fill(0.0);
            Ok(())
        }
        fn step(&mut self, _actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<(), EnvError> {
            out.check("Race", 3, 1)?;
            let active_now = self.active;
            self.t += 1;
            for (k, &active) in active_now.iter().enumerate() {
                out.obs[k] = self.t as f32;
                out.truncated[k] = false;
                out.terminated[k] = active && self.t == k as u64 + 1;
                out.rewards[k] = if active { k as f32 + 1.0 } else { 0.0 };
                self.finished[k] |= out.terminated[k];
            }
            self.active = self.finished.map(|f| !f);
            if self.finished.iter().all(|&f| f) {
                self.t = 0;
                self.finished = [false; 3];
                self.active = [true; 3];
                out.obs.fill(0.0);
            }
            Ok(())
        }
        fn is_active(&self, agent: usize) -> bool {
            self.active.get(agent).copied().unwrap_or(false)
        }
    }

    #[test]
    fn per_agent_bookkeeping_masks_inactive_agents() {
        let mut env = Race::new();
        let mut buf = VecBuffers::new(3, 1);
        let mut episodes = AgentEpisodes::new(env.num_agents());
        env.reset(Some(0), &mut buf.obs).unwrap();
        let mut finished = Vec::new();
        let mut active_log = Vec::new();
        for _ in 0..4 {
            let acting = [0, 1, 2].map(|k| env.is_active(k));
            env.step(ActionBatch::Discrete(&[0, 0, 0]), buf.view()).unwrap();
            active_log.push([0, 1, 2].map(|k| env.is_active(k)));
            for (k, &acted) in acting.iter().enumerate() {
                let done = buf.terminated[k] || buf.truncated[k];
                if let Some(stats) = episodes.record(k, acted, buf.rewards[k], done) {
                    finished.push((k, stats));
                }
            }
        }
        assert_eq!(
            finished,
            [
                (
                    0,
                    EpisodeStats {
                        episode_return: 1.0,
                        length: 1,
                        true_objective: None,
                    }
                ),
                (
                    1,
                    EpisodeStats {
                        episode_return: 4.0,
                        length: 2,
                        true_objective: None,
                    }
                ),
                (
                    2,
                    EpisodeStats {
                        episode_return: 9.0,
                        length: 3,
                        true_objective: None,
                    }
                ),
                (
                    0,
                    EpisodeStats {
                        episode_return: 1.0,
                        length: 1,
                        true_objective: None,
                    }
                ),
            ]
        );
        assert_eq!(
            active_log,
            [
                [false, true, true],
                [false, false, true],
                [true, true, true],
                [false, true, true]
            ]
        );
        assert_eq!(buf.obs, [1.0, 1.0, 1.0], "the env reset itself after step 3");
        assert_eq!(
            episodes.running(1),
            Some(EpisodeStats {
                episode_return: 2.0,
                length: 1,
                true_objective: None,
            })
        );
        assert_eq!(episodes.record(5, true, 1.0, true), None);
    }

    #[test]
    fn single_agent_adapter_is_one_active_agent_that_auto_resets() {
        let mut env = SingleAgent::new(Counter::new(2));
        assert_eq!(env.num_agents(), 1);
        let mut buf = VecBuffers::new(1, 2);
        env.reset(None, &mut buf.obs).unwrap();
        env.step(ActionBatch::Discrete(&[1]), buf.view()).unwrap();
        assert_eq!(
            (buf.obs.as_slice(), buf.terminated[0]),
            (&[1.0, 100.0][..], false)
        );
        env.step(ActionBatch::Discrete(&[1]), buf.view()).unwrap();
        assert!(buf.terminated[0]);
        assert!(env.is_active(0) && !env.is_active(1));
        assert_eq!(buf.obs, [0.0, 0.0], "reset within the step");
        assert_eq!(env.into_inner().resets, 2);
    }

    #[test]
    fn single_agent_adapter_rejects_bad_input() {
        let mut env = SingleAgent::new(Counter::new(2));
        let mut buf = VecBuffers::new(1, 2);
        env.reset(None, &mut buf.obs).unwrap();
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[3]), buf.view()),
            Err(EnvError::InvalidAction { .. })
        ));
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[0, 1]), buf.view()),
            Err(EnvError::BufferSize { .. })
        ));
        let mut two = VecBuffers::new(2, 2);
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[0]), two.view()),
            Err(EnvError::BufferSize { .. })
        ));
    }
}
