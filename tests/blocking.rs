//! Blocking pops against a real memkeep with two worker threads: answered at once when a key
//! has data, woken by a push from another connection (on either worker), waiters served first
//! come first served, timeouts (RESP2 and RESP3, fractional), BLMOVE moving a value exactly
//! once across a kill -9, a client that hangs up while blocked leaving the element for the
//! next, MULTI's never-block rule, CLIENT UNBLOCK, WRONGTYPE, reply order behind a blocked
//! command, and a durable queue (producers LPUSH, consumers BRPOP or BLMOVE) across kill -9.
//! The reply shapes themselves are goldens in `proto/resp/blocking.txt`.
//!
//! Invariants: every socket has a read timeout, every loop is bounded, no test asserts how
//! long anything took beyond what the protocol guarantees (a timeout never answers early),
//! and every test ends by checking the server is still running and logged no panic.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::programs::{assert_healthy, python};
use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

fn start(args: &[&str]) -> Server {
    let mut all = vec!["-t".to_string(), "2".to_string()];
    all.extend(args.iter().map(|s| s.to_string()));
    Server::start_with(
        BIN,
        Options {
            args: all,
            resp: true,
            ..Options::default()
        },
    )
}

fn resp(server: &Server) -> Resp {
    Resp::connect(server.resp_addr().expect("RESP port"))
}

fn popped(key: &str, value: &str) -> Reply {
    Reply::bulks(&[key, value])
}

/// One field of `INFO clients`.
fn info_clients(r: &mut Resp, field: &str) -> u64 {
    let Reply::Bulk(Some(text)) = r.cmd("INFO clients") else {
        panic!("INFO clients did not answer a bulk");
    };
    let text = String::from_utf8_lossy(&text).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO clients has no {field}: {text}"))
}

/// Waits (at most 10 s) until `blocked_clients` is `n`: that many pops found nothing and
/// wait in the registry, in the order they were queued.
fn wait_blocked(r: &mut Resp, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = info_clients(r, "blocked_clients");
        if got == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "blocked_clients stuck at {got}, want {n}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the registry holds nothing at all (no leaked entry).
fn wait_registry_empty(r: &mut Resp) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = info_clients(r, "memkeep_blocking_entries");
        if got == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "registry stuck at {got} entries");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_key_with_data_answers_at_once() {
    let mut server = start(&[]);
    let mut r = resp(&server);
    assert_eq!(r.cmd("RPUSH l a b c"), Reply::Int(3));
    assert_eq!(r.cmd("BLPOP missing l 0"), popped("l", "a"));
    assert_eq!(r.cmd("BRPOP l 0"), popped("l", "c"));
    assert_eq!(r.cmd("BLMOVE l d LEFT RIGHT 0"), Reply::bulk("b"));
    assert_eq!(r.cmd("EXISTS l"), Reply::Int(0));
    assert_eq!(r.cmd("BRPOPLPUSH d l 0"), Reply::bulk("b"));
    assert_eq!(r.cmd("ZADD z 1 a 2 b 3 c"), Reply::Int(3));
    assert_eq!(r.cmd("BZPOPMIN z 0"), Reply::bulks(&["z", "a", "1"]));
    assert_eq!(r.cmd("BZPOPMAX z 0"), Reply::bulks(&["z", "c", "3"]));
    assert_eq!(
        r.cmd("BLMPOP 0 2 nothing l LEFT COUNT 5"),
        Reply::array(vec![Reply::bulk("l"), Reply::bulks(&["b"])])
    );
    assert_eq!(
        r.cmd("BZMPOP 0 1 z MIN"),
        Reply::array(vec![
            Reply::bulk("z"),
            Reply::array(vec![Reply::bulks(&["b", "2"])])
        ])
    );
    wait_registry_empty(&mut r);
    assert_healthy(&mut server);
}

