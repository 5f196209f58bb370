//! List commands: the table, the parse of list writes into `types::list::ListOp`, and the list
//! reads (LLEN, LINDEX, LRANGE, LPOS): their arguments parsed into `types::read::CollRead`'s
//! typed reads, and what those give encoded as the reply.

use super::args::{Args, NOT_INTEGER, SYNTAX, int_arg, key_ok};
use super::table::{Cmd, Family, KEY1, R, Spec, W, spec};
use super::{Cx, count, read_error, storage_error};
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::Kind;
use crate::types::list::ListOp;
use crate::types::read::{CollRead, PosQuery};
use crate::types::{CollMeta, clamp_range};

const LPUSH: u8 = 0;
const RPUSH: u8 = 1;
const LPUSHX: u8 = 2;
const RPUSHX: u8 = 3;
const LPOP: u8 = 4;
const RPOP: u8 = 5;
const LRANGE: u8 = 6;
const LLEN: u8 = 7;
const LINDEX: u8 = 8;
const LSET: u8 = 9;
const LREM: u8 = 10;
const LTRIM: u8 = 11;
const LINSERT: u8 = 12;
const LPOS: u8 = 13;
const RPOPLPUSH: u8 = 14;
const LMOVE: u8 = 15;

const fn list(
    name: &'static str,
    arity: i32,
    write: bool,
    keys: (i32, i32, i32),
    code: u8,
) -> Spec {
    spec(name, arity, write, keys, Cmd::Coll(Family::List, code))
}

pub static COMMANDS: &[Spec] = &[
    list("lpush", -3, W, KEY1, LPUSH),
    list("rpush", -3, W, KEY1, RPUSH),
    list("lpushx", -3, W, KEY1, LPUSHX),
    list("rpushx", -3, W, KEY1, RPUSHX),
    list("lpop", -2, W, KEY1, LPOP),
    list("rpop", -2, W, KEY1, RPOP),
    list("lrange", 4, R, KEY1, LRANGE),
    list("llen", 2, R, KEY1, LLEN),
    list("lindex", 3, R, KEY1, LINDEX),
    list("lset", 4, W, KEY1, LSET),
    list("lrem", 4, W, KEY1, LREM),
    list("ltrim", 4, W, KEY1, LTRIM),
    list("linsert", 5, W, KEY1, LINSERT),
    list("lpos", -3, R, KEY1, LPOS),
    list("rpoplpush", 3, W, (1, 2, 1), RPOPLPUSH),
    list("lmove", 5, W, (1, 2, 1), LMOVE),
];

/// LEFT or RIGHT (LMOVE, BLMOVE, LMPOP, BLMPOP): true for LEFT.
pub(crate) fn side(args: Args<'_>, i: usize) -> Result<bool, String> {
    if args.is(i, "LEFT") {
        Ok(true)
    } else if args.is(i, "RIGHT") {
        Ok(false)
    } else {
        Err(SYNTAX.into())
    }
}

/// Parses a list write's arguments (arity is already checked).
pub fn write_op(code: u8, args: Args<'_>) -> Result<ListOp, String> {
    let key = args.get(1).to_vec();
    Ok(match code {
        LPUSH | RPUSH | LPUSHX | RPUSHX => ListOp::Push {
            key,
            values: (2..args.len()).map(|i| args.get(i).to_vec()).collect(),
            left: code == LPUSH || code == LPUSHX,
            existing_only: code == LPUSHX || code == RPUSHX,
        },
        LPOP | RPOP => {
            let count = match args.len() {
                2 => None,
                3 => match parse_i64(args.get(2)) {
                    Some(n) if n >= 0 => Some(n as u64),
                    _ => return Err("ERR value is out of range, must be positive".into()),
                },
                _ => {
                    return Err(format!(
                        "ERR wrong number of arguments for '{}' command",
                        if code == LPOP { "lpop" } else { "rpop" }
                    ));
                }
            };
            ListOp::Pop {
                key,
                left: code == LPOP,
                count,
            }
        }
        LSET => ListOp::Set {
            key,
            index: int_arg(args.get(2))?,
            value: args.get(3).to_vec(),
        },
        LREM => ListOp::Rem {
            key,
            count: int_arg(args.get(2))?,
            value: args.get(3).to_vec(),
        },
        LTRIM => ListOp::Trim {
            key,
            start: int_arg(args.get(2))?,
            stop: int_arg(args.get(3))?,
        },
        LINSERT => {
            let before = if args.is(2, "BEFORE") {
                true
            } else if args.is(2, "AFTER") {
                false
            } else {
                return Err(SYNTAX.into());
            };
            ListOp::Insert {
                key,
                before,
                pivot: args.get(3).to_vec(),
                value: args.get(4).to_vec(),
            }
        }
        RPOPLPUSH | LMOVE => {
            let dst = args.get(2);
            key_ok(dst)?;
            let (from_left, to_left) = if code == LMOVE {
                (side(args, 3)?, side(args, 4)?)
            } else {
                (false, true)
            };
            ListOp::Move {
                src: key,
                dst: dst.to_vec(),
                from_left,
                to_left,
            }
        }
        _ => return Err(SYNTAX.into()),
    })
}

