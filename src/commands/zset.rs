//! Sorted-set commands: the table, Redis's score and range argument rules (parsed into
//! `types::zset`'s `ZSetOp`, `ScoreRange`, `LexRange`, `RangeSpec`), and the reads: ZSCORE,
//! ZMSCORE, ZRANK, ZCOUNT, ZLEXCOUNT, ZRANGE and its older forms and ZSCAN parsed into
//! `types::read::CollRead`'s typed reads, whose members are encoded into the reply as they
//! are walked, and so are ZUNION/ZINTER/ZDIFF and ZINTERCARD (`CollRead::zcombine`);
//! ZRANDMEMBER's picks are `types::zset`'s. The writes ZUNIONSTORE/ZINTERSTORE/ZDIFFSTORE and ZRANGESTORE share
//! their parsing with the reads and run in the writer (`types::zcombine`, `types::zset`). The
//! layout, the walks and the rank directory are `types::zset`'s and `types::zrank`'s.

use super::args::{Args, NOT_INTEGER, SYNTAX, int_arg};
use super::hash::{MAX_REPEAT_PICKS, REPLY_TOO_LARGE, TOO_MANY_PICKS, rand_count};
use super::table::{Cmd, Family, KEY1, NOKEY, R, Spec, W, spec};
use super::{Cx, read_error_text};
use crate::command::REPLY_MAX;
use crate::protocol::resp::enc::{ScoreText, fmt_double as fmt_score};
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::{Kind, StoreError};
use crate::types::read::{CollRead, ZInput};
use crate::types::set::Combine;
use crate::types::zcombine::{Aggregate, sort_result};
use crate::types::zset::{
    AddFlags, Lex, LexRange, RangeBy, RangeQuery, RangeSpec, ScoreRange, ZSetOp, random_members,
    score_key,
};
use crate::types::{CollMeta, MAX_SUB};

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
const ZUNIONSTORE: u8 = 22;
const ZINTERSTORE: u8 = 23;
const ZDIFFSTORE: u8 = 24;
const ZUNION: u8 = 25;
const ZINTER: u8 = 26;
const ZDIFF: u8 = 27;
const ZINTERCARD: u8 = 28;
const ZRANGESTORE: u8 = 29;
const ZRANDMEMBER: u8 = 30;

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
    // The STORE forms name their destination first; the sources follow a count (movable
    // keys), as Redis declares it.
    zset("zunionstore", -4, W, KEY1, ZUNIONSTORE),
    zset("zinterstore", -4, W, KEY1, ZINTERSTORE),
    zset("zdiffstore", -4, W, KEY1, ZDIFFSTORE),
    zset("zunion", -3, R, NOKEY, ZUNION),
    zset("zinter", -3, R, NOKEY, ZINTER),
    zset("zdiff", -3, R, NOKEY, ZDIFF),
    zset("zintercard", -3, R, NOKEY, ZINTERCARD),
    zset("zrangestore", -5, W, (1, 2, 1), ZRANGESTORE),
    zset("zrandmember", -2, R, KEY1, ZRANDMEMBER),
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
        ZUNIONSTORE | ZINTERSTORE | ZDIFFSTORE => {
            let (how, name) = match code {
                ZUNIONSTORE => (Combine::Union, "zunionstore"),
                ZINTERSTORE => (Combine::Inter, "zinterstore"),
                _ => (Combine::Diff, "zdiffstore"),
            };
            let keys = numkeys(args, 2, name)?;
            // Redis checks the sources' types before the options: an option error is
            // answered by the writer, after that check.
            let (opts, deferred) = match combine_opts(args, keys.end, keys.len(), how, true, false)
            {
                Ok(o) => (o, None),
                Err(msg) => (CombineOpts::default(), Some(msg)),
            };
            ZSetOp::Store {
                dst: key,
                how,
                keys: keys.map(|i| args.get(i).to_vec()).collect(),
                weights: opts.weights,
                agg: opts.agg,
                deferred,
            }
        }
        ZRANGESTORE => {
            let (range, _) = parse_zrange(ZRANGE, args, 2, true)?;
            ZSetOp::RangeStore {
                dst: key,
                src: args.get(2).to_vec(),
                range,
            }
        }
        _ => return Err(SYNTAX.into()),
    })
}

