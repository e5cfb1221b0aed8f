//! Multi-process tests of the queue: the test binary re-runs itself with a role (`RLF_QUEUE_ROLE`, JSON) to act as a
//! producer or consumer process ([`crate::child`]).
//!
//! - Stress: 4 producers × 3 consumers, 1M messages of varying length, single and batched: every message delivered
//!   exactly once, in per-producer order, intact.
//! - Crash: 200+ rounds in which one producer or consumer is SIGKILLed at a random moment (often while it holds the
//!   queue's lock, mid-copy) while the others go on: no hang, no torn or duplicated message, and every message a
//!   producer saw committed is received (but those a killed consumer had already taken).
//! - Fork: a forked copy of a segment's creator shares the segment and never unlinks it.

use crate::child::{self, wait_deadline};
use libtest_mimic::{Failed, Trial};
use rlf_shm::process::Forked;
use rlf_shm::{Batch, GetError, Queue, QueueConfig, QueueHandle, ShmArray};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// The variable that hands a re-run of the binary its role.
pub const ROLE_VAR: &str = "RLF_QUEUE_ROLE";

/// What a re-run of the binary does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Role {
    Producer {
        queue: QueueHandle,
        id: u32,
        count: u32,
        batch: u32,
        log: Option<PathBuf>,
    },
    Consumer {
        queue: QueueHandle,
        batch: u32,
        log: PathBuf,
    },
    BigProducer {
        queue: QueueHandle,
        size: usize,
        log: PathBuf,
    },
    BigConsumer {
        queue: QueueHandle,
        size: usize,
        log: PathBuf,
    },
    /// A single-threaded process that forks and lets the child drop its copy of a segment the parent created.
    ForkedCopy,
}

/// A large message: its sequence number, then a byte derived from it repeated.
fn fill_big(seq: u32, m: &mut [u8]) {
    m.fill((seq % 251) as u8);
    m[..4].copy_from_slice(&seq.to_le_bytes());
}

/// Checks the sequence number and the last 4 KiB (the copy is sequential, so a torn message is wrong at its end);
/// cheap enough that the victim, not the checker, is the one mostly holding the lock.
fn check_big(m: &[u8], size: usize) -> Result<u32, String> {
    if m.len() != size {
        return Err(format!("torn large message: {} bytes", m.len()));
    }
    let seq = u32::from_le_bytes(m[..4].try_into().map_err(|_| "torn")?);
    if m[size - 4096..].iter().any(|b| *b != (seq % 251) as u8) {
        return Err(format!("torn large message {seq}"));
    }
    Ok(seq)
}

/// Message `(producer, seq)`: both as u32 LE, then a payload whose length and bytes derive from them.
fn encode(p: u32, seq: u32, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&p.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    let len = (p as usize * 7 + seq as usize * 13) % 200;
    out.extend((0..len).map(|i| (p as usize ^ seq as usize ^ i) as u8));
}

/// Checks a message is intact; returns `(producer, seq)`.
fn decode(msg: &[u8]) -> Result<(u32, u32), String> {
    if msg.len() < 8 {
        return Err(format!("torn message: {} bytes", msg.len()));
    }
    let p = u32::from_le_bytes(msg[0..4].try_into().map_err(|_| "header")?);
    let seq = u32::from_le_bytes(msg[4..8].try_into().map_err(|_| "header")?);
    let mut expect = Vec::new();
    encode(p, seq, &mut expect);
    if expect != msg {
        return Err(format!("torn or corrupt message from producer {p} seq {seq}"));
    }
    Ok((p, seq))
}

fn id(p: u32, seq: u32) -> u32 {
    (p << 24) | seq
}

