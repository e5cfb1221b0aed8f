//! Signal throughput and round trips: `cargo run --release -p rlf-signal --example signal_bench -- --json`.
//!
//! Prints one JSON object per scenario (with `--json`; a table otherwise):
//! - `thread`, `process`: emit → slot throughput of 8-byte payloads from a loop on a thread / in a process to the
//!   main loop, single emits; `thread_batched`, `process_batched`: `emit_many` of 100.
//! - `rtt_thread`, `rtt_process`: ping → pong → ping round trips between the main loop and a thread / process loop.
//!
//! Options: `--signals N` (per throughput scenario, default 2,000,000), `--rounds N` (round trips, default 20,000),
//! `--only NAME`.

use rlf_signal::{App, AppBuilder, BuildError, Component, Ctx, Signal};
use serde::{Deserialize, Serialize};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Kind {
    Throughput { batch: u32 },
    Rtt,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Cfg {
    kind: Kind,
    process: bool,
    n: u64,
}

/// Results written by the main-loop objects.
type Results = Arc<Mutex<Vec<f64>>>;

struct Source {
    data: Signal<[u8; 8]>,
    n: u64,
    batch: u32,
}
struct Counter {
    go: Signal<u64>,
    n: u64,
    seen: u64,
    t0: Option<Instant>,
    results: Results,
}
struct Ponger {
    pong: Signal<[u8; 8]>,
}
struct Pinger {
    ping: Signal<[u8; 8]>,
    n: u64,
    sent_at: Option<Instant>,
    rtts: Vec<f64>,
    results: Results,
}

impl Component for Source {}
impl Source {
    fn on_go(&mut self, ctx: &mut Ctx<Self>, _: &u64) {
        if self.batch <= 1 {
            for i in 0..self.n {
                if let Err(e) = ctx.emit(&self.data, &i.to_le_bytes()) {
                    eprintln!("emit failed: {e}");
                    return;
                }
            }
        } else {
            let mut chunk = Vec::with_capacity(self.batch as usize);
            let mut i = 0;
            while i < self.n {
                chunk.clear();
                chunk.extend((i..(i + u64::from(self.batch)).min(self.n)).map(u64::to_le_bytes));
                if let Err(e) = ctx.emit_many(&self.data, &chunk) {
                    eprintln!("emit_many failed: {e}");
                    return;
                }
                i += chunk.len() as u64;
            }
        }
    }
}

impl Component for Counter {
    fn on_start(&mut self, ctx: &mut Ctx<Self>) {
        self.t0 = Some(Instant::now());
        if let Err(e) = ctx.emit(&self.go, &self.n) {
            eprintln!("go failed: {e}");
            ctx.stop_app();
        }
    }
}
impl Counter {
    fn on_data(&mut self, ctx: &mut Ctx<Self>, _: &[u8; 8]) {
        self.seen += 1;
        if self.seen == self.n {
            if let (Some(t0), Ok(mut r)) = (self.t0, self.results.lock()) {
                r.push(self.n as f64 / t0.elapsed().as_secs_f64());
            }
            ctx.stop_app();
        }
    }
}

impl Component for Ponger {}
impl Ponger {
    fn on_ping(&mut self, ctx: &mut Ctx<Self>, v: &[u8; 8]) {
        if let Err(e) = ctx.emit(&self.pong, v) {
            eprintln!("pong failed: {e}");
        }
    }
}

impl Component for Pinger {
    fn on_start(&mut self, ctx: &mut Ctx<Self>) {
        self.send(ctx, 0);
    }
}
impl Pinger {
    fn send(&mut self, ctx: &mut Ctx<Self>, i: u64) {
        self.sent_at = Some(Instant::now());
        if let Err(e) = ctx.emit(&self.ping, &i.to_le_bytes()) {
            eprintln!("ping failed: {e}");
            ctx.stop_app();
        }
    }
    fn on_pong(&mut self, ctx: &mut Ctx<Self>, v: &[u8; 8]) {
        if let Some(t) = self.sent_at {
            self.rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let i = u64::from_le_bytes(*v) + 1;
        if i == self.n {
            if let Ok(mut r) = self.results.lock() {
                r.append(&mut self.rtts);
            }
            ctx.stop_app();
        } else {
            self.send(ctx, i);
        }
    }
}

fn build(app: &mut AppBuilder, results: Results) -> Result<(), BuildError> {
    let c: Cfg = app.config()?;
    let main = app.main_loop();
    let far = if c.process {
        app.process_loop("far")
    } else {
        app.thread_loop("far")
    };
    match c.kind {
        Kind::Throughput { batch } => {
            let source = app.object::<Source>(far, "source");
            let counter = app.object::<Counter>(main, "counter");
            let data = app.signal::<[u8; 8], _>(source, "data");
            let go = app.signal::<u64, _>(counter, "go");
            app.connect(data, counter, Counter::on_data);
            app.connect(go, source, Source::on_go);
            app.construct(source, move || Source { data, n: c.n, batch });
            app.construct(counter, move || Counter {
                go,
                n: c.n,
                seen: 0,
                t0: None,
                results,
            });
        }
        Kind::Rtt => {
            let ponger = app.object::<Ponger>(far, "ponger");
            let pinger = app.object::<Pinger>(main, "pinger");
            let ping = app.signal::<[u8; 8], _>(pinger, "ping");
            let pong = app.signal::<[u8; 8], _>(ponger, "pong");
            app.connect(ping, ponger, Ponger::on_ping);
            app.connect(pong, pinger, Pinger::on_pong);
            app.construct(ponger, move || Ponger { pong });
            app.construct(pinger, move || Pinger {
                ping,
                n: c.n,
                sent_at: None,
                rtts: Vec::new(),
                results,
            });
        }
    }
    Ok(())
}

fn run(cfg: Cfg) -> anyhow::Result<Vec<f64>> {
    let results = Results::default();
    let r = results.clone();
    let outcome = App::new("signal_bench")
        .with_config(&cfg)?
        .run(move |b| build(b, r))?;
    anyhow::ensure!(outcome.success(), "benchmark run failed: {outcome}");
    let v = results
        .lock()
        .map_err(|_| anyhow::anyhow!("results lock poisoned"))?
        .clone();
    Ok(v)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() -> anyhow::Result<ExitCode> {
    if let Some(code) = rlf_signal::child_entry(|b| build(b, Results::default())) {
        return Ok(ExitCode::from(code));
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let opt = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
    let signals: u64 = opt("--signals").map_or(Ok(2_000_000), |s| s.parse())?;
    let rounds: u64 = opt("--rounds").map_or(Ok(20_000), |s| s.parse())?;
    let only = opt("--only");
    let scenarios = [
        ("thread", Kind::Throughput { batch: 1 }, false),
        ("process", Kind::Throughput { batch: 1 }, true),
        ("thread_batched", Kind::Throughput { batch: 100 }, false),
        ("process_batched", Kind::Throughput { batch: 100 }, true),
        ("rtt_thread", Kind::Rtt, false),
        ("rtt_process", Kind::Rtt, true),
    ];
    for (name, kind, process) in scenarios {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let n = if kind == Kind::Rtt { rounds } else { signals };
        let mut v = run(Cfg { kind, process, n })?;
        let line = if kind == Kind::Rtt {
            v.sort_by(f64::total_cmp);
            serde_json::json!({
                "scenario": name,
                "rtt_us_median": (percentile(&v, 0.5) * 100.0).round() / 100.0,
                "rtt_us_p99": (percentile(&v, 0.99) * 100.0).round() / 100.0,
                "rounds": v.len(),
            })
        } else {
            serde_json::json!({
                "scenario": name,
                "signals_per_s": v.first().copied().unwrap_or(f64::NAN).round(),
                "signals": n,
                "payload_bytes": 8,
            })
        };
        if json {
            println!("{line}");
        } else {
            println!("{name:>16}: {line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
