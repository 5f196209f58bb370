//! The fuzz targets' logic, shared by the cargo-fuzz binaries (`fuzz_targets/`) and by
//! `tests/fuzz_props.rs`, which runs the same checks as property tests in `cargo test`.
//!
//! Each entry point takes arbitrary bytes and panics when an invariant breaks:
//! - `memcache_parser`: the memcached text parser, consuming frames as the server does;
//! - `resp_parser`: the RESP parser, with argument buffers reused across requests as the
//!   server reuses them;
//! - `binary_parser`: the memcached binary-protocol parser, consuming packets as the server
//!   does;
//! - `command_stream`: a stream of memcached (classic and meta) and Redis string writes applied
//!   through `semantics::apply` to the in-memory model and to a real LMDB store, which must
//!   agree on every outcome and on every item, across batches, aborted transactions, restarts
//!   and expiry sweeps.

use std::ops::Range;

use arbitrary::{Arbitrary, Unstructured};
use memkeep::command::{
    BitOpKind, ExpireCond, Expiry, Field, FieldOp, KeyValue, MetaOp, MetaStore, Overflow, SetCond,
    StoreMode, WriteOp,
};
use memkeep::protocol::meta::MetaCmd;
use memkeep::protocol::{binary, memcache as mc, resp};
use memkeep::semantics::{self, Ctx};
use memkeep::storage::lmdb::LmdbStore;
use memkeep::storage::model::ModelStore;
use memkeep::storage::{ItemMeta, ItemRef, ReadView, StoreError, WriteView};

// ---------------------------------------------------------------------------------------------
// Shared by the parser targets

/// The prefix lengths of `rest` worth re-parsing for a frame decided on `upto` bytes: every
/// one for short frames; else the first and last few, both sides of the first few `\n`s, and
/// a sample in between.
fn prefix_ends(rest: &[u8], upto: usize) -> Vec<usize> {
    let upto = upto.min(rest.len());
    if upto <= 96 {
        return (0..=upto).collect();
    }
    let mut ends: Vec<usize> = (0..16).chain(upto - 32..=upto).collect();
    ends.extend((0..upto).step_by(upto / 16));
    let newlines = rest[..upto]
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n');
    for (i, _) in newlines.take(8) {
        ends.extend([i, i + 1]);
    }
    ends.sort_unstable();
    ends.dedup();
    ends
}

/// Splits off a one-byte header: below 0x80 the server's default limits, else small limits
/// taken from the next bytes (so over-long lines and over-size values are reachable).
fn header(input: &[u8]) -> (Option<&[u8]>, &[u8]) {
    match input.split_first() {
        Some((&h, rest)) if h >= 0x80 && rest.len() >= 3 => (Some(&rest[..3]), &rest[3..]),
        Some((_, rest)) => (None, rest),
        None => (None, input),
    }
}

// ---------------------------------------------------------------------------------------------
// memcached text protocol

fn mc_limits(input: &[u8]) -> (mc::Limits, &[u8]) {
    match header(input) {
        (Some(l), rest) => (
            mc::Limits {
                max_line: usize::from(l[0] % 64),
                max_multiget_line: usize::from(l[1] % 128),
                item_size_max: usize::from(l[2] % 32),
            },
            rest,
        ),
        (None, rest) => (mc::Limits::default(), rest),
    }
}

fn valid_mc_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= mc::KEY_MAX && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// Parses `buf` frame by frame as the server does (advancing by `consumed`, then discarding
/// `swallow` bytes), checking every frame's invariants.
pub fn memcache_parser(input: &[u8]) {
    let (limits, buf) = mc_limits(input);
    let mut off = 0;
    while off < buf.len() {
        let rest = &buf[off..];
        let Ok(p) = mc::parse(rest, &limits) else {
            break;
        };
        check_mc_frame(rest, &p, &limits);
        let close = p.frame == mc::Frame::Close;
        // A frame decided on `consumed` bytes (Close: on up to the line limit) is the frame
        // every longer prefix decides, and shorter ones are Incomplete or decide the same.
        let upto = if close { rest.len() } else { p.consumed + 16 };
        for end in prefix_ends(rest, upto) {
            if let Ok(q) = mc::parse(&rest[..end], &limits) {
                assert_eq!(q, p, "prefix {end} of {rest:?} decided differently");
            }
        }
        if close {
            break;
        }
        off = off.saturating_add(p.consumed).saturating_add(p.swallow);
    }
}

