//! Environments: `rlf_env`'s API, and [`ActionMapper`], which turns a policy's raw actions into
//! what the env accepts.

pub use rlf_env::{ActionBatch, EnvRegistry, EpisodeStats, Space, VecBuffers, VecEnv};

use crate::config::ContinuousActionMode;
use crate::error::{Result, RlfError};

#[derive(Debug, Clone)]
enum Mapping {
    Discrete {
        start: i64,
    },
    MultiDiscrete,
    Continuous {
        low: Vec<f32>,
        high: Vec<f32>,
        mode: ContinuousActionMode,
    },
}

/// Maps raw actions (`f32`: category indices, or an unbounded Gaussian sample) to an env's action
/// space: discrete values shifted by the space's start; continuous ones clipped to the bounds or
/// squashed into them with tanh.
#[derive(Debug, Clone)]
pub struct ActionMapper {
    mapping: Mapping,
    ints: Vec<i64>,
    floats: Vec<f32>,
}

impl ActionMapper {
    /// The mapper for `space`.
    pub fn new(space: &Space, mode: ContinuousActionMode) -> Result<Self> {
        let mapping = match space {
            Space::Discrete { start, .. } => Mapping::Discrete { start: *start },
            Space::MultiDiscrete(_) => Mapping::MultiDiscrete,
            Space::Box(b) => Mapping::Continuous {
                low: b.low().to_vec(),
                high: b.high().to_vec(),
                mode,
            },
            Space::Dict(_) | Space::Tuple(_) => {
                return Err(RlfError::UnsupportedSpace(format!("action space {space}")));
            }
        };
        Ok(Self {
            mapping,
            ints: Vec::new(),
            floats: Vec::new(),
        })
    }

    /// The env actions for `raw` (`n * action_dim` values).
    pub fn map(&mut self, raw: &[f32]) -> ActionBatch<'_> {
        match &self.mapping {
            Mapping::Discrete { start } => {
                self.ints.clear();
                self.ints.extend(raw.iter().map(|&a| a as i64 + start));
                ActionBatch::Discrete(&self.ints)
            }
            Mapping::MultiDiscrete => {
                self.ints.clear();
                self.ints.extend(raw.iter().map(|&a| a as i64));
                ActionBatch::MultiDiscrete(&self.ints)
            }
            Mapping::Continuous { low, high, mode } => {
                self.floats.clear();
                let d = low.len().max(1);
                self.floats.extend(raw.iter().enumerate().map(|(i, &a)| {
                    let (lo, hi) = (low[i % d], high[i % d]);
                    match mode {
                        ContinuousActionMode::Clip => a.clamp(lo, hi),
                        ContinuousActionMode::Tanh if lo.is_finite() && hi.is_finite() => {
                            lo + (a.tanh() + 1.0) * 0.5 * (hi - lo)
                        }
                        ContinuousActionMode::Tanh => a.tanh(),
                    }
                }));
                ActionBatch::Continuous(&self.floats)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_kind() {
        let mut m =
            ActionMapper::new(&Space::Discrete { n: 3, start: -1 }, ContinuousActionMode::Clip).unwrap();
        assert_eq!(m.map(&[0.0, 2.0]), ActionBatch::Discrete(&[-1, 1]));
        let space = Space::box_1d(vec![-2.0], vec![2.0]).unwrap();
        let mut clip = ActionMapper::new(&space, ContinuousActionMode::Clip).unwrap();
        assert_eq!(clip.map(&[5.0, -0.5]), ActionBatch::Continuous(&[2.0, -0.5]));
        let mut squash = ActionMapper::new(&space, ContinuousActionMode::Tanh).unwrap();
        assert_eq!(squash.map(&[0.0]), ActionBatch::Continuous(&[0.0]));
        let ActionBatch::Continuous(x) = squash.map(&[100.0]) else {
            panic!("continuous")
        };
        assert!((x[0] - 2.0).abs() < 1e-6);
    }
}
