//! The main loop's watch over the others: stop requests, faults, child exits, interrupts, and the final outcome.

use crate::event_loop::{send_control, LoopCore};
use crate::graph::Placement;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A loop that goes on beating while the application stops (busy in a long slot) is waited for up to this many stop
/// timeouts.
const BUSY_STOP_TIMEOUTS: u32 = 4;

/// A loop gets at least this long to send its first heartbeat: start-up builds its objects.
const FIRST_HEARTBEAT_GRACE: Duration = Duration::from_secs(30);

/// Starts the process of a loop: `(loop id, incarnation)` → the new pid and the thread waiting for its exit.
pub(crate) type SpawnFn = Box<dyn FnMut(u32, u32) -> Result<(u32, JoinHandle<()>), String>>;

/// Counters of one loop.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopStats {
    /// Slot, timer and hook calls made.
    pub dispatched: u64,
    /// Messages taken from the inbound queue.
    pub received: u64,
    /// Signals and work items emitted by this loop's objects.
    pub emitted: u64,
    /// Emits that found a receiver queue full and had to wait.
    pub blocked_emits: u64,
    /// Emits that failed (queue full past the timeout, closed, too large).
    pub failed_emits: u64,
    /// Timer callbacks run.
    pub timers_fired: u64,
    /// Times the loop returned from a blocking wait on its queue.
    pub wakeups: u64,
    /// CPU time used, in microseconds, by the loop's process (process loops: every thread of
    /// it) or by its thread (the main loop and thread loops), from its start to its stop.
    pub cpu_micros: u64,
}

/// Something that went wrong, with the names needed to find it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// A slot, timer callback, hook or constructor panicked.
    SlotPanicked {
        /// The loop the object lives on.
        loop_name: String,
        /// The object.
        object: String,
        /// The slot (method) name.
        slot: String,
        /// The panic message.
        message: String,
    },
    /// A loop's process exited without having been stopped.
    LoopDied {
        /// The loop.
        loop_name: String,
        /// The process id.
        pid: u32,
        /// The exit status as the OS reports it.
        status: String,
    },
    /// A loop did not stop within the stop timeout (its process, if any, was killed).
    StopTimeout {
        /// The loop.
        loop_name: String,
    },
    /// A loop received a message it could not decode.
    Malformed {
        /// The loop.
        loop_name: String,
        /// What was wrong.
        message: String,
    },
    /// A loop sent no heartbeat for longer than the heartbeat interval (its process, if any, was killed).
    Hung {
        /// The loop.
        loop_name: String,
        /// How long it had been silent, in milliseconds.
        silent_ms: u64,
    },
    /// An object gave up with an error ([`Ctx::fail`](crate::Ctx::fail)): the application stops.
    Component {
        /// The loop the object lives on.
        loop_name: String,
        /// The object.
        object: String,
        /// The error, on one line.
        message: String,
    },
    /// A loop could not be started.
    StartFailed {
        /// The loop.
        loop_name: String,
        /// Why.
        message: String,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::SlotPanicked {
                loop_name,
                object,
                slot,
                message,
            } => write!(
                f,
                "loop {loop_name}: object {object}: slot {slot} panicked: {message}"
            ),
            Fault::LoopDied {
                loop_name,
                pid,
                status,
            } => write!(f, "loop {loop_name}: process {pid} died: {status}"),
            Fault::StopTimeout { loop_name } => write!(f, "loop {loop_name}: did not stop in time"),
            Fault::Hung { loop_name, silent_ms } => write!(
                f,
                "loop {loop_name}: hung (no heartbeat for {:.1} s)",
                *silent_ms as f64 / 1000.0
            ),
            Fault::Malformed { loop_name, message } => write!(f, "loop {loop_name}: {message}"),
            Fault::Component {
                loop_name,
                object,
                message,
            } => write!(f, "loop {loop_name}: object {object}: {message}"),
            Fault::StartFailed { loop_name, message } => {
                write!(f, "loop {loop_name}: could not start: {message}")
            }
        }
    }
}

