//! Action distributions over the raw outputs of an action head.

use tch::{Kind, Tensor};

use super::Draws;

/// log(2π) / 2.
pub(super) const HALF_LOG_TWO_PI: f64 = 0.918_938_533_204_672_7;

/// A batch of action distributions, one per row.
#[derive(Debug)]
pub enum Distribution {
    /// One categorical per row: `log_probs` is `[n, k]`, log-softmax of the logits.
    Categorical {
        /// Normalised log-probabilities.
        log_probs: Tensor,
    },
    /// Independent categoricals per row, one per action component.
    MultiCategorical {
        /// Normalised log-probabilities of each component, `[n, k_i]`.
        parts: Vec<Tensor>,
    },
    /// Diagonal Gaussian: `mean` and `log_std` are `[n, d]`.
    Gaussian {
        /// Means.
        mean: Tensor,
        /// Log standard deviations.
        log_std: Tensor,
    },
}

impl Distribution {
    /// A categorical from unnormalised logits `[n, k]`.
    pub fn categorical(logits: &Tensor) -> Self {
        Distribution::Categorical {
            log_probs: logits.log_softmax(-1, Kind::Float),
        }
    }

    /// Independent categoricals from logits `[n, Σ k_i]` split into `sizes`.
    pub fn multi_categorical(logits: &Tensor, sizes: &[i64]) -> Self {
        Distribution::MultiCategorical {
            parts: logits
                .split_with_sizes(sizes, -1)
                .iter()
                .map(|l| l.log_softmax(-1, Kind::Float))
                .collect(),
        }
    }

    /// Log-probability of raw `actions` (`[n, action_dim]`, float), `[n]`.
    pub fn log_prob(&self, actions: &Tensor) -> Tensor {
        match self {
            Distribution::Categorical { log_probs } => log_probs
                .gather(-1, &actions.to_kind(Kind::Int64), false)
                .squeeze_dim(-1),
            Distribution::MultiCategorical { parts } => {
                let idx = actions.to_kind(Kind::Int64);
                let per_part: Vec<Tensor> = parts
                    .iter()
                    .enumerate()
                    .map(|(i, lp)| lp.gather(-1, &idx.narrow(-1, i as i64, 1), false))
                    .collect();
                Tensor::cat(&per_part, -1).sum_dim_intlist(-1, false, Kind::Float)
            }
            Distribution::Gaussian { mean, log_std } => {
                let z = (actions - mean) / log_std.exp();
                (z.square() * -0.5 - log_std - HALF_LOG_TWO_PI).sum_dim_intlist(-1, false, Kind::Float)
            }
        }
    }

    /// The same distribution at temperature `t`: each categorical's log-probabilities divided by `t` and normalised
    /// again (`t` > 1 flattens it towards uniform over the classes it allows, masked ones staying impossible), each
    /// Gaussian's standard deviation times `t`.
    pub fn tempered(self, t: f64) -> Self {
        let temper = |lp: &Tensor| (lp / t).log_softmax(-1, Kind::Float);
        match self {
            Distribution::Categorical { log_probs } => Distribution::Categorical {
                log_probs: temper(&log_probs),
            },
            Distribution::MultiCategorical { parts } => Distribution::MultiCategorical {
                parts: parts.iter().map(temper).collect(),
            },
            Distribution::Gaussian { mean, log_std } => Distribution::Gaussian {
                mean,
                log_std: log_std + t.ln(),
            },
        }
    }

    /// The cross-entropy `−Σ_a target(a) log π(a)` per row (`[n]`) against target distributions `[n, k]` of a
    /// categorical; `None` for the other kinds. A masked action's probability is 0 but its log-probability finite
    /// (see `MASKED_LOGIT`), so a target of 0 there adds nothing.
    pub fn cross_entropy(&self, target: &Tensor) -> Option<Tensor> {
        match self {
            Distribution::Categorical { log_probs } => {
                Some(-(target * log_probs).sum_dim_intlist(-1, false, Kind::Float))
            }
            Distribution::MultiCategorical { .. } | Distribution::Gaussian { .. } => None,
        }
    }

    /// Entropy per row, `[n]`.
    pub fn entropy(&self) -> Tensor {
        let categorical = |lp: &Tensor| -(lp.exp() * lp).sum_dim_intlist(-1, false, Kind::Float);
        match self {
            Distribution::Categorical { log_probs } => categorical(log_probs),
            Distribution::MultiCategorical { parts } => {
                let per_part: Vec<Tensor> = parts.iter().map(|lp| categorical(lp).unsqueeze(-1)).collect();
                Tensor::cat(&per_part, -1).sum_dim_intlist(-1, false, Kind::Float)
            }
            Distribution::Gaussian { log_std, .. } => {
                (log_std + 0.5 + HALF_LOG_TWO_PI).sum_dim_intlist(-1, false, Kind::Float)
            }
        }
    }

