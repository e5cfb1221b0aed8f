//! Starting an application: queues, threads, child processes (forks of this one, or this binary re-executed with a
//! role), supervision, signals, and the child side of it.

use crate::event_loop::{send_control, EventLoop, LoopPlan, Names, Routes};
use crate::graph::{AppBuilder, BuildError, Placement};
use crate::supervisor::{Control, Fault, LoopInfo, Outcome, SpawnFn, Supervisor};
use crate::transport::{QueueTransport, Transport, TransportHandle};
use rlf_shm::process::Forked;
use serde::{Deserialize, Serialize};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::ffi::CString;
use std::os::unix::process::ExitStatusExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The environment variable that tells a re-executed binary which loop to run (JSON).
pub const CHILD_ENV: &str = "RLF_SIGNAL_CHILD";

/// Why an application could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The graph is wrong.
    #[error("application graph: {0}")]
    Build(#[from] BuildError),
    /// Queues could not be created or opened.
    #[error("transport: {0}")]
    Shm(#[from] rlf_shm::ShmError),
    /// A system resource (threads, signal handlers, the program's path) was refused.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The child's description of its role does not decode.
    #[error("bad child role in {CHILD_ENV}: {0}")]
    Role(String),
    /// The child's build function declared a different graph from the parent's.
    #[error("loop {loop_id}: the child's graph differs from the parent's (the build function must be deterministic)")]
    GraphMismatch {
        /// The child's loop.
        loop_id: u32,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// What a child process is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChildSpec {
    app: String,
    /// The application's configuration, as JSON text (a string here, not an array of byte values: the spec travels
    /// in one environment variable, which the kernel caps at 128 KiB).
    config: String,
    loop_id: u32,
    /// 0 for the first process of the loop, one more for each replacement.
    incarnation: u32,
    parent: u32,
    transport: TransportHandle,
    graph: String,
}

/// An application to run: a name (which the child processes rebuild it by) and an optional configuration.
#[derive(Debug, Clone)]
pub struct App {
    name: String,
    config: Vec<u8>,
}

impl App {
    /// An application called `name` with no configuration.
    pub fn new(name: &str) -> App {
        App {
            name: name.into(),
            config: b"null".to_vec(),
        }
    }

    /// Attaches a configuration, handed (as JSON) to the build function in the parent and in every child through
    /// [`AppBuilder::config`].
    pub fn with_config<C: Serialize>(mut self, config: &C) -> Result<App, BuildError> {
        self.config = serde_json::to_vec(config).map_err(|e| BuildError::Config {
            app: self.name.clone(),
            message: e.to_string(),
        })?;
        Ok(self)
    }

    /// Builds the graph without running it and describes it.
    pub fn describe<F>(&self, build: F) -> Result<String, BuildError>
    where
        F: FnOnce(&mut AppBuilder) -> Result<(), BuildError>,
    {
        let mut b = AppBuilder::new(&self.name, self.config.clone());
        build(&mut b)?;
        b.validate()?;
        Ok(b.describe())
    }

    /// Builds the graph, starts every loop (the main loop on this thread), and returns when the application has
    /// stopped: at an object's request, after a fault, or on SIGINT/SIGTERM. Every shared-memory segment it created
    /// is removed by then (and stale ones of dead earlier runs at start). The program's `main` must call
    /// [`child_entry`] first with an equivalent build function.
    ///
    /// SIGINT and SIGTERM are handled by this process from the first call on (they become a graceful stop while an
    /// application runs; their default action is not restored afterwards).
    pub fn run<F>(&self, build: F) -> Result<Outcome, RunError>
    where
        F: FnOnce(&mut AppBuilder) -> Result<(), BuildError>,
    {
        self.run_inner(None, build)
    }

    /// [`App::run`] over a caller's transport (another flavour, such as a future MPI one, or an instrumented one):
    /// it must hold one endpoint per loop and per work queue, in declaration order (serial mode: the main loop
    /// only). Components are unchanged. Process loops need the built-in transport and fail to start here.
    pub fn run_with_transport<F>(&self, transport: Arc<dyn Transport>, build: F) -> Result<Outcome, RunError>
    where
        F: FnOnce(&mut AppBuilder) -> Result<(), BuildError>,
    {
        self.run_inner(Some(transport), build)
    }

    fn run_inner<F>(&self, custom: Option<Arc<dyn Transport>>, build: F) -> Result<Outcome, RunError>
    where
        F: FnOnce(&mut AppBuilder) -> Result<(), BuildError>,
    {
        let mut b = AppBuilder::new(&self.name, self.config.clone());
        build(&mut b)?;
        b.validate()?;
        let graph = b.describe();
        // Segments left by a SIGKILLed earlier run (their creator is dead) are removed; failure to list is harmless.
        let _ = rlf_shm::region::reclaim_stale();
        let layout = Layout::new(&b);
        let (transport, handle): (Arc<dyn Transport>, _) = match custom {
            Some(t) => (t, None),
            None => {
                let t = if b.serial {
                    QueueTransport::local(&layout.queue_bytes, &layout.work_bytes)
                } else {
                    QueueTransport::shared(&layout.queue_bytes, &layout.work_bytes)?
                };
                let handle = t.handle();
                (Arc::new(t), handle)
            }
        };
        let emit_timeout = b.emit_timeout;
        // Forked before this process starts any thread (the signal thread, the waiters, thread loops).
        let forked = match &handle {
            Some(h) if b.fork => fork_process_loops(&mut b, &layout, h),
            _ => Vec::new(),
        };
        let spawn: Option<SpawnFn> = handle.map(|h| {
            let template = ChildSpec {
                app: self.name.clone(),
                config: String::from_utf8_lossy(&self.config).into_owned(),
                loop_id: 0,
                incarnation: 0,
                parent: std::process::id(),
                transport: h,
                graph: graph.clone(),
            };
            let transport = Arc::clone(&transport);
            Box::new(move |loop_id, incarnation| {
                let spec = ChildSpec {
                    loop_id,
                    incarnation,
                    ..template.clone()
                };
                spawn_child(&spec, &transport, emit_timeout).map_err(|e| e.to_string())
            }) as SpawnFn
        });
        let infos = layout
            .physical
            .iter()
            .zip(&b.loops)
            .enumerate()
            .map(|(i, ((name, placement), decl))| LoopInfo {
                name: name.clone(),
                placement: *placement,
                max_restarts: decl.max_restarts,
                objects: b
                    .objects
                    .iter()
                    .filter(|o| layout.phys[o.loop_id as usize] as usize == i)
                    .map(|o| o.name.clone())
                    .collect(),
            })
            .collect();
        let mut sup = Supervisor::new(infos, b.stop_timeout, b.heartbeat, spawn);
        for &(id, pid) in &forked {
            match wait_for_child(pid, id, &transport, emit_timeout) {
                Ok(waiter) => sup.adopt(id, pid, waiter),
                Err(e) => sup.start_failed(id, e.to_string()),
            }
        }
        let mut plans = layout.plans(&mut b, &transport);

        // A run of its own: an earlier run's stop in this process does not carry over.
        STOP_SIGNAL.store(0, Ordering::SeqCst);
        let mut signals =
            Signals::new([SIGINT, SIGTERM]).map_err(io_err("installing SIGINT/SIGTERM handlers"))?;
        let signal_handle = signals.handle();
        let t = Arc::clone(&transport);
        let signal_thread = std::thread::Builder::new()
            .name("rlf-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    STOP_SIGNAL.store(sig, Ordering::SeqCst);
                    send_control(&*t, 0, &Control::Interrupted { signal: sig }, emit_timeout);
                }
            })
            .map_err(io_err("spawning the signal thread"))?;

        let mut threads: Vec<(u32, JoinHandle<()>)> = Vec::new();
        let main_plan = plans.remove(0);
        for plan in plans {
            let id = plan.me;
            match layout.physical[id as usize].1 {
                Placement::Process => {
                    drop(plan);
                    if !forked.iter().any(|&(f, _)| f == id) {
                        sup.spawn(id);
                    }
                }
                Placement::Thread | Placement::Main => {
                    let t = Arc::clone(&transport);
                    let name = layout.physical[id as usize].0.clone();
                    let spawned = std::thread::Builder::new().name(name.clone()).spawn(move || {
                        if let Err(panic) =
                            catch_unwind(AssertUnwindSafe(|| EventLoop::start(plan, None).run()))
                        {
                            let message = crate::event_loop::panic_message(&*panic);
                            let fault = Fault::StartFailed {
                                loop_name: name,
                                message,
                            };
                            send_control(&*t, 0, &Control::Fault(fault), emit_timeout);
                            let stats = Default::default();
                            send_control(&*t, 0, &Control::Stopped { loop_id: id, stats }, emit_timeout);
                        }
                    });
                    match spawned {
                        Ok(h) => threads.push((id, h)),
                        Err(e) => sup.start_failed(id, e.to_string()),
                    }
                }
            }
        }

        let (stats, sup) = EventLoop::start(main_plan, Some(sup)).run();
        let mut sup = sup.unwrap_or_else(|| Supervisor::new(Vec::new(), Duration::ZERO, None, None));
        for (id, h) in threads {
            if !sup.abandoned(id) {
                let _ = h.join();
            }
        }
        for w in sup.take_waiters() {
            let _ = w.join();
        }
        signal_handle.close();
        let _ = signal_thread.join();
        let mut outcome = sup.outcome(stats);
        if let Some(kept) = &mut outcome.kept {
            kept.graph = graph;
        }
        Ok(outcome)
    }
}

