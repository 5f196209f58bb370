//! Redis pub/sub against a real memkeep with two worker threads: PUBLISH from a connection on
//! one worker reaches subscribers on both, pattern subscriptions and PUBLISH's receiver counts,
//! RESP3 push frames, RESP2 subscribed mode, a closing subscriber leaving its channels, a
//! subscriber that stops reading cut off at the output limit while a reading one keeps
//! receiving, and redis-py's `pubsub()` loop. The reply shapes themselves are goldens in
//! `proto/resp/pubsub.txt`.
//!
//! Invariants: every socket has a read timeout, every loop is bounded, every test ends by
//! checking the server is still running and logged no panic.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::programs::{assert_healthy, python};
use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

fn start() -> Server {
    Server::start_with(
        BIN,
        Options {
            args: vec!["-t".into(), "2".into()],
            resp: true,
            ..Options::default()
        },
    )
}

fn resp(server: &Server) -> Resp {
    Resp::connect(server.resp_addr().expect("RESP port"))
}

fn confirm(kind: &str, name: &str, n: i64) -> Reply {
    Reply::array(vec![Reply::bulk(kind), Reply::bulk(name), Reply::Int(n)])
}

fn message(channel: &str, payload: &str) -> Reply {
    Reply::bulks(&["message", channel, payload])
}

