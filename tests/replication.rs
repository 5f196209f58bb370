//! memkeep replicas of a memkeep primary, as real processes on loopback: a replica converges
//! to its primary's content (every type, both protocols, flags, CAS, TTLs, deletions,
//! FLUSHALL, expiry), refuses writes on every protocol, resumes from the backlog after a
//! kill -9, follows a primary that restarts, is promoted by REPLICAOF NO ONE, and takes a
//! full copy of a large store while the primary takes writes. WAIT counts its
//! acknowledgements; ROLE and INFO replication look like a Redis replica's.
//!
//! Convergence is judged by the offsets INFO replication reports (the replica's applied
//! offset equals the primary's), then by reading everything back from both servers.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::resp::{Reply, Resp};
use common::{Options, Server};

const CONVERGE: Duration = Duration::from_secs(30);

fn primary() -> Server {
    Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            args: vec!["--sync".into(), "always".into()],
            ..Options::default()
        },
    )
}

fn replica_of(p: &Server) -> Server {
    let port = p.resp_addr().expect("resp").port();
    Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            args: vec![
                "--sync".into(),
                "always".into(),
                "--replica-of".into(),
                format!("127.0.0.1:{port}"),
            ],
            ..Options::default()
        },
    )
}

fn resp(s: &Server) -> Resp {
    Resp::connect(s.resp_addr().expect("resp port"))
}

fn text(r: Reply) -> String {
    match r {
        Reply::Bulk(Some(b)) | Reply::Verbatim(b) => String::from_utf8_lossy(&b).into_owned(),
        Reply::Simple(s) => s,
        other => panic!("expected text, got {other:?}"),
    }
}

/// One field of INFO replication.
fn info(s: &Server, field: &str) -> String {
    let all = text(resp(s).cmd("INFO replication"));
    all.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO replication:\n{all}"))
        .to_string()
}

