//! Sorted-set commands: the table, Redis's score and range argument rules (parsed into
//! `types::zset`'s `ZSetOp`, `ScoreRange`, `LexRange`), and the reads (ZSCORE, ZRANK, ZCOUNT,
//! ZRANGE and its older forms, ZSCAN) answered from a snapshot, members streamed from the map
//! into the reply. The layout, the walks and the rank directory are `types::zset`'s and
//! `types::zrank`'s.

use std::ops::Bound;

use heed::Database;
use heed::types::Bytes;

use super::Cx;
use super::args::{Args, SYNTAX, ScanOpts, glob_match, int_arg, scan_opts};
use super::table::{Cmd, Family, KEY1, R, Spec, W, spec};
use crate::protocol::resp::enc::{ScoreText, fmt_double as fmt_score};
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::{Kind, StoreError};
use crate::types::zrank::{self, RANKED};
use crate::types::zset::{
    AddFlags, KeyBounds, Lex, LexRange, RangeBy, ScoreRange, ZSetOp, count_in, count_ranked,
    elem_entry, ix_entry, prefix_end, rank, read_score, score_key, walk, whole,
};
use crate::types::{CollMeta, MAX_SUB, clamp_range, elem_key};

const ZADD: u8 = 0;
const ZINCRBY: u8 = 1;
const ZREM: u8 = 2;
const ZREMRANGEBYRANK: u8 = 3;
const ZREMRANGEBYSCORE: u8 = 4;
const ZREMRANGEBYLEX: u8 = 5;
const ZPOPMIN: u8 = 6;
const ZPOPMAX: u8 = 7;
const ZSCORE: u8 = 8;
const ZMSCORE: u8 = 9;
const ZRANK: u8 = 10;
const ZREVRANK: u8 = 11;
const ZCARD: u8 = 12;
const ZCOUNT: u8 = 13;
const ZLEXCOUNT: u8 = 14;
const ZRANGE: u8 = 15;
const ZREVRANGE: u8 = 16;
const ZRANGEBYSCORE: u8 = 17;
const ZREVRANGEBYSCORE: u8 = 18;
const ZRANGEBYLEX: u8 = 19;
const ZREVRANGEBYLEX: u8 = 20;
const ZSCAN: u8 = 21;

const fn zset(
    name: &'static str,
    arity: i32,
    write: bool,
    keys: (i32, i32, i32),
    code: u8,
) -> Spec {
    spec(name, arity, write, keys, Cmd::Coll(Family::ZSet, code))
}

pub static COMMANDS: &[Spec] = &[
    zset("zadd", -4, W, KEY1, ZADD),
    zset("zincrby", 4, W, KEY1, ZINCRBY),
    zset("zrem", -3, W, KEY1, ZREM),
    zset("zremrangebyrank", 4, W, KEY1, ZREMRANGEBYRANK),
    zset("zremrangebyscore", 4, W, KEY1, ZREMRANGEBYSCORE),
    zset("zremrangebylex", 4, W, KEY1, ZREMRANGEBYLEX),
    zset("zpopmin", -2, W, KEY1, ZPOPMIN),
    zset("zpopmax", -2, W, KEY1, ZPOPMAX),
    zset("zscore", 3, R, KEY1, ZSCORE),
    zset("zmscore", -3, R, KEY1, ZMSCORE),
    zset("zrank", 3, R, KEY1, ZRANK),
    zset("zrevrank", 3, R, KEY1, ZREVRANK),
    zset("zcard", 2, R, KEY1, ZCARD),
    zset("zcount", 4, R, KEY1, ZCOUNT),
    zset("zlexcount", 4, R, KEY1, ZLEXCOUNT),
    zset("zrange", -4, R, KEY1, ZRANGE),
    zset("zrevrange", -4, R, KEY1, ZREVRANGE),
    zset("zrangebyscore", -4, R, KEY1, ZRANGEBYSCORE),
    zset("zrevrangebyscore", -4, R, KEY1, ZREVRANGEBYSCORE),
    zset("zrangebylex", -4, R, KEY1, ZRANGEBYLEX),
    zset("zrevrangebylex", -4, R, KEY1, ZREVRANGEBYLEX),
    zset("zscan", -3, R, KEY1, ZSCAN),
];