fn check_mc_frame(rest: &[u8], p: &mc::Parsed<'_>, limits: &mc::Limits) {
    assert!(p.consumed <= rest.len(), "consumed past the input: {p:?}");
    if p.frame != mc::Frame::Close {
        assert!(p.consumed > 0, "no progress on {rest:?}: {p:?}");
    }
    // No command line is accepted beyond the larger line limit.
    let longest = limits.max_line.max(limits.max_multiget_line);
    if p.consumed > 0 {
        let nl = rest.iter().position(|&b| b == b'\n');
        assert!(
            nl.is_some_and(|nl| nl <= longest),
            "line over the limit: {p:?}"
        );
    }
    match &p.frame {
        mc::Frame::Request(mc::Request::TooLarge { key, .. }) => {
            assert!(valid_mc_key(key), "bad key accepted: {key:?}");
            assert!(
                p.swallow >= 2 && p.swallow - 2 > limits.item_size_max,
                "{p:?}"
            );
            assert!(
                p.swallow <= i32::MAX as usize,
                "swallow beyond memcached's limit: {p:?}"
            );
        }
        mc::Frame::Request(req) => {
            assert_eq!(p.swallow, 0, "swallow without TooLarge: {p:?}");
            check_mc_request(rest, p.consumed, req, limits);
        }
        // A refused meta set swallows its data block once its length is known.
        mc::Frame::Error(_) if p.swallow > 0 => {
            let line = rest[..p.consumed]
                .strip_suffix(b"\n")
                .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                .expect("a refused line ends in \\n");
            let mut toks = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
            assert_eq!(toks.next(), Some(&b"ms"[..]), "swallow after {p:?}");
            let len = toks
                .nth(1)
                .and_then(|t| std::str::from_utf8(t).ok())
                .and_then(|t| t.parse::<i64>().ok())
                .and_then(|n| usize::try_from(n).ok());
            assert_eq!(len.map(|n| n + 2), Some(p.swallow), "{p:?}");
        }
        _ => assert_eq!(p.swallow, 0, "swallow without TooLarge: {p:?}"),
    }
}

fn check_mc_request(rest: &[u8], consumed: usize, req: &mc::Request<'_>, limits: &mc::Limits) {
    match req {
        mc::Request::Get { keys, .. } => {
            assert!(keys.iter().next().is_some(), "get without keys: {req:?}");
            assert!(keys.iter().all(valid_mc_key), "bad key accepted: {req:?}");
        }
        mc::Request::Gat { keys, .. } => {
            assert!(keys.iter().all(valid_mc_key), "bad key accepted: {req:?}")
        }
        mc::Request::Store {
            mode,
            key,
            cas,
            data,
            ..
        } => {
            assert!(valid_mc_key(key), "bad key accepted: {req:?}");
            assert!(
                data.len() <= limits.item_size_max,
                "over-size data: {req:?}"
            );
            assert!(
                *mode == StoreMode::Cas || *cas == 0,
                "cas outside cas: {req:?}"
            );
            // The data block ends the frame, followed by exactly "\r\n".
            assert_eq!(&rest[consumed - 2..consumed], b"\r\n", "{req:?}");
            assert_eq!(
                *data,
                &rest[consumed - 2 - data.len()..consumed - 2],
                "{req:?}"
            );
        }
        mc::Request::Delete { key, .. }
        | mc::Request::Arith { key, .. }
        | mc::Request::Touch { key, .. } => {
            assert!(valid_mc_key(key), "bad key accepted: {req:?}")
        }
        mc::Request::Meta(m) => {
            let key_ok = if m.flags.has(b'b') {
                !m.key.is_empty() && m.key.len() <= mc::KEY_MAX
            } else {
                valid_mc_key(&m.key)
            };
            assert!(
                m.cmd == MetaCmd::Noop || key_ok,
                "bad key accepted: {req:?}"
            );
            if m.cmd == MetaCmd::Set {
                assert!(m.data.len() <= limits.item_size_max, "{req:?}");
                assert_eq!(&rest[consumed - 2..consumed], b"\r\n", "{req:?}");
            }
        }
        mc::Request::Rget {
            start, end, max, ..
        } => {
            assert!(valid_mc_key(start) && valid_mc_key(end), "{req:?}");
            assert!(*max <= mc::RGET_MAX, "{req:?}");
        }
        _ => {}
    }
    // A request written back in canonical form parses to a request of the same canonical form.
    if let Some(bytes) = render_mc(req) {
        let roomy = mc::Limits {
            max_line: 1 << 20,
            max_multiget_line: 1 << 20,
            item_size_max: limits.item_size_max,
        };
        let again = mc::parse(&bytes, &roomy).map(|p| match p.frame {
            mc::Frame::Request(r) if p.consumed == bytes.len() && p.swallow == 0 => render_mc(&r),
            _ => None,
        });
        assert_eq!(again, Ok(Some(bytes)), "{req:?}");
    }
}

