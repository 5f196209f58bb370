//! CLIENT LIST, CLIENT INFO, CLIENT KILL and CLIENT PAUSE against a real memkeep with two
//! worker threads: clients on both workers are listed with their state and killed by each
//! filter, and a pause holds writes (or everything) until it ends or CLIENT UNPAUSE. Argument
//! errors are goldens in `proto/resp/blocking.txt`.
//!
//! Invariants: every socket has a read timeout, every loop is bounded, no timing is asserted
//! beyond what a pause guarantees (a held request is not answered while it holds), and every
//! test ends by checking the server is still running and logged no panic.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::programs::assert_healthy;
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

/// A client on its own socket, known to the server, and the socket's local address as the
/// server sees it.
fn client(server: &Server) -> (Resp, String, TcpStream) {
    let s = TcpStream::connect(server.resp_addr().expect("RESP port")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let addr = s.local_addr().expect("local addr").to_string();
    let probe = s.try_clone().expect("clone");
    let mut r = Resp::from_stream(s);
    // One round trip: the server has taken the connection in (and listed it) by then.
    assert_eq!(r.cmd("PING"), Reply::Simple("PONG".into()));
    (r, addr, probe)
}

fn id(r: &mut Resp) -> i64 {
    match r.cmd("CLIENT ID") {
        Reply::Int(n) => n,
        other => panic!("CLIENT ID answered {other:?}"),
    }
}

fn text(reply: Reply) -> String {
    match reply {
        Reply::Bulk(Some(b)) | Reply::Verbatim(b) => String::from_utf8_lossy(&b).into_owned(),
        other => panic!("expected text, got {other:?}"),
    }
}

/// The CLIENT LIST line of client `id`, split into its fields.
fn fields(list: &str, id: i64) -> Vec<(String, String)> {
    let line = list
        .lines()
        .find(|l| l.starts_with(&format!("id={id} ")))
        .unwrap_or_else(|| panic!("client {id} not listed in:\n{list}"));
    line.split(' ')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn field<'a>(f: &'a [(String, String)], name: &str) -> &'a str {
    f.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no field {name} in {f:?}"))
}

/// Reads until the server closes `s` (at most 10 s): a killed client sees EOF or a reset.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
    false
}

