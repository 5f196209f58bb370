//! RESP values past memcached's item size: the RESP port's own bulk limit
//! (`proto_max_bulk_len`, `--proto-max-bulk-len`, 512 MB by default as in Redis) is independent
//! of `max_item_size` (memcached's, 1 MiB by default). A 4 MB value round-trips over SET/GET
//! (and survives a restart: LMDB keeps it in overflow pages), APPEND and SETRANGE stop at the
//! limit with Redis's error, and a bulk over the limit gets Redis's protocol error and the
//! connection closed. Bit offsets and LCS's table follow the same limit, and a string the bit
//! commands write reads back through memcached's `gets` as the same bytes, with its flags.
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

/// `gets key` over the memcached text protocol: (flags, cas, value), or None on a miss.
fn mc_gets(m: &mut std::net::TcpStream, key: &str) -> Option<(u32, u64, Vec<u8>)> {
    m.write_all(format!("gets {key}\r\n").as_bytes())
        .expect("send");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // Bounded: the reply ends with END, and every read has a timeout.
    for _ in 0..10_000 {
        if got.ends_with(b"END\r\n") {
            break;
        }
        let n = m.read(&mut buf).expect("reply");
        assert!(n > 0, "closed");
        got.extend_from_slice(&buf[..n]);
    }
    if got == b"END\r\n" {
        return None;
    }
    let eol = got.windows(2).position(|w| w == b"\r\n").expect("a header");
    let header = String::from_utf8_lossy(&got[..eol]).to_string();
    let f: Vec<&str> = header.split(' ').collect();
    assert_eq!((f[0], f[1]), ("VALUE", key), "{header}");
    let len: usize = f[3].parse().expect("length");
    let value = got[eol + 2..eol + 2 + len].to_vec();
    Some((
        f[2].parse().expect("flags"),
        f[4].parse().expect("cas"),
        value,
    ))
}

#[test]
fn bit_writes_read_back_through_memcached_as_the_same_bytes() {
    let s = server(&[]);
    let mut r = resp(&s);
    let mut m = s.connect();
    m.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    // A string SETBIT creates: bits 1, 2 and 7 make 'a', bit 23 pads with a zero byte.
    for bit in [1, 2, 7, 23] {
        assert_eq!(r.cmd(&format!("SETBIT made {bit} 1")), Reply::Int(0));
    }
    let (flags, _, value) = mc_gets(&mut m, "made").expect("a hit");
    assert_eq!((flags, value), (0, b"a\x00\x01".to_vec()));

    // An item memcached stored keeps its flags across SETBIT and BITFIELD (as with SETRANGE),
    // and each change takes a new CAS.
    m.write_all(b"set mc 42 0 1\r\na\r\n").expect("send");
    let mut line = [0u8; 64];
    let n = m.read(&mut line).expect("reply");
    assert_eq!(&line[..n], b"STORED\r\n");
    let (_, cas0, _) = mc_gets(&mut m, "mc").expect("a hit");
    assert_eq!(r.cmd("SETBIT mc 6 1"), Reply::Int(0));
    let (flags, cas1, value) = mc_gets(&mut m, "mc").expect("a hit");
    assert_eq!((flags, value.as_slice()), (42, &b"c"[..]));
    assert_ne!(cas1, cas0);
    // Setting a bit that is already set changes nothing, not even the CAS.
    assert_eq!(r.cmd("SETBIT mc 6 1"), Reply::Int(1));
    assert_eq!(mc_gets(&mut m, "mc").map(|g| g.1), Some(cas1));
    assert_eq!(
        r.cmd("BITFIELD mc SET u8 #1 98 INCRBY u8 0 1"),
        Reply::Array(Some(vec![Reply::Int(0), Reply::Int(100)]))
    );
    let (flags, cas2, value) = mc_gets(&mut m, "mc").expect("a hit");
    assert_eq!((flags, value.as_slice()), (42, &b"db"[..]));
    assert_ne!(cas2, cas1);
    // BITOP makes a fresh string, as SET does: flags 0.
    assert_eq!(r.cmd("BITOP OR dest mc"), Reply::Int(2));
    assert_eq!(
        mc_gets(&mut m, "dest").map(|g| (g.0, g.2)),
        Some((0, b"db".to_vec()))
    );
    // memcached's writes are read by the bit commands.
    m.write_all(b"append mc 0 0 1\r\n\xff\r\n").expect("send");
    let n = m.read(&mut line).expect("reply");
    assert_eq!(&line[..n], b"STORED\r\n");
    assert_eq!(r.cmd("BITCOUNT mc 2 2"), Reply::Int(8));
    assert_eq!(r.cmd("BITPOS mc 1 2"), Reply::Int(16));
}

#[test]
fn bit_offsets_and_lcs_tables_follow_the_bulk_limit() {
    let s = server(&["--proto-max-bulk-len", "1m"]);
    let mut r = resp(&s);
    let bits = 8u64 << 20;
    let offset_err = Reply::Error("ERR bit offset is not an integer or out of range".into());
    // As in Redis, a bit offset must fall in the first proto-max-bulk-len bytes.
    assert_eq!(r.cmd(&format!("SETBIT k {bits} 1")), offset_err);
    assert_eq!(r.cmd(&format!("GETBIT k {bits}")), offset_err);
    assert_eq!(r.cmd(&format!("BITFIELD k GET u8 {bits}")), offset_err);
    assert_eq!(r.cmd(&format!("SETBIT k {} 1", bits - 1)), Reply::Int(0));
    assert_eq!(r.cmd("STRLEN k"), Reply::Int(1 << 20));
    assert_eq!(r.cmd("BITCOUNT k"), Reply::Int(1));
    assert_eq!(r.cmd("BITPOS k 1"), Reply::Int(bits as i64 - 1));
    // A field that starts inside the limit but would grow the string past it is refused with
    // SETRANGE's error (Redis lets it grow a few bytes over), and changes nothing.
    assert_eq!(
        r.cmd(&format!("BITFIELD k SET u16 {} 1", bits - 8)),
        Reply::Error("ERR string exceeds maximum allowed size (proto-max-bulk-len)".into())
    );
    assert_eq!(r.cmd("STRLEN k"), Reply::Int(1 << 20));
    assert_eq!(
        r.cmd(&format!("BITFIELD k GET u16 {}", bits - 8)),
        Reply::Array(Some(vec![Reply::Int(0x100)]))
    );
    // LCS's table of (n+1)^2 32-bit cells: 511 bytes each fit in 1 MiB, 512 do not.
    assert_eq!(r.cmd("SETRANGE a 510 x"), Reply::Int(511));
    assert_eq!(r.cmd("SETRANGE b 510 x"), Reply::Int(511));
    assert_eq!(r.cmd("LCS a b LEN"), Reply::Int(511));
    assert_eq!(r.cmd("SETRANGE a 511 x"), Reply::Int(512));
    assert_eq!(r.cmd("SETRANGE b 511 x"), Reply::Int(512));
    assert_eq!(
        r.cmd("LCS a b"),
        Reply::Error(
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len".into()
        )
    );
    assert_eq!(r.cmd("PING"), Reply::Simple("PONG".into()));
}
