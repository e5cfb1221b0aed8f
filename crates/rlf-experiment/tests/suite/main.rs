//! The `rlf-experiment` crate's integration tests, one module per subject, in one binary: the checkpoint store under
//! SIGKILL (`checkpoint_crash`), for which the binary re-runs itself as the writer process it kills, and our
//! TensorBoard event files read back by TensorBoard (`summary_tensorboard`).
//!
//! The binary has its own `main` (`harness = false`), so that a re-run plays the writer before any test starts;
//! libtest-mimic stands in for the standard harness. It takes the same arguments (`-- checkpoint_crash::`, `--exact`,
//! `--skip`, `--list`, `--test-threads`), and every test is named `module::test` as the standard harness names them.

mod checkpoint_crash;
mod summary_tensorboard;

fn main() {
    checkpoint_crash::play_writer();
    let args = libtest_mimic::Arguments::from_args();
    let trials = [checkpoint_crash::trials(), summary_tensorboard::trials()]
        .into_iter()
        .flatten()
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
