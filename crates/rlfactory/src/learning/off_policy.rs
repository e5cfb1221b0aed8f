//! The off-policy learner of one policy: it sleeps on its replay buffer's insert counter until the buffer holds
//! what its next batch needs (`--learning_starts`, and what the rate limit of `--replay_ratio` allows), samples
//! uniformly, takes an SGD step of its algorithm ([`OffPolicyAlgo`]: DQN or SAC), records its samples (which lets writers held back by the rate limit go
//! on), and publishes its weights every `--publish_interval` steps through the seqlock.
//!
//! With `--prioritized_replay` it draws by priority instead ([`PrioritizedSampler`]), weights the loss by importance
//! and sets the drawn transitions' priorities from their TD errors after each step.
//!
//! Training goes in rounds ([`OffPolicyLearner::train_round`]): a wait until a deadline, then SGD steps while the
//! buffer allows them without waiting, up to a limit; so its event loop keeps answering between rounds. In serial
//! mode, where a wait would block the one loop, the buffer has no rate limit and the learner takes, after each
//! trajectory, the steps that keep the ratio ([`OffPolicyLearner::train_due`]).

use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;
use rlf_shm::{ReplayRing, SharedWeights, Wait};
use serde::{Deserialize, Serialize};

use super::prioritized::{PrioritizedSampler, SavedPriorities};
use super::{PolicyUpdated, TrainingReport};
use crate::algo::TrainingState;
use crate::algo::{OffPolicyAlgo, Transitions};
use crate::data::TransitionLayout;
use crate::error::{Result, RlfError};
use crate::model::NamedTensor;

/// What a round of training did.
#[derive(Debug)]
pub enum Round {
    /// SGD steps were taken: the metrics of the last, and the weights published if any.
    Trained {
        /// The report of the round.
        report: TrainingReport,
        /// The last publication of the round.
        update: Option<PolicyUpdated>,
    },
    /// The buffer did not reach the next batch's target before the deadline.
    Waited,
    /// The buffer was interrupted or closed: the run is stopping.
    Stopped,
}

/// A copy of a policy's replay buffer for its checkpoint ([`OffPolicyLearner::replay_snapshot`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplaySnapshot {
    /// The insert number of the first row.
    pub first: u64,
    /// Consecutive inserts, whole rows of `row_words` words.
    pub rows: Vec<f32>,
    /// Words per row.
    pub row_words: usize,
    /// Samples the learner had taken.
    pub sampled: u64,
    /// With prioritised replay: the rows' priorities.
    pub priorities: Option<SavedPriorities>,
}

impl ReplaySnapshot {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.rows.len() / self.row_words.max(1)
    }

    /// Whether it holds no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// Owns the training state of one off-policy policy and its view of the policy's replay buffer.
#[derive(Debug)]
pub struct OffPolicyLearner {
    algo: Box<dyn OffPolicyAlgo>,
    policy: usize,
    weights: SharedWeights,
    replay: ReplayRing,
    layout: TransitionLayout,
    batch_size: usize,
    learning_starts: u64,
    publish_interval: u64,
    /// The buffer's interrupt epoch when the learner started.
    epoch: u32,
    rng: Pcg64Mcg,
    indices: Vec<u64>,
    rows: Vec<f32>,
    /// The sampled rows with their byte-valued observation parts unpacked (when the layout packs any).
    decoded: Vec<f32>,
    /// `--replay_ratio`, for [`train_due`](Self::train_due).
    replay_ratio: f64,
    /// SGD steps taken since the buffer's insert counter started: in this process, plus the resumed version when
    /// the buffer was resumed with it.
    steps: u64,
    prioritized: Option<Prioritized>,
    /// `--lr_schedule linear_decay`: the initial learning rate, and the inserts over which it falls to 0.
    lr_decay: Option<(f64, u64)>,
    /// The inserts the SGD steps restored from a checkpoint stood for when the run resumed without its buffer
    /// (which then starts empty), which the schedules over inserts count as done.
    inserts_before: u64,
}

