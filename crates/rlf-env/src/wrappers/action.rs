use crate::{Action, BoxSpace, Env, EnvError, Frame, Space, Step};

/// The `Box` action space of `env`, or an [`EnvError::Unsupported`] naming the wrapper.
fn box_action_space<'a, E: Env>(env: &'a E, wrapper: &str) -> Result<&'a BoxSpace, EnvError> {
    match env.action_space() {
        Space::Box(b) => Ok(b),
        other => Err(EnvError::Unsupported {
            env: env.id().to_owned(),
            what: format!("{wrapper} of a {other} action space"),
        }),
    }
}

/// The slice of a continuous action of the expected length, or an [`EnvError::InvalidAction`].
fn continuous<'a>(env: &str, space: &Space, action: Action<'a>, len: usize) -> Result<&'a [f32], EnvError> {
    match action {
        Action::Continuous(x) if x.len() == len => Ok(x),
        _ => Err(EnvError::InvalidAction {
            env: env.to_owned(),
            action: action.to_string(),
            space: space.to_string(),
        }),
    }
}

/// Clips `Box` actions into the env's bounds before stepping, as Gymnasium's `ClipAction`; the
/// wrapper accepts any finite or infinite values (its action space is unbounded).
#[derive(Debug, Clone)]
pub struct ClipAction<E> {
    inner: E,
    low: Vec<f32>,
    high: Vec<f32>,
    action_space: Space,
    scratch: Vec<f32>,
}

impl<E: Env> ClipAction<E> {
    /// Wraps `inner`, whose action space must be a `Box`.
    pub fn new(inner: E) -> Result<Self, EnvError> {
        let b = box_action_space(&inner, "ClipAction")?;
        let (low, high) = (b.low().to_vec(), b.high().to_vec());
        let action_space = Space::Box(BoxSpace::uniform(
            f32::NEG_INFINITY,
            f32::INFINITY,
            b.shape().to_vec(),
        )?);
        let scratch = vec![0.0; low.len()];
        Ok(Self {
            inner,
            low,
            high,
            action_space,
            scratch,
        })
    }
}

impl<E: Env> Env for ClipAction<E> {
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
        &self.action_space
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let x = continuous(self.inner.id(), &self.action_space, action, self.scratch.len())?;
        for (((out, v), lo), hi) in self.scratch.iter_mut().zip(x).zip(&self.low).zip(&self.high) {
            *out = v.max(*lo).min(*hi);
        }
        self.inner.step(Action::Continuous(&self.scratch), obs)
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

/// Affinely maps actions from `[min, max]` onto the env's `Box` bounds (which must be finite), as
/// Gymnasium's `RescaleAction`: `low + (high - low) * (a - min) / (max - min)`, clipped to
/// `[low, high]`. The wrapper's action space is `Box(min, max)`.
#[derive(Debug, Clone)]
pub struct RescaleAction<E> {
    inner: E,
    low: Vec<f32>,
    high: Vec<f32>,
    min: f32,
    max: f32,
    action_space: Space,
    scratch: Vec<f32>,
}

impl<E: Env> RescaleAction<E> {
    /// Wraps `inner`; `min < max`, both finite.
    pub fn new(inner: E, min: f32, max: f32) -> Result<Self, EnvError> {
        let b = box_action_space(&inner, "RescaleAction")?;
        if !(min.is_finite() && max.is_finite() && min < max) {
            return Err(EnvError::InvalidSpace(format!(
                "RescaleAction range [{min}, {max}]"
            )));
        }
        if !b.low().iter().chain(b.high()).all(|v| v.is_finite()) {
            return Err(EnvError::Unsupported {
                env: inner.id().to_owned(),
                what: format!("RescaleAction of the unbounded action space {b}"),
            });
        }
        let (low, high) = (b.low().to_vec(), b.high().to_vec());
        let action_space = Space::Box(BoxSpace::uniform(min, max, b.shape().to_vec())?);
        let scratch = vec![0.0; low.len()];
        Ok(Self {
            inner,
            low,
            high,
            min,
            max,
            action_space,
            scratch,
        })
    }
}

impl<E: Env> Env for RescaleAction<E> {
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
        &self.action_space
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let x = continuous(self.inner.id(), &self.action_space, action, self.scratch.len())?;
        let (min, span) = (f64::from(self.min), f64::from(self.max) - f64::from(self.min));
        for (((out, &v), &lo), &hi) in self.scratch.iter_mut().zip(x).zip(&self.low).zip(&self.high) {
            let (lo64, hi64) = (f64::from(lo), f64::from(hi));
            let mapped = lo64 + (hi64 - lo64) * ((f64::from(v) - min) / span);
            *out = (mapped as f32).max(lo).min(hi);
        }
        self.inner.step(Action::Continuous(&self.scratch), obs)
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
    fn clip_action_clips_into_the_bounds() {
        let mut env = ClipAction::new(Counter::continuous(-1.0, 1.0)).unwrap();
        assert_eq!(env.action_space().to_string(), "Box(-inf, inf, (2,), float32)");
        let mut obs = [0.0; 2];
        env.reset(None, &mut obs).unwrap();
        env.step(Action::Continuous(&[3.0, -0.5]), &mut obs).unwrap();
        assert_eq!(env.inner.last_action, [1.0, -0.5]);
        assert!(matches!(
            env.step(Action::Discrete(1), &mut obs),
            Err(EnvError::InvalidAction { .. })
        ));
    }

    #[test]
    fn rescale_action_maps_the_range() {
        let mut env = RescaleAction::new(Counter::continuous(0.0, 10.0), -1.0, 1.0).unwrap();
        assert_eq!(env.action_space().to_string(), "Box(-1.0, 1.0, (2,), float32)");
        let mut obs = [0.0; 2];
        env.reset(None, &mut obs).unwrap();
        env.step(Action::Continuous(&[-1.0, 0.5]), &mut obs).unwrap();
        assert_eq!(env.inner.last_action, [0.0, 7.5]);
        env.step(Action::Continuous(&[2.0, 1.0]), &mut obs).unwrap();
        assert_eq!(env.inner.last_action, [10.0, 10.0]);
    }

    #[test]
    fn action_wrappers_need_a_box() {
        assert!(matches!(
            ClipAction::new(Counter::new(3)),
            Err(EnvError::Unsupported { .. })
        ));
        assert!(matches!(
            RescaleAction::new(Counter::new(3), -1.0, 1.0),
            Err(EnvError::Unsupported { .. })
        ));
        assert!(matches!(
            RescaleAction::new(Counter::continuous(0.0, 1.0), 1.0, 1.0),
            Err(EnvError::InvalidSpace(_))
        ));
    }
}
