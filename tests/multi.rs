//! RESP transactions against a real memkeep: MULTI/EXEC as clients send them (go-redis's one
//! write, redis-py's `pipeline()`), EXEC's atomicity and durability, and WATCH fired from every
//! side (another RESP client, the memcached text, meta and binary protocols, FLUSHALL,
//! flush_all, expiry). The error replies themselves are goldens in `proto/resp/multi.txt`.
//!
//! Invariants: every socket has a read timeout, every loop is bounded, every test ends by
//! checking the server is still running and logged no panic.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;

use common::programs::{assert_healthy, python};
use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

fn start(args: &[&str], clock: bool) -> Server {
    Server::start_with(
        BIN,
        Options {
            args: args.iter().map(|s| s.to_string()).collect(),
            resp: true,
            debug_clock_ms: clock.then(common::now_ms),
            ..Options::default()
        },
    )
}

fn resp(server: &Server) -> Resp {
    Resp::connect(server.resp_addr().expect("RESP port"))
}

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

fn queued() -> Reply {
    Reply::Simple("QUEUED".into())
}

/// A memcached text connection: sends `req`, reads one reply line.
fn mc(server: &Server, req: &[u8]) -> String {
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

/// WATCH `key`, let `change` run, then EXEC a transaction setting it: the EXEC's reply.
fn exec_after(r: &mut Resp, key: &str, change: impl FnOnce()) -> Reply {
    assert_eq!(r.cmd(&format!("WATCH {key}")), ok());
    change();
    assert_eq!(r.cmd("MULTI"), ok());
    assert_eq!(r.cmd(&format!("SET {key} from-exec")), queued());
    r.cmd("EXEC")
}

#[test]
fn go_redis_single_write_transaction_commits_and_answers_each_command() {
    let mut server = start(&[], false);
    let mut r = resp(&server);
    // go-redis's TxPipelined: MULTI, the commands and EXEC in one write.
    let mut batch = Vec::new();
    for cmd in [
        &["MULTI"][..],
        &["SET", "k", "a"],
        &["APPEND", "k", "b"],
        &["EXEC"],
    ] {
        let args: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        batch.extend(Resp::encode(&args));
    }
    r.send_raw(&batch);
    assert_eq!(r.read(), ok());
    assert_eq!(r.read(), queued());
    assert_eq!(r.read(), queued());
    assert_eq!(r.read(), Reply::array(vec![ok(), Reply::Int(2)]));
    assert_eq!(r.cmd("GET k"), Reply::bulk("ab"));
    // An aborted one changes nothing, even sent in one write.
    let mut batch = Vec::new();
    for cmd in [&["MULTI"][..], &["SET", "k", "z"], &["NOPE"], &["EXEC"]] {
        let args: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        batch.extend(Resp::encode(&args));
    }
    r.send_raw(&batch);
    assert_eq!(r.read(), ok());
    assert_eq!(r.read(), queued());
    assert!(matches!(r.read(), Reply::Error(e) if e.starts_with("ERR unknown command 'NOPE'")));
    assert_eq!(
        r.read(),
        Reply::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(r.cmd("GET k"), Reply::bulk("ab"));
    assert_healthy(&mut server);
}

#[test]
fn watch_fires_on_writes_from_every_protocol() {
    let mut server = start(&[], false);
    let mut r = resp(&server);
    let mut other = resp(&server);
    // Another RESP client.
    assert_eq!(
        exec_after(&mut r, "w1", || assert_eq!(other.cmd("SET w1 x"), ok())),
        Reply::Array(None)
    );
    assert_eq!(r.cmd("GET w1"), Reply::bulk("x"));
    // memcached text `set`, `delete`, `incr`, `touch`.
    assert_eq!(
        exec_after(&mut r, "w2", || assert_eq!(
            mc(&server, b"set w2 0 0 1\r\nx\r\n"),
            "STORED\r\n"
        )),
        Reply::Array(None)
    );
    assert_eq!(r.cmd("GET w2"), Reply::bulk("x"));
    assert_eq!(
        exec_after(&mut r, "w2", || assert_eq!(
            mc(&server, b"delete w2\r\n"),
            "DELETED\r\n"
        )),
        Reply::Array(None)
    );
    assert_eq!(mc(&server, b"set w3 0 0 1\r\n5\r\n"), "STORED\r\n");
    assert_eq!(
        exec_after(&mut r, "w3", || assert_eq!(
            mc(&server, b"incr w3 1\r\n"),
            "6\r\n"
        )),
        Reply::Array(None)
    );
    assert_eq!(
        exec_after(&mut r, "w3", || assert_eq!(
            mc(&server, b"touch w3 100\r\n"),
            "TOUCHED\r\n"
        )),
        Reply::Array(None)
    );
    // Meta `ms`.
    assert_eq!(
        exec_after(&mut r, "w4", || assert_eq!(
            mc(&server, b"ms w4 1\r\ny\r\n"),
            "HD\r\n"
        )),
        Reply::Array(None)
    );
    // Binary SET (opcode 0x01, extras flags + exptime).
    assert_eq!(
        exec_after(&mut r, "w5", || {
            let mut s = server.connect();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut req = vec![0x80, 0x01, 0x00, 0x02, 0x08, 0x00, 0x00, 0x00];
            req.extend_from_slice(&(8u32 + 2 + 1).to_be_bytes());
            req.extend_from_slice(&[0; 12]);
            req.extend_from_slice(&[0; 8]);
            req.extend_from_slice(b"w5v");
            s.write_all(&req).unwrap();
            let mut hdr = [0u8; 24];
            s.read_exact(&mut hdr).unwrap();
            assert_eq!((hdr[0], hdr[6], hdr[7]), (0x81, 0, 0), "binary set stored");
        }),
        Reply::Array(None)
    );
    assert_eq!(r.cmd("GET w5"), Reply::bulk("v"));
    // A collection write, and a write of another key (no change to the watched one).
    assert_eq!(
        exec_after(&mut r, "w6", || assert_eq!(
            other.cmd("HSET w6 f v"),
            Reply::Int(1)
        )),
        Reply::Array(None)
    );
    assert_eq!(
        exec_after(&mut r, "w7", || assert_eq!(
            other.cmd("SET unrelated x"),
            ok()
        )),
        Reply::array(vec![ok()])
    );
    assert_healthy(&mut server);
}

#[test]
fn watch_fires_on_flushall_and_flush_all_of_an_existing_key() {
    let mut server = start(&[], false);
    let mut r = resp(&server);
    let mut other = resp(&server);
    assert_eq!(r.cmd("SET f1 1"), ok());
    assert_eq!(
        exec_after(&mut r, "f1", || assert_eq!(other.cmd("FLUSHALL"), ok())),
        Reply::Array(None)
    );
    assert_eq!(r.cmd("SET f2 1"), ok());
    assert_eq!(
        exec_after(&mut r, "f2", || assert_eq!(
            mc(&server, b"flush_all\r\n"),
            "OK\r\n"
        )),
        Reply::Array(None)
    );
    // As in Redis, a flush deletes nothing of a key that does not exist.
    assert_eq!(
        exec_after(&mut r, "f3", || assert_eq!(other.cmd("FLUSHALL"), ok())),
        Reply::array(vec![ok()])
    );
    assert_healthy(&mut server);
}

#[test]
fn watch_fires_when_a_watched_key_expires() {
    let mut server = start(&[], true);
    let mut r = resp(&server);
    assert_eq!(r.cmd("SET e1 v PX 1500"), ok());
    assert_eq!(r.cmd("WATCH e1"), ok());
    server.advance_clock(2).unwrap();
    assert_eq!(r.cmd("MULTI"), ok());
    assert_eq!(r.cmd("GET e1"), queued());
    assert_eq!(r.cmd("EXEC"), Reply::Array(None));
    // A key already expired when watched is ignored (Redis 7).
    assert_eq!(r.cmd("SET e2 v PX 1000"), ok());
    server.advance_clock(2).unwrap();
    assert_eq!(r.cmd("WATCH e2"), ok());
    assert_eq!(r.cmd("MULTI"), ok());
    assert_eq!(r.cmd("GET e2"), queued());
    assert_eq!(r.cmd("EXEC"), Reply::array(vec![Reply::Bulk(None)]));
    // A TTL still in the future does not fire.
    assert_eq!(r.cmd("SET e3 v EX 100"), ok());
    assert_eq!(r.cmd("WATCH e3"), ok());
    server.advance_clock(1).unwrap();
    assert_eq!(r.cmd("MULTI"), ok());
    assert_eq!(r.cmd("GET e3"), queued());
    assert_eq!(r.cmd("EXEC"), Reply::array(vec![Reply::bulk("v")]));
    assert_healthy(&mut server);
}

/// SMOVE always changes its source, but its destination only when the member was not in it
/// yet (Redis signals the destination only then).
#[test]
fn smove_touches_its_destination_only_when_the_member_is_new() {
    let mut server = start(&[], false);
    let mut r = resp(&server);
    let mut other = resp(&server);
    assert_eq!(r.cmd("SADD src a b c"), Reply::Int(3));
    assert_eq!(r.cmd("SADD dst a"), Reply::Int(1));
    assert_eq!(
        exec_after(&mut r, "dst", || assert_eq!(
            other.cmd("SMOVE src dst a"),
            Reply::Int(1)
        )),
        Reply::array(vec![ok()])
    );
    assert_eq!(r.cmd("DEL dst"), Reply::Int(1));
    assert_eq!(r.cmd("SADD dst x"), Reply::Int(1));
    assert_eq!(
        exec_after(&mut r, "dst", || assert_eq!(
            other.cmd("SMOVE src dst b"),
            Reply::Int(1)
        )),
        Reply::Array(None)
    );
    assert_eq!(
        exec_after(&mut r, "src", || assert_eq!(
            other.cmd("SMOVE src dst c"),
            Reply::Int(1)
        )),
        Reply::Array(None)
    );
    // A move of a member the source lacks changes nothing.
    assert_eq!(r.cmd("SADD src2 z"), Reply::Int(1));
    assert_eq!(
        exec_after(&mut r, "src2", || assert_eq!(
            other.cmd("SMOVE src2 dst nope"),
            Reply::Int(0)
        )),
        Reply::array(vec![ok()])
    );
    assert_healthy(&mut server);
}

#[test]
fn watches_are_per_connection_and_dropped_with_it() {
    let mut server = start(&[], false);
    let mut a = resp(&server);
    let mut b = resp(&server);
    assert_eq!(a.cmd("WATCH shared"), ok());
    assert_eq!(b.cmd("WATCH shared"), ok());
    drop(a);
    // b still watches it after a's connection closed, and sees a change.
    let mut c = resp(&server);
    assert_eq!(c.cmd("SET shared 1"), ok());
    assert_eq!(b.cmd("MULTI"), ok());
    assert_eq!(b.cmd("GET shared"), queued());
    assert_eq!(b.cmd("EXEC"), Reply::Array(None));
    // Many connections watching and leaving leave nothing behind that fires later.
    for _ in 0..20 {
        let mut t = resp(&server);
        assert_eq!(t.cmd("WATCH shared other"), ok());
    }
    assert_eq!(
        exec_after(&mut b, "shared", || {}),
        Reply::array(vec![ok()])
    );
    assert_healthy(&mut server);
}

#[test]
fn concurrent_readers_never_see_half_an_exec() {
    let mut server = start(&[], false);
    let addr = server.resp_addr().unwrap();
    let mut w = resp(&server);
    assert_eq!(w.cmd("MSET a 0 b 0"), ok());
    let (started_tx, started) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut r = Resp::connect(addr);
        let mut seen = 0;
        for _ in 0..3000 {
            match r.cmd("MGET a b") {
                Reply::Array(Some(v)) => {
                    assert_eq!(v[0], v[1], "MGET saw half of an EXEC");
                    if v[0] == Reply::bulk("300") {
                        break;
                    }
                    seen += 1;
                    let _ = started_tx.send(());
                }
                other => panic!("MGET answered {other:?}"),
            }
        }
        seen
    });
    // The EXECs begin once the reader reads, so it reads while they run (it saw none before
    // this wait, when it could start only after the last one).
    started
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("reader started");
    for i in 1..=300 {
        assert_eq!(w.cmd("MULTI"), ok());
        assert_eq!(w.cmd(&format!("SET a {i}")), queued());
        assert_eq!(w.cmd(&format!("SET b {i}")), queued());
        assert_eq!(w.cmd("EXEC"), Reply::array(vec![ok(), ok()]));
    }
    assert!(reader.join().expect("reader") > 0);
    assert_healthy(&mut server);
}

