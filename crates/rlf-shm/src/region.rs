//! Named shared-memory regions.
//!
//! A region is a POSIX shared-memory object (`/dev/shm/rlf.<pid>.<start>.<random>`) created with mode 0600 and
//! `O_EXCL`, sized with `ftruncate` (so it starts zero-filled) and mapped read-write. Its [`RegionHandle`] is a
//! small serialisable value another process uses to [`Region::open`] it. The creator unlinks the name when its
//! `Region` drops (a forked copy of it does not); processes that still have it mapped keep their mapping.
//!
//! The name records the creator's pid and the kernel's start time of that process, so a segment whose creator has
//! died (a SIGKILLed run never runs its destructors) is recognisable even after the pid was reused:
//! [`reclaim_stale`] unlinks every such segment.

use serde::{Deserialize, Serialize};
use std::ffi::c_void;
use std::io;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

/// The prefix of every segment name this crate creates.
pub const NAME_PREFIX: &str = "rlf.";

/// Setup errors of regions and queues, with the segment they concern.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A system call on a segment failed.
    #[error("shared memory segment {name}: {op} failed: {source}")]
    Io {
        /// The segment's name.
        name: String,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// A segment exists but does not hold what the handle describes.
    #[error("shared memory segment {name}: {what}")]
    Invalid {
        /// The segment's name.
        name: String,
        /// What is wrong with it.
        what: String,
    },
    /// A configuration value is out of range.
    #[error("invalid queue configuration: {0}")]
    Config(String),
}

/// Everything another process needs to map a region: its name and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionHandle {
    /// The POSIX shm name, starting with `/`.
    pub name: String,
    /// The mapped length in bytes.
    pub len: usize,
}

/// A mapped shared-memory region. The creator's drop unlinks the name.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    name: String,
    /// The pid of the process that created the segment (`None`: opened). A child forked from the
    /// creator inherits the `Region` but is not its owner.
    creator: Option<u32>,
}

// SAFETY: the region is plain memory mapped into the process; what is stored in it is synchronised by the types
// built on top (atomics and a process-shared lock), not by the mapping.
unsafe impl Send for Region {}
// SAFETY: as above; &Region only hands out a raw pointer and the length.
unsafe impl Sync for Region {}

impl Region {
    /// Creates a new zero-filled region of `len` bytes with a fresh unguessable name, mode 0600.
    pub fn create(len: usize) -> Result<Region, ShmError> {
        Self::create_named(fresh_name()?, len)
    }

    /// Creates a new zero-filled region of `len` bytes that other processes can find by `tag` ([`tagged`]):
    /// `/rlf.<pid>.<start>.t-<tag>`, mode 0600, so it is reclaimed like any other once this process is gone. `tag`
    /// holds ASCII letters, digits, `-` and `_` only (at most [`MAX_TAG`] of them); one process creates a tag once.
    pub fn create_tagged(tag: &str, len: usize) -> Result<Region, ShmError> {
        if tag.is_empty()
            || tag.len() > MAX_TAG
            || !tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(ShmError::Config(format!(
                "a segment tag holds 1 to {MAX_TAG} ASCII letters, digits, '-' or '_', not {tag:?}"
            )));
        }
        let pid = std::process::id();
        let start = process_start_time(pid).unwrap_or(0);
        Self::create_named(format!("/{NAME_PREFIX}{pid}.{start}.{TAG_MARK}{tag}"), len)
    }

    fn create_named(name: String, len: usize) -> Result<Region, ShmError> {
        let io_err = |op, source| ShmError::Io {
            name: name.clone(),
            op,
            source,
        };
        let fd = rustix::shm::open(
            name.as_str(),
            rustix::shm::OFlags::CREATE | rustix::shm::OFlags::EXCL | rustix::shm::OFlags::RDWR,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .map_err(|e| io_err("shm_open", e.into()))?;
        let region = rustix::fs::ftruncate(&fd, len as u64)
            .map_err(|e| io_err("ftruncate", e.into()))
            .and_then(|()| map(&fd, len).map_err(|e| io_err("mmap", e)));
        match region {
            Ok(ptr) => Ok(Region {
                ptr,
                len,
                name,
                creator: Some(std::process::id()),
            }),
            Err(e) => {
                let _ = rustix::shm::unlink(name.as_str());
                Err(e)
            }
        }
    }

    /// Maps a region created by another process (or this one).
    pub fn open(handle: &RegionHandle) -> Result<Region, ShmError> {
        Self::open_at(&handle.name, Some(handle.len))
    }

    /// Maps the whole of the segment `name` (with its leading `/`), as [`tagged`] lists them.
    pub fn open_named(name: &str) -> Result<Region, ShmError> {
        Self::open_at(name, None)
    }

    /// Maps `len` bytes of segment `name` (`None`: all of it).
    fn open_at(name: &str, len: Option<usize>) -> Result<Region, ShmError> {
        let name = name.to_owned();
        let io_err = |op, source| ShmError::Io {
            name: name.clone(),
            op,
            source,
        };
        let fd = rustix::shm::open(
            name.as_str(),
            rustix::shm::OFlags::RDWR,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .map_err(|e| io_err("shm_open", e.into()))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_err("fstat", e.into()))?;
        let size = stat.st_size as u64;
        let len = len.unwrap_or(size as usize);
        if size < len as u64 {
            return Err(ShmError::Invalid {
                name,
                what: format!("is {size} bytes, the handle says {len}"),
            });
        }
        let ptr = map(&fd, len).map_err(|e| io_err("mmap", e))?;
        Ok(Region {
            ptr,
            len,
            name,
            creator: None,
        })
    }

    /// The handle to pass to other processes.
    pub fn handle(&self) -> RegionHandle {
        RegionHandle {
            name: self.name.clone(),
            len: self.len,
        }
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapped length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has zero length.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this process created the segment through this handle (and unlinks it on drop).
    pub fn is_owner(&self) -> bool {
        self.creator == Some(std::process::id())
    }

    /// Removes the segment's name now (the creator's drop then has nothing to remove): processes that mapped it keep
    /// their mapping, and nothing can open it any more, so nothing is left behind however the processes end.
    pub fn unlink(&mut self) -> Result<(), ShmError> {
        rustix::shm::unlink(self.name.as_str()).map_err(|e| ShmError::Io {
            name: self.name.clone(),
            op: "shm_unlink",
            source: e.into(),
        })?;
        self.creator = None;
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned and nothing borrows the mapping past the Region's life
        // (every type built on a Region owns it).
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast::<c_void>(), self.len);
        }
        if self.is_owner() {
            let _ = rustix::shm::unlink(self.name.as_str());
        }
    }
}

