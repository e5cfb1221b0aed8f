//! Typed arrays and seqlock-published values in shared memory: the data plane of the sampler, and a run's live
//! figures ([`SharedBoard`]).
//!
//! - [`ShmArray<T>`]: a fixed-length array of plain values ([`Pod`]: `f32`, `u8`, `u32`, `u64`, `i64`) in a
//!   [`Region`], read and written by whole slices ([`ShmArray::copy_from_slice`], [`ShmArray::copy_to_slice`]).
//!   It carries no synchronisation of its own: who may touch which range is decided by a protocol on top (in
//!   rlfactory, a buffer index travels through a queue, so at any time one process owns a range; the queue's lock
//!   orders the writes before the reads). A range written while another process reads it yields some mix of old and
//!   new values (every bit pattern is a valid `Pod` value), never undefined behaviour.
//! - [`SharedWeights`]: one writer publishes a vector of `f32` with a version number; any number of readers copy it
//!   out. A seqlock makes torn reads impossible:
//!
//!   | step | writer | reader |
//!   |---|---|---|
//!   | 1 | `seq += 1` (odd: write in progress), release fence | `s1 = seq` (acquire); odd → [`TornRead`] |
//!   | 2 | store the version and every value (relaxed atomics) | load the version and every value (relaxed atomics) |
//!   | 3 | `seq += 1` (even), release | acquire fence, `s2 = seq`; `s1 != s2` → [`TornRead`] |
//!
//!   Values are stored as `AtomicU32` words, so concurrent access is never a data race. A reader never waits: on
//!   [`TornRead`] it keeps what it had and tries again at its next opportunity. A writer killed mid-write leaves
//!   `seq` odd and every later read torn: readers keep the last complete vector.
//!
//! ```
//! use rlf_shm::{ShmArray, SharedWeights};
//!
//! let a = ShmArray::<f32>::create(8)?;
//! let b = ShmArray::<f32>::open(&a.handle())?; // in another process, from the serialised handle
//! a.copy_from_slice(2, &[1.0, 2.0]);
//! let mut out = [0.0; 2];
//! b.copy_to_slice(2, &mut out);
//! assert_eq!(out, [1.0, 2.0]);
//!
//! let w = SharedWeights::create(3)?;
//! w.publish(7, &[0.5, 1.5, 2.5]);
//! let mut v = vec![0.0; 3];
//! assert_eq!(SharedWeights::open(&w.handle())?.try_read(&mut v), Ok(7));
//! assert_eq!(v, [0.5, 1.5, 2.5]);
//! # Ok::<(), rlf_shm::ShmError>(())
//! ```

use std::marker::PhantomData;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::region::{Region, RegionHandle, ShmError};

mod sealed {
    pub trait Sealed {}
}

/// Plain values with no invalid bit pattern and no padding, safe to share between processes as bytes.
/// Implemented for `f32`, `u8`, `u32`, `u64` and `i64` only (sealed).
pub trait Pod: sealed::Sealed + Copy + Default + Send + Sync + 'static {}

macro_rules! pod {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Pod for $t {}
    )*};
}
pod!(f32, u8, u32, u64, i64);

/// Serialisable description of a [`ShmArray`]: its region and its length in elements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmArrayHandle {
    /// The region.
    pub region: RegionHandle,
    /// Elements.
    pub len: usize,
}

