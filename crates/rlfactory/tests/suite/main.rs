//! The `rlfactory` crate's integration tests, one module per subject, in one binary: the crate and libtorch are linked
//! once, and the harness's threads take the next test of any module as soon as one is free. The modules of Gymnasium
//! and PettingZoo envs need the `python` feature, those of MPI jobs the `mpi` feature (`bash scripts/test`, the CI lane
//! of docs/contributing.md, builds both). Apart: `own_binary`, its own training program (`harness = false`), and
//! `vizdoom`, whose game crashes a process that ran ALE (`pixels`).
//!
//! Tests that run libtorch in this process and seed its one random generator take turns
//! ([`common::torch_rng`]); the others start the `rlfactory` binary.

#[path = "../common/mod.rs"]
mod common;

mod appo_math;
mod checkpoint_kill;
mod cli;
mod dqn;
mod experiment;
mod fault_matrix;
#[cfg(feature = "python")]
mod gym_faults;
mod learning;
mod libtorch;
mod memory;
#[cfg(feature = "mpi")]
mod mpi_train;
mod multi_agent;
mod parallel;
mod pbt;
#[cfg(feature = "python")]
mod pettingzoo;
#[cfg(feature = "python")]
mod pixels;
mod ppo_cartpole;
mod sac;
mod several_learners;
mod top;
#[cfg(feature = "python")]
mod true_objective;
mod video;
