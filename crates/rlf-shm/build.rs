//! With the `tch` feature, this crate's own tests link libtorch: put its library folder into their
//! rpath, so they run without `LD_LIBRARY_PATH` (rlfactory's build script does the same, with the
//! GPU runtime folders, for everything that trains), and pass the folder on to the crates that
//! depend on this one (`DEP_RLF_SHM_TORCH_LIB`): their tests link libtorch through this crate.

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_TCH").is_none() {
        return;
    }
    if let Some(libtorch) = std::env::var_os("LIBTORCH") {
        let lib = std::path::Path::new(&libtorch).join("lib");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
        println!("cargo:torch_lib={}", lib.display());
    }
}
