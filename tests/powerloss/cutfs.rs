//! cutfs: a FUSE file system for power-loss tests. It passes everything through to a backing
//! directory on the real disk, except that a write is not on the "disk" (the backing file)
//! until it is synced: each file keeps its unsynced writes in memory, as an overlay of 4 KiB
//! pages plus the file's logical size, and reads see the overlay first, then the backing file.
//! fsync/fdatasync of a file writes its dirty pages and size to the backing file (no real
//! fsync: a test's "disk" only has to survive the test's own simulated power cut); writes
//! through a file opened O_SYNC/O_DSYNC reach the backing file at once (and stay in the
//! overlay, which then agrees with it). The kernel follows each such write with an fsync of
//! its range, which reaches FUSE without the range: cutfs takes the first fsync on that handle
//! after a synchronous write for that one (a no-op, and never the one an `InNextFsync` cut
//! fires in), so an O_DSYNC write does not sync the rest of the file.
//!
//! A power cut is a `Cut` given through `Mounted::cut`:
//! - `DropAll`: freeze and forget every unsynced write;
//! - `RandomSubset(seed)`: freeze, write a seeded random subset of the dirty pages (each page
//!   independently; the order does not matter, the pages are disjoint) to the backing files and
//!   forget the rest;
//! - `InNextFsync(seed)`: arm; the next fsync/fdatasync of a file writes a random subset of
//!   that file's dirty pages, then the file system freezes and that fsync fails with EIO.
//!
//! When a file's size changed since its last sync (an extension, ftruncate or fallocate),
//! `RandomSubset`/`InNextFsync` persist the new size with probability 1/2 (a shrink then
//! happens before the pages are written); `DropAll` never does. Pages are written clipped to
//! the size the file ends up with.
//!
//! Frozen means every later request fails with EIO (release excepted, which cannot fail), so
//! nothing more reaches the backing directory. The test then kills its server, unmounts
//! (`Mounted::unmount`: a lazy unmount, which works on a frozen file system with a dead
//! server) and mounts a fresh `Mounted` on the same backing directory: that is the reboot; the
//! old mount's page cache goes with it.
//!
//! Simplifications, all on the safe side for a store that syncs its data files:
//! - namespace operations (create, mkdir, unlink, rmdir, rename) and metadata (mode, owner,
//!   times) are applied to the backing directory at once, as if every directory were synced
//!   right after each change; only file contents and sizes follow the unsynced model;
//! - fcntl locks are the kernel's (cutfs does not ask for FUSE_POSIX_LOCKS, so the kernel keeps
//!   them locally), and extended attributes are not supported;
//! - fallocate: mode 0 and FALLOC_FL_KEEP_SIZE change no data (only the size, for mode 0
//!   past the end); FALLOC_FL_ZERO_RANGE and FALLOC_FL_PUNCH_HOLE are unsynced writes of zeros;
//!   the other modes answer EOPNOTSUPP.
//!
//! The kernel sees the backing files' real inode numbers (the backing root's is FUSE's root,
//! 1). There is no direct I/O: the page cache is in use, so shared mappings work (LMDB maps
//! its data file read-only, or read-write with WRITE_MAP, and its lock file read-write); the
//! kernel's write-back of mapped pages arrives as ordinary unsynced writes, and msync(MS_SYNC)
//! arrives as an fsync.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    BackgroundSession, BsdFileFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, Session, TimeOrNow, WriteFlags,
};

use crate::model::Rng;

/// The overlay's page size.
pub const PAGE: u64 = 4096;
/// How long the kernel may cache attributes and entries: every change goes through cutfs, so
/// any TTL is coherent.
const TTL: Duration = Duration::from_secs(1);
/// How long `unmount` waits for the session threads to end.
const UNMOUNT_WAIT: Duration = Duration::from_secs(20);

/// A simulated power cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    DropAll,
    RandomSubset(u64),
    InNextFsync(u64),
}

/// What the file system did, for reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub writes: u64,
    pub sync_writes: u64,
    pub fsyncs: u64,
    /// Dirty pages at the cut: written to the backing files, and forgotten.
    pub cut_persisted: u64,
    pub cut_dropped: u64,
    /// Errors of the backing directory while persisting at a cut (they lose those pages).
    pub cut_errors: u64,
}

