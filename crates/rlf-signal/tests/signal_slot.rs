//! Behaviour of loops, signals, slots, work queues and supervision on one loop (serial mode), across threads and
//! across processes. Process loops re-run this test binary: `main` calls `rlf_signal::child_entry` first. Tests that
//! need a whole application in a process of its own (SIGKILL of a child, SIGINT, SIGTERM, a single-threaded parent
//! that forks its children) re-run it with `RLF_SIGNAL_TEST_PARENT` set.

use libtest_mimic::{Arguments, Failed, Trial};
use rlf_signal::{
    App, AppBuilder, BuildError, Component, Ctx, EmitError, Fault, Inlet, LoopRef, Outcome, Signal, WorkQueue,
};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PARENT_ROLE: &str = "RLF_SIGNAL_TEST_PARENT";

/// What objects on the main loop record for the test to check.
type Sink = Arc<Mutex<Vec<(String, i64)>>>;

fn record(sink: &Sink, key: &str, value: i64) {
    sink.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((key.to_string(), value));
}

fn values(sink: &Sink, key: &str) -> Vec<i64> {
    let v = sink.lock().unwrap_or_else(|p| p.into_inner());
    v.iter().filter(|(k, _)| k == key).map(|(_, x)| *x).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Mode {
    Serial,
    Thread,
    Process,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Cfg {
    mode: Mode,
    n: u32,
}

fn cfg(app: &mut AppBuilder) -> Result<Cfg, BuildError> {
    let c: Cfg = app.config()?;
    app.set_serial(c.mode == Mode::Serial);
    Ok(c)
}

/// A loop placed as the mode says (serial mode folds it into the main loop).
fn place(app: &mut AppBuilder, c: &Cfg, name: &str) -> LoopRef {
    match c.mode {
        Mode::Thread => app.thread_loop(name),
        Mode::Serial | Mode::Process => app.process_loop(name),
    }
}

fn run(name: &str, c: Cfg, sink: &Sink) -> Result<Outcome, Failed> {
    let app = App::new(name).with_config(&c)?;
    let sink = sink.clone();
    Ok(app.run(move |b| build(b, sink))?)
}

fn expect_success(o: &Outcome) -> Result<(), Failed> {
    if o.success() {
        Ok(())
    } else {
        Err(format!("application failed: {o}").into())
    }
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// Every scenario's graph, chosen by the application's name.
fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
    match app.name() {
        "pingpong" => pingpong::build(app, sink),
        "fanout" => fanout::build(app, sink),
        "drain" => drain::build(app, sink),
        "timers" => timers::build(app, sink),
        "idle" => idle::build(app, sink),
        "backpressure" => backpressure::build(app, sink),
        "panic" => panic::build(app, sink),
        "failing" => failing::build(app, sink),
        "victim" => victim::build(app, sink),
        "quiet" => quiet::build(app, sink),
        "work" => work::build(app, sink),
        "chatter" => chatter::build(app, sink),
        "phoenix" => phoenix::build(app, sink),
        "pulse" => pulse::build(app, sink),
        "forked" => forked::build(app, sink),
        "inlet" => inlet::build(app, sink),
        "kept" => kept::build(app, sink, None),
        "roster" => roster::build(app, sink),
        other => Err(BuildError::User(format!("unknown test application {other}"))),
    }
}

/// The main loop's view of every loop (`Ctx::loops`): its process, its thread once it has sent a heartbeat, its
/// waiting messages, its heartbeat's age; the other loops have none.
mod roster {
    use super::*;

    pub struct Watcher {
        pub sink: Sink,
        pub began: Instant,
        /// Set once the view is recorded: the timer goes on firing while the application stops.
        pub recorded: bool,
    }
    pub struct Worker {
        pub sink: Sink,
    }

    impl Component for Watcher {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            ctx.timer_periodic(Duration::from_millis(20), Self::look);
        }
    }
    impl Watcher {
        fn look(&mut self, ctx: &mut Ctx<Self>) {
            let loops = ctx.loops().expect("the main loop has the view");
            let waiting =
                loops.iter().any(|l| l.tid.is_none()) && self.began.elapsed() < Duration::from_secs(10);
            if self.recorded || waiting {
                return;
            }
            self.recorded = true;
            record(&self.sink, "loops", loops.len() as i64);
            for l in &loops {
                let number = |v: Option<u32>| v.map_or(-1, i64::from);
                record(&self.sink, &format!("{}.pid", l.name), number(l.pid));
                record(&self.sink, &format!("{}.tid", l.name), number(l.tid));
                record(
                    &self.sink,
                    &format!("{}.queued", l.name),
                    l.queued.map_or(-1, |q| q as i64),
                );
                record(&self.sink, &format!("{}.running", l.name), i64::from(l.running));
                let silent = l.silent.map_or(-1, |s| s.as_millis() as i64);
                record(&self.sink, &format!("{}.silent_ms", l.name), silent);
                for object in &l.objects {
                    record(&self.sink, &format!("{}.runs.{object}", l.name), 1);
                }
            }
            ctx.stop_app();
        }
    }
    impl Component for Worker {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            record(&self.sink, "worker_has_a_view", i64::from(ctx.loops().is_some()));
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        app.set_heartbeat(Duration::from_millis(100));
        let main = app.main_loop();
        let t = app.thread_loop("thread");
        let p = app.process_loop("proc");
        let watcher = app.object::<Watcher>(main, "watcher");
        let on_thread = app.object::<Worker>(t, "on_thread");
        let on_process = app.object::<Worker>(p, "on_process");
        let (s1, s2, s3) = (sink.clone(), sink.clone(), sink);
        app.construct(watcher, move || Watcher {
            sink: s1,
            began: Instant::now(),
            recorded: false,
        });
        app.construct(on_thread, move || Worker { sink: s2 });
        app.construct(on_process, move || Worker { sink: s3 });
        Ok(())
    }

    pub fn test() -> Result<(), Failed> {
        let sink = Sink::default();
        let app = App::new("roster").with_config(&())?;
        let s = sink.clone();
        let outcome = app.run(move |b| build(b, s))?;
        expect_success(&outcome)?;
        let one = |key: &str| -> Result<i64, Failed> {
            match values(&sink, key)[..] {
                [v] => Ok(v),
                ref other => Err(format!("{key}: recorded {other:?}, not one value").into()),
            }
        };
        let me = i64::from(std::process::id());
        let my_thread = i64::from(rustix::thread::gettid().as_raw_nonzero().get());
        check(one("loops")? == 3, || "three loops".into())?;
        check(one("main.pid")? == me && one("thread.pid")? == me, || {
            "main and thread in this process".into()
        })?;
        let child = one("proc.pid")?;
        check(child > 0 && child != me, || {
            format!("the process loop's own process, not {child}")
        })?;
        check(one("main.tid")? == my_thread, || {
            "the main loop's thread is the caller of run".into()
        })?;
        let thread = one("thread.tid")?;
        check(thread > 0 && thread != my_thread, || {
            format!("the thread loop's own thread, not {thread}")
        })?;
        check(one("proc.tid")? > 0, || {
            "the process loop's thread, from its heartbeat".into()
        })?;
        for name in ["main", "thread", "proc"] {
            check(one(&format!("{name}.queued"))? >= 0, || {
                format!("{name}: a queue depth")
            })?;
            check(one(&format!("{name}.running"))? == 1, || {
                format!("{name}: running")
            })?;
        }
        for (name, object) in [
            ("main", "watcher"),
            ("thread", "on_thread"),
            ("proc", "on_process"),
        ] {
            check(one(&format!("{name}.runs.{object}"))? == 1, || {
                format!("{name} runs {object}")
            })?;
        }
        check(one("main.silent_ms")? == -1, || {
            "the main loop does not beat".into()
        })?;
        for name in ["thread", "proc"] {
            let silent = one(&format!("{name}.silent_ms"))?;
            check((0..1000).contains(&silent), || {
                format!("{name}: silent {silent} ms")
            })?;
        }
        check(one("worker_has_a_view")? == 0, || {
            "only the main loop has the view".into()
        })
    }
}

/// A thread outside the loops emits through inlets: numbers to an echoer on another loop, then a signal back to its
/// own object's loop; everything arrives, in order.
mod inlet {
    use super::*;

    pub struct Gate {
        pub numbers: Signal<u32>,
        pub finished: Signal<u32>,
        pub n: u32,
        pub sink: Sink,
        pub thread: Option<std::thread::JoinHandle<()>>,
    }
    pub struct Echoer {
        pub echo: Signal<u32>,
    }

    impl Component for Gate {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            let numbers: Inlet<u32> = ctx.inlet(&self.numbers);
            let finished = ctx.inlet(&self.finished);
            let n = self.n;
            self.thread = Some(std::thread::spawn(move || {
                for i in 0..n {
                    numbers.emit(&i).expect("emit through the inlet");
                }
                finished.emit(&n).expect("emit to the gate's own loop");
            }));
        }
        fn on_stop(&mut self, _: &mut Ctx<Self>) {
            if let Some(t) = self.thread.take() {
                t.join().expect("the emitting thread ends");
            }
        }
    }
    impl Gate {
        fn on_echo(&mut self, ctx: &mut Ctx<Self>, i: &u32) {
            record(&self.sink, "echo", i64::from(*i));
            if values(&self.sink, "echo").len() as u32 == self.n && !values(&self.sink, "finished").is_empty()
            {
                ctx.stop_app();
            }
        }
        fn on_finished(&mut self, ctx: &mut Ctx<Self>, n: &u32) {
            record(&self.sink, "finished", i64::from(*n));
            if values(&self.sink, "echo").len() as u32 == self.n {
                ctx.stop_app();
            }
        }
    }
    impl Component for Echoer {}
    impl Echoer {
        fn on_number(&mut self, ctx: &mut Ctx<Self>, i: &u32) {
            ctx.emit(&self.echo, i).expect("emit echo");
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let main = app.main_loop();
        let far = place(app, &c, "far");
        let gate = app.object::<Gate>(main, "gate");
        let echoer = app.object::<Echoer>(far, "echoer");
        let numbers = app.signal::<u32, _>(gate, "numbers");
        let finished = app.signal::<u32, _>(gate, "finished");
        let echo = app.signal::<u32, _>(echoer, "echo");
        app.connect(numbers, echoer, Echoer::on_number);
        app.connect(finished, gate, Gate::on_finished);
        app.connect(echo, gate, Gate::on_echo);
        let n = c.n;
        app.construct(gate, move || Gate {
            numbers,
            finished,
            n,
            sink,
            thread: None,
        });
        app.construct(echoer, move || Echoer { echo });
        Ok(())
    }

    pub fn test(mode: Mode) -> Result<(), Failed> {
        let sink = Sink::default();
        let o = run("inlet", Cfg { mode, n: 5000 }, &sink)?;
        expect_success(&o)?;
        let echoes = values(&sink, "echo");
        check(echoes == (0..5000).collect::<Vec<_>>(), || {
            format!(
                "{} echoes, first out of order at {:?}",
                echoes.len(),
                echoes.iter().enumerate().find(|(i, v)| *i as i64 != **v)
            )
        })?;
        check(values(&sink, "finished") == [5000], || {
            format!("finished {:?}", values(&sink, "finished"))
        })
    }
}

/// An object that keeps queuing work for its own loop (an off-policy learner's next round) stops when the
/// application does: its `on_stopping` runs when the stop begins (after the main loop's), `Ctx::stopping` tells its
/// slot to queue no more, and the loop drains and runs `on_stop` well within the stop timeout (which would otherwise
/// be a fault: the loop never drains).
mod stopping {
    use super::*;

    pub struct Stopper {
        pub sink: Sink,
    }
    pub struct Spinner {
        pub tick: Signal<u32>,
        pub sink: Sink,
        pub ticks: u32,
    }

    impl Component for Stopper {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            ctx.timer_once(Duration::from_millis(50), |_: &mut Self, c| c.stop_app());
        }
        fn on_stopping(&mut self, ctx: &mut Ctx<Self>) {
            record(&self.sink, "main_stopping", i64::from(u8::from(ctx.stopping())));
        }
    }
    impl Component for Spinner {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            ctx.emit(&self.tick, &0).expect("the first tick");
        }
        fn on_stopping(&mut self, _: &mut Ctx<Self>) {
            record(&self.sink, "stopping", i64::from(self.ticks));
        }
        fn on_stop(&mut self, ctx: &mut Ctx<Self>) {
            record(&self.sink, "stopped", i64::from(u8::from(ctx.stopping())));
        }
    }
    impl Spinner {
        fn on_tick(&mut self, ctx: &mut Ctx<Self>, n: &u32) {
            if ctx.stopping() {
                return;
            }
            self.ticks += 1;
            ctx.emit(&self.tick, &(n + 1)).expect("the next tick");
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let main = app.main_loop();
        let far = place(app, &c, "far");
        let stopper = app.object::<Stopper>(main, "stopper");
        let spinner = app.object::<Spinner>(far, "spinner");
        let tick = app.signal::<u32, _>(spinner, "tick");
        app.connect(tick, spinner, Spinner::on_tick);
        let main_sink = sink.clone();
        app.construct(stopper, move || Stopper { sink: main_sink });
        app.construct(spinner, move || Spinner { tick, sink, ticks: 0 });
        Ok(())
    }

    pub fn test(mode: Mode) -> Result<(), Failed> {
        let sink = Sink::default();
        let app = App::new("stopping").with_config(&Cfg { mode, n: 0 })?;
        let built = sink.clone();
        let o = app.run(move |b| build(b, built))?;
        expect_success(&o)?;
        check(values(&sink, "main_stopping") == [1], || format!("{sink:?}"))?;
        let stopping = values(&sink, "stopping");
        check(stopping.len() == 1 && stopping[0] > 0, || format!("{sink:?}"))?;
        check(values(&sink, "stopped") == [1], || format!("{sink:?}"))
    }
}

