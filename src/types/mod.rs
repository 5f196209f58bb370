//! Redis collections on LMDB: lists, hashes, sets and sorted sets.
//!
//! Layout (as Kvrocks and LedisDB lay types over an ordered store, adapted to LMDB):
//! - the key's record in `items` has the collection's kind and, as its value, its metadata
//!   (`CollMeta`): a 64-bit id fixed at creation, the element count, and a list's head/tail;
//! - each element is a record in `elems` under `id (u64 BE) ++ sub-key`: a list's position
//!   (order-preserving i64), a hash's field, a set's or sorted set's member;
//! - a sorted set also indexes `id ++ order-preserving score ++ member` in `zscore`.
//!
//! So a range (LRANGE, HGETALL, ZRANGE) is one B-tree cursor walk, O(log n + k); keying
//! elements by id rather than by key keeps records short and lets RENAME move only the metadata;
//! DEL of any collection is O(1): its id goes to the `gc` database and the writer reclaims the
//! elements in bounded chunks. An empty collection is deleted, as Redis does.
//!
//! This is storage, protocol-neutral (`tests/layering.rs` checks that nothing here names a
//! protocol or the command layer):
//! - each family module defines its typed write (`ListOp`, `HashOp`, `SetOp`, `ZSetOp`,
//!   `blocking::PopForm`) and `apply` (run it in the writer's transaction, answering an
//!   `Outcome`), and the walks of its layout;
//! - `read` defines the typed reads of all four families (`CollRead`), implemented on `ReadCx`
//!   (a worker's snapshot, or EXEC's and a script's write transaction seen as a read one);
//! - `model` is the same writes and reads on plain in-memory collections, the reference the
//!   model-based tests (`tests/types_model.rs`) compare the store with.
//!
//! The RESP side of each family (its command table, the parse of its arguments into those
//! writes and reads, the encoding of their results) is in `crate::commands`.

pub mod blocking;
pub mod hash;
pub mod keys;
pub mod list;
pub mod model;
pub mod rdb;
pub mod read;
pub mod set;
pub mod zcombine;
pub mod zrank;
pub mod zset;

use heed::RoTxn;

use crate::storage::lmdb::LogTxn;

use crate::outcome::Outcome;
use crate::storage::lmdb::{LmdbStore, LmdbWrite};
use crate::storage::{ItemMeta, Kind, StoreError, WriteView, item};

/// A collection write, carried to the writer inside `WriteOp::Coll`.
#[derive(Debug, Clone, PartialEq)]
pub enum CollOp {
    List(list::ListOp),
    Hash(hash::HashOp),
    Set(set::SetOp),
    ZSet(zset::ZSetOp),
    /// LMPOP, ZMPOP, and a blocking pop inside MULTI: a pop over several keys that never waits.
    Pop(blocking::PopForm),
    /// COPY and RESTORE, which write a whole value of any type.
    Key(keys::KeyOp),
}

impl CollOp {
    /// Calls `f` with every key the write may change (the destination only, for a STORE).
    pub fn for_each_key(&self, f: &mut dyn FnMut(&[u8])) {
        use hash::HashOp as H;
        use list::ListOp as L;
        use set::SetOp as S;
        use zset::ZSetOp as Z;
        match self {
            CollOp::List(
                L::Push { key, .. }
                | L::Pop { key, .. }
                | L::Set { key, .. }
                | L::Rem { key, .. }
                | L::Trim { key, .. }
                | L::Insert { key, .. },
            ) => f(key),
            CollOp::List(L::Move { src, dst, .. }) | CollOp::Set(S::Move { src, dst, .. }) => {
                f(src);
                f(dst);
            }
            CollOp::Hash(
                H::Set { key, .. }
                | H::Del { key, .. }
                | H::IncrBy { key, .. }
                | H::IncrByFloat { key, .. },
            ) => f(key),
            CollOp::Set(S::Add { key, .. } | S::Rem { key, .. } | S::Pop { key, .. }) => f(key),
            CollOp::Set(S::Store { dst, .. }) => f(dst),
            CollOp::ZSet(
                Z::Add { key, .. }
                | Z::Rem { key, .. }
                | Z::RemRange { key, .. }
                | Z::Pop { key, .. },
            ) => f(key),
            CollOp::ZSet(Z::Store { dst, .. } | Z::RangeStore { dst, .. }) => f(dst),
            CollOp::Pop(form) => form.for_each_key(f),
            CollOp::Key(k) => f(k.key()),
        }
    }
}

