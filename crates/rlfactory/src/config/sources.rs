//! Where a configuration's values come from (see [`crate::config`]): the shipped settings, files of settings and the
//! command line, layered in one place.

use std::path::Path;

use clap::Args;

use super::{Config, EnvConfig, Workflow, BENCHMARK_SECONDS, DEFAULT_ALGO, UNLIMITED_SECONDS};
use crate::error::{Result, RlfError};

/// The settings files shipped with rlfactory, by name: `<env>.toml` for the default algorithm ([`DEFAULT_ALGO`]),
/// `<env>-<algo>.toml` for another (an env's APPO settings are not DQN's: without settings of its own, an algorithm
/// starts from the reference values); `atari.toml` and `doom.toml` for every env of those families.
const SHIPPED: &[(&str, &str)] = &[
    ("CartPole-v1.toml", include_str!("../../configs/CartPole-v1.toml")),
    ("Acrobot-v1.toml", include_str!("../../configs/Acrobot-v1.toml")),
    (
        "MountainCar-v0.toml",
        include_str!("../../configs/MountainCar-v0.toml"),
    ),
    (
        "MountainCarContinuous-v0.toml",
        include_str!("../../configs/MountainCarContinuous-v0.toml"),
    ),
    ("Pendulum-v1.toml", include_str!("../../configs/Pendulum-v1.toml")),
    (
        "connect_four.toml",
        include_str!("../../configs/connect_four.toml"),
    ),
    (
        "treasurehunt.toml",
        include_str!("../../configs/treasurehunt.toml"),
    ),
    (
        "minatar_breakout.toml",
        include_str!("../../configs/minatar_breakout.toml"),
    ),
    ("atari.toml", include_str!("../../configs/atari.toml")),
    ("doom.toml", include_str!("../../configs/doom.toml")),
    (
        "CartPole-v1-dqn.toml",
        include_str!("../../configs/CartPole-v1-dqn.toml"),
    ),
    (
        "Acrobot-v1-dqn.toml",
        include_str!("../../configs/Acrobot-v1-dqn.toml"),
    ),
    (
        "MountainCar-v0-dqn.toml",
        include_str!("../../configs/MountainCar-v0-dqn.toml"),
    ),
    (
        "treasurehunt-dqn.toml",
        include_str!("../../configs/treasurehunt-dqn.toml"),
    ),
    (
        "Pendulum-v1-sac.toml",
        include_str!("../../configs/Pendulum-v1-sac.toml"),
    ),
];

/// The shipped default settings for `env` learned by `algo`, as TOML with the file's name (`configs/<name>`), if
/// there are any (see `SHIPPED`).
pub fn shipped_config(env: &str, algo: &str) -> Option<(&'static str, &'static str)> {
    let family = if env.starts_with("atari_") {
        "atari"
    } else if env.starts_with("doom_") {
        "doom"
    } else {
        env
    };
    let name = if algo == DEFAULT_ALGO {
        format!("{family}.toml")
    } else {
        format!("{family}-{algo}.toml")
    };
    SHIPPED.iter().copied().find(|(file, _)| *file == name)
}

/// A flat table of settings, keys named as the flags (see the module doc).
pub type Settings = toml::Table;

/// Parses settings written in TOML; `origin` names the file in errors.
pub fn parse_settings(text: &str, origin: &Path) -> Result<Settings> {
    text.parse().map_err(|e: toml::de::Error| RlfError::ConfigFile {
        path: origin.to_owned(),
        message: e.message().to_owned(),
    })
}

