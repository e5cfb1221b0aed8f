//! Soft actor-critic (Haarnoja et al., 2018, with the automatic temperature of the follow-up paper) over n-step
//! transitions from a replay buffer, read top to bottom. The order of the updates is Stable-Baselines3's, whose
//! figures (RL Baselines3 Zoo) are the reference.
//!
//! 1. A batch is `B` n-step transitions `(s, a, R, d, s')` ([`Transitions`]); `a` is the squashed action in
//!    [−1, 1]^d the actor took ([`SacActor`]).
//! 2. The temperature: `α = exp(log α)`, read before its own update and used by steps 3 and 5; a fresh action
//!    `ã ~ π(·|s)` with log-density `log π(ã|s)` (reparameterised); loss `−log α · (log π(ã|s) + H̄)` with the target
//!    entropy `H̄ = −d`; one Adam step on `log α`.
//! 3. Targets, without gradient: `a' ~ π(·|s')`, `y = R + d · (min(Q̄₁, Q̄₂)(s', a') − α log π(a'|s'))` with the
//!    target networks `Q̄`.
//! 4. Critic loss: `½ (MSE(Q₁(s, a), y) + MSE(Q₂(s, a), y))` (each transition's weighted by importance with
//!    prioritised replay, whose new priorities are the mean of the two critics' TD errors); one Adam step on both
//!    Q-networks.
//! 5. Actor loss: `mean(α log π(ã|s) − min(Q₁, Q₂)(s, ã))` with the updated critics (gradients reach the actor
//!    through `ã`); one Adam step on the actor.
//! 6. The version (SGD steps) increases by one; every `--target_update_interval` steps the target networks move
//!    `--tau` of the way towards the critics (Polyak averaging).
//! 7. No gradient clipping (as the paper and Stable-Baselines3). Metrics: `train/critic_loss`, `train/actor_loss`,
//!    `train/alpha`, `train/entropy` (of `π(·|s)`, estimated as `−mean log π(ã|s)`), `train/q_mean`, `train/lr`.

use std::collections::BTreeMap;

use tch::{Kind, Reduction, Tensor};

use super::adam::{Adam, AdamConfig};
use super::{OffPolicyAlgo, Transitions};
use crate::config::{Config, ContinuousActionMode, ConvArchitecture, OffPolicyConfig, OptimizerConfig};
use crate::error::{Result, RlfError};
use crate::model::{NamedTensor, Policy, PolicyWeights, SacActor, TwinQ};

/// SAC to the rest of the crate: its actor acts; `Box` actions with finite bounds only (it scales its actions in
/// [-1, 1] to them).
pub struct SacAlgorithm;