/// A request in canonical form (single spaces, plain numbers), for the requests that have one.
fn render_mc(req: &mc::Request<'_>) -> Option<Vec<u8>> {
    let mut toks: Vec<Vec<u8>> = Vec::new();
    let mut t = |x: &[u8]| toks.push(x.to_vec());
    let num = |n: &dyn std::fmt::Display| n.to_string().into_bytes();
    let noreply = |t: &mut dyn FnMut(&[u8]), n: bool| {
        if n {
            t(b"noreply")
        }
    };
    let mut data = None;
    match *req {
        mc::Request::Get { keys, with_cas } => {
            t(if with_cas { b"gets" } else { b"get" });
            keys.iter().for_each(&mut t);
        }
        mc::Request::Gat {
            exptime,
            keys,
            with_cas,
        } => {
            t(if with_cas { b"gats" } else { b"gat" });
            t(&num(&exptime));
            keys.iter().for_each(&mut t);
        }
        mc::Request::Store {
            mode,
            key,
            flags,
            exptime,
            cas,
            data: d,
            noreply: n,
        } => {
            // The command names are the modes' names.
            t(format!("{mode:?}").to_ascii_lowercase().as_bytes());
            t(key);
            t(&num(&flags));
            t(&num(&exptime));
            t(&num(&d.len()));
            if mode == StoreMode::Cas {
                t(&num(&cas));
            }
            noreply(&mut t, n);
            data = Some(d);
        }
        mc::Request::Delete { key, noreply: n } => {
            t(b"delete");
            t(key);
            noreply(&mut t, n);
        }
        mc::Request::Arith {
            key,
            incr,
            delta,
            noreply: n,
        } => {
            t(if incr { b"incr" } else { b"decr" });
            t(key);
            t(&num(&delta));
            noreply(&mut t, n);
        }
        mc::Request::Touch {
            key,
            exptime,
            noreply: n,
        } => {
            t(b"touch");
            t(key);
            t(&num(&exptime));
            noreply(&mut t, n);
        }
        mc::Request::FlushAll { delay, noreply: n } => {
            t(b"flush_all");
            t(&num(&delay));
            noreply(&mut t, n);
        }
        mc::Request::Stats { args } => {
            t(b"stats");
            if !args.is_empty() {
                t(args);
            }
        }
        mc::Request::Verbosity { level, noreply: n } => {
            t(b"verbosity");
            t(&num(&level));
            noreply(&mut t, n);
        }
        mc::Request::Rget {
            start,
            end,
            left_open,
            right_open,
            max,
        } => {
            t(b"rget");
            t(start);
            t(end);
            t(if left_open { b"1" } else { b"0" });
            t(if right_open { b"1" } else { b"0" });
            t(&num(&max));
        }
        mc::Request::DebugAdvanceClock { seconds } => {
            t(b"debug_advance_clock");
            t(&num(&seconds));
        }
        mc::Request::Version => t(b"version"),
        mc::Request::Quit => t(b"quit"),
        mc::Request::DbCheckpoint => t(b"db_checkpoint"),
        mc::Request::DbCompact => t(b"db_compact"),
        _ => return None,
    }
    let mut out = toks.join(&b' ');
    out.extend_from_slice(b"\r\n");
    if let Some(d) = data {
        out.extend_from_slice(d);
        out.extend_from_slice(b"\r\n");
    }
    Some(out)
}

// ---------------------------------------------------------------------------------------------
// RESP

/// The argument buffers the server keeps per connection and reuses for every request.
#[derive(Default)]
struct RespBufs {
    args: Vec<Range<usize>>,
    scratch: Vec<u8>,
}

/// A parse result with its arguments copied out, comparable across buffers.
type RespOwned = (resp::Parsed, Vec<Vec<u8>>);

impl RespBufs {
    fn parse(&mut self, buf: &[u8], limits: &resp::Limits) -> Option<RespOwned> {
        let p = resp::parse(buf, limits, &mut self.args, &mut self.scratch).ok()?;
        let src = match p {
            resp::Parsed::Command { inline: true, .. } => &self.scratch[..],
            _ => buf,
        };
        let args = match p {
            resp::Parsed::Command { .. } => {
                self.args.iter().map(|r| src[r.clone()].to_vec()).collect()
            }
            _ => Vec::new(),
        };
        Some((p, args))
    }
}

/// Parses `buf` request by request as the server does, until a framing error (which closes the
/// connection) or the end, checking every request's invariants.
pub fn resp_parser(input: &[u8]) {
    let (limits, buf) = match header(input) {
        (Some(l), rest) => (
            resp::Limits {
                max_bulk: usize::from(l[0] % 64),
            },
            rest,
        ),
        (None, rest) => (resp::Limits { max_bulk: 1 << 20 }, rest),
    };
    let mut bufs = RespBufs::default();
    let mut probe = RespBufs::default();
    let mut off = 0;
    while off < buf.len() {
        let rest = &buf[off..];
        let Some((p, args)) = bufs.parse(rest, &limits) else {
            break;
        };
        let consumed = match p {
            resp::Parsed::Command { consumed, inline } => {
                check_resp_command(rest, consumed, inline, &bufs, &args, &limits);
                consumed
            }
            resp::Parsed::Empty { consumed } => consumed,
            resp::Parsed::Error(_) => 0,
        };
        assert!(consumed <= rest.len(), "consumed past the input: {p:?}");
        let upto = if consumed == 0 {
            rest.len()
        } else {
            consumed + 16
        };
        for end in prefix_ends(rest, upto) {
            if let Some(q) = probe.parse(&rest[..end], &limits) {
                assert_eq!(q, (p.clone(), args.clone()), "prefix {end} of {rest:?}");
            }
        }
        if consumed == 0 {
            break;
        }
        off += consumed;
    }
}

