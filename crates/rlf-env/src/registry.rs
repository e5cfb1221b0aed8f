//! [`EnvRegistry`]: a value mapping env ids to constructors (no global state).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::classic::{Acrobot, CartPole, MountainCar, MountainCarContinuous, Pendulum};
use crate::connect_four::{ConnectFour, TeamConnectFour, MAX_PLAYERS_PER_SIDE};
use crate::treasurehunt::{Treasurehunt, TreasurehuntConfig};
use crate::wrappers::{ResizeImage, TimeLimit};
use crate::{Env, EnvError, MultiAgentEnv};

/// A constructor of boxed envs.
pub type EnvConstructor = Arc<dyn Fn() -> Result<Box<dyn Env>, EnvError> + Send + Sync>;

/// An env's keyword arguments (`key=value` pairs, in order), as `--env_kwargs` gives them.
pub type EnvKwargs = [(String, String)];

/// A constructor of boxed multi-agent envs from keyword arguments.
pub type MultiAgentConstructor =
    Arc<dyn Fn(&EnvKwargs) -> Result<Box<dyn MultiAgentEnv>, EnvError> + Send + Sync>;

/// Parses `key=value,key=value` (spaces around either ignored; empty: no pairs) into pairs; a
/// part without `=` or with an empty key is an error naming it.
pub fn parse_kwargs(text: &str) -> Result<Vec<(String, String)>, EnvError> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| match part.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err(EnvError::InvalidConfig {
                env: "env kwargs".into(),
                reason: format!("`{part}` is not `key=value`"),
            }),
        })
        .collect()
}

/// A built-in env: id, time limit, constructor.
type Builtin = (&'static str, u64, fn() -> Box<dyn Env>);

#[derive(Clone)]
struct Entry {
    constructor: EnvConstructor,
    max_episode_steps: Option<u64>,
}

/// Maps env ids to constructors, as Gymnasium's registry, but as a plain value: build one, add your
/// envs, and pass it where envs are made.
///
/// Ids starting with `gym:` are not looked up here: they go to the Gymnasium bridge
/// (`gym:CartPole-v1` runs Gymnasium's own CartPole in an embedded interpreter), which needs the
/// `python` feature. Likewise ids starting with `pz:` or `pza:` are multi-agent envs of the
/// PettingZoo bridge (`pz:pettingzoo.mpe.simple_spread_v3`).
#[derive(Clone, Default)]
pub struct EnvRegistry {
    entries: BTreeMap<String, Entry>,
    multi_agent: BTreeMap<String, MultiAgentConstructor>,
}

impl std::fmt::Debug for EnvRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvRegistry").field("ids", &self.ids()).finish()
    }
}

/// The prefix of ids served by the Gymnasium bridge.
pub const GYM_PREFIX: &str = "gym:";

/// The prefix of multi-agent ids served by the PettingZoo bridge: `pz:<module>` drives the
/// module's Parallel API (`parallel_env`) when it has one, its AEC API (`env`) otherwise.
pub const PETTINGZOO_PREFIX: &str = "pz:";

/// The prefix of multi-agent ids served by the PettingZoo bridge through the AEC API (`env`), even
/// when the module also has `parallel_env`.
pub const PETTINGZOO_AEC_PREFIX: &str = "pza:";

/// Whether `id` is served by the PettingZoo bridge.
fn is_pettingzoo(id: &str) -> bool {
    id.starts_with(PETTINGZOO_PREFIX) || id.starts_with(PETTINGZOO_AEC_PREFIX)
}

/// Whether making `id` starts an embedded Python interpreter (the Gymnasium or PettingZoo
/// bridge): a process that made one must not be forked.
pub fn runs_python(id: &str) -> bool {
    id.starts_with(GYM_PREFIX)
        || is_pettingzoo(id)
        || ATARI_GAMES.iter().any(|&(name, _)| name == id)
        || BRIDGED_ENVS.iter().any(|&(name, _, _)| name == id)
}