/// Messages between loops and the main loop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Control {
    /// Main → loop: drain and stop.
    Stop,
    /// Object → main: please stop the application.
    StopRequested { by: String },
    /// Loop → main: drained, hooks run, done.
    Stopped { loop_id: u32, stats: LoopStats },
    /// Loop → main.
    Fault(Fault),
    /// Parent's wait thread → main: a child process exited.
    Exited {
        loop_id: u32,
        pid: u32,
        status: String,
        success: bool,
    },
    /// Signal thread → main: SIGINT or SIGTERM.
    Interrupted { signal: i32 },
    /// Loop → main: still alive (`pid` tells incarnations of a process loop apart; `tid` is the loop's thread).
    Heartbeat { loop_id: u32, pid: u32, tid: u32 },
}

/// A loop's process replaced by the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    /// The loop.
    pub loop_name: String,
    /// The new process's incarnation (1 for the first replacement).
    pub incarnation: u32,
    /// The process replaced.
    pub old_pid: Option<u32>,
    /// The new process (`None` if it could not be started: then a `StartFailed` fault follows).
    pub new_pid: Option<u32>,
    /// Why: the dead process's exit status, or the heartbeat silence.
    pub reason: String,
}

impl fmt::Display for Restart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pid = |p: Option<u32>| p.map_or_else(|| "?".to_string(), |p| p.to_string());
        write!(
            f,
            "loop {}: {}; replaced process {} by process {} (incarnation {})",
            self.loop_name,
            self.reason,
            pid(self.old_pid),
            pid(self.new_pid),
            self.incarnation
        )
    }
}

/// How one loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopReport {
    /// The loop's name.
    pub name: String,
    /// Where it ran.
    pub placement: Placement,
    /// Its counters (`None` if it never reported them: it died or hung).
    pub stats: Option<LoopStats>,
    /// Its process's exit status, for process loops.
    pub exit: Option<String>,
}

/// How the application ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What went wrong, in the order the main loop learnt it.
    pub faults: Vec<Fault>,
    /// The signal (SIGINT = 2, SIGTERM = 15) that stopped the application, if any.
    pub interrupted: Option<i32>,
    /// Every loop, main first.
    pub loops: Vec<LoopReport>,
    /// Who asked for the stop, if an object did.
    pub stopped_by: Option<String>,
    /// Processes replaced while the application ran, in order.
    pub restarts: Vec<Restart>,
    /// What a serial application kept when it began to stop ([`AppBuilder::keep_state`](crate::AppBuilder::keep_state)).
    pub kept: Option<crate::KeptState>,
}

impl Outcome {
    /// No fault and no interrupt.
    pub fn success(&self) -> bool {
        self.faults.is_empty() && self.interrupted.is_none()
    }

    /// 0 on success, 128 + signal when interrupted, 1 on a fault.
    pub fn exit_code(&self) -> u8 {
        match (self.faults.is_empty(), self.interrupted) {
            (true, None) => 0,
            (true, Some(sig)) => 128u8.saturating_add(sig as u8),
            (false, _) => 1,
        }
    }

    /// The report of the loop called `name`.
    pub fn loop_report(&self, name: &str) -> Option<&LoopReport> {
        self.loops.iter().find(|l| l.name == name)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.success(), &self.stopped_by, self.interrupted) {
            (true, Some(by), _) => writeln!(f, "stopped cleanly at the request of {by}")?,
            (true, None, _) => writeln!(f, "stopped cleanly")?,
            (false, _, Some(sig)) => writeln!(f, "stopped by signal {sig}")?,
            (false, _, None) => writeln!(f, "stopped after {} fault(s)", self.faults.len())?,
        }
        for restart in &self.restarts {
            writeln!(f, "restart: {restart}")?;
        }
        for fault in &self.faults {
            writeln!(f, "fault: {fault}")?;
        }
        Ok(())
    }
}

