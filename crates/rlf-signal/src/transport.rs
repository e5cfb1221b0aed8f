//! The transport seam: how bytes reach a loop's inbound queue or a work queue.
//!
//! Event loops never touch a queue directly; they go through [`Transport`], addressed by [`Endpoint`]. The built-in
//! [`QueueTransport`] has two flavours behind one face: shared-memory queues ([`rlf_shm::Queue`], which serve both
//! threads and processes) and an in-process mutex-and-`VecDeque` flavour for serial mode. A later MPI flavour (loops
//! on other machines) implements the same trait; components never see the difference.

use rlf_shm::{Batch, GetError, PutError, Queue, QueueConfig, QueueHandle, ShmError};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where a message goes: the inbound queue of a loop, or a work queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// The inbound queue of the loop with this index.
    Loop(u32),
    /// The work queue with this index.
    Work(u32),
}

/// Why a send failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// No room before the deadline (or now, for a try).
    #[error("receiver queue is full")]
    Full,
    /// The receiving end was closed (its loop stopped or is stopping).
    #[error("receiver queue is closed")]
    Closed,
    /// The message can never fit.
    #[error("message needs {needed} bytes but the queue holds at most {capacity}")]
    TooLarge {
        /// Bytes (or messages) needed.
        needed: usize,
        /// The queue's capacity in the same unit.
        capacity: usize,
    },
    /// The endpoint does not exist in this transport.
    #[error("no such endpoint")]
    NoEndpoint,
}

/// Why a receive returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// Nothing arrived before the deadline.
    #[error("nothing arrived before the deadline")]
    Timeout,
    /// The endpoint is closed and drained.
    #[error("endpoint is closed")]
    Closed,
    /// The endpoint does not exist in this transport.
    #[error("no such endpoint")]
    NoEndpoint,
}

/// Messages taken by one receive, in order.
#[derive(Debug, Default)]
pub struct Inbound {
    repr: InboundRepr,
}

#[derive(Debug)]
enum InboundRepr {
    Shm(Batch),
    Owned(VecDeque<Vec<u8>>),
}

impl Default for InboundRepr {
    fn default() -> Self {
        InboundRepr::Shm(Batch::new())
    }
}

impl Inbound {
    /// An empty buffer.
    pub fn new() -> Inbound {
        Inbound::default()
    }

    /// Appends one message (for transports other than the built-in one).
    pub fn push(&mut self, msg: &[u8]) {
        self.owned().push_back(msg.to_vec());
    }

    /// Number of messages.
    pub fn len(&self) -> usize {
        match &self.repr {
            InboundRepr::Shm(b) => b.len(),
            InboundRepr::Owned(v) => v.len(),
        }
    }

    /// Whether there are no messages.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th message.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        match &self.repr {
            InboundRepr::Shm(b) => b.get(i),
            InboundRepr::Owned(v) => v.get(i).map(Vec::as_slice),
        }
    }

    /// Empties the buffer, keeping its allocations.
    pub fn clear(&mut self) {
        match &mut self.repr {
            InboundRepr::Shm(b) => b.clear(),
            InboundRepr::Owned(v) => v.clear(),
        }
    }

    fn owned(&mut self) -> &mut VecDeque<Vec<u8>> {
        if let InboundRepr::Shm(_) = self.repr {
            self.repr = InboundRepr::Owned(VecDeque::new());
        }
        match &mut self.repr {
            InboundRepr::Owned(v) => v,
            InboundRepr::Shm(_) => unreachable!("just replaced"),
        }
    }

    fn batch(&mut self) -> &mut Batch {
        if let InboundRepr::Owned(_) = self.repr {
            self.repr = InboundRepr::Shm(Batch::new());
        }
        match &mut self.repr {
            InboundRepr::Shm(b) => b,
            InboundRepr::Owned(_) => unreachable!("just replaced"),
        }
    }
}

/// Moves bytes between loops. Implementations must keep per-sender order per endpoint, deliver each message to
/// exactly one receive, and block (never poll) while waiting.
pub trait Transport: Send + Sync + 'static {
    /// Puts all `msgs` (in order) into `to`, or none; waits for room up to `timeout` (`Duration::ZERO`: not at all).
    fn send(&self, to: Endpoint, msgs: &[&[u8]], timeout: Duration) -> Result<(), SendError>;
    /// Takes up to `max` messages from `from` into `out` (replacing its contents), waiting for the first until
    /// `deadline` (`None`: for ever; a past instant: not at all). Returns how many were taken.
    fn recv(
        &self,
        from: Endpoint,
        out: &mut Inbound,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<usize, RecvError>;
    /// Closes an endpoint: later sends fail with [`SendError::Closed`]; receives drain what is left, then report
    /// [`RecvError::Closed`].
    fn close(&self, endpoint: Endpoint);
    /// Messages waiting in `endpoint` now, where the transport can tell (a live view of the run; `None` otherwise).
    fn queued(&self, endpoint: Endpoint) -> Option<usize> {
        let _ = endpoint;
        None
    }
}

