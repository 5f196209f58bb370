//! Hash commands: the table, the parse of hash writes into `types::hash::HashOp`, and the hash
//! reads: their arguments parsed into `types::read::CollRead`'s typed reads, and what those
//! give encoded as the reply. Also here, shared with sets and sorted sets: the
//! HSCAN/SSCAN/ZSCAN reply, and the parse of HRANDFIELD/SRANDMEMBER counts (the random picks
//! are `types::hash`'s).

use super::args::{Args, NOT_INTEGER, SYNTAX, glob_match, int_arg, scan_opts};
use super::table::{Cmd, Family, KEY1, R, Spec, W, spec};
use super::zset::fmt_scan_score;
use super::{Cx, count, read_error, storage_error};
use crate::command::REPLY_MAX;
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::Kind;
use crate::types::MAX_SUB;
use crate::types::hash::{HashOp, pick_one, sample_distinct, sample_repeats};
use crate::types::read::CollRead;

const HSET: u8 = 0;
const HSETNX: u8 = 1;
const HMSET: u8 = 2;
const HGET: u8 = 3;
const HMGET: u8 = 4;
const HDEL: u8 = 5;
const HGETALL: u8 = 6;
const HKEYS: u8 = 7;
const HVALS: u8 = 8;
const HLEN: u8 = 9;
const HEXISTS: u8 = 10;
const HINCRBY: u8 = 11;
const HINCRBYFLOAT: u8 = 12;
const HSTRLEN: u8 = 13;
const HSCAN: u8 = 14;
const HRANDFIELD: u8 = 15;

const fn hash(
    name: &'static str,
    arity: i32,
    write: bool,
    keys: (i32, i32, i32),
    code: u8,
) -> Spec {
    spec(name, arity, write, keys, Cmd::Coll(Family::Hash, code))
}

pub static COMMANDS: &[Spec] = &[
    hash("hset", -4, W, KEY1, HSET),
    hash("hsetnx", 4, W, KEY1, HSETNX),
    hash("hmset", -4, W, KEY1, HMSET),
    hash("hget", 3, R, KEY1, HGET),
    hash("hmget", -3, R, KEY1, HMGET),
    hash("hdel", -3, W, KEY1, HDEL),
    hash("hgetall", 2, R, KEY1, HGETALL),
    hash("hkeys", 2, R, KEY1, HKEYS),
    hash("hvals", 2, R, KEY1, HVALS),
    hash("hlen", 2, R, KEY1, HLEN),
    hash("hexists", 3, R, KEY1, HEXISTS),
    hash("hincrby", 4, W, KEY1, HINCRBY),
    hash("hincrbyfloat", 4, W, KEY1, HINCRBYFLOAT),
    hash("hstrlen", 3, R, KEY1, HSTRLEN),
    hash("hscan", -3, R, KEY1, HSCAN),
    hash("hrandfield", -2, R, KEY1, HRANDFIELD),
];

/// A hash field or set member a write may store: at most `MAX_SUB` bytes.
pub(crate) fn sub_ok(sub: &[u8], what: &str) -> Result<(), String> {
    if sub.len() > MAX_SUB {
        Err(format!("ERR memkeep: {what} longer than {MAX_SUB} bytes"))
    } else {
        Ok(())
    }
}

fn field_arg(args: Args<'_>, i: usize) -> Result<Vec<u8>, String> {
    let f = args.get(i);
    sub_ok(f, "field")?;
    Ok(f.to_vec())
}

/// Parses a hash write's arguments (arity is already checked).
pub fn write_op(code: u8, args: Args<'_>) -> Result<HashOp, String> {
    let key = args.get(1).to_vec();
    Ok(match code {
        HSET | HMSET | HSETNX => {
            if !args.len().is_multiple_of(2) {
                let name = if code == HSET { "hset" } else { "hmset" };
                return Err(format!(
                    "ERR wrong number of arguments for '{name}' command"
                ));
            }
            let mut pairs = Vec::with_capacity(args.len() / 2);
            for i in (2..args.len()).step_by(2) {
                pairs.push((field_arg(args, i)?, args.get(i + 1).to_vec()));
            }
            HashOp::Set {
                key,
                pairs,
                nx: code == HSETNX,
                ok: code == HMSET,
            }
        }
        HDEL => HashOp::Del {
            key,
            fields: (2..args.len()).map(|i| args.get(i).to_vec()).collect(),
        },
        HINCRBY => {
            let delta = int_arg(args.get(3))?;
            HashOp::IncrBy {
                key,
                field: field_arg(args, 2)?,
                delta,
            }
        }
        HINCRBYFLOAT => {
            use crate::float::{FloatArg, check};
            match check(args.get(3)) {
                FloatArg::Invalid => return Err("ERR value is not a valid float".into()),
                FloatArg::Infinite => return Err("ERR value is NaN or Infinity".into()),
                FloatArg::Finite => {}
            }
            HashOp::IncrByFloat {
                key,
                field: field_arg(args, 2)?,
                delta: args.get(3).to_vec(),
            }
        }
        _ => return Err(SYNTAX.into()),
    })
}

