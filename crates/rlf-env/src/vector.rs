//! [`VecEnv`]: N envs stepped in one call into contiguous buffers, with auto-reset.
//!
//! # Auto-reset convention (Gymnasium 0.29's `final_observation`)
//! When env `i` ends an episode on a step (terminated or truncated), that step still reports the
//! episode's last reward and flags in `rewards[i]`, `terminated[i]`, `truncated[i]`, but `obs` slot
//! `i` already holds the **first observation of the next episode** (the env was reset within the same
//! call). The last observation of the finished episode is kept in
//! [`VecEnv::final_observation`]`(i)` (for bootstrapping a truncated episode) and its return and
//! length in [`VecEnv::infos`]`()[i].episode`, both until the next `step`.

use crate::env::{check_action, check_observation};
use crate::{ActionBatch, Env, EnvError, EnvRegistry, EpisodeStats, Frame, Info, Space};

/// Mutable views of the per-step output arrays of a [`VecEnv`] (or of a
/// [`MultiAgentEnv`](crate::MultiAgentEnv), one slot per agent): slot `i` owns
/// `obs[i * obs_dim..(i + 1) * obs_dim]`, `rewards[i]`, `terminated[i]` and `truncated[i]`. They can
/// point straight into shared memory.
#[derive(Debug)]
pub struct StepBuffers<'a> {
    /// Observations, `slots * obs_dim` values.
    pub obs: &'a mut [f32],
    /// Rewards, one per slot.
    pub rewards: &'a mut [f32],
    /// `terminated` flags, one per slot.
    pub terminated: &'a mut [bool],
    /// `truncated` flags, one per slot.
    pub truncated: &'a mut [bool],
}

impl StepBuffers<'_> {
    /// Checks every array's length for `slots` slots of `obs_dim` values.
    pub fn check(&self, what: &str, slots: usize, obs_dim: usize) -> Result<(), EnvError> {
        let lens = [
            ("observations", self.obs.len(), slots * obs_dim),
            ("rewards", self.rewards.len(), slots),
            ("terminated flags", self.terminated.len(), slots),
            ("truncated flags", self.truncated.len(), slots),
        ];
        match lens.iter().find(|(_, got, expected)| got != expected) {
            None => Ok(()),
            Some(&(name, got, expected)) => Err(EnvError::BufferSize {
                what: format!("{what} {name} buffer"),
                expected,
                got,
            }),
        }
    }
}

/// Owned arrays for [`StepBuffers`], for callers that do not bring their own memory.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VecBuffers {
    /// Observations, `slots * obs_dim` values.
    pub obs: Vec<f32>,
    /// Rewards, one per slot.
    pub rewards: Vec<f32>,
    /// `terminated` flags, one per slot.
    pub terminated: Vec<bool>,
    /// `truncated` flags, one per slot.
    pub truncated: Vec<bool>,
}

impl VecBuffers {
    /// Zeroed arrays for `slots` slots of `obs_dim` values.
    pub fn new(slots: usize, obs_dim: usize) -> Self {
        Self {
            obs: vec![0.0; slots * obs_dim],
            rewards: vec![0.0; slots],
            terminated: vec![false; slots],
            truncated: vec![false; slots],
        }
    }

    /// Borrows all arrays as [`StepBuffers`].
    pub fn view(&mut self) -> StepBuffers<'_> {
        StepBuffers {
            obs: &mut self.obs,
            rewards: &mut self.rewards,
            terminated: &mut self.terminated,
            truncated: &mut self.truncated,
        }
    }
}

/// N single-agent envs with identical spaces, stepped together, auto-resetting (see the module doc
/// for the convention). It validates actions (see [`check_action`](crate::check_action)) and, unless
/// turned off, that observations contain no NaN; errors name the slot.
pub struct VecEnv {
    envs: Vec<Box<dyn Env>>,
    observation_space: Space,
    action_space: Space,
    obs_dim: usize,
    action_dim: usize,
    validate_observations: bool,
    running: Vec<EpisodeStats>,
    infos: Vec<Info>,
    final_obs: Vec<f32>,
    has_final: Vec<bool>,
}