#[test]
fn exec_is_durable_before_it_answers() {
    let mut server = start(&["--sync", "always"], false);
    let mut r = resp(&server);
    assert_eq!(r.cmd("MULTI"), ok());
    assert_eq!(r.cmd("SET d1 one"), queued());
    assert_eq!(r.cmd("RPUSH d2 x y"), queued());
    assert_eq!(r.cmd("EXEC"), Reply::array(vec![ok(), Reply::Int(2)]));
    drop(r);
    server.kill9();
    server.relaunch();
    let mut r = resp(&server);
    assert_eq!(r.cmd("GET d1"), Reply::bulk("one"));
    assert_eq!(r.cmd("LRANGE d2 0 -1"), Reply::bulks(&["x", "y"]));
    assert_healthy(&mut server);
}

#[test]
fn a_transaction_past_the_byte_limit_is_discarded() {
    // The queue holds at most 16 MiB or twice proto_max_bulk_len, whichever is more: at 1m,
    // 16 MiB.
    let mut server = start(&["--proto-max-bulk-len", "1m"], false);
    let mut r = resp(&server);
    assert_eq!(r.cmd("MULTI"), ok());
    let value = vec![b'v'; 1 << 20];
    let mut refused = None;
    for i in 0..40 {
        let key = format!("big{i}");
        match r.call(&[b"SET", key.as_bytes(), &value]) {
            Reply::Simple(s) if s == "QUEUED" => {}
            Reply::Error(e) => {
                refused = Some((i, e));
                break;
            }
            other => panic!("queuing answered {other:?}"),
        }
    }
    let (i, e) = refused.expect("the queue has a limit");
    assert!(i >= 15, "refused after only {i} MiB");
    assert!(e.starts_with("ERR Transaction discarded"), "{e}");
    // The transaction is gone: the connection goes on outside MULTI.
    assert_eq!(r.cmd("EXEC"), Reply::Error("ERR EXEC without MULTI".into()));
    assert_eq!(r.cmd("EXISTS big0"), Reply::Int(0));
    assert_eq!(r.cmd("PING"), Reply::Simple("PONG".into()));
    assert_healthy(&mut server);
}

