//! Adam's update as one loop of ours over a flat tensor of parameters and its two moments, for what libtorch has
//! no single operation for: one pass over every parameter instead of a dozen (rlfactory's `algo::adam` computes
//! the step's constants and calls [`adam_update`]), and the squared norm of the gradients it is clipped to
//! ([`sum_of_squares`]).
//!
//! The elements are read and written through raw pointers, by value (blocks of them copied into local arrays and
//! back): no Rust reference into a tensor's memory is ever made, and no code but this module's runs while the
//! loop holds the tensors' addresses (the update is a fixed function, not a caller's closure, which could resize
//! or free a tensor sharing the storage). Other handles of the same storage, used from another thread at the same
//! time, race with the loop as two in-place libtorch operations would.
//!
//! ```
//! use rlf_shm::tensor::{adam_update, sum_of_squares, AdamStep, Source};
//! use tch::Tensor;
//!
//! let mut values = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
//! let (mut m, mut v) = (values.zeros_like(), values.zeros_like());
//! let grad = Tensor::from_slice(&[0.5f32, -0.5]);
//! // Adam's first step (lr 0.1, β 0.9 and 0.999) on values 1 and 2: each moves by about lr against its gradient.
//! let step = AdamStep {
//!     w1: 0.1,
//!     b2: 0.999,
//!     w2: 0.001,
//!     eps: 1e-8,
//!     neg_step_size: -0.1 / 0.1,
//!     bias_correction2_sqrt: 0.001f32.sqrt(),
//!     scale: 1.0,
//! };
//! adam_update([&mut values, &mut m, &mut v], &[(1, Source::Tensor(&grad))], 1, step)?;
//! let after = Vec::<f32>::try_from(&values)?;
//! assert_eq!(after[0], 1.0);
//! assert!((after[1] - 1.9).abs() < 1e-5 && (after[2] - 3.1).abs() < 1e-5);
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

/// [`adam_update`] splits a gradient of at least this many values between its threads.
pub const SPLIT_MIN: usize = 1 << 16;

/// One Adam step's constants, in float32 as libtorch's CPU kernels apply them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// `1 − β₁`.
    pub w1: f32,
    /// β₂.
    pub b2: f32,
    /// `1 − β₂`.
    pub w2: f32,
    /// ε.
    pub eps: f32,
    /// `−lr / (1 − β₁ᵗ)`.
    pub neg_step_size: f32,
    /// `√(1 − β₂ᵗ)`.
    pub bias_correction2_sqrt: f32,
    /// What the gradients are multiplied by first: a clipping's coefficient, or 1.
    pub scale: f32,
}

impl AdamStep {
    /// One value `p` and its moments `m`, `v` after a step of gradient `g`: PyTorch's operations in its order
    /// (`exp_avg.lerp_(g, 1 − β₁)`, `exp_avg_sq.mul_(β₂).addcmul_(g, g, 1 − β₂)`,
    /// `p.addcdiv_(exp_avg, exp_avg_sq.sqrt() / √(1 − β₂ᵗ) + ε, −step_size)`), each rounded to float32
    /// (libtorch's vectorised kernels may fuse a multiply and an add, and its `lerp` takes another form for a
    /// weight of one half or more: the last bit can differ).
    pub fn element(self, [p, m, v]: [f32; 3], g: f32) -> [f32; 3] {
        let g = g * self.scale;
        let m = m + self.w1 * (g - m);
        let v = v * self.b2 + self.w2 * g * g;
        let p = p + self.neg_step_size * m / (v.sqrt() / self.bias_correction2_sqrt + self.eps);
        [p, m, v]
    }
}

