//! A replay ring: a fixed number of rows of `f32` words in shared memory, written by any number of processes
//! and sampled by any number of readers, with a monotonic insert counter that readers can sleep on.
//!
//! # Layout
//! One region: a `Header`, then one `u64` stamp per row, then the rows (`row_words` words each, stored as
//! `AtomicU32` bit patterns, so concurrent access is never a data race). A ring of capacity `c` has `c + 1` rows:
//! the extra one is the row the next insert writes, so the last `c` inserts are always intact, even when a writer
//! dies in the middle of overwriting the oldest row.
//!
//! # Protocol
//! - **Inserts** are serialised by a process-shared robust mutex. Insert number `k` (counting from 0) goes to row
//!   `k % (capacity + 1)`: the writer stores the row's stamp `2k + 1` (odd: being written), a release fence, the words,
//!   then the stamp `2k + 2` (even: complete) with release, and only then the insert counter `k + 1`. So a row
//!   becomes visible (its index below the counter) only after it is completely written.
//! - **A writer killed mid-row** leaves its row's stamp odd and the counter unchanged. The kernel releases the
//!   robust lock; the next writer is told (`EOWNERDEAD`) and writes insert `k` again into the same row. No reader
//!   ever accepts a row whose stamp is odd, so the half-written row is never seen.
//! - **Reads** are seqlock reads of one row: load the stamp (acquire), copy the words, acquire fence, load the
//!   stamp again. The row is insert `k` only if both loads are `2k + 2`; otherwise it was being overwritten (the
//!   ring wrapped onto it) and the read reports [`Gone`]. Visible inserts are the last `capacity` below the counter,
//!   so a sampler draws among them and draws again for a row that is gone.
//! - **Waiting** for "counter ≥ target": a waiter registers (`waiters += 1`), reads the futex word, then checks the
//!   counter, and sleeps on the word only if the target is not met. A writer stores the counter, then reads
//!   `waiters` and, if non-zero, bumps the word and wakes every sleeper. All four are sequentially consistent: either
//!   the waiter's check sees the new counter, or the writer sees the waiter registered and its bump comes after the
//!   waiter's read of the word, so the kernel refuses to sleep on the stale value. No wake-up is lost, none is
//!   needed by a waiter whose target is not met (it is not woken unless the counter moved), and a writer with no
//!   waiter makes no system call. [`ReplayRing::interrupt`] and [`ReplayRing::close`] end every wait at once.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::header::{self, ControlBlock};
use crate::region::{Region, RegionHandle, ShmError};
use crate::sync::{Futex, RobustMutex};

const MAGIC: u64 = 0x726c_662d_7265_706c; // "rlf-repl"

// SAFETY: Header is `#[repr(C)]`, aligned to 64 bytes; it holds atomics, numbers and a RobustMutex, all valid when
// zero.
unsafe impl ControlBlock for Header {
    const WHAT: &'static str = "an rlfactory replay ring";
    const MAGIC: u64 = MAGIC;

    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }

    fn lock(&mut self) -> *mut RobustMutex {
        &raw mut self.lock
    }
}

/// The ring's shared state.
#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    capacity: u64,
    row_words: u64,
    lock: RobustMutex,
    /// Inserts completed: rows below it (the last `capacity`) are visible.
    inserted: AtomicU64,
    /// Writers that died mid-row (their inserts were written again by the next writer).
    writer_deaths: AtomicU64,
    /// Bumped when a waiter may have to wake (a publish with waiters, an interrupt, the close).
    wake: Futex,
    waiters: AtomicU32,
    interrupts: AtomicU32,
    closed: AtomicU32,
    /// The rate limit ([`RateLimit`]; `limited` 0: none), fixed at creation.
    limited: u64,
    samples_per_insert: f64,
    min_size_to_sample: u64,
    error_buffer: f64,
    /// Samples the learners recorded ([`ReplayRing::record_samples`]).
    sampled: AtomicU64,
    /// Bumped when a writer held back by the rate limit may go on (samples recorded, an interrupt, the close).
    sample_wake: Futex,
    insert_waiters: AtomicU32,
    /// Writers that put in their last rows ([`ReplayRing::finish_writer`]); waited for on `wake`.
    writers_finished: AtomicU32,
    /// Inserts the rate limit held back (counted as they begin to wait), and the microseconds of their finished
    /// waits ([`ReplayRing::stalls`]).
    stalls: AtomicU64,
    stalled_micros: AtomicU64,
}

/// DeepMind Reverb's samples-per-insert rate limiter (`SampleToInsertRatio`): the learners' samples and the
/// writers' inserts are kept near `samples_per_insert` samples per insert, within `error_buffer` samples either side
/// of the ratio once `min_size_to_sample` rows were inserted. An insert that would put the samples more than the
/// buffer behind waits for samples (the learner is the slow side); a sample that would run more than the buffer
/// ahead waits for inserts (the writers are). So what is learned does not depend on which side is faster.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Samples per inserted row (`--replay_ratio`).
    pub samples_per_insert: f64,
    /// Inserts before the first sample (`--learning_starts`); inserts up to it never wait.
    pub min_size_to_sample: u64,
    /// Samples the two sides may drift from the ratio, either way; at least `max(1, samples_per_insert)`.
    pub error_buffer: f64,
}

impl RateLimit {
    /// `inserts * ratio - samples` must stay between these two.
    fn bounds(&self) -> (f64, f64) {
        let offset = self.samples_per_insert * self.min_size_to_sample as f64;
        (offset - self.error_buffer, offset + self.error_buffer)
    }

    /// Whether `rows` more inserts are allowed after `inserts` inserts and `samples` samples.
    pub fn can_insert(&self, inserts: u64, samples: u64, rows: u64) -> bool {
        let after = inserts + rows;
        after <= self.min_size_to_sample
            || after as f64 * self.samples_per_insert - samples as f64 <= self.bounds().1
    }

    /// How many of `rows` inserts are allowed now, after `inserts` inserts and `samples` samples.
    pub fn allowed(&self, inserts: u64, samples: u64, rows: u64) -> u64 {
        let below_min = self.min_size_to_sample.saturating_sub(inserts);
        let within = ((self.bounds().1 + samples as f64) / self.samples_per_insert).floor() - inserts as f64;
        below_min.max(within.max(0.0) as u64).min(rows)
    }