/// Reads a settings file: JSON when its name ends in `.json` (`null` values are left out),
/// TOML otherwise.
pub fn read_settings(path: &Path) -> Result<Settings> {
    let file_error = |message: String| RlfError::ConfigFile {
        path: path.to_owned(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
    if path.extension().is_some_and(|e| e == "json") {
        let mut json: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| file_error(e.to_string()))?;
        json.retain(|_, v| !v.is_null());
        Settings::try_from(json).map_err(|e| file_error(e.to_string()))
    } else {
        parse_settings(&text, path)
    }
}

impl Config {
    /// The defaults for `env` learned by `algo`: the reference values, then the shipped config.
    pub fn for_env_defaults(env: &str, algo: &str) -> Result<Config> {
        let mut config = Config {
            env: EnvConfig {
                env: env.to_owned(),
                ..EnvConfig::default()
            },
            ..Config::default()
        };
        if let Some((file, text)) = shipped_config(env, algo) {
            let origin = Path::new("configs").join(file);
            config.apply(&parse_settings(text, &origin)?, &origin)?;
        }
        Ok(config)
    }

    /// A run's configuration from its four sources, later ones winning (see the module doc): the reference values,
    /// the shipped settings for its env and algorithm, `file` (`--config`: its path and settings) and
    /// `command_line` (the values the user gave, keys named as the flags); then `--benchmark`'s implications and the
    /// synchronous MPI workflow's. The env is the command line's `env`, else the file's; the shipped settings are
    /// those of the command line's `algo`, else the file's, else APPO's. Not validated (see [`Config::validate`]).
    pub fn layered(file: Option<(&Path, &Settings)>, command_line: &Settings) -> Result<Config> {
        let given = |key: &str| {
            command_line
                .get(key)
                .or_else(|| file.and_then(|(_, settings)| settings.get(key)))
        };
        let env = given("env").and_then(|v| v.as_str()).unwrap_or_default();
        if env.is_empty() {
            return Err(RlfError::Config(
                "--env is required (or `env = \"...\"` in the --config file): an env id such as CartPole-v1"
                    .into(),
            ));
        }
        // A name that is no algorithm's has no shipped settings; the run plan's checks report it.
        let algo = given("algo").and_then(|v| v.as_str()).unwrap_or(DEFAULT_ALGO);
        let mut config = Config::for_env_defaults(env, algo)?;
        if let Some((path, settings)) = file {
            config.apply(settings, path)?;
        }
        config.apply(command_line, Path::new("the command line"))?;
        if config.run.benchmark {
            let r = &mut config.run;
            r.stop_at_reward = None;
            r.save_experiment = false;
            if r.train_for_seconds == UNLIMITED_SECONDS {
                r.train_for_seconds = BENCHMARK_SECONDS;
            }
        }
        if config.distributed.mpi && config.distributed.workflow == Workflow::Sync {
            config.run.async_rl = false;
        }
        Ok(config)
    }

    /// Each flag's default as the command line writes it (lists comma-separated: `64,64`), from
    /// [`Config::default`]: the reference values are written once, in the sections' `Default`. Flags without one
    /// (`--stop_at_reward`) are left out.
    pub fn flag_defaults() -> Result<Vec<(String, String)>> {
        fn text(value: &toml::Value) -> String {
            match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
                other => other.to_string(),
            }
        }
        Ok(Config::default()
            .to_settings()?
            .iter()
            .map(|(key, value)| (key.clone(), text(value)))
            .collect())
    }

    /// The configuration in a file (an experiment's `config.json`, or a TOML file of settings):
    /// its values over [`Config::default`]. Not validated (see [`Config::validate`]).
    pub fn from_file(path: &Path) -> Result<Config> {
        let mut config = Config::default();
        config.apply(&read_settings(path)?, path)?;
        Ok(config)
    }

    /// The keys a settings file may hold: the flags of `rlfactory train` but `--config`.
    pub fn keys() -> Vec<String> {
        Config::augment_args(clap::Command::new("keys"))
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect()
    }

    /// Applies `settings` over this configuration; an unknown key or a value of the wrong type
    /// is an error naming `origin` and the key.
    pub fn apply(&mut self, settings: &Settings, origin: &Path) -> Result<()> {
        let file_error = |message: String| RlfError::ConfigFile {
            path: origin.to_owned(),
            message,
        };
        let keys = Config::keys();
        let mut table = self.to_settings()?;
        for (key, value) in settings {
            if !keys.contains(key) {
                return Err(file_error(format!("unknown key `{key}`")));
            }
            let mut alone = table.clone();
            alone.insert(key.clone(), value.clone());
            alone
                .try_into::<Config>()
                .map_err(|e| file_error(format!("key `{key}`: {}", e.message())))?;
            table.insert(key.clone(), value.clone());
        }
        *self = table
            .try_into()
            .map_err(|e: toml::de::Error| file_error(e.message().to_owned()))?;
        Ok(())
    }

    /// This configuration as a flat table of settings.
    pub fn to_settings(&self) -> Result<Settings> {
        Settings::try_from(self).map_err(|e| RlfError::Config(format!("cannot serialise the config: {e}")))
    }

    /// The resolved configuration as a flat TOML table, the format `--config` reads.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| RlfError::Config(format!("cannot serialise the config: {e}")))
    }
}
