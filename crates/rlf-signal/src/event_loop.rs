//! One event loop: its objects, timers, inbound queue, and the dispatch of signals, work items and control messages.
//!
//! # Protocol
//! Every message in a loop's inbound queue starts with a 4-byte little-endian tag:
//! - a signal index: the rest is the postcard-encoded payload. The receiving loop decodes it **once** and calls every
//!   slot connected to that signal whose object lives on this loop, in connection order, each with `&payload`.
//! - `WORK_READY` (`u32::MAX - 1`): the rest is a work-queue index. The loop takes up to 64 items from that work queue
//!   (each item is taken by one loop only; the queue guarantees it) and hands each to one of its consumers.
//! - `CONTROL` (`u32::MAX`): the rest is a postcard-encoded control message (stop, stopped, fault, child exit, interrupt).
//!
//! **Who writes what.** An emitter encodes a signal once and puts the same bytes into the inbound queue of every
//! loop that has at least one receiver of it (one message per loop, however many receivers it holds there). A signal
//! to the emitter's own loop is *queued* in the loop's local FIFO, never called directly: a slot never runs inside
//! another slot, and the order of a loop's own emissions is the order of their delivery. Submitting a work item puts
//! it into the work queue and then puts one `WORK_READY` notice into the inbound queue of one consumer loop
//! (round-robin per emitting loop). Whichever loop handles a notice drains the work queue, so every item is handled
//! even when another loop took the items its notice announced, and a consumer loop only ever blocks on its own
//! inbound queue: no loop polls.
//!
//! **Order.** Each emitter's signals reach each loop in emission order (one FIFO per loop, one writer position per
//! emit). Signals of different emitters interleave arbitrarily.
//!
//! **Waiting.** A loop blocks on its inbound queue until a message arrives or its nearest timer is due (timers live
//! in a binary heap of monotonic deadlines; a timer never fires before its deadline). A loop with no message and no
//! timer makes no wake-up.
//!
//! **Back-pressure.** A put into a full queue is retried, blocking, for the application's emit timeout; the loop's
//! `blocked_emits` counter counts each such wait and the emitter gets an [`EmitError`] if the time runs out. Same-loop
//! deliveries never block (the local FIFO is unbounded).
//!
//! **Stop.** The main loop sends `Stop` to every other loop. A loop receiving it closes its inbound queue (later puts
//! fail with `Closed` at the sender, so nothing vanishes unseen), drains what is queued, runs each object's `on_stop`,
//! reports `Stopped` with its counters to the main loop and ends. The main loop waits for every loop (and every child
//! process to exit), then does the same for itself.
//!
//! **Death.** A slot that panics is caught; its object is poisoned (gets no more calls) and a `Fault` naming the
//! loop, object and slot goes to the main loop, which stops the application. The parent watches each child process
//! with a thread blocked in `wait()`; an exit without a prior `Stopped` becomes a `Fault` with the exit status. The
//! child's queue belongs to the parent, so a dead child leaves no segment behind.

use crate::graph::{short, Factory, ObjectBox, Payload, Slots};
use crate::supervisor::{Control, Fault, LoopStats, LoopStatus, Roster, Supervisor};
use crate::transport::{Endpoint, Inbound, RecvError, SendError, Transport};
use crate::{KeptState, Signal, WorkQueue};
use serde::Serialize;
use std::any::Any;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tag of a control message.
pub(crate) const CONTROL: u32 = u32::MAX;
/// Tag of a work-available notice.
pub(crate) const WORK_READY: u32 = u32::MAX - 1;
/// Most work items one notice takes.
pub(crate) const WORK_BATCH: usize = 64;
/// Most messages one wake-up takes from the inbound queue.
const RECV_BATCH: usize = 1024;

/// Why an emit (or a work submission) failed. Nothing was dropped silently: the caller decides.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// The receiver's queue stayed full for the whole emit timeout.
    #[error("{what}: queue of loop {to:?} stayed full for {waited:?}")]
    Full {
        /// The signal or work queue.
        what: String,
        /// The receiving loop (or work queue).
        to: String,
        /// How long the emitter waited.
        waited: Duration,
    },
    /// The receiver's queue is closed: its loop stopped or is stopping.
    #[error("{what}: queue of {to:?} is closed (stopped or stopping)")]
    Closed {
        /// The signal or work queue.
        what: String,
        /// The receiving loop (or work queue).
        to: String,
    },
    /// The message can never fit into the receiver's queue.
    #[error("{what}: {needed} bytes can never fit the queue of {to:?} ({capacity} bytes)")]
    TooLarge {
        /// The signal or work queue.
        what: String,
        /// The receiving loop (or work queue).
        to: String,
        /// Bytes needed.
        needed: usize,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The payload could not be encoded.
    #[error("{what}: payload could not be encoded: {message}")]
    Encode {
        /// The signal or work queue.
        what: String,
        /// The encoder's message.
        message: String,
    },
    /// The transport has no such endpoint (a graph that differs between processes).
    #[error("{what}: transport has no endpoint {to:?}")]
    NoEndpoint {
        /// The signal or work queue.
        what: String,
        /// The missing endpoint.
        to: String,
    },
}

/// What a message belongs to, for error reports.
#[derive(Debug, Clone, Copy)]
enum What {
    Signal(u32),
    Work(u32),
}

