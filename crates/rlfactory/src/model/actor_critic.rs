//! The actor-critic: an [`Encoder`] of the observation, an optional recurrent core, the action head and the value
//! head, shared or separate, with running normalisation of observations and returns.

use rlf_env::Space;
use tch::{nn, Kind, Tensor};

use super::dense::{DenseActorCritic, DenseHead, DenseLayer, DenseMlp, HAND_WRITTEN_MAX_WIDTH};
use super::dense_acting::{Acting, DenseActing};
use super::encoder::{linear, Encoder};
use super::recurrent::Core;
use super::weights::{rows_tensor, to_vec, Variables};
use super::{ActOutput, Distribution, Draws, Policy, RunningMeanStd};
use crate::config::{DeviceKind, ModelConfig};
use crate::error::{Result, RlfError};

/// Observations are clipped to this many standard deviations after normalisation.
const OBS_CLIP: f64 = 10.0;

/// The logit given to an action its mask forbids: its probability is exactly 0 in float32 (and
/// `0 · log 0` terms of the entropy are 0, not NaN, as with `-inf`).
pub(crate) const MASKED_LOGIT: f64 = -1e9;

/// The key of a Dict observation that masks a discrete action head (PettingZoo's convention).
pub const ACTION_MASK_KEY: &str = "action_mask";

/// Where the `action_mask` of a Dict observation lies in the flat observation, if there is one:
/// `(offset, length)`; it must have one value per action of a `Discrete` action space.
pub(super) fn action_mask_range(observation_space: &Space, head: &ActionHead) -> Result<Option<(i64, i64)>> {
    let Space::Dict(parts) = observation_space else {
        return Ok(None);
    };
    let mut offset = 0;
    for (key, part) in parts {
        let len = part.flat_dim() as i64;
        if key == ACTION_MASK_KEY {
            return match head {
                ActionHead::Categorical { n } if *n == len => Ok(Some((offset, len))),
                _ => Err(RlfError::UnsupportedSpace(format!(
                    "observation space {observation_space}: an {ACTION_MASK_KEY} of {len} values needs a \
                     Discrete({len}) action space, not {head:?}"
                ))),
            };
        }
        offset += len;
    }
    Ok(None)
}

/// The action head, chosen from the action space.
#[derive(Debug, Clone, PartialEq)]
pub enum ActionHead {
    /// `Discrete(n)`: a categorical over `n` values.
    Categorical {
        /// Number of values.
        n: i64,
    },
    /// `MultiDiscrete(nvec)`: one categorical per component.
    MultiCategorical {
        /// Values per component.
        sizes: Vec<i64>,
    },
    /// `Box` of `dim` values: a diagonal Gaussian.
    Gaussian {
        /// Action dimensions.
        dim: i64,
        /// The standard deviation is an output of the network (true) or one learned parameter
        /// per dimension (false).
        adaptive_std: bool,
    },
}

impl ActionHead {
    /// The head for `space`, or an error for spaces no head supports.
    pub fn for_space(space: &Space, adaptive_std: bool) -> Result<Self> {
        let to_i64 = |n: u64| {
            i64::try_from(n).map_err(|_| RlfError::UnsupportedSpace(format!("{space}: too many actions")))
        };
        match space {
            Space::Discrete { n, .. } => Ok(ActionHead::Categorical { n: to_i64(*n)? }),
            Space::MultiDiscrete(nvec) => Ok(ActionHead::MultiCategorical {
                sizes: nvec.iter().map(|&n| to_i64(n)).collect::<Result<_>>()?,
            }),
            Space::Box(b) => Ok(ActionHead::Gaussian {
                dim: b.size() as i64,
                adaptive_std,
            }),
            Space::Dict(_) | Space::Tuple(_) => Err(RlfError::UnsupportedSpace(format!(
                "action space {space}: only Discrete, MultiDiscrete and Box actions are supported"
            ))),
        }
    }

    /// Numbers per raw action.
    pub fn action_dim(&self) -> usize {
        match self {
            ActionHead::Categorical { .. } => 1,
            ActionHead::MultiCategorical { sizes } => sizes.len(),
            ActionHead::Gaussian { dim, .. } => *dim as usize,
        }
    }

    fn outputs(&self) -> i64 {
        match self {
            ActionHead::Categorical { n } => *n,
            ActionHead::MultiCategorical { sizes } => sizes.iter().sum(),
            ActionHead::Gaussian { dim, adaptive_std } => {
                if *adaptive_std {
                    2 * dim
                } else {
                    *dim
                }
            }
        }
    }
}

/// An actor-critic network for an observation and an action space.
pub struct ActorCritic {
    vars: Variables,
    head: ActionHead,
    obs_dim: i64,
    /// `(offset, length)` of the action mask in the flat observation.
    action_mask: Option<(i64, i64)>,
    actor: Encoder,
    critic: Option<Encoder>,
    /// With `--use_rnn`: the actor's recurrent core, and the critic's without shared weights.
    actor_core: Option<Core>,
    critic_core: Option<Core>,
    action_out: nn::Linear,
    value_out: nn::Linear,
    log_std: Option<Tensor>,
    log_std_offset: f64,
    obs_rms: Option<RunningMeanStd>,
    ret_rms: Option<RunningMeanStd>,
    /// The action draws ([`Draws`]).
    draws: Draws,
    /// The temperature its actions are sampled at ([`Policy::set_temperature`]).
    temperature: f64,
    /// Its acting pass written out ([`DenseActing`]), for a network [`dense`](Self::dense) covers whose layers are
    /// at most [`HAND_WRITTEN_MAX_WIDTH`] wide; `None` acts through libtorch.
    acting: Option<DenseActing>,
}

impl std::fmt::Debug for ActorCritic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorCritic")
            .field("obs_dim", &self.obs_dim)
            .field("head", &self.head)
            .field("variables", &self.vars)
            .finish_non_exhaustive()
    }
}

