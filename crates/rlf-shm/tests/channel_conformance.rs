//! One conformance suite, run against both channel flavours (in-process and shared memory).

use rlf_shm::channel::{self, Receiver, RecvError, SendError, Sender};
use rlf_shm::QueueConfig;
use serde::{Deserialize, Serialize};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Msg {
    id: u64,
    name: String,
    data: Vec<f32>,
}

fn msg(id: u64) -> Msg {
    Msg {
        id,
        name: format!("m{id}"),
        data: vec![id as f32; 3],
    }
}

/// Each flavour with room for about four messages.
fn flavours() -> Vec<(&'static str, Sender<Msg>, Receiver<Msg>)> {
    let (lt, lr) = channel::local(4);
    let size = postcard::to_stdvec(&msg(0)).expect("encode").len();
    let config = QueueConfig {
        max_bytes: 4 * (size + 4),
        ..QueueConfig::default()
    };
    let (st, sr) = channel::shared(config).expect("shared channel");
    vec![("local", lt, lr), ("shared", st, sr)]
}

#[test]
fn send_recv_in_order() {
    for (name, tx, rx) in flavours() {
        for i in 0..4 {
            tx.send(msg(i)).expect(name);
        }
        assert_eq!(rx.len(), 4, "{name}");
        for i in 0..4 {
            assert_eq!(rx.recv().expect(name), msg(i), "{name}");
        }
        assert!(rx.is_empty(), "{name}");
    }
}

#[test]
fn full_and_empty_hand_values_back() {
    for (name, tx, rx) in flavours() {
        for i in 0..4 {
            tx.try_send(msg(i)).expect(name);
        }
        assert_eq!(tx.try_send(msg(9)), Err(SendError::Full(msg(9))), "{name}");
        let t = Instant::now();
        assert_eq!(
            tx.send_timeout(msg(9), Duration::from_millis(20)),
            Err(SendError::Timeout(msg(9))),
            "{name}"
        );
        assert!(t.elapsed() >= Duration::from_millis(20), "{name}: early timeout");
        for _ in 0..4 {
            rx.try_recv().expect(name);
        }
        assert_eq!(rx.try_recv(), Err(RecvError::Empty), "{name}");
        let t = Instant::now();
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(20)),
            Err(RecvError::Timeout),
            "{name}"
        );
        assert!(t.elapsed() >= Duration::from_millis(20), "{name}: early timeout");
    }
}

#[test]
fn close_fails_sends_and_drains_receives() {
    for (name, tx, rx) in flavours() {
        tx.send(msg(1)).expect(name);
        rx.close();
        assert_eq!(tx.send(msg(2)), Err(SendError::Closed(msg(2))), "{name}");
        assert_eq!(rx.recv(), Ok(msg(1)), "{name}: drains after close");
        assert_eq!(rx.recv(), Err(RecvError::Closed), "{name}");
    }
}

#[test]
fn close_wakes_a_blocked_receiver() {
    for (name, tx, rx) in flavours() {
        let waiter = thread::spawn(move || rx.recv());
        thread::sleep(Duration::from_millis(30));
        tx.close();
        assert_eq!(waiter.join().expect("join"), Err(RecvError::Closed), "{name}");
    }
}

#[test]
fn many_producers_many_consumers_exactly_once() {
    for (name, tx, rx) in flavours() {
        let producers: Vec<_> = (0..3u64)
            .map(|p| {
                let tx = tx.clone();
                thread::spawn(move || {
                    for i in 0..500 {
                        tx.send(msg(p * 1000 + i)).expect("send");
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let rx = rx.clone();
                thread::spawn(move || {
                    let mut got = Vec::new();
                    let mut last = [None::<u64>; 3];
                    while let Ok(m) = rx.recv() {
                        let p = (m.id / 1000) as usize;
                        assert!(last[p] < Some(m.id), "per-producer order");
                        last[p] = Some(m.id);
                        got.push(m.id);
                    }
                    got
                })
            })
            .collect();
        for p in producers {
            p.join().expect("producer");
        }
        tx.close();
        let mut all: Vec<u64> = consumers
            .into_iter()
            .flat_map(|c| c.join().expect("consumer"))
            .collect();
        all.sort_unstable();
        let want: Vec<u64> = (0..3).flat_map(|p| (0..500).map(move |i| p * 1000 + i)).collect();
        assert_eq!(all, want, "{name}");
    }
}

#[test]
fn shared_ends_reopen_from_handles_and_local_has_none() {
    let (tx, rx) = channel::shared::<Msg>(QueueConfig::default()).expect("shared");
    let handle = tx.handle().expect("shared channels have handles");
    let tx2 = Sender::<Msg>::open(&handle).expect("open sender");
    let rx2 = Receiver::<Msg>::open(&rx.handle().expect("handle")).expect("open receiver");
    tx2.send(msg(5)).expect("send");
    assert_eq!(rx2.recv(), Ok(msg(5)));
    let (ltx, _lrx) = channel::local::<Msg>(1);
    assert!(ltx.handle().is_none());
}

#[test]
fn oversized_and_undecodable_values_are_errors() {
    let (tx, rx) = channel::shared::<Vec<u8>>(QueueConfig {
        max_bytes: 64,
        ..QueueConfig::default()
    })
    .expect("shared");
    assert_eq!(tx.send(vec![0; 100]), Err(SendError::TooLarge(vec![0; 100])));
    let raw = Sender::<u8>::open(&tx.handle().expect("handle")).expect("open");
    // The byte 200 alone is an unfinished varint length: no Vec<u8>.
    raw.send(200).expect("send");
    assert_eq!(rx.recv(), Err(RecvError::Decode));
}
