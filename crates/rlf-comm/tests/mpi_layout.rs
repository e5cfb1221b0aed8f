//! The MPI flavour under OpenMPI's `mpirun` (cargo feature `mpi`; `scripts/setup_mpi.sh` installs it). Run by
//! `cargo test`, this binary starts `mpirun` on itself for each case, with a time limit; given `--rank LEARNERS
//! PER_ENV` it is one rank of that case, and a rank that finds something wrong aborts the whole job (no rank is left
//! waiting in a collective).
//! - Collectives: point to point from a rank and from any, broadcast, gather by rank, reduce, an allreduce whose
//!   result has the same bits on every rank, and subgroups made by their members alone, two at once from two threads.
//! - Layouts: 3, 4 and 5 ranks with `process_per_env` 1, 2 and every rank, and `learner_procs` 1 and 2: every rank's
//!   agent, env and learner communicators hold exactly the members EXARL's rules give, and each env group's lead is
//!   its rank 0 (with two learners too, where EXARL errs).
//! - An impossible layout fails fast on every rank, with one line from rank 0.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use rlf_comm::{Comm, Communicators, Layout, MpiThreadWorld, MpiUniverse, Op, Source, Values};

fn rank_main(learner_procs: usize, process_per_env: usize) -> ExitCode {
    let universe = match MpiUniverse::init_threaded() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let layout = match Layout::new(size, learner_procs, process_per_env) {
        Ok(layout) => layout,
        Err(e) => {
            if rank == 0 {
                eprintln!("error: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let threads = match universe.thread_world() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    if let Err(e) = collectives(&world, &threads) {
        eprintln!("rank {rank}: {e}");
        world.abort(1);
    }
    let aborter = universe.world();
    let checked = Communicators::split(Box::new(world), layout).and_then(|c| c.check());
    match checked {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(wrong)) => {
            eprintln!("{wrong}");
            aborter.abort(1)
        }
        Err(e) => {
            eprintln!("rank {rank}: {e}");
            aborter.abort(1)
        }
    }
}

/// The collectives' semantics on this world; an error names what differed.
fn collectives(world: &dyn Comm, threads: &MpiThreadWorld) -> Result<(), String> {
    let (rank, size) = (world.rank(), world.size());
    let e = |e: rlf_comm::CommError| e.to_string();
    // From a rank: the last rank sends rank 0 two messages, taken in the order sent.
    if rank == size - 1 {
        world.send(0, 6, b"first").map_err(e)?;
        world.send(0, 6, b"second").map_err(e)?;
    }
    if rank == 0 {
        for want in [&b"first"[..], b"second"] {
            let m = world.recv(Source::Rank(size - 1), 6).map_err(e)?;
            if (m.from, m.bytes.as_slice()) != (size - 1, want) {
                return Err(format!("from rank {}: {:?}", m.from, m.bytes));
            }
        }
    }
    if rank != 0 {
        world.send(0, 5, &[rank as u8; 3]).map_err(e)?;
    } else {
        let mut seen: Vec<usize> = (1..size)
            .map(|_| world.recv(Source::Any, 5).map(|m| m.from))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        seen.sort_unstable();
        if seen != (1..size).collect::<Vec<_>>() {
            return Err(format!("received from {seen:?}"));
        }
    }
    let mut b = if rank == size - 1 {
        vec![7; 1000]
    } else {
        Vec::new()
    };
    world.bcast(size - 1, &mut b).map_err(e)?;
    if b != vec![7; 1000] {
        return Err("broadcast".into());
    }
    if let Some(all) = world.gather(0, &vec![rank as u8; rank]).map_err(e)? {
        if all.iter().enumerate().any(|(r, v)| *v != vec![r as u8; r]) {
            return Err(format!("gathered {all:?}"));
        }
    }
    let mut counts = [1.0f64, rank as f64];
    world.reduce(0, Values::F64(&mut counts), Op::Sum).map_err(e)?;
    if rank == 0 && counts != [size as f64, (size * (size - 1) / 2) as f64] {
        return Err(format!("reduced {counts:?}"));
    }
    // Values whose sum depends on the order of the additions: every rank must still hold the same bits.
    let mut w: Vec<f32> = (0..64)
        .map(|i| (rank as f32 + 1.0) * 1e7 / (i as f32 + 1.0) + 0.1)
        .collect();
    world.allreduce(Values::F32(&mut w), Op::Sum).map_err(e)?;
    let bits: Vec<u8> = w.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    let mut root = bits.clone();
    world.bcast(0, &mut root).map_err(e)?;
    if root != bits {
        return Err("allreduce gave different bits on different ranks".into());
    }
    subgroups(world, threads)?;
    world.barrier().map_err(e)
}

/// Subgroups made by their members alone: the last two ranks make two, in reverse rank order and with different
/// tags, one from each of two threads at once, while rank 0 makes none; each is broadcast in from its rank 0.
fn subgroups(world: &dyn Comm, threads: &MpiThreadWorld) -> Result<(), String> {
    let (rank, size) = (world.rank(), world.size());
    if rank + 2 < size {
        return Ok(());
    }
    let pair = [size - 1, size - 2];
    let threads: Vec<_> = [9u16, 10]
        .into_iter()
        .map(|tag| {
            let threads = threads.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let world = threads.world();
                let sub = world.subgroup(&pair, tag).map_err(|e| e.to_string())?;
                let mut b = if sub.rank() == 0 {
                    vec![tag as u8; 3]
                } else {
                    Vec::new()
                };
                sub.bcast(0, &mut b).map_err(|e| e.to_string())?;
                let want_rank = pair.iter().position(|&r| r == rank);
                if b != vec![tag as u8; 3] || Some(sub.rank()) != want_rank || sub.size() != 2 {
                    return Err(format!(
                        "subgroup {pair:?} tag {tag}: rank {} got {b:?}",
                        sub.rank()
                    ));
                }
                Ok(())
            })
        })
        .collect();
    threads
        .into_iter()
        .try_for_each(|t| t.join().map_err(|_| "a subgroup thread panicked".to_owned())?)
}