#[test]
fn a_push_from_another_connection_wakes_the_waiter_on_either_worker() {
    let mut server = start(&[]);
    let mut admin = resp(&server);
    // Connections go to the two workers in turn: waiters and pushers on both.
    for round in 0..4 {
        let mut waiter = resp(&server);
        let mut pusher = resp(&server);
        let key = format!("q{round}");
        waiter.send(&[b"BLPOP", key.as_bytes(), b"0"]);
        wait_blocked(&mut admin, 1);
        assert_eq!(pusher.cmd(&format!("RPUSH {key} hello")), Reply::Int(1));
        assert_eq!(waiter.read(), popped(&key, "hello"));
        assert_eq!(pusher.cmd(&format!("EXISTS {key}")), Reply::Int(0));
        // A sorted set, fed by ZADD and by ZINCRBY.
        waiter.send(&[
            b"BZPOPMAX",
            b"nothing",
            format!("z{round}").as_bytes(),
            b"0",
        ]);
        wait_blocked(&mut admin, 1);
        assert_eq!(
            pusher.cmd(&format!("ZINCRBY z{round} 2.5 m")),
            Reply::bulk("2.5")
        );
        assert_eq!(
            waiter.read(),
            Reply::bulks(&[&format!("z{round}"), "m", "2.5"])
        );
    }
    wait_registry_empty(&mut admin);
    assert_healthy(&mut server);
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let mut server = start(&[]);
    let mut admin = resp(&server);
    let mut waiters: Vec<Resp> = (0..6).map(|_| resp(&server)).collect();
    for (i, w) in waiters.iter_mut().enumerate() {
        w.send(&[b"BLPOP", b"fifo", b"0"]);
        wait_blocked(&mut admin, i as u64 + 1);
    }
    // One element at a time: the first waiter gets the first.
    for (i, w) in waiters.iter_mut().take(3).enumerate() {
        assert_eq!(admin.cmd(&format!("RPUSH fifo e{i}")), Reply::Int(1));
        assert_eq!(w.read(), popped("fifo", &format!("e{i}")));
    }
    // One push of three: each remaining waiter in turn pops the head.
    assert_eq!(admin.cmd("RPUSH fifo a b c"), Reply::Int(3));
    for (w, v) in waiters.iter_mut().skip(3).zip(["a", "b", "c"]) {
        assert_eq!(w.read(), popped("fifo", v));
    }
    assert_eq!(admin.cmd("EXISTS fifo"), Reply::Int(0));
    wait_registry_empty(&mut admin);
    assert_healthy(&mut server);
}

#[test]
fn timeouts_answer_a_null_array_in_resp2_and_resp3_and_never_early() {
    let mut server = start(&[]);
    let mut r2 = resp(&server);
    let mut r3 = resp(&server);
    assert!(matches!(r3.cmd("HELLO 3"), Reply::Map(_)));
    for cmd in [
        "BLPOP nothing 0.2",
        "BRPOP a b 0.2",
        "BLMOVE a b LEFT LEFT 0.2",
        "BRPOPLPUSH a b 0.2",
        "BLMPOP 0.2 1 a LEFT",
        "BZPOPMIN z 0.2",
        "BZMPOP 0.2 2 y z MAX COUNT 3",
    ] {
        for (r, want) in [(&mut r2, Reply::Array(None)), (&mut r3, Reply::Null)] {
            let t0 = Instant::now();
            assert_eq!(r.cmd(cmd), want, "{cmd}");
            // The deadline is at least 0.2 s after the request arrived.
            assert!(
                t0.elapsed() >= Duration::from_millis(200),
                "{cmd} answered early"
            );
        }
    }
    // A fractional timeout well under a second, and one under a millisecond (Redis: still a
    // timeout, not "forever").
    assert_eq!(r2.cmd("BLPOP nothing 0.05"), Reply::Array(None));
    assert_eq!(r2.cmd("BLPOP nothing 0.0001"), Reply::Array(None));
    assert_eq!(r2.cmd("PING"), Reply::Simple("PONG".into()));
    // However short the timeout, an element already there is popped (it never waited).
    for i in 0..50 {
        assert_eq!(r2.cmd(&format!("RPUSH short v{i}")), Reply::Int(1));
        assert_eq!(
            r2.cmd("BLPOP short 0.0001"),
            popped("short", &format!("v{i}"))
        );
    }
    wait_registry_empty(&mut r2);
    assert_healthy(&mut server);
}

#[test]
fn replies_keep_request_order_around_a_blocked_command() {
    let mut server = start(&[]);
    let mut r = resp(&server);
    // A write, a blocking pop that waits, then a read and a write: all in one segment.
    let mut batch = Vec::new();
    for cmd in [
        &["RPUSH", "other", "x"][..],
        &["BLPOP", "empty", "0.1"],
        &["LLEN", "other"],
        &["SET", "after", "1"],
    ] {
        let args: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        batch.extend(Resp::encode(&args));
    }
    r.send_raw(&batch);
    assert_eq!(r.read(), Reply::Int(1));
    assert_eq!(r.read(), Reply::Array(None));
    assert_eq!(r.read(), Reply::Int(1));
    assert_eq!(r.read(), Reply::Simple("OK".into()));
    // The same, woken by a push instead of the timeout.
    let mut other = resp(&server);
    r.send_raw(&Resp::encode(&[b"BLPOP", b"empty", b"0"]));
    r.send_raw(&Resp::encode(&[b"GET", b"after"]));
    wait_blocked(&mut other, 1);
    assert_eq!(other.cmd("RPUSH empty v"), Reply::Int(1));
    assert_eq!(r.read(), popped("empty", "v"));
    assert_eq!(r.read(), Reply::bulk("1"));
    assert_healthy(&mut server);
}

