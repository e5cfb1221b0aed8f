//! The encoders every network starts with ([`Encoder`]): the MLP of `--encoder_mlp_layers` (differentiated by hand
//! when its layers are ReLU, as the DQN learner does), convolutions then an MLP for an image, or Sample Factory's
//! encoders by observation part (`--encoder_conv_architecture`): each part of a Dict observation
//! (or the whole observation) gets its own encoder, and their outputs are concatenated. An image (a `Box` of three
//! dimensions) goes through a named convolutional network, then the MLP of `--encoder_conv_mlp_layers`; any other
//! part through the MLP of `--encoder_mlp_layers`.
//!
//! The architectures, as Sample Factory defines them (unpadded convolutions unless said):
//! - `convnet_simple`: 32 filters 8×8 stride 4, 64 4×4 stride 2, 128 3×3 stride 2 (its Atari network);
//! - `convnet_impala`: 16 8×8 stride 4, 32 4×4 stride 2;
//! - `convnet_atari`: 32 8×8 stride 4, 64 4×4 stride 2, 64 3×3 stride 1 (the DQN paper's);
//! - `resnet_impala`: IMPALA's residual network: three stages of 16, 32 and 32 channels, each a 3×3 convolution,
//!   a 3×3 max-pool of stride 2 and two residual blocks (activation, 3×3 convolution, activation, 3×3
//!   convolution, plus the input), all padded to keep their size, then an activation.
//!
//! Each convolution of a `convnet_*` is followed by `--nonlinearity`. Images are `(H, W, C)` (Gymnasium's
//! convention) unless their first dimension is smaller than both others, as in a frame stack `(4, 84, 84)`: then
//! `(C, H, W)`.

use tch::{nn, Kind, Tensor};

use rlf_env::Space;

use super::custom::{registered_encoder, EncoderNet};

use crate::config::{ConvArchitecture, ModelConfig, Nonlinearity, PolicyInitialization};
use crate::error::{Result, RlfError};

/// tanh(z) as 2σ(2z) − 1. ATen's `tanh` on CPU calls MKL's high-accuracy vector tanh, which
/// on this AMD EPYC takes ~2 ns per element (a fifth of a CartPole PPO step); ATen's own
/// vectorised sigmoid and three element-wise ops cost about half as much (a PPO step at batch
/// 1024: 2.45 ms -> 2.23 ms). Same function, within 1e-6.
pub(super) fn tanh(z: &Tensor) -> Tensor {
    (z * 2.0).sigmoid() * 2.0 - 1.0
}

pub(super) fn linear(
    path: nn::Path<'_>,
    inputs: i64,
    outputs: i64,
    init: PolicyInitialization,
    gain: f64,
) -> nn::Linear {
    let config = match init {
        PolicyInitialization::Orthogonal => nn::LinearConfig {
            ws_init: nn::Init::Orthogonal { gain },
            bs_init: Some(nn::Init::Const(0.0)),
            bias: true,
        },
        PolicyInitialization::TorchDefault => nn::LinearConfig::default(),
    };
    nn::linear(path, inputs, outputs, config)
}

/// `z` through `nonlinearity`.
pub(super) fn activate(z: &Tensor, nonlinearity: Nonlinearity) -> Tensor {
    match nonlinearity {
        Nonlinearity::Elu => z.elu(),
        Nonlinearity::Relu => z.relu(),
        Nonlinearity::Tanh => tanh(z),
    }
}

/// A convolution of `c_in` to `c_out` channels, `kernel` × `kernel`, with orthogonal weights (gain √2) and zero
/// biases under `--policy_initialization orthogonal`.
pub(super) fn conv2d(
    path: nn::Path<'_>,
    c_in: i64,
    c_out: i64,
    kernel: i64,
    stride: i64,
    padding: i64,
    init: PolicyInitialization,
) -> Result<Conv> {
    let config = nn::ConvConfig {
        stride,
        padding,
        bs_init: nn::Init::Const(0.0),
        ..Default::default()
    };
    let device = path.device();
    let mut layer = nn::conv2d(path, c_in, c_out, kernel, config);
    if init == PolicyInitialization::Orthogonal {
        // tch's orthogonal initialiser returns the flattened 2-D matrix for a 4-D shape: draw it flat and copy it
        // in as the kernel.
        let flat = nn::init::f_init(
            nn::Init::Orthogonal { gain: 2f64.sqrt() },
            &[c_out, c_in * kernel * kernel],
            device,
            Kind::Float,
        )?;
        tch::no_grad(|| layer.ws.f_copy_(&flat.f_view_as(&layer.ws)?))?;
    }
    Ok(Conv {
        layer,
        stride,
        padding,
    })
}

/// A convolution with the stride and padding it was made with (tch keeps its own private), so that it can also
/// multiply in bfloat16.
pub(super) struct Conv {
    layer: nn::Conv2D,
    stride: i64,
    padding: i64,
}

impl Conv {
    /// `x` convolved in `x`'s kind: a bfloat16 input with the weights cast to bfloat16 (autograd carries the
    /// gradients back through the casts to the float32 weights).
    fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_divided(x, 1.0)
    }

    /// `x / by` convolved, the division folded into the weights: a few thousand values divided instead of every
    /// value of a batch of images (a minibatch of Atari frames: 7.2M).
    fn forward_divided(&self, x: &Tensor, by: f64) -> Tensor {
        let (w, b) = (divided(&self.layer.ws, by), self.layer.bs.as_ref());
        x.conv2d(
            &same_kind(&w, x),
            b.map(|b| same_kind(b, x)),
            [self.stride; 2],
            [self.padding; 2],
            [1; 2],
            1,
        )
    }
}

/// `t / by`; `t` itself when `by` is 1.
fn divided(t: &Tensor, by: f64) -> Tensor {
    if by == 1.0 {
        t.shallow_clone()
    } else {
        t / by
    }
}

/// `t` in `like`'s kind (cast if it differs).
fn same_kind(t: &Tensor, like: &Tensor) -> Tensor {
    if t.kind() == like.kind() {
        t.shallow_clone()
    } else {
        t.to_kind(like.kind())
    }
}

/// `x` through `layer` in `x`'s kind, as [`Conv::forward`].
fn linear_as_input(x: &Tensor, layer: &nn::Linear) -> Tensor {
    x.linear(
        &same_kind(&layer.ws, x),
        layer.bs.as_ref().map(|b| same_kind(b, x)),
    )
}

/// The output side of a convolution or pooling over `size` values.
fn out_size(size: i64, kernel: i64, stride: i64, padding: i64) -> i64 {
    (size + 2 * padding - kernel).div_euclid(stride) + 1
}

