//! Typed configuration: one struct per component, each with `Default` set to the reference
//! values, composed by [`Config`]; the CLI is generated from the same structs (clap derive, see
//! [`crate::cli`]), each flag's default taken from `Default` ([`Config::flag_defaults`]), so that
//! every reference value is written once. Flag names follow Sample Factory's.
//!
//! # Where values come from, later ones winning
//! 1. [`Config::default`] (the reference values),
//! 2. the shipped defaults for the env (`configs/<env>.toml`, or `configs/<env>-dqn.toml` with `--algo dqn` on the
//!    command line or in the file; see [`shipped_config`]),
//! 3. the file given with `--config FILE`,
//! 4. the values given on the command line,
//!
//! layered by [`Config::layered`], which then applies `--benchmark`'s implications.
//!
//! Config files are flat tables whose keys are flag names (`rollout = 32`,
//! `encoder_mlp_layers = [64, 64]`, `with_vtrace = false`), in TOML, or in JSON for a `.json`
//! file: the `config.json` an experiment folder holds is the resolved config, and
//! [`Config::from_file`] (or `--config`) reads it back.

mod checks;
mod derived;
mod sections;
mod sources;
mod values;

use clap::Args;
use serde::{Deserialize, Serialize};

pub use checks::check_output_file;
pub use derived::snapshot_slot;
pub use sections::*;
pub use sources::{parse_settings, read_settings, shipped_config, Settings};
pub use values::{parse_bool, ConvLayer, ConvLayers, Layers};

/// The most policies a run may train (`--num_policies`): each is a learner process.
pub const MAX_POLICIES: usize = 64;

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
    /// The learning algorithm, the discount and the minibatch size.
    #[command(flatten)]
    #[serde(flatten)]
    pub learning: LearningConfig,
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
    /// Weights & Biases.
    #[command(flatten)]
    #[serde(flatten)]
    pub wandb: WandbConfig,
}
