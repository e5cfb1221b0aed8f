//! The math of the algorithms, one file each; what every algorithm tells the rest of the crate ([`Algorithm`],
//! each registered by one line of [`ALGORITHMS`] and found by its `--algo` name with [`algorithm`]); the face the trajectory learner sees of an algorithm that learns from the trajectory
//! slots ([`OnPolicyAlgo`]: APPO), and what the off-policy ones share: a batch of transitions ([`Transitions`]) and
//! the face the off-policy learner sees ([`OffPolicyAlgo`]: DQN, SAC).

pub mod adam;
pub mod allreduce;
pub mod appo;
mod appo_dense;
pub mod dqn;
pub mod sac;

use std::collections::BTreeMap;
use std::sync::Arc;

use clap::ValueEnum;
use rlf_env::{PlyModel, Space};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use self::adam::GradientSync;
use self::appo::Dataset;
use crate::config::{Config, ContinuousActionMode, LrScheduleKind};
use crate::data::TransitionLayout;
use crate::error::{Result, RlfError};
use crate::model::{Draws, NamedTensor, Policy, PolicyWeights};
use crate::pbt::Hyper;

/// What an algorithm tells the rest of the crate: its name, where it learns from, the checks of a configuration
/// it makes, how its actors act, the network that acts for a policy and its learner. Each algorithm's implementation
/// is in its own file; [`ALGORITHMS`] registers them.
pub trait Algorithm: Sync {
    /// Its name on the command line (`--algo NAME`) and in config files.
    fn name(&self) -> &'static str;

    /// Whether it learns from a replay buffer (the off-policy learner's) rather than from the trajectory slots.
    fn learns_from_replay(&self) -> bool;

    /// Its checks of a configuration that need no env, each a one-line error naming the flags (run by
    /// [`crate::plan::RunPlan::resolve`] after [`Config::validate`]).
    fn check_config(&self, cfg: &Config) -> Result<()>;

    /// Settings a training run refuses that a saved experiment may still be played with (`enjoy`, `eval`): checked
    /// before a run as [`Config::check_train_usage`] is. None by default.
    fn check_training(&self, cfg: &Config) -> Result<()> {
        let _ = cfg;
        Ok(())
    }

    /// How raw continuous actions reach the env: by default as `--continuous_action_mode` says.
    fn continuous_action_mode(&self, cfg: &Config) -> ContinuousActionMode {
        cfg.model.continuous_action_mode
    }

    /// How its actors mix uniformly random actions into their network's, by the transitions in the policy's replay
    /// buffer; `None` (the default): they act as the network says.
    fn exploration(&self, cfg: &Config) -> Option<ExplorationSchedule> {
        let _ = cfg;
        None
    }

    /// Whether its actors explore ε-greedily, so that `--exploration_duration_mu` may repeat their exploratory
    /// actions. No by default.
    fn explores_epsilon_greedy(&self) -> bool {
        false
    }

    /// A policy's acting network, with fresh weights, for the spaces of its agents: what the inference workers run
    /// and what `enjoy`, `eval`, `export` and a resume's check load a checkpoint into.
    fn acting_network(
        &self,
        observation_space: &Space,
        action_space: &Space,
        cfg: &Config,
    ) -> Result<Box<dyn Policy>>;

    /// Refuses an env (named `env`) whose action spaces it cannot learn, in one line naming `--algo`.
    fn check_actions(&self, env: &str, action_spaces: &[Space]) -> Result<()>;

    /// An algorithm that learns from the trajectory slots: its learner (network and optimiser, fresh) for a policy
    /// with these spaces, for a run of `cfg`; `None` for one that learns from a replay buffer. `seed` is called before
    /// each network that starts from the policy's seed; `rules` is the env's model of its moves when it has one (what
    /// `--lookahead_coeff` looks ahead in).
    fn on_policy_learner(
        &self,
        observation_space: &Space,
        action_space: &Space,
        cfg: &Config,
        seed: &dyn Fn(),
        rules: Option<Arc<dyn PlyModel>>,
    ) -> Result<Option<Box<dyn OnPolicyAlgo>>>;