/// Runs a collection write in the writer's transaction.
pub fn apply(w: &mut LmdbWrite<'_, '_>, op: &CollOp, now: u64) -> Result<Outcome, StoreError> {
    match op {
        CollOp::List(op) => list::apply(w, op, now),
        CollOp::Hash(op) => hash::apply(w, op, now),
        CollOp::Set(op) => set::apply(w, op, now),
        CollOp::ZSet(op) => zset::apply(w, op, now),
        CollOp::Pop(form) => blocking::apply(w, form, now),
        CollOp::Key(op) => keys::apply(w, op, now),
    }
}

/// A collection's metadata, the value of its record in `items`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollMeta {
    pub id: u64,
    pub len: u64,
    /// Lists: the position of the first element.
    pub head: i64,
    /// Lists: one past the position of the last element.
    pub tail: i64,
}

impl CollMeta {
    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.head.to_le_bytes());
        b[24..32].copy_from_slice(&self.tail.to_le_bytes());
        b
    }

    pub fn decode(v: &[u8]) -> Result<CollMeta, StoreError> {
        let word = |i: usize| -> Result<[u8; 8], StoreError> {
            v.get(i * 8..i * 8 + 8)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| StoreError::damaged("collection metadata truncated"))
        };
        Ok(CollMeta {
            id: u64::from_le_bytes(word(0)?),
            len: u64::from_le_bytes(word(1)?),
            head: i64::from_le_bytes(word(2)?),
            tail: i64::from_le_bytes(word(3)?),
        })
    }
}

/// What is under a key, as a collection command sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Missing,
    WrongType,
    Coll(ItemMeta, CollMeta),
}

fn classify(bytes: Option<&[u8]>, kind: Kind, now: u64) -> Result<Found, StoreError> {
    let Some(bytes) = bytes else {
        return Ok(Found::Missing);
    };
    let item = item::decode(bytes)?;
    if item.meta.is_expired(now) {
        Ok(Found::Missing)
    } else if item.meta.kind != kind {
        Ok(Found::WrongType)
    } else {
        Ok(Found::Coll(item.meta, CollMeta::decode(item.value)?))
    }
}

/// What is under a key for a command that takes collections of more than one kind (the
/// sources of ZUNIONSTORE and its kin: sets or sorted sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundAny {
    Missing,
    WrongType,
    Coll(Kind, CollMeta),
}

fn classify_any(bytes: Option<&[u8]>, kinds: &[Kind], now: u64) -> Result<FoundAny, StoreError> {
    let Some(bytes) = bytes else {
        return Ok(FoundAny::Missing);
    };
    let item = item::decode(bytes)?;
    if item.meta.is_expired(now) {
        Ok(FoundAny::Missing)
    } else if !kinds.contains(&item.meta.kind) {
        Ok(FoundAny::WrongType)
    } else {
        Ok(FoundAny::Coll(
            item.meta.kind,
            CollMeta::decode(item.value)?,
        ))
    }
}

/// The element key of `sub` in collection `id`.
pub fn elem_key(id: u64, sub: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + sub.len());
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(sub);
    k
}

/// Longest sub-key (hash field, set member) an element record can carry: LMDB's key limit
/// minus the 8-byte id (and, in the score index, 8 bytes of score).
pub const MAX_SUB: usize = crate::storage::MAX_KEY - 16;

/// A collection's elements as (sub-key, value) pairs, in order.
pub type Elems = Vec<(Vec<u8>, Vec<u8>)>;

/// The writer's view for collection commands: the store, the transaction and the CAS counter.
pub struct Tx<'a, 'w, 'e> {
    pub w: &'a mut LmdbWrite<'w, 'e>,
    pub now: u64,
}

impl<'e> Tx<'_, '_, 'e> {
    /// The store and the transaction, for what the helpers below do not cover (range walks,
    /// the sorted-set score index).
    pub fn store_txn(&mut self) -> (&LmdbStore, &mut LogTxn<'e>) {
        self.w.parts()
    }

    /// Looks `key` up as a collection of `kind`.
    pub fn find(&mut self, key: &[u8], kind: Kind) -> Result<Found, StoreError> {
        let now = self.now;
        let (store, txn) = self.store_txn();
        if key.is_empty() || key.len() > crate::storage::MAX_KEY {
            return Ok(Found::Missing);
        }
        classify(store.items().get(txn, key)?, kind, now)
    }

    /// Looks `key` up as a collection of any of `kinds`.
    pub fn find_any(&mut self, key: &[u8], kinds: &[Kind]) -> Result<FoundAny, StoreError> {
        let now = self.now;
        let (store, txn) = self.store_txn();
        if key.is_empty() || key.len() > crate::storage::MAX_KEY {
            return Ok(FoundAny::Missing);
        }
        classify_any(store.items().get(txn, key)?, kinds, now)
    }

