//! The experiment side of a training run, over `rlf_experiment`: the folder `<train_dir>/<experiment>/`
//! (resolved `config.json`, `log.txt`) and, for each policy `i`, TensorBoard scalars under
//! `.summary/<i>/`, checkpoints under `checkpoint_p<i>/` and the learning curve
//! `learning_curve_p<i>.png`; with several policies also `learning_curve.png`, one line per policy.
//!
//! - [`ExperimentRun`] belongs to the runner: it logs, writes the scalars of each progress report
//!   (Sample Factory's names: `perf/_fps`, `reward/reward`, `len/len`, `train/...`) with the env
//!   frame count as the step, and redraws the learning curve.
//! - [`Checkpointer`] belongs to the learner: on each `checkpoint_requested` (every
//!   `--save_every_sec`, and once when the run stops) it saves the weights and normaliser statistics
//!   as named tensors, with a JSON sidecar holding the env frames, the policy version, the mean
//!   return (the metric of the best checkpoint) and the learner's [`TrainingState`].
//!
//! What a resumed run continues: the env frame count and the episode count, the weights and the
//! normalisers, Adam's moments and step count (the policy version), and the learning-rate schedule
//! (its rate and its position in frames); an off-policy run's replay buffers (with `--save_replay_buffer`, saved
//! after each checkpoint into `checkpoint_p<i>/replay_buffer/`, the newest only) with their priorities and their
//! insert and sample counters, so that the schedules over inserts go on. A checkpoint without the moments (saved from the
//! published weights after the learner's process was lost) restarts Adam at zero, and says so.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rlf_experiment::{
    Checkpoint, CheckpointConfig, CheckpointMeta, CheckpointStore, Experiment, Loaded, SummaryWriter, Tensor,
};
use serde::{Deserialize, Serialize};

use crate::algo::TrainingState;
use crate::config::{CheckpointKind, Config, RestartBehaviorArg};
use crate::error::{Result, RlfError};
use crate::learning::{Learner, OffPolicyLearner, PolicyUpdated, ReplaySnapshot, SavedPriorities};
use crate::model::NamedTensor;
use crate::pbt::PolicyState;

/// The TensorBoard tag of the learning curve.
const REWARD_TAG: &str = "reward/reward";

/// Where and why the learners are asked to save (`checkpoint_requested`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// Env frames simulated so far.
    pub env_steps: u64,
    /// Episodes finished so far.
    pub episodes: u64,
    /// Each policy's best-checkpoint metric (`--save_best_metric` over its last `--stats_avg`
    /// episodes), by policy index.
    pub best_metrics: Vec<Option<f64>>,
}

impl CheckpointRequest {
    /// The best-checkpoint metric of `policy`.
    pub fn best_metric(&self, policy: usize) -> Option<f64> {
        self.best_metrics.get(policy).copied().flatten()
    }
}

/// The checkpoint folder of `policy` in the experiment folder `dir`.
pub fn checkpoint_dir(dir: &Path, policy: usize) -> PathBuf {
    dir.join(format!("checkpoint_p{policy}"))
}

/// The sidecar's extra state: what [`CheckpointMeta`] has no field for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ExtraState {
    episodes: u64,
    training: TrainingState,
    /// Always false (see the module doc); written so a reader of the sidecar need not guess.
    adam_moments_saved: bool,
    /// The policy's self-play pool (`--self_play`); each snapshot's values are the tensor [`pool_tensor`]`(slot)`.
    #[serde(default)]
    self_play_pool: Vec<PoolSnapshot>,
}

/// A self-play snapshot in a policy's pool, as a checkpoint keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSnapshot {
    /// Its slot in the pool.
    pub slot: usize,
    /// Its number (the run's n-th snapshot).
    pub number: u64,
    /// The policy version it holds.
    pub version: u64,
}

/// The name of the tensor that holds the values of the snapshot in pool slot `slot`.
fn pool_tensor(slot: usize) -> String {
    format!("self_play_pool/{slot}")
}

/// What a learner resumes with besides its own state: the counts its checkpoint was saved with and the snapshots of
/// its self-play pool, with their values (none for a fresh run).
#[derive(Debug, Clone, Default)]
pub struct Resumed {
    /// The runner's counts when the checkpoint was saved.
    pub progress: CheckpointRequest,
    /// The pool's snapshots.
    pub pool: Vec<(PoolSnapshot, Vec<f32>)>,
}

