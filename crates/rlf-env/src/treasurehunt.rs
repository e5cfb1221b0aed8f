//! Treasurehunt: agents on a walled grid walk into gems that appear at random, the gridworld of sorrel's
//! `treasurehunt_mp` (the `treasurehunt` example of social-ai-uoft/sorrel), reproduced natively.
//!
//! # The world
//! A grid of `height × width` cells with two layers. Layer 0 (ground) holds [`Entity::Wall`] on
//! the border and [`Entity::Sand`] inside; layer 1 (top) holds walls on the border and, inside,
//! [`Entity::Empty`], [`Entity::Gem`] or [`Entity::Agent`]. At every episode start the world is
//! rebuilt and the agents are placed on distinct interior cells drawn uniformly without
//! replacement (agent `k` on the `k`-th cell drawn).
//!
//! # One turn, as a turn-based [`MultiAgentEnv`]
//! A turn of the spec is `num_agents` env steps:
//! 1. gems spawn: every interior top-layer cell that is Empty (no agent, no gem), visited in
//!    row-major order, becomes a Gem with probability `spawn_prob`, one independent draw each;
//! 2. agent 0 observes and acts (env step 1), then agent 1 (env step 2), ..., agent `N − 1`.
//!
//! Exactly one agent is [active](MultiAgentEnv::is_active) in each step; the other agents' actions
//! are ignored (they are neither applied nor checked). The spawn of turn `t + 1` happens at the end
//! of the step of agent `N − 1` in turn `t` (and the spawn of turn 1 in `reset`), so agent 0
//! observes the new gems before it acts, as in the spec.
//!
//! Actions ([`Space::discrete`]`(4)`): 0 up (row − 1), 1 down (row + 1), 2 left (column − 1),
//! 3 right (column + 1). The acting agent's reward is the value of the target top-layer cell
//! before the move: `gem_value` (10) for a Gem, −1 for a Wall, 0 for an Empty cell or an agent; it
//! moves only into an Empty cell or a Gem (consuming it). The other agents get 0 in that step.
//!
//! An episode is `max_turns` turns, `max_turns × num_agents` env steps. On the last agent's move of
//! the last turn every agent is `truncated` (a time limit; nothing is ever `terminated`) and the
//! env resets itself within that step: fresh world, fresh positions, cleared frame stacks, the
//! first turn's spawn, agent 0 active.
//!
//! # Observations
//! A frame is the `(2r + 1) × (2r + 1)` window (`r` = `vision_radius`) centred on the agent, with
//! [`CHANNELS`] channels in the order of [`Entity`]: Empty, Wall, Sand, Gem, Agent. Each cell adds
//! 1 to the channel of what it holds on each layer, the two layers summed (an interior cell shows
//! Sand 1 plus Gem 1 or Agent 1 if any; a border cell shows Wall 2); Empty adds nothing, so the
//! Empty channel is always 0; a cell outside the grid reads as one Wall (Wall 1). The agent sees
//! itself in the centre. Layout: channel-major, then rows (top to bottom), then columns (left to
//! right): `5 × (2r + 1)²` floats (125 for `r = 2`).
//!
//! An agent's observation is its stack of the last `n_frames` frames, **oldest first** (the
//! current frame is the last `frame_dim` values), `n_frames × frame_dim` floats (625 by default),
//! in a flat [`Box`](Space::Box) with bounds `[0, 2]`. A frame is taken only at the agent's
//! decision points: when it becomes active, it observes the world as it is at that moment. At an
//! episode's start the missing frames are zeros; an agent that has not yet been active in the
//! episode (agents `1..N` right after a reset) has an all-zero observation. After every step each
//! agent's slot holds its current stack; only the newly active agent's stack has changed.
//!
//! # Seeding
//! `reset(Some(seed), ..)` reseeds the env's PCG generator ([`rand_pcg::Pcg64Mcg`]), which draws
//! both the placements and the spawns: the same seed and actions give the same episodes. An env
//! never reset with a seed behaves as if seeded with 0.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::{Action, ActionBatch, BoxSpace, EnvError, MultiAgentEnv, Space, StepBuffers};

const ID: &str = "Treasurehunt";

/// The number of observation channels, one per [`Entity`].
pub const CHANNELS: usize = 5;

/// The reward for walking into a wall.
const WALL_VALUE: f32 = -1.0;

/// The `key=value` keys [`TreasurehuntConfig::from_kwargs`] accepts.
const KEYS: [&str; 8] = [
    "height",
    "width",
    "num_agents",
    "spawn_prob",
    "gem_value",
    "vision_radius",
    "n_frames",
    "max_turns",
];

/// What a cell of one layer holds; the discriminant is the kind's observation channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entity {
    /// Nothing (top layer only): passable, may turn into a Gem. Its channel is always 0.
    Empty = 0,
    /// The border of both layers: not passable, value −1.
    Wall = 1,
    /// The interior of the ground layer.
    Sand = 2,
    /// A gem (top layer only): passable, consumed on entry, value `gem_value`.
    Gem = 3,
    /// An agent (top layer only): not passable, value 0.
    Agent = 4,
}

impl Entity {
    /// The observation channel of this kind.
    pub fn channel(self) -> usize {
        self as usize
    }
}

