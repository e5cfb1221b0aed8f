//! DQN over n-step transitions from a replay buffer, read top to bottom.
//!
//! 1. A batch is `B` n-step transitions `(s, a, R, d, s')` sampled from the policy's replay ring
//!    ([`Transitions`]): `R` is the discounted return of up to n agent steps, `d` the discount of what follows
//!    (`γ^k`, 0 after a terminal state), `s'` the state to bootstrap from (see [`crate::data::transitions`]).
//! 2. Targets, without gradient: the next action `a' = argmax_a Q(s', a)` of the online network (double DQN,
//!    `--double_q`) or of the target network; `y = R + d · Q_target(s', a')`. Actions an `action_mask` forbids in
//!    `s'` are never `a'`.
//! 3. Loss: the Huber loss (δ = 1) of `Q(s, a) − y`, averaged over the batch (weighted by importance with
//!    prioritised replay, whose new priorities are these TD errors).
//! 4. Gradients are clipped to a global norm of `--max_grad_norm`, then one Adam step; the version (SGD steps)
//!    increases by one. For a Q-network whose encoder is an MLP of ReLU layers, autograd only takes the loss back
//!    to `Q(s, a)`, and the network's gradients are written out by hand ([`QNetwork::gradients`], tested against
//!    autograd's), its products on `s'` reusing the weights as cast for `s`: a step on the network of
//!    `configs/treasurehunt-iqn-like.toml` (sorrel's `treasurehunt_mp`) takes 5% less time on one thread and 11%
//!    less on two (`examples/dqn_bench.rs`; docs/benchmarks.md).
//! 5. Every `--target_update_interval` steps the target network follows the online one: a copy, or Polyak
//!    averaging with `--tau` < 1.
//! 6. Metrics: `train/loss`, `train/q_mean` (of `Q(s, a)`), `train/target_mean`, `train/grad_norm`, `train/lr`.

use std::collections::BTreeMap;

use tch::{Kind, Reduction, Tensor};

use super::adam::Adam;
use super::{OffPolicyAlgo, Transitions};
use crate::config::{Config, OffPolicyConfig, OptimizerConfig};
use crate::error::{Result, RlfError};
use crate::model::{NamedTensor, Policy, PolicyWeights, QNetwork};

/// DQN to the rest of the crate: a Q-network acts; `Discrete` actions only.
pub struct DqnAlgorithm;

impl super::Algorithm for DqnAlgorithm {
    fn name(&self) -> &'static str {
        "dqn"
    }

    fn learns_from_replay(&self) -> bool {
        true
    }

    fn check_config(&self, cfg: &Config) -> Result<()> {
        super::check_off_policy(cfg, self.name())
    }

    fn check_training(&self, cfg: &Config) -> Result<()> {
        super::check_off_policy_training(cfg, self.name())
    }

    /// ε-greedy: ε falls linearly from `--exploration_initial_eps` to `--exploration_final_eps` over
    /// `--exploration_fraction` of `--train_for_env_steps`, then stays.
    fn exploration(&self, cfg: &Config) -> Option<super::ExplorationSchedule> {
        let o = &cfg.off_policy;
        Some(super::ExplorationSchedule {
            initial: o.exploration_initial_eps,
            last: o.exploration_final_eps,
            hold: 0,
            span: o.exploration_fraction * cfg.run.train_for_env_steps as f64,
            duration_mu: o.exploration_duration_mu,
        })
    }

    fn explores_epsilon_greedy(&self) -> bool {
        true
    }

    fn acting_network(
        &self,
        observation_space: &rlf_env::Space,
        action_space: &rlf_env::Space,
        cfg: &Config,
    ) -> Result<Box<dyn Policy>> {
        Ok(Box::new(QNetwork::new(
            observation_space,
            action_space,
            &cfg.model,
            cfg.off_policy.dueling,
            cfg.run.device,
        )?))
    }

    fn check_actions(&self, env: &str, action_spaces: &[rlf_env::Space]) -> Result<()> {
        match action_spaces
            .iter()
            .find(|s| !matches!(s, rlf_env::Space::Discrete { .. }))
        {
            Some(space) => Err(RlfError::Config(format!(
                "--algo dqn needs Discrete actions; {env} has {space}"
            ))),
            None => Ok(()),
        }
    }

    /// The online network and its target start from the same seed: identical.
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
        let network = || {
            seed();
            QNetwork::new(
                observation_space,
                action_space,
                &cfg.model,
                cfg.off_policy.dueling,
                cfg.run.device,
            )
        };
        let (online, target) = (network()?, network()?);
        Ok(Some(Box::new(Dqn::new(
            online,
            target,
            &cfg.optimizer,
            &cfg.off_policy,
        )?)))
    }
}