    /// The insert count at which `n` more samples are allowed after `samples` samples.
    pub fn sample_target(&self, samples: u64, n: u64) -> u64 {
        let needed = ((samples + n) as f64 + self.bounds().0) / self.samples_per_insert;
        self.min_size_to_sample.max(needed.max(0.0).ceil() as u64)
    }
}

fn stamps_offset() -> usize {
    std::mem::size_of::<Header>().next_multiple_of(64)
}

fn rows_offset(rows: usize) -> usize {
    (stamps_offset() + rows * 8).next_multiple_of(64)
}

/// The bytes of a ring of `capacity` (`capacity + 1` rows) of `row_words` words, if it fits the address space.
fn footprint(capacity: usize, row_words: usize) -> Option<usize> {
    let rows = capacity.checked_add(1)?;
    rows.checked_mul(8)?;
    rows.checked_mul(row_words)?
        .checked_mul(4)?
        .checked_add(rows_offset(rows))
}

/// Everything another process needs to open the ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayRingHandle {
    /// The region holding the ring.
    pub region: RegionHandle,
}

/// The row asked for is no longer (or not yet) in the ring, or was being overwritten during the read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("replay row {0} is not in the ring")]
pub struct Gone(pub u64);

/// Why an insert failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InsertError {
    /// The row does not have `row_words` words.
    #[error("a replay row of {got} words, the ring holds rows of {expected}")]
    RowSize {
        /// The ring's row size.
        expected: usize,
        /// The row given.
        got: usize,
    },
    /// Another writer held the lock past the deadline.
    #[error("the replay ring's lock was not free before the deadline")]
    Timeout,
    /// The rate limit held rows back past the deadline: the first `inserted` rows of the call went in, the rest did
    /// not.
    #[error("the rate limit held the rows back past the deadline ({inserted} went in)")]
    HeldBack {
        /// Rows of the call inserted before the deadline.
        inserted: usize,
    },
    /// The ring was closed: the first `inserted` rows of the call went in before, the rest did not.
    #[error("the replay ring is closed ({inserted} rows went in)")]
    Closed {
        /// Rows of the call inserted before the close.
        inserted: usize,
    },
    /// [`ReplayRing::interrupt`] was called while the insert waited for the learners (rate limit): the first
    /// `inserted` rows of the call went in, the rest did not.
    #[error("the insert was interrupted ({inserted} rows went in)")]
    Interrupted {
        /// Rows of the call inserted before the interrupt.
        inserted: usize,
    },
    /// [`ReplayRing::restore`] on a ring that was already inserted into or sampled from.
    #[error("only an untouched replay ring can be restored, this one holds {inserted} inserts")]
    NotEmpty {
        /// Inserts the ring holds.
        inserted: u64,
    },
}

/// How a [`ReplayRing::wait_for`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The insert counter reached the target; it holds this value.
    Reached(u64),
    /// [`ReplayRing::interrupt`] was called during the wait.
    Interrupted,
    /// The deadline passed first.
    Timeout,
    /// The ring was closed.
    Closed,
}

/// A replay ring in shared memory (see the module doc). `&ReplayRing` is `Sync`: threads share one mapping, other
/// processes open the ring from its [`ReplayRingHandle`]. The creator's drop removes the segment's name.
pub struct ReplayRing {
    region: Region,
    capacity: usize,
    row_words: usize,
    limit: Option<RateLimit>,
}

impl std::fmt::Debug for ReplayRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayRing")
            .field("capacity", &self.capacity)
            .field("row_words", &self.row_words)
            .field("inserted", &self.inserted())
            .finish_non_exhaustive()
    }
}

impl ReplayRing {
    /// A new, empty ring of `capacity` rows of `row_words` words, its inserts and samples held to `limit` if any.
    pub fn create(capacity: usize, row_words: usize, limit: Option<RateLimit>) -> Result<Self, ShmError> {
        if let Some(l) = limit {
            let valid = l.samples_per_insert > 0.0
                && l.samples_per_insert.is_finite()
                && l.error_buffer >= l.samples_per_insert.max(1.0)
                && l.error_buffer.is_finite();
            if !valid {
                return Err(ShmError::Config(format!(
                    "a rate limit needs samples per insert > 0 and an error buffer of at least max(1, samples per \
                     insert), got {} and {}",
                    l.samples_per_insert, l.error_buffer
                )));
            }
        }
        let too_big = || {
            ShmError::Config(format!(
                "a replay ring of {capacity} rows of {row_words} words is too large"
            ))
        };
        if capacity == 0 || row_words == 0 {
            return Err(ShmError::Config(format!(
                "a replay ring needs at least one row of one word, got {capacity} rows of {row_words}"
            )));
        }
        let bytes = footprint(capacity, row_words).ok_or_else(too_big)?;
        let region = Region::create(bytes)?;
        header::publish(&region, |hdr: &mut Header| {
            hdr.capacity = capacity as u64;
            hdr.row_words = row_words as u64;
            if let Some(l) = limit {
                hdr.limited = 1;
                hdr.samples_per_insert = l.samples_per_insert;
                hdr.min_size_to_sample = l.min_size_to_sample;
                hdr.error_buffer = l.error_buffer;
            }
        })?;
        Ok(Self {
            region,
            capacity,
            row_words,
            limit,
        })
    }

    /// Opens a ring created by another process (or this one).
    pub fn open(handle: &ReplayRingHandle) -> Result<Self, ShmError> {
        let region = Region::open(&handle.region)?;
        let invalid = |what: String| ShmError::Invalid {
            name: handle.region.name.clone(),
            what,
        };
        let hdr: &Header = header::open(&region, stamps_offset(), &handle.region.name)?;
        let limit = (hdr.limited != 0).then_some(RateLimit {
            samples_per_insert: hdr.samples_per_insert,
            min_size_to_sample: hdr.min_size_to_sample,
            error_buffer: hdr.error_buffer,
        });
        let (capacity, row_words) = (hdr.capacity as usize, hdr.row_words as usize);
        if footprint(capacity, row_words).is_none_or(|n| n > region.len()) {
            return Err(invalid(format!(
                "{} bytes cannot hold {capacity} rows of {row_words} words",
                region.len()
            )));
        }
        Ok(Self {
            region,
            capacity,
            row_words,
            limit,
        })
    }