#[test]
fn blmove_moves_a_value_exactly_once_and_durably() {
    let mut server = start(&["--sync", "always"]);
    let mut admin = resp(&server);
    let mut waiter = resp(&server);
    let mut chained = resp(&server);
    waiter.send(&[b"BLMOVE", b"src", b"mid", b"LEFT", b"RIGHT", b"0"]);
    wait_blocked(&mut admin, 1);
    // The moved element feeds a waiter on the destination in turn.
    chained.send(&[b"BRPOPLPUSH", b"mid", b"dst", b"0"]);
    wait_blocked(&mut admin, 2);
    assert_eq!(admin.cmd("RPUSH src one two"), Reply::Int(2));
    assert_eq!(waiter.read(), Reply::bulk("one"));
    assert_eq!(chained.read(), Reply::bulk("one"));
    // Acknowledged, so durable: it survives kill -9, in dst only.
    server.kill9();
    server.relaunch();
    let mut r = resp(&server);
    assert_eq!(r.cmd("LRANGE src 0 -1"), Reply::bulks(&["two"]));
    assert_eq!(r.cmd("LRANGE mid 0 -1"), Reply::bulks(&[]));
    assert_eq!(r.cmd("LRANGE dst 0 -1"), Reply::bulks(&["one"]));
    assert_healthy(&mut server);
}

#[test]
fn a_client_that_hangs_up_while_blocked_leaves_the_element_for_the_next() {
    let mut server = start(&[]);
    let mut admin = resp(&server);
    let mut gone = resp(&server);
    let mut next = resp(&server);
    gone.send(&[b"BLPOP", b"k", b"0"]);
    wait_blocked(&mut admin, 1);
    next.send(&[b"BLPOP", b"k", b"0"]);
    wait_blocked(&mut admin, 2);
    drop(gone);
    wait_blocked(&mut admin, 1);
    assert_eq!(admin.cmd("RPUSH k x"), Reply::Int(1));
    assert_eq!(next.read(), popped("k", "x"));
    // Nobody left: a push stays in the list, nothing is popped for the closed connections.
    let mut gone2 = resp(&server);
    gone2.send(&[b"BRPOPLPUSH", b"k", b"d", b"0"]);
    wait_blocked(&mut admin, 1);
    drop(gone2);
    wait_registry_empty(&mut admin);
    assert_eq!(admin.cmd("RPUSH k y"), Reply::Int(1));
    assert_eq!(admin.cmd("LRANGE k 0 -1"), Reply::bulks(&["y"]));
    assert_eq!(admin.cmd("EXISTS d"), Reply::Int(0));
    // A client that half-closes after BLPOP is gone too, as in Redis.
    let mut s = TcpStream::connect(server.resp_addr().expect("RESP")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&Resp::encode(&[b"BLPOP", b"empty", b"0"]))
        .unwrap();
    wait_blocked(&mut admin, 1);
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("closed, not reset");
    assert!(
        rest.is_empty(),
        "a reply for a client that hung up: {rest:?}"
    );
    wait_registry_empty(&mut admin);
    // But what is there is still popped for a client that sends and half-closes at once
    // (`printf ... | nc -q1`): as Redis, it answers what it read before the EOF.
    let mut s = TcpStream::connect(server.resp_addr().expect("RESP")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = Resp::encode(&[b"RPUSH", b"now", b"v"]);
    req.extend(Resp::encode(&[b"BLPOP", b"now", b"0"]));
    s.write_all(&req).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("replies, then a close");
    assert_eq!(
        String::from_utf8_lossy(&got),
        ":1\r\n*2\r\n$3\r\nnow\r\n$1\r\nv\r\n"
    );
    wait_registry_empty(&mut admin);
    assert_eq!(admin.cmd("EXISTS now"), Reply::Int(0));
    assert_healthy(&mut server);
}

#[test]
fn inside_multi_blocking_pops_answer_as_if_timed_out() {
    let mut server = start(&[]);
    let mut r = resp(&server);
    assert_eq!(r.cmd("MULTI"), Reply::Simple("OK".into()));
    for cmd in [
        "BLPOP k 0",
        "BLMOVE a b LEFT LEFT 0",
        "BZPOPMIN z 0",
        "RPUSH k v",
        "BLPOP k 0",
    ] {
        assert_eq!(r.cmd(cmd), Reply::Simple("QUEUED".into()));
    }
    assert_eq!(
        r.cmd("EXEC"),
        Reply::array(vec![
            Reply::Array(None),
            Reply::Bulk(None),
            Reply::Array(None),
            Reply::Int(1),
            popped("k", "v"),
        ])
    );
    wait_registry_empty(&mut r);
    assert_healthy(&mut server);
}

#[test]
fn client_unblock_answers_timeout_or_error() {
    let mut server = start(&[]);
    let mut admin = resp(&server);
    let mut waiter = resp(&server);
    let Reply::Int(id) = waiter.cmd("CLIENT ID") else {
        panic!("CLIENT ID");
    };
    assert_eq!(admin.cmd(&format!("CLIENT UNBLOCK {id}")), Reply::Int(0));
    for (mode, want) in [
        ("", Reply::Array(None)),
        (" TIMEOUT", Reply::Array(None)),
        (
            " ERROR",
            Reply::Error("UNBLOCKED client unblocked via CLIENT UNBLOCK".into()),
        ),
    ] {
        waiter.send(&[b"BLMOVE", b"a", b"b", b"LEFT", b"LEFT", b"0"]);
        wait_blocked(&mut admin, 1);
        assert_eq!(
            admin.cmd(&format!("CLIENT UNBLOCK {id}{mode}")),
            Reply::Int(1)
        );
        assert_eq!(waiter.read(), want, "UNBLOCK{mode}");
    }
    // Unblocked, the connection goes on; a push now pops nothing for it.
    assert_eq!(admin.cmd("RPUSH a x"), Reply::Int(1));
    assert_eq!(waiter.cmd("LLEN a"), Reply::Int(1));
    wait_registry_empty(&mut admin);
    assert_healthy(&mut server);
}

#[test]
fn wrong_types_are_refused_or_skipped_as_in_redis() {
    let mut server = start(&[]);
    let mut admin = resp(&server);
    let mut w = resp(&server);
    let wrongtype =
        Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into());
    assert_eq!(admin.cmd("SET s str"), Reply::Simple("OK".into()));
    assert_eq!(admin.cmd("RPUSH l v"), Reply::Int(1));
    // The first key that exists decides, even with data further on.
    assert_eq!(w.cmd("BLPOP missing s l 0"), wrongtype);
    assert_eq!(w.cmd("BZPOPMIN l 0"), wrongtype);
    // A waiter on a key that becomes a string stays blocked; a later list serves it.
    w.send(&[b"BLPOP", b"k", b"0"]);
    wait_blocked(&mut admin, 1);
    assert_eq!(admin.cmd("SET k str"), Reply::Simple("OK".into()));
    assert_eq!(admin.cmd("DEL k"), Reply::Int(1));
    assert_eq!(admin.cmd("RPUSH k x"), Reply::Int(1));
    assert_eq!(w.read(), popped("k", "x"));
    // BLMOVE into a destination that became a string: WRONGTYPE, the element stays put.
    w.send(&[b"BLMOVE", b"src", b"s", b"LEFT", b"LEFT", b"0"]);
    wait_blocked(&mut admin, 1);
    assert_eq!(admin.cmd("RPUSH src e"), Reply::Int(1));
    assert_eq!(w.read(), wrongtype);
    assert_eq!(admin.cmd("LRANGE src 0 -1"), Reply::bulks(&["e"]));
    // A sorted-set waiter and a list waiter on one key: the type decides who is served.
    let mut zw = resp(&server);
    w.send(&[b"BLPOP", b"mixed", b"0"]);
    wait_blocked(&mut admin, 1);
    zw.send(&[b"BZPOPMIN", b"mixed", b"0"]);
    wait_blocked(&mut admin, 2);
    assert_eq!(admin.cmd("ZADD mixed 1 m"), Reply::Int(1));
    assert_eq!(zw.read(), Reply::bulks(&["mixed", "m", "1"]));
    assert_eq!(admin.cmd("RPUSH mixed v"), Reply::Int(1));
    assert_eq!(w.read(), popped("mixed", "v"));
    wait_registry_empty(&mut admin);
    assert_healthy(&mut server);
}