/// Spawns this binary as the process of one loop, and a thread that waits for it and tells the main loop.
fn spawn_child(
    spec: &ChildSpec,
    transport: &Arc<dyn Transport>,
    timeout: Duration,
) -> Result<(u32, JoinHandle<()>), RunError> {
    let exe = std::env::current_exe().map_err(io_err("locating this program's binary"))?;
    let json = serde_json::to_string(spec).map_err(|e| RunError::Role(e.to_string()))?;
    let child = Command::new(&exe)
        .env(CHILD_ENV, json)
        .spawn()
        .map_err(io_err(format!("starting {}", exe.display())))?;
    // The waiter reaps it by pid, as it does forked children.
    let pid = child.id();
    let waiter = wait_for_child(pid, spec.loop_id, transport, timeout)?;
    Ok((pid, waiter))
}

/// Forks the process of every process loop while this process has a single thread: the `(loop, pid)` of each
/// child. It stops at the first loop it cannot fork (this process has threads, or fork failed): those loops are
/// started by re-executing the binary.
fn fork_process_loops(b: &mut AppBuilder, layout: &Layout, handle: &TransportHandle) -> Vec<(u32, u32)> {
    let parent = std::process::id();
    let mut forked = Vec::new();
    for (id, (_, placement)) in layout.physical.iter().enumerate().skip(1) {
        if *placement != Placement::Process {
            continue;
        }
        match rlf_shm::process::fork_if_single_threaded() {
            Ok(Some(Forked::Child)) => {
                rlf_shm::process::exit_now(run_forked(b, layout, id as u32, handle, parent))
            }
            Ok(Some(Forked::Parent(pid))) => forked.push((id as u32, pid)),
            Ok(None) | Err(_) => break,
        }
    }
    forked
}

