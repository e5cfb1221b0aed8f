//! The experiment folder `<train_dir>/<experiment>/`:
//!
//! ```text
//! config.json              the resolved config of the latest start
//! log.txt                  the run's log, appended across resumes
//! .summary/<policy>/       TensorBoard event files
//! checkpoint_p<policy>/    checkpoints (see the checkpoint module)
//! learning_curve_p<policy>.png
//! ```
//!
//! [`RestartBehavior`] says what happens when the folder already exists, as Sample Factory's `--restart_behavior`.

use crate::atomic;
use crate::checkpoint::{CheckpointConfig, CheckpointStore};
use crate::error::{io, Error, Result};
use crate::summary::SummaryWriter;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

const CONFIG_FILE: &str = "config.json";
const LOG_FILE: &str = "log.txt";

/// What to do with an existing experiment folder (no effect when there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartBehavior {
    /// Keep everything and continue from the latest checkpoint (the default).
    #[default]
    Resume,
    /// Move the existing folder aside to `<experiment>_old0001` (the first free number) and start from scratch.
    Restart,
    /// Delete the existing folder and start from scratch.
    Overwrite,
}

impl RestartBehavior {
    /// The flag value: `resume`, `restart` or `overwrite`.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartBehavior::Resume => "resume",
            RestartBehavior::Restart => "restart",
            RestartBehavior::Overwrite => "overwrite",
        }
    }
}

impl fmt::Display for RestartBehavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RestartBehavior {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "resume" => Ok(RestartBehavior::Resume),
            "restart" => Ok(RestartBehavior::Restart),
            "overwrite" => Ok(RestartBehavior::Overwrite),
            other => Err(format!(
                "unknown restart behavior {other:?} (expected resume, restart or overwrite)"
            )),
        }
    }
}

/// A prepared experiment folder with its log file open.
#[derive(Debug)]
pub struct Experiment {
    dir: PathBuf,
    log: File,
    previous_config: Option<serde_json::Value>,
    moved_to: Option<PathBuf>,
}

impl Experiment {
    /// Prepares `<train_dir>/<name>/` according to `behavior`, writes `config` to `config.json` (atomically) and
    /// opens `log.txt` for appending.
    ///
    /// With [`Resume`](RestartBehavior::Resume) the config saved by the previous start, if any, is returned by
    /// [`previous_config`](Self::previous_config) for comparison before it is replaced.
    pub fn prepare(
        train_dir: impl AsRef<Path>,
        name: &str,
        behavior: RestartBehavior,
        config: &serde_json::Value,
    ) -> Result<Self> {
        check_name(name)?;
        let dir = train_dir.as_ref().join(name);
        let mut moved_to = None;
        if dir.exists() {
            match behavior {
                RestartBehavior::Resume => {}
                RestartBehavior::Restart => {
                    let old = (1u32..)
                        .map(|i| dir.with_file_name(format!("{name}_old{i:04}")))
                        .find(|p| !p.exists())
                        .ok_or_else(|| io(&dir)(std::io::Error::other("no free `_old` name")))?;
                    fs::rename(&dir, &old).map_err(io(&old))?;
                    moved_to = Some(old);
                }
                RestartBehavior::Overwrite => fs::remove_dir_all(&dir).map_err(io(&dir))?,
            }
        }
        fs::create_dir_all(&dir).map_err(io(&dir))?;

        let config_path = dir.join(CONFIG_FILE);
        let previous_config = match fs::read(&config_path) {
            Ok(bytes) => Some(serde_json::from_slice(&bytes).map_err(|source| Error::Json {
                path: config_path.clone(),
                source,
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&config_path)(e)),
        };
        let text = serde_json::to_vec_pretty(config).map_err(|source| Error::Json {
            path: config_path.clone(),
            source,
        })?;
        atomic::write(&config_path, &text)?;

        let log_path = dir.join(LOG_FILE);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io(&log_path))?;
        Ok(Self {
            dir,
            log,
            previous_config,
            moved_to,
        })
    }