/// Identifies a timer of a loop, for [`Ctx::cancel_timer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

/// Names of everything, for reports.
#[derive(Debug, Default)]
pub(crate) struct Names {
    pub(crate) loops: Vec<String>,
    pub(crate) objects: Vec<String>,
    pub(crate) signals: Vec<String>,
    pub(crate) works: Vec<String>,
}

/// Where each signal and each work notice goes, in physical loop indices.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    /// Per signal: the loops holding at least one receiver, each once.
    pub(crate) signals: Vec<Vec<u32>>,
    /// Per work queue: the loops holding at least one consumer, each once.
    pub(crate) works: Vec<Vec<u32>>,
}

/// Erased typed dispatch of one signal or work queue to the receivers on one loop.
pub(crate) trait Dispatch: Send {
    /// Number of receivers on this loop.
    fn len(&self) -> usize;
    /// Decodes `payload` once and calls every receiver (`only: None`) or receiver number `only`.
    fn dispatch(
        &self,
        payload: &[u8],
        only: Option<usize>,
        objects: &mut Objects,
        core: &mut LoopCore,
    ) -> Result<(), postcard::Error>;
}

impl<P: Payload> Dispatch for Slots<P> {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn dispatch(
        &self,
        payload: &[u8],
        only: Option<usize>,
        objects: &mut Objects,
        core: &mut LoopCore,
    ) -> Result<(), postcard::Error> {
        let value: P = postcard::from_bytes(payload)?;
        let entries = match only {
            None => &self.entries[..],
            Some(i) => self.entries.get(i..=i).unwrap_or(&[]),
        };
        for e in entries {
            objects.invoke(e.object, short(e.name), core, |obj, core| {
                (e.call)(obj.as_any_mut(), core, e.object, &value)
            });
        }
        Ok(())
    }
}

/// Everything a loop needs, built in the parent (or the child) and moved to the loop's thread.
pub(crate) struct LoopPlan {
    pub(crate) me: u32,
    pub(crate) names: Arc<Names>,
    pub(crate) routes: Arc<Routes>,
    pub(crate) objects: Vec<(u32, Factory)>,
    pub(crate) signals: Vec<Option<Box<dyn Dispatch>>>,
    pub(crate) works: Vec<Option<Box<dyn Dispatch>>>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) emit_timeout: Duration,
    /// Heartbeats to the main loop go out five times per interval.
    pub(crate) heartbeat: Option<Duration>,
    /// Which process of the loop this is (0 first; one more per replacement).
    pub(crate) incarnation: u32,
    /// The loop has a process of its own (its CPU time is the process's).
    pub(crate) whole_process: bool,
    /// Serial mode's main loop: keep the state at the stop ([`crate::AppBuilder::keep_state`]).
    pub(crate) keep: bool,
    /// Serial mode's main loop: the state to continue from.
    pub(crate) restore: Option<KeptState>,
}

type TimerCall = Arc<dyn Fn(&mut dyn Any, &mut LoopCore, u32) + Send + Sync>;

struct TimerSpec {
    object: u32,
    period: Option<Duration>,
    name: &'static str,
    call: TimerCall,
}

/// The part of a loop that slots reach through [`Ctx`]: emission, timers, counters.
pub struct LoopCore {
    me: u32,
    names: Arc<Names>,
    routes: Arc<Routes>,
    transport: Arc<dyn Transport>,
    emit_timeout: Duration,
    scratch: Vec<u8>,
    many: Vec<u8>,
    many_ends: Vec<usize>,
    pending: VecDeque<Vec<u8>>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    timer_specs: HashMap<u64, TimerSpec>,
    next_timer: u64,
    work_rr: Vec<usize>,
    stats: LoopStats,
    /// Control messages raised on the main loop itself (faults, stop requests).
    events: Vec<Control>,
    incarnation: u32,
    /// The heartbeat interval, on a loop that sends heartbeats (none on the main loop).
    heartbeat: Option<Duration>,
    /// The application is stopping: this loop's objects have run their `on_stopping`.
    stopping: bool,
    /// On the main loop: the supervisor's view of every loop ([`Ctx::loops`]).
    roster: Option<Roster>,
}

/// The OS's id of the calling thread.
fn this_thread() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

impl std::fmt::Debug for LoopCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopCore")
            .field("loop", &self.loop_name())
            .field("stats", &self.stats)
            .finish()
    }
}

impl LoopCore {
    fn loop_name(&self) -> &str {
        self.names.loops.get(self.me as usize).map_or("?", String::as_str)
    }

    fn what(&self, what: What) -> String {
        let name = |v: &[String], i: u32| v.get(i as usize).map_or("?", String::as_str).to_string();
        match what {
            What::Signal(i) => format!("signal {}", name(&self.names.signals, i)),
            What::Work(i) => format!("work queue {}", name(&self.names.works, i)),
        }
    }

    /// Puts `msgs` into `to`: at once if there is room, else blocking up to the emit timeout (counted).
    fn send_counted(&mut self, to: Endpoint, msgs: &[&[u8]], what: What) -> Result<(), EmitError> {
        let t = &self.transport;
        let r = match t.send(to, msgs, Duration::ZERO) {
            Err(SendError::Full) => {
                self.stats.blocked_emits += 1;
                t.send(to, msgs, self.emit_timeout)
            }
            r => r,
        };
        r.map_err(|e| {
            self.stats.failed_emits += 1;
            emit_error(&self.names, e, to, self.what(what), self.emit_timeout)
        })
    }

