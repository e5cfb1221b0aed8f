//! Single-process semantics of the byte queue: every method, deadlines, close, full, oversized messages, and
//! wrap-around at every ring offset (property test against a VecDeque oracle).
//!
//! Plain test functions, which fail by panicking as under the standard harness; [`trials`] lists them.

use libtest_mimic::Trial;
use proptest::prelude::*;
use rlf_shm::{Batch, GetError, PutError, Queue, QueueConfig};
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

fn queue(max_bytes: usize, max_messages: usize) -> Queue {
    Queue::create(QueueConfig {
        max_bytes,
        max_messages,
        ..QueueConfig::default()
    })
    .expect("create queue")
}

fn put_get_in_order_and_len() {
    let q = queue(1024, 100);
    assert!(q.is_empty());
    for i in 0..10u8 {
        q.put(&[i; 3]).expect("put");
    }
    assert_eq!(q.len(), 10);
    assert_eq!(q.used_bytes(), 10 * (4 + 3));
    for i in 0..10u8 {
        assert_eq!(q.get().expect("get"), vec![i; 3]);
    }
    assert!(q.is_empty());
    assert_eq!(q.try_get(), Err(GetError::Empty));
}

fn empty_messages_are_messages() {
    let q = queue(64, 10);
    q.put(b"").expect("put empty");
    assert_eq!(q.len(), 1);
    assert_eq!(q.get().expect("get"), Vec::<u8>::new());
}

fn full_by_bytes_and_by_count() {
    let q = queue(32, 100);
    q.put(&[1; 12]).expect("16 bytes");
    q.put(&[2; 12]).expect("32 bytes");
    assert_eq!(q.try_put(&[3]), Err(PutError::Full));
    let t = Instant::now();
    assert_eq!(
        q.put_timeout(&[3], Duration::from_millis(30)),
        Err(PutError::Timeout)
    );
    assert!(t.elapsed() >= Duration::from_millis(30));
    let q = queue(1024, 2);
    q.put(b"a").expect("1");
    q.put(b"b").expect("2");
    assert_eq!(q.try_put(b"c"), Err(PutError::Full), "bounded by message count");
    assert_eq!(q.try_put_many(&[b"x"]), Err(PutError::Full));
}

fn oversized_message_is_refused_at_once() {
    let q = queue(64, 10);
    let t = Instant::now();
    assert_eq!(
        q.put(&[0; 61]),
        Err(PutError::TooLarge {
            needed: 65,
            capacity: 64
        })
    );
    assert_eq!(
        q.put_timeout(&[0; 100], Duration::from_secs(10)),
        Err(PutError::TooLarge {
            needed: 104,
            capacity: 64
        })
    );
    assert_eq!(
        q.put_many(&[[0u8; 30], [0u8; 30]]),
        Err(PutError::TooLarge {
            needed: 68,
            capacity: 64
        })
    );
    let q2 = queue(1024, 2);
    assert_eq!(
        q2.put_many(&[b"a", b"b", b"c"]),
        Err(PutError::TooLarge {
            needed: 3,
            capacity: 2
        })
    );
    assert!(t.elapsed() < Duration::from_secs(1), "refused without waiting");
    q.put(&[7; 60]).expect("exactly the capacity fits");
    assert_eq!(q.get().expect("get"), vec![7; 60]);
}

fn put_many_is_all_or_nothing() {
    let q = queue(40, 100);
    q.put(&[0; 10]).expect("14 bytes");
    // 3 × 10 = 30 more bytes would need 44: refused whole.
    assert_eq!(q.try_put_many(&[[1u8; 6], [2; 6], [3; 6]]), Err(PutError::Full));
    assert_eq!(q.len(), 1);
    q.try_put_many(&[[1u8; 6], [2; 6]]).expect("20 bytes fit");
    let mut b = Batch::new();
    assert_eq!(q.get_many(&mut b, 10, 1 << 20).expect("get_many"), 3);
    let got: Vec<&[u8]> = b.iter().collect();
    assert_eq!(got, vec![&[0u8; 10][..], &[1; 6], &[2; 6]]);
}

