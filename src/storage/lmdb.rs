//! The LMDB store (through heed 0.22, whose `Database` handles are plain `Copy` values with no
//! lifetime: workers and the writer each hold a copy, and the environment can be closed at
//! shutdown once every thread has been joined).
//!
//! Named databases:
//! - `items`:  key -> item record (see `item.rs`)
//! - `expiry`: expire_at (u64 big-endian) ++ key -> empty, a time-ordered index for the sweeper.
//!   It is written on every store with an expiry and never updated in place: an entry whose time
//!   no longer matches its item is stale and simply dropped when the sweeper reaches it. A key
//!   over `INDEX_KEY_MAX` bytes is indexed by that many of its first bytes, and its entry covers
//!   every key with that prefix.
//! - `meta`:   `format` -> [FORMAT_VERSION], `cas` -> u64 LE counter, `flush_at` -> u64 LE,
//!   `expires` -> u64 LE, the number of items with an expiry (expired ones not yet swept
//!   included), kept in the same transaction as the items it counts (INFO's `expires=`; the
//!   `expiry` index cannot tell it, its entries may be stale). A data dir written before the
//!   record existed has none: the first write that changes the count takes it from `items`.
//! - `elems`:  collection id (u64 BE) ++ sub-key -> element (list items, hash fields, set and
//!   sorted-set members; see `types`). A collection's id is fixed when it is created, so a
//!   RENAME moves only its metadata record.
//! - `zscore`: collection id ++ order-preserving score ++ member -> empty (sorted-set order);
//!   and, under the id with its top bit set (`ZRANK_DIR`), the set's rank directory:
//!   `(id | ZRANK_DIR) ++ chunk boundary -> count` (see `types::zrank`). Ids are CAS uniques,
//!   which never reach 2^63.
//! - `gc`:     collection id -> empty: collections deleted or overwritten whose elements the
//!   writer still has to reclaim, a bounded chunk per batch (so DEL of any size is O(1)).

use std::io::Write;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::resident::MapSpan;
use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions, RoTxn, RwTxn, WithoutTls};

use super::overlay::Overlay;
use super::wal::LogBuf;

use super::item::{self, FORMAT_VERSION};
use super::{ItemMeta, ItemRef, Kind, ReadView, StoreError, WriteView};

pub(crate) const META_FORMAT: &[u8] = b"format";
pub(crate) const META_CAS: &[u8] = b"cas";
pub(crate) const META_FLUSH_AT: &[u8] = b"flush_at";
/// Present once a collection has ever been stored (since the last flush).
pub(crate) const META_COLLS: &[u8] = b"colls";
/// The number of items with an expiry (see the module doc).
pub(crate) const META_EXPIRES: &[u8] = b"expires";
/// The store's value-log id (u64 LE), present once value separation was ever on (`vlog.rs`).
pub(crate) const META_VLOG: &[u8] = b"vlog";
/// `META_FORMAT` of a store that may hold separated values (items whose value is a pointer
/// into the log): memkeep before value separation reads format 1 only, and refuses this.
pub(crate) const STORE_FORMAT_SEPARATED: u8 = 2;
/// The longest key an `expiry` entry (8 bytes of time, then the key) holds in full.
pub(crate) const INDEX_KEY_MAX: usize = super::MAX_KEY - 8;

/// Opening the store failed: the message is one line for the operator.
#[derive(Debug)]
pub struct OpenError(pub String);

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OpenError {}

/// A named database and the number its records carry in the write-ahead log. Reads go
/// straight to the `Database` (through `Deref`); writes take a `LogTxn`, so nothing can change
/// the store without the log hearing of it.
#[derive(Clone, Copy)]
pub struct Table {
    db: Database<Bytes, Bytes>,
    id: u8,
}

impl std::ops::Deref for Table {
    type Target = Database<Bytes, Bytes>;
    fn deref(&self) -> &Self::Target {
        &self.db
    }
}

impl Table {
    pub fn put(&self, txn: &mut LogTxn, key: &[u8], value: &[u8]) -> Result<(), heed::Error> {
        self.put_parts(txn, key, &[value])
    }

    /// Stores `parts` concatenated, written straight into the page LMDB reserves.
    pub fn put_parts(
        &self,
        txn: &mut LogTxn,
        key: &[u8],
        parts: &[&[u8]],
    ) -> Result<(), heed::Error> {
        txn.forget_crc(self.id, key);
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        if let Some((record, n, hole)) = self.separate(txn, key, parts, len)? {
            self.db.put(&mut txn.txn, key, &record[..n])?;
            txn.log.put(self.id, key, parts);
            txn.log.note_written(hole);
            return Ok(());
        }
        self.db.put_reserved(&mut txn.txn, key, len, |space| {
            for p in parts {
                space.write_all(p)?;
            }
            Ok(())
        })?;
        // Logged only once LMDB took it: a refused write (map full, key too long) leaves no
        // record that replay would then fail on.
        txn.log.put(self.id, key, parts);
        Ok(())
    }

