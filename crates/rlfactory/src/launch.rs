//! The `rlfactory` command: finds libtorch, then runs the `rlfactory-core` binary beside it (the whole program, which
//! links libtorch) in its place, with libtorch's folder on `LD_LIBRARY_PATH`.
//!
//! libtorch is a load-time dependency of `rlfactory-core`: a missing one would fail in the dynamic loader before
//! `main`, with the loader's message. This launcher links nothing but the standard library, so it can look for
//! libtorch and say in one line how to point at it. It looks, in order, in
//! 1. `$LIBTORCH/lib` (a libtorch folder, or a torch package's folder: `.../site-packages/torch`);
//! 2. the torch package of the Python environment the binaries are installed in (`<bin>/../lib/python3.*/
//!    site-packages/torch/lib`, where `pip install .` puts them beside the environment's torch);
//! 3. the libtorch the binaries were built against, when the build named one (`LIBTORCH` at build time, as in a
//!    clone after `scripts/setup_libtorch.sh`: its `.libtorch/`), and it is still there;
//! 4. the torch package of the active Python (`$VIRTUAL_ENV/bin/python`, else `python3` on `PATH`).
//!
//! The process stays the same (the program is replaced by `exec`), so its id, its start time (the runs' timings count
//! from it) and its parent are the ones the caller sees.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The library every libtorch folder has.
const LIBTORCH_CPU: &str = "libtorch_cpu.so";

/// What asks the active Python for its torch package's library folder without importing torch.
const FIND_TORCH: &str = "import importlib.util, os
spec = importlib.util.find_spec('torch')
print(os.path.join(os.path.dirname(spec.origin), 'lib') if spec and spec.origin else '')";

/// The one line for a libtorch that none of the places hold.
const NOT_FOUND: &str = "libtorch not found: set LIBTORCH to a libtorch 2.13 folder (a torch 2.13 package's folder, \
     .../site-packages/torch, works; `eval \"$(bash scripts/setup_libtorch.sh)\"` in a clone sets it), or run from a \
     Python environment with torch==2.13 installed";

fn has_libtorch(dir: &Path) -> bool {
    dir.join(LIBTORCH_CPU).is_file()
}

/// `<bin>/../lib/python3.*/site-packages/torch/lib` of the environment `bin` belongs to, if it has libtorch.
fn environment_torch(bin: &Path) -> Option<PathBuf> {
    let lib = bin.parent()?.join("lib");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages/torch/lib"))
        .filter(|dir| has_libtorch(dir))
        .collect();
    found.sort();
    found.pop()
}

/// The library folder of the active Python's torch package, if it has one.
fn active_python_torch() -> Option<PathBuf> {
    let python = match std::env::var_os("VIRTUAL_ENV") {
        Some(venv) => PathBuf::from(venv).join("bin/python"),
        None => PathBuf::from("python3"),
    };
    let out = Command::new(python).args(["-c", FIND_TORCH]).output().ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && has_libtorch(&dir)).then_some(dir)
}

/// The library folder of the libtorch the binaries were built against (see the module doc), if it is still there.
fn built_against() -> Option<PathBuf> {
    let dir = PathBuf::from(option_env!("RLF_BUILT_LIBTORCH")?);
    has_libtorch(&dir).then_some(dir)
}

/// Where libtorch is (see the module doc), or the one line that says how to point at it.
fn find_libtorch(bin: &Path) -> Result<PathBuf, String> {
    if let Some(root) = std::env::var_os("LIBTORCH") {
        let dir = PathBuf::from(&root).join("lib");
        return match has_libtorch(&dir) {
            true => Ok(dir),
            false => Err(format!(
                "LIBTORCH={} has no lib/{LIBTORCH_CPU}: point it at a libtorch 2.13 folder (or a torch 2.13 \
                 package's folder, .../site-packages/torch)",
                root.to_string_lossy()
            )),
        };
    }
    environment_torch(bin)
        .or_else(built_against)
        .or_else(active_python_torch)
        .ok_or_else(|| NOT_FOUND.to_owned())
}

fn main() -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("error: cannot find this program's own path: {e}");
            return ExitCode::FAILURE;
        }
    };
    let bin = exe.parent().unwrap_or(Path::new("/")).to_owned();
    let core = bin.join("rlfactory-core");
    if !core.is_file() {
        eprintln!(
            "error: {} is missing: the rlfactory command runs the rlfactory-core binary installed beside it",
            core.display()
        );
        return ExitCode::FAILURE;
    }
    let libtorch = match find_libtorch(&bin) {
        Ok(dir) => dir,
        Err(line) => {
            eprintln!("error: {line}");
            return ExitCode::FAILURE;
        }
    };
    let mut path = OsString::from(libtorch.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| OsString::from("rlfactory"));
    let err = Command::new(&core)
        .arg0(arg0)
        .args(args)
        .env("LD_LIBRARY_PATH", path)
        .exec();
    eprintln!("error: cannot run {}: {err}", core.display());
    ExitCode::FAILURE
}