    /// Encodes `tag` + `value` after what `buf` holds.
    fn encode_into<P: Serialize>(buf: &mut Vec<u8>, tag: u32, value: &P) -> Result<(), postcard::Error> {
        buf.extend_from_slice(&tag.to_le_bytes());
        *buf = postcard::to_extend(value, std::mem::take(buf))?;
        Ok(())
    }

    /// Delivers encoded messages of signal `id` to every loop holding a receiver; the first error is returned after
    /// every loop was tried.
    fn deliver(&mut self, id: u32, msgs: &[&[u8]]) -> Result<(), EmitError> {
        let routes = Arc::clone(&self.routes);
        let dests = routes.signals.get(id as usize).map_or(&[][..], Vec::as_slice);
        let mut result = Ok(());
        for &dest in dests {
            if dest == self.me {
                self.pending.extend(msgs.iter().map(|m| m.to_vec()));
            } else if let Err(e) = self.send_counted(Endpoint::Loop(dest), msgs, What::Signal(id)) {
                result = result.and(Err(e));
            }
        }
        self.stats.emitted += msgs.len() as u64;
        result
    }

    fn emit_many<P: Serialize>(&mut self, id: u32, values: &[P]) -> Result<(), EmitError> {
        let mut many = std::mem::take(&mut self.many);
        let mut ends = std::mem::take(&mut self.many_ends);
        many.clear();
        ends.clear();
        for v in values {
            if let Err(e) = Self::encode_into(&mut many, id, v) {
                self.many = many;
                self.many_ends = ends;
                return Err(EmitError::Encode {
                    what: self.what(What::Signal(id)),
                    message: e.to_string(),
                });
            }
            ends.push(many.len());
        }
        let mut start = 0;
        let msgs: Vec<&[u8]> = ends
            .iter()
            .map(|&end| {
                let m = &many[start..end];
                start = end;
                m
            })
            .collect();
        let result = self.deliver(id, &msgs);
        drop(msgs);
        self.many = many;
        self.many_ends = ends;
        result
    }

    fn emit_one<P: Serialize>(&mut self, id: u32, value: &P) -> Result<(), EmitError> {
        let mut msg = std::mem::take(&mut self.scratch);
        msg.clear();
        let result = match Self::encode_into(&mut msg, id, value) {
            Ok(()) => self.deliver(id, &[&msg]),
            Err(e) => Err(EmitError::Encode {
                what: self.what(What::Signal(id)),
                message: e.to_string(),
            }),
        };
        self.scratch = msg;
        result
    }

    fn submit<P: Serialize>(&mut self, id: u32, item: &P) -> Result<(), EmitError> {
        let bytes = postcard::to_stdvec(item).map_err(|e| EmitError::Encode {
            what: self.what(What::Work(id)),
            message: e.to_string(),
        })?;
        self.send_counted(Endpoint::Work(id), &[&bytes], What::Work(id))?;
        self.stats.emitted += 1;
        let routes = Arc::clone(&self.routes);
        let consumers = routes.works.get(id as usize).map_or(&[][..], Vec::as_slice);
        let Some(rr) = self.work_rr.get_mut(id as usize) else {
            return Ok(());
        };
        if consumers.is_empty() {
            return Ok(());
        }
        let dest = consumers[*rr % consumers.len()];
        *rr += 1;
        let mut notice = WORK_READY.to_le_bytes().to_vec();
        notice.extend_from_slice(&id.to_le_bytes());
        if dest == self.me {
            self.pending.push_back(notice);
            Ok(())
        } else {
            self.send_counted(Endpoint::Loop(dest), &[&notice], What::Work(id))
        }
    }

    /// Sends a control message to the main loop (or records it, on the main loop).
    pub(crate) fn report(&mut self, c: Control) {
        if self.me == 0 {
            self.events.push(c);
        } else {
            self.send_control(0, &c);
        }
    }

    /// Sends a control message to loop `to`, waiting up to the emit timeout; a closed or gone loop is ignored.
    pub(crate) fn send_control(&self, to: u32, c: &Control) {
        send_control(&*self.transport, to, c, self.emit_timeout);
    }

    fn add_timer(
        &mut self,
        object: u32,
        delay: Duration,
        period: Option<Duration>,
        name: &'static str,
        call: TimerCall,
    ) -> TimerId {
        let id = self.next_timer;
        self.next_timer += 1;
        let deadline = Instant::now() + delay;
        self.timers.push(Reverse((deadline, id)));
        self.timer_specs.insert(
            id,
            TimerSpec {
                object,
                period,
                name,
                call,
            },
        );
        TimerId(id)
    }

    fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((t, id))) = self.timers.peek() {
            if self.timer_specs.contains_key(id) {
                return Some(*t);
            }
            self.timers.pop();
        }
        None
    }
}