    /// Stores `parts` concatenated under `key` if no record is there (and logs it as
    /// `put_parts` does); otherwise changes nothing and returns what `seen` makes of the record
    /// there. One B-tree search where a lookup and then a put made two.
    pub fn put_new_parts<T>(
        &self,
        txn: &mut LogTxn,
        key: &[u8],
        parts: &[&[u8]],
        seen: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>, heed::Error> {
        txn.forget_crc(self.id, key);
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        let mut written = None;
        let there = match self.separate(txn, key, parts, len)? {
            Some((record, n, hole)) => {
                written = Some(hole);
                self.db.get_or_put_reserved(&mut txn.txn, key, n, |space| {
                    space.write_all(&record[..n])
                })?
            }
            None => self
                .db
                .get_or_put_reserved(&mut txn.txn, key, len, |space| {
                    for p in parts {
                        space.write_all(p)?;
                    }
                    Ok(())
                })?,
        };
        match there {
            Some(old) => Ok(Some(seen(old))),
            None => {
                txn.log.put(self.id, key, parts);
                if let Some(hole) = written {
                    txn.log.note_written(hole);
                }
                Ok(None)
            }
        }
    }

    /// Stores `item` (header and value, `header` bytes of header) under `key`, logging only
    /// the change `edit` says was made to the old item (`old` is its header as `item`
    /// encodes it, `old_len` its value's length). The caller has checked that the change is
    /// worth a patch (`Edit::worth_it`).
    pub fn patch(
        &self,
        txn: &mut LogTxn,
        key: &[u8],
        (old, old_len): (&[u8], usize),
        item: std::sync::Arc<[u8]>,
        header: usize,
        edit: &super::Edit,
    ) -> Result<(), heed::Error> {
        txn.forget_crc(self.id, key);
        self.db.put(&mut txn.txn, key, &item)?;
        let value = item.get(header..).unwrap_or_default();
        let parts = (
            value.get(..edit.prepend),
            value.get(edit.at..edit.at.saturating_add(edit.len)),
        );
        let (Some(prepend), Some(bytes), Ok(new_len), Ok(old_len)) = (
            parts.0,
            parts.1,
            u32::try_from(value.len()),
            u32::try_from(old_len),
        ) else {
            // An edit that does not fit the value (a caller's mistake): logged whole.
            txn.log.put(self.id, key, &[&item]);
            return Ok(());
        };
        let patch = super::wal::Patch {
            old_header: old,
            old_len,
            new_header: &item[..header.min(item.len())],
            new_len,
            crc: crc32fast::hash(value),
            prepend,
            at: edit.at as u32,
            bytes,
        };
        let dirty = txn.patch_charge(self.id, key, item.len());
        txn.set_crc(self.id, key, value.len(), patch.crc);
        txn.log
            .patch(self.id, key, &patch, Some(item.clone()), dirty);
        Ok(())
    }

    /// When `parts` (an item record of `len` bytes) is to be stored in `items` with its value
    /// in the log (the transaction has a sink, the value is a string's of at least the sink's
    /// `min` bytes): writes the value where the batch will put it (`vlog::Sink::write`) and
    /// returns the pointer record to store instead, its length, and where in the batch buffer
    /// the value went (for `LogBuf::note_written`, once the record is logged). The log record
    /// stays the whole item.
    #[allow(clippy::type_complexity)]
    fn separate(
        &self,
        txn: &LogTxn,
        key: &[u8],
        parts: &[&[u8]],
        len: usize,
    ) -> Result<
        Option<(
            [u8; item::MAX_HEADER + super::vlog::POINTER_LEN],
            usize,
            (usize, usize),
        )>,
        heed::Error,
    > {
        let Some(sink) = txn.sink.as_ref().filter(|_| self.id == DB_ITEMS) else {
            return Ok(None);
        };
        let Some(first) = parts.first() else {
            return Ok(None);
        };
        let Some(n) = item::separable(first).filter(|n| *n <= first.len()) else {
            return Ok(None);
        };
        if len - n < sink.min || u32::try_from(len - n).is_err() {
            return Ok(None);
        }
        let mut value: Vec<&[u8]> = Vec::with_capacity(parts.len());
        value.push(&first[n..]);
        value.extend_from_slice(&parts[1..]);
        let at = txn.log.put_value_at(key.len()) + n;
        let p = sink.write(at, &value).map_err(heed::Error::Io)?;
        let (record, size) = item::pointer_record(&first[..n], &p);
        Ok(Some((record, size, (at, len - n))))
    }

    /// Stores `value` only if `key` is absent; true if it did.
    pub fn put_new(&self, txn: &mut LogTxn, key: &[u8], value: &[u8]) -> Result<bool, heed::Error> {
        txn.forget_crc(self.id, key);
        match self
            .db
            .put_with_flags(&mut txn.txn, heed::PutFlags::NO_OVERWRITE, key, value)
        {
            Ok(()) => {
                txn.log.put(self.id, key, &[value]);
                Ok(true)
            }
            Err(heed::Error::Mdb(heed::MdbError::KeyExist)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn delete(&self, txn: &mut LogTxn, key: &[u8]) -> Result<bool, heed::Error> {
        txn.forget_crc(self.id, key);
        let found = self.db.delete(&mut txn.txn, key)?;
        if found {
            txn.log.del(self.id, key);
        }
        Ok(found)
    }

    pub fn clear(&self, txn: &mut LogTxn) -> Result<(), heed::Error> {
        txn.crcs.clear();
        self.db.clear(&mut txn.txn)?;
        txn.log.clear(self.id);
        Ok(())
    }
}

/// A write transaction that records every change it makes as a physical log record. It reads
/// as a `RoTxn`; it writes only through `Table`.
pub struct LogTxn<'e> {
    txn: RwTxn<'e>,
    log: LogBuf,
    /// The string items this transaction stored through `Table::patch`, by database number
    /// and key, with the number of pages their last version took (`patch_charge`).
    patched: std::collections::HashMap<Box<[u8]>, usize>,
    /// The length and CRC-32 of the value of string items this transaction stored by a patch,
    /// by database number and key, for the CRC of the next patch of the same value
    /// (`edit_in_place`): forgotten by every other write of the key through `Table`, the only
    /// way this transaction writes.
    crcs: std::collections::HashMap<Box<[u8]>, (usize, u32)>,
    /// Where the batch being applied will be appended, when its large string values are to
    /// live in the log (`vlog.rs`): set by the writer for each batch, taken with its records.
    sink: Option<super::vlog::Sink>,
}

impl<'e> std::ops::Deref for LogTxn<'e> {
    type Target = RoTxn<'e, WithoutTls>;
    fn deref(&self) -> &Self::Target {
        &self.txn
    }
}

impl<'e> LogTxn<'e> {
    /// The maps' key for `key` of database `db`: the database number, then the key.
    fn name(db: u8, key: &[u8]) -> Vec<u8> {
        let mut name = Vec::with_capacity(1 + key.len());
        name.push(db);
        name.extend_from_slice(key);
        name
    }

    /// The length and CRC-32 of the value under `key`, if its last write was a patch.
    fn crc_of(&self, db: u8, key: &[u8]) -> Option<(usize, u32)> {
        if self.crcs.is_empty() {
            return None;
        }
        self.crcs.get(Self::name(db, key).as_slice()).copied()
    }

    fn set_crc(&mut self, db: u8, key: &[u8], len: usize, crc: u32) {
        self.crcs.insert(Self::name(db, key).into(), (len, crc));
    }

    fn forget_crc(&mut self, db: u8, key: &[u8]) {
        if !self.crcs.is_empty() {
            self.crcs.remove(Self::name(db, key).as_slice());
        }
    }

    /// Whether this transaction stored the item under `key` by a patch before.
    fn patched_before(&self, db: u8, key: &[u8]) -> bool {
        self.patched.contains_key(Self::name(db, key).as_slice())
    }

    /// The bytes of new pages LMDB took for storing an item of `len` bytes under `key` by a
    /// patch: all of them the first time in this transaction (the committed pages are copied
    /// on write); after that, none while the item fits the overflow pages its last version
    /// took, which LMDB rewrites in place (`mdb_cursor_put` reuses a dirty overflow run big
    /// enough), and all of them again when it needs a longer run. The writer commits LMDB by
    /// this measure, so 1,000 small appends to one 1 MiB value no longer commit it every
    /// 4 appends (each commit then copying the whole value into fresh pages).
    fn patch_charge(&mut self, db: u8, key: &[u8], len: usize) -> u64 {
        // An overflow run: the page header, then the node's data. Pages of 4 KiB: where
        // LMDB's are larger, this counts a new run more often than it happens.
        let pages = (len + 16).div_ceil(4096);
        let name = Self::name(db, key);
        match self.patched.get_mut(name.as_slice()) {
            Some(p) if *p >= pages => 0,
            Some(p) => {
                *p = pages;
                len as u64
            }
            None => {
                self.patched.insert(name.into(), pages);
                len as u64
            }
        }
    }

    /// Separates the large string values of the batch about to be applied into the log at
    /// the place `sink` says the batch will go (None: stores them inline). Cleared by
    /// `take_log`, so a sink never outlives the batch whose position it knows.
    pub fn set_sink(&mut self, sink: Option<super::vlog::Sink>) {
        self.sink = sink;
    }

    /// The records written since the last call, leaving `spare` (emptied) to collect the next.
    pub fn take_log(&mut self, mut spare: LogBuf) -> LogBuf {
        self.sink = None;
        spare.reset();
        std::mem::replace(&mut self.log, spare)
    }

    /// The LMDB transaction and the batch's records, for the writer to log, then commit.
    pub fn into_parts(self) -> (RwTxn<'e>, LogBuf) {
        (self.txn, self.log)
    }

    /// Bytes of log records so far: a write that leaves it unchanged changed nothing.
    pub fn logged(&self) -> usize {
        self.log.payload_len()
    }

    /// Commits without logging: only for stores that have no log (unit tests, the fuzz
    /// targets); a server's writer always goes through `into_parts`.
    pub fn commit_unlogged(self) -> Result<(), StoreError> {
        Ok(self.txn.commit()?)
    }
}

/// Log numbers of the named databases (never renumber: they are in every log on disk).
pub const DB_ITEMS: u8 = 0;
pub const DB_EXPIRY: u8 = 1;
pub const DB_META: u8 = 2;
pub const DB_ELEMS: u8 = 3;
pub const DB_ZSCORE: u8 = 4;
pub const DB_GC: u8 = 5;

/// The named databases and their log numbers.
pub const DB_NAMES: [(&str, u8); 6] = [
    ("items", DB_ITEMS),
    ("expiry", DB_EXPIRY),
    ("meta", DB_META),
    ("elems", DB_ELEMS),
    ("zscore", DB_ZSCORE),
    ("gc", DB_GC),
];

/// Set in the id of a sorted set's rank-directory records in `zscore` (`types::zrank`).
pub const ZRANK_DIR: u64 = 1 << 63;

#[derive(Clone)]
pub struct LmdbStore {
    env: Env<WithoutTls>,
    pub(crate) items: Table,
    pub(crate) expiry: Table,
    pub(crate) meta: Table,
    pub(crate) elems: Table,
    pub(crate) zscore: Table,
    pub(crate) gc: Table,
    /// Whether any collection may exist. While false, writes skip looking for a collection to
    /// reclaim under the key they overwrite: memcached-only workloads pay nothing for types.
    has_colls: Arc<AtomicBool>,
    /// Acknowledged writes LMDB has not committed yet, as readers must see them.
    overlay: Arc<Overlay>,
    /// Where `data.mdb` is mapped: for asking whether a record is in memory (`resident.rs`).
    map: Option<MapSpan>,
    /// Cache mode only: where readers and the writer note the uses of keys (`cache.rs`).
    access: Option<Arc<super::cache::Access>>,
    /// Where fetches and writes are noted for memcached's `h`/`l` (`hits.rs`); set by the
    /// server before it makes any clone.
    hits: Option<Arc<super::hits::Hits>>,
    /// The store's separated values, once separation was ever on (`vlog.rs`).
    vlog: Option<Arc<super::vlog::ValueLog>>,
    /// String values of at least this many bytes go to the log (0: none; `value_log_min`).
    vlog_min: usize,
    /// LMDB's page size (`edit_in_place`).
    page_size: usize,
}

/// A read transaction of the store. With values in the log it holds a reader slot
/// (`vlog::ReaderSlot`) while open: a segment that pointers of its snapshot may name is not
/// retired before it ends. Reads as a `RoTxn`.
pub struct Reader<'e> {
    // Declared first, so dropped first: the slot outlives the transaction.
    txn: RoTxn<'e, WithoutTls>,
    _slot: Option<super::vlog::ReaderSlot>,
}

impl<'e> Reader<'e> {
    fn opened(txn: RoTxn<'e, WithoutTls>, slot: Option<super::vlog::ReaderSlot>) -> Reader<'e> {
        if let Some(s) = &slot {
            s.opened(txn.id() as u64);
        }
        Reader { txn, _slot: slot }
    }
}

impl<'e> std::ops::Deref for Reader<'e> {
    type Target = RoTxn<'e, WithoutTls>;
    fn deref(&self) -> &Self::Target {
        &self.txn
    }
}

/// The writer's write transaction, kept open across batches (see `overlay.rs` for why).
///
/// LMDB's write lock is a mutex owned by the thread that began the transaction, so this is
/// begun, committed and aborted only on one thread (the writer thread; `owner`), while other
/// threads (leaders, see `writer.rs`) may apply batches to it under the writer's lock: LMDB
/// keeps no other per-thread state for a write transaction.
pub struct OpenTxn {
    txn: Option<LogTxn<'static>>,
    owner: std::thread::ThreadId,
    /// Boxed so its address never changes: the transaction borrows it.
    _env: Box<Env<WithoutTls>>,
}

// Safety: see the type's documentation: the transaction is only used by one thread at a time
// (behind the writer's mutex), and ended on the thread that began it.
unsafe impl Send for OpenTxn {}

impl OpenTxn {
    pub fn begin(store: &LmdbStore) -> Result<OpenTxn, StoreError> {
        let env = Box::new(store.env.clone());
        let txn: RwTxn<'_> = env.write_txn()?;
        // Safety: the transaction borrows `*env`, which is heap-allocated (its address is
        // stable however `OpenTxn` moves) and dropped only after the transaction has ended
        // (`commit`, `Drop`).
        let txn: RwTxn<'static> = unsafe { std::mem::transmute::<RwTxn<'_>, RwTxn<'static>>(txn) };
        Ok(OpenTxn {
            txn: Some(LogTxn {
                txn,
                log: LogBuf::default(),
                patched: Default::default(),
                crcs: Default::default(),
                sink: None,
            }),
            owner: std::thread::current().id(),
            _env: env,
        })
    }

    pub fn txn(&mut self) -> Result<&mut LogTxn<'static>, StoreError> {
        self.txn
            .as_mut()
            .ok_or_else(|| StoreError::Backend("the write transaction has ended".into()))
    }

    /// The LMDB transaction this one will commit as.
    pub fn id(&self) -> usize {
        self.txn.as_ref().map_or(0, |t| t.txn.id())
    }

    /// Commits; returns the committed transaction's id.
    pub fn commit(mut self) -> Result<usize, StoreError> {
        let t = self
            .txn
            .take()
            .ok_or_else(|| StoreError::Backend("no transaction".into()))?;
        let id = t.txn.id();
        t.txn.commit()?;
        Ok(id)
    }

    /// Applies a log payload (replaying batches the aborted transaction held).
    pub fn replay(&mut self, store: &LmdbStore, payload: &[u8]) -> Result<(), String> {
        let t = self.txn.as_mut().ok_or("no transaction")?;
        for op in super::wal::ops(payload) {
            store.replay(&mut t.txn, op?, Replay::Exact)?;
        }
        Ok(())
    }
}

impl Drop for OpenTxn {
    fn drop(&mut self) {
        if let Some(t) = self.txn.take() {
            if std::thread::current().id() == self.owner {
                drop(t);
            } else {
                // Aborting here would release LMDB's write lock from a thread that does not
                // own it; the owner has exited, and LMDB recovers a lock whose owner died.
                log::error!("a write transaction outlived the writer thread");
                std::mem::forget(t);
            }
        }
    }
}

/// State the writer restores from the store at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Persisted {
    pub cas: u64,
    pub flush_at: Option<u64>,
}

impl LmdbStore {
    /// Opens (creating if needed) the environment in `dir` as it is: no recovery (that is
    /// `durable::open`, which calls this once the checkpoint's meta page is back in place).
    pub fn open(
        dir: &Path,
        map_size: u64,
        max_readers: u32,
    ) -> Result<(LmdbStore, Persisted), OpenError> {
        let at = |what: &str, e: &dyn std::fmt::Display| {
            OpenError(format!("{what} {}: {e}", dir.display()))
        };
        if dir.exists() && !dir.is_dir() {
            return Err(OpenError(format!(
                "data directory {} is not a directory",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| at("cannot create data directory", &e))?;
        // An empty or missing data file is one LMDB initializes; any other is checked below.
        let data_file = dir.join("data.mdb");
        let has_data = std::fs::metadata(&data_file).is_ok_and(|m| m.len() > 0);
        // LMDB needs the map size in whole pages; 64 KiB covers every page size in use.
        let map_size = usize::try_from(map_size.div_ceil(1 << 16) << 16)
            .map_err(|_| OpenError("map_size does not fit this machine's address space".into()))?;
        let mut opts = EnvOpenOptions::new().read_txn_without_tls();
        opts.map_size(map_size).max_dbs(8).max_readers(max_readers);
        // Every commit is NO_SYNC: durability comes from the write-ahead log, and LMDB's pages
        // are made durable by checkpoints (`durable.rs`), which also keep a snapshot LMDB can
        // always reopen. No WRITE_MAP: a page written through the map must first be read in
        // from disk, which is what makes writes slow when the data is larger than memory.
        // NO_READ_AHEAD: LMDB's default readahead, with the data larger than the page cache,
        // evicts the pages other reads need (measured: 58 random GETs/s against 2,277 with it
        // off, on 3.5 GB of 20 KB values under a 1 GiB cap).
        let flags = EnvFlags::NO_SYNC | EnvFlags::NO_READ_AHEAD;
        // A data file shorter than the pages its meta page counts (a copy cut short, a disk
        // that lost writes) would fault with SIGBUS on the first read of a missing page, or,
        // once WRITE_MAP has grown the file to the map size at open, read zeros there: refuse
        // it before any transaction. The page count is read before the length, so a writer in
        // another process (`memkeep backup` runs beside the server) can only make the file
        // longer than counted, never shorter: it writes pages before the meta page that counts
        // them.
        let truncated = |env: &Env<WithoutTls>| -> Option<OpenError> {
            let need = (env.info().last_page_number as u64 + 1) * env.stat().page_size as u64;
            let len = std::fs::metadata(&data_file).map_or(0, |m| m.len());
            (len < need).then(|| {
                OpenError(format!(
                    "{} is truncated: {len} bytes, but the store it describes needs {need}; restore it from a backup",
                    data_file.display()
                ))
            })
        };
        // Safety: the environment is opened once at a time per process (the data directory's
        // lock file keeps other servers out), on a local directory.
        let env = unsafe { opts.flags(flags).open(dir) }
            .map_err(|e| at("cannot open data directory", &e))?;
        if has_data && let Some(e) = truncated(&env) {
            return Err(e);
        }
        const NAMES: [(&str, u8); 6] = DB_NAMES;
        // A store that has every database and our format opens with a read transaction only:
        // a write transaction would wait for a running server's writer, which keeps one open
        // (`memkeep backup` and `export` read a live store beside it).
        let existing = (|| -> Option<[Table; 6]> {
            let rtxn = env.read_txn().ok()?;
            let mut t = Vec::with_capacity(6);
            for (name, id) in NAMES {
                let db = env
                    .open_database::<Bytes, Bytes>(&rtxn, Some(name))
                    .ok()
                    .flatten()?;
                t.push(Table { db, id });
            }
            let ok = matches!(
                t[2].get(&rtxn, META_FORMAT).ok().flatten(),
                Some([v]) if *v == FORMAT_VERSION || *v == STORE_FORMAT_SEPARATED
            );
            rtxn.commit().ok()?;
            if ok { t.try_into().ok() } else { None }
        })();
        let tables = match existing {
            Some(t) => t,
            None => {
                let mut wtxn = env
                    .write_txn()
                    .map_err(|e| at("cannot write to data directory", &e))?;
                let mut t = Vec::with_capacity(6);
                for (name, id) in NAMES {
                    let db = env
                        .create_database::<Bytes, Bytes>(&mut wtxn, Some(name))
                        .map_err(|e| at("cannot create database in", &e))?;
                    t.push(Table { db, id });
                }
                let meta = t[2];
                match meta
                    .get(&wtxn, META_FORMAT)
                    .map_err(|e| at("cannot read", &e))?
                {
                    None => {
                        meta.db
                            .put(&mut wtxn, META_FORMAT, &[FORMAT_VERSION])
                            .map_err(|e| at("cannot write to", &e))?;
                        // A new store: nothing has an expiry yet.
                        if t[0].db.is_empty(&wtxn).map_err(|e| at("cannot read", &e))? {
                            meta.db
                                .put(&mut wtxn, META_EXPIRES, &0u64.to_le_bytes())
                                .map_err(|e| at("cannot write to", &e))?;
                        }
                    }
                    Some([v]) if *v == FORMAT_VERSION || *v == STORE_FORMAT_SEPARATED => {}
                    Some(other) => {
                        return Err(OpenError(format!(
                            "{} holds data in format {:?}, this memkeep reads formats {FORMAT_VERSION} and {STORE_FORMAT_SEPARATED}",
                            dir.display(),
                            other
                        )));
                    }
                }
                wtxn.commit()
                    .map_err(|e| at("cannot write to data directory", &e))?;
                t.try_into()
                    .map_err(|_| OpenError("database list".into()))?
            }
        };
        let [items, expiry, meta, elems, zscore, gc] = tables;
        let rtxn = env
            .read_txn()
            .map_err(|e| at("cannot read data directory", &e))?;
        let read_u64 = |k: &[u8]| -> Result<Option<u64>, OpenError> {
            match meta.get(&rtxn, k).map_err(|e| at("cannot read", &e))? {
                None => Ok(None),
                Some(b) => b
                    .try_into()
                    .map(|a: [u8; 8]| Some(u64::from_le_bytes(a)))
                    .map_err(|_| at("corrupt meta record in", &"bad length")),
            }
        };
        let cas = read_u64(META_CAS)?.unwrap_or(0);
        let flush_at = read_u64(META_FLUSH_AT)?;
        let has_colls = meta
            .get(&rtxn, META_COLLS)
            .map_err(|e| at("cannot read", &e))?
            .is_some();
        let vlog = read_u64(META_VLOG)?
            .map(|id| super::vlog::ValueLog::register(dir, id, Default::default()));
        // Any record LMDB returns points into its map: the format marker finds the mapping.
        let map = match meta.get(&rtxn, META_FORMAT) {
            Ok(Some(b)) => MapSpan::find(&data_file, b.as_ptr()),
            _ => None,
        };
        if map.is_none() {
            log::warn!(
                "cannot find where {} is mapped: reads of values not in memory will wait in the event loop",
                data_file.display()
            );
        }
        drop(rtxn);
        super::note_data_dir(dir);
        let page_size = env.stat().page_size as usize;
        Ok((
            LmdbStore {
                env,
                items,
                expiry,
                meta,
                elems,
                zscore,
                gc,
                has_colls: Arc::new(AtomicBool::new(has_colls)),
                overlay: Arc::new(Overlay::new(0)),
                map,
                access: None,
                hits: None,
                vlog,
                vlog_min: 0,
                page_size,
            },
            Persisted { cas, flush_at },
        ))
    }

    /// The writer's state as the store holds it now (after recovery replayed the log).
    pub fn reload_persisted(&self) -> Result<Persisted, StoreError> {
        let txn = self.read_txn()?;
        let read_u64 = |k: &[u8]| -> Result<Option<u64>, StoreError> {
            match self.meta.get(&txn, k)? {
                None => Ok(None),
                Some(b) => b
                    .try_into()
                    .map(|a: [u8; 8]| Some(u64::from_le_bytes(a)))
                    .map_err(|_| StoreError::damaged("meta record of the wrong length")),
            }
        };
        let p = Persisted {
            cas: read_u64(META_CAS)?.unwrap_or(0),
            flush_at: read_u64(META_FLUSH_AT)?,
        };
        if self.meta.get(&txn, META_COLLS)?.is_some() {
            self.has_colls.store(true, Ordering::Relaxed);
        }
        Ok(p)
    }

    pub fn env(&self) -> &Env<WithoutTls> {
        &self.env
    }

    /// Stores string values of at least `min` bytes in the log from now on (0: none), for
    /// every clone made after this. The first time, marks the store as one that may hold
    /// separated values (`STORE_FORMAT_SEPARATED`) and gives it a value-log id, in a plain
    /// commit: made durable by the next checkpoint, which comes before any checkpoint whose
    /// snapshot holds a pointer (a store that loses it to a power cut loses those pointers
    /// with it: the log replays their values inline).
    pub fn enable_separation(&mut self, min: usize) -> Result<(), StoreError> {
        self.vlog_min = min;
        if min == 0 || self.vlog.is_some() {
            return Ok(());
        }
        let id = getrandom::u64()
            .map_err(|e| StoreError::Backend(format!("cannot read the OS's random source: {e}")))?;
        let mut txn = self.env.write_txn()?;
        self.meta
            .db
            .put(&mut txn, META_FORMAT, &[STORE_FORMAT_SEPARATED])?;
        self.meta.db.put(&mut txn, META_VLOG, &id.to_le_bytes())?;
        txn.commit()?;
        let dir = self.env.path().to_path_buf();
        self.vlog = Some(super::vlog::ValueLog::register(
            &dir,
            id,
            Default::default(),
        ));
        Ok(())
    }

    /// The store's value log, if separation was ever on.
    pub fn vlog(&self) -> Option<&Arc<super::vlog::ValueLog>> {
        self.vlog.as_ref()
    }

    /// The sink for a batch to be appended at `base` in segment `segment` (`file`), when
    /// separation is on.
    pub fn sink(
        &self,
        segment: u64,
        base: u64,
        file: impl FnOnce() -> Arc<std::fs::File>,
    ) -> Option<super::vlog::Sink> {
        let vlog = self.vlog.as_ref().filter(|_| self.vlog_min > 0)?;
        Some(super::vlog::Sink {
            vlog: vlog.clone(),
            min: self.vlog_min,
            segment,
            base,
            file: file(),
        })
    }

    pub fn overlay(&self) -> &Overlay {
        &self.overlay
    }

    /// Whether some of `record` (borrowed from this store) is not in memory; false when it
    /// all is, or when that cannot be told.
    pub fn cold(&self, record: &[u8]) -> bool {
        self.map.as_ref().is_some_and(|m| m.cold(record))
    }

    /// Where `record` (borrowed from this store) starts in `data.mdb`; None for a record that
    /// is not in the map.
    pub fn file_offset(&self, record: &[u8]) -> Option<u64> {
        self.map.as_ref()?.offset(record)
    }

    /// Cache mode: every clone made after this notes uses of keys in `access`.
    pub fn set_access(&mut self, access: Option<Arc<super::cache::Access>>) {
        self.access = access;
    }

    /// Every clone made after this notes writes (and its readers fetches) in `hits`.
    pub fn set_hits(&mut self, hits: Option<Arc<super::hits::Hits>>) {
        self.hits = hits;
    }

    /// The use table for memcached's `h`/`l` flags, when the server made one.
    #[inline]
    pub fn hits(&self) -> Option<&Arc<super::hits::Hits>> {
        self.hits.as_ref()
    }

    /// The access table, in cache mode.
    #[inline]
    pub fn access(&self) -> Option<&Arc<super::cache::Access>> {
        self.access.as_ref()
    }

    /// The pages the data occupies, as LMDB counts them in `txn`: every database's branch,
    /// leaf and overflow pages, the main tree's root and the two meta pages. Free pages inside
    /// the file are not counted. O(1): LMDB keeps the counts in each tree's record, changed in
    /// the same transaction as the pages (why cache mode uses them: see `cache.rs`).
    pub fn data_pages(&self, txn: &RoTxn) -> Result<u64, StoreError> {
        let mut pages = 3u64;
        for t in self.tables() {
            let s = t.db.stat(txn)?;
            pages += (s.branch_pages + s.leaf_pages + s.overflow_pages) as u64;
        }
        Ok(pages)
    }

    /// Whether the expiry index holds an entry that is due (an item that may have expired).
    pub fn expired_due(&self, txn: &RoTxn, now_ms: u64) -> Result<bool, StoreError> {
        Ok(match self.expiry.first(txn)? {
            Some((k, _)) => k
                .first_chunk::<8>()
                .is_some_and(|t| u64::from_be_bytes(*t) <= now_ms),
            None => false,
        })
    }

    pub fn read_txn(&self) -> Result<Reader<'_>, StoreError> {
        let slot = self.vlog.as_ref().map(|v| v.enter());
        let txn = self.env.read_txn()?;
        Ok(Reader::opened(txn, slot))
    }

    /// A read transaction that owns a handle on the environment (one reference count more
    /// than `read_txn`), so that it may outlive a borrow of the store.
    pub fn read_txn_static(&self) -> Result<Reader<'static>, StoreError> {
        let slot = self.vlog.as_ref().map(|v| v.enter());
        let txn = self.env.clone().static_read_txn()?;
        Ok(Reader::opened(txn, slot))
    }

    /// Writes the value `m` names again, at the log's end (or inline, with separation off
    /// now), if `m.key` still points where `m` says: the value log's collection
    /// (`vlog::Collector`). The item is otherwise unchanged (header, CAS, expiry). Returns
    /// whether it moved.
    pub fn relocate(&self, txn: &mut LogTxn, m: &super::vlog::Move) -> Result<bool, StoreError> {
        let Some(bytes) = self.items.get(txn, &m.key)? else {
            return Ok(false);
        };
        let Some((header, p)) = item::inline_header(bytes) else {
            return Ok(false);
        };
        if p != m.pointer || m.value.len() != p.len as usize {
            return Ok(false);
        }
        self.items.put_parts(txn, &m.key, &[&header, &m.value])?;
        Ok(true)
    }

    /// A write transaction that logs its changes into `log` (normally empty).
    pub fn write_txn_with(&self, log: LogBuf) -> Result<LogTxn<'_>, StoreError> {
        Ok(LogTxn {
            txn: self.env.write_txn()?,
            log,
            patched: Default::default(),
            crcs: Default::default(),
            sink: None,
        })
    }

