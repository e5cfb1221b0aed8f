//! Queue benchmark across processes: `cargo run --release -p rlf-shm --example queue_bench -- --json`.
//!
//! Prints one JSON object per scenario: producers → consumers for several message sizes, single and batched (100)
//! puts and gets; a ping-pong round trip between two processes; an idle consumer blocked for 10 s with its wake-ups
//! counted from /proc. Options: `--seconds S` (per throughput scenario, default 0.4), `--only NAME` (scenario
//! prefix, e.g. `1P1C`, `pingpong`, `idle`). The binary re-runs itself with `--role` for the worker processes.

use rlf_shm::{Batch, GetError, Queue, QueueConfig, QueueHandle};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Serialize, Deserialize)]
enum Role {
    Producer {
        q: QueueHandle,
        size: usize,
        batch: usize,
        start_ns: u64,
        seconds: f64,
    },
    Consumer {
        q: QueueHandle,
        batch: usize,
    },
    Echo {
        ping: QueueHandle,
        pong: QueueHandle,
    },
    Idle {
        q: QueueHandle,
    },
}

fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn run_role(role: Role) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::stdout();
    match role {
        Role::Producer {
            q,
            size,
            batch,
            start_ns,
            seconds,
        } => {
            let q = Queue::open(&q)?;
            let msgs = vec![vec![7u8; size]; batch];
            let end = start_ns + (seconds * 1e9) as u64;
            // Processes start together at a monotonic instant they all know (one sleep, not a loop).
            std::thread::sleep(Duration::from_nanos(start_ns.saturating_sub(monotonic_ns())));
            let mut sent = 0u64;
            while monotonic_ns() < end {
                for _ in 0..16 {
                    if batch == 1 {
                        q.put(&msgs[0])?;
                    } else {
                        q.put_many(&msgs)?;
                    }
                    sent += batch as u64;
                }
            }
            writeln!(out, "{sent}")?;
        }
        Role::Consumer { q, batch } => {
            let q = Queue::open(&q)?;
            let mut got = 0u64;
            let mut buf = Vec::new();
            let mut b = Batch::new();
            loop {
                let r = if batch == 1 {
                    q.get_into(&mut buf).map(|_| 1)
                } else {
                    q.get_many(&mut b, batch, usize::MAX)
                };
                match r {
                    Ok(n) => got += n as u64,
                    Err(GetError::Closed) => break,
                    Err(e) => return Err(e.into()),
                }
            }
            writeln!(out, "{got}")?;
        }
        Role::Echo { ping, pong } => {
            let (ping, pong) = (Queue::open(&ping)?, Queue::open(&pong)?);
            let mut buf = Vec::new();
            while ping.get_into(&mut buf).is_ok() {
                pong.put(&buf)?;
            }
        }
        Role::Idle { q } => {
            let q = Queue::open(&q)?;
            let _ = q.get();
        }
    }
    Ok(())
}

