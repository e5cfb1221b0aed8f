//! The experiment side of a training run, over `rlf_experiment`: the folder `<train_dir>/<experiment>/`
//! (resolved `config.json`, `log.txt`), TensorBoard scalars under `.summary/0/`, checkpoints under
//! `checkpoint_p0/` and the learning curve `learning_curve_p0.png`.
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
//! (its rate and its position in frames). A checkpoint without the moments (saved from the
//! published weights after the learner's process was lost) restarts Adam at zero, and says so.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rlf_experiment::{
    Checkpoint, CheckpointConfig, CheckpointMeta, CheckpointStore, Experiment, Loaded, SummaryWriter, Tensor,
};
use serde::{Deserialize, Serialize};

use crate::algo::appo::TrainingState;
use crate::config::{CheckpointKind, Config, RestartBehaviorArg};
use crate::error::{Result, RlfError};
use crate::learning::Learner;
use crate::model::NamedTensor;

/// The only policy of a run (Sample Factory's policy id 0).
const POLICY_ID: usize = 0;
/// The TensorBoard tag of the learning curve.
const REWARD_TAG: &str = "reward/reward";

/// Where and why the learner is asked to save (`checkpoint_requested`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// Env frames simulated so far.
    pub env_steps: u64,
    /// Episodes finished so far.
    pub episodes: u64,
    /// Mean return of the last 100 episodes (the best-checkpoint metric).
    pub mean_return: Option<f64>,
}

/// The sidecar's extra state: what [`CheckpointMeta`] has no field for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct ExtraState {
    episodes: u64,
    training: TrainingState,
    /// Always false (see the module doc); written so a reader of the sidecar need not guess.
    adam_moments_saved: bool,
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
    /// Newer checkpoints passed over because they were incomplete or corrupt, with the reason.
    pub skipped: Vec<String>,
}

/// Opens the experiment folder's checkpoint store for reading (enjoy, eval, export).
pub fn open_store(train_dir: &Path, experiment: &str) -> Result<CheckpointStore> {
    let dir = train_dir
        .join(experiment)
        .join(format!("checkpoint_p{POLICY_ID}"));
    if !dir.is_dir() {
        return Err(RlfError::Config(format!(
            "--experiment {experiment}: no checkpoints in {}",
            dir.display()
        )));
    }
    Ok(CheckpointStore::open(dir, CheckpointConfig::default())?)
}

/// The counts of the checkpoint a run of `cfg` resumes from: `(env frames, episodes, policy
/// version)`, or `None` for a fresh run.
pub fn resume_counts(cfg: &Config) -> Result<Option<(u64, u64, u64)>> {
    let dir = cfg
        .run
        .train_dir
        .join(&cfg.run.experiment)
        .join(format!("checkpoint_p{POLICY_ID}"));
    if !dir.is_dir() {
        return Ok(None);
    }
    let store = CheckpointStore::open(dir, CheckpointConfig::default())?;
    Ok(load(&store, CheckpointKind::Latest)?.map(|s| (s.env_steps, s.episodes, s.training.version)))
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
        .collect::<Result<Vec<_>>>()?;
    Ok(RestoredState {
        env_steps: checkpoint.meta.env_steps,
        episodes: extra.episodes,
        training: extra.training,
        tensors,
        skipped: skipped.iter().map(ToString::to_string).collect(),
        path,
    })
}

/// The runner's side: the folder, the log, the TensorBoard writer and the learning curve.
#[derive(Debug)]
pub struct ExperimentRun {
    exp: Experiment,
    summary: SummaryWriter,
    curve: Vec<(u64, f64)>,
    title: String,
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
        let mut curve = earlier_curve(&exp.summary_dir(POLICY_ID))?;
        curve.sort_by_key(|p| p.0);
        let summary = exp.summary_writer(POLICY_ID)?;
        let run = Self {
            exp,
            summary,
            curve,
            title: cfg.env.env.clone(),
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
        eprintln!("[rlfactory] {line}");
        Ok(self.exp.log(line)?)
    }

