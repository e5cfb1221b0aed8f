//! The actor-critic's acting pass written out in Rust ([`DenseActing`]), for the networks
//! [`ActorCritic::dense`](super::ActorCritic::dense) covers: normalise the observations, the MLPs and heads of
//! [`DenseActorCritic`], then draw each row's action and its log-probability and unscale its value. Through libtorch
//! a batch of CartPole's inference worker is some thirty operations, each a dispatch and an allocation, and took as
//! much CPU as the learner (docs/benchmarks.md).
//!
//! It reads a flat copy of the network's variables, laid out as [`Variables::weights`] (what a learner publishes),
//! and takes it again only when libtorch's version counters say a variable changed ([`Variables::version`]): once per
//! published version in an inference worker. Its draws are those of the libtorch path ([`Distribution::sample`]): the
//! same generator, the same number of values in the same order, the same inverse-CDF pick.

use ndarray::ArrayView2;

use super::dense::{DenseActorCritic, DenseHead};
use super::distribution::HALF_LOG_TWO_PI;
use super::normalize::EPS;
use super::{ActOutput, Draws, Variables};
use crate::error::{Result, RlfError};

/// The acting pass of one network, over its own copy of the variables.
#[derive(Debug)]
pub(super) struct DenseActing {
    net: DenseActorCritic,
    /// Where the observation statistics' mean and variance start in the flat variables (`--normalize_input`),
    /// and the clip after normalising.
    obs_rms: Option<(usize, usize, f32)>,
    /// Where the return statistics' mean and variance start (`--normalize_returns`).
    ret_rms: Option<(usize, usize)>,
    obs_dim: usize,
    /// The variables, flat, and [`Variables::version`] when they were taken (`None`: not yet).
    values: Vec<f32>,
    version: Option<i64>,
}

/// How a batch is acted on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Acting {
    /// The most likely actions (a Gaussian's means) rather than sampled ones.
    pub(super) deterministic: bool,
    /// The temperature sampled actions are drawn at ([`Distribution::tempered`](super::Distribution::tempered)).
    pub(super) temperature: f64,
}

impl DenseActing {
    /// The pass of `net` for observations of `obs_dim` values, with the normalisers' statistics at these offsets of
    /// the flat variables.
    pub(super) fn new(
        net: DenseActorCritic,
        obs_dim: usize,
        obs_rms: Option<(usize, usize, f32)>,
        ret_rms: Option<(usize, usize)>,
    ) -> Self {
        Self {
            net,
            obs_rms,
            ret_rms,
            obs_dim,
            values: Vec::new(),
            version: None,
        }
    }