/// Treasurehunt's parameters; [`Default`] is the spec's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct TreasurehuntConfig {
    /// Rows of the grid, border included (at least 3).
    pub height: usize,
    /// Columns of the grid, border included (at least 3).
    pub width: usize,
    /// Number of agents (at least 1, at most the number of interior cells).
    pub num_agents: usize,
    /// Probability that an Empty interior cell becomes a Gem at the start of a turn, in `[0, 1]`.
    pub spawn_prob: f64,
    /// Reward for walking onto a Gem (finite).
    pub gem_value: f32,
    /// Radius `r` of the `(2r + 1) × (2r + 1)` observation window.
    pub vision_radius: usize,
    /// Number of stacked frames in an observation (at least 1).
    pub n_frames: usize,
    /// Turns per episode (at least 1); one turn is one move of every agent.
    pub max_turns: usize,
}

impl Default for TreasurehuntConfig {
    fn default() -> Self {
        Self {
            height: 10,
            width: 10,
            num_agents: 5,
            spawn_prob: 0.02,
            gem_value: 10.0,
            vision_radius: 2,
            n_frames: 5,
            max_turns: 50,
        }
    }
}

impl TreasurehuntConfig {
    /// The default config with `key=value` overrides applied in order (the keys are the field
    /// names), then [validated](Self::validate). Keys and values are trimmed. An unknown key or an
    /// unparsable value is an error naming the key.
    pub fn from_kwargs(pairs: &[(String, String)]) -> Result<Self, EnvError> {
        let mut config = Self::default();
        for (key, value) in pairs {
            config.set(key.trim(), value.trim())?;
        }
        config.validate()?;
        Ok(config)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), EnvError> {
        match key {
            "height" => self.height = parse_count(key, value)?,
            "width" => self.width = parse_count(key, value)?,
            "num_agents" => self.num_agents = parse_count(key, value)?,
            "vision_radius" => self.vision_radius = parse_count(key, value)?,
            "n_frames" => self.n_frames = parse_count(key, value)?,
            "max_turns" => self.max_turns = parse_count(key, value)?,
            "spawn_prob" => self.spawn_prob = parse_number(key, value)?,
            "gem_value" => self.gem_value = parse_number(key, value)?,
            _ => {
                return Err(bad_config(format!(
                    "unknown env_kwargs key `{key}` (known keys: {})",
                    KEYS.join(", ")
                )))
            }
        }
        Ok(())
    }

    /// Checks the parameters: sizes at least 3, 1 to `(height − 2) × (width − 2)` agents,
    /// `spawn_prob` in `[0, 1]`, a finite `gem_value`, `n_frames` and `max_turns` at least 1, and
    /// observation sizes that do not overflow `usize`. Errors are
    /// [`EnvError::InvalidConfig`] naming the parameter.
    pub fn validate(&self) -> Result<(), EnvError> {
        for (key, value) in [("height", self.height), ("width", self.width)] {
            if value < 3 {
                return Err(bad_config(format!("{key} = {value}: it must be at least 3")));
            }
        }
        let interior = (self.height - 2)
            .checked_mul(self.width - 2)
            .ok_or_else(|| bad_config(format!("a grid of {} × {} is too large", self.height, self.width)))?;
        if self.num_agents == 0 || self.num_agents > interior {
            return Err(bad_config(format!(
                "num_agents = {}: it must be between 1 and the {interior} interior cells",
                self.num_agents
            )));
        }
        if !(0.0..=1.0).contains(&self.spawn_prob) {
            return Err(bad_config(format!(
                "spawn_prob = {}: it must be in [0, 1]",
                self.spawn_prob
            )));
        }
        if !self.gem_value.is_finite() {
            return Err(bad_config(format!(
                "gem_value = {}: it must be finite",
                self.gem_value
            )));
        }
        for (key, value) in [("n_frames", self.n_frames), ("max_turns", self.max_turns)] {
            if value == 0 {
                return Err(bad_config(format!("{key} = 0: it must be at least 1")));
            }
        }
        self.checked_obs_dim()
            .and_then(|dim| dim.checked_mul(self.num_agents))
            .map(|_| ())
            .ok_or_else(|| {
                bad_config(format!(
                    "vision_radius = {} with n_frames = {}: the observation is too large",
                    self.vision_radius, self.n_frames
                ))
            })
    }

    /// The number of floats in one frame: `CHANNELS × (2 vision_radius + 1)²` (saturating).
    pub fn frame_dim(&self) -> usize {
        let side = self.vision_radius.saturating_mul(2).saturating_add(1);
        CHANNELS.saturating_mul(side).saturating_mul(side)
    }

    /// The number of floats in one agent's observation: `n_frames × frame_dim()` (saturating).
    pub fn obs_dim(&self) -> usize {
        self.n_frames.saturating_mul(self.frame_dim())
    }

    fn checked_obs_dim(&self) -> Option<usize> {
        let side = self.vision_radius.checked_mul(2)?.checked_add(1)?;
        CHANNELS
            .checked_mul(side)?
            .checked_mul(side)?
            .checked_mul(self.n_frames)
    }
}

fn bad_config(reason: String) -> EnvError {
    EnvError::InvalidConfig {
        env: ID.to_owned(),
        reason,
    }
}

fn parse_count(key: &str, value: &str) -> Result<usize, EnvError> {
    value.parse().map_err(|_| {
        bad_config(format!(
            "env_kwargs {key}={value}: expected a non-negative integer"
        ))
    })
}

fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, EnvError> {
    value
        .parse()
        .map_err(|_| bad_config(format!("env_kwargs {key}={value}: expected a number")))
}