impl ActorCritic {
    /// Builds the network for the spaces. Random initialisation draws from libtorch's generator
    /// (seed it with [`seed`](crate::model::ActorCritic::seed)).
    pub fn new(
        observation_space: &Space,
        action_space: &Space,
        cfg: &ModelConfig,
        device: DeviceKind,
    ) -> Result<Self> {
        let head = ActionHead::for_space(action_space, cfg.adaptive_stddev)?;
        let action_mask = action_mask_range(observation_space, &head)?;
        let obs_dim = observation_space.flat_dim() as i64;
        if obs_dim == 0 {
            return Err(RlfError::UnsupportedSpace(format!(
                "observation space {observation_space} is empty"
            )));
        }
        let device = match device {
            DeviceKind::Cpu => tch::Device::Cpu,
            DeviceKind::Gpu => tch::Device::Cuda(0),
        };
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let (actor, mut hidden) = Encoder::new(&(&root / "actor_encoder"), observation_space, obs_dim, cfg)?;
        let critic = if cfg.actor_critic_share_weights {
            None
        } else {
            Some(Encoder::new(&(&root / "critic_encoder"), observation_space, obs_dim, cfg)?.0)
        };
        let (mut actor_core, mut critic_core) = (None, None);
        if cfg.use_rnn {
            let (core, size) = Core::new(&(&root / "actor_core"), hidden, cfg);
            actor_core = Some(core);
            if critic.is_some() {
                critic_core = Some(Core::new(&(&root / "critic_core"), hidden, cfg).0);
            }
            hidden = size;
        }
        let action_out = linear(
            &root / "action_head",
            hidden,
            head.outputs(),
            cfg.policy_initialization,
            0.01,
        );
        let value_out = linear(&root / "value_head", hidden, 1, cfg.policy_initialization, 1.0);
        let log_std_offset = cfg.initial_stddev.ln();
        let log_std = match head {
            ActionHead::Gaussian {
                dim,
                adaptive_std: false,
            } => Some(root.var("log_std", &[dim], nn::Init::Const(log_std_offset))),
            _ => None,
        };
        let obs_rms = cfg
            .normalize_input
            .then(|| RunningMeanStd::new(&(&root / "obs_normalizer"), obs_dim));
        let ret_rms = cfg
            .normalize_returns
            .then(|| RunningMeanStd::new(&(&root / "returns_normalizer"), 1));
        let mut network = Self {
            vars: Variables::of(vs),
            head,
            obs_dim,
            action_mask,
            actor,
            critic,
            actor_core,
            critic_core,
            action_out,
            value_out,
            log_std,
            log_std_offset,
            obs_rms,
            ret_rms,
            draws: Draws::from_torch(),
            temperature: 1.0,
            acting: None,
        };
        network.acting = network.dense_acting();
        Ok(network)
    }

    /// The acting pass written out, when [`dense`](Self::dense) covers every trainable variable with layers at most
    /// [`HAND_WRITTEN_MAX_WIDTH`] wide and the normalisers' statistics are found among the variables.
    fn dense_acting(&self) -> Option<DenseActing> {
        let vars = &self.vars;
        let trainable: usize = vars.trainable().iter().map(|(_, t)| t.numel()).sum();
        let net = self
            .dense(|t| vars.offset_of(t))
            .filter(|net| net.len() == trainable && net.widest_layer() <= HAND_WRITTEN_MAX_WIDTH)?;
        let stats = |rms: &RunningMeanStd| Some((vars.offset_of(rms.mean())?, vars.offset_of(rms.var())?));
        let obs_rms = match &self.obs_rms {
            Some(rms) => {
                let (mean, var) = stats(rms)?;
                Some((mean, var, OBS_CLIP as f32))
            }
            None => None,
        };
        let ret_rms = match &self.ret_rms {
            Some(rms) => Some(stats(rms)?),
            None => None,
        };
        Some(DenseActing::new(
            net,
            usize::try_from(self.obs_dim).ok()?,
            obs_rms,
            ret_rms,
        ))
    }

    /// Seeds libtorch's random generator of this process (initialisation and action sampling).
    pub fn seed(seed: u64) {
        tch::manual_seed(seed as i64);
    }

    /// The action head.
    pub fn head(&self) -> &ActionHead {
        &self.head
    }

    /// The device the parameters live on.
    pub fn device(&self) -> tch::Device {
        self.vars.device()
    }

    /// Values of recurrent state per observation (0 without `--use_rnn`): the actor core's, then
    /// the critic core's.
    pub fn state_dim(&self) -> i64 {
        [&self.actor_core, &self.critic_core]
            .iter()
            .filter_map(|c| c.as_ref().map(Core::state_dim))
            .sum()
    }

    /// The action distribution and the *normalised* value (see [`value_scale`](Self::unscale_value))
    /// for a batch of observations `[n, obs_dim]`. With an `action_mask` in a Dict observation,
    /// the actions it marks 0 have probability 0 (never sampled, no part of the entropy); a row
    /// whose mask is all 0 (an agent that does not act) gets a uniform distribution. A recurrent
    /// network starts from zero states here (an episode's first step; see
    /// [`forward_step`](Self::forward_step) and [`forward_sequences`](Self::forward_sequences)).
    pub fn forward(&self, obs: &Tensor) -> (Distribution, Tensor) {
        let (dist, value, _) = self.forward_step(obs, None);
        (dist, value)
    }

    /// As [`forward`](Self::forward), from recurrent states `[n, state_dim]` (zeros when `None`;
    /// ignored without a core), and the states after the step.
    pub fn forward_step(
        &self,
        obs: &Tensor,
        states: Option<&Tensor>,
    ) -> (Distribution, Tensor, Option<Tensor>) {
        let (actor_h, critic_h) = self.encode(obs);
        if self.actor_core.is_none() {
            let (dist, value) = self.heads(obs, &actor_h, &critic_h);
            return (dist, value, None);
        }
        let zeros;
        let states = match states {
            Some(s) => s,
            None => {
                zeros = Tensor::zeros([obs.size()[0], self.state_dim()], (Kind::Float, self.device()));
                &zeros
            }
        };
        let (actor_h, critic_h, next) = self.core_step(&actor_h, &critic_h, states);
        let (dist, value) = self.heads(obs, &actor_h, &critic_h);
        (dist, value, Some(next))
    }

