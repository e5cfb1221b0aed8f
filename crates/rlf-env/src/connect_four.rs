//! Connect Four, native: PettingZoo 1.24.3's `connect_four_v3`, move for move.
//!
//! Two players drop pieces into a board of [`ROWS`] × [`COLUMNS`]; a piece falls to the lowest
//! empty row of its column. Four of one player's pieces in a row (horizontally, vertically or
//! diagonally) win: +1 to the winner, −1 to the loser. A full board without a winner is a draw
//! (both rewards 0). Every game ends by a win or a draw; there is no truncation. `player_0`
//! ([`Side::First`]) moves first.
//!
//! - [`ConnectFour`]: the game (board, side to move, legal moves, [`play`](ConnectFour::play),
//!   outcome, [`observe`](ConnectFour::observe)), and a turn-based [`MultiAgentEnv`] of two agents
//!   (agent 0 = `player_0`) that resets itself when a game ends.
//! - [`TeamConnectFour`]: the same game between two teams of several players who move in turn
//!   (`--env_kwargs players_per_side=2`), for team self-play.
//! - [`Player`]: anything that chooses a column; [`RandomPlayer`] and [`HeuristicPlayer`] are
//!   built-in opponents for evaluation, and [`play_game`] pits any two.
//!
//! # Observation
//! As PettingZoo's: a dict of `action_mask` (7 values, 1 = the column is a legal move for this
//! player now; all zeros for the player not to move) and `observation` (6 rows × 7 columns × 2
//! planes, row 0 at the top; plane 0 holds the observing player's pieces, plane 1 the opponent's).
//! The observation space is `Dict(action_mask, observation)` in this order (Gymnasium's sorted
//! keys), so the flat encoding is the 7 mask values then the 84 board values in
//! `[row][column][plane]` order: [`OBS_DIM`] = 91 values per agent, each 0 or 1.
//!
//! # After the game
//! PettingZoo passes the turn even on the final move, and its mask then still lists the non-full
//! columns for the player selected next. Here [`ConnectFour::to_move`] also passes the turn, but a
//! finished game has no legal move: its mask is all zeros for both players. The env never exposes
//! a finished game: it resets within the step that ends it.

use std::fmt;
use std::sync::{Arc, LazyLock};

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::{Action, ActionBatch, BoxSpace, EnvError, MultiAgentEnv, Ply, PlyModel, Space, StepBuffers};

/// The env's id, as PettingZoo names it.
pub const ID: &str = "connect_four_v3";

/// Number of rows of the board.
pub const ROWS: usize = 6;

/// Number of columns of the board (and of actions).
pub const COLUMNS: usize = 7;

/// Number of values of the board part of an observation: rows × columns × 2 planes.
pub const BOARD_DIM: usize = ROWS * COLUMNS * 2;

/// Number of values of one agent's flat observation: the action mask, then the board.
pub const OBS_DIM: usize = COLUMNS + BOARD_DIM;

/// The most players a side of [`TeamConnectFour`] may have: a game lasts at most [`ROWS`] × [`COLUMNS`] moves, so
/// with more some players could never move.
pub const MAX_PLAYERS_PER_SIDE: usize = ROWS * COLUMNS / 2;

/// Columns from the centre outwards: the order in which [`HeuristicPlayer`] breaks ties.
const CENTRE_FIRST: [usize; COLUMNS] = [3, 2, 4, 1, 5, 0, 6];

/// Line directions (row step, column step): horizontal, vertical and the two diagonals.
const DIRECTIONS: [(isize, isize); 4] = [(0, 1), (1, 0), (1, 1), (1, -1)];

static ACTION_SPACE: Space = Space::Discrete { n: 7, start: 0 };

static OBSERVATION_SPACE: LazyLock<Space> = LazyLock::new(|| {
    let unit_box = |shape: Vec<usize>| {
        let size = shape.iter().product();
        Space::Box(BoxSpace {
            low: vec![0.0; size],
            high: vec![1.0; size],
            shape,
            bytes: true,
        })
    };
    Space::Dict(vec![
        ("action_mask".to_owned(), unit_box(vec![COLUMNS])),
        ("observation".to_owned(), unit_box(vec![ROWS, COLUMNS, 2])),
    ])
});

/// One of the two players.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// `player_0`, agent 0: moves first.
    First,
    /// `player_1`, agent 1.
    Second,
}

impl Side {
    /// Both sides, in agent order.
    pub const ALL: [Side; 2] = [Side::First, Side::Second];

    /// The agent index: 0 for [`Side::First`], 1 for [`Side::Second`].
    pub fn index(self) -> usize {
        match self {
            Side::First => 0,
            Side::Second => 1,
        }
    }

    /// The side of agent `index`; `None` unless `index` is 0 or 1.
    pub fn from_index(index: usize) -> Option<Side> {
        match index {
            0 => Some(Side::First),
            1 => Some(Side::Second),
            _ => None,
        }
    }

    /// The other side.
    pub fn opponent(self) -> Side {
        match self {
            Side::First => Side::Second,
            Side::Second => Side::First,
        }
    }

    /// PettingZoo's agent name: `player_0` or `player_1`.
    pub fn name(self) -> &'static str {
        match self {
            Side::First => "player_0",
            Side::Second => "player_1",
        }
    }
}

/// The state of a game after a move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The game goes on.
    Ongoing,
    /// This side made four in a row.
    Win(Side),
    /// The board is full and nobody won.
    Draw,
}

impl Outcome {
    /// Whether the game has ended (a win or a draw).
    pub fn is_over(self) -> bool {
        self != Outcome::Ongoing
    }

    /// The reward `side` receives for this outcome: +1 for the winner, −1 for the loser, 0 when
    /// the game goes on or is drawn.
    pub fn reward(self, side: Side) -> f32 {
        match self {
            Outcome::Win(winner) if winner == side => 1.0,
            Outcome::Win(_) => -1.0,
            Outcome::Ongoing | Outcome::Draw => 0.0,
        }
    }
}

/// A game of Connect Four (see the [module doc](self)); also a two-agent turn-based
/// [`MultiAgentEnv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectFour {
    /// Row 0 is the top row.
    cells: [[Option<Side>; COLUMNS]; ROWS],
    /// Number of pieces in each column.
    heights: [usize; COLUMNS],
    to_move: Side,
    moves: usize,
    outcome: Outcome,
}

