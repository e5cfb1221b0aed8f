//! The PettingZoo bridge (feature `python`): any PettingZoo env, through its Parallel or its AEC
//! API, as a [`MultiAgentEnv`].
//!
//! # Ids and keyword arguments
//! - `pz:<module>`, e.g. `pz:pettingzoo.mpe.simple_spread_v3`: the module's `parallel_env(**kwargs)`
//!   (Parallel API) if it has one, else its `env(**kwargs)` (AEC API; classic board games such as
//!   `pettingzoo.classic.connect_four_v3` only have this one).
//! - `pza:<module>`: always the AEC API, `env(**kwargs)`, even when the module has `parallel_env`.
//! - `pz:/path/env.pkl` (an absolute path): the env returned by the pickled callable in that file, called with
//!   the keyword arguments (`rlfactory.train(env=...)` writes it); an AEC env (one with `agent_iter`) through
//!   the AEC API, else the Parallel one.
//!
//! The module is imported with `importlib.import_module`, so any installed package's module that
//! follows PettingZoo's conventions works. Keyword arguments come as `(key, value)` strings; each
//! value is read with Python's `ast.literal_eval` when it is a literal (`N=3`, `max_cycles=25`,
//! `continuous_actions=False`, `render_mode=None`) and passed as the plain string otherwise.
//!
//! # Agents and spaces
//! Agent `k` is `possible_agents[k]`. The env's spaces are translated and observations flattened
//! to `f32` exactly as the [Gymnasium bridge](crate::gym) does: a `Dict` observation flattens in
//! its space's key order, which Gymnasium sorts, so Connect Four's observation is the 7
//! `action_mask` values then the 84 board values, as the native
//! [`ConnectFour`](crate::connect_four::ConnectFour). Agents may have different observation spaces
//! (MPE's `simple_adversary_v3`, `simple_tag_v3`): each agent's observation is written at the start
//! of a slot as long as the largest, zeros after it. Their action spaces may differ too: within one kind
//! and size (`Discrete(5)` and `Discrete(20)`, one number each) the batches are of that kind; in kind
//! or size (a `Discrete` agent beside a `Box` one, `Box(2)` beside `Box(3)`) each action slot is as
//! large as the largest agent's action and the batches are [`ActionBatch::Mixed`], each agent's slot
//! read by its own space. Actions may
//! be `Discrete` (passed as a Python `int`), `Box` or `MultiDiscrete`/`MultiBinary` (passed as NumPy
//! arrays of the space's dtype and shape).
//!
//! # The Parallel API and the contract
//! - `reset(seed)`: `env.reset(seed=seed)`; the agents in `env.agents` are active.
//! - `step`: the actions of the live agents (`env.agents`) go to `env.step` as a dict; every agent
//!   gets the reward, termination, truncation and observation the env returned for it.
//! - When `env.agents` is empty afterwards, the env is reset (without a seed) within the same step:
//!   the flags describe the finished episode, the observations are the new episode's first ones.
//!
//! # The AEC API and the contract
//! - `reset(seed)`: `env.reset(seed=seed)`; the active agent is `env.agent_selection`.
//! - `step`: the selected agent's action goes to `env.step`. Then every agent gets its reward of that
//!   step (`env.rewards`, so a turn-based game's loser gets its −1 on the winner's move) and its flag
//!   if `env.terminations` or `env.truncations` says its episode ended, and every live agent's
//!   observation is `env.observe(agent)`. While the agent selected next is done, the bridge steps it
//!   with `None` (PettingZoo's dead step, which removes it from `env.agents`), adding any reward of
//!   that dead step to the agents' rewards of this step. When `env.agents` is then empty, the env is
//!   reset within the same step, as above; otherwise the selected agent is the one active.
//!
//! # Agents whose episode ended
//! An agent's `terminated`/`truncated` flag is reported once, in the step its episode ended. From
//! then until the env resets it is inactive (even if the env keeps it in `env.agents`), its flags
//! are false, its reward is what the env reports for it (normally nothing: 0) and its observation
//! slot is all zeros. Whatever the env leaves out for an agent (an agent not in `env.agents`, not
//! spawned yet or gone) counts as reward 0, flags false and an all-zero observation. A number under
//! `true_objective` in an agent's info (`env.infos` for AEC) in the step its episode ended is its
//! [`MultiAgentEnv::true_objective`].
//!
//! # Finding Python and the packages
//! As for the [Gymnasium bridge](crate::gym): `VIRTUAL_ENV` or `PYTHONPATH`. `scripts/setup_python.sh`
//! installs the pinned pettingzoo, and pygame, which PettingZoo's MPE and classic modules import.
//! Python exceptions become [`EnvError::PettingZoo`] naming the env id and the call.
//!
//! ```no_run
//! use rlf_env::{ActionBatch, EnvRegistry, VecBuffers};
//!
//! let kwargs = rlf_env::parse_kwargs("N=3, max_cycles=25, continuous_actions=False")?;
//! let registry = EnvRegistry::with_builtin();
//! let mut env = registry.make_multi_agent("pz:pettingzoo.mpe.simple_spread_v3", &kwargs)?;
//! let mut buf = VecBuffers::new(env.num_agents(), env.observation_space().flat_dim());
//! env.reset(Some(0), &mut buf.obs)?;
//! env.step(ActionBatch::Discrete(&[1, 2, 3]), buf.view())?;
//! # Ok::<(), rlf_env::EnvError>(())
//! ```

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyModuleNotFoundError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyModule};

