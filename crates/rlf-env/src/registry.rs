//! [`EnvRegistry`]: a value mapping env ids to constructors (no global state).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::classic::{Acrobot, CartPole, MountainCar, MountainCarContinuous, Pendulum};
use crate::wrappers::TimeLimit;
use crate::{Env, EnvError};

/// A constructor of boxed envs.
pub type EnvConstructor = Arc<dyn Fn() -> Result<Box<dyn Env>, EnvError> + Send + Sync>;

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
/// `python` feature.
#[derive(Clone, Default)]
pub struct EnvRegistry {
    entries: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for EnvRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvRegistry")
            .field("ids", &self.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The prefix of ids served by the Gymnasium bridge.
pub const GYM_PREFIX: &str = "gym:";

impl EnvRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry with the native classic-control envs and Gymnasium's time limits:
    /// `CartPole-v1` (500 steps), `Acrobot-v1` (500), `MountainCar-v0` (200),
    /// `MountainCarContinuous-v0` (999), `Pendulum-v1` (200).
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
        for (id, steps, make) in builtin {
            registry.entries.insert(
                id.to_owned(),
                Entry {
                    constructor: Arc::new(move || Ok(make())),
                    max_episode_steps: Some(steps),
                },
            );
        }
        registry
    }

    /// Adds `id`; `make` builds the bare env and, with `Some(n)`, [`make`](Self::make) wraps it in
    /// a [`TimeLimit`] of `n` steps. Ids are unique and must not start with `gym:`.
    pub fn register<F>(&mut self, id: &str, max_episode_steps: Option<u64>, make: F) -> Result<(), EnvError>
    where
        F: Fn() -> Result<Box<dyn Env>, EnvError> + Send + Sync + 'static,
    {
        if id.starts_with(GYM_PREFIX) {
            return Err(EnvError::Unsupported {
                env: id.to_owned(),
                what: format!(
                    "registering an id starting with `{GYM_PREFIX}` (reserved for the Gymnasium bridge)"
                ),
            });
        }
        if self.entries.contains_key(id) {
            return Err(EnvError::DuplicateEnv(id.to_owned()));
        }
        self.entries.insert(
            id.to_owned(),
            Entry {
                constructor: Arc::new(make),
                max_episode_steps,
            },
        );
        Ok(())
    }

    /// The registered ids, sorted.
    pub fn ids(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
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

#[cfg(feature = "python")]
fn make_gym(gym_id: &str) -> Result<Box<dyn Env>, EnvError> {
    Ok(Box::new(crate::gym::GymEnv::make(gym_id)?))
}

#[cfg(not(feature = "python"))]
fn make_gym(gym_id: &str) -> Result<Box<dyn Env>, EnvError> {
    Err(EnvError::PythonDisabled(gym_id.to_owned()))
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
             MountainCarContinuous-v0, Pendulum-v1"
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
}
