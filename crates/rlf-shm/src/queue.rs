//! A multi-producer multi-consumer FIFO of byte messages in shared memory, safe against processes that die at any
//! instant.
//!
//! # Layout
//! One region holds a `Header` followed by the ring. A message is stored as a 4-byte little-endian length and its
//! bytes, wrapping byte-wise at the end of the ring (the length prefix itself may wrap).
//!
//! # Protocol
//! - Every read or write of the ring and of the queue state happens under one process-shared **robust** mutex.
//!   Copies are made under the lock, so a message is written once and read once (as faster-fifo does).
//! - The state (`head`, `tail` as growing byte positions, `count` of messages) is kept in **two slots** and an
//!   `active` index. A get that empties the queue puts both positions back to 0, so that a queue whose consumers
//!   keep up writes into the first pages of its ring again and again rather than touching all of it (a long run's
//!   memory then stays at the most the queue ever held, not the ring's size). An operation reads the active slot, copies bytes, writes the new state into the *other* slot and
//!   then flips `active` with one atomic store: the commit. Before that store nothing of the operation is visible.
//! - **A process that dies at any instant** leaves either the old state (it died before the commit: a half-written
//!   message sits in free space and is never seen; a half-read message is still queued and goes to the next
//!   consumer) or the new one (it died after). The kernel's robust-futex list releases the dead owner's lock and
//!   the next locker is told (`EOWNERDEAD`); since the active slot is always consistent, marking the mutex
//!   consistent is the whole repair. So committed messages are never lost, never duplicated, never torn.
//! - **Waiting**: a consumer that finds the queue empty increments `not_empty.waiters`, reads the futex word
//!   `not_empty.seq`, both under the lock, releases the lock and sleeps on the word. A producer, after committing and
//!   unlocking, bumps the word and wakes only if the waiter count is non-zero (no syscall otherwise); it wakes as many
//!   sleepers as it put messages. Because the waiter registered under the lock before the producer took it, the
//!   producer sees the count, and the bump comes after the sleeper's read, so the kernel's compare refuses to sleep
//!   on a stale value: no lost wake-up. Producers wait for space symmetrically on `not_full` and are all woken when
//!   space is freed (each needs a different amount). `close` bumps both words and wakes everyone.
//! - Before sleeping, a blocked call spins for a short bounded time (`QueueConfig::spin`) watching the `commits`
//!   counter, so a reply that arrives within microseconds costs no kernel wake-up; then it sleeps until woken.
//! - A waiter killed while asleep leaves its count incremented: producers then make a wake-up syscall nobody needs.
//!   That is a cost, never a fault. Deadlines are monotonic (`Instant`, `CLOCK_MONOTONIC`).

use crate::header::{self, ControlBlock};
use crate::region::{Region, RegionHandle, ShmError};
use crate::sync::{AtomicU32, AtomicU64, Futex, Ordering, RobustMutex};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, Instant};

const MAGIC: u64 = 0x726c_662d_7175_6575; // "rlf-queu"
const LAYOUT_VERSION: u64 = 1;
const LEN_PREFIX: u64 = 4;
/// How long a `try_` call waits for the lock (held only for a copy, unless its owner is stopped).
const TRY_LOCK_LIMIT: Duration = Duration::from_secs(1);

/// Sizes and tuning of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueConfig {
    /// Ring capacity in bytes; each message takes its length plus 4.
    pub max_bytes: usize,
    /// Maximum number of messages held at once.
    pub max_messages: usize,
    /// How long a blocked call spins before it sleeps in the kernel.
    pub spin: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_bytes: 1 << 20,
            max_messages: usize::MAX >> 1,
            spin: Duration::from_micros(20),
        }
    }
}

/// Everything another process needs to open the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueHandle {
    /// The region holding the queue.
    pub region: RegionHandle,
    /// Spin time before sleeping, per process.
    pub spin: Duration,
}

/// Why a put failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutError {
    /// No room now (`try_` forms).
    Full,
    /// No room before the deadline.
    Timeout,
    /// The queue was closed.
    Closed,
    /// The message (or batch) can never fit: `needed` bytes or messages against a capacity of `capacity`.
    TooLarge {
        /// What the message or batch needs, in bytes (or messages, for a batch over the message limit).
        needed: usize,
        /// The queue's capacity in the same unit.
        capacity: usize,
    },
}