/// A checkpoint read back: the model's tensors and where to continue from.
#[derive(Debug, Clone)]
pub struct RestoredState {
    /// The checkpoint's sidecar.
    pub path: PathBuf,
    /// Env frames when it was saved.
    pub env_steps: u64,
    /// Episodes finished when it was saved.
    pub episodes: u64,
    /// The learner's state.
    pub training: TrainingState,
    /// Weights and normaliser statistics by name.
    pub tensors: Vec<NamedTensor>,
    /// The self-play pool's snapshots and their values.
    pub pool: Vec<(PoolSnapshot, Vec<f32>)>,
    /// Newer checkpoints passed over because they were incomplete or corrupt, with the reason.
    pub skipped: Vec<String>,
}

/// Opens the checkpoint store of policy `policy` of the experiment folder for reading (enjoy,
/// eval, export), changing nothing there: a running experiment's saves go on.
pub fn open_store(train_dir: &Path, experiment: &str, policy: usize) -> Result<CheckpointStore> {
    let dir = checkpoint_dir(&train_dir.join(experiment), policy);
    if !dir.is_dir() {
        return Err(RlfError::Config(format!(
            "--experiment {experiment} --policy_index {policy}: no checkpoints in {}",
            dir.display()
        )));
    }
    Ok(CheckpointStore::open_read_only(dir)?)
}

/// The newest intact checkpoint of policy `policy` that a run of `cfg` resumes from, read without
/// changing the folder; `None` for a fresh run.
pub fn resume_state(cfg: &Config, policy: usize) -> Result<Option<RestoredState>> {
    let dir = checkpoint_dir(&cfg.run.train_dir.join(&cfg.run.experiment), policy);
    if !dir.is_dir() {
        return Ok(None);
    }
    load(&CheckpointStore::open_read_only(dir)?, CheckpointKind::Latest)
}

/// A policy's replay buffer as its checkpoints saved it ([`Checkpointer::save_replay`]).
#[derive(Debug)]
pub struct SavedReplay {
    /// The rows, counters and priorities.
    pub snapshot: ReplaySnapshot,
    /// The policy version of the checkpoint it was saved after.
    pub version: u64,
    /// Its sidecar.
    pub path: PathBuf,
}

/// A saved replay buffer's sidecar state.
#[derive(Debug, Serialize, Deserialize)]
struct ReplayExtra {
    first: u64,
    sampled: u64,
    row_words: usize,
    /// Prioritised replay: the inserts its priorities had caught up with, and the largest.
    priorities: Option<(u64, f64)>,
}

const REPLAY_ROWS: &str = "rows";
const REPLAY_PRIORITIES: &str = "priorities";

/// The newest intact replay buffer saved for policy `policy` of a run of `cfg`, read without changing the folder;
/// `None` when there is none. An error names the files that could not be read.
pub fn load_replay(cfg: &Config, policy: usize) -> Result<Option<SavedReplay>> {
    let dir = checkpoint_dir(&cfg.run.train_dir.join(&cfg.run.experiment), policy);
    if !dir.is_dir() {
        return Ok(None);
    }
    let Some(loaded) = CheckpointStore::open_read_only(&dir)?.load_replay()? else {
        return Ok(None);
    };
    let broken = |reason: &str| RlfError::Checkpoint {
        path: loaded.path.clone(),
        reason: format!("replay buffer {reason}"),
    };
    let ckpt = &loaded.checkpoint;
    let extra: ReplayExtra = serde_json::from_value(ckpt.meta.extra.clone())
        .map_err(|e| broken(&format!("has a bad sidecar: {e}")))?;
    let rows = ckpt
        .tensors
        .get(REPLAY_ROWS)
        .and_then(Tensor::as_f32)
        .ok_or_else(|| broken("holds no rows"))?;
    if extra.row_words == 0 || rows.len() % extra.row_words != 0 {
        return Err(broken("holds rows of another size than its sidecar says"));
    }
    let priorities = match extra.priorities {
        Some((seen, max)) => {
            let values = ckpt
                .tensors
                .get(REPLAY_PRIORITIES)
                .and_then(Tensor::as_f64)
                .filter(|v| v.len() * extra.row_words == rows.len())
                .ok_or_else(|| broken("holds no priority for each row"))?;
            Some(SavedPriorities {
                values: values.to_vec(),
                seen,
                max,
            })
        }
        None => None,
    };
    Ok(Some(SavedReplay {
        snapshot: ReplaySnapshot {
            first: extra.first,
            rows: rows.to_vec(),
            row_words: extra.row_words,
            sampled: extra.sampled,
            priorities,
        },
        version: ckpt.meta.policy_version,
        path: loaded.path.clone(),
    }))
}