// ---------------------------------------------------------------------------------------------
// The learner's state

/// The training state of one DQN policy: online and target networks, optimiser, version.
#[derive(Debug)]
pub struct Dqn {
    online: QNetwork,
    target: QNetwork,
    optimizer: Adam,
    cfg: OffPolicyConfig,
    max_grad_norm: f64,
    version: u64,
}

impl Dqn {
    /// A learner training `online` (its target network `target`, of the same architecture, starts as a copy)
    /// with Adam as `optim` sets it (learning rate, ε, β, gradient clipping).
    pub fn new(
        online: QNetwork,
        mut target: QNetwork,
        optim: &OptimizerConfig,
        cfg: &OffPolicyConfig,
    ) -> Result<Self> {
        target.follow(&online, 1.0)?;
        let optimizer = Adam::new(online.variables().trainable(), optim.into(), optim.learning_rate)?;
        Ok(Self {
            online,
            target,
            optimizer,
            cfg: cfg.clone(),
            max_grad_norm: optim.max_grad_norm,
            version: 0,
        })
    }

    /// The network trained.
    pub fn model(&self) -> &QNetwork {
        &self.online
    }

    /// The network trained, mutably (to load weights).
    pub fn model_mut(&mut self) -> &mut QNetwork {
        &mut self.online
    }

    /// The target network.
    pub fn target(&self) -> &QNetwork {
        &self.target
    }

