//! Sets: one element record per member, `id ++ member -> (empty)`, so members come back in byte
//! order (SMEMBERS, SSCAN, and the results of SINTER/SUNION/SDIFF; Redis's order is its own).
//! SADD/SREM/SISMEMBER are O(log n) per member, SCARD is O(1) (the metadata's count), SMEMBERS
//! is one cursor walk. SINTER walks the smallest set and looks each member up in the others;
//! SUNION merges the sets' sorted walks; SDIFF walks the first set and looks members up in the
//! others. The *STORE forms overwrite their destination whatever it held (an empty result
//! deletes it) and answer the result's cardinality.
//!
//! Members are at most `MAX_SUB` (495) bytes: SADD of a longer one answers `ERR memkeep: member
//! longer than 495 bytes`; elsewhere such a member is simply absent.
//!
//! SPOP and SRANDMEMBER pick exactly uniformly from small sets and for counts that are a fair
//! share of the set (one walk); otherwise with `hash::Picker`, O(log n) seeks per pick but
//! biased (see there).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use heed::types::Bytes;
use heed::{Database, RoTxn};

use super::hash::{
    MAX_REPEAT_PICKS, REPLY_TOO_LARGE, TOO_MANY_PICKS, elements, pick_one, rand_count,
    sample_distinct, sample_repeats, scan, sub_ok, walk,
};
use super::{CollMeta, Found, MAX_SUB, ReadCx, Tx, elem_key, storage_error};
use crate::command::{Outcome, REPLY_MAX};
use crate::commands::{Args, Cmd, Family, KEY1, NOKEY, R, SYNTAX, Spec, W, key_ok, spec};
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::lmdb::LmdbWrite;
use crate::storage::{Kind, StoreError, WriteView};

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

/// How SINTER/SUNION/SDIFF (and their STORE forms) combine their sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    Inter,
    Union,
    Diff,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetOp {
    Add {
        key: Vec<u8>,
        members: Vec<Vec<u8>>,
    },
    Rem {
        key: Vec<u8>,
        members: Vec<Vec<u8>>,
    },
    /// `count` None: one member (bulk reply); Some: up to count (array reply).
    Pop {
        key: Vec<u8>,
        count: Option<u64>,
    },
    Move {
        src: Vec<u8>,
        dst: Vec<u8>,
        member: Vec<u8>,
    },
    /// SINTERSTORE/SUNIONSTORE/SDIFFSTORE.
    Store {
        how: Combine,
        dst: Vec<u8>,
        keys: Vec<Vec<u8>>,
    },
}

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

/// Whether `member` is in set `id`; `buf` is scratch for the element key.
fn contains(
    db: Database<Bytes, Bytes>,
    txn: &RoTxn,
    id: u64,
    member: &[u8],
    buf: &mut Vec<u8>,
) -> Result<bool, StoreError> {
    if member.len() > MAX_SUB {
        return Ok(false);
    }
    buf.clear();
    buf.extend_from_slice(&id.to_be_bytes());
    buf.extend_from_slice(member);
    Ok(db.get(txn, buf)?.is_some())
}

/// The members of the sets' intersection, union or difference (a missing key is an empty
/// set), in byte order; at most `limit` of them.
fn combine<'t>(
    db: Database<Bytes, Bytes>,
    txn: &'t RoTxn,
    how: Combine,
    sets: &[Option<CollMeta>],
    limit: usize,
) -> Result<Vec<&'t [u8]>, StoreError> {
    let mut found: Vec<&[u8]> = Vec::new();
    let mut buf = Vec::new();
    match how {
        Combine::Inter => {
            let Some(mut sets) = sets.iter().copied().collect::<Option<Vec<CollMeta>>>() else {
                return Ok(found);
            };
            sets.sort_by_key(|c| c.len);
            let Some((first, others)) = sets.split_first() else {
                return Ok(found);
            };
            'members: for e in elements(db, txn, first.id)? {
                if found.len() >= limit {
                    break;
                }
                let (m, _) = e?;
                for o in others {
                    if !contains(db, txn, o.id, m, &mut buf)? {
                        continue 'members;
                    }
                }
                found.push(m);
            }
        }
        Combine::Diff => {
            let Some(Some(first)) = sets.first() else {
                return Ok(found);
            };
            let others: Vec<CollMeta> = sets[1..].iter().flatten().copied().collect();
            'members: for e in elements(db, txn, first.id)? {
                if found.len() >= limit {
                    break;
                }
                let (m, _) = e?;
                for o in &others {
                    if contains(db, txn, o.id, m, &mut buf)? {
                        continue 'members;
                    }
                }
                found.push(m);
            }
        }
        Combine::Union => {
            // A merge of the sets' walks, each already in byte order.
            let mut walks = Vec::new();
            let mut heap = BinaryHeap::new();
            for c in sets.iter().flatten() {
                let mut w = elements(db, txn, c.id)?;
                if let Some(e) = w.next() {
                    heap.push(Reverse((e?.0, walks.len())));
                }
                walks.push(w);
            }
            while let Some(Reverse((m, i))) = heap.pop() {
                if found.last() != Some(&m) {
                    if found.len() >= limit {
                        break;
                    }
                    found.push(m);
                }
                if let Some(e) = walks[i].next() {
                    heap.push(Reverse((e?.0, i)));
                }
            }
        }
    }
    Ok(found)
}

