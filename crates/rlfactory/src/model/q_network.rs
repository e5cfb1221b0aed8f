//! The Q-network of value-based learners (DQN): the same encoders as the actor-critic (MLP, or convolutions then an
//! MLP), then one Q-value per action of a `Discrete` action space, or a dueling head (`Q = V + A − mean(A)`).
//! An `action_mask` in a Dict observation (PettingZoo's convention) rules actions out of the greedy choice, of
//! ε-greedy exploration and of the learner's bootstrap.
//!
//! As a [`Policy`] it acts ε-greedily: the greedy action with probability `1 − ε`, otherwise a uniformly random
//! legal one; `deterministic` is greedy. Its `values` are `max_a Q`, its `log_probs` the log-probability of the
//! action under the ε-greedy distribution.

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use rlf_env::Space;
use tch::{nn, Kind, Tensor};

use super::actor_critic::action_mask_range;
use super::encoder::{linear, ActingCasts, Encoder, MlpActivations};
use super::weights::{rows_tensor, to_vec, Variables};
use super::{ActOutput, ActionHead, Durations, Hold, Policy};
use crate::config::{DeviceKind, ModelConfig};
use crate::error::{Result, RlfError};

/// What a forbidden action's Q-value becomes before a greedy choice.
const MASKED_Q: f64 = -1e9;

enum Head {
    Plain(nn::Linear),
    Dueling {
        value: nn::Linear,
        advantage: nn::Linear,
    },
}

/// Where each parameter's gradient goes among the network's trainable tensors (their name order), for the gradients
/// written by hand: each encoder layer's weight and bias, then the head's.
#[derive(Debug)]
struct GradientSlots {
    layers: Vec<(usize, Option<usize>)>,
    head: Vec<(usize, Option<usize>)>,
}

/// What [`QNetwork::forward_saved`] keeps for [`QNetwork::gradients`].
pub struct QActivations {
    q: Tensor,
    hidden: Tensor,
    mlp: MlpActivations,
}

impl QActivations {
    /// The Q-values, `[B, num_actions]` (no autograd history).
    pub fn q(&self) -> &Tensor {
        &self.q
    }
}

/// A Q-network for an observation space and a `Discrete` action space.
pub struct QNetwork {
    vars: Variables,
    obs_dim: i64,
    num_actions: i64,
    action_mask: Option<(i64, i64)>,
    encoder: Encoder,
    head: Head,
    /// With an MLP encoder of ReLU layers over the raw observation, where its hand-written gradients go.
    slots: Option<GradientSlots>,
    /// The encoder's weights as cast for acting in bfloat16 (`--matmul_precision medium`), until they change (a load
    /// moves their version counters; a learner's step calls [`QNetwork::forget_acting_casts`]).
    acting: Option<ActingCasts>,
    epsilon: f64,
    /// The draws of ε-greedy exploration.
    rng: Pcg64Mcg,
}

impl std::fmt::Debug for QNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QNetwork")
            .field("obs_dim", &self.obs_dim)
            .field("num_actions", &self.num_actions)
            .field("epsilon", &self.epsilon)
            .finish_non_exhaustive()
    }
}