/// A transport's refusal as the emitter sees it, naming the signal (`what`) and the receiver.
fn emit_error(names: &Names, e: SendError, to: Endpoint, what: String, waited: Duration) -> EmitError {
    let to = match to {
        Endpoint::Loop(l) => names.loops.get(l as usize).cloned().unwrap_or_default(),
        Endpoint::Work(w) => names.works.get(w as usize).cloned().unwrap_or_default(),
    };
    match e {
        SendError::Full => EmitError::Full { what, to, waited },
        SendError::Closed => EmitError::Closed { what, to },
        SendError::TooLarge { needed, capacity } => EmitError::TooLarge {
            what,
            to,
            needed,
            capacity,
        },
        SendError::NoEndpoint => EmitError::NoEndpoint { what, to },
    }
}

/// A signal's emitter for a thread outside the loops (a network receiver, for instance), made on the emitting
/// object's loop by [`Ctx::inlet`]: what it emits reaches the signal's slots as the object's own emissions do, in the
/// order this thread emits them. It blocks up to the emit timeout while a receiver's queue is full.
pub struct Inlet<P> {
    id: u32,
    dests: Vec<u32>,
    names: Arc<Names>,
    transport: Arc<dyn Transport>,
    timeout: Duration,
    _p: PhantomData<fn(P)>,
}

impl<P> Clone for Inlet<P> {
    fn clone(&self) -> Self {
        Inlet {
            id: self.id,
            dests: self.dests.clone(),
            names: Arc::clone(&self.names),
            transport: Arc::clone(&self.transport),
            timeout: self.timeout,
            _p: PhantomData,
        }
    }
}

impl<P> std::fmt::Debug for Inlet<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let signal = self
            .names
            .signals
            .get(self.id as usize)
            .map_or("?", String::as_str);
        f.debug_struct("Inlet").field("signal", &signal).finish()
    }
}

impl<P: Payload> Inlet<P> {
    /// Delivers `value` to every slot connected to the signal; the first error is returned after every receiving
    /// loop was tried.
    pub fn emit(&self, value: &P) -> Result<(), EmitError> {
        let what = || {
            format!(
                "signal {}",
                self.names
                    .signals
                    .get(self.id as usize)
                    .map_or("?", String::as_str)
            )
        };
        let mut msg = Vec::new();
        LoopCore::encode_into(&mut msg, self.id, value).map_err(|e| EmitError::Encode {
            what: what(),
            message: e.to_string(),
        })?;
        let mut result = Ok(());
        for &dest in &self.dests {
            let to = Endpoint::Loop(dest);
            if let Err(e) = self.transport.send(to, &[&msg], self.timeout) {
                result = result.and(Err(emit_error(&self.names, e, to, what(), self.timeout)));
            }
        }
        result
    }
}

/// The time of a CPU clock.
fn cpu_time(clock: rustix::time::ClockId) -> Duration {
    let t = rustix::time::clock_gettime(clock);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// Encodes and sends a control message, ignoring a closed or missing endpoint (the loop is gone).
pub(crate) fn send_control(t: &dyn Transport, to: u32, c: &Control, timeout: Duration) {
    let mut msg = CONTROL.to_le_bytes().to_vec();
    if let Ok(msg) = postcard::to_extend(c, std::mem::take(&mut msg)) {
        let _ = t.send(Endpoint::Loop(to), &[&msg], timeout);
    }
}

/// A loop's heartbeat, carried into a long slot ([`Ctx::pulse`]).
pub struct Pulse {
    transport: Arc<dyn Transport>,
    message: Vec<u8>,
    period: Duration,
    last: Instant,
}

impl std::fmt::Debug for Pulse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pulse").field("period", &self.period).finish()
    }
}

impl Pulse {
    /// Tells the main loop the loop is alive, at most once per fifth of the heartbeat interval (as the loop itself
    /// does between slots). Never blocks: a full main queue skips the beat.
    pub fn beat(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.last) >= self.period {
            self.last = now;
            let _ = self
                .transport
                .send(Endpoint::Loop(0), &[&self.message], Duration::ZERO);
        }
    }
}

/// What a slot, a timer callback or a hook of object `T` can do: emit, submit work, set timers, stop the app.
pub struct Ctx<'a, T> {
    core: &'a mut LoopCore,
    me: u32,
    _t: PhantomData<fn(&mut T)>,
}

