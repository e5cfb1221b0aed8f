//! The PettingZoo bridge (feature `python`). Needs pettingzoo (and pygame) importable: run
//! `scripts/setup_python.sh` and export `VIRTUAL_ENV` (or `PYTHONPATH`) as it prints.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use rlf_env::connect_four::ConnectFour;
use rlf_env::pz::{PettingZooApi, PettingZooEnv};
use rlf_env::{parse_kwargs, ActionBatch, BoxSpace, EnvError, EnvRegistry, MultiAgentEnv, Space, VecBuffers};
use serde::Deserialize;

const CONNECT_FOUR: &str = "pza:pettingzoo.classic.connect_four_v3";
const SIMPLE_SPREAD: &str = "pz:pettingzoo.mpe.simple_spread_v3";
const SPREAD_KWARGS: &str = "N=3, max_cycles=25, continuous_actions=False";

#[derive(Deserialize)]
struct RecordedStep {
    agent: String,
    action: i64,
}

#[derive(Deserialize)]
struct Game {
    steps: Vec<RecordedStep>,
}

fn load_games() -> Vec<Game> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/connect_four_public.jsonl"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{path}: bad game: {e}")))
        .collect()
}

fn active(env: &dyn MultiAgentEnv) -> Vec<bool> {
    (0..env.num_agents()).map(|k| env.is_active(k)).collect()
}

fn spread(kwargs: &str) -> PettingZooEnv {
    PettingZooEnv::from_id(SIMPLE_SPREAD, &parse_kwargs(kwargs).unwrap()).unwrap()
}

#[test]
fn aec_connect_four_agrees_with_the_native_env_over_the_golden_games() {
    let games = load_games();
    let mut bridge = PettingZooEnv::from_id(CONNECT_FOUR, &[]).unwrap();
    assert_eq!(bridge.api(), PettingZooApi::Aec);
    assert_eq!(bridge.agents(), ["player_0", "player_1"]);
    let mut native = ConnectFour::new();
    assert_eq!(
        bridge.observation_space(),
        MultiAgentEnv::observation_space(&native)
    );
    assert_eq!(bridge.action_space(), MultiAgentEnv::action_space(&native));
    let dim = bridge.observation_space().flat_dim();
    assert_eq!(dim, 91, "7 mask values, then 6 x 7 x 2 board values");
    let (mut b, mut n) = (VecBuffers::new(2, dim), VecBuffers::new(2, dim));
    bridge.reset(Some(0), &mut b.obs).unwrap();
    native.reset(Some(0), &mut n.obs).unwrap();
    assert_eq!(b, n, "after reset");
    assert_eq!(active(&bridge), [true, false]);
    let mut moves = 0;
    for (g, game) in games.iter().enumerate() {
        for (t, step) in game.steps.iter().enumerate() {
            let mover = usize::from(step.agent == "player_1");
            assert_eq!(
                active(&bridge),
                active(&native),
                "game {g} step {t}: active before the move"
            );
            assert!(
                bridge.is_active(mover),
                "game {g} step {t}: {} should move",
                step.agent
            );
            // The other agent's action is out of range: it must be ignored.
            let mut actions = [-1; 2];
            actions[mover] = step.action;
            bridge.step(ActionBatch::Discrete(&actions), b.view()).unwrap();
            native.step(ActionBatch::Discrete(&actions), n.view()).unwrap();
            assert_eq!(b, n, "game {g} step {t}: observations, rewards and flags");
            assert_eq!(
                active(&bridge),
                active(&native),
                "game {g} step {t}: active after the move"
            );
            moves += 1;
        }
        // Every recorded game ends with a win: both envs reset within the last step.
        assert_eq!(b.terminated, [true, true], "game {g} ended");
        assert_eq!(b.rewards.iter().sum::<f32>(), 0.0, "game {g}: +1 and -1");
        let fresh = b.obs[..7] == [1.0; 7] && b.obs[7..].iter().all(|&v| v == 0.0);
        assert!(fresh, "game {g}: the next game's empty board, player_0 to move");
        assert_eq!(
            active(&bridge),
            [true, false],
            "game {g}: player_0 opens the next game"
        );
    }
    assert_eq!((games.len(), moves), (12, 294));

    let err = bridge.step(ActionBatch::Discrete(&[7, 0]), b.view()).unwrap_err();
    assert!(matches!(err, EnvError::InvalidAction { .. }), "{err}");
    let err = bridge.step(ActionBatch::Discrete(&[3]), b.view()).unwrap_err();
    assert!(matches!(err, EnvError::BufferSize { .. }), "{err}");
}

