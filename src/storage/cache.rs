//! Cache mode (`max_disk`): past a cap on the disk the data occupies, the writer evicts instead
//! of refusing writes.
//!
//! **What is measured.** The cap counts the pages LMDB's trees occupy in `data.mdb`: every
//! database's branch, leaf and overflow pages (`LmdbStore::data_pages`), plus LMDB's two meta
//! pages and the main tree. Free pages inside the file (which LMDB reuses) do not count, so the
//! file itself may be larger than the cap by what LMDB keeps free (bounded by checkpoints, see
//! `writer.rs`), and it never shrinks. Why these counts and not a counter of our own, or the
//! file's last page minus the free list: LMDB keeps each tree's page counts in the tree's own
//! record and changes them in the same transaction as the pages, so they are right after every
//! commit, after a crash (recovery opens a checkpoint's snapshot, whose records match its
//! trees, then replays the log through the same code), and after a restart, with nothing of
//! ours to persist or to get wrong; reading them is O(1) (`mdb_stat`), also inside the open
//! write transaction, so the writer sees a batch's effect before it commits. The free list, by
//! contrast, must be walked to be counted, and counts pages a pinned snapshot still holds.
//!
//! **What is evicted.** When the data passes the cap, the writer thread runs eviction passes
//! (batches of their own, between client batches; never on a worker's event loop) until it is
//! back under a low-water mark a little below the cap:
//! 1. elements of collections already deleted (the `gc` database): pure gain;
//! 2. expired items, from the `expiry` index (not counted as evictions);
//! 3. the least recently used items, approximately: each candidate's last use is the later of
//!    its last write (its CAS unique, when its header is in its leaf page) and what `Access`
//!    remembers of it; candidates come from a hand that walks the keyspace in key order and
//!    from runs starting at random waypoints the hand left behind (so keys whose order follows
//!    their age, such as sequential ids, are still sampled across the whole keyspace), and go
//!    into a small pool that keeps the oldest seen; the oldest in the pool is evicted. A
//!    collection is evicted whole: its record goes, its elements follow through `gc`.
//!
//! **How uses are known.** `Access` is a fixed table (4 MiB, whatever the number of keys) of
//! one 64-bit word per slot: a fingerprint of the key's hash, whether the last use was a read,
//! and the time of that use. Time is the CAS counter (the writer publishes it after every
//! batch): writes advance it, so "older" means "fewer writes ago", the scale the CAS unique in
//! every item header already has. Readers store into their key's slot with one relaxed atomic
//! (none when the slot already says the same), and only in cache mode. A key whose slot another
//! key took has no known use beyond its last write; after a restart nothing is known until keys
//! are used again (the table is not persisted). `evicted_unfetched` counts evicted items whose
//! slot does not say "read since written", so an item read long ago, whose slot has since been
//! reused, counts as unfetched.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use heed::{RoTxn, WithoutTls};

use super::lmdb::{LmdbStore, LogTxn};
use super::{StoreError, WriteView, item};

/// The access table: buckets of 8 slots (one cache line), 8 bytes a slot, 4 MiB in all.
const BUCKET_SLOTS: usize = 8;
const BUCKETS: usize = 1 << 16;
pub const ACCESS_SLOTS: usize = BUCKETS * BUCKET_SLOTS;
const TICK_BITS: u32 = 47;
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;
const READ_BIT: u64 = 1 << TICK_BITS;
const FP_SHIFT: u32 = TICK_BITS + 1;

#[repr(align(64))]
struct Bucket([AtomicU64; BUCKET_SLOTS]);

/// The last known use of keys (see the module documentation). A key's hash picks a bucket; its
/// fingerprint (16 bits of the hash, never 0) finds its slot there. A key not in its bucket
/// takes the slot of the bucket's oldest use, so a key is forgotten only once 8 keys of its
/// bucket have been used more recently: the table holds about the last half-million distinct
/// keys used.
pub struct Access {
    buckets: Box<[Bucket]>,
    seed: u64,
    /// The time readers stamp their uses with: the writer's CAS counter after its last batch.
    tick: AtomicU64,
}

/// What `Access` remembers of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    /// When (on the CAS counter's scale, 47 bits: a wrap needs 10^14 writes).
    pub tick: u64,
    /// The last use was a read (so the item was fetched since it was written).
    pub read: bool,
}

impl Default for Access {
    fn default() -> Self {
        Access::new()
    }
}

