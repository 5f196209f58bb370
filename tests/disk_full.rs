//! A full disk: writes fail with a storage error in both protocols, the writer says why once
//! and then sleeps (it used to retry its LMDB commit in a loop: a core at 100% and half a
//! gigabyte of the same log line a minute), reads go on; once room is made writes resume by
//! themselves, and a restart finds every acknowledged write.
//!
//! The disk is a small ext4 file system in a file, loop-mounted: root only, and skipped (it
//! says so) where mounting is not possible.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::resp::{Reply, Resp};
use common::{Options, Server};

/// A small ext4 file system, loop-mounted for the test's life.
struct SmallDisk {
    _dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl SmallDisk {
    fn mount(mib: u64) -> Result<SmallDisk, String> {
        // SAFETY: a plain system call with no arguments.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: cannot mount a file system".into());
        }
        let dir = tempfile::Builder::new()
            .prefix("memkeep-disk-full-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let img = dir.path().join("disk.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).map_err(|e| format!("mkdir: {e}"))?;
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(mib << 20))
            .map_err(|e| format!("image: {e}"))?;
        let run = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{cmd:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        let mkfs = ["mkfs.ext4", "/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4"]
            .into_iter()
            .find(|p| Command::new(p).arg("-V").output().is_ok())
            .ok_or("mkfs.ext4 not found (Debian package e2fsprogs)")?;
        // No blocks reserved for root: "full" is the same for the server (root) and statvfs.
        run(Command::new(mkfs).args(["-q", "-F", "-m", "0"]).arg(&img))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt))?;
        Ok(SmallDisk { _dir: dir, mnt })
    }

    fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Something still holds it (a server that did not stop): detach it anyway.
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

fn value(i: usize) -> Vec<u8> {
    format!("{i:08}").repeat(2500).into_bytes()
}

struct Mc {
    w: std::net::TcpStream,
    r: BufReader<std::net::TcpStream>,
}

impl Mc {
    fn open(s: &Server) -> Mc {
        let conn = s.connect();
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Mc {
            w: conn.try_clone().expect("clone"),
            r: BufReader::new(conn),
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("reply");
        l.trim_end().to_string()
    }

    fn set(&mut self, key: &str, v: &[u8]) -> String {
        let mut req = format!("set {key} 0 0 {}\r\n", v.len()).into_bytes();
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n");
        self.w.write_all(&req).expect("send");
        self.line()
    }

    fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.w
            .write_all(format!("get {key}\r\n").as_bytes())
            .expect("send");
        let head = self.line();
        if head == "END" {
            return None;
        }
        let n: usize = head
            .split(' ')
            .nth(3)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{head}"));
        let mut v = vec![0u8; n + 2];
        self.r.read_exact(&mut v).expect("value");
        v.truncate(n);
        assert_eq!(self.line(), "END");
        Some(v)
    }
}

/// CPU time (clock ticks) the server's writer thread has used.
fn writer_ticks(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc tasks");
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "memkeep-writer" {
            let stat = std::fs::read_to_string(t.path().join("stat")).expect("stat");
            // Fields after the parenthesised name: state is 3rd, utime 14th, stime 15th.
            let rest = &stat[stat.rfind(')').expect("stat") + 2..];
            let f: Vec<&str> = rest.split(' ').collect();
            let num = |i: usize| f[i - 3].parse::<u64>().expect("ticks");
            return num(14) + num(15);
        }
    }
    panic!("no writer thread in process {pid}");
}

/// SETs 20 KB values `k{from}..` until one is refused; returns how many were stored in all
/// (keys `k0..` that number) and the refusal.
fn fill(mc: &mut Mc, from: usize) -> (usize, String) {
    let mut stored = from;
    loop {
        assert!(stored < 20_000, "the disk took {stored} values of 20 KB");
        let r = mc.set(&format!("k{stored}"), &value(stored));
        if r != "STORED" {
            return (stored, r);
        }
        stored += 1;
    }
}