/// `numkeys key...` with the count at `at`: the keys' positions, checked as Redis checks them
/// (`name` is the command's, for the error).
fn numkeys(args: Args<'_>, at: usize, name: &str) -> Result<std::ops::Range<usize>, String> {
    let n = parse_i64(args.get(at)).ok_or(NOT_INTEGER)?;
    if n < 1 {
        return Err(format!(
            "ERR at least 1 input key is needed for '{name}' command"
        ));
    }
    if n > (args.len() - at - 1) as i64 {
        return Err(SYNTAX.into());
    }
    Ok(at + 1..at + 1 + n as usize)
}

/// The options after the keys of ZUNION/ZINTER/ZDIFF (and STORE forms) and ZINTERCARD.
#[derive(Default)]
struct CombineOpts {
    weights: Vec<f64>,
    agg: Aggregate,
    withscores: bool,
    /// ZINTERCARD's LIMIT; 0: none.
    limit: u64,
}

/// Reads the options from `j` on as Redis's loop does: WEIGHTS (one per key: only when that
/// many arguments follow) and AGGREGATE for union and intersection, WITHSCORES for the reads,
/// LIMIT for ZINTERCARD (`card`); anything else is a syntax error.
fn combine_opts(
    args: Args<'_>,
    mut j: usize,
    setnum: usize,
    how: Combine,
    store: bool,
    card: bool,
) -> Result<CombineOpts, &'static str> {
    let mut o = CombineOpts::default();
    let scored = how != Combine::Diff && !card;
    while j < args.len() {
        let remaining = args.len() - j;
        if scored && remaining > setnum && args.is(j, "WEIGHTS") {
            o.weights.clear();
            for i in j + 1..j + 1 + setnum {
                o.weights
                    .push(parse_score(args.get(i)).ok_or("ERR weight value is not a float")?);
            }
            j += 1 + setnum;
        } else if scored && remaining >= 2 && args.is(j, "AGGREGATE") {
            o.agg = if args.is(j + 1, "SUM") {
                Aggregate::Sum
            } else if args.is(j + 1, "MIN") {
                Aggregate::Min
            } else if args.is(j + 1, "MAX") {
                Aggregate::Max
            } else {
                return Err(SYNTAX);
            };
            j += 2;
        } else if !store && !card && args.is(j, "WITHSCORES") {
            o.withscores = true;
            j += 1;
        } else if card && remaining >= 2 && args.is(j, "LIMIT") {
            o.limit = match parse_i64(args.get(j + 1)) {
                Some(n) if n >= 0 => n as u64,
                _ => return Err("ERR LIMIT can't be negative"),
            };
            j += 2;
        } else {
            return Err(SYNTAX);
        }
    }
    Ok(o)
}

fn storage_err(e: impl Into<StoreError>) -> String {
    e.into().resp_reply()
}

