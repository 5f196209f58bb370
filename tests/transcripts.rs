//! Golden transcript replay (format: proto/README.md).
//!
//! Every case of every `proto/memcache/*.txt` (and `proto/resp/*.txt`) is replayed three ways
//! against one server per file: whole (the case's requests in one write), line by line (one
//! write per `>` line) and one byte per write. After each case the harness checks the
//! connection is still in sync (`version` / `PING` answers next). Failures name the file, line,
//! case and mode, with expected and received bytes escaped.
//!
//! `MEMKEEP_CONFORMANCE=memcached` replays the memcache goldens against real memcached instead
//! (`MEMKEEP_CONFORMANCE=redis`: the RESP goldens against redis-server), skipping cases that
//! use `@ time`, `@ restart` or `@ memkeep-only`: that is how the goldens themselves are checked.
//! `MEMKEEP_TRANSCRIPT_FILTER=<substring of "file/case">` and
//! `MEMKEEP_TRANSCRIPT_MODES=whole,line,byte` narrow a run while debugging.
//!
//! The connection, the per-case driver (whole/line/byte, in-sync probe) and the file, thread and
//! environment handling are shared with `tests/binary_vectors.rs` in `tests/common/replay.rs`.

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::replay::{
    self, Conn, Filter, Mode, Probe, ReplayStep, Replayer, Reply, Role, Target, Vars, file_name,
    in_parallel, memkeep_bin, parse_cases, proto_files, replay_cases, report, target,
};
use common::{Options, Server};
use regex::bytes::Regex;

// ---------------------------------------------------------------------------------------------
// Transcript model and parser

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    /// proto/memcache: `> line` is sent as typed plus `\r\n`.
    Memcache,
    /// proto/resp: `> SET k v` is sent as a RESP array of bulk strings, `>inline PING` as typed.
    Resp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enc {
    /// The text plus `\r\n`.
    Line,
    /// The bytes as they are.
    Raw,
    /// Split on spaces, sent as a RESP array of bulk strings.
    Resp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone)]
enum Step {
    /// Send `data` (after `${var}` substitution and encoding) `repeat` times.
    Send {
        data: Vec<u8>,
        enc: Enc,
        repeat: usize,
    },
    /// `< text`: one line, `text` plus `\r\n`.
    ExpectLine(Vec<u8>),
    /// `<raw` / `<repeat`: exactly these bytes, `repeat` times.
    ExpectRaw { data: Vec<u8>, repeat: usize },
    /// `<~ regex`: one line whose text (without `\r\n`) matches the whole regex.
    ExpectRegex(String),
    /// `<~lf regex`: the same, for a line ending in a bare `\n` (memcached's metadump lines).
    ExpectRegexLf(String),
    /// `<...`: discard lines until one matches the next line expectation.
    Skip,
    /// `@ time +N`
    Time(u64),
    /// `@ restart`
    Restart,
    /// `@ closed`
    Closed,
    /// `@ assert A OP B`
    Assert { lhs: String, op: Op, rhs: String },
}

type Case = replay::Case<Step>;

impl ReplayStep for Step {
    fn role(&self) -> Role {
        match self {
            Step::Send { data, .. } => Role::Send {
                uses_var: data.windows(2).any(|w| w == b"${"),
            },
            Step::Time(_) | Step::Restart | Step::Assert { .. } => Role::Directive,
            _ => Role::Expect,
        }
    }

    fn is_closed(&self) -> bool {
        matches!(self, Step::Closed)
    }
}

impl Case {
    fn uses_time(&self) -> bool {
        self.steps.iter().any(|l| matches!(l.step, Step::Time(_)))
    }
    fn uses_restart(&self) -> bool {
        self.steps.iter().any(|l| matches!(l.step, Step::Restart))
    }
}