/// Why a get failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetError {
    /// Nothing queued now (`try_` forms).
    Empty,
    /// Nothing arrived before the deadline.
    Timeout,
    /// The queue is closed and drained.
    Closed,
}

impl fmt::Display for PutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PutError::Full => write!(f, "queue is full"),
            PutError::Timeout => write!(f, "timed out waiting for room in the queue"),
            PutError::Closed => write!(f, "queue is closed"),
            PutError::TooLarge { needed, capacity } => {
                write!(f, "message needs {needed} but the queue holds at most {capacity}")
            }
        }
    }
}

impl fmt::Display for GetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GetError::Empty => write!(f, "queue is empty"),
            GetError::Timeout => write!(f, "timed out waiting for a message"),
            GetError::Closed => write!(f, "queue is closed"),
        }
    }
}

impl std::error::Error for PutError {}
impl std::error::Error for GetError {}

/// Messages taken by one `get_many`: one byte buffer and the end offset of each message.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Number of messages.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are no messages.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Total payload bytes.
    pub fn total_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// The `i`-th message.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }

    /// The messages in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.ends.len()).map(move |i| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            &self.bytes[start..self.ends[i]]
        })
    }

    /// Empties the batch, keeping its allocations.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }
}

/// How long a call may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    No,
    Until(Instant),
    Forever,
}

impl Wait {
    fn timeout(d: Duration) -> Wait {
        Instant::now().checked_add(d).map_or(Wait::Forever, Wait::Until)
    }

    fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Until(t) => Some(t),
            // A try_ call never waits for room or messages, but may wait (boundedly) for the lock.
            Wait::No => Some(Instant::now() + TRY_LOCK_LIMIT),
            Wait::Forever => None,
        }
    }
}

/// One committed queue state. Written only under the lock, into the inactive slot.
#[derive(Default)]
#[repr(C)]
struct State {
    head: AtomicU64,
    tail: AtomicU64,
    count: AtomicU64,
}

/// A futex word plus the number of threads sleeping (or about to sleep) on it.
#[cfg_attr(loom, derive(Default))]
#[repr(C, align(64))]
struct WaitSet {
    seq: Futex,
    waiters: AtomicU32,
}

/// The queue's control block at the start of the region.
#[cfg_attr(loom, derive(Default))]
#[repr(C)]
pub(crate) struct Header {
    magic: AtomicU64,
    layout_version: u64,
    capacity: u64,
    max_messages: u64,
    lock: RobustMutex,
    active: AtomicU32,
    closed: AtomicU32,
    states: [State; 2],
    owner_deaths: AtomicU64,
    commits: Padded<AtomicU64>,
    not_empty: WaitSet,
    not_full: WaitSet,
}

#[cfg_attr(loom, derive(Default))]
#[repr(C, align(64))]
struct Padded<T>(T);

// SAFETY: Header is `#[repr(C)]`, aligned to 64 bytes at most; it holds atomics, numbers and a RobustMutex, all
// valid when zero.
unsafe impl ControlBlock for Header {
    const WHAT: &'static str = "an rlfactory queue";
    const MAGIC: u64 = MAGIC;

    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }

    fn lock(&mut self) -> *mut RobustMutex {
        &raw mut self.lock
    }
}

/// The protocol over a header and a ring, wherever they live.
struct Raw {
    hdr: *const Header,
    ring: *mut u8,
    cap: u64,
    spin: Duration,
}

/// A shared-memory MPMC byte queue. Cheap to share between threads (`&Queue` is `Sync`); other processes open it
/// from its [`QueueHandle`]. The creator's drop removes the segment name.
pub struct Queue {
    raw: Raw,
    _backing: Backing,
}

enum Backing {
    Shm(Region),
    #[cfg(loom)]
    Heap {
        _header: Box<Header>,
        _ring: Box<[u8]>,
    },
}

// SAFETY: all shared state behind the raw pointers is either atomic or accessed under the process-shared lock, and
// the backing memory lives as long as the Queue.
unsafe impl Send for Queue {}
// SAFETY: as above; every method takes &self and synchronises through the header.
unsafe impl Sync for Queue {}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("capacity", &self.raw.cap)
            .field("len", &self.len())
            .finish()
    }
}

