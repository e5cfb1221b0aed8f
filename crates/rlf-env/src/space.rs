//! Observation and action spaces, owned sample values, and the borrowed [`Action`] a rollout worker
//! hands to an env.
//!
//! # Flat encoding
//! Observations travel as flat `f32` buffers. A space's [`Space::flat_dim`] is the number of `f32`
//! slots its flat encoding takes:
//! - `Discrete`: one slot holding the value itself (not one-hot; encoders one-hot it if they want);
//! - `Box`: the product of its shape, row-major;
//! - `MultiDiscrete`: one slot per component;
//! - `Dict` and `Tuple`: their parts' encodings concatenated, in the space's order.

use std::fmt;

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use crate::EnvError;

/// A box in `R^n`: per-element bounds (which may be infinite) and a shape. Values are `f32`; a box of
/// bytes ([`BoxSpace::bytes`]: Gymnasium's `uint8` images, `bool` and small-integer grids) holds whole
/// numbers in `0..=255` only, which the trajectory slots keep as one byte each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "WrittenBox", into = "WrittenBox")]
pub struct BoxSpace {
    pub(crate) low: Vec<f32>,
    pub(crate) high: Vec<f32>,
    pub(crate) shape: Vec<usize>,
    pub(crate) bytes: bool,
}

/// A box as it is written between processes (JSON): bounds that are all alike once, infinite bounds as `"inf"` and
/// `"-inf"` (JSON has no infinity). An image's box is a few bytes, not one number per pixel.
#[derive(Serialize, Deserialize)]
struct WrittenBox {
    low: WrittenBounds,
    high: WrittenBounds,
    shape: Vec<usize>,
    bytes: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum WrittenBounds {
    Alike(WrittenBound),
    Each(Vec<WrittenBound>),
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(untagged)]
enum WrittenBound {
    Finite(f32),
    Infinite(Infinity),
}

#[derive(Clone, Copy, Serialize, Deserialize)]
enum Infinity {
    #[serde(rename = "inf")]
    Plus,
    #[serde(rename = "-inf")]
    Minus,
}

impl WrittenBounds {
    fn of(values: &[f32]) -> Self {
        let bound = |v: f32| match v {
            f32::INFINITY => WrittenBound::Infinite(Infinity::Plus),
            f32::NEG_INFINITY => WrittenBound::Infinite(Infinity::Minus),
            v => WrittenBound::Finite(v),
        };
        match values.split_first() {
            Some((&first, rest)) if rest.iter().all(|v| v.to_bits() == first.to_bits()) => {
                Self::Alike(bound(first))
            }
            _ => Self::Each(values.iter().map(|&v| bound(v)).collect()),
        }
    }

    fn values(self, size: usize) -> Vec<f32> {
        let value = |b: WrittenBound| match b {
            WrittenBound::Finite(v) => v,
            WrittenBound::Infinite(Infinity::Plus) => f32::INFINITY,
            WrittenBound::Infinite(Infinity::Minus) => f32::NEG_INFINITY,
        };
        match self {
            Self::Alike(b) => vec![value(b); size],
            Self::Each(each) => each.into_iter().map(value).collect(),
        }
    }
}

impl From<BoxSpace> for WrittenBox {
    fn from(b: BoxSpace) -> Self {
        Self {
            low: WrittenBounds::of(&b.low),
            high: WrittenBounds::of(&b.high),
            shape: b.shape,
            bytes: b.bytes,
        }
    }
}

impl TryFrom<WrittenBox> for BoxSpace {
    type Error = EnvError;