const NOT_FLOAT: &str = "ERR value is not a valid float";

const BAD_SCORE_RANGE: &str = "ERR min or max is not a float";

const BAD_LEX_RANGE: &str = "ERR min or max not valid string range item";

const NOT_POSITIVE: &str = "ERR value is out of range, must be positive";

fn member_too_long() -> String {
    format!("ERR sorted-set member longer than {MAX_SUB} bytes (memkeep's limit)")
}

/// A parsed score argument (ZADD, ZINCRBY), as Redis's `getDoubleFromObject`: the whole text
/// must be a number (no spaces), not NaN, not out of the double range (`1e400`, `1e-400`);
/// `inf`, `+inf`, `-inf` (any case, or spelled `infinity`) are scores.
pub fn parse_score(b: &[u8]) -> Option<f64> {
    let t = std::str::from_utf8(b).ok()?;
    let v: f64 = t.parse().ok()?;
    if v.is_nan() {
        return None;
    }
    let lower = t.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if v.is_infinite() && body != "inf" && body != "infinity" {
        return None; // overflow
    }
    if v == 0.0 {
        // Underflow: a non-zero mantissa that rounded to zero.
        let mantissa = body.split('e').next().unwrap_or("");
        if mantissa.bytes().any(|c| (b'1'..=b'9').contains(&c)) {
            return None;
        }
    }
    Some(v)
}

/// A range end as Redis's `zslParseRange` reads it: `strtod` over the whole text (leading
/// spaces allowed, an empty text is 0, overflow saturates), not NaN.
fn parse_range_float(b: &[u8]) -> Option<f64> {
    if b.is_empty() {
        return Some(0.0);
    }
    let t = std::str::from_utf8(b).ok()?;
    let t = t.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let v: f64 = t.parse().ok()?;
    (!v.is_nan()).then_some(v)
}

/// ZRANGEBYSCORE-style `min max` (`(` for exclusive, `-inf`/`+inf`).
pub fn parse_score_range(min: &[u8], max: &[u8]) -> Option<ScoreRange> {
    let end = |b: &[u8]| match b.first() {
        Some(b'(') => parse_range_float(&b[1..]).map(|v| (v, true)),
        _ => parse_range_float(b).map(|v| (v, false)),
    };
    let (min, minex) = end(min)?;
    let (max, maxex) = end(max)?;
    // No key is above score_key(+inf) + 1 or below score_key(-inf) - 1, so neither wraps.
    let lo = score_key(min) + minex as u64;
    let hi = score_key(max) - maxex as u64;
    Some(ScoreRange { lo, hi })
}

fn parse_lex(b: &[u8]) -> Option<Lex> {
    match b.first()? {
        b'+' if b.len() == 1 => Some(Lex::Max),
        b'-' if b.len() == 1 => Some(Lex::Min),
        b'[' => Some(Lex::Incl(b[1..].to_vec())),
        b'(' => Some(Lex::Excl(b[1..].to_vec())),
        _ => None,
    }
}

pub fn parse_lex_range(min: &[u8], max: &[u8]) -> Option<LexRange> {
    Some(LexRange {
        min: parse_lex(min)?,
        max: parse_lex(max)?,
    })
}

/// A score as ZSCAN shows it: as Redis stores scores in a small sorted set (an integral score
/// within ±2^62 as an integer, else `%.17g`).
pub fn fmt_scan_score(d: f64) -> ScoreText {
    const LIM: f64 = 4611686018427387904.0; // 2^62
    if d.is_finite() && d.fract() == 0.0 && (-LIM..=LIM).contains(&d) {
        ScoreText::integer(d as i64)
    } else {
        fmt_score(d)
    }
}

