//! What a step becomes, shared by the rollout workers that write it and the learners that read it: the trajectory
//! slots of shared memory an on-policy learner trains from ([`TrajectoryPool`], its [`TrajectoryShape`] and
//! [`Field`]s), and the rows of a replay buffer an off-policy learner samples ([`TransitionLayout`], filled by the
//! [`NStepAdder`]). Both pack an observation's byte-valued parts as its [`ObsLayout`] says.

pub(crate) mod byte_strings;
mod trajectories;
pub mod transitions;

pub use trajectories::{Field, ObsLayout, SlotCopy, TrajectoryPool, TrajectoryPoolHandle, TrajectoryShape};
pub use transitions::{KeptWindows, NStepAdder, TransitionLayout};
