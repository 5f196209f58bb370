//! Set commands: the table, the parse of set writes into `types::set::SetOp`, and the set reads
//! (SCARD, SISMEMBER, SMEMBERS, SINTER/SUNION/SDIFF, SINTERCARD, SSCAN: `types::read::CollRead`'s
//! typed reads, their results encoded as the reply; SRANDMEMBER: `types::hash`'s picks).

use super::args::{Args, SYNTAX, key_ok};
use super::hash::{MAX_REPEAT_PICKS, REPLY_TOO_LARGE, TOO_MANY_PICKS, rand_count, scan, sub_ok};
use super::table::{Cmd, Family, KEY1, NOKEY, R, Spec, W, spec};
use super::{Cx, count, read_error, storage_error};
use crate::command::REPLY_MAX;
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::Kind;
use crate::types::CollMeta;
use crate::types::hash::{pick_one, sample_distinct, sample_repeats};
use crate::types::read::{CollRead, ReadError};
use crate::types::set::{Combine, SetOp};

const SADD: u8 = 0;
const SREM: u8 = 1;
const SMEMBERS: u8 = 2;
const SISMEMBER: u8 = 3;
const SMISMEMBER: u8 = 4;
const SCARD: u8 = 5;
const SPOP: u8 = 6;
const SRANDMEMBER: u8 = 7;
const SMOVE: u8 = 8;
const SINTER: u8 = 9;
const SINTERSTORE: u8 = 10;
const SUNION: u8 = 11;
const SUNIONSTORE: u8 = 12;
const SDIFF: u8 = 13;
const SDIFFSTORE: u8 = 14;
const SINTERCARD: u8 = 15;
const SSCAN: u8 = 16;

const fn set(name: &'static str, arity: i32, write: bool, keys: (i32, i32, i32), code: u8) -> Spec {
    spec(name, arity, write, keys, Cmd::Coll(Family::Set, code))
}

const ALL: (i32, i32, i32) = (1, -1, 1);

pub static COMMANDS: &[Spec] = &[
    set("sadd", -3, W, KEY1, SADD),
    set("srem", -3, W, KEY1, SREM),
    set("smembers", 2, R, KEY1, SMEMBERS),
    set("sismember", 3, R, KEY1, SISMEMBER),
    set("smismember", -3, R, KEY1, SMISMEMBER),
    set("scard", 2, R, KEY1, SCARD),
    set("spop", -2, W, KEY1, SPOP),
    set("srandmember", -2, R, KEY1, SRANDMEMBER),
    set("smove", 4, W, (1, 2, 1), SMOVE),
    set("sinter", -2, R, ALL, SINTER),
    set("sinterstore", -3, W, ALL, SINTERSTORE),
    set("sunion", -2, R, ALL, SUNION),
    set("sunionstore", -3, W, ALL, SUNIONSTORE),
    set("sdiff", -2, R, ALL, SDIFF),
    set("sdiffstore", -3, W, ALL, SDIFFSTORE),
    // Keys follow a count (movable keys), as Redis declares it.
    set("sintercard", -3, R, NOKEY, SINTERCARD),
    set("sscan", -3, R, KEY1, SSCAN),
];

/// Parses a set write's arguments (arity is already checked).
pub fn write_op(code: u8, args: Args<'_>) -> Result<SetOp, String> {
    let key = args.get(1).to_vec();
    let rest = |from: usize| (from..args.len()).map(|i| args.get(i).to_vec()).collect();
    Ok(match code {
        SADD => {
            for i in 2..args.len() {
                sub_ok(args.get(i), "member")?;
            }
            SetOp::Add {
                key,
                members: rest(2),
            }
        }
        SREM => SetOp::Rem {
            key,
            members: rest(2),
        },
        SPOP => {
            let count = match args.len() {
                2 => None,
                3 => match parse_i64(args.get(2)) {
                    Some(n) if n >= 0 => Some(n as u64),
                    _ => return Err("ERR value is out of range, must be positive".into()),
                },
                _ => return Err(SYNTAX.into()),
            };
            SetOp::Pop { key, count }
        }
        SMOVE => {
            key_ok(args.get(2))?;
            SetOp::Move {
                src: key,
                dst: args.get(2).to_vec(),
                member: args.get(3).to_vec(),
            }
        }
        SINTERSTORE | SUNIONSTORE | SDIFFSTORE => {
            for i in 2..args.len() {
                key_ok(args.get(i))?;
            }
            SetOp::Store {
                how: match code {
                    SINTERSTORE => Combine::Inter,
                    SUNIONSTORE => Combine::Union,
                    _ => Combine::Diff,
                },
                dst: key,
                keys: rest(2),
            }
        }
        _ => return Err(SYNTAX.into()),
    })
}