fn check_resp_command(
    rest: &[u8],
    consumed: usize,
    inline: bool,
    bufs: &RespBufs,
    args: &[Vec<u8>],
    limits: &resp::Limits,
) {
    assert!(!args.is_empty(), "a command without arguments: {rest:?}");
    if inline {
        // One line, ending at the first "\n".
        assert_eq!(rest.iter().position(|&b| b == b'\n'), Some(consumed - 1));
        assert!(bufs.args.iter().all(|r| r.end <= bufs.scratch.len()));
    } else {
        let mut at = 0;
        for r in &bufs.args {
            assert!(
                r.start >= at && r.end <= consumed,
                "{r:?} out of order or bounds"
            );
            assert!(r.len() <= limits.max_bulk, "bulk over the limit: {r:?}");
            at = r.end;
        }
    }
    // The arguments sent back as a multibulk request, and as an inline line with every byte
    // escaped, parse to the same arguments.
    let mut mb = format!("*{}\r\n", args.len()).into_bytes();
    let mut line = Vec::new();
    for a in args {
        mb.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        mb.extend_from_slice(a);
        mb.extend_from_slice(b"\r\n");
        line.extend_from_slice(b" \"");
        for b in a {
            line.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        }
        line.push(b'"');
    }
    line.extend_from_slice(b"\r\n");
    let roomy = resp::Limits {
        max_bulk: args.iter().map(Vec::len).max().unwrap_or(0),
    };
    let mut again = RespBufs::default();
    let want = |consumed, inline| Some((resp::Parsed::Command { consumed, inline }, args.to_vec()));
    assert_eq!(again.parse(&mb, &roomy), want(mb.len(), false), "{mb:?}");
    if line.len() <= resp::INLINE_MAX {
        let line = &line[1..];
        assert_eq!(
            again.parse(line, &roomy),
            want(line.len(), true),
            "{line:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Command stream: the model against LMDB

/// Keys the stream writes: four ordinary ones, and the edges of what a store can hold (empty;
/// the longest key whose expiry-index entry still fits LMDB's key limit; longer ones up to
/// `MAX_KEY`; one past it).
fn key(k: u8) -> Vec<u8> {
    const SHORT: [&[u8]; 4] = [b"a", b"b", b"counter", b"k"];
    match k {
        0..=239 => SHORT[usize::from(k % 4)].to_vec(),
        240..=243 => Vec::new(),
        244..=247 => vec![b'x'; 503],
        248..=251 => vec![b'y'; 504],
        252..=253 => vec![b'z'; memkeep::storage::MAX_KEY],
        _ => vec![b'w'; memkeep::storage::MAX_KEY + 1],
    }
}

/// Every key `key` can produce.
fn all_keys() -> Vec<Vec<u8>> {
    [0, 1, 2, 3, 240, 244, 248, 252, 255].map(key).to_vec()
}

/// A value: raw bytes, or the numbers and near-numbers that counters parse.
#[derive(Arbitrary, Debug, Clone)]
enum Val {
    Bytes(Vec<u8>),
    Unsigned(u64),
    Signed(i64),
    /// A counter with spaces around it (memcached's incr accepts them, Redis's does not).
    Padded(u8, u16, u8),
    Float(f64),
    Max,
}

impl Val {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Val::Bytes(b) => b.clone(),
            Val::Unsigned(n) => n.to_string().into_bytes(),
            Val::Signed(n) => n.to_string().into_bytes(),
            Val::Padded(l, n, r) => format!(
                "{}{n}{}",
                " ".repeat(usize::from(l % 3)),
                " ".repeat(usize::from(r % 3))
            )
            .into_bytes(),
            Val::Float(f) => f.to_string().into_bytes(),
            Val::Max => u64::MAX.to_string().into_bytes(),
        }
    }
}

/// A memcached exptime: small relative times (so items expire as the clock moves), absolute
/// ones around now, or anything.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Exptime {
    Relative(i8),
    Absolute(i16),
    Raw(i64),
}

impl Exptime {
    fn get(self, now_ms: u64) -> i64 {
        match self {
            Exptime::Relative(s) => i64::from(s % 8),
            Exptime::Absolute(s) => (now_ms / 1000) as i64 + i64::from(s % 16),
            Exptime::Raw(t) => t,
        }
    }
}

/// A RESP absolute expiry in ms, relative to now (possibly past).
#[derive(Arbitrary, Debug, Clone, Copy)]
struct At(i16);

