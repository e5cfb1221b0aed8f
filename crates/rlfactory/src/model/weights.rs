//! A network's variables by their PyTorch-style names, whatever the network (the actor-critic, the Q-network, SAC's
//! actor and critics): named tensors to save, load and compare, flat weights to publish, and the observation rows
//! they take.

use std::path::Path;

use tch::{nn, Kind, Tensor};

use super::PolicyWeights;
use crate::error::{Result, RlfError};

/// A `[n, dim]` tensor on `device` from `values`, `n` rows of `dim` observation values.
pub(super) fn rows_tensor(values: &[f32], dim: i64, device: tch::Device) -> Result<Tensor> {
    let d = dim as usize;
    if d == 0 || values.len() % d != 0 {
        return Err(RlfError::Protocol {
            component: "policy",
            message: format!(
                "{} observation values are not a whole number of {d}-value observations",
                values.len()
            ),
        });
    }
    Ok(Tensor::f_from_slice(values)?
        .f_view([(values.len() / d) as i64, dim])?
        .f_to_device(device)?)
}

/// A network's variables: the store that owns them, and each by its PyTorch-style name, in name order (the order
/// of its flat weights, its checkpoints and its optimizer's state). Every network (the actor-critic, the Q-network,
/// SAC's actor and critics) keeps its variables in one, and saves, loads, publishes and follows through it.
pub struct Variables {
    vs: nn::VarStore,
    named: Vec<(String, Tensor)>,
}

impl std::fmt::Debug for Variables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.named.iter().map(|(n, _)| n)).finish()
    }
}

impl Variables {
    /// The variables of `vs`, once the network has created them all in it.
    pub(super) fn of(vs: nn::VarStore) -> Self {
        let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        Self { vs, named }
    }

    /// The device they live on.
    pub fn device(&self) -> tch::Device {
        self.vs.device()
    }

    /// Every variable by name, in name order.
    pub fn named(&self) -> &[(String, Tensor)] {
        &self.named
    }

    /// The trainable ones (what an optimizer steps), by name, in name order.
    pub fn trainable(&self) -> Vec<(String, Tensor)> {
        self.named
            .iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect()
    }

    /// Every variable as a [`NamedTensor`].
    pub fn named_tensors(&self) -> Result<Vec<NamedTensor>> {
        self.named
            .iter()
            .map(|(name, t)| {
                Ok(NamedTensor {
                    name: name.clone(),
                    shape: t.size().iter().map(|&d| d as usize).collect(),
                    values: to_vec(&t.detach())?,
                })
            })
            .collect()
    }

    /// Replaces each variable with the tensor of the same name in `tensors` (others there are ignored); a missing
    /// name or a wrong shape is an error naming the variable, and nothing is changed then.
    pub fn load_named_tensors(&mut self, tensors: &[NamedTensor]) -> Result<()> {
        let mut sources = Vec::with_capacity(self.named.len());
        for (name, t) in &self.named {
            let src = tensors
                .iter()
                .find(|n| &n.name == name)
                .ok_or_else(|| RlfError::WeightMismatch(format!("no tensor `{name}`")))?;
            let shape: Vec<i64> = src.shape.iter().map(|&d| d as i64).collect();
            let numel: usize = src.shape.iter().product();
            if shape != t.size() || numel != src.values.len() {
                return Err(RlfError::WeightMismatch(format!(
                    "`{name}` has shape {:?} ({} values), the model's is {:?}",
                    src.shape,
                    src.values.len(),
                    t.size()
                )));
            }
            sources.push(Tensor::f_from_slice(&src.values)?.f_view(shape.as_slice())?);
        }
        let device = self.device();
        tch::no_grad(|| {
            for ((_, t), src) in self.named.iter_mut().zip(sources) {
                t.f_copy_(&src.f_to_device(device)?)?;
            }
            Ok(())
        })
    }

    /// Copies every variable of `theirs` (a network of the same architecture), or moves each `tau` of the way
    /// towards it (Polyak averaging; 1 copies).
    pub fn follow(&mut self, theirs: &Variables, tau: f64) -> Result<()> {
        tch::no_grad(|| {
            for ((name, mine), (theirs_name, theirs)) in self.named.iter_mut().zip(&theirs.named) {
                if name != theirs_name || mine.size() != theirs.size() {
                    return Err(RlfError::WeightMismatch(format!(
                        "`{name}` cannot follow `{theirs_name}`"
                    )));
                }
                if tau >= 1.0 {
                    mine.f_copy_(theirs)?;
                } else {
                    // In place, rounded as `mine * (1 − τ) + theirs * τ` (not `lerp_`, which rounds otherwise).
                    let part = theirs.f_mul_scalar(tau)?;
                    let _ = mine.f_mul_scalar_(1.0 - tau)?;
                    let _ = mine.f_add_(&part)?;
                }
            }
            Ok(())
        })
    }

