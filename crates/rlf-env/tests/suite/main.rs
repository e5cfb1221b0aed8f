//! The `rlf-env` crate's integration tests, one module per subject, in one binary: the native envs against the
//! reference libraries' recordings (`recorded`), and, with the `python` feature, the Gymnasium and PettingZoo bridges
//! (`gym_bridge`, `pz_bridge`) and pygame shared by several envs of one process (`pygame_shared`, whose test runs in
//! a process of its own, a re-run of this binary).

#[cfg(feature = "python")]
mod gym_bridge;
#[cfg(feature = "python")]
mod pygame_shared;
#[cfg(feature = "python")]
mod pz_bridge;
mod recorded;