use crate::env::check_action;
use crate::gym::{helper_module, translate};
use crate::{
    action_slots, Action, ActionBatch, EnvError, EnvKwargs, MultiAgentEnv, Space, StepBuffers,
    PETTINGZOO_AEC_PREFIX, PETTINGZOO_PREFIX,
};

const HELPER: &std::ffi::CStr = c"
import ast, importlib, os

import numpy as np
from gymnasium import spaces

# PettingZoo's MPE and classic modules import pygame, which greets on stdout unless told not to.
os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')

# `describe`, `flatten`, `factory`, `opening` and `closing` (which count open envs, for pygame's sake) are the
# Gymnasium bridge's, set on this module before any Bridge is made.


def literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError):
        return text


class Bridge:
    def __init__(self, module_name, force_aec, kwargs):
        self.env = None
        opening()
        try:
            self._make(module_name, force_aec, kwargs)
        except BaseException:
            closing(self.env)
            raise

    def _make(self, module_name, force_aec, kwargs):
        kwargs = {key: literal(value) for key, value in kwargs}
        if module_name.startswith('/'):
            self.env = factory(module_name)(**kwargs)
            # AEC envs (PettingZoo's AECEnv and its wrappers) iterate over whose turn it is; Parallel envs do not.
            self.parallel = not force_aec and not hasattr(type(self.env), 'agent_iter')
        else:
            self._make_module(module_name, force_aec, kwargs)
        self.agents = list(self.env.possible_agents)
        self.index = {agent: k for k, agent in enumerate(self.agents)}
        self.observation_spaces = [self.env.observation_space(a) for a in self.agents]
        self.action_spaces = [self.env.action_space(a) for a in self.agents]
        self.dim = 0

    def _make_module(self, module_name, force_aec, kwargs):
        module = importlib.import_module(module_name)
        self.parallel = not force_aec and hasattr(module, 'parallel_env')
        maker = 'parallel_env' if self.parallel else 'env'
        if not callable(getattr(module, maker, None)):
            wanted = 'env()' if force_aec else 'parallel_env() or env()'
            raise AttributeError('module %s has no %s: not a PettingZoo env module' % (module_name, wanted))
        self.env = getattr(module, maker)(**kwargs)

    def describe(self):
        return (
            self.parallel,
            self.agents,
            [describe(s) for s in self.observation_spaces],
            [describe(s) for s in self.action_spaces],
        )

    def set_obs_dim(self, dim, dims):
        self.dim = dim
        self.dims = dims

    def reset(self, seed):
        if self.parallel:
            observations, _infos = self.env.reset(seed=seed)
        else:
            self.env.reset(seed=seed)
            observations = self._observe()
        return self._flat(observations), self._active()

    def step(self, actions):
        env = self.env
        if self.parallel:
            acting = {a: self._action(a, actions[self.index[a]]) for a in env.agents}
            observations, rewards, terminations, truncations, infos = env.step(acting)
        else:
            selected = env.agent_selection
            env.step(self._action(selected, actions[self.index[selected]]))
            # Read before the dead steps, which delete the dead agents' entries.
            rewards, terminations, truncations = env.rewards, env.terminations, env.truncations
            infos = dict(env.infos)
            observations = self._observe()
        rewards = self._per_agent(rewards, 0.0, float)
        terminated = self._per_agent(terminations, False, bool)
        truncated = self._per_agent(truncations, False, bool)
        objectives = [self._objective(infos, a) if terminated[k] or truncated[k] else None
                      for k, a in enumerate(self.agents)]
        if not self.parallel:
            self._dead_steps(rewards)
        obs = self._flat(observations)
        reset = not env.agents
        if reset:
            obs, _active = self.reset(None)
        return obs, rewards, terminated, truncated, self._active(), reset, objectives

    @staticmethod
    def _objective(infos, agent):
        info = infos.get(agent) if isinstance(infos, dict) else None
        value = info.get('true_objective') if isinstance(info, dict) else None
        return None if value is None else float(value)

    def _dead_steps(self, rewards):
        env = self.env
        for _ in range(len(self.agents)):
            if not env.agents or not self._done(env.agent_selection):
                return
            env.step(None)
            for agent, reward in env.rewards.items():
                rewards[self.index[agent]] += float(reward)
        if env.agents and self._done(env.agent_selection):
            raise RuntimeError('%s is still done after a dead step of every agent' % env.agent_selection)

    def close(self):
        env, self.env = self.env, None
        if env is not None:
            closing(env)

    def _per_agent(self, values, default, cast):
        return [cast(values.get(a, default)) for a in self.agents]

    def _done(self, agent):
        return bool(self.env.terminations.get(agent, False) or self.env.truncations.get(agent, False))

    def _observe(self):
        return {a: self.env.observe(a) for a in self.env.agents}

    def _active(self):
        env = self.env
        if self.parallel:
            live = set(env.agents)
            return [a in live for a in self.agents]
        selected = env.agent_selection if env.agents else None
        return [a == selected for a in self.agents]

    def _action(self, agent, action):
        if action is None:
            raise ValueError('no action for agent %s, which the env expects to act' % agent)
        space = self.action_spaces[self.index[agent]]
        if isinstance(space, spaces.Discrete):
            return int(action)
        return np.asarray(action, dtype=space.dtype).reshape(space.shape)

    def _flat(self, observations):
        out = np.zeros((len(self.agents), self.dim), dtype=np.float32)
        for agent, x in observations.items():
            k = self.index[agent]
            flat = flatten(self.observation_spaces[k], x)
            if flat.size != self.dims[k]:
                raise ValueError(
                    'the observation of %s has %d values, but its observation space %s has %d'
                    % (agent, flat.size, self.observation_spaces[k], self.dims[k])
                )
            out[k, :flat.size] = flat
        return out
