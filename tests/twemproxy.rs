//! twemproxy (nutcracker) in front of three memkeep instances, once with the memcached protocol
//! and once with Redis RESP: ketama distribution, fnv1a_64 hashing. 10,000 keys go in through
//! the proxy, every key reads back through the proxy (single and multi-key gets, which the proxy
//! splits across servers), and every instance holds a share (curr_items / DBSIZE), the shares
//! summing to 10,000.
//!
//! nutcracker comes from `scripts/install-test-deps.sh` (`make deps`, Debian package
//! `nutcracker`); when it is missing the test fails with that hint.
//!
//! Invariants: every port is a free loopback port; the proxy's readiness wait and every socket
//! are bounded; the test kills only the nutcracker it started (its own child, by pid) and the
//! memkeep servers the harness started.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{Options, Server, free_port};
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
const IO_TIMEOUT: Duration = Duration::from_secs(30);
const READY_TIMEOUT: Duration = Duration::from_secs(15);
const START_ATTEMPTS: usize = 5;
const KEYS: usize = 10_000;
/// Commands written before their replies are read.
const BATCH: usize = 200;
/// Keys per multi-key get.
const MULTI: usize = 50;

// ---------------------------------------------------------------------------------------------
// nutcracker

struct Proxy {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl Proxy {
    /// Starts nutcracker with one pool (`redis` or memcached) over `backends`, on free ports.
    fn start(redis: bool, backends: &[SocketAddr]) -> Proxy {
        let found = std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join("nutcracker").is_file())
        });
        assert!(
            found,
            "nutcracker is not on PATH (Debian package nutcracker): \
             run ./scripts/install-test-deps.sh (make deps)"
        );
        let dir = tempfile::Builder::new()
            .prefix("memkeep-twemproxy-")
            .tempdir()
            .expect("temp dir");
        let mut proxy = Proxy {
            child: None,
            port: 0,
            dir,
        };
        let mut last_err = String::new();
        for _ in 0..START_ATTEMPTS {
            match proxy.launch(redis, backends) {
                Ok(()) => return proxy,
                Err(e) => last_err = e,
            }
        }
        panic!("nutcracker did not start after {START_ATTEMPTS} attempts: {last_err}");
    }

    fn conf_path(&self) -> PathBuf {
        self.dir.path().join("nutcracker.yml")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("nutcracker.log")
    }

    fn log(&self) -> String {
        let s = std::fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let mut start = s.len().saturating_sub(4000);
        while !s.is_char_boundary(start) {
            start += 1;
        }
        s[start..].to_string()
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn launch(&mut self, redis: bool, backends: &[SocketAddr]) -> Result<(), String> {
        self.port = free_port();
        let stats_port = free_port();
        let mut conf = format!(
            "pool:\n  listen: 127.0.0.1:{}\n  hash: fnv1a_64\n  distribution: ketama\n  \
             redis: {redis}\n  timeout: 30000\n  auto_eject_hosts: false\n  \
             server_retry_timeout: 2000\n  server_connections: 1\n  servers:\n",
            self.port
        );
        for (i, b) in backends.iter().enumerate() {
            conf.push_str(&format!("    - {b}:1 memkeep{}\n", i + 1));
        }
        std::fs::write(self.conf_path(), &conf).expect("write nutcracker.yml");
        let mut cmd = Command::new("nutcracker");
        cmd.arg("-c")
            .arg(self.conf_path())
            .args(["-s", &stats_port.to_string(), "-a", "127.0.0.1"])
            .arg("-p")
            .arg(self.dir.path().join("nutcracker.pid"))
            .arg("-o")
            .arg(self.log_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| format!("spawn nutcracker: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().expect("try_wait") {
                self.child = None;
                return Err(format!(
                    "nutcracker exited early with {status}; config:\n{conf}\nlog:\n{}",
                    self.log()
                ));
            }
            if listening(self.port)
                && TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)).is_ok()
                && self
                    .child
                    .as_mut()
                    .unwrap()
                    .try_wait()
                    .expect("try_wait")
                    .is_none()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "nutcracker not accepting after {READY_TIMEOUT:?}; log:\n{}",
                    self.log()
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn assert_running(&mut self) {
        let status = self.child.as_mut().map(|c| c.try_wait().expect("try_wait"));
        assert!(
            matches!(status, Some(None)),
            "nutcracker exited ({status:?}); log:\n{}",
            self.log()
        );
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether something listens on loopback `port` (from /proc; true where /proc cannot tell), so
/// a readiness probe does not connect to a port nobody listens on yet.
fn listening(port: u16) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/net/tcp") else {
        return true;
    };
    text.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        f.len() > 3
            && f[3] == "0A"
            && f[1]
                .rsplit_once(':')
                .is_some_and(|(_, hex)| u16::from_str_radix(hex, 16) == Ok(port))
    })
}