/// The life of a forked child: the loop `loop_id` with the objects the parent's build function declared. Returns
/// the exit code; the caller exits with it at once (nothing of the parent's stack, nor its exit handlers, may run
/// here).
fn run_forked(
    b: &mut AppBuilder,
    layout: &Layout,
    loop_id: u32,
    handle: &TransportHandle,
    parent: u32,
) -> u8 {
    let run = catch_unwind(AssertUnwindSafe(|| -> Result<(), RunError> {
        become_child(parent, loop_id)?;
        let transport: Arc<dyn Transport> = Arc::new(QueueTransport::open(handle)?);
        let mut plan = layout.plan(b, loop_id, &transport);
        plan.whole_process = true;
        let result = run_loop_process(plan, transport);
        reclaim_if_orphaned(parent);
        result
    }));
    match run {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            eprintln!("rlf-signal child process {}: {e}", std::process::id());
            2
        }
        Err(_) => 101,
    }
}

/// A thread that waits for the child process `pid` of loop `loop_id` and tells the main loop when it exits.
fn wait_for_child(
    pid: u32,
    loop_id: u32,
    transport: &Arc<dyn Transport>,
    timeout: Duration,
) -> Result<JoinHandle<()>, RunError> {
    let t = Arc::clone(transport);
    std::thread::Builder::new()
        .name(format!("rlf-wait-{pid}"))
        .spawn(move || {
            let waited = loop {
                match rustix::process::waitpid(
                    rustix::process::Pid::from_raw(pid as i32),
                    rustix::process::WaitOptions::empty(),
                ) {
                    Err(rustix::io::Errno::INTR) => continue,
                    other => break other,
                }
            };
            let (status, success) = match waited {
                Ok(Some((_, s))) => {
                    let s = ExitStatus::from_raw(s.as_raw());
                    (s.to_string(), s.success())
                }
                Ok(None) => ("wait returned no status".to_string(), false),
                Err(e) => (format!("wait failed: {e}"), false),
            };
            let c = Control::Exited {
                loop_id,
                pid,
                status,
                success,
            };
            send_control(&*t, 0, &c, timeout);
        })
        .map_err(io_err("spawning a child-wait thread"))
}

