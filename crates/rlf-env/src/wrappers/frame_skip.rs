use crate::{Action, Env, EnvError, Frame, Space, Step};

/// Repeats each action `skip` times, summing the rewards and stopping early when the episode ends;
/// the observation is the last one.
#[derive(Debug, Clone)]
pub struct FrameSkip<E> {
    inner: E,
    skip: u32,
}

impl<E: Env> FrameSkip<E> {
    /// Wraps `inner`; `skip` must be at least 1.
    pub fn new(inner: E, skip: u32) -> Result<Self, EnvError> {
        if skip == 0 {
            return Err(EnvError::Unsupported {
                env: inner.id().to_owned(),
                what: "FrameSkip of 0".into(),
            });
        }
        Ok(Self { inner, skip })
    }
}

impl<E: Env> Env for FrameSkip<E> {
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
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let mut total = Step::default();
        for _ in 0..self.skip {
            let step = self.inner.step(action, obs)?;
            total = Step {
                reward: total.reward + step.reward,
                ..step
            };
            if step.done() {
                break;
            }
        }
        Ok(total)
    }
    fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        self.inner.save_state(out)
    }
    fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        self.inner.load_state(input)
    }
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.inner.set_state(state, obs)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Counter;
    use super::*;

    #[test]
    fn repeats_and_stops_at_the_end() {
        let mut env = FrameSkip::new(Counter::new(5), 2).unwrap();
        let mut obs = [0.0; 2];
        env.reset(None, &mut obs).unwrap();
        let first = env.step(Action::Discrete(1), &mut obs).unwrap();
        assert_eq!((first.reward, obs[0]), (2.0, 2.0));
        env.step(Action::Discrete(1), &mut obs).unwrap();
        let last = env.step(Action::Discrete(1), &mut obs).unwrap();
        assert_eq!((last.reward, last.terminated, obs[0]), (1.0, true, 5.0));
        assert!(FrameSkip::new(Counter::new(5), 0).is_err());
    }
}