impl<'a, T: 'static> Ctx<'a, T> {
    pub(crate) fn new(core: &'a mut LoopCore, me: u32) -> Self {
        Ctx {
            core,
            me,
            _t: PhantomData,
        }
    }

    /// Delivers `value` to every slot connected to `signal`. Blocks up to the emit timeout while a receiver's queue is
    /// full; a receiver that stays full or is closed is an error (the other loops still got the signal).
    pub fn emit<P: Payload>(&mut self, signal: &Signal<P>, value: &P) -> Result<(), EmitError> {
        self.core.emit_one(signal.id, value)
    }

    /// Emits several values at once: one put per receiving loop, all or none per loop.
    pub fn emit_many<P: Payload>(&mut self, signal: &Signal<P>, values: &[P]) -> Result<(), EmitError> {
        self.core.emit_many(signal.id, values)
    }

    /// An emitter of `signal` for another thread of this process (see [`Inlet`]).
    pub fn inlet<P: Payload>(&self, signal: &Signal<P>) -> Inlet<P> {
        let core = &*self.core;
        Inlet {
            id: signal.id,
            dests: core
                .routes
                .signals
                .get(signal.id as usize)
                .cloned()
                .unwrap_or_default(),
            names: Arc::clone(&core.names),
            transport: Arc::clone(&core.transport),
            timeout: core.emit_timeout,
            _p: PhantomData,
        }
    }

    /// Puts `item` into `work`, to be handled by exactly one of its consumers.
    pub fn submit<P: Payload>(&mut self, work: &WorkQueue<P>, item: &P) -> Result<(), EmitError> {
        self.core.submit(work.id, item)
    }

    /// Calls `f` once, `delay` from now (never earlier).
    pub fn timer_once<F>(&mut self, delay: Duration, f: F) -> TimerId
    where
        F: Fn(&mut T, &mut Ctx<'_, T>) + Copy + Send + Sync + 'static,
    {
        self.core
            .add_timer(self.me, delay, None, std::any::type_name::<F>(), timer_call(f))
    }

    /// Calls `f` every `period` (at least 1 µs), first `period` from now; a late tick is not repeated to catch up.
    pub fn timer_periodic<F>(&mut self, period: Duration, f: F) -> TimerId
    where
        F: Fn(&mut T, &mut Ctx<'_, T>) + Copy + Send + Sync + 'static,
    {
        let period = period.max(Duration::from_micros(1));
        self.core.add_timer(
            self.me,
            period,
            Some(period),
            std::any::type_name::<F>(),
            timer_call(f),
        )
    }

    /// Cancels a timer; a no-op if it already fired (single-shot) or was cancelled.
    pub fn cancel_timer(&mut self, timer: TimerId) {
        self.core.timer_specs.remove(&timer.0);
    }

    /// This loop's heartbeat, for a slot that may run longer than the heartbeat interval (a learner training on a
    /// large dataset): calling [`Pulse::beat`] as it goes keeps the main loop from taking the loop for hung. `None`
    /// where no heartbeat is checked (heartbeats off, or the main loop).
    pub fn pulse(&self) -> Option<Pulse> {
        let interval = self.core.heartbeat?;
        let beat = Control::Heartbeat {
            loop_id: self.core.me,
            pid: std::process::id(),
            tid: this_thread(),
        };
        let message = postcard::to_extend(&beat, CONTROL.to_le_bytes().to_vec()).ok()?;
        Some(Pulse {
            transport: Arc::clone(&self.core.transport),
            message,
            period: interval / 5,
            last: Instant::now(),
        })
    }

    /// Asks the main loop to stop the application gracefully.
    pub fn stop_app(&mut self) {
        let by = self.object_name().to_string();
        self.core.report(Control::StopRequested { by });
    }

    /// Reports that this object cannot go on: a [`Fault::Component`] naming its loop, the object
    /// and `error` (on one line) reaches the main loop, which stops the application; the fault is
    /// in the [`Outcome`](crate::Outcome), whatever process the object runs in. Hooks and slots
    /// still run while the application stops (an `on_stop` can save what it holds).
    pub fn fail(&mut self, error: impl std::fmt::Display) {
        let message = error.to_string();
        let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
        let fault = Fault::Component {
            loop_name: self.loop_name().to_string(),
            object: self.object_name().to_string(),
            message,
        };
        self.core.report(Control::Fault(fault));
    }

    /// Whether the application is stopping: this loop has run its objects' `on_stopping`
    /// ([`Component::on_stopping`](crate::Component::on_stopping)). A slot that would queue more work for
    /// its own loop does not, so that the loop can drain.
    pub fn stopping(&self) -> bool {
        self.core.stopping
    }

    /// This object's name.
    pub fn object_name(&self) -> &str {
        self.core
            .names
            .objects
            .get(self.me as usize)
            .map_or("?", String::as_str)
    }

    /// The name of the loop this object runs on.
    pub fn loop_name(&self) -> &str {
        self.core.loop_name()
    }

    /// This loop's counters so far.
    pub fn stats(&self) -> LoopStats {
        self.core.stats
    }

    /// On the main loop: every loop of the application as the main loop sees it now (main first; its process and
    /// thread, heartbeat, waiting messages). `None` on the other loops, which do not watch.
    pub fn loops(&self) -> Option<Vec<LoopStatus>> {
        let transport = &self.core.transport;
        let roster = self.core.roster.as_ref()?;
        Some(roster.statuses(|i| transport.queued(Endpoint::Loop(i))))
    }

    /// Which process of a replaceable loop this is: 0 for the first, one more for each replacement (see
    /// [`crate::AppBuilder::restart_on_failure`]). Always 0 on threads and in serial mode.
    pub fn incarnation(&self) -> u32 {
        self.core.incarnation
    }
}

fn timer_call<T: 'static, F>(f: F) -> TimerCall
where
    F: Fn(&mut T, &mut Ctx<'_, T>) + Copy + Send + Sync + 'static,
{
    Arc::new(move |obj: &mut dyn Any, core: &mut LoopCore, me: u32| {
        if let Some(h) = obj.downcast_mut::<crate::graph::Holder<T>>() {
            f(&mut h.0, &mut Ctx::new(core, me));
        }
    })
}

/// The objects of one loop, indexed by global object index.
pub(crate) struct Objects {
    live: Vec<Option<Live>>,
}

struct Live {
    obj: Box<dyn ObjectBox>,
    poisoned: bool,
}

impl Objects {
    /// Calls `f` on object `id` unless it is absent or poisoned; a panic poisons it and is reported as a fault.
    pub(crate) fn invoke(
        &mut self,
        id: u32,
        slot: &str,
        core: &mut LoopCore,
        f: impl FnOnce(&mut dyn ObjectBox, &mut LoopCore),
    ) {
        let Some(Some(live)) = self.live.get_mut(id as usize) else {
            return;
        };
        if live.poisoned {
            return;
        }
        core.stats.dispatched += 1;
        let obj = &mut live.obj;
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(&mut **obj, core))) {
            live.poisoned = true;
            let fault = Fault::SlotPanicked {
                loop_name: core.loop_name().to_string(),
                object: core.names.objects.get(id as usize).cloned().unwrap_or_default(),
                slot: slot.to_string(),
                message: panic_message(&*panic),
            };
            core.report(Control::Fault(fault));
        }
    }

    /// Object `id`'s state for [`crate::KeptState`] (none from an absent or poisoned object).
    fn save(&mut self, id: u32) -> Result<Option<Vec<u8>>, String> {
        match self.live.get_mut(id as usize) {
            Some(Some(live)) if !live.poisoned => live.obj.save(),
            _ => Ok(None),
        }
    }

    fn restore(&mut self, id: u32, state: &[u8]) -> Result<(), String> {
        match self.live.get_mut(id as usize) {
            Some(Some(live)) if !live.poisoned => live.obj.restore(state),
            _ => Err("it was not constructed".into()),
        }
    }

    fn ids(&self) -> Vec<u32> {
        (0..self.live.len() as u32)
            .filter(|&i| self.live[i as usize].is_some())
            .collect()
    }
}