";

/// What the helper's `Bridge.describe()` returns: whether it drives the Parallel API, the agents'
/// names, and each agent's observation and action space as `describe` tuples.
type Description<'py> = (bool, Vec<String>, Vec<Bound<'py, PyAny>>, Vec<Bound<'py, PyAny>>);

/// What the helper's `Bridge.step()` returns: the observations (agents × obs_dim), and per agent
/// the reward, termination, truncation and whether it is live; then whether the env was reset;
/// then per agent its `info["true_objective"]` if its episode ended in the step.
type StepOutcome<'py> = (
    Bound<'py, PyAny>,
    Vec<f64>,
    Vec<bool>,
    Vec<bool>,
    Vec<bool>,
    bool,
    Vec<Option<f64>>,
);

/// Which of PettingZoo's APIs a [`PettingZooEnv`] drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PettingZooApi {
    /// The module's `parallel_env()`: every live agent acts in every step.
    Parallel,
    /// The module's `env()`: one agent, `agent_selection`, acts in each step.
    Aec,
}

/// A PettingZoo env in the embedded interpreter, as a [`MultiAgentEnv`] (see the module doc).
pub struct PettingZooEnv {
    id: String,
    api: PettingZooApi,
    bridge: Py<PyAny>,
    agents: Vec<String>,
    /// By agent.
    observation_spaces: Vec<Space>,
    action_spaces: Vec<Space>,
    obs_dim: usize,
    action_dim: usize,
    /// Whether each agent acts in the next step.
    active: Vec<bool>,
    /// Whether each agent's episode has ended (and its flag been reported) in the running episode.
    ended: Vec<bool>,
    /// The true objective each agent's episode reported, if it ended in the last step.
    objectives: Vec<Option<f64>>,
}