/// The Treasurehunt env; see the [module doc](self) for the rules, the observation layout and the
/// turn-based stepping.
#[derive(Debug, Clone)]
pub struct Treasurehunt {
    config: TreasurehuntConfig,
    observation_space: Space,
    action_space: Space,
    rng: Pcg64Mcg,
    /// Layer 0, row-major.
    ground: Vec<Entity>,
    /// Layer 1, row-major.
    top: Vec<Entity>,
    /// Each agent's cell, as a row-major index.
    positions: Vec<usize>,
    /// Scratch for drawing the agents' cells: every interior cell's index.
    interior: Vec<usize>,
    /// Every agent's frame stack, oldest frame first, `num_agents × obs_dim` values: exactly the
    /// layout of the observation buffers.
    stacks: Vec<f32>,
    /// The agent that acts in the next step.
    active: usize,
    /// Turns completed in the current episode.
    turn: usize,
    /// Rewards each agent received so far in the current episode.
    returns: Vec<f64>,
    /// Rewards each agent received in the last finished episode (empty before the first one).
    last_returns: Vec<f64>,
}

impl Treasurehunt {
    /// A new env after [validating](TreasurehuntConfig::validate) `config`, holding the episode of
    /// seed 0; [`reset`](MultiAgentEnv::reset) it before stepping to choose a seed.
    pub fn new(config: TreasurehuntConfig) -> Result<Self, EnvError> {
        config.validate()?;
        let obs_dim = config.obs_dim();
        let observation_space = Space::Box(BoxSpace::uniform(0.0, 2.0, vec![obs_dim])?);
        let (height, width) = (config.height, config.width);
        let cells = height * width;
        let interior = (1..height - 1)
            .flat_map(|row| (1..width - 1).map(move |col| row * width + col))
            .collect();
        let mut env = Self {
            observation_space,
            action_space: Space::discrete(4),
            rng: Pcg64Mcg::seed_from_u64(0),
            ground: vec![Entity::Wall; cells],
            top: vec![Entity::Wall; cells],
            positions: vec![0; config.num_agents],
            interior,
            stacks: vec![0.0; config.num_agents * obs_dim],
            active: 0,
            turn: 0,
            returns: vec![0.0; config.num_agents],
            last_returns: Vec::new(),
            config,
        };
        env.new_episode();
        env.rng = Pcg64Mcg::seed_from_u64(0);
        Ok(env)
    }

    /// The configuration.
    pub fn config(&self) -> &TreasurehuntConfig {
        &self.config
    }

    /// The agent that acts in the next step.
    pub fn active_agent(&self) -> usize {
        self.active
    }

    /// Turns completed in the current episode (`0..max_turns`).
    pub fn turn(&self) -> usize {
        self.turn
    }

    /// `agent`'s cell as `(row, column)`, or `None` for an unknown agent.
    pub fn agent_position(&self, agent: usize) -> Option<(usize, usize)> {
        self.positions
            .get(agent)
            .map(|&i| (i / self.config.width, i % self.config.width))
    }

    /// What the ground layer (layer 0) holds at `(row, col)`, or `None` outside the grid.
    pub fn ground(&self, row: usize, col: usize) -> Option<Entity> {
        self.index(row, col).map(|i| self.ground[i])
    }

    /// What the top layer (layer 1) holds at `(row, col)`, or `None` outside the grid.
    pub fn top(&self, row: usize, col: usize) -> Option<Entity> {
        self.index(row, col).map(|i| self.top[i])
    }

    /// The number of gems on the grid.
    pub fn num_gems(&self) -> usize {
        self.top.iter().filter(|&&e| e == Entity::Gem).count()
    }

    /// `agent`'s current observation (its frame stack, oldest frame first), as last written into
    /// its slot, or `None` for an unknown agent.
    pub fn observation(&self, agent: usize) -> Option<&[f32]> {
        let dim = self.config.obs_dim();
        self.stacks.get(agent * dim..(agent + 1) * dim)
    }

    /// The rewards each agent received so far in the current episode.
    pub fn episode_returns(&self) -> &[f64] {
        &self.returns
    }

    /// The rewards each agent received in the last finished episode, or `None` before the first
    /// episode ends. Episodes cut short by [`reset`](MultiAgentEnv::reset) do not count.
    pub fn last_episode_returns(&self) -> Option<&[f64]> {
        (!self.last_returns.is_empty()).then_some(self.last_returns.as_slice())
    }

    /// The team's return (the sum over agents, the spec's logged score) of the last finished
    /// episode, or `None` before the first episode ends.
    pub fn last_team_return(&self) -> Option<f64> {
        self.last_episode_returns().map(|r| r.iter().sum())
    }

    fn index(&self, row: usize, col: usize) -> Option<usize> {
        (row < self.config.height && col < self.config.width).then(|| row * self.config.width + col)
    }

    /// Rebuilds the world, places the agents, clears the stacks and runs the first turn's spawn;
    /// agent 0 observes.
    fn new_episode(&mut self) {
        let (height, width) = (self.config.height, self.config.width);
        for row in 0..height {
            for col in 0..width {
                let border = row == 0 || col == 0 || row == height - 1 || col == width - 1;
                let i = row * width + col;
                self.ground[i] = if border { Entity::Wall } else { Entity::Sand };
                self.top[i] = if border { Entity::Wall } else { Entity::Empty };
            }
        }
        // A partial Fisher-Yates shuffle: the first `num_agents` cells are a uniform draw without
        // replacement.
        let n = self.interior.len();
        for k in 0..self.config.num_agents {
            let j = self.rng.random_range(k..n);
            self.interior.swap(k, j);
            let cell = self.interior[k];
            self.positions[k] = cell;
            self.top[cell] = Entity::Agent;
        }
        self.stacks.fill(0.0);
        self.returns.fill(0.0);
        self.turn = 0;
        self.begin_turn();
    }

