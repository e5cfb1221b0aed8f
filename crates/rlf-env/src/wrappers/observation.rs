use crate::{Action, BoxSpace, Env, EnvError, Frame, Space, Step};

/// `Env` for an observation wrapper (fields `inner` and `observation_space`) whose method `$map` rewrites, in place,
/// every observation the inner env writes.
macro_rules! env_rewriting_observations {
    ($wrapper:ident, $map:ident) => {
        impl<E: Env> Env for $wrapper<E> {
            fn id(&self) -> &str {
                self.inner.id()
            }
            fn render(&mut self) -> Result<Option<Frame>, EnvError> {
                self.inner.render()
            }
            fn observation_space(&self) -> &Space {
                &self.observation_space
            }
            fn action_space(&self) -> &Space {
                self.inner.action_space()
            }
            fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
                self.inner.reset(seed, obs)?;
                self.$map(obs);
                Ok(())
            }
            fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
                let step = self.inner.step(action, obs)?;
                self.$map(obs);
                Ok(step)
            }
            fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
                self.inner.save_state(out)
            }
            fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
                self.inner.load_state(input)
            }
            fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
                self.inner.set_state(state, obs)?;
                self.$map(obs);
                Ok(())
            }
        }
    };
}

/// Clips every observation value into `[low, high]`, as Gymnasium's `ClipObservation`; the
/// observation space becomes the intersection of the env's box and `[low, high]`.
#[derive(Debug, Clone)]
pub struct ClipObservation<E> {
    inner: E,
    low: Vec<f32>,
    high: Vec<f32>,
    observation_space: Space,
}

impl<E: Env> ClipObservation<E> {
    /// Wraps `inner`, whose observation space must be a `Box`; `low <= high`.
    pub fn new(inner: E, low: f32, high: f32) -> Result<Self, EnvError> {
        let Space::Box(b) = inner.observation_space() else {
            return Err(EnvError::Unsupported {
                env: inner.id().to_owned(),
                what: format!(
                    "ClipObservation of a {} observation space",
                    inner.observation_space()
                ),
            });
        };
        if low.is_nan() || high.is_nan() || low > high {
            return Err(EnvError::InvalidSpace(format!(
                "ClipObservation bounds [{low}, {high}]"
            )));
        }
        let new_low: Vec<f32> = b.low().iter().map(|l| l.max(low).min(high)).collect();
        let new_high: Vec<f32> = b.high().iter().map(|h| h.min(high).max(low)).collect();
        let observation_space = Space::Box(BoxSpace::new(
            new_low.clone(),
            new_high.clone(),
            b.shape().to_vec(),
        )?);
        Ok(Self {
            inner,
            low: new_low,
            high: new_high,
            observation_space,
        })
    }

    fn clip(&self, obs: &mut [f32]) {
        for ((v, lo), hi) in obs.iter_mut().zip(&self.low).zip(&self.high) {
            *v = v.clamp(*lo, *hi);
        }
    }
}

env_rewriting_observations!(ClipObservation, clip);

/// Keeps only some values of a flat `Box` observation, in the order given: a partially observed
/// version of a fully observed env (CartPole with `[0, 2]` sees the cart's position and the pole's
/// angle, not their velocities, so a policy needs memory to balance it).
#[derive(Debug, Clone)]
pub struct SelectObservation<E> {
    inner: E,
    keep: Vec<usize>,
    full: Vec<f32>,
    observation_space: Space,
}