#[test]
fn a_transaction_serves_waiters_only_once_it_is_whole() {
    let mut server = start(&[]);
    let mut admin = resp(&server);
    let mut w = resp(&server);
    w.send(&[b"BLPOP", b"k", b"0"]);
    wait_blocked(&mut admin, 1);
    // Pushed and deleted inside one EXEC: nobody is served.
    for cmd in ["MULTI", "RPUSH k a", "DEL k", "EXEC"] {
        admin.cmd(cmd);
    }
    assert_eq!(info_clients(&mut admin, "blocked_clients"), 1);
    // Two pushes and a pop: the waiter gets what is left after the whole EXEC.
    for cmd in ["MULTI", "RPUSH k a", "RPUSH k b", "LPOP k"] {
        admin.cmd(cmd);
    }
    assert_eq!(
        admin.cmd("EXEC"),
        Reply::array(vec![Reply::Int(1), Reply::Int(2), Reply::bulk("a")])
    );
    assert_eq!(w.read(), popped("k", "b"));
    wait_registry_empty(&mut admin);
    assert_healthy(&mut server);
}

#[test]
fn many_waiters_timing_out_leave_nothing_behind() {
    let mut server = start(&[]);
    let mut admin = resp(&server);
    let mut waiters: Vec<Resp> = (0..40).map(|_| resp(&server)).collect();
    for (i, w) in waiters.iter_mut().enumerate() {
        let key = format!("k{}", i % 5);
        w.send(&[b"BLPOP", key.as_bytes(), b"shared", b"0.3"]);
    }
    for w in waiters.iter_mut() {
        assert_eq!(w.read(), Reply::Array(None));
    }
    // Half block forever and hang up.
    for (i, w) in waiters.iter_mut().enumerate().take(20) {
        w.send(&[b"BZPOPMIN", format!("z{i}").as_bytes(), b"0"]);
    }
    wait_blocked(&mut admin, 20);
    waiters.clear();
    wait_registry_empty(&mut admin);
    assert_eq!(info_clients(&mut admin, "blocked_clients"), 0);
    assert_healthy(&mut server);
}