/// Waits until the replica's link is up and it has applied everything the primary released.
fn converge(p: &Server, r: &Server) {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let po = info(p, "master_repl_offset");
        let (link, ro) = (info(r, "master_link_status"), info(r, "slave_repl_offset"));
        if link == "up" && po == ro {
            // Same again a moment later: nothing was still on its way.
            thread::sleep(Duration::from_millis(50));
            if info(p, "master_repl_offset") == po && info(r, "slave_repl_offset") == ro {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "replica did not converge: primary at {po}, replica at {ro} (link {link})\nreplica stderr:\n{}",
            r.stderr_tail(3000)
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// A memcached text-protocol connection.
struct Mc {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Mc {
    fn connect(s: &Server) -> Mc {
        let w = Server::connect_to(s.addr()).expect("connect to the memcached port");
        w.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Mc {
            r: BufReader::new(w.try_clone().expect("clone")),
            w,
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("read a line");
        assert!(l.ends_with("\r\n"), "short line {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    /// Sends `req` (CRLFs included) and reads one reply line.
    fn call(&mut self, req: &str) -> String {
        self.w.write_all(req.as_bytes()).expect("send");
        self.line()
    }

    /// `gets key`: (flags, cas, value) or None.
    fn gets(&mut self, key: &str) -> Option<(u32, u64, Vec<u8>)> {
        self.w
            .write_all(format!("gets {key}\r\n").as_bytes())
            .expect("send");
        let l = self.line();
        if l == "END" {
            return None;
        }
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f[0], "VALUE", "unexpected {l:?}");
        let len: usize = f[3].parse().expect("length");
        let mut v = vec![0; len + 2];
        self.r.read_exact(&mut v).expect("value");
        v.truncate(len);
        assert_eq!(self.line(), "END");
        Some((f[2].parse().expect("flags"), f[4].parse().expect("cas"), v))
    }
}

/// Everything a server holds, as text: each key's type and content, read over RESP, and for
/// strings also memcached's flags and CAS (both the primary's on a replica).
fn contents(s: &Server) -> BTreeMap<String, String> {
    let mut c = resp(s);
    let mut mc = Mc::connect(s);
    let keys = match c.cmd("KEYS *") {
        Reply::Array(Some(v)) => v.into_iter().map(text).collect::<Vec<_>>(),
        other => panic!("KEYS: {other:?}"),
    };
    let mut out = BTreeMap::new();
    for k in keys {
        let ty = text(c.cmd(&format!("TYPE {k}")));
        let sorted = |r: Reply| -> String {
            let mut v: Vec<String> = match r {
                Reply::Array(Some(v)) | Reply::Set(v) => v.into_iter().map(text).collect(),
                other => panic!("{k}: {other:?}"),
            };
            v.sort();
            v.join(",")
        };
        let body = match ty.as_str() {
            "string" => {
                let ttl = match c.cmd(&format!("PTTL {k}")) {
                    Reply::Int(t) => t > 0,
                    other => panic!("PTTL: {other:?}"),
                };
                match mc.gets(&k) {
                    Some((flags, cas, v)) => format!(
                        "flags={flags} cas={cas} ttl={ttl} value={}",
                        String::from_utf8_lossy(&v)
                    ),
                    None => "gone".into(),
                }
            }
            "list" => format!("{:?}", c.cmd(&format!("LRANGE {k} 0 -1"))),
            "hash" => sorted(c.cmd(&format!("HGETALL {k}"))),
            "set" => sorted(c.cmd(&format!("SMEMBERS {k}"))),
            "zset" => format!("{:?}", c.cmd(&format!("ZRANGE {k} 0 -1 WITHSCORES"))),
            "none" => continue,
            other => panic!("type {other}"),
        };
        out.insert(k, format!("{ty}: {body}"));
    }
    out
}

fn assert_same(p: &Server, r: &Server) {
    let (a, b) = (contents(p), contents(r));
    if a != b {
        for (k, v) in &a {
            if b.get(k) != Some(v) {
                eprintln!("{k}: primary {v:?}, replica {:?}", b.get(k));
            }
        }
        for k in b.keys().filter(|k| !a.contains_key(*k)) {
            eprintln!("{k}: only on the replica: {:?}", b[k]);
        }
        panic!("replica differs from its primary");
    }
}

/// `assert_same` for a store of strings only, a thousand keys per round trip: the per-key
/// walk of `assert_same` takes half a minute over a hundred thousand keys.
fn assert_same_strings(p: &Server, r: &Server) {
    let keys = |s: &Server| -> Vec<String> {
        match resp(s).cmd("KEYS *") {
            Reply::Array(Some(v)) => {
                let mut k: Vec<String> = v.into_iter().map(text).collect();
                k.sort();
                k
            }
            other => panic!("KEYS: {other:?}"),
        }
    };
    let all = keys(p);
    assert_eq!(
        all,
        keys(r),
        "the replica holds other keys than its primary"
    );
    let (mut pc, mut rc) = (resp(p), resp(r));
    for chunk in all.chunks(1000) {
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(chunk.iter().map(|k| k.as_bytes()));
        let theirs = pc.call(&args);
        assert!(matches!(&theirs, Reply::Array(Some(v)) if v.len() == chunk.len()));
        assert_eq!(theirs, rc.call(&args), "values differ in {}..", chunk[0]);
    }
}

fn ok(r: Reply) {
    assert!(
        matches!(&r, Reply::Simple(s) if s == "OK") || matches!(r, Reply::Int(_)),
        "expected success, got {r:?}"
    );
}

/// Writes of every kind, over RESP and memcached's text and meta protocols.
fn write_everything(p: &Server, round: u32) {
    let mut c = resp(p);
    let mut mc = Mc::connect(p);
    let n = round;
    ok(c.cmd(&format!("SET s{n} v{n}")));
    ok(c.cmd(&format!("SET t{n} expiring EX 1000")));
    ok(c.cmd(&format!("RPUSH l{n} a b c d")));
    ok(c.cmd(&format!("LPOP l{n}")).clone_or_ok());
    ok(c.cmd(&format!("HSET h{n} f1 v1 f2 v2 f3 v3")));
    ok(c.cmd(&format!("HDEL h{n} f2")));
    ok(c.cmd(&format!("SADD set{n} m1 m2 m3")));
    ok(c.cmd(&format!("SREM set{n} m3")));
    ok(c.cmd(&format!("ZADD z{n} 1 a 2 b 3 c")));
    ok(c.cmd(&format!("ZINCRBY z{n} 5 a")).clone_or_ok());
    ok(c.cmd(&format!("INCRBY counter{n} 41")));
    ok(c.cmd(&format!("INCR counter{n}")));
    assert_eq!(mc.call(&format!("set mc{n} 7 0 5\r\nhello\r\n")), "STORED");
    assert_eq!(
        mc.call(&format!("set mcttl{n} 9 3600 2\r\nhi\r\n")),
        "STORED"
    );
    assert_eq!(mc.call(&format!("append mc{n} 0 0 3\r\n!!!\r\n")), "STORED");
    let (_, cas, _) = mc.gets(&format!("mc{n}")).expect("just stored");
    assert_eq!(
        mc.call(&format!("cas mc{n} 8 0 3 {cas}\r\nnew\r\n")),
        "STORED"
    );
    assert_eq!(mc.call(&format!("ms meta{n} 2 F3\r\nmv\r\n")), "HD");
    assert_eq!(mc.call(&format!("set gone{n} 0 0 1\r\nx\r\n")), "STORED");
    assert_eq!(mc.call(&format!("delete gone{n}\r\n")), "DELETED");
    ok(c.cmd(&format!("SET gone2{n} x")));
    ok(c.cmd(&format!("DEL gone2{n} l{n}x")));
    ok(c.cmd(&format!("SET short{n} x PX 200")));
    // Small edits of large values: the primary logs them as patches.
    let big = "b".repeat(9000);
    ok(c.cmd(&format!("SET big{n} {big}")));
    ok(c.cmd(&format!("APPEND big{n} tail")));
    ok(c.cmd(&format!("SETRANGE big{n} 100 XYZ")));
    assert_eq!(
        mc.call(&format!("set mcbig{n} 3 0 9000\r\n{big}\r\n")),
        "STORED"
    );
    assert_eq!(
        mc.call(&format!("prepend mcbig{n} 0 0 4\r\nhead\r\n")),
        "STORED"
    );
}

trait OrOk {
    fn clone_or_ok(self) -> Reply;
}

impl OrOk for Reply {
    /// A reply that is data (a popped element, a new score) counts as success.
    fn clone_or_ok(self) -> Reply {
        match self {
            Reply::Error(e) => Reply::Error(e),
            _ => Reply::Simple("OK".into()),
        }
    }
}

/// A memcached binary `set` request.
fn binary_set(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut v = vec![0x80, 0x01];
    v.extend_from_slice(&(key.len() as u16).to_be_bytes());
    v.extend_from_slice(&[8, 0, 0, 0]);
    v.extend_from_slice(&((8 + key.len() + value.len()) as u32).to_be_bytes());
    v.extend_from_slice(&[0, 0, 0, 7]);
    v.extend_from_slice(&[0; 8]);
    v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]);
    v.extend_from_slice(key);
    v.extend_from_slice(value);
    v
}

#[test]
fn a_replica_converges_on_every_type_and_refuses_writes() {
    let p = primary();
    write_everything(&p, 0);
    // A full copy of what is there, then the stream.
    let r = replica_of(&p);
    converge(&p, &r);
    assert_same(&p, &r);
    write_everything(&p, 1);
    converge(&p, &r);
    assert_same(&p, &r);
    assert!(
        contents(&r).contains_key("mc1"),
        "the replica holds the streamed writes"
    );

    // FLUSHALL, then writes after it.
    ok(resp(&p).cmd("FLUSHALL"));
    write_everything(&p, 2);
    converge(&p, &r);
    assert_same(&p, &r);
    assert!(
        !contents(&r).contains_key("s0"),
        "FLUSHALL reached the replica"
    );

    // Expiry: the short-lived keys are gone on both (reads of expired keys miss at once, and
    // the primary's sweep deletes them for the replica).
    thread::sleep(Duration::from_millis(1500));
    converge(&p, &r);
    for s in [&p, &r] {
        assert_eq!(resp(s).cmd("GET short2"), Reply::Bulk(None));
    }
    assert_same(&p, &r);

    // The replica refuses writes on every protocol and still serves reads.
    let mut c = resp(&r);
    assert_eq!(
        c.cmd("SET x 1"),
        Reply::Error("READONLY You can't write against a read only replica.".into())
    );
    assert!(matches!(c.cmd("LPUSH l2 x"), Reply::Error(e) if e.starts_with("READONLY")));
    assert!(matches!(c.cmd("EVAL return 1 0"), Reply::Error(e) if e.starts_with("READONLY")));
    assert_eq!(c.cmd("GET s2"), Reply::bulk("v2"));
    let mut mc = Mc::connect(&r);
    let refused = "SERVER_ERROR You can't write against a read only replica.";
    assert_eq!(mc.call("set x 0 0 1\r\nv\r\n"), refused);
    assert_eq!(mc.call("delete s2\r\n"), refused);
    assert_eq!(mc.call("ms x 1\r\nv\r\n"), refused);
    assert_eq!(mc.call("flush_all\r\n"), refused);
    assert!(mc.gets("mc2").is_some(), "memcached reads are served");
    let mut b = Server::connect_to(r.addr()).expect("connect");
    b.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    b.write_all(&binary_set(b"bx", b"v")).expect("send");
    let mut h = [0u8; 24];
    b.read_exact(&mut h).expect("binary reply");
    assert_eq!(h[0], 0x81);
    assert_ne!(
        u16::from_be_bytes([h[6], h[7]]),
        0,
        "a binary set on a replica is refused"
    );
    assert_eq!(resp(&r).cmd("EXISTS x bx"), Reply::Int(0));

    // WAIT counts the replica once it has applied the client's write.
    let mut c = resp(&p);
    ok(c.cmd("SET waited 1"));
    assert_eq!(c.cmd("WAIT 1 10000"), Reply::Int(1));
    assert_eq!(c.cmd("WAIT 2 100"), Reply::Int(1), "only one replica");
    assert_eq!(resp(&r).cmd("GET waited"), Reply::bulk("1"));
    // In a transaction it answers at once.
    assert_eq!(c.cmd("MULTI"), Reply::Simple("OK".into()));
    assert_eq!(c.cmd("SET inmulti 1"), Reply::Simple("QUEUED".into()));
    assert_eq!(c.cmd("WAIT 5 0"), Reply::Simple("QUEUED".into()));
    match c.cmd("EXEC") {
        Reply::Array(Some(v)) => assert_eq!(v[1], Reply::Int(1), "{v:?}"),
        other => panic!("EXEC: {other:?}"),
    }
    assert!(matches!(resp(&r).cmd("WAIT 1 10"), Reply::Error(e) if e.contains("replica")));

    // ROLE and INFO as Redis's replica and primary show them.
    let rport = p.resp_addr().expect("resp").port() as i64;
    match resp(&r).cmd("ROLE") {
        Reply::Array(Some(v)) => {
            assert_eq!(v[0], Reply::bulk("slave"));
            assert_eq!(v[1], Reply::bulk("127.0.0.1"));
            assert_eq!(v[2], Reply::Int(rport));
            assert_eq!(v[3], Reply::bulk("connected"));
        }
        other => panic!("ROLE: {other:?}"),
    }
    match resp(&p).cmd("ROLE") {
        Reply::Array(Some(v)) => {
            assert_eq!(v[0], Reply::bulk("master"));
            assert!(matches!(&v[2], Reply::Array(Some(s)) if s.len() == 1));
        }
        other => panic!("ROLE: {other:?}"),
    }
    assert_eq!(info(&p, "connected_slaves"), "1");
    let slave0 = info(&p, "slave0");
    assert!(
        slave0.starts_with(&format!(
            "ip=127.0.0.1,port={},state=online,offset=",
            r.resp_addr().expect("resp").port()
        )),
        "{slave0}"
    );
    assert_eq!(info(&r, "role"), "slave");
    assert_eq!(info(&r, "slave_read_only"), "1");
    assert_eq!(info(&r, "master_replid"), info(&p, "master_replid"));
    let cli = Command::new(common::programs::tool("redis-cli"))
        .args([
            "-p",
            &r.resp_addr().expect("resp").port().to_string(),
            "ROLE",
        ])
        .output()
        .expect("run redis-cli");
    let out = String::from_utf8_lossy(&cli.stdout);
    assert!(
        out.starts_with("slave\n127.0.0.1\n"),
        "redis-cli ROLE: {out}"
    );

    // redis-py parses both as it parses Redis's.
    let script = r#"
import sys, redis
rep = redis.Redis(port=int(sys.argv[1]))
pri = redis.Redis(port=int(sys.argv[2]))
role = rep.role()
assert role[0] in (b"slave", "slave") and role[3] in (b"connected", "connected"), role
i = rep.info("replication")
assert i["role"] == "slave" and i["master_link_status"] == "up", i
assert i["slave_read_only"] == 1 and i["master_port"] == int(sys.argv[2]), i
j = pri.info("replication")
assert j["role"] == "master" and j["connected_slaves"] == 1, j
assert j["slave0"]["state"] == "online" and j["slave0"]["port"] == int(sys.argv[1]), j
assert j["master_repl_offset"] == i["slave_repl_offset"], (i, j)
try:
    rep.set("x", 1)
    raise SystemExit("a write on the replica succeeded")
except redis.exceptions.ReadOnlyError:
    pass
print("ok")
"#;
    let run = common::programs::python(
        script,
        &[
            r.resp_addr().expect("resp").port().to_string(),
            p.resp_addr().expect("resp").port().to_string(),
        ],
    )
    .success(&[&p, &r]);
    assert!(run.stdout.contains("ok"), "{}", run.describe());

    // Both stop on SIGTERM: the primary with a replica connected, the replica while it
    // retries its link; both stores check clean.
    let (mut p, mut r) = (p, r);
    let st = p.terminate();
    assert!(st.is_some_and(|s| s.success()), "primary stop: {st:?}");
    let st = r.terminate();
    assert!(st.is_some_and(|s| s.success()), "replica stop: {st:?}");
    p.assert_check_clean();
    r.assert_check_clean();
}

/// Writes `k<i>` from a thread until told to stop; returns the count.
fn background_writer(
    p: &Server,
    prefix: &'static str,
) -> (Arc<AtomicBool>, thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let addr = p.resp_addr().expect("resp");
    let s = stop.clone();
    let h = thread::spawn(move || {
        let mut c = Resp::connect(addr);
        let mut i = 0u64;
        while !s.load(Ordering::Acquire) {
            let k = format!("{prefix}{i}");
            assert_eq!(
                c.call(&[b"SET", k.as_bytes(), format!("v{i}").as_bytes()]),
                Reply::Simple("OK".into())
            );
            i += 1;
        }
        i
    });
    (stop, h)
}

#[test]
fn a_replica_killed_mid_stream_resumes_from_the_backlog_and_follows_a_restarted_primary() {
    let mut p = primary();
    write_everything(&p, 0);
    let mut r = replica_of(&p);
    converge(&p, &r);
    assert_eq!(info(&r, "memkeep_full_copies_taken"), "1");

    // kill -9 the replica while the primary takes writes; it resumes without a full copy.
    let (stop, writer) = background_writer(&p, "during");
    thread::sleep(Duration::from_millis(300));
    r.kill9();
    thread::sleep(Duration::from_millis(300));
    r.relaunch();
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Release);
    let written = writer.join().expect("writer");
    assert!(written > 0);
    converge(&p, &r);
    assert_eq!(
        info(&r, "memkeep_full_copies_taken"),
        "0",
        "resumed without a full copy"
    );
    assert_eq!(info(&r, "memkeep_continues_taken"), "1");
    assert_eq!(info(&p, "memkeep_continues_served"), "1");
    assert_same(&p, &r);

    // kill -9 the primary: the replica reconnects to the restarted one (a new stream, so a
    // full copy) and converges.
    p.kill9();
    thread::sleep(Duration::from_millis(200));
    assert_eq!(info(&r, "master_link_status"), "down");
    p.relaunch();
    write_everything(&p, 1);
    converge(&p, &r);
    assert_eq!(info(&r, "memkeep_full_copies_taken"), "1");
    assert_same(&p, &r);
}

#[test]
fn replicaof_at_run_time_then_no_one_promotes() {
    let p = primary();
    write_everything(&p, 0);
    let r = Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            ..Options::default()
        },
    );
    ok(resp(&r).cmd("SET own 1"));
    let port = p.resp_addr().expect("resp").port();
    ok(resp(&r).cmd(&format!("REPLICAOF 127.0.0.1 {port}")));
    assert_eq!(
        resp(&r).cmd(&format!("SLAVEOF 127.0.0.1 {port}")),
        Reply::Simple("OK Already connected to specified master".into())
    );
    converge(&p, &r);
    assert_same(&p, &r);
    assert_eq!(
        resp(&r).cmd("EXISTS own"),
        Reply::Int(0),
        "the copy replaced it"
    );
    assert!(matches!(resp(&r).cmd("SET x 1"), Reply::Error(e) if e.starts_with("READONLY")));
    let mut mc = Mc::connect(&r);
    let (_, replicated_cas, _) = mc.gets("mc0").expect("replicated");

    ok(resp(&r).cmd("REPLICAOF NO ONE"));
    assert_eq!(info(&r, "role"), "master");
    ok(resp(&r).cmd("SET promoted yes"));
    assert_eq!(mc.call("set mcnew 0 0 1\r\nv\r\n"), "STORED");
    let (_, new_cas, _) = mc.gets("mcnew").expect("stored");
    assert!(
        new_cas > replicated_cas,
        "a promoted replica's CAS uniques ({new_cas}) pass its primary's ({replicated_cas})"
    );
    // The old primary's writes no longer arrive.
    ok(resp(&p).cmd("SET after 1"));
    thread::sleep(Duration::from_millis(300));
    assert_eq!(resp(&r).cmd("EXISTS after"), Reply::Int(0));
    assert_eq!(resp(&r).cmd("GET promoted"), Reply::bulk("yes"));
    // With no replica, WAIT answers 0 once its timeout has passed.
    let t = Instant::now();
    assert_eq!(resp(&r).cmd("WAIT 1 300"), Reply::Int(0));
    assert!(t.elapsed() >= Duration::from_millis(300));
}

/// The stored CAS counter is a bound, raised a reserve at a time (`Writer::cas_bound`; the
/// reserve made small here), and a replica's is written by its primary's records and full copy.
/// Promoted, a replica whose own uniques had passed its primary's stores a bound of its own
/// before it hands out more, so a crash right after repeats none of them.
#[test]
fn a_promoted_replica_stores_its_own_cas_bound_before_a_crash() {
    let small_reserve = || Options {
        resp: true,
        args: vec!["--sync".into(), "always".into()],
        env: vec![("MEMKEEP_TEST_CAS_RESERVE".into(), "10".into())],
        ..Options::default()
    };
    let p = Server::start_with(env!("CARGO_BIN_EXE_memkeep"), small_reserve());
    write_everything(&p, 0);
    let mut r = Server::start_with(env!("CARGO_BIN_EXE_memkeep"), small_reserve());
    // More uniques of its own than its primary will have handed out.
    let mut mc = Mc::connect(&r);
    for i in 0..300 {
        assert_eq!(mc.call(&format!("set own{i} 0 0 1\r\nv\r\n")), "STORED");
    }
    let port = p.resp_addr().expect("resp").port();
    ok(resp(&r).cmd(&format!("REPLICAOF 127.0.0.1 {port}")));
    converge(&p, &r);
    ok(resp(&r).cmd("REPLICAOF NO ONE"));
    assert_eq!(mc.call("set promoted 0 0 1\r\nv\r\n"), "STORED");
    let (_, before, _) = mc.gets("promoted").expect("stored");
    assert!(before > 300, "its own uniques went on ({before})");
    drop(mc);
    r.kill9();
    r.relaunch();
    let mut mc = Mc::connect(&r);
    assert_eq!(mc.call("set after 0 0 1\r\nv\r\n"), "STORED");
    let (_, after, _) = mc.gets("after").expect("stored");
    assert!(
        after > before,
        "the first CAS unique after the crash ({after}) passes the last one before it ({before})"
    );
}

#[test]
fn a_full_copy_of_100k_keys_while_the_primary_takes_writes_converges() {
    let p = primary();
    let mut c = resp(&p);
    const KEYS: usize = 100_000;
    for chunk in 0..KEYS / 1000 {
        let mut args: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
        for i in chunk * 1000..(chunk + 1) * 1000 {
            args.push(format!("key:{i}").into_bytes());
            args.push(format!("value-{i}-{}", "x".repeat(i % 50)).into_bytes());
        }
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        assert_eq!(c.call(&refs), Reply::Simple("OK".into()));
    }
    let (stop, writer) = background_writer(&p, "live");
    thread::sleep(Duration::from_millis(100));
    let r = replica_of(&p);
    let deadline = Instant::now() + CONVERGE;
    while info(&r, "master_link_status") != "up" {
        assert!(Instant::now() < deadline, "link never came up");
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Release);
    let written = writer.join().expect("writer");
    converge(&p, &r);
    assert_eq!(resp(&p).cmd("DBSIZE"), resp(&r).cmd("DBSIZE"));
    assert_eq!(info(&r, "memkeep_full_copies_taken"), "1");
    let (mut a, mut b) = (resp(&p), resp(&r));
    let all: Vec<String> = (0..KEYS)
        .map(|i| format!("key:{i}"))
        .chain((0..written).map(|i| format!("live{i}")))
        .collect();
    for chunk in all.chunks(2000) {
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(chunk.iter().map(|k| k.as_bytes()));
        let (x, y) = (a.call(&args), b.call(&args));
        assert!(x == y, "MGET differs on a chunk starting at {}", chunk[0]);
        assert!(
            !matches!(&x, Reply::Array(Some(v)) if v.contains(&Reply::Bulk(None))),
            "every key is there"
        );
    }
}

/// A copy that outlasts the backlog (4 KiB here, written past many times over while the copy
/// runs) still continues from its snapshot's position: the sender's pin keeps the frames it
/// has still to send. Before pins, the stream could not go on after the copy, and the replica
/// took a new copy, again and again while the writes went on.
#[test]
fn a_full_copy_outlasting_the_backlog_continues_from_its_snapshot() {
    let p = Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            args: vec!["--repl-backlog-size".into(), "4k".into()],
            ..Options::default()
        },
    );
    let mut c = resp(&p);
    for chunk in 0..100 {
        let mut args: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
        for i in chunk * 1000..(chunk + 1) * 1000 {
            args.push(format!("key:{i}").into_bytes());
            args.push(format!("value-{i}-{}", "x".repeat(i % 50)).into_bytes());
        }
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        assert_eq!(c.call(&refs), Reply::Simple("OK".into()));
    }
    let (stop, writer) = background_writer(&p, "live");
    let offset = || -> u64 { info(&p, "master_repl_offset").parse().expect("offset") };
    let before = offset();
    let r = replica_of(&p);
    let deadline = Instant::now() + CONVERGE;
    while info(&r, "master_link_status") != "up" {
        assert!(Instant::now() < deadline, "link never came up");
        thread::sleep(Duration::from_millis(20));
    }
    let during = offset() - before;
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Release);
    let written = writer.join().expect("writer");
    converge(&p, &r);
    // The copy took longer than the backlog lasts.
    assert!(
        during > 4096,
        "the stream grew only {during} bytes during the copy"
    );
    assert_eq!(
        info(&r, "memkeep_full_copies_taken"),
        "1",
        "replica:\n{}\nprimary:\n{}",
        r.stderr_tail(3000),
        p.stderr_tail(3000)
    );
    assert_eq!(resp(&p).cmd("DBSIZE"), resp(&r).cmd("DBSIZE"));
    assert_eq!(resp(&r).cmd("DBSIZE"), Reply::Int(100_000 + written as i64));
    assert_same_strings(&p, &r);
    // Once caught up, the backlog is back within its size.
    for i in 0..100 {
        ok(c.cmd(&format!("SET after{i} {}", "v".repeat(100))));
    }
    converge(&p, &r);
    assert!(
        info(&p, "repl_backlog_histlen")
            .parse::<u64>()
            .expect("number")
            <= 4096 + 200,
        "the backlog is back within its size"
    );
}

