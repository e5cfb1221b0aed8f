//! Multi-process tests of the replay ring: the test binary re-runs itself with a role (`RLF_REPLAY_ROLE`, JSON) to act
//! as a writer or a sampler process ([`crate::child`]).
//!
//! - Concurrent: 4 writer processes and 2 sampler processes on one ring that wraps around hundreds of times: every
//!   row a sampler accepts is intact (each row carries a checksum of its writer, number and words), and each
//!   writer's rows sit in the ring in the order it wrote them.
//! - Kill: a writer of 1 MiB rows is SIGKILLed at a random moment, 40 times (mostly mid-row, holding the lock); after
//!   each kill every visible row is intact and the next writer goes on from the counter the dead one left.

use crate::child::{self, wait_deadline};
use libtest_mimic::{Failed, Trial};
use rlf_shm::{ReplayRing, ReplayRingHandle, Wait};
use serde::{Deserialize, Serialize};
use std::process::Child;
use std::time::{Duration, Instant};

/// The variable that hands a re-run of the binary its role.
pub const ROLE_VAR: &str = "RLF_REPLAY_ROLE";

/// What a re-run of the binary does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Role {
    /// Inserts `count` rows (in batches of `batch`) numbered from 0, then exits.
    Writer {
        ring: ReplayRingHandle,
        id: u32,
        count: u32,
        batch: u32,
    },
    /// Samples until the counter reaches `until`, checking every row; exits non-zero on a bad row.
    Sampler { ring: ReplayRingHandle, until: u64 },
    /// Inserts rows for ever (until killed).
    Endless { ring: ReplayRingHandle, id: u32 },
}

/// Row `seq` of writer `id`: its writer, its number, words that depend on both (exact in `f32`, below 2^24; they
/// repeat every 8 rows, so that a writer can keep 8 filled rows and change two words of one per insert), and the
/// sum of the others mod 65521, so that a row mixing two writes fails its check.
fn fill(id: u32, seq: u32, row: &mut [f32]) {
    let n = row.len();
    for (i, w) in row.iter_mut().enumerate().take(n - 1).skip(2) {
        *w = ((u64::from(id) * 7919 + u64::from(seq % 8) * 104_729 + i as u64 * 31) % 65_521) as f32;
    }
    let base = checksum(&row[2..n - 1]) as u64;
    renumber(id, seq, base, row);
}

/// Sets the writer, number and checksum of a row whose other words are row `seq % 8`'s, which sum to `base`
/// (mod 65521).
fn renumber(id: u32, seq: u32, base: u64, row: &mut [f32]) {
    let n = row.len();
    row[0] = id as f32;
    row[1] = (seq % (1 << 23)) as f32;
    row[n - 1] = ((base + u64::from(id) + u64::from(seq % (1 << 23))) % 65_521) as f32;
}

fn checksum(words: &[f32]) -> f32 {
    (words.iter().map(|&w| w as u64).sum::<u64>() % 65_521) as f32
}

/// Checks a row; returns its writer and number.
fn check(row: &[f32]) -> Result<(u32, u32), String> {
    let (id, seq) = (row[0] as u32, row[1] as u32);
    let mut expected = vec![0.0; row.len()];
    fill(id, seq, &mut expected);
    if expected != row || checksum(&row[..row.len() - 1]) != row[row.len() - 1] {
        return Err(format!("torn or corrupt row: writer {id}, number {seq}"));
    }
    Ok((id, seq))
}

/// Plays `role` in this process.
pub fn run_role(role: Role) -> Result<(), String> {
    match role {
        Role::Writer {
            ring,
            id,
            count,
            batch,
        } => {
            let ring = ReplayRing::open(&ring).map_err(|e| e.to_string())?;
            let w = ring.row_words();
            let mut rows = vec![0.0; batch as usize * w];
            let mut seq = 0;
            while seq < count {
                let n = batch.min(count - seq);
                for (i, row) in rows.chunks_exact_mut(w).take(n as usize).enumerate() {
                    fill(id, seq + i as u32, row);
                }
                ring.insert(&rows[..n as usize * w], None)
                    .map_err(|e| e.to_string())?;
                seq += n;
            }
            Ok(())
        }
        Role::Sampler { ring, until } => {
            let ring = ReplayRing::open(&ring).map_err(|e| e.to_string())?;
            let mut state = u64::from(std::process::id());
            let mut draw = |m: u64| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 33) % m
            };
            let (mut indices, mut rows) = (Vec::new(), vec![0.0; 32 * ring.row_words()]);
            let mut checked = 0u64;
            while ring.inserted() < until {
                if ring.sample_uniform(32, &mut draw, &mut indices, &mut rows) {
                    for row in rows.chunks_exact(ring.row_words()) {
                        check(row)?;
                        checked += 1;
                    }
                }
            }
            if checked == 0 {
                return Err("the sampler checked no row".into());
            }
            Ok(())
        }
        Role::Endless { ring, id } => {
            // Nearly all its time is spent inside `insert`, holding the lock, so a kill lands mostly mid-row.
            let ring = ReplayRing::open(&ring).map_err(|e| e.to_string())?;
            let n = ring.row_words();
            let mut rows: Vec<(u64, Vec<f32>)> = (0..8)
                .map(|seq| {
                    let mut row = vec![0.0; n];
                    fill(id, seq, &mut row);
                    (checksum(&row[2..n - 1]) as u64, row)
                })
                .collect();
            for seq in 0.. {
                let (base, row) = &mut rows[(seq % 8) as usize];
                renumber(id, seq, *base, row);
                ring.insert(row, None).map_err(|e| e.to_string())?;
            }
            Ok(())
        }
    }
}