fn malformed(core: &mut LoopCore, what: &str) {
    let fault = Fault::Malformed {
        loop_name: core.loop_name().to_string(),
        message: what.to_string(),
    };
    core.report(Control::Fault(fault));
}

pub(crate) fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Draining,
}

/// A loop being run.
pub(crate) struct EventLoop {
    core: LoopCore,
    objects: Objects,
    signals: Vec<Option<Box<dyn Dispatch>>>,
    works: Vec<Option<Box<dyn Dispatch>>>,
    work_rr: Vec<usize>,
    state: State,
    supervisor: Option<Supervisor>,
    /// Heartbeat period (a fifth of the interval) and when the next one is due; none on the main loop.
    beat: Option<(Duration, Instant)>,
    /// The CPU clock the loop's `cpu_micros` reads, and its value at the start.
    cpu_clock: (rustix::time::ClockId, Duration),
    /// Keep the state when the stop begins (serial mode's main loop).
    keep: bool,
}

impl EventLoop {
    /// Constructs the loop's objects (on the calling thread) and runs their `on_start`.
    pub(crate) fn start(plan: LoopPlan, supervisor: Option<Supervisor>) -> EventLoop {
        let n_works = plan.works.len();
        let mut core = LoopCore {
            me: plan.me,
            names: plan.names,
            routes: plan.routes,
            transport: plan.transport,
            emit_timeout: plan.emit_timeout,
            scratch: Vec::new(),
            many: Vec::new(),
            many_ends: Vec::new(),
            pending: VecDeque::new(),
            timers: BinaryHeap::new(),
            timer_specs: HashMap::new(),
            next_timer: 0,
            work_rr: vec![0; n_works],
            stats: LoopStats::default(),
            events: Vec::new(),
            incarnation: plan.incarnation,
            heartbeat: plan.heartbeat.filter(|_| supervisor.is_none()),
            stopping: false,
            roster: supervisor.as_ref().map(Supervisor::roster),
        };
        let mut live: Vec<Option<Live>> = (0..core.names.objects.len()).map(|_| None).collect();
        for (id, factory) in plan.objects {
            match catch_unwind(AssertUnwindSafe(factory)) {
                Ok(obj) => live[id as usize] = Some(Live { obj, poisoned: false }),
                Err(panic) => core.report(Control::Fault(Fault::SlotPanicked {
                    loop_name: core.loop_name().to_string(),
                    object: core.names.objects.get(id as usize).cloned().unwrap_or_default(),
                    slot: "constructor".into(),
                    message: panic_message(&*panic),
                })),
            }
        }
        let mut objects = Objects { live };
        for id in objects.ids() {
            objects.invoke(id, "on_start", &mut core, |obj, core| obj.start(core, id));
        }
        let clock = if plan.whole_process {
            rustix::time::ClockId::ProcessCPUTime
        } else {
            rustix::time::ClockId::ThreadCPUTime
        };
        let cpu_clock = (clock, cpu_time(clock));
        let beat = core.heartbeat.map(|h| (h / 5, Instant::now()));
        let mut event_loop = EventLoop {
            core,
            objects,
            signals: plan.signals,
            works: plan.works,
            work_rr: vec![0; n_works],
            state: State::Running,
            supervisor,
            beat,
            cpu_clock,
            keep: plan.keep,
        };
        if let Some(kept) = plan.restore {
            event_loop.restore(kept);
        }
        event_loop
    }

    /// Takes every item out of work queue `w`, undelivered.
    fn take_work(&mut self, w: u32) -> Vec<Vec<u8>> {
        let mut taken = Vec::new();
        let mut items = Inbound::new();
        while let Ok(n) =
            self.core
                .transport
                .recv(Endpoint::Work(w), &mut items, WORK_BATCH, Some(Instant::now()))
        {
            taken.extend((0..n).filter_map(|i| items.get(i)).map(<[u8]>::to_vec));
            if n == 0 {
                break;
            }
        }
        taken
    }

