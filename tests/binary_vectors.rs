//! memcached binary protocol golden vectors (format: proto/README.md, "Binary vectors").
//!
//! `proto/binary/*.txt` are hex transcripts: requests to send and the response packets to
//! expect. Two checks use them:
//!
//! - **parser check** (always): every case's request bytes go through
//!   `memkeep::protocol::binary::parse` and must come out as complete requests, each using
//!   exactly its bytes, or as error frames whose encoded reply is one the case expects; a case
//!   that ends `@ closed` must end in a frame that closes. Every expected `Invalid arguments`
//!   and (non-SASL) `Unknown command` reply must have come from the parser, every `Too large.`
//!   from a `TooLarge` request.
//! - **replay**: every case against a server, three ways (whole, line by line, one byte per
//!   write), then a `VERSION` probe that must be answered next. `MEMKEEP_CONFORMANCE=memcached`
//!   replays against real memcached (skipping `@ memkeep-only` cases; the `@ auth` file needs
//!   `saslpasswd2` from sasl2-bin and is skipped without it); by default against memkeep.
//!
//! `MEMKEEP_TRANSCRIPT_FILTER=<substring of "file/case">` and
//! `MEMKEEP_TRANSCRIPT_MODES=whole,line,byte` narrow a run, as for the text transcripts.
//!
//! The replay machinery is shared with `tests/transcripts.rs` (`tests/common/replay.rs`).

mod common;

use std::collections::HashMap;

use common::replay::{
    self, Conn, Filter, Mode, Probe, ReplayStep, Replayer, Reply, Role, Short, Target, Vars,
    file_name, in_parallel, memkeep_bin, parse_cases, proto_files, replay_cases, report, target,
};
use common::{Options, Server};
use memkeep::protocol::binary::{self, Command, Frame, HEADER_LEN};
use memkeep::protocol::memcache::Limits;

/// Opaque of the `VERSION` probe sent after each case.
const PROBE_OPAQUE: u32 = 0x5eed_0b0b;

/// Most packets one `<...` may skip.
const SKIP_MAX: usize = 10_000;

/// Failures after which a file's replay stops (a server that does not speak binary at all
/// would otherwise cost 2 s per case and mode).
const FILE_FAILURES_MAX: usize = 20;

/// Largest response body the harness accepts.
const BODY_MAX: usize = 16 << 20;

// ---------------------------------------------------------------------------------------------
// Vector model and parser

/// One piece of a `>` or `<` line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// Hex bytes or a `"text"` literal.
    Bytes(Vec<u8>),
    /// `..` per byte: any byte (`<` only).
    Any(usize),
    /// `(name)` (8 bytes) or `(name:N)`: capture these bytes as `${name}` (`<` only).
    Capture(String, usize),
    /// `${name}`: the captured bytes.
    Var(String),
    /// `*`: any number of further bytes up to the end of the packet (`<` only, last).
    Rest,
}

#[derive(Debug, Clone)]
enum Step {
    /// `>` / `>repeat N`: send these bytes `repeat` times.
    Send { toks: Vec<Tok>, repeat: usize },
    /// `<`: one response packet matching the pattern.
    Expect(Vec<Tok>),
    /// `<...`: skip packets until one matches the next `<`.
    Skip,
    /// `@ closed`: the server closes the connection.
    Closed,
    /// `@ assert A == B` / `!=`: compare two byte strings (`${var}` or hex).
    Assert { lhs: Tok, eq: bool, rhs: Tok },
}

type Case = replay::Case<Step>;

impl ReplayStep for Step {
    fn role(&self) -> Role {
        match self {
            Step::Send { toks, .. } => Role::Send {
                uses_var: toks.iter().any(|t| matches!(t, Tok::Var(_))),
            },
            _ => Role::Expect,
        }
    }

    fn is_closed(&self) -> bool {
        matches!(self, Step::Closed)
    }
}

#[derive(Debug, Clone)]
struct VectorFile {
    name: String,
    /// `@ auth USER PASSWORD` before the first case: the server requires SASL authentication.
    auth: Option<(String, String)>,
    cases: Vec<Case>,
}