    /// Raw actions `[n, action_dim]` (float): sampled with `draws`, or the mode when `deterministic`. A categorical
    /// draw is the first class whose cumulative probability exceeds a uniform value.
    pub fn sample(&self, deterministic: bool, draws: &mut Draws) -> Tensor {
        let mut pick = |lp: &Tensor| {
            if deterministic {
                lp.argmax(-1, true)
            } else {
                let k = lp.size().last().copied().unwrap_or(1);
                let cdf = lp.exp().cumsum(-1, Kind::Float);
                let u = draws.uniform_like(&cdf.narrow(-1, 0, 1));
                cdf.lt_tensor(&u)
                    .sum_dim_intlist(-1, true, Kind::Int64)
                    .clamp_max(k - 1)
            }
        };
        match self {
            Distribution::Categorical { log_probs } => pick(log_probs).to_kind(Kind::Float),
            Distribution::MultiCategorical { parts } => {
                let picks: Vec<Tensor> = parts.iter().map(pick).collect();
                Tensor::cat(&picks, -1).to_kind(Kind::Float)
            }
            Distribution::Gaussian { mean, log_std } => {
                if deterministic {
                    mean.shallow_clone()
                } else {
                    mean + log_std.exp() * draws.normal_like(mean)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1)).unwrap()
    }

    #[test]
    fn a_tempered_distribution_flattens_within_the_allowed_classes() {
        // Probabilities ¼, ¾ and a masked class: at t = 2 they go as their square roots.
        let logits = Tensor::from_slice(&[0.0_f32, (3.0_f32).ln(), -1e9]).view([1, 3]);
        let probs = |d: &Distribution| match d {
            Distribution::Categorical { log_probs } => values(&log_probs.exp()),
            _ => unreachable!("a categorical"),
        };
        let warm = Distribution::categorical(&logits).tempered(2.0);
        let (a, b) = (
            1.0 / (1.0 + 3.0_f32.sqrt()),
            3.0_f32.sqrt() / (1.0 + 3.0_f32.sqrt()),
        );
        let p = probs(&warm);
        assert!(
            (p[0] - a).abs() < 1e-6 && (p[1] - b).abs() < 1e-6 && p[2] == 0.0,
            "{p:?}"
        );
        assert_eq!(
            probs(&Distribution::categorical(&logits).tempered(1.0)),
            probs(&Distribution::categorical(&logits))
        );
        let hot = probs(&Distribution::categorical(&logits).tempered(1e6));
        assert!((hot[0] - 0.5).abs() < 1e-3 && hot[2] == 0.0, "{hot:?}");
        let gaussian = Distribution::Gaussian {
            mean: Tensor::from_slice(&[1.0_f32]).view([1, 1]),
            log_std: Tensor::from_slice(&[0.0_f32]).view([1, 1]),
        }
        .tempered(3.0);
        let Distribution::Gaussian { mean, log_std } = gaussian else {
            unreachable!("a Gaussian")
        };
        assert_eq!(values(&mean), [1.0]);
        assert!((values(&log_std.exp())[0] - 3.0).abs() < 1e-5);
    }

    #[test]
    fn categorical_log_prob_and_entropy() {
        let logits = Tensor::from_slice(&[0.0_f32, (3.0_f32).ln()]).view([1, 2]);
        let d = Distribution::categorical(&logits);
        let lp = values(&d.log_prob(&Tensor::from_slice(&[1.0_f32]).view([1, 1])));
        assert!((lp[0] - 0.75_f32.ln()).abs() < 1e-6);
        let h = values(&d.entropy())[0];
        let expected = -(0.25 * 0.25_f32.ln() + 0.75 * 0.75_f32.ln());
        assert!((h - expected).abs() < 1e-6);
        assert_eq!(values(&d.sample(true, &mut Draws::new(0))), [1.0]);
        let mut draws = Draws::new(3);
        let rows = Tensor::zeros([20_000, 2], (Kind::Float, tch::Device::Cpu)) + &logits;
        let picks = values(&Distribution::categorical(&rows).sample(false, &mut draws));
        let ones = picks.iter().filter(|&&a| a == 1.0).count() as f64 / picks.len() as f64;
        assert!((ones - 0.75).abs() < 0.015, "{ones} of the draws are 1, not 0.75");
        assert!(picks.iter().all(|&a| a == 0.0 || a == 1.0));
    }

    #[test]
    fn gaussian_log_prob_and_entropy() {
        let mean = Tensor::from_slice(&[1.0_f32, -1.0]).view([1, 2]);
        let log_std = Tensor::from_slice(&[0.0_f32, (2.0_f32).ln()]).view([1, 2]);
        let d = Distribution::Gaussian { mean, log_std };
        let a = Tensor::from_slice(&[2.0_f32, -1.0]).view([1, 2]);
        let lp = values(&d.log_prob(&a))[0] as f64;
        let expected = (-0.5 - HALF_LOG_TWO_PI) + (-(2.0_f64).ln() - HALF_LOG_TWO_PI);
        assert!((lp - expected).abs() < 1e-5, "{lp} vs {expected}");
        let h = values(&d.entropy())[0] as f64;
        assert!((h - (1.0 + 2.0 * HALF_LOG_TWO_PI + (2.0_f64).ln())).abs() < 1e-5);
    }

    #[test]
    fn multi_categorical_sums_parts() {
        let logits = Tensor::from_slice(&[0.0_f32, 0.0, 0.0, 0.0, 0.0]).view([1, 5]);
        let d = Distribution::multi_categorical(&logits, &[2, 3]);
        let lp = values(&d.log_prob(&Tensor::from_slice(&[1.0_f32, 2.0]).view([1, 2])))[0];
        assert!((lp - (0.5_f32 * (1.0 / 3.0)).ln()).abs() < 1e-6);
        let h = values(&d.entropy())[0];
        assert!((h - (2.0_f32.ln() + 3.0_f32.ln())).abs() < 1e-6);
    }
}