    pub fn write_txn(&self) -> Result<LogTxn<'_>, StoreError> {
        self.write_txn_with(LogBuf::default())
    }

    fn tables(&self) -> [Table; 6] {
        [
            self.items,
            self.expiry,
            self.meta,
            self.elems,
            self.zscore,
            self.gc,
        ]
    }

    /// The table a log record names.
    pub fn table(&self, id: u8) -> Option<Table> {
        self.tables().into_iter().find(|t| t.id == id)
    }

    /// Writes one record of a replica's full copy (a plain transaction, unlogged): appended
    /// when it sorts after the last key of its database, which is every record of a copy (it
    /// arrives in each database's key order, into emptied databases), so LMDB skips the search
    /// and fills each page whole instead of splitting it; put in place otherwise.
    pub fn put_copied(
        &self,
        txn: &mut RwTxn,
        db: u8,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), String> {
        let table = self
            .table(db)
            .ok_or_else(|| format!("copied record for unknown database {db}"))?;
        match table
            .db
            .put_with_flags(txn, heed::PutFlags::APPEND, key, value)
        {
            Err(heed::Error::Mdb(heed::MdbError::KeyExist)) => table.db.put(txn, key, value),
            r => r,
        }
        .map_err(|e| format!("cannot write a copied record: {e}"))
    }

