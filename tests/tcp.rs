//! TCP integration tests: real memkeep processes on free loopback ports with temporary data
//! directories, driven over plain `std::net::TcpStream`s.
//!
//! Invariants: every socket has a generous read timeout, so a missing reply fails the test
//! instead of hanging it; waits for a condition are bounded polling loops with deadlines (sleeps
//! only pace slow clients); every process a test starts is killed by its owner's `Drop`.

mod common;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{Options, Server, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
/// Read and write timeout of every test socket: long enough for a loaded 2-core machine,
/// short enough that a lost reply fails the test.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for conditions polled in a loop (a server noticing a closed connection, ...).
const POLL_DEADLINE: Duration = Duration::from_secs(20);
const TOO_MANY: &str = "ERROR Too many open connections";
const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";
const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";

// ---------------------------------------------------------------------------------------------
// Client

/// One retrieved item.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    key: String,
    flags: u32,
    value: Vec<u8>,
    cas: Option<u64>,
}

/// A memcached text-protocol client on a blocking socket with timeouts.
struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    name: String,
}

fn open_stream(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

impl Client {
    fn try_connect(addr: SocketAddr, name: &str) -> io::Result<Client> {
        let s = open_stream(addr)?;
        let writer = s.try_clone()?;
        Ok(Client {
            reader: BufReader::with_capacity(64 * 1024, s),
            writer,
            name: name.to_string(),
        })
    }

    fn connect(addr: SocketAddr, name: &str) -> Client {
        Client::try_connect(addr, name).unwrap_or_else(|e| panic!("{name}: connect {addr}: {e}"))
    }

    fn send(&mut self, bytes: &[u8]) {
        if let Err(e) = self.writer.write_all(bytes) {
            panic!("{}: write of {} bytes failed: {e}", self.name, bytes.len());
        }
    }

    /// The next reply line without its `\r\n`; `None` at EOF.
    fn try_line(&mut self) -> io::Result<Option<String>> {
        let mut buf = Vec::new();
        if self.reader.read_until(b'\n', &mut buf)? == 0 {
            return Ok(None);
        }
        if !buf.ends_with(b"\r\n") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("line not ended by CRLF: {}", show(&buf)),
            ));
        }
        buf.truncate(buf.len() - 2);
        String::from_utf8(buf)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("non-UTF-8 line: {e}")))
    }

    fn line(&mut self) -> String {
        match self.try_line() {
            Ok(Some(l)) => l,
            Ok(None) => panic!(
                "{}: connection closed while a reply line was expected",
                self.name
            ),
            Err(e) => panic!("{}: reading a reply line failed: {e}", self.name),
        }
    }

    fn expect(&mut self, want: &str) {
        let got = self.line();
        assert_eq!(got, want, "{}: unexpected reply", self.name);
    }

    /// Reads until EOF; fails on a timeout.
    fn rest_until_eof(&mut self) -> Vec<u8> {
        let mut rest = Vec::new();
        if let Err(e) = self.reader.read_to_end(&mut rest) {
            panic!(
                "{}: expected the server to close the connection, got {e} after {}",
                self.name,
                show(&rest)
            );
        }
        rest
    }

    /// Reads `VALUE` blocks up to `END`.
    fn values(&mut self) -> Vec<Item> {
        let mut items = Vec::new();
        loop {
            let line = self.line();
            if line == "END" {
                return items;
            }
            let t: Vec<&str> = line.split(' ').collect();
            assert!(
                t[0] == "VALUE" && (t.len() == 4 || t.len() == 5),
                "{}: expected VALUE or END, got {line:?}",
                self.name
            );
            let flags: u32 = t[2]
                .parse()
                .unwrap_or_else(|_| panic!("bad flags in {line:?}"));
            let len: usize = t[3]
                .parse()
                .unwrap_or_else(|_| panic!("bad length in {line:?}"));
            let cas = t.get(4).map(|c| {
                c.parse::<u64>()
                    .unwrap_or_else(|_| panic!("bad cas in {line:?}"))
            });
            let mut data = vec![0u8; len + 2];
            if let Err(e) = self.reader.read_exact(&mut data) {
                panic!("{}: reading a {len}-byte value failed: {e}", self.name);
            }
            assert_eq!(
                &data[len..],
                b"\r\n",
                "{}: value of {} not followed by CRLF",
                self.name,
                t[1]
            );
            data.truncate(len);
            items.push(Item {
                key: t[1].to_string(),
                flags,
                value: data,
                cas,
            });
        }
    }

    fn set(&mut self, key: &str, flags: u32, exptime: i64, value: &[u8]) -> String {
        self.send(&set_request(key, flags, exptime, value));
        self.line()
    }

    fn set_ok(&mut self, key: &str, flags: u32, exptime: i64, value: &[u8]) {
        let reply = self.set(key, flags, exptime, value);
        assert_eq!(reply, "STORED", "{}: set {key}", self.name);
    }

    fn retrieve(&mut self, verb: &str, keys: &[&str]) -> HashMap<String, Item> {
        self.send(format!("{verb} {}\r\n", keys.join(" ")).as_bytes());
        let mut map = HashMap::new();
        for item in self.values() {
            assert!(
                keys.contains(&item.key.as_str()),
                "{}: {verb} returned unasked key {}",
                self.name,
                item.key
            );
            assert!(
                map.insert(item.key.clone(), item).is_none(),
                "{}: {verb} returned a key twice",
                self.name
            );
        }
        map
    }

    fn get(&mut self, key: &str) -> Option<Item> {
        self.retrieve("get", &[key]).remove(key)
    }

    fn gets(&mut self, key: &str) -> Option<Item> {
        self.retrieve("gets", &[key]).remove(key)
    }

    /// `stats [args]` as a name -> value map.
    fn stats(&mut self, args: &str) -> HashMap<String, String> {
        let req = if args.is_empty() {
            "stats\r\n".to_string()
        } else {
            format!("stats {args}\r\n")
        };
        self.send(req.as_bytes());
        let mut stats = HashMap::new();
        loop {
            let line = self.line();
            if line == "END" {
                return stats;
            }
            let mut t = line.splitn(3, ' ');
            assert_eq!(t.next(), Some("STAT"), "{}: stats line {line:?}", self.name);
            let (name, value) = (t.next().expect("stat name"), t.next().expect("stat value"));
            stats.insert(name.to_string(), value.to_string());
        }
    }

    fn version(&mut self) {
        self.send(b"version\r\n");
        let line = self.line();
        assert!(
            line.starts_with("VERSION "),
            "{}: version answered {line:?}",
            self.name
        );
    }
}

fn set_request(key: &str, flags: u32, exptime: i64, value: &[u8]) -> Vec<u8> {
    let mut r = format!("set {key} {flags} {exptime} {}\r\n", value.len()).into_bytes();
    r.extend_from_slice(value);
    r.extend_from_slice(b"\r\n");
    r
}

/// Printable form of bytes for failure messages (truncated).
fn show(b: &[u8]) -> String {
    let s: String = b
        .iter()
        .take(200)
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect();
    if b.len() > 200 {
        format!("\"{s}\"... ({} bytes)", b.len())
    } else {
        format!("\"{s}\"")
    }
}

