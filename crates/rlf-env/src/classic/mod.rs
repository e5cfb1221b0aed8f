//! Native classic-control environments that reproduce Gymnasium 0.29.1 step for step.
//!
//! Dynamics, rewards and termination follow Gymnasium's Python code operation by operation, in
//! `f64` as its NumPy arithmetic does (continuous actions arrive as `f32`, as NumPy `float32` arrays
//! do); observations are cast to `f32`. They are checked against trajectories recorded from
//! Gymnasium (`tests/suite/recorded/classic_control.rs`). The registry wraps each in a
//! [`TimeLimit`](crate::wrappers::TimeLimit) with Gymnasium's registered episode length.
//!
//! Reset distributions have Gymnasium's ranges, drawn from a seeded PCG generator
//! ([`rand_pcg::Pcg64Mcg`]), not NumPy's stream: the same seed gives the same episodes here, but not
//! the same ones as in Gymnasium. An env never reset with a seed behaves as if seeded with 0.

mod acrobot;
mod cartpole;
mod draw;
mod mountain_car;
mod mountain_car_continuous;
mod pendulum;

pub use acrobot::Acrobot;
pub use cartpole::CartPole;
pub use mountain_car::MountainCar;
pub use mountain_car_continuous::MountainCarContinuous;
pub use pendulum::Pendulum;

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::{Action, EnvError, Space};

/// The reset generator every native env owns.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct ResetRng(Pcg64Mcg);

impl ResetRng {
    fn new() -> Self {
        Self(Pcg64Mcg::seed_from_u64(0))
    }

    fn reseed(&mut self, seed: Option<u64>) {
        if let Some(seed) = seed {
            self.0 = Pcg64Mcg::seed_from_u64(seed);
        }
    }

    /// Uniform in `[low, high)`, as NumPy's `uniform(low, high)`.
    fn uniform(&mut self, low: f64, high: f64) -> f64 {
        let u: f64 = self.0.random();
        low + (high - low) * u
    }
}

/// Copies `values` into `obs`, checking the buffer's length first.
fn write_obs<const N: usize>(
    id: &str,
    call: &str,
    obs: &mut [f32],
    values: [f32; N],
) -> Result<(), EnvError> {
    if obs.len() != N {
        return Err(EnvError::BufferSize {
            what: format!("{id}: {call} observation buffer"),
            expected: N,
            got: obs.len(),
        });
    }
    obs.copy_from_slice(&values);
    Ok(())
}

/// Reads a `set_state` argument of exactly `N` values.
fn read_state<const N: usize>(id: &str, state: &[f64]) -> Result<[f64; N], EnvError> {
    state.try_into().map_err(|_| EnvError::InvalidState {
        env: id.to_owned(),
        reason: format!("expected {N} values, got {}", state.len()),
    })
}

/// A discrete action in `0..n`, or an [`EnvError::InvalidAction`].
fn discrete_action(id: &str, space: &Space, action: Action<'_>, n: i64) -> Result<usize, EnvError> {
    match action {
        Action::Discrete(a) if (0..n).contains(&a) => Ok(a as usize),
        _ => Err(invalid_action(id, space, action)),
    }
}

/// The single component of a one-dimensional box action, or an [`EnvError::InvalidAction`]. Values
/// outside the bounds are accepted: the env clips them as Gymnasium does.
fn scalar_action(id: &str, space: &Space, action: Action<'_>) -> Result<f32, EnvError> {
    match action {
        Action::Continuous(&[a]) if !a.is_nan() => Ok(a),
        _ => Err(invalid_action(id, space, action)),
    }
}

fn invalid_action(id: &str, space: &Space, action: Action<'_>) -> EnvError {
    EnvError::InvalidAction {
        env: id.to_owned(),
        action: action.to_string(),
        space: space.to_string(),
    }
}
