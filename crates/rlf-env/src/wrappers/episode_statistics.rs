use crate::{Action, Env, EnvError, EpisodeStats, Frame, Space, Step};

/// Accumulates the return and length of the running episode and reports them in
/// [`Info::episode`](crate::Info::episode) on its last step, as Gymnasium's
/// `RecordEpisodeStatistics`.
#[derive(Debug, Clone)]
pub struct EpisodeStatistics<E> {
    inner: E,
    current: EpisodeStats,
}

impl<E: Env> EpisodeStatistics<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        Self {
            inner,
            current: EpisodeStats::default(),
        }
    }

    /// Return and length of the running episode so far.
    pub fn current(&self) -> EpisodeStats {
        self.current
    }
}

impl<E: Env> Env for EpisodeStatistics<E> {
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
        self.current = EpisodeStats::default();
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let mut step = self.inner.step(action, obs)?;
        self.current.episode_return += step.reward;
        self.current.length += 1;
        if step.done() {
            step.info.episode = Some(EpisodeStats {
                true_objective: step.info.true_objective,
                ..self.current
            });
            self.current = EpisodeStats::default();
        }
        Ok(step)
    }
    /// The running episode's statistics, then the inner env's state.
    fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        crate::state::put(self.id(), out, &self.current)?;
        self.inner.save_state(out)
    }
    fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        self.current = crate::state::take(self.id(), input)?;
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
    fn reports_return_and_length_on_the_last_step() {
        let mut env = EpisodeStatistics::new(Counter::new(4));
        let mut obs = [0.0; 2];
        env.reset(None, &mut obs).unwrap();
        for _ in 0..3 {
            assert_eq!(
                env.step(Action::Discrete(1), &mut obs).unwrap().info.episode,
                None
            );
        }
        assert_eq!(
            env.current(),
            EpisodeStats {
                episode_return: 3.0,
                length: 3,
                true_objective: None,
            }
        );
        let last = env.step(Action::Discrete(1), &mut obs).unwrap();
        assert_eq!(
            last.info.episode,
            Some(EpisodeStats {
                episode_return: 4.0,
                length: 4,
                true_objective: None,
            })
        );
        assert_eq!(env.current(), EpisodeStats::default());
    }
}
