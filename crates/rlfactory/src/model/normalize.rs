//! Running mean and variance (Chan et al.'s parallel update), kept in the model's variable store
//! so they are saved and published with the weights.

use tch::{nn, Kind, Tensor};

/// Running mean and variance of vectors of a fixed size.
#[derive(Debug)]
pub struct RunningMeanStd {
    mean: Tensor,
    var: Tensor,
    count: Tensor,
}

/// Added to the variance before taking square roots.
pub(super) const EPS: f64 = 1e-5;

impl RunningMeanStd {
    /// Statistics of vectors of `dim` values, as non-trainable variables under `path`
    /// (`mean`, `var`, `count`); they start at mean 0, variance 1.
    pub fn new(path: &nn::Path<'_>, dim: i64) -> Self {
        let mean = path.zeros_no_train("mean", &[dim]);
        let var = path.ones_no_train("var", &[dim]);
        let count = path.zeros_no_train("count", &[1]);
        Self { mean, var, count }
    }

    /// Folds the rows of `x` (`[n, dim]`) into the statistics.
    pub fn update(&mut self, x: &Tensor) {
        tch::no_grad(|| {
            let x = x.to_kind(Kind::Float);
            let n = x.size()[0] as f64;
            if n == 0.0 {
                return;
            }
            let batch_mean = x.mean_dim(0, false, Kind::Float);
            let batch_var = x.var_dim(0, false, false);
            let count = &self.count;
            let total = count + n;
            let delta = &batch_mean - &self.mean;
            let new_mean = &self.mean + &delta * (n / &total);
            let m2 = &self.var * count + batch_var * n + delta.square() * count * n / &total;
            let new_var = m2 / &total;
            self.mean.copy_(&new_mean);
            self.var.copy_(&new_var);
            self.count.copy_(&total);
        });
    }

    /// `(x - mean) / std`, clipped to ±`clip`.
    pub fn normalize(&self, x: &Tensor, clip: f64) -> Tensor {
        ((x - &self.mean) / (&self.var + EPS).sqrt()).clamp(-clip, clip)
    }

    /// `(x - mean) / std`, unclipped.
    pub fn scale(&self, x: &Tensor) -> Tensor {
        (x - &self.mean) / (&self.var + EPS).sqrt()
    }

    /// The inverse of [`scale`](Self::scale): `x * std + mean`.
    pub fn unscale(&self, x: &Tensor) -> Tensor {
        x * (&self.var + EPS).sqrt() + &self.mean
    }

    /// The running mean.
    pub fn mean(&self) -> &Tensor {
        &self.mean
    }

    /// The running (population) variance.
    pub fn var(&self) -> &Tensor {
        &self.var
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_statistics_of_all_rows() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let mut rms = RunningMeanStd::new(&vs.root(), 2);
        let a = Tensor::from_slice(&[1.0_f32, 10.0, 2.0, 20.0, 3.0, 30.0]).view([3, 2]);
        let b = Tensor::from_slice(&[4.0_f32, 40.0, 6.0, 60.0]).view([2, 2]);
        rms.update(&a);
        rms.update(&b);
        let all = Tensor::cat(&[&a, &b], 0);
        let mean = all.mean_dim(0, false, Kind::Float);
        let var = all.var_dim(0, false, false);
        assert!(rms.mean().allclose(&mean, 1e-5, 1e-5, false));
        assert!(rms.var().allclose(&var, 1e-4, 1e-4, false));
    }
}
