//! Typed configuration: one struct per component, each with `Default` set to the reference
//! values, composed by [`Config`]; the CLI is generated from the same structs (clap derive, see
//! [`crate::cli`]), each flag's default taken from `Default` ([`Config::flag_defaults`]), so that
//! every reference value is written once. Flag names follow Sample Factory's.
//!
//! # Where values come from, later ones winning
//! 1. [`Config::default`] (the reference values),
//! 2. the shipped defaults for the env (`configs/<env>.toml`, or `configs/<env>-dqn.toml` with `--algo dqn` on the
//!    command line; see [`shipped_config`]),
//! 3. the file given with `--config FILE`,
//! 4. the values given on the command line,
//!
//! layered by [`Config::layered`], which then applies `--benchmark`'s implications.
//!
//! Config files are flat tables whose keys are flag names (`rollout = 32`,
//! `encoder_mlp_layers = [64, 64]`, `with_vtrace = false`), in TOML, or in JSON for a `.json`
//! file: the `config.json` an experiment folder holds is the resolved config, and
//! [`Config::from_file`] (or `--config`) reads it back.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use clap::{ArgAction, Args, ValueEnum};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Result, RlfError};

/// The most policies a run may train (`--num_policies`): each is a learner process.
pub const MAX_POLICIES: usize = 64;

/// Parses a boolean the way Sample Factory users type it: `true`/`false`, `True`/`False`, `1`/`0`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "true" | "True" | "TRUE" | "1" | "yes" => Ok(true),
        "false" | "False" | "FALSE" | "0" | "no" => Ok(false),
        _ => Err(format!("`{s}` is not a boolean (use true or false)")),
    }
}

/// Hidden layer sizes of an MLP, written `64,64` on the command line and `[64, 64]` (or `"64,64"`)
/// in files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Layers(pub Vec<i64>);

impl<'de> Deserialize<'de> for Layers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            List(Vec<i64>),
            Text(String),
        }
        let text = match Written::deserialize(deserializer)? {
            Written::Text(text) => text,
            Written::List(sizes) => sizes.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for Layers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let sizes = s
            .split(',')
            .map(|p| match p.trim().parse::<i64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "`{s}` is not a comma-separated list of positive layer sizes"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if sizes.is_empty() {
            return Err("at least one layer is needed".into());
        }
        Ok(Layers(sizes))
    }
}

impl fmt::Display for Layers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(i64::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// One convolution of the encoder: `channels` filters of `kernel` × `kernel`, moved by `stride`
/// (padded to keep the size when the stride is 1, unpadded otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvLayer {
    /// Output channels.
    pub channels: i64,
    /// Kernel height and width.
    pub kernel: i64,
    /// Stride.
    pub stride: i64,
}

/// The convolutions of the encoder, written `64x3,64x3` (channels × kernel, stride 1) or `32x8s4`
/// (stride 4); empty for none (an MLP on the flat observation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConvLayers(pub Vec<ConvLayer>);