    /// Applies one logged record in a plain transaction (recovery: the log already has it).
    pub fn replay(&self, txn: &mut RwTxn, op: super::wal::Op, mode: Replay) -> Result<(), String> {
        use super::wal::Op;
        let (Op::Put { db, .. } | Op::Del { db, .. } | Op::Clear { db } | Op::Patch { db, .. }) =
            op;
        let table = self
            .table(db)
            .ok_or_else(|| format!("log record for unknown database {db}"))?;
        let r = match op {
            Op::Put { key, value, .. } => table.db.put(txn, key, value),
            Op::Del { key, .. } => table.db.delete(txn, key).map(|_| ()),
            Op::Clear { .. } => table.db.clear(txn),
            Op::Patch { key, patch, .. } => return replay_patch(table, txn, key, &patch, mode),
        };
        r.map_err(|e| format!("cannot replay a log record: {e}"))
    }

    /// The item under `key` (expired or not), borrowed from the map.
    pub fn get<'t>(&self, txn: &'t RoTxn, key: &[u8]) -> Result<Option<ItemRef<'t>>, StoreError> {
        if key.is_empty() || key.len() > super::MAX_KEY {
            return Ok(None);
        }
        match self.items.get(txn, key)? {
            None => Ok(None),
            Some(bytes) => item::decode(bytes).map(Some),
        }
    }

    /// Number of stored items (expired ones not yet swept included).
    pub fn len(&self, txn: &RoTxn) -> Result<u64, StoreError> {
        Ok(self.items.len(txn)?)
    }

    /// The items database, for ordered scans (KEYS, SCAN).
    pub fn items(&self) -> &Database<Bytes, Bytes> {
        &self.items.db
    }

    /// Bytes of the data file in use (up to the highest page ever written).
    pub fn used_bytes(&self) -> u64 {
        let page = self.env.stat().page_size as u64;
        (self.env.info().last_page_number as u64 + 1) * page
    }

    /// Opens a write view on `txn` that hands out CAS uniques from `cas`.
    pub fn writer<'t, 'e>(
        &'t self,
        txn: &'t mut LogTxn<'e>,
        cas: &'t mut u64,
    ) -> LmdbWrite<'t, 'e> {
        LmdbWrite {
            store: self,
            txn,
            cas,
        }
    }

    /// Deletes up to `limit` items whose expiry has passed, and their index entries.
    pub fn sweep_expired(
        &self,
        txn: &mut LogTxn,
        now_ms: u64,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let upper = now_ms.saturating_add(1).to_be_bytes();
        let range = (Bound::Unbounded, Bound::Excluded(&upper[..]));
        let due: Vec<Vec<u8>> = self
            .expiry
            .range(txn, &range)?
            .take(limit)
            .map(|r| r.map(|(k, _)| k.to_vec()))
            .collect::<Result<_, _>>()?;
        let mut removed = 0;
        for entry in &due {
            let Some((t, key)) = entry.split_first_chunk::<8>() else {
                continue;
            };
            let t = u64::from_be_bytes(*t);
            if key.len() < INDEX_KEY_MAX {
                removed += usize::from(self.remove_expired_at(txn, key, t)?);
            } else {
                // Keys too long for the index are filed under their first INDEX_KEY_MAX bytes:
                // the entry stands for every item under that prefix expiring at `t`.
                let keys: Vec<Vec<u8>> = self
                    .items
                    .prefix_iter(txn, key)?
                    .map(|r| r.map(|(k, _)| k.to_vec()))
                    .collect::<Result<_, _>>()?;
                for k in &keys {
                    removed += usize::from(self.remove_expired_at(txn, k, t)?);
                }
            }
            self.expiry.delete(txn, entry)?;
        }
        Ok(removed)
    }

    /// Deletes the item under `key` if its expiry is `t` (else the index entry was stale).
    fn remove_expired_at(&self, txn: &mut LogTxn, key: &[u8], t: u64) -> Result<bool, StoreError> {
        match self.items.get(txn, key)? {
            Some(bytes) if item::decode(bytes)?.meta.expire_at == t => {
                if let Some(id) = self.collection_id(txn, key)? {
                    self.schedule_gc(txn, id)?;
                }
                let gone = self.items.delete(txn, key)?;
                if gone {
                    self.count_expires(txn, -1)?;
                }
                Ok(gone)
            }
            _ => Ok(false),
        }
    }

    /// The id of the collection stored under `key`, if a collection is stored there.
    pub fn collection_id(&self, txn: &RoTxn, key: &[u8]) -> Result<Option<u64>, StoreError> {
        if !self.has_colls.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match self.items.get(txn, key)? {
            Some(bytes) => {
                let item = item::decode(bytes)?;
                Ok(if item.meta.kind == Kind::String {
                    None
                } else {
                    id_of(&[item.value])
                })
            }
            None => Ok(None),
        }
    }

    /// Records that collections may exist from now on (called before one is stored), in the
    /// flag and in the meta record `colls` alike. The record is looked up in the transaction
    /// every time rather than trusted from the flag: a FLUSHALL deletes the record while the
    /// flag stays set (pessimistic, in case the flush aborts), and so does an aborted
    /// transaction that put it; either way the next collection must put it back, or a restart
    /// would not reclaim the elements of an overwritten collection.
    pub fn mark_collections(&self, txn: &mut LogTxn) -> Result<(), StoreError> {
        // Set before the commit: if it aborts, the flag is merely pessimistic.
        self.has_colls.store(true, Ordering::Relaxed);
        if self.meta.get(txn, META_COLLS)?.is_none() {
            self.meta.put(txn, META_COLLS, &[1])?;
        }
        Ok(())
    }

    /// The number of items with an expiry as of `txn` (LMDB's part only: see
    /// `overlay::Snap::expires`), or None in a data dir older than the count.
    pub fn expires(&self, txn: &RoTxn) -> Result<Option<u64>, StoreError> {
        match self.meta.get(txn, META_EXPIRES)? {
            None => Ok(None),
            Some(b) => b
                .try_into()
                .map(|a: [u8; 8]| Some(u64::from_le_bytes(a)))
                .map_err(|_| StoreError::damaged("meta record of the wrong length")),
        }
    }

    /// Adds `delta` to the count of items with an expiry, called after the item changed. A data
    /// dir older than the count takes it from `items` here, once (the change is already in).
    fn count_expires(&self, txn: &mut LogTxn, delta: i64) -> Result<(), StoreError> {
        if delta == 0 {
            return Ok(());
        }
        let n = match self.expires(txn)? {
            Some(n) => n.saturating_add_signed(delta),
            None => {
                let mut n = 0u64;
                for r in self.items.iter(txn)? {
                    let (_, v) = r?;
                    n += u64::from(item::decode(v)?.meta.expire_at != 0);
                }
                n
            }
        };
        Ok(self.meta.put(txn, META_EXPIRES, &n.to_le_bytes())?)
    }

    /// The expiry and the collection id of the item under `key` (expired or not), before a
    /// write replaces or deletes it.
    fn old_state(&self, txn: &RoTxn, key: &[u8]) -> Result<(u64, Option<u64>), StoreError> {
        match self.items.get(txn, key)? {
            None => Ok((0, None)),
            Some(bytes) => state_of(bytes),
        }
    }

    fn schedule_gc(&self, txn: &mut LogTxn, id: u64) -> Result<(), StoreError> {
        Ok(self.gc.put(txn, &id.to_be_bytes(), &[])?)
    }

    /// Whether deleted collections still have elements to reclaim.
    pub fn gc_pending(&self, txn: &RoTxn) -> Result<bool, StoreError> {
        Ok(!self.gc.is_empty(txn)?)
    }

    /// Deletes up to `limit` elements of deleted collections; returns how many it deleted.
    pub fn collect_garbage(&self, txn: &mut LogTxn, limit: usize) -> Result<usize, StoreError> {
        let mut budget = limit;
        while budget > 0 {
            let Some(id) = self.gc.first(txn)?.map(|(k, _)| k.to_vec()) else {
                break;
            };
            let dir = (u64::from_be_bytes(
                id[..]
                    .try_into()
                    .map_err(|_| StoreError::damaged("a gc record is not a collection id"))?,
            ) | ZRANK_DIR)
                .to_be_bytes();
            for (db, prefix) in [
                (self.elems, &id[..]),
                (self.zscore, &id[..]),
                (self.zscore, &dir[..]),
            ] {
                let keys: Vec<Vec<u8>> = db
                    .prefix_iter(txn, prefix)?
                    .take(budget)
                    .map(|r| r.map(|(k, _)| k.to_vec()))
                    .collect::<Result<_, _>>()?;
                for k in &keys {
                    db.delete(txn, k)?;
                }
                budget -= keys.len();
                if budget == 0 {
                    // Maybe more left: the entry stays for the next round.
                    return Ok(limit);
                }
            }
            self.gc.delete(txn, &id)?;
        }
        Ok(limit - budget)
    }

    pub fn put_cas(&self, txn: &mut LogTxn, cas: u64) -> Result<(), StoreError> {
        Ok(self.meta.put(txn, META_CAS, &cas.to_le_bytes())?)
    }

    /// Runs a scheduled flush whose time has come; true if it did.
    pub fn run_due_flush(&self, txn: &mut LogTxn, now_ms: u64) -> Result<bool, StoreError> {
        match self.meta.get(txn, META_FLUSH_AT)? {
            Some(b)
                if b.len() == 8 && u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) <= now_ms =>
            {
                self.clear_all(txn)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn clear_all(&self, txn: &mut LogTxn) -> Result<(), StoreError> {
        self.items.clear(txn)?;
        self.expiry.clear(txn)?;
        self.elems.clear(txn)?;
        self.zscore.clear(txn)?;
        self.gc.clear(txn)?;
        // The in-memory flag stays set (pessimistic) in case this transaction aborts; a restart
        // reads the cleared state.
        self.meta.delete(txn, META_COLLS)?;
        self.meta.delete(txn, META_FLUSH_AT)?;
        self.meta.put(txn, META_EXPIRES, &0u64.to_le_bytes())?;
        Ok(())
    }
}

/// The expiry and the collection id (None for a string) of an item record.
fn state_of(bytes: &[u8]) -> Result<(u64, Option<u64>), StoreError> {
    let item = item::decode(bytes)?;
    let id = if item.meta.kind == Kind::String {
        None
    } else {
        id_of(&[item.value])
    };
    Ok((item.meta.expire_at, id))
}

/// The collection id a metadata value starts with (u64 LE), read across `parts`.
fn id_of(parts: &[&[u8]]) -> Option<u64> {
    let mut id = [0u8; 8];
    let mut n = 0;
    for p in parts {
        let take = (8 - n).min(p.len());
        id[n..n + take].copy_from_slice(&p[..take]);
        n += take;
        if n == 8 {
            return Some(u64::from_le_bytes(id));
        }
    }
    None
}

/// `parts` concatenated into one shared buffer, copied once (`Arc::from` a `Vec` would copy
/// a large value a second time).
fn concat_shared(parts: &[&[u8]]) -> std::sync::Arc<[u8]> {
    let len = parts.iter().map(|p| p.len()).sum::<usize>();
    let mut buf = std::sync::Arc::<[u8]>::new_uninit_slice(len);
    if let Some(dst) = std::sync::Arc::get_mut(&mut buf) {
        let mut at = 0;
        for p in parts {
            dst[at..at + p.len()].write_copy_of_slice(p);
            at += p.len();
        }
        // SAFETY: `buf` was just made, so `get_mut` gave the only reference, and the loop
        // wrote every one of its `len` bytes.
        return unsafe { buf.assume_init() };
    }
    // Unreachable (a new Arc has no other owner); the plain way stays correct all the same.
    parts.concat().into()
}

/// Whether a string item of `new_len` value bytes made by `edit` from the item `old` (of
/// `old_len` value bytes) under `key` is logged as a patch rather than whole.
fn patchable(
    key: &[u8],
    old: &ItemMeta,
    old_len: usize,
    meta: &ItemMeta,
    new_len: usize,
    edit: &super::Edit,
) -> bool {
    old.kind == Kind::String
        && meta.kind == Kind::String
        && edit.worth_it(new_len)
        && new_len <= u32::MAX as usize
        && old_len <= u32::MAX as usize
        && !key.is_empty()
        && key.len() <= super::MAX_KEY
}

/// Whether LMDB rewrites the overflow run holding `data` (an item larger than a page, as
/// `get` returned it from this write transaction) in place when it is replaced by `len`
/// bytes: the run is dirty in this transaction and has pages enough (`mdb_cursor_put`).
fn overflow_reusable(data: &[u8], len: usize, page: usize) -> bool {
    // LMDB's page header (`MDB_page`): page number (8 bytes), pad (2), flags (2), and for an
    // overflow page its page count (4); the data starts right after it.
    const PAGE_HEADER: usize = 16;
    const P_OVERFLOW: u16 = 0x04;
    const P_DIRTY: u16 = 0x10;
    if page == 0 || data.len() < page {
        return false;
    }
    let start = data.as_ptr() as usize;
    let Some(hdr) = start.checked_sub(PAGE_HEADER) else {
        return false;
    };
    // Safety: an item of at least a page is stored in an overflow run (LMDB puts any node
    // larger than half a page there), and the data of an overflow node starts right after
    // its first page's header, in the same allocation: LMDB's map, or the dirty page LMDB
    // made for this transaction. The header is read, never written.
    let (flags, pages) = unsafe {
        let h = std::ptr::with_exposed_provenance::<u8>(hdr);
        (
            std::ptr::read_unaligned(h.add(10).cast::<u16>()),
            std::ptr::read_unaligned(h.add(12).cast::<u32>()),
        )
    };
    let needed = (PAGE_HEADER - 1 + len) / page + 1;
    flags & P_OVERFLOW != 0 && flags & P_DIRTY != 0 && pages as usize >= needed
}

/// `header` then `pieces` (`Edit::pieces`) in one new shared buffer, each byte written once.
fn edited_shared(header: &[u8], pieces: &[super::Piece]) -> std::sync::Arc<[u8]> {
    let total = header.len()
        + pieces
            .iter()
            .map(|p| match *p {
                super::Piece::Bytes(b) => b.len(),
                super::Piece::Zeros(n) => n,
            })
            .sum::<usize>();
    let mut buf = std::sync::Arc::<[u8]>::new_uninit_slice(total);
    if let Some(dst) = std::sync::Arc::get_mut(&mut buf) {
        dst[..header.len()].write_copy_of_slice(header);
        let mut at = header.len();
        for piece in pieces {
            match *piece {
                super::Piece::Bytes(b) => {
                    dst[at..at + b.len()].write_copy_of_slice(b);
                    at += b.len();
                }
                super::Piece::Zeros(n) => {
                    for b in &mut dst[at..at + n] {
                        b.write(0);
                    }
                    at += n;
                }
            }
        }
        // SAFETY: `buf` was just made, so `get_mut` gave the only reference, and the header
        // and the pieces, `total` bytes in all, were written end to end.
        return unsafe { buf.assume_init() };
    }
    // Unreachable (a new Arc has no other owner); the plain way stays correct all the same.
    let mut v = header.to_vec();
    for piece in pieces {
        match *piece {
            super::Piece::Bytes(b) => v.extend_from_slice(b),
            super::Piece::Zeros(n) => v.resize(v.len() + n, 0),
        }
    }
    v.into()
}

/// How a replay treats a `PATCH` record whose old item is not what the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// The store is exactly as the log left it before this record (recovery from a
    /// checkpoint, a rebuilt transaction): a mismatch is damage.
    Exact,
    /// The store may be ahead of the record (a copy taken while the server ran, caught up
    /// from an earlier position): a mismatch is a later state, and the record is skipped.
    CatchUp,
}

