//! Lists: elements keyed by position, `id ++ pos`, with positions contiguous from the
//! metadata's `head` to `tail - 1`. LPUSH/RPUSH/LPOP/RPOP/LINDEX/LSET are O(log n); LRANGE is
//! one cursor walk, O(log n + k); LREM, LINSERT and LPOS rewrite or scan the list, O(n), as in
//! Redis.

use std::ops::Bound;

use super::{CollMeta, Found, ReadCx, Tx, clamp_range, elem_key};
use crate::command::Outcome;
use crate::commands::{
    Args, Cmd, Family, KEY1, NOT_INTEGER, R, SYNTAX, Spec, W, int_arg, key_ok, spec,
};
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::lmdb::LmdbWrite;
use crate::storage::{Kind, StoreError};

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListOp {
    Push {
        key: Vec<u8>,
        values: Vec<Vec<u8>>,
        left: bool,
        existing_only: bool,
    },
    /// `count` None: one element (bulk reply); Some: up to count (array reply).
    Pop {
        key: Vec<u8>,
        left: bool,
        count: Option<u64>,
    },
    Set {
        key: Vec<u8>,
        index: i64,
        value: Vec<u8>,
    },
    Rem {
        key: Vec<u8>,
        count: i64,
        value: Vec<u8>,
    },
    Trim {
        key: Vec<u8>,
        start: i64,
        stop: i64,
    },
    Insert {
        key: Vec<u8>,
        before: bool,
        pivot: Vec<u8>,
        value: Vec<u8>,
    },
    Move {
        src: Vec<u8>,
        dst: Vec<u8>,
        from_left: bool,
        to_left: bool,
    },
}

/// A position as an order-preserving sub-key.
fn pos(seq: i64) -> [u8; 8] {
    ((seq as u64) ^ (1 << 63)).to_be_bytes()
}

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

fn corrupt() -> StoreError {
    StoreError::damaged("list element missing")
}

/// Removes one element from an end; the caller saves the metadata.
fn pop_one(
    tx: &mut Tx<'_, '_, '_>,
    coll: &mut CollMeta,
    left: bool,
) -> Result<Vec<u8>, StoreError> {
    let seq = if left { coll.head } else { coll.tail - 1 };
    let v = tx.elem_get(coll.id, &pos(seq))?.ok_or_else(corrupt)?;
    tx.elem_del(coll.id, &pos(seq))?;
    if left {
        coll.head += 1;
    } else {
        coll.tail -= 1;
    }
    coll.len -= 1;
    Ok(v)
}

fn push_one(
    tx: &mut Tx<'_, '_, '_>,
    coll: &mut CollMeta,
    left: bool,
    value: &[u8],
) -> Result<(), StoreError> {
    let seq = if left {
        coll.head -= 1;
        coll.head
    } else {
        coll.tail += 1;
        coll.tail - 1
    };
    coll.len += 1;
    tx.elem_put(coll.id, &pos(seq), value)
}

/// Replaces the whole list's elements by `values` (LREM, LINSERT).
fn rewrite(
    tx: &mut Tx<'_, '_, '_>,
    coll: &mut CollMeta,
    values: &[Vec<u8>],
) -> Result<(), StoreError> {
    for seq in coll.head..coll.tail {
        tx.elem_del(coll.id, &pos(seq))?;
    }
    coll.tail = coll.head;
    coll.len = 0;
    for v in values {
        push_one(tx, coll, false, v)?;
    }
    Ok(())
}

