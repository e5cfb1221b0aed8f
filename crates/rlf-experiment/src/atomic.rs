//! Crash-safe file replacement: write a temporary file in the same directory, fsync it, rename it over the target,
//! fsync the directory. A reader (or a process started after a crash) sees the old file or the new one, never a mix.

use crate::error::{io, Result};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Prefix of the temporary files; anything starting with it is debris of a write cut short.
pub(crate) const TEMP_PREFIX: &str = ".tmp.";

/// The temporary sibling of `path`: same directory, same extension (image encoders pick the format from it).
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    path.with_file_name(format!("{TEMP_PREFIX}{name}"))
}

/// The directory holding `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Replaces `path` with `bytes` atomically and durably. A write that fails (a full disk) leaves `path` as it was and
/// no temporary file.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    let written = File::create(&tmp).map_err(io(&tmp)).and_then(|mut f| {
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))
    });
    discard_on_error(&tmp, written)?;
    rename(&tmp, path)
}

/// Makes the already written temporary file `tmp` durable and renames it to `path`.
pub(crate) fn commit(tmp: &Path, path: &Path) -> Result<()> {
    let synced = File::open(tmp).and_then(|f| f.sync_all()).map_err(io(tmp));
    discard_on_error(tmp, synced)?;
    rename(tmp, path)
}

/// `result`, after removing the temporary file `tmp` when it is an error: a write cut short by a full disk must not
/// hold on to the space it took.
pub(crate) fn discard_on_error<T>(tmp: &Path, result: Result<T>) -> Result<T> {
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}

fn rename(tmp: &Path, path: &Path) -> Result<()> {
    fs::rename(tmp, path).map_err(io(path))?;
    sync_dir(parent_dir(path))
}

/// Makes renames and deletions in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        write(&p, b"one").unwrap();
        write(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.json")]);
    }

    #[test]
    fn temp_path_keeps_extension_and_directory() {
        assert_eq!(temp_path(Path::new("d/curve.png")), Path::new("d/.tmp.curve.png"));
        assert_eq!(parent_dir(Path::new("x")), Path::new("."));
    }

    #[test]
    fn errors_name_the_file() {
        let err = write(Path::new("/nonexistent-dir/x"), b"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent-dir/.tmp.x"), "{err}");
    }
}