#[test]
fn a_stopping_server_answers_its_blocked_clients() {
    let mut server = start(&[]);
    let mut admin = resp(&server);
    let mut w = resp(&server);
    w.send(&[b"BLPOP", b"k", b"0"]);
    wait_blocked(&mut admin, 1);
    server.stop();
    assert!(!server.is_running());
    // Answered before the connection closed (a stop that forgot it would only close it).
    assert_eq!(w.read(), Reply::Array(None));
}

#[test]
fn redis_py_blpop_and_brpoplpush() {
    let mut server = start(&[]);
    let port = server.resp_addr().expect("RESP").port().to_string();
    for proto in ["2", "3"] {
        python(REDIS_PY_BLOCKING, &[port.clone(), proto.into()]).success(&[&server]);
    }
    assert_healthy(&mut server);
}

const REDIS_PY_BLOCKING: &str = r#"
import sys, threading, time
import redis
port, proto = int(sys.argv[1]), int(sys.argv[2])
r = redis.Redis(port=port, protocol=proto)
w = redis.Redis(port=port, protocol=proto)
r.delete("jobs", "done")
assert r.blpop(["jobs"], timeout=0.1) is None
got = []
t = threading.Thread(target=lambda: got.append(w.blpop(["jobs", "other"], timeout=10)))
t.start()
deadline = time.time() + 10
while int(r.info("clients")["blocked_clients"]) != 1:
    assert time.time() < deadline, "never blocked"
    time.sleep(0.01)
r.rpush("jobs", "j1")
t.join(10)
assert got in ([(b"jobs", b"j1")], [[b"jobs", b"j1"]]), got
assert w.brpoplpush("nothing", "done", timeout=0.1) is None
r.rpush("jobs", "j2")
assert w.brpoplpush("jobs", "done", timeout=1) == b"j2"
assert r.lrange("done", 0, -1) == [b"j2"]
r.zadd("z", {"a": 1, "b": 2})
assert w.bzpopmin("z", timeout=1) in ((b"z", b"a", 1.0), [b"z", b"a", 1.0])
assert w.bzpopmax(["none", "z"], timeout=1) in ((b"z", b"b", 2.0), [b"z", b"b", 2.0])
print("ok")
"#;

// ---------------------------------------------------------------------------------------------
// The durable queue across kill -9.

/// A RESP client whose every failure is an `io::Error` (the server gets killed under it).
struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

#[derive(Debug, Clone, PartialEq)]
enum R {
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<R>>),
    Other(String),
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Client {
    fn open(addr: SocketAddr) -> io::Result<Client> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_nodelay(true)?;
        Ok(Client {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn call(&mut self, args: &[&[u8]]) -> io::Result<R> {
        self.w.write_all(&Resp::encode(args))?;
        self.read()
    }

    fn read(&mut self) -> io::Result<R> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let l = l
            .strip_suffix("\r\n")
            .ok_or_else(|| bad(format!("bad line {l:?}")))?;
        let n = || -> io::Result<i64> { l[1..].parse().map_err(|_| bad(format!("bad {l:?}"))) };
        Ok(match l.as_bytes().first() {
            Some(b':') => R::Int(n()?),
            Some(b'$') => match n()? {
                -1 => R::Bulk(None),
                len => {
                    let mut b = vec![0; len as usize + 2];
                    self.r.read_exact(&mut b)?;
                    b.truncate(len as usize);
                    R::Bulk(Some(b))
                }
            },
            Some(b'*') => match n()? {
                -1 => R::Array(None),
                len => R::Array(Some(
                    (0..len).map(|_| self.read()).collect::<io::Result<_>>()?,
                )),
            },
            _ => R::Other(l.to_string()),
        })
    }
}

/// Connects, retrying while the server restarts (at most 20 s).
fn reconnect(addr: SocketAddr, stop: &AtomicBool) -> Option<Client> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(c) = Client::open(addr) {
            return Some(c);
        }
        if stop.load(Ordering::Acquire) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("could not reconnect to {addr}");
}

#[derive(Default)]
struct Ledger {
    /// Pushes the server acknowledged.
    acked: HashSet<String>,
    /// Pushes sent whose reply was lost (the kill): applied or not.
    unsure: HashSet<String>,
    /// Every element a consumer received, with who received it.
    delivered: Vec<(usize, String)>,
}

