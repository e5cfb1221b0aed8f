//! Crash-safe checkpoints: named tensors in a `.safetensors` file plus a JSON sidecar.
//!
//! # Layout of a checkpoint directory (`checkpoint_p<policy>/`)
//!
//! ```text
//! checkpoint_000000120_61440.safetensors   weights (regular checkpoints: the newest `keep_checkpoints`)
//! checkpoint_000000120_61440.json          sidecar: steps, version, metric, extra state, weights size + CRC32C
//! best_000000100_51200.{safetensors,json}  the best by metric (one pair)
//! milestones/checkpoint_....{safetensors,json}   every `milestone_every_env_steps`, kept for ever
//! replay_buffer/checkpoint_....{safetensors,json}   an off-policy learner's replay buffer (the newest only)
//! ```
//!
//! Names are `<kind>_<train_step:09>_<env_steps>` as in Sample Factory, so they sort by age.
//!
//! # Protocol
//! A save writes the weights to `.tmp.<name>`, fsyncs, renames, fsyncs the directory; then the sidecar the same way.
//! The sidecar is renamed **last** and records the weights' size and CRC32C, so a checkpoint is complete exactly when
//! its sidecar exists, parses, and names weights of that size and checksum. A process killed at any instant leaves
//! the previous checkpoints untouched and at worst an orphan weights file or a `.tmp.` file, which loading reports
//! and skips and [`CheckpointStore::open`] or the next prune removes. Old checkpoints are pruned only after the new
//! one is complete, sidecar first.

use crate::atomic::{self, TEMP_PREFIX};
use crate::error::{io, Error, Result, Skipped};
use safetensors::tensor::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Version of the sidecar format.
const SIDECAR_FORMAT: u32 = 1;
const WEIGHTS_EXT: &str = "safetensors";
const SIDECAR_EXT: &str = "json";
const MILESTONES_DIR: &str = "milestones";
const REPLAY_DIR: &str = "replay_buffer";

/// The values of a tensor, little-endian on disk.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// 32-bit floats (weights, optimizer moments, normaliser statistics).
    F32(Vec<f32>),
    /// 64-bit floats (replay priorities).
    F64(Vec<f64>),
    /// 64-bit integers (step counters).
    I64(Vec<i64>),
    /// Bytes.
    U8(Vec<u8>),
}

impl TensorData {
    fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F64(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::U8(v) => v.len(),
        }
    }
}

/// A named tensor's shape and values (row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions; `[]` is a scalar.
    pub shape: Vec<usize>,
    /// Values; their number must be the product of `shape`.
    pub data: TensorData,
}

impl Tensor {
    /// An `f32` tensor.
    pub fn f32(shape: &[usize], data: Vec<f32>) -> Self {
        Self {
            shape: shape.to_vec(),
            data: TensorData::F32(data),
        }
    }

    /// An `f64` tensor.
    pub fn f64(shape: &[usize], data: Vec<f64>) -> Self {
        Self {
            shape: shape.to_vec(),
            data: TensorData::F64(data),
        }
    }

    /// An `i64` tensor.
    pub fn i64(shape: &[usize], data: Vec<i64>) -> Self {
        Self {
            shape: shape.to_vec(),
            data: TensorData::I64(data),
        }
    }

    /// A `u8` tensor.
    pub fn u8(shape: &[usize], data: Vec<u8>) -> Self {
        Self {
            shape: shape.to_vec(),
            data: TensorData::U8(data),
        }
    }

    /// The values if this is an `f32` tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The values if this is an `f64` tensor.
    pub fn as_f64(&self) -> Option<&[f64]> {
        match &self.data {
            TensorData::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The values if this is an `i64` tensor.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The values if this is a `u8` tensor.
    pub fn as_u8(&self) -> Option<&[u8]> {
        match &self.data {
            TensorData::U8(v) => Some(v),
            _ => None,
        }
    }
}

/// Everything about a checkpoint but its tensors; stored in the sidecar.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Learner SGD steps so far.
    pub train_step: u64,
    /// Environment frames consumed so far.
    pub env_steps: u64,
    /// Version of the policy the weights are.
    pub policy_version: u64,
    /// Value of the `--save_best_metric` (greater is better), if known.
    pub metric: Option<f64>,
    /// Free-form state to restore (normaliser counts, optimizer step, LR schedule position, ...).
    #[serde(default)]
    pub extra: serde_json::Value,
}

/// A checkpoint: metadata and named tensors.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Checkpoint {
    /// Steps, version, metric, extra state.
    pub meta: CheckpointMeta,
    /// Tensors by name.
    pub tensors: BTreeMap<String, Tensor>,
}