mod pingpong {
    use super::*;

    pub struct Pinger {
        pub ping: Signal<u32>,
        pub sink: Sink,
        pub waiting: bool,
        pub next: u32,
        pub rounds: u32,
    }
    pub struct Ponger {
        pub pong: Signal<u32>,
        pub hello: Signal<u32>,
    }

    impl Component for Pinger {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            ctx.timer_periodic(Duration::from_millis(1), Pinger::tick);
        }
        fn on_stop(&mut self, _: &mut Ctx<Self>) {
            record(&self.sink, "stopped", 1);
        }
    }
    impl Pinger {
        fn tick(&mut self, ctx: &mut Ctx<Self>) {
            if !self.waiting && self.next < self.rounds {
                self.waiting = true;
                ctx.emit(&self.ping, &self.next).expect("emit ping");
                self.next += 1;
            }
        }
        fn on_pong(&mut self, ctx: &mut Ctx<Self>, n: &u32) {
            record(&self.sink, "pong", i64::from(*n));
            self.waiting = false;
            if *n + 1 == self.rounds {
                ctx.stop_app();
            }
        }
        fn on_hello(&mut self, _: &mut Ctx<Self>, pid: &u32) {
            record(&self.sink, "hello_pid", i64::from(*pid));
        }
    }
    impl Component for Ponger {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            ctx.timer_once(Duration::from_millis(1), Ponger::greet);
        }
    }
    impl Ponger {
        fn greet(&mut self, ctx: &mut Ctx<Self>) {
            ctx.emit(&self.hello, &std::process::id()).expect("emit hello");
        }
        fn on_ping(&mut self, ctx: &mut Ctx<Self>, n: &u32) {
            ctx.emit(&self.pong, n).expect("emit pong");
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let main = app.main_loop();
        let far = place(app, &c, "far");
        let pinger = app.object::<Pinger>(main, "pinger");
        let ponger = app.object::<Ponger>(far, "ponger");
        let ping = app.signal::<u32, _>(pinger, "ping");
        let pong = app.signal::<u32, _>(ponger, "pong");
        let hello = app.signal::<u32, _>(ponger, "hello");
        app.connect(ping, ponger, Ponger::on_ping);
        app.connect(pong, pinger, Pinger::on_pong);
        app.connect(hello, pinger, Pinger::on_hello);
        let rounds = c.n;
        app.construct(pinger, move || Pinger {
            ping,
            sink,
            waiting: false,
            next: 0,
            rounds,
        });
        app.construct(ponger, move || Ponger { pong, hello });
        Ok(())
    }

    pub fn test(mode: Mode) -> Result<(), Failed> {
        let sink = Sink::default();
        let o = run("pingpong", Cfg { mode, n: 20 }, &sink)?;
        expect_success(&o)?;
        let pongs = values(&sink, "pong");
        check(pongs == (0..20).collect::<Vec<_>>(), || {
            format!("pongs {pongs:?}")
        })?;
        let pid = values(&sink, "hello_pid");
        let me = i64::from(std::process::id());
        let remote = mode == Mode::Process;
        check(pid.len() == 1 && (pid[0] != me) == remote, || {
            format!("hello from pid {pid:?}, test pid {me}, mode {mode:?}")
        })?;
        check(values(&sink, "stopped") == [1], || {
            "on_stop did not run once".into()
        })?;
        let loops = if mode == Mode::Serial { 1 } else { 2 };
        check(o.loops.len() == loops, || format!("loops {:?}", o.loops))?;
        let main = o
            .loop_report("main")
            .and_then(|l| l.stats)
            .ok_or("no main stats")?;
        check(main.timers_fired >= 20 && main.cpu_micros > 0, || {
            format!("main stats {main:?}")
        })
    }
}

mod fanout {
    use super::*;

    pub struct Source {
        pub seq: Signal<u32>,
        pub n: u32,
    }
    pub struct Checker {
        pub name: &'static str,
        pub next: u32,
        pub n: u32,
        pub in_order: bool,
        pub done: Signal<(String, u32, bool)>,
    }
    pub struct Collector {
        pub sink: Sink,
        pub dones: usize,
        pub expect: usize,
    }

