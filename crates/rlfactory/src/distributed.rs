//! Training across processes and machines over [`rlf_comm`]'s communicators (EXARL's structure, issue 17).
//!
//! [`AllreduceGradients`]: several learners of one policy, each on its own data, average every SGD step's
//! gradients over the learner communicator (a sum by `allreduce`, which leaves the same bits on every rank, divided
//! by the number of learners), so that their weights stay bit-identical.

use rlf_comm::{Comm, Op, Values};

use crate::algo::adam::GradientSync;
use crate::error::{Result, RlfError};

/// Averages gradients over a communicator of learners.
pub struct AllreduceGradients {
    comm: Box<dyn Comm>,
}

impl std::fmt::Debug for AllreduceGradients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllreduceGradients")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .finish()
    }
}

impl AllreduceGradients {
    /// Averages over `comm`, the policy's learner communicator.
    pub fn new(comm: Box<dyn Comm>) -> Self {
        Self { comm }
    }
}

impl GradientSync for AllreduceGradients {
    fn average(&mut self, grads: &mut [f32]) -> Result<()> {
        self.comm
            .allreduce(Values::F32(grads), Op::Sum)
            .map_err(|e| RlfError::Protocol {
                component: "learner communicator",
                message: e.to_string(),
            })?;
        let n = self.comm.size() as f32;
        grads.iter_mut().for_each(|g| *g /= n);
        Ok(())
    }
}