enum Op {
    /// A convolution then the activation (`convnet_*`).
    ConvAct(Conv),
    /// A padded convolution alone, then a 3×3 max-pool of stride 2 (a `resnet_impala` stage's start).
    ConvPool(Conv),
    /// A residual block.
    Residual(Conv, Conv),
    /// The activation.
    Act,
}

/// A named convolutional network over an image, then its MLP.
struct ImageNet {
    /// `(height, width, channels)`, and whether the flat values are channels-first.
    shape: [i64; 3],
    channels_first: bool,
    ops: Vec<Op>,
    nonlinearity: Nonlinearity,
    mlp: Vec<nn::Linear>,
    /// `--matmul_precision medium`: the convolutions and the MLP multiply in bfloat16, batches of every size.
    bf16: bool,
}

impl ImageNet {
    fn new(path: &nn::Path<'_>, dims: &[usize], cfg: &ModelConfig) -> Result<(Self, i64)> {
        let d: Vec<i64> = dims.iter().map(|&v| v as i64).collect();
        let channels_first = d[0] < d[1].min(d[2]);
        let [mut h, mut w, mut c] = if channels_first {
            [d[1], d[2], d[0]]
        } else {
            [d[0], d[1], d[2]]
        };
        let shape = [h, w, c];
        let init = cfg.policy_initialization;
        let mut ops = Vec::new();
        let too_small = |h: i64, w: i64| -> Result<()> {
            if h < 1 || w < 1 {
                return Err(RlfError::UnsupportedSpace(format!(
                    "--encoder_conv_architecture {}: an image of {}x{} is too small for it (use --encoder_conv_layers, \
                     e.g. 16x3, for small images)",
                    cfg.encoder_conv_architecture.name(),
                    shape[0],
                    shape[1]
                )));
            }
            Ok(())
        };
        match cfg.encoder_conv_architecture {
            ConvArchitecture::None => {
                return Err(RlfError::Config(
                    "an image encoder needs --encoder_conv_architecture".into(),
                ))
            }
            ConvArchitecture::ResnetImpala => {
                for (i, channels) in [16, 32, 32].into_iter().enumerate() {
                    ops.push(Op::ConvPool(conv2d(
                        path / format!("conv{i}"),
                        c,
                        channels,
                        3,
                        1,
                        1,
                        init,
                    )?));
                    (h, w, c) = (out_size(h, 3, 2, 1), out_size(w, 3, 2, 1), channels);
                    too_small(h, w)?;
                    for b in 0..2 {
                        let block = path / format!("res{i}_{b}");
                        ops.push(Op::Residual(
                            conv2d(&block / "conv0", c, c, 3, 1, 1, init)?,
                            conv2d(&block / "conv1", c, c, 3, 1, 1, init)?,
                        ));
                    }
                }
                ops.push(Op::Act);
            }
            arch => {
                let filters: &[(i64, i64, i64)] = match arch {
                    ConvArchitecture::ConvnetImpala => &[(16, 8, 4), (32, 4, 2)],
                    ConvArchitecture::ConvnetAtari => &[(32, 8, 4), (64, 4, 2), (64, 3, 1)],
                    _ => &[(32, 8, 4), (64, 4, 2), (128, 3, 2)],
                };
                for (i, &(channels, kernel, stride)) in filters.iter().enumerate() {
                    ops.push(Op::ConvAct(conv2d(
                        path / format!("conv{i}"),
                        c,
                        channels,
                        kernel,
                        stride,
                        0,
                        init,
                    )?));
                    (h, w, c) = (
                        out_size(h, kernel, stride, 0),
                        out_size(w, kernel, stride, 0),
                        channels,
                    );
                    too_small(h, w)?;
                }
            }
        }
        let mut size = h * w * c;
        let mut mlp = Vec::new();
        for (i, &out) in cfg.encoder_conv_mlp_layers.0.iter().enumerate() {
            mlp.push(linear(path / format!("fc{i}"), size, out, init, 2f64.sqrt()));
            size = out;
        }
        Ok((
            Self {
                shape,
                channels_first,
                ops,
                nonlinearity: cfg.nonlinearity,
                mlp,
                bf16: cfg.matmul_precision.bf16(),
            },
            size,
        ))
    }

    fn layout(&self) -> ImageLayout {
        ImageLayout {
            shape: self.shape,
            channels_first: self.channels_first,
            kind: if self.bf16 { Kind::BFloat16 } else { Kind::Float },
        }
    }

    /// `x / scale`, `x` `[n, H * W * C]` flat images (floats, or the bytes they were stored as), through the
    /// network (the division folded into the first convolution's weights); float32 out. The convolutions see the
    /// images channels-last in memory (NHWC strides under NCHW's shape), which oneDNN convolves forward and
    /// backward about 1.4 times as fast as channels-first (convnet_simple at batch 256 on 2 threads,
    /// docs/benchmarks.md), as [`ImageLayout::lay_out`] makes them. `x` may also be images laid out so already
    /// (`[n, H, W, C]`): a learner lays a dataset out once for all its minibatches.
    fn forward(&self, x: &Tensor, scale: f64) -> Tensor {
        let mut y = if x.dim() == 4 {
            x.shallow_clone()
        } else {
            self.layout().lay_out(x)
        }
        .permute([0, 3, 1, 2]);
        let act = |z: &Tensor| activate(z, self.nonlinearity);
        // The division by `scale` still to be applied: by the first op.
        let mut by = scale;
        for op in &self.ops {
            y = match op {
                Op::ConvAct(conv) => act(&conv.forward_divided(&y, by)),
                Op::ConvPool(conv) => {
                    conv.forward_divided(&y, by)
                        .max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)
                }
                Op::Residual(a, b) => {
                    let y = divided(&y, by);
                    b.forward(&act(&a.forward(&act(&y)))) + &y
                }
                Op::Act => act(&divided(&y, by)),
            };
            by = 1.0;
        }
        let mut h = y.flatten(1, -1);
        for layer in &self.mlp {
            h = act(&linear_as_input(&h, layer));
        }
        h.to_kind(Kind::Float)
    }
}

/// How an image network reads its images: `[n, H, W, C]`, contiguous (channels-last in memory), in the kind its
/// convolutions multiply in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ImageLayout {
    shape: [i64; 3],
    channels_first: bool,
    kind: Kind,
}

