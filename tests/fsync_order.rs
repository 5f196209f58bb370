//! `--sync always` fsyncs before any reply of a batch leaves: kill -9 cannot tell an fsync from
//! the page cache, so this test watches the system calls. memkeep runs under `strace`; a client
//! sends SETs one at a time, each waiting for its `STORED`. Every reply must be preceded by an
//! `fdatasync` of the write-ahead log that finished after the previous reply was sent, i.e.
//! inside that request's window. The same check run with `--sync never` must fail, which shows
//! it can tell the two apart.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Server;

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

/// A traced system call: when it started and ended (unix seconds), and which.
#[derive(Debug)]
struct Call {
    end: f64,
    start: f64,
    fsync: bool,
    stored_reply: bool,
}

/// Parses strace `-f -ttt -T` output: `PID START syscall(args) = ret <DURATION>`, where calls
/// another thread interrupted appear as `... <unfinished ...>` then `<... syscall resumed> ...`.
fn parse(log: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut pending: std::collections::HashMap<String, (f64, String)> = Default::default();
    for line in log.lines() {
        // strace pads the pid column to a fixed width, so split on runs of spaces.
        let Some((pid, after_pid)) = line.split_once(' ') else {
            continue;
        };
        let Some((ts, rest)) = after_pid.trim_start().split_once(' ') else {
            continue;
        };
        let Ok(ts) = ts.parse::<f64>() else { continue };
        let (start, text) = if rest.ends_with("<unfinished ...>") {
            pending.insert(pid.to_string(), (ts, rest.to_string()));
            continue;
        } else if rest.starts_with("<...") {
            match pending.remove(pid) {
                Some((start, head)) => (start, format!("{head} {rest}")),
                None => continue,
            }
        } else {
            (ts, rest.to_string())
        };
        let Some(dur) = text
            .rsplit_once('<')
            .and_then(|(_, d)| d.trim_end_matches('>').parse::<f64>().ok())
        else {
            continue;
        };
        // Only a sync of the write-ahead log makes a reply durable (`-y` prints each fd's
        // path); the checkpointer's syncs of data.mdb and of spare log files do not count.
        let fsync = (text.starts_with("fdatasync(") || text.starts_with("fsync("))
            && text.contains("/wal-")
            && text.contains(".log>");
        let stored_reply = text.starts_with("sendto(") && text.contains("\"STORED\\r\\n\"");
        if fsync || stored_reply {
            calls.push(Call {
                start,
                end: start + dur,
                fsync,
                stored_reply,
            });
        }
    }
    calls
}

/// Starts memkeep with `sync`, attaches strace to all its threads, sends `n` sequential SETs,
/// stops memkeep (SIGTERM; strace ends with it) and returns the traced calls. The server comes
/// from the shared launcher, which makes sure the port answers for our own child: two tests
/// here start servers at once, and a port handed out twice once sent this test's SETs to the
/// other test's server, which was being stopped (a reset, in CI).
fn trace(sync: &str, n: usize) -> Vec<Call> {
    trace_with(sync, n, &[], 1)
}