/// A seeded 64-bit hash of a key for the in-memory tables (this one, and `hits`' use table):
/// multiply-fold mixing of each 8-byte word into the state (the 128-bit product's two halves
/// xored), as fast hashes for short keys do. A table's bucket comes from the low bits and its
/// fingerprint from the high ones: both depend on every byte.
pub(crate) fn key_hash(seed: u64, key: &[u8]) -> u64 {
    fn fold(a: u64, b: u64) -> u64 {
        let r = u128::from(a) * u128::from(b);
        (r as u64) ^ ((r >> 64) as u64)
    }
    const P0: u64 = 0xa076_1d64_78bd_642f;
    const P1: u64 = 0xe703_7ed1_a0b4_28db;
    const P2: u64 = 0x8ebc_6af0_9c88_c6e3;
    let mut h = seed ^ fold(key.len() as u64 ^ P0, P1);
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = fold(h ^ u64::from_le_bytes(b), P1);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut b = [0u8; 8];
        b[..rest.len()].copy_from_slice(rest);
        h = fold(h ^ u64::from_le_bytes(b), P1);
    }
    fold(h ^ P2, h ^ P0)
}

impl Access {
    pub fn new() -> Access {
        // A per-process seed: which keys share a slot is not something a client can aim at.
        // (Fixed in unit tests, whose bounds on a sampled LRU's mistakes then always hold or
        // always fail.)
        let seed = if cfg!(test) {
            0x243f_6a88_85a3_08d3
        } else {
            getrandom::u64().unwrap_or(0x243f_6a88_85a3_08d3)
        };
        Access {
            buckets: (0..BUCKETS)
                .map(|_| Bucket(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            seed,
            tick: AtomicU64::new(0),
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        key_hash(self.seed, key)
    }

    fn bucket(&self, h: u64) -> &Bucket {
        &self.buckets[(h as usize) & (BUCKETS - 1)]
    }

    /// The fingerprint field of a slot word (16 bits): never 0, so an empty slot matches no
    /// key.
    fn fingerprint(h: u64) -> u64 {
        (h >> FP_SHIFT).max(1)
    }

    fn note(&self, key: &[u8], read: bool, tick: u64) {
        let h = self.hash(key);
        let fp = Access::fingerprint(h);
        let word = (fp << FP_SHIFT) | if read { READ_BIT } else { 0 } | (tick & TICK_MASK);
        let bucket = &self.bucket(h).0;
        let mut victim = 0;
        let mut oldest = u64::MAX;
        for (i, slot) in bucket.iter().enumerate() {
            let w = slot.load(Ordering::Relaxed);
            if w >> FP_SHIFT == fp {
                // Read-mostly keys keep their word between writes: no store, no cache line
                // taken. A reader's clock may lag a write's: time never goes back.
                if w != word && (!read || w & TICK_MASK <= tick & TICK_MASK) {
                    slot.store(word, Ordering::Relaxed);
                }
                return;
            }
            let t = if w == 0 { 0 } else { (w & TICK_MASK) + 1 };
            if t < oldest {
                oldest = t;
                victim = i;
            }
        }
        // Two threads may pick the same victim: one of the two uses is lost, nothing worse.
        bucket[victim].store(word, Ordering::Relaxed);
    }

    /// A reader found `key` (workers, on every hit in cache mode).
    #[inline]
    pub fn note_read(&self, key: &[u8]) {
        self.note(key, true, self.tick.load(Ordering::Relaxed));
    }

    /// The writer stored `key` at `tick`.
    pub fn note_write(&self, key: &[u8], tick: u64) {
        self.note(key, false, tick);
    }

    /// Starts bringing `key`'s bucket into the CPU's cache (for a `lookup` soon after).
    #[inline]
    pub fn prefetch(&self, key: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self.bucket(self.hash(key)) as *const Bucket as *const i8;
            // Safety: a prefetch is only a hint; the address is that of a live bucket.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = key;
    }

    /// The last use of `key`, if its bucket still holds it.
    pub fn lookup(&self, key: &[u8]) -> Option<Use> {
        let h = self.hash(key);
        let fp = Access::fingerprint(h);
        self.bucket(h).0.iter().find_map(|slot| {
            let w = slot.load(Ordering::Relaxed);
            (w >> FP_SHIFT == fp).then_some(Use {
                tick: w & TICK_MASK,
                read: w & READ_BIT != 0,
            })
        })
    }

    /// The writer publishes its CAS counter (after each batch).
    pub fn set_tick(&self, tick: u64) {
        self.tick.store(tick, Ordering::Relaxed);
    }
}

/// What `stats` and INFO report of cache mode; shared by the writer and the workers.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Live items evicted to stay under the cap (memcached `evictions`, Redis `evicted_keys`).
    pub evictions: AtomicU64,
    /// Evicted items not read since they were last written (memcached `evicted_unfetched`).
    pub evicted_unfetched: AtomicU64,
    /// Expired items removed early to make room (beside the sweeper's own).
    pub expired_reclaimed: AtomicU64,
    /// Expired items the writer's sweeper removed (cache mode or not).
    pub expired_swept: AtomicU64,
    /// The pages the data occupies, in bytes, as of the writer's last batch (cache mode only).
    pub data_bytes: AtomicU64,
    /// fdatasyncs of the log that acknowledged client writes (`always`), and the writes they
    /// acknowledged: their ratio is group commit's batch size (`stats` `log_fsyncs`,
    /// `log_fsync_writes`).
    pub log_fsyncs: AtomicU64,
    pub log_fsync_writes: AtomicU64,
    /// Bytes appended to the log (`stats` `log_bytes`): with the values written, the write
    /// amplification (a large value's APPEND or SETBIT logs only what changed).
    pub log_bytes: AtomicU64,
}

/// `CacheStats` as read at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheFigures {
    pub evictions: u64,
    pub evicted_unfetched: u64,
    pub data_bytes: u64,
    /// Expired items removed by the sweeper or an eviction pass (Redis `expired_keys`).
    pub expired: u64,
    pub log_fsyncs: u64,
    pub log_fsync_writes: u64,
    pub log_bytes: u64,
}

impl CacheStats {
    /// The figures, to be read before the reader's snapshot is taken: the writer publishes
    /// an eviction pass's deletions before it counts them (with release ordering), so figures
    /// read first never count an eviction the snapshot still shows the item of.
    pub fn figures(&self) -> CacheFigures {
        CacheFigures {
            evictions: self.evictions.load(Ordering::Acquire),
            evicted_unfetched: self.evicted_unfetched.load(Ordering::Acquire),
            data_bytes: self.data_bytes.load(Ordering::Acquire),
            expired: self.expired_swept.load(Ordering::Acquire)
                + self.expired_reclaimed.load(Ordering::Acquire),
            log_fsyncs: self.log_fsyncs.load(Ordering::Relaxed),
            log_fsync_writes: self.log_fsync_writes.load(Ordering::Relaxed),
            log_bytes: self.log_bytes.load(Ordering::Relaxed),
        }
    }

