//! Trajectory buffers in shared memory: the data plane between rollout workers, inference workers
//! and the learner.
//!
//! Each rollout worker owns a [`TrajectoryPool`] of `num_buffers` slots; a slot holds one
//! trajectory of `rollout` steps of one split, field by field, time-major (step `t` of env `i` at
//! `t * num_envs + i`). A trajectory is written where it will be read, never copied between
//! processes; who may touch a slot is decided by the signals that carry its index:
//! 1. a split takes a free slot when it starts a trajectory. At each step the rollout worker
//!    writes the observations at step `t` and asks for actions with the slot and the step; the
//!    inference workers read those observations and write the actions, log-probabilities, values
//!    and policy versions at the same step (with a group of workers per policy, each group its own
//!    columns); the rollout worker reads the actions, steps its
//!    envs and writes the rewards, episode ends and valid flags. After the last step it writes
//!    the next observations and emits `trajectory_ready` with the slot (the signal's queue
//!    orders every write before the batcher's reads);
//! 2. the learner trains on tensors that view the slot ([`TrajectoryPool::tensor`]); once every
//!    dataset holding part of it is trained on, the batcher emits `buffer_released` back to that
//!    worker alone, which puts the slot on its free list again. A split with no free slot waits
//!    for one (back-pressure, no polling).
//!
//! Floats and flags live in one `f32` array, policy versions in a `u64` array; one more word
//! holds the incarnation of the worker process that owns the pool, so an inference worker can
//! skip requests of a dead predecessor. Observations whose every value is a byte (images, boards,
//! masks: [`rlf_env::Space::byte_valued`]) live in a `u8` array instead, a quarter of the memory and
//! bandwidth: the rollout worker's values are stored as bytes, and the inference worker and the
//! learner read them back as floats on their side.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use rlf_shm::{ShmArray, ShmArrayHandle};

use crate::error::{Result, RlfError};

/// The shape of every slot of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrajectoryShape {
    /// Steps per trajectory.
    pub rollout: usize,
    /// Envs per split.
    pub num_envs: usize,
    /// Values per observation.
    pub obs_dim: usize,
    /// Values per raw action.
    pub action_dim: usize,
    /// Values of recurrent state per env (`--use_rnn`; 0 without).
    #[serde(default)]
    pub state_dim: usize,
    /// Values of each observation stored as bytes (the parts whose every value is a whole number in `0..=255`; the
    /// pool's [`ObsLayout`] says which); the other `obs_dim - obs_bytes` are stored as floats.
    #[serde(default)]
    pub obs_bytes: usize,
}

/// Which values of an observation row are stored as bytes: runs of `(bytes, length)` over the flat encoding, one
/// per part of the observation space (adjacent runs of a kind merged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObsLayout {
    runs: Vec<(bool, usize)>,
}

impl ObsLayout {
    /// Every value a float.
    pub fn floats(dim: usize) -> Self {
        let mut layout = Self { runs: Vec::new() };
        layout.push(false, dim);
        layout
    }

    /// The layout of `space`'s flat encoding: its byte-valued parts ([`rlf_env::Space::byte_valued`]) as bytes.
    pub fn of(space: &rlf_env::Space) -> Self {
        fn walk(space: &rlf_env::Space, layout: &mut ObsLayout) {
            match space {
                rlf_env::Space::Dict(parts) => parts.iter().for_each(|(_, s)| walk(s, layout)),
                rlf_env::Space::Tuple(parts) => parts.iter().for_each(|s| walk(s, layout)),
                s => layout.push(s.byte_valued(), s.flat_dim()),
            }
        }
        let mut layout = Self { runs: Vec::new() };
        walk(space, &mut layout);
        layout
    }

    /// The layout shared by every agent's observation space of `spaces`, as wide as `dim`; all floats when the
    /// agents' layouts differ (their rows are padded to the widest).
    pub fn common(spaces: &[rlf_env::Space], dim: usize) -> Self {
        let mut layouts = spaces.iter().map(Self::of);
        match layouts.next() {
            Some(first) if first.dim() == dim && layouts.all(|l| l == first) => first,
            _ => Self::floats(dim),
        }
    }

    fn push(&mut self, bytes: bool, len: usize) {
        match self.runs.last_mut() {
            _ if len == 0 => {}
            Some((kind, n)) if *kind == bytes => *n += len,
            _ => self.runs.push((bytes, len)),
        }
    }

    /// Values per observation.
    pub fn dim(&self) -> usize {
        self.runs.iter().map(|&(_, n)| n).sum()
    }

    /// Values per observation stored as bytes.
    pub fn bytes(&self) -> usize {
        self.runs.iter().filter(|&&(b, _)| b).map(|&(_, n)| n).sum()
    }