    impl Component for Source {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            let half = self.n / 2;
            for i in 0..half {
                ctx.emit(&self.seq, &i).expect("emit");
            }
            let rest: Vec<u32> = (half..self.n).collect();
            for chunk in rest.chunks(100) {
                ctx.emit_many(&self.seq, chunk).expect("emit_many");
            }
        }
    }
    impl Component for Checker {}
    impl Checker {
        fn on_seq(&mut self, ctx: &mut Ctx<Self>, i: &u32) {
            self.in_order &= *i == self.next;
            self.next += 1;
            if self.next == self.n {
                let report = (self.name.to_string(), self.next, self.in_order);
                ctx.emit(&self.done, &report).expect("emit done");
            }
        }
    }
    impl Component for Collector {}
    impl Collector {
        fn on_done(&mut self, ctx: &mut Ctx<Self>, (name, count, ordered): &(String, u32, bool)) {
            record(&self.sink, &format!("{name}.count"), i64::from(*count));
            record(&self.sink, &format!("{name}.ordered"), i64::from(*ordered));
            self.dones += 1;
            if self.dones == self.expect {
                ctx.stop_app();
            }
        }
    }

    pub const RECEIVERS: [(&str, usize); 4] = [("r_main", 0), ("r_a1", 1), ("r_a2", 1), ("r_b", 2)];

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let main = app.main_loop();
        let src = if c.mode == Mode::Serial {
            place(app, &c, "src")
        } else {
            app.thread_loop("src")
        };
        let a = place(app, &c, "a");
        let b = if c.mode == Mode::Serial {
            place(app, &c, "b")
        } else {
            app.thread_loop("b")
        };
        let loops = [main, a, b];
        let source = app.object::<Source>(src, "source");
        let collector = app.object::<Collector>(main, "collector");
        let seq = app.signal::<u32, _>(source, "seq");
        for (name, l) in RECEIVERS {
            let r = app.object::<Checker>(loops[l], name);
            let done = app.signal::<(String, u32, bool), _>(r, "done");
            app.connect(seq, r, Checker::on_seq);
            app.connect(done, collector, Collector::on_done);
            let n = c.n;
            app.construct(r, move || Checker {
                name,
                next: 0,
                n,
                in_order: true,
                done,
            });
        }
        let n = c.n;
        app.construct(source, move || Source { seq, n });
        app.construct(collector, move || Collector {
            sink,
            dones: 0,
            expect: RECEIVERS.len(),
        });
        Ok(())
    }

    pub fn test(mode: Mode) -> Result<(), Failed> {
        let sink = Sink::default();
        let n = 20_000;
        let o = run("fanout", Cfg { mode, n }, &sink)?;
        expect_success(&o)?;
        for (name, _) in RECEIVERS {
            let count = values(&sink, &format!("{name}.count"));
            let ordered = values(&sink, &format!("{name}.ordered"));
            check(count == [i64::from(n)] && ordered == [1], || {
                format!("{name}: count {count:?} in order {ordered:?}")
            })?;
        }
        if mode != Mode::Serial {
            // Two receivers on loop "a" share one message per signal.
            let a = o
                .loop_report("a")
                .and_then(|l| l.stats)
                .ok_or("no stats for loop a")?;
            check(
                a.received < u64::from(n) + 10 && a.dispatched >= 2 * u64::from(n),
                || format!("loop a stats {a:?}"),
            )?;
        }
        Ok(())
    }
}

mod drain {
    use super::*;

    pub struct Flood {
        pub item: Signal<u32>,
        pub n: u32,
    }
    pub struct Slow {
        pub seen: u32,
        pub last: Option<u32>,
        pub in_order: bool,
        pub total: Signal<(u32, bool)>,
    }
    pub struct Tally {
        pub sink: Sink,
    }

    impl Component for Flood {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            for i in 0..self.n {
                ctx.emit(&self.item, &i).expect("emit");
            }
            ctx.stop_app();
        }
    }
    impl Component for Slow {
        fn on_stop(&mut self, ctx: &mut Ctx<Self>) {
            ctx.emit(&self.total, &(self.seen, self.in_order))
                .expect("emit total");
        }
    }
    impl Slow {
        fn on_item(&mut self, _: &mut Ctx<Self>, i: &u32) {
            // Simulated work, so that the stop request overtakes the queue.
            let mut x = u64::from(*i);
            for k in 0..20_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(k));
            }
            self.in_order &= self.last.map_or(*i == 0, |l| *i == l + 1);
            self.last = Some(*i);
            self.seen += 1;
        }
    }
    impl Component for Tally {}
    impl Tally {
        fn on_total(&mut self, _: &mut Ctx<Self>, (seen, ordered): &(u32, bool)) {
            record(&self.sink, "seen", i64::from(*seen));
            record(&self.sink, "ordered", i64::from(*ordered));
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let main = app.main_loop();
        let src = if c.mode == Mode::Serial {
            main
        } else {
            app.thread_loop("src")
        };
        let dst = place(app, &c, "dst");
        let flood = app.object::<Flood>(src, "flood");
        let slow = app.object::<Slow>(dst, "slow");
        let tally = app.object::<Tally>(main, "tally");
        let item = app.signal::<u32, _>(flood, "item");
        let total = app.signal::<(u32, bool), _>(slow, "total");
        app.connect(item, slow, Slow::on_item);
        app.connect(total, tally, Tally::on_total);
        let n = c.n;
        app.construct(flood, move || Flood { item, n });
        app.construct(slow, move || Slow {
            seen: 0,
            last: None,
            in_order: true,
            total,
        });
        app.construct(tally, move || Tally { sink });
        Ok(())
    }

    pub fn test(mode: Mode) -> Result<(), Failed> {
        let sink = Sink::default();
        let o = run("drain", Cfg { mode, n: 3000 }, &sink)?;
        expect_success(&o)?;
        check(
            values(&sink, "seen") == [3000] && values(&sink, "ordered") == [1],
            || {
                format!(
                    "after stop: seen {:?} ordered {:?}",
                    values(&sink, "seen"),
                    values(&sink, "ordered")
                )
            },
        )?;
        check(o.stopped_by.as_deref() == Some("flood"), || {
            format!("stopped by {:?}", o.stopped_by)
        })
    }
}

mod timers {
    use super::*;

    pub struct Clock {
        pub sink: Sink,
        pub t0: Option<Instant>,
        pub ticks: u32,
        pub periodic: Option<rlf_signal::TimerId>,
    }
    const ONCE_MS: [u64; 6] = [30, 10, 20, 5, 25, 15];

    impl Component for Clock {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            self.t0 = Some(Instant::now());
            ctx.timer_once(Duration::from_millis(30), |s: &mut Self, c| s.fired(c, 30));
            ctx.timer_once(Duration::from_millis(10), |s: &mut Self, c| s.fired(c, 10));
            ctx.timer_once(Duration::from_millis(20), |s: &mut Self, c| s.fired(c, 20));
            ctx.timer_once(Duration::from_millis(5), |s: &mut Self, c| s.fired(c, 5));
            ctx.timer_once(Duration::from_millis(25), |s: &mut Self, c| s.fired(c, 25));
            ctx.timer_once(Duration::from_millis(15), |s: &mut Self, c| s.fired(c, 15));
            let cancelled = ctx.timer_once(Duration::from_millis(12), |s: &mut Self, c| s.fired(c, 12));
            ctx.cancel_timer(cancelled);
            self.periodic = Some(ctx.timer_periodic(Duration::from_millis(7), Clock::tick));
            ctx.timer_once(Duration::from_millis(60), |_: &mut Self, c| c.stop_app());
        }
    }
    impl Clock {
        fn elapsed_us(&self) -> i64 {
            self.t0.map_or(0, |t| t.elapsed().as_micros() as i64)
        }
        fn fired(&mut self, _: &mut Ctx<Self>, label: u64) {
            record(&self.sink, "order", label as i64);
            record(&self.sink, &format!("at{label}"), self.elapsed_us());
        }
        fn tick(&mut self, ctx: &mut Ctx<Self>) {
            self.ticks += 1;
            record(&self.sink, "tick", self.elapsed_us());
            if self.ticks == 5 {
                if let Some(t) = self.periodic.take() {
                    ctx.cancel_timer(t);
                }
            }
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let l = if c.mode == Mode::Serial {
            app.main_loop()
        } else {
            place(app, &c, "clock")
        };
        let clock = app.object::<Clock>(l, "clock");
        app.construct(clock, move || Clock {
            sink,
            t0: None,
            ticks: 0,
            periodic: None,
        });
        Ok(())
    }

    pub fn test(mode: Mode) -> Result<(), Failed> {
        let sink = Sink::default();
        let o = run("timers", Cfg { mode, n: 0 }, &sink)?;
        expect_success(&o)?;
        let order = values(&sink, "order");
        let mut sorted = ONCE_MS.map(|x| x as i64).to_vec();
        sorted.sort_unstable();
        check(order == sorted, || {
            format!("fired in order {order:?}, 12 ms was cancelled")
        })?;
        for ms in ONCE_MS {
            let at = values(&sink, &format!("at{ms}"));
            check(at.len() == 1 && at[0] >= ms as i64 * 1000, || {
                format!("{ms} ms timer fired at {at:?} µs")
            })?;
        }
        let ticks = values(&sink, "tick");
        check(ticks.len() == 5, || {
            format!("periodic fired {} times", ticks.len())
        })?;
        for (k, at) in ticks.iter().enumerate() {
            check(*at >= 7000 * (k as i64 + 1), || {
                format!("tick {k} at {at} µs: early")
            })?;
        }
        Ok(())
    }
}

mod idle {
    use super::*;

    pub struct Sleeper {
        pub whoami: Signal<(u32, u32)>,
        pub tid: fn() -> u32,
    }
    pub struct Watcher {
        pub sink: Sink,
        pub target: Option<(u32, u32)>,
        pub before: Option<u64>,
    }

