//! The learner: trains its algorithm (APPO) on each dataset and publishes the new weights with their version into
//! shared memory (a seqlock the inference workers read between batches); `policy_updated` then
//! carries only the version.
//!
//! A dataset arrives as the trajectory slots it is made of ([`Batch`]); the learner trains on
//! tensors that view those slots in shared memory. A dataset that is one whole slot is not copied
//! at all; one made of several slots (or parts of them) is gathered with one copy per field.
//!
//! With several policies, each has its own learner: the steps of its columns that another policy
//! played are invalid to it, like an agent's waiting steps.
//!
//! A self-play main exploiter's learner may go back to its initial weights when it wins too often
//! ([`Learner::reset_when_winning`]): it scores the games its datasets end ([`game_scores`]).

use rlf_shm::SharedWeights;
use tch::Tensor;

use super::{Batch, PolicyUpdated, TrainingReport};
use crate::algo::appo::Dataset;
use crate::algo::{OnPolicyAlgo, TrainingState};
use crate::data::{Field, TrajectoryPool};
use crate::error::{Result, RlfError};
use crate::model::{Draws, NamedTensor};

/// Owns the training state (network, optimiser, version) of one policy.
#[derive(Debug)]
pub struct Learner {
    algo: Box<dyn OnPolicyAlgo>,
    /// The policy trained, and whether the run has other networks (policies or snapshots).
    policy: usize,
    several: bool,
    weights: SharedWeights,
    /// Every rollout worker's trajectory pool, by worker index, mapped for the rest of the
    /// process (the tensors viewing them do not keep them mapped).
    pools: Vec<&'static TrajectoryPool>,
    /// The first dataset's digest was reported.
    digested: bool,
    /// A main exploiter's reset (`--self_play_exploiter_reset`).
    reset: Option<ResetOnWins>,
}

/// Games over which an exploiter's recent win rate is averaged, and the fewest it plays after a reset before the
/// next.
const RESET_WINDOW: f64 = 100.0;

/// Takes a learner back to its initial weights once its recent win rate reaches `threshold`.
#[derive(Debug)]
struct ResetOnWins {
    /// The weights and statistics it started from (no optimizer moments: Adam starts afresh).
    initial: Vec<NamedTensor>,
    threshold: f64,
    /// The moving average of its games' scores, and the games scored since the last reset.
    score: f64,
    games: u64,
    /// Resets so far.
    resets: u64,
}

impl ResetOnWins {
    /// Adds the scores of the games just played; returns whether a reset is due (the win rate over about
    /// [`RESET_WINDOW`] games reached the threshold, with at least that many games since the last), and if so starts
    /// the average and the count again.
    fn record(&mut self, scores: impl IntoIterator<Item = f64>) -> bool {
        for score in scores {
            self.score += (score - self.score) / RESET_WINDOW;
            self.games += 1;
        }
        if self.games < RESET_WINDOW as u64 || self.score < self.threshold {
            return false;
        }
        (self.score, self.games) = (0.5, 0);
        self.resets += 1;
        true
    }
}

/// The scores (1 a win, ½ a draw, 0 a loss, by the sign of the agent's return) of the episodes that end in a
/// time-major `[T * S]` dataset in which the agent acted (`valid`) since its last episode end in the sequence: a
/// turn-based game's loser receives its −1 on the winner's move, a step that is not its own. Truncated episodes
/// are no games.
pub fn game_scores(
    valid: &[f32],
    rewards: &[f32],
    terminated: &[f32],
    truncated: &[f32],
    s: usize,
) -> Vec<f64> {
    let mut scores = Vec::new();
    for q in 0..s {
        let (mut acted, mut sum) = (false, 0.0f32);
        for i in (q..valid.len()).step_by(s.max(1)) {
            acted |= valid[i] > 0.0;
            sum += rewards[i];
            if terminated[i] > 0.0 && acted {
                scores.push(if sum > 0.0 {
                    1.0
                } else if sum < 0.0 {
                    0.0
                } else {
                    0.5
                });
            }
            if terminated[i] > 0.0 || truncated[i] > 0.0 {
                (acted, sum) = (false, 0.0);
            }
        }
    }
    scores
}

impl Learner {
    /// The learner of policy `policy`, in a run of `num_networks` networks (policies and
    /// self-play snapshots), around an algorithm's state (APPO's), publishing into `weights`, reading
    /// trajectories from `pools` (by worker index).
    pub fn new(
        algo: Box<dyn OnPolicyAlgo>,
        (policy, num_networks): (usize, usize),
        weights: SharedWeights,
        pools: Vec<TrajectoryPool>,
    ) -> Self {
        let pools = pools.into_iter().map(|p| &*Box::leak(Box::new(p))).collect();
        Self {
            algo,
            policy,
            several: num_networks > 1,
            weights,
            pools,
            digested: false,
            reset: None,
        }
    }