#[test]
fn connect_four_has_only_the_aec_api_so_pz_uses_it() {
    let env = EnvRegistry::with_builtin()
        .make_multi_agent("pz:pettingzoo.classic.connect_four_v3", &[])
        .unwrap();
    assert_eq!(env.id(), "pz:pettingzoo.classic.connect_four_v3");
    assert_eq!(env.num_agents(), 2);
    assert!(EnvRegistry::new().is_multi_agent("pz:pettingzoo.classic.connect_four_v3"));
    let single = EnvRegistry::new()
        .make("pz:pettingzoo.classic.connect_four_v3")
        .err();
    assert!(single
        .expect("multi-agent")
        .to_string()
        .contains("it is a multi-agent one"));
}

#[test]
fn parallel_simple_spread_truncates_every_agent_and_resets_in_the_same_step() {
    let mut env = spread(SPREAD_KWARGS);
    assert_eq!(env.api(), PettingZooApi::Parallel);
    assert_eq!(env.agents(), ["agent_0", "agent_1", "agent_2"]);
    assert_eq!(
        env.observation_space(),
        &Space::Box(BoxSpace::uniform(f32::NEG_INFINITY, f32::INFINITY, vec![18]).unwrap())
    );
    assert_eq!(env.action_space(), &Space::discrete(5));
    let mut buf = VecBuffers::new(3, 18);
    env.reset(Some(7), &mut buf.obs).unwrap();
    assert_eq!(active(&env), [true; 3]);
    for t in 1..=25 {
        let actions = [t % 5, (t + 1) % 5, (t + 3) % 5];
        env.step(ActionBatch::Discrete(&actions), buf.view()).unwrap();
        assert!(
            buf.rewards.iter().all(|r| r.is_finite()),
            "step {t}: {:?}",
            buf.rewards
        );
        assert_eq!(buf.terminated, [false; 3], "step {t}");
        assert_eq!(buf.truncated, [t == 25; 3], "step {t}");
        assert_eq!(active(&env), [true; 3], "step {t}");
        let at_rest = buf.obs.chunks(18).all(|obs| obs[..2] == [0.0, 0.0]);
        assert_eq!(
            at_rest,
            t == 25,
            "step {t}: velocities are zero only in a new episode"
        );
    }
}

#[test]
fn same_seed_same_trajectory_across_the_reset() {
    let run = |seed: u64| {
        let mut env = spread(SPREAD_KWARGS);
        let mut buf = VecBuffers::new(3, 18);
        env.reset(Some(seed), &mut buf.obs).unwrap();
        let mut trajectory = vec![buf.clone()];
        for t in 0..40 {
            let actions = [t % 5, (t * 2) % 5, (t * 3 + 1) % 5];
            env.step(ActionBatch::Discrete(&actions), buf.view()).unwrap();
            trajectory.push(buf.clone());
        }
        trajectory
    };
    let first = run(3);
    assert_eq!(first, run(3));
    assert_ne!(first[0].obs, run(4)[0].obs);
    assert!(first[25].truncated.iter().all(|&t| t) && !first[26].truncated[0]);
}

