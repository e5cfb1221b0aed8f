//! The main loop's watch over the others: stop requests, faults, child exits, interrupts, and the final outcome.

use crate::event_loop::{send_control, LoopCore};
use crate::graph::Placement;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, Instant};

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
            Fault::Malformed { loop_name, message } => write!(f, "loop {loop_name}: {message}"),
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
        for fault in &self.faults {
            writeln!(f, "fault: {fault}")?;
        }
        Ok(())
    }
}

struct Watch {
    name: String,
    placement: Placement,
    pid: Option<u32>,
    stopped: Option<LoopStats>,
    exit: Option<String>,
    abandoned: bool,
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
    stop_timeout: Duration,
}

impl Supervisor {
    /// `loops`: name and placement of every physical loop, main first.
    pub(crate) fn new(loops: Vec<(String, Placement)>, stop_timeout: Duration) -> Supervisor {
        Supervisor {
            loops: loops
                .into_iter()
                .map(|(name, placement)| Watch {
                    name,
                    placement,
                    pid: None,
                    stopped: None,
                    exit: None,
                    abandoned: false,
                })
                .collect(),
            faults: Vec::new(),
            interrupted: None,
            stopped_by: None,
            stopping: false,
            stop_deadline: None,
            stop_timeout,
        }
    }

    /// Records the pid of a process loop.
    pub(crate) fn set_pid(&mut self, loop_id: u32, pid: u32) {
        if let Some(w) = self.loops.get_mut(loop_id as usize) {
            w.pid = Some(pid);
        }
    }

    /// Records a loop that failed to start (its process could not be spawned, say) and stops the application.
    pub(crate) fn start_failed(&mut self, loop_id: u32, message: String) {
        if let Some(w) = self.loops.get_mut(loop_id as usize) {
            w.abandoned = true;
            self.faults.push(Fault::StartFailed {
                loop_name: w.name.clone(),
                message,
            });
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
                if w.abandoned {
                    return;
                }
                if w.stopped.is_none() || !success {
                    self.faults.push(Fault::LoopDied {
                        loop_name: w.name.clone(),
                        pid,
                        status: status.clone(),
                    });
                }
                w.exit = Some(status);
                self.begin_stop(core);
            }
            Control::Interrupted { signal } => {
                self.interrupted.get_or_insert(signal);
                self.begin_stop(core);
            }
        }
    }

    /// Sends `Stop` to every loop still running (once).
    pub(crate) fn begin_stop(&mut self, core: &mut LoopCore) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        self.stop_deadline = Instant::now().checked_add(self.stop_timeout);
        for (i, w) in self.loops.iter().enumerate().skip(1) {
            if !w.done() {
                send_control(core.transport(), i as u32, &Control::Stop, core.emit_timeout());
            }
        }
    }

    /// When the main loop must wake up for the stop deadline.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if self.finished() {
            None
        } else {
            self.stop_deadline
        }
    }

    /// Starts the stop after a start failure; past the stop deadline, kills the processes that did not stop and
    /// gives up on the threads.
    pub(crate) fn tick(&mut self, core: &mut LoopCore) {
        if !self.stopping && !self.faults.is_empty() {
            self.begin_stop(core);
        }
        if self.stop_deadline.is_none_or(|d| Instant::now() < d) {
            return;
        }
        for w in self.loops.iter_mut().skip(1) {
            if w.done() {
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
        }
    }
}
