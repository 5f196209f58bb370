//! Startup on an unusable data directory: a read-only store, a read-only or uncreatable
//! directory, a path that is a regular file, a data file of random bytes, a truncated data file.
//! Each must stop memkeep with exactly one line on stderr that names the path and the problem,
//! and a non-zero exit code: no panic, no backtrace, no signal.
//!
//! Root ignores file permissions, so when the tests run as root (as in CI) the read-only cases
//! run memkeep as the unprivileged user `nobody` (through util-linux's `setpriv`) on files that
//! user owns; where that is impossible they say so and skip.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Server, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
/// How long a failing start may take to exit.
const EXIT_DEADLINE: Duration = Duration::from_secs(10);

/// An unprivileged identity to run memkeep as, when the tests run as root.
#[derive(Clone, Copy)]
struct Nobody {
    uid: u32,
    gid: u32,
}

fn is_root() -> bool {
    // Safety: a plain libc call without arguments.
    unsafe { libc::geteuid() == 0 }
}

fn nobody() -> Option<Nobody> {
    let name = std::ffi::CString::new("nobody").expect("no NUL");
    // Safety: getpwnam's result is read at once, before any other call could overwrite it.
    unsafe {
        let pw = libc::getpwnam(name.as_ptr());
        (!pw.is_null()).then(|| Nobody {
            uid: (*pw).pw_uid,
            gid: (*pw).pw_gid,
        })
    }
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

/// A temp dir every user can enter, for the data dirs of these tests.
fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("memkeep-startup-")
        .tempdir()
        .expect("temp dir");
    chmod(dir.path(), 0o755);
    dir
}

/// How to run memkeep: directly, or as `nobody` from a copy of the binary every user can
/// execute (the build directory may not be reachable for that user).
struct Runner {
    bin: PathBuf,
    as_user: Option<Nobody>,
    _bin_dir: Option<tempfile::TempDir>,
}

impl Runner {
    fn direct() -> Runner {
        Runner {
            bin: PathBuf::from(BIN),
            as_user: None,
            _bin_dir: None,
        }
    }

    /// A runner whose file-permission checks are real: the current user unless that is root,
    /// else `nobody` through setpriv. None (after saying why) where neither is possible.
    fn unprivileged() -> Option<Runner> {
        if !is_root() {
            return Some(Runner::direct());
        }
        let Some(user) = nobody() else {
            eprintln!("SKIPPED: running as root and there is no user `nobody`");
            return None;
        };
        let dir = open_tempdir();
        let bin = dir.path().join("memkeep");
        fs::copy(BIN, &bin).expect("copy the memkeep binary");
        chmod(&bin, 0o755);
        let runner = Runner {
            bin,
            as_user: Some(user),
            _bin_dir: Some(dir),
        };
        match runner.command(&["--version"]).output() {
            Ok(out) if out.status.success() => Some(runner),
            Ok(out) => {
                eprintln!(
                    "SKIPPED: running as root, and memkeep cannot run as `nobody` through setpriv: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: running as root, and setpriv is not available: {e}");
                None
            }
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = match self.as_user {
            None => Command::new(&self.bin),
            Some(u) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={}", u.uid))
                    .arg(format!("--regid={}", u.gid))
                    .arg("--clear-groups")
                    .arg(&self.bin);
                c
            }
        };
        cmd.args(args);
        cmd
    }