impl EnvRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry with the native classic-control envs and Gymnasium's time limits:
    /// `CartPole-v1` (500 steps), `Acrobot-v1` (500), `MountainCar-v0` (200),
    /// `MountainCarContinuous-v0` (999), `Pendulum-v1` (200); and the native multi-agent envs
    /// `connect_four` (PettingZoo's `connect_four_v3`; kwarg `players_per_side` for teams, [`TeamConnectFour`]) and `treasurehunt` (kwargs: the
    /// fields of [`TreasurehuntConfig`]).
    pub fn with_builtin() -> Self {
        let mut registry = Self::new();
        let builtin: [Builtin; 5] = [
            ("CartPole-v1", 500, || Box::new(CartPole::new())),
            ("Acrobot-v1", 500, || Box::new(Acrobot::new())),
            ("MountainCar-v0", 200, || Box::new(MountainCar::new())),
            ("MountainCarContinuous-v0", 999, || {
                Box::new(MountainCarContinuous::new())
            }),
            ("Pendulum-v1", 200, || Box::new(Pendulum::new())),
        ];
        for (id, game) in ATARI_GAMES {
            registry.entries.insert(
                id.to_owned(),
                Entry {
                    constructor: Arc::new(move || make_atari(game)),
                    max_episode_steps: None,
                },
            );
        }
        for (id, gym_id, kwargs) in BRIDGED_ENVS {
            registry.entries.insert(
                id.to_owned(),
                Entry {
                    constructor: Arc::new(move || {
                        let env = make_bridged(gym_id, kwargs)?;
                        Ok(if id.starts_with("doom_") {
                            Box::new(ResizeImage::new(
                                env,
                                Some("screen"),
                                DOOM_SCREEN[0],
                                DOOM_SCREEN[1],
                            )?)
                        } else {
                            env
                        })
                    }),
                    max_episode_steps: None,
                },
            );
        }
        for (id, steps, make) in builtin {
            registry.entries.insert(
                id.to_owned(),
                Entry {
                    constructor: Arc::new(move || Ok(make())),
                    max_episode_steps: Some(steps),
                },
            );
        }
        let connect_four: MultiAgentConstructor = Arc::new(|kwargs: &EnvKwargs| {
            let invalid = |reason: String| EnvError::InvalidConfig {
                env: "connect_four".into(),
                reason,
            };
            let mut per_side = 1;
            for (key, value) in kwargs {
                match key.as_str() {
                    "players_per_side" => {
                        per_side = value
                            .parse()
                            .ok()
                            .filter(|k: &usize| (1..=MAX_PLAYERS_PER_SIDE).contains(k))
                            .ok_or_else(|| {
                                invalid(format!(
                                    "players_per_side `{value}` is not a whole number from 1 to {MAX_PLAYERS_PER_SIDE}"
                                ))
                            })?;
                    }
                    _ => {
                        return Err(invalid(format!(
                            "unknown keyword argument `{key}` (it takes players_per_side)"
                        )))
                    }
                }
            }
            Ok(if per_side == 1 {
                Box::new(ConnectFour::new()) as Box<dyn MultiAgentEnv>
            } else {
                Box::new(TeamConnectFour::new(per_side)?)
            })
        });
        let treasurehunt: MultiAgentConstructor = Arc::new(|kwargs: &EnvKwargs| {
            let config = TreasurehuntConfig::from_kwargs(kwargs)?;
            Ok(Box::new(Treasurehunt::new(config)?) as Box<dyn MultiAgentEnv>)
        });
        registry.multi_agent.insert("connect_four".into(), connect_four);
        registry.multi_agent.insert("treasurehunt".into(), treasurehunt);
        registry
    }

    /// Adds the multi-agent env `id`, built by `make` from its keyword arguments. Ids are unique
    /// across both kinds and must not start with `gym:`, `pz:` or `pza:`.
    pub fn register_multi_agent<F>(&mut self, id: &str, make: F) -> Result<(), EnvError>
    where
        F: Fn(&EnvKwargs) -> Result<Box<dyn MultiAgentEnv>, EnvError> + Send + Sync + 'static,
    {
        self.check_new_id(id)?;
        self.multi_agent.insert(id.to_owned(), Arc::new(make));
        Ok(())
    }

    /// Whether `id` names a multi-agent env: a registered one, or a PettingZoo env (`pz:<module>`,
    /// `pza:<module>`).
    pub fn is_multi_agent(&self, id: &str) -> bool {
        self.multi_agent.contains_key(id) || is_pettingzoo(id)
    }

    /// Makes the multi-agent env `id` with `kwargs`. `pz:<module>` and `pza:<module>` make the
    /// PettingZoo env of `<module>` through the bridge (feature `python`; see `rlf_env::pz`). An
    /// unknown id is an [`EnvError::UnknownEnv`]; a single-agent id is an error saying so.
    pub fn make_multi_agent(&self, id: &str, kwargs: &EnvKwargs) -> Result<Box<dyn MultiAgentEnv>, EnvError> {
        if is_pettingzoo(id) {
            return make_pettingzoo(id, kwargs);
        }
        match self.multi_agent.get(id) {
            Some(make) => make(kwargs),
            None if self.entries.contains_key(id) || id.starts_with(GYM_PREFIX) => {
                Err(EnvError::Unsupported {
                    env: id.to_owned(),
                    what: "making it as a multi-agent env (it is a single-agent one)".into(),
                })
            }
            None => Err(EnvError::UnknownEnv {
                id: id.to_owned(),
                known: self.ids(),
            }),
        }
    }

    fn check_new_id(&self, id: &str) -> Result<(), EnvError> {
        if id.starts_with(GYM_PREFIX) {
            return Err(EnvError::Unsupported {
                env: id.to_owned(),
                what: format!(
                    "registering an id starting with `{GYM_PREFIX}` (reserved for the Gymnasium bridge)"
                ),
            });
        }
        if is_pettingzoo(id) {
            return Err(EnvError::Unsupported {
                env: id.to_owned(),
                what: format!(
                    "registering an id starting with `{PETTINGZOO_PREFIX}` or `{PETTINGZOO_AEC_PREFIX}` \
                     (reserved for the PettingZoo bridge)"
                ),
            });
        }
        if self.entries.contains_key(id) || self.multi_agent.contains_key(id) {
            return Err(EnvError::DuplicateEnv(id.to_owned()));
        }
        Ok(())
    }

    /// Adds `id`; `make` builds the bare env and, with `Some(n)`, [`make`](Self::make) wraps it in
    /// a [`TimeLimit`] of `n` steps. Ids are unique and must not start with `gym:`, `pz:` or
    /// `pza:`.
    pub fn register<F>(&mut self, id: &str, max_episode_steps: Option<u64>, make: F) -> Result<(), EnvError>
    where
        F: Fn() -> Result<Box<dyn Env>, EnvError> + Send + Sync + 'static,
    {
        self.check_new_id(id)?;
        self.entries.insert(
            id.to_owned(),
            Entry {
                constructor: Arc::new(make),
                max_episode_steps,
            },
        );
        Ok(())
    }

    /// The registered ids of both kinds, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .entries
            .keys()
            .chain(self.multi_agent.keys())
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    /// The registered time limit of `id`, if any.
    pub fn max_episode_steps(&self, id: &str) -> Option<u64> {
        self.entries.get(id).and_then(|e| e.max_episode_steps)
    }

    /// Makes the env `id`, with its time limit. `gym:<id>` makes Gymnasium's env `<id>` through the
    /// bridge (its own `gymnasium.make` applies the time limit). An unknown id is an
    /// [`EnvError::UnknownEnv`] listing the known ones.
    pub fn make(&self, id: &str) -> Result<Box<dyn Env>, EnvError> {
        if let Some(gym_id) = id.strip_prefix(GYM_PREFIX) {
            return make_gym(gym_id);
        }
        if self.is_multi_agent(id) {
            return Err(EnvError::Unsupported {
                env: id.to_owned(),
                what: "making it as a single-agent env (it is a multi-agent one)".into(),
            });
        }
        let Some(entry) = self.entries.get(id) else {
            return Err(EnvError::UnknownEnv {
                id: id.to_owned(),
                known: self.ids(),
            });
        };
        let env = (entry.constructor)()?;
        Ok(match entry.max_episode_steps {
            Some(steps) => Box::new(TimeLimit::new(env, steps)),
            None => env,
        })
    }
}

