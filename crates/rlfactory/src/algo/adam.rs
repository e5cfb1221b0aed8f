//! Adam (Kingma & Ba, 2015), written over the model's tensors so that its moments are ours to
//! checkpoint: tch's `nn::Optimizer` keeps them inside libtorch, out of reach, and a resumed run
//! would restart them at zero.
//!
//! Per parameter `p` with gradient `g`, at step `t` (from 1):
//! `m ← β₁ m + (1 − β₁) g`, `v ← β₂ v + (1 − β₂) g²`,
//! `p ← p − lr / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)`,
//! the same update, in the same order of operations, as PyTorch's `torch.optim.Adam` (see
//! `rlf_shm::tensor::AdamStep::element` for where the last bit may differ).
//!
//! The parameters are views into one flat tensor, as are the moments. On the CPU one step is two
//! loops over every gradient (in `rlf_shm::tensor`, the crate allowed `unsafe`): one for the global
//! norm they are clipped to, one that updates the moments and the parameter together (the clipping
//! applied as a scale of the gradient), each element read and written once, instead of a dozen
//! libtorch passes over all parameters (a Pong network has 1.7M; its steps spent more time in those
//! passes than in their products). On another device, a dozen tensor operations over the flat
//! tensors.

use rlf_shm::tensor::{adam_update, sum_of_squares, AdamStep, Source};
use tch::{Device, Tensor};

use crate::config::OptimizerConfig;
use crate::error::{Result, RlfError};
use crate::model::NamedTensor;

/// Prefix of the moments' names in a checkpoint.
pub const PREFIX: &str = "adam.";
/// Prefix of the first moments' names (`adam.exp_avg.<parameter>`).
const EXP_AVG: &str = "adam.exp_avg.";
/// Prefix of the second moments' names (`adam.exp_avg_sq.<parameter>`).
const EXP_AVG_SQ: &str = "adam.exp_avg_sq.";

/// Averages the gradients of several learners of one policy (data-parallel training, each learner on its own
/// data): called at every step with every parameter's gradient, flat, before clipping. It must leave the same values
/// on every learner, so that their Adam steps, and so their weights, stay bit-identical.
pub trait GradientSync {
    /// Replaces `grads` with the learners' mean; returns `false`, and no learner takes this step, when another
    /// learner has stopped (see [`GradientSync::finish`]).
    fn average(&mut self, grads: &mut [f32]) -> Result<bool>;

    /// After each step, the weights (flat) as they now are: where the learners may check that theirs agree.
    fn stepped(&mut self, weights: &Tensor) -> Result<()>;

    /// This learner, of a network of `parameters` values, trains no more: the others learn it at their next step
    /// (and stop too), unless one of them stopped first.
    fn finish(&mut self, parameters: usize) -> Result<()>;
}

/// Scales the gradients of `params` so that their global L2 norm is at most `max_norm`; returns
/// the norm before clipping.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> f64 {
    let grads: Vec<Tensor> = params.iter().map(Tensor::grad).filter(Tensor::defined).collect();
    clip_grad_norm_of(&grads, max_norm)
}

/// [`clip_grad_norm`] of the gradients `grads` themselves (scaled in place).
pub(crate) fn clip_grad_norm_of(grads: &[Tensor], max_norm: f64) -> f64 {
    tch::no_grad(|| {
        if grads.is_empty() {
            return 0.0;
        }
        let norms: Vec<Tensor> = grads.iter().map(|g| g.norm()).collect();
        let total = f64::try_from(Tensor::stack(&norms, 0).norm()).unwrap_or(f64::NAN);
        let coef = max_norm / (total + 1e-6);
        if coef < 1.0 {
            for g in grads {
                let _ = g.shallow_clone().f_mul_scalar_(coef);
            }
        }
        total
    })
}