    fn try_from(w: WrittenBox) -> Result<Self, EnvError> {
        let size = w.shape.iter().product();
        let b = BoxSpace::new(w.low.values(size), w.high.values(size), w.shape)?;
        if w.bytes {
            b.into_bytes()
        } else {
            Ok(b)
        }
    }
}

impl BoxSpace {
    /// A box with per-element bounds. `low`, `high` and the product of `shape` must agree, bounds
    /// must not be NaN and `low <= high` element-wise.
    pub fn new(low: Vec<f32>, high: Vec<f32>, shape: Vec<usize>) -> Result<Self, EnvError> {
        let size: usize = shape.iter().product();
        if low.len() != size || high.len() != size {
            return Err(EnvError::InvalidSpace(format!(
                "Box of shape {shape:?} needs {size} bounds, got {} low and {} high",
                low.len(),
                high.len()
            )));
        }
        if let Some(i) = (0..size).find(|&i| low[i].is_nan() || high[i].is_nan() || low[i] > high[i]) {
            return Err(EnvError::InvalidSpace(format!(
                "Box bound {i}: low {} and high {} are not an interval",
                low[i], high[i]
            )));
        }
        Ok(Self {
            low,
            high,
            shape,
            bytes: false,
        })
    }

    /// This box as a box of bytes: its values are whole numbers in `0..=255`. Errors if a bound is
    /// not a whole number in that range.
    pub fn into_bytes(mut self) -> Result<Self, EnvError> {
        let byte = |x: f32| (0.0..=255.0).contains(&x) && x.fract() == 0.0;
        if let Some(i) = (0..self.size()).find(|&i| !byte(self.low[i]) || !byte(self.high[i])) {
            return Err(EnvError::InvalidSpace(format!(
                "a Box of bytes needs whole bounds in 0..=255; bound {i} is {}..{}",
                self.low[i], self.high[i]
            )));
        }
        self.bytes = true;
        Ok(self)
    }

    /// Whether the values are bytes (see [`BoxSpace::into_bytes`]).
    pub fn bytes(&self) -> bool {
        self.bytes
    }

    /// A box with the same bounds for every element.
    pub fn uniform(low: f32, high: f32, shape: Vec<usize>) -> Result<Self, EnvError> {
        let size = shape.iter().product();
        Self::new(vec![low; size], vec![high; size], shape)
    }

    /// Lower bounds, one per element.
    pub fn low(&self) -> &[f32] {
        &self.low
    }

