//! The crate's one error type.

/// Everything that can go wrong when making, resetting or stepping an environment.
///
/// Each message says what was wrong and where (which env id, which call, which vector slot), so a
/// user sees one clear line instead of a panic.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// The registry has no constructor for this id.
    #[error("unknown env id `{id}`; known ids: {}", known.join(", "))]
    UnknownEnv {
        /// The id that was asked for.
        id: String,
        /// Every id the registry knows, sorted.
        known: Vec<String>,
    },
    /// `register` was called twice with the same id.
    #[error("env id `{0}` is already registered")]
    DuplicateEnv(String),
    /// A `gym:<id>` env was asked for, but the crate was built without the `python` feature.
    #[error("env id `gym:{0}` needs the Gymnasium bridge: build rlf-env with `--features python`")]
    PythonDisabled(String),
    /// A `pz:<module>` or `pza:<module>` env (the id is kept whole) was asked for, but the crate was
    /// built without the `python` feature.
    #[error("env id `{0}` needs the PettingZoo bridge: build rlf-env with `--features python`")]
    PettingZooDisabled(String),
    /// The action does not belong to the action space.
    #[error("{env}: action {action} is not in the action space {space}")]
    InvalidAction {
        /// The env (or wrapper) that rejected the action.
        env: String,
        /// The offending action, formatted.
        action: String,
        /// The action space, formatted.
        space: String,
    },
    /// A buffer handed to the env has the wrong length.
    #[error("{what}: expected {expected} values, got {got}")]
    BufferSize {
        /// Which buffer (and which call).
        what: String,
        /// The length the space asks for.
        expected: usize,
        /// The length that was given.
        got: usize,
    },
    /// The env produced an observation of the wrong size.
    #[error("{env}: {call} returned an observation of {got} values, but its observation space {space} has {expected}")]
    ObservationShape {
        /// The env id.
        env: String,
        /// `reset` or `step`.
        call: &'static str,
        /// The flat size of the observation space.
        expected: usize,
        /// The size the env returned.
        got: usize,
        /// The observation space, formatted.
        space: String,
    },
    /// The env produced an observation containing NaN.
    #[error("{env}: {call} returned an observation with NaN at flat index {index}")]
    ObservationNan {
        /// The env id.
        env: String,
        /// `reset` or `step`.
        call: &'static str,
        /// The first flat index holding NaN.
        index: usize,
    },
    /// `set_state` was given a state of the wrong length or the env cannot set its state.
    #[error("{env}: cannot set state: {reason}")]
    InvalidState {
        /// The env id.
        env: String,
        /// Why.
        reason: String,
    },
    /// A space was built from inconsistent parts (bounds of different lengths, low > high, ...).
    #[error("invalid space: {0}")]
    InvalidSpace(String),
    /// An env's keyword arguments (`--env_kwargs`) or configuration are wrong.
    #[error("{env}: {reason}")]
    InvalidConfig {
        /// The env id (or `env kwargs` while parsing them).
        env: String,
        /// What is wrong, naming the key.
        reason: String,
    },
    /// The env does not support this operation (e.g. a continuous action on a discrete env).
    #[error("{env}: {what} is not supported")]
    Unsupported {
        /// The env id.
        env: String,
        /// The operation.
        what: String,
    },
    /// An env inside a vector env failed; `index` says which slot.
    #[error("vector env slot {index}: {source}")]
    InSlot {
        /// The slot of the failing env.
        index: usize,
        /// What went wrong there.
        source: Box<EnvError>,
    },
    /// A Python exception raised inside a Gymnasium env (or while loading one).
    #[cfg(feature = "python")]
    #[error("gym:{env}: Python raised during {call}: {message}")]
    Python {
        /// The Gymnasium env id.
        env: String,
        /// `make`, `reset`, `step` or `set_state`.
        call: &'static str,
        /// The exception, as Python formats it.
        message: String,
    },
    /// A Python exception raised inside a PettingZoo env (or while loading one).
    #[cfg(feature = "python")]
    #[error("{env}: Python raised during {call}: {message}")]
    PettingZoo {
        /// The env id, with its `pz:` or `pza:` prefix.
        env: String,
        /// `make`, `reset` or `step`.
        call: &'static str,
        /// The exception, as Python formats it.
        message: String,
    },
}
