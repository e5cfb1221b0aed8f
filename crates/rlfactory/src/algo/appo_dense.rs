//! APPO's minibatch step on a [`DenseActorCritic`], differentiated by hand: the loss of [`losses`](super::appo::losses)
//! (steps 8–11 of [`appo`](super::appo)) over the logits and values of the hand-written forward pass, its gradient
//! with respect to them, then the network's backward pass. Used by [`Appo`](super::appo::Appo) for the networks
//! [`ActorCritic::dense`](crate::model::ActorCritic::dense) covers, with GAE (not V-trace); the gradients match
//! autograd's (the tests below).
//!
//! With `m` the mask, `C = max(Σ m, 1)`, `Â` the (normalised) advantages, `r = π/μ` and `p` the action
//! probabilities, the gradients of the total loss are, per row:
//! - of log π(a): `−(m/C) Â r` where the unclipped surrogate is the smaller term (else 0: the clipped term is
//!   constant in π); through it, a categorical's logits get `∂ log π(a) / ∂ zⱼ = 1[j = a] − pⱼ`, a Gaussian's
//!   means `z / σ` and its log standard deviations `z² − 1` (summed over the rows), with `z = (a − μ) / σ`;
//! - of the entropy bonus `−c_e H`: `(m/C) c_e pⱼ (log pⱼ + H)` per logit of a categorical, `−(m/C) c_e` per log
//!   standard deviation of a Gaussian (whose entropy is `Σ log σ + ½ + ½ log 2π`, the same in every state);
//! - of the value loss `½ c_v (V − target)²`: `(m/C) c_v (V − target)`, or with `--ppo_clip_value` the
//!   gradient of the larger of the clipped and unclipped errors (0 where the clipped one is larger).

use ndarray::{Array2, ArrayView2};

use crate::config::AppoConfig;
use crate::model::{DenseActorCritic, DenseHead, MASKED_LOGIT};

/// ½ log 2π: a Gaussian's log-density is `−z²/2 − log σ − ½ log 2π` per dimension.
const HALF_LOG_TWO_PI: f64 = 0.918_938_533_204_672_7;

/// A dataset's rows as the hand-written step reads them (row order, as `Prepared`'s tensors).
#[derive(Debug, Default)]
pub(super) struct DenseDataset {
    /// Observations as the encoders read them (normalised with `--normalize_input`), `obs_dim` per row.
    pub(super) obs: Vec<f32>,
    pub(super) obs_dim: usize,
    /// Actions as stored, `action_dim` per row: a category's index (checked to be one of the head's) or a
    /// Gaussian's raw sample.
    pub(super) actions: Vec<f32>,
    pub(super) action_dim: usize,
    pub(super) old_log_probs: Vec<f32>,
    pub(super) advantages: Vec<f32>,
    /// Value targets and behaviour values, normalised units.
    pub(super) targets: Vec<f32>,
    pub(super) old_values: Vec<f32>,
    pub(super) mask: Vec<f32>,
    /// For a masked categorical head, whether each action is allowed in each row (the observation's
    /// `action_mask`, read before normalisation), `categories` per row; empty for any other head.
    pub(super) legal: Vec<bool>,
}

/// The loss terms of one minibatch, in the order of the autograd learner's metric row: policy, value, entropy,
/// total, KL, fraction clipped, advantages' mean and standard deviation.
pub(super) type LossRow = [f32; 8];