impl super::Algorithm for SacAlgorithm {
    fn name(&self) -> &'static str {
        "sac"
    }

    fn learns_from_replay(&self) -> bool {
        true
    }

    fn check_config(&self, cfg: &Config) -> Result<()> {
        let m = &cfg.model;
        if !m.encoder_conv_layers.0.is_empty()
            || m.encoder_conv_architecture != ConvArchitecture::None
            || m.obs_scale != 1.0
        {
            return Err(RlfError::Config(
                "--algo sac takes unscaled observations and MLP encoders only: drop --encoder_conv_layers, \
                 --encoder_conv_architecture and --obs_scale"
                    .into(),
            ));
        }
        super::check_off_policy(cfg, self.name())
    }

    fn check_training(&self, cfg: &Config) -> Result<()> {
        super::check_off_policy_training(cfg, self.name())
    }

    /// The actor acts in [−1, 1], scaled to the bounds.
    fn continuous_action_mode(&self, _cfg: &Config) -> ContinuousActionMode {
        ContinuousActionMode::Scale
    }

    /// Uniformly random actions until `--learning_starts` transitions are in (as Stable-Baselines3), then none: it
    /// explores by sampling its actor.
    fn exploration(&self, cfg: &Config) -> Option<super::ExplorationSchedule> {
        Some(super::ExplorationSchedule {
            initial: 1.0,
            last: 0.0,
            hold: cfg.off_policy.learning_starts,
            span: 0.0,
            duration_mu: 0.0,
        })
    }

    fn acting_network(
        &self,
        observation_space: &rlf_env::Space,
        action_space: &rlf_env::Space,
        cfg: &Config,
    ) -> Result<Box<dyn Policy>> {
        Ok(Box::new(SacActor::new(
            observation_space,
            action_space,
            &cfg.model,
            cfg.run.device,
        )?))
    }

    fn check_actions(&self, env: &str, action_spaces: &[rlf_env::Space]) -> Result<()> {
        let boxes: Vec<&rlf_env::BoxSpace> = action_spaces
            .iter()
            .map(|space| match space {
                rlf_env::Space::Box(b) => Ok(b),
                _ => Err(RlfError::Config(format!(
                    "--algo sac needs Box actions; {env} has {space}"
                ))),
            })
            .collect::<Result<_>>()?;
        if let Some(b) = boxes
            .into_iter()
            .find(|b| b.low().iter().chain(b.high()).any(|v| !v.is_finite()))
        {
            return Err(RlfError::Config(format!(
                "--algo sac scales its actions in [-1, 1] to the env's bounds; {env} has {}, with a bound that is \
                 not finite",
                rlf_env::Space::Box(b.clone())
            )));
        }
        Ok(())
    }

    /// The actor starts from the policy's seed, the two critics from what follows it.
    fn on_policy_learner(
        &self,
        _observation_space: &rlf_env::Space,
        _action_space: &rlf_env::Space,
        _cfg: &Config,
        _seed: &dyn Fn(),
        _rules: Option<std::sync::Arc<dyn rlf_env::PlyModel>>,
    ) -> Result<Option<Box<dyn super::OnPolicyAlgo>>> {
        Ok(None)
    }

    fn off_policy_learner(
        &self,
        observation_space: &rlf_env::Space,
        action_space: &rlf_env::Space,
        cfg: &Config,
        seed: &dyn Fn(),
    ) -> Result<Option<Box<dyn OffPolicyAlgo>>> {
        seed();
        let actor = SacActor::new(observation_space, action_space, &cfg.model, cfg.run.device)?;
        let (obs_dim, action_dim) = (actor.obs_dim() as i64, actor.action_dim());
        let twin = || TwinQ::new(obs_dim, action_dim, &cfg.model, cfg.run.device);
        Ok(Some(Box::new(Sac::new(
            actor,
            twin()?,
            twin()?,
            &cfg.optimizer,
            &cfg.off_policy,
        )?)))
    }
}

/// The name of the temperature's variable in checkpoints.
const LOG_ALPHA: &str = "log_alpha";

/// The training state of one SAC policy.
#[derive(Debug)]
pub struct Sac {
    actor: SacActor,
    critic: TwinQ,
    target: TwinQ,
    log_alpha: Tensor,
    actor_optimizer: Adam,
    critic_optimizer: Adam,
    alpha_optimizer: Adam,
    target_entropy: f64,
    cfg: OffPolicyConfig,
    version: u64,
}

impl Sac {
    /// A learner training `actor` and `critic` (its target networks `target`, of the same architecture, start as a
    /// copy), all three with Adam at `optim`'s learning rate and settings (no gradient clipping, as the paper); the
    /// temperature starts at 1.
    pub fn new(
        actor: SacActor,
        critic: TwinQ,
        mut target: TwinQ,
        optim: &OptimizerConfig,
        cfg: &OffPolicyConfig,
    ) -> Result<Self> {
        target.follow(&critic, 1.0)?;
        let adam = AdamConfig::from(optim);
        let lr = optim.learning_rate;
        let log_alpha = Tensor::f_zeros([1], (Kind::Float, actor.device()))?.set_requires_grad(true);
        let alpha_optimizer = Adam::new(vec![(LOG_ALPHA.to_owned(), log_alpha.shallow_clone())], adam, lr)?;
        Ok(Self {
            target_entropy: -(actor.action_dim() as f64),
            actor_optimizer: Adam::new(actor.variables().trainable(), adam, lr)?,
            critic_optimizer: Adam::new(critic.variables().trainable(), adam, lr)?,
            alpha_optimizer,
            actor,
            critic,
            target,
            log_alpha,
            cfg: cfg.clone(),
            version: 0,
        })
    }

    /// The actor trained.
    pub fn actor(&self) -> &SacActor {
        &self.actor
    }

    /// The critics.
    pub fn critic(&self) -> &TwinQ {
        &self.critic
    }