    /// Upper bounds, one per element.
    pub fn high(&self) -> &[f32] {
        &self.high
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn size(&self) -> usize {
        self.low.len()
    }

    /// Whether `x` has the right length and every element lies within the bounds (and is a whole
    /// number in a box of bytes).
    pub fn contains(&self, x: &[f32]) -> bool {
        x.len() == self.size()
            && x.iter()
                .zip(self.low.iter().zip(&self.high))
                .all(|(v, (lo, hi))| lo <= v && v <= hi && (!self.bytes || v.fract() == 0.0))
    }

    fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Vec<f32> {
        if self.bytes {
            // Gymnasium's rule for integer boxes: uniform over the whole numbers within the bounds.
            return self
                .low
                .iter()
                .zip(&self.high)
                .map(|(&lo, &hi)| f32::from(rng.random_range(lo as u8..=hi as u8)))
                .collect();
        }
        // Gymnasium's rule: uniform when bounded, shifted exponential when bounded on one side,
        // standard normal when unbounded.
        self.low
            .iter()
            .zip(&self.high)
            .map(|(&lo, &hi)| match (lo.is_finite(), hi.is_finite()) {
                (true, true) => {
                    let u: f64 = rng.random();
                    (f64::from(lo) + (f64::from(hi) - f64::from(lo)) * u) as f32
                }
                (true, false) => (f64::from(lo) + exponential(rng)) as f32,
                (false, true) => (f64::from(hi) - exponential(rng)) as f32,
                (false, false) => standard_normal(rng) as f32,
            })
            .collect()
    }
}

fn exponential<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u: f64 = rng.random();
    -(1.0 - u).ln()
}

fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u1: f64 = rng.random();
    let u2: f64 = rng.random();
    (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A space, as in Gymnasium.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Space {
    /// The integers `start, start + 1, ..., start + n - 1`.
    Discrete {
        /// Number of values (at least 1).
        n: u64,
        /// The smallest value.
        start: i64,
    },
    /// A box of `f32` values.
    Box(BoxSpace),
    /// One `Discrete(nvec[i])` per component (values `0..nvec[i]`).
    MultiDiscrete(Vec<u64>),
    /// Named sub-spaces, in a fixed order.
    Dict(Vec<(String, Space)>),
    /// Positional sub-spaces.
    Tuple(Vec<Space>),
}

impl Space {
    /// `Discrete(n)` starting at 0.
    pub fn discrete(n: u64) -> Self {
        Space::Discrete { n, start: 0 }
    }

    /// A `Box` with per-element bounds and a one-dimensional shape.
    pub fn box_1d(low: Vec<f32>, high: Vec<f32>) -> Result<Self, EnvError> {
        let n = low.len();
        BoxSpace::new(low, high, vec![n]).map(Space::Box)
    }

    /// Whether every value of this space's flat encoding is a whole number in `0..=255` (boxes of
    /// bytes, small discrete spaces, and dicts and tuples of those), so that it can be stored as bytes.
    pub fn byte_valued(&self) -> bool {
        match self {
            Space::Discrete { n, start } => *start >= 0 && start.saturating_add_unsigned(*n) <= 256,
            Space::Box(b) => b.bytes,
            Space::MultiDiscrete(nvec) => nvec.iter().all(|&n| n <= 256),
            Space::Dict(parts) => parts.iter().all(|(_, s)| s.byte_valued()),
            Space::Tuple(parts) => parts.iter().all(Space::byte_valued),
        }
    }

    /// The number of `f32` slots of this space's flat encoding (see the module doc).
    pub fn flat_dim(&self) -> usize {
        match self {
            Space::Discrete { .. } => 1,
            Space::Box(b) => b.size(),
            Space::MultiDiscrete(nvec) => nvec.len(),
            Space::Dict(parts) => parts.iter().map(|(_, s)| s.flat_dim()).sum(),
            Space::Tuple(parts) => parts.iter().map(Space::flat_dim).sum(),
        }
    }

    /// A random element, drawn as Gymnasium's `sample` does (uniform over discrete values and over
    /// bounded boxes; exponential or normal along unbounded box directions).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Value {
        match self {
            Space::Discrete { n, start } => {
                let k = rng.random_range(0..(*n).max(1));
                Value::Discrete(start.saturating_add_unsigned(k))
            }
            Space::Box(b) => Value::Box(b.sample(rng)),
            Space::MultiDiscrete(nvec) => Value::MultiDiscrete(
                nvec.iter()
                    .map(|&n| rng.random_range(0..n.max(1)).min(i64::MAX as u64) as i64)
                    .collect(),
            ),
            Space::Dict(parts) => {
                Value::Dict(parts.iter().map(|(k, s)| (k.clone(), s.sample(rng))).collect())
            }
            Space::Tuple(parts) => Value::Tuple(parts.iter().map(|s| s.sample(rng)).collect()),
        }
    }

    /// Whether `value` is an element of this space.
    pub fn contains(&self, value: &Value) -> bool {
        match (self, value) {
            (Space::Dict(parts), Value::Dict(values)) => {
                parts.len() == values.len()
                    && parts
                        .iter()
                        .zip(values)
                        .all(|((k, s), (vk, v))| k == vk && s.contains(v))
            }
            (Space::Tuple(parts), Value::Tuple(values)) => {
                parts.len() == values.len() && parts.iter().zip(values).all(|(s, v)| s.contains(v))
            }
            _ => value.as_action().is_some_and(|a| self.contains_action(a)),
        }
    }

    /// Whether the action is an element of this (discrete, box or multi-discrete) space.
    pub fn contains_action(&self, action: Action<'_>) -> bool {
        match (self, action) {
            (Space::Discrete { n, start }, Action::Discrete(a)) => a >= *start && (a.abs_diff(*start)) < *n,
            (Space::Box(b), Action::Continuous(x)) => b.contains(x),
            (Space::MultiDiscrete(nvec), Action::MultiDiscrete(x)) => {
                x.len() == nvec.len() && x.iter().zip(nvec).all(|(&v, &n)| v >= 0 && v.unsigned_abs() < n)
            }
            _ => false,
        }
    }

    /// How many `i64` (discrete, multi-discrete) or `f32` (box) numbers one action of this space
    /// takes in an [`ActionBatch`]; `None` for `Dict`/`Tuple`, which are not supported as actions.
    pub fn action_dim(&self) -> Option<usize> {
        match self {
            Space::Discrete { .. } => Some(1),
            Space::Box(b) => Some(b.size()),
            Space::MultiDiscrete(nvec) => Some(nvec.len()),
            Space::Dict(_) | Space::Tuple(_) => None,
        }
    }
}

fn fmt_f32_list(f: &mut fmt::Formatter<'_>, xs: &[f32]) -> fmt::Result {
    f.write_str("[")?;
    for (i, x) in xs.iter().enumerate() {
        if i > 0 {
            f.write_str(" ")?;
        }
        write!(f, "{x:?}")?;
    }
    f.write_str("]")
}

impl fmt::Display for BoxSpace {
    /// Formats as Gymnasium's repr: `Box(-1.0, 1.0, (1,), float32)`, with arrays when the bounds
    /// differ between elements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Box(")?;
        for bounds in [&self.low, &self.high] {
            match bounds.first() {
                Some(first) if bounds.iter().all(|x| x == first) => write!(f, "{first:?}, ")?,
                _ => {
                    fmt_f32_list(f, bounds)?;
                    f.write_str(", ")?;
                }
            }
        }
        f.write_str("(")?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        if self.shape.len() == 1 {
            f.write_str(",")?;
        }
        f.write_str(if self.bytes { "), uint8)" } else { "), float32)" })
    }
}

