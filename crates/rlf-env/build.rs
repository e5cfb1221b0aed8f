//! With the `python` feature, gives the crate's binaries (tests, examples) an rpath to the
//! libpython that pyo3 links, so they run without `LD_LIBRARY_PATH`, and records that Python's prefix
//! (`RLF_PYTHON_PREFIX`, for `gym::pin_python_home`). Without it, does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "python")]
    python_rpath();
}

#[cfg(feature = "python")]
fn python_rpath() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let config = pyo3_build_config::get();
    // The installation's prefix, for `gym::pin_python_home`.
    let prefix = config.executable().and_then(|python| {
        let out = std::process::Command::new(python)
            .args(["-c", "import sys; print(sys.base_prefix)"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    });
    match prefix {
        Some(prefix) => println!("cargo:rustc-env=RLF_PYTHON_PREFIX={prefix}"),
        None => println!("cargo:warning=rlf-env: cannot ask the Python interpreter for its prefix"),
    }
    match config.lib_dir() {
        Some(dir) => println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}"),
        None => println!(
            "cargo:warning=rlf-env: pyo3 reported no libpython directory; binaries may need LD_LIBRARY_PATH"
        ),
    }
}
