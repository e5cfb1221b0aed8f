//! The control block at the start of a shared-memory structure's region (a [`Queue`](crate::Queue)'s, a replay
//! ring's), created and opened one way: the creator fills it while the region is still its own, initialises its
//! process-shared lock in place, then publishes it by storing its magic number with `Release`; an opener checks the
//! region's length and reads the magic with `Acquire` before anything else, so every field the creator wrote is
//! visible to it. The fields written before the magic never change after it.

use std::mem::size_of;

use crate::region::{Region, ShmError};
use crate::sync::{AtomicU64, Ordering, RobustMutex};

/// A control block that [`publish`] writes and [`open`] reads.
///
/// # Safety
/// The implementing type is `#[repr(C)]` with an alignment of at most a page, every bit pattern of zeros is a valid
/// value of it (its fields are atomics, numbers and a [`RobustMutex`]), and every bit pattern its creator and the
/// processes that use it leave is too.
pub(crate) unsafe trait ControlBlock: Sized {
    /// What the region holds, for errors: `an rlfactory queue`.
    const WHAT: &'static str;
    /// The number the creator stores last; an opener finding another one refuses the region.
    const MAGIC: u64;

    /// The magic number's field.
    fn magic(&self) -> &AtomicU64;

    /// The process-shared lock's field, to initialise in place.
    fn lock(&mut self) -> *mut RobustMutex;
}

/// Publishes the control block at the start of `region`, which this process has just created (zero-filled, its
/// handle given to no one yet): `fill` writes its fixed fields, the lock is initialised in place, and the magic
/// number is stored last with `Release`.
pub(crate) fn publish<H: ControlBlock>(region: &Region, fill: impl FnOnce(&mut H)) -> Result<(), ShmError> {
    if region.len() < size_of::<H>() {
        return Err(ShmError::Config(format!(
            "a region of {} bytes cannot hold the control block of {}",
            region.len(),
            H::WHAT
        )));
    }
    // SAFETY: the region is at least a block long and page-aligned (mmap), which satisfies H's alignment (the
    // trait's contract); it is fresh and zero-filled, a valid H, and no other thread or process has its handle until
    // this returns, so this is the only reference to it.
    let block = unsafe { &mut *region.as_ptr().cast::<H>() };
    fill(block);
    // SAFETY: the lock is a field of the block, writable and used by no one else yet (as above).
    unsafe { RobustMutex::init(block.lock()) }.map_err(|source| ShmError::Io {
        name: region.name().to_string(),
        op: "pthread_mutex_init",
        source,
    })?;
    block.magic().store(H::MAGIC, Ordering::Release);
    Ok(())
}

/// The control block of `region`, opened from another process's handle (or this one's), once it is at least
/// `min_len` bytes long and its magic number is `H`'s; the error says what is wrong with the region `name`.
pub(crate) fn open<'r, H: ControlBlock>(
    region: &'r Region,
    min_len: usize,
    name: &str,
) -> Result<&'r H, ShmError> {
    let invalid = |what: String| ShmError::Invalid {
        name: name.to_owned(),
        what,
    };
    if region.len() < min_len.max(size_of::<H>()) {
        return Err(invalid(format!(
            "is too small for {} ({} bytes)",
            H::WHAT,
            region.len()
        )));
    }
    // SAFETY: the region is at least a block long and page-aligned; every bit pattern is a valid H (the trait's
    // contract), and the block is only read through shared references here: its atomics change under other
    // processes, its other fields were written before the magic and never after.
    let block = unsafe { &*region.as_ptr().cast::<H>() };
    if block.magic().load(Ordering::Acquire) != H::MAGIC {
        return Err(invalid(format!("is not {} of this version", H::WHAT)));
    }
    Ok(block)
}