    /// SGD steps taken.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        self.optimizer.lr()
    }

    /// Restores the version, the optimiser's moments and the target network (from `tensors`, a checkpoint's; a
    /// copy of the online one, loaded before, when the checkpoint has none). Returns whether the moments were there.
    pub fn restore(&mut self, version: u64, tensors: &[NamedTensor]) -> Result<bool> {
        self.version = version;
        let moments = self.optimizer.load_state(tensors, version)?;
        let target = NamedTensor::unprefixed(NamedTensor::TARGET_PREFIX, tensors);
        if target.is_empty() {
            self.target.follow(&self.online, 1.0)?;
        } else {
            self.target.load_named_tensors(&target)?;
        }
        Ok(moments)
    }

    // -----------------------------------------------------------------------------------------
    // 2. Targets

    /// `R + d · Q_target(s', a')`, `[B]`, without gradient.
    pub fn targets(&self, batch: &Transitions) -> Tensor {
        self.targets_choosing(batch, None)
    }

    /// [`Dqn::targets`], with the online network's `Q(s', ·)` given when already computed (double DQN).
    fn targets_choosing(&self, batch: &Transitions, online_next: Option<Tensor>) -> Tensor {
        tch::no_grad(|| {
            let q_target = self.target.q_values(&batch.next_obs);
            let chooser = match online_next {
                Some(q) if self.cfg.double_q => q,
                _ if self.cfg.double_q => self.online.q_values(&batch.next_obs),
                _ => q_target.shallow_clone(),
            };
            let next = self.online.masked(&batch.next_obs, &chooser).argmax(-1, true);
            let bootstrap = q_target.gather(-1, &next, false).squeeze_dim(-1);
            &batch.returns + &batch.discounts * bootstrap
        })
    }

    // -----------------------------------------------------------------------------------------
    // 3-6. One SGD step

    /// One SGD step on `batch`; returns the metrics. With `td_errors`, fills it with `Q(s, a) − y` per transition.
    pub fn train(
        &mut self,
        batch: &Transitions,
        td_errors: Option<&mut Vec<f32>>,
    ) -> Result<BTreeMap<String, f64>> {
        let saved = self.online.forward_saved(&batch.obs).transpose()?;
        let online_next = match &saved {
            // The online network's products on s' reuse the weights as cast for s.
            Some(saved) if self.cfg.double_q => Some(self.online.q_values_like(saved, &batch.next_obs)?),
            _ => None,
        };
        let y = self.targets_choosing(batch, online_next);
        let actions = batch.actions.to_kind(Kind::Int64);
        let loss_of = |q: &Tensor| -> Result<Tensor> {
            Ok(match &batch.weights {
                None => q.f_huber_loss(&y, Reduction::Mean, 1.0)?,
                Some(_) => batch.weighted_mean(&q.f_huber_loss(&y, Reduction::None, 1.0)?)?,
            })
        };
        let (q, loss, grad_norm) = match saved {
            // An MLP of ReLU layers: the network's gradients are written by hand; autograd only takes the loss back
            // to `Q(s, a)`.
            Some(saved) => {
                let q = saved
                    .q()
                    .f_gather(-1, &actions, false)?
                    .squeeze_dim(-1)
                    .set_requires_grad(true);
                let loss = loss_of(&q)?;
                loss.f_backward()?;
                let dq = saved
                    .q()
                    .f_zeros_like()?
                    .f_scatter(-1, &actions, &q.grad().unsqueeze(-1))?;
                let grads = self.online.gradients(&saved, &dq)?;
                let grad_norm = self.optimizer.clip_and_step_with(&grads, self.max_grad_norm)?;
                (q.detach(), loss, grad_norm)
            }
            None => {
                let q = self
                    .online
                    .q_values(&batch.obs)
                    .f_gather(-1, &actions, false)?
                    .squeeze_dim(-1);
                let loss = loss_of(&q)?;
                self.optimizer.zero_grad()?;
                loss.f_backward()?;
                (q, loss, self.optimizer.clip_and_step(self.max_grad_norm)?)
            }
        };
        if let Some(out) = td_errors {
            *out = Vec::try_from(q.detach().f_sub(&y)?)?;
        }
        // Adam wrote the weights through its flat buffer, which their version counters do not see.
        self.online.forget_acting_casts();
        self.version += 1;
        if self.version % self.cfg.target_update_interval.max(1) == 0 {
            self.target.follow(&self.online, self.cfg.tau)?;
        }
        let scalar = |t: &Tensor| f64::try_from(t.detach()).unwrap_or(f64::NAN);
        Ok(BTreeMap::from([
            ("train/loss".to_owned(), scalar(&loss)),
            ("train/q_mean".to_owned(), scalar(&q.mean(Kind::Float))),
            ("train/target_mean".to_owned(), scalar(&y.mean(Kind::Float))),
            ("train/grad_norm".to_owned(), grad_norm),
            ("train/lr".to_owned(), self.lr()),
        ]))
    }
}

impl OffPolicyAlgo for Dqn {
    fn train(
        &mut self,
        batch: &Transitions,
        td_errors: Option<&mut Vec<f32>>,
    ) -> Result<BTreeMap<String, f64>> {
        Dqn::train(self, batch, td_errors)
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn device(&self) -> tch::Device {
        self.online.device()
    }

    fn lr(&self) -> f64 {
        Dqn::lr(self)
    }

    fn set_lr(&mut self, lr: f64) {
        self.optimizer.set_lr(lr);
    }

    fn acting_weights(&self) -> Result<PolicyWeights> {
        self.online.weights()
    }

    /// The online network's variables, the target network's (as `target.<name>`) and the optimiser's moments.
    fn state_tensors(&self) -> Result<Vec<NamedTensor>> {
        let mut tensors = self.online.named_tensors()?;
        tensors.extend(NamedTensor::prefixed(
            NamedTensor::TARGET_PREFIX,
            self.target.named_tensors()?,
        ));
        tensors.extend(self.optimizer.state()?);
        Ok(tensors)
    }

    fn restore(&mut self, tensors: &[NamedTensor], version: u64) -> Result<bool> {
        self.online.load_named_tensors(tensors)?;
        Dqn::restore(self, version, tensors)
    }
}

#[cfg(test)]
mod tests {
    use rlf_env::{BoxSpace, Space};

    use super::*;
    use crate::config::{Config, DeviceKind};
    use crate::data::TransitionLayout;