/// The counts a resumed run of `cfg` continues from, or `None` for a fresh run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// Env frames of policy 0's checkpoint (every policy's checkpoint counts the run's frames).
    pub env_frames: u64,
    /// Episodes of policy 0's checkpoint.
    pub episodes: u64,
    /// Each policy's version (0 for a policy with no checkpoint).
    pub versions: Vec<u64>,
    /// Each policy's checkpoint (its sidecar's file name; empty for a policy with none).
    pub checkpoints: Vec<String>,
}

/// The file name of a checkpoint's sidecar.
fn checkpoint_name(state: &RestoredState) -> String {
    state
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The [`ResumePoint`] of a run of `cfg`: policy 0's checkpoint's counts and every policy's version.
pub fn resume_counts(cfg: &Config) -> Result<Option<ResumePoint>> {
    let Some(first) = resume_state(cfg, 0)? else {
        return Ok(None);
    };
    let mut versions = vec![first.training.version];
    let mut checkpoints = vec![checkpoint_name(&first)];
    for policy in 1..cfg.sampling.num_policies {
        let state = resume_state(cfg, policy)?;
        versions.push(state.as_ref().map_or(0, |s| s.training.version));
        checkpoints.push(state.as_ref().map(checkpoint_name).unwrap_or_default());
    }
    Ok(Some(ResumePoint {
        env_frames: first.env_steps,
        episodes: first.episodes,
        versions,
        checkpoints,
    }))
}

/// The file in an experiment folder that holds what a serial run kept at its stop ([`rlf_signal::KeptState`]),
/// with the checkpoints it continues.
pub const KEPT_STATE_FILE: &str = "kept_state.bin";

#[derive(Serialize, Deserialize)]
struct KeptRun {
    /// Each policy's checkpoint that the state continues ([`ResumePoint::checkpoints`]).
    checkpoints: Vec<String>,
    /// The flags of what the run computes ([`computation`]), as JSON: a run with others does not continue it.
    computation: String,
    state: rlf_signal::KeptState,
}

/// The flags that decide what a run computes (env, sampling, model, algorithms, optimiser) by name, unlike its
/// budget, its checkpoints' schedule or its reporting, which a resumed run may change.
fn computation(cfg: &Config) -> serde_json::Map<String, serde_json::Value> {
    let sections = [
        serde_json::to_value(&cfg.env),
        serde_json::to_value(&cfg.sampling),
        serde_json::to_value(&cfg.model),
        serde_json::to_value(&cfg.appo),
        serde_json::to_value(&cfg.optimizer),
        serde_json::to_value(&cfg.off_policy),
    ];
    let mut flags = serde_json::Map::new();
    for section in sections.into_iter().flatten() {
        if let serde_json::Value::Object(fields) = section {
            flags.extend(fields);
        }
    }
    flags
}

/// Writes `state`, which a serial run of `cfg` kept at its stop, beside the checkpoints its learners saved then,
/// atomically.
pub fn write_kept_state(cfg: &Config, state: rlf_signal::KeptState) -> Result<()> {
    let checkpoints = resume_counts(cfg)?.map(|p| p.checkpoints).unwrap_or_default();
    let computation = serde_json::Value::Object(computation(cfg)).to_string();
    let bytes = postcard::to_stdvec(&KeptRun {
        checkpoints,
        computation,
        state,
    })
    .map_err(|e| RlfError::Config(format!("the kept state does not encode: {e}")))?;
    let path = cfg.run.train_dir.join(&cfg.run.experiment).join(KEPT_STATE_FILE);
    Ok(rlf_experiment::write_atomically(&path, &bytes)?)
}

/// Reads the kept state in the experiment folder of `cfg` as a run starts there: the state if it continues the
/// checkpoints `point` resumes from, and a line for the log; `(None, None)` when there is none. The file stays: a
/// start that fails leaves it for the next, which checks it against the checkpoints again; a run that has run
/// removes it ([`remove_kept_state`]).
pub fn read_kept_state(
    cfg: &Config,
    point: Option<&ResumePoint>,
) -> Result<(Option<rlf_signal::KeptState>, Option<String>)> {
    let path = cfg.run.train_dir.join(&cfg.run.experiment).join(KEPT_STATE_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((None, None)),
        Err(source) => {
            return Err(RlfError::Io {
                what: "reading",
                path,
                source,
            })
        }
    };
    let line = |why: &str| {
        Some(format!(
            "{KEPT_STATE_FILE}: not used ({why}): the envs start new episodes"
        ))
    };
    let kept = match postcard::from_bytes::<KeptRun>(&bytes) {
        Ok(kept) => kept,
        Err(e) => return Ok((None, line(&format!("it does not decode: {e}")))),
    };
    if point.map(|p| &p.checkpoints) != Some(&kept.checkpoints) {
        return Ok((
            None,
            line("it was kept with other checkpoints than those this run resumes from"),
        ));
    }
    let then: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&kept.computation).unwrap_or_default();
    let now = computation(cfg);
    if let Some(flag) = now
        .keys()
        .chain(then.keys())
        .find(|k| now.get(*k) != then.get(*k))
    {
        return Ok((None, line(&format!("--{flag} differs from the stopped run's"))));
    }
    let messages = kept.state.undelivered();
    let line = format!(
        "resumes exactly where the run stopped: every component's state and {messages} undelivered messages from \
         {KEPT_STATE_FILE}"
    );
    Ok((Some(kept.state), Some(line)))
}

