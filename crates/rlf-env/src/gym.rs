//! The Gymnasium bridge (feature `python`): any env `gymnasium.make` can build, as an [`Env`].
//!
//! The env lives in a CPython interpreter embedded in this process (pyo3, `auto-initialize`); each
//! call takes the GIL. Spaces are translated (`Discrete`, `Box`, `MultiDiscrete`, `MultiBinary` as a
//! `MultiDiscrete` of 2s, `Dict`, `Tuple`), observations flattened to `f32` in the crate's
//! [flat encoding](crate::space). A Python exception becomes an [`EnvError::Python`] naming the env
//! and the call. A number in the `info` of the step that ends an episode under the key
//! `true_objective` (Sample Factory's convention) becomes [`Info::true_objective`].
//!
//! An id that is an absolute path (`gym:/path/env.pkl`) names a file holding a pickled callable that returns a
//! Gymnasium env (with the `--env_kwargs` as keyword arguments): what `rlfactory.train(env=MyEnv)` writes with
//! cloudpickle, so that a class of the user's script is made in every worker process.
//!
//! # Finding Python and the packages
//! The binary links the libpython pyo3 was built against and finds it at run time through an rpath
//! (set by this crate's `build.rs`). Packages come from `sys.path`: set `PYTHONPATH`, or set
//! `VIRTUAL_ENV` to a venv and its `site-packages` is added when the first env is made (without it, the venv whose
//! `bin/` holds the binary, where `pip install .` puts it).
//! `scripts/setup_python.sh` creates such a venv with the pinned gymnasium.
//!
//! ```no_run
//! use rlf_env::{Action, EnvRegistry};
//!
//! let mut env = EnvRegistry::with_builtin().make("gym:CartPole-v1")?;
//! let mut obs = vec![0.0; env.observation_space().flat_dim()];
//! env.reset(Some(0), &mut obs)?;
//! let step = env.step(Action::Discrete(1), &mut obs)?;
//! # Ok::<(), rlf_env::EnvError>(())
//! ```

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

use crate::env::check_action;
use crate::{Action, BoxSpace, Env, EnvError, Frame, Info, Space, Step};

const HELPER: &std::ffi::CStr = c"
import os, site, sys

_venv = os.environ.get('VIRTUAL_ENV')
if not _venv:
    # A binary installed in a venv's bin/ (`pip install .`) and run without activating it: that venv.
    _home = os.path.dirname(os.path.dirname(os.path.realpath('/proc/self/exe')))
    if os.path.exists(os.path.join(_home, 'pyvenv.cfg')):
        _venv = _home
if _venv:
    site.addsitedir(os.path.join(_venv, 'lib', 'python%d.%d' % sys.version_info[:2], 'site-packages'))

import threading
import numpy as np
import gymnasium as gym
from gymnasium import spaces
# pygame's state is one per process, yet envs' close() calls pygame.quit() (PettingZoo's MPE envs always,
# Gymnasium's after rendering): with several envs in a process, the first to close would free fonts and
# surfaces the others still use (a heap corruption). Envs are counted from before they are made until
# closed, and pygame.quit only quits when no other env is open.
_open_envs = 0
_open_lock = threading.Lock()
def _share_pygame():
    pygame = sys.modules.get('pygame')
    if pygame is None or getattr(pygame.quit, 'rlf_shared', False):
        return
    quit_now = pygame.quit
    def quit():
        with _open_lock:
            if _open_envs == 0:
                quit_now()
    quit.rlf_shared = True
    pygame.quit = quit
def opening():
    global _open_envs
    with _open_lock:
        _open_envs += 1
def closing(env):
    global _open_envs
    with _open_lock:
        _open_envs -= 1
    _share_pygame()
    if env is not None:
        env.close()