    /// The handle to pass to other processes.
    pub fn handle(&self) -> ReplayRingHandle {
        ReplayRingHandle {
            region: self.region.handle(),
        }
    }

    /// Rows the ring holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Words per row.
    pub fn row_words(&self) -> usize {
        self.row_words
    }

    /// The bytes of shared memory the ring takes: its rows (one more than its capacity), their sequence words and
    /// its header.
    pub fn footprint(&self) -> usize {
        footprint(self.capacity(), self.row_words).unwrap_or(usize::MAX)
    }

    /// The bytes a ring of `capacity` rows of `row_words` words would take ([`footprint`](Self::footprint)), if
    /// they fit the address space.
    pub fn footprint_of(capacity: usize, row_words: usize) -> Option<usize> {
        footprint(capacity, row_words)
    }

    /// The rate limit, if any.
    pub fn rate_limit(&self) -> Option<RateLimit> {
        self.limit
    }

    /// Samples the learners recorded so far.
    pub fn sampled(&self) -> u64 {
        self.header().sampled.load(Ordering::SeqCst)
    }

    /// Records `n` samples taken (a learner's batch): writers held back by the rate limit may go on.
    pub fn record_samples(&self, n: u64) {
        let h = self.header();
        h.sampled.fetch_add(n, Ordering::SeqCst);
        if h.insert_waiters.load(Ordering::SeqCst) > 0 {
            h.sample_wake.bump();
            h.sample_wake.wake(u32::MAX);
        }
    }

    /// The insert count a learner must wait for ([`wait_for`](Self::wait_for)) before sampling `n` rows: what the
    /// rate limit allows, or one row without a limit.
    pub fn sample_target(&self, n: u64) -> u64 {
        self.limit.map_or(1, |l| l.sample_target(self.sampled(), n))
    }

    fn header(&self) -> &Header {
        // SAFETY: the region starts with a Header initialised by the creator (checked by its magic in `open`), lives
        // as long as `self`, and every field written after creation is an atomic or the robust mutex.
        unsafe { &*self.region.as_ptr().cast::<Header>() }
    }

    fn stamp(&self, row: usize) -> &AtomicU64 {
        debug_assert!(row <= self.capacity);
        // SAFETY: `row <= capacity` (of `capacity + 1`) stamps of 8 bytes from the 64-aligned stamps offset lie inside the region (checked
        // at create/open); a stamp is only ever accessed atomically.
        unsafe {
            &*self
                .region
                .as_ptr()
                .add(stamps_offset() + row * 8)
                .cast::<AtomicU64>()
        }
    }

    fn words(&self, row: usize) -> &[AtomicU32] {
        debug_assert!(row <= self.capacity);
        // SAFETY: row `row <= capacity` (of `capacity + 1`) of `row_words` 4-byte words from the 64-aligned rows offset lies inside the
        // region (checked at create/open); its words are only ever accessed atomically.
        unsafe {
            let start = self
                .region
                .as_ptr()
                .add(rows_offset(self.capacity + 1) + row * self.row_words * 4);
            std::slice::from_raw_parts(start.cast::<AtomicU32>(), self.row_words)
        }
    }

    /// Inserts completed so far: inserts `inserted − capacity ..< inserted` are the visible ones.
    pub fn inserted(&self) -> u64 {
        self.header().inserted.load(Ordering::SeqCst)
    }

    /// Writers that died mid-row since the ring was created.
    pub fn writer_deaths(&self) -> u64 {
        self.header().writer_deaths.load(Ordering::Relaxed)
    }

    /// Rows visible now.
    pub fn len(&self) -> usize {
        self.inserted().min(self.capacity as u64) as usize
    }

    /// Whether no row was inserted yet.
    pub fn is_empty(&self) -> bool {
        self.inserted() == 0
    }

    /// Appends `rows` (a whole number of rows, oldest first); returns the insert counter after them. Waiters whose
    /// target they reach are woken. Without a rate limit the rows go in under one lock. With one, as many as the
    /// limit allows go in at a time, and the call waits (until `deadline` at most) for the learners to sample before
    /// the rest; an [`interrupt`](Self::interrupt) during the call or the close ends the wait (rows already in stay).
    pub fn insert(&self, rows: &[f32], deadline: Option<Instant>) -> Result<u64, InsertError> {
        self.put(rows, deadline, false)
    }

    /// A stopping writer's last rows: in under one lock (waiting for it until `deadline`), past the rate limit and
    /// the close (a stopping run closes its rings to end every wait, and what its writers still hold must be in the
    /// learners' last save). Then call [`finish_writer`](Self::finish_writer).
    pub fn insert_last(&self, rows: &[f32], deadline: Option<Instant>) -> Result<u64, InsertError> {
        self.put(rows, deadline, true)
    }

    /// Appends `rows`: as [`insert`](Self::insert), or with `last` as [`insert_last`](Self::insert_last).
    fn put(&self, rows: &[f32], deadline: Option<Instant>, last: bool) -> Result<u64, InsertError> {
        let w = self.row_words;
        if rows.len() % w != 0 || rows.is_empty() {
            return Err(InsertError::RowSize {
                expected: w,
                got: rows.len(),
            });
        }
        let h = self.header();
        let interrupts = h.interrupts.load(Ordering::SeqCst);
        let mut rest = rows;
        let mut k = 0;
        let limit = self.limit.filter(|_| !last);
        while !rest.is_empty() {
            let inserted = (rows.len() - rest.len()) / w;
            if !last && h.closed.load(Ordering::SeqCst) != 0 {
                return Err(InsertError::Closed { inserted });
            }
            if let Some(limit) = limit {
                self.wait_to_insert(limit, 1, deadline, interrupts)
                    .map_err(|e| match e {
                        InsertError::Timeout => InsertError::HeldBack { inserted },
                        InsertError::Closed { .. } => InsertError::Closed { inserted },
                        InsertError::Interrupted { .. } => InsertError::Interrupted { inserted },
                        other => other,
                    })?;
            }
            let locked = h.lock.lock(deadline).map_err(|_| InsertError::Timeout)?;
            if locked.previous_owner_died {
                // The dead writer's row has an odd stamp and the counter was not moved: the next insert rewrites it.
                h.writer_deaths.fetch_add(1, Ordering::Relaxed);
            }
            k = h.inserted.load(Ordering::Relaxed);
            let wanted = (rest.len() / w) as u64;
            // Another writer may have used up the allowance since the wait.
            let n = limit.map_or(wanted, |l| l.allowed(k, h.sampled.load(Ordering::SeqCst), wanted));
            let (now, later) = rest.split_at(n as usize * w);
            for row in now.chunks_exact(w) {
                self.write_row(k, row);
                k += 1;
                h.inserted.store(k, Ordering::SeqCst);
            }
            drop(locked.guard);
            rest = later;
            if n > 0 && h.waiters.load(Ordering::SeqCst) > 0 {
                h.wake.bump();
                h.wake.wake(u32::MAX);
            }
        }
        Ok(k)
    }