/// A fixed-length array of `T` in shared memory (see the module doc for who may touch what).
#[derive(Debug)]
pub struct ShmArray<T: Pod> {
    region: Region,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> ShmArray<T> {
    /// A new zero-filled array of `len` elements.
    pub fn create(len: usize) -> Result<Self, ShmError> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            ShmError::Config(format!(
                "an array of {len} elements does not fit the address space"
            ))
        })?;
        let region = Region::create(bytes.max(1))?;
        Ok(Self {
            region,
            len,
            _t: PhantomData,
        })
    }

    /// Maps an array created by another process.
    pub fn open(handle: &ShmArrayHandle) -> Result<Self, ShmError> {
        let region = Region::open(&handle.region)?;
        if handle
            .len
            .checked_mul(size_of::<T>())
            .is_none_or(|b| b > region.len())
        {
            return Err(ShmError::Invalid {
                name: region.name().to_owned(),
                what: format!("{} bytes cannot hold {} elements", region.len(), handle.len),
            });
        }
        Ok(Self {
            region,
            len: handle.len,
            _t: PhantomData,
        })
    }

    /// The handle to pass to other processes.
    pub fn handle(&self) -> ShmArrayHandle {
        ShmArrayHandle {
            region: self.region.handle(),
            len: self.len,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array has no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, n: usize) {
        assert!(
            offset.checked_add(n).is_some_and(|end| end <= self.len),
            "ShmArray range {offset}..{offset}+{n} out of bounds (len {})",
            self.len
        );
    }

    /// Writes `src` at `offset`. Panics if the range is out of bounds.
    pub fn copy_from_slice(&self, offset: usize, src: &[T]) {
        self.check(offset, src.len());
        // SAFETY: the range is in bounds (checked above) of a mapping that lives as long as `self.region`, and the
        // region is aligned to a page, so `offset` elements in it are aligned for `T`. `T: Pod` has no invalid bit
        // pattern, so a concurrent access by another process (excluded by the protocol on top) could only produce
        // mixed values. `src` is process-local memory and cannot overlap the mapping through a `&[T]` of it, since
        // this type never hands out references into the mapping.
        unsafe {
            let dst = self.region.as_ptr().cast::<T>().add(offset);
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
        }
    }

    /// Reads `dst.len()` elements from `offset`. Panics if the range is out of bounds.
    pub fn copy_to_slice(&self, offset: usize, dst: &mut [T]) {
        self.check(offset, dst.len());
        // SAFETY: as in `copy_from_slice`: in bounds, aligned, every bit pattern valid, no reference into the
        // mapping exists that `dst` could alias.
        unsafe {
            let src = self.region.as_ptr().cast::<T>().add(offset);
            std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len());
        }
    }
}

#[cfg(feature = "tch")]
impl<T: Pod + tch::kind::Element> ShmArray<T> {
    /// A tensor of `T`'s kind (`f32`: float, `u8`: byte, ...) and `shape` (row-major) viewing the elements from
    /// `offset`, without a copy:
    /// reads see what other processes wrote. Only an array that is never unmapped can be viewed:
    /// one leaked for the rest of the process (`Box::leak`; its creator still removes the region). Writing through it is the caller's business under
    /// the protocol on top (as for [`copy_from_slice`](Self::copy_from_slice)). Errors if the
    /// shape has a negative size or does not fit.
    pub fn tensor(&'static self, offset: usize, shape: &[i64]) -> Result<tch::Tensor, ShmError> {
        let n = shape.iter().try_fold(1usize, |n, &d| {
            usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
        });
        let Some(n) = n.filter(|&n| offset.checked_add(n).is_some_and(|end| end <= self.len)) else {
            return Err(ShmError::Config(format!(
                "a tensor of shape {shape:?} at element {offset} does not fit an array of {}",
                self.len
            )));
        };
        if n == 0 {
            return tch::Tensor::f_zeros(shape, (T::KIND, tch::Device::Cpu))
                .map_err(|e| ShmError::Config(e.to_string()));
        }
        // SAFETY: the elements offset..offset+n are in bounds (checked above) of a mapping that is never unmapped
        // (`&'static self`: the array was leaked), aligned for `T` (page-aligned region), and every bit pattern is
        // a valid `T` (`Pod`), which `T::KIND` describes with the same size (`Element`'s contract); the tensor gets
        // the default (contiguous) strides of `shape`, covering exactly those elements.
        unsafe {
            let data = self.region.as_ptr().cast::<T>().add(offset).cast::<u8>();
            tch::Tensor::f_from_blob(data, shape, &[], T::KIND, tch::Device::Cpu)
        }
        .map_err(|e| ShmError::Config(e.to_string()))
    }
}

/// A read overlapped a write (or the writer died mid-write): keep the previous copy and read again later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the shared value was being written during the read")]
pub struct TornRead;

/// Serialisable description of a [`SharedWeights`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedWeightsHandle {
    /// The region.
    pub region: RegionHandle,
    /// Values.
    pub len: usize,
}

/// Header words: the sequence counter and the published tag (a version, a length), then the words from byte 64.
const HEADER: usize = 64;

