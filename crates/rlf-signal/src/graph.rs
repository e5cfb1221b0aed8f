//! The application graph: loops, objects, signals, work queues and their connections, declared by one build
//! function that the parent and every child process run alike.

use crate::event_loop::{Ctx, LoopCore};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::any::Any;
use std::fmt::{self, Write as _};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// A value that can travel as a signal payload or a work item: encoded once with postcard.
pub trait Payload: Serialize + DeserializeOwned + 'static {}
impl<P: Serialize + DeserializeOwned + 'static> Payload for P {}

/// A component living on an event loop. Slots are ordinary methods `fn(&mut self, &mut Ctx<Self>, &P)`.
pub trait Component: 'static {
    /// Runs on the component's loop before any signal is delivered to it.
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>)
    where
        Self: Sized,
    {
        let _ = ctx;
    }

    /// Runs once when the application begins to stop (a stop request, a fault, SIGINT or SIGTERM), on the main loop
    /// right after it has told the other loops, and on each other loop when it is told, before it drains its queued
    /// signals. A component whose work waits on something outside its loop (a futex in shared memory) ends that wait
    /// here, so that the loops waiting for it can stop; slots are still delivered after it.
    fn on_stopping(&mut self, ctx: &mut Ctx<'_, Self>)
    where
        Self: Sized,
    {
        let _ = ctx;
    }

    /// Runs once the loop has drained its queued signals during a graceful stop.
    fn on_stop(&mut self, ctx: &mut Ctx<'_, Self>)
    where
        Self: Sized,
    {
        let _ = ctx;
    }

    /// With [`AppBuilder::keep_state`] (serial mode): everything the component needs to continue exactly, taken
    /// when the application begins to stop, before any `on_stopping` (see [`KeptState`](crate::KeptState)).
    /// `Ok(None)`, the default: it keeps nothing, and a restored run has it as its constructor and `on_start` left
    /// it.
    fn save(&mut self) -> Result<Option<Vec<u8>>, String> {
        Ok(None)
    }

    /// With [`AppBuilder::restore_state`]: takes back what [`save`](Component::save) kept, after `on_start`
    /// and before any signal is delivered.
    fn restore(&mut self, state: &[u8]) -> Result<(), String> {
        let _ = state;
        Err("it keeps no state".into())
    }
}

/// Where a loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Placement {
    /// The thread that calls [`crate::App::run`].
    Main,
    /// A new thread of the parent process.
    Thread,
    /// A new process running this program's own binary.
    Process,
}

/// A loop of the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopRef(pub(crate) u32);

/// An object of type `T` on some loop.
pub struct ObjectRef<T> {
    pub(crate) id: u32,
    _t: PhantomData<fn() -> T>,
}

/// A signal carrying `P`, emitted by one object.
pub struct Signal<P> {
    pub(crate) id: u32,
    _p: PhantomData<fn(P)>,
}

/// A work queue of `P` items; each item is taken by exactly one consumer.
pub struct WorkQueue<P> {
    pub(crate) id: u32,
    _p: PhantomData<fn(P)>,
}

macro_rules! copy_handle {
    ($name:ident, $param:ident) => {
        impl<$param> Clone for $name<$param> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<$param> Copy for $name<$param> {}
        impl<$param> fmt::Debug for $name<$param> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.id)
            }
        }
    };
}
copy_handle!(ObjectRef, T);
copy_handle!(Signal, P);
copy_handle!(WorkQueue, P);

/// Errors in the graph, found when the application starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// Two loops, two objects, two signals of one object, or two work queues share a name.
    #[error("duplicate {kind} name {name:?}")]
    DuplicateName {
        /// "loop", "object", "signal" or "work queue".
        kind: &'static str,
        /// The repeated name.
        name: String,
    },
    /// An object was declared but [`AppBuilder::construct`] was never called for it.
    #[error("object {object:?} was declared but never given a constructor")]
    NotConstructed {
        /// The object's name.
        object: String,
    },
    /// The application's configuration could not be decoded.
    #[error("application {app:?}: bad configuration: {message}")]
    Config {
        /// The application's name.
        app: String,
        /// What the decoder said.
        message: String,
    },
    /// A value given to the builder is out of range.
    #[error("{0}")]
    Invalid(String),
    /// The user's build function failed.
    #[error("build function failed: {0}")]
    User(String),
}

pub(crate) type Factory = Box<dyn FnOnce() -> Box<dyn ObjectBox> + Send>;

