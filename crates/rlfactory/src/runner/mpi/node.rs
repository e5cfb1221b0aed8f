//! The workflow's messages between ranks of one machine, through shared memory ([`NodeLinks`]) rather than MPI.
//!
//! A rank's sending and receiving threads block in MPI while they wait, and OpenMPI waits by polling: on a machine
//! whose cores the ranks' workers need, every waiting thread takes CPU from them, and a message above the eager
//! limit waits, polling, for its receiver. When every rank of the job can open the others' queues (they share one
//! machine), the link's messages go instead through one [`rlf_shm::Queue`] per ordered pair of ranks: a put copies
//! the message into the receiver's ring and returns (waiting only while the ring is full), and a waiting reader
//! sleeps on a futex. Everything else (collectives, the env groups' subgroups, messages with other tags) stays on MPI.
//!
//! - **Setup** ([`NodeLinks::connect`], a collective): each rank creates its incoming queues (one per other rank), rank
//!   0 gathers every rank's handles and broadcasts them, each rank opens its outgoing queues, and an all-reduce of
//!   "everything opened" decides for every rank alike: shared memory, or MPI for all (ranks on several machines).
//!   Then each rank removes its queues' names: nothing can be left in `/dev/shm`, however the ranks end.
//! - **Sending**: a message is a header (its tag, and whether more parts follow) and the bytes, put as one pair;
//!   one larger than a quarter of the ring goes in parts, in order (a queue has one producer: a lock per destination
//!   keeps a rank's threads from interleaving parts).
//! - **Receiving**: the one thread of the rank that receives the diverted tags reassembles the messages; a message
//!   that does not match its source or tag waits in order for the receive that does. With one incoming queue (two
//!   ranks) that thread reads the queue itself, and a message wakes it straight from the sender's put; with several,
//!   a thread per queue reads it and passes the messages on, with their sender, since one thread cannot sleep on
//!   several queues at once. A rank stopped in the middle of a put holds only its own queue.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rlf_comm::{Comm, CommError, Op, Received, Source, Tag, Values, WorldMaker};
use rlf_shm::{GetError, PutError, Queue, QueueConfig, QueueHandle};

/// Each incoming queue's ring: about 220 CartPole trajectories, or a few Atari ones. Only the bytes in flight are
/// ever touched, so the memory a run uses is what its queues held at most.
const RING_BYTES: usize = 32 << 20;
/// The largest part a message is put in.
const PART_BYTES: usize = RING_BYTES / 4;
/// A part's header: the tag (little-endian) and whether it is the message's last part.
const HEADER_BYTES: usize = 3;

/// A message received from shared memory: the sender's world rank, its tag, its bytes.
type Mail = (usize, Tag, Vec<u8>);

/// Where the rank's receiving thread takes messages from.
enum Arrivals {
    /// The one incoming queue, from rank `from`, read by the receiving thread itself.
    Direct {
        from: usize,
        queue: Arc<Queue>,
        parts: Parts,
    },
    /// Several queues, each read by a thread of its own ([`read`]).
    Merged(Receiver<Mail>),
}

impl Arrivals {
    /// The next whole message, waiting as long as it takes; `None` once no message can come.
    fn next(&mut self) -> Option<Mail> {
        match self {
            Arrivals::Direct { from, queue, parts } => loop {
                match parts.take(*from, queue) {
                    Part::Last(tag, bytes) => return Some((*from, tag, bytes)),
                    Part::More => {}
                    Part::End => return None,
                }
            },
            Arrivals::Merged(arrivals) => arrivals.recv().ok(),
        }
    }
}

/// What the rank's receiving thread takes messages from.
struct Inbox {
    arrivals: Arrivals,
    /// Messages that arrived before the receive they match.
    waiting: VecDeque<Mail>,
}

/// What [`Parts::take`] took.
enum Part {
    /// A message's last part: the message's tag and its bytes.
    Last(Tag, Vec<u8>),
    /// A part with more to follow.
    More,
    /// No part can come: the queue is closed and drained (or a part's header is malformed: said on stderr).
    End,
}

/// The parts of a message from one queue, joined: the buffers a queue's reader keeps between its gets.
#[derive(Default)]
struct Parts {
    header: Vec<u8>,
    part: Vec<u8>,
    message: Vec<u8>,
}

