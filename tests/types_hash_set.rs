//! Hashes and sets over RESP: every command's replies (RESP2 and RESP3 shapes), WRONGTYPE in
//! both directions (and over the memcached port), empty collections disappearing, O(1) DEL of a
//! big hash, persistence across a restart, and a seeded model test comparing 2,000 random
//! operations against an in-test reference model.
//!
//! Invariants: every socket has a read timeout, so a missing reply fails instead of hanging;
//! no assertion depends on timing; the random operations are deterministic (fixed seed), only
//! the server's own random picks (SPOP, SRANDMEMBER, HRANDFIELD) vary, and those are checked
//! for membership and size, not for which elements came back.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
const IO_TIMEOUT: Duration = Duration::from_secs(30);
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

// ---------------------------------------------------------------------------------------------
// A tiny RESP2/RESP3 client

#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// RESP2 null bulk/array or RESP3 null.
    Nil,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Double(String),
}

use Reply::{Array, Bulk, Error, Int, Nil, Simple};

fn b(s: &str) -> Reply {
    Bulk(s.as_bytes().to_vec())
}

fn bulks(items: &[&str]) -> Reply {
    Array(items.iter().map(|s| b(s)).collect())
}

fn err(s: &str) -> Reply {
    Error(s.to_string())
}

fn ok() -> Reply {
    Simple("OK".into())
}

struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        Client {
            w: s.try_clone().unwrap(),
            r: BufReader::new(s),
        }
    }

    fn send(&mut self, args: &[&[u8]]) {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend(format!("${}\r\n", a.len()).into_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&out).expect("write request");
    }

    /// Sends `args` and reads one reply.
    fn call(&mut self, args: &[&[u8]]) -> Reply {
        self.send(args);
        self.read()
    }

    /// Sends a command split on spaces and reads one reply.
    fn c(&mut self, line: &str) -> Reply {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        self.call(&args)
    }

    fn line(&mut self) -> Vec<u8> {
        let mut l = Vec::new();
        self.r.read_until(b'\n', &mut l).expect("read reply line");
        assert!(l.ends_with(b"\r\n"), "truncated reply line {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    fn read(&mut self) -> Reply {
        let l = self.line();
        let (t, rest) = (l[0], String::from_utf8_lossy(&l[1..]).into_owned());
        let n = || rest.parse::<i64>().expect("length");
        match t {
            b'+' => Simple(rest),
            b'-' => Error(rest),
            b':' => Int(n()),
            b',' => Reply::Double(rest),
            b'_' => Nil,
            b'$' if n() < 0 => Nil,
            b'$' => {
                let mut v = vec![0; n() as usize + 2];
                self.r.read_exact(&mut v).expect("read bulk");
                v.truncate(n() as usize);
                Bulk(v)
            }
            b'*' if n() < 0 => Nil,
            b'*' => Array((0..n()).map(|_| self.read()).collect()),
            b'~' => Reply::Set((0..n()).map(|_| self.read()).collect()),
            b'%' => Reply::Map((0..n()).map(|_| (self.read(), self.read())).collect()),
            _ => panic!("unexpected reply line {:?}", String::from_utf8_lossy(&l)),
        }
    }
}

fn start() -> Server {
    Server::start_with(
        BIN,
        Options {
            resp: true,
            ..Default::default()
        },
    )
}

fn client(s: &Server) -> Client {
    Client::connect(s.resp_addr().expect("RESP port"))
}

/// The members of an array or set reply, sorted.
fn sorted(r: Reply) -> Vec<Vec<u8>> {
    let items = match r {
        Array(v) | Reply::Set(v) => v,
        other => panic!("not an array: {other:?}"),
    };
    let mut out: Vec<Vec<u8>> = items
        .into_iter()
        .map(|i| match i {
            Bulk(b) => b,
            other => panic!("not a bulk: {other:?}"),
        })
        .collect();
    out.sort();
    out
}

fn array(r: Reply) -> Vec<Reply> {
    match r {
        Array(v) => v,
        other => panic!("not an array: {other:?}"),
    }
}

