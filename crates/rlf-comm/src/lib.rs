//! EXARL's communication interface (`ExaComm`), in Rust: a [`Comm`] trait with point-to-point messages (`send`,
//! `recv` from a rank or any), collectives (`bcast`, `barrier`, `reduce`, `allreduce`, `gather`), a clock (`time`)
//! and `split`, over bytes and numbers, so that the RL components never name MPI types. Two flavours:
//! - [`LocalWorld`]: ranks as threads of one process, over mutex-guarded mailboxes: simple and obviously correct,
//!   for tests and as the oracle of the MPI flavour;
//! - `MpiComm` (cargo feature `mpi`): the system's MPI through rsmpi, as EXARL's `ExaSimple` is over mpi4py.
//!
//! [`layout`] holds EXARL's rules for the agent, env and learner communicators and builds them with `split`.
//!
//! Three ranks, each a thread, sum their gradients (as several learners of one policy do) and agree on the result:
//!
//! ```
//! use rlf_comm::{Comm, LocalWorld, Op, Values};
//!
//! let ranks: Vec<_> = LocalWorld::create(3)
//!     .into_iter()
//!     .map(|comm| {
//!         std::thread::spawn(move || {
//!             let mut gradient = [comm.rank() as f32, 1.0];
//!             comm.allreduce(Values::F32(&mut gradient), Op::Sum)?;
//!             Ok::<_, rlf_comm::CommError>(gradient)
//!         })
//!     })
//!     .collect();
//! for rank in ranks {
//!     assert_eq!(rank.join().unwrap()?, [0.0 + 1.0 + 2.0, 3.0]);
//! }
//! # Ok::<(), rlf_comm::CommError>(())
//! ```

#![forbid(unsafe_code)]

pub mod layout;
mod local;
#[cfg(feature = "mpi")]
mod mpi_comm;

pub use layout::{Communicators, Layout, LayoutError, Role};
pub use local::{LocalComm, LocalWorld};
#[cfg(feature = "mpi")]
pub use mpi_comm::{MpiComm, MpiThreadWorld, MpiUniverse};

/// A message tag (the workflows' message kinds). Tags from [`RESERVED_TAGS`] up are the collectives' own.
pub type Tag = u16;

/// The first tag the collectives keep for themselves; applications use tags below it (MPI guarantees tags up to
/// 32,767 only).
pub const RESERVED_TAGS: Tag = 0x7f00;

/// The largest colour [`Comm::split`] takes (MPI's colours and keys are non-negative C `int`s).
pub const MAX_COLOR: u32 = i32::MAX as u32;

/// Where a receive takes its message from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The rank given.
    Rank(usize),
    /// Whichever rank sent first.
    Any,
}

/// A reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The sum.
    Sum,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
}

impl Op {
    fn apply_f64(self, a: f64, b: f64) -> f64 {
        match self {
            Op::Sum => a + b,
            Op::Max => a.max(b),
            Op::Min => a.min(b),
        }
    }

    fn apply_f32(self, a: f32, b: f32) -> f32 {
        match self {
            Op::Sum => a + b,
            Op::Max => a.max(b),
            Op::Min => a.min(b),
        }
    }
}

/// Numbers a reduction works on in place: gradients and weights (`f32`), statistics (`f64`).
#[derive(Debug)]
pub enum Values<'a> {
    /// Single precision.
    F32(&'a mut [f32]),
    /// Double precision.
    F64(&'a mut [f64]),
}

impl Values<'_> {
    /// How many numbers.
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A message received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The sender's rank in the communicator.
    pub from: usize,
    /// The message.
    pub bytes: Vec<u8>,
}

/// What went wrong in a communication.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CommError {
    /// A rank outside the communicator.
    #[error("rank {rank} is not in a communicator of {size} ranks")]
    NoSuchRank {
        /// The rank given.
        rank: usize,
        /// The communicator's size.
        size: usize,
    },
    /// Ranks disagree on a collective's arguments (lengths of a reduction, for instance).
    #[error("collective {what}: {message}")]
    Mismatch {
        /// The collective.
        what: &'static str,
        /// What differed.
        message: String,
    },
    /// A tag the collectives reserve.
    #[error("tag {0} is reserved for collectives (use tags below {RESERVED_TAGS})")]
    ReservedTag(Tag),
    /// The other ranks are gone (the local world was dropped).
    #[error("the communicator is closed: {0}")]
    Closed(String),
    /// An argument out of range (a colour or key of `split`).
    #[error("{0}")]
    Argument(String),
    /// The MPI library could not be started, or is not there.
    #[error("MPI: {0}")]
    Mpi(String),
}