/// Applies a `PATCH` record (see `wal.rs`): onto the item it was made against; not at all
/// where the new item is already stored.
fn replay_patch(
    table: Table,
    txn: &mut RwTxn,
    key: &[u8],
    p: &super::wal::Patch,
    mode: Replay,
) -> Result<(), String> {
    let name = String::from_utf8_lossy(&key[..key.len().min(64)]).into_owned();
    let corrupt = |why: &str| format!("storage corrupted: the log's patch of key {name:?} {why}");
    let old = item::decode(p.old_header).map_err(|_| corrupt("has a bad old header"))?;
    let new = item::decode(p.new_header).map_err(|_| corrupt("has a bad new header"))?;
    let stored = table
        .db
        .get(txn, key)
        .map_err(|e| format!("cannot replay a log record: {e}"))?;
    let value = match stored.map(item::decode) {
        Some(Ok(i)) => {
            let same = |m: ItemMeta, len: u32| i.meta == m && i.value.len() == len as usize;
            if same(new.meta, p.new_len) && crc32fast::hash(i.value) == p.crc {
                return Ok(());
            }
            if same(old.meta, p.old_len) {
                Some(p.apply(i.value).map_err(|e| corrupt(&e))?)
            } else {
                None
            }
        }
        Some(Err(_)) if mode == Replay::Exact => return Err(corrupt("meets an undecodable item")),
        _ => None,
    };
    let Some(value) = value else {
        return match mode {
            Replay::Exact => Err(corrupt("does not match the item stored before it")),
            Replay::CatchUp => Ok(()),
        };
    };
    if crc32fast::hash(&value) != p.crc {
        return Err(corrupt("does not make the value it recorded"));
    }
    let mut bytes = Vec::with_capacity(p.new_header.len() + value.len());
    bytes.extend_from_slice(p.new_header);
    bytes.extend_from_slice(&value);
    table
        .db
        .put(txn, key, &bytes)
        .map_err(|e| format!("cannot replay a log record: {e}"))
}