    /// The temperature α.
    pub fn alpha(&self) -> f64 {
        self.log_alpha_value().exp()
    }

    fn log_alpha_value(&self) -> f64 {
        f64::try_from(self.log_alpha.detach().squeeze()).unwrap_or(f64::NAN)
    }

    // -----------------------------------------------------------------------------------------
    // 3. Targets

    /// `R + d · (min(Q̄₁, Q̄₂)(s', a') − α log π(a'|s'))`, `[B]`, without gradient.
    pub fn targets(&mut self, batch: &Transitions, alpha: &Tensor) -> Tensor {
        tch::no_grad(|| {
            let (next_actions, next_log_prob) = self.actor.sample(&batch.next_obs);
            let (q1, q2) = self.target.q_values(&batch.next_obs, &next_actions);
            let soft = q1.minimum(&q2) - alpha * next_log_prob;
            &batch.returns + &batch.discounts * soft
        })
    }

    // -----------------------------------------------------------------------------------------
    // 2-7. One SGD step

    /// One SGD step on `batch`; returns the metrics. With `td_errors`, fills it with the mean of the two critics'
    /// `Q(s, a) − y` per transition.
    pub fn train(
        &mut self,
        batch: &Transitions,
        td_errors: Option<&mut Vec<f32>>,
    ) -> Result<BTreeMap<String, f64>> {
        // 2. The temperature, from a fresh action of the current actor; α as it was before this update of it, for
        // the targets and the actor (as Stable-Baselines3).
        let alpha = self.log_alpha.detach().exp();
        let (actions_pi, log_prob_pi) = self.actor.sample(&batch.obs);
        let alpha_loss =
            -(&self.log_alpha * (log_prob_pi.detach() + self.target_entropy)).f_mean(Kind::Float)?;
        self.alpha_optimizer.zero_grad()?;
        alpha_loss.f_backward()?;
        self.alpha_optimizer.step()?;

        // 3-4. The critics.
        let y = self.targets(batch, &alpha);
        let (q1, q2) = self.critic.q_values(&batch.obs, &batch.actions);
        let critic_loss = match &batch.weights {
            None => (q1.f_mse_loss(&y, Reduction::Mean)? + q2.f_mse_loss(&y, Reduction::Mean)?) * 0.5,
            Some(_) => {
                let squared = (&q1 - &y).square() + (&q2 - &y).square();
                batch.weighted_mean(&squared)? * 0.5
            }
        };
        if let Some(out) = td_errors {
            *out = Vec::try_from(((&q1 + &q2).detach() * 0.5).f_sub(&y)?)?;
        }
        self.critic_optimizer.zero_grad()?;
        critic_loss.f_backward()?;
        self.critic_optimizer.step()?;

        // 5. The actor, against the updated critics.
        let (q1_pi, q2_pi) = self.critic.q_values(&batch.obs, &actions_pi);
        let actor_loss = (&alpha * &log_prob_pi - q1_pi.minimum(&q2_pi)).f_mean(Kind::Float)?;
        self.actor_optimizer.zero_grad()?;
        actor_loss.f_backward()?;
        self.actor_optimizer.step()?;

        // 6. Version and target networks.
        self.version += 1;
        if self.version % self.cfg.target_update_interval.max(1) == 0 {
            self.target.follow(&self.critic, self.cfg.tau)?;
        }
        let scalar = |t: &Tensor| f64::try_from(t.detach()).unwrap_or(f64::NAN);
        Ok(BTreeMap::from([
            ("train/critic_loss".to_owned(), scalar(&critic_loss)),
            ("train/actor_loss".to_owned(), scalar(&actor_loss)),
            ("train/alpha".to_owned(), scalar(&alpha.squeeze())),
            (
                "train/entropy".to_owned(),
                -scalar(&log_prob_pi.mean(Kind::Float)),
            ),
            ("train/q_mean".to_owned(), scalar(&q1.mean(Kind::Float))),
            ("train/lr".to_owned(), self.actor_optimizer.lr()),
        ]))
    }
}

impl OffPolicyAlgo for Sac {
    /// The actor's generator, which draws the noise of its actions in the targets and the losses.
    fn sampler_state(&self) -> Option<Vec<u8>> {
        self.actor.sampler_state()
    }

