//! RANDOMKEY, SRANDMEMBER, HRANDFIELD and ZRANDMEMBER draw uniformly: exactly (a random index, walked to)
//! for stores up to 4,096 keys and collections up to 4,096 elements, and close to it above
//! (a random walk down the byte trie of the keys, then one of the 64 keys from there on; see
//! proto/SPEC.md for the limits); ZRANDMEMBER exactly at any size (a random rank, looked up in
//! the sorted set's rank directory). The counts asserted are many standard deviations wide: a
//! uniform picker fails them with negligible probability, the biased pickers they replace
//! (one member `a` beside 1,000 `b:` members drawn half the time) fail them every time.
//!
//! Invariants: every read has a timeout (the client's); nothing depends on timing; each test
//! stops only the server it started.

mod common;

use std::collections::HashMap;

use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
const DRAWS: usize = 20_000;

fn server() -> (Server, Resp) {
    let s = Server::start_with(
        BIN,
        Options {
            resp: true,
            ..Options::default()
        },
    );
    let r = Resp::connect(s.resp_addr().expect("a RESP port"));
    (s, r)
}

/// `DRAWS` replies to `args`, pipelined, as their bulk strings.
fn draws(r: &mut Resp, args: &[&[u8]]) -> Vec<Vec<u8>> {
    for _ in 0..DRAWS {
        r.send(args);
    }
    (0..DRAWS)
        .map(|_| match r.read() {
            Reply::Bulk(Some(b)) => b,
            other => panic!("{args:?}: expected a bulk, got {other:?}"),
        })
        .collect()
}

/// `a` plus `b:0`..`b:999`, added with `cmd` (SADD, or HSET with a value per field).
fn fill(r: &mut Resp, cmd: &str, key: &str, with_values: bool) {
    let mut names: Vec<String> = vec!["a".into()];
    names.extend((0..1000).map(|i| format!("b:{i}")));
    let mut args: Vec<Vec<u8>> = vec![cmd.into(), key.into()];
    for n in names {
        args.push(n.into_bytes());
        if with_values {
            args.push(b"v".to_vec());
        }
    }
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    assert_eq!(r.call(&refs), Reply::Int(1001));
}

/// Checks draws from {a, b:0..b:999}: `a` near 20 of 20,000, each hundred of `b:` near 2,000.
fn check_members(picks: &[Vec<u8>]) {
    let mut a = 0;
    let mut buckets = [0usize; 10];
    for p in picks {
        if p == b"a" {
            a += 1;
            continue;
        }
        let n: usize = std::str::from_utf8(&p[2..])
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("not a member: {p:?}"));
        buckets[n / 100] += 1;
    }
    // Expected 19.98 (sd 4.5) and 1,998 (sd 42).
    assert!(a <= 60, "`a` drawn {a} times of {DRAWS}");
    for (i, &b) in buckets.iter().enumerate() {
        assert!(
            (1700..=2300).contains(&b),
            "b:{i}00..: {b} draws: {buckets:?}"
        );
    }
}

#[test]
fn srandmember_and_hrandfield_are_uniform() {
    let (_s, mut r) = server();
    fill(&mut r, "SADD", "s", false);
    check_members(&draws(&mut r, &[b"SRANDMEMBER", b"s"]));
    fill(&mut r, "HSET", "h", true);
    check_members(&draws(&mut r, &[b"HRANDFIELD", b"h"]));
    // Counts draw without repeats from the same uniform picks.
    let mut r2 = Vec::new();
    for _ in 0..DRAWS / 10 {
        match r.cmd("SRANDMEMBER s 10") {
            Reply::Array(Some(items)) => {
                assert_eq!(items.len(), 10);
                for i in items {
                    if let Reply::Bulk(Some(b)) = i {
                        r2.push(b);
                    }
                }
            }
            other => panic!("SRANDMEMBER s 10: {other:?}"),
        }
    }
    check_members(&r2);
}

#[test]
fn randomkey_is_uniform() {
    let (_s, mut r) = server();
    for i in 0..10 {
        assert_eq!(r.cmd(&format!("SET key:{i} v")), Reply::Simple("OK".into()));
    }
    let mut counts: HashMap<Vec<u8>, usize> = HashMap::new();
    for k in draws(&mut r, &[b"RANDOMKEY"]) {
        *counts.entry(k).or_default() += 1;
    }
    assert_eq!(counts.len(), 10, "{counts:?}");
    for (k, n) in &counts {
        // Expected 2,000 (sd 42).
        assert!((1700..=2300).contains(n), "{k:?}: {n}");
    }
}