def describe(space):
    if isinstance(space, spaces.Discrete):
        return ('discrete', int(space.n), int(space.start))
    if isinstance(space, spaces.Box):
        low = np.asarray(space.low, dtype=np.float32).ravel()
        high = np.asarray(space.high, dtype=np.float32).ravel()
        whole = space.dtype == np.bool_ or np.issubdtype(space.dtype, np.integer)
        byte = bool(whole and low.size and low.min() >= 0 and high.max() <= 255)
        return ('box', low.tolist(), high.tolist(), [int(d) for d in space.shape], byte)
    if isinstance(space, spaces.MultiDiscrete):
        return ('multidiscrete', [int(n) for n in np.asarray(space.nvec).ravel()])
    if isinstance(space, spaces.MultiBinary):
        return ('multidiscrete', [2] * int(np.prod(space.shape)))
    if isinstance(space, spaces.Dict):
        return ('dict', [(str(k), describe(s)) for k, s in space.spaces.items()])
    if isinstance(space, spaces.Tuple):
        return ('tuple', [describe(s) for s in space.spaces])
    raise TypeError('unsupported space %r' % (space,))


def _parts(space, x, out):
    if isinstance(space, spaces.Dict):
        for k, s in space.spaces.items():
            _parts(s, x[k], out)
    elif isinstance(space, spaces.Tuple):
        for s, v in zip(space.spaces, x):
            _parts(s, v, out)
    else:
        out.append(np.asarray(x, dtype=np.float32).ravel())


def flatten(space, x):
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        out = []
        _parts(space, x, out)
        return np.ascontiguousarray(np.concatenate(out) if out else np.zeros(0), dtype=np.float32)
    return np.ascontiguousarray(x, dtype=np.float32).ravel()


def _value(text):
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return {'true': True, 'false': False, 'none': None}.get(text.lower(), text)


def factory(path):
    # An env id that is an absolute path names a file holding a pickled callable that makes the env (rlfactory's
    # Python API writes it with cloudpickle, which pickles a class or function of the user's `__main__` by value).
    import pickle
    with open(path, 'rb') as f:
        return pickle.load(f)


# Gymnasium's registry is a plain dict that every gym.register iterates; a make that imports a module registering
# envs (ale_py, minatar) while another thread registers or makes raised 'dictionary changed size during iteration'.
# Makes are one at a time in a process (waiting on the lock lets go of the GIL).
_make_lock = threading.Lock()
def make(env_id, kwargs):
    with _make_lock:
        # MinAtar registers its envs through a Gymnasium plugin, which scripts/setup_python.sh removes (importing it
        # logs warnings on every `import gymnasium`): register them here when asked for.
        module, _, name = env_id.rpartition(':')
        if module == 'minatar' and name not in gym.registry:
            import minatar.gym
            minatar.gym.register_envs()
        opening()
        env = None
        try:
            kwargs = {k: _value(v) for k, v in kwargs}
            env = factory(env_id)(**kwargs) if env_id.startswith('/') else gym.make(env_id, **kwargs)
            return env, describe(env.observation_space), describe(env.action_space)
        except BaseException:
            closing(env)
            raise


def action_meanings(env):
    get = getattr(env.unwrapped, 'get_action_meanings', None)
    return None if get is None else [str(m) for m in get()]


def reset(env, seed):
    obs, _info = env.reset(seed=seed)
    return flatten(env.observation_space, obs)


def step(env, kind, action):
    if kind == 1:
        action = np.asarray(action, dtype=np.float32)
    elif kind == 2:
        action = np.asarray(action, dtype=np.int64)
    obs, reward, terminated, truncated, info = env.step(action)
    done = bool(terminated) or bool(truncated)
    objective = info.get('true_objective') if done and isinstance(info, dict) else None
    objective = None if objective is None else float(objective)
    lives = info.get('lives') if isinstance(info, dict) else None
    lives = None if lives is None else int(lives)
    return flatten(env.observation_space, obs), float(reward), bool(terminated), bool(truncated), objective, lives