fn get_many_respects_count_and_byte_limits() {
    let q = queue(4096, 1000);
    for i in 0..20u8 {
        q.put(&[i; 10]).expect("put");
    }
    let mut b = Batch::new();
    assert_eq!(q.get_many(&mut b, 5, 1 << 20).expect("by count"), 5);
    assert_eq!(b.get(4), Some(&[4u8; 10][..]));
    assert_eq!(
        q.get_many(&mut b, 100, 35).expect("by bytes"),
        3,
        "30 bytes fit in 35, 40 do not"
    );
    assert_eq!(b.total_bytes(), 30);
    assert_eq!(
        q.get_many(&mut b, 100, 3).expect("one at least"),
        1,
        "a message larger than max_bytes still comes"
    );
    assert_eq!(b.get(0), Some(&[8u8; 10][..]));
    assert_eq!(q.try_get_many(&mut b, 100, 1 << 20).expect("rest"), 11);
    assert_eq!(q.try_get_many(&mut b, 100, 1 << 20), Err(GetError::Empty));
    assert_eq!(
        q.get_many_timeout(&mut b, 100, 100, Duration::from_millis(5)),
        Err(GetError::Timeout)
    );
    assert_eq!(q.get_many(&mut b, 0, 100), Ok(0));
}

fn get_timeout_returns_near_its_deadline() {
    let q = queue(1024, 10);
    for ms in [1u64, 20, 100] {
        let t = Instant::now();
        assert_eq!(q.get_timeout(Duration::from_millis(ms)), Err(GetError::Timeout));
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(ms),
            "returned early: {took:?} < {ms} ms"
        );
        // A hang guard, with the margin of a loaded 2-core machine (the process tests of this binary run beside it).
        assert!(
            took < Duration::from_millis(ms + 1_000),
            "returned late: {took:?} for {ms} ms"
        );
    }
}

fn blocked_get_wakes_on_put_from_another_thread() {
    let q = Arc::new(queue(1024, 10));
    let consumer = {
        let q = q.clone();
        thread::spawn(move || q.get_timeout(Duration::from_secs(30)))
    };
    thread::sleep(Duration::from_millis(50));
    q.put(b"wake").expect("put");
    assert_eq!(consumer.join().expect("join"), Ok(b"wake".to_vec()));
}

fn blocked_put_wakes_when_room_is_made() {
    let q = Arc::new(queue(16, 10));
    q.put(&[1; 12]).expect("fill");
    let producer = {
        let q = q.clone();
        thread::spawn(move || q.put_timeout(&[2; 12], Duration::from_secs(30)))
    };
    thread::sleep(Duration::from_millis(50));
    assert_eq!(q.get().expect("get"), vec![1; 12]);
    assert_eq!(producer.join().expect("join"), Ok(()));
    assert_eq!(q.get().expect("get"), vec![2; 12]);
}

fn close_wakes_every_waiter_and_drains() {
    let q = Arc::new(queue(16, 10));
    let getters: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || q.get())
        })
        .collect();
    let full = Arc::new(queue(16, 10));
    full.put(&[0; 12]).expect("fill");
    let putter = {
        let full = full.clone();
        thread::spawn(move || full.put(&[1; 12]))
    };
    thread::sleep(Duration::from_millis(50));
    q.close();
    full.close();
    for g in getters {
        assert_eq!(g.join().expect("join"), Err(GetError::Closed));
    }
    assert_eq!(putter.join().expect("join"), Err(PutError::Closed));
    assert!(full.is_closed());
    assert_eq!(full.try_put(b"x"), Err(PutError::Closed));
    assert_eq!(full.get().expect("drain what is left"), vec![0; 12]);
    assert_eq!(full.get(), Err(GetError::Closed));
    assert_eq!(full.try_get(), Err(GetError::Closed));
}

fn opened_handle_sees_the_same_queue() {
    let q = queue(256, 10);
    let other = Queue::open(&q.handle()).expect("open");
    q.put(b"across").expect("put");
    assert_eq!(other.len(), 1);
    assert_eq!(other.get().expect("get"), b"across".to_vec());
    other.close();
    assert!(q.is_closed());
}

