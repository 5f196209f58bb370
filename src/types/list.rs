//! Lists: elements keyed by position, `id ++ pos`, with positions contiguous from the
//! metadata's `head` to `tail - 1`. LPUSH/RPUSH/LPOP/RPOP/LINDEX/LSET are O(log n); LRANGE is
//! one cursor walk, O(log n + k); LREM, LINSERT and LPOS rewrite or scan the list, O(n), as in
//! Redis.
//!
//! The reads (`range`, `positions`) are the LMDB side of `read::CollRead`'s list reads; the
//! commands' argument parsing and replies are `crate::commands::list`'s.

use std::ops::Bound;

use heed::types::Bytes;
use heed::{Database, RoTxn};

use super::read::PosQuery;
use super::{CollMeta, Found, Tx, clamp_range, elem_key};
use crate::outcome::Outcome;
use crate::storage::lmdb::LmdbWrite;
use crate::storage::{Kind, StoreError};

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
pub fn pos(seq: i64) -> [u8; 8] {
    ((seq as u64) ^ (1 << 63)).to_be_bytes()
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

/// The elements at indexes `s..=e` (already clamped, `clamp_range`) of list `c`, in order,
/// straight from the map: one cursor walk.
pub fn range<'t>(
    elems: &Database<Bytes, Bytes>,
    txn: &'t RoTxn<'_>,
    c: &CollMeta,
    (s, e): (u64, u64),
    mut each: impl FnMut(&'t [u8]),
) -> Result<(), StoreError> {
    let lo = elem_key(c.id, &pos(c.head + s as i64));
    let hi = elem_key(c.id, &pos(c.head + e as i64));
    let range = (Bound::Included(&lo[..]), Bound::Included(&hi[..]));
    let mut n = 0;
    for r in elems.range(txn, &range)? {
        each(r?.1);
        n += 1;
    }
    if n == e - s + 1 {
        Ok(())
    } else {
        Err(StoreError::damaged("list elements missing"))
    }
}

/// LPOS: the indexes of list `c`'s elements equal to `target`, from the `q.rank`-th match
/// (from the end when negative), at most `q.want` of them, among the first (or last) `q.maxlen`
/// elements (0: all). O(n): one lookup per element looked at.
pub fn positions(
    elems: &Database<Bytes, Bytes>,
    txn: &RoTxn<'_>,
    c: &CollMeta,
    target: &[u8],
    q: PosQuery,
) -> Result<Vec<u64>, StoreError> {
    let mut found = Vec::new();
    let mut skip = q.rank.unsigned_abs().saturating_sub(1);
    let limit = if q.maxlen == 0 {
        c.len
    } else {
        q.maxlen.min(c.len)
    };
    for step in 0..limit {
        let idx = if q.rank > 0 { step } else { c.len - 1 - step };
        match elems.get(txn, &elem_key(c.id, &pos(c.head + idx as i64)))? {
            Some(v) if v == target => {
                if skip > 0 {
                    skip -= 1;
                } else {
                    found.push(idx);
                    if found.len() >= q.want {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(found)
}