    /// The objects' states and the undelivered messages, which are then dropped (see [`crate::KeptState`]).
    fn keep_state(&mut self) {
        let works = (0..self.works.len() as u32).map(|w| self.take_work(w)).collect();
        let pending = self.core.pending.drain(..).collect();
        let mut objects = Vec::new();
        for id in self.objects.ids() {
            let name = self
                .core
                .names
                .objects
                .get(id as usize)
                .cloned()
                .unwrap_or_default();
            match self.objects.save(id) {
                Ok(Some(state)) => objects.push((name, state)),
                Ok(None) => {}
                Err(e) => return self.state_fault(&name, format!("its state could not be kept: {e}")),
            }
        }
        let kept = KeptState {
            graph: String::new(),
            objects,
            pending,
            works,
            submit_rr: self.core.work_rr.clone(),
            take_rr: self.work_rr.clone(),
        };
        if let Some(sup) = &mut self.supervisor {
            sup.keep(kept);
        }
    }

    /// Continues from `kept`: what the objects' `on_start` queued is replaced by what the kept run had not
    /// delivered, and each object takes back its state.
    fn restore(&mut self, kept: KeptState) {
        self.core.pending.clear();
        for w in 0..self.works.len() as u32 {
            self.take_work(w);
        }
        for (name, state) in &kept.objects {
            let Some(id) = self.core.names.objects.iter().position(|n| n == name) else {
                return self.state_fault(
                    name,
                    "the kept state names this object, which the application has not".into(),
                );
            };
            if let Err(e) = self.objects.restore(id as u32, state) {
                return self.state_fault(name, format!("its kept state could not be restored: {e}"));
            }
        }
        self.core.pending.extend(kept.pending);
        for (w, items) in kept.works.iter().enumerate() {
            let items: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
            if let Err(e) = self
                .core
                .transport
                .send(Endpoint::Work(w as u32), &items, Duration::ZERO)
            {
                let name = self.core.names.works.get(w).cloned().unwrap_or_default();
                return self.state_fault(&name, format!("its kept items do not fit its queue: {e}"));
            }
        }
        if kept.submit_rr.len() == self.core.work_rr.len() {
            self.core.work_rr = kept.submit_rr;
        }
        if kept.take_rr.len() == self.work_rr.len() {
            self.work_rr = kept.take_rr;
        }
    }

    fn state_fault(&mut self, object: &str, message: String) {
        let fault = Fault::Component {
            loop_name: self.core.loop_name().to_string(),
            object: object.to_string(),
            message,
        };
        self.core.report(Control::Fault(fault));
    }

    /// Runs until stopped; returns the loop's counters and, on the main loop, the supervisor's record.
    pub(crate) fn run(mut self) -> (LoopStats, Option<Supervisor>) {
        let mut inbound = Inbound::new();
        let me = Endpoint::Loop(self.core.me);
        loop {
            self.flush_local();
            if self.state == State::Running {
                self.heartbeat();
                self.fire_timers();
                self.flush_local();
                if let Some(sup) = &mut self.supervisor {
                    sup.tick(&mut self.core);
                    let finished = sup.finished();
                    self.on_supervisor_stopping();
                    if finished {
                        self.begin_drain();
                    }
                }
            }
            let busy = !self.core.pending.is_empty() || !self.core.events.is_empty();
            let deadline = if busy || self.state == State::Draining {
                Some(Instant::now())
            } else {
                let sup_deadline = self.supervisor.as_ref().and_then(Supervisor::deadline);
                let beat = self.beat.map(|(_, due)| due);
                [self.core.next_deadline(), sup_deadline, beat]
                    .into_iter()
                    .flatten()
                    .min()
            };
            let blocking = deadline.is_none_or(|d| d > Instant::now());
            let transport = Arc::clone(&self.core.transport);
            let received = transport.recv(me, &mut inbound, RECV_BATCH, deadline);
            if blocking {
                self.core.stats.wakeups += 1;
            }
            match received {
                Ok(n) => {
                    self.core.stats.received += n as u64;
                    for i in 0..inbound.len() {
                        if let Some(msg) = inbound.get(i) {
                            self.handle(msg);
                        }
                    }
                }
                Err(RecvError::Timeout) => {}
                Err(RecvError::Closed | RecvError::NoEndpoint) => {
                    if self.state == State::Running {
                        self.state = State::Draining;
                    } else if self.core.pending.is_empty() && self.core.events.is_empty() {
                        break;
                    }
                }
            }
        }
        for id in self.objects.ids() {
            self.objects
                .invoke(id, "on_stop", &mut self.core, |obj, core| obj.stop(core, id));
        }
        while !self.core.pending.is_empty() || !self.core.events.is_empty() {
            self.flush_local();
        }
        let (clock, start) = self.cpu_clock;
        self.core.stats.cpu_micros = cpu_time(clock).saturating_sub(start).as_micros() as u64;
        let stats = self.core.stats;
        if self.supervisor.is_none() {
            self.core.send_control(
                0,
                &Control::Stopped {
                    loop_id: self.core.me,
                    stats,
                },
            );
        }
        (stats, self.supervisor)
    }