// ---------------------------------------------------------------------------------------------
// Keys, values and connections

fn key(i: usize) -> String {
    format!("tw:{i}")
}

/// A value that differs per key; every 1,000th is 20 KB.
fn value(i: usize) -> Vec<u8> {
    let unit = format!("value-{i}-");
    let reps = if i % 1000 == 7 {
        20 * 1024 / unit.len()
    } else {
        1 + i % 13
    };
    unit.repeat(reps).into_bytes()
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    what: String,
}

impl Conn {
    fn open(addr: SocketAddr, what: &str) -> Conn {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect {what} {addr}: {e}"));
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        Conn {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
            what: format!("{what} {addr}"),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.writer
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("{}: write: {e}", self.what));
    }

    fn line(&mut self) -> String {
        let mut buf = Vec::new();
        let n = self
            .reader
            .read_until(b'\n', &mut buf)
            .unwrap_or_else(|e| panic!("{}: read: {e}", self.what));
        assert!(n > 0, "{}: connection closed", self.what);
        assert!(buf.ends_with(b"\r\n"), "{}: bad line {buf:?}", self.what);
        buf.truncate(buf.len() - 2);
        String::from_utf8(buf).unwrap_or_else(|e| panic!("{}: non-UTF-8 line: {e}", self.what))
    }

    fn exact(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n + 2];
        self.reader
            .read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("{}: read {n} bytes: {e}", self.what));
        assert_eq!(&buf[n..], b"\r\n", "{}: data not ended by CRLF", self.what);
        buf.truncate(n);
        buf
    }

    // memcached text protocol

    /// Reads one `get` reply: (key, value) pairs up to `END`.
    fn mc_values(&mut self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let line = self.line();
            if line == "END" {
                return out;
            }
            let f: Vec<&str> = line.split(' ').collect();
            assert!(
                f.len() == 4 && f[0] == "VALUE",
                "{}: expected VALUE or END, got {line:?}",
                self.what
            );
            let n: usize = f[3].parse().unwrap();
            let k = f[1].to_string();
            out.push((k, self.exact(n)));
        }
    }

    // RESP

    fn resp_cmd(&mut self, args: &[&[u8]]) {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend(format!("${}\r\n", a.len()).into_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.send(&out);
    }

    /// Reads a simple/error/integer line or a bulk string (None for nil).
    fn resp_scalar(&mut self) -> Result<Option<Vec<u8>>, String> {
        let line = self.line();
        match line.as_bytes().first() {
            Some(b'+') | Some(b':') => Ok(Some(line.as_bytes()[1..].to_vec())),
            Some(b'-') => Err(line),
            Some(b'$') => {
                let n: i64 = line[1..].parse().unwrap();
                if n < 0 {
                    Ok(None)
                } else {
                    Ok(Some(self.exact(n as usize)))
                }
            }
            _ => Err(format!("unexpected reply line {line:?}")),
        }
    }

    fn resp_array(&mut self) -> Vec<Option<Vec<u8>>> {
        let line = self.line();
        assert!(
            line.starts_with('*'),
            "{}: expected array, got {line:?}",
            self.what
        );
        let n: usize = line[1..].parse().unwrap();
        (0..n)
            .map(|_| {
                self.resp_scalar()
                    .unwrap_or_else(|e| panic!("{}: {e}", self.what))
            })
            .collect()
    }
}