impl fmt::Display for Space {
    /// Formats as Gymnasium's repr: `Discrete(2)`, `Box(...)`, `MultiDiscrete([3 3])`,
    /// `Dict('a': Discrete(2), ...)`, `Tuple(Discrete(2), ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Space::Discrete { n, start: 0 } => write!(f, "Discrete({n})"),
            Space::Discrete { n, start } => write!(f, "Discrete({n}, start={start})"),
            Space::Box(b) => b.fmt(f),
            Space::MultiDiscrete(nvec) => {
                f.write_str("MultiDiscrete([")?;
                for (i, n) in nvec.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{n}")?;
                }
                f.write_str("])")
            }
            Space::Dict(parts) => {
                f.write_str("Dict(")?;
                for (i, (k, s)) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "'{k}': {s}")?;
                }
                f.write_str(")")
            }
            Space::Tuple(parts) => {
                f.write_str("Tuple(")?;
                for (i, s) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{s}")?;
                }
                f.write_str(")")
            }
        }
    }
}

/// An owned element of a [`Space`], as returned by [`Space::sample`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An element of a `Discrete` space.
    Discrete(i64),
    /// An element of a `Box` space (flat, row-major).
    Box(Vec<f32>),
    /// An element of a `MultiDiscrete` space.
    MultiDiscrete(Vec<i64>),
    /// An element of a `Dict` space, keys in the space's order.
    Dict(Vec<(String, Value)>),
    /// An element of a `Tuple` space.
    Tuple(Vec<Value>),
}