    /// `f32` words an observation takes packed ([`pack`](Self::pack)): a float run one word per value, a byte run
    /// four values per word.
    pub fn packed_words(&self) -> usize {
        self.runs
            .iter()
            .map(|&(bytes, n)| if bytes { n.div_ceil(4) } else { n })
            .sum()
    }

    /// Packs the observation `values` (`dim` of them) into `out` (`packed_words` words): float runs as they are,
    /// byte runs four to a word, little-endian, as the word's bits (a copy keeps a float's bits, whatever they
    /// are). Words that hold only zero bytes are `0.0`.
    pub fn pack(&self, values: &[f32], out: &mut [f32]) {
        let (mut at, mut to) = (0, 0);
        for &(bytes, n) in &self.runs {
            let run = &values[at..at + n];
            if bytes {
                for (word, chunk) in out[to..to + n.div_ceil(4)].iter_mut().zip(run.chunks(4)) {
                    let mut b = [0u8; 4];
                    for (byte, &v) in b.iter_mut().zip(chunk) {
                        *byte = v as u8;
                    }
                    *word = f32::from_bits(u32::from_le_bytes(b));
                }
                to += n.div_ceil(4);
            } else {
                out[to..to + n].copy_from_slice(run);
                to += n;
            }
            at += n;
        }
    }

    /// The observation values of `words` packed by [`pack`](Self::pack), into `out` (`dim` values).
    pub fn unpack(&self, words: &[f32], out: &mut [f32]) {
        let (mut at, mut from) = (0, 0);
        for &(bytes, n) in &self.runs {
            let run = &mut out[at..at + n];
            if bytes {
                for (chunk, word) in run.chunks_mut(4).zip(&words[from..from + n.div_ceil(4)]) {
                    for (v, b) in chunk.iter_mut().zip(word.to_bits().to_le_bytes()) {
                        *v = f32::from(b);
                    }
                }
                from += n.div_ceil(4);
            } else {
                run.copy_from_slice(&words[from..from + n]);
                from += n;
            }
            at += n;
        }
    }
}

/// A field of a trajectory slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Observations before each step (rollout worker).
    Obs,
    /// Raw actions (inference worker).
    Actions,
    /// Log-probabilities of the actions (inference worker).
    LogProbs,
    /// Values of the observations (inference worker).
    Values,
    /// Rewards (rollout worker).
    Rewards,
    /// 1 where the step ended its episode in a terminal state (rollout worker).
    Terminated,
    /// 1 where the step ended its episode by truncation (rollout worker).
    Truncated,
    /// 1 where the step is the agent's own experience, 0 where it only fills the slot (rollout
    /// worker). Every step of a single-agent env is valid; an agent of a multi-agent env is not
    /// while it is inactive. The learner masks invalid steps out of every loss.
    Valid,
    /// 1 where [`Field::FinalObs`] holds the episode's last observation (rollout worker).
    HasFinal,
    /// The last observation of an episode that ended at the step (rollout worker).
    FinalObs,
    /// Observations after the last step, one per env, no time axis (rollout worker).
    NextObs,
    /// 1 where the env's agent acts in the step after the last (its [`Field::NextObs`] is a
    /// decision point: always for a single-agent env), one per env, no time axis (rollout worker).
    NextValid,
    /// The policy controlling the column's agent at the step (rollout worker, with several
    /// policies; all 0 with one).
    Policy,
    /// The recurrent state each env's step starts from (`--use_rnn`; no values without): the
    /// inference worker writes the state after step `t` at step `t + 1`, and the rollout worker
    /// zeroes it when step `t` ended the env's episode, so the learner can start backpropagation
    /// through time at any step from what acting used.
    States,
    /// The recurrent state after the last step, one per env, no time axis (as [`Field::States`]);
    /// the rollout worker carries it into the split's next slot.
    NextStates,
}

impl Field {
    /// Whether the field holds observations.
    pub fn is_observation(self) -> bool {
        matches!(self, Field::Obs | Field::FinalObs | Field::NextObs)
    }

    /// Whether the field holds one value per env after the last step (no time axis).
    pub fn is_after_last_step(self) -> bool {
        matches!(self, Field::NextObs | Field::NextValid | Field::NextStates)
    }

    const ALL: [Field; 15] = [
        Field::Obs,
        Field::Actions,
        Field::LogProbs,
        Field::Values,
        Field::Rewards,
        Field::Terminated,
        Field::Truncated,
        Field::Valid,
        Field::HasFinal,
        Field::FinalObs,
        Field::NextObs,
        Field::NextValid,
        Field::Policy,
        Field::States,
        Field::NextStates,
    ];
}

impl TrajectoryShape {
    fn steps(&self) -> usize {
        self.rollout * self.num_envs
    }

    /// Values per env per step of `field`.
    pub fn width(&self, field: Field) -> usize {
        match field {
            Field::Obs | Field::FinalObs | Field::NextObs => self.obs_dim,
            Field::Actions => self.action_dim,
            Field::States | Field::NextStates => self.state_dim,
            _ => 1,
        }
    }