/// Physical loops (serial mode folds every loop into the main one), names and routes.
struct Layout {
    /// Logical loop → physical loop.
    phys: Vec<u32>,
    physical: Vec<(String, Placement)>,
    queue_bytes: Vec<usize>,
    work_bytes: Vec<usize>,
    names: Arc<Names>,
    routes: Arc<Routes>,
}

impl Layout {
    fn new(b: &AppBuilder) -> Layout {
        let phys: Vec<u32> = (0..b.loops.len() as u32)
            .map(|i| if b.serial { 0 } else { i })
            .collect();
        let physical: Vec<(String, Placement)> = b
            .loops
            .iter()
            .take(if b.serial { 1 } else { b.loops.len() })
            .map(|l| (l.name.clone(), l.placement))
            .collect();
        let queue_bytes = b
            .loops
            .iter()
            .take(physical.len())
            .map(|l| l.queue_bytes)
            .collect();
        let obj_loop = |o: u32| phys[b.objects[o as usize].loop_id as usize];
        let dests = |receivers: Vec<(u32, &'static str)>| {
            let mut v: Vec<u32> = receivers.into_iter().map(|(o, _)| obj_loop(o)).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let routes = Routes {
            signals: b.signals.iter().map(|s| dests(s.slots.receivers())).collect(),
            works: b.works.iter().map(|w| dests(w.slots.receivers())).collect(),
        };
        let names = Names {
            loops: physical.iter().map(|(n, _)| n.clone()).collect(),
            objects: b.objects.iter().map(|o| o.name.clone()).collect(),
            signals: b
                .signals
                .iter()
                .map(|s| format!("{}.{}", b.objects[s.emitter as usize].name, s.name))
                .collect(),
            works: b.works.iter().map(|w| w.name.clone()).collect(),
        };
        Layout {
            phys,
            physical,
            queue_bytes,
            work_bytes: b.works.iter().map(|w| w.bytes).collect(),
            names: Arc::new(names),
            routes: Arc::new(routes),
        }
    }

    /// The plan of every physical loop, taking the object factories out of the builder.
    fn plans(&self, b: &mut AppBuilder, transport: &Arc<dyn Transport>) -> Vec<LoopPlan> {
        (0..self.physical.len() as u32)
            .map(|l| self.plan(b, l, transport))
            .collect()
    }

    fn plan(&self, b: &mut AppBuilder, l: u32, transport: &Arc<dyn Transport>) -> LoopPlan {
        let here: Vec<bool> = b
            .objects
            .iter()
            .map(|o| self.phys[o.loop_id as usize] == l)
            .collect();
        let keep = |o: u32| here.get(o as usize).copied().unwrap_or(false);
        let objects = b
            .objects
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| here[*i])
            .filter_map(|(i, o)| o.factory.take().map(|f| (i as u32, f)))
            .collect();
        let dispatchers = |slots: &dyn crate::graph::ErasedSlots| {
            let d = slots.dispatcher(&keep);
            (d.len() > 0).then_some(d)
        };
        LoopPlan {
            me: l,
            names: Arc::clone(&self.names),
            routes: Arc::clone(&self.routes),
            objects,
            signals: b.signals.iter().map(|s| dispatchers(&*s.slots)).collect(),
            works: b.works.iter().map(|w| dispatchers(&*w.slots)).collect(),
            transport: Arc::clone(transport),
            emit_timeout: b.emit_timeout,
            heartbeat: b.heartbeat,
            incarnation: 0,
            whole_process: false,
            keep: l == 0 && b.keep,
            restore: if l == 0 { b.restore.take() } else { None },
        }
    }
}

/// Call first in `main` (and in the `main` of a `harness = false` test): when this process was started as the
/// process of a loop, runs that loop with the graph `build` declares and returns the exit code to return from
/// `main` (or to end the process with, [`rlf_shm::process::exit_now`]); otherwise returns `None` at once.
///
/// `build` must declare the same graph as the parent's (same names, same order); it may differ in what the
/// constructors of objects on other loops capture, since only this loop's constructors run here.
pub fn child_entry<F>(build: F) -> Option<u8>
where
    F: FnOnce(&mut AppBuilder) -> Result<(), BuildError>,
{
    let json = std::env::var(CHILD_ENV).ok()?;
    Some(match run_child(&json, build) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rlf-signal child process {}: {e}", std::process::id());
            2
        }
    })
}

