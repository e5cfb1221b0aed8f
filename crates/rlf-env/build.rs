//! With the `python` feature, gives the crate's binaries (tests, examples) an rpath to the
//! libpython that pyo3 links, so they run without `LD_LIBRARY_PATH`. Without it, does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "python")]
    python_rpath();
}

#[cfg(feature = "python")]
fn python_rpath() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let config = pyo3_build_config::get();
    match config.lib_dir() {
        Some(dir) => println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}"),
        None => println!(
            "cargo:warning=rlf-env: pyo3 reported no libpython directory; binaries may need LD_LIBRARY_PATH"
        ),
    }
}