/// A full copy is installed as it arrives, in one transaction: a copy cut short (the primary
/// killed while it streams) leaves the replica's store exactly as it was, and while it
/// arrives the replica serves its old store. Whether the kill lands in the copy depends on
/// the machine's speed; the store is all old or all new either way, and the test says which
/// it saw.
#[test]
fn a_full_copy_cut_short_leaves_the_replica_s_store_as_it_was() {
    let mut p = primary();
    let mut c = resp(&p);
    const KEYS: usize = 200_000;
    let value = "v".repeat(500);
    for chunk in 0..KEYS / 1000 {
        let mut args: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
        for i in chunk * 1000..(chunk + 1) * 1000 {
            args.push(format!("new:{i}").into_bytes());
            args.push(value.clone().into_bytes());
        }
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        assert_eq!(c.call(&refs), Reply::Simple("OK".into()));
    }
    // The replica-to-be holds a store of its own.
    let r = primary();
    let mut rc = resp(&r);
    for i in 0..1000 {
        ok(rc.cmd(&format!("SET old:{i} {i}")));
    }
    let port = p.resp_addr().expect("resp").port();
    ok(rc.cmd(&format!("REPLICAOF 127.0.0.1 {port}")));
    let deadline = Instant::now() + CONVERGE;
    let mut served_during = false;
    loop {
        match resp(&r).cmd("ROLE") {
            Reply::Array(Some(v)) if v.len() >= 4 && text(v[3].clone()) == "sync" => {
                // Mid-copy: the old store is what readers see.
                assert_eq!(resp(&r).cmd("GET old:7"), Reply::bulk("7"));
                served_during = true;
                break;
            }
            Reply::Array(Some(v)) if v.len() >= 4 && text(v[3].clone()) == "connected" => break,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the replica never began its copy"
        );
        thread::sleep(Duration::from_millis(2));
    }
    p.kill9();
    let deadline = Instant::now() + CONVERGE;
    while info(&r, "master_link_status") != "down" {
        assert!(Instant::now() < deadline, "the link never went down");
        thread::sleep(Duration::from_millis(20));
    }
    let size = match resp(&r).cmd("DBSIZE") {
        Reply::Int(n) => n as usize,
        other => panic!("DBSIZE: {other:?}"),
    };
    let copied = info(&r, "memkeep_full_copies_taken");
    if size == 1000 {
        assert_eq!(copied, "0", "no copy installed");
        assert_eq!(resp(&r).cmd("GET old:999"), Reply::bulk("999"));
        assert_eq!(resp(&r).cmd("EXISTS new:0"), Reply::Int(0));
    } else {
        assert_eq!(
            size, KEYS,
            "the replica holds its old store or the whole copy"
        );
        assert_eq!(copied, "1");
        assert_eq!(resp(&r).cmd("EXISTS old:0"), Reply::Int(0));
        assert_eq!(
            resp(&r).cmd(&format!("STRLEN new:{}", KEYS - 1)),
            Reply::Int(500)
        );
    }
    println!(
        "cut short: {}; the kill {} the copy",
        size == 1000,
        if served_during {
            "landed in"
        } else {
            "came after"
        }
    );
    let mut r = r;
    r.stop();
    r.assert_check_clean();
}

