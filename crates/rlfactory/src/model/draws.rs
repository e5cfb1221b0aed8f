//! The random draws of acting and learning ([`Draws`]): sampled actions, Gaussian noise, minibatch orders.
//!
//! They come from a generator of our own rather than libtorch's global one, whose state cannot be read: a serial
//! run's stop keeps it ([`Policy::sampler_state`](super::Policy::sampler_state)) and its resume continues the same
//! stream, so that it ends exactly where the run never stopped would. Each holder seeds its own from libtorch's
//! generator as it is built (after the run's seed was set), so the same seed gives the same draws.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::{Result, RlfError};

/// A generator of uniform and normal tensors and permutations.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Draws(Pcg64Mcg);

impl Draws {
    /// A generator seeded by `seed`.
    pub fn new(seed: u64) -> Self {
        Self(Pcg64Mcg::seed_from_u64(seed))
    }

    /// A generator seeded from libtorch's generator of this process (seeded by the run's seed).
    pub fn from_torch() -> Self {
        let seed = Tensor::randint(i64::MAX, [1], (Kind::Int64, tch::Device::Cpu)).int64_value(&[0]);
        Self::new(seed as u64)
    }

    /// The underlying generator, for draws of other kinds.
    pub fn rng(&mut self) -> &mut Pcg64Mcg {
        &mut self.0
    }

    /// Values uniform in `[0, 1)` of `like`'s shape, on its device.
    pub fn uniform_like(&mut self, like: &Tensor) -> Tensor {
        let values = self.uniforms(like.numel());
        Tensor::from_slice(&values)
            .view(like.size().as_slice())
            .to_device(like.device())
    }

    /// Standard normal values of `like`'s shape, on its device (Box–Muller).
    pub fn normal_like(&mut self, like: &Tensor) -> Tensor {
        let values = self.normals(like.numel());
        Tensor::from_slice(&values)
            .view(like.size().as_slice())
            .to_device(like.device())
    }

    /// `n` values uniform in `[0, 1)`: the draws of [`uniform_like`](Self::uniform_like), row-major.
    pub fn uniforms(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.0.random::<f32>()).collect()
    }

    /// `n` standard normal values (Box–Muller, a pair per two uniform draws, the last pair's second value unused for
    /// an odd `n`): the draws of [`normal_like`](Self::normal_like), row-major.
    pub fn normals(&mut self, n: usize) -> Vec<f32> {
        let mut values = Vec::with_capacity(n + 1);
        while values.len() < n {
            let u1 = 1.0 - self.0.random::<f64>();
            let u2 = self.0.random::<f64>();
            let r = (-2.0 * u1.ln()).sqrt();
            let theta = std::f64::consts::TAU * u2;
            values.extend([(r * theta.cos()) as f32, (r * theta.sin()) as f32]);
        }
        values.truncate(n);
        values
    }

    /// `0..n` in a random order.
    pub fn permutation(&mut self, n: usize) -> Vec<i64> {
        let mut order: Vec<i64> = (0..n as i64).collect();
        for i in (1..n).rev() {
            order.swap(i, self.0.random_range(0..=i));
        }
        order
    }

    /// The generator's state, as bytes.
    pub fn state(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_default()
    }

    /// Continues from a [`state`](Self::state).
    pub fn load(&mut self, state: &[u8]) -> Result<()> {
        *self = postcard::from_bytes(state)
            .map_err(|e| RlfError::Config(format!("a kept generator does not decode: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_have_their_distributions_and_continue_from_a_kept_state() {
        let mut d = Draws::new(7);
        let like = Tensor::zeros([4000, 5], (Kind::Float, tch::Device::Cpu));
        let u = d.uniform_like(&like);
        assert_eq!(u.size(), vec![4000, 5]);
        let (min, max) = (u.min().double_value(&[]), u.max().double_value(&[]));
        assert!(
            (0.0..0.01).contains(&min) && (0.99..1.0).contains(&max),
            "{min} {max}"
        );
        let z = d.normal_like(&like);
        let (mean, std) = (
            z.mean(Kind::Float).double_value(&[]),
            z.std(true).double_value(&[]),
        );
        assert!(mean.abs() < 0.03 && (std - 1.0).abs() < 0.03, "{mean} {std}");
        let mut p = d.permutation(100);
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
        let kept = d.state();
        let mut again = Draws::new(99);
        again.load(&kept).unwrap();
        assert_eq!(again.permutation(50), d.permutation(50));
        assert!(again.load(&[]).is_err());
    }
}
