//! [`train_mpi`]: `train --mpi` under `mpirun` (cargo feature `mpi`): MPI started for several threads, then this
//! process's rank of the async workflow ([`super::train_rank`]). A rank's learners average their gradients with [`crate::algo::allreduce::AllreduceGradients`].

use std::time::Instant;

use crate::env::EnvRegistry;
use crate::error::{Result, RlfError};
use crate::plan::RunPlan;
use crate::runner::Summary;

/// The variables an MPI launcher sets in every rank's environment (OpenMPI's, then the PMI and PMIx ones of MPICH,
/// Slurm and others).
const LAUNCHER_VARIABLES: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"];

/// OpenMPI's setting that makes a waiting receive yield the core (`--mca mpi_yield_when_idle`).
#[cfg(feature = "mpi")]
const YIELD_WHEN_IDLE: &str = "OMPI_MCA_mpi_yield_when_idle";

/// OpenMPI's variables for a binding: set by `mpirun` when it bound the rank at launch, and (only when asked, by
/// `--bind-to` or the environment) the binding policy.
#[cfg(feature = "mpi")]
const BOUND_AT_LAUNCH: &str = "OMPI_MCA_orte_bound_at_launch";
#[cfg(feature = "mpi")]
const BINDING_POLICY: &str = "OMPI_MCA_hwloc_base_binding_policy";

/// Undoes the binding OpenMPI makes when nobody asked for one: by default `mpirun` binds each rank to one core in a
/// job of two ranks (to a package with more), made for one single-threaded process per rank. A rank here is a tree
/// of processes and threads (its rollout and inference workers, or its learner, the link's threads), and all of
/// them would share that core: two ranks on a machine of 16 cores would run on 2 of them, and with two ranks on 2
/// cores the learner rank's link threads preempt its learner (about 320 times a second) while the other core idles
/// a quarter of the time. The calling thread (the main thread, before any other starts: threads and processes
/// inherit it) may then run on every CPU the machine (its cgroup) allows, as with `mpirun --bind-to none`. A binding
/// that was asked for (`--bind-to core`, or `OMPI_MCA_hwloc_base_binding_policy` in the environment) is kept.
/// Returns what was done, for the log.
#[cfg(feature = "mpi")]
fn undo_default_binding() -> Option<String> {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

    let bound = std::env::var_os(BOUND_AT_LAUNCH).is_some_and(|v| v == "1");
    if !bound || std::env::var_os(BINDING_POLICY).is_some() {
        return None;
    }
    let before = sched_getaffinity(None).ok()?.count();
    let mut every = CpuSet::new();
    for cpu in 0..CpuSet::MAX_CPU {
        every.set(cpu);
    }
    // The kernel keeps of `every` the CPUs that are online and that the cgroup allows.
    if let Err(e) = sched_setaffinity(None, &every) {
        return Some(format!(
            "OpenMPI bound each rank to {before} CPU(s); widening it failed ({e}): every process of a rank shares them"
        ));
    }
    let after = sched_getaffinity(None).map_or(before, |set| set.count());
    Some(format!(
        "OpenMPI bound each rank to {before} CPU(s) by default; a rank runs several processes, which may now use all \
         {after} CPU(s) of this machine (`mpirun --bind-to core` keeps a binding)"
    ))
}

/// Whether an MPI launcher started this process.
fn under_launcher() -> bool {
    LAUNCHER_VARIABLES.iter().any(|v| std::env::var_os(v).is_some())
}