/// A write transaction seen through `WriteView`.
pub struct LmdbWrite<'t, 'e> {
    store: &'t LmdbStore,
    txn: &'t mut LogTxn<'e>,
    cas: &'t mut u64,
}

impl<'e> LmdbWrite<'_, 'e> {
    /// Stores `item` (a string item, `header` bytes of header, made by `edit` from the item
    /// with meta `old` and `old_len` value bytes) as a patch: the log gets only the change.
    #[allow(clippy::too_many_arguments)]
    fn store_patched(
        &mut self,
        key: &[u8],
        old: &ItemMeta,
        old_len: usize,
        meta: &ItemMeta,
        item: std::sync::Arc<[u8]>,
        header: usize,
        edit: &super::Edit,
    ) -> Result<(), StoreError> {
        let (old_hdr, old_n) = old.header();
        self.store.items.patch(
            self.txn,
            key,
            (&old_hdr[..old_n], old_len),
            item,
            header,
            edit,
        )?;
        self.patched_meta(key, old, meta)
    }

    /// What a patched item's store changes besides its record: its use, its expiry index
    /// entry and the count of expiring items.
    fn patched_meta(
        &mut self,
        key: &[u8],
        old: &ItemMeta,
        meta: &ItemMeta,
    ) -> Result<(), StoreError> {
        if let Some(a) = self.store.access() {
            a.note_write(key, *self.cas);
        }
        if let Some(h) = self.store.hits() {
            h.written(key, meta.cas);
        }
        if meta.expire_at != 0 && meta.expire_at != old.expire_at {
            let key = &key[..key.len().min(INDEX_KEY_MAX)];
            let mut ix = Vec::with_capacity(8 + key.len());
            ix.extend_from_slice(&meta.expire_at.to_be_bytes());
            ix.extend_from_slice(key);
            self.store.expiry.put(self.txn, &ix, &[])?;
        }
        let delta = i64::from(meta.expire_at != 0) - i64::from(old.expire_at != 0);
        self.store.count_expires(self.txn, delta)?;
        Ok(())
    }

    /// Makes `edit` (a write at an offset: APPEND, SETRANGE, SETBIT and the like; or a
    /// prepend, which shifts the old value within the pages) of the large string under `key`
    /// where LMDB holds it, when LMDB rewrites the item's overflow pages in place: they are
    /// dirty in this transaction (written by an earlier store or edit of it) and long enough
    /// for the new item. Then only the header
    /// and the edited bytes are written, where a store copied the whole item into LMDB (and
    /// an edit of a 1 MiB value cost a 1 MiB copy). False, having changed nothing, when it
    /// cannot be done so; the caller stores the item whole.
    ///
    /// How it knows: `mdb_cursor_put` reuses an overflow run that is dirty (or spilled,
    /// which it copies back first) and has at least as many pages as the new data needs,
    /// handing its memory back for `MDB_RESERVE` with the old bytes still in it. The run's
    /// page header, just before the data `get` returns for an item larger than a page (such
    /// an item always lives in an overflow run), says both: its flags and its page count.
    fn edit_in_place(
        &mut self,
        key: &[u8],
        old: &ItemMeta,
        meta: &ItemMeta,
        header: &[u8],
        data: &[u8],
        edit: &super::Edit,
    ) -> Result<bool, StoreError> {
        // A write of `data` at `at`, or a prepend of `data` (shifting the old value).
        let shape_ok = if edit.prepend > 0 {
            edit.len == 0 && edit.at == 0 && data.len() == edit.prepend
        } else {
            data.len() == edit.len
        };
        if !shape_ok || key.is_empty() || key.len() > super::MAX_KEY {
            return Ok(false);
        }
        let page = self.store.page_size;
        let table = &self.store.items;
        let Some(raw) = table.db.get(&self.txn.txn, key)? else {
            return Ok(false);
        };
        let Some(old_n) = item::header_len_of(raw) else {
            return Ok(false);
        };
        if !item::is_inline(raw) || old_n != header.len() || raw.len() < old_n || raw.len() < page {
            return Ok(false);
        }
        let old_len = raw.len() - old_n;
        let new_len = edit.new_len(old_len);
        let total = old_n + new_len;
        if !patchable(key, old, old_len, meta, new_len, edit) || edit.at > new_len {
            return Ok(false);
        }
        if !overflow_reusable(raw, total, page) {
            return Ok(false);
        }
        let mut old_header = [0u8; item::MAX_HEADER];
        old_header[..old_n].copy_from_slice(&raw[..old_n]);
        let old_header = &old_header[..old_n];
        let at = old_n + edit.at;
        // The CRC of the new value, from the last patch's when it wrote this very value (no
        // other write of the key since: see `LogTxn::crcs`), else from the whole value.
        let known = self
            .txn
            .crc_of(table.id, key)
            .and_then(|(len, crc)| (len == old_len).then_some(crc));
        let mut crc = 0u32;
        table
            .db
            .put_reserved(&mut self.txn.txn, key, total, |space| {
                let buf = space.as_uninit_mut();
                if buf.len() != total {
                    return Err(std::io::Error::other("reserved space of the wrong size"));
                }
                let head = &buf[..old_n];
                // Safety: LMDB handed back the run that holds the old item (see above), whose
                // first bytes are initialized; checked against the old header all the same,
                // so that a run LMDB did not reuse fails the batch (rebuilt from the log)
                // rather than keep what was in fresh memory.
                let same = head
                    .iter()
                    .zip(old_header)
                    .all(|(b, o)| unsafe { b.assume_init() } == *o);
                if !same {
                    return Err(std::io::Error::other(
                        "LMDB did not edit the item's pages in place",
                    ));
                }
                // Safety: the old value's bytes, initialized as above.
                let old_value = |from: usize, to: usize| -> Vec<u8> {
                    buf[old_n + from..old_n + to]
                        .iter()
                        .map(|b| unsafe { b.assume_init() })
                        .collect()
                };
                let from_known = known.and_then(|c| {
                    use super::wal::crc_edit;
                    if edit.prepend > 0 {
                        return Some(crc_edit::prepend(c, old_len, data));
                    }
                    let a = edit.at;
                    if a >= old_len {
                        return Some(crc_edit::append(c, old_len, a - old_len, data));
                    }
                    // Overwritten up to the old end, the rest appended.
                    let k = data.len().min(old_len - a);
                    let (over, past) = data.split_at(k);
                    let c = crc_edit::overwrite(c, old_len, a, &old_value(a, a + k), over)?;
                    Some(crc_edit::append(c, old_len, 0, past))
                });
                for (d, s) in buf.iter_mut().zip(header) {
                    d.write(*s);
                }
                if edit.prepend > 0 {
                    buf.copy_within(old_n..old_n + old_len, old_n + edit.prepend);
                    for (d, s) in buf[old_n..old_n + data.len()].iter_mut().zip(data) {
                        d.write(*s);
                    }
                } else {
                    if let Some(gap) = buf.get_mut(old_n + old_len..at) {
                        gap.fill(std::mem::MaybeUninit::new(0));
                    }
                    for (d, s) in buf[at..at + data.len()].iter_mut().zip(data) {
                        d.write(*s);
                    }
                }
                // Safety: every byte is the old item's or was just written.
                let value = unsafe {
                    std::slice::from_raw_parts(buf.as_ptr().cast::<u8>().add(old_n), new_len)
                };
                crc = from_known.unwrap_or_else(|| crc32fast::hash(value));
                // Safety: as above, the whole reservation holds the new item.
                unsafe { space.assume_written(total) };
                Ok(())
            })
            .map_err(|e| StoreError::Backend(format!("cannot edit an item in place: {e}")))?;
        let (Ok(new_len32), Ok(old_len32), Ok(at32)) = (
            u32::try_from(new_len),
            u32::try_from(old_len),
            u32::try_from(edit.at),
        ) else {
            return Err(StoreError::Backend("an edited item past 4 GiB".into()));
        };
        let (prepend, bytes): (&[u8], &[u8]) = if edit.prepend > 0 {
            (data, &[])
        } else {
            (&[], data)
        };
        let patch = super::wal::Patch {
            old_header,
            old_len: old_len32,
            new_header: header,
            new_len: new_len32,
            crc,
            prepend,
            at: at32,
            bytes,
        };
        let id = table.id;
        // Readers need the whole new item, but the overlay makes it from the record and the
        // key's previous version when this transaction stored the key before: its version
        // since is in the overlay (or earlier in this batch). Otherwise it gets a copy.
        let again = self.txn.patched_before(id, key);
        let dirty = self.txn.patch_charge(id, key, total);
        self.txn.set_crc(id, key, new_len, crc);
        let whole = if again {
            None
        } else {
            match table.db.get(&self.txn.txn, key)? {
                Some(b) => Some(std::sync::Arc::<[u8]>::from(b)),
                None => return Err(StoreError::Backend("an edited item vanished".into())),
            }
        };
        self.txn.log.patch(id, key, &patch, whole, dirty);
        self.patched_meta(key, old, meta)?;
        Ok(true)
    }

    /// The store and the open transaction, for the collection types.
    pub fn parts(&mut self) -> (&LmdbStore, &mut LogTxn<'e>) {
        (self.store, self.txn)
    }

    /// Raises the CAS counter to at least `at_least`: a replica follows its primary's
    /// counter, so uniques it hands out once promoted are past every replicated one.
    pub fn raise_cas(&mut self, at_least: u64) {
        if *self.cas < at_least {
            *self.cas = at_least;
        }
    }
}

