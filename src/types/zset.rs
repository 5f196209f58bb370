//! Sorted sets: each member is an element record `elems[id ++ member] = score` (the f64's bits,
//! 8 bytes big-endian) and an index record `zscore[id ++ score_key(score) ++ member] = ""`,
//! always written and deleted together. `score_key` maps a score to 8 bytes whose byte order is
//! the numeric order (-0.0 is stored as 0.0; NaN never is), so the index is in Redis's order:
//! by score, then by member bytes.
//!
//! Complexity (n members, k returned; LMDB keeps no ranks, so a position is found by walking):
//! - ZADD, ZINCRBY, ZREM, ZSCORE, ZMSCORE: O(log n) per member. ZCARD: O(1) (the metadata).
//! - ZRANGE by rank, ZREVRANGE: one cursor walk from the nearer end, skipping to the first
//!   rank: O(min(start, n - stop) + k); `ZRANGE z 0 49` reads 50 index entries.
//! - BYSCORE forms (ZRANGEBYSCORE, ZREVRANGEBYSCORE, ZRANGE .. BYSCORE [REV]): the cursor seeks
//!   straight to the first score in range: O(log n + offset + k).
//! - BYLEX forms: the same seek over the element records, which are in member order: O(log n +
//!   offset + k). Redis defines lex ranges only when all scores are equal; memkeep then gives
//!   the same answer, and with mixed scores answers in member order.
//! - ZRANK, ZREVRANK: walk from both ends at once until the member is reached:
//!   O(min(rank, n - rank)). ZCOUNT, ZLEXCOUNT: count inside the range or outside it, whichever
//!   ends first: O(log n + min(k, n - k)).
//! - ZREMRANGEBYRANK/BYSCORE/BYLEX, ZPOPMIN/ZPOPMAX: the same walks, O(log n) per removal.
//! - ZSCAN: `COUNT` element records per call, in member order, from a server-side cursor.
//!
//! Limits and differences from Redis 7.0 (deliberate):
//! - A member is at most `MAX_SUB` (495) bytes (LMDB's key limit less the id and score): ZADD
//!   and ZINCRBY answer `ERR sorted-set member longer than 495 bytes (memkeep's limit)`; reads
//!   and removals of such a member find nothing.
//! - Score arguments parse as Redis's `strtod` does, except hexadecimal floats (`0x10`), which
//!   memkeep rejects.
//! - ZSCAN walks members in byte order (Redis: score order for small sets, hash order for big
//!   ones); its cursors are server-side resume points, so an unknown cursor is `ERR invalid
//!   cursor`. Its scores are formatted as Redis formats a small set's (an integral score within
//!   ±2^62 as an integer, else `%.17g`).
//! - A score of -0 is stored as 0 (Redis keeps -0 in sets of more than 128 members and prints
//!   `-0`; in small sets it prints `0`, as memkeep always does).
//! - Scores are formatted as Redis 7.0 replies with them (`%.17g`, `enc::fmt_double`), in reads
//!   and in write replies (ZINCRBY, ZADD INCR, ZPOPMIN/ZPOPMAX) alike.

use std::ops::Bound;

use heed::types::Bytes;
use heed::{Database, RoRange, RoRevRange, RoTxn};

use super::zrank::{self, RANKED};
use super::{CollMeta, Found, MAX_SUB, ReadCx, Tx, clamp_range, elem_key};
use crate::command::Outcome;
use crate::commands::{
    Args, Cmd, Family, KEY1, R, SYNTAX, ScanOpts, Spec, W, glob_match, int_arg, scan_opts, spec,
};
use crate::protocol::resp::enc::{ScoreText, fmt_double as fmt_score};
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::ItemMeta;
use crate::storage::lmdb::LmdbWrite;
use crate::storage::{Kind, StoreError};

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
const NAN_SCORE: &str = "ERR resulting score is not a number (NaN)";
const BAD_SCORE_RANGE: &str = "ERR min or max is not a float";
const BAD_LEX_RANGE: &str = "ERR min or max not valid string range item";
const NOT_POSITIVE: &str = "ERR value is out of range, must be positive";

fn member_too_long() -> String {
    format!("ERR sorted-set member longer than {MAX_SUB} bytes (memkeep's limit)")
}