    fn load_sampler_state(&mut self, state: &[u8]) -> Result<()> {
        self.actor.load_sampler_state(state)
    }

    fn train(
        &mut self,
        batch: &Transitions,
        td_errors: Option<&mut Vec<f32>>,
    ) -> Result<BTreeMap<String, f64>> {
        Sac::train(self, batch, td_errors)
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn device(&self) -> tch::Device {
        self.actor.device()
    }

    fn lr(&self) -> f64 {
        self.actor_optimizer.lr()
    }

    fn set_lr(&mut self, lr: f64) {
        for optimizer in [
            &mut self.actor_optimizer,
            &mut self.critic_optimizer,
            &mut self.alpha_optimizer,
        ] {
            optimizer.set_lr(lr);
        }
    }

    fn acting_weights(&self) -> Result<PolicyWeights> {
        self.actor.weights()
    }

    /// The actor's, the critics' and the target critics' variables (these as `target.<name>`), `log_alpha`, and
    /// the three optimisers' moments.
    fn state_tensors(&self) -> Result<Vec<NamedTensor>> {
        let mut tensors = self.actor.named_tensors()?;
        tensors.extend(self.critic.variables().named_tensors()?);
        tensors.extend(NamedTensor::prefixed(
            NamedTensor::TARGET_PREFIX,
            self.target.variables().named_tensors()?,
        ));
        tensors.push(NamedTensor {
            name: LOG_ALPHA.to_owned(),
            shape: vec![1],
            values: vec![self.log_alpha_value() as f32],
        });
        for optimizer in [
            &self.actor_optimizer,
            &self.critic_optimizer,
            &self.alpha_optimizer,
        ] {
            tensors.extend(optimizer.state()?);
        }
        Ok(tensors)
    }

    /// The actor's variables must be in `tensors`. Critics and temperature missing (a checkpoint a lost learner's
    /// published actor was saved into) restart fresh, and the result is `false`, as it is without moments; target
    /// critics missing (a checkpoint saved before they were) start as a copy of the critics.
    fn restore(&mut self, tensors: &[NamedTensor], version: u64) -> Result<bool> {
        self.actor.load_named_tensors(tensors)?;
        self.version = version;
        let critics = tensors.iter().any(|t| t.name.starts_with("critic."));
        if critics {
            self.critic.variables_mut().load_named_tensors(tensors)?;
        }
        let target = NamedTensor::unprefixed(NamedTensor::TARGET_PREFIX, tensors);
        if critics && !target.is_empty() {
            self.target.variables_mut().load_named_tensors(&target)?;
        } else {
            self.target.follow(&self.critic, 1.0)?;
        }
        let alpha = tensors.iter().find(|t| t.name == LOG_ALPHA);
        if let Some(saved) = alpha.and_then(|t| t.values.first()) {
            tch::no_grad(|| self.log_alpha.f_fill_(f64::from(*saved)).map(drop))?;
        }
        let mut complete = critics && alpha.is_some();
        for optimizer in [
            &mut self.actor_optimizer,
            &mut self.critic_optimizer,
            &mut self.alpha_optimizer,
        ] {
            complete &= optimizer.load_state(tensors, version)?;
        }
        Ok(complete)
    }
}

#[cfg(test)]
mod tests {
    use rlf_env::{BoxSpace, Space};

    use super::*;
    use crate::config::{Config, DeviceKind};
    use crate::data::TransitionLayout;

    fn layout() -> TransitionLayout {
        TransitionLayout::floats(1, 1)
    }

    fn learner(overrides: &[&str]) -> Sac {
        tch::manual_seed(0);
        let cfg = Config::for_env("Pendulum-v1", overrides).expect("config");
        let obs = Space::Box(BoxSpace::uniform(-1.0, 1.0, vec![1]).expect("box"));
        let actions = Space::Box(BoxSpace::uniform(-1.0, 1.0, vec![1]).expect("box"));
        let actor = SacActor::new(&obs, &actions, &cfg.model, DeviceKind::Cpu).expect("actor");
        let twin = || TwinQ::new(1, 1, &cfg.model, DeviceKind::Cpu).expect("critic");
        Sac::new(actor, twin(), twin(), &cfg.optimizer, &cfg.off_policy).expect("sac")
    }