impl At {
    fn get(self, now_ms: u64) -> u64 {
        now_ms.saturating_add_signed(i64::from(self.0) * 50).max(1)
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum RespExpiry {
    Keep,
    Clear,
    At(At),
}

/// The CAS a `cas` command sends: the item's current one (read from the model), off by a
/// little, or anything.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum CasArg {
    Current(i8),
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    Store {
        /// One of the six modes, decoded as `arbitrary` decodes a six-variant enum.
        mode: u32,
        key: u8,
        val: Val,
        flags: u8,
        exptime: Exptime,
        cas: CasArg,
    },
    Delete(u8),
    Arith {
        key: u8,
        incr: bool,
        delta: u64,
        small: bool,
    },
    Touch(u8, Exptime),
    Gat(Vec<u8>, Exptime),
    FlushAll(Exptime),
    Set {
        key: u8,
        val: Val,
        cond: u8,
        expiry: RespExpiry,
        get: bool,
    },
    IncrBy(u8, i64),
    IncrByFloat(u8, f64),
    Append(u8, Val),
    SetRange(u8, Val, u16),
    GetDel(u8),
    GetEx(u8, RespExpiry),
    MSet(Vec<(u8, Val)>, bool),
    Del(Vec<u8>),
    Expire(u8, At, u8),
    Persist(u8),
    Rename(u8, u8, bool),
    Meta(MetaStep),
    /// SETBIT key offset bit.
    SetBit(u8, u16, bool),
    BitField(u8, Vec<BitStep>),
    /// BITOP: the operation (of four), the destination, the sources (NOT takes the first).
    Combine(u8, u8, Vec<u8>),
}

/// One BITFIELD operation: GET, SET or INCRBY (of three) on a field of 1 to 64 bits (63
/// unsigned) under one of the three overflow policies.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct BitStep {
    kind: u8,
    signed: bool,
    bits: u8,
    offset: u16,
    value: i64,
    overflow: u8,
}

/// The meta commands' writes (`E`, a client-chosen CAS, is left out: it may repeat a CAS, which
/// the stream's invariants forbid).
#[derive(Arbitrary, Debug, Clone)]
enum MetaStep {
    Set {
        /// One of the five ms modes, decoded like `Store::mode`.
        mode: u32,
        key: u8,
        val: Val,
        flags: u8,
        exptime: Exptime,
        compare: Option<CasArg>,
        invalidate: bool,
        vivify: Option<Exptime>,
    },
    Delete {
        key: u8,
        compare: Option<CasArg>,
        invalidate: bool,
        exptime: Option<Exptime>,
        keep: bool,
    },
    Arith {
        key: u8,
        incr: bool,
        delta: u64,
        compare: Option<CasArg>,
        vivify: Option<Exptime>,
        initial: u64,
        exptime: Option<Exptime>,
    },
    Get {
        key: u8,
        touch: Option<Exptime>,
        vivify: Option<Exptime>,
        recache: Option<i8>,
    },
}

/// The CAS a request carries: see `CasArg`.
fn cas_value(cas: CasArg, k: u8, model: &ModelStore) -> u64 {
    match cas {
        CasArg::Current(d) => {
            let current = model.get(&key(k)).ok().flatten().map_or(0, |i| i.meta.cas);
            current.saturating_add_signed(i64::from(d % 2))
        }
        CasArg::Raw(c) => c,
    }
}

/// The write a meta step stands for.
fn meta_op(op: &MetaStep, now_ms: u64, model: &ModelStore) -> MetaOp {
    let compare = |c: &Option<CasArg>, k: u8| c.map(|c| cas_value(c, k, model));
    let ttl = |e: &Option<Exptime>| e.map(|e| e.get(now_ms));
    match op {
        MetaStep::Set {
            mode,
            key: k,
            val,
            flags,
            exptime,
            compare: c,
            invalidate,
            vivify,
        } => MetaOp::Store(MetaStore {
            mode: [
                StoreMode::Set,
                StoreMode::Add,
                StoreMode::Replace,
                StoreMode::Append,
                StoreMode::Prepend,
            ][((u64::from(*mode) * 5) >> 32) as usize],
            kv: KeyValue::new(&key(*k), &val.bytes()),
            flags: u32::from(*flags),
            exptime: exptime.get(now_ms),
            compare: compare(c, *k),
            invalidate: *invalidate,
            vivify: ttl(vivify),
            new_cas: None,
        }),
        MetaStep::Delete {
            key: k,
            compare: c,
            invalidate,
            exptime,
            keep,
        } => MetaOp::Delete {
            key: key(*k),
            compare: compare(c, *k),
            invalidate: *invalidate,
            exptime: ttl(exptime),
            keep: *keep,
            new_cas: None,
        },
        MetaStep::Arith {
            key: k,
            incr,
            delta,
            compare: c,
            vivify,
            initial,
            exptime,
        } => MetaOp::Arith {
            key: key(*k),
            incr: *incr,
            delta: *delta,
            compare: compare(c, *k),
            vivify: ttl(vivify),
            initial: *initial,
            exptime: ttl(exptime),
            new_cas: None,
        },
        MetaStep::Get {
            key: k,
            touch,
            vivify,
            recache,
        } => MetaOp::Get {
            key: key(*k),
            touch: ttl(touch),
            vivify: ttl(vivify),
            recache: recache.map(i64::from),
            new_cas: None,
        },
    }
}

