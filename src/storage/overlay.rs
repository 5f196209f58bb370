//! Writes that are durable in the log but not yet committed to LMDB, as readers see them.
//!
//! The writer keeps one LMDB write transaction open across many batches and commits it only
//! every so often (`writer.rs`): every LMDB commit takes fresh pages for the B-tree paths it
//! touches, and while a checkpoint's snapshot is pinned those pages cannot be reused, so a
//! commit per batch made the data file grow by about 20 KiB per batch. A batch is still
//! acknowledged as soon as it is in the log (and synced, per the sync mode); what it changed
//! in `items` is published here first, so readers see it before LMDB does.
//!
//! Invariants:
//! - A `State` is immutable once published: a persistent (structurally shared) map of the
//!   item records changed since LMDB transaction `base` (None = deleted), over that very LMDB
//!   snapshot. A reader takes one state per event-loop pass and opens an LMDB read
//!   transaction; it uses them together only if that transaction is `base` (or the map is
//!   empty), so a pass sees exactly the store after some batch: MGET and EXEC are atomic,
//!   and nothing a reader saw can be "unseen" later in its pass.
//! - Each batch is published in one swap, before any of its replies leaves.
//! - Only string items and deletions live here. A batch that writes collection elements or
//!   metadata, or clears a database, is committed to LMDB before it is acknowledged and adds
//!   nothing here: a collection read takes the metadata from `items` and the elements from
//!   `elems`, and those must come from one snapshot.
//! - After an LMDB commit the writer publishes an empty state on the new transaction; states
//!   still held by readers stay valid (their transaction is older, their map covers the rest).

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use heed::types::Bytes;
use heed::{RoTxn, WithoutTls};

use super::StoreError;
use super::item::{self, ItemRef};
use super::lmdb::LmdbStore;

/// An item record, or None for a deleted key.
pub type Val = Option<Arc<[u8]>>;
pub type Map = rpds::RedBlackTreeMapSync<Box<[u8]>, Val>;

/// The published view: item records changed after LMDB transaction `base`.
pub struct State {
    pub base: usize,
    pub map: Map,
}

/// The current state, swapped by the writer, cloned by readers.
pub struct Overlay {
    current: Mutex<Arc<State>>,
    /// Someone (a backup) wants LMDB to hold every acknowledged write: commit soon.
    pub commit_asked: AtomicBool,
}

impl Overlay {
    pub fn new(base: usize) -> Overlay {
        Overlay {
            current: Mutex::new(Arc::new(State {
                base,
                map: Map::new_sync(),
            })),
            commit_asked: AtomicBool::new(false),
        }
    }

    /// Waits until LMDB holds every write acknowledged before the call (the overlay of that
    /// moment has been committed), asking the writer to commit soon; false on timeout.
    pub fn wait_committed(&self, timeout: std::time::Duration) -> bool {
        let then = self.current();
        if then.map.is_empty() {
            return true;
        }
        self.commit_asked.store(true, Ordering::Release);
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if self.current().base > then.base {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        false
    }

    pub fn current(&self) -> Arc<State> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Publishes a new state (the writer only).
    pub fn publish(&self, base: usize, map: Map) {
        let state = Arc::new(State { base, map });
        let old = std::mem::replace(
            &mut *self.current.lock().unwrap_or_else(|p| p.into_inner()),
            state,
        );
        // The old state's nodes are freed here or by the last reader holding it, never under
        // the lock.
        drop(old);
    }
}

/// Applies the `items` records of a batch's log payload to `map`. Returns false (and leaves
/// `map` as it may be, partly updated: the caller discards it) when the batch did something a
/// reader must not see through the overlay: collection records, or a clear.
pub fn absorb(map: &mut Map, payload: &[u8]) -> Result<bool, String> {
    use super::lmdb::{DB_ELEMS, DB_ITEMS, DB_ZSCORE};
    use super::wal::Op;
    for op in super::wal::ops(payload) {
        match op? {
            Op::Put { db, key, value } if db == DB_ITEMS => {
                let string = item::decode(value)
                    .map(|i| i.meta.kind == super::Kind::String)
                    .unwrap_or(false);
                if !string {
                    return Ok(false);
                }
                map.insert_mut(key.into(), Some(Arc::from(value)));
            }
            Op::Del { db, key } if db == DB_ITEMS => map.insert_mut(key.into(), None),
            Op::Put { db, .. } if db == DB_ELEMS || db == DB_ZSCORE => return Ok(false),
            Op::Clear { .. } => return Ok(false),
            // The expiry index, the CAS counter and reclaimed elements of deleted collections
            // are the writer's own business: no reader looks at them.
            _ => {}
        }
    }
    Ok(true)
}

/// A reader's view for one pass: an LMDB snapshot and the overlay state over it; or, inside
/// the writer (EXEC's reads), its own write transaction, which holds everything.
pub struct Snap<'s> {
    store: &'s LmdbStore,
    state: Arc<State>,
    txn: SnapTxn<'s>,
}