/// `\r \n \\ \xNN` escapes; any other backslash is an error.
fn unescape(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        match b.get(i + 1) {
            Some(b'r') => out.push(b'\r'),
            Some(b'n') => out.push(b'\n'),
            Some(b'\\') => out.push(b'\\'),
            Some(b'x') => {
                let hex = s
                    .get(i + 2..i + 4)
                    .ok_or_else(|| format!("truncated \\x escape in {s:?}"))?;
                out.push(
                    u8::from_str_radix(hex, 16).map_err(|_| format!("bad \\x escape {hex:?}"))?,
                );
                i += 2;
            }
            other => {
                return Err(format!(
                    "unknown escape \\{} in {s:?}",
                    other.map(|&c| c as char).unwrap_or(' ')
                ));
            }
        }
        i += 2;
    }
    Ok(out)
}

/// Bytes as readable text: printable ASCII as is, the rest escaped, long input shortened.
fn show(b: &[u8]) -> String {
    show_n(b, 300)
}

fn show_n(b: &[u8], max: usize) -> String {
    let mut s = String::from("\"");
    for &c in b.iter().take(max) {
        match c {
            b'\r' => s.push_str("\\r"),
            b'\n' => s.push_str("\\n"),
            b'\\' => s.push_str("\\\\"),
            b'"' => s.push_str("\\\""),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push('"');
    if b.len() > max {
        s.push_str(&format!("... ({} bytes in all)", b.len()));
    }
    s
}

/// If `line` is `prefix` alone or `prefix` followed by a space, the text after that space.
fn directive<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(prefix)?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix(' ')
    }
}

fn parse_repeat(rest: &str) -> Result<(usize, Vec<u8>), String> {
    let (n, unit) = rest.split_once(' ').ok_or("expected `N text`")?;
    let n: usize = n.parse().map_err(|_| format!("bad repeat count {n:?}"))?;
    let unit = unescape(unit)?;
    if unit.is_empty() {
        return Err("empty repeat unit".into());
    }
    Ok((n, unit))
}

fn parse_op(s: &str) -> Result<Op, String> {
    Ok(match s {
        "==" => Op::Eq,
        "!=" => Op::Ne,
        "<" => Op::Lt,
        "<=" => Op::Le,
        ">" => Op::Gt,
        ">=" => Op::Ge,
        _ => return Err(format!("unknown operator {s:?}")),
    })
}

fn parse_step(line: &str, dialect: Dialect) -> Result<Option<Step>, String> {
    let send = if dialect == Dialect::Resp {
        Enc::Resp
    } else {
        Enc::Line
    };
    let step = if let Some(rest) = directive(line, ">raw") {
        Step::Send {
            data: unescape(rest)?,
            enc: Enc::Raw,
            repeat: 1,
        }
    } else if let Some(rest) = directive(line, ">repeat") {
        let (repeat, data) = parse_repeat(rest)?;
        Step::Send {
            data,
            enc: Enc::Raw,
            repeat,
        }
    } else if let (Dialect::Resp, Some(rest)) = (dialect, directive(line, ">inline")) {
        Step::Send {
            data: rest.as_bytes().to_vec(),
            enc: Enc::Line,
            repeat: 1,
        }
    } else if let Some(rest) = directive(line, ">") {
        Step::Send {
            data: rest.as_bytes().to_vec(),
            enc: send,
            repeat: 1,
        }
    } else if let Some(rest) = directive(line, "<raw") {
        Step::ExpectRaw {
            data: unescape(rest)?,
            repeat: 1,
        }
    } else if let Some(rest) = directive(line, "<repeat") {
        let (repeat, data) = parse_repeat(rest)?;
        Step::ExpectRaw { data, repeat }
    } else if let Some(rest) = directive(line, "<~lf") {
        Regex::new(&format!("^(?:{rest})$")).map_err(|e| format!("bad regex: {e}"))?;
        Step::ExpectRegexLf(rest.to_string())
    } else if let Some(rest) = directive(line, "<~") {
        Regex::new(&format!("^(?:{rest})$")).map_err(|e| format!("bad regex: {e}"))?;
        Step::ExpectRegex(rest.to_string())
    } else if line == "<..." {
        Step::Skip
    } else if let Some(rest) = directive(line, "<") {
        Step::ExpectLine(rest.as_bytes().to_vec())
    } else if let Some(rest) = line.strip_prefix("@ ") {
        let words: Vec<&str> = rest.split_whitespace().collect();
        match words.as_slice() {
            ["time", n] => {
                let n = n.strip_prefix('+').ok_or("expected `@ time +N`")?;
                Step::Time(n.parse().map_err(|_| format!("bad seconds {n:?}"))?)
            }
            ["restart"] => Step::Restart,
            ["closed"] => Step::Closed,
            ["assert", a, op, b] => Step::Assert {
                lhs: a.to_string(),
                op: parse_op(op)?,
                rhs: b.to_string(),
            },
            ["memkeep-only"] => return Ok(None),
            _ => return Err(format!("unknown directive {line:?}")),
        }
    } else {
        return Err(format!("unrecognised line {line:?}"));
    };
    Ok(Some(step))
}