fn bytes(r: Reply) -> Vec<u8> {
    match r {
        Bulk(b) => b,
        other => panic!("not a bulk: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Per-command replies

#[test]
fn hash_commands_reply_like_redis() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(
        c.c("HSET h f"),
        err("ERR wrong number of arguments for 'hset' command")
    );
    assert_eq!(
        c.c("HSET h f v g"),
        err("ERR wrong number of arguments for 'hset' command")
    );
    assert_eq!(c.c("HSET h f v g w"), Int(2));
    assert_eq!(c.c("HSET h f v2 n x"), Int(1));
    assert_eq!(c.c("HSET h f v3 f v4"), Int(0));
    assert_eq!(c.c("HGET h f"), b("v4"));
    assert_eq!(c.c("HSETNX h f nope"), Int(0));
    assert_eq!(c.c("HSETNX h z 26"), Int(1));
    assert_eq!(
        c.c("HMSET h a"),
        err("ERR wrong number of arguments for 'hmset' command")
    );
    assert_eq!(c.c("HMSET h a 1 b 2"), ok());
    assert_eq!(c.c("HGET h nope"), Nil);
    assert_eq!(c.c("HGET missing f"), Nil);
    assert_eq!(c.c("HMGET h a nope b"), Array(vec![b("1"), Nil, b("2")]));
    assert_eq!(c.c("HMGET missing a"), Array(vec![Nil]));
    assert_eq!(c.c("HLEN h"), Int(6));
    assert_eq!(c.c("HLEN missing"), Int(0));
    assert_eq!(
        c.c("HGETALL h"),
        bulks(&["a", "1", "b", "2", "f", "v4", "g", "w", "n", "x", "z", "26"])
    );
    assert_eq!(c.c("HGETALL missing"), Array(vec![]));
    assert_eq!(c.c("HKEYS h"), bulks(&["a", "b", "f", "g", "n", "z"]));
    assert_eq!(c.c("HVALS h"), bulks(&["1", "2", "v4", "w", "x", "26"]));
    assert_eq!(c.c("HKEYS missing"), Array(vec![]));
    assert_eq!(c.c("HEXISTS h a"), Int(1));
    assert_eq!(c.c("HEXISTS h q"), Int(0));
    assert_eq!(c.c("HEXISTS missing a"), Int(0));
    assert_eq!(c.c("HSTRLEN h f"), Int(2));
    assert_eq!(c.c("HSTRLEN h q"), Int(0));
    assert_eq!(c.c("HDEL h q"), Int(0));
    assert_eq!(c.c("HDEL h g n q g"), Int(2));
    assert_eq!(c.c("HDEL missing a"), Int(0));
    assert_eq!(c.c("HLEN h"), Int(4));

    // HINCRBY
    assert_eq!(c.c("HINCRBY h i 5"), Int(5));
    assert_eq!(c.c("HINCRBY h i -7"), Int(-2));
    assert_eq!(
        c.c("HINCRBY h f 1"),
        err("ERR hash value is not an integer")
    );
    assert_eq!(
        c.c("HINCRBY h i x"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.c("HSET h big 9223372036854775806"), Int(1));
    assert_eq!(c.c("HINCRBY h big 1"), Int(i64::MAX));
    assert_eq!(
        c.c("HINCRBY h big 1"),
        err("ERR increment or decrement would overflow")
    );
    assert_eq!(c.c("HSET h lz 01"), Int(1));
    assert_eq!(
        c.c("HINCRBY h lz 1"),
        err("ERR hash value is not an integer")
    );
    assert_eq!(c.c("HINCRBY newh c 3"), Int(3));
    assert_eq!(c.c("HLEN newh"), Int(1));

    // HINCRBYFLOAT
    assert_eq!(c.c("HINCRBYFLOAT h fl 10.5"), b("10.5"));
    assert_eq!(c.c("HINCRBYFLOAT h fl 0.1"), b("10.6"));
    // Redis's answer too: 10.6 is not exact in a long double, and 17 decimals show it.
    assert_eq!(c.c("HINCRBYFLOAT h fl -5e3"), b("-4989.39999999999999991"));
    assert_eq!(c.c("HINCRBYFLOAT h lz 1"), b("2"));
    assert_eq!(c.c("HINCRBYFLOAT h i 2.5"), b("0.5"));
    assert_eq!(
        c.c("HINCRBYFLOAT h f 1"),
        err("ERR hash value is not a float")
    );
    assert_eq!(
        c.c("HINCRBYFLOAT h fl abc"),
        err("ERR value is not a valid float")
    );
    assert_eq!(
        c.c("HINCRBYFLOAT h fl inf"),
        err("ERR value is NaN or Infinity")
    );
    // A long double (as Redis adds in) holds twice the largest double, but not twice its own.
    assert_eq!(c.c("HSET h huge 1e4932"), Int(1));
    assert_eq!(
        c.c("HINCRBYFLOAT h huge 1e4932"),
        err("ERR increment would produce NaN or Infinity")
    );
    assert_eq!(c.c("HGET h huge"), b("1e4932"));

    // HRANDFIELD
    assert_eq!(c.c("HRANDFIELD missing"), Nil);
    assert_eq!(c.c("HRANDFIELD missing 3"), Array(vec![]));
    assert_eq!(c.c("HRANDFIELD h 0"), Array(vec![]));
    assert_eq!(
        c.c("HRANDFIELD h x"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.c("HRANDFIELD h 1 withvalues x"), err("ERR syntax error"));
    assert_eq!(c.c("HRANDFIELD h 1 novalues"), err("ERR syntax error"));
    assert_eq!(c.c("HDEL newh c"), Int(1));
    c.c("HSET r a 1 b 2 c 3");
    let one = bytes(c.c("HRANDFIELD r"));
    assert!([&b"a"[..], b"b", b"c"].contains(&&one[..]), "{one:?}");
    assert_eq!(
        sorted(c.c("HRANDFIELD r 10")),
        vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
    );
    let two = sorted(c.c("HRANDFIELD r 2"));
    assert_eq!(two.len(), 2);
    assert_ne!(two[0], two[1]);
    let pairs = array(c.c("HRANDFIELD r -5 WITHVALUES"));
    assert_eq!(pairs.len(), 10);
    for p in pairs.chunks(2) {
        let (f, v) = (bytes(p[0].clone()), bytes(p[1].clone()));
        assert_eq!(v, [f[0] - b'a' + b'1'], "field {f:?} value {v:?}");
    }
    assert_eq!(array(c.c("HRANDFIELD r -7")).len(), 7);
    assert_eq!(
        c.c("HRANDFIELD r -2000000"),
        err("ERR memkeep: count out of range (at most 1000000 repeated picks)")
    );

    // Field length limit.
    let long = "f".repeat(496);
    assert_eq!(
        c.call(&[b"HSET", b"h", long.as_bytes(), b"v"]),
        err("ERR memkeep: field longer than 495 bytes")
    );
    assert_eq!(
        c.call(&[b"HINCRBY", b"h", long.as_bytes(), b"1"]),
        err("ERR memkeep: field longer than 495 bytes")
    );
    assert_eq!(c.call(&[b"HGET", b"h", long.as_bytes()]), Nil);
    assert_eq!(c.call(&[b"HEXISTS", b"h", long.as_bytes()]), Int(0));
    assert_eq!(c.call(&[b"HDEL", b"h", long.as_bytes()]), Int(0));
    let max = "f".repeat(495);
    assert_eq!(c.call(&[b"HSET", b"h", max.as_bytes(), b"v"]), Int(1));
    assert_eq!(c.call(&[b"HGET", b"h", max.as_bytes()]), b("v"));

    // Binary-safe fields and values, empty ones included.
    assert_eq!(
        c.call(&[b"HSET", b"bin", b"", b"\x00\r\n", b"\xff", b""]),
        Int(2)
    );
    assert_eq!(
        c.c("HGETALL bin"),
        Array(vec![
            Bulk(vec![]),
            Bulk(b"\x00\r\n".to_vec()),
            Bulk(vec![0xff]),
            Bulk(vec![])
        ])
    );
    assert_eq!(c.c("TYPE bin"), Simple("hash".into()));
}

#[test]
fn set_commands_reply_like_redis() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(
        c.c("SADD s"),
        err("ERR wrong number of arguments for 'sadd' command")
    );
    assert_eq!(c.c("SADD s b a b"), Int(2));
    assert_eq!(c.c("SADD s c a"), Int(1));
    assert_eq!(c.c("SCARD s"), Int(3));
    assert_eq!(c.c("SCARD missing"), Int(0));
    assert_eq!(c.c("SMEMBERS s"), bulks(&["a", "b", "c"]));
    assert_eq!(c.c("SMEMBERS missing"), Array(vec![]));
    assert_eq!(c.c("SISMEMBER s a"), Int(1));
    assert_eq!(c.c("SISMEMBER s z"), Int(0));
    assert_eq!(c.c("SISMEMBER missing a"), Int(0));
    assert_eq!(
        c.c("SMISMEMBER s a z c"),
        Array(vec![Int(1), Int(0), Int(1)])
    );
    assert_eq!(c.c("SMISMEMBER missing a"), Array(vec![Int(0)]));
    assert_eq!(c.c("SREM s z"), Int(0));
    assert_eq!(c.c("SREM s a z a"), Int(1));
    assert_eq!(c.c("SREM missing a"), Int(0));
    assert_eq!(c.c("TYPE s"), Simple("set".into()));

    // SPOP
    assert_eq!(c.c("SPOP missing"), Nil);
    assert_eq!(c.c("SPOP missing 2"), Array(vec![]));
    let positive = "ERR value is out of range, must be positive";
    assert_eq!(c.c("SPOP s -1"), err(positive));
    assert_eq!(c.c("SPOP s x"), err(positive));
    assert_eq!(c.c("SPOP s 1 2"), err("ERR syntax error"));
    assert_eq!(c.c("SPOP s 0"), Array(vec![]));
    c.c("SADD p 1 2 3 4 5 6 7 8 9 10");
    let one = bytes(c.c("SPOP p"));
    assert_eq!(c.call(&[b"SISMEMBER", b"p", &one]), Int(0));
    assert_eq!(c.c("SCARD p"), Int(9));
    let three = sorted(c.c("SPOP p 3"));
    assert_eq!(three.len(), 3);
    assert!(three.windows(2).all(|w| w[0] != w[1]));
    assert_eq!(c.c("SCARD p"), Int(6));
    let rest = sorted(c.c("SPOP p 100"));
    assert_eq!(rest.len(), 6);
    assert_eq!(c.c("EXISTS p"), Int(0));
    let mut all: Vec<Vec<u8>> = [vec![one], three, rest].concat();
    all.sort();
    let mut want: Vec<Vec<u8>> = (1..=10).map(|i| i.to_string().into_bytes()).collect();
    want.sort();
    assert_eq!(all, want);

    // SRANDMEMBER
    assert_eq!(c.c("SRANDMEMBER missing"), Nil);
    assert_eq!(c.c("SRANDMEMBER missing 3"), Array(vec![]));
    assert_eq!(c.c("SRANDMEMBER missing -3"), Array(vec![]));
    assert_eq!(
        c.c("SRANDMEMBER s x"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.c("SRANDMEMBER s 1 2"), err("ERR syntax error"));
    assert_eq!(c.c("SRANDMEMBER s 0"), Array(vec![]));
    assert_eq!(c.c("SRANDMEMBER s 5"), bulks(&["b", "c"]));
    let pick = bytes(c.c("SRANDMEMBER s"));
    assert!(pick == b"b" || pick == b"c");
    let reps = sorted(c.c("SRANDMEMBER s -9"));
    assert_eq!(reps.len(), 9);
    assert!(reps.iter().all(|m| m == b"b" || m == b"c"));
    assert_eq!(c.c("SCARD s"), Int(2));

    // SMOVE
    assert_eq!(c.c("SMOVE s d b"), Int(1));
    assert_eq!(c.c("SMOVE s d b"), Int(0));
    assert_eq!(c.c("SMOVE missing d b"), Int(0));
    assert_eq!(c.c("SMEMBERS d"), bulks(&["b"]));
    assert_eq!(c.c("SMOVE s s c"), Int(1));
    assert_eq!(c.c("SMOVE s s q"), Int(0));
    c.c("SADD d c");
    assert_eq!(c.c("SMOVE s d c"), Int(1));
    assert_eq!(c.c("EXISTS s"), Int(0));
    assert_eq!(c.c("SMEMBERS d"), bulks(&["b", "c"]));
    assert_eq!(c.c("SCARD d"), Int(2));

    // SINTER / SUNION / SDIFF and their STORE forms.
    c.c("SADD a 1 2 3 4");
    c.c("SADD b 3 4 5");
    c.c("SADD c 4 5 6");
    assert_eq!(c.c("SINTER a b"), bulks(&["3", "4"]));
    assert_eq!(c.c("SINTER a b c"), bulks(&["4"]));
    assert_eq!(c.c("SINTER a missing"), Array(vec![]));
    assert_eq!(c.c("SINTER a"), bulks(&["1", "2", "3", "4"]));
    assert_eq!(c.c("SUNION a b c"), bulks(&["1", "2", "3", "4", "5", "6"]));
    assert_eq!(c.c("SUNION missing b"), bulks(&["3", "4", "5"]));
    assert_eq!(c.c("SDIFF a b"), bulks(&["1", "2"]));
    assert_eq!(c.c("SDIFF a b c missing"), bulks(&["1", "2"]));
    assert_eq!(c.c("SDIFF missing a"), Array(vec![]));
    assert_eq!(c.c("SDIFF a a"), Array(vec![]));
    assert_eq!(c.c("SINTERSTORE out a b"), Int(2));
    assert_eq!(c.c("SMEMBERS out"), bulks(&["3", "4"]));
    assert_eq!(c.c("SUNIONSTORE out a c"), Int(6));
    assert_eq!(c.c("SCARD out"), Int(6));
    assert_eq!(c.c("SDIFFSTORE out a b"), Int(2));
    assert_eq!(c.c("SMEMBERS out"), bulks(&["1", "2"]));
    // The destination may be a source.
    assert_eq!(c.c("SUNIONSTORE a a c"), Int(6));
    assert_eq!(c.c("SMEMBERS a"), bulks(&["1", "2", "3", "4", "5", "6"]));
    // An empty result deletes the destination.
    assert_eq!(c.c("SINTERSTORE out a missing"), Int(0));
    assert_eq!(c.c("EXISTS out"), Int(0));
    // The destination is replaced whatever it held.
    c.c("SET str v");
    assert_eq!(c.c("SINTERSTORE str b"), Int(3));
    assert_eq!(c.c("TYPE str"), Simple("set".into()));
    c.c("HSET hd f v");
    assert_eq!(c.c("SDIFFSTORE hd b"), Int(3));
    assert_eq!(c.c("SMEMBERS hd"), bulks(&["3", "4", "5"]));
    c.c("RPUSH ld x");
    assert_eq!(c.c("SDIFFSTORE ld missing"), Int(0));
    assert_eq!(c.c("EXISTS ld"), Int(0));

    // SINTERCARD
    assert_eq!(c.c("SINTERCARD 2 b c"), Int(2));
    assert_eq!(c.c("SINTERCARD 2 b c LIMIT 1"), Int(1));
    assert_eq!(c.c("SINTERCARD 2 b c LIMIT 0"), Int(2));
    assert_eq!(c.c("SINTERCARD 2 b missing"), Int(0));
    assert_eq!(
        c.c("SINTERCARD 2 b c LIMIT -1"),
        err("ERR LIMIT can't be negative")
    );
    assert_eq!(
        c.c("SINTERCARD 0 b"),
        err("ERR numkeys should be greater than 0")
    );
    assert_eq!(
        c.c("SINTERCARD 3 b c"),
        err("ERR Number of keys can't be greater than number of args")
    );
    assert_eq!(c.c("SINTERCARD 1 b c"), err("ERR syntax error"));

    // Member length limit.
    let long = "m".repeat(496);
    assert_eq!(
        c.call(&[b"SADD", b"s2", long.as_bytes()]),
        err("ERR memkeep: member longer than 495 bytes")
    );
    assert_eq!(c.call(&[b"SISMEMBER", b"b", long.as_bytes()]), Int(0));
    assert_eq!(c.call(&[b"SREM", b"b", long.as_bytes()]), Int(0));
    assert_eq!(c.call(&[b"SMOVE", b"b", b"c", long.as_bytes()]), Int(0));
    assert_eq!(c.c("EXISTS s2"), Int(0));
}

#[test]
fn scans_return_every_element_once() {
    let s = start();
    let mut c = client(&s);
    let mut args: Vec<Vec<u8>> = vec![b"HSET".to_vec(), b"h".to_vec()];
    let mut sargs: Vec<Vec<u8>> = vec![b"SADD".to_vec(), b"s".to_vec()];
    for i in 0..100 {
        args.push(format!("f{i}").into_bytes());
        args.push(format!("v{i}").into_bytes());
        sargs.push(format!("m{i}").into_bytes());
    }
    let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
    assert_eq!(c.call(&refs), Int(100));
    let refs: Vec<&[u8]> = sargs.iter().map(|a| &a[..]).collect();
    assert_eq!(c.call(&refs), Int(100));

    let mut cursor = "0".to_string();
    let mut seen = BTreeMap::new();
    let mut calls = 0;
    loop {
        let r = array(c.c(&format!("HSCAN h {cursor} COUNT 7")));
        let items = array(r[1].clone());
        assert!(items.len() <= 14);
        for p in items.chunks(2) {
            let f = String::from_utf8(bytes(p[0].clone())).unwrap();
            let v = String::from_utf8(bytes(p[1].clone())).unwrap();
            assert_eq!(v, f.replacen('f', "v", 1));
            assert!(seen.insert(f, v).is_none(), "field returned twice");
        }
        cursor = String::from_utf8(bytes(r[0].clone())).unwrap();
        calls += 1;
        assert!(calls < 100, "HSCAN does not end");
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), 100);

    // SSCAN with MATCH: only matching members, every one of them.
    let mut cursor = "0".to_string();
    let mut found = BTreeSet::new();
    loop {
        let r = array(c.c(&format!("SSCAN s {cursor} MATCH m1*")));
        for m in array(r[1].clone()) {
            assert!(found.insert(bytes(m)));
        }
        cursor = String::from_utf8(bytes(r[0].clone())).unwrap();
        if cursor == "0" {
            break;
        }
    }
    let want: BTreeSet<Vec<u8>> = std::iter::once(b"m1".to_vec())
        .chain((10..20).map(|i| format!("m{i}").into_bytes()))
        .collect();
    assert_eq!(found, want);

    assert_eq!(c.c("HSCAN missing 0"), Array(vec![b("0"), Array(vec![])]));
    assert_eq!(c.c("HSCAN h x"), err("ERR invalid cursor"));
    assert_eq!(c.c("HSCAN h 0 COUNT 0"), err("ERR syntax error"));
    assert_eq!(
        c.c("HSCAN h 0 COUNT x"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.c("HSCAN h 0 TYPE string"), err("ERR syntax error"));
    assert_eq!(c.c("SSCAN h 0"), err(WRONGTYPE));
    assert_eq!(c.c("HSCAN s 0"), err(WRONGTYPE));
    assert_eq!(c.c("SSCAN s 0 COUNT 1000"), {
        let mut m: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
        m.sort();
        let refs: Vec<&str> = m.iter().map(String::as_str).collect();
        Array(vec![b("0"), bulks(&refs)])
    });
}

// ---------------------------------------------------------------------------------------------
// Types, emptiness, DEL, persistence, RESP3

#[test]
fn wrong_type_both_ways() {
    let s = start();
    let mut c = client(&s);
    c.c("SET str v");
    c.c("RPUSH list a");
    c.c("HSET hash f v");
    c.c("SADD set m");
    let wrong = err(WRONGTYPE);
    for key in ["str", "list", "set"] {
        for cmd in [
            "HSET {} f v",
            "HSETNX {} f v",
            "HMSET {} f v",
            "HGET {} f",
            "HMGET {} f",
            "HDEL {} f",
            "HGETALL {}",
            "HKEYS {}",
            "HVALS {}",
            "HLEN {}",
            "HEXISTS {} f",
            "HINCRBY {} f 1",
            "HINCRBYFLOAT {} f 1",
            "HSTRLEN {} f",
            "HSCAN {} 0",
            "HRANDFIELD {}",
        ] {
            assert_eq!(c.c(&cmd.replace("{}", key)), wrong, "{cmd} on {key}");
        }
    }
    for key in ["str", "list", "hash"] {
        for cmd in [
            "SADD {} m",
            "SREM {} m",
            "SMEMBERS {}",
            "SISMEMBER {} m",
            "SMISMEMBER {} m",
            "SCARD {}",
            "SPOP {}",
            "SPOP {} 2",
            "SRANDMEMBER {}",
            "SRANDMEMBER {} 2",
            "SMOVE {} set m",
            "SMOVE set {} m",
            "SINTER set {}",
            "SUNION {} set",
            "SDIFF set {}",
            "SINTERSTORE dst set {}",
            "SUNIONSTORE dst {}",
            "SDIFFSTORE dst set {}",
            "SINTERCARD 2 set {}",
            "SSCAN {} 0",
        ] {
            assert_eq!(c.c(&cmd.replace("{}", key)), wrong, "{cmd} on {key}");
        }
    }
    // The other way round: string and list commands on a hash or a set.
    for key in ["hash", "set"] {
        assert_eq!(c.c(&format!("GET {key}")), wrong);
        assert_eq!(c.c(&format!("LPUSH {key} x")), wrong);
        assert_eq!(c.c(&format!("INCR {key}")), wrong);
        assert_eq!(c.c(&format!("APPEND {key} x")), wrong);
    }
    // Nothing was changed by the refused commands.
    assert_eq!(c.c("GET str"), b("v"));
    assert_eq!(c.c("LRANGE list 0 -1"), bulks(&["a"]));
    assert_eq!(c.c("HGETALL hash"), bulks(&["f", "v"]));
    assert_eq!(c.c("SMEMBERS set"), bulks(&["m"]));
    assert_eq!(c.c("EXISTS dst"), Int(0));

    // memcached's get on a hash or a set key.
    let mut m = Server::connect_to(s.addr()).expect("memcached connection");
    let mut r = BufReader::new(m.try_clone().unwrap());
    for key in ["hash", "set"] {
        m.write_all(format!("get {key}\r\n").as_bytes()).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(
            line,
            "CLIENT_ERROR WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
        );
    }
}

#[test]
fn empty_collections_disappear() {
    let s = start();
    let mut c = client(&s);
    c.c("HSET h a 1 b 2");
    assert_eq!(c.c("HDEL h a"), Int(1));
    assert_eq!(c.c("EXISTS h"), Int(1));
    assert_eq!(c.c("HDEL h b"), Int(1));
    assert_eq!(c.c("EXISTS h"), Int(0));
    assert_eq!(c.c("TYPE h"), Simple("none".into()));
    assert_eq!(c.c("HLEN h"), Int(0));
    // HSETNX refusing every field does not create anything.
    c.c("SADD s a b");
    assert_eq!(c.c("SREM s a b"), Int(2));
    assert_eq!(c.c("EXISTS s"), Int(0));
    c.c("SADD s a");
    assert_eq!(c.c("SPOP s"), b("a"));
    assert_eq!(c.c("EXISTS s"), Int(0));
    c.c("SADD s a");
    assert_eq!(c.c("SMOVE s t a"), Int(1));
    assert_eq!(c.c("EXISTS s"), Int(0));
    assert_eq!(c.c("SMEMBERS t"), bulks(&["a"]));
    // A re-created key starts empty (no elements of the deleted one come back).
    c.c("HSET h a 1 b 2 c 3");
    assert_eq!(c.c("DEL h"), Int(1));
    assert_eq!(c.c("HSET h z 26"), Int(1));
    assert_eq!(c.c("HGETALL h"), bulks(&["z", "26"]));
    assert_eq!(c.c("DBSIZE"), Int(2));
}

#[test]
fn deleting_a_big_hash_is_immediate_and_complete() {
    let s = start();
    let mut c = client(&s);
    for batch in 0..20 {
        let mut args: Vec<Vec<u8>> = vec![b"HSET".to_vec(), b"big".to_vec()];
        for i in 0..1000 {
            args.push(format!("field:{:05}", batch * 1000 + i).into_bytes());
            args.push(format!("value-{}", batch * 1000 + i).into_bytes());
        }
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        assert_eq!(c.call(&refs), Int(1000));
    }
    c.c("SADD bigset 1 2 3");
    assert_eq!(c.c("HLEN big"), Int(20_000));
    assert_eq!(c.c("HGET big field:12345"), b("value-12345"));
    let all = array(c.c("HGETALL big"));
    assert_eq!(all.len(), 40_000);
    assert_eq!(all[0], b("field:00000"));
    assert_eq!(all[39_999], b("value-19999"));
    assert_eq!(c.c("DEL big"), Int(1));
    assert_eq!(c.c("EXISTS big"), Int(0));
    assert_eq!(c.c("HLEN big"), Int(0));
    assert_eq!(c.c("HGET big field:12345"), Nil);
    // A new hash under the same name sees none of the old fields.
    assert_eq!(c.c("HSET big a 1"), Int(1));
    assert_eq!(c.c("HGETALL big"), bulks(&["a", "1"]));
    // Writes go on while the old elements are reclaimed.
    for i in 0..50 {
        assert_eq!(c.c(&format!("HSET other f{i} v")), Int(1));
    }
    assert_eq!(c.c("HLEN other"), Int(50));
    assert_eq!(c.c("SMEMBERS bigset"), bulks(&["1", "2", "3"]));
}

#[test]
fn hashes_and_sets_survive_a_restart() {
    let mut s = start();
    {
        let mut c = client(&s);
        c.c("HSET h a 1 b 2 c 3");
        c.c("HDEL h b");
        c.c("HINCRBY h n 41");
        c.c("SADD s x y z");
        c.c("SREM s y");
        c.c("SUNIONSTORE u s h2");
        c.c("EXPIRE h 100000");
    }
    s.restart();
    let mut c = client(&s);
    assert_eq!(c.c("HGETALL h"), bulks(&["a", "1", "c", "3", "n", "41"]));
    assert_eq!(c.c("HLEN h"), Int(3));
    assert_eq!(c.c("HINCRBY h n 1"), Int(42));
    assert_eq!(c.c("SMEMBERS s"), bulks(&["x", "z"]));
    assert_eq!(c.c("SCARD s"), Int(2));
    assert_eq!(c.c("SMEMBERS u"), bulks(&["x", "z"]));
    match c.c("TTL h") {
        Int(t) => assert!(t > 0 && t <= 100_000, "TTL {t}"),
        other => panic!("TTL: {other:?}"),
    }
    assert_eq!(c.c("SADD s y"), Int(1));
    assert_eq!(c.c("SCARD s"), Int(3));
}

#[test]
fn resp3_reply_shapes() {
    let s = start();
    let mut c = client(&s);
    c.c("HSET h a 1 b 2");
    c.c("SADD s x y");
    c.c("SADD t y");
    assert!(matches!(c.c("HELLO 3"), Reply::Map(_)));
    assert_eq!(
        c.c("HGETALL h"),
        Reply::Map(vec![(b("a"), b("1")), (b("b"), b("2"))])
    );
    assert_eq!(c.c("HGETALL missing"), Reply::Map(vec![]));
    assert_eq!(c.c("SMEMBERS s"), Reply::Set(vec![b("x"), b("y")]));
    assert_eq!(c.c("SMEMBERS missing"), Reply::Set(vec![]));
    assert_eq!(c.c("SINTER s t"), Reply::Set(vec![b("y")]));
    assert_eq!(c.c("SUNION s t"), Reply::Set(vec![b("x"), b("y")]));
    assert_eq!(c.c("SDIFF s t"), Reply::Set(vec![b("x")]));
    assert_eq!(c.c("HGET h zz"), Nil);
    assert_eq!(c.c("HMGET h a zz"), Array(vec![b("1"), Nil]));
    assert_eq!(c.c("SISMEMBER s x"), Int(1));
    assert_eq!(c.c("SMISMEMBER s x q"), Array(vec![Int(1), Int(0)]));
    assert_eq!(c.c("HRANDFIELD missing"), Nil);
    assert_eq!(c.c("SRANDMEMBER missing"), Nil);
    assert_eq!(c.c("SPOP missing"), Nil);
    assert_eq!(c.c("HKEYS h"), bulks(&["a", "b"]));
    assert_eq!(c.c("HINCRBYFLOAT h a 0.5"), b("1.5"));
    // WITHVALUES in RESP3: one [field, value] array per pick.
    let picks = array(c.c("HRANDFIELD h 2 WITHVALUES"));
    assert_eq!(picks.len(), 2);
    for p in picks {
        let p = array(p);
        assert_eq!(p.len(), 2);
        let want = if p[0] == b("a") { b("1.5") } else { b("2") };
        assert_eq!(p[1], want);
    }
    let picks = array(c.c("HRANDFIELD h -3 WITHVALUES"));
    assert_eq!(picks.len(), 3);
    assert!(picks.iter().all(|p| array(p.clone()).len() == 2));
    c.c("HELLO 2");
    assert_eq!(c.c("HGETALL h"), bulks(&["a", "1.5", "b", "2"]));
    assert_eq!(c.c("SMEMBERS s"), bulks(&["x", "y"]));
    assert_eq!(array(c.c("HRANDFIELD h 2 WITHVALUES")).len(), 4);
}

#[test]
fn command_table_declares_hash_and_set_commands() {
    let s = start();
    let mut c = client(&s);
    let info = array(c.c("COMMAND INFO hset smove sinterstore sintercard hgetall"));
    let keys = |r: &Reply| -> (String, i64, i64, i64, i64) {
        let a = array(r.clone());
        let n = |i: usize| match a[i] {
            Int(n) => n,
            ref other => panic!("{other:?}"),
        };
        (
            String::from_utf8(bytes(a[0].clone())).unwrap(),
            n(1),
            n(3),
            n(4),
            n(5),
        )
    };
    assert_eq!(keys(&info[0]), ("hset".into(), -4, 1, 1, 1));
    assert_eq!(keys(&info[1]), ("smove".into(), 4, 1, 2, 1));
    assert_eq!(keys(&info[2]), ("sinterstore".into(), -3, 1, -1, 1));
    assert_eq!(keys(&info[3]), ("sintercard".into(), -3, 0, 0, 0));
    assert_eq!(keys(&info[4]), ("hgetall".into(), 2, 1, 1, 1));
    // Keys are checked on writes, whatever their position.
    let long = "k".repeat(600);
    for cmd in [
        format!("HSET {long} f v"),
        format!("SMOVE s {long} m"),
        format!("SUNIONSTORE d s {long}"),
    ] {
        match c.c(&cmd) {
            Error(e) => assert!(e.starts_with("ERR invalid key"), "{e}"),
            other => panic!("{cmd}: {other:?}"),
        }
    }
}

#[test]
fn random_picks_on_bigger_collections() {
    let s = start();
    let mut c = client(&s);
    // 3,000 members: a few picks seek (Picker), larger counts walk the set.
    let mut args: Vec<Vec<u8>> = vec![b"SADD".to_vec(), b"big".to_vec()];
    let mut hargs: Vec<Vec<u8>> = vec![b"HSET".to_vec(), b"bigh".to_vec()];
    for i in 0..3000 {
        args.push(format!("m:{i:04}").into_bytes());
        hargs.push(format!("f:{i:04}").into_bytes());
        hargs.push(format!("v:{i:04}").into_bytes());
    }
    let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
    assert_eq!(c.call(&refs), Int(3000));
    let refs: Vec<&[u8]> = hargs.iter().map(|a| &a[..]).collect();
    assert_eq!(c.call(&refs), Int(3000));
    let valid = |m: &[u8]| m.len() == 6 && m.starts_with(b"m:");
    let distinct_valid = |picks: &[Vec<u8>], n: usize| {
        assert_eq!(picks.len(), n);
        assert!(picks.windows(2).all(|w| w[0] != w[1]), "repeats");
        assert!(picks.iter().all(|m| valid(m)));
    };

    let mut singles = BTreeSet::new();
    for _ in 0..200 {
        let one = bytes(c.c("SRANDMEMBER big"));
        assert!(valid(&one), "{one:?}");
        singles.insert(one);
    }
    // 200 picks from 3,000 members of one shape: nearly all distinct.
    assert!(singles.len() > 100, "only {} distinct picks", singles.len());
    distinct_valid(&sorted(c.c("SRANDMEMBER big 10")), 10);
    distinct_valid(&sorted(c.c("SRANDMEMBER big 1000")), 1000);
    let mut repeats = BTreeSet::new();
    for _ in 0..20 {
        let picks = sorted(c.c("SRANDMEMBER big -10"));
        assert_eq!(picks.len(), 10);
        assert!(picks.iter().all(|m| valid(m)));
        repeats.extend(picks);
    }
    assert!(repeats.len() > 100, "only {} distinct picks", repeats.len());
    let many = sorted(c.c("SRANDMEMBER big -5000"));
    assert_eq!(many.len(), 5000);
    assert!(many.iter().all(|m| valid(m)));

    // SPOP: none, few (seeks), many (walk), one.
    assert_eq!(c.c("SPOP big 0"), Array(vec![]));
    let mut gone = sorted(c.c("SPOP big 10"));
    distinct_valid(&gone, 10);
    assert_eq!(c.c("SCARD big"), Int(2990));
    let more = sorted(c.c("SPOP big 1000"));
    distinct_valid(&more, 1000);
    assert_eq!(c.c("SCARD big"), Int(1990));
    gone.extend(more);
    gone.push(bytes(c.c("SPOP big")));
    assert_eq!(c.c("SCARD big"), Int(1989));
    let left: BTreeSet<Vec<u8>> = sorted(c.c("SMEMBERS big")).into_iter().collect();
    assert_eq!(left.len(), 1989);
    assert!(
        gone.iter().all(|m| !left.contains(m)),
        "a popped member is still there"
    );
    assert_eq!(gone.iter().collect::<BTreeSet<_>>().len(), 1011);

    // Skewed key space: one branch ("z") against a hundred ("a00".."a99").
    let mut args: Vec<Vec<u8>> = vec![b"SADD".to_vec(), b"skew".to_vec(), b"z".to_vec()];
    args.extend((0..100).map(|i| format!("a{i:02}").into_bytes()));
    let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
    assert_eq!(c.call(&refs), Int(101));
    let picks = sorted(c.c("SRANDMEMBER skew 20"));
    assert_eq!(picks.len(), 20);
    assert!(picks.windows(2).all(|w| w[0] != w[1]));
    let popped = sorted(c.c("SPOP skew 20"));
    assert_eq!(popped.len(), 20);
    assert_eq!(c.c("SCARD skew"), Int(81));
    for m in &popped {
        assert_eq!(c.call(&[b"SISMEMBER", b"skew", m]), Int(0));
    }

    // HRANDFIELD: values go with their fields.
    for cmd in [
        "HRANDFIELD bigh 5 WITHVALUES",
        "HRANDFIELD bigh -7 WITHVALUES",
    ] {
        let pairs = array(c.c(cmd));
        for p in pairs.chunks(2) {
            let (f, v) = (bytes(p[0].clone()), bytes(p[1].clone()));
            assert_eq!(&f[2..], &v[2..], "{f:?} {v:?}");
        }
    }
    assert_eq!(array(c.c("HRANDFIELD bigh -300")).len(), 300);
    assert_eq!(array(c.c("HRANDFIELD bigh 2999")).len(), 2999);
    assert_eq!(array(c.c("HRANDFIELD bigh 5000")).len(), 3000);
    let f = bytes(c.c("HRANDFIELD bigh"));
    assert!(f.starts_with(b"f:"), "{f:?}");
}

// ---------------------------------------------------------------------------------------------
// Model test

/// splitmix64: a deterministic stream for the operation mix.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

type HashVal = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Debug, Clone, PartialEq)]
enum Val {
    Str(Vec<u8>),
    Hash(HashVal),
    Set(BTreeSet<Vec<u8>>),
}

const KEYS: &[&str] = &["h1", "h2", "s1", "s2", "s3", "k"];
const SUBS: &[&str] = &[
    "a", "b", "c", "d", "e", "f", "1", "2", "10", "-3", "x:y", "zz",
];
const VALS: &[&str] = &[
    "0",
    "1",
    "-5",
    "42",
    "v",
    "hello",
    "9223372036854775800",
    "",
];

struct Model {
    keys: HashMap<String, Val>,
}

fn wrong() -> Reply {
    err(WRONGTYPE)
}

/// Redis's canonical integer (string2ll): what HINCRBY accepts.
fn canonical_int(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?;
    let n: i64 = s.parse().ok()?;
    (n.to_string() == s).then_some(n)
}

impl Model {
    /// The hash under `key` (a copy), None when missing, Err(WRONGTYPE) for another type.
    fn hash(&self, key: &str) -> Result<Option<HashVal>, Reply> {
        match self.keys.get(key) {
            None => Ok(None),
            Some(Val::Hash(h)) => Ok(Some(h.clone())),
            Some(_) => Err(wrong()),
        }
    }

    /// The set under `key` (a copy), None when missing, Err(WRONGTYPE) for another type.
    fn set(&self, key: &str) -> Result<Option<BTreeSet<Vec<u8>>>, Reply> {
        match self.keys.get(key) {
            None => Ok(None),
            Some(Val::Set(s)) => Ok(Some(s.clone())),
            Some(_) => Err(wrong()),
        }
    }

    /// Stores a collection under `key`, or deletes the key when it is empty (as Redis does).
    fn put(&mut self, key: &str, v: Val) {
        let empty = match &v {
            Val::Hash(h) => h.is_empty(),
            Val::Set(s) => s.is_empty(),
            Val::Str(_) => false,
        };
        if empty {
            self.keys.remove(key);
        } else {
            self.keys.insert(key.into(), v);
        }
    }

    fn combine(&self, how: &str, keys: &[&str]) -> Result<BTreeSet<Vec<u8>>, Reply> {
        let sets = keys
            .iter()
            .map(|k| self.set(k))
            .collect::<Result<Vec<_>, _>>()?;
        let mut it = sets.into_iter();
        let mut acc = it.next().flatten().unwrap_or_default();
        for s in it {
            let s = s.unwrap_or_default();
            match how {
                "SINTER" => acc.retain(|m| s.contains(m)),
                "SUNION" => acc.extend(s),
                _ => acc.retain(|m| !s.contains(m)),
            }
        }
        Ok(acc)
    }
}

/// Mostly a set's key, sometimes any key.
fn set_key(rng: &mut Rng) -> &'static str {
    if rng.below(8) == 0 {
        rng.pick(KEYS)
    } else {
        rng.pick(&["s1", "s2", "s3"])
    }
}

/// One to `max` random fields or members (repeats possible).
fn subs(rng: &mut Rng, max: usize) -> Vec<&'static str> {
    let k = 1 + rng.below(max);
    (0..k).map(|_| rng.pick(SUBS)).collect()
}