/// An off-policy learner's kept state ([`OffPolicyLearner::kept`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct KeptLearner {
    rng: Pcg64Mcg,
    steps: u64,
    inserts_before: u64,
    last_beta: Option<f64>,
    published: (u64, Vec<f32>),
    /// The algorithm's own generator ([`OffPolicyAlgo::sampler_state`]).
    algo: Option<Vec<u8>>,
}

/// Prioritised replay's state in the learner.
#[derive(Debug)]
struct Prioritized {
    sampler: PrioritizedSampler,
    /// β at the start, and the inserts over which it rises to 1.
    beta: (f64, u64),
    /// β of the last batch.
    last_beta: f64,
    weights: Vec<f32>,
    td_errors: Vec<f32>,
}

/// SGD steps of one round at most, and its time at most (the loop answers messages between rounds).
const ROUND_STEPS: usize = 64;
const ROUND_TIME: Duration = Duration::from_millis(50);

impl OffPolicyLearner {
    /// The learner of policy `policy` training `algo` on batches of `batch_size` from `replay` (rows of `layout`),
    /// publishing into `weights`; sampling is seeded by `seed`.
    pub fn new(
        algo: Box<dyn OffPolicyAlgo>,
        policy: usize,
        weights: SharedWeights,
        replay: ReplayRing,
        layout: TransitionLayout,
        (batch_size, learning_starts, publish_interval): (usize, u64, u64),
        seed: u64,
    ) -> Result<Self> {
        if replay.row_words() != layout.row_words() {
            return Err(RlfError::Protocol {
                component: "learner",
                message: format!(
                    "policy {policy}: replay rows of {} words, its transitions take {}",
                    replay.row_words(),
                    layout.row_words()
                ),
            });
        }
        Ok(Self {
            epoch: replay.interrupts(),
            algo,
            policy,
            weights,
            replay,
            batch_size: batch_size.max(1),
            learning_starts,
            publish_interval: publish_interval.max(1),
            rng: Pcg64Mcg::seed_from_u64(seed),
            replay_ratio: 0.0,
            steps: 0,
            prioritized: None,
            lr_decay: None,
            inserts_before: 0,
            indices: Vec::new(),
            rows: vec![0.0; batch_size.max(1) * layout.row_words()],
            decoded: Vec::new(),
            layout,
        })
    }

    /// Keeps `ratio` samples per insert by counting ([`train_due`](Self::train_due)), for serial mode.
    pub fn with_replay_ratio(self, ratio: f64) -> Self {
        Self {
            replay_ratio: ratio,
            ..self
        }
    }

    /// The learning rate falls linearly from `lr` to 0 over `inserts` inserts into the buffer.
    pub fn with_linear_lr_decay(self, lr: f64, inserts: u64) -> Self {
        Self {
            lr_decay: Some((lr, inserts.max(1))),
            ..self
        }
    }

    /// Draws by priority: `(|TD error| + eps)^alpha`, importance weights at an exponent rising from `beta` to 1
    /// over `inserts` inserts.
    pub fn with_prioritized_replay(self, (alpha, beta, eps): (f64, f64, f64), inserts: u64) -> Self {
        let sampler = PrioritizedSampler::new(self.replay.capacity(), alpha, eps);
        Self {
            prioritized: Some(Prioritized {
                sampler,
                beta: (beta, inserts.max(1)),
                last_beta: beta,
                weights: Vec::new(),
                td_errors: Vec::new(),
            }),
            ..self
        }
    }

    /// What the learner needs besides its checkpoint and its saved buffer to continue exactly (a serial run's kept
    /// state): its sampling generator, the SGD steps the replay ratio counts, β of the last batch, and the weights
    /// last published (older than the checkpoint's when `--publish_interval` is above 1), which inference reads.
    pub fn kept(&self) -> Result<KeptLearner> {
        let published = super::read_published(&self.weights, self.policy)?;
        Ok(KeptLearner {
            rng: self.rng.clone(),
            steps: self.steps,
            inserts_before: self.inserts_before,
            last_beta: self.prioritized.as_ref().map(|p| p.last_beta),
            published,
            algo: self.algo.sampler_state(),
        })
    }

