//! Event loops, typed signals and slots, and work queues, across threads and processes.
//!
//! An application is a set of **event loops**, each on a thread or in a process of its own; **components** live on
//! loops; a component **emits signals** (typed values) and other components' **slots** (ordinary methods) receive
//! them, wherever they live. All of it is declared in one build function, which the parent and every child process
//! run alike (child processes are this program's binary re-executed with a role, see [`child_entry`], or, with
//! [`AppBuilder::set_fork`], forks of the parent that keep its build).
//!
//! # Ping-pong
//! ```
//! use rlf_signal::{App, AppBuilder, BuildError, Component, Ctx, Signal};
//! use std::time::Duration;
//!
//! struct Pinger { ping: Signal<u32>, pongs: u32 }
//! struct Ponger { pong: Signal<u32> }
//!
//! impl Component for Pinger {
//!     fn on_start(&mut self, ctx: &mut Ctx<Self>) {
//!         // A single-shot timer; `timer_periodic` exists too.
//!         ctx.timer_once(Duration::from_millis(1), Pinger::serve);
//!     }
//! }
//! impl Pinger {
//!     fn serve(&mut self, ctx: &mut Ctx<Self>) {
//!         ctx.emit(&self.ping, &0).expect("ponger's queue has room");
//!     }
//!     fn on_pong(&mut self, ctx: &mut Ctx<Self>, n: &u32) {
//!         self.pongs += 1;
//!         if *n == 9 {
//!             ctx.stop_app(); // graceful: every loop drains, then on_stop hooks run
//!         } else if let Err(e) = ctx.emit(&self.ping, &(n + 1)) {
//!             eprintln!("{e}"); // a full (past the emit timeout) or closed receiver: never a silent drop
//!         }
//!     }
//! }
//! impl Component for Ponger {}
//! impl Ponger {
//!     fn on_ping(&mut self, ctx: &mut Ctx<Self>, n: &u32) {
//!         let _ = ctx.emit(&self.pong, n);
//!     }
//! }
//!
//! // The whole wiring in one place. Declare objects and their signals, connect, then give constructors.
//! fn build(app: &mut AppBuilder) -> Result<(), BuildError> {
//!     let main = app.main_loop();
//!     let other = app.thread_loop("other"); // or app.process_loop("other")
//!     let pinger = app.object::<Pinger>(main, "pinger");
//!     let ponger = app.object::<Ponger>(other, "ponger");
//!     let ping = app.signal::<u32, _>(pinger, "ping");
//!     let pong = app.signal::<u32, _>(ponger, "pong");
//!     app.connect(ping, ponger, Ponger::on_ping);
//!     app.connect(pong, pinger, Pinger::on_pong);
//!     app.construct(pinger, move || Pinger { ping, pongs: 0 });
//!     app.construct(ponger, move || Ponger { pong });
//!     Ok(())
//! }
//!
//! // In `main`: `if let Some(code) = rlf_signal::child_entry(build) { return code; }` comes first.
//! let outcome = App::new("pingpong").run(build)?;
//! assert!(outcome.success(), "{outcome}");
//! println!("{}", App::new("pingpong").describe(build)?); // loops, objects, signals → slots
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A slot whose payload type differs from the signal's does not compile:
//! ```compile_fail
//! use rlf_signal::{AppBuilder, Component, Ctx};
//! struct A;
//! impl Component for A {}
//! impl A { fn on_text(&mut self, _: &mut Ctx<Self>, _: &String) {} }
//! fn build(app: &mut AppBuilder) {
//!     let main = app.main_loop();
//!     let a = app.object::<A>(main, "a");
//!     let s = app.signal::<u64, _>(a, "number");
//!     app.connect(s, a, A::on_text); // expected `&u64`, found `&String`
//! }
//! ```
//!
//! # Semantics in brief
//! - **Delivery**: an emit encodes the payload once (postcard) and puts one message into the inbound queue of each
//!   loop holding receivers; there it is decoded once and every connected slot gets `&payload`. A signal to a slot on
//!   the emitter's own loop is queued, not called directly. Each emitter's signals arrive in emission order.
//! - **Work queues** ([`AppBuilder::work_queue`], [`AppBuilder::consume`], [`Ctx::submit`]): each item is handled by
//!   exactly one consumer, whichever loop it lives on.
//! - **Back-pressure**: a full receiver queue blocks the emitter up to [`AppBuilder::set_emit_timeout`], then the
//!   emit returns [`EmitError`]; [`LoopStats::blocked_emits`] counts the waits.
//! - **Lifecycle**: [`Ctx::stop_app`] (or SIGINT/SIGTERM, or a fault) stops every loop: each drains its queue, then
//!   runs [`Component::on_stop`]. A panicking slot or a dead child process ends the run with a [`Fault`] naming the
//!   loop, object, slot or exit status; [`Outcome::exit_code`] is then non-zero.
//! - **Serial mode** ([`AppBuilder::set_serial`]): the same objects and connections on the main loop alone.
//! - **Transport seam**: loops reach each other only through [`Transport`]; see [`transport`].
//!
//! The wire protocol and what happens when a process dies are described in [`event_loop`].

#![forbid(unsafe_code)]

mod app;
pub mod event_loop;
mod graph;
mod kept;
mod supervisor;
pub mod transport;

pub use app::{child_entry, stop_requested, stop_signal, stop_with_parent, App, RunError, CHILD_ENV};
pub use event_loop::{Ctx, EmitError, Inlet, Pulse, TimerId};
pub use graph::{
    AppBuilder, BuildError, Component, LoopRef, ObjectRef, Payload, Placement, Signal, WorkQueue,
    DEFAULT_QUEUE_BYTES,
};
pub use kept::KeptState;
pub use supervisor::{Fault, LoopReport, LoopStats, LoopStatus, Outcome, Restart};
pub use transport::{Endpoint, Inbound, QueueTransport, RecvError, SendError, Transport, TransportHandle};