fn open_rejects_a_region_that_is_not_a_queue() {
    let region = rlf_shm::Region::create(8192).expect("region");
    let handle = rlf_shm::QueueHandle {
        region: region.handle(),
        spin: Duration::ZERO,
    };
    let err = Queue::open(&handle).expect_err("not a queue");
    assert!(err.to_string().contains("is not an rlfactory queue"), "{err}");
}

fn bad_config_is_a_clear_error() {
    let err = Queue::create(QueueConfig {
        max_bytes: 2,
        ..QueueConfig::default()
    })
    .expect_err("tiny");
    assert!(err.to_string().contains("max_bytes"), "{err}");
    let err = Queue::create(QueueConfig {
        max_messages: 0,
        ..QueueConfig::default()
    })
    .expect_err("zero");
    assert!(err.to_string().contains("max_messages"), "{err}");
}

/// faster-fifo was seen returning Empty from a blocking get when several consumers race for large messages. Here
/// three consumers race for 64 KiB messages with a one-second deadline each; none may come back empty-handed while
/// messages keep arriving, and every message is received exactly once.
fn racing_consumers_of_large_messages_never_return_early() {
    const N: u32 = 300;
    let q = Arc::new(queue(256 << 10, 1000));
    let consumers: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = Vec::new();
                loop {
                    let t = Instant::now();
                    match q.get_into_timeout(&mut buf, Duration::from_secs(1)) {
                        Ok(len) => {
                            assert_eq!(len, 64 << 10);
                            let id = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
                            assert!(buf[4..].iter().all(|b| *b == id as u8), "message {id} intact");
                            got.push(id);
                        }
                        Err(GetError::Closed) => return got,
                        Err(e) => {
                            assert!(t.elapsed() >= Duration::from_secs(1), "{e} before the deadline");
                            panic!("timed out while producers were still sending");
                        }
                    }
                }
            })
        })
        .collect();
    let mut msg = vec![0u8; 64 << 10];
    for id in 0..N {
        msg[..4].copy_from_slice(&id.to_le_bytes());
        msg[4..].fill(id as u8);
        q.put(&msg).expect("put");
    }
    q.close();
    let mut all: Vec<u32> = consumers
        .into_iter()
        .flat_map(|c| c.join().expect("consumer"))
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>());
}

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u8>),
    PutMany(Vec<Vec<u8>>),
    Get,
    GetMany(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    let msg = proptest::collection::vec(any::<u8>(), 0..40);
    prop_oneof![
        msg.clone().prop_map(Op::Put),
        proptest::collection::vec(msg, 0..5).prop_map(Op::PutMany),
        Just(Op::Get),
        (1usize..6, 0usize..100).prop_map(|(n, b)| Op::GetMany(n, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Any sequence of operations on a small ring (so messages and their length prefixes wrap at every offset)
    /// behaves like a bounded VecDeque.
    fn matches_a_deque_at_every_wrap_offset(cap in 5usize..97, ops in proptest::collection::vec(op(), 1..200)) {
        let q = queue(cap, 7);
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        let mut used = 0usize;
        let mut batch = Batch::new();
        for op in ops {
            match op {
                Op::Put(m) => {
                    let need = m.len() + 4;
                    let expect = if need > cap { Err(PutError::TooLarge { needed: need, capacity: cap }) }
                        else if used + need > cap || model.len() == 7 { Err(PutError::Full) } else { Ok(()) };
                    prop_assert_eq!(q.try_put(&m), expect);
                    if expect.is_ok() { used += need; model.push_back(m); }
                }
                Op::PutMany(ms) => {
                    let need: usize = ms.iter().map(|m| m.len() + 4).sum();
                    let expect = if ms.is_empty() { Ok(()) }
                        else if need > cap { Err(PutError::TooLarge { needed: need, capacity: cap }) }
                        else if ms.len() > 7 { Err(PutError::TooLarge { needed: ms.len(), capacity: 7 }) }
                        else if used + need > cap || model.len() + ms.len() > 7 { Err(PutError::Full) } else { Ok(()) };
                    prop_assert_eq!(q.try_put_many(&ms), expect);
                    if expect.is_ok() { used += need; model.extend(ms); }
                }
                Op::Get => {
                    match model.pop_front() {
                        Some(m) => { used -= m.len() + 4; prop_assert_eq!(q.try_get(), Ok(m)); }
                        None => prop_assert_eq!(q.try_get(), Err(GetError::Empty)),
                    }
                }
                Op::GetMany(n, max_bytes) => {
                    if model.is_empty() {
                        prop_assert_eq!(q.try_get_many(&mut batch, n, max_bytes), Err(GetError::Empty));
                    } else {
                        let mut want = Vec::new();
                        let mut bytes = 0;
                        while let Some(m) = model.front() {
                            if want.len() == n || (!want.is_empty() && bytes + m.len() > max_bytes) { break; }
                            bytes += m.len();
                            used -= m.len() + 4;
                            want.push(model.pop_front().expect("front exists"));
                        }
                        prop_assert_eq!(q.try_get_many(&mut batch, n, max_bytes), Ok(want.len()));
                        let got: Vec<Vec<u8>> = batch.iter().map(<[u8]>::to_vec).collect();
                        prop_assert_eq!(got, want);
                    }
                }
            }
            prop_assert_eq!(q.len(), model.len());
            prop_assert_eq!(q.used_bytes(), used);
        }
    }
}

/// A queue whose consumer keeps up writes into the first pages of its ring again and again: 64 MiB of messages
/// through a 32 MiB ring that never holds more than one leave under 1 MiB of it allocated in `/dev/shm` (a ring
/// written end to end would have all 32).
fn a_queue_that_keeps_emptying_touches_only_the_start_of_its_ring() {
    let me = std::process::id();
    let before = rlf_shm::region::segments_of(me).expect("list /dev/shm");
    let q = queue(32 << 20, usize::MAX >> 1);
    let mine: Vec<String> = rlf_shm::region::segments_of(me)
        .expect("list /dev/shm")
        .into_iter()
        .filter(|s| !before.contains(s))
        .collect();
    let message = vec![7u8; 4096];
    for _ in 0..(64 << 20) / message.len() {
        q.put(&message).expect("put");
        assert_eq!(q.get().expect("get"), message);
    }
    use std::os::unix::fs::MetadataExt;
    let allocated: u64 = mine
        .iter()
        .filter_map(|name| std::fs::metadata(format!("/dev/shm/{name}")).ok())
        // This queue's ring (other tests' segments are smaller).
        .filter(|m| m.len() >= 32 << 20)
        .map(|m| m.blocks() * 512)
        .sum();
    assert!(
        mine.iter()
            .filter_map(|name| std::fs::metadata(format!("/dev/shm/{name}")).ok())
            .any(|m| m.len() >= 32 << 20),
        "no segment of the queue found"
    );
    assert!(allocated < 1 << 20, "{allocated} bytes of the ring allocated");
}

/// This module's tests, each named `queue_semantics::<function>` as the standard harness names it.
pub fn trials() -> Vec<Trial> {
    macro_rules! trials {
        ($($test:ident),+ $(,)?) => {
            vec![$(Trial::test(concat!("queue_semantics::", stringify!($test)), || {
                $test();
                Ok(())
            })),+]
        };
    }
    trials![
        put_get_in_order_and_len,
        empty_messages_are_messages,
        full_by_bytes_and_by_count,
        oversized_message_is_refused_at_once,
        put_many_is_all_or_nothing,
        get_many_respects_count_and_byte_limits,
        get_timeout_returns_near_its_deadline,
        blocked_get_wakes_on_put_from_another_thread,
        blocked_put_wakes_when_room_is_made,
        close_wakes_every_waiter_and_drains,
        opened_handle_sees_the_same_queue,
        open_rejects_a_region_that_is_not_a_queue,
        bad_config_is_a_clear_error,
        racing_consumers_of_large_messages_never_return_early,
        matches_a_deque_at_every_wrap_offset,
        a_queue_that_keeps_emptying_touches_only_the_start_of_its_ring,
    ]
}
