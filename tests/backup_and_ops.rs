//! Operations: online backups (memcached `db_compact`, RESP `BGSAVE`, `memkeep backup`) that
//! restore to the same data, `memkeep export`/`import`, and MemcacheDB's command-line options
//! (-N -C, -m, -d -P, and the ones memkeep ignores with a warning).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::resp::{Reply, Resp};
use common::{Options, Server, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

/// A memcached-protocol connection with line and value reads.
struct Mc {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Mc {
    fn new(s: TcpStream) -> Mc {
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

    fn cmd(&mut self, c: &str) -> String {
        self.w
            .write_all(format!("{c}\r\n").as_bytes())
            .expect("send");
        self.line()
    }

    fn set(&mut self, key: &str, flags: u32, exptime: i64, value: &[u8]) {
        let head = format!("set {key} {flags} {exptime} {}\r\n", value.len());
        self.w.write_all(head.as_bytes()).expect("send");
        self.w.write_all(value).expect("send");
        self.w.write_all(b"\r\n").expect("send");
        assert_eq!(self.line(), "STORED\r\n", "set {key}");
    }

    /// (flags, value) of a key, or None on a miss.
    fn get(&mut self, key: &str) -> Option<(u32, Vec<u8>)> {
        self.w
            .write_all(format!("get {key}\r\n").as_bytes())
            .expect("send");
        let head = self.line();
        if head == "END\r\n" {
            return None;
        }
        let parts: Vec<&str> = head.split_whitespace().collect();
        assert_eq!(parts.first(), Some(&"VALUE"), "{head:?}");
        let flags = parts[2].parse().expect("flags");
        let len: usize = parts[3].parse().expect("len");
        let mut v = vec![0; len + 2];
        self.r.read_exact(&mut v).expect("value");
        v.truncate(len);
        assert_eq!(self.line(), "END\r\n");
        Some((flags, v))
    }
}

fn value(i: usize) -> Vec<u8> {
    format!("value-{i}-").repeat(1 + i % 7).into_bytes()
}

/// Waits (bounded) until `path` exists.
fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a server on a copy of `data` (a directory holding data.mdb).
fn server_on(data: &Path) -> Server {
    let s = Server::start(BIN, &[]);
    // The harness gives each server a fresh data dir: restart it on the backup's file.
    let dir = s.data_dir().to_path_buf();
    let mut s = s;
    s.stop();
    // A restore replaces the store whole: data file, checkpoint and log (README, "Backup").
    for entry in std::fs::read_dir(&dir).expect("read data dir") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "checkpoint" || name.starts_with("wal-") || name == "lock.mdb" {
            std::fs::remove_file(&path).expect("remove");
        }
    }
    std::fs::copy(data.join("data.mdb"), dir.join("data.mdb")).expect("copy backup in");
    s.relaunch();
    s
}

#[test]
fn db_compact_makes_a_consistent_backup_while_writes_go_on() {
    let backups = tempfile::tempdir().expect("tempdir");
    let args = ["--backup-dir", backups.path().to_str().expect("utf8")];
    let s = Server::start(BIN, &args);
    let mut c = Mc::new(s.connect());
    for i in 0..2000 {
        c.set(&format!("k{i}"), i as u32, 0, &value(i));
    }
    assert_eq!(c.cmd("db_compact"), "OK\r\n");
    // Writes go on while the copy is made.
    for i in 2000..2500 {
        c.set(&format!("k{i}"), 0, 0, &value(i));
    }
    wait_for(&backups.path().join("data.mdb"));
    let restored = server_on(backups.path());
    let mut r = Mc::new(restored.connect());
    for i in 0..2000 {
        assert_eq!(
            r.get(&format!("k{i}")),
            Some((i as u32, value(i))),
            "k{i} in the backup"
        );
    }
}

#[test]
fn bgsave_and_lastsave_over_resp() {
    let backups = tempfile::tempdir().expect("tempdir");
    let args = vec![
        "--backup-dir".to_string(),
        backups.path().display().to_string(),
    ];
    let s = Server::start_with(
        BIN,
        Options {
            args,
            resp: true,
            ..Options::default()
        },
    );
    let mut c = Resp::connect(s.resp_addr().expect("RESP port"));
    assert_eq!(c.cmd("LASTSAVE"), Reply::Int(0));
    assert_eq!(c.cmd("RPUSH l a b c"), Reply::Int(3));
    assert_eq!(c.cmd("SET s v"), Reply::Simple("OK".into()));
    assert_eq!(
        c.cmd("BGSAVE"),
        Reply::Simple("Background saving started".into())
    );
    wait_for(&backups.path().join("data.mdb"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.cmd("LASTSAVE") == Reply::Int(0) {
        assert!(Instant::now() < deadline, "LASTSAVE never moved");
        std::thread::sleep(Duration::from_millis(20));
    }
    let restored = server_on(backups.path());
    drop(restored);
}

#[test]
fn backup_subcommand_copies_a_running_store() {
    let s = Server::start(BIN, &[]);
    let mut c = Mc::new(s.connect());
    for i in 0..500 {
        c.set(&format!("k{i}"), 7, 0, &value(i));
    }
    let dest = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["-H"])
        .arg(s.data_dir())
        .arg("backup")
        .arg(dest.path())
        .output()
        .expect("run memkeep backup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A second backup into the same place is refused rather than overwriting.
    let again = Command::new(BIN)
        .arg("-H")
        .arg(s.data_dir())
        .arg("backup")
        .arg(dest.path())
        .output()
        .expect("run");
    assert!(!again.status.success());
    let restored = server_on(dest.path());
    let mut r = Mc::new(restored.connect());
    for i in 0..500 {
        assert_eq!(r.get(&format!("k{i}")), Some((7, value(i))));
    }
}

#[test]
fn export_then_import_moves_items_with_flags_and_expiry() {
    let src = Server::start(BIN, &[]);
    let mut c = Mc::new(src.connect());
    for i in 0..300 {
        c.set(
            &format!("k{i}"),
            i as u32,
            if i % 2 == 0 { 0 } else { 100_000 },
            &value(i),
        );
    }
    c.set("gone", 0, -1, b"expired");
    let dump: PathBuf = src.data_dir().join("../dump.txt");
    let out = Command::new(BIN)
        .arg("-H")
        .arg(src.data_dir())
        .args(["export", "-o"])
        .arg(&dump)
        .output()
        .expect("export");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exported 300 items"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dst = Server::start(BIN, &[]);
    let out = Command::new(BIN)
        .args(["-l", "127.0.0.1", "-p", &dst.port().to_string(), "import"])
        .arg(&dump)
        .output()
        .expect("import");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut d = Mc::new(dst.connect());
    for i in 0..300 {
        assert_eq!(d.get(&format!("k{i}")), Some((i as u32, value(i))), "k{i}");
    }
    assert_eq!(d.get("gone"), None);
    // Odd keys carry an absolute expiry in the dump, even keys none.
    let text = String::from_utf8_lossy(&std::fs::read(&dump).expect("dump")).into_owned();
    assert!(
        text.starts_with("set k0 0 0 "),
        "dump starts with a plain set"
    );
    let k1 = text
        .lines()
        .find(|l| l.starts_with("set k1 "))
        .expect("k1 in the dump");
    let exptime: u64 = k1
        .split(' ')
        .nth(3)
        .expect("exptime")
        .parse()
        .expect("number");
    assert!(exptime > 2_592_000, "an absolute unix time: {k1}");
    // The dump is plain memcached protocol: real memcached takes it too.
    let mc = Server::memcached();
    let out = Command::new(BIN)
        .args(["-l", "127.0.0.1", "-p", &mc.port().to_string(), "import"])
        .arg(&dump)
        .output()
        .expect("import into memcached");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut m = Mc::new(mc.connect());
    for i in [0, 1, 150, 299] {
        assert_eq!(
            m.get(&format!("k{i}")),
            Some((i as u32, value(i))),
            "k{i} in memcached"
        );
    }
}

#[test]
fn memcachedb_options_are_honoured_or_reported() {
    // -N -C 1: no fsync per commit, a checkpoint every second (periodic); -m 128: map size.
    let s = Server::start(
        BIN,
        &[
            "-N", "-C", "1", "-m", "128", "-A", "4096", "-B", "btree", "-R", "host:1",
        ],
    );
    let mut c = Mc::new(s.connect());
    c.w.write_all(b"stats settings\r\n").expect("send");
    let mut settings = String::new();
    loop {
        let l = c.line();
        if l == "END\r\n" {
            break;
        }
        settings.push_str(&l);
    }
    assert!(settings.contains("STAT sync periodic\r\n"), "{settings}");
    assert!(
        settings.contains("STAT sync_interval_ms 1000\r\n"),
        "{settings}"
    );
    assert!(
        settings.contains("STAT maxbytes 134217728\r\n"),
        "{settings}"
    );
    let log = s.stderr();
    for flag in ["-A", "-B", "-R"] {
        assert!(
            log.contains(&format!("ignoring {flag}:")),
            "no warning for {flag}:\n{log}"
        );
    }
}

#[test]
fn daemon_mode_writes_its_pid_and_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pid_file = dir.path().join("memkeep.pid");
    let port = free_port();
    let status = Command::new(BIN)
        .args(["-d", "-P"])
        .arg(&pid_file)
        .args([
            "-p",
            &port.to_string(),
            "--resp-port",
            "0",
            "--sync",
            "never",
            "-H",
        ])
        .arg(dir.path().join("data"))
        .status()
        .expect("start");
    assert!(
        status.success(),
        "the foreground process must exit 0 once the daemon runs"
    );
    wait_for(&pid_file);
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid")
        .trim()
        .parse()
        .expect("a pid");
    let deadline = Instant::now() + Duration::from_secs(10);
    let conn = loop {
        if let Ok(c) = TcpStream::connect(("127.0.0.1", port)) {
            break c;
        }
        assert!(Instant::now() < deadline, "the daemon never listened");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut c = Mc::new(conn);
    assert!(c.cmd("version").starts_with("VERSION "));
    // Safety: pid names the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn user_option_drops_root_after_binding() {
    let s = Server::start(BIN, &["-u", "nobody"]);
    let mut c = Mc::new(s.connect());
    c.w.write_all(b"stats\r\n").expect("send");
    let mut pid = None;
    loop {
        let l = c.line();
        if let Some(p) = l.strip_prefix("STAT pid ") {
            pid = p.trim().parse::<u32>().ok();
        }
        if l == "END\r\n" {
            break;
        }
    }
    let pid = pid.expect("stats names the pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let uid_line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line")
        .to_string();
    // Safety: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(
            uid_line.split_whitespace().skip(1).all(|u| u == "65534"),
            "still root: {uid_line}"
        );
        // It still serves (the store was opened before the switch).
        c.set("k", 0, 0, b"v");
        assert_eq!(c.get("k"), Some((0, b"v".to_vec())));
    } else {
        assert!(s.stderr().contains("ignoring -u nobody"), "{}", s.stderr());
    }
}

/// RESP SHUTDOWN stops the server as SIGTERM does: the connection closes without a reply, the
/// process exits, and every acknowledged write is there after a restart. Inside MULTI it is
/// refused (Redis's no-multi), and ABORT has no pending shutdown to abort.
#[test]
fn shutdown_over_resp_stops_the_server_gracefully() {
    let mut s = Server::start_with(
        BIN,
        Options {
            resp: true,
            ..Options::default()
        },
    );
    let addr = s.resp_addr().expect("RESP port");
    let mut c = Resp::connect(addr);
    assert_eq!(c.cmd("SET sd:k v"), Reply::Simple("OK".into()));
    assert_eq!(
        c.cmd("SHUTDOWN ABORT"),
        Reply::Error("ERR No shutdown in progress.".into())
    );
    assert_eq!(
        c.cmd("SHUTDOWN SAVE NOSAVE"),
        Reply::Error("ERR syntax error".into())
    );
    assert_eq!(c.cmd("MULTI"), Reply::Simple("OK".into()));
    assert_eq!(
        c.cmd("SHUTDOWN"),
        Reply::Error("ERR Command not allowed inside a transaction".into())
    );
    assert_eq!(
        c.cmd("EXEC"),
        Reply::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert!(s.is_running());
    let mut raw = TcpStream::connect(addr).expect("connect");
    raw.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    raw.write_all(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
        .expect("send");
    let mut buf = [0u8; 64];
    match raw.read(&mut buf) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("SHUTDOWN answered {:?}", String::from_utf8_lossy(&buf[..n])),
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.is_running() {
        assert!(Instant::now() < deadline, "still running after SHUTDOWN");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.relaunch();
    let mut c = Resp::connect(s.resp_addr().expect("RESP port"));
    assert_eq!(c.cmd("GET sd:k"), Reply::bulk("v"));
}
