//! When rlf-shm is built with its `tch` feature (as `--all-features` on the workspace builds it),
//! this crate's tests and doc tests link libtorch through it: put the library folder rlf-shm's build
//! script passes on into their rpath, so they run without `LD_LIBRARY_PATH`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(lib) = std::env::var_os("DEP_RLF_SHM_TORCH_LIB") {
        println!(
            "cargo:rustc-link-arg=-Wl,-rpath,{}",
            std::path::Path::new(&lib).display()
        );
    }
}
