//! Training across processes and machines over [`rlf_comm`]'s communicators (EXARL's structure, issue 17).
//!
//! [`train_mpi`]: `train --mpi` under `mpirun` (cargo feature `mpi`): MPI started for several threads, then this
//! process's rank of the async workflow ([`crate::runner::train_rank`]).
//!
//! [`AllreduceGradients`]: several learners of one policy, each on its own data, average every SGD step's
//! gradients over the learner communicator (a sum by `allreduce`, which leaves the same bits on every rank, divided
//! by the number of learners), so that their weights stay bit-identical.

use rlf_comm::{Comm, Op, Values};

use std::time::Instant;

use crate::algo::adam::GradientSync;
use crate::config::Config;
use crate::env::EnvRegistry;
use crate::error::{Result, RlfError};
use crate::runner::Summary;

/// The variables an MPI launcher sets in every rank's environment (OpenMPI's, then the PMI and PMIx ones of MPICH,
/// Slurm and others).
const LAUNCHER_VARIABLES: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"];

/// OpenMPI's setting that makes a waiting receive yield the core (`--mca mpi_yield_when_idle`).
#[cfg(feature = "mpi")]
const YIELD_WHEN_IDLE: &str = "OMPI_MCA_mpi_yield_when_idle";

/// Whether an MPI launcher started this process.
fn under_launcher() -> bool {
    LAUNCHER_VARIABLES.iter().any(|v| std::env::var_os(v).is_some())
}

/// Trains as this process's rank of an MPI job: learner rank 0 returns the summary, the other ranks `None`. Outside
/// `mpirun`, or with a layout the ranks cannot make (an error rank 0 alone reports), it is an error.
#[cfg(feature = "mpi")]
pub fn train_mpi(cfg: &Config, registry: &EnvRegistry, process_start: Instant) -> Result<Option<Summary>> {
    use std::sync::Arc;

    use rlf_comm::{MpiThreadWorld, MpiUniverse};

    use rlf_comm::WorldMaker;

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
    // mpirun SIGKILLs a rank (and its process group) one second after asking it to stop: a reaper removes what
    // shared memory the rank and its workers leave then.
    if !rlf_shm::process::start_segment_reaper().map_err(|e| RlfError::EventLoop(format!("--mpi: {e}")))? {
        eprintln!("[rlfactory] no shared-memory reaper: this process already runs several threads");
    }
    // OpenMPI's receives spin while they wait; a rank's receiving thread waits most of the time, on cores that its
    // workers need. Yielding in that spin keeps about 90% of one process's CartPole throughput on 2 cores instead of
    // 31% (BENCHMARKS.md). Set before MPI starts and before this process has a second thread; a value given wins.
    // A weight update (18 KB for CartPole's network) above OpenMPI's 4 KB shared-memory eager limit makes the
    // learner rank's sending thread wait for each match on the learner's own core; 32 KB lets it go at once (4% more
    // CartPole FPS with 1 + 1 ranks, BENCHMARKS.md).
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
    let maker = Arc::new(Threads(universe.thread_world().map_err(mpi_error)?));
    crate::runner::train_rank(cfg, registry, process_start, &world, maker)
}

/// `--mpi` in a build without MPI: the error says how to get one.
#[cfg(not(feature = "mpi"))]
pub fn train_mpi(_cfg: &Config, _registry: &EnvRegistry, _process_start: Instant) -> Result<Option<Summary>> {
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

/// Averages gradients over a communicator of learners. Each step's allreduce carries one more number, a stop flag,
/// so that a learner that stops releases the others from the collective they wait in (they stop too); every
/// `check_every` steps (0: never) the learners compare digests of their weights, and a difference is an error.
pub struct AllreduceGradients {
    comm: Box<dyn Comm>,
    /// The gradients, then the stop flag.
    buffer: Vec<f32>,
    /// A learner stopped: no more collectives.
    stopped: bool,
    check_every: u64,
    steps: u64,
}

impl std::fmt::Debug for AllreduceGradients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllreduceGradients")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .field("steps", &self.steps)
            .finish()
    }
}

impl AllreduceGradients {
    /// Averages the gradients over `comm`, the policy's learner communicator, comparing the learners' weights every
    /// `check_every` steps.
    pub fn new(comm: Box<dyn Comm>, check_every: u64) -> Self {
        Self {
            comm,
            buffer: Vec::new(),
            stopped: false,
            check_every,
            steps: 0,
        }
    }

    fn comm_error(&self, e: rlf_comm::CommError) -> RlfError {
        RlfError::Protocol {
            component: "learner communicator",
            message: e.to_string(),
        }
    }
}

/// A digest of `values`' bits (FNV-1a), as two exact halves.
fn digest(values: &[f32]) -> [f64; 2] {
    let hash = values.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, v| {
        v.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
    });
    [(hash >> 32) as f64, (hash & 0xffff_ffff) as f64]
}

impl GradientSync for AllreduceGradients {
    fn average(&mut self, grads: &mut [f32]) -> Result<bool> {
        if self.stopped {
            return Ok(false);
        }
        let n = grads.len();
        self.buffer.clear();
        self.buffer.extend_from_slice(grads);
        self.buffer.push(0.0);
        self.comm
            .allreduce(Values::F32(&mut self.buffer), Op::Sum)
            .map_err(|e| self.comm_error(e))?;
        if self.buffer[n] > 0.0 {
            self.stopped = true;
            return Ok(false);
        }
        let learners = self.comm.size() as f32;
        for (g, sum) in grads.iter_mut().zip(&self.buffer) {
            *g = sum / learners;
        }
        Ok(true)
    }

    fn stepped(&mut self, weights: &tch::Tensor) -> Result<()> {
        self.steps += 1;
        if self.check_every == 0 || self.steps % self.check_every != 0 {
            return Ok(());
        }
        let host = Vec::<f32>::try_from(
            weights
                .f_to_device(tch::Device::Cpu)?
                .f_to_kind(tch::Kind::Float)?,
        )?;
        let [hi, lo] = digest(&host);
        // The largest and (negated) the smallest digest over the learners, in one collective.
        let mut spread = [hi, lo, -hi, -lo];
        self.comm
            .allreduce(Values::F64(&mut spread), Op::Max)
            .map_err(|e| self.comm_error(e))?;
        if spread[0] != -spread[2] || spread[1] != -spread[3] {
            return Err(RlfError::Protocol {
                component: "learner communicator",
                message: format!("the learners' weights differ after SGD step {}", self.steps),
            });
        }
        Ok(())
    }

    fn finish(&mut self, parameters: usize) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        self.buffer.clear();
        self.buffer.resize(parameters, 0.0);
        self.buffer.push(1.0);
        self.comm
            .allreduce(Values::F32(&mut self.buffer), Op::Sum)
            .map_err(|e| self.comm_error(e))
    }
}