/// A deterministic value of `len` bytes that differs for every `seed`, including `\r`, `\n`
/// and NUL bytes so values are binary.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A value that names its key (so a mix-up shows in the failure) followed by binary filler.
fn keyed_value(key: &str, seed: u64, filler: usize) -> Vec<u8> {
    let mut v = format!("{key}=").into_bytes();
    v.extend_from_slice(&pattern(seed, filler));
    v
}

/// Checks every `(key, value)` through multi-gets of 100 keys; returns the number checked.
fn assert_all_present(c: &mut Client, expected: &[(String, Vec<u8>)], what: &str) -> usize {
    for chunk in expected.chunks(100) {
        let keys: Vec<&str> = chunk.iter().map(|(k, _)| k.as_str()).collect();
        let got = c.retrieve("get", &keys);
        for (k, v) in chunk {
            match got.get(k) {
                None => panic!("{what}: key {k} is missing"),
                Some(item) => assert!(
                    item.value == *v,
                    "{what}: key {k} has {} instead of {}",
                    show(&item.value),
                    show(v)
                ),
            }
        }
    }
    expected.len()
}

/// Polls `f` until it returns `Some` or `POLL_DEADLINE` passes.
fn poll_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + POLL_DEADLINE;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {POLL_DEADLINE:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------------------
// Processes the tests start themselves (for exit codes and stderr)

/// Runs memkeep with `args` to completion (killed after `timeout`): status, stdout, stderr.
fn run_to_exit(args: &[&str], timeout: Duration) -> (ExitStatus, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("stdout file"))
        .stderr(File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("spawn memkeep");
    let status = wait_exit(&mut child, timeout).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "memkeep {args:?} still running after {timeout:?}; stderr: {}",
            read_lossy(&err_path)
        )
    });
    (status, read_lossy(&out_path), read_lossy(&err_path))
}

