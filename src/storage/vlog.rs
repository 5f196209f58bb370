//! Value separation: large string values live only in the write-ahead log, and `items` holds
//! a pointer to them (`docs/value-separation.md`).
//!
//! Why: every large value was written twice, once in its log batch (sequential, what makes it
//! durable) and once into LMDB's overflow pages (copied at the put, written at the LMDB commit,
//! written back and synced by the checkpoint). With `value_log_min` set, a string value of at
//! least that many bytes is written only once: the writer puts it at the place its batch will
//! have in the current segment, and `items` gets the item's header and a `Pointer`.
//!
//! Invariants:
//! - a pointer's bytes are in its segment file before the pointer is in any transaction: the
//!   writer writes the value at its future place in the segment while it applies the batch
//!   (`Sink::write`), then appends the batch: a `pwrite` of all of it (`always`: the same
//!   bytes over the value), or a copy into the segment's mapping that skips the values already
//!   there (`LogBuf::note_written`; `never`, `periodic`). A batch that is then not appended
//!   leaves only bytes past the log's end, which recovery never reads as a batch (no header
//!   under the segment's salt), and its pointers go with its transaction;
//! - a segment that may hold a value some pointer names is never retired (renamed to a spare
//!   and rewritten, or deleted): `ValueLog::holds` lists them, and the checkpointer keeps them.
//!   Collection (`Collector`, run by the checkpointer) frees them: a scan of a checkpoint's
//!   snapshot finds the ended segments no pointer names any more (dead from that snapshot on:
//!   only the segment being written gets new pointers), and those are retired once no reader
//!   with an older snapshot is left (`Reader`s are noted in `readers`); segments mostly dead
//!   have their live values written again at the log's end (`Move`, by the writer), which
//!   makes them dead for a later scan;
//! - a checkpoint's snapshot names only segments that are on disk: the checkpointer
//!   fdatasyncs every segment in `holds` before it writes its record (`sync_held`);
//! - recovery and the rebuild of an aborted transaction replay values inline (they are whole
//!   in the log records): correct, and only a cost of space until the value is written again;
//! - pointers carry the store's value-log id (`meta` `vlog`, random, made when separation is
//!   first turned on), so that `item::decode`, which knows no store, finds the segments of
//!   the right store in this process (`resolve`; tests open many stores in one process).
//!
//! Reads: a pointer resolves to a slice of a read-only shared mapping of its segment, kept until
//! the segment is retired (no reader that could still use a slice is left by then: a slice is
//! used only while the read transaction that found its pointer is open). An event loop asks
//! `cold` first (`mincore`, as `resident.rs` does for `data.mdb`) and hands a value not in
//! memory to its ring or a reader thread (`read_value`).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use heed::types::Bytes;
use heed::{Database, RoTxn};

use super::StoreError;

/// Bytes of a pointer after the item's header: value-log id, segment, offset, length, CRC-32.
pub const POINTER_LEN: usize = 32;

/// Where a separated value lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pointer {
    /// The store's value-log id (`ValueLog::id`).
    pub id: u64,
    pub segment: u64,
    /// The value's first byte in the segment file.
    pub offset: u64,
    pub len: u32,
    /// CRC-32 of the value (`memkeep check` verifies it).
    pub crc: u32,
}