/// Clips `grads` to a global L2 norm of `max_norm` (not when it is 0); returns the norm before clipping (0 when not
/// clipping).
fn clip(grads: &[Tensor], max_norm: f64) -> f64 {
    if max_norm > 0.0 {
        clip_grad_norm_of(grads, max_norm)
    } else {
        0.0
    }
}

/// One Adam update of `value` and its moments from the gradient `g`, with `(β₁, β₂, ε)` and the step's
/// `(lr / (1 − β₁ᵗ), √(1 − β₂ᵗ))` (PyTorch's order of operations).
fn update(
    (value, exp_avg, exp_avg_sq): (&mut Tensor, &mut Tensor, &mut Tensor),
    g: &Tensor,
    (b1, b2, eps): (f64, f64, f64),
    (step_size, bias_correction2_sqrt): (f64, f64),
) -> Result<()> {
    let _ = exp_avg.f_lerp_(g, 1.0 - b1)?;
    let _ = exp_avg_sq.f_lerp_(&g.f_square()?, 1.0 - b2)?;
    let denom = exp_avg_sq
        .f_sqrt()?
        .f_div_scalar_(bias_correction2_sqrt)?
        .f_add_scalar_(eps)?;
    let _ = value.f_addcdiv_(&exp_avg.f_mul_scalar(-step_size)?, &denom)?;
    Ok(())
}

/// Adam's hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// β₁.
    pub beta1: f64,
    /// β₂.
    pub beta2: f64,
    /// ε.
    pub eps: f64,
}

impl From<&OptimizerConfig> for AdamConfig {
    fn from(cfg: &OptimizerConfig) -> Self {
        Self {
            beta1: cfg.adam_beta1,
            beta2: cfg.adam_beta2,
            eps: cfg.adam_eps,
        }
    }
}

struct Param {
    name: String,
    /// Where the values start in the flat tensor.
    offset: usize,
    value: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

/// Adam over named trainable tensors.
pub struct Adam {
    cfg: AdamConfig,
    params: Vec<Param>,
    /// Every parameter's values, and the two moments, flat: the per-parameter tensors view them.
    flat: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    lr: f64,
    /// Steps taken since the moments were zero (the bias corrections' `t`).
    step: u64,
    /// Several learners of one policy: their gradients are averaged before each step.
    sync: Option<Box<dyn GradientSync>>,
}

impl std::fmt::Debug for Adam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adam")
            .field("lr", &self.lr)
            .field("step", &self.step)
            .field("params", &self.params.len())
            .field("synced", &self.sync.is_some())
            .finish_non_exhaustive()
    }
}

impl Adam {
    /// Adam over `params` (name, trainable tensor) at learning rate `lr`, moments at zero. The
    /// parameters' data move into one flat tensor (their values and autograd identity stay).
    pub fn new(params: Vec<(String, Tensor)>, cfg: AdamConfig, lr: f64) -> Result<Self> {
        let flat = tch::no_grad(|| -> Result<Tensor> {
            let parts = params
                .iter()
                .map(|(_, v)| Ok(v.f_detach()?.f_reshape([-1])?))
                .collect::<Result<Vec<_>>>()?;
            Ok(Tensor::f_cat(&parts, 0)?)
        })?;
        let (exp_avg, exp_avg_sq) = (flat.f_zeros_like()?, flat.f_zeros_like()?);
        let mut offset = 0;
        let params = params
            .into_iter()
            .map(|(name, mut value)| {
                let n = value.numel() as i64;
                let shape = value.size();
                let view = |t: &Tensor| -> Result<Tensor> {
                    Ok(t.f_narrow(0, offset, n)?.f_view(shape.as_slice())?)
                };
                value.f_set_data(&view(&flat)?)?;
                let param = Param {
                    offset: usize::try_from(offset).unwrap_or_default(),
                    exp_avg: view(&exp_avg)?,
                    exp_avg_sq: view(&exp_avg_sq)?,
                    name,
                    value,
                };
                offset += n;
                Ok(param)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg,
            params,
            flat,
            exp_avg,
            exp_avg_sq,
            lr,
            step: 0,
            sync: None,
        })
    }