impl Default for ConnectFour {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnectFour {
    /// An empty board, `player_0` to move.
    pub fn new() -> Self {
        Self {
            cells: [[None; COLUMNS]; ROWS],
            heights: [0; COLUMNS],
            to_move: Side::First,
            moves: 0,
            outcome: Outcome::Ongoing,
        }
    }

    /// The game after playing `columns` in turn from an empty board; the first illegal move is an
    /// error, as in [`play`](Self::play).
    pub fn from_moves(columns: &[usize]) -> Result<Self, EnvError> {
        let mut game = Self::new();
        for &column in columns {
            game.play(column)?;
        }
        Ok(game)
    }

    /// The game an observation of the side to move shows ([`observe`](Self::observe)'s layout): the pieces of its
    /// two planes, that side to move. `None` for an observation no game of the side to move gives: a length other
    /// than [`OBS_DIM`], a value other than 0 and 1, a cell of both sides, a piece above an empty cell, piece counts
    /// that do not alternate, a mask that is not the non-full columns, or a finished game.
    pub fn from_observation(obs: &[f32]) -> Option<Self> {
        if obs.len() != OBS_DIM || obs.iter().any(|&v| v != 0.0 && v != 1.0) {
            return None;
        }
        let (mask, board) = obs.split_at(COLUMNS);
        let (mut mine, mut theirs) = ([[false; COLUMNS]; ROWS], [[false; COLUMNS]; ROWS]);
        for (i, planes) in board.chunks_exact(2).enumerate() {
            (mine[i / COLUMNS][i % COLUMNS], theirs[i / COLUMNS][i % COLUMNS]) =
                (planes[0] == 1.0, planes[1] == 1.0);
        }
        let count = |cells: &[[bool; COLUMNS]; ROWS]| cells.iter().flatten().filter(|&&c| c).count();
        let (me, other) = match count(&mine).checked_sub(count(&theirs)) {
            Some(0) => (Side::First, Side::Second),
            None if count(&theirs) == count(&mine) + 1 => (Side::Second, Side::First),
            _ => return None,
        };
        let mut game = Self::new();
        for column in 0..COLUMNS {
            for row in (0..ROWS).rev() {
                let cell = match (mine[row][column], theirs[row][column]) {
                    (false, false) => None,
                    (true, false) => Some(me),
                    (false, true) => Some(other),
                    (true, true) => return None,
                };
                match cell {
                    Some(_) if game.heights[column] < ROWS - 1 - row => return None,
                    Some(_) => game.heights[column] += 1,
                    None => {}
                }
                game.cells[row][column] = cell;
            }
        }
        game.moves = count(&mine) + count(&theirs);
        game.to_move = me;
        let won = |side: Side| {
            (0..ROWS).any(|r| {
                (0..COLUMNS).any(|c| game.cell(r, c) == Some(side) && game.completes_four(r, c, side))
            })
        };
        if won(me) || won(other) || game.moves == ROWS * COLUMNS {
            return None;
        }
        let legal = (0..COLUMNS).all(|c| (mask[c] == 1.0) == game.is_legal(c));
        legal.then_some(game)
    }

    /// The side whose turn it is; once the game has ended, the side that would have moved next
    /// (as PettingZoo's `agent_selection`).
    pub fn to_move(&self) -> Side {
        self.to_move
    }

    /// The piece at `row` (0 = top) and `column`; `None` for an empty cell or outside the board.
    pub fn cell(&self, row: usize, column: usize) -> Option<Side> {
        self.cells.get(row).and_then(|r| r.get(column)).copied().flatten()
    }

    /// Number of pieces on the board.
    pub fn num_moves(&self) -> usize {
        self.moves
    }

    /// Whether the game goes on, was won, or was drawn.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The winner, if any.
    pub fn winner(&self) -> Option<Side> {
        match self.outcome {
            Outcome::Win(side) => Some(side),
            Outcome::Ongoing | Outcome::Draw => None,
        }
    }

    /// Whether the game ended in a draw.
    pub fn is_draw(&self) -> bool {
        self.outcome == Outcome::Draw
    }

    /// Whether the game has ended.
    pub fn is_over(&self) -> bool {
        self.outcome.is_over()
    }

    /// Whether the side to move may play `column` now: the game goes on and the column exists and
    /// is not full.
    pub fn is_legal(&self, column: usize) -> bool {
        !self.is_over() && self.heights.get(column).is_some_and(|&h| h < ROWS)
    }

    /// The legal columns, in increasing order (none once the game has ended).
    pub fn legal_moves(&self) -> impl Iterator<Item = usize> + '_ {
        (0..COLUMNS).filter(|&c| self.is_legal(c))
    }

    /// PettingZoo's action mask for `side`: the legal columns if `side` is to move, all `false`
    /// for the other side (and for both once the game has ended).
    pub fn action_mask(&self, side: Side) -> [bool; COLUMNS] {
        let mut mask = [false; COLUMNS];
        if side == self.to_move {
            for (column, legal) in mask.iter_mut().enumerate() {
                *legal = self.is_legal(column);
            }
        }
        mask
    }

    /// Whether a piece of `side` dropped into `column` now would make four in a row (whoever is to
    /// move; `false` for an illegal column or a finished game).
    pub fn is_winning_move(&self, column: usize, side: Side) -> bool {
        self.is_legal(column) && self.completes_four(ROWS - 1 - self.heights[column], column, side)
    }

    /// Drops a piece of the side to move into `column` and passes the turn; returns the outcome.
    /// An illegal column (out of range or full) is an [`EnvError::InvalidAction`], a move after
    /// the game has ended an [`EnvError::Unsupported`]; neither changes the game.
    pub fn play(&mut self, column: usize) -> Result<Outcome, EnvError> {
        if self.is_over() {
            return Err(EnvError::Unsupported {
                env: ID.to_owned(),
                what: format!("column {column}: a move after the game has ended"),
            });
        }
        if !self.is_legal(column) {
            return Err(self.illegal(format!("column {column}")));
        }
        let row = ROWS - 1 - self.heights[column];
        let side = self.to_move;
        self.cells[row][column] = Some(side);
        self.heights[column] += 1;
        self.moves += 1;
        self.to_move = side.opponent();
        self.outcome = if self.completes_four(row, column, side) {
            Outcome::Win(side)
        } else if self.moves == ROWS * COLUMNS {
            Outcome::Draw
        } else {
            Outcome::Ongoing
        };
        Ok(self.outcome)
    }