/// ZADD's options (ZINCRBY is ZADD INCR).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddFlags {
    pub nx: bool,
    pub xx: bool,
    pub gt: bool,
    pub lt: bool,
    pub ch: bool,
    pub incr: bool,
}

/// Scores from `lo` to `hi` inclusive, as score keys (`score_key`); empty when lo > hi.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreRange {
    pub lo: u64,
    pub hi: u64,
}

/// One end of a lex range: `-`, `+`, `[member` or `(member`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lex {
    Min,
    Max,
    Incl(Vec<u8>),
    Excl(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LexRange {
    pub min: Lex,
    pub max: Lex,
}

/// Which members a ZREMRANGEBY* removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeBy {
    Rank(i64, i64),
    Score(ScoreRange),
    Lex(LexRange),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ZSetOp {
    /// ZADD and ZINCRBY: (score, member) pairs, in order.
    Add {
        key: Vec<u8>,
        flags: AddFlags,
        pairs: Vec<(f64, Vec<u8>)>,
    },
    Rem {
        key: Vec<u8>,
        members: Vec<Vec<u8>>,
    },
    RemRange {
        key: Vec<u8>,
        by: RangeBy,
    },
    /// ZPOPMIN/ZPOPMAX; `count` None: one member.
    Pop {
        key: Vec<u8>,
        max: bool,
        count: Option<u64>,
    },
}

// ---------------------------------------------------------------------------------------------
// Scores

/// A score as 8 bytes (big-endian) whose order is the numeric order: positive scores get the
/// sign bit set, negative ones all bits flipped. -0.0 maps as 0.0.
pub fn score_key(d: f64) -> u64 {
    let d = if d == 0.0 { 0.0 } else { d };
    let b = d.to_bits();
    if b >> 63 == 0 { b | (1 << 63) } else { !b }
}

/// The inverse of `score_key`.
pub fn key_score(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// An element record's value.
fn score_bytes(d: f64) -> [u8; 8] {
    let d = if d == 0.0 { 0.0 } else { d };
    d.to_bits().to_be_bytes()
}

fn score_from(v: &[u8]) -> Option<f64> {
    let b: [u8; 8] = v.try_into().ok()?;
    Some(f64::from_bits(u64::from_be_bytes(b)))
}

fn corrupt() -> StoreError {
    StoreError::damaged("sorted-set element has a malformed score")
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

impl LexRange {
    /// Redis's `zslIsInLexRange` emptiness test: min above max, or equal with an open end.
    fn is_empty(&self) -> bool {
        use std::cmp::Ordering::*;
        let rank = |l: &Lex| match l {
            Lex::Min => 0,
            Lex::Max => 2,
            _ => 1,
        };
        let open = |l: &Lex| !matches!(l, Lex::Incl(_));
        let cmp = match (&self.min, &self.max) {
            (Lex::Incl(a) | Lex::Excl(a), Lex::Incl(b) | Lex::Excl(b)) => a.cmp(b),
            (a, b) => rank(a).cmp(&rank(b)),
        };
        cmp == Greater || (cmp == Equal && (open(&self.min) || open(&self.max)))
    }

    /// The element-record key bounds of this range in collection `id`; None when empty.
    /// A bound longer than any member (> MAX_SUB) is cut to MAX_SUB bytes: members are never
    /// longer, so "above the cut" is the same set as "above the bound".
    fn bounds(&self, id: u64) -> Option<KeyBounds> {
        if self.is_empty() {
            return None;
        }
        let start = match &self.min {
            Lex::Min => Bound::Included(id.to_be_bytes().to_vec()),
            Lex::Max => return None,
            Lex::Incl(v) if v.len() <= MAX_SUB => Bound::Included(elem_key(id, v)),
            Lex::Incl(v) | Lex::Excl(v) => {
                Bound::Excluded(elem_key(id, &v[..v.len().min(MAX_SUB)]))
            }
        };
        let end = match &self.max {
            Lex::Max => prefix_end(id),
            Lex::Min => return None,
            Lex::Excl(v) if v.len() <= MAX_SUB => Bound::Excluded(elem_key(id, v)),
            Lex::Incl(v) | Lex::Excl(v) => {
                Bound::Included(elem_key(id, &v[..v.len().min(MAX_SUB)]))
            }
        };
        Some((start, end))
    }
}

impl ScoreRange {
    /// The index key bounds of this range in collection `id`; None when empty.
    fn bounds(&self, id: u64) -> Option<KeyBounds> {
        if self.lo > self.hi {
            return None;
        }
        let start = Bound::Included(ix_prefix(id, self.lo));
        let end = match self.hi.checked_add(1) {
            Some(h) => Bound::Excluded(ix_prefix(id, h)),
            None => prefix_end(id),
        };
        Some((start, end))
    }
}

/// A key range in one database: (start, end).
type KeyBounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// `id ++ score key`: where the index entries of one score start.
fn ix_prefix(id: u64, sk: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&sk.to_be_bytes());
    k
}

/// The index key of `member` with score key `sk` in collection `id`.
fn ix_key(id: u64, sk: u64, member: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + member.len());
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&sk.to_be_bytes());
    k.extend_from_slice(member);
    k
}