/// CPU time (user + system) a process has used so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// A connected replica with nothing to apply sleeps: its writer once spun (its sweep, which a
/// replica skips, was always due, so it never waited), taking a core from everything else on
/// the machine, the primary included. Over a few idle seconds it now uses next to no CPU (a
/// spinning thread uses a whole second of CPU a second, less only what a busy machine denies
/// it).
#[test]
fn an_idle_replica_uses_next_to_no_cpu() {
    let p = primary();
    let r = replica_of(&p);
    ok(resp(&p).cmd("SET idle 1"));
    converge(&p, &r);
    let pid = r.pid().expect("replica pid");
    let ticks_per_s = clock_ticks_per_second();
    let before = cpu_ticks(pid);
    thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(pid) - before;
    assert!(
        used * 10 < ticks_per_s * 3,
        "the idle replica used {used} ticks of CPU in 3 s ({ticks_per_s} ticks a second)"
    );
    assert_eq!(info(&r, "master_link_status"), "up");
}

/// Clock ticks a second, as `getconf CLK_TCK` tells them.
fn clock_ticks_per_second() -> u64 {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("CLK_TCK")
}

#[test]
fn a_replica_behind_more_than_the_backlog_takes_a_full_copy() {
    let p = Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            args: vec!["--repl-backlog-size".into(), "4k".into()],
            ..Options::default()
        },
    );
    write_everything(&p, 0);
    let mut r = replica_of(&p);
    converge(&p, &r);
    r.kill9();
    // Its sender is gone (and with it the pin that would hold the backlog for it).
    let deadline = Instant::now() + CONVERGE;
    while info(&p, "connected_slaves") != "0" {
        assert!(Instant::now() < deadline, "the sender outlived its replica");
        thread::sleep(Duration::from_millis(20));
    }
    let mut c = resp(&p);
    for i in 0..200 {
        ok(c.cmd(&format!("SET behind{i} {}", "v".repeat(100))));
    }
    assert!(
        info(&p, "repl_backlog_histlen")
            .parse::<u64>()
            .expect("number")
            <= 4096 + 200,
        "the backlog stays within its size"
    );
    r.relaunch();
    converge(&p, &r);
    assert_eq!(info(&r, "memkeep_full_copies_taken"), "1");
    assert_eq!(info(&r, "memkeep_continues_taken"), "0");
    assert_same(&p, &r);
}

