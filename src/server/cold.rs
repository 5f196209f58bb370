//! Reader threads that read values not in memory for the event loops.
//!
//! Where the kernel allows, each worker reads its cold records itself, asynchronously, on an
//! io_uring of its own (`uring.rs`), which costs no thread hand-off; these threads read for
//! the workers that have none, and take the jobs a ring has no room for.
//!
//! A worker that finds a large record not in memory (`storage/resident.rs`) leaves the request
//! in the connection's input (or keeps its resume point), hands the keys to this pool, and
//! serves other connections. A reader thread opens its own snapshot (an LMDB read transaction
//! and the overlay, like a worker's pass), looks each key up, and `pread`s the record from
//! `data.mdb` into memory of its own while the transaction keeps those pages from being
//! reused. The worker's next pass runs the request again and answers from those records (the
//! snapshot it read them in is no older than any write the connection saw acknowledged: it
//! was opened after the request arrived).
//!
//! Why `pread` and not the map: a page read through the map stays mapped into this process,
//! and under a memory cap the kernel must unmap such pages again (page-table walks, TLB
//! shootdowns on every core) before it can reuse them; pages that were only `pread` are
//! reclaimed cheaply. fio on this machine: 16 threads of random 20 KiB reads under a 1 GiB cap
//! do about 3x more through `pread` than through a map with `MADV_RANDOM`.
//!
//! Records held for connections count against `HELD_MAX`; past it a reader only brings the
//! pages into the page cache, and the request reads them through the map.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use log::{debug, warn};

use super::worker::WorkerHandle;
use crate::storage::lmdb::LmdbStore;
use crate::storage::overlay::Snap;
use crate::storage::resident::Fetched;

/// Bytes one `pread` reads at most when it only warms the page cache.
const CHUNK: usize = 64 << 10;
/// Record bytes all connections may hold at once, read but not yet answered.
pub(super) const HELD_MAX: usize = 16 << 20;
/// Record bytes one job reads to hold (its first record always): the rest of a long multi-get
/// is looked up again when it runs.
pub(super) const JOB_MAX: usize = 4 << 20;

/// One connection's wait: the keys to read, and who to tell.
pub struct Job {
    pub worker: usize,
    pub slot: u32,
    pub epoch: u32,
    pub keys: Vec<Box<[u8]>>,
}

/// What `stats` shows of the pool.
#[derive(Debug, Default)]
pub struct ColdStats {
    /// Requests that waited for a reader.
    pub waits: AtomicU64,
    /// Of those, the ones whose records a worker's ring read (`uring.rs`).
    pub ring_waits: AtomicU64,
    /// Of the records read on the rings, those read bypassing the page cache (`uring.rs`).
    pub direct: AtomicU64,
    /// Records the readers read.
    pub records: AtomicU64,
    /// Bytes the readers read.
    pub bytes: AtomicU64,
    /// Reads that failed (the request then runs and touches the map itself).
    pub errors: AtomicU64,
}

struct Inner {
    queue: Mutex<VecDeque<Job>>,
    ready: Condvar,
    stop: AtomicBool,
    store: LmdbStore,
    file: File,
    /// `file` opened with `O_DIRECT` (`open_direct`), for the rings.
    direct: Option<File>,
    workers: Vec<Arc<WorkerHandle>>,
    stats: ColdStats,
    /// Bytes of records read and not yet answered (`Fetched` keeps this up to date).
    held: Arc<AtomicUsize>,
}

/// The reader pool; none when `io_threads` is 0 (reads then fault in the event loop).
pub struct ColdPool {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl ColdPool {
    /// Opens the data file the readers read: before the server drops root (`-u`), as LMDB
    /// opened it.
    pub fn open_file(data_dir: &Path) -> std::io::Result<File> {
        File::open(data_dir.join("data.mdb"))
    }

    /// The data file opened again with `O_DIRECT`, for the rings' first reads of a record
    /// (`uring.rs`); None where the file system refuses it (tmpfs, some FUSE file systems) or
    /// `MEMKEEP_COLD_DIRECT=0`: every read then goes through the page cache.
    pub fn open_direct(data_dir: &Path) -> Option<File> {
        use std::os::unix::fs::OpenOptionsExt;
        if std::env::var_os("MEMKEEP_COLD_DIRECT").is_some_and(|v| v == "0") {
            return None;
        }
        let path = data_dir.join("data.mdb");
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
        {
            Ok(f) => Some(f),
            Err(e) => {
                debug!("{}: no O_DIRECT reads ({e})", path.display());
                None
            }
        }
    }