/// A loop as the main loop sees it while the application runs ([`Ctx::loops`](crate::Ctx::loops)): what a live
/// view of the run (`rlfactory top`) shows of each component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopStatus {
    /// The loop's name.
    pub name: String,
    /// The objects it runs.
    pub objects: Vec<String>,
    /// Where it runs.
    pub placement: Placement,
    /// Its process: the application's own for the main loop and thread loops; a process loop's current (or last)
    /// process, `None` before its first started.
    pub pid: Option<u32>,
    /// The OS's id of the thread running it (known from its first heartbeat; the main loop's from the start).
    pub tid: Option<u32>,
    /// Time since its last heartbeat, or since its process started (`None`: the main loop, or no heartbeats).
    pub silent: Option<Duration>,
    /// Messages waiting in its inbound queue (`None`: the transport cannot tell).
    pub queued: Option<usize>,
    /// Its process's incarnation: how many times it was replaced.
    pub incarnation: u32,
    /// It has not stopped, died or been given up on.
    pub running: bool,
}

/// The supervisor's watch as the main loop's objects may read it: each loop's status but `silent` and `queued`,
/// with the instant of its last heartbeat. Written only by the supervisor, on the main loop's thread.
#[derive(Debug, Clone, Default)]
pub(crate) struct Roster(Arc<Mutex<Vec<(LoopStatus, Instant)>>>);

impl Roster {
    fn lock(&self) -> MutexGuard<'_, Vec<(LoopStatus, Instant)>> {
        // Every update replaces one entry whole: a panic cannot leave one half-written.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every loop's status now; `queued` asks the transport for each loop's waiting messages.
    pub(crate) fn statuses(&self, queued: impl Fn(u32) -> Option<usize>) -> Vec<LoopStatus> {
        let now = Instant::now();
        self.lock()
            .iter()
            .enumerate()
            .map(|(i, (status, beat))| LoopStatus {
                silent: status.silent.map(|_| now.saturating_duration_since(*beat)),
                queued: queued(i as u32),
                ..status.clone()
            })
            .collect()
    }
}

/// What the supervisor is told of a loop.
pub(crate) struct LoopInfo {
    pub(crate) name: String,
    pub(crate) placement: Placement,
    pub(crate) max_restarts: u32,
    /// The objects it runs.
    pub(crate) objects: Vec<String>,
}

struct Watch {
    name: String,
    objects: Vec<String>,
    placement: Placement,
    pid: Option<u32>,
    tid: Option<u32>,
    stopped: Option<LoopStats>,
    exit: Option<String>,
    abandoned: bool,
    max_restarts: u32,
    incarnation: u32,
    /// When the current incarnation started or last sent a heartbeat.
    last_beat: Instant,
    beaten: bool,
    /// Found hung and killed: how long it had been silent (its exit is then no new fault).
    hung: Option<Duration>,
}

impl Watch {
    fn done(&self) -> bool {
        self.abandoned
            || self.exit.is_some()
            || (self.placement != Placement::Process && self.stopped.is_some())
    }
}

/// The main loop's record of every other loop.
pub(crate) struct Supervisor {
    loops: Vec<Watch>,
    faults: Vec<Fault>,
    interrupted: Option<i32>,
    stopped_by: Option<String>,
    stopping: bool,
    stop_deadline: Option<Instant>,
    /// When the stop began.
    stop_began: Option<Instant>,
    stop_timeout: Duration,
    heartbeat: Option<Duration>,
    next_check: Option<Instant>,
    spawn: Option<SpawnFn>,
    waiters: Vec<JoinHandle<()>>,
    restarts: Vec<Restart>,
    kept: Option<crate::KeptState>,
    roster: Roster,
}

