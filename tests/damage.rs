//! Damage is named: a store LMDB finds corrupt, or whose records do not decode, is answered
//! `SERVER_ERROR storage corrupted` (text and meta), status 0x84 `storage corrupted` (binary)
//! and `-ERR storage corrupted ...` (RESP), logged once, and `memkeep check` names it; a
//! healthy store, even one a kill -9 left with log to replay, passes `memkeep check`.
//!
//! The damage is done to a cleanly stopped store's `data.mdb`, as a disk would do it: a leaf
//! page of the items tree turned to zeros (a page that never reached the disk), or one byte of
//! a stored item's header changed (a bit flip LMDB cannot see: it keeps no page checksums).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

const MC_DAMAGED: &str = "SERVER_ERROR storage corrupted\r\n";
const LOG_LINE: &str = "storage corrupted in ";

/// A memcached-protocol connection.
struct Mc {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Mc {
    fn new(server: &Server) -> Mc {
        let s = server.connect();
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Mc {
            w: s.try_clone().expect("clone"),
            r: BufReader::new(s),
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("reply");
        l
    }

    /// Sends `req` and reads one line.
    fn cmd(&mut self, req: &str) -> String {
        self.w.write_all(req.as_bytes()).expect("send");
        self.line()
    }

    /// `get key`: the whole reply (value line, value, END) as text.
    fn get(&mut self, key: &str) -> String {
        let first = self.cmd(&format!("get {key}\r\n"));
        if !first.starts_with("VALUE") {
            return first;
        }
        let mut all = first;
        all.push_str(&self.line());
        all.push_str(&self.line());
        all
    }
}

/// A binary-protocol GET on a fresh connection: (status, body).
fn binary_get(server: &Server, key: &[u8]) -> (u16, Vec<u8>) {
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut req = vec![0x80, 0x00];
    req.extend_from_slice(&(key.len() as u16).to_be_bytes());
    req.extend_from_slice(&[0, 0, 0, 0]); // extras, data type, vbucket
    req.extend_from_slice(&(key.len() as u32).to_be_bytes());
    req.extend_from_slice(&7u32.to_be_bytes()); // opaque
    req.extend_from_slice(&0u64.to_be_bytes()); // cas
    req.extend_from_slice(key);
    s.write_all(&req).expect("send");
    let mut head = [0u8; 24];
    s.read_exact(&mut head).expect("response header");
    assert_eq!(head[0], 0x81, "response magic");
    let status = u16::from_be_bytes([head[6], head[7]]);
    let body_len = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
    let mut body = vec![0u8; body_len];
    s.read_exact(&mut body).expect("response body");
    (status, body)
}

/// `memkeep check DIR`.
fn check(dir: &Path) -> Output {
    Command::new(BIN)
        .arg("check")
        .arg(dir)
        .output()
        .expect("run memkeep check")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// LMDB's page size, from the first meta page (the free tree's `md_pad`).
fn page_size(data: &[u8]) -> usize {
    u32::from_le_bytes(data[40..44].try_into().expect("meta page")) as usize
}

/// Calls `damage(page)` on every leaf page of `data.mdb` that holds `needle` (the live copy
/// of the page and any stale copies in freed pages alike); returns how many it changed.
fn damage_leaf_pages(dir: &Path, needle: &[u8], damage: impl Fn(&mut [u8])) -> usize {
    let path = dir.join("data.mdb");
    let mut data = std::fs::read(&path).expect("read data.mdb");
    let psize = page_size(&data);
    let mut n = 0;
    // Pages 0 and 1 are the meta pages.
    for page in data.chunks_mut(psize).skip(2) {
        let flags = u16::from_le_bytes([page[10], page[11]]);
        let leaf = flags & 0x02 != 0;
        if leaf && page.windows(needle.len()).any(|w| w == needle) {
            damage(page);
            n += 1;
        }
    }
    std::fs::write(&path, &data).expect("write data.mdb");
    n
}

fn occurrences(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn a_zeroed_leaf_page_is_answered_storage_corrupted_in_every_protocol_and_logged_once() {
    let mut server = Server::start_with(
        BIN,
        Options {
            resp: true,
            args: vec!["--sync".into(), "always".into()],
            ..Options::default()
        },
    );
    let mut mc = Mc::new(&server);
    assert_eq!(
        mc.cmd("set the-zeroed-key 0 0 5\r\nhello\r\n"),
        "STORED\r\n"
    );
    assert_eq!(mc.cmd("set its-neighbour 0 0 1\r\nx\r\n"), "STORED\r\n");
    drop(mc);
    server.stop();
    let dir = server.data_dir().to_path_buf();
    let zeroed = damage_leaf_pages(&dir, b"the-zeroed-key", |p| p.fill(0));
    assert!(zeroed >= 1, "no leaf page holds the key");

    server.relaunch();
    let mut mc = Mc::new(&server);
    assert_eq!(mc.get("the-zeroed-key"), MC_DAMAGED);
    assert_eq!(mc.cmd("mg the-zeroed-key v\r\n"), MC_DAMAGED);
    assert_eq!(mc.cmd("set the-zeroed-key 0 0 1\r\nz\r\n"), MC_DAMAGED);
    assert_eq!(mc.cmd("add another-key 0 0 1\r\nz\r\n"), MC_DAMAGED);
    assert_eq!(mc.cmd("rget a z 0 0 10\r\n"), MC_DAMAGED);
    let (status, body) = binary_get(&server, b"the-zeroed-key");
    assert_eq!(
        (status, text(&body)),
        (0x84, "storage corrupted".to_string())
    );
    let mut resp = Resp::connect(server.resp_addr().expect("resp port"));
    for cmd in [
        "GET the-zeroed-key",
        "SET the-zeroed-key v",
        "EXISTS its-neighbour",
    ] {
        match resp.cmd(cmd) {
            Reply::Error(e) => assert!(e.starts_with("ERR storage corrupted"), "{cmd}: {e}"),
            other => panic!("{cmd}: expected the damage error, got {other:?}"),
        }
    }
    // Commands that touch no damaged page still work.
    assert_eq!(resp.cmd("PING"), Reply::Simple("PONG".into()));
    drop((mc, resp));
    server.stop();
    let log = server.stderr();
    assert_eq!(occurrences(&log, LOG_LINE), 1, "{log}");
    let named = std::fs::canonicalize(&dir).expect("canonical data dir");
    assert!(
        log.contains(&format!(
            "storage corrupted in {}: MDB_CORRUPTED",
            named.display()
        )) && log.contains(&format!("run `memkeep check {}`", named.display())),
        "{log}"
    );

    let out = check(&dir);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("problem: ") && l.contains("MDB_CORRUPTED")),
        "{stdout}"
    );
    assert!(stdout.contains("problem found"), "{stdout}");
}

#[test]
fn a_flipped_item_header_is_answered_storage_corrupted_and_named_by_check() {
    let mut server = Server::start_with(
        BIN,
        Options {
            resp: true,
            args: vec!["--sync".into(), "always".into()],
            ..Options::default()
        },
    );
    let mut mc = Mc::new(&server);
    assert_eq!(
        mc.cmd("set the-flipped-key 0 0 5\r\nhello\r\n"),
        "STORED\r\n"
    );
    assert_eq!(mc.cmd("set intact-key 0 0 5\r\nworld\r\n"), "STORED\r\n");
    drop(mc);
    server.stop();
    let dir = server.data_dir().to_path_buf();
    // An item's record follows its key in the leaf node: byte 0 is the format version (1).
    let needle = b"the-flipped-key\x01";
    let flipped = damage_leaf_pages(&dir, needle, |p| {
        if let Some(at) = p.windows(needle.len()).position(|w| w == needle) {
            p[at + needle.len() - 1] = 0x7f;
        }
    });
    assert!(flipped >= 1, "no leaf page holds the item");

    server.relaunch();
    let mut mc = Mc::new(&server);
    assert_eq!(mc.get("the-flipped-key"), MC_DAMAGED);
    assert_eq!(
        mc.get("intact-key"),
        "VALUE intact-key 0 5\r\nworld\r\nEND\r\n"
    );
    assert_eq!(mc.cmd("append the-flipped-key 0 0 1\r\n!\r\n"), MC_DAMAGED);
    assert_eq!(mc.cmd("mg the-flipped-key v\r\n"), MC_DAMAGED);
    let (status, body) = binary_get(&server, b"the-flipped-key");
    assert_eq!(
        (status, text(&body)),
        (0x84, "storage corrupted".to_string())
    );
    let mut resp = Resp::connect(server.resp_addr().expect("resp port"));
    for cmd in ["GET the-flipped-key", "APPEND the-flipped-key !", "KEYS *"] {
        match resp.cmd(cmd) {
            Reply::Error(e) => assert!(e.starts_with("ERR storage corrupted"), "{cmd}: {e}"),
            other => panic!("{cmd}: expected the damage error, got {other:?}"),
        }
    }
    assert_eq!(resp.cmd("GET intact-key"), Reply::bulk("world"));
    drop((mc, resp));
    server.stop();
    let log = server.stderr();
    assert_eq!(occurrences(&log, LOG_LINE), 1, "{log}");
    assert!(log.contains("unknown item format version 127"), "{log}");

    let out = check(&dir);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("problem: item \"the-flipped-key\"")
                && l.contains("unknown item format version 127")),
        "{stdout}"
    );
    assert!(stdout.contains("1 problem found"), "{stdout}");
}