    /// An off-policy algorithm's learner (its networks, targets and optimisers, fresh) for a policy with these
    /// spaces; `None` for one that learns from trajectories. `seed` is called before each network that starts from
    /// the policy's seed.
    fn off_policy_learner(
        &self,
        observation_space: &Space,
        action_space: &Space,
        cfg: &Config,
        seed: &dyn Fn(),
    ) -> Result<Option<Box<dyn OffPolicyAlgo>>>;
}

/// Every algorithm: the one registration line of each.
pub const ALGORITHMS: &[&dyn Algorithm] = &[&appo::AppoAlgorithm, &dqn::DqnAlgorithm, &sac::SacAlgorithm];

/// The registered algorithms' names, in order.
pub fn names() -> Vec<&'static str> {
    ALGORITHMS.iter().map(|a| a.name()).collect()
}

/// The algorithm named `name` (`--algo`), or a one-line error listing the names.
pub fn algorithm(name: &str) -> Result<&'static dyn Algorithm> {
    ALGORITHMS
        .iter()
        .copied()
        .find(|a| a.name() == name)
        .ok_or_else(|| {
            RlfError::Config(format!(
                "--algo {name}: there is no such algorithm (there are: {})",
                names().join(", ")
            ))
        })
}

/// The algorithm `cfg` names, after the checks of `cfg` that depend on it and need no env: the flags that only some
/// algorithms read, then the algorithm's own ([`Algorithm::check_config`]).
pub fn checked(cfg: &Config) -> Result<&'static dyn Algorithm> {
    let algo = algorithm(&cfg.learning.algo)?;
    let o = &cfg.off_policy;
    if o.prioritized_replay && !algo.learns_from_replay() {
        let replayed: Vec<String> = ALGORITHMS
            .iter()
            .filter(|a| a.learns_from_replay())
            .map(|a| format!("--algo {}", a.name()))
            .collect();
        return Err(RlfError::Config(format!(
            "--prioritized_replay needs a replay buffer: {}",
            replayed.join(" or ")
        )));
    }
    if o.exploration_duration_mu != 0.0 && !algo.explores_epsilon_greedy() {
        return Err(RlfError::Config(format!(
            "--exploration_duration_mu holds DQN's ε-greedy exploratory actions; --algo {} explores otherwise",
            algo.name()
        )));
    }
    algo.check_config(cfg)?;
    Ok(algo)
}

/// The checks every off-policy algorithm makes of a configuration (see [`Algorithm::check_config`]): what the
/// off-policy learner supports so far, and a replay buffer that fits the run.
pub fn check_off_policy(cfg: &Config, name: &str) -> Result<()> {
    let err = |m: String| Err(RlfError::Config(m));
    for (flag, on) in [
        ("--self_play", cfg.sampling.self_play),
        ("--with_pbt", cfg.pbt.with_pbt),
        ("--async_rl=false", !cfg.run.async_rl),
        ("--use_rnn", cfg.model.use_rnn),
        ("--mpi", cfg.distributed.mpi),
    ] {
        if on {
            return err(format!("{flag} is not supported with --algo {name} yet"));
        }
    }
    let o = &cfg.off_policy;
    if o.replay_buffer_size < cfg.learning.batch_size {
        return err(format!(
            "--replay_buffer_size ({}) must hold at least one --batch_size ({})",
            o.replay_buffer_size, cfg.learning.batch_size
        ));
    }
    if cfg.run.serial_mode && o.replay_ratio <= 0.0 {
        return err(format!(
            "--serial_mode with --algo {name} needs --replay_ratio > 0 (one loop trains what the ratio says)"
        ));
    }
    Ok(())
}

