//! Failover driven by the real Redis Sentinel (Debian `redis-sentinel`, 7.0): a memkeep
//! primary, two memkeep replicas and three `redis-sentinel` processes on loopback ports, each
//! in its own temporary directory. A redis-py `Sentinel` client (the venv's, 4 threads) writes through
//! whatever Sentinel names the primary: odd keys as plain SETs, even keys as `SET` + `WAIT 1`
//! pipelined on one connection. The primary is killed with SIGKILL under that load; Sentinel
//! must promote a replica and re-point the other, and the client must write through the new
//! primary. Every write acknowledged after `WAIT 1` answered 1 or more must be on the new
//! primary; plain acknowledged writes missing from it are counted and reported (they are the
//! window replication had not covered yet), not asserted.
//!
//! The killed server is started again and must become a replica of the new primary: in the
//! first round Sentinel converts it (it comes back as a primary; Sentinel sends it
//! `SLAVEOF`), in later rounds the test points it there itself (as an operator's start script
//! would), which is quicker. `MEMKEEP_FAILOVERS` rounds (1 by default; `make failover` runs
//! 20) and a table: promoted, lost after WAIT, plain writes lost, time until all three
//! Sentinels name the new primary, time until the client's first write on it. No timing is
//! asserted; every wait is bounded.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::programs::{tool, venv_python};
use common::resp::{Reply, Resp};
use common::{Options, Server, free_port};

const MASTER: &str = "mm";
/// Bounds on the waits (not assertions on speed: a slow machine only waits longer).
const SETTLE: Duration = Duration::from_secs(90);
const PROMOTE: Duration = Duration::from_secs(60);

fn node() -> Server {
    Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            args: vec!["--sync".into(), "always".into()],
            ..Options::default()
        },
    )
}