/// One minibatch's forward pass, loss and backward pass: every parameter's gradient (flat, as `params`) and the
/// loss terms. `rows` picks the dataset's rows (all of them, in order, when `None`); with `two_threads` a separate
/// critic is computed on a second thread.
pub(super) fn gradients(
    net: &DenseActorCritic,
    params: &[f32],
    data: &DenseDataset,
    rows: Option<&[i64]>,
    (cfg, value_clip): (&AppoConfig, f64),
    two_threads: bool,
) -> (Vec<f32>, LossRow) {
    let picked: Vec<usize> = match rows {
        Some(rows) => rows.iter().filter_map(|&r| usize::try_from(r).ok()).collect(),
        None => (0..data.mask.len()).collect(),
    };
    let d = data.obs_dim;
    let mut obs = Vec::with_capacity(picked.len() * d);
    for &r in &picked {
        obs.extend_from_slice(&data.obs[r * d..(r + 1) * d]);
    }
    let obs = ArrayView2::from_shape((picked.len(), d), &obs).expect("the rows were gathered whole");
    let mut fwd = net.forward(params, &obs, two_threads);
    let categories = fwd.logits.ncols();
    let masked = !data.legal.is_empty();
    let legal = |i: usize, j: usize| data.legal[picked[i] * categories + j];
    // As the autograd network's `masked_fill`: a forbidden action's logit is constant, its probability 0.
    if masked {
        fwd.logits
            .indexed_iter_mut()
            .filter(|((i, j), _)| !legal(*i, *j))
            .for_each(|(_, z)| *z = MASKED_LOGIT as f32);
    }
    let log_std = match net.head {
        DenseHead::Categorical { .. } => &[][..],
        DenseHead::Gaussian { log_std } => &params[log_std..log_std + net.action_out.outputs],
    };
    let mut grads = loss(
        &fwd.logits,
        log_std,
        &fwd.values,
        data,
        &picked,
        (cfg, value_clip),
    );
    if masked {
        grads
            .logits
            .indexed_iter_mut()
            .filter(|((i, j), _)| !legal(*i, *j))
            .for_each(|(_, dz)| *dz = 0.0);
    }
    let mut all = net.backward(params, &obs, &fwd, (&grads.logits, &grads.values), two_threads);
    if let DenseHead::Gaussian { log_std } = net.head {
        all[log_std..log_std + grads.log_std.len()].copy_from_slice(&grads.log_std);
    }
    (all, grads.row)
}

/// The gradients of the loss with respect to the action head's outputs, the log standard deviations of a Gaussian
/// head (empty for a categorical) and the values, and the loss terms.
struct LossGradients {
    logits: Array2<f32>,
    log_std: Vec<f32>,
    values: Vec<f32>,
    row: LossRow,
}

