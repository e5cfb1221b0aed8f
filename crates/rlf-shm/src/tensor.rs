//! Loops of ours over float32 tensors' elements, for what libtorch has no single operation for (Adam's step in
//! one pass over every parameter instead of a dozen passes).
//!
//! The elements are read and written through raw pointers, one value at a time, as libtorch's own kernels do:
//! no Rust reference into a tensor's memory is ever made, so other handles of the same storage (views, shallow
//! clones) may be used meanwhile as with any in-place libtorch operation, with the same outcome (in this thread,
//! the writes in the order made; from another thread at the same time, a race, as two in-place operations would
//! be).
//!
//! ```
//! use rlf_shm::tensor::{sum_of_squares, update_elements, Source};
//! use tch::Tensor;
//!
//! let mut acc = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]);
//! let step = Tensor::from_slice(&[0.5f32, 0.5]);
//! // Elements 2 and 3 of `acc` take a step.
//! update_elements([&mut acc], 2, Source::Tensor(&step), 1, |[a], s| [a + s])?;
//! assert_eq!(Vec::<f32>::try_from(&acc)?, [1.0, 2.0, 3.5, 4.5]);
//! assert_eq!(sum_of_squares(Source::Slice(&[3.0, 4.0]))?, 25.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ops::Range;

use tch::{Device, Kind, Tensor};

use crate::region::ShmError;

/// Float32 values to read: a tensor's elements (a contiguous float32 CPU tensor) or a slice.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// Every element of the tensor, in row-major order.
    Tensor(&'a Tensor),
    /// The slice's values.
    Slice(&'a [f32]),
}

impl Source<'_> {
    /// How many values.
    pub fn len(&self) -> usize {
        match self {
            Source::Tensor(t) => t.numel(),
            Source::Slice(s) => s.len(),
        }
    }

    /// Whether there is no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first value's address and the bytes the values span.
    fn span(&self, what: &str) -> Result<(*const f32, Range<usize>), ShmError> {
        match self {
            Source::Tensor(t) => {
                let bytes = span(t, what)?;
                Ok((t.data_ptr().cast::<f32>().cast_const(), bytes))
            }
            Source::Slice(s) => {
                let start = s.as_ptr() as usize;
                Ok((s.as_ptr(), start..start + std::mem::size_of_val(*s)))
            }
        }
    }
}