    /// `stats reset`: the counters (the gauge stays).
    pub fn reset(&self) {
        self.evictions.store(0, Ordering::Relaxed);
        self.evicted_unfetched.store(0, Ordering::Relaxed);
        self.expired_reclaimed.store(0, Ordering::Relaxed);
        self.expired_swept.store(0, Ordering::Relaxed);
        self.log_fsyncs.store(0, Ordering::Relaxed);
        self.log_fsync_writes.store(0, Ordering::Relaxed);
        self.log_bytes.store(0, Ordering::Relaxed);
    }
}

/// Keys sampled per run (two runs per refill: one from the hand, one from a random place),
/// the longest the hand's run grows to while it finds nothing older than the pool holds
/// (keys only are read: an overflow value's pages are not touched), the pool of the oldest
/// candidates seen, and how many of them go per refill: about 8 keys sampled per eviction,
/// which with the pool carried from one refill to the next keeps close to LRU order at a
/// cost a writer doing hundreds of thousands of small writes a second can pay.
const RUN: usize = 8;
const HAND_RUN_MAX: usize = 64;
const VICTIMS_PER_REFILL: usize = 2;
/// Candidates whose records' first pages are asked for ahead of their eviction (`warm`).
const WARM_AHEAD: usize = 16;
/// Bytes after the common prefix a random key is drawn for.
const RANDOM_KEY_BYTES: usize = 16;
const POOL: usize = 64;
/// Waypoints the hand leaves behind for random runs (bounded: at most this many keys).
const WAYPOINTS: usize = 256;
/// Elements of deleted collections, and expiry-index entries, taken per step.
const GC_STEP: usize = 256;
const EXPIRED_STEP: usize = 64;

type Key = Box<[u8]>;

/// What a run saw: how many keys, how many went into the pool's older half, the last key.
type RunResult = (usize, usize, Option<Key>);

/// A sampled item and its last known use (0 for an expired one: it goes first).
struct Candidate {
    key: Box<[u8]>,
    score: u64,
    /// Its record's first page was asked for (`Evictor::warm`).
    warmed: bool,
}

/// One item the evictor removed.
#[derive(Debug)]
pub struct Victim {
    pub key: Box<[u8]>,
    /// It had expired (removed, not counted as an eviction).
    pub expired: bool,
    /// Not read since it was last written, as far as `Access` knows.
    pub unfetched: bool,
}

/// What an eviction pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EvictPass {
    pub evicted: u64,
    pub unfetched: u64,
    pub expired: u64,
    /// Elements of deleted collections reclaimed.
    pub reclaimed: u64,
    /// The data's pages when the pass ended.
    pub pages: u64,
    /// Nothing more to do: under the low-water mark, or nothing left that could go.
    pub done: bool,
}