fn map(fd: &OwnedFd, len: usize) -> io::Result<NonNull<u8>> {
    if len == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero-length region"));
    }
    // SAFETY: a fresh shared mapping chosen by the kernel (null hint) aliases no Rust object; the fd is valid.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            fd,
            0,
        )
    }?;
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

fn fresh_name() -> Result<String, ShmError> {
    let mut random = [0u8; 8];
    rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty()).map_err(|e| {
        ShmError::Io {
            name: "(new)".into(),
            op: "getrandom",
            source: e.into(),
        }
    })?;
    let pid = std::process::id();
    let start = process_start_time(pid).unwrap_or(0);
    Ok(format!(
        "/{NAME_PREFIX}{pid}.{start}.{:016x}",
        u64::from_le_bytes(random)
    ))
}

/// The start time of process `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`), or `None` when the
/// process does not exist.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether a segment name (without the leading `/`) was made by a process that is gone: its pid does not exist,
/// belongs to a process started at another time, or to a process that is exiting or has exited and waits for its
/// parent to collect its status (a zombie). Names not made by this crate are never stale.
pub fn is_stale(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
        return false;
    };
    let mut parts = rest.split('.');
    let (Some(pid), Some(start)) = (parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    process_start_time(pid) != Some(start) || is_exiting(pid)
}

/// The kernel's `PF_EXITING` task flag: set first thing in `do_exit`, before the process releases its memory and
/// closes its files.
const PF_EXITING: u64 = 0x4;

/// Whether process `pid` is exiting (its flags, field 9 of `/proc/<pid>/stat`, hold `PF_EXITING`) or exited and
/// waits for its parent to collect its status (state `Z`, or `X` while it goes). An exiting process has closed its
/// files a moment before it turns into a zombie: a reaper woken by the last of them closing must not see it alive.
fn is_exiting(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let Some(end) = stat.rfind(')') else {
            return false;
        };
        let mut fields = stat[end + 1..].split_whitespace();
        let state = fields.next();
        let flags = fields.nth(5).and_then(|f| f.parse::<u64>().ok());
        matches!(state, Some("Z" | "X")) || flags.is_some_and(|f| f & PF_EXITING != 0)
    })
}

/// Unlinks every segment in `/dev/shm` left by a dead creator; returns the names removed. The directory is read
/// whole before anything is unlinked, and read again until a reading finds nothing more to remove: a directory
/// changed while it is read (this function's unlinks, other runs' segments coming and going) may skip entries.
pub fn reclaim_stale() -> io::Result<Vec<String>> {
    let mut removed = Vec::new();
    loop {
        let mut stale = Vec::new();
        for entry in std::fs::read_dir("/dev/shm")? {
            let name = entry?.file_name();
            if let Some(name) = name.to_str().filter(|n| is_stale(n)) {
                stale.push(name.to_string());
            }
        }
        let before = removed.len();
        for name in stale {
            if rustix::shm::unlink(format!("/{name}").as_str()).is_ok() {
                removed.push(name);
            }
        }
        if removed.len() == before {
            return Ok(removed);
        }
    }
}

/// The longest tag of [`Region::create_tagged`] (a segment name stays well inside `NAME_MAX`).
pub const MAX_TAG: usize = 200;

/// What sets a tagged segment's name apart from a fresh one's (whose last part is 16 hex digits).
const TAG_MARK: &str = "t-";