pub(crate) struct LoopDecl {
    pub(crate) name: String,
    pub(crate) placement: Placement,
    pub(crate) queue_bytes: usize,
    /// How many times the supervisor replaces the loop's process when it dies or hangs.
    pub(crate) max_restarts: u32,
}

pub(crate) struct ObjectDecl {
    pub(crate) name: String,
    pub(crate) loop_id: u32,
    pub(crate) type_name: &'static str,
    pub(crate) factory: Option<Factory>,
}

pub(crate) struct SignalDecl {
    pub(crate) name: String,
    pub(crate) emitter: u32,
    pub(crate) payload: &'static str,
    pub(crate) slots: Box<dyn ErasedSlots>,
}

pub(crate) struct WorkDecl {
    pub(crate) name: String,
    pub(crate) payload: &'static str,
    pub(crate) bytes: usize,
    pub(crate) slots: Box<dyn ErasedSlots>,
}

/// Declares the application: called once in the parent and once in every child process, it must declare the same
/// graph each time (same names, same order).
pub struct AppBuilder {
    pub(crate) name: String,
    pub(crate) config: Vec<u8>,
    pub(crate) serial: bool,
    pub(crate) emit_timeout: Duration,
    pub(crate) stop_timeout: Duration,
    pub(crate) heartbeat: Option<Duration>,
    pub(crate) fork: bool,
    pub(crate) loops: Vec<LoopDecl>,
    pub(crate) objects: Vec<ObjectDecl>,
    pub(crate) signals: Vec<SignalDecl>,
    pub(crate) works: Vec<WorkDecl>,
    pub(crate) errors: Vec<BuildError>,
    /// Serial mode: keep the state at the stop ([`AppBuilder::keep_state`]).
    pub(crate) keep: bool,
    /// Serial mode: the state to continue from ([`AppBuilder::restore_state`]).
    pub(crate) restore: Option<crate::KeptState>,
}

/// Default inbound queue size of a loop in bytes.
pub const DEFAULT_QUEUE_BYTES: usize = 1 << 20;

impl AppBuilder {
    pub(crate) fn new(name: &str, config: Vec<u8>) -> AppBuilder {
        AppBuilder {
            name: name.to_string(),
            config,
            serial: false,
            emit_timeout: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(5),
            heartbeat: None,
            fork: false,
            loops: vec![LoopDecl {
                name: "main".into(),
                placement: Placement::Main,
                queue_bytes: DEFAULT_QUEUE_BYTES,
                max_restarts: 0,
            }],
            objects: Vec::new(),
            signals: Vec::new(),
            works: Vec::new(),
            errors: Vec::new(),
            keep: false,
            restore: None,
        }
    }

    /// The application's name (as given to [`crate::App::new`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The application's configuration (as given to [`crate::App::with_config`]), decoded.
    pub fn config<C: DeserializeOwned>(&self) -> Result<C, BuildError> {
        serde_json::from_slice(&self.config).map_err(|e| BuildError::Config {
            app: self.name.clone(),
            message: e.to_string(),
        })
    }

    /// Serial mode: every object on the main loop of one process, same connections. Off by default.
    pub fn set_serial(&mut self, serial: bool) -> &mut Self {
        self.serial = serial;
        self
    }

    /// Serial mode: when the application begins to stop, keep its objects' states and its undelivered messages
    /// ([`KeptState`](crate::KeptState), in [`Outcome::kept`](crate::Outcome::kept)) instead of delivering them.
    pub fn keep_state(&mut self, on: bool) -> &mut Self {
        self.keep = on;
        self
    }

    /// Serial mode: continue from `state`, which a run of the same graph kept ([`keep_state`](Self::keep_state)):
    /// after the objects' `on_start`, each takes back its state and the undelivered messages replace what they
    /// queued.
    pub fn restore_state(&mut self, state: crate::KeptState) -> &mut Self {
        self.restore = Some(state);
        self
    }

    /// Whether serial mode is on.
    pub fn is_serial(&self) -> bool {
        self.serial
    }

    /// Starts the first process of every process loop by forking the application's process instead of
    /// re-executing its binary, when that process has a single thread at [`App::run`](crate::App::run) (otherwise
    /// the binary is re-executed as usual). A forked child skips the program's start-up: the dynamic loader and
    /// static constructors (libtorch's take a quarter of a second), and the build function. Its objects come
    /// from the factories declared here. Replacements are always re-executed, since the application's process
    /// has threads by then. Leave it off when the process holds state a fork does not carry over intact (an
    /// embedded Python interpreter). Off by default.
    pub fn set_fork(&mut self, fork: bool) -> &mut Self {
        self.fork = fork;
        self
    }