impl ImageLayout {
    /// `x`, `[n, H * W * C]` flat images (floats, or the bytes they were stored as), laid out so: channels-first
    /// ones (stacked Atari frames) and bytes are copied, converted in the same pass; float channels-last images of
    /// the network's kind are a view of `x`. Byte values convert exactly (bfloat16 holds every integer to 256).
    pub(super) fn lay_out(&self, x: &Tensor) -> Tensor {
        self.lay_out_into(x, &mut None)
    }

    /// As [`lay_out`](Self::lay_out), a copy made in `buffer` when it has the copy's size, kind and device, else
    /// in new memory that `buffer` then keeps; the result shares `buffer`'s memory.
    pub(super) fn lay_out_into(&self, x: &Tensor, buffer: &mut Option<Tensor>) -> Tensor {
        let [h, w, c] = self.shape;
        let nhwc = if self.channels_first {
            x.reshape([-1, c, h, w]).permute([0, 2, 3, 1])
        } else {
            x.reshape([-1, h, w, c])
        };
        if nhwc.kind() == self.kind && nhwc.is_contiguous() {
            return nhwc;
        }
        let fits =
            |b: &Tensor| b.size() == nhwc.size() && b.kind() == self.kind && b.device() == nhwc.device();
        let mut copy = match buffer.take().filter(fits) {
            Some(b) => b,
            None => Tensor::empty(nhwc.size(), (self.kind, nhwc.device())),
        };
        copy.copy_(&nhwc);
        *buffer = Some(copy.shallow_clone());
        copy
    }
}

enum PartNet {
    Image(ImageNet),
    Vector(Vec<nn::Linear>),
}

/// One encoder per part of the observation, outputs concatenated.
pub(super) struct PartEncoders {
    /// Each part's `(offset, length)` in the flat observation and its network.
    parts: Vec<(i64, i64, PartNet)>,
    nonlinearity: Nonlinearity,
}

impl PartEncoders {
    /// The encoders of `space`'s parts (at least one image among them), and their total output size.
    pub(super) fn new(path: &nn::Path<'_>, space: &Space, cfg: &ModelConfig) -> Result<(Self, i64)> {
        let parts: Vec<(String, &Space)> = match space {
            Space::Dict(parts) => parts.iter().map(|(k, s)| (k.clone(), s)).collect(),
            other => vec![("obs".to_owned(), other)],
        };
        let (mut offset, mut total, mut nets) = (0_i64, 0_i64, Vec::new());
        for (key, part) in parts {
            let len = part.flat_dim() as i64;
            let path = path / key.as_str();
            let (net, size) = match part {
                Space::Box(b) if b.shape().len() == 3 => {
                    let (net, size) = ImageNet::new(&path, b.shape(), cfg)?;
                    (PartNet::Image(net), size)
                }
                _ => {
                    let (mut layers, mut size) = (Vec::new(), len);
                    for (i, &out) in cfg.encoder_mlp_layers.0.iter().enumerate() {
                        layers.push(linear(
                            &path / format!("fc{i}"),
                            size,
                            out,
                            cfg.policy_initialization,
                            2f64.sqrt(),
                        ));
                        size = out;
                    }
                    (PartNet::Vector(layers), size)
                }
            };
            if len > 0 {
                nets.push((offset, len, net));
                total += size;
            }
            offset += len;
        }
        if !nets.iter().any(|(_, _, n)| matches!(n, PartNet::Image(_))) {
            return Err(RlfError::UnsupportedSpace(format!(
                "--encoder_conv_architecture {} needs an image in the observation (a Box of three dimensions); {space} \
                 has none",
                cfg.encoder_conv_architecture.name()
            )));
        }
        Ok((
            Self {
                parts: nets,
                nonlinearity: cfg.nonlinearity,
            },
            total,
        ))
    }

    /// Whether every part is an image, whose network takes the bytes an image is stored as.
    fn takes_bytes(&self) -> bool {
        self.parts
            .iter()
            .all(|(_, _, net)| matches!(net, PartNet::Image(_)))
    }

    /// The layout of the observation when it is one image, the whole of it.
    fn layout(&self) -> Option<ImageLayout> {
        match self.parts.as_slice() {
            [(0, _, PartNet::Image(image))] => Some(image.layout()),
            _ => None,
        }
    }

    /// `x / scale` through each part's encoder, outputs concatenated; `x` one image [laid
    /// out](Self::layout) already (`[n, H, W, C]`) when the observation is that.
    pub(super) fn forward(&self, x: &Tensor, scale: f64) -> Tensor {
        if let ([(_, _, PartNet::Image(image))], 4) = (self.parts.as_slice(), x.dim()) {
            return image.forward(x, scale);
        }
        let outputs: Vec<Tensor> = self
            .parts
            .iter()
            .map(|(offset, len, net)| {
                let part = x.narrow(-1, *offset, *len);
                match net {
                    PartNet::Image(image) => image.forward(&part, scale),
                    PartNet::Vector(layers) => layers.iter().fold(divided(&part, scale), |h, layer| {
                        activate(&h.apply(layer), self.nonlinearity)
                    }),
                }
            })
            .collect();
        Tensor::cat(&outputs, -1)
    }
}

/// With `--matmul_precision medium`, batches of fewer rows (an inference worker's few envs) still multiply in
/// float32: casting the weights for each batch would cost more than the bfloat16 product saves. (A Q-network acts
/// through [`Mlp::forward_acting`], which keeps the casts while the weights do not change.)
const BF16_MIN_ROWS: i64 = 64;

pub(super) struct Mlp {
    layers: Vec<nn::Linear>,
    nonlinearity: Nonlinearity,
    /// `--matmul_precision medium`: each layer multiplies in bfloat16.
    bf16: bool,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Tensor {
        if self.bf16 && x.size()[0] >= BF16_MIN_ROWS {
            // Autograd carries the gradients back through the casts to the float32 weights.
            let half = |t: &Tensor| t.to_kind(Kind::BFloat16);
            return self.forward_half(
                x,
                self.layers.iter().map(|l| (half(&l.ws), l.bs.as_ref().map(half))),
            );
        }
        self.layers.iter().fold(x.shallow_clone(), |h, layer| {
            activate(&h.apply(layer), self.nonlinearity)
        })
    }

    /// The layers multiplying in bfloat16 with `weights` (each layer's weight and bias as cast).
    fn forward_half(&self, x: &Tensor, weights: impl Iterator<Item = (Tensor, Option<Tensor>)>) -> Tensor {
        let mut h = x.shallow_clone();
        let last = self.layers.len().saturating_sub(1);
        for (i, (w, b)) in weights.enumerate() {
            let z = h.to_kind(Kind::BFloat16).linear(&w, b.as_ref());
            h = if i < last && self.nonlinearity == Nonlinearity::Relu {
                // The next layer multiplies in bfloat16: ReLU there is exact, without the round trip.
                z.relu()
            } else {
                activate(&z.to_kind(Kind::Float), self.nonlinearity)
            };
        }
        h
    }