/// Answers a set read from the worker's transaction, writing RESP into `out`.
pub fn read(code: u8, args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    match code {
        SSCAN => return scan(args, cx, Kind::Set, out),
        SCARD => return count(cx, args.get(1), Kind::Set, out),
        SINTER | SUNION | SDIFF => {
            let how = match code {
                SINTER => Combine::Inter,
                SUNION => Combine::Union,
                _ => Combine::Diff,
            };
            return combine_reply(how, args, cx, out, v3);
        }
        SINTERCARD => return intercard(args, cx, out),
        SRANDMEMBER => return randmember(args, cx, out, v3),
        _ => {}
    }
    let coll = match cx.open(args.get(1), Kind::Set) {
        Ok(c) => c,
        Err(e) => return read_error(out, e),
    };
    let has = |m: &[u8]| match coll {
        Some(c) => cx.sismember(c, m),
        None => Ok(false),
    };
    match code {
        SISMEMBER => match has(args.get(2)) {
            Ok(b) => enc::int(out, b as i64),
            Err(e) => storage_error(out, e),
        },
        SMISMEMBER => {
            let start = out.len();
            enc::array(out, args.len() - 2);
            for i in 2..args.len() {
                match has(args.get(i)) {
                    Ok(b) => enc::int(out, b as i64),
                    Err(e) => {
                        out.truncate(start);
                        return storage_error(out, e);
                    }
                }
            }
        }
        SMEMBERS => {
            let Some(c) = coll else {
                return enc::set(out, 0, v3);
            };
            let start = out.len();
            enc::set(out, cx.len(c) as usize, v3);
            if let Err(e) = cx.smembers(c, |m| enc::bulk(out, m)) {
                out.truncate(start);
                storage_error(out, e);
            }
        }
        _ => enc::error(out, SYNTAX),
    }
}

/// The sets under `args[from..upto]`, a missing key as None; Err if any of them is not a set.
fn sources(
    args: Args<'_>,
    from: usize,
    upto: usize,
    cx: &Cx<'_, '_>,
) -> Result<Vec<Option<CollMeta>>, ReadError> {
    (from..upto)
        .map(|i| cx.open(args.get(i), Kind::Set))
        .collect()
}

/// SINTER/SUNION/SDIFF key...: the result as a set reply.
fn combine_reply(how: Combine, args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    let sets = match sources(args, 1, args.len(), cx) {
        Ok(s) => s,
        Err(e) => return read_error(out, e),
    };
    match cx.scombine(how, &sets, usize::MAX) {
        Ok(members) => {
            enc::set(out, members.len(), v3);
            for m in members {
                enc::bulk(out, m);
            }
        }
        Err(e) => storage_error(out, e),
    }
}

/// SINTERCARD numkeys key... [LIMIT limit].
fn intercard(args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>) {
    let numkeys = match parse_i64(args.get(1)) {
        Some(n) if n > 0 => n as u64,
        _ => return enc::error(out, "ERR numkeys should be greater than 0"),
    };
    if numkeys > (args.len() - 2) as u64 {
        return enc::error(
            out,
            "ERR Number of keys can't be greater than number of args",
        );
    }
    let end = 2 + numkeys as usize;
    let mut limit = usize::MAX;
    let mut i = end;
    while i < args.len() {
        if args.is(i, "LIMIT") && i + 1 < args.len() {
            match parse_i64(args.get(i + 1)) {
                Some(0) => limit = usize::MAX,
                Some(n) if n > 0 => limit = n as usize,
                _ => return enc::error(out, "ERR LIMIT can't be negative"),
            }
            i += 2;
        } else {
            return enc::error(out, SYNTAX);
        }
    }
    let sets = match sources(args, 2, end, cx) {
        Ok(s) => s,
        Err(e) => return read_error(out, e),
    };
    match cx.scombine(Combine::Inter, &sets, limit) {
        Ok(members) => enc::int(out, members.len() as i64),
        Err(e) => storage_error(out, e),
    }
}

/// SRANDMEMBER key [count].
fn randmember(args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    if args.len() > 3 {
        return enc::error(out, SYNTAX);
    }
    let count = if args.len() == 3 {
        match rand_count(args.get(2)) {
            Ok(n) => Some(n),
            Err(msg) => return enc::error(out, msg),
        }
    } else {
        None
    };
    let coll = match cx.open(args.get(1), Kind::Set) {
        Ok(c) => c,
        Err(e) => return read_error(out, e),
    };
    let db = *cx.store.elems;
    let Some(n) = count else {
        let Some(c) = coll else {
            return enc::null(out, v3);
        };
        return match pick_one(db, cx.txn, &c) {
            Ok(Some((m, _))) => enc::bulk(out, m),
            Ok(None) => enc::null(out, v3),
            Err(e) => storage_error(out, e),
        };
    };
    let Some(c) = coll.filter(|_| n != 0) else {
        return enc::array(out, 0);
    };
    let start = out.len();
    let done = if n > 0 {
        sample_distinct(db, cx.txn, &c, n as u64).map(|picked| {
            enc::array(out, picked.len());
            for (m, _) in picked {
                enc::bulk(out, m);
            }
        })
    } else {
        let m = n.unsigned_abs();
        if m > MAX_REPEAT_PICKS {
            return enc::error(out, TOO_MANY_PICKS);
        }
        enc::array(out, m as usize);
        sample_repeats(db, cx.txn, &c, m, |m, _| {
            enc::bulk(out, m);
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