/// The seqlock of the module doc over a region: the sequence word, a tag word, then `len` 32-bit words.
#[derive(Debug)]
struct Seqlock {
    region: Region,
    len: usize,
}

impl Seqlock {
    /// The bytes a seqlock of `len` words needs.
    fn bytes(len: usize) -> Option<usize> {
        len.checked_mul(4).and_then(|b| b.checked_add(HEADER))
    }

    /// Checks that `region` holds `len` words.
    fn over(region: Region, len: usize) -> Result<Self, ShmError> {
        if Self::bytes(len).is_none_or(|b| b > region.len()) {
            return Err(ShmError::Invalid {
                name: region.name().to_owned(),
                what: format!("{} bytes cannot hold {len} words and a header", region.len()),
            });
        }
        Ok(Self { region, len })
    }

    fn seq(&self) -> &AtomicU64 {
        // SAFETY: byte 0 of a page-aligned mapping of at least HEADER bytes, living as long as `self`; the word is
        // only ever accessed atomically.
        unsafe { &*self.region.as_ptr().cast::<AtomicU64>() }
    }

    fn tag(&self) -> &AtomicU64 {
        // SAFETY: byte 8 of the header, 8-aligned, only accessed atomically.
        unsafe { &*self.region.as_ptr().add(8).cast::<AtomicU64>() }
    }

    fn words(&self) -> &[AtomicU32] {
        // SAFETY: `len` 4-aligned words from byte HEADER, inside the mapping (checked in `over`), only ever
        // accessed atomically.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr().add(HEADER).cast::<AtomicU32>(), self.len) }
    }

    /// Writes `tag` and the first words from `words` (one writer at a time).
    fn publish(&self, tag: u64, words: impl Iterator<Item = u32>) {
        let seq = self.seq();
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        self.tag().store(tag, Ordering::Relaxed);
        for (w, v) in self.words().iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        seq.store((s | 1).wrapping_add(1), Ordering::Release);
    }

    /// Reads the tag and the first `out.len()` words, each through `convert`; [`TornRead`] if a write overlapped
    /// (`out` then holds garbage).
    fn try_read<T>(&self, out: &mut [T], convert: impl Fn(u32) -> T) -> Result<u64, TornRead> {
        let seq = self.seq();
        let s1 = seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return Err(TornRead);
        }
        let tag = self.tag().load(Ordering::Relaxed);
        for (o, w) in out.iter_mut().zip(self.words()) {
            *o = convert(w.load(Ordering::Relaxed));
        }
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) != s1 {
            return Err(TornRead);
        }
        Ok(tag)
    }
}

/// A vector of `f32` published by one writer with a version number and read by many (seqlock, see the module doc).
#[derive(Debug)]
pub struct SharedWeights {
    lock: Seqlock,
}

impl SharedWeights {
    /// New shared weights of `len` values, version 0, all zero.
    pub fn create(len: usize) -> Result<Self, ShmError> {
        let bytes = Seqlock::bytes(len)
            .ok_or_else(|| ShmError::Config(format!("{len} weights do not fit the address space")))?;
        Ok(Self {
            lock: Seqlock::over(Region::create(bytes)?, len)?,
        })
    }

    /// Maps shared weights created by another process.
    pub fn open(handle: &SharedWeightsHandle) -> Result<Self, ShmError> {
        Ok(Self {
            lock: Seqlock::over(Region::open(&handle.region)?, handle.len)?,
        })
    }

    /// The handle to pass to other processes.
    pub fn handle(&self) -> SharedWeightsHandle {
        SharedWeightsHandle {
            region: self.lock.region.handle(),
            len: self.lock.len,
        }
    }

    /// Values.
    pub fn len(&self) -> usize {
        self.lock.len
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.lock.len == 0
    }

    /// The version of the last publication begun (0 before the first), without reading the values: a reader that
    /// wants the values as of a version reads them with [`SharedWeights::try_read`], which says which it got.
    pub fn version(&self) -> u64 {
        self.lock.tag().load(Ordering::Acquire)
    }

    /// Publishes `values` as `version`. There must be one writer at a time. Panics if the length differs.
    pub fn publish(&self, version: u64, values: &[f32]) {
        assert_eq!(values.len(), self.len(), "SharedWeights::publish: wrong length");
        self.lock.publish(version, values.iter().map(|v| v.to_bits()));
    }

