//! The checks a configuration passes before a run, each a one-line error naming the flags (none needs the env: the
//! checks that do are `RunPlan::resolve`'s, a floor up).

use std::path::Path;

use super::*;
use crate::error::{Result, RlfError};

impl Config {
    /// The checks of `--use_rnn` and `--recurrence`.
    fn validate_rnn(&self) -> Result<()> {
        let err = |m: String| Err(RlfError::Config(m));
        let (m, s) = (&self.model, &self.sampling);
        if self.appo.recurrence == 0 || self.appo.recurrence < -1 {
            return err(format!(
                "--recurrence must be -1 (the whole trajectory) or at least 1, got {}",
                self.appo.recurrence
            ));
        }
        if !m.use_rnn {
            return Ok(());
        }
        if m.rnn_size == 0 || m.rnn_num_layers == 0 {
            return err("--rnn_size and --rnn_num_layers must be at least 1 with --use_rnn".into());
        }
        let r = self.recurrence();
        if s.rollout % r != 0 {
            return err(format!(
                "--recurrence ({r}) must divide --rollout ({}): the learner cuts each trajectory into whole chunks",
                s.rollout
            ));
        }
        if self.appo.with_vtrace && r != s.rollout {
            return err(format!(
                "--with_vtrace runs over whole trajectories: --recurrence ({r}) must equal --rollout ({}) or be -1",
                s.rollout
            ));
        }
        for (flag, on) in [
            ("--num_policies above 1", s.num_policies > 1),
            ("--self_play", s.self_play),
        ] {
            if on {
                return err(format!("--use_rnn is not supported with {flag} yet"));
            }
        }
        Ok(())
    }

    /// Usage errors of a training run, found before any work (exit code 2): checks a saved experiment's
    /// `config.json` need not pass to be played (`enjoy`, `eval`).
    pub fn check_train_usage(&self) -> Result<()> {
        let err = |m: String| Err(RlfError::Config(m));
        if self.run.train_for_env_steps == 0 {
            return err("--train_for_env_steps must be at least 1 (0 trains nothing)".into());
        }
        if self.run.save_experiment {
            rlf_experiment::folder::check_name(&self.run.experiment)
                .map_err(|e| RlfError::Config(format!("--experiment: {e}")))?;
        }
        if let Some(path) = &self.run.summary_json {
            check_output_file("--summary_json", path)?;
        }
        let d = &self.distributed;
        if !d.mpi && (d.learner_procs > 1 || d.process_per_env > 1) {
            return err(format!(
                "--learner_procs {} and --process_per_env {} lay out the ranks of an MPI job: add --mpi and start it \
                 under mpirun",
                d.learner_procs, d.process_per_env
            ));
        }
        if d.mpi && !cfg!(feature = "mpi") {
            return err("--mpi: this build has no MPI (build rlfactory with the `mpi` feature)".into());
        }
        Ok(())
    }