    /// Continues from what [`kept`](Self::kept) saved, after the checkpoint and the buffer were restored: the
    /// weights it had published are published again.
    pub fn restore_kept(&mut self, kept: KeptLearner) -> Result<()> {
        (self.rng, self.steps, self.inserts_before) = (kept.rng, kept.steps, kept.inserts_before);
        if let (Some(p), Some(beta)) = (&mut self.prioritized, kept.last_beta) {
            p.last_beta = beta;
        }
        if let Some(state) = &kept.algo {
            self.algo.load_sampler_state(state)?;
        }
        let (version, values) = kept.published;
        super::publish_weights(&self.weights, self.policy, version, &values).map(drop)
    }

    /// The policy trained.
    pub fn policy(&self) -> usize {
        self.policy
    }

    /// The policy version (SGD steps taken).
    pub fn version(&self) -> u64 {
        self.algo.version()
    }

    /// The insert count the next batch needs.
    fn target(&self) -> u64 {
        self.replay
            .sample_target(self.batch_size as u64)
            .max(self.learning_starts)
            .max(1)
    }

    /// Publishes the current weights and their version.
    pub fn publish(&self) -> Result<PolicyUpdated> {
        let values = self.algo.acting_weights()?.values;
        super::publish_weights(&self.weights, self.policy, self.algo.version(), &values)
    }

    /// Waits until `deadline` at most for the next batch's data, then trains while the buffer allows without
    /// waiting (a bounded number of steps).
    pub fn train_round(&mut self, deadline: Instant) -> Result<Round> {
        match self.replay.wait_for(self.target(), Some(deadline), self.epoch) {
            Wait::Reached(_) => {}
            Wait::Timeout => return Ok(Round::Waited),
            Wait::Interrupted | Wait::Closed => return Ok(Round::Stopped),
        }
        self.train(ROUND_STEPS, Some(Instant::now() + ROUND_TIME))
    }

    /// Serial mode, with no rate limit on the buffer: takes, without waiting, the SGD steps that keep
    /// `--replay_ratio` samples per transition inserted beyond `--learning_starts`.
    pub fn train_due(&mut self) -> Result<Round> {
        let inserted = self.replay.inserted();
        if inserted < self.learning_starts.max(self.batch_size as u64) {
            return Ok(Round::Waited);
        }
        let samples = (inserted - self.learning_starts) as f64 * self.replay_ratio;
        let due = (samples / self.batch_size as f64) as u64;
        match due.saturating_sub(self.steps) {
            0 => Ok(Round::Waited),
            n => self.train(n as usize, None),
        }
    }