fn mpirun(ranks: usize, learner_procs: usize, process_per_env: usize) -> (bool, String, Duration) {
    let me = std::env::current_exe().expect("the test binary");
    let start = Instant::now();
    let out = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--timeout",
            "120",
            "-n",
            &ranks.to_string(),
        ])
        .arg(me)
        .args([
            "--rank".to_owned(),
            learner_procs.to_string(),
            process_per_env.to_string(),
        ])
        .output()
        .expect("mpirun (Debian's openmpi-bin) runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        start.elapsed(),
    )
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--rank") {
        let number = |i: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(0);
        return rank_main(number(1), number(2));
    }
    let mut ran = 0;
    for ranks in 3..=5 {
        for learner_procs in 1..=2 {
            for process_per_env in [1, 2, ranks] {
                let possible = Layout::new(ranks, learner_procs, process_per_env).is_ok();
                let (ok, stderr, took) = mpirun(ranks, learner_procs, process_per_env);
                let case = format!(
                    "{ranks} ranks, learner_procs {learner_procs}, process_per_env {process_per_env}"
                );
                if possible {
                    assert!(ok, "{case}: {stderr}");
                } else {
                    assert!(!ok, "{case} should fail");
                    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
                    assert_eq!(lines.len(), 1, "{case}: one line from rank 0:\n{stderr}");
                    assert!(
                        lines[0].contains("must be a positive multiple of process_per_env"),
                        "{stderr}"
                    );
                    assert!(took < Duration::from_secs(30), "{case} took {took:?}");
                }
                println!("test mpi_layout::{ranks}_{learner_procs}_{process_per_env} ... ok");
                ran += 1;
            }
        }
    }
    println!("\ntest result: ok. {ran} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
    ExitCode::SUCCESS
}