    /// The off-policy settings in range (read by `--algo dqn` and `--algo sac`, whose own checks are theirs: see
    /// `crate::algo::Algorithm::check_config`).
    fn validate_off_policy(&self) -> Result<()> {
        let err = |m: String| Err(RlfError::Config(m));
        let o = &self.off_policy;
        if o.n_step == 0 || o.publish_interval == 0 || o.target_update_interval == 0 {
            return err(
                "--n_step, --publish_interval and --target_update_interval must be at least 1".into(),
            );
        }
        if !(o.tau > 0.0 && o.tau <= 1.0) {
            return err(format!("--tau must be in (0, 1], got {}", o.tau));
        }
        if !(o.replay_ratio >= 0.0 && o.replay_ratio.is_finite()) {
            return err(format!(
                "--replay_ratio must be 0 (no limit) or more, got {}",
                o.replay_ratio
            ));
        }
        at_least_zero("--prioritized_replay_alpha", o.prioritized_replay_alpha)?;
        more_than_zero("--prioritized_replay_eps", o.prioritized_replay_eps)?;
        if !(o.exploration_duration_mu >= 0.0 && o.exploration_duration_mu.is_finite()) {
            return err(format!(
                "--exploration_duration_mu must be 0 (plain ε-greedy) or more, got {}",
                o.exploration_duration_mu
            ));
        }
        for (flag, v) in [
            ("--exploration_fraction", o.exploration_fraction),
            ("--exploration_initial_eps", o.exploration_initial_eps),
            ("--exploration_final_eps", o.exploration_final_eps),
            ("--prioritized_replay_beta", o.prioritized_replay_beta),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return err(format!("{flag} must be in [0, 1], got {v}"));
            }
        }
        Ok(())
    }

    /// Rejects impossible values and combinations, with a message naming the flags: every check that needs no env
    /// (those that do are [`crate::plan::RunPlan::resolve`]'s, which runs this one first).
    pub fn validate(&self) -> Result<()> {
        let err = |m: String| Err(RlfError::Config(m));
        let s = &self.sampling;
        let a = &self.appo;
        let r = &self.run;
        for (name, value) in [
            ("--num_workers", s.num_workers),
            ("--num_envs_per_worker", s.num_envs_per_worker),
            ("--worker_num_splits", s.worker_num_splits),
            ("--rollout", s.rollout),
            ("--batch_size", self.learning.batch_size),
            ("--num_batches_per_epoch", a.num_batches_per_epoch),
            ("--num_epochs", a.num_epochs),
            ("--policy_workers_per_policy", s.policy_workers_per_policy),
            ("--num_batches_to_accumulate", a.num_batches_to_accumulate),
            ("--num_policies", s.num_policies),
        ] {
            if value == 0 {
                return err(format!("{name} must be at least 1"));
            }
        }
        if s.shared_policy_workers > 0 && s.policy_workers_per_policy != 1 {
            return err(format!(
                "--shared_policy_workers {} and --policy_workers_per_policy {}: the shared workers replace the \
                 per-policy ones, set one of them",
                s.shared_policy_workers, s.policy_workers_per_policy
            ));
        }
        if s.num_envs_per_worker % s.worker_num_splits != 0 {
            return err(format!(
                "--num_envs_per_worker ({}) must be a multiple of --worker_num_splits ({})",
                s.num_envs_per_worker, s.worker_num_splits
            ));
        }
        if self.learning.batch_size % s.rollout != 0 {
            return err(format!(
                "--batch_size ({}) must be a multiple of --rollout ({}): minibatches hold whole trajectories",
                self.learning.batch_size, s.rollout
            ));
        }
        if s.num_policies > MAX_POLICIES {
            return err(format!(
                "--num_policies must be at most {MAX_POLICIES}, got {}",
                s.num_policies
            ));
        }
        if s.self_play {
            if !r.async_rl {
                // A snapshot's columns fill no dataset: sync mode's rounds could wait for ever.
                return err("--self_play needs --async_rl=true: sync mode cannot count the rounds a snapshot's columns leave unfilled".into());
            }
            if s.opponent_pool_size == 0 || s.snapshot_every_env_steps == 0 {
                return err(
                    "--opponent_pool_size and --snapshot_every_env_steps must be at least 1 with --self_play"
                        .into(),
                );
            }
            if !(0.0..=1.0).contains(&s.self_play_latest_prob) {
                return err(format!(
                    "--self_play_latest_prob must be in [0, 1], got {}",
                    s.self_play_latest_prob
                ));
            }
            at_least_zero("--self_play_pfsp_power", s.self_play_pfsp_power)?;
            more_than_zero(
                "--self_play_opponent_temperature",
                s.self_play_opponent_temperature,
            )?;
            if s.self_play_exploiters >= s.num_policies {
                return err(format!(
                    "--self_play_exploiters ({}) must leave at least one of --num_policies ({}) a main policy",
                    s.self_play_exploiters, s.num_policies
                ));
            }
            for (flag, value) in [
                ("--self_play_exploiter_prob", s.self_play_exploiter_prob),
                ("--self_play_exploiter_reset", s.self_play_exploiter_reset),
            ] {
                if !(0.0..=1.0).contains(&value) {
                    return err(format!("{flag} must be in [0, 1], got {value}"));
                }
            }
            if s.self_play_exploiter_reset > 0.0 && s.self_play_exploiters == 0 {
                return err("--self_play_exploiter_reset needs --self_play_exploiters".into());
            }
            if s.self_play_exploiters > 0 && (!s.agent_policy_map.is_empty() || self.pbt.with_pbt) {
                return err(
                    "--self_play_exploiters draws each env's policies itself: drop --agent_policy_map and --with_pbt"
                        .into(),
                );
            }
        }
        self.validate_rnn()?;
        if !(self.model.obs_scale > 0.0 && self.model.obs_scale.is_finite()) {
            return err(format!(
                "--obs_scale must be a positive number, got {}",
                self.model.obs_scale
            ));
        }
        if self.model.obs_scale != 1.0 && self.model.normalize_input {
            return err(
                "--obs_scale and --normalize_input both rescale observations (the scale would apply after the \
                 running statistics): give one"
                    .into(),
            );
        }
        if !self.model.encoder_custom.is_empty()
            && (!self.model.encoder_conv_layers.0.is_empty()
                || self.model.encoder_conv_architecture != ConvArchitecture::None)
        {
            return err(format!(
                "--encoder_custom {} replaces the built-in encoders: drop --encoder_conv_layers and \
                 --encoder_conv_architecture",
                self.model.encoder_custom
            ));
        }
        if !self.model.encoder_conv_layers.0.is_empty()
            && self.model.encoder_conv_architecture != ConvArchitecture::None
        {
            return err(
                "--encoder_conv_layers and --encoder_conv_architecture both choose the convolutions: give one".into(),
            );
        }
        self.validate_off_policy()?;
        let builtin = self.builtin_opponents();
        if !(0.0..=1.0).contains(&s.self_play_builtin_prob) {
            return err(format!(
                "--self_play_builtin_prob must be in [0, 1], got {}",
                s.self_play_builtin_prob
            ));
        }
        if (s.self_play_builtin_prob > 0.0) == builtin.is_empty() {
            return err(
                "--self_play_builtin_opponents and --self_play_builtin_prob > 0 go together: name the players and how often they play"
                    .into(),
            );
        }
        if !builtin.is_empty() && !s.self_play {
            return err("--self_play_builtin_opponents needs --self_play".into());
        }
        if !(1..=2).contains(&a.lookahead_plies) {
            return err(format!(
                "--lookahead_plies must be 1 or 2, got {}",
                a.lookahead_plies
            ));
        }
        if s.self_play_exploiters > 0 && !s.self_play {
            return err("--self_play_exploiters needs --self_play".into());
        }
        let unit = [
            ("--gamma", self.learning.gamma),
            ("--gae_lambda", a.gae_lambda),
            ("--adam_beta1", self.optimizer.adam_beta1),
            ("--adam_beta2", self.optimizer.adam_beta2),
        ];
        if let Some((name, v)) = unit.iter().find(|(_, v)| !(0.0..=1.0).contains(v)) {
            return err(format!("{name} must be in [0, 1], got {v}"));
        }
        let positive = [
            ("--learning_rate", self.optimizer.learning_rate),
            ("--ppo_clip_ratio", a.ppo_clip_ratio),
            ("--max_grad_norm", self.optimizer.max_grad_norm),
            ("--adam_eps", self.optimizer.adam_eps),
            ("--vtrace_rho", a.vtrace_rho),
            ("--vtrace_c", a.vtrace_c),
            ("--initial_stddev", self.model.initial_stddev),
            ("--train_for_seconds", r.train_for_seconds),
            (
                "--lr_schedule_kl_threshold",
                self.optimizer.lr_schedule_kl_threshold,
            ),
            ("--heartbeat_interval", r.heartbeat_interval),
            ("--lookahead_temperature", a.lookahead_temperature),
        ];
        if let Some((name, v)) = positive.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
            return err(format!("{name} must be a positive number, got {v}"));
        }
        let finite = [
            ("--ppo_clip_value", a.ppo_clip_value),
            ("--value_loss_coeff", a.value_loss_coeff),
            ("--exploration_loss_coeff", a.exploration_loss_coeff),
            ("--lookahead_coeff", a.lookahead_coeff),
            ("--report_interval_sec", r.report_interval_sec),
        ];
        if let Some((name, v)) = finite.iter().find(|(_, v)| !v.is_finite() || *v < 0.0) {
            return err(format!("{name} must be a non-negative number, got {v}"));
        }
        if let Some(reward) = r.stop_at_reward {
            if !reward.is_finite() {
                return err(format!("--stop_at_reward must be a finite number, got {reward}"));
            }
        }
        if !(self.checkpoint.save_every_sec.is_finite() && self.checkpoint.save_every_sec > 0.0) {
            return err(format!(
                "--save_every_sec must be a positive number, got {}",
                self.checkpoint.save_every_sec
            ));
        }
        if r.heartbeat_interval < 0.05 {
            return err(format!(
                "--heartbeat_interval must be at least 0.05 s, got {}",
                r.heartbeat_interval
            ));
        }
        if r.stats_avg == 0 {
            return err("--stats_avg must be at least 1".into());
        }
        let p = &self.pbt;
        if p.with_pbt {
            if s.num_policies < 2 {
                return err("--with_pbt needs a population: --num_policies of at least 2".into());
            }
            if !r.save_experiment {
                return err(
                    "--with_pbt copies weights through checkpoints: it needs --save_experiment".into(),
                );
            }
            if p.pbt_period_env_steps == 0 {
                return err("--pbt_period_env_steps must be at least 1".into());
            }
            for (name, v) in [
                ("--pbt_replace_fraction", p.pbt_replace_fraction),
                ("--pbt_mutation_rate", p.pbt_mutation_rate),
            ] {
                if !(0.0..=1.0).contains(&v) {
                    return err(format!("{name} must be in [0, 1], got {v}"));
                }
            }
            for (name, v) in [
                ("--pbt_replace_reward_gap", p.pbt_replace_reward_gap),
                (
                    "--pbt_replace_reward_gap_absolute",
                    p.pbt_replace_reward_gap_absolute,
                ),
            ] {
                if !v.is_finite() || v < 0.0 {
                    return err(format!("{name} must be a non-negative number, got {v}"));
                }
            }
        }
        if self.checkpoint.keep_checkpoints == 0 {
            return err("--keep_checkpoints must be at least 1".into());
        }
        self.validate_distributed()?;
        if self.wandb.with_wandb && (!r.save_experiment || r.benchmark) {
            return err(
                "--with_wandb needs an experiment folder (the W&B run lives in it): not with \
                 --save_experiment=false or --benchmark"
                    .into(),
            );
        }
        if self.wandb.with_wandb && !cfg!(feature = "python") {
            return err(
                "--with_wandb needs the Python bridge: build rlfactory with --features python".into(),
            );
        }
        if r.num_threads < 1 {
            return err(format!("--num_threads must be at least 1, got {}", r.num_threads));
        }
        if r.learner_threads < 0 {
            return err(format!(
                "--learner_threads must be 0 (as --num_threads) or more, got {}",
                r.learner_threads
            ));
        }
        if r.device == DeviceKind::Gpu && !tch::Cuda::is_available() {
            return err("--device=gpu: no CUDA device is available to libtorch".into());
        }
        Ok(())
    }

    /// What the MPI workflows do not cover yet is refused by name.
    fn validate_distributed(&self) -> Result<()> {
        let d = &self.distributed;
        let err = |m: &str| Err(RlfError::Config(m.to_owned()));
        if d.learner_procs == 0 || d.process_per_env == 0 {
            return err("--learner_procs and --process_per_env must be at least 1");
        }
        if !d.mpi {
            return Ok(());
        }
        let kl_adaptive = matches!(
            self.optimizer.lr_schedule,
            LrScheduleKind::KlAdaptiveMinibatch | LrScheduleKind::KlAdaptiveEpoch
        );
        if d.learner_procs > 1 && (self.model.normalize_input || self.model.normalize_returns || kl_adaptive)
        {
            return err("several learner ranks keep bit-identical weights only without statistics of their own: \
                        --normalize_input=false --normalize_returns=false and a learning rate that is constant or \
                        decays linearly (not kl_adaptive_*)");
        }
        if d.workflow == Workflow::Async && !self.run.async_rl {
            return err("--workflow async needs --async_rl=true (--workflow sync is the one in lockstep)");
        }
        if self.run.serial_mode || self.sampling.num_policies > 1 || self.sampling.self_play {
            return err("--mpi runs one policy on ranks in parallel mode so far (no --serial_mode, --num_policies above 1 or --self_play)");
        }
        Ok(())
    }
}

/// `value` (of `flag`) is a finite number, 0 or more.
fn at_least_zero(flag: &str, value: f64) -> Result<()> {
    if value >= 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(RlfError::Config(format!("{flag} must be 0 or more, got {value}")))
    }
}

/// `value` (of `flag`) is a finite number above 0.
fn more_than_zero(flag: &str, value: f64) -> Result<()> {
    if value > 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(RlfError::Config(format!(
            "{flag} must be more than 0, got {value}"
        )))
    }
}

/// `path` can be written as a file: its folder exists and it is not a folder itself (checked before a run, not after).
pub fn check_output_file(flag: &str, path: &Path) -> Result<()> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if path.is_dir() {
        return Err(RlfError::Config(format!(
            "{flag} {}: is a folder, not a file",
            path.display()
        )));
    }
    match parent {
        Some(dir) if !dir.is_dir() => Err(RlfError::Config(format!(
            "{flag} {}: there is no folder {}",
            path.display(),
            dir.display()
        ))),
        _ => Ok(()),
    }
}