/// Polls CLIENT LIST until `pred` holds (state from other workers is refreshed after their
/// next pass), at most 10 s.
fn list_until(r: &mut Resp, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = text(r.cmd("CLIENT LIST"));
        if pred(&list) {
            return list;
        }
        assert!(Instant::now() < deadline, "{what} never showed in:\n{list}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn client_list_shows_every_worker_s_clients_and_their_state() {
    let mut server = start();
    let (mut me, my_addr, _) = client(&server);
    let my_id = id(&mut me);
    let (mut sub, _, _) = client(&server);
    let sub_id = id(&mut sub);
    let (mut blocked, _, _) = client(&server);
    let blocked_id = id(&mut blocked);
    let (mut multi, _, _) = client(&server);
    let multi_id = id(&mut multi);
    assert_eq!(me.cmd("CLIENT SETNAME lister"), Reply::Simple("OK".into()));
    assert!(matches!(sub.cmd("SUBSCRIBE news"), Reply::Array(_)));
    blocked.send(&[b"BLPOP", b"nothing", b"0"]);
    assert_eq!(multi.cmd("MULTI"), Reply::Simple("OK".into()));
    assert_eq!(multi.cmd("SET k v"), Reply::Simple("QUEUED".into()));
    let list = list_until(&mut me, "every state", |l| {
        l.contains("flags=P") && l.contains("flags=b") && l.contains("flags=x")
    });
    let mine = fields(&list, my_id);
    assert_eq!(field(&mine, "addr"), my_addr);
    assert_eq!(field(&mine, "name"), "lister");
    assert_eq!(field(&mine, "flags"), "N");
    assert_eq!(field(&mine, "cmd"), "client|list");
    assert_eq!(field(&mine, "resp"), "2");
    let s = fields(&list, sub_id);
    assert_eq!((field(&s, "flags"), field(&s, "sub")), ("P", "1"));
    assert_eq!(field(&s, "cmd"), "subscribe");
    let b = fields(&list, blocked_id);
    assert_eq!((field(&b, "flags"), field(&b, "cmd")), ("b", "blpop"));
    let m = fields(&list, multi_id);
    assert_eq!((field(&m, "flags"), field(&m, "multi")), ("x", "1"));
    // Filters.
    let pubsub = text(me.cmd("CLIENT LIST TYPE pubsub"));
    assert_eq!(pubsub.lines().count(), 1, "{pubsub}");
    assert!(pubsub.starts_with(&format!("id={sub_id} ")));
    let two = text(me.cmd(&format!("CLIENT LIST ID {my_id} {blocked_id} 999999")));
    assert_eq!(two.lines().count(), 2, "{two}");
    assert_eq!(text(me.cmd("CLIENT LIST TYPE master")), "");
    // CLIENT INFO is this connection's line.
    let info = text(me.cmd("CLIENT INFO"));
    assert!(
        info.starts_with(&format!("id={my_id} addr={my_addr} ")),
        "{info}"
    );
    assert!(info.contains(" cmd=client|info "), "{info}");
    assert_healthy(&mut server);
}

#[test]
fn client_kill_closes_matching_clients_on_any_worker() {
    let mut server = start();
    let (mut admin, _, _) = client(&server);
    // By ID, one on each worker.
    for _ in 0..2 {
        let (mut victim, _, mut sock) = client(&server);
        let vid = id(&mut victim);
        assert_eq!(admin.cmd(&format!("CLIENT KILL ID {vid}")), Reply::Int(1));
        assert!(closed(&mut sock), "client {vid} was not closed");
    }
    // By address, old and new forms.
    let (_, addr, mut sock) = client(&server);
    assert_eq!(
        admin.cmd(&format!("CLIENT KILL {addr}")),
        Reply::Simple("OK".into())
    );
    assert!(closed(&mut sock));
    assert_eq!(
        admin.cmd(&format!("CLIENT KILL {addr}")),
        Reply::Error("ERR No such client".into())
    );
    let (_, addr, mut sock) = client(&server);
    assert_eq!(
        admin.cmd(&format!("CLIENT KILL ADDR {addr} SKIPME yes")),
        Reply::Int(1)
    );
    assert!(closed(&mut sock));
    // By type: a subscriber, and a blocked client (whose pop is cancelled, not served).
    let (mut sub, _, mut sub_sock) = client(&server);
    assert!(matches!(sub.cmd("SUBSCRIBE news"), Reply::Array(_)));
    let (mut blocked, _, mut blocked_sock) = client(&server);
    blocked.send(&[b"BLPOP", b"kq", b"0"]);
    list_until(&mut admin, "the blocked client", |l| {
        l.contains("flags=b") && l.contains("flags=P")
    });
    assert_eq!(admin.cmd("CLIENT KILL TYPE pubsub"), Reply::Int(1));
    assert!(closed(&mut sub_sock));
    assert_eq!(
        admin.cmd("CLIENT KILL TYPE normal USER default"),
        Reply::Int(1)
    );
    assert!(closed(&mut blocked_sock));
    assert_eq!(admin.cmd("RPUSH kq x"), Reply::Int(1));
    assert_eq!(
        admin.cmd("LLEN kq"),
        Reply::Int(1),
        "popped for a killed client"
    );
    // SKIPME no: the caller too, after its reply.
    let (mut me, _, mut my_sock) = client(&server);
    assert_eq!(me.cmd("CLIENT KILL TYPE normal SKIPME no"), Reply::Int(2));
    assert!(closed(&mut my_sock));
    let mut fresh = Resp::connect(server.resp_addr().expect("RESP"));
    assert_eq!(fresh.cmd("PING"), Reply::Simple("PONG".into()));
    assert_healthy(&mut server);
}

#[test]
fn client_pause_holds_writes_or_everything_until_it_ends() {
    let mut server = start();
    let (mut admin, _, _) = client(&server);
    let (mut w, _, _) = client(&server);
    // WRITE: reads go on, a write waits until CLIENT UNPAUSE.
    assert_eq!(
        admin.cmd("CLIENT PAUSE 60000 WRITE"),
        Reply::Simple("OK".into())
    );
    assert_eq!(w.cmd("GET k"), Reply::Bulk(None));
    w.send(&[b"SET", b"k", b"v"]);
    w.set_read_timeout(Duration::from_millis(200));
    let probe = TcpStream::connect(server.resp_addr().expect("RESP")).unwrap();
    probe
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut p = Resp::from_stream(probe);
    assert_eq!(
        p.cmd("GET k"),
        Reply::Bulk(None),
        "the write ran during the pause"
    );
    assert_eq!(admin.cmd("CLIENT UNPAUSE"), Reply::Simple("OK".into()));
    w.set_read_timeout(Duration::from_secs(10));
    assert_eq!(w.read(), Reply::Simple("OK".into()));
    assert_eq!(p.cmd("GET k"), Reply::bulk("v"));
    // A short pause ends by itself, and what it held runs then.
    assert_eq!(
        admin.cmd("CLIENT PAUSE 100 WRITE"),
        Reply::Simple("OK".into())
    );
    assert_eq!(w.cmd("SET k v2"), Reply::Simple("OK".into()));
    assert_eq!(p.cmd("GET k"), Reply::bulk("v2"));
    // ALL: even a PING waits, and so does CLIENT UNPAUSE (as in Redis).
    assert_eq!(
        admin.cmd("CLIENT PAUSE 60000 ALL"),
        Reply::Simple("OK".into())
    );
    let mut raw = TcpStream::connect(server.resp_addr().expect("RESP")).unwrap();
    raw.write_all(&Resp::encode(&[b"PING"])).unwrap();
    admin.send(&[b"CLIENT", b"UNPAUSE"]);
    raw.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 64];
    match raw.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("a PING was answered during CLIENT PAUSE ALL: {other:?}"),
    }
    assert_healthy(&mut server);
}