/// The settings every off-policy algorithm refuses to train with, which its networks and learner do not read (see
/// [`Algorithm::check_training`]).
pub fn check_off_policy_training(cfg: &Config, name: &str) -> Result<()> {
    for (flag, on) in [
        ("--normalize_input", cfg.model.normalize_input),
        ("--normalize_returns", cfg.model.normalize_returns),
    ] {
        if on {
            return Err(RlfError::Config(format!(
                "{flag} is not supported with --algo {name} yet"
            )));
        }
    }
    match cfg.optimizer.lr_schedule {
        LrScheduleKind::Constant | LrScheduleKind::LinearDecay => Ok(()),
        kind => Err(RlfError::Config(format!(
            "--lr_schedule {} adapts to APPO's KL divergence; --algo {name} takes constant or linear_decay",
            kind.to_possible_value().as_ref().map_or("", |v| v.get_name())
        ))),
    }
}

/// How an off-policy algorithm's actors explore ([`Algorithm::exploration`]): the share ε of uniformly random
/// actions stays at `initial` for the first `hold` transitions inserted, then moves linearly to `last` over `span`
/// more, and stays there; each exploratory action lasts a duration drawn from a zeta distribution of exponent
/// `duration_mu` (0: one step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExplorationSchedule {
    /// ε at the start.
    pub initial: f64,
    /// ε at the end, and after.
    pub last: f64,
    /// Transitions before ε starts to move.
    pub hold: u64,
    /// Transitions over which it moves (0: at once).
    pub span: f64,
    /// The exponent of the exploratory actions' durations (`--exploration_duration_mu`).
    pub duration_mu: f64,
}

impl ExplorationSchedule {
    /// ε once `inserted` transitions are in the replay buffer.
    pub fn epsilon(&self, inserted: u64) -> f64 {
        if inserted < self.hold {
            return self.initial;
        }
        let moved = (inserted - self.hold) as f64;
        let progress = if self.span > 0.0 {
            (moved / self.span).min(1.0)
        } else {
            1.0
        };
        self.initial + progress * (self.last - self.initial)
    }
}

/// What a checkpoint keeps of a learner besides the networks and the optimisers' moments.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainingState {
    /// The policy version (SGD steps so far; also Adam's step count).
    pub version: u64,
    /// Env frames trained on (the linear-decay schedule's position; an off-policy learner's transitions sampled).
    pub frames_trained: u64,
    /// The learning rate the schedule had reached.
    pub lr: f64,
}

/// What the trajectory learner ([`crate::learning::Learner`]) needs of an algorithm that learns from the trajectory
/// slots: training on a dataset, the network it trains, and everything a checkpoint, PBT and several learners of
/// one policy ask of it.
pub trait OnPolicyAlgo: std::fmt::Debug {
    /// Trains on one dataset; returns its metrics (Sample Factory's `train/...` names).
    fn train(&mut self, data: &Dataset) -> Result<BTreeMap<String, f64>>;

    /// The network being trained.
    fn policy(&self) -> &dyn Policy;

    /// The network being trained, mutably (to load weights).
    fn policy_mut(&mut self) -> &mut dyn Policy;

    /// The policy version: the number of SGD steps taken.
    fn version(&self) -> u64;

    /// The generator of the minibatches' orders, for an exact resume.
    fn draws(&self) -> &Draws;

    /// Replaces the generator of the minibatches' orders (a kept one).
    fn set_draws(&mut self, draws: Draws);

    /// Calls `f` after every SGD step: a learner whose dataset takes longer than the heartbeat interval beats its
    /// loop's heartbeat there.
    fn set_after_step(&mut self, f: Box<dyn FnMut() + Send>);

    /// Trains as one of several learners of this policy: each SGD step's gradients are averaged with the others'
    /// through `sync`.
    fn set_gradient_sync(&mut self, sync: Box<dyn GradientSync>);

