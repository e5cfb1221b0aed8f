//! A float32 tensor's own memory as slices, for a loop over it that libtorch has no single operation for (Adam's
//! step in one pass over every parameter instead of a dozen passes).
//!
//! libtorch tensors share their storage by design (views, shallow clones): the slices handed out here are
//! borrowed from the handles given, which keeps the storage alive and those handles unused, but not the other
//! handles of the same storage. While the closure runs, nothing else may read or write the elements it was given
//! (no other handle of them used, in this thread or another): the same condition libtorch's in-place operations
//! put on their callers.
//!
//! ```
//! use tch::Tensor;
//!
//! let mut acc = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
//! let step = Tensor::from_slice(&[0.5f32, 0.5, 0.5]);
//! rlf_shm::tensor::with_f32_slices([&mut acc], &[&step], |[acc], read| {
//!     for (a, s) in acc.iter_mut().zip(read[0]) {
//!         *a += s;
//!     }
//! })?;
//! assert_eq!(Vec::<f32>::try_from(&acc)?, [1.5, 2.5, 3.5]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ops::Range;

use tch::{Device, Kind, Tensor};

use crate::region::ShmError;

/// The bytes a float32 tensor's elements occupy: `Err` unless it is defined, on the CPU, float32 and contiguous.
fn span(t: &Tensor, what: &str) -> Result<Range<usize>, ShmError> {
    let bad = |why: String| Err(ShmError::Config(format!("{what}: {why}")));
    if !t.defined() {
        return bad("an undefined tensor".into());
    }
    if t.device() != Device::Cpu || t.kind() != Kind::Float || !t.is_contiguous() {
        return bad(format!(
            "a {:?} tensor on {:?}{}: only contiguous float32 CPU tensors can be read as slices",
            t.kind(),
            t.device(),
            if t.is_contiguous() { "" } else { ", not contiguous" }
        ));
    }
    let start = t.data_ptr() as usize;
    if t.numel() > 0 && (start == 0 || start % std::mem::align_of::<f32>() != 0) {
        return bad(format!("data at {start:#x}, not aligned for float32"));
    }
    Ok(start..start + t.numel() * std::mem::size_of::<f32>())
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Runs `f` over the elements of `write` as mutable slices and of `read` as shared ones, each in its tensor's
/// (row-major) order; returns what `f` returns. Errors, without calling `f`, if a tensor is not a defined,
/// contiguous float32 CPU tensor, or if a written tensor's elements overlap another's. See the module's
/// documentation for what else must leave those elements alone meanwhile.
pub fn with_f32_slices<const N: usize, R>(
    write: [&mut Tensor; N],
    read: &[&Tensor],
    f: impl FnOnce([&mut [f32]; N], &[&[f32]]) -> R,
) -> Result<R, ShmError> {
    let written = write
        .iter()
        .enumerate()
        .map(|(i, t)| span(t, &format!("written tensor {i}")))
        .collect::<Result<Vec<_>, _>>()?;
    let reads = read
        .iter()
        .enumerate()
        .map(|(i, t)| span(t, &format!("read tensor {i}")))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, w) in written.iter().enumerate() {
        let clash = written[i + 1..]
            .iter()
            .chain(&reads)
            .any(|other| overlap(w, other));
        if clash {
            return Err(ShmError::Config(format!(
                "written tensor {i} shares elements with another tensor given"
            )));
        }
    }
    let slices = write.map(|t| {
        let n = t.numel();
        if n == 0 {
            return &mut [][..];
        }
        // SAFETY: `span` checked that the tensor is defined, contiguous, float32 and on the CPU, so its `numel`
        // elements lie one after another from `data_ptr` (which includes the storage offset), aligned for `f32`
        // (checked) and each a valid `f32`. The storage lives at least as long as the handle, borrowed mutably
        // for this call; the slice does not outlive `f` (its lifetime is `f`'s argument's). No other slice
        // handed to `f` overlaps it (checked above); other handles of the storage are left alone meanwhile, as
        // the module's documentation requires of the caller.
        unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<f32>(), n) }
    });
    let shared = read
        .iter()
        .map(|t| {
            let n = t.numel();
            if n == 0 {
                return &[][..];
            }
            // SAFETY: as for the written slices: `n` contiguous, aligned, valid `f32` from `data_ptr`, in a
            // storage the borrowed handle keeps alive beyond `f`; no mutable slice overlaps it (checked), and
            // nothing else writes it meanwhile (the module's condition).
            unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<f32>().cast_const(), n) }
        })
        .collect::<Vec<_>>();
    Ok(f(slices, &shared))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_reach_the_tensor_and_its_views() {
        let mut flat = Tensor::zeros([6], (Kind::Float, Device::Cpu));
        let view = flat.narrow(0, 2, 3);
        let src = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let total = with_f32_slices([&mut flat], &[&src], |[dst], read| {
            dst.copy_from_slice(read[0]);
            read[0].iter().sum::<f32>()
        })
        .unwrap();
        assert_eq!(total, 21.0);
        assert_eq!(Vec::<f32>::try_from(&view).unwrap(), [3.0, 4.0, 5.0]);
    }

    #[test]
    fn a_narrowed_tensor_is_its_own_elements() {
        let base = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]);
        let mut tail = base.narrow(0, 2, 2);
        with_f32_slices([&mut tail], &[], |[t], _| {
            assert_eq!(t, &[3.0, 4.0]);
            t[0] = 9.0;
        })
        .unwrap();
        assert_eq!(Vec::<f32>::try_from(&base).unwrap(), [1.0, 2.0, 9.0, 4.0]);
    }

    #[test]
    fn refuses_what_is_not_plain_float32_memory_or_overlaps() {
        let mut flat = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        let mut doubles = Tensor::zeros([4], (Kind::Double, Device::Cpu));
        let mut strided = Tensor::zeros([4, 4], (Kind::Float, Device::Cpu)).tr();
        let alias = flat.shallow_clone();
        let mut undefined = Tensor::new();
        let err = |r: Result<(), ShmError>| r.unwrap_err().to_string();
        assert!(err(with_f32_slices([&mut doubles], &[], |_, _| ())).contains("Double"));
        assert!(err(with_f32_slices([&mut strided], &[], |_, _| ())).contains("not contiguous"));
        assert!(err(with_f32_slices([&mut undefined], &[], |_, _| ())).contains("undefined"));
        assert!(err(with_f32_slices([&mut flat], &[&alias], |_, _| ())).contains("shares elements"));
        let mut other = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        let mut same = flat.narrow(0, 1, 2);
        assert!(err(with_f32_slices([&mut other, &mut same], &[&flat], |_, _| ())).contains("shares"));
        assert!(with_f32_slices([&mut other], &[&flat], |_, _| ()).is_ok());
    }
}