    fn switches(pid: u32, tid: u32) -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
        let sum = s
            .lines()
            .filter(|l| {
                l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        Some(sum)
    }

    pub fn gettid() -> u32 {
        rustix::thread::gettid().as_raw_nonzero().get() as u32
    }

    impl Component for Sleeper {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            ctx.emit(&self.whoami, &(std::process::id(), (self.tid)()))
                .expect("emit");
        }
    }
    impl Component for Watcher {}
    impl Watcher {
        fn on_whoami(&mut self, ctx: &mut Ctx<Self>, who: &(u32, u32)) {
            self.target = Some(*who);
            ctx.timer_once(Duration::from_millis(100), Watcher::first);
        }
        fn first(&mut self, ctx: &mut Ctx<Self>) {
            self.before = self.target.and_then(|(p, t)| switches(p, t));
            ctx.timer_once(Duration::from_millis(1000), Watcher::second);
        }
        fn second(&mut self, ctx: &mut Ctx<Self>) {
            let after = self.target.and_then(|(p, t)| switches(p, t));
            if let (Some(a), Some(b)) = (after, self.before) {
                record(&self.sink, "switches", (a - b) as i64);
            }
            ctx.stop_app();
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let main = app.main_loop();
        let l = place(app, &c, "idle");
        let sleeper = app.object::<Sleeper>(l, "sleeper");
        let watcher = app.object::<Watcher>(main, "watcher");
        let whoami = app.signal::<(u32, u32), _>(sleeper, "whoami");
        app.connect(whoami, watcher, Watcher::on_whoami);
        app.construct(sleeper, move || Sleeper { whoami, tid: gettid });
        app.construct(watcher, move || Watcher {
            sink,
            target: None,
            before: None,
        });
        Ok(())
    }

    pub fn test(mode: Mode) -> Result<(), Failed> {
        let sink = Sink::default();
        let o = run("idle", Cfg { mode, n: 0 }, &sink)?;
        expect_success(&o)?;
        let s = values(&sink, "switches");
        check(s.len() == 1 && s[0] <= 1, || {
            format!("idle loop thread switched context {s:?} times in 1 s")
        })?;
        let cpu = o.loop_report("idle").and_then(|l| l.stats).map(|s| s.cpu_micros);
        check(cpu.is_some_and(|c| c < 100_000), || {
            format!("the idle loop used {cpu:?} µs of CPU in 1.1 s")
        })
    }
}

mod backpressure {
    use super::*;

    pub struct Tx {
        pub item: Signal<u32>,
        pub gate: mpsc::Sender<()>,
        pub sink: Sink,
        pub n: u32,
    }
    pub struct Rx {
        pub gate: mpsc::Receiver<()>,
        pub next: u32,
        pub in_order: bool,
        pub n: u32,
        pub done: Signal<(u32, bool)>,
    }

    impl Component for Tx {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            let mut released = false;
            for i in 0..self.n {
                match ctx.emit(&self.item, &i) {
                    Ok(()) => {}
                    Err(EmitError::Full { waited, .. }) if !released => {
                        record(&self.sink, "full_at", i64::from(i));
                        record(&self.sink, "waited_ms", waited.as_millis() as i64);
                        record(
                            &self.sink,
                            "blocked_before_release",
                            ctx.stats().blocked_emits as i64,
                        );
                        released = true;
                        let _ = self.gate.send(());
                        ctx.emit(&self.item, &i)
                            .expect("retry after the receiver resumed");
                    }
                    Err(e) => panic!("unexpected emit error: {e}"),
                }
            }
        }
    }
    impl Tx {
        fn on_done(&mut self, ctx: &mut Ctx<Self>, (count, ordered): &(u32, bool)) {
            record(&self.sink, "count", i64::from(*count));
            record(&self.sink, "ordered", i64::from(*ordered));
            ctx.stop_app();
        }
    }
    impl Component for Rx {
        fn on_start(&mut self, _: &mut Ctx<Self>) {
            // A receiver that is busy until the emitter has seen its queue full.
            let _ = self.gate.recv();
        }
    }
    impl Rx {
        fn on_item(&mut self, ctx: &mut Ctx<Self>, i: &u32) {
            self.in_order &= *i == self.next;
            self.next += 1;
            if self.next == self.n {
                ctx.emit(&self.done, &(self.next, self.in_order))
                    .expect("emit done");
            }
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        app.set_emit_timeout(Duration::from_millis(100));
        let main = app.main_loop();
        let l = app.thread_loop("rx");
        app.set_queue_bytes(l, 1024);
        let tx = app.object::<Tx>(main, "tx");
        let rx = app.object::<Rx>(l, "rx");
        let item = app.signal::<u32, _>(tx, "item");
        let done = app.signal::<(u32, bool), _>(rx, "done");
        app.connect(item, rx, Rx::on_item);
        app.connect(done, tx, Tx::on_done);
        let (gate_tx, gate_rx) = mpsc::channel();
        let n = c.n;
        app.construct(tx, move || Tx {
            item,
            gate: gate_tx,
            sink,
            n,
        });
        app.construct(rx, move || Rx {
            gate: gate_rx,
            next: 0,
            in_order: true,
            n,
            done,
        });
        Ok(())
    }

    pub fn test() -> Result<(), Failed> {
        let sink = Sink::default();
        let t0 = Instant::now();
        let o = run(
            "backpressure",
            Cfg {
                mode: Mode::Thread,
                n: 500,
            },
            &sink,
        )?;
        expect_success(&o)?;
        let full_at = values(&sink, "full_at");
        check(full_at.len() == 1 && full_at[0] > 10 && full_at[0] < 200, || {
            format!("queue reported full at {full_at:?}")
        })?;
        check(
            values(&sink, "waited_ms") == [100] && t0.elapsed() >= Duration::from_millis(100),
            || "emitter did not wait the emit timeout".into(),
        )?;
        check(
            values(&sink, "blocked_before_release")
                .first()
                .is_some_and(|b| *b >= 1),
            || "blocked emit not counted".into(),
        )?;
        check(
            values(&sink, "count") == [500] && values(&sink, "ordered") == [1],
            || {
                format!(
                    "receiver got {:?} (in order {:?})",
                    values(&sink, "count"),
                    values(&sink, "ordered")
                )
            },
        )?;
        let tx = o
            .loop_report("main")
            .and_then(|l| l.stats)
            .ok_or("no main stats")?;
        check(tx.blocked_emits >= 2 && tx.failed_emits == 1, || {
            format!("emitter stats {tx:?}")
        })
    }
}

/// Two objects on one loop that answer each other forever: the loop must still fire timers and stop.
mod chatter {
    use super::*;

    pub struct Talker {
        pub say: Signal<u32>,
        pub sink: Sink,
        pub heard: u32,
        pub starts: bool,
        pub quiet: bool,
    }

    impl Component for Talker {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            if self.starts {
                ctx.emit(&self.say, &0).expect("emit");
                ctx.timer_once(Duration::from_millis(50), Talker::enough);
            }
        }
        fn on_stop(&mut self, _: &mut Ctx<Self>) {
            record(&self.sink, "heard", i64::from(self.heard));
        }
    }
    impl Talker {
        fn on_hear(&mut self, ctx: &mut Ctx<Self>, n: &u32) {
            self.heard += 1;
            if !self.quiet {
                let _ = ctx.emit(&self.say, &(n + 1));
            }
        }
        /// Fires while the two still chatter (the proof that they do not starve the loop), then ends the chatter
        /// so that the graceful stop can drain.
        fn enough(&mut self, ctx: &mut Ctx<Self>) {
            record(&self.sink, "timer", 1);
            self.quiet = true;
            ctx.stop_app();
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        cfg(app)?;
        let main = app.main_loop();
        let a = app.object::<Talker>(main, "a");
        let b = app.object::<Talker>(main, "b");
        let say_a = app.signal::<u32, _>(a, "say");
        let say_b = app.signal::<u32, _>(b, "say");
        app.connect(say_a, b, Talker::on_hear);
        app.connect(say_b, a, Talker::on_hear);
        let (sa, sb) = (sink.clone(), sink);
        app.construct(a, move || Talker {
            say: say_a,
            sink: sa,
            heard: 0,
            starts: true,
            quiet: false,
        });
        app.construct(b, move || Talker {
            say: say_b,
            sink: sb,
            heard: 0,
            starts: false,
            quiet: false,
        });
        Ok(())
    }

    pub fn test() -> Result<(), Failed> {
        let sink = Sink::default();
        let o = run(
            "chatter",
            Cfg {
                mode: Mode::Serial,
                n: 0,
            },
            &sink,
        )?;
        expect_success(&o)?;
        check(values(&sink, "timer") == vec![1], || {
            format!("timer fired {:?}", values(&sink, "timer"))
        })?;
        let heard = values(&sink, "heard");
        check(heard.len() == 2 && heard.iter().all(|h| *h > 100), || {
            format!("heard {heard:?}")
        })
    }
}

mod panic {
    use super::*;

    pub struct Trigger {
        pub arm: Signal<u32>,
    }
    pub struct Bomb;

    impl Component for Trigger {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            for i in 0..6 {
                ctx.emit(&self.arm, &i).expect("emit");
            }
        }
    }
    impl Component for Bomb {}
    impl Bomb {
        fn on_arm(&mut self, _: &mut Ctx<Self>, n: &u32) {
            assert!(*n != 3, "boom at {n}");
        }
    }

    pub fn build(app: &mut AppBuilder, _sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let main = app.main_loop();
        let l = place(app, &c, "worker");
        let trigger = app.object::<Trigger>(main, "trigger");
        let bomb = app.object::<Bomb>(l, "bomb");
        let arm = app.signal::<u32, _>(trigger, "arm");
        app.connect(arm, bomb, Bomb::on_arm);
        app.construct(trigger, move || Trigger { arm });
        app.construct(bomb, || Bomb);
        Ok(())
    }