    /// Whether the user memkeep runs as can create the file `path`.
    fn can_create(&self, path: &Path) -> bool {
        let mut cmd = match self.as_user {
            None => Command::new("sh"),
            Some(u) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={}", u.uid))
                    .arg(format!("--regid={}", u.gid))
                    .args(["--clear-groups", "sh"]);
                c
            }
        };
        cmd.args(["-c", ": > \"$1\"", "sh"])
            .arg(path)
            .stderr(Stdio::null())
            .status()
            .expect("run sh")
            .success()
    }

    /// Hands `path` (and what is in it) to the user memkeep runs as.
    fn give(&self, path: &Path) {
        let Some(u) = self.as_user else { return };
        let mut paths = vec![path.to_path_buf()];
        if path.is_dir() {
            paths.extend(
                fs::read_dir(path)
                    .expect("read dir")
                    .map(|e| e.expect("dir entry").path()),
            );
        }
        for p in paths {
            std::os::unix::fs::chown(&p, Some(u.uid), Some(u.gid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
        }
    }

    /// Starts memkeep on `data_dir` and waits (bounded) for it to exit.
    fn start(&self, data_dir: &Path, sync: &str) -> Output {
        let port = free_port().to_string();
        let dir = data_dir.to_str().expect("utf-8 path");
        let mut child = self
            .command(&[
                "-p",
                &port,
                "--resp-port",
                "0",
                "-l",
                "127.0.0.1",
                "-H",
                dir,
                "--sync",
                sync,
            ])
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn memkeep");
        let deadline = Instant::now() + EXIT_DEADLINE;
        while child.try_wait().expect("try_wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().expect("reap");
                panic!(
                    "memkeep kept running on the unusable data dir {dir}; stderr:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait_with_output().expect("collect output")
    }
}

/// The start failed cleanly: a non-zero exit code, nothing on stdout, and on stderr exactly
/// one line that starts with `memkeep: `, names `path` and says `problem`. Returns the line.
fn assert_one_line_failure(out: &Output, path: &Path, problem: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "expected a non-zero exit code, got {} (stderr: {stderr})",
        out.status
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "a panic instead of an error line:\n{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line on stderr, got:\n{stderr}"
    );
    let line = lines[0];
    assert!(line.starts_with("memkeep: "), "{line}");
    assert!(
        line.contains(&path.display().to_string()),
        "the line does not name {}: {line}",
        path.display()
    );
    assert!(
        line.contains(problem),
        "the line does not say {problem:?}: {line}"
    );
    assert!(
        out.stdout.is_empty(),
        "stdout: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!("{line}");
    line.to_string()
}

/// A memcached request on `server`, answered with one line.
fn mc(server: &Server, req: &str) -> String {
    let mut s = TcpStream::connect(server.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(req.as_bytes()).expect("send");
    let mut r = BufReader::new(s);
    let mut l = String::new();
    r.read_line(&mut l).expect("reply");
    l.trim_end().to_string()
}

/// A server with one item in its store, stopped cleanly: its data dir holds a real store.
fn stopped_store() -> Server {
    let mut server = Server::start(BIN, &["--sync", "always"]);
    assert_eq!(mc(&server, "set kept 3 0 5\r\nvalue\r\n"), "STORED");
    server.stop();
    server
}

/// The item `stopped_store` wrote is still there.
fn assert_item_kept(server: &mut Server) {
    server.relaunch();
    let mut s = TcpStream::connect(server.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"get kept\r\n").expect("send");
    let mut r = BufReader::new(s);
    let mut got = String::new();
    for _ in 0..3 {
        r.read_line(&mut got).expect("reply");
    }
    assert_eq!(got, "VALUE kept 3 5\r\nvalue\r\nEND\r\n");
}

/// Gives paths their modes back when dropped (also when a test fails), so the temp dirs can go.
struct Restore(Vec<(PathBuf, u32)>);

impl Drop for Restore {
    fn drop(&mut self) {
        for (p, mode) in &self.0 {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(*mode));
        }
    }
}

#[test]
fn read_only_store_is_refused_in_one_line() {
    let Some(runner) = Runner::unprivileged() else {
        return;
    };
    let mut server = stopped_store();
    let dir = server.data_dir().to_path_buf();
    let files = ["data.mdb", "lock.mdb"].map(|f| dir.join(f));
    runner.give(&dir);
    {
        let _restore = Restore(vec![
            (dir.clone(), 0o700),
            (files[0].clone(), 0o600),
            (files[1].clone(), 0o600),
        ]);
        for f in &files {
            chmod(f, 0o444);
        }
        chmod(&dir, 0o555);
        assert!(
            !runner.can_create(&dir.join("probe")),
            "the read-only data dir is writable for the user memkeep runs as"
        );
        let out = runner.start(&dir, "always");
        assert_one_line_failure(&out, &dir, "Permission denied");
    }
    // The failed start left the store as it was.
    assert_item_kept(&mut server);
}

#[test]
fn read_only_empty_dir_and_uncreatable_dir_are_refused_in_one_line() {
    let Some(runner) = Runner::unprivileged() else {
        return;
    };
    let top = open_tempdir();
    let empty = top.path().join("empty");
    fs::create_dir(&empty).expect("mkdir");
    runner.give(&empty);
    let _restore = Restore(vec![(empty.clone(), 0o755)]);
    chmod(&empty, 0o555);
    assert!(
        !runner.can_create(&empty.join("probe")),
        "the read-only data dir is writable for the user memkeep runs as"
    );
    let out = runner.start(&empty, "always");
    assert_one_line_failure(&out, &empty, "Permission denied");
    assert_eq!(
        fs::read_dir(&empty).expect("read dir").count(),
        0,
        "the failed start left files behind"
    );
    // A data dir memkeep would have to create inside a read-only one.
    let below = empty.join("data");
    let out = runner.start(&below, "never");
    assert_one_line_failure(&out, &below, "cannot create data directory");
}

#[test]
fn data_dir_that_is_a_regular_file_is_refused_in_one_line() {
    let top = open_tempdir();
    let file = top.path().join("not-a-dir");
    fs::write(&file, b"x").expect("write");
    let out = Runner::direct().start(&file, "always");
    assert_one_line_failure(&out, &file, "is not a directory");
}

#[test]
fn data_file_of_random_bytes_is_refused_in_one_line() {
    let top = open_tempdir();
    let dir = top.path().join("garbage");
    fs::create_dir(&dir).expect("mkdir");
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let junk: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(dir.join("data.mdb"), &junk).expect("write");
    for sync in ["always", "never"] {
        let out = Runner::direct().start(&dir, sync);
        assert_one_line_failure(&out, &dir, "not an LMDB file");
    }
    // A directory where the data file belongs.
    let odd = top.path().join("odd");
    fs::create_dir_all(odd.join("data.mdb")).expect("mkdir");
    let out = Runner::direct().start(&odd, "always");
    assert_one_line_failure(&out, &odd, "Is a directory");
}

/// A data file cut short (a partial copy, a disk that lost writes) used to crash memkeep with
/// SIGBUS on the first read of a missing page.
#[test]
fn truncated_data_file_is_refused_in_one_line() {
    let mut server = Server::start(BIN, &["--sync", "always"]);
    // Enough data for the store to need many pages.
    let value = "v".repeat(2000);
    for i in 0..200 {
        assert_eq!(
            mc(&server, &format!("set k{i} 0 0 2000\r\n{value}\r\n")),
            "STORED"
        );
    }
    server.stop();
    let data = server.data_dir().join("data.mdb");
    let full = fs::read(&data).expect("read data.mdb");
    assert!(full.len() > 64 * 1024, "store of {} bytes", full.len());
    // Safety: a plain libc call.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    for sync in ["always", "never"] {
        // The two meta pages survive; the pages they point to do not.
        fs::write(&data, &full[..2 * page]).expect("truncate");
        let out = Runner::direct().start(server.data_dir(), sync);
        assert_one_line_failure(&out, &data, "is truncated");
    }
    // Whole again, it opens with every item.
    fs::write(&data, &full).expect("restore");
    server.relaunch();
    assert_eq!(mc(&server, "get k199\r\n"), "VALUE k199 0 2000");
}