impl QNetwork {
    /// Builds the network (`dueling`: the dueling head). Only `Discrete` action spaces have Q-values per action.
    pub fn new(
        observation_space: &Space,
        action_space: &Space,
        cfg: &ModelConfig,
        dueling: bool,
        device: DeviceKind,
    ) -> Result<Self> {
        let Space::Discrete { n, .. } = action_space else {
            return Err(RlfError::UnsupportedSpace(format!(
                "DQN needs a Discrete action space, not {action_space} (use SAC or APPO for others)"
            )));
        };
        let num_actions = *n as i64;
        let action_mask = action_mask_range(observation_space, &ActionHead::Categorical { n: num_actions })?;
        let obs_dim = observation_space.flat_dim() as i64;
        if obs_dim == 0 {
            return Err(RlfError::UnsupportedSpace(format!(
                "observation space {observation_space} is empty"
            )));
        }
        let vs = nn::VarStore::new(match device {
            DeviceKind::Cpu => tch::Device::Cpu,
            DeviceKind::Gpu => tch::Device::Cuda(0),
        });
        let root = vs.root();
        let (encoder, hidden) = Encoder::new(&(&root / "encoder"), observation_space, obs_dim, cfg)?;
        let init = cfg.policy_initialization;
        let head = if dueling {
            Head::Dueling {
                value: linear(&root / "value_head", hidden, 1, init, 1.0),
                advantage: linear(&root / "advantage_head", hidden, num_actions, init, 1.0),
            }
        } else {
            Head::Plain(linear(&root / "q_head", hidden, num_actions, init, 1.0))
        };
        let vars = Variables::of(vs);
        let slots = gradient_slots(&encoder, &head, vars.named());
        Ok(Self {
            vars,
            obs_dim,
            num_actions,
            action_mask,
            encoder,
            head,
            slots,
            acting: None,
            epsilon: 0.0,
            rng: Pcg64Mcg::seed_from_u64(0x5eed_0e95_11a7_7e57),
        })
    }

    /// Actions per state.
    pub fn num_actions(&self) -> i64 {
        self.num_actions
    }

    /// The device the network lives on.
    pub fn device(&self) -> tch::Device {
        self.vars.device()
    }

    /// Forgets the weights as cast for acting (`--matmul_precision medium`), for a write to the weights that their
    /// version counters do not see: an optimiser's step through the flat buffer the parameters view.
    pub fn forget_acting_casts(&mut self) {
        self.acting = None;
    }

    /// The exploration rate of [`Policy::act`] when not deterministic.
    pub fn set_epsilon(&mut self, epsilon: f64) {
        self.epsilon = epsilon.clamp(0.0, 1.0);
    }

    /// Q-values `[n, num_actions]` of observations `[n, obs_dim]`, before masking.
    pub fn q_values(&self, obs: &Tensor) -> Tensor {
        self.head_q(&self.encoder.forward(obs))
    }

    /// The head's Q-values of encoded observations `h`.
    fn head_q(&self, h: &Tensor) -> Tensor {
        match &self.head {
            Head::Plain(q) => h.apply(q),
            Head::Dueling { value, advantage } => {
                let a = h.apply(advantage);
                h.apply(value) + &a - a.mean_dim(-1, true, Kind::Float)
            }
        }
    }

    /// Whether [`QNetwork::gradients`] gives this network's gradients (an MLP encoder of ReLU layers over the raw
    /// observation, either head): a learner then needs no autograd for them.
    pub fn differentiable_by_hand(&self) -> bool {
        self.slots.is_some()
    }

    /// The Q-values of `obs` `[B, obs_dim]` as [`QNetwork::q_values`] computes them, outside autograd, with what
    /// [`QNetwork::gradients`] needs; `None` if this network is not [differentiable by
    /// hand](QNetwork::differentiable_by_hand).
    pub fn forward_saved(&self, obs: &Tensor) -> Option<Result<QActivations>> {
        let mlp = self.encoder.plain_mlp().filter(|_| self.slots.is_some())?;
        Some(tch::no_grad(|| {
            let (hidden, saved) = mlp.forward_saved(obs)?;
            Ok(QActivations {
                q: self.head_q(&hidden),
                hidden,
                mlp: saved,
            })
        }))
    }

    /// [`QNetwork::q_values`] of `obs` with the weights as the [`QNetwork::forward_saved`] that kept `saved`
    /// multiplied them (not cast again), outside autograd.
    pub fn q_values_like(&self, saved: &QActivations, obs: &Tensor) -> Result<Tensor> {
        let mlp = self.encoder.plain_mlp().ok_or_else(not_by_hand)?;
        tch::no_grad(|| Ok(self.head_q(&mlp.forward_like(&saved.mlp, obs)?)))
    }

