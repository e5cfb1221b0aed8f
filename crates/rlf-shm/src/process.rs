//! Process-wide settings that need a raw OS call.

/// Keeps freed heap memory in the process instead of returning it to the kernel.
///
/// libtorch frees and reallocates the same few hundred KB of activations and gradients at every
/// SGD step and forward pass. With glibc's defaults those blocks are mmapped or trimmed off the
/// heap top on free, so every step faults fresh zeroed pages back in: about a third of a
/// CartPole PPO step. Raising the mmap and trim thresholds makes the heap keep them (the process
/// holds at most its peak working set). Returns whether the allocator accepted both settings;
/// on a C library other than glibc nothing changes and it returns false.
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
        mmap == 1 && trim == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_accepts_the_thresholds() {
        assert_eq!(
            super::keep_freed_memory(),
            cfg!(all(target_os = "linux", target_env = "gnu"))
        );
    }
}