    /// Steps of `field` (its time axis; 1 for [`Field::NextObs`] and [`Field::NextValid`]).
    fn field_steps(&self, field: Field) -> usize {
        if field.is_after_last_step() {
            1
        } else {
            self.rollout
        }
    }

    /// Values per env per step of `field` in the byte array (`bytes`) or in the float array.
    fn stored_width(&self, field: Field, bytes: bool) -> usize {
        match (field.is_observation(), bytes) {
            (true, true) => self.obs_bytes,
            (true, false) => self.obs_dim - self.obs_bytes,
            (false, true) => 0,
            (false, false) => self.width(field),
        }
    }

    fn stored_len(&self, field: Field, bytes: bool) -> usize {
        self.field_steps(field) * self.num_envs * self.stored_width(field, bytes)
    }

    /// Bytes of one slot (its values and policy versions).
    pub fn slot_bytes(&self) -> usize {
        self.floats() * std::mem::size_of::<f32>() + self.bytes() + self.steps() * std::mem::size_of::<u64>()
    }

    /// Bytes per env (column) per step of a slot: the observation, the actions, the recurrent state and the
    /// one-value fields.
    pub fn step_bytes(&self) -> usize {
        self.slot_bytes() / (self.rollout * self.num_envs).max(1)
    }

    /// Offset of `field` within a slot's part of the byte array (`bytes`) or of the float array.
    fn field_offset(&self, field: Field, bytes: bool) -> usize {
        Field::ALL
            .iter()
            .take_while(|&&f| f != field)
            .map(|&f| self.stored_len(f, bytes))
            .sum()
    }

    /// Values of the fields stored in the byte array (`bytes`) or in the float array.
    fn len_in(&self, bytes: bool) -> usize {
        Field::ALL.iter().map(|&f| self.stored_len(f, bytes)).sum()
    }

    /// `f32` values per slot.
    fn floats(&self) -> usize {
        self.len_in(false)
    }

    /// `u8` values per slot.
    fn bytes(&self) -> usize {
        self.len_in(true)
    }
}

/// Serialisable description of a [`TrajectoryPool`], for the other processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrajectoryPoolHandle {
    shape: TrajectoryShape,
    layout: ObsLayout,
    num_buffers: usize,
    floats: ShmArrayHandle,
    bytes: ShmArrayHandle,
    versions: ShmArrayHandle,
}

/// A copy of one slot ([`TrajectoryPool::read_slot`]), for a pool of the same shape on another machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotCopy {
    /// The fields stored as floats.
    #[serde(with = "super::byte_strings::floats")]
    pub floats: Vec<f32>,
    /// The fields stored as bytes (observations of byte values; empty otherwise).
    #[serde(with = "super::byte_strings::bytes")]
    pub bytes: Vec<u8>,
    /// The policy version of every step.
    pub versions: Vec<u64>,
}

/// `num_buffers` trajectory slots of one rollout worker.
#[derive(Debug)]
pub struct TrajectoryPool {
    shape: TrajectoryShape,
    layout: ObsLayout,
    num_buffers: usize,
    floats: ShmArray<f32>,
    /// The observation values stored as bytes ([`TrajectoryShape::obs_bytes`]; empty without).
    bytes: ShmArray<u8>,
    /// Policy versions of every slot, then the owner's incarnation.
    versions: ShmArray<u64>,
}

/// Values converted between floats and bytes per chunk (a stack buffer: no allocation per step).
const CHUNK: usize = 4096;

impl TrajectoryPool {
    /// A pool of `num_buffers` zero-filled slots of `shape`, whose observations are all bytes
    /// (`shape.obs_bytes == shape.obs_dim`) or all floats (`shape.obs_bytes == 0`).
    pub fn create(shape: TrajectoryShape, num_buffers: usize) -> Result<Self> {
        let uniform = if shape.obs_bytes == 0 {
            ObsLayout::floats(shape.obs_dim)
        } else {
            ObsLayout {
                runs: vec![(true, shape.obs_dim)],
            }
        };
        Self::with_layout(shape, uniform, num_buffers)
    }