/// What to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// How many regular checkpoints to keep (`--keep_checkpoints`, at least 1).
    pub keep_checkpoints: usize,
    /// Keep a copy of the first checkpoint saved past every multiple of this many env steps, for ever.
    pub milestone_every_env_steps: Option<u64>,
}

impl Default for CheckpointConfig {
    /// Sample Factory's defaults: 2 checkpoints, no milestones.
    fn default() -> Self {
        Self {
            keep_checkpoints: 2,
            milestone_every_env_steps: None,
        }
    }
}

/// A loaded checkpoint, and the newer ones that had to be passed over.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The checkpoint.
    pub checkpoint: Checkpoint,
    /// Its sidecar.
    pub path: PathBuf,
    /// Newer checkpoints that were incomplete or corrupt, newest first.
    pub skipped: Vec<Skipped>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Sidecar {
    format: u32,
    weights: String,
    weights_bytes: u64,
    weights_crc32c: u32,
    #[serde(flatten)]
    meta: CheckpointMeta,
}

#[derive(Clone, Copy)]
enum Kind {
    Regular,
    Best,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Regular => "checkpoint",
            Kind::Best => "best",
        }
    }
}

/// A checkpoint directory: saves, prunes, and loads the newest intact checkpoint.
#[derive(Debug)]
pub struct CheckpointStore {
    dir: PathBuf,
    config: CheckpointConfig,
    best_metric: Option<f64>,
    milestones_done: u64,
}

