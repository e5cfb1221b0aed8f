//! The local flavour: the ranks of a world are threads of one process. Each rank has a mailbox (a mutex-guarded
//! queue and a condition variable); a message carries its communicator's context, its sender's world rank and its
//! tag, and a receive takes the first one that matches, so messages between two ranks arrive in the order sent. The
//! collectives are point-to-point messages with reserved tags through rank 0 (or the root), combined in rank order,
//! so an `allreduce` gives the same bits on every rank. A rank whose world communicator is dropped is gone: a receive
//! that could only be answered by ranks that are all gone fails instead of waiting for ever.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crate::{
    check_rank, check_split, check_subgroup, check_tag, Comm, CommError, Op, Received, Result, Source, Tag,
    Values, RESERVED_TAGS,
};

const TAG_BCAST: Tag = RESERVED_TAGS;
const TAG_GATHER: Tag = RESERVED_TAGS + 1;
const TAG_SPLIT: Tag = RESERVED_TAGS + 2;

struct Mail {
    context: u64,
    from: usize,
    tag: Tag,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct Mailbox {
    queue: Mutex<VecDeque<Mail>>,
    ready: Condvar,
}

struct Shared {
    boxes: Vec<Mailbox>,
    gone: Vec<AtomicBool>,
    next_context: AtomicU64,
    start: Instant,
}

/// Makes the ranks of a local world.
#[derive(Debug)]
pub struct LocalWorld;

impl LocalWorld {
    /// A world of `size` ranks: the communicator of each, to be moved into its thread.
    pub fn create(size: usize) -> Vec<LocalComm> {
        let shared = Arc::new(Shared {
            boxes: (0..size).map(|_| Mailbox::default()).collect(),
            gone: (0..size).map(|_| AtomicBool::new(false)).collect(),
            next_context: AtomicU64::new(1),
            start: Instant::now(),
        });
        (0..size)
            .map(|rank| LocalComm {
                shared: shared.clone(),
                context: 0,
                members: (0..size).collect(),
                rank,
                world: true,
            })
            .collect()
    }
}

/// One rank's communicator in a local world (or in a communicator split from it).
pub struct LocalComm {
    shared: Arc<Shared>,
    context: u64,
    /// The world rank of each rank.
    members: Vec<usize>,
    rank: usize,
    /// The world communicator: dropping it means the rank is gone.
    world: bool,
}

impl std::fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalComm")
            .field("context", &self.context)
            .field("rank", &self.rank)
            .field("members", &self.members)
            .finish()
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        if self.world {
            self.shared.gone[self.members[self.rank]].store(true, Ordering::SeqCst);
            for mailbox in &self.shared.boxes {
                let _queue = mailbox.queue.lock().unwrap_or_else(|p| p.into_inner());
                mailbox.ready.notify_all();
            }
        }
    }
}

impl LocalComm {
    fn post(&self, dest: usize, tag: Tag, bytes: Vec<u8>) -> Result<()> {
        self.post_in(self.context, dest, tag, bytes)
    }

    /// Posts in `context` (this communicator's, or the one its subgroups are made in).
    fn post_in(&self, context: u64, dest: usize, tag: Tag, bytes: Vec<u8>) -> Result<()> {
        check_rank(dest, self.members.len())?;
        let mailbox = &self.shared.boxes[self.members[dest]];
        let mut queue = mailbox.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.push_back(Mail {
            context,
            from: self.members[self.rank],
            tag,
            bytes,
        });
        mailbox.ready.notify_all();
        Ok(())
    }

    fn take(&self, source: Source, tag: Tag) -> Result<Received> {
        self.take_in(self.context, source, tag)
    }

