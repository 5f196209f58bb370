//! Opening a store so that it survives power loss: the data directory's lock, recovery from the
//! last checkpoint and the write-ahead log, and the checkpointer thread.
//!
//! Recovery always takes the same path, after a clean stop, a kill -9 or a power cut alike:
//! 1. put the checkpoint's meta page back into both of `data.mdb`'s meta slots, so LMDB opens
//!    at the checkpoint's snapshot (all of whose pages were on disk when the record was written,
//!    and none of which LMDB has reused since, because a read transaction kept them alive);
//! 2. open LMDB and at once pin that snapshot with a read transaction (replay will free its
//!    pages, and until the next checkpoint it is still the one a later crash recovers to);
//! 3. replay, from the checkpoint's first segment on, every whole batch that has exactly the
//!    next sequence number (the first one: the checkpoint's plus one) and passes its checksum
//!    under its segment's salt; a segment ends at the first batch that does not, and the log
//!    goes on in the next segment only if that one's first batch follows; cut the segment the
//!    log ends in there (durably) and remove any later ones.
//!
//! A checkpoint (`Checkpointer`): the writer, between two batches, ends the log segment (so the
//! next segment holds only batches after the checkpoint's), opens a read transaction on the
//! snapshot it has just committed and copies that snapshot's meta page; the checkpointer thread
//! then fdatasyncs `data.mdb`, writes the checkpoint record, swaps the pinned snapshot for the
//! new one, turns the segments the new one covers into spares (`wal::retire`) and makes sure a
//! spare long enough for the next segment is ready (`wal::prepare_spare`), so the writer's
//! next rotation takes a file whose blocks are already written.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

use heed::{RoTxn, WithoutTls};
use log::{error, info, warn};

use super::lmdb::{LmdbStore, OpenError, Persisted, Replay};
use super::wal::{self, Checkpoint, Format, SegmentReader, Stop, Wal};

/// A read transaction held only to keep a snapshot's pages from being reused.
pub type Pin = RoTxn<'static, WithoutTls>;

/// Replay commits this much payload per LMDB transaction (bounds its dirty pages).
const REPLAY_TXN_BYTES: usize = 64 << 20;

/// What recovery found and did.
#[derive(Debug, Default, Clone)]
pub struct Recovery {
    pub checkpoint_seq: u64,
    pub batches: u64,
    pub bytes: u64,
    /// Why the log ended before its files did (a torn tail), if it did.
    pub cut: Option<String>,
    pub micros: u64,
}

/// A store opened for serving: recovered, locked, with its log open for appending.
pub struct Durable {
    pub store: LmdbStore,
    pub persisted: Persisted,
    pub wal: Wal,
    pub checkpointer: Checkpointer,
    pub recovery: Recovery,
}

fn lock_dir(dir: &Path) -> Result<File, OpenError> {
    let path = dir.join("memkeep.lock");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| OpenError(format!("cannot open data directory {}: {e}", dir.display())))?;
    // Safety: flock on a file descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(OpenError(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            format!(
                "data directory {} is in use by another memkeep process",
                dir.display()
            )
        } else {
            format!("cannot lock data directory {}: {e}", dir.display())
        }));
    }
    Ok(f)
}

/// Whether a memkeep server holds `dir` now (tools then read the live store as it is).
pub fn in_use(dir: &Path) -> bool {
    let Ok(f) = File::open(dir.join("memkeep.lock")) else {
        return false;
    };
    // Safety: flock on a file descriptor this function owns; released when `f` closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
}

