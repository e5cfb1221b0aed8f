//! Puts libtorch's library folder, and the NVIDIA runtime folders installed beside it by
//! `scripts/setup_libtorch.sh`, into the rpath of every binary, test and example of this crate, so
//! they run without `LD_LIBRARY_PATH`.
//!
//! A build against the torch package of a Python environment (`LIBTORCH_USE_PYTORCH`, as `pip install .` does)
//! instead gets a library path relative to the binary (`$ORIGIN/../lib/python3.X/site-packages/torch/lib` for a
//! binary installed in the environment's `bin/`), so the installed binary finds the torch of the environment it is
//! installed in wherever that environment is, and the folder of the interpreter's libpython.
//!
//! A build against `LIBTORCH` also records that folder (`RLF_BUILT_LIBTORCH`) for the launcher, which looks there
//! when nothing else names a libtorch.

use std::path::{Path, PathBuf};

fn nvidia_lib_dirs(libtorch: &Path) -> Vec<PathBuf> {
    let Some(site) = libtorch.parent() else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    let mut stack = vec![site.join("nvidia")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            if path.file_name().is_some_and(|n| n == "lib") {
                dirs.push(path);
            } else {
                stack.push(path);
            }
        }
    }
    dirs.sort();
    dirs
}

/// What the environment's Python says: torch's library folder relative to the folder of the environment's
/// scripts, and the folder of its libpython.
const PYTHON_PATHS: &str = r"
import importlib.util, os, sysconfig
torch = importlib.util.find_spec('torch')
lib = os.path.join(os.path.dirname(torch.origin), 'lib')
print(os.path.relpath(lib, sysconfig.get_path('scripts')))
print(sysconfig.get_config_var('LIBDIR') or '')
";

/// The rpath of a build against a Python environment's torch (see the crate doc).
fn python_environment_rpath() {
    // The interpreter torch-sys asks (`python` in an active venv, else `python3`), unless maturin names it.
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| {
        if std::env::var_os("VIRTUAL_ENV").is_some() {
            "python".to_owned()
        } else {
            "python3".to_owned()
        }
    });
    let output = std::process::Command::new(&python)
        .args(["-c", PYTHON_PATHS])
        .output();
    let text = match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().last().unwrap_or("");
            println!("cargo:warning=LIBTORCH_USE_PYTORCH: {python} cannot locate torch: {last}");
            return;
        }
        Err(e) => {
            println!("cargo:warning=LIBTORCH_USE_PYTORCH: cannot run {python}: {e}");
            return;
        }
    };
    let mut lines = text.lines();
    if let Some(torch_lib) = lines.next() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/{torch_lib}");
    }
    if let Some(libdir) = lines.next().filter(|l| !l.is_empty()) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("LIBTORCH_USE_PYTORCH").is_some() {
        python_environment_rpath();
        return;
    }
    let Some(libtorch) = std::env::var_os("LIBTORCH").map(PathBuf::from) else {
        println!("cargo:warning=LIBTORCH is not set: run `eval \"$(scripts/setup_libtorch.sh)\"` first");
        return;
    };
    let lib = libtorch.join("lib");
    // The launcher (`src/launch.rs`) looks here when nothing else names a libtorch: a new shell in a clone has no
    // LIBTORCH set, and the command a run prints for the user to type next must work there.
    let built_against = std::fs::canonicalize(&lib).unwrap_or_else(|_| lib.clone());
    println!("cargo:rustc-env=RLF_BUILT_LIBTORCH={}", built_against.display());
    let mut dirs = vec![lib];
    dirs.extend(nvidia_lib_dirs(&libtorch));
    for dir in dirs {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
}