#[test]
fn aec_simple_spread_takes_turns_and_dead_steps_every_agent_at_the_end() {
    let kwargs = parse_kwargs("N=3, max_cycles=2, continuous_actions=False").unwrap();
    let mut env = PettingZooEnv::from_id("pza:pettingzoo.mpe.simple_spread_v3", &kwargs).unwrap();
    assert_eq!(env.api(), PettingZooApi::Aec);
    let mut buf = VecBuffers::new(3, 18);
    env.reset(Some(0), &mut buf.obs).unwrap();
    for t in 0..6 {
        let mover = t % 3;
        let mut expected = [false; 3];
        expected[mover] = true;
        assert_eq!(active(&env), expected, "turn {t}");
        env.step(ActionBatch::Discrete(&[1, 2, 3]), buf.view()).unwrap();
        // The world moves once all three acted: then every agent gets its (shared) reward.
        let cycle_end = mover == 2;
        assert!(
            buf.rewards
                .iter()
                .all(|&r| (r != 0.0) == cycle_end && r.is_finite()),
            "turn {t}"
        );
        assert_eq!(buf.truncated, [t == 5; 3], "turn {t}");
        assert_eq!(buf.terminated, [false; 3], "turn {t}");
    }
    assert_eq!(active(&env), [true, false, false], "reset within the last step");
}

/// A small AEC env: `a` terminates on its first move, `b` and `c` then alternate until `length`
/// moves in all, when both are truncated. The mover's reward is its action; every other live agent
/// loses 1. Observations: the move count and the keyword arguments as numbers.
const RELAY: &std::ffi::CStr = c"
import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv


