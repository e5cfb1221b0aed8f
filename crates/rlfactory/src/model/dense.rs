//! The actor-critic of plain MLPs computed and differentiated by hand, in Rust, for the APPO learner
//! ([`DenseActorCritic`]): its forward pass and its backward pass from the gradients of the logits and the values,
//! over the parameters as one flat slice (Adam's layout), with ndarray's matrix products and no libtorch call per
//! operation. A CartPole minibatch through autograd is a few hundred libtorch operations, each a dispatch and an
//! allocation (docs/benchmarks.md); here it is sixteen matrix products and loops over the rows.
//!
//! It covers the network [`ActorCritic::dense`](super::ActorCritic::dense) accepts: float32 MLP encoders over the
//! whole observation (shared or separate actor and critic), no recurrent core, and one categorical action (masked by
//! an `action_mask` of the observation or not) or a Gaussian of state-independent standard deviations. Everything
//! else trains through autograd.

use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis};

use crate::config::Nonlinearity;

/// The widest layer the hand-written passes take (the APPO learner's step, and acting): their gain is libtorch's
/// cost per operation, which small products do not hide. Over wider layers the products dominate, and libtorch's
/// (MKL's) are faster than ndarray's. Measured on Connect Four's self-play (release build, 400K moves, Intel Xeon): 64
/// wide, the hand-written step took 8.2 s against autograd's 10.1 s; 128 wide, 11.5 s against 12.8 s; 256 wide (the
/// shipped config), 23.5 s against 21.3 s.
pub(crate) const HAND_WRITTEN_MAX_WIDTH: usize = 128;

/// One linear layer: where its weight `[outputs, inputs]` (row-major) and bias `[outputs]` start in the flat
/// parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DenseLayer {
    pub(crate) weight: usize,
    pub(crate) bias: usize,
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
}

impl DenseLayer {
    /// The flat parameters this layer owns.
    pub(crate) fn len(&self) -> usize {
        self.outputs * (self.inputs + 1)
    }

    fn weight<'a>(&self, params: &'a [f32]) -> ArrayView2<'a, f32> {
        let n = self.outputs * self.inputs;
        ArrayView2::from_shape((self.outputs, self.inputs), &params[self.weight..self.weight + n])
            .expect("a layer's weight lies inside the flat parameters (checked when the layout was built)")
    }

    /// `x Wᵀ + b` for the rows of `x`.
    fn forward(&self, params: &[f32], x: &ArrayView2<'_, f32>) -> Array2<f32> {
        let bias = &params[self.bias..self.bias + self.outputs];
        let mut z = Array2::from_shape_fn((x.nrows(), self.outputs), |(_, j)| bias[j]);
        general_mat_mul(1.0, x, &self.weight(params).t(), 1.0, &mut z);
        z
    }

    /// Writes the gradients of the weight (`dzᵀ x`) and the bias (`Σ dz`) into `grads`, and returns the gradient
    /// of the input (`dz W`) when `input_gradient`.
    fn backward(
        &self,
        params: &[f32],
        x: &ArrayView2<'_, f32>,
        dz: &Array2<f32>,
        grads: &mut [f32],
        input_gradient: bool,
    ) -> Option<Array2<f32>> {
        let n = self.outputs * self.inputs;
        let mut dw = ArrayViewMut2::from_shape(
            (self.outputs, self.inputs),
            &mut grads[self.weight..self.weight + n],
        )
        .expect("a layer's weight lies inside the flat gradients (checked when the layout was built)");
        general_mat_mul(1.0, &dz.t(), x, 0.0, &mut dw);
        let db = dz.sum_axis(Axis(0));
        grads[self.bias..self.bias + self.outputs].copy_from_slice(db.as_slice().unwrap_or(&[]));
        input_gradient.then(|| dz.dot(&self.weight(params)))
    }
}

/// tanh as `x P(x²) / Q(x²)`, both of degree 4, on `x` clamped to ±9 (where float32's tanh is ±1): within 3e-7
/// of `f32::tanh`, in operations a loop vectorises (1.7 ns an element on the 2.5 GHz Xeon, where libm's `tanhf`
/// takes 24 ns). The coefficients are ours: a minimax fit of
/// tanh on [0, 9] by Lawson's iteratively reweighted least squares (40,000 points, 400 iterations).
fn tanh(x: f32) -> f32 {
    let x = x.clamp(-9.0, 9.0);
    let t = x * x;
    let p = (((1.318_408_5e-8 * t + 2.047_172e-5) * t + 3.486_574_6e-3) * t + 0.133_731_91) * t + 0.999_999_9;
    let q = (((7.702_603e-7 * t + 3.271_374e-4) * t + 2.584_195_1e-2) * t + 0.467_064_9) * t + 1.0;
    (x * p / q).clamp(-1.0, 1.0)
}