/// Trains as this process's rank of an MPI job: learner rank 0 returns the summary, the other ranks `None`. Outside
/// `mpirun`, or with a layout the ranks cannot make (an error rank 0 alone reports), it is an error.
#[cfg(feature = "mpi")]
pub fn train_mpi(plan: &RunPlan, registry: &EnvRegistry, process_start: Instant) -> Result<Option<Summary>> {
    use std::sync::Arc;

    use rlf_comm::{Comm, MpiThreadWorld, MpiUniverse, WorldMaker};

    use super::link::{TO_ACTOR, TO_LEARNER};
    use super::node::{NodeLinks, NodeMaker};

    struct Threads(MpiThreadWorld);
    impl WorldMaker for Threads {
        fn world(&self) -> Box<dyn Comm> {
            Box::new(self.0.world())
        }

        fn abort(&self, code: i32) -> ! {
            self.0.world().abort(code)
        }
    }

    if !under_launcher() {
        return Err(not_launched());
    }
    let unbound = undo_default_binding();
    // mpirun SIGKILLs a rank (and its process group) one second after asking it to stop: a reaper removes what
    // shared memory the rank and its workers leave then.
    if !rlf_shm::process::start_segment_reaper().map_err(|e| RlfError::EventLoop(format!("--mpi: {e}")))? {
        eprintln!("[rlfactory] no shared-memory reaper: this process already runs several threads");
    }
    // OpenMPI's receives spin while they wait; a rank's receiving thread waits most of the time, on cores that its
    // workers need. Yielding in that spin keeps about 90% of one process's CartPole throughput on 2 cores instead of
    // 31% (docs/benchmarks.md). Set before MPI starts and before this process has a second thread; a value given wins.
    // A message above OpenMPI's shared-memory eager limit (4 KB by default) goes by rendezvous: its sending thread
    // waits, spinning, for the other rank to match it. 32 KB lets small messages go at once. A limit above CartPole's
    // 37 KB weight updates and 145 KB trajectories (1 MB) kept about 100% of one process's FPS with 1 + 1 ranks
    // instead of 88% (with the CartPole config shipped before 2026-11-29), but with it an actor rank stopped by
    // SIGSTOP stalled the learner rank's receiving from the healthy ranks (not with 64 KB, under which the 145 KB
    // trajectories still go by rendezvous), and the heartbeat check blamed one of those (docs/benchmarks.md).
    // Between ranks of one machine the link's messages go through shared memory instead (`--mpi_shm_links`), so
    // these settings are for the ranks of several machines.
    for (variable, value) in [
        (YIELD_WHEN_IDLE, "1"),
        ("OMPI_MCA_btl_vader_eager_limit", "32768"),
        ("OMPI_MCA_btl_vader_max_send_size", "32768"),
    ] {
        if std::env::var_os(variable).is_none() {
            std::env::set_var(variable, value);
        }
    }
    let mpi_error = |e: rlf_comm::CommError| RlfError::Config(format!("--mpi: {e}"));
    let universe = MpiUniverse::init_threaded().map_err(mpi_error)?;
    let world = universe.world();
    if let Some(unbound) = unbound.filter(|_| world.rank() == 0) {
        eprintln!("[rlfactory] {unbound}");
    }
    let maker: Arc<dyn WorldMaker> = Arc::new(Threads(universe.thread_world().map_err(mpi_error)?));
    // The link's messages between ranks of this machine through shared memory (every rank decides alike).
    let links = if plan.config.distributed.mpi_shm_links {
        NodeLinks::connect(&world, &[TO_LEARNER, TO_ACTOR]).map_err(mpi_error)?
    } else {
        None
    };
    let maker: Arc<dyn WorldMaker> = match &links {
        Some(links) => Arc::new(NodeMaker {
            inner: maker,
            links: Arc::clone(links),
        }),
        None => maker,
    };
    let result = crate::runner::train_rank(plan, registry, process_start, &world, maker);
    // `train_rank` returns once every peer's last message is in (a silent peer has it abort the job instead), so no
    // put into this rank's queues is under way: a close waits for each queue's lock.
    if let Some(links) = links {
        links.close();
    }
    let rank = world.rank();
    drop(world);
    // `mpirun`, asked to stop, holds every rank's `MPI_Finalize` until it SIGKILLs them, and it SIGKILLs them all as
    // soon as one exits (docs/benchmarks.md). Rank 0, which saves the experiment, has saved it and heard every peer's
    // last message when stopped by a signal: it exits without finalizing, and the job ends then. The other ranks
    // wait in `MPI_Finalize` so that none ends the job before rank 0 has written everything.
    if rank == 0 && rlf_signal::stop_requested() {
        universe.leave_unfinalized();
        eprintln!("[rlfactory] rank 0: stopped by a signal, exits without finalizing MPI");
    }
    result
}

/// `--mpi` in a build without MPI: the error says how to get one.
#[cfg(not(feature = "mpi"))]
pub fn train_mpi(
    _plan: &RunPlan,
    _registry: &EnvRegistry,
    _process_start: Instant,
) -> Result<Option<Summary>> {
    if !under_launcher() {
        return Err(not_launched());
    }
    Err(RlfError::Config(
        "--mpi: this rlfactory was built without MPI (build it with `--features mpi`, which needs libopenmpi-dev)"
            .into(),
    ))
}

fn not_launched() -> RlfError {
    RlfError::Config(format!(
        "--mpi: this process was not started by an MPI launcher (none of {} is set): run it as \
         `mpirun -n 3 rlfactory train --mpi ...`",
        LAUNCHER_VARIABLES.join(", ")
    ))
}