    /// [`Mlp::forward`] to act, outside autograd: under `--matmul_precision medium` batches of every size multiply
    /// in bfloat16, with the weights as cast into `casts` while their version counters are unchanged (every in-place
    /// write to these tensors moves them, as every load of published weights does; a write through another view of
    /// their memory, as Adam's flat buffer, does not: its owner clears `casts`), instead of casting them per batch.
    pub(super) fn forward_acting(&self, x: &Tensor, casts: &mut Option<ActingCasts>) -> Result<Tensor> {
        if !self.bf16 {
            return Ok(self.forward(x));
        }
        let mut versions = Vec::with_capacity(2 * self.layers.len());
        for layer in &self.layers {
            versions.push(layer.ws.f_internal_version()?);
            if let Some(b) = &layer.bs {
                versions.push(b.f_internal_version()?);
            }
        }
        if casts.as_ref().is_none_or(|c| c.versions != versions) {
            let half = |t: &Tensor| t.f_detach()?.f_to_kind(Kind::BFloat16);
            let weights = self
                .layers
                .iter()
                .map(|l| Ok((half(&l.ws)?, l.bs.as_ref().map(half).transpose()?)))
                .collect::<Result<Vec<_>>>()?;
            *casts = Some(ActingCasts { versions, weights });
        }
        let weights = casts
            .iter()
            .flat_map(|c| &c.weights)
            .map(|(w, b)| (w.shallow_clone(), b.as_ref().map(Tensor::shallow_clone)));
        Ok(self.forward_half(x, weights))
    }
}

/// An MLP's weights and biases cast to bfloat16 for acting ([`Mlp::forward_acting`]), with the version counters of
/// the float32 tensors they were cast from.
#[derive(Debug, Default)]
pub(super) struct ActingCasts {
    versions: Vec<i64>,
    weights: Vec<(Tensor, Option<Tensor>)>,
}

/// What [`Mlp::forward_saved`] keeps for [`Mlp::backward`], per layer: its input and weights as they were
/// multiplied (bfloat16 casts or the float32 tensors), and its pre-activation (bfloat16 between bfloat16 layers,
/// else float32).
pub(super) struct MlpActivations {
    inputs: Vec<Tensor>,
    weights: Vec<Tensor>,
    biases: Vec<Option<Tensor>>,
    pre: Vec<Tensor>,
    half: bool,
}

impl Mlp {
    /// Whether [`Mlp::backward`] differentiates this MLP (ReLU layers; others go through autograd).
    pub(super) fn differentiable_by_hand(&self) -> bool {
        self.nonlinearity == Nonlinearity::Relu
    }

    /// [`Mlp::forward`] of an MLP of ReLU layers (see [`Mlp::differentiable_by_hand`]), with the same products and
    /// casts, keeping what [`Mlp::backward`] needs; called under `no_grad`.
    pub(super) fn forward_saved(&self, x: &Tensor) -> Result<(Tensor, MlpActivations)> {
        let half = self.bf16 && x.size()[0] >= BF16_MIN_ROWS;
        let cast = |t: &Tensor| -> Result<Tensor> {
            Ok(if half {
                t.f_to_kind(Kind::BFloat16)?
            } else {
                t.shallow_clone()
            })
        };
        let mut saved = MlpActivations {
            inputs: Vec::with_capacity(self.layers.len()),
            weights: Vec::with_capacity(self.layers.len()),
            biases: Vec::with_capacity(self.layers.len()),
            pre: Vec::with_capacity(self.layers.len()),
            half,
        };
        let mut h = x.shallow_clone();
        let last = self.layers.len().saturating_sub(1);
        for (i, layer) in self.layers.iter().enumerate() {
            let (input, weight) = (cast(&h)?, cast(&layer.ws)?);
            let bias = layer.bs.as_ref().map(cast).transpose()?;
            let mut z = input.f_linear(&weight, bias.as_ref())?;
            if i == last {
                z = z.f_to_kind(Kind::Float)?;
            }
            h = z.f_relu()?;
            saved.inputs.push(input);
            saved.weights.push(weight);
            saved.biases.push(bias);
            saved.pre.push(z);
        }
        Ok((h, saved))
    }

    /// [`Mlp::forward`] of `x` (ReLU layers) with the weights as the [`Mlp::forward_saved`] that kept `saved`
    /// multiplied them, not cast again: the same products for a batch of as many rows.
    pub(super) fn forward_like(&self, saved: &MlpActivations, x: &Tensor) -> Result<Tensor> {
        if saved.half != (self.bf16 && x.size()[0] >= BF16_MIN_ROWS) {
            return Ok(self.forward(x));
        }
        let mut h = x.shallow_clone();
        let last = saved.weights.len().saturating_sub(1);
        for (i, (weight, bias)) in saved.weights.iter().zip(&saved.biases).enumerate() {
            let input = if saved.half {
                h.f_to_kind(Kind::BFloat16)?
            } else {
                h
            };
            let z = input.f_linear(weight, bias.as_ref())?;
            h = if i == last { z.f_to_kind(Kind::Float)? } else { z }.f_relu()?;
        }
        Ok(h)
    }

    /// The gradients of the layers' weights and biases (float32, layer by layer) from `grad`, the gradient of the
    /// output of the [`Mlp::forward_saved`] that kept `saved`. Products and their casts are autograd's for
    /// [`Mlp::forward`]; bias gradients are summed in float32.
    pub(super) fn backward(
        &self,
        saved: &MlpActivations,
        grad: &Tensor,
    ) -> Result<Vec<(Tensor, Option<Tensor>)>> {
        let mut grads = Vec::with_capacity(self.layers.len());
        let mut dh = grad.shallow_clone();
        for (i, layer) in self.layers.iter().enumerate().rev() {
            // ReLU's derivative: the gradient where the pre-activation is positive (in bfloat16 below the last
            // layer of a bfloat16 MLP, where `dh` came out of a bfloat16 product: exact).
            let dz = saved.pre[i].f_threshold_backward(&dh, 0.0)?;
            let dz_product = if saved.half {
                dz.f_to_kind(Kind::BFloat16)?
            } else {
                dz.shallow_clone()
            };
            let dw = dz_product
                .f_tr()?
                .f_mm(&saved.inputs[i])?
                .f_to_kind(Kind::Float)?;
            let db = match layer.bs {
                Some(_) => Some(dz.f_sum_dim_intlist(0, false, Kind::Float)?),
                None => None,
            };
            if i > 0 {
                dh = dz_product.f_mm(&saved.weights[i])?;
            }
            grads.push((dw, db));
        }
        grads.reverse();
        Ok(grads)
    }