impl Supervisor {
    /// `loops`: every physical loop, main first. `heartbeat`: the interval after which a silent loop is hung.
    /// `spawn` starts process loops (none: they cannot be started).
    pub(crate) fn new(
        loops: Vec<LoopInfo>,
        stop_timeout: Duration,
        heartbeat: Option<Duration>,
        spawn: Option<SpawnFn>,
    ) -> Supervisor {
        let now = Instant::now();
        let supervisor = Supervisor {
            loops: loops
                .into_iter()
                .map(|l| Watch {
                    pid: (l.placement != Placement::Process).then(std::process::id),
                    tid: (l.placement == Placement::Main)
                        .then(|| rustix::thread::gettid().as_raw_nonzero().get() as u32),
                    name: l.name,
                    objects: l.objects,
                    placement: l.placement,
                    stopped: None,
                    exit: None,
                    abandoned: false,
                    max_restarts: l.max_restarts,
                    incarnation: 0,
                    last_beat: now,
                    beaten: false,
                    hung: None,
                })
                .collect(),
            faults: Vec::new(),
            interrupted: None,
            stopped_by: None,
            stopping: false,
            stop_deadline: None,
            stop_began: None,
            stop_timeout,
            heartbeat,
            next_check: heartbeat.map(|h| now + h / 5),
            spawn,
            waiters: Vec::new(),
            restarts: Vec::new(),
            kept: None,
            roster: Roster::default(),
        };
        let statuses = (0..supervisor.loops.len())
            .map(|i| supervisor.status(i))
            .collect();
        *supervisor.roster.lock() = statuses;
        supervisor
    }

    /// The roster the main loop's objects read ([`crate::Ctx::loops`]).
    pub(crate) fn roster(&self) -> Roster {
        self.roster.clone()
    }

    /// Loop `i`'s status for the roster, with the instant of its last heartbeat.
    fn status(&self, i: usize) -> (LoopStatus, Instant) {
        let w = &self.loops[i];
        let status = LoopStatus {
            name: w.name.clone(),
            objects: w.objects.clone(),
            placement: w.placement,
            pid: w.pid,
            tid: w.tid,
            silent: (self.heartbeat.is_some() && w.placement != Placement::Main).then_some(Duration::ZERO),
            queued: None,
            incarnation: w.incarnation,
            running: !w.done(),
        };
        (status, w.last_beat)
    }

    /// Copies loop `i`'s watch into the roster.
    fn publish(&self, i: usize) {
        if i < self.loops.len() {
            let status = self.status(i);
            if let Some(entry) = self.roster.lock().get_mut(i) {
                *entry = status;
            }
        }
    }

    /// Starts (or restarts) the process of loop `loop_id` as its current incarnation.
    pub(crate) fn spawn(&mut self, loop_id: u32) -> Option<u32> {
        let incarnation = self.loops.get(loop_id as usize)?.incarnation;
        let spawned = match &mut self.spawn {
            Some(spawn) => spawn(loop_id, incarnation),
            None => Err("this transport cannot reach a process".into()),
        };
        match spawned {
            Ok((pid, waiter)) => {
                self.adopt(loop_id, pid, waiter);
                Some(pid)
            }
            Err(message) => {
                self.start_failed(loop_id, message);
                None
            }
        }
    }

    /// Watches the process `pid`, started (forked, or spawned) as the current incarnation of loop `loop_id`;
    /// `waiter` reports its exit.
    pub(crate) fn adopt(&mut self, loop_id: u32, pid: u32, waiter: JoinHandle<()>) {
        self.waiters.push(waiter);
        if let Some(w) = self.loops.get_mut(loop_id as usize) {
            w.pid = Some(pid);
            w.last_beat = Instant::now();
            w.beaten = false;
            w.hung = None;
            w.tid = None;
        }
        self.publish(loop_id as usize);
    }

