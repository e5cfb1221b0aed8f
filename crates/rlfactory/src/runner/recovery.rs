//! After a learner's process died or hung: a checkpoint of the last weights it published.

use rlf_shm::SharedWeights;

use super::plane::new_policy;
use super::summary::Summary;
use crate::algo::TrainingState;
use crate::config::BestMetric;
use crate::error::{Result, RlfError};
use crate::experiment::{CheckpointRequest, Checkpointer};
use crate::model::PolicyWeights;
use crate::plan::RunPlan;

/// Saves the weights (with the normalisers) the lost learner of `policy` last published, so that
/// the run can resume from them. Adam starts afresh; the learning rate is the last one policy 0
/// reported (policy 0's, or the configured one).
pub(super) fn save_published(
    plan: &RunPlan,
    weights: &SharedWeights,
    summary: &Summary,
    policy: usize,
) -> Result<()> {
    let cfg = &plan.config;
    let mut model = new_policy(plan, policy)?;
    let mut published = PolicyWeights {
        values: vec![0.0; weights.len()],
    };
    // Nobody writes any more: a torn read means the learner died while publishing.
    let version = weights.try_read(&mut published.values).map_err(|_| {
        RlfError::EventLoop("the learner died while publishing its weights; they are torn".into())
    })?;
    model.load_weights(&published)?;
    let last_lr = summary.last_metrics.iter().find(|(name, _)| name == "train/lr");
    let lr = last_lr
        .filter(|_| policy == 0)
        .map_or(cfg.optimizer.learning_rate, |(_, lr)| *lr);
    let training = TrainingState {
        version,
        frames_trained: summary.env_frames,
        lr,
    };
    let progress = CheckpointRequest {
        env_steps: summary.env_frames,
        episodes: summary.episodes,
        best_metrics: summary
            .policies
            .iter()
            .map(|p| match cfg.checkpoint.save_best_metric {
                BestMetric::Reward => p.mean_return,
                BestMetric::TrueObjective => p.true_objective,
            })
            .collect(),
    };
    Checkpointer::open(cfg, policy)?.save((model.named_tensors()?, training), &progress, &[])?;
    Ok(())
}