impl Queue {
    /// Creates a queue in a fresh shared-memory region.
    pub fn create(config: QueueConfig) -> Result<Queue, ShmError> {
        if config.max_bytes <= LEN_PREFIX as usize || config.max_bytes > (1usize << 40) {
            return Err(ShmError::Config(format!(
                "max_bytes must be between {} and 2^40, got {}",
                LEN_PREFIX + 1,
                config.max_bytes
            )));
        }
        if config.max_messages == 0 {
            return Err(ShmError::Config("max_messages must be at least 1".into()));
        }
        let region = Region::create(ring_offset() + config.max_bytes)?;
        header::publish(&region, |hdr: &mut Header| {
            hdr.layout_version = LAYOUT_VERSION;
            hdr.capacity = config.max_bytes as u64;
            hdr.max_messages = config.max_messages as u64;
        })?;
        Ok(Self::from_region(region, config.spin))
    }

    /// Opens a queue created by another process (or this one).
    pub fn open(handle: &QueueHandle) -> Result<Queue, ShmError> {
        let region = Region::open(&handle.region)?;
        let invalid = |what: String| ShmError::Invalid {
            name: handle.region.name.clone(),
            what,
        };
        let hdr: &Header = header::open(&region, ring_offset(), &handle.region.name)?;
        if hdr.layout_version != LAYOUT_VERSION {
            return Err(invalid(format!("is not {} of this version", Header::WHAT)));
        }
        let capacity = hdr.capacity;
        if ring_offset() as u64 + capacity != region.len() as u64 {
            return Err(invalid(format!(
                "holds a {capacity}-byte ring but is {} bytes",
                region.len()
            )));
        }
        Ok(Self::from_region(region, handle.spin))
    }

    fn from_region(region: Region, spin: Duration) -> Queue {
        let hdr = region.as_ptr().cast::<Header>().cast_const();
        // SAFETY: the ring starts ring_offset() bytes into the region, inside it.
        let ring = unsafe { region.as_ptr().add(ring_offset()) };
        let cap = (region.len() - ring_offset()) as u64;
        Queue {
            raw: Raw { hdr, ring, cap, spin },
            _backing: Backing::Shm(region),
        }
    }

    /// A queue on the heap, for the loom model (threads only).
    #[cfg(loom)]
    pub(crate) fn heap(capacity: usize, max_messages: usize) -> Queue {
        let hdr = Box::new(Header {
            magic: AtomicU64::new(MAGIC),
            layout_version: LAYOUT_VERSION,
            capacity: capacity as u64,
            max_messages: max_messages as u64,
            ..Header::default()
        });
        let mut ring = vec![0u8; capacity].into_boxed_slice();
        let raw = Raw {
            hdr: &*hdr,
            ring: ring.as_mut_ptr(),
            cap: capacity as u64,
            spin: Duration::ZERO,
        };
        Queue {
            raw,
            _backing: Backing::Heap {
                _header: hdr,
                _ring: ring,
            },
        }
    }

    /// The handle other processes open the queue with.
    pub fn handle(&self) -> QueueHandle {
        match &self._backing {
            Backing::Shm(region) => QueueHandle {
                region: region.handle(),
                spin: self.raw.spin,
            },
            #[cfg(loom)]
            Backing::Heap { .. } => unreachable!("loom queues are never shared across processes"),
        }
    }

    /// Removes the segment's name now ([`Region::unlink`]): every process that opened the queue keeps using it, and
    /// nothing is left behind when they end, however they end.
    pub fn unlink(&mut self) -> Result<(), ShmError> {
        match &mut self._backing {
            Backing::Shm(region) => region.unlink(),
            #[cfg(loom)]
            Backing::Heap { .. } => Ok(()),
        }
    }

