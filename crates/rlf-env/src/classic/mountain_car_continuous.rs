//! MountainCarContinuous-v0, as Gymnasium's `Continuous_MountainCarEnv`.

use super::mountain_car::{observation_space, MAX_POSITION, MAX_SPEED, MIN_POSITION};
use super::{read_state, scalar_action, write_obs, ResetRng};
use crate::{Action, BoxSpace, Env, EnvError, Frame, Space, Step};

const ID: &str = "MountainCarContinuous-v0";
const MIN_ACTION: f64 = -1.0;
const MAX_ACTION: f64 = 1.0;
const GOAL_POSITION: f64 = 0.45;
const POWER: f64 = 0.0015;

/// A car in a valley pushed by a force in `[-1, 1]` (larger actions are clipped). Reward
/// `-0.1 * a²` per step on the unclipped action, plus 100 at the goal (`position >= 0.45` with
/// non-negative velocity). State: `[position, velocity]`, kept in `f32` after each step as
/// Gymnasium does.
#[derive(Debug, Clone)]
pub struct MountainCarContinuous {
    state: [f64; 2],
    rng: ResetRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for MountainCarContinuous {
    fn default() -> Self {
        Self::new()
    }
}

impl MountainCarContinuous {
    /// A new env; call [`Env::reset`] before stepping.
    pub fn new() -> Self {
        Self {
            state: [0.0; 2],
            rng: ResetRng::new(),
            observation_space: observation_space(),
            action_space: Space::Box(BoxSpace {
                low: vec![MIN_ACTION as f32],
                high: vec![MAX_ACTION as f32],
                shape: vec![1],
                bytes: false,
            }),
        }
    }

    fn observation(&self) -> [f32; 2] {
        self.state.map(|v| v as f32)
    }
}

impl Env for MountainCarContinuous {
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        Ok(Some(super::mountain_car::draw(self.state[0], GOAL_POSITION)))
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
        let a = f64::from(scalar_action(ID, &self.action_space, action)?);
        let [mut position, mut velocity] = self.state;
        let force = a.clamp(MIN_ACTION, MAX_ACTION);
        velocity += force * POWER - 0.0025 * (3.0 * position).cos();
        velocity = velocity.clamp(-MAX_SPEED, MAX_SPEED);
        position += velocity;
        position = position.clamp(MIN_POSITION, MAX_POSITION);
        if position == MIN_POSITION && velocity < 0.0 {
            velocity = 0.0;
        }
        let terminated = position >= GOAL_POSITION && velocity >= 0.0;
        let reward = if terminated { 100.0 } else { 0.0 } - a * a * 0.1;
        // Gymnasium stores the new state as a float32 array.
        self.state = [f64::from(position as f32), f64::from(velocity as f32)];
        write_obs(ID, "step", obs, self.observation())?;
        Ok(Step {
            reward,
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
    fn action_is_clipped_but_cost_uses_the_raw_action() {
        let (mut a, mut b) = (MountainCarContinuous::new(), MountainCarContinuous::new());
        let (mut oa, mut ob) = ([0.0; 2], [0.0; 2]);
        a.set_state(&[-0.5, 0.0], &mut oa).unwrap();
        b.set_state(&[-0.5, 0.0], &mut ob).unwrap();
        let sa = a.step(Action::Continuous(&[3.0]), &mut oa).unwrap();
        let sb = b.step(Action::Continuous(&[1.0]), &mut ob).unwrap();
        assert_eq!(oa, ob);
        assert!((sa.reward - -0.9).abs() < 1e-12);
        assert!((sb.reward - -0.1).abs() < 1e-12);
    }

    #[test]
    fn goal_pays_100() {
        let mut env = MountainCarContinuous::new();
        let mut obs = [0.0; 2];
        env.set_state(&[0.44, 0.05], &mut obs).unwrap();
        let step = env.step(Action::Continuous(&[0.0]), &mut obs).unwrap();
        assert!(step.terminated);
        assert_eq!(step.reward, 100.0);
    }

    #[test]
    fn malformed_actions_are_errors() {
        let mut env = MountainCarContinuous::new();
        let mut obs = [0.0; 2];
        for bad in [
            Action::Continuous(&[f32::NAN]),
            Action::Continuous(&[0.0, 0.0]),
            Action::Discrete(0),
        ] {
            assert!(matches!(
                env.step(bad, &mut obs),
                Err(EnvError::InvalidAction { .. })
            ));
        }
    }
}
