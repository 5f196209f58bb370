//! Whole-value key writes of any type: COPY and RESTORE, and DUMP's walk of a value.
//!
//! COPY of a collection makes a new collection (a new id) and copies the element records, and
//! for a sorted set its score index, record by record in chunks of `CHUNK` (so it holds at most
//! that many in memory), then builds the copy's rank directory in one pass (`zrank::build`). A
//! list keeps its positions (`head`, `tail`). The TTL goes with the value; the destination
//! gets a fresh CAS unique. RESTORE writes a decoded DUMP payload (`rdb`) the same way. Both
//! replace a destination of any type with REPLACE (its elements, if any, go to the collector
//! when the metadata is overwritten), and run in the writer's transaction.

use std::ops::Bound;

use heed::RoTxn;
use heed::types::Bytes;

use super::rdb::{Encoder, Value};
use super::zset::prefix_end;
use super::{CollMeta, Tx, list, zrank, zset};
use crate::outcome::Outcome;
use crate::storage::lmdb::{LmdbWrite, Table};
use crate::storage::{ItemMeta, ItemRef, Kind, StoreError, WriteView, item};

/// Records copied per step of a COPY.
const CHUNK: usize = 1024;

pub const BUSYKEY: &str = "BUSYKEY Target key name already exists.";

#[derive(Debug, Clone, PartialEq)]
pub enum KeyOp {
    /// COPY: `Int` 1 if copied, 0 if the source is missing or the destination exists (without
    /// `replace`).
    Copy {
        src: Vec<u8>,
        dst: Vec<u8>,
        replace: bool,
    },
    /// RESTORE: `Done`, or `Err`.
    Restore(Box<RestoreOp>),
}

/// A RESTORE, its payload already decoded by the worker.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreOp {
    pub key: Vec<u8>,
    /// The value, or the error the request answers unless the key exists without REPLACE
    /// (Redis checks that first): a bad TTL or a bad payload.
    pub value: Result<Value, &'static str>,
    /// Absolute expiry in unix ms; 0: none.
    pub expire_at: u64,
    pub replace: bool,
}

impl KeyOp {
    /// The key the write may change.
    pub fn key(&self) -> &[u8] {
        match self {
            KeyOp::Copy { dst, .. } => dst,
            KeyOp::Restore(r) => &r.key,
        }
    }
}

/// Runs a COPY or RESTORE in the writer's transaction.
pub fn apply(w: &mut LmdbWrite<'_, '_>, op: &KeyOp, now: u64) -> Result<Outcome, StoreError> {
    let mut tx = Tx { w, now };
    match op {
        KeyOp::Copy { src, dst, replace } => copy(&mut tx, src, dst, *replace),
        KeyOp::Restore(r) => restore(&mut tx, r),
    }
}

/// The live item under `key`: its meta and a copy of its value.
fn live(tx: &mut Tx<'_, '_, '_>, key: &[u8]) -> Result<Option<(ItemMeta, Vec<u8>)>, StoreError> {
    if key.is_empty() || key.len() > crate::storage::MAX_KEY {
        return Ok(None);
    }
    let now = tx.now;
    let (store, txn) = tx.store_txn();
    let Some(bytes) = store.items().get(txn, key)? else {
        return Ok(None);
    };
    let item = item::decode(bytes)?;
    Ok((!item.meta.is_expired(now)).then(|| (item.meta, item.value.to_vec())))
}

fn copy(
    tx: &mut Tx<'_, '_, '_>,
    src: &[u8],
    dst: &[u8],
    replace: bool,
) -> Result<Outcome, StoreError> {
    let Some((meta, value)) = live(tx, src)? else {
        return Ok(Outcome::Int(0));
    };
    if !replace && live(tx, dst)?.is_some() {
        return Ok(Outcome::Int(0));
    }
    if meta.kind == Kind::String {
        let cas = tx.w.next_cas();
        let m = ItemMeta::new(Kind::String, meta.flags, meta.expire_at, cas);
        tx.w.put(dst, &m, &[&value])?;
        return Ok(Outcome::Int(1));
    }
    let from = CollMeta::decode(&value)?;
    let (mut m, mut coll) = tx.create(meta.kind)?;
    m.expire_at = meta.expire_at;
    let (store, txn) = tx.store_txn();
    copy_records(&store.elems, txn, from.id, coll.id)?;
    coll.len = from.len;
    if meta.kind == Kind::ZSet {
        copy_records(&store.zscore, txn, from.id, coll.id)?;
        zrank::build(&store.zscore, txn, coll.id)?;
        coll.head = zrank::RANKED;
    } else {
        coll.head = from.head;
        coll.tail = from.tail;
    }
    tx.save(dst, &m, &coll)?;
    Ok(Outcome::Int(1))
}