/// Runs a set write in the writer's transaction.
pub fn apply(w: &mut LmdbWrite<'_, '_>, op: &SetOp, now: u64) -> Result<Outcome, StoreError> {
    let mut tx = Tx { w, now };
    match op {
        SetOp::Add { key, members } => {
            let (meta, mut coll) = match tx.find(key, Kind::Set)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => tx.create(Kind::Set)?,
                Found::Coll(m, c) => (m, c),
            };
            let (store, txn) = tx.store_txn();
            let mut added = 0;
            for m in members {
                let k = elem_key(coll.id, m);
                if store.elems.put_new(txn, &k, &[])? {
                    added += 1;
                }
            }
            if added > 0 {
                coll.len += added;
                tx.save(key, &meta, &coll)?;
            }
            Ok(Outcome::Int(added as i64))
        }
        SetOp::Rem { key, members } => tx.remove_subs(key, Kind::Set, members),
        SetOp::Pop { key, count } => {
            let (meta, mut coll) = match tx.find(key, Kind::Set)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => {
                    return Ok(if count.is_some() {
                        Outcome::Set(Vec::new())
                    } else {
                        Outcome::Nil
                    });
                }
                Found::Coll(m, c) => (m, c),
            };
            let (store, txn) = tx.store_txn();
            let db = *store.elems;
            let n = count.unwrap_or(1);
            if n >= coll.len {
                // Everything: read it, then drop the key (its elements go to the collector).
                let all: Vec<Outcome> = elements(db, txn, coll.id)?
                    .map(|e| e.map(|(m, _)| Outcome::Bulk(m.to_vec())))
                    .collect::<Result<_, _>>()?;
                tx.w.delete(key)?;
                return Ok(match count {
                    Some(_) => Outcome::Set(all),
                    None => all.into_iter().next().unwrap_or(Outcome::Nil),
                });
            }
            let picked: Vec<Vec<u8>> = match count {
                None => pick_one(db, txn, &coll)?
                    .map(|(m, _)| m.to_vec())
                    .into_iter()
                    .collect(),
                Some(_) => sample_distinct(db, txn, &coll, n)?
                    .into_iter()
                    .map(|(m, _)| m.to_vec())
                    .collect(),
            };
            for m in &picked {
                if tx.elem_del(coll.id, m)? {
                    coll.len -= 1;
                }
            }
            if !picked.is_empty() {
                tx.save(key, &meta, &coll)?;
            }
            let mut popped = picked.into_iter().map(Outcome::Bulk);
            Ok(match count {
                Some(_) => Outcome::Set(popped.collect()),
                None => popped.next().unwrap_or(Outcome::Nil),
            })
        }
        SetOp::Move { src, dst, member } => {
            let (smeta, mut scoll) = match tx.find(src, Kind::Set)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Int(0)),
                Found::Coll(m, c) => (m, c),
            };
            let dfound = tx.find(dst, Kind::Set)?;
            if dfound == Found::WrongType {
                return Ok(Outcome::WrongType);
            }
            if member.len() > MAX_SUB {
                return Ok(Outcome::Int(0));
            }
            if src == dst {
                let (store, txn) = tx.store_txn();
                let there = store.elems.get(txn, &elem_key(scoll.id, member))?.is_some();
                return Ok(Outcome::Int(there as i64));
            }
            if !tx.elem_del(scoll.id, member)? {
                return Ok(Outcome::Int(0));
            }
            scoll.len -= 1;
            tx.save(src, &smeta, &scoll)?;
            let (dmeta, mut dcoll) = match dfound {
                Found::Coll(m, c) => (m, c),
                _ => tx.create(Kind::Set)?,
            };
            let (store, txn) = tx.store_txn();
            let k = elem_key(dcoll.id, member);
            if store.elems.put_new(txn, &k, &[])? {
                dcoll.len += 1;
                tx.save(dst, &dmeta, &dcoll)?;
            }
            Ok(Outcome::Int(1))
        }
        SetOp::Store { how, dst, keys } => {
            let mut sets = Vec::with_capacity(keys.len());
            for k in keys {
                sets.push(match tx.find(k, Kind::Set)? {
                    Found::WrongType => return Ok(Outcome::WrongType),
                    Found::Missing => None,
                    Found::Coll(_, c) => Some(c),
                });
            }
            let (store, txn) = tx.store_txn();
            let members: Vec<Vec<u8>> = combine(*store.elems, txn, *how, &sets, usize::MAX)?
                .into_iter()
                .map(<[u8]>::to_vec)
                .collect();
            if members.is_empty() {
                tx.w.delete(dst)?;
                return Ok(Outcome::Int(0));
            }
            // A new collection replaces whatever `dst` held (its elements, if any, go to the
            // collector when the metadata is overwritten).
            let (meta, mut coll) = tx.create(Kind::Set)?;
            for m in &members {
                tx.elem_put(coll.id, m, &[])?;
            }
            coll.len = members.len() as u64;
            tx.save(dst, &meta, &coll)?;
            Ok(Outcome::Int(coll.len as i64))
        }
    }
}