    /// Ring capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.raw.cap as usize
    }

    /// Puts one message, waiting for room as long as it takes.
    pub fn put(&self, msg: &[u8]) -> Result<(), PutError> {
        self.raw.put_many(&[msg], Wait::Forever)
    }

    /// Puts one message if there is room now.
    pub fn try_put(&self, msg: &[u8]) -> Result<(), PutError> {
        self.raw.put_many(&[msg], Wait::No)
    }

    /// Puts one message, waiting at most `timeout` for room.
    pub fn put_timeout(&self, msg: &[u8], timeout: Duration) -> Result<(), PutError> {
        self.raw.put_many(&[msg], Wait::timeout(timeout))
    }

    /// Puts all messages or none, in order, waiting for room as long as it takes.
    pub fn put_many<M: AsRef<[u8]>>(&self, msgs: &[M]) -> Result<(), PutError> {
        self.raw.put_many(msgs, Wait::Forever)
    }

    /// Puts all messages or none if there is room for all now.
    pub fn try_put_many<M: AsRef<[u8]>>(&self, msgs: &[M]) -> Result<(), PutError> {
        self.raw.put_many(msgs, Wait::No)
    }

    /// Puts all messages or none, waiting at most `timeout` for room for all.
    pub fn put_many_timeout<M: AsRef<[u8]>>(&self, msgs: &[M], timeout: Duration) -> Result<(), PutError> {
        self.raw.put_many(msgs, Wait::timeout(timeout))
    }

    /// Takes one message, waiting as long as it takes.
    pub fn get(&self) -> Result<Vec<u8>, GetError> {
        let mut buf = Vec::new();
        self.get_into(&mut buf).map(|_| buf)
    }

    /// Takes one message if there is one now.
    pub fn try_get(&self) -> Result<Vec<u8>, GetError> {
        let mut buf = Vec::new();
        self.try_get_into(&mut buf).map(|_| buf)
    }

    /// Takes one message, waiting at most `timeout`.
    pub fn get_timeout(&self, timeout: Duration) -> Result<Vec<u8>, GetError> {
        let mut buf = Vec::new();
        self.get_into_timeout(&mut buf, timeout).map(|_| buf)
    }

    /// Takes one message into `buf` (replacing its contents, growing it as needed); returns its length.
    pub fn get_into(&self, buf: &mut Vec<u8>) -> Result<usize, GetError> {
        self.raw.get_one(buf, Wait::Forever)
    }

    /// [`Queue::get_into`] without waiting.
    pub fn try_get_into(&self, buf: &mut Vec<u8>) -> Result<usize, GetError> {
        self.raw.get_one(buf, Wait::No)
    }

    /// [`Queue::get_into`] waiting at most `timeout`.
    pub fn get_into_timeout(&self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, GetError> {
        self.raw.get_one(buf, Wait::timeout(timeout))
    }

    /// Takes up to `max_messages` messages totalling up to `max_bytes` payload bytes (at least one message, even a
    /// larger one) into `out`, replacing its contents; waits as long as it takes for the first. Returns the count.
    pub fn get_many(
        &self,
        out: &mut Batch,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<usize, GetError> {
        self.raw.get_many(out, max_messages, max_bytes, Wait::Forever)
    }

    /// [`Queue::get_many`] without waiting.
    pub fn try_get_many(
        &self,
        out: &mut Batch,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<usize, GetError> {
        self.raw.get_many(out, max_messages, max_bytes, Wait::No)
    }

    /// [`Queue::get_many`] waiting at most `timeout` for the first message.
    pub fn get_many_timeout(
        &self,
        out: &mut Batch,
        max_messages: usize,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<usize, GetError> {
        self.raw
            .get_many(out, max_messages, max_bytes, Wait::timeout(timeout))
    }

    /// Messages queued now.
    pub fn len(&self) -> usize {
        self.raw.snapshot().count as usize
    }

    /// Whether no message is queued now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes in use now (payloads plus length prefixes).
    pub fn used_bytes(&self) -> usize {
        let s = self.raw.snapshot();
        // Without the lock the two positions may be of different commits (one of them a reset to 0).
        s.tail.saturating_sub(s.head) as usize
    }

    /// Closes the queue: every waiter wakes; later puts fail with `Closed`; gets drain what is left, then report
    /// `Closed`.
    pub fn close(&self) {
        self.raw.close();
    }

    /// Whether the queue was closed.
    pub fn is_closed(&self) -> bool {
        self.raw.hdr().closed.load(Ordering::SeqCst) != 0
    }

    /// How many times a lock owner was found dead and its lock recovered.
    pub fn owner_deaths(&self) -> u64 {
        self.raw.hdr().owner_deaths.load(Ordering::SeqCst)
    }
}

/// Offset of the ring from the region start: the header rounded up to a cache line.
fn ring_offset() -> usize {
    std::mem::size_of::<Header>().next_multiple_of(64)
}

#[derive(Clone, Copy, Debug)]
struct Snapshot {
    head: u64,
    tail: u64,
    count: u64,
}

impl Raw {
    fn hdr(&self) -> &Header {
        // SAFETY: the header lives as long as the Queue that owns this Raw (its backing field).
        unsafe { &*self.hdr }
    }

    /// The committed state. Exact under the lock, a consistent recent snapshot without it.
    fn snapshot(&self) -> Snapshot {
        let h = self.hdr();
        let s = &h.states[(h.active.load(Ordering::Acquire) & 1) as usize];
        Snapshot {
            head: s.head.load(Ordering::Relaxed),
            tail: s.tail.load(Ordering::Relaxed),
            count: s.count.load(Ordering::Relaxed),
        }
    }

    /// Publishes a new state: write the inactive slot, then flip `active` (the commit point). Lock held.
    fn commit(&self, new: Snapshot) {
        let h = self.hdr();
        let next = (h.active.load(Ordering::Relaxed) & 1) ^ 1;
        let s = &h.states[next as usize];
        s.head.store(new.head, Ordering::Relaxed);
        s.tail.store(new.tail, Ordering::Relaxed);
        s.count.store(new.count, Ordering::Relaxed);
        h.active.store(next, Ordering::Release);
        h.commits.0.fetch_add(1, Ordering::Release);
    }

    /// Copies `src` into the ring at byte position `pos`, wrapping. Lock held; the range is free space.
    fn write_at(&self, pos: u64, src: &[u8]) {
        let off = (pos % self.cap) as usize;
        let first = src.len().min(self.cap as usize - off);
        // SAFETY: off < cap and first ≤ cap - off, so both copies stay inside the ring; the range is free space
        // that only the lock holder (us) touches, and src is ordinary memory outside the ring.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ring.add(off), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.ring, src.len() - first);
        }
    }

    /// Appends `len` ring bytes from position `pos` to `dst`, wrapping. Lock held; the range is committed.
    fn read_at(&self, pos: u64, len: usize, dst: &mut Vec<u8>) {
        let off = (pos % self.cap) as usize;
        let first = len.min(self.cap as usize - off);
        // SAFETY: both ranges lie inside the ring (off < cap, first ≤ cap - off, len - first ≤ off); the bytes are
        // committed and only a lock holder could change them, which is us.
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts(self.ring.add(off), first),
                std::slice::from_raw_parts(self.ring, len - first),
            )
        };
        dst.extend_from_slice(a);
        dst.extend_from_slice(b);
    }

    fn read_len(&self, pos: u64) -> u64 {
        let mut len = [0u8; 4];
        let off = (pos % self.cap) as usize;
        for (i, byte) in len.iter_mut().enumerate() {
            // SAFETY: the index is reduced modulo cap, inside the ring; the bytes are committed (lock held).
            *byte = unsafe { self.ring.add((off + i) % self.cap as usize).read() };
        }
        u64::from(u32::from_le_bytes(len))
    }

    fn put_many<M: AsRef<[u8]>>(&self, msgs: &[M], wait: Wait) -> Result<(), PutError> {
        let h = self.hdr();
        let n = msgs.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let mut need = 0u64;
        for m in msgs {
            let len = m.as_ref().len() as u64;
            if len > u64::from(u32::MAX) {
                return Err(PutError::TooLarge {
                    needed: len as usize,
                    capacity: self.cap as usize,
                });
            }
            need += LEN_PREFIX + len;
        }
        if need > self.cap {
            return Err(PutError::TooLarge {
                needed: need as usize,
                capacity: self.cap as usize,
            });
        }
        if n > h.max_messages {
            return Err(PutError::TooLarge {
                needed: n as usize,
                capacity: h.max_messages as usize,
            });
        }
        let mut spin = SpinBudget::new(self.spin, wait);
        loop {
            let locked = self.lock(wait).map_err(|_| PutError::Timeout)?;
            if h.closed.load(Ordering::SeqCst) != 0 {
                return Err(PutError::Closed);
            }
            let s = self.snapshot();
            if self.cap - (s.tail - s.head) >= need && h.max_messages - s.count >= n {
                let mut pos = s.tail;
                for m in msgs {
                    let m = m.as_ref();
                    self.write_at(pos, &(m.len() as u32).to_le_bytes());
                    self.write_at(pos + LEN_PREFIX, m);
                    pos += LEN_PREFIX + m.len() as u64;
                }
                self.commit(Snapshot {
                    head: s.head,
                    tail: pos,
                    count: s.count + n,
                });
                drop(locked);
                wake(&h.not_empty, n as u32);
                return Ok(());
            }
            match self.block(locked, &h.not_full, wait, &mut spin) {
                Blocked::Retry => continue,
                Blocked::Expired => {
                    return Err(if wait == Wait::No {
                        PutError::Full
                    } else {
                        PutError::Timeout
                    });
                }
            }
        }
    }

    fn get_one(&self, buf: &mut Vec<u8>, wait: Wait) -> Result<usize, GetError> {
        buf.clear();
        self.take(wait, |s| {
            let len = self.read_len(s.head);
            self.read_at(s.head + LEN_PREFIX, len as usize, buf);
            (1, LEN_PREFIX + len)
        })
        .map(|_| buf.len())
    }

    fn get_many(
        &self,
        out: &mut Batch,
        max_messages: usize,
        max_bytes: usize,
        wait: Wait,
    ) -> Result<usize, GetError> {
        out.clear();
        if max_messages == 0 {
            return Ok(0);
        }
        self.take(wait, |s| {
            let mut pos = s.head;
            let mut taken = 0u64;
            while taken < s.count && (taken as usize) < max_messages {
                let len = self.read_len(pos);
                if taken > 0 && out.bytes.len() + len as usize > max_bytes {
                    break;
                }
                self.read_at(pos + LEN_PREFIX, len as usize, &mut out.bytes);
                out.ends.push(out.bytes.len());
                pos += LEN_PREFIX + len;
                taken += 1;
            }
            (taken, pos - s.head)
        })
    }

    /// Waits for a non-empty queue, lets `read` copy messages out (returning how many and how many ring bytes) and
    /// commits their removal.
    fn take(&self, wait: Wait, mut read: impl FnMut(Snapshot) -> (u64, u64)) -> Result<usize, GetError> {
        let h = self.hdr();
        let mut spin = SpinBudget::new(self.spin, wait);
        loop {
            let locked = self.lock(wait).map_err(|_| GetError::Timeout)?;
            let s = self.snapshot();
            if s.count > 0 {
                let (n, bytes) = read(s);
                let (head, tail) = if n == s.count {
                    (0, 0)
                } else {
                    (s.head + bytes, s.tail)
                };
                self.commit(Snapshot {
                    head,
                    tail,
                    count: s.count - n,
                });
                drop(locked);
                wake(&h.not_full, u32::MAX);
                return Ok(n as usize);
            }
            if h.closed.load(Ordering::SeqCst) != 0 {
                return Err(GetError::Closed);
            }
            match self.block(locked, &h.not_empty, wait, &mut spin) {
                Blocked::Retry => continue,
                Blocked::Expired => {
                    return Err(if wait == Wait::No {
                        GetError::Empty
                    } else {
                        GetError::Timeout
                    });
                }
            }
        }
    }

    fn lock(&self, wait: Wait) -> Result<crate::sync::RobustGuard<'_>, crate::sync::LockTimeout> {
        let h = self.hdr();
        let locked = h.lock.lock(wait.deadline())?;
        if locked.previous_owner_died {
            // The active state slot is always consistent (see the module doc): nothing else to repair.
            h.owner_deaths.fetch_add(1, Ordering::SeqCst);
        }
        Ok(locked.guard)
    }

    /// The condition is false and the lock is held: spin briefly, then sleep on `set` until woken or the deadline.
    fn block(
        &self,
        locked: crate::sync::RobustGuard<'_>,
        set: &WaitSet,
        wait: Wait,
        spin: &mut SpinBudget,
    ) -> Blocked {
        if wait == Wait::No {
            return Blocked::Expired;
        }
        if spin.remaining() {
            // Spin without the lock; whatever the outcome, re-check the condition under the lock. Once the budget
            // is spent the next round registers as a waiter while still holding the lock it checked under.
            drop(locked);
            spin.watch(&self.hdr().commits.0, &self.hdr().closed);
            return Blocked::Retry;
        }
        set.waiters.fetch_add(1, Ordering::SeqCst);
        let seq = set.seq.load();
        drop(locked);
        let timeout = match wait {
            Wait::Until(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    set.waiters.fetch_sub(1, Ordering::SeqCst);
                    return Blocked::Expired;
                }
                Some(deadline - now)
            }
            _ => None,
        };
        set.seq.wait(seq, timeout);
        set.waiters.fetch_sub(1, Ordering::SeqCst);
        Blocked::Retry
    }

    fn close(&self) {
        let h = self.hdr();
        if let Ok(guard) = self.lock(Wait::Forever) {
            h.closed.store(1, Ordering::SeqCst);
            drop(guard);
        }
        for set in [&h.not_empty, &h.not_full] {
            set.seq.bump();
            set.seq.wake(u32::MAX);
        }
    }
}