/// `z` through `nonlinearity`, in place.
fn activate(z: &mut Array2<f32>, nonlinearity: Nonlinearity) {
    let Some(values) = z.as_slice_mut() else {
        return z.mapv_inplace(|v| activation(v, nonlinearity));
    };
    match nonlinearity {
        Nonlinearity::Tanh => values.iter_mut().for_each(|v| *v = tanh(*v)),
        Nonlinearity::Relu => values.iter_mut().for_each(|v| *v = v.max(0.0)),
        Nonlinearity::Elu => values
            .iter_mut()
            .for_each(|v| *v = activation(*v, Nonlinearity::Elu)),
    }
}

fn activation(v: f32, nonlinearity: Nonlinearity) -> f32 {
    match nonlinearity {
        Nonlinearity::Tanh => tanh(v),
        Nonlinearity::Relu => v.max(0.0),
        Nonlinearity::Elu if v > 0.0 => v,
        Nonlinearity::Elu => v.exp_m1(),
    }
}

/// `dh` times the derivative of the activation whose output was `h`, in place: 1 − h² for tanh, 1 where h > 0
/// for ReLU (0 at 0, as libtorch's), 1 where h > 0 else h + 1 (= eᶻ) for ELU.
fn derive(dh: &mut Array2<f32>, h: &Array2<f32>, nonlinearity: Nonlinearity) {
    ndarray::Zip::from(dh).and(h).for_each(|d, &h| {
        *d *= match nonlinearity {
            Nonlinearity::Tanh => 1.0 - h * h,
            Nonlinearity::Relu => f32::from(u8::from(h > 0.0)),
            Nonlinearity::Elu if h > 0.0 => 1.0,
            Nonlinearity::Elu => h + 1.0,
        }
    });
}

/// An MLP's layers, each followed by the nonlinearity.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DenseMlp {
    pub(crate) layers: Vec<DenseLayer>,
    pub(crate) nonlinearity: Nonlinearity,
}

impl DenseMlp {
    /// Each layer's output for the rows of `x` (the last is the MLP's output).
    fn forward(&self, params: &[f32], x: &ArrayView2<'_, f32>) -> Vec<Array2<f32>> {
        let mut outputs: Vec<Array2<f32>> = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let mut z = match outputs.last() {
                Some(h) => layer.forward(params, &h.view()),
                None => layer.forward(params, x),
            };
            activate(&mut z, self.nonlinearity);
            outputs.push(z);
        }
        outputs
    }

    /// Writes the layers' gradients into `grads` from `dh`, the gradient of the output of the forward pass that
    /// returned `outputs` for `x`.
    fn backward(
        &self,
        params: &[f32],
        x: &ArrayView2<'_, f32>,
        outputs: &[Array2<f32>],
        mut dh: Array2<f32>,
        grads: &mut [f32],
    ) {
        for (i, layer) in self.layers.iter().enumerate().rev() {
            derive(&mut dh, &outputs[i], self.nonlinearity);
            let input = if i == 0 { x.view() } else { outputs[i - 1].view() };
            match layer.backward(params, &input, &dh, grads, i > 0) {
                Some(below) => dh = below,
                None => break,
            }
        }
    }

    /// The MLP's output in a forward pass that returned `outputs` for `x` (`x` itself without layers).
    fn output<'a>(&self, outputs: &'a [Array2<f32>], x: ArrayView2<'a, f32>) -> ArrayView2<'a, f32> {
        outputs.last().map_or(x, Array2::view)
    }
}

/// The action distribution the action head's outputs parameterise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DenseHead {
    /// A categorical over the outputs as logits; with `mask`, the `(offset, length)` of the `action_mask` in the
    /// raw observation, whose values at most 0.5 forbid their action (its logit is set to a billion below zero).
    Categorical { mask: Option<(usize, usize)> },
    /// Independent Gaussians of the outputs as means, with state-independent log standard deviations (one per
    /// output) starting at this offset of the flat parameters.
    Gaussian { log_std: usize },
}

/// The actor-critic's layers in the flat parameters: the actor's MLP, the critic's (none when the critic reads the
/// actor's), the action head (the logits, or the means) and its distribution, and the value head.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseActorCritic {
    pub(crate) actor: DenseMlp,
    pub(crate) critic: Option<DenseMlp>,
    pub(crate) action_out: DenseLayer,
    pub(crate) head: DenseHead,
    pub(crate) value_out: DenseLayer,
}

/// A forward pass of [`DenseActorCritic`] over a minibatch: the logits `[n, actions]`, the values `[n]` and what
/// the backward pass needs.
#[derive(Debug)]
pub struct DenseForward {
    /// The action head's output, a row per observation.
    pub logits: Array2<f32>,
    /// The value head's output (normalised units), one per observation.
    pub values: Vec<f32>,
    actor: Vec<Array2<f32>>,
    critic: Vec<Array2<f32>>,
}

