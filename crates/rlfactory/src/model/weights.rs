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

/// `named`'s variables as [`NamedTensor`]s.
pub(super) fn named_tensors(named: &[(String, Tensor)]) -> Result<Vec<NamedTensor>> {
    named
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

/// Replaces each of `named`'s variables (on `device`) with the tensor of the same name in `tensors`; a missing
/// name or a wrong shape is an error naming the variable, and nothing is changed then.
pub(super) fn load_named_tensors(
    named: &mut [(String, Tensor)],
    tensors: &[NamedTensor],
    device: tch::Device,
) -> Result<()> {
    let mut sources = Vec::with_capacity(named.len());
    for (name, t) in named.iter() {
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
    tch::no_grad(|| {
        for ((_, t), src) in named.iter_mut().zip(sources) {
            t.f_copy_(&src.f_to_device(device)?)?;
        }
        Ok(())
    })
}

/// Copies every variable of `theirs` (a network of the same architecture) into `mine`, or moves each `tau` of the
/// way towards it (Polyak averaging; 1 copies).
pub(super) fn follow_named(
    mine: &mut [(String, Tensor)],
    theirs: &[(String, Tensor)],
    tau: f64,
) -> Result<()> {
    tch::no_grad(|| {
        for ((name, mine), (theirs_name, theirs)) in mine.iter_mut().zip(theirs) {
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

/// Saves `vs` to `path` (safetensors).
pub(super) fn save_vars(vs: &nn::VarStore, path: &Path) -> Result<()> {
    vs.save(path).map_err(|e| RlfError::Io {
        what: "saving weights to",
        path: path.to_owned(),
        source: std::io::Error::other(e.to_string()),
    })
}

/// Loads `vs` from `path`, saved by [`save_vars`].
pub(super) fn load_vars(vs: &mut nn::VarStore, path: &Path) -> Result<()> {
    vs.load(path).map_err(|e| RlfError::Io {
        what: "loading weights from",
        path: path.to_owned(),
        source: std::io::Error::other(e.to_string()),
    })
}

/// All of `named`'s values, flat, variable after variable.
pub(super) fn flat_weights(named: &[(String, Tensor)]) -> Result<PolicyWeights> {
    let flat: Vec<Tensor> = named.iter().map(|(_, t)| t.detach().flatten(0, -1)).collect();
    Ok(PolicyWeights {
        values: to_vec(&Tensor::f_cat(&flat, 0)?)?,
    })
}

/// Copies `weights` (from [`flat_weights`] of the same architecture) into `named`, on `device`.
pub(super) fn load_flat_weights(
    named: &mut [(String, Tensor)],
    weights: &PolicyWeights,
    device: tch::Device,
) -> Result<()> {
    let total: usize = named.iter().map(|(_, t)| t.numel()).sum();
    if weights.values.len() != total {
        return Err(RlfError::WeightMismatch(format!(
            "{} values for a model of {total} values",
            weights.values.len()
        )));
    }
    tch::no_grad(|| {
        let mut offset = 0;
        for (_, t) in named.iter_mut() {
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