    /// Makes this learner go back to its current weights (call it before any training or restore: its initial
    /// ones) and a fresh optimizer each time its win rate over about `RESET_WINDOW` games reaches `threshold`
    /// (a main exploiter, `--self_play_exploiter_reset`).
    pub fn reset_when_winning(&mut self, threshold: f64) -> Result<()> {
        self.reset = Some(ResetOnWins {
            initial: self.algo.policy().named_tensors()?,
            threshold,
            score: 0.5,
            games: 0,
            resets: 0,
        });
        Ok(())
    }

    /// The resets so far ([`reset_when_winning`](Self::reset_when_winning)).
    pub fn resets(&self) -> u64 {
        self.reset.as_ref().map_or(0, |r| r.resets)
    }

    /// Scores the games `dataset` ends; returns whether the win rate reached the reset's threshold (the average
    /// and the count start again).
    fn reset_due(&mut self, dataset: &Dataset) -> Result<bool> {
        let Some(reset) = &mut self.reset else {
            return Ok(false);
        };
        let plain = |t: &Tensor| Vec::<f32>::try_from(t.f_to_kind(tch::Kind::Float)?).map_err(RlfError::from);
        let scores = game_scores(
            &plain(&dataset.valid)?,
            &plain(&dataset.rewards)?,
            &plain(&dataset.terminated)?,
            &plain(&dataset.truncated)?,
            dataset.num_sequences,
        );
        Ok(reset.record(scores))
    }

    /// The dataset made of `batch`'s parts, time-major (row `t * S + s`, sequences in the order
    /// of the parts).
    pub fn dataset(&self, batch: &Batch) -> Result<Dataset> {
        let protocol = |message: String| RlfError::Protocol {
            component: "learner",
            message,
        };
        let mut shape = None;
        let mut parts = Vec::with_capacity(batch.parts.len());
        for p in &batch.parts {
            let pool = *self.pools.get(p.worker).ok_or_else(|| {
                protocol(format!("a dataset part from unknown rollout worker {}", p.worker))
            })?;
            let sh = pool.shape();
            if p.num_envs == 0 || p.first_env + p.num_envs > sh.num_envs || shape.is_some_and(|s| s != sh) {
                return Err(protocol(format!(
                    "dataset part {p:?} does not fit the slots of worker {} ({} envs)",
                    p.worker, sh.num_envs
                )));
            }
            shape = Some(sh);
            parts.push((pool, p));
        }
        let Some(sh) = shape else {
            return Err(protocol("a dataset with no part".into()));
        };
        let (s, t) = (parts.iter().map(|(_, p)| p.num_envs).sum::<usize>(), sh.rollout);
        let obs_dim = self.algo.policy().obs_dim() as i64;
        let action_dim = self.algo.policy().action_dim() as i64;
        let takes_bytes = self.algo.policy().takes_bytes();
        let rows = |field: Field| -> Result<Tensor> {
            let views = parts
                .iter()
                .map(|(pool, p)| {
                    let dim = if field.is_after_last_step() { 0 } else { 1 };
                    Ok(pool
                        .tensor(p.buffer, field)?
                        .f_narrow(dim, p.first_env as i64, p.num_envs as i64)?)
                })
                .collect::<Result<Vec<_>>>()?;
            let whole = match views.as_slice() {
                [one] => one.shallow_clone(),
                _ => Tensor::f_cat(&views, if field.is_after_last_step() { 0 } else { 1 })?,
            };
            let width = sh.width(field) as i64;
            let shaped = match field {
                // Slots are as wide as the largest agent's observation: this policy's agents
                // fill the first values. Observations stored as bytes become floats here, or stay bytes
                // (copied out of the buffer) for a network that takes them.
                Field::Obs | Field::FinalObs | Field::NextObs => {
                    let mine = whole.f_reshape([-1, width])?.f_narrow(1, 0, obs_dim.min(width))?;
                    match mine.kind() {
                        tch::Kind::Float => mine,
                        tch::Kind::Uint8 if takes_bytes => {
                            let mut copy = Tensor::f_empty(mine.size(), (tch::Kind::Uint8, mine.device()))?;
                            copy.f_copy_(&mine)?;
                            copy
                        }
                        _ => mine.f_to_kind(tch::Kind::Float)?,
                    }
                }
                // Action slots are as wide as the largest agent's action: this policy's fill the first values.
                Field::Actions => whole
                    .f_reshape([-1, width])?
                    .f_narrow(1, 0, action_dim.min(width))?,
                Field::States => whole.f_reshape([-1, width])?,
                _ => whole.f_reshape([-1])?,
            };
            Ok(shaped)
        };
        let mut versions = vec![0; s * t];
        let mut column = 0;
        for (pool, p) in &parts {
            let v = pool.versions(p.buffer)?;
            for step in 0..t {
                for i in 0..p.num_envs {
                    versions[step * s + column + i] = v[step * sh.num_envs + p.first_env + i];
                }
            }
            column += p.num_envs;
        }
        let mut valid = rows(Field::Valid)?;
        if self.several {
            let mine = rows(Field::Policy)?
                .f_eq(self.policy as f64)?
                .f_to_kind(tch::Kind::Float)?;
            valid = valid.f_mul(&mine)?;
        }
        Ok(Dataset {
            num_sequences: s,
            seq_len: t,
            obs: rows(Field::Obs)?,
            actions: rows(Field::Actions)?,
            log_probs: rows(Field::LogProbs)?,
            values: rows(Field::Values)?,
            rewards: rows(Field::Rewards)?,
            terminated: rows(Field::Terminated)?,
            truncated: rows(Field::Truncated)?,
            valid,
            has_final: rows(Field::HasFinal)?,
            final_obs: rows(Field::FinalObs)?,
            next_obs: rows(Field::NextObs)?,
            next_valid: rows(Field::NextValid)?,
            versions,
            states: (sh.state_dim > 0).then(|| rows(Field::States)).transpose()?,
        })
    }