    /// This learner trains no more: tells the other learners of the policy.
    fn finish_sync(&mut self) -> Result<()>;

    /// Replaces the hyper-parameters PBT mutates.
    fn set_hyper(&mut self, hyper: &Hyper);

    /// Takes another policy's optimiser moments from a checkpoint's `tensors` (its weights loaded into the network
    /// by the caller), keeping this policy's version, which moves on by one so that the inference workers load the
    /// new weights. Returns whether the moments were there.
    fn adopt(&mut self, tensors: &[NamedTensor]) -> Result<bool>;

    /// The optimiser's moments as named tensors.
    fn optimizer_state(&self) -> Result<Vec<NamedTensor>>;

    /// The state to save beside the weights.
    fn training_state(&self) -> TrainingState;

    /// Continues from a saved [`TrainingState`] and the optimiser's moments among `tensors` (the weights are loaded
    /// separately). Returns whether the moments were there; without them the optimiser starts afresh.
    fn restore_training_state(&mut self, tensors: &[NamedTensor], state: TrainingState) -> Result<bool>;
}

/// A training batch of `B` n-step transitions `(s, a, R, d, s')` sampled from a replay buffer: `R` is the
/// discounted return of up to n agent steps, `d` the discount of what follows (`γ^k`, 0 after a terminal state),
/// `s'` the state to bootstrap from (see [`crate::data::transitions`]).
#[derive(Debug)]
pub struct Transitions {
    /// States, `[B, obs_dim]`.
    pub obs: Tensor,
    /// Raw actions taken, `[B, action_dim]` (a category index for discrete actions).
    pub actions: Tensor,
    /// n-step returns, `[B]`.
    pub returns: Tensor,
    /// Discounts of the bootstrap, `[B]`.
    pub discounts: Tensor,
    /// States to bootstrap from, `[B, obs_dim]`.
    pub next_obs: Tensor,
    /// Importance weights of prioritised replay, `[B]`: each transition's loss is weighted by them (none: equal).
    pub weights: Option<Tensor>,
}

impl Transitions {
    /// The batch in `rows` (whole rows of `layout`), on `device`.
    pub fn from_rows(rows: &[f32], layout: &TransitionLayout, device: tch::Device) -> Result<Self> {
        let w = layout.row_words();
        if layout.packs() {
            return Err(RlfError::Protocol {
                component: "learner",
                message: "replay rows with packed bytes must be decoded first".into(),
            });
        }
        if rows.is_empty() || rows.len() % w != 0 {
            return Err(RlfError::Protocol {
                component: "learner",
                message: format!("{} replay values are not whole rows of {w}", rows.len()),
            });
        }
        let all = Tensor::f_from_slice(rows)?
            .f_view([(rows.len() / w) as i64, w as i64])?
            .f_to_device(device)?;
        let column = |at: usize, len: usize| all.narrow(1, at as i64, len as i64);
        Ok(Self {
            obs: column(0, layout.obs_dim()),
            actions: column(layout.action_at(), layout.action_dim),
            returns: column(layout.return_at(), 1).squeeze_dim(1),
            discounts: column(layout.discount_at(), 1).squeeze_dim(1),
            next_obs: column(layout.next_obs_at(), layout.obs_dim()),
            weights: None,
        })
    }

    /// The same batch with importance `weights`, one per transition.
    pub fn weighted(self, weights: &[f32]) -> Result<Self> {
        let device = self.obs.device();
        Ok(Self {
            weights: Some(Tensor::f_from_slice(weights)?.f_to_device(device)?),
            ..self
        })
    }

    /// The mean of per-transition `losses` `[B]`, each weighted by its importance weight if there are any.
    pub fn weighted_mean(&self, losses: &Tensor) -> Result<Tensor> {
        Ok(match &self.weights {
            Some(w) => losses.f_mul(w)?.f_mean(tch::Kind::Float)?,
            None => losses.f_mean(tch::Kind::Float)?,
        })
    }
}