def render(env):
    # Gymnasium envs read their render_mode at each render() call: set it to rgb_array on the env itself (classic
    # control draws with pygame, ALE returns its screen), whatever mode the env was made with.
    env.unwrapped.render_mode = 'rgb_array'
    frame = env.render()
    if frame is None:
        return None
    frame = np.ascontiguousarray(frame, dtype=np.uint8)
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError('render() gave an array of shape %r, not (height, width, 3)' % (frame.shape,))
    return int(frame.shape[1]), int(frame.shape[0]), frame.tobytes()


def set_state(env, state):
    u = env.unwrapped
    u.state = np.array(state, dtype=np.float64)
    for name in ('_get_obs', '_get_ob'):
        get = getattr(u, name, None)
        if get is not None:
            return np.ascontiguousarray(get(), dtype=np.float32).ravel()
    return np.asarray(state, dtype=np.float32)
";

/// Points the embedded interpreter at the installation whose libpython this binary links (`PYTHONHOME`, unless
/// set). Without it, the interpreter takes its standard library from the first `python3` on `PATH`, which may be
/// another installation of the same version (a system Python beside a pyenv one), whose extension modules then fail
/// to import. Call it first thing in `main`, while the process has one thread (it sets an environment variable);
/// `rlfactory::cli::main` does.
pub fn pin_python_home() {
    let Some(prefix) = option_env!("RLF_PYTHON_PREFIX") else {
        return;
    };
    if std::env::var_os("PYTHONHOME").is_none() && std::path::Path::new(prefix).is_dir() {
        std::env::set_var("PYTHONHOME", prefix);
    }
}

/// What the helper's `step` returns: the observation, reward, flags, the episode's
/// `info["true_objective"]` on the step that ends it, and `info["lives"]` when the env reports it.
type GymStep<'py> = (Bound<'py, PyAny>, f64, bool, bool, Option<f64>, Option<u32>);

/// A Gymnasium env made by `gymnasium.make(id)` in the embedded interpreter (see the module doc).
pub struct GymEnv {
    id: String,
    env: Py<PyAny>,
    reset_fn: Py<PyAny>,
    step_fn: Py<PyAny>,
    set_state_fn: Py<PyAny>,
    observation_space: Space,
    action_space: Space,
}

impl std::fmt::Debug for GymEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GymEnv")
            .field("id", &self.id)
            .field("observation_space", &self.observation_space)
            .field("action_space", &self.action_space)
            .finish_non_exhaustive()
    }
}

fn python_error<'a>(env: &'a str, call: &'static str) -> impl FnOnce(PyErr) -> EnvError + 'a {
    move |err| EnvError::Python {
        env: env.to_owned(),
        call,
        message: err.to_string(),
    }
}

/// The helper module, compiled once per process: it puts the venv's `site-packages` on `sys.path`
/// (see the module doc) and defines `describe` (a space as nested tuples, for [`translate`]) and
/// `flatten` (a value of a space as a flat `float32` array), which the PettingZoo bridge uses too.
/// Once, because its count of open envs (for pygame, see the helper's code) is one per process.
pub(crate) fn helper_module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    static HELPER_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    HELPER_MODULE
        .get_or_try_init(py, || {
            PyModule::from_code(py, HELPER, c"rlf_gym_bridge.py", c"rlf_gym_bridge").map(Bound::unbind)
        })
        .map(|module| module.bind(py).clone())
}

/// Imports the Python module `name` with the packages envs see (the venv's `site-packages`, see the module doc), for
/// the other users of the embedded interpreter (the `wandb` package of rlfactory's `--with_wandb`).
pub fn import_module<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyModule>> {
    helper_module(py)?;
    PyModule::import(py, name)
}