/// Parses a sorted-set write's arguments (arity is already checked).
pub fn write_op(code: u8, args: Args<'_>) -> Result<ZSetOp, String> {
    let key = args.get(1).to_vec();
    Ok(match code {
        ZADD => {
            let mut flags = AddFlags::default();
            let mut i = 2;
            while i < args.len() {
                if args.is(i, "NX") {
                    flags.nx = true;
                } else if args.is(i, "XX") {
                    flags.xx = true;
                } else if args.is(i, "CH") {
                    flags.ch = true;
                } else if args.is(i, "INCR") {
                    flags.incr = true;
                } else if args.is(i, "GT") {
                    flags.gt = true;
                } else if args.is(i, "LT") {
                    flags.lt = true;
                } else {
                    break;
                }
                i += 1;
            }
            let n = args.len() - i;
            if n == 0 || n % 2 == 1 {
                return Err(SYNTAX.into());
            }
            if flags.nx && flags.xx {
                return Err("ERR XX and NX options at the same time are not compatible".into());
            }
            if (flags.nx && (flags.gt || flags.lt)) || (flags.gt && flags.lt) {
                return Err(
                    "ERR GT, LT, and/or NX options at the same time are not compatible".into(),
                );
            }
            if flags.incr && n > 2 {
                return Err("ERR INCR option supports a single increment-element pair".into());
            }
            let mut pairs = Vec::with_capacity(n / 2);
            for j in (i..args.len()).step_by(2) {
                pairs.push((
                    parse_score(args.get(j)).ok_or(NOT_FLOAT)?,
                    args.get(j + 1).to_vec(),
                ));
            }
            if pairs.iter().any(|(_, m)| m.len() > MAX_SUB) {
                return Err(member_too_long());
            }
            ZSetOp::Add { key, flags, pairs }
        }
        ZINCRBY => {
            let by = parse_score(args.get(2)).ok_or(NOT_FLOAT)?;
            let member = args.get(3);
            if member.len() > MAX_SUB {
                return Err(member_too_long());
            }
            ZSetOp::Add {
                key,
                flags: AddFlags {
                    incr: true,
                    ..AddFlags::default()
                },
                pairs: vec![(by, member.to_vec())],
            }
        }
        ZREM => ZSetOp::Rem {
            key,
            members: (2..args.len()).map(|i| args.get(i).to_vec()).collect(),
        },
        ZREMRANGEBYRANK => ZSetOp::RemRange {
            key,
            by: RangeBy::Rank(int_arg(args.get(2))?, int_arg(args.get(3))?),
        },
        ZREMRANGEBYSCORE => ZSetOp::RemRange {
            key,
            by: RangeBy::Score(parse_score_range(args.get(2), args.get(3)).ok_or(BAD_SCORE_RANGE)?),
        },
        ZREMRANGEBYLEX => ZSetOp::RemRange {
            key,
            by: RangeBy::Lex(parse_lex_range(args.get(2), args.get(3)).ok_or(BAD_LEX_RANGE)?),
        },
        ZPOPMIN | ZPOPMAX => {
            let count = match args.len() {
                2 => None,
                3 => match parse_i64(args.get(2)) {
                    Some(n) if n >= 0 => Some(n as u64),
                    _ => return Err(NOT_POSITIVE.into()),
                },
                _ => return Err(SYNTAX.into()),
            };
            ZSetOp::Pop {
                key,
                max: code == ZPOPMAX,
                count,
            }
        }
        _ => return Err(SYNTAX.into()),
    })
}

fn storage_err(e: impl Into<StoreError>) -> String {
    e.into().resp_reply()
}

/// The sorted set under `key`: None when missing; Err: the error to answer.
fn look(cx: &Cx<'_, '_>, key: &[u8]) -> Result<Option<CollMeta>, String> {
    cx.lookup(key, Kind::ZSet)
}

/// Answers a sorted-set read from the worker's transaction, writing RESP into `out`.
pub fn read(code: u8, args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    if let Err(msg) = read_inner(code, args, cx, out, v3) {
        enc::error(out, &msg);
    }
}