fn run_child<F>(json: &str, build: F) -> Result<(), RunError>
where
    F: FnOnce(&mut AppBuilder) -> Result<(), BuildError>,
{
    let spec: ChildSpec = serde_json::from_str(json).map_err(|e| RunError::Role(e.to_string()))?;
    become_child(spec.parent, spec.loop_id)?;
    let mut b = AppBuilder::new(&spec.app, spec.config.clone().into_bytes());
    build(&mut b)?;
    b.validate()?;
    if b.describe() != spec.graph || b.serial {
        return Err(RunError::GraphMismatch {
            loop_id: spec.loop_id,
        });
    }
    let layout = Layout::new(&b);
    if spec.loop_id == 0 || spec.loop_id as usize >= layout.physical.len() {
        return Err(RunError::GraphMismatch {
            loop_id: spec.loop_id,
        });
    }
    let transport: Arc<dyn Transport> = Arc::new(QueueTransport::open(&spec.transport)?);
    let mut plan = layout.plan(&mut b, spec.loop_id, &transport);
    plan.incarnation = spec.incarnation;
    plan.whole_process = true;
    drop(b);
    let result = run_loop_process(plan, transport);
    reclaim_if_orphaned(spec.parent);
    result
}

/// A child whose parent died (SIGKILL leaves it no chance to remove its shared-memory segments) removes them on its
/// way out: every segment whose creator is gone.
fn reclaim_if_orphaned(parent: u32) {
    if rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(parent) {
        let _ = rlf_shm::region::reclaim_stale();
    }
}

/// The signal that told this process to stop (0: none), set by the signal handling of [`App::run`] and of a child
/// process.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Whether this process was told to stop by a signal: SIGINT or SIGTERM in the process that runs the app, SIGTERM in
/// a loop's process (which its parent's death sends). A slot that waits on what another process provides (a
/// rate-limited buffer that its learner empties) waits in steps with a deadline and gives up once this is true: its
/// loop cannot take the stop until the slot returns, and the process that would have ended its wait may be gone.
pub fn stop_requested() -> bool {
    stop_signal().is_some()
}

/// The signal that told this process to stop, if one did (see [`stop_requested`]).
pub fn stop_signal() -> Option<i32> {
    Some(STOP_SIGNAL.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// Makes the death of process `parent`, this process's parent, send this process a SIGTERM (which stops an app or a
/// loop as Ctrl-C does), and checks that `parent` is still there: a process started by another program (a Python
/// script that runs `rlfactory train`) stops with it instead of running on unseen. The signal comes when the thread
/// of `parent` that started this process ends (Linux's parent-death signal).
pub fn stop_with_parent(parent: u32) -> Result<(), RunError> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(|e| io_err("setting the parent-death signal")(e.into()))?;
    if rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(parent) {
        return Err(RunError::Role(format!("parent process {parent} is gone")));
    }
    Ok(())
}

/// A child's first steps: it dies with its parent (a SIGTERM then makes its loop drain and stop), checks that the
/// parent is still there, and names its main thread `rlf-loop-<id>` (`/proc/<pid>/comm`, `ps`, `top`).
fn become_child(parent: u32, loop_id: u32) -> Result<(), RunError> {
    stop_with_parent(parent)?;
    let name = CString::new(format!("rlf-loop-{loop_id}")).map_err(|e| RunError::Role(e.to_string()))?;
    rustix::thread::set_name(&name).map_err(|e| io_err("naming the process")(e.into()))
}

/// Runs the loop of a child process on this thread, with its signal handling, until it stops.
fn run_loop_process(plan: LoopPlan, transport: Arc<dyn Transport>) -> Result<(), RunError> {
    // Ctrl-C reaches the whole process group: the parent orchestrates the stop, so SIGINT is ignored here. SIGTERM
    // (sent to this process alone, or on the parent's death) stops this loop gracefully.
    let mut signals =
        Signals::new([SIGINT, SIGTERM]).map_err(io_err("installing SIGINT/SIGTERM handlers"))?;
    let signal_handle = signals.handle();
    let t = Arc::clone(&transport);
    let me = plan.me;
    let emit_timeout = plan.emit_timeout;
    let signal_thread = std::thread::Builder::new()
        .name("rlf-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == SIGTERM {
                    STOP_SIGNAL.store(sig, Ordering::SeqCst);
                    send_control(&*t, me, &Control::Stop, emit_timeout);
                }
            }
        })
        .map_err(io_err("spawning the signal thread"))?;
    EventLoop::start(plan, None).run();
    signal_handle.close();
    let _ = signal_thread.join();
    Ok(())
}
