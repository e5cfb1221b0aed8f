//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong while configuring, building or running a training job. Every message names
/// what was wrong and where (which flag, file, env or component).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RlfError {
    /// A configuration value or combination of values is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// What the flags ask for cannot run on this machine (its shared memory or disk is too small for it): found
    /// when the run is planned, before it starts, and reported as a bad flag is (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// A configuration file could not be read or parsed.
    #[error("config file {path}: {message}")]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The environment failed.
    #[error(transparent)]
    Env(#[from] rlf_env::EnvError),
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(String),
    /// A model does not support this observation or action space.
    #[error("unsupported space for a model: {0}")]
    UnsupportedSpace(String),
    /// Weights do not fit the model they are loaded into.
    #[error("weights do not fit the model: {0}")]
    WeightMismatch(String),
    /// Reading or writing a file failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A component received a message it cannot use (wrong sizes, unknown worker).
    #[error("{component}: {message}")]
    Protocol {
        /// The component that rejected the message.
        component: &'static str,
        /// What was wrong.
        message: String,
    },
    /// A shared-memory buffer could not be created or mapped.
    #[error(transparent)]
    Shm(#[from] rlf_shm::ShmError),
    /// The experiment folder, a TensorBoard file, a checkpoint or a plot failed (names the file).
    #[error(transparent)]
    Experiment(#[from] rlf_experiment::Error),
    /// A checkpoint does not hold what rlfactory saves.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// Its sidecar.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A signal could not be delivered (a receiver's queue stayed full, a message too large).
    #[error(transparent)]
    Emit(#[from] rlf_signal::EmitError),
    /// The event loop failed.
    #[error("event loop: {0}")]
    EventLoop(String),
    /// A component of the run failed (the faults, on one line, each naming its loop and object).
    #[error("{0}")]
    Component(String),
    /// Another learner of this policy stopped (several learners): this one stops too, without taking the step.
    #[error("another learner of this policy stopped")]
    LearnersStopped,
    /// An error every rank of an MPI job has, already written by rank 0 alone (the ranks exit without another line).
    #[error("(reported by rank 0)")]
    ReportedByRankZero,
}

impl From<tch::TchError> for RlfError {
    fn from(e: tch::TchError) -> Self {
        RlfError::Torch(e.to_string())
    }
}

/// The crate's result type.
pub type Result<T, E = RlfError> = std::result::Result<T, E>;