/// The result of a communication.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// EXARL's `ExaComm`: what a workflow needs of a communicator. Every collective must be called by every rank of the
/// communicator, in the same order, as in MPI.
pub trait Comm {
    /// This process's rank in the communicator.
    fn rank(&self) -> usize;

    /// Ranks in the communicator.
    fn size(&self) -> usize;

    /// Sends `bytes` to rank `dest` with `tag` (below [`RESERVED_TAGS`]); returns once the bytes may be reused.
    /// MPI may block until the receiver takes large messages (the local flavour never does): two ranks must not
    /// both send to each other before receiving.
    fn send(&self, dest: usize, tag: Tag, bytes: &[u8]) -> Result<()>;

    /// Receives the next message with `tag` from `source`; messages between two ranks arrive in the order sent.
    fn recv(&self, source: Source, tag: Tag) -> Result<Received>;

    /// Rank `root`'s `bytes` on every rank (`bytes` is replaced on the others).
    fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;

    /// Combines every rank's `values` element by element with `op` into rank `root`'s `values` (the others' are left
    /// as they were).
    fn reduce(&self, root: usize, values: Values<'_>, op: Op) -> Result<()>;

    /// Combines every rank's `values` element by element with `op` into every rank's `values`: the same bits on every
    /// rank, whatever algorithm the library picks (reduced to rank 0, then broadcast).
    fn allreduce(&self, values: Values<'_>, op: Op) -> Result<()>;

    /// Every rank's `bytes`, by rank, on rank `root` (`None` on the others).
    fn gather(&self, root: usize, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>>;

    /// Seconds on a monotonic wall clock (MPI's `Wtime`).
    fn time(&self) -> f64;

    /// Splits the communicator (a collective): ranks of the same `color` (at most [`MAX_COLOR`]) form a new
    /// communicator, ordered by `key` (then by rank); a rank with no colour gets `None`.
    fn split(&self, color: Option<u32>, key: usize) -> Result<Option<Box<dyn Comm>>>;

    /// The communicator of `members` (ranks of this one, distinct; member `i` gets rank `i`), made by the members
    /// alone (MPI's `MPI_Comm_create_group`): the other ranks take no part, and calls with different tags (below
    /// [`RESERVED_TAGS`]) may run at once, from several threads, without being confused.
    fn subgroup(&self, members: &[usize], tag: Tag) -> Result<Box<dyn Comm>>;
}

/// Checks the arguments of [`Comm::subgroup`] on rank `rank` of a communicator of `size`.
fn check_subgroup(members: &[usize], tag: Tag, rank: usize, size: usize) -> Result<()> {
    check_tag(tag)?;
    for (i, &m) in members.iter().enumerate() {
        check_rank(m, size)?;
        if members[..i].contains(&m) {
            return Err(CommError::Argument(format!(
                "subgroup {members:?} names rank {m} twice"
            )));
        }
    }
    if members.contains(&rank) {
        Ok(())
    } else {
        Err(CommError::Argument(format!(
            "rank {rank} is not in the subgroup {members:?} it makes"
        )))
    }
}

/// Checks that an application's `tag` is below the collectives' tags.
fn check_tag(tag: Tag) -> Result<()> {
    if tag < RESERVED_TAGS {
        Ok(())
    } else {
        Err(CommError::ReservedTag(tag))
    }
}

/// Checks a colour and a key of [`Comm::split`]: MPI takes non-negative C `int`s.
fn check_split(color: Option<u32>, key: usize) -> Result<(Option<i32>, i32)> {
    let color = color
        .map(|c| {
            i32::try_from(c).map_err(|_| CommError::Argument(format!("split colour {c} is over {MAX_COLOR}")))
        })
        .transpose()?;
    let key = i32::try_from(key)
        .map_err(|_| CommError::Argument(format!("split key {key} is over {}", i32::MAX)))?;
    Ok((color, key))
}

/// Checks that `rank` is in a communicator of `size` ranks.
fn check_rank(rank: usize, size: usize) -> Result<()> {
    if rank < size {
        Ok(())
    } else {
        Err(CommError::NoSuchRank { rank, size })
    }
}

/// Makes, on the thread that calls it, that thread's own handle on the world communicator (MPI's, started for
/// several threads).
pub trait WorldMaker: Send + Sync {
    /// The world communicator, for this thread.
    fn world(&self) -> Box<dyn Comm>;

    /// Ends every rank of the job with `code` (`MPI_Abort`): what a rank does when a peer neither answers nor dies.
    fn abort(&self, code: i32) -> !;

    /// What carries its communicators' point-to-point messages, for a rank's report.
    fn carrier(&self) -> &'static str {
        "MPI"
    }
}