impl std::fmt::Debug for PettingZooEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PettingZooEnv")
            .field("id", &self.id)
            .field("api", &self.api)
            .field("agents", &self.agents)
            .field("observation_spaces", &self.observation_spaces)
            .field("action_spaces", &self.action_spaces)
            .finish_non_exhaustive()
    }
}

fn python_error<'a>(env: &'a str, call: &'static str) -> impl FnOnce(PyErr) -> EnvError + 'a {
    move |err| EnvError::PettingZoo {
        env: env.to_owned(),
        call,
        message: err.to_string(),
    }
}

/// Each agent's space, from the helper's descriptions; an env without agents is an error.
fn agent_spaces(id: &str, which: &str, descriptions: &[Bound<'_, PyAny>]) -> Result<Vec<Space>, EnvError> {
    let spaces = descriptions
        .iter()
        .map(translate)
        .collect::<Result<Vec<Space>, String>>()
        .map_err(|reason| EnvError::Unsupported {
            env: id.to_owned(),
            what: format!("its {which} space ({reason})"),
        })?;
    if spaces.is_empty() {
        return Err(EnvError::Unsupported {
            env: id.to_owned(),
            what: "an env without agents (empty `possible_agents`)".into(),
        });
    }
    Ok(spaces)
}

/// A Python object for one agent's action.
fn action_object<'py>(py: Python<'py>, action: Action<'_>) -> PyResult<Bound<'py, PyAny>> {
    match action {
        Action::Discrete(a) => a.into_pyobject(py).map(Bound::into_any).map_err(PyErr::from),
        Action::Continuous(x) => x.into_pyobject(py).map(Bound::into_any),
        Action::MultiDiscrete(x) => x.into_pyobject(py).map(Bound::into_any),
    }
}

/// The bridge's helper module, compiled once per process (see [`helper_module`] for why once),
/// with the Gymnasium helper's `describe` and `flatten`.
fn pz_helper_module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    static PZ_HELPER_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    PZ_HELPER_MODULE
        .get_or_try_init(py, || {
            let gym = helper_module(py)?;
            let helper = PyModule::from_code(py, HELPER, c"rlf_pz_bridge.py", c"rlf_pz_bridge")?;
            for name in ["describe", "flatten", "factory", "opening", "closing"] {
                helper.setattr(name, gym.getattr(name)?)?;
            }
            Ok(helper.unbind())
        })
        .map(|module| module.bind(py).clone())
}