impl ReadView for LmdbWrite<'_, '_> {
    fn get(&self, key: &[u8]) -> Result<Option<ItemRef<'_>>, StoreError> {
        self.store.get(self.txn, key)
    }
}

impl WriteView for LmdbWrite<'_, '_> {
    fn put(&mut self, key: &[u8], meta: &ItemMeta, parts: &[&[u8]]) -> Result<(), StoreError> {
        if key.is_empty() || key.len() > super::MAX_KEY {
            return Err(StoreError::BadKey);
        }
        let (hdr, n) = meta.header();
        let mut all: [&[u8]; 4] = [&hdr[..n], &[], &[], &[]];
        let long: Vec<&[u8]>;
        let record: &[&[u8]] = if parts.len() <= 3 {
            all[1..=parts.len()].copy_from_slice(parts);
            &all[..=parts.len()]
        } else {
            long = [&[&hdr[..n]][..], parts].concat();
            &long
        };
        // A new key is written in the same search that finds it absent; a record already
        // there is read first (its expiry and collection), then replaced.
        let old_expire = match self
            .store
            .items
            .put_new_parts(self.txn, key, record, state_of)?
        {
            None => 0,
            Some(old) => {
                let (old_expire, old_id) = old?;
                // Replacing a collection by anything but its own metadata orphans its
                // elements.
                if let Some(old) = old_id {
                    let new = (meta.kind != Kind::String).then(|| id_of(parts)).flatten();
                    if new != Some(old) {
                        self.store.schedule_gc(self.txn, old)?;
                    }
                }
                self.store.items.put_parts(self.txn, key, record)?;
                old_expire
            }
        };
        if let Some(a) = self.store.access() {
            a.note_write(key, *self.cas);
        }
        if let Some(h) = self.store.hits() {
            h.written(key, meta.cas);
        }
        if meta.expire_at != 0 {
            // A key longer than INDEX_KEY_MAX is filed under its prefix (see `sweep_expired`):
            // the whole key would not fit LMDB's key limit, and the item is already written.
            let key = &key[..key.len().min(INDEX_KEY_MAX)];
            let mut ix = Vec::with_capacity(8 + key.len());
            ix.extend_from_slice(&meta.expire_at.to_be_bytes());
            ix.extend_from_slice(key);
            self.store.expiry.put(self.txn, &ix, &[])?;
        }
        let delta = i64::from(meta.expire_at != 0) - i64::from(old_expire != 0);
        self.store.count_expires(self.txn, delta)?;
        Ok(())
    }

    fn patch(
        &mut self,
        key: &[u8],
        old: &ItemMeta,
        old_len: usize,
        meta: &ItemMeta,
        parts: &[&[u8]],
        edit: &super::Edit,
    ) -> Result<(), StoreError> {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        if !patchable(key, old, old_len, meta, len, edit) {
            return self.put(key, meta, parts);
        }
        let (hdr, n) = meta.header();
        // The whole new item, made once: LMDB takes a copy, readers share this one.
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(&hdr[..n]);
        all.extend_from_slice(parts);
        let item = concat_shared(&all);
        self.store_patched(key, old, old_len, meta, item, n, edit)
    }

    fn edit(
        &mut self,
        key: &[u8],
        old: &ItemMeta,
        meta: &ItemMeta,
        data: &[u8],
        edit: &super::Edit,
    ) -> Result<(), StoreError> {
        let (hdr, n) = meta.header();
        if self.edit_in_place(key, old, meta, &hdr[..n], data, edit)? {
            return Ok(());
        }
        // The new item is built from the old value where LMDB holds it (no copy of it first),
        // and only then stored: the one copy of the value an edit needs besides LMDB's own.
        let (made, old_len) = {
            let cur = self
                .store
                .get(self.txn, key)?
                .ok_or_else(super::edit_gone)?;
            let pieces = edit.pieces(cur.value, data).ok_or_else(super::bad_edit)?;
            let new_len = edit.new_len(cur.value.len());
            let made = if patchable(key, old, cur.value.len(), meta, new_len, edit) {
                Ok(edited_shared(&hdr[..n], &pieces))
            } else {
                Err(edit.apply(cur.value, data).ok_or_else(super::bad_edit)?)
            };
            (made, cur.value.len())
        };
        match made {
            Ok(item) => self.store_patched(key, old, old_len, meta, item, n, edit),
            Err(value) => self.put(key, meta, &[&value]),
        }
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        if key.is_empty() || key.len() > super::MAX_KEY {
            return Ok(false);
        }
        let (old_expire, old_id) = self.store.old_state(self.txn, key)?;
        if let Some(id) = old_id {
            self.store.schedule_gc(self.txn, id)?;
        }
        let gone = self.store.items.delete(self.txn, key)?;
        if gone && old_expire != 0 {
            self.store.count_expires(self.txn, -1)?;
        }
        Ok(gone)
    }

    fn take(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        if key.is_empty() || key.len() > super::MAX_KEY {
            return Ok(false);
        }
        let (old_expire, _) = self.store.old_state(self.txn, key)?;
        let gone = self.store.items.delete(self.txn, key)?;
        if gone && old_expire != 0 {
            self.store.count_expires(self.txn, -1)?;
        }
        Ok(gone)
    }

    fn clear(&mut self) -> Result<(), StoreError> {
        self.store.clear_all(self.txn)
    }

    fn schedule_flush(&mut self, at_ms: u64) -> Result<(), StoreError> {
        Ok(self
            .store
            .meta
            .put(self.txn, META_FLUSH_AT, &at_ms.to_le_bytes())?)
    }