fn members(s: &BTreeSet<Vec<u8>>) -> Reply {
    Array(s.iter().map(|m| Bulk(m.clone())).collect())
}

fn args_of(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

/// Sends `args`, returns the reply.
fn call_args(c: &mut Client, args: &[String]) -> Reply {
    let refs: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    c.call(&refs)
}

/// Runs one random operation against both; panics on a difference. True when the reply was
/// not an error.
fn step(rng: &mut Rng, c: &mut Client, m: &mut Model, n: usize) -> bool {
    let op = rng.below(36);
    // Mostly a key of the family the command is for, sometimes any key (WRONGTYPE, missing).
    let key = match (op, rng.below(8)) {
        (_, 0) => rng.pick(KEYS),
        (0..=14 | 30, _) => rng.pick(&["h1", "h2"]),
        (15..=29 | 35, _) => rng.pick(&["s1", "s2", "s3"]),
        (32, _) => "k",
        _ => rng.pick(KEYS),
    };
    let (args, want): (Vec<String>, Reply) = match op {
        0..=3 => {
            let mut args = args_of(&["HSET", key]);
            let mut pairs = Vec::new();
            for f in subs(rng, 3) {
                let v = rng.pick(VALS);
                args.extend([f.to_string(), v.to_string()]);
                pairs.push((f, v));
            }
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(h) => {
                    let mut h = h.unwrap_or_default();
                    let added = pairs
                        .into_iter()
                        .filter(|(f, v)| {
                            h.insert(f.as_bytes().into(), v.as_bytes().into()).is_none()
                        })
                        .count();
                    m.put(key, Val::Hash(h));
                    Int(added as i64)
                }
            };
            (args, want)
        }
        4 => {
            let (f, v) = (rng.pick(SUBS), rng.pick(VALS));
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(Some(h)) if h.contains_key(f.as_bytes()) => Int(0),
                Ok(h) => {
                    let mut h = h.unwrap_or_default();
                    h.insert(f.into(), v.into());
                    m.put(key, Val::Hash(h));
                    Int(1)
                }
            };
            (args_of(&["HSETNX", key, f, v]), want)
        }
        5..=6 => {
            let fs = subs(rng, 3);
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(None) => Int(0),
                Ok(Some(mut h)) => {
                    let removed = fs
                        .iter()
                        .filter(|f| h.remove(f.as_bytes()).is_some())
                        .count();
                    m.put(key, Val::Hash(h));
                    Int(removed as i64)
                }
            };
            let mut args = args_of(&["HDEL", key]);
            args.extend(fs.iter().map(|f| f.to_string()));
            (args, want)
        }
        7 => {
            let f = rng.pick(SUBS);
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(h) => h
                    .and_then(|h| h.get(f.as_bytes()).cloned())
                    .map_or(Nil, Bulk),
            };
            (args_of(&["HGET", key, f]), want)
        }
        8 => {
            let fs = subs(rng, 3);
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(h) => Array(
                    fs.iter()
                        .map(|f| {
                            h.as_ref()
                                .and_then(|h| h.get(f.as_bytes()).cloned())
                                .map_or(Nil, Bulk)
                        })
                        .collect(),
                ),
            };
            let mut args = args_of(&["HMGET", key]);
            args.extend(fs.iter().map(|f| f.to_string()));
            (args, want)
        }
        9 => {
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(h) => Int(h.map_or(0, |h| h.len() as i64)),
            };
            (args_of(&["HLEN", key]), want)
        }
        10 => {
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(h) => Array(
                    h.unwrap_or_default()
                        .into_iter()
                        .flat_map(|(f, v)| [Bulk(f), Bulk(v)])
                        .collect(),
                ),
            };
            (args_of(&["HGETALL", key]), want)
        }
        11 => {
            let keys = rng.below(2) == 0;
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(h) => Array(
                    h.unwrap_or_default()
                        .into_iter()
                        .map(|(f, v)| Bulk(if keys { f } else { v }))
                        .collect(),
                ),
            };
            (args_of(&[if keys { "HKEYS" } else { "HVALS" }, key]), want)
        }
        12 => {
            let f = rng.pick(SUBS);
            let strlen = rng.below(2) == 0;
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(h) => match h.and_then(|h| h.get(f.as_bytes()).cloned()) {
                    Some(v) if strlen => Int(v.len() as i64),
                    Some(_) => Int(1),
                    None => Int(0),
                },
            };
            (
                args_of(&[if strlen { "HSTRLEN" } else { "HEXISTS" }, key, f]),
                want,
            )
        }
        13..=14 => {
            let f = rng.pick(SUBS);
            let delta = rng.pick(&["1", "-1", "100", "-42", "9223372036854775807"]);
            let want = match m.hash(key) {
                Err(e) => e,
                Ok(h) => {
                    let mut h = h.unwrap_or_default();
                    let old = match h.get(f.as_bytes()) {
                        None => Some(0),
                        Some(v) => canonical_int(v),
                    };
                    match old.map(|o| o.checked_add(delta.parse().unwrap())) {
                        None => err("ERR hash value is not an integer"),
                        Some(None) => err("ERR increment or decrement would overflow"),
                        Some(Some(new)) => {
                            h.insert(f.into(), new.to_string().into_bytes());
                            m.put(key, Val::Hash(h));
                            Int(new)
                        }
                    }
                }
            };
            (args_of(&["HINCRBY", key, f, delta]), want)
        }
        15..=18 => {
            let ms = subs(rng, 3);
            let want = match m.set(key) {
                Err(e) => e,
                Ok(s) => {
                    let mut s = s.unwrap_or_default();
                    let added = ms
                        .iter()
                        .filter(|x| s.insert(x.as_bytes().to_vec()))
                        .count();
                    m.put(key, Val::Set(s));
                    Int(added as i64)
                }
            };
            let mut args = args_of(&["SADD", key]);
            args.extend(ms.iter().map(|x| x.to_string()));
            (args, want)
        }
        19..=20 => {
            let ms = subs(rng, 3);
            let want = match m.set(key) {
                Err(e) => e,
                Ok(None) => Int(0),
                Ok(Some(mut s)) => {
                    let removed = ms.iter().filter(|x| s.remove(x.as_bytes())).count();
                    m.put(key, Val::Set(s));
                    Int(removed as i64)
                }
            };
            let mut args = args_of(&["SREM", key]);
            args.extend(ms.iter().map(|x| x.to_string()));
            (args, want)
        }
        21 => {
            let want = match m.set(key) {
                Err(e) => e,
                Ok(s) => members(&s.unwrap_or_default()),
            };
            (args_of(&["SMEMBERS", key]), want)
        }
        22 => {
            let ms = subs(rng, 3);
            let want = match m.set(key) {
                Err(e) => e,
                Ok(s) => Array(
                    ms.iter()
                        .map(|x| Int(s.as_ref().is_some_and(|s| s.contains(x.as_bytes())) as i64))
                        .collect(),
                ),
            };
            let mut args = args_of(&["SMISMEMBER", key]);
            args.extend(ms.iter().map(|x| x.to_string()));
            (args, want)
        }
        23 => {
            let x = rng.pick(SUBS);
            let card = rng.below(2) == 0;
            let want = match m.set(key) {
                Err(e) => e,
                Ok(s) if card => Int(s.map_or(0, |s| s.len() as i64)),
                Ok(s) => Int(s.is_some_and(|s| s.contains(x.as_bytes())) as i64),
            };
            let args = if card {
                args_of(&["SCARD", key])
            } else {
                args_of(&["SISMEMBER", key, x])
            };
            (args, want)
        }
        24..=26 => {
            let how = rng.pick(&["SINTER", "SUNION", "SDIFF"]);
            let n = 1 + rng.below(3);
            let ks: Vec<&str> = (0..n).map(|_| set_key(rng)).collect();
            let store = rng.below(2) == 0;
            let want = match m.combine(how, &ks) {
                Err(e) => e,
                Ok(r) if store => {
                    let n = r.len() as i64;
                    m.put(key, Val::Set(r));
                    Int(n)
                }
                Ok(r) => members(&r),
            };
            let mut args = if store {
                vec![format!("{how}STORE"), key.to_string()]
            } else {
                vec![how.to_string()]
            };
            args.extend(ks.iter().map(|k| k.to_string()));
            (args, want)
        }
        27 => {
            let dst = set_key(rng);
            let x = rng.pick(SUBS);
            let want = match (m.set(key), m.set(dst)) {
                (Ok(None), _) => Int(0),
                (Err(e), _) | (_, Err(e)) => e,
                (Ok(Some(s)), _) if !s.contains(x.as_bytes()) => Int(0),
                _ if key == dst => Int(1),
                (Ok(Some(mut s)), Ok(d)) => {
                    s.remove(x.as_bytes());
                    m.put(key, Val::Set(s));
                    let mut d = d.unwrap_or_default();
                    d.insert(x.into());
                    m.put(dst, Val::Set(d));
                    Int(1)
                }
            };
            (args_of(&["SMOVE", key, dst, x]), want)
        }
        28 => {
            // SPOP: the server picks; check what it answers and follow it.
            let count = rng.below(4);
            let args = vec!["SPOP".to_string(), key.to_string(), count.to_string()];
            let got = call_args(c, &args);
            match m.set(key) {
                Err(e) => assert_eq!(got, e, "op {n}: {args:?}"),
                Ok(None) => assert_eq!(got, Array(vec![]), "op {n}: {args:?}"),
                Ok(Some(mut s)) => {
                    let popped = sorted(got);
                    assert_eq!(popped.len(), count.min(s.len()), "op {n}: {args:?}");
                    for p in &popped {
                        assert!(s.remove(p), "op {n}: popped {p:?} not in {s:?}");
                    }
                    m.put(key, Val::Set(s));
                }
            }
            return true;
        }
        29 => {
            let count: i64 = rng.below(9) as i64 - 4;
            let args = vec![
                "SRANDMEMBER".to_string(),
                key.to_string(),
                count.to_string(),
            ];
            let got = call_args(c, &args);
            match m.set(key) {
                Err(e) => assert_eq!(got, e, "op {n}: {args:?}"),
                Ok(None) => assert_eq!(got, Array(vec![]), "op {n}: {args:?}"),
                Ok(Some(s)) => {
                    let picked = sorted(got);
                    let want_len = if count >= 0 {
                        (count as usize).min(s.len())
                    } else {
                        count.unsigned_abs() as usize
                    };
                    assert_eq!(picked.len(), want_len, "op {n}: {args:?}");
                    assert!(picked.iter().all(|p| s.contains(p)), "op {n}: {args:?}");
                    if count > 0 {
                        assert!(picked.windows(2).all(|w| w[0] != w[1]), "op {n}: repeats");
                    }
                }
            }
            return true;
        }
        30 => {
            let args = args_of(&["HRANDFIELD", key, "2"]);
            let got = call_args(c, &args);
            match m.hash(key) {
                Err(e) => assert_eq!(got, e, "op {n}: {args:?}"),
                Ok(h) => {
                    let h = h.unwrap_or_default();
                    let picked = sorted(got);
                    assert_eq!(picked.len(), h.len().min(2), "op {n}: {args:?}");
                    assert!(picked.iter().all(|f| h.contains_key(f)), "op {n}");
                }
            }
            return true;
        }
        31 => {
            let existed = m.keys.remove(key).is_some();
            (args_of(&["DEL", key]), Int(existed as i64))
        }
        32 => {
            let v = rng.pick(VALS);
            m.put(key, Val::Str(v.into()));
            (args_of(&["SET", key, v]), ok())
        }
        33 => {
            let t = match m.keys.get(key) {
                None => "none",
                Some(Val::Str(_)) => "string",
                Some(Val::Hash(_)) => "hash",
                Some(Val::Set(_)) => "set",
            };
            (args_of(&["TYPE", key]), Simple(t.into()))
        }
        // COPY, or DUMP and RESTORE, onto another key (any type over any type).
        34 if rng.below(3) > 0 => {
            let dst = rng.pick(KEYS);
            let src = m.keys.get(key).cloned();
            if rng.below(2) == 0 {
                let want = match src {
                    _ if dst == key => err("ERR source and destination objects are the same"),
                    None => Int(0),
                    Some(v) => {
                        m.keys.insert(dst.into(), v);
                        Int(1)
                    }
                };
                (args_of(&["COPY", key, dst, "REPLACE"]), want)
            } else {
                let payload = match (c.call(&[b"DUMP", key.as_bytes()]), src) {
                    (Nil, None) => return true,
                    (Bulk(p), Some(v)) => {
                        m.keys.insert(dst.into(), v);
                        p
                    }
                    (got, want) => panic!("op {n}: DUMP {key}: {got:?}, model {want:?}"),
                };
                let got = c.call(&[b"RESTORE", dst.as_bytes(), b"0", &payload, b"REPLACE"]);
                assert_eq!(got, ok(), "op {n}: RESTORE {dst}");
                return true;
            }
        }
        34 => {
            let want = Int(m.keys.contains_key(key) as i64);
            (args_of(&["EXISTS", key]), want)
        }
        _ => {
            let k2 = set_key(rng);
            let want = match m.combine("SINTER", &[key, k2]) {
                Err(e) => e,
                Ok(r) => Int(r.len() as i64),
            };
            (args_of(&["SINTERCARD", "2", key, k2]), want)
        }
    };
    let got = call_args(c, &args);
    assert_eq!(got, want, "op {n}: {args:?}");
    !matches!(got, Error(_))
}