#[test]
fn randomkey_above_the_exact_walk_stays_close() {
    let (mut s, mut r) = server();
    for chunk in 0..10 {
        let mut args: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
        for i in chunk * 500..(chunk + 1) * 500 {
            args.push(format!("user:{i:05}").into_bytes());
            args.push(b"v".to_vec());
        }
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        assert_eq!(r.call(&refs), Reply::Simple("OK".into()));
    }
    // A clean stop commits every key to LMDB: the steady state, with no overlay.
    s.restart();
    let mut r = Resp::connect(s.resp_addr().expect("a RESP port"));
    let mut buckets = [0usize; 10];
    for k in draws(&mut r, &[b"RANDOMKEY"]) {
        let n: usize = std::str::from_utf8(&k[5..])
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("not a key: {k:?}"));
        buckets[n / 500] += 1;
    }
    // Keys of one shape come out close to uniform (2,000 a bucket, sd 42). Keys of different
    // shapes do not: a lone key beside them takes half the trie's draws and passes them on to
    // the 64 keys after it (proto/SPEC.md).
    for (i, &b) in buckets.iter().enumerate() {
        assert!((1600..=2400).contains(&b), "user:{i}...: {b}: {buckets:?}");
    }
}

/// Picks from a call's array reply of members (no scores).
fn array_picks(r: &mut Resp, cmd: &str, calls: usize, each: usize) -> Vec<Vec<u8>> {
    let mut picks = Vec::new();
    for _ in 0..calls {
        match r.cmd(cmd) {
            Reply::Array(Some(items)) => {
                assert_eq!(items.len(), each, "{cmd}");
                for i in items {
                    match i {
                        Reply::Bulk(Some(b)) => picks.push(b),
                        other => panic!("{cmd}: {other:?}"),
                    }
                }
            }
            other => panic!("{cmd}: {other:?}"),
        }
    }
    picks
}

#[test]
fn zrandmember_is_uniform_for_small_and_large_sets() {
    let (_s, mut r) = server();
    // Small (1,001 members): one walk.
    let mut args: Vec<Vec<u8>> = vec![b"ZADD".to_vec(), b"z".to_vec()];
    for (i, m) in std::iter::once("a".to_string())
        .chain((0..1000).map(|i| format!("b:{i}")))
        .enumerate()
    {
        args.push(i.to_string().into_bytes());
        args.push(m.into_bytes());
    }
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    assert_eq!(r.call(&refs), Reply::Int(1001));
    check_members(&draws(&mut r, &[b"ZRANDMEMBER", b"z"]));
    check_members(&array_picks(&mut r, "ZRANDMEMBER z 10", DRAWS / 10, 10));
    check_members(&array_picks(&mut r, "ZRANDMEMBER z -10", DRAWS / 10, 10));
    // Large (10,001 members of unequal shapes, where a walk down the byte trie would draw
    // `a` about 1 time in 128): random ranks from the rank directory.
    let mut args: Vec<Vec<u8>> = vec![
        b"ZADD".to_vec(),
        b"big".to_vec(),
        b"0".to_vec(),
        b"a".to_vec(),
    ];
    for i in 0..10_000 {
        args.push(i.to_string().into_bytes());
        args.push(format!("b:{i}").into_bytes());
    }
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    assert_eq!(r.call(&refs), Reply::Int(10_001));
    let check_big = |picks: &[Vec<u8>]| {
        let mut a = 0;
        let mut buckets = [0usize; 10];
        for p in picks {
            if p == b"a" {
                a += 1;
                continue;
            }
            let n: usize = std::str::from_utf8(&p[2..])
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("not a member: {p:?}"));
            buckets[n / 1000] += 1;
        }
        // Expected 2 (sd 1.4) and 2,000 (sd 42).
        assert!(a <= 15, "`a` drawn {a} times of {}", picks.len());
        for (i, &b) in buckets.iter().enumerate() {
            assert!(
                (1700..=2300).contains(&b),
                "b:{i}000..: {b} draws: {buckets:?}"
            );
        }
    };
    check_big(&draws(&mut r, &[b"ZRANDMEMBER", b"big"]));
    check_big(&array_picks(&mut r, "ZRANDMEMBER big 10", DRAWS / 10, 10));
    check_big(&array_picks(&mut r, "ZRANDMEMBER big -10", DRAWS / 10, 10));
    // Distinct picks are distinct.
    let picks = array_picks(&mut r, "ZRANDMEMBER big 30", 1, 30);
    let set: std::collections::HashSet<&Vec<u8>> = picks.iter().collect();
    assert_eq!(set.len(), 30);
}