/// Answers a hash read (typed: `CollRead`'s hash reads), writing RESP into `out`.
pub fn read(code: u8, args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    match code {
        HSCAN => return scan(args, cx, Kind::Hash, out),
        HRANDFIELD => return randfield(args, cx, out, v3),
        HLEN => return count(cx, args.get(1), Kind::Hash, out),
        _ => {}
    }
    let coll = match cx.open(args.get(1), Kind::Hash) {
        Ok(c) => c,
        Err(e) => return read_error(out, e),
    };
    // The value of `field`, if present.
    let value = |field: &[u8]| match coll {
        Some(c) => cx.hget(c, field),
        None => Ok(None),
    };
    match code {
        HGET => match value(args.get(2)) {
            Ok(Some(v)) => enc::bulk(out, v),
            Ok(None) => enc::null(out, v3),
            Err(e) => storage_error(out, e),
        },
        HEXISTS => match value(args.get(2)) {
            Ok(v) => enc::int(out, v.is_some() as i64),
            Err(e) => storage_error(out, e),
        },
        HSTRLEN => match value(args.get(2)) {
            Ok(v) => enc::int(out, v.map_or(0, |v| v.len() as i64)),
            Err(e) => storage_error(out, e),
        },
        HMGET => {
            let start = out.len();
            enc::array(out, args.len() - 2);
            for i in 2..args.len() {
                match value(args.get(i)) {
                    Ok(Some(_)) if out.len() - start > REPLY_MAX => {
                        out.truncate(start);
                        return enc::error(out, REPLY_TOO_LARGE);
                    }
                    Ok(Some(v)) => enc::bulk(out, v),
                    Ok(None) => enc::null(out, v3),
                    Err(e) => {
                        out.truncate(start);
                        return storage_error(out, e);
                    }
                }
            }
        }
        HGETALL | HKEYS | HVALS => {
            let Some(c) = coll else {
                return if code == HGETALL {
                    enc::map(out, 0, v3)
                } else {
                    enc::array(out, 0)
                };
            };
            let start = out.len();
            if code == HGETALL {
                enc::map(out, cx.len(c) as usize, v3);
            } else {
                enc::array(out, cx.len(c) as usize);
            }
            let walked = cx.hwalk(c, |f, v| {
                if code != HVALS {
                    enc::bulk(out, f);
                }
                if code != HKEYS {
                    enc::bulk(out, v);
                }
            });
            if let Err(e) = walked {
                out.truncate(start);
                storage_error(out, e);
            }
        }
        _ => enc::error(out, SYNTAX),
    }
}

/// HSCAN/SSCAN/ZSCAN key cursor [MATCH pattern] [COUNT n]: like SCAN, the cursor names
/// (server-side, in `cx.cursors`) the last sub-key examined, so elements present for the whole
/// scan are returned exactly once even while others are written. COUNT elements are examined
/// per call (Redis returns a small collection whole, whatever COUNT says). A hash answers
/// field, value pairs; a sorted set member, score pairs (`fmt_scan_score`); a set members.
pub(crate) fn scan(args: Args<'_>, cx: &Cx<'_, '_>, kind: Kind, out: &mut Vec<u8>) {
    let Some(cursor) = std::str::from_utf8(args.get(2))
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return enc::error(out, "ERR invalid cursor");
    };
    let coll = match cx.open(args.get(1), kind) {
        Ok(c) => c,
        Err(e) => return read_error(out, e),
    };
    let Some(coll) = coll else {
        // As Redis: a missing key answers an empty scan before the options are looked at.
        enc::array(out, 2);
        enc::bulk(out, b"0");
        return enc::array(out, 0);
    };
    let (pattern, count) = match scan_opts(args, 3, false) {
        Ok(o) => (o.pattern, o.count),
        Err(msg) => return enc::error(out, msg),
    };
    let lock = || cx.cursors.lock().unwrap_or_else(|p| p.into_inner());
    let after = if cursor == 0 {
        None
    } else {
        // A cursor SCAN handed out may name a key too long to be a sub-key.
        match lock().get(cursor).filter(|sub| sub.len() <= MAX_SUB) {
            Some(sub) => Some(sub),
            None => return enc::error(out, "ERR invalid cursor"),
        }
    };
    let after = after.as_deref();
    let wanted = |sub: &[u8]| pattern.is_none_or(|p| glob_match(p, sub));
    // What each element found answers besides its sub-key.
    enum Also<'v> {
        Nothing,
        Value(&'v [u8]),
        Score(f64),
    }
    let mut found: Vec<(&[u8], Also)> = Vec::new();
    let walked = match kind {
        Kind::Hash => cx.hscan(coll, after, count, |f, v| {
            if wanted(f) {
                found.push((f, Also::Value(v)));
            }
        }),
        Kind::ZSet => cx.zscan(coll, after, count, |m, s| {
            if wanted(m) {
                found.push((m, Also::Score(s)));
            }
        }),
        _ => cx.sscan(coll, after, count, |m| {
            if wanted(m) {
                found.push((m, Also::Nothing));
            }
        }),
    };
    let next = match walked {
        Ok(Some(last)) => lock().insert(last.to_vec()),
        Ok(None) => 0,
        Err(e) => return storage_error(out, e),
    };
    let items = if kind == Kind::Set { 1 } else { 2 };
    enc::array(out, 2);
    enc::bulk(out, itoa::Buffer::new().format(next).as_bytes());
    enc::array(out, found.len() * items);
    for (sub, also) in found {
        enc::bulk(out, sub);
        match also {
            Also::Nothing => {}
            Also::Value(v) => enc::bulk(out, v),
            Also::Score(s) => enc::bulk(out, fmt_scan_score(s).as_bytes()),
        }
    }
}