    /// A new, empty collection of `kind` (not stored until `save`).
    pub fn create(&mut self, kind: Kind) -> Result<(ItemMeta, CollMeta), StoreError> {
        let (store, txn) = self.store_txn();
        store.mark_collections(txn)?;
        let id = self.w.next_cas();
        Ok((
            ItemMeta::new(kind, 0, 0, id),
            CollMeta {
                id,
                len: 0,
                head: 0,
                tail: 0,
            },
        ))
    }

    /// Stores the metadata (with a new CAS unique); deletes the key when the collection is
    /// empty.
    pub fn save(&mut self, key: &[u8], meta: &ItemMeta, coll: &CollMeta) -> Result<(), StoreError> {
        if coll.len == 0 {
            // No elements are left to reclaim.
            self.w.take(key)?;
            return Ok(());
        }
        let mut meta = *meta;
        meta.cas = self.w.next_cas();
        self.w.put(key, &meta, &[&coll.encode()])
    }

    pub fn elem_get(&mut self, id: u64, sub: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let (store, txn) = self.store_txn();
        Ok(store
            .elems
            .get(txn, &elem_key(id, sub))?
            .map(|v| v.to_vec()))
    }

    pub fn elem_put(&mut self, id: u64, sub: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let (store, txn) = self.store_txn();
        Ok(store.elems.put(txn, &elem_key(id, sub), value)?)
    }

    pub fn elem_del(&mut self, id: u64, sub: &[u8]) -> Result<bool, StoreError> {
        let (store, txn) = self.store_txn();
        Ok(store.elems.delete(txn, &elem_key(id, sub))?)
    }

    /// HDEL/SREM: removes these sub-keys from the `kind` collection under `key`; how many were
    /// there, as `Int`.
    pub fn remove_subs(
        &mut self,
        key: &[u8],
        kind: Kind,
        subs: &[Vec<u8>],
    ) -> Result<Outcome, StoreError> {
        let (meta, mut coll) = match self.find(key, kind)? {
            Found::WrongType => return Ok(Outcome::WrongType),
            Found::Missing => return Ok(Outcome::Int(0)),
            Found::Coll(m, c) => (m, c),
        };
        let mut removed = 0;
        for sub in subs {
            if sub.len() <= MAX_SUB && self.elem_del(coll.id, sub)? {
                removed += 1;
            }
        }
        if removed > 0 {
            coll.len -= removed;
            self.save(key, &meta, &coll)?;
        }
        Ok(Outcome::Int(removed as i64))
    }

    /// Every (sub-key, value) of collection `id`, in order.
    pub fn elems_all(&mut self, id: u64) -> Result<Elems, StoreError> {
        let (store, txn) = self.store_txn();
        let prefix = id.to_be_bytes();
        store
            .elems
            .prefix_iter(txn, &prefix[..])?
            .map(|r| {
                r.map(|(k, v)| (k[8..].to_vec(), v.to_vec()))
                    .map_err(StoreError::from)
            })
            .collect()
    }
}

/// The worker's view for collection reads.
pub struct ReadCx<'a, 't> {
    /// The pass's snapshot (it derefs to the store, for the element databases).
    pub store: &'a crate::storage::overlay::Snap<'t>,
    pub txn: &'t RoTxn<'t>,
    pub now: u64,
    /// A delayed flush_all has come due: everything reads as missing.
    pub flushed: bool,
}

impl ReadCx<'_, '_> {
    /// Looks `key` up as a collection of any of `kinds` for a read.
    pub fn find_any(&self, key: &[u8], kinds: &[Kind]) -> Result<FoundAny, StoreError> {
        if self.flushed || key.is_empty() || key.len() > crate::storage::MAX_KEY {
            return Ok(FoundAny::Missing);
        }
        let found = classify_any(self.store.record(key)?, kinds, self.now)?;
        match found {
            FoundAny::Coll(_, c) => self.current(c).map(|_| found),
            _ => Ok(found),
        }
    }

    pub fn find(&self, key: &[u8], kind: Kind) -> Result<Found, StoreError> {
        let found = self.find_record(key, kind)?;
        match found {
            Found::Coll(_, c) => self.current(c).map(|_| found),
            _ => Ok(found),
        }
    }

    /// `find` for a read of the collection's metadata only (its count): the snapshot's
    /// record, whether or not its elements are current there.
    pub fn find_record(&self, key: &[u8], kind: Kind) -> Result<Found, StoreError> {
        if self.flushed || key.is_empty() || key.len() > crate::storage::MAX_KEY {
            return Ok(Found::Missing);
        }
        classify(self.store.record(key)?, kind, self.now)
    }