const REDIS_PY_PIPELINE: &str = r##"
import sys
import redis

port, proto = int(sys.argv[1]), int(sys.argv[2])
r = redis.Redis(host="127.0.0.1", port=port, protocol=proto)
r.delete("p:a", "p:l", "p:s", "p:n")
p = r.pipeline()  # transaction=True: MULTI ... EXEC
p.set("p:a", "1").incr("p:a").get("p:a").rpush("p:l", "x", "y").lrange("p:l", 0, -1)
assert p.execute() == [True, 2, b"2", 2, [b"x", b"y"]], "pipeline"

# A runtime error inside EXEC is that command's reply; the rest still ran.
p = r.pipeline()
p.set("p:s", "v").lpush("p:s", "x").get("p:s")
res = p.execute(raise_on_error=False)
assert res[0] is True and isinstance(res[1], redis.ResponseError) and res[2] == b"v", res

# Optimistic locking with WATCH: a change by another client makes execute() raise WatchError.
other = redis.Redis(host="127.0.0.1", port=port, protocol=proto)
with r.pipeline() as p:
    p.watch("p:a")
    assert p.get("p:a") == b"2"
    other.set("p:a", "changed")
    p.multi()
    p.set("p:a", "mine")
    try:
        p.execute()
        raise SystemExit("WATCH did not fire")
    except redis.WatchError:
        pass