    /// Averages the gradients with other learners' through `sync` before every step from now on.
    pub fn set_gradient_sync(&mut self, sync: Box<dyn GradientSync>) {
        self.sync = Some(sync);
    }

    /// This learner trains no more: tells the learners it averages with (see [`GradientSync::finish`]).
    pub fn finish_sync(&mut self) -> Result<()> {
        let parameters = self.flat.numel();
        self.sync.as_mut().map_or(Ok(()), |sync| sync.finish(parameters))
    }

    /// Sets the learning rate of the next steps.
    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// Steps taken since the moments were zero.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Zeroes every parameter's gradient.
    pub fn zero_grad(&mut self) -> Result<()> {
        for p in &self.params {
            let mut g = p.value.grad();
            if g.defined() {
                let _ = g.f_zero_()?;
            }
        }
        Ok(())
    }

    /// One update from the gradients (a parameter without one is left alone, as PyTorch does).
    pub fn step(&mut self) -> Result<()> {
        self.clip_and_step(0.0).map(|_| ())
    }

    /// Clips the gradients to a global L2 norm of `max_norm` (as `clip_grad_norm`; not when
    /// `max_norm` is 0), then one update. Returns the norm before clipping.
    pub fn clip_and_step(&mut self, max_norm: f64) -> Result<f64> {
        let grads: Vec<Tensor> = self.params.iter().map(|p| p.value.grad()).collect();
        self.clip_and_step_grads(&grads, max_norm)
    }

    /// As [`Adam::zero_grad`], `loss.backward()` and [`Adam::clip_and_step`], without the parameters' `.grad`:
    /// autograd hands the gradients over instead of adding them into zeroed ones (no pass over every parameter to
    /// zero them, none to add into them: a Pong network has 1.7M). The parameters' `.grad` are left as they were.
    pub fn minimize(&mut self, loss: &Tensor, max_norm: f64) -> Result<f64> {
        let values: Vec<&Tensor> = self.params.iter().map(|p| &p.value).collect();
        let grads = Tensor::f_run_backward(&[loss], &values, false, false)?;
        self.clip_and_step_grads(&grads, max_norm)
    }

    /// [`Adam::clip_and_step`] of `grads`, one per parameter (undefined where a parameter has none).
    fn clip_and_step_grads(&mut self, grads: &[Tensor], max_norm: f64) -> Result<f64> {
        tch::no_grad(|| {
            if self.sync.is_some() {
                // With several learners, a parameter without a gradient here counts as zeros, so that every
                // learner averages the same layout.
                let mut host = vec![0.0f32; self.flat.numel()];
                for (g, p) in grads.iter().zip(&self.params) {
                    if g.defined() {
                        let len = p.value.numel();
                        if g.numel() != len {
                            return Err(RlfError::WeightMismatch(format!(
                                "the gradient of `{}` has {} values, the parameter {len}",
                                p.name,
                                g.numel()
                            )));
                        }
                        g.f_to_device(Device::Cpu)?
                            .f_to_kind(tch::Kind::Float)?
                            .f_contiguous()?
                            .f_copy_data(&mut host[p.offset..p.offset + len], len)?;
                    }
                }
                return self.step_host(host, max_norm);
            }
            if self.flat.device() == Device::Cpu {
                return self.step_cpu(None, grads, max_norm);
            }
            if grads.iter().all(Tensor::defined) {
                let flat = grads
                    .iter()
                    .map(|g| g.f_reshape([-1]))
                    .collect::<Result<Vec<_>, _>>()?;
                return self.step_device(Tensor::f_cat(&flat, 0)?, max_norm);
            }
            self.step += 1;
            let (step_size, bias_correction2_sqrt) = self.corrections(self.step);
            let (b1, b2, eps) = (self.cfg.beta1, self.cfg.beta2, self.cfg.eps);
            let defined: Vec<Tensor> = grads
                .iter()
                .filter(|g| g.defined())
                .map(Tensor::shallow_clone)
                .collect();
            let norm = clip(&defined, max_norm);
            for (p, g) in self.params.iter_mut().zip(grads) {
                if !g.defined() {
                    continue;
                }
                update(
                    (&mut p.value, &mut p.exp_avg, &mut p.exp_avg_sq),
                    g,
                    (b1, b2, eps),
                    (step_size, bias_correction2_sqrt),
                )?;
            }
            Ok(norm)
        })
    }

