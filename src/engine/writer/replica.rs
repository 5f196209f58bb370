//! The writer's part in replication (see `engine::repl`): handing durable batches to the
//! backlog, staying out of a replica's data (no sweeps, no reclaiming), and installing a
//! primary's full copy.
//!
//! A full copy is installed in one LMDB transaction that empties every database and writes
//! the copy's records and its stream position, unlogged (the copy would double the log's
//! size for nothing), committed, and then made the recovery point by a checkpoint the writer
//! waits for before anything else is logged. Readers see the old store or the new one, never
//! a mix (the overlay is empty across it: the open transaction is committed first). A crash
//! before the checkpoint is durable recovers the previous checkpoint and log: the old store
//! with the old position, which is consistent, so the replica just asks again.
//!
//! The copy is written as it arrives (the receiver hands its chunks over a bounded channel),
//! not staged in a file first: a staged copy was a second gigabyte written to the disk for
//! each gigabyte of store, on a disk a primary may share. This writer is busy for the whole
//! transfer, which costs a replica nothing (it takes no writes of its own, and the stream
//! waits for the copy anyway); a link that fails midway aborts the transaction.
//!
//! A copy is bulk work nobody waits on a reply from, and the machine may serve a primary too
//! (its own primary in a test, another one in production): every `WRITEBACK_EVERY` bytes the
//! writer writes back what LMDB has written of the data file, so the checkpoint's fdatasync
//! finds little left to write instead of the whole copy at once. (The primary's sender paces
//! the copy: `server::repl`.)

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use log::{error, info};

use super::{Submission, Writer};
use crate::command::{CopyChunk, Outcome, ReplInstall, WriteOp};
use crate::config::SyncMode;
use crate::engine::repl::{Hub, REPL_KEY, encode_position};
use crate::storage::lmdb::{
    DB_META, LmdbStore, META_FORMAT, META_VLOG, Replay, STORE_FORMAT_SEPARATED,
};
use crate::storage::wal::{Op, ops};

/// Databases a full copy replaces (every one a log record can name).
const DBS: std::ops::RangeInclusive<u8> = 0..=5;

impl<T: Send + Clone> Writer<T> {
    /// Turns replication on: the log keeps a copy of each batch until it is durable, and the
    /// returned hub gets it then. `replid` names this primary's stream.
    pub fn with_repl(mut self, replid: String, backlog: u64) -> (Writer<T>, Arc<Hub>) {
        let txnid = self.store.env().info().last_txn_id as u64;
        let hub = Arc::new(Hub::new(replid, backlog, self.wal.last_seq(), txnid));
        self.wal.set_tap(true);
        // Copies of the batches' payloads only once a replica wants the stream.
        self.wal.share_tap_copy(hub.frames_flag());
        self.repl = Some(hub.clone());
        (self, hub)
    }

    pub(super) fn is_replica(&self) -> bool {
        self.repl.as_ref().is_some_and(|h| h.is_replica())
    }

    /// Hands the batches the log tapped to the backlog once they are durable per the sync
    /// mode (`always`: synced) and can no longer be taken back (they are past `undo`).
    pub(super) fn release_repl(&mut self) {
        let Some(hub) = self.repl.clone() else {
            return;
        };
        if self.broken.is_some() {
            // Durability unknown: nothing more goes out.
            self.wal.take_tapped(&mut self.tapped);
            self.tapped.clear();
            return;
        }
        if self.cfg.sync == SyncMode::Always && self.wal.unsynced() {
            return;
        }
        self.wal.take_tapped(&mut self.tapped);
        hub.release(&mut self.tapped);
    }

    /// Installs any full copy in `batch` (writer thread), after committing the submissions
    /// before it; what follows it stays in `batch`.
    pub(super) fn install_first(&mut self, batch: &mut Vec<Submission<T>>) {
        let Some(at) = batch.iter().position(|s| {
            s.reqs
                .iter()
                .any(|r| matches!(r.op, WriteOp::ReplInstall(_)))
        }) else {
            return;
        };
        let mut rest = batch.split_off(at);
        if !batch.is_empty() {
            self.commit(batch, false, None, false);
            batch.clear();
        }
        let sub = rest.remove(0);
        for req in sub.reqs {
            let outcome = match &req.op {
                WriteOp::ReplInstall(x) => self.install(x),
                _ => Outcome::Failed,
            };
            self.outboxes[sub.worker].push(super::Completion {
                tag: req.tag,
                outcome,
            });
        }
        self.deliver(None);
        *batch = rest;
        if batch.iter().any(|s| {
            s.reqs
                .iter()
                .any(|r| matches!(r.op, WriteOp::ReplInstall(_)))
        }) {
            self.install_first(batch);
        }
    }