/// Just past every record of collection `id`.
fn prefix_end(id: u64) -> Bound<Vec<u8>> {
    match id.checked_add(1) {
        Some(n) => Bound::Excluded(n.to_be_bytes().to_vec()),
        None => Bound::Unbounded,
    }
}

/// Every record of collection `id`.
fn whole(id: u64) -> KeyBounds {
    (Bound::Included(id.to_be_bytes().to_vec()), prefix_end(id))
}

/// The entries of an index record: (member, score).
fn ix_entry(k: &[u8]) -> Result<(&[u8], f64), StoreError> {
    let sk = k
        .get(8..16)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(corrupt)?;
    Ok((&k[16..], key_score(u64::from_be_bytes(sk))))
}

/// The entries of an element record: (member, score).
fn elem_entry<'a>(k: &'a [u8], v: &[u8]) -> Result<(&'a [u8], f64), StoreError> {
    Ok((&k[8..], score_from(v).ok_or_else(corrupt)?))
}

// ---------------------------------------------------------------------------------------------
// Score text

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

// ---------------------------------------------------------------------------------------------
// Parsing writes

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

// ---------------------------------------------------------------------------------------------
// Cursor walks

/// A cursor walk over one database, forwards or backwards.
enum Walk<'t> {
    Fwd(RoRange<'t, Bytes, Bytes>),
    Rev(RoRevRange<'t, Bytes, Bytes>),
}

impl<'t> Iterator for Walk<'t> {
    type Item = Result<(&'t [u8], &'t [u8]), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let r = match self {
            Walk::Fwd(it) => it.next(),
            Walk::Rev(it) => it.next(),
        };
        r.map(|r| r.map_err(StoreError::from))
    }
}

fn walk<'t>(
    db: &Database<Bytes, Bytes>,
    txn: &'t RoTxn<'_>,
    bounds: &KeyBounds,
    rev: bool,
) -> Result<Walk<'t>, StoreError> {
    let range = (
        bounds.0.as_ref().map(Vec::as_slice),
        bounds.1.as_ref().map(Vec::as_slice),
    );
    Ok(if rev {
        Walk::Rev(db.rev_range(txn, &range)?)
    } else {
        Walk::Fwd(db.range(txn, &range)?)
    })
}