    /// The distribution and normalised value of every step of `c` sequences of `len` steps each,
    /// rows sequence-major (`obs` `[c * len, obs_dim]`, row `q * len + j` step `j` of sequence `q`),
    /// unrolled through the recurrent core from `states` `[c, state_dim]`, as acting did: a step its
    /// agent did not act in (`acted`, `[c * len]`, 0: a waiting or finished agent of a multi-agent
    /// env) leaves the state as it was, and a step whose `ends` (`[c * len]`, 1 where the step ended
    /// its episode) is set passes a zero state to the next. Also the states after each step before
    /// that reset, `[c * len, state_dim]`. Without a core: as [`forward`](Self::forward), and no
    /// states.
    pub fn forward_sequences(
        &self,
        obs: &Tensor,
        states: &Tensor,
        ends: &Tensor,
        acted: &Tensor,
        len: i64,
    ) -> (Distribution, Tensor, Option<Tensor>) {
        let (actor_h, critic_h) = self.encode(obs);
        if self.actor_core.is_none() {
            let (dist, value) = self.heads(obs, &actor_h, &critic_h);
            return (dist, value, None);
        }
        let c = obs.size()[0] / len;
        let by_step = |h: &Tensor| h.reshape([c, len, -1]);
        let (actor_in, critic_in) = (by_step(&actor_h), by_step(&critic_h));
        let keep = (ends.reshape([c, len, 1]) * -1.0 + 1.0).to_kind(Kind::Float);
        let acted = acted.reshape([c, len, 1]).to_kind(Kind::Float);
        let mut state = states.shallow_clone();
        let (mut actor_out, mut critic_out, mut after) = (Vec::new(), Vec::new(), Vec::new());
        for j in 0..len {
            let (a, v, next) = self.core_step(&actor_in.select(1, j), &critic_in.select(1, j), &state);
            let a_j = acted.select(1, j);
            let next = &next * &a_j + &state * (a_j * -1.0 + 1.0);
            state = &next * keep.select(1, j);
            actor_out.push(a);
            critic_out.push(v);
            after.push(next);
        }
        let rows = |parts: &[Tensor]| Tensor::stack(parts, 1).reshape([c * len, -1]);
        let (dist, value) = self.heads(obs, &rows(&actor_out), &rows(&critic_out));
        (dist, value, Some(rows(&after)))
    }

    /// The observations as the encoders read them: normalised with `--normalize_input`, else as they are.
    pub fn normalized_obs(&self, obs: &Tensor) -> Tensor {
        match &self.obs_rms {
            Some(rms) => rms.normalize(obs, OBS_CLIP),
            None => obs.shallow_clone(),
        }
    }

    /// `obs` `[n, obs_dim]` laid out once as the encoders read them, for a learner's epochs over a dataset: an
    /// observation that is one image, stored as bytes or channels-first, becomes `[n, H, W, C]` channels-last in
    /// the kind the convolutions multiply in (each minibatch's forward converted its rows again: about a tenth of
    /// a Pong learner's CPU with four epochs, docs/benchmarks.md). [`forward`](Self::forward),
    /// [`forward_sequences`](Self::forward_sequences) and their rows (`index_select(0, ..)`) take it as they take
    /// `obs`, to the same result. Any other observation comes back as it is. A copy is made in `buffer`'s memory
    /// when it has the size (the caller keeps it for the next dataset: a Pong dataset's 58-115 MB, allocated
    /// afresh, would be mapped and faulted in page by page each time); the result shares that memory, so it must be
    /// dropped before `buffer` is used again.
    pub fn staged_obs(&self, obs: &Tensor, buffer: &mut Option<Tensor>) -> Tensor {
        let layout = self.actor.image_layout();
        let same = self.critic.as_ref().is_none_or(|c| c.image_layout() == layout);
        match layout {
            Some(layout) if same && self.obs_rms.is_none() && self.action_mask.is_none() => {
                layout.lay_out_into(obs, buffer)
            }
            _ => obs.shallow_clone(),
        }
    }

    /// This network's layers where `offset_of` finds them in a flat buffer of the parameters, when the
    /// hand-written learner covers it ([`DenseActorCritic`]): float32 MLP encoders over the whole observation, no
    /// recurrent core, one categorical action (masked or not) or a Gaussian of state-independent standard
    /// deviations, on the CPU. `None` for any other network.
    pub fn dense(&self, offset_of: impl Fn(&Tensor) -> Option<usize>) -> Option<DenseActorCritic> {
        if self.actor_core.is_some() || self.device() != tch::Device::Cpu {
            return None;
        }
        let head = match self.head {
            ActionHead::Categorical { .. } => DenseHead::Categorical {
                mask: match self.action_mask {
                    Some((offset, len)) => Some((usize::try_from(offset).ok()?, usize::try_from(len).ok()?)),
                    None => None,
                },
            },
            ActionHead::Gaussian {
                adaptive_std: false, ..
            } => DenseHead::Gaussian {
                log_std: offset_of(self.log_std.as_ref()?)?,
            },
            _ => return None,
        };
        let layer = |l: &nn::Linear| -> Option<DenseLayer> {
            let size = l.ws.size();
            Some(DenseLayer {
                weight: offset_of(&l.ws)?,
                bias: offset_of(l.bs.as_ref()?)?,
                outputs: usize::try_from(*size.first()?).ok()?,
                inputs: usize::try_from(*size.get(1)?).ok()?,
            })
        };
        let mlp = |encoder: &Encoder| -> Option<DenseMlp> {
            let mlp = encoder.plain_mlp().filter(|m| m.in_float32())?;
            Some(DenseMlp {
                layers: mlp.parameters().map(layer).collect::<Option<_>>()?,
                nonlinearity: mlp.nonlinearity(),
            })
        };
        Some(DenseActorCritic {
            actor: mlp(&self.actor)?,
            critic: match &self.critic {
                Some(critic) => Some(mlp(critic)?),
                None => None,
            },
            action_out: layer(&self.action_out)?,
            head,
            value_out: layer(&self.value_out)?,
        })
    }

    /// The encoders' outputs (the critic's is the actor's with shared weights).
    fn encode(&self, obs: &Tensor) -> (Tensor, Tensor) {
        let x = self.normalized_obs(obs);
        let actor_h = self.actor.forward(&x);
        let critic_h = match &self.critic {
            Some(critic) => critic.forward(&x),
            None => actor_h.shallow_clone(),
        };
        (actor_h, critic_h)
    }

    /// One step of the recurrent cores from `states` (the actor's, then the critic's).
    fn core_step(&self, actor_h: &Tensor, critic_h: &Tensor, states: &Tensor) -> (Tensor, Tensor, Tensor) {
        let (Some(actor), critic) = (&self.actor_core, &self.critic_core) else {
            return (
                actor_h.shallow_clone(),
                critic_h.shallow_clone(),
                states.shallow_clone(),
            );
        };
        match critic {
            None => {
                let (out, next) = actor.step(actor_h, states);
                (out.shallow_clone(), out, next)
            }
            Some(critic) => {
                let d = actor.state_dim();
                let (a, next_a) = actor.step(actor_h, &states.narrow(1, 0, d));
                let (v, next_v) = critic.step(critic_h, &states.narrow(1, d, critic.state_dim()));
                (a, v, Tensor::cat(&[next_a, next_v], 1))
            }
        }
    }

