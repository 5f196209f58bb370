//! What the two golden replayers share: `tests/transcripts.rs` (text and RESP transcripts) and
//! `tests/binary_vectors.rs` (memcached binary vectors). Both read files of `== name` cases,
//! replay every case three ways (whole, line, byte) on a fresh connection to one server per
//! file, check the connection is still in sync after each case, and fail with one summary.
//!
//! The protocol-specific parts stay in the test files: the step types and their parsers, how a
//! reply is read (`read_line` / `packet`, inherent methods each file adds to `Conn`) and matched,
//! and what the in-sync probe sends and expects (a `Probe`).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};

use super::Server;

pub fn memkeep_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_memkeep"))
}

// ---------------------------------------------------------------------------------------------
// Cases

/// One step of a case and the file line it came from.
#[derive(Debug, Clone)]
pub struct Line<S> {
    pub no: usize,
    pub step: S,
}

#[derive(Debug, Clone)]
pub struct Case<S> {
    pub name: String,
    /// The line of its `== name`.
    pub line: usize,
    pub steps: Vec<Line<S>>,
    /// `@ memkeep-only`: not replayed against another server.
    pub memkeep_only: bool,
}

/// What a step is to the replay driver.
pub enum Role {
    /// Bytes to send; `uses_var`: they need a value captured from an earlier reply.
    Send { uses_var: bool },
    /// Checked against what the server sends (in order with the other expectations).
    Expect,
    /// Done once every earlier reply has been checked (`@ time`, `@ restart`).
    Directive,
}

pub trait ReplayStep {
    fn role(&self) -> Role;
    /// `@ closed`: the server closes the connection (only ever the last step).
    fn is_closed(&self) -> bool;
}

impl<S: ReplayStep> Case<S> {
    pub fn ends_closed(&self) -> bool {
        self.steps.last().is_some_and(|l| l.step.is_closed())
    }
}

/// The cases of a file. Blank lines and `#` comments are skipped, `== name` starts a case, and
/// every other line goes first to `file_line` (with whether no case has started yet), which may
/// take it (`Ok(true)`), then to `step`, which makes it a step of the current case or returns
/// `None` for `@ memkeep-only`. Errors name the line.
pub fn parse_cases<S>(
    text: &str,
    mut file_line: impl FnMut(&str, bool) -> Result<bool, String>,
    mut step: impl FnMut(&str) -> Result<Option<S>, String>,
) -> Result<Vec<Case<S>>, String> {
    let mut cases: Vec<Case<S>> = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let no = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix("== ") {
            let name = name.trim().to_string();
            if name.is_empty() || name.contains(char::is_whitespace) {
                return Err(format!("line {no}: bad case name {name:?}"));
            }
            if cases.iter().any(|c| c.name == name) {
                return Err(format!("line {no}: duplicate case name {name:?}"));
            }
            cases.push(Case {
                name,
                line: no,
                steps: Vec::new(),
                memkeep_only: false,
            });
            continue;
        }
        if file_line(line, cases.is_empty()).map_err(|e| format!("line {no}: {e}"))? {
            continue;
        }
        let case = cases
            .last_mut()
            .ok_or_else(|| format!("line {no}: {line:?} before the first `== case`"))?;
        match step(line).map_err(|e| format!("line {no}: {e}"))? {
            Some(step) => case.steps.push(Line { no, step }),
            None => case.memkeep_only = true,
        }
    }
    Ok(cases)
}

/// `proto/<dir>/*.txt`, sorted.
pub fn proto_files(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("proto")
        .join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("read proto dir").path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    files
}

pub fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------------------------
// Run settings (environment)

/// What the cases run against: `MEMKEEP_CONFORMANCE` unset or empty, `memcached` or `redis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Memkeep,
    Memcached,
    Redis,
}