impl FromStr for ConvLayers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let bad = |p: &str| {
            format!("`{p}` in `{s}` is not a convolution `CHANNELSxKERNEL` or `CHANNELSxKERNELsSTRIDE`")
        };
        let positive = |t: &str, p: &str| match t.trim().parse::<i64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad(p)),
        };
        s.split(',')
            .map(|p| {
                let (channels, rest) = p.split_once('x').ok_or_else(|| bad(p))?;
                let (kernel, stride) = rest.split_once('s').unwrap_or((rest, "1"));
                Ok(ConvLayer {
                    channels: positive(channels, p)?,
                    kernel: positive(kernel, p)?,
                    stride: positive(stride, p)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()
            .map(Self)
    }
}

impl fmt::Display for ConvLayers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|l| match l.stride {
                1 => format!("{}x{}", l.channels, l.kernel),
                s => format!("{}x{}s{s}", l.channels, l.kernel),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl Serialize for ConvLayers {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ConvLayers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The environment and the seeds.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct EnvConfig {
    /// Environment id: a native classic-control env such as CartPole-v1, a native multi-agent
    /// env (connect_four, treasurehunt), or `gym:<id>`. Required, on the command line or in the `--config` file.
    #[arg(long, hide_default_value = true)]
    pub env: String,
    /// Keyword arguments of a multi-agent env, `key=value,key=value` (for example
    /// `num_agents=3,height=8` for treasurehunt).
    #[arg(long)]
    pub env_kwargs: String,
    /// The observation values a single-agent env's policy sees, by index, comma-separated (the
    /// others are hidden): `0,2` shows CartPole's cart position and pole angle, not their
    /// velocities, a partially observed task that needs `--use_rnn`. Empty: all.
    #[arg(long)]
    pub obs_mask: String,
    /// Maps a single-agent env's observation values from their bounds onto [-1, 1] (Gymnasium's
    /// `RescaleObservation`), so that values of very different scales reach the network on one;
    /// every value must have finite bounds within ±1e6.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub rescale_obs: bool,
    /// Random seed of the networks and of the envs (env `i` gets `seed + i`).
    #[arg(long)]
    pub seed: u64,
}

/// The reference values (the command line's defaults; `--env` CartPole-v1).
impl Default for EnvConfig {
    fn default() -> Self {
        Self {
            env: "CartPole-v1".to_owned(),
            env_kwargs: String::new(),
            obs_mask: String::new(),
            rescale_obs: false,
            seed: 0,
        }
    }
}

/// Rollout and inference workers.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct SamplingConfig {
    /// Number of rollout workers.
    #[arg(long)]
    pub num_workers: usize,
    /// Envs simulated by each rollout worker.
    #[arg(long)]
    pub num_envs_per_worker: usize,
    /// Groups the envs of a worker are split into (double-buffered sampling when 2).
    #[arg(long)]
    pub worker_num_splits: usize,
    /// Length of a trajectory, in env steps.
    #[arg(long)]
    pub rollout: usize,
    /// Inference workers of each policy (each a process outside serial mode), as Sample Factory's:
    /// a policy's workers share a queue of requests for its agents and run only its networks (its
    /// latest weights and its self-play snapshots); policy 0's also fill in the columns no network
    /// plays, so every step asks them.
    #[arg(long)]
    pub policy_workers_per_policy: usize,
    /// Inference workers that serve every policy from one queue, in place of
    /// `--policy_workers_per_policy` workers for each (0: off). With several policies on few
    /// cores, one shared worker saves a process per policy.
    #[arg(long)]
    pub shared_policy_workers: usize,
    /// Policies trained side by side, each with its own learner process, weights and checkpoints
    /// (`checkpoint_p<i>/`); agents are mapped to them as `--agent_policy_map` or Sample
    /// Factory's rules say.
    #[arg(long)]
    pub num_policies: usize,
    /// Whether the agents of one env may be controlled by different policies (when policies are
    /// drawn per env, and in sync mode's fixed mapping).
    #[arg(long, action = ArgAction::Set, value_parser = parse_bool)]
    pub pbt_mix_policies_in_one_env: bool,
    /// A fixed policy per agent, by agent-name prefix: `adversary=1,agent=0` (the longest
    /// matching prefix wins; every agent must match). Empty: Sample Factory's mapping.
    #[arg(long)]
    pub agent_policy_map: String,
    /// A team per agent, by agent-name prefix: `red=0,blue=1` (the longest matching prefix wins;
    /// every agent must match). Self-play gives the protagonist's teammates the latest weights and
    /// each other team one opponent. Empty: the env's teams (each agent a team of its own unless
    /// the env has teams, as `connect_four` with `players_per_side`).
    #[arg(long)]
    pub agent_team_map: String,
    /// Self-play for multi-agent games: each policy keeps a pool of frozen snapshots of itself,
    /// and in each episode one agent plays the latest weights while every other agent plays them
    /// too (`--self_play_latest_prob`) or a snapshot drawn from its policy's pool, whose steps are
    /// not trained on. In team games (`--agent_team_map`, or the env's teams) the agent's teammates
    /// play the latest weights with it and each other team one opponent drawn for the whole team.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub self_play: bool,
    /// Env frames between two snapshots of every policy into its pool (self-play).
    #[arg(long)]
    pub snapshot_every_env_steps: u64,
    /// Snapshots kept per policy (self-play); a new one replaces the oldest (but the first, with
    /// `--self_play_keep_first`).
    #[arg(long)]
    pub opponent_pool_size: usize,
    /// Keep the first snapshot (the initial weights: a nearly uniformly random player) in its pool slot for the
    /// whole run, the later ones taking turns in the other slots (self-play, pools of 2 or more): the latest
    /// weights keep meeting a weak, unpredictable opponent after the pool has moved on.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub self_play_keep_first: bool,
    /// Probability that an opponent plays the latest weights rather than a snapshot (self-play).
    #[arg(long)]
    pub self_play_latest_prob: f64,
    /// Built-in players of the env (Connect Four's `random` and `heuristic`) that may play an
    /// opponent in self-play, comma-separated: with probability `--self_play_builtin_prob` an
    /// opponent is one of them, drawn uniformly. Their steps are not trained on; the win rate
    /// against each is reported.
    #[arg(long)]
    pub self_play_builtin_opponents: String,
    /// Probability that a self-play opponent is a built-in player
    /// (`--self_play_builtin_opponents`) rather than the latest weights or a snapshot.
    #[arg(long)]
    pub self_play_builtin_prob: f64,
}

/// The reference values (the command line's defaults).
impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            num_workers: 1,
            num_envs_per_worker: 8,
            worker_num_splits: 1,
            rollout: 32,
            policy_workers_per_policy: 1,
            shared_policy_workers: 0,
            num_policies: 1,
            pbt_mix_policies_in_one_env: true,
            agent_policy_map: String::new(),
            agent_team_map: String::new(),
            self_play: false,
            snapshot_every_env_steps: 100_000,
            opponent_pool_size: 8,
            self_play_keep_first: true,
            self_play_latest_prob: 0.5,
            self_play_builtin_opponents: String::new(),
            self_play_builtin_prob: 0.0,
        }
    }
}

/// Nonlinearity of the MLP layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Nonlinearity {
    /// Exponential linear unit.
    Elu,
    /// Rectified linear unit.
    Relu,
    /// Hyperbolic tangent.
    Tanh,
}

/// The precision of the MLP layers' matrix products (PyTorch's `torch.set_float32_matmul_precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum MatmulPrecision {
    /// Float32 throughout.
    Highest,
    /// Each MLP layer multiplies batches of 64 rows or more in bfloat16 and returns float32 (mixed precision: the
    /// weights, their gradients and the optimiser's state stay float32). The products are about twice as fast on a
    /// CPU with AVX-512 BF16 or AMX, slower on one without.
    Medium,
}

/// How a Gaussian action is mapped into a Box action space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum ContinuousActionMode {
    /// The sampled action is clipped to the bounds.
    Clip,
    /// The sampled action is squashed with tanh and scaled to the bounds.
    Tanh,
    /// The action, clipped to [−1, 1], is scaled linearly to the bounds (how SAC's squashed actions reach the env,
    /// whatever this flag says).
    Scale,
}

/// Weight initialisation of the linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum PolicyInitialization {
    /// Orthogonal weights (gain √2 hidden, 0.01 policy head, 1 value head), zero biases.
    Orthogonal,
    /// libtorch's default (Kaiming uniform).
    TorchDefault,
}

