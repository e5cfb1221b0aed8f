//! Puts libtorch's library folder, and the NVIDIA runtime folders installed beside it by
//! `scripts/setup_libtorch.sh`, into the rpath of every binary, test and example of this crate, so
//! they run without `LD_LIBRARY_PATH`.

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

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    let Some(libtorch) = std::env::var_os("LIBTORCH").map(PathBuf::from) else {
        println!("cargo:warning=LIBTORCH is not set: run `eval \"$(scripts/setup_libtorch.sh)\"` first");
        return;
    };
    let mut dirs = vec![libtorch.join("lib")];
    dirs.extend(nvidia_lib_dirs(&libtorch));
    for dir in dirs {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
}