impl Value {
    /// Borrows this value as an [`Action`]; `None` for `Dict` and `Tuple` values.
    pub fn as_action(&self) -> Option<Action<'_>> {
        match self {
            Value::Discrete(a) => Some(Action::Discrete(*a)),
            Value::Box(x) => Some(Action::Continuous(x)),
            Value::MultiDiscrete(x) => Some(Action::MultiDiscrete(x)),
            Value::Dict(_) | Value::Tuple(_) => None,
        }
    }

    /// Appends this value's flat encoding (see the module doc) to `out`.
    pub fn write_flat(&self, out: &mut Vec<f32>) {
        match self {
            Value::Discrete(a) => out.push(*a as f32),
            Value::Box(x) => out.extend_from_slice(x),
            Value::MultiDiscrete(x) => out.extend(x.iter().map(|&v| v as f32)),
            Value::Dict(parts) => parts.iter().for_each(|(_, v)| v.write_flat(out)),
            Value::Tuple(parts) => parts.iter().for_each(|v| v.write_flat(out)),
        }
    }
}

/// One action, borrowed: what a rollout worker hands to [`Env::step`](crate::Env::step) without
/// allocating.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action<'a> {
    /// For a `Discrete` action space.
    Discrete(i64),
    /// For a `Box` action space (flat, row-major).
    Continuous(&'a [f32]),
    /// For a `MultiDiscrete` action space.
    MultiDiscrete(&'a [i64]),
}

impl fmt::Display for Action<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Discrete(a) => write!(f, "Discrete({a})"),
            Action::Continuous(x) => {
                f.write_str("Continuous(")?;
                fmt_f32_list(f, x)?;
                f.write_str(")")
            }
            Action::MultiDiscrete(x) => write!(f, "MultiDiscrete({x:?})"),
        }
    }
}