pub fn target() -> Target {
    match std::env::var("MEMKEEP_CONFORMANCE").as_deref() {
        Err(_) | Ok("") => Target::Memkeep,
        Ok("memcached") => Target::Memcached,
        Ok("redis") => Target::Redis,
        Ok(other) => panic!("MEMKEEP_CONFORMANCE={other:?}: expected `memcached` or `redis`"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Requests batched into one write (see `run`).
    Whole,
    /// One write per request line.
    Line,
    /// One byte per write.
    Byte,
}

/// All three, or those `MEMKEEP_TRANSCRIPT_MODES=whole,line,byte` lists.
pub fn modes() -> Vec<Mode> {
    match std::env::var("MEMKEEP_TRANSCRIPT_MODES") {
        Err(_) => vec![Mode::Whole, Mode::Line, Mode::Byte],
        Ok(list) => list
            .split(',')
            .map(|m| match m.trim() {
                "whole" => Mode::Whole,
                "line" => Mode::Line,
                "byte" => Mode::Byte,
                other => panic!("MEMKEEP_TRANSCRIPT_MODES: unknown mode {other:?}"),
            })
            .collect(),
    }
}

/// `MEMKEEP_TRANSCRIPT_FILTER`: a substring of `file/case` (file with or without `.txt`).
pub struct Filter(String);

impl Filter {
    pub fn from_env() -> Filter {
        Filter(std::env::var("MEMKEEP_TRANSCRIPT_FILTER").unwrap_or_default())
    }

    pub fn selects(&self, file: &str, case: &str) -> bool {
        let stem = file.strip_suffix(".txt").unwrap_or(file);
        format!("{stem}/{case}").contains(&self.0) || format!("{file}/{case}").contains(&self.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Connection

/// Why a read stopped short.
pub enum Short {
    Closed,
    TimedOut,
    Error(String),
}

/// What a reader returns: the bytes read, or those that came before it stopped and why.
pub type Reply = Result<Vec<u8>, (Vec<u8>, Short)>;

impl Short {
    pub fn describe(&self) -> String {
        match self {
            Short::Closed => "the server closed the connection".into(),
            Short::TimedOut => "no reply within 2 s".into(),
            Short::Error(e) => format!("read error: {e}"),
        }
    }
}

/// A replay connection: writes split per `Mode`, reads buffered (each read bounded by the
/// harness's 2 s timeout). The test files add their own readers (`impl Conn`).
pub struct Conn {
    pub stream: TcpStream,
    /// Received, not yet consumed.
    pub buf: Vec<u8>,
    /// The first write error; later writes are dropped and later expectations report it.
    pub write_err: Option<String>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Result<Conn, String> {
        let stream = Server::connect_to(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
            write_err: None,
        })
    }

    pub fn send(&mut self, bytes: &[u8], mode: Mode) {
        if self.write_err.is_some() || bytes.is_empty() {
            return;
        }
        // One byte per write, except very large payloads (`>repeat`), which go 4 KiB at a time.
        let chunk = match mode {
            Mode::Byte if bytes.len() <= 64 * 1024 => 1,
            Mode::Byte => 4096,
            _ => bytes.len(),
        };
        for piece in bytes.chunks(chunk) {
            if let Err(e) = self.stream.write_all(piece) {
                self.write_err = Some(e.to_string());
                return;
            }
        }
    }

    /// One read into `buf`.
    pub fn fill(&mut self) -> Result<(), Short> {
        let mut tmp = [0u8; 64 * 1024];
        loop {
            return match self.stream.read(&mut tmp) {
                Ok(0) => Err(Short::Closed),
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    Ok(())
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    Err(Short::TimedOut)
                }
                Err(e)
                    if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) =>
                {
                    Err(Short::Closed)
                }
                Err(e) => Err(Short::Error(e.to_string())),
            };
        }
    }

    /// `@ closed`: nothing more arrives and the server closes. `show` renders unexpected bytes.
    pub fn expect_closed(&mut self, show: fn(&[u8]) -> String) -> Result<(), String> {
        if !self.buf.is_empty() {
            return Err(format!(
                "expected the connection to close, got {}",
                show(&self.buf)
            ));
        }
        match self.fill() {
            Err(Short::Closed) => Ok(()),
            Err(why) => Err(format!(
                "expected the connection to close, got {}",
                why.describe()
            )),
            Ok(()) => Err(format!(
                "expected the connection to close, got {}",
                show(&self.buf)
            )),
        }
    }

    pub fn write_note(&self) -> String {
        match &self.write_err {
            Some(e) => format!(" (an earlier write failed: {e})"),
            None => String::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Replaying a case

/// Values captured from replies, by name.
pub type Vars = HashMap<String, Vec<u8>>;

/// A failed step: its line number and what went wrong.
pub type Fail = (usize, String);

/// A test file's replay state for one case on one connection.
pub trait Replayer {
    type Step: ReplayStep;
    fn mode(&self) -> Mode;
    fn conn(&mut self) -> &mut Conn;
    /// The bytes of a `Role::Send` step, with the values captured so far.
    fn render(&self, step: &Self::Step) -> Result<Vec<u8>, String>;
    /// Check a `Role::Expect` step against what the server sends.
    fn expect(&mut self, step: &Self::Step) -> Result<(), String>;
    /// Carry out a `Role::Directive` step.
    fn directive(&mut self, step: &Self::Step) -> Result<(), String>;
    /// After the case: the connection is still in sync (see `check_in_sync`).
    fn check_in_sync(&mut self) -> Result<(), String>;
}

/// Replay one case; the connection must be in sync at the end unless the case closes it.
pub fn run<R: Replayer>(r: &mut R, case: &Case<R::Step>) -> Result<(), Fail> {
    match r.mode() {
        Mode::Whole => run_whole(r, case)?,
        mode @ (Mode::Line | Mode::Byte) => {
            for l in &case.steps {
                let at = |e| (l.no, e);
                match l.step.role() {
                    Role::Send { .. } => {
                        let bytes = r.render(&l.step).map_err(at)?;
                        r.conn().send(&bytes, mode);
                    }
                    Role::Directive => r.directive(&l.step).map_err(at)?,
                    Role::Expect => r.expect(&l.step).map_err(at)?,
                }
            }
        }
    }
    if case.ends_closed() {
        return Ok(());
    }
    r.check_in_sync()
        .map_err(|e| (case.steps.last().map_or(case.line, |l| l.no), e))
}

/// All requests in one write, up to the first that needs a reply to be read first (it uses a
/// captured value) or a directive; then the replies; and so on.
fn run_whole<R: Replayer>(r: &mut R, case: &Case<R::Step>) -> Result<(), Fail> {
    let mut out: Vec<u8> = Vec::new();
    let mut deferred: Vec<&Line<R::Step>> = Vec::new();
    for l in &case.steps {
        match l.step.role() {
            Role::Send { uses_var } => {
                if uses_var && !deferred.is_empty() {
                    flush(r, &mut out, &mut deferred)?;
                }
                out.extend(r.render(&l.step).map_err(|e| (l.no, e))?);
            }
            Role::Directive => {
                flush(r, &mut out, &mut deferred)?;
                r.directive(&l.step).map_err(|e| (l.no, e))?;
            }
            Role::Expect => deferred.push(l),
        }
    }
    flush(r, &mut out, &mut deferred)
}

fn flush<R: Replayer>(
    r: &mut R,
    out: &mut Vec<u8>,
    deferred: &mut Vec<&Line<R::Step>>,
) -> Result<(), Fail> {
    r.conn().send(out, Mode::Whole);
    out.clear();
    for l in deferred.drain(..) {
        r.expect(&l.step).map_err(|e| (l.no, e))?;
    }
    Ok(())
}

/// The request sent after each case to check the connection is in sync.
pub struct Probe<'a> {
    pub request: &'a [u8],
    /// How failure messages name it.
    pub name: &'a str,
    /// Reads one reply (a line, a packet), or what came before the read stopped.
    pub read: fn(&mut Conn) -> Reply,
    /// Whether a reply is the probe's answer.
    pub answered: fn(&[u8]) -> bool,
    /// Renders received bytes in failure messages.
    pub show: fn(&[u8]) -> String,
}

/// The probe must get its own answer next: no reply was missing, none extra.
pub fn check_in_sync(conn: &mut Conn, probe: &Probe) -> Result<(), String> {
    conn.send(probe.request, Mode::Whole);
    match (probe.read)(conn) {
        Ok(got) if (probe.answered)(&got) => Ok(()),
        Ok(got) => Err(format!(
            "out of sync after the case: {} answered {}{}",
            probe.name,
            (probe.show)(&got),
            if conn.buf.is_empty() {
                String::new()
            } else {
                format!("; then {}", (probe.show)(&conn.buf))
            }
        )),
        Err((partial, why)) => Err(format!(
            "out of sync after the case: {} answered {} and then {}{}",
            probe.name,
            (probe.show)(&partial),
            why.describe(),
            conn.write_note()
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Files, threads, report

/// Replay `cases` of `file` in every mode (`modes()`) against `server`; `replay` runs one case
/// on a fresh connection. Returns the failures; stops when the server dies or after
/// `max_failures`.
pub fn replay_cases<S>(
    file: &str,
    server: &mut Server,
    cases: &[&Case<S>],
    max_failures: usize,
    mut replay: impl FnMut(&mut Server, Mode, &Case<S>) -> Result<(), Fail>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for mode in modes() {
        for case in cases {
            if let Err((line, msg)) = replay(server, mode, case) {
                failures.push(format!(
                    "{file}:{line}: case `{}` ({mode:?}): {msg}",
                    case.name
                ));
                if failures.len() >= max_failures {
                    failures.push(format!("{file}: stopped after {max_failures} failures"));
                    return failures;
                }
            }
            if !server.is_running() {
                failures.push(format!(
                    "{file}: the server died during case `{}` ({mode:?}); stderr:\n{}",
                    case.name,
                    server.stderr_tail(3000)
                ));
                return failures;
            }
        }
    }
    failures
}

/// `replay` for every item, each on its own thread; all failures in item order, a panic
/// counted as one failure of that item.
pub fn in_parallel<T: Sync>(
    items: &[T],
    name: impl Fn(&T) -> String,
    replay: impl Fn(&T) -> Vec<String> + Sync,
) -> Vec<String> {
    let replay = &replay;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .iter()
            .map(|item| (name(item), s.spawn(move || replay(item))))
            .collect();
        handles
            .into_iter()
            .flat_map(|(name, h)| {
                h.join().unwrap_or_else(|panic| {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    vec![format!("{name}: panicked: {msg}")]
                })
            })
            .collect()
    })
}

/// Panic with `"<n> <title>:"` and the first 60 failures, if there are any.
pub fn report(title: &str, failures: &[String]) {
    if failures.is_empty() {
        return;
    }
    const SHOW: usize = 60;
    let mut text = format!("{} {title}:\n", failures.len());
    for f in failures.iter().take(SHOW) {
        text.push_str(&format!("  {f}\n"));
    }
    if failures.len() > SHOW {
        text.push_str(&format!("  ... and {} more\n", failures.len() - SHOW));
    }
    panic!("{text}");
}