/// The loss of the rows `picked` of `data` given their `logits` (a categorical's, or a Gaussian's means with
/// `log_std`, one per dimension; empty for a categorical) and `values`, and its gradients.
fn loss(
    logits: &Array2<f32>,
    log_std: &[f32],
    values: &[f32],
    data: &DenseDataset,
    picked: &[usize],
    (cfg, value_clip): (&AppoConfig, f64),
) -> LossGradients {
    let n = picked.len();
    let mask: Vec<f64> = picked.iter().map(|&r| f64::from(data.mask[r])).collect();
    let count = mask.iter().sum::<f64>().max(1.0);
    let masked_mean =
        |x: &mut dyn Iterator<Item = f64>| x.zip(&mask).map(|(x, m)| x * m).sum::<f64>() / count;
    let raw: Vec<f64> = picked.iter().map(|&r| f64::from(data.advantages[r])).collect();
    let advantages: Vec<f64> = if cfg.normalize_advantage {
        let mean = masked_mean(&mut raw.iter().copied());
        let var = masked_mean(&mut raw.iter().map(|a| (a - mean) * (a - mean)));
        raw.iter().map(|a| (a - mean) / (var.sqrt() + 1e-8)).collect()
    } else {
        raw
    };
    let (eps, c_v, c_e) = (
        cfg.ppo_clip_ratio,
        cfg.value_loss_coeff,
        cfg.exploration_loss_coeff,
    );
    let mut dlogits = Array2::<f32>::zeros(logits.dim());
    let mut dvalues = vec![0.0f32; n];
    let (mut policy, mut value, mut entropy, mut kl, mut clipped) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut dlog_std = vec![0.0f64; log_std.len()];
    let log_std: Vec<f64> = log_std.iter().map(|&s| f64::from(s)).collect();
    // A Gaussian's entropy does not depend on the state: Σ (log σ + ½ + ½ log 2π).
    let gaussian_entropy: f64 = log_std.iter().map(|s| s + 0.5 + HALF_LOG_TWO_PI).sum();
    let mut log_p = vec![0.0f64; logits.ncols()];
    let k = data.action_dim;
    for (i, &r) in picked.iter().enumerate() {
        let weight = mask[i] / count;
        let out = logits.row(i);
        let action = &data.actions[r * k..(r + 1) * k];
        // z = (a − μ) / σ per dimension of a Gaussian.
        let standardised = |d: usize| (f64::from(action[d]) - f64::from(out[d])) / log_std[d].exp();
        // log π(a|s) and the entropy: by a stable log-softmax for a categorical.
        let (log_prob, h) = if log_std.is_empty() {
            let max = out.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let sum: f64 = out.iter().map(|&v| f64::from(v - max).exp()).sum();
            for (lp, &v) in log_p.iter_mut().zip(out.iter()) {
                *lp = f64::from(v - max) - sum.ln();
            }
            let h = -log_p.iter().map(|lp| lp.exp() * lp).sum::<f64>();
            (log_p[action[0] as usize], h)
        } else {
            let log_prob = (0..k)
                .map(|d| -0.5 * standardised(d).powi(2) - log_std[d] - HALF_LOG_TWO_PI)
                .sum::<f64>();
            (log_prob, gaussian_entropy)
        };
        let log_ratio = log_prob - f64::from(data.old_log_probs[r]);
        let ratio = log_ratio.exp();
        let a = advantages[i];
        let surrogate = a * ratio;
        let bounded = a * ratio.clamp(1.0 - eps, 1.0 + eps);
        policy -= weight * surrogate.min(bounded);
        let d_log_prob = if surrogate <= bounded {
            -weight * a * ratio
        } else {
            0.0
        };
        entropy += weight * h;
        kl += weight * ((ratio - 1.0) - log_ratio);
        clipped += weight * f64::from(u8::from((ratio - 1.0).abs() > eps));
        if log_std.is_empty() {
            for (j, (dz, &lp)) in dlogits.row_mut(i).iter_mut().zip(&log_p).enumerate() {
                let p = lp.exp();
                let chosen = f64::from(u8::from(j == action[0] as usize));
                *dz = (d_log_prob * (chosen - p) + weight * c_e * p * (lp + h)) as f32;
            }
        } else {
            // ∂ log π / ∂μ = z / σ and ∂ log π / ∂ log σ = z² − 1; the entropy's ∂H / ∂ log σ = 1.
            for (d, dmean) in dlogits.row_mut(i).iter_mut().enumerate() {
                let z = standardised(d);
                *dmean = (d_log_prob * z / log_std[d].exp()) as f32;
                dlog_std[d] += d_log_prob * (z * z - 1.0) - weight * c_e;
            }
        }
        let (v, target, old) = (
            f64::from(values[i]),
            f64::from(data.targets[r]),
            f64::from(data.old_values[r]),
        );
        let error = v - target;
        let (squared, d_value) = if value_clip > 0.0 {
            let v_clipped = old + (v - old).clamp(-value_clip, value_clip);
            let clipped_error = v_clipped - target;
            if error * error >= clipped_error * clipped_error {
                (error * error, error)
            } else {
                (clipped_error * clipped_error, 0.0)
            }
        } else {
            (error * error, error)
        };
        value += weight * 0.5 * squared;
        dvalues[i] = (weight * c_v * d_value) as f32;
    }
    let total = policy + c_v * value - c_e * entropy;
    let adv_mean = advantages.iter().sum::<f64>() / n.max(1) as f64;
    let adv_var = advantages
        .iter()
        .map(|a| (a - adv_mean) * (a - adv_mean))
        .sum::<f64>()
        / (n.max(2) - 1) as f64;
    let row = [
        policy,
        value,
        entropy,
        total,
        kl,
        clipped,
        adv_mean,
        adv_var.sqrt(),
    ]
    .map(|x| x as f32);
    LossGradients {
        logits: dlogits,
        log_std: dlog_std.into_iter().map(|g| g as f32).collect(),
        values: dvalues,
        row,
    }
}

