//! The crate's one error type: every variant that touches a file names it.

use std::fmt;
use std::path::{Path, PathBuf};

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, and with which file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file-system call failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A JSON file (config, checkpoint sidecar) could not be parsed or written.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The JSON file.
        path: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// A TensorBoard event file has a bad record.
    #[error("{}: corrupt event file at byte {offset}: {reason}", path.display())]
    CorruptEvents {
        /// The event file.
        path: PathBuf,
        /// Where the bad record starts.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A checkpoint file is truncated, corrupt or inconsistent with its sidecar.
    #[error("{}: corrupt checkpoint: {reason}", path.display())]
    CorruptCheckpoint {
        /// The sidecar or weights file at fault.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// No checkpoint in the directory could be loaded.
    #[error("no intact checkpoint in {}{}", dir.display(), SkippedList(skipped))]
    NoCheckpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The incomplete or corrupt checkpoints found there, newest first.
        skipped: Vec<Skipped>,
    },
    /// A tensor's shape does not match its data, or its name is unusable.
    #[error("tensor `{name}`: {reason}")]
    InvalidTensor {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The experiment name cannot be a folder name.
    #[error("invalid experiment name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// Another process holds the experiment's lock: it is running in that folder.
    #[error("experiment {} is in use by {}: one run per experiment (its lock: {})", dir.display(), holder.map_or_else(|| "another process".to_owned(), |pid| format!("process {pid}")), lock.display())]
    Locked {
        /// The experiment folder.
        dir: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The PID the holder wrote into the lock file, if it could be read.
        holder: Option<u32>,
    },
    /// The plotting library failed.
    #[error("{}: cannot draw the plot: {reason}", path.display())]
    Plot {
        /// The PNG being drawn.
        path: PathBuf,
        /// The drawing backend's error.
        reason: String,
    },
}

/// A checkpoint passed over while loading, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its sidecar (or, for a save cut short before the sidecar, its weights file).
    pub path: PathBuf,
    /// Why it was not loaded.
    pub reason: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

struct SkippedList<'a>(&'a [Skipped]);

impl fmt::Display for SkippedList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        f.write_str(" (skipped: ")?;
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{s}")?;
        }
        f.write_str(")")
    }
}

/// Adds the path to an I/O error: `io(path)` is the closure for `map_err`.
pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}
