//! Process-wide settings (the allocator's), a thread's floating-point mode for a learner's steps, and process
//! operations that need a raw OS call or a CPU register.

use std::time::Duration;

/// Keeps freed heap memory in the process instead of returning it to the kernel.
///
/// libtorch frees and reallocates the same few hundred KB of activations and gradients at every
/// SGD step and forward pass. With glibc's defaults those blocks are mmapped or trimmed off the
/// heap top on free, so every step faults fresh zeroed pages back in: about a third of a
/// CartPole PPO step. Raising the mmap and trim thresholds makes the heap keep them (the process
/// holds at most its peak working set). Fastbins are turned off as well: each large request after
/// small frees (a tensor's metadata, then its data) made glibc consolidate them, 13% of a DQN
/// inference worker's CPU; the per-thread cache still serves small blocks. Returns whether the
/// allocator accepted the settings; on a C library other than glibc nothing changes and it returns
/// false.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // Blocks below 32 MiB (glibc's largest mmap threshold) come from the heap; up to 1 GiB
        // of free heap top is kept.
        // SAFETY: mallopt only changes allocator parameters; it is called with valid parameter
        // codes and values, and glibc serialises it against concurrent allocations.
        let mmap = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) };
        // SAFETY: as above.
        let trim = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) };
        // SAFETY: as above.
        let fast = unsafe { libc::mallopt(libc::M_MXFAST, 0) };
        mmap == 1 && trim == 1 && fast == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// While it lives, the CPU treats subnormal floats (below 1.2e-38 in magnitude) as zero in this thread, as PyTorch's
/// `torch.set_flush_denormal(True)` makes it; dropping it restores the thread's previous mode. Threads started
/// meanwhile inherit the mode for good (libtorch's worker threads, which only compute tensors).
///
/// Adam's first moment of a weight whose gradient stays zero (a dead ReLU unit's) decays by β₁ at every step into the
/// subnormal range, where each operation on it takes the CPU's slow microcode path: in a DQN learner on Acrobot a
/// third of the second layer's moments were subnormal after 8K steps, and Adam's elementwise operations took a
/// quarter of each step. The values lost are below every weight's rounding step (a subnormal moment moves a weight by
/// less than 1e-30), so training computes the same weights. A learner holds one around its SGD steps only: an
/// embedded Python env computes with the default mode (NumPy warns when it finds subnormals flushed). The mode is
/// x86-64's MXCSR flush-to-zero and denormals-are-zero bits, aarch64's FPCR flush-to-zero bit; elsewhere nothing
/// changes.
#[derive(Debug)]
pub struct FlushDenormals {
    previous: Option<u64>,
}

impl FlushDenormals {
    /// Flushes subnormals in this thread until the guard is dropped.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let previous = float_mode();
        if let Some(mode) = previous {
            set_float_mode(mode | FLUSH_BITS);
        }
        Self { previous }
    }
}

impl Drop for FlushDenormals {
    fn drop(&mut self) {
        if let Some(mode) = self.previous {
            set_float_mode(mode);
        }
    }
}

#[cfg(target_arch = "x86_64")]
const FLUSH_BITS: u64 = (1 << 15) | (1 << 6);
#[cfg(target_arch = "aarch64")]
const FLUSH_BITS: u64 = 1 << 24;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const FLUSH_BITS: u64 = 0;

/// The floating-point control register of this thread (MXCSR, FPCR), if this CPU has one we set.
fn float_mode() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: `stmxcsr` stores the 32-bit MXCSR register at the address of `csr`, a live, aligned, writable u32.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
        }
        Some(u64::from(csr))
    }
    #[cfg(target_arch = "aarch64")]
    {
        let fpcr: u64;
        // SAFETY: reading FPCR has no side effect.
        unsafe {
            std::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack, preserves_flags));
        }
        Some(fpcr)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// Sets the register [`float_mode`] read to `mode`: that value, with at most the flush bits changed.
