//! [`InferenceWorker`] on its loop.

use rlf_signal::{Component, Ctx, Signal};

use super::{or_fail, sent, NextTurn};
use crate::error::{Result, RlfError};
use crate::model::Policy;
use crate::plan::RunPlan;
use crate::runner::plane::{new_policy, DataPlane};
use crate::sampling::{ActionsReady, Exploration, InferenceWorker, PolicyRequest};

pub(in crate::runner) struct InferenceNode {
    worker: Option<InferenceWorker>,
    setup: Option<Result<InferenceWorker>>,
    /// Requests taken since the last forward pass (see [`InferenceNode::flush`]).
    pending: Vec<PolicyRequest>,
    scheduled: bool,
    /// `actions_ready` of each rollout worker, by worker index.
    actions_ready: Vec<Signal<ActionsReady>>,
    /// To itself: run the forward pass ([`InferenceNode::on_policy_requested`]).
    next_turn: Signal<NextTurn>,
}

impl InferenceNode {
    /// An inference worker of group `group`, in its loop's process, with the group's networks: each policy's
    /// network starts from its learner's seed, then follows the weights that learner publishes; each self-play
    /// snapshot's follows its slot of the pool, sampling at `--self_play_opponent_temperature`.
    pub fn new(
        plan: &RunPlan,
        plane: &DataPlane,
        group: usize,
        actions_ready: Vec<Signal<ActionsReady>>,
        next_turn: Signal<NextTurn>,
    ) -> Self {
        let cfg = &plan.config;
        let num_networks = cfg.num_networks();
        let setup = (0..num_networks)
            .filter(|&n| cfg.inference_group_of_network(n) == group)
            .map(|n| {
                let mut model: Box<dyn Policy> = new_policy(plan, cfg.policy_of_network(n))?;
                let temperature = cfg.sampling.self_play_opponent_temperature;
                if n >= cfg.sampling.num_policies && temperature != 1.0 {
                    model.set_temperature(temperature)?;
                }
                Ok((n, model, plane.open_weights(n)?))
            })
            .collect::<Result<Vec<_>>>()
            .and_then(|networks| {
                let worker = InferenceWorker::for_networks(networks, num_networks, plane.open_pools()?)
                    .with_builtin(cfg.builtin_opponents().len());
                let Some(schedule) = plan.algorithm()?.exploration(cfg) else {
                    return Ok(worker);
                };
                let replays = (0..cfg.sampling.num_policies)
                    .map(|p| plane.open_replay(p))
                    .collect::<Result<Vec<_>>>()?;
                Ok(worker.with_exploration(Exploration { replays, schedule }))
            });
        Self {
            worker: None,
            setup: Some(setup),
            pending: Vec::new(),
            scheduled: false,
            actions_ready,
            next_turn,
        }
    }

    /// Collects the request; every request taken in this turn of the loop goes into one forward
    /// pass on the next turn ([`NextTurn`]).
    pub fn on_policy_requested(&mut self, ctx: &mut Ctx<'_, Self>, request: &PolicyRequest) {
        self.pending.push(*request);
        if !self.scheduled {
            self.scheduled = true;
            let asked = sent(ctx.emit(&self.next_turn, &NextTurn));
            or_fail(ctx, asked);
        }
    }

    /// The forward pass of the requests taken, unless the run is stopping (see [`RolloutNode::on_next_turn`]).
    ///
    /// [`RolloutNode::on_next_turn`]: super::RolloutNode::on_next_turn
    pub fn on_next_turn(&mut self, ctx: &mut Ctx<'_, Self>, _turn: &NextTurn) {
        if ctx.stopping() {
            return;
        }
        self.scheduled = false;
        let Some(worker) = &mut self.worker else { return };
        let requests = std::mem::take(&mut self.pending);
        let result = worker.on_policy_requested(&requests).and_then(|answers| {
            answers.iter().try_for_each(|a| {
                let signal = self
                    .actions_ready
                    .get(a.worker)
                    .ok_or_else(|| RlfError::Protocol {
                        component: "inference worker",
                        message: format!("a request from unknown rollout worker {}", a.worker),
                    })?;
                sent(ctx.emit(signal, a))
            })
        });
        // The vector's allocation is reused by the next batch.
        self.pending = requests;
        self.pending.clear();
        or_fail(ctx, result);
    }
}

impl Component for InferenceNode {
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        match self.setup.take() {
            Some(Ok(w)) => self.worker = Some(w),
            Some(Err(e)) => ctx.fail(e),
            None => {}
        }
    }

    /// The requests taken for the next forward pass, and the worker's generators.
    fn save(&mut self) -> std::result::Result<Option<Vec<u8>>, String> {
        let Some(worker) = &self.worker else {
            return Err("the inference worker did not start".into());
        };
        let worker = worker.save_state().map_err(|e| e.to_string())?;
        postcard::to_stdvec(&(&self.pending, self.scheduled, worker))
            .map(Some)
            .map_err(|e| e.to_string())
    }

    fn restore(&mut self, state: &[u8]) -> std::result::Result<(), String> {
        let (pending, scheduled, kept): (Vec<PolicyRequest>, bool, Vec<u8>) =
            postcard::from_bytes(state).map_err(|e| e.to_string())?;
        let Some(worker) = &mut self.worker else {
            return Err("the inference worker did not start".into());
        };
        worker.load_state(&kept).map_err(|e| e.to_string())?;
        (self.pending, self.scheduled) = (pending, scheduled);
        Ok(())
    }
}