/// The number `summary:` gives for log batches to replay.
fn batches_to_replay(stdout: &str) -> u64 {
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary: "))
        .unwrap_or_else(|| panic!("no summary in {stdout}"));
    let before = summary
        .split(" log batches to replay")
        .next()
        .unwrap_or_default();
    before
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no batch count in {summary}"))
}

/// Writes every kind of value, with expiries, and deletes (which leave elements to reclaim).
fn write_everything(server: &Server, round: usize) {
    let mut mc = Mc::new(server);
    for i in 0..50 {
        let v = format!("value-{round}-{i}");
        let exptime = if i % 3 == 0 { 3600 } else { 0 };
        let req = format!("set s{i} {i} {exptime} {}\r\n{v}\r\n", v.len());
        assert_eq!(mc.cmd(&req), "STORED\r\n");
    }
    assert_eq!(
        mc.cmd("ms meta-key 2 T600\r\nmv\r\n"),
        "HD\r\n",
        "meta set with a TTL"
    );
    let mut r = Resp::connect(server.resp_addr().expect("resp port"));
    for cmd in [
        // Each round starts these afresh (the last one made doomed-z a string).
        "DEL list doomed-z",
        "RPUSH list a b c d e",
        "LPUSH list z",
        "LPOP list",
        "HSET hash f1 v1 f2 v2 f3 v3",
        "HDEL hash f2",
        "SADD set m1 m2 m3",
        "SREM set m1",
        "ZADD zset 1 one 2 two 3.5 three -4 minus",
        "ZINCRBY zset 10 one",
        "ZREM zset two",
        "RPUSH doomed 1 2 3 4 5 6 7 8 9",
        "SADD doomed-set a b c",
        "ZADD doomed-z 1 a 2 b",
        "RENAME hash hash2",
        "SET expiring v EX 1000",
        "EXPIRE list 5000",
        "SET persisted v EX 100",
        "PERSIST persisted",
        "INCR counter",
    ] {
        if let Reply::Error(e) = r.cmd(cmd) {
            panic!("{cmd}: {e}");
        }
    }
    for cmd in ["DEL doomed doomed-set", "SET doomed-z now-a-string"] {
        if let Reply::Error(e) = r.cmd(cmd) {
            panic!("{cmd}: {e}");
        }
    }
    // The last write's reply has come back: it is in the log.
    assert_eq!(r.cmd("SET last-write done"), Reply::Simple("OK".into()));
}