    /// Writes `side`'s flat observation (see the [module doc](self)) into `out`, which must hold
    /// [`OBS_DIM`] values.
    pub fn observe(&self, side: Side, out: &mut [f32]) -> Result<(), EnvError> {
        if out.len() != OBS_DIM {
            return Err(EnvError::BufferSize {
                what: format!("{ID} observation of {}", side.name()),
                expected: OBS_DIM,
                got: out.len(),
            });
        }
        let (mask, board) = out.split_at_mut(COLUMNS);
        for (value, legal) in mask.iter_mut().zip(self.action_mask(side)) {
            *value = f32::from(u8::from(legal));
        }
        for (planes, cell) in board.chunks_exact_mut(2).zip(self.cells.iter().flatten()) {
            planes[0] = f32::from(u8::from(*cell == Some(side)));
            planes[1] = f32::from(u8::from(*cell == Some(side.opponent())));
        }
        Ok(())
    }

    /// Whether `side` has four in a row through (`row`, `column`), counting that cell as its own.
    fn completes_four(&self, row: usize, column: usize, side: Side) -> bool {
        DIRECTIONS.iter().any(|&(dr, dc)| {
            1 + self.run(row, column, dr, dc, side) + self.run(row, column, -dr, -dc, side) >= 4
        })
    }

    /// Number of consecutive pieces of `side` from (`row`, `column`), exclusive, stepping by
    /// (`dr`, `dc`).
    fn run(&self, row: usize, column: usize, dr: isize, dc: isize, side: Side) -> usize {
        let mut count = 0;
        let (mut r, mut c) = (row, column);
        loop {
            match (r.checked_add_signed(dr), c.checked_add_signed(dc)) {
                (Some(next_r), Some(next_c)) if self.cell(next_r, next_c) == Some(side) => {
                    count += 1;
                    (r, c) = (next_r, next_c);
                }
                _ => return count,
            }
        }
    }

    fn illegal(&self, action: String) -> EnvError {
        let legal: Vec<usize> = self.legal_moves().collect();
        EnvError::InvalidAction {
            env: ID.to_owned(),
            action,
            space: format!("{ACTION_SPACE} (legal columns now: {legal:?})"),
        }
    }
}

impl fmt::Display for ConnectFour {
    /// The board, top row first: `X` for `player_0`, `O` for `player_1`, `.` for empty, then the
    /// column numbers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for row in &self.cells {
            for cell in row {
                let mark = match cell {
                    Some(Side::First) => 'X',
                    Some(Side::Second) => 'O',
                    None => '.',
                };
                write!(f, "{mark}")?;
            }
            writeln!(f)?;
        }
        f.write_str("0123456")
    }
}

impl MultiAgentEnv for ConnectFour {
    fn id(&self) -> &str {
        ID
    }

    fn num_agents(&self) -> usize {
        2
    }

    fn agent_name(&self, agent: usize) -> String {
        let side = if agent == 0 { Side::First } else { Side::Second };
        side.name().to_owned()
    }

    fn observation_space(&self) -> &Space {
        &OBSERVATION_SPACE
    }

    fn action_space(&self) -> &Space {
        &ACTION_SPACE
    }

    /// An empty board, `player_0` to move; the seed does not matter (the game has no randomness).
    fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        let fresh = Self::new();
        observe_turns(&fresh, 2, obs)?;
        *self = fresh;
        Ok(())
    }

    /// Plays the active agent's column (the other agent's action is ignored), writes both agents'
    /// rewards, flags and next observations, and resets the board when the game ends. An illegal
    /// column is an [`EnvError::InvalidAction`] that changes nothing.
    fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<(), EnvError> {
        step_turns(self, 2, actions, out)
    }

    /// Whether `agent` is the one to move (never once the game has ended, which the env itself
    /// never shows: it resets first).
    fn is_active(&self, agent: usize) -> bool {
        !self.is_over() && agent == self.to_move.index()
    }

    /// [`RandomPlayer`] and [`HeuristicPlayer`], as `eval --opponent` names them.
    fn builtin_players(&self) -> &[&'static str] {
        &BUILTIN_PLAYERS
    }

    fn builtin_action(&self, player: usize, agent: usize, rng: &mut Pcg64Mcg) -> Option<usize> {
        builtin_turn(self, self.is_active(agent), player, rng)
    }

    fn ply_model(&self) -> Option<Arc<dyn PlyModel>> {
        Some(Arc::new(ConnectFourRules))
    }
}

/// Connect Four between two teams of `players_per_side` players each (`connect_four` with
/// `--env_kwargs players_per_side=K`): agent `a` (`player_a`) plays for [`Side::First`] when `a`
/// is even and [`Side::Second`] when odd ([`MultiAgentEnv::team`] `a % 2`), and the players move in
/// turn, `player_0`, `player_1`, `player_2`, ... so that the sides still alternate. Each player
/// sees the board as its side does ([`ConnectFour::observe`]); the action mask lists the legal
/// columns for the player to move only (all zeros for its teammates). A win gives +1 to every
/// player of the winning side and −1 to every player of the other; a game ends for all players at
/// once. With one player per side it is [`ConnectFour`], move for move.
#[derive(Debug, Clone)]
pub struct TeamConnectFour {
    game: ConnectFour,
    num_agents: usize,
}

impl TeamConnectFour {
    /// An empty board between two sides of `players_per_side` players (1 to [`MAX_PLAYERS_PER_SIDE`]).
    pub fn new(players_per_side: usize) -> Result<Self, EnvError> {
        if !(1..=MAX_PLAYERS_PER_SIDE).contains(&players_per_side) {
            return Err(EnvError::InvalidConfig {
                env: "connect_four".into(),
                reason: format!(
                    "players_per_side must be from 1 to {MAX_PLAYERS_PER_SIDE}, got {players_per_side}"
                ),
            });
        }
        Ok(Self {
            game: ConnectFour::new(),
            num_agents: 2 * players_per_side,
        })
    }

