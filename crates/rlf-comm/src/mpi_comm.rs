//! The MPI flavour (cargo feature `mpi`): [`Comm`] over the system's MPI through rsmpi, as EXARL's `ExaSimple` is over
//! mpi4py. Messages are byte vectors (a receive probes for the size first); a broadcast or gather of bytes sends the
//! sizes first; `allreduce` reduces to rank 0 and broadcasts the result, so every rank holds the same bits whatever
//! algorithm the library picks for a plain `MPI_Allreduce`.

use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::PartitionMut;
use mpi::environment::Threading;
use mpi::point_to_point::{Destination, Source as MpiSource};
use mpi::topology::{Color, Communicator, Group, SimpleCommunicator};
use mpi::Count;

use std::rc::Rc;

use crate::{
    check_rank, check_split, check_subgroup, check_tag, Comm, CommError, Op, Received, Result, Source, Tag,
    Values,
};

/// MPI, started; it is finalised when this and every communicator made from it are dropped.
pub struct MpiUniverse {
    universe: Rc<mpi::environment::Universe>,
    /// Started with `MPI_THREAD_MULTIPLE` ([`MpiUniverse::init_threaded`]).
    threaded: bool,
}

impl std::fmt::Debug for MpiUniverse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiUniverse").finish_non_exhaustive()
    }
}

impl MpiUniverse {
    /// Starts MPI (once per process).
    pub fn init() -> Result<Self> {
        mpi::initialize()
            .map(|universe| Self {
                universe: Rc::new(universe),
                threaded: false,
            })
            .ok_or_else(|| CommError::Mpi("MPI was already started in this process".into()))
    }

    /// Starts MPI (once per process) for calls from several threads at once (`MPI_THREAD_MULTIPLE`): a workflow's
    /// sending and receiving threads reach the world communicator through [`MpiUniverse::thread_world`]. An MPI
    /// library that cannot is an error.
    pub fn init_threaded() -> Result<Self> {
        let (universe, level) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| CommError::Mpi("MPI was already started in this process".into()))?;
        if level != Threading::Multiple {
            return Err(CommError::Mpi(format!(
                "this MPI library supports threads only as {level:?}, not as Multiple (MPI_THREAD_MULTIPLE)"
            )));
        }
        Ok(Self {
            universe: Rc::new(universe),
            threaded: true,
        })
    }

    /// What another thread of this process reaches the world communicator with (MPI started by
    /// [`MpiUniverse::init_threaded`]). This universe must outlive every use of it: join those threads first.
    pub fn thread_world(&self) -> Result<MpiThreadWorld> {
        if self.threaded {
            Ok(MpiThreadWorld { _private: () })
        } else {
            Err(CommError::Mpi(
                "MPI was started for one thread (MpiUniverse::init_threaded starts it for several)".into(),
            ))
        }
    }

    /// Leaves MPI without finalising it, for a process about to exit while its launcher tears the job down: OpenMPI's
    /// `mpirun`, once asked to stop, sleeps through its kill sequence (SIGCONT, a pause, SIGTERM, a pause, SIGKILL)
    /// and answers no `MPI_Finalize` until the SIGKILL. Communicators made from this universe may still be dropped.
    pub fn leave_unfinalized(self) {
        std::mem::forget(self.universe);
    }

    /// The world communicator.
    pub fn world(&self) -> MpiComm {
        MpiComm {
            comm: self.universe.world(),
            _universe: Some(self.universe.clone()),
        }
    }
}

/// The world communicator for another thread of a process that started MPI with `MPI_THREAD_MULTIPLE` (made by
/// [`MpiUniverse::thread_world`]; it can be sent to a thread, which then makes its own [`MpiComm`]).
#[derive(Debug, Clone)]
pub struct MpiThreadWorld {
    _private: (),
}

impl MpiThreadWorld {
    /// The world communicator, for this thread.
    pub fn world(&self) -> MpiComm {
        MpiComm {
            comm: SimpleCommunicator::world(),
            _universe: None,
        }
    }
}

/// A communicator of the system's MPI. It keeps MPI started while it lives.
pub struct MpiComm {
    comm: SimpleCommunicator,
    /// Keeps MPI started (none for a thread's world: the universe's owner outlives it).
    _universe: Option<Rc<mpi::environment::Universe>>,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .finish()
    }
}

fn system_op(op: Op) -> SystemOperation {
    match op {
        Op::Sum => SystemOperation::sum(),
        Op::Max => SystemOperation::max(),
        Op::Min => SystemOperation::min(),
    }
}

impl MpiComm {
    fn checked(&self, rank: usize) -> Result<i32> {
        check_rank(rank, self.size())?;
        Ok(rank as i32)
    }