    /// The gradient of every variable (all are trainable), in name order, from `dq`, the
    /// gradient of a loss with respect to the Q-values of the [`QNetwork::forward_saved`] that kept `saved`.
    pub fn gradients(&self, saved: &QActivations, dq: &Tensor) -> Result<Vec<Tensor>> {
        let (Some(slots), Some(mlp)) = (&self.slots, self.encoder.plain_mlp()) else {
            return Err(not_by_hand());
        };
        tch::no_grad(|| {
            let mut grads: Vec<Option<Tensor>> = (0..self.vars.named().len()).map(|_| None).collect();
            let h = &saved.hidden;
            let linear_grads = |dy: &Tensor| -> Result<(Tensor, Tensor)> {
                Ok((dy.f_tr()?.f_mm(h)?, dy.f_sum_dim_intlist(0, false, Kind::Float)?))
            };
            // The head: `q = h W_qᵀ + b_q`, or dueling `q = v + a − mean(a)`, whose gradients are `dv = Σ_a dq`
            // and `da = dq − mean(dq)`.
            let (head_grads, dh) = match &self.head {
                Head::Plain(q) => (vec![linear_grads(dq)?], dq.f_mm(&q.ws)?),
                Head::Dueling { value, advantage } => {
                    let dv = dq.f_sum_dim_intlist(-1, true, Kind::Float)?;
                    let da = dq.f_sub(&dq.f_mean_dim(-1, true, Kind::Float)?)?;
                    let dh = dv.f_mm(&value.ws)?.f_add(&da.f_mm(&advantage.ws)?)?;
                    (vec![linear_grads(&dv)?, linear_grads(&da)?], dh)
                }
            };
            let layer_grads = mlp.backward(&saved.mlp, &dh)?;
            let pairs = layer_grads
                .into_iter()
                .zip(&slots.layers)
                .chain(head_grads.into_iter().map(|(w, b)| (w, Some(b))).zip(&slots.head));
            for ((dw, db), &(w_slot, b_slot)) in pairs {
                grads[w_slot] = Some(dw);
                if let (Some(db), Some(b_slot)) = (db, b_slot) {
                    grads[b_slot] = Some(db);
                }
            }
            grads
                .into_iter()
                .zip(self.vars.named())
                .map(|(g, (name, _))| {
                    g.ok_or_else(|| RlfError::Protocol {
                        component: "learner",
                        message: format!("no hand-written gradient for `{name}`"),
                    })
                })
                .collect()
        })
    }

    /// `q` with the actions each observation's mask forbids set very low (unchanged without a mask).
    pub fn masked(&self, obs: &Tensor, q: &Tensor) -> Tensor {
        match self.action_mask {
            Some((at, len)) => q.masked_fill(&obs.narrow(-1, at, len).le(0.0), MASKED_Q),
            None => q.shallow_clone(),
        }
    }

    /// A `[n, obs_dim]` tensor on the network's device from flat observations.
    pub fn obs_tensor(&self, obs: &[f32]) -> Result<Tensor> {
        rows_tensor(obs, self.obs_dim, self.device())
    }

    /// Copies every variable of `other` (a network of the same architecture) into this one, or moves each
    /// `tau` of the way towards it (Polyak averaging; 1 copies).
    pub fn follow(&mut self, other: &QNetwork, tau: f64) -> Result<()> {
        self.vars.follow(&other.vars, tau)
    }
}

/// The error of asking a Q-network that is not [differentiable by hand](QNetwork::differentiable_by_hand) for what
/// only one that is has.
fn not_by_hand() -> RlfError {
    RlfError::Protocol {
        component: "learner",
        message:
            "this Q-network's gradients are not written by hand (its encoder is not an MLP of ReLU layers)"
                .into(),
    }
}

