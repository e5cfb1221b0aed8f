//! The standard Atari preprocessing (Mnih et al. 2015, Machado et al. 2018), as the wrappers of Stable-Baselines3's
//! `AtariWrapper` and Sample Factory's Atari envs: random no-op starts, frames skipped four at a time with the
//! last two max-pooled, a lost life terminal for learning, FIRE at reset (and after a lost life) for games that
//! wait for it, 84×84 grayscale frames ([`ResizeImage`]), rewards clipped to their sign, the last four frames
//! stacked. They work on any env whose observations are frames (`Box` of shape `(H, W)` or `(H, W, 1)`, values 0 to
//! 255); `atari_<game>` ids put them over ALE through the Gymnasium bridge.

use std::collections::VecDeque;

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use super::ResizeImage;
use crate::{Action, BoxSpace, Env, EnvError, Frame, Info, Space, Step};

/// Starts each episode with a random number of no-op actions (action 0), 1 to `noop_max`.
#[derive(Debug, Clone)]
pub struct NoopReset<E> {
    inner: E,
    noop_max: u32,
    rng: Pcg64Mcg,
}

impl<E: Env> NoopReset<E> {
    /// Wraps `inner`.
    pub fn new(inner: E, noop_max: u32) -> Self {
        Self {
            inner,
            noop_max: noop_max.max(1),
            rng: Pcg64Mcg::seed_from_u64(0),
        }
    }
}

impl<E: Env> Env for NoopReset<E> {
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
        if let Some(seed) = seed {
            self.rng = Pcg64Mcg::seed_from_u64(seed ^ 0x0a7a_5100_0000_0001);
        }
        self.inner.reset(seed, obs)?;
        for _ in 0..self.rng.random_range(1..=self.noop_max) {
            if self.inner.step(Action::Discrete(0), obs)?.done() {
                self.inner.reset(None, obs)?;
            }
        }
        Ok(())
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        self.inner.step(action, obs)
    }
}

/// Repeats each action `skip` times, summing the rewards and stopping early when the episode ends; the
/// observation is the element-wise maximum of the last two frames (Atari renders some objects every other frame).
#[derive(Debug, Clone)]
pub struct MaxAndSkip<E> {
    inner: E,
    skip: u32,
    previous: Vec<f32>,
}

impl<E: Env> MaxAndSkip<E> {
    /// Wraps `inner`; `skip` must be at least 1.
    pub fn new(inner: E, skip: u32) -> Result<Self, EnvError> {
        if skip == 0 {
            return Err(EnvError::Unsupported {
                env: inner.id().to_owned(),
                what: "MaxAndSkip of 0".into(),
            });
        }
        let n = inner.observation_space().flat_dim();
        Ok(Self {
            inner,
            skip,
            previous: vec![0.0; n],
        })
    }
}

impl<E: Env> Env for MaxAndSkip<E> {
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
        for i in 0..self.skip {
            if i + 1 == self.skip && i > 0 {
                self.previous.copy_from_slice(obs);
            }
            let step = self.inner.step(action, obs)?;
            total = Step {
                reward: total.reward + step.reward,
                ..step
            };
            if step.done() {
                return Ok(total);
            }
        }
        if self.skip > 1 {
            for (o, p) in obs.iter_mut().zip(&self.previous) {
                *o = o.max(*p);
            }
        }
        Ok(total)
    }
}

/// Marks the step that loses a life without ending the game with [`Info::life_lost`] (Mnih et al. 2015's
/// episodic life): vector envs record it as terminal for learning, so values do not bootstrap across a lost life,
/// but the game goes on without a reset and the episode's statistics stay those of the whole game (as Sample
/// Factory's, whose episode statistics are recorded under its `EpisodicLifeEnv`). Lives come from the inner env's
/// [`Info::lives`] (ALE's `info["lives"]`); an env that reports none passes through unchanged.
#[derive(Debug, Clone)]
pub struct EpisodicLife<E> {
    inner: E,
    lives: Option<u32>,
}

impl<E: Env> EpisodicLife<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        Self { inner, lives: None }
    }
}