fn producer(addr: SocketAddr, id: usize, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let mut c = reconnect(addr, &stop);
    let mut seq = 0u64;
    while !stop.load(Ordering::Acquire) {
        let Some(conn) = c.as_mut() else { break };
        let msg = format!("p{id}-{seq}");
        match conn.call(&[b"LPUSH", b"queue", msg.as_bytes()]) {
            Ok(R::Int(_)) => {
                ledger.lock().unwrap().acked.insert(msg);
                seq += 1;
            }
            Ok(other) => panic!("LPUSH answered {other:?}"),
            Err(_) => {
                ledger.lock().unwrap().unsure.insert(msg);
                seq += 1;
                c = reconnect(addr, &stop);
            }
        }
    }
}

/// BRPOP consumer: records what it is handed, until told to stop and the queue is drained.
fn brpop_consumer(addr: SocketAddr, id: usize, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let mut c = reconnect(addr, &AtomicBool::new(false));
    while let Some(conn) = c.as_mut() {
        match conn.call(&[b"BRPOP", b"queue", b"0.2"]) {
            Ok(R::Array(Some(kv))) if kv.len() == 2 => {
                let R::Bulk(Some(v)) = &kv[1] else {
                    panic!("BRPOP answered {kv:?}")
                };
                let v = String::from_utf8_lossy(v).into_owned();
                ledger.lock().unwrap().delivered.push((id, v));
            }
            Ok(R::Array(None)) => {
                if stop.load(Ordering::Acquire) {
                    break;
                }
            }
            Ok(other) => panic!("BRPOP answered {other:?}"),
            Err(_) => c = reconnect(addr, &AtomicBool::new(false)),
        }
    }
}

/// The reliable-queue pattern: BLMOVE into this consumer's own processing list, record, then
/// LREM it. After a reconnect, whatever is in the processing list and not yet recorded was
/// moved by a BLMOVE whose reply the kill took: it is delivered from there.
fn blmove_consumer(addr: SocketAddr, id: usize, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let processing = format!("processing-{id}");
    let mut mine: HashSet<String> = HashSet::new();
    let mut c = reconnect(addr, &AtomicBool::new(false));
    let mut recover = true;
    while let Some(conn) = c.as_mut() {
        let step = (|| -> io::Result<bool> {
            if recover {
                let R::Array(Some(items)) =
                    conn.call(&[b"LRANGE", processing.as_bytes(), b"0", b"-1"])?
                else {
                    return Err(bad("LRANGE".into()));
                };
                for it in items {
                    let R::Bulk(Some(v)) = it else { continue };
                    let v = String::from_utf8_lossy(&v).into_owned();
                    if mine.insert(v.clone()) {
                        ledger.lock().unwrap().delivered.push((id, v.clone()));
                    }
                    conn.call(&[b"LREM", processing.as_bytes(), b"1", v.as_bytes()])?;
                }
                recover = false;
            }
            match conn.call(&[
                b"BLMOVE",
                b"queue",
                processing.as_bytes(),
                b"RIGHT",
                b"LEFT",
                b"0.2",
            ])? {
                R::Bulk(Some(v)) => {
                    let v = String::from_utf8_lossy(&v).into_owned();
                    if mine.insert(v.clone()) {
                        ledger.lock().unwrap().delivered.push((id, v.clone()));
                    }
                    conn.call(&[b"LREM", processing.as_bytes(), b"1", v.as_bytes()])?;
                    Ok(true)
                }
                R::Array(None) => Ok(!stop.load(Ordering::Acquire)),
                other => panic!("BLMOVE answered {other:?}"),
            }
        })();
        match step {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) => {
                c = reconnect(addr, &AtomicBool::new(false));
                recover = true;
            }
        }
    }
}

type Consumer = fn(SocketAddr, usize, Arc<AtomicBool>, Arc<Mutex<Ledger>>);

/// N producers and M consumers over `--sync always`, the server killed twice mid-run and
/// restarted on its data dir; returns the ledger and what is left in the queue.
fn run_queue(consumer: Consumer, consumers: usize) -> (Ledger, Vec<String>) {
    let mut server = start(&["--sync", "always"]);
    let addr = server.resp_addr().expect("RESP port");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop_producers = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..3)
        .map(|i| {
            let (s, l) = (stop_producers.clone(), ledger.clone());
            std::thread::spawn(move || producer(addr, i, s, l))
        })
        .collect();
    let workers: Vec<_> = (0..consumers)
        .map(|i| {
            let (s, l) = (stop_consumers.clone(), ledger.clone());
            std::thread::spawn(move || consumer(addr, i, s, l))
        })
        .collect();
    for _ in 0..2 {
        // Let messages flow (bounded), then kill mid-run.
        let deadline = Instant::now() + Duration::from_secs(10);
        let start = ledger.lock().unwrap().delivered.len();
        while ledger.lock().unwrap().delivered.len() < start + 200 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        server.kill9();
        server.relaunch();
    }
    std::thread::sleep(Duration::from_millis(300));
    stop_producers.store(true, Ordering::Release);
    for p in producers {
        p.join().expect("producer");
    }
    stop_consumers.store(true, Ordering::Release);
    for w in workers {
        w.join().expect("consumer");
    }
    let mut c = Client::open(addr).expect("connect");
    let R::Array(Some(rest)) = c.call(&[b"LRANGE", b"queue", b"0", b"-1"]).expect("LRANGE") else {
        panic!("LRANGE");
    };
    let rest = rest
        .into_iter()
        .filter_map(|r| match r {
            R::Bulk(Some(v)) => Some(String::from_utf8_lossy(&v).into_owned()),
            _ => None,
        })
        .collect();
    assert_healthy(&mut server);
    let ledger = Arc::try_unwrap(ledger)
        .ok()
        .expect("threads are done")
        .into_inner()
        .unwrap();
    (ledger, rest)
}