/// After a commit (lock released): wake up to `n` sleepers, with no syscall when nobody waits.
fn wake(set: &WaitSet, n: u32) {
    if set.waiters.load(Ordering::SeqCst) > 0 {
        set.seq.bump();
        set.seq.wake(n);
    }
}

enum Blocked {
    Retry,
    Expired,
}

/// The bounded spin before sleeping: watch the commit counter for a while, backing off from busy spinning to
/// yielding the CPU, and give up at the budget or the call's deadline.
struct SpinBudget {
    until: Option<Instant>,
}

impl SpinBudget {
    fn new(spin: Duration, wait: Wait) -> SpinBudget {
        if spin.is_zero() || wait == Wait::No {
            return SpinBudget { until: None };
        }
        let mut until = Instant::now() + spin;
        if let Wait::Until(deadline) = wait {
            until = until.min(deadline);
        }
        SpinBudget { until: Some(until) }
    }

    fn remaining(&self) -> bool {
        self.until.is_some()
    }

    /// Spins until `commits` moves or the queue closes, or the budget is spent (then for good).
    fn watch(&mut self, commits: &AtomicU64, closed: &AtomicU32) {
        let Some(until) = self.until else { return };
        let seen = commits.load(Ordering::Acquire);
        let mut round = 0u32;
        loop {
            for _ in 0..(1u32 << round.min(6)) {
                std::hint::spin_loop();
            }
            if commits.load(Ordering::Acquire) != seen || closed.load(Ordering::Relaxed) != 0 {
                return;
            }
            round += 1;
            if round > 6 {
                std::thread::yield_now();
            }
            if round % 4 == 0 && Instant::now() >= until {
                self.until = None;
                return;
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;
    use std::sync::Arc;

    /// Every interleaving with up to three preemptions (loom's recommended bound: bugs almost always need fewer).
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(f);
    }

    /// Two producers, one consumer, a ring that fits one message: the full and empty wait/wake paths run; no message
    /// is lost or duplicated, and nobody sleeps forever.
    #[test]
    fn two_producers_one_consumer_tiny_ring() {
        model(|| {
            let q = Arc::new(Queue::heap(6, 1));
            let producers: Vec<_> = (0..2u8)
                .map(|p| {
                    let q = q.clone();
                    thread::spawn(move || {
                        q.put(&[p, 0]).expect("put");
                    })
                })
                .collect();
            let mut next = [0u8; 2];
            for _ in 0..2 {
                let m = q.get().expect("get");
                assert_eq!(m[1], next[m[0] as usize], "per-producer order");
                next[m[0] as usize] += 1;
            }
            for p in producers {
                p.join().expect("producer");
            }
            assert_eq!(next, [1, 1]);
            assert!(q.is_empty());
        });
    }

    /// A consumer blocked on an empty queue is woken by close and reports Closed after draining.
    #[test]
    fn close_wakes_blocked_consumer() {
        model(|| {
            let q = Arc::new(Queue::heap(16, 4));
            let consumer = {
                let q = q.clone();
                thread::spawn(move || {
                    let mut got = Vec::new();
                    loop {
                        match q.get() {
                            Ok(m) => got.push(m),
                            Err(e) => return (got, e),
                        }
                    }
                })
            };
            q.put(b"x").expect("put");
            q.close();
            let (got, err) = consumer.join().expect("consumer");
            assert_eq!(got, vec![b"x".to_vec()]);
            assert_eq!(err, GetError::Closed);
        });
    }

    /// put_many is all or nothing against a concurrent get_many.
    #[test]
    fn put_many_is_atomic_for_get_many() {
        model(|| {
            let q = Arc::new(Queue::heap(32, 8));
            let producer = {
                let q = q.clone();
                thread::spawn(move || q.put_many(&[b"a", b"b", b"c"]).expect("put_many"))
            };
            let mut batch = Batch::new();
            let n = q.get_many(&mut batch, 10, 1024).expect("get_many");
            assert_eq!(n, 3, "a batch is committed whole");
            producer.join().expect("producer");
        });
    }
}
