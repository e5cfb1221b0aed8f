//! Typed channels: `Sender<T>` / `Receiver<T>` over either flavour, picked by the constructor.
//!
//! - [`shared`]: values are encoded with `postcard` (compact varints) into a shared-memory [`Queue`]; either end can
//!   be re-opened in another process from [`Sender::handle`] / [`Receiver::handle`].
//! - [`local`]: a mutex, a `VecDeque` and two condition variables, for threads of one process and serial mode. It is
//!   also the obviously-correct oracle the shared flavour is tested against.
//!
//! Both are bounded (the local flavour by message count, the shared one by bytes and count), multi-producer and
//! multi-consumer (clone either end), and closable from either end.

use crate::queue::{GetError, PutError, Queue, QueueConfig, QueueHandle};
use crate::region::ShmError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a send failed; the value is handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError<T> {
    /// No room now (`try_send`).
    Full(T),
    /// No room before the deadline.
    Timeout(T),
    /// The channel was closed.
    Closed(T),
    /// The encoded value can never fit in the queue.
    TooLarge(T),
    /// The value could not be encoded.
    Encode(T),
}

impl<T> SendError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            SendError::Full(v)
            | SendError::Timeout(v)
            | SendError::Closed(v)
            | SendError::TooLarge(v)
            | SendError::Encode(v) => v,
        }
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SendError::Full(_) => "channel is full",
            SendError::Timeout(_) => "timed out waiting for room in the channel",
            SendError::Closed(_) => "channel is closed",
            SendError::TooLarge(_) => "value is larger than the channel's capacity",
            SendError::Encode(_) => "value could not be encoded",
        })
    }
}

impl<T: fmt::Debug> std::error::Error for SendError<T> {}

/// Why a receive failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvError {
    /// Nothing queued now (`try_recv`).
    Empty,
    /// Nothing arrived before the deadline.
    Timeout,
    /// The channel is closed and drained.
    Closed,
    /// A message could not be decoded as the receiver's type (it was consumed).
    Decode,
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecvError::Empty => "channel is empty",
            RecvError::Timeout => "timed out waiting for a value",
            RecvError::Closed => "channel is closed",
            RecvError::Decode => "a message could not be decoded",
        })
    }
}

impl std::error::Error for RecvError {}

/// The sending end. Clone it for more producers.
pub struct Sender<T> {
    flavor: Flavor<T>,
}

/// The receiving end. Clone it for more consumers (each value goes to exactly one).
pub struct Receiver<T> {
    flavor: Flavor<T>,
}

enum Flavor<T> {
    Local(Arc<Local<T>>),
    Shared(Arc<Queue>),
}