/// Chooses and removes victims (the writer's; see the module documentation).
pub struct Evictor {
    pool: Vec<Candidate>,
    /// The hand walks on after this key (None: from the first).
    hand: Option<Box<[u8]>>,
    /// Keys the hand's next run takes.
    hand_run: usize,
    /// Times the hand has been round the keyspace.
    laps: u64,
    /// Evictions left before the next refill.
    credit: usize,
    random_runs: u64,
    /// The first and last keys, as last looked up, and draws since.
    bounds: Option<(Key, Key)>,
    bounds_age: u32,
    waypoints: Vec<Box<[u8]>>,
    next_waypoint: usize,
    walked: u64,
    rng: u64,
    /// Largest key + value LMDB keeps in a leaf page (larger values go to overflow pages,
    /// whose header the evictor does not read: that would fault in a cold page per candidate).
    inline_max: usize,
    /// The OS's memory page size, for `resident`.
    os_page: usize,
}

impl Evictor {
    pub fn new(page_size: usize) -> Evictor {
        // LMDB's node limit (`me_nodemax`: half a page less its header, less an index entry),
        // less a node's own 8-byte header.
        let inline_max = (((page_size.saturating_sub(16)) / 2) & !1).saturating_sub(2 + 8);
        Evictor {
            pool: Vec::with_capacity(POOL + 1),
            hand: None,
            hand_run: RUN,
            laps: 0,
            credit: 0,
            random_runs: 0,
            bounds: None,
            bounds_age: 0,
            waypoints: Vec::new(),
            next_waypoint: 0,
            walked: 0,
            rng: if cfg!(test) {
                0x9e37_79b9_7f4a_7c15
            } else {
                getrandom::u64().unwrap_or(0x9e37_79b9_7f4a_7c15) | 1
            },
            inline_max,
            // Safety: sysconf has no preconditions.
            os_page: usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
                .ok()
                .filter(|p| p.is_power_of_two())
                .unwrap_or(4096),
        }
    }

    fn random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// The last known use of an item (0 when nothing is known), and whether it has expired.
    fn score(
        &self,
        known: Option<Use>,
        key: &[u8],
        record: &[u8],
        now_ms: u64,
    ) -> Result<(u64, bool), StoreError> {
        let mut score = 0;
        let mut expired = false;
        // A value in its leaf page has its header at hand. An overflow value's header is read
        // only when the access table does not know the key and the page holding it is in
        // memory: reading it otherwise would wait on the disk for every candidate. One not
        // in memory has not been used for a while, as the kernel sees it: it scores 0.
        let inline = key.len() + record.len() <= self.inline_max;
        if inline || (known.is_none() && self.resident(record)) {
            let it = item::decode(record)?;
            score = it.meta.cas & TICK_MASK;
            expired = it.meta.is_expired(now_ms);
        }
        if let Some(u) = known {
            score = score.max(u.tick);
        }
        Ok((if expired { 0 } else { score }, expired))
    }

    /// Asks the kernel to read in the first page of the next `WARM_AHEAD` candidates' records
    /// (`MADV_WILLNEED`): deleting an item reads its header (its expiry, whether it is a
    /// collection), and a victim's overflow pages are seldom in memory, so each eviction used to
    /// wait for one read from the disk, on the writer thread, one after the other (perf, 20 KiB
    /// values past `--max-disk` under a 512 MiB memory cgroup: 20% of the server's samples in
    /// that fault). Asked a few evictions ahead, the reads overlap.
    fn warm(&mut self, store: &LmdbStore, txn: &RoTxn<'_, WithoutTls>) -> Result<(), StoreError> {
        for i in 0..self.pool.len().min(WARM_AHEAD) {
            if self.pool[i].warmed {
                continue;
            }
            self.pool[i].warmed = true;
            if let Some(record) = store.items().get(txn, &self.pool[i].key)?
                && self.pool[i].key.len() + record.len() > self.inline_max
            {
                super::resident::will_need(record.as_ptr() as usize, self.os_page);
            }
        }
        Ok(())
    }

    /// Whether the memory page holding the start of `bytes` is resident (a page of LMDB's
    /// map, or of the transaction's own dirty pages).
    fn resident(&self, bytes: &[u8]) -> bool {
        super::resident::resident(bytes.as_ptr() as usize, 1, self.os_page) == Some(true)
    }

    /// Puts a candidate in the pool if it is among the oldest; true if it went into the older
    /// half (a candidate that only fills a gap at the young end does not count).
    fn offer(&mut self, key: &[u8], score: u64) -> bool {
        if self.pool.len() >= POOL && self.pool.last().is_some_and(|c| c.score <= score) {
            return false;
        }
        if let Some(i) = self.pool.iter().position(|c| &*c.key == key) {
            self.pool.remove(i);
        }
        let at = self.pool.partition_point(|c| c.score <= score);
        self.pool.insert(
            at,
            Candidate {
                key: key.into(),
                score,
                warmed: false,
            },
        );
        self.pool.truncate(POOL);
        at < POOL / 2
    }