/// Opens, recovers and locks the store in `dir`.
pub fn open(dir: &Path, map_size: u64, max_readers: u32) -> Result<Durable, OpenError> {
    let started = Instant::now();
    let at =
        |what: &str, e: &dyn std::fmt::Display| OpenError(format!("{what} {}: {e}", dir.display()));
    if dir.exists() && !dir.is_dir() {
        return Err(OpenError(format!(
            "data directory {} is not a directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| at("cannot create data directory", &e))?;
    let lock = lock_dir(dir)?;
    let ckpt = wal::read_checkpoint(dir).map_err(OpenError)?;
    let data_path = dir.join("data.mdb");
    if let Some(c) = &ckpt {
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&data_path)
            .map_err(|e| {
                OpenError(format!(
                    "storage corrupted: {} has a checkpoint but its data file cannot be opened: {e}",
                    dir.display()
                ))
            })?;
        let len = data.metadata().map_or(0, |m| m.len());
        let need = wal::meta_needs(&c.page);
        if len < need {
            return Err(OpenError(format!(
                "{} is truncated: {len} bytes, but the store it describes needs {need}; restore it from a backup",
                data_path.display()
            )));
        }
        let same = wal::root_digest(&data, &c.page).is_ok_and(|d| d == c.roots);
        if !same {
            return Err(OpenError(format!(
                "{} is not the file the checkpoint beside it describes (its snapshot's root pages differ): was a backup copied over it? To open it as it is, move {} and the wal-*.log files out of {}",
                data_path.display(),
                wal::CHECKPOINT_FILE,
                dir.display()
            )));
        }
        wal::restore_meta(&data, c).map_err(|e| at("cannot restore the checkpoint in", &e))?;
    }
    let (store, _) = LmdbStore::open(dir, map_size, max_readers)?;
    let pin = store
        .env()
        .clone()
        .static_read_txn()
        .map_err(|e| at("cannot read", &e))?;
    let data = store
        .env()
        .try_clone_inner_file()
        .map_err(|e| at("cannot open the data file in", &e))?;
    let page_size = store.env().stat().page_size as usize;
    let mut recovery = Recovery::default();
    let wal = match ckpt {
        None => {
            // A new store, or one written before the log existed: make its state the first
            // checkpoint before anything is logged.
            if !wal::segments(dir)
                .map_err(|e| at("cannot list", &e))?
                .is_empty()
            {
                return Err(OpenError(format!(
                    "storage corrupted: {} has log files but no checkpoint",
                    dir.display()
                )));
            }
            let txnid = pin.id() as u64;
            data.sync_data()
                .map_err(|e| at("cannot sync the data file in", &e))?;
            let page = wal::read_meta_page(&data, txnid, page_size)
                .map_err(|e| at("cannot read the meta page in", &e))?;
            let roots =
                wal::root_digest(&data, &page).map_err(|e| at("cannot read the roots in", &e))?;
            wal::write_checkpoint(
                dir,
                &Checkpoint {
                    txnid,
                    seq: 0,
                    segment: 1,
                    page,
                    roots,
                },
            )
            .map_err(|e| at("cannot write the checkpoint in", &e))?;
            Wal::resume(dir, 1, Format::Blank, 0, 1)
                .map_err(|e| at("cannot create the log in", &e))?
        }
        Some(c) => {
            if pin.id() as u64 != c.txnid {
                return Err(OpenError(format!(
                    "storage corrupted: {} opened at transaction {} instead of its checkpoint's {}",
                    dir.display(),
                    pin.id(),
                    c.txnid
                )));
            }
            recovery.checkpoint_seq = c.seq;
            let w = replay(dir, &store, &c, &mut recovery)?;
            // The replay's transactions may count pages they never wrote (see `cover`).
            let need = (store.env().info().last_page_number as u64 + 1) * page_size as u64;
            cover(&data, need).map_err(|e| at("cannot extend the data file in", &e))?;
            w
        }
    };
    let persisted = store
        .reload_persisted()
        .map_err(|e| at("cannot read", &e))?;
    recovery.micros = started.elapsed().as_micros() as u64;
    if recovery.batches > 0 || recovery.cut.is_some() {
        info!(
            "recovered {}: checkpoint at batch {}, {} batches ({} bytes) replayed in {} ms{}",
            dir.display(),
            recovery.checkpoint_seq,
            recovery.batches,
            recovery.bytes,
            recovery.micros / 1000,
            recovery
                .cut
                .as_ref()
                .map(|c| format!("; the log ended early: {c}"))
                .unwrap_or_default()
        );
    }
    // The last run's tail is the best guess of how much the first segment will take.
    let spare = wal::spare_target(recovery.bytes);
    let checkpointer = Checkpointer::start(dir, data, page_size, pin, lock, spare)
        .map_err(|e| at("cannot start the checkpointer for", &e))?;
    Ok(Durable {
        store,
        persisted,
        wal,
        checkpointer,
        recovery,
    })
}

/// Replays the log after checkpoint `c`; returns the log, positioned after its last whole batch.
fn replay(
    dir: &Path,
    store: &LmdbStore,
    c: &Checkpoint,
    rec: &mut Recovery,
) -> Result<Wal, OpenError> {
    let at =
        |what: &str, e: &dyn std::fmt::Display| OpenError(format!("{what} {}: {e}", dir.display()));
    let segs = wal::segments(dir).map_err(|e| at("cannot list", &e))?;
    let mut next_seq = c.seq + 1;
    // Where appending resumes: the last segment the log reached, its format and valid length.
    let mut end: Option<(u64, Format, u64)> = None;
    // Why the log ended before its files did: a torn tail in `end`, or later segments it
    // does not reach.
    let mut torn: Option<String> = None;
    let mut unreached: Option<String> = None;
    let mut txn = store
        .env()
        .write_txn()
        .map_err(|e| at("cannot write to", &e))?;
    let mut in_txn = 0usize;
    let mut buf = Vec::new();
    let mut removed = false;
    let mut remove = |path: &Path| {
        warn!(
            "removing log segment {} that follows the end of the log",
            path.display()
        );
        let _ = std::fs::remove_file(path);
        removed = true;
    };
    for (n, path) in &segs {
        if *n < c.segment {
            if let Some(v) = store.vlog() {
                // The store may hold values in it (`vlog.rs`): kept.
                v.note_held(*n);
                continue;
            }
            // Covered by the checkpoint: its retirement was interrupted.
            if let Err(e) = wal::retire(dir, *n, path) {
                warn!("cannot retire {}: {e}", path.display());
            }
            continue;
        }
        if unreached.is_some() {
            remove(path);
            continue;
        }
        let follows = match end {
            // Tolerated since the first log: the checkpoint's own segment missing.
            None => *n == c.segment || *n == c.segment + 1,
            Some((e, ..)) => *n == e + 1,
        };
        if !follows {
            let missing = end.map_or(c.segment, |(e, ..)| e + 1);
            unreached = Some(format!(
                "log segment {} is missing",
                wal::segment_name(missing)
            ));
            remove(path);
            continue;
        }
        let mut reader = SegmentReader::open(path, *n, Some(next_seq))
            .map_err(|e| at("cannot read the log in", &e))?;
        let mut found = 0u64;
        while reader
            .next_batch(&mut buf)
            .map_err(|e| at("cannot read the log in", &e))?
            .is_some()
        {
            for op in wal::ops(&buf) {
                let op = op.map_err(|e| OpenError(format!("storage corrupted: {e}")))?;
                if let wal::Op::Patch { patch, .. } = &op {
                    // Rewrites its whole value: that is what dirties the transaction.
                    in_txn += patch.new_len as usize;
                }
                store
                    .replay(&mut txn, op, Replay::Exact)
                    .map_err(|e| OpenError(format!("{e} in {}", dir.display())))?;
            }
            found += 1;
            rec.batches += 1;
            rec.bytes += buf.len() as u64;
            in_txn += buf.len();
            next_seq += 1;
            if in_txn >= REPLAY_TXN_BYTES {
                txn.commit().map_err(|e| at("cannot write to", &e))?;
                txn = store
                    .env()
                    .write_txn()
                    .map_err(|e| at("cannot write to", &e))?;
                in_txn = 0;
            }
        }
        if found == 0
            && end.is_some()
            && let Some(stop @ Stop::Unexpected { .. }) = &reader.stop
        {
            // A whole batch of this segment's life, but not the next one: batches are
            // missing, and the log ends where the previous segment's batches did.
            unreached = Some(format!("{}: {stop}", path.display()));
            remove(path);
            continue;
        }
        // Any end of this segment is where its batches stop (its file may go on with zeros or
        // what it held in an earlier life); whether the log goes on is up to the next one.
        torn = match &reader.stop {
            Some(why) if reader.torn() => Some(format!(
                "{} at byte {}: {why}",
                path.display(),
                reader.valid_len
            )),
            _ => None,
        };
        end = Some((*n, reader.format, reader.valid_len));
    }
    txn.commit().map_err(|e| at("cannot write to", &e))?;
    rec.cut = match (torn, unreached) {
        (Some(t), Some(u)) => Some(format!("{t}; {u}")),
        (t, u) => t.or(u),
    };
    if removed {
        // Durably gone before anything is appended: the log may grow to where one of them
        // would follow it again.
        wal::sync_dir(dir).map_err(|e| at("cannot sync", &e))?;
    }
    let (segment, format, len) = end.unwrap_or((c.segment, Format::Blank, 0));
    let mut w = Wal::resume(dir, segment, format, len, next_seq)
        .map_err(|e| at("cannot open the log in", &e))?;
    w.since_checkpoint = rec.bytes;
    Ok(w)
}

/// Applies to `copy` (a copy of the store in `dir` taken after checkpoint `c` was read) every
/// batch of `dir`'s log after `c`, reading the log as a running server leaves it (never
/// changing it): the copy then holds every batch the log held, acknowledged ones included,
/// which LMDB may not have been given yet. Batches the copy already holds are applied again,
/// which leaves it as it was (records are physical and replayed in order). Returns how many
/// batches were applied; the caller checks that `c` is still the checkpoint afterwards (else
/// a segment may have been recycled under the reader) and tries again.
pub fn replay_live(dir: &Path, copy: &LmdbStore, c: &Checkpoint) -> Result<u64, String> {
    let segs = wal::segments(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut next_seq = c.seq + 1;
    let mut txn = copy.env().write_txn().map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut prev: Option<u64> = None;
    let mut applied = 0u64;
    for (n, path) in segs {
        if n < c.segment {
            continue;
        }
        let follows = match prev {
            None => n == c.segment || n == c.segment + 1,
            Some(p) => n == p + 1,
        };
        if !follows {
            break;
        }
        let mut reader = SegmentReader::open(&path, n, Some(next_seq))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        while reader
            .next_batch(&mut buf)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            .is_some()
        {
            for op in wal::ops(&buf) {
                copy.replay(&mut txn, op?, Replay::CatchUp)?;
            }
            next_seq += 1;
            applied += 1;
        }
        prev = Some(n);
    }
    txn.commit().map_err(|e| e.to_string())?;
    Ok(applied)
}

/// Makes `data` at least `need` bytes long. LMDB counts pages it allocated and freed again in
/// one transaction without ever writing them, so a long transaction can leave the file
/// shorter than its meta page's page count; the checkpoint (and the truncation check at
/// open, which refuses copies cut short) wants the file to cover every page it counts.
pub fn cover(data: &File, need: u64) -> std::io::Result<()> {
    if data.metadata()?.len() < need {
        data.set_len(need)?;
    }
    Ok(())
}

/// A checkpoint the writer has prepared: the snapshot to pin and the record to write.
struct Job {
    /// The store's separated values: the segments holding them are synced before the record
    /// and kept until the collector finds them dead (`vlog.rs`).
    vlog: Option<Arc<crate::storage::vlog::ValueLog>>,
    /// The store's items, for the value log's collector to scan.
    items: heed::Database<heed::types::Bytes, heed::types::Bytes>,
    pin: Pin,
    record: Checkpoint,
    /// Bytes the segment the writer has just ended held (sizes the next spare).
    ended: u64,
}

/// Figures about checkpoints, for `stats`/INFO, and the request a client can make for one.
#[derive(Debug, Default)]
pub struct CheckpointStats {
    /// Set by `db_checkpoint`: the writer starts a checkpoint at its next turn.
    pub requested: AtomicBool,
    pub count: AtomicU64,
    pub failures: AtomicU64,
    pub last_micros: AtomicU64,
    pub last_seq: AtomicU64,
    /// The first log segment the last completed checkpoint replays from: the ones before it
    /// are covered by its snapshot.
    pub first_segment: AtomicU64,
    /// Times the checkpointer has finished making sure a spare is ready (tests wait on it).
    pub spare_rounds: AtomicU64,
}

/// The checkpointer thread and the writer's handle on it.
pub struct Checkpointer {
    tx: Option<mpsc::Sender<Job>>,
    busy: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    data: File,
    page_size: usize,
    pub stats: Arc<CheckpointStats>,
}

impl Checkpointer {
    fn start(
        dir: &Path,
        data: File,
        page_size: usize,
        pin: Pin,
        lock: File,
        spare: u64,
    ) -> std::io::Result<Checkpointer> {
        let (tx, rx) = mpsc::channel::<Job>();
        let busy = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(CheckpointStats::default());
        let sync_fd = data.try_clone()?;
        let (b, s, dir) = (busy.clone(), stats.clone(), dir.to_path_buf());
        let thread = std::thread::Builder::new()
            .name("memkeep-checkpoint".into())
            .spawn(move || run(dir, sync_fd, pin, lock, rx, b, s, spare))?;
        Ok(Checkpointer {
            tx: Some(tx),
            busy,
            thread: Some(thread),
            data,
            page_size,
            stats,
        })
    }

    /// Whether a checkpoint is being written now.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// Starts a checkpoint of the store as committed now; the writer calls it between batches.
    /// Ends the log segment first, so the segments after the one this returns hold exactly
    /// the batches the checkpoint does not.
    pub fn begin(&mut self, store: &LmdbStore, wal: &mut Wal) -> Result<(), String> {
        let Some(tx) = &self.tx else {
            return Err("the checkpointer has stopped".into());
        };
        let ended = wal.position();
        let segment = wal
            .rotate()
            .map_err(|e| format!("cannot start a new log segment: {e}"))?;
        let pin = store
            .env()
            .clone()
            .static_read_txn()
            .map_err(|e| format!("cannot pin the snapshot: {e}"))?;
        let txnid = pin.id() as u64;
        let page = wal::read_meta_page(&self.data, txnid, self.page_size)
            .map_err(|e| format!("cannot read the meta page: {e}"))?;
        self.busy.store(true, Ordering::Release);
        let job = Job {
            vlog: store.vlog().cloned(),
            items: *store.items(),
            pin,
            record: Checkpoint {
                txnid,
                seq: wal.last_seq(),
                segment,
                page,
                roots: 0,
            },
            ended,
        };
        tx.send(job).map_err(|_| {
            self.busy.store(false, Ordering::Release);
            "the checkpointer has stopped".to_string()
        })
    }

    /// Waits for the checkpoint in progress (if any) and stops the thread, releasing the pins.
    pub fn finish(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            error!("the checkpoint thread panicked");
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Makes sure a spare of `target` bytes is ready; a failure costs only speed (the log then
/// grows its file as it is written).
fn prepare_spare(dir: &Path, target: u64, stats: &CheckpointStats) {
    let started = Instant::now();
    match wal::prepare_spare(dir, target) {
        Ok(()) => log::debug!(
            "spare log segment of {target} bytes ready in {} us",
            started.elapsed().as_micros()
        ),
        Err(e) => warn!(
            "cannot prepare a spare log segment in {}: {e}",
            dir.display()
        ),
    }
    stats.spare_rounds.fetch_add(1, Ordering::Release);
}

#[allow(clippy::too_many_arguments)]
fn run(
    dir: PathBuf,
    data: File,
    mut current: Pin,
    _lock: File,
    rx: mpsc::Receiver<Job>,
    busy: Arc<AtomicBool>,
    stats: Arc<CheckpointStats>,
    spare: u64,
) {
    prepare_spare(&dir, spare, &stats);
    let mut collector: Option<crate::storage::vlog::Collector> = None;
    // Checkpoints that failed in a row (said once, at the first).
    let mut failing = 0u64;
    loop {
        // Dead value segments held back by readers are tried again on a timer: the next
        // checkpoint may be long in coming on an idle store.
        let waiting = collector
            .as_ref()
            .is_some_and(crate::storage::vlog::Collector::waiting);
        let next = if waiting {
            rx.recv_timeout(crate::storage::vlog::RETIRE_RETRY)
        } else {
            rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected)
        };
        let mut job = match next {
            Ok(job) => job,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(c) = collector.as_mut() {
                    c.retire_ready();
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let started = Instant::now();
        let result = cover(&data, wal::meta_needs(&job.record.page))
            .and_then(|()| data.sync_data())
            .map_err(|e| format!("cannot sync the data file: {e}"))
            .and_then(|()| match &job.vlog {
                // The snapshot's pointers name only segments before the record's first.
                Some(v) => v
                    .sync_held(job.record.segment)
                    .map_err(|e| format!("cannot sync a log segment holding values: {e}")),
                None => Ok(()),
            })
            .and_then(|()| {
                job.record.roots = wal::root_digest(&data, &job.record.page)
                    .map_err(|e| format!("cannot read the snapshot's roots: {e}"))?;
                wal::write_checkpoint(&dir, &job.record)
                    .map_err(|e| format!("cannot write the checkpoint record: {e}"))
            });
        let made = result.is_ok();
        match result {
            Ok(()) => {
                // The new snapshot is the recovery point now: the old one's pages may go, and
                // the segments before the new one become spares.
                current = job.pin;
                if let Ok(segs) = wal::segments(&dir) {
                    for (n, path) in segs {
                        if n < job.record.segment
                            && !job.vlog.as_ref().is_some_and(|v| v.holds(n))
                            && let Err(e) = wal::retire(&dir, n, &path)
                        {
                            warn!("cannot retire {}: {e}", path.display());
                        }
                    }
                }
                if failing > 0 {
                    log::info!("checkpoints succeed again ({failing} failed)");
                    failing = 0;
                }
                log::debug!(
                    "checkpoint at batch {} (transaction {}) in {} us",
                    job.record.seq,
                    job.record.txnid,
                    started.elapsed().as_micros()
                );
                stats.count.fetch_add(1, Ordering::Relaxed);
                stats
                    .last_micros
                    .store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                stats.last_seq.store(job.record.seq, Ordering::Relaxed);
                stats
                    .first_segment
                    .store(job.record.segment, Ordering::Release);
            }
            Err(e) => {
                // The old checkpoint and its pinned snapshot stay the recovery point. Said
                // once until one succeeds (the next is tried within a second).
                if failing == 0 {
                    error!(
                        "checkpoint of {} failed: {e}{}; trying again",
                        dir.display(),
                        super::disk_full_hint(&dir)
                    );
                } else {
                    log::debug!("checkpoint of {} failed: {e}", dir.display());
                }
                failing += 1;
                stats.failures.fetch_add(1, Ordering::Relaxed);
                drop(job.pin);
            }
        }
        busy.store(false, Ordering::Release);
        // Collection of the value log, on the snapshot just made the recovery point (after
        // `busy`: a scan may take a while, and the next checkpoint need not wait for it).
        if let (Some(v), true) = (&job.vlog, made) {
            v.note_end(job.record.segment.saturating_sub(1), job.ended);
            collector
                .get_or_insert_with(|| crate::storage::vlog::Collector::new(v.clone(), job.items))
                .after_checkpoint(&current, job.record.segment);
        }
        // A segment that took separated values is kept (`vlog.rs`), so no spare comes back from
        // it, and one made from nothing in zeros is that many bytes written twice for each
        // segment of values (measured: 8% of the server's samples for 20 KiB SETs).
        let values_in_log = job
            .vlog
            .as_ref()
            .is_some_and(|v| v.holds(job.record.segment.saturating_sub(1)));
        if values_in_log {
            let target = wal::spare_target(job.ended);
            if let Err(e) = wal::prepare_spare_unwritten(&dir, target) {
                log::debug!("no spare log segment made in {}: {e}", dir.display());
            }
            stats.spare_rounds.fetch_add(1, Ordering::Release);
            continue;
        }
        // After `busy`: the writer may rotate meanwhile (it does not wait for zeros to be
        // written); `wal::prepare_spare` keeps the file it extends out of its reach.
        prepare_spare(&dir, wal::spare_target(job.ended), &stats);
    }
    drop(current);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::wal::segment_name;

    const MAP: u64 = 1 << 26;

    /// Commits one batch the way the writer does: log append, LMDB commit, log fdatasync.
    fn batch(d: &mut Durable, puts: &[(&[u8], &[u8])], dels: &[&[u8]]) {
        let store = d.store.clone();
        let mut txn = store.write_txn().expect("txn");
        for (k, v) in puts {
            store.items.put(&mut txn, k, v).expect("put");
        }
        for k in dels {
            store.items.delete(&mut txn, k).expect("delete");
        }
        let (txn, mut log) = txn.into_parts();
        d.wal.append(&mut log).expect("append");
        txn.commit().expect("commit");
        d.wal.sync().expect("sync");
    }

    fn get(d: &Durable, k: &[u8]) -> Option<Vec<u8>> {
        let txn = d.store.read_txn().expect("txn");
        d.store.items.get(&txn, k).expect("get").map(<[u8]>::to_vec)
    }

    /// Waits until the checkpointer has finished every checkpoint and the spare it prepares
    /// after each (and at start).
    fn settle(d: &Durable) {
        let stats = &d.checkpointer.stats;
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while d.checkpointer.busy()
            || stats.spare_rounds.load(Ordering::Acquire)
                < 1 + stats.count.load(Ordering::Acquire) + stats.failures.load(Ordering::Acquire)
        {
            assert!(Instant::now() < deadline, "the checkpointer never settled");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn checkpoint(d: &mut Durable) {
        settle(d);
        let store = d.store.clone();
        d.checkpointer.begin(&store, &mut d.wal).expect("begin");
        settle(d);
        assert_eq!(d.checkpointer.stats.failures.load(Ordering::Relaxed), 0);
    }

    fn seg(dir: &Path, n: u64) -> PathBuf {
        dir.join(segment_name(n))
    }

    fn ino(path: &Path) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).expect("stat"))
    }

    /// Offsets where each batch of segment `n` starts, and where the last one ends.
    fn batch_offsets(dir: &Path, n: u64, first: u64) -> Vec<u64> {
        let mut r = SegmentReader::open(&seg(dir, n), n, Some(first)).expect("open");
        let mut at = vec![r.valid_len];
        let mut buf = Vec::new();
        while r.next_batch(&mut buf).expect("read").is_some() {
            at.push(r.valid_len);
        }
        at
    }

    /// What a power cut can leave: LMDB's meta pages on disk name a newer transaction whose
    /// pages never got there. Here both meta pages point at a root page of zeros.
    fn wreck_lmdb_meta(dir: &Path) {
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("data.mdb"))
            .expect("open data.mdb");
        let len = data.metadata().expect("stat").len();
        let psize = 4096u64;
        // A page of zeros past the end, and both metas pointing their main tree at it.
        data.set_len(len + psize).expect("extend");
        let last = len / psize;
        for slot in 0..2u64 {
            let mut page = vec![0u8; 4096];
            data.read_exact_at(&mut page, slot * psize)
                .expect("read meta");
            page[128..136].copy_from_slice(&last.to_le_bytes()); // main root
            page[136..144].copy_from_slice(&last.to_le_bytes()); // last page
            page[144..152].copy_from_slice(&(1000 + slot).to_le_bytes()); // txnid
            data.write_all_at(&page, slot * psize).expect("write meta");
        }
        data.sync_all().expect("sync");
    }

    use std::os::unix::fs::FileExt;

    #[test]
    fn recovery_replays_the_log_over_the_checkpoint_whatever_lmdb_meta_pages_say() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut d = open(dir.path(), MAP, 16).expect("open");
            batch(&mut d, &[(b"a", b"1"), (b"b", b"2")], &[]);
            checkpoint(&mut d);
            batch(&mut d, &[(b"c", b"3"), (b"a", b"one")], &[b"b"]);
            batch(&mut d, &[(b"d", b"4")], &[]);
        }
        wreck_lmdb_meta(dir.path());
        let d = open(dir.path(), MAP, 16).expect("reopen");
        assert_eq!(d.recovery.batches, 2);
        assert_eq!(get(&d, b"a").as_deref(), Some(&b"one"[..]));
        assert_eq!(get(&d, b"b"), None);
        assert_eq!(get(&d, b"c").as_deref(), Some(&b"3"[..]));
        assert_eq!(get(&d, b"d").as_deref(), Some(&b"4"[..]));
    }

    #[test]
    fn a_torn_tail_is_cut_and_appending_goes_on_after_the_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let seg;
        {
            let mut d = open(dir.path(), MAP, 16).expect("open");
            batch(&mut d, &[(b"a", b"1")], &[]);
            batch(&mut d, &[(b"b", b"2")], &[]);
            seg = dir.path().join(segment_name(d.wal.segment()));
        }
        // The last batch loses its final bytes, as if its last page never reached the disk.
        let bytes = std::fs::read(&seg).expect("read");
        std::fs::write(&seg, &bytes[..bytes.len() - 1]).expect("write");
        {
            let mut d = open(dir.path(), MAP, 16).expect("reopen");
            assert!(d.recovery.cut.is_some());
            assert_eq!(get(&d, b"a").as_deref(), Some(&b"1"[..]));
            assert_eq!(get(&d, b"b"), None);
            batch(&mut d, &[(b"c", b"3")], &[]);
        }
        wreck_lmdb_meta(dir.path());
        let d = open(dir.path(), MAP, 16).expect("reopen again");
        assert!(d.recovery.cut.is_none(), "{:?}", d.recovery.cut);
        assert_eq!(get(&d, b"a").as_deref(), Some(&b"1"[..]));
        assert_eq!(get(&d, b"b"), None);
        assert_eq!(get(&d, b"c").as_deref(), Some(&b"3"[..]));
    }

    #[test]
    fn a_checkpoint_removes_the_segments_it_covers_and_keeps_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut d = open(dir.path(), MAP, 16).expect("open");
            for i in 0..50u32 {
                batch(&mut d, &[(&i.to_be_bytes(), &[7u8; 3000])], &[]);
            }
            checkpoint(&mut d);
            let segs = wal::segments(dir.path()).expect("list");
            assert_eq!(segs.len(), 1, "{segs:?}");
            assert_eq!(segs[0].0, d.wal.segment());
            // The covered segment became a spare (with the one made at start: at most two).
            let spares = wal::spares(dir.path()).expect("spares");
            assert!(spares.iter().any(|s| s.n == 1), "{spares:?}");
            assert!(spares.len() <= wal::MAX_SPARES, "{spares:?}");
            batch(&mut d, &[(b"after", b"x")], &[]);
        }
        wreck_lmdb_meta(dir.path());
        let d = open(dir.path(), MAP, 16).expect("reopen");
        assert_eq!(d.recovery.batches, 1);
        for i in 0..50u32 {
            assert_eq!(get(&d, &i.to_be_bytes()).map(|v| v.len()), Some(3000));
        }
        assert_eq!(get(&d, b"after").as_deref(), Some(&b"x"[..]));
    }

    #[test]
    fn a_second_open_of_a_held_directory_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _d = open(dir.path(), MAP, 16).expect("open");
        assert!(in_use(dir.path()));
        let err = open(dir.path(), MAP, 16).err().expect("must fail");
        assert!(err.0.contains("in use"), "{}", err.0);
    }

    #[test]
    fn a_data_file_older_than_its_checkpoint_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = tempfile::tempdir().expect("tempdir");
        {
            let mut d = open(dir.path(), MAP, 16).expect("open");
            std::fs::copy(dir.path().join("data.mdb"), old.path().join("data.mdb")).expect("copy");
            for i in 0..5u8 {
                batch(&mut d, &[(&[i], b"v")], &[]);
                checkpoint(&mut d);
            }
        }
        let len = std::fs::metadata(dir.path().join("data.mdb"))
            .expect("stat")
            .len();
        std::fs::copy(old.path().join("data.mdb"), dir.path().join("data.mdb")).expect("copy");
        // As long as the file it replaces, so only its contents can tell.
        File::options()
            .write(true)
            .open(dir.path().join("data.mdb"))
            .and_then(|f| f.set_len(len))
            .expect("extend");
        let err = open(dir.path(), MAP, 16).err().expect("must fail");
        assert!(
            err.0.contains("is not the file the checkpoint"),
            "{}",
            err.0
        );
    }

    #[test]
    fn checkpoints_recycle_segments_and_the_log_goes_on_past_a_recycled_segment_s_stale_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let v = [b'v'; 200];
        {
            let mut d = open(dir.path(), MAP, 16).expect("open");
            settle(&d);
            batch(&mut d, &[(b"a", &v)], &[]);
            checkpoint(&mut d);
            assert_eq!(d.wal.segment(), 2);
            let first_ino = ino(&dir.path().join(wal::spare_name(1)));
            batch(&mut d, &[(b"b", &v)], &[]);
            checkpoint(&mut d);
            // Segment 3 is segment 1's file again, stale batch and all, extended to a spare's
            // length; nothing was created for it.
            assert_eq!(d.wal.segment(), 3);
            assert_eq!(ino(&seg(dir.path(), 3)), first_ino);
            assert_eq!(
                std::fs::metadata(seg(dir.path(), 3)).expect("stat").len(),
                wal::spare_target(0)
            );
            batch(&mut d, &[(b"x", b"1")], &[]);
            // Ends segment 3 (its batches stop at stale bytes, not at its file's end) without a
            // checkpoint, as a crash in the middle of one leaves it.
            d.wal.rotate().expect("rotate");
            batch(&mut d, &[(b"y", b"2")], &[]);
        }
        wreck_lmdb_meta(dir.path());
        let d = open(dir.path(), MAP, 16).expect("reopen");
        assert_eq!(d.recovery.batches, 2);
        assert!(d.recovery.cut.is_none(), "{:?}", d.recovery.cut);
        assert_eq!(get(&d, b"a").as_deref(), Some(&v[..]));
        assert_eq!(get(&d, b"b").as_deref(), Some(&v[..]));
        assert_eq!(get(&d, b"x").as_deref(), Some(&b"1"[..]));
        assert_eq!(get(&d, b"y").as_deref(), Some(&b"2"[..]));
        assert_eq!(d.wal.segment(), 4);
    }

    #[test]
    fn a_cut_inside_a_recycled_segment_holds_and_a_batch_past_it_never_comes_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (v, w) = ([b'v'; 100], [b'w'; 100]);
        let n;
        let offsets;
        {
            let mut d = open(dir.path(), MAP, 16).expect("open");
            settle(&d);
            batch(&mut d, &[(b"old", &v)], &[]);
            checkpoint(&mut d);
            batch(&mut d, &[(b"old", &w)], &[]);
            checkpoint(&mut d);
            n = d.wal.segment();
            assert!(
                wal::spares(dir.path())
                    .expect("spares")
                    .iter()
                    .all(|s| s.n != 1),
                "segment {n} is not the recycled segment 1"
            );
            let first = d.wal.last_seq() + 1;
            batch(&mut d, &[(b"c1", &v)], &[]);
            batch(&mut d, &[(b"c2", &v)], &[]);
            batch(&mut d, &[(b"c3", &v)], &[]);
            offsets = batch_offsets(dir.path(), n, first);
            assert_eq!(offsets.len(), 4);
        }
        // A power cut: batch c2's last page did not reach the disk, c3's did.
        let path = seg(dir.path(), n);
        let mut bytes = std::fs::read(&path).expect("read");
        let recycled_len = bytes.len() as u64;
        assert!(recycled_len > offsets[3]);
        bytes[offsets[2] as usize - 1] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        wreck_lmdb_meta(dir.path());
        {
            let mut d = open(dir.path(), MAP, 16).expect("reopen");
            let cut = d.recovery.cut.clone().expect("a cut");
            assert!(cut.contains("fails its checksum"), "{cut}");
            assert_eq!(get(&d, b"c1").as_deref(), Some(&v[..]));
            assert_eq!(get(&d, b"c2"), None);
            assert_eq!(get(&d, b"c3"), None);
            // Cut where the torn batch began, durably.
            assert_eq!(std::fs::metadata(&path).expect("stat").len(), offsets[1]);
            // A batch as long as the torn one: it ends exactly where c3 began, so only the
            // cut keeps c3, with the next sequence number and this segment's salt, away.
            batch(&mut d, &[(b"c2", &w)], &[]);
            assert_eq!(d.wal.position(), offsets[2]);
        }
        wreck_lmdb_meta(dir.path());
        let d = open(dir.path(), MAP, 16).expect("reopen again");
        assert!(d.recovery.cut.is_none(), "{:?}", d.recovery.cut);
        assert_eq!(get(&d, b"c1").as_deref(), Some(&v[..]));
        assert_eq!(get(&d, b"c2").as_deref(), Some(&w[..]));
        assert_eq!(get(&d, b"c3"), None);
        assert_eq!(get(&d, b"old").as_deref(), Some(&w[..]));
    }

    #[test]
    fn a_log_in_the_previous_format_still_replays() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut d = open(dir.path(), MAP, 16).expect("open");
            batch(&mut d, &[(b"a", b"1")], &[]);
            batch(&mut d, &[(b"b", b"2")], &[b"a"]);
        }
        // Segment 1 as the previous build wrote it: no segment header, checksums unsalted.
        let path = seg(dir.path(), 1);
        let mut r = SegmentReader::open(&path, 1, Some(1)).expect("open");
        let mut old = Vec::new();
        let mut buf = Vec::new();
        while let Some(seq) = r.next_batch(&mut buf).expect("read") {
            old.extend_from_slice(&wal::raw_batch(Format::Legacy, seq, &buf));
        }
        assert!(!old.is_empty());
        std::fs::write(&path, &old).expect("write");
        wreck_lmdb_meta(dir.path());
        {
            let mut d = open(dir.path(), MAP, 16).expect("reopen");
            assert_eq!(d.recovery.batches, 2);
            assert!(d.recovery.cut.is_none(), "{:?}", d.recovery.cut);
            assert_eq!(get(&d, b"a"), None);
            assert_eq!(get(&d, b"b").as_deref(), Some(&b"2"[..]));
            // The old segment is only read; new batches go to a new segment, with a header.
            assert_eq!(d.wal.segment(), 2);
            batch(&mut d, &[(b"c", b"3")], &[]);
        }
        assert_eq!(std::fs::read(&path).expect("read"), old);
        wreck_lmdb_meta(dir.path());
        let d = open(dir.path(), MAP, 16).expect("reopen again");
        assert_eq!(d.recovery.batches, 3);
        assert_eq!(get(&d, b"b").as_deref(), Some(&b"2"[..]));
        assert_eq!(get(&d, b"c").as_deref(), Some(&b"3"[..]));
    }

    #[test]
    fn a_segment_whose_first_batch_does_not_follow_ends_the_log_before_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut d = open(dir.path(), MAP, 16).expect("open");
            batch(&mut d, &[(b"a", b"1")], &[]);
            batch(&mut d, &[(b"b", b"2")], &[]);
            d.wal.rotate().expect("rotate");
            batch(&mut d, &[(b"c", b"3")], &[]);
        }
        // Batch b lost (damage): segment 2's first batch, c, no longer follows.
        let path = seg(dir.path(), 1);
        let offsets = batch_offsets(dir.path(), 1, 1);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[offsets[1] as usize + 8] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        wreck_lmdb_meta(dir.path());
        let d = open(dir.path(), MAP, 16).expect("reopen");
        let cut = d.recovery.cut.clone().expect("a cut");
        assert!(cut.contains("batch 2 is missing (found 3)"), "{cut}");
        assert_eq!(get(&d, b"a").as_deref(), Some(&b"1"[..]));
        assert_eq!(get(&d, b"b"), None);
        assert_eq!(get(&d, b"c"), None);
        assert_eq!(d.wal.segment(), 1);
        assert!(!seg(dir.path(), 2).exists());
    }
}