    /// A one-step continuous bandit: in state `s ∈ {−0.5, 0.5}` the reward is `−4 (a − s)²` and the episode ends.
    /// SAC's actor learns to act at `s` (its deterministic action within 0.1 of it), the critics learn the reward
    /// of the actions taken, and the temperature falls as the actor's entropy drops below the target's.
    // lane: ci
    #[test]
    fn sac_learns_a_continuous_bandit() {
        let mut sac = learner(&[
            "learning_rate = 0.003",
            "encoder_mlp_layers = '32,32'",
            "tau = 0.05",
        ]);
        let w = layout().row_words();
        let mut rows = vec![0.0; 256 * w];
        for (i, row) in rows.chunks_exact_mut(w).enumerate() {
            let s = if i % 2 == 0 { -0.5 } else { 0.5 };
            let a = (i as f32 * 0.618_034).fract() * 2.0 - 1.0;
            layout().write(row, &[s], &[a], -4.0 * (a - s) * (a - s), 0.0, &[0.0]);
        }
        let batch = Transitions::from_rows(&rows, &layout(), tch::Device::Cpu).expect("batch");
        let mut metrics = BTreeMap::new();
        for _ in 0..1500 {
            metrics = sac.train(&batch, None).expect("step");
        }
        assert_eq!(sac.version, 1500);
        let out = sac.actor.act(&[-0.5, 0.5], true).expect("act").actions;
        let q = sac.critic().q_values(
            &Tensor::from_slice(&[0.5f32, 0.5]).view([2, 1]),
            &Tensor::from_slice(&[0.5f32, -0.5]).view([2, 1]),
        );
        let q1: Vec<f32> = Vec::try_from(q.0).expect("q");
        let acts = (out[0] + 0.5).abs() < 0.1 && (out[1] - 0.5).abs() < 0.1;
        let values = q1[0].abs() < 0.3 && (q1[1] + 4.0).abs() < 0.5;
        let passed = acts && values && sac.alpha() < 0.5;
        eprintln!(
            "learning: sac_bandit seed 0: actions {out:?}, Q(0.5, 0.5) {}, Q(0.5, -0.5) {}, alpha {} [target \
             actions within 0.1 of [-0.5, 0.5], Q(0.5, 0.5) within 0.3 of 0, Q(0.5, -0.5) within 0.5 of -4, \
             alpha < 0.5 after 1500 SGD steps] ({})",
            q1[0],
            q1[1],
            sac.alpha(),
            if passed { "pass" } else { "fail" }
        );
        assert!(acts, "actions {out:?}");
        assert!(values, "Q(0.5, ·) = {q1:?}");
        assert!(sac.alpha() < 0.5, "alpha {} ({metrics:?})", sac.alpha());
    }

    /// A checkpoint's tensors restore the actor, the critics, their targets (which Polyak averaging has moved away
    /// from the critics), the temperature and the optimisers' moments; a checkpoint of the actor alone restores it and
    /// says that the rest starts afresh.
    #[test]
    fn state_round_trips_and_an_actor_alone_restores() {
        let mut sac = learner(&["encoder_mlp_layers = '16'"]);
        let w = layout().row_words();
        let mut rows = vec![0.0; 8 * w];
        for (i, row) in rows.chunks_exact_mut(w).enumerate() {
            layout().write(row, &[i as f32 / 8.0], &[0.5], 1.0, 0.9, &[0.0]);
        }
        let batch = Transitions::from_rows(&rows, &layout(), tch::Device::Cpu).expect("batch");
        for _ in 0..5 {
            sac.train(&batch, None).expect("step");
        }
        let saved = sac.state_tensors().expect("state");
        let target = NamedTensor::unprefixed(NamedTensor::TARGET_PREFIX, &saved);
        assert!(!target.is_empty() && target != sac.critic().variables().named_tensors().expect("critics"));
        let mut other = learner(&["encoder_mlp_layers = '16'"]);
        assert!(other.restore(&saved, 5).expect("restore"));
        assert_eq!(other.state_tensors().expect("state"), saved);
        let actor_only = sac.actor().named_tensors().expect("actor");
        let mut third = learner(&["encoder_mlp_layers = '16'"]);
        assert!(!third.restore(&actor_only, 5).expect("restore"));
        assert_eq!(third.actor().named_tensors().expect("actor"), actor_only);
    }
}