impl<E: Env> Env for EpisodicLife<E> {
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
        self.lives = None;
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let mut step = self.inner.step(action, obs)?;
        if let Some(now) = step.info.lives {
            step.info.life_lost |= self.lives.is_some_and(|before| now < before) && now > 0 && !step.done();
            self.lives = Some(now);
        }
        Ok(step)
    }
}

/// Presses FIRE (action 1), then action 2, after each reset and after each lost life ([`Info::life_lost`]): games
/// such as Breakout wait for FIRE to start and to serve again.
#[derive(Debug, Clone)]
pub struct FireReset<E> {
    inner: E,
}

impl<E: Env> FireReset<E> {
    /// Wraps `inner`, whose action space must be `Discrete` with at least 3 actions.
    pub fn new(inner: E) -> Result<Self, EnvError> {
        match inner.action_space() {
            Space::Discrete { n, .. } if *n >= 3 => Ok(Self { inner }),
            other => Err(EnvError::Unsupported {
                env: inner.id().to_owned(),
                what: format!("FireReset with actions {other} (it needs Discrete of 3 or more)"),
            }),
        }
    }
}

impl<E: Env> Env for FireReset<E> {
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
        self.inner.reset(seed, obs)?;
        for action in [1, 2] {
            if self.inner.step(Action::Discrete(action), obs)?.done() {
                self.inner.reset(None, obs)?;
            }
        }
        Ok(())
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let mut step = self.inner.step(action, obs)?;
        if step.info.life_lost {
            // Serve again within the step: its rewards count, and a game that ends meanwhile ends the step.
            for action in [1, 2] {
                let fired = self.inner.step(Action::Discrete(action), obs)?;
                step.reward += fired.reward;
                if fired.done() {
                    return Ok(Step {
                        reward: step.reward,
                        info: Info {
                            life_lost: false,
                            ..fired.info
                        },
                        ..fired
                    });
                }
            }
        }
        Ok(step)
    }
}

/// Clips each reward to its sign (−1, 0 or 1); the env's own score of an episode, the sum of its unclipped
/// rewards, is reported as its true objective ([`crate::Info::true_objective`]) on its last step.
#[derive(Debug, Clone)]
pub struct ClipReward<E> {
    inner: E,
    score: f64,
}

impl<E: Env> ClipReward<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        Self { inner, score: 0.0 }
    }
}

impl<E: Env> Env for ClipReward<E> {
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
        self.score = 0.0;
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let mut step = self.inner.step(action, obs)?;
        self.score += step.reward;
        if step.done() && step.info.true_objective.is_none() {
            step.info.true_objective = Some(self.score);
        }
        step.reward = if step.reward > 0.0 {
            1.0
        } else if step.reward < 0.0 {
            -1.0
        } else {
            0.0
        };
        Ok(step)
    }
}

/// The last `k` observations, oldest first, as one observation of shape `(k, ...)` (channels first); at reset
/// every one of them is the first observation.
#[derive(Debug, Clone)]
pub struct FrameStack<E> {
    inner: E,
    frames: VecDeque<Vec<f32>>,
    observation_space: Space,
}

impl<E: Env> FrameStack<E> {
    /// Wraps `inner`, whose observations must be a `Box`; `k` at least 1.
    pub fn new(inner: E, k: usize) -> Result<Self, EnvError> {
        let Space::Box(b) = inner.observation_space() else {
            return Err(EnvError::Unsupported {
                env: inner.id().to_owned(),
                what: format!("FrameStack of {}", inner.observation_space()),
            });
        };
        if k == 0 {
            return Err(EnvError::InvalidSpace("FrameStack of 0 frames".into()));
        }
        let repeat = |v: &[f32]| v.repeat(k);
        let stacked = BoxSpace::new(repeat(b.low()), repeat(b.high()), [&[k][..], b.shape()].concat())?;
        let observation_space = Space::Box(if b.bytes() { stacked.into_bytes()? } else { stacked });
        let n = b.size();
        Ok(Self {
            inner,
            frames: (0..k).map(|_| vec![0.0; n]).collect(),
            observation_space,
        })
    }

    fn write(&self, obs: &mut [f32]) {
        let n = self.frames[0].len();
        for (out, frame) in obs.chunks_exact_mut(n).zip(&self.frames) {
            out.copy_from_slice(frame);
        }
    }
}