    /// The action distribution and the normalised value from the heads' inputs.
    fn heads(&self, obs: &Tensor, actor_h: &Tensor, critic_h: &Tensor) -> (Distribution, Tensor) {
        let value = critic_h.apply(&self.value_out).squeeze_dim(-1);
        let out = actor_h.apply(&self.action_out);
        let dist = match &self.head {
            ActionHead::Categorical { .. } => match self.action_mask {
                Some((offset, len)) => {
                    let forbidden = obs.narrow(-1, offset, len).le(0.5);
                    Distribution::categorical(&out.masked_fill(&forbidden, MASKED_LOGIT))
                }
                None => Distribution::categorical(&out),
            },
            ActionHead::MultiCategorical { sizes } => Distribution::multi_categorical(&out, sizes),
            ActionHead::Gaussian {
                dim,
                adaptive_std: true,
            } => {
                let parts = out.split(*dim, -1);
                Distribution::Gaussian {
                    mean: parts[0].shallow_clone(),
                    log_std: &parts[1] + self.log_std_offset,
                }
            }
            ActionHead::Gaussian { .. } => {
                let log_std = match &self.log_std {
                    Some(l) => l.expand_as(&out),
                    None => out.zeros_like(),
                };
                Distribution::Gaussian { mean: out, log_std }
            }
        };
        (dist, value)
    }

    /// Values in return units from normalised ones (the identity without return normalisation).
    pub fn unscale_value(&self, v: &Tensor) -> Tensor {
        match &self.ret_rms {
            Some(rms) => rms.unscale(&v.unsqueeze(-1)).squeeze_dim(-1),
            None => v.shallow_clone(),
        }
    }

    /// Returns in normalised units (the identity without return normalisation).
    pub fn scale_value(&self, v: &Tensor) -> Tensor {
        match &self.ret_rms {
            Some(rms) => rms.scale(&v.unsqueeze(-1)).squeeze_dim(-1),
            None => v.shallow_clone(),
        }
    }

    /// The ratio between normalised and return units of values (1 without return normalisation).
    pub fn value_unit(&self) -> f64 {
        match &self.ret_rms {
            Some(rms) => {
                tch::no_grad(|| f64::try_from((rms.var() + 1e-5).sqrt().mean(Kind::Float)).unwrap_or(1.0))
            }
            None => 1.0,
        }
    }

    /// Values (in return units, no gradient) of a batch of observations.
    pub fn values(&self, obs: &Tensor) -> Tensor {
        tch::no_grad(|| self.unscale_value(&self.forward(obs).1))
    }

    /// Folds a batch of observations `[n, obs_dim]` into the observation statistics.
    pub fn update_obs_stats(&mut self, obs: &Tensor) {
        if let Some(rms) = &mut self.obs_rms {
            rms.update(obs);
        }
    }

    /// Folds a batch of returns `[n]` into the return statistics.
    pub fn update_return_stats(&mut self, returns: &Tensor) {
        if let Some(rms) = &mut self.ret_rms {
            rms.update(&returns.unsqueeze(-1));
        }
    }

    /// A `[n, obs_dim]` tensor on the model's device from flat observations.
    pub fn obs_tensor(&self, obs: &[f32]) -> Result<Tensor> {
        rows_tensor(obs, self.obs_dim, self.device())
    }
}

impl Policy for ActorCritic {
    fn act(&mut self, obs: &[f32], deterministic: bool) -> Result<ActOutput> {
        if self.actor_core.is_some() {
            return Err(RlfError::Protocol {
                component: "policy",
                message: "a recurrent policy acts with its states (act_recurrent)".into(),
            });
        }
        self.act_recurrent(obs, &mut [], deterministic)
    }

    fn state_dim(&self) -> usize {
        ActorCritic::state_dim(self) as usize
    }

    fn act_recurrent(&mut self, obs: &[f32], states: &mut [f32], deterministic: bool) -> Result<ActOutput> {
        if let (Some(acting), true) = (&mut self.acting, states.is_empty()) {
            let how = Acting {
                deterministic,
                temperature: self.temperature,
            };
            return acting.act(&self.vars, obs, how, &mut self.draws);
        }
        let obs = self.obs_tensor(obs)?;
        let d = ActorCritic::state_dim(self);
        let n = obs.size()[0];
        if states.len() as i64 != n * d {
            return Err(RlfError::Protocol {
                component: "policy",
                message: format!(
                    "{} state values for {n} observations of a policy with {d} state values each",
                    states.len()
                ),
            });
        }
        let before = (d > 0)
            .then(|| rows_tensor(states, d, self.device()))
            .transpose()?;
        tch::no_grad(|| {
            let (dist, value, after) = self.forward_step(&obs, before.as_ref());
            if let Some(after) = after {
                states.copy_from_slice(&to_vec(&after.flatten(0, -1))?);
            }
            let dist = if self.temperature != 1.0 && !deterministic {
                dist.tempered(self.temperature)
            } else {
                dist
            };
            let actions = dist.sample(deterministic, &mut self.draws);
            let log_probs = dist.log_prob(&actions);
            Ok(ActOutput {
                actions: to_vec(&actions)?,
                log_probs: to_vec(&log_probs)?,
                values: to_vec(&self.unscale_value(&value))?,
            })
        })
    }

    /// The generator its actions are drawn with.
    fn sampler_state(&self) -> Option<Vec<u8>> {
        Some(self.draws.state())
    }

    fn load_sampler_state(&mut self, state: &[u8]) -> Result<()> {
        self.draws.load(state)
    }

    fn set_temperature(&mut self, temperature: f64) -> Result<()> {
        self.temperature = temperature;
        Ok(())
    }

    /// Images alone through every encoder, without input normalisation (whose statistics take floats) or an action
    /// mask read from the observation.
    fn takes_bytes(&self) -> bool {
        self.obs_rms.is_none()
            && self.action_mask.is_none()
            && self.actor.takes_bytes()
            && self.critic.as_ref().is_none_or(Encoder::takes_bytes)
    }

    fn obs_dim(&self) -> usize {
        self.obs_dim as usize
    }