    /// Tells the main loop this loop is alive, when due. Never blocks: a full main queue skips the beat.
    fn heartbeat(&mut self) {
        let Some((period, due)) = self.beat else { return };
        let now = Instant::now();
        if now < due {
            return;
        }
        self.beat = Some((period, now + period));
        let beat = Control::Heartbeat {
            loop_id: self.core.me,
            pid: std::process::id(),
            tid: this_thread(),
        };
        send_control(&*self.core.transport, 0, &beat, Duration::ZERO);
    }

    fn begin_drain(&mut self) {
        if self.state == State::Running {
            self.state = State::Draining;
            self.core.transport.close(Endpoint::Loop(self.core.me));
        }
    }

    /// Delivers the local messages and control events queued so far, but not those their slots queue in turn:
    /// two objects that answer each other on one loop (serial mode) must not starve timers, the inbound queue and
    /// stop requests. What they queue is delivered on the next turn of the loop, which then does not block.
    fn flush_local(&mut self) {
        for _ in 0..self.core.pending.len() {
            let Some(msg) = self.core.pending.pop_front() else {
                break;
            };
            self.handle(&msg);
        }
        let events = std::mem::take(&mut self.core.events);
        for c in events {
            self.on_control(c);
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(&Reverse((deadline, id))) = self.core.timers.peek() {
            if deadline > now {
                break;
            }
            self.core.timers.pop();
            let Some(spec) = self.core.timer_specs.get(&id) else {
                continue;
            };
            let (object, call, name) = (spec.object, Arc::clone(&spec.call), spec.name);
            match spec.period {
                Some(p) => {
                    let mut next = deadline + p;
                    if next <= now {
                        next = now + p;
                    }
                    self.core.timers.push(Reverse((next, id)));
                }
                None => {
                    self.core.timer_specs.remove(&id);
                }
            }
            self.core.stats.timers_fired += 1;
            self.objects
                .invoke(object, short(name), &mut self.core, |obj, core| {
                    call(obj.as_any_mut(), core, object)
                });
        }
    }

    fn handle(&mut self, msg: &[u8]) {
        let Some((tag, payload)) = msg.split_first_chunk::<4>() else {
            self.malformed("message shorter than its tag");
            return;
        };
        match u32::from_le_bytes(*tag) {
            CONTROL => match postcard::from_bytes::<Control>(payload) {
                Ok(c) => self.on_control(c),
                Err(e) => self.malformed(&format!("bad control message: {e}")),
            },
            WORK_READY => match payload.first_chunk::<4>() {
                Some(w) => self.drain_work(u32::from_le_bytes(*w)),
                None => self.malformed("bad work notice"),
            },
            id => {
                let Some(Some(d)) = self.signals.get(id as usize) else {
                    return;
                };
                if let Err(e) = d.dispatch(payload, None, &mut self.objects, &mut self.core) {
                    let signal = self
                        .core
                        .names
                        .signals
                        .get(id as usize)
                        .cloned()
                        .unwrap_or_default();
                    self.malformed(&format!("signal {signal}: payload does not decode: {e}"));
                }
            }
        }
    }

    fn malformed(&mut self, what: &str) {
        malformed(&mut self.core, what);
    }

    fn drain_work(&mut self, w: u32) {
        let Some(Some(d)) = self.works.get(w as usize) else {
            return;
        };
        let mut items = Inbound::new();
        let now = Some(Instant::now());
        let Ok(n) = self
            .core
            .transport
            .recv(Endpoint::Work(w), &mut items, WORK_BATCH, now)
        else {
            return;
        };
        for i in 0..n {
            let Some(item) = items.get(i) else { break };
            let k = self.work_rr[w as usize] % d.len().max(1);
            self.work_rr[w as usize] += 1;
            if let Err(e) = d.dispatch(item, Some(k), &mut self.objects, &mut self.core) {
                let name = self.core.names.works.get(w as usize).cloned().unwrap_or_default();
                malformed(
                    &mut self.core,
                    &format!("work queue {name}: item does not decode: {e}"),
                );
            }
        }
    }

    fn on_control(&mut self, c: Control) {
        match &mut self.supervisor {
            Some(sup) => {
                sup.on_control(c, &mut self.core);
                self.on_supervisor_stopping();
            }
            None => {
                if let Control::Stop = c {
                    self.begin_stopping();
                    self.begin_drain();
                }
            }
        }
    }

    /// On the main loop: once the supervisor has begun the stop (and told the other loops), its objects' `on_stopping`.
    fn on_supervisor_stopping(&mut self) {
        if self.supervisor.as_ref().is_some_and(Supervisor::stopping) {
            self.begin_stopping();
        }
    }

    /// Runs every object's `on_stopping`, once.
    fn begin_stopping(&mut self) {
        if std::mem::replace(&mut self.core.stopping, true) {
            return;
        }
        if self.keep {
            self.keep_state();
        }
        for id in self.objects.ids() {
            self.objects
                .invoke(id, "on_stopping", &mut self.core, |obj, core| {
                    obj.stopping(core, id)
                });
        }
    }
}

impl LoopCore {
    /// The transport (for the supervisor).
    pub(crate) fn transport(&self) -> &dyn Transport {
        &*self.transport
    }

    /// The emit timeout (for the supervisor).
    pub(crate) fn emit_timeout(&self) -> Duration {
        self.emit_timeout
    }
}