fn hex_digit(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// The bytes of a `"text"` literal starting at `s[0] == '"'`, and the length of the literal.
/// Escapes: `\"`, `\\`, `\r`, `\n`, `\0`, `\xNN`.
fn string_literal(s: &[u8]) -> Result<(Vec<u8>, usize), String> {
    let mut out = Vec::new();
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            b'"' => return Ok((out, i + 1)),
            b'\\' => {
                let c = *s.get(i + 1).ok_or("unterminated escape")?;
                match c {
                    b'"' | b'\\' => out.push(c),
                    b'r' => out.push(b'\r'),
                    b'n' => out.push(b'\n'),
                    b'0' => out.push(0),
                    b'x' => {
                        let (hi, lo) = (s.get(i + 2).copied(), s.get(i + 3).copied());
                        let byte = hi
                            .and_then(hex_digit)
                            .zip(lo.and_then(hex_digit))
                            .map(|(h, l)| h << 4 | l)
                            .ok_or("bad \\x escape")?;
                        out.push(byte);
                        i += 2;
                    }
                    _ => return Err(format!("unknown escape \\{}", c as char)),
                }
                i += 2;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Err("unterminated string".into())
}

/// Split a `>`/`<` line into tokens. Whitespace separates tokens and is otherwise ignored;
/// a run of hex digits must have an even length.
fn tokens(line: &str, expect: bool) -> Result<Vec<Tok>, String> {
    let s = line.as_bytes();
    let mut out: Vec<Tok> = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let start = i;
        let end_of_run = |pred: fn(u8) -> bool| {
            s[start..]
                .iter()
                .position(|&b| !pred(b))
                .map_or(s.len(), |p| start + p)
        };
        let tok = if c.is_ascii_whitespace() {
            i += 1;
            continue;
        } else if c == b'"' {
            let (bytes, len) = string_literal(&s[i..])?;
            i += len;
            Tok::Bytes(bytes)
        } else if s[i..].starts_with(b"${") {
            let end = s[i..]
                .iter()
                .position(|&b| b == b'}')
                .ok_or("unterminated ${")?
                + i;
            let name = line[i + 2..end].to_string();
            i = end + 1;
            Tok::Var(name)
        } else if c == b'(' && expect {
            let end = s[i..]
                .iter()
                .position(|&b| b == b')')
                .ok_or("unterminated (")?
                + i;
            let inner = &line[i + 1..end];
            i = end + 1;
            let (name, len) = match inner.split_once(':') {
                Some((n, l)) => (
                    n,
                    l.parse().map_err(|_| format!("bad length in ({inner})"))?,
                ),
                None => (inner, 8),
            };
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("bad capture name ({inner})"));
            }
            Tok::Capture(name.to_string(), len)
        } else if c == b'.' && expect {
            i = end_of_run(|b| b == b'.');
            if !(i - start).is_multiple_of(2) {
                return Err("`..` stands for one byte: use an even number of dots".into());
            }
            Tok::Any((i - start) / 2)
        } else if c == b'*' && expect {
            i += 1;
            Tok::Rest
        } else if hex_digit(c).is_some() {
            i = end_of_run(|b| b.is_ascii_hexdigit());
            let run = &s[start..i];
            if !run.len().is_multiple_of(2) {
                return Err(format!("odd number of hex digits in {:?}", &line[start..i]));
            }
            let bytes = run
                .chunks(2)
                .map(|p| hex_digit(p[0]).unwrap() << 4 | hex_digit(p[1]).unwrap())
                .collect();
            Tok::Bytes(bytes)
        } else {
            return Err(format!("unexpected {:?} at column {}", c as char, i + 1));
        };
        out.push(tok);
    }
    if out
        .iter()
        .position(|t| *t == Tok::Rest)
        .is_some_and(|p| p + 1 != out.len())
    {
        return Err("`*` must end the line".into());
    }
    Ok(out)
}

/// A hex string or `${var}` operand of `@ assert`.
fn operand(s: &str) -> Result<Tok, String> {
    match tokens(s, false)?.as_slice() {
        [t @ (Tok::Bytes(_) | Tok::Var(_))] => Ok(t.clone()),
        _ => Err(format!("bad assert operand {s:?}")),
    }
}