/// Sample Factory's Atari env names and the ALE games they stand for.
pub const ATARI_GAMES: [(&str, &str); 10] = [
    ("atari_pong", "Pong"),
    ("atari_breakout", "Breakout"),
    ("atari_spaceinvaders", "SpaceInvaders"),
    ("atari_qbert", "Qbert"),
    ("atari_beamrider", "BeamRider"),
    ("atari_seaquest", "Seaquest"),
    ("atari_enduro", "Enduro"),
    ("atari_mspacman", "MsPacman"),
    ("atari_asteroids", "Asteroids"),
    ("atari_montezuma", "MontezumaRevenge"),
];

/// The height and width of a `doom_*` env's screen: Sample Factory's VizDoom resolution (`--res_h 72 --res_w 128`).
pub const DOOM_SCREEN: [usize; 2] = [72, 128];

/// Named envs of other suites made through the Gymnasium bridge as they are: the id, the module to import and
/// Gymnasium's id, and keyword arguments of `gymnasium.make` (`key=value,...`). MinAtar's games (10×10 frames of
/// a few channels) and VizDoom's built-in scenarios (Sample Factory's `doom_*` names; a Dict of the game variables
/// and the RGB screen, rendered at 240×320 and resized to [`DOOM_SCREEN`], four frames per step).
pub const BRIDGED_ENVS: [(&str, &str, &str); 11] = [
    ("minatar_asterix", "minatar:MinAtar/Asterix-v1", ""),
    ("minatar_breakout", "minatar:MinAtar/Breakout-v1", ""),
    ("minatar_freeway", "minatar:MinAtar/Freeway-v1", ""),
    ("minatar_seaquest", "minatar:MinAtar/Seaquest-v1", ""),
    ("minatar_space_invaders", "minatar:MinAtar/SpaceInvaders-v1", ""),
    (
        "doom_basic",
        "vizdoom.gymnasium_wrapper:VizdoomBasic-v1",
        "frame_skip=4",
    ),
    (
        "doom_defend_the_center",
        "vizdoom.gymnasium_wrapper:VizdoomDefendCenter-v1",
        "frame_skip=4",
    ),
    (
        "doom_defend_the_line",
        "vizdoom.gymnasium_wrapper:VizdoomDefendLine-v1",
        "frame_skip=4",
    ),
    (
        "doom_health_gathering",
        "vizdoom.gymnasium_wrapper:VizdoomHealthGathering-v1",
        "frame_skip=4",
    ),
    (
        "doom_my_way_home",
        "vizdoom.gymnasium_wrapper:VizdoomMyWayHome-v1",
        "frame_skip=4",
    ),
    (
        "doom_deadly_corridor",
        "vizdoom.gymnasium_wrapper:VizdoomDeadlyCorridor-v1",
        "frame_skip=4",
    ),
];