impl PettingZooEnv {
    /// Makes the env of a `pz:<module>` or `pza:<module>` id with keyword arguments `kwargs` (see
    /// the module doc). Any other id is an [`EnvError::Unsupported`].
    pub fn from_id(id: &str, kwargs: &EnvKwargs) -> Result<Self, EnvError> {
        let (module, force_aec) = match (
            id.strip_prefix(PETTINGZOO_PREFIX),
            id.strip_prefix(PETTINGZOO_AEC_PREFIX),
        ) {
            (Some(module), _) => (module, false),
            (None, Some(module)) => (module, true),
            (None, None) => {
                return Err(EnvError::Unsupported {
                    env: id.to_owned(),
                    what: format!(
                        "making it with the PettingZoo bridge (its ids start with `{PETTINGZOO_PREFIX}` or \
                         `{PETTINGZOO_AEC_PREFIX}`)"
                    ),
                })
            }
        };
        Python::attach(|py| {
            let make_error = |err: PyErr| {
                let hint = if err.is_instance_of::<PyModuleNotFoundError>(py) {
                    " (is it installed? run scripts/setup_python.sh and export VIRTUAL_ENV or PYTHONPATH)"
                } else {
                    ""
                };
                EnvError::PettingZoo {
                    env: id.to_owned(),
                    call: "make",
                    message: format!("{err}{hint}"),
                }
            };
            let helper = pz_helper_module(py).map_err(make_error)?;
            let pairs: Vec<(&str, &str)> = kwargs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let bridge = helper
                .getattr("Bridge")
                .and_then(|b| b.call1((module, force_aec, pairs)))
                .map_err(make_error)?;
            let described = (|| {
                let description = bridge.call_method0("describe").map_err(make_error)?;
                let (parallel, agents, obs_descs, act_descs): Description<'_> =
                    description.extract().map_err(make_error)?;
                let observation_spaces = agent_spaces(id, "observation", &obs_descs)?;
                let action_spaces = agent_spaces(id, "action", &act_descs)?;
                let action_dim = action_slots(id, &action_spaces)?.size;
                let dims: Vec<usize> = observation_spaces.iter().map(Space::flat_dim).collect();
                let obs_dim = dims.iter().copied().max().unwrap_or(0);
                bridge
                    .call_method1("set_obs_dim", (obs_dim, dims))
                    .map_err(make_error)?;
                Ok((
                    parallel,
                    agents,
                    observation_spaces,
                    action_spaces,
                    obs_dim,
                    action_dim,
                ))
            })();
            let (parallel, agents, observation_spaces, action_spaces, obs_dim, action_dim) = match described {
                Ok(described) => described,
                Err(e) => {
                    // The env is made (and counted open): close it before giving up on it.
                    if let Err(err) = bridge.call_method0("close") {
                        err.print(py);
                    }
                    return Err(e);
                }
            };
            let n = agents.len();
            Ok(Self {
                id: id.to_owned(),
                api: if parallel {
                    PettingZooApi::Parallel
                } else {
                    PettingZooApi::Aec
                },
                bridge: bridge.unbind(),
                agents,
                observation_spaces,
                action_spaces,
                obs_dim,
                action_dim,
                active: vec![false; n],
                ended: vec![false; n],
                objectives: vec![None; n],
            })
        })
    }

    /// The API the bridge drives.
    pub fn api(&self) -> PettingZooApi {
        self.api
    }

    /// The agents' names (`possible_agents`); agent `k` is `agents()[k]`.
    pub fn agents(&self) -> &[String] {
        &self.agents
    }

    /// Copies the `agents × obs_dim` `float32` array returned by the helper into `obs`.
    fn read_obs(
        &self,
        py: Python<'_>,
        call: &'static str,
        array: &Bound<'_, PyAny>,
        obs: &mut [f32],
    ) -> Result<(), EnvError> {
        let buffer = PyBuffer::<f32>::get(array).map_err(python_error(&self.id, call))?;
        if buffer.item_count() != obs.len() {
            return Err(EnvError::ObservationShape {
                env: self.id.clone(),
                call,
                expected: obs.len(),
                got: buffer.item_count(),
                space: format!("{} agents × {} values", self.agents.len(), self.obs_dim),
            });
        }
        buffer
            .copy_to_slice(py, obs)
            .map_err(python_error(&self.id, call))
    }

    /// Sets which agents act next from the helper's list, leaving out those whose episode ended.
    fn set_active(&mut self, live: &[bool]) {
        for ((active, &live), &ended) in self.active.iter_mut().zip(live).zip(&self.ended) {
            *active = live && !ended;
        }
    }
}

impl MultiAgentEnv for PettingZooEnv {
    fn id(&self) -> &str {
        &self.id
    }

    fn num_agents(&self) -> usize {
        self.agents.len()
    }

    fn agent_name(&self, agent: usize) -> String {
        self.agents
            .get(agent)
            .cloned()
            .unwrap_or_else(|| format!("agent_{agent}"))
    }