/// Where the gradients of an MLP encoder of ReLU layers over the raw observation and of the head go among `named`
/// (each layer's tensors found by identity); `None` for other encoders, or if a tensor of `named` would get none.
fn gradient_slots(encoder: &Encoder, head: &Head, named: &[(String, Tensor)]) -> Option<GradientSlots> {
    let mlp = encoder.plain_mlp().filter(|m| m.differentiable_by_hand())?;
    let slot = |t: &Tensor| named.iter().position(|(_, v)| v.is_set_to(t));
    let of = |layer: &nn::Linear| -> Option<(usize, Option<usize>)> {
        let bias = match &layer.bs {
            Some(b) => Some(slot(b)?),
            None => None,
        };
        Some((slot(&layer.ws)?, bias))
    };
    let layers = mlp.parameters().map(of).collect::<Option<Vec<_>>>()?;
    let head = match head {
        Head::Plain(q) => vec![of(q)?],
        Head::Dueling { value, advantage } => vec![of(value)?, of(advantage)?],
    };
    let mut covered = vec![false; named.len()];
    for &(w, b) in layers.iter().chain(&head) {
        covered[w] = true;
        if let Some(b) = b {
            covered[b] = true;
        }
    }
    covered
        .iter()
        .all(|&c| c)
        .then_some(GradientSlots { layers, head })
}

impl QNetwork {
    /// ε-greedy actions for `obs` (greedy when `deterministic`), with εz-greedy's repeated exploratory actions
    /// when `holds` has one per observation (see [`Policy::act_holding`]; empty: none).
    fn choose(
        &mut self,
        obs: &[f32],
        deterministic: bool,
        holds: &mut [Hold],
        durations: Option<&Durations>,
    ) -> Result<ActOutput> {
        let obs = self.obs_tensor(obs)?;
        let q = tch::no_grad(|| {
            let hidden = match self.encoder.plain_mlp() {
                Some(mlp) => mlp.forward_acting(&obs, &mut self.acting)?,
                None => self.encoder.forward(&obs),
            };
            let q = self.head_q(&hidden);
            to_vec(&self.masked(&obs, &q))
        })?;
        let a = self.num_actions as usize;
        let eps = if deterministic { 0.0 } else { self.epsilon };
        let n = q.len() / a.max(1);
        let mut out = ActOutput {
            actions: Vec::with_capacity(n),
            log_probs: Vec::with_capacity(n),
            values: Vec::with_capacity(n),
        };
        // ε-greedy on the host: one forward pass, then a few comparisons per row.
        for (i, row) in q.chunks_exact(a).enumerate() {
            let (greedy, best) = row
                .iter()
                .copied()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |m, (i, v)| if v > m.1 { (i, v) } else { m },
                );
            let legal = |v: &f32| f64::from(*v) > MASKED_Q / 2.0;
            let mut hold = holds.get_mut(i).filter(|_| eps > 0.0);
            // An exploratory action still held (and still legal) is repeated, with probability 1.
            if let Some(h) = hold.as_deref_mut() {
                let action = h.action as usize;
                if h.steps > 0 && row.get(action).is_some_and(legal) {
                    h.steps -= 1;
                    out.actions.push(action as f32);
                    out.log_probs.push(0.0);
                    out.values.push(best);
                    continue;
                }
                h.steps = 0;
            }
            let count = row.iter().filter(|v| legal(v)).count().max(1);
            let action = if eps > 0.0 && self.rng.random::<f64>() < eps {
                let k = self.rng.random_range(0..count);
                let action = row
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| legal(v))
                    .nth(k)
                    .map_or(greedy, |(i, _)| i);
                if let (Some(h), Some(d)) = (hold, durations) {
                    let duration = d.at(self.rng.random::<f64>());
                    *h = Hold {
                        action: action as u32,
                        steps: duration as u32 - 1,
                    };
                }
                action
            } else {
                greedy
            };
            // Under ε-greedy the greedy action has probability 1 − ε + ε/k, any other legal one ε/k.
            let prob = eps / count as f64 + if action == greedy { 1.0 - eps } else { 0.0 };
            out.actions.push(action as f32);
            out.log_probs.push(prob.ln() as f32);
            out.values.push(best);
        }
        Ok(out)
    }
}

impl Policy for QNetwork {
    fn act(&mut self, obs: &[f32], deterministic: bool) -> Result<ActOutput> {
        self.choose(obs, deterministic, &mut [], None)
    }