impl Parts {
    /// Takes the next part from `from`'s `queue`, waiting as long as it takes.
    fn take(&mut self, from: usize, queue: &Queue) -> Part {
        let got = queue
            .get_into(&mut self.header)
            .and_then(|_| queue.get_into(&mut self.part));
        match got {
            Ok(_) => {}
            Err(GetError::Closed | GetError::Empty | GetError::Timeout) => return Part::End,
        }
        let [lo, hi, last] = self.header[..] else {
            eprintln!(
                "[rlfactory] a shared-memory message from rank {from} has a {}-byte header",
                self.header.len()
            );
            return Part::End;
        };
        self.message.extend_from_slice(&self.part);
        if last == 1 {
            Part::Last(Tag::from_le_bytes([lo, hi]), std::mem::take(&mut self.message))
        } else {
            Part::More
        }
    }
}

/// The shared-memory queues of one rank: to every other rank, and from every other rank (read by threads of their
/// own). Made by [`NodeLinks::connect`]; [`NodeMaker`] hands the link's threads communicators that use it.
pub(crate) struct NodeLinks {
    rank: usize,
    /// The tags that go through shared memory.
    tags: Vec<Tag>,
    /// The queue to each other rank (`None` at this rank's own index), with the lock its parts go out under.
    outgoing: Vec<Option<(Queue, Mutex<()>)>>,
    /// This rank's incoming queues: one read by the receiving thread, or several each read by a thread of its own.
    incoming: Vec<Arc<Queue>>,
    readers: Mutex<Vec<JoinHandle<()>>>,
    inbox: Mutex<Inbox>,
}

impl std::fmt::Debug for NodeLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLinks")
            .field("rank", &self.rank)
            .field("tags", &self.tags)
            .finish_non_exhaustive()
    }
}