/// What the off-policy learner ([`crate::learning::OffPolicyLearner`]) needs of an algorithm: SGD steps on sampled
/// transitions, the weights the actors run, and everything a checkpoint holds.
pub trait OffPolicyAlgo: std::fmt::Debug {
    /// One SGD step on `batch`; returns the metrics. With `td_errors`, fills it with each transition's TD error
    /// (prioritised replay's new priorities).
    fn train(
        &mut self,
        batch: &Transitions,
        td_errors: Option<&mut Vec<f32>>,
    ) -> Result<BTreeMap<String, f64>>;

    /// SGD steps taken (the policy version).
    fn version(&self) -> u64;

    /// The device the networks live on.
    fn device(&self) -> tch::Device;

    /// The learning rate.
    fn lr(&self) -> f64;

    /// Sets the learning rate of the next steps (every optimiser's).
    fn set_lr(&mut self, lr: f64);

    /// The weights the actors run (what is published).
    fn acting_weights(&self) -> Result<PolicyWeights>;

    /// Every network's variables and the optimisers' moments, by name.
    fn state_tensors(&self) -> Result<Vec<NamedTensor>>;

    /// Continues from a checkpoint's `tensors` at `version`; returns whether everything it trains (optimiser
    /// moments included) was in it.
    fn restore(&mut self, tensors: &[NamedTensor], version: u64) -> Result<bool>;

    /// The state of the generator its training draws from (SAC's action noise), for an exact resume; `None`, the
    /// default, when training draws nothing.
    fn sampler_state(&self) -> Option<Vec<u8>> {
        None
    }

    /// Takes back what [`sampler_state`](OffPolicyAlgo::sampler_state) returned.
    fn load_sampler_state(&mut self, state: &[u8]) -> Result<()> {
        let _ = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each registered algorithm is found by its own name, names are unique, and an unknown one is refused in one
    /// line that lists them.
    #[test]
    fn every_registered_algorithm_is_found_by_its_name() {
        let names = names();
        assert_eq!(names, ["appo", "dqn", "sac"]);
        for name in &names {
            assert_eq!(algorithm(name).expect("registered").name(), *name);
        }
        let error = algorithm("ppo").err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("invalid configuration: --algo ppo: there is no such algorithm (there are: appo, dqn, sac)")
        );
        assert!(!algorithm("appo").expect("appo").learns_from_replay());
        assert!(algorithm("dqn").expect("dqn").learns_from_replay());
    }

    /// DQN's ε falls linearly over `--exploration_fraction` of the run and stays; SAC acts at random until
    /// `--learning_starts` transitions are in, then samples its actor; APPO has no schedule.
    #[test]
    fn each_algorithm_explores_on_its_schedule() {
        let mut cfg = Config::default();
        cfg.run.train_for_env_steps = 1000;
        cfg.off_policy.exploration_fraction = 0.5;
        cfg.off_policy.exploration_initial_eps = 1.0;
        cfg.off_policy.exploration_final_eps = 0.1;
        cfg.off_policy.learning_starts = 300;
        let dqn = algorithm("dqn")
            .expect("dqn")
            .exploration(&cfg)
            .expect("ε-greedy");
        let at = |s: &ExplorationSchedule, n| (s.epsilon(n) * 1e6).round() / 1e6;
        assert_eq!(
            [at(&dqn, 0), at(&dqn, 250), at(&dqn, 500), at(&dqn, 900)],
            [1.0, 0.55, 0.1, 0.1]
        );
        let sac = algorithm("sac")
            .expect("sac")
            .exploration(&cfg)
            .expect("random at first");
        assert_eq!(
            [at(&sac, 0), at(&sac, 299), at(&sac, 300), at(&sac, 5000)],
            [1.0, 1.0, 0.0, 0.0]
        );
        assert!(algorithm("appo").expect("appo").exploration(&cfg).is_none());
    }
}