fn check_value(what: &str, i: usize, got: Option<&[u8]>) {
    let want = value(i);
    match got {
        Some(v) if v == want.as_slice() => {}
        Some(v) => panic!(
            "{what} {}: wrong value ({} bytes, want {}): {:?}",
            key(i),
            v.len(),
            want.len(),
            String::from_utf8_lossy(&v[..v.len().min(80)])
        ),
        None => panic!("{what} {}: missing", key(i)),
    }
}

fn mc_curr_items(addr: SocketAddr) -> u64 {
    let mut c = Conn::open(addr, "memkeep");
    c.send(b"stats\r\n");
    let mut found = None;
    loop {
        let line = c.line();
        if line == "END" {
            break;
        }
        if let Some(n) = line.strip_prefix("STAT curr_items ") {
            found = Some(n.parse().unwrap());
        }
    }
    found.unwrap_or_else(|| panic!("no curr_items in stats of {addr}"))
}

fn resp_dbsize(addr: SocketAddr) -> u64 {
    let mut c = Conn::open(addr, "memkeep RESP");
    c.resp_cmd(&[b"DBSIZE"]);
    let n = c.resp_scalar().unwrap().unwrap();
    String::from_utf8(n).unwrap().parse().unwrap()
}

fn assert_shares(counts: &[u64], what: &str) {
    assert!(
        counts.iter().all(|&n| n > 0),
        "every memkeep instance should hold a share of the keys: {what} {counts:?}"
    );
    assert_eq!(
        counts.iter().sum::<u64>(),
        KEYS as u64,
        "{what} per instance {counts:?}"
    );
}