impl CheckpointStore {
    /// Opens (creating it if needed) the checkpoint directory `dir`, removes the temporary files of saves cut
    /// short, and picks up the best metric and the last milestone already saved there.
    pub fn open(dir: impl AsRef<Path>, config: CheckpointConfig) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let milestone_dir = dir.join(MILESTONES_DIR);
        remove_temp_files(&dir)?;
        remove_temp_files(&milestone_dir)?;
        let best_metric = scan(&dir, Kind::Best)?
            .iter()
            .filter(|e| e.has_sidecar)
            .find_map(|e| read_sidecar(&e.sidecar_path(&dir)).ok())
            .and_then(|s| s.meta.metric);
        let milestones_done = match config.milestone_every_env_steps {
            Some(every) if every > 0 => scan(&milestone_dir, Kind::Regular)?
                .iter()
                .filter(|e| e.has_sidecar)
                .map(|e| e.key.1 / every)
                .max()
                .unwrap_or(0),
            _ => 0,
        };
        Ok(Self {
            dir,
            config,
            best_metric,
            milestones_done,
        })
    }

    /// Opens the checkpoint directory `dir` to read it only (evaluation, export, the checks before a run resumes):
    /// nothing there changes, so that a running experiment's saves under way (their temporary files) are left alone.
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let best_metric = scan(&dir, Kind::Best)?
            .iter()
            .filter(|e| e.has_sidecar)
            .find_map(|e| read_sidecar(&e.sidecar_path(&dir)).ok())
            .and_then(|s| s.meta.metric);
        Ok(Self {
            dir,
            config: CheckpointConfig::default(),
            best_metric,
            milestones_done: 0,
        })
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The metric of the current best checkpoint.
    pub fn best_metric(&self) -> Option<f64> {
        self.best_metric
    }

    /// Saves `ckpt` as `checkpoint_<train_step:09>_<env_steps>`, plus a milestone copy when one is due, then deletes
    /// the regular checkpoints older than the newest `keep_checkpoints`. Returns the sidecar's path.
    pub fn save(&mut self, ckpt: &Checkpoint) -> Result<PathBuf> {
        let weights = serialize(ckpt)?;
        let sidecar = write_pair(&self.dir, Kind::Regular, &ckpt.meta, &weights)?;
        if let Some(every) = self.config.milestone_every_env_steps.filter(|&e| e > 0) {
            let index = ckpt.meta.env_steps / every;
            if index > self.milestones_done {
                let milestone_dir = self.dir.join(MILESTONES_DIR);
                fs::create_dir_all(&milestone_dir).map_err(io(&milestone_dir))?;
                write_pair(&milestone_dir, Kind::Regular, &ckpt.meta, &weights)?;
                self.milestones_done = index;
            }
        }
        self.prune()?;
        Ok(sidecar)
    }

    /// Saves `ckpt` as the best checkpoint if its metric is a number greater than the best so far, replacing the
    /// previous best (which is deleted only after the new one is complete). Returns whether it was saved.
    pub fn save_if_best(&mut self, ckpt: &Checkpoint) -> Result<bool> {
        let Some(metric) = ckpt.meta.metric.filter(|m| !m.is_nan()) else {
            return Ok(false);
        };
        if self.best_metric.is_some_and(|best| metric <= best) {
            return Ok(false);
        }
        let sidecar = write_pair(&self.dir, Kind::Best, &ckpt.meta, &serialize(ckpt)?)?;
        self.best_metric = Some(metric);
        let keep = file_stem(&sidecar);
        for e in scan(&self.dir, Kind::Best)? {
            if e.stem != keep {
                e.remove(&self.dir)?;
            }
        }
        atomic::sync_dir(&self.dir)?;
        Ok(true)
    }

    /// Saves `ckpt` into the sub-folder `name` for another reader (population-based training hands one policy's
    /// weights to another learner this way), where regular saves never rotate it away; that folder keeps its newest
    /// `keep_checkpoints`, so a reader that takes a while still finds the file it was told of. Returns the sidecar's
    /// path.
    pub fn save_aside(&self, name: &str, ckpt: &Checkpoint) -> Result<PathBuf> {
        let dir = self.dir.join(name);
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let sidecar = write_pair(&dir, Kind::Regular, &ckpt.meta, &serialize(ckpt)?)?;
        prune(&dir, self.config.keep_checkpoints)?;
        Ok(sidecar)
    }

    /// Saves an off-policy learner's replay buffer (`replay`, named by the checkpoint it goes with) into
    /// `replay_buffer/`, then deletes the older one: a buffer is large, and only the newest is resumed from.
    /// Returns the sidecar's path.
    pub fn save_replay(&self, replay: &Checkpoint) -> Result<PathBuf> {
        let dir = self.dir.join(REPLAY_DIR);
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        remove_temp_files(&dir)?;
        let sidecar = write_pair(&dir, Kind::Regular, &replay.meta, &serialize(replay)?)?;
        prune(&dir, 1)?;
        Ok(sidecar)
    }

    /// Loads the newest intact replay buffer [`save_replay`](Self::save_replay) wrote; `Ok(None)` if there is none.
    pub fn load_replay(&self) -> Result<Option<Loaded>> {
        load_newest(&self.dir.join(REPLAY_DIR), Kind::Regular)
    }

    /// Loads the newest intact regular checkpoint. `Ok(None)`: there is none at all (a fresh run). A checkpoint that
    /// is incomplete or corrupt is skipped (and listed in [`Loaded::skipped`]); if all are, the error lists them.
    pub fn load_latest(&self) -> Result<Option<Loaded>> {
        load_newest(&self.dir, Kind::Regular)
    }

    /// Loads the best checkpoint, falling back like [`load_latest`](Self::load_latest).
    pub fn load_best(&self) -> Result<Option<Loaded>> {
        load_newest(&self.dir, Kind::Best)
    }

    fn prune(&self) -> Result<()> {
        prune(&self.dir, self.config.keep_checkpoints)
    }
}