    /// Writes `bytes` to the file `name` of the folder atomically (temporary file, fsync, rename):
    /// a reader sees the old content or the new, never a mix.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        let path = self.dir.join(name);
        atomic::write(&path, bytes)?;
        Ok(path)
    }

    /// The experiment folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The config saved by the previous start (only when resuming a folder that had one).
    pub fn previous_config(&self) -> Option<&serde_json::Value> {
        self.previous_config.as_ref()
    }

    /// Where [`Restart`](RestartBehavior::Restart) moved the previous folder.
    pub fn moved_to(&self) -> Option<&Path> {
        self.moved_to.as_deref()
    }

    /// `config.json`.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE)
    }

    /// `log.txt`.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    /// Appends `line` and a newline to the log file.
    pub fn log(&self, line: &str) -> Result<()> {
        let mut out = &self.log;
        out.write_all(format!("{line}\n").as_bytes())
            .map_err(io(&self.log_path()))
    }

    /// Another handle on the log file, appending (for a `tracing` subscriber's writer, say).
    pub fn log_file(&self) -> Result<File> {
        self.log.try_clone().map_err(io(&self.log_path()))
    }

    /// `.summary/<policy_id>/`.
    pub fn summary_dir(&self, policy_id: usize) -> PathBuf {
        self.dir.join(".summary").join(policy_id.to_string())
    }

    /// `checkpoint_p<policy_id>/`.
    pub fn checkpoint_dir(&self, policy_id: usize) -> PathBuf {
        self.dir.join(format!("checkpoint_p{policy_id}"))
    }

    /// `learning_curve_p<policy_id>.png`.
    pub fn plot_path(&self, policy_id: usize) -> PathBuf {
        self.dir.join(format!("learning_curve_p{policy_id}.png"))
    }

    /// A new TensorBoard event file in [`summary_dir`](Self::summary_dir).
    pub fn summary_writer(&self, policy_id: usize) -> Result<SummaryWriter> {
        SummaryWriter::create(self.summary_dir(policy_id))
    }

    /// The checkpoint store in [`checkpoint_dir`](Self::checkpoint_dir).
    pub fn checkpoint_store(&self, policy_id: usize, config: CheckpointConfig) -> Result<CheckpointStore> {
        CheckpointStore::open(self.checkpoint_dir(policy_id), config)
    }
}

/// One run per experiment: a lock on `<train_dir>/.<name>.lock`, beside the folder (so that it guards the name
/// through a restart's rename and an overwrite's delete, and a refused run changes nothing inside the folder), held
/// for as long as this value lives. It is a POSIX record lock (`fcntl`), which belongs to the process that took it:
/// the worker processes it forks do not hold it, and the kernel releases it when that process ends, however it
/// ends, so that a killed run never blocks the next. The file holds the holder's PID.
#[derive(Debug)]
pub struct ExperimentLock {
    _file: File,
}

impl ExperimentLock {
    /// Takes the lock of experiment `name` in `train_dir` (creating `train_dir` if need be), or fails at once with
    /// [`Error::Locked`] naming the process that holds it.
    pub fn acquire(train_dir: impl AsRef<Path>, name: &str) -> Result<Self> {
        check_name(name)?;
        let train_dir = train_dir.as_ref();
        fs::create_dir_all(train_dir).map_err(io(train_dir))?;
        let path = train_dir.join(format!(".{name}.lock"));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path))?;
        match rustix::fs::fcntl_lock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::ACCESS => {
                let holder = fs::read_to_string(&path)
                    .ok()
                    .and_then(|text| text.trim().parse().ok());
                return Err(Error::Locked {
                    dir: train_dir.join(name),
                    lock: path,
                    holder,
                });
            }
            Err(e) => return Err(io(&path)(e.into())),
        }
        file.set_len(0).map_err(io(&path))?;
        writeln!(file, "{}", std::process::id()).map_err(io(&path))?;
        Ok(Self { _file: file })
    }
}