    /// The start of a turn: gems spawn, then agent 0 observes.
    fn begin_turn(&mut self) {
        let p = self.config.spawn_prob;
        for cell in self.top.iter_mut().filter(|e| **e == Entity::Empty) {
            if self.rng.random::<f64>() < p {
                *cell = Entity::Gem;
            }
        }
        self.active = 0;
        self.observe(0);
    }

    /// Pushes a frame of the world as `agent` sees it now onto its stack.
    fn observe(&mut self, agent: usize) {
        let frame_dim = self.config.frame_dim();
        let obs_dim = self.config.obs_dim();
        let stack = &mut self.stacks[agent * obs_dim..(agent + 1) * obs_dim];
        stack.copy_within(frame_dim.., 0);
        let frame = &mut stack[obs_dim - frame_dim..];
        let position = self.positions[agent];
        let width = self.config.width;
        encode_frame(
            &self.ground,
            &self.top,
            width,
            (position / width, position % width),
            self.config.vision_radius,
            frame,
        );
    }

    /// Moves the active agent one cell (action 0 up, 1 down, 2 left, 3 right) and returns its
    /// reward.
    fn act(&mut self, agent: usize, action: usize) -> f32 {
        let from = self.positions[agent];
        let width = self.config.width;
        // Agents stay on interior cells, so every neighbour is on the grid.
        let to = match action {
            0 => from - width,
            1 => from + width,
            2 => from - 1,
            _ => from + 1,
        };
        let target = self.top[to];
        let reward = match target {
            Entity::Gem => self.config.gem_value,
            Entity::Wall => WALL_VALUE,
            Entity::Empty | Entity::Sand | Entity::Agent => 0.0,
        };
        if matches!(target, Entity::Empty | Entity::Gem) {
            self.top[from] = Entity::Empty;
            self.top[to] = Entity::Agent;
            self.positions[agent] = to;
        }
        reward
    }

    fn invalid_action(&self, action: Action<'_>) -> EnvError {
        EnvError::InvalidAction {
            env: ID.to_owned(),
            action: action.to_string(),
            space: self.action_space.to_string(),
        }
    }
}

/// Writes the frame of an agent at `(row, col)` into `frame` (see the module doc for the layout).
fn encode_frame(
    ground: &[Entity],
    top: &[Entity],
    width: usize,
    (row, col): (usize, usize),
    radius: usize,
    frame: &mut [f32],
) {
    let height = ground.len() / width;
    let side = 2 * radius + 1;
    let plane = side * side;
    frame.fill(0.0);
    for i in 0..side {
        for j in 0..side {
            let cell = i * side + j;
            let r = (row + i).checked_sub(radius).filter(|&r| r < height);
            let c = (col + j).checked_sub(radius).filter(|&c| c < width);
            match r.zip(c) {
                Some((r, c)) => {
                    for entity in [ground[r * width + c], top[r * width + c]] {
                        if entity != Entity::Empty {
                            frame[entity.channel() * plane + cell] += 1.0;
                        }
                    }
                }
                None => frame[Entity::Wall.channel() * plane + cell] = 1.0,
            }
        }
    }
}

impl MultiAgentEnv for Treasurehunt {
    fn id(&self) -> &str {
        ID
    }

    fn num_agents(&self) -> usize {
        self.config.num_agents
    }

    fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    fn action_space(&self) -> &Space {
        &self.action_space
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        if obs.len() != self.stacks.len() {
            return Err(EnvError::BufferSize {
                what: format!("{ID}: reset observation buffer"),
                expected: self.stacks.len(),
                got: obs.len(),
            });
        }
        if let Some(seed) = seed {
            self.rng = Pcg64Mcg::seed_from_u64(seed);
        }
        self.new_episode();
        obs.copy_from_slice(&self.stacks);
        Ok(())
    }

    fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<(), EnvError> {
        let n = self.config.num_agents;
        out.check(ID, n, self.config.obs_dim())?;
        if actions.len() != n {
            return Err(EnvError::BufferSize {
                what: format!("{ID} action batch"),
                expected: n,
                got: actions.len(),
            });
        }
        let agent = self.active;
        let action = match actions.get(agent, 1) {
            Some(Action::Discrete(a)) => match usize::try_from(a) {
                Ok(a) if a < 4 => a,
                _ => return Err(self.invalid_action(Action::Discrete(a))),
            },
            Some(other) => return Err(self.invalid_action(other)),
            None => {
                return Err(EnvError::BufferSize {
                    what: format!("{ID} action batch"),
                    expected: n,
                    got: actions.len(),
                })
            }
        };
        let reward = self.act(agent, action);
        self.returns[agent] += f64::from(reward);
        out.rewards.fill(0.0);
        out.rewards[agent] = reward;
        out.terminated.fill(false);
        out.truncated.fill(false);
        if agent + 1 < n {
            self.active = agent + 1;
            self.observe(agent + 1);
        } else {
            self.turn += 1;
            if self.turn == self.config.max_turns {
                out.truncated.fill(true);
                self.last_returns.clone_from(&self.returns);
                self.new_episode();
            } else {
                self.begin_turn();
            }
        }
        out.obs.copy_from_slice(&self.stacks);
        Ok(())
    }

    fn is_active(&self, agent: usize) -> bool {
        agent == self.active
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};
    use rand_pcg::Pcg64Mcg;

    use super::*;
    use crate::VecBuffers;

    const UP: i64 = 0;
    const DOWN: i64 = 1;
    const LEFT: i64 = 2;
    const RIGHT: i64 = 3;
    const FRAME: usize = 125;

    fn config(height: usize, width: usize, num_agents: usize) -> TreasurehuntConfig {
        TreasurehuntConfig {
            height,
            width,
            num_agents,
            spawn_prob: 0.0,
            ..TreasurehuntConfig::default()
        }
    }

