//! Acrobot-v1 (Sutton & Barto's "book" dynamics), as Gymnasium's `AcrobotEnv`.

use std::f64::consts::PI;

use super::{discrete_action, read_state, write_obs, ResetRng};
use crate::{Action, BoxSpace, Env, EnvError, Frame, Space, Step};

const ID: &str = "Acrobot-v1";
const DT: f64 = 0.2;
const LINK_LENGTH_1: f64 = 1.0;
const LINK_MASS_1: f64 = 1.0;
const LINK_MASS_2: f64 = 1.0;
const LINK_COM_POS_1: f64 = 0.5;
const LINK_COM_POS_2: f64 = 0.5;
const LINK_MOI: f64 = 1.0;
const MAX_VEL_1: f64 = 4.0 * PI;
const MAX_VEL_2: f64 = 9.0 * PI;
const AVAIL_TORQUE: [f64; 3] = [-1.0, 0.0, 1.0];

/// Two links, torque (-1, 0, +1) on the joint between them; reward -1 per step until the tip
/// swings above the bar. State: `[theta1, theta2, dtheta1, dtheta2]`; observation:
/// `[cos θ1, sin θ1, cos θ2, sin θ2, dθ1, dθ2]`. Integrated with one RK4 step of 0.2 s.
#[derive(Debug, Clone)]
pub struct Acrobot {
    state: [f64; 4],
    rng: ResetRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for Acrobot {
    fn default() -> Self {
        Self::new()
    }
}

impl Acrobot {
    /// A new env; call [`Env::reset`] before stepping.
    pub fn new() -> Self {
        let high = [1.0, 1.0, 1.0, 1.0, MAX_VEL_1 as f32, MAX_VEL_2 as f32];
        let observation_space = Space::Box(BoxSpace {
            low: high.iter().map(|h| -h).collect(),
            high: high.to_vec(),
            shape: vec![6],
            bytes: false,
        });
        Self {
            state: [0.0; 4],
            rng: ResetRng::new(),
            observation_space,
            action_space: Space::discrete(3),
        }
    }

    fn observation(&self) -> [f32; 6] {
        let s = self.state;
        [s[0].cos(), s[0].sin(), s[1].cos(), s[1].sin(), s[2], s[3]].map(|v| v as f32)
    }

    fn terminal(&self) -> bool {
        let s = self.state;
        -s[0].cos() - (s[1] + s[0]).cos() > 1.0
    }
}

/// Gymnasium's `_dsdt` with `book_or_nips = "book"`, in the same operation order.
fn dsdt(s: &[f64; 5]) -> [f64; 5] {
    let (m1, m2, l1, lc1, lc2, i1, i2, g) = (
        LINK_MASS_1,
        LINK_MASS_2,
        LINK_LENGTH_1,
        LINK_COM_POS_1,
        LINK_COM_POS_2,
        LINK_MOI,
        LINK_MOI,
        9.8,
    );
    let [theta1, theta2, dtheta1, dtheta2, a] = *s;
    let d1 = m1 * (lc1 * lc1) + m2 * (l1 * l1 + lc2 * lc2 + 2.0 * l1 * lc2 * theta2.cos()) + i1 + i2;
    let d2 = m2 * (lc2 * lc2 + l1 * lc2 * theta2.cos()) + i2;
    let phi2 = m2 * lc2 * g * (theta1 + theta2 - PI / 2.0).cos();
    let phi1 = -m2 * l1 * lc2 * (dtheta2 * dtheta2) * theta2.sin()
        - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * theta2.sin()
        + (m1 * lc1 + m2 * l1) * g * (theta1 - PI / 2.0).cos()
        + phi2;
    let ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * theta2.sin() - phi2)
        / (m2 * (lc2 * lc2) + i2 - (d2 * d2) / d1);
    let ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    [dtheta1, dtheta2, ddtheta1, ddtheta2, 0.0]
}

