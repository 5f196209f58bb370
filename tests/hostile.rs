//! Hostile clients (issue 6): garbage bytes, absurd declared lengths, a million-key get line,
//! NUL bytes in keys, clients that pipeline and never read their replies, slowloris clients,
//! 5,000 simultaneous connections and abrupt disconnects mid-value, on both ports where the case
//! applies. Each test starts its own server and writes sentinel keys first; after its hostile
//! case a fresh client on each port checks that every sentinel still has its value and flags and
//! that the server still answers.
//!
//! Memory is read from the server's `/proc/<pid>/status` (`VmRSS` now, `VmHWM` its peak) and
//! bounded generously where a case could make the server allocate without limit.
//!
//! `MEMKEEP_HOSTILE_BIG=1` makes the never-reading clients ask for far more (up to 1 GB of
//! pipelined requests, multi-get lines that would produce 100 GB of replies each). Run with
//! `-- --nocapture` to see the measured sizes and peak RSS of every case.
//!
//! Invariants: every socket read and write has a timeout and every wait is a bounded polling
//! loop, so a server that stops answering fails the test instead of hanging it; every server is
//! killed by its `Drop`; random data comes from fixed seeds.

mod common;

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::programs::assert_healthy;
use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
/// Read timeout of the checking clients: generous for a loaded 2-core machine.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the bystander client's each request may take while a hostile client is at work.
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline for conditions polled in a loop (connections counted down, idle kicks).
const POLL_DEADLINE: Duration = Duration::from_secs(20);
/// The bound on the server's memory growth under the never-reading clients.
const GROWTH_LIMIT_KB: u64 = 200 * 1024;
const MIB: usize = 1024 * 1024;
const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";

fn big() -> bool {
    std::env::var("MEMKEEP_HOSTILE_BIG").is_ok_and(|v| v == "1")
}

fn start(extra: &[&str]) -> Server {
    Server::start_with(
        BIN,
        Options {
            args: extra.iter().map(|s| s.to_string()).collect(),
            resp: true,
            ..Options::default()
        },
    )
}

fn resp_addr(server: &Server) -> SocketAddr {
    server.resp_addr().expect("the server listens for RESP")
}

// ---------------------------------------------------------------------------------------------
// Data

/// A deterministic xorshift generator, so every run sends the same bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next() >> 24) as u8).collect()
    }
}

/// `len` bytes of every value 0x00-0xff (CR, LF and NUL included), different for each seed.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).bytes(len)
}