fn rport(s: &Server) -> u16 {
    s.resp_addr().expect("resp port").port()
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One command to a server that may be down or slow: None when it cannot be reached.
fn try_call(port: u16, args: &[&str]) -> Option<Reply> {
    let s = TcpStream::connect_timeout(&addr(port), Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_nodelay(true).ok()?;
    let mut r = Resp::from_stream(s);
    let words: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    r.send(&words);
    Some(r.read())
}

fn text(r: &Reply) -> String {
    match r {
        Reply::Bulk(Some(b)) | Reply::Verbatim(b) => String::from_utf8_lossy(b).into_owned(),
        Reply::Simple(s) => s.clone(),
        Reply::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// An array reply of flat name/value pairs (SENTINEL MASTER, SENTINEL REPLICAS entries).
fn pairs(r: &Reply) -> HashMap<String, String> {
    let mut m = HashMap::new();
    if let Reply::Array(Some(items)) = r {
        for kv in items.chunks(2) {
            if let [k, v] = kv {
                m.insert(text(k), text(v));
            }
        }
    }
    m
}

/// A `redis-sentinel` process with its own directory and config file; killed on drop.
struct Sentinel {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(primary: u16) -> Sentinel {
        Sentinel::start_with(primary, "", &[])
    }

    /// With `extra` lines in its config file and `env` in its environment (which the scripts
    /// it runs inherit).
    fn start_with(primary: u16, extra: &str, env: &[(&str, String)]) -> Sentinel {
        let mut last = String::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("memkeep-sentinel-")
                .tempdir()
                .expect("temp dir");
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER} 2000\n\
                 sentinel failover-timeout {MASTER} 6000\n\
                 sentinel parallel-syncs {MASTER} 2\n{extra}",
                dir.path().display()
            );
            std::fs::write(&conf, text).expect("write sentinel.conf");
            let log = std::fs::File::create(dir.path().join("sentinel.log")).expect("log");
            let child = Command::new(tool("redis-sentinel"))
                .arg(&conf)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("spawn redis-sentinel");
            let mut s = Sentinel {
                child: Some(child),
                port,
                dir,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Some(Reply::Simple(p)) = try_call(port, &["PING"])
                    && p == "PONG"
                {
                    return s;
                }
                if let Some(c) = s.child.as_mut()
                    && let Ok(Some(status)) = c.try_wait()
                {
                    last = format!("exited with {status}: {}", s.log());
                    break;
                }
                thread::sleep(Duration::from_millis(50));
            }
            s.kill();
        }
        panic!("redis-sentinel did not start: {last}");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }

    fn call(&self, args: &[&str]) -> Option<Reply> {
        try_call(self.port, args)
    }

    /// The port of the primary this Sentinel names.
    fn primary(&self) -> Option<u16> {
        match self.call(&["SENTINEL", "get-master-addr-by-name", MASTER])? {
            Reply::Array(Some(v)) if v.len() == 2 => text(&v[1]).parse().ok(),
            _ => None,
        }
    }

    /// Whether this Sentinel sees `primary` healthy, the two other Sentinels, and `replicas`
    /// as healthy replicas of it with their links up (what a failover needs).
    fn settled(&self, primary: u16, replicas: &[u16]) -> bool {
        if self.primary() != Some(primary) {
            return false;
        }
        let Some(m) = self
            .call(&["SENTINEL", "master", MASTER])
            .map(|r| pairs(&r))
        else {
            return false;
        };
        if m.get("flags").map(String::as_str) != Some("master")
            || m.get("num-other-sentinels").map(String::as_str) != Some("2")
        {
            return false;
        }
        let Some(Reply::Array(Some(list))) = self.call(&["SENTINEL", "replicas", MASTER]) else {
            return false;
        };
        let healthy: Vec<u16> = list
            .iter()
            .map(pairs)
            .filter(|r| {
                r.get("flags").map(String::as_str) == Some("slave")
                    && r.get("master-link-status").map(String::as_str) == Some("ok")
                    && r.get("master-port").and_then(|p| p.parse().ok()) == Some(primary)
            })
            .filter_map(|r| r.get("port").and_then(|p| p.parse().ok()))
            .collect();
        replicas.iter().all(|p| healthy.contains(p))
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Threads of the writing client, each writing one key at a time.
const WRITER_THREADS: usize = 4;

/// The writing client: redis-py's Sentinel support, asking our three Sentinels for the
/// primary on every reconnection; `WRITER_THREADS` threads share its connection pool. One line per write: `P n t` a plain SET acknowledged,
/// `W n t` a SET whose WAIT 1 answered >= 1, `U n t` a SET acknowledged whose WAIT answered
/// 0, `E n t why` a write that failed (unknown outcome); t is the unix time. Stops when its
/// standard input closes.
const WRITER: &str = r#"
import itertools, sys, threading, time
from redis.sentinel import Sentinel
ports = [int(p) for p in sys.argv[1].split(",")]
prefix = sys.argv[2]
threads = int(sys.argv[3])
stop = threading.Event()
def watch():
    sys.stdin.read()
    stop.set()
threading.Thread(target=watch, daemon=True).start()
sentinel = Sentinel([("127.0.0.1", p) for p in ports], socket_timeout=0.5,
                    socket_connect_timeout=0.5)
primary = sentinel.master_for("mm", socket_timeout=2.0, socket_connect_timeout=0.5)
numbers = itertools.count(1)
out = sys.stdout
lock = threading.Lock()
def say(line):
    with lock:
        out.write(line)
        out.flush()
def write():
    while not stop.is_set():
        n = next(numbers)
        key = f"{prefix}:{n}"
        try:
            if n % 2:
                primary.set(key, n)
                say(f"P {n} {time.time():.3f}\n")
            else:
                # One connection for both: WAIT counts this connection's writes.
                p = primary.pipeline(transaction=False)
                p.set(key, n)
                p.execute_command("WAIT", 1, 1000)
                got = p.execute()
                say(f"{'W' if got[1] >= 1 else 'U'} {n} {time.time():.3f}\n")
        except Exception as e:
            say(f"E {n} {time.time():.3f} {type(e).__name__}\n")
            time.sleep(0.05)
workers = [threading.Thread(target=write) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
"#;

#[derive(Default)]
struct Writes {
    /// (kind, n, unix time) per line.
    lines: Vec<(char, u64, f64)>,
}

impl Writes {
    fn acked_after(&self, t: f64) -> usize {
        self.lines
            .iter()
            .filter(|(k, _, at)| matches!(k, 'P' | 'W' | 'U') && *at >= t)
            .count()
    }
}

struct Writer {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    writes: Arc<Mutex<Writes>>,
    reader: Option<thread::JoinHandle<()>>,
    stderr: Arc<Mutex<String>>,
}

impl Writer {
    fn start(sentinels: &[Sentinel], prefix: &str) -> Writer {
        let ports: Vec<String> = sentinels.iter().map(|s| s.port.to_string()).collect();
        let mut child = Command::new(venv_python())
            .arg("-c")
            .arg(WRITER)
            .arg(ports.join(","))
            .arg(prefix)
            .arg(WRITER_THREADS.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the writer");
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let writes = Arc::new(Mutex::new(Writes::default()));
        let w = writes.clone();
        let reader = thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let mut f = line.split_whitespace();
                let (Some(k), Some(n), Some(t)) = (f.next(), f.next(), f.next()) else {
                    continue;
                };
                let (Some(k), Ok(n), Ok(t)) = (k.chars().next(), n.parse(), t.parse()) else {
                    continue;
                };
                w.lock().unwrap().lines.push((k, n, t));
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let e = stderr.clone();
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut e = e.lock().unwrap();
                if e.len() < 20_000 {
                    e.push_str(&line);
                    e.push('\n');
                }
            }
        });
        Writer {
            child: Some(child),
            stdin,
            writes,
            reader: Some(reader),
            stderr,
        }
    }

    /// Waits (bounded) until `n` writes were acknowledged at or after unix time `t`.
    fn wait_acked(&self, n: usize, t: f64, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        while self.writes.lock().unwrap().acked_after(t) < n {
            assert!(
                Instant::now() < deadline,
                "{what}: fewer than {n} writes acknowledged in {within:?}; writer stderr:\n{}",
                self.stderr.lock().unwrap()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Closes its input and waits (bounded) for it to finish; its lines.
    fn finish(mut self) -> Vec<(char, u64, f64)> {
        drop(self.stdin.take());
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(15);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        std::mem::take(&mut self.writes.lock().unwrap().lines)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The primary all three Sentinels name, if they agree and it says it is one.
fn agreed_primary(sentinels: &[Sentinel]) -> Option<u16> {
    let named: Vec<Option<u16>> = sentinels.iter().map(|s| s.primary()).collect();
    let p = (*named.first()?)?;
    (named.iter().all(|n| *n == Some(p)) && role(p).is_some_and(|(k, ..)| k == "master"))
        .then_some(p)
}

/// ROLE of a server: ("master", 0) or ("slave", its primary's port) with the link up.
fn role(port: u16) -> Option<(String, u16, String)> {
    match try_call(port, &["ROLE"])? {
        Reply::Array(Some(v)) if !v.is_empty() => {
            let r = text(&v[0]);
            if r == "slave" && v.len() >= 4 {
                Some((r, text(&v[2]).parse().unwrap_or(0), text(&v[3])))
            } else {
                Some((r, 0, String::new()))
            }
        }
        _ => None,
    }
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "{what}: not after {within:?}");
        thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

fn field(port: u16, name: &str) -> Option<String> {
    let all = text(&try_call(port, &["INFO", "replication"])?);
    all.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(str::to_string)
}

struct Round {
    killed: u16,
    promoted: u16,
    acked: usize,
    waited: usize,
    lost_waited: usize,
    lost_plain: usize,
    to_primary: Duration,
    clients_back: Option<f64>,
    rejoin: &'static str,
}

#[test]
fn sentinel_promotes_a_replica_and_no_write_acknowledged_after_wait_is_lost() {
    tool("redis-sentinel");
    let rounds: usize = std::env::var("MEMKEEP_FAILOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut nodes: Vec<Server> = (0..3).map(|_| node()).collect();
    let ports: Vec<u16> = nodes.iter().map(rport).collect();
    // Replicas by command, so a restarted server comes back as it was started: a primary.
    for &p in &ports[1..] {
        let r = try_call(p, &["REPLICAOF", "127.0.0.1", &ports[0].to_string()]);
        assert_eq!(r, Some(Reply::Simple("OK".into())));
    }
    let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(ports[0])).collect();
    let mut primary = ports[0];
    let mut table: Vec<Round> = Vec::new();
    let mut unplanned = 0;
    let logs = |nodes: &[Server], sentinels: &[Sentinel]| -> String {
        let mut s = String::new();
        for n in nodes {
            s += &format!("--- memkeep {} ---\n{}\n", rport(n), n.stderr_tail(4000));
        }
        for t in sentinels {
            let l = t.log();
            s += &format!(
                "--- sentinel {} ---\n{}\n",
                t.port,
                &l[l.len().saturating_sub(4000)..]
            );
        }
        s
    };
    for round in 0..rounds {
        let mut replicas: Vec<u16> = ports.iter().copied().filter(|&p| p != primary).collect();
        // Steady state: both replicas caught up, every Sentinel agreeing and ready to act.
        let settled = Instant::now();
        while !sentinels.iter().all(|s| s.settled(primary, &replicas))
            || !replicas.iter().all(|&r| {
                role(r).is_some_and(|(k, m, st)| k == "slave" && m == primary && st == "connected")
            })
        {
            // Sentinel may fail a live primary over on its own (its failure detector with
            // second-long timeouts on a loaded machine): counted, and followed.
            if let Some(p) = agreed_primary(&sentinels)
                && p != primary
            {
                unplanned += 1;
                primary = p;
                replicas = ports.iter().copied().filter(|&q| q != primary).collect();
                continue;
            }
            if settled.elapsed() > SETTLE {
                panic!(
                    "round {round}: the Sentinels never settled on primary {primary} with replicas {replicas:?}\n{}",
                    logs(&nodes, &sentinels)
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
        let writer = Writer::start(&sentinels, &format!("r{round}"));
        writer.wait_acked(300, 0.0, Duration::from_secs(30), "before the kill");
        // The server to kill is the one the Sentinels name now.
        let start = Instant::now();
        let current = loop {
            if let Some(p) = agreed_primary(&sentinels) {
                break p;
            }
            assert!(
                start.elapsed() < SETTLE,
                "round {round}: the Sentinels do not agree on a primary\n{}",
                logs(&nodes, &sentinels)
            );
            thread::sleep(Duration::from_millis(50));
        };
        if current != primary {
            unplanned += 1;
            primary = current;
            replicas = ports.iter().copied().filter(|&q| q != primary).collect();
        }
        let victim = ports
            .iter()
            .position(|&p| p == primary)
            .expect("the primary is one of ours");
        let kill_instant = Instant::now();
        nodes[victim].kill9();
        // Once it is reaped: every acknowledgement stamped after this came from another server.
        let killed_at = now();
        // All three Sentinels name another server, and it says it is a primary.
        let mut promoted = 0;
        let start = Instant::now();
        loop {
            if let Some(p) = agreed_primary(&sentinels)
                && p != primary
            {
                promoted = p;
                break;
            }
            if start.elapsed() > PROMOTE {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let to_primary = kill_instant.elapsed();
        assert!(
            promoted != 0,
            "round {round}: no replica promoted within {PROMOTE:?}\n{}",
            logs(&nodes, &sentinels)
        );
        // The client writes through the new primary.
        writer.wait_acked(200, now(), Duration::from_secs(30), "after the promotion");
        let lines = writer.finish();
        let clients_back = lines
            .iter()
            .filter(|(k, _, t)| matches!(k, 'P' | 'W' | 'U') && *t >= killed_at)
            .map(|(_, _, t)| t - killed_at)
            .next();
        // The other replica follows the new primary.
        let other = *replicas
            .iter()
            .find(|&&p| p != promoted)
            .expect("two replicas");
        wait_for("the other replica re-pointed", SETTLE, || {
            role(other).is_some_and(|(k, m, st)| k == "slave" && m == promoted && st == "connected")
        });
        // What the new primary holds.
        let mut r = Resp::connect(addr(promoted));
        let (mut acked, mut waited, mut lost_waited, mut lost_plain) = (0, 0, 0, 0);
        let mut missing_waited = Vec::new();
        for (k, n, _) in &lines {
            if !matches!(k, 'P' | 'W' | 'U') {
                continue;
            }
            acked += 1;
            let key = format!("r{round}:{n}");
            let got = r.call(&[b"GET", key.as_bytes()]);
            let present = got == Reply::bulk(&n.to_string());
            if *k == 'W' {
                waited += 1;
                if !present {
                    lost_waited += 1;
                    missing_waited.push(key);
                }
            } else if !present {
                lost_plain += 1;
            }
        }
        assert!(
            missing_waited.is_empty(),
            "round {round}: writes acknowledged after WAIT 1 are missing on the new primary {promoted}: {missing_waited:?}\n{}",
            logs(&nodes, &sentinels)
        );
        // The killed server comes back and becomes a replica of the new primary: converted by
        // Sentinel in the first round, pointed there by the test in later ones.
        nodes[victim].relaunch();
        let rejoin = if round == 0 {
            "sentinel"
        } else {
            let r = try_call(primary, &["REPLICAOF", "127.0.0.1", &promoted.to_string()]);
            assert_eq!(r, Some(Reply::Simple("OK".into())));
            "operator"
        };
        let old = primary;
        wait_for("the old primary rejoined as a replica", SETTLE, || {
            role(old).is_some_and(|(k, m, st)| k == "slave" && m == promoted && st == "connected")
        });
        // Once caught up it holds every key the new primary does (it took a full copy).
        wait_for("the rejoined server caught up", SETTLE, || {
            field(old, "slave_repl_offset").is_some()
                && field(old, "slave_repl_offset") == field(promoted, "master_repl_offset")
        });
        table.push(Round {
            killed: old,
            promoted,
            acked,
            waited,
            lost_waited,
            lost_plain,
            to_primary,
            clients_back,
            rejoin,
        });
        primary = promoted;
    }
    println!(
        "\n{:>5} {:>7} {:>9} {:>7} {:>9} {:>15} {:>10} {:>15} {:>14} {:>9}",
        "round",
        "killed",
        "promoted",
        "acked",
        "after WAIT",
        "lost after WAIT",
        "lost plain",
        "to new primary",
        "clients back",
        "rejoin"
    );
    for (i, t) in table.iter().enumerate() {
        println!(
            "{:>5} {:>7} {:>9} {:>7} {:>9} {:>15} {:>10} {:>13}ms {:>12} {:>9}",
            i + 1,
            t.killed,
            t.promoted,
            t.acked,
            t.waited,
            t.lost_waited,
            t.lost_plain,
            t.to_primary.as_millis(),
            t.clients_back
                .map_or("-".to_string(), |s| format!("{:.0}ms", s * 1000.0)),
            t.rejoin
        );
    }
    let promoted = table.iter().filter(|t| t.promoted != 0).count();
    let lost: usize = table.iter().map(|t| t.lost_plain).sum();
    let acked: usize = table.iter().map(|t| t.acked).sum();
    println!(
        "failovers: {promoted} of {rounds} promoted; lost after WAIT: 0; plain acknowledged writes lost: {lost} of {acked}; \
         failovers Sentinel started on its own with the primary alive: {unplanned}"
    );
    for n in &mut nodes {
        common::programs::assert_healthy(n);
    }
    let _ = std::io::stdout().flush();
}

// ---------------------------------------------------------------------------------------------
// memcached-protocol clients through twemproxy, which Sentinel re-points

/// nutcracker as `scripts/sentinel-repoint-twemproxy.sh` drives it: started and restarted by
/// `restart.sh` (daemonized, its pid in a file), one memcached pool whose one server is named
/// `primary`. Drop kills the pid in the file (the proxy the test's scripts started).
struct Nutcracker {
    dir: tempfile::TempDir,
    port: u16,
}

impl Nutcracker {
    fn start(primary_mc: u16) -> Nutcracker {
        tool("nutcracker");
        let dir = tempfile::Builder::new()
            .prefix("memkeep-nutcracker-")
            .tempdir()
            .expect("temp dir");
        let port = free_port();
        let stats = free_port();
        let d = dir.path().display();
        std::fs::write(
            dir.path().join("nutcracker.yml"),
            format!(
                "pool:\n  listen: 127.0.0.1:{port}\n  hash: fnv1a_64\n  distribution: ketama\n  \
                 timeout: 2000\n  auto_eject_hosts: false\n  server_retry_timeout: 200\n  \
                 server_connections: 1\n  servers:\n    - 127.0.0.1:{primary_mc}:1 primary\n"
            ),
        )
        .expect("write nutcracker.yml");
        // Stops the running proxy (bounded wait), then starts it on the current config.
        std::fs::write(
            dir.path().join("restart.sh"),
            format!(
                "old=$(cat {d}/nutcracker.pid 2>/dev/null || true)\n\
                 if [ -n \"$old\" ]; then\n  kill \"$old\" 2>/dev/null || true\n  i=0\n  \
                 while kill -0 \"$old\" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n\
                 fi\n\
                 exec nutcracker -d -c {d}/nutcracker.yml -s {stats} -a 127.0.0.1 \
                 -p {d}/nutcracker.pid -o {d}/nutcracker.log\n"
            ),
        )
        .expect("write restart.sh");
        std::fs::write(
            dir.path().join("running.sh"),
            format!("kill -0 \"$(cat {d}/nutcracker.pid)\" 2>/dev/null\n"),
        )
        .expect("write running.sh");
        let proxy = Nutcracker { dir, port };
        let status = Command::new("sh")
            .arg(proxy.dir.path().join("restart.sh"))
            .status()
            .expect("run restart.sh");
        assert!(
            status.success(),
            "nutcracker did not start: {}",
            proxy.log()
        );
        wait_for("nutcracker accepting", Duration::from_secs(15), || {
            TcpStream::connect_timeout(&addr(port), Duration::from_millis(200)).is_ok()
        });
        proxy
    }

    /// What `scripts/sentinel-repoint-twemproxy.sh` needs to know, for Sentinel's environment.
    fn env(&self, port_map: &std::path::Path) -> Vec<(&'static str, String)> {
        let d = self.dir.path();
        vec![
            (
                "NUTCRACKER_CONF",
                d.join("nutcracker.yml").display().to_string(),
            ),
            (
                "NUTCRACKER_RESTART",
                format!("sh {}", d.join("restart.sh").display()),
            ),
            (
                "NUTCRACKER_RUNNING",
                format!("sh {}", d.join("running.sh").display()),
            ),
            ("MEMKEEP_PORT_MAP", port_map.display().to_string()),
        ]
    }

    fn conf(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nutcracker.yml")).unwrap_or_default()
    }

    fn log(&self) -> String {
        let l = std::fs::read_to_string(self.dir.path().join("nutcracker.log")).unwrap_or_default();
        l[l.len().saturating_sub(3000)..].to_string()
    }
}

impl Drop for Nutcracker {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("nutcracker.pid"))
            && let Ok(pid) = pid.trim().parse::<u32>()
        {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    }
}

/// A memcached text-protocol exchange on a fresh connection (a client that reconnects after
/// every failure): the reply's lines up to one of `ends`, or None when the connection fails.
fn mc(port: u16, request: &str, ends: &[&str]) -> Option<Vec<String>> {
    let mut s = TcpStream::connect_timeout(&addr(port), Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut r = BufReader::new(s);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end().to_string();
        let done = ends.iter().any(|e| line.starts_with(e));
        lines.push(line);
        if done || lines.len() > 4 {
            return Some(lines);
        }
    }
}

fn mc_set(port: u16, key: &str, value: &str) -> Option<String> {
    let req = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    mc(
        port,
        &req,
        &[
            "STORED",
            "NOT_STORED",
            "SERVER_ERROR",
            "CLIENT_ERROR",
            "ERROR",
        ],
    )
    .map(|l| l.join(" | "))
}

fn mc_get(port: u16, key: &str) -> Option<String> {
    let lines = mc(
        port,
        &format!("get {key}\r\n"),
        &["END", "SERVER_ERROR", "ERROR"],
    )?;
    match lines.as_slice() {
        [v, data, end] if v.starts_with("VALUE ") && end == "END" => Some(data.clone()),
        _ => None,
    }
}

/// memcached-protocol clients know nothing of Sentinel: they write through twemproxy, whose
/// one-server pool names the primary's memcached port, and Sentinel's `client-reconfig-script`
/// (`scripts/sentinel-repoint-twemproxy.sh`, run by all three Sentinels) re-points the pool
/// and restarts the proxy. After a kill -9 of the primary, a memcached `set` through the same
/// proxy address is stored again, on the promoted replica, within a bound (waited for, not
/// asserted as a speed: the time is printed).
#[test]
fn a_memcached_client_behind_twemproxy_writes_to_the_promoted_replica_after_a_failover() {
    tool("redis-sentinel");
    let mut p = node();
    let mut r = node();
    let reply = try_call(
        rport(&r),
        &["REPLICAOF", "127.0.0.1", &rport(&p).to_string()],
    );
    assert_eq!(reply, Some(Reply::Simple("OK".into())));
    let proxy = Nutcracker::start(p.port());
    let port_map = proxy.dir.path().join("ports");
    std::fs::write(
        &port_map,
        format!("{} {}\n{} {}\n", rport(&p), p.port(), rport(&r), r.port()),
    )
    .expect("write the port map");
    let script = common::programs::repo_root().join("scripts/sentinel-repoint-twemproxy.sh");
    let extra = format!(
        "sentinel client-reconfig-script {MASTER} {}\n",
        script.display()
    );
    let env = proxy.env(&port_map);
    let sentinels: Vec<Sentinel> = (0..3)
        .map(|_| Sentinel::start_with(rport(&p), &extra, &env))
        .collect();
    let logs = |sentinels: &[Sentinel], proxy: &Nutcracker| -> String {
        let mut s = format!(
            "--- nutcracker.yml ---\n{}\n--- nutcracker log ---\n{}\n",
            proxy.conf(),
            proxy.log()
        );
        for t in sentinels {
            let l = t.log();
            s += &format!(
                "--- sentinel {} ---\n{}\n",
                t.port,
                &l[l.len().saturating_sub(3000)..]
            );
        }
        s
    };
    let (pr, rr) = (rport(&p), rport(&r));
    wait_for("the Sentinels settled", SETTLE, || {
        sentinels.iter().all(|s| s.settled(pr, &[rr]))
    });
    // Through the proxy onto the primary, and replicated.
    assert_eq!(
        mc_set(proxy.port, "pf:before", "1").as_deref(),
        Some("STORED")
    );
    assert_eq!(mc_get(p.port(), "pf:before").as_deref(), Some("1"));
    let rmc = r.port();
    wait_for("pf:before replicated", SETTLE, || {
        mc_get(rmc, "pf:before").as_deref() == Some("1")
    });

    p.kill9();
    let killed = Instant::now();
    let mut n = 0u32;
    let key = loop {
        n += 1;
        let key = format!("pf:after:{n}");
        let last = mc_set(proxy.port, &key, &n.to_string());
        if last.as_deref() == Some("STORED") {
            break key;
        }
        assert!(
            killed.elapsed() < PROMOTE + Duration::from_secs(30),
            "no memcached write through the proxy stored since the kill (last reply {last:?})\n{}",
            logs(&sentinels, &proxy)
        );
        thread::sleep(Duration::from_millis(100));
    };
    println!(
        "memcached writes through twemproxy stored again {} ms after the kill ({n} attempts)",
        killed.elapsed().as_millis()
    );
    // It went to the promoted replica, which Sentinel names, and the pool names its port.
    assert_eq!(mc_get(rmc, &key).as_deref(), Some(n.to_string().as_str()));
    assert_eq!(mc_get(rmc, "pf:before").as_deref(), Some("1"));
    assert_eq!(role(rr).map(|(k, ..)| k).as_deref(), Some("master"));
    assert_eq!(agreed_primary(&sentinels), Some(rr));
    assert!(
        proxy
            .conf()
            .contains(&format!("- 127.0.0.1:{rmc}:1 primary")),
        "the pool names the promoted replica's memcached port\n{}",
        logs(&sentinels, &proxy)
    );
    drop(sentinels);
    common::programs::assert_healthy(&mut r);
}
