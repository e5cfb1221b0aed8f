//! The synchronisation primitives the queue protocol is built from, in one place so that the protocol can be
//! model-checked: under `--cfg loom` every type here is backed by loom's instrumented primitives, and the same
//! queue code runs on threads inside `loom::model`.
//!
//! - [`Futex`]: a 32-bit word other threads or processes can sleep on until it changes (`FUTEX_WAIT` /
//!   `FUTEX_WAKE`, shared, not private, because the word lives in shared memory). Timeouts are relative and the
//!   kernel measures them on `CLOCK_MONOTONIC`, so a wall-clock jump never shortens or stretches a wait.
//! - [`RobustMutex`]: a process-shared, robust pthread mutex. When the owner dies (even SIGKILLed mid-copy) the
//!   kernel walks the dead thread's robust list, marks the lock word `FUTEX_OWNER_DIED` and wakes a waiter; the next
//!   locker learns of it ([`Locked::previous_owner_died`]), repairs what it protects and marks it consistent.
//!   Deadlines use `pthread_mutex_clocklock(CLOCK_MONOTONIC)`.
//!
//! Under loom the futex is modelled faithfully (check-then-sleep atomic with respect to wakers) with a mutex and a
//! condition variable, and the robust mutex is a plain mutex (owner death is tested by the real kill tests).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use std::time::{Duration, Instant};

/// The outcome of acquiring a [`RobustMutex`].
pub(crate) struct Locked<'a> {
    pub(crate) guard: RobustGuard<'a>,
    /// The previous owner died while holding the lock: whatever it was writing is suspect.
    pub(crate) previous_owner_died: bool,
}

/// The lock could not be taken before the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockTimeout;

#[cfg(not(loom))]
mod imp {
    use super::{AtomicU32, Duration, Instant, LockTimeout, Locked, Ordering};
    use std::cell::UnsafeCell;

    /// A 32-bit futex word usable across processes.
    #[repr(C)]
    pub(crate) struct Futex {
        value: AtomicU32,
    }

    impl Futex {
        pub(crate) fn load(&self) -> u32 {
            self.value.load(Ordering::SeqCst)
        }

        /// Changes the word so that sleepers that read the old value do not go to sleep.
        pub(crate) fn bump(&self) {
            self.value.fetch_add(1, Ordering::SeqCst);
        }

        /// Sleeps while the word equals `expected`, at most `timeout` (`None`: no limit). Returns on a wake-up, a
        /// changed word, a signal or the timeout; the caller re-checks its condition in every case.
        pub(crate) fn wait(&self, expected: u32, timeout: Option<Duration>) {
            let ts = timeout.map(|d| libc::timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            });
            let ts_ptr = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: the word is a live, 4-byte aligned AtomicU32 (in shared memory or not) for the whole call;
            // FUTEX_WAIT only reads it and the timespec, which outlives the call.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.value.as_ptr(),
                    libc::FUTEX_WAIT,
                    expected,
                    ts_ptr,
                    std::ptr::null::<u32>(),
                    0u32,
                );
            }
        }

        /// Wakes up to `n` sleepers.
        pub(crate) fn wake(&self, n: u32) {
            let n = n.min(i32::MAX as u32) as libc::c_int;
            // SAFETY: FUTEX_WAKE only uses the word's address as a key; the word is live for the call.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.value.as_ptr(),
                    libc::FUTEX_WAKE,
                    n,
                    std::ptr::null::<libc::timespec>(),
                    std::ptr::null::<u32>(),
                    0u32,
                );
            }
        }
    }

    extern "C" {
        // glibc ≥ 2.30; not bound by the libc crate.
        fn pthread_mutex_clocklock(
            mutex: *mut libc::pthread_mutex_t,
            clock: libc::clockid_t,
            abstime: *const libc::timespec,
        ) -> libc::c_int;
    }

    /// A process-shared robust mutex living in (shared) memory.
    #[repr(C)]
    pub(crate) struct RobustMutex {
        raw: UnsafeCell<libc::pthread_mutex_t>,
    }

    /// Unlocks on drop.
    pub(crate) struct RobustGuard<'a> {
        mutex: &'a RobustMutex,
    }

    impl Drop for RobustGuard<'_> {
        fn drop(&mut self) {
            // SAFETY: this guard exists only while the calling thread owns the mutex.
            unsafe {
                libc::pthread_mutex_unlock(self.mutex.raw.get());
            }
        }
    }

    impl RobustMutex {
        /// Initialises the mutex in place.
        ///
        /// # Safety
        /// `this` points to writable memory of the mutex's size that no other thread or process uses yet.
        pub(crate) unsafe fn init(this: *mut RobustMutex) -> std::io::Result<()> {
            let mut attr = std::mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
            let check = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::from_raw_os_error(rc))
                }
            };
            // SAFETY: attr is initialised by pthread_mutexattr_init before any other use; `this` is valid and
            // unshared per the caller's contract, so initialising the mutex there races with nobody.
            unsafe {
                check(libc::pthread_mutexattr_init(attr.as_mut_ptr()))?;
                let result = check(libc::pthread_mutexattr_setpshared(
                    attr.as_mut_ptr(),
                    libc::PTHREAD_PROCESS_SHARED,
                ))
                .and_then(|()| {
                    check(libc::pthread_mutexattr_setrobust(
                        attr.as_mut_ptr(),
                        libc::PTHREAD_MUTEX_ROBUST,
                    ))
                })
                .and_then(|()| {
                    check(libc::pthread_mutex_init(
                        std::ptr::addr_of_mut!((*this).raw).cast(),
                        attr.as_ptr(),
                    ))
                });
                libc::pthread_mutexattr_destroy(attr.as_mut_ptr());
                result
            }
        }

        /// Takes the lock, waiting at most until `deadline` (`None`: no limit).
        pub(crate) fn lock(&self, deadline: Option<Instant>) -> Result<Locked<'_>, LockTimeout> {
            let raw = self.raw.get();
            let rc = match deadline {
                // SAFETY: the mutex was initialised by its creator before any handle to it existed.
                None => unsafe { libc::pthread_mutex_lock(raw) },
                Some(deadline) => {
                    // SAFETY: as above; a trylock first avoids a clock read on the uncontended path.
                    let rc = unsafe { libc::pthread_mutex_trylock(raw) };
                    if rc == libc::EBUSY {
                        let abs = monotonic_abs(deadline);
                        // SAFETY: as above; `abs` outlives the call.
                        unsafe { pthread_mutex_clocklock(raw, libc::CLOCK_MONOTONIC, &abs) }
                    } else {
                        rc
                    }
                }
            };
            match rc {
                0 => Ok(Locked {
                    guard: RobustGuard { mutex: self },
                    previous_owner_died: false,
                }),
                libc::EOWNERDEAD => {
                    // SAFETY: EOWNERDEAD means we now own the mutex; marking it consistent is the owner's job. The
                    // caller repairs the protected state before releasing the guard.
                    unsafe {
                        libc::pthread_mutex_consistent(raw);
                    }
                    Ok(Locked {
                        guard: RobustGuard { mutex: self },
                        previous_owner_died: true,
                    })
                }
                _ => Err(LockTimeout),
            }
        }
    }

    /// `deadline` as an absolute CLOCK_MONOTONIC timespec (std's Instant is CLOCK_MONOTONIC on Linux, but its
    /// inner value is private, so go through the remaining duration).
    fn monotonic_abs(deadline: Instant) -> libc::timespec {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let mut sec = now.tv_sec.saturating_add(remaining.as_secs() as i64);
        let mut nsec = now.tv_nsec as i64 + i64::from(remaining.subsec_nanos());
        if nsec >= 1_000_000_000 {
            sec = sec.saturating_add(1);
            nsec -= 1_000_000_000;
        }
        libc::timespec {
            tv_sec: sec as libc::time_t,
            tv_nsec: nsec as libc::c_long,
        }
    }
}