enum SnapTxn<'s> {
    Own(RoTxn<'s, WithoutTls>),
    Within(&'s RoTxn<'s, WithoutTls>),
}

/// How many times a reader retries when a commit lands between its two loads (each retry is
/// a fresh read transaction; the writer publishes right after it commits).
const OPEN_TRIES: usize = 10_000;

impl<'s> Snap<'s> {
    pub fn open(store: &'s LmdbStore) -> Result<Snap<'s>, StoreError> {
        for _ in 0..OPEN_TRIES {
            let state = store.overlay().current();
            let txn = store.read_txn()?;
            if state.map.is_empty() || txn.id() == state.base {
                return Ok(Snap {
                    store,
                    state,
                    txn: SnapTxn::Own(txn),
                });
            }
            drop(txn);
            std::thread::yield_now();
        }
        Err(StoreError::Backend(
            "no read snapshot matches the published writes".into(),
        ))
    }

    /// The writer's view through its own transaction (no overlay: the transaction has it).
    pub fn within(store: &'s LmdbStore, txn: &'s RoTxn<'s, WithoutTls>) -> Snap<'s> {
        Snap {
            store,
            state: Arc::new(State {
                base: 0,
                map: Map::new_sync(),
            }),
            txn: SnapTxn::Within(txn),
        }
    }

    pub fn txn(&self) -> &RoTxn<'s, WithoutTls> {
        match &self.txn {
            SnapTxn::Own(t) => t,
            SnapTxn::Within(t) => t,
        }
    }

    /// The item record under `key`, as of this snapshot.
    pub fn record(&self, key: &[u8]) -> Result<Option<&[u8]>, StoreError> {
        if let Some(v) = self.state.map.get(key) {
            return Ok(v.as_deref());
        }
        Ok(self.store.items().get(self.txn(), key)?)
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<ItemRef<'_>>, StoreError> {
        if key.is_empty() || key.len() > super::MAX_KEY {
            return Ok(None);
        }
        match self.record(key)? {
            None => Ok(None),
            Some(bytes) => item::decode(bytes).map(Some),
        }
    }

    /// Item records in key order within the bounds.
    pub fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Result<ItemsIter<'_>, StoreError> {
        let lmdb = self.store.items().range(self.txn(), &(lo, hi))?;
        let ov: Box<dyn Iterator<Item = (&[u8], &Val)> + '_> = if self.state.map.is_empty() {
            Box::new(std::iter::empty())
        } else {
            let own = |b: Bound<&[u8]>| b.map(|k| Box::<[u8]>::from(k));
            Box::new(
                self.state
                    .map
                    .range::<Box<[u8]>, _>((own(lo), own(hi)))
                    .map(|(k, v)| (&k[..], v)),
            )
        };
        Ok(ItemsIter {
            lmdb: lmdb.peekable(),
            ov: ov.peekable(),
        })
    }

    /// The number of keys (live or expired, as LMDB counts them).
    pub fn len(&self) -> Result<u64, StoreError> {
        let mut n = self.store.items().len(self.txn())? as i64;
        for (k, v) in self.state.map.iter() {
            let below = self.store.items().get(self.txn(), k)?.is_some();
            n += i64::from(v.is_some() && !below) - i64::from(v.is_none() && below);
        }
        Ok(n.max(0) as u64)
    }
}

impl std::ops::Deref for Snap<'_> {
    type Target = LmdbStore;
    fn deref(&self) -> &LmdbStore {
        self.store
    }
}

type LmdbRange<'a> = heed::RoRange<'a, Bytes, Bytes>;

/// LMDB's records merged with the overlay's (which win; deletions hide the key).
pub struct ItemsIter<'a> {
    lmdb: std::iter::Peekable<LmdbRange<'a>>,
    ov: std::iter::Peekable<Box<dyn Iterator<Item = (&'a [u8], &'a Val)> + 'a>>,
}

impl<'a> Iterator for ItemsIter<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), heed::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let Some(&(ok, _)) = self.ov.peek() else {
                return self.lmdb.next();
            };
            match self.lmdb.peek() {
                Some(Err(_)) => return self.lmdb.next(),
                Some(Ok((lk, _))) if *lk < ok => return self.lmdb.next(),
                Some(Ok((lk, _))) if *lk == ok => {
                    // Shadowed by the overlay.
                    self.lmdb.next();
                }
                _ => {}
            }
            let (k, v) = self.ov.next()?;
            if let Some(v) = v {
                return Some(Ok((k, &v[..])));
            }
        }
    }
}