    /// As [`Adam::clip_and_step`], with the gradients given: one per parameter, in the order of the parameters
    /// this optimiser was made with (a learner that computes its gradients without autograd).
    pub fn clip_and_step_with(&mut self, grads: &[Tensor], max_norm: f64) -> Result<f64> {
        if grads.len() != self.params.len() {
            return Err(RlfError::WeightMismatch(format!(
                "{} gradients for {} parameters",
                grads.len(),
                self.params.len()
            )));
        }
        for (g, p) in grads.iter().zip(&self.params) {
            if g.size() != p.value.size() {
                return Err(RlfError::WeightMismatch(format!(
                    "the gradient of `{}` has shape {:?}, the parameter {:?}",
                    p.name,
                    g.size(),
                    p.value.size()
                )));
            }
        }
        self.clip_and_step_grads(grads, max_norm)
    }

    /// Where `param` (one of the tensors this optimiser was made with, or a shallow clone of one) starts in the
    /// flat values of [`Adam::values`]; `None` for another tensor.
    pub fn offset_of(&self, param: &Tensor) -> Option<usize> {
        self.params
            .iter()
            .find(|p| p.value.data_ptr() == param.data_ptr() && p.value.size() == param.size())
            .map(|p| p.offset)
    }

    /// Every parameter's values, flat, in the order of the parameters this optimiser was made with.
    pub fn values(&self) -> Result<Vec<f32>> {
        Ok(Vec::<f32>::try_from(&self.flat)?)
    }

    /// As [`Adam::clip_and_step`], with every gradient given flat, laid out as [`Adam::values`].
    pub fn clip_and_step_flat(&mut self, grads: &[f32], max_norm: f64) -> Result<f64> {
        let parameters = self.flat.numel();
        if grads.len() != parameters {
            return Err(RlfError::WeightMismatch(format!(
                "{} gradients for {parameters} parameter values",
                grads.len()
            )));
        }
        if self.sync.is_none() && self.flat.device() == Device::Cpu {
            return tch::no_grad(|| self.step_cpu(Some(grads), &[], max_norm));
        }
        tch::no_grad(|| self.step_host(grads.to_vec(), max_norm))
    }

    /// `lr / (1 − β₁ᵗ)` and `√(1 − β₂ᵗ)` at step `t`.
    fn corrections(&self, t: u64) -> (f64, f64) {
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        (
            self.lr / (1.0 - self.cfg.beta1.powi(t)),
            (1.0 - self.cfg.beta2.powi(t)).sqrt(),
        )
    }

    /// One update from `host`, every gradient flat, averaged with the other learners' first (with several);
    /// returns the norm before clipping.
    fn step_host(&mut self, mut host: Vec<f32>, max_norm: f64) -> Result<f64> {
        if let Some(sync) = &mut self.sync {
            if !sync.average(&mut host)? {
                // No learner takes this step.
                return Err(RlfError::LearnersStopped);
            }
        }
        let norm = if self.flat.device() == Device::Cpu {
            self.step_cpu(Some(&host), &[], max_norm)?
        } else {
            let g = Tensor::f_from_slice(&host)?.f_to_device(self.flat.device())?;
            self.step_device(g, max_norm)?
        };
        if let Some(sync) = &mut self.sync {
            sync.stepped(&self.flat)?;
        }
        Ok(norm)
    }

