//! Test servers for integration tests: a memkeep process (or, for conformance runs, a real
//! memcached / redis-server) on a free loopback port with its own temporary data dir.
//!
//! Invariants: every `Server` owns its child process and kills it on drop; a started server has
//! accepted a TCP connection before `start` returns (bounded wait, never a sleep); a restarted
//! memkeep gets the same port, data dir and (if it runs on a manual clock) the clock value the
//! test advanced it to, so expiry behaves as if the process had never gone away.
#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tempfile::TempDir;

pub mod programs;
pub mod replay;
pub mod resp;

/// How long a server gets to accept its first connection, and to exit after SIGTERM.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a start is retried when the child dies early (e.g. the port was taken meanwhile).
const START_ATTEMPTS: usize = 5;

/// Which program a `Server` runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Memkeep,
    Memcached,
    Redis,
}

/// How to start memkeep beyond the fixed flags.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra command-line arguments, appended after the harness's own flags.
    pub args: Vec<String>,
    /// Start on a frozen manual clock at this unix time in ms (`--debug-clock`).
    pub debug_clock_ms: Option<u64>,
    /// Also listen for RESP on a second free port (otherwise `--resp-port 0`).
    pub resp: bool,
    /// Extra environment variables for the server process.
    pub env: Vec<(String, String)>,
    /// memkeep's data directory (`-H`), instead of the server's own temporary directory (which
    /// still holds the logs); e.g. a directory on a test file system.
    pub data_dir: Option<PathBuf>,
}

pub struct Server {
    kind: Kind,
    bin: PathBuf,
    opts: Options,
    child: Option<Child>,
    port: u16,
    resp_port: Option<u16>,
    dir: TempDir,
    /// Other directories that must live as long as the server (e.g. its SASL configuration).
    keep: Vec<TempDir>,
    /// Number of times the process has been launched (the logs keep every run).
    launches: usize,
}

/// The current unix time in ms, for `Options::debug_clock_ms`.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_millis() as u64
}

/// A small deterministic generator (xorshift), so a failing run replays with its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A loopback port that was free a moment ago (bind port 0, read it, drop the listener).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

impl Server {
    /// Start memkeep (`bin` is `env!("CARGO_BIN_EXE_memkeep")`, which only integration tests
    /// can name) with extra command-line arguments.
    pub fn start(bin: impl AsRef<Path>, args: &[&str]) -> Server {
        let opts = Options {
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Options::default()
        };
        Server::start_with(bin, opts)
    }

    /// Start memkeep with full options (manual clock, RESP port).
    pub fn start_with(bin: impl AsRef<Path>, opts: Options) -> Server {
        Server::spawn_new(Kind::Memkeep, bin.as_ref().to_path_buf(), opts)
    }

    /// Start the real memcached (`$MEMCACHED_BIN` or `memcached` on PATH) the same way, for
    /// conformance runs: `memcached -p <port> -l 127.0.0.1 -U 0 -I 1m`.
    pub fn memcached() -> Server {
        Server::memcached_with(Options::default())
    }