    /// The game being played.
    pub fn game(&self) -> &ConnectFour {
        &self.game
    }

    /// The agent to move.
    fn mover(&self) -> usize {
        self.game.num_moves() % self.num_agents
    }
}

impl MultiAgentEnv for TeamConnectFour {
    fn id(&self) -> &str {
        ID
    }

    fn num_agents(&self) -> usize {
        self.num_agents
    }

    fn agent_name(&self, agent: usize) -> String {
        format!("player_{agent}")
    }

    fn team(&self, agent: usize) -> usize {
        agent % 2
    }

    fn observation_space(&self) -> &Space {
        &OBSERVATION_SPACE
    }

    fn action_space(&self) -> &Space {
        &ACTION_SPACE
    }

    fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        let fresh = ConnectFour::new();
        observe_turns(&fresh, self.num_agents, obs)?;
        self.game = fresh;
        Ok(())
    }

    fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<(), EnvError> {
        step_turns(&mut self.game, self.num_agents, actions, out)
    }

    fn is_active(&self, agent: usize) -> bool {
        !self.game.is_over() && agent == self.mover()
    }

    fn builtin_players(&self) -> &[&'static str] {
        &BUILTIN_PLAYERS
    }

    fn builtin_action(&self, player: usize, agent: usize, rng: &mut Pcg64Mcg) -> Option<usize> {
        builtin_turn(&self.game, self.is_active(agent), player, rng)
    }

    fn ply_model(&self) -> Option<Arc<dyn PlyModel>> {
        Some(Arc::new(ConnectFourRules))
    }
}

/// Connect Four's rules as a [`PlyModel`]: the position from the mover's observation
/// ([`ConnectFour::from_observation`]), the move played, and the board as the other side sees it. The same for
/// [`TeamConnectFour`], whose sides alternate as the two players do.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnectFourRules;

impl PlyModel for ConnectFourRules {
    fn obs_dim(&self) -> usize {
        OBS_DIM
    }

    fn num_actions(&self) -> usize {
        COLUMNS
    }

    fn ply(&self, obs: &[f32], action: usize, next: &mut [f32]) -> Option<Ply> {
        let mut game = ConnectFour::from_observation(obs)?;
        let mover = game.to_move();
        let outcome = game.play(action).ok()?;
        if !outcome.is_over() {
            game.observe(mover.opponent(), next).ok()?;
        }
        Some(Ply {
            reward: outcome.reward(mover),
            ends: outcome.is_over(),
        })
    }
}

/// The side agent `agent` plays for when `num_agents` players take turns (even agents first).
fn side_of(agent: usize) -> Side {
    if agent % 2 == 0 {
        Side::First
    } else {
        Side::Second
    }
}

/// Writes the observations of `num_agents` players taking turns in `game` ([`OBS_DIM`] values per
/// agent): each its side's view, the mask only for the player to move.
fn observe_turns(game: &ConnectFour, num_agents: usize, obs: &mut [f32]) -> Result<(), EnvError> {
    if obs.len() != num_agents * OBS_DIM {
        return Err(EnvError::BufferSize {
            what: format!("{ID} observation buffer"),
            expected: num_agents * OBS_DIM,
            got: obs.len(),
        });
    }
    let mover = game.num_moves() % num_agents;
    for (agent, slot) in obs.chunks_exact_mut(OBS_DIM).enumerate() {
        game.observe(side_of(agent), slot)?;
        if agent != mover {
            slot[..COLUMNS].fill(0.0);
        }
    }
    Ok(())
}

/// One step of `num_agents` players taking turns in `game`: plays the mover's column (the others'
/// actions are ignored), writes every agent's reward (its side's), flags and next observation, and
/// starts a new game when this one ends. An illegal column changes nothing.
fn step_turns(
    game: &mut ConnectFour,
    num_agents: usize,
    actions: ActionBatch<'_>,
    out: StepBuffers<'_>,
) -> Result<(), EnvError> {
    out.check(ID, num_agents, OBS_DIM)?;
    let mover = game.num_moves() % num_agents;
    let action = match actions.get(mover, 1) {
        Some(action) if actions.len() == num_agents => action,
        _ => {
            return Err(EnvError::BufferSize {
                what: format!("{ID} action batch"),
                expected: num_agents,
                got: actions.len(),
            })
        }
    };
    let column = match action {
        Action::Discrete(a) => usize::try_from(a).ok(),
        Action::Continuous(_) | Action::MultiDiscrete(_) => None,
    };
    let Some(column) = column else {
        return Err(game.illegal(action.to_string()));
    };
    let outcome = game.play(column)?;
    for agent in 0..num_agents {
        out.rewards[agent] = outcome.reward(side_of(agent));
        out.terminated[agent] = outcome.is_over();
        out.truncated[agent] = false;
    }
    if outcome.is_over() {
        *game = ConnectFour::new();
    }
    observe_turns(game, num_agents, out.obs)
}

/// The move built-in player `player` makes in `game` for an agent that is to move (`active`).
fn builtin_turn(game: &ConnectFour, active: bool, player: usize, rng: &mut Pcg64Mcg) -> Option<usize> {
    if !active {
        return None;
    }
    match BUILTIN_PLAYERS.get(player)? {
        &"random" => random_legal(rng, game),
        _ => heuristic_move(rng, game),
    }
}

/// The built-in players' names, by index.
const BUILTIN_PLAYERS: [&str; 2] = ["random", "heuristic"];

/// Anything that picks a move: a built-in opponent, a scripted line, or a policy.
pub trait Player {
    /// A column for the side to move in `game`: a legal one, or `None` when the game has ended.
    fn choose(&mut self, game: &ConnectFour) -> Option<usize>;
}

/// A uniformly random legal column from `rng`; `None` when there is none.
fn random_legal(rng: &mut Pcg64Mcg, game: &ConnectFour) -> Option<usize> {
    let count = game.legal_moves().count();
    if count == 0 {
        return None;
    }
    let k = rng.random_range(0..count);
    game.legal_moves().nth(k)
}

/// Plays a uniformly random legal column, from a seeded PCG generator ([`Pcg64Mcg`]).
#[derive(Debug, Clone)]
pub struct RandomPlayer {
    rng: Pcg64Mcg,
}