    /// Ok when this snapshot holds `coll`'s elements as they are; else the read stops here
    /// and runs in the writer's transaction (`Snap::note_pending`).
    pub fn current(&self, coll: CollMeta) -> Result<(), StoreError> {
        match self.store.coll_dirty(coll.id) {
            true => Err(self.store.note_pending()),
            false => Ok(()),
        }
    }
}

/// A pseudo-random u64 (SPOP, SRANDMEMBER, RANDOMKEY): xorshift per thread, seeded from the
/// time and the thread. Not for anything secret.
pub fn random_u64() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x9e37_79b9_7f4a_7c15);
            let here = &t as *const u64 as u64;
            (t ^ here.rotate_left(32)) | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

/// Redis's index rule for ranges: negatives count from the end; the result is clamped to
/// [0, len) and may be empty (None).
pub fn clamp_range(start: i64, stop: i64, len: u64) -> Option<(u64, u64)> {
    let len = len as i64;
    let s = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let e = if stop < 0 {
        len + stop
    } else {
        stop.min(len - 1)
    };
    (s <= e && s < len && e >= 0).then_some((s as u64, e as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_roundtrips() {
        let m = CollMeta {
            id: 7,
            len: 3,
            head: -2,
            tail: 1,
        };
        assert_eq!(CollMeta::decode(&m.encode()).expect("decodes"), m);
        assert!(CollMeta::decode(&[0; 10]).is_err());
    }

    #[test]
    fn ranges_follow_redis_index_rules() {
        assert_eq!(clamp_range(0, -1, 5), Some((0, 4)));
        assert_eq!(clamp_range(-2, -1, 5), Some((3, 4)));
        assert_eq!(clamp_range(1, 100, 5), Some((1, 4)));
        assert_eq!(clamp_range(-100, 1, 5), Some((0, 1)));
        assert_eq!(clamp_range(3, 1, 5), None);
        assert_eq!(clamp_range(5, 10, 5), None);
        assert_eq!(clamp_range(0, -1, 0), None);
        assert_eq!(clamp_range(0, -6, 5), None);
    }
}

/// The cache-mode evictor (`storage::cache`) on a collection, which only this layer can build.
#[cfg(test)]
mod eviction_tests {
    use super::Tx;
    use crate::storage::cache::{Access, Cache, EvictPass};
    use crate::storage::lmdb::LmdbStore;
    use crate::storage::{ItemMeta, Kind, WriteView};
    use std::sync::Arc;

    #[test]
    fn a_collection_goes_whole_and_its_elements_are_reclaimed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut store, _) = LmdbStore::open(dir.path(), 256 << 20, 16).expect("open");
        store.set_access(Some(Arc::new(Access::new())));
        let mut cas = 0;
        let mut txn = store.write_txn().expect("txn");
        {
            let mut w = store.writer(&mut txn, &mut cas);
            let mut tx = Tx { w: &mut w, now: 0 };
            let (meta, mut coll) = tx.create(Kind::Hash).expect("create");
            for i in 0..2000u32 {
                tx.elem_put(coll.id, format!("field{i}").as_bytes(), &[3u8; 200])
                    .expect("elem");
            }
            coll.len = 2000;
            tx.save(b"big", &meta, &coll).expect("save");
            // Strings in overflow pages beside it, each freeing its own pages when it goes.
            for i in 0..50 {
                let c = w.next_cas();
                let meta = ItemMeta::new(Kind::String, 0, 0, c);
                w.put(format!("k{i:04}s").as_bytes(), &meta, &[&[5u8; 3000]])
                    .expect("put");
            }
        }
        txn.commit_unlogged().expect("commit");
        let access = store.access().expect("access").clone();
        access.set_tick(cas);
        let ps = store.env().stat().page_size as u64;
        let pages = store
            .data_pages(&store.read_txn().expect("txn"))
            .expect("pages");
        let mut cache = Cache::new(pages / 2 * ps, ps, access, Arc::default());
        let mut txn = store.write_txn().expect("txn");
        let mut p = EvictPass::default();
        for _ in 0..10_000 {
            let pass = cache
                .evict(&store, &mut txn, 1_000, 100_000, &mut |_| {})
                .expect("evict");
            p.reclaimed += pass.reclaimed;
            p.pages = pass.pages;
            if pass.done {
                p.done = true;
                break;
            }
        }
        txn.commit_unlogged().expect("commit");
        assert!(p.done, "{p:?}");
        let txn = store.read_txn().expect("txn");
        assert!(store.get(&txn, b"big").expect("get").is_none(), "{p:?}");
        assert!(p.reclaimed > 0, "{p:?}");
        assert!(p.pages <= cache.low_pages, "{p:?}");
    }
}