/// The network.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct ModelConfig {
    /// Convolutions applied first to the image part of the observation (a Box of shape
    /// `(H, W, C)`, alone or in a Dict), each followed by a ReLU: `64x3,64x3` (channels × kernel)
    /// or `32x8s4` (with a stride). Empty: none.
    #[arg(long)]
    pub encoder_conv_layers: ConvLayers,
    /// One of Sample Factory's convolutional networks for every image part of the observation (a `Box` of three
    /// dimensions), with an MLP for each other part, outputs concatenated: `convnet_simple` (its Atari network),
    /// `convnet_impala`, `convnet_atari`, `resnet_impala`. `none`: the MLP over the whole observation (or
    /// `--encoder_conv_layers`).
    #[arg(long, value_enum)]
    pub encoder_conv_architecture: ConvArchitecture,
    /// Hidden layer sizes of the MLP after a named convolutional network (`--encoder_conv_architecture`).
    #[arg(long)]
    pub encoder_conv_mlp_layers: Layers,
    /// Observations are divided by this before the encoder (Sample Factory's `--obs_scale`; 255 for pixels of
    /// 0 to 255). Action masks are read unscaled.
    #[arg(long)]
    pub obs_scale: f64,
    /// Hidden layer sizes of the MLP encoder (after the convolutions, if any).
    #[arg(long)]
    pub encoder_mlp_layers: Layers,
    /// Nonlinearity after each hidden layer.
    #[arg(long, value_enum)]
    pub nonlinearity: Nonlinearity,
    /// The precision of the MLP encoder's matrix products (the MLP over the whole observation or after
    /// `--encoder_conv_layers`, and SAC's critics; not `--encoder_conv_architecture` networks): `highest` (float32)
    /// or `medium` (bfloat16 products of float32 weights).
    #[arg(long, value_enum)]
    pub matmul_precision: MatmulPrecision,
    /// One encoder for actor and critic (true) or one each (false).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub actor_critic_share_weights: bool,
    /// Weight initialisation.
    #[arg(long, value_enum)]
    pub policy_initialization: PolicyInitialization,
    /// Gaussian heads: state-dependent standard deviation (true) or one learned per action dimension.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub adaptive_stddev: bool,
    /// Gaussian heads: initial standard deviation.
    #[arg(long)]
    pub initial_stddev: f64,
    /// Gaussian heads: clip the sampled action to the bounds, or squash it with tanh.
    #[arg(long, value_enum)]
    pub continuous_action_mode: ContinuousActionMode,
    /// Normalise observations with running mean and standard deviation.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub normalize_input: bool,
    /// Learn values in units of the running standard deviation of the returns.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub normalize_returns: bool,
    /// A recurrent core after the encoder (the actor's and the critic's, one each without
    /// `--actor_critic_share_weights`): each env's state lives in the trajectory slots, is reset at
    /// its episode ends, and the learner trains through time over `--recurrence` steps.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub use_rnn: bool,
    /// The recurrent core's cell.
    #[arg(long, value_enum)]
    pub rnn_type: RnnType,
    /// Units per layer of the recurrent core.
    #[arg(long)]
    pub rnn_size: usize,
    /// Layers of the recurrent core.
    #[arg(long)]
    pub rnn_num_layers: usize,
}

/// Sample Factory's convolutional encoders (`--encoder_conv_architecture`; see `model/encoder.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum ConvArchitecture {
    /// No named network.
    None,
    /// 32 8×8/4, 64 4×4/2, 128 3×3/2.
    ConvnetSimple,
    /// 16 8×8/4, 32 4×4/2.
    ConvnetImpala,
    /// 32 8×8/4, 64 4×4/2, 64 3×3/1.
    ConvnetAtari,
    /// IMPALA's residual network (16, 32, 32 channels).
    ResnetImpala,
}

impl ConvArchitecture {
    /// The flag's value.
    pub fn name(self) -> &'static str {
        match self {
            ConvArchitecture::None => "none",
            ConvArchitecture::ConvnetSimple => "convnet_simple",
            ConvArchitecture::ConvnetImpala => "convnet_impala",
            ConvArchitecture::ConvnetAtari => "convnet_atari",
            ConvArchitecture::ResnetImpala => "resnet_impala",
        }
    }
}

/// The cell of the recurrent core (`--use_rnn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum RnnType {
    /// Gated recurrent unit: a state of `--rnn_size` values per layer.
    Gru,
    /// Long short-term memory: hidden and cell states, `2 × --rnn_size` values per layer.
    Lstm,
}

/// The reference values (the command line's defaults).
impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            encoder_conv_layers: ConvLayers::default(),
            encoder_conv_architecture: ConvArchitecture::None,
            encoder_conv_mlp_layers: Layers(vec![512]),
            obs_scale: 1.0,
            encoder_mlp_layers: Layers(vec![64, 64]),
            nonlinearity: Nonlinearity::Tanh,
            matmul_precision: MatmulPrecision::Highest,
            actor_critic_share_weights: false,
            policy_initialization: PolicyInitialization::Orthogonal,
            adaptive_stddev: false,
            initial_stddev: 1.0,
            continuous_action_mode: ContinuousActionMode::Clip,
            normalize_input: false,
            normalize_returns: false,
            use_rnn: false,
            rnn_type: RnnType::Gru,
            rnn_size: 128,
            rnn_num_layers: 1,
        }
    }
}

/// Learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum LrScheduleKind {
    /// The same rate throughout.
    Constant,
    /// From `learning_rate` down to 0 at `train_for_env_steps`.
    LinearDecay,
    /// Divided by 1.5 after a minibatch whose KL divergence exceeds twice the threshold,
    /// multiplied by 1.5 when it is below half of it (bounded to [1e-6, 1e-2]).
    KlAdaptiveMinibatch,
    /// As `kl_adaptive_minibatch`, with the KL averaged over an epoch.
    KlAdaptiveEpoch,
}

/// APPO: advantages, losses and the epoch / minibatch loop (its optimiser is [`OptimizerConfig`]).
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct AppoConfig {
    /// Discount factor.
    #[arg(long)]
    pub gamma: f64,
    /// GAE λ (when not using V-trace).
    #[arg(long)]
    pub gae_lambda: f64,
    /// V-trace targets and advantages instead of GAE.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub with_vtrace: bool,
    /// V-trace ρ̄ (truncation of the importance weights of the targets).
    #[arg(long)]
    pub vtrace_rho: f64,
    /// V-trace c̄ (truncation of the trace coefficients).
    #[arg(long)]
    pub vtrace_c: f64,
    /// PPO clipping of the probability ratio to [1 - ε, 1 + ε].
    #[arg(long)]
    pub ppo_clip_ratio: f64,
    /// Clipping of the value change from the behaviour value (in value units; ≤ 0 turns it off).
    #[arg(long)]
    pub ppo_clip_value: f64,
    /// Weight of the value loss.
    #[arg(long)]
    pub value_loss_coeff: f64,
    /// Weight of the entropy bonus.
    #[arg(long)]
    pub exploration_loss_coeff: f64,
    /// Normalise advantages per minibatch.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub normalize_advantage: bool,
    /// Passes over each training dataset.
    #[arg(long)]
    pub num_epochs: usize,
    /// Minibatches per epoch; a dataset holds `batch_size * num_batches_per_epoch` transitions.
    #[arg(long)]
    pub num_batches_per_epoch: usize,
    /// Transitions per minibatch.
    #[arg(long)]
    pub batch_size: usize,
    /// Transitions older than this many policy versions are left out of the loss.
    #[arg(long)]
    pub max_policy_lag: u64,
    /// Datasets waiting for the learner beyond which sampling stops (the batcher keeps the
    /// trajectory slots until the learner catches up).
    #[arg(long)]
    pub num_batches_to_accumulate: usize,
    /// Steps of backpropagation through time with `--use_rnn`: each trajectory is cut into chunks
    /// of this many steps, each starting from the state the slot recorded; it must divide
    /// `--rollout` (and equal it with V-trace). -1: the whole trajectory.
    #[arg(long, allow_negative_numbers = true)]
    pub recurrence: i64,
}

