//! Running client programs from tests: the venv's Python, tools on PATH, each with a deadline
//! (killed past it), their output kept for failure messages; and the server-health check every
//! client test ends with.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::Server;

/// Deadline for one client program (a Python script, redis-cli, redis-benchmark, java).
pub const CLIENT_DEADLINE: Duration = Duration::from_secs(180);

/// The server must still run and must not have logged a panic (a worker thread can die alone).
pub fn assert_healthy(server: &mut Server) {
    let stderr = server.stderr();
    assert!(
        !stderr.contains("panicked"),
        "the server logged a panic:\n{stderr}"
    );
    assert!(
        server.is_running(),
        "the server exited; stderr:\n{}",
        server.stderr_tail(3000)
    );
}

pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `.venv/bin/python` with the Python clients, made by `scripts/install-test-deps.sh`.
pub fn venv_python() -> PathBuf {
    let py = repo_root().join(".venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run ./scripts/install-test-deps.sh (make deps)",
        py.display()
    );
    py
}

/// A program on PATH, or a failure naming `make deps`.
pub fn tool(name: &str) -> &str {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()));
    assert!(
        found,
        "{name} is not on PATH: run ./scripts/install-test-deps.sh (make deps)"
    );
    name
}

/// What a finished (or killed) client program did.
pub struct Run {
    pub what: String,
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn describe(&self) -> String {
        let status = match self.status {
            Some(s) => s.to_string(),
            None => format!("killed after {:?} (deadline)", self.elapsed),
        };
        format!(
            "{}: {status}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what, self.stdout, self.stderr
        )
    }

    /// Panics, showing everything, unless the program exited 0.
    pub fn success(self, servers: &[&Server]) -> Run {
        if !self.status.is_some_and(|s| s.success()) {
            let logs: String = servers
                .iter()
                .map(|s| {
                    format!(
                        "--- server {} stderr ---\n{}\n",
                        s.port(),
                        s.stderr_tail(3000)
                    )
                })
                .collect();
            panic!("{}\n{logs}", self.describe());
        }
        self
    }
}

/// Runs `cmd` with `stdin` as its input, killing it past `deadline`.
pub fn run_bounded(mut cmd: Command, stdin: &[u8], deadline: Duration) -> Run {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    let feeder = thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let drain = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break Some(s);
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let _ = feeder.join();
    Run {
        what,
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        elapsed: start.elapsed(),
    }
}

/// Runs a Python script (with the venv's interpreter) with `args`.
pub fn python(script: &str, args: &[String]) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("script.py");
    std::fs::write(&path, script).expect("write script");
    let mut cmd = Command::new(venv_python());
    cmd.arg("-W")
        .arg("ignore::DeprecationWarning")
        .arg(&path)
        .args(args);
    run_bounded(cmd, b"", CLIENT_DEADLINE)
}