/// Most picks a negative count (repeats allowed) may ask HRANDFIELD/SRANDMEMBER for: memkeep
/// bounds the reply's size, Redis does not.
pub(crate) const MAX_REPEAT_PICKS: u64 = 1_000_000;

/// Parses the count of SRANDMEMBER/HRANDFIELD as Redis 7.0 does (-LONG_MAX..LONG_MAX).
pub(crate) fn rand_count(b: &[u8]) -> Result<i64, &'static str> {
    match parse_i64(b) {
        None => Err(NOT_INTEGER),
        Some(i64::MIN) => Err(
            "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807",
        ),
        Some(n) => Ok(n),
    }
}

/// The answer to a request whose reply would pass `REPLY_MAX`.
pub(crate) const REPLY_TOO_LARGE: &str =
    "ERR memkeep: the reply would exceed 64 MiB (REPLY_MAX); ask for less at a time";

/// The error for a negative count beyond `MAX_REPEAT_PICKS`.
pub(crate) const TOO_MANY_PICKS: &str =
    "ERR memkeep: count out of range (at most 1000000 repeated picks)";

/// HRANDFIELD key [count [WITHVALUES]].
fn randfield(args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    let mut count = None;
    let mut withvalues = false;
    if args.len() >= 3 {
        let n = match rand_count(args.get(2)) {
            Ok(n) => n,
            Err(msg) => return enc::error(out, msg),
        };
        if args.len() > 4 || (args.len() == 4 && !args.is(3, "WITHVALUES")) {
            return enc::error(out, SYNTAX);
        }
        if args.len() == 4 {
            withvalues = true;
            if !(-(i64::MAX / 2)..=i64::MAX / 2).contains(&n) {
                return enc::error(out, "ERR value is out of range");
            }
        }
        count = Some(n);
    }
    let coll = match cx.open(args.get(1), Kind::Hash) {
        Ok(c) => c,
        Err(e) => return read_error(out, e),
    };
    let db = *cx.store.elems;
    let Some(n) = count else {
        let Some(c) = coll else {
            return enc::null(out, v3);
        };
        return match pick_one(db, cx.txn, &c) {
            Ok(Some((f, _))) => enc::bulk(out, f),
            Ok(None) => enc::null(out, v3),
            Err(e) => storage_error(out, e),
        };
    };
    let Some(c) = coll.filter(|_| n != 0) else {
        return enc::array(out, 0);
    };
    let header = |out: &mut Vec<u8>, k: usize| {
        if withvalues && !v3 {
            enc::array(out, 2 * k)
        } else {
            enc::array(out, k)
        }
    };
    let emit = |out: &mut Vec<u8>, f: &[u8], v: &[u8]| {
        if withvalues {
            if v3 {
                enc::array(out, 2);
            }
            enc::bulk(out, f);
            enc::bulk(out, v);
        } else {
            enc::bulk(out, f);
        }
    };
    let start = out.len();
    let done = if n > 0 {
        sample_distinct(db, cx.txn, &c, n as u64).map(|picked| {
            header(out, picked.len());
            for (f, v) in picked {
                emit(out, f, v);
            }
        })
    } else {
        let m = n.unsigned_abs();
        if m > MAX_REPEAT_PICKS {
            return enc::error(out, TOO_MANY_PICKS);
        }
        header(out, m as usize);
        sample_repeats(db, cx.txn, &c, m, |f, v| {
            emit(out, f, v);
            out.len() - start <= REPLY_MAX
        })
    };
    if let Err(e) = done {
        out.truncate(start);
        storage_error(out, e);
    } else if out.len() - start > REPLY_MAX {
        out.truncate(start);
        enc::error(out, REPLY_TOO_LARGE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_keys_longer_than_the_limit_are_refused() {
        assert!(sub_ok(&[b'x'; MAX_SUB], "field").is_ok());
        assert_eq!(
            sub_ok(&[b'x'; MAX_SUB + 1], "member"),
            Err("ERR memkeep: member longer than 495 bytes".to_string())
        );
    }
}