/// The reference values (the command line's defaults).
impl Default for AppoConfig {
    fn default() -> Self {
        Self {
            gamma: 0.99,
            gae_lambda: 0.95,
            with_vtrace: false,
            vtrace_rho: 1.0,
            vtrace_c: 1.0,
            ppo_clip_ratio: 0.2,
            ppo_clip_value: 1.0,
            value_loss_coeff: 0.5,
            exploration_loss_coeff: 0.003,
            normalize_advantage: true,
            num_epochs: 1,
            num_batches_per_epoch: 1,
            batch_size: 1024,
            max_policy_lag: 1000,
            num_batches_to_accumulate: 2,
            recurrence: -1,
        }
    }
}

/// The optimiser every algorithm's learners step with: Adam, its learning rate and schedule, and the clipping of the
/// gradients' global norm (APPO's and DQN's; SAC clips none, as the paper).
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct OptimizerConfig {
    /// Adam learning rate (the start value of the schedule).
    #[arg(long)]
    pub learning_rate: f64,
    /// Learning-rate schedule. DQN and SAC take `constant` or `linear_decay` (to 0 over the transitions their buffer
    /// takes in the run); the KL-adaptive ones are APPO's.
    #[arg(long, value_enum)]
    pub lr_schedule: LrScheduleKind,
    /// KL target of the KL-adaptive schedules.
    #[arg(long)]
    pub lr_schedule_kl_threshold: f64,
    /// Adam ε.
    #[arg(long)]
    pub adam_eps: f64,
    /// Adam β1.
    #[arg(long)]
    pub adam_beta1: f64,
    /// Adam β2.
    #[arg(long)]
    pub adam_beta2: f64,
    /// Gradient-norm clipping threshold (the gradients' global norm).
    #[arg(long)]
    pub max_grad_norm: f64,
}

/// The reference values (the command line's defaults).
impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-4,
            lr_schedule: LrScheduleKind::Constant,
            lr_schedule_kl_threshold: 0.008,
            adam_eps: 1e-6,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            max_grad_norm: 4.0,
        }
    }
}

/// The learning algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Algo {
    /// Asynchronous PPO (on-policy, from the trajectory slots).
    Appo,
    /// DQN (off-policy, from a replay buffer; `Discrete` actions).
    Dqn,
    /// Soft actor-critic (off-policy, from a replay buffer; `Box` actions).
    Sac,
}

impl Algo {
    /// Whether it learns from a replay buffer (DQN, SAC) rather than from the trajectory slots (APPO).
    pub fn is_off_policy(self) -> bool {
        self != Algo::Appo
    }

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Appo => "appo",
            Algo::Dqn => "dqn",
            Algo::Sac => "sac",
        }
    }
}

/// Off-policy learning (`--algo dqn`, `--algo sac`): the replay buffer, its rate limit, targets and exploration. The batch
/// size and the discount are those of [`AppoConfig`]'s flags, the learning rate, Adam and gradient clipping
/// [`OptimizerConfig`]'s; `--double_q`, `--dueling` and the ε schedule are DQN's.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct OffPolicyConfig {
    /// The learning algorithm.
    #[arg(long, value_enum)]
    pub algo: Algo,
    /// Transitions each policy's replay buffer holds (the oldest are overwritten).
    #[arg(long)]
    pub replay_buffer_size: usize,
    /// Save each policy's replay buffer after each of its checkpoints (`checkpoint_p<i>/replay_buffer/`, the newest
    /// only), so that a resumed run goes on with the same transitions, priorities and counters. false: a resumed run
    /// starts with an empty buffer.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub save_replay_buffer: bool,
    /// Transitions in a policy's buffer before its learner samples.
    #[arg(long)]
    pub learning_starts: u64,
    /// Transitions sampled for gradients per transition inserted (`--batch_size` × SGD steps ÷ inserts), held by a
    /// rate limiter whichever side is faster: inserts wait for the learner and the learner for inserts. 0: no
    /// limit, each side as fast as it can.
    #[arg(long)]
    pub replay_ratio: f64,
    /// Steps of each transition's return (n-step returns).
    #[arg(long)]
    pub n_step: usize,
    /// SGD steps between two updates of the target network.
    #[arg(long)]
    pub target_update_interval: u64,
    /// How far each update moves the target network towards the online one (1: a copy; less: Polyak averaging).
    #[arg(long)]
    pub tau: f64,
    /// Fraction of `--train_for_env_steps` over which ε falls linearly from its initial to its final value.
    #[arg(long)]
    pub exploration_fraction: f64,
    /// ε of ε-greedy exploration at the start.
    #[arg(long)]
    pub exploration_initial_eps: f64,
    /// ε at the end of the schedule, and after.
    #[arg(long)]
    pub exploration_final_eps: f64,
    /// Temporally-extended ε-greedy (εz-greedy, Dabney et al. 2021): an exploratory action is repeated for a
    /// duration drawn from a zeta distribution of this exponent (`P(n) ∝ n^−μ`, at most 10,000 steps) instead of
    /// lasting one step; the paper's choice is 2. 0: plain ε-greedy.
    #[arg(long)]
    pub exploration_duration_mu: f64,
    /// Double DQN: the online network picks the next action, the target network values it.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub double_q: bool,
    /// The dueling head: Q = V + A − mean(A).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub dueling: bool,
    /// SGD steps between two publications of the weights to the actors.
    #[arg(long)]
    pub publish_interval: u64,
    /// Prioritised replay: transitions are drawn in proportion to their last TD error (a sum-tree in the learner),
    /// and the loss weights each by importance.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub prioritized_replay: bool,
    /// How much the priorities count: a transition's is `(|TD error| + ε)^α` (0: uniform).
    #[arg(long)]
    pub prioritized_replay_alpha: f64,
    /// The importance weights' exponent at the start, raised linearly to 1 over the run.
    #[arg(long)]
    pub prioritized_replay_beta: f64,
    /// ε of the priorities, so that none is 0.
    #[arg(long)]
    pub prioritized_replay_eps: f64,
}