/// The sorted set under `key`: None when missing; Err: the error to answer.
fn look(cx: &Cx<'_, '_>, key: &[u8]) -> Result<Option<CollMeta>, String> {
    cx.open(key, Kind::ZSet).map_err(read_error_text)
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
        ZCARD => enc::int(
            out,
            cx.count(key, Kind::ZSet).map_err(read_error_text)? as i64,
        ),
        ZSCORE => {
            let score = match look(cx, key)? {
                Some(c) => cx.zscore(c, args.get(2)).map_err(storage_err)?,
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
                    Some(c) => cx.zscore(c, args.get(i)).map_err(storage_err)?,
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
            match cx.zrank(c, args.get(2)).map_err(storage_err)? {
                Some(r) if code == ZRANK => enc::int(out, r as i64),
                Some(r) => enc::int(out, cx.len(c).saturating_sub(1 + r) as i64),
                None => enc::null(out, v3),
            }
        }
        ZCOUNT => {
            let r = parse_score_range(args.get(2), args.get(3)).ok_or(BAD_SCORE_RANGE)?;
            let n = match look(cx, key)? {
                Some(c) => cx.zcount(c, &r).map_err(storage_err)?,
                None => 0,
            };
            enc::int(out, n as i64);
        }
        ZLEXCOUNT => {
            let r = parse_lex_range(args.get(2), args.get(3)).ok_or(BAD_LEX_RANGE)?;
            let n = match look(cx, key)? {
                Some(c) => cx.zlexcount(c, &r).map_err(storage_err)?,
                None => 0,
            };
            enc::int(out, n as i64);
        }
        ZRANGE | ZREVRANGE | ZRANGEBYSCORE | ZREVRANGEBYSCORE | ZRANGEBYLEX | ZREVRANGEBYLEX => {
            zrange(code, args, cx, out, v3)?
        }
        ZSCAN => super::hash::scan(args, cx, Kind::ZSet, out),
        ZUNION | ZINTER | ZDIFF | ZINTERCARD => combine_read(code, args, cx, out, v3)?,
        ZRANDMEMBER => zrandmember(args, cx, out, v3)?,
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

    /// The bytes written so far.
    fn bytes(&self) -> usize {
        self.out.len() - self.at
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

/// ZRANGE and its older forms (Redis 7's `zrangeGenericCommand`), and ZRANGESTORE (`store`):
/// the key at `at`, the range after it, then the options. The query and WITHSCORES.
fn parse_zrange(
    code: u8,
    args: Args<'_>,
    at: usize,
    store: bool,
) -> Result<(RangeSpec, bool), String> {
    let (mut by, mut rev) = match code {
        ZREVRANGE => (Some(By::Rank), Some(true)),
        ZRANGEBYSCORE => (Some(By::Score), Some(false)),
        ZREVRANGEBYSCORE => (Some(By::Score), Some(true)),
        ZRANGEBYLEX => (Some(By::Lex), Some(false)),
        ZREVRANGEBYLEX => (Some(By::Lex), Some(true)),
        _ => (None, None),
    };
    let (mut withscores, mut offset, mut limit) = (false, 0i64, -1i64);
    let mut j = at + 3;
    while j < args.len() {
        let left = args.len() - j - 1;
        if !store && args.is(j, "WITHSCORES") {
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
        (args.get(at + 2), args.get(at + 1))
    } else {
        (args.get(at + 1), args.get(at + 2))
    };
    let query = match by {
        By::Rank => RangeQuery::Rank(int_arg(lo_arg)?, int_arg(hi_arg)?),
        By::Score => RangeQuery::Score(parse_score_range(lo_arg, hi_arg).ok_or(BAD_SCORE_RANGE)?),
        By::Lex => RangeQuery::Lex(parse_lex_range(lo_arg, hi_arg).ok_or(BAD_LEX_RANGE)?),
    };
    let spec = RangeSpec {
        query,
        rev,
        offset,
        limit,
    };
    Ok((spec, withscores))
}

/// ZRANGE and its older forms: options first, then the range, then the key; the members
/// streamed from the map into the reply.
fn zrange(
    code: u8,
    args: Args<'_>,
    cx: &Cx<'_, '_>,
    out: &mut Vec<u8>,
    v3: bool,
) -> Result<(), String> {
    let (spec, withscores) = parse_zrange(code, args, 1, false)?;
    let Some(c) = look(cx, args.get(1))? else {
        enc::array(out, 0);
        return Ok(());
    };
    let mut emit = Emit::new(out, withscores, v3);
    match cx.zrange(c, &spec, |m, s| emit.push(m, s)) {
        Ok(()) => emit.finish(),
        Err(e) => emit.fail(&storage_err(e)),
    }
    Ok(())
}

/// ZUNION/ZINTER/ZDIFF numkeys key... [WEIGHTS ..] [AGGREGATE ..] [WITHSCORES], and
/// ZINTERCARD numkeys key... [LIMIT n]: numkeys, then the sources' types, then the options,
/// as Redis checks them. The result is sorted by score, then member.
fn combine_read(
    code: u8,
    args: Args<'_>,
    cx: &Cx<'_, '_>,
    out: &mut Vec<u8>,
    v3: bool,
) -> Result<(), String> {
    let (how, name) = match code {
        ZUNION => (Combine::Union, "zunion"),
        ZINTER => (Combine::Inter, "zinter"),
        ZDIFF => (Combine::Diff, "zdiff"),
        _ => (Combine::Inter, "zintercard"),
    };
    let card = code == ZINTERCARD;
    let keys = numkeys(args, 1, name)?;
    let mut inputs = Vec::with_capacity(keys.len());
    for i in keys.clone() {
        let (kind, coll) = match cx.open_scored(args.get(i)).map_err(read_error_text)? {
            None => (Kind::ZSet, None),
            Some((kind, c)) => (kind, Some(c)),
        };
        inputs.push(ZInput {
            kind,
            coll,
            weight: 1.0,
        });
    }
    let opts = combine_opts(args, keys.end, keys.len(), how, false, card)?;
    for (s, w) in inputs.iter_mut().zip(&opts.weights) {
        s.weight = *w;
    }
    if card {
        let mut n = 0u64;
        cx.zcombine(how, &inputs, opts.agg, |_, _| {
            n += 1;
            opts.limit == 0 || n < opts.limit
        })
        .map_err(storage_err)?;
        enc::int(out, n as i64);
        return Ok(());
    }
    let mut got: Vec<(&[u8], f64)> = Vec::new();
    cx.zcombine(how, &inputs, opts.agg, |m, s| {
        got.push((m, s));
        true
    })
    .map_err(storage_err)?;
    sort_result(&mut got);
    let mut emit = Emit::new(out, opts.withscores, v3);
    for (m, s) in got {
        emit.push(m, s);
    }
    emit.finish();
    Ok(())
}

/// ZRANDMEMBER key [count [WITHSCORES]], with Redis 7.0's argument checks (a count with
/// WITHSCORES within +-LONG_MAX/2). A positive count is capped at the set's size before
/// anything is allocated; a negative one (repeats) at `MAX_REPEAT_PICKS`, its reply at
/// `REPLY_MAX`, as SRANDMEMBER's.
fn zrandmember(args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>, v3: bool) -> Result<(), String> {
    let mut count = None;
    let mut withscores = false;
    if args.len() >= 3 {
        let n = rand_count(args.get(2))?;
        if args.len() > 4 || (args.len() == 4 && !args.is(3, "WITHSCORES")) {
            return Err(SYNTAX.into());
        }
        if args.len() == 4 {
            withscores = true;
            if !(-(i64::MAX / 2)..=i64::MAX / 2).contains(&n) {
                return Err("ERR value is out of range".into());
            }
        }
        count = Some(n);
    }
    let coll = look(cx, args.get(1))?;
    let store = cx.store;
    let Some(n) = count else {
        let Some(c) = coll else {
            enc::null(out, v3);
            return Ok(());
        };
        let mut got = None;
        random_members(&store.zscore, *store.elems, cx.txn, &c, 1, true, |m, _| {
            got = Some(m.to_vec());
            false
        })
        .map_err(storage_err)?;
        match got {
            Some(m) => enc::bulk(out, &m),
            None => enc::null(out, v3),
        }
        return Ok(());
    };
    let Some(c) = coll.filter(|_| n != 0) else {
        enc::array(out, 0);
        return Ok(());
    };
    let (k, repeats) = if n > 0 {
        ((n as u64).min(c.len), false)
    } else {
        (n.unsigned_abs(), true)
    };
    if repeats && k > MAX_REPEAT_PICKS {
        return Err(TOO_MANY_PICKS.into());
    }
    let mut emit = Emit::new(out, withscores, v3);
    let mut over = false;
    let done = random_members(
        &store.zscore,
        *store.elems,
        cx.txn,
        &c,
        k,
        repeats,
        |m, s| {
            emit.push(m, s);
            over = repeats && emit.bytes() > REPLY_MAX;
            !over
        },
    );
    match done {
        Err(e) => emit.fail(&storage_err(e)),
        Ok(()) if over => emit.fail(REPLY_TOO_LARGE),
        Ok(()) => emit.finish(),
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