#[cfg(loom)]
mod imp {
    use super::{AtomicU32, Duration, Instant, LockTimeout, Locked, Ordering};
    use loom::sync::{Condvar, Mutex, MutexGuard};

    /// The futex modelled as "check under a mutex, then sleep on a condvar", which is what the kernel guarantees.
    pub(crate) struct Futex {
        value: AtomicU32,
        sleepers: Mutex<()>,
        cv: Condvar,
    }

    impl Default for Futex {
        fn default() -> Self {
            Futex {
                value: AtomicU32::new(0),
                sleepers: Mutex::new(()),
                cv: Condvar::new(),
            }
        }
    }

    impl Futex {
        pub(crate) fn load(&self) -> u32 {
            self.value.load(Ordering::SeqCst)
        }

        pub(crate) fn bump(&self) {
            self.value.fetch_add(1, Ordering::SeqCst);
        }

        pub(crate) fn wait(&self, expected: u32, _timeout: Option<Duration>) {
            let guard = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            if self.value.load(Ordering::SeqCst) == expected {
                drop(self.cv.wait(guard));
            }
        }

        pub(crate) fn wake(&self, _n: u32) {
            let _guard = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }

    pub(crate) struct RobustMutex {
        inner: Mutex<()>,
    }

    impl Default for RobustMutex {
        fn default() -> Self {
            RobustMutex {
                inner: Mutex::new(()),
            }
        }
    }

    pub(crate) struct RobustGuard<'a> {
        _guard: MutexGuard<'a, ()>,
    }

    impl RobustMutex {
        /// Initialises the mutex in place (loom queues live on the heap; this keeps `Queue::create` compiling).
        ///
        /// # Safety
        /// `this` points to writable, suitably aligned memory that no other thread uses yet.
        pub(crate) unsafe fn init(this: *mut RobustMutex) -> std::io::Result<()> {
            // SAFETY: per the contract, the memory is writable, aligned and unshared.
            unsafe { this.write(RobustMutex::default()) };
            Ok(())
        }

        pub(crate) fn lock(&self, _deadline: Option<Instant>) -> Result<Locked<'_>, LockTimeout> {
            let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            Ok(Locked {
                guard: RobustGuard { _guard: guard },
                previous_owner_died: false,
            })
        }
    }
}

pub(crate) use imp::{Futex, RobustGuard, RobustMutex};