    /// Actions, their log-probabilities and the values (in return units) of the rows of `obs` under `vars`.
    pub(super) fn act(
        &mut self,
        vars: &Variables,
        obs: &[f32],
        how: Acting,
        draws: &mut Draws,
    ) -> Result<ActOutput> {
        let d = self.obs_dim;
        if obs.len() % d != 0 {
            return Err(RlfError::Protocol {
                component: "policy",
                message: format!(
                    "{} observation values are not a whole number of {d}-value observations",
                    obs.len()
                ),
            });
        }
        let version = vars.version();
        if self.version != Some(version) {
            self.values = vars.weights()?.values;
            self.version = Some(version);
        }
        let p = &self.values;
        let rows = obs.len() / d;
        let normalized;
        let x = match self.obs_rms {
            Some((mean, var, clip)) => {
                let (mean, var) = (&p[mean..mean + d], &p[var..var + d]);
                normalized = obs
                    .chunks_exact(d)
                    .flat_map(|row| {
                        row.iter()
                            .zip(mean.iter().zip(var))
                            .map(|(&x, (&m, &v))| ((x - m) / (v + EPS as f32).sqrt()).clamp(-clip, clip))
                    })
                    .collect::<Vec<f32>>();
                &normalized[..]
            }
            None => obs,
        };
        let x = ArrayView2::from_shape((rows, d), x).expect("whole rows, checked above");
        let fwd = self.net.forward(p, &x, false);
        let tempered = !how.deterministic && how.temperature != 1.0;
        let (actions, log_probs) = match self.net.head {
            DenseHead::Categorical { mask } => {
                let k = fwd.logits.ncols();
                let mut logits = fwd.logits.into_raw_vec_and_offset().0;
                if let Some((offset, len)) = mask {
                    for (z, row) in logits.chunks_exact_mut(k).zip(obs.chunks_exact(d)) {
                        z.iter_mut()
                            .zip(&row[offset..offset + len])
                            .filter(|(_, &allowed)| allowed <= 0.5)
                            .for_each(|(z, _)| *z = super::MASKED_LOGIT as f32);
                    }
                }
                logits.chunks_exact_mut(k).for_each(log_softmax);
                if tempered {
                    let t = how.temperature as f32;
                    logits.chunks_exact_mut(k).for_each(|lp| {
                        lp.iter_mut().for_each(|v| *v /= t);
                        log_softmax(lp);
                    });
                }
                let uniforms = if how.deterministic {
                    Vec::new()
                } else {
                    draws.uniforms(rows)
                };
                logits
                    .chunks_exact(k)
                    .enumerate()
                    .map(|(i, lp)| {
                        let a = match uniforms.get(i) {
                            Some(&u) => pick(lp, u),
                            None => argmax(lp),
                        };
                        (a as f32, lp[a])
                    })
                    .unzip()
            }
            DenseHead::Gaussian { log_std } => {
                let k = self.net.action_out.outputs;
                let shift = if tempered {
                    how.temperature.ln() as f32
                } else {
                    0.0
                };
                let log_std: Vec<f32> = p[log_std..log_std + k].iter().map(|l| l + shift).collect();
                let means = fwd.logits.into_raw_vec_and_offset().0;
                let noise = if how.deterministic {
                    vec![0.0; means.len()]
                } else {
                    draws.normals(means.len())
                };
                let actions: Vec<f32> = means
                    .chunks_exact(k)
                    .zip(noise.chunks_exact(k))
                    .flat_map(|(mean, eps)| {
                        mean.iter()
                            .zip(eps)
                            .zip(&log_std)
                            .map(|((m, e), l)| m + l.exp() * e)
                    })
                    .collect();
                let log_probs = actions
                    .chunks_exact(k)
                    .zip(means.chunks_exact(k))
                    .map(|(a, mean)| {
                        a.iter()
                            .zip(mean)
                            .zip(&log_std)
                            .map(|((a, m), l)| {
                                let z = (a - m) / l.exp();
                                z * z * -0.5 - l - HALF_LOG_TWO_PI as f32
                            })
                            .sum()
                    })
                    .collect();
                (actions, log_probs)
            }
        };
        let values = match self.ret_rms {
            Some((mean, var)) => {
                let scale = (p[var] + EPS as f32).sqrt();
                fwd.values.iter().map(|v| v * scale + p[mean]).collect()
            }
            None => fwd.values,
        };
        Ok(ActOutput {
            actions,
            log_probs,
            values,
        })
    }
}

/// `z` replaced by its log-softmax, in place.
fn log_softmax(z: &mut [f32]) {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = z.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
    z.iter_mut().for_each(|v| *v = *v - max - log_sum);
}

/// The first class whose cumulative probability exceeds `u` (the last when rounding leaves none).
fn pick(log_probs: &[f32], u: f32) -> usize {
    let mut cdf = 0.0;
    let below = log_probs
        .iter()
        .take_while(|lp| {
            cdf += lp.exp();
            cdf < u
        })
        .count();
    below.min(log_probs.len() - 1)
}

/// The first most likely class.
fn argmax(log_probs: &[f32]) -> usize {
    log_probs
        .iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |(best, top), (i, &v)| {
                if v > top {
                    (i, v)
                } else {
                    (best, top)
                }
            },
        )
        .0
}