#[test]
fn check_passes_a_healthy_store_left_by_kill_9_with_log_to_replay() {
    let mut server = Server::start_with(
        BIN,
        Options {
            resp: true,
            args: vec!["--sync".into(), "always".into()],
            ..Options::default()
        },
    );
    let dir = server.data_dir().to_path_buf();
    write_everything(&server, 0);
    // A store a server holds is refused, and left as it was.
    let out = check(&dir);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("stop the server first"),
        "{}",
        text(&out.stderr)
    );
    // A checkpoint can land between the last write and the kill, leaving nothing to replay;
    // go again until the kill leaves a log (almost always the first time).
    let mut replayed = 0;
    for round in 1..=5 {
        write_everything(&server, round);
        server.kill9();
        let out = check(&dir);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "round {round}:\n{stdout}{}",
            text(&out.stderr)
        );
        assert!(!stdout.contains("problem:"), "{stdout}");
        assert!(stdout.contains("no problems found"), "{stdout}");
        assert!(
            stdout.contains("4 collections: 1 lists, 1 hashes, 1 sets, 1 sorted sets"),
            "{stdout}"
        );
        replayed = batches_to_replay(&stdout);
        if replayed > 0 {
            break;
        }
        server.relaunch();
    }
    assert!(replayed > 0, "every kill came right after a checkpoint");
    // The check changed nothing: the server recovers the same store and serves it.
    server.relaunch();
    let mut r = Resp::connect(server.resp_addr().expect("resp port"));
    assert_eq!(r.cmd("GET last-write"), Reply::bulk("done"));
    assert_eq!(
        r.cmd("LRANGE list 0 -1"),
        Reply::bulks(&["a", "b", "c", "d", "e"])
    );
    assert_eq!(
        r.cmd("HGETALL hash2"),
        Reply::bulks(&["f1", "v1", "f3", "v3"])
    );
    server.stop();
    let out = check(&dir);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(batches_to_replay(&text(&out.stdout)), 0);
}