fn set_float_mode(mode: u64) {
    #[cfg(target_arch = "x86_64")]
    {
        let csr = mode as u32;
        // SAFETY: `ldmxcsr` loads MXCSR from the address of `csr`, a live, aligned u32 holding the register as
        // `float_mode` read it with at most the two flush bits changed: exceptions stay masked and the rounding mode
        // stays what it was.
        unsafe {
            std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags, readonly));
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: writes FPCR as `float_mode` read it with at most the flush-to-zero bit changed: traps and rounding
        // mode unchanged.
        unsafe {
            std::arch::asm!("msr fpcr, {}", in(reg) mode, options(nomem, nostack, preserves_flags));
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = mode;
    }
}

/// How long ago the kernel started this process: unlike an `Instant` taken in `main`, this counts
/// the dynamic loader and the static constructors that run before it (libtorch registers its
/// operators there: about a quarter of a second). `None` without `/proc`. Resolution: a clock
/// tick (10 ms).
pub fn age() -> Option<Duration> {
    let started = crate::region::process_start_time(std::process::id())?;
    // SAFETY: sysconf reads a system constant; it has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks_per_second <= 0 {
        return None;
    }
    // Seconds since boot, on the same clock as the start time.
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(Duration::from_secs_f64(
        (uptime - started as f64 / ticks_per_second as f64).max(0.0),
    ))
}

/// Which side of a [`fork_if_single_threaded`] this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The original process; the new one has this pid.
    Parent(u32),
    /// The new process: a copy of the caller, with only the calling thread.
    Child,
}

/// Forks this process when it has a single thread (the caller), and returns `None` otherwise.
///
/// A child forked from a multithreaded process can find a lock (the allocator's, stdout's, a
/// library's) taken by a thread that does not exist there and wait for it forever; with one thread
/// there is no such lock. The count cannot change between the check and the fork: only the caller
/// could start a thread. What fork makes for free, a copy of a process whose libraries are already
/// loaded and initialised, saves a re-executed binary its whole start-up (libtorch's static
/// constructors take about a quarter of a second). The child must leave by
/// [`exit_now`], never by returning into code that assumes it is the parent.
pub fn fork_if_single_threaded() -> std::io::Result<Option<Forked>> {
    if std::fs::read_dir("/proc/self/task")?.count() != 1 {
        return Ok(None);
    }
    // SAFETY: the process has one thread, checked just above, so the child inherits no lock held by
    // another thread; fork has no other precondition.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(Some(Forked::Child)),
        pid => Ok(Some(Forked::Parent(pid as u32))),
    }
}

/// Ends this process with `code` once its own work is done: flushes Rust's and C's standard output and error, then
/// leaves by `_exit`, without the exit handlers and static destructors the process's libraries registered.
///
/// What it skips is libtorch's teardown (its operator registry, thousands of entries freed one by one: about 0.1 s
/// of CPU in every process of a run, after the run is over) and, in a forked child, the handlers its parent
/// registered, which are not the child's to run (POSIX's advice for a child of `fork`). The caller has dropped
/// everything that writes on drop (files, experiment folders, shared-memory regions) before calling it: only the
/// thread-local values of the calling thread and `atexit` handlers are left unrun.
pub fn exit_now(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `fflush(NULL)` flushes every open C stream; it has no precondition.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    // SAFETY: `_exit` ends the process at once; it has no precondition.
    unsafe { libc::_exit(i32::from(code)) }
}