/// Deletes the regular checkpoints of `dir` older than its newest `keep` complete ones.
fn prune(dir: &Path, keep: usize) -> Result<()> {
    let entries = scan(dir, Kind::Regular)?;
    let kept: Vec<_> = entries
        .iter()
        .filter(|e| e.has_sidecar)
        .take(keep.max(1))
        .collect();
    let Some(newest) = kept.first().map(|e| e.key) else {
        return Ok(());
    };
    for e in &entries {
        if e.key < newest && !kept.iter().any(|k| k.stem == e.stem) {
            e.remove(dir)?;
        }
    }
    atomic::sync_dir(dir)
}

/// Loads and verifies one checkpoint given its sidecar (`.json`) or weights (`.safetensors`) path.
pub fn load_checkpoint(path: impl AsRef<Path>) -> Result<Checkpoint> {
    let path = path.as_ref().with_extension(SIDECAR_EXT);
    let sidecar = read_sidecar(&path)?;
    let corrupt = |p: &Path, reason: String| Error::CorruptCheckpoint {
        path: p.to_path_buf(),
        reason,
    };
    if sidecar.format != SIDECAR_FORMAT {
        return Err(corrupt(
            &path,
            format!("unknown sidecar format {}", sidecar.format),
        ));
    }
    let plain_name = Path::new(&sidecar.weights)
        .file_name()
        .map(|n| n == sidecar.weights.as_str());
    if plain_name != Some(true) {
        return Err(corrupt(
            &path,
            format!("weights {:?} is not a file name", sidecar.weights),
        ));
    }
    let weights_path = atomic::parent_dir(&path).join(&sidecar.weights);
    let bytes = match fs::read(&weights_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(corrupt(&weights_path, "weights file missing".into()))
        }
        Err(e) => return Err(io(&weights_path)(e)),
    };
    if bytes.len() as u64 != sidecar.weights_bytes {
        return Err(corrupt(
            &weights_path,
            format!(
                "{} bytes, the sidecar says {}",
                bytes.len(),
                sidecar.weights_bytes
            ),
        ));
    }
    if crc32c::crc32c(&bytes) != sidecar.weights_crc32c {
        return Err(corrupt(&weights_path, "CRC32C differs from the sidecar's".into()));
    }
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| corrupt(&weights_path, format!("bad safetensors: {e}")))?;
    let mut tensors = BTreeMap::new();
    for (name, view) in st.iter() {
        let data = view.data();
        let data = match view.dtype() {
            Dtype::F32 => TensorData::F32(
                data.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Dtype::F64 => TensorData::F64(
                data.chunks_exact(8)
                    .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect(),
            ),
            Dtype::I64 => TensorData::I64(
                data.chunks_exact(8)
                    .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect(),
            ),
            Dtype::U8 => TensorData::U8(data.to_vec()),
            d => {
                return Err(corrupt(
                    &weights_path,
                    format!("tensor `{name}` has unsupported dtype {d:?}"),
                ))
            }
        };
        tensors.insert(
            name.to_string(),
            Tensor {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(Checkpoint {
        meta: sidecar.meta,
        tensors,
    })
}

fn read_sidecar(path: &Path) -> Result<Sidecar> {
    let text = fs::read(path).map_err(io(path))?;
    serde_json::from_slice(&text).map_err(|e| Error::CorruptCheckpoint {
        path: path.to_path_buf(),
        reason: format!("invalid sidecar JSON: {e}"),
    })
}

fn load_newest(dir: &Path, kind: Kind) -> Result<Option<Loaded>> {
    let entries = scan(dir, kind)?;
    if entries.is_empty() {
        return Ok(None);
    }
    let mut skipped = Vec::new();
    for e in entries {
        if !e.has_sidecar {
            skipped.push(Skipped {
                path: e.weights_path(dir),
                reason: "no sidecar: its save was cut short".into(),
            });
            continue;
        }
        let path = e.sidecar_path(dir);
        match load_checkpoint(&path) {
            Ok(checkpoint) => {
                return Ok(Some(Loaded {
                    checkpoint,
                    path,
                    skipped,
                }))
            }
            Err(err) => skipped.push(match err {
                Error::CorruptCheckpoint { path, reason } => Skipped { path, reason },
                Error::Io { path, source } => Skipped {
                    path,
                    reason: source.to_string(),
                },
                other => Skipped {
                    path,
                    reason: other.to_string(),
                },
            }),
        }
    }
    Err(Error::NoCheckpoint {
        dir: dir.to_path_buf(),
        skipped,
    })
}

/// A wrapper giving safetensors a view of our tensor.
struct SafeView<'a>(&'a Tensor);

impl View for SafeView<'_> {
    fn dtype(&self) -> Dtype {
        match self.0.data {
            TensorData::F32(_) => Dtype::F32,
            TensorData::F64(_) => Dtype::F64,
            TensorData::I64(_) => Dtype::I64,
            TensorData::U8(_) => Dtype::U8,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match &self.0.data {
            TensorData::F32(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            TensorData::F64(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            TensorData::I64(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            TensorData::U8(v) => Cow::Borrowed(v),
        }
    }

    fn data_len(&self) -> usize {
        let width = match self.0.data {
            TensorData::F32(_) => 4,
            TensorData::F64(_) | TensorData::I64(_) => 8,
            TensorData::U8(_) => 1,
        };
        self.0.data.len() * width
    }
}

fn serialize(ckpt: &Checkpoint) -> Result<Vec<u8>> {
    for (name, t) in &ckpt.tensors {
        let invalid = |reason: String| Error::InvalidTensor {
            name: name.clone(),
            reason,
        };
        if name.is_empty() || name == "__metadata__" {
            return Err(invalid("reserved or empty name".into()));
        }
        let expected = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if expected != Some(t.data.len()) {
            return Err(invalid(format!(
                "shape {:?} does not hold {} values",
                t.shape,
                t.data.len()
            )));
        }
    }
    let views = ckpt.tensors.iter().map(|(n, t)| (n.as_str(), SafeView(t)));
    safetensors::tensor::serialize(views, None).map_err(|e| Error::InvalidTensor {
        name: "(all)".into(),
        reason: format!("safetensors: {e}"),
    })
}

/// Writes weights then sidecar, each atomically; returns the sidecar's path.
fn write_pair(dir: &Path, kind: Kind, meta: &CheckpointMeta, weights: &[u8]) -> Result<PathBuf> {
    let stem = format!("{}_{:09}_{}", kind.prefix(), meta.train_step, meta.env_steps);
    let weights_name = format!("{stem}.{WEIGHTS_EXT}");
    let sidecar_path = dir.join(format!("{stem}.{SIDECAR_EXT}"));
    atomic::write(&dir.join(&weights_name), weights)?;
    let sidecar = Sidecar {
        format: SIDECAR_FORMAT,
        weights: weights_name,
        weights_bytes: weights.len() as u64,
        weights_crc32c: crc32c::crc32c(weights),
        meta: meta.clone(),
    };
    let json = serde_json::to_vec_pretty(&sidecar).map_err(|source| Error::Json {
        path: sidecar_path.clone(),
        source,
    })?;
    // Weights without a sidecar are not a checkpoint: a sidecar that does not fit (a full disk) takes them along.
    atomic::discard_on_error(&dir.join(&sidecar.weights), atomic::write(&sidecar_path, &json))?;
    Ok(sidecar_path)
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// One checkpoint name found in a directory, complete or not.
#[derive(Debug)]
struct Entry {
    key: (u64, u64),
    stem: String,
    has_sidecar: bool,
    has_weights: bool,
}

impl Entry {
    fn sidecar_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.{SIDECAR_EXT}", self.stem))
    }

    fn weights_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.{WEIGHTS_EXT}", self.stem))
    }

    /// Deletes the sidecar first, so a crash midway leaves an orphan, never a sidecar without weights.
    fn remove(&self, dir: &Path) -> Result<()> {
        for (present, path) in [
            (self.has_sidecar, self.sidecar_path(dir)),
            (self.has_weights, self.weights_path(dir)),
        ] {
            if present {
                remove_if_exists(&path)?;
            }
        }
        Ok(())
    }
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(path)(e)),
        _ => Ok(()),
    }
}

/// The checkpoints of `kind` in `dir` (none if it does not exist), newest first.
fn scan(dir: &Path, kind: Kind) -> Result<Vec<Entry>> {
    let read = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut by_stem: BTreeMap<String, Entry> = BTreeMap::new();
    for item in read {
        let name = item.map_err(io(dir))?.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((stem, ext)) = name.rsplit_once('.') else {
            continue;
        };
        if ext != SIDECAR_EXT && ext != WEIGHTS_EXT {
            continue;
        }
        let Some(key) = parse_stem(stem, kind) else {
            continue;
        };
        let e = by_stem.entry(stem.to_string()).or_insert(Entry {
            key,
            stem: stem.to_string(),
            has_sidecar: false,
            has_weights: false,
        });
        if ext == SIDECAR_EXT {
            e.has_sidecar = true;
        } else {
            e.has_weights = true;
        }
    }
    let mut entries: Vec<Entry> = by_stem.into_values().collect();
    entries.sort_by(|a, b| b.key.cmp(&a.key).then_with(|| b.stem.cmp(&a.stem)));
    Ok(entries)
}

/// `(train_step, env_steps)` of `<prefix>_<train_step>_<env_steps>`.
fn parse_stem(stem: &str, kind: Kind) -> Option<(u64, u64)> {
    let rest = stem.strip_prefix(kind.prefix())?.strip_prefix('_')?;
    let (train, env) = rest.split_once('_')?;
    Some((train.parse().ok()?, env.parse().ok()?))
}

fn remove_temp_files(dir: &Path) -> Result<()> {
    let read = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(dir)(e)),
    };
    for item in read {
        let item = item.map_err(io(dir))?;
        if item.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            remove_if_exists(&item.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ckpt(train_step: u64, env_steps: u64, metric: Option<f64>) -> Checkpoint {
        let mut tensors = BTreeMap::new();
        let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 + train_step as f32).collect();
        tensors.insert("policy.w".to_string(), Tensor::f32(&[3, 4], w));
        tensors.insert("adam.step".to_string(), Tensor::i64(&[], vec![train_step as i64]));
        tensors.insert("rng".to_string(), Tensor::u8(&[2], vec![7, 9]));
        Checkpoint {
            meta: CheckpointMeta {
                train_step,
                env_steps,
                policy_version: train_step,
                metric,
                extra: serde_json::json!({"obs_norm": {"count": env_steps}}),
            },
            tensors,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn save_then_load_round_trips_and_keeps_n() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open(dir.path(), CheckpointConfig::default()).unwrap();
        assert!(store.load_latest().unwrap().is_none());
        for step in 1..=4 {
            let p = store.save(&ckpt(step, step * 100, None)).unwrap();
            assert!(p.ends_with(format!("checkpoint_{step:09}_{}.json", step * 100)));
        }
        assert_eq!(
            names(dir.path()),
            [
                "checkpoint_000000003_300.json",
                "checkpoint_000000003_300.safetensors",
                "checkpoint_000000004_400.json",
                "checkpoint_000000004_400.safetensors"
            ]
        );
        let loaded = store.load_latest().unwrap().unwrap();
        assert_eq!(loaded.checkpoint, ckpt(4, 400, None));
        assert!(loaded.skipped.is_empty());
    }

    /// A replay buffer round-trips with its `f64` priorities bit for bit; only the newest is kept, and the rotation
    /// of regular checkpoints leaves it alone.
    #[test]
    fn a_replay_buffer_is_kept_once_beside_the_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open(dir.path(), CheckpointConfig::default()).unwrap();
        assert!(store.load_replay().unwrap().is_none());
        let replay = |step: u64| {
            let mut r = ckpt(step, step * 100, None);
            let priorities = vec![0.1 + step as f64, f64::MIN_POSITIVE, 1.0 / 3.0];
            r.tensors
                .insert("priorities".into(), Tensor::f64(&[3], priorities));
            r
        };
        for step in 1..=3 {
            store.save(&ckpt(step, step * 100, None)).unwrap();
            store.save_replay(&replay(step)).unwrap();
        }
        assert_eq!(
            names(&dir.path().join(REPLAY_DIR)),
            [
                "checkpoint_000000003_300.json",
                "checkpoint_000000003_300.safetensors"
            ]
        );
        for step in 4..=6 {
            store.save(&ckpt(step, step * 100, None)).unwrap();
        }
        let loaded = store.load_replay().unwrap().unwrap();
        assert_eq!(loaded.checkpoint, replay(3));
        assert_eq!(
            loaded.checkpoint.tensors["priorities"].as_f64().unwrap()[2].to_bits(),
            (1.0f64 / 3.0).to_bits()
        );
    }

    #[test]
    fn a_checkpoint_saved_aside_outlives_the_rotation_of_regular_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open(dir.path(), CheckpointConfig::default()).unwrap();
        let aside = store.save_aside("pbt_for_p1", &ckpt(1, 10, None)).unwrap();
        assert_eq!(aside, dir.path().join("pbt_for_p1/checkpoint_000000001_10.json"));
        for step in 2..=5 {
            store.save(&ckpt(step, step * 10, None)).unwrap();
        }
        assert_eq!(load_checkpoint(&aside).unwrap(), ckpt(1, 10, None));
        // The folder aside keeps its own newest two.
        for step in 6..=7 {
            store
                .save_aside("pbt_for_p1", &ckpt(step, step * 10, None))
                .unwrap();
        }
        assert_eq!(
            names(&dir.path().join("pbt_for_p1")),
            [
                "checkpoint_000000006_60.json",
                "checkpoint_000000006_60.safetensors",
                "checkpoint_000000007_70.json",
                "checkpoint_000000007_70.safetensors"
            ]
        );
        assert_eq!(
            store.load_latest().unwrap().unwrap().checkpoint,
            ckpt(5, 50, None)
        );
    }

    #[test]
    fn truncated_weights_fall_back_to_previous_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open(dir.path(), CheckpointConfig::default()).unwrap();
        store.save(&ckpt(1, 10, None)).unwrap();
        store.save(&ckpt(2, 20, None)).unwrap();
        let w = dir.path().join("checkpoint_000000002_20.safetensors");
        let bytes = fs::read(&w).unwrap();
        fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();

        let err = load_checkpoint(&w).unwrap_err().to_string();
        assert!(
            err.contains("checkpoint_000000002_20.safetensors") && err.contains("bytes"),
            "{err}"
        );
        let loaded = store.load_latest().unwrap().unwrap();
        assert_eq!(loaded.checkpoint.meta.train_step, 1);
        assert_eq!(loaded.skipped.len(), 1);
        assert_eq!(loaded.skipped[0].path, w);
    }

    #[test]
    fn flipped_byte_and_bad_sidecar_are_detected() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open(dir.path(), CheckpointConfig::default()).unwrap();
        store.save(&ckpt(1, 10, None)).unwrap();
        let w = dir.path().join("checkpoint_000000001_10.safetensors");
        let mut bytes = fs::read(&w).unwrap();
        let n = bytes.len() - 5;
        bytes[n] ^= 0x10;
        fs::write(&w, &bytes).unwrap();
        let err = store.load_latest().unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, Error::NoCheckpoint { ref skipped, .. } if skipped.len() == 1),
            "{msg}"
        );
        assert!(
            msg.contains("CRC32C") && msg.contains("checkpoint_000000001_10.safetensors"),
            "{msg}"
        );

        let s = dir.path().join("checkpoint_000000001_10.json");
        fs::write(&s, b"{\"format\": 1, \"weig").unwrap();
        let msg = store.load_latest().unwrap_err().to_string();
        assert!(
            msg.contains("invalid sidecar JSON") && msg.contains("checkpoint_000000001_10.json"),
            "{msg}"
        );
    }

    #[test]
    fn orphan_weights_and_temp_files_are_skipped_and_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open(dir.path(), CheckpointConfig::default()).unwrap();
        store.save(&ckpt(1, 10, None)).unwrap();
        fs::write(dir.path().join("checkpoint_000000002_20.safetensors"), b"partial").unwrap();
        fs::write(
            dir.path().join(".tmp.checkpoint_000000003_30.safetensors"),
            b"partial",
        )
        .unwrap();
        let loaded = store.load_latest().unwrap().unwrap();
        assert_eq!(loaded.checkpoint.meta.train_step, 1);
        assert_eq!(loaded.skipped.len(), 1);
        assert!(loaded.skipped[0].reason.contains("no sidecar"));

        let mut store = CheckpointStore::open(dir.path(), CheckpointConfig::default()).unwrap();
        assert!(!names(dir.path()).iter().any(|n| n.starts_with(".tmp.")));
        store.save(&ckpt(3, 30, None)).unwrap();
        store.save(&ckpt(4, 40, None)).unwrap();
        assert_eq!(names(dir.path()).len(), 4, "{:?}", names(dir.path()));
    }

    #[test]
    fn best_is_kept_separately_and_only_improves() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = CheckpointConfig {
            keep_checkpoints: 1,
            milestone_every_env_steps: None,
        };
        let mut store = CheckpointStore::open(dir.path(), cfg.clone()).unwrap();
        assert!(store.load_best().unwrap().is_none());
        assert!(!store.save_if_best(&ckpt(1, 10, None)).unwrap());
        assert!(!store.save_if_best(&ckpt(1, 10, Some(f64::NAN))).unwrap());
        assert!(store.save_if_best(&ckpt(1, 10, Some(5.0))).unwrap());
        assert!(!store.save_if_best(&ckpt(2, 20, Some(4.0))).unwrap());
        assert!(store.save_if_best(&ckpt(3, 30, Some(7.5))).unwrap());
        store.save(&ckpt(3, 30, Some(7.5))).unwrap();
        store.save(&ckpt(4, 40, Some(1.0))).unwrap();
        assert_eq!(
            names(dir.path()),
            [
                "best_000000003_30.json",
                "best_000000003_30.safetensors",
                "checkpoint_000000004_40.json",
                "checkpoint_000000004_40.safetensors"
            ]
        );
        let best = store.load_best().unwrap().unwrap();
        assert_eq!(best.checkpoint, ckpt(3, 30, Some(7.5)));
        let reopened = CheckpointStore::open(dir.path(), cfg).unwrap();
        assert_eq!(reopened.best_metric(), Some(7.5));
    }

    #[test]
    fn milestones_are_kept_for_ever() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = CheckpointConfig {
            keep_checkpoints: 1,
            milestone_every_env_steps: Some(100),
        };
        let mut store = CheckpointStore::open(dir.path(), cfg.clone()).unwrap();
        for (t, e) in [(1, 50), (2, 120), (3, 150), (4, 210), (5, 450)] {
            store.save(&ckpt(t, e, None)).unwrap();
        }
        let m = dir.path().join(MILESTONES_DIR);
        let jsons: Vec<_> = names(&m).into_iter().filter(|n| n.ends_with(".json")).collect();
        assert_eq!(
            jsons,
            [
                "checkpoint_000000002_120.json",
                "checkpoint_000000004_210.json",
                "checkpoint_000000005_450.json"
            ]
        );
        let mut store = CheckpointStore::open(dir.path(), cfg).unwrap();
        store.save(&ckpt(6, 480, None)).unwrap();
        assert_eq!(names(&m).len(), 6);
        assert_eq!(
            load_checkpoint(m.join("checkpoint_000000002_120.json")).unwrap(),
            ckpt(2, 120, None)
        );
    }

    #[test]
    fn invalid_tensors_are_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open(dir.path(), CheckpointConfig::default()).unwrap();
        let mut c = ckpt(1, 1, None);
        c.tensors.insert("bad".into(), Tensor::f32(&[2, 2], vec![1.0; 3]));
        let err = store.save(&c).unwrap_err().to_string();
        assert!(err.contains("tensor `bad`") && err.contains("[2, 2]"), "{err}");
        assert!(names(dir.path()).is_empty());
    }
}