/// Removes the kept state from the experiment folder of `cfg` once a run has run there: its checkpoints moved on
/// (a stop by a signal writes a new one after this).
pub fn remove_kept_state(cfg: &Config) -> Result<()> {
    let path = cfg.run.train_dir.join(&cfg.run.experiment).join(KEPT_STATE_FILE);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(RlfError::Io {
            what: "removing",
            path,
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Loads the newest intact checkpoint of `kind` from `store`, falling back to the other kind
/// (latest → best, best → latest) when there is none of `kind` or every one is broken; the
/// broken ones are listed in [`RestoredState::skipped`]. `None`: there is no checkpoint at all.
pub fn load(store: &CheckpointStore, kind: CheckpointKind) -> Result<Option<RestoredState>> {
    let load_kind = |kind: CheckpointKind| match kind {
        CheckpointKind::Latest => store.load_latest(),
        CheckpointKind::Best => store.load_best(),
    };
    let other = match kind {
        CheckpointKind::Latest => CheckpointKind::Best,
        CheckpointKind::Best => CheckpointKind::Latest,
    };
    match load_kind(kind) {
        Ok(Some(loaded)) => restored(loaded).map(Some),
        Ok(None) => load_kind(other)?.map(restored).transpose(),
        Err(broken) => match load_kind(other) {
            Ok(Some(loaded)) => {
                let mut state = restored(loaded)?;
                state.skipped.insert(0, broken.to_string());
                Ok(Some(state))
            }
            _ => Err(broken.into()),
        },
    }
}

/// Loads the checkpoint whose sidecar (or weights) is `path`.
pub fn load_path(path: &Path) -> Result<RestoredState> {
    let checkpoint = rlf_experiment::load_checkpoint(path)?;
    restored(Loaded {
        checkpoint,
        path: path.to_owned(),
        skipped: Vec::new(),
    })
}

/// The file holding policy `policy`'s PBT state in an experiment folder.
pub fn policy_state_file(policy: usize) -> String {
    format!("policy_{policy}_cfg.json")
}

/// The file holding policy `policy`'s self-play record (ratings and games) in an experiment folder.
pub fn self_play_file(policy: usize) -> String {
    format!("self_play_{policy}.json")
}

/// The JSON file `name` of the experiment folder `dir` as a `T` (`what` it is, for the error), if there is one.
pub fn read_json<T: serde::de::DeserializeOwned>(dir: &Path, name: &str, what: &str) -> Result<Option<T>> {
    let path = dir.join(name);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(RlfError::Io {
                what: "reading",
                path,
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| RlfError::Config(format!("{}: not {what}: {e}", path.display())))
}

/// Policy `policy`'s PBT state saved in the experiment folder `dir`, if there is one.
pub fn read_policy_state(dir: &Path, policy: usize) -> Result<Option<PolicyState>> {
    let Some(state) = read_json::<PolicyState>(dir, &policy_state_file(policy), "a PBT policy state")? else {
        return Ok(None);
    };
    if state.policy != policy {
        let path = dir.join(policy_state_file(policy));
        return Err(RlfError::Config(format!(
            "{}: the state of policy {}, not {policy}",
            path.display(),
            state.policy
        )));
    }
    Ok(Some(state))
}

fn restored(loaded: Loaded) -> Result<RestoredState> {
    let Loaded {
        checkpoint,
        path,
        skipped,
    } = loaded;
    let bad = |reason: String| RlfError::Checkpoint {
        path: path.clone(),
        reason,
    };
    let extra: ExtraState = serde_json::from_value(checkpoint.meta.extra.clone())
        .map_err(|e| bad(format!("the sidecar's `extra` is not rlfactory's state: {e}")))?;
    let tensors = checkpoint
        .tensors
        .into_iter()
        .map(|(name, t)| {
            let values = t
                .as_f32()
                .ok_or_else(|| bad(format!("tensor `{name}` is not f32")))?
                .to_vec();
            Ok(NamedTensor {
                name,
                shape: t.shape,
                values,
            })
        })
        .collect::<Result<Vec<NamedTensor>>>()?;
    let pool = extra
        .self_play_pool
        .iter()
        .map(|&snapshot| {
            let name = pool_tensor(snapshot.slot);
            tensors
                .iter()
                .find(|t| t.name == name)
                .map(|t| (snapshot, t.values.clone()))
                .ok_or_else(|| {
                    bad(format!(
                        "the pool's snapshot {} has no tensor `{name}`",
                        snapshot.number
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RestoredState {
        env_steps: checkpoint.meta.env_steps,
        episodes: extra.episodes,
        training: extra.training,
        tensors,
        pool,
        skipped: skipped.iter().map(ToString::to_string).collect(),
        path,
    })
}

/// The runner's side: the folder, the log, each policy's TensorBoard writer and learning curve.
#[derive(Debug)]
pub struct ExperimentRun {
    exp: Experiment,
    /// By policy index.
    summaries: Vec<SummaryWriter>,
    curves: Vec<Vec<(u64, f64)>>,
    title: String,
    /// The W&B run of `--with_wandb`.
    #[cfg(feature = "python")]
    wandb: Option<crate::wandb::WandbRun>,
}

impl ExperimentRun {
    /// Prepares the folder as `--restart_behavior` says, saving the resolved config; the learning
    /// curve continues the `reward/reward` points of earlier event files.
    pub fn prepare(cfg: &Config) -> Result<Self> {
        let config = serde_json::to_value(cfg)
            .map_err(|e| RlfError::Config(format!("cannot serialise the config: {e}")))?;
        let behavior = match cfg.checkpoint.restart_behavior {
            RestartBehaviorArg::Resume => rlf_experiment::RestartBehavior::Resume,
            RestartBehaviorArg::Restart => rlf_experiment::RestartBehavior::Restart,
            RestartBehaviorArg::Overwrite => rlf_experiment::RestartBehavior::Overwrite,
        };
        let exp = Experiment::prepare(&cfg.run.train_dir, &cfg.run.experiment, behavior, &config)?;
        let (mut summaries, mut curves) = (Vec::new(), Vec::new());
        for policy in 0..cfg.sampling.num_policies {
            let mut curve = earlier_curve(&exp.summary_dir(policy))?;
            curve.sort_by_key(|p| p.0);
            curves.push(curve);
            summaries.push(exp.summary_writer(policy)?);
        }
        #[cfg(feature = "python")]
        let wandb = match cfg.wandb.with_wandb {
            true => Some(crate::wandb::WandbRun::start(cfg, exp.dir())?),
            false => None,
        };
        let run = Self {
            exp,
            summaries,
            curves,
            title: cfg.env.env.clone(),
            #[cfg(feature = "python")]
            wandb,
        };
        if let Some(old) = run.exp.moved_to() {
            run.log(&format!(
                "moved the previous experiment folder to {}",
                old.display()
            ))?;
        }
        run.log(&format!(
            "starting in {} (--restart_behavior={})",
            run.exp.dir().display(),
            behavior.as_str()
        ))?;
        Ok(run)
    }

    /// Writes `line` to the log file and to stderr.
    pub fn log(&self, line: &str) -> Result<()> {
        console(line);
        Ok(self.exp.log(line)?)
    }

    /// Writes `line` to the log file only (what the terminal shows with `--verbose`).
    pub fn note(&self, line: &str) -> Result<()> {
        Ok(self.exp.log(line)?)
    }

    /// Records scalars of policy `policy` at step `env_steps` (buffered until
    /// [`flush`](Self::flush)) and adds a mean return to its learning curve.
    pub fn write_scalars(&mut self, policy: usize, env_steps: u64, scalars: &[(String, f64)]) -> Result<()> {
        let step = i64::try_from(env_steps).unwrap_or(i64::MAX);
        let (Some(summary), Some(curve)) = (self.summaries.get_mut(policy), self.curves.get_mut(policy))
        else {
            return Err(RlfError::Config(format!(
                "scalars of policy {policy}, which the run does not have"
            )));
        };
        for (tag, value) in scalars {
            summary.add_scalar(tag, *value as f32, step)?;
            if tag == REWARD_TAG {
                curve.push((env_steps, *value));
            }
        }
        #[cfg(feature = "python")]
        if let Some(wandb) = &self.wandb {
            wandb.log(policy, env_steps, scalars)?;
        }
        Ok(())
    }

    /// Ends the W&B run (`--with_wandb`) with the learning curves drawn by [`plot`](Self::plot).
    pub fn close(&mut self) -> Result<()> {
        #[cfg(feature = "python")]
        if let Some(wandb) = self.wandb.take() {
            let mut images: Vec<(String, String)> = (0..self.curves.len())
                .map(|p| {
                    let key = if self.curves.len() > 1 {
                        format!("learning_curve_p{p}")
                    } else {
                        "learning_curve".to_owned()
                    };
                    (key, self.exp.plot_path(p).to_string_lossy().into_owned())
                })
                .collect();
            if self.curves.len() > 1 {
                let all = self.exp.dir().join("learning_curve.png");
                images.push(("learning_curve".to_owned(), all.to_string_lossy().into_owned()));
            }
            if let Some(note) = wandb.finish(&images)? {
                self.log(&note)?;
            }
        }
        Ok(())
    }

    /// Writes the buffered scalars to the event files.
    pub fn flush(&mut self) -> Result<()> {
        self.summaries.iter_mut().try_for_each(|s| Ok(s.flush()?))
    }

    /// The experiment folder.
    pub fn dir(&self) -> &Path {
        self.exp.dir()
    }

    /// Writes `value` to the folder's file `name` as JSON, atomically (`what` it is, for the error).
    pub fn write_json<T: Serialize>(&self, name: &str, value: &T, what: &str) -> Result<()> {
        let text = serde_json::to_vec_pretty(value)
            .map_err(|e| RlfError::Config(format!("cannot serialise {what}: {e}")))?;
        self.exp.write_file(name, &text)?;
        Ok(())
    }

    /// Writes policy `state.policy`'s PBT state to `policy_<i>_cfg.json`, atomically.
    pub fn write_policy_state(&self, state: &PolicyState) -> Result<()> {
        self.write_json(&policy_state_file(state.policy), state, "the PBT state")
    }

    /// Redraws each policy's learning curve PNG and, with several policies, the one with a
    /// line per policy.
    pub fn plot(&self) -> Result<()> {
        for (policy, curve) in self.curves.iter().enumerate() {
            rlf_experiment::plot_curve(self.exp.plot_path(policy), curve, &self.title)?;
        }
        if self.curves.len() > 1 {
            let labels: Vec<String> = (0..self.curves.len()).map(|p| format!("policy {p}")).collect();
            let curves: Vec<(&str, &[(u64, f64)])> = labels
                .iter()
                .zip(&self.curves)
                .map(|(label, curve)| (label.as_str(), curve.as_slice()))
                .collect();
            rlf_experiment::plot_curves(self.exp.dir().join("learning_curve.png"), &curves, &self.title)?;
        }
        Ok(())
    }
}

/// The `reward/reward` points of the event files already in `dir` (from earlier starts).
fn earlier_curve(dir: &Path) -> Result<Vec<(u64, f64)>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut curve = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        for (tag, step, value) in rlf_experiment::read_scalars(&path)? {
            if tag == REWARD_TAG {
                curve.push((u64::try_from(step).unwrap_or(0), f64::from(value)));
            }
        }
    }
    Ok(curve)
}

/// A learner a checkpoint can continue: its state restored, then its weights published.
pub trait Resumable {
    /// Continues from a checkpoint's tensors and training state; returns whether Adam's moments were in it.
    fn restore(&mut self, tensors: &[NamedTensor], state: TrainingState) -> Result<bool>;

    /// Publishes the current weights to the inference workers.
    fn publish(&self) -> Result<PolicyUpdated>;
}

impl Resumable for Learner {
    fn restore(&mut self, tensors: &[NamedTensor], state: TrainingState) -> Result<bool> {
        Learner::restore(self, tensors, state)
    }

    fn publish(&self) -> Result<PolicyUpdated> {
        Learner::publish(self)
    }
}

impl Resumable for OffPolicyLearner {
    fn restore(&mut self, tensors: &[NamedTensor], state: TrainingState) -> Result<bool> {
        OffPolicyLearner::restore(self, tensors, state)
    }

    fn publish(&self) -> Result<PolicyUpdated> {
        OffPolicyLearner::publish(self)
    }
}

/// The learner's side: saves checkpoints (keep N, best by mean return, milestones) and logs them.
#[derive(Debug)]
pub struct Checkpointer {
    store: CheckpointStore,
    log: std::fs::File,
    log_path: PathBuf,
    save_best_after: u64,
    policy: usize,
}

impl Checkpointer {
    /// The checkpoint store of policy `policy` in the experiment folder
    /// [`ExperimentRun::prepare`] made, opened in the learner's process, logging to the folder's
    /// log file.
    pub fn open(cfg: &Config, policy: usize) -> Result<Self> {
        let c = &cfg.checkpoint;
        let dir = cfg.run.train_dir.join(&cfg.run.experiment);
        let store = CheckpointStore::open(
            checkpoint_dir(&dir, policy),
            CheckpointConfig {
                keep_checkpoints: c.keep_checkpoints,
                milestone_every_env_steps: (c.save_milestones_env_steps > 0)
                    .then_some(c.save_milestones_env_steps),
            },
        )?;
        let log_path = dir.join("log.txt");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| RlfError::Io {
                what: "opening the log",
                path: log_path.clone(),
                source,
            })?;
        Ok(Self {
            store,
            log,
            log_path,
            save_best_after: c.save_best_after,
            policy,
        })
    }

    /// Opens the store (see [`open`](Self::open)) and, if it holds a checkpoint, continues
    /// `learner` from the newest intact one and publishes its weights; returns the counts the
    /// checkpoint was saved with (zero for a fresh run).
    pub fn open_and_resume(
        cfg: &Config,
        policy: usize,
        learner: &mut impl Resumable,
    ) -> Result<(Self, Resumed)> {
        let mut checkpointer = Self::open(cfg, policy)?;
        let mut resumed = Resumed::default();
        if let Some(state) = checkpointer.load_latest()? {
            if !learner.restore(&state.tensors, state.training)? {
                checkpointer.log(
                    "the checkpoint holds only the policy's weights: Adam's moments (and SAC's critics) restart afresh",
                )?;
            }
            learner.publish()?;
            resumed.progress.env_steps = state.env_steps;
            resumed.progress.episodes = state.episodes;
            resumed.pool = state.pool;
        }
        Ok((checkpointer, resumed))
    }

    /// Loads the newest intact regular checkpoint to resume from, logging any skipped one and
    /// where it resumes from.
    fn load_latest(&mut self) -> Result<Option<RestoredState>> {
        let state = load(&self.store, CheckpointKind::Latest)?;
        if let Some(s) = &state {
            for skipped in &s.skipped {
                self.log(&format!("skipped a broken checkpoint: {skipped}"))?;
            }
            self.log(&format!(
                "resuming from {} (env frames {}, policy version {}, lr {:e})",
                s.path.display(),
                s.env_steps,
                s.training.version,
                s.training.lr
            ))?;
        }
        Ok(state)
    }

    /// Saves the learner's state (see [`Learner::state`]) as `request` describes it; also as the
    /// best checkpoint when its mean return beats the best so far (after `--save_best_after` frames).
    /// With `pool`, the policy's self-play snapshots and their values are saved too.
    pub fn save(
        &mut self,
        state: (Vec<NamedTensor>, TrainingState),
        request: &CheckpointRequest,
        pool: &[(PoolSnapshot, Vec<f32>)],
    ) -> Result<PathBuf> {
        let started = Instant::now();
        let ckpt = self.checkpoint(state, request, pool)?;
        let path = self.store.save(&ckpt)?;
        let best = request.env_steps >= self.save_best_after && self.store.save_if_best(&ckpt)?;
        let best_note = if best { " (new best)" } else { "" };
        self.log(&format!(
            "saved {}{best_note} in {:.0} ms",
            path.display(),
            started.elapsed().as_secs_f64() * 1e3
        ))?;
        Ok(path)
    }

    /// Saves the learner's state for population-based training to hand to policy `to`'s learner: in
    /// `pbt_for_p<to>/` of this policy's checkpoints, which this policy's regular saves never rotate
    /// away while the other learner is still to load it.
    pub fn save_for_policy(
        &mut self,
        to: usize,
        state: (Vec<NamedTensor>, TrainingState),
        request: &CheckpointRequest,
        pool: &[(PoolSnapshot, Vec<f32>)],
    ) -> Result<PathBuf> {
        let ckpt = self.checkpoint(state, request, pool)?;
        let path = self.store.save_aside(&format!("pbt_for_p{to}"), &ckpt)?;
        self.log(&format!("saved {} for policy {to}", path.display()))?;
        Ok(path)
    }

    /// Saves the replay buffer `replay` after the checkpoint of policy version `version` at `env_steps` frames
    /// (see [`CheckpointStore::save_replay`]). Returns the sidecar's path.
    pub fn save_replay(&mut self, replay: ReplaySnapshot, version: u64, env_steps: u64) -> Result<PathBuf> {
        let started = Instant::now();
        let n = replay.len();
        let extra = ReplayExtra {
            first: replay.first,
            sampled: replay.sampled,
            row_words: replay.row_words,
            priorities: replay.priorities.as_ref().map(|p| (p.seen, p.max)),
        };
        let mut ckpt = Checkpoint {
            meta: CheckpointMeta {
                train_step: version,
                env_steps,
                policy_version: version,
                metric: None,
                extra: serde_json::to_value(extra).map_err(|e| {
                    RlfError::Config(format!("cannot serialise the replay buffer's state: {e}"))
                })?,
            },
            ..Default::default()
        };
        let bytes = 4 * replay.rows.len();
        ckpt.tensors.insert(
            REPLAY_ROWS.into(),
            Tensor::f32(&[n, replay.row_words], replay.rows),
        );
        if let Some(p) = replay.priorities {
            ckpt.tensors
                .insert(REPLAY_PRIORITIES.into(), Tensor::f64(&[n], p.values));
        }
        let path = self.store.save_replay(&ckpt)?;
        self.log(&format!(
            "saved the replay buffer {} ({n} transitions, {:.1} MiB) in {:.0} ms",
            path.display(),
            bytes as f64 / (1024.0 * 1024.0),
            started.elapsed().as_secs_f64() * 1e3
        ))?;
        Ok(path)
    }

    /// The checkpoint of the learner's state, its counts and its self-play pool.
    fn checkpoint(
        &self,
        (named, training): (Vec<NamedTensor>, TrainingState),
        request: &CheckpointRequest,
        pool: &[(PoolSnapshot, Vec<f32>)],
    ) -> Result<Checkpoint> {
        let extra = ExtraState {
            episodes: request.episodes,
            training,
            adam_moments_saved: named
                .iter()
                .any(|t| t.name.starts_with(crate::algo::adam::PREFIX)),
            self_play_pool: pool.iter().map(|(snapshot, _)| *snapshot).collect(),
        };
        let mut ckpt = Checkpoint {
            meta: CheckpointMeta {
                train_step: training.version,
                env_steps: request.env_steps,
                policy_version: training.version,
                metric: request.best_metric(self.policy),
                extra: serde_json::to_value(extra)
                    .map_err(|e| RlfError::Config(format!("cannot serialise the training state: {e}")))?,
            },
            ..Default::default()
        };
        for t in named {
            ckpt.tensors.insert(t.name, Tensor::f32(&t.shape, t.values));
        }
        for (snapshot, values) in pool {
            ckpt.tensors.insert(
                pool_tensor(snapshot.slot),
                Tensor::f32(&[values.len()], values.clone()),
            );
        }
        Ok(ckpt)
    }

    /// Writes `line` to the log file and to stderr.
    pub fn log(&mut self, line: &str) -> Result<()> {
        use std::io::Write;
        console(line);
        writeln!(self.log, "{line}").map_err(|source| RlfError::Io {
            what: "writing the log",
            path: self.log_path.clone(),
            source,
        })
    }
}

/// Writes `[rlfactory] line` and its newline to stderr in one write, so the lines of a run's processes (the runner's,
/// each learner's) never interleave within a line; a stderr that cannot be written to is left alone.
pub fn console(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("[rlfactory] {line}\n").as_bytes());
}