/// The reference values (the command line's defaults).
impl Default for OffPolicyConfig {
    fn default() -> Self {
        Self {
            algo: Algo::Appo,
            replay_buffer_size: 100_000,
            save_replay_buffer: true,
            learning_starts: 1000,
            replay_ratio: 8.0,
            n_step: 1,
            target_update_interval: 1000,
            tau: 1.0,
            exploration_fraction: 0.1,
            exploration_initial_eps: 1.0,
            exploration_final_eps: 0.05,
            exploration_duration_mu: 0.0,
            double_q: true,
            dueling: false,
            publish_interval: 10,
            prioritized_replay: false,
            prioritized_replay_alpha: 0.6,
            prioritized_replay_beta: 0.4,
            prioritized_replay_eps: 1e-6,
        }
    }
}

impl OffPolicyConfig {
    /// The actors' exploration after `steps` env steps of a run of `total`: DQN's ε (linear from the initial to
    /// the final value over `--exploration_fraction` of the run, then constant); SAC's share of uniformly random
    /// actions (all of them until `--learning_starts`, as Stable-Baselines3, then none: it explores by sampling).
    pub fn epsilon(&self, steps: u64, total: u64) -> f64 {
        if self.algo == Algo::Sac {
            return if steps < self.learning_starts { 1.0 } else { 0.0 };
        }
        let span = self.exploration_fraction * total as f64;
        let progress = if span > 0.0 {
            (steps as f64 / span).min(1.0)
        } else {
            1.0
        };
        self.exploration_initial_eps + progress * (self.exploration_final_eps - self.exploration_initial_eps)
    }
}

/// Device the learner and inference run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DeviceKind {
    /// The CPU.
    Cpu,
    /// The first CUDA GPU (needs libtorch's CUDA build).
    Gpu,
}

/// The run: experiment folder, mode, stop conditions, reporting.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct RunConfig {
    /// Experiment name (a folder under `train_dir`).
    #[arg(long)]
    pub experiment: String,
    /// Root folder of experiments.
    #[arg(long)]
    pub train_dir: PathBuf,
    /// All components on one event loop in this process (false: rollout workers, inference workers
    /// and the learner in processes of their own).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub serial_mode: bool,
    /// Rollout workers keep sampling while the learner trains (false: they wait for the new policy).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub async_rl: bool,
    /// Stop after this many env frames.
    #[arg(long)]
    pub train_for_env_steps: u64,
    /// Stop after this many seconds (with `--benchmark` and no value given: 10).
    #[arg(long)]
    pub train_for_seconds: f64,
    /// Stop when the mean return of the last 100 episodes reaches this value.
    #[arg(long)]
    pub stop_at_reward: Option<f64>,
    /// Write a JSON summary of the run to this file at exit.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Learner and inference device.
    #[arg(long, value_enum)]
    pub device: DeviceKind,
    /// libtorch intra-op threads per process.
    #[arg(long)]
    pub num_threads: i32,
    /// libtorch intra-op threads of the learner's process (0: `--num_threads`): a convolutional learner is the
    /// bottleneck of a pixel run and can use more cores than the rest, which mostly waits for it.
    #[arg(long)]
    pub learner_threads: i32,
    /// Seconds between progress lines (0: none; scalars, checkpoints and stop rules go on).
    #[arg(long)]
    pub report_interval_sec: f64,
    /// Env frames between TensorBoard scalars of each kind (episode statistics, training
    /// metrics); 0: after every rollout report and every dataset. The first episode's and the
    /// last values are always written.
    #[arg(long)]
    pub summary_every_env_steps: u64,
    /// Save the resolved config and the final weights in the experiment folder.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub save_experiment: bool,
    /// Measure throughput: no `--stop_at_reward`, no experiment folder, `--train_for_seconds`
    /// 10 unless given; the summary's `fps` is the steady-state rate after the warm-up.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub benchmark: bool,
    /// Seconds without a heartbeat after which a component is named hung (a hung rollout worker is
    /// replaced, any other hung component stops the run).
    #[arg(long)]
    pub heartbeat_interval: f64,
    /// Times each rollout worker process is replaced when it dies or hangs before the run stops.
    #[arg(long)]
    pub max_worker_restarts: u32,
    /// Episodes the mean returns are taken over (the progress line, `--stop_at_reward`, the best
    /// checkpoint, each policy's PBT objective).
    #[arg(long)]
    pub stats_avg: usize,
}

/// The reference values (the command line's defaults).
impl Default for RunConfig {
    fn default() -> Self {
        Self {
            experiment: "default_experiment".to_owned(),
            train_dir: PathBuf::from("train_dir"),
            serial_mode: false,
            async_rl: true,
            train_for_env_steps: 10_000_000,
            train_for_seconds: UNLIMITED_SECONDS,
            stop_at_reward: None,
            summary_json: None,
            device: DeviceKind::Cpu,
            num_threads: 1,
            learner_threads: 0,
            report_interval_sec: 1.0,
            summary_every_env_steps: 5_000,
            save_experiment: true,
            benchmark: false,
            heartbeat_interval: 20.0,
            max_worker_restarts: 5,
            stats_avg: 100,
        }
    }
}

/// The default of `--train_for_seconds`: no time limit.
pub const UNLIMITED_SECONDS: f64 = 1e10;

/// `--train_for_seconds` of a `--benchmark` run that sets no other value.
pub const BENCHMARK_SECONDS: f64 = 10.0;

/// What to do with an existing experiment folder (Sample Factory's `--restart_behavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum RestartBehaviorArg {
    /// Continue from the latest intact checkpoint.
    Resume,
    /// Move the old folder aside (`<experiment>_old0001`) and start from scratch.
    Restart,
    /// Delete the old folder and start from scratch.
    Overwrite,
}

/// Which checkpoint to load (Sample Factory's `--load_checkpoint_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// The newest intact regular checkpoint.
    Latest,
    /// The one with the best metric.
    Best,
}

/// The metric that picks the best checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum BestMetric {
    /// The mean return of the last `--stats_avg` episodes.
    Reward,
    /// The mean true objective of the same episodes: what the env reports as
    /// `info["true_objective"]` at an episode's end, the return where it reports none.
    TrueObjective,
}