fn parse_transcript(text: &str, dialect: Dialect) -> Result<Vec<Case>, String> {
    let cases = parse_cases(text, |_, _| Ok(false), |line| parse_step(line, dialect))?;
    for case in &cases {
        let at = |no: usize, msg: &str| format!("line {no}: case {:?}: {msg}", case.name);
        if !case
            .steps
            .iter()
            .any(|l| matches!(l.step, Step::Send { .. }))
        {
            return Err(at(case.line, "sends nothing"));
        }
        for (i, l) in case.steps.iter().enumerate() {
            match l.step {
                Step::Skip => match case.steps.get(i + 1).map(|n| &n.step) {
                    Some(Step::ExpectLine(_) | Step::ExpectRegex(_) | Step::ExpectRegexLf(_)) => {}
                    _ => return Err(at(l.no, "`<...` must be followed by a `<` or `<~` line")),
                },
                Step::Closed if i + 1 != case.steps.len() => {
                    return Err(at(l.no, "`@ closed` must end the case"));
                }
                _ => {}
            }
        }
    }
    Ok(cases)
}

// ---------------------------------------------------------------------------------------------
// Replay

/// Replace every `${name}` by the captured value, passed through `quote` (regex escaping).
fn subst(template: &[u8], vars: &Vars, quote: fn(&[u8]) -> Vec<u8>) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(template.len());
    let mut i = 0;
    while i < template.len() {
        if template[i..].starts_with(b"${") {
            let end = template[i..]
                .iter()
                .position(|&c| c == b'}')
                .ok_or("unterminated ${")?
                + i;
            let name = String::from_utf8_lossy(&template[i + 2..end]).into_owned();
            let value = vars
                .get(&name)
                .ok_or_else(|| format!("${{{name}}} was never captured"))?;
            out.extend(quote(value));
            i = end + 1;
        } else {
            out.push(template[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn verbatim(b: &[u8]) -> Vec<u8> {
    b.to_vec()
}

fn regex_quote(b: &[u8]) -> Vec<u8> {
    regex::escape(&String::from_utf8_lossy(b)).into_bytes()
}

fn encode(data: &[u8], enc: Enc) -> Vec<u8> {
    match enc {
        Enc::Raw => data.to_vec(),
        Enc::Line => [data, b"\r\n"].concat(),
        Enc::Resp => {
            let args: Vec<&[u8]> = data
                .split(|&c| c == b' ')
                .filter(|a| !a.is_empty())
                .collect();
            let mut out = format!("*{}\r\n", args.len()).into_bytes();
            for a in args {
                out.extend(format!("${}\r\n", a.len()).into_bytes());
                out.extend(a);
                out.extend(b"\r\n");
            }
            out
        }
    }
}

/// The text readers of the shared replay connection.
impl Conn {
    /// One line including its `\n`, or the first `max` bytes if no `\n` comes before that.
    fn read_line(&mut self, max: usize) -> Reply {
        let mut scanned = 0;
        loop {
            if let Some(p) = self.buf[scanned..].iter().position(|&c| c == b'\n') {
                let end = (scanned + p + 1).min(max);
                return Ok(self.buf.drain(..end).collect());
            }
            scanned = self.buf.len();
            if self.buf.len() >= max {
                return Ok(self.buf.drain(..max).collect());
            }
            if let Err(e) = self.fill() {
                return Err((std::mem::take(&mut self.buf), e));
            }
        }
    }

    fn read_exact(&mut self, n: usize) -> Reply {
        while self.buf.len() < n {
            if let Err(e) = self.fill() {
                return Err((std::mem::take(&mut self.buf), e));
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// What came after the bytes just compared, for context in failure messages.
    fn pending(&self) -> String {
        if self.buf.is_empty() {
            String::new()
        } else {
            format!("; then {}", show_n(&self.buf, 100))
        }
    }
}

/// Where the replay is in a case, and what it has learnt from the replies.
struct Replay<'a> {
    server: &'a mut Server,
    dialect: Dialect,
    mode: Mode,
    conn: Conn,
    vars: Vars,
    /// `<...` seen: the next line expectation may skip lines.
    skipping: bool,
}

impl Replay<'_> {
    fn addr(&self) -> SocketAddr {
        match self.dialect {
            Dialect::Memcache => self.server.addr(),
            Dialect::Resp => self.server.resp_addr().expect("server has no RESP port"),
        }
    }

    fn line_matches(&mut self, step: &Step, got: &[u8]) -> Result<bool, String> {
        match step {
            Step::ExpectLine(t) => {
                let want = [subst(t, &self.vars, verbatim)?, b"\r\n".to_vec()].concat();
                Ok(got == want.as_slice())
            }
            Step::ExpectRegex(re) | Step::ExpectRegexLf(re) => {
                let re = String::from_utf8(subst(re.as_bytes(), &self.vars, regex_quote)?).unwrap();
                let re = Regex::new(&format!("^(?:{re})$")).map_err(|e| e.to_string())?;
                let end: &[u8] = if matches!(step, Step::ExpectRegexLf(_)) {
                    b"\n"
                } else {
                    b"\r\n"
                };
                let Some(text) = got.strip_suffix(end) else {
                    return Ok(false);
                };
                if end == b"\n" && text.ends_with(b"\r") {
                    return Ok(false);
                }
                let Some(caps) = re.captures(text) else {
                    return Ok(false);
                };
                for name in re.capture_names().flatten() {
                    if let Some(m) = caps.name(name) {
                        self.vars.insert(name.to_string(), m.as_bytes().to_vec());
                    }
                }
                Ok(true)
            }
            _ => unreachable!(),
        }
    }

    fn describe_want(&self, step: &Step) -> String {
        match step {
            Step::ExpectLine(t) => {
                let t = subst(t, &self.vars, verbatim).unwrap_or_else(|_| t.clone());
                show(&[t, b"\r\n".to_vec()].concat())
            }
            Step::ExpectRegex(re) => format!("a line matching /{re}/"),
            Step::ExpectRegexLf(re) => format!("a line matching /{re}/ ending in a bare \\n"),
            _ => unreachable!(),
        }
    }

    fn number(&self, operand: &str) -> Result<u128, String> {
        let text = if operand.starts_with("${") {
            String::from_utf8_lossy(&subst(operand.as_bytes(), &self.vars, verbatim)?).into_owned()
        } else {
            operand.to_string()
        };
        text.trim()
            .parse()
            .map_err(|_| format!("{operand} = {text:?} is not a number"))
    }
}

impl Replayer for Replay<'_> {
    type Step = Step;

    fn mode(&self) -> Mode {
        self.mode
    }

    fn conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    fn render(&self, step: &Step) -> Result<Vec<u8>, String> {
        let Step::Send { data, enc, repeat } = step else {
            unreachable!()
        };
        let one = encode(&subst(data, &self.vars, verbatim)?, *enc);
        Ok(one.repeat(*repeat))
    }

    /// Check one reply-side step against what the server sends.
    fn expect(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::Skip => {
                self.skipping = true;
                Ok(())
            }
            Step::ExpectLine(_) | Step::ExpectRegex(_) | Step::ExpectRegexLf(_) => {
                let max = match step {
                    Step::ExpectLine(t) => t.len() + 4096,
                    _ => 4 << 20,
                };
                let mut skipped: Vec<Vec<u8>> = Vec::new();
                loop {
                    let got = match self.conn.read_line(max) {
                        Ok(got) => got,
                        Err((partial, why)) => {
                            let skipped = if skipped.is_empty() {
                                String::new()
                            } else {
                                format!(
                                    " (skipped {} lines, the last {})",
                                    skipped.len(),
                                    show(skipped.last().unwrap())
                                )
                            };
                            return Err(format!(
                                "expected {}, got {} and then {}{skipped}{}",
                                self.describe_want(step),
                                show(&partial),
                                why.describe(),
                                self.conn.write_note()
                            ));
                        }
                    };
                    if self.line_matches(step, &got)? {
                        self.skipping = false;
                        return Ok(());
                    }
                    if !self.skipping {
                        return Err(format!(
                            "expected {}, got {}{}",
                            self.describe_want(step),
                            show(&got),
                            self.conn.pending()
                        ));
                    }
                    skipped.push(got);
                }
            }
            Step::ExpectRaw { data, repeat } => {
                let one = subst(data, &self.vars, verbatim)?;
                let want = one.repeat(*repeat);
                match self.conn.read_exact(want.len()) {
                    Ok(got) if got == want => Ok(()),
                    Ok(got) => {
                        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                        let from = at.saturating_sub(20);
                        Err(format!(
                            "expected {} bytes {}, they differ at byte {at}: expected {}, got {}",
                            want.len(),
                            show(&want),
                            show(&want[from..]),
                            show(&got[from..])
                        ))
                    }
                    Err((partial, why)) => Err(format!(
                        "expected {}, got {} and then {}{}",
                        show(&want),
                        show(&partial),
                        why.describe(),
                        self.conn.write_note()
                    )),
                }
            }
            Step::Closed => self.conn.expect_closed(show),
            _ => unreachable!(),
        }
    }

    fn directive(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::Time(secs) => self.server.advance_clock(*secs),
            Step::Restart => {
                self.server.restart();
                self.conn = Conn::open(self.addr())?;
                Ok(())
            }
            Step::Assert { lhs, op, rhs } => {
                let (a, b) = (self.number(lhs)?, self.number(rhs)?);
                let ok = match op {
                    Op::Eq => a == b,
                    Op::Ne => a != b,
                    Op::Lt => a < b,
                    Op::Le => a <= b,
                    Op::Gt => a > b,
                    Op::Ge => a >= b,
                };
                if ok {
                    Ok(())
                } else {
                    Err(format!("assertion failed: {lhs} = {a}, {rhs} = {b}"))
                }
            }
            _ => unreachable!(),
        }
    }

    /// `version` (RESP: `PING`) must be answered next.
    fn check_in_sync(&mut self) -> Result<(), String> {
        type LineCheck = fn(&[u8]) -> bool;
        let (request, answered): (&[u8], LineCheck) = match self.dialect {
            Dialect::Memcache => (b"version\r\n", |l| {
                l.starts_with(b"VERSION ") && l.ends_with(b"\r\n")
            }),
            Dialect::Resp => (b"*1\r\n$4\r\nPING\r\n", |l| l == b"+PONG\r\n"),
        };
        let probe = Probe {
            request,
            name: &show(request),
            read: |conn| conn.read_line(4096),
            answered,
            show,
        };
        replay::check_in_sync(&mut self.conn, &probe)
    }
}

// ---------------------------------------------------------------------------------------------
// Driver

fn load(path: &Path, dialect: Dialect) -> Result<Vec<Case>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_transcript(&text, dialect).map_err(|e| format!("{}: {e}", path.display()))
}

/// Replay one file against a fresh server; returns the failures.
fn replay_file(path: &Path, dialect: Dialect, target: Target) -> Vec<String> {
    let file = file_name(path);
    let cases = match load(path, dialect) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let filter = Filter::from_env();
    let selected: Vec<&Case> = cases
        .iter()
        .filter(|c| {
            target == Target::Memkeep || !(c.memkeep_only || c.uses_time() || c.uses_restart())
        })
        .filter(|c| filter.selects(&file, &c.name))
        .collect();
    if selected.is_empty() {
        return Vec::new();
    }
    let mut server = match target {
        Target::Memkeep => {
            let clock = selected.iter().any(|c| c.uses_time()).then(common::now_ms);
            let opts = Options {
                debug_clock_ms: clock,
                resp: dialect == Dialect::Resp,
                ..Options::default()
            };
            Server::start_with(memkeep_bin(), opts)
        }
        Target::Memcached => Server::memcached(),
        Target::Redis => Server::redis(),
    };
    let skipped = cases.len() - selected.len();
    eprintln!(
        "{file}: replaying {} cases ({skipped} skipped) against {target:?}",
        selected.len()
    );
    replay_cases(
        &file,
        &mut server,
        &selected,
        usize::MAX,
        |server, mode, case| {
            let addr = match dialect {
                Dialect::Memcache => server.addr(),
                Dialect::Resp => server.resp_addr().expect("RESP port"),
            };
            let conn = Conn::open(addr).map_err(|e| (case.line, e))?;
            let mut replay = Replay {
                server,
                dialect,
                mode,
                conn,
                vars: Vars::new(),
                skipping: false,
            };
            replay::run(&mut replay, case)
        },
    )
}

/// Replay every file of `proto/<dir>` in parallel (one server per file) and fail with a summary.
fn replay_dir(dir: &str, dialect: Dialect, target: Target) {
    let failures = in_parallel(
        &proto_files(dir),
        |path| file_name(path),
        |path| replay_file(path, dialect, target),
    );
    report(
        &format!("transcript failures ({dir}, against {target:?})"),
        &failures,
    );
}

#[test]
fn transcripts_parse() {
    let mut errors = Vec::new();
    let mut count = 0;
    for (dir, dialect) in [("memcache", Dialect::Memcache), ("resp", Dialect::Resp)] {
        for path in proto_files(dir) {
            match load(&path, dialect) {
                Ok(cases) if cases.is_empty() => {
                    errors.push(format!("{}: no cases", path.display()))
                }
                Ok(cases) => count += cases.len(),
                Err(e) => errors.push(e),
            }
        }
    }
    assert!(
        errors.is_empty(),
        "transcript syntax errors:\n{}",
        errors.join("\n")
    );
    assert!(count > 0, "no transcripts found under proto/");
}

#[test]
fn memcache_transcripts() {
    let target = target();
    if target == Target::Redis {
        return;
    }
    replay_dir("memcache", Dialect::Memcache, target);
}

#[test]
fn resp_transcripts() {
    let target = target();
    if target == Target::Memcached {
        return;
    }
    replay_dir("resp", Dialect::Resp, target);
}

#[test]
fn format_helpers() {
    assert_eq!(unescape(r"a\r\n\\\x00\x7f").unwrap(), b"a\r\n\\\x00\x7f");
    assert!(unescape(r"\q").is_err());
    assert_eq!(
        encode(b"SET k  v", Enc::Resp),
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
    );
    let mut vars = Vars::new();
    vars.insert("cas".into(), b"42".to_vec());
    assert_eq!(
        subst(b"cas k 0 0 1 ${cas}", &vars, verbatim).unwrap(),
        b"cas k 0 0 1 42"
    );
    assert!(subst(b"${nope}", &vars, verbatim).is_err());
    let cases = parse_transcript(
        "== a\n> get k\n<...\n<~ END\n== b\n@ memkeep-only\n>raw x\n@ closed\n",
        Dialect::Memcache,
    )
    .unwrap();
    assert_eq!(cases.len(), 2);
    assert!(cases[1].memkeep_only);
    assert!(parse_transcript("== a\n> x\n@ closed\n> y\n", Dialect::Memcache).is_err());
    assert!(parse_transcript("== a\n> x\n<...\n@ closed\n", Dialect::Memcache).is_err());
}
