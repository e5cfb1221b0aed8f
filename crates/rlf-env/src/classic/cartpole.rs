//! CartPole-v1 (Barto, Sutton & Anderson), as Gymnasium's `CartPoleEnv`.

use super::{discrete_action, read_state, write_obs, ResetRng};
use crate::{Action, BoxSpace, Env, EnvError, Frame, Space, Step};

const ID: &str = "CartPole-v1";
const GRAVITY: f64 = 9.8;
const MASSCART: f64 = 1.0;
const MASSPOLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASSPOLE + MASSCART;
const LENGTH: f64 = 0.5;
const POLEMASS_LENGTH: f64 = MASSPOLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02;
const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const X_THRESHOLD: f64 = 2.4;

/// A pole on a cart; push left (0) or right (1). Reward 1 per step, including the terminating one;
/// terminates when `|x| > 2.4` or `|theta| > 12°`. State: `[x, x_dot, theta, theta_dot]`.
#[derive(Debug, Clone)]
pub struct CartPole {
    state: [f64; 4],
    /// Gymnasium's `steps_beyond_terminated`: `None` until the first terminal step.
    steps_beyond_terminated: Option<u64>,
    rng: ResetRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for CartPole {
    fn default() -> Self {
        Self::new()
    }
}

impl CartPole {
    /// A new env; call [`Env::reset`] before stepping.
    pub fn new() -> Self {
        let high = [
            X_THRESHOLD as f32 * 2.0,
            f32::MAX,
            (THETA_THRESHOLD * 2.0) as f32,
            f32::MAX,
        ];
        let observation_space = Space::Box(BoxSpace {
            low: high.iter().map(|h| -h).collect(),
            high: high.to_vec(),
            shape: vec![4],
            bytes: false,
        });
        Self {
            state: [0.0; 4],
            steps_beyond_terminated: None,
            rng: ResetRng::new(),
            observation_space,
            action_space: Space::discrete(2),
        }
    }

    fn observation(&self) -> [f32; 4] {
        self.state.map(|v| v as f32)
    }
}

impl Env for CartPole {
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        Ok(Some(super::draw::cartpole(&self.state, X_THRESHOLD, LENGTH)))
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

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.rng.reseed(seed);
        self.state = std::array::from_fn(|_| self.rng.uniform(-0.05, 0.05));
        self.steps_beyond_terminated = None;
        write_obs(ID, "reset", obs, self.observation())
    }

    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let action = discrete_action(ID, &self.action_space, action, 2)?;
        let [mut x, mut x_dot, mut theta, mut theta_dot] = self.state;
        let force = if action == 1 { FORCE_MAG } else { -FORCE_MAG };
        let costheta = theta.cos();
        let sintheta = theta.sin();
        let temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS;
        let thetaacc = (GRAVITY * sintheta - costheta * temp)
            / (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS));
        let xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
        x += TAU * x_dot;
        x_dot += TAU * xacc;
        theta += TAU * theta_dot;
        theta_dot += TAU * thetaacc;
        self.state = [x, x_dot, theta, theta_dot];

        // Gymnasium's four comparisons, kept as written (a NaN state does not terminate there either).
        #[allow(clippy::manual_range_contains)]
        let terminated =
            x < -X_THRESHOLD || x > X_THRESHOLD || theta < -THETA_THRESHOLD || theta > THETA_THRESHOLD;
        let reward = if !terminated {
            1.0
        } else if let Some(beyond) = self.steps_beyond_terminated.as_mut() {
            // Stepping past termination is undefined in Gymnasium; it pays 0 from then on.
            *beyond += 1;
            0.0
        } else {
            self.steps_beyond_terminated = Some(0);
            1.0
        };
        write_obs(ID, "step", obs, self.observation())?;
        Ok(Step {
            reward,
            terminated,
            truncated: false,
            ..Step::default()
        })
    }

    /// The state, Gymnasium's `steps_beyond_terminated` and the reset generator.
    fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        crate::state::put(ID, out, &(self.state, self.steps_beyond_terminated, &self.rng))
    }
    fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        (self.state, self.steps_beyond_terminated, self.rng) = crate::state::take(ID, input)?;
        Ok(())
    }
    /// `state` is `[x, x_dot, theta, theta_dot]`.
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.state = read_state(ID, state)?;
        write_obs(ID, "set_state", obs, self.observation())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_after_termination_is_zero() {
        let mut env = CartPole::new();
        let mut obs = [0.0; 4];
        env.reset(Some(1), &mut obs).unwrap();
        env.set_state(&[2.39, 1.0, 0.0, 0.0], &mut obs).unwrap();
        let first = env.step(Action::Discrete(1), &mut obs).unwrap();
        assert!(first.terminated);
        assert_eq!(first.reward, 1.0);
        let second = env.step(Action::Discrete(1), &mut obs).unwrap();
        assert!(second.terminated);
        assert_eq!(second.reward, 0.0);
    }

    #[test]
    fn reset_is_seeded_and_in_range() {
        let (mut a, mut b) = (CartPole::new(), CartPole::new());
        let (mut oa, mut ob) = ([0.0; 4], [0.0; 4]);
        a.reset(Some(42), &mut oa).unwrap();
        b.reset(Some(42), &mut ob).unwrap();
        assert_eq!(oa, ob);
        assert!(oa.iter().all(|v| (-0.05..0.05).contains(v)));
        b.reset(Some(43), &mut ob).unwrap();
        assert_ne!(oa, ob);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let mut env = CartPole::new();
        let mut obs = [0.0; 4];
        env.reset(None, &mut obs).unwrap();
        let err = env.step(Action::Discrete(2), &mut obs).unwrap_err();
        assert_eq!(
            err.to_string(),
            "CartPole-v1: action Discrete(2) is not in the action space Discrete(2)"
        );
        assert!(matches!(
            env.step(Action::Continuous(&[1.0]), &mut obs),
            Err(EnvError::InvalidAction { .. })
        ));
        assert!(matches!(
            env.step(Action::Discrete(0), &mut [0.0; 3]),
            Err(EnvError::BufferSize { .. })
        ));
        assert!(matches!(
            env.set_state(&[0.0; 3], &mut obs),
            Err(EnvError::InvalidState { .. })
        ));
    }
}