    /// Saves them to `path` (safetensors).
    pub fn save(&self, path: &Path) -> Result<()> {
        self.vs.save(path).map_err(|e| RlfError::Io {
            what: "saving weights to",
            path: path.to_owned(),
            source: std::io::Error::other(e.to_string()),
        })
    }

    /// Loads them from `path`, saved by [`save`](Self::save).
    pub fn load(&mut self, path: &Path) -> Result<()> {
        self.vs.load(path).map_err(|e| RlfError::Io {
            what: "loading weights from",
            path: path.to_owned(),
            source: std::io::Error::other(e.to_string()),
        })
    }

    /// Where `t` (one of these variables, or a shallow clone of one) starts in the flat values of
    /// [`weights`](Self::weights); `None` for another tensor.
    pub fn offset_of(&self, t: &Tensor) -> Option<usize> {
        let mut offset = 0;
        for (_, v) in &self.named {
            if v.data_ptr() == t.data_ptr() && v.size() == t.size() {
                return Some(offset);
            }
            offset += v.numel();
        }
        None
    }

    /// The sum of libtorch's version counters of the variables: it grows whenever one of them is changed in place
    /// through it (a load, a copy), and only then. Adam's steps write the flat tensor the variables view, which
    /// moves none of them.
    pub fn version(&self) -> i64 {
        self.named.iter().map(|(_, t)| t.internal_version()).sum()
    }

    /// All their values, flat, variable after variable: what a learner publishes.
    pub fn weights(&self) -> Result<PolicyWeights> {
        let flat: Vec<Tensor> = self
            .named
            .iter()
            .map(|(_, t)| t.detach().flatten(0, -1))
            .collect();
        Ok(PolicyWeights {
            values: to_vec(&Tensor::f_cat(&flat, 0)?)?,
        })
    }

    /// Copies `weights` (from [`weights`](Self::weights) of the same architecture) into them.
    pub fn load_weights(&mut self, weights: &PolicyWeights) -> Result<()> {
        let total: usize = self.named.iter().map(|(_, t)| t.numel()).sum();
        if weights.values.len() != total {
            return Err(RlfError::WeightMismatch(format!(
                "{} values for a model of {total} values",
                weights.values.len()
            )));
        }
        let device = self.device();
        tch::no_grad(|| {
            let mut offset = 0;
            for (_, t) in self.named.iter_mut() {
                let n = t.numel();
                let src = Tensor::f_from_slice(&weights.values[offset..offset + n])?
                    .f_view(t.size().as_slice())?
                    .f_to_device(device)?;
                t.f_copy_(&src)?;
                offset += n;
            }
            Ok(())
        })
    }
}

/// One variable of a model: PyTorch-style name, shape and row-major values.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    /// The name (`actor_encoder.fc0.weight`).
    pub name: String,
    /// The shape (`[out, in]` for linear weights, as PyTorch's `nn.Linear`).
    pub shape: Vec<usize>,
    /// The values, row-major.
    pub values: Vec<f32>,
}

impl NamedTensor {
    /// The prefix a learner's target network is saved under (`target.` and the network's own names), beside the
    /// network it follows.
    pub const TARGET_PREFIX: &'static str = "target.";

    /// `tensors`, each renamed `<prefix><name>`.
    pub fn prefixed(prefix: &str, tensors: Vec<NamedTensor>) -> Vec<NamedTensor> {
        tensors
            .into_iter()
            .map(|t| NamedTensor {
                name: format!("{prefix}{}", t.name),
                ..t
            })
            .collect()
    }

    /// The tensors of `tensors` named `<prefix>...`, with the prefix taken off; none when there are none.
    pub fn unprefixed(prefix: &str, tensors: &[NamedTensor]) -> Vec<NamedTensor> {
        tensors
            .iter()
            .filter_map(|t| {
                t.name.strip_prefix(prefix).map(|name| NamedTensor {
                    name: name.to_owned(),
                    ..t.clone()
                })
            })
            .collect()
    }
}

pub(super) fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(Vec::<f32>::try_from(
        t.f_to_kind(Kind::Float)?
            .f_flatten(0, -1)?
            .f_to_device(tch::Device::Cpu)?,
    )?)
}
