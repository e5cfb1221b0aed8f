//! Shared memory for rlfactory: named regions, a crash-safe multi-process MPMC byte queue, shared arrays, a replay
//! ring for off-policy learners ([`replay`]: rows visible only once complete, a wake-up on an insert count, Reverb's
//! rate limit) (and, in [`process`], the allocator and floating-point settings that also need a raw OS call or a CPU
//! register), and in `tensor` (feature `tch`), loops of ours over float32 tensors' elements.
//!
//! This is the only crate of the workspace allowed `unsafe`; every block states its invariant.
//!
//! # A byte queue between processes
//! ```
//! use rlf_shm::{Queue, QueueConfig, Batch};
//! use std::time::Duration;
//!
//! let q = Queue::create(QueueConfig { max_bytes: 4096, ..QueueConfig::default() })?;
//! // Another process would call `Queue::open(&handle)` with this (serialisable) handle.
//! let handle = q.handle();
//! let other = Queue::open(&handle)?;
//!
//! q.put(b"hello")?;
//! q.put_many(&[b"a".as_slice(), b"b".as_slice()])?; // all or nothing
//! assert_eq!(other.get()?, b"hello");
//! let mut batch = Batch::new();
//! assert_eq!(other.get_many(&mut batch, 10, 1 << 20)?, 2);
//! assert_eq!(other.get_timeout(Duration::from_millis(1)), Err(rlf_shm::GetError::Timeout));
//! q.close();
//! assert_eq!(other.get(), Err(rlf_shm::GetError::Closed));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See [`queue`] for the protocol and what happens when a process dies mid-operation.

pub mod array;
mod header;
pub mod process;
pub mod queue;
pub mod region;
#[cfg(not(loom))]
pub mod replay;
mod sync;
#[cfg(feature = "tch")]
pub mod tensor;

pub use array::{Pod, SharedBoard, SharedWeights, SharedWeightsHandle, ShmArray, ShmArrayHandle, TornRead};
pub use queue::{Batch, GetError, PutError, Queue, QueueConfig, QueueHandle};
pub use region::{Region, RegionHandle, ShmError};
#[cfg(not(loom))]
pub use replay::{Gone, InsertError, RateLimit, ReplayRing, ReplayRingHandle, Wait};