/// What Sentinel sends a replica it promotes, as one transaction (Redis 7.0's
/// `sentinelSendSlaveOf`): every step runs, CONFIG REWRITE failing alone (no config file)
/// without aborting the rest, and the replica is a primary afterwards. Then the other
/// replica, re-pointed at it, continues from where it took over (the old primary's id is its
/// `master_replid2`) instead of taking a full copy, and follows its writes.
#[test]
fn sentinels_promotion_transaction_promotes_and_the_other_replica_continues() {
    let mut p = primary();
    let a = replica_of(&p);
    let b = replica_of(&p);
    for i in 0..200 {
        ok(resp(&p).cmd(&format!("SET k{i} v{i}")));
    }
    converge(&p, &a);
    converge(&p, &b);
    let old_id = info(&p, "master_replid");
    let at = info(&a, "slave_repl_offset");
    p.kill9();

    let mut s = resp(&a);
    // A normal client and a subscriber that the transaction's CLIENT KILLs end.
    let mut normal = resp(&a);
    assert_eq!(normal.cmd("PING"), Reply::Simple("PONG".into()));
    let mut sub = resp(&a);
    assert!(matches!(
        sub.cmd("SUBSCRIBE __sentinel__:hello"),
        Reply::Array(_)
    ));
    ok(s.cmd("CLIENT SETNAME sentinel-test-cmd"));
    ok(s.cmd("MULTI"));
    for c in [
        "SLAVEOF NO ONE",
        "CONFIG REWRITE",
        "CLIENT KILL TYPE normal",
        "CLIENT KILL TYPE pubsub",
    ] {
        assert_eq!(s.cmd(c), Reply::Simple("QUEUED".into()), "{c}");
    }
    match s.cmd("EXEC") {
        Reply::Array(Some(v)) => {
            assert_eq!(v.len(), 4, "{v:?}");
            assert_eq!(v[0], Reply::Simple("OK".into()));
            assert_eq!(
                v[1],
                Reply::Error("ERR The server is running without a config file".into())
            );
            // At least the client and the subscriber above (a helper's connection may still
            // be closing).
            assert!(matches!(v[2], Reply::Int(n) if n >= 1), "{v:?}");
            assert!(matches!(v[3], Reply::Int(n) if n >= 1), "{v:?}");
        }
        other => panic!("EXEC: {other:?}"),
    }
    assert_eq!(info(&a, "role"), "master");
    assert_eq!(info(&a, "master_replid2"), old_id);
    assert_eq!(
        info(&a, "second_repl_offset"),
        (at.parse::<u64>().expect("offset") + 1).to_string()
    );
    ok(s.cmd("SET after promotion"));

    let copies = info(&b, "memkeep_full_copies_taken");
    let port = a.resp_addr().expect("resp").port();
    ok(resp(&b).cmd(&format!("REPLICAOF 127.0.0.1 {port}")));
    converge(&a, &b);
    assert_eq!(
        info(&b, "memkeep_full_copies_taken"),
        copies,
        "it continued instead of taking a full copy"
    );
    assert_eq!(info(&b, "memkeep_continues_taken"), "1");
    assert_eq!(resp(&b).cmd("GET after"), Reply::bulk("promotion"));
    assert_eq!(resp(&b).cmd("GET k199"), Reply::bulk("v199"));
    assert_same(&a, &b);
}