    pub fn test(mode: Mode) -> Result<(), Failed> {
        let o = run("panic", Cfg { mode, n: 0 }, &Sink::default())?;
        let expected_loop = if mode == Mode::Serial { "main" } else { "worker" };
        check(!o.success() && o.exit_code() == 1, || format!("outcome {o}"))?;
        check(
            o.faults.iter().any(|f| {
                matches!(f, Fault::SlotPanicked { loop_name, object, slot, message }
                if loop_name == expected_loop && object == "bomb" && slot == "on_arm" && message == "boom at 3")
            }),
            || format!("faults {:?}", o.faults),
        )
    }
}

mod failing {
    use super::*;

    pub struct Feeder {
        pub item: Signal<u32>,
        pub sink: Sink,
    }
    pub struct Checker {
        pub seen: Signal<u32>,
    }

    impl Component for Feeder {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            for i in 0..6 {
                ctx.emit(&self.item, &i).expect("emit");
            }
        }
    }
    impl Feeder {
        fn on_seen(&mut self, _: &mut Ctx<Self>, n: &u32) {
            record(&self.sink, "seen", i64::from(*n));
        }
    }
    impl Component for Checker {}
    impl Checker {
        /// Gives up on item 3 with a two-line error; the items before it reach the feeder.
        fn on_item(&mut self, ctx: &mut Ctx<Self>, n: &u32) {
            if *n == 3 {
                ctx.fail(format!("item {n} is bad\n  (three)"));
            } else if *n < 3 {
                ctx.emit(&self.seen, n).expect("emit seen");
            }
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let main = app.main_loop();
        let l = place(app, &c, "worker");
        let feeder = app.object::<Feeder>(main, "feeder");
        let checker = app.object::<Checker>(l, "checker");
        let item = app.signal::<u32, _>(feeder, "item");
        let seen = app.signal::<u32, _>(checker, "seen");
        app.connect(item, checker, Checker::on_item);
        app.connect(seen, feeder, Feeder::on_seen);
        app.construct(feeder, move || Feeder { item, sink });
        app.construct(checker, move || Checker { seen });
        Ok(())
    }

    /// `Ctx::fail` in any loop reaches the outcome as one fault naming the loop and the object,
    /// on one line, and stops the application with exit code 1.
    pub fn test(mode: Mode) -> Result<(), Failed> {
        let sink = Sink::default();
        let o = run("failing", Cfg { mode, n: 0 }, &sink)?;
        let expected_loop = if mode == Mode::Serial { "main" } else { "worker" };
        check(!o.success() && o.exit_code() == 1, || format!("outcome {o}"))?;
        let expected = Fault::Component {
            loop_name: expected_loop.into(),
            object: "checker".into(),
            message: "item 3 is bad (three)".into(),
        };
        check(o.faults == [expected.clone()], || {
            format!("faults {:?}", o.faults)
        })?;
        check(
            expected.to_string() == format!("loop {expected_loop}: object checker: item 3 is bad (three)"),
            || expected.to_string(),
        )?;
        check(values(&sink, "seen") == [0, 1, 2], || {
            format!("{:?}", values(&sink, "seen"))
        })
    }
}

mod victim {
    use super::*;

    pub struct Victim {
        pub pid: Signal<u32>,
    }
    pub struct Killer {
        pub sink: Sink,
    }
    impl Component for Victim {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            ctx.emit(&self.pid, &std::process::id()).expect("emit");
        }
    }
    impl Component for Killer {}
    impl Killer {
        fn on_pid(&mut self, _: &mut Ctx<Self>, pid: &u32) {
            record(&self.sink, "victim_pid", i64::from(*pid));
            if let Some(p) = rustix::process::Pid::from_raw(*pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
            record(&self.sink, "killed_at_ms", now_ms());
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let main = app.main_loop();
        let l = app.process_loop("victim");
        let other = app.process_loop("bystander");
        let victim = app.object::<Victim>(l, "victim");
        let bystander = app.object::<Victim>(other, "bystander");
        let killer = app.object::<Killer>(main, "killer");
        let pid = app.signal::<u32, _>(victim, "pid");
        let unused = app.signal::<u32, _>(bystander, "pid");
        app.connect(pid, killer, Killer::on_pid);
        app.construct(victim, move || Victim { pid });
        app.construct(bystander, move || Victim { pid: unused });
        app.construct(killer, move || Killer { sink });
        Ok(())
    }
}

mod quiet {
    use super::*;

    pub struct Idle {
        pub ready: Signal<u32>,
    }
    pub struct Reporter;
    impl Component for Idle {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            ctx.emit(&self.ready, &std::process::id()).expect("emit");
        }
    }
    impl Component for Reporter {}
    impl Reporter {
        fn on_ready(&mut self, _: &mut Ctx<Self>, pid: &u32) {
            println!("READY {pid}");
        }
    }

    pub fn build(app: &mut AppBuilder, _sink: Sink) -> Result<(), BuildError> {
        let main = app.main_loop();
        let p = app.process_loop("proc");
        let t = app.thread_loop("thread");
        let idle = app.object::<Idle>(p, "idle");
        let idle_t = app.object::<Idle>(t, "idle_t");
        let reporter = app.object::<Reporter>(main, "reporter");
        let ready = app.signal::<u32, _>(idle, "ready");
        let ready_t = app.signal::<u32, _>(idle_t, "ready");
        app.connect(ready, reporter, Reporter::on_ready);
        app.construct(idle, move || Idle { ready });
        app.construct(idle_t, move || Idle { ready: ready_t });
        app.construct(reporter, || Reporter);
        Ok(())
    }
}

mod work {
    use super::*;

    pub struct Producer {
        pub jobs: WorkQueue<u32>,
        pub n: u32,
        pub sink: Sink,
        pub handled: u32,
    }
    pub struct Consumer {
        pub id: u32,
        pub handled: Signal<(u32, u32)>,
    }
    impl Component for Producer {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            for i in 0..self.n {
                ctx.submit(&self.jobs, &i).expect("submit");
            }
        }
    }
    impl Producer {
        fn on_handled(&mut self, ctx: &mut Ctx<Self>, (consumer, item): &(u32, u32)) {
            record(&self.sink, "item", i64::from(*item));
            record(&self.sink, "by", i64::from(*consumer));
            self.handled += 1;
            if self.handled == self.n {
                ctx.stop_app();
            }
        }
    }
    impl Component for Consumer {}
    impl Consumer {
        fn on_job(&mut self, ctx: &mut Ctx<Self>, item: &u32) {
            ctx.emit(&self.handled, &(self.id, *item)).expect("emit handled");
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c = cfg(app)?;
        let main = app.main_loop();
        let w1 = place(app, &c, "w1");
        let w2 = place(app, &c, "w2");
        let w3 = if c.mode == Mode::Serial {
            place(app, &c, "w3")
        } else {
            app.thread_loop("w3")
        };
        let producer = app.object::<Producer>(main, "producer");
        let jobs = app.work_queue::<u32>("jobs", 1 << 16);
        for (id, l) in [w1, w1, w2, w3].into_iter().enumerate() {
            let cons = app.object::<Consumer>(l, &format!("c{id}"));
            let handled = app.signal::<(u32, u32), _>(cons, "handled");
            app.consume(jobs, cons, Consumer::on_job);
            app.connect(handled, producer, Producer::on_handled);
            app.construct(cons, move || Consumer {
                id: id as u32,
                handled,
            });
        }
        let n = c.n;
        app.construct(producer, move || Producer {
            jobs,
            n,
            sink,
            handled: 0,
        });
        Ok(())
    }

    pub fn test(mode: Mode) -> Result<(), Failed> {
        let sink = Sink::default();
        let n = 3000;
        let o = run("work", Cfg { mode, n }, &sink)?;
        expect_success(&o)?;
        let mut items = values(&sink, "item");
        items.sort_unstable();
        check(items == (0..i64::from(n)).collect::<Vec<_>>(), || {
            format!("{} items handled, not each of {n} exactly once", items.len())
        })?;
        let by = values(&sink, "by");
        let used: std::collections::BTreeSet<i64> = by.into_iter().collect();
        check(!used.is_empty(), || "no consumer".into())
    }
}

/// Heartbeats and replacement: the main loop kills the worker's first process (SIGKILL) and freezes the second
/// (SIGSTOP, so it stops sending heartbeats); each is replaced by a new process of a higher incarnation. With no
/// replacement allowed, the frozen process is named hung and the application stops.
mod phoenix {
    use super::*;