#[test]
fn inside_exec_client_info_and_list_show_the_transaction_as_redis_7_does() {
    let mut server = start();
    let (mut me, _, _) = client(&server);
    let my_id = id(&mut me);
    assert_eq!(me.cmd("MULTI"), Reply::Simple("OK".into()));
    for cmd in ["CLIENT INFO", &format!("CLIENT LIST ID {my_id}"), "SET k v"] {
        assert_eq!(me.cmd(cmd), Reply::Simple("QUEUED".into()), "{cmd}");
    }
    let Reply::Array(Some(replies)) = me.cmd("EXEC") else {
        panic!("EXEC did not answer an array");
    };
    assert_eq!(replies.len(), 3, "{replies:?}");
    assert_eq!(replies[2], Reply::Simple("OK".into()));
    // Redis 7.0.15 shows EXEC running the transaction: flags=x, the number queued, cmd=exec.
    for (what, reply) in [("CLIENT INFO", &replies[0]), ("CLIENT LIST", &replies[1])] {
        let line = text(reply.clone());
        let f = fields(&line, my_id);
        assert_eq!(
            (field(&f, "flags"), field(&f, "multi"), field(&f, "cmd")),
            ("x", "3", "exec"),
            "{what} inside EXEC: {line}"
        );
    }
    // After EXEC the connection is an ordinary one again.
    let after = text(me.cmd("CLIENT INFO"));
    let f = fields(&after, my_id);
    assert_eq!(
        (field(&f, "flags"), field(&f, "multi"), field(&f, "cmd")),
        ("N", "-1", "client|info"),
        "{after}"
    );
    assert_healthy(&mut server);
}

/// A memcached text-protocol connection with a read timeout.
fn memcached(server: &Server, timeout: Duration) -> TcpStream {
    let s = TcpStream::connect(server.addr()).expect("connect to the memcached port");
    s.set_read_timeout(Some(timeout)).unwrap();
    s
}