/// The number of records within `bounds` in collection `id` (of `len` records): counts inside
/// and outside the range at once and stops at whichever ends first, O(min(k, n - k)).
fn count_in(
    db: &Database<Bytes, Bytes>,
    txn: &RoTxn<'_>,
    id: u64,
    len: u64,
    bounds: &KeyBounds,
) -> Result<u64, StoreError> {
    let flip = |b: &Bound<Vec<u8>>| match b {
        Bound::Included(k) => Bound::Excluded(k.clone()),
        Bound::Excluded(k) => Bound::Included(k.clone()),
        Bound::Unbounded => Bound::Unbounded,
    };
    let mut inside = walk(db, txn, bounds, false)?;
    let below_bounds = (Bound::Included(id.to_be_bytes().to_vec()), flip(&bounds.0));
    let above_bounds = (flip(&bounds.1), prefix_end(id));
    let mut below = Some(walk(db, txn, &below_bounds, false)?);
    let mut above = if matches!(bounds.1, Bound::Unbounded) {
        None
    } else {
        Some(walk(db, txn, &above_bounds, false)?)
    };
    let (mut n_in, mut n_out) = (0u64, 0u64);
    loop {
        match inside.next() {
            None => return Ok(n_in),
            Some(r) => {
                r?;
                n_in += 1;
            }
        }
        loop {
            let side = match (&mut below, &mut above) {
                (Some(w), _) => (w, true),
                (None, Some(w)) => (w, false),
                (None, None) => return Ok(len.saturating_sub(n_out)),
            };
            match side.0.next() {
                Some(r) => {
                    r?;
                    n_out += 1;
                    break;
                }
                None if side.1 => below = None,
                None => above = None,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Writes

fn score_of(tx: &mut Tx<'_, '_, '_>, id: u64, member: &[u8]) -> Result<Option<f64>, StoreError> {
    if member.len() > MAX_SUB {
        return Ok(None);
    }
    match tx.elem_get(id, member)? {
        None => Ok(None),
        Some(v) => score_from(&v).map(Some).ok_or_else(corrupt),
    }
}

fn put_member(
    tx: &mut Tx<'_, '_, '_>,
    coll: &CollMeta,
    member: &[u8],
    score: f64,
) -> Result<(), StoreError> {
    tx.elem_put(coll.id, member, &score_bytes(score))?;
    let (store, txn) = tx.store_txn();
    let ix = ix_key(coll.id, score_key(score), member);
    store.zscore.put(txn, &ix, &[])?;
    if coll.head == RANKED {
        zrank::inserted(&store.zscore, txn, coll.id, &ix)?;
    }
    Ok(())
}

fn del_member(
    tx: &mut Tx<'_, '_, '_>,
    coll: &CollMeta,
    member: &[u8],
    score: f64,
) -> Result<(), StoreError> {
    tx.elem_del(coll.id, member)?;
    let (store, txn) = tx.store_txn();
    let ix = ix_key(coll.id, score_key(score), member);
    if store.zscore.delete(txn, &ix)? && coll.head == RANKED {
        zrank::removed(&store.zscore, txn, coll.id, &ix)?;
    }
    Ok(())
}

/// The sorted set under `key` for a write, with its rank directory: a set stored by a memkeep
/// that kept none gets one now (`zrank::build`), saved with its metadata at once.
fn find_ranked(tx: &mut Tx<'_, '_, '_>, key: &[u8]) -> Result<Found, StoreError> {
    let found = tx.find(key, Kind::ZSet)?;
    let Found::Coll(meta, mut coll) = found else {
        return Ok(found);
    };
    if coll.head != RANKED {
        let (store, txn) = tx.store_txn();
        zrank::build(&store.zscore, txn, coll.id)?;
        coll.head = RANKED;
        tx.save(key, &meta, &coll)?;
        return Ok(Found::Coll(meta, coll));
    }
    Ok(found)
}

/// A new, empty sorted set (its directory kept from the start).
fn create(tx: &mut Tx<'_, '_, '_>) -> Result<(ItemMeta, CollMeta), StoreError> {
    let (meta, mut coll) = tx.create(Kind::ZSet)?;
    coll.head = RANKED;
    Ok((meta, coll))
}

/// Up to `take` (member, score) of the index within `bounds`, after skipping `skip`.
fn collect_ix(
    tx: &mut Tx<'_, '_, '_>,
    bounds: &KeyBounds,
    rev: bool,
    skip: u64,
    take: u64,
) -> Result<Vec<(Vec<u8>, f64)>, StoreError> {
    let (store, txn) = tx.store_txn();
    let mut found = Vec::new();
    for r in walk(&store.zscore, txn, bounds, rev)?
        .skip(skip as usize)
        .take(take as usize)
    {
        let (k, _) = r?;
        let (m, s) = ix_entry(k)?;
        found.push((m.to_vec(), s));
    }
    Ok(found)
}

/// Runs a sorted-set write in the writer's transaction.
pub fn apply(w: &mut LmdbWrite<'_, '_>, op: &ZSetOp, now: u64) -> Result<Outcome, StoreError> {
    let mut tx = Tx { w, now };
    match op {
        ZSetOp::Add { key, flags, pairs } => add(&mut tx, key, *flags, pairs),
        ZSetOp::Rem { key, members } => {
            let (meta, mut coll) = match find_ranked(&mut tx, key)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Int(0)),
                Found::Coll(m, c) => (m, c),
            };
            let mut removed = 0;
            for m in members {
                if let Some(s) = score_of(&mut tx, coll.id, m)? {
                    del_member(&mut tx, &coll, m, s)?;
                    coll.len -= 1;
                    removed += 1;
                }
            }
            if removed > 0 {
                tx.save(key, &meta, &coll)?;
            }
            Ok(Outcome::Int(removed))
        }
        ZSetOp::RemRange { key, by } => {
            let (meta, mut coll) = match find_ranked(&mut tx, key)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Int(0)),
                Found::Coll(m, c) => (m, c),
            };
            let id = coll.id;
            let victims = match by {
                RangeBy::Rank(start, stop) => match clamp_range(*start, *stop, coll.len) {
                    None => Vec::new(),
                    Some((s, e)) if coll.head == RANKED => {
                        let (store, txn) = tx.store_txn();
                        let first = zrank::key_at(&store.zscore, txn, id, coll.len, s)?;
                        let from = (Bound::Included(first), prefix_end(id));
                        collect_ix(&mut tx, &from, false, 0, e - s + 1)?
                    }
                    Some((s, e)) => {
                        let k = e - s + 1;
                        // Walk from the nearer end.
                        if s <= coll.len - 1 - e {
                            collect_ix(&mut tx, &whole(id), false, s, k)?
                        } else {
                            collect_ix(&mut tx, &whole(id), true, coll.len - 1 - e, k)?
                        }
                    }
                },
                RangeBy::Score(r) => match r.bounds(id) {
                    None => Vec::new(),
                    Some(b) => collect_ix(&mut tx, &b, false, 0, u64::MAX)?,
                },
                RangeBy::Lex(r) => match r.bounds(id) {
                    None => Vec::new(),
                    Some(b) => {
                        let (store, txn) = tx.store_txn();
                        let mut found = Vec::new();
                        for e in walk(&store.elems, txn, &b, false)? {
                            let (k, v) = e?;
                            let (m, s) = elem_entry(k, v)?;
                            found.push((m.to_vec(), s));
                        }
                        found
                    }
                },
            };
            for (m, s) in &victims {
                del_member(&mut tx, &coll, m, *s)?;
            }
            coll.len = coll.len.saturating_sub(victims.len() as u64);
            if !victims.is_empty() {
                tx.save(key, &meta, &coll)?;
            }
            Ok(Outcome::Int(victims.len() as i64))
        }
        ZSetOp::Pop { key, max, count } => {
            let (meta, mut coll) = match find_ranked(&mut tx, key)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Array(Vec::new())),
                Found::Coll(m, c) => (m, c),
            };
            let n = count.unwrap_or(1).min(coll.len);
            let popped = collect_ix(&mut tx, &whole(coll.id), *max, 0, n)?;
            let mut pairs = Vec::with_capacity(popped.len());
            for (m, s) in popped {
                del_member(&mut tx, &coll, &m, s)?;
                coll.len -= 1;
                pairs.push((Outcome::Bulk(m), Outcome::Double(s)));
            }
            if !pairs.is_empty() {
                tx.save(key, &meta, &coll)?;
            }
            // Redis 7: with a count, RESP3 nests each pair; without one, the reply is flat.
            Ok(match count {
                Some(_) => Outcome::Pairs(pairs),
                None => Outcome::Array(pairs.into_iter().flat_map(|(m, s)| [m, s]).collect()),
            })
        }
    }
}