/// `PUBSUB NUMSUB channel` until it says `want` (unsubscribing on close is not synchronous
/// with the client's close), for at most 5 s.
fn wait_numsub(r: &mut Resp, channel: &str, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = r.cmd(&format!("PUBSUB NUMSUB {channel}"));
        if got == Reply::array(vec![Reply::bulk(channel), Reply::Int(want)]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "NUMSUB {channel} stuck at {got:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn publish_reaches_subscribers_on_every_worker() {
    let mut server = start();
    // Connections go to the workers in turn: six subscribers cover both.
    let mut subs: Vec<Resp> = (0..6).map(|_| resp(&server)).collect();
    for s in &mut subs {
        assert_eq!(s.cmd("SUBSCRIBE news"), confirm("subscribe", "news", 1));
    }
    // Two publishers, one on each worker.
    let mut pubs: Vec<Resp> = (0..2).map(|_| resp(&server)).collect();
    for (i, p) in pubs.iter_mut().enumerate() {
        let payload = format!("hello-{i}");
        assert_eq!(p.cmd(&format!("PUBLISH news {payload}")), Reply::Int(6));
        for s in &mut subs {
            assert_eq!(s.read(), message("news", &payload));
        }
    }
    assert_eq!(pubs[0].cmd("PUBLISH nobody x"), Reply::Int(0));
    assert_eq!(
        pubs[0].cmd("PUBSUB CHANNELS"),
        Reply::bulks(&["news"]),
        "the active channels"
    );
    // Closing connections leaves their channels.
    subs.truncate(2);
    wait_numsub(&mut pubs[1], "news", 2);
    assert_eq!(pubs[1].cmd("PUBLISH news again"), Reply::Int(2));
    for s in &mut subs {
        assert_eq!(s.read(), message("news", "again"));
    }
    assert_healthy(&mut server);
}

#[test]
fn patterns_count_every_receiving_subscription() {
    let mut server = start();
    let mut exact = resp(&server);
    let mut pattern = resp(&server);
    let mut both = resp(&server);
    let mut publisher = resp(&server);
    assert_eq!(exact.cmd("SUBSCRIBE a.b"), confirm("subscribe", "a.b", 1));
    assert_eq!(
        pattern.cmd("PSUBSCRIBE a.*"),
        confirm("psubscribe", "a.*", 1)
    );
    assert_eq!(both.cmd("SUBSCRIBE a.b"), confirm("subscribe", "a.b", 1));
    assert_eq!(
        both.cmd("PSUBSCRIBE a.[bc]"),
        confirm("psubscribe", "a.[bc]", 2)
    );
    // The channel twice, two patterns once each.
    assert_eq!(publisher.cmd("PUBLISH a.b hi"), Reply::Int(4));
    assert_eq!(exact.read(), message("a.b", "hi"));
    assert_eq!(
        pattern.read(),
        Reply::bulks(&["pmessage", "a.*", "a.b", "hi"])
    );
    let mut got = vec![both.read(), both.read()];
    got.sort_by_key(|r| format!("{r:?}"));
    let mut want = vec![
        message("a.b", "hi"),
        Reply::bulks(&["pmessage", "a.[bc]", "a.b", "hi"]),
    ];
    want.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(got, want);
    // Only the patterns match a.c; nothing matches b.
    assert_eq!(publisher.cmd("PUBLISH a.c yo"), Reply::Int(2));
    assert_eq!(
        pattern.read(),
        Reply::bulks(&["pmessage", "a.*", "a.c", "yo"])
    );
    assert_eq!(
        both.read(),
        Reply::bulks(&["pmessage", "a.[bc]", "a.c", "yo"])
    );
    assert_eq!(publisher.cmd("PUBLISH b nobody"), Reply::Int(0));
    assert_eq!(publisher.cmd("PUBSUB NUMPAT"), Reply::Int(2));
    assert_eq!(
        publisher.cmd("PUBSUB NUMSUB a.b a.c"),
        Reply::array(vec![
            Reply::bulk("a.b"),
            Reply::Int(2),
            Reply::bulk("a.c"),
            Reply::Int(0)
        ])
    );
    assert_eq!(publisher.cmd("PUBSUB CHANNELS a.?"), Reply::bulks(&["a.b"]));
    // After PUNSUBSCRIBE, the pattern no longer receives.
    assert_eq!(
        pattern.cmd("PUNSUBSCRIBE a.*"),
        confirm("punsubscribe", "a.*", 0)
    );
    assert_eq!(publisher.cmd("PUBLISH a.c again"), Reply::Int(1));
    assert_eq!(
        both.read(),
        Reply::bulks(&["pmessage", "a.[bc]", "a.c", "again"])
    );
    assert_healthy(&mut server);
}

#[test]
fn resp3_subscribers_get_push_frames_and_run_any_command() {
    let mut server = start();
    let mut sub = resp(&server);
    let mut publisher = resp(&server);
    assert!(matches!(sub.cmd("HELLO 3"), Reply::Map(_)));
    assert_eq!(
        sub.cmd("SUBSCRIBE ch"),
        Reply::Push(vec![
            Reply::bulk("subscribe"),
            Reply::bulk("ch"),
            Reply::Int(1)
        ])
    );
    // Any command runs while subscribed, and PING answers as usual.
    assert_eq!(sub.cmd("SET k v"), Reply::Simple("OK".into()));
    assert_eq!(sub.cmd("GET k"), Reply::bulk("v"));
    assert_eq!(sub.cmd("PING"), Reply::Simple("PONG".into()));
    assert_eq!(publisher.cmd("PUBLISH ch x"), Reply::Int(1));
    assert_eq!(
        sub.read(),
        Reply::Push(vec![
            Reply::bulk("message"),
            Reply::bulk("ch"),
            Reply::bulk("x")
        ])
    );
    // Its own PUBLISH: the message comes before the count, as in Redis.
    sub.send(&[b"PUBLISH", b"ch", b"mine"]);
    assert_eq!(
        sub.read(),
        Reply::Push(vec![
            Reply::bulk("message"),
            Reply::bulk("ch"),
            Reply::bulk("mine")
        ])
    );
    assert_eq!(sub.read(), Reply::Int(1));
    assert_healthy(&mut server);
}

#[test]
fn resp2_subscribed_mode_allows_only_pubsub_commands() {
    let mut server = start();
    let mut sub = resp(&server);
    assert_eq!(sub.cmd("SUBSCRIBE ch"), confirm("subscribe", "ch", 1));
    let refused = |cmd: &str| {
        Reply::Error(format!(
            "ERR Can't execute '{cmd}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
        ))
    };
    assert_eq!(sub.cmd("GET k"), refused("get"));
    assert_eq!(sub.cmd("PUBLISH ch x"), refused("publish"));
    assert_eq!(sub.cmd("CLIENT ID"), refused("client|id"));
    assert_eq!(sub.cmd("PING"), Reply::bulks(&["pong", ""]));
    assert_eq!(sub.cmd("PING hi"), Reply::bulks(&["pong", "hi"]));
    assert_eq!(sub.cmd("PSUBSCRIBE p*"), confirm("psubscribe", "p*", 2));
    assert_eq!(sub.cmd("UNSUBSCRIBE"), confirm("unsubscribe", "ch", 1));
    // Still subscribed to a pattern: still in subscribed mode.
    assert_eq!(sub.cmd("GET k"), refused("get"));
    assert_eq!(sub.cmd("PUNSUBSCRIBE"), confirm("punsubscribe", "p*", 0));
    assert_eq!(sub.cmd("GET k"), Reply::Bulk(None));
    assert_eq!(sub.cmd("PING"), Reply::Simple("PONG".into()));
    // RESET leaves every channel and answers RESET.
    assert_eq!(sub.cmd("SUBSCRIBE ch"), confirm("subscribe", "ch", 1));
    assert_eq!(sub.cmd("RESET"), Reply::Simple("RESET".into()));
    assert_eq!(sub.cmd("GET k"), Reply::Bulk(None));
    let mut other = resp(&server);
    assert_eq!(other.cmd("PUBLISH ch x"), Reply::Int(0));
    assert_healthy(&mut server);
}

#[test]
fn a_subscriber_that_stops_reading_is_cut_off_and_others_keep_receiving() {
    let mut server = start();
    let addr = server.resp_addr().expect("RESP port");
    // The stalled subscriber: subscribes, reads its confirmation, then never reads again.
    let mut stalled = std::net::TcpStream::connect(addr).expect("connect");
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stalled
        .write_all(&Resp::encode(&[b"SUBSCRIBE", b"flood"]))
        .expect("subscribe");
    let mut conf = [0u8; 64];
    let want = b"*3\r\n$9\r\nsubscribe\r\n$5\r\nflood\r\n:1\r\n";
    stalled
        .read_exact(&mut conf[..want.len()])
        .expect("confirmation");
    assert_eq!(&conf[..want.len()], want);
    // The reader reads everything on its own thread.
    let mut reader = resp(&server);
    assert_eq!(
        reader.cmd("SUBSCRIBE flood"),
        confirm("subscribe", "flood", 1)
    );
    const MESSAGES: usize = 160;
    const SIZE: usize = 512 * 1024;
    // The publisher stays at most AHEAD messages (8 MiB) ahead of what the reader has read, so
    // the reader is never near the limit however slowly a loaded machine runs its thread.
    const AHEAD: usize = 16;
    let received = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = received.clone();
    let reading = std::thread::spawn(move || {
        for i in 0..MESSAGES {
            match reader.read() {
                Reply::Array(Some(m)) => {
                    assert_eq!(m.len(), 3, "message {i}");
                    assert_eq!(m[2], Reply::Bulk(Some(vec![b'x'; SIZE])), "message {i}");
                }
                other => panic!("message {i}: {other:?}"),
            }
            seen.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        reader
    });
    // 80 MiB in all, well past the 32 MiB limit plus what the kernel's buffers hold.
    let mut publisher = resp(&server);
    let payload = vec![b'x'; SIZE];
    let mut counts = Vec::new();
    for i in 0..MESSAGES {
        let deadline = Instant::now() + Duration::from_secs(60);
        while i >= received.load(std::sync::atomic::Ordering::Acquire) + AHEAD {
            assert!(
                Instant::now() < deadline && !reading.is_finished(),
                "the reader stopped at message {}",
                received.load(std::sync::atomic::Ordering::Acquire)
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        match publisher.call(&[b"PUBLISH", b"flood", &payload]) {
            Reply::Int(n) => counts.push(n),
            other => panic!("PUBLISH: {other:?}"),
        }
    }
    assert_eq!(counts[0], 2);
    assert_eq!(
        *counts.last().expect("counts"),
        1,
        "the stalled subscriber is gone"
    );
    let mut reader = reading.join().expect("the reader read every message");
    assert_eq!(publisher.cmd("PUBLISH flood after"), Reply::Int(1));
    assert_eq!(reader.read(), message("flood", "after"));
    // The stalled socket, read now, ends: what the kernel held, then EOF or a reset.
    let mut sink = vec![0u8; 1 << 20];
    let mut total = 0usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            Instant::now() < deadline,
            "the stalled subscriber was not closed"
        );
        match stalled.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
    assert!(
        total < MESSAGES * SIZE,
        "the stalled subscriber got everything ({total} bytes)"
    );
    match publisher.cmd("INFO stats") {
        Reply::Bulk(Some(text)) => {
            let text = String::from_utf8_lossy(&text).into_owned();
            assert!(
                text.contains("client_output_buffer_limit_disconnections:1\r\n"),
                "{text}"
            );
        }
        other => panic!("INFO: {other:?}"),
    }
    assert_healthy(&mut server);
}

const REDIS_PY_PUBSUB: &str = r##"
import sys, time
import redis

port, proto = int(sys.argv[1]), int(sys.argv[2])
def client():
    return redis.Redis(host="127.0.0.1", port=port, protocol=proto, socket_timeout=10)
def eq(got, want, what):
    if got != want:
        print(f"FAIL (protocol {proto}) {what}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)
r = client()
p = r.pubsub()
p.subscribe("news")
p.psubscribe("n*")
confirms = []
deadline = time.time() + 10
while len(confirms) < 2 and time.time() < deadline:
    m = p.get_message(timeout=1.0)
    if m is not None:
        confirms.append((m["type"], m["channel"], m["data"]))
eq(confirms, [("subscribe", b"news", 1), ("psubscribe", b"n*", 2)], "confirmations")
eq(r.publish("news", "hello"), 2, "PUBLISH count")
eq(r.pubsub_numsub("news"), [(b"news", 1)], "PUBSUB NUMSUB")
eq(r.pubsub_numpat(), 1, "PUBSUB NUMPAT")
eq(r.pubsub_channels(), [b"news"], "PUBSUB CHANNELS")
got = []
deadline = time.time() + 10
while len(got) < 2 and time.time() < deadline:
    m = p.get_message(timeout=1.0)
    if m is not None:
        got.append((m["type"], m["pattern"], m["channel"], m["data"]))
eq(sorted(got), [("message", None, b"news", b"hello"), ("pmessage", b"n*", b"news", b"hello")], "messages")
p.ping()
m = None
deadline = time.time() + 10
while m is None and time.time() < deadline:
    m = p.get_message(timeout=1.0)
eq(m is not None and m["type"] == "pong", True, f"PING while subscribed: {m!r}")
p.unsubscribe()
p.punsubscribe()
p.close()
deadline = time.time() + 5
while r.pubsub_numsub("news") != [(b"news", 0)] and time.time() < deadline:
    time.sleep(0.05)
eq(r.pubsub_numsub("news"), [(b"news", 0)], "NUMSUB after close")
eq(r.publish("news", "gone"), 0, "PUBLISH after close")
print(f"ok: protocol {proto}")
"##;

fn redis_py_pubsub(proto: u32) {
    let mut server = start();
    let port = server.resp_addr().expect("RESP port").port();
    python(REDIS_PY_PUBSUB, &[port.to_string(), proto.to_string()]).success(&[&server]);
    assert_healthy(&mut server);
}

#[test]
fn redis_py_pubsub_get_message_loop_resp2() {
    redis_py_pubsub(2);
}

#[test]
fn redis_py_pubsub_get_message_loop_resp3() {
    redis_py_pubsub(3);
}

#[test]
fn the_idle_timeout_spares_subscribers() {
    let mut server = Server::start_with(
        BIN,
        Options {
            args: vec!["--idle-timeout".into(), "1".into()],
            resp: true,
            ..Options::default()
        },
    );
    let mut sub = resp(&server);
    assert_eq!(sub.cmd("SUBSCRIBE quiet"), confirm("subscribe", "quiet", 1));
    let mut silent =
        std::net::TcpStream::connect(server.resp_addr().expect("RESP port")).expect("connect");
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    silent.write_all(b"PING\r\n").expect("send");
    let mut pong = [0u8; 7];
    silent.read_exact(&mut pong).expect("PONG");
    assert_eq!(&pong, b"+PONG\r\n");
    // Past twice the timeout: the silent client is gone, the subscriber still listens.
    std::thread::sleep(Duration::from_millis(2500));
    let mut publisher = resp(&server);
    assert_eq!(publisher.cmd("PUBLISH quiet hello"), Reply::Int(1));
    sub.set_read_timeout(Duration::from_secs(5));
    assert_eq!(sub.read(), message("quiet", "hello"));
    let mut buf = [0u8; 16];
    // EOF or a reset; a read timeout (the connection still open) is a failure.
    let closed = match silent.read(&mut buf) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    };
    assert!(
        closed,
        "the silent client was not closed by the idle timeout"
    );
    assert_healthy(&mut server);
}