/// The experiment folder's checkpoints and restarts.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct CheckpointingConfig {
    /// What to do when the experiment folder exists: resume from its latest checkpoint, restart
    /// (moving it aside) or overwrite it.
    #[arg(long, value_enum)]
    pub restart_behavior: RestartBehaviorArg,
    /// Seconds between checkpoints (one more is saved when the run stops).
    #[arg(long)]
    pub save_every_sec: f64,
    /// Regular checkpoints kept (older ones are deleted).
    #[arg(long)]
    pub keep_checkpoints: usize,
    /// The metric of the best checkpoint.
    #[arg(long, value_enum)]
    pub save_best_metric: BestMetric,
    /// No best checkpoint before this many env frames (early means are noisy).
    #[arg(long)]
    pub save_best_after: u64,
    /// Keep a milestone checkpoint for ever every this many env frames (0: none).
    #[arg(long)]
    pub save_milestones_env_steps: u64,
}

/// The reference values (the command line's defaults).
impl Default for CheckpointingConfig {
    fn default() -> Self {
        Self {
            restart_behavior: RestartBehaviorArg::Resume,
            save_every_sec: 120.0,
            keep_checkpoints: 2,
            save_best_metric: BestMetric::Reward,
            save_best_after: 100_000,
            save_milestones_env_steps: 0,
        }
    }
}

/// Population-based training (Sample Factory's flags; see [`crate::pbt`]).
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct PbtConfig {
    /// Population-based training of the `--num_policies` policies (needs an experiment folder:
    /// weights are copied through checkpoints).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub with_pbt: bool,
    /// A policy's agent steps between two of its PBT updates.
    #[arg(long)]
    pub pbt_period_env_steps: u64,
    /// No PBT update before the run has this many env frames.
    #[arg(long)]
    pub pbt_start_mutation: u64,
    /// The fraction of policies counted as best and as worst.
    #[arg(long)]
    pub pbt_replace_fraction: f64,
    /// Probability that each hyper-parameter of a policy outside the best is mutated.
    #[arg(long)]
    pub pbt_mutation_rate: f64,
    /// Relative gap in objective a worst policy must trail a best one by to take its weights.
    #[arg(long)]
    pub pbt_replace_reward_gap: f64,
    /// Absolute gap, as above.
    #[arg(long)]
    pub pbt_replace_reward_gap_absolute: f64,
    /// Whether gamma is mutated too (through `1 - gamma`).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub pbt_optimize_gamma: bool,
}

/// The reference values (Sample Factory's defaults).
impl Default for PbtConfig {
    fn default() -> Self {
        Self {
            with_pbt: false,
            pbt_period_env_steps: 5_000_000,
            pbt_start_mutation: 20_000_000,
            pbt_replace_fraction: 0.3,
            pbt_mutation_rate: 0.15,
            pbt_replace_reward_gap: 0.1,
            pbt_replace_reward_gap_absolute: 1e-6,
            pbt_optimize_gamma: false,
        }
    }
}

/// How MPI ranks share the work (`--workflow`; EXARL's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Workflow {
    /// Every actor rank samples on its own (rollout and inference workers, as on one machine) and sends its
    /// trajectories to the learner rank, which trains and sends versioned weights back.
    Async,
    /// As `async`, in lockstep rounds (EXARL's sync learner): every actor rank samples its share of a dataset with the
    /// current weights and waits; the learner trains on the round's dataset and sends the new weights, which start
    /// the next round (`--async_rl=false` across the ranks).
    Sync,
}

/// Distribution across machines under `mpirun` (EXARL's structure: see `rlf_comm::layout`).
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
#[serde(default)]
pub struct DistributedConfig {
    /// Run as one rank of an MPI job (start with `mpirun`; a build with the `mpi` feature).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub mpi: bool,
    /// Ranks that learn (the first ones); the others are actor ranks.
    #[arg(long)]
    pub learner_procs: usize,
    /// Ranks per env group: the group's first rank samples, and each split's envs are stepped over all its ranks.
    #[arg(long)]
    pub process_per_env: usize,
    /// How the ranks share the work.
    #[arg(long, value_enum)]
    pub workflow: Workflow,
    /// With several learner ranks, every this many SGD steps the learners compare digests of their weights, which
    /// must be bit-identical (a difference stops the run); 0: never.
    #[arg(long)]
    pub check_weights_every: u64,
}

/// The reference values (one learner rank, one rank per env, the async workflow).
impl Default for DistributedConfig {
    fn default() -> Self {
        Self {
            mpi: false,
            learner_procs: 1,
            process_per_env: 1,
            workflow: Workflow::Async,
            check_weights_every: 0,
        }
    }
}

/// The shipped default settings for `env` and `algo`, as TOML, if there are any (an env's APPO settings are not
/// DQN's: without settings of its own, DQN starts from the reference values).
pub fn shipped_config(env: &str, algo: Algo) -> Option<&'static str> {
    match algo {
        Algo::Dqn => {
            return match env {
                "CartPole-v1" => Some(include_str!("../configs/CartPole-v1-dqn.toml")),
                "Acrobot-v1" => Some(include_str!("../configs/Acrobot-v1-dqn.toml")),
                "MountainCar-v0" => Some(include_str!("../configs/MountainCar-v0-dqn.toml")),
                "treasurehunt" => Some(include_str!("../configs/treasurehunt-dqn.toml")),
                _ => None,
            };
        }
        Algo::Sac => {
            return match env {
                "Pendulum-v1" => Some(include_str!("../configs/Pendulum-v1-sac.toml")),
                _ => None,
            };
        }
        Algo::Appo => {}
    }
    match env {
        "CartPole-v1" => Some(include_str!("../configs/CartPole-v1.toml")),
        "Acrobot-v1" => Some(include_str!("../configs/Acrobot-v1.toml")),
        "MountainCar-v0" => Some(include_str!("../configs/MountainCar-v0.toml")),
        "MountainCarContinuous-v0" => Some(include_str!("../configs/MountainCarContinuous-v0.toml")),
        "Pendulum-v1" => Some(include_str!("../configs/Pendulum-v1.toml")),
        "connect_four" => Some(include_str!("../configs/connect_four.toml")),
        "treasurehunt" => Some(include_str!("../configs/treasurehunt.toml")),
        "minatar_breakout" => Some(include_str!("../configs/minatar_breakout.toml")),
        atari if atari.starts_with("atari_") => Some(include_str!("../configs/atari.toml")),
        doom if doom.starts_with("doom_") => Some(include_str!("../configs/doom.toml")),
        _ => None,
    }
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