/// The built-in transport: one queue per loop and per work queue, shared-memory or in-process.
#[derive(Debug)]
pub struct QueueTransport {
    loops: Vec<Pipe>,
    works: Vec<Pipe>,
}

#[derive(Debug)]
enum Pipe {
    Shm(Queue),
    Local(LocalQueue),
}

/// Serialisable description of a shared-memory [`QueueTransport`], from which a child process opens it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransportHandle {
    loops: Vec<QueueHandle>,
    works: Vec<QueueHandle>,
}

impl QueueTransport {
    /// Creates shared-memory queues of the given sizes in bytes (usable from threads and, through
    /// [`QueueTransport::handle`], from other processes).
    pub fn shared(loop_bytes: &[usize], work_bytes: &[usize]) -> Result<QueueTransport, ShmError> {
        let make = |bytes: &usize| {
            Queue::create(QueueConfig {
                max_bytes: *bytes,
                ..QueueConfig::default()
            })
            .map(Pipe::Shm)
        };
        Ok(QueueTransport {
            loops: loop_bytes.iter().map(make).collect::<Result<_, _>>()?,
            works: work_bytes.iter().map(make).collect::<Result<_, _>>()?,
        })
    }

    /// Creates in-process queues (serial mode and tests).
    pub fn local(loop_bytes: &[usize], work_bytes: &[usize]) -> QueueTransport {
        let make = |bytes: &usize| Pipe::Local(LocalQueue::new(*bytes));
        QueueTransport {
            loops: loop_bytes.iter().map(make).collect(),
            works: work_bytes.iter().map(make).collect(),
        }
    }

    /// The handle a child process opens this transport with; `None` for the in-process flavour.
    pub fn handle(&self) -> Option<TransportHandle> {
        let handles = |pipes: &[Pipe]| {
            pipes
                .iter()
                .map(|p| match p {
                    Pipe::Shm(q) => Some(q.handle()),
                    Pipe::Local(_) => None,
                })
                .collect::<Option<Vec<_>>>()
        };
        Some(TransportHandle {
            loops: handles(&self.loops)?,
            works: handles(&self.works)?,
        })
    }

    /// Opens the queues of a shared-memory transport created by another process.
    pub fn open(handle: &TransportHandle) -> Result<QueueTransport, ShmError> {
        let open = |h: &QueueHandle| Queue::open(h).map(Pipe::Shm);
        Ok(QueueTransport {
            loops: handle.loops.iter().map(open).collect::<Result<_, _>>()?,
            works: handle.works.iter().map(open).collect::<Result<_, _>>()?,
        })
    }

    fn pipe(&self, e: Endpoint) -> Option<&Pipe> {
        match e {
            Endpoint::Loop(i) => self.loops.get(i as usize),
            Endpoint::Work(i) => self.works.get(i as usize),
        }
    }
}

fn put_error(e: PutError) -> SendError {
    match e {
        PutError::Full | PutError::Timeout => SendError::Full,
        PutError::Closed => SendError::Closed,
        PutError::TooLarge { needed, capacity } => SendError::TooLarge { needed, capacity },
    }
}

impl Transport for QueueTransport {
    fn send(&self, to: Endpoint, msgs: &[&[u8]], timeout: Duration) -> Result<(), SendError> {
        match self.pipe(to).ok_or(SendError::NoEndpoint)? {
            Pipe::Shm(q) => {
                let r = if timeout.is_zero() {
                    q.try_put_many(msgs)
                } else {
                    q.put_many_timeout(msgs, timeout)
                };
                r.map_err(put_error)
            }
            Pipe::Local(q) => q.put_many(msgs, timeout),
        }
    }

    fn recv(
        &self,
        from: Endpoint,
        out: &mut Inbound,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<usize, RecvError> {
        match self.pipe(from).ok_or(RecvError::NoEndpoint)? {
            Pipe::Shm(q) => {
                let batch = out.batch();
                let r = match deadline {
                    None => q.get_many(batch, max, usize::MAX),
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            q.try_get_many(batch, max, usize::MAX)
                        } else {
                            q.get_many_timeout(batch, max, usize::MAX, left)
                        }
                    }
                };
                r.map_err(|e| match e {
                    GetError::Empty | GetError::Timeout => RecvError::Timeout,
                    GetError::Closed => RecvError::Closed,
                })
            }
            Pipe::Local(q) => q.get_many(out.owned(), max, deadline),
        }
    }

    fn close(&self, endpoint: Endpoint) {
        match self.pipe(endpoint) {
            Some(Pipe::Shm(q)) => q.close(),
            Some(Pipe::Local(q)) => q.close(),
            None => {}
        }
    }

    fn queued(&self, endpoint: Endpoint) -> Option<usize> {
        match self.pipe(endpoint)? {
            Pipe::Shm(q) => Some(q.len()),
            Pipe::Local(q) => Some(q.lock().msgs.len()),
        }
    }
}