/// The bytes an unprivileged process may still write on the file system that holds `path` (or, if `path` does not
/// exist yet, its nearest existing ancestor).
pub fn free_bytes(path: impl AsRef<Path>) -> Result<u64> {
    let path = path.as_ref();
    let existing = path
        .ancestors()
        .find(|p| !p.as_os_str().is_empty() && p.exists())
        .unwrap_or(Path::new("."));
    let stat = rustix::fs::statvfs(existing).map_err(|e| io(existing)(e.into()))?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Checks that `name` can be an experiment's folder in the train dir: not empty, not `.` or `..`, no `/` or NUL.
pub fn check_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name == "." || name == ".." {
        Some("not a folder name")
    } else if name.contains('/') || name.contains('\0') {
        Some("contains `/` or NUL")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidName {
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Checkpoint, CheckpointMeta};
    use serde_json::json;

    fn save_one(exp: &Experiment) {
        let mut store = exp.checkpoint_store(0, CheckpointConfig::default()).unwrap();
        let ckpt = Checkpoint {
            meta: CheckpointMeta {
                train_step: 1,
                env_steps: 10,
                ..Default::default()
            },
            ..Default::default()
        };
        store.save(&ckpt).unwrap();
    }

    #[test]
    fn fresh_folder_has_config_log_and_subdirs() {
        let train = tempfile::tempdir().unwrap();
        let exp = Experiment::prepare(
            train.path(),
            "cartpole",
            RestartBehavior::Resume,
            &json!({"lr": 1e-3}),
        )
        .unwrap();
        assert_eq!(exp.dir(), train.path().join("cartpole"));
        assert!(exp.previous_config().is_none() && exp.moved_to().is_none());
        let saved: serde_json::Value = serde_json::from_slice(&fs::read(exp.config_path()).unwrap()).unwrap();
        assert_eq!(saved, json!({"lr": 1e-3}));
        exp.log("started").unwrap();
        writeln!(exp.log_file().unwrap(), "from tracing").unwrap();
        assert_eq!(
            fs::read_to_string(exp.log_path()).unwrap(),
            "started\nfrom tracing\n"
        );
        let w = exp.summary_writer(0).unwrap();
        assert!(w.path().starts_with(train.path().join("cartpole/.summary/0")));
        assert_eq!(exp.checkpoint_dir(1), train.path().join("cartpole/checkpoint_p1"));
    }

    #[test]
    fn resume_keeps_files_and_returns_previous_config() {
        let train = tempfile::tempdir().unwrap();
        let exp = Experiment::prepare(train.path(), "e", RestartBehavior::Resume, &json!({"lr": 1})).unwrap();
        exp.log("first run").unwrap();
        save_one(&exp);
        drop(exp);
        let exp = Experiment::prepare(train.path(), "e", RestartBehavior::Resume, &json!({"lr": 2})).unwrap();
        assert_eq!(exp.previous_config(), Some(&json!({"lr": 1})));
        exp.log("second run").unwrap();
        assert_eq!(
            fs::read_to_string(exp.log_path()).unwrap(),
            "first run\nsecond run\n"
        );
        let store = exp.checkpoint_store(0, CheckpointConfig::default()).unwrap();
        assert!(store.load_latest().unwrap().is_some());
    }

    #[test]
    fn restart_moves_the_old_folder_aside() {
        let train = tempfile::tempdir().unwrap();
        for _ in 0..2 {
            let exp = Experiment::prepare(train.path(), "e", RestartBehavior::Resume, &json!(1)).unwrap();
            save_one(&exp);
            drop(exp);
            let exp = Experiment::prepare(train.path(), "e", RestartBehavior::Restart, &json!(2)).unwrap();
            assert!(exp.previous_config().is_none());
            let store = exp.checkpoint_store(0, CheckpointConfig::default()).unwrap();
            assert!(store.load_latest().unwrap().is_none());
        }
        for old in ["e_old0001", "e_old0002"] {
            let dir = train.path().join(old);
            assert!(
                dir.join("checkpoint_p0/checkpoint_000000001_10.json").is_file(),
                "{old}"
            );
        }
    }

    #[test]
    fn overwrite_deletes_the_old_folder() {
        let train = tempfile::tempdir().unwrap();
        let exp = Experiment::prepare(train.path(), "e", RestartBehavior::Resume, &json!(1)).unwrap();
        save_one(&exp);
        exp.log("old").unwrap();
        drop(exp);
        let exp = Experiment::prepare(train.path(), "e", RestartBehavior::Overwrite, &json!(2)).unwrap();
        assert!(exp.previous_config().is_none());
        assert!(!exp.checkpoint_dir(0).exists());
        assert_eq!(fs::read_to_string(exp.log_path()).unwrap(), "");
        assert_eq!(fs::read_dir(train.path()).unwrap().count(), 1);
    }

    /// A folder still to be made is measured on its nearest existing ancestor's file system.
    #[test]
    fn free_bytes_of_a_folder_to_be_made_are_its_parents() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0);
        let later = free_bytes(dir.path().join("not/yet/made")).unwrap();
        // The same file system, measured twice while other processes write: within 1 GiB.
        assert!(later.abs_diff(free) < 1 << 30, "{free} vs {later}");
    }

    #[test]
    fn bad_names_and_behaviors_are_clear_errors() {
        let train = tempfile::tempdir().unwrap();
        for name in ["", "..", "a/b"] {
            let err =
                Experiment::prepare(train.path(), name, RestartBehavior::Resume, &json!(1)).unwrap_err();
            assert!(err.to_string().starts_with("invalid experiment name"), "{err}");
        }
        assert_eq!("restart".parse(), Ok(RestartBehavior::Restart));
        assert_eq!(RestartBehavior::Overwrite.to_string(), "overwrite");
        assert!("Resume"
            .parse::<RestartBehavior>()
            .unwrap_err()
            .contains("expected resume"));
    }

    #[test]
    fn corrupt_previous_config_names_the_file() {
        let train = tempfile::tempdir().unwrap();
        fs::create_dir_all(train.path().join("e")).unwrap();
        fs::write(train.path().join("e/config.json"), b"{oops").unwrap();
        let err = Experiment::prepare(train.path(), "e", RestartBehavior::Resume, &json!(1)).unwrap_err();
        assert!(err.to_string().contains("e/config.json: invalid JSON"), "{err}");
    }
}