type Res<T> = Result<T, Errno>;

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

/// One file's unsynced state.
struct Unsynced {
    /// Read-write descriptor of the backing file.
    file: File,
    /// Dirty pages: page index -> the page as the file shows it now (zeros past `size`).
    pages: BTreeMap<u64, Box<[u8]>>,
    /// The logical size.
    size: u64,
    /// The backing file's length (what the file keeps at a cut if its size does not persist).
    backing_len: u64,
    /// Backing bytes from here on are not part of the current view (a shrink cut them off
    /// since the last sync): reads there see zeros unless a page is dirty. Never above `size`.
    backing_valid: u64,
}

/// `buf.len()` bytes at `off`, zeros past the end of the file.
fn read_full_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

impl Unsynced {
    fn new(file: File) -> io::Result<Unsynced> {
        let len = file.metadata()?.len();
        Ok(Unsynced {
            file,
            pages: BTreeMap::new(),
            size: len,
            backing_len: len,
            backing_valid: len,
        })
    }

    /// The page as the file shows it now, made dirty.
    fn page(&mut self, idx: u64) -> io::Result<&mut [u8]> {
        let (file, valid) = (&self.file, self.backing_valid);
        match self.pages.entry(idx) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => {
                let mut page = vec![0u8; PAGE as usize].into_boxed_slice();
                let start = idx * PAGE;
                if start < valid {
                    let n = PAGE.min(valid - start) as usize;
                    read_full_at(file, &mut page[..n], start)?;
                }
                Ok(e.insert(page))
            }
        }
    }

    fn read(&self, off: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = off.saturating_add(len).min(self.size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - off) as usize];
        let mut pos = off;
        while pos < end {
            let idx = pos / PAGE;
            let pstart = idx * PAGE;
            let pend = (pstart + PAGE).min(end);
            let dst = &mut out[(pos - off) as usize..(pend - off) as usize];
            if let Some(page) = self.pages.get(&idx) {
                dst.copy_from_slice(&page[(pos - pstart) as usize..(pend - pstart) as usize]);
            } else if pos < self.backing_valid {
                let n = (pend.min(self.backing_valid) - pos) as usize;
                read_full_at(&self.file, &mut dst[..n], pos)?;
            }
            pos = pend;
        }
        Ok(out)
    }

    fn write(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        let end = off + data.len() as u64;
        let mut pos = off;
        while pos < end {
            let idx = pos / PAGE;
            let pstart = idx * PAGE;
            let pend = (pstart + PAGE).min(end);
            let page = self.page(idx)?;
            page[(pos - pstart) as usize..(pend - pstart) as usize]
                .copy_from_slice(&data[(pos - off) as usize..(pend - off) as usize]);
            pos = pend;
        }
        self.size = self.size.max(end);
        Ok(())
    }

    /// Zeros [off, end) as an unsynced write (and grows the size to `end`), keeping no
    /// overlay page for whole pages that read as zeros already.
    fn zero(&mut self, off: u64, end: u64) -> io::Result<()> {
        let zeros = [0u8; PAGE as usize];
        let mut pos = off;
        while pos < end {
            let idx = pos / PAGE;
            let pstart = idx * PAGE;
            let pend = (pstart + PAGE).min(end);
            let whole = pos == pstart && pend == pstart + PAGE;
            if whole && !self.pages.contains_key(&idx) && pstart >= self.backing_valid {
                self.size = self.size.max(pend);
            } else {
                self.write(pos, &zeros[..(pend - pos) as usize])?;
            }
            pos = pend;
        }
        Ok(())
    }

    fn set_size(&mut self, size: u64) {
        if size < self.size {
            let keep = size.div_ceil(PAGE);
            self.pages.split_off(&keep);
            if !size.is_multiple_of(PAGE)
                && let Some(page) = self.pages.get_mut(&(size / PAGE))
            {
                page[(size % PAGE) as usize..].fill(0);
            }
            self.backing_valid = self.backing_valid.min(size);
        }
        self.size = size;
    }

    fn size_changed(&self) -> bool {
        self.size != self.backing_len || self.backing_valid < self.backing_len
    }

    /// Writes the pages `take` picks to the backing file, and the size if `new_size`; returns
    /// (pages written, pages forgotten).
    fn persist(
        &mut self,
        take: &mut dyn FnMut() -> bool,
        new_size: bool,
    ) -> io::Result<(u64, u64)> {
        let final_size = if new_size {
            self.size
        } else {
            self.backing_len
        };
        if new_size && self.backing_valid < self.backing_len {
            self.file.set_len(self.backing_valid)?;
        }
        let (mut written, mut dropped) = (0, 0);
        for (&idx, page) in &self.pages {
            let start = idx * PAGE;
            if !take() || start >= final_size {
                dropped += 1;
                continue;
            }
            let n = PAGE.min(final_size - start) as usize;
            self.file.write_all_at(&page[..n], start)?;
            written += 1;
        }
        if new_size && self.file.metadata()?.len() != final_size {
            self.file.set_len(final_size)?;
        }
        Ok((written, dropped))
    }

    fn persist_all(&mut self) -> io::Result<()> {
        self.persist(&mut || true, true).map(|_| ())
    }

    fn persist_subset(&mut self, rng: &mut Rng) -> io::Result<(u64, u64)> {
        let new_size = !self.size_changed() || rng.pct(50);
        self.persist(&mut || rng.pct(50), new_size)
    }
}