fn parse_step(line: &str) -> Result<Option<Step>, String> {
    let directive = |prefix: &str| {
        line.strip_prefix(prefix)
            .filter(|rest| rest.is_empty() || rest.starts_with(' '))
    };
    let step = if let Some(rest) = directive(">repeat") {
        let rest = rest.trim_start();
        let (n, unit) = rest.split_once(' ').ok_or("expected `>repeat N bytes`")?;
        let repeat = n.parse().map_err(|_| format!("bad repeat count {n:?}"))?;
        Step::Send {
            toks: tokens(unit, false)?,
            repeat,
        }
    } else if let Some(rest) = directive(">") {
        Step::Send {
            toks: tokens(rest, false)?,
            repeat: 1,
        }
    } else if line == "<..." {
        Step::Skip
    } else if let Some(rest) = directive("<") {
        Step::Expect(tokens(rest, true)?)
    } else if let Some(rest) = line.strip_prefix("@ ") {
        let words: Vec<&str> = rest.split_whitespace().collect();
        match words.as_slice() {
            ["closed"] => Step::Closed,
            ["memkeep-only"] => return Ok(None),
            ["assert", a, op @ ("==" | "!="), b] => Step::Assert {
                lhs: operand(a)?,
                eq: *op == "==",
                rhs: operand(b)?,
            },
            _ => return Err(format!("unknown directive {line:?}")),
        }
    } else {
        return Err(format!("unrecognised line {line:?}"));
    };
    Ok(Some(step))
}

