//! Replay ring benchmark across processes: `cargo run --release -p rlf-shm --example replay_bench -- --json`.
//!
//! Prints one JSON object per scenario, rows of 11 words (a CartPole transition: two observations of 4, an action,
//! a return, a discount):
//! - `insert_<W>w`: W writer processes inserting rows in batches of 32 for `--seconds`, no reader;
//! - `sample_1r`: one process sampling batches of 64 rows from a full ring while one writer inserts;
//! - `wakeup`: a process sleeping on the insert counter (`wait_for`) and the time from an insert that reaches its
//!   target to the waiter running, median and p99 of 2000 rounds.
//!
//! The binary re-runs itself with `--role` for the worker processes.

use rlf_shm::{ReplayRing, ReplayRingHandle, Wait};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROW: usize = 11;

#[derive(Serialize, Deserialize)]
enum Role {
    Writer { ring: ReplayRingHandle, seconds: f64 },
    Sampler { ring: ReplayRingHandle, seconds: f64 },
    Waiter { ring: ReplayRingHandle, rounds: u64 },
}

fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Runs a role; prints its count (rows inserted, rows sampled) or its wake-up latencies on stdout.
fn run_role(role: Role) {
    let mut out = std::io::stdout();
    match role {
        Role::Writer { ring, seconds } => {
            let ring = ReplayRing::open(&ring).expect("open");
            let rows = vec![1.0f32; 32 * ROW];
            let end = Instant::now() + Duration::from_secs_f64(seconds);
            let mut n = 0u64;
            while Instant::now() < end {
                ring.insert(&rows, None).expect("insert");
                n += 32;
            }
            writeln!(out, "{n}").expect("stdout");
        }
        Role::Sampler { ring, seconds } => {
            let ring = ReplayRing::open(&ring).expect("open");
            let (mut indices, mut rows) = (Vec::new(), vec![0.0f32; 64 * ROW]);
            let mut state = 1u64;
            let mut draw = |m: u64| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                (state >> 33) % m
            };
            let end = Instant::now() + Duration::from_secs_f64(seconds);
            let mut n = 0u64;
            while Instant::now() < end {
                ring.sample_uniform(64, &mut draw, &mut indices, &mut rows);
                n += 64;
            }
            writeln!(out, "{n}").expect("stdout");
        }
        Role::Waiter { ring, rounds } => {
            let ring = ReplayRing::open(&ring).expect("open");
            let epoch = ring.interrupts();
            writeln!(out, "ready").expect("stdout");
            out.flush().expect("flush");
            for k in 1..=rounds {
                match ring.wait_for(k, None, epoch) {
                    Wait::Reached(_) => {
                        let mut row = [0.0f32; ROW];
                        ring.read(k - 1, &mut row).expect("row");
                        // The writer stored its clock (ns, split in two exact halves) in the row.
                        let sent = (row[0] as u64) << 24 | row[1] as u64;
                        let now = monotonic_ns() & ((1 << 48) - 1);
                        writeln!(out, "{}", now.saturating_sub(sent)).expect("stdout");
                    }
                    other => panic!("wait: {other:?}"),
                }
            }
        }
    }
}

fn spawn(role: &Role) -> Child {
    let exe = std::env::current_exe().expect("exe");
    Command::new(exe)
        .arg("--role")
        .arg(serde_json::to_string(role).expect("json"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn")
}

fn counts(children: Vec<Child>) -> Vec<u64> {
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("wait");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("count")
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--role") {
        run_role(serde_json::from_str(&args[i + 1]).expect("role"));
        return;
    }
    let seconds: f64 = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    for writers in [1, 4] {
        let ring = ReplayRing::create(100_000, ROW, None).expect("ring");
        let children = (0..writers)
            .map(|_| {
                spawn(&Role::Writer {
                    ring: ring.handle(),
                    seconds,
                })
            })
            .collect();
        let total: u64 = counts(children).iter().sum();
        println!(
            "{{\"scenario\":\"insert_{writers}w\",\"rows_per_s\":{:.0}}}",
            total as f64 / seconds
        );
    }
    let ring = ReplayRing::create(100_000, ROW, None).expect("ring");
    ring.insert(&vec![1.0f32; 100_000 * ROW], None).expect("fill");
    let children = vec![
        spawn(&Role::Sampler {
            ring: ring.handle(),
            seconds,
        }),
        spawn(&Role::Writer {
            ring: ring.handle(),
            seconds,
        }),
    ];
    let c = counts(children);
    println!(
        "{{\"scenario\":\"sample_1r\",\"rows_sampled_per_s\":{:.0},\"rows_inserted_per_s\":{:.0}}}",
        c[0] as f64 / seconds,
        c[1] as f64 / seconds
    );
    let rounds = 2000;
    let ring = ReplayRing::create(4096, ROW, None).expect("ring");
    let mut waiter = spawn(&Role::Waiter {
        ring: ring.handle(),
        rounds,
    });
    let mut lines = BufReader::new(waiter.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("ready").expect("line"), "ready");
    let mut latencies = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        // Let the waiter fall asleep first, then insert the row it waits for, stamped with the clock.
        std::thread::sleep(Duration::from_micros(500));
        let now = monotonic_ns() & ((1 << 48) - 1);
        let mut row = [0.0f32; ROW];
        row[0] = (now >> 24) as f32;
        row[1] = (now & ((1 << 24) - 1)) as f32;
        ring.insert(&row, None).expect("insert");
        let ns: u64 = lines.next().expect("latency").expect("line").parse().expect("ns");
        latencies.push(ns);
    }
    waiter.wait().expect("waiter");
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    println!(
        "{{\"scenario\":\"wakeup\",\"median_us\":{:.1},\"p99_us\":{:.1}}}",
        pct(0.5),
        pct(0.99)
    );
}