    fn action_dim(&self) -> usize {
        self.head.action_dim()
    }

    fn variables(&self) -> &Variables {
        &self.vars
    }

    fn variables_mut(&mut self) -> &mut Variables {
        &mut self.vars
    }
}

#[cfg(test)]
mod tests {
    use rlf_env::{BoxSpace, Space};
    use tch::{Kind, Tensor};

    use super::{ActorCritic, ACTION_MASK_KEY};
    use crate::config::{Config, DeviceKind, ModelConfig, RnnType};
    use crate::model::Policy;

    fn unit_box(size: usize) -> Space {
        Space::Box(BoxSpace::uniform(0.0, 1.0, vec![size]).expect("box"))
    }

    /// A Connect Four-like Dict observation (a 7-value mask, then a 6×7×2 board) through
    /// convolutions: the board's cells are seen by position (moving a piece changes the output),
    /// the mask still masks, and the weights go through the flat buffer and back unchanged.
    #[test]
    fn convolutions_read_the_image_part_and_keep_the_mask() {
        tch::manual_seed(0);
        let board = Space::Box(BoxSpace::uniform(0.0, 1.0, vec![6, 7, 2]).expect("box"));
        let obs_space = Space::Dict(vec![
            (ACTION_MASK_KEY.to_owned(), unit_box(7)),
            ("observation".to_owned(), board),
        ]);
        let mut cfg = Config::default().model;
        cfg.encoder_conv_layers = "8x3,8x3".parse().expect("layers");
        let mut model =
            ActorCritic::new(&obs_space, &Space::discrete(7), &cfg, DeviceKind::Cpu).expect("model");
        let mut obs = vec![0.0_f32; 7 + 84];
        obs[..7].copy_from_slice(&[1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
        obs[7 + (5 * 7 + 3) * 2] = 1.0;
        let mut moved = obs.clone();
        moved[7 + (5 * 7 + 3) * 2] = 0.0;
        moved[7 + (5 * 7 + 4) * 2] = 1.0;
        let out = model.act(&[obs.clone(), moved].concat(), false).expect("act");
        assert_ne!(out.values[0], out.values[1], "the board's layout matters");
        for _ in 0..200 {
            let a = model.act(&obs, false).expect("act").actions[0];
            assert_ne!(a, 1.0, "a masked column");
        }
        let weights = model.weights().expect("weights");
        let mut other =
            ActorCritic::new(&obs_space, &Space::discrete(7), &cfg, DeviceKind::Cpu).expect("model");
        other.load_weights(&weights).expect("load");
        assert_eq!(
            other.act(&obs, true).expect("act").values,
            model.act(&obs, true).expect("act").values
        );
        let flat = Space::Box(BoxSpace::uniform(0.0, 1.0, vec![10]).expect("box"));
        let err = ActorCritic::new(&flat, &Space::discrete(2), &cfg, DeviceKind::Cpu).unwrap_err();
        assert!(err.to_string().contains("needs one image"), "{err}");
    }

    /// A dataset of byte images (channels-first stacked frames) laid out once for the learner's minibatches: its
    /// rows give the very values and log-probabilities their bytes give, in float32 and in bfloat16, with one
    /// network or two, and the next dataset is laid out in the same memory; an observation with a vector part, or
    /// normalised, stays as it is.
    #[test]
    fn images_laid_out_once_give_what_their_bytes_give() {
        use crate::config::{ConvArchitecture, MatmulPrecision};
        let frames = Space::Box(BoxSpace::uniform(0.0, 255.0, vec![4, 36, 36]).expect("box"));
        for (precision, kind) in [
            (MatmulPrecision::Highest, Kind::Float),
            (MatmulPrecision::Medium, Kind::BFloat16),
        ] {
            for share in [true, false] {
                tch::manual_seed(5);
                let mut cfg = Config::default().model;
                cfg.encoder_conv_architecture = ConvArchitecture::ConvnetSimple;
                cfg.obs_scale = 255.0;
                cfg.matmul_precision = precision;
                cfg.actor_critic_share_weights = share;
                let model =
                    ActorCritic::new(&frames, &Space::discrete(6), &cfg, DeviceKind::Cpu).expect("model");
                let bytes = Tensor::randint(256, [6, 4 * 36 * 36], (Kind::Uint8, tch::Device::Cpu));
                let mut buffer = None;
                let staged = model.staged_obs(&bytes, &mut buffer);
                assert_eq!(
                    (staged.size(), staged.kind()),
                    (vec![6, 36, 36, 4], kind),
                    "{precision:?}"
                );
                let rows = Tensor::from_slice(&[4_i64, 0, 2]);
                let actions = Tensor::from_slice(&[5.0_f32, 1.0, 3.0]).view([3, 1]);
                let (dist_a, values_a) = model.forward(&bytes.index_select(0, &rows));
                let (dist_b, values_b) = model.forward(&staged.index_select(0, &rows));
                assert!(values_a.abs().max().double_value(&[]) > 0.0);
                assert!(values_a.equal(&values_b), "{precision:?}, shared {share}: values");
                assert!(
                    dist_a.log_prob(&actions).equal(&dist_b.log_prob(&actions)),
                    "{precision:?}, shared {share}: log-probabilities"
                );
                // The next dataset is laid out in the same memory.
                let memory = staged.data_ptr();
                drop(staged);
                let more = Tensor::randint(256, [6, 4 * 36 * 36], (Kind::Uint8, tch::Device::Cpu));
                let again = model.staged_obs(&more, &mut buffer);
                assert_eq!(again.data_ptr(), memory, "{precision:?}: new memory");
                assert!(
                    model.forward(&more).1.equal(&model.forward(&again).1),
                    "{precision:?}: values"
                );
            }
        }
        let dict = Space::Dict(vec![
            ("frames".to_owned(), frames.clone()),
            ("vector".to_owned(), unit_box(3)),
        ]);
        let mut cfg = Config::default().model;
        cfg.encoder_conv_architecture = ConvArchitecture::ConvnetSimple;
        let model = ActorCritic::new(&dict, &Space::discrete(6), &cfg, DeviceKind::Cpu).expect("model");
        let obs = Tensor::rand([2, 4 * 36 * 36 + 3], (Kind::Float, tch::Device::Cpu));
        assert!(model.staged_obs(&obs, &mut None).equal(&obs));
        cfg.normalize_input = true;
        let model = ActorCritic::new(&frames, &Space::discrete(6), &cfg, DeviceKind::Cpu).expect("model");
        let obs = Tensor::rand([2, 4 * 36 * 36], (Kind::Float, tch::Device::Cpu));
        assert_eq!(model.staged_obs(&obs, &mut None).size(), vec![2, 4 * 36 * 36]);
    }

    /// The acting pass written out ([`DenseActing`](super::DenseActing)) acts as libtorch's: the same sampled
    /// categorical actions (masked or not, at temperature 1 or 2), the same Gaussian actions, and the same
    /// log-probabilities and values within float32's rounding, with running statistics of observations and returns;
    /// it takes the variables again after they change in place (a statistics update, a load).
    #[test]
    fn the_written_out_acting_pass_acts_as_libtorch() {
        use crate::config::Nonlinearity;
        // (nonlinearity, shared encoder, action mask, Gaussian head, normalisers, temperature)
        let cases = [
            (Nonlinearity::Tanh, true, false, false, false, 1.0),
            (Nonlinearity::Tanh, false, true, false, true, 1.0),
            (Nonlinearity::Relu, true, false, false, true, 2.0),
            (Nonlinearity::Elu, false, false, true, true, 1.0),
            (Nonlinearity::Tanh, true, false, true, false, 2.0),
        ];
        for (nonlinearity, shared, masked, gaussian, normalize, temperature) in cases {
            let label = format!("{nonlinearity:?} shared {shared} masked {masked} gaussian {gaussian}");
            let obs_space = if masked {
                Space::Dict(vec![
                    (ACTION_MASK_KEY.to_owned(), unit_box(4)),
                    ("observation".to_owned(), unit_box(5)),
                ])
            } else {
                unit_box(6)
            };
            let action_space = if gaussian {
                Space::Box(BoxSpace::uniform(-1.0, 1.0, vec![3]).expect("box"))
            } else {
                Space::discrete(4)
            };
            let mut cfg = Config::default().model;
            cfg.nonlinearity = nonlinearity;
            cfg.actor_critic_share_weights = shared;
            cfg.normalize_input = normalize;
            cfg.normalize_returns = normalize;
            cfg.encoder_mlp_layers = "16,8".parse().expect("layers");
            let build = || {
                tch::manual_seed(5);
                ActorCritic::new(&obs_space, &action_space, &cfg, DeviceKind::Cpu).expect("model")
            };
            let (mut written, mut torch) = (build(), build());
            assert!(written.acting.is_some(), "{label}: a network the pass covers");
            torch.acting = None;
            // Larger action-head weights than the initialisation's, so that the actions' probabilities differ.
            let mut weights = written.weights().expect("weights");
            tch::manual_seed(6);
            let noise = Vec::<f32>::try_from(Tensor::randn(
                [weights.values.len() as i64],
                (Kind::Float, tch::Device::Cpu),
            ))
            .expect("noise");
            weights
                .values
                .iter_mut()
                .zip(noise)
                .for_each(|(w, n)| *w += 0.5 * n);
            let obs: Vec<f32> = (0..64 * written.obs_dim as usize)
                .map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * 3.0)
                .map(|v| if masked && v < -2.0 { 0.0 } else { v })
                .collect();
            let rows = obs.len() / written.obs_dim as usize;
            let before = written.act(&obs, true).expect("act before the load");
            for model in [&mut written, &mut torch] {
                model.load_weights(&weights).expect("load");
                let obs = model.obs_tensor(&obs).expect("obs");
                model.update_obs_stats(&(&obs * 2.0 + 1.0));
                model.update_return_stats(&Tensor::from_slice(&[3.0_f32, 40.0, -7.0]));
                model.set_temperature(temperature).expect("temperature");
            }
            // The same draws from here on: each model's generator was seeded from libtorch's global one, which the
            // tests running beside this one draw from too.
            let draws = written.sampler_state().expect("a generator");
            torch.load_sampler_state(&draws).expect("the same generator");
            let close = |a: &[f32], b: &[f32], what: &str| {
                assert_eq!(a.len(), b.len(), "{label}: {what}");
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= 2e-5 * (1.0 + y.abs()),
                        "{label}: {what} {i}: {x} against {y}"
                    );
                }
            };
            for deterministic in [true, false, false] {
                let (w, t) = (
                    written.act(&obs, deterministic).expect("written out"),
                    torch.act(&obs, deterministic).expect("libtorch"),
                );
                assert_eq!(w.actions.len(), rows * written.head.action_dim(), "{label}");
                if gaussian {
                    close(&w.actions, &t.actions, "action");
                } else {
                    assert_eq!(w.actions, t.actions, "{label}: deterministic {deterministic}");
                }
                close(&w.log_probs, &t.log_probs, "log-probability");
                close(&w.values, &t.values, "value");
                assert_ne!(
                    w.values, before.values,
                    "{label}: the loaded weights and statistics are used"
                );
            }
            if masked {
                for (row, action) in obs
                    .chunks_exact(written.obs_dim as usize)
                    .zip(&written.act(&obs, false).expect("act").actions)
                {
                    assert!(
                        row[*action as usize] > 0.5 || row[..4].iter().all(|&m| m <= 0.5),
                        "{label}: a masked action"
                    );
                }
            }
        }
    }

    /// The variable `name` of `model`.
    fn var(model: &ActorCritic, name: &str) -> Tensor {
        let found = model.vars.named().iter().find(|(n, _)| n == name);
        found
            .unwrap_or_else(|| panic!("no variable {name}"))
            .1
            .shallow_clone()
    }

    /// One step of layer `l` of the core at `path`, written out from PyTorch's equations: a GRU
    /// (`c` is `None`) or an LSTM.
    fn cell(
        model: &ActorCritic,
        path: &str,
        l: usize,
        x: &Tensor,
        h: &Tensor,
        c: Option<&Tensor>,
    ) -> (Tensor, Option<Tensor>) {
        let w = |k: &str| var(model, &format!("{path}.{k}_l{l}"));
        let gi = x.matmul(&w("weight_ih").tr()) + w("bias_ih");
        let gh = h.matmul(&w("weight_hh").tr()) + w("bias_hh");
        match c {
            None => {
                let (gi, gh) = (gi.chunk(3, 1), gh.chunk(3, 1));
                let r = (&gi[0] + &gh[0]).sigmoid();
                let z = (&gi[1] + &gh[1]).sigmoid();
                let n = (&gi[2] + r * &gh[2]).tanh();
                ((-&z + 1.0) * n + z * h, None)
            }
            Some(c) => {
                let g = (gi + gh).chunk(4, 1);
                let c = g[1].sigmoid() * c + g[0].sigmoid() * g[2].tanh();
                (g[3].sigmoid() * c.tanh(), Some(c))
            }
        }
    }

    /// `forward_sequences` by hand: each chunk step by step through [`cell`], layer by layer,
    /// zeroing the state after a step that ended its episode.
    fn unrolled(
        model: &ActorCritic,
        cfg: &ModelConfig,
        obs: &Tensor,
        states: &Tensor,
        (ends, acted): (&[bool], &[bool]),
        len: usize,
    ) -> (Tensor, Tensor) {
        let (layers, size) = (cfg.rnn_num_layers as i64, cfg.rnn_size as i64);
        let lstm = cfg.rnn_type == RnnType::Lstm;
        let per_core = if lstm { 2 * layers * size } else { layers * size };
        let cores: Vec<&str> = if model.critic_core.is_some() {
            vec!["actor_core", "critic_core"]
        } else {
            vec!["actor_core"]
        };
        let (actor_h, critic_h) = model.encode(obs);
        let (mut log_probs, mut values) = (Vec::new(), Vec::new());
        for q in 0..(obs.size()[0] as usize / len) {
            // The state of each core: per layer, the hidden state and (LSTM) the cell state.
            let mut state: Vec<Vec<(Tensor, Option<Tensor>)>> = (0..cores.len() as i64)
                .map(|k| {
                    let row = states
                        .get(q as i64)
                        .narrow(0, k * per_core, per_core)
                        .unsqueeze(0);
                    (0..layers)
                        .map(|l| {
                            let h = row.narrow(1, l * size, size);
                            let c = lstm.then(|| row.narrow(1, (layers + l) * size, size));
                            (h, c)
                        })
                        .collect()
                })
                .collect();
            for j in 0..len {
                let r = (q * len + j) as i64;
                let inputs = [actor_h.get(r).unsqueeze(0), critic_h.get(r).unsqueeze(0)];
                let mut outs = Vec::new();
                let before: Vec<Vec<(Tensor, Option<Tensor>)>> = state
                    .iter()
                    .map(|core| {
                        core.iter()
                            .map(|(h, c)| (h.shallow_clone(), c.as_ref().map(Tensor::shallow_clone)))
                            .collect()
                    })
                    .collect();
                for (k, path) in cores.iter().enumerate() {
                    let mut x = inputs[k].shallow_clone();
                    for (l, layer) in state[k].iter_mut().enumerate() {
                        let (h, c) = cell(model, path, l, &x, &layer.0, layer.1.as_ref());
                        x = h.shallow_clone();
                        *layer = (h, c);
                    }
                    outs.push(x);
                }
                let critic_out = outs.get(1).unwrap_or(&outs[0]);
                let row = obs.get(r).unsqueeze(0);
                let (dist, value) = model.heads(&row, &outs[0], critic_out);
                log_probs.push(dist.log_prob(&Tensor::from_slice(&[(r % 2) as f32]).view([1, 1])));
                values.push(value);
                if !acted[r as usize] {
                    state = before;
                }
                if ends[r as usize] {
                    for layer in state.iter_mut().flatten() {
                        *layer = (layer.0.zeros_like(), layer.1.as_ref().map(Tensor::zeros_like));
                    }
                }
            }
        }
        (Tensor::cat(&log_probs, 0), Tensor::cat(&values, 0))
    }

    /// The gradient of `loss` with respect to each trainable variable of `model`.
    fn gradients(model: &ActorCritic, loss: &Tensor) -> Vec<Tensor> {
        for (_, t) in model.variables().trainable() {
            let mut g = t.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        loss.backward();
        model
            .variables()
            .trainable()
            .iter()
            .map(|(_, t)| t.grad().copy())
            .collect()
    }

    /// GRU (two layers, actor and critic cores) and LSTM (one shared core) unrolled over two chunks of 3 steps,
    /// one with an episode ending mid-chunk, the other with a step its agent did not act in (the state stays),
    /// from non-zero starting states: the log-probabilities, values, the loss and every gradient match the
    /// step-by-step reference; the states after each step are the reference's states before the reset.
    #[test]
    fn recurrent_sequences_match_a_step_by_step_reference() {
        for (rnn_type, layers, share) in [(RnnType::Gru, 2, false), (RnnType::Lstm, 1, true)] {
            tch::manual_seed(3);
            let mut cfg = Config::default().model;
            cfg.use_rnn = true;
            cfg.rnn_type = rnn_type;
            cfg.rnn_num_layers = layers;
            cfg.rnn_size = 4;
            cfg.actor_critic_share_weights = share;
            cfg.encoder_mlp_layers = "8".parse().expect("layers");
            let model =
                ActorCritic::new(&unit_box(3), &Space::discrete(2), &cfg, DeviceKind::Cpu).expect("model");
            let (c, len) = (2_i64, 3_usize);
            let obs = Tensor::rand([c * len as i64, 3], (Kind::Float, tch::Device::Cpu));
            let states = Tensor::randn([c, model.state_dim()], (Kind::Float, tch::Device::Cpu)) * 0.5;
            let ends = [false, true, false, false, false, true];
            let ends_t = Tensor::from_slice(&ends.map(f32::from));
            let did_act = [true, true, true, true, false, true];
            let actions = Tensor::from_slice(&[0.0_f32, 1.0, 0.0, 1.0, 0.0, 1.0]).view([6, 1]);

            let acted = Tensor::from_slice(&did_act.map(f32::from));
            let (dist, values, after) = model.forward_sequences(&obs, &states, &ends_t, &acted, len as i64);
            let log_probs = dist.log_prob(&actions);
            let (ref_log_probs, ref_values) = unrolled(&model, &cfg, &obs, &states, (&ends, &did_act), len);
            let close = |a: &Tensor, b: &Tensor| a.allclose(b, 1e-5, 1e-6, false);
            assert!(
                close(&log_probs, &ref_log_probs),
                "{rnn_type:?}: log-probabilities"
            );
            assert!(close(&values, &ref_values), "{rnn_type:?}: values");
            let loss = log_probs.sum(Kind::Float) + (&values * &values).sum(Kind::Float);
            let ref_loss = ref_log_probs.sum(Kind::Float) + (&ref_values * &ref_values).sum(Kind::Float);
            let grads = gradients(&model, &loss);
            let ref_grads = gradients(&model, &ref_loss);
            assert!(!grads.is_empty());
            for ((name, _), (g, r)) in model
                .variables()
                .trainable()
                .iter()
                .zip(grads.iter().zip(&ref_grads))
            {
                assert!(close(g, r), "{rnn_type:?}: the gradient of {name}");
            }
            let core_grad = &grads[model
                .variables()
                .trainable()
                .iter()
                .position(|(n, _)| n == "actor_core.weight_hh_l0")
                .expect("core")];
            assert!(
                f64::try_from(core_grad.abs().sum(Kind::Float)).expect("sum") > 0.0,
                "{rnn_type:?}: the core learns"
            );

            // One step at a time from the same states gives the same states after each step.
            let after = after.expect("states after each step");
            let mut state = states.shallow_clone();
            for j in 0..len as i64 {
                let rows = Tensor::from_slice(&[j, len as i64 + j]);
                let (_, _, next) = model.forward_step(&obs.index_select(0, &rows), Some(&state));
                let (q0, q1) = (j as usize, len + j as usize);
                let acted =
                    Tensor::from_slice(&[f32::from(did_act[q0]), f32::from(did_act[q1])]).unsqueeze(1);
                let next = next.expect("states") * &acted + &state * (acted * -1.0 + 1.0);
                assert!(
                    close(&next, &after.index_select(0, &rows)),
                    "{rnn_type:?}: states after step {j}"
                );
                let keep = Tensor::from_slice(&[f32::from(!ends[q0]), f32::from(!ends[q1])]);
                state = next * keep.unsqueeze(1);
            }
        }
    }

    /// A Dict observation of a 5-value mask then 3 features, and a 5-action head.
    fn masked_model() -> ActorCritic {
        tch::manual_seed(0);
        let obs = Space::Dict(vec![
            (ACTION_MASK_KEY.to_owned(), unit_box(5)),
            ("observation".to_owned(), unit_box(3)),
        ]);
        let cfg = Config::default().model;
        ActorCritic::new(&obs, &Space::discrete(5), &cfg, DeviceKind::Cpu).expect("model")
    }

    #[test]
    fn masked_actions_are_never_sampled_and_have_no_probability() {
        let model = masked_model();
        // Rows: actions 1 and 3 legal; only 4; none (an agent that does not act).
        let obs = Tensor::from_slice(&[
            0.0_f32, 1.0, 0.0, 1.0, 0.0, 0.3, -0.2, 0.9, //
            0.0, 0.0, 0.0, 0.0, 1.0, 0.1, 0.1, 0.1, //
            0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5,
        ])
        .view([3, 8]);
        let (dist, _) = model.forward(&obs.repeat([2000, 1]));
        let actions = Vec::<f32>::try_from(dist.sample(false, &mut super::Draws::new(0)).flatten(0, -1))
            .expect("actions");
        for (i, a) in actions.iter().enumerate() {
            match i % 3 {
                0 => assert!(*a == 1.0 || *a == 3.0, "row 0 sampled {a}"),
                1 => assert_eq!(*a, 4.0, "row 1"),
                _ => assert!((0.0..5.0).contains(a)),
            }
        }
        assert!(actions.iter().step_by(3).any(|&a| a == 1.0) && actions.iter().step_by(3).any(|&a| a == 3.0));
        let (dist, _) = model.forward(&obs);
        let all = Tensor::from_slice(&[0.0_f32, 1.0, 2.0, 3.0, 4.0]);
        let probs: Vec<Vec<f32>> = (0..3)
            .map(|row| {
                let lp = dist.log_prob(&Tensor::zeros([1, 1], (Kind::Float, tch::Device::Cpu)));
                let _ = lp;
                (0..5)
                    .map(|a| {
                        let actions = Tensor::full([3, 1], f64::from(a), (Kind::Float, tch::Device::Cpu));
                        let _ = &all;
                        f32::try_from(dist.log_prob(&actions).get(row).exp()).expect("p")
                    })
                    .collect()
            })
            .collect();
        assert_eq!((probs[0][0], probs[0][2], probs[0][4]), (0.0, 0.0, 0.0));
        assert!((probs[0][1] + probs[0][3] - 1.0).abs() < 1e-6);
        assert_eq!(probs[1], [0.0, 0.0, 0.0, 0.0, 1.0]);
        assert!(probs[2].iter().all(|p| (p - 0.2).abs() < 1e-6), "{:?}", probs[2]);
        let entropy = Vec::<f32>::try_from(dist.entropy()).expect("entropy");
        assert!(
            entropy[0] > 0.0 && entropy[0] <= 2.0_f32.ln() + 1e-6,
            "{entropy:?}"
        );
        assert!(
            entropy[1].abs() < 1e-6 && (entropy[2] - 5.0_f32.ln()).abs() < 1e-5,
            "{entropy:?}"
        );
    }

    #[test]
    fn masked_logits_get_no_gradient() {
        let model = masked_model();
        let obs = Tensor::from_slice(&[0.0_f32, 1.0, 0.0, 1.0, 0.0, 0.3, -0.2, 0.9]).view([1, 8]);
        let (dist, _) = model.forward(&obs);
        let loss = -dist
            .log_prob(&Tensor::from_slice(&[1.0_f32]).view([1, 1]))
            .sum(Kind::Float)
            - dist.entropy().sum(Kind::Float);
        loss.backward();
        let head = model
            .variables()
            .trainable()
            .into_iter()
            .find(|(n, _)| n == "action_head.bias")
            .expect("action head bias")
            .1;
        let grad = Vec::<f32>::try_from(head.grad()).expect("grad");
        assert_eq!((grad[0], grad[2], grad[4]), (0.0, 0.0, 0.0), "{grad:?}");
        assert!(grad[1] != 0.0 && grad[3] != 0.0, "{grad:?}");
    }

    #[test]
    fn a_mask_that_does_not_fit_the_action_space_is_an_error() {
        let obs = Space::Dict(vec![
            (ACTION_MASK_KEY.to_owned(), unit_box(4)),
            ("observation".to_owned(), unit_box(3)),
        ]);
        let cfg = Config::default().model;
        let err = ActorCritic::new(&obs, &Space::discrete(5), &cfg, DeviceKind::Cpu).expect_err("mismatch");
        assert!(
            err.to_string()
                .contains("action_mask of 4 values needs a Discrete(4)"),
            "{err}"
        );
    }
}