    fn observation_space(&self) -> &Space {
        &self.observation_spaces[0]
    }

    fn action_space(&self) -> &Space {
        &self.action_spaces[0]
    }

    fn agent_observation_space(&self, agent: usize) -> &Space {
        self.observation_spaces
            .get(agent)
            .unwrap_or(&self.observation_spaces[0])
    }

    fn agent_action_space(&self, agent: usize) -> &Space {
        self.action_spaces.get(agent).unwrap_or(&self.action_spaces[0])
    }

    fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        let expected = self.agents.len() * self.obs_dim;
        if obs.len() != expected {
            return Err(EnvError::BufferSize {
                what: format!("{} observation buffer", self.id),
                expected,
                got: obs.len(),
            });
        }
        Python::attach(|py| {
            let result = self
                .bridge
                .bind(py)
                .call_method1("reset", (seed,))
                .map_err(python_error(&self.id, "reset"))?;
            let (array, live): (Bound<'_, PyAny>, Vec<bool>) =
                result.extract().map_err(python_error(&self.id, "reset"))?;
            self.read_obs(py, "reset", &array, obs)?;
            self.ended.fill(false);
            self.set_active(&live);
            Ok(())
        })
    }

    /// Applies the actions of the active agents (the others are ignored) as the module doc says.
    fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<(), EnvError> {
        let n = self.agents.len();
        out.check(&self.id, n, self.obs_dim)?;
        if actions.len() != n * self.action_dim {
            return Err(EnvError::BufferSize {
                what: format!("{} action batch", self.id),
                expected: n * self.action_dim,
                got: actions.len(),
            });
        }
        Python::attach(|py| {
            let per_agent = PyList::empty(py);
            for (k, &active) in self.active.iter().enumerate() {
                let item = match actions.get_as(k, self.action_dim, &self.action_spaces[k]) {
                    Some(action) if active => {
                        check_action(&self.id, &self.action_spaces[k], action)?;
                        action_object(py, action).map_err(python_error(&self.id, "step"))?
                    }
                    _ => py.None().into_bound(py),
                };
                per_agent.append(item).map_err(python_error(&self.id, "step"))?;
            }
            let result = self
                .bridge
                .bind(py)
                .call_method1("step", (per_agent,))
                .map_err(python_error(&self.id, "step"))?;
            let (array, rewards, terminated, truncated, live, reset, objectives): StepOutcome<'_> =
                result.extract().map_err(python_error(&self.id, "step"))?;
            self.read_obs(py, "step", &array, out.obs)?;
            let dim = self.obs_dim;
            // `out.check` made every buffer `n` slots long; the helper's lists have one entry per agent.
            for (k, ended) in self.ended.iter_mut().enumerate() {
                let term = terminated.get(k).copied().unwrap_or(false);
                let trunc = truncated.get(k).copied().unwrap_or(false);
                out.rewards[k] = rewards.get(k).copied().unwrap_or(0.0) as f32;
                out.terminated[k] = term && !*ended;
                out.truncated[k] = trunc && !*ended;
                self.objectives[k] = objectives
                    .get(k)
                    .copied()
                    .flatten()
                    .filter(|_| (term || trunc) && !*ended);
                if *ended && !reset {
                    out.obs[k * dim..(k + 1) * dim].fill(0.0);
                }
                *ended |= term || trunc;
            }
            if reset {
                self.ended.fill(false);
            }
            self.set_active(&live);
            Ok(())
        })
    }

    fn is_active(&self, agent: usize) -> bool {
        self.active.get(agent).copied().unwrap_or(false)
    }

    fn true_objective(&self, agent: usize) -> Option<f64> {
        self.objectives.get(agent).copied().flatten()
    }
}

impl Drop for PettingZooEnv {
    fn drop(&mut self) {
        Python::attach(|py| {
            // Closing is best effort: an exception in `close` must not turn a drop into a panic.
            if let Err(err) = self.bridge.bind(py).call_method0("close") {
                err.print(py);
            }
        });
    }
}