    /// An env whose top layer is rebuilt by hand: agent `k` at `agents[k]`, gems at `gems`, no
    /// spawns; agent 0 has observed it.
    fn hand_built(
        config: TreasurehuntConfig,
        agents: &[(usize, usize)],
        gems: &[(usize, usize)],
    ) -> (Treasurehunt, VecBuffers) {
        let mut env = Treasurehunt::new(config).unwrap();
        let mut buf = VecBuffers::new(env.num_agents(), env.config().obs_dim());
        env.reset(Some(0), &mut buf.obs).unwrap();
        let width = env.config.width;
        for e in env.top.iter_mut().filter(|e| **e != Entity::Wall) {
            *e = Entity::Empty;
        }
        for (k, &(r, c)) in agents.iter().enumerate() {
            env.positions[k] = r * width + c;
            env.top[r * width + c] = Entity::Agent;
        }
        for &(r, c) in gems {
            env.top[r * width + c] = Entity::Gem;
        }
        env.stacks.fill(0.0);
        env.observe(0);
        buf.obs.copy_from_slice(&env.stacks);
        (env, buf)
    }

    /// Steps the active agent with `action` (the others get an out-of-range action, which is
    /// ignored) and returns the acting agent and its reward.
    fn act(env: &mut Treasurehunt, buf: &mut VecBuffers, action: i64) -> (usize, f32) {
        let agent = env.active_agent();
        let mut actions = vec![99; env.num_agents()];
        actions[agent] = action;
        env.step(ActionBatch::Discrete(&actions), buf.view()).unwrap();
        let others: f32 = (0..env.num_agents())
            .filter(|&k| k != agent)
            .map(|k| buf.rewards[k].abs())
            .sum();
        assert_eq!(others, 0.0, "only the acting agent is rewarded");
        (agent, buf.rewards[agent])
    }

    /// The value of `channel` at window cell `(i, j)` of a 5 × 5 frame.
    fn at(frame: &[f32], entity: Entity, i: usize, j: usize) -> f32 {
        frame[entity.channel() * 25 + i * 5 + j]
    }

    fn current_frame(env: &Treasurehunt, agent: usize) -> &[f32] {
        let obs = env.observation(agent).unwrap();
        &obs[obs.len() - FRAME..]
    }

    #[test]
    fn default_config_and_spaces_follow_the_spec() {
        let config = TreasurehuntConfig::default();
        assert_eq!(
            (config.height, config.width, config.num_agents, config.max_turns),
            (10, 10, 5, 50)
        );
        assert_eq!((config.spawn_prob, config.gem_value), (0.02, 10.0));
        assert_eq!((config.vision_radius, config.n_frames), (2, 5));
        assert_eq!((config.frame_dim(), config.obs_dim()), (125, 625));
        let env = Treasurehunt::new(config).unwrap();
        assert_eq!(env.action_space(), &Space::discrete(4));
        let Space::Box(b) = env.observation_space() else {
            panic!("a Box observation space");
        };
        assert_eq!(b.shape(), [625]);
        assert!(b.low().iter().all(|&v| v == 0.0) && b.high().iter().all(|&v| v == 2.0));
        assert_eq!((env.num_agents(), env.id()), (5, "Treasurehunt"));
    }

