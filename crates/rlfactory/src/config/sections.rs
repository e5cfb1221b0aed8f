//! The sections of the configuration, one per component, each with `Default` holding the reference values (which
//! are also the flags' defaults).

use std::path::PathBuf;

use clap::{ArgAction, Args, ValueEnum};
use serde::{Deserialize, Serialize};

use super::values::{parse_bool, ConvLayers, Layers};

/// The environment and the seeds.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case", next_help_heading = "Environment and seeds")]
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
#[command(
    rename_all = "snake_case",
    next_help_heading = "Rollout and inference workers"
)]
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
    /// Prioritised fictitious self-play (AlphaStar's): a snapshot opponent is drawn from the pool with weight
    /// `(1 − w)^p`, `w` the latest weights' recent score against it, so the snapshots it still loses to are met
    /// more often. 0 draws them uniformly.
    #[arg(long)]
    pub self_play_pfsp_power: f64,
    /// The temperature the pool's snapshots sample their moves at (self-play): above 1 each snapshot plays a
    /// flatter version of its own policy (its log-probabilities divided by it), so the latest weights meet more
    /// varied positions; 1 plays the snapshots as they were.
    #[arg(long)]
    pub self_play_opponent_temperature: f64,
    /// Main exploiters (AlphaStar's league), self-play: the last N of `--num_policies` policies learn only
    /// against the other (main) policies' latest weights, never their own pools, so each keeps looking for what
    /// the mains lose to; a main meets an exploiter's latest weights with probability `--self_play_exploiter_prob`.
    /// Both sides of such a game are trained. 0: every policy plays its own pool.
    #[arg(long)]
    pub self_play_exploiters: usize,
    /// Probability that a main policy's opponent is an exploiter's latest weights (`--self_play_exploiters`)
    /// rather than the latest weights or a snapshot of its own.
    #[arg(long)]
    pub self_play_exploiter_prob: f64,
    /// An exploiter whose recent win rate against the mains (over about 100 of its games) reaches this goes back to
    /// its initial weights and a fresh optimizer, to look for another hole (AlphaStar resets its main exploiters at
    /// 0.7); 0 never resets.
    #[arg(long)]
    pub self_play_exploiter_reset: f64,
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
            self_play_pfsp_power: 0.0,
            self_play_opponent_temperature: 1.0,
            self_play_exploiters: 0,
            self_play_exploiter_prob: 0.5,
            self_play_exploiter_reset: 0.0,
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

/// The precision of the encoders' products (PyTorch's `torch.set_float32_matmul_precision`, by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum MatmulPrecision {
    /// Float32 throughout.
    Highest,
    /// Mixed precision: each MLP layer multiplies batches of 64 rows or more in bfloat16, and image networks
    /// (`--encoder_conv_architecture`, `--encoder_conv_layers`) convolve and multiply batches of every size in
    /// bfloat16; the outputs, the weights, their gradients and the optimiser's state stay float32. The products are
    /// about twice as fast on a CPU with AVX-512 BF16 or AMX, slower on one without.
    Medium,
    /// `medium` where the CPU multiplies bfloat16 itself (AVX-512 BF16), `highest` elsewhere.
    Auto,
}

impl MatmulPrecision {
    /// Whether the products run in bfloat16 on this machine.
    pub fn bf16(self) -> bool {
        match self {
            MatmulPrecision::Highest => false,
            MatmulPrecision::Medium => true,
            MatmulPrecision::Auto => cpu_multiplies_bf16(),
        }
    }
}