/// The bytes a float32 tensor's elements occupy: `Err` unless it is a defined, dense, contiguous float32 CPU
/// tensor whose values are stored as they read (no lazy negation or conjugation).
fn span(t: &Tensor, what: &str) -> Result<Range<usize>, ShmError> {
    let bad = |why: String| Err(ShmError::Config(format!("{what}: {why}")));
    if !t.defined() {
        return bad("an undefined tensor".into());
    }
    if t.is_sparse() || t.is_mkldnn() {
        return bad("a sparse or oneDNN tensor: only dense tensors are read element by element".into());
    }
    if t.device() != Device::Cpu || t.kind() != Kind::Float || !t.is_contiguous() {
        return bad(format!(
            "a {:?} tensor on {:?}{}: only contiguous float32 CPU tensors are read element by element",
            t.kind(),
            t.device(),
            if t.is_contiguous() { "" } else { ", not contiguous" }
        ));
    }
    if t.is_neg() || t.is_conj() {
        return bad(
            "a lazily negated or conjugated view: its stored values are not the ones it reads".into(),
        );
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

/// `Σ x²` over `source`'s values in float64 (eight running sums, so that the loop vectorises): the squared L2
/// norm.
pub fn sum_of_squares(source: Source<'_>) -> Result<f64, ShmError> {
    let n = source.len();
    let (src, _) = source.span("summed tensor")?;
    let mut acc = [0.0f64; 8];
    let whole = n - n % acc.len();
    let square = |i: usize| {
        // SAFETY: `i < n`, and `src` points to `n` float32 values: a slice's own, or a tensor's that `span` checked
        // to be contiguous, aligned float32 on the CPU, kept alive by the borrowed handle. Read by value through
        // the pointer, never by reference (the module's documentation).
        let x = f64::from(unsafe { src.add(i).read() });
        x * x
    };
    for i in (0..whole).step_by(acc.len()) {
        for (k, a) in acc.iter_mut().enumerate() {
            *a += square(i + k);
        }
    }
    Ok(acc.iter().sum::<f64>() + (whole..n).map(square).sum::<f64>())
}

/// The values [`update_elements`] computes at a time, out of the tensors' memory.
const LANES: usize = 16;

/// [`update_elements`] splits a source of at least this many values between its threads.
pub const SPLIT_MIN: usize = 1 << 16;

/// The written tensors' and the read values' first addresses, for the threads of [`update_elements`].
struct Pointers<const N: usize> {
    write: [*mut f32; N],
    read: *const f32,
}

// SAFETY: the pointers are only dereferenced by `Pointers::apply`, each thread of `update_elements` over its own
// disjoint range of indices, all of them joined before `update_elements` returns (and its borrows of the tensors
// and the source end).
unsafe impl<const N: usize> Sync for Pointers<N> {}

impl<const N: usize> Pointers<N> {
    /// `f` over the elements `range` (indices into the read values; `at` further on in the written tensors): whole
    /// blocks of [`LANES`] copied into local arrays and back, where the compiler vectorises `f` (through the
    /// pointers it would have to allow for their overlap), then the rest one by one.
    fn apply(&self, range: Range<usize>, at: usize, f: &impl Fn([f32; N], f32) -> [f32; N]) {
        let whole = range.end - (range.end - range.start) % LANES;
        for i in (range.start..whole).step_by(LANES) {
            let mut block = [[0.0f32; LANES]; N];
            let read: [f32; LANES];
            // SAFETY: `update_elements` checked that every written tensor holds the elements `at..at + n` and the
            // source `n` values, and `i + LANES <= whole <= range.end <= n`; each is contiguous, aligned float32
            // memory kept alive by the borrowed handles, and no written range overlaps another or the source.
            // The values are copied by value into local arrays (no reference into the tensors is made), and no
            // other thread of this call touches these indices.
            unsafe {
                for (b, p) in block.iter_mut().zip(&self.write) {
                    *b = p.add(at + i).cast::<[f32; LANES]>().read_unaligned();
                }
                read = self.read.add(i).cast::<[f32; LANES]>().read_unaligned();
            }
            for (l, &x) in read.iter().enumerate() {
                let new = f(std::array::from_fn(|k| block[k][l]), x);
                for (b, y) in block.iter_mut().zip(new) {
                    b[l] = y;
                }
            }
            // SAFETY: as for the reads: the same in-bounds, non-overlapping indices, written by value.
            unsafe {
                for (b, p) in block.iter().zip(&self.write) {
                    p.add(at + i).cast::<[f32; LANES]>().write_unaligned(*b);
                }
            }
        }
        for i in whole..range.end {
            // SAFETY: as for the blocks: `i < range.end <= n`, in bounds of every written tensor (from `at`) and
            // of the source, no overlap, values read and written by value, no other thread at this index.
            unsafe {
                let new = f(self.write.map(|p| p.add(at + i).read()), self.read.add(i).read());
                for (p, y) in self.write.iter().zip(new) {
                    p.add(at + i).write(y);
                }
            }
        }
    }
}

/// For every value `i` of `source`: the elements `at + i` of the `write` tensors become `f` of what they are and
/// of that value, in order, `threads` threads (at least one) taking equal shares of a source of at least
/// [`SPLIT_MIN`] values. Errors, before anything is written, if a tensor is not a defined, dense, contiguous float32 CPU
/// tensor, if a written tensor has fewer than `at + source.len()` elements, or if the written elements overlap
/// each other or the source.
pub fn update_elements<const N: usize>(
    write: [&mut Tensor; N],
    at: usize,
    source: Source<'_>,
    threads: usize,
    f: impl Fn([f32; N], f32) -> [f32; N] + Sync,
) -> Result<(), ShmError> {
    let n = source.len();
    let (read, read_bytes) = source.span("read tensor")?;
    let mut written = Vec::with_capacity(N);
    for (k, t) in write.iter().enumerate() {
        let bytes = span(t, &format!("written tensor {k}"))?;
        if at.checked_add(n).is_none_or(|end| end > t.numel()) {
            return Err(ShmError::Config(format!(
                "written tensor {k} has {} elements, not the {at} + {n} updated",
                t.numel()
            )));
        }
        let first = bytes.start + at * std::mem::size_of::<f32>();
        written.push(first..first + n * std::mem::size_of::<f32>());
    }
    if n == 0 {
        return Ok(());
    }
    for (k, w) in written.iter().enumerate() {
        if written[k + 1..]
            .iter()
            .chain([&read_bytes])
            .any(|other| overlap(w, other))
        {
            return Err(ShmError::Config(format!(
                "the updated elements of written tensor {k} overlap another tensor's or the source's"
            )));
        }
    }
    let pointers = Pointers {
        write: write.map(|t| t.data_ptr().cast::<f32>()),
        read,
    };
    let threads = if n >= SPLIT_MIN { threads.max(1) } else { 1 };
    if threads == 1 {
        pointers.apply(0..n, at, &f);
        return Ok(());
    }
    let share = n.div_ceil(threads);
    std::thread::scope(|s| {
        for t in 1..threads {
            let (pointers, f) = (&pointers, &f);
            s.spawn(move || pointers.apply(t * share..((t + 1) * share).min(n), at, f));
        }
        pointers.apply(0..share.min(n), at, &f);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_reach_the_tensor_and_its_views_on_every_thread_count() {
        let n = 100_003;
        let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
        for threads in [1, 2, 3] {
            let mut flat = Tensor::zeros([n as i64 + 5], (Kind::Float, Device::Cpu));
            let mut twice = Tensor::ones([n as i64 + 5], (Kind::Float, Device::Cpu));
            let view = flat.narrow(0, 5, n as i64);
            update_elements(
                [&mut flat, &mut twice],
                5,
                Source::Slice(&values),
                threads,
                |[a, b], x| [a + x, b * x],
            )
            .unwrap();
            assert_eq!(Vec::<f32>::try_from(&view).unwrap(), values, "{threads} threads");
            assert_eq!(Vec::<f32>::try_from(twice.narrow(0, 0, 5)).unwrap(), [1.0; 5]);
            assert_eq!(f32::try_from(twice.get(n as i64 + 4)).unwrap(), (n - 1) as f32);
        }
    }

    #[test]
    fn reads_a_narrowed_tensor_from_its_own_first_element() {
        let base = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]);
        let tail = base.narrow(0, 2, 2);
        let mut out = Tensor::zeros([2], (Kind::Float, Device::Cpu));
        update_elements([&mut out], 0, Source::Tensor(&tail), 1, |_, x| [x]).unwrap();
        assert_eq!(Vec::<f32>::try_from(&out).unwrap(), [3.0, 4.0]);
        assert_eq!(sum_of_squares(Source::Tensor(&tail)).unwrap(), 25.0);
        let many: Vec<f32> = (1..=19).map(|i| i as f32).collect();
        assert_eq!(sum_of_squares(Source::Slice(&many)).unwrap(), 2470.0);
        assert_eq!(sum_of_squares(Source::Slice(&[])).unwrap(), 0.0);
    }

    #[test]
    fn refuses_what_is_not_plain_float32_memory_out_of_range_or_overlapping() {
        let cpu = (Kind::Float, Device::Cpu);
        let mut flat = Tensor::zeros([4], cpu);
        let two = [1.0f32, 2.0];
        let err = |r: Result<(), ShmError>| r.unwrap_err().to_string();
        let apply =
            |t: &mut Tensor, at: usize, src: Source<'_>| update_elements([t], at, src, 1, |[a], x| [a + x]);
        let mut doubles = Tensor::zeros([4], (Kind::Double, Device::Cpu));
        assert!(err(apply(&mut doubles, 0, Source::Slice(&two))).contains("Double"));
        let mut strided = Tensor::zeros([4, 4], cpu).tr();
        assert!(err(apply(&mut strided, 0, Source::Slice(&two))).contains("not contiguous"));
        assert!(err(apply(&mut Tensor::new(), 0, Source::Slice(&two))).contains("undefined"));
        assert!(err(apply(&mut flat, 3, Source::Slice(&two))).contains("not the 3 + 2"));
        let alias = flat.shallow_clone();
        assert!(err(apply(&mut flat, 0, Source::Tensor(&alias))).contains("overlap"));
        let mut other = Tensor::zeros([4], cpu);
        let mut same = flat.narrow(0, 1, 2);
        let both = update_elements([&mut other, &mut same], 1, Source::Slice(&two[..1]), 1, |v, _| v);
        assert!(
            both.is_ok(),
            "elements 1 of `other` and 2 of `flat` do not overlap"
        );
        let both = update_elements(
            [&mut other, &mut same],
            0,
            Source::Tensor(&flat.narrow(0, 1, 1)),
            1,
            |v, _| v,
        );
        assert!(err(both).contains("overlap"));
        assert_eq!(
            Vec::<f32>::try_from(&flat).unwrap(),
            [0.0; 4],
            "nothing written on an error"
        );
        assert!(apply(&mut other, 2, Source::Tensor(&flat.narrow(0, 0, 2))).is_ok());
    }
}