#[cfg(feature = "python")]
fn make_bridged(gym_id: &str, kwargs: &str) -> Result<Box<dyn Env>, EnvError> {
    Ok(Box::new(crate::gym::GymEnv::make_with(
        gym_id,
        &parse_kwargs(kwargs)?,
    )?))
}

#[cfg(not(feature = "python"))]
fn make_bridged(gym_id: &str, _kwargs: &str) -> Result<Box<dyn Env>, EnvError> {
    Err(EnvError::PythonDisabled(gym_id.to_owned()))
}

/// `atari_<game>`: ALE's `<Game>` through the Gymnasium bridge at one frame per step, without sticky actions,
/// with its minimal action set and grayscale frames, under the standard preprocessing
/// ([`atari_preprocessing`](crate::wrappers::atari_preprocessing)).
#[cfg(feature = "python")]
fn make_atari(game: &str) -> Result<Box<dyn Env>, EnvError> {
    let kwargs = [
        ("frameskip", "1"),
        ("repeat_action_probability", "0.0"),
        ("full_action_space", "false"),
        ("obs_type", "grayscale"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let env = crate::gym::GymEnv::make_with(&format!("ale_py:ALE/{game}-v5"), &kwargs)?;
    let fire = env
        .action_meanings()?
        .is_some_and(|m| m.get(1).is_some_and(|a| a == "FIRE") && m.len() >= 3);
    crate::wrappers::atari_preprocessing(Box::new(env), fire)
}

#[cfg(not(feature = "python"))]
fn make_atari(game: &str) -> Result<Box<dyn Env>, EnvError> {
    Err(EnvError::PythonDisabled(format!("ALE/{game}-v5")))
}

#[cfg(feature = "python")]
fn make_gym(gym_id: &str) -> Result<Box<dyn Env>, EnvError> {
    Ok(Box::new(crate::gym::GymEnv::make(gym_id)?))
}

#[cfg(not(feature = "python"))]
fn make_gym(gym_id: &str) -> Result<Box<dyn Env>, EnvError> {
    Err(EnvError::PythonDisabled(gym_id.to_owned()))
}

#[cfg(feature = "python")]
fn make_pettingzoo(id: &str, kwargs: &EnvKwargs) -> Result<Box<dyn MultiAgentEnv>, EnvError> {
    Ok(Box::new(crate::pz::PettingZooEnv::from_id(id, kwargs)?))
}

#[cfg(not(feature = "python"))]
fn make_pettingzoo(id: &str, _kwargs: &EnvKwargs) -> Result<Box<dyn MultiAgentEnv>, EnvError> {
    Err(EnvError::PettingZooDisabled(id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrappers::testing::Counter;
    use crate::Action;

    #[test]
    fn unknown_ids_list_the_known_ones() {
        let registry = EnvRegistry::with_builtin();
        let err = registry.make("CartPole-v0").err().expect("unknown id");
        assert_eq!(
            err.to_string(),
            "unknown env id `CartPole-v0`; known ids: Acrobot-v1, CartPole-v1, MountainCar-v0, \
             MountainCarContinuous-v0, Pendulum-v1, atari_asteroids, atari_beamrider, atari_breakout, atari_enduro, \
             atari_montezuma, atari_mspacman, atari_pong, atari_qbert, atari_seaquest, atari_spaceinvaders, \
             connect_four, doom_basic, doom_deadly_corridor, doom_defend_the_center, doom_defend_the_line, \
             doom_health_gathering, doom_my_way_home, minatar_asterix, minatar_breakout, minatar_freeway, \
             minatar_seaquest, minatar_space_invaders, treasurehunt"
        );
    }

    #[test]
    fn builtin_time_limits_apply() {
        let registry = EnvRegistry::with_builtin();
        assert_eq!(registry.max_episode_steps("MountainCarContinuous-v0"), Some(999));
        let mut env = registry.make("Pendulum-v1").unwrap();
        let mut obs = [0.0; 3];
        env.reset(Some(1), &mut obs).unwrap();
        let truncated_at =
            (1..=300).find(|_| env.step(Action::Continuous(&[0.0]), &mut obs).unwrap().truncated);
        assert_eq!(truncated_at, Some(200));
    }

    #[test]
    fn users_register_their_own() {
        let mut registry = EnvRegistry::new();
        registry
            .register("Counter-v0", Some(3), || Ok(Box::new(Counter::new(100))))
            .unwrap();
        assert_eq!(
            registry.register("Counter-v0", None, || Ok(Box::new(Counter::new(1)))),
            Err(EnvError::DuplicateEnv("Counter-v0".into()))
        );
        assert!(registry
            .register("gym:Mine-v0", None, || Ok(Box::new(Counter::new(1))))
            .is_err());
        let mut env = registry.make("Counter-v0").unwrap();
        let mut obs = [0.0; 2];
        env.reset(None, &mut obs).unwrap();
        let flags: Vec<bool> = (0..3)
            .map(|_| env.step(Action::Discrete(0), &mut obs).unwrap().truncated)
            .collect();
        assert_eq!(flags, [false, false, true]);
        assert_eq!(registry.ids(), ["Counter-v0"]);
    }

    #[test]
    fn multi_agent_envs_are_made_with_their_kwargs() {
        let registry = EnvRegistry::with_builtin();
        assert!(registry.is_multi_agent("treasurehunt") && !registry.is_multi_agent("CartPole-v1"));
        let kwargs = parse_kwargs(" num_agents = 3, height=8 ,").unwrap();
        assert_eq!(
            kwargs,
            [("num_agents".into(), "3".into()), ("height".into(), "8".into())]
        );
        let env = registry.make_multi_agent("treasurehunt", &kwargs).unwrap();
        assert_eq!(env.num_agents(), 3);
        assert_eq!(
            registry
                .make_multi_agent("connect_four", &[])
                .unwrap()
                .num_agents(),
            2
        );
        let bad = registry.make_multi_agent("treasurehunt", &parse_kwargs("colour=red").unwrap());
        assert!(bad.err().expect("unknown key").to_string().contains("colour"));
        assert!(registry.make_multi_agent("connect_four", &kwargs).is_err());
        let teams = registry
            .make_multi_agent("connect_four", &parse_kwargs("players_per_side=2").unwrap())
            .unwrap();
        assert_eq!(teams.num_agents(), 4);
        assert_eq!((0..4).map(|a| teams.team(a)).collect::<Vec<_>>(), [0, 1, 0, 1]);
        for bad in [
            "players_per_side=0",
            "players_per_side=two",
            "players_per_side=22",
        ] {
            let err = registry.make_multi_agent("connect_four", &parse_kwargs(bad).unwrap());
            assert!(
                err.err()
                    .expect("bad count")
                    .to_string()
                    .contains("players_per_side"),
                "{bad}"
            );
        }
        assert!(parse_kwargs("height").is_err() && parse_kwargs("=3").is_err());
        assert!(registry.make("treasurehunt").is_err());
        assert!(registry.make_multi_agent("CartPole-v1", &[]).is_err());
        let mut mine = EnvRegistry::new();
        let again = mine.register_multi_agent("connect_four", |_| Ok(Box::new(ConnectFour::new())));
        assert!(again.is_ok());
        assert!(mine
            .register("connect_four", None, || Ok(Box::new(Counter::new(1))))
            .is_err());
    }

    #[cfg(not(feature = "python"))]
    #[test]
    fn gym_ids_need_the_python_feature() {
        let err = EnvRegistry::with_builtin()
            .make("gym:CartPole-v1")
            .err()
            .expect("no bridge");
        assert_eq!(err, EnvError::PythonDisabled("CartPole-v1".into()));
        assert!(err.to_string().contains("--features python"));
    }

    #[cfg(not(feature = "python"))]
    #[test]
    fn pettingzoo_ids_are_multi_agent_and_need_the_python_feature() {
        let registry = EnvRegistry::with_builtin();
        let id = "pz:pettingzoo.mpe.simple_spread_v3";
        assert!(
            registry.is_multi_agent(id) && registry.is_multi_agent("pza:pettingzoo.classic.connect_four_v3")
        );
        let err = registry.make_multi_agent(id, &[]).err().expect("no bridge");
        assert_eq!(err, EnvError::PettingZooDisabled(id.into()));
        assert_eq!(
            err.to_string(),
            "env id `pz:pettingzoo.mpe.simple_spread_v3` needs the PettingZoo bridge: build rlf-env with \
             `--features python`"
        );
        assert!(registry.make(id).is_err());
        let mut mine = EnvRegistry::new();
        assert!(mine
            .register_multi_agent("pza:mine", |_| Ok(Box::new(ConnectFour::new())))
            .is_err());
    }
}