    /// How long an emit waits for room in a full receiver queue before it returns an error (default 10 s).
    pub fn set_emit_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.emit_timeout = timeout;
        self
    }

    /// How long a graceful stop waits for every loop before it kills the processes left (default 5 s).
    pub fn set_stop_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.stop_timeout = timeout;
        self
    }

    /// Heartbeats: every loop tells the main loop it is alive five times per `interval`, and the main loop names a
    /// loop silent for `interval` as hung (a fault, or a replacement for loops given
    /// [`AppBuilder::restart_on_failure`]). A loop gets `max(interval, 30 s)` to send its first heartbeat (start-up
    /// builds its objects). Off by default; at least 10 ms.
    pub fn set_heartbeat(&mut self, interval: Duration) -> &mut Self {
        if interval < Duration::from_millis(10) {
            self.errors.push(BuildError::Invalid(format!(
                "heartbeat interval {interval:?} is below the 10 ms minimum"
            )));
        }
        self.heartbeat = Some(interval);
        self
    }

    /// The heartbeat interval, if heartbeats are on.
    pub fn heartbeat(&self) -> Option<Duration> {
        self.heartbeat
    }

    /// Lets the supervisor replace the process of loop `l` up to `max_restarts` times when it dies or hangs while
    /// the application runs, instead of stopping the application: the same objects are built again in a new
    /// process (whose [`Ctx::incarnation`] is one more), on the same inbound queue, which still holds what was sent
    /// to the dead one. Only process loops can be replaced.
    pub fn restart_on_failure(&mut self, l: LoopRef, max_restarts: u32) -> &mut Self {
        match self.loops.get_mut(l.0 as usize) {
            Some(decl) if decl.placement == Placement::Process => decl.max_restarts = max_restarts,
            Some(decl) => self.errors.push(BuildError::Invalid(format!(
                "loop {:?} is not a process loop: only processes can be replaced",
                decl.name
            ))),
            None => self.errors.push(BuildError::Invalid(format!("no loop {}", l.0))),
        }
        self
    }

    /// The loop that runs on the thread calling [`crate::App::run`]; it also supervises the others.
    pub fn main_loop(&self) -> LoopRef {
        LoopRef(0)
    }

    /// Declares a loop on a new thread.
    pub fn thread_loop(&mut self, name: &str) -> LoopRef {
        self.add_loop(name, Placement::Thread)
    }

    /// Declares a loop in a new process (this program's binary re-executed, or a fork: [`AppBuilder::set_fork`]).
    pub fn process_loop(&mut self, name: &str) -> LoopRef {
        self.add_loop(name, Placement::Process)
    }

    fn add_loop(&mut self, name: &str, placement: Placement) -> LoopRef {
        self.check_unique("loop", name, self.loops.iter().any(|l| l.name == name));
        self.loops.push(LoopDecl {
            name: name.into(),
            placement,
            queue_bytes: DEFAULT_QUEUE_BYTES,
            max_restarts: 0,
        });
        LoopRef(self.loops.len() as u32 - 1)
    }

    /// Sets the size in bytes of a loop's inbound queue (default [`DEFAULT_QUEUE_BYTES`]).
    pub fn set_queue_bytes(&mut self, l: LoopRef, bytes: usize) -> &mut Self {
        if bytes < 64 {
            self.errors.push(BuildError::Invalid(format!(
                "queue of {bytes} bytes is below the 64-byte minimum"
            )));
        }
        if let Some(decl) = self.loops.get_mut(l.0 as usize) {
            decl.queue_bytes = bytes;
        }
        self
    }

    /// Declares an object of type `T` on loop `l`; give it a constructor with [`AppBuilder::construct`].
    pub fn object<T: Component>(&mut self, l: LoopRef, name: &str) -> ObjectRef<T> {
        self.check_unique("object", name, self.objects.iter().any(|o| o.name == name));
        self.objects.push(ObjectDecl {
            name: name.into(),
            loop_id: l.0,
            type_name: std::any::type_name::<T>(),
            factory: None,
        });
        ObjectRef {
            id: self.objects.len() as u32 - 1,
            _t: PhantomData,
        }
    }

    /// Gives an object its constructor. It runs only on the object's own loop (thread or process), after wiring.
    pub fn construct<T: Component, F>(&mut self, object: ObjectRef<T>, factory: F) -> &mut Self
    where
        F: FnOnce() -> T + Send + 'static,
    {
        if let Some(decl) = self.objects.get_mut(object.id as usize) {
            decl.factory = Some(Box::new(move || {
                Box::new(Holder(factory())) as Box<dyn ObjectBox>
            }));
        }
        self
    }

    /// Declares the signal `name` of `emitter`, carrying `P`.
    pub fn signal<P: Payload, T: Component>(&mut self, emitter: ObjectRef<T>, name: &str) -> Signal<P> {
        let dup = self
            .signals
            .iter()
            .any(|s| s.emitter == emitter.id && s.name == name);
        self.check_unique("signal", name, dup);
        self.signals.push(SignalDecl {
            name: name.into(),
            emitter: emitter.id,
            payload: std::any::type_name::<P>(),
            slots: Box::new(Slots::<P>::default()),
        });
        Signal {
            id: self.signals.len() as u32 - 1,
            _p: PhantomData,
        }
    }

    /// Connects `signal` to `slot` of `receiver`. The slot's payload type must be the signal's: otherwise this does
    /// not compile.
    pub fn connect<P, T, F>(&mut self, signal: Signal<P>, receiver: ObjectRef<T>, slot: F) -> &mut Self
    where
        P: Payload,
        T: Component,
        F: Fn(&mut T, &mut Ctx<'_, T>, &P) + Copy + Send + Sync + 'static,
    {
        if let Some(decl) = self.signals.get_mut(signal.id as usize) {
            add_slot(&mut *decl.slots, receiver, slot);
        }
        self
    }

    /// Declares a work queue of `P` items holding up to `bytes` bytes.
    pub fn work_queue<P: Payload>(&mut self, name: &str, bytes: usize) -> WorkQueue<P> {
        self.check_unique("work queue", name, self.works.iter().any(|w| w.name == name));
        if bytes < 64 {
            self.errors.push(BuildError::Invalid(format!(
                "work queue {name:?}: {bytes} bytes is below the 64-byte minimum"
            )));
        }
        self.works.push(WorkDecl {
            name: name.into(),
            payload: std::any::type_name::<P>(),
            bytes,
            slots: Box::new(Slots::<P>::default()),
        });
        WorkQueue {
            id: self.works.len() as u32 - 1,
            _p: PhantomData,
        }
    }

    /// Makes `slot` of `consumer` one of the consumers of `work`: each item goes to exactly one consumer.
    pub fn consume<P, T, F>(&mut self, work: WorkQueue<P>, consumer: ObjectRef<T>, slot: F) -> &mut Self
    where
        P: Payload,
        T: Component,
        F: Fn(&mut T, &mut Ctx<'_, T>, &P) + Copy + Send + Sync + 'static,
    {
        if let Some(decl) = self.works.get_mut(work.id as usize) {
            add_slot(&mut *decl.slots, consumer, slot);
        }
        self
    }

    fn check_unique(&mut self, kind: &'static str, name: &str, duplicate: bool) {
        if duplicate {
            self.errors.push(BuildError::DuplicateName {
                kind,
                name: name.into(),
            });
        }
    }

    /// Checks the graph is complete.
    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        if let Some(e) = self.errors.first() {
            return Err(e.clone());
        }
        if let Some(o) = self.objects.iter().find(|o| o.factory.is_none()) {
            return Err(BuildError::NotConstructed {
                object: o.name.clone(),
            });
        }
        if (self.keep || self.restore.is_some()) && !self.serial {
            return Err(BuildError::Invalid(
                "an application's state is kept and restored in serial mode only".into(),
            ));
        }
        if let Some(kept) = &self.restore {
            if kept.graph != self.describe() {
                return Err(BuildError::Invalid(
                    "the kept state is of another application graph (other loops, objects or signals)".into(),
                ));
            }
        }
        Ok(())
    }

    /// The whole graph as text: loops and their objects, signals and the slots they reach, work queues and their
    /// consumers.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "app {} (serial mode: {})", self.name, self.serial);
        for (i, l) in self.loops.iter().enumerate() {
            let _ = writeln!(
                s,
                "loop {} [{:?}, {} byte queue, {} restarts]",
                l.name, l.placement, l.queue_bytes, l.max_restarts
            );
            for o in self.objects.iter().filter(|o| o.loop_id as usize == i) {
                let _ = writeln!(s, "  object {}: {}", o.name, o.type_name);
            }
        }
        let obj = |id: u32| &self.objects[id as usize];
        let target = |(id, slot): (u32, &'static str)| {
            let o = obj(id);
            format!(
                "{}.{} @{}",
                o.name,
                short(slot),
                self.loops[o.loop_id as usize].name
            )
        };
        for sig in &self.signals {
            let targets: Vec<String> = sig.slots.receivers().into_iter().map(target).collect();
            let _ = writeln!(
                s,
                "signal {}.{}({}) -> [{}]",
                obj(sig.emitter).name,
                sig.name,
                sig.payload,
                targets.join(", ")
            );
        }
        for w in &self.works {
            let targets: Vec<String> = w.slots.receivers().into_iter().map(target).collect();
            let _ = writeln!(
                s,
                "work {}({}) -> one of [{}]",
                w.name,
                w.payload,
                targets.join(", ")
            );
        }
        s
    }
}