impl Pointer {
    pub fn encode(&self) -> [u8; POINTER_LEN] {
        let mut b = [0u8; POINTER_LEN];
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..16].copy_from_slice(&self.segment.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Pointer> {
        let b: &[u8; POINTER_LEN] = b.try_into().ok()?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        Some(Pointer {
            id: u64_at(0),
            segment: u64_at(8),
            offset: u64_at(16),
            len: u32_at(24),
            crc: u32_at(28),
        })
    }

    fn end(&self) -> u64 {
        self.offset.saturating_add(u64::from(self.len))
    }
}

/// Mappings are made this much at a time past what a pointer needs, so that a segment being
/// appended to is mapped again only every so often (only bytes inside the file are touched).
const MAP_STEP: u64 = 64 << 20;

/// One segment file as readers see it.
struct Seg {
    file: File,
    /// The file opened with `O_DIRECT` (where allowed, and not turned off by
    /// `MEMKEEP_COLD_DIRECT=0`), for a worker's ring to read cold values without passing
    /// them through the page cache (`server/uring.rs` says why).
    direct: std::sync::OnceLock<Option<File>>,
    /// Every mapping made of it, newest last, as (address, length): older ones stay mapped
    /// (slices handed out may still be in use) until the segment is retired.
    maps: Mutex<Vec<(usize, usize)>>,
    /// The newest mapping's address and length, for the lock-free path.
    base: AtomicUsize,
    mapped: AtomicUsize,
    /// Bytes the file was known to hold (a pointer inside them may be touched).
    known: AtomicUsize,
}

// The mapping addresses are plain numbers; the pages are read-only and shared.
unsafe impl Send for Seg {}
unsafe impl Sync for Seg {}

impl Drop for Seg {
    fn drop(&mut self) {
        for (addr, len) in lock(&self.maps).drain(..) {
            // SAFETY: a mapping this segment made; a `Seg` is dropped only when its segment is
            // retired (`ValueLog::retire`), when no reader that could hold a slice of it is
            // left (or when the process ends).
            unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        }
    }
}

/// Reader slots per value log (`Reader`): more readers at once than this are counted, not
/// noted, and hold every retirement back while they last.
const READER_SLOTS: usize = 512;
/// A slot's value while its reader opens its transaction (its snapshot not known yet: it
/// holds back every retirement).
const OPENING: u64 = 1;

/// A store's separated values: its data directory's segments, as readers map them, and the
/// segments that hold values.
pub struct ValueLog {
    id: u64,
    dir: PathBuf,
    segs: RwLock<HashMap<u64, Arc<Seg>>>,
    /// Segments that may hold a value some pointer names (see the module doc).
    holds: Mutex<BTreeSet<u64>>,
    /// Segments in `holds` fdatasynced since their last value was written.
    synced: Mutex<BTreeSet<u64>>,
    page: usize,
    all_cold: bool,
    /// The read transactions open on the store: 0 a free slot, `OPENING`, or the snapshot's
    /// transaction id + 2 (see `ReaderSlot`).
    readers: Box<[AtomicU64]>,
    /// Readers that found no free slot.
    untracked: AtomicUsize,
    /// Live values the collector read, for the writer to write again (`Move`).
    moves: Mutex<VecDeque<Move>>,
    /// Whether the writer moves values (`set_moving`).
    moving: std::sync::atomic::AtomicBool,
    /// The bytes each ended segment holds (its log's end; its file may be longer, made
    /// ahead as a spare): noted when it ends, or for one ended before this process, the end
    /// of its last live value at the first scan (no less than its live bytes).
    ends: Mutex<BTreeMap<u64, u64>>,
    /// Figures for `stats` (see `footprint`).
    live_bytes: AtomicU64,
    moved_bytes: AtomicU64,
    retired: AtomicU64,
}

/// The value logs open in this process, by id.
static REGISTRY: RwLock<Vec<Arc<ValueLog>>> = RwLock::new(Vec::new());

impl ValueLog {
    /// The value log of the store in `dir` with id `id`, registered for `resolve` (an id
    /// already registered keeps its first directory: a backup's copy, opened beside the live
    /// store, must resolve the live store's pointers). `holds` is what the directory holds that
    /// pointers may name (every segment older than the checkpoint's first).
    pub fn register(dir: &Path, id: u64, holds: BTreeSet<u64>) -> Arc<ValueLog> {
        let mut reg = REGISTRY.write().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = reg.iter().find(|v| v.id == id) {
            if v.dir == dir {
                lock(&v.holds).extend(holds);
            }
            return v.clone();
        }
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let v = Arc::new(ValueLog {
            id,
            dir: dir.to_path_buf(),
            segs: RwLock::new(HashMap::new()),
            holds: Mutex::new(holds),
            synced: Mutex::new(BTreeSet::new()),
            page: page.max(1),
            all_cold: std::env::var_os("MEMKEEP_TEST_ALL_COLD").is_some_and(|v| v == "1"),
            readers: (0..READER_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            untracked: AtomicUsize::new(0),
            moves: Mutex::new(VecDeque::new()),
            moving: std::sync::atomic::AtomicBool::new(true),
            ends: Mutex::new(BTreeMap::new()),
            live_bytes: AtomicU64::new(0),
            moved_bytes: AtomicU64::new(0),
            retired: AtomicU64::new(0),
        });
        reg.push(v.clone());
        v
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Notes that segment `n` holds a value (the writer, at each separated put).
    /// (Only the current segment is written to, and `sync_held` syncs only ended ones, so a
    /// segment once synced there gets no later value.)
    pub fn note_held(&self, n: u64) {
        lock(&self.holds).insert(n);
    }

    /// Whether segment `n` must be kept.
    pub fn holds(&self, n: u64) -> bool {
        lock(&self.holds).contains(&n)
    }

    /// The segments kept for their values.
    pub fn held(&self) -> Vec<u64> {
        lock(&self.holds).iter().copied().collect()
    }

    /// What the disk holds for values (`stats` `log_value_*`): the segment being written
    /// counts its whole file.
    pub fn footprint(&self) -> Footprint {
        let held = self.held();
        let ends = lock(&self.ends).clone();
        let bytes = held
            .iter()
            .filter_map(|n| match ends.get(n) {
                Some(e) => Some(*e),
                None => std::fs::metadata(self.dir.join(super::wal::segment_name(*n)))
                    .ok()
                    .map(|m| m.len()),
            })
            .sum();
        Footprint {
            segments: held.len() as u64,
            bytes,
            live_bytes: self.live_bytes.load(Ordering::Relaxed),
            moved_bytes: self.moved_bytes.load(Ordering::Relaxed),
            retired: self.retired.load(Ordering::Relaxed),
        }
    }

    /// Notes a read transaction about to open on the store (`LmdbStore::read_txn`): until the
    /// slot is dropped, no segment a pointer of its snapshot may name is retired.
    pub fn enter(self: &Arc<Self>) -> ReaderSlot {
        thread_local! {
            // A cache line (8 slots) apart per thread: two workers whose slots shared a line
            // would take it from each other at every read transaction.
            static START: usize = {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                NEXT.fetch_add(8, Ordering::Relaxed)
            };
        }
        let n = self.readers.len();
        let start = START.with(|s| *s) % n.max(1);
        for i in 0..n {
            let at = (start + i) % n;
            // SeqCst: the slot is taken before the transaction reads LMDB's meta page, so a
            // collector that saw a newer snapshot committed sees the slot (`oldest_reader`).
            if self.readers[at]
                .compare_exchange(0, OPENING, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                return ReaderSlot {
                    log: self.clone(),
                    at: Some(at),
                };
            }
        }
        self.untracked.fetch_add(1, Ordering::SeqCst);
        ReaderSlot {
            log: self.clone(),
            at: None,
        }
    }

    /// The oldest snapshot (transaction id) a reader has open: `Some(0)` while one is opening
    /// or some are untracked, None with no reader at all.
    pub fn oldest_reader(&self) -> Option<u64> {
        if self.untracked.load(Ordering::SeqCst) > 0 {
            return Some(0);
        }
        self.readers
            .iter()
            .map(|s| s.load(Ordering::SeqCst))
            .filter(|v| *v != 0)
            .map(|v| v.saturating_sub(2))
            .min()
    }

    /// Notes that segment `n` ended holding `used` bytes (the checkpointer, from the writer's
    /// position when it began the checkpoint).
    pub fn note_end(&self, n: u64, used: u64) {
        if self.holds(n) {
            lock(&self.ends).insert(n, used);
        }
    }

    /// Forgets segment `n`, which no pointer names in any snapshot still open: its mappings
    /// and descriptors go; the caller removes the file.
    fn retire(&self, n: u64) {
        lock(&self.holds).remove(&n);
        lock(&self.synced).remove(&n);
        lock(&self.ends).remove(&n);
        let seg = self
            .segs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&n);
        drop(seg);
        self.retired.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the collector left values for the writer to write again.
    pub fn has_moves(&self) -> bool {
        !lock(&self.moves).is_empty()
    }

    /// Whether the writer moves values (not a replica's: its primary's moves come along as
    /// writes); the collector makes no moves while it does not, and those made go.
    pub fn set_moving(&self, on: bool) {
        if self.moving.swap(on, Ordering::Relaxed) && !on {
            lock(&self.moves).clear();
        }
    }

    /// Up to about `bytes` of the values to write again (at least one, if any).
    pub fn take_moves(&self, bytes: usize) -> Vec<Move> {
        let mut q = lock(&self.moves);
        let mut out = Vec::new();
        let mut taken = 0;
        while let Some(m) = q.front() {
            if !out.is_empty() && taken + m.value.len() > bytes {
                break;
            }
            taken += m.value.len();
            out.extend(q.pop_front());
        }
        out
    }

    /// Notes `n` bytes of values written again (the writer, after its batch committed them).
    pub fn note_moved(&self, n: u64) {
        self.moved_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Makes every segment before `before` that holds values durable (the checkpointer, before
    /// it writes a record whose snapshot may point into them).
    pub fn sync_held(&self, before: u64) -> std::io::Result<()> {
        let todo: Vec<u64> = {
            let h = lock(&self.holds);
            let s = lock(&self.synced);
            h.range(..before)
                .filter(|n| !s.contains(n))
                .copied()
                .collect()
        };
        for n in todo {
            let path = self.dir.join(super::wal::segment_name(n));
            match File::open(&path) {
                Ok(f) => f.sync_data()?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            lock(&self.synced).insert(n);
        }
        Ok(())
    }

    fn seg(&self, n: u64) -> Result<Arc<Seg>, StoreError> {
        if let Some(s) = self.segs.read().unwrap_or_else(|p| p.into_inner()).get(&n) {
            return Ok(s.clone());
        }
        let mut segs = self.segs.write().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = segs.get(&n) {
            return Ok(s.clone());
        }
        let path = self.dir.join(super::wal::segment_name(n));
        let file = File::open(&path).map_err(|e| {
            let what = format!(
                "a value's log segment {} cannot be opened: {e}",
                path.display()
            );
            if e.kind() == std::io::ErrorKind::NotFound {
                StoreError::damaged(what)
            } else {
                // Out of descriptors, say: not the store's fault, and tried again next time.
                StoreError::Backend(what)
            }
        })?;
        let s = Arc::new(Seg {
            file,
            direct: std::sync::OnceLock::new(),
            maps: Mutex::new(Vec::new()),
            base: AtomicUsize::new(0),
            mapped: AtomicUsize::new(0),
            known: AtomicUsize::new(0),
        });
        segs.insert(n, s.clone());
        Ok(s)
    }

    /// The value `p` names, borrowed from a mapping that lives as long as the process.
    fn slice(&self, p: &Pointer) -> Result<&'static [u8], StoreError> {
        let seg = self.seg(p.segment)?;
        let end = usize::try_from(p.end()).map_err(|_| bad(p, "past the address space"))?;
        let at = usize::try_from(p.offset).map_err(|_| bad(p, "past the address space"))?;
        if end > seg.known.load(Ordering::Acquire) {
            let len = seg
                .file
                .metadata()
                .map_err(|e| StoreError::Backend(format!("cannot stat a log segment: {e}")))?
                .len();
            if p.end() > len {
                return Err(bad(
                    p,
                    &format!("past the end of its segment ({len} bytes)"),
                ));
            }
            seg.known
                .fetch_max(usize::try_from(len).unwrap_or(usize::MAX), Ordering::AcqRel);
        }
        if end > seg.mapped.load(Ordering::Acquire) {
            let mut maps = lock(&seg.maps);
            if end > seg.mapped.load(Ordering::Acquire) {
                let len = (p.end().div_ceil(MAP_STEP) + 1) * MAP_STEP;
                let len = usize::try_from(len).map_err(|_| bad(p, "past the address space"))?;
                use std::os::fd::AsRawFd;
                // SAFETY: a new read-only shared mapping of a file this process keeps open; only
                // bytes inside the file (checked above against its length) are ever touched.
                let addr = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_READ,
                        libc::MAP_SHARED,
                        seg.file.as_raw_fd(),
                        0,
                    )
                };
                if addr == libc::MAP_FAILED {
                    return Err(StoreError::Backend(format!(
                        "cannot map a log segment: {}",
                        std::io::Error::last_os_error()
                    )));
                }
                // SAFETY: advice only, on the mapping just made. Values are read whole and at
                // random: readahead around them would evict what other reads need.
                unsafe { libc::madvise(addr, len, libc::MADV_RANDOM) };
                maps.push((addr as usize, len));
                seg.base.store(addr as usize, Ordering::Release);
                seg.mapped.store(len, Ordering::Release);
            }
        }
        let base = seg.base.load(Ordering::Acquire);
        // SAFETY: `at..end` lies inside the newest mapping (its length is at least `end`, set
        // after its address), which is never unmapped while the process runs, and inside the
        // file (checked above), so touching it cannot fault past the end of the file.
        Ok(unsafe { std::slice::from_raw_parts((base + at) as *const u8, end - at) })
    }

    /// Reads the value `p` names into `buf` (of `p.len` bytes) with `pread` (reader threads).
    pub fn read_value(&self, p: &Pointer, buf: &mut [u8]) -> std::io::Result<()> {
        let seg = self.seg(p.segment).map_err(std::io::Error::other)?;
        seg.file.read_exact_at(buf, p.offset)
    }
}

/// `ValueLog::footprint`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Footprint {
    /// Segments kept for their values, and the bytes of their files.
    pub segments: u64,
    pub bytes: u64,
    /// Bytes of values some pointer names, at the collector's last scan.
    pub live_bytes: u64,
    /// Bytes of live values the collector had written again.
    pub moved_bytes: u64,
    /// Segments of values retired.
    pub retired: u64,
}

/// A read transaction's slot (`ValueLog::enter`), freed when dropped.
pub struct ReaderSlot {
    log: Arc<ValueLog>,
    at: Option<usize>,
}

impl ReaderSlot {
    /// Notes the snapshot the transaction opened at.
    pub fn opened(&self, txnid: u64) {
        if let Some(at) = self.at {
            self.log.readers[at].store(txnid.saturating_add(2), Ordering::SeqCst);
        }
    }
}

impl Drop for ReaderSlot {
    fn drop(&mut self) {
        match self.at {
            Some(at) => self.log.readers[at].store(0, Ordering::Release),
            None => {
                self.log.untracked.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

/// A live value in a segment being emptied, read by the collector: the writer writes it again
/// at the log's end if `key` still points where `pointer` says (`LmdbStore::relocate`).
pub struct Move {
    pub key: Box<[u8]>,
    pub pointer: Pointer,
    pub value: Box<[u8]>,
}

/// Values read for moving per collector round: what the moves hold in memory at most (they
/// count in the server's anonymous memory, which stays under 64 MiB: bigdata's 20 KiB values
/// under a 1 GiB cap measured 59 MiB of it at the end with 16 MiB here, 33-38 MiB without
/// the value log).
const MOVE_ROUND: usize = 8 << 20;
/// A segment is emptied (its live values moved) when less than this fraction of its bytes
/// is live: the disk then holds at most about twice the live values (and the segment being
/// written), and each byte moved frees at least one.
const MOVE_BELOW: f64 = 0.5;
/// Scans take at most this share of the checkpointer's time: the next waits this many times
/// as long as the last took.
const SCAN_SPACING: u32 = 20;
/// A segment that used fewer bytes than this is small. The log is rotated at every checkpoint,
/// so a trickle of writes (one large value a second) ends a small segment a second, each kept
/// while any of its values lives, and each with a mapping and two descriptors once it is read:
/// without merging, a day of it kept 86,400 files and ran out of descriptors. (Measured: 22
/// segments of one to ten 10 KB values each took 42 descriptors and 22 mappings.)
const SMALL_SEGMENT: u64 = 4 << 20;
/// Past this many small segments, the live values of the smallest are moved to the log's end
/// until half this many are left. The smallest go first, so merged segments grow by tiers and
/// a value is moved a few times at most before it sits in a segment that is not small.
const SMALL_KEEP: usize = 16;

/// Collection of a store's value segments, run by the checkpointer after each checkpoint
/// (see the module doc).
pub struct Collector {
    vlog: Arc<ValueLog>,
    items: Database<Bytes, Bytes>,
    /// Segments no pointer named in the snapshot of the transaction paired with them.
    dead: Vec<(u64, u64)>,
    next_scan: Instant,
}

impl Collector {
    pub fn new(vlog: Arc<ValueLog>, items: Database<Bytes, Bytes>) -> Collector {
        Collector {
            vlog,
            items,
            dead: Vec::new(),
            next_scan: Instant::now(),
        }
    }

    /// Whether segments wait for older readers to go (to be tried again later).
    pub fn waiting(&self) -> bool {
        !self.dead.is_empty()
    }

    /// Retires every dead segment no open reader's snapshot can name; removes their files
    /// (`wal::retire`).
    pub fn retire_ready(&mut self) {
        if self.dead.is_empty() {
            return;
        }
        let oldest = self.vlog.oldest_reader();
        let dir = self.vlog.dir.clone();
        self.dead.retain(|&(n, txnid)| {
            if oldest.is_some_and(|o| o < txnid) {
                return true;
            }
            self.vlog.retire(n);
            let path = dir.join(super::wal::segment_name(n));
            match super::wal::retire(&dir, n, &path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => log::warn!("cannot retire {}: {e}", path.display()),
            }
            false
        });
    }

    /// After a checkpoint of snapshot `txn` whose log starts at segment `first`: retires what
    /// may go, and (when a scan is due) finds the dead segments and the values to move.
    pub fn after_checkpoint(&mut self, txn: &RoTxn, first: u64) {
        self.retire_ready();
        if Instant::now() < self.next_scan {
            return;
        }
        let ended: Vec<u64> = lock(&self.vlog.holds)
            .range(..first)
            .filter(|n| !self.dead.iter().any(|(d, _)| d == *n))
            .copied()
            .collect();
        if ended.is_empty() {
            return;
        }
        let started = Instant::now();
        if let Err(e) = self.scan(txn, &ended) {
            log::warn!(
                "cannot collect the value log in {}: {e}",
                self.vlog.dir.display()
            );
        }
        let took = started.elapsed();
        self.next_scan = Instant::now() + took.saturating_mul(SCAN_SPACING);
    }

    fn scan(&mut self, txn: &RoTxn, ended: &[u64]) -> Result<(), heed::Error> {
        let id = self.vlog.id;
        // Live bytes per segment, as of this snapshot, and where its last live value ends.
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        let mut last: BTreeMap<u64, u64> = BTreeMap::new();
        let mut total = 0u64;
        for r in self.items.iter(txn)? {
            let (_, v) = r?;
            // A pointer record is short: longer records are values, not read (they may be
            // cold, and the scan must not read them in).
            if v.len() > super::item::MAX_HEADER + POINTER_LEN {
                continue;
            }
            if let Some((_, p)) = super::item::pointer_of(v)
                && p.id == id
            {
                *live.entry(p.segment).or_default() += u64::from(p.len);
                let end = last.entry(p.segment).or_default();
                *end = (*end).max(p.end());
                total += u64::from(p.len);
            }
        }
        self.vlog.live_bytes.store(total, Ordering::Relaxed);
        let txnid = txn.id() as u64;
        // Mostly dead segments first (least live first), then small ones (smallest first).
        let mut victims: Vec<(f64, u64)> = Vec::new();
        let mut small: Vec<(u64, u64)> = Vec::new();
        for &n in ended {
            let bytes = live.get(&n).copied().unwrap_or(0);
            if bytes == 0 {
                self.dead.push((n, txnid));
                continue;
            }
            // Its used bytes, not its file's (a spare is made longer than it fills).
            let size = *lock(&self.vlog.ends)
                .entry(n)
                .or_insert_with(|| last.get(&n).copied().unwrap_or(0));
            if size > 0 && (bytes as f64) < MOVE_BELOW * size as f64 {
                victims.push((bytes as f64 / size as f64, n));
            } else if size < SMALL_SEGMENT {
                small.push((size, n));
            }
        }
        victims.extend(merge_small(small).map(|(size, n)| (1.0 + size as f64, n)));
        // The writer has not finished the last round's moves, or moves none: no new ones.
        if victims.is_empty() || self.vlog.has_moves() || !self.vlog.moving.load(Ordering::Relaxed)
        {
            return Ok(());
        }
        victims.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut chosen = BTreeSet::new();
        let mut budget = 0u64;
        for (_, n) in victims {
            let bytes = live.get(&n).copied().unwrap_or(0);
            if !chosen.is_empty() && budget + bytes > MOVE_ROUND as u64 {
                break;
            }
            budget += bytes;
            chosen.insert(n);
        }
        let mut moves = Vec::new();
        let mut held = 0usize;
        for r in self.items.iter(txn)? {
            let (k, v) = r?;
            if v.len() > super::item::MAX_HEADER + POINTER_LEN {
                continue;
            }
            let Some((_, p)) = super::item::pointer_of(v) else {
                continue;
            };
            if p.id != id || !chosen.contains(&p.segment) {
                continue;
            }
            let mut value = vec![0u8; p.len as usize].into_boxed_slice();
            if let Err(e) = self.vlog.read_value(&p, &mut value) {
                log::warn!("cannot read a value to move it: {e}");
                continue;
            }
            if crc32fast::hash(&value) != p.crc {
                // Left where it is: a read of it reports the damage.
                log::warn!(
                    "a value in log segment {} (bytes {}..{}) does not match its checksum",
                    p.segment,
                    p.offset,
                    p.end()
                );
                continue;
            }
            held += value.len();
            moves.push(Move {
                key: k.into(),
                pointer: p,
                value,
            });
            if held >= MOVE_ROUND {
                break;
            }
        }
        lock(&self.vlog.moves).extend(moves);
        Ok(())
    }
}

/// Of the small segments (used bytes, number) that still hold live values, the ones whose
/// values to move: none while there are at most `SMALL_KEEP`, else the smallest, down to half
/// that many.
fn merge_small(mut small: Vec<(u64, u64)>) -> impl Iterator<Item = (u64, u64)> {
    let over = if small.len() > SMALL_KEEP {
        small.len() - SMALL_KEEP / 2
    } else {
        0
    };
    small.sort_unstable();
    small.into_iter().take(over)
}

/// How long the checkpointer waits, with dead segments held back by readers, before it tries
/// to retire them again.
pub const RETIRE_RETRY: Duration = Duration::from_millis(200);

fn bad(p: &Pointer, why: &str) -> StoreError {
    StoreError::damaged(format!(
        "a value pointer into log segment {} (bytes {}..{}) is {why}",
        p.segment,
        p.offset,
        p.end()
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The value log registered under `id`.
pub fn find(id: u64) -> Option<Arc<ValueLog>> {
    REGISTRY
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|v| v.id == id)
        .cloned()
}

/// `find`, through a one-entry cache per thread (a thread serves one store).
fn cached(id: u64) -> Option<Arc<ValueLog>> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<Arc<ValueLog>>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with(|l| {
        let mut l = l.borrow_mut();
        match &*l {
            Some(v) if v.id == id => Some(v.clone()),
            _ => {
                *l = find(id);
                l.clone()
            }
        }
    })
}

/// The bytes `p` names (see `ValueLog::slice`).
pub fn resolve(p: &Pointer) -> Result<&'static [u8], StoreError> {
    let v = cached(p.id).ok_or_else(|| {
        StoreError::damaged(format!(
            "a value pointer names value log {:016x}, which is not this store's",
            p.id
        ))
    })?;
    v.slice(p)
}

/// The descriptors of the segment `p` names, buffered and (where allowed) `O_DIRECT`, open
/// until the segment is retired, which waits for the read transaction that found `p` (for a
/// worker's ring to read the value from, keeping that transaction open meanwhile).
pub fn raw_fds(p: &Pointer) -> Option<(std::os::fd::RawFd, Option<std::os::fd::RawFd>)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let v = cached(p.id)?;
    let seg = v.seg(p.segment).ok()?;
    let direct = seg.direct.get_or_init(|| {
        if std::env::var_os("MEMKEEP_COLD_DIRECT").is_some_and(|v| v == "0") {
            return None;
        }
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(v.dir.join(super::wal::segment_name(p.segment)))
            .ok()
    });
    Some((
        seg.file.as_raw_fd(),
        direct.as_ref().map(AsRawFd::as_raw_fd),
    ))
}

/// Whether some page of `value` (a slice `resolve` returned) is not in memory.
pub fn cold(value: &[u8], id: u64) -> bool {
    let Some(v) = cached(id) else {
        return false;
    };
    if v.all_cold {
        return true;
    }
    super::resident::sampled_cold(value.as_ptr() as usize, value.len(), v.page)
}

/// What the writer needs to separate values into the batch it is applying: where the batch
/// will be appended (`Wal::position` in segment `segment`), and that segment's file.
pub struct Sink {
    pub vlog: Arc<ValueLog>,
    pub min: usize,
    pub segment: u64,
    /// The file offset of the batch buffer's first byte (its header's).
    pub base: u64,
    pub file: Arc<File>,
}

impl Sink {
    /// Writes `parts` (the value) at `at` in the batch buffer, where the append will put them
    /// again, and returns the pointer to them.
    pub fn write(&self, at: usize, parts: &[&[u8]]) -> std::io::Result<Pointer> {
        let offset = self.base + at as u64;
        let mut o = offset;
        let mut h = crc32fast::Hasher::new();
        let mut len = 0usize;
        for p in parts {
            self.file.write_all_at(p, o)?;
            h.update(p);
            o += p.len() as u64;
            len += p.len();
        }
        self.vlog.note_held(self.segment);
        Ok(Pointer {
            id: self.vlog.id,
            segment: self.segment,
            offset,
            len: u32::try_from(len).map_err(|_| std::io::Error::other("value too long"))?,
            crc: h.finalize(),
        })
    }
}

/// Tests: a new, empty segment file `n` in `dir` (read and write), and its path.
#[cfg(test)]
pub(crate) fn test_segment(dir: &Path, n: u64) -> (PathBuf, Arc<File>) {
    let path = dir.join(super::wal::segment_name(n));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .expect("segment");
    (path, Arc::new(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_round_trip_and_refuse_other_lengths() {
        let p = Pointer {
            id: 7,
            segment: 3,
            offset: 1 << 33,
            len: 20_000,
            crc: 0xdead_beef,
        };
        assert_eq!(Pointer::decode(&p.encode()), Some(p));
        assert_eq!(Pointer::decode(&p.encode()[..31]), None);
    }

    #[test]
    fn small_segments_are_merged_smallest_first_once_there_are_too_many() {
        let seg = |i: u64| ((i * 7919) % 1000 + 1, 100 + i);
        // Up to SMALL_KEEP: none moves.
        let few: Vec<_> = (0..SMALL_KEEP as u64).map(seg).collect();
        assert_eq!(merge_small(few).count(), 0);
        // One more: the smallest move, until half of SMALL_KEEP are left.
        let many: Vec<_> = (0..SMALL_KEEP as u64 + 1).map(seg).collect();
        let mut sizes: Vec<u64> = many.iter().map(|&(size, _)| size).collect();
        sizes.sort_unstable();
        let moved: Vec<_> = merge_small(many.clone()).collect();
        assert_eq!(moved.len(), many.len() - SMALL_KEEP / 2);
        assert_eq!(
            moved.iter().map(|&(size, _)| size).collect::<Vec<_>>(),
            sizes[..moved.len()]
        );
        assert!(moved.iter().all(|m| many.contains(m)));
    }

    #[test]
    fn a_value_written_by_a_sink_resolves_and_reads_back() {
        let dir = tempfile::tempdir().expect("dir");
        let (_, file) = test_segment(dir.path(), 5);
        let id = getrandom::u64().expect("random");
        let vlog = ValueLog::register(dir.path(), id, BTreeSet::new());
        let sink = Sink {
            vlog: vlog.clone(),
            min: 1,
            segment: 5,
            base: 4096,
            file,
        };
        let p = sink.write(100, &[b"hello ", b"world"]).expect("write");
        assert_eq!(p.offset, 4196);
        assert_eq!(p.crc, crc32fast::hash(b"hello world"));
        assert!(vlog.holds(5));
        assert_eq!(resolve(&p).expect("resolves"), b"hello world");
        let mut buf = vec![0u8; 11];
        vlog.read_value(&p, &mut buf).expect("pread");
        assert_eq!(buf, b"hello world");
        // A pointer past the file's end is damage, never a fault.
        let past = Pointer {
            offset: 1 << 20,
            ..p
        };
        assert!(resolve(&past).is_err_and(|e| e.is_damage()));
        // A pointer of another store's log is damage too.
        let other = Pointer { id: id ^ 1, ..p };
        assert!(resolve(&other).is_err_and(|e| e.is_damage()));
        vlog.sync_held(6).expect("sync");
    }

    #[test]
    fn the_oldest_reader_holds_back_what_may_be_retired() {
        let dir = tempfile::tempdir().expect("dir");
        let id = getrandom::u64().expect("random");
        let vlog = ValueLog::register(dir.path(), id, BTreeSet::new());
        assert_eq!(vlog.oldest_reader(), None);
        let a = vlog.enter();
        // Opening: its snapshot is not known yet, so it holds back everything.
        assert_eq!(vlog.oldest_reader(), Some(0));
        a.opened(9);
        assert_eq!(vlog.oldest_reader(), Some(9));
        let b = vlog.enter();
        b.opened(4);
        assert_eq!(vlog.oldest_reader(), Some(4));
        drop(b);
        assert_eq!(vlog.oldest_reader(), Some(9));
        // More readers than slots: the extra ones are counted and hold back everything.
        let many: Vec<ReaderSlot> = (0..READER_SLOTS).map(|_| vlog.enter()).collect();
        for m in &many {
            m.opened(20);
        }
        assert_eq!(vlog.oldest_reader(), Some(0));
        drop(many);
        assert_eq!(vlog.oldest_reader(), Some(9));
        drop(a);
        assert_eq!(vlog.oldest_reader(), None);
    }

    #[test]
    fn moves_are_taken_by_budget_and_dropped_when_the_writer_moves_none() {
        let dir = tempfile::tempdir().expect("dir");
        let id = getrandom::u64().expect("random");
        let vlog = ValueLog::register(dir.path(), id, BTreeSet::new());
        let m = |k: u8, n: usize| Move {
            key: vec![k].into(),
            pointer: Pointer {
                id,
                segment: 1,
                offset: 0,
                len: n as u32,
                crc: 0,
            },
            value: vec![k; n].into(),
        };
        lock(&vlog.moves).extend([m(1, 600), m(2, 600), m(3, 600)]);
        // At least one, then as many as fit.
        assert_eq!(vlog.take_moves(100).len(), 1);
        assert_eq!(vlog.take_moves(1200).len(), 2);
        assert!(!vlog.has_moves());
        lock(&vlog.moves).push_back(m(4, 10));
        vlog.set_moving(false);
        assert!(!vlog.has_moves());
    }
}