/// Answers a list read (typed: `CollRead`'s list reads), writing RESP into `out`.
pub fn read(code: u8, args: Args<'_>, cx: &Cx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    if code == LLEN {
        return count(cx, args.get(1), Kind::List, out);
    }
    let coll = match cx.open(args.get(1), Kind::List) {
        Ok(c) => c,
        Err(e) => return read_error(out, e),
    };
    match code {
        LINDEX => {
            let Some(i) = parse_i64(args.get(2)) else {
                return enc::error(out, NOT_INTEGER);
            };
            let Some(c) = coll else {
                return enc::null(out, v3);
            };
            match cx.lindex(c, i) {
                Ok(Some(v)) => enc::bulk(out, v),
                Ok(None) => enc::null(out, v3),
                Err(e) => storage_error(out, e),
            }
        }
        LRANGE => {
            let (Some(start), Some(stop)) = (parse_i64(args.get(2)), parse_i64(args.get(3))) else {
                return enc::error(out, NOT_INTEGER);
            };
            let Some((c, (s, e))) =
                coll.and_then(|c| clamp_range(start, stop, cx.len(c)).map(|r| (c, r)))
            else {
                return enc::array(out, 0);
            };
            let at = out.len();
            enc::array(out, (e - s + 1) as usize);
            if let Err(err) = cx.lrange(c, start, stop, |v| enc::bulk(out, v)) {
                out.truncate(at);
                storage_error(out, err);
            }
        }
        LPOS => lpos(args, coll, cx, out, v3),
        _ => enc::error(out, SYNTAX),
    }
}

/// LPOS key element [RANK rank] [COUNT num] [MAXLEN len].
fn lpos(args: Args<'_>, coll: Option<CollMeta>, cx: &Cx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    let (mut rank, mut count, mut maxlen): (i64, Option<i64>, i64) = (1, None, 0);
    let mut i = 3;
    while i < args.len() {
        if i + 1 >= args.len() {
            return enc::error(out, SYNTAX);
        }
        let Some(n) = parse_i64(args.get(i + 1)) else {
            return enc::error(out, NOT_INTEGER);
        };
        if args.is(i, "RANK") {
            if n == 0 || n == i64::MIN {
                return enc::error(
                    out,
                    "ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list",
                );
            }
            rank = n;
        } else if args.is(i, "COUNT") {
            if n < 0 {
                return enc::error(out, "ERR COUNT can't be negative");
            }
            count = Some(n);
        } else if args.is(i, "MAXLEN") {
            if n < 0 {
                return enc::error(out, "ERR MAXLEN can't be negative");
            }
            maxlen = n;
        } else {
            return enc::error(out, SYNTAX);
        }
        i += 2;
    }
    let query = PosQuery {
        rank,
        want: match count {
            Some(0) => usize::MAX,
            Some(n) => n as usize,
            None => 1,
        },
        maxlen: maxlen as u64,
    };
    let found = match coll.map(|c| cx.lpos(c, args.get(2), query)) {
        None => Vec::new(),
        Some(Ok(found)) => found,
        Some(Err(e)) => return storage_error(out, e),
    };
    match count {
        None => match found.first() {
            Some(&i) => enc::int(out, i as i64),
            None => enc::null(out, v3),
        },
        Some(_) => {
            enc::array(out, found.len());
            for i in found {
                enc::int(out, i as i64);
            }
        }
    }
}
