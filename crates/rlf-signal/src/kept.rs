//! The state a serial application keeps when it stops ([`AppBuilder::keep_state`](crate::AppBuilder::keep_state)),
//! for a later run of the same graph to continue from exactly
//! ([`AppBuilder::restore_state`](crate::AppBuilder::restore_state)).
//!
//! On one loop every object is between two slots when the stop begins, so the whole application is its objects'
//! states ([`Component::save`](crate::Component::save)) and the messages not yet delivered: the main loop's own
//! queue, the work queues' items, and where their round robins were. It is taken before any `on_stopping` and
//! those messages are then dropped, so that nothing the kept state does not hold happens before the objects'
//! `on_stop`. Timers are not kept: the restored objects' `on_start` sets them again.

use serde::{Deserialize, Serialize};

/// A serial application's objects and undelivered messages when it began to stop.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptState {
    /// The description of the graph it was kept from ([`AppBuilder::describe`](crate::AppBuilder::describe)): a
    /// run of another graph refuses it.
    pub graph: String,
    /// The state of each object that keeps one, by object name.
    pub objects: Vec<(String, Vec<u8>)>,
    /// The main loop's undelivered messages, in order.
    pub(crate) pending: Vec<Vec<u8>>,
    /// Each work queue's undelivered items, in order.
    pub(crate) works: Vec<Vec<Vec<u8>>>,
    /// Each work queue's next consumer loop, and next consumer object.
    pub(crate) submit_rr: Vec<usize>,
    pub(crate) take_rr: Vec<usize>,
}

impl KeptState {
    /// The state object `name` kept, if any.
    pub fn object(&self, name: &str) -> Option<&[u8]> {
        self.objects
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, state)| state.as_slice())
    }

    /// Messages and work items not yet delivered when it was kept.
    pub fn undelivered(&self) -> usize {
        self.pending.len() + self.works.iter().map(Vec::len).sum::<usize>()
    }
}