/// The segments of live processes whose tag ([`Region::create_tagged`]) starts with `prefix`: each creator's pid and
/// the name to open (with its leading `/`), in the order `/dev/shm` lists them.
pub fn tagged(prefix: &str) -> io::Result<Vec<(u32, String)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/dev/shm")? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
            continue;
        };
        let mut parts = rest.splitn(3, '.');
        let (Some(pid), Some(_start), Some(tag)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Some(tag) = tag.strip_prefix(TAG_MARK) else {
            continue;
        };
        if let (Ok(pid), true) = (pid.parse::<u32>(), tag.starts_with(prefix)) {
            if !is_stale(name) {
                found.push((pid, format!("/{name}")));
            }
        }
    }
    Ok(found)
}

/// The names of the segments in `/dev/shm` created by process `pid` (for tests and leak checks).
pub fn segments_of(pid: u32) -> io::Result<Vec<String>> {
    let prefix = format!("{NAME_PREFIX}{pid}.");
    let mut names = Vec::new();
    for entry in std::fs::read_dir("/dev/shm")? {
        if let Some(name) = entry?.file_name().to_str() {
            if name.starts_with(&prefix) {
                names.push(name.to_string());
            }
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn create_open_share_and_unlink() {
        let a = Region::create(4096).expect("create");
        let path = format!("/dev/shm{}", a.name());
        let mode = std::fs::metadata(&path)
            .expect("segment exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = Region::open(&a.handle()).expect("open");
        // SAFETY: both mappings are 4096 bytes long and only this thread touches them.
        unsafe {
            a.as_ptr().add(100).write(42);
            assert_eq!(b.as_ptr().add(100).read(), 42);
        }
        assert!(!b.is_owner());
        drop(b);
        assert!(std::path::Path::new(&path).exists(), "only the creator unlinks");
        drop(a);
        assert!(
            !std::path::Path::new(&path).exists(),
            "the creator's drop unlinks"
        );
    }

    #[test]
    fn an_unlinked_region_stays_mapped_and_can_no_longer_be_opened() {
        let mut a = Region::create(4096).expect("create");
        let b = Region::open(&a.handle()).expect("open");
        let path = format!("/dev/shm{}", a.name());
        a.unlink().expect("unlink");
        assert!(!std::path::Path::new(&path).exists(), "the name is gone");
        assert!(!a.is_owner(), "nothing left for the drop to remove");
        // SAFETY: both mappings are 4096 bytes long and only this thread touches them.
        unsafe {
            a.as_ptr().add(7).write(9);
            assert_eq!(
                b.as_ptr().add(7).read(),
                9,
                "both mappings still share the memory"
            );
        }
        assert!(
            Region::open(&a.handle()).is_err(),
            "a removed name cannot be opened"
        );
    }

    #[test]
    fn open_rejects_missing_and_short_segments() {
        let missing = RegionHandle {
            name: "/rlf.0.0.doesnotexist".into(),
            len: 64,
        };
        let err = Region::open(&missing).expect_err("missing segment");
        assert!(err.to_string().contains("rlf.0.0.doesnotexist"), "{err}");
        let a = Region::create(4096).expect("create");
        let mut h = a.handle();
        h.len = 1 << 20;
        let err = Region::open(&h).expect_err("short segment");
        assert!(err.to_string().contains("the handle says"), "{err}");
    }

    #[test]
    fn a_tagged_segment_is_found_by_its_tag_and_opened_whole() {
        let tag = format!("test-tag_{}", std::process::id());
        let a = Region::create_tagged(&tag, 8192).expect("create");
        let found = tagged("test-tag_").expect("list");
        let mine: Vec<_> = found.iter().filter(|(_, name)| name == a.name()).collect();
        assert_eq!(mine, [&(std::process::id(), a.name().to_owned())]);
        let fresh = Region::create(64).expect("create");
        assert!(
            tagged("")
                .expect("list")
                .iter()
                .all(|(_, name)| name != fresh.name()),
            "a segment made without a tag is not listed"
        );
        let b = Region::open_named(a.name()).expect("open");
        assert_eq!(b.len(), 8192);
        assert!(Region::create_tagged(&tag, 64).is_err(), "a tag is created once");
        for bad in ["", "a.b", "a/b", &"x".repeat(MAX_TAG + 1)] {
            let err = Region::create_tagged(bad, 64).expect_err(bad);
            assert!(err.to_string().contains("segment tag"), "{err}");
        }
        drop(b);
        drop(a);
        assert!(
            tagged(&tag).expect("list").is_empty(),
            "the creator's drop unlinks"
        );
    }

    #[test]
    fn live_segments_are_not_stale_dead_ones_are() {
        let a = Region::create(4096).expect("create");
        assert!(!is_stale(&a.name()[1..]));
        assert!(!is_stale("not-ours.1.2.3"));
        // pid 2^22+1 is above the default pid_max: it cannot be running.
        assert!(is_stale("rlf.4194305.12345.00ff00ff00ff00ff"));
        // our own pid with another start time: a reused pid.
        assert!(is_stale(&format!(
            "rlf.{}.1.0123456789abcdef",
            std::process::id()
        )));
    }
}