/// What every queue test asserts: nothing delivered twice (an element acknowledged as popped
/// to a consumer is never popped again, by anyone), nothing delivered or left that was never
/// pushed, and nothing acknowledged lost beyond `may_lose` (pops whose reply the kill took).
fn check_queue(ledger: &Ledger, rest: &[String], may_lose: usize) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (who, m) in &ledger.delivered {
        if let Some(first) = seen.insert(m, *who) {
            panic!("{m} delivered twice: to consumer {first} and to consumer {who}");
        }
    }
    for m in rest {
        assert!(
            !seen.contains_key(m.as_str()),
            "{m} delivered and still queued"
        );
    }
    for m in seen.keys().copied().chain(rest.iter().map(String::as_str)) {
        assert!(
            ledger.acked.contains(m) || ledger.unsure.contains(m),
            "{m} was never pushed"
        );
    }
    let lost: Vec<&String> = ledger
        .acked
        .iter()
        .filter(|m| !seen.contains_key(m.as_str()) && !rest.contains(m))
        .collect();
    assert!(
        lost.len() <= may_lose,
        "{} acknowledged messages lost (at most {may_lose} may be, popped by a pop whose reply \
         the kill took): {lost:?}",
        lost.len()
    );
    eprintln!(
        "queue: {} acked, {} unsure, {} delivered, {} left, {} lost",
        ledger.acked.len(),
        ledger.unsure.len(),
        ledger.delivered.len(),
        rest.len(),
        lost.len()
    );
    assert!(
        ledger.acked.len() > 400,
        "the queue barely ran: {} pushes",
        ledger.acked.len()
    );
    assert!(
        ledger.delivered.len() > 400,
        "barely delivered: {}",
        ledger.delivered.len()
    );
}

#[test]
fn brpop_queue_survives_kill_9() {
    let consumers = 3;
    let (ledger, rest) = run_queue(brpop_consumer, consumers);
    // Per kill, each consumer has at most one BRPOP outstanding: its pop may have committed
    // (so the element is gone) with the reply lost in the kill. Nothing else may be lost.
    check_queue(&ledger, &rest, 2 * consumers);
}

#[test]
fn blmove_queue_survives_kill_9_without_losing_anything() {
    let (ledger, rest) = run_queue(blmove_consumer, 3);
    // With the reliable pattern, a reply lost in the kill leaves the element in the consumer's
    // processing list: every acknowledged message is delivered or still queued.
    check_queue(&ledger, &rest, 0);
}

