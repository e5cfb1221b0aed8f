//! Pendulum-v1, as Gymnasium's `PendulumEnv` (g = 10).

use std::f64::consts::PI;

use super::{read_state, scalar_action, write_obs, ResetRng};
use crate::{Action, BoxSpace, Env, EnvError, Frame, Space, Step};

const ID: &str = "Pendulum-v1";
const MAX_SPEED: f64 = 8.0;
const MAX_TORQUE: f64 = 2.0;
const DT: f64 = 0.05;
const G: f64 = 10.0;
const M: f64 = 1.0;
const L: f64 = 1.0;

/// A pendulum to swing up and hold upright with a torque in `[-2, 2]` (larger torques are
/// clipped). Reward `-(θ² + 0.1 θ̇² + 0.001 u²)` with θ normalised to `[-π, π)`; never terminates.
/// State: `[theta, theta_dot]`; observation `[cos θ, sin θ, θ̇]`.
#[derive(Debug, Clone)]
pub struct Pendulum {
    state: [f64; 2],
    rng: ResetRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for Pendulum {
    fn default() -> Self {
        Self::new()
    }
}

impl Pendulum {
    /// A new env; call [`Env::reset`] before stepping.
    pub fn new() -> Self {
        let high = [1.0, 1.0, MAX_SPEED as f32];
        Self {
            state: [0.0; 2],
            rng: ResetRng::new(),
            observation_space: Space::Box(BoxSpace {
                low: high.iter().map(|h| -h).collect(),
                high: high.to_vec(),
                shape: vec![3],
                bytes: false,
            }),
            action_space: Space::Box(BoxSpace {
                low: vec![-MAX_TORQUE as f32],
                high: vec![MAX_TORQUE as f32],
                shape: vec![1],
                bytes: false,
            }),
        }
    }

    fn observation(&self) -> [f32; 3] {
        let [theta, theta_dot] = self.state;
        [theta.cos(), theta.sin(), theta_dot].map(|v| v as f32)
    }
}

/// `((x + π) mod 2π) - π` with NumPy's floored modulo (the result takes the divisor's sign).
fn angle_normalize(x: f64) -> f64 {
    let b = 2.0 * PI;
    let a = x + PI;
    let mut m = a % b;
    if m != 0.0 {
        if (b < 0.0) != (m < 0.0) {
            m += b;
        }
    } else {
        m = 0.0_f64.copysign(b);
    }
    m - PI
}

impl Env for Pendulum {
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        Ok(Some(super::draw::pendulum(&self.state)))
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

    /// θ uniform in `[-π, π)`, θ̇ uniform in `[-1, 1)`.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.rng.reseed(seed);
        self.state = [self.rng.uniform(-PI, PI), self.rng.uniform(-1.0, 1.0)];
        write_obs(ID, "reset", obs, self.observation())
    }

    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let u = scalar_action(ID, &self.action_space, action)?;
        let u = f64::from(u.clamp(-MAX_TORQUE as f32, MAX_TORQUE as f32));
        let [th, thdot] = self.state;
        let an = angle_normalize(th);
        let costs = an * an + 0.1 * (thdot * thdot) + 0.001 * (u * u);
        let newthdot = thdot + (3.0 * G / (2.0 * L) * th.sin() + 3.0 / (M * (L * L)) * u) * DT;
        let newthdot = newthdot.clamp(-MAX_SPEED, MAX_SPEED);
        let newth = th + newthdot * DT;
        self.state = [newth, newthdot];
        write_obs(ID, "step", obs, self.observation())?;
        Ok(Step {
            reward: -costs,
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
    /// `state` is `[theta, theta_dot]`.
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.state = read_state(ID, state)?;
        write_obs(ID, "set_state", obs, self.observation())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn angle_normalize_is_floored() {
        assert!((angle_normalize(3.0 * PI / 2.0) - -PI / 2.0).abs() < 1e-12);
        assert!((angle_normalize(-3.0 * PI / 2.0) - PI / 2.0).abs() < 1e-12);
        assert_eq!(angle_normalize(0.0), 0.0);
        assert_eq!(angle_normalize(-PI), -PI);
    }

    #[test]
    fn torque_is_clipped() {
        let (mut a, mut b) = (Pendulum::new(), Pendulum::new());
        let (mut oa, mut ob) = ([0.0; 3], [0.0; 3]);
        a.set_state(&[1.0, 0.5], &mut oa).unwrap();
        b.set_state(&[1.0, 0.5], &mut ob).unwrap();
        let sa = a.step(Action::Continuous(&[-7.0]), &mut oa).unwrap();
        let sb = b.step(Action::Continuous(&[-2.0]), &mut ob).unwrap();
        assert_eq!(oa, ob);
        assert_eq!(sa.reward, sb.reward);
        assert!(!sa.terminated && !sa.truncated);
    }
}