impl std::fmt::Debug for VecEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VecEnv")
            .field("num_envs", &self.envs.len())
            .field("observation_space", &self.observation_space)
            .field("action_space", &self.action_space)
            .finish_non_exhaustive()
    }
}

/// Wraps an env's error with the vector slot it happened in.
pub(crate) fn in_slot(index: usize) -> impl FnOnce(EnvError) -> EnvError {
    move |e| EnvError::InSlot {
        index,
        source: Box::new(e),
    }
}

impl VecEnv {
    /// Env `i` as a picture (see [`Env::render`]): `None` for an env that draws nothing.
    pub fn render(&mut self, i: usize) -> Result<Option<Frame>, EnvError> {
        match self.envs.get_mut(i) {
            Some(env) => env.render(),
            None => Ok(None),
        }
    }

    /// Bundles `envs`, which must be non-empty, share their spaces, and have a discrete, box or
    /// multi-discrete action space.
    pub fn new(envs: Vec<Box<dyn Env>>) -> Result<Self, EnvError> {
        let Some(first) = envs.first() else {
            return Err(EnvError::Unsupported {
                env: "VecEnv".into(),
                what: "a vector of 0 envs".into(),
            });
        };
        let observation_space = first.observation_space().clone();
        let action_space = first.action_space().clone();
        let Some(action_dim) = action_space.action_dim() else {
            return Err(EnvError::Unsupported {
                env: first.id().to_owned(),
                what: format!("the action space {action_space} in a VecEnv"),
            });
        };
        if let Some(i) = envs
            .iter()
            .position(|e| e.observation_space() != &observation_space || e.action_space() != &action_space)
        {
            return Err(in_slot(i)(EnvError::InvalidSpace(format!(
                "{} has spaces {} / {}, slot 0 has {observation_space} / {action_space}",
                envs[i].id(),
                envs[i].observation_space(),
                envs[i].action_space()
            ))));
        }
        let n = envs.len();
        let obs_dim = observation_space.flat_dim();
        Ok(Self {
            envs,
            observation_space,
            action_space,
            obs_dim,
            action_dim,
            validate_observations: true,
            running: vec![EpisodeStats::default(); n],
            infos: vec![Info::default(); n],
            final_obs: vec![0.0; n * obs_dim],
            has_final: vec![false; n],
        })
    }

    /// `n` envs made by `registry` from `id`.
    pub fn from_registry(registry: &EnvRegistry, id: &str, n: usize) -> Result<Self, EnvError> {
        Self::new((0..n).map(|_| registry.make(id)).collect::<Result<_, _>>()?)
    }

    /// Turns the NaN check of observations on (the default) or off.
    pub fn set_validate_observations(&mut self, on: bool) {
        self.validate_observations = on;
    }

    /// Number of envs.
    pub fn num_envs(&self) -> usize {
        self.envs.len()
    }

    /// Flat size of one observation.
    pub fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    /// Numbers per action in an [`ActionBatch`].
    pub fn action_dim(&self) -> usize {
        self.action_dim
    }

    /// The envs' shared observation space.
    pub fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    /// The envs' shared action space.
    pub fn action_space(&self) -> &Space {
        &self.action_space
    }