/// What happens next in the stream.
#[derive(Arbitrary, Debug, Clone)]
enum Step {
    Op(Op),
    /// End the batch: commit, then move the clock on by this many 100 ms.
    Tick(u8),
    /// End the batch by aborting its transaction (the model goes back to its state before it).
    Abort,
    /// Commit, close the store and open it again.
    Restart,
    /// Run the expiry sweep to the end: no expired item may survive it.
    Sweep,
}

#[derive(Arbitrary, Debug)]
struct Stream {
    /// Picks the item size limit.
    size: u8,
    steps: Vec<Step>,
}

/// The write an `Op` stands for, as a worker would submit it.
/// `max`: the longest string APPEND and SETRANGE may make (the RESP bulk limit).
fn write_op(op: &Op, now_ms: u64, model: &ModelStore, max: usize) -> WriteOp {
    let kv = |k: u8, v: &Val| KeyValue::new(&key(k), &v.bytes());
    let resp_expiry = |e: RespExpiry| match e {
        RespExpiry::Keep => Expiry::Keep,
        RespExpiry::Clear => Expiry::Clear,
        RespExpiry::At(at) => Expiry::At(at.get(now_ms)),
    };
    match op {
        Op::Store {
            mode,
            key: k,
            val,
            flags,
            exptime,
            cas,
        } => {
            let cas = cas_value(*cas, *k, model);
            let mode = [
                StoreMode::Set,
                StoreMode::Add,
                StoreMode::Replace,
                StoreMode::Append,
                StoreMode::Prepend,
                StoreMode::Cas,
            ][((u64::from(*mode) * 6) >> 32) as usize];
            WriteOp::Store {
                mode,
                kv: kv(*k, val),
                flags: u32::from(*flags % 4) * 1000,
                exptime: exptime.get(now_ms),
                cas: if mode == StoreMode::Cas { cas } else { 0 },
            }
        }
        Op::Delete(k) => WriteOp::Delete { key: key(*k) },
        Op::Arith {
            key: k,
            incr,
            delta,
            small,
        } => WriteOp::Arith {
            key: key(*k),
            incr: *incr,
            delta: if *small { delta % 200 } else { *delta },
        },
        Op::Touch(k, e) => WriteOp::Touch {
            key: key(*k),
            exptime: e.get(now_ms),
        },
        Op::Gat(ks, e) => WriteOp::Gat {
            keys: ks.iter().map(|&k| key(k)).collect::<Vec<_>>().join(&b' '),
            exptime: e.get(now_ms),
        },
        Op::FlushAll(e) => WriteOp::FlushAll {
            delay: e.get(now_ms),
        },
        Op::Set {
            key: k,
            val,
            cond,
            expiry,
            get,
        } => WriteOp::Set {
            kv: kv(*k, val),
            cond: [SetCond::Always, SetCond::Nx, SetCond::Xx][usize::from(cond % 3)],
            expiry: resp_expiry(*expiry),
            get: *get,
        },
        Op::IncrBy(k, d) => WriteOp::IncrBy {
            key: key(*k),
            delta: *d,
        },
        Op::IncrByFloat(k, d) => WriteOp::IncrByFloat {
            key: key(*k),
            delta: d.to_string().into_bytes(),
        },
        Op::Append(k, v) => WriteOp::Append { kv: kv(*k, v), max },
        Op::SetRange(k, v, off) => WriteOp::SetRange {
            kv: kv(*k, v),
            offset: usize::from(off % 2048),
            max,
        },
        Op::GetDel(k) => WriteOp::GetDel { key: key(*k) },
        Op::GetEx(k, e) => WriteOp::GetEx {
            key: key(*k),
            expiry: resp_expiry(*e),
        },
        Op::MSet(kvs, nx) => WriteOp::MSet {
            kvs: kvs.iter().map(|(k, v)| kv(*k, v)).collect(),
            nx: *nx,
        },
        Op::Del(ks) => WriteOp::Del {
            keys: ks.iter().map(|&k| key(k)).collect(),
        },
        Op::Expire(k, at, cond) => WriteOp::Expire {
            key: key(*k),
            at_ms: at.get(now_ms),
            cond: [
                ExpireCond::Always,
                ExpireCond::Nx,
                ExpireCond::Xx,
                ExpireCond::Gt,
                ExpireCond::Lt,
                ExpireCond::XxLt,
            ][usize::from(cond % 6)],
        },
        Op::Persist(k) => WriteOp::Persist { key: key(*k) },
        Op::Rename(a, b, nx) => WriteOp::Rename {
            from: key(*a),
            to: key(*b),
            nx: *nx,
        },
        Op::Meta(m) => WriteOp::Meta(Box::new(meta_op(m, now_ms, model))),
        Op::SetBit(k, offset, on) => WriteOp::SetBit {
            key: key(*k),
            offset: u64::from(*offset),
            on: *on,
            max,
        },
        Op::BitField(k, steps) => WriteOp::BitField {
            key: key(*k),
            ops: steps
                .iter()
                .map(|b| {
                    let width = if b.signed { 64 } else { 63 };
                    let f = Field {
                        offset: u64::from(b.offset),
                        bits: 1 + u32::from(b.bits) % width,
                        signed: b.signed,
                    };
                    let ow = [Overflow::Wrap, Overflow::Sat, Overflow::Fail]
                        [usize::from(b.overflow % 3)];
                    match b.kind % 3 {
                        0 => FieldOp::Get(f),
                        1 => FieldOp::Set(f, b.value, ow),
                        _ => FieldOp::IncrBy(f, b.value, ow),
                    }
                })
                .collect(),
            max,
        },
        Op::Combine(op, dest, srcs) => {
            let op = [
                BitOpKind::And,
                BitOpKind::Or,
                BitOpKind::Xor,
                BitOpKind::Not,
            ][usize::from(op % 4)];
            let mut srcs: Vec<Vec<u8>> = srcs.iter().map(|&k| key(k)).collect();
            if srcs.is_empty() {
                srcs.push(key(*dest));
            }
            if op == BitOpKind::Not {
                srcs.truncate(1);
            }
            WriteOp::BitOp {
                op,
                dest: key(*dest),
                srcs,
            }
        }
    }
}

