//! Environments for rlfactory, with Gymnasium's semantics and without per-step allocation.
//!
//! - [`Env`]: one env; `reset` and `step` write the observation into your buffer.
//! - [`Space`]: Discrete, Box, MultiDiscrete, Dict and Tuple; sample, check, describe, flat size.
//! - [`Action`]: a borrowed discrete, continuous or multi-discrete action.
//! - [`EnvRegistry`]: ids to constructors, with the native [`classic`] envs built in.
//! - [`wrappers`]: time limit, episode statistics, frame skip, observation and action clipping,
//!   action rescaling, input checking.
//! - [`VecEnv`]: N envs stepped into contiguous buffers with auto-reset, as rollout workers use.
//! - [`MultiAgentEnv`]: per-agent slots, `is_active` naming the agents that act next (simultaneous
//!   or turn-based); [`SingleAgent`] adapts an `Env`; [`MultiVecEnv`] steps N of them; the native
//!   [`connect_four`] and [`treasurehunt`].
//! - `gym` (feature `python`): any Gymnasium env as an `Env`, through an embedded interpreter.
//! - `pz` (feature `python`): any PettingZoo env (Parallel or AEC API) as a `MultiAgentEnv`, ids
//!   `pz:<module>` and `pza:<module>`.
//!
//! # One env
//! ```
//! use rlf_env::{Action, EnvRegistry};
//!
//! let registry = EnvRegistry::with_builtin();
//! let mut env = registry.make("CartPole-v1")?; // wrapped in its 500-step TimeLimit
//! let mut obs = vec![0.0; env.observation_space().flat_dim()];
//! env.reset(Some(42), &mut obs)?;
//! let mut episode_return = 0.0;
//! loop {
//!     let push = if obs[2] > 0.0 { 1 } else { 0 }; // lean right: push right
//!     let step = env.step(Action::Discrete(push), &mut obs)?;
//!     episode_return += step.reward;
//!     if step.terminated || step.truncated {
//!         break;
//!     }
//! }
//! assert!(episode_return >= 1.0);
//! # Ok::<(), rlf_env::EnvError>(())
//! ```
//!
//! # Many envs, as a rollout worker steps them
//! ```
//! use rlf_env::{ActionBatch, EnvRegistry, VecBuffers, VecEnv};
//!
//! let mut envs = VecEnv::from_registry(&EnvRegistry::with_builtin(), "Pendulum-v1", 8)?;
//! let mut buf = VecBuffers::new(envs.num_envs(), envs.obs_dim()); // or slices of shared memory
//! envs.reset(Some(0), &mut buf.obs)?;
//! let torques = vec![0.5_f32; 8 * envs.action_dim()];
//! for _ in 0..200 {
//!     envs.step(ActionBatch::Continuous(&torques), buf.view())?;
//! }
//! // Pendulum-v1 truncates at 200 steps: every slot was auto-reset, its last observation kept.
//! assert!(buf.truncated.iter().all(|&t| t));
//! assert!(envs.final_observation(3).is_some());
//! assert_eq!(envs.infos()[3].episode.map(|e| e.length), Some(200));
//! # Ok::<(), rlf_env::EnvError>(())
//! ```
//!
//! # Your own env
//! Implement [`Env`] and [`register`](EnvRegistry::register) it; wrap it in
//! [`CheckedEnv`](wrappers::CheckedEnv) to turn bad actions and NaN observations into errors.
//! ```
//! use rlf_env::{Action, Env, EnvError, EnvRegistry, Space, Step};
//!
//! struct Coin { space: Space, heads: bool }
//! impl Env for Coin {
//!     fn id(&self) -> &str { "Coin-v0" }
//!     fn observation_space(&self) -> &Space { &self.space }
//!     fn action_space(&self) -> &Space { &self.space }
//!     fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
//!         obs[0] = 0.0;
//!         Ok(())
//!     }
//!     fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
//!         self.heads = !self.heads;
//!         obs[0] = f32::from(u8::from(self.heads));
//!         let reward = if action == Action::Discrete(i64::from(self.heads)) { 1.0 } else { 0.0 };
//!         Ok(Step { reward, terminated: true, ..Step::default() })
//!     }
//! }
//!
//! let mut registry = EnvRegistry::with_builtin();
//! registry.register("Coin-v0", Some(10), || Ok(Box::new(Coin { space: Space::discrete(2), heads: false })))?;
//! let err = registry.make("Coin-v1").err().expect("not registered");
//! assert!(err.to_string().contains("known ids: Acrobot-v1, CartPole-v1, Coin-v0"));
//! # Ok::<(), rlf_env::EnvError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod classic;
pub mod connect_four;
mod env;
mod error;
#[cfg(feature = "python")]
pub mod gym;
mod multi_agent;
mod multi_vector;
#[cfg(feature = "python")]
pub mod pz;
mod registry;
pub mod space;
pub mod state;
pub mod treasurehunt;
mod vector;
pub mod wrappers;

pub use env::{check_action, check_obs_buffer, check_observation, Env, EpisodeStats, Frame, Info, Step};
pub use error::EnvError;
pub use multi_agent::{AgentEpisodes, MultiAgentEnv, Ply, PlyModel, SingleAgent};
pub use multi_vector::{action_slots, ActionSlots, MultiVecEnv};
pub use registry::{
    parse_kwargs, runs_python, EnvConstructor, EnvKwargs, EnvRegistry, MultiAgentConstructor, GYM_PREFIX,
    PETTINGZOO_AEC_PREFIX, PETTINGZOO_PREFIX,
};
pub use space::{Action, ActionBatch, BoxSpace, Space, Value};
pub use vector::{StepBuffers, VecBuffers, VecEnv};