/// Copies every record under the 8-byte prefix `from` to the same sub-key under `to`.
fn copy_records(
    db: &Table,
    txn: &mut crate::storage::lmdb::LogTxn<'_>,
    from: u64,
    to: u64,
) -> Result<(), StoreError> {
    let mut after: Option<Vec<u8>> = None;
    loop {
        let lo = match &after {
            None => Bound::Included(from.to_be_bytes().to_vec()),
            Some(k) => Bound::Excluded(k.clone()),
        };
        let hi = prefix_end(from);
        let range = (
            lo.as_ref().map(Vec::as_slice),
            hi.as_ref().map(Vec::as_slice),
        );
        let batch: Vec<(Vec<u8>, Vec<u8>)> = db
            .range(txn, &range)?
            .take(CHUNK)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect::<Result<_, _>>()?;
        let mut key = Vec::new();
        for (k, v) in &batch {
            key.clear();
            key.extend_from_slice(&to.to_be_bytes());
            key.extend_from_slice(k.get(8..).unwrap_or_default());
            db.put(txn, &key, v)?;
        }
        if batch.len() < CHUNK {
            return Ok(());
        }
        after = batch.into_iter().next_back().map(|(k, _)| k);
    }
}

fn restore(tx: &mut Tx<'_, '_, '_>, r: &RestoreOp) -> Result<Outcome, StoreError> {
    if !r.replace && live(tx, &r.key)?.is_some() {
        return Ok(Outcome::Err(BUSYKEY));
    }
    let value = match &r.value {
        Ok(v) => v,
        Err(msg) => return Ok(Outcome::Err(msg)),
    };
    if r.expire_at != 0 && r.expire_at <= tx.now {
        // Already expired: Redis answers OK and stores nothing (deleting what REPLACE replaced).
        if r.replace {
            tx.w.delete(&r.key)?;
        }
        return Ok(Outcome::Done);
    }
    let kind = match value {
        Value::String(s) => {
            let cas = tx.w.next_cas();
            let m = ItemMeta::new(Kind::String, 0, r.expire_at, cas);
            tx.w.put(&r.key, &m, &[s])?;
            return Ok(Outcome::Done);
        }
        Value::List(_) => Kind::List,
        Value::Hash(_) => Kind::Hash,
        Value::Set(_) => Kind::Set,
        Value::ZSet(_) => Kind::ZSet,
    };
    let (mut m, mut coll) = tx.create(kind)?;
    m.expire_at = r.expire_at;
    match value {
        Value::String(_) => {}
        Value::List(items) => {
            for (i, v) in items.iter().enumerate() {
                tx.elem_put(coll.id, &list::pos(i as i64), v)?;
            }
            coll.head = 0;
            coll.tail = items.len() as i64;
            coll.len = items.len() as u64;
        }
        Value::Hash(pairs) => {
            for (f, v) in pairs {
                tx.elem_put(coll.id, f, v)?;
            }
            coll.len = pairs.len() as u64;
        }
        Value::Set(members) => {
            for mem in members {
                tx.elem_put(coll.id, mem, &[])?;
            }
            coll.len = members.len() as u64;
        }
        Value::ZSet(pairs) => zset::fill(tx, &mut coll, pairs)?,
    }
    tx.save(&r.key, &m, &coll)?;
    Ok(Outcome::Done)
}

/// DUMP: the value of a live item in Redis 7.0's DUMP format (`rdb`).
pub fn dump(
    elems: &heed::Database<Bytes, Bytes>,
    txn: &RoTxn<'_>,
    item: &ItemRef<'_>,
) -> Result<Vec<u8>, StoreError> {
    if item.meta.kind == Kind::String {
        return Ok(Encoder::string(item.value));
    }
    let coll = CollMeta::decode(item.value)?;
    let mut e = match item.meta.kind {
        Kind::List => Encoder::list(),
        Kind::Hash => Encoder::hash(coll.len),
        Kind::Set => Encoder::set(coll.len),
        _ => Encoder::zset(coll.len),
    };
    let mut n = 0u64;
    for r in elems.prefix_iter(txn, &coll.id.to_be_bytes()[..])? {
        let (k, v) = r?;
        let sub = &k[8..];
        match item.meta.kind {
            Kind::List => e.element(v),
            Kind::Hash => e.pair(sub, v),
            Kind::Set => e.element(sub),
            _ => e.scored(sub, zset::elem_entry(k, v)?.1),
        }
        n += 1;
    }
    if n != coll.len {
        return Err(StoreError::damaged(
            "a collection's element count differs from its metadata",
        ));
    }
    Ok(e.finish())
}
