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
//! SPOP and SRANDMEMBER pick exactly uniformly from sets up to 4,096 members and for counts
//! that are a fair share of the set (one walk); otherwise with `hash::Picker`, a seek per trie
//! level and a 64-member window per pick, close to uniform for members of one shape (see
//! there).
//!
//! The commands' argument parsing and replies are `crate::commands::set`'s.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use heed::types::Bytes;
use heed::{Database, RoTxn};

use super::hash::{elements, pick_one, sample_distinct};
use super::{CollMeta, Found, MAX_SUB, Tx, elem_key};
use crate::outcome::Outcome;
use crate::storage::lmdb::LmdbWrite;
use crate::storage::{Kind, StoreError, WriteView};

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

/// Whether `member` is in set `id`; `buf` is scratch for the element key.
pub fn contains(
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
pub fn combine<'t>(
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