/// Answers a set read from the worker's transaction, writing RESP into `out`.
pub fn read(code: u8, args: Args<'_>, cx: &ReadCx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    match code {
        SSCAN => return scan(args, cx, Kind::Set, out),
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
    let coll = match cx.lookup(args.get(1), Kind::Set) {
        Ok(c) => c,
        Err(msg) => return enc::error(out, &msg),
    };
    let mut buf = Vec::new();
    let mut has = |m: &[u8]| match coll {
        Some(c) => contains(*cx.store.elems, cx.txn, c.id, m, &mut buf),
        None => Ok(false),
    };
    match code {
        SCARD => enc::int(out, coll.map_or(0, |c| c.len as i64)),
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
            enc::set(out, c.len as usize, v3);
            if let Err(msg) = walk(cx.store, cx.txn, &c, |m, _| enc::bulk(out, m)) {
                out.truncate(start);
                enc::error(out, &msg);
            }
        }
        _ => enc::error(out, SYNTAX),
    }
}

/// The sets under `args[from..upto]`, a missing key as None; Err is the reply to send instead
/// (WRONGTYPE if any of them is not a set).
fn sources(
    args: Args<'_>,
    from: usize,
    upto: usize,
    cx: &ReadCx<'_, '_>,
) -> Result<Vec<Option<CollMeta>>, String> {
    (from..upto)
        .map(|i| cx.lookup(args.get(i), Kind::Set))
        .collect()
}

/// SINTER/SUNION/SDIFF key...: the result as a set reply.
fn combine_reply(how: Combine, args: Args<'_>, cx: &ReadCx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
    let sets = match sources(args, 1, args.len(), cx) {
        Ok(s) => s,
        Err(msg) => return enc::error(out, &msg),
    };
    match combine(*cx.store.elems, cx.txn, how, &sets, usize::MAX) {
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
fn intercard(args: Args<'_>, cx: &ReadCx<'_, '_>, out: &mut Vec<u8>) {
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
        Err(msg) => return enc::error(out, &msg),
    };
    match combine(*cx.store.elems, cx.txn, Combine::Inter, &sets, limit) {
        Ok(members) => enc::int(out, members.len() as i64),
        Err(e) => storage_error(out, e),
    }
}

/// SRANDMEMBER key [count].
fn randmember(args: Args<'_>, cx: &ReadCx<'_, '_>, out: &mut Vec<u8>, v3: bool) {
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
    let coll = match cx.lookup(args.get(1), Kind::Set) {
        Ok(c) => c,
        Err(msg) => return enc::error(out, &msg),
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
