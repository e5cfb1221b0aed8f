//! The components on their event loops. Each adapter only turns signals into calls on its
//! component and the results into emits; the logic lives in the component's own module. An error
//! goes to [`Ctx::fail`](rlf_signal::Ctx::fail): the run stops with a fault naming the loop and
//! the object, whatever process it happened in.
//!
//! Adding a component: an adapter here (a struct holding the component and the signals it
//! emits, its slots, its `Component` hooks), then its loop, signals, `connect` lines and
//! constructor in [`build_graph`](super::graph::build_graph).

mod batcher;
mod inference;
mod learner;
mod rollout;
mod runner;

use rlf_signal::{Component, Ctx, EmitError};
use serde::{Deserialize, Serialize};

use crate::error::Result;

pub(super) use batcher::{BatcherNode, BatcherSignals};
pub(super) use inference::InferenceNode;
pub(super) use learner::{LearnerNode, LearnerSignals, TrainTick};
pub(super) use rollout::{RolloutNode, RolloutSignals};
pub(super) use runner::{RunnerNode, RunnerSignals, SummarySlot};

/// A component's signal to itself: do on the loop's next turn what this turn queued (requests for actions, a
/// forward pass), so that two components on one loop cannot answer each other without the loop ever turning. A
/// message rather than a zero-delay timer: it keeps its place among the loop's messages, which a serial run's kept
/// state holds (timers are not kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct NextTurn;

/// An emit into the queue of a loop that is stopping is not an error: the run is ending (a loop
/// that died is reported by the supervisor as a fault).
fn sent(r: Result<(), EmitError>) -> Result<()> {
    match r {
        Err(EmitError::Closed { .. }) | Ok(()) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Stops the run with `result`'s error, if any, as this object's fault.
pub(super) fn or_fail<T: Component + 'static>(ctx: &mut Ctx<'_, T>, result: Result<()>) {
    if let Err(e) = result {
        ctx.fail(e);
    }
}