/// Every key `k0..stored` reads back whole (all through the memcached protocol, a sample
/// through RESP).
fn read_back(s: &Server, stored: usize, when: &str) {
    let mut mc = Mc::open(s);
    let mut r = Resp::connect(s.resp_addr().expect("resp"));
    for i in 0..stored {
        assert_eq!(mc.get(&format!("k{i}")), Some(value(i)), "k{i} {when}");
    }
    for i in (0..stored).step_by(53) {
        assert_eq!(
            r.call(&[b"GET", format!("k{i}").as_bytes()]),
            Reply::Bulk(Some(value(i))),
            "k{i} {when}"
        );
    }
}

/// Fills a disk of `disk_mib` with 20 KB values and checks the refusals; frees `room_mib`
/// and checks that writes resume without a restart; fills it again, stops, checks that a
/// start on the full disk says why if it fails; frees `room_mib` more and restarts.
fn fill_the_disk_then_recover(args: &[&str], disk_mib: u64, room_mib: usize) {
    let disk = match SmallDisk::mount(disk_mib) {
        Ok(d) => d,
        Err(why) => {
            eprintln!("SKIPPED: full-disk test needs a loop-mounted file system: {why}");
            return;
        }
    };
    // Room to give back later, twice.
    let ballast: Vec<PathBuf> = (0..2)
        .map(|i| disk.path().join(format!("ballast{i}")))
        .collect();
    for b in &ballast {
        std::fs::write(b, vec![7u8; room_mib << 20]).expect("ballast");
    }
    let mut s = Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            args: args.iter().map(|a| a.to_string()).collect(),
            resp: true,
            data_dir: Some(disk.path().join("data")),
            ..Options::default()
        },
    );
    let mut mc = Mc::open(&s);
    let (stored, refusal) = fill(&mut mc, 0);
    assert_eq!(
        refusal, "SERVER_ERROR storage failure",
        "after {stored} values"
    );
    assert!(
        stored > 500,
        "only {stored} values before the disk was full"
    );
    // Later writes fail the same way, through both protocols, and the connections stay.
    for i in 0..20 {
        assert_eq!(
            mc.set(&format!("late{i}"), b"x"),
            "SERVER_ERROR storage failure"
        );
    }
    let mut r = Resp::connect(s.resp_addr().expect("resp"));
    match r.call(&[b"SET", b"late", b"x"]) {
        Reply::Error(e) => assert!(e.starts_with("ERR storage failure"), "{e}"),
        other => panic!("SET on a full disk: {other:?}"),
    }
    // Reads go on.
    for i in (0..stored).step_by(97) {
        assert_eq!(mc.get(&format!("k{i}")), Some(value(i)), "k{i}");
        assert_eq!(
            r.call(&[b"GET", format!("k{i}").as_bytes()]),
            Reply::Bulk(Some(value(i))),
            "k{i}"
        );
    }
    // The writer sleeps: over two seconds it used a fraction of one (a retry loop used all).
    let pid = s.pid().expect("running");
    let before = writer_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = writer_ticks(pid) - before;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    assert!(
        used * 4 < 2 * hz,
        "the writer used {used} ticks of {hz}/s in 2 s with the disk full"
    );
    // Said once, with the reason.
    let log = s.stderr();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("refusing writes"))
        .collect();
    assert_eq!(said.len(), 1, "{}", s.stderr_tail(3000));
    assert!(said[0].contains("the disk is full"), "{}", said[0]);
    assert!(log.lines().count() < 100, "{}", s.stderr_tail(3000));

    // Room again: writes resume by themselves (the writer tries every 2 s).
    std::fs::remove_file(&ballast[0]).expect("remove ballast");
    let mut tries = 0;
    while mc.set("resumed", b"yes") != "STORED" {
        tries += 1;
        assert!(
            tries < 200,
            "writes did not resume: {}",
            s.stderr_tail(2000)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(mc.get("resumed"), Some(b"yes".to_vec()));
    assert!(
        s.stderr().contains("writes resume"),
        "{}",
        s.stderr_tail(2000)
    );
    read_back(&s, stored, "after writes resumed");

    // Full again, then stopped: a start on the full disk works or says why it cannot.
    let (stored, refusal) = fill(&mut mc, stored);
    assert_eq!(
        refusal, "SERVER_ERROR storage failure",
        "after {stored} values"
    );
    drop(r);
    drop(mc);
    s.stop();
    if let Err(e) = s.try_relaunch() {
        assert!(e.contains("the disk is full"), "{e}");
    } else {
        s.stop();
    }
    std::fs::remove_file(&ballast[1]).expect("remove ballast");
    s.relaunch();
    read_back(&s, stored, "after a restart");
    let mut mc = Mc::open(&s);
    assert_eq!(mc.get("resumed"), Some(b"yes".to_vec()));
    assert_eq!(mc.set("after", b"room again"), "STORED");
    assert_eq!(mc.get("after"), Some(b"room again".to_vec()));
    drop(mc);
    s.stop();
    s.assert_check_clean();
}

#[test]
fn a_full_disk_in_never_refuses_writes_once_and_loses_none() {
    fill_the_disk_then_recover(&["--sync", "never"], 96, 8);
}

#[test]
fn a_full_disk_in_always_refuses_writes_once_and_loses_none() {
    fill_the_disk_then_recover(&["--sync", "always"], 96, 8);
}

#[test]
fn a_full_disk_with_values_in_the_log_refuses_writes_once_and_loses_none() {
    // Recovery writes the values logged since the checkpoint into LMDB (replay is inline, not
    // by pointer), so the restart needs room for up to a checkpoint's worth of log (32 MiB):
    // with 8 MiB freed it failed, the disk full again.
    fill_the_disk_then_recover(&["--sync", "never", "--value-log-min", "8k"], 160, 40);
}

/// One field of INFO replication.
fn info(s: &Server, field: &str) -> String {
    let mut r = Resp::connect(s.resp_addr().expect("resp"));
    let all = match r.call(&[b"INFO", b"replication"]) {
        Reply::Bulk(Some(b)) | Reply::Verbatim(b) => String::from_utf8_lossy(&b).into_owned(),
        other => panic!("INFO: {other:?}"),
    };
    all.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO replication:\n{all}"))
        .trim()
        .to_string()
}

#[test]
fn a_replica_with_a_full_disk_retries_less_and_less_often_then_catches_up() {
    let disk = match SmallDisk::mount(160) {
        Ok(d) => d,
        Err(why) => {
            eprintln!("SKIPPED: full-disk test needs a loop-mounted file system: {why}");
            return;
        }
    };
    let ballast = disk.path().join("ballast");
    std::fs::write(&ballast, vec![7u8; 100 << 20]).expect("ballast");
    let p = Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            args: vec!["--sync".into(), "never".into()],
            ..Options::default()
        },
    );
    let port = p.resp_addr().expect("resp").port();
    let r = Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            args: vec![
                "--sync".into(),
                "never".into(),
                "--replica-of".into(),
                format!("127.0.0.1:{port}"),
            ],
            data_dir: Some(disk.path().join("data")),
            ..Options::default()
        },
    );
    // The primary takes every write; the replica's disk fills.
    let mut mc = Mc::open(&p);
    let mut stored = 0;
    while !r.stderr().contains("refusing writes") {
        assert!(stored < 6000, "the replica's disk never filled");
        assert_eq!(mc.set(&format!("k{stored}"), &value(stored)), "STORED");
        stored += 1;
    }
    // Links that fail on the replica's own writes are tried again after 1, 2, 4 ... s (each
    // try can cost the primary a full copy of its data).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let waits = loop {
        let waits: Vec<u64> = r
            .stderr()
            .lines()
            .filter_map(|l| l.split("next try in ").nth(1))
            .filter_map(|w| w.trim_end_matches(" s").parse().ok())
            .collect();
        if waits.len() >= 3 {
            break waits;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            r.stderr_tail(3000)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(waits[..3], [1, 2, 4], "{}", r.stderr_tail(3000));
    // The replica still serves what it has.
    assert_eq!(Mc::open(&r).get("k0"), Some(value(0)));
    // Room again: its writes resume, and a later link catches up with everything.
    std::fs::remove_file(&ballast).expect("remove ballast");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while info(&r, "master_link_status") != "up"
        || info(&r, "slave_repl_offset") != info(&p, "master_repl_offset")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never caught up: {}",
            r.stderr_tail(3000)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut rmc = Mc::open(&r);
    for i in (0..stored).step_by(17) {
        assert_eq!(
            rmc.get(&format!("k{i}")),
            Some(value(i)),
            "k{i} on the replica"
        );
    }
    assert_eq!(
        rmc.get(&format!("k{}", stored - 1)),
        Some(value(stored - 1))
    );
}