/// CONFIG SET of the replication settings shows in INFO and CONFIG GET; CONFIG REWRITE writes
/// them and the REPLICAOF target into the config file the server was started with (keeping
/// its other lines), so a restart comes back as the same replica; after REPLICAOF NO ONE it
/// writes the file back to a primary's.
#[test]
fn config_rewrite_saves_replicaof_and_the_priority_in_the_config_file() {
    let p = primary();
    let dir = tempfile::tempdir().expect("temp dir");
    let conf = dir.path().join("memkeep.toml");
    let original = "# my settings\nmax_batch = 512\nreplica_priority = 100 # default\n";
    std::fs::write(&conf, original).expect("write config");
    let mut r = Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            args: vec!["--config".into(), conf.display().to_string()],
            ..Options::default()
        },
    );
    let port = p.resp_addr().expect("resp").port();
    let mut c = resp(&r);
    ok(c.cmd("CONFIG SET replica-priority 7 replica-announce-port 1234"));
    assert!(matches!(
        c.cmd("CONFIG SET replica-priority x"),
        Reply::Error(e) if e == "ERR CONFIG SET failed (possibly related to argument 'replica-priority') - argument couldn't be parsed into an integer"
    ));
    assert_eq!(
        c.cmd("CONFIG GET slave-priority"),
        Reply::bulks(&["slave-priority", "7"])
    );
    ok(c.cmd(&format!("REPLICAOF 127.0.0.1 {port}")));
    ok(c.cmd("CONFIG REWRITE"));
    let text = std::fs::read_to_string(&conf).expect("read config");
    assert!(
        text.starts_with("# my settings\nmax_batch = 512\n"),
        "{text}"
    );
    assert!(text.contains("\nreplica_priority = 7\n"), "{text}");
    assert!(
        text.contains(&format!("\nreplica_of = \"127.0.0.1:{port}\"\n")),
        "{text}"
    );
    assert!(text.contains("\nreplica_announce_port = 1234\n"), "{text}");
    converge(&p, &r);
    // The primary lists it under the port it announced.
    let listed = info(&p, "slave0");
    assert!(listed.contains("port=1234"), "{listed}");

    r.restart();
    converge(&p, &r);
    assert_eq!(info(&r, "role"), "slave");
    assert_eq!(info(&r, "slave_priority"), "7");
    assert_eq!(info(&r, "master_port"), port.to_string());

    ok(resp(&r).cmd("REPLICAOF NO ONE"));
    ok(resp(&r).cmd("CONFIG REWRITE"));
    let text = std::fs::read_to_string(&conf).expect("read config");
    assert!(text.contains("\nreplica_of = \"\"\n"), "{text}");
    r.restart();
    assert_eq!(info(&r, "role"), "master");
}