    /// One update on the CPU, from `flat` (every gradient, laid out as [`Adam::values`]) or else from `grads`
    /// (one per parameter; a parameter whose gradient is undefined is left alone, moments too, as PyTorch leaves
    /// it, though the count of steps here is one for all): the global norm in one pass over the gradients, then
    /// one pass of Adam's update over each parameter and its moments (split between as many threads as libtorch
    /// has intra-op ones). Returns the norm before clipping (0 when `max_norm` is 0: no clipping).
    fn step_cpu(&mut self, flat: Option<&[f32]>, grads: &[Tensor], max_norm: f64) -> Result<f64> {
        let mut tensors = Vec::with_capacity(grads.len());
        if flat.is_none() {
            for (g, p) in grads.iter().zip(&self.params) {
                if !g.defined() {
                    continue;
                }
                if g.numel() != p.value.numel() {
                    return Err(RlfError::WeightMismatch(format!(
                        "the gradient of `{}` has {} values, the parameter {}",
                        p.name,
                        g.numel(),
                        p.value.numel()
                    )));
                }
                let g = g.f_to_device(Device::Cpu)?.f_to_kind(tch::Kind::Float)?;
                tensors.push((p.offset, g.f_contiguous()?));
            }
        }
        let sources: Vec<(usize, Source<'_>)> = match flat {
            Some(f) => vec![(0, Source::Slice(f))],
            None => tensors.iter().map(|(at, g)| (*at, Source::Tensor(g))).collect(),
        };
        let mut norm = 0.0;
        if max_norm > 0.0 {
            for (_, g) in &sources {
                norm += sum_of_squares(*g)?;
            }
            norm = norm.sqrt();
        }
        let coef = max_norm / (norm + 1e-6);
        let step = self.step + 1;
        let (step_size, bias_correction2_sqrt) = self.corrections(step);
        let constants = AdamStep {
            w1: (1.0 - self.cfg.beta1) as f32,
            b2: self.cfg.beta2 as f32,
            w2: (1.0 - self.cfg.beta2) as f32,
            eps: self.cfg.eps as f32,
            neg_step_size: -step_size as f32,
            bias_correction2_sqrt: bias_correction2_sqrt as f32,
            scale: if max_norm > 0.0 && coef < 1.0 {
                coef as f32
            } else {
                1.0
            },
        };
        let threads = usize::try_from(tch::get_num_threads()).unwrap_or(1);
        let moments = [&mut self.flat, &mut self.exp_avg, &mut self.exp_avg_sq];
        adam_update(moments, &sources, threads, constants)?;
        self.step = step;
        Ok(norm)
    }

    /// One update of every parameter on a device other than the CPU from `g`, all the gradients flat, clipped
    /// to `max_norm`; returns the norm before clipping.
    fn step_device(&mut self, g: Tensor, max_norm: f64) -> Result<f64> {
        self.step += 1;
        let (step_size, bias_correction2_sqrt) = self.corrections(self.step);
        let (b1, b2, eps) = (self.cfg.beta1, self.cfg.beta2, self.cfg.eps);
        let norm = clip(std::slice::from_ref(&g), max_norm);
        update(
            (&mut self.flat, &mut self.exp_avg, &mut self.exp_avg_sq),
            &g,
            (b1, b2, eps),
            (step_size, bias_correction2_sqrt),
        )?;
        Ok(norm)
    }

    /// The moments as named tensors, for a checkpoint.
    pub fn state(&self) -> Result<Vec<NamedTensor>> {
        let mut out = Vec::with_capacity(2 * self.params.len());
        for p in &self.params {
            for (prefix, t) in [(EXP_AVG, &p.exp_avg), (EXP_AVG_SQ, &p.exp_avg_sq)] {
                out.push(NamedTensor {
                    name: format!("{prefix}{}", p.name),
                    shape: t.size().iter().map(|&d| d as usize).collect(),
                    values: Vec::<f32>::try_from(
                        t.f_flatten(0, -1)?
                            .f_to_kind(tch::Kind::Float)?
                            .f_to_device(tch::Device::Cpu)?,
                    )?,
                });
            }
        }
        Ok(out)
    }