    fn next_cas(&mut self) -> u64 {
        *self.cas += 1;
        *self.cas
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(cas: u64, expire_at: u64) -> ItemMeta {
        ItemMeta::new(Kind::String, 7, expire_at, cas)
    }

    #[test]
    fn items_and_cas_counter_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (store, p) = LmdbStore::open(dir.path(), 1 << 24, 16).expect("open");
            assert_eq!(p.cas, 0);
            let mut txn = store.write_txn().expect("txn");
            let mut cas = p.cas;
            let mut w = store.writer(&mut txn, &mut cas);
            let c = w.next_cas();
            w.put(b"k", &meta(c, 0), &[b"he", b"llo"]).expect("put");
            store.put_cas(&mut txn, cas).expect("cas");
            txn.commit_unlogged().expect("commit");
        }
        let (store, p) = LmdbStore::open(dir.path(), 1 << 24, 16).expect("reopen");
        assert_eq!(p.cas, 1);
        let txn = store.read_txn().expect("txn");
        let item = store.get(&txn, b"k").expect("get").expect("present");
        assert_eq!(item.value, b"hello");
        assert_eq!(item.meta, meta(1, 0));
    }

    #[test]
    fn sweeper_removes_due_items_and_skips_stale_index_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = LmdbStore::open(dir.path(), 1 << 24, 16).expect("open");
        let mut txn = store.write_txn().expect("txn");
        let mut cas = 0;
        let mut w = store.writer(&mut txn, &mut cas);
        w.put(b"a", &meta(1, 100), &[b"1"]).expect("put");
        w.put(b"b", &meta(2, 100), &[b"2"]).expect("put");
        // b's expiry moved later: its old index entry is stale.
        w.put(b"b", &meta(2, 500), &[b"2"]).expect("put");
        w.put(b"c", &meta(3, 0), &[b"3"]).expect("put");
        let expires = |txn: &RoTxn| store.expires(txn).expect("expires");
        assert_eq!(expires(&txn), Some(2));
        assert_eq!(store.sweep_expired(&mut txn, 200, 100).expect("sweep"), 1);
        assert!(store.get(&txn, b"a").expect("get").is_none());
        assert!(store.get(&txn, b"b").expect("get").is_some());
        assert_eq!(expires(&txn), Some(1));
        assert_eq!(store.sweep_expired(&mut txn, 600, 100).expect("sweep"), 1);
        assert!(store.get(&txn, b"b").expect("get").is_none());
        assert!(store.get(&txn, b"c").expect("get").is_some());
        assert_eq!(expires(&txn), Some(0));
    }

    /// A data dir from before the `expires` record takes the count from `items` at the first
    /// write that changes it, then keeps it.
    #[test]
    fn expires_count_is_rebuilt_once_in_an_older_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = LmdbStore::open(dir.path(), 1 << 24, 16).expect("open");
        let mut txn = store.write_txn().expect("txn");
        let mut cas = 0;
        let mut w = store.writer(&mut txn, &mut cas);
        w.put(b"a", &meta(1, 100), &[b"1"]).expect("put");
        w.put(b"b", &meta(2, 0), &[b"2"]).expect("put");
        store.meta.delete(&mut txn, META_EXPIRES).expect("delete");
        assert_eq!(store.expires(&txn).expect("expires"), None);
        let mut w = store.writer(&mut txn, &mut cas);
        w.put(b"b", &meta(3, 0), &[b"3"]).expect("put");
        assert_eq!(store.expires(&txn).expect("expires"), None);
        let mut w = store.writer(&mut txn, &mut cas);
        w.put(b"c", &meta(4, 100), &[b"4"]).expect("put");
        assert_eq!(store.expires(&txn).expect("expires"), Some(2));
        let mut w = store.writer(&mut txn, &mut cas);
        w.delete(b"a").expect("delete");
        assert_eq!(store.expires(&txn).expect("expires"), Some(1));
    }

    /// Found by the command_stream fuzz target: a key of 504 to 511 bytes with an expiry was
    /// written, then refused as a bad key because its index entry overflowed LMDB's key limit.
    #[test]
    fn keys_too_long_for_the_index_take_an_expiry_and_are_swept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = LmdbStore::open(dir.path(), 1 << 24, 16).expect("open");
        let mut txn = store.write_txn().expect("txn");
        let mut cas = 0;
        let mut w = store.writer(&mut txn, &mut cas);
        let long = |last: u8| {
            let mut k = vec![b'k'; crate::storage::MAX_KEY];
            k[crate::storage::MAX_KEY - 1] = last;
            k
        };
        // Three keys sharing their first INDEX_KEY_MAX bytes, two expiring at the same time.
        w.put(&long(b'a'), &meta(1, 100), &[b"1"]).expect("put");
        w.put(&long(b'b'), &meta(2, 100), &[b"2"]).expect("put");
        w.put(&long(b'c'), &meta(3, 500), &[b"3"]).expect("put");
        w.put(&long(b'd'), &meta(4, 0), &[b"4"]).expect("put");
        w.put(&vec![b'k'; INDEX_KEY_MAX], &meta(5, 100), &[b"5"])
            .expect("put");
        assert_eq!(store.sweep_expired(&mut txn, 200, 100).expect("sweep"), 3);
        assert!(store.get(&txn, &long(b'a')).expect("get").is_none());
        assert!(store.get(&txn, &long(b'b')).expect("get").is_none());
        assert!(store.get(&txn, &long(b'c')).expect("get").is_some());
        assert_eq!(store.sweep_expired(&mut txn, 600, 100).expect("sweep"), 1);
        assert!(store.get(&txn, &long(b'c')).expect("get").is_none());
        assert!(store.get(&txn, &long(b'd')).expect("get").is_some());
    }

    #[test]
    fn full_map_is_a_typed_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = LmdbStore::open(dir.path(), 1 << 20, 16).expect("open");
        let mut txn = store.write_txn().expect("txn");
        let mut cas = 0;
        let mut w = store.writer(&mut txn, &mut cas);
        let big = vec![0u8; 64 * 1024];
        let mut result = Ok(());
        for i in 0..64u32 {
            result = w.put(&i.to_be_bytes(), &meta(1, 0), &[&big]);
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(StoreError::Full)), "{result:?}");
    }

    #[test]
    fn open_reports_unusable_directory_in_one_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        let err = LmdbStore::open(&file.join("sub"), 1 << 20, 16)
            .err()
            .expect("must fail");
        assert!(err.0.contains("cannot create data directory"), "{}", err.0);
        assert!(!err.0.contains('\n'));
    }

    #[test]
    fn a_dead_value_segment_is_retired_only_once_no_older_reader_is_left() {
        let dir = tempfile::tempdir().expect("dir");
        let (mut store, _) = LmdbStore::open(dir.path(), 1 << 26, 16).expect("open");
        store.enable_separation(16).expect("separation");
        let vlog = store.vlog().cloned().expect("a value log");
        let (path, file) = super::super::vlog::test_segment(dir.path(), 3);
        let meta = ItemMeta::new(Kind::String, 0, 0, 1);
        let (h, n) = meta.header();
        let value = vec![7u8; 5000];
        let mut txn = store.write_txn().expect("txn");
        txn.set_sink(store.sink(3, 4096, || file.clone()));
        store
            .items
            .put_parts(&mut txn, b"k", &[&h[..n], &value])
            .expect("put");
        txn.set_sink(None);
        txn.commit_unlogged().expect("commit");
        assert!(vlog.holds(3));
        // A reader follows the pointer into segment 3 and keeps the value's slice.
        let reader = store.read_txn().expect("reader");
        let rec = store.items.get(&reader, b"k").expect("get").expect("k");
        let slice = item::decode(rec).expect("decodes").value;
        assert_eq!(slice, &value[..]);
        // The key gets a short value, stored inline: from this snapshot on nothing points into
        // segment 3.
        let mut txn = store.write_txn().expect("txn");
        store
            .items
            .put_parts(&mut txn, b"k", &[&h[..n], b"short"])
            .expect("put");
        txn.commit_unlogged().expect("commit");
        let snap = store.read_txn().expect("snapshot");
        let mut c = super::super::vlog::Collector::new(vlog.clone(), *store.items());
        c.after_checkpoint(&snap, 4);
        drop(snap);
        assert!(c.waiting(), "segment 3 not found dead");
        c.retire_ready();
        assert!(
            vlog.holds(3) && path.exists(),
            "retired under a reader of an older snapshot"
        );
        assert_eq!(slice, &value[..], "the reader's slice still reads");
        drop(reader);
        c.retire_ready();
        assert!(!c.waiting());
        assert!(!vlog.holds(3) && !path.exists(), "not retired");
        assert_eq!(vlog.footprint().retired, 1);
    }

    /// A store holding `value` under `k` (a string with flags and an expiry), its item meta.
    fn store_with(dir: &Path, value: &[u8], cas: u64) -> (LmdbStore, ItemMeta) {
        let (store, _) = LmdbStore::open(dir, 1 << 26, 16).expect("open");
        let meta = ItemMeta::new(Kind::String, 9, 1 << 50, cas);
        let mut txn = store.write_txn().expect("txn");
        let mut c = cas;
        store
            .writer(&mut txn, &mut c)
            .put(b"k", &meta, &[value])
            .expect("put");
        txn.commit_unlogged().expect("commit");
        (store, meta)
    }

    fn value_of(store: &LmdbStore) -> Option<(ItemMeta, Vec<u8>)> {
        let txn = store.read_txn().expect("txn");
        store
            .get(&txn, b"k")
            .expect("get")
            .map(|i| (i.meta, i.value.to_vec()))
    }

    /// Replays `payload` onto `store` in one transaction; the transaction is kept only if it
    /// replayed.
    fn replay_all(store: &LmdbStore, payload: &[u8], mode: Replay) -> Result<(), String> {
        let mut txn = store.env().write_txn().expect("txn");
        for op in crate::storage::wal::ops(payload) {
            store.replay(&mut txn, op?, mode)?;
        }
        txn.commit().map_err(|e| e.to_string())
    }

    #[test]
    fn a_large_append_is_logged_as_a_patch_that_replays_only_onto_its_own_old_item() {
        let old: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let data = b"tail bytes";
        let src = tempfile::tempdir().expect("tempdir");
        let (store, meta) = store_with(src.path(), &old, 5);
        let mut new_meta = meta;
        new_meta.cas = 6;
        let mut txn = store.write_txn().expect("txn");
        let mut cas = 6;
        let edit = crate::storage::Edit::append(old.len(), data.len());
        store
            .writer(&mut txn, &mut cas)
            .patch(b"k", &meta, old.len(), &new_meta, &[&old, data], &edit)
            .expect("patch");
        let log = txn.take_log(LogBuf::default());
        // The record holds the change, not the value; readers get the whole new item.
        assert!(
            log.payload_len() < 200,
            "{} bytes logged",
            log.payload_len()
        );
        assert_eq!(log.patched().len(), 1);
        assert_eq!(log.patched_bytes(), (old.len() + data.len()) as u64);
        let mut expect = old.clone();
        expect.extend_from_slice(data);
        let whole = log.patched()[0].clone().expect("the whole item");
        let item = item::decode(&whole).expect("decode");
        assert_eq!((item.meta, item.value), (new_meta, &expect[..]));
        let payload = log.payload().to_vec();
        drop(txn);

        // Onto the old item: applied, in either mode.
        for mode in [Replay::Exact, Replay::CatchUp] {
            let d = tempfile::tempdir().expect("tempdir");
            let (s, _) = store_with(d.path(), &old, 5);
            replay_all(&s, &payload, mode).expect("replay");
            assert_eq!(value_of(&s), Some((new_meta, expect.clone())));
            // Again, onto its own result: nothing changes.
            replay_all(&s, &payload, mode).expect("replay again");
            assert_eq!(value_of(&s), Some((new_meta, expect.clone())));
        }
        // Onto another item (another CAS, or the same header with other bytes, or none):
        // damage when the store should be exactly as the log left it, skipped when it may be
        // ahead of the log.
        let other_cas = tempfile::tempdir().expect("tempdir");
        let (s1, _) = store_with(other_cas.path(), &old, 4);
        let other_len = tempfile::tempdir().expect("tempdir");
        let (s2, _) = store_with(other_len.path(), &old[1..], 5);
        let missing = tempfile::tempdir().expect("tempdir");
        let (s3, _) = LmdbStore::open(missing.path(), 1 << 26, 16).expect("open");
        for s in [&s1, &s2, &s3] {
            let before = value_of(s);
            let err = replay_all(s, &payload, Replay::Exact).expect_err("must refuse");
            assert!(err.contains("storage corrupted"), "{err}");
            replay_all(s, &payload, Replay::CatchUp).expect("skipped");
            assert_eq!(value_of(s), before);
        }
        // A new item with the right header and length but other bytes is not taken for the
        // result (the CRC tells), and is not the old item either.
        let same_shape = tempfile::tempdir().expect("tempdir");
        let (s4, _) = store_with(same_shape.path(), &vec![7u8; expect.len()], 6);
        assert!(replay_all(&s4, &payload, Replay::Exact).is_err());
    }

    #[test]
    fn a_patch_whose_bytes_do_not_make_the_recorded_value_is_refused() {
        let old = vec![1u8; 8192];
        let src = tempfile::tempdir().expect("tempdir");
        let (store, meta) = store_with(src.path(), &old, 5);
        let mut new_meta = meta;
        new_meta.cas = 6;
        let mut new = old.clone();
        new[100] = 2;
        let mut txn = store.write_txn().expect("txn");
        let mut cas = 6;
        store
            .writer(&mut txn, &mut cas)
            .patch(
                b"k",
                &meta,
                old.len(),
                &new_meta,
                &[&new],
                &crate::storage::Edit::write(100, 1),
            )
            .expect("patch");
        let mut payload = txn.take_log(LogBuf::default()).payload().to_vec();
        drop(txn);
        // The written byte is the record's last; change it.
        let last = payload.len() - 1;
        assert_eq!(payload[last], 2);
        payload[last] = 3;
        let d = tempfile::tempdir().expect("tempdir");
        let (s, _) = store_with(d.path(), &old, 5);
        let err = replay_all(&s, &payload, Replay::CatchUp).expect_err("must refuse");
        assert!(err.contains("does not make the value"), "{err}");
    }

    #[test]
    fn small_values_and_large_rewrites_are_logged_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, meta) = store_with(dir.path(), b"short", 5);
        let mut new_meta = meta;
        new_meta.cas = 6;
        let mut txn = store.write_txn().expect("txn");
        let mut cas = 6;
        let edit = crate::storage::Edit::append(5, 3);
        store
            .writer(&mut txn, &mut cas)
            .patch(b"k", &meta, 5, &new_meta, &[b"short", b"abc"], &edit)
            .expect("patch");
        let log = txn.take_log(LogBuf::default());
        assert!(log.patched().is_empty());
        assert!(matches!(
            crate::storage::wal::ops(log.payload()).next(),
            Some(Ok(crate::storage::wal::Op::Put { .. }))
        ));
        // More new bytes than old ones: the whole value.
        let edit = crate::storage::Edit::append(5, 9000);
        assert!(!edit.worth_it(9005));
        assert!(crate::storage::Edit::append(9000, 5).worth_it(9005));
        assert!(!crate::storage::Edit::write(9000, 10).worth_it(9005));
    }
}
