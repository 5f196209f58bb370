//! A worker's own asynchronous reads of records not in memory, through an io_uring.
//!
//! The reader threads (`cold.rs`) cost each cold GET three context switches besides the
//! disk's: a reader woken for the job, the reader put to sleep by its `pread`, and the worker
//! woken with the result; with 16 readers on two cores those switches, and the futex and
//! eventfd calls that make them, were about a third of the server's CPU per cold GET (perf, 20
//! KiB values, 1 GiB-class memory cap). Here the worker itself queues a read of each cold
//! record (its offset and length in `data.mdb`, as the pass's snapshot found them) on a ring of
//! its own, submits all that one pass queued in one system call (one block-layer plug for
//! them), and goes on serving other connections. A buffered read whose pages are not cached
//! does not block the submitter: the kernel starts the disk read and finishes the copy when the
//! pages arrive, and the ring's descriptor, registered with the worker's poll, becomes
//! readable. The worker then hands each record to its connection, whose request runs again
//! when all of its reads are back, exactly as with a reader thread's records.
//!
//! The snapshot's LMDB read transaction stays open until its reads are back (`KeptTxn`):
//! until then the writer cannot reuse the pages being read, so a record read late is still the
//! one the snapshot saw.
//!
//! Where the kernel has no io_uring (or refuses it), the worker uses the reader threads; a job
//! the ring has no room for (reads in flight, transactions kept, or the held-record budget)
//! goes to them too.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use io_uring::{IoUring, opcode, types};
use log::{debug, warn};
use slab::Slab;

use super::cold::{ColdStats, HELD_MAX, JOB_MAX};
use crate::storage::overlay::{ColdKey, KeptTxn};
use crate::storage::resident::Fetched;

/// Reads one worker may have in flight (the ring's submission entries; its completion queue
/// is twice that, so it never overflows).
const ENTRIES: u32 = 64;
/// Read transactions one worker may keep open for reads in flight (each is an LMDB reader
/// slot: `server/mod.rs` sizes the table for it).
pub const TXNS_MAX: usize = 16;
/// What a read that bypasses the page cache aligns its offset, length and buffer to: the
/// largest logical block size of common disks (512 and 4096 both divide it).
const ALIGN: usize = 4096;
/// Records remembered per ring as read once from the disk (see `Seen`).
const SEEN_SLOTS: usize = 1 << 14;

/// Where a record read from the disk has been read before, recently: a direct-mapped table of
/// record offsets. The first cold read of a record bypasses the page cache; a second one,
/// while the first is still remembered, goes through it, so a record read again and again
/// stays in memory and is served from the map, while records read once (a scan, or random
/// reads over data much larger than memory) do not push it out.
struct Seen {
    slots: Box<[u64]>,
}

impl Seen {
    fn new() -> Seen {
        Seen {
            slots: vec![0u64; SEEN_SLOTS].into_boxed_slice(),
        }
    }

