//! The Gymnasium bridge (feature `python`). Needs gymnasium importable: run
//! `scripts/setup_python.sh` and export `VIRTUAL_ENV` (or `PYTHONPATH`) as it prints.

use pyo3::prelude::*;
use rlf_env::gym::GymEnv;
use rlf_env::{Action, ActionBatch, Env, EnvError, EnvRegistry, VecBuffers, VecEnv};

/// Steps the native env and Gymnasium's from the same state with the same actions; every step
/// must agree exactly. Returns the number of steps compared.
fn compare(id: &str, state: &[f64], actions: &[Action<'_>]) -> usize {
    let registry = EnvRegistry::with_builtin();
    let mut native = registry.make(id).unwrap();
    let mut gym = registry.make(&format!("gym:{id}")).unwrap();
    assert_eq!(native.observation_space(), gym.observation_space(), "{id}");
    assert_eq!(native.action_space(), gym.action_space(), "{id}");
    let dim = native.observation_space().flat_dim();
    let (mut on, mut og) = (vec![0.0; dim], vec![0.0; dim]);
    native.reset(Some(0), &mut on).unwrap();
    gym.reset(Some(0), &mut og).unwrap();
    native.set_state(state, &mut on).unwrap();
    gym.set_state(state, &mut og).unwrap();
    assert_eq!(on, og, "{id}: observation after set_state");
    for (t, action) in actions.iter().enumerate() {
        let sn = native.step(*action, &mut on).unwrap();
        let sg = gym.step(*action, &mut og).unwrap();
        assert_eq!(on, og, "{id} step {t}: observation");
        assert_eq!(sn, sg, "{id} step {t}: reward and flags");
        if sn.terminated || sn.truncated {
            return t + 1;
        }
    }
    actions.len()
}

#[test]
fn gym_cartpole_agrees_with_native_cartpole() {
    // Alternating pushes, then always right until the pole falls (terminated, both agree on it).
    let actions: Vec<Action<'_>> = (0..600)
        .map(|t| Action::Discrete(if t < 10 { t % 2 } else { 1 }))
        .collect();
    let steps = compare("CartPole-v1", &[0.01, -0.02, 0.03, 0.04], &actions);
    assert!(
        (11..600).contains(&steps),
        "the episode should end by termination, took {steps} steps"
    );
}

#[test]
fn gym_continuous_and_three_action_envs_agree_with_native() {
    let torques: Vec<[f32; 1]> = (0..250).map(|t| [((t * 37) % 11) as f32 - 5.0]).collect();
    let actions: Vec<Action<'_>> = torques.iter().map(|a| Action::Continuous(a)).collect();
    assert_eq!(
        compare("Pendulum-v1", &[2.5, -0.3], &actions),
        200,
        "truncated at 200"
    );
    let actions: Vec<Action<'_>> = (0..300).map(|t| Action::Discrete((t / 7) % 3)).collect();
    assert_eq!(compare("Acrobot-v1", &[0.05, -0.02, 0.01, 0.03], &actions), 300);
}

const BAD_ENVS: &std::ffi::CStr = c"
import numpy as np
import gymnasium as gym
from gymnasium import spaces

class RlfRaising(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        raise RuntimeError('boom from inside the env')

class RlfWrongShape(RlfRaising):
    def step(self, action):
        return np.zeros(5, np.float32), 0.0, False, False, {}

class RlfNan(RlfRaising):
    def step(self, action):
        return np.array([0.0, np.nan, 0.0], np.float32), 0.0, False, False, {}

for cls in (RlfRaising, RlfWrongShape, RlfNan):
    if cls.__name__ + '-v0' not in gym.registry:
        gym.register(id=cls.__name__ + '-v0', entry_point=cls)
";

/// Registers the misbehaving test envs with Gymnasium (after a first `make` put the venv on the path).
fn register_bad_envs() {
    drop(GymEnv::make("CartPole-v1").unwrap());
    Python::attach(|py| py.run(BAD_ENVS, None, None)).unwrap();
}

#[test]
fn a_raising_python_env_gives_a_clear_error() {
    register_bad_envs();
    let mut env = EnvRegistry::new().make("gym:RlfRaising-v0").unwrap();
    let mut obs = [0.0; 3];
    env.reset(Some(1), &mut obs).unwrap();
    let err = env.step(Action::Discrete(1), &mut obs).unwrap_err();
    assert!(
        matches!(&err, EnvError::Python { env, call: "step", .. } if env == "RlfRaising-v0"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "gym:RlfRaising-v0: Python raised during step: RuntimeError: boom from inside the env"
    );
}

#[test]
fn bad_observations_and_actions_are_errors() {
    register_bad_envs();
    let registry = EnvRegistry::new();
    let mut env = registry.make("gym:RlfWrongShape-v0").unwrap();
    let mut obs = [0.0; 3];
    env.reset(None, &mut obs).unwrap();
    let err = env.step(Action::Discrete(0), &mut obs).unwrap_err();
    assert_eq!(
        err.to_string(),
        "gym:RlfWrongShape-v0: step returned an observation of 5 values, but its observation space \
         Box(-1.0, 1.0, (3,), float32) has 3"
    );
    let err = env.step(Action::Discrete(2), &mut obs).unwrap_err();
    assert!(matches!(err, EnvError::InvalidAction { .. }), "{err}");

    let mut venv = VecEnv::from_registry(&registry, "gym:RlfNan-v0", 2).unwrap();
    let mut buf = VecBuffers::new(2, 3);
    venv.reset(Some(0), &mut buf.obs).unwrap();
    let err = venv.step(ActionBatch::Discrete(&[0, 1]), buf.view()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "vector env slot 0: RlfNan-v0: step returned an observation with NaN at flat index 1"
    );
}

#[test]
fn unknown_gym_ids_are_python_errors_at_make() {
    let err = EnvRegistry::new()
        .make("gym:NoSuchEnv-v9")
        .err()
        .expect("unknown id");
    assert!(matches!(&err, EnvError::Python { call: "make", .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("gym:NoSuchEnv-v9: Python raised during make: "),
        "{err}"
    );
}

/// Two modules that register many envs on import (as ale_py and MinAtar do): every `gym.register` iterates
/// Gymnasium's registry, so a second thread registering at the same time would change the dict under it.
const REGISTERING_MODULES: &std::ffi::CStr = cr"
import os, sys, tempfile
root = tempfile.mkdtemp(prefix='rlf_registering_')
for name in ('a', 'b'):
    with open(os.path.join(root, 'rlf_registering_%s.py' % name), 'w') as f:
        f.write('import gymnasium as gym\n'
                'for i in range(3000):\n'
                '    gym.register(id=\'RlfRegistering%s\' + str(i) + \'-v0\',\n'
                '                 entry_point=\'gymnasium.envs.classic_control:CartPoleEnv\')\n' % name.upper())
sys.path.insert(0, root)
";

#[test]
fn makes_from_several_threads_that_import_registering_modules_do_not_race() {
    drop(GymEnv::make("CartPole-v1").unwrap());
    Python::attach(|py| py.run(REGISTERING_MODULES, None, None)).unwrap();
    let makers: Vec<_> = ["A", "B"]
        .into_iter()
        .map(|name| {
            std::thread::spawn(move || {
                let id = format!("rlf_registering_{}:RlfRegistering{name}0-v0", name.to_lowercase());
                GymEnv::make(&id).map(drop).map_err(|e| e.to_string())
            })
        })
        .collect();
    let made: Vec<_> = makers
        .into_iter()
        .map(|m| m.join().expect("the thread"))
        .collect();
    Python::attach(|py| py.run(c"import shutil; shutil.rmtree(root)", None, None)).unwrap();
    for result in made {
        result.expect("make");
    }
}

/// Pickles `expression` (a callable) into a new file of a temporary folder with cloudpickle, as
/// `rlfactory.train(env=...)` does. Returns the folder and the file.
fn pickled_factory(expression: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("factory.pkl").to_str().unwrap().to_owned();
    Python::attach(|py| {
        let code = std::ffi::CString::new(format!(
            "import functools, cloudpickle, gymnasium\nwith open({path:?}, 'wb') as f:\n    cloudpickle.dump({expression}, f)\n"
        ))
        .unwrap();
        py.run(&code, None, None).unwrap();
    });
    (dir, path)
}

#[test]
fn an_absolute_path_is_a_pickled_callable_that_makes_the_env() {
    let (_dir, path) = pickled_factory("functools.partial(gymnasium.make, 'CartPole-v1')");
    let registry = EnvRegistry::with_builtin();
    let mut made = registry.make(&format!("gym:{path}")).unwrap();
    let mut reference = registry.make("gym:CartPole-v1").unwrap();
    assert_eq!(made.observation_space(), reference.observation_space());
    let (mut a, mut b) = (vec![0.0; 4], vec![0.0; 4]);
    made.reset(Some(3), &mut a).unwrap();
    reference.reset(Some(3), &mut b).unwrap();
    assert_eq!(a, b);
    for t in 0..20 {
        let (sa, sb) = (
            made.step(Action::Discrete(t % 2), &mut a).unwrap(),
            reference.step(Action::Discrete(t % 2), &mut b).unwrap(),
        );
        assert_eq!((sa, &a), (sb, &b), "step {t}");
    }
    let missing = registry.make("gym:/no/such/factory.pkl").err().expect("no file");
    let text = missing.to_string();
    assert!(
        text.contains("gym:/no/such/factory.pkl") && text.contains("No such file"),
        "{text}"
    );
}