/// Builds a [`Space`] from the helper's `describe` tuple.
pub(crate) fn translate(desc: &Bound<'_, PyAny>) -> Result<Space, String> {
    let err = |e: PyErr| format!("bad space description: {e}");
    let kind: String = desc.get_item(0).and_then(|k| k.extract()).map_err(err)?;
    let item = |i: usize| desc.get_item(i).map_err(err);
    match kind.as_str() {
        "discrete" => Ok(Space::Discrete {
            n: item(1)?.extract().map_err(err)?,
            start: item(2)?.extract().map_err(err)?,
        }),
        "box" => {
            let b = BoxSpace::new(
                item(1)?.extract().map_err(err)?,
                item(2)?.extract().map_err(err)?,
                item(3)?.extract().map_err(err)?,
            );
            let bytes: bool = item(4)?.extract().map_err(err)?;
            b.and_then(|b| if bytes { b.into_bytes() } else { Ok(b) })
                .map(Space::Box)
                .map_err(|e| e.to_string())
        }
        "multidiscrete" => Ok(Space::MultiDiscrete(item(1)?.extract().map_err(err)?)),
        "dict" => {
            let parts: Vec<(String, Bound<'_, PyAny>)> = item(1)?.extract().map_err(err)?;
            parts
                .iter()
                .map(|(k, d)| Ok((k.clone(), translate(d)?)))
                .collect::<Result<_, String>>()
                .map(Space::Dict)
        }
        "tuple" => {
            let parts: Vec<Bound<'_, PyAny>> = item(1)?.extract().map_err(err)?;
            parts
                .iter()
                .map(translate)
                .collect::<Result<_, String>>()
                .map(Space::Tuple)
        }
        other => Err(format!("unknown space kind {other}")),
    }
}

impl GymEnv {
    /// Makes Gymnasium's env `id` (without the `gym:` prefix).
    pub fn make(id: &str) -> Result<Self, EnvError> {
        Self::make_with(id, &[])
    }

    /// Makes Gymnasium's env `id` with keyword arguments of `gymnasium.make`, each value written as text (an
    /// integer, a float, `true`, `false` or `none`, else a string).
    pub fn make_with(id: &str, kwargs: &[(String, String)]) -> Result<Self, EnvError> {
        Python::attach(|py| {
            let helper = helper_module(py).map_err(|e| EnvError::Python {
                env: id.to_owned(),
                call: "make",
                message: format!(
                    "{e} (is gymnasium installed? run scripts/setup_python.sh and export VIRTUAL_ENV or PYTHONPATH)"
                ),
            })?;
            let made = helper
                .getattr("make")
                .and_then(|f| f.call1((id, kwargs.to_vec())))
                .map_err(python_error(id, "make"))?;
            let (env, obs_desc, act_desc): (Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>) =
                made.extract().map_err(python_error(id, "make"))?;
            let space_error = |which: &str, reason: String| EnvError::Unsupported {
                env: format!("gym:{id}"),
                what: format!("its {which} space ({reason})"),
            };
            let spaces = translate(&obs_desc)
                .map_err(|r| space_error("observation", r))
                .and_then(|o| Ok((o, translate(&act_desc).map_err(|r| space_error("action", r))?)));
            let (observation_space, action_space) = match spaces {
                Ok(spaces) => spaces,
                Err(e) => {
                    // The env is made (and counted open): close it before giving up on it.
                    if let Err(err) = helper.getattr("closing").and_then(|c| c.call1((&env,))) {
                        err.print(py);
                    }
                    return Err(e);
                }
            };
            let function = |name: &str| {
                helper
                    .getattr(name)
                    .map(Bound::unbind)
                    .map_err(python_error(id, "make"))
            };
            Ok(Self {
                id: id.to_owned(),
                env: env.unbind(),
                reset_fn: function("reset")?,
                step_fn: function("step")?,
                set_state_fn: function("set_state")?,
                observation_space,
                action_space,
            })
        })
    }

    /// The meaning of each action (`env.unwrapped.get_action_meanings()`, Atari's `NOOP`, `FIRE`, ...), when the
    /// env has them.
    pub fn action_meanings(&self) -> Result<Option<Vec<String>>, EnvError> {
        Python::attach(|py| {
            let helper = helper_module(py).map_err(python_error(&self.id, "action_meanings"))?;
            helper
                .getattr("action_meanings")
                .and_then(|f| f.call1((self.env.bind(py),)))
                .and_then(|m| m.extract())
                .map_err(python_error(&self.id, "action_meanings"))
        })
    }

    /// Copies a flat `float32` array returned by the helper into `obs`.
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
                env: format!("gym:{}", self.id),
                call,
                expected: obs.len(),
                got: buffer.item_count(),
                space: self.observation_space.to_string(),
            });
        }
        buffer
            .copy_to_slice(py, obs)
            .map_err(python_error(&self.id, call))
    }

    fn check_buffer(&self, call: &str, obs: &[f32]) -> Result<(), EnvError> {
        crate::check_obs_buffer(&format!("gym:{}", self.id), call, &self.observation_space, obs)
    }
}