    pub struct Worker {
        pub hello: Signal<(u32, u32)>,
    }
    pub struct Watcher {
        pub sink: Sink,
    }
    impl Component for Worker {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            // From the loop's first turn, after its first heartbeat.
            ctx.timer_once(Duration::ZERO, Worker::greet);
        }
    }
    impl Worker {
        fn greet(&mut self, ctx: &mut Ctx<Self>) {
            let hello = (std::process::id(), ctx.incarnation());
            ctx.emit(&self.hello, &hello).expect("emit hello");
        }
    }
    impl Component for Watcher {}
    impl Watcher {
        fn on_hello(&mut self, ctx: &mut Ctx<Self>, &(pid, incarnation): &(u32, u32)) {
            record(&self.sink, "incarnation", i64::from(incarnation));
            record(&self.sink, "pid", i64::from(pid));
            let signal = match incarnation {
                0 => rustix::process::Signal::KILL,
                1 => rustix::process::Signal::STOP,
                _ => return ctx.stop_app(),
            };
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, signal);
            }
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        let c: Cfg = app.config()?;
        app.set_heartbeat(Duration::from_millis(300));
        let main = app.main_loop();
        let l = app.process_loop("worker");
        app.restart_on_failure(l, c.n);
        let worker = app.object::<Worker>(l, "worker");
        let watcher = app.object::<Watcher>(main, "watcher");
        let hello = app.signal::<(u32, u32), _>(worker, "hello");
        app.connect(hello, watcher, Watcher::on_hello);
        app.construct(worker, move || Worker { hello });
        app.construct(watcher, move || Watcher { sink });
        Ok(())
    }

    pub fn test_replaced() -> Result<(), Failed> {
        let sink = Sink::default();
        let mode = Mode::Process;
        let o = run("phoenix", Cfg { mode, n: 2 }, &sink)?;
        expect_success(&o)?;
        check(values(&sink, "incarnation") == [0, 1, 2], || {
            format!("incarnations {:?}", values(&sink, "incarnation"))
        })?;
        let pids = values(&sink, "pid");
        let reasons: Vec<&str> = o.restarts.iter().map(|r| r.reason.as_str()).collect();
        check(
            o.restarts.len() == 2
                && reasons[0].contains("signal: 9")
                && reasons[1].starts_with("hung (no heartbeat for")
                && o.restarts
                    .iter()
                    .zip(&pids)
                    .all(|(r, p)| r.old_pid.map(i64::from) == Some(*p))
                && o.restarts
                    .iter()
                    .zip(&pids[1..])
                    .all(|(r, p)| r.new_pid.map(i64::from) == Some(*p))
                && o.restarts.iter().all(|r| r.loop_name == "worker"),
            || format!("restarts {:?}, pids {pids:?}", o.restarts),
        )?;
        for pid in pids {
            no_segments(pid as u32)?;
        }
        Ok(())
    }

    pub fn test_hung_stops() -> Result<(), Failed> {
        let sink = Sink::default();
        let mode = Mode::Process;
        let started = Instant::now();
        let o = run("phoenix", Cfg { mode, n: 1 }, &sink)?;
        let took = started.elapsed();
        check(values(&sink, "incarnation") == [0, 1], || {
            format!("incarnations {:?}", values(&sink, "incarnation"))
        })?;
        check(
            o.restarts.len() == 1
                && o.faults.len() == 1
                && matches!(&o.faults[0], Fault::Hung { loop_name, silent_ms } if loop_name == "worker" && *silent_ms >= 300),
            || format!("outcome: {o}"),
        )?;
        check(took < Duration::from_secs(5), || {
            format!("the hung loop was named after {took:?}")
        })?;
        check(o.exit_code() == 1, || format!("exit code {}", o.exit_code()))
    }
}

/// A slot that runs for three heartbeat intervals: with its loop's pulse beating as it goes, the loop is not taken
/// for hung; without, it is named hung and the application stops. A stop requested meanwhile waits for the beating
/// loop past the stop timeout (up to four of them), and names the silent one.
mod pulse {
    use super::*;

    /// `Cfg::n`: bit 0, the slot beats its pulse; bit 1, the application is stopped as the slot starts.
    const BEAT: u32 = 1;
    const STOP_EARLY: u32 = 2;

    pub struct Worker {
        pub beat: bool,
        pub started: Signal<u32>,
        pub done: Signal<u32>,
    }
    pub struct Watcher {
        pub stop_early: bool,
    }
    impl Component for Worker {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            ctx.timer_once(Duration::ZERO, Worker::work);
        }
    }
    impl Worker {
        /// 900 ms of "work" (sleeps standing for computation), in steps of 50 ms.
        fn work(&mut self, ctx: &mut Ctx<Self>) {
            ctx.emit(&self.started, &std::process::id())
                .expect("emit started");
            let mut pulse = ctx.pulse().filter(|_| self.beat);
            for _ in 0..18 {
                std::thread::sleep(Duration::from_millis(50));
                if let Some(p) = &mut pulse {
                    p.beat();
                }
            }
            ctx.emit(&self.done, &std::process::id()).expect("emit done");
        }
    }
    impl Component for Watcher {}
    impl Watcher {
        fn on_started(&mut self, ctx: &mut Ctx<Self>, _pid: &u32) {
            if self.stop_early {
                ctx.stop_app();
            }
        }
        fn on_done(&mut self, ctx: &mut Ctx<Self>, _pid: &u32) {
            ctx.stop_app();
        }
    }

    pub fn build(app: &mut AppBuilder, _sink: Sink) -> Result<(), BuildError> {
        let c: Cfg = app.config()?;
        app.set_heartbeat(Duration::from_millis(300));
        app.set_stop_timeout(Duration::from_millis(300));
        let main = app.main_loop();
        let l = app.process_loop("worker");
        let worker = app.object::<Worker>(l, "worker");
        let watcher = app.object::<Watcher>(main, "watcher");
        let started = app.signal::<u32, _>(worker, "started");
        let done = app.signal::<u32, _>(worker, "done");
        app.connect(started, watcher, Watcher::on_started);
        app.connect(done, watcher, Watcher::on_done);
        let beat = c.n & BEAT != 0;
        let stop_early = c.n & STOP_EARLY != 0;
        app.construct(worker, move || Worker { beat, started, done });
        app.construct(watcher, move || Watcher { stop_early });
        Ok(())
    }

    fn run_with(n: u32) -> Result<Outcome, Failed> {
        run(
            "pulse",
            Cfg {
                mode: Mode::Process,
                n,
            },
            &Sink::default(),
        )
    }

    pub fn test_beating() -> Result<(), Failed> {
        let o = run_with(BEAT)?;
        expect_success(&o)?;
        check(o.restarts.is_empty(), || format!("outcome: {o}"))
    }

    pub fn test_silent() -> Result<(), Failed> {
        let o = run_with(0)?;
        check(
            o.faults.len() == 1
                && matches!(&o.faults[0], Fault::Hung { loop_name, .. } if loop_name == "worker"),
            || format!("outcome: {o}"),
        )
    }

    pub fn test_stop_waits_for_a_beating_loop() -> Result<(), Failed> {
        expect_success(&run_with(BEAT | STOP_EARLY)?)?;
        let o = run_with(STOP_EARLY)?;
        check(
            o.faults.len() == 1
                && matches!(&o.faults[0], Fault::StopTimeout { loop_name } if loop_name == "worker"),
            || format!("outcome: {o}"),
        )
    }
}

/// Process loops forked from the application's process (`AppBuilder::set_fork`) run the objects its own build
/// function made; a process with threads cannot fork safely, and re-executes the binary instead.
mod forked {
    use super::*;