    fn layout() -> TransitionLayout {
        TransitionLayout::floats(2, 1)
    }

    fn learner(overrides: &[&str]) -> Dqn {
        tch::manual_seed(0);
        let cfg = Config::for_env("CartPole-v1", overrides).expect("config");
        let obs = Space::Box(BoxSpace::uniform(0.0, 1.0, vec![2]).expect("box"));
        let actions = Space::Discrete { n: 2, start: 0 };
        let net = || {
            QNetwork::new(
                &obs,
                &actions,
                &cfg.model,
                cfg.off_policy.dueling,
                DeviceKind::Cpu,
            )
            .expect("network")
        };
        Dqn::new(net(), net(), &cfg.optimizer, &cfg.off_policy).expect("dqn")
    }

    /// A two-state chain, γ folded into the rows: from state A action 1 leads to B (reward 0, discount 0.9),
    /// action 0 ends the episode with 0.5; from B action 0 ends it with 1, action 1 with 0. DQN learns
    /// Q(B) = [1, 0] and Q(A) = [0.5, 0.9], bootstrapping A's value from B's through the target network.
    /// With tanh layers the network's gradients come from autograd, with ReLU layers they are written by hand.
    // lane: ci
    #[test]
    fn dqn_learns_a_two_step_chain() {
        for nonlinearity in ["tanh", "relu"] {
            learns_a_two_step_chain(nonlinearity);
        }
    }