fn spawn(role: &Role) -> Child {
    let exe = std::env::current_exe().expect("own executable");
    Command::new(exe)
        .arg("--role")
        .arg(serde_json::to_string(role).expect("role encodes"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn worker")
}

fn read_count(child: Child) -> u64 {
    let out = child.wait_with_output().expect("worker output");
    assert!(out.status.success(), "worker failed: {}", out.status);
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("worker prints a count")
}

fn throughput(
    producers: usize,
    consumers: usize,
    size: usize,
    batch: usize,
    seconds: f64,
) -> serde_json::Value {
    let q = Queue::create(QueueConfig {
        max_bytes: 16 << 20,
        ..QueueConfig::default()
    })
    .expect("queue");
    let start_ns = monotonic_ns() + 300_000_000;
    let cons: Vec<Child> = (0..consumers)
        .map(|_| spawn(&Role::Consumer { q: q.handle(), batch }))
        .collect();
    let prods: Vec<Child> = (0..producers)
        .map(|_| {
            spawn(&Role::Producer {
                q: q.handle(),
                size,
                batch,
                start_ns,
                seconds,
            })
        })
        .collect();
    let sent: u64 = prods.into_iter().map(read_count).sum();
    // Producers are done: what is left is drained before the consumers see Closed.
    q.close();
    let received: u64 = cons.into_iter().map(read_count).sum();
    let elapsed = (monotonic_ns() - start_ns) as f64 / 1e9;
    assert_eq!(sent, received, "every message sent was received");
    let rate = received as f64 / elapsed;
    serde_json::json!({
        "scenario": format!("{producers}P{consumers}C"),
        "producers": producers, "consumers": consumers, "size": size, "batch": batch,
        "msgs_per_s": rate.round(), "mb_per_s": (rate * size as f64 / 1e6).round(),
    })
}

fn pingpong(rounds: usize) -> serde_json::Value {
    let config = QueueConfig {
        max_bytes: 1 << 16,
        ..QueueConfig::default()
    };
    let (ping, pong) = (
        Queue::create(config).expect("ping"),
        Queue::create(config).expect("pong"),
    );
    let echo = spawn(&Role::Echo {
        ping: ping.handle(),
        pong: pong.handle(),
    });
    let mut rtts = Vec::with_capacity(rounds);
    let mut buf = Vec::new();
    for i in 0..rounds + 1000 {
        let t = Instant::now();
        ping.put(&(i as u64).to_le_bytes()).expect("ping");
        pong.get_into(&mut buf).expect("pong");
        if i >= 1000 {
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    ping.close();
    echo.wait_with_output().expect("echo exits");
    rtts.sort_by(f64::total_cmp);
    serde_json::json!({
        "scenario": "pingpong", "producers": 1, "consumers": 1, "size": 8, "batch": 1,
        "msgs_per_s": (rounds as f64 / (rtts.iter().sum::<f64>() / 1e6)).round(),
        "mb_per_s": 0,
        "rtt_us_median": (rtts[rtts.len() / 2] * 10.0).round() / 10.0,
        "rtt_us_p99": (rtts[rtts.len() * 99 / 100] * 10.0).round() / 10.0,
    })
}

/// Context switches (voluntary + involuntary) of every thread of `pid`: each wake-up of a sleeping thread is one.
fn switches(pid: u32) -> u64 {
    let mut total = 0;
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    for task in tasks.flatten() {
        let Ok(f) = std::fs::File::open(task.path().join("status")) else {
            continue;
        };
        for line in BufReader::new(f).lines().map_while(Result::ok) {
            if line.contains("ctxt_switches:") {
                total += line
                    .split_whitespace()
                    .last()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    total
}

fn idle(seconds: u64) -> serde_json::Value {
    let q = Queue::create(QueueConfig::default()).expect("queue");
    let child = spawn(&Role::Idle { q: q.handle() });
    // Let it start and finish its bounded spin, then count over the window.
    std::thread::sleep(Duration::from_millis(500));
    let before = switches(child.id());
    std::thread::sleep(Duration::from_secs(seconds));
    let after = switches(child.id());
    q.close();
    child.wait_with_output().expect("idle exits");
    serde_json::json!({
        "scenario": "idle", "producers": 0, "consumers": 1, "size": 0, "batch": 1, "msgs_per_s": 0, "mb_per_s": 0,
        "wakeups_per_s": (after - before) as f64 / seconds as f64,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--role") {
        let role: Role = serde_json::from_str(&args[i + 1]).expect("role json");
        if let Err(e) = run_role(role) {
            eprintln!("worker: {e}");
            std::process::exit(1);
        }
        return;
    }
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds: f64 = flag("--seconds").and_then(|s| s.parse().ok()).unwrap_or(0.4);
    let only = flag("--only").unwrap_or_default();
    let json = args.iter().any(|a| a == "--json");
    let emit = |v: serde_json::Value| {
        if json {
            println!("{v}");
        } else {
            println!("{v:#}");
        }
    };
    for (p, c) in [(1, 1), (2, 2), (10, 1), (1, 10), (20, 3), (20, 20)] {
        if !format!("{p}P{c}C").starts_with(&only) {
            continue;
        }
        for size in [8, 64, 1024, 64 << 10] {
            for batch in [1, 100] {
                emit(throughput(p, c, size, batch, seconds));
            }
        }
    }
    if "pingpong".starts_with(&only) {
        emit(pingpong(20_000));
    }
    if "idle".starts_with(&only) {
        emit(idle(10));
    }
}