    /// What a child process tells the main loop about itself.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Hello {
        pid: u32,
        /// The process whose build function made this object.
        built_by: u32,
        /// Whether the environment names this process's role (only a re-executed binary is told).
        told_role: bool,
        /// Whether the process is named `rlf-loop-<id>`.
        named: bool,
    }

    pub struct Greeter {
        hello: Signal<Hello>,
        built_by: u32,
        loop_id: u32,
    }
    pub struct Collector {
        sink: Sink,
        expected: usize,
        seen: usize,
    }

    impl Component for Greeter {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            let comm = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
            let hello = Hello {
                pid: std::process::id(),
                built_by: self.built_by,
                told_role: std::env::var_os(rlf_signal::CHILD_ENV).is_some(),
                named: comm.trim_end() == format!("rlf-loop-{}", self.loop_id),
            };
            ctx.emit(&self.hello, &hello).expect("emit hello");
        }
    }
    impl Component for Collector {}
    impl Collector {
        fn on_hello(&mut self, ctx: &mut Ctx<Self>, hello: &Hello) {
            record(&self.sink, "pid", i64::from(hello.pid));
            record(&self.sink, "built_by", i64::from(hello.built_by));
            record(&self.sink, "told_role", i64::from(hello.told_role));
            record(&self.sink, "named", i64::from(hello.named));
            self.seen += 1;
            if self.seen == self.expected {
                ctx.stop_app();
            }
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink) -> Result<(), BuildError> {
        app.set_fork(true);
        let main = app.main_loop();
        let collector = app.object::<Collector>(main, "collector");
        let built_by = std::process::id();
        for i in 0..2 {
            let l = app.process_loop(&format!("child_{i}"));
            let greeter = app.object::<Greeter>(l, &format!("greeter_{i}"));
            let hello = app.signal::<Hello, _>(greeter, "hello");
            app.connect(hello, collector, Collector::on_hello);
            // Loop 0 is the main loop.
            let loop_id = i + 1;
            app.construct(greeter, move || Greeter {
                hello,
                built_by,
                loop_id,
            });
        }
        app.construct(collector, move || Collector {
            sink,
            expected: 2,
            seen: 0,
        });
        Ok(())
    }

    /// The values of `key` among a parent role's `SINK <key> <value>` lines.
    fn sunk(lines: &[String], key: &str) -> Vec<i64> {
        let prefix = format!("SINK {key} ");
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .collect()
    }

    pub fn test_single_threaded() -> Result<(), Failed> {
        let (child, lines) = spawn_parent("forked")?;
        let parent = child.id();
        let status = wait_for(child, Duration::from_secs(30))?;
        let lines = all_lines(&lines, Duration::from_secs(10));
        check(status.success(), || format!("{status}: {lines:?}"))?;
        let pids = sunk(&lines, "pid");
        check(
            pids.len() == 2 && pids[0] != pids[1] && !pids.contains(&i64::from(parent)),
            || format!("children {pids:?} of {parent}"),
        )?;
        check(sunk(&lines, "built_by") == [i64::from(parent); 2], || {
            format!("the children's objects were not the parent's: {lines:?}")
        })?;
        check(sunk(&lines, "told_role") == [0, 0], || {
            format!("a child was re-executed: {lines:?}")
        })?;
        check(sunk(&lines, "named") == [1, 1], || format!("names: {lines:?}"))?;
        no_segments(parent)
    }

    pub fn test_with_threads() -> Result<(), Failed> {
        // A thread besides this one, whatever the harness runs tests on.
        let (tx, rx) = mpsc::channel::<()>();
        let helper = std::thread::spawn(move || rx.recv());
        let sink = Sink::default();
        let s = sink.clone();
        let o = App::new("forked").run(move |b| build(b, s));
        drop(tx);
        let _ = helper.join();
        expect_success(&o?)?;
        let pids = values(&sink, "pid");
        check(pids.len() == 2, || format!("children {pids:?}"))?;
        check(values(&sink, "built_by") == pids, || {
            format!("each child builds its own objects: {sink:?}")
        })?;
        check(values(&sink, "told_role") == [1, 1], || {
            format!("children not re-executed: {sink:?}")
        })?;
        check(values(&sink, "named") == [1, 1], || format!("names: {sink:?}"))
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Runs an application as the whole of this process (for the SIGKILL / SIGINT / SIGTERM tests); prints facts for
/// the test to check and exits with the outcome's code.
fn parent_role(name: &str) -> ExitCode {
    let sink = Sink::default();
    let s = sink.clone();
    match App::new(name).run(move |b| build(b, s)) {
        Ok(o) => {
            for f in &o.faults {
                println!("FAULT {f}");
            }
            for v in values(&sink, "victim_pid") {
                println!("VICTIM {v}");
            }
            for k in values(&sink, "killed_at_ms") {
                println!("KILL_TO_RETURN_MS {}", now_ms() - k);
            }
            for (key, value) in sink.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                println!("SINK {key} {value}");
            }
            ExitCode::from(o.exit_code())
        }
        Err(e) => {
            println!("ERROR {e}");
            ExitCode::from(3)
        }
    }
}

/// Starts this binary in a parent role; returns it and a channel of its stdout lines.
fn spawn_parent(name: &str) -> Result<(std::process::Child, mpsc::Receiver<String>), Failed> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .env(PARENT_ROLE, name)
        .stdout(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok((child, rx))
}

/// Waits (blocking, in a helper thread) for a child until `timeout`; kills it past that.
fn wait_for(child: std::process::Child, timeout: Duration) -> Result<std::process::ExitStatus, Failed> {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let mut child = child;
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(timeout) {
        Ok(status) => Ok(status?),
        Err(_) => {
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
            Err(format!("process {pid} did not exit within {timeout:?}").into())
        }
    }
}

/// Every line until the process's stdout closes (all its children gone too), or `timeout`.
fn all_lines(lines: &mpsc::Receiver<String>, timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        out.push(line);
    }
    out
}

fn no_segments(pid: u32) -> Result<(), Failed> {
    let left = rlf_shm::region::segments_of(pid)?;
    check(left.is_empty(), || {
        format!("segments left behind by {pid}: {left:?}")
    })
}

fn sigkill_child() -> Result<(), Failed> {
    let (child, lines) = spawn_parent("victim")?;
    let parent = child.id();
    let status = wait_for(child, Duration::from_secs(10))?;
    let out = all_lines(&lines, Duration::from_secs(5));
    check(status.code() == Some(1), || {
        format!("parent exited with {status}; output {out:?}")
    })?;
    check(
        out.iter()
            .any(|l| l.starts_with("FAULT loop victim: process") && l.contains("signal: 9")),
        || format!("no fault naming the killed loop: {out:?}"),
    )?;
    let ms: Vec<i64> = out
        .iter()
        .filter_map(|l| l.strip_prefix("KILL_TO_RETURN_MS ")?.parse().ok())
        .collect();
    check(ms.len() == 1 && ms[0] < 1000, || {
        format!("kill to stop took {ms:?} ms")
    })?;
    no_segments(parent)?;
    for v in out
        .iter()
        .filter_map(|l| l.strip_prefix("VICTIM ")?.parse::<u32>().ok())
    {
        no_segments(v)?;
    }
    Ok(())
}

fn interrupt(sig: rustix::process::Signal, code: i32) -> Result<(), Failed> {
    let (child, lines) = spawn_parent("quiet")?;
    let parent = child.id();
    let ready = lines.recv_timeout(Duration::from_secs(10));
    let pid = rustix::process::Pid::from_raw(parent as i32).ok_or("bad pid")?;
    let _ = rustix::process::kill_process(pid, sig);
    let status = wait_for(child, Duration::from_secs(10))?;
    let ready = ready.map_err(|_| "the application never became ready")?;
    let grandchild: u32 = ready
        .strip_prefix("READY ")
        .and_then(|p| p.parse().ok())
        .ok_or("bad READY line")?;
    check(status.code() == Some(code), || {
        format!("parent exited with {status}, expected {code}")
    })?;
    no_segments(parent)?;
    check(
        !std::path::Path::new(&format!("/proc/{grandchild}")).exists(),
        || format!("loop process {grandchild} outlived the application"),
    )
}

/// A transport of another flavour (here: counting, over the in-process one) runs the same components unchanged.
struct Counting {
    inner: rlf_signal::QueueTransport,
    sends: std::sync::atomic::AtomicU64,
}

