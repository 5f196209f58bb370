//! Whether a record LMDB hands out is in memory, so an event loop never waits on the disk.
//!
//! LMDB returns a value as a pointer into its read-only map of `data.mdb`. A value larger than
//! about half a page lives in overflow pages of its own, and LMDB finds it without touching
//! them (the leaf node holds the first page's number; the pointer is arithmetic). Touching a
//! page that is not in the page cache makes the touching thread wait for the disk: with data
//! larger than memory that is most reads, and an event loop that waits serves nobody else.
//! So before a reply touches a large record, the worker asks `mincore(2)` whether its pages
//! are resident; when some are not, the request waits while a reader thread
//! (`server/cold.rs`) reads the record with `pread` and hands it over, and runs again in a
//! later pass.
//!
//! Small records sit in the leaf page the lookup itself read, so they are never checked: the
//! in-memory paths pay nothing.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Records shorter than this are not checked: they live inside a leaf page (LMDB moves a
/// record to overflow pages only past about half a page), which the lookup has just read.
pub const CHECK_FROM: usize = 1024;

/// The most pages one `mincore` call looks at (its result vector lives on the stack).
const PAGES_PER_CALL: usize = 256;

/// After this many checks in a row on one thread found everything resident (the data fits in
/// memory), only one check in `SAMPLE_EVERY` is made: a `mincore` call costs about a microsecond,
/// a tenth of what serving a 20 KiB value from memory costs. The first cold record found turns
/// every check back on; until then a value that went cold may be read in the event loop, as
/// without these checks.
const SAMPLE_AFTER: u32 = 4096;
const SAMPLE_EVERY: u32 = 16;