/// One classical Runge-Kutta step over `[0, DT]`, as Gymnasium's `rk4` with `t = [0, dt]`.
fn rk4(y0: [f64; 5]) -> [f64; 5] {
    let dt2 = DT / 2.0;
    let shifted = |k: &[f64; 5], h: f64| -> [f64; 5] { std::array::from_fn(|j| y0[j] + h * k[j]) };
    let k1 = dsdt(&y0);
    let k2 = dsdt(&shifted(&k1, dt2));
    let k3 = dsdt(&shifted(&k2, dt2));
    let k4 = dsdt(&shifted(&k3, DT));
    std::array::from_fn(|j| y0[j] + DT / 6.0 * (k1[j] + 2.0 * k2[j] + 2.0 * k3[j] + k4[j]))
}

fn wrap(mut x: f64, m: f64, big_m: f64) -> f64 {
    let diff = big_m - m;
    while x > big_m {
        x -= diff;
    }
    while x < m {
        x += diff;
    }
    x
}

fn bound(x: f64, m: f64, big_m: f64) -> f64 {
    // Python's `min(max(x, m), M)`.
    let lower = if m > x { m } else { x };
    if big_m < lower {
        big_m
    } else {
        lower
    }
}

impl Env for Acrobot {
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        Ok(Some(super::draw::acrobot(&self.state, LINK_LENGTH_1, 1.0)))
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

    /// The state is drawn in `[-0.1, 0.1)` and, as in Gymnasium, rounded to `f32`.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.rng.reseed(seed);
        self.state = std::array::from_fn(|_| f64::from(self.rng.uniform(-0.1, 0.1) as f32));
        write_obs(ID, "reset", obs, self.observation())
    }

    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let a = discrete_action(ID, &self.action_space, action, 3)?;
        let s = self.state;
        let ns = rk4([s[0], s[1], s[2], s[3], AVAIL_TORQUE[a]]);
        self.state = [
            wrap(ns[0], -PI, PI),
            wrap(ns[1], -PI, PI),
            bound(ns[2], -MAX_VEL_1, MAX_VEL_1),
            bound(ns[3], -MAX_VEL_2, MAX_VEL_2),
        ];
        let terminated = self.terminal();
        write_obs(ID, "step", obs, self.observation())?;
        Ok(Step {
            reward: if terminated { 0.0 } else { -1.0 },
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
    /// `state` is `[theta1, theta2, dtheta1, dtheta2]`.
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.state = read_state(ID, state)?;
        write_obs(ID, "set_state", obs, self.observation())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_and_bound() {
        assert_eq!(wrap(3.0 * PI / 2.0, -PI, PI), 3.0 * PI / 2.0 - 2.0 * PI);
        assert_eq!(wrap(-7.0, -PI, PI), -7.0 + 2.0 * PI);
        assert_eq!(bound(20.0, -MAX_VEL_1, MAX_VEL_1), MAX_VEL_1);
        assert_eq!(bound(-20.0, -MAX_VEL_1, MAX_VEL_1), -MAX_VEL_1);
        assert_eq!(bound(1.0, -MAX_VEL_1, MAX_VEL_1), 1.0);
    }

    #[test]
    fn hanging_still_stays_still_and_pays_minus_one() {
        let mut env = Acrobot::new();
        let mut obs = [0.0; 6];
        env.reset(Some(0), &mut obs).unwrap();
        env.set_state(&[0.0; 4], &mut obs).unwrap();
        let step = env.step(Action::Discrete(1), &mut obs).unwrap();
        assert_eq!(step.reward, -1.0);
        assert!(!step.terminated);
        // cos(-π/2) is not exactly 0 in floating point, as in Gymnasium: the links barely move.
        let expected = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        assert!(
            obs.iter().zip(expected).all(|(o, e)| (o - e).abs() < 1e-12),
            "{obs:?}"
        );
    }

    #[test]
    fn upright_is_terminal() {
        let mut env = Acrobot::new();
        let mut obs = [0.0; 6];
        env.set_state(&[PI, 0.0, 0.0, 0.0], &mut obs).unwrap();
        let step = env.step(Action::Discrete(1), &mut obs).unwrap();
        assert!(step.terminated);
        assert_eq!(step.reward, 0.0);
    }
}