    /// Ends every rank of the job with `code` (`MPI_Abort`): what a rank that cannot go on does, so that the others
    /// are not left waiting in a collective.
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn send(&self, dest: usize, tag: Tag, bytes: &[u8]) -> Result<()> {
        check_tag(tag)?;
        let dest = self.checked(dest)?;
        self.comm
            .process_at_rank(dest)
            .send_with_tag(bytes, i32::from(tag));
        Ok(())
    }

    fn recv(&self, source: Source, tag: Tag) -> Result<Received> {
        check_tag(tag)?;
        let (bytes, status) = match source {
            Source::Rank(r) => {
                let r = self.checked(r)?;
                self.comm
                    .process_at_rank(r)
                    .receive_vec_with_tag::<u8>(i32::from(tag))
            }
            Source::Any => self.comm.any_process().receive_vec_with_tag::<u8>(i32::from(tag)),
        };
        Ok(Received {
            from: status.source_rank() as usize,
            bytes,
        })
    }

    fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        let root = self.comm.process_at_rank(self.checked(root)?);
        let mut len = bytes.len() as u64;
        root.broadcast_into(&mut len);
        bytes.resize(len as usize, 0);
        root.broadcast_into(&mut bytes[..]);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.comm.barrier();
        Ok(())
    }

    fn reduce(&self, root: usize, values: Values<'_>, op: Op) -> Result<()> {
        let root_rank = self.checked(root)?;
        let process = self.comm.process_at_rank(root_rank);
        let mine = self.rank() == root;
        match values {
            Values::F32(v) => {
                if mine {
                    let send = v.to_vec();
                    process.reduce_into_root(&send[..], v, system_op(op));
                } else {
                    process.reduce_into(&v[..], system_op(op));
                }
            }
            Values::F64(v) => {
                if mine {
                    let send = v.to_vec();
                    process.reduce_into_root(&send[..], v, system_op(op));
                } else {
                    process.reduce_into(&v[..], system_op(op));
                }
            }
        }
        Ok(())
    }

    fn allreduce(&self, values: Values<'_>, op: Op) -> Result<()> {
        let root = self.comm.process_at_rank(0);
        match values {
            Values::F32(v) => {
                self.reduce(0, Values::F32(v), op)?;
                root.broadcast_into(v);
            }
            Values::F64(v) => {
                self.reduce(0, Values::F64(v), op)?;
                root.broadcast_into(v);
            }
        }
        Ok(())
    }

    fn gather(&self, root: usize, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        let process = self.comm.process_at_rank(self.checked(root)?);
        let len = bytes.len() as Count;
        if self.rank() != root {
            process.gather_into(&len);
            process.gather_varcount_into(bytes);
            return Ok(None);
        }
        let mut counts = vec![0 as Count; self.size()];
        process.gather_into_root(&len, &mut counts[..]);
        let displs: Vec<Count> = counts
            .iter()
            .scan(0, |at, &c| {
                let start = *at;
                *at += c;
                Some(start)
            })
            .collect();
        let total: Count = counts.iter().sum();
        let mut all = vec![0u8; total as usize];
        {
            let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            process.gather_varcount_into_root(bytes, &mut partition);
        }
        Ok(Some(
            counts
                .iter()
                .zip(&displs)
                .map(|(&c, &d)| all[d as usize..(d + c) as usize].to_vec())
                .collect(),
        ))
    }

    fn time(&self) -> f64 {
        mpi::time()
    }

    fn split(&self, color: Option<u32>, key: usize) -> Result<Option<Box<dyn Comm>>> {
        let (color, key) = check_split(color, key)?;
        let color = color.map_or_else(Color::undefined, Color::with_value);
        Ok(self.comm.split_by_color_with_key(color, key).map(|comm| {
            Box::new(MpiComm {
                comm,
                _universe: self._universe.clone(),
            }) as Box<dyn Comm>
        }))
    }

    fn subgroup(&self, members: &[usize], tag: Tag) -> Result<Box<dyn Comm>> {
        check_subgroup(members, tag, self.rank(), self.size())?;
        let ranks: Vec<mpi::Rank> = members.iter().map(|&m| m as mpi::Rank).collect();
        let group = self.comm.group().include(&ranks);
        let comm = self
            .comm
            .split_by_subgroup_with_tag(&group, mpi::Tag::from(tag))
            .ok_or_else(|| CommError::Mpi(format!("MPI made no communicator of the subgroup {members:?}")))?;
        Ok(Box::new(MpiComm {
            comm,
            _universe: self._universe.clone(),
        }))
    }
}
