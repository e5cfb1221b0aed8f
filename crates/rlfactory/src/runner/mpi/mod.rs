//! The async workflow across processes and machines over [`rlf_comm`]'s communicators (EXARL's structure): every part
//! of it but the env groups, which are envs ([`crate::env::group`]).
//!
//! - [`launch`]: `train --mpi` under `mpirun` (cargo feature `mpi`): MPI started for several threads, then this
//!   process's rank.
//! - [`rank`]: one rank of the job: the components it runs, its sending and receiving threads, the closing handshake.
//! - [`link`]: the component on each rank's main loop that stands for the other side, and the messages between ranks.
//! - [`node`]: those messages between ranks of one machine through shared-memory queues instead of MPI.

mod launch;
mod link;
#[cfg(feature = "mpi")]
mod node;
mod rank;

pub use launch::train_mpi;
pub(super) use link::{
    ActorLink, ActorLinkSignals, ActorStopped, LearnerLink, LearnerLinkSignals, LinkEnds, LinkFailed, Ranks,
    StopRequested,
};
pub use rank::train_rank;
pub(super) use rank::LearnerSync;