    /// The real memcached with extra arguments (`opts.args`, after the fixed ones) and
    /// environment (`opts.env`); the other options do not apply to it.
    pub fn memcached_with(opts: Options) -> Server {
        let bin = std::env::var_os("MEMCACHED_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| "memcached".into());
        Server::spawn_new(Kind::Memcached, bin, opts)
    }

    /// The real memcached requiring SASL PLAIN authentication (`-S`) for one user, through
    /// Cyrus SASL's sasldb: the database is made with `saslpasswd2` (Debian: `sasl2-bin`) in a
    /// temporary directory that `SASL_CONF_PATH` points at. Err (with the reason) when that
    /// tool is missing or fails, so callers can skip.
    pub fn memcached_sasl(user: &str, password: &str) -> Result<Server, String> {
        let conf = tempfile::Builder::new()
            .prefix("memkeep-sasl-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let db = conf.path().join("sasldb2");
        let mut child = Command::new("saslpasswd2")
            .args(["-p", "-a", "memcached", "-c", "-f"])
            .arg(&db)
            .arg(user)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("saslpasswd2 (Debian package sasl2-bin) not runnable: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(password.as_bytes())
            .map_err(|e| format!("saslpasswd2 stdin: {e}"))?;
        drop(stdin);
        let out = child
            .wait_with_output()
            .map_err(|e| format!("saslpasswd2: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "saslpasswd2 failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let settings = format!("mech_list: plain\nsasldb_path: {}\n", db.display());
        std::fs::write(conf.path().join("memcached.conf"), settings)
            .map_err(|e| format!("write memcached.conf: {e}"))?;
        let dir = conf.path().to_string_lossy().into_owned();
        let mut server = Server::memcached_with(Options {
            args: vec!["-S".into()],
            env: vec![("SASL_CONF_PATH".into(), dir)],
            ..Options::default()
        });
        server.keep.push(conf);
        Ok(server)
    }

    /// Start a real redis-server (`$REDIS_SERVER_BIN` or `redis-server` on PATH) without
    /// persistence, for RESP conformance runs. Its port is both `addr()` and `resp_addr()`.
    pub fn redis() -> Server {
        let bin = std::env::var_os("REDIS_SERVER_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| "redis-server".into());
        Server::spawn_new(
            Kind::Redis,
            bin,
            Options {
                resp: true,
                ..Options::default()
            },
        )
    }

    fn spawn_new(kind: Kind, bin: PathBuf, opts: Options) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("memkeep-test-")
            .tempdir()
            .expect("create temp dir");
        let mut server = Server {
            kind,
            bin,
            opts,
            child: None,
            port: 0,
            resp_port: None,
            dir,
            keep: Vec::new(),
            launches: 0,
        };
        let mut last_err = String::new();
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            server.resp_port = if server.opts.resp {
                if server.kind == Kind::Redis {
                    Some(server.port)
                } else {
                    Some(free_port())
                }
            } else {
                None
            };
            match server.launch() {
                Ok(()) => return server,
                Err(e) => last_err = e,
            }
        }
        panic!(
            "{:?} server did not start after {START_ATTEMPTS} attempts: {last_err}",
            server.kind
        );
    }

    /// The command line for the current ports, data dir and clock.
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        let port = self.port.to_string();
        match self.kind {
            Kind::Memkeep => {
                let resp_port = self.resp_port.unwrap_or(0).to_string();
                cmd.args([
                    "-p",
                    &port,
                    "--resp-port",
                    &resp_port,
                    "-l",
                    "127.0.0.1",
                    "-H",
                ])
                .arg(self.data_dir());
                // clap refuses a repeated `--sync`, so the default applies only when the test's
                // own args do not choose a sync mode.
                let picks_sync = self
                    .opts
                    .args
                    .iter()
                    .any(|a| a == "--sync" || a.starts_with("--sync=") || a == "-N");
                if !picks_sync {
                    cmd.args(["--sync", "never"]);
                }
                if let Some(ms) = self.opts.debug_clock_ms {
                    cmd.args(["--debug-clock", &ms.to_string()]);
                }
            }
            Kind::Memcached => {
                cmd.args(["-p", &port, "-l", "127.0.0.1", "-U", "0", "-I", "1m"]);
                // memcached refuses to run as root unless told which user to be.
                if unsafe { libc::geteuid() } == 0 {
                    cmd.args(["-u", "root"]);
                }
            }
            Kind::Redis => {
                cmd.args([
                    "--port",
                    &port,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                ])
                .arg(self.dir.path());
            }
        }
        cmd.args(&self.opts.args);
        cmd.envs(self.opts.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Spawn the process and wait (bounded) until it accepts a connection. Err if it exited
    /// first or never became ready; the error carries the tail of its stderr.
    /// Spawns the process with its output appended to the data dir's logs, after a banner line
    /// naming this launch (`note` says anything special about it).
    fn spawn(&mut self, note: &str) -> Result<Child, String> {
        self.launches += 1;
        let log = |name: &str| -> File {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.path().join(name))
                .expect("open log file")
        };
        let mut out = log("stdout.log");
        let mut err = log("stderr.log");
        let banner = format!(
            "---- launch {} on port {}{note} ----\n",
            self.launches, self.port
        );
        let _ = out.write_all(banner.as_bytes());
        let _ = err.write_all(banner.as_bytes());
        let mut cmd = self.command();
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        cmd.spawn()
            .map_err(|e| format!("spawn {:?}: {e}", self.bin))
    }

    fn launch(&mut self) -> Result<(), String> {
        let child = self.spawn("")?;
        self.child = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().expect("try_wait") {
                self.child = None;
                return Err(format!(
                    "exited early with {status}; stderr:\n{}",
                    self.stderr_tail(2000)
                ));
            }
            // Connect only once our child listens (where /proc can tell): a probe to a port
            // nobody listens on yet can self-connect and then hold the port, and a port taken
            // meanwhile by another process would answer for a server that is about to exit.
            let pid = self.child.as_ref().unwrap().id();
            let listening = [Some(self.port), self.resp_port]
                .into_iter()
                .flatten()
                .all(|port| listens_on(pid, port).unwrap_or(true));
            let accepts = |addr: SocketAddr| {
                TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            };
            if listening && accepts(self.addr()) && self.resp_addr().is_none_or(accepts) {
                // Without /proc, at least make sure our child is still there.
                if let Some(status) = self.child.as_mut().unwrap().try_wait().expect("try_wait") {
                    self.child = None;
                    return Err(format!(
                        "exited early with {status}; stderr:\n{}",
                        self.stderr_tail(2000)
                    ));
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill9();
                return Err(format!(
                    "not accepting connections after {READY_TIMEOUT:?}; stderr:\n{}",
                    self.stderr_tail(2000)
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The memcached-protocol address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The RESP address, if the server was started with one.
    pub fn resp_addr(&self) -> Option<SocketAddr> {
        self.resp_port
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
    }

    /// memkeep's data directory: `Options::data_dir` if given, else the server's temporary dir.
    pub fn data_dir(&self) -> &Path {
        self.opts.data_dir.as_deref().unwrap_or(self.dir.path())
    }

    /// `memkeep check` on this (stopped) memkeep's data directory finds nothing wrong.
    pub fn assert_check_clean(&self) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_memkeep"))
            .arg("check")
            .arg(self.data_dir())
            .output()
            .expect("run memkeep check");
        assert!(
            out.status.success(),
            "memkeep check: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A fresh client connection to `addr` with Nagle off and 2 s read/write timeouts.
    pub fn connect_to(addr: SocketAddr) -> std::io::Result<TcpStream> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        Ok(s)
    }

    /// A fresh connection to the memcached-protocol port.
    pub fn connect(&self) -> TcpStream {
        Server::connect_to(self.addr())
            .unwrap_or_else(|e| panic!("connect {}: {e}\n{}", self.addr(), self.stderr_tail(2000)))
    }

    /// The process id of the running server (for `/proc/<pid>/status`), if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// The manual clock, if memkeep runs on one (as last advanced through `advance_clock`).
    pub fn clock_ms(&self) -> Option<u64> {
        self.opts.debug_clock_ms
    }

    /// Advance memkeep's manual clock by `secs` seconds: `debug_advance_clock <secs>` on a side
    /// connection, answered `OK`. A restart passes the advanced value back in.
    pub fn advance_clock(&mut self, secs: u64) -> Result<(), String> {
        let Some(ms) = self.opts.debug_clock_ms else {
            return Err("server does not run on a manual clock".into());
        };
        let mut s =
            Server::connect_to(self.addr()).map_err(|e| format!("clock connection: {e}"))?;
        s.write_all(format!("debug_advance_clock {secs}\r\n").as_bytes())
            .map_err(|e| format!("clock write: {e}"))?;
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\n") && got.len() < 200 {
            match s.read(&mut byte) {
                Ok(0) => break,
                Ok(_) => got.push(byte[0]),
                Err(e) => {
                    return Err(format!(
                        "clock read: {e} (got {:?})",
                        String::from_utf8_lossy(&got)
                    ));
                }
            }
        }
        if got != b"OK\r\n" {
            return Err(format!(
                "debug_advance_clock {secs}: expected OK, got {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
        self.opts.debug_clock_ms = Some(ms + secs * 1000);
        Ok(())
    }

    /// SIGTERM, wait (bounded; SIGKILL after that), start again on the same port and data dir.
    pub fn restart(&mut self) {
        self.stop();
        self.relaunch();
    }

    /// Start again after `stop` or `kill9`, same port, data dir and clock.
    pub fn relaunch(&mut self) {
        if let Err(e) = self.try_relaunch() {
            panic!("{e}");
        }
    }

    /// `relaunch` that reports a server that would not start (it exited early or never
    /// accepted connections, after a few attempts) as Err with the reason and stderr's tail.
    pub fn try_relaunch(&mut self) -> Result<(), String> {
        let mut last_err = String::new();
        for _ in 0..START_ATTEMPTS {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(e) => last_err = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "{:?} server did not restart on port {}: {last_err}",
            self.kind, self.port
        ))
    }

    /// Graceful stop: SIGTERM and wait up to 10 s, then SIGKILL.
    pub fn stop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if child.try_wait().expect("try_wait").is_some() {
                self.child = None;
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!(
            "{:?} server ignored SIGTERM for {READY_TIMEOUT:?}; killing it",
            self.kind
        );
        self.kill9();
    }

    /// Graceful stop that reports how it went: SIGTERM, then wait up to 10 s. Returns the exit
    /// status when the process exited by itself; None when it had to be killed (or was not
    /// running). The server stays down until `relaunch`.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill9();
        None
    }

    /// Crash: SIGKILL and reap. The server stays down until `relaunch`.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Crash during startup: start the process again (same port, data dir and clock) without
    /// waiting for it, SIGKILL it `delay` after the spawn -- before, while or after it opens its
    /// store, whichever that moment is -- and reap it. Returns `Some(status)` if it had already
    /// exited on its own (a failed start: `stderr` says why), `None` if the kill ended it. The
    /// server stays down until `relaunch`.
    pub fn kill9_during_startup(&mut self, delay: Duration) -> Option<std::process::ExitStatus> {
        assert!(
            self.child.is_none(),
            "kill9_during_startup needs a stopped server"
        );
        let mut child = self
            .spawn(&format!(", SIGKILL after {delay:?}"))
            .unwrap_or_else(|e| panic!("{e}"));
        std::thread::sleep(delay);
        let exited = child.try_wait().expect("try_wait");
        let _ = child.kill();
        let _ = child.wait();
        exited
    }

    /// Everything the server wrote to stderr so far (all launches).
    pub fn stderr(&self) -> String {
        std::fs::read(self.dir.path().join("stderr.log"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Everything the server wrote to stdout so far (all launches).
    pub fn stdout(&self) -> String {
        std::fs::read(self.dir.path().join("stdout.log"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `max` bytes of stderr, for failure messages.
    pub fn stderr_tail(&self, max: usize) -> String {
        let s = self.stderr();
        let mut start = s.len().saturating_sub(max);
        while !s.is_char_boundary(start) {
            start += 1;
        }
        s[start..].to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Whether process `pid` holds a listening TCP socket on `port`, from Linux's /proc; `None`
/// where /proc cannot tell.
fn listens_on(pid: u32, port: u16) -> Option<bool> {
    let mut inodes = Vec::new();
    let mut readable = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        for line in text.lines().skip(1) {
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue; // not LISTEN
            }
            let Some((_, hex)) = f[1].rsplit_once(':') else {
                continue;
            };
            if u16::from_str_radix(hex, 16) == Ok(port) {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if !readable {
        return None;
    }
    if inodes.is_empty() {
        return Some(false);
    }
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let owned = fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
    });
    Some(owned)
}
