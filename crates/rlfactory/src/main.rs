//! The `rlfactory` binary: `rlfactory train --env <id> [flags]`, and `enjoy`, `eval`, `export` of a
//! trained experiment, over the built-in envs (see `rlfactory::cli::main`).

use std::process::ExitCode;

fn main() -> ExitCode {
    rlfactory::cli::main(rlf_env::EnvRegistry::with_builtin())
}