/// The simple in-process flavour: a mutex, a `VecDeque` and two condition variables, bounded in bytes.
#[derive(Debug)]
struct LocalQueue {
    state: Mutex<LocalState>,
    not_empty: Condvar,
    not_full: Condvar,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct LocalState {
    msgs: VecDeque<Vec<u8>>,
    bytes: usize,
    closed: bool,
}

impl LocalQueue {
    fn new(max_bytes: usize) -> LocalQueue {
        LocalQueue {
            state: Mutex::new(LocalState::default()),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, LocalState> {
        // A panic while holding this lock cannot leave the state inconsistent (every update is one push or pop).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put_many(&self, msgs: &[&[u8]], timeout: Duration) -> Result<(), SendError> {
        let needed: usize = msgs.iter().map(|m| m.len() + 4).sum();
        if needed > self.max_bytes {
            return Err(SendError::TooLarge {
                needed,
                capacity: self.max_bytes,
            });
        }
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.lock();
        loop {
            if st.closed {
                return Err(SendError::Closed);
            }
            if st.bytes + needed <= self.max_bytes {
                break;
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return Err(SendError::Full);
            }
            st = self
                .not_full
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        st.bytes += needed;
        st.msgs.extend(msgs.iter().map(|m| m.to_vec()));
        drop(st);
        self.not_empty.notify_all();
        Ok(())
    }

    fn get_many(
        &self,
        out: &mut VecDeque<Vec<u8>>,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<usize, RecvError> {
        out.clear();
        let mut st = self.lock();
        while st.msgs.is_empty() {
            if st.closed {
                return Err(RecvError::Closed);
            }
            st = match deadline {
                None => self.not_empty.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(RecvError::Timeout);
                    }
                    self.not_empty
                        .wait_timeout(st, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
        let n = st.msgs.len().min(max.max(1));
        let state = &mut *st;
        for m in state.msgs.drain(..n) {
            state.bytes -= m.len() + 4;
            out.push_back(m);
        }
        drop(st);
        self.not_full.notify_all();
        Ok(n)
    }

    fn close(&self) {
        self.lock().closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conformance(t: &QueueTransport) {
        let e = Endpoint::Loop(0);
        let mut inb = Inbound::new();
        assert_eq!(
            t.recv(e, &mut inb, 10, Some(Instant::now())),
            Err(RecvError::Timeout)
        );
        t.send(e, &[b"a", b"bc"], Duration::ZERO).expect("room");
        t.send(e, &[b"d"], Duration::from_millis(5)).expect("room");
        assert_eq!(t.queued(e), Some(3));
        assert_eq!(t.recv(e, &mut inb, 2, None), Ok(2));
        assert_eq!(t.queued(e), Some(1));
        assert_eq!(t.queued(Endpoint::Work(3)), None);
        assert_eq!((inb.get(0), inb.get(1)), (Some(&b"a"[..]), Some(&b"bc"[..])));
        // 64-byte queue: 3 bytes + prefix is left queued; a 60-byte message cannot fit now, and never alone.
        assert_eq!(t.send(e, &[&[0u8; 60]], Duration::ZERO), Err(SendError::Full));
        assert!(matches!(
            t.send(e, &[&[0u8; 100]], Duration::ZERO),
            Err(SendError::TooLarge { .. })
        ));
        let t0 = Instant::now();
        assert_eq!(
            t.send(e, &[&[0u8; 60]], Duration::from_millis(20)),
            Err(SendError::Full)
        );
        assert!(t0.elapsed() >= Duration::from_millis(20));
        t.close(e);
        assert_eq!(t.send(e, &[b"x"], Duration::ZERO), Err(SendError::Closed));
        assert_eq!(t.recv(e, &mut inb, 10, None), Ok(1));
        assert_eq!(inb.get(0), Some(&b"d"[..]));
        assert_eq!(t.recv(e, &mut inb, 10, None), Err(RecvError::Closed));
        assert_eq!(
            t.send(Endpoint::Work(3), &[b"x"], Duration::ZERO),
            Err(SendError::NoEndpoint)
        );
    }

    #[test]
    fn local_flavour_conforms() {
        conformance(&QueueTransport::local(&[64], &[]));
    }

    #[test]
    fn shared_flavour_conforms() {
        let t = QueueTransport::shared(&[64], &[]).expect("shm");
        conformance(&t);
        let h = t.handle().expect("shared handle");
        assert!(QueueTransport::open(&h).is_ok());
        assert!(QueueTransport::local(&[64], &[]).handle().is_none());
    }

    #[test]
    fn inbound_push_switches_flavour() {
        let mut inb = Inbound::new();
        inb.push(b"x");
        inb.push(b"yz");
        assert_eq!(inb.len(), 2);
        assert_eq!(inb.get(1), Some(&b"yz"[..]));
        inb.clear();
        assert!(inb.is_empty());
    }
}