    /// Offers up to `n` keys from `from` on to the pool; returns how many there were, how many
    /// went in, and the last one. The hand's runs also leave waypoints, about `WAYPOINTS` over
    /// the keyspace.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        store: &LmdbStore,
        txn: &RoTxn<'_, WithoutTls>,
        access: &Access,
        from: Bound<&[u8]>,
        n: usize,
        now_ms: u64,
        hand: bool,
    ) -> Result<RunResult, StoreError> {
        let stride = (store.len(txn)? / WAYPOINTS as u64).max(1);
        let mut seen = 0;
        let mut taken = 0;
        let mut last = None;
        // The keys first, their access-table buckets fetched into the cache meanwhile: the
        // table is larger than the CPU's caches, so each lookup is a miss, and this way the
        // misses overlap instead of following one another.
        let mut batch: Vec<(&[u8], &[u8])> = Vec::with_capacity(n.min(HAND_RUN_MAX));
        for r in store.items().range(txn, &(from, Bound::Unbounded))?.take(n) {
            let (k, v) = r?;
            access.prefetch(k);
            batch.push((k, v));
        }
        for (k, v) in batch {
            let (score, _) = self.score(access.lookup(k), k, v, now_ms)?;
            taken += usize::from(self.offer(k, score));
            seen += 1;
            if hand {
                self.walked += 1;
                if self.walked.is_multiple_of(stride) {
                    let wp: Box<[u8]> = k.into();
                    if self.waypoints.len() < WAYPOINTS {
                        self.waypoints.push(wp);
                    } else {
                        self.waypoints[self.next_waypoint % WAYPOINTS] = wp;
                    }
                    self.next_waypoint += 1;
                }
            }
            last = Some(k);
        }
        Ok((seen, taken, last.map(Box::from)))
    }

    /// A random key between the first and the last: after their common prefix, each of the
    /// next `RANDOM_KEY_BYTES` bytes is drawn between the least and the greatest byte the
    /// first, the last and the waypoints have at that position (keys are mostly spelt from
    /// a small alphabet: digits, hex, letters, so this spreads the seeks over the keys that
    /// exist, not over byte values none of them use).
    fn random_key(
        &mut self,
        store: &LmdbStore,
        txn: &RoTxn<'_, WithoutTls>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        // The first and last keys change seldom: looked up again every 64 draws.
        self.bounds_age += 1;
        if self.bounds.is_none() || self.bounds_age >= 64 {
            self.bounds_age = 0;
            self.bounds = match (store.items().first(txn)?, store.items().last(txn)?) {
                (Some((f, _)), Some((l, _))) => Some((f.into(), l.into())),
                _ => None,
            };
        }
        let Some((first, last)) = self.bounds.take() else {
            return Ok(None);
        };
        let key = self.draw(&first, &last);
        self.bounds = Some((first, last));
        Ok(Some(key))
    }

    fn draw(&mut self, first: &[u8], last: &[u8]) -> Vec<u8> {
        let p = first
            .iter()
            .zip(last.iter())
            .take_while(|(a, b)| a == b)
            .count();
        let mut lo = [u8::MAX; RANDOM_KEY_BYTES];
        let mut hi = [0u8; RANDOM_KEY_BYTES];
        let mut width = 0;
        for k in [first, last]
            .into_iter()
            .chain(self.waypoints.iter().map(|w| &w[..]))
        {
            for (i, &b) in k.iter().skip(p).take(RANDOM_KEY_BYTES).enumerate() {
                lo[i] = lo[i].min(b);
                hi[i] = hi[i].max(b);
                width = width.max(i + 1);
            }
        }
        let mut key = first[..p].to_vec();
        for i in 0..width {
            let span = u64::from(hi[i].saturating_sub(lo[i])) + 1;
            key.push(lo[i] + (self.random() % span) as u8);
        }
        key
    }

    /// One run from the hand, and one from a random place: a waypoint or a random key.
    fn refill(
        &mut self,
        store: &LmdbStore,
        txn: &RoTxn<'_, WithoutTls>,
        access: &Access,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let hand = self.hand.take();
        let from = hand.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let n = self.hand_run;
        let (seen, taken, last) = self.run(store, txn, access, from, n, now_ms, true)?;
        // Past the last key the hand starts over from the first.
        self.hand = if seen < n {
            self.laps += 1;
            None
        } else {
            last
        };
        // Through a stretch of keys all newer than the pool's (recently written ids, say) the
        // hand speeds up, so the pool is not left to the random runs alone.
        self.hand_run = if taken == 0 {
            (n * 2).min(HAND_RUN_MAX)
        } else {
            RUN
        };
        // A run from a random place: a random key, or (every other time, once the hand has
        // been round: before that they cover only what it has walked) a waypoint. A pool
        // that is short (the first evictions, or after a burst) gets more first: evicting the
        // best of a few samples is close to random.
        // The very first refill looks at more places: what it takes decides the first
        // victims, before the pool has seen much of the keyspace.
        let (least, most) = if self.random_runs == 0 {
            (8, 8)
        } else {
            (1, 4)
        };
        for round in 0..most {
            if round >= least && self.pool.len() >= POOL {
                break;
            }
            self.random_runs += 1;
            let start = if self.laps > 0 && self.random_runs % 2 == 1 {
                let i = (self.random() % self.waypoints.len().max(1) as u64) as usize;
                self.waypoints.get(i).map(|w| w.to_vec())
            } else {
                self.random_key(store, txn)?
            };
            if let Some(k) = start {
                self.run(store, txn, access, Bound::Included(&k), RUN, now_ms, false)?;
            }
        }
        Ok(())
    }

    /// Removes the oldest item the samples found; None when the store holds no item.
    pub fn evict_one(
        &mut self,
        store: &LmdbStore,
        txn: &mut LogTxn<'_>,
        access: &Access,
        now_ms: u64,
    ) -> Result<Option<Victim>, StoreError> {
        // Bounded: each round takes one candidate out of the pool, most of them valid.
        for _ in 0..4 * POOL {
            if self.credit == 0 || self.pool.is_empty() {
                self.refill(store, txn, access, now_ms)?;
                self.credit = VICTIMS_PER_REFILL;
            }
            if self.pool.is_empty() {
                return Ok(None);
            }
            self.credit -= 1;
            let c = self.pool.remove(0);
            self.warm(store, txn)?;
            // The pool may be stale: the key deleted, or used since it was sampled.
            let Some(record) = store.items().get(txn, &c.key)? else {
                continue;
            };
            let known = access.lookup(&c.key);
            let (score, expired) = self.score(known, &c.key, record, now_ms)?;
            if score > c.score && self.pool.first().is_some_and(|p| p.score < score) {
                self.offer(&c.key, score);
                continue;
            }
            let unfetched = !known.is_some_and(|u| u.read);
            let mut cas = 0;
            store.writer(txn, &mut cas).delete(&c.key)?;
            return Ok(Some(Victim {
                key: c.key,
                expired,
                unfetched,
            }));
        }
        Ok(None)
    }
}