/// ZADD (and ZINCRBY): Redis's `zsetAdd` per pair.
fn add(
    tx: &mut Tx<'_, '_, '_>,
    key: &[u8],
    f: AddFlags,
    pairs: &[(f64, Vec<u8>)],
) -> Result<Outcome, StoreError> {
    let (meta, mut coll) = match find_ranked(tx, key)? {
        Found::WrongType => return Ok(Outcome::WrongType),
        Found::Missing if f.xx => {
            return Ok(if f.incr {
                Outcome::Nil
            } else {
                Outcome::Int(0)
            });
        }
        Found::Missing => create(tx)?,
        Found::Coll(m, c) => (m, c),
    };
    let (mut added, mut updated, mut processed) = (0i64, 0i64, 0i64);
    let mut last = 0.0;
    let mut failed = None;
    for (score, member) in pairs {
        let mut score = *score;
        match score_of(tx, coll.id, member)? {
            Some(cur) => {
                if f.nx {
                    continue;
                }
                if f.incr {
                    score += cur;
                    if score.is_nan() {
                        failed = Some(NAN_SCORE);
                        break;
                    }
                }
                if (f.lt && score >= cur) || (f.gt && score <= cur) {
                    continue;
                }
                processed += 1;
                last = score;
                if score != cur {
                    del_member(tx, &coll, member, cur)?;
                    put_member(tx, &coll, member, score)?;
                    updated += 1;
                }
            }
            None if f.xx => {}
            None => {
                put_member(tx, &coll, member, score)?;
                coll.len += 1;
                added += 1;
                processed += 1;
                last = score;
            }
        }
    }
    if added + updated > 0 {
        tx.save(key, &meta, &coll)?;
    }
    if let Some(msg) = failed {
        return Ok(Outcome::Err(msg));
    }
    Ok(if f.incr {
        if processed > 0 {
            Outcome::Double(if last == 0.0 { 0.0 } else { last })
        } else {
            Outcome::Nil
        }
    } else if f.ch {
        Outcome::Int(added + updated)
    } else {
        Outcome::Int(added)
    })
}