impl rlf_signal::Transport for Counting {
    fn send(
        &self,
        to: rlf_signal::Endpoint,
        msgs: &[&[u8]],
        timeout: Duration,
    ) -> Result<(), rlf_signal::SendError> {
        self.sends
            .fetch_add(msgs.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.inner.send(to, msgs, timeout)
    }
    fn recv(
        &self,
        from: rlf_signal::Endpoint,
        out: &mut rlf_signal::Inbound,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<usize, rlf_signal::RecvError> {
        self.inner.recv(from, out, max, deadline)
    }
    fn close(&self, endpoint: rlf_signal::Endpoint) {
        self.inner.close(endpoint);
    }
}

fn custom_transport() -> Result<(), Failed> {
    let t = Arc::new(Counting {
        inner: rlf_signal::QueueTransport::local(&[rlf_signal::DEFAULT_QUEUE_BYTES; 2], &[]),
        sends: Default::default(),
    });
    let sink = Sink::default();
    let s = sink.clone();
    let app = App::new("pingpong").with_config(&Cfg {
        mode: Mode::Thread,
        n: 20,
    })?;
    let o = app.run_with_transport(t.clone(), move |b| build(b, s))?;
    expect_success(&o)?;
    check(values(&sink, "pong").len() == 20, || "pongs missing".into())?;
    let sends = t.sends.load(std::sync::atomic::Ordering::Relaxed);
    check(sends >= 41, || {
        format!("only {sends} sends went through the custom transport")
    })
}

fn graph() -> Result<(), Failed> {
    let c = Cfg {
        mode: Mode::Process,
        n: 1,
    };
    let app = App::new("pingpong").with_config(&c)?;
    let text = app.describe(|b| build(b, Sink::default()))?;
    for line in [
        "loop main [Main",
        "loop far [Process",
        "object ponger: signal_slot::pingpong::Ponger",
        "signal pinger.ping(u32) -> [ponger.on_ping @far]",
        "signal ponger.pong(u32) -> [pinger.on_pong @main]",
    ] {
        check(text.contains(line), || format!("graph lacks {line:?}:\n{text}"))?;
    }
    let work = App::new("work")
        .with_config(&c)?
        .describe(|b| build(b, Sink::default()))?;
    check(
        work.contains(
            "work jobs(u32) -> one of [c0.on_job @w1, c1.on_job @w1, c2.on_job @w2, c3.on_job @w3]",
        ),
        || format!("work graph:\n{work}"),
    )?;
    let incomplete = App::new("x").run(|b| {
        let main = b.main_loop();
        b.object::<panic::Bomb>(main, "bomb");
        Ok(())
    });
    check(
        matches!(incomplete, Err(rlf_signal::RunError::Build(BuildError::NotConstructed { ref object })) if object == "bomb"),
        || format!("{incomplete:?}"),
    )
}

/// Serial mode keeps the state of a stopped application, and a run restored from it ends where one that never
/// stopped does: two steppers on work-queue loops mix their own random streams into a walker's, with jobs and
/// answers in flight at every instant.
mod kept {
    use super::*;
    use rlf_signal::KeptState;

    #[derive(Debug, Clone, Copy, Serialize, Deserialize)]
    pub struct KeptCfg {
        /// Answers after which the walker stops the application.
        pub stop_at: u32,
        /// Keep the state at the stop.
        pub keep: bool,
    }

    fn mix(x: u64, y: u64) -> u64 {
        (x ^ y)
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
    }

    #[derive(Serialize, Deserialize)]
    pub struct Walker {
        #[serde(skip)]
        pub jobs: Option<WorkQueue<u64>>,
        pub stop_at: u32,
        #[serde(skip)]
        pub sink: Sink,
        pub x: u64,
        pub answers: u32,
    }
    #[derive(Serialize, Deserialize)]
    pub struct Stepper {
        #[serde(skip)]
        pub stepped: Option<Signal<u64>>,
        pub state: u64,
    }
    impl Component for Walker {
        fn on_start(&mut self, ctx: &mut Ctx<Self>) {
            if let Some(jobs) = &self.jobs {
                for i in 0..3 {
                    ctx.submit(jobs, &i).expect("submit");
                }
            }
        }
        fn save(&mut self) -> Result<Option<Vec<u8>>, String> {
            postcard::to_stdvec(&(self.x, self.answers))
                .map(Some)
                .map_err(|e| e.to_string())
        }
        fn restore(&mut self, state: &[u8]) -> Result<(), String> {
            (self.x, self.answers) = postcard::from_bytes(state).map_err(|e| e.to_string())?;
            Ok(())
        }
    }
    impl Walker {
        fn on_stepped(&mut self, ctx: &mut Ctx<Self>, value: &u64) {
            self.x = mix(self.x, *value);
            self.answers += 1;
            record(&self.sink, "x", self.x as i64);
            if self.answers >= self.stop_at {
                ctx.stop_app();
            }
            // The answers delivered with the one that stops the application still ask for more: the stop is taken
            // with jobs in flight.
            if let (false, Some(jobs)) = (ctx.stopping(), &self.jobs) {
                ctx.submit(jobs, &self.x).expect("submit");
            }
        }
    }
    impl Component for Stepper {
        fn save(&mut self) -> Result<Option<Vec<u8>>, String> {
            postcard::to_stdvec(&self.state)
                .map(Some)
                .map_err(|e| e.to_string())
        }
        fn restore(&mut self, state: &[u8]) -> Result<(), String> {
            self.state = postcard::from_bytes(state).map_err(|e| e.to_string())?;
            Ok(())
        }
    }
    impl Stepper {
        fn on_job(&mut self, ctx: &mut Ctx<Self>, job: &u64) {
            self.state = mix(self.state, *job);
            if let Some(stepped) = &self.stepped {
                ctx.emit(stepped, &self.state).expect("emit stepped");
            }
        }
    }

    pub fn build(app: &mut AppBuilder, sink: Sink, restore: Option<KeptState>) -> Result<(), BuildError> {
        let c: KeptCfg = app.config()?;
        app.set_serial(true).keep_state(c.keep);
        if let Some(kept) = restore {
            app.restore_state(kept);
        }
        let main = app.main_loop();
        let walker = app.object::<Walker>(main, "walker");
        let jobs = app.work_queue::<u64>("jobs", 1 << 16);
        for (i, seed) in [(1, 11u64), (2, 23)] {
            let l = app.process_loop(&format!("s{i}"));
            let stepper = app.object::<Stepper>(l, &format!("stepper{i}"));
            let stepped = app.signal::<u64, _>(stepper, "stepped");
            app.consume(jobs, stepper, Stepper::on_job);
            app.connect(stepped, walker, Walker::on_stepped);
            app.construct(stepper, move || Stepper {
                stepped: Some(stepped),
                state: seed,
            });
        }
        app.construct(walker, move || Walker {
            jobs: Some(jobs),
            stop_at: c.stop_at,
            sink,
            x: 0,
            answers: 0,
        });
        Ok(())
    }

    fn run_kept(c: KeptCfg, restore: Option<KeptState>) -> Result<(Outcome, Vec<i64>), Failed> {
        let sink = Sink::default();
        let app = App::new("kept").with_config(&c)?;
        let s = sink.clone();
        let o = app.run(move |b| build(b, s, restore))?;
        Ok((o, values(&sink, "x")))
    }

    pub fn test() -> Result<(), Failed> {
        let (whole, xs) = run_kept(
            KeptCfg {
                stop_at: 500,
                keep: false,
            },
            None,
        )?;
        expect_success(&whole)?;
        check(whole.kept.is_none(), || {
            "a state was kept without keep_state".into()
        })?;
        for stop in [1, 137, 499] {
            let (first, before) = run_kept(
                KeptCfg {
                    stop_at: stop,
                    keep: true,
                },
                None,
            )?;
            expect_success(&first)?;
            let kept = first.kept.ok_or("no state kept")?;
            check(kept.undelivered() > 0, || {
                "no undelivered message kept, with two jobs in flight".into()
            })?;
            check(
                kept.object("walker").is_some() && kept.object("stepper2").is_some(),
                || {
                    format!(
                        "kept objects: {:?}",
                        kept.objects.iter().map(|(n, _)| n).collect::<Vec<_>>()
                    )
                },
            )?;
            let (second, after) = run_kept(
                KeptCfg {
                    stop_at: 500,
                    keep: false,
                },
                Some(kept.clone()),
            )?;
            expect_success(&second)?;
            // The restored run goes on from where the first stopped (past 500 answers when that was at 499).
            let joined: Vec<i64> = before.into_iter().chain(after).collect();
            check(joined.get(..xs.len()) == Some(&xs[..]), || {
                format!(
                    "stopped at {stop} and restored: {} values, the first difference at {:?}",
                    joined.len(),
                    joined.iter().zip(&xs).position(|(a, b)| a != b)
                )
            })?;
            let mut other = kept;
            other.graph.push_str("loop extra\n");
            let refused = run_kept(
                KeptCfg {
                    stop_at: 500,
                    keep: false,
                },
                Some(other),
            );
            check(
                matches!(&refused, Err(e) if format!("{e:?}").contains("another application graph")),
                || "a state kept from another graph was not refused".into(),
            )?;
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    if let Some(code) = rlf_signal::child_entry(|b| build(b, Sink::default())) {
        return ExitCode::from(code);
    }
    if let Ok(name) = std::env::var(PARENT_ROLE) {
        return parent_role(&name);
    }
    let args = Arguments::from_args();
    let mut trials = vec![
        Trial::test("graph_is_printed_and_checked", graph),
        Trial::test(
            "a_serial_application_restored_from_its_kept_state_ends_as_one_never_stopped",
            kept::test,
        ),
        Trial::test(
            "chattering_objects_on_one_loop_do_not_starve_timers",
            chatter::test,
        ),
        Trial::test("custom_transport_same_components", custom_transport),
        Trial::test(
            "the_main_loop_sees_every_loops_process_thread_queue_and_heartbeat",
            roster::test,
        ),
        Trial::test("backpressure_blocks_then_errors_nothing_lost", backpressure::test),
        Trial::test("fault_child_sigkilled_reported_no_segments", sigkill_child),
        Trial::test("dead_and_hung_processes_are_replaced", phoenix::test_replaced),
        Trial::test(
            "a_long_slot_that_beats_its_pulse_is_not_hung",
            pulse::test_beating,
        ),
        Trial::test("a_long_slot_without_a_pulse_is_named_hung", pulse::test_silent),
        Trial::test(
            "a_stop_waits_for_a_loop_beating_in_a_long_slot",
            pulse::test_stop_waits_for_a_beating_loop,
        ),
        Trial::test(
            "single_threaded_parent_forks_its_children",
            forked::test_single_threaded,
        ),
        Trial::test(
            "parent_with_threads_reexecutes_its_children",
            forked::test_with_threads,
        ),
        Trial::test(
            "hung_process_without_replacement_is_named_and_stops_the_app",
            phoenix::test_hung_stops,
        ),
        Trial::test("sigint_stops_all_removes_segments", || {
            interrupt(rustix::process::Signal::INT, 130)
        }),
        Trial::test("sigterm_stops_all_removes_segments", || {
            interrupt(rustix::process::Signal::TERM, 143)
        }),
    ];
    for (mode, tag) in [
        (Mode::Serial, "serial"),
        (Mode::Thread, "thread"),
        (Mode::Process, "process"),
    ] {
        trials.push(Trial::test(format!("pingpong_{tag}"), move || {
            pingpong::test(mode)
        }));
        trials.push(Trial::test(
            format!("fanout_order_receivers_broadcast_{tag}"),
            move || fanout::test(mode),
        ));
        trials.push(Trial::test(format!("stop_drains_{tag}"), move || {
            drain::test(mode)
        }));
        trials.push(Trial::test(format!("fault_slot_panic_{tag}"), move || {
            panic::test(mode)
        }));
        trials.push(Trial::test(format!("fault_component_fails_{tag}"), move || {
            failing::test(mode)
        }));
        trials.push(Trial::test(format!("work_queue_exactly_once_{tag}"), move || {
            work::test(mode)
        }));
        trials.push(Trial::test(
            format!("inlet_from_foreign_thread_{tag}"),
            move || inlet::test(mode),
        ));
    }
    for (mode, tag) in [(Mode::Thread, "thread"), (Mode::Process, "process")] {
        trials.push(Trial::test(format!("idle_loop_no_wakeups_{tag}"), move || {
            idle::test(mode)
        }));
    }
    // The clock records into this process's memory, so it runs on the main loop or a thread.
    for (mode, tag) in [(Mode::Serial, "serial"), (Mode::Thread, "thread")] {
        trials.push(Trial::test(
            format!("timers_deadline_order_never_early_{tag}"),
            move || timers::test(mode),
        ));
        trials.push(Trial::test(
            format!("a_self_requeuing_object_stops_with_the_app_{tag}"),
            move || stopping::test(mode),
        ));
    }
    libtest_mimic::run(&args, trials).exit()
}