impl<E: Env> Env for FrameStack<E> {
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
        let mut first = self.frames.pop_back().unwrap_or_default();
        self.inner.reset(seed, &mut first)?;
        for frame in &mut self.frames {
            frame.copy_from_slice(&first);
        }
        self.frames.push_back(first);
        self.write(obs);
        Ok(())
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let mut oldest = self.frames.pop_front().unwrap_or_default();
        let step = self.inner.step(action, &mut oldest);
        self.frames.push_back(oldest);
        let step = step?;
        self.write(obs);
        Ok(step)
    }
}

/// The standard preprocessing over `inner`, an ALE env at one frame per step with grayscale frames: no-op
/// starts (up to 30), four frames per step max-pooled, a lost life terminal for learning, FIRE at reset and after
/// a lost life when `fire` (the game's action 1 is FIRE),
/// 84×84 frames, rewards clipped to their sign (the game's score as the true objective), four frames stacked:
/// observations `(4, 84, 84)` of bytes.
pub fn atari_preprocessing(inner: Box<dyn Env>, fire: bool) -> Result<Box<dyn Env>, EnvError> {
    let env: Box<dyn Env> = Box::new(EpisodicLife::new(MaxAndSkip::new(NoopReset::new(inner, 30), 4)?));
    let env: Box<dyn Env> = if fire { Box::new(FireReset::new(env)?) } else { env };
    Ok(Box::new(FrameStack::new(
        ClipReward::new(ResizeImage::new(env, None, 84, 84)?),
        4,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4×6 "game" whose frame `t` is `t` everywhere except cell (0, t % 6), which is 100 on odd steps only;
    /// reward `t` per step (negative every third); over after `end` steps. It records its actions.
    struct Frames {
        t: u32,
        end: u32,
        resets: u32,
        actions: Vec<i64>,
        /// Lose one of 3 lives every this many steps (the game ends with the last), if set.
        life_every: Option<u32>,
        observation_space: Space,
        action_space: Space,
    }

    impl Frames {
        fn new(end: u32) -> Self {
            Self {
                t: 0,
                end,
                resets: 0,
                actions: Vec::new(),
                life_every: None,
                observation_space: Space::Box(
                    BoxSpace::uniform(0.0, 255.0, vec![4, 6])
                        .unwrap()
                        .into_bytes()
                        .unwrap(),
                ),
                action_space: Space::discrete(4),
            }
        }
        fn draw(&self, obs: &mut [f32]) {
            obs.fill(self.t as f32);
            if self.t % 2 == 1 {
                obs[(self.t % 6) as usize] = 100.0;
            }
        }
    }

    impl Env for Frames {
        fn id(&self) -> &str {
            "Frames"
        }
        fn observation_space(&self) -> &Space {
            &self.observation_space
        }
        fn action_space(&self) -> &Space {
            &self.action_space
        }
        fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
            self.t = 0;
            self.resets += 1;
            self.draw(obs);
            Ok(())
        }
        fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
            let Action::Discrete(a) = action else {
                unreachable!()
            };
            self.actions.push(a);
            self.t += 1;
            self.draw(obs);
            let sign = if self.t % 3 == 0 { -1.0 } else { 1.0 };
            let lives = self.life_every.map(|every| 3u32.saturating_sub(self.t / every));
            Ok(Step {
                reward: sign * f64::from(self.t),
                terminated: self.t >= self.end || lives == Some(0),
                truncated: false,
                info: Info {
                    lives,
                    ..Info::default()
                },
            })
        }
    }

    #[test]
    fn max_and_skip_sums_four_rewards_and_pools_the_last_two_frames() {
        let mut env = MaxAndSkip::new(Frames::new(100), 4).unwrap();
        let mut obs = [0.0; 24];
        env.reset(None, &mut obs).unwrap();
        let step = env.step(Action::Discrete(2), &mut obs).unwrap();
        // Rewards 1 + 2 − 3 + 4; frames 3 (100 at cell 3) and 4: their maximum.
        assert_eq!(step.reward, 4.0);
        assert_eq!(obs[3], 100.0);
        assert!(obs.iter().enumerate().all(|(i, &v)| i == 3 || v == 4.0));
        // Stopping early at the episode's end: no pooling, the last frame.
        let mut short = MaxAndSkip::new(Frames::new(2), 4).unwrap();
        short.reset(None, &mut obs).unwrap();
        let step = short.step(Action::Discrete(0), &mut obs).unwrap();
        assert!(step.terminated && step.reward == 3.0 && obs.iter().all(|&v| v == 2.0));
    }

    #[test]
    fn noop_reset_takes_between_one_and_thirty_noops_seeded() {
        let mut counts = Vec::new();
        for seed in 0..40 {
            let mut env = NoopReset::new(Frames::new(1000), 30);
            let mut obs = [0.0; 24];
            env.reset(Some(seed), &mut obs).unwrap();
            assert!(env.inner.actions.iter().all(|&a| a == 0));
            counts.push(env.inner.actions.len());
            let mut again = NoopReset::new(Frames::new(1000), 30);
            again.reset(Some(seed), &mut obs).unwrap();
            assert_eq!(again.inner.actions.len(), env.inner.actions.len(), "seeded");
        }
        assert!(counts.iter().all(|&n| (1..=30).contains(&n)), "{counts:?}");
        assert!(counts.iter().max() > counts.iter().min(), "{counts:?}");
    }

    #[test]
    fn fire_reset_presses_fire_then_two() {
        let mut env = FireReset::new(Frames::new(1000)).unwrap();
        let mut obs = [0.0; 24];
        env.reset(None, &mut obs).unwrap();
        assert_eq!(env.inner.actions, [1, 2]);
        assert!(FireReset::new(crate::wrappers::testing::Counter::new(1)).is_err());
    }

    #[test]
    fn frames_are_resized_by_areas_and_rounded() {
        let mut env = ResizeImage::new(Frames::new(100), None, 2, 3).unwrap();
        assert_eq!(
            env.observation_space().to_string(),
            "Box(0.0, 255.0, (2, 3), uint8)"
        );
        let mut obs = [0.0; 6];
        env.step(Action::Discrete(0), &mut obs).unwrap();
        // Frame 1: 1 everywhere but 100 at (0, 1); output (0, 0) averages rows 0-1, columns 0-1
        // (25.75), rounded.
        assert_eq!(obs, [26.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(ResizeImage::new(crate::wrappers::testing::Counter::new(1), None, 2, 2).is_err());
    }

    #[test]
    fn a_lost_life_is_terminal_for_learning_but_the_game_goes_on_and_fire_serves_again() {
        let mut game = Frames::new(100);
        game.life_every = Some(5);
        let mut env = FireReset::new(EpisodicLife::new(game)).unwrap();
        let mut obs = [0.0; 24];
        env.reset(None, &mut obs).unwrap();
        // Reset fired (steps 1 and 2); steps 3 and 4 play, step 5 loses a life and serves (6 and 7).
        let steps: Vec<Step> = (0..3)
            .map(|_| env.step(Action::Discrete(3), &mut obs).unwrap())
            .collect();
        assert_eq!(
            steps.iter().map(|s| s.info.life_lost).collect::<Vec<_>>(),
            [false, false, true]
        );
        assert!(steps.iter().all(|s| !s.done()));
        assert_eq!(steps[2].reward, 5.0 - 6.0 + 7.0);
        assert_eq!(env.inner.inner.actions, [1, 2, 3, 3, 3, 1, 2]);
        assert_eq!(env.inner.inner.resets, 1);
        // Steps 8 and 9 play, 10 loses the second life (11 and 12 serve), 13 and 14 play, 15 loses the last: the
        // game is over, no life lost.
        let mut last = Step::default();
        let mut lost = 0;
        for _ in 0..6 {
            last = env.step(Action::Discrete(0), &mut obs).unwrap();
            lost += u32::from(last.info.life_lost);
        }
        assert_eq!(lost, 1);
        assert!(last.terminated && !last.info.life_lost);
        assert_eq!(last.info.lives, Some(0));
        // An env without lives passes through.
        let mut plain = EpisodicLife::new(Frames::new(3));
        plain.reset(None, &mut obs).unwrap();
        assert!((0..3).all(|_| !plain.step(Action::Discrete(0), &mut obs).unwrap().info.life_lost));
    }

    #[test]
    fn a_vector_env_records_a_lost_life_as_terminal_without_ending_the_episode() {
        let mut game = Frames::new(100);
        game.life_every = Some(2);
        let mut venv = crate::VecEnv::new(vec![Box::new(EpisodicLife::new(game))]).unwrap();
        let mut buf = crate::VecBuffers::new(1, 24);
        venv.reset(None, &mut buf.obs).unwrap();
        let mut flags = Vec::new();
        for _ in 0..6 {
            venv.step(crate::ActionBatch::Discrete(&[0]), buf.view()).unwrap();
            flags.push((
                buf.terminated[0],
                venv.infos()[0].episode.map(|e| (e.length, e.episode_return)),
            ));
        }
        // Lives are lost at steps 2 and 4 (terminal for learning, the game goes on: no final observation, no
        // episode); step 6 loses the last one and ends the six-step game.
        assert_eq!(
            flags,
            [
                (false, None),
                (true, None),
                (false, None),
                (true, None),
                (false, None),
                (true, Some((6, 1.0 + 2.0 - 3.0 + 4.0 + 5.0 - 6.0))),
            ]
        );
    }

    #[test]
    fn clip_reward_keeps_the_sign_and_reports_the_score() {
        let mut env = ClipReward::new(Frames::new(4));
        let mut obs = [0.0; 24];
        env.reset(None, &mut obs).unwrap();
        let rewards: Vec<f64> = (0..4)
            .map(|_| env.step(Action::Discrete(0), &mut obs).unwrap().reward)
            .collect();
        assert_eq!(rewards, [1.0, 1.0, -1.0, 1.0]);
        env.reset(None, &mut obs).unwrap();
        let mut last = Step::default();
        for _ in 0..4 {
            last = env.step(Action::Discrete(0), &mut obs).unwrap();
        }
        assert_eq!(last.info.true_objective, Some(1.0 + 2.0 - 3.0 + 4.0));
    }

    #[test]
    fn frame_stack_keeps_the_last_frames_oldest_first() {
        let mut env = FrameStack::new(Frames::new(100), 3).unwrap();
        // A stack of bytes is bytes.
        assert_eq!(
            env.observation_space().to_string(),
            "Box(0.0, 255.0, (3, 4, 6), uint8)"
        );
        let mut obs = [0.0; 72];
        env.reset(None, &mut obs).unwrap();
        assert!(obs.iter().all(|&v| v == 0.0));
        env.step(Action::Discrete(0), &mut obs).unwrap();
        env.step(Action::Discrete(0), &mut obs).unwrap();
        let firsts: Vec<f32> = obs.chunks(24).map(|f| f[5]).collect();
        assert_eq!(firsts, [0.0, 1.0, 2.0]);
        env.step(Action::Discrete(0), &mut obs).unwrap();
        let firsts: Vec<f32> = obs.chunks(24).map(|f| f[5]).collect();
        assert_eq!(firsts, [1.0, 2.0, 3.0]);
    }

    #[test]
    fn the_preprocessing_stacks_four_84_by_84_frames() {
        let tall = |end| {
            let mut f = Frames::new(end);
            f.observation_space = Space::Box(
                BoxSpace::uniform(0.0, 255.0, vec![210, 160])
                    .unwrap()
                    .into_bytes()
                    .unwrap(),
            );
            f
        };
        let mut env = atari_preprocessing(Box::new(tall(10_000)), true).unwrap();
        assert_eq!(
            env.observation_space().to_string(),
            "Box(0.0, 255.0, (4, 84, 84), uint8)"
        );
        let mut obs = vec![0.0; 4 * 84 * 84];
        env.reset(Some(3), &mut obs).unwrap();
        let step = env.step(Action::Discrete(3), &mut obs).unwrap();
        assert!([-1.0, 0.0, 1.0].contains(&step.reward));
        assert!(env.observation_space().contains(&crate::Value::Box(obs)));
    }
}
