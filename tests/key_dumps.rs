//! `lru_crawler metadump` and `stats cachedump` on a store larger than one chunk of the walk
//! (`server/dump.rs`): every key is listed exactly once, and while a client leaves a long dump
//! unread, the same worker goes on serving its other connections.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Server;
use common::programs::assert_healthy;

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
const KEYS: usize = 100_000;

fn connect(server: &Server) -> TcpStream {
    let c = TcpStream::connect(server.addr()).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    c
}

fn fill(server: &Server) {
    let mut c = connect(server);
    let mut batch = Vec::new();
    for i in 0..KEYS {
        batch.extend_from_slice(format!("set key:{i:06} 0 0 3 noreply\r\nabc\r\n").as_bytes());
    }
    // Answered once the writes before it are acknowledged.
    batch.extend_from_slice(b"version\r\n");
    c.write_all(&batch).expect("send");
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line).expect("version");
    assert!(line.starts_with("VERSION "), "{line:?}");
}

/// Reads dump lines up to `END`; returns them without their line ends.
fn read_dump(r: &mut impl BufRead) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).expect("dump line");
        assert!(n > 0, "connection closed before END");
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line == "END" {
            return lines;
        }
        lines.push(line);
    }
}

#[test]
fn metadump_streams_every_key_while_the_worker_serves_others() {
    let mut server = Server::start(BIN, &["-t", "1"]);
    fill(&server);
    let dumper = connect(&server);
    (&dumper)
        .write_all(b"lru_crawler metadump all\r\n")
        .expect("send");
    // The dump (about 7 MB) does not fit the connection's output limit: it pauses until the
    // client reads. Meanwhile another connection on the only worker is answered.
    let mut other = connect(&server);
    other.write_all(b"mg key:000042 v\r\n").expect("send");
    let mut reply = [0u8; 11];
    other.read_exact(&mut reply).expect("mg reply");
    assert_eq!(&reply, b"VA 3\r\nabc\r\n");
    let mut r = BufReader::new(&dumper);
    let lines = read_dump(&mut r);
    let mut seen = HashSet::new();
    for l in &lines {
        let key = l
            .strip_prefix("key=")
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_else(|| panic!("not a metadump line: {l:?}"));
        assert!(l.contains(" cls=1 size="), "{l:?}");
        assert!(seen.insert(key.to_string()), "{key} listed twice");
    }
    assert_eq!(seen.len(), KEYS, "every key once");
    assert!(seen.contains("key%3A000000") && seen.contains("key%3A099999"));
    // The connection goes on after the dump.
    (&dumper).write_all(b"mn\r\n").expect("send");
    let mut line = String::new();
    r.read_line(&mut line).expect("mn");
    assert_eq!(line, "MN\r\n");
    assert_healthy(&mut server);
}

#[test]
fn cachedump_stops_at_limit_and_at_two_megabytes() {
    let mut server = Server::start(BIN, &[]);
    fill(&server);
    let c = connect(&server);
    let mut w = c.try_clone().expect("clone");
    let mut r = BufReader::new(c);
    w.write_all(b"stats cachedump 1 1000\r\n").expect("send");
    let lines = read_dump(&mut r);
    assert_eq!(lines.len(), 1000);
    assert_eq!(lines[0], "ITEM key:000000 [3 b; 0 s]");
    assert_eq!(lines[999], "ITEM key:000999 [3 b; 0 s]");
    // All of them would be about 2.6 MB: the reply stops before 2 MB, in key order.
    w.write_all(b"stats cachedump 1 0\r\n").expect("send");
    let lines = read_dump(&mut r);
    let bytes: usize = lines.iter().map(|l| l.len() + 2).sum();
    assert!(
        bytes + 5 <= 2 * 1024 * 1024 && bytes + 5 + 30 > 2 * 1024 * 1024,
        "{bytes} bytes in {} lines",
        lines.len()
    );
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l, &format!("ITEM key:{i:06} [3 b; 0 s]"));
    }
    assert_healthy(&mut server);
}