fn assert_healthy(servers: &mut [Server]) {
    for s in servers {
        let stderr = s.stderr();
        assert!(
            !stderr.contains("panicked"),
            "memkeep logged a panic:\n{stderr}"
        );
        assert!(
            s.is_running(),
            "memkeep exited; stderr:\n{}",
            s.stderr_tail(3000)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn twemproxy_memcached_pool() {
    let mut servers: Vec<Server> = (0..3).map(|_| Server::start(BIN, &[])).collect();
    let backends: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let mut proxy = Proxy::start(false, &backends);
    let mut c = Conn::open(proxy.addr(), "nutcracker");

    // Writes, pipelined in batches.
    for start in (0..KEYS).step_by(BATCH) {
        let end = (start + BATCH).min(KEYS);
        let mut out = Vec::new();
        for i in start..end {
            let v = value(i);
            out.extend(format!("set {} {} 0 {}\r\n", key(i), i % 65536, v.len()).into_bytes());
            out.extend_from_slice(&v);
            out.extend_from_slice(b"\r\n");
        }
        c.send(&out);
        for i in start..end {
            let line = c.line();
            assert_eq!(line, "STORED", "set {} through the proxy", key(i));
        }
    }

    // Single-key gets, pipelined.
    for start in (0..KEYS).step_by(BATCH) {
        let end = (start + BATCH).min(KEYS);
        let out: String = (start..end)
            .map(|i| format!("get {}\r\n", key(i)))
            .collect();
        c.send(out.as_bytes());
        for i in start..end {
            let got = c.mc_values();
            assert!(
                got.len() == 1 && got[0].0 == key(i),
                "get {}: {:?}",
                key(i),
                got.iter().map(|(k, _)| k).collect::<Vec<_>>()
            );
            check_value("get", i, Some(&got[0].1));
        }
    }

    // Multi-key gets: the proxy splits them across the servers and merges the replies.
    for start in (0..KEYS).step_by(MULTI) {
        let end = (start + MULTI).min(KEYS);
        let keys: Vec<String> = (start..end).map(key).collect();
        c.send(format!("get {} tw:missing\r\n", keys.join(" ")).as_bytes());
        let got = c.mc_values();
        assert_eq!(got.len(), end - start, "multi-get {start}..{end}");
        for (j, i) in (start..end).enumerate() {
            assert_eq!(got[j].0, key(i), "multi-get order");
            check_value("multi-get", i, Some(&got[j].1));
        }
    }

    // Flags survive the proxy.
    c.send(b"get tw:4242\r\n");
    let line = c.line();
    assert_eq!(line, format!("VALUE tw:4242 4242 {}", value(4242).len()));
    c.exact(value(4242).len());
    assert_eq!(c.line(), "END");

    // gets/cas, incr/decr, touch and delete pass through the proxy too.
    c.send(b"gets tw:1\r\n");
    let line = c.line();
    let unique = line.rsplit(' ').next().unwrap().to_string();
    c.exact(value(1).len());
    assert_eq!(c.line(), "END");
    c.send(format!("cas tw:1 0 0 1 {unique}\r\nx\r\ncas tw:1 0 0 1 {unique}\r\ny\r\n").as_bytes());
    assert_eq!(c.line(), "STORED", "cas through the proxy");
    assert_eq!(c.line(), "EXISTS", "stale cas through the proxy");
    c.send(b"set tw:n 0 0 2\r\n10\r\nincr tw:n 5\r\ndecr tw:n 3\r\ntouch tw:n 100\r\n");
    for want in ["STORED", "15", "12", "TOUCHED"] {
        assert_eq!(c.line(), want);
    }
    c.send(b"delete tw:n\r\nget tw:n tw:1\r\n");
    assert_eq!(c.line(), "DELETED");
    let got = c.mc_values();
    assert_eq!(got, vec![("tw:1".to_string(), b"x".to_vec())]);
    c.send(b"set tw:1 0 0 0\r\n\r\n");
    assert_eq!(c.line(), "STORED");

    let counts: Vec<u64> = servers.iter().map(|s| mc_curr_items(s.addr())).collect();
    assert_shares(&counts, "curr_items");
    proxy.assert_running();
    proxy.kill();
    assert_healthy(&mut servers);
}

#[test]
fn twemproxy_redis_pool() {
    let mut servers: Vec<Server> = (0..3)
        .map(|_| {
            Server::start_with(
                BIN,
                Options {
                    resp: true,
                    ..Options::default()
                },
            )
        })
        .collect();
    let backends: Vec<SocketAddr> = servers
        .iter()
        .map(|s| s.resp_addr().expect("RESP port"))
        .collect();
    let mut proxy = Proxy::start(true, &backends);
    let mut c = Conn::open(proxy.addr(), "nutcracker (redis)");

    for start in (0..KEYS).step_by(BATCH) {
        let end = (start + BATCH).min(KEYS);
        for i in start..end {
            c.resp_cmd(&[b"SET", key(i).as_bytes(), &value(i)]);
        }
        for i in start..end {
            let r = c.resp_scalar();
            assert_eq!(
                r,
                Ok(Some(b"OK".to_vec())),
                "SET {} through the proxy",
                key(i)
            );
        }
    }

    for start in (0..KEYS).step_by(BATCH) {
        let end = (start + BATCH).min(KEYS);
        for i in start..end {
            c.resp_cmd(&[b"GET", key(i).as_bytes()]);
        }
        for i in start..end {
            let r = c
                .resp_scalar()
                .unwrap_or_else(|e| panic!("GET {}: {e}", key(i)));
            check_value("GET", i, r.as_deref());
        }
    }

    // MGET: split across the servers by the proxy, merged in order.
    for start in (0..KEYS).step_by(MULTI) {
        let end = (start + MULTI).min(KEYS);
        let keys: Vec<String> = (start..end).map(key).collect();
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(keys.iter().map(|k| k.as_bytes()));
        args.push(b"tw:missing");
        c.resp_cmd(&args);
        let got = c.resp_array();
        assert_eq!(got.len(), end - start + 1, "MGET {start}..{end}");
        for (j, i) in (start..end).enumerate() {
            check_value("MGET", i, got[j].as_deref());
        }
        assert_eq!(got[end - start], None, "MGET of a missing key");
    }

    let counts: Vec<u64> = backends.iter().map(|&a| resp_dbsize(a)).collect();
    assert_shares(&counts, "DBSIZE");
    // ... and the memcached port of each instance sees the same keys.
    let mc_counts: Vec<u64> = servers.iter().map(|s| mc_curr_items(s.addr())).collect();
    assert_eq!(mc_counts, counts, "curr_items vs DBSIZE per instance");
    proxy.assert_running();
    proxy.kill();
    assert_healthy(&mut servers);
}