impl DenseActorCritic {
    /// How many flat parameters the layers cover (each exactly once).
    pub(crate) fn len(&self) -> usize {
        let mlp = |m: &DenseMlp| m.layers.iter().map(DenseLayer::len).sum::<usize>();
        let log_std = match self.head {
            DenseHead::Categorical { .. } => 0,
            DenseHead::Gaussian { .. } => self.action_out.outputs,
        };
        mlp(&self.actor)
            + self.critic.as_ref().map_or(0, mlp)
            + self.action_out.len()
            + log_std
            + self.value_out.len()
    }

    /// The most outputs of any of its layers.
    pub(crate) fn widest_layer(&self) -> usize {
        let heads = [&self.action_out, &self.value_out];
        let encoders = self
            .actor
            .layers
            .iter()
            .chain(self.critic.iter().flat_map(|c| &c.layers));
        encoders.chain(heads).map(|l| l.outputs).max().unwrap_or(0)
    }

    /// The logits and the (normalised) values of the rows of `obs` under `params`. With `two_threads`, a separate
    /// critic runs on a second thread beside the actor.
    pub fn forward(&self, params: &[f32], obs: &ArrayView2<'_, f32>, two_threads: bool) -> DenseForward {
        let actor = || self.actor.forward(params, obs);
        let (actor, critic) = match &self.critic {
            Some(critic) => beside(two_threads, actor, || critic.forward(params, obs)),
            None => (actor(), Vec::new()),
        };
        let (logits, values) = {
            let actor_h = self.actor.output(&actor, obs.view());
            let critic_h = match &self.critic {
                Some(c) => c.output(&critic, obs.view()),
                None => actor_h.view(),
            };
            (
                self.action_out.forward(params, &actor_h),
                self.value_out
                    .forward(params, &critic_h)
                    .into_raw_vec_and_offset()
                    .0,
            )
        };
        DenseForward {
            logits,
            values,
            actor,
            critic,
        }
    }

    /// Every parameter's gradient, flat, from the gradients of the logits and the values of the forward pass
    /// `fwd` over `obs`. With `two_threads`, a separate critic's gradients are computed on a second thread beside
    /// the actor's.
    pub fn backward(
        &self,
        params: &[f32],
        obs: &ArrayView2<'_, f32>,
        fwd: &DenseForward,
        (dlogits, dvalues): (&Array2<f32>, &[f32]),
        two_threads: bool,
    ) -> Vec<f32> {
        let dvalues = ArrayView2::from_shape((dvalues.len(), 1), dvalues)
            .expect("one value gradient per row")
            .to_owned();
        let actor_h = self.actor.output(&fwd.actor, obs.view());
        // The actor's gradients, with those of a shared encoder's value head folded in.
        let actor = |shared_value: bool| {
            let mut grads = vec![0.0; params.len()];
            let mut dh = self
                .action_out
                .backward(params, &actor_h, dlogits, &mut grads, true)
                .expect("asked for the input's gradient");
            if shared_value {
                dh += &self
                    .value_out
                    .backward(params, &actor_h, &dvalues, &mut grads, true)
                    .expect("asked for the input's gradient");
            }
            self.actor.backward(params, obs, &fwd.actor, dh, &mut grads);
            grads
        };
        let Some(critic) = &self.critic else {
            return actor(true);
        };
        let critic = || {
            let mut grads = vec![0.0; params.len()];
            let critic_h = critic.output(&fwd.critic, obs.view());
            let dh = self
                .value_out
                .backward(params, &critic_h, &dvalues, &mut grads, true)
                .expect("asked for the input's gradient");
            critic.backward(params, obs, &fwd.critic, dh, &mut grads);
            grads
        };
        let (mut grads, theirs) = beside(two_threads, || actor(false), critic);
        // Each parameter is the actor's or the critic's: the other's gradient of it is 0.
        grads.iter_mut().zip(theirs).for_each(|(g, t)| *g += t);
        grads
    }
}

/// `a()` on this thread and `b()` on another, at once, with `two_threads` (a panic of `b` goes on here); else one
/// after the other.
fn beside<A: Send, B: Send>(
    two_threads: bool,
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    if !two_threads {
        return (a(), b());
    }
    std::thread::scope(|scope| {
        let b = scope.spawn(b);
        let a = a();
        (
            a,
            b.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rational_tanh_is_tanh() {
        for i in -12_000..12_000 {
            let x = i as f32 * 1e-3;
            assert!(
                (tanh(x) - x.tanh()).abs() < 3e-7,
                "tanh({x}) = {} not {}",
                tanh(x),
                x.tanh()
            );
        }
        assert_eq!((tanh(50.0), tanh(-50.0)), (1.0, -1.0));
    }
}
