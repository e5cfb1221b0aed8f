//! The `rlf-shm` crate's integration tests, one module per subject, in one binary: the queue's single-process
//! semantics (`queue_semantics`), and the multi-process tests of the queue (`queue_process`) and of the replay ring
//! (`replay_process`), for which the binary re-runs itself as producer, consumer, writer or sampler processes
//! ([`child`]).
//!
//! The binary has its own `main` (`harness = false`), so that a re-run plays its role before any test starts;
//! libtest-mimic stands in for the standard harness. It takes the same arguments (`-- queue_semantics::`, `--exact`,
//! `--skip`, `--list`, `--test-threads`), and every test is named `module::test` as the standard harness names them.

mod child;
mod queue_process;
mod queue_semantics;
mod replay_process;

fn main() {
    child::play_role(queue_process::ROLE_VAR, queue_process::run_role);
    child::play_role(replay_process::ROLE_VAR, replay_process::run_role);
    let args = libtest_mimic::Arguments::from_args();
    let trials = [
        queue_semantics::trials(),
        queue_process::trials(),
        replay_process::trials(),
    ]
    .into_iter()
    .flatten()
    .collect();
    libtest_mimic::run(&args, trials).exit();
}