    /// Continues from saved moments taken `steps` steps from zero: `true` if `tensors` holds
    /// every moment; `false` (moments at zero, steps from zero) if it holds none, as a checkpoint
    /// saved without them. Some but not all, or a wrong shape, is an error.
    pub fn load_state(&mut self, tensors: &[NamedTensor], steps: u64) -> Result<bool> {
        let find = |name: &str| tensors.iter().find(|t| t.name == name);
        let found = self
            .params
            .iter()
            .flat_map(|p| [format!("{EXP_AVG}{}", p.name), format!("{EXP_AVG_SQ}{}", p.name)])
            .filter(|n| find(n).is_some())
            .count();
        if found == 0 {
            for p in &mut self.params {
                let _ = p.exp_avg.f_zero_()?;
                let _ = p.exp_avg_sq.f_zero_()?;
            }
            self.step = 0;
            return Ok(false);
        }
        for p in &mut self.params {
            for (prefix, t) in [(EXP_AVG, &mut p.exp_avg), (EXP_AVG_SQ, &mut p.exp_avg_sq)] {
                let name = format!("{prefix}{}", p.name);
                let src = find(&name)
                    .ok_or_else(|| RlfError::WeightMismatch(format!("no optimizer moment `{name}`")))?;
                let shape: Vec<i64> = src.shape.iter().map(|&d| d as i64).collect();
                if shape != t.size() || src.values.len() != t.numel() {
                    return Err(RlfError::WeightMismatch(format!(
                        "optimizer moment `{name}` has shape {:?}, the parameter's is {:?}",
                        src.shape,
                        t.size()
                    )));
                }
                let loaded = Tensor::f_from_slice(&src.values)?
                    .f_reshape(&shape)?
                    .f_to_device(t.device())?;
                tch::no_grad(|| t.f_copy_(&loaded))?;
            }
        }
        self.step = steps;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::{self, OptimizerConfig};

    const CFG: AdamConfig = AdamConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };

    /// Deterministic values (no global generator: tests run in parallel threads).
    fn wave(shape: &[i64], phase: f64) -> Tensor {
        let n: i64 = shape.iter().product();
        (Tensor::arange(n, (tch::Kind::Float, tch::Device::Cpu)) * 0.7 + phase)
            .sin()
            .reshape(shape)
    }

    /// A small least-squares problem on two fresh parameters, the same for every `phase`.
    fn problem(phase: f64) -> (nn::VarStore, Vec<(String, Tensor)>) {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let root = vs.root();
        let w = root.var_copy("w", &wave(&[3, 4], phase));
        let b = root.var_copy("b", &wave(&[3], phase + 1.0));
        (vs, vec![("b".into(), b), ("w".into(), w)])
    }

    fn loss(params: &[(String, Tensor)], step: i64) -> Tensor {
        let x = wave(&[8, 4], step as f64);
        let y = wave(&[8, 3], 0.5 * step as f64) * 2.0;
        let (b, w) = (&params[0].1, &params[1].1);
        (x.matmul(&w.tr()) + b - y).square().mean(tch::Kind::Float)
    }