fn read_lossy(p: &Path) -> String {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Waits (bounded) for `child` to exit.
fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A memkeep process on a given data dir, started and stopped by the test itself so it can
/// signal it and read its exit status. Killed on drop if still running.
struct Proc {
    child: Child,
    port: u16,
    stderr_path: PathBuf,
}

impl Proc {
    fn start(dir: &Path, args: &[&str]) -> Proc {
        Proc::start_under(&[], dir, args)
    }

    /// `start`, run through `wrapper` (a command that runs the rest of its arguments, e.g.
    /// `prlimit --nofile=256:256`).
    fn start_under(wrapper: &[&str], dir: &Path, args: &[&str]) -> Proc {
        let mut last = String::new();
        for launch in 0..5 {
            let port = common::free_port();
            let stderr_path = dir.join(format!("proc-stderr-{}-{launch}.log", port));
            let mut cmd = match wrapper.split_first() {
                Some((first, rest)) => {
                    let mut c = Command::new(first);
                    c.args(rest).arg(BIN);
                    c
                }
                None => Command::new(BIN),
            };
            let mut child = cmd
                .args([
                    "-p",
                    &port.to_string(),
                    "--resp-port",
                    "0",
                    "-l",
                    "127.0.0.1",
                    "-H",
                ])
                .arg(dir)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(&stderr_path).expect("stderr file"))
                .spawn()
                .expect("spawn memkeep");
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + POLL_DEADLINE;
            loop {
                if let Some(status) = child.try_wait().expect("try_wait") {
                    last = format!("exited early with {status}: {}", read_lossy(&stderr_path));
                    break;
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    if child.try_wait().expect("try_wait").is_none() {
                        return Proc {
                            child,
                            port,
                            stderr_path,
                        };
                    }
                    continue;
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "memkeep not accepting after {POLL_DEADLINE:?}: {}",
                        read_lossy(&stderr_path)
                    );
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("memkeep did not start: {last}");
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn stderr(&self) -> String {
        read_lossy(&self.stderr_path)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Concurrency

#[test]
fn two_hundred_concurrent_clients_each_read_back_their_own_values() {
    const CLIENTS: usize = 200;
    const KEYS: usize = 50;
    let server = Server::start(BIN, &[]);
    // Every connection is open before any thread starts, so all 200 are served at once.
    let clients: Vec<Client> = (0..CLIENTS)
        .map(|c| Client::connect(server.addr(), &format!("client {c}")))
        .collect();
    let value = |c: usize, k: usize| {
        keyed_value(
            &format!("c{c}:k{k}"),
            (c * KEYS + k) as u64,
            (c * 7 + k * 13) % 300,
        )
    };
    thread::scope(|s| {
        for (c, mut client) in clients.into_iter().enumerate() {
            s.spawn(move || {
                for k in 0..KEYS {
                    client.set_ok(
                        &format!("c{c}:k{k}"),
                        (c * 1000 + k) as u32,
                        0,
                        &value(c, k),
                    );
                }
                for k in 0..KEYS {
                    let key = format!("c{c}:k{k}");
                    let item = client
                        .get(&key)
                        .unwrap_or_else(|| panic!("client {c}: {key} missing"));
                    assert_eq!(
                        item.flags,
                        (c * 1000 + k) as u32,
                        "client {c}: flags of {key}"
                    );
                    assert!(
                        item.value == value(c, k),
                        "client {c}: value of {key} is {}",
                        show(&item.value)
                    );
                }
            });
        }
    });
    // Nothing leaked between clients: one more connection sees all 10,000 items as written.
    let expected: Vec<(String, Vec<u8>)> = (0..CLIENTS)
        .flat_map(|c| (0..KEYS).map(move |k| (format!("c{c}:k{k}"), value(c, k))))
        .collect();
    let mut check = Client::connect(server.addr(), "checker");
    assert_eq!(
        assert_all_present(&mut check, &expected, "after 200 clients"),
        CLIENTS * KEYS
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Deep pipeline

#[test]
fn pipeline_of_10000_mixed_requests_in_one_write_is_answered_in_order() {
    const PAIRS: usize = 5_000;
    let server = Server::start(BIN, &[]);
    let mut c = Client::connect(server.addr(), "pipeline");
    let key = |i: usize| format!("pipe:{i}");
    let value = |i: usize| keyed_value(&key(i), i as u64, i % 97);
    // Each set is followed by a get of a key set earlier in the same pipeline (or just now),
    // so every get must see the writes that precede it on the connection.
    let mut buf = Vec::new();
    for i in 0..PAIRS {
        buf.extend_from_slice(&set_request(&key(i), i as u32, 0, &value(i)));
        buf.extend_from_slice(format!("get {}\r\n", key(i / 2)).as_bytes());
    }
    let mut writer = c.writer.try_clone().expect("clone socket");
    thread::scope(|s| {
        // One write_all of the whole pipeline; replies are read concurrently so neither side's
        // socket buffers can fill up and stall the other.
        let w = s.spawn(move || writer.write_all(&buf));
        for i in 0..PAIRS {
            let reply = c.line();
            assert_eq!(reply, "STORED", "reply to set #{i}");
            let items = c.values();
            let j = i / 2;
            assert_eq!(items.len(), 1, "get #{i} of {} returned {items:?}", key(j));
            assert_eq!(items[0].key, key(j), "get #{i}");
            assert_eq!(items[0].flags, j as u32, "get #{i}: flags");
            assert!(
                items[0].value == value(j),
                "get #{i}: value {}",
                show(&items[0].value)
            );
        }
        w.join()
            .expect("writer thread")
            .expect("write_all of the pipeline");
    });
    // In sync afterwards: the next request gets its own reply and nothing is left over.
    c.version();
}

// ---------------------------------------------------------------------------------------------
// 3. Large values

fn assert_largest_value_fits_and_one_more_byte_does_not(server: &Server, limit: usize) {
    let mut c = Client::connect(server.addr(), "large");
    let big = pattern(limit as u64, limit);
    c.set_ok("big", 42, 0, &big);
    let item = c.get("big").expect("big is stored");
    assert_eq!(item.flags, 42);
    assert_eq!(item.value.len(), limit);
    assert!(
        item.value == big,
        "a {limit}-byte value did not read back byte-identical"
    );

    let too_big = pattern(limit as u64 + 1, limit + 1);
    assert_eq!(c.set("big2", 0, 0, &too_big), TOO_LARGE);
    // The refused data block was swallowed whole: the connection is still in sync.
    c.version();
    assert_eq!(c.get("big2"), None);
    let item = c.get("big").expect("big still stored");
    assert!(
        item.value == big,
        "big changed after a refused set of another key"
    );
    c.set_ok("small", 0, 0, b"after");
    assert_eq!(c.get("small").expect("small").value, b"after");
}

#[test]
fn value_of_exactly_1mb_round_trips_and_one_byte_more_is_refused() {
    let server = Server::start(BIN, &[]);
    assert_largest_value_fits_and_one_more_byte_does_not(&server, 1 << 20);
}

#[test]
fn max_item_size_2m_stores_a_2mb_value() {
    let server = Server::start(BIN, &["-I", "2m"]);
    assert_largest_value_fits_and_one_more_byte_does_not(&server, 2 << 20);
}

// ---------------------------------------------------------------------------------------------
// 4. Slow clients

/// 20 clients dribble a `set` one byte at a time and hold back its last byte until a fast client
/// has finished 1,000 set/get round trips: a server that waited on any incomplete request would
/// never let the fast client finish.
#[test]
fn slow_clients_sending_byte_by_byte_do_not_hold_up_a_fast_client() {
    const SLOW: usize = 20;
    const ROUNDS: usize = 1_000;
    let server = Server::start(BIN, &[]);
    let started = AtomicUsize::new(0);
    let fast_done = AtomicBool::new(false);
    let slow_value = |i: usize| keyed_value(&format!("slow:{i}"), 1000 + i as u64, 200);
    let fast_elapsed = thread::scope(|s| {
        let mut slow = Vec::new();
        for i in 0..SLOW {
            let mut c = Client::connect(server.addr(), &format!("slow {i}"));
            let (started, fast_done) = (&started, &fast_done);
            slow.push(s.spawn(move || {
                let req = set_request(&format!("slow:{i}"), i as u32, 0, &slow_value(i));
                let (body, last) = req.split_at(req.len() - 1);
                for (n, b) in body.iter().enumerate() {
                    c.send(std::slice::from_ref(b));
                    if n == 0 {
                        started.fetch_add(1, Ordering::SeqCst);
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                // The last byte goes only after the fast client is done.
                poll_until("the fast client", || {
                    fast_done.load(Ordering::SeqCst).then_some(())
                });
                c.send(last);
                c.expect("STORED");
            }));
        }
        // Start once every slow connection has a partial request in the server.
        poll_until("every slow client's first byte", || {
            (started.load(Ordering::SeqCst) == SLOW).then_some(())
        });
        let t0 = Instant::now();
        let mut fast = Client::connect(server.addr(), "fast");
        for j in 0..ROUNDS {
            let key = format!("fast:{j}");
            let v = keyed_value(&key, j as u64, j % 50);
            fast.set_ok(&key, j as u32, 0, &v);
            let item = fast
                .get(&key)
                .unwrap_or_else(|| panic!("fast: {key} missing"));
            assert!(
                item.value == v && item.flags == j as u32,
                "fast: {key} read back as {item:?}"
            );
        }
        let elapsed = t0.elapsed();
        // Every slow request is still missing its last byte here.
        fast_done.store(true, Ordering::SeqCst);
        for h in slow {
            h.join().expect("slow client");
        }
        elapsed
    });
    eprintln!("fast client: {ROUNDS} round trips in {fast_elapsed:?} next to {SLOW} slow clients");
    assert!(
        fast_elapsed < Duration::from_secs(20),
        "1,000 round trips took {fast_elapsed:?} next to slow clients"
    );
    let mut c = Client::connect(server.addr(), "checker");
    for i in 0..SLOW {
        let item = c
            .get(&format!("slow:{i}"))
            .unwrap_or_else(|| panic!("slow:{i} missing"));
        assert_eq!(item.flags, i as u32, "flags of slow:{i}");
        assert!(
            item.value == slow_value(i),
            "slow:{i} is {}",
            show(&item.value)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Restart

#[test]
fn restart_keeps_every_item_with_its_flags_and_cas_and_cas_keeps_growing() {
    let mut server = Server::start(BIN, &[]);
    let now_s = (common::now_ms() / 1000) as i64;
    // (key, flags, exptime, value): relative and absolute (beyond 30 days) expiry in the future.
    let items: Vec<(String, u32, i64, Vec<u8>)> = vec![
        ("r:plain".into(), 0, 0, b"hello".to_vec()),
        ("r:flag1".into(), 1, 0, b"one".to_vec()),
        ("r:flagmax".into(), u32::MAX, 0, b"max".to_vec()),
        ("r:ttl".into(), 12345, 1000, b"expires in 1000 s".to_vec()),
        (
            "r:abs".into(),
            7,
            now_s + 100_000,
            b"absolute expiry".to_vec(),
        ),
        ("r:empty".into(), 3, 0, Vec::new()),
        ("r:binary".into(), 99, 1000, (0..=255u8).collect()),
        ("r:large".into(), 0xdead_beef, 0, pattern(5, 100_000)),
    ];
    let mut c = Client::connect(server.addr(), "before restart");
    for (k, f, e, v) in &items {
        c.set_ok(k, *f, *e, v);
    }
    // Overwrites and arithmetic move CAS too.
    c.set_ok("r:counter", 5, 0, b"10");
    c.send(b"incr r:counter 32\r\n");
    c.expect("42");
    let keys: Vec<&str> = items
        .iter()
        .map(|(k, ..)| k.as_str())
        .chain(["r:counter"])
        .collect();
    let before = c.retrieve("gets", &keys);
    assert_eq!(
        before.len(),
        keys.len(),
        "all items before restart: {before:?}"
    );
    for (k, f, _, v) in &items {
        assert_eq!(before[k].flags, *f, "flags of {k}");
        assert!(before[k].value == *v, "value of {k}");
    }
    let mut cas: Vec<u64> = before
        .values()
        .map(|i| i.cas.expect("gets returns cas"))
        .collect();
    cas.sort_unstable();
    cas.dedup();
    assert_eq!(
        cas.len(),
        keys.len(),
        "CAS uniques must be distinct: {cas:?}"
    );
    let max_cas = *cas.last().unwrap();
    drop(c);

    server.restart();

    let mut c = Client::connect(server.addr(), "after restart");
    let after = c.retrieve("gets", &keys);
    assert_eq!(after, before, "items changed across restart");
    c.set_ok("r:new", 0, 0, b"new");
    let new_cas = c.gets("r:new").expect("r:new").cas.unwrap();
    assert!(
        new_cas > max_cas,
        "CAS after restart {new_cas} is not above {max_cas}"
    );
    // A cas with the pre-restart unique still works: the unique really is the same.
    let counter_cas = after["r:counter"].cas.unwrap();
    c.send(format!("cas r:counter 5 0 2 {counter_cas}\r\n43\r\n").as_bytes());
    c.expect("STORED");
    assert_eq!(c.get("r:counter").expect("counter").value, b"43");
}

#[test]
fn ttl_keeps_running_across_restart_on_the_manual_clock() {
    let start_ms = common::now_ms() / 1000 * 1000;
    let mut server = Server::start_with(
        BIN,
        Options {
            debug_clock_ms: Some(start_ms),
            ..Options::default()
        },
    );
    let start_s = (start_ms / 1000) as i64;
    let mut c = Client::connect(server.addr(), "before restart");
    c.set_ok("t:rel", 1, 100, b"relative 100 s");
    c.set_ok("t:abs", 2, start_s + 150, b"absolute +150 s");
    c.set_ok("t:forever", 3, 0, b"no expiry");
    let keys = ["t:rel", "t:abs", "t:forever"];
    let before = c.retrieve("gets", &keys);
    assert_eq!(before.len(), 3);
    drop(c);

    server.advance_clock(50).expect("advance 50 s");
    server.restart();
    let mut c = Client::connect(server.addr(), "after restart");
    assert_eq!(c.retrieve("gets", &keys), before, "at +50 s after restart");

    server.advance_clock(49).expect("advance 49 s");
    assert_eq!(c.retrieve("gets", &keys), before, "at +99 s");
    server.advance_clock(2).expect("advance 2 s");
    let got = c.retrieve("gets", &keys);
    assert_eq!(got.len(), 2, "at +101 s t:rel expired: {got:?}");
    assert!(!got.contains_key("t:rel"));

    server.restart();
    let mut c = Client::connect(server.addr(), "second restart");
    let got = c.retrieve("gets", &keys);
    assert!(
        !got.contains_key("t:rel"),
        "expired item came back after restart"
    );
    assert_eq!(got["t:abs"], before["t:abs"]);
    server.advance_clock(50).expect("advance 50 s");
    let got = c.retrieve("gets", &keys);
    assert_eq!(got.len(), 1, "at +151 s only t:forever is left: {got:?}");
    assert_eq!(got["t:forever"], before["t:forever"]);
}

// ---------------------------------------------------------------------------------------------
// 6. kill -9 under write load

/// What one writer thread learned: acknowledged writes, and writes sent but never acknowledged.
#[derive(Default)]
struct WriterLog {
    acked: Vec<(String, Vec<u8>)>,
    unacked: Vec<(String, Vec<u8>)>,
}

fn kill9_under_write_load_loses_no_acknowledged_write(sync_args: &[&str]) {
    const WRITERS: usize = 8;
    const BATCH: usize = 4;
    /// Acknowledged writes to see before the kill, so it lands in the middle of the load.
    const BEFORE_KILL: usize = 400;
    /// Bound on writes per thread in case the kill never comes.
    const MAX_PER_WRITER: usize = 200_000;
    let mut server = Server::start(BIN, sync_args);
    let settings = Client::connect(server.addr(), "settings").stats("settings");
    assert_eq!(
        settings["sync"], sync_args[1],
        "the server runs in the sync mode the test asked for"
    );
    let acked_total = AtomicUsize::new(0);
    let logs: Vec<WriterLog> = thread::scope(|s| {
        let handles: Vec<_> = (0..WRITERS)
            .map(|t| {
                let mut c = Client::connect(server.addr(), &format!("writer {t}"));
                let acked_total = &acked_total;
                s.spawn(move || {
                    let mut log = WriterLog::default();
                    let mut i = 0;
                    'run: while i < MAX_PER_WRITER {
                        let mut req = Vec::new();
                        let mut batch = Vec::new();
                        for _ in 0..BATCH {
                            let key = format!("crash:{t}:{i}");
                            let value =
                                keyed_value(&key, (t * MAX_PER_WRITER + i) as u64, (i * 37) % 1500);
                            req.extend_from_slice(&set_request(&key, t as u32, 0, &value));
                            batch.push((key, value));
                            i += 1;
                        }
                        if c.writer.write_all(&req).is_err() {
                            log.unacked.extend(batch);
                            break;
                        }
                        let mut replies = batch.into_iter();
                        while let Some(kv) = replies.next() {
                            match c.try_line() {
                                Ok(Some(line)) => {
                                    assert_eq!(line, "STORED", "writer {t}: reply to set {}", kv.0);
                                    log.acked.push(kv);
                                    acked_total.fetch_add(1, Ordering::SeqCst);
                                }
                                // The server died: this write and the rest of the batch are unknown.
                                Ok(None) | Err(_) => {
                                    log.unacked.push(kv);
                                    log.unacked.extend(replies);
                                    break 'run;
                                }
                            }
                        }
                    }
                    log
                })
            })
            .collect();
        poll_until("writes before the kill", || {
            (acked_total.load(Ordering::SeqCst) >= BEFORE_KILL).then_some(())
        });
        server.kill9();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer thread"))
            .collect()
    });
    let acked: Vec<(String, Vec<u8>)> = logs.iter().flat_map(|l| l.acked.iter().cloned()).collect();
    assert!(acked.len() >= BEFORE_KILL);

    server.relaunch();
    let mut c = Client::connect(server.addr(), "after kill -9");
    assert_all_present(&mut c, &acked, &format!("kill -9 with {sync_args:?}"));
    // Writes never acknowledged may be lost, but never half-applied or mixed up.
    let unacked: Vec<&(String, Vec<u8>)> = logs.iter().flat_map(|l| l.unacked.iter()).collect();
    for chunk in unacked.chunks(100) {
        let keys: Vec<&str> = chunk.iter().map(|(k, _)| k.as_str()).collect();
        let got = c.retrieve("get", &keys);
        for (k, v) in chunk {
            if let Some(item) = got.get(k) {
                assert!(
                    item.value == *v,
                    "unacknowledged {k} present with a wrong value {}",
                    show(&item.value)
                );
            }
        }
    }
    let survived = unacked.len() - {
        let mut missing = 0;
        for chunk in unacked.chunks(100) {
            let keys: Vec<&str> = chunk.iter().map(|(k, _)| k.as_str()).collect();
            missing += keys.len() - c.retrieve("get", &keys).len();
        }
        missing
    };
    eprintln!(
        "kill -9 with {sync_args:?}: {} acknowledged writes all present; {survived} of {} unacknowledged present",
        acked.len(),
        unacked.len()
    );
    // The store is writable after the crash.
    c.set_ok("after-crash", 0, 0, b"ok");
}

#[test]
fn kill9_under_write_load_loses_no_acknowledged_write_with_sync_always() {
    kill9_under_write_load_loses_no_acknowledged_write(&["--sync", "always"]);
}

#[test]
fn kill9_under_write_load_loses_no_acknowledged_write_with_sync_periodic() {
    kill9_under_write_load_loses_no_acknowledged_write(&[
        "--sync",
        "periodic",
        "--sync-interval-ms",
        "50",
    ]);
}

#[test]
fn kill9_under_write_load_loses_no_acknowledged_write_with_sync_never() {
    kill9_under_write_load_loses_no_acknowledged_write(&["--sync", "never"]);
}

// ---------------------------------------------------------------------------------------------
// 7. Connection limit

/// A connection the server has accepted and serves. Earlier connections (the harness's
/// readiness probe, or one the test just closed) may still count against the limit for a moment,
/// so a refusal is retried until the deadline.
fn connect_served(addr: SocketAddr, name: &str) -> Client {
    poll_until(&format!("{name} to be accepted"), || {
        let mut c = Client::try_connect(addr, name).ok()?;
        c.writer.write_all(b"version\r\n").ok()?;
        match c.try_line() {
            Ok(Some(line)) if line.starts_with("VERSION ") => Some(c),
            Ok(Some(line)) if line == TOO_MANY => None,
            Ok(Some(line)) => panic!("{name}: version answered {line:?}"),
            // Refused and closed before our request was read.
            Ok(None) | Err(_) => None,
        }
    })
}

#[test]
fn connection_over_max_connections_is_told_and_closed_and_the_others_keep_working() {
    let server = Server::start(BIN, &["-c", "3"]);
    let mut conns: Vec<Client> = (0..3)
        .map(|i| connect_served(server.addr(), &format!("conn {i}")))
        .collect();
    for c in &mut conns {
        c.version();
    }

    let mut fourth = Client::connect(server.addr(), "conn 4");
    let got = fourth.rest_until_eof();
    assert_eq!(
        show(&got),
        show(format!("{TOO_MANY}\r\n").as_bytes()),
        "the 4th connection's whole input"
    );

    let closed = conns.remove(0);
    closed
        .writer
        .shutdown(Shutdown::Both)
        .expect("close conn 0");
    drop(closed);
    let mut replacement = connect_served(server.addr(), "replacement");
    replacement.set_ok("limit:k", 9, 0, b"v");
    for c in &mut conns {
        c.version();
        let item = c.get("limit:k").expect("limit:k");
        assert_eq!((item.flags, item.value), (9, b"v".to_vec()));
    }
    let stats = replacement.stats("");
    assert_eq!(stats["max_connections"], "3");
    let rejected: u64 = stats["rejected_connections"]
        .parse()
        .expect("rejected_connections");
    assert!(
        rejected >= 1,
        "the 4th connection was not counted as rejected"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Startup errors

/// Asserts a failed start: non-zero exit, exactly one line on stderr, no panic text; returns
/// that line.
fn assert_fails_with_one_line(args: &[&str]) -> String {
    let (status, out, err) = run_to_exit(args, Duration::from_secs(20));
    assert!(
        !status.success(),
        "memkeep {args:?} exited with {status}; stderr {err:?}"
    );
    assert!(
        status.code().is_some(),
        "memkeep {args:?} died by a signal: {status}"
    );
    assert!(
        !out.contains("panicked") && !err.contains("panicked"),
        "memkeep {args:?} panicked: {err}"
    );
    assert!(
        err.ends_with('\n') && err.lines().count() == 1,
        "memkeep {args:?}: stderr must be one line, got {err:?}"
    );
    err.trim_end().to_string()
}

#[test]
fn data_dir_that_cannot_be_created_fails_startup_with_one_line_naming_it() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, b"not a directory").expect("write file");
    let data_dir = file.join("data");
    let port = common::free_port().to_string();
    let line = assert_fails_with_one_line(&[
        "-p",
        &port,
        "--resp-port",
        "0",
        "-H",
        data_dir.to_str().unwrap(),
    ]);
    assert!(
        line.contains(data_dir.to_str().unwrap()),
        "the error names the data dir: {line:?}"
    );
}

#[test]
fn port_in_use_fails_startup_with_one_line_saying_cannot_listen() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let line = assert_fails_with_one_line(&[
        "-p",
        &port,
        "-l",
        "127.0.0.1",
        "--resp-port",
        "0",
        "-H",
        dir.path().to_str().unwrap(),
    ]);
    assert!(line.contains("cannot listen"), "{line:?}");
    assert!(line.contains(&port), "the error names the port: {line:?}");
    drop(taken);
}

#[test]
fn bad_flag_values_fail_startup_with_one_line_and_no_panic() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().to_str().unwrap();
    let port = common::free_port().to_string();
    let cases: [(&[&str], &str); 6] = [
        (&["-p", "notaport"], "notaport"),
        (&["-p", "70000"], "70000"),
        (&["--sync", "sometimes"], "sometimes"),
        (&["-I", "0"], "max_item_size"),
        (&["-c", "0"], "max_connections"),
        (&["--no-such-flag"], "no-such-flag"),
    ];
    for (bad, mention) in cases {
        let mut args = vec!["--resp-port", "0", "-H", d];
        if !bad.contains(&"-p") {
            args.extend_from_slice(&["-p", &port]);
        }
        args.extend_from_slice(bad);
        let line = assert_fails_with_one_line(&args);
        assert!(
            line.contains(mention),
            "memkeep {bad:?}: the error should mention {mention:?}: {line:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 9. Graceful shutdown

#[test]
fn sigterm_during_a_pipeline_exits_zero_and_keeps_every_acknowledged_set() {
    const SETS: usize = 1_000;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut proc = Proc::start(dir.path(), &["--sync", "always"]);
    let mut c = Client::connect(proc.addr(), "pipeline");
    let key = |i: usize| format!("term:{i}");
    let value = |i: usize| keyed_value(&key(i), i as u64, i % 200);
    let mut buf = Vec::new();
    for i in 0..SETS {
        buf.extend_from_slice(&set_request(&key(i), i as u32, 0, &value(i)));
    }
    c.send(&buf);
    let sent_term = Instant::now();
    // Safety: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(proc.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0, "kill(SIGTERM)");
    // Replies come back in order, each STORED, until the server closes the connection.
    let mut stored = 0;
    loop {
        match c.try_line() {
            Ok(Some(line)) => {
                assert_eq!(line, "STORED", "reply #{stored} during shutdown");
                stored += 1;
            }
            Ok(None) => break,
            // A reset once the process is gone ends the replies too.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading replies during shutdown: {e}"),
        }
    }
    assert!(stored <= SETS);
    eprintln!("SIGTERM after a pipeline of {SETS} sets: {stored} acknowledged");
    let left = Duration::from_secs(10).saturating_sub(sent_term.elapsed());
    let status = wait_exit(&mut proc.child, left).unwrap_or_else(|| {
        panic!(
            "memkeep still running 10 s after SIGTERM; stderr: {}",
            proc.stderr()
        )
    });
    assert!(
        status.success(),
        "memkeep exited with {status} after SIGTERM; stderr: {}",
        proc.stderr()
    );
    assert!(!proc.stderr().contains("panicked"), "{}", proc.stderr());

    let again = Proc::start(dir.path(), &[]);
    let mut c = Client::connect(again.addr(), "after restart");
    let expected: Vec<(String, Vec<u8>)> = (0..stored).map(|i| (key(i), value(i))).collect();
    assert_all_present(&mut c, &expected, "after SIGTERM");
    // One connection's writes commit in order, so what survived is a prefix of the pipeline,
    // every value whole.
    let mut present = Vec::new();
    for chunk in (0..SETS).collect::<Vec<_>>().chunks(100) {
        let keys: Vec<String> = chunk.iter().map(|&i| key(i)).collect();
        let got = c.retrieve("get", &keys.iter().map(String::as_str).collect::<Vec<_>>());
        for &i in chunk {
            if let Some(item) = got.get(&key(i)) {
                assert!(
                    item.value == value(i),
                    "{} has a wrong value {}",
                    key(i),
                    show(&item.value)
                );
                present.push(i);
            }
        }
    }
    let committed = present.len();
    assert_eq!(
        present,
        (0..committed).collect::<Vec<_>>(),
        "the surviving sets are not a prefix of the pipeline"
    );
    eprintln!("SIGTERM: {committed} sets committed, {stored} acknowledged");
    for i in (0..stored).step_by(97) {
        assert_eq!(c.get(&key(i)).expect("acknowledged key").flags, i as u32);
    }
}

// ---------------------------------------------------------------------------------------------
// 10. Errors keep the connection usable

/// (request bytes, expected reply lines): each a client error memcached answers and survives.
fn error_steps() -> Vec<(Vec<u8>, Vec<&'static str>)> {
    let long = "k".repeat(251);
    vec![
        (b"set e:k 0 0 3\r\nold\r\n".to_vec(), vec!["STORED"]),
        // Data block longer than declared: bad data chunk, then "\n"-ended rest is an empty line.
        (
            b"set e:k 0 0 1\r\nxy\r\n".to_vec(),
            vec!["CLIENT_ERROR bad data chunk", "ERROR"],
        ),
        (
            format!("set {long} 0 0 1\r\nx\r\n").into_bytes(),
            vec![BAD_FORMAT, "ERROR"],
        ),
        (format!("get {long}\r\n").into_bytes(), vec![BAD_FORMAT]),
        (
            b"set e:k abc 0 1\r\nx\r\n".to_vec(),
            vec![BAD_FORMAT, "ERROR"],
        ),
        (b"set e:k 0 0 -1\r\n".to_vec(), vec![BAD_FORMAT]),
        (
            b"incr e:k abc\r\n".to_vec(),
            vec!["CLIENT_ERROR invalid numeric delta argument"],
        ),
        (
            b"touch e:k abc\r\n".to_vec(),
            vec!["CLIENT_ERROR invalid exptime argument"],
        ),
        (b"get e:k\r\n".to_vec(), vec!["VALUE e:k 0 3", "old", "END"]),
        (b"set e:new 5 0 5\r\nfresh\r\n".to_vec(), vec!["STORED"]),
        (
            b"get e:new e:k\r\n".to_vec(),
            vec!["VALUE e:new 5 5", "fresh", "VALUE e:k 0 3", "old", "END"],
        ),
    ]
}

#[test]
fn connection_stays_usable_after_client_errors() {
    let server = Server::start(BIN, &[]);
    let mut c = Client::connect(server.addr(), "errors one by one");
    for (req, replies) in error_steps() {
        c.send(&req);
        for want in replies {
            let got = c.line();
            assert_eq!(got, want, "after sending {}", show(&req));
        }
    }
    // The same requests pipelined in one write, and again one byte per write.
    for one_byte in [false, true] {
        let mut c = Client::connect(
            server.addr(),
            if one_byte {
                "errors byte by byte"
            } else {
                "errors pipelined"
            },
        );
        let steps = error_steps();
        let all: Vec<u8> = steps.iter().flat_map(|(r, _)| r.iter().copied()).collect();
        if one_byte {
            for b in &all {
                c.send(std::slice::from_ref(b));
            }
        } else {
            c.send(&all);
        }
        for (req, replies) in steps {
            for want in replies {
                assert_eq!(
                    c.line(),
                    want,
                    "pipelined (one byte per write: {one_byte}), reply to {}",
                    show(&req)
                );
            }
        }
        c.version();
    }
}

// ---------------------------------------------------------------------------------------------
// 11. libmemcached's memccapable

fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The whole suite: without `-a`, memccapable runs its ascii tests and then its binary ones.
#[test]
fn memccapable_ascii_and_binary_suites_pass() {
    let Some(memccapable) = on_path("memccapable") else {
        panic!("memccapable is not on PATH: run `make deps` (it installs libmemcached-tools)");
    };
    let server = Server::start(BIN, &[]);
    let tmp = tempfile::tempdir().expect("temp dir");
    let out_path = tmp.path().join("memccapable.out");
    let out = File::create(&out_path).expect("output file");
    let mut child = Command::new(&memccapable)
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("clone file"))
        .stderr(out)
        .spawn()
        .expect("spawn memccapable");
    let status = wait_exit(&mut child, Duration::from_secs(120)).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "memccapable still running after 120 s: {}",
            read_lossy(&out_path)
        )
    });
    let text = read_lossy(&out_path);
    assert!(
        text.contains("All tests passed"),
        "memccapable output:\n{text}"
    );
    assert!(!text.contains("[FAIL]"), "memccapable output:\n{text}");
    for test in ["ascii get", "binary get", "binary incrq", "binary stat"] {
        let passed = text
            .lines()
            .any(|l| l.starts_with(test) && l.trim_end().ends_with("[pass]"));
        assert!(passed, "memccapable did not pass `{test}`:\n{text}");
    }
    assert!(
        status.success(),
        "memccapable exited with {status}:\n{text}"
    );
}

#[test]
fn idle_timeout_closes_a_silent_client_and_spares_an_active_one() {
    let server = Server::start(env!("CARGO_BIN_EXE_memkeep"), &["--idle-timeout", "2"]);
    // A slowloris client: half a command line, then silence.
    let mut silent = server.connect();
    silent.write_all(b"get some").expect("send");
    silent
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    // An active client keeps talking every 200 ms for 3 s: it must never be kicked.
    let mut active = server.connect();
    active
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut reader = BufReader::new(active.try_clone().expect("clone"));
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        active
            .write_all(b"version\r\n")
            .expect("active client still connected");
        let mut l = String::new();
        reader.read_line(&mut l).expect("reply");
        assert!(l.starts_with("VERSION "), "{l:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The silent one is closed (EOF), within a bounded wait.
    let mut buf = [0u8; 16];
    let n = silent
        .read(&mut buf)
        .expect("the server closes the idle connection");
    assert_eq!(n, 0, "expected EOF, got {:?}", &buf[..n]);
    let mut stats = server.connect();
    stats.write_all(b"stats\r\n").expect("send");
    let mut r = BufReader::new(stats);
    let mut kicks = None;
    for _ in 0..200 {
        let mut l = String::new();
        r.read_line(&mut l).expect("stats line");
        if let Some(v) = l.strip_prefix("STAT idle_kicks ") {
            kicks = v.trim().parse::<u64>().ok();
        }
        if l == "END\r\n" {
            break;
        }
    }
    assert_eq!(kicks, Some(1));
}

/// memcached's ASCII authentication (-Y), with the replies real memcached 1.6.18 gives.
#[test]
fn auth_file_requires_a_set_with_user_and_password_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users");
    std::fs::write(&users, "alice:secret\nbob:pw2\n").expect("write");
    let server = Server::start(
        env!("CARGO_BIN_EXE_memkeep"),
        &["-Y", users.to_str().expect("utf8")],
    );
    let conn = server.connect();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut w = conn.try_clone().expect("clone");
    let mut r = BufReader::new(conn);
    let mut ask = |req: &[u8]| -> String {
        w.write_all(req).expect("send");
        let mut l = String::new();
        r.read_line(&mut l).expect("reply");
        l
    };
    assert_eq!(ask(b"get k\r\n"), "CLIENT_ERROR unauthenticated\r\n");
    assert_eq!(ask(b"quit\r\n"), "CLIENT_ERROR unauthenticated\r\n");
    assert_eq!(
        ask(b"add k 0 0 1\r\nv\r\n"),
        "CLIENT_ERROR unauthenticated\r\n"
    );
    assert_eq!(
        ask(b"set x 0 0 9\r\nalice bad\r\n"),
        "CLIENT_ERROR authentication failure\r\n"
    );
    assert_eq!(
        ask(b"set x 0 0 5\r\nalice\r\n"),
        "CLIENT_ERROR bad authentication token format\r\n"
    );
    assert_eq!(
        ask(b"set x 0 0 12 noreply\r\nalice secret\r\n"),
        "STORED\r\n"
    );
    assert_eq!(ask(b"set k 0 0 1\r\nv\r\n"), "STORED\r\n");
    assert_eq!(ask(b"get k\r\n"), "VALUE k 0 1\r\n");
    // Each connection authenticates on its own.
    let other = server.connect();
    other
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut ow = other.try_clone().expect("clone");
    ow.write_all(b"version\r\n").expect("send");
    let mut l = String::new();
    BufReader::new(other).read_line(&mut l).expect("reply");
    assert_eq!(l, "CLIENT_ERROR unauthenticated\r\n");
}

#[test]
fn unreadable_auth_file_stops_startup_with_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_memkeep"))
        .args([
            "-p",
            "0",
            "--resp-port",
            &free_port().to_string(),
            "-Y",
            "/nonexistent/users",
            "-H",
        ])
        .arg(tempfile::tempdir().expect("tempdir").path())
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot read auth file /nonexistent/users"),
        "{err}"
    );
}

/// A binary-protocol request packet.
fn bin_packet(opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut p = vec![0x80, opcode];
    p.extend_from_slice(&(key.len() as u16).to_be_bytes());
    p.push(extras.len() as u8);
    p.extend_from_slice(&[0, 0, 0]);
    p.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    p.extend_from_slice(&[0; 12]);
    p.extend_from_slice(extras);
    p.extend_from_slice(key);
    p.extend_from_slice(value);
    p
}

/// Sends one binary request and reads one response: (status, body after extras and key), or
/// None when the server closed the connection.
fn bin_ask(conn: &mut TcpStream, packet: &[u8]) -> Option<(u16, Vec<u8>)> {
    conn.write_all(packet).expect("send");
    let mut header = [0u8; 24];
    conn.read_exact(&mut header).ok()?;
    assert_eq!(header[0], 0x81, "response magic");
    let status = u16::from_be_bytes([header[6], header[7]]);
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let skip = header[4] as usize + u16::from_be_bytes([header[2], header[3]]) as usize;
    let mut rest = vec![0u8; body];
    conn.read_exact(&mut rest).expect("body");
    Some((status, rest[skip..].to_vec()))
}

/// SASL PLAIN on the binary protocol checks the same auth file as the text protocol's -Y.
#[test]
fn binary_sasl_plain_uses_the_auth_file() {
    const LIST_MECHS: u8 = 0x20;
    const AUTH: u8 = 0x21;
    const GET: u8 = 0x00;
    const SET: u8 = 0x01;
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users");
    std::fs::write(&users, "alice:secret\n").expect("write");
    let server = Server::start(BIN, &["-Y", users.to_str().expect("utf8")]);
    let open = || {
        let c = server.connect();
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        c
    };
    let mut c = open();
    assert_eq!(
        bin_ask(&mut c, &bin_packet(LIST_MECHS, &[], &[], &[])),
        Some((0, b"PLAIN".to_vec()))
    );
    // Anything else before authenticating: an auth error, then the connection is closed.
    assert_eq!(
        bin_ask(&mut c, &bin_packet(GET, &[], b"k", &[])).map(|r| r.0),
        Some(0x20)
    );
    assert_eq!(bin_ask(&mut c, &bin_packet(GET, &[], b"k", &[])), None);
    let mut c = open();
    assert_eq!(
        bin_ask(&mut c, &bin_packet(AUTH, &[], b"PLAIN", b"\0alice\0wrong")),
        Some((0x20, b"Auth failure.".to_vec()))
    );
    assert_eq!(
        bin_ask(&mut c, &bin_packet(AUTH, &[], b"PLAIN", b"\0alice\0secret")),
        Some((0, b"Authenticated".to_vec()))
    );
    let extras = [0u8; 8];
    assert_eq!(
        bin_ask(&mut c, &bin_packet(SET, &extras, b"k", b"v1")).map(|r| r.0),
        Some(0)
    );
    assert_eq!(
        bin_ask(&mut c, &bin_packet(GET, &[], b"k", &[])),
        Some((0, b"v1".to_vec()))
    );
    // Without an auth file there is no SASL: memcached without -S says unknown command.
    let plain = Server::start(BIN, &[]);
    let mut c = plain.connect();
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    assert_eq!(
        bin_ask(&mut c, &bin_packet(LIST_MECHS, &[], &[], &[])).map(|r| r.0),
        Some(0x81)
    );
}

/// `--auth-readonly`: a user of the auth file who may only read. Every write form of the text,
/// meta and binary protocols is refused (noreply and quiet included) and the connection stays;
/// reads work; another user of the same file still writes.
#[test]
fn read_only_users_read_and_are_refused_every_write() {
    const AUTH: u8 = 0x21;
    const GET: u8 = 0x00;
    const SET: u8 = 0x01;
    const SETQ: u8 = 0x11;
    const DELETE: u8 = 0x04;
    const INCREMENT: u8 = 0x05;
    const FLUSH: u8 = 0x08;
    const NOOP: u8 = 0x0a;
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users");
    std::fs::write(&users, "writer:w1\nreader:r1\n").expect("write");
    let server = Server::start(
        BIN,
        &[
            "-Y",
            users.to_str().expect("utf8"),
            "--auth-readonly",
            "reader",
        ],
    );
    let open = || {
        let c = server.connect();
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let w = c.try_clone().expect("clone");
        (w, BufReader::new(c))
    };
    let ask = |w: &mut TcpStream, r: &mut BufReader<TcpStream>, req: &[u8]| -> String {
        w.write_all(req).expect("send");
        let mut l = String::new();
        r.read_line(&mut l).expect("reply");
        l
    };
    let (mut ww, mut wr) = open();
    assert_eq!(
        ask(&mut ww, &mut wr, b"set x 0 0 9\r\nwriter w1\r\n"),
        "STORED\r\n"
    );
    assert_eq!(
        ask(&mut ww, &mut wr, b"set k 0 0 2\r\nv1\r\n"),
        "STORED\r\n"
    );
    assert_eq!(ask(&mut ww, &mut wr, b"set n 0 0 1\r\n5\r\n"), "STORED\r\n");

    let (mut w, mut r) = open();
    assert_eq!(
        ask(&mut w, &mut r, b"set x 0 0 9\r\nreader r1\r\n"),
        "STORED\r\n"
    );
    let refused = "CLIENT_ERROR read-only user\r\n";
    for req in [
        &b"set k 0 0 2\r\nv2\r\n"[..],
        b"set k 0 0 2 noreply\r\nv2\r\n",
        b"add new 0 0 1\r\na\r\n",
        b"replace k 0 0 1\r\nb\r\n",
        b"append k 0 0 1\r\nc\r\n",
        b"prepend k 0 0 1\r\nd\r\n",
        b"cas k 0 0 1 1\r\ne\r\n",
        b"delete k\r\n",
        b"delete k noreply\r\n",
        b"incr n 1\r\n",
        b"decr n 1\r\n",
        b"touch k 100\r\n",
        b"gat 100 k\r\n",
        b"flush_all\r\n",
        b"ms k 2\r\nv3\r\n",
        b"ms k 2 q\r\nv3\r\n",
        b"md k\r\n",
        b"ma n\r\n",
        b"mg k v T30\r\n",
        b"mg missing v N30\r\n",
    ] {
        assert_eq!(
            ask(&mut w, &mut r, req),
            refused,
            "{}",
            String::from_utf8_lossy(req)
        );
    }
    // Reads, and the connection is still there.
    assert_eq!(ask(&mut w, &mut r, b"get k\r\n"), "VALUE k 0 2\r\n");
    let mut l = String::new();
    r.read_line(&mut l).expect("value");
    assert_eq!(l, "v1\r\n");
    l.clear();
    r.read_line(&mut l).expect("end");
    assert_eq!(l, "END\r\n");
    assert_eq!(ask(&mut w, &mut r, b"mg n v\r\n"), "VA 1\r\n");
    l.clear();
    r.read_line(&mut l).expect("value");
    assert_eq!(l, "5\r\n");
    assert!(ask(&mut w, &mut r, b"version\r\n").starts_with("VERSION "));
    // Nothing the reader sent changed anything.
    assert_eq!(ask(&mut ww, &mut wr, b"mg k v\r\n"), "VA 2\r\n");
    l.clear();
    wr.read_line(&mut l).expect("value");
    assert_eq!(l, "v1\r\n");
    assert_eq!(ask(&mut ww, &mut wr, b"mg n v\r\n"), "VA 1\r\n");
    l.clear();
    wr.read_line(&mut l).expect("value");
    assert_eq!(l, "5\r\n");
    assert_eq!(ask(&mut ww, &mut wr, b"mg new v\r\n"), "EN\r\n");
    // The writer still writes on its own connection.
    assert_eq!(ask(&mut ww, &mut wr, b"incr n 2\r\n"), "7\r\n");

    // The binary protocol, through SASL PLAIN.
    let mut c = server.connect();
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    assert_eq!(
        bin_ask(&mut c, &bin_packet(AUTH, &[], b"PLAIN", b"\0reader\0r1")),
        Some((0, b"Authenticated".to_vec()))
    );
    let refused = Some((0x20, b"Read-only user".to_vec()));
    let store = [0u8; 8];
    let arith = [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(
        bin_ask(&mut c, &bin_packet(SET, &store, b"k", b"v9")),
        refused
    );
    assert_eq!(
        bin_ask(&mut c, &bin_packet(SETQ, &store, b"k", b"v9")),
        refused
    );
    assert_eq!(
        bin_ask(&mut c, &bin_packet(DELETE, &[], b"k", &[])),
        refused
    );
    assert_eq!(
        bin_ask(&mut c, &bin_packet(INCREMENT, &arith, b"n", &[])),
        refused
    );
    assert_eq!(bin_ask(&mut c, &bin_packet(FLUSH, &[], &[], &[])), refused);
    assert_eq!(
        bin_ask(&mut c, &bin_packet(GET, &[], b"k", &[])),
        Some((0, b"v1".to_vec()))
    );
    assert_eq!(
        bin_ask(&mut c, &bin_packet(NOOP, &[], &[], &[])),
        Some((0, Vec::new()))
    );
    // The writer authenticates on the binary protocol too, and writes.
    let mut c = server.connect();
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    assert_eq!(
        bin_ask(&mut c, &bin_packet(AUTH, &[], b"PLAIN", b"\0writer\0w1")),
        Some((0, b"Authenticated".to_vec()))
    );
    assert_eq!(
        bin_ask(&mut c, &bin_packet(SET, &store, b"k", b"v9")).map(|r| r.0),
        Some(0)
    );
}

#[test]
fn a_read_only_user_who_is_not_in_the_auth_file_stops_startup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users");
    std::fs::write(&users, "writer:w1\n").expect("write");
    for extra in [
        vec![
            "-Y",
            users.to_str().expect("utf8"),
            "--auth-readonly",
            "nobody",
        ],
        vec!["--auth-readonly", "writer"],
    ] {
        let out = Command::new(BIN)
            .args(["-p", &free_port().to_string(), "-H"])
            .arg(dir.path().join("data"))
            .args(&extra)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("auth_readonly"), "{extra:?}: {err}");
    }
}

#[test]
fn an_open_files_limit_below_max_connections_caps_the_clients_and_keeps_room_for_the_store() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("SKIPPED: prlimit (util-linux) is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // 256 descriptors: memkeep keeps 128 for its own files, so 128 clients.
    let server = Proc::start_under(
        &["prlimit", "--nofile=256:256"],
        dir.path(),
        &["--sync", "never"],
    );
    let addr = server.addr();
    // One client first, once the start's probe connection is gone: it is the only one.
    let mut first = Client::connect(addr, "first");
    poll_until("the probe's connection closed", || {
        (first.stats("")["curr_connections"] == "1").then_some(())
    });
    assert_eq!(first.stats("")["max_connections"], "128");
    let (mut answered, mut refused) = (1, 0);
    // All held open while counted, so no slot frees up meanwhile.
    let mut conns: Vec<Client> = (1..200)
        .map(|i| Client::connect(addr, &format!("c{i}")))
        .collect();
    for c in conns.iter_mut() {
        c.send(b"version\r\n");
        match c.line() {
            l if l.starts_with("VERSION ") => answered += 1,
            l if l == TOO_MANY => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((answered, refused), (128, 72), "{}", server.stderr());
    // With every client slot taken, the store still opens files: a checkpoint starts a new
    // log segment.
    first.set_ok("k", 0, 0, b"x");
    first.send(b"db_checkpoint\r\n");
    first.expect("OK");
    poll_until("the checkpoint", || {
        let log = server.stderr();
        assert!(!log.contains("Too many open files"), "{log}");
        std::fs::read_dir(dir.path())
            .expect("data dir")
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy() == "wal-0000000000000002.log")
            .then_some(())
    });
    let log = server.stderr();
    assert!(
        log.contains("max_connections lowered from 1024 to 128"),
        "{log}"
    );
}