/// The live items under the stream's keys, read through `get`.
fn live_items<'s>(
    now_ms: u64,
    mut get: impl FnMut(&[u8]) -> Result<Option<ItemRef<'s>>, StoreError>,
) -> Vec<Option<(ItemMeta, Vec<u8>)>> {
    all_keys()
        .iter()
        .map(|k| {
            get(k)
                .expect("the store reads")
                .filter(|i| !i.meta.is_expired(now_ms))
                .map(|i| (i.meta, i.value.to_vec()))
        })
        .collect()
}

/// An LMDB store in a temporary directory, as the server opens it with `--sync never`.
struct Lmdb {
    dir: tempfile::TempDir,
    store: Option<LmdbStore>,
    /// The writer's CAS counter.
    cas: u64,
}

/// Room for the largest values a stream can build (at most a few hundred KiB), many times over.
const MAP_SIZE: u64 = 8 << 20;

impl Lmdb {
    fn new() -> Lmdb {
        // tmpfs where there is one: a store is opened for every input, and there a fresh map
        // costs no page-cache readahead.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        };
        let dir = dir.expect("a temporary directory");
        let mut db = Lmdb {
            dir,
            store: None,
            cas: 0,
        };
        db.reopen();
        db
    }

    fn reopen(&mut self) {
        self.store = None;
        let (store, persisted) =
            LmdbStore::open(self.dir.path(), MAP_SIZE, 16).expect("the store opens");
        assert_eq!(persisted.cas, self.cas, "the CAS counter did not persist");
        self.store = Some(store);
    }
}