/// An open file.
struct Handle {
    ino: u64,
    file: File,
    writable: bool,
    /// Opened O_SYNC or O_DSYNC.
    sync: bool,
    /// A synchronous write went through this handle since its last fsync: the fsync the
    /// kernel sends after such a write (to sync its range, which cutfs did already) is due.
    dsync_pending: bool,
}

struct State {
    root: PathBuf,
    root_dev: u64,
    root_ino: u64,
    /// FUSE inode -> backing path.
    paths: HashMap<u64, PathBuf>,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    /// Files with unsynced writes or size changes.
    files: HashMap<u64, Unsynced>,
    /// When the file system froze (the moment of the cut).
    frozen: Option<Instant>,
    /// `InNextFsync`'s seed, while armed.
    armed: Option<u64>,
    stats: Stats,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs < 0 {
        return UNIX_EPOCH;
    }
    UNIX_EPOCH + Duration::new(secs as u64, nsecs.clamp(0, 999_999_999) as u32)
}

fn kind_of(md: &fs::Metadata) -> FileType {
    FileType::from_std(md.file_type()).unwrap_or(FileType::RegularFile)
}

fn cstr(p: &Path) -> Res<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

impl State {
    fn check(&self) -> Res<()> {
        if self.frozen.is_some() {
            Err(Errno::EIO)
        } else {
            Ok(())
        }
    }

    fn fuse_ino(&self, md: &fs::Metadata) -> Res<u64> {
        if md.ino() == self.root_ino && md.dev() == self.root_dev {
            Ok(1)
        } else if md.ino() == 1 || md.dev() != self.root_dev {
            // FUSE's root number, or another file system below the backing root.
            Err(Errno::EIO)
        } else {
            Ok(md.ino())
        }
    }