    /// Each layer's weight and bias, in layer order.
    pub(super) fn parameters(&self) -> impl Iterator<Item = &nn::Linear> {
        self.layers.iter()
    }

    /// The activation after each layer.
    pub(super) fn nonlinearity(&self) -> Nonlinearity {
        self.nonlinearity
    }

    /// Whether the layers multiply in float32 (not `--matmul_precision medium`).
    pub(super) fn in_float32(&self) -> bool {
        !self.bf16
    }
}

/// Where the image of an observation lies in its flat form: a Box of shape `(H, W, C)`, the
/// whole observation or one part of a Dict, and the ranges `(offset, length)` of the other parts.
#[derive(Debug, Clone, PartialEq)]
struct ImagePart {
    offset: i64,
    shape: [i64; 3],
    rest: Vec<(i64, i64)>,
}

impl ImagePart {
    /// The image part of `space`, for `--encoder_conv_layers`; an observation without exactly one
    /// is an error.
    fn of(space: &Space) -> Result<Self> {
        let parts: Vec<(&Space, i64)> = match space {
            Space::Dict(parts) => {
                let mut offset = 0;
                parts
                    .iter()
                    .map(|(_, part)| {
                        let at = offset;
                        offset += part.flat_dim() as i64;
                        (part, at)
                    })
                    .collect()
            }
            other => vec![(other, 0)],
        };
        let image = |s: &Space| match s {
            Space::Box(b) => <[usize; 3]>::try_from(b.shape()).ok(),
            _ => None,
        };
        let images: Vec<usize> = (0..parts.len())
            .filter(|&i| image(parts[i].0).is_some())
            .collect();
        let [k] = images[..] else {
            return Err(RlfError::UnsupportedSpace(format!(
                "--encoder_conv_layers needs one image in the observation (a Box of shape (H, W, C)); \
                 {space} has {}",
                images.len()
            )));
        };
        let shape = image(parts[k].0).map_or([0; 3], |d| d.map(|v| v as i64));
        Ok(Self {
            offset: parts[k].1,
            shape,
            rest: parts
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != k)
                .map(|(_, &(part, at))| (at, part.flat_dim() as i64))
                .filter(|&(_, len)| len > 0)
                .collect(),
        })
    }
}

/// The convolutions of an encoder over the image part of the observation, each followed by a
/// ReLU; their flattened output is concatenated with the observation's other parts.
pub(super) struct Convs {
    layers: Vec<Conv>,
    image: ImagePart,
    /// `--matmul_precision medium`: the convolutions multiply in bfloat16, batches of every size.
    bf16: bool,
}

impl Convs {
    /// The convolutions `cfg` asks for over `image`, and their output size (with the other parts).
    fn new(path: &nn::Path<'_>, image: ImagePart, cfg: &ModelConfig) -> Result<(Self, i64)> {
        let [mut h, mut w, mut c] = image.shape;
        let mut layers = Vec::with_capacity(cfg.encoder_conv_layers.0.len());
        for (i, l) in cfg.encoder_conv_layers.0.iter().enumerate() {
            let padding = if l.stride == 1 { l.kernel / 2 } else { 0 };
            let conv = conv2d(
                path / format!("conv{i}"),
                c,
                l.channels,
                l.kernel,
                l.stride,
                padding,
                cfg.policy_initialization,
            )?;
            layers.push(conv);
            h = (h + 2 * padding - l.kernel) / l.stride + 1;
            w = (w + 2 * padding - l.kernel) / l.stride + 1;
            c = l.channels;
            if h < 1 || w < 1 {
                return Err(RlfError::UnsupportedSpace(format!(
                    "--encoder_conv_layers {}: convolution {i} leaves nothing of the {}x{} image",
                    cfg.encoder_conv_layers, image.shape[0], image.shape[1]
                )));
            }
        }
        let rest: i64 = image.rest.iter().map(|&(_, len)| len).sum();
        let bf16 = cfg.matmul_precision.bf16();
        Ok((Self { layers, image, bf16 }, h * w * c + rest))
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let [h, w, c] = self.image.shape;
        let mut y = x
            .narrow(-1, self.image.offset, h * w * c)
            .reshape([-1, h, w, c])
            .permute([0, 3, 1, 2]);
        if self.bf16 {
            y = y.to_kind(Kind::BFloat16);
        }
        for layer in &self.layers {
            y = layer.forward(&y).relu();
        }
        let mut parts = vec![y.flatten(1, -1).to_kind(Kind::Float)];
        parts.extend(self.image.rest.iter().map(|&(at, len)| x.narrow(-1, at, len)));
        Tensor::cat(&parts, -1)
    }
}

/// An encoder: an MLP over the flat observation; convolutions over its image part (`--encoder_conv_layers`), then
/// the MLP; or one encoder per part of the observation (`--encoder_conv_architecture`, [`PartEncoders`]). Its
/// input is divided by `--obs_scale` first.
pub(super) struct Encoder {
    body: Body,
    scale: f64,
}

enum Body {
    Mlp(Mlp),
    Convs(Convs, Mlp),
    Parts(PartEncoders),
    Custom(Box<dyn EncoderNet>),
}

impl Encoder {
    /// The encoder of an observation of `space` (`obs_dim` values), and its output size.
    pub(super) fn new(
        path: &nn::Path<'_>,
        space: &Space,
        obs_dim: i64,
        cfg: &ModelConfig,
    ) -> Result<(Self, i64)> {
        let (body, size) = if !cfg.encoder_custom.is_empty() {
            let (net, size) = registered_encoder(&cfg.encoder_custom)?(path, space, obs_dim, cfg)?;
            (Body::Custom(net), size)
        } else if cfg.encoder_conv_architecture != ConvArchitecture::None {
            let (parts, size) = PartEncoders::new(path, space, cfg)?;
            (Body::Parts(parts), size)
        } else if cfg.encoder_conv_layers.0.is_empty() {
            let (mlp, hidden) = mlp(path, obs_dim, cfg);
            (Body::Mlp(mlp), hidden)
        } else {
            let (convs, size) = Convs::new(path, ImagePart::of(space)?, cfg)?;
            let (mlp, hidden) = mlp(path, size, cfg);
            (Body::Convs(convs, mlp), hidden)
        };
        Ok((
            Self {
                body,
                scale: cfg.obs_scale,
            },
            size,
        ))
    }