#[cfg(test)]
mod tests {
    use rlf_env::{BoxSpace, Space};
    use tch::{Kind, Tensor};

    use super::{gradients, DenseDataset};
    use crate::algo::adam::{Adam, AdamConfig};
    use crate::algo::appo::{losses, LossInputs};
    use crate::config::{AppoConfig, Config, DeviceKind, Nonlinearity};
    use crate::model::{ActorCritic, DenseHead, Policy, ACTION_MASK_KEY};

    /// The hand-written gradients of every parameter equal autograd's for APPO's loss, for tanh, ReLU and ELU
    /// layers, separate or shared actor and critic, a categorical (masked by an `action_mask` of a Dict observation or
    /// not) or a Gaussian head (its log standard deviations included), with the entropy bonus and value clipping on,
    /// on masked rows with ratios inside and outside the clipping range.
    #[test]
    fn hand_written_gradients_match_autograd() {
        // (nonlinearity, shared, entropy coefficient, value clip, Gaussian head, action mask)
        let cases = [
            (Nonlinearity::Tanh, false, 0.0, 0.0, false, false),
            (Nonlinearity::Tanh, true, 0.01, 0.3, false, false),
            (Nonlinearity::Relu, false, 0.003, 0.3, false, false),
            (Nonlinearity::Elu, true, 0.0, 0.0, false, false),
            (Nonlinearity::Tanh, false, 0.0, 0.0, true, false),
            (Nonlinearity::Relu, true, 0.01, 0.3, true, false),
            (Nonlinearity::Tanh, false, 0.01, 0.3, false, true),
            (Nonlinearity::Relu, true, 0.003, 0.0, false, true),
        ];
        for (nonlinearity, shared, entropy_coeff, value_clip, gaussian, masked) in cases {
            tch::manual_seed(7);
            let mut model_cfg = Config::default().model;
            model_cfg.encoder_mlp_layers = "16,12".parse().expect("layers");
            model_cfg.nonlinearity = nonlinearity;
            model_cfg.actor_critic_share_weights = shared;
            let features = Space::Box(BoxSpace::uniform(-1.0, 1.0, vec![5]).expect("box"));
            let space = if masked {
                Space::Dict(vec![
                    (
                        ACTION_MASK_KEY.to_owned(),
                        Space::Box(BoxSpace::uniform(0.0, 1.0, vec![3]).expect("box")),
                    ),
                    ("observation".to_owned(), features),
                ])
            } else {
                features
            };
            let obs_dim = space.flat_dim();
            model_cfg.initial_stddev = 0.7;
            let (action_space, action_dim) = if gaussian {
                (Space::Box(BoxSpace::uniform(-1.0, 1.0, vec![2]).expect("box")), 2)
            } else {
                (Space::discrete(3), 1)
            };
            let model = ActorCritic::new(&space, &action_space, &model_cfg, DeviceKind::Cpu).expect("model");
            let adam_cfg = AdamConfig {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            };
            let adam = Adam::new(model.variables().trainable(), adam_cfg, 1e-3).expect("adam");
            let net = model
                .dense(|t| adam.offset_of(t))
                .expect("an MLP actor-critic is covered");
            let params = adam.values().expect("values");
            assert_eq!(
                net.len(),
                params.len(),
                "every parameter is a layer's or the head's"
            );
            let cfg = AppoConfig {
                exploration_loss_coeff: entropy_coeff,
                ..Config::default().appo
            };
            let n = 48i64;
            let actions = if gaussian {
                Tensor::randn([n, 2], (Kind::Float, tch::Device::Cpu))
            } else {
                Tensor::randint(3, [n, 1], (Kind::Float, tch::Device::Cpu))
            };
            let obs = if masked {
                // Each action allowed with probability ½, the one taken always.
                let allowed = Tensor::rand([n, 3], (Kind::Float, tch::Device::Cpu))
                    .gt(0.5)
                    .to_kind(Kind::Float)
                    .scatter_value(1, &actions.to_kind(Kind::Int64), 1.0);
                Tensor::cat(
                    &[allowed, Tensor::randn([n, 5], (Kind::Float, tch::Device::Cpu))],
                    1,
                )
            } else {
                Tensor::randn([n, 5], (Kind::Float, tch::Device::Cpu))
            };
            let (behaviour, values) = tch::no_grad(|| model.forward(&obs));
            // Behaviour probabilities away from the current ones, so that some ratios leave [1 − ε, 1 + ε].
            let old_log_probs =
                behaviour.log_prob(&actions) + Tensor::randn([n], (Kind::Float, tch::Device::Cpu)) * 0.3;
            let old_values = &values + Tensor::randn([n], (Kind::Float, tch::Device::Cpu)) * 0.5;
            let advantages = Tensor::randn([n], (Kind::Float, tch::Device::Cpu));
            let targets = Tensor::randn([n], (Kind::Float, tch::Device::Cpu));
            let mask = Tensor::rand([n], (Kind::Float, tch::Device::Cpu))
                .gt(0.2)
                .to_kind(Kind::Float);

            let (dist, values) = model.forward(&obs);
            let log_probs = dist.log_prob(&actions);
            let l = losses(
                &LossInputs {
                    log_probs: &log_probs,
                    old_log_probs: &old_log_probs,
                    advantages: &advantages,
                    values: &values,
                    old_values: &old_values,
                    targets: &targets,
                    entropy: &dist.entropy(),
                    mask: &mask,
                    policy_mask: None,
                },
                &cfg,
                value_clip,
            );
            l.total.backward();
            let autograd: Vec<f32> = model
                .variables()
                .trainable()
                .iter()
                .flat_map(|(_, v)| Vec::<f32>::try_from(v.grad().reshape([-1])).expect("grad"))
                .collect();

            let vec = |t: &Tensor| Vec::<f32>::try_from(t.reshape([-1])).expect("values");
            let legal = match masked {
                true => vec(&obs.narrow(1, 0, 3)).into_iter().map(|a| a > 0.5).collect(),
                false => Vec::new(),
            };
            if masked {
                assert_eq!(net.head, DenseHead::Categorical { mask: Some((0, 3)) });
            }
            let data = DenseDataset {
                obs: vec(&obs),
                obs_dim,
                actions: vec(&actions),
                action_dim,
                old_log_probs: vec(&old_log_probs),
                advantages: vec(&advantages),
                targets: vec(&targets),
                old_values: vec(&old_values),
                mask: vec(&mask),
                legal,
            };
            let (hand, row) = gradients(&net, &params, &data, None, (&cfg, value_clip), false);
            let (beside, _) = gradients(&net, &params, &data, None, (&cfg, value_clip), true);
            assert_eq!(
                hand, beside,
                "the critic on a second thread computes the same gradients"
            );
            let scale = autograd.iter().fold(0f32, |m, g| m.max(g.abs()));
            for (i, (h, a)) in hand.iter().zip(&autograd).enumerate() {
                assert!(
                    (h - a).abs() <= 1e-4 * scale,
                    "{nonlinearity:?} shared {shared} masked {masked}: parameter value {i}: by hand {h}, autograd {a}"
                );
            }
            let total = f32::try_from(&l.total).expect("total");
            assert!(
                (row[3] - total).abs() < 1e-4,
                "loss by hand {}, autograd {total}",
                row[3]
            );
            let clipped = f32::try_from(&l.fraction_clipped).expect("clipped");
            assert!(
                clipped > 0.0 && clipped < 1.0,
                "the case clips some ratios, not all ({clipped})"
            );
            assert!((row[5] - clipped).abs() < 1e-6);
        }
    }
}