/// `min-replicas-to-write`: a primary refuses writes on every protocol while fewer replicas
/// than that have acknowledged within `min-replicas-max-lag` seconds, takes them once a
/// replica is online, and refuses again once that replica has been gone longer than the lag.
/// Reads go on throughout.
#[test]
fn min_replicas_to_write_refuses_writes_without_enough_replicas() {
    let p = primary();
    let mut c = resp(&p);
    ok(c.cmd("SET before 1"));
    ok(c.cmd("CONFIG SET min-replicas-to-write 1 min-replicas-max-lag 1"));
    assert_eq!(
        c.cmd("CONFIG GET min-slaves-to-write"),
        Reply::bulks(&["min-slaves-to-write", "1"])
    );
    let refused = Reply::Error("NOREPLICAS Not enough good replicas to write.".into());
    assert_eq!(c.cmd("SET x 1"), refused);
    assert_eq!(c.cmd("GET before"), Reply::bulk("1"));
    let mut mc = Mc::connect(&p);
    assert_eq!(
        mc.call("set m 0 0 1\r\nv\r\n"),
        "SERVER_ERROR Not enough good replicas to write."
    );
    // In MULTI the refused write fails the transaction, as in Redis.
    ok(c.cmd("MULTI"));
    assert_eq!(c.cmd("SET y 1"), refused);
    assert!(matches!(c.cmd("EXEC"), Reply::Error(e) if e.starts_with("EXECABORT")));

    let mut r = replica_of(&p);
    let deadline = Instant::now() + CONVERGE;
    while resp(&p).cmd("SET x 1") != Reply::Simple("OK".into()) {
        assert!(
            Instant::now() < deadline,
            "writes still refused with a replica online"
        );
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(mc.call("set m 0 0 1\r\nv\r\n"), "STORED");
    converge(&p, &r);
    assert_eq!(resp(&r).cmd("GET x"), Reply::bulk("1"));

    r.kill9();
    let deadline = Instant::now() + CONVERGE;
    while resp(&p).cmd("SET x 2") != refused {
        assert!(
            Instant::now() < deadline,
            "writes still taken with the replica gone"
        );
        thread::sleep(Duration::from_millis(100));
    }
    ok(resp(&p).cmd("CONFIG SET min-replicas-to-write 0"));
    ok(resp(&p).cmd("SET x 3"));
}
