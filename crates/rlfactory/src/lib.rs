//! rlfactory: high-throughput asynchronous reinforcement learning.
//!
//! Data flows `env → sampling (rollout, inference) → learning (batcher, learner) → runner`;
//! [`algo`] holds the math and [`model`] the networks (see `docs/architecture.md`).
//!
//! Trains CartPole-v1 until a mean return of 475 or 500K frames, on one event loop of this process (`serial_mode`:
//! the other modes start worker processes of the program's own binary, which must then hand them to [`cli::main`]):
//!
//! ```
//! use rlfactory::{config::Config, runner};
//!
//! let cfg = Config::for_env(
//!     "CartPole-v1",
//!     &[
//!         "stop_at_reward = 475",
//!         "train_for_env_steps = 500000",
//!         "serial_mode = true",
//!         "save_experiment = false",
//!     ],
//! )?;
//! let summary = runner::train(&cfg, std::time::Instant::now())?;
//! println!("{} frames, mean return {:?}", summary.env_frames, summary.mean_return);
//! # Ok::<(), rlfactory::RlfError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod algo;
pub mod cli;
pub mod config;
pub mod data;
pub mod enjoy;
pub mod env;
mod error;
pub mod experiment;
pub mod learning;
pub mod model;
pub mod pbt;
pub mod plan;
pub mod runner;
pub mod sampling;
pub mod top;
pub mod video;
#[cfg(feature = "python")]
pub mod wandb;

pub use error::{Result, RlfError};