impl<E: Env> SelectObservation<E> {
    /// Wraps `inner`, whose observation space must be a `Box`, keeping the values at `keep`
    /// (distinct, within the observation, at least one).
    pub fn new(inner: E, keep: Vec<usize>) -> Result<Self, EnvError> {
        let Space::Box(b) = inner.observation_space() else {
            return Err(EnvError::Unsupported {
                env: inner.id().to_owned(),
                what: format!(
                    "selecting values of a {} observation space",
                    inner.observation_space()
                ),
            });
        };
        let n = b.size();
        let mut seen = vec![false; n];
        for &k in &keep {
            if k >= n || std::mem::replace(&mut seen[k], true) {
                return Err(EnvError::InvalidSpace(format!(
                    "observation values {keep:?} of {}: value {k} is {} (it has {n} values, 0 to {})",
                    inner.id(),
                    if k >= n { "out of range" } else { "named twice" },
                    n.saturating_sub(1)
                )));
            }
        }
        if keep.is_empty() {
            return Err(EnvError::InvalidSpace(format!(
                "observation values of {}: keep at least one",
                inner.id()
            )));
        }
        let pick = |v: &[f32]| keep.iter().map(|&k| v[k]).collect::<Vec<_>>();
        let kept = BoxSpace::new(pick(b.low()), pick(b.high()), vec![keep.len()])?;
        let observation_space = Space::Box(if b.bytes() { kept.into_bytes()? } else { kept });
        Ok(Self {
            inner,
            full: vec![0.0; n],
            keep,
            observation_space,
        })
    }

    fn select(&self, obs: &mut [f32]) {
        for (o, &k) in obs.iter_mut().zip(&self.keep) {
            *o = self.full[k];
        }
    }
}

impl<E: Env> Env for SelectObservation<E> {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        self.inner.render()
    }
    fn observation_space(&self) -> &Space {
        &self.observation_space
    }
    fn action_space(&self) -> &Space {
        self.inner.action_space()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.inner.reset(seed, &mut self.full)?;
        self.select(obs);
        Ok(())
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let step = self.inner.step(action, &mut self.full)?;
        self.select(obs);
        Ok(step)
    }
    fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        self.inner.save_state(out)
    }
    fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        self.inner.load_state(input)
    }
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.inner.set_state(state, &mut self.full)?;
        self.select(obs);
        Ok(())
    }
}

/// The widest bound [`RescaleObservation`] takes.
pub const RESCALE_LIMIT: f32 = 1e6;

/// Maps every value of a `Box` observation with finite bounds affinely from `[low, high]` onto `[-1, 1]`, as
/// Gymnasium's `RescaleObservation`: values of very different scales (MountainCar's position spans 1.8, its velocity
/// 0.14) reach the network on one scale. A value whose bounds are equal is always 0. Bounds must be finite and
/// within ±[`RESCALE_LIMIT`]: Gymnasium writes "unbounded" as the largest `float32` (CartPole's velocities), which
/// rescaled would squeeze every value to 0.
#[derive(Debug, Clone)]
pub struct RescaleObservation<E> {
    inner: E,
    /// Per value: `(x - low) * scale - 1` (0 where the bounds are equal).
    low: Vec<f32>,
    scale: Vec<f32>,
    observation_space: Space,
}

impl<E: Env> RescaleObservation<E> {
    /// Wraps `inner`, whose observation space must be a `Box` with finite bounds.
    pub fn new(inner: E) -> Result<Self, EnvError> {
        let Space::Box(b) = inner.observation_space() else {
            return Err(EnvError::Unsupported {
                env: inner.id().to_owned(),
                what: format!("rescaling a {} observation space", inner.observation_space()),
            });
        };
        let bounded = |v: f32| v.is_finite() && v.abs() <= RESCALE_LIMIT;
        if let Some(k) = (0..b.size()).find(|&k| !bounded(b.low()[k]) || !bounded(b.high()[k])) {
            return Err(EnvError::InvalidSpace(format!(
                "rescaling the observations of {}: value {k} is bounded by [{:e}, {:e}], not within ±{RESCALE_LIMIT:e}",
                inner.id(),
                b.low()[k],
                b.high()[k]
            )));
        }
        let low = b.low().to_vec();
        let scale: Vec<f32> = low
            .iter()
            .zip(b.high())
            .map(|(&lo, &hi)| {
                if hi > lo {
                    (2.0 / (f64::from(hi) - f64::from(lo))) as f32
                } else {
                    0.0
                }
            })
            .collect();
        let bound = |v: f32| {
            scale
                .iter()
                .map(|&s| if s > 0.0 { v } else { 0.0 })
                .collect::<Vec<_>>()
        };
        let observation_space = Space::Box(BoxSpace::new(bound(-1.0), bound(1.0), b.shape().to_vec())?);
        Ok(Self {
            inner,
            low,
            scale,
            observation_space,
        })
    }