fn parse_vectors(name: &str, text: &str) -> Result<VectorFile, String> {
    let mut auth = None;
    let auth_line = |line: &str, before_cases: bool| {
        let Some(rest) = line.strip_prefix("@ auth ") else {
            return Ok(false);
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        match (words.as_slice(), before_cases) {
            ([user, password], true) => {
                auth = Some((user.to_string(), password.to_string()));
                Ok(true)
            }
            _ => Err("`@ auth USER PASSWORD` goes before the first case".to_string()),
        }
    };
    let cases = parse_cases(text, auth_line, parse_step)?;
    for case in &cases {
        check_case(case)?;
    }
    Ok(VectorFile {
        name: name.to_string(),
        auth,
        cases,
    })
}

/// Structural rules: a case sends something, `<...` precedes a `<`, `@ closed` ends the case,
/// every `${var}` is captured earlier in the case.
fn check_case(case: &Case) -> Result<(), String> {
    let at = |no: usize, msg: String| format!("line {no}: case {:?}: {msg}", case.name);
    if !case
        .steps
        .iter()
        .any(|l| matches!(l.step, Step::Send { .. }))
    {
        return Err(at(case.line, "sends nothing".into()));
    }
    let mut captured: Vec<&str> = Vec::new();
    for (i, l) in case.steps.iter().enumerate() {
        let toks: Vec<&Tok> = match &l.step {
            Step::Send { toks, .. } | Step::Expect(toks) => toks.iter().collect(),
            Step::Assert { lhs, rhs, .. } => vec![lhs, rhs],
            Step::Skip => {
                if !matches!(
                    case.steps.get(i + 1).map(|n| &n.step),
                    Some(Step::Expect(_))
                ) {
                    return Err(at(l.no, "`<...` must be followed by a `<` line".into()));
                }
                continue;
            }
            Step::Closed => {
                if i + 1 != case.steps.len() {
                    return Err(at(l.no, "`@ closed` must end the case".into()));
                }
                continue;
            }
        };
        for t in toks {
            match t {
                Tok::Var(v) if !captured.contains(&v.as_str()) => {
                    return Err(at(l.no, format!("${{{v}}} is not captured before")));
                }
                Tok::Capture(name, _) => captured.push(name),
                _ => {}
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Rendering and matching

/// The bytes of a `>` line, with `${var}`s from `vars`.
fn render(toks: &[Tok], repeat: usize, vars: &Vars) -> Result<Vec<u8>, String> {
    let mut one = Vec::new();
    for t in toks {
        match t {
            Tok::Bytes(b) => one.extend_from_slice(b),
            Tok::Var(v) => one.extend_from_slice(
                vars.get(v)
                    .ok_or_else(|| format!("${{{v}}} was never captured"))?,
            ),
            other => return Err(format!("{other:?} in a request")),
        }
    }
    Ok(one.repeat(repeat))
}

/// Match one packet against a pattern. On success the pattern's captures are added to `vars`.
/// Unbound `${var}`s fail, unless `lenient` (the parser check), where they match any bytes of
/// the length in `var_lens`.
fn matches(
    pattern: &[Tok],
    packet: &[u8],
    vars: &mut Vars,
    lenient: Option<&HashMap<String, usize>>,
) -> Result<(), String> {
    let mut at = 0;
    let mut caps: Vec<(String, Vec<u8>)> = Vec::new();
    let short = |at: usize, n: usize| {
        if at + n > packet.len() {
            Err(format!(
                "the packet has {} bytes, the pattern wants more",
                packet.len()
            ))
        } else {
            Ok(())
        }
    };
    for t in pattern {
        match t {
            Tok::Bytes(want) => {
                short(at, want.len())?;
                if let Some(i) = (0..want.len()).find(|&i| packet[at + i] != want[i]) {
                    return Err(format!(
                        "byte {} is {:02x}, expected {:02x}",
                        at + i,
                        packet[at + i],
                        want[i]
                    ));
                }
                at += want.len();
            }
            Tok::Var(v) => match (vars.get(v), lenient) {
                (Some(want), _) => {
                    short(at, want.len())?;
                    if &packet[at..at + want.len()] != want.as_slice() {
                        return Err(format!("bytes {at}.. differ from ${{{v}}} = {}", hex(want)));
                    }
                    at += want.len();
                }
                (None, Some(lens)) => at += lens.get(v).copied().unwrap_or(0),
                (None, None) => return Err(format!("${{{v}}} was never captured")),
            },
            Tok::Any(n) => {
                short(at, *n)?;
                at += n;
            }
            Tok::Capture(name, n) => {
                short(at, *n)?;
                caps.push((name.clone(), packet[at..at + n].to_vec()));
                at += n;
            }
            Tok::Rest => at = packet.len(),
        }
    }
    if at != packet.len() {
        return Err(format!(
            "the packet has {} bytes, the pattern only {at}",
            packet.len()
        ));
    }
    vars.extend(caps);
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A packet for failure messages: header fields apart, then the body in hex and as text.
fn show_packet(p: &[u8]) -> String {
    if p.len() < HEADER_LEN {
        return format!("{} (short)", hex(p));
    }
    let h = |r: std::ops::Range<usize>| hex(&p[r]);
    let body = &p[HEADER_LEN..];
    let shown = &body[..body.len().min(120)];
    format!(
        "{} {} {} {} {} {} {} {} {} | {} {:?}{}",
        h(0..1),
        h(1..2),
        h(2..4),
        h(4..5),
        h(5..6),
        h(6..8),
        h(8..12),
        h(12..16),
        h(16..24),
        hex(shown),
        String::from_utf8_lossy(shown),
        if body.len() > shown.len() { " ..." } else { "" }
    )
}

fn show_pattern(toks: &[Tok]) -> String {
    let parts: Vec<String> = toks
        .iter()
        .map(|t| match t {
            Tok::Bytes(b) if b.len() >= 3 && b.iter().all(|c| (0x20..0x7f).contains(c)) => {
                format!("{:?}", String::from_utf8_lossy(b))
            }
            Tok::Bytes(b) => hex(b),
            Tok::Any(n) => "..".repeat(*n),
            Tok::Capture(name, n) => format!("({name}:{n})"),
            Tok::Var(v) => format!("${{{v}}}"),
            Tok::Rest => "*".into(),
        })
        .collect();
    parts.join(" ")
}

// ---------------------------------------------------------------------------------------------
// Parser check

/// Lengths of the case's captures, for matching without a server.
fn capture_lens(case: &Case) -> HashMap<String, usize> {
    let mut lens = HashMap::new();
    for l in &case.steps {
        if let Step::Expect(toks) = &l.step {
            for t in toks {
                if let Tok::Capture(name, n) = t {
                    lens.insert(name.clone(), *n);
                }
            }
        }
    }
    lens
}

/// The case's request bytes, `${var}`s as zero bytes of their captured length.
fn offline_stream(case: &Case, lens: &HashMap<String, usize>) -> Vec<u8> {
    let vars: Vars = lens.iter().map(|(k, n)| (k.clone(), vec![0; *n])).collect();
    let mut stream = Vec::new();
    for l in &case.steps {
        if let Step::Send { toks, repeat } = &l.step {
            stream.extend(render(toks, *repeat, &vars).expect("checked when loading"));
        }
    }
    stream
}

fn expected_packets(case: &Case) -> Vec<&Vec<Tok>> {
    case.steps
        .iter()
        .filter_map(|l| match &l.step {
            Step::Expect(t) => Some(t),
            _ => None,
        })
        .collect()
}

/// The leading plain bytes of a pattern (up to its first wildcard, capture or variable).
fn pattern_prefix(toks: &[Tok]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for t in toks {
        match t {
            Tok::Bytes(b) => bytes.extend_from_slice(b),
            _ => break,
        }
    }
    bytes
}

/// The opcode and status a pattern fixes (bytes 1 and 6..8), if they are plain bytes.
fn pattern_op_status(toks: &[Tok]) -> Option<(u8, u16)> {
    match pattern_prefix(toks).as_slice() {
        [_, op, _, _, _, _, s0, s1, ..] => Some((*op, u16::from_be_bytes([*s0, *s1]))),
        _ => None,
    }
}

fn is_sasl(op: u8) -> bool {
    (binary::opcode::SASL_LIST_MECHS..=binary::opcode::SASL_STEP).contains(&op)
}

/// Run the case's requests through the parser (see the module documentation).
fn parser_check(file: &VectorFile, case: &Case) -> Result<(), String> {
    let lens = capture_lens(case);
    let stream = offline_stream(case, &lens);
    let expected = expected_packets(case);
    let run = run_parser(file, &stream, &expected, &lens)?;
    let must_close = case.ends_closed();
    if must_close && !run.closed && file.auth.is_none() {
        return Err("the case expects a close, but no request closes the connection".into());
    }
    if run.closed && !must_close {
        return Err(
            "the parser closes the connection, but the case does not end `@ closed`".into(),
        );
    }
    check_parser_replies(&expected, &run)
}

/// What the parser made of a case's requests.
struct ParserRun {
    /// Which expected packets are the replies to parser errors.
    from_parser: Vec<bool>,
    /// `TooLarge` requests seen.
    too_large: usize,
    /// The last frame closes the connection.
    closed: bool,
}

fn run_parser(
    file: &VectorFile,
    stream: &[u8],
    expected: &[&Vec<Tok>],
    lens: &HashMap<String, usize>,
) -> Result<ParserRun, String> {
    let mut run = ParserRun {
        from_parser: vec![false; expected.len()],
        too_large: 0,
        closed: false,
    };
    let (mut at, mut next) = (0, 0);
    while at < stream.len() && !run.closed {
        let parsed = binary::parse(&stream[at..], &Limits::default()).map_err(|_| {
            let end = stream.len().min(at + 40);
            format!(
                "the requests end in an incomplete packet at byte {at}: {}",
                hex(&stream[at..end])
            )
        })?;
        match parsed.frame {
            Frame::Request(r) => {
                run.too_large += usize::from(matches!(r.command, Command::TooLarge { .. }));
                run.closed = matches!(r.command, Command::Quit);
            }
            Frame::Error(e) => {
                let (j, close) =
                    expected_error_reply(file, &e, expected, next, lens).ok_or_else(|| {
                        let mut reply = Vec::new();
                        binary::encode_error(&mut reply, &e);
                        format!(
                            "the parser rejects the request at byte {at} ({e:?}), replying {}, \
                             which the case does not expect",
                            show_packet(&reply)
                        )
                    })?;
                run.from_parser[j] = true;
                next = j + 1;
                run.closed = close;
            }
            Frame::Close => run.closed = true,
        }
        at += parsed.consumed + parsed.swallow;
    }
    if at > stream.len() && !run.closed {
        return Err(format!(
            "the parser swallows {} bytes past the requests",
            at - stream.len()
        ));
    }
    Ok(run)
}

/// The first expected packet from `next` on that is the reply to parser error `e`, and whether
/// the connection then closes. On a connection that must authenticate, memcached checks
/// authentication before most errors, so `Auth failure.` (then close) may be the reply instead.
fn expected_error_reply(
    file: &VectorFile,
    e: &binary::ErrorReply,
    expected: &[&Vec<Tok>],
    next: usize,
    lens: &HashMap<String, usize>,
) -> Option<(usize, bool)> {
    let mut replies = vec![(*e, e.close)];
    if file.auth.is_some() && !e.before_auth && !binary::auth_exempt(e.opcode) {
        let auth = binary::status::AUTH_ERROR;
        replies.push((binary::ErrorReply { status: auth, ..*e }, true));
    }
    (next..expected.len()).find_map(|j| {
        replies.iter().find_map(|(r, close)| {
            let mut reply = Vec::new();
            binary::encode_error(&mut reply, r);
            let ok = matches(expected[j], &reply, &mut Vars::new(), Some(lens));
            ok.is_ok().then_some((j, *close))
        })
    })
}

/// Replies only the parser produces must have come from it: `Invalid arguments` and
/// `Unknown command` (except for SASL opcodes, where the executor sends them too), and one
/// `Too large.` per `TooLarge` request.
fn check_parser_replies(expected: &[&Vec<Tok>], run: &ParserRun) -> Result<(), String> {
    let mut e2big = 0;
    for (j, toks) in expected.iter().enumerate() {
        let from_parser = match pattern_op_status(toks) {
            Some((op, binary::status::EINVAL | binary::status::UNKNOWN_COMMAND)) => !is_sasl(op),
            Some((_, binary::status::E2BIG)) => {
                e2big += 1;
                false
            }
            _ => false,
        };
        if from_parser && !run.from_parser[j] {
            return Err(format!(
                "expected reply {} is not one the parser produced",
                show_pattern(toks)
            ));
        }
    }
    if e2big != run.too_large {
        return Err(format!(
            "{e2big} `Too large.` replies expected, the parser found {} TooLarge requests",
            run.too_large
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Replay

/// The packet readers of the shared replay connection.
impl Conn {
    fn need(&mut self, n: usize) -> Result<(), Short> {
        while self.buf.len() < n {
            self.fill()?;
        }
        Ok(())
    }

    /// One whole response packet, or what arrived before the read stopped.
    fn packet(&mut self) -> Reply {
        let partial = |c: &mut Conn, why| (std::mem::take(&mut c.buf), why);
        if let Err(why) = self.need(HEADER_LEN) {
            return Err(partial(self, why));
        }
        let body = u32::from_be_bytes([self.buf[8], self.buf[9], self.buf[10], self.buf[11]]);
        let len = HEADER_LEN + body as usize;
        if body as usize > BODY_MAX {
            let msg = format!("implausible body length {body}");
            return Err(partial(self, Short::Error(msg)));
        }
        if let Err(why) = self.need(len) {
            return Err(partial(self, why));
        }
        Ok(self.buf.drain(..len).collect())
    }
}

/// Where the replay is in a case, and what it has learnt from the replies.
struct Replay {
    mode: Mode,
    conn: Conn,
    vars: Vars,
    /// `<...` seen: the next `<` may skip packets.
    skipping: bool,
}

impl Replayer for Replay {
    type Step = Step;

    fn mode(&self) -> Mode {
        self.mode
    }

    fn conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    fn render(&self, step: &Step) -> Result<Vec<u8>, String> {
        let Step::Send { toks, repeat } = step else {
            unreachable!()
        };
        render(toks, *repeat, &self.vars)
    }

    fn expect(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::Skip => {
                self.skipping = true;
                Ok(())
            }
            Step::Expect(pattern) => {
                let mut skipped = 0;
                loop {
                    let got = self.conn.packet().map_err(|(partial, why)| {
                        format!(
                            "expected {}, got {} and then {}{}",
                            show_pattern(pattern),
                            if partial.is_empty() {
                                "nothing".into()
                            } else {
                                hex(&partial)
                            },
                            why.describe(),
                            self.conn.write_note()
                        )
                    })?;
                    match matches(pattern, &got, &mut self.vars, None) {
                        Ok(()) => {
                            self.skipping = false;
                            return Ok(());
                        }
                        Err(e) if !self.skipping || skipped >= SKIP_MAX => {
                            return Err(format!(
                                "expected {}\n      got      {}\n      ({e})",
                                show_pattern(pattern),
                                show_packet(&got)
                            ));
                        }
                        Err(_) => skipped += 1,
                    }
                }
            }
            Step::Closed => self.conn.expect_closed(show_packet),
            Step::Assert { lhs, eq, rhs } => {
                let a = render(std::slice::from_ref(lhs), 1, &self.vars)?;
                let b = render(std::slice::from_ref(rhs), 1, &self.vars)?;
                if (a == b) == *eq {
                    Ok(())
                } else {
                    let op = if *eq { "==" } else { "!=" };
                    Err(format!("assertion failed: {} {op} {}", hex(&a), hex(&b)))
                }
            }
            Step::Send { .. } => unreachable!(),
        }
    }

    /// No directives in the binary vectors (`@ assert` is checked in order, as an expectation).
    fn directive(&mut self, _: &Step) -> Result<(), String> {
        unreachable!()
    }

    /// A `VERSION` probe must be answered next: no reply was missing, none extra.
    fn check_in_sync(&mut self) -> Result<(), String> {
        let mut probe = Vec::new();
        binary::Header {
            magic: binary::REQUEST_MAGIC,
            opcode: binary::opcode::VERSION,
            key_len: 0,
            extras_len: 0,
            data_type: 0,
            vbucket_or_status: 0,
            body_len: 0,
            opaque: PROBE_OPAQUE,
            cas: 0,
        }
        .encode(&mut probe);
        let probe = Probe {
            request: &probe,
            name: "VERSION",
            read: Conn::packet,
            answered: |got| {
                let h = binary::Header::decode(got).expect("whole packet");
                h.magic == binary::RESPONSE_MAGIC
                    && h.opcode == binary::opcode::VERSION
                    && h.vbucket_or_status == 0
                    && h.opaque == PROBE_OPAQUE
            },
            show: show_packet,
        };
        replay::check_in_sync(&mut self.conn, &probe)
    }
}

// ---------------------------------------------------------------------------------------------
// Driver

fn load_all() -> Vec<VectorFile> {
    let mut errors = Vec::new();
    let mut files = Vec::new();
    for path in proto_files("binary") {
        let name = file_name(&path);
        let text = std::fs::read_to_string(&path).expect("read vector file");
        match parse_vectors(&name, &text) {
            Ok(f) if f.cases.is_empty() => errors.push(format!("{name}: no cases")),
            Ok(f) => files.push(f),
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    assert!(
        errors.is_empty(),
        "vector syntax errors:\n{}",
        errors.join("\n")
    );
    assert!(!files.is_empty(), "no vectors under proto/binary/");
    files
}

fn selected(file: &VectorFile, target: Target) -> Vec<&Case> {
    let filter = Filter::from_env();
    file.cases
        .iter()
        .filter(|c| target == Target::Memkeep || !c.memkeep_only)
        .filter(|c| filter.selects(&file.name, &c.name))
        .collect()
}

/// A server for one file, or why it cannot run here.
fn start_server(
    file: &VectorFile,
    target: Target,
) -> Result<(Server, Option<tempfile::TempDir>), String> {
    match (target, &file.auth) {
        (Target::Memcached, None) => Ok((Server::memcached(), None)),
        (Target::Memcached, Some((user, password))) => {
            Server::memcached_sasl(user, password).map(|s| (s, None))
        }
        (_, auth) => {
            let mut opts = Options::default();
            let mut keep = None;
            if let Some((user, password)) = auth {
                let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
                let path = dir.path().join("auth");
                std::fs::write(&path, format!("{user}:{password}\n")).map_err(|e| e.to_string())?;
                opts.args = vec!["-Y".into(), path.to_string_lossy().into_owned()];
                keep = Some(dir);
            }
            Ok((Server::start_with(memkeep_bin(), opts), keep))
        }
    }
}

/// Replay one file against a fresh server; returns the failures.
fn replay_file(file: &VectorFile, target: Target) -> Vec<String> {
    let cases = selected(file, target);
    if cases.is_empty() {
        return Vec::new();
    }
    let (mut server, _keep) = match start_server(file, target) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("{}: SKIPPED against {target:?}: {why}", file.name);
            return Vec::new();
        }
    };
    eprintln!(
        "{}: replaying {} cases ({} skipped) against {target:?}",
        file.name,
        cases.len(),
        file.cases.len() - cases.len()
    );
    replay_cases(
        &file.name,
        &mut server,
        &cases,
        FILE_FAILURES_MAX,
        |server, mode, case| {
            let conn = Conn::open(server.addr()).map_err(|e| (case.line, e))?;
            let mut replay = Replay {
                mode,
                conn,
                vars: Vars::new(),
                skipping: false,
            };
            replay::run(&mut replay, case)
        },
    )
}

#[test]
fn vectors_parse() {
    let files = load_all();
    let cases: usize = files.iter().map(|f| f.cases.len()).sum();
    assert!(cases > 0);
}

#[test]
fn vectors_through_the_parser() {
    let mut failures = Vec::new();
    for file in load_all() {
        for case in &file.cases {
            if let Err(e) = parser_check(&file, case) {
                failures.push(format!(
                    "{}:{}: case `{}`: {e}",
                    file.name, case.line, case.name
                ));
            }
        }
    }
    report("parser check failures", &failures);
}

#[test]
fn vectors_replay() {
    let target = target();
    if target == Target::Redis {
        // The binary vectors are memcached's.
        return;
    }
    let files = load_all();
    let failures = in_parallel(&files, |f| f.name.clone(), |f| replay_file(f, target));
    report(&format!("replay (against {target:?}) failures"), &failures);
}

#[test]
fn format_helpers() {
    let t = tokens(r#"80 0a0000 "a\"b\x01" ${cas}"#, false).unwrap();
    assert_eq!(
        t,
        vec![
            Tok::Bytes(vec![0x80]),
            Tok::Bytes(vec![0x0a, 0, 0]),
            Tok::Bytes(b"a\"b\x01".to_vec()),
            Tok::Var("cas".into()),
        ]
    );
    assert!(tokens("8", false).is_err());
    assert!(tokens("..", false).is_err());
    assert!(tokens("* 00", true).is_err());
    assert!(tokens(r#""open"#, true).is_err());
    let p = tokens("81 .... (cas) (v:2) *", true).unwrap();
    assert_eq!(p[1], Tok::Any(2));
    assert_eq!(p[2], Tok::Capture("cas".into(), 8));
    let mut vars = Vars::new();
    let packet: Vec<u8> = (0u8..16).collect();
    let pat = tokens("00 .... (c:2) 0506 *", true).unwrap();
    let mut pkt = packet.clone();
    pkt[0] = 0;
    matches(&pat, &pkt, &mut vars, None).unwrap();
    assert_eq!(vars["c"], vec![3, 4]);
    assert!(matches(&tokens("00 01", true).unwrap(), &pkt, &mut vars, None).is_err());
    assert!(
        matches(
            &tokens("00 ${c}", true).unwrap(),
            &[0, 3, 4],
            &mut vars,
            None
        )
        .is_ok()
    );
    assert!(
        matches(
            &tokens("00 ${c}", true).unwrap(),
            &[0, 3, 5],
            &mut vars,
            None
        )
        .is_err()
    );
    // A failed match captures nothing.
    let mut fresh = Vars::new();
    assert!(
        matches(
            &tokens("(x:1) 09", true).unwrap(),
            &[1, 2],
            &mut fresh,
            None
        )
        .is_err()
    );
    assert!(fresh.is_empty());
    let f = parse_vectors(
        "t.txt",
        "@ auth u p\n== a\n> 00\n<...\n< 81 *\n== b\n@ memkeep-only\n> 01\n@ closed\n",
    )
    .unwrap();
    assert_eq!(f.auth, Some(("u".into(), "p".into())));
    assert!(f.cases[1].memkeep_only);
    assert!(parse_vectors("t", "== a\n> 00\n@ closed\n> 01\n").is_err());
    assert!(parse_vectors("t", "== a\n> ${nope}\n").is_err());
    assert!(parse_vectors("t", "== a\n> 00\n== b\n@ auth u p\n").is_err());
}