    #[test]
    fn config_validation_and_kwargs() {
        let kw = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> =
                pairs.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect();
            TreasurehuntConfig::from_kwargs(&pairs)
        };
        let parsed = kw(&[("height", "8"), (" num_agents ", " 3"), ("spawn_prob", "0.5")]).unwrap();
        assert_eq!((parsed.height, parsed.width, parsed.num_agents), (8, 10, 3));
        assert_eq!((parsed.spawn_prob, parsed.gem_value), (0.5, 10.0));
        let all = kw(&[
            ("width", "4"),
            ("gem_value", "2.5"),
            ("vision_radius", "1"),
            ("n_frames", "2"),
            ("max_turns", "7"),
        ])
        .unwrap();
        assert_eq!((all.width, all.gem_value, all.max_turns), (4, 2.5, 7));
        assert_eq!((all.frame_dim(), all.obs_dim()), (45, 90));
        for (pairs, names) in [
            (&[("heigth", "8")][..], "heigth"),
            (&[("height", "x")][..], "height=x"),
            (&[("spawn_prob", "high")][..], "spawn_prob=high"),
            (&[("height", "2")][..], "height = 2"),
            (&[("width", "-3")][..], "width=-3"),
            (&[("spawn_prob", "1.5")][..], "spawn_prob = 1.5"),
            (&[("spawn_prob", "NaN")][..], "spawn_prob = NaN"),
            (&[("gem_value", "inf")][..], "gem_value = inf"),
            (&[("n_frames", "0")][..], "n_frames = 0"),
            (&[("max_turns", "0")][..], "max_turns = 0"),
            (&[("num_agents", "0")][..], "num_agents = 0"),
            (&[("height", "3"), ("width", "4")][..], "num_agents = 5"),
            (&[("vision_radius", "99999999999999")][..], "vision_radius"),
        ] {
            let err = kw(pairs).expect_err(names);
            assert!(matches!(err, EnvError::InvalidConfig { .. }), "{err}");
            assert!(err.to_string().contains(names), "{err}");
        }
        assert!(Treasurehunt::new(config(3, 3, 2)).is_err());
        assert!(Treasurehunt::new(config(3, 3, 1)).is_ok());
    }

    #[test]
    fn walls_on_the_border_sand_inside_agents_on_distinct_interior_cells() {
        let mut env = Treasurehunt::new(config(6, 7, 5)).unwrap();
        let mut buf = VecBuffers::new(5, 625);
        for seed in 0..20 {
            env.reset(Some(seed), &mut buf.obs).unwrap();
            for row in 0..6 {
                for col in 0..7 {
                    let border = row == 0 || col == 0 || row == 5 || col == 6;
                    let ground = env.ground(row, col).unwrap();
                    let top = env.top(row, col).unwrap();
                    if border {
                        assert_eq!((ground, top), (Entity::Wall, Entity::Wall));
                    } else {
                        assert_eq!(ground, Entity::Sand);
                        assert!(matches!(top, Entity::Empty | Entity::Agent));
                    }
                }
            }
            let mut cells: Vec<_> = (0..5).map(|k| env.agent_position(k).unwrap()).collect();
            assert!(cells.iter().all(|&(r, c)| env.top(r, c) == Some(Entity::Agent)));
            cells.sort_unstable();
            cells.dedup();
            assert_eq!(cells.len(), 5, "distinct cells");
            assert_eq!(env.top.iter().filter(|&&e| e == Entity::Agent).count(), 5);
        }
        assert_eq!(
            (env.top(6, 0), env.ground(0, 7), env.agent_position(5)),
            (None, None, None)
        );
    }

    #[test]
    fn placements_cover_every_interior_cell() {
        let mut env = Treasurehunt::new(config(4, 5, 1)).unwrap();
        let mut buf = VecBuffers::new(1, 625);
        let mut counts = [0usize; 6];
        env.reset(Some(3), &mut buf.obs).unwrap();
        for _ in 0..600 {
            env.reset(None, &mut buf.obs).unwrap();
            let (r, c) = env.agent_position(0).unwrap();
            counts[(r - 1) * 3 + (c - 1)] += 1;
        }
        assert!(counts.iter().all(|&n| (60..=140).contains(&n)), "{counts:?}");
    }

    #[test]
    fn gems_spawn_before_the_moves_never_on_agents_or_gems() {
        let mut cfg = config(5, 5, 3);
        cfg.spawn_prob = 1.0;
        let mut env = Treasurehunt::new(cfg).unwrap();
        let mut buf = VecBuffers::new(3, 625);
        env.reset(Some(1), &mut buf.obs).unwrap();
        assert_eq!(
            env.num_gems(),
            9 - 3,
            "the first turn's spawn fills every free cell"
        );
        assert_eq!(env.top.iter().filter(|&&e| e == Entity::Agent).count(), 3);
        let frame = current_frame(&env, 0);
        let gems_seen: f32 = frame[Entity::Gem.channel() * 25..][..25].iter().sum();
        assert!(gems_seen > 0.0, "agent 0 sees this turn's gems before it acts");
        // Every agent walks into whatever is below it: a gem (+10, moves), a wall or an agent.
        let mut vacated = Vec::new();
        for k in 0..3 {
            let before = env.agent_position(k).unwrap();
            let target = env.top(before.0 + 1, before.1).unwrap();
            let (agent, reward) = act(&mut env, &mut buf, DOWN);
            assert_eq!(agent, k);
            let after = env.agent_position(k).unwrap();
            match target {
                Entity::Gem => {
                    assert_eq!((reward, after), (10.0, (before.0 + 1, before.1)));
                    vacated.push(before);
                }
                Entity::Wall => assert_eq!((reward, after), (-1.0, before)),
                _ => assert_eq!((reward, after), (0.0, before)),
            }
            if k < 2 {
                assert!(
                    vacated.iter().all(|&(r, c)| env.top(r, c) == Some(Entity::Empty)),
                    "no spawn within a turn"
                );
            }
        }
        assert_eq!(env.turn(), 1);
        assert_eq!(
            env.num_gems(),
            6,
            "the second turn's spawn refilled the vacated cells"
        );
        assert_eq!(env.top.iter().filter(|&&e| e == Entity::Agent).count(), 3);
        for k in 0..3 {
            let (r, c) = env.agent_position(k).unwrap();
            assert_eq!(env.top(r, c), Some(Entity::Agent));
        }
    }

    #[test]
    fn walls_and_agents_block_gems_are_eaten() {
        // Agent 0 at (1, 1), agent 1 at (1, 2), a gem at (2, 1).
        let (mut env, mut buf) = hand_built(config(5, 5, 2), &[(1, 1), (1, 2)], &[(2, 1)]);
        assert_eq!(act(&mut env, &mut buf, UP), (0, -1.0), "into the wall");
        assert_eq!(env.agent_position(0), Some((1, 1)));
        assert_eq!(act(&mut env, &mut buf, LEFT), (1, 0.0), "into agent 0");
        assert_eq!(env.agent_position(1), Some((1, 2)));
        assert_eq!(env.top(1, 1), Some(Entity::Agent));
        assert_eq!(act(&mut env, &mut buf, DOWN), (0, 10.0), "onto the gem");
        assert_eq!(env.agent_position(0), Some((2, 1)));
        assert_eq!(
            (env.top(2, 1), env.top(1, 1), env.num_gems()),
            (Some(Entity::Agent), Some(Entity::Empty), 0)
        );
        assert_eq!(act(&mut env, &mut buf, LEFT), (1, 0.0), "into the vacated cell");
        assert_eq!(env.agent_position(1), Some((1, 1)));
        assert_eq!(env.top(1, 2), Some(Entity::Empty));
        assert_eq!(env.episode_returns(), [9.0, 0.0]);
    }

    #[test]
    fn agents_act_in_order_and_see_earlier_moves() {
        // Agent 0 at (1, 1), agent 1 at (1, 3): both want (1, 2); agent 0 gets there first.
        let (mut env, mut buf) = hand_built(config(5, 5, 2), &[(1, 1), (1, 3)], &[]);
        assert!(env.is_active(0) && !env.is_active(1));
        assert_eq!(act(&mut env, &mut buf, RIGHT), (0, 0.0));
        assert!(env.is_active(1) && !env.is_active(0));
        // Agent 1's fresh frame shows agent 0 right next to it (window cell (2, 1)).
        let frame = &buf.obs[625 + 500..];
        assert_eq!(at(frame, Entity::Agent, 2, 1), 1.0);
        assert_eq!(act(&mut env, &mut buf, LEFT), (1, 0.0), "blocked by agent 0");
        assert_eq!(env.agent_position(0), Some((1, 2)));
        assert_eq!(env.agent_position(1), Some((1, 3)));
        assert_eq!(env.active_agent(), 0);
    }

    #[test]
    fn observation_encoding_on_a_hand_built_world() {
        // Agent 0 at (1, 1), a gem at (2, 2), agent 1 at (3, 3) on a 5 × 5 grid.
        let (env, buf) = hand_built(config(5, 5, 2), &[(1, 1), (3, 3)], &[(2, 2)]);
        let frame = &buf.obs[500..625];
        assert_eq!(frame, current_frame(&env, 0));
        // Window cell (i, j) is grid cell (i - 1, j - 1).
        assert!(frame[..25].iter().all(|&v| v == 0.0), "Empty is all zeros");
        assert_eq!(at(frame, Entity::Agent, 2, 2), 1.0, "itself in the centre");
        assert_eq!(at(frame, Entity::Sand, 2, 2), 1.0, "on sand");
        assert_eq!(at(frame, Entity::Wall, 2, 2), 0.0);
        assert_eq!(at(frame, Entity::Gem, 3, 3), 1.0);
        assert_eq!(at(frame, Entity::Sand, 3, 3), 1.0);
        assert_eq!(at(frame, Entity::Agent, 4, 4), 1.0, "agent 1");
        assert_eq!(
            at(frame, Entity::Sand, 2, 3),
            1.0,
            "an empty interior cell: sand only"
        );
        let total = |i, j| -> f32 { (0..5).map(|c| frame[c * 25 + i * 5 + j]).sum() };
        assert_eq!(total(2, 3), 1.0);
        for (i, j) in [(0, 0), (0, 3), (2, 0), (4, 0)] {
            assert_eq!(
                (at(frame, Entity::Wall, i, j), total(i, j)),
                (1.0, 1.0),
                "outside ({i}, {j})"
            );
        }
        for (i, j) in [(1, 1), (1, 4), (3, 1), (4, 1)] {
            assert_eq!(
                (at(frame, Entity::Wall, i, j), total(i, j)),
                (2.0, 2.0),
                "border ({i}, {j})"
            );
        }
        let sum = |e: Entity| -> f32 { frame[e.channel() * 25..][..25].iter().sum() };
        assert_eq!(sum(Entity::Gem), 1.0);
        assert_eq!(sum(Entity::Agent), 2.0);
        assert_eq!(sum(Entity::Sand), 9.0, "the 3 × 3 interior");
        assert_eq!(sum(Entity::Wall), 9.0 * 1.0 + 7.0 * 2.0);
        assert!(env
            .observation_space()
            .contains(&crate::Value::Box(buf.obs[..625].to_vec())));
        assert!(buf.obs[..500].iter().all(|&v| v == 0.0), "no earlier frames");
        assert!(
            buf.obs[625..].iter().all(|&v| v == 0.0),
            "agent 1 has not observed yet"
        );
    }

    #[test]
    fn frames_stack_oldest_first_at_decision_points() {
        let (mut env, mut buf) = hand_built(config(6, 6, 2), &[(2, 2), (4, 4)], &[]);
        let first0 = current_frame(&env, 0).to_vec();
        act(&mut env, &mut buf, RIGHT);
        let stack0 = &buf.obs[..625];
        assert!(stack0[..500].iter().all(|&v| v == 0.0));
        assert_eq!(&stack0[500..], first0, "agent 0 keeps its stack while inactive");
        let stack1 = buf.obs[625..].to_vec();
        assert!(
            stack1[..500].iter().all(|&v| v == 0.0),
            "zeros before agent 1's first frame"
        );
        assert_eq!(at(&stack1[500..], Entity::Agent, 2, 2), 1.0);
        act(&mut env, &mut buf, UP);
        assert_eq!(
            &buf.obs[625..],
            stack1.as_slice(),
            "agent 1 has not observed again"
        );
        let stack0 = &buf.obs[..625];
        assert!(stack0[..375].iter().all(|&v| v == 0.0));
        assert_eq!(&stack0[375..500], first0, "the older frame moved up one slot");
        // The new frame: agent 0 moved right, so the agent cell of its old place is empty.
        assert_eq!(at(&stack0[500..], Entity::Agent, 2, 2), 1.0);
        assert_eq!(at(&stack0[500..], Entity::Agent, 2, 1), 0.0);
        assert_eq!(at(&first0, Entity::Agent, 2, 2), 1.0);
        for _ in 0..8 {
            act(&mut env, &mut buf, LEFT);
        }
        let stack0 = &buf.obs[..625];
        assert!(
            stack0.chunks(125).all(|f| at(f, Entity::Agent, 2, 2) == 1.0),
            "5 real frames"
        );
        assert_eq!(env.observation(0), Some(&buf.obs[..625]));
        assert_eq!(env.observation(2), None);
    }

    #[test]
    fn truncates_and_resets_after_max_turns_times_num_agents_steps() {
        let mut cfg = config(6, 6, 3);
        cfg.max_turns = 4;
        cfg.spawn_prob = 0.3;
        let mut env = Treasurehunt::new(cfg).unwrap();
        let mut buf = VecBuffers::new(3, 625);
        env.reset(Some(5), &mut buf.obs).unwrap();
        assert_eq!((env.last_team_return(), env.last_episode_returns()), (None, None));
        let mut rng = Pcg64Mcg::seed_from_u64(9);
        let mut returns = [0.0f64; 3];
        for step in 1..=12 {
            let acting = env.active_agent();
            assert_eq!(acting, (step - 1) % 3);
            let actions: Vec<i64> = (0..3).map(|_| rng.random_range(0..4)).collect();
            env.step(ActionBatch::Discrete(&actions), buf.view()).unwrap();
            for (total, &r) in returns.iter_mut().zip(&buf.rewards) {
                *total += f64::from(r);
            }
            assert!(buf.terminated.iter().all(|&t| !t));
            assert!(buf.truncated.iter().all(|&t| t == (step == 12)), "step {step}");
        }
        assert_eq!(env.last_episode_returns(), Some(&returns[..]));
        assert_eq!(env.last_team_return(), Some(returns.iter().sum()));
        assert_eq!((env.turn(), env.active_agent()), (0, 0));
        assert!(env.is_active(0) && !env.is_active(1) && !env.is_active(2));
        assert_eq!(env.episode_returns(), [0.0; 3]);
        assert!(buf.obs[..500].iter().all(|&v| v == 0.0), "cleared stacks");
        assert_eq!(at(&buf.obs[500..625], Entity::Agent, 2, 2), 1.0);
        assert!(buf.obs[625..].iter().all(|&v| v == 0.0));
        assert_eq!(env.top.iter().filter(|&&e| e == Entity::Agent).count(), 3);
    }

    #[test]
    fn same_seed_same_trajectory() {
        let run = |seed: u64| {
            let mut env = Treasurehunt::new(TreasurehuntConfig::default()).unwrap();
            let mut buf = VecBuffers::new(5, 625);
            env.reset(Some(seed), &mut buf.obs).unwrap();
            let mut rng = Pcg64Mcg::seed_from_u64(1);
            let mut trace = buf.obs.clone();
            for _ in 0..2 * 250 + 17 {
                let actions: Vec<i64> = (0..5).map(|_| rng.random_range(0..4)).collect();
                env.step(ActionBatch::Discrete(&actions), buf.view()).unwrap();
                trace.extend_from_slice(&buf.obs);
                trace.extend_from_slice(&buf.rewards);
            }
            trace
        };
        assert_eq!(run(11), run(11));
        assert_ne!(run(11), run(12));
        let fresh = |seed: Option<u64>| {
            let mut env = Treasurehunt::new(TreasurehuntConfig::default()).unwrap();
            let mut obs = vec![0.0; 5 * 625];
            env.reset(seed, &mut obs).unwrap();
            (obs, env.positions.clone(), env.top.clone())
        };
        assert_eq!(fresh(None), fresh(Some(0)), "never seeded = seed 0");
    }

    #[test]
    fn rejects_bad_actions_and_buffers() {
        let mut env = Treasurehunt::new(config(5, 5, 2)).unwrap();
        let mut buf = VecBuffers::new(2, 625);
        assert!(matches!(
            env.reset(None, &mut buf.obs[..10]),
            Err(EnvError::BufferSize { .. })
        ));
        env.reset(None, &mut buf.obs).unwrap();
        for bad in [4, -1] {
            assert!(matches!(
                env.step(ActionBatch::Discrete(&[bad, 0]), buf.view()),
                Err(EnvError::InvalidAction { .. })
            ));
        }
        assert!(matches!(
            env.step(ActionBatch::Continuous(&[0.0, 0.0]), buf.view()),
            Err(EnvError::InvalidAction { .. })
        ));
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[0]), buf.view()),
            Err(EnvError::BufferSize { .. })
        ));
        let mut three = VecBuffers::new(3, 625);
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[0, 0]), three.view()),
            Err(EnvError::BufferSize { .. })
        ));
        assert_eq!(env.active_agent(), 0, "nothing happened");
        env.step(ActionBatch::Discrete(&[0, -7]), buf.view()).unwrap();
        assert_eq!(env.active_agent(), 1, "the inactive agent's action is ignored");
    }

    #[test]
    fn random_policy_team_return() {
        let mut env = Treasurehunt::new(TreasurehuntConfig::default()).unwrap();
        let mut buf = VecBuffers::new(5, 625);
        env.reset(Some(2024), &mut buf.obs).unwrap();
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        let episodes = 50;
        let mut team_returns = Vec::new();
        while team_returns.len() < episodes {
            let actions: Vec<i64> = (0..5).map(|_| rng.random_range(0..4)).collect();
            env.step(ActionBatch::Discrete(&actions), buf.view()).unwrap();
            if buf.truncated[0] {
                team_returns.extend(env.last_team_return());
            }
        }
        let mean = team_returns.iter().sum::<f64>() / episodes as f64;
        let min = team_returns.iter().copied().fold(f64::INFINITY, f64::min);
        let max = team_returns.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!("random policy: mean team return {mean:.2} over {episodes} episodes (min {min}, max {max})");
        // Measured: 257.7 (min 152, max 345); the spec reports 220-313 after 100 epochs of
        // learners still about 90% random.
        assert!((150.0..400.0).contains(&mean), "mean team return {mean}");
    }
}