// ---------------------------------------------------------------------------------------------
// Reads

fn storage_err(e: impl Into<StoreError>) -> String {
    e.into().resp_reply()
}

/// The sorted set under `key`: None when missing; Err: the error to answer.
fn look(cx: &ReadCx<'_, '_>, key: &[u8]) -> Result<Option<CollMeta>, String> {
    cx.lookup(key, Kind::ZSet)
}

fn read_score(cx: &ReadCx<'_, '_>, id: u64, member: &[u8]) -> Result<Option<f64>, StoreError> {
    if member.len() > MAX_SUB {
        return Ok(None);
    }
    match cx.store.elems.get(cx.txn, &elem_key(id, member))? {
        None => Ok(None),
        Some(v) => score_from(v).map(Some).ok_or_else(corrupt),
    }
}

/// Answers a sorted-set read from the worker's transaction, writing RESP into `out`.
pub fn read(code: u8, args: Args<'_>, cx: &ReadCx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    if let Err(msg) = read_inner(code, args, cx, out, v3) {
        enc::error(out, &msg);
    }
}

fn read_inner(
    code: u8,
    args: Args<'_>,
    cx: &ReadCx<'_, '_>,
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

/// The rank of `member`: from the rank directory, or (a set without one) walking from both
/// ends at once, O(min(rank, n - rank)).
fn rank(cx: &ReadCx<'_, '_>, c: CollMeta, member: &[u8]) -> Result<Option<u64>, StoreError> {
    let Some(score) = read_score(cx, c.id, member)? else {
        return Ok(None);
    };
    let target = ix_key(c.id, score_key(score), member);
    if c.head == RANKED {
        return zrank::below(&cx.store.zscore, cx.txn, c.id, c.len, &target).map(Some);
    }
    let before = (
        Bound::Included(c.id.to_be_bytes().to_vec()),
        Bound::Excluded(target.clone()),
    );
    let after = (Bound::Excluded(target), prefix_end(c.id));
    let mut fwd = walk(&cx.store.zscore, cx.txn, &before, false)?;
    let mut bwd = walk(&cx.store.zscore, cx.txn, &after, true)?;
    let (mut n_before, mut n_after) = (0u64, 0u64);
    loop {
        match fwd.next() {
            None => return Ok(Some(n_before)),
            Some(r) => {
                r?;
                n_before += 1;
            }
        }
        match bwd.next() {
            None => return Ok(Some(c.len.saturating_sub(1 + n_after))),
            Some(r) => {
                r?;
                n_after += 1;
            }
        }
    }
}

/// ZCOUNT from the rank directory: the entries below the range's end less those below its
/// start (a score range's bounds are `Included(id ++ lo)` and `Excluded(id ++ hi + 1)` or the
/// set's end).
fn count_ranked(cx: &ReadCx<'_, '_>, c: CollMeta, b: &KeyBounds) -> Result<u64, StoreError> {
    let below = |k: &[u8]| zrank::below(&cx.store.zscore, cx.txn, c.id, c.len, k);
    let hi = match &b.1 {
        Bound::Excluded(k) if k.len() > 8 => below(k)?,
        _ => c.len,
    };
    let lo = match &b.0 {
        Bound::Included(k) if k.len() > 8 => below(k)?,
        _ => 0,
    };
    Ok(hi.saturating_sub(lo))
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
    cx: &ReadCx<'_, '_>,
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
    cx: &ReadCx<'_, '_>,
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
    cx: &ReadCx<'_, '_>,
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
fn zscan(args: Args<'_>, cx: &ReadCx<'_, '_>, out: &mut Vec<u8>) -> Result<(), String> {
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
    use crate::storage::WriteView;
    use crate::storage::lmdb::{LmdbStore, ZRANK_DIR};

    /// The sorted set under `key` as the store holds it.
    fn coll_of(store: &LmdbStore, txn: &RoTxn, key: &[u8]) -> (ItemMeta, CollMeta) {
        let bytes = store.items.get(txn, key).expect("get").expect("present");
        let it = crate::storage::item::decode(bytes).expect("decode");
        (it.meta, CollMeta::decode(it.value).expect("meta"))
    }

    #[test]
    fn a_set_without_a_rank_directory_gets_one_at_its_first_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = LmdbStore::open(dir.path(), 64 << 20, 16).expect("open");
        let mut cas = 1;
        let mut txn = store.write_txn().expect("txn");
        let add = |n: std::ops::Range<u32>| ZSetOp::Add {
            key: b"z".to_vec(),
            flags: AddFlags::default(),
            pairs: n
                .map(|i| (f64::from(i % 97), format!("m{i}").into_bytes()))
                .collect(),
        };
        apply(&mut store.writer(&mut txn, &mut cas), &add(0..700), 0).expect("zadd");
        let (meta, mut coll) = coll_of(&store, &txn, b"z");
        assert_eq!((coll.len, coll.head), (700, RANKED));
        // Make it a set an older memkeep wrote: no directory, head 0.
        let dir_prefix = (coll.id | ZRANK_DIR).to_be_bytes();
        let records: Vec<Vec<u8>> = store
            .zscore
            .prefix_iter(&txn, &dir_prefix[..])
            .expect("iter")
            .map(|r| r.expect("record").0.to_vec())
            .collect();
        assert!(records.len() >= 3, "{} chunks", records.len());
        for k in records {
            store.zscore.delete(&mut txn, &k).expect("delete");
        }
        coll.head = 0;
        store
            .writer(&mut txn, &mut cas)
            .put(b"z", &meta, &[&coll.encode()])
            .expect("put");
        // A write that changes nothing still builds the directory, and later writes keep it.
        let none = ZSetOp::Rem {
            key: b"z".to_vec(),
            members: vec![b"absent".to_vec()],
        };
        apply(&mut store.writer(&mut txn, &mut cas), &none, 0).expect("zrem");
        let (_, coll) = coll_of(&store, &txn, b"z");
        assert_eq!((coll.len, coll.head), (700, RANKED));
        assert_eq!(
            zrank::verify(&store.zscore, &txn, coll.id, 700).expect("verify"),
            Vec::<String>::new()
        );
        apply(&mut store.writer(&mut txn, &mut cas), &add(650..900), 0).expect("zadd");
        let by_rank = ZSetOp::RemRange {
            key: b"z".to_vec(),
            by: RangeBy::Rank(100, 399),
        };
        let out =
            apply(&mut store.writer(&mut txn, &mut cas), &by_rank, 0).expect("zremrangebyrank");
        assert_eq!(out, Outcome::Int(300));
        let (_, coll) = coll_of(&store, &txn, b"z");
        assert_eq!(coll.len, 600);
        assert_eq!(
            zrank::verify(&store.zscore, &txn, coll.id, 600).expect("verify"),
            Vec::<String>::new()
        );
    }

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
    fn score_keys_keep_numeric_order() {
        let xs = [
            f64::NEG_INFINITY,
            -1e300,
            -2.0,
            -1.5,
            -5e-324,
            0.0,
            5e-324,
            0.1,
            1.0,
            2.0,
            1e300,
            f64::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(score_key(w[0]) < score_key(w[1]), "{} < {}", w[0], w[1]);
        }
        for &x in &xs {
            assert_eq!(key_score(score_key(x)), x);
        }
        assert_eq!(score_key(-0.0), score_key(0.0));
        assert!(key_score(score_key(-0.0)).is_sign_positive());
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