fn read_inner(
    code: u8,
    args: Args<'_>,
    cx: &Cx<'_, '_>,
    out: &mut Vec<u8>,
    v3: bool,
) -> Result<(), String> {
    let key = args.get(1);
    match code {
        ZCARD => enc::int(out, look(cx, key)?.map_or(0, |c| c.len as i64)),
        ZSCORE => {
            let score = match look(cx, key)? {
                Some(c) => read_score(cx, c.id, args.get(2)).map_err(storage_err)?,
                None => None,
            };
            match score {
                Some(s) => enc::double(out, s, v3),
                None => enc::null(out, v3),
            }
        }
        ZMSCORE => {
            let coll = look(cx, key)?;
            let mut reply = Vec::new();
            enc::array(&mut reply, args.len() - 2);
            for i in 2..args.len() {
                let score = match coll {
                    Some(c) => read_score(cx, c.id, args.get(i)).map_err(storage_err)?,
                    None => None,
                };
                match score {
                    Some(s) => enc::double(&mut reply, s, v3),
                    None => enc::null(&mut reply, v3),
                }
            }
            out.extend_from_slice(&reply);
        }
        ZRANK | ZREVRANK => {
            let Some(c) = look(cx, key)? else {
                enc::null(out, v3);
                return Ok(());
            };
            match rank(cx, c, args.get(2)).map_err(storage_err)? {
                Some(r) if code == ZRANK => enc::int(out, r as i64),
                Some(r) => enc::int(out, c.len.saturating_sub(1 + r) as i64),
                None => enc::null(out, v3),
            }
        }
        ZCOUNT | ZLEXCOUNT => {
            let (bounds, db) = if code == ZCOUNT {
                let r = parse_score_range(args.get(2), args.get(3)).ok_or(BAD_SCORE_RANGE)?;
                let Some(c) = look(cx, key)? else {
                    enc::int(out, 0);
                    return Ok(());
                };
                (r.bounds(c.id).map(|b| (c, b)), &cx.store.zscore)
            } else {
                let r = parse_lex_range(args.get(2), args.get(3)).ok_or(BAD_LEX_RANGE)?;
                let Some(c) = look(cx, key)? else {
                    enc::int(out, 0);
                    return Ok(());
                };
                (r.bounds(c.id).map(|b| (c, b)), &cx.store.elems)
            };
            let n = match bounds {
                None => 0,
                Some((c, b)) if code == ZCOUNT && c.head == RANKED => {
                    count_ranked(cx, c, &b).map_err(storage_err)?
                }
                Some((c, b)) => count_in(db, cx.txn, c.id, c.len, &b).map_err(storage_err)?,
            };
            enc::int(out, n as i64);
        }
        ZRANGE | ZREVRANGE | ZRANGEBYSCORE | ZREVRANGEBYSCORE | ZRANGEBYLEX | ZREVRANGEBYLEX => {
            zrange(code, args, cx, out, v3)?
        }
        ZSCAN => zscan(args, cx, out)?,
        _ => return Err(SYNTAX.into()),
    }
    Ok(())
}

/// Streams an array reply of members (and scores) straight into `out`; the header, whose count
/// is known only at the end, is put in front when done.
struct Emit<'o> {
    out: &'o mut Vec<u8>,
    at: usize,
    n: usize,
    scores: bool,
    v3: bool,
}