/// Whether this CPU has bfloat16 dot products (AVX-512 BF16; every CPU with AMX has them too).
#[cfg(target_arch = "x86_64")]
fn cpu_multiplies_bf16() -> bool {
    std::arch::is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_multiplies_bf16() -> bool {
    false
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
#[command(rename_all = "snake_case", next_help_heading = "The network")]
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
    /// An encoder of the user's own in place of the built-in ones: the name a binary of their own registered it
    /// under (`rlfactory::model::register_encoder`). Empty: the built-in encoders.
    #[arg(long)]
    pub encoder_custom: String,
    /// Nonlinearity after each hidden layer.
    #[arg(long, value_enum)]
    pub nonlinearity: Nonlinearity,
    /// The precision of the encoders' products (the MLPs, SAC's critics and the image networks): `highest`
    /// (float32), `medium` (bfloat16 products of float32 weights) or `auto` (`medium` on a CPU with AVX-512 BF16,
    /// else `highest`).
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
            encoder_custom: String::new(),
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
#[command(rename_all = "snake_case", next_help_heading = "APPO")]
#[serde(default)]
pub struct AppoConfig {
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
    /// Weight of the lookahead loss (0: none): for a turn-based board game whose env has its rules as a model
    /// (Connect Four), the cross-entropy of the policy against the softmax of each legal move's value looked up in
    /// the rules (the move's reward, or minus γ times the value of the position the opponent then moves in,
    /// `--lookahead_plies`), as AlphaZero's self-play trains its policy towards its search.
    #[arg(long)]
    pub lookahead_coeff: f64,
    /// Temperature of the lookahead's softmax over the moves' values (`--lookahead_coeff`).
    #[arg(long)]
    pub lookahead_temperature: f64,
    /// How deep the lookahead searches (`--lookahead_coeff`): 1, each legal move and the critic's value of the
    /// position it leads to; 2, also each of the opponent's replies there that ends the game, so that a move leaving
    /// the opponent a win is worth that loss whatever the critic says (the position's value for the opponent is the
    /// better of the critic's and its best game-ending reply's reward).
    #[arg(long)]
    pub lookahead_plies: usize,
}

/// The reference values (the command line's defaults).
impl Default for AppoConfig {
    fn default() -> Self {
        Self {
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
            max_policy_lag: 1000,
            num_batches_to_accumulate: 2,
            recurrence: -1,
            lookahead_coeff: 0.0,
            lookahead_temperature: 0.1,
            lookahead_plies: 2,
        }
    }
}

/// The optimiser every algorithm's learners step with: Adam, its learning rate and schedule, and the clipping of the
/// gradients' global norm (APPO's and DQN's; SAC clips none, as the paper).
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case", next_help_heading = "The optimiser")]
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

/// The learning algorithm and what every algorithm learns with: the discount and the minibatch size.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(
    rename_all = "snake_case",
    next_help_heading = "The algorithm, the discount and the minibatch"
)]
#[serde(default)]
pub struct LearningConfig {
    /// The learning algorithm, by its registered name (`crate::algo` registers each; the command line lists them).
    #[arg(long)]
    pub algo: String,
    /// Discount factor.
    #[arg(long)]
    pub gamma: f64,
    /// Transitions per minibatch (of an on-policy dataset, or sampled from a replay buffer).
    #[arg(long)]
    pub batch_size: usize,
}

/// The reference values (the command line's defaults).
impl Default for LearningConfig {
    fn default() -> Self {
        Self {
            algo: DEFAULT_ALGO.to_owned(),
            gamma: 0.99,
            batch_size: 1024,
        }
    }
}

/// The algorithm a run learns with unless told otherwise; its shipped configs are `configs/<env>.toml` (another
/// algorithm's are `configs/<env>-<algo>.toml`).
pub const DEFAULT_ALGO: &str = "appo";

/// Off-policy learning (`--algo dqn`, `--algo sac`): the replay buffer, its rate limit, targets and exploration. The batch
/// size and the discount are [`LearningConfig`]'s, the learning rate, Adam and gradient clipping
/// [`OptimizerConfig`]'s; `--double_q`, `--dueling` and the ε schedule are DQN's.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(
    rename_all = "snake_case",
    next_help_heading = "Off-policy learning (DQN, SAC)"
)]
#[serde(default)]
pub struct OffPolicyConfig {
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
#[command(rename_all = "snake_case", next_help_heading = "The run")]
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
    /// Print the whole resolved config at the start (an experiment saves it in `config.json` either way).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub verbose: bool,
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
            verbose: false,
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

/// Weights & Biases (Sample Factory's flags), through the `wandb` package of the Python environment the binary runs
/// in (the `python` feature).
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[command(rename_all = "snake_case", next_help_heading = "Weights & Biases")]
#[serde(default)]
pub struct WandbConfig {
    /// Log the run to Weights & Biases: the config, the TensorBoard scalars, and the learning curves at the end (the
    /// run lives in the experiment folder's `wandb/`, and a resumed experiment continues it; `WANDB_MODE=offline`
    /// keeps it on this machine).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub with_wandb: bool,
    /// The W&B entity (user or team; empty: the logged-in user's default).
    #[arg(long)]
    pub wandb_user: String,
    /// The W&B project.
    #[arg(long)]
    pub wandb_project: String,
    /// The W&B group of runs (empty: none).
    #[arg(long)]
    pub wandb_group: String,
    /// The W&B job type.
    #[arg(long)]
    pub wandb_job_type: String,
    /// W&B tags, comma-separated.
    #[arg(long)]
    pub wandb_tags: String,
}

/// The reference values (the command line's defaults).
impl Default for WandbConfig {
    fn default() -> Self {
        Self {
            with_wandb: false,
            wandb_user: String::new(),
            wandb_project: "rlfactory".to_owned(),
            wandb_group: String::new(),
            wandb_job_type: "rlfactory".to_owned(),
            wandb_tags: String::new(),
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
#[command(rename_all = "snake_case", next_help_heading = "Checkpoints and restarts")]
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
#[command(rename_all = "snake_case", next_help_heading = "Population-based training")]
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
#[command(
    rename_all = "snake_case",
    next_help_heading = "Distribution across machines (MPI)"
)]
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
    /// The async workflow's messages between ranks on one machine go through shared-memory queues rather than MPI
    /// (when every rank of the job can open the others' queues; otherwise all go through MPI, as with false).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub mpi_shm_links: bool,
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
            mpi_shm_links: true,
        }
    }
}