class Relay(AECEnv):
    metadata = {'name': 'rlf_relay_v0'}

    def __init__(self, scale=1.0, label='', flag=False, length=5):
        super().__init__()
        self.possible_agents = ['a', 'b', 'c']
        self.config = [float(scale), float(len(label)), float(flag)]
        self.length = length

    def observation_space(self, agent):
        return spaces.Box(-np.inf, np.inf, (4,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.moves = 0
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = 'a'

    def observe(self, agent):
        return np.array([self.moves] + self.config, np.float32)

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            return self._was_dead_step(action)
        self.moves += 1
        self.rewards = {a: (float(action) if a == agent else -1.0) for a in self.agents}
        if agent == 'a':
            self.terminations['a'] = True
        if self.moves >= self.length:
            self.truncations = {a: True for a in self.agents}
        self.agent_selection = self.agents[(self.agents.index(agent) + 1) % len(self.agents)]
        self._accumulate_rewards()
        self._deads_step_first()


def env(**kwargs):
    return Relay(**kwargs)

";

/// The relay with a box of two for `c`'s actions (its move earns `10 x + y`), the others discrete.
const MIXED: &std::ffi::CStr = c"
import numpy as np
from gymnasium import spaces
from rlf_pz_relay import Relay


class Mixed(Relay):
    def action_space(self, agent):
        return spaces.Box(-1.0, 1.0, (2,), np.float32) if agent == 'c' else spaces.Discrete(3)

    def step(self, action):
        if action is not None and self.agent_selection == 'c':
            assert isinstance(action, np.ndarray) and action.shape == (2,), action
            action = float(10 * action[0] + action[1])
        elif action is not None:
            assert isinstance(action, int), action
        super().step(action)


def env(**kwargs):
    return Mixed(**kwargs)
";

/// A Parallel env of three agents: agent `k` earns `k + 1` per step and terminates after `k + 1`
/// steps. Like many hand-written Parallel envs, it reports every possible agent in its dicts, the
/// finished ones too (their flags stay true, their observations go on).
const COUNTDOWN: &std::ffi::CStr = c"
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class Countdown(ParallelEnv):
    metadata = {'name': 'rlf_countdown_v0'}

    def __init__(self):
        self.possible_agents = ['a', 'b', 'c']

    def observation_space(self, agent):
        return spaces.Box(0.0, 10.0, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert sorted(actions) == self.agents, 'actions for %s, live %s' % (sorted(actions), self.agents)
        self.t += 1
        everyone = self.possible_agents
        done = {a: self.t >= k + 1 for k, a in enumerate(everyone)}
        rewards = {a: (k + 1.0 if a in self.agents else 0.0) for k, a in enumerate(everyone)}
        observations = {a: np.full(1, self.t, np.float32) for a in everyone}
        self.agents = [a for a in self.agents if not done[a]]
        return observations, rewards, done, {a: False for a in everyone}, {a: {} for a in everyone}


def parallel_env():
    return Countdown()
";

/// Makes the test modules `rlf_pz_relay`, `rlf_pz_mixed` and `rlf_pz_countdown` importable (after
/// a first env put the venv on the path), once per process: tests run on several threads.
fn register_test_modules() {
    static REGISTERED: PyOnceLock<()> = PyOnceLock::new();
    drop(PettingZooEnv::from_id(CONNECT_FOUR, &[]).unwrap());
    Python::attach(|py| {
        REGISTERED
            .get_or_try_init(py, || {
                PyModule::from_code(py, RELAY, c"rlf_pz_relay.py", c"rlf_pz_relay")?;
                PyModule::from_code(py, MIXED, c"rlf_pz_mixed.py", c"rlf_pz_mixed")?;
                PyModule::from_code(py, COUNTDOWN, c"rlf_pz_countdown.py", c"rlf_pz_countdown").map(drop)
            })
            .copied()
    })
    .unwrap();
}

#[test]
fn parallel_agents_that_finish_early_report_once_and_act_no_more() {
    register_test_modules();
    let mut env = PettingZooEnv::from_id("pz:rlf_pz_countdown", &[]).unwrap();
    assert_eq!(env.api(), PettingZooApi::Parallel);
    let mut buf = VecBuffers::new(3, 1);
    env.reset(Some(0), &mut buf.obs).unwrap();
    let expected = [
        // rewards, terminated, observations, active afterwards
        (
            [1.0, 2.0, 3.0],
            [true, false, false],
            [1.0, 1.0, 1.0],
            [false, true, true],
        ),
        (
            [0.0, 2.0, 3.0],
            [false, true, false],
            [0.0, 2.0, 2.0],
            [false, false, true],
        ),
        // c finishes last: the env resets within the step.
        (
            [0.0, 0.0, 3.0],
            [false, false, true],
            [0.0, 0.0, 0.0],
            [true, true, true],
        ),
        (
            [1.0, 2.0, 3.0],
            [true, false, false],
            [1.0, 1.0, 1.0],
            [false, true, true],
        ),
    ];
    for (t, (rewards, terminated, obs, next_active)) in expected.into_iter().enumerate() {
        env.step(ActionBatch::Discrete(&[1, 0, 1]), buf.view()).unwrap();
        assert_eq!(buf.rewards, rewards, "step {t}");
        assert_eq!(buf.terminated, terminated, "step {t}");
        assert_eq!(buf.truncated, [false; 3], "step {t}");
        assert_eq!(buf.obs, obs, "step {t}");
        assert_eq!(active(&env), next_active, "step {t}");
    }
}

#[test]
fn agents_ending_at_different_times_report_once_and_go_quiet() {
    register_test_modules();
    let kwargs = parse_kwargs("scale=2.5, label=hello, flag=True, length=4").unwrap();
    let mut env = EnvRegistry::new()
        .make_multi_agent("pz:rlf_pz_relay", &kwargs)
        .unwrap();
    let mut buf = VecBuffers::new(3, 4);
    env.reset(None, &mut buf.obs).unwrap();
    // Literals were evaluated (2.5, True), `hello` passed as a string.
    assert_eq!(buf.obs, [[0.0, 2.5, 5.0, 1.0]; 3].concat());
    assert_eq!(active(&*env), [true, false, false]);

    // a moves (action 2) and terminates; its dead step happens within this step.
    env.step(ActionBatch::Discrete(&[2, 99, 99]), buf.view()).unwrap();
    assert_eq!(buf.rewards, [2.0, -1.0, -1.0]);
    assert_eq!(
        (buf.terminated.as_slice(), buf.truncated.as_slice()),
        (&[true, false, false][..], &[false; 3][..])
    );
    assert_eq!(
        buf.obs,
        [[1.0, 2.5, 5.0, 1.0]; 3].concat(),
        "a's final observation"
    );
    assert_eq!(active(&*env), [false, true, false]);

    // b moves (1): a is gone (no reward, no flag, zero observation).
    env.step(ActionBatch::Discrete(&[99, 1, 99]), buf.view()).unwrap();
    assert_eq!(buf.rewards, [0.0, 1.0, -1.0]);
    assert_eq!(buf.terminated, [false; 3]);
    assert_eq!(buf.obs[..4], [0.0; 4]);
    assert_eq!(buf.obs[4..], [[2.0, 2.5, 5.0, 1.0]; 2].concat());
    assert_eq!(active(&*env), [false, false, true]);

    env.step(ActionBatch::Discrete(&[99, 99, 0]), buf.view()).unwrap();
    assert_eq!(buf.rewards, [0.0, -1.0, 0.0]);
    assert_eq!(active(&*env), [false, true, false]);
    let err = env
        .step(ActionBatch::Discrete(&[0, 3, 0]), buf.view())
        .unwrap_err();
    assert!(matches!(err, EnvError::InvalidAction { .. }), "{err}");

    // b's move (2) is the fourth: b and c are truncated, dead-stepped, and the env resets.
    env.step(ActionBatch::Discrete(&[99, 2, 99]), buf.view()).unwrap();
    assert_eq!(buf.rewards, [0.0, 2.0, -1.0]);
    assert_eq!(buf.truncated, [false, true, true]);
    assert_eq!(buf.terminated, [false; 3]);
    assert_eq!(buf.obs, [[0.0, 2.5, 5.0, 1.0]; 3].concat(), "the new episode");
    assert_eq!(active(&*env), [true, false, false]);
}

/// The error of making `id` with `kwargs`, which must be one line.
fn make_error(id: &str, kwargs: &str) -> EnvError {
    let err = EnvRegistry::with_builtin()
        .make_multi_agent(id, &parse_kwargs(kwargs).unwrap())
        .err()
        .unwrap_or_else(|| panic!("{id} with {kwargs:?} should fail"));
    assert!(!err.to_string().contains('\n'), "one line: {err}");
    err
}

#[test]
fn bad_modules_kwargs_and_spaces_are_clear_errors() {
    let err = make_error("pz:pettingzoo.mpe.no_such_env_v0", "");
    assert!(
        matches!(&err, EnvError::PettingZoo { call: "make", .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with(
            "pz:pettingzoo.mpe.no_such_env_v0: Python raised during make: ModuleNotFoundError: No module \
             named 'pettingzoo.mpe.no_such_env_v0' (is it installed?"
        ),
        "{err}"
    );

    let err = make_error(SIMPLE_SPREAD, "N=3, colour=red");
    assert!(
        err.to_string().starts_with(&format!(
            "{SIMPLE_SPREAD}: Python raised during make: TypeError: "
        )) && err.to_string().contains("unexpected keyword argument 'colour'"),
        "{err}"
    );

    let err = make_error("pz:json", "");
    assert_eq!(
        err.to_string(),
        "pz:json: Python raised during make: AttributeError: module json has no parallel_env() or env(): not \
         a PettingZoo env module"
    );
}

/// MPE's simple_adversary: the adversary sees 8 values, the good agents 10. Every slot is 10
/// values long, the adversary's observation in its first 8 and zeros after; each agent's own
/// spaces are reported.
#[test]
fn agents_with_different_observation_spaces_share_slots_as_wide_as_the_largest() {
    let mut env = PettingZooEnv::from_id("pz:pettingzoo.mpe.simple_adversary_v3", &[]).unwrap();
    assert_eq!(env.obs_dim(), 10);
    let dims: Vec<usize> = (0..3)
        .map(|a| env.agent_observation_space(a).flat_dim())
        .collect();
    assert_eq!(dims, [8, 10, 10]);
    assert!((0..3).all(|a| env.agent_action_space(a) == &Space::Discrete { n: 5, start: 0 }));
    let mut buf = VecBuffers::new(3, 10);
    buf.obs.fill(9.0);
    env.reset(Some(3), &mut buf.obs).unwrap();
    for _ in 0..30 {
        assert_eq!(buf.obs[8..10], [0.0, 0.0], "the adversary's padding");
        assert!(
            buf.obs[..8].iter().any(|&v| v != 0.0),
            "the adversary's observation"
        );
        assert!(buf.obs[10..].iter().all(|v| v.is_finite()));
        env.step(ActionBatch::Discrete(&[1, 2, 3]), buf.view()).unwrap();
    }
}

/// Agents whose action spaces differ in kind (`a` and `b` discrete, `c` a box of two): slots of two
/// values, each agent's read by its own space from a mixed batch; `c` gets its box as a NumPy array and
/// `b` its category as an int.
#[test]
fn agents_with_action_spaces_of_different_kinds_read_their_own_slots() {
    register_test_modules();
    let mut env = PettingZooEnv::from_id("pza:rlf_pz_mixed", &[]).unwrap();
    assert_eq!(
        rlf_env::action_slots(
            "test",
            &[
                env.agent_action_space(0).clone(),
                env.agent_action_space(2).clone()
            ]
        )
        .unwrap(),
        rlf_env::ActionSlots { size: 2, mixed: true }
    );
    let mut buf = VecBuffers::new(3, 4);
    env.reset(Some(0), &mut buf.obs).unwrap();
    let ints = [2, 0, 1, 0, 0, 0];
    let floats = [2.0, 0.0, 1.0, 0.0, 0.5, -0.25];
    let batch = ActionBatch::Mixed {
        ints: &ints,
        floats: &floats,
    };
    // a moves (2), then b (1), then c ([0.5, -0.25]: 4.75).
    for (mover, earned) in [(0, 2.0), (1, 1.0), (2, 4.75)] {
        assert!(env.is_active(mover), "agent {mover} to move");
        env.step(batch, buf.view()).unwrap();
        assert_eq!(buf.rewards[mover], earned, "agent {mover}: {:?}", buf.rewards);
    }
    let too_wide = [0.0; 9];
    assert!(env.step(ActionBatch::Continuous(&too_wide), buf.view()).is_err());
}

#[test]
fn an_absolute_path_is_a_pickled_callable_whose_env_picks_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let pickle = |name: &str, expression: &str| {
        let path = dir.path().join(name).to_str().unwrap().to_owned();
        Python::attach(|py| {
            let code = std::ffi::CString::new(format!(
                "import cloudpickle, importlib\nwith open({path:?}, 'wb') as f:\n    cloudpickle.dump({expression}, f)\n"
            ))
            .unwrap();
            py.run(&code, None, None).unwrap();
        });
        format!("pz:{path}")
    };
    let registry = EnvRegistry::with_builtin();
    let parallel = pickle(
        "spread.pkl",
        "importlib.import_module('pettingzoo.mpe.simple_spread_v3').parallel_env",
    );
    assert!(registry.is_multi_agent(&parallel));
    let kwargs = parse_kwargs(SPREAD_KWARGS).unwrap();
    let env = PettingZooEnv::from_id(&parallel, &kwargs).unwrap();
    assert_eq!(env.api(), PettingZooApi::Parallel);
    assert_eq!(env.agents(), ["agent_0", "agent_1", "agent_2"]);
    let aec = pickle(
        "connect_four.pkl",
        "importlib.import_module('pettingzoo.classic.connect_four_v3').env",
    );
    let env = PettingZooEnv::from_id(&aec, &[]).unwrap();
    assert_eq!(
        env.api(),
        PettingZooApi::Aec,
        "an env with agent_iter takes turns"
    );
    assert_eq!(env.agents(), ["player_0", "player_1"]);
}