    fn path(&self, ino: u64) -> Res<PathBuf> {
        self.paths.get(&ino).cloned().ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Res<PathBuf> {
        Ok(self.path(parent)?.join(name))
    }

    fn attr(&self, ino: u64, md: &fs::Metadata) -> FileAttr {
        let size = self.files.get(&ino).map_or(md.len(), |u| u.size);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: md.blocks(),
            atime: time(md.atime(), md.atime_nsec()),
            mtime: time(md.mtime(), md.mtime_nsec()),
            ctime: time(md.ctime(), md.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: kind_of(md),
            perm: (md.mode() & 0o7777) as u16,
            nlink: md.nlink() as u32,
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Looks `path` up, remembers it, and returns its inode and attributes.
    fn entry(&mut self, path: PathBuf) -> Res<(u64, FileAttr)> {
        let md = fs::symlink_metadata(&path).map_err(errno)?;
        let ino = self.fuse_ino(&md)?;
        self.paths.insert(ino, path);
        Ok((ino, self.attr(ino, &md)))
    }

    fn metadata(&self, ino: u64, fh: Option<FileHandle>) -> Res<fs::Metadata> {
        if let Some(h) = fh.and_then(|fh| self.handles.get(&fh.0)) {
            return h.file.metadata().map_err(errno);
        }
        fs::symlink_metadata(self.path(ino)?).map_err(errno)
    }

    /// The file's unsynced state, made if it has none yet.
    fn unsynced(&mut self, ino: u64, fh: Option<FileHandle>) -> Res<&mut Unsynced> {
        if !self.files.contains_key(&ino) {
            let file = match fh.and_then(|fh| self.handles.get(&fh.0)) {
                Some(h) if h.writable && h.ino == ino => h.file.try_clone().map_err(errno)?,
                _ => OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(self.path(ino)?)
                    .map_err(errno)?,
            };
            let u = Unsynced::new(file).map_err(errno)?;
            self.files.insert(ino, u);
        }
        self.files.get_mut(&ino).ok_or(Errno::EIO)
    }

    fn add_handle(&mut self, ino: u64, file: File, flags: i32) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let sync = flags & libc::O_DSYNC != 0;
        self.handles.insert(
            fh,
            Handle {
                ino,
                file,
                writable,
                sync,
                dsync_pending: false,
            },
        );
        fh
    }

    /// Forgets what cutfs knows of a file that is about to lose its last name (its inode
    /// number can be reused).
    fn forget_if_last_link(&mut self, path: &Path) {
        if let Ok(md) = fs::symlink_metadata(path)
            && md.nlink() <= 1
            && let Ok(ino) = self.fuse_ino(&md)
        {
            self.files.remove(&ino);
            self.paths.remove(&ino);
        }
    }

    fn cut(&mut self, cut: Cut) {
        if self.frozen.is_some() {
            return;
        }
        match cut {
            Cut::InNextFsync(seed) => self.armed = Some(seed),
            Cut::DropAll => {
                self.frozen = Some(Instant::now());
                let dropped: usize = self.files.values().map(|u| u.pages.len()).sum();
                self.stats.cut_dropped += dropped as u64;
                self.files.clear();
            }
            Cut::RandomSubset(seed) => {
                self.frozen = Some(Instant::now());
                let mut rng = Rng(seed);
                let mut inos: Vec<u64> = self.files.keys().copied().collect();
                inos.sort_unstable();
                for ino in inos {
                    if let Some(mut u) = self.files.remove(&ino) {
                        self.persist_subset(&mut u, &mut rng);
                    }
                }
            }
        }
    }

    fn persist_subset(&mut self, u: &mut Unsynced, rng: &mut Rng) {
        match u.persist_subset(rng) {
            Ok((written, dropped)) => {
                self.stats.cut_persisted += written;
                self.stats.cut_dropped += dropped;
            }
            Err(e) => {
                eprintln!("cutfs: backing write failed during a cut: {e}");
                self.stats.cut_errors += 1;
            }
        }
    }

    fn fsync(&mut self, ino: u64, fh: FileHandle) -> Res<()> {
        self.check()?;
        if let Some(h) = self.handles.get_mut(&fh.0)
            && std::mem::take(&mut h.dsync_pending)
        {
            // The kernel's own fsync after an O_DSYNC write: that write is synced already, and
            // it makes nothing else durable (the FUSE request has no range).
            return Ok(());
        }
        self.stats.fsyncs += 1;
        if let Some(seed) = self.armed.take() {
            self.frozen = Some(Instant::now());
            let mut rng = Rng(seed);
            if let Some(mut u) = self.files.remove(&ino) {
                self.persist_subset(&mut u, &mut rng);
            }
            let dropped: usize = self.files.values().map(|u| u.pages.len()).sum();
            self.stats.cut_dropped += dropped as u64;
            self.files.clear();
            return Err(Errno::EIO);
        }
        if let Some(mut u) = self.files.remove(&ino)
            && let Err(e) = u.persist_all()
        {
            // Keep the overlay: the data is still unsynced.
            self.files.insert(ino, u);
            return Err(errno(e));
        }
        Ok(())
    }

    fn read(&mut self, ino: u64, fh: FileHandle, off: u64, size: u32) -> Res<Vec<u8>> {
        self.check()?;
        if let Some(u) = self.files.get(&ino) {
            return u.read(off, size as u64).map_err(errno);
        }
        let h = self.handles.get(&fh.0).ok_or(Errno::EBADF)?;
        let len = h.file.metadata().map_err(errno)?.len();
        let end = off.saturating_add(size as u64).min(len);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (end - off) as usize];
        read_full_at(&h.file, &mut buf, off).map_err(errno)?;
        Ok(buf)
    }

    fn write(
        &mut self,
        ino: u64,
        fh: FileHandle,
        off: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
    ) -> Res<u32> {
        self.check()?;
        let handle_sync = self.handles.get(&fh.0).is_some_and(|h| h.sync);
        // Page-cache write-back is never a synchronous write, whichever handle it names.
        let sync = !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE)
            && (handle_sync || flags.0 & libc::O_DSYNC != 0);
        self.stats.writes += 1;
        let u = self.unsynced(ino, Some(fh))?;
        u.write(off, data).map_err(errno)?;
        if sync {
            u.file.write_all_at(data, off).map_err(errno)?;
            u.backing_len = u.backing_len.max(off + data.len() as u64);
            self.stats.sync_writes += 1;
            if let Some(h) = self.handles.get_mut(&fh.0) {
                h.dsync_pending = true;
            }
        }
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Res<FileAttr> {
        self.check()?;
        let path = self.path(ino)?;
        if let Some(mode) = mode {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777)).map_err(errno)?;
        }
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&path, uid, gid).map_err(errno)?;
        }
        if let Some(size) = size {
            self.unsynced(ino, fh)?.set_size(size);
        }
        if atime.is_some() || mtime.is_some() {
            let ts = |t: Option<TimeOrNow>| match t {
                None => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                Some(TimeOrNow::Now) => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
                Some(TimeOrNow::SpecificTime(t)) => {
                    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                    libc::timespec {
                        tv_sec: d.as_secs() as libc::time_t,
                        tv_nsec: d.subsec_nanos() as libc::c_long,
                    }
                }
            };
            let times = [ts(atime), ts(mtime)];
            let c = cstr(&path)?;
            // Safety: a valid C string and two timespecs.
            let rc = unsafe {
                libc::utimensat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    times.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if rc != 0 {
                return Err(errno(io::Error::last_os_error()));
            }
        }
        let md = self.metadata(ino, fh)?;
        Ok(self.attr(ino, &md))
    }

    fn open(&mut self, ino: u64, flags: i32) -> Res<u64> {
        self.check()?;
        let path = self.path(ino)?;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        // O_TRUNC arrives as a setattr, O_APPEND offsets are the kernel's, O_SYNC is modelled:
        // the backing file is opened plainly.
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(&path)
            .map_err(errno)?;
        Ok(self.add_handle(ino, file, flags))
    }

    fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Res<(FileAttr, u64)> {
        self.check()?;
        let path = self.child(parent, name)?;
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).mode(mode & !umask & 0o7777);
        if flags & libc::O_EXCL != 0 {
            opts.create_new(true);
        } else {
            opts.create(true);
        }
        let file = opts.open(&path).map_err(errno)?;
        let (ino, _) = self.entry(path)?;
        if flags & libc::O_TRUNC != 0 {
            self.unsynced(ino, None)?.set_size(0);
        }
        let fh = self.add_handle(ino, file, flags);
        let md = self.metadata(ino, Some(FileHandle(fh)))?;
        Ok((self.attr(ino, &md), fh))
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Res<()> {
        self.check()?;
        let from = self.child(parent, name)?;
        let to = self.child(newparent, newname)?;
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        if !exchange {
            self.forget_if_last_link(&to);
        }
        let (cf, ct) = (cstr(&from)?, cstr(&to)?);
        // Safety: valid C strings.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                cf.as_ptr(),
                libc::AT_FDCWD,
                ct.as_ptr(),
                flags.bits(),
            )
        };
        if rc != 0 {
            return Err(errno(io::Error::last_os_error()));
        }
        // The renamed entry itself, or something below it. (`b.join("")` would be `b/`, which
        // names no file: every later call on the renamed file failed with ENOTDIR, so memkeep
        // on cutfs could never reuse a spare log segment.)
        let moved = |p: &Path, a: &Path, b: &Path| {
            p.strip_prefix(a).ok().map(|rest| {
                if rest.as_os_str().is_empty() {
                    b.to_path_buf()
                } else {
                    b.join(rest)
                }
            })
        };
        for p in self.paths.values_mut() {
            if let Some(n) = moved(p, &from, &to) {
                *p = n;
            } else if exchange && let Some(n) = moved(p, &to, &from) {
                *p = n;
            }
        }
        Ok(())
    }

    fn readdir(&mut self, ino: u64) -> Res<Vec<(u64, FileType, std::ffi::OsString)>> {
        self.check()?;
        let path = self.path(ino)?;
        let mut out = vec![
            (ino, FileType::Directory, ".".into()),
            (ino, FileType::Directory, "..".into()),
        ];
        let mut names = Vec::new();
        for e in fs::read_dir(&path).map_err(errno)? {
            let e = e.map_err(errno)?;
            let Ok(md) = e.metadata() else { continue };
            let Ok(child) = self.fuse_ino(&md) else {
                continue;
            };
            names.push((child, kind_of(&md), e.file_name()));
        }
        names.sort_by(|a, b| a.2.cmp(&b.2));
        out.extend(names);
        Ok(out)
    }

    fn fallocate(&mut self, ino: u64, fh: FileHandle, off: u64, len: u64, mode: i32) -> Res<()> {
        self.check()?;
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => false,
            libc::FALLOC_FL_ZERO_RANGE => true,
            libc::FALLOC_FL_PUNCH_HOLE if keep => true,
            _ => return Err(Errno::from_i32(libc::EOPNOTSUPP)),
        };
        let u = self.unsynced(ino, Some(fh))?;
        let end = off.saturating_add(len);
        if zero {
            // Zeros are an unsynced write of zeros, within the size (or up to `end`).
            u.zero(off, if keep { end.min(u.size) } else { end })
                .map_err(errno)?;
        }
        if !keep && end > u.size {
            u.set_size(end);
        }
        Ok(())
    }

    fn statfs(&self) -> Res<libc::statvfs> {
        self.check()?;
        let c = cstr(&self.root)?;
        // Safety: a valid C string and an out-parameter of the right type.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return Err(errno(io::Error::last_os_error()));
        }
        Ok(st)
    }
}