impl Env for GymEnv {
    fn id(&self) -> &str {
        &self.id
    }

    fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    fn action_space(&self) -> &Space {
        &self.action_space
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.check_buffer("reset", obs)?;
        Python::attach(|py| {
            let array = self
                .reset_fn
                .bind(py)
                .call1((self.env.bind(py), seed))
                .map_err(python_error(&self.id, "reset"))?;
            self.read_obs(py, "reset", &array, obs)
        })
    }

    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        self.check_buffer("step", obs)?;
        check_action(&format!("gym:{}", self.id), &self.action_space, action)?;
        Python::attach(|py| {
            let (kind, action) = match action {
                Action::Discrete(a) => (0u8, a.into_pyobject(py).map(Bound::into_any).map_err(PyErr::from)),
                Action::Continuous(x) => (1u8, x.into_pyobject(py).map(Bound::into_any)),
                Action::MultiDiscrete(x) => (2u8, x.into_pyobject(py).map(Bound::into_any)),
            };
            let action = action.map_err(python_error(&self.id, "step"))?;
            let result = self
                .step_fn
                .bind(py)
                .call1((self.env.bind(py), kind, action))
                .map_err(python_error(&self.id, "step"))?;
            let (array, reward, terminated, truncated, true_objective, lives): GymStep<'_> =
                result.extract().map_err(python_error(&self.id, "step"))?;
            self.read_obs(py, "step", &array, obs)?;
            Ok(Step {
                reward,
                terminated,
                truncated,
                info: Info {
                    episode: None,
                    true_objective,
                    lives,
                    life_lost: false,
                },
            })
        })
    }

    /// Sets `env.unwrapped.state` (classic-control envs keep their state there) and writes the
    /// observation from the env's `_get_obs`/`_get_ob` if it has one, else the state cast to `f32`.
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        Python::attach(|py| {
            let rendered = helper_module(py)
                .and_then(|helper| helper.getattr("render"))
                .and_then(|render| render.call1((self.env.bind(py),)))
                .and_then(|frame| frame.extract::<Option<(usize, usize, Vec<u8>)>>())
                .map_err(python_error(&self.id, "render"))?;
            Ok(rendered.map(|(width, height, rgb)| Frame { width, height, rgb }))
        })
    }

    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.check_buffer("set_state", obs)?;
        Python::attach(|py| {
            let array = self
                .set_state_fn
                .bind(py)
                .call1((self.env.bind(py), state))
                .map_err(python_error(&self.id, "set_state"))?;
            self.read_obs(py, "set_state", &array, obs)
        })
    }
}

impl Drop for GymEnv {
    fn drop(&mut self) {
        Python::attach(|py| {
            // Closing is best effort: an exception in `close` must not turn a drop into a panic.
            let closed = helper_module(py)
                .and_then(|helper| helper.getattr("closing"))
                .and_then(|closing| closing.call1((self.env.bind(py),)));
            if let Err(err) = closed {
                err.print(py);
            }
        });
    }
}