/// Adam's step: for every gradient `(at, g)` of `gradients` and every value `i` of `g`, the elements `at + i` of
/// `values`, `exp_avg` and `exp_avg_sq` (each flat, of the same length) become [`AdamStep::element`] of them and
/// of `g[i]`, a gradient of at least [`SPLIT_MIN`] values split between `threads` threads (at least one). Errors,
/// before anything is written, if a tensor is not a defined, dense, contiguous float32 CPU tensor, if a gradient
/// reaches past the tensors' end, or if the three tensors' elements overlap each other or a gradient's.
pub fn adam_update(
    [values, exp_avg, exp_avg_sq]: [&mut Tensor; 3],
    gradients: &[(usize, Source<'_>)],
    threads: usize,
    step: AdamStep,
) -> Result<(), ShmError> {
    update_elements([values, exp_avg, exp_avg_sq], gradients, threads, |x, g| {
        step.element(x, g)
    })
}

/// The written tensors' and one source's first addresses, for the threads of [`update_elements`].
struct Pointers<const N: usize> {
    write: [*mut f32; N],
    read: *const f32,
}

// SAFETY: the pointers are only dereferenced by `Pointers::apply`, each thread of `update_elements` over its own
// disjoint range of indices, all of them joined before `update_elements` returns (and its borrows of the tensors
// and the sources end).
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
            // source `n` values, and `range.start <= i`, `i + LANES <= whole <= range.end <= n`; each is
            // contiguous, aligned float32 memory kept alive by the borrowed handles, and no written tensor
            // overlaps another or the source. The values are copied by value into local arrays (no reference
            // into the tensors is made), and no other thread of this call touches these indices.
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

/// For every source `(at, source)` and value `i` of it: the elements `at + i` of the `write` tensors become `f` of
/// what they are and of that value, in order, source after source, `threads` threads (at least one) taking equal
/// shares of a source of at least [`SPLIT_MIN`] values (no share under half of it). Checks everything before
/// writing anything (see [`adam_update`]).
fn update_elements<const N: usize>(
    write: [&mut Tensor; N],
    sources: &[(usize, Source<'_>)],
    threads: usize,
    f: impl Fn([f32; N], f32) -> [f32; N] + Sync,
) -> Result<(), ShmError> {
    let written = write
        .iter()
        .enumerate()
        .map(|(k, t)| span(t, &format!("written tensor {k}")))
        .collect::<Result<Vec<_>, _>>()?;
    for (k, w) in written.iter().enumerate() {
        if written[k + 1..].iter().any(|other| overlap(w, other)) {
            return Err(ShmError::Config(format!(
                "written tensor {k} shares elements with another"
            )));
        }
    }
    let len = write.iter().map(|t| t.numel()).min().unwrap_or(0);
    let mut reads = Vec::with_capacity(sources.len());
    for (j, (at, source)) in sources.iter().enumerate() {
        let n = source.len();
        let (read, bytes) = source.span(&format!("source {j}"))?;
        if at.checked_add(n).is_none_or(|end| end > len) {
            return Err(ShmError::Config(format!(
                "source {j} updates elements {at}..{at}+{n} of tensors of {len}"
            )));
        }
        if n > 0 && written.iter().any(|w| overlap(w, &bytes)) {
            return Err(ShmError::Config(format!(
                "source {j} shares elements with a written tensor"
            )));
        }
        reads.push((*at, n, read));
    }
    let write = write.map(|t| t.data_ptr().cast::<f32>());
    for (at, n, read) in reads {
        let pointers = Pointers { write, read };
        // Each thread takes at least half of `SPLIT_MIN` values.
        let threads = threads.clamp(1, (n / (SPLIT_MIN / 2)).max(1));
        if threads == 1 {
            pointers.apply(0..n, at, &f);
            continue;
        }
        let share = n.div_ceil(threads);
        let part = |t: usize| (t * share).min(n)..((t + 1) * share).min(n);
        std::thread::scope(|s| {
            for t in 1..threads {
                let (pointers, f, range) = (&pointers, &f, part(t));
                s.spawn(move || pointers.apply(range, at, f));
            }
            pointers.apply(part(0), at, &f);
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: (Kind, Device) = (Kind::Float, Device::Cpu);

    #[test]
    fn updates_reach_the_tensor_and_its_views_on_every_thread_count() {
        let n = 100_003;
        let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let head = Tensor::from_slice(&[7.0f32, 8.0, 9.0]);
        for threads in [1, 2, 3, 1_000_000] {
            let mut flat = Tensor::zeros([n as i64 + 5], CPU);
            let mut product = Tensor::ones([n as i64 + 5], CPU);
            let view = flat.narrow(0, 5, n as i64);
            let sources = [(5, Source::Slice(&values)), (0, Source::Tensor(&head))];
            update_elements([&mut flat, &mut product], &sources, threads, |[a, b], x| {
                [a + x, b * x]
            })
            .unwrap();
            assert_eq!(Vec::<f32>::try_from(&view).unwrap(), values, "{threads} threads");
            let first = Vec::<f32>::try_from(flat.narrow(0, 0, 5)).unwrap();
            assert_eq!(first, [7.0, 8.0, 9.0, 0.0, 0.0]);
            assert_eq!(
                Vec::<f32>::try_from(product.narrow(0, 3, 3)).unwrap(),
                [1.0, 1.0, 0.0]
            );
            assert_eq!(f32::try_from(product.get(n as i64 + 4)).unwrap(), (n - 1) as f32);
        }
    }

    #[test]
    fn adam_update_moves_each_value_against_its_gradient_by_the_rate() {
        let mut values = Tensor::zeros([SPLIT_MIN as i64 + 3], CPU);
        let (mut m, mut v) = (values.zeros_like(), values.zeros_like());
        let grad: Vec<f32> = (0..SPLIT_MIN + 3)
            .map(|i| if i % 2 == 0 { 2.0 } else { -0.5 })
            .collect();
        let step = AdamStep {
            w1: 0.1,
            b2: 0.999,
            w2: 0.001,
            eps: 1e-8,
            neg_step_size: -0.01 / 0.1,
            bias_correction2_sqrt: 0.001f32.sqrt(),
            scale: 0.5,
        };
        adam_update(
            [&mut values, &mut m, &mut v],
            &[(0, Source::Slice(&grad))],
            2,
            step,
        )
        .unwrap();
        let after = Vec::<f32>::try_from(&values).unwrap();
        for (i, (p, g)) in after.iter().zip(&grad).enumerate() {
            assert!(
                (p + 0.01 * g.signum()).abs() < 1e-6,
                "value {i}: {p} after gradient {g}"
            );
        }
        let m = Vec::<f32>::try_from(&m).unwrap();
        assert_eq!(m[0], 0.1 * 0.5 * 2.0, "the first moment of the scaled gradient");
    }

    #[test]
    fn sums_squares_of_tensors_and_slices() {
        let base = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]);
        assert_eq!(
            sum_of_squares(Source::Tensor(&base.narrow(0, 2, 2))).unwrap(),
            25.0
        );
        let many: Vec<f32> = (1..=19).map(|i| i as f32).collect();
        assert_eq!(sum_of_squares(Source::Slice(&many)).unwrap(), 2470.0);
        assert_eq!(sum_of_squares(Source::Slice(&[])).unwrap(), 0.0);
    }

    #[test]
    fn refuses_before_writing_what_is_not_plain_float32_memory_out_of_range_or_overlapping() {
        let two = [1.0f32, 2.0];
        let add = |[a]: [f32; 1], x: f32| [a + x];
        let err = |r: Result<(), ShmError>| r.unwrap_err().to_string();
        let mut doubles = Tensor::zeros([4], (Kind::Double, Device::Cpu));
        assert!(err(update_elements([&mut doubles], &[], 1, add)).contains("Double"));
        let mut strided = Tensor::zeros([4, 4], CPU).tr();
        assert!(err(update_elements([&mut strided], &[], 1, add)).contains("not contiguous"));
        assert!(err(update_elements([&mut Tensor::new()], &[], 1, add)).contains("undefined"));

        let mut flat = Tensor::zeros([4], CPU);
        let alias = flat.shallow_clone();
        let good = (0, Source::Slice(&two));
        let past_the_end = [good, (3, Source::Slice(&two))];
        assert!(err(update_elements([&mut flat], &past_the_end, 1, add))
            .contains("elements 3..3+2 of tensors of 4"));
        let aliased = [good, (0, Source::Tensor(&alias.narrow(0, 3, 1)))];
        assert!(
            err(update_elements([&mut flat], &aliased, 1, add)).contains("shares elements with a written")
        );
        let (mut middle, mut again) = (flat.narrow(0, 1, 2), flat.shallow_clone());
        let both = update_elements(
            [&mut middle, &mut again],
            &[(0, Source::Slice(&two[..1]))],
            1,
            |v, _| v,
        );
        assert!(err(both).contains("shares elements with another"));
        let mut other = Tensor::zeros([4], CPU);
        assert_eq!(
            Vec::<f32>::try_from(&flat).unwrap(),
            [0.0; 4],
            "nothing written on an error"
        );
        let other_source = [(2, Source::Tensor(&flat.narrow(0, 0, 2)))];
        assert!(update_elements([&mut other], &other_source, 1, add).is_ok());
    }
}