#[test]
fn many_waiters_pushers_timeouts_hang_ups_and_unblocks_lose_and_repeat_nothing() {
    let mut server = start(&[]);
    let addr = server.resp_addr().expect("RESP port");
    let keys: [&[u8]; 3] = [b"s1", b"s2", b"s3"];
    let pushed = Arc::new(Mutex::new(HashSet::new()));
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let abandoned = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for p in 0..3u64 {
        let pushed = pushed.clone();
        threads.push(std::thread::spawn(move || {
            let mut c = Client::open(addr).expect("connect");
            for i in 0..400u64 {
                let msg = format!("m{p}-{i}");
                let key = keys[((i + p) % 3) as usize];
                match c.call(&[b"RPUSH", key, msg.as_bytes()]).expect("RPUSH") {
                    R::Int(_) => {
                        pushed.lock().unwrap().insert(msg);
                    }
                    other => panic!("RPUSH answered {other:?}"),
                }
            }
        }));
    }
    for w in 0..6u64 {
        let (delivered, abandoned, stop, ids) = (
            delivered.clone(),
            abandoned.clone(),
            stop.clone(),
            ids.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let mut rng = w.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut c = Client::open(addr).expect("connect");
            let R::Int(id) = c.call(&[b"CLIENT", b"ID"]).expect("CLIENT ID") else {
                panic!("CLIENT ID");
            };
            ids.lock().unwrap().push(id);
            while !stop.load(Ordering::Acquire) {
                let timeout: &[u8] = match next() % 4 {
                    0 => b"0",
                    1 => b"0.01",
                    2 => b"0.0001",
                    _ => b"0.05",
                };
                let req = [b"BLPOP".as_slice(), keys[0], keys[1], keys[2], timeout];
                if next() % 40 == 0 {
                    // Hang up while (perhaps) blocked, and come back as someone else.
                    c.w.write_all(&Resp::encode(&req)).expect("send");
                    abandoned.fetch_add(1, Ordering::AcqRel);
                    c = Client::open(addr).expect("reconnect");
                    let R::Int(id) = c.call(&[b"CLIENT", b"ID"]).expect("CLIENT ID") else {
                        panic!("CLIENT ID");
                    };
                    ids.lock().unwrap().push(id);
                    continue;
                }
                match c.call(&req).expect("BLPOP") {
                    R::Array(None) => {}
                    R::Array(Some(kv)) => match &kv[..] {
                        [R::Bulk(Some(k)), R::Bulk(Some(v))] if keys.contains(&k.as_slice()) => {
                            let v = String::from_utf8_lossy(v).into_owned();
                            delivered.lock().unwrap().push(v);
                        }
                        other => panic!("BLPOP answered {other:?}"),
                    },
                    R::Other(e) if e.starts_with("-UNBLOCKED") => {}
                    other => panic!("BLPOP answered {other:?}"),
                }
                // The connection is still in step: a PING answers PONG next.
                match c.call(&[b"PING"]).expect("PING") {
                    R::Other(p) if p == "+PONG" => {}
                    other => panic!("out of step after BLPOP: {other:?}"),
                }
            }
        }));
    }
    // CLIENT UNBLOCK at random while it runs.
    let unblocker = {
        let (stop, ids) = (stop.clone(), ids.clone());
        std::thread::spawn(move || {
            let mut c = Client::open(addr).expect("connect");
            let mut n = 0usize;
            while !stop.load(Ordering::Acquire) {
                let id = {
                    let ids = ids.lock().unwrap();
                    if ids.is_empty() {
                        None
                    } else {
                        Some(ids[n % ids.len()])
                    }
                };
                n += 7;
                if let Some(id) = id {
                    let mode: &[u8] = if n.is_multiple_of(2) {
                        b"TIMEOUT"
                    } else {
                        b"ERROR"
                    };
                    let id = id.to_string();
                    match c
                        .call(&[b"CLIENT", b"UNBLOCK", id.as_bytes(), mode])
                        .expect("UNBLOCK")
                    {
                        R::Int(0 | 1) => {}
                        other => panic!("CLIENT UNBLOCK answered {other:?}"),
                    }
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };
    // Producers first, then let the consumers drain, then stop everything.
    let consumers = threads.split_off(3);
    for t in threads {
        t.join().expect("producer");
    }
    let mut admin = resp(&server);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: i64 = keys
            .iter()
            .map(|k| match admin.call(&[b"LLEN", k]) {
                Reply::Int(n) => n,
                other => panic!("LLEN answered {other:?}"),
            })
            .sum();
        if left == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Release);
    // Consumers blocked with timeout 0 need a nudge: unblock everyone still waiting.
    let nudge_until = Instant::now() + Duration::from_secs(20);
    while !consumers.iter().all(|t| t.is_finished()) && Instant::now() < nudge_until {
        for id in ids.lock().unwrap().iter() {
            admin.cmd(&format!("CLIENT UNBLOCK {id}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for t in consumers {
        t.join().expect("consumer");
    }
    unblocker.join().expect("unblocker");
    let mut rest = Vec::new();
    for k in keys {
        if let Reply::Array(Some(items)) = admin.call(&[b"LRANGE", k, b"0", b"-1"]) {
            for it in items {
                if let Reply::Bulk(Some(v)) = it {
                    rest.push(String::from_utf8_lossy(&v).into_owned());
                }
            }
        }
    }
    let pushed = pushed.lock().unwrap();
    let delivered = delivered.lock().unwrap();
    let mut seen = HashSet::new();
    for m in delivered.iter().chain(rest.iter()) {
        assert!(seen.insert(m.clone()), "{m} delivered (or left) twice");
        assert!(pushed.contains(m), "{m} was never pushed");
    }
    assert_eq!(pushed.len(), 1200);
    // Only a consumer that hung up while the writer was already popping for it can take an
    // element with it (as in Redis): at most one per hang-up.
    let lost = pushed.len() - seen.len();
    let hung_up = abandoned.load(Ordering::Acquire);
    eprintln!(
        "stress: {} delivered, {} left, {lost} lost, {hung_up} hang-ups",
        delivered.len(),
        rest.len()
    );
    assert!(
        lost <= hung_up,
        "{lost} elements lost with only {hung_up} hang-ups"
    );
    wait_registry_empty(&mut admin);
    assert_healthy(&mut server);
}