impl<'o> Emit<'o> {
    fn new(out: &'o mut Vec<u8>, scores: bool, v3: bool) -> Emit<'o> {
        let at = out.len();
        Emit {
            out,
            at,
            n: 0,
            scores,
            v3,
        }
    }

    fn push(&mut self, member: &[u8], score: f64) {
        if self.scores && self.v3 {
            self.out.extend_from_slice(b"*2\r\n");
        }
        enc::bulk(self.out, member);
        if self.scores {
            enc::double(self.out, score, self.v3);
        }
        self.n += 1;
    }

    fn finish(self) {
        let items = if self.scores && !self.v3 {
            self.n * 2
        } else {
            self.n
        };
        let mut hdr = [0u8; 24];
        hdr[0] = b'*';
        let mut b = itoa::Buffer::new();
        let digits = b.format(items).as_bytes();
        hdr[1..1 + digits.len()].copy_from_slice(digits);
        hdr[1 + digits.len()..3 + digits.len()].copy_from_slice(b"\r\n");
        let h = &hdr[..3 + digits.len()];
        let end = self.out.len();
        self.out.resize(end + h.len(), 0);
        self.out.copy_within(self.at..end, self.at + h.len());
        self.out[self.at..self.at + h.len()].copy_from_slice(h);
    }

    /// Drops what was written and answers `msg` instead.
    fn fail(self, msg: &str) {
        self.out.truncate(self.at);
        enc::error(self.out, msg);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum By {
    Rank,
    Score,
    Lex,
}

/// ZRANGE and its older forms (Redis 7's `zrangeGenericCommand`): options first, then the
/// range, then the key.
fn zrange(
    code: u8,
    args: Args<'_>,
    cx: &Cx<'_, '_>,
    out: &mut Vec<u8>,
    v3: bool,
) -> Result<(), String> {
    let (mut by, mut rev) = match code {
        ZREVRANGE => (Some(By::Rank), Some(true)),
        ZRANGEBYSCORE => (Some(By::Score), Some(false)),
        ZREVRANGEBYSCORE => (Some(By::Score), Some(true)),
        ZRANGEBYLEX => (Some(By::Lex), Some(false)),
        ZREVRANGEBYLEX => (Some(By::Lex), Some(true)),
        _ => (None, None),
    };
    let (mut withscores, mut offset, mut limit) = (false, 0i64, -1i64);
    let mut j = 4;
    while j < args.len() {
        let left = args.len() - j - 1;
        if args.is(j, "WITHSCORES") {
            withscores = true;
        } else if args.is(j, "LIMIT") && left >= 2 {
            offset = int_arg(args.get(j + 1))?;
            limit = int_arg(args.get(j + 2))?;
            j += 2;
        } else if rev.is_none() && args.is(j, "REV") {
            rev = Some(true);
        } else if by.is_none() && args.is(j, "BYLEX") {
            by = Some(By::Lex);
        } else if by.is_none() && args.is(j, "BYSCORE") {
            by = Some(By::Score);
        } else {
            return Err(SYNTAX.into());
        }
        j += 1;
    }
    let by = by.unwrap_or(By::Rank);
    let rev = rev.unwrap_or(false);
    if limit != -1 && by == By::Rank {
        return Err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX"
                .into(),
        );
    }
    if withscores && by == By::Lex {
        return Err("ERR syntax error, WITHSCORES not supported in combination with BYLEX".into());
    }
    // Reversed score and lex ranges are given as max, min.
    let (lo_arg, hi_arg) = if rev && by != By::Rank {
        (args.get(3), args.get(2))
    } else {
        (args.get(2), args.get(3))
    };
    enum Range {
        Rank(i64, i64),
        Score(ScoreRange),
        Lex(LexRange),
    }
    let range = match by {
        By::Rank => Range::Rank(int_arg(lo_arg)?, int_arg(hi_arg)?),
        By::Score => Range::Score(parse_score_range(lo_arg, hi_arg).ok_or(BAD_SCORE_RANGE)?),
        By::Lex => Range::Lex(parse_lex_range(lo_arg, hi_arg).ok_or(BAD_LEX_RANGE)?),
    };
    let Some(c) = look(cx, args.get(1))? else {
        enc::array(out, 0);
        return Ok(());
    };
    let emit = Emit::new(out, withscores, v3);
    let done = match range {
        Range::Rank(start, stop) => rank_range(cx, c, start, stop, rev, emit),
        Range::Score(r) => match r.bounds(c.id) {
            None => {
                emit.finish();
                Ok(())
            }
            Some(b) => walk_range(cx, &cx.store.zscore, &b, rev, offset, limit, false, emit),
        },
        Range::Lex(r) => match r.bounds(c.id) {
            None => {
                emit.finish();
                Ok(())
            }
            Some(b) => walk_range(cx, &cx.store.elems, &b, rev, offset, limit, true, emit),
        },
    };
    done.map_err(storage_err)
}

/// ZRANGE by rank: walk from the nearer end of the index, skipping to the first rank.
fn rank_range(
    cx: &Cx<'_, '_>,
    c: CollMeta,
    start: i64,
    stop: i64,
    rev: bool,
    mut emit: Emit<'_>,
) -> Result<(), StoreError> {
    let Some((s, e)) = clamp_range(start, stop, c.len) else {
        emit.finish();
        return Ok(());
    };
    let k = (e - s + 1) as usize;
    let from_far_end = c.len - 1 - e;
    let all = whole(c.id);
    if c.head == RANKED {
        // Seek to the first rank replied (counted from the reply's end), then walk.
        let first = if rev { c.len - 1 - s } else { s };
        let at = zrank::key_at(&cx.store.zscore, cx.txn, c.id, c.len, first)?;
        let from = if rev {
            (
                Bound::Included(c.id.to_be_bytes().to_vec()),
                Bound::Included(at),
            )
        } else {
            (Bound::Included(at), prefix_end(c.id))
        };
        for r in walk(&cx.store.zscore, cx.txn, &from, rev)?.take(k) {
            match r.and_then(|(key, _)| ix_entry(key)) {
                Ok((m, score)) => emit.push(m, score),
                Err(err) => {
                    emit.fail(&storage_err(err));
                    return Ok(());
                }
            }
        }
    } else if s <= from_far_end {
        // Walk in the reply's direction.
        let it = walk(&cx.store.zscore, cx.txn, &all, rev)?;
        for r in it.skip(s as usize).take(k) {
            match r.and_then(|(key, _)| ix_entry(key)) {
                Ok((m, score)) => emit.push(m, score),
                Err(err) => {
                    emit.fail(&storage_err(err));
                    return Ok(());
                }
            }
        }
    } else {
        // Walk from the other end and reply in reverse.
        let it = walk(&cx.store.zscore, cx.txn, &all, !rev)?;
        let mut got: Vec<(&[u8], f64)> = Vec::with_capacity(k);
        for r in it.skip(from_far_end as usize).take(k) {
            match r.and_then(|(key, _)| ix_entry(key)) {
                Ok(entry) => got.push(entry),
                Err(err) => {
                    emit.fail(&storage_err(err));
                    return Ok(());
                }
            }
        }
        for (m, score) in got.into_iter().rev() {
            emit.push(m, score);
        }
    }
    emit.finish();
    Ok(())
}

/// A BYSCORE or BYLEX range: one seek, then `offset` skipped and up to `limit` (< 0: all)
/// replied. A negative offset gives nothing, as in Redis.
#[allow(clippy::too_many_arguments)]
fn walk_range(
    cx: &Cx<'_, '_>,
    db: &Database<Bytes, Bytes>,
    bounds: &KeyBounds,
    rev: bool,
    offset: i64,
    limit: i64,
    elems: bool,
    mut emit: Emit<'_>,
) -> Result<(), StoreError> {
    if offset < 0 {
        emit.finish();
        return Ok(());
    }
    let take = if limit < 0 {
        usize::MAX
    } else {
        limit as usize
    };
    let it = walk(db, cx.txn, bounds, rev)?;
    for r in it.skip(offset as usize).take(take) {
        let entry = r.and_then(|(k, v)| if elems { elem_entry(k, v) } else { ix_entry(k) });
        match entry {
            Ok((m, score)) => emit.push(m, score),
            Err(err) => {
                emit.fail(&storage_err(err));
                return Ok(());
            }
        }
    }
    emit.finish();
    Ok(())
}

/// ZSCAN key cursor [MATCH pattern] [COUNT n]: members in byte order, `n` examined per call;
/// the cursor names the member to resume after (kept server-side).
fn zscan(args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>) -> Result<(), String> {
    let cursor = std::str::from_utf8(args.get(2))
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or("ERR invalid cursor")?;
    let Some(c) = look(cx, args.get(1))? else {
        out.extend_from_slice(b"*2\r\n$1\r\n0\r\n*0\r\n");
        return Ok(());
    };
    let ScanOpts { pattern, count, .. } = scan_opts(args, 3, false)?;
    let lock = || cx.cursors.lock().unwrap_or_else(|p| p.into_inner());
    let start = if cursor == 0 {
        Bound::Included(c.id.to_be_bytes().to_vec())
    } else {
        match lock().get(cursor) {
            Some(m) if m.len() <= MAX_SUB => Bound::Excluded(elem_key(c.id, &m)),
            _ => return Err("ERR invalid cursor".into()),
        }
    };
    let bounds = (start, prefix_end(c.id));
    let it = walk(&cx.store.elems, cx.txn, &bounds, false).map_err(storage_err)?;
    let mut found: Vec<(&[u8], f64)> = Vec::new();
    let mut last: Option<&[u8]> = None;
    let mut exhausted = true;
    for (examined, r) in it.enumerate() {
        let (k, v) = r.map_err(storage_err)?;
        if examined == count {
            exhausted = false;
            break;
        }
        let (m, score) = elem_entry(k, v).map_err(storage_err)?;
        last = Some(m);
        if pattern.is_none_or(|p| glob_match(p, m)) {
            found.push((m, score));
        }
    }
    let next = match (exhausted, last) {
        (false, Some(m)) => lock().insert(m.to_vec()),
        _ => 0,
    };
    enc::array(out, 2);
    enc::bulk(out, itoa::Buffer::new().format(next).as_bytes());
    enc::array(out, found.len() * 2);
    for (m, score) in found {
        enc::bulk(out, m);
        enc::bulk(out, fmt_scan_score(score).as_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(d: f64) -> String {
        String::from_utf8(fmt_score(d).as_bytes().to_vec()).expect("ascii")
    }

    #[test]
    fn scores_format_like_redis_7_0() {
        // Checked against redis-server 7.0.15 (ZSCORE / ZRANGE WITHSCORES in RESP2).
        let cases: &[(f64, &str)] = &[
            (1.0, "1"),
            (1.5, "1.5"),
            (0.1, "0.10000000000000001"),
            (0.30000000000000004, "0.30000000000000004"),
            (1e20, "1e+20"),
            (1e16, "10000000000000000"),
            (1e17, "1e+17"),
            (1e-5, "1.0000000000000001e-05"),
            (0.0001, "0.0001"),
            (123456789.125, "123456789.125"),
            (3.0000000000000004, "3.0000000000000004"),
            (4611686018427387904.0, "4.6116860184273879e+18"),
            ((1u64 << 50) as f64 + 0.25, "1125899906842624.2"),
            ((1u64 << 50) as f64 + 0.75, "1125899906842624.8"),
            (-2.5, "-2.5"),
            (-1e-300, "-1e-300"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (0.0, "0"),
            (-7.0, "-7"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "4.9406564584124654e-324"),
        ];
        for &(d, want) in cases {
            assert_eq!(g(d), want, "{d:e}");
        }
        let scan = |d: f64| String::from_utf8(fmt_scan_score(d).as_bytes().to_vec()).unwrap();
        assert_eq!(scan(1e17), "100000000000000000");
        assert_eq!(scan(4611686018427387904.0), "4611686018427387904");
        assert_eq!(scan(9223372036854775808.0), "9.2233720368547758e+18");
        assert_eq!(scan(0.5), "0.5");
        assert_eq!(scan(f64::NEG_INFINITY), "-inf");
    }

    #[test]
    fn score_arguments_parse_like_redis() {
        assert_eq!(parse_score(b"1.5"), Some(1.5));
        assert_eq!(parse_score(b"+1"), Some(1.0));
        assert_eq!(parse_score(b".5"), Some(0.5));
        assert_eq!(parse_score(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_score(b"Infinity"), Some(f64::INFINITY));
        assert_eq!(parse_score(b"0e10"), Some(0.0));
        assert_eq!(parse_score(b"4e-320"), Some(4e-320));
        for bad in [
            &b"nan"[..],
            b"1e400",
            b"1e-400",
            b" 1",
            b"1 ",
            b"",
            b"x",
            b"1e",
        ] {
            assert_eq!(parse_score(bad), None, "{bad:?}");
        }
        let r = parse_score_range(b"(1", b"+inf").expect("valid");
        assert_eq!(r.lo, score_key(1.0) + 1);
        assert_eq!(r.hi, score_key(f64::INFINITY));
        assert_eq!(
            parse_score_range(b"", b" 2").map(|r| r.lo),
            Some(score_key(0.0))
        );
        assert!(parse_score_range(b"1e400", b"(-1e400").is_some());
        assert!(parse_score_range(b"nan", b"1").is_none());
        assert!(parse_score_range(b"(x", b"1").is_none());
        let r = parse_score_range(b"(2", b"2").expect("valid");
        assert!(r.lo > r.hi);
    }

    #[test]
    fn lex_ranges_follow_redis() {
        let r = |a: &[u8], b: &[u8]| parse_lex_range(a, b).expect("valid");
        assert!(r(b"-", b"-").is_empty());
        assert!(r(b"+", b"+").is_empty());
        assert!(r(b"+", b"-").is_empty());
        assert!(!r(b"-", b"+").is_empty());
        assert!(!r(b"[a", b"[a").is_empty());
        assert!(r(b"(a", b"[a").is_empty());
        assert!(r(b"[b", b"[a").is_empty());
        assert!(!r(b"[", b"+").is_empty());
        assert!(parse_lex_range(b"a", b"+").is_none());
        assert!(parse_lex_range(b"-x", b"+").is_none());
        assert!(parse_lex_range(b"", b"+").is_none());
    }
}
