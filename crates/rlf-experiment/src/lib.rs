//! The experiment side of rlfactory, independent of RL: the experiment folder, TensorBoard event files, crash-safe
//! checkpoints and learning-curve plots.
//!
//! # A training run's life
//!
//! Prepare the folder `<train_dir>/<experiment>/` (saving the resolved config and opening the log):
//!
//! ```
//! use rlf_experiment::{Checkpoint, CheckpointConfig, CheckpointMeta, Experiment, RestartBehavior, Tensor};
//!
//! # fn main() -> Result<(), rlf_experiment::Error> {
//! # let tmp = tempfile::tempdir().unwrap();
//! # let train_dir = tmp.path();
//! let config = serde_json::json!({ "env": "CartPole-v1", "learning_rate": 3e-4 });
//! let exp = Experiment::prepare(train_dir, "cartpole", RestartBehavior::Resume, &config)?;
//! exp.log("starting")?;
//! # Ok(())
//! # }
//! ```
//!
//! Resume from the newest intact checkpoint, if any (a corrupt newer one is skipped and reported):
//!
//! ```
//! # use rlf_experiment::*;
//! # fn main() -> Result<(), rlf_experiment::Error> {
//! # let tmp = tempfile::tempdir().unwrap();
//! # let exp = Experiment::prepare(tmp.path(), "cartpole", RestartBehavior::Resume, &serde_json::json!({}))?;
//! let mut store = exp.checkpoint_store(0, CheckpointConfig { keep_checkpoints: 2, milestone_every_env_steps: None })?;
//! let mut env_steps = 0;
//! if let Some(loaded) = store.load_latest()? {
//!     for s in &loaded.skipped {
//!         exp.log(&format!("skipped checkpoint {s}"))?;
//!     }
//!     env_steps = loaded.checkpoint.meta.env_steps;
//! }
//! # let _ = env_steps;
//! # Ok(())
//! # }
//! ```
//!
//! While training, write scalars for TensorBoard, save checkpoints (the best one too) and redraw the learning curve:
//!
//! ```
//! # use rlf_experiment::*;
//! # fn main() -> Result<(), rlf_experiment::Error> {
//! # let tmp = tempfile::tempdir().unwrap();
//! # let exp = Experiment::prepare(tmp.path(), "cartpole", RestartBehavior::Resume, &serde_json::json!({}))?;
//! # let mut store = exp.checkpoint_store(0, CheckpointConfig::default())?;
//! let mut summary = exp.summary_writer(0)?;
//! let mut curve = Vec::new();
//! for train_step in 1..=3u64 {
//!     let env_steps = train_step * 1024;
//!     let mean_return = 20.0 * train_step as f64;
//!     summary.add_scalar("reward/mean", mean_return as f32, env_steps as i64)?;
//!     curve.push((env_steps, mean_return));
//!
//!     let mut ckpt = Checkpoint {
//!         meta: CheckpointMeta {
//!             train_step,
//!             env_steps,
//!             policy_version: train_step,
//!             metric: Some(mean_return),
//!             extra: serde_json::json!({ "adam_step": train_step }),
//!         },
//!         ..Default::default()
//!     };
//!     ckpt.tensors.insert("actor.weight".into(), Tensor::f32(&[2, 2], vec![0.1, 0.2, 0.3, 0.4]));
//!     store.save(&ckpt)?;
//!     store.save_if_best(&ckpt)?;
//! }
//! summary.flush()?;
//! rlf_experiment::plot_curve(exp.plot_path(0), &curve, "CartPole-v1")?;
//!
//! let best = store.load_best()?.expect("saved above");
//! assert_eq!(best.checkpoint.meta.train_step, 3);
//! assert_eq!(rlf_experiment::read_scalars(summary.path())?.len(), 3);
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod atomic;
pub mod checkpoint;
mod error;
pub mod folder;
pub mod plot;
pub mod summary;

pub use atomic::write as write_atomically;
pub use checkpoint::{
    load_checkpoint, Checkpoint, CheckpointConfig, CheckpointMeta, CheckpointStore, Loaded, Tensor,
    TensorData,
};
pub use error::{Error, Result, Skipped};
pub use folder::{free_bytes, Experiment, ExperimentLock, RestartBehavior};
pub use plot::{plot_curve, plot_curves};
pub use summary::{read_scalars, SummaryWriter};
