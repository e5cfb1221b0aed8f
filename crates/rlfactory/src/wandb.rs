//! Weights & Biases (`--with_wandb`, feature `python`): the run's config, the scalars the TensorBoard event files get,
//! and the learning curves at the end, through the `wandb` package of the Python environment the binary runs in
//! (its embedded interpreter, as the Gymnasium bridge's).
//!
//! The W&B run lives in the experiment folder (`wandb/`); its id is kept in `wandb_id` there, so a resumed
//! experiment continues the same W&B run. Scalars are logged against `env_frames` (each policy's own, with
//! `policy_<i>/` before the tags of a run of several policies), as Sample Factory's are. `WANDB_MODE=offline` keeps
//! the run on this machine (`wandb sync` uploads it later).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::PyModule;

use crate::config::Config;
use crate::error::{Result, RlfError};

const HELPER: &std::ffi::CStr = c"
import json

def init(wandb, project, entity, group, job_type, tags, name, run_id, folder, config, policies):
    run = wandb.init(
        project=project, entity=entity or None, group=group or None, job_type=job_type or None,
        tags=[t for t in tags.split(',') if t] or None, name=name, id=run_id, resume='allow', dir=folder,
        config=json.loads(config),
    )
    if policies == 1:
        run.define_metric('env_frames')
        run.define_metric('*', step_metric='env_frames')
    else:
        for i in range(policies):
            run.define_metric('policy_%d/env_frames' % i)
            run.define_metric('policy_%d/*' % i, step_metric='policy_%d/env_frames' % i)
    return run

def log(run, prefix, env_frames, scalars):
    values = {prefix + tag: value for tag, value in scalars}
    values[prefix + 'env_frames'] = env_frames
    run.log(values)

def finish(wandb, run, images):
    try:
        import PIL
    except ImportError:
        images = []
        note = 'W&B gets no learning-curve image: wandb.Image needs pillow (pip install pillow)'
    else:
        note = None
    try:
        for key, path in images:
            run.log({key: wandb.Image(path)})
    finally:
        run.finish()
    return note
";

/// A W&B run, started from the runner's process.
pub struct WandbRun {
    helper: Py<PyModule>,
    wandb: Py<PyModule>,
    run: Py<PyAny>,
    several_policies: bool,
}

impl std::fmt::Debug for WandbRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WandbRun").finish_non_exhaustive()
    }
}

/// A Python error as the run's one-line error.
fn wandb_error(what: &'static str) -> impl FnOnce(PyErr) -> RlfError {
    move |e| RlfError::Config(format!("--with_wandb: {what}: {e}"))
}

/// The experiment's W&B run id: the one kept in `folder/wandb_id`, or a new one written there.
fn run_id(folder: &Path, experiment: &str) -> Result<String> {
    let path = folder.join("wandb_id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        return Ok(id.trim().to_owned());
    }
    let name: String = experiment
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let id = format!("{name}_{:x}", nanos ^ u128::from(std::process::id()));
    std::fs::write(&path, &id).map_err(|source| RlfError::Io {
        what: "writing the W&B run id to",
        path,
        source,
    })?;
    Ok(id)
}

impl WandbRun {
    /// Starts (or resumes) the experiment's W&B run in `folder`, with `cfg` as its config.
    pub fn start(cfg: &Config, folder: &Path) -> Result<Self> {
        let id = run_id(folder, &cfg.run.experiment)?;
        let config = serde_json::to_string(cfg)
            .map_err(|e| RlfError::Config(format!("cannot serialise the config: {e}")))?;
        let w = &cfg.wandb;
        let policies = cfg.sampling.num_policies;
        Python::attach(|py| {
            let wandb = rlf_env::gym::import_module(py, "wandb").map_err(|e| {
                RlfError::Config(format!(
                    "--with_wandb: cannot import wandb ({e}); install it in the Python environment rlfactory \
                     runs in (pip install wandb)"
                ))
            })?;
            let helper = PyModule::from_code(py, HELPER, c"rlf_wandb.py", c"rlf_wandb")
                .map_err(wandb_error("loading the helper"))?;
            let run = helper
                .getattr("init")
                .and_then(|init| {
                    init.call1((
                        &wandb,
                        &w.wandb_project,
                        &w.wandb_user,
                        &w.wandb_group,
                        &w.wandb_job_type,
                        &w.wandb_tags,
                        &cfg.run.experiment,
                        &id,
                        folder.to_string_lossy().as_ref(),
                        &config,
                        policies,
                    ))
                })
                .map_err(wandb_error("wandb.init"))?;
            Ok(Self {
                helper: helper.unbind(),
                wandb: wandb.unbind(),
                run: run.unbind(),
                several_policies: policies > 1,
            })
        })
    }

    /// Logs policy `policy`'s `scalars` at its `env_frames`.
    pub fn log(&self, policy: usize, env_frames: u64, scalars: &[(String, f64)]) -> Result<()> {
        let prefix = if self.several_policies {
            format!("policy_{policy}/")
        } else {
            String::new()
        };
        Python::attach(|py| {
            self.helper
                .bind(py)
                .getattr("log")
                .and_then(|log| log.call1((self.run.bind(py), prefix, env_frames, scalars.to_vec())))
                .map(drop)
                .map_err(wandb_error("wandb.log"))
        })
    }

    /// Logs the learning-curve images (`(key, path)`) and finishes the run; returns why the images were left out, if
    /// they were (`wandb.Image` needs pillow, which `wandb` does not require).
    pub fn finish(self, images: &[(String, String)]) -> Result<Option<String>> {
        Python::attach(|py| {
            self.helper
                .bind(py)
                .getattr("finish")
                .and_then(|finish| finish.call1((self.wandb.bind(py), self.run.bind(py), images.to_vec())))
                .and_then(|note| note.extract())
                .map_err(wandb_error("finishing the run"))
        })
    }
}
