use crate::env::{check_action, check_obs_buffer, check_observation};
use crate::{Action, Env, EnvError, Frame, Space, Step};

/// Validates what goes in and out of an env, turning misuse into [`EnvError`]s: the observation
/// buffer must have the space's flat size, actions must belong to the action space (see
/// [`check_action`](crate::check_action)), and observations must not contain NaN. Wrap envs you did
/// not write; [`VecEnv`](crate::VecEnv) performs the same checks itself.
#[derive(Debug, Clone)]
pub struct CheckedEnv<E> {
    inner: E,
}

impl<E: Env> CheckedEnv<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        Self { inner }
    }
}

impl<E: Env> Env for CheckedEnv<E> {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        self.inner.render()
    }
    fn observation_space(&self) -> &Space {
        self.inner.observation_space()
    }
    fn action_space(&self) -> &Space {
        self.inner.action_space()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        check_obs_buffer(self.inner.id(), "reset", self.inner.observation_space(), obs)?;
        self.inner.reset(seed, obs)?;
        check_observation(self.inner.id(), "reset", obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        check_obs_buffer(self.inner.id(), "step", self.inner.observation_space(), obs)?;
        check_action(self.inner.id(), self.inner.action_space(), action)?;
        let step = self.inner.step(action, obs)?;
        check_observation(self.inner.id(), "step", obs)?;
        Ok(step)
    }
    fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        self.inner.save_state(out)
    }
    fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        self.inner.load_state(input)
    }
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        check_obs_buffer(self.inner.id(), "set_state", self.inner.observation_space(), obs)?;
        self.inner.set_state(state, obs)?;
        check_observation(self.inner.id(), "set_state", obs)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Counter;
    use super::*;

    #[test]
    fn rejects_bad_actions_buffers_and_nan() {
        let mut env = CheckedEnv::new(Counter::new(10));
        let mut obs = [0.0; 2];
        env.reset(None, &mut obs).unwrap();
        let err = env.step(Action::Discrete(7), &mut obs).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Counter: action Discrete(7) is not in the action space Discrete(2)"
        );
        let err = env.step(Action::Discrete(0), &mut [0.0; 5]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Counter: step observation buffer: expected 2 values, got 5"
        );
        assert!(env.step(Action::Discrete(1), &mut obs).is_ok());
    }

    struct NanEnv(Space, Space);
    impl Env for NanEnv {
        fn id(&self) -> &str {
            "NanEnv"
        }
        fn observation_space(&self) -> &Space {
            &self.0
        }
        fn action_space(&self) -> &Space {
            &self.1
        }
        fn reset(&mut self, _: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
            obs.fill(0.0);
            Ok(())
        }
        fn step(&mut self, _: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
            obs[1] = f32::NAN;
            Ok(Step::default())
        }
    }

    #[test]
    fn nan_observation_is_an_error() {
        let space = Space::Box(crate::BoxSpace::uniform(-1.0, 1.0, vec![3]).unwrap());
        let mut env = CheckedEnv::new(NanEnv(space, Space::discrete(2)));
        let mut obs = [0.0; 3];
        env.reset(None, &mut obs).unwrap();
        let err = env.step(Action::Discrete(0), &mut obs).unwrap_err();
        assert_eq!(
            err.to_string(),
            "NanEnv: step returned an observation with NaN at flat index 1"
        );
    }
}