    /// Resets every env, writing `num_envs * obs_dim` values into `obs`. With `Some(seed)`, env `i`
    /// is seeded with `seed + i`.
    pub fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        let (n, d) = (self.envs.len(), self.obs_dim);
        if obs.len() != n * d {
            return Err(EnvError::BufferSize {
                what: "VecEnv reset observation buffer".into(),
                expected: n * d,
                got: obs.len(),
            });
        }
        for (i, (env, slot)) in self.envs.iter_mut().zip(obs.chunks_exact_mut(d)).enumerate() {
            env.reset(seed.map(|s| s.wrapping_add(i as u64)), slot)
                .map_err(in_slot(i))?;
            if self.validate_observations {
                check_observation(env.id(), "reset", slot).map_err(in_slot(i))?;
            }
        }
        self.running.fill(EpisodeStats::default());
        self.infos.fill(Info::default());
        self.has_final.fill(false);
        Ok(())
    }

    /// Steps every env with its action from `actions` (`num_envs * action_dim` numbers) and writes
    /// the results into `out`, auto-resetting the envs whose episode ended.
    pub fn step(&mut self, actions: ActionBatch<'_>, out: StepBuffers<'_>) -> Result<(), EnvError> {
        let (n, d) = (self.envs.len(), self.obs_dim);
        out.check("VecEnv step", n, d)?;
        if actions.len() != n * self.action_dim {
            return Err(EnvError::BufferSize {
                what: "VecEnv step action batch".into(),
                expected: n * self.action_dim,
                got: actions.len(),
            });
        }
        for (i, (env, slot)) in self.envs.iter_mut().zip(out.obs.chunks_exact_mut(d)).enumerate() {
            let Some(action) = actions.get(i, self.action_dim) else {
                return Err(in_slot(i)(EnvError::BufferSize {
                    what: "VecEnv step action batch".into(),
                    expected: n * self.action_dim,
                    got: actions.len(),
                }));
            };
            check_action(env.id(), &self.action_space, action).map_err(in_slot(i))?;
            let step = env.step(action, slot).map_err(in_slot(i))?;
            if self.validate_observations {
                check_observation(env.id(), "step", slot).map_err(in_slot(i))?;
            }
            out.rewards[i] = step.reward as f32;
            out.terminated[i] = step.terminated || step.info.life_lost;
            out.truncated[i] = step.truncated;
            let running = &mut self.running[i];
            running.episode_return += step.reward;
            running.length += 1;
            if step.done() {
                self.infos[i] = Info {
                    episode: Some(EpisodeStats {
                        true_objective: step.info.true_objective,
                        ..*running
                    }),
                    true_objective: step.info.true_objective,
                    ..Info::default()
                };
                *running = EpisodeStats::default();
                self.final_obs[i * d..(i + 1) * d].copy_from_slice(slot);
                self.has_final[i] = true;
                env.reset(None, slot).map_err(in_slot(i))?;
                if self.validate_observations {
                    check_observation(env.id(), "reset", slot).map_err(in_slot(i))?;
                }
            } else {
                self.infos[i] = step.info;
                self.has_final[i] = false;
            }
        }
        Ok(())
    }

    /// The last observation of the episode env `i` finished on the latest step, if it finished one.
    pub fn final_observation(&self, i: usize) -> Option<&[f32]> {
        match self.has_final.get(i) {
            Some(true) => self.final_obs.get(i * self.obs_dim..(i + 1) * self.obs_dim),
            _ => None,
        }
    }

    /// Per-env infos of the latest step; `episode` is set for the envs that finished an episode.
    pub fn infos(&self) -> &[Info] {
        &self.infos
    }

    /// The envs, e.g. to inspect or replace one.
    pub fn envs_mut(&mut self) -> &mut [Box<dyn Env>] {
        &mut self.envs
    }

    /// Appends every env's state (see [`Env::save_state`]) and the running episodes' statistics to `out`.
    pub fn save_state(&self, out: &mut Vec<u8>) -> Result<(), EnvError> {
        for (i, env) in self.envs.iter().enumerate() {
            env.save_state(out).map_err(in_slot(i))?;
        }
        let id = self.envs.first().map_or("VecEnv", |e| e.id());
        crate::state::put(id, out, &(&self.running, &self.final_obs, &self.has_final))
    }

    /// Takes what [`save_state`](Self::save_state) wrote, for as many envs of the same kind, from the front of
    /// `input`: the envs continue their episodes exactly.
    pub fn load_state(&mut self, input: &mut &[u8]) -> Result<(), EnvError> {
        for (i, env) in self.envs.iter_mut().enumerate() {
            env.load_state(input).map_err(in_slot(i))?;
        }
        let id = self.envs.first().map_or("VecEnv", |e| e.id()).to_owned();
        let (running, final_obs, has_final): (Vec<EpisodeStats>, Vec<f32>, Vec<bool>) =
            crate::state::take(&id, input)?;
        if running.len() != self.envs.len() || final_obs.len() != self.final_obs.len() {
            return Err(EnvError::InvalidState {
                env: id,
                reason: format!(
                    "the saved state is of {} envs, not {}",
                    running.len(),
                    self.envs.len()
                ),
            });
        }
        (self.running, self.final_obs, self.has_final) = (running, final_obs, has_final);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrappers::testing::Counter;
    use crate::wrappers::TimeLimit;
    use crate::Action;

    /// Steps `venv` `steps` times with actions drawn from `actions(step, env)`, recording every observation,
    /// reward and flag.
    fn trace(
        venv: &mut VecEnv,
        from: usize,
        steps: usize,
        actions: impl Fn(usize, usize) -> f32,
    ) -> Vec<u64> {
        let (n, d) = (venv.num_envs(), venv.obs_dim());
        let mut buf = VecBuffers::new(n, d);
        let mut record = Vec::new();
        for t in from..from + steps {
            let a: Vec<f32> = (0..n * venv.action_dim()).map(|i| actions(t, i)).collect();
            let ints: Vec<i64> = a.iter().map(|&x| x as i64).collect();
            let batch = match venv.action_space() {
                Space::Box(_) => ActionBatch::Continuous(&a),
                _ => ActionBatch::Discrete(&ints),
            };
            venv.step(batch, buf.view()).unwrap();
            record.extend(buf.obs.iter().chain(&buf.rewards).map(|v| u64::from(v.to_bits())));
            record.extend(buf.terminated.iter().chain(&buf.truncated).map(|&b| u64::from(b)));
        }
        record
    }

    #[test]
    fn a_loaded_state_continues_the_same_episodes_bit_for_bit() {
        let registry = EnvRegistry::with_builtin();
        for (id, action) in [
            (
                "CartPole-v1",
                (|t, i| ((t * 7 + i * 3) % 5 < 2) as u8 as f32) as fn(usize, usize) -> f32,
            ),
            ("Acrobot-v1", |t, i| ((t + i) % 3) as f32),
            ("MountainCar-v0", |t, i| ((t / 20 + i) % 3) as f32),
            ("MountainCarContinuous-v0", |t, i| ((t + i) as f32 * 0.37).sin()),
            ("Pendulum-v1", |t, i| ((t * 3 + i) as f32 * 0.21).cos() * 2.0),
        ] {
            let mut a = VecEnv::from_registry(&registry, id, 3).unwrap();
            let mut obs = vec![0.0; 3 * a.obs_dim()];
            a.reset(Some(11), &mut obs).unwrap();
            // Past the first episodes' ends (CartPole falls, the time limits of the others).
            trace(&mut a, 0, 230, action);
            let mut saved = Vec::new();
            a.save_state(&mut saved).unwrap();
            let mut b = VecEnv::from_registry(&registry, id, 3).unwrap();
            b.reset(Some(99), &mut obs).unwrap();
            let mut input = &saved[..];
            b.load_state(&mut input).unwrap();
            assert!(input.is_empty(), "{id}: {} bytes left", input.len());
            assert_eq!(
                trace(&mut a, 230, 600, action),
                trace(&mut b, 230, 600, action),
                "{id}"
            );
            let mut fewer = VecEnv::from_registry(&registry, id, 2).unwrap();
            let err = fewer.load_state(&mut &saved[..]).unwrap_err().to_string();
            assert!(err.contains(id), "{err}");
        }
        let err = counters(&[3])
            .save_state(&mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("save_state") && err.contains("slot 0"), "{err}");
    }

    fn counters(lengths: &[u64]) -> VecEnv {
        VecEnv::new(
            lengths
                .iter()
                .map(|&l| Box::new(Counter::new(l)) as Box<dyn Env>)
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn auto_reset_keeps_the_final_observation() {
        let mut venv = counters(&[2, 3]);
        let mut buf = VecBuffers::new(2, 2);
        venv.reset(Some(0), &mut buf.obs).unwrap();
        venv.step(ActionBatch::Discrete(&[0, 1]), buf.view()).unwrap();
        assert_eq!(buf.obs, [1.0, 100.0, 1.0, 100.0]);
        assert_eq!(venv.final_observation(0), None);
        venv.step(ActionBatch::Discrete(&[0, 1]), buf.view()).unwrap();
        assert_eq!(buf.terminated, [true, false]);
        assert_eq!(buf.rewards, [1.0, 1.0]);
        // Slot 0 already holds the next episode's first observation; its last one is kept aside.
        assert_eq!(&buf.obs[..2], [0.0, 0.0]);
        assert_eq!(venv.final_observation(0), Some(&[2.0, 100.0][..]));
        assert_eq!(
            venv.infos()[0].episode,
            Some(EpisodeStats {
                episode_return: 2.0,
                length: 2,
                true_objective: None,
            })
        );
        assert_eq!(venv.infos()[1].episode, None);
        venv.step(ActionBatch::Discrete(&[0, 1]), buf.view()).unwrap();
        assert_eq!(buf.terminated, [false, true]);
        assert_eq!(venv.final_observation(0), None);
        assert_eq!(venv.final_observation(1), Some(&[3.0, 100.0][..]));
        assert_eq!(buf.obs, [1.0, 100.0, 0.0, 0.0]);
    }

    #[test]
    fn truncation_is_reported_and_reset() {
        let envs: Vec<Box<dyn Env>> = vec![Box::new(TimeLimit::new(Counter::new(u64::MAX), 2))];
        let mut venv = VecEnv::new(envs).unwrap();
        let mut buf = VecBuffers::new(1, 2);
        venv.reset(None, &mut buf.obs).unwrap();
        venv.step(ActionBatch::Discrete(&[0]), buf.view()).unwrap();
        venv.step(ActionBatch::Discrete(&[0]), buf.view()).unwrap();
        assert_eq!((buf.terminated[0], buf.truncated[0]), (false, true));
        assert_eq!(venv.final_observation(0), Some(&[2.0, 100.0][..]));
    }

    #[test]
    fn bad_actions_and_buffers_name_the_slot() {
        let mut venv = counters(&[5, 5, 5]);
        let mut buf = VecBuffers::new(3, 2);
        venv.reset(None, &mut buf.obs).unwrap();
        let err = venv
            .step(ActionBatch::Discrete(&[0, 1, 2]), buf.view())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "vector env slot 2: Counter: action Discrete(2) is not in the action space Discrete(2)"
        );
        let err = venv.step(ActionBatch::Discrete(&[0, 1]), buf.view()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "VecEnv step action batch: expected 3 values, got 2"
        );
        let err = venv
            .step(ActionBatch::Continuous(&[0.0, 1.0, 0.0]), buf.view())
            .unwrap_err();
        assert!(matches!(err, EnvError::InSlot { index: 0, .. }), "{err}");
        let mut small = VecBuffers::new(2, 2);
        let err = venv
            .step(ActionBatch::Discrete(&[0, 1, 0]), small.view())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "VecEnv step observations buffer: expected 6 values, got 4"
        );
        assert!(venv.reset(None, &mut [0.0; 5]).is_err());
    }

    #[test]
    fn mismatched_spaces_and_empty_vectors_are_errors() {
        let envs: Vec<Box<dyn Env>> =
            vec![Box::new(Counter::new(1)), Box::new(Counter::continuous(0.0, 1.0))];
        assert!(matches!(
            VecEnv::new(envs),
            Err(EnvError::InSlot { index: 1, .. })
        ));
        assert!(VecEnv::new(Vec::new()).is_err());
    }

    #[test]
    fn seeds_differ_per_slot_and_repeat() {
        let registry = EnvRegistry::with_builtin();
        let mut a = VecEnv::from_registry(&registry, "CartPole-v1", 4).unwrap();
        let mut b = VecEnv::from_registry(&registry, "CartPole-v1", 4).unwrap();
        let (mut oa, mut ob) = (vec![0.0; 16], vec![0.0; 16]);
        a.reset(Some(7), &mut oa).unwrap();
        b.reset(Some(7), &mut ob).unwrap();
        assert_eq!(oa, ob);
        assert_ne!(oa[..4], oa[4..8]);
        let mut single = registry.make("CartPole-v1").unwrap();
        let mut o = [0.0; 4];
        single.reset(Some(8), &mut o).unwrap();
        assert_eq!(o, oa[4..8]);
        single.step(Action::Discrete(0), &mut o).unwrap();
    }
}
