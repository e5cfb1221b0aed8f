//! The run plan: a [`Config`] held against the env it names. [`RunPlan::resolve`] runs the config's own checks
//! ([`Config::validate`], which need no env) and those of the algorithm it names ([`crate::algo::checked`]), builds the env's description once ([`EnvSpec::of`]) and checks what
//! only the env can say: each policy's spaces under `--agent_policy_map`, the teams self-play draws opponents by,
//! the action spaces the algorithm takes ([`crate::algo::Algorithm::check_actions`]), the built-in players, and sync mode's rounds. A config that
//! resolves trains; every error names the flag.

mod agent_maps;

use serde::{Deserialize, Serialize};

use crate::algo::Algorithm;
use crate::config::Config;
use crate::env::{EnvRegistry, EnvSpec, Space};
use crate::error::{Result, RlfError};

pub use agent_maps::{agent_teams, parse_agent_policy_map, parse_agent_team_map, policy_mapping, Mapping};

/// A config checked against its env, with what the env says about it: what a run is planned from (the runner, its
/// data plane and MPI layout, `enjoy` and `eval`), so that the env is built once to learn its spaces.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunPlan {
    /// The configuration, checked.
    pub config: Config,
    /// The env's spaces, agents and teams.
    pub env: EnvSpec,
    /// Whether the algorithm learns from replay buffers rather than from the trajectory slots
    /// ([`Algorithm::learns_from_replay`]).
    pub learns_from_replay: bool,
    /// How the env's agents map to policies.
    pub mapping: Mapping,
    /// The team of each agent (`--agent_team_map`'s, else the env's).
    pub teams: Vec<usize>,
}

impl RunPlan {
    /// The algorithm the plan learns with (its name checked by [`RunPlan::resolve`]).
    pub fn algorithm(&self) -> Result<&'static dyn Algorithm> {
        crate::algo::algorithm(&self.config.learning.algo)
    }

    /// The usage errors of a training run (exit code 2), found before any work: the config's
    /// ([`Config::check_train_usage`]) and the algorithm's ([`Algorithm::check_training`]). A saved experiment's
    /// `config.json` need not pass them to be played.
    pub fn check_train_usage(&self) -> Result<()> {
        self.config.check_train_usage()?;
        self.algorithm()?.check_training(&self.config)
    }

    /// The observation and action spaces of policy `policy`'s agents.
    pub fn policy_spaces(&self, policy: usize) -> Result<(&Space, &Space)> {
        self.env.policy_spaces(policy, self.mapping.by_agent.as_deref())
    }

    /// Checks `cfg` (see the module's documentation) with the envs of `registry`.
    pub fn resolve(cfg: &Config, registry: &EnvRegistry) -> Result<RunPlan> {
        cfg.validate()?;
        let algorithm = crate::algo::checked(cfg)?;
        let err = |m: String| Err(RlfError::Config(m));
        let env = match EnvSpec::of(registry, &cfg.env) {
            Ok(spec) => spec,
            Err(RlfError::Config(m)) => return err(m),
            Err(e) => return err(format!("--env: {e}")),
        };
        let s = &cfg.sampling;
        let mapping = policy_mapping(cfg, &env.agent_names)?;
        for policy in 0..s.num_policies {
            env.policy_spaces(policy, mapping.by_agent.as_deref())?;
        }
        let teams = agent_teams(cfg, &env.agent_names, env.teams.clone())?;
        if !s.agent_team_map.trim().is_empty() && !s.self_play {
            return err(
                "--agent_team_map sets the teams self-play draws opponents by: it needs --self_play".into(),
            );
        }
        let name = &cfg.env.env;
        if s.self_play {
            if env.num_agents < 2 {
                return err(format!(
                    "--self_play needs a multi-agent env; {name} has one agent"
                ));
            }
            if teams.iter().all(|&t| t == teams[0]) {
                return err(format!(
                    "--self_play needs agents on at least two teams; every agent of {name} is on team {} (see \
                     --agent_team_map)",
                    teams[0]
                ));
            }
        }
        algorithm.check_actions(&cfg.env.env, &env.action_spaces)?;
        if cfg.appo.lookahead_coeff > 0.0 {
            if !env.has_ply_model {
                return err(format!(
                    "--lookahead_coeff looks ahead in the env's rules: {name} has none as a model (connect_four has)"
                ));
            }
            if algorithm.name() != "appo" || cfg.model.use_rnn {
                return err(format!(
                    "--lookahead_coeff trains APPO's feed-forward policy; this run has --algo {}{}",
                    algorithm.name(),
                    if cfg.model.use_rnn { " and --use_rnn" } else { "" }
                ));
            }
        }
        if !cfg.model.encoder_custom.is_empty() {
            crate::model::registered_encoder(&cfg.model.encoder_custom)?;
        }
        if let Some(unknown) = cfg
            .builtin_opponents()
            .into_iter()
            .find(|b| !env.builtin_players.iter().any(|p| p == b))
        {
            return err(format!(
                "--self_play_builtin_opponents: {name} has no built-in player `{unknown}` (it has: {})",
                if env.builtin_players.is_empty() {
                    "none".to_owned()
                } else {
                    env.builtin_players.join(", ")
                }
            ));
        }
        // Under MPI the whole run's envs are known once the ranks are (see `runner::train_rank`).
        let sampled = cfg.total_envs() * env.num_agents * s.rollout;
        if !cfg.run.async_rl && !cfg.distributed.mpi && cfg.dataset_size() % sampled != 0 {
            return err(format!(
                "with --async_rl=false, --batch_size * --num_batches_per_epoch ({}) must be a multiple of \
                 --num_workers * --num_envs_per_worker * agents per env * --rollout ({sampled})",
                cfg.dataset_size()
            ));
        }
        Ok(RunPlan {
            config: cfg.clone(),
            env,
            learns_from_replay: algorithm.learns_from_replay(),
            mapping,
            teams,
        })
    }
}