/// The writer's cache-mode state.
pub struct Cache {
    /// The cap, and the low-water mark a pass evicts down to, in pages.
    pub cap_pages: u64,
    pub low_pages: u64,
    pub page_size: u64,
    pub access: Arc<Access>,
    pub stats: Arc<CacheStats>,
    evictor: Evictor,
}

impl Cache {
    pub fn new(
        max_disk: u64,
        page_size: u64,
        access: Arc<Access>,
        stats: Arc<CacheStats>,
    ) -> Cache {
        let page_size = page_size.max(512);
        let cap_pages = (max_disk / page_size).max(1);
        // Evicting to a little below the cap lets leaders commit a while before the next pass
        // (each pass takes the writes to the writer thread).
        let slack = (cap_pages / 32).clamp(1, (4 << 20) / page_size);
        Cache {
            cap_pages,
            low_pages: cap_pages.saturating_sub(slack),
            page_size,
            access,
            stats,
            evictor: Evictor::new(page_size as usize),
        }
    }

    /// Evicts until the data is under the low-water mark, at most `budget` steps (an item, a
    /// chunk of reclaimed elements or of expired items each). `on_evict` hears of every key
    /// removed (expired or evicted), for WATCH.
    pub fn evict(
        &mut self,
        store: &LmdbStore,
        txn: &mut LogTxn<'_>,
        now_ms: u64,
        budget: usize,
        on_evict: &mut dyn FnMut(&[u8]),
    ) -> Result<EvictPass, StoreError> {
        let mut pass = EvictPass::default();
        let mut pages = store.data_pages(txn)?;
        let mut steps = 0;
        let mut stuck = false;
        while pages > self.low_pages && steps < budget {
            steps += 1;
            if store.gc_pending(txn)? {
                pass.reclaimed += store.collect_garbage(txn, GC_STEP)? as u64;
            } else if store.expired_due(txn, now_ms)? {
                pass.expired += store.sweep_expired(txn, now_ms, EXPIRED_STEP)? as u64;
            } else {
                match self.evictor.evict_one(store, txn, &self.access, now_ms)? {
                    None => {
                        stuck = true;
                        break;
                    }
                    Some(v) => {
                        on_evict(&v.key);
                        if v.expired {
                            pass.expired += 1;
                        } else {
                            pass.evicted += 1;
                            pass.unfetched += u64::from(v.unfetched);
                        }
                    }
                }
            }
            pages = store.data_pages(txn)?;
        }
        pass.pages = pages;
        pass.done = stuck || pages <= self.low_pages;
        Ok(pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{ItemMeta, Kind};

    #[test]
    fn access_remembers_reads_and_writes_by_key() {
        let a = Access::new();
        assert_eq!(a.lookup(b"k"), None);
        a.note_write(b"k", 7);
        assert_eq!(
            a.lookup(b"k"),
            Some(Use {
                tick: 7,
                read: false
            })
        );
        a.set_tick(9);
        a.note_read(b"k");
        assert_eq!(
            a.lookup(b"k"),
            Some(Use {
                tick: 9,
                read: true
            })
        );
        a.note_write(b"k", 10);
        assert_eq!(
            a.lookup(b"k"),
            Some(Use {
                tick: 10,
                read: false
            })
        );
        // A reader's older clock does not move it back.
        a.set_tick(8);
        a.note_read(b"k");
        assert_eq!(
            a.lookup(b"k"),
            Some(Use {
                tick: 10,
                read: false
            })
        );
        // Other keys are not confused with it (a fingerprint mismatch reads as unknown).
        let unknown = (0..1000u32)
            .filter(|i| a.lookup(format!("other{i}").as_bytes()).is_none())
            .count();
        assert!(unknown >= 999, "{unknown}");
        // Thousands of keys are all remembered (a bucket keeps 8).
        for i in 0..1000u32 {
            a.note_write(format!("many{i}").as_bytes(), 100 + u64::from(i));
        }
        for i in 0..1000u32 {
            assert_eq!(
                a.lookup(format!("many{i}").as_bytes()).map(|u| u.tick),
                Some(100 + u64::from(i))
            );
        }
    }

    #[test]
    fn access_is_a_fixed_table() {
        let a = Access::new();
        for i in 0..(3 * ACCESS_SLOTS as u64) {
            a.note_write(&i.to_le_bytes(), i);
        }
        assert_eq!(a.buckets.len() * BUCKET_SLOTS, ACCESS_SLOTS);
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        // The latest writes are all still known; the oldest forgotten.
        let last = (3 * ACCESS_SLOTS as u64 - 10_000..3 * ACCESS_SLOTS as u64)
            .filter(|i| a.lookup(&i.to_le_bytes()).is_some())
            .count();
        let first = (0..10_000u64)
            .filter(|i| a.lookup(&i.to_le_bytes()).is_some())
            .count();
        // (A forgotten key reads as known only when its 16-bit fingerprint meets another
        // key's in its bucket: about 1 in 8,000.)
        assert!(last == 10_000 && first < 30, "last {last} first {first}");
    }

    fn open(dir: &std::path::Path) -> (LmdbStore, Arc<Access>) {
        let (mut store, _) = LmdbStore::open(dir, 256 << 20, 16).expect("open");
        let access = Arc::new(Access::new());
        store.set_access(Some(access.clone()));
        (store, access)
    }

    /// Stores `keys` with `value`, each with its own CAS unique (in order), expiring at
    /// `expire_at` (0: never).
    fn put(store: &LmdbStore, cas: &mut u64, keys: &[String], value: &[u8], expire_at: u64) {
        let mut txn = store.write_txn().expect("txn");
        for k in keys {
            let mut w = store.writer(&mut txn, cas);
            let c = w.next_cas();
            w.put(
                k.as_bytes(),
                &ItemMeta::new(Kind::String, 0, expire_at, c),
                &[value],
            )
            .expect("put");
        }
        txn.commit_unlogged().expect("commit");
        store.access().expect("access").set_tick(*cas);
    }

    fn names(prefix: &str, n: usize) -> Vec<String> {
        // Interleaved in key order with the other groups: k0000a, k0000b, ...
        (0..n).map(|i| format!("k{i:04}{prefix}")).collect()
    }

    fn present(store: &LmdbStore, keys: &[String]) -> usize {
        let txn = store.read_txn().expect("txn");
        keys.iter()
            .filter(|k| store.get(&txn, k.as_bytes()).expect("get").is_some())
            .count()
    }

    fn evict_to(store: &LmdbStore, cache: &mut Cache) -> EvictPass {
        let mut txn = store.write_txn().expect("txn");
        let mut total = EvictPass::default();
        loop {
            let p = cache
                .evict(store, &mut txn, 1_000, 100_000, &mut |_| {})
                .expect("evict");
            total.evicted += p.evicted;
            total.unfetched += p.unfetched;
            total.expired += p.expired;
            total.reclaimed += p.reclaimed;
            total.pages = p.pages;
            if p.done {
                break;
            }
        }
        txn.commit_unlogged().expect("commit");
        total
    }

    fn pages(store: &LmdbStore) -> u64 {
        store
            .data_pages(&store.read_txn().expect("txn"))
            .expect("pages")
    }

    /// Values this long live in overflow pages, each freeing its own pages when evicted (small
    /// values share leaf pages, which free only once emptied); and the evictor then knows
    /// their uses from `Access` alone.
    const BIG: usize = 3000;

    fn read_all(store: &LmdbStore, keys: &[String]) {
        let snap = crate::storage::overlay::Snap::open(store).expect("snap");
        for k in keys {
            assert!(snap.get(k.as_bytes()).expect("get").is_some());
        }
    }

    fn cache_at(store: &LmdbStore, fraction: f64) -> Cache {
        let ps = store.env().stat().page_size as u64;
        let cap = (pages(store) as f64 * fraction) as u64 * ps;
        Cache::new(
            cap,
            ps,
            store.access().expect("access").clone(),
            Arc::default(),
        )
    }

    #[test]
    fn evicts_expired_first_then_unread_before_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = open(dir.path());
        let mut cas = 0;
        let value = vec![7u8; BIG];
        let (expired, cold, hot, new) = (
            names("a", 300),
            names("b", 300),
            names("c", 300),
            names("d", 300),
        );
        put(&store, &mut cas, &expired, &value, 500);
        put(&store, &mut cas, &cold, &value, 0);
        put(&store, &mut cas, &hot, &value, 0);
        // The hot ones are read after all of those were written, the new ones written after.
        read_all(&store, &hot);
        put(&store, &mut cas, &new, &value, 0);
        // Room for 70%: the expired quarter and some of the cold one must go.
        let mut cache = cache_at(&store, 0.7);
        let p = evict_to(&store, &mut cache);
        assert!(p.pages <= cache.low_pages, "{p:?}");
        assert_eq!(present(&store, &expired), 0, "{p:?}");
        assert_eq!(p.expired, 300, "{p:?}");
        assert!(p.evicted > 30 && p.evicted < 300, "{p:?}");
        assert_eq!(p.unfetched, p.evicted, "only unread items go: {p:?}");
        assert_eq!(present(&store, &hot), 300, "a read item was evicted: {p:?}");
        assert_eq!(
            present(&store, &new),
            300,
            "a newer item was evicted: {p:?}"
        );
        assert_eq!(present(&store, &cold), 300 - p.evicted as usize);
    }

    #[test]
    fn without_known_uses_the_oldest_writes_go_first() {
        // After a restart nothing is known of reads: small items (header in the leaf page)
        // go by their CAS unique, the order they were written in, wherever they are in the
        // keyspace (here the oldest are last).
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = open(dir.path());
        let mut cas = 0;
        let value = vec![1u8; 200];
        let old: Vec<String> = (0..3000).map(|i| format!("z{i:05}")).collect();
        let new: Vec<String> = (0..3000).map(|i| format!("a{i:05}")).collect();
        put(&store, &mut cas, &old, &value, 0);
        put(&store, &mut cas, &new, &value, 0);
        let fresh = Arc::new(Access::new());
        let ps = store.env().stat().page_size as u64;
        let mut cache = Cache::new(pages(&store) * ps * 2 / 3, ps, fresh, Arc::default());
        let p = evict_to(&store, &mut cache);
        assert!(p.evicted > 500, "{p:?}");
        let lost_new = new.len() - present(&store, &new);
        assert!(
            lost_new * 20 <= p.evicted as usize,
            "{p:?}: {lost_new} of the newer items evicted"
        );
    }

    #[test]
    fn keys_in_age_order_are_sampled_across_the_keyspace() {
        // Ids whose key order is the reverse of their age: the hand meets the newest first.
        // The unread half of the old ones must go before the newer and the read ones. A
        // sampled LRU takes a few out of order (at most 10% here); the hand alone, without
        // the random runs, gets all of them wrong.
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = open(dir.path());
        let mut cas = 0;
        let value = vec![1u8; BIG];
        let all: Vec<String> = (0..2000)
            .map(|i| format!("id:{:06}", 999_999 - i))
            .collect();
        let (old, new) = all.split_at(1000);
        put(&store, &mut cas, old, &value, 0);
        let read: Vec<String> = old.iter().step_by(2).cloned().collect();
        read_all(&store, &read);
        put(&store, &mut cas, new, &value, 0);
        let mut cache = cache_at(&store, 0.92);
        let p = evict_to(&store, &mut cache);
        assert!(p.evicted > 100 && p.evicted < 300, "{p:?}");
        let lost_read = read.len() - present(&store, &read);
        let lost_new = new.len() - present(&store, new);
        assert!(
            (lost_read + lost_new) * 10 <= p.evicted as usize,
            "{p:?}: {lost_read} read and {lost_new} newer items evicted"
        );
    }

    #[test]
    fn an_empty_store_over_a_tiny_cap_is_done_not_spinning() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = open(dir.path());
        let ps = store.env().stat().page_size as u64;
        let mut cache = Cache::new(ps, ps, store.access().expect("a").clone(), Arc::default());
        let mut txn = store.write_txn().expect("txn");
        let p = cache
            .evict(&store, &mut txn, 0, 1000, &mut |_| {})
            .expect("evict");
        assert!(p.done && p.evicted == 0, "{p:?}");
    }
}