fn shm_error(e: impl std::fmt::Display) -> CommError {
    CommError::Closed(format!("shared-memory link: {e}"))
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, CommError> {
    postcard::from_bytes(bytes).map_err(|e| CommError::Mismatch {
        what: "shared-memory link setup",
        message: format!("{what} do not decode: {e}"),
    })
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, CommError> {
    postcard::to_stdvec(value).map_err(|e| CommError::Argument(format!("shared-memory link setup: {e}")))
}

impl NodeLinks {
    /// Makes the queues between every pair of `world`'s ranks for messages with `tags` (a collective: every rank
    /// calls it). `None` on every rank when some rank cannot create or open them: the ranks are not all on one
    /// machine (or share no `/dev/shm`), and every message goes through MPI.
    pub(crate) fn connect(world: &dyn Comm, tags: &[Tag]) -> Result<Option<Arc<NodeLinks>>, CommError> {
        let (rank, size) = (world.rank(), world.size());
        let config = QueueConfig {
            max_bytes: RING_BYTES,
            ..QueueConfig::default()
        };
        // From each other rank, a queue of this rank's.
        let created: Result<Vec<Option<Queue>>, _> = (0..size)
            .map(|from| (from != rank).then(|| Queue::create(config)).transpose())
            .collect();
        let mut ok = created.is_ok();
        let mut incoming = created.unwrap_or_default();
        let handles: Vec<Option<QueueHandle>> =
            incoming.iter().map(|q| q.as_ref().map(Queue::handle)).collect();
        // Every rank's handles, on every rank.
        let gathered = world.gather(0, &encode(&handles)?)?;
        let mut table = match gathered {
            Some(all) => encode(&all)?,
            None => Vec::new(),
        };
        world.bcast(0, &mut table)?;
        let table: Vec<Vec<u8>> = decode(&table, "the ranks' queue handles")?;
        let mut outgoing = Vec::with_capacity(size);
        for (to, theirs) in table.iter().enumerate() {
            if to == rank || !ok {
                outgoing.push(None);
                continue;
            }
            let theirs: Vec<Option<QueueHandle>> = decode(theirs, "a rank's queue handles")?;
            match theirs.get(rank).cloned().flatten().map(|h| Queue::open(&h)) {
                Some(Ok(queue)) => outgoing.push(Some((queue, Mutex::new(())))),
                _ => {
                    ok = false;
                    outgoing.push(None);
                }
            }
        }
        let mut everyone = [if ok { 1.0 } else { 0.0 }];
        world.allreduce(Values::F64(&mut everyone), Op::Min)?;
        if everyone[0] < 1.0 {
            return Ok(None);
        }
        // Every rank has opened what it sends into: the names can go.
        for queue in incoming.iter_mut().flatten() {
            queue.unlink().map_err(shm_error)?;
        }
        let incoming: Vec<(usize, Arc<Queue>)> = incoming
            .into_iter()
            .enumerate()
            .filter_map(|(from, q)| q.map(|q| (from, Arc::new(q))))
            .collect();
        let mut readers = Vec::new();
        let arrivals = match &incoming[..] {
            [(from, queue)] => Arrivals::Direct {
                from: *from,
                queue: Arc::clone(queue),
                parts: Parts::default(),
            },
            several => {
                let (arrivals_in, arrivals) = mpsc::channel();
                for (from, queue) in several {
                    let (from, queue, to) = (*from, Arc::clone(queue), arrivals_in.clone());
                    let reader = std::thread::Builder::new()
                        .name(format!("shm_from_{from}"))
                        .spawn(move || read(from, &queue, &to))
                        .map_err(|e| shm_error(format!("cannot start a reading thread: {e}")))?;
                    readers.push(reader);
                }
                Arrivals::Merged(arrivals)
            }
        };
        Ok(Some(Arc::new(NodeLinks {
            rank,
            tags: tags.to_vec(),
            outgoing,
            incoming: incoming.into_iter().map(|(_, q)| q).collect(),
            readers: Mutex::new(readers),
            inbox: Mutex::new(Inbox {
                arrivals,
                waiting: VecDeque::new(),
            }),
        })))
    }

    fn diverts(&self, peer: usize, tag: Tag) -> bool {
        peer != self.rank && self.tags.contains(&tag)
    }

    fn send(&self, dest: usize, tag: Tag, bytes: &[u8]) -> Result<(), CommError> {
        let Some(Some((queue, lock))) = self.outgoing.get(dest) else {
            return Err(CommError::NoSuchRank {
                rank: dest,
                size: self.outgoing.len(),
            });
        };
        let _parts_in_order = lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut parts = bytes.chunks(PART_BYTES);
        // An empty message is one empty part.
        let mut next = Some(parts.next().unwrap_or(&[]));
        while let Some(part) = next {
            next = parts.next();
            let [lo, hi] = tag.to_le_bytes();
            let header: [u8; HEADER_BYTES] = [lo, hi, u8::from(next.is_none())];
            queue.put_many(&[&header[..], part]).map_err(|e| match e {
                PutError::Closed => CommError::Closed(format!("rank {dest} no longer receives")),
                e => shm_error(e),
            })?;
        }
        Ok(())
    }

    fn recv(&self, source: Source, tag: Tag) -> Result<Received, CommError> {
        let matches = |(from, t, _): &Mail| *t == tag && accepts(source, *from);
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = inbox.waiting.iter().position(matches) {
            let (from, _, bytes) = inbox
                .waiting
                .remove(at)
                .expect("the position is inside the queue");
            return Ok(Received { from, bytes });
        }
        loop {
            let mail = inbox
                .arrivals
                .next()
                .ok_or_else(|| CommError::Closed("every rank's queue to this one is closed".into()))?;
            if matches(&mail) {
                return Ok(Received {
                    from: mail.0,
                    bytes: mail.2,
                });
            }
            inbox.waiting.push_back(mail);
        }
    }

    /// Closes this rank's incoming queues and waits for their reading threads, if any (a peer's put then fails). For the end
    /// of a rank, once every peer's last message is in: a close takes each queue's lock, which a peer stopped in the
    /// middle of a put would hold.
    pub(crate) fn close(&self) {
        for queue in &self.incoming {
            queue.close();
        }
        let readers = std::mem::take(&mut *self.readers.lock().unwrap_or_else(|p| p.into_inner()));
        for reader in readers {
            let _ = reader.join();
        }
    }
}

/// Whether a receive from `source` takes a message from rank `from`.
fn accepts(source: Source, from: usize) -> bool {
    match source {
        Source::Any => true,
        Source::Rank(r) => r == from,
    }
}

/// Reads `from`'s queue until it is closed: each message's parts joined, passed on with the sender and the tag.
fn read(from: usize, queue: &Queue, to: &Sender<Mail>) {
    let mut parts = Parts::default();
    loop {
        match parts.take(from, queue) {
            Part::Last(tag, bytes) => {
                if to.send((from, tag, bytes)).is_err() {
                    return;
                }
            }
            Part::More => {}
            Part::End => return,
        }
    }
}

/// The communicator of a thread of a rank with [`NodeLinks`]: the diverted tags' point-to-point messages through
/// shared memory, everything else through `inner` (MPI's).
struct NodeComm {
    inner: Box<dyn Comm>,
    links: Arc<NodeLinks>,
}

impl Comm for NodeComm {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn send(&self, dest: usize, tag: Tag, bytes: &[u8]) -> rlf_comm::Result<()> {
        if self.links.diverts(dest, tag) {
            self.links.send(dest, tag, bytes)
        } else {
            self.inner.send(dest, tag, bytes)
        }
    }

    fn recv(&self, source: Source, tag: Tag) -> rlf_comm::Result<Received> {
        if self.links.tags.contains(&tag) {
            self.links.recv(source, tag)
        } else {
            self.inner.recv(source, tag)
        }
    }

    fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> rlf_comm::Result<()> {
        self.inner.bcast(root, bytes)
    }

    fn barrier(&self) -> rlf_comm::Result<()> {
        self.inner.barrier()
    }

    fn reduce(&self, root: usize, values: Values<'_>, op: Op) -> rlf_comm::Result<()> {
        self.inner.reduce(root, values, op)
    }

    fn allreduce(&self, values: Values<'_>, op: Op) -> rlf_comm::Result<()> {
        self.inner.allreduce(values, op)
    }

    fn gather(&self, root: usize, bytes: &[u8]) -> rlf_comm::Result<Option<Vec<Vec<u8>>>> {
        self.inner.gather(root, bytes)
    }

    fn time(&self) -> f64 {
        self.inner.time()
    }

    fn split(&self, color: Option<u32>, key: usize) -> rlf_comm::Result<Option<Box<dyn Comm>>> {
        self.inner.split(color, key)
    }

    fn subgroup(&self, members: &[usize], tag: Tag) -> rlf_comm::Result<Box<dyn Comm>> {
        self.inner.subgroup(members, tag)
    }
}

/// A [`WorldMaker`] whose world communicators send the [`NodeLinks`]' tags through shared memory.
pub(crate) struct NodeMaker {
    pub(crate) inner: Arc<dyn WorldMaker>,
    pub(crate) links: Arc<NodeLinks>,
}

impl WorldMaker for NodeMaker {
    fn world(&self) -> Box<dyn Comm> {
        Box::new(NodeComm {
            inner: self.inner.world(),
            links: Arc::clone(&self.links),
        })
    }

    fn abort(&self, code: i32) -> ! {
        self.inner.abort(code)
    }

    fn carrier(&self) -> &'static str {
        "shared memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlf_comm::LocalWorld;

    /// A local world's ranks as threads, each with its links for tags 1 and 2; `f` runs on every rank with the
    /// rank's communicator (the links over the local world) and its links.
    fn on_ranks<T: Send + 'static>(
        size: usize,
        f: impl Fn(&dyn Comm, &NodeLinks) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let threads: Vec<_> = LocalWorld::create(size)
            .into_iter()
            .map(|world| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || {
                    let links = NodeLinks::connect(&world, &[1, 2])
                        .expect("connect")
                        .expect("threads of one process share /dev/shm");
                    let comm = NodeComm {
                        inner: Box::new(world),
                        links: Arc::clone(&links),
                    };
                    let out = f(&comm, &links);
                    comm.barrier().expect("barrier");
                    links.close();
                    out
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank panicked"))
            .collect()
    }

    #[test]
    fn messages_between_two_ranks_arrive_whole_and_in_order_and_leave_no_segment() {
        let big: Vec<u8> = (0..PART_BYTES * 2 + 17).map(|i| (i % 251) as u8).collect();
        let expected = big.clone();
        let got = on_ranks(2, move |comm, links| {
            let named = links
                .incoming
                .iter()
                .filter(|q| std::path::Path::new(&format!("/dev/shm{}", q.handle().region.name)).exists())
                .count();
            let received = if comm.rank() == 0 {
                comm.send(1, 1, b"first").expect("send");
                comm.send(1, 1, &big).expect("send a message of three parts");
                comm.send(1, 1, &[]).expect("send an empty message");
                Vec::new()
            } else {
                (0..3)
                    .map(|_| comm.recv(Source::Rank(0), 1).expect("recv"))
                    .collect()
            };
            let readers = links.readers.lock().expect("readers").len();
            (links.incoming.len(), named, readers, received)
        });
        for (queues, named, readers, _) in &got {
            assert_eq!(
                (*queues, *named, *readers),
                (1, 0, 0),
                "one queue from the other rank, its name removed at setup, read by the receiving thread itself"
            );
        }
        let received = &got[1].3;
        assert_eq!(received[0].bytes, b"first");
        assert_eq!(received[1].bytes, expected, "the parts are joined in order");
        assert!(received[2].bytes.is_empty());
        assert!(received.iter().all(|r| r.from == 0));
    }

    #[test]
    fn a_receive_takes_its_own_tag_and_source_and_others_wait_for_theirs() {
        fn on_rank(comm: &dyn Comm) -> Vec<(usize, Vec<u8>)> {
            match comm.rank() {
                0 => {
                    let a = comm.recv(Source::Rank(1), 2).expect("recv");
                    let b = comm.recv(Source::Any, 1).expect("recv");
                    let c = comm.recv(Source::Any, 1).expect("recv");
                    vec![(a.from, a.bytes), (b.from, b.bytes), (c.from, c.bytes)]
                }
                1 => {
                    comm.send(0, 1, b"one from 1").expect("send");
                    comm.send(0, 2, b"two from 1").expect("send");
                    Vec::new()
                }
                _ => {
                    comm.send(0, 1, b"one from 2").expect("send");
                    Vec::new()
                }
            }
        }
        let got = on_ranks(3, |comm, links| {
            let readers = links.readers.lock().expect("readers").len();
            (readers, on_rank(comm))
        });
        assert!(
            got.iter().all(|(readers, _)| *readers == 2),
            "with two incoming queues, a reading thread for each"
        );
        let rank0 = &got[0].1;
        assert_eq!(
            rank0[0],
            (1, b"two from 1".to_vec()),
            "tag 2 is taken past rank 1's tag 1 sent before it"
        );
        let mut ones = vec![rank0[1].clone(), rank0[2].clone()];
        ones.sort();
        assert_eq!(
            ones,
            vec![(1, b"one from 1".to_vec()), (2, b"one from 2".to_vec())]
        );
    }

    #[test]
    fn other_tags_and_collectives_go_through_the_inner_communicator() {
        let got = on_ranks(2, |comm, links| {
            if comm.rank() == 0 {
                comm.send(1, 7, b"by the local world").expect("send");
            }
            let mut sum = [comm.rank() as f64 + 1.0];
            comm.allreduce(Values::F64(&mut sum), Op::Sum).expect("allreduce");
            let received = (comm.rank() == 1).then(|| comm.recv(Source::Rank(0), 7).expect("recv").bytes);
            let nothing_by_shm = links.incoming.iter().all(|q| q.is_empty());
            (sum[0], received, nothing_by_shm)
        });
        assert_eq!(got[0].0, 3.0);
        assert_eq!(got[1].1.as_deref(), Some(&b"by the local world"[..]));
        assert!(got[1].2, "tag 7 did not go through shared memory");
    }

    #[test]
    fn a_send_to_a_rank_that_closed_its_queues_fails() {
        let got = on_ranks(2, |comm, links| {
            if comm.rank() == 1 {
                links.close();
                comm.send(0, 9, b"closed").expect("send");
                return None;
            }
            comm.recv(Source::Rank(1), 9).expect("rank 1 says it closed");
            Some(comm.send(1, 1, b"too late"))
        });
        assert!(matches!(got[0], Some(Err(CommError::Closed(_)))), "{:?}", got[0]);
    }
}