    /// The policy this learner trains.
    pub fn policy(&self) -> usize {
        self.policy
    }

    /// The policy version (SGD steps taken).
    pub fn version(&self) -> u64 {
        self.algo.version()
    }

    /// Publishes the current weights and their version.
    pub fn publish(&self) -> Result<PolicyUpdated> {
        let values = self.algo.policy().weights()?.values;
        super::publish_weights(&self.weights, self.policy, self.algo.version(), &values)
    }

    /// What the learner needs besides its checkpoint to continue exactly (a serial run's kept state): the generator
    /// of its minibatches' orders and the weights it last published, which inference reads.
    pub fn kept(&self) -> Result<(Draws, (u64, Vec<f32>))> {
        Ok((
            self.algo.draws().clone(),
            super::read_published(&self.weights, self.policy)?,
        ))
    }

    /// Continues from what [`kept`](Self::kept) saved, after the checkpoint was restored.
    pub fn restore_kept(&mut self, (draws, (version, values)): (Draws, (u64, Vec<f32>))) -> Result<()> {
        self.algo.set_draws(draws);
        super::publish_weights(&self.weights, self.policy, version, &values).map(drop)
    }

    /// Calls `f` after every SGD step (see [`OnPolicyAlgo::set_after_step`]).
    pub fn set_after_step(&mut self, f: Box<dyn FnMut() + Send>) {
        self.algo.set_after_step(f);
    }

    /// Trains as one of several learners of the policy (see [`OnPolicyAlgo::set_gradient_sync`]).
    pub fn set_gradient_sync(&mut self, sync: Box<dyn crate::algo::adam::GradientSync>) {
        self.algo.set_gradient_sync(sync);
    }

    /// This learner trains no more: tells the other learners of the policy.
    pub fn finish_sync(&mut self) -> Result<()> {
        self.algo.finish_sync()
    }

    /// Replaces the hyper-parameters PBT mutates.
    pub fn set_hyper(&mut self, hyper: &crate::pbt::Hyper) {
        self.algo.set_hyper(hyper);
    }

    /// Takes another policy's weights, statistics and Adam's moments from its checkpoint's
    /// `tensors` (PBT), and publishes them under this policy's next version.
    pub fn adopt(&mut self, tensors: &[NamedTensor]) -> Result<PolicyUpdated> {
        self.algo.policy_mut().load_named_tensors(tensors)?;
        self.algo.adopt(tensors)?;
        self.publish()
    }

    /// Publishes the current weights into `pool_slot` (a self-play snapshot's shared weights) as
    /// version `number`, the snapshot's number; returns the policy version they hold.
    pub fn snapshot(&self, pool_slot: &SharedWeights, number: u64) -> Result<u64> {
        let values = self.algo.policy().weights()?.values;
        if values.len() != pool_slot.len() {
            return Err(crate::RlfError::WeightMismatch(format!(
                "{} values for a snapshot buffer of {}",
                values.len(),
                pool_slot.len()
            )));
        }
        pool_slot.publish(number, &values);
        Ok(self.algo.version())
    }