    /// Copies the values into `out` and returns their version, or [`TornRead`] if a write overlapped the read
    /// (`out` then holds garbage). Panics if the length differs.
    pub fn try_read(&self, out: &mut [f32]) -> Result<u64, TornRead> {
        assert_eq!(out.len(), self.len(), "SharedWeights::try_read: wrong length");
        self.lock.try_read(out, f32::from_bits)
    }
}

/// A message of up to a fixed number of bytes that one writer replaces as a whole and any process reads (the same
/// seqlock as [`SharedWeights`], the tag word holding the length): a run's live figures for `rlfactory top`. It
/// lives in a tagged segment ([`Region::create_tagged`]) that readers find by its tag.
#[derive(Debug)]
pub struct SharedBoard {
    lock: Seqlock,
}

impl SharedBoard {
    /// A new, empty board of up to `capacity` bytes, tagged `tag`.
    pub fn create_tagged(tag: &str, capacity: usize) -> Result<Self, ShmError> {
        let words = capacity.div_ceil(4);
        let bytes = Seqlock::bytes(words).ok_or_else(|| {
            ShmError::Config(format!(
                "a board of {capacity} bytes does not fit the address space"
            ))
        })?;
        Ok(Self {
            lock: Seqlock::over(Region::create_tagged(tag, bytes)?, words)?,
        })
    }

    /// Maps the board of segment `name` (as [`crate::region::tagged`] lists it).
    pub fn open_named(name: &str) -> Result<Self, ShmError> {
        let region = Region::open_named(name)?;
        let words = region.len().saturating_sub(HEADER) / 4;
        Ok(Self {
            lock: Seqlock::over(region, words)?,
        })
    }

    /// The most bytes a message can hold.
    pub fn capacity(&self) -> usize {
        self.lock.len * 4
    }