assert r.get("p:a") == b"changed"

# The transaction helper retries until it wins.
def incr(pipe):
    v = int(pipe.get("p:n") or 0)
    pipe.multi()
    pipe.set("p:n", v + 1)
r.transaction(incr, "p:n")
r.transaction(incr, "p:n")
assert r.get("p:n") == b"2"
print(f"protocol {proto} ok")
"##;

fn redis_py_pipeline(proto: u32) {
    let mut server = start(&[], false);
    let port = server.resp_addr().unwrap().port();
    let run = python(REDIS_PY_PIPELINE, &[port.to_string(), proto.to_string()]).success(&[&server]);
    assert!(
        run.stdout.contains(&format!("protocol {proto} ok")),
        "{}",
        run.describe()
    );
    assert_healthy(&mut server);
}

#[test]
fn redis_py_resp2_transaction_pipeline_and_watch() {
    redis_py_pipeline(2);
}

#[test]
fn redis_py_resp3_transaction_pipeline_and_watch() {
    redis_py_pipeline(3);
}

#[test]
fn flushall_inside_exec_cancels_a_pending_delayed_flush_all() {
    let mut server = start(&[], true);
    let mut r = resp(&server);
    assert_eq!(mc(&server, b"flush_all 100\r\n"), "OK\r\n");
    assert_eq!(r.cmd("MULTI"), ok());
    assert_eq!(r.cmd("FLUSHALL"), queued());
    assert_eq!(r.cmd("EXEC"), Reply::array(vec![ok()]));
    assert_eq!(r.cmd("SET after 1"), ok());
    server.advance_clock(200).unwrap();
    assert_eq!(
        r.cmd("GET after"),
        Reply::bulk("1"),
        "the delayed flush still ran"
    );
    assert_healthy(&mut server);
}
