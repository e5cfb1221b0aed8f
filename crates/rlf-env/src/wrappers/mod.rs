//! Wrappers that change one aspect of an env, as Gymnasium's: each owns its inner env (`inner`),
//! forwards everything else, and is itself an [`Env`](crate::Env), so they stack:
//!
//! ```
//! use rlf_env::classic::Pendulum;
//! use rlf_env::wrappers::{ClipAction, EpisodeStatistics, TimeLimit};
//!
//! let env = EpisodeStatistics::new(TimeLimit::new(ClipAction::new(Pendulum::new())?, 200));
//! # Ok::<(), rlf_env::EnvError>(())
//! ```

mod action;
mod atari;
mod checked;
mod episode_statistics;
mod frame_skip;
mod image;
mod observation;
mod time_limit;

pub use action::{ClipAction, RescaleAction};
pub use atari::{
    atari_preprocessing, ClipReward, EpisodicLife, FireReset, FrameStack, MaxAndSkip, NoopReset,
};
pub use checked::CheckedEnv;
pub use episode_statistics::EpisodeStatistics;
pub use frame_skip::FrameSkip;
pub use image::ResizeImage;
pub use observation::{ClipObservation, RescaleObservation, SelectObservation, RESCALE_LIMIT};
pub use time_limit::TimeLimit;

/// The state of a test env shared by the wrapper tests: counts steps, rewards 1 per step, ends
/// after `terminate_after` steps, and echoes the last action into its observation.
#[cfg(test)]
pub(crate) mod testing {
    use crate::{Action, BoxSpace, Env, EnvError, Space, Step};

    pub(crate) struct Counter {
        pub(crate) steps: u64,
        pub(crate) resets: u64,
        pub(crate) terminate_after: u64,
        pub(crate) last_action: Vec<f32>,
        pub(crate) observation_space: Space,
        pub(crate) action_space: Space,
    }

    impl Counter {
        pub(crate) fn new(terminate_after: u64) -> Self {
            Self::with_action_space(terminate_after, Space::discrete(2))
        }

        pub(crate) fn continuous(low: f32, high: f32) -> Self {
            Self::with_action_space(
                u64::MAX,
                Space::Box(BoxSpace::uniform(low, high, vec![2]).expect("valid box")),
            )
        }

        fn with_action_space(terminate_after: u64, action_space: Space) -> Self {
            Self {
                steps: 0,
                resets: 0,
                terminate_after,
                last_action: Vec::new(),
                observation_space: Space::Box(BoxSpace::uniform(-10.0, 10.0, vec![2]).expect("valid box")),
                action_space,
            }
        }
    }

    impl Env for Counter {
        fn id(&self) -> &str {
            "Counter"
        }
        fn observation_space(&self) -> &Space {
            &self.observation_space
        }
        fn action_space(&self) -> &Space {
            &self.action_space
        }
        fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
            self.steps = 0;
            self.resets += 1;
            obs.copy_from_slice(&[0.0, 0.0]);
            Ok(())
        }
        fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
            self.steps += 1;
            self.last_action = match action {
                Action::Discrete(a) => vec![a as f32],
                Action::Continuous(x) => x.to_vec(),
                Action::MultiDiscrete(x) => x.iter().map(|&v| v as f32).collect(),
            };
            obs.copy_from_slice(&[self.steps as f32, 100.0]);
            Ok(Step {
                reward: 1.0,
                terminated: self.steps >= self.terminate_after,
                ..Step::default()
            })
        }
    }
}