    /// Starts `threads` readers of `store`, whose data file is `file` (`open_file`).
    pub fn start(
        store: LmdbStore,
        file: File,
        direct: Option<File>,
        threads: usize,
        workers: Vec<Arc<WorkerHandle>>,
    ) -> std::io::Result<ColdPool> {
        // Random reads: no readahead on this descriptor, which would read (and, under a memory
        // cap, evict for) pages nobody asked for.
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid descriptor; advice only.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        }
        let inner = Arc::new(Inner {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            store,
            file,
            direct,
            workers,
            stats: ColdStats::default(),
            held: Arc::new(AtomicUsize::new(0)),
        });
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let inner = inner.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("memkeep-reader-{i}"))
                    .spawn(move || inner.run())?,
            );
        }
        Ok(ColdPool {
            inner,
            threads: Mutex::new(handles),
        })
    }

    /// Queues a connection's keys; its worker hears back through `WorkerHandle::warmed`.
    pub fn submit(&self, job: Job) {
        self.inner.stats.waits.fetch_add(1, Ordering::Relaxed);
        self.inner
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(job);
        self.inner.ready.notify_one();
    }

    pub fn stats(&self) -> &ColdStats {
        &self.inner.stats
    }

    /// The budget of held records, which the workers' rings (`uring.rs`) share.
    pub fn held(&self) -> Arc<AtomicUsize> {
        self.inner.held.clone()
    }

    /// Another descriptor of the data file (the same open file, so the same advice), for a
    /// worker's ring.
    pub fn file(&self) -> std::io::Result<File> {
        self.inner.file.try_clone()
    }

    /// Another descriptor of the `O_DIRECT` data file, if there is one.
    pub fn direct_file(&self) -> Option<File> {
        self.inner.direct.as_ref().and_then(|f| f.try_clone().ok())
    }

    /// Stops the readers (queued jobs are dropped: their connections are closing too).
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.ready.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            if t.join().is_err() {
                warn!("a reader thread panicked");
            }
        }
    }
}

impl Inner {
    fn run(&self) {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let job = {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    if let Some(job) = q.pop_front() {
                        break job;
                    }
                    q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let fetched = self.fetch(&job.keys, &mut buf);
            if let Some(h) = self.workers.get(job.worker) {
                let mut warmed = h.warmed.lock().unwrap_or_else(|p| p.into_inner());
                // A list that was not empty has a wake-up on its way already: the worker takes
                // the whole list when it wakes.
                let wake = warmed.is_empty();
                warmed.push((job.slot, job.epoch, fetched));
                drop(warmed);
                if wake {
                    h.mailbox.wake();
                }
            }
        }
    }

    /// Reads the records of `keys` from a fresh snapshot: into records of their own while
    /// the budget allows, else only into the page cache.
    fn fetch(&self, keys: &[Box<[u8]>], buf: &mut [u8]) -> Vec<Fetched> {
        let mut out: Vec<Fetched> = Vec::new();
        let snap = match Snap::open(&self.store) {
            Ok(s) => s,
            Err(e) => {
                debug!("reader: no snapshot: {e}");
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                return out;
            }
        };
        let mut job_bytes = 0usize;
        for key in keys {
            if out.iter().any(|f| f.key == *key) {
                continue;
            }
            let record = match snap.record(key) {
                Ok(Some(r)) => r,
                // Gone since, or unreadable: the request's own lookup will say so.
                _ => continue,
            };
            if let Some((header, p)) = crate::storage::item::inline_header(record) {
                self.fetch_from_log(key, header, &p, buf, &mut job_bytes, &mut out);
                continue;
            }
            // A record in the overlay (on the heap) needs no reading.
            let Some(offset) = self.store.file_offset(record) else {
                continue;
            };
            let len = record.len();
            let room = self.held.load(Ordering::Relaxed) + len <= HELD_MAX
                && (out.is_empty() || job_bytes + len <= JOB_MAX);
            if room {
                let mut data = vec![0u8; len].into_boxed_slice();
                if self.read_at(&mut data, offset) {
                    job_bytes += len;
                    out.push(Fetched::new(key, data, self.held.clone()));
                }
            } else {
                // Over the budget: warm the page cache only.
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(buf.len());
                    if !self.read_at(&mut buf[..n], offset + done as u64) {
                        break;
                    }
                    done += n;
                }
            }
        }
        out
    }

    /// `fetch` for a value in the log (`storage/vlog.rs`): the item rebuilt inline (`header`
    /// and the value read from its segment) into `out` while the budget allows, else the
    /// value only read into the page cache.
    fn fetch_from_log(
        &self,
        key: &[u8],
        header: Vec<u8>,
        p: &crate::storage::vlog::Pointer,
        buf: &mut [u8],
        job_bytes: &mut usize,
        out: &mut Vec<Fetched>,
    ) {
        let Some(vlog) = self.store.vlog() else {
            return;
        };
        let len = header.len() + p.len as usize;
        let room = self.held.load(Ordering::Relaxed) + len <= HELD_MAX
            && (out.is_empty() || *job_bytes + len <= JOB_MAX);
        let counted = |r: std::io::Result<()>, n: usize| match r {
            Ok(()) => {
                self.stats.records.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
                true
            }
            Err(e) => {
                debug!("reading a value of {} bytes in the log: {e}", p.len);
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                false
            }
        };
        if room {
            let mut data = header;
            let n = data.len();
            data.resize(len, 0);
            if counted(vlog.read_value(p, &mut data[n..]), p.len as usize) {
                *job_bytes += len;
                out.push(Fetched::new(
                    key,
                    data.into_boxed_slice(),
                    self.held.clone(),
                ));
            }
        } else {
            // Over the budget: warm the page cache only.
            let mut done = 0u32;
            while done < p.len {
                let n = ((p.len - done) as usize).min(buf.len());
                let part = crate::storage::vlog::Pointer {
                    offset: p.offset + u64::from(done),
                    len: n as u32,
                    ..*p
                };
                if !counted(vlog.read_value(&part, &mut buf[..n]), n) {
                    break;
                }
                done += n as u32;
            }
        }
    }

    /// Fills `data` from the file at `offset`; false (counted) if it cannot.
    fn read_at(&self, data: &mut [u8], offset: u64) -> bool {
        match self.file.read_exact_at(data, offset) {
            Ok(()) => {
                self.stats.records.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                true
            }
            Err(e) => {
                debug!("reading {} bytes at {offset}: {e}", data.len());
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}