/// Actions for several envs (or agents) at once, contiguous: env `i`'s action is the `i`-th chunk of
/// `action_dim` numbers (see [`Space::action_dim`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ActionBatch<'a> {
    /// One `i64` per env.
    Discrete(&'a [i64]),
    /// `action_dim` `f32` per env.
    Continuous(&'a [f32]),
    /// `action_dim` `i64` per env.
    MultiDiscrete(&'a [i64]),
    /// Agents whose action spaces differ in kind or size: each slot of `action_dim` numbers read both as integers
    /// and as floats (the same length), and each env reads its agents' slots by their own spaces
    /// ([`ActionBatch::get_as`]): a `Discrete` agent's action is the first integer of its slot, a `MultiDiscrete`
    /// agent's its first integers, a `Box` agent's its first floats; the rest of a slot is padding.
    Mixed {
        /// The integer reading.
        ints: &'a [i64],
        /// The float reading.
        floats: &'a [f32],
    },
}

impl<'a> ActionBatch<'a> {
    /// Number of numbers in the batch.
    pub fn len(&self) -> usize {
        match self {
            ActionBatch::Discrete(x) | ActionBatch::MultiDiscrete(x) | ActionBatch::Mixed { ints: x, .. } => {
                x.len()
            }
            ActionBatch::Continuous(x) => x.len(),
        }
    }

    /// Whether the batch holds no numbers.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `count` actions of slots `first..first + count`, for actions of `dim` numbers; `None`
    /// when out of range.
    pub fn chunk(&self, first: usize, count: usize, dim: usize) -> Option<ActionBatch<'a>> {
        let range = first.checked_mul(dim)?..first.checked_add(count)?.checked_mul(dim)?;
        Some(match *self {
            ActionBatch::Discrete(x) => ActionBatch::Discrete(x.get(range)?),
            ActionBatch::Continuous(x) => ActionBatch::Continuous(x.get(range)?),
            ActionBatch::MultiDiscrete(x) => ActionBatch::MultiDiscrete(x.get(range)?),
            ActionBatch::Mixed { ints, floats } => ActionBatch::Mixed {
                ints: ints.get(range.clone())?,
                floats: floats.get(range)?,
            },
        })
    }

    /// The action of slot `i`, for actions of `dim` numbers; `None` when out of range, and for a
    /// [`Mixed`](ActionBatch::Mixed) batch, whose slots are read by their spaces ([`get_as`](ActionBatch::get_as)).
    pub fn get(&self, i: usize, dim: usize) -> Option<Action<'a>> {
        let range = i.checked_mul(dim)?..(i + 1).checked_mul(dim)?;
        match *self {
            ActionBatch::Discrete(x) => x.get(i).map(|&a| Action::Discrete(a)),
            ActionBatch::Continuous(x) => x.get(range).map(Action::Continuous),
            ActionBatch::MultiDiscrete(x) => x.get(range).map(Action::MultiDiscrete),
            ActionBatch::Mixed { .. } => None,
        }
    }

    /// The action of slot `i` (of `dim` numbers) for an agent whose action space is `space`: a
    /// [`Mixed`](ActionBatch::Mixed) slot read as `space` says, any other as [`get`](ActionBatch::get) reads it.
    /// `None` when out of range or when `space` needs more than `dim` numbers.
    pub fn get_as(&self, i: usize, dim: usize, space: &Space) -> Option<Action<'a>> {
        let ActionBatch::Mixed { ints, floats } = *self else {
            return self.get(i, dim);
        };
        let size = space.action_dim().filter(|&size| size <= dim)?;
        let at = i.checked_mul(dim)?;
        match space {
            Space::Discrete { .. } => ints.get(at).map(|&a| Action::Discrete(a)),
            Space::MultiDiscrete(_) => ints.get(at..at + size).map(Action::MultiDiscrete),
            Space::Box(_) => floats.get(at..at + size).map(Action::Continuous),
            Space::Dict(_) | Space::Tuple(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_pcg::Pcg64Mcg;

    use super::*;

    /// Spaces travel between processes as JSON: every kind comes back equal, infinite and per-element bounds
    /// included, and an image's box takes a few bytes.
    #[test]
    fn spaces_come_back_equal_from_json() {
        let mixed = BoxSpace::new(
            vec![f32::NEG_INFINITY, -0.0, 1.5e-7],
            vec![f32::INFINITY, 0.0, 3.0],
            vec![3],
        )
        .unwrap();
        let image = BoxSpace::uniform(0.0, 255.0, vec![84, 84, 4])
            .unwrap()
            .into_bytes()
            .unwrap();
        for space in [dict_space(), Space::Box(mixed), Space::Box(image.clone())] {
            let json = serde_json::to_string(&space).unwrap();
            let back: Space = serde_json::from_str(&json).unwrap();
            assert_eq!(back, space, "{json}");
        }
        let json = serde_json::to_string(&Space::Box(image)).unwrap();
        assert!(json.len() < 100, "{json}");
        let bad = r#"{"Box":{"low":1.0,"high":0.0,"shape":[2],"bytes":false}}"#;
        assert!(serde_json::from_str::<Space>(bad).is_err());
    }

    fn dict_space() -> Space {
        Space::Dict(vec![
            (
                "pos".into(),
                Space::Box(BoxSpace::uniform(-1.0, 1.0, vec![2, 3]).unwrap()),
            ),
            ("mode".into(), Space::Discrete { n: 3, start: -1 }),
            (
                "pair".into(),
                Space::Tuple(vec![Space::MultiDiscrete(vec![2, 5]), Space::discrete(4)]),
            ),
        ])
    }

    #[test]
    fn mixed_batches_are_read_by_each_agents_space() {
        let spaces = [
            Space::discrete(3),
            Space::box_1d(vec![-1.0, -1.0], vec![1.0, 1.0]).unwrap(),
            Space::MultiDiscrete(vec![2, 2]),
        ];
        let ints = [2, 0, 0, 0, 1, 1];
        let floats = [2.0, 0.0, 0.5, -0.5, 1.0, 1.0];
        let batch = ActionBatch::Mixed {
            ints: &ints,
            floats: &floats,
        };
        assert_eq!(batch.len(), 6);
        assert_eq!(batch.get(0, 2), None, "a mixed slot needs its space");
        assert_eq!(batch.get_as(0, 2, &spaces[0]), Some(Action::Discrete(2)));
        assert_eq!(
            batch.get_as(1, 2, &spaces[1]),
            Some(Action::Continuous(&[0.5, -0.5]))
        );
        assert_eq!(
            batch.get_as(2, 2, &spaces[2]),
            Some(Action::MultiDiscrete(&[1, 1]))
        );
        assert_eq!(batch.get_as(3, 2, &spaces[0]), None, "out of range");
        let wide = Space::MultiDiscrete(vec![2, 2, 2]);
        assert_eq!(batch.get_as(0, 2, &wide), None, "wider than a slot");
        let tail = batch.chunk(1, 2, 2).expect("in range");
        assert_eq!(
            tail.get_as(0, 2, &spaces[1]),
            Some(Action::Continuous(&[0.5, -0.5]))
        );
        assert_eq!(
            ActionBatch::Discrete(&[4, 5]).get_as(1, 1, &spaces[0]),
            Some(Action::Discrete(5))
        );
    }

    #[test]
    fn flat_dims() {
        assert_eq!(Space::discrete(7).flat_dim(), 1);
        assert_eq!(Space::MultiDiscrete(vec![2, 3, 4]).flat_dim(), 3);
        assert_eq!(dict_space().flat_dim(), 6 + 1 + 2 + 1);
    }

    #[test]
    fn samples_are_contained_and_seeded() {
        let space = dict_space();
        let mut rng = Pcg64Mcg::seed_from_u64(3);
        let mut again = Pcg64Mcg::seed_from_u64(3);
        for _ in 0..200 {
            let v = space.sample(&mut rng);
            assert!(space.contains(&v), "{v:?} not in {space}");
            assert_eq!(v, space.sample(&mut again));
            let mut flat = Vec::new();
            v.write_flat(&mut flat);
            assert_eq!(flat.len(), space.flat_dim());
        }
    }

    #[test]
    fn discrete_with_start_covers_exactly_its_values() {
        let space = Space::Discrete { n: 3, start: -1 };
        let mut rng = Pcg64Mcg::seed_from_u64(0);
        let mut seen = [false; 3];
        for _ in 0..100 {
            match space.sample(&mut rng) {
                Value::Discrete(a) => seen[(a + 1) as usize] = true,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(seen, [true; 3]);
        assert!(!space.contains_action(Action::Discrete(-2)));
        assert!(!space.contains_action(Action::Discrete(2)));
        assert!(space.contains_action(Action::Discrete(1)));
        assert!(!space.contains_action(Action::Continuous(&[0.0])));
    }

    #[test]
    fn box_membership_and_unbounded_sampling() {
        let b = BoxSpace::new(
            vec![-1.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY],
            vec![1.0, 2.0, f32::INFINITY, f32::INFINITY],
            vec![4],
        )
        .unwrap();
        let space = Space::Box(b);
        assert!(space.contains_action(Action::Continuous(&[0.5, -1e30, 7.0, 0.0])));
        assert!(!space.contains_action(Action::Continuous(&[1.5, 0.0, 0.0, 0.0])));
        assert!(!space.contains_action(Action::Continuous(&[f32::NAN, 0.0, 0.0, 0.0])));
        assert!(!space.contains_action(Action::Continuous(&[0.0, 0.0, 0.0])));
        let mut rng = Pcg64Mcg::seed_from_u64(9);
        for _ in 0..100 {
            let v = space.sample(&mut rng);
            assert!(space.contains(&v));
        }
    }

    #[test]
    fn boxes_of_bytes_hold_whole_numbers_and_make_byte_valued_spaces() {
        let b = BoxSpace::uniform(0.0, 255.0, vec![2, 2])
            .unwrap()
            .into_bytes()
            .unwrap();
        assert!(b.bytes());
        assert_eq!(
            Space::Box(b.clone()).to_string(),
            "Box(0.0, 255.0, (2, 2), uint8)"
        );
        assert!(b.contains(&[0.0, 7.0, 255.0, 1.0]));
        assert!(!b.contains(&[0.0, 7.5, 255.0, 1.0]));
        let mut rng = Pcg64Mcg::seed_from_u64(4);
        let space = Space::Box(b.clone());
        for _ in 0..100 {
            assert!(space.contains(&space.sample(&mut rng)));
        }
        for bad in [(-1.0, 1.0), (0.0, 256.0), (0.0, 0.5)] {
            let err = BoxSpace::uniform(bad.0, bad.1, vec![1])
                .unwrap()
                .into_bytes()
                .unwrap_err();
            assert!(err.to_string().contains("whole bounds in 0..=255"), "{err}");
        }
        let floats = Space::Box(BoxSpace::uniform(0.0, 1.0, vec![3]).unwrap());
        assert!(!floats.byte_valued());
        let image_and_mask = Space::Dict(vec![
            ("image".to_owned(), space.clone()),
            ("mask".to_owned(), Space::MultiDiscrete(vec![2, 2])),
            ("turn".to_owned(), Space::discrete(256)),
        ]);
        assert!(image_and_mask.byte_valued());
        assert!(!Space::Tuple(vec![space, floats]).byte_valued());
        assert!(!Space::Discrete { n: 2, start: -1 }.byte_valued());
        assert!(!Space::discrete(257).byte_valued());
    }

    #[test]
    fn multi_discrete_membership() {
        let space = Space::MultiDiscrete(vec![2, 3]);
        assert!(space.contains_action(Action::MultiDiscrete(&[1, 2])));
        assert!(!space.contains_action(Action::MultiDiscrete(&[1, 3])));
        assert!(!space.contains_action(Action::MultiDiscrete(&[-1, 0])));
        assert!(!space.contains_action(Action::MultiDiscrete(&[1])));
    }

    #[test]
    fn invalid_boxes_are_errors() {
        assert!(matches!(
            BoxSpace::new(vec![0.0], vec![1.0, 2.0], vec![2]),
            Err(EnvError::InvalidSpace(_))
        ));
        assert!(matches!(
            BoxSpace::uniform(1.0, 0.0, vec![1]),
            Err(EnvError::InvalidSpace(_))
        ));
        assert!(matches!(
            BoxSpace::uniform(f32::NAN, 0.0, vec![1]),
            Err(EnvError::InvalidSpace(_))
        ));
    }

    #[test]
    fn display_matches_gymnasium_repr() {
        assert_eq!(Space::discrete(2).to_string(), "Discrete(2)");
        assert_eq!(
            Space::Discrete { n: 3, start: -1 }.to_string(),
            "Discrete(3, start=-1)"
        );
        assert_eq!(
            Space::Box(BoxSpace::uniform(-1.0, 1.0, vec![1]).unwrap()).to_string(),
            "Box(-1.0, 1.0, (1,), float32)"
        );
        assert_eq!(
            Space::box_1d(vec![-1.0, 0.0], vec![1.0, 1.0])
                .unwrap()
                .to_string(),
            "Box([-1.0 0.0], 1.0, (2,), float32)"
        );
        assert_eq!(
            Space::MultiDiscrete(vec![3, 3]).to_string(),
            "MultiDiscrete([3 3])"
        );
        assert_eq!(
            dict_space().to_string(),
            "Dict('pos': Box(-1.0, 1.0, (2, 3), float32), 'mode': Discrete(3, start=-1), \
             'pair': Tuple(MultiDiscrete([2 5]), Discrete(4)))"
        );
    }

    #[test]
    fn action_batch_slots() {
        let xs = [0.0, 1.0, 2.0, 3.0];
        let batch = ActionBatch::Continuous(&xs);
        assert_eq!(batch.get(1, 2), Some(Action::Continuous(&[2.0, 3.0])));
        assert_eq!(batch.get(2, 2), None);
        assert_eq!(
            ActionBatch::Discrete(&[4, 5]).get(1, 1),
            Some(Action::Discrete(5))
        );
    }
}