    fn max_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
        a.iter()
            .zip(b)
            .map(|((_, x), (_, y))| (x - y).abs().max().double_value(&[]))
            .fold(0.0, f64::max)
    }

    #[test]
    fn matches_libtorch_adam_step_for_step() {
        let (vs, reference) = problem(0.3);
        let mut torch = nn::Adam::default().build(&vs, 0.01).unwrap();
        let (_vs2, ours) = problem(0.3);
        let mut adam = Adam::new(
            ours.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
            CFG,
            0.01,
        )
        .unwrap();
        for step in 0..50 {
            torch.zero_grad();
            loss(&reference, step).backward();
            torch.step();
            adam.zero_grad().unwrap();
            loss(&ours, step).backward();
            adam.step().unwrap();
        }
        let diff = max_diff(&reference, &ours);
        assert!(diff < 1e-5, "parameters differ by {diff} after 50 steps");
        assert!(max_diff(&problem(0.3).1, &ours) > 0.1, "the parameters moved");
    }

    /// The CPU's one-pass step (a parameter large enough for two threads, clipping on every other step) against
    /// the same update as libtorch operations over the flat tensors (the path of other devices).
    #[test]
    fn one_pass_step_matches_the_tensor_operations() {
        let shapes: [&[i64]; 2] = [&[3, 40_000], &[7]];
        let (_vs, ours) = {
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let params = shapes
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    (
                        format!("p{i}"),
                        vs.root().var_copy(&format!("p{i}"), &wave(s, i as f64)),
                    )
                })
                .collect::<Vec<_>>();
            (vs, params)
        };
        assert!(
            ours[0].1.numel() >= rlf_shm::tensor::SPLIT_MIN,
            "the large parameter is split between libtorch's threads"
        );
        let mut adam = Adam::new(
            ours.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
            CFG,
            0.01,
        )
        .unwrap();
        let flat = |ts: &[Tensor]| Tensor::cat(&ts.iter().map(|t| t.reshape([-1])).collect::<Vec<_>>(), 0);
        let initial: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| wave(s, i as f64))
            .collect();
        let mut value = flat(&initial);
        let (mut m, mut v) = (value.zeros_like(), value.zeros_like());
        for step in 1..=20 {
            let grads: Vec<Tensor> = shapes
                .iter()
                .map(|s| wave(s, 0.3 * step as f64) * (step % 3) as f64)
                .collect();
            let max_norm = if step % 2 == 0 { 50.0 } else { 0.0 };
            let norm = adam.clip_and_step_with(&grads, max_norm).unwrap();
            let g = flat(&grads);
            let expected = clip(std::slice::from_ref(&g), max_norm);
            assert!(
                (norm - expected).abs() <= 1e-4 * expected.max(1.0),
                "step {step}: norm {norm} against {expected}"
            );
            update(
                (&mut value, &mut m, &mut v),
                &g,
                (CFG.beta1, CFG.beta2, CFG.eps),
                (
                    0.01 / (1.0 - CFG.beta1.powi(step)),
                    (1.0 - CFG.beta2.powi(step)).sqrt(),
                ),
            )
            .unwrap();
        }
        let fused = Tensor::from_slice(&adam.values().unwrap());
        let diff = (&fused - &value).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "the one-pass step differs by {diff}");
        let moved = (&fused - flat(&initial)).abs().max().double_value(&[]);
        assert!(moved > 0.05, "the parameters moved ({moved})");
    }

    /// On the CPU, a parameter without a gradient is left alone (as PyTorch leaves it), and gradients given flat
    /// take the same steps as given per parameter.
    #[test]
    fn undefined_gradients_are_skipped_and_flat_gradients_step_alike() {
        let named = |p: &[(String, Tensor)]| p.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        let values = |t: &Tensor| Vec::<f32>::try_from(t.detach().reshape([-1])).unwrap();
        let (_a, params) = problem(0.2);
        let mut adam = Adam::new(named(&params), CFG, 0.01).unwrap();
        let (b, w) = (values(&params[0].1), values(&params[1].1));
        for step in 1..=5 {
            adam.zero_grad().unwrap();
            (params[1].1.square().sum(tch::Kind::Float) * step as f64).backward();
            assert!(!params[0].1.grad().defined());
            adam.clip_and_step(0.5).unwrap();
        }
        assert_eq!(
            values(&params[0].1),
            b,
            "the parameter without a gradient did not move"
        );
        assert_ne!(values(&params[1].1), w, "the other did");

        let (_x, x) = problem(0.4);
        let (_y, y) = problem(0.4);
        let (mut by_parameter, mut flat) = (
            Adam::new(named(&x), CFG, 0.01).unwrap(),
            Adam::new(named(&y), CFG, 0.01).unwrap(),
        );
        for step in 0..5 {
            let grads: Vec<Tensor> = x.iter().map(|(_, t)| wave(&t.size(), step as f64)).collect();
            let all: Vec<f32> = grads.iter().flat_map(values).collect();
            let a = by_parameter.clip_and_step_with(&grads, 1e6).unwrap();
            let b = flat.clip_and_step_flat(&all, 1e6).unwrap();
            assert!((a - b).abs() <= 1e-12 * a, "step {step}: norms {a} and {b}");
        }
        assert_eq!(max_diff(&x, &y), 0.0);
        assert!(max_diff(&problem(0.4).1, &y) > 0.01, "the parameters moved");
    }

    /// `minimize` takes the same steps as `zero_grad`, `backward` and `clip_and_step`, bit for bit, clipping or
    /// not, and leaves the parameters' `.grad` alone.
    #[test]
    fn minimize_steps_as_backward_then_clip_and_step() {
        let named = |p: &[(String, Tensor)]| p.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        let (_a, stepped) = problem(0.7);
        let (_b, minimized) = problem(0.7);
        let (mut a, mut b) = (
            Adam::new(named(&stepped), CFG, 0.01).unwrap(),
            Adam::new(named(&minimized), CFG, 0.01).unwrap(),
        );
        for step in 0..30 {
            let max_norm = if step % 2 == 0 { 0.1 } else { 0.0 };
            a.zero_grad().unwrap();
            loss(&stepped, step).backward();
            let norm_a = a.clip_and_step(max_norm).unwrap();
            let norm_b = b.minimize(&loss(&minimized, step), max_norm).unwrap();
            assert_eq!(norm_a, norm_b, "step {step}");
        }
        assert_eq!(max_diff(&stepped, &minimized), 0.0);
        assert!(
            max_diff(&problem(0.7).1, &minimized) > 0.1,
            "the parameters moved"
        );
        assert!(minimized.iter().all(|(_, t)| !t.grad().defined()));
    }

    #[test]
    fn restored_moments_continue_exactly_and_missing_ones_restart() {
        let named = |p: &[(String, Tensor)]| p.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        let run = |adam: &mut Adam, params: &[(String, Tensor)], steps: std::ops::Range<i64>| {
            for step in steps {
                adam.zero_grad().unwrap();
                loss(params, step).backward();
                adam.step().unwrap();
            }
        };
        let (_a, original) = problem(0.1);
        let mut adam = Adam::new(named(&original), CFG, 0.01).unwrap();
        run(&mut adam, &original, 0..20);
        let moments = adam.state().unwrap();
        assert_eq!(moments.len(), 4);
        assert!(moments.iter().all(|m| m.name.starts_with(PREFIX)));

        // A second copy of the parameters at the same point, with the saved moments.
        let (_b, resumed) = problem(2.0);
        tch::no_grad(|| {
            for ((_, dst), (_, src)) in resumed.iter().zip(&original) {
                dst.shallow_clone().copy_(src);
            }
        });
        let mut restored = Adam::new(named(&resumed), CFG, 0.01).unwrap();
        assert!(restored.load_state(&moments, adam.steps()).unwrap());
        assert_eq!(restored.steps(), 20);
        run(&mut adam, &original, 20..40);
        run(&mut restored, &resumed, 20..40);
        assert_eq!(max_diff(&original, &resumed), 0.0, "resume continues exactly");

        let mut fresh = Adam::new(named(&resumed), CFG, 0.01).unwrap();
        assert!(!fresh.load_state(&[], 20).unwrap());
        assert_eq!(fresh.steps(), 0);
        assert!(
            fresh.load_state(&moments[..1], 20).is_err(),
            "some moments but not all"
        );
    }
}