/// Reads until `want` has come whole (at most the socket's timeout per read); the bytes read.
fn read_until(s: &mut TcpStream, want: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.windows(want.len()).any(|w| w == want) {
        match s.read(&mut buf) {
            Ok(0) => panic!("closed; got {:?}", String::from_utf8_lossy(&got)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "{e} waiting for {:?}; got {:?}",
                String::from_utf8_lossy(want),
                String::from_utf8_lossy(&got)
            ),
        }
    }
    got
}

/// Whether `s` stays silent for `quiet` (a held request is not answered).
fn silent(s: &mut TcpStream, quiet: Duration) -> bool {
    s.set_read_timeout(Some(quiet)).unwrap();
    let mut buf = [0u8; 64];
    let silent = match s.read(&mut buf) {
        Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        Ok(_) => false,
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    silent
}

/// A binary-protocol SET of `key` to `value` (flags 0, no expiry).
fn binary_set(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut p = vec![0x80, 0x01];
    p.extend_from_slice(&(key.len() as u16).to_be_bytes());
    p.extend_from_slice(&[8, 0, 0, 0]);
    p.extend_from_slice(&((8 + key.len() + value.len()) as u32).to_be_bytes());
    p.extend_from_slice(&[0; 4 + 8]); // opaque, cas
    p.extend_from_slice(&[0; 8]); // flags, expiry
    p.extend_from_slice(key);
    p.extend_from_slice(value);
    p
}

#[test]
fn client_pause_holds_the_memcached_port_writes_too() {
    let mut server = start();
    let (mut admin, _, _) = client(&server);
    let mut text_conn = memcached(&server, Duration::from_secs(10));
    let mut bin_conn = memcached(&server, Duration::from_secs(10));
    // One round trip each before the pause: both are known to speak their protocol.
    text_conn.write_all(b"version\r\n").unwrap();
    read_until(&mut text_conn, b"\r\n");
    bin_conn.write_all(&binary_set(b"bk", b"0")).unwrap();
    let mut head = [0u8; 24];
    bin_conn.read_exact(&mut head).unwrap();
    assert_eq!((head[0], head[1], head[6], head[7]), (0x81, 0x01, 0, 0));

    assert_eq!(
        admin.cmd("CLIENT PAUSE 60000 WRITE"),
        Reply::Simple("OK".into())
    );
    // Reads go on; the writes of both protocols wait.
    text_conn.write_all(b"get mk\r\n").unwrap();
    assert_eq!(read_until(&mut text_conn, b"END\r\n"), b"END\r\n");
    text_conn.write_all(b"set mk 5 0 1\r\nv\r\n").unwrap();
    bin_conn.write_all(&binary_set(b"bk", b"1")).unwrap();
    assert!(
        silent(&mut text_conn, Duration::from_millis(300)),
        "a memcached set was answered during CLIENT PAUSE WRITE"
    );
    assert!(
        silent(&mut bin_conn, Duration::from_millis(100)),
        "a binary set was answered during CLIENT PAUSE WRITE"
    );
    assert_eq!(admin.cmd("GET mk"), Reply::Bulk(None), "the set ran");
    assert_eq!(admin.cmd("GET bk"), Reply::bulk("0"), "the binary set ran");
    assert_eq!(admin.cmd("CLIENT UNPAUSE"), Reply::Simple("OK".into()));
    assert_eq!(read_until(&mut text_conn, b"STORED\r\n"), b"STORED\r\n");
    bin_conn.read_exact(&mut head).unwrap();
    assert_eq!((head[0], head[1], head[6], head[7]), (0x81, 0x01, 0, 0));
    assert_eq!(admin.cmd("GET mk"), Reply::bulk("v"));
    assert_eq!(admin.cmd("GET bk"), Reply::bulk("1"));

    // ALL: a memcached read waits too.
    assert_eq!(
        admin.cmd("CLIENT PAUSE 60000 ALL"),
        Reply::Simple("OK".into())
    );
    text_conn.write_all(b"get mk\r\n").unwrap();
    assert!(
        silent(&mut text_conn, Duration::from_millis(300)),
        "a memcached get was answered during CLIENT PAUSE ALL"
    );
    assert_healthy(&mut server);
}