thread_local! {
    /// Checks in a row on this thread that found the record resident.
    static HOT_RUN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Where `data.mdb` is mapped in this process.
#[derive(Debug, Clone, Copy)]
pub struct MapSpan {
    base: usize,
    len: usize,
    page: usize,
    /// Tests: every checked record reads as cold (`MEMKEEP_TEST_ALL_COLD=1`), so that the
    /// reader threads' path runs for every large value without a memory-starved machine.
    all_cold: bool,
}

/// A record a reader thread read from `data.mdb` for a connection, held until the request
/// that asked for it runs again (see `server/cold.rs`). What it holds counts against a shared
/// budget (`held`) until it is dropped.
///
/// The record is `buf[start..start + len]`: a read that bypasses the page cache (`O_DIRECT`,
/// `server/uring.rs`) reads whole blocks into an aligned span of `buf`, of which the record is
/// a part.
pub struct Fetched {
    pub key: Box<[u8]>,
    buf: Box<[u8]>,
    start: usize,
    len: usize,
    held: Arc<AtomicUsize>,
}

impl Fetched {
    /// `record` is the record, whole.
    pub fn new(key: &[u8], record: Box<[u8]>, held: Arc<AtomicUsize>) -> Fetched {
        let len = record.len();
        Fetched::within(key, record, 0, len, held)
    }

    /// The record is `buf[start..start + len]` (clamped to `buf`).
    pub fn within(
        key: &[u8],
        buf: Box<[u8]>,
        start: usize,
        len: usize,
        held: Arc<AtomicUsize>,
    ) -> Fetched {
        held.fetch_add(buf.len(), Ordering::Relaxed);
        let start = start.min(buf.len());
        let len = len.min(buf.len() - start);
        Fetched {
            key: key.into(),
            buf,
            start,
            len,
            held,
        }
    }

    /// The record's bytes.
    pub fn record(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    /// The whole buffer, for the kernel to fill (the record is a span of it).
    pub fn buf_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for Fetched {
    fn drop(&mut self) {
        self.held.fetch_sub(self.buf.len(), Ordering::Relaxed);
    }
}

impl MapSpan {
    /// Finds the mapping of `file` that holds `inside` (any pointer LMDB returned from the
    /// environment), from `/proc/self/maps`. None where that is unreadable (not Linux): the
    /// checks are then off and reads touch the map directly, as before.
    pub fn find(file: &Path, inside: *const u8) -> Option<MapSpan> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let want = std::fs::canonicalize(file).ok()?;
        let at = inside as usize;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
        for line in maps.lines() {
            // start-end perms offset dev inode path
            let mut fields = line.split_whitespace();
            let (Some(range), Some(_perms), Some(offset), Some(_dev), Some(_inode)) = (
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
            ) else {
                continue;
            };
            let path: Vec<&str> = fields.collect();
            if path.join(" ") != want.to_string_lossy()
                || !offset.trim_start_matches('0').is_empty()
            {
                continue;
            }
            let Some((lo, hi)) = range.split_once('-') else {
                continue;
            };
            let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            else {
                continue;
            };
            if (lo..hi).contains(&at) {
                return Some(MapSpan {
                    base: lo,
                    len: hi - lo,
                    page,
                    all_cold: std::env::var_os("MEMKEEP_TEST_ALL_COLD").is_some_and(|v| v == "1"),
                });
            }
        }
        None
    }

    /// Where `record` (borrowed from the map) starts in the file; None for a record that
    /// lives elsewhere (the overlay's, on the heap).
    pub fn offset(&self, record: &[u8]) -> Option<u64> {
        let at = record.as_ptr() as usize;
        (at >= self.base && at + record.len() <= self.base + self.len)
            .then(|| (at - self.base) as u64)
    }

    /// Whether some page of `record` is not resident. Records below `CHECK_FROM` bytes, and
    /// records that live elsewhere (the overlay's, on the heap), are never cold.
    pub fn cold(&self, record: &[u8]) -> bool {
        let at = record.as_ptr() as usize;
        if record.len() < CHECK_FROM || self.offset(record).is_none() {
            return false;
        }
        if self.all_cold {
            return true;
        }
        sampled_cold(at, record.len(), self.page)
    }
}

/// Whether some page (of `page` bytes) of the mapped range [at, at + len) is not resident, by
/// `mincore`, sampled once everything has been resident for long (see `SAMPLE_AFTER`); false
/// when the kernel cannot tell. The run of hot checks is the thread's, whichever file the
/// range maps (`data.mdb` here, log segments in `vlog.rs`).
pub fn sampled_cold(at: usize, len: usize, page: usize) -> bool {
    // Past SAMPLE_AFTER the run counts round SAMPLE_AFTER..SAMPLE_AFTER + SAMPLE_EVERY,
    // checking when it comes back to the start.
    let run = HOT_RUN.get();
    let next = if run >= SAMPLE_AFTER {
        SAMPLE_AFTER + (run - SAMPLE_AFTER + 1) % SAMPLE_EVERY
    } else {
        run + 1
    };
    if run >= SAMPLE_AFTER && next != SAMPLE_AFTER {
        HOT_RUN.set(next);
        return false;
    }
    // Cannot tell: read it as before.
    let cold = resident(at, len, page).is_some_and(|all| !all);
    HOT_RUN.set(if cold { 0 } else { next });
    cold
}

/// Whether every page (of `page` bytes) holding [at, at + len) is resident in memory, by
/// `mincore(2)`; None when the kernel cannot tell (part of the range is not mapped).
pub fn resident(at: usize, len: usize, page: usize) -> Option<bool> {
    let start = at & !(page - 1);
    let end = at + len.max(1);
    let pages = (end - start).div_ceil(page);
    let mut vec = [0u8; PAGES_PER_CALL];
    let mut done = 0;
    while done < pages {
        let n = (pages - done).min(PAGES_PER_CALL);
        let addr = start + done * page;
        // SAFETY: mincore reads no memory of ours: it reports on the pages of [addr, addr + n
        // pages) into `vec`, which has room for n entries, and fails with ENOMEM, harmlessly,
        // where nothing is mapped.
        let rc =
            unsafe { libc::mincore(addr as *mut libc::c_void, n * page, vec.as_mut_ptr().cast()) };
        if rc != 0 {
            return None;
        }
        if vec[..n].iter().any(|&b| b & 1 == 0) {
            return Some(false);
        }
        done += n;
    }
    Some(true)
}

/// Asks the kernel to start reading the page holding address `at` (`MADV_WILLNEED`), without
/// waiting for it. Advice only: where nothing is mapped it fails, harmlessly.
pub fn will_need(at: usize, page: usize) {
    let start = at & !(page - 1);
    // SAFETY: madvise with MADV_WILLNEED changes no memory: it schedules a read of the file
    // pages behind [start, start + page) into the page cache, or fails with ENOMEM where
    // nothing is mapped; its result does not matter.
    unsafe {
        libc::madvise(start as *mut libc::c_void, page, libc::MADV_WILLNEED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// A file of `pages` pages on a disk file system, mapped read-only, and its span.
    fn mapped(pages: usize) -> (tempfile::NamedTempFile, *const u8, MapSpan) {
        let mut f = tempfile::NamedTempFile::new_in("/var/tmp").expect("temp file");
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        f.write_all(&vec![7u8; pages * page]).expect("write");
        f.as_file().sync_all().expect("fsync");
        // SAFETY: a read-only shared map of a file we keep open for the test's length.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * page,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_file().as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        let span = MapSpan::find(f.path(), addr as *const u8).expect("mapping found");
        assert_eq!(span.base, addr as usize);
        (f, addr as *const u8, span)
    }

    fn evict(f: &tempfile::NamedTempFile) {
        // SAFETY: a valid descriptor; advice only.
        let rc = unsafe {
            libc::posix_fadvise(f.as_file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
        };
        assert_eq!(rc, 0);
    }

    #[test]
    fn finds_cold_records_and_samples_once_everything_has_been_resident_for_long() {
        let (f, addr, span) = mapped(16);
        // SAFETY: the first 8 pages of the map, which stays for the test.
        let record = unsafe { std::slice::from_raw_parts(addr.add(100), 8 * span.page) };
        std::thread::spawn(move || {
            evict(&f);
            assert!(span.cold(record), "an evicted record reads as cold");
            // Read in (through the file), it is resident.
            let mut buf = vec![0u8; 9 * span.page];
            std::os::unix::fs::FileExt::read_at(f.as_file(), &mut buf, 0).expect("read");
            for i in 0..SAMPLE_AFTER {
                assert!(!span.cold(record), "resident, check {i}");
            }
            // Now only one check in SAMPLE_EVERY looks: an eviction is seen within that many.
            evict(&f);
            let seen = (0..SAMPLE_EVERY).filter(|_| span.cold(record)).count();
            assert_eq!(seen, 1, "one sampled check sees the eviction");
            // And from then on every check looks again.
            for _ in 0..3 {
                assert!(span.cold(record));
            }
            // Small records and pointers outside the map are never cold.
            assert!(!span.cold(&record[..CHECK_FROM - 1]));
            assert!(!span.cold(&vec![0u8; 4 * CHECK_FROM]));
            drop(f);
        })
        .join()
        .expect("test thread");
    }

    /// `will_need` starts the read of a page evicted from the page cache without touching it:
    /// the page becomes resident by itself (bounded wait; the read is the kernel's).
    #[test]
    fn will_need_brings_an_evicted_page_in() {
        let (f, addr, span) = mapped(8);
        evict(&f);
        let at = addr as usize + 3 * span.page + 10;
        assert_eq!(resident(at, 1, span.page), Some(false));
        will_need(at, span.page);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while resident(at, 1, span.page) != Some(true) {
            assert!(std::time::Instant::now() < deadline, "still not resident");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(f);
    }
}