    fn learns_a_two_step_chain(nonlinearity: &str) {
        let mut dqn = learner(&[
            "learning_rate = 0.01",
            "target_update_interval = 20",
            "max_grad_norm = 10",
            "encoder_mlp_layers = '32'",
            &format!("nonlinearity = '{nonlinearity}'"),
        ]);
        assert_eq!(dqn.model().differentiable_by_hand(), nonlinearity == "relu");
        let (a, b) = ([1.0, 0.0], [0.0, 1.0]);
        let mut rows = vec![0.0; 4 * layout().row_words()];
        let w = layout().row_words();
        layout().write(&mut rows[..w], &a, &[1.0], 0.0, 0.9, &b);
        layout().write(&mut rows[w..2 * w], &a, &[0.0], 0.5, 0.0, &[0.0, 0.0]);
        layout().write(&mut rows[2 * w..3 * w], &b, &[0.0], 1.0, 0.0, &[0.0, 0.0]);
        layout().write(&mut rows[3 * w..], &b, &[1.0], 0.0, 0.0, &[0.0, 0.0]);
        let batch = Transitions::from_rows(&rows, &layout(), tch::Device::Cpu).expect("batch");
        for _ in 0..1500 {
            dqn.train(&batch, None).expect("step");
        }
        assert_eq!(dqn.version(), 1500);
        let q = dqn
            .model()
            .q_values(&Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0]).view([2, 2]));
        let q: Vec<f32> = Vec::try_from(q.flatten(0, -1)).expect("values");
        let want = [0.5, 0.9, 1.0, 0.0];
        // Greedy acting takes the better action in each state.
        let greedy = dqn
            .model_mut()
            .act(&[1.0, 0.0, 0.0, 1.0], true)
            .expect("act")
            .actions;
        let passed = q.iter().zip(want).all(|(got, want)| (got - want).abs() < 0.05) && greedy == [1.0, 0.0];
        eprintln!(
            "learning: dqn_chain_{nonlinearity} seed 0: Q {q:?}, greedy {greedy:?} [target Q within 0.05 of \
             {want:?} and greedy [1.0, 0.0] after 1500 SGD steps] ({})",
            if passed { "pass" } else { "fail" }
        );
        for (got, want) in q.iter().zip(want) {
            assert!((got - want).abs() < 0.05, "{nonlinearity}: Q = {q:?}");
        }
        assert_eq!(greedy, [1.0, 0.0]);
    }

    /// A checkpoint's tensors restore the online network, the target network (Polyak averaging has moved it away
    /// from the online one) and Adam's moments, so that a restored learner's next steps are the original's.
    #[test]
    fn state_round_trips_with_the_target_network() {
        let flags = [
            "tau = 0.1",
            "target_update_interval = 1",
            "encoder_mlp_layers = '16'",
        ];
        let mut dqn = learner(&flags);
        let w = layout().row_words();
        let mut rows = vec![0.0; 8 * w];
        for (i, row) in rows.chunks_exact_mut(w).enumerate() {
            layout().write(
                row,
                &[i as f32 / 8.0, 1.0],
                &[(i % 2) as f32],
                1.0,
                0.9,
                &[0.5, 0.5],
            );
        }
        let batch = Transitions::from_rows(&rows, &layout(), tch::Device::Cpu).expect("batch");
        for _ in 0..5 {
            dqn.train(&batch, None).expect("step");
        }
        let saved = dqn.state_tensors().expect("state");
        let target = NamedTensor::unprefixed(NamedTensor::TARGET_PREFIX, &saved);
        assert!(!target.is_empty() && target != dqn.model().named_tensors().expect("online"));
        let mut other = learner(&flags);
        assert!(OffPolicyAlgo::restore(&mut other, &saved, 5).expect("restore"));
        assert_eq!(other.state_tensors().expect("state"), saved);
        for _ in 0..3 {
            dqn.train(&batch, None).expect("step");
            other.train(&batch, None).expect("step");
        }
        assert_eq!(
            other.state_tensors().expect("state"),
            dqn.state_tensors().expect("state")
        );
    }

    /// Acting in bfloat16 (`--matmul_precision medium`) with the learner's own network after a step sees the weights
    /// the step wrote (Adam writes them through its flat buffer, which the casts' version check cannot see).
    #[test]
    fn acting_after_training_sees_the_new_weights() {
        let mut dqn = learner(&[
            "matmul_precision = 'medium'",
            "nonlinearity = 'relu'",
            "learning_rate = 0.05",
        ]);
        let mut rows = vec![0.0; 4 * layout().row_words()];
        for (i, row) in rows.chunks_exact_mut(layout().row_words()).enumerate() {
            let s = [i as f32 / 4.0, 1.0 - i as f32 / 4.0];
            layout().write(row, &s, &[(i % 2) as f32], 1.0 + i as f32, 0.0, &s);
        }
        let batch = Transitions::from_rows(&rows, &layout(), tch::Device::Cpu).expect("batch");
        let obs = [0.25f32, 0.75, 0.5, 0.5];
        let before = dqn.model_mut().act(&obs, true).expect("act").values;
        dqn.train(&batch, None).expect("step");
        let after = dqn.model_mut().act(&obs, true).expect("act").values;
        let mut fresh = learner(&["matmul_precision = 'medium'", "nonlinearity = 'relu'"]);
        fresh
            .model_mut()
            .load_weights(&dqn.model().weights().expect("weights"))
            .expect("load");
        assert_ne!(after, before);
        assert_eq!(after, fresh.model_mut().act(&obs, true).expect("act").values);
    }

    /// Double DQN picks the next action with the online network and values it with the target network; plain
    /// DQN does both with the target network.
    #[test]
    fn double_q_chooses_with_the_online_network() {
        let mut rows = vec![0.0; 8 * layout().row_words()];
        for (i, row) in rows.chunks_exact_mut(layout().row_words()).enumerate() {
            let s = [i as f32 / 8.0, 1.0 - i as f32 / 8.0];
            layout().write(row, &s, &[(i % 2) as f32], 0.25, 0.5, &[s[1], s[0]]);
        }
        let batch = Transitions::from_rows(&rows, &layout(), tch::Device::Cpu).expect("batch");
        for double in [true, false] {
            let mut dqn = learner(&[&format!("double_q = {double}"), "target_update_interval = 1000"]);
            // Make the online network differ from the target network.
            for _ in 0..50 {
                dqn.train(&batch, None).expect("step");
            }
            let q_target = dqn.target().q_values(&batch.next_obs);
            let chooser = if double {
                dqn.model().q_values(&batch.next_obs)
            } else {
                q_target.shallow_clone()
            };
            let next = chooser.argmax(-1, true);
            let want = q_target.gather(-1, &next, false).squeeze_dim(-1) * 0.5 + 0.25;
            let diff = f64::try_from((dqn.targets(&batch) - want).abs().max()).expect("max");
            assert!(diff < 1e-6, "double_q {double}: {diff}");
        }
    }
}