    /// A pool of `num_buffers` zero-filled slots of `shape` whose observations are laid out as `layout` says.
    pub fn with_layout(shape: TrajectoryShape, layout: ObsLayout, num_buffers: usize) -> Result<Self> {
        if layout.dim() != shape.obs_dim || layout.bytes() != shape.obs_bytes {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: format!(
                    "an observation layout of {} values ({} bytes) for slots of {} ({} bytes)",
                    layout.dim(),
                    layout.bytes(),
                    shape.obs_dim,
                    shape.obs_bytes
                ),
            });
        }
        Ok(Self {
            shape,
            layout,
            num_buffers,
            floats: ShmArray::create(shape.floats() * num_buffers)?,
            bytes: ShmArray::create(shape.bytes() * num_buffers)?,
            versions: ShmArray::create(shape.steps() * num_buffers + 1)?,
        })
    }

    /// Maps a pool created by another process.
    pub fn open(handle: &TrajectoryPoolHandle) -> Result<Self> {
        let pool = Self {
            shape: handle.shape,
            layout: handle.layout.clone(),
            num_buffers: handle.num_buffers,
            floats: ShmArray::open(&handle.floats)?,
            bytes: ShmArray::open(&handle.bytes)?,
            versions: ShmArray::open(&handle.versions)?,
        };
        if pool.layout.dim() != pool.shape.obs_dim
            || pool.layout.bytes() != pool.shape.obs_bytes
            || pool.floats.len() < handle.shape.floats() * handle.num_buffers
            || pool.bytes.len() < handle.shape.bytes() * handle.num_buffers
            || pool.versions.len() < handle.shape.steps() * handle.num_buffers + 1
        {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: "the shared arrays are smaller than the pool's shape".into(),
            });
        }
        Ok(pool)
    }

    /// The handle to pass to other processes.
    pub fn handle(&self) -> TrajectoryPoolHandle {
        TrajectoryPoolHandle {
            shape: self.shape,
            layout: self.layout.clone(),
            num_buffers: self.num_buffers,
            floats: self.floats.handle(),
            bytes: self.bytes.handle(),
            versions: self.versions.handle(),
        }
    }

    /// Slots in the pool.
    pub fn num_buffers(&self) -> usize {
        self.num_buffers
    }

    /// The shape of every slot.
    pub fn shape(&self) -> TrajectoryShape {
        self.shape
    }

    /// Where step `t` of `field` in slot `buffer` starts in the float array and in the byte array, if both exist
    /// and `len` values fit the step.
    fn range(&self, buffer: usize, field: Field, t: usize, len: usize) -> Result<(usize, usize)> {
        let sh = &self.shape;
        let per_step = sh.num_envs * sh.width(field);
        if buffer >= self.num_buffers || t >= sh.field_steps(field) || len != per_step {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: format!(
                    "slot {buffer} of {}, {field:?} at step {t}: {len} values do not fit (a step holds {per_step})",
                    self.num_buffers
                ),
            });
        }
        let at = |bytes: bool| {
            let slot = if bytes { sh.bytes() } else { sh.floats() };
            buffer * slot + sh.field_offset(field, bytes) + t * sh.num_envs * sh.stored_width(field, bytes)
        };
        Ok((at(false), at(true)))
    }

    /// Whether `field` has values in both arrays or in the byte array only (observations with bytes).
    fn split(&self, field: Field) -> bool {
        field.is_observation() && self.shape.obs_bytes > 0
    }

    /// Writes step `t` of `field` (every env of the split) in slot `buffer`. Observation values stored as bytes
    /// are narrowed (they are whole numbers in `0..=255`).
    pub fn put(&self, buffer: usize, field: Field, t: usize, values: &[f32]) -> Result<()> {
        let (mut f, mut b) = self.range(buffer, field, t, values.len())?;
        if !self.split(field) {
            self.floats.copy_from_slice(f, values);
            return Ok(());
        }
        let mut chunk = [0u8; CHUNK];
        for row in values.chunks_exact(self.shape.obs_dim) {
            let mut x = 0;
            for &(bytes, len) in &self.layout.runs {
                let part = &row[x..x + len];
                if bytes {
                    for (i, piece) in part.chunks(CHUNK).enumerate() {
                        for (c, &v) in chunk.iter_mut().zip(piece) {
                            *c = v as u8;
                        }
                        self.bytes.copy_from_slice(b + i * CHUNK, &chunk[..piece.len()]);
                    }
                    b += len;
                } else {
                    self.floats.copy_from_slice(f, part);
                    f += len;
                }
                x += len;
            }
        }
        Ok(())
    }

    /// Writes the columns `columns` of step `t` of `field` in slot `buffer` (each column's values in turn in
    /// `values`) and leaves the others as they are: an inference worker of one policy writes its agents' results
    /// beside another policy's worker. Not for observations.
    pub fn put_columns(
        &self,
        buffer: usize,
        field: Field,
        t: usize,
        columns: &[usize],
        values: &[f32],
    ) -> Result<()> {
        let sh = &self.shape;
        let (f, _) = self.range(buffer, field, t, sh.num_envs * sh.width(field))?;
        let w = sh.width(field);
        if self.split(field) || values.len() != columns.len() * w || columns.iter().any(|&c| c >= sh.num_envs)
        {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: format!(
                    "{field:?} of columns {columns:?} of {}: {} values do not fit",
                    sh.num_envs,
                    values.len()
                ),
            });
        }
        for (&c, part) in columns.iter().zip(values.chunks_exact(w.max(1))) {
            self.floats.copy_from_slice(f + c * w, part);
        }
        Ok(())
    }

    /// Reads step `t` of `field` (every env of the split) of slot `buffer` into `out` (observation values stored
    /// as bytes come back as floats).
    pub fn get(&self, buffer: usize, field: Field, t: usize, out: &mut [f32]) -> Result<()> {
        let (mut f, mut b) = self.range(buffer, field, t, out.len())?;
        if !self.split(field) {
            self.floats.copy_to_slice(f, out);
            return Ok(());
        }
        let mut chunk = [0u8; CHUNK];
        for row in out.chunks_exact_mut(self.shape.obs_dim) {
            let mut x = 0;
            for &(bytes, len) in &self.layout.runs {
                let part = &mut row[x..x + len];
                if bytes {
                    for (i, piece) in part.chunks_mut(CHUNK).enumerate() {
                        let read = &mut chunk[..piece.len()];
                        self.bytes.copy_to_slice(b + i * CHUNK, read);
                        for (v, &c) in piece.iter_mut().zip(read.iter()) {
                            *v = f32::from(c);
                        }
                    }
                    b += len;
                } else {
                    self.floats.copy_to_slice(f, part);
                    f += len;
                }
                x += len;
            }
        }
        Ok(())
    }

    /// Records that `version` chose the actions of step `t` of slot `buffer`.
    pub fn put_version(&self, buffer: usize, t: usize, version: u64) -> Result<()> {
        let n = self.shape.num_envs;
        self.range(buffer, Field::LogProbs, t, n)?;
        let at = (buffer * self.shape.rollout + t) * n;
        self.versions.copy_from_slice(at, &vec![version; n]);
        Ok(())
    }

    /// Records the policy version that chose each column's action of step `t` of slot `buffer`
    /// (one version per column).
    pub fn put_versions(&self, buffer: usize, t: usize, versions: &[u64]) -> Result<()> {
        let n = self.shape.num_envs;
        self.range(buffer, Field::LogProbs, t, versions.len())?;
        self.versions
            .copy_from_slice((buffer * self.shape.rollout + t) * n, versions);
        Ok(())
    }

    /// Records the policy version that chose the action of each of the columns `columns` of step `t` of slot
    /// `buffer`, and leaves the others' as they are.
    pub fn put_column_versions(
        &self,
        buffer: usize,
        t: usize,
        columns: &[usize],
        versions: &[u64],
    ) -> Result<()> {
        let n = self.shape.num_envs;
        self.range(buffer, Field::LogProbs, t, n)?;
        if versions.len() != columns.len() || columns.iter().any(|&c| c >= n) {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: format!("versions of columns {columns:?} of {n}: {} given", versions.len()),
            });
        }
        let at = (buffer * self.shape.rollout + t) * n;
        for (&c, &v) in columns.iter().zip(versions) {
            self.versions.copy_from_slice(at + c, &[v]);
        }
        Ok(())
    }

    /// The policy version of every step of slot `buffer`, time-major.
    pub fn versions(&self, buffer: usize) -> Result<Vec<u64>> {
        self.range(buffer, Field::LogProbs, 0, self.shape.num_envs)?;
        let s = self.shape.steps();
        let mut out = vec![0; s];
        self.versions.copy_to_slice(buffer * s, &mut out);
        Ok(out)
    }

    /// Records the incarnation of the worker process that now owns the pool.
    pub fn set_owner(&self, incarnation: u32) {
        self.versions
            .copy_from_slice(self.shape.steps() * self.num_buffers, &[u64::from(incarnation)]);
    }

    /// The incarnation of the worker process that owns the pool.
    pub fn owner(&self) -> u64 {
        let mut w = [0];
        self.versions
            .copy_to_slice(self.shape.steps() * self.num_buffers, &mut w);
        w[0]
    }

    /// A copy of slot `buffer`: its values (every field) and its steps' policy versions, for another machine's
    /// pool of the same shape ([`TrajectoryPool::write_slot`]).
    pub fn read_slot(&self, buffer: usize) -> Result<SlotCopy> {
        let versions = self.versions(buffer)?;
        let (nf, nb) = (self.shape.floats(), self.shape.bytes());
        let mut floats = vec![0.0; nf];
        self.floats.copy_to_slice(buffer * nf, &mut floats);
        let mut bytes = vec![0; nb];
        self.bytes.copy_to_slice(buffer * nb, &mut bytes);
        Ok(SlotCopy {
            floats,
            bytes,
            versions,
        })
    }

    /// Writes a copy made by [`TrajectoryPool::read_slot`] into slot `buffer`.
    pub fn write_slot(&self, buffer: usize, copy: &SlotCopy) -> Result<()> {
        let (nf, nb, s) = (self.shape.floats(), self.shape.bytes(), self.shape.steps());
        if buffer >= self.num_buffers
            || copy.floats.len() != nf
            || copy.bytes.len() != nb
            || copy.versions.len() != s
        {
            return Err(RlfError::Protocol {
                component: "trajectory pool",
                message: format!(
                    "a copied slot of {} values, {} bytes and {} versions does not fit slot {buffer} of {} ({nf} values, {nb} bytes, {s} versions)",
                    copy.floats.len(),
                    copy.bytes.len(),
                    copy.versions.len(),
                    self.num_buffers
                ),
            });
        }
        self.floats.copy_from_slice(buffer * nf, &copy.floats);
        self.bytes.copy_from_slice(buffer * nb, &copy.bytes);
        self.versions.copy_from_slice(buffer * s, &copy.versions);
        Ok(())
    }

    /// A tensor of `field` of slot `buffer`: `[rollout, num_envs, width]` (`[num_envs, width]` for the fields
    /// after the last step). It views the slot without a copy, of `f32`, or of `u8` for observations stored as
    /// bytes; observations of both kinds come as a new `f32` tensor, their parts put back in order. The pool must
    /// live for the rest of the process (`Box::leak`), since a view does not keep it mapped.
    pub fn tensor(&'static self, buffer: usize, field: Field) -> Result<Tensor> {
        let sh = &self.shape;
        let (f, b) = self.range(buffer, field, 0, sh.num_envs * sh.width(field))?;
        let shape = |width: usize| -> Vec<i64> {
            let dims = [sh.num_envs as i64, width as i64];
            if field.is_after_last_step() {
                dims.to_vec()
            } else {
                [&[sh.rollout as i64][..], &dims].concat()
            }
        };
        if !self.split(field) {
            return Ok(self.floats.tensor(f, &shape(sh.width(field)))?);
        }
        let bytes = self.bytes.tensor(b, &shape(sh.obs_bytes))?;
        if sh.obs_bytes == sh.obs_dim {
            return Ok(bytes);
        }
        let floats = self.floats.tensor(f, &shape(sh.obs_dim - sh.obs_bytes))?;
        let last = bytes.dim() as i64 - 1;
        let (mut x_f, mut x_b) = (0, 0);
        let mut parts = Vec::with_capacity(self.layout.runs.len());
        for &(is_bytes, len) in &self.layout.runs {
            let len = len as i64;
            parts.push(if is_bytes {
                x_b += len;
                bytes
                    .f_narrow(last, x_b - len, len)?
                    .f_to_kind(tch::Kind::Float)?
            } else {
                x_f += len;
                floats.f_narrow(last, x_f - len, len)?
            });
        }
        Ok(Tensor::f_cat(&parts, last)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: TrajectoryShape = TrajectoryShape {
        rollout: 3,
        num_envs: 2,
        obs_dim: 4,
        action_dim: 1,
        state_dim: 0,
        obs_bytes: 0,
    };

    #[test]
    fn steps_written_by_one_mapping_are_read_and_viewed_through_another() {
        let pool = TrajectoryPool::create(SHAPE, 2).unwrap();
        let other: &'static TrajectoryPool =
            Box::leak(Box::new(TrajectoryPool::open(&pool.handle()).unwrap()));
        let view = other.tensor(1, Field::Obs).unwrap();
        for t in 0..3 {
            let obs: Vec<f32> = (0..8).map(|i| (t * 8 + i) as f32).collect();
            pool.put(1, Field::Obs, t, &obs).unwrap();
            pool.put(1, Field::Rewards, t, &[t as f32, 1.0]).unwrap();
            pool.put_version(1, t, 10 + t as u64).unwrap();
        }
        pool.put(1, Field::NextObs, 0, &[9.0; 8]).unwrap();
        pool.put(1, Field::Policy, 2, &[1.0, 0.0]).unwrap();
        let mut rewards = [0.0; 2];
        other.get(1, Field::Rewards, 2, &mut rewards).unwrap();
        assert_eq!(rewards, [2.0, 1.0]);
        assert_eq!(view.size(), [3, 2, 4]);
        assert_eq!(view.double_value(&[2, 1, 3]), 23.0);
        assert_eq!(other.tensor(1, Field::NextObs).unwrap().size(), [2, 4]);
        assert_eq!(other.versions(1).unwrap(), [10, 10, 11, 11, 12, 12]);
        other.put_versions(1, 1, &[20, 21]).unwrap();
        assert_eq!(pool.versions(1).unwrap(), [10, 10, 20, 21, 12, 12]);
        let mut policies = [0.0; 2];
        other.get(1, Field::Policy, 2, &mut policies).unwrap();
        assert_eq!(policies, [1.0, 0.0]);
        // Slot 0 is untouched by slot 1's writes.
        assert_eq!(
            other
                .tensor(0, Field::Obs)
                .unwrap()
                .abs()
                .sum(tch::Kind::Float)
                .double_value(&[]),
            0.0
        );
        pool.set_owner(3);
        assert_eq!(other.owner(), 3);
        // A slot copied into another pool of the same shape reads back the same.
        let slot = pool.read_slot(1).unwrap();
        let copy = TrajectoryPool::create(SHAPE, 3).unwrap();
        copy.write_slot(2, &slot).unwrap();
        assert_eq!(copy.read_slot(2).unwrap(), slot);
        assert_eq!(copy.versions(2).unwrap(), [10, 10, 20, 21, 12, 12]);
        copy.get(2, Field::Rewards, 2, &mut rewards).unwrap();
        assert_eq!(rewards, [2.0, 1.0]);
        assert!(copy.write_slot(3, &slot).is_err());
        let mut short = slot.clone();
        short.floats.pop();
        assert!(copy.write_slot(0, &short).is_err());
    }

    #[test]
    fn byte_observations_round_trip_through_the_slots_unchanged() {
        // Two 84x84x4 frame stacks per step: more than one conversion chunk per put and get.
        let shape = TrajectoryShape {
            rollout: 2,
            num_envs: 2,
            obs_dim: 84 * 84 * 4,
            action_dim: 1,
            state_dim: 0,
            obs_bytes: 84 * 84 * 4,
        };
        let floats = TrajectoryShape {
            obs_bytes: 0,
            ..shape
        };
        // Obs and FinalObs (2 steps x 2 envs each) and NextObs (2 envs): 10 observations, 3 bytes fewer per value.
        assert_eq!(floats.slot_bytes() - shape.slot_bytes(), 3 * 10 * shape.obs_dim);
        let pool = TrajectoryPool::create(shape, 2).unwrap();
        let other: &'static TrajectoryPool =
            Box::leak(Box::new(TrajectoryPool::open(&pool.handle()).unwrap()));
        let n = 2 * shape.obs_dim;
        let frames: Vec<Vec<f32>> = (0..3)
            .map(|k| (0..n).map(|i| ((i * 7 + k * 31) % 256) as f32).collect())
            .collect();
        pool.put(1, Field::Obs, 0, &frames[0]).unwrap();
        pool.put(1, Field::Obs, 1, &frames[1]).unwrap();
        pool.put(1, Field::NextObs, 0, &frames[2]).unwrap();
        pool.put(1, Field::Rewards, 1, &[0.5, -2.25]).unwrap();
        let mut back = vec![0.0; n];
        for (field, t, frame) in [(Field::Obs, 0, 0), (Field::Obs, 1, 1), (Field::NextObs, 0, 2)] {
            other.get(1, field, t, &mut back).unwrap();
            assert_eq!(back, frames[frame], "{field:?} at {t}");
        }
        let mut rewards = [0.0; 2];
        other.get(1, Field::Rewards, 1, &mut rewards).unwrap();
        assert_eq!(rewards, [0.5, -2.25]);
        // The learner's view is of bytes, with the same values.
        let view = other.tensor(1, Field::Obs).unwrap();
        assert_eq!(view.kind(), tch::Kind::Uint8);
        assert_eq!(view.size(), [2, 2, shape.obs_dim as i64]);
        let expected =
            Tensor::from_slice(&[frames[0].clone(), frames[1].clone()].concat()).reshape([2, 2, -1]);
        assert!(view.to_kind(tch::Kind::Float).equal(&expected));
        assert_eq!(other.tensor(1, Field::Rewards).unwrap().kind(), tch::Kind::Float);
        // Slot 0 is untouched, and a copy carries the bytes.
        assert_eq!(other.tensor(0, Field::Obs).unwrap().max().int64_value(&[]), 0);
        let copy = TrajectoryPool::create(shape, 1).unwrap();
        copy.write_slot(0, &pool.read_slot(1).unwrap()).unwrap();
        copy.get(0, Field::NextObs, 0, &mut back).unwrap();
        assert_eq!(back, frames[2]);
    }

    /// Replay rows pack an observation's byte runs four to a word: every byte value, including the patterns that
    /// are NaNs as floats (`7f c0 00 00`, a signalling `7f 80 00 01`), comes back through a replay ring in shared
    /// memory, and a run that is not whole words is padded with zero bytes.
    #[test]
    fn byte_runs_pack_four_to_a_word_and_unpack_unchanged_through_a_replay_ring() {
        let layout = ObsLayout {
            runs: vec![(true, 8), (false, 2), (true, 255)],
        };
        assert_eq!((layout.dim(), layout.packed_words()), (265, 2 + 2 + 64));
        let obs: Vec<f32> = [
            vec![0.0, 0.0, 192.0, 127.0, 1.0, 0.0, 128.0, 127.0],
            vec![-1.5, f32::MAX],
            (1..256).rev().map(|b| b as f32).collect(),
        ]
        .concat();
        let mut packed = vec![0.0; layout.packed_words()];
        layout.pack(&obs, &mut packed);
        assert!(packed[0].is_nan(), "the bytes 00 00 c0 7f are a NaN's");
        assert_eq!(packed[1].to_bits(), 0x7f80_0001, "a signalling NaN's");
        assert!(packed[1].is_nan());
        assert_eq!(&packed[2..4], &[-1.5, f32::MAX]);
        assert_eq!(
            packed[67].to_bits(),
            u32::from_le_bytes([3, 2, 1, 0]),
            "the last word padded with a zero"
        );
        let ring = rlf_shm::ReplayRing::create(4, packed.len(), None).unwrap();
        let other = rlf_shm::ReplayRing::open(&ring.handle()).unwrap();
        ring.insert(&packed, None).unwrap();
        let mut read = vec![0.0; packed.len()];
        other.read(0, &mut read).unwrap();
        let bits = |v: &[f32]| v.iter().map(|w| w.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&read), bits(&packed));
        let mut back = vec![-7.0; layout.dim()];
        layout.unpack(&read, &mut back);
        assert_eq!(back, obs);
        let floats = ObsLayout::floats(3);
        assert_eq!(floats.packed_words(), 3);
    }

    #[test]
    fn a_dict_keeps_its_byte_parts_as_bytes_and_its_float_parts_as_floats() {
        use rlf_env::{BoxSpace, Space};
        let image = BoxSpace::uniform(0.0, 255.0, vec![2, 3])
            .unwrap()
            .into_bytes()
            .unwrap();
        let space = Space::Dict(vec![
            ("image".to_owned(), Space::Box(image)),
            (
                "vector".to_owned(),
                Space::Box(BoxSpace::uniform(-1.0, 1.0, vec![2]).unwrap()),
            ),
            ("mask".to_owned(), Space::MultiDiscrete(vec![2, 2, 2])),
        ]);
        let layout = ObsLayout::of(&space);
        assert_eq!(layout.runs, [(true, 6), (false, 2), (true, 3)]);
        assert_eq!(ObsLayout::common(&[space.clone(), space.clone()], 11), layout);
        assert_eq!(
            ObsLayout::common(&[space, Space::discrete(3)], 11),
            ObsLayout::floats(11)
        );
        let shape = TrajectoryShape {
            rollout: 2,
            num_envs: 2,
            obs_dim: 11,
            action_dim: 1,
            state_dim: 0,
            obs_bytes: 9,
        };
        assert!(TrajectoryPool::with_layout(shape, ObsLayout::floats(11), 1).is_err());
        let pool = TrajectoryPool::with_layout(shape, layout, 1).unwrap();
        let other: &'static TrajectoryPool =
            Box::leak(Box::new(TrajectoryPool::open(&pool.handle()).unwrap()));
        let row = |k: f32| -> Vec<f32> {
            [
                (0..6).map(|i| 40.0 * i as f32 + k).collect::<Vec<_>>(),
                vec![-0.25 * k, 0.5],
                vec![1.0, 0.0, k.min(1.0)],
            ]
            .concat()
        };
        let step: Vec<f32> = [row(1.0), row(2.0)].concat();
        pool.put(0, Field::Obs, 1, &step).unwrap();
        pool.put(0, Field::NextObs, 0, &step).unwrap();
        let mut back = vec![0.0; 22];
        other.get(0, Field::Obs, 1, &mut back).unwrap();
        assert_eq!(back, step);
        // 9 bytes and 2 floats per observation in the slot.
        assert_eq!(
            shape.slot_bytes(),
            TrajectoryShape {
                obs_bytes: 0,
                ..shape
            }
            .slot_bytes()
                - 3 * 9 * 10
        );
        let view = other.tensor(0, Field::Obs).unwrap();
        assert_eq!((view.kind(), view.size()), (tch::Kind::Float, vec![2, 2, 11]));
        assert!(view.get(1).equal(&Tensor::from_slice(&step).reshape([2, 11])));
        assert!(view
            .get(0)
            .equal(&Tensor::zeros([2, 11], (tch::Kind::Float, tch::Device::Cpu))));
        let next = other.tensor(0, Field::NextObs).unwrap();
        assert!(next.equal(&Tensor::from_slice(&step).reshape([2, 11])));
    }

    #[test]
    fn out_of_range_slots_steps_and_sizes_are_errors() {
        let pool = TrajectoryPool::create(SHAPE, 2).unwrap();
        assert!(pool.put(2, Field::Obs, 0, &[0.0; 8]).is_err());
        assert!(pool.put(0, Field::Obs, 3, &[0.0; 8]).is_err());
        assert!(pool.put(0, Field::Obs, 0, &[0.0; 7]).is_err());
        assert!(pool.put(0, Field::NextObs, 1, &[0.0; 8]).is_err());
        assert!(pool.put_version(0, 3, 1).is_err());
        assert!(pool.put_versions(0, 0, &[1]).is_err());
        assert!(pool.versions(2).is_err());
    }
}