/// The whole configuration of a training run.
#[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Environment and seeds.
    #[command(flatten)]
    #[serde(flatten)]
    pub env: EnvConfig,
    /// Rollout and inference workers.
    #[command(flatten)]
    #[serde(flatten)]
    pub sampling: SamplingConfig,
    /// The network.
    #[command(flatten)]
    #[serde(flatten)]
    pub model: ModelConfig,
    /// APPO.
    #[command(flatten)]
    #[serde(flatten)]
    pub appo: AppoConfig,
    /// The optimiser, whatever the algorithm.
    #[command(flatten)]
    #[serde(flatten)]
    pub optimizer: OptimizerConfig,
    /// Off-policy learning.
    #[command(flatten)]
    #[serde(flatten)]
    pub off_policy: OffPolicyConfig,
    /// The run.
    #[command(flatten)]
    #[serde(flatten)]
    pub run: RunConfig,
    /// Checkpoints and restarts.
    #[command(flatten)]
    #[serde(flatten)]
    pub checkpoint: CheckpointingConfig,
    /// Population-based training.
    #[command(flatten)]
    #[serde(flatten)]
    pub pbt: PbtConfig,
    /// Distribution across machines.
    #[command(flatten)]
    #[serde(flatten)]
    pub distributed: DistributedConfig,
}

