//! The [`Env`] trait and what a step returns.

use crate::{Action, EnvError, Space};

/// Statistics of one finished episode.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct EpisodeStats {
    /// Sum of the rewards (undiscounted).
    pub episode_return: f64,
    /// Number of steps.
    pub length: u64,
    /// What the episode achieved by the env's own measure, when the env reports one
    /// ([`Info::true_objective`], Sample Factory's `info["true_objective"]`): population-based
    /// training and `--save_best_metric true_objective` rank by it instead of the return.
    pub true_objective: Option<f64>,
}

/// The light per-step info: set by [`EpisodeStatistics`](crate::wrappers::EpisodeStatistics) and by
/// [`VecEnv`](crate::VecEnv) on the step that ends an episode.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Info {
    /// The finished episode's statistics, on its last step.
    pub episode: Option<EpisodeStats>,
    /// Set by an env on the step that ends an episode: the episode's true objective (see
    /// [`EpisodeStats::true_objective`]).
    pub true_objective: Option<f64>,
    /// The lives left, for games that have them (ALE's `info["lives"]`).
    pub lives: Option<u32>,
    /// The step lost a life without ending the game ([`EpisodicLife`](crate::wrappers::EpisodicLife)): vector
    /// envs record it as terminal for learning, while the episode, its statistics included, goes on.
    pub life_lost: bool,
}

/// What [`Env::step`] returns besides the observation it writes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Step {
    /// The reward of this step.
    pub reward: f64,
    /// The episode reached a terminal state of the MDP (no bootstrapping).
    pub terminated: bool,
    /// The episode was cut short (time limit, ...); the last observation may be bootstrapped.
    pub truncated: bool,
    /// Light extra information.
    pub info: Info,
}

impl Step {
    /// Whether the episode is over (terminated or truncated).
    pub fn done(&self) -> bool {
        self.terminated || self.truncated
    }
}

/// A single-agent environment with Gymnasium semantics.
///
/// Observations are written into a caller-provided buffer of exactly
/// `observation_space().flat_dim()` values (see [the flat encoding](crate::space)), so stepping
/// allocates nothing. After `terminated` or `truncated`, call [`reset`](Env::reset) before stepping
/// again (a [`VecEnv`](crate::VecEnv) does it for you).
pub trait Env: Send {
    /// A short name for messages, usually the registry id.
    fn id(&self) -> &str;

    /// The space observations belong to.
    fn observation_space(&self) -> &Space;

    /// The space actions must belong to.
    fn action_space(&self) -> &Space;

    /// Starts a new episode and writes its first observation into `obs`. `Some(seed)` reseeds the
    /// env's random generator; `None` continues its stream.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError>;

    /// Applies `action`, writes the next observation into `obs`, and returns reward and flags.
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError>;

    /// Sets the internal (simulator) state, e.g. to replay a recorded trajectory, and writes the
    /// matching observation into `obs`. Envs that cannot do this return
    /// [`EnvError::Unsupported`], the default.
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        let _ = (state, obs);
        Err(EnvError::Unsupported {
            env: self.id().to_owned(),
            what: "set_state".to_owned(),
        })
    }

    /// Appends the env's whole state to `out` (simulator, episode counters, random generator; see
    /// [`crate::state`]), so that an env of the same kind that [`load_state`](Env::load_state)s it continues
    /// exactly: the same observations and rewards for the same actions. Envs that cannot do this (a Python env, an
    /// emulator) return [`EnvError::Unsupported`], the default.
    fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        let _ = out;
        Err(crate::state::unsupported(self.id(), "save_state"))
    }

    /// Takes a state [`save_state`](Env::save_state) wrote from the front of `input` and moves past it.
    fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        let _ = input;
        Err(crate::state::unsupported(self.id(), "load_state"))
    }

    /// The env as a picture of its current state (what a video of an episode shows: the native classic-control envs
    /// draw themselves as Gymnasium does, a Gymnasium env gives its `rgb_array` render, Atari its screen), or `None`
    /// for an env that draws nothing, the default. Wrappers pass it through.
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        Ok(None)
    }
}

/// A picture of an env: `height` rows of `width` pixels, 3 bytes (red, green, blue) each, top row first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// `height * width * 3` bytes.
    pub rgb: Vec<u8>,
}

impl<E: Env + ?Sized> Env for Box<E> {
    fn id(&self) -> &str {
        (**self).id()
    }
    fn observation_space(&self) -> &Space {
        (**self).observation_space()
    }
    fn action_space(&self) -> &Space {
        (**self).action_space()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        (**self).reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        (**self).step(action, obs)
    }
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        (**self).set_state(state, obs)
    }
    fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        (**self).save_state(out)
    }
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        (**self).render()
    }
    fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        (**self).load_state(input)
    }
}

/// Checks an action against a space the way [`CheckedEnv`](crate::wrappers::CheckedEnv) and
/// [`VecEnv`](crate::VecEnv) do: discrete and multi-discrete values must be in range; a box action
/// must have the right length and no NaN. Box values outside the bounds are let through, because
/// Gymnasium's own continuous envs clip them (wrap the env in
/// [`ClipAction`](crate::wrappers::ClipAction) if yours does not).
pub fn check_action(env: &str, space: &Space, action: Action<'_>) -> Result<(), EnvError> {
    let ok = match (space, action) {
        (Space::Box(b), Action::Continuous(x)) => x.len() == b.size() && !x.iter().any(|v| v.is_nan()),
        _ => space.contains_action(action),
    };
    if ok {
        Ok(())
    } else {
        Err(EnvError::InvalidAction {
            env: env.to_owned(),
            action: action.to_string(),
            space: space.to_string(),
        })
    }
}

/// Checks an observation an env wrote: no NaN.
pub fn check_observation(env: &str, call: &'static str, obs: &[f32]) -> Result<(), EnvError> {
    match obs.iter().position(|v| v.is_nan()) {
        None => Ok(()),
        Some(index) => Err(EnvError::ObservationNan {
            env: env.to_owned(),
            call,
            index,
        }),
    }
}

/// Checks that a caller's observation buffer has the flat size of the space.
pub fn check_obs_buffer(env: &str, call: &str, space: &Space, obs: &[f32]) -> Result<(), EnvError> {
    let expected = space.flat_dim();
    if obs.len() == expected {
        Ok(())
    } else {
        Err(EnvError::BufferSize {
            what: format!("{env}: {call} observation buffer"),
            expected,
            got: obs.len(),
        })
    }
}