    /// An MLP alone over `inputs` values (no image part, no scaling), and its output size.
    pub(super) fn mlp_only(path: &nn::Path<'_>, inputs: i64, cfg: &ModelConfig) -> (Self, i64) {
        let (mlp, hidden) = mlp(path, inputs, cfg);
        (
            Self {
                body: Body::Mlp(mlp),
                scale: 1.0,
            },
            hidden,
        )
    }

    /// The MLP of an encoder that is an MLP alone over the unscaled observation (what the hand-written gradients
    /// of [`Mlp::backward`] cover), if this is one.
    pub(super) fn plain_mlp(&self) -> Option<&Mlp> {
        match &self.body {
            Body::Mlp(mlp) if self.scale == 1.0 => Some(mlp),
            _ => None,
        }
    }

    /// Whether [`Encoder::forward`] takes observations as the bytes they were stored as (an encoder of images
    /// alone, which converts them as it lays them out for its convolutions), and not only as floats.
    pub(super) fn takes_bytes(&self) -> bool {
        matches!(&self.body, Body::Parts(parts) if parts.takes_bytes())
    }

    /// How this encoder reads the observations, when it reads them as one image laid out for its convolutions
    /// (which [`forward`](Self::forward) then also takes laid out so).
    pub(super) fn image_layout(&self) -> Option<ImageLayout> {
        match &self.body {
            Body::Parts(parts) => parts.layout(),
            _ => None,
        }
    }

    pub(super) fn forward(&self, x: &Tensor) -> Tensor {
        match &self.body {
            Body::Mlp(mlp) => mlp.forward(&divided(x, self.scale)),
            Body::Convs(convs, mlp) => mlp.forward(&convs.forward(&divided(x, self.scale))),
            // An image's division goes into its network's first convolution: 3.4% of a Pong learner's CPU when
            // every pixel was divided (docs/benchmarks.md).
            Body::Parts(parts) => parts.forward(x, self.scale),
            Body::Custom(net) => net.forward(&divided(x, self.scale)),
        }
    }
}

pub(super) fn mlp(path: &nn::Path<'_>, inputs: i64, cfg: &ModelConfig) -> (Mlp, i64) {
    let mut size = inputs;
    let mut layers = Vec::with_capacity(cfg.encoder_mlp_layers.0.len());
    for (i, &out) in cfg.encoder_mlp_layers.0.iter().enumerate() {
        layers.push(linear(
            path / format!("fc{i}"),
            size,
            out,
            cfg.policy_initialization,
            2f64.sqrt(),
        ));
        size = out;
    }
    (
        Mlp {
            layers,
            nonlinearity: cfg.nonlinearity,
            bf16: cfg.matmul_precision.bf16(),
        },
        size,
    )
}

#[cfg(test)]
mod tests {
    use rlf_env::{BoxSpace, Space};
    use tch::{nn, Kind, Tensor};

    use super::{mlp, tanh, Encoder, ImageNet, PartEncoders, PartNet};

    #[test]
    fn tanh_through_sigmoid_is_tanh() {
        let z = Tensor::linspace(-20.0, 20.0, 100_001, (Kind::Float, tch::Device::Cpu));
        let err = (tanh(&z) - z.tanh()).abs().max().double_value(&[]);
        assert!(err < 1e-6, "max error {err}");
    }
    use crate::config::{Config, ConvArchitecture, MatmulPrecision, ModelConfig};

    fn image(shape: &[usize]) -> Space {
        Space::Box(BoxSpace::uniform(0.0, 1.0, shape.to_vec()).expect("box"))
    }

    fn model_cfg(arch: ConvArchitecture) -> ModelConfig {
        let mut cfg = Config::default().model;
        cfg.encoder_conv_architecture = arch;
        cfg
    }

    /// The flat size a network's convolutions hand to its MLP (the first layer's inputs).
    fn conv_out(net: &ImageNet) -> i64 {
        net.mlp[0].ws.size()[1]
    }