/// Starts a reaper: a small process of its own session that waits until this process and every child it starts
/// later are gone, however they end (SIGKILL included), then removes the shared-memory segments whose creators are
/// gone ([`crate::region::reclaim_stale`]) and exits. What a process that may be killed without warning (an MPI rank,
/// which `mpirun` SIGKILLs one second after its SIGTERM, with its whole process group) calls first thing. Returns
/// `false`, starting nothing, when this process has more than one thread already (see [`fork_if_single_threaded`]).
///
/// The wait is a blocking read of a pipe whose write end this process and its children hold (children inherit it,
/// also across `exec`): the read returns end-of-file when the last holder is gone; then a blocking poll of the
/// caller's pidfd waits until it has exited.
pub fn start_segment_reaper() -> std::io::Result<bool> {
    let caller = rustix::process::getpid();
    let (read_end, write_end) = rustix::pipe::pipe()?;
    match fork_if_single_threaded()? {
        None => Ok(false),
        Some(Forked::Parent(_)) => {
            drop(read_end);
            // The write end stays open for the rest of this process's life, and is inherited by its children.
            std::mem::forget(write_end);
            Ok(true)
        }
        Some(Forked::Child) => {
            drop(write_end);
            // The caller's pidfd now, while the caller surely exists (later its pid could be another process's).
            let pidfd = rustix::process::pidfd_open(caller, rustix::process::PidfdFlags::empty()).ok();
            // Out of the caller's session and process group, so that signals to the group do not reach it, and
            // without the caller's terminal or output pipes, so that nobody waits for it to close them.
            let _ = rustix::process::setsid();
            if let Ok(null) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                let _ = rustix::stdio::dup2_stdin(&null);
                let _ = rustix::stdio::dup2_stdout(&null);
                let _ = rustix::stdio::dup2_stderr(&null);
            }
            let mut byte = [0u8; 1];
            loop {
                match rustix::io::read(&read_end, &mut byte) {
                    Ok(n) if n > 0 => {}
                    Err(rustix::io::Errno::INTR) => {}
                    _ => break,
                }
            }
            // The pipe closes as the caller exits, a moment before it is a zombie (whose segments are stale):
            // its pidfd turns readable then.
            if let Some(pidfd) = &pidfd {
                let mut fds = [rustix::event::PollFd::new(pidfd, rustix::event::PollFlags::IN)];
                while let Err(rustix::io::Errno::INTR) = rustix::event::poll(&mut fds, None) {}
            }
            let _ = crate::region::reclaim_stale();
            // SAFETY: `_exit` ends the process at once, without the exit handlers the caller's libraries registered
            // (the reaper is a copy of the caller: they are not its to run); it has no precondition.
            unsafe { libc::_exit(0) }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn age_counts_from_the_process_start() {
        let test_start = Instant::now();
        let first = super::age().expect("/proc");
        std::thread::sleep(Duration::from_millis(100));
        let second = super::age().expect("/proc");
        // Two clock ticks of tolerance: start time and uptime are each truncated to a tick.
        let tick = Duration::from_millis(20);
        assert!(
            second + tick >= first + Duration::from_millis(100),
            "{first:?} then {second:?}"
        );
        assert!(
            second + tick >= test_start.elapsed(),
            "{second:?} is less than this test's age"
        );
    }

    #[test]
    fn a_multithreaded_process_is_not_forked() {
        // The test harness runs this test on a thread of its own besides the main one.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let helper = std::thread::spawn(move || rx.recv());
        assert_eq!(super::fork_if_single_threaded().expect("/proc"), None);
        drop(tx);
        let _ = helper.join();
    }

    #[test]
    fn subnormals_are_zero_while_the_guard_lives_in_its_thread_and_the_threads_it_starts() {
        let tiny = std::hint::black_box(f32::MIN_POSITIVE);
        let halve = |x: f32| std::hint::black_box(x) / std::hint::black_box(2.0_f32);
        let subnormal = move |x: f32| x > 0.0 && x < tiny;
        let flushes = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
        std::thread::spawn(move || {
            assert!(subnormal(halve(tiny)));
            let guard = super::FlushDenormals::new();
            let started = std::thread::spawn(move || halve(tiny)).join().expect("thread");
            assert_eq!((halve(tiny) == 0.0, started == 0.0), (flushes, flushes));
            drop(guard);
            assert!(subnormal(halve(tiny)), "the mode is restored");
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn glibc_accepts_the_thresholds() {
        assert_eq!(
            super::keep_freed_memory(),
            cfg!(all(target_os = "linux", target_env = "gnu"))
        );
    }
}
