//! memcached text protocol parser (memcached 1.6 `doc/protocol.txt`).
//!
//! `parse` looks at the start of a connection's read buffer and returns one frame and how many
//! bytes it used. The caller advances its buffer by `consumed`, then discards `swallow` further
//! bytes (a data block that we refuse without buffering it, e.g. an over-size value), which may
//! not have arrived yet. Errors that memcached answers and recovers from are frames carrying
//! their reply line; the connection stays in sync.

use super::meta::{self, MetaCmd};

/// Size limits the parser enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A command line without `\n` longer than this closes the connection (memcached: 2048).
    pub max_line: usize,
    /// The same cap for `get`/`gets`/`gat`/`gats` lines, which may carry many keys.
    pub max_multiget_line: usize,
    /// Largest value a storage command may carry (`-I`); larger data blocks are swallowed.
    pub item_size_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: 2048,
            max_multiget_line: 2 * 1024 * 1024,
            item_size_max: 1024 * 1024,
        }
    }
}

/// Longest key memcached accepts.
pub const KEY_MAX: usize = 250;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// The keys of a retrieval line, validated by the parser; `iter` yields them in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyList<'a>(pub &'a [u8]);

impl<'a> KeyList<'a> {
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.0.split(|&b| b == b' ').filter(|k| !k.is_empty())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`/`gets <key>+`
    Get { keys: KeyList<'a>, with_cas: bool },
    /// `gat`/`gats <exptime> <key>+`
    Gat {
        exptime: i64,
        keys: KeyList<'a>,
        with_cas: bool,
    },
    /// `set|add|replace|append|prepend <key> <flags> <exptime> <bytes> [noreply]` and
    /// `cas <key> <flags> <exptime> <bytes> <cas> [noreply]` with their data block (without the
    /// trailing `\r\n`). `cas` is 0 for modes other than `Cas`.
    Store {
        mode: StoreMode,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        cas: u64,
        data: &'a [u8],
        noreply: bool,
    },
    /// A well-formed storage line whose `<bytes>` exceeds `item_size_max`. The data block plus
    /// `\r\n` is in `Parsed::swallow`. memcached answers `SERVER_ERROR object too large for
    /// cache` and, for `set`, deletes the old value.
    TooLarge {
        mode: StoreMode,
        key: &'a [u8],
        noreply: bool,
    },
    /// `delete <key> [0] [noreply]`
    Delete { key: &'a [u8], noreply: bool },
    /// `incr|decr <key> <delta> [noreply]`
    Arith {
        key: &'a [u8],
        incr: bool,
        delta: u64,
        noreply: bool,
    },
    /// `touch <key> <exptime> [noreply]`
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`
    FlushAll { delay: i64, noreply: bool },
    /// `stats [args...]`: `args` is the rest of the line after `stats`, trimmed of spaces.
    Stats { args: &'a [u8] },
    /// `stats cachedump <class> <limit>`: keys of a slab class (memkeep has one, class 1),
    /// at most `limit` (0: all) and at most 2 MB of reply.
    CacheDump { class: u32, limit: u64 },
    /// `lru_crawler metadump <all|hash|class,class...>`: every item's metadata; `any` is false
    /// when the classes named leave out memkeep's one class (the dump is then empty).
    MetaDump { any: bool },
    /// `version`
    Version,
    /// `verbosity <level> [noreply]`
    Verbosity { level: u32, noreply: bool },
    /// `quit`
    Quit,
    /// MemcacheDB's `rget <start> <end> <left_open 0|1> <right_open 0|1> <max>`: the items whose
    /// keys fall in the range, in key order, at most `max` (at most 100).
    Rget {
        start: &'a [u8],
        end: &'a [u8],
        left_open: bool,
        right_open: bool,
        max: u32,
    },
    /// MemcacheDB's `db_checkpoint`: force everything committed to disk.
    DbCheckpoint,
    /// MemcacheDB's `db_compact` / `db_archive`: start a compacting online backup.
    DbCompact,
    /// `debug_advance_clock <seconds>`: test-only; the server answers `ERROR` unless it runs
    /// with a manual clock.
    DebugAdvanceClock { seconds: u64 },
    /// A request memcached rejects but answers with *nothing*, because its last token was
    /// `noreply` (e.g. `incr k x noreply`, `set k 0 0 z noreply`, a bad data chunk after a
    /// `noreply` store). `reply` is the error line memcached suppresses; the server must not send
    /// it (it may log or count it). Like `Frame::Error`, the connection stays in sync.
    NoReplyError { reply: &'static str },
    /// A meta command (`mg ms md ma mn me`).
    Meta(super::meta::MetaRequest<'a>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    Request(Request<'a>),
    /// A complete reply line (without `\r\n`) for a request we reject, e.g. `ERROR` or
    /// `CLIENT_ERROR bad command line format`.
    Error(&'static str),
    /// The input cannot be recovered from (a line with no newline past the limit): close.
    Close,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub frame: Frame<'a>,
    /// Bytes of the buffer this frame used.
    pub consumed: usize,
    /// Bytes after `consumed` to discard unseen (a refused data block and its `\r\n`).
    pub swallow: usize,
}

/// More bytes are needed before anything can be decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Incomplete;

pub(super) const ERROR: &str = "ERROR";
pub(super) const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
pub(super) const BAD_DATA_CHUNK: &str = "CLIENT_ERROR bad data chunk";
const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument";
const BAD_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";
const DELETE_USAGE: &str = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";

/// memcached refuses a `<bytes>` above `INT_MAX - 2` with `CLIENT_ERROR bad command line format`.
pub(super) const BYTES_MAX: i64 = i32::MAX as i64 - 2;

/// memcached tokenizes at most 23 tokens at a time (`MAX_TOKENS` 24, one slot for the rest); its
/// unknown-command `HTTP/` check looks at the last of those.
const MC_TOKENS: usize = 23;

/// Tokens we keep positions for; every command but `get`/`stats` needs at most 7.
const KEPT: usize = 8;

/// memcached's multiget check skips at most this many leading spaces.
const MULTIGET_LEADING_SPACES: usize = 100;

/// Parse one frame from the start of `buf`.
///
/// Deviations from memcached 1.6.18, all deliberate:
/// - a complete command line longer than the limit closes the connection (memcached only
///   checks lines still missing their `\n`), and `gat`/`gats` get the multiget limit too;
/// - keys with control bytes (`< 0x21`, `0x7f`) are refused like over-long keys;
/// - numbers are plain decimal with an optional sign (`+`, or `-` for signed fields, or `-0`):
///   no `strtol` whitespace skipping, no silent 32-bit truncation of flags, verbosity or
///   `<bytes>`; `exptime` and the `flush_all` delay are `i64`;
/// - a NUL byte is an ordinary byte (memcached ends the line at it);
/// - commands memkeep lacks (`bget`, `shutdown`, `slabs`, `lru_crawler` but its `metadump`, ...)
///   are unknown: `ERROR`.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Result<Parsed<'a>, Incomplete> {
    let limit = line_limit(buf, limits);
    // Only the first `limit + 1` bytes can hold an acceptable line's `\n`.
    let scan = &buf[..buf.len().min(limit.saturating_add(1))];
    let Some(nl) = memchr::memchr(b'\n', scan) else {
        return if buf.len() > limit {
            Ok(done(Frame::Close, 0))
        } else {
            Err(Incomplete)
        };
    };
    let line_len = nl + 1;
    let mut line = &buf[..nl];
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    parse_line(line, line_len, buf, limits)
}

/// The line-length limit for a buffer starting with `buf`: `max_multiget_line` for a retrieval
/// line (`get `/`gets `/`gat `/`gats `, after at most 100 spaces as memcached allows), else
/// `max_line`. While `buf` could still become either, the larger one applies, so a decided
/// `Close` never turns into a request when more bytes arrive.
fn line_limit(buf: &[u8], limits: &Limits) -> usize {
    let spaces = buf.iter().take_while(|&&b| b == b' ').count();
    if spaces > MULTIGET_LEADING_SPACES {
        return limits.max_line;
    }
    let rest = &buf[spaces..];
    for prefix in [&b"get "[..], b"gets ", b"gat ", b"gats "] {
        if rest.starts_with(prefix) {
            return limits.max_multiget_line;
        }
        if prefix.starts_with(rest) {
            return limits.max_line.max(limits.max_multiget_line);
        }
    }
    limits.max_line
}

fn done(frame: Frame<'_>, consumed: usize) -> Parsed<'_> {
    Parsed {
        frame,
        consumed,
        swallow: 0,
    }
}

fn request(req: Request<'_>, consumed: usize) -> Result<Parsed<'_>, Incomplete> {
    Ok(done(Frame::Request(req), consumed))
}

/// An error reply, or nothing at all when the request carried `noreply` (as memcached does).
fn reject<'a>(
    reply: &'static str,
    noreply: bool,
    consumed: usize,
) -> Result<Parsed<'a>, Incomplete> {
    let frame = if noreply {
        Frame::Request(Request::NoReplyError { reply })
    } else {
        Frame::Error(reply)
    };
    Ok(done(frame, consumed))
}

/// The space-separated tokens of one command line, without allocating.
struct Tokens<'a> {
    line: &'a [u8],
    /// `(start, end)` of the first `KEPT` tokens.
    pos: [(usize, usize); KEPT],
    /// Number of tokens.
    n: usize,
    /// End of the last token (the line without trailing spaces).
    end: usize,
    /// The token memcached's `HTTP/` check looks at: the last of the first 23.
    http: (usize, usize),
}

impl<'a> Tokens<'a> {
    fn new(line: &'a [u8]) -> Self {
        let mut t = Tokens {
            line,
            pos: [(0, 0); KEPT],
            n: 0,
            end: 0,
            http: (0, 0),
        };
        let mut i = 0;
        while i < line.len() {
            if line[i] == b' ' {
                i += 1;
                continue;
            }
            let start = i;
            while i < line.len() && line[i] != b' ' {
                i += 1;
            }
            if t.n < KEPT {
                t.pos[t.n] = (start, i);
            }
            if t.n < MC_TOKENS {
                t.http = (start, i);
            }
            t.n += 1;
            t.end = i;
        }
        t
    }

    /// Token `i`; `i` must be below `min(n, KEPT)`.
    fn get(&self, i: usize) -> &'a [u8] {
        let (s, e) = self.pos[i];
        &self.line[s..e]
    }

    /// The last token; only for lines of at most `KEPT` tokens, `n >= 1`.
    fn last(&self) -> &'a [u8] {
        self.get(self.n - 1)
    }

    /// memcached's `set_noreply_maybe`: is the last token `noreply`?
    fn noreply(&self) -> bool {
        self.last() == b"noreply"
    }

    /// The line from token `i` to the last token (empty if there is no token `i`).
    fn rest(&self, i: usize) -> &'a [u8] {
        if i < self.n {
            &self.line[self.pos[i].0..self.end]
        } else {
            &self.line[self.end..self.end]
        }
    }
}

pub fn valid_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= KEY_MAX && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// Plain decimal digits, no sign; `None` if empty, non-digit or over `u64`.
fn digits(t: &[u8]) -> Option<u64> {
    if t.is_empty() {
        return None;
    }
    t.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Unsigned decimal like memcached's `safe_strtoull`: an optional `+`, and `-` only for zero.
pub(super) fn parse_u64(t: &[u8]) -> Option<u64> {
    match t.split_first() {
        Some((b'+', rest)) => digits(rest),
        Some((b'-', rest)) => digits(rest).filter(|&v| v == 0),
        _ => digits(t),
    }
}

pub(super) fn parse_u32(t: &[u8]) -> Option<u32> {
    parse_u64(t).and_then(|v| u32::try_from(v).ok())
}

/// Signed decimal with an optional `+` or `-`.
pub(super) fn parse_i64(t: &[u8]) -> Option<i64> {
    match t.split_first() {
        Some((b'-', rest)) => {
            let v = digits(rest)?;
            if v == i64::MIN.unsigned_abs() {
                Some(i64::MIN)
            } else {
                i64::try_from(v).ok().map(|v| -v)
            }
        }
        Some((b'+', rest)) => digits(rest).and_then(|v| i64::try_from(v).ok()),
        _ => digits(t).and_then(|v| i64::try_from(v).ok()),
    }
}

fn parse_line<'a>(
    line: &'a [u8],
    line_len: usize,
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Parsed<'a>, Incomplete> {
    let t = Tokens::new(line);
    // memcached: no command is shorter than two bytes (this also covers the empty line).
    if t.n == 0 || t.get(0).len() < 2 {
        return reject(ERROR, false, line_len);
    }
    let n = t.n;
    match t.get(0) {
        b"get" | b"gets" | b"gat" | b"gats" if n < 2 => reject(ERROR, false, line_len),
        b"get" => parse_get(&t, line_len, false),
        b"gets" => parse_get(&t, line_len, true),
        b"gat" => parse_gat(&t, line_len, false),
        b"gats" => parse_gat(&t, line_len, true),
        b"set" => parse_store(StoreMode::Set, &t, line_len, buf, limits),
        b"add" => parse_store(StoreMode::Add, &t, line_len, buf, limits),
        b"replace" => parse_store(StoreMode::Replace, &t, line_len, buf, limits),
        b"append" => parse_store(StoreMode::Append, &t, line_len, buf, limits),
        b"prepend" => parse_store(StoreMode::Prepend, &t, line_len, buf, limits),
        b"cas" => parse_store(StoreMode::Cas, &t, line_len, buf, limits),
        b"delete" => parse_delete(&t, line_len),
        b"incr" => parse_arith(&t, line_len, true),
        b"decr" => parse_arith(&t, line_len, false),
        b"touch" => parse_touch(&t, line_len),
        b"flush_all" => parse_flush_all(&t, line_len),
        b"stats" if t.get(1) == b"cachedump" => parse_cachedump(&t, line_len),
        b"stats" => request(Request::Stats { args: t.rest(1) }, line_len),
        b"lru_crawler" => parse_lru_crawler(&t, line_len),
        b"version" => request(Request::Version, line_len),
        b"quit" => request(Request::Quit, line_len),
        b"verbosity" => parse_verbosity(&t, line_len),
        b"debug_advance_clock" => parse_debug_advance_clock(&t, line_len),
        b"rget" => parse_rget(&t, line_len),
        b"db_checkpoint" if n == 1 => request(Request::DbCheckpoint, line_len),
        b"db_compact" | b"db_archive" if n == 1 => request(Request::DbCompact, line_len),
        b"mg" => meta::parse(MetaCmd::Get, line, line_len, buf, limits),
        b"ms" => meta::parse(MetaCmd::Set, line, line_len, buf, limits),
        b"md" => meta::parse(MetaCmd::Delete, line, line_len, buf, limits),
        b"ma" => meta::parse(MetaCmd::Arith, line, line_len, buf, limits),
        b"me" => meta::parse(MetaCmd::Debug, line, line_len, buf, limits),
        b"mn" => meta::parse(MetaCmd::Noop, line, line_len, buf, limits),
        cmd => {
            // memcached dispatches on the first letter for these; unknown commands there are
            // plain `ERROR`. Elsewhere an unknown command ending in `HTTP/...` is a web client.
            let dispatched = matches!(cmd[0], b'g' | b's' | b'a' | b'c' | b'i' | b'd' | b't')
                || (cmd[0] == b'm' && cmd.len() == 2);
            let (s, e) = t.http;
            if !dispatched && line[s..e].starts_with(b"HTTP/") {
                Ok(done(Frame::Close, line_len))
            } else {
                reject(ERROR, false, line_len)
            }
        }
    }
}

fn parse_get<'a>(
    t: &Tokens<'a>,
    line_len: usize,
    with_cas: bool,
) -> Result<Parsed<'a>, Incomplete> {
    let keys = KeyList(t.rest(1));
    if !keys.iter().all(valid_key) {
        return reject(BAD_FORMAT, false, line_len);
    }
    request(Request::Get { keys, with_cas }, line_len)
}

fn parse_gat<'a>(
    t: &Tokens<'a>,
    line_len: usize,
    with_cas: bool,
) -> Result<Parsed<'a>, Incomplete> {
    let Some(exptime) = parse_i64(t.get(1)) else {
        return reject(BAD_EXPTIME, false, line_len);
    };
    // `gat <exptime>` with no key is accepted by memcached: it answers `END`.
    let keys = KeyList(t.rest(2));
    if !keys.iter().all(valid_key) {
        return reject(BAD_FORMAT, false, line_len);
    }
    request(
        Request::Gat {
            exptime,
            keys,
            with_cas,
        },
        line_len,
    )
}

fn parse_store<'a>(
    mode: StoreMode,
    t: &Tokens<'a>,
    line_len: usize,
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Parsed<'a>, Incomplete> {
    let is_cas = mode == StoreMode::Cas;
    let want = if is_cas { 6 } else { 5 };
    if t.n != want && t.n != want + 1 {
        return reject(ERROR, false, line_len);
    }
    // Every refusal below leaves the data block unread: memcached then parses it as commands.
    let noreply = t.noreply();
    let key = t.get(1);
    if !valid_key(key) {
        return reject(BAD_FORMAT, noreply, line_len);
    }
    let (Some(flags), Some(exptime), Some(bytes)) = (
        parse_u32(t.get(2)),
        parse_i64(t.get(3)),
        parse_i64(t.get(4)),
    ) else {
        return reject(BAD_FORMAT, noreply, line_len);
    };
    let cas = if is_cas {
        match parse_u64(t.get(5)) {
            Some(cas) => cas,
            None => return reject(BAD_FORMAT, noreply, line_len),
        }
    } else {
        0
    };
    if !(0..=BYTES_MAX).contains(&bytes) {
        return reject(BAD_FORMAT, noreply, line_len);
    }
    let bytes = bytes as usize;
    if bytes > limits.item_size_max {
        let frame = Frame::Request(Request::TooLarge { mode, key, noreply });
        return Ok(Parsed {
            frame,
            consumed: line_len,
            swallow: bytes + 2,
        });
    }
    let data_end = line_len.saturating_add(bytes);
    let total = data_end.saturating_add(2);
    if buf.len() < total {
        return Err(Incomplete);
    }
    if &buf[data_end..total] != b"\r\n" {
        return reject(BAD_DATA_CHUNK, noreply, total);
    }
    let data = &buf[line_len..data_end];
    request(
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            cas,
            data,
            noreply,
        },
        total,
    )
}

fn parse_delete<'a>(t: &Tokens<'a>, line_len: usize) -> Result<Parsed<'a>, Incomplete> {
    if !(2..=4).contains(&t.n) {
        return reject(ERROR, false, line_len);
    }
    // memcached only looks for `noreply` when there are extra tokens.
    let mut noreply = false;
    if t.n > 2 {
        let hold_is_zero = t.get(2) == b"0";
        noreply = t.noreply();
        let valid =
            (t.n == 3 && (hold_is_zero || noreply)) || (t.n == 4 && hold_is_zero && noreply);
        if !valid {
            return reject(DELETE_USAGE, noreply, line_len);
        }
    }
    let key = t.get(1);
    if !valid_key(key) {
        return reject(BAD_FORMAT, noreply, line_len);
    }
    request(Request::Delete { key, noreply }, line_len)
}

fn parse_arith<'a>(t: &Tokens<'a>, line_len: usize, incr: bool) -> Result<Parsed<'a>, Incomplete> {
    if t.n != 3 && t.n != 4 {
        return reject(ERROR, false, line_len);
    }
    let noreply = t.noreply();
    let key = t.get(1);
    if !valid_key(key) {
        return reject(BAD_FORMAT, noreply, line_len);
    }
    let Some(delta) = parse_u64(t.get(2)) else {
        return reject(BAD_DELTA, noreply, line_len);
    };
    request(
        Request::Arith {
            key,
            incr,
            delta,
            noreply,
        },
        line_len,
    )
}

fn parse_touch<'a>(t: &Tokens<'a>, line_len: usize) -> Result<Parsed<'a>, Incomplete> {
    if t.n != 3 && t.n != 4 {
        return reject(ERROR, false, line_len);
    }
    let noreply = t.noreply();
    let key = t.get(1);
    if !valid_key(key) {
        return reject(BAD_FORMAT, noreply, line_len);
    }
    let Some(exptime) = parse_i64(t.get(2)) else {
        return reject(BAD_EXPTIME, noreply, line_len);
    };
    request(
        Request::Touch {
            key,
            exptime,
            noreply,
        },
        line_len,
    )
}

fn parse_flush_all<'a>(t: &Tokens<'a>, line_len: usize) -> Result<Parsed<'a>, Incomplete> {
    if t.n > 3 {
        return reject(ERROR, false, line_len);
    }
    let noreply = t.n > 1 && t.noreply();
    // As memcached: the first argument is a delay unless the only argument is `noreply`.
    let delay = if t.n == if noreply { 2 } else { 1 } {
        0
    } else {
        match parse_i64(t.get(1)) {
            Some(delay) => delay,
            None => return reject(BAD_EXPTIME, noreply, line_len),
        }
    };
    request(Request::FlushAll { delay, noreply }, line_len)
}

fn parse_verbosity<'a>(t: &Tokens<'a>, line_len: usize) -> Result<Parsed<'a>, Incomplete> {
    if t.n != 2 && t.n != 3 {
        return reject(ERROR, false, line_len);
    }
    // `verbosity 1 2` is accepted (level 1); `verbosity noreply` is a silent error.
    let noreply = t.noreply();
    let Some(level) = parse_u32(t.get(1)) else {
        return reject(BAD_FORMAT, noreply, line_len);
    };
    request(Request::Verbosity { level, noreply }, line_len)
}

/// Most items one `rget` returns (MemcacheDB's RGET_MAX_ITEMS).
pub const RGET_MAX: u32 = 100;

/// `rget <start> <end> <left_open> <right_open> <max>`, as MemcacheDB reads it: the openness
/// flags are true when they start with `1`; a key over 250 bytes or `max` over 100 is a
/// `CLIENT_ERROR bad command line format`; any other token count is `ERROR`.
fn parse_rget<'a>(t: &Tokens<'a>, line_len: usize) -> Result<Parsed<'a>, Incomplete> {
    if t.n != 6 {
        return reject(ERROR, false, line_len);
    }
    let (start, end) = (t.get(1), t.get(2));
    let max = parse_u32(t.get(5)).filter(|&m| m <= RGET_MAX);
    match max {
        Some(max) if valid_key(start) && valid_key(end) => request(
            Request::Rget {
                start,
                end,
                left_open: t.get(3).first() == Some(&b'1'),
                right_open: t.get(4).first() == Some(&b'1'),
                max,
            },
            line_len,
        ),
        _ => reject(BAD_FORMAT, false, line_len),
    }
}

/// Slab classes memcached 1.6 can have (`MAX_NUMBER_OF_SLAB_CLASSES`, class 0 unused).
const SLAB_CLASSES: u64 = 64;

/// `stats cachedump <class> <limit>` (extra tokens ignored, as memcached does).
fn parse_cachedump<'a>(t: &Tokens<'a>, line_len: usize) -> Result<Parsed<'a>, Incomplete> {
    if t.n < 4 {
        return reject("CLIENT_ERROR bad command line", false, line_len);
    }
    match (digits(t.get(2)), digits(t.get(3))) {
        (Some(class), Some(_)) if class >= SLAB_CLASSES => {
            reject("CLIENT_ERROR Illegal slab id", false, line_len)
        }
        (Some(class), Some(limit)) => request(
            Request::CacheDump {
                class: class as u32,
                limit,
            },
            line_len,
        ),
        _ => reject(BAD_FORMAT, false, line_len),
    }
}

/// `lru_crawler metadump <all|hash|classes>`; memkeep's LRU crawler does nothing else.
fn parse_lru_crawler<'a>(t: &Tokens<'a>, line_len: usize) -> Result<Parsed<'a>, Incomplete> {
    if t.n != 3 || t.get(1) != b"metadump" {
        return reject(ERROR, false, line_len);
    }
    let any = match t.get(2) {
        b"all" | b"hash" => true,
        list => {
            let mut any = false;
            for class in list.split(|&b| b == b',') {
                match digits(class) {
                    Some(c) if (1..SLAB_CLASSES).contains(&c) => any |= c == 1,
                    _ => return reject("BADCLASS invalid class id", false, line_len),
                }
            }
            any
        }
    };
    request(Request::MetaDump { any }, line_len)
}

fn parse_debug_advance_clock<'a>(
    t: &Tokens<'a>,
    line_len: usize,
) -> Result<Parsed<'a>, Incomplete> {
    if t.n != 2 {
        return reject(ERROR, false, line_len);
    }
    match parse_u64(t.get(1)) {
        Some(seconds) => request(Request::DebugAdvanceClock { seconds }, line_len),
        None => reject(BAD_FORMAT, false, line_len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits::default()
    }

    fn p(buf: &[u8]) -> Result<Parsed<'_>, Incomplete> {
        parse(buf, &lim())
    }

    /// Parses to a request using the whole buffer, nothing swallowed.
    fn req(buf: &[u8]) -> Request<'_> {
        let parsed = p(buf).expect("complete");
        assert_eq!(parsed.consumed, buf.len(), "consumed for {buf:?}");
        assert_eq!(parsed.swallow, 0);
        match parsed.frame {
            Frame::Request(r) => r,
            other => panic!("expected a request for {buf:?}, got {other:?}"),
        }
    }

    /// Parses to `Frame::Error` and returns the reply and the bytes consumed.
    fn err(buf: &[u8]) -> (&'static str, usize) {
        let parsed = p(buf).expect("complete");
        assert_eq!(parsed.swallow, 0);
        match parsed.frame {
            Frame::Error(e) => (e, parsed.consumed),
            other => panic!("expected an error for {buf:?}, got {other:?}"),
        }
    }

    /// Parses to an error reply covering the whole buffer.
    fn err_line(buf: &[u8]) -> &'static str {
        let (e, consumed) = err(buf);
        assert_eq!(consumed, buf.len(), "consumed for {buf:?}");
        e
    }

    /// Parses to a silent (`noreply`) error covering `consumed` bytes.
    fn silent(buf: &[u8], consumed: usize) -> &'static str {
        let parsed = p(buf).expect("complete");
        assert_eq!(
            (parsed.consumed, parsed.swallow),
            (consumed, 0),
            "for {buf:?}"
        );
        match parsed.frame {
            Frame::Request(Request::NoReplyError { reply }) => reply,
            other => panic!("expected a silent error for {buf:?}, got {other:?}"),
        }
    }

    fn keys<'a>(r: &Request<'a>) -> Vec<&'a [u8]> {
        match r {
            Request::Get { keys, .. } | Request::Gat { keys, .. } => keys.iter().collect(),
            other => panic!("not a retrieval: {other:?}"),
        }
    }

    fn store<'a>(
        mode: StoreMode,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        cas: u64,
        data: &'a [u8],
        noreply: bool,
    ) -> Request<'a> {
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            cas,
            data,
            noreply,
        }
    }

    const BAD: &str = "CLIENT_ERROR bad command line format";

    // ---- framing ----

    #[test]
    fn empty_buffer_is_incomplete() {
        assert_eq!(p(b""), Err(Incomplete));
    }

    #[test]
    fn line_without_newline_is_incomplete() {
        assert_eq!(p(b"get foo\r"), Err(Incomplete));
        assert_eq!(p(b"version"), Err(Incomplete));
    }

    #[test]
    fn unterminated_line_at_max_line_is_incomplete() {
        assert_eq!(p(&[b'x'; 2048]), Err(Incomplete));
    }

    #[test]
    fn unterminated_line_over_max_line_closes() {
        assert_eq!(p(&[b'x'; 2049]).unwrap().frame, Frame::Close);
        let mut set = b"set ".to_vec();
        set.resize(3000, b'a');
        assert_eq!(p(&set).unwrap().frame, Frame::Close);
    }

    #[test]
    fn unterminated_retrieval_lines_use_multiget_limit() {
        for prefix in [&b"get "[..], b"gets ", b"gat 1 ", b"gats 1 "] {
            let mut buf = prefix.to_vec();
            while buf.len() < 3000 {
                buf.extend_from_slice(b"k ");
            }
            assert_eq!(p(&buf), Err(Incomplete), "{prefix:?}");
        }
    }

    #[test]
    fn unterminated_multiget_over_multiget_limit_closes() {
        let l = Limits {
            max_line: 16,
            max_multiget_line: 32,
            item_size_max: 100,
        };
        let mut buf = b"get ".to_vec();
        buf.resize(32, b'k');
        assert_eq!(parse(&buf, &l), Err(Incomplete));
        buf.push(b'k');
        assert_eq!(parse(&buf, &l).unwrap().frame, Frame::Close);
    }

    #[test]
    fn multiget_prefix_allows_up_to_100_leading_spaces() {
        let mut buf = vec![b' '; 100];
        buf.extend_from_slice(b"get ");
        buf.resize(3000, b'k');
        assert_eq!(p(&buf), Err(Incomplete));
        buf.insert(0, b' ');
        assert_eq!(p(&buf).unwrap().frame, Frame::Close);
    }

    #[test]
    fn possible_multiget_prefix_uses_larger_limit() {
        let l = Limits {
            max_line: 2,
            max_multiget_line: 100,
            item_size_max: 10,
        };
        assert_eq!(parse(b"get", &l), Err(Incomplete));
        assert_eq!(parse(b"  ga", &l), Err(Incomplete));
        assert!(matches!(
            parse(b"get a\n", &l).unwrap().frame,
            Frame::Request(Request::Get { .. })
        ));
        assert_eq!(parse(b"gex", &l).unwrap().frame, Frame::Close);
    }

    #[test]
    fn getx_prefix_uses_max_line() {
        let mut buf = b"getx ".to_vec();
        buf.resize(3000, b'k');
        assert_eq!(p(&buf).unwrap().frame, Frame::Close);
    }

    #[test]
    fn complete_line_over_max_line_closes() {
        let mut buf = b"version".to_vec();
        buf.resize(2049, b' ');
        buf.extend_from_slice(b"\r\n");
        assert_eq!(p(&buf).unwrap().frame, Frame::Close);
    }

    #[test]
    fn complete_line_at_max_line_is_parsed() {
        // 2048 bytes before the `\n`, including the `\r`.
        let mut buf = b"version".to_vec();
        buf.resize(2047, b' ');
        buf.extend_from_slice(b"\r\n");
        assert_eq!(req(&buf), Request::Version);
    }

    #[test]
    fn complete_multiget_line_over_multiget_limit_closes() {
        let l = Limits {
            max_line: 16,
            max_multiget_line: 32,
            item_size_max: 100,
        };
        // 32 bytes before the `\n`: just fits.
        let mut ok = b"get ".to_vec();
        ok.resize(32, b'k');
        ok.extend_from_slice(b"\n");
        assert!(matches!(
            parse(&ok, &l).unwrap().frame,
            Frame::Request(Request::Get { .. })
        ));
        let mut long = b"get ".to_vec();
        long.resize(33, b'k');
        long.extend_from_slice(b"\r\n");
        assert_eq!(parse(&long, &l).unwrap().frame, Frame::Close);
    }

    #[test]
    fn bare_lf_ends_a_line() {
        assert_eq!(req(b"version\n"), Request::Version);
    }

    #[test]
    fn only_one_trailing_cr_is_stripped() {
        // The key becomes `a\r`, which has a control byte.
        assert_eq!(err_line(b"get a\r\r\n"), BAD);
    }

    #[test]
    fn consumed_stops_at_first_line() {
        let parsed = p(b"version\r\nquit\r\n").unwrap();
        assert_eq!(parsed.consumed, 9);
        assert_eq!(parsed.frame, Frame::Request(Request::Version));
    }

    #[test]
    fn tokens_are_separated_by_runs_of_spaces() {
        let r = req(b"  get  a   b  \r\n");
        assert_eq!(keys(&r), vec![&b"a"[..], b"b"]);
        assert_eq!(
            req(b"touch   k   10   noreply  \r\n"),
            Request::Touch {
                key: b"k",
                exptime: 10,
                noreply: true
            }
        );
    }

    #[test]
    fn tab_is_not_a_separator() {
        assert_eq!(err_line(b"get a\tb\r\n"), BAD);
    }

    #[test]
    fn commands_are_case_sensitive() {
        assert_eq!(err_line(b"GET a\r\n"), "ERROR");
        assert_eq!(err_line(b"Version\r\n"), "ERROR");
    }

    #[test]
    fn empty_line_is_error() {
        assert_eq!(err_line(b"\r\n"), "ERROR");
        assert_eq!(err_line(b"\n"), "ERROR");
    }

    #[test]
    fn blank_line_is_error() {
        assert_eq!(err_line(b"   \r\n"), "ERROR");
    }

    #[test]
    fn one_letter_command_is_error() {
        assert_eq!(err_line(b"g\r\n"), "ERROR");
        assert_eq!(err_line(b"x HTTP/1.1\r\n"), "ERROR");
    }

    #[test]
    fn unknown_command_is_error() {
        assert_eq!(err_line(b"foo\r\n"), "ERROR");
        assert_eq!(err_line(b"foo bar baz\r\n"), "ERROR");
    }

    #[test]
    fn unknown_command_ending_in_http_closes() {
        assert_eq!(p(b"GET / HTTP/1.1\r\n").unwrap().frame, Frame::Close);
        assert_eq!(p(b"POST /x HTTP/1.0\r\n").unwrap().frame, Frame::Close);
        assert_eq!(p(b"foo HTTP/\r\n").unwrap().frame, Frame::Close);
        assert_eq!(p(b"rx HTTP/1.1\r\n").unwrap().frame, Frame::Close);
    }

    #[test]
    fn http_token_not_last_is_error() {
        assert_eq!(err_line(b"foo HTTP/ x\r\n"), "ERROR");
    }

    #[test]
    fn http_check_skipped_for_letters_memcached_dispatches_on() {
        for line in [
            &b"gxx HTTP/1.1\r\n"[..],
            b"sx HTTP/1.1\r\n",
            b"ax HTTP/1.1\r\n",
            b"cx HTTP/1.1\r\n",
        ] {
            assert_eq!(err_line(line), "ERROR");
        }
        for line in [
            &b"ix HTTP/1.1\r\n"[..],
            b"dx HTTP/1.1\r\n",
            b"tx HTTP/1.1\r\n",
            b"mx HTTP/1.1\r\n",
        ] {
            assert_eq!(err_line(line), "ERROR");
        }
        // `m` only dispatches for two-letter (meta) commands.
        assert_eq!(p(b"mxx HTTP/1.1\r\n").unwrap().frame, Frame::Close);
    }

    #[test]
    fn http_check_looks_at_23rd_token_of_long_lines() {
        let mut line = b"foo".to_vec();
        for _ in 0..21 {
            line.extend_from_slice(b" x");
        }
        line.extend_from_slice(b" HTTP/1.1 more\r\n"); // HTTP/1.1 is token 23
        assert_eq!(p(&line).unwrap().frame, Frame::Close);
    }

    #[test]
    fn http_as_24th_token_is_error() {
        let mut line = b"foo".to_vec();
        for _ in 0..22 {
            line.extend_from_slice(b" x");
        }
        line.extend_from_slice(b" HTTP/1.1\r\n"); // token 24: past memcached's first batch
        assert_eq!(err_line(&line), "ERROR");
    }

    // ---- storage ----

    #[test]
    fn set_parses_with_data_block() {
        assert_eq!(
            req(b"set k 5 10 3\r\nabc\r\n"),
            store(StoreMode::Set, b"k", 5, 10, 0, b"abc", false)
        );
    }

    #[test]
    fn add_replace_append_prepend_parse() {
        for (cmd, mode) in [
            ("add", StoreMode::Add),
            ("replace", StoreMode::Replace),
            ("append", StoreMode::Append),
            ("prepend", StoreMode::Prepend),
        ] {
            let buf = format!("{cmd} k 1 2 1\r\nz\r\n");
            assert_eq!(req(buf.as_bytes()), store(mode, b"k", 1, 2, 0, b"z", false));
        }
    }

    #[test]
    fn cas_parses_unique() {
        assert_eq!(
            req(b"cas k 0 0 2 18446744073709551615\r\nhi\r\n"),
            store(StoreMode::Cas, b"k", 0, 0, u64::MAX, b"hi", false)
        );
    }

    #[test]
    fn store_noreply() {
        assert_eq!(
            req(b"set k 0 0 1 noreply\r\nx\r\n"),
            store(StoreMode::Set, b"k", 0, 0, 0, b"x", true)
        );
        assert_eq!(
            req(b"cas k 0 0 1 7 noreply\r\nx\r\n"),
            store(StoreMode::Cas, b"k", 0, 0, 7, b"x", true)
        );
    }

    #[test]
    fn store_extra_token_not_noreply_is_ignored() {
        assert_eq!(
            req(b"set k 0 0 1 x\r\nx\r\n"),
            store(StoreMode::Set, b"k", 0, 0, 0, b"x", false)
        );
    }

    #[test]
    fn store_waits_for_whole_data_block() {
        let full = b"set k 0 0 3\r\nabc\r\n";
        for end in 0..full.len() {
            assert_eq!(p(&full[..end]), Err(Incomplete), "prefix {end}");
        }
    }

    #[test]
    fn store_data_may_contain_crlf() {
        assert_eq!(
            req(b"set k 0 0 4\r\n\r\n\r\n\r\n"),
            store(StoreMode::Set, b"k", 0, 0, 0, b"\r\n\r\n", false)
        );
    }

    #[test]
    fn store_zero_length_data() {
        assert_eq!(
            req(b"set k 0 0 0\r\n\r\n"),
            store(StoreMode::Set, b"k", 0, 0, 0, b"", false)
        );
    }

    #[test]
    fn store_negative_exptime() {
        assert_eq!(
            req(b"set k 0 -1 0\r\n\r\n"),
            store(StoreMode::Set, b"k", 0, -1, 0, b"", false)
        );
    }

    #[test]
    fn store_numbers_accept_plus_sign() {
        assert_eq!(
            req(b"set k +5 +0 +3\r\nabc\r\n"),
            store(StoreMode::Set, b"k", 5, 0, 0, b"abc", false)
        );
    }

    #[test]
    fn store_bytes_minus_zero_is_zero() {
        assert_eq!(
            req(b"set k 0 0 -0\r\n\r\n"),
            store(StoreMode::Set, b"k", 0, 0, 0, b"", false)
        );
    }

    #[test]
    fn store_max_flags() {
        assert_eq!(
            req(b"set k 4294967295 0 0\r\n\r\n"),
            store(StoreMode::Set, b"k", u32::MAX, 0, 0, b"", false)
        );
    }

    #[test]
    fn store_bad_data_chunk_consumes_line_data_and_two_bytes() {
        let buf = b"set k 0 0 3\r\nabcXYversion\r\n";
        assert_eq!(err(buf), ("CLIENT_ERROR bad data chunk", 13 + 3 + 2));
        let buf = b"set k 0 0 1\r\nx\nversion\r\n";
        assert_eq!(err(buf), ("CLIENT_ERROR bad data chunk", 13 + 1 + 2));
    }

    #[test]
    fn store_bad_data_chunk_with_noreply_is_silent() {
        assert_eq!(
            silent(b"set k 0 0 3 noreply\r\nabcXYversion\r\n", 21 + 5),
            "CLIENT_ERROR bad data chunk"
        );
    }

    #[test]
    fn store_too_large_swallows_without_waiting_for_data() {
        let l = Limits {
            item_size_max: 10,
            ..lim()
        };
        let parsed = parse(b"set k 0 0 11\r\n", &l).unwrap();
        assert_eq!(
            parsed.frame,
            Frame::Request(Request::TooLarge {
                mode: StoreMode::Set,
                key: b"k",
                noreply: false
            })
        );
        assert_eq!((parsed.consumed, parsed.swallow), (14, 13));
    }

    #[test]
    fn store_at_item_size_max_is_stored() {
        let l = Limits {
            item_size_max: 3,
            ..lim()
        };
        let parsed = parse(b"set k 0 0 3\r\nabc\r\n", &l).unwrap();
        assert_eq!(
            parsed.frame,
            Frame::Request(store(StoreMode::Set, b"k", 0, 0, 0, b"abc", false))
        );
    }

    #[test]
    fn store_too_large_keeps_noreply_and_mode() {
        let l = Limits {
            item_size_max: 0,
            ..lim()
        };
        let parsed = parse(b"append k 0 0 1 noreply\r\n", &l).unwrap();
        assert_eq!(
            parsed.frame,
            Frame::Request(Request::TooLarge {
                mode: StoreMode::Append,
                key: b"k",
                noreply: true
            })
        );
        assert_eq!((parsed.consumed, parsed.swallow), (24, 3));
    }

    #[test]
    fn store_bad_flags_is_bad_format_without_swallow() {
        assert_eq!(err(b"set k x 0 3\r\nabc\r\n"), (BAD, 13));
        assert_eq!(err(b"set k -1 0 3\r\nabc\r\n"), (BAD, 14));
    }

    #[test]
    fn store_flags_over_u32_is_bad_format() {
        assert_eq!(err(b"set k 4294967296 0 1\r\nx\r\n"), (BAD, 22));
    }

    #[test]
    fn store_bad_exptime_is_bad_format_without_swallow() {
        assert_eq!(err(b"set k 0 x 3\r\nabc\r\n"), (BAD, 13));
        assert_eq!(err(b"set k 0 1.5 3\r\nabc\r\n"), (BAD, 15));
    }

    #[test]
    fn store_bad_bytes_is_bad_format_without_swallow() {
        assert_eq!(err(b"set k 0 0 x\r\nabc\r\n"), (BAD, 13));
        assert_eq!(err(b"set k 0 0 -1\r\nabc\r\n"), (BAD, 14));
        assert_eq!(err(b"set k 0 0 2147483646\r\n"), (BAD, 22));
        assert_eq!(err(b"set k 0 0 99999999999999999999\r\n"), (BAD, 32));
    }

    #[test]
    fn store_bytes_up_to_int_max_minus_two_is_too_large() {
        let parsed = p(b"set k 0 0 2147483645\r\n").unwrap();
        assert!(matches!(
            parsed.frame,
            Frame::Request(Request::TooLarge { .. })
        ));
        assert_eq!((parsed.consumed, parsed.swallow), (22, 2147483647));
    }

    #[test]
    fn cas_bad_unique_is_bad_format_without_swallow() {
        assert_eq!(err(b"cas k 0 0 3 x\r\nabc\r\n"), (BAD, 15));
        assert_eq!(err(b"cas k 0 0 3 -1\r\nabc\r\n"), (BAD, 16));
    }

    #[test]
    fn cas_without_unique_is_error() {
        assert_eq!(err(b"cas k 0 0 3\r\nabc\r\n"), ("ERROR", 13));
    }

    #[test]
    fn store_too_few_tokens_is_error() {
        assert_eq!(err(b"set k 0 0\r\nabc\r\n"), ("ERROR", 11));
        assert_eq!(err(b"set\r\n"), ("ERROR", 5));
    }

    #[test]
    fn store_too_many_tokens_is_error() {
        assert_eq!(err(b"set k 0 0 3 noreply x\r\nabc\r\n"), ("ERROR", 23));
        assert_eq!(err(b"cas k 0 0 3 1 noreply x\r\nabc\r\n"), ("ERROR", 25));
    }

    #[test]
    fn store_wrong_token_count_with_noreply_still_replies() {
        assert_eq!(err(b"set k 0 noreply\r\n"), ("ERROR", 17));
    }

    #[test]
    fn store_key_of_250_bytes_is_accepted() {
        let key = vec![b'k'; 250];
        let mut buf = b"set ".to_vec();
        buf.extend_from_slice(&key);
        buf.extend_from_slice(b" 0 0 1\r\nx\r\n");
        assert_eq!(req(&buf), store(StoreMode::Set, &key, 0, 0, 0, b"x", false));
    }

    #[test]
    fn store_key_too_long_is_bad_format_without_swallow() {
        let mut buf = b"set ".to_vec();
        buf.extend_from_slice(&[b'k'; 251]);
        buf.extend_from_slice(b" 0 0 1\r\n");
        let line = buf.len();
        buf.extend_from_slice(b"x\r\n");
        assert_eq!(err(&buf), (BAD, line));
    }

    #[test]
    fn store_key_with_control_byte_is_bad_format() {
        assert_eq!(err(b"set a\x01b 0 0 1\r\nx\r\n"), (BAD, 15));
        assert_eq!(err(b"set a\x7fb 0 0 1\r\nx\r\n"), (BAD, 15));
    }

    #[test]
    fn store_key_with_high_bytes_is_accepted() {
        assert_eq!(
            req("set ключ 0 0 1\r\nx\r\n".as_bytes()),
            store(StoreMode::Set, "ключ".as_bytes(), 0, 0, 0, b"x", false)
        );
    }

    #[test]
    fn store_bad_line_with_noreply_is_silent() {
        assert_eq!(silent(b"set k x 0 3 noreply\r\nabc\r\n", 21), BAD);
        assert_eq!(silent(b"set k 0 0 -1 noreply\r\n", 22), BAD);
        let mut buf = b"set ".to_vec();
        buf.extend_from_slice(&[b'k'; 251]);
        buf.extend_from_slice(b" 0 0 1 noreply\r\n");
        assert_eq!(silent(&buf, buf.len()), BAD);
    }

    #[test]
    fn store_noreply_in_bytes_position_is_silent_error() {
        // memcached takes the last token as `noreply`, then fails to parse it as <bytes>.
        assert_eq!(silent(b"set k 0 0 noreply\r\n", 19), BAD);
        assert_eq!(silent(b"cas k 0 0 1 noreply\r\nx\r\n", 21), BAD);
    }

    // ---- retrieval ----

    #[test]
    fn get_single_key() {
        let r = req(b"get foo\r\n");
        assert_eq!(
            r,
            Request::Get {
                keys: KeyList(b"foo"),
                with_cas: false
            }
        );
    }

    #[test]
    fn get_multiple_keys_in_order() {
        let r = req(b"get a bb  ccc\r\n");
        assert_eq!(keys(&r), vec![&b"a"[..], b"bb", b"ccc"]);
    }

    #[test]
    fn gets_sets_with_cas() {
        assert_eq!(
            req(b"gets a b\r\n"),
            Request::Get {
                keys: KeyList(b"a b"),
                with_cas: true
            }
        );
    }

    #[test]
    fn get_many_keys_past_memcached_token_batch() {
        let mut line = b"get".to_vec();
        for i in 0..100 {
            line.extend_from_slice(format!(" k{i}").as_bytes());
        }
        line.extend_from_slice(b"\r\n");
        assert_eq!(keys(&req(&line)).len(), 100);
    }

    #[test]
    fn get_without_keys_is_error() {
        assert_eq!(err_line(b"get\r\n"), "ERROR");
        assert_eq!(err_line(b"get    \r\n"), "ERROR");
        assert_eq!(err_line(b"gets\r\n"), "ERROR");
    }

    #[test]
    fn get_key_of_250_bytes_is_accepted() {
        let mut buf = b"get ".to_vec();
        buf.extend_from_slice(&[b'k'; 250]);
        buf.extend_from_slice(b"\r\n");
        assert_eq!(keys(&req(&buf)), vec![&[b'k'; 250][..]]);
    }

    #[test]
    fn get_one_key_too_long_rejects_whole_request() {
        let mut buf = b"get a ".to_vec();
        buf.extend_from_slice(&[b'k'; 251]);
        buf.extend_from_slice(b" b\r\n");
        assert_eq!(err_line(&buf), BAD);
    }

    #[test]
    fn get_key_with_control_byte_is_bad_format() {
        assert_eq!(err_line(b"get a\x00b\r\n"), BAD);
        assert_eq!(err_line(b"gets ok bad\x1b\r\n"), BAD);
    }

    #[test]
    fn get_noreply_is_just_a_key() {
        assert_eq!(keys(&req(b"get noreply\r\n")), vec![&b"noreply"[..]]);
    }

    #[test]
    fn gat_parses_exptime_and_keys() {
        let r = req(b"gat 10 a b\r\n");
        assert_eq!(
            r,
            Request::Gat {
                exptime: 10,
                keys: KeyList(b"a b"),
                with_cas: false
            }
        );
    }

    #[test]
    fn gats_sets_with_cas() {
        assert_eq!(
            req(b"gats -1 a\r\n"),
            Request::Gat {
                exptime: -1,
                keys: KeyList(b"a"),
                with_cas: true
            }
        );
    }

    #[test]
    fn gat_bad_exptime_is_invalid_exptime() {
        assert_eq!(
            err_line(b"gat x a\r\n"),
            "CLIENT_ERROR invalid exptime argument"
        );
    }

    #[test]
    fn gat_without_keys_is_empty_request() {
        // memcached answers `gat 10` with a bare `END`.
        let r = req(b"gat 10\r\n");
        assert_eq!(
            r,
            Request::Gat {
                exptime: 10,
                keys: KeyList(b""),
                with_cas: false
            }
        );
        assert!(keys(&r).is_empty());
    }

    #[test]
    fn gat_without_exptime_is_error() {
        assert_eq!(err_line(b"gat\r\n"), "ERROR");
    }

    #[test]
    fn gat_key_too_long_is_bad_format() {
        let mut buf = b"gat 10 a ".to_vec();
        buf.extend_from_slice(&[b'k'; 251]);
        buf.extend_from_slice(b"\r\n");
        assert_eq!(err_line(&buf), BAD);
    }

    #[test]
    fn unknown_g_command_is_error() {
        assert_eq!(err_line(b"getx a\r\n"), "ERROR");
    }

    // ---- delete ----

    #[test]
    fn delete_key() {
        assert_eq!(
            req(b"delete k\r\n"),
            Request::Delete {
                key: b"k",
                noreply: false
            }
        );
    }

    #[test]
    fn delete_noreply() {
        assert_eq!(
            req(b"delete k noreply\r\n"),
            Request::Delete {
                key: b"k",
                noreply: true
            }
        );
    }

    #[test]
    fn delete_accepts_zero_hold() {
        assert_eq!(
            req(b"delete k 0\r\n"),
            Request::Delete {
                key: b"k",
                noreply: false
            }
        );
        assert_eq!(
            req(b"delete k 0 noreply\r\n"),
            Request::Delete {
                key: b"k",
                noreply: true
            }
        );
    }

    #[test]
    fn delete_other_hold_is_usage_error() {
        assert_eq!(
            err_line(b"delete k 1\r\n"),
            "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"
        );
        assert_eq!(
            err_line(b"delete k a b\r\n"),
            "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"
        );
    }

    #[test]
    fn delete_noreply_before_zero_is_usage_error() {
        assert_eq!(
            err_line(b"delete k noreply 0\r\n"),
            "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"
        );
    }

    #[test]
    fn delete_usage_error_with_noreply_is_silent() {
        let b = b"delete k 1 noreply\r\n";
        assert_eq!(
            silent(b, b.len()),
            "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"
        );
    }

    #[test]
    fn delete_too_many_tokens_is_error() {
        assert_eq!(err_line(b"delete k 0 noreply x\r\n"), "ERROR");
    }

    #[test]
    fn delete_without_key_is_error() {
        assert_eq!(err_line(b"delete\r\n"), "ERROR");
    }

    #[test]
    fn delete_key_too_long_is_bad_format() {
        let mut buf = b"delete ".to_vec();
        buf.extend_from_slice(&[b'k'; 251]);
        buf.extend_from_slice(b"\r\n");
        assert_eq!(err_line(&buf), BAD);
    }

    #[test]
    fn delete_key_named_noreply_is_a_key() {
        assert_eq!(
            req(b"delete noreply\r\n"),
            Request::Delete {
                key: b"noreply",
                noreply: false
            }
        );
    }

    // ---- incr / decr ----

    #[test]
    fn incr_parses() {
        assert_eq!(
            req(b"incr k 5\r\n"),
            Request::Arith {
                key: b"k",
                incr: true,
                delta: 5,
                noreply: false
            }
        );
    }

    #[test]
    fn decr_noreply_parses() {
        assert_eq!(
            req(b"decr k 18446744073709551615 noreply\r\n"),
            Request::Arith {
                key: b"k",
                incr: false,
                delta: u64::MAX,
                noreply: true
            }
        );
    }

    #[test]
    fn arith_extra_token_is_ignored() {
        assert_eq!(
            req(b"incr k 1 x\r\n"),
            Request::Arith {
                key: b"k",
                incr: true,
                delta: 1,
                noreply: false
            }
        );
    }

    #[test]
    fn arith_invalid_delta() {
        for line in [
            &b"incr k x\r\n"[..],
            b"incr k -1\r\n",
            b"decr k 18446744073709551616\r\n",
            b"incr k 1.0\r\n",
        ] {
            assert_eq!(
                err_line(line),
                "CLIENT_ERROR invalid numeric delta argument"
            );
        }
    }

    #[test]
    fn arith_invalid_delta_with_noreply_is_silent() {
        let b = b"incr k x noreply\r\n";
        assert_eq!(
            silent(b, b.len()),
            "CLIENT_ERROR invalid numeric delta argument"
        );
    }

    #[test]
    fn arith_wrong_token_count_is_error() {
        assert_eq!(err_line(b"incr k\r\n"), "ERROR");
        assert_eq!(err_line(b"decr k 1 x y\r\n"), "ERROR");
    }

    #[test]
    fn arith_key_too_long_is_bad_format() {
        let mut buf = b"incr ".to_vec();
        buf.extend_from_slice(&[b'k'; 251]);
        buf.extend_from_slice(b" x\r\n");
        assert_eq!(err_line(&buf), BAD);
    }

    // ---- touch ----

    #[test]
    fn touch_parses() {
        assert_eq!(
            req(b"touch k -5\r\n"),
            Request::Touch {
                key: b"k",
                exptime: -5,
                noreply: false
            }
        );
        assert_eq!(
            req(b"touch k 5 noreply\r\n"),
            Request::Touch {
                key: b"k",
                exptime: 5,
                noreply: true
            }
        );
    }

    #[test]
    fn touch_bad_exptime_is_invalid_exptime() {
        assert_eq!(
            err_line(b"touch k x\r\n"),
            "CLIENT_ERROR invalid exptime argument"
        );
    }

    #[test]
    fn touch_bad_exptime_with_noreply_is_silent() {
        let b = b"touch k x noreply\r\n";
        assert_eq!(silent(b, b.len()), "CLIENT_ERROR invalid exptime argument");
    }

    #[test]
    fn touch_wrong_token_count_is_error() {
        assert_eq!(err_line(b"touch k\r\n"), "ERROR");
        assert_eq!(err_line(b"touch k 1 2 3\r\n"), "ERROR");
    }

    #[test]
    fn touch_key_too_long_is_bad_format() {
        let mut buf = b"touch ".to_vec();
        buf.extend_from_slice(&[b'k'; 251]);
        buf.extend_from_slice(b" x\r\n");
        assert_eq!(err_line(&buf), BAD);
    }

    // ---- flush_all ----

    #[test]
    fn flush_all_without_args() {
        assert_eq!(
            req(b"flush_all\r\n"),
            Request::FlushAll {
                delay: 0,
                noreply: false
            }
        );
    }

    #[test]
    fn flush_all_with_delay_and_noreply() {
        assert_eq!(
            req(b"flush_all 10\r\n"),
            Request::FlushAll {
                delay: 10,
                noreply: false
            }
        );
        assert_eq!(
            req(b"flush_all noreply\r\n"),
            Request::FlushAll {
                delay: 0,
                noreply: true
            }
        );
        assert_eq!(
            req(b"flush_all -1 noreply\r\n"),
            Request::FlushAll {
                delay: -1,
                noreply: true
            }
        );
    }

    #[test]
    fn flush_all_second_argument_is_ignored() {
        assert_eq!(
            req(b"flush_all 7 0\r\n"),
            Request::FlushAll {
                delay: 7,
                noreply: false
            }
        );
    }

    #[test]
    fn flush_all_bad_delay_is_invalid_exptime() {
        assert_eq!(
            err_line(b"flush_all x\r\n"),
            "CLIENT_ERROR invalid exptime argument"
        );
    }

    #[test]
    fn flush_all_bad_delay_with_noreply_is_silent() {
        let b = b"flush_all x noreply\r\n";
        assert_eq!(silent(b, b.len()), "CLIENT_ERROR invalid exptime argument");
    }

    #[test]
    fn flush_all_too_many_tokens_is_error() {
        assert_eq!(err_line(b"flush_all 0 0 0\r\n"), "ERROR");
    }

    // ---- stats / version / quit / verbosity / debug ----

    #[test]
    fn stats_without_args() {
        assert_eq!(req(b"stats\r\n"), Request::Stats { args: b"" });
    }

    #[test]
    fn stats_args_are_trimmed() {
        assert_eq!(
            req(b"stats   slabs  x  \r\n"),
            Request::Stats { args: b"slabs  x" }
        );
    }

    #[test]
    fn version_ignores_extra_tokens() {
        assert_eq!(req(b"version\r\n"), Request::Version);
        assert_eq!(req(b"version x y\r\n"), Request::Version);
    }

    #[test]
    fn quit_ignores_extra_tokens() {
        assert_eq!(req(b"quit\r\n"), Request::Quit);
        assert_eq!(req(b"quit x\r\n"), Request::Quit);
    }

    #[test]
    fn verbosity_parses() {
        assert_eq!(
            req(b"verbosity 1\r\n"),
            Request::Verbosity {
                level: 1,
                noreply: false
            }
        );
        assert_eq!(
            req(b"verbosity 0 noreply\r\n"),
            Request::Verbosity {
                level: 0,
                noreply: true
            }
        );
    }

    #[test]
    fn verbosity_extra_token_is_ignored() {
        assert_eq!(
            req(b"verbosity 1 2\r\n"),
            Request::Verbosity {
                level: 1,
                noreply: false
            }
        );
    }

    #[test]
    fn verbosity_without_level_is_error() {
        assert_eq!(err_line(b"verbosity\r\n"), "ERROR");
    }

    #[test]
    fn verbosity_too_many_tokens_is_error() {
        assert_eq!(err_line(b"verbosity 1 2 3\r\n"), "ERROR");
    }

    #[test]
    fn verbosity_bad_level_is_bad_format() {
        assert_eq!(err_line(b"verbosity x\r\n"), BAD);
        assert_eq!(err_line(b"verbosity -1\r\n"), BAD);
    }

    #[test]
    fn verbosity_noreply_alone_is_silent() {
        let b = b"verbosity noreply\r\n";
        assert_eq!(silent(b, b.len()), BAD);
    }

    #[test]
    fn debug_advance_clock_parses() {
        assert_eq!(
            req(b"debug_advance_clock 60\r\n"),
            Request::DebugAdvanceClock { seconds: 60 }
        );
    }

    #[test]
    fn debug_advance_clock_bad_seconds_is_bad_format() {
        assert_eq!(err_line(b"debug_advance_clock -1\r\n"), BAD);
        assert_eq!(err_line(b"debug_advance_clock x\r\n"), BAD);
    }

    #[test]
    fn debug_advance_clock_wrong_token_count_is_error() {
        assert_eq!(err_line(b"debug_advance_clock\r\n"), "ERROR");
        assert_eq!(err_line(b"debug_advance_clock 1 2\r\n"), "ERROR");
    }

    // ---- robustness ----

    #[test]
    fn pipeline_parses_one_frame_at_a_time() {
        let buf = b"set k 0 0 1\r\nx\r\nget k\r\ndelete k noreply\r\n";
        let mut off = 0;
        let mut frames = Vec::new();
        while off < buf.len() {
            let parsed = p(&buf[off..]).unwrap();
            off += parsed.consumed;
            frames.push(parsed.frame);
        }
        assert_eq!(frames.len(), 3);
        assert_eq!(off, buf.len());
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        for buf in [
            &b"\xff\xfe\n"[..],
            b"\0\0\0\n",
            b"set \n",
            b"cas\n",
            b"gat \n",
            b"delete \n",
            b"set k 0 0 1\n",
        ] {
            let _ = p(buf);
        }
        let tiny = Limits {
            max_line: 0,
            max_multiget_line: 0,
            item_size_max: 0,
        };
        for buf in [&b""[..], b"\n", b"x", b"set k 0 0 1\r\nx\r\n"] {
            let _ = parse(buf, &tiny);
        }
    }
}
