//! Several learners of one policy, each on its own data, average every SGD step's gradients over the learner
//! communicator (a sum by `allreduce`, which leaves the same bits on every rank, divided by the number of learners),
//! so that their weights stay bit-identical ([`AllreduceGradients`], Adam's [`GradientSync`] over MPI).

use rlf_comm::{Comm, Op, Values};

use super::adam::GradientSync;
use crate::error::{Result, RlfError};

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