/// The file system the kernel talks to.
struct CutFs {
    state: Arc<Mutex<State>>,
}

impl CutFs {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> Res<T>) -> Res<T> {
        f(&mut lock(&self.state))
    }
}

impl Filesystem for CutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.with(|s| {
            s.check()?;
            let path = s.child(parent.0, name)?;
            s.entry(path)
        }) {
            Ok((_, attr)) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.with(|s| {
            s.check()?;
            let md = s.metadata(ino.0, fh)?;
            Ok(s.attr(ino.0, &md))
        }) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.with(|s| s.setattr(ino.0, mode, uid, gid, size, atime, mtime, fh)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.with(|s| {
            s.check()?;
            fs::read_link(s.path(ino.0)?).map_err(errno)
        }) {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self.with(|s| {
            s.check()?;
            let path = s.child(parent.0, name)?;
            fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(&path)
                .map_err(errno)?;
            s.entry(path)
        }) {
            Ok((_, attr)) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with(|s| {
            s.check()?;
            let path = s.child(parent.0, name)?;
            s.forget_if_last_link(&path);
            fs::remove_file(&path).map_err(errno)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with(|s| {
            s.check()?;
            let path = s.child(parent.0, name)?;
            s.forget_if_last_link(&path);
            fs::remove_dir(&path).map_err(errno)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self.with(|s| s.rename(parent.0, name, newparent.0, newname, flags)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|s| s.open(ino.0, flags.0)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.with(|s| s.read(ino.0, fh, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.with(|s| s.write(ino.0, fh, offset, data, write_flags, flags)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) syncs nothing.
        match self.with(|s| s.check()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.state).handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.with(|s| s.fsync(ino.0, fh)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|s| s.check()) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.with(|s| s.readdir(ino.0)) {
            Ok(entries) => {
                for (i, (child, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(*child), i as u64 + 1, *kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Directories are always synced (see the module doc).
        match self.with(|s| s.check()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.with(|s| s.statfs()) {
            Ok(st) => reply.statfs(
                st.f_blocks,
                st.f_bfree,
                st.f_bavail,
                st.f_files,
                st.f_ffree,
                st.f_bsize as u32,
                st.f_namemax as u32,
                st.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.with(|s| s.create(parent.0, name, mode, umask, flags)) {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.with(|s| s.fallocate(ino.0, fh, offset, length, mode)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// Why cutfs cannot run here, if it cannot: the test prints it and skips.
pub fn unavailable() -> Option<String> {
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        return Some(format!("/dev/fuse cannot be opened ({e})"));
    }
    if Command::new("fusermount3").arg("-V").output().is_err() {
        return Some("fusermount3 is missing (Debian package fuse3)".into());
    }
    None
}

/// Tells when a mount froze, from any thread.
#[derive(Clone)]
pub struct CutClock(Arc<Mutex<State>>);

impl CutClock {
    pub fn cut_at(&self) -> Option<Instant> {
        lock(&self.0).frozen
    }
}

/// A mounted cutfs; dropping it unmounts.
pub struct Mounted {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    /// The mount's device number, for the connection's abort file in fusectl.
    dev: u64,
}

impl Mounted {
    /// Mounts a fresh cutfs of `backing` (a directory) on `mountpoint` (an empty directory).
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<Mounted> {
        let root = backing.canonicalize()?;
        let md = fs::metadata(&root)?;
        let mut paths = HashMap::new();
        paths.insert(1, root.clone());
        let state = Arc::new(Mutex::new(State {
            root,
            root_dev: md.dev(),
            root_ino: md.ino(),
            paths,
            handles: HashMap::new(),
            next_fh: 1,
            files: HashMap::new(),
            frozen: None,
            armed: None,
            stats: Stats::default(),
        }));
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("cutfs".into()),
            MountOption::Subtype("cutfs".into()),
            MountOption::DefaultPermissions,
        ];
        config.n_threads = Some(2);
        let fs = CutFs {
            state: state.clone(),
        };
        let session = Session::new(fs, mountpoint, &config)?.spawn()?;
        let mountpoint = mountpoint.canonicalize()?;
        let dev = fs::metadata(&mountpoint).map(|m| m.dev()).unwrap_or(0);
        Ok(Mounted {
            state,
            session: Some(session),
            mountpoint,
            dev,
        })
    }

    pub fn cut(&self, cut: Cut) {
        lock(&self.state).cut(cut);
    }

    /// When the file system froze, if it did.
    pub fn cut_at(&self) -> Option<Instant> {
        lock(&self.state).frozen
    }

    /// A handle that tells `cut_at` from other threads.
    pub fn cut_clock(&self) -> CutClock {
        CutClock(self.state.clone())
    }

    pub fn stats(&self) -> Stats {
        lock(&self.state).stats
    }

    /// Unmounts lazily (the mount may be frozen, and processes that used it may be dead or
    /// still dying), aborts the connection where fusectl is mounted, and waits (bounded) for
    /// the session's threads to end. Err if they did not: then the caller must not mount on
    /// the same mount point again.
    pub fn unmount(&mut self) -> Result<(), String> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let c = CString::new(self.mountpoint.as_os_str().as_bytes())
            .map_err(|_| "mount point with a NUL byte".to_string())?;
        // Safety: a valid C string.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            let err = io::Error::last_os_error();
            let out = Command::new("fusermount3")
                .args(["-u", "-z", "-q", "--"])
                .arg(&self.mountpoint)
                .output();
            if !out.as_ref().is_ok_and(|o| o.status.success()) {
                return Err(format!(
                    "cannot unmount {}: umount2: {err}; fusermount3: {out:?}",
                    self.mountpoint.display()
                ));
            }
        }
        let (major, minor) = (libc::major(self.dev), libc::minor(self.dev));
        if major == 0 {
            let _ = fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1");
        }
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(session.join());
        });
        match rx.recv_timeout(UNMOUNT_WAIT) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                // The session ended, with an error of its own: the mount is gone either way.
                eprintln!("cutfs: session of {} ended: {e}", self.mountpoint.display());
                Ok(())
            }
            Err(_) => Err(format!(
                "cutfs session of {} still runs {UNMOUNT_WAIT:?} after the unmount",
                self.mountpoint.display()
            )),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.unmount() {
            eprintln!("cutfs: {e}");
        }
    }
}