    /// Whether `offset` was remembered (it is forgotten then: the read that follows brings it
    /// into memory); else it is remembered, in place of whatever shared its slot.
    fn again(&mut self, offset: u64) -> bool {
        let tag = offset | 1 << 63;
        // Fibonacci hashing of the page number.
        let i = ((offset >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 50) as usize;
        let slot = &mut self.slots[i % SEEN_SLOTS];
        if *slot == tag {
            *slot = 0;
            true
        } else {
            *slot = tag;
            false
        }
    }
}

/// One read in flight: whose it is, the memory the kernel fills, and the transaction that
/// keeps the record's pages from being reused until it is done.
struct Read {
    slot: u32,
    epoch: u32,
    record: Fetched,
    /// For a value in the log: the item's header, which goes in front of the value read.
    prefix: Option<Vec<u8>>,
    /// Bytes the read must return: the record's end within the buffer read into.
    need: usize,
    /// Whether it bypasses the page cache.
    direct: bool,
    txn: KeptTxn,
}

/// A finished read: the record for connection (slot, epoch), or None when it failed.
pub struct Done {
    pub slot: u32,
    pub epoch: u32,
    pub record: Option<Fetched>,
}

pub struct ColdRing {
    ring: IoUring,
    file: File,
    /// The same file opened with `O_DIRECT`, where the file system allows it: first reads of
    /// a record go to the disk without passing through the page cache (`Seen`).
    direct: Option<File>,
    /// Direct reads were refused (EINVAL): every read is buffered from then on. `direct` stays
    /// open: reads queued on it may still be in the ring, and its number must not be reused.
    direct_off: bool,
    seen: Seen,
    reads: Slab<Read>,
    /// Distinct transactions the reads in flight keep open.
    txns: Vec<KeptTxn>,
    /// Entries queued and not yet submitted.
    queued: usize,
    held: Arc<AtomicUsize>,
}

impl ColdRing {
    /// A ring reading `file` (`data.mdb`), whose records count against `held` (the reader
    /// pool's budget). Fails where the kernel has no io_uring or refuses one.
    ///
    /// `direct`, when given, is `file` opened with `O_DIRECT`. Why bypass the page cache: a
    /// buffered read of a cold record allocates page-cache pages for it, and under a memory
    /// cap that means reclaiming as many first, then copies the record out of them; perf of 20
    /// KiB random GETs under a 512 MiB cap put that at a third of the server's CPU per GET. A
    /// direct read has the disk write into our buffer and nothing else. It is coherent with
    /// LMDB's writes: the kernel writes back any dirty cached page of the range first, and the
    /// kept transaction stops the writer from touching the record's pages meanwhile.
    pub fn new(
        file: File,
        direct: Option<File>,
        held: Arc<AtomicUsize>,
    ) -> std::io::Result<ColdRing> {
        // Cooperative task running (Linux 5.19): a finished read does not interrupt the worker
        // with an IPI while it runs; the copy into our buffer completes at its next system call
        // (a sleeping worker is still woken). Older kernels refuse the flag: a plain ring.
        let ring = match IoUring::builder().setup_coop_taskrun().build(ENTRIES) {
            Ok(r) => r,
            Err(_) => IoUring::new(ENTRIES)?,
        };
        // Random reads: no readahead on this descriptor (see `ColdPool::start`).
        // SAFETY: a valid descriptor; advice only.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        Ok(ColdRing {
            ring,
            file,
            direct,
            direct_off: false,
            seen: Seen::new(),
            reads: Slab::with_capacity(ENTRIES as usize),
            txns: Vec::new(),
            queued: 0,
            held,
        })
    }

    /// The ring's descriptor: readable when reads have finished.
    pub fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Queues reads of the records of `cold` for connection (slot, epoch), found in the
    /// snapshot of `txn`: the first always, the others while the job stays under `JOB_MAX`
    /// (the rest are looked up again when the request runs). Returns how many were queued, or
    /// gives `cold` back when the ring cannot take it (no room, or the budget is spent).
    pub fn queue(
        &mut self,
        slot: u32,
        epoch: u32,
        cold: Vec<ColdKey>,
        txn: KeptTxn,
    ) -> Result<usize, Vec<ColdKey>> {
        let Some(first) = cold.first() else {
            return Ok(0);
        };
        let room = (ENTRIES as usize).saturating_sub(self.reads.len());
        if room == 0 || self.held.load(Ordering::Relaxed) + first.len > HELD_MAX {
            return Err(cold);
        }
        if !self.txns.iter().any(|t| Rc::ptr_eq(t, &txn)) {
            // Transactions no read needs any more are closed.
            self.txns.retain(|t| Rc::strong_count(t) > 1);
            if self.txns.len() >= TXNS_MAX {
                return Err(cold);
            }
            self.txns.push(txn.clone());
        }
        let mut job_bytes = 0usize;
        let mut n = 0usize;
        for (i, c) in cold.iter().enumerate() {
            if n == room
                || (i > 0 && job_bytes + c.len > JOB_MAX)
                || (i > 0 && cold[..i].iter().any(|d| d.key == c.key))
            {
                continue;
            }
            if i > 0 && self.held.load(Ordering::Relaxed) + c.len > HELD_MAX {
                continue;
            }
            // A record read from the disk for the first time (lately) bypasses the page cache.
            // A value in the log (`vlog.rs`) is read from its segment, into a record of its own
            // that the item's header is put in front of when the read is done (`prefix`).
            let (direct_fd, buffered_fd, len, prefix) = match &c.in_log {
                Some(l) => (
                    l.direct,
                    l.fd,
                    c.len.saturating_sub(l.header.len()),
                    Some(l.header.clone()),
                ),
                None => (
                    self.direct.as_ref().map(|f| f.as_raw_fd()),
                    self.file.as_raw_fd(),
                    c.len,
                    None,
                ),
            };
            let direct = match direct_fd {
                // (Values in the log and records of data.mdb share `seen`: a collision only
                // changes how one read is made.)
                Some(fd) if !self.direct_off && !self.seen.again(c.offset) => Some(fd),
                _ => None,
            };
            let (fd, mut record, at, need, span, pad) = match direct {
                Some(fd) => {
                    // Whole blocks around the record, into an aligned span of the buffer.
                    let from = c.offset & !(ALIGN as u64 - 1);
                    let lead = (c.offset - from) as usize;
                    let span = (lead + len).div_ceil(ALIGN) * ALIGN;
                    let buf = vec![0u8; span + ALIGN].into_boxed_slice();
                    let pad = (ALIGN - buf.as_ptr() as usize % ALIGN) % ALIGN;
                    let record = Fetched::within(&c.key, buf, pad + lead, len, self.held.clone());
                    (fd, record, from, lead + len, span, pad)
                }
                None => {
                    let record =
                        Fetched::new(&c.key, vec![0u8; len].into_boxed_slice(), self.held.clone());
                    (buffered_fd, record, c.offset, len, len, 0)
                }
            };
            let Ok(span32) = u32::try_from(span) else {
                continue;
            };
            let buf = record.buf_mut()[pad..].as_mut_ptr();
            let entry = self.reads.vacant_entry();
            let sqe = opcode::Read::new(types::Fd(fd), buf, span32)
                .offset(at)
                .build()
                .user_data(entry.key() as u64);
            // SAFETY: the buffer is the record's, a heap allocation that the `Read` in `reads`
            // owns (moving the box does not move it) and frees only once the read's
            // completion has come back (or never: see `Drop`); `span` bytes from `pad` lie
            // inside it; the descriptors are `file`'s and `direct`'s, open as long as the ring.
            if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                break;
            }
            entry.insert(Read {
                slot,
                epoch,
                record,
                prefix,
                need,
                direct: direct.is_some(),
                txn: txn.clone(),
            });
            job_bytes += c.len;
            n += 1;
        }
        if n == 0 {
            return Err(cold);
        }
        self.queued += n;
        Ok(n)
    }

    /// Submits what `queue` queued, in one system call. False when the kernel took none
    /// (they stay queued: the caller retries soon).
    pub fn submit(&mut self) -> bool {
        if self.queued == 0 {
            return true;
        }
        match self.ring.submit() {
            Ok(n) => {
                self.queued = self.queued.saturating_sub(n);
                self.queued == 0
            }
            Err(e) => {
                debug!("io_uring submit: {e}");
                false
            }
        }
    }

    /// Whether reads are in flight (whose completions may be waiting).
    pub fn in_flight(&self) -> bool {
        !self.reads.is_empty()
    }

    /// Entries queued but not yet taken by the kernel.
    pub fn pending_submit(&self) -> bool {
        self.queued > 0
    }

    /// Takes the reads that have finished into `out`, counting them in `stats`.
    pub fn complete(&mut self, out: &mut Vec<Done>, stats: &ColdStats) {
        for cqe in self.ring.completion() {
            let Some(read) = self.reads.try_remove(cqe.user_data() as usize) else {
                continue;
            };
            let want = read.need;
            let res = cqe.result();
            let record = if res >= 0 && res as usize >= want {
                stats.records.fetch_add(1, Ordering::Relaxed);
                stats
                    .bytes
                    .fetch_add(read.record.record().len() as u64, Ordering::Relaxed);
                if read.direct {
                    stats.direct.fetch_add(1, Ordering::Relaxed);
                }
                match read.prefix {
                    None => Some(read.record),
                    Some(mut item) => {
                        item.extend_from_slice(read.record.record());
                        let key = read.record.key.clone();
                        drop(read.record);
                        Some(Fetched::new(
                            &key,
                            item.into_boxed_slice(),
                            self.held.clone(),
                        ))
                    }
                }
            } else {
                // Failed or short (the record is inside the file, so short means the file
                // changed under us): the request's own lookup reads it in time.
                debug!("io_uring read of {want} bytes: result {res}");
                if read.direct && res == -libc::EINVAL && !self.direct_off {
                    self.direct_off = true;
                    // The file system or device wants another alignment: buffered reads only.
                    warn!("direct reads refused (EINVAL): reading through the page cache");
                }
                stats.errors.fetch_add(1, Ordering::Relaxed);
                None
            };
            drop(read.txn);
            out.push(Done {
                slot: read.slot,
                epoch: read.epoch,
                record,
            });
        }
        if self.reads.is_empty() {
            self.txns.clear();
        }
    }
}

impl Drop for ColdRing {
    fn drop(&mut self) {
        // The kernel may still write into the buffers of reads in flight: wait for them (a
        // read of the page cache or the disk is short), and should that fail, leak the
        // buffers rather than free memory the kernel may still fill.
        for _ in 0..100 {
            if self.reads.is_empty() {
                return;
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                debug!("io_uring wait at shutdown: {e}");
                break;
            }
            let done: Vec<usize> = self
                .ring
                .completion()
                .map(|c| c.user_data() as usize)
                .collect();
            for key in done {
                self.reads.try_remove(key);
            }
        }
        if !self.reads.is_empty() {
            warn!(
                "{} reads still in flight at shutdown: their buffers are not freed",
                self.reads.len()
            );
            std::mem::forget(std::mem::take(&mut self.reads));
        }
    }
}