    fn act_holding(&mut self, obs: &[f32], holds: &mut [Hold], durations: &Durations) -> Result<ActOutput> {
        self.choose(obs, false, holds, Some(durations))
    }

    /// The ε-greedy generator.
    fn sampler_state(&self) -> Option<Vec<u8>> {
        postcard::to_stdvec(&self.rng).ok()
    }

    fn load_sampler_state(&mut self, state: &[u8]) -> Result<()> {
        self.rng = postcard::from_bytes(state)
            .map_err(|e| RlfError::Config(format!("a Q-network's kept generator does not decode: {e}")))?;
        Ok(())
    }

    fn obs_dim(&self) -> usize {
        self.obs_dim as usize
    }

    fn action_dim(&self) -> usize {
        1
    }

    fn variables(&self) -> &Variables {
        &self.vars
    }

    fn variables_mut(&mut self) -> &mut Variables {
        &mut self.vars
    }

    fn set_exploration(&mut self, epsilon: f64) {
        self.set_epsilon(epsilon);
    }
}

#[cfg(test)]
mod tests {
    use rlf_env::{BoxSpace, Space};

    use super::*;
    use crate::config::Config;
    use crate::model::ACTION_MASK_KEY;

    fn unit_box(size: usize) -> Space {
        Space::Box(BoxSpace::uniform(0.0, 1.0, vec![size]).expect("box"))
    }

    /// Under `--matmul_precision medium` an actor's few rows multiply in bfloat16 with the weights cast once, and
    /// cast again after every change of the weights: a load of published weights, a write in place (a learner's
    /// steps, which write Adam's flat buffer instead, are `dqn::tests::acting_after_training_sees_the_new_weights`).
    #[test]
    fn acting_in_bfloat16_recasts_the_weights_after_every_change() {
        let overrides = [
            "nonlinearity = 'relu'",
            "encoder_mlp_layers = '16,8'",
            "matmul_precision = 'medium'",
        ];
        let cfg = Config::for_env("CartPole-v1", &overrides).expect("config").model;
        let net = |seed: i64| {
            tch::manual_seed(seed);
            QNetwork::new(&unit_box(6), &Space::discrete(3), &cfg, true, DeviceKind::Cpu).expect("network")
        };
        let (mut a, mut b) = (net(1), net(2));
        let obs: Vec<f32> = (0..10 * 6).map(|i| ((i * 31) % 11) as f32 / 11.0).collect();
        let values = |q: &mut QNetwork| q.act(&obs, true).expect("act").values;
        let (va, vb) = (values(&mut a), values(&mut b));
        assert_ne!(va, vb);
        // The bfloat16 products, not float32's.
        let x = a.obs_tensor(&obs).expect("obs");
        let float32 = Vec::<f32>::try_from(a.q_values(&x).amax(-1, false)).expect("values");
        assert_ne!(va, float32);
        assert_eq!(values(&mut a), va);

        a.load_weights(&b.weights().expect("weights")).expect("load");
        assert_eq!(values(&mut a), vb);

        tch::no_grad(|| {
            for (_, mut t) in a.variables().trainable() {
                let _ = t.f_mul_scalar_(0.5).expect("step");
            }
        });
        let mut c = net(3);
        c.load_weights(&a.weights().expect("weights")).expect("load");
        let vc = values(&mut c);
        assert_ne!(vc, vb);
        assert_eq!(values(&mut a), vc);
    }