    fn install(&mut self, x: &ReplInstall) -> Outcome {
        if self.broken.is_some() {
            return Outcome::Failed;
        }
        while self.checkpointer.busy() {
            std::thread::sleep(Duration::from_micros(200));
        }
        if let Err(e) = self.commit_lmdb() {
            error!("full copy: cannot commit the open transaction: {e}");
            return Outcome::Failed;
        }
        // Empty (just begun): LMDB has one write transaction at a time.
        self.open = None;
        let store = self.store.clone();
        let started = std::time::Instant::now();
        let r = write_copy(&store, x, &self.data);
        let written = started.elapsed();
        let outcome = match r {
            Ok((id, records)) => {
                let need = (self.store.env().info().last_page_number as u64 + 1) * self.page_size;
                if let Err(e) = crate::storage::durable::cover(&self.data, need) {
                    log::warn!("cannot extend the data file: {e}");
                }
                self.publish_empty(id);
                if let Some(hub) = &self.repl {
                    hub.committed(id as u64, self.wal.last_seq());
                }
                match self.store.reload_persisted() {
                    Ok(p) => {
                        self.cas = self.cas.max(p.cas);
                        // The copy wrote the stored counter (see `Writer::cas_bound`).
                        self.cas_bound = 0;
                    }
                    Err(e) => error!("full copy: cannot read the copy's counters: {e}"),
                }
                self.gc_more = false;
                // Made the recovery point before anything is logged on top of it.
                let stats = self.checkpointer.stats.clone();
                let (count, failures) = (
                    stats.count.load(Ordering::Acquire),
                    stats.failures.load(Ordering::Acquire),
                );
                self.wal.since_checkpoint = self.wal.since_checkpoint.max(1);
                self.checkpoint_now();
                if stats.failures.load(Ordering::Acquire) != failures
                    || stats.count.load(Ordering::Acquire) == count
                {
                    self.break_log("cannot checkpoint a replica's full copy".into());
                    Outcome::Failed
                } else {
                    info!(
                        "full copy installed: {records} records, at offset {} of {}, received \
                         and written in {} ms, checkpointed in {} ms more",
                        x.offset,
                        x.replid,
                        written.as_millis(),
                        (started.elapsed() - written).as_millis()
                    );
                    Outcome::Done
                }
            }
            Err(e) => {
                error!(
                    "full copy not installed: {e}{}",
                    crate::storage::disk_full_hint(self.wal.dir())
                );
                Outcome::Failed
            }
        };
        if self.broken.is_none()
            && let Err(e) = self.begin()
        {
            error!("cannot begin a write transaction: {e}");
        }
        outcome
    }
}

/// Empties every database and writes the copy arriving from `x.source` and its stream
/// position, in one transaction; returns the commit's id and the records written. A copy cut
/// short (its source ends without `End`) aborts the transaction: the store stays as it was.
fn write_copy(
    store: &LmdbStore,
    x: &ReplInstall,
    data: &std::fs::File,
) -> Result<(usize, u64), String> {
    let source = x
        .source
        .take()
        .ok_or("the copy's source was already taken")?;
    let (mut rw, _) = store.write_txn().map_err(|e| e.to_string())?.into_parts();
    for db in DBS {
        store.replay(&mut rw, Op::Clear { db }, Replay::Exact)?;
    }
    let mut records = 0u64;
    let mut unwritten = 0usize;
    loop {
        match source.recv() {
            Ok(CopyChunk::Records(chunk)) => {
                unwritten += chunk.len();
                if unwritten >= WRITEBACK_EVERY {
                    write_back(data);
                    unwritten = 0;
                }
                for op in ops(&chunk) {
                    match op? {
                        Op::Put { db, key, value } => store.put_copied(&mut rw, db, key, value)?,
                        op => store.replay(&mut rw, op, Replay::Exact)?,
                    }
                    records += 1;
                }
            }
            Ok(CopyChunk::End) => break,
            Err(_) => return Err("the copy was cut short".into()),
        }
    }
    if let Some(v) = store.vlog() {
        // Cleared with `meta`: this store's own value log, which its earlier log segments
        // (kept) and its later pointers name, and the format that says it may have some.
        for (key, value) in [
            (META_VLOG, &v.id().to_le_bytes()[..]),
            (META_FORMAT, &[STORE_FORMAT_SEPARATED][..]),
        ] {
            store.replay(
                &mut rw,
                Op::Put {
                    db: DB_META,
                    key,
                    value,
                },
                Replay::Exact,
            )?;
        }
    }
    let pos = encode_position(&x.replid, x.offset);
    store.replay(
        &mut rw,
        Op::Put {
            db: DB_META,
            key: REPL_KEY,
            value: &pos,
        },
        Replay::Exact,
    )?;
    let id = rw.id();
    rw.commit()
        .map_err(|e| format!("cannot commit the copy: {e}"))?;
    // What the commit wrote, before the checkpoint's fdatasync would write it all at once.
    write_back(data);
    Ok((id, records))
}

/// Bytes of a copy's records between two writebacks of the data file.
const WRITEBACK_EVERY: usize = 32 << 20;

/// Writes the data file's dirty pages (those LMDB has written: its spills during the copy's
/// transaction, then its commit) and waits for them, without a flush of the disk's cache (the
/// checkpoint's fdatasync does that). A copy left to the kernel reaches the disk in bursts of
/// hundreds of megabytes, behind which every fdatasync of a primary sharing the disk waits;
/// written here, it goes in steps of `WRITEBACK_EVERY` bytes of the file, and the copy goes at
/// the pace the disk allows. An error here is reported again by that fdatasync (the
/// kernel keeps it for the file), which fails the install.
fn write_back(data: &std::fs::File) {
    use std::os::fd::AsRawFd;
    let len = data.metadata().map_or(0, |m| m.len());
    let mut at = 0u64;
    while at < len {
        let n = (WRITEBACK_EVERY as u64).min(len - at);
        // SAFETY: a system call on a file descriptor `data` owns; no memory is passed.
        let r = unsafe {
            libc::sync_file_range(
                data.as_raw_fd(),
                at as libc::off64_t,
                n as libc::off64_t,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            )
        };
        if r != 0 {
            log::debug!(
                "full copy: writeback of the data file: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        at += n;
    }
}