/// Plays `role` in this process.
pub fn run_role(role: Role) -> Result<(), String> {
    match role {
        Role::BigProducer { .. } | Role::BigConsumer { .. } => run_big_role(role),
        Role::ForkedCopy => forked_copy(),
        Role::Producer {
            queue,
            id: p,
            count,
            batch,
            log,
        } => {
            let q = Queue::open(&queue).map_err(|e| e.to_string())?;
            let mut log = match log {
                Some(path) => Some(std::fs::File::create(path).map_err(|e| e.to_string())?),
                None => None,
            };
            let mut msgs: Vec<Vec<u8>> = Vec::new();
            let mut seq = 0;
            while seq < count {
                let n = batch.min(count - seq);
                msgs.resize_with(n as usize, Vec::new);
                for (i, m) in msgs.iter_mut().enumerate() {
                    encode(p, seq + i as u32, m);
                }
                if batch == 1 {
                    q.put(&msgs[0]).map_err(|e| e.to_string())?;
                } else {
                    q.put_many(&msgs).map_err(|e| e.to_string())?;
                }
                if let Some(log) = &mut log {
                    // One unbuffered write per put: a kill loses at most the record of the last put.
                    let records: Vec<u8> = (seq..seq + n).flat_map(|s| s.to_le_bytes()).collect();
                    log.write_all(&records).map_err(|e| e.to_string())?;
                }
                seq += n;
            }
            Ok(())
        }
        Role::Consumer { queue, batch, log } => {
            let q = Queue::open(&queue).map_err(|e| e.to_string())?;
            let mut log = std::fs::File::create(log).map_err(|e| e.to_string())?;
            let mut out = Batch::new();
            let mut buf = Vec::new();
            let mut last = std::collections::HashMap::<u32, u32>::new();
            let mut records = Vec::new();
            loop {
                records.clear();
                let got = if batch == 1 {
                    q.get_into(&mut buf).map(|_| {
                        records.push(buf.clone());
                    })
                } else {
                    q.get_many(&mut out, batch as usize, 1 << 20).map(|_| {
                        records.extend(out.iter().map(<[u8]>::to_vec));
                    })
                };
                match got {
                    Ok(()) => {}
                    Err(GetError::Closed) => return Ok(()),
                    Err(e) => return Err(format!("get failed: {e}")),
                }
                let mut ids = Vec::with_capacity(records.len() * 4);
                for m in &records {
                    let (p, seq) = decode(m)?;
                    if let Some(prev) = last.insert(p, seq) {
                        if seq <= prev {
                            return Err(format!("producer {p}: seq {seq} after {prev}"));
                        }
                    }
                    ids.extend_from_slice(&id(p, seq).to_le_bytes());
                }
                log.write_all(&ids).map_err(|e| e.to_string())?;
            }
        }
    }
}

