//! RESP values past memcached's item size: the RESP port's own bulk limit
//! (`proto_max_bulk_len`, `--proto-max-bulk-len`, 512 MB by default as in Redis) is independent
//! of `max_item_size` (memcached's, 1 MiB by default). A 4 MB value round-trips over SET/GET
//! (and survives a restart: LMDB keeps it in overflow pages), APPEND and SETRANGE stop at the
//! limit with Redis's error, and a bulk over the limit gets Redis's protocol error and the
//! connection closed.
//!
//! Invariants: every read has a timeout (the client's); nothing depends on timing; each test
//! stops only the server it started.

mod common;

use std::io::{Read, Write};

use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

fn server(args: &[&str]) -> Server {
    Server::start_with(
        BIN,
        Options {
            args: args.iter().map(|s| s.to_string()).collect(),
            resp: true,
            ..Options::default()
        },
    )
}

fn resp(s: &Server) -> Resp {
    Resp::connect(s.resp_addr().expect("a RESP port"))
}

/// Bytes that are not one repeated byte, so a shifted or truncated copy shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn bulk(v: &[u8]) -> Reply {
    Reply::Bulk(Some(v.to_vec()))
}

#[test]
fn four_megabyte_values_round_trip_with_the_default_limits() {
    let mut s = server(&[]);
    let value = pattern(4 << 20);
    {
        let mut r = resp(&s);
        assert_eq!(
            r.cmd("CONFIG GET proto-max-bulk-len"),
            Reply::Array(Some(vec![
                Reply::bulk("proto-max-bulk-len"),
                Reply::bulk("536870912")
            ]))
        );
        assert_eq!(
            r.call(&[b"SET", b"big", &value]),
            Reply::Simple("OK".into())
        );
        assert_eq!(r.cmd("GET big"), bulk(&value));
        assert_eq!(r.cmd("STRLEN big"), Reply::Int(4 << 20));
        // APPEND past memcached's item size is fine: the RESP limit is what counts.
        assert_eq!(r.cmd("APPEND big xyz"), Reply::Int((4 << 20) + 3));
        assert_eq!(
            r.cmd(&format!("GETRANGE big {} -1", (4 << 20) - 2)),
            bulk(&[
                value[value.len() - 2],
                value[value.len() - 1],
                b'x',
                b'y',
                b'z'
            ])
        );
        assert_eq!(
            r.call(&[b"SETRANGE", b"big", b"0", b"abc"]),
            Reply::Int((4 << 20) + 3)
        );
    }
    s.restart();
    let mut r = resp(&s);
    let mut want = value.clone();
    want[..3].copy_from_slice(b"abc");
    want.extend_from_slice(b"xyz");
    assert_eq!(r.cmd("GET big"), bulk(&want));
}

#[test]
fn the_bulk_limit_is_its_own_setting() {
    let s = server(&["--proto-max-bulk-len", "2m", "--max-item-size", "1m"]);
    let mut r = resp(&s);
    assert_eq!(
        r.cmd("CONFIG GET proto-max-bulk-len"),
        Reply::Array(Some(vec![
            Reply::bulk("proto-max-bulk-len"),
            Reply::bulk("2097152")
        ]))
    );
    // Exactly the limit is accepted, over memcached's item size.
    let value = pattern(2 << 20);
    assert_eq!(r.call(&[b"SET", b"k", &value]), Reply::Simple("OK".into()));
    assert_eq!(r.cmd("GET k"), bulk(&value));
    // Strings made longer than the limit are refused, and the value stays as it was.
    let limit_err =
        Reply::Error("ERR string exceeds maximum allowed size (proto-max-bulk-len)".into());
    assert_eq!(r.cmd("APPEND k x"), limit_err);
    assert_eq!(r.cmd(&format!("SETRANGE k {} x", 2 << 20)), limit_err);
    assert_eq!(r.cmd("SETRANGE k 0 x"), Reply::Int(2 << 20));
    assert_eq!(r.cmd("STRLEN k"), Reply::Int(2 << 20));

    // A bulk one byte over the limit: Redis's protocol error, then the connection closes.
    let mut c = Server::connect_to(s.resp_addr().expect("a RESP port")).expect("connect");
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    c.write_all(format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n", (2 << 20) + 1).as_bytes())
        .expect("send");
    let mut got = Vec::new();
    c.read_to_end(&mut got).expect("read to the close");
    assert_eq!(got, b"-ERR Protocol error: invalid bulk length\r\n");

    // memcached's own limit is untouched: 1 MiB.
    let mut m = s.connect();
    m.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let big = vec![b'v'; (1 << 20) + 1];
    m.write_all(format!("set m 0 0 {}\r\n", big.len()).as_bytes())
        .expect("send");
    m.write_all(&big).expect("send");
    m.write_all(b"\r\n").expect("send");
    let mut line = [0u8; 64];
    let n = m.read(&mut line).expect("reply");
    assert!(
        line[..n].starts_with(b"SERVER_ERROR object too large for cache"),
        "{:?}",
        String::from_utf8_lossy(&line[..n])
    );
    assert_eq!(r.cmd("PING"), Reply::Simple("PONG".into()));
}

#[test]
fn the_bulk_limit_is_checked_at_startup() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for bad in ["512k", "2g"] {
        let out = std::process::Command::new(BIN)
            .current_dir(dir.path())
            .args([
                "--proto-max-bulk-len",
                bad,
                "--port",
                "0",
                "--resp-port",
                "0",
            ])
            .output()
            .expect("run memkeep");
        assert!(!out.status.success(), "{bad} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("proto_max_bulk_len must be between 1m and 1g"),
            "{bad}: {err}"
        );
    }
}