    /// Takes from `context` (see [`LocalComm::post_in`]).
    fn take_in(&self, context: u64, source: Source, tag: Tag) -> Result<Received> {
        let from = match source {
            Source::Rank(r) => {
                check_rank(r, self.members.len())?;
                Some(self.members[r])
            }
            Source::Any => None,
        };
        let mailbox = &self.shared.boxes[self.members[self.rank]];
        let mut queue = mailbox.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let found = queue
                .iter()
                .position(|m| m.context == context && m.tag == tag && from.is_none_or(|f| m.from == f));
            if let Some(at) = found {
                let mail = queue.remove(at).expect("the position just found");
                let rank = self.members.iter().position(|&w| w == mail.from).unwrap_or(0);
                return Ok(Received {
                    from: rank,
                    bytes: mail.bytes,
                });
            }
            let me = self.members[self.rank];
            let gone = |w: usize| self.shared.gone[w].load(Ordering::SeqCst);
            let hopeless = match from {
                Some(f) => gone(f),
                None => self.members.iter().all(|&w| w == me || gone(w)),
            };
            if hopeless {
                return Err(CommError::Closed(format!(
                    "rank {} waits for tag {tag} from {source:?}, and the ranks that could send it are gone",
                    self.rank
                )));
            }
            queue = mailbox.ready.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn to_bytes(values: &Values<'_>) -> Vec<u8> {
    match values {
        Values::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Values::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// Combines `bytes` (another rank's values, as [`to_bytes`] wrote them) into `values`.
fn combine(values: &mut Values<'_>, bytes: &[u8], op: Op) -> Result<()> {
    let mismatch = |width: usize, len: usize| CommError::Mismatch {
        what: "reduce",
        message: format!(
            "{} bytes from a rank, {len} values of {width} bytes here",
            bytes.len()
        ),
    };
    match values {
        Values::F32(v) => {
            if bytes.len() != v.len() * 4 {
                return Err(mismatch(4, v.len()));
            }
            for (x, b) in v.iter_mut().zip(bytes.chunks_exact(4)) {
                *x = op.apply_f32(*x, f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
        }
        Values::F64(v) => {
            if bytes.len() != v.len() * 8 {
                return Err(mismatch(8, v.len()));
            }
            for (x, b) in v.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut w = [0; 8];
                w.copy_from_slice(b);
                *x = op.apply_f64(*x, f64::from_le_bytes(w));
            }
        }
    }
    Ok(())
}

/// Replaces `values` with `bytes` (values as [`to_bytes`] wrote them), bit for bit.
fn overwrite(values: &mut Values<'_>, bytes: &[u8]) -> Result<()> {
    let width = match values {
        Values::F32(_) => 4,
        Values::F64(_) => 8,
    };
    if bytes.len() != values.len() * width {
        return Err(CommError::Mismatch {
            what: "reduce",
            message: format!(
                "{} bytes for {} values of {width} bytes",
                bytes.len(),
                values.len()
            ),
        });
    }
    match values {
        Values::F32(v) => {
            for (x, b) in v.iter_mut().zip(bytes.chunks_exact(4)) {
                *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Values::F64(v) => {
            for (x, b) in v.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut w = [0; 8];
                w.copy_from_slice(b);
                *x = f64::from_le_bytes(w);
            }
        }
    }
    Ok(())
}

impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn send(&self, dest: usize, tag: Tag, bytes: &[u8]) -> Result<()> {
        check_tag(tag)?;
        self.post(dest, tag, bytes.to_vec())
    }

    fn recv(&self, source: Source, tag: Tag) -> Result<Received> {
        check_tag(tag)?;
        self.take(source, tag)
    }

    fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        check_rank(root, self.size())?;
        if self.rank == root {
            for dest in (0..self.size()).filter(|&d| d != root) {
                self.post(dest, TAG_BCAST, bytes.clone())?;
            }
        } else {
            *bytes = self.take(Source::Rank(root), TAG_BCAST)?.bytes;
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.gather(0, &[])?;
        self.bcast(0, &mut Vec::new())
    }

    fn reduce(&self, root: usize, mut values: Values<'_>, op: Op) -> Result<()> {
        if let Some(all) = self.gather(root, &to_bytes(&values))? {
            // Every rank's values in rank order, so that the result does not depend on who arrived first.
            overwrite(&mut values, &all[0])?;
            for bytes in &all[1..] {
                combine(&mut values, bytes, op)?;
            }
        }
        Ok(())
    }

    fn allreduce(&self, mut values: Values<'_>, op: Op) -> Result<()> {
        let mut bytes = match &mut values {
            Values::F32(v) => {
                self.reduce(0, Values::F32(v), op)?;
                to_bytes(&Values::F32(v))
            }
            Values::F64(v) => {
                self.reduce(0, Values::F64(v), op)?;
                to_bytes(&Values::F64(v))
            }
        };
        self.bcast(0, &mut bytes)?;
        overwrite(&mut values, &bytes)
    }

    fn gather(&self, root: usize, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        check_rank(root, self.size())?;
        if self.rank != root {
            self.post(root, TAG_GATHER, bytes.to_vec())?;
            return Ok(None);
        }
        let mut all = Vec::with_capacity(self.size());
        for r in 0..self.size() {
            all.push(if r == root {
                bytes.to_vec()
            } else {
                self.take(Source::Rank(r), TAG_GATHER)?.bytes
            });
        }
        Ok(Some(all))
    }

    fn time(&self) -> f64 {
        self.shared.start.elapsed().as_secs_f64()
    }

    fn split(&self, color: Option<u32>, key: usize) -> Result<Option<Box<dyn Comm>>> {
        let (color, key) = check_split(color, key)?;
        // No colour is u32::MAX, above every colour there can be.
        let mine = [
            u64::from(color.map_or(u32::MAX, |c| c as u32)).to_le_bytes(),
            (key as u64).to_le_bytes(),
        ]
        .concat();
        // Rank 0 forms the groups and tells each rank its context and members (world ranks), or nothing.
        let mut answer = Vec::new();
        if let Some(all) = self.gather(0, &mine)? {
            let word = |b: &[u8], i: usize| {
                let mut w = [0; 8];
                w.copy_from_slice(&b[8 * i..8 * i + 8]);
                u64::from_le_bytes(w)
            };
            let mut ranks: Vec<(u64, u64, usize)> = all
                .iter()
                .enumerate()
                .map(|(r, b)| (word(b, 0), word(b, 1), r))
                .collect();
            ranks.sort_unstable();
            let mut answers = vec![Vec::new(); self.size()];
            for group in ranks.chunk_by(|a, b| a.0 == b.0) {
                if group[0].0 == u64::from(u32::MAX) {
                    continue;
                }
                let context = self.shared.next_context.fetch_add(1, Ordering::SeqCst);
                let mut message = context.to_le_bytes().to_vec();
                for &(_, _, r) in group {
                    message.extend((self.members[r] as u64).to_le_bytes());
                }
                for &(_, _, r) in group {
                    answers[r].clone_from(&message);
                }
            }
            for (r, message) in answers.into_iter().enumerate() {
                if r == 0 {
                    answer = message;
                } else {
                    self.post(r, TAG_SPLIT, message)?;
                }
            }
        } else {
            answer = self.take(Source::Rank(0), TAG_SPLIT)?.bytes;
        }
        if answer.is_empty() {
            return Ok(None);
        }
        let words: Vec<u64> = answer
            .chunks_exact(8)
            .map(|b| {
                let mut w = [0; 8];
                w.copy_from_slice(b);
                u64::from_le_bytes(w)
            })
            .collect();
        let members: Vec<usize> = words[1..].iter().map(|&w| w as usize).collect();
        let me = self.members[self.rank];
        let rank = members
            .iter()
            .position(|&w| w == me)
            .ok_or_else(|| CommError::Mismatch {
                what: "split",
                message: format!("world rank {me} is not in the group it was given"),
            })?;
        Ok(Some(Box::new(LocalComm {
            shared: self.shared.clone(),
            context: words[0],
            members,
            rank,
            world: false,
        })))
    }

    fn subgroup(&self, members: &[usize], tag: Tag) -> Result<Box<dyn Comm>> {
        check_subgroup(members, tag, self.rank, self.size())?;
        // The first member draws the context and tells the others, in a context of this communicator's own that no
        // communicator has (contexts are drawn upwards from 1), with the caller's tag.
        let making = u64::MAX - self.context;
        let context = if members[0] == self.rank {
            let context = self.shared.next_context.fetch_add(1, Ordering::SeqCst);
            for &m in &members[1..] {
                self.post_in(making, m, tag, context.to_le_bytes().to_vec())?;
            }
            context
        } else {
            let bytes = self.take_in(making, Source::Rank(members[0]), tag)?.bytes;
            let word: [u8; 8] = bytes.as_slice().try_into().map_err(|_| CommError::Mismatch {
                what: "subgroup",
                message: format!("a context of {} bytes", bytes.len()),
            })?;
            u64::from_le_bytes(word)
        };
        Ok(Box::new(LocalComm {
            shared: self.shared.clone(),
            context,
            members: members.iter().map(|&m| self.members[m]).collect(),
            rank: members.iter().position(|&m| m == self.rank).unwrap_or(0),
            world: false,
        }))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Runs `body` on every rank of a local world of `size`, each in its thread; returns the results by rank.
    pub(crate) fn on_ranks<T: Send + 'static>(
        size: usize,
        body: impl Fn(LocalComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let body = Arc::new(body);
        let threads: Vec<_> = LocalWorld::create(size)
            .into_iter()
            .map(|comm| {
                let body = body.clone();
                std::thread::spawn(move || body(comm))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect()
    }

    /// Point to point in order, from a rank or any; broadcast; gather by rank; sums, maxima and minima in place;
    /// the same bits on every rank after an allreduce of values whose sum depends on the order of the additions.
    #[test]
    fn messages_and_collectives() {
        let out = on_ranks(4, |comm| {
            let r = comm.rank();
            if r != 0 {
                comm.send(0, 8, &[r as u8, 1]).expect("send");
                comm.send(0, 7, &[r as u8, 2]).expect("send");
                comm.send(0, 8, &[r as u8, 3]).expect("send");
            } else {
                let mut from_any = Vec::new();
                for _ in 0..3 {
                    from_any.push(comm.recv(Source::Any, 7).expect("recv").from);
                }
                from_any.sort_unstable();
                assert_eq!(from_any, [1, 2, 3]);
                // Each rank's tag-8 messages, in the order sent.
                for src in 1..4 {
                    for k in [1, 3] {
                        let m = comm.recv(Source::Rank(src), 8).expect("recv");
                        assert_eq!((m.from, m.bytes), (src, vec![src as u8, k]));
                    }
                }
            }
            let mut b = if r == 2 { b"hello".to_vec() } else { Vec::new() };
            comm.bcast(2, &mut b).expect("bcast");
            assert_eq!(b, b"hello");
            let gathered = comm.gather(1, &[r as u8; 2]).expect("gather");
            assert_eq!(gathered.is_some(), r == 1);
            if let Some(g) = gathered {
                assert_eq!(g, [[0, 0], [1, 1], [2, 2], [3, 3]]);
            }
            let mut v = [r as f64, -(r as f64)];
            comm.reduce(3, Values::F64(&mut v), Op::Max).expect("reduce");
            if r == 3 {
                assert_eq!(v, [3.0, 0.0]);
            }
            let mut w = [1e8f32 * (r as f32 - 1.5), 0.1 * r as f32 + 1e-7];
            comm.allreduce(Values::F32(&mut w), Op::Sum).expect("allreduce");
            comm.barrier().expect("barrier");
            w.map(f32::to_bits)
        });
        assert!(out.windows(2).all(|p| p[0] == p[1]), "{out:?}");
    }

    /// Split by colour and key: members ordered by key, a rank without a colour left out, and messages in a split
    /// communicator never reach the parent's receives.
    #[test]
    fn split_orders_by_key_and_keeps_contexts_apart() {
        let out = on_ranks(5, |comm| {
            let r = comm.rank();
            let color = (r != 4).then_some((r % 2) as u32);
            let sub = comm.split(color, 10 - r).expect("split");
            let Some(sub) = sub else {
                assert_eq!(r, 4);
                comm.barrier().expect("barrier");
                comm.barrier().expect("barrier");
                return (r, Vec::new());
            };
            // Keys run backwards: the highest world rank of a colour is rank 0.
            let members: Vec<usize> = sub
                .gather(0, &[r as u8])
                .expect("gather")
                .map(|g| g.iter().map(|b| b[0] as usize).collect())
                .unwrap_or_default();
            if sub.rank() == 0 {
                sub.send(1, 3, b"sub").expect("send");
            }
            comm.barrier().expect("barrier");
            if sub.rank() == 1 {
                // The parent's receive of the same tag from the same rank does not see the sub-communicator's
                // message: it is the parent's own that comes.
                comm.send(r, 3, b"parent").expect("send to self");
                let parent = comm.recv(Source::Any, 3).expect("recv");
                assert_eq!((parent.from, parent.bytes.as_slice()), (r, &b"parent"[..]));
                let m = sub.recv(Source::Rank(0), 3).expect("recv");
                assert_eq!((m.from, m.bytes.as_slice()), (0, &b"sub"[..]));
            }
            comm.barrier().expect("barrier");
            (r, members)
        });
        assert_eq!(out[2].1, [2, 0]);
        assert_eq!(out[3].1, [3, 1]);
    }

    /// Subgroups made by their members alone, two at once between the same ranks (told apart by their tags), in the
    /// members' order; rank 0 takes no part, and a rank outside the members it names is refused.
    #[test]
    fn subgroups_are_made_by_their_members_alone() {
        let out = on_ranks(4, |comm| {
            let r = comm.rank();
            if r == 0 {
                let outside = comm.subgroup(&[1, 2], 3).map(|_| ()).unwrap_err();
                assert!(matches!(outside, CommError::Argument(_)), "{outside}");
                return Vec::new();
            }
            let shared = Arc::new(comm);
            let threads: Vec<_> = [(vec![3, 1, 2], 4u16), (vec![2, 3], 5)]
                .into_iter()
                .filter(|(members, _)| members.contains(&r))
                .map(|(members, tag)| {
                    let comm = Arc::clone(&shared);
                    std::thread::spawn(move || {
                        let sub = comm.subgroup(&members, tag).expect("subgroup");
                        let mut b = if sub.rank() == 0 {
                            vec![tag as u8]
                        } else {
                            Vec::new()
                        };
                        sub.bcast(0, &mut b).expect("bcast");
                        (tag, sub.rank(), sub.size(), b[0])
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("thread")).collect()
        });
        assert_eq!(out[1], [(4, 1, 3, 4)]);
        assert_eq!(out[2], [(4, 2, 3, 4), (5, 0, 2, 5)]);
        assert_eq!(out[3], [(4, 0, 3, 4), (5, 1, 2, 5)]);
    }

    /// A receive that only gone ranks could answer fails instead of waiting for ever (from a rank, and from any
    /// when every other rank is gone); reserved tags and colours MPI cannot take are refused.
    #[test]
    fn a_receive_from_a_gone_rank_fails() {
        let mut ranks = LocalWorld::create(2);
        let second = ranks.pop().expect("rank 1");
        let first = ranks.pop().expect("rank 0");
        let waiter = std::thread::spawn(move || first.recv(Source::Rank(1), 0));
        drop(second);
        let err = waiter.join().expect("thread").unwrap_err();
        assert!(matches!(err, CommError::Closed(_)), "{err}");
        let mut three = LocalWorld::create(3);
        let (c, b) = (three.pop().expect("rank 2"), three.pop().expect("rank 1"));
        let a = three.pop().expect("rank 0");
        let waiter = std::thread::spawn(move || a.recv(Source::Any, 0));
        drop(b);
        drop(c);
        let err = waiter.join().expect("thread").unwrap_err();
        assert!(matches!(err, CommError::Closed(_)), "{err}");
        let one = LocalWorld::create(1);
        let tag = one[0].send(0, RESERVED_TAGS, &[]).unwrap_err();
        assert_eq!(tag, CommError::ReservedTag(RESERVED_TAGS));
        let color = one[0].split(Some(u32::MAX), 0).map(|_| ()).unwrap_err();
        assert!(matches!(color, CommError::Argument(_)), "{color}");
    }
}