fn run_big_role(role: Role) -> Result<(), String> {
    match role {
        Role::BigProducer { queue, size, log } => {
            let q = Queue::open(&queue).map_err(|e| e.to_string())?;
            let mut log = std::fs::File::create(log).map_err(|e| e.to_string())?;
            let mut m = vec![0u8; size];
            for seq in 0.. {
                fill_big(seq, &mut m);
                q.put(&m).map_err(|e| e.to_string())?;
                log.write_all(&seq.to_le_bytes()).map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        Role::BigConsumer { queue, size, log } => {
            let q = Queue::open(&queue).map_err(|e| e.to_string())?;
            let mut log = std::fs::File::create(log).map_err(|e| e.to_string())?;
            let mut buf = Vec::new();
            let mut next = 0;
            while q.get_into(&mut buf).is_ok() {
                let seq = check_big(&buf, size)?;
                if seq != next {
                    return Err(format!("got {seq}, expected {next}"));
                }
                next += 1;
                log.write_all(&seq.to_le_bytes()).map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        _ => Err("not a large-message role".into()),
    }
}

fn spawn(role: &Role) -> Result<Child, Failed> {
    child::spawn(ROLE_VAR, role)
}

/// A fork of a segment's creator shares the segment, and dropping its copy leaves the segment in place: only the
/// creator unlinks it.
fn forked_copy() -> Result<(), String> {
    let me = std::process::id();
    let array = ShmArray::<u64>::create(1).map_err(|e| e.to_string())?;
    let forked = rlf_shm::process::fork_if_single_threaded().map_err(|e| e.to_string())?;
    let child = match forked {
        Some(Forked::Child) => {
            array.copy_from_slice(0, &[42]);
            drop(array);
            std::process::exit(0);
        }
        Some(Forked::Parent(pid)) => pid,
        None => return Err("a process with one thread was not forked".into()),
    };
    let pid = rustix::process::Pid::from_raw(child as i32).ok_or("pid 0")?;
    let (_, status) = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
        .map_err(|e| e.to_string())?
        .ok_or("no status")?;
    if status.exit_status() != Some(0) {
        return Err(format!("the child exited with {status:?}"));
    }
    let mut seen = [0u64];
    array.copy_to_slice(0, &mut seen);
    if seen != [42] {
        return Err(format!(
            "the child's write is not in the shared segment: {seen:?}"
        ));
    }
    let segments = |what| rlf_shm::region::segments_of(me).map_err(|e| format!("{what}: {e}"));
    if segments("after the child")?.len() != 1 {
        return Err("the child's drop unlinked its parent's segment".into());
    }
    drop(array);
    let left = segments("after the creator's drop")?;
    if !left.is_empty() {
        return Err(format!("the creator's drop left {left:?}"));
    }
    Ok(())
}

fn read_u32s(path: &Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap_or_default();
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A fresh directory per call (tests run in parallel threads of one process).
fn temp_dir(tag: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rlf-queue-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// 4 producers × 3 consumers, `per_producer` messages each, exactly once, in per-producer order, intact.
fn stress(batch: u32) -> Result<(), Failed> {
    const PRODUCERS: u32 = 4;
    const CONSUMERS: u32 = 3;
    let per_producer: u32 = 250_000;
    let dir = temp_dir(&format!("stress{batch}"));
    let q = Queue::create(QueueConfig {
        max_bytes: 64 << 10,
        ..QueueConfig::default()
    })?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut consumers = Vec::new();
    for c in 0..CONSUMERS {
        let log = dir.join(format!("c{c}"));
        consumers.push((
            spawn(&Role::Consumer {
                queue: q.handle(),
                batch,
                log: log.clone(),
            })?,
            log,
        ));
    }
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        producers.push(spawn(&Role::Producer {
            queue: q.handle(),
            id: p,
            count: per_producer,
            batch,
            log: None,
        })?);
    }
    for p in producers {
        let status = wait_deadline(p, deadline, "producer")?;
        if !status.success() {
            return Err(format!("producer failed: {status}").into());
        }
    }
    q.close();
    let mut seen = vec![false; (PRODUCERS * per_producer) as usize];
    for (c, log) in consumers {
        let status = wait_deadline(c, deadline, "consumer")?;
        if !status.success() {
            return Err(format!("consumer failed: {status}").into());
        }
        for rec in read_u32s(&log) {
            let (p, seq) = (rec >> 24, rec & 0xff_ffff);
            let slot = &mut seen[(p * per_producer + seq) as usize];
            if *slot {
                return Err(format!("producer {p} seq {seq} delivered twice").into());
            }
            *slot = true;
        }
    }
    let missing = seen.iter().filter(|s| !**s).count();
    if missing > 0 {
        return Err(format!("{missing} messages never delivered").into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A small deterministic generator for kill times and victims (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn crash_rounds(rounds: u32, batch: u32, seed: u64) -> Result<(), Failed> {
    let mut rng = Rng(seed);
    let mut owner_deaths = 0;
    for round in 0..rounds {
        owner_deaths += crash_round(&mut rng, batch)
            .map_err(|e| format!("round {round}: {}", e.message().map_or("", |m| m)))?;
    }
    eprintln!(
        "crash test (batch {batch}): {rounds} rounds, {owner_deaths} kills while holding the lock recovered"
    );
    Ok(())
}

/// Kills a process copying 1 MiB messages (so the kill often lands while it holds the lock, mid-copy: with 192 KiB,
/// only 22 kills of 20,000 landed there on a loaded machine, where the victim mostly waits for this process) and
/// checks from this process that the queue goes on: everything committed is received intact and in order, nothing
/// half-written appears, nothing is received twice. Goes on until `want_in_lock` kills have landed inside the lock
/// (at most `max_rounds` rounds), so the test proves what it says whatever the machine's load.
fn crash_mid_copy(want_in_lock: u64, max_rounds: u32, seed: u64) -> Result<(), Failed> {
    const SIZE: usize = 1 << 20;
    let mut rng = Rng(seed);
    let mut in_lock = 0;
    let mut rounds = 0;
    for round in 0..max_rounds {
        if in_lock >= want_in_lock {
            break;
        }
        rounds += 1;
        let fail = |m: String| -> Failed { format!("round {round}: {m}").into() };
        let dir = temp_dir("midcopy");
        let log = dir.join("log");
        let q = Queue::create(QueueConfig {
            max_bytes: 6 << 20,
            ..QueueConfig::default()
        })?;
        let kill_producer = round % 2 == 0;
        let role = if kill_producer {
            Role::BigProducer {
                queue: q.handle(),
                size: SIZE,
                log: log.clone(),
            }
        } else {
            Role::BigConsumer {
                queue: q.handle(),
                size: SIZE,
                log: log.clone(),
            }
        };
        let mut child = spawn(&role)?;
        let run_for = Duration::from_micros(200 + rng.below(3000));
        let mut until = None;
        let start_deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = Vec::new();
        let mut m = vec![0u8; SIZE];
        let mut next = 0u32;
        // This process plays the other side until the kill, which comes a random time after the victim's first
        // logged operation (so that it lands while the victim works, not while it starts).
        while until.is_none_or(|t| Instant::now() < t) {
            if until.is_none() {
                if std::fs::metadata(&log).is_ok_and(|m| m.len() > 0) {
                    until = Some(Instant::now() + run_for);
                } else if Instant::now() > start_deadline {
                    return Err(fail("victim made no progress in 10 s".into()));
                }
            }
            if kill_producer {
                if q.get_into_timeout(&mut buf, Duration::from_millis(1)).is_ok() {
                    let seq = check_big(&buf, SIZE).map_err(fail)?;
                    if seq != next {
                        return Err(fail(format!("got {seq}, expected {next}")));
                    }
                    next += 1;
                }
            } else {
                fill_big(next, &mut m);
                if q.put_timeout(&m, Duration::from_millis(1)).is_ok() {
                    next += 1;
                }
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        let logged = read_u32s(&log).len() as u32;
        if kill_producer {
            while let Ok(len) = q.try_get_into(&mut buf) {
                let seq = check_big(&buf[..len], SIZE).map_err(fail)?;
                if seq != next {
                    return Err(fail(format!("got {seq}, expected {next}")));
                }
                next += 1;
            }
            // The producer logs after its put returns: it may have committed one more than it logged.
            if next != logged && next != logged + 1 {
                return Err(fail(format!(
                    "received {next} messages, producer committed {logged}"
                )));
            }
        } else {
            let mut remaining = Vec::new();
            while q.try_get_into(&mut buf).is_ok() {
                remaining.push(check_big(&buf, SIZE).map_err(fail)?);
            }
            // The consumer logs after its get returns: it may have taken one more than it logged.
            let first = remaining.first().copied().unwrap_or(next);
            if first != logged && first != logged + 1 {
                return Err(fail(format!(
                    "queue resumes at {first}, consumer had logged {logged}"
                )));
            }
            if remaining.iter().zip(first..).any(|(a, b)| *a != b) || first + remaining.len() as u32 != next {
                return Err(fail(format!(
                    "queue holds {remaining:?}, expected {first}..{next}"
                )));
            }
        }
        in_lock += q.owner_deaths().min(1);
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!("mid-copy crash test: {in_lock} of {rounds} kills landed while the victim held the lock");
    if in_lock < want_in_lock {
        return Err(
            format!("only {in_lock} of {rounds} kills hit the lock: the test proves too little").into(),
        );
    }
    Ok(())
}

/// One round: 2 producers, 2 consumers, one of the four SIGKILLed at a random moment. Returns the number of lock
/// owner deaths the survivors recovered from.
fn crash_round(rng: &mut Rng, batch: u32) -> Result<u64, Failed> {
    const PER_PRODUCER: u32 = 4000;
    let dir = temp_dir("crash");
    // A small ring so producers block on a full queue and consumers on an empty one.
    let q = Queue::create(QueueConfig {
        max_bytes: 2048,
        ..QueueConfig::default()
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut procs = Vec::new();
    for p in 0..2 {
        let log = dir.join(format!("p{p}"));
        let role = Role::Producer {
            queue: q.handle(),
            id: p,
            count: PER_PRODUCER,
            batch,
            log: Some(log.clone()),
        };
        procs.push((spawn(&role)?, log, true));
    }
    for c in 0..2 {
        let log = dir.join(format!("c{c}"));
        procs.push((
            spawn(&Role::Consumer {
                queue: q.handle(),
                batch,
                log: log.clone(),
            })?,
            log,
            false,
        ));
    }
    let victim = rng.below(4) as usize;
    std::thread::sleep(Duration::from_micros(2000 + rng.below(10_000)));
    let producer_killed = victim < 2;
    let mut logs = Vec::new();
    let mut survivors = Vec::new();
    for (i, (mut child, log, is_producer)) in procs.into_iter().enumerate() {
        if i == victim {
            // SIGKILL (Child::kill sends SIGKILL on Unix).
            let _ = child.kill();
            let _ = child.wait();
        } else {
            survivors.push((child, is_producer));
        }
        logs.push((log, is_producer));
    }
    let (producers, consumers): (Vec<_>, Vec<_>) = survivors.into_iter().partition(|(_, p)| *p);
    for (child, _) in producers {
        let status = wait_deadline(child, deadline, "producer")?;
        if !status.success() {
            return Err(format!("surviving producer failed: {status}").into());
        }
    }
    q.close();
    for (child, _) in consumers {
        let status = wait_deadline(child, deadline, "consumer")?;
        if !status.success() {
            return Err(format!("surviving consumer failed: {status}").into());
        }
    }
    let mut received = HashSet::new();
    for (log, is_producer) in &logs {
        if *is_producer {
            continue;
        }
        for rec in read_u32s(log) {
            if !received.insert(rec) {
                return Err(format!("message {rec:#x} delivered twice").into());
            }
        }
    }
    let mut missing = 0u32;
    for (p, (log, _)) in logs.iter().take(2).enumerate() {
        let committed = read_u32s(log).len() as u32;
        for seq in 0..committed {
            if !received.contains(&id(p as u32, seq)) {
                missing += 1;
            }
        }
        // A killed producer may have committed one more put than it logged; no other message may appear.
        let limit = if victim == p { committed + batch } else { committed };
        if let Some(extra) = received
            .iter()
            .filter(|r| *r >> 24 == p as u32)
            .find(|r| *r & 0xff_ffff >= limit)
        {
            return Err(format!("producer {p}: received seq {} it never put", extra & 0xff_ffff).into());
        }
    }
    // Messages a killed consumer had taken (at most one get's worth, not yet logged) are legitimately gone.
    let allowed = if producer_killed { 0 } else { batch };
    if missing > allowed {
        return Err(format!("{missing} committed messages lost (victim {victim})").into());
    }
    if !q.is_empty() {
        return Err("queue not drained".into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(q.owner_deaths())
}

/// This module's tests.
pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test("queue_process::stress_4p3c_1m_single", || stress(1)),
        Trial::test("queue_process::stress_4p3c_1m_batched", || stress(32)),
        Trial::test("queue_process::crash_kill9_200_rounds_single", || {
            crash_rounds(200, 1, 0x9e37_79b9_7f4a_7c15)
        }),
        Trial::test("queue_process::crash_kill9_100_rounds_batched", || {
            crash_rounds(100, 16, 0xdead_beef_cafe_f00d)
        }),
        Trial::test("queue_process::crash_kill9_mid_copy_until_30_in_lock", || {
            crash_mid_copy(30, 20_000, 0x1234_5678_9abc_def1)
        }),
        Trial::test(
            "queue_process::a_forked_copy_never_unlinks_its_creators_segment",
            || {
                let child = spawn(&Role::ForkedCopy)?;
                let status = wait_deadline(child, Instant::now() + Duration::from_secs(30), "forked copy")?;
                if status.success() {
                    Ok(())
                } else {
                    Err(format!("the forking process failed: {status}").into())
                }
            },
        ),
    ]
}