/// `trace` with more server flags, and values of `len` bytes.
fn trace_with(sync: &str, n: usize, extra: &[&str], len: usize) -> Vec<Call> {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("strace.log");
    let mut args = vec!["--sync", sync];
    args.extend_from_slice(extra);
    let mut server = Server::start(BIN, &args);
    let conn = server.connect();
    // Attach to every thread and wait until strace says it has.
    let pid = server.pid().expect("memkeep runs");
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("threads")
        .count();
    let mut strace = Command::new("strace")
        .args([
            "-f",
            "-ttt",
            "-T",
            "-y",
            "-e",
            "trace=fdatasync,fsync,sendto",
            "-o",
        ])
        .arg(&log)
        .args(["-p", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strace is installed by `make deps` (scripts/install-test-deps.sh)");
    let mut attach_log = BufReader::new(strace.stderr.take().expect("stderr"));
    // strace reports "Process N attached with M threads" (or one line per thread).
    let mut attached = 0;
    while attached < threads {
        let mut l = String::new();
        if attach_log.read_line(&mut l).expect("strace stderr") == 0 {
            panic!("strace exited before attaching (is ptrace allowed here?)");
        }
        if let Some((_, m)) = l.split_once("attached with ") {
            attached = m
                .split_whitespace()
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(threads);
        } else if l.contains("attached") {
            attached += 1;
        }
    }
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut w = conn.try_clone().expect("clone");
    let mut r = BufReader::new(conn);
    for i in 0..n {
        let mut req = format!("set k{i} 0 0 {len}\r\n").into_bytes();
        req.extend(std::iter::repeat_n(b'x', len));
        req.extend_from_slice(b"\r\n");
        w.write_all(&req)
            .unwrap_or_else(|e| panic!("send: {e}\n{}", server.stderr_tail(2000)));
        let mut reply = String::new();
        r.read_line(&mut reply).expect("reply");
        assert_eq!(reply, "STORED\r\n");
    }
    let status = server.terminate();
    assert!(
        status.is_some_and(|s| s.success()),
        "memkeep stopped on SIGTERM: {status:?}"
    );
    let _ = strace.wait();
    parse(&std::fs::read_to_string(&log).expect("strace log"))
}

/// For each STORED reply, whether an fsync finished between the previous reply and this one.
fn each_reply_follows_an_fsync(calls: &[Call]) -> Result<usize, String> {
    let replies: Vec<&Call> = calls.iter().filter(|c| c.stored_reply).collect();
    let fsyncs: Vec<&Call> = calls.iter().filter(|c| c.fsync).collect();
    let mut prev = f64::MIN;
    for (i, r) in replies.iter().enumerate() {
        if !fsyncs.iter().any(|f| f.end > prev && f.end <= r.start) {
            return Err(format!(
                "reply {i} at {:.6} left with no fsync since {prev:.6}",
                r.start
            ));
        }
        prev = r.start;
    }
    Ok(replies.len())
}

#[test]
fn sync_always_fsyncs_before_every_reply() {
    let calls = trace("always", 40);
    match each_reply_follows_an_fsync(&calls) {
        Ok(n) => assert_eq!(n, 40, "every STORED reply was traced"),
        Err(e) => panic!("{e}"),
    }
}

/// With large values in the log (`--value-log-min`), each value is written into its segment
/// before the batch is appended; the reply still waits for the segment's fdatasync.
#[test]
fn sync_always_fsyncs_before_every_reply_with_values_in_the_log() {
    let calls = trace_with("always", 40, &["--value-log-min", "1k"], 5000);
    match each_reply_follows_an_fsync(&calls) {
        Ok(n) => assert_eq!(n, 40, "every STORED reply was traced"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn the_check_tells_sync_never_apart() {
    let calls = trace("never", 10);
    assert_eq!(
        calls.iter().filter(|c| c.stored_reply).count(),
        10,
        "every STORED reply was traced"
    );
    assert!(
        each_reply_follows_an_fsync(&calls).is_err(),
        "with --sync never no fsync precedes the replies"
    );
}

#[test]
fn strace_lines_parse_with_padded_pids_and_split_calls() {
    let log = "1868  1796011648.289919 fdatasync(4</d/wal-0000000000000001.log>)    = 0 <0.000384>\n\
               27001 1796011648.290567 sendto(16<TCP:[1]>, \"STORED\\r\\n\", 8, MSG_NOSIGNAL, NULL, 0) = 8 <0.000169>\n\
               1870  1796011648.290600 fdatasync(5</d/data.mdb>) = 0 <0.000100>\n\
               1868  1796011648.291000 fdatasync(4</d/wal-0000000000000001.log> <unfinished ...>\n\
               1869  1796011648.291100 sendto(16, \"END\\r\\n\", 5, MSG_NOSIGNAL, NULL, 0) = 5 <0.000010>\n\
               1868  1796011648.291500 <... fdatasync resumed>) = 0 <0.000600>\n";
    let calls = parse(log);
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls[0].fsync && calls[1].stored_reply && calls[2].fsync);
    assert!(
        (calls[2].end - (1796011648.291 + 0.0006)).abs() < 1e-6,
        "{calls:?}"
    );
}