    /// The threads waiting for child processes, to join once the application has stopped.
    pub(crate) fn take_waiters(&mut self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut self.waiters)
    }

    /// Replaces the process of loop `loop_id` (its old process is dead), if it may be replaced.
    fn restart(&mut self, loop_id: u32, reason: String) -> bool {
        let Some(w) = self.loops.get_mut(loop_id as usize) else {
            return false;
        };
        if self.stopping || w.placement != Placement::Process || w.incarnation >= w.max_restarts {
            return false;
        }
        w.incarnation += 1;
        let (loop_name, incarnation, old_pid) = (w.name.clone(), w.incarnation, w.pid);
        let new_pid = self.spawn(loop_id);
        let restart = Restart {
            loop_name,
            incarnation,
            old_pid,
            new_pid,
            reason,
        };
        eprintln!("[rlf-signal] {restart}");
        self.restarts.push(restart);
        self.publish(loop_id as usize);
        true
    }

    /// Records a loop that failed to start (its process could not be spawned, say) and stops the application.
    pub(crate) fn start_failed(&mut self, loop_id: u32, message: String) {
        if let Some(w) = self.loops.get_mut(loop_id as usize) {
            w.abandoned = true;
            self.faults.push(Fault::StartFailed {
                loop_name: w.name.clone(),
                message,
            });
            self.publish(loop_id as usize);
        }
    }

    pub(crate) fn on_control(&mut self, c: Control, core: &mut LoopCore) {
        match c {
            Control::Stop => self.begin_stop(core),
            Control::StopRequested { by } => {
                self.stopped_by.get_or_insert(by);
                self.begin_stop(core);
            }
            Control::Stopped { loop_id, stats } => {
                if let Some(w) = self.loops.get_mut(loop_id as usize) {
                    w.stopped = Some(stats);
                }
                self.publish(loop_id as usize);
            }
            Control::Fault(f) => {
                self.faults.push(f);
                self.begin_stop(core);
            }
            Control::Exited {
                loop_id,
                pid,
                status,
                success,
            } => {
                let Some(w) = self.loops.get_mut(loop_id as usize) else {
                    return;
                };
                // An earlier incarnation's exit was handled when it was replaced.
                if w.abandoned || w.pid != Some(pid) {
                    return;
                }
                let failed = w.stopped.is_none() || !success;
                let reason = match w.hung {
                    Some(silent) => format!("hung (no heartbeat for {:.1} s), killed", silent.as_secs_f64()),
                    None => format!("process died ({status})"),
                };
                if failed && self.restart(loop_id, reason) {
                    return;
                }
                let Some(w) = self.loops.get_mut(loop_id as usize) else {
                    return;
                };
                if failed && w.hung.is_none() {
                    self.faults.push(Fault::LoopDied {
                        loop_name: w.name.clone(),
                        pid,
                        status: status.clone(),
                    });
                } else if let Some(silent) = w.hung.filter(|_| failed) {
                    self.faults.push(Fault::Hung {
                        loop_name: w.name.clone(),
                        silent_ms: silent.as_millis() as u64,
                    });
                }
                w.exit = Some(status);
                self.publish(loop_id as usize);
                self.begin_stop(core);
            }
            Control::Heartbeat { loop_id, pid, tid } => {
                if let Some(w) = self.loops.get_mut(loop_id as usize) {
                    if w.placement != Placement::Process || w.pid == Some(pid) {
                        w.last_beat = Instant::now();
                        w.beaten = true;
                        w.tid = Some(tid);
                    }
                }
                self.publish(loop_id as usize);
            }
            Control::Interrupted { signal } => {
                self.interrupted.get_or_insert(signal);
                self.begin_stop(core);
            }
        }
    }

    /// Whether the stop has begun.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping
    }

    /// Sends `Stop` to every loop still running (once).
    pub(crate) fn begin_stop(&mut self, core: &mut LoopCore) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        let now = Instant::now();
        self.stop_began = Some(now);
        self.stop_deadline = now.checked_add(self.stop_timeout);
        for (i, w) in self.loops.iter().enumerate().skip(1) {
            if !w.done() {
                send_control(core.transport(), i as u32, &Control::Stop, core.emit_timeout());
            }
        }
    }

    /// When the main loop must wake up: the stop deadline, or the next heartbeat check.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if self.finished() {
            return None;
        }
        let check = self.next_check.filter(|_| !self.stopping);
        match (self.stop_deadline, check) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Names the loops silent for longer than the heartbeat interval: a hung process is killed (and replaced when
    /// its exit arrives, if it may be); a hung thread is a fault.
    fn check_heartbeats(&mut self, core: &mut LoopCore) {
        let (Some(interval), Some(due)) = (self.heartbeat, self.next_check) else {
            return;
        };
        let now = Instant::now();
        if self.stopping || now < due {
            return;
        }
        self.next_check = Some(now + interval / 5);
        let mut faults = Vec::new();
        for w in self.loops.iter_mut().skip(1) {
            let limit = if w.beaten {
                interval
            } else {
                interval.max(FIRST_HEARTBEAT_GRACE)
            };
            let silent = now.saturating_duration_since(w.last_beat);
            if w.done() || w.hung.is_some() || silent <= limit {
                continue;
            }
            w.hung = Some(silent);
            eprintln!(
                "[rlf-signal] loop {}: no heartbeat for {:.1} s, hung",
                w.name,
                silent.as_secs_f64()
            );
            match w.pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                // Its exit (as killed) then replaces it or stops the application.
                Some(pid) if w.placement == Placement::Process => {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
                _ => faults.push(Fault::Hung {
                    loop_name: w.name.clone(),
                    silent_ms: silent.as_millis() as u64,
                }),
            }
        }
        if !faults.is_empty() {
            self.faults.extend(faults);
            self.begin_stop(core);
        }
    }

    /// Starts the stop after a start failure; past the stop deadline, kills the processes that did not stop and
    /// gives up on the threads. A loop still busy in a long slot (it has beaten since the stop began, within the
    /// stop timeout) gets more time, up to [`BUSY_STOP_TIMEOUTS`] stop timeouts in all.
    pub(crate) fn tick(&mut self, core: &mut LoopCore) {
        if !self.stopping && !self.faults.is_empty() {
            self.begin_stop(core);
        }
        self.check_heartbeats(core);
        let now = Instant::now();
        let (Some(began), Some(due)) = (self.stop_began, self.stop_deadline) else {
            return;
        };
        if now < due {
            return;
        }
        let last_chance = began + self.stop_timeout * BUSY_STOP_TIMEOUTS;
        let mut busy = false;
        for w in self.loops.iter_mut().skip(1) {
            if w.done() {
                continue;
            }
            if now < last_chance
                && w.last_beat > began
                && now.duration_since(w.last_beat) <= self.stop_timeout
            {
                busy = true;
                continue;
            }
            self.faults.push(Fault::StopTimeout {
                loop_name: w.name.clone(),
            });
            if let Some(pid) = w.pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            w.abandoned = true;
        }
        (0..self.loops.len()).for_each(|i| self.publish(i));
        if busy {
            self.stop_deadline = Some((now + self.stop_timeout / 5).min(last_chance));
        }
    }

    /// Stopping, and every other loop is done: the main loop may drain and stop.
    pub(crate) fn finished(&self) -> bool {
        self.stopping && self.loops.iter().skip(1).all(Watch::done)
    }

    /// Loops given up on (their threads must not be joined).
    pub(crate) fn abandoned(&self, loop_id: u32) -> bool {
        self.loops
            .get(loop_id as usize)
            .is_some_and(|w| w.abandoned && w.exit.is_none())
    }

    /// The outcome, with the main loop's own counters.
    pub(crate) fn outcome(self, main_stats: LoopStats) -> Outcome {
        let loops = self
            .loops
            .into_iter()
            .enumerate()
            .map(|(i, w)| LoopReport {
                name: w.name,
                placement: w.placement,
                stats: if i == 0 { Some(main_stats) } else { w.stopped },
                exit: w.exit,
            })
            .collect();
        Outcome {
            faults: self.faults,
            interrupted: self.interrupted,
            loops,
            stopped_by: self.stopped_by,
            restarts: self.restarts,
            kept: self.kept,
        }
    }

    /// Holds what the main loop kept at the stop, for the outcome.
    pub(crate) fn keep(&mut self, state: crate::KeptState) {
        self.kept = Some(state);
    }
}