impl<T> Clone for Flavor<T> {
    fn clone(&self) -> Self {
        match self {
            Flavor::Local(l) => Flavor::Local(l.clone()),
            Flavor::Shared(q) => Flavor::Shared(q.clone()),
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender {
            flavor: self.flavor.clone(),
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Receiver {
            flavor: self.flavor.clone(),
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("shared", &matches!(self.flavor, Flavor::Shared(_)))
            .finish()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("shared", &matches!(self.flavor, Flavor::Shared(_)))
            .finish()
    }
}

/// An in-process channel holding at most `capacity` values (at least 1).
pub fn local<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let local = Arc::new(Local {
        state: Mutex::new(LocalState {
            items: VecDeque::new(),
            closed: false,
        }),
        not_empty: Condvar::new(),
        not_full: Condvar::new(),
        capacity: capacity.max(1),
    });
    (
        Sender {
            flavor: Flavor::Local(local.clone()),
        },
        Receiver {
            flavor: Flavor::Local(local),
        },
    )
}

/// A channel over a new shared-memory queue; its ends can be opened in other processes.
pub fn shared<T>(config: QueueConfig) -> Result<(Sender<T>, Receiver<T>), ShmError> {
    let q = Arc::new(Queue::create(config)?);
    Ok((
        Sender {
            flavor: Flavor::Shared(q.clone()),
        },
        Receiver {
            flavor: Flavor::Shared(q),
        },
    ))
}

fn open_shared<T>(handle: &QueueHandle) -> Result<Flavor<T>, ShmError> {
    Ok(Flavor::Shared(Arc::new(Queue::open(handle)?)))
}

impl<T> Flavor<T> {
    fn handle(&self) -> Option<QueueHandle> {
        match self {
            Flavor::Local(_) => None,
            Flavor::Shared(q) => Some(q.handle()),
        }
    }

    fn close(&self) {
        match self {
            Flavor::Local(l) => l.close(),
            Flavor::Shared(q) => q.close(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Flavor::Local(l) => l.lock().items.len(),
            Flavor::Shared(q) => q.len(),
        }
    }
}

impl<T: Serialize> Sender<T> {
    /// Opens the sending end of a shared channel created elsewhere.
    pub fn open(handle: &QueueHandle) -> Result<Sender<T>, ShmError> {
        Ok(Sender {
            flavor: open_shared(handle)?,
        })
    }

    /// Sends, waiting for room as long as it takes.
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        self.send_until(value, None, true)
    }

    /// Sends if there is room now.
    pub fn try_send(&self, value: T) -> Result<(), SendError<T>> {
        self.send_until(value, None, false)
    }

    /// Sends, waiting at most `timeout` for room.
    pub fn send_timeout(&self, value: T, timeout: Duration) -> Result<(), SendError<T>> {
        self.send_until(value, Instant::now().checked_add(timeout), true)
    }

    fn send_until(&self, value: T, deadline: Option<Instant>, wait: bool) -> Result<(), SendError<T>> {
        match &self.flavor {
            Flavor::Local(l) => l.send(value, deadline, wait),
            Flavor::Shared(q) => {
                let Ok(bytes) = postcard::to_stdvec(&value) else {
                    return Err(SendError::Encode(value));
                };
                let result = match (wait, deadline) {
                    (false, _) => q.try_put(&bytes),
                    (true, None) => q.put(&bytes),
                    (true, Some(d)) => q.put_timeout(&bytes, d.saturating_duration_since(Instant::now())),
                };
                result.map_err(|e| match e {
                    PutError::Full => SendError::Full(value),
                    PutError::Timeout => SendError::Timeout(value),
                    PutError::Closed => SendError::Closed(value),
                    PutError::TooLarge { .. } => SendError::TooLarge(value),
                })
            }
        }
    }

    /// The handle to open this channel in another process (`None` for a local channel).
    pub fn handle(&self) -> Option<QueueHandle> {
        self.flavor.handle()
    }

    /// Closes the channel for every end.
    pub fn close(&self) {
        self.flavor.close();
    }
}

impl<T: DeserializeOwned> Receiver<T> {
    /// Opens the receiving end of a shared channel created elsewhere.
    pub fn open(handle: &QueueHandle) -> Result<Receiver<T>, ShmError> {
        Ok(Receiver {
            flavor: open_shared(handle)?,
        })
    }

    /// Receives, waiting as long as it takes.
    pub fn recv(&self) -> Result<T, RecvError> {
        self.recv_until(None, true)
    }

    /// Receives if a value is queued now.
    pub fn try_recv(&self) -> Result<T, RecvError> {
        self.recv_until(None, false)
    }

    /// Receives, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvError> {
        self.recv_until(Instant::now().checked_add(timeout), true)
    }

    fn recv_until(&self, deadline: Option<Instant>, wait: bool) -> Result<T, RecvError> {
        match &self.flavor {
            Flavor::Local(l) => l.recv(deadline, wait),
            Flavor::Shared(q) => {
                let bytes = match (wait, deadline) {
                    (false, _) => q.try_get(),
                    (true, None) => q.get(),
                    (true, Some(d)) => q.get_timeout(d.saturating_duration_since(Instant::now())),
                }
                .map_err(|e| match e {
                    GetError::Empty => RecvError::Empty,
                    GetError::Timeout => RecvError::Timeout,
                    GetError::Closed => RecvError::Closed,
                })?;
                postcard::from_bytes(&bytes).map_err(|_| RecvError::Decode)
            }
        }
    }

    /// Values queued now.
    pub fn len(&self) -> usize {
        self.flavor.len()
    }

    /// Whether nothing is queued now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The handle to open this channel in another process (`None` for a local channel).
    pub fn handle(&self) -> Option<QueueHandle> {
        self.flavor.handle()
    }

    /// Closes the channel for every end.
    pub fn close(&self) {
        self.flavor.close();
    }
}

struct Local<T> {
    state: Mutex<LocalState<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
}

struct LocalState<T> {
    items: VecDeque<T>,
    closed: bool,
}

impl<T> Local<T> {
    /// A panic while holding this lock cannot leave the deque inconsistent, so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, LocalState<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits on `cv` until the deadline; returns the guard and whether the deadline has passed.
    fn wait<'a>(
        &self,
        cv: &Condvar,
        guard: MutexGuard<'a, LocalState<T>>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, LocalState<T>>, bool) {
        match deadline {
            None => (cv.wait(guard).unwrap_or_else(|e| e.into_inner()), false),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return (guard, true);
                }
                let (g, _) = cv.wait_timeout(guard, d - now).unwrap_or_else(|e| e.into_inner());
                (g, false)
            }
        }
    }

    fn send(&self, value: T, deadline: Option<Instant>, wait: bool) -> Result<(), SendError<T>> {
        let mut g = self.lock();
        loop {
            if g.closed {
                return Err(SendError::Closed(value));
            }
            if g.items.len() < self.capacity {
                g.items.push_back(value);
                drop(g);
                self.not_empty.notify_one();
                return Ok(());
            }
            if !wait {
                return Err(SendError::Full(value));
            }
            let (next, expired) = self.wait(&self.not_full, g, deadline);
            if expired {
                return Err(SendError::Timeout(value));
            }
            g = next;
        }
    }

    fn recv(&self, deadline: Option<Instant>, wait: bool) -> Result<T, RecvError> {
        let mut g = self.lock();
        loop {
            if let Some(v) = g.items.pop_front() {
                drop(g);
                self.not_full.notify_one();
                return Ok(v);
            }
            if g.closed {
                return Err(RecvError::Closed);
            }
            if !wait {
                return Err(RecvError::Empty);
            }
            let (next, expired) = self.wait(&self.not_empty, g, deadline);
            if expired {
                return Err(RecvError::Timeout);
            }
            g = next;
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }
}