    fn rescale(&self, obs: &mut [f32]) {
        for ((v, &lo), &s) in obs.iter_mut().zip(&self.low).zip(&self.scale) {
            *v = if s > 0.0 { (*v - lo) * s - 1.0 } else { 0.0 };
        }
    }
}

env_rewriting_observations!(RescaleObservation, rescale);

#[cfg(test)]
mod tests {
    use super::super::testing::Counter;
    use super::*;

    #[test]
    fn clips_values_and_narrows_the_space() {
        let mut env = ClipObservation::new(Counter::new(10), -5.0, 5.0).unwrap();
        assert_eq!(
            env.observation_space().to_string(),
            "Box(-5.0, 5.0, (2,), float32)"
        );
        let mut obs = [0.0; 2];
        env.reset(None, &mut obs).unwrap();
        env.step(Action::Discrete(0), &mut obs).unwrap();
        assert_eq!(obs, [1.0, 5.0]);
        assert!(ClipObservation::new(Counter::new(10), 1.0, -1.0).is_err());
    }

    #[test]
    fn selects_values_in_the_order_given() {
        let mut env = SelectObservation::new(Counter::new(10), vec![1, 0]).unwrap();
        assert_eq!(
            env.observation_space().to_string(),
            "Box(-10.0, 10.0, (2,), float32)"
        );
        let mut obs = [0.0; 2];
        env.step(Action::Discrete(0), &mut obs).unwrap();
        assert_eq!(obs, [100.0, 1.0]);
        let mut one = SelectObservation::new(Counter::new(10), vec![1]).unwrap();
        let mut obs = [0.0; 1];
        one.step(Action::Discrete(0), &mut obs).unwrap();
        assert_eq!(obs, [100.0]);
        for bad in [vec![], vec![2], vec![0, 0]] {
            let Err(e) = SelectObservation::new(Counter::new(10), bad.clone()) else {
                panic!("{bad:?} was taken");
            };
            assert!(e.to_string().contains("observation values"), "{bad:?}: {e}");
        }
    }

    /// MountainCar's position in [-1.2, 0.6] and velocity in [-0.07, 0.07] both come out in [-1, 1], affinely; an
    /// unbounded observation (CartPole's velocities) is refused, naming the value.
    #[test]
    fn rescales_bounded_values_onto_minus_one_to_one() {
        use crate::classic::{CartPole, MountainCar};
        let mut raw = MountainCar::new();
        let mut env = RescaleObservation::new(MountainCar::new()).unwrap();
        assert_eq!(
            env.observation_space().to_string(),
            "Box(-1.0, 1.0, (2,), float32)"
        );
        let (mut a, mut b) = ([0.0; 2], [0.0; 2]);
        raw.reset(Some(3), &mut a).unwrap();
        env.reset(Some(3), &mut b).unwrap();
        let expected = |x: [f32; 2]| [(x[0] + 1.2) / 0.9 - 1.0, (x[1] + 0.07) / 0.07 - 1.0];
        let close = |x: [f32; 2], y: [f32; 2]| x.iter().zip(&y).all(|(p, q)| (p - q).abs() < 1e-5);
        assert!(close(b, expected(a)), "{b:?} from {a:?}");
        let mut fastest = 0.0f32;
        for t in 0..200 {
            let action = Action::Discrete(if t % 40 < 20 { 0 } else { 2 });
            raw.step(action, &mut a).unwrap();
            env.step(action, &mut b).unwrap();
            assert!(close(b, expected(a)), "step {t}: {b:?} from {a:?}");
            assert!(b.iter().all(|v| (-1.0..=1.0).contains(v)), "step {t}: {b:?}");
            fastest = fastest.max(b[1].abs());
        }
        assert!(fastest > 0.2, "the velocity spans the range: at most {fastest}");
        let Err(e) = RescaleObservation::new(CartPole::new()) else {
            panic!("CartPole's unbounded velocities were rescaled");
        };
        assert!(
            e.to_string()
                .contains("value 1 is bounded by [-3.4028235e38, 3.4028235e38], not within ±1e6"),
            "{e}"
        );
    }
}