/// The last path segment of a slot's type name (`my_crate::Ponger::on_ping` → `on_ping`).
pub(crate) fn short(slot: &str) -> &str {
    slot.rsplit("::").next().unwrap_or(slot)
}

fn add_slot<P, T, F>(slots: &mut dyn ErasedSlots, receiver: ObjectRef<T>, slot: F)
where
    P: Payload,
    T: Component,
    F: Fn(&mut T, &mut Ctx<'_, T>, &P) + Copy + Send + Sync + 'static,
{
    let call: SlotCall<P> = Arc::new(move |obj: &mut dyn Any, core: &mut LoopCore, me: u32, p: &P| {
        if let Some(obj) = obj.downcast_mut::<Holder<T>>() {
            slot(&mut obj.0, &mut Ctx::new(core, me), p);
        }
    });
    if let Some(slots) = slots.as_any_mut().downcast_mut::<Slots<P>>() {
        slots.entries.push(SlotEntry {
            object: receiver.id,
            name: std::any::type_name::<F>(),
            call,
        });
    }
}

/// A component in a box, as a loop holds it.
pub(crate) trait ObjectBox {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn start(&mut self, core: &mut LoopCore, me: u32);
    fn stopping(&mut self, core: &mut LoopCore, me: u32);
    fn stop(&mut self, core: &mut LoopCore, me: u32);
    fn save(&mut self) -> Result<Option<Vec<u8>>, String>;
    fn restore(&mut self, state: &[u8]) -> Result<(), String>;
}

pub(crate) struct Holder<T>(pub(crate) T);

impl<T: Component> ObjectBox for Holder<T> {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn start(&mut self, core: &mut LoopCore, me: u32) {
        self.0.on_start(&mut Ctx::new(core, me));
    }
    fn stopping(&mut self, core: &mut LoopCore, me: u32) {
        self.0.on_stopping(&mut Ctx::new(core, me));
    }
    fn stop(&mut self, core: &mut LoopCore, me: u32) {
        self.0.on_stop(&mut Ctx::new(core, me));
    }
    fn save(&mut self) -> Result<Option<Vec<u8>>, String> {
        self.0.save()
    }
    fn restore(&mut self, state: &[u8]) -> Result<(), String> {
        self.0.restore(state)
    }
}

pub(crate) type SlotCall<P> = Arc<dyn Fn(&mut dyn Any, &mut LoopCore, u32, &P) + Send + Sync>;

pub(crate) struct SlotEntry<P> {
    pub(crate) object: u32,
    pub(crate) name: &'static str,
    pub(crate) call: SlotCall<P>,
}

impl<P> Clone for SlotEntry<P> {
    fn clone(&self) -> Self {
        SlotEntry {
            object: self.object,
            name: self.name,
            call: Arc::clone(&self.call),
        }
    }
}

/// The slots connected to one signal (or consuming one work queue), typed by the payload.
pub(crate) struct Slots<P> {
    pub(crate) entries: Vec<SlotEntry<P>>,
}

impl<P> Default for Slots<P> {
    fn default() -> Self {
        Slots { entries: Vec::new() }
    }
}

/// [`Slots`] with the payload type erased.
pub(crate) trait ErasedSlots: Send {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// `(object, slot name)` of every connection.
    fn receivers(&self) -> Vec<(u32, &'static str)>;
    /// The dispatcher for the connections whose object satisfies `keep`.
    fn dispatcher(&self, keep: &dyn Fn(u32) -> bool) -> Box<dyn crate::event_loop::Dispatch>;
}

impl<P: Payload> ErasedSlots for Slots<P> {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn receivers(&self) -> Vec<(u32, &'static str)> {
        self.entries.iter().map(|e| (e.object, e.name)).collect()
    }
    fn dispatcher(&self, keep: &dyn Fn(u32) -> bool) -> Box<dyn crate::event_loop::Dispatch> {
        Box::new(Slots {
            entries: self
                .entries
                .iter()
                .filter(|e| keep(e.object))
                .cloned()
                .collect::<Vec<_>>(),
        })
    }
}
