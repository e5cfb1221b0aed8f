use crate::{Action, Env, EnvError, Frame, Space, Step};

/// Truncates episodes after `max_episode_steps` steps, as Gymnasium's `TimeLimit`: the step that
/// reaches the limit reports `truncated = true` (possibly together with `terminated`).
#[derive(Debug, Clone)]
pub struct TimeLimit<E> {
    inner: E,
    max_episode_steps: u64,
    elapsed: u64,
}

impl<E: Env> TimeLimit<E> {
    /// Wraps `inner`.
    pub fn new(inner: E, max_episode_steps: u64) -> Self {
        Self {
            inner,
            max_episode_steps,
            elapsed: 0,
        }
    }

    /// The limit.
    pub fn max_episode_steps(&self) -> u64 {
        self.max_episode_steps
    }

    /// The wrapped env.
    pub fn inner(&self) -> &E {
        &self.inner
    }
}

impl<E: Env> Env for TimeLimit<E> {
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
        self.elapsed = 0;
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let mut step = self.inner.step(action, obs)?;
        self.elapsed += 1;
        if self.elapsed >= self.max_episode_steps {
            step.truncated = true;
        }
        Ok(step)
    }
    /// The step count of the episode, then the inner env's state.
    fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        crate::state::put(self.id(), out, &self.elapsed)?;
        self.inner.save_state(out)
    }
    fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        self.elapsed = crate::state::take(self.id(), input)?;
        self.inner.load_state(input)
    }
    /// Sets the inner env's state; the step count of the episode is kept.
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.inner.set_state(state, obs)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Counter;
    use super::*;

    #[test]
    fn truncates_at_the_limit_and_resets_the_count() {
        let mut env = TimeLimit::new(Counter::new(u64::MAX), 3);
        let mut obs = [0.0; 2];
        for _ in 0..2 {
            env.reset(None, &mut obs).unwrap();
            let flags: Vec<bool> = (0..3)
                .map(|_| env.step(Action::Discrete(0), &mut obs).unwrap().truncated)
                .collect();
            assert_eq!(flags, [false, false, true]);
        }
    }

    #[test]
    fn termination_on_the_last_step_keeps_both_flags() {
        let mut env = TimeLimit::new(Counter::new(2), 2);
        let mut obs = [0.0; 2];
        env.reset(None, &mut obs).unwrap();
        env.step(Action::Discrete(0), &mut obs).unwrap();
        let last = env.step(Action::Discrete(0), &mut obs).unwrap();
        assert!(last.terminated && last.truncated);
    }
}