/// Runs a list write in the writer's transaction.
pub fn apply(w: &mut LmdbWrite<'_, '_>, op: &ListOp, now: u64) -> Result<Outcome, StoreError> {
    let mut tx = Tx { w, now };
    match op {
        ListOp::Push {
            key,
            values,
            left,
            existing_only,
        } => {
            let (meta, mut coll) = match tx.find(key, Kind::List)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing if *existing_only => return Ok(Outcome::Int(0)),
                Found::Missing => tx.create(Kind::List)?,
                Found::Coll(m, c) => (m, c),
            };
            for v in values {
                push_one(&mut tx, &mut coll, *left, v)?;
            }
            tx.save(key, &meta, &coll)?;
            Ok(Outcome::Int(coll.len as i64))
        }
        ListOp::Pop { key, left, count } => {
            let (meta, mut coll) = match tx.find(key, Kind::List)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => {
                    return Ok(if count.is_some() {
                        Outcome::NilArray
                    } else {
                        Outcome::Nil
                    });
                }
                Found::Coll(m, c) => (m, c),
            };
            let n = count.unwrap_or(1).min(coll.len);
            let mut values = Vec::with_capacity(n as usize);
            for _ in 0..n {
                values.push(Outcome::Bulk(pop_one(&mut tx, &mut coll, *left)?));
            }
            tx.save(key, &meta, &coll)?;
            Ok(match count {
                Some(_) => Outcome::Array(values),
                None => values.pop().unwrap_or(Outcome::Nil),
            })
        }
        ListOp::Set { key, index, value } => {
            let (meta, coll) = match tx.find(key, Kind::List)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Err("ERR no such key")),
                Found::Coll(m, c) => (m, c),
            };
            let i = if *index < 0 {
                coll.len as i64 + index
            } else {
                *index
            };
            if i < 0 || i >= coll.len as i64 {
                return Ok(Outcome::Err("ERR index out of range"));
            }
            tx.elem_put(coll.id, &pos(coll.head + i), value)?;
            tx.save(key, &meta, &coll)?;
            Ok(Outcome::Done)
        }
        ListOp::Rem { key, count, value } => {
            let (meta, mut coll) = match tx.find(key, Kind::List)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Int(0)),
                Found::Coll(m, c) => (m, c),
            };
            let mut values: Vec<Vec<u8>> =
                tx.elems_all(coll.id)?.into_iter().map(|(_, v)| v).collect();
            let limit = if *count == 0 {
                usize::MAX
            } else {
                count.unsigned_abs() as usize
            };
            let mut removed = 0;
            let mut keep = vec![true; values.len()];
            let order: Box<dyn Iterator<Item = usize>> = if *count < 0 {
                Box::new((0..values.len()).rev())
            } else {
                Box::new(0..values.len())
            };
            for i in order {
                if removed == limit {
                    break;
                }
                if values[i] == *value {
                    keep[i] = false;
                    removed += 1;
                }
            }
            if removed > 0 {
                let mut k = keep.iter();
                values.retain(|_| *k.next().unwrap_or(&true));
                rewrite(&mut tx, &mut coll, &values)?;
                tx.save(key, &meta, &coll)?;
            }
            Ok(Outcome::Int(removed as i64))
        }
        ListOp::Trim { key, start, stop } => {
            let (meta, mut coll) = match tx.find(key, Kind::List)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Done),
                Found::Coll(m, c) => (m, c),
            };
            let (s, e) = match clamp_range(*start, *stop, coll.len) {
                Some((s, e)) => (coll.head + s as i64, coll.head + e as i64),
                None => (coll.tail, coll.tail - 1),
            };
            for seq in (coll.head..s).chain(e + 1..coll.tail) {
                tx.elem_del(coll.id, &pos(seq))?;
            }
            if s > e {
                coll.head = coll.tail;
                coll.len = 0;
            } else {
                coll.head = s;
                coll.tail = e + 1;
                coll.len = (e + 1 - s) as u64;
            }
            tx.save(key, &meta, &coll)?;
            Ok(Outcome::Done)
        }
        ListOp::Insert {
            key,
            before,
            pivot,
            value,
        } => {
            let (meta, mut coll) = match tx.find(key, Kind::List)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Int(0)),
                Found::Coll(m, c) => (m, c),
            };
            let mut values: Vec<Vec<u8>> =
                tx.elems_all(coll.id)?.into_iter().map(|(_, v)| v).collect();
            let Some(at) = values.iter().position(|v| v == pivot) else {
                return Ok(Outcome::Int(-1));
            };
            values.insert(if *before { at } else { at + 1 }, value.clone());
            rewrite(&mut tx, &mut coll, &values)?;
            tx.save(key, &meta, &coll)?;
            Ok(Outcome::Int(coll.len as i64))
        }
        ListOp::Move {
            src,
            dst,
            from_left,
            to_left,
        } => {
            let (smeta, mut scoll) = match tx.find(src, Kind::List)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Nil),
                Found::Coll(m, c) => (m, c),
            };
            if tx.find(dst, Kind::List)? == Found::WrongType {
                return Ok(Outcome::WrongType);
            }
            let v = pop_one(&mut tx, &mut scoll, *from_left)?;
            tx.save(src, &smeta, &scoll)?;
            let (dmeta, mut dcoll) = match tx.find(dst, Kind::List)? {
                Found::Coll(m, c) => (m, c),
                _ => tx.create(Kind::List)?,
            };
            push_one(&mut tx, &mut dcoll, *to_left, &v)?;
            tx.save(dst, &dmeta, &dcoll)?;
            Ok(Outcome::Bulk(v))
        }
    }
}