    /// Records scalars at step `env_steps` (buffered until [`flush`](Self::flush)) and adds a
    /// mean return to the learning curve.
    pub fn write_scalars(&mut self, env_steps: u64, scalars: &[(String, f64)]) -> Result<()> {
        let step = i64::try_from(env_steps).unwrap_or(i64::MAX);
        for (tag, value) in scalars {
            self.summary.add_scalar(tag, *value as f32, step)?;
            if tag == REWARD_TAG {
                self.curve.push((env_steps, *value));
            }
        }
        Ok(())
    }

    /// Writes the buffered scalars to the event file.
    pub fn flush(&mut self) -> Result<()> {
        Ok(self.summary.flush()?)
    }

    /// The experiment folder.
    pub fn dir(&self) -> &Path {
        self.exp.dir()
    }

    /// Redraws the learning curve PNG.
    pub fn plot(&self) -> Result<()> {
        Ok(rlf_experiment::plot_curve(
            self.exp.plot_path(POLICY_ID),
            &self.curve,
            &self.title,
        )?)
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

/// The learner's side: saves checkpoints (keep N, best by mean return, milestones) and logs them.
#[derive(Debug)]
pub struct Checkpointer {
    store: CheckpointStore,
    log: std::fs::File,
    log_path: PathBuf,
    save_best_after: u64,
}

impl Checkpointer {
    /// The checkpoint store of the experiment folder [`ExperimentRun::prepare`] made, opened in
    /// the learner's process, logging to the folder's log file.
    pub fn open(cfg: &Config) -> Result<Self> {
        let c = &cfg.checkpoint;
        let dir = cfg.run.train_dir.join(&cfg.run.experiment);
        let store = CheckpointStore::open(
            dir.join(format!("checkpoint_p{POLICY_ID}")),
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
        })
    }

    /// Opens the store (see [`open`](Self::open)) and, if it holds a checkpoint, continues
    /// `learner` from the newest intact one and publishes its weights; returns the counts the
    /// checkpoint was saved with (zero for a fresh run).
    pub fn open_and_resume(cfg: &Config, learner: &mut Learner) -> Result<(Self, CheckpointRequest)> {
        let mut checkpointer = Self::open(cfg)?;
        let mut progress = CheckpointRequest::default();
        if let Some(state) = checkpointer.load_latest()? {
            if !learner.restore(&state.tensors, state.training)? {
                checkpointer.log("the checkpoint holds no Adam moments: Adam restarts at zero")?;
            }
            learner.publish()?;
            progress.env_steps = state.env_steps;
            progress.episodes = state.episodes;
        }
        Ok((checkpointer, progress))
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
    pub fn save(
        &mut self,
        (named, training): (Vec<NamedTensor>, TrainingState),
        request: &CheckpointRequest,
    ) -> Result<()> {
        let started = Instant::now();
        let extra = ExtraState {
            episodes: request.episodes,
            training,
            adam_moments_saved: named
                .iter()
                .any(|t| t.name.starts_with(crate::algo::adam::PREFIX)),
        };
        let mut ckpt = Checkpoint {
            meta: CheckpointMeta {
                train_step: training.version,
                env_steps: request.env_steps,
                policy_version: training.version,
                metric: request.mean_return,
                extra: serde_json::to_value(extra)
                    .map_err(|e| RlfError::Config(format!("cannot serialise the training state: {e}")))?,
            },
            ..Default::default()
        };
        for t in named {
            ckpt.tensors.insert(t.name, Tensor::f32(&t.shape, t.values));
        }
        let path = self.store.save(&ckpt)?;
        let best = request.env_steps >= self.save_best_after && self.store.save_if_best(&ckpt)?;
        let best_note = if best { " (new best)" } else { "" };
        self.log(&format!(
            "saved {}{best_note} in {:.0} ms",
            path.display(),
            started.elapsed().as_secs_f64() * 1e3
        ))
    }

    fn log(&mut self, line: &str) -> Result<()> {
        use std::io::Write;
        eprintln!("[rlfactory] {line}");
        writeln!(self.log, "{line}").map_err(|source| RlfError::Io {
            what: "writing the log",
            path: self.log_path.clone(),
            source,
        })
    }
}