    /// Writes insert `k` into its row (the caller holds the lock): the odd stamp, the words, the even stamp.
    fn write_row(&self, k: u64, row: &[f32]) {
        let r = (k % (self.capacity as u64 + 1)) as usize;
        let stamp = self.stamp(r);
        stamp.store(2 * k + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (dst, &v) in self.words(r).iter().zip(row) {
            dst.store(v.to_bits(), Ordering::Relaxed);
        }
        stamp.store(2 * k + 2, Ordering::Release);
    }

    /// The visible rows, oldest first, as `(first, rows)`: inserts `first ..< first + rows.len() / row_words`. A
    /// row overwritten while it is copied (writers go on) is left out with every older one, so the copy is always a
    /// run of consecutive inserts.
    pub fn snapshot(&self) -> (u64, Vec<f32>) {
        let end = self.inserted();
        let oldest = end.saturating_sub(self.capacity as u64);
        let mut rows = Vec::with_capacity((end - oldest) as usize * self.row_words);
        let mut row = vec![0.0; self.row_words];
        let mut first = oldest;
        for k in oldest..end {
            if self.read(k, &mut row).is_ok() {
                rows.extend_from_slice(&row);
            } else {
                rows.clear();
                first = k + 1;
            }
        }
        (first, rows)
    }

    /// Fills an untouched ring with rows saved from another ([`snapshot`](Self::snapshot)): `rows` become inserts
    /// `first ..`, each in the row it had there when the capacities are equal (the newest `capacity` of them are
    /// kept), and the counters go on from the saved ones: inserts from the last of them, samples from `sampled`.
    /// Returns the insert counter. Fails if anything was inserted or sampled before.
    pub fn restore(&self, first: u64, rows: &[f32], sampled: u64) -> Result<u64, InsertError> {
        let w = self.row_words;
        if rows.len() % w != 0 {
            return Err(InsertError::RowSize {
                expected: w,
                got: rows.len() % w,
            });
        }
        let h = self.header();
        let locked = h.lock.lock(None).map_err(|_| InsertError::Timeout)?;
        let inserted = h.inserted.load(Ordering::SeqCst);
        if inserted > 0 || h.sampled.load(Ordering::SeqCst) > 0 {
            return Err(InsertError::NotEmpty { inserted });
        }
        let n = (rows.len() / w) as u64;
        let kept = n.min(self.capacity as u64);
        let skipped = (n - kept) as usize;
        let mut k = first + skipped as u64;
        for row in rows.chunks_exact(w).skip(skipped) {
            self.write_row(k, row);
            k += 1;
        }
        h.sampled.store(sampled, Ordering::SeqCst);
        h.inserted.store(k.max(first), Ordering::SeqCst);
        drop(locked.guard);
        self.wake_everyone();
        Ok(k.max(first))
    }

    /// Sleeps until `limit` allows `n` more inserts (the same no-lost-wake-up protocol as
    /// [`wait_for`](Self::wait_for), on the samples counter).
    fn wait_to_insert(
        &self,
        limit: RateLimit,
        n: u64,
        deadline: Option<Instant>,
        interrupts: u32,
    ) -> Result<(), InsertError> {
        let h = self.header();
        let mut stalled: Option<Instant> = None;
        let result = loop {
            h.insert_waiters.fetch_add(1, Ordering::SeqCst);
            let seen = h.sample_wake.load();
            let outcome = if limit.can_insert(
                h.inserted.load(Ordering::SeqCst),
                h.sampled.load(Ordering::SeqCst),
                n,
            ) {
                Some(Ok(()))
            } else if h.closed.load(Ordering::SeqCst) != 0 {
                Some(Err(InsertError::Closed { inserted: 0 }))
            } else if h.interrupts.load(Ordering::SeqCst) != interrupts {
                Some(Err(InsertError::Interrupted { inserted: 0 }))
            } else {
                match remaining(deadline) {
                    Err(()) => Some(Err(InsertError::Timeout)),
                    Ok(timeout) => {
                        if stalled.is_none() {
                            // Counted as the wait begins, so that a writer held back now shows.
                            h.stalls.fetch_add(1, Ordering::Relaxed);
                            stalled = Some(Instant::now());
                        }
                        h.sample_wake.wait(seen, timeout);
                        None
                    }
                }
            };
            h.insert_waiters.fetch_sub(1, Ordering::SeqCst);
            if let Some(outcome) = outcome {
                break outcome;
            }
        };
        if let Some(since) = stalled {
            h.stalled_micros
                .fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        result
    }

    /// Inserts the rate limit held back so far (each waited for the learners' samples; one waiting now is counted)
    /// and how long the finished waits took in all: how often, and how much, the learners were the slow side.
    pub fn stalls(&self) -> (u64, Duration) {
        let h = self.header();
        (
            h.stalls.load(Ordering::Relaxed),
            Duration::from_micros(h.stalled_micros.load(Ordering::Relaxed)),
        )
    }

    /// Copies insert `index` into `out` (`row_words` words), or says it is [`Gone`]: not yet inserted, already
    /// overwritten, or being overwritten during the copy (`out` then holds garbage).
    pub fn read(&self, index: u64, out: &mut [f32]) -> Result<(), Gone> {
        assert_eq!(out.len(), self.row_words, "ReplayRing::read: wrong row size");
        let end = self.inserted();
        if index >= end || index + (self.capacity as u64) < end {
            return Err(Gone(index));
        }
        let r = (index % (self.capacity as u64 + 1)) as usize;
        let stamp = self.stamp(r);
        let complete = 2 * index + 2;
        if stamp.load(Ordering::Acquire) != complete {
            return Err(Gone(index));
        }
        for (o, w) in out.iter_mut().zip(self.words(r)) {
            *o = f32::from_bits(w.load(Ordering::Relaxed));
        }
        fence(Ordering::Acquire);
        if stamp.load(Ordering::Relaxed) != complete {
            return Err(Gone(index));
        }
        Ok(())
    }

    /// Copies `n` rows drawn uniformly from the visible ones into `out` (`n * row_words` words) and their insert
    /// numbers into `indices`; `draw(m)` must return a uniform integer below `m`. A row overwritten while being
    /// read is drawn again. Returns `false` (and copies nothing) while the ring is empty.
    pub fn sample_uniform(
        &self,
        n: usize,
        mut draw: impl FnMut(u64) -> u64,
        indices: &mut Vec<u64>,
        out: &mut [f32],
    ) -> bool {
        assert_eq!(
            out.len(),
            n * self.row_words,
            "ReplayRing::sample_uniform: wrong output size"
        );
        indices.clear();
        // The ring is larger than the caches while a learner shares them with actors: the next row's words are
        // fetched while this row's are copied. Rows are drawn in the same order as without (a redraw after an
        // overwritten row comes after the next row's draw).
        if n == 0 {
            return true;
        }
        let Some(mut next) = self.draw_visible(&mut draw) else {
            return false;
        };
        let rows = out.chunks_exact_mut(self.row_words);
        let n_rows = rows.len();
        for (k, row) in rows.enumerate() {
            let mut index = next;
            if k + 1 < n_rows {
                next = self.draw_visible(&mut draw).unwrap_or(index);
                self.prefetch(next);
            }
            while self.read(index, row).is_err() {
                index = self.draw_visible(&mut draw).unwrap_or(index);
            }
            indices.push(index);
        }
        true
    }

    /// An insert number drawn uniformly from the visible rows (`draw(m)` uniform below `m`), `None` while the ring
    /// is empty.
    fn draw_visible(&self, draw: &mut impl FnMut(u64) -> u64) -> Option<u64> {
        let end = self.inserted();
        let visible = end.min(self.capacity as u64);
        (end > 0).then(|| end - visible + draw(visible))
    }

    /// Asks the CPU to start loading the words of the row holding insert `index` into the cache.
    fn prefetch(&self, index: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let r = (index % (self.capacity as u64 + 1)) as usize;
            let words = self.words(r);
            // A row need not start on a cache line: every 16th word, and the last one for the row's last line.
            for word in words.iter().step_by(16).chain(words.last()) {
                // SAFETY: a prefetch reads nothing observable and cannot fault; the address is a word of row `r`,
                // inside the mapping (`words`).
                unsafe { _mm_prefetch::<_MM_HINT_T0>((word as *const AtomicU32).cast::<i8>()) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = index;
    }

    /// The interrupt epoch: read it before deciding to wait, and pass it to [`wait_for`](Self::wait_for), so that
    /// an [`interrupt`](Self::interrupt) that comes in between is not missed.
    pub fn interrupts(&self) -> u32 {
        self.header().interrupts.load(Ordering::SeqCst)
    }

    /// Sleeps until the insert counter is at least `target` (returned at once if it is), the deadline passes, the
    /// ring is closed, or it has been [`interrupt`](Self::interrupt)ed since the epoch `interrupts` (from
    /// [`interrupts`](Self::interrupts)). Uses no CPU while it waits, and is woken only when the counter moves (or by
    /// an interrupt or the close).
    pub fn wait_for(&self, target: u64, deadline: Option<Instant>, interrupts: u32) -> Wait {
        let h = self.header();
        loop {
            h.waiters.fetch_add(1, Ordering::SeqCst);
            let seen = h.wake.load();
            let outcome = {
                let count = h.inserted.load(Ordering::SeqCst);
                if count >= target {
                    Some(Wait::Reached(count))
                } else if h.closed.load(Ordering::SeqCst) != 0 {
                    Some(Wait::Closed)
                } else if h.interrupts.load(Ordering::SeqCst) != interrupts {
                    Some(Wait::Interrupted)
                } else {
                    None
                }
            };
            let outcome = outcome.or_else(|| match remaining(deadline) {
                Err(()) => Some(Wait::Timeout),
                Ok(timeout) => {
                    h.wake.wait(seen, timeout);
                    None
                }
            });
            h.waiters.fetch_sub(1, Ordering::SeqCst);
            if let Some(outcome) = outcome {
                return outcome;
            }
        }
    }

    /// A writer put in its last rows ([`insert_last`](Self::insert_last)) and stops: counted for
    /// [`wait_for_writers`](Self::wait_for_writers), whose waiters are woken.
    pub fn finish_writer(&self) {
        let h = self.header();
        h.writers_finished.fetch_add(1, Ordering::SeqCst);
        if h.waiters.load(Ordering::SeqCst) > 0 {
            h.wake.bump();
            h.wake.wake(u32::MAX);
        }
    }

    /// Sleeps until `writers` writers have [finished](Self::finish_writer) (`true`) or the deadline passes
    /// (`false`): a learner's last save waits so for the rows its writers still held. The same protocol as
    /// [`wait_for`](Self::wait_for), on the writers' count; the close and interrupts do not end it.
    pub fn wait_for_writers(&self, writers: u32, deadline: Instant) -> bool {
        let h = self.header();
        loop {
            h.waiters.fetch_add(1, Ordering::SeqCst);
            let seen = h.wake.load();
            let done = h.writers_finished.load(Ordering::SeqCst) >= writers;
            let timeout = remaining(Some(deadline));
            if let (false, Ok(timeout)) = (done, timeout) {
                h.wake.wait(seen, timeout);
            }
            h.waiters.fetch_sub(1, Ordering::SeqCst);
            if done {
                return true;
            }
            if timeout.is_err() {
                return false;
            }
        }
    }

    /// Ends every [`wait_for`](Self::wait_for) of an earlier epoch, and every insert waiting for samples, with [`Wait::Interrupted`] (a stop request,
    /// SIGTERM), now and until its caller reads the epoch again.
    pub fn interrupt(&self) {
        let h = self.header();
        h.interrupts.fetch_add(1, Ordering::SeqCst);
        self.wake_everyone();
    }

    fn wake_everyone(&self) {
        let h = self.header();
        for word in [&h.wake, &h.sample_wake] {
            word.bump();
            word.wake(u32::MAX);
        }
    }

    /// Closes the ring: inserts fail from now on and every wait ends with [`Wait::Closed`] (unless its target is
    /// met). Rows stay readable.
    pub fn close(&self) {
        let h = self.header();
        h.closed.store(1, Ordering::SeqCst);
        self.wake_everyone();
    }
}

/// The time left until `deadline` (`None`: no limit), or `Err` once it has passed.
fn remaining(deadline: Option<Instant>) -> Result<Option<Duration>, ()> {
    match deadline {
        None => Ok(None),
        Some(d) => match d.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Ok(Some(left)),
            _ => Err(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(k: u64, w: usize) -> Vec<f32> {
        (0..w).map(|i| (k * 1000 + i as u64) as f32).collect()
    }

    #[test]
    fn rows_wrap_around_and_old_ones_are_gone() {
        let ring = ReplayRing::create(4, 3, None).unwrap();
        let other = ReplayRing::open(&ring.handle()).unwrap();
        assert!(ring.is_empty());
        for k in 0..6 {
            assert_eq!(ring.insert(&row(k, 3), None), Ok(k + 1));
        }
        assert_eq!((other.inserted(), other.len()), (6, 4));
        let mut out = [0.0; 3];
        for k in 0..2 {
            assert_eq!(other.read(k, &mut out), Err(Gone(k)), "overwritten");
        }
        for k in 2..6 {
            other.read(k, &mut out).unwrap();
            assert_eq!(out.to_vec(), row(k, 3));
        }
        assert_eq!(other.read(6, &mut out), Err(Gone(6)), "not yet inserted");
    }

    /// A snapshot restored into a ring of the same capacity puts every insert in the row it had, with the
    /// counters; into a smaller ring, the newest rows; a ring already written to refuses.
    #[test]
    fn a_snapshot_restores_into_a_fresh_ring() {
        let ring = ReplayRing::create(4, 2, None).unwrap();
        for k in 0..7 {
            ring.insert(&row(k, 2), None).unwrap();
        }
        ring.record_samples(11);
        let (first, rows) = ring.snapshot();
        assert_eq!((first, rows.len()), (3, 8));

        let same = ReplayRing::create(4, 2, None).unwrap();
        assert_eq!(same.restore(first, &rows, ring.sampled()), Ok(7));
        assert_eq!((same.inserted(), same.sampled(), same.len()), (7, 11, 4));
        let mut out = [0.0; 2];
        for k in 3..7 {
            same.read(k, &mut out).unwrap();
            assert_eq!(out.to_vec(), row(k, 2));
            let r = (k % 5) as usize;
            assert_eq!(
                same.stamp(r).load(Ordering::SeqCst),
                ring.stamp(r).load(Ordering::SeqCst)
            );
        }
        assert_eq!(same.read(2, &mut out), Err(Gone(2)));
        assert_eq!(same.insert(&row(7, 2), None), Ok(8));
        assert_eq!(same.snapshot(), {
            let mut later = ring.snapshot().1[2..].to_vec();
            later.extend(row(7, 2));
            (4, later)
        });

        let smaller = ReplayRing::create(2, 2, None).unwrap();
        assert_eq!(smaller.restore(first, &rows, 11), Ok(7));
        assert_eq!(smaller.snapshot(), (5, rows[4..].to_vec()));
        assert_eq!(
            smaller.restore(first, &rows, 11),
            Err(InsertError::NotEmpty { inserted: 7 })
        );
        assert!(matches!(
            ReplayRing::create(4, 2, None).unwrap().restore(0, &[1.0; 3], 0),
            Err(InsertError::RowSize { .. })
        ));
    }

    #[test]
    fn batches_insert_in_order_and_bad_rows_are_refused() {
        let ring = ReplayRing::create(8, 2, None).unwrap();
        let batch: Vec<f32> = (0..3).flat_map(|k| row(k, 2)).collect();
        assert_eq!(ring.insert(&batch, None), Ok(3));
        assert_eq!(
            ring.insert(&[1.0; 3], None),
            Err(InsertError::RowSize { expected: 2, got: 3 })
        );
        let mut out = [0.0; 2];
        ring.read(2, &mut out).unwrap();
        assert_eq!(out.to_vec(), row(2, 2));
        assert!(ReplayRing::create(0, 2, None).is_err());
    }

    #[test]
    fn uniform_samples_cover_only_the_visible_rows() {
        let ring = ReplayRing::create(16, 1, None).unwrap();
        let (mut indices, mut out) = (Vec::new(), vec![0.0; 64]);
        let mut state = 7u64;
        let mut draw = |m: u64| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (state >> 33) % m
        };
        assert!(!ring.sample_uniform(64, &mut draw, &mut indices, &mut out));
        for k in 0..40 {
            ring.insert(&[k as f32], None).unwrap();
        }
        assert!(ring.sample_uniform(64, &mut draw, &mut indices, &mut out));
        let mut seen = [false; 16];
        for (&i, &v) in indices.iter().zip(&out) {
            assert!((24..40).contains(&i), "insert {i} is not visible");
            assert_eq!(v, i as f32);
            seen[(i - 24) as usize] = true;
        }
        assert!(seen.iter().filter(|&&s| s).count() > 10, "{seen:?}");
    }

    #[test]
    fn uniform_rows_come_in_the_order_drawn_one_draw_each() {
        // Prefetching the next row draws it early; the rows and the number of draws stay those of drawing each
        // row just before reading it (a learner's random stream, and a serial run, do not change).
        let ring = ReplayRing::create(8, 2, None).unwrap();
        for k in 0..13 {
            ring.insert(&[k as f32, -(k as f32)], None).unwrap();
        }
        let draws = [7u64, 0, 3, 3, 5];
        let mut calls = 0;
        let (mut indices, mut out) = (Vec::new(), vec![0.0; 8]);
        assert!(ring.sample_uniform(
            4,
            |m| {
                assert_eq!(m, 8);
                calls += 1;
                draws[calls - 1]
            },
            &mut indices,
            &mut out,
        ));
        assert_eq!(calls, 4);
        assert_eq!(indices, [12, 5, 8, 8]);
        assert_eq!(out, [12.0, -12.0, 5.0, -5.0, 8.0, -8.0, 8.0, -8.0]);
        assert!(ring.sample_uniform(0, |_| unreachable!(), &mut indices, &mut []));
        assert!(indices.is_empty());
    }

    #[test]
    fn a_waiter_wakes_when_its_target_is_met_and_not_before() {
        let ring = ReplayRing::create(8, 1, None).unwrap();
        assert_eq!(ring.wait_for(0, None, 0), Wait::Reached(0));
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(ring.wait_for(1, Some(soon), 0), Wait::Timeout);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| ring.wait_for(3, None, 0));
            for k in 0..3 {
                std::thread::sleep(Duration::from_millis(5));
                ring.insert(&[k as f32], None).unwrap();
            }
            assert_eq!(waiter.join().unwrap(), Wait::Reached(3));
        });
    }

    /// The context switches of the calling thread so far (voluntary and not), from `/proc`.
    fn context_switches() -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    #[test]
    fn an_idle_waiter_sleeps_without_waking() {
        let ring = ReplayRing::create(8, 1, None).unwrap();
        ring.insert(&[1.0], None).unwrap();
        let before = context_switches();
        let outcome = ring.wait_for(2, Some(Instant::now() + Duration::from_secs(3)), 0);
        let switches = context_switches() - before;
        assert_eq!(outcome, Wait::Timeout);
        assert!(switches <= 2, "{switches} context switches in 3 s of waiting");
    }

    /// 1M inserts in bursts with random pauses while a waiter keeps asking for a little more than there is: every
    /// wait whose target the writer reaches returns (a lost wake-up would leave it asleep until its 10 s deadline,
    /// reported as a timeout).
    #[test]
    fn no_wake_up_is_lost_over_a_million_inserts() {
        const TOTAL: u64 = 1_000_000;
        let ring = ReplayRing::create(1024, 1, None).unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut state = 3u64;
                let mut waits = 0u64;
                loop {
                    state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    let target = (ring.inserted() + 1 + (state >> 33) % 64).min(TOTAL);
                    let deadline = Instant::now() + Duration::from_secs(10);
                    match ring.wait_for(target, Some(deadline), 0) {
                        Wait::Reached(n) if n >= TOTAL => return Ok(waits),
                        Wait::Reached(n) if n >= target => waits += 1,
                        other => {
                            return Err(format!(
                                "waiting for {target}: {other:?}, {} inserted",
                                ring.inserted()
                            ))
                        }
                    }
                }
            });
            let mut state = 11u64;
            let mut k = 0;
            while k < TOTAL {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let burst = (1 + (state >> 33) % 200).min(TOTAL - k);
                for _ in 0..burst {
                    ring.insert(&[k as f32], None).unwrap();
                    k += 1;
                }
                if (state >> 20) % 16 == 0 {
                    std::thread::sleep(Duration::from_micros((state >> 40) % 300));
                }
            }
            let waits = waiter.join().unwrap().unwrap();
            assert!(waits > 100, "the waiter waited {waits} times");
        });
    }

    #[test]
    fn the_rate_limit_keeps_samples_within_the_buffer_of_the_ratio() {
        let l = RateLimit {
            samples_per_insert: 4.0,
            min_size_to_sample: 10,
            error_buffer: 8.0,
        };
        // Up to the minimum size inserts never wait; then at most 8 samples' worth ahead of the ratio.
        assert!(l.can_insert(0, 0, 10));
        assert!(l.can_insert(11, 0, 1), "12 * 4 - 0 = 48 <= 40 + 8");
        assert!(!l.can_insert(12, 0, 1), "13 * 4 = 52 > 48");
        assert!(l.can_insert(12, 4, 1));
        assert_eq!(l.allowed(0, 0, 30), 12, "(48 + 0) / 4 = 12 rows");
        assert_eq!(l.allowed(5, 0, 3), 3);
        assert_eq!(l.allowed(12, 0, 3), 0);
        assert_eq!(l.allowed(12, 9, 3), 2, "(48 + 9) / 4 = 14.25");
        // Sampling waits for the minimum size, then for inserts that keep it at least 8 behind the ratio.
        assert_eq!(l.sample_target(0, 1), 10);
        assert_eq!(l.sample_target(0, 32), 16, "16 * 4 - 32 = 32 >= 40 - 8");
        assert_eq!(l.sample_target(32, 32), 24);
        assert!(ReplayRing::create(
            8,
            1,
            Some(RateLimit {
                error_buffer: 2.0,
                ..l
            })
        )
        .is_err());
    }

    /// A writer and a learner held to 4 samples per insert: the measured ratio stays within 5% of it after the
    /// warm-up whichever side is slowed down.
    #[test]
    fn samples_per_insert_hold_whichever_side_is_slow() {
        const RATIO: f64 = 4.0;
        const BATCH: u64 = 32;
        const INSERTS: u64 = 6000;
        for slow_writer in [true, false] {
            let limit = RateLimit {
                samples_per_insert: RATIO,
                min_size_to_sample: 200,
                error_buffer: 2.0 * BATCH as f64,
            };
            let ring = &ReplayRing::create(512, 2, Some(limit)).unwrap();
            let (warm, end) = std::thread::scope(|s| {
                let learner = s.spawn(move || {
                    let (mut indices, mut out) = (Vec::new(), vec![0.0; BATCH as usize * 2]);
                    let epoch = ring.interrupts();
                    let mut draw = |m: u64| m / 2;
                    let mut warm = None;
                    loop {
                        match ring.wait_for(ring.sample_target(BATCH), None, epoch) {
                            Wait::Reached(_) => {}
                            Wait::Closed | Wait::Interrupted => return warm,
                            Wait::Timeout => unreachable!("no deadline"),
                        }
                        assert!(ring.sample_uniform(BATCH as usize, &mut draw, &mut indices, &mut out));
                        ring.record_samples(BATCH);
                        if warm.is_none() && ring.inserted() >= 1000 {
                            warm = Some((ring.inserted(), ring.sampled()));
                        }
                        if !slow_writer {
                            std::thread::sleep(Duration::from_micros(500));
                        }
                    }
                });
                // In chunks of 50 rows, more than the limit lets in at once (2 × 64 / 4 = 32): they go in as
                // the learner samples.
                for k in (0..INSERTS).step_by(50) {
                    let rows: Vec<f32> = (k..k + 50).flat_map(|i| [i as f32, 0.0]).collect();
                    ring.insert(&rows, None).unwrap();
                    if slow_writer {
                        std::thread::sleep(Duration::from_micros(2500));
                    }
                }
                let end = (ring.inserted(), ring.sampled());
                ring.interrupt();
                (learner.join().unwrap().expect("a warm-up point"), end)
            });
            let ratio = (end.1 - warm.1) as f64 / (end.0 - warm.0) as f64;
            assert!(
                (ratio / RATIO - 1.0).abs() < 0.05,
                "slow writer {slow_writer}: {ratio} samples per insert after the warm-up"
            );
        }
    }

    /// A stopping writer's rows go in past the rate limit and the close, and a learner waiting for its writers
    /// wakes when the last one finishes (another thread here), or gives up at its deadline.
    #[test]
    fn last_rows_pass_the_limit_and_the_close_and_finished_writers_wake_the_learner() {
        let limit = RateLimit {
            samples_per_insert: 1.0,
            min_size_to_sample: 4,
            error_buffer: 2.0,
        };
        let ring = &ReplayRing::create(64, 1, Some(limit)).unwrap();
        let rows: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let soon = || Some(Instant::now() + Duration::from_millis(50));
        assert_eq!(
            ring.insert(&rows, soon()),
            Err(InsertError::HeldBack { inserted: 6 })
        );
        ring.close();
        assert_eq!(
            ring.insert(&rows[6..], soon()),
            Err(InsertError::Closed { inserted: 0 })
        );
        assert_eq!(ring.insert_last(&rows[6..], soon()), Ok(10));
        let (mut indices, mut out) = (Vec::new(), vec![0.0; 1]);
        let mut draw = |m: u64| m - 1;
        assert!(ring.sample_uniform(1, &mut draw, &mut indices, &mut out));
        assert_eq!(out[0], 9.0, "the last row is in");

        let started = Instant::now();
        assert!(!ring.wait_for_writers(1, started + Duration::from_millis(100)));
        assert!(started.elapsed() >= Duration::from_millis(100));
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                ring.finish_writer();
                std::thread::sleep(Duration::from_millis(20));
                ring.finish_writer();
            });
            assert!(ring.wait_for_writers(2, Instant::now() + Duration::from_secs(10)));
        });
        assert!(ring.wait_for_writers(2, Instant::now()));
    }

    #[test]
    fn an_insert_held_back_by_the_rate_limit_ends_on_interrupt_close_or_deadline() {
        let limit = RateLimit {
            samples_per_insert: 1.0,
            min_size_to_sample: 2,
            error_buffer: 1.0,
        };
        let ring = &ReplayRing::create(8, 1, Some(limit)).unwrap();
        ring.insert(&[0.0, 1.0, 2.0], None).unwrap();
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(
            ring.stalls(),
            (0, Duration::ZERO),
            "inserts below the limit never stall"
        );
        assert_eq!(
            ring.insert(&[3.0], Some(soon)),
            Err(InsertError::HeldBack { inserted: 0 })
        );
        let (stalls, waited) = ring.stalls();
        assert_eq!(stalls, 1);
        assert!(waited >= Duration::from_millis(15), "{waited:?}");
        // Of several rows, those the limit lets through go in before the deadline; the call says how many.
        let soon = Instant::now() + Duration::from_millis(20);
        ring.record_samples(1);
        assert_eq!(
            ring.insert(&[3.0, 4.0, 5.0], Some(soon)),
            Err(InsertError::HeldBack { inserted: 1 })
        );
        assert_eq!(ring.inserted(), 4);
        std::thread::scope(|s| {
            let writer = s.spawn(move || ring.insert(&[3.0], None));
            std::thread::sleep(Duration::from_millis(20));
            ring.record_samples(1);
            assert_eq!(writer.join().unwrap(), Ok(5), "a sample lets one insert through");
            let writer = s.spawn(move || ring.insert(&[4.0], None));
            std::thread::sleep(Duration::from_millis(20));
            ring.interrupt();
            assert_eq!(
                writer.join().unwrap(),
                Err(InsertError::Interrupted { inserted: 0 })
            );
            let writer = s.spawn(move || ring.insert(&[4.0], None));
            std::thread::sleep(Duration::from_millis(20));
            ring.close();
            assert_eq!(writer.join().unwrap(), Err(InsertError::Closed { inserted: 0 }));
        });
    }

    #[test]
    fn interrupt_and_close_end_every_wait() {
        let ring = &ReplayRing::create(8, 1, None).unwrap();
        std::thread::scope(|s| {
            let epoch = ring.interrupts();
            let waiter = s.spawn(move || ring.wait_for(100, None, epoch));
            std::thread::sleep(Duration::from_millis(20));
            ring.interrupt();
            assert_eq!(waiter.join().unwrap(), Wait::Interrupted);
            // An interrupt between reading the epoch and waiting is not missed.
            assert_eq!(ring.wait_for(100, None, epoch), Wait::Interrupted);
            let epoch = ring.interrupts();
            let waiter = s.spawn(move || ring.wait_for(100, None, epoch));
            std::thread::sleep(Duration::from_millis(20));
            ring.close();
            assert_eq!(waiter.join().unwrap(), Wait::Closed);
        });
        assert_eq!(
            ring.insert(&[1.0], None),
            Err(InsertError::Closed { inserted: 0 })
        );
    }
}