impl RandomPlayer {
    /// A random player whose choices are determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Pcg64Mcg::seed_from_u64(seed),
        }
    }
}

impl Player for RandomPlayer {
    fn choose(&mut self, game: &ConnectFour) -> Option<usize> {
        random_legal(&mut self.rng, game)
    }
}

/// A one-ply heuristic: plays a winning column if there is one, else blocks a column where the
/// opponent would win next, else a uniformly random legal column (seeded [`Pcg64Mcg`]). Among
/// several winning (or blocking) columns it takes the one nearest the centre, the left one on a
/// tie (the order 3, 2, 4, 1, 5, 0, 6).
#[derive(Debug, Clone)]
pub struct HeuristicPlayer {
    rng: Pcg64Mcg,
}

impl HeuristicPlayer {
    /// A heuristic player whose random fallback is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Pcg64Mcg::seed_from_u64(seed),
        }
    }
}

impl Player for HeuristicPlayer {
    fn choose(&mut self, game: &ConnectFour) -> Option<usize> {
        heuristic_move(&mut self.rng, game)
    }
}

/// [`HeuristicPlayer`]'s column for the side to move in `game`, its random fallback from `rng`.
fn heuristic_move(rng: &mut Pcg64Mcg, game: &ConnectFour) -> Option<usize> {
    let me = game.to_move();
    let first_where = |side: Side| CENTRE_FIRST.into_iter().find(|&c| game.is_winning_move(c, side));
    first_where(me)
        .or_else(|| first_where(me.opponent()))
        .or_else(|| random_legal(rng, game))
}