    /// Up to `max_steps` SGD steps (until `until` at most, and while a rate-limited buffer allows them).
    fn train(&mut self, max_steps: usize, until: Option<Instant>) -> Result<Round> {
        // Adam's moments of dead units decay into subnormals, which cost the CPU's slow path: see the guard.
        let _flush = rlf_shm::process::FlushDenormals::new();
        let (mut metrics, mut update) = (Default::default(), None);
        for _ in 0..max_steps {
            if let Some((lr, inserts)) = self.lr_decay {
                self.algo.set_lr(lr * (1.0 - self.progress(inserts)).max(0.0));
            }
            let beta_progress = self.prioritized.as_ref().map_or(0.0, |p| self.progress(p.beta.1));
            let rng = &mut self.rng;
            let drawn = match &mut self.prioritized {
                Some(p) => {
                    let beta = p.beta.0 + (1.0 - p.beta.0) * beta_progress.min(1.0);
                    p.last_beta = beta;
                    p.sampler.sample(
                        &self.replay,
                        beta,
                        || rng.random(),
                        &mut self.indices,
                        &mut self.rows,
                        &mut p.weights,
                    )
                }
                None => self.replay.sample_uniform(
                    self.batch_size,
                    |m| rng.random_range(0..m),
                    &mut self.indices,
                    &mut self.rows,
                ),
            };
            if !drawn {
                break;
            }
            let batch = if self.layout.packs() {
                let floats = self.layout.decode(&self.rows, &mut self.decoded);
                Transitions::from_rows(&self.decoded, &floats, self.algo.device())?
            } else {
                Transitions::from_rows(&self.rows, &self.layout, self.algo.device())?
            };
            metrics = match &mut self.prioritized {
                Some(p) => {
                    let batch = batch.weighted(&p.weights)?;
                    let mut metrics = self.algo.train(&batch, Some(&mut p.td_errors))?;
                    p.sampler.update(&self.indices, &p.td_errors);
                    metrics.insert("train/replay_beta".to_owned(), p.last_beta);
                    metrics.insert("train/replay_max_priority".to_owned(), p.sampler.max_priority());
                    metrics
                }
                None => self.algo.train(&batch, None)?,
            };
            self.replay.record_samples(self.batch_size as u64);
            self.steps += 1;
            if self.algo.version() % self.publish_interval == 0 {
                update = Some(self.publish()?);
            }
            let limited = self.replay.rate_limit().is_some() && self.replay.inserted() < self.target();
            if limited || until.is_some_and(|t| Instant::now() >= t) {
                break;
            }
        }
        Ok(Round::Trained {
            report: TrainingReport {
                policy: self.policy,
                version: self.algo.version(),
                metrics: metrics.into_iter().collect(),
                dataset_digest: None,
            },
            update,
        })
    }

    /// The fraction of `inserts` inserted so far, in this run and (by their SGD steps) before a resume.
    fn progress(&self, inserts: u64) -> f64 {
        (self.replay.inserted() + self.inserts_before) as f64 / inserts as f64
    }

    /// Everything a checkpoint holds: the networks' variables, the optimisers' moments, the version.
    pub fn state(&self) -> Result<(Vec<NamedTensor>, TrainingState)> {
        let tensors = self.algo.state_tensors()?;
        let state = TrainingState {
            version: self.algo.version(),
            frames_trained: self.replay.sampled(),
            lr: self.algo.lr(),
        };
        Ok((tensors, state))
    }

    /// Waits until `writers` rollout workers have put their last rows into the replay buffer as the run stops
    /// (`false`: the deadline came first, a writer died or is slow).
    pub fn wait_for_writers(&self, writers: u32, deadline: Instant) -> bool {
        self.replay.wait_for_writers(writers, deadline)
    }

    /// A copy of the replay buffer's visible rows, its samples counter and (prioritised replay) their priorities.
    pub fn replay_snapshot(&self) -> ReplaySnapshot {
        let (first, rows) = self.replay.snapshot();
        let row_words = self.replay.row_words();
        let n = (rows.len() / row_words) as u64;
        ReplaySnapshot {
            first,
            rows,
            row_words,
            sampled: self.replay.sampled(),
            priorities: self.prioritized.as_ref().map(|p| p.sampler.saved(first, n)),
        }
    }

    /// After [`restore`](Self::restore): the replay buffer was restored from the checkpoint's copy (whose rows begin
    /// at insert `first`; `priorities` as saved), so its counters go on from the saved run's, and so do the
    /// schedules and the replay ratio's count of SGD steps.
    pub fn continue_with_restored_buffer(&mut self, first: u64, priorities: Option<&SavedPriorities>) {
        self.inserts_before = 0;
        self.steps = self.algo.version();
        if let (Some(p), Some(saved)) = (&mut self.prioritized, priorities) {
            p.sampler.restore(first, saved);
        }
    }