/// Printable form of bytes for failure messages (clipped).
fn show(b: &[u8]) -> String {
    let mut s = String::new();
    for &c in b.iter().take(300) {
        match c {
            b'\r' => s.push_str("\\r"),
            b'\n' => s.push_str("\\n"),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    if b.len() > 300 {
        s.push_str(&format!("... ({} bytes)", b.len()));
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Clients

fn open(addr: SocketAddr, read_timeout: Duration) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_nodelay(true).expect("nodelay");
    s.set_read_timeout(Some(read_timeout)).expect("timeout");
    s.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
    s
}

/// A memcached text-protocol client on a blocking socket with timeouts.
struct Mc {
    r: BufReader<TcpStream>,
    w: TcpStream,
    name: String,
}

impl Mc {
    fn connect(addr: SocketAddr, name: &str) -> Mc {
        Mc::connect_with(addr, name, IO_TIMEOUT)
    }

    fn connect_with(addr: SocketAddr, name: &str, read_timeout: Duration) -> Mc {
        let s = open(addr, read_timeout);
        Mc {
            r: BufReader::with_capacity(256 * 1024, s.try_clone().expect("clone")),
            w: s,
            name: name.to_string(),
        }
    }

    fn send(&mut self, b: &[u8]) {
        if let Err(e) = self.w.write_all(b) {
            panic!("{}: write of {} bytes failed: {e}", self.name, b.len());
        }
    }

    /// The next line without its `\r\n`.
    fn line(&mut self) -> Vec<u8> {
        let mut l = Vec::new();
        match self.r.read_until(b'\n', &mut l) {
            Ok(0) => panic!("{}: connection closed while a line was expected", self.name),
            Ok(_) => {}
            Err(e) => panic!(
                "{}: reading a line failed: {e} (got {})",
                self.name,
                show(&l)
            ),
        }
        assert!(
            l.ends_with(b"\r\n"),
            "{}: line without CRLF: {}",
            self.name,
            show(&l)
        );
        l.truncate(l.len() - 2);
        l
    }

    fn expect(&mut self, want: &str) {
        let got = self.line();
        assert_eq!(
            show(&got),
            show(want.as_bytes()),
            "{}: unexpected reply",
            self.name
        );
    }

    /// `VALUE` blocks up to `END`: (key, flags, value, cas).
    fn values(&mut self) -> Vec<(String, u32, Vec<u8>, Option<u64>)> {
        let mut items = Vec::new();
        loop {
            let l = self.line();
            if l == b"END" {
                return items;
            }
            items.push(self.value_block(&l));
        }
    }

    /// One `VALUE <key> <flags> <bytes> [<cas>]` line's block.
    fn value_block(&mut self, l: &[u8]) -> (String, u32, Vec<u8>, Option<u64>) {
        let text = String::from_utf8_lossy(l).into_owned();
        let t: Vec<&str> = text.split(' ').collect();
        assert!(
            t[0] == "VALUE" && (t.len() == 4 || t.len() == 5),
            "{}: expected VALUE or END, got {}",
            self.name,
            show(l)
        );
        let flags: u32 = t[2].parse().expect("flags");
        let len: usize = t[3].parse().expect("length");
        let cas = t.get(4).map(|c| c.parse::<u64>().expect("cas"));
        let mut data = vec![0u8; len + 2];
        if let Err(e) = self.r.read_exact(&mut data) {
            panic!("{}: reading a {len}-byte value failed: {e}", self.name);
        }
        assert_eq!(&data[len..], b"\r\n", "{}: value without CRLF", self.name);
        data.truncate(len);
        (t[1].to_string(), flags, data, cas)
    }

    fn set(&mut self, key: &str, flags: u32, value: &[u8]) {
        let mut req = format!("set {key} {flags} 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.send(&req);
        self.expect("STORED");
    }

    fn get(&mut self, key: &str) -> Option<(u32, Vec<u8>)> {
        self.send(format!("get {key}\r\n").as_bytes());
        let mut v = self.values();
        assert!(
            v.len() <= 1,
            "{}: get {key} answered {} values",
            self.name,
            v.len()
        );
        v.pop().map(|(k, flags, value, _)| {
            assert_eq!(k, key, "{}: get answered another key", self.name);
            (flags, value)
        })
    }

    fn stats(&mut self) -> HashMap<String, String> {
        self.send(b"stats\r\n");
        let mut stats = HashMap::new();
        loop {
            let l = String::from_utf8(self.line()).expect("stats are text");
            if l == "END" {
                return stats;
            }
            let mut t = l.splitn(3, ' ');
            assert_eq!(t.next(), Some("STAT"), "{}: stats line {l:?}", self.name);
            let name = t.next().expect("stat name").to_string();
            stats.insert(name, t.next().expect("stat value").to_string());
        }
    }

    fn stat(&mut self, name: &str) -> u64 {
        let stats = self.stats();
        stats
            .get(name)
            .unwrap_or_else(|| panic!("no stat {name}"))
            .parse()
            .expect("a numeric stat")
    }

    fn version(&mut self) {
        self.send(b"version\r\n");
        let l = self.line();
        assert!(
            l.starts_with(b"VERSION "),
            "{}: version answered {}",
            self.name,
            show(&l)
        );
    }
}

/// Reads until the server closes the connection (EOF or reset) or `limit` passes. Returns what
/// arrived and whether the connection was closed.
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return (got, true),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => panic!("read failed: {e}"),
        }
    }
    (got, false)
}

/// Writes as much of `data` as the peer takes; stops at a write that times out or fails.
fn write_what_it_takes(s: &mut TcpStream, data: &[u8]) -> usize {
    let mut at = 0;
    while at < data.len() {
        match s.write(&data[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    at
}

/// Closes a socket with a TCP reset instead of a FIN (SO_LINGER with a zero timeout).
fn reset(s: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // Safety: a valid socket descriptor and a correctly sized option value.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", io::Error::last_os_error());
    drop(s);
}

fn resp_get(r: &mut Resp, key: &[u8]) -> Option<Vec<u8>> {
    match r.call(&[b"GET", key]) {
        Reply::Bulk(v) => v,
        other => panic!("GET {}: {other:?}", show(key)),
    }
}

fn resp_set(r: &mut Resp, key: &[u8], value: &[u8]) {
    let reply = r.call(&[b"SET", key, value]);
    assert_eq!(reply, Reply::Simple("OK".into()), "SET {}", show(key));
}

// ---------------------------------------------------------------------------------------------
// Server memory

/// The server's resident set now and its peak so far, in KiB.
#[derive(Debug, Clone, Copy)]
struct Mem {
    rss_kb: u64,
    hwm_kb: u64,
}

fn mem(server: &Server) -> Mem {
    let pid = server.pid().expect("the server runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    Mem {
        rss_kb: field("VmRSS:"),
        hwm_kb: field("VmHWM:"),
    }
}

/// How far the server's peak RSS rose above a baseline; prints both forms.
fn report_growth(case: &str, base: Mem, server: &Server) -> u64 {
    let now = mem(server);
    let growth = now.hwm_kb.saturating_sub(base.rss_kb);
    println!(
        "{case}: server VmRSS {} MiB before, VmRSS {} MiB / VmHWM {} MiB after: peak growth {} MiB \
         ({growth} kB)",
        base.rss_kb / 1024,
        now.rss_kb / 1024,
        now.hwm_kb / 1024,
        growth / 1024
    );
    growth
}

// ---------------------------------------------------------------------------------------------
// Sentinels and the bystander

/// Keys written at the start of a test, which every case must leave intact.
struct Sentinels {
    /// (key, flags, value); flags 0 for those written over RESP.
    items: Vec<(String, u32, Vec<u8>)>,
}

fn plant(server: &Server) -> Sentinels {
    let mut items = Vec::new();
    let mut mc = Mc::connect(server.addr(), "plant");
    for i in 0..16u64 {
        let key = format!("sentinel:mc:{i}");
        let flags = (i as u32).wrapping_mul(2_654_435_761);
        let value = pattern(i, [1, 100, 5000, 70_000][i as usize % 4]);
        mc.set(&key, flags, &value);
        items.push((key, flags, value));
    }
    let mut r = Resp::connect(resp_addr(server));
    for i in 0..8u64 {
        let key = format!("sentinel:resp:{i}");
        let value = pattern(100 + i, [3, 2000, 40_000][i as usize % 3]);
        resp_set(&mut r, key.as_bytes(), &value);
        items.push((key, 0, value));
    }
    Sentinels { items }
}

/// A fresh client on each port reads every sentinel back (value and flags on the memcached
/// port, the value over RESP) and the server answers `version` and `PING`.
fn verify(server: &mut Server, s: &Sentinels, case: &str) {
    assert_healthy(server);
    let mut mc = Mc::connect(server.addr(), &format!("{case}: sentinel check"));
    let keys: Vec<&str> = s.items.iter().map(|(k, _, _)| k.as_str()).collect();
    mc.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    let got = mc.values();
    assert_eq!(
        got.len(),
        s.items.len(),
        "{case}: sentinels missing over memcached: got {:?}",
        got.iter().map(|g| &g.0).collect::<Vec<_>>()
    );
    for ((key, flags, value), (gk, gf, gv, _)) in s.items.iter().zip(&got) {
        assert_eq!(gk, key, "{case}: sentinel order");
        assert_eq!(gf, flags, "{case}: flags of {key}");
        assert!(gv == value, "{case}: value of {key} changed");
    }
    mc.version();
    let mut r = Resp::connect(resp_addr(server));
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(keys.iter().map(|k| k.as_bytes()));
    let want = Reply::Array(Some(
        s.items
            .iter()
            .map(|(_, _, v)| Reply::Bulk(Some(v.clone())))
            .collect(),
    ));
    assert!(r.call(&args) == want, "{case}: sentinels differ over RESP");
    assert_eq!(r.cmd("PING"), Reply::Simple("PONG".into()), "{case}: PING");
}

/// A well-behaved client working on both ports while a hostile one is at it: every request must
/// be answered within `OP_TIMEOUT` with the right value.
struct Bystander {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<u64>,
}

impl Bystander {
    fn start(server: &Server, tag: &str) -> Bystander {
        let (addr, raddr) = (server.addr(), resp_addr(server));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let tag = tag.to_string();
        let handle = thread::spawn(move || {
            let mut mc = Mc::connect_with(addr, &format!("{tag}: bystander"), OP_TIMEOUT);
            let mut r = Resp::connect(raddr);
            r.set_read_timeout(OP_TIMEOUT);
            let key = format!("bystander:{}", tag.replace(' ', "-"));
            let mut ops = 0u64;
            while !flag.load(Ordering::Acquire) {
                ops += 1;
                let value = format!("value-{ops}").into_bytes();
                mc.set(&key, ops as u32, &value);
                assert_eq!(mc.get(&key), Some((ops as u32, value.clone())));
                assert_eq!(resp_get(&mut r, key.as_bytes()), Some(value));
                let n = r.call(&[b"INCR", format!("{key}:n").as_bytes()]);
                assert_eq!(n, Reply::Int(ops as i64), "INCR");
                thread::sleep(Duration::from_millis(20));
            }
            ops
        });
        Bystander { stop, handle }
    }

    /// Stops the bystander; fails the test if any of its requests failed or timed out.
    fn finish(self, case: &str) {
        self.stop.store(true, Ordering::Release);
        match self.handle.join() {
            Ok(ops) => {
                assert!(ops > 0, "{case}: the bystander got nothing done");
                println!("{case}: the bystander completed {ops} rounds meanwhile");
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{case}: the bystander client failed while the hostile one ran: {msg}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Garbage

/// Sends `blob` and then `marker` on a fresh connection, half-closes it, and returns what the
/// server sent until it closed (which it must, at the latest when it sees the EOF).
fn garbage_round(addr: SocketAddr, blob: &[u8], marker: &[u8]) -> Vec<u8> {
    let mut s = open(addr, Duration::from_millis(200));
    // The server may close before taking everything (a line past the limit): write errors are
    // fine, the reply is what counts.
    let mut data = blob.to_vec();
    data.extend_from_slice(marker);
    write_what_it_takes(&mut s, &data);
    let _ = s.shutdown(Shutdown::Write);
    let (got, closed) = read_until_closed(&mut s, IO_TIMEOUT);
    assert!(
        closed,
        "the server neither answered nor closed after garbage {} (got {})",
        show(blob),
        show(&got)
    );
    got
}

#[test]
fn garbage_bytes_get_error_replies_or_a_close_and_others_are_served() {
    let mut server = start(&[]);
    let sentinels = plant(&server);
    let base = mem(&server);
    let by = Bystander::start(&server, "garbage");
    let mut rng = Rng(0x6a09_e667_f3bc_c909);
    let rounds = if big() { 2000 } else { 300 };
    let (mut answered, mut closed_early) = (0, 0);
    for round in 0..rounds {
        // memcached port: random bytes 0x00-0xff, never starting with 0x80 (which will mean the
        // memcached binary protocol).
        let len = 1 + rng.below(4096);
        let mut blob = rng.bytes(len);
        while blob[0] == 0x80 {
            blob[0] = (rng.next() >> 24) as u8;
        }
        let got = garbage_round(server.addr(), &blob, b"\r\nversion\r\n");
        let text = got.split(|&b| b == b'\n').filter(|l| !l.is_empty());
        let mut version = false;
        for l in text {
            let l = l.strip_suffix(b"\r").unwrap_or_else(|| {
                panic!("round {round}: a reply line without CRLF: {}", show(&got))
            });
            assert!(
                !version,
                "round {round}: a reply after VERSION: {}",
                show(&got)
            );
            if l.starts_with(b"VERSION ") {
                version = true;
            } else {
                assert!(
                    l == b"ERROR"
                        || l.starts_with(b"CLIENT_ERROR ")
                        || l.starts_with(b"SERVER_ERROR "),
                    "round {round}: garbage {} got {}",
                    show(&blob),
                    show(&got)
                );
            }
        }
        if version {
            answered += 1;
        } else {
            closed_early += 1;
        }

        // RESP port: random inline bytes, a multibulk header followed by garbage, or a
        // well-formed start that turns into garbage.
        let mut blob = match round % 3 {
            0 => Vec::new(),
            1 => b"*".to_vec(),
            _ => b"*3\r\n$3\r\nSET\r\n$".to_vec(),
        };
        let len = 1 + rng.below(4096);
        blob.extend(rng.bytes(len));
        let got = garbage_round(resp_addr(&server), &blob, b"\r\nPING\r\n");
        for l in got.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            assert!(
                l.ends_with(b"\r") && (l.starts_with(b"-") || l == b"+PONG\r"),
                "round {round}: RESP garbage {} got {}",
                show(&blob),
                show(&got)
            );
        }
    }
    println!(
        "garbage: {rounds} blobs per port; memcached answered the marker {answered} times and \
         closed {closed_early} times before it (a line over 2048 bytes)"
    );
    assert!(
        answered > 0,
        "the memcached port never answered after garbage"
    );

    // The memcached binary protocol's magic byte followed by garbage: whatever the port does
    // with it, it must not take the server or other clients down.
    for round in 0..20 {
        let mut blob = vec![0x80];
        let len = rng.below(3000);
        blob.extend(rng.bytes(len));
        let mut s = open(server.addr(), Duration::from_millis(200));
        write_what_it_takes(&mut s, &blob);
        if round % 2 == 0 {
            let _ = s.shutdown(Shutdown::Write);
            let _ = read_until_closed(&mut s, Duration::from_secs(2));
        } else {
            reset(s);
        }
    }
    by.finish("garbage");
    let growth = report_growth("garbage", base, &server);
    assert!(
        growth < 64 * 1024,
        "garbage made the server grow {growth} kB"
    );
    verify(&mut server, &sentinels, "garbage");
}

// ---------------------------------------------------------------------------------------------
// Declared lengths

#[test]
fn absurd_declared_lengths_on_the_memcached_port() {
    // A configured item limit of 2 MiB, so "just above the limit" is not the default.
    let mut server = start(&["-I", "2m"]);
    let sentinels = plant(&server);
    let base = mem(&server);
    let mut mc = Mc::connect(server.addr(), "declared lengths");
    mc.set("dl", 9, b"old");
    // `<bytes>` that does not fit the item limit's type is a bad command line; the data line is
    // then read as a command (ERROR) and the old value stays. memcached 1.6.18 answers the same
    // for 2147483648 and 2^64; it wraps 4294967296 to 0 (proto/README.md lists that quirk).
    // `set k 0 0 -1` is the golden proto/memcache/errors.txt `set_negative_bytes`.
    for bytes in [
        "2147483647",
        "2147483648",
        "4294967296",
        "18446744073709551616",
    ] {
        mc.send(format!("set dl 0 0 {bytes}\r\nx\r\n").as_bytes());
        mc.expect(BAD_FORMAT);
        mc.expect("ERROR");
    }
    assert_eq!(mc.get("dl"), Some((9, b"old".to_vec())));

    // One byte over the configured limit: refused, the data swallowed, the old value deleted
    // (the golden `value_too_large_set_swallows_data_and_deletes_old_value` pins this at the
    // default 1 MiB); exactly the limit is stored.
    let limit = 2 * MIB;
    let mut req = format!("set dl 0 0 {}\r\n", limit + 1).into_bytes();
    req.extend(pattern(1, limit + 1));
    req.extend_from_slice(b"\r\n");
    mc.send(&req);
    mc.expect(TOO_LARGE);
    assert_eq!(mc.get("dl"), None);
    let value = pattern(2, limit);
    mc.set("dl", 3, &value);
    assert_eq!(mc.get("dl"), Some((3, value)));

    // A 1 GiB value (a valid number, far over the limit): answered at once, and the data is
    // discarded as it arrives, never buffered. The client sends 16 MiB of it and gives up.
    let mut s = open(server.addr(), IO_TIMEOUT);
    s.write_all(b"set huge 0 0 1073741824\r\n").expect("send");
    let chunk = vec![b'h'; MIB];
    for _ in 0..16 {
        s.write_all(&chunk)
            .expect("the server keeps reading a swallowed value");
    }
    let mut reply = [0u8; TOO_LARGE.len() + 2];
    s.read_exact(&mut reply).expect("the refusal");
    assert_eq!(show(&reply), show(format!("{TOO_LARGE}\r\n").as_bytes()));
    reset(s);
    assert_eq!(mc.get("huge"), None);

    let growth = report_growth("declared lengths (memcached)", base, &server);
    assert!(growth < 64 * 1024, "the server grew {growth} kB");
    mc.version();
    verify(&mut server, &sentinels, "declared lengths (memcached)");
}

/// Sends `req` on a fresh RESP connection; the server must answer exactly `want` and close.
fn resp_refused(server: &Server, req: &[u8], want: &str) {
    let mut s = open(resp_addr(server), Duration::from_millis(200));
    s.write_all(req).expect("send");
    let (got, closed) = read_until_closed(&mut s, IO_TIMEOUT);
    assert_eq!(show(&got), show(want.as_bytes()), "reply to {}", show(req));
    assert!(closed, "the connection stays open after {}", show(req));
}

#[test]
fn absurd_declared_lengths_on_the_resp_port() {
    // RESP's own limit (proto_max_bulk_len), set to 2 MiB so "just above" is not the default.
    let mut server = start(&["--proto-max-bulk-len", "2m"]);
    let sentinels = plant(&server);
    let base = mem(&server);
    // Redis 7 answers the first the same; for the second it waits for 2^31-1 arguments, memkeep
    // refuses anything over 1,048,576 up front (golden proto/resp/errors.txt
    // `multibulk_over_a_million_arguments`). `$-5` and `*-5` are the goldens
    // `negative_bulk_length` and `null_and_empty_arrays_are_ignored`.
    let bulk = "-ERR Protocol error: invalid bulk length\r\n";
    let multi = "-ERR Protocol error: invalid multibulk length\r\n";
    resp_refused(&server, b"*1\r\n$2147483647\r\n", bulk);
    resp_refused(&server, b"*2147483647\r\n", multi);
    resp_refused(&server, b"*1\r\n$9223372036854775807\r\n", bulk);
    resp_refused(&server, b"*1\r\n$99999999999999999999\r\n", bulk);
    resp_refused(&server, b"*99999999999999999999\r\n", multi);
    // One byte over the configured bulk limit (the golden `bulk_length_over_512mb` covers the
    // default); a value of exactly the limit is stored.
    let limit = 2 * MIB;
    resp_refused(
        &server,
        format!("*3\r\n$3\r\nSET\r\n$2\r\ndl\r\n${}\r\n", limit + 1).as_bytes(),
        bulk,
    );
    let mut r = Resp::connect(resp_addr(&server));
    let value = pattern(3, limit);
    resp_set(&mut r, b"dl", &value);
    assert!(
        resp_get(&mut r, b"dl") == Some(value),
        "a 2 MiB value round-trips"
    );

    // A declared count of a million arguments (allowed) with none sent: nothing is allocated
    // for the count up front. Ten such clients hold their connections while we measure.
    let mut holders = Vec::new();
    for _ in 0..10 {
        let mut s = open(resp_addr(&server), IO_TIMEOUT);
        s.write_all(b"*1000000\r\n$4\r\nMGET\r\n$1\r\n")
            .expect("send");
        holders.push(s);
    }
    assert_eq!(r.cmd("PING"), Reply::Simple("PONG".into()));
    let growth = report_growth("declared lengths (RESP)", base, &server);
    assert!(growth < 64 * 1024, "the server grew {growth} kB");
    drop(holders);
    verify(&mut server, &sentinels, "declared lengths (RESP)");
}

// ---------------------------------------------------------------------------------------------
// A million keys in one request

/// Sends `req` from a second thread (the server may close before taking it all) and returns
/// what the server answered and whether it closed.
fn send_huge(addr: SocketAddr, req: Vec<u8>) -> (Vec<u8>, bool) {
    let mut s = open(addr, Duration::from_millis(200));
    let mut w = s.try_clone().expect("clone");
    let writer = thread::spawn(move || write_what_it_takes(&mut w, &req));
    let (got, closed) = read_until_closed(&mut s, Duration::from_secs(30));
    let _ = s.shutdown(Shutdown::Both);
    writer.join().expect("writer thread");
    (got, closed)
}

#[test]
fn million_key_get_line_and_million_argument_mget() {
    // RESP requests may reach twice proto_max_bulk_len (512m by default, as in Redis); at 1m a
    // 13 MB MGET is past that.
    let mut server = start(&["--proto-max-bulk-len", "1m"]);
    let sentinels = plant(&server);
    let base = mem(&server);
    let keys: Vec<String> = (0..1_000_000).map(|i| format!("k{i}")).collect();

    // memcached: a 6.9 MB get line is over memkeep's 2 MiB limit for retrieval lines, so the
    // connection is closed without a reply (memcached 1.6.18 answers it, after ~20 s here).
    let line = format!("get {}\r\n", keys.join(" ")).into_bytes();
    let (got, closed) = send_huge(server.addr(), line);
    assert!(closed, "a 6.9 MB get line must close the connection");
    assert!(got.is_empty(), "expected no reply, got {}", show(&got));

    // The longest line it takes: as many keys as fit 2 MiB, with two sentinels among them.
    let mut mc = Mc::connect(server.addr(), "long get");
    let s0 = &sentinels.items[0];
    let s5 = &sentinels.items[5];
    let mut line = format!("get {}", s0.0);
    for k in &keys {
        if line.len() + k.len() + s5.0.len() + 64 > 2 * MIB {
            break;
        }
        line.push(' ');
        line.push_str(k);
    }
    line.push(' ');
    line.push_str(&s5.0);
    line.push_str("\r\n");
    mc.send(line.as_bytes());
    let got = mc.values();
    let got: Vec<(&str, u32, &[u8])> = got
        .iter()
        .map(|(k, f, v, _)| (k.as_str(), *f, v.as_slice()))
        .collect();
    assert!(
        got == vec![
            (s0.0.as_str(), s0.1, s0.2.as_slice()),
            (s5.0.as_str(), s5.1, s5.2.as_slice())
        ],
        "a 2 MiB get line answers its two hits"
    );

    // RESP: MGET with a million arguments (~13 MB) is over the request size limit (2 x 1m
    // here): a protocol
    // error and a close (Redis would answer a million nulls). The error line may be lost to
    // the reset of a connection whose input is still unread, so what arrived must be a prefix
    // of it.
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(keys.iter().map(|k| k.as_bytes()));
    let (got, closed) = send_huge(resp_addr(&server), Resp::encode(&args));
    assert!(closed, "a 13 MB MGET must close the connection");
    let want = b"-ERR Protocol error: request larger than memkeep's limit\r\n";
    assert!(
        want.starts_with(&got),
        "a 13 MB MGET answered {}",
        show(&got)
    );
    // 100,000 keys fit: each answered, the sentinel among them found.
    let mut r = Resp::connect(resp_addr(&server));
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(keys[..100_000].iter().map(|k| k.as_bytes()));
    args[50_000] = s0.0.as_bytes();
    match r.call(&args) {
        Reply::Array(Some(items)) => {
            assert_eq!(items.len(), 100_000);
            for (i, item) in items.iter().enumerate() {
                if i == 49_999 {
                    assert!(*item == Reply::Bulk(Some(s0.2.clone())), "the sentinel");
                } else {
                    assert_eq!(*item, Reply::Bulk(None), "item {i}");
                }
            }
        }
        other => panic!(
            "MGET of 100,000 keys: {}",
            show(format!("{other:?}").as_bytes())
        ),
    }
    let growth = report_growth("million keys", base, &server);
    assert!(growth < 100 * 1024, "the server grew {growth} kB");
    verify(&mut server, &sentinels, "million keys");
}

// ---------------------------------------------------------------------------------------------
// NUL bytes in keys

#[test]
fn nul_bytes_in_keys() {
    let mut server = start(&[]);
    let sentinels = plant(&server);
    let mut mc = Mc::connect(server.addr(), "nul keys");
    // memcached port: a key with a NUL (a control byte) is refused as a bad command line and the
    // data line is then read as a command. memcached 1.6.18 cuts the line at the NUL and
    // answers ERROR twice; either way nothing is stored. (Values with NUL bytes are the golden
    // proto/memcache/storage.txt binary value case.)
    for key in [&b"a\0b"[..], b"\0", b"nul\0"] {
        let mut req = b"set ".to_vec();
        req.extend_from_slice(key);
        req.extend_from_slice(b" 0 0 1\r\nx\r\n");
        mc.send(&req);
        mc.expect(BAD_FORMAT);
        mc.expect("ERROR");
        let mut req = b"get ".to_vec();
        req.extend_from_slice(key);
        req.extend_from_slice(b"\r\n");
        mc.send(&req);
        mc.expect(BAD_FORMAT);
    }
    for key in ["a", "b", "nul"] {
        assert_eq!(mc.get(key), None, "{key} was created");
    }

    // RESP is binary-safe: keys with NUL bytes round-trip, distinct from their prefixes.
    let mut r = Resp::connect(resp_addr(&server));
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let keys: Vec<&[u8]> = vec![b"a\0b", b"\0", b"a\0", b"\0\0\0", &all_bytes];
    for (i, key) in keys.iter().enumerate() {
        resp_set(&mut r, key, &pattern(i as u64, 10 + i));
    }
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(resp_get(&mut r, key), Some(pattern(i as u64, 10 + i)));
    }
    assert_eq!(resp_get(&mut r, b"a"), None);
    assert_eq!(r.call(&[b"EXISTS", b"a\0b", b"a", b"\0"]), Reply::Int(2));
    match r.call(&[b"KEYS", b"a*"]) {
        Reply::Array(Some(mut found)) => {
            found.sort_by(|a, b| match (a, b) {
                (Reply::Bulk(a), Reply::Bulk(b)) => a.cmp(b),
                _ => panic!("KEYS answered {a:?}, {b:?}"),
            });
            assert_eq!(
                found,
                vec![
                    Reply::Bulk(Some(b"a\0".to_vec())),
                    Reply::Bulk(Some(b"a\0b".to_vec()))
                ]
            );
        }
        other => panic!("KEYS a*: {other:?}"),
    }
    // Cross-protocol: the memcached port cannot name these keys, and does not see them under
    // their printable prefixes; a printable key with a NUL-laden value reads back byte-exact.
    assert_eq!(mc.get("a"), None);
    resp_set(&mut r, b"nulvalue", b"\0\r\n\0x");
    assert_eq!(mc.get("nulvalue"), Some((0, b"\0\r\n\0x".to_vec())));
    assert_eq!(r.call(&[b"DEL", b"a\0b"]), Reply::Int(1));
    assert_eq!(resp_get(&mut r, b"a\0"), Some(pattern(2, 12)));
    verify(&mut server, &sentinels, "nul keys");
}

// ---------------------------------------------------------------------------------------------
// Clients that never read their replies

/// How long the hostile phase's memory is sampled while the bystander works.
const HOSTILE_WATCH: Duration = Duration::from_millis(1500);

/// Keeps sampling the server's memory for `HOSTILE_WATCH` (the peak is `VmHWM` anyway; this
/// gives the server time to misbehave while the bystander runs).
fn watch(server: &Server) {
    let end = Instant::now() + HOSTILE_WATCH;
    while Instant::now() < end {
        let _ = mem(server);
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn clients_pipelining_gets_of_a_big_value_without_reading_leave_memory_bounded() {
    let mut server = start(&[]);
    let sentinels = plant(&server);
    let value = pattern(77, 1_000_000);
    Mc::connect(server.addr(), "setup").set("big", 5, &value);
    let base = mem(&server);
    let by = Bystander::start(&server, "pipelined gets");
    // Each request asks for 1 MB; the clients write until the server stops reading them (a
    // write times out) or `cap` bytes of requests are out: 64 MiB by default (over seven million
    // gets, 7 TB of replies), 1 GiB with MEMKEEP_HOSTILE_BIG=1.
    let cap = if big() { 1024 * MIB } else { 64 * MIB };
    let mc_req = b"get big\r\n";
    let resp_req = Resp::encode(&[b"GET", b"big"]);
    let mut hostile = Vec::new();
    for (addr, req) in [
        (server.addr(), mc_req.to_vec()),
        (resp_addr(&server), resp_req.clone()),
    ] {
        let mut s = open(addr, IO_TIMEOUT);
        s.set_write_timeout(Some(Duration::from_secs(1)))
            .expect("timeout");
        let chunk: Vec<u8> = req.repeat(MIB / req.len());
        let mut written = 0;
        while written < cap {
            let n = write_what_it_takes(&mut s, &chunk);
            written += n;
            if n < chunk.len() {
                break;
            }
        }
        println!(
            "pipelined gets: the client wrote {} MiB of requests ({} gets of 1 MB) before the \
             server stopped reading",
            written / MIB,
            written / req.len()
        );
        assert!(
            written < cap,
            "the server kept reading {} MiB of requests from a client that reads nothing",
            written / MIB
        );
        hostile.push(s);
    }
    watch(&server);
    let growth = report_growth("pipelined gets, never reading", base, &server);
    // The replies the server did produce are right: read a few (on clones of the sockets, which
    // are gone before the originals are reset).
    {
        let mut mc = Mc {
            r: BufReader::new(hostile[0].try_clone().expect("clone")),
            w: hostile[0].try_clone().expect("clone"),
            name: "hostile memcached".into(),
        };
        for _ in 0..3 {
            let l = mc.line();
            let (k, f, v, _) = mc.value_block(&l);
            assert!(
                k == "big" && f == 5 && v == value,
                "a pipelined get's reply"
            );
            mc.expect("END");
        }
        let mut r = BufReader::new(hostile[1].try_clone().expect("clone"));
        for _ in 0..3 {
            let mut head = Vec::new();
            r.read_until(b'\n', &mut head).expect("a bulk header");
            assert_eq!(head, b"$1000000\r\n");
            let mut data = vec![0; 1_000_002];
            r.read_exact(&mut data).expect("a bulk");
            assert!(data[..1_000_000] == value[..], "a pipelined GET's reply");
        }
    }
    for s in hostile {
        reset(s);
    }
    by.finish("pipelined gets");
    assert!(
        growth < GROWTH_LIMIT_KB,
        "the server grew {} MiB under clients that never read",
        growth / 1024
    );
    verify(&mut server, &sentinels, "pipelined gets");
}

#[test]
fn pipelined_gets_of_a_big_value_are_all_answered_to_a_client_that_reads() {
    // The counterpart of the never-reading client: 100 gets of 1 MB in one write, read as fast
    // as they come. Output past the 4 MiB mark pauses the pipeline; once it has all gone out
    // the rest must follow without the client sending anything more.
    let mut server = start(&[]);
    let sentinels = plant(&server);
    let value = pattern(78, 1_000_000);
    let mut mc = Mc::connect(server.addr(), "reading pipeliner");
    mc.set("big", 6, &value);
    mc.send(&b"get big\r\n".repeat(100));
    for i in 0..100 {
        let l = mc.line();
        let (k, f, v, _) = mc.value_block(&l);
        assert!(k == "big" && f == 6 && v == value, "reply {i}");
        mc.expect("END");
    }
    let mut r = Resp::connect(resp_addr(&server));
    r.send_raw(&Resp::encode(&[b"GET", b"big"]).repeat(100));
    for i in 0..100 {
        assert!(
            r.read() == Reply::Bulk(Some(value.clone())),
            "RESP reply {i}"
        );
    }
    verify(&mut server, &sentinels, "reading pipeliner");
}

/// Reads one memcached multi-get reply and checks it against the keys asked for: every hit in
/// order, with its flags, value and (for gets) a CAS.
fn check_multi_get(
    mc: &mut Mc,
    asked: &[String],
    values: &HashMap<String, (u32, Vec<u8>)>,
    cas: bool,
) {
    let mut hits = asked.iter().filter(|k| values.contains_key(*k));
    for (k, f, v, c) in mc.values() {
        let want = hits
            .next()
            .unwrap_or_else(|| panic!("an extra value for {k}"));
        assert_eq!(&k, want, "multi-get reply order");
        let (wf, wv) = &values[want];
        assert!(f == *wf && v == *wv, "the value of {k}");
        assert_eq!(c.is_some(), cas, "CAS present only for gets");
    }
    assert!(hits.next().is_none(), "a multi-get reply ended early");
}

#[test]
fn clients_sending_huge_multi_gets_without_reading_leave_memory_bounded() {
    let mut server = start(&[]);
    let sentinels = plant(&server);
    // 50 values of 1 MB. A multi-get line names them `reps` times (plus a miss now and then);
    // every line would make `reps` * 50 MB of reply.
    let mut values = HashMap::new();
    let mut mc = Mc::connect(server.addr(), "setup");
    let mut keys = Vec::new();
    for i in 0..50u32 {
        let key = format!("mg:{i}");
        let value = pattern(1000 + i as u64, 1_000_000);
        mc.set(&key, i * 3, &value);
        values.insert(key.clone(), (i * 3, value));
        keys.push(key);
    }
    let (reps, lines) = if big() { (2000, 10) } else { (6, 2) };
    let asked: Vec<String> = (0..reps * 50)
        .map(|i| {
            if i % 37 == 36 {
                format!("mg:missing:{i}")
            } else {
                keys[i % 50].clone()
            }
        })
        .collect();
    let hits = asked.iter().filter(|k| values.contains_key(*k)).count();
    let base = mem(&server);
    let by = Bystander::start(&server, "multi-gets");

    // memcached: `lines` get lines (every second one a gets), pipelined in one write; RESP: the
    // same keys in MGETs. Each client writes until the server stops reading it (the big run
    // writes more than the socket buffers hold), then reads nothing for a while.
    let mut req = Vec::new();
    for l in 0..lines {
        req.extend_from_slice(if l % 2 == 0 { b"get " } else { b"gets " });
        req.extend_from_slice(asked.join(" ").as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(asked.iter().map(|k| k.as_bytes()));
    let resp_req = Resp::encode(&args).repeat(lines);
    let mut hostile = Vec::new();
    for (addr, req) in [(server.addr(), &req), (resp_addr(&server), &resp_req)] {
        let mut s = open(addr, IO_TIMEOUT);
        s.set_write_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let written = write_what_it_takes(&mut s, req);
        println!(
            "multi-gets: {lines} requests of {} keys ({} bytes each), each asking for {hits} MB: \
             the server took {written} bytes of them",
            asked.len(),
            req.len() / lines,
        );
        assert!(
            big() || written == req.len(),
            "a few KB of requests were refused"
        );
        hostile.push(s);
    }
    watch(&server);
    let growth = report_growth("multi-gets, never reading", base, &server);

    // Now read: every reply complete and in order (the server resumes where it paused).
    let mut hostile_mc = Mc {
        r: BufReader::with_capacity(256 * 1024, hostile[0].try_clone().expect("clone")),
        w: hostile.remove(0),
        name: "hostile multi-get".into(),
    };
    let mut hostile_resp = Resp::from_stream(hostile.remove(0));
    let full = !big();
    let check_lines = if full { lines } else { 0 };
    for l in 0..check_lines {
        check_multi_get(&mut hostile_mc, &asked, &values, l % 2 == 1);
    }
    for _ in 0..check_lines {
        match hostile_resp.read() {
            Reply::Array(Some(items)) => {
                assert_eq!(items.len(), asked.len());
                for (k, item) in asked.iter().zip(items) {
                    let want = values.get(k).map(|(_, v)| v.clone());
                    assert!(item == Reply::Bulk(want), "MGET's value of {k}");
                }
            }
            other => panic!("MGET answered {:?}", format!("{other:?}").get(..200)),
        }
    }
    if !full {
        // A few values of the first line, then hang up.
        for _ in 0..20 {
            let l = hostile_mc.line();
            let (k, f, v, _) = hostile_mc.value_block(&l);
            assert!(values.get(&k) == Some(&(f, v)), "the value of {k}");
        }
    }
    let Mc { r, w, .. } = hostile_mc;
    drop(r);
    reset(w);
    drop(hostile_resp);
    by.finish("multi-gets");
    assert!(
        growth < GROWTH_LIMIT_KB,
        "the server grew {} MiB under multi-gets nobody reads",
        growth / 1024
    );
    verify(&mut server, &sentinels, "multi-gets");
}

#[test]
fn a_multi_get_sent_in_pieces_still_ends_in_wrongtype_for_a_collection() {
    // A reply paused at the output limit and resumed later cannot take back the values already
    // sent: a collection key met after the pause ends the reply with the error line instead of
    // END (proto/SPEC.md). A short multi-get answers only the error, as before.
    let mut server = start(&[]);
    let sentinels = plant(&server);
    let mut mc = Mc::connect(server.addr(), "wrongtype");
    let mut r = Resp::connect(resp_addr(&server));
    assert_eq!(r.call(&[b"RPUSH", b"list", b"x"]), Reply::Int(1));
    let wrongtype =
        "CLIENT_ERROR WRONGTYPE Operation against a key holding the wrong kind of value";
    mc.send(b"get sentinel:mc:0 list\r\n");
    mc.expect(wrongtype);
    let value = pattern(5, 1_000_000);
    for i in 0..12 {
        mc.set(&format!("w:{i}"), i, &value);
    }
    let keys: Vec<String> = (0..12).map(|i| format!("w:{i}")).collect();
    mc.send(format!("get {} list\r\n", keys.join(" ")).as_bytes());
    let mut n = 0;
    loop {
        let l = mc.line();
        if l.starts_with(b"VALUE ") {
            let (k, f, v, _) = mc.value_block(&l);
            assert!(
                k == keys[n] && f == n as u32 && v == value,
                "value {n} in order"
            );
            n += 1;
        } else {
            assert_eq!(show(&l), wrongtype);
            break;
        }
    }
    assert!(
        n >= 4,
        "the first piece of a 12 MB reply has at least 4 values, got {n}"
    );
    mc.version();
    verify(&mut server, &sentinels, "wrongtype in pieces");
}

// ---------------------------------------------------------------------------------------------
// Slowloris

#[test]
fn slowloris_connections_holding_partial_lines_are_closed_by_the_idle_timeout() {
    let mut server = start(&["--idle-timeout", "2"]);
    let sentinels = plant(&server);
    let by = Bystander::start(&server, "slowloris");
    // 250 connections per port, each with half a request, then silence.
    let mut held = Vec::new();
    for i in 0..500 {
        let (addr, partial): (SocketAddr, &[u8]) = if i % 2 == 0 {
            (server.addr(), b"get sentinel:mc:1 some")
        } else {
            (resp_addr(&server), b"*2\r\n$3\r\nGET\r\n$10\r\nsenti")
        };
        let mut s = open(addr, Duration::from_secs(15));
        s.write_all(partial).expect("send a partial request");
        held.push(s);
    }
    let start = Instant::now();
    for (i, s) in held.iter_mut().enumerate() {
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            Ok(n) => panic!("slowloris {i} got {}", show(&buf[..n])),
            Err(e) => panic!("slowloris {i} was not closed: {e}"),
        }
    }
    println!(
        "slowloris: 500 connections with partial lines all closed within {:?}",
        start.elapsed()
    );
    by.finish("slowloris");
    let mut mc = Mc::connect(server.addr(), "stats");
    assert_eq!(
        mc.stat("idle_kicks"),
        500,
        "every slowloris connection was kicked"
    );
    verify(&mut server, &sentinels, "slowloris");
}

// ---------------------------------------------------------------------------------------------
// Many connections

/// Waits (bounded) until the server counts `baseline` connections again.
fn wait_connections(stats: &mut Mc, baseline: u64) {
    let deadline = Instant::now() + POLL_DEADLINE;
    loop {
        let now = stats.stat("curr_connections");
        if now == baseline {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "curr_connections stays at {now}, baseline {baseline}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Raises this process's open-file soft limit to at least `want`; Err if the hard limit is too
/// low.
fn raise_nofile(want: u64) -> Result<(), String> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // Safety: plain system calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return Err(format!("getrlimit: {}", io::Error::last_os_error()));
        }
        if rl.rlim_cur >= want {
            return Ok(());
        }
        if rl.rlim_max < want {
            return Err(format!(
                "the open-files hard limit is {}, {want} are needed",
                rl.rlim_max
            ));
        }
        rl.rlim_cur = want;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
            return Err(format!("setrlimit: {}", io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// The open-files soft limit of process `pid`, from `/proc/<pid>/limits`.
fn nofile_limit(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read limits");
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("Max open files")
}

#[test]
fn five_thousand_simultaneous_connections_are_served_and_counted_down() {
    const N: usize = 5000;
    if let Err(why) = raise_nofile(N as u64 + 3000) {
        println!("SKIPPED five_thousand_simultaneous_connections: {why}");
        return;
    }
    // The server starts with the usual default soft limit of 1024 open files (as under
    // systemd or a login shell) and must raise it itself to serve 5,000 clients.
    let dir = tempfile::tempdir().expect("temp dir");
    let wrapper = dir.path().join("memkeep-nofile-1024");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nulimit -Sn 1024 || exit 1\nexec '{BIN}' \"$@\"\n"),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod the wrapper");
    let mut server = Server::start_with(
        &wrapper,
        Options {
            args: vec!["-c".into(), (N + 100).to_string()],
            resp: true,
            ..Options::default()
        },
    );
    let pid = server.pid().expect("pid");
    println!(
        "5000 connections: the server started with a soft limit of 1024 open files and runs \
         with {}",
        nofile_limit(pid)
    );
    let sentinels = plant(&server);
    let mut stats = Mc::connect(server.addr(), "stats");
    // Only this connection, once the server has seen the earlier ones close.
    let baseline = 1;
    wait_connections(&mut stats, baseline);
    let base = mem(&server);

    let open_all = |addr: SocketAddr, n: usize| -> Vec<TcpStream> {
        (0..n).map(|_| open(addr, IO_TIMEOUT)).collect()
    };
    let mut mcs = open_all(server.addr(), N / 2);
    let mut resps = open_all(resp_addr(&server), N / 2);
    // Each memcached client sets its own key; each RESP client reads one of them back.
    for (i, s) in mcs.iter_mut().enumerate() {
        let v = format!("v-{i}");
        s.write_all(format!("set hc:{i} {i} 0 {}\r\n{v}\r\n", v.len()).as_bytes())
            .expect("send set");
    }
    for (i, s) in mcs.iter_mut().enumerate() {
        let mut reply = [0u8; 8];
        s.read_exact(&mut reply)
            .unwrap_or_else(|e| panic!("connection {i}: no reply to its set: {e}"));
        assert_eq!(&reply, b"STORED\r\n", "connection {i}");
    }
    for (i, s) in resps.iter_mut().enumerate() {
        s.write_all(&Resp::encode(&[b"GET", format!("hc:{i}").as_bytes()]))
            .expect("send GET");
    }
    for (i, s) in resps.iter_mut().enumerate() {
        let v = format!("v-{i}");
        let want = format!("${}\r\n{v}\r\n", v.len());
        let mut reply = vec![0u8; want.len()];
        s.read_exact(&mut reply)
            .unwrap_or_else(|e| panic!("RESP connection {i}: no reply to its GET: {e}"));
        assert_eq!(show(&reply), show(want.as_bytes()), "RESP connection {i}");
    }
    // All held open: counted, and another client is served meanwhile.
    assert_eq!(stats.stat("curr_connections"), baseline + N as u64);
    let mut other = Mc::connect(server.addr(), "other");
    let mut r = Resp::connect(resp_addr(&server));
    for i in 0..50u32 {
        let value = pattern(i as u64, 100 + i as usize);
        other.set("other", i, &value);
        assert_eq!(resp_get(&mut r, b"other"), Some(value));
    }
    drop(other);
    drop(r);
    let held = mem(&server);
    println!(
        "5000 connections: server VmRSS {} MiB with them open ({} MiB before)",
        held.rss_kb / 1024,
        base.rss_kb / 1024
    );
    // A sample of the held connections still answers.
    for s in mcs.iter_mut().step_by(250) {
        s.write_all(b"version\r\n").expect("send version");
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\n") && reply.len() < 100 {
            s.read_exact(&mut byte).expect("a reply to version");
            reply.push(byte[0]);
        }
        assert!(reply.starts_with(b"VERSION "), "version: {}", show(&reply));
    }
    drop(mcs);
    drop(resps);
    wait_connections(&mut stats, baseline);
    verify(&mut server, &sentinels, "5000 connections");
}

// ---------------------------------------------------------------------------------------------
// Abrupt disconnects

#[test]
fn abrupt_disconnects_mid_value_store_nothing_and_leak_nothing() {
    let mut server = start(&[]);
    let sentinels = plant(&server);
    let mut stats = Mc::connect(server.addr(), "stats");
    stats.set("victim", 77, b"old value");
    let mut r = Resp::connect(resp_addr(&server));
    resp_set(&mut r, b"rvictim", b"old resp value");
    // `stats` and `r`, once the server has seen the earlier connections close.
    let baseline = 2;
    wait_connections(&mut stats, baseline);
    let base = mem(&server);
    let by = Bystander::start(&server, "disconnects");
    let rounds = if big() { 10_000 } else { 1000 };
    let mut rng = Rng(0xbb67_ae85_84ca_a73b);
    for i in 0..rounds {
        let resp = i % 2 == 1;
        let mut req = if resp {
            b"*3\r\n$3\r\nSET\r\n$7\r\nrvictim\r\n$100000\r\n".to_vec()
        } else {
            b"set victim 0 0 100000\r\n".to_vec()
        };
        // Half a value, or (every fifth time) all of it without the closing CRLF.
        let sent = if i % 5 == 0 {
            100_000
        } else {
            1 + rng.below(99_999)
        };
        req.extend(pattern(i as u64, sent));
        let addr = if resp {
            resp_addr(&server)
        } else {
            server.addr()
        };
        let mut s = open(addr, IO_TIMEOUT);
        s.write_all(&req).expect("send half a value");
        if i % 4 < 2 {
            reset(s);
        } else {
            drop(s);
        }
    }
    by.finish("disconnects");
    wait_connections(&mut stats, baseline);
    assert_eq!(stats.get("victim"), Some((77, b"old value".to_vec())));
    assert_eq!(
        resp_get(&mut r, b"rvictim"),
        Some(b"old resp value".to_vec())
    );
    let growth = report_growth(&format!("{rounds} abrupt disconnects"), base, &server);
    assert!(growth < 64 * 1024, "the server grew {growth} kB");
    verify(&mut server, &sentinels, "abrupt disconnects");
}

// ---------------------------------------------------------------------------------------------
// Replies that repeat stored data (REPLY_MAX), and client bytes quoted in RESP errors.

#[test]
fn replies_of_gat_hmget_and_hrandfield_naming_a_big_value_many_times_stay_bounded() {
    let mut server = start(&[]);
    let sentinels = plant(&server);
    let value = pattern(9, 1_000_000);
    Mc::connect(server.addr(), "setup").set("gbig", 1, &value);
    let mut r = Resp::connect(resp_addr(&server));
    assert_eq!(r.call(&[b"HSET", b"h", b"f", &value]), Reply::Int(1));
    let base = mem(&server);
    // Three requests of a few KB, each asking for 300 MB, never read.
    let mut held = Vec::new();
    let mut s = open(server.addr(), IO_TIMEOUT);
    s.write_all(format!("gat 0 {}\r\n", ["gbig"; 300].join(" ")).as_bytes())
        .expect("send gat");
    held.push(s);
    let mut hmget: Vec<&[u8]> = vec![b"HMGET", b"h"];
    hmget.extend([&b"f"[..]; 300]);
    for req in [
        Resp::encode(&hmget),
        Resp::encode(&[b"HRANDFIELD", b"h", b"-300", b"WITHVALUES"]),
    ] {
        let mut s = open(resp_addr(&server), IO_TIMEOUT);
        s.write_all(&req).expect("send");
        held.push(s);
    }
    watch(&server);
    let growth = report_growth("gat, HMGET, HRANDFIELD, never reading", base, &server);
    drop(held);
    assert!(
        growth < GROWTH_LIMIT_KB,
        "the server grew {} MiB for three short requests nobody reads",
        growth / 1024
    );
    verify(&mut server, &sentinels, "gat, HMGET, HRANDFIELD");
}

#[test]
fn resp_error_replies_quoting_client_bytes_carry_no_line_breaks() {
    let server = start(&[]);
    let mut r = Resp::connect(resp_addr(&server));
    // Redis 7.0 answers exactly this.
    assert_eq!(
        r.call(&[b"a\nb", b"x\ry"]),
        Reply::Error("ERR unknown command 'a b', with args beginning with: 'x y' ".into())
    );
    assert_eq!(r.cmd("PING"), Reply::Simple("PONG".into()));
}
