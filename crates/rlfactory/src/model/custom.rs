//! A user's own encoder, registered from their own binary as a native env is (`fn main` registers it, then calls
//! [`crate::cli::main`]; every worker process re-enters that `main`, so the registration is there too) and chosen
//! with `--encoder_custom NAME`. It takes the place of the built-in encoders in every network the algorithm builds
//! (APPO's actor and critic, DQN's Q-network, SAC's actor; SAC's critics keep their MLP over the observation and
//! the action), its variables made under the path it is given, so they are
//! saved, loaded, published to the inference workers and optimised as the built-in ones are.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use rlf_env::Space;
use tch::{nn, Tensor};

use crate::config::ModelConfig;
use crate::error::{Result, RlfError};

/// The network of a user's encoder.
pub trait EncoderNet: Send {
    /// The features of a batch of observations: `obs` is `[n, obs_dim]` (the flat observation, divided by
    /// `--obs_scale`); the result `[n, out]`, `out` the size its builder returned. Differentiable in tch's autograd.
    fn forward(&self, obs: &Tensor) -> Tensor;
}

/// Builds a user's encoder for an observation of `space` (`obs_dim` flat values), its variables under `path`
/// (one path per network: the actor's and the critic's are two), from the model's settings: the network and the
/// size of its output.
pub type EncoderBuilder =
    dyn Fn(&nn::Path<'_>, &Space, i64, &ModelConfig) -> Result<(Box<dyn EncoderNet>, i64)> + Send + Sync;

static ENCODERS: Mutex<BTreeMap<String, Arc<EncoderBuilder>>> = Mutex::new(BTreeMap::new());

/// Registers `build` as the encoder `--encoder_custom name` chooses, replacing one of the same name. Call it in
/// `main`, before [`crate::cli::main`].
pub fn register_encoder(
    name: &str,
    build: impl Fn(&nn::Path<'_>, &Space, i64, &ModelConfig) -> Result<(Box<dyn EncoderNet>, i64)>
        + Send
        + Sync
        + 'static,
) {
    ENCODERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(name.to_owned(), Arc::new(build));
}

/// The builder registered as `name`; the error names the registered ones.
pub fn registered_encoder(name: &str) -> Result<Arc<EncoderBuilder>> {
    let encoders = ENCODERS.lock().unwrap_or_else(PoisonError::into_inner);
    encoders.get(name).cloned().ok_or_else(|| {
        let known: Vec<&str> = encoders.keys().map(String::as_str).collect();
        RlfError::Config(format!(
            "--encoder_custom {name}: no encoder of that name is registered in this binary (registered: {}); a \
             binary of your own registers one with rlfactory::model::register_encoder before calling \
             rlfactory::cli::main",
            if known.is_empty() { "none".to_owned() } else { known.join(", ") }
        ))
    })
}