    /// Continues from a checkpoint's weights, the optimisers' moments and version (target networks start as copies
    /// of the loaded ones). Returns whether everything trained was in it.
    pub fn restore(&mut self, tensors: &[NamedTensor], state: TrainingState) -> Result<bool> {
        // Under a replay ratio, `version` steps of `batch_size` samples stood for the inserts past
        // `--learning_starts` that allowed them; without one there is no telling (0).
        self.inserts_before = match state.version {
            0 => 0,
            _ if self.replay_ratio > 0.0 => {
                let steps = state.version as f64 * self.batch_size as f64 / self.replay_ratio;
                self.learning_starts + steps.round() as u64
            }
            _ => 0,
        };
        self.algo.restore(tensors, state.version)
    }
}

#[cfg(test)]
mod tests {
    use rlf_env::{BoxSpace, Space};

    use super::*;
    use crate::algo::dqn::Dqn;
    use crate::config::{Config, DeviceKind};
    use crate::model::QNetwork;

    /// A serial-mode DQN learner on a fresh ring of 2-value observations (batches of 4, learning from 8 inserts, 2
    /// samples per insert), its rate decaying linearly from 0.01 over 1,000 inserts.
    fn learner() -> OffPolicyLearner {
        tch::manual_seed(0);
        let cfg = Config::for_env("CartPole-v1", &[]).expect("config");
        let obs = Space::Box(BoxSpace::uniform(0.0, 1.0, vec![2]).expect("box"));
        let net =
            || QNetwork::new(&obs, &Space::discrete(2), &cfg.model, false, DeviceKind::Cpu).expect("network");
        let dqn = Dqn::new(net(), net(), &cfg.optimizer, &cfg.off_policy).expect("dqn");
        let layout = TransitionLayout::floats(2, 1);
        let weights =
            SharedWeights::create(dqn.acting_weights().expect("weights").values.len()).expect("weights");
        let ring = ReplayRing::create(64, layout.row_words(), None).expect("ring");
        OffPolicyLearner::new(Box::new(dqn), 0, weights, ring, layout, (4, 8, 1000), 1)
            .expect("learner")
            .with_replay_ratio(2.0)
            .with_linear_lr_decay(0.01, 1000)
    }

    /// The learning rate of the last step of a round of `train_due` after inserting 16 transitions.
    fn rate_after_16_inserts(learner: &mut OffPolicyLearner) -> f64 {
        let layout = TransitionLayout::floats(2, 1);
        let mut row = vec![0.0; layout.row_words()];
        for i in 0..16 {
            layout.write(&mut row, &[0.1, 0.2], &[(i % 2) as f32], 1.0, 0.9, &[0.2, 0.1]);
            learner.replay.insert(&row, None).expect("insert");
        }
        match learner.train_due().expect("train") {
            Round::Trained { report, .. } => report
                .metrics
                .iter()
                .find(|(k, _)| k == "train/lr")
                .map(|&(_, v)| v)
                .expect("train/lr"),
            other => panic!("no steps: {other:?}"),
        }
    }

    /// `--lr_schedule linear_decay` counts the inserts of this run and, after a resume (whose buffer starts empty),
    /// those the restored SGD steps stood for: `--learning_starts` plus steps × batch / ratio.
    #[test]
    fn the_decay_goes_on_from_where_a_resumed_run_left_it() {
        let mut fresh = learner();
        let rate = rate_after_16_inserts(&mut fresh);
        assert!((rate - 0.01 * (1.0 - 16.0 / 1000.0)).abs() < 1e-12, "{rate}");

        let (tensors, mut state) = fresh.state().expect("state");
        state.version = 100;
        let mut resumed = learner();
        assert!(resumed.restore(&tensors, state).expect("restore"));
        let rate = rate_after_16_inserts(&mut resumed);
        // 8 + 100 × 4 / 2 = 208 inserts before, 16 now.
        assert!((rate - 0.01 * (1.0 - 224.0 / 1000.0)).abs() < 1e-12, "{rate}");
    }
}