#[test]
fn random_operations_match_a_model() {
    let mut s = start();
    let mut c = client(&s);
    let mut rng = Rng(0x5eed_2024_0000_0001);
    let mut m = Model {
        keys: HashMap::new(),
    };
    let mut succeeded = 0;
    for n in 0..2000 {
        if n == 1000 {
            s.restart();
            c = client(&s);
        }
        if step(&mut rng, &mut c, &mut m, n) {
            succeeded += 1;
        }
    }
    // The mix exercises the commands, not only their WRONGTYPE errors.
    assert!(
        (1400..1990).contains(&succeeded),
        "{succeeded} of 2000 operations succeeded"
    );
    // The whole keyspace agrees at the end, lengths included.
    for key in KEYS {
        let got = c.c(&format!("TYPE {key}"));
        match m.keys.get(*key) {
            None => assert_eq!(got, Simple("none".into())),
            Some(Val::Str(v)) => assert_eq!(c.c(&format!("GET {key}")), Bulk(v.clone())),
            Some(Val::Hash(h)) => {
                assert_eq!(c.c(&format!("HLEN {key}")), Int(h.len() as i64));
            }
            Some(Val::Set(st)) => {
                assert_eq!(c.c(&format!("SCARD {key}")), Int(st.len() as i64));
                assert_eq!(c.c(&format!("SMEMBERS {key}")), members(st));
            }
        }
    }
    // And the store is sound offline (COPY and RESTORE made collections of their own).
    drop(c);
    s.stop();
    s.assert_check_clean();
}

#[test]
fn randomkey_draws_every_key_about_equally_often() {
    // Redis picks a random key uniformly; memkeep's draw is uniform below 4,096 keys. With
    // 10 keys and 2,000 draws each key's count is ~200 (a 1-in-10^9 test would allow 120-280).
    let s = start();
    let mut c = client(&s);
    for i in 0..10 {
        let k = format!("key:{i}");
        assert_eq!(
            c.call(&[b"SET", k.as_bytes(), b"v"]),
            Reply::Simple("OK".into())
        );
    }
    let mut counts = HashMap::new();
    for _ in 0..2000 {
        match c.call(&[b"RANDOMKEY"]) {
            Reply::Bulk(k) => *counts.entry(k).or_insert(0usize) += 1,
            other => panic!("RANDOMKEY answered {other:?}"),
        }
    }
    assert_eq!(counts.len(), 10, "{counts:?}");
    for (k, n) in &counts {
        assert!(
            (120..=280).contains(n),
            "{} drawn {n} times of 2000: {counts:?}",
            String::from_utf8_lossy(k)
        );
    }
}
