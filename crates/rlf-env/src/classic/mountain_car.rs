//! MountainCar-v0, as Gymnasium's `MountainCarEnv`.

use super::{discrete_action, read_state, write_obs, ResetRng};
use crate::{Action, BoxSpace, Env, EnvError, Frame, Space, Step};

const ID: &str = "MountainCar-v0";
pub(super) const MIN_POSITION: f64 = -1.2;
pub(super) const MAX_POSITION: f64 = 0.6;
pub(super) const MAX_SPEED: f64 = 0.07;
const GOAL_POSITION: f64 = 0.5;
const FORCE: f64 = 0.001;
const GRAVITY: f64 = 0.0025;

/// The observation space both mountain cars share: `[position, velocity]`.
pub(super) fn observation_space() -> Space {
    Space::Box(BoxSpace {
        low: vec![MIN_POSITION as f32, -MAX_SPEED as f32],
        high: vec![MAX_POSITION as f32, MAX_SPEED as f32],
        shape: vec![2],
        bytes: false,
    })
}

/// A car in a valley; accelerate left (0), not at all (1) or right (2). Reward -1 per step;
/// terminates at `position >= 0.5` with non-negative velocity. State: `[position, velocity]`.
#[derive(Debug, Clone)]
pub struct MountainCar {
    state: [f64; 2],
    rng: ResetRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for MountainCar {
    fn default() -> Self {
        Self::new()
    }
}

impl MountainCar {
    /// A new env; call [`Env::reset`] before stepping.
    pub fn new() -> Self {
        Self {
            state: [0.0; 2],
            rng: ResetRng::new(),
            observation_space: observation_space(),
            action_space: Space::discrete(3),
        }
    }

    fn observation(&self) -> [f32; 2] {
        self.state.map(|v| v as f32)
    }
}

/// The hill with the car at `position` and the flag at `goal` (both MountainCar envs).
pub(super) fn draw(position: f64, goal: f64) -> Frame {
    super::draw::mountain_car(position, MIN_POSITION, MAX_POSITION, goal)
}

impl Env for MountainCar {
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        Ok(Some(draw(self.state[0], GOAL_POSITION)))
    }

    fn id(&self) -> &str {
        ID
    }

    fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    fn action_space(&self) -> &Space {
        &self.action_space
    }

    /// Position uniform in `[-0.6, -0.4)`, velocity 0.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.rng.reseed(seed);
        self.state = [self.rng.uniform(-0.6, -0.4), 0.0];
        write_obs(ID, "reset", obs, self.observation())
    }

    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let a = discrete_action(ID, &self.action_space, action, 3)?;
        let [mut position, mut velocity] = self.state;
        velocity += (a as f64 - 1.0) * FORCE + (3.0 * position).cos() * (-GRAVITY);
        velocity = velocity.clamp(-MAX_SPEED, MAX_SPEED);
        position += velocity;
        position = position.clamp(MIN_POSITION, MAX_POSITION);
        if position == MIN_POSITION && velocity < 0.0 {
            velocity = 0.0;
        }
        let terminated = position >= GOAL_POSITION && velocity >= 0.0;
        self.state = [position, velocity];
        write_obs(ID, "step", obs, self.observation())?;
        Ok(Step {
            reward: -1.0,
            terminated,
            ..Step::default()
        })
    }

    /// The state and the reset generator.
    fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        crate::state::put(ID, out, &(self.state, &self.rng))
    }
    fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        (self.state, self.rng) = crate::state::take(ID, input)?;
        Ok(())
    }
    /// `state` is `[position, velocity]`.
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.state = read_state(ID, state)?;
        write_obs(ID, "set_state", obs, self.observation())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_wall_stops_the_car() {
        let mut env = MountainCar::new();
        let mut obs = [0.0; 2];
        env.set_state(&[-1.19, -0.05], &mut obs).unwrap();
        let step = env.step(Action::Discrete(0), &mut obs).unwrap();
        assert_eq!(obs, [-1.2, 0.0]);
        assert_eq!(step.reward, -1.0);
        assert!(!step.terminated);
    }

    #[test]
    fn goal_terminates() {
        let mut env = MountainCar::new();
        let mut obs = [0.0; 2];
        env.set_state(&[0.49, 0.05], &mut obs).unwrap();
        assert!(env.step(Action::Discrete(2), &mut obs).unwrap().terminated);
    }
}