impl Config {
    /// The defaults for `env` learned by `algo`: the reference values, then the shipped config.
    pub fn for_env_defaults(env: &str, algo: Algo) -> Result<Config> {
        let mut config = Config {
            env: EnvConfig {
                env: env.to_owned(),
                ..EnvConfig::default()
            },
            ..Config::default()
        };
        if let Some(text) = shipped_config(env, algo) {
            let origin = PathBuf::from(match algo {
                Algo::Appo => format!("configs/{env}.toml"),
                off_policy => format!("configs/{env}-{}.toml", off_policy.name()),
            });
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
        // A value that is no algorithm is reported below, naming where it was written.
        let algo = given("algo")
            .and_then(|value| Algo::deserialize(value.clone()).ok())
            .unwrap_or(OffPolicyConfig::default().algo);
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

    /// Transitions in one training dataset.
    pub fn dataset_size(&self) -> usize {
        self.appo.batch_size * self.appo.num_batches_per_epoch
    }

    /// Networks the run's inference workers run: every policy and, with `--self_play`, every
    /// snapshot in the pools (each group of workers runs its own, [`Config::inference_groups`]).
    /// Network `i < num_policies` is policy `i`; then come the snapshots of policy 0, of policy 1,
    /// and so on ([`Config::snapshot_network`]).
    pub fn num_networks(&self) -> usize {
        let s = &self.sampling;
        s.num_policies * (1 + if s.self_play { s.opponent_pool_size } else { 0 })
    }

    /// The network of snapshot `slot` of policy `policy`'s pool.
    pub fn snapshot_network(&self, policy: usize, slot: usize) -> usize {
        let s = &self.sampling;
        s.num_policies + policy * s.opponent_pool_size + slot
    }

    /// Steps per chunk of backpropagation through time (`--recurrence`, -1 standing for `--rollout`).
    pub fn recurrence(&self) -> usize {
        usize::try_from(self.appo.recurrence).unwrap_or(self.sampling.rollout)
    }

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
            ("--algo dqn or sac", self.off_policy.algo.is_off_policy()),
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
        self.refuse_off_policy_normalization()
    }

    /// Settings a run of `--algo dqn` or `--algo sac` refuses to train with, which their networks and learners do not
    /// read (an experiment saved with them before they were refused still loads for `enjoy` and `eval`: they never
    /// applied).
    pub fn refuse_off_policy_normalization(&self) -> Result<()> {
        if !self.off_policy.algo.is_off_policy() {
            return Ok(());
        }
        for (flag, on) in [
            ("--normalize_input", self.model.normalize_input),
            ("--normalize_returns", self.model.normalize_returns),
        ] {
            if on {
                return Err(RlfError::Config(format!(
                    "{flag} is not supported with --algo {} yet",
                    self.off_policy.algo.name()
                )));
            }
        }
        if !matches!(
            self.optimizer.lr_schedule,
            LrScheduleKind::Constant | LrScheduleKind::LinearDecay
        ) {
            let kind = self.optimizer.lr_schedule.to_possible_value();
            return Err(RlfError::Config(format!(
                "--lr_schedule {} adapts to APPO's KL divergence; --algo {} takes constant or linear_decay",
                kind.as_ref().map_or("", |v| v.get_name()),
                self.off_policy.algo.name()
            )));
        }
        Ok(())
    }

    /// The checks of `--algo dqn` and `--algo sac` that need no env: what they support so far, and settings in
    /// range (the env's action spaces are checked by [`crate::plan::RunPlan::resolve`]).
    fn validate_off_policy(&self) -> Result<()> {
        let err = |m: String| Err(RlfError::Config(m));
        let o = &self.off_policy;
        let algo = o.algo.name();
        for (flag, on) in [
            ("--self_play", self.sampling.self_play),
            ("--with_pbt", self.pbt.with_pbt),
            ("--async_rl=false", !self.run.async_rl),
        ] {
            if on {
                return err(format!("{flag} is not supported with --algo {algo} yet"));
            }
        }
        if o.algo == Algo::Sac
            && (!self.model.encoder_conv_layers.0.is_empty()
                || self.model.encoder_conv_architecture != ConvArchitecture::None
                || self.model.obs_scale != 1.0)
        {
            return err(
                "--algo sac takes unscaled observations and MLP encoders only: drop --encoder_conv_layers, \
                 --encoder_conv_architecture and --obs_scale"
                    .into(),
            );
        }
        if o.n_step == 0 || o.publish_interval == 0 || o.target_update_interval == 0 {
            return err(
                "--n_step, --publish_interval and --target_update_interval must be at least 1".into(),
            );
        }
        if o.replay_buffer_size < self.appo.batch_size {
            return err(format!(
                "--replay_buffer_size ({}) must hold at least one --batch_size ({})",
                o.replay_buffer_size, self.appo.batch_size
            ));
        }
        if !(o.tau > 0.0 && o.tau <= 1.0) {
            return err(format!("--tau must be in (0, 1], got {}", o.tau));
        }
        if self.run.serial_mode && o.replay_ratio <= 0.0 {
            return err(format!("--serial_mode with --algo {algo} needs --replay_ratio > 0 (one loop trains what the ratio says)"));
        }
        if !(o.replay_ratio >= 0.0 && o.replay_ratio.is_finite()) {
            return err(format!(
                "--replay_ratio must be 0 (no limit) or more, got {}",
                o.replay_ratio
            ));
        }
        if !(o.prioritized_replay_alpha >= 0.0 && o.prioritized_replay_alpha.is_finite()) {
            return err(format!(
                "--prioritized_replay_alpha must be 0 or more, got {}",
                o.prioritized_replay_alpha
            ));
        }
        if !(o.prioritized_replay_eps > 0.0 && o.prioritized_replay_eps.is_finite()) {
            return err(format!(
                "--prioritized_replay_eps must be more than 0, got {}",
                o.prioritized_replay_eps
            ));
        }
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

    /// How raw continuous actions reach the env: SAC's actor acts in [−1, 1], scaled to the bounds; APPO's
    /// Gaussian samples as `--continuous_action_mode` says.
    pub fn action_mode(&self) -> ContinuousActionMode {
        if self.off_policy.algo == Algo::Sac {
            ContinuousActionMode::Scale
        } else {
            self.model.continuous_action_mode
        }
    }

    /// The built-in players self-play mixes into the opponents (`--self_play_builtin_opponents`),
    /// in order.
    pub fn builtin_opponents(&self) -> Vec<&str> {
        self.sampling
            .self_play_builtin_opponents
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .collect()
    }

    /// The network id that stands for built-in opponent `k` (of
    /// [`builtin_opponents`](Config::builtin_opponents)) in the slots: past every policy and
    /// snapshot. No inference worker runs it: the rollout worker asks the env for its actions.
    pub fn builtin_network(&self, k: usize) -> usize {
        self.num_networks() + k
    }

    /// The policy whose weights network `network` holds (its own, or a snapshot of them).
    pub fn policy_of_network(&self, network: usize) -> usize {
        let s = &self.sampling;
        if network < s.num_policies {
            network
        } else {
            (network - s.num_policies) / s.opponent_pool_size.max(1)
        }
    }

    /// Groups of inference workers, each with its own queue of requests: one per policy (serving
    /// its networks), or a single one that serves every network (one policy, or
    /// `--shared_policy_workers`).
    pub fn inference_groups(&self) -> usize {
        let s = &self.sampling;
        if s.shared_policy_workers > 0 {
            1
        } else {
            s.num_policies
        }
    }

    /// Inference workers in each group ([`Config::inference_groups`]).
    pub fn workers_per_inference_group(&self) -> usize {
        let s = &self.sampling;
        if s.shared_policy_workers > 0 {
            s.shared_policy_workers
        } else {
            s.policy_workers_per_policy
        }
    }

    /// The group of inference workers that runs network `network`.
    pub fn inference_group_of_network(&self, network: usize) -> usize {
        if self.inference_groups() == 1 {
            0
        } else {
            self.policy_of_network(network)
        }
    }

    /// Envs across all rollout workers.
    pub fn total_envs(&self) -> usize {
        self.sampling.num_workers * self.sampling.num_envs_per_worker
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
            ("--batch_size", a.batch_size),
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
        if a.batch_size % s.rollout != 0 {
            return err(format!(
                "--batch_size ({}) must be a multiple of --rollout ({}): minibatches hold whole trajectories",
                a.batch_size, s.rollout
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
        if !self.model.encoder_conv_layers.0.is_empty()
            && self.model.encoder_conv_architecture != ConvArchitecture::None
        {
            return err(
                "--encoder_conv_layers and --encoder_conv_architecture both choose the convolutions: give one".into(),
            );
        }
        if self.off_policy.algo.is_off_policy() {
            self.validate_off_policy()?;
        } else if self.off_policy.prioritized_replay {
            return err("--prioritized_replay needs a replay buffer: --algo dqn or --algo sac".into());
        }
        if self.off_policy.exploration_duration_mu != 0.0 && self.off_policy.algo != Algo::Dqn {
            return err(format!(
                "--exploration_duration_mu holds DQN's ε-greedy exploratory actions; --algo {} explores otherwise",
                self.off_policy.algo.name()
            ));
        }
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
        let unit = [
            ("--gamma", a.gamma),
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
        ];
        if let Some((name, v)) = positive.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
            return err(format!("{name} must be a positive number, got {v}"));
        }
        let finite = [
            ("--ppo_clip_value", a.ppo_clip_value),
            ("--value_loss_coeff", a.value_loss_coeff),
            ("--exploration_loss_coeff", a.exploration_loss_coeff),
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
        if self.run.serial_mode
            || self.off_policy.algo.is_off_policy()
            || self.sampling.num_policies > 1
            || self.sampling.self_play
        {
            return err("--mpi runs APPO with one policy on ranks in parallel mode so far (no --serial_mode, --algo dqn|sac, --num_policies above 1 or --self_play)");
        }
        Ok(())
    }

    /// The resolved configuration as a flat TOML table, the format `--config` reads.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| RlfError::Config(format!("cannot serialise the config: {e}")))
    }
}

/// The slot of a pool of `pool_size` that a policy's snapshot `number` (1, 2, ...) goes into: in turn, except that
/// with `keep_first` (`--self_play_keep_first`) the first keeps slot 0 and the others take turns in the rest.
pub fn snapshot_slot(number: u64, pool_size: usize, keep_first: bool) -> usize {
    let pool = pool_size.max(1) as u64;
    let n = number.max(1) - 1;
    let slot = match (keep_first && pool > 1, n) {
        (true, 0) => 0,
        (true, n) => 1 + (n - 1) % (pool - 1),
        (false, n) => n % pool,
    };
    slot as usize
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

#[cfg(test)]
mod tests {
    use super::snapshot_slot;

    /// Snapshots 1..=7 in a pool of 3: in turn, or with the first kept in slot 0 and the others in slots 1 and 2.
    #[test]
    fn snapshots_take_turns_in_their_slots() {
        let slots = |keep_first| {
            (1..=7)
                .map(|n| snapshot_slot(n, 3, keep_first))
                .collect::<Vec<_>>()
        };
        assert_eq!(slots(false), [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(slots(true), [0, 1, 2, 1, 2, 1, 2]);
        assert_eq!(snapshot_slot(5, 1, true), 0);
    }
}