/// Answers a list read from the worker's transaction, writing RESP into `out`.
pub fn read(code: u8, args: Args<'_>, cx: &ReadCx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    let coll = match cx.lookup(args.get(1), Kind::List) {
        Ok(c) => c,
        Err(msg) => return enc::error(out, &msg),
    };
    let elem = |c: &CollMeta, seq: i64| cx.store.elems.get(cx.txn, &elem_key(c.id, &pos(seq)));
    match code {
        LLEN => enc::int(out, coll.map_or(0, |c| c.len as i64)),
        LINDEX => {
            let Some(i) = parse_i64(args.get(2)) else {
                return enc::error(out, NOT_INTEGER);
            };
            let Some(c) = coll else {
                return enc::null(out, v3);
            };
            let i = if i < 0 { c.len as i64 + i } else { i };
            if i < 0 || i >= c.len as i64 {
                return enc::null(out, v3);
            }
            match elem(&c, c.head + i) {
                Ok(Some(v)) => enc::bulk(out, v),
                Ok(None) => enc::null(out, v3),
                Err(e) => super::storage_error(out, e),
            }
        }
        LRANGE => {
            let (Some(start), Some(stop)) = (parse_i64(args.get(2)), parse_i64(args.get(3))) else {
                return enc::error(out, NOT_INTEGER);
            };
            let Some((c, (s, e))) =
                coll.and_then(|c| clamp_range(start, stop, c.len).map(|r| (c, r)))
            else {
                return enc::array(out, 0);
            };
            let lo = elem_key(c.id, &pos(c.head + s as i64));
            let hi = elem_key(c.id, &pos(c.head + e as i64));
            let range = (Bound::Included(&lo[..]), Bound::Included(&hi[..]));
            let start_len = out.len();
            enc::array(out, (e - s + 1) as usize);
            let mut n = 0;
            let walk = |out: &mut Vec<u8>, n: &mut u64| -> Result<(), StoreError> {
                for r in cx.store.elems.range(cx.txn, &range)? {
                    enc::bulk(out, r?.1);
                    *n += 1;
                }
                Ok(())
            };
            if let Err(err) = walk(out, &mut n) {
                out.truncate(start_len);
                return super::storage_error(out, err);
            }
            if n != e - s + 1 {
                out.truncate(start_len);
                super::storage_error(out, StoreError::damaged("list elements missing"));
            }
        }
        LPOS => lpos(args, coll, cx, out, v3),
        _ => enc::error(out, SYNTAX),
    }
}

/// LPOS key element [RANK rank] [COUNT num] [MAXLEN len].
fn lpos(args: Args<'_>, coll: Option<CollMeta>, cx: &ReadCx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
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
    let target = args.get(2);
    let mut found: Vec<i64> = Vec::new();
    if let Some(c) = coll {
        let want = match count {
            Some(0) => usize::MAX,
            Some(n) => n as usize,
            None => 1,
        };
        let mut skip = rank.unsigned_abs() - 1;
        let limit = if maxlen == 0 {
            c.len as i64
        } else {
            maxlen.min(c.len as i64)
        };
        for step in 0..limit {
            let idx = if rank > 0 {
                step
            } else {
                c.len as i64 - 1 - step
            };
            match cx
                .store
                .elems
                .get(cx.txn, &elem_key(c.id, &pos(c.head + idx)))
            {
                Ok(Some(v)) if v == target => {
                    if skip > 0 {
                        skip -= 1;
                    } else {
                        found.push(idx);
                        if found.len() >= want {
                            break;
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => return super::storage_error(out, e),
            }
        }
    }
    match count {
        None => match found.first() {
            Some(&i) => enc::int(out, i),
            None => enc::null(out, v3),
        },
        Some(_) => {
            enc::array(out, found.len());
            for i in found {
                enc::int(out, i);
            }
        }
    }
}