    /// Slot of `batch_ready`: trains on the dataset; returns the new weights and the metrics.
    pub fn on_batch_ready(&mut self, batch: &Batch) -> Result<(PolicyUpdated, TrainingReport)> {
        let dataset = self.dataset(batch)?;
        // Only the run's first dataset is digested (the digest reads every value).
        let dataset_digest = if self.digested {
            None
        } else {
            self.digested = true;
            Some(dataset.digest()?)
        };
        let mut metrics: Vec<(String, f64)> = {
            let _flush = rlf_shm::process::FlushDenormals::new();
            self.algo.train(&dataset)?
        }
        .into_iter()
        .collect();
        let update = if self.reset_due(&dataset)? {
            let initial = self.reset.as_ref().map(|r| r.initial.clone()).unwrap_or_default();
            self.adopt(&initial)?
        } else {
            self.publish()?
        };
        if let Some(reset) = &self.reset {
            metrics.push(("self_play/exploiter_resets".into(), reset.resets as f64));
        }
        let report = TrainingReport {
            policy: self.policy,
            version: self.algo.version(),
            metrics,
            dataset_digest,
        };
        Ok((update, report))
    }

    /// What a checkpoint holds: the weights and statistics by name, Adam's moments (named
    /// `adam.exp_avg.<parameter>` and `adam.exp_avg_sq.<parameter>`), and the training state.
    pub fn state(&self) -> Result<(Vec<NamedTensor>, TrainingState)> {
        let mut tensors = self.algo.policy().named_tensors()?;
        tensors.extend(self.algo.optimizer_state()?);
        Ok((tensors, self.algo.training_state()))
    }

    /// Continues from a checkpoint's weights, statistics, Adam's moments and training state.
    /// Returns whether the moments were in it (without them Adam starts afresh).
    pub fn restore(&mut self, tensors: &[NamedTensor], state: TrainingState) -> Result<bool> {
        self.algo.policy_mut().load_named_tensors(tensors)?;
        self.algo.restore_training_state(tensors, state)
    }
}

#[cfg(test)]
mod tests {
    use super::{game_scores, ResetOnWins, RESET_WINDOW};

    #[test]
    fn an_exploiter_resets_once_its_recent_win_rate_reaches_the_threshold_and_then_starts_counting_again() {
        let mut reset = ResetOnWins {
            initial: Vec::new(),
            threshold: 0.7,
            score: 0.5,
            games: 0,
            resets: 0,
        };
        let window = RESET_WINDOW as usize;
        // Even play never reaches 0.7, however long.
        assert!(!reset.record((0..5 * window).map(|g| (g % 2) as f64)));
        assert_eq!(reset.resets, 0);
        // Wins from here: the average climbs from about ½ and crosses 0.7 after about 50 games, in one batch of them.
        assert!(reset.record(std::iter::repeat_n(1.0, window)));
        assert_eq!((reset.resets, reset.games, reset.score), (1, 0, 0.5));
        // After a reset, even a run of wins waits for a window's worth of games.
        assert!(!reset.record(std::iter::repeat_n(1.0, window - 1)));
        assert!(reset.record([1.0]));
        assert_eq!(reset.resets, 2);
    }

    #[test]
    fn the_games_a_dataset_ends_are_scored_by_the_sign_of_the_agents_return() {
        // (valid, reward, terminated, truncated) of each step of three sequences of four steps.
        let sequences = [
            // The agent acts at steps 0 and 2, and loses on the winner's move (a step not its own).
            [(1, 0, 0, 0), (0, 0, 0, 0), (1, 0, 0, 0), (0, -1, 1, 0)],
            // Another policy's episode ends at step 1 (no game of the agent's), then the agent wins.
            [(0, 0, 0, 0), (0, 1, 1, 0), (1, 0, 0, 0), (1, 1, 1, 0)],
            // A truncated episode is no game; the next ends in a draw.
            [(1, 0, 0, 0), (0, 0, 0, 1), (1, 0, 0, 0), (0, 0, 1, 0)],
        ];
        let s = sequences.len();
        let column = |k: usize| -> Vec<f32> {
            (0..4)
                .flat_map(|t| sequences.iter().map(move |q| q[t]))
                .map(|(v, r, d, c)| [v, r, d, c][k] as f32)
                .collect()
        };
        let scores = game_scores(&column(0), &column(1), &column(2), &column(3), s);
        assert_eq!(scores, vec![0.0, 1.0, 0.5]);
    }
}