/// Plays one game from an empty board, `first` as `player_0` and `second` as `player_1`, and
/// returns how it ended. A player that picks an illegal column, or none while the game goes on,
/// is an [`EnvError::InvalidAction`].
pub fn play_game(first: &mut dyn Player, second: &mut dyn Player) -> Result<Outcome, EnvError> {
    let mut game = ConnectFour::new();
    loop {
        let player: &mut dyn Player = match game.to_move() {
            Side::First => &mut *first,
            Side::Second => &mut *second,
        };
        let Some(column) = player.choose(&game) else {
            return Err(game.illegal(format!("no move from {}", game.to_move().name())));
        };
        let outcome = game.play(column)?;
        if outcome.is_over() {
            return Ok(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VecBuffers;

    /// A full board without four in a row (found by random play).
    const DRAW: [usize; 42] = [
        4, 3, 6, 0, 1, 4, 5, 5, 1, 1, 5, 0, 1, 6, 0, 1, 5, 5, 1, 0, 4, 6, 3, 2, 6, 6, 0, 4, 6, 5, 2, 0, 4, 2,
        4, 2, 2, 2, 3, 3, 3, 3,
    ];

    fn game(moves: &[usize]) -> ConnectFour {
        ConnectFour::from_moves(moves).expect("legal moves")
    }

    /// Plays all but the last move, checks the game goes on, then the last move's outcome.
    fn last_move_outcome(moves: &[usize]) -> Outcome {
        let (&last, before) = moves.split_last().expect("at least one move");
        let mut g = game(before);
        assert_eq!(g.outcome(), Outcome::Ongoing, "{g}");
        g.play(last).expect("legal last move")
    }

    #[test]
    fn wins_in_all_four_directions() {
        // Horizontal along the bottom row for player_0.
        assert_eq!(
            last_move_outcome(&[0, 0, 1, 1, 2, 2, 3]),
            Outcome::Win(Side::First)
        );
        // Vertical in column 6 for player_1.
        assert_eq!(
            last_move_outcome(&[0, 6, 1, 6, 0, 6, 1, 6]),
            Outcome::Win(Side::Second)
        );
        // Rising diagonal (bottom-left to top-right) for player_0: (5,0) (4,1) (3,2) (2,3).
        assert_eq!(
            last_move_outcome(&[0, 1, 1, 2, 2, 3, 2, 3, 3, 6, 3]),
            Outcome::Win(Side::First)
        );
        // Falling diagonal (top-left to bottom-right) for player_0: (2,3) (3,4) (4,5) (5,6).
        assert_eq!(
            last_move_outcome(&[6, 5, 5, 4, 4, 3, 4, 3, 3, 0, 3]),
            Outcome::Win(Side::First)
        );
        // A piece completing a line in its middle wins too.
        assert_eq!(
            last_move_outcome(&[0, 0, 1, 1, 3, 3, 2]),
            Outcome::Win(Side::First)
        );
        // Three in a row does not.
        assert_eq!(last_move_outcome(&[0, 0, 1, 1, 2]), Outcome::Ongoing);
    }

    #[test]
    fn finished_game_reports_its_winner() {
        let g = game(&[0, 0, 1, 1, 2, 2, 3]);
        assert_eq!(g.winner(), Some(Side::First));
        assert!(g.is_over() && !g.is_draw());
        assert_eq!(g.to_move(), Side::Second, "the turn passes, as in PettingZoo");
        assert_eq!(g.legal_moves().count(), 0);
        assert_eq!(g.action_mask(Side::Second), [false; COLUMNS]);
        assert_eq!(Outcome::Win(Side::First).reward(Side::First), 1.0);
        assert_eq!(Outcome::Win(Side::First).reward(Side::Second), -1.0);
        assert_eq!(g.cell(5, 3), Some(Side::First));
        assert_eq!(g.cell(4, 3), None);
        assert_eq!(g.cell(6, 0), None);
        assert_eq!(g.to_string().lines().last(), Some("0123456"));
        assert_eq!(g.to_string().lines().nth(5), Some("XXXX..."));
    }

    #[test]
    fn full_board_without_four_is_a_draw() {
        assert_eq!(last_move_outcome(&DRAW), Outcome::Draw);
        let g = game(&DRAW);
        assert!(g.is_draw() && g.is_over());
        assert_eq!(g.winner(), None);
        assert_eq!(g.num_moves(), ROWS * COLUMNS);
        assert_eq!(Outcome::Draw.reward(Side::First), 0.0);
        assert_eq!(Outcome::Draw.reward(Side::Second), 0.0);
    }

    #[test]
    fn illegal_moves_are_errors_that_change_nothing() {
        let mut g = game(&[2, 2, 2, 2, 2, 2]);
        let before = g;
        assert!(
            matches!(g.play(2), Err(EnvError::InvalidAction { .. })),
            "full column"
        );
        assert!(
            matches!(g.play(7), Err(EnvError::InvalidAction { .. })),
            "no such column"
        );
        assert!(matches!(g.play(usize::MAX), Err(EnvError::InvalidAction { .. })));
        assert_eq!(g, before);
        let err = g.play(2).expect_err("full column").to_string();
        assert!(err.contains("legal columns now: [0, 1, 3, 4, 5, 6]"), "{err}");
        assert!(!g.is_legal(2) && g.is_legal(3));

        let mut over = game(&[0, 0, 1, 1, 2, 2, 3]);
        assert!(matches!(over.play(4), Err(EnvError::Unsupported { .. })));
        assert!(ConnectFour::from_moves(&[0, 0, 0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn mask_lists_legal_columns_for_the_side_to_move_only() {
        let g = game(&[2, 2, 2, 2, 2, 2, 4]);
        assert_eq!(g.to_move(), Side::Second);
        assert_eq!(
            g.action_mask(Side::Second),
            [true, true, false, true, true, true, true]
        );
        assert_eq!(g.action_mask(Side::First), [false; COLUMNS]);
        assert_eq!(g.legal_moves().collect::<Vec<_>>(), [0, 1, 3, 4, 5, 6]);
    }

    #[test]
    fn observation_is_from_the_observer_perspective() {
        let g = game(&[3, 4]);
        let mut first = [9.0; OBS_DIM];
        let mut second = [9.0; OBS_DIM];
        g.observe(Side::First, &mut first).expect("right size");
        g.observe(Side::Second, &mut second).expect("right size");
        assert_eq!(first[..COLUMNS], [1.0; COLUMNS]);
        assert_eq!(second[..COLUMNS], [0.0; COLUMNS]);
        let at = |row: usize, column: usize, plane: usize| COLUMNS + (row * COLUMNS + column) * 2 + plane;
        assert_eq!((first[at(5, 3, 0)], first[at(5, 3, 1)]), (1.0, 0.0));
        assert_eq!((first[at(5, 4, 0)], first[at(5, 4, 1)]), (0.0, 1.0));
        assert_eq!((second[at(5, 3, 0)], second[at(5, 3, 1)]), (0.0, 1.0));
        assert_eq!((second[at(5, 4, 0)], second[at(5, 4, 1)]), (1.0, 0.0));
        assert_eq!(first[COLUMNS..].iter().sum::<f32>(), 2.0);
        assert!(matches!(
            g.observe(Side::First, &mut [0.0; OBS_DIM - 1]),
            Err(EnvError::BufferSize { .. })
        ));
    }

    #[test]
    fn heuristic_takes_a_win_before_blocking() {
        // player_0 has three on the bottom row (0, 1, 2); player_1 three in column 6.
        let g = game(&[0, 6, 1, 6, 2, 6]);
        assert_eq!(g.to_move(), Side::First);
        assert_eq!(
            HeuristicPlayer::new(0).choose(&g),
            Some(3),
            "win rather than block"
        );
    }

    #[test]
    fn heuristic_blocks_an_immediate_loss() {
        // player_0 threatens column 3 on the bottom row; player_1 must block.
        let g = game(&[0, 6, 1, 6, 2]);
        assert_eq!(g.to_move(), Side::Second);
        for seed in 0..10 {
            assert_eq!(HeuristicPlayer::new(seed).choose(&g), Some(3));
        }
        // Two winning columns: the one nearer the centre.
        let g = game(&[1, 1, 2, 2, 3, 3]);
        assert!(g.is_winning_move(0, Side::First) && g.is_winning_move(4, Side::First));
        assert_eq!(HeuristicPlayer::new(0).choose(&g), Some(4));
    }

    #[test]
    fn players_choose_legal_moves_and_nothing_after_the_end() {
        let mut random = RandomPlayer::new(7);
        let mut g = game(&[2, 2, 2, 2, 2, 2]);
        for _ in 0..50 {
            let c = random.choose(&g).expect("a legal move");
            assert!(g.is_legal(c));
        }
        g = game(&DRAW);
        assert_eq!(random.choose(&g), None);
        assert_eq!(HeuristicPlayer::new(1).choose(&g), None);
    }

    #[test]
    fn heuristic_beats_random_players() {
        let mut heuristic_wins = 0;
        for seed in 0..100 {
            let mut heuristic = HeuristicPlayer::new(seed);
            let mut random = RandomPlayer::new(seed + 1000);
            let outcome = if seed % 2 == 0 {
                play_game(&mut heuristic, &mut random)
            } else {
                play_game(&mut random, &mut heuristic)
            };
            let heuristic_side = if seed % 2 == 0 { Side::First } else { Side::Second };
            if outcome.expect("players play legal moves") == Outcome::Win(heuristic_side) {
                heuristic_wins += 1;
            }
        }
        assert!(heuristic_wins >= 80, "{heuristic_wins} / 100");
        let replay = || play_game(&mut RandomPlayer::new(3), &mut HeuristicPlayer::new(4));
        assert_eq!(replay(), replay(), "seeded players replay the same game");
    }

    #[test]
    fn play_game_rejects_a_player_without_a_move() {
        struct Stubborn(usize);
        impl Player for Stubborn {
            fn choose(&mut self, _game: &ConnectFour) -> Option<usize> {
                Some(self.0)
            }
        }
        struct Silent;
        impl Player for Silent {
            fn choose(&mut self, _game: &ConnectFour) -> Option<usize> {
                None
            }
        }
        // Both keep playing column 0: the seventh piece does not fit.
        assert!(matches!(
            play_game(&mut Stubborn(0), &mut Stubborn(0)),
            Err(EnvError::InvalidAction { .. })
        ));
        assert!(matches!(
            play_game(&mut Silent, &mut Stubborn(1)),
            Err(EnvError::InvalidAction { .. })
        ));
    }

    #[test]
    fn env_spaces_follow_pettingzoo() {
        let env = ConnectFour::new();
        assert_eq!(env.id(), "connect_four_v3");
        assert_eq!(env.num_agents(), 2);
        assert_eq!(env.action_space(), &Space::discrete(7));
        assert_eq!(env.observation_space().flat_dim(), OBS_DIM);
        assert_eq!(OBS_DIM, 91);
        let Space::Dict(parts) = env.observation_space() else {
            panic!("a Dict space");
        };
        let names: Vec<&str> = parts.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["action_mask", "observation"]);
        assert_eq!(
            parts[1].1,
            Space::Box(
                BoxSpace::uniform(0.0, 1.0, vec![6, 7, 2])
                    .and_then(BoxSpace::into_bytes)
                    .expect("valid")
            )
        );
        assert_eq!(
            parts[0].1,
            Space::Box(
                BoxSpace::uniform(0.0, 1.0, vec![7])
                    .and_then(BoxSpace::into_bytes)
                    .expect("valid")
            )
        );
    }

    /// Steps `env` with `column` for the active agent and `junk` for the other.
    fn step_env(env: &mut ConnectFour, buf: &mut VecBuffers, column: i64, junk: i64) {
        let actions = if env.is_active(0) {
            [column, junk]
        } else {
            [junk, column]
        };
        env.step(ActionBatch::Discrete(&actions), buf.view())
            .expect("legal move");
    }

    #[test]
    fn env_alternates_agents_and_ignores_the_inactive_action() {
        let mut env = ConnectFour::new();
        let mut buf = VecBuffers::new(2, OBS_DIM);
        buf.obs.fill(9.0);
        env.reset(Some(123), &mut buf.obs).expect("reset");
        assert!(env.is_active(0) && !env.is_active(1) && !env.is_active(2));
        assert_eq!(buf.obs[..COLUMNS], [1.0; COLUMNS]);
        assert_eq!(buf.obs[OBS_DIM..OBS_DIM + COLUMNS], [0.0; COLUMNS]);
        assert!(buf.obs[COLUMNS..OBS_DIM].iter().all(|&v| v == 0.0));

        step_env(&mut env, &mut buf, 3, -5);
        assert!(!env.is_active(0) && env.is_active(1));
        assert_eq!(buf.rewards, [0.0, 0.0]);
        assert_eq!(
            (buf.terminated.as_slice(), buf.truncated.as_slice()),
            (&[false; 2][..], &[false; 2][..])
        );
        let mut expected = vec![0.0; 2 * OBS_DIM];
        observe_turns(&game(&[3]), 2, &mut expected).expect("right size");
        assert_eq!(buf.obs, expected);

        step_env(&mut env, &mut buf, 3, 99);
        assert!(env.is_active(0));
        assert_eq!(env.cell(4, 3), Some(Side::Second));
    }

    #[test]
    fn env_rejects_illegal_moves_and_bad_buffers_without_changing() {
        let mut env = game(&[0, 0, 0, 0, 0, 0]);
        let before = env;
        let mut buf = VecBuffers::new(2, OBS_DIM);
        for bad in [0, 7, -1] {
            assert!(matches!(
                env.step(ActionBatch::Discrete(&[bad, 1]), buf.view()),
                Err(EnvError::InvalidAction { .. })
            ));
        }
        assert!(matches!(
            env.step(ActionBatch::Continuous(&[1.0, 1.0]), buf.view()),
            Err(EnvError::InvalidAction { .. })
        ));
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[1]), buf.view()),
            Err(EnvError::BufferSize { .. })
        ));
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[1, 1, 1]), buf.view()),
            Err(EnvError::BufferSize { .. })
        ));
        let mut one = VecBuffers::new(1, OBS_DIM);
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[1, 1]), one.view()),
            Err(EnvError::BufferSize { .. })
        ));
        assert!(matches!(
            env.reset(None, &mut one.obs),
            Err(EnvError::BufferSize { .. })
        ));
        assert_eq!(env, before);
    }

    #[test]
    fn env_rewards_the_loser_on_the_winners_move_and_resets() {
        let mut env = ConnectFour::new();
        let mut buf = VecBuffers::new(2, OBS_DIM);
        env.reset(None, &mut buf.obs).expect("reset");
        let mut fresh = vec![0.0; 2 * OBS_DIM];
        observe_turns(&ConnectFour::new(), 2, &mut fresh).expect("right size");
        // player_1 wins vertically in column 6 on the 8th move.
        let moves = [0, 6, 1, 6, 0, 6, 1, 6];
        for (t, &column) in moves.iter().enumerate() {
            let mover = t % 2;
            assert!(env.is_active(mover) && !env.is_active(1 - mover), "move {t}");
            step_env(&mut env, &mut buf, column, 0);
            if t + 1 < moves.len() {
                assert_eq!(buf.rewards, [0.0, 0.0]);
                assert_eq!(buf.terminated, [false, false]);
            }
        }
        assert_eq!(buf.rewards, [-1.0, 1.0], "the loser gets -1 on the winner's move");
        assert_eq!(buf.terminated, [true, true]);
        assert_eq!(buf.truncated, [false, false]);
        assert_eq!(buf.obs, fresh, "reset within the step");
        assert!(env.is_active(0) && !env.is_active(1));
        assert_eq!(env, ConnectFour::new());
    }

    #[test]
    fn env_ends_a_draw_with_zero_rewards() {
        let mut env = ConnectFour::new();
        let mut buf = VecBuffers::new(2, OBS_DIM);
        env.reset(None, &mut buf.obs).expect("reset");
        for &column in &DRAW {
            step_env(&mut env, &mut buf, column as i64, 0);
        }
        assert_eq!(buf.rewards, [0.0, 0.0]);
        assert_eq!(buf.terminated, [true, true]);
        assert_eq!(env, ConnectFour::new());
    }

    #[test]
    fn env_refuses_to_step_a_finished_game() {
        let mut env = game(&[0, 0, 1, 1, 2, 2, 3]);
        assert!(!env.is_active(0) && !env.is_active(1));
        let mut buf = VecBuffers::new(2, OBS_DIM);
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[4, 4]), buf.view()),
            Err(EnvError::Unsupported { .. })
        ));
    }

    /// Two sides of two players: the players move in turn (0, 1, 2, 3, 0, ...), each sees its side's
    /// board, only the mover has a mask, and a win pays every player of the winning side. The
    /// positions are those of a two-player game of the same columns.
    #[test]
    fn teams_take_turns_see_their_sides_board_and_win_together() {
        let mut env = TeamConnectFour::new(2).expect("two per side");
        assert_eq!(env.num_agents(), 4);
        assert_eq!(env.agent_name(3), "player_3");
        let mut buf = VecBuffers::new(4, OBS_DIM);
        env.reset(None, &mut buf.obs).expect("reset");
        // player_1's side wins vertically in column 6 on the 8th move (made by player_3).
        let moves: [usize; 8] = [0, 6, 1, 6, 0, 6, 1, 6];
        for (t, &column) in moves.iter().enumerate() {
            let mover = t % 4;
            for agent in 0..4 {
                assert_eq!(env.is_active(agent), agent == mover, "move {t}, agent {agent}");
                let mask = &buf.obs[agent * OBS_DIM..agent * OBS_DIM + COLUMNS];
                assert_eq!(mask.contains(&1.0), agent == mover, "move {t}");
            }
            let two = game(&moves[..t]);
            let mut expected = vec![0.0; OBS_DIM];
            for agent in 0..4 {
                two.observe(side_of(agent), &mut expected).expect("right size");
                assert_eq!(
                    buf.obs[agent * OBS_DIM + COLUMNS..(agent + 1) * OBS_DIM],
                    expected[COLUMNS..],
                    "move {t}, agent {agent}"
                );
            }
            let mut actions = [5; 4];
            actions[mover] = column as i64;
            env.step(ActionBatch::Discrete(&actions), buf.view())
                .expect("legal move");
        }
        assert_eq!(buf.rewards, [-1.0, 1.0, -1.0, 1.0]);
        assert_eq!(buf.terminated, [true; 4]);
        assert_eq!(*env.game(), ConnectFour::new(), "a new game within the step");
        assert!(env.is_active(0));
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        assert_eq!(env.builtin_action(1, 1, &mut rng), None, "not its turn");
        assert_eq!(
            env.builtin_action(1, 0, &mut rng).map(|c| c < COLUMNS),
            Some(true)
        );
        assert!(TeamConnectFour::new(0).is_err() && TeamConnectFour::new(MAX_PLAYERS_PER_SIDE + 1).is_err());
        assert!(matches!(
            env.step(ActionBatch::Discrete(&[1, 1]), buf.view()),
            Err(EnvError::BufferSize { .. })
        ));
    }

    /// The rules model against the env itself over random games of both kinds: every column of every position the
    /// mover sees, legal or not, then the env's own step with one of them.
    #[test]
    fn ply_model_moves_as_the_env_does() {
        for players_per_side in [1, 2] {
            let mut env = TeamConnectFour::new(players_per_side).expect("players");
            let model = env.ply_model().expect("connect four has its rules");
            let n = env.num_agents();
            let mut buf = VecBuffers::new(n, OBS_DIM);
            env.reset(None, &mut buf.obs).expect("reset");
            let mut rng = Pcg64Mcg::seed_from_u64(5);
            let (mut ends, mut wins) = (0, 0);
            let mut next = vec![0.0; OBS_DIM];
            for _ in 0..3000 {
                let mover = (0..n).find(|&a| env.is_active(a)).expect("someone moves");
                let obs = buf.obs[mover * OBS_DIM..(mover + 1) * OBS_DIM].to_vec();
                let game = *env.game();
                assert_eq!(
                    ConnectFour::from_observation(&obs).map(|g| g.to_move()),
                    Some(game.to_move())
                );
                for column in 0..COLUMNS {
                    let ply = model.ply(&obs, column, &mut next);
                    assert_eq!(ply.is_some(), game.is_legal(column), "column {column} of\n{game}");
                    if ply.is_some_and(|p| !p.ends) {
                        let mut after = game;
                        after.play(column).expect("legal");
                        let mut seen = vec![0.0; OBS_DIM];
                        after.observe(after.to_move(), &mut seen).expect("right size");
                        assert_eq!(next, seen, "column {column} of\n{game}");
                    }
                }
                let column = random_legal(&mut rng, &game).expect("a legal column");
                let ply = model.ply(&obs, column, &mut next).expect("legal");
                let mut actions = vec![0; n];
                actions[mover] = column as i64;
                env.step(ActionBatch::Discrete(&actions), buf.view())
                    .expect("legal move");
                assert_eq!(
                    (ply.reward, ply.ends),
                    (buf.rewards[mover], buf.terminated[mover])
                );
                let other = (mover + 1) % n;
                if !ply.ends {
                    assert_eq!(next, buf.obs[other * OBS_DIM..(other + 1) * OBS_DIM]);
                }
                ends += usize::from(ply.ends);
                wins += usize::from(ply.reward == 1.0);
            }
            assert!(
                ends > 50 && wins > 40,
                "{ends} games, {wins} won by their last move"
            );
        }
        let model = ConnectFourRules;
        let mut next = vec![0.0; OBS_DIM];
        let mut obs = vec![0.0; OBS_DIM];
        game(&[3, 3]).observe(Side::First, &mut obs).expect("right size");
        assert!(model.ply(&obs, 3, &mut next).is_some());
        let mut not_to_move = vec![0.0; OBS_DIM];
        game(&[3])
            .observe(Side::First, &mut not_to_move)
            .expect("right size");
        assert_eq!(
            model.ply(&not_to_move, 3, &mut next),
            None,
            "player_0 is not to move"
        );
        obs[COLUMNS] = 0.5;
        assert_eq!(model.ply(&obs, 3, &mut next), None, "not a board value");
        assert_eq!(model.ply(&obs[1..], 3, &mut next), None, "too short");
        game(&[3, 3]).observe(Side::First, &mut obs).expect("right size");
        let cell = |row: usize, column: usize, plane: usize| COLUMNS + (row * COLUMNS + column) * 2 + plane;
        (obs[cell(5, 0, 1)], obs[cell(2, 0, 0)]) = (1.0, 1.0);
        assert_eq!(model.ply(&obs, 3, &mut next), None, "a piece in the air");
        obs[cell(2, 0, 0)] = 0.0;
        obs[cell(4, 0, 0)] = 1.0;
        assert!(model.ply(&obs, 3, &mut next).is_some(), "the same pieces stacked");
    }
}