/// `v`'s debug form, cut short (keys run to 512 bytes).
fn short(v: &impl std::fmt::Debug) -> String {
    let s = format!("{v:?}");
    match s.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

/// Applies a stream of writes to the model and to LMDB in batches, as the writer does; both
/// must give the same outcome for every write and hold the same items after every batch.
pub fn command_stream(input: &[u8]) {
    let Ok(stream) = Stream::arbitrary_take_rest(Unstructured::new(input)) else {
        return;
    };
    let item_size_max = [64, 300, 1024, 1 << 20][usize::from(stream.size % 4)];
    let mut now_ms: u64 = 1_700_000_000_000;
    let mut model = ModelStore::default();
    let mut lmdb = Lmdb::new();
    let mut steps = stream.steps.iter().peekable();
    while steps.peek().is_some() {
        let before = model.clone();
        let cas_before = lmdb.cas;
        let store = lmdb.store.clone().expect("the store is open");
        let mut txn = store.write_txn().expect("a write transaction");
        // The writer's housekeeping before every batch: a delayed flush that has come due.
        model.advance(now_ms);
        store
            .run_due_flush(&mut txn, now_ms)
            .expect("the flush runs");
        let ctx = Ctx {
            now_ms,
            item_size_max,
        };
        let mut end = None;
        for step in steps.by_ref() {
            match step {
                Step::Op(op) => {
                    let op = write_op(op, now_ms, &model, item_size_max);
                    let want =
                        semantics::apply(&mut model, &op, ctx).expect("the model never fails");
                    let mut w = store.writer(&mut txn, &mut lmdb.cas);
                    let got = semantics::apply(&mut w, &op, ctx).map_err(|e| e.to_string());
                    assert_eq!(got, Ok(want), "{} at {now_ms}", short(&op));
                    assert_eq!(
                        live_items(now_ms, |k| w.get(k)),
                        live_items(now_ms, |k| model.get(k)),
                        "items after {}",
                        short(&op)
                    );
                }
                Step::Sweep => {
                    store
                        .sweep_expired(&mut txn, now_ms, usize::MAX)
                        .expect("the sweep runs");
                    for k in all_keys() {
                        let item = store.get(&txn, &k).expect("the store reads");
                        assert!(
                            item.is_none_or(|i| !i.meta.is_expired(now_ms)),
                            "the sweep left an expired item under {}",
                            short(&k)
                        );
                    }
                }
                other => {
                    end = Some(other);
                    break;
                }
            }
        }
        if let Some(Step::Abort) = end {
            drop(txn);
            model = before;
            lmdb.cas = cas_before;
        } else {
            if lmdb.cas != cas_before {
                store
                    .put_cas(&mut txn, lmdb.cas)
                    .expect("the counter is stored");
            }
            txn.commit_unlogged().expect("the batch commits");
        }
        drop(store);
        match end {
            Some(Step::Tick(n)) => now_ms += u64::from(*n) * 100,
            Some(Step::Restart) => lmdb.reopen(),
            _ => {}
        }
        let store = lmdb.store.as_ref().expect("the store is open");
        let txn = store.read_txn().expect("a read transaction");
        let items = live_items(now_ms, |k| model.get(k));
        assert_eq!(
            live_items(now_ms, |k| store.get(&txn, k)),
            items,
            "items after the batch ({end:?})"
        );
        // Both hand out the same CAS uniques, and no two live items share one.
        assert_eq!(
            model.clone().next_cas(),
            lmdb.cas + 1,
            "CAS counters differ"
        );
        let mut uniques: Vec<u64> = items.iter().flatten().map(|(m, _)| m.cas).collect();
        uniques.sort_unstable();
        assert!(
            uniques.windows(2).all(|w| w[0] < w[1]),
            "a CAS unique is shared"
        );
        assert!(
            uniques.last().is_none_or(|&c| c <= lmdb.cas),
            "a CAS unique from the future"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// memcached binary protocol

/// Parses `buf` packet by packet as the server does (advancing by `consumed`, then discarding
/// `swallow` bytes), checking every frame's invariants: progress, no reading past the input,
/// exactly one packet per frame once its header is in, the same decision on every longer
/// prefix, and an encoded reply for every error.
pub fn binary_parser(input: &[u8]) {
    let (limits, buf) = mc_limits(input);
    let limits = mc::Limits {
        item_size_max: limits.item_size_max.max(1) * 64,
        ..limits
    };
    let mut off = 0;
    while off < buf.len() {
        let rest = &buf[off..];
        let Ok(p) = binary::parse(rest, &limits) else {
            assert!(
                rest.len() < binary::HEADER_LEN || rest[0] == binary::REQUEST_MAGIC,
                "a non-request header must close, not wait: {rest:?}"
            );
            break;
        };
        assert!(p.consumed <= rest.len(), "consumed past the input: {p:?}");
        if p.frame == binary::Frame::Close {
            break;
        }
        assert!(
            p.consumed >= binary::HEADER_LEN,
            "no whole header used: {p:?}"
        );
        let header = binary::Header::decode(rest).expect("a header");
        let packet = binary::HEADER_LEN + header.body_len as usize;
        let closes = matches!(p.frame, binary::Frame::Error(e) if e.close);
        if !closes {
            assert_eq!(p.consumed + p.swallow, packet, "not one packet: {p:?}");
        }
        match &p.frame {
            binary::Frame::Request(req) => {
                assert_eq!(req.opcode, header.opcode);
                assert_eq!(req.opaque, header.opaque);
            }
            binary::Frame::Error(e) => {
                let mut out = Vec::new();
                binary::encode_error(&mut out, e);
                let reply = binary::Header::decode(&out).expect("a reply header");
                assert_eq!(reply.magic, binary::RESPONSE_MAGIC);
                assert_eq!(out.len(), binary::HEADER_LEN + reply.body_len as usize);
            }
            binary::Frame::Close => unreachable!("handled above"),
        }
        for end in prefix_ends(rest, p.consumed + 16) {
            if let Ok(q) = binary::parse(&rest[..end], &limits) {
                assert_eq!(q, p, "prefix {end} of {rest:?} decided differently");
            }
        }
        if closes {
            break;
        }
        off = off.saturating_add(p.consumed).saturating_add(p.swallow);
    }
}