fn spawn(role: &Role) -> Result<Child, Failed> {
    child::spawn(ROLE_VAR, role)
}

/// Every visible row of `ring` is intact and each writer's rows are in the order it wrote them.
fn check_visible(ring: &ReplayRing) -> Result<u64, String> {
    let end = ring.inserted();
    let mut row = vec![0.0; ring.row_words()];
    let mut last = std::collections::HashMap::new();
    for index in end.saturating_sub(ring.capacity() as u64)..end {
        ring.read(index, &mut row)
            .map_err(|e| format!("visible row {index} with no writer running: {e}"))?;
        let (id, seq) = check(&row).map_err(|e| format!("row {index}: {e}"))?;
        if let Some(previous) = last.insert(id, seq) {
            if seq <= previous {
                return Err(format!("writer {id}'s row {seq} after its row {previous}"));
            }
        }
    }
    Ok(end)
}

fn concurrent() -> Result<(), Failed> {
    const WRITERS: u32 = 4;
    const ROWS: u32 = 100_000;
    let ring = ReplayRing::create(1024, 67, None).map_err(|e| e.to_string())?;
    let total = u64::from(WRITERS * ROWS);
    let samplers = (0..2)
        .map(|_| {
            spawn(&Role::Sampler {
                ring: ring.handle(),
                until: total,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let writers = (0..WRITERS)
        .map(|id| {
            spawn(&Role::Writer {
                ring: ring.handle(),
                id,
                count: ROWS,
                batch: 1 + id * 5,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    for (i, child) in writers.into_iter().chain(samplers).enumerate() {
        let status = wait_deadline(child, deadline, &format!("process {i}"))?;
        if !status.success() {
            return Err(format!("process {i} failed: {status}").into());
        }
    }
    if ring.inserted() != total {
        return Err(format!("{} inserts, expected {total}", ring.inserted()).into());
    }
    check_visible(&ring)?;
    Ok(())
}

fn kill_mid_row() -> Result<(), Failed> {
    const ROUNDS: u32 = 40;
    let ring = ReplayRing::create(12, 1 << 18, None).map_err(|e| e.to_string())?;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..ROUNDS {
        let before = ring.inserted();
        let mut child = spawn(&Role::Endless {
            ring: ring.handle(),
            id: round,
        })?;
        // Let it write a few rows first (each takes about a millisecond), then kill it at a random moment.
        let started = ring.wait_for(
            before + 2,
            Some(Instant::now() + Duration::from_secs(30)),
            ring.interrupts(),
        );
        if !matches!(started, Wait::Reached(_)) {
            let _ = child.kill();
            return Err(format!("round {round}: the writer did not start ({started:?})").into());
        }
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        std::thread::sleep(Duration::from_micros(200 + (state >> 33) % 5000));
        child.kill().map_err(|e| e.to_string())?;
        child.wait().map_err(|e| e.to_string())?;
        check_visible(&ring).map_err(|e| format!("round {round}: {e}"))?;
    }
    // The kills land mostly while the writer holds the lock mid-row; each such death is recovered by the next
    // writer, who rewrote the dead one's row.
    if ring.writer_deaths() < u64::from(ROUNDS) / 2 {
        return Err(format!(
            "only {} of {ROUNDS} kills hit a writer mid-row",
            ring.writer_deaths()
        )
        .into());
    }
    Ok(())
}

/// This module's tests.
pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test(
            "replay_process::four_writers_two_samplers_never_see_a_torn_row",
            concurrent,
        ),
        Trial::test(
            "replay_process::a_writer_killed_mid_row_leaves_every_visible_row_intact",
            kill_mid_row,
        ),
    ]
}