    /// The hand-written gradients equal autograd's, for both heads, one and two ReLU layers, float32 and bfloat16
    /// products, and the Q-values of `forward_saved` those of `q_values`; other encoders are left to autograd.
    #[test]
    fn gradients_by_hand_match_autograd() {
        let obs: Vec<f32> = (0..96 * 6)
            .map(|i| ((i * 7919) % 13) as f32 / 13.0 - 0.3)
            .collect();
        for (dueling, layers, precision) in [
            (true, "16,8", "highest"),
            (false, "16,8", "highest"),
            (true, "12", "highest"),
            (true, "16,8", "medium"),
            (false, "16,8", "medium"),
        ] {
            tch::manual_seed(3);
            let overrides = [
                "nonlinearity = 'relu'".to_owned(),
                format!("encoder_mlp_layers = '{layers}'"),
                format!("matmul_precision = '{precision}'"),
            ];
            let overrides: Vec<&str> = overrides.iter().map(String::as_str).collect();
            let cfg = Config::for_env("CartPole-v1", &overrides).expect("config").model;
            let actions = Space::Discrete { n: 3, start: 0 };
            let q = QNetwork::new(&unit_box(6), &actions, &cfg, dueling, DeviceKind::Cpu).expect("network");
            assert!(q.differentiable_by_hand());
            let x = q.obs_tensor(&obs).expect("tensor");
            // A loss that weighs every Q-value differently.
            let weights = Tensor::arange(96 * 3, (Kind::Float, tch::Device::Cpu))
                .view([96, 3])
                .sin();
            let params = q.variables().trainable();
            for (_, p) in &params {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            (q.q_values(&x) * &weights).sum(Kind::Float).backward();
            let saved = q.forward_saved(&x).expect("by hand").expect("forward");
            let same_q = f64::try_from((saved.q() - q.q_values(&x)).abs().max()).expect("max");
            assert!(
                same_q == 0.0,
                "{dueling} {layers} {precision}: Q-values differ by {same_q}"
            );
            let other = q
                .obs_tensor(&obs.iter().map(|v| 0.5 - v).collect::<Vec<_>>())
                .expect("tensor");
            let like = f64::try_from(
                (q.q_values_like(&saved, &other).expect("like") - q.q_values(&other))
                    .abs()
                    .max(),
            );
            assert!(
                like.expect("max") == 0.0,
                "{dueling} {layers} {precision}: q_values_like differs"
            );
            let ours = q.gradients(&saved, &weights).expect("gradients");
            for ((name, p), g) in params.iter().zip(&ours) {
                // With bfloat16 products autograd sums the biases' gradients in bfloat16, rounding each of the 96
                // terms, where these are summed in float32; a wrong formula is off by far more.
                let tolerance = match precision {
                    "medium" if name.ends_with("bias") => 5e-2,
                    "medium" => 1e-2,
                    _ => 1e-5,
                };
                let want = p.grad();
                let scale = f64::try_from(want.abs().max()).expect("max").max(1e-3);
                let diff = f64::try_from((g - &want).abs().max()).expect("max");
                assert!(
                    diff <= tolerance * scale,
                    "{dueling} {layers} {precision}: `{name}` differs by {diff} (largest {scale})"
                );
            }
        }
        let cfg = Config::for_env("CartPole-v1", &["nonlinearity = 'tanh'"])
            .expect("config")
            .model;
        let actions = Space::Discrete { n: 3, start: 0 };
        let tanh = QNetwork::new(&unit_box(6), &actions, &cfg, true, DeviceKind::Cpu).expect("network");
        assert!(!tanh.differentiable_by_hand());
        assert!(tanh
            .forward_saved(&tanh.obs_tensor(&obs).expect("tensor"))
            .is_none());
    }

    /// The dueling head's advantages have mean zero per state, so `mean_a Q = V`; masked actions are never
    /// chosen, greedily or at random; a target network follows by copy and by Polyak averaging.
    #[test]
    fn dueling_masks_and_following() {
        tch::manual_seed(0);
        let cfg = Config::for_env("CartPole-v1", &[]).expect("config").model;
        let obs_space = Space::Dict(vec![
            (ACTION_MASK_KEY.to_owned(), unit_box(3)),
            ("observation".to_owned(), unit_box(4)),
        ]);
        let actions = Space::Discrete { n: 3, start: 0 };
        let mut q = QNetwork::new(&obs_space, &actions, &cfg, true, DeviceKind::Cpu).expect("network");
        let mut obs = Vec::new();
        for i in 0..64 {
            // Action 1 is forbidden everywhere, action 2 in odd rows.
            obs.extend([1.0, 0.0, if i % 2 == 0 { 1.0 } else { 0.0 }]);
            obs.extend((0..4).map(|j| ((i * 7 + j) % 5) as f32 / 5.0));
        }
        let t = q.obs_tensor(&obs).expect("tensor");
        let Head::Dueling { value, .. } = &q.head else {
            panic!("a dueling head")
        };
        let v = q.encoder.forward(&t).apply(value).squeeze_dim(-1);
        let mean_q = q.q_values(&t).mean_dim(-1, false, Kind::Float);
        assert!(f64::try_from((v - mean_q).abs().max()).expect("max") < 1e-5);
        q.set_epsilon(1.0);
        for deterministic in [false, true] {
            let out = q.act(&obs, deterministic).expect("act");
            for (i, &a) in out.actions.iter().enumerate() {
                assert!(a == 0.0 || (a == 2.0 && i % 2 == 0), "row {i}: action {a}");
            }
        }
        let other = QNetwork::new(&obs_space, &actions, &cfg, true, DeviceKind::Cpu).expect("network");
        let mut target = QNetwork::new(&obs_space, &actions, &cfg, true, DeviceKind::Cpu).expect("network");
        let before = target.weights().expect("weights").values;
        target.follow(&other, 0.25).expect("polyak");
        let (now, theirs) = (
            target.weights().expect("w").values,
            other.weights().expect("w").values,
        );
        for ((b, n), o) in before.iter().zip(&now).zip(&theirs) {
            assert!((n - (0.75 * b + 0.25 * o)).abs() < 1e-5);
        }
        target.follow(&other, 1.0).expect("copy");
        assert_eq!(target.weights().expect("w").values, theirs);
    }

    /// εz-greedy: with ε = 1 every action explores; each exploratory action is repeated for the duration drawn
    /// with it (and the log-probability of a repeat is 0), then a new one is drawn; the durations follow the zeta
    /// distribution of exponent 2 (`P(1) = 0.608`, `P(2) = 0.152` with the cap). Greedy acting ignores holds.
    #[test]
    fn exploratory_actions_are_held_for_zeta_durations() {
        tch::manual_seed(0);
        let cfg = Config::for_env("CartPole-v1", &[]).expect("config").model;
        let actions = Space::Discrete { n: 5, start: 0 };
        let mut q = QNetwork::new(&unit_box(4), &actions, &cfg, false, DeviceKind::Cpu).expect("network");
        q.set_epsilon(1.0);
        let d = Durations::zeta(2.0);
        assert_eq!((d.at(0.0), d.at(0.6)), (1, 1));
        assert_eq!(d.at(0.7), 2);
        assert!(d.at(1.0 - 1e-12) <= Durations::MAX);
        let obs = [0.5f32; 8];
        let mut holds = [Hold::default(); 2];
        let mut drawn = Vec::new();
        for _ in 0..20_000 {
            let before = holds;
            let out = q.act_holding(&obs, &mut holds, &d).expect("act");
            for (i, (b, h)) in before.iter().zip(&holds).enumerate() {
                let a = out.actions[i] as u32;
                if b.steps > 0 {
                    assert_eq!((a, h.steps, out.log_probs[i]), (b.action, b.steps - 1, 0.0));
                } else {
                    assert_eq!(h.action, a);
                    drawn.push(h.steps + 1);
                }
            }
        }
        let share = |n: u32| drawn.iter().filter(|&&k| k == n).count() as f64 / drawn.len() as f64;
        assert!((share(1) - 0.608).abs() < 0.02, "P(1) = {}", share(1));
        assert!((share(2) - 0.152).abs() < 0.015, "P(2) = {}", share(2));
        assert!(drawn.iter().any(|&k| k > 20), "a heavy tail");
        let greedy = q.act(&obs[..4], true).expect("greedy").actions[0];
        holds[0] = Hold {
            action: (greedy as u32 + 1) % 5,
            steps: 5,
        };
        q.set_epsilon(0.0);
        let out = q.act_holding(&obs[..4], &mut holds[..1], &d).expect("act");
        assert_eq!(out.actions[0], greedy, "no exploration, no hold");
    }
}