    /// Replaces the message with `bytes`; `false` (and nothing written) if they do not fit. One writer at a time.
    pub fn publish(&self, bytes: &[u8]) -> bool {
        if bytes.len() > self.capacity() {
            return false;
        }
        let words = bytes.chunks(4).map(|c| {
            let mut w = [0; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(w)
        });
        self.lock.publish(bytes.len() as u64, words);
        true
    }

    /// The message (empty before the first), or [`TornRead`] if a write overlapped the read.
    pub fn try_read(&self) -> Result<Vec<u8>, TornRead> {
        // The length as it stands, then the message under the seqlock, which must have kept that length.
        let len = (self.lock.tag().load(Ordering::Relaxed) as usize).min(self.capacity());
        let mut words = vec![0; len.div_ceil(4)];
        if self.lock.try_read(&mut words, |w| w)? != len as u64 {
            return Err(TornRead);
        }
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.truncate(len);
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn array_round_trips_between_mappings() {
        let a = ShmArray::<u64>::create(5).unwrap();
        let b = ShmArray::<u64>::open(&a.handle()).unwrap();
        a.copy_from_slice(1, &[10, 20, 30]);
        let mut out = [0u64; 5];
        b.copy_to_slice(0, &mut out);
        assert_eq!(out, [0, 10, 20, 30, 0]);
        assert_eq!(b.len(), 5);
    }

    #[cfg(feature = "tch")]
    #[test]
    fn a_tensor_views_the_shared_array_without_a_copy() {
        let a = ShmArray::<f32>::create(6).unwrap();
        let view: &'static ShmArray<f32> = Box::leak(Box::new(ShmArray::open(&a.handle()).unwrap()));
        let t = view.tensor(2, &[2, 2]).unwrap();
        a.copy_from_slice(0, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            Vec::<f32>::try_from(t.reshape([-1])).unwrap(),
            [3.0, 4.0, 5.0, 6.0]
        );
        assert!(view.tensor(3, &[2, 2]).is_err());
        assert!(view.tensor(0, &[-1, 2]).is_err());
        assert_eq!(view.tensor(6, &[0, 4]).unwrap().size(), [0, 4]);
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn array_rejects_out_of_bounds() {
        let a = ShmArray::<f32>::create(4).unwrap();
        a.copy_from_slice(3, &[1.0, 2.0]);
    }

    #[test]
    fn open_rejects_a_handle_larger_than_the_region() {
        let a = ShmArray::<u8>::create(16).unwrap();
        let mut h = a.handle();
        h.len = 1 << 20;
        assert!(ShmArray::<u8>::open(&h).is_err());
    }

    #[test]
    fn a_board_round_trips_messages_of_any_length_up_to_its_capacity() {
        let tag = format!("board-test_{}", std::process::id());
        let board = SharedBoard::create_tagged(&tag, 10).unwrap();
        assert_eq!(board.capacity(), 12);
        let (pid, name) = tagged_exactly(&tag);
        assert_eq!(pid, std::process::id());
        let reader = SharedBoard::open_named(&name).unwrap();
        assert_eq!(reader.try_read(), Ok(Vec::new()));
        for message in [&b"hello"[..], b"", b"twelve bytes", b"abc"] {
            assert!(board.publish(message));
            assert_eq!(reader.try_read().as_deref(), Ok(message));
        }
        assert!(!board.publish(b"thirteen byte"), "too long");
        assert_eq!(
            reader.try_read().as_deref(),
            Ok(&b"abc"[..]),
            "a refused message writes nothing"
        );
    }

    /// A writer publishes messages of changing lengths, each of one repeated byte; concurrent readers see whole
    /// messages only.
    #[test]
    fn board_reads_are_never_torn() {
        let tag = format!("board-torn_{}", std::process::id());
        let board = SharedBoard::create_tagged(&tag, 4096).unwrap();
        let (_, name) = tagged_exactly(&tag);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let r = SharedBoard::open_named(&name).unwrap();
                let mut whole = 0;
                let check = |m: &[u8]| {
                    assert!(m.iter().all(|&b| Some(&b) == m.first()), "a torn message");
                    assert_eq!(m.len(), m.first().map_or(0, |&b| 1 + 13 * b as usize % 4000));
                };
                while !done.load(Ordering::Acquire) {
                    if let Ok(m) = r.try_read() {
                        check(&m);
                        whole += 1;
                    }
                }
                let last = r
                    .try_read()
                    .expect("no write in progress after the writer stopped");
                check(&last);
                (whole, last)
            });
            for i in 0..20_000u32 {
                let b = (i % 251) as u8;
                assert!(board.publish(&vec![b; 1 + 13 * b as usize % 4000]));
            }
            done.store(true, Ordering::Release);
            let (_, last) = reader.join().unwrap();
            let b = (19_999 % 251) as u8;
            assert_eq!(last, vec![b; 1 + 13 * b as usize % 4000]);
        });
    }

    /// The one segment tagged exactly `tag` (tests of other processes may hold tags that `tag` begins).
    fn tagged_exactly(tag: &str) -> (u32, String) {
        let mut found = crate::region::tagged(tag).unwrap();
        found.retain(|(_, name)| name.ends_with(&format!(".t-{tag}")));
        assert_eq!(found.len(), 1, "{found:?}");
        found.remove(0)
    }

    /// A writer publishes vectors whose values all equal the version; concurrent readers must never see a mix.
    #[test]
    fn seqlock_reads_are_never_torn() {
        let w = Arc::new(SharedWeights::create(4096).unwrap());
        let handle = w.handle();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let h = handle.clone();
                std::thread::spawn(move || {
                    let r = SharedWeights::open(&h).unwrap();
                    let mut buf = vec![0.0f32; 4096];
                    let (mut ok, mut torn, mut last) = (0u32, 0u32, 0u64);
                    while last < 2000 {
                        match r.try_read(&mut buf) {
                            Ok(v) => {
                                assert!(buf.iter().all(|&x| x == v as f32), "torn read at version {v}");
                                assert!(v >= last, "versions go forward");
                                last = v;
                                ok += 1;
                            }
                            Err(TornRead) => torn += 1,
                        }
                    }
                    (ok, torn)
                })
            })
            .collect();
        let values: Vec<Vec<f32>> = (0..=2000).map(|v| vec![v as f32; 4096]).collect();
        for (v, vals) in values.iter().enumerate() {
            w.publish(v as u64, vals);
        }
        for r in readers {
            let (ok, _torn) = r.join().unwrap();
            assert!(ok > 0);
        }
        assert_eq!(w.version(), 2000);
    }
}