    #[test]
    fn conv_encoders_output_the_sizes_of_their_architecture() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        for (arch, dims, flat) in [
            // 84 -> 20 -> 9 -> 4 (convnet_simple), 84 -> 20 -> 9 (convnet_impala), 84 -> 20 -> 9 -> 7 (convnet_atari)
            (ConvArchitecture::ConvnetSimple, [84, 84, 4], 128 * 4 * 4),
            (ConvArchitecture::ConvnetSimple, [4, 84, 84], 128 * 4 * 4),
            (ConvArchitecture::ConvnetImpala, [84, 84, 4], 32 * 9 * 9),
            (ConvArchitecture::ConvnetAtari, [84, 84, 4], 64 * 7 * 7),
            // Pooling halves each side, rounding up: 84 -> 42 -> 21 -> 11, 10 -> 5 -> 3 -> 2.
            (ConvArchitecture::ResnetImpala, [84, 84, 4], 32 * 11 * 11),
            (ConvArchitecture::ResnetImpala, [10, 10, 4], 32 * 2 * 2),
            (ConvArchitecture::ResnetImpala, [10, 10, 7], 32 * 2 * 2),
        ] {
            let cfg = model_cfg(arch);
            let (net, size) = ImageNet::new(&vs.root(), &dims, &cfg).expect("network");
            assert_eq!((conv_out(&net), size), (flat, 512), "{arch:?} on {dims:?}");
            let n: usize = dims.iter().product();
            let out = net.forward(&Tensor::rand([3, n as i64], (Kind::Float, tch::Device::Cpu)), 1.0);
            assert_eq!(out.size(), [3, 512], "{arch:?} on {dims:?}");
        }
        let err = ImageNet::new(
            &vs.root(),
            &[10, 10, 4],
            &model_cfg(ConvArchitecture::ConvnetSimple),
        )
        .err();
        let err = err.expect("too small").to_string();
        assert!(
            err.contains("10x10 is too small") && err.contains("--encoder_conv_layers"),
            "{err}"
        );
    }

    /// Channels-first and channels-last images are the same picture: the same weights see the same thing.
    #[test]
    fn channels_first_and_last_images_encode_alike() {
        let cfg = model_cfg(ConvArchitecture::ResnetImpala);
        let (vs_a, mut vs_b) = (
            nn::VarStore::new(tch::Device::Cpu),
            nn::VarStore::new(tch::Device::Cpu),
        );
        let (last, _) = ImageNet::new(&vs_a.root(), &[12, 12, 3], &cfg).expect("network");
        let (first, _) = ImageNet::new(&vs_b.root(), &[3, 12, 12], &cfg).expect("network");
        vs_b.copy(&vs_a).expect("the same variables");
        let hwc = Tensor::rand([2, 12, 12, 3], (Kind::Float, tch::Device::Cpu));
        let chw = hwc.permute([0, 3, 1, 2]).contiguous();
        let (a, b) = (
            last.forward(&hwc.reshape([2, -1]), 1.0),
            first.forward(&chw.reshape([2, -1]), 1.0),
        );
        let diff = f64::try_from((&a - &b).abs().max()).expect("diff");
        assert!(diff < 1e-4, "{diff}");
    }

    /// `--obs_scale` of an encoder by observation part: each image's division is folded into its first convolution's
    /// weights, a vector part is divided as it is; either way the encoder sees what it would see of the divided
    /// observation, and the gradients reach the same weights alike.
    #[test]
    fn the_scale_folded_into_the_first_convolution_is_the_divided_observation() {
        let space = Space::Dict(vec![
            ("frames".to_owned(), image(&[4, 36, 36])),
            ("vector".to_owned(), image(&[5])),
        ]);
        for arch in [ConvArchitecture::ConvnetImpala, ConvArchitecture::ResnetImpala] {
            let mut cfg = model_cfg(arch);
            let (vs_a, mut vs_b) = (
                nn::VarStore::new(tch::Device::Cpu),
                nn::VarStore::new(tch::Device::Cpu),
            );
            let (plain, _) = Encoder::new(&vs_a.root(), &space, 5189, &cfg).expect("encoder");
            cfg.obs_scale = 255.0;
            let (scaled, _) = Encoder::new(&vs_b.root(), &space, 5189, &cfg).expect("encoder");
            vs_b.copy(&vs_a).expect("the same variables");
            let x = (Tensor::rand([6, 5189], (Kind::Float, tch::Device::Cpu)) * 255.0).floor();
            let (a, b) = (plain.forward(&(&x / 255.0)), scaled.forward(&x));
            let diff = f64::try_from((&a - &b).abs().max()).expect("diff");
            let size = f64::try_from(a.abs().max()).expect("max");
            assert!(size > 0.0 && diff < 1e-5 * size, "{arch:?}: {diff} of {size}");
            a.sum(Kind::Float).backward();
            b.sum(Kind::Float).backward();
            let theirs = vs_b.variables();
            for (name, wa) in vs_a.variables() {
                let (ga, gb) = (wa.grad(), theirs[&name].grad());
                let gdiff = f64::try_from((&ga - &gb).abs().max()).expect("diff");
                let gsize = f64::try_from(ga.abs().max()).expect("max");
                assert!(
                    gdiff <= 1e-4 * gsize.max(1e-6),
                    "{arch:?} {name}: {gdiff} of {gsize}"
                );
            }
        }
    }

    /// An encoder of images alone takes the bytes they were stored as (channels-first stacked frames and
    /// channels-last screens) and encodes them exactly as their floats; one with a vector part takes floats only.
    #[test]
    fn images_encode_from_their_bytes_as_from_their_floats() {
        let mut cfg = model_cfg(ConvArchitecture::ConvnetSimple);
        cfg.obs_scale = 255.0;
        for dims in [[4_usize, 36, 36], [36, 36, 3]] {
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let n = dims.iter().product::<usize>() as i64;
            let (enc, _) = Encoder::new(&vs.root(), &image(&dims), n, &cfg).expect("encoder");
            assert!(enc.takes_bytes(), "{dims:?}");
            let bytes = Tensor::randint(256, [5, n], (Kind::Uint8, tch::Device::Cpu));
            let (a, b) = (enc.forward(&bytes.to_kind(Kind::Float)), enc.forward(&bytes));
            assert_eq!(b.kind(), Kind::Float);
            assert!(f64::try_from(a.abs().max()).expect("max") > 0.0);
            assert!(a.equal(&b), "{dims:?}: bytes and floats encode differently");
        }
        let dict = Space::Dict(vec![
            ("frames".to_owned(), image(&[4, 36, 36])),
            ("vector".to_owned(), image(&[5])),
        ]);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let (enc, _) = Encoder::new(&vs.root(), &dict, 5189, &cfg).expect("encoder");
        assert!(!enc.takes_bytes());
    }

    /// A Dict of an image, a vector and a mask: one encoder per part (a network for the image, an MLP for each
    /// other part), outputs concatenated; the image is read where the Dict puts it. Without an image it is an
    /// error.
    #[test]
    fn dict_observations_get_one_encoder_per_part() {
        let space = Space::Dict(vec![
            ("action_mask".to_owned(), image(&[3])),
            ("screen".to_owned(), image(&[10, 10, 2])),
            ("vector".to_owned(), image(&[5])),
        ]);
        let cfg = model_cfg(ConvArchitecture::ResnetImpala);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let (enc, size) = PartEncoders::new(&vs.root(), &space, &cfg).expect("encoders");
        assert_eq!(size, 64 + 512 + 64);
        let kinds: Vec<(i64, i64, bool)> = enc
            .parts
            .iter()
            .map(|(at, len, net)| (*at, *len, matches!(net, PartNet::Image(_))))
            .collect();
        assert_eq!(kinds, [(0, 3, false), (3, 200, true), (203, 5, false)]);
        let x = Tensor::rand([4, 208], (Kind::Float, tch::Device::Cpu));
        let y = enc.forward(&x, 1.0);
        assert_eq!(y.size(), [4, 640]);
        // Changing the image changes only the image's encoding.
        let moved = x.copy();
        let _ = moved.narrow(1, 3, 200).fill_(0.5);
        let z = enc.forward(&moved, 1.0);
        assert!(y.narrow(1, 0, 64).equal(&z.narrow(1, 0, 64)));
        assert!(!y.narrow(1, 64, 512).equal(&z.narrow(1, 64, 512)));
        let flat = Space::Dict(vec![("vector".to_owned(), image(&[5]))]);
        let err = PartEncoders::new(&vs.root(), &flat, &cfg)
            .err()
            .expect("no image")
            .to_string();
        assert!(err.contains("needs an image"), "{err}");
    }

    /// `--matmul_precision medium`: a batch of 256 rows goes through bfloat16 products, close to the float32
    /// network with the same weights but not equal, and its gradients reach the float32 weights; a batch of fewer
    /// than 64 rows multiplies in float32, exactly as `highest` does.
    #[test]
    fn bfloat16_products_follow_the_float32_network() {
        tch::manual_seed(0);
        let mut cfg = Config::default().model;
        cfg.encoder_mlp_layers = "250,250".parse().expect("layers");
        let (vs_a, mut vs_b) = (
            nn::VarStore::new(tch::Device::Cpu),
            nn::VarStore::new(tch::Device::Cpu),
        );
        let (exact, _) = mlp(&vs_a.root(), 625, &cfg);
        cfg.matmul_precision = MatmulPrecision::Medium;
        let (half, _) = mlp(&vs_b.root(), 625, &cfg);
        vs_b.copy(&vs_a).expect("the same variables");
        let x = Tensor::rand([256, 625], (Kind::Float, tch::Device::Cpu));
        let (a, b) = (exact.forward(&x), half.forward(&x));
        assert_eq!(b.kind(), Kind::Float);
        let scale = f64::try_from(a.abs().max()).expect("max");
        let diff = f64::try_from((&a - &b).abs().max()).expect("diff");
        assert!(diff > 0.0 && diff < 0.02 * scale, "{diff} of {scale}");
        let loss = b.sum(Kind::Float);
        loss.backward();
        let grad = half.layers[0].ws.grad();
        assert_eq!(grad.kind(), Kind::Float);
        assert!(f64::try_from(grad.abs().sum(Kind::Float)).expect("sum") > 0.0);
        let few = x.narrow(0, 0, 8);
        assert!(exact.forward(&few).equal(&half.forward(&few)));
    }

    /// `--matmul_precision medium` on an image: every architecture's convolutions and MLP multiply in bfloat16
    /// for a batch of any size (an inference worker's 3 rows too), float32 out, close to the float32 network with
    /// the same weights but not equal, and the gradients reach every float32 weight.
    #[test]
    fn bfloat16_convolutions_follow_the_float32_network() {
        tch::manual_seed(3);
        for (arch, dims) in [
            (ConvArchitecture::ConvnetSimple, [4, 84, 84]),
            (ConvArchitecture::ResnetImpala, [12, 12, 3]),
        ] {
            let (vs_a, mut vs_b) = (
                nn::VarStore::new(tch::Device::Cpu),
                nn::VarStore::new(tch::Device::Cpu),
            );
            let mut cfg = model_cfg(arch);
            let (exact, _) = ImageNet::new(&vs_a.root(), &dims, &cfg).expect("network");
            cfg.matmul_precision = MatmulPrecision::Medium;
            let (half, _) = ImageNet::new(&vs_b.root(), &dims, &cfg).expect("network");
            vs_b.copy(&vs_a).expect("the same variables");
            let n: i64 = dims.iter().product::<usize>() as i64;
            let x = Tensor::rand([3, n], (Kind::Float, tch::Device::Cpu));
            let (a, b) = (exact.forward(&x, 1.0), half.forward(&x, 1.0));
            assert_eq!(b.kind(), Kind::Float, "{arch:?}");
            let scale = f64::try_from(a.abs().max()).expect("max");
            let diff = f64::try_from((&a - &b).abs().max()).expect("diff");
            assert!(diff > 0.0 && diff < 0.05 * scale, "{arch:?}: {diff} of {scale}");
            b.sum(Kind::Float).backward();
            for (name, var) in vs_b.variables() {
                let grad = var.grad();
                assert_eq!(grad.kind(), Kind::Float, "{arch:?} {name}");
                assert!(
                    f64::try_from(grad.abs().sum(Kind::Float)).expect("sum") > 0.0,
                    "{arch:?}: no gradient reached {name}"
                );
            }
        }
        // `--encoder_conv_layers` over the image of a Dict, the other part concatenated as it is.
        let space = Space::Dict(vec![
            ("screen".to_owned(), image(&[10, 10, 4])),
            ("vector".to_owned(), image(&[5])),
        ]);
        let mut cfg = Config::default().model;
        cfg.encoder_conv_layers = "16x3,16x3".parse().expect("layers");
        let (vs_a, mut vs_b) = (
            nn::VarStore::new(tch::Device::Cpu),
            nn::VarStore::new(tch::Device::Cpu),
        );
        let (exact, _) = Encoder::new(&vs_a.root(), &space, 405, &cfg).expect("encoder");
        cfg.matmul_precision = MatmulPrecision::Medium;
        let (half, _) = Encoder::new(&vs_b.root(), &space, 405, &cfg).expect("encoder");
        vs_b.copy(&vs_a).expect("the same variables");
        let x = Tensor::rand([3, 405], (Kind::Float, tch::Device::Cpu));
        let (a, b) = (exact.forward(&x), half.forward(&x));
        let scale = f64::try_from(a.abs().max()).expect("max");
        let diff = f64::try_from((&a - &b).abs().max()).expect("diff");
        assert!(diff > 0.0 && diff < 0.05 * scale, "{diff} of {scale}");
        b.sum(Kind::Float).backward();
        for (name, var) in vs_b.variables() {
            assert!(
                f64::try_from(var.grad().abs().sum(Kind::Float)).expect("sum") > 0.0,
                "no gradient reached {name}"
            );
        }
    }

    /// Hidden ReLU layers of a bfloat16 MLP stay in bfloat16 between products: the same outputs and gradients,
    /// bit for bit, as casting each product to float32, applying ReLU and casting back (both casts are exact).
    #[test]
    fn bfloat16_relu_layers_equal_the_float32_round_trip() {
        tch::manual_seed(5);
        let mut cfg = Config::default().model;
        cfg.encoder_mlp_layers = "48,32,16".parse().expect("layers");
        cfg.nonlinearity = crate::config::Nonlinearity::Relu;
        cfg.matmul_precision = MatmulPrecision::Medium;
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let (half, _) = mlp(&vs.root(), 20, &cfg);
        let x = Tensor::randn([96, 20], (Kind::Float, tch::Device::Cpu));
        let weights = Tensor::randn([96, 16], (Kind::Float, tch::Device::Cpu));
        let grads = |out: Tensor| -> Vec<Tensor> {
            for p in vs.trainable_variables() {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            (out * &weights).sum(Kind::Float).backward();
            vs.trainable_variables().iter().map(|p| p.grad().copy()).collect()
        };
        let round_trip = || {
            let bf16 = |t: &Tensor| t.to_kind(Kind::BFloat16);
            half.layers.iter().fold(x.shallow_clone(), |h, layer| {
                bf16(&h)
                    .linear(&bf16(&layer.ws), layer.bs.as_ref().map(bf16))
                    .to_kind(Kind::Float)
                    .relu()
            })
        };
        let (want, got) = (round_trip(), half.forward(&x));
        assert!(want.equal(&got));
        for (a, b) in grads(want).iter().zip(grads(got)) {
            assert!(a.equal(&b));
        }
        let saved = tch::no_grad(|| half.forward_saved(&x)).expect("forward");
        assert!(saved.0.equal(&half.forward(&x)));
    }
}
