//! [`Learner`] on its loop, with the experiment's checkpoints (one learner per policy).

use rlf_signal::{Component, Ctx, Signal};

use super::{or_fail, sent};
use crate::algo::appo::Appo;
use crate::config::Config;
use crate::env::EnvRegistry;
use crate::error::Result;
use crate::experiment::{CheckpointRequest, Checkpointer};
use crate::learning::{Batch, Learner, PolicyUpdated, TrainingReport};
use crate::runner::plane::{new_model, DataPlane};

/// What the learner emits.
#[derive(Clone, Copy)]
pub(in crate::runner) struct LearnerSignals {
    pub policy_updated: Signal<PolicyUpdated>,
    pub training_reported: Signal<TrainingReport>,
}

/// What the learner's loop builds in its process.
struct Setup {
    learner: Learner,
    /// With an experiment folder: the checkpointer and the counts of the checkpoint resumed from.
    checkpointer: Option<(Checkpointer, CheckpointRequest)>,
}

pub(in crate::runner) struct LearnerNode {
    learner: Option<Learner>,
    setup: Option<Result<Setup>>,
    signals: LearnerSignals,
    checkpointer: Option<Checkpointer>,
    /// The runner's latest counts, for the checkpoint saved at stop.
    progress: CheckpointRequest,
    /// The policy version of the last checkpoint saved.
    saved_version: Option<u64>,
}

impl LearnerNode {
    /// The learner of policy `policy`, in its loop's process; with an experiment folder it
    /// continues from the policy's newest intact checkpoint.
    pub fn new(
        policy: usize,
        cfg: &Config,
        registry: &EnvRegistry,
        plane: &DataPlane,
        signals: LearnerSignals,
    ) -> Self {
        let setup = new_model(cfg, registry, policy).and_then(|model| {
            let appo = Appo::new(model, &cfg.appo, cfg.run.train_for_env_steps)?;
            let policies = (policy, cfg.sampling.num_policies);
            let mut learner = Learner::new(appo, policies, plane.open_weights(policy)?, plane.open_pools()?);
            let checkpointer = if cfg.run.save_experiment {
                Some(Checkpointer::open_and_resume(cfg, policy, &mut learner)?)
            } else {
                None
            };
            Ok(Setup {
                learner,
                checkpointer,
            })
        });
        Self {
            learner: None,
            setup: Some(setup),
            signals,
            checkpointer: None,
            progress: CheckpointRequest::default(),
            saved_version: None,
        }
    }

    pub fn on_batch_ready(&mut self, ctx: &mut Ctx<'_, Self>, batch: &Batch) {
        let Some(learner) = &mut self.learner else { return };
        let result = learner.on_batch_ready(batch).and_then(|(update, report)| {
            sent(ctx.emit(&self.signals.policy_updated, &update))?;
            sent(ctx.emit(&self.signals.training_reported, &report))
        });
        or_fail(ctx, result);
    }

    pub fn on_progress_reported(&mut self, _ctx: &mut Ctx<'_, Self>, progress: &CheckpointRequest) {
        self.progress.clone_from(progress);
    }

    /// Every `--save_every_sec`: saves, unless no SGD step was taken since the last checkpoint
    /// (requests that queued while the learner was busy then cost nothing).
    pub fn on_checkpoint_requested(&mut self, ctx: &mut Ctx<'_, Self>, request: &CheckpointRequest) {
        self.progress.clone_from(request);
        let version = self.learner.as_ref().map(Learner::version);
        if version.is_some() && version == self.saved_version {
            return;
        }
        let saved = self.save_checkpoint();
        or_fail(ctx, saved);
    }

    fn save_checkpoint(&mut self) -> Result<()> {
        if let (Some(learner), Some(checkpointer)) = (&self.learner, &mut self.checkpointer) {
            checkpointer.save(learner.state()?, &self.progress)?;
            self.saved_version = Some(learner.version());
        }
        Ok(())
    }
}

impl Component for LearnerNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        match self.setup.take() {
            Some(Ok(setup)) => {
                self.learner = Some(setup.learner);
                if let Some((checkpointer, resumed)) = setup.checkpointer {
                    self.checkpointer = Some(checkpointer);
                    self.progress = resumed;
                }
            }
            Some(Err(e)) => ctx.fail(e),
            None => {}
        }
    }

    /// The last checkpoint, whatever stopped the run (the stop conditions, a fault elsewhere,
    /// SIGINT, SIGTERM).
    fn on_stop(&mut self, ctx: &mut Ctx<'_, Self>) {
        let saved = self.save_checkpoint();
        or_fail(ctx, saved);
    }
}
