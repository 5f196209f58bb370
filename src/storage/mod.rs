//! Storage: the item codec, the views the semantics run on, the LMDB store, an in-memory model
//! store for tests. The group-commit writer that applies commands to it is `crate::engine`'s.
//!
//! Invariants: an item's bytes start with a format-version byte; CAS uniques come from one
//! counter that only grows (persisted with every batch); expiry is absolute unix milliseconds,
//! 0 meaning never.

pub mod cache;
pub mod durable;
pub mod hits;
pub mod item;
pub mod lmdb;
pub mod model;
pub mod overlay;
pub mod resident;
pub mod vlog;
pub mod wal;
pub mod watch;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

pub use item::{ItemMeta, ItemRef, Kind};

/// Longest key LMDB stores (its default build's limit). memcached keys stop at 250 bytes anyway;
/// longer RESP keys get a clear error.
pub const MAX_KEY: usize = 511;

/// A failure of the store itself (never a protocol-level "not found" or "exists").
#[derive(Debug)]
pub enum StoreError {
    /// The LMDB map is full: the write is refused, reads and deletes keep working.
    Full,
    /// The key cannot be stored: empty, or longer than LMDB's key limit (`MAX_KEY`).
    BadKey,
    /// The store is damaged: LMDB found a page that is not what the tree says it is, or a
    /// record does not decode. Made only through `StoreError::damaged`, which logs it (once).
    Damaged(String),
    /// Any other LMDB or I/O failure.
    Backend(String),
    /// A reader's snapshot predates changes to the collection it is reading
    /// (`overlay::Snap::note_pending`): the read's reply is thrown away and it runs in the
    /// writer's transaction instead. Never reaches a client.
    Pending,
}

/// The memcached text and meta protocols' reply to an operation that met damage.
pub const MC_DAMAGED: &str = "SERVER_ERROR storage corrupted";
/// The RESP error for the same.
pub const RESP_DAMAGED: &str =
    "ERR storage corrupted: stop memkeep and run `memkeep check` on its data directory";
/// The binary protocol's error body for the same (with status internal error).
pub const BIN_DAMAGED: &str = "storage corrupted";

/// The data directory the process serves, for the damage log line (the first store opened).
static DATA_DIR: OnceLock<PathBuf> = OnceLock::new();
/// Whether the damage line has been logged: once per process, however many requests meet it.
static DAMAGE_LOGGED: AtomicBool = AtomicBool::new(false);

/// Records which directory the process's store is in (the first call wins).
pub fn note_data_dir(dir: &Path) {
    let _ = DATA_DIR.set(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()));
}

impl StoreError {
    /// Damage found in the store: logs it at error level the first time in the process,
    /// naming the data directory and what to do.
    pub fn damaged(what: impl Into<String>) -> StoreError {
        let what = what.into();
        if !DAMAGE_LOGGED.swap(true, Ordering::AcqRel) {
            let dir = DATA_DIR.get().map_or_else(
                || "the data directory".to_string(),
                |d| d.display().to_string(),
            );
            log::error!(
                "storage corrupted in {dir}: {what}; stop memkeep and run `memkeep check {dir}`"
            );
        }
        StoreError::Damaged(what)
    }

    pub fn is_damage(&self) -> bool {
        matches!(self, StoreError::Damaged(_))
    }

    /// The memcached text/meta reply to a read that failed with this.
    pub fn mc_read_reply(&self) -> &'static str {
        if self.is_damage() {
            MC_DAMAGED
        } else {
            "SERVER_ERROR temporary failure"
        }
    }

    /// The RESP error reply (without the leading `-`) to an operation that failed with this.
    pub fn resp_reply(&self) -> String {
        if self.is_damage() {
            RESP_DAMAGED.to_string()
        } else {
            format!("ERR storage failure: {self}")
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Full => f.write_str("store is full"),
            StoreError::BadKey => write!(f, "keys must be 1 to {MAX_KEY} bytes"),
            StoreError::Damaged(m) => write!(f, "storage corrupted: {m}"),
            StoreError::Backend(m) => write!(f, "storage error: {m}"),
            StoreError::Pending => f.write_str("collection changed after the read's snapshot"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<heed::Error> for StoreError {
    fn from(e: heed::Error) -> Self {
        use heed::MdbError as M;
        match e {
            heed::Error::Mdb(M::MapFull) => StoreError::Full,
            heed::Error::Mdb(M::BadValSize) => StoreError::BadKey,
            heed::Error::Mdb(m) if is_damage(&m) => StoreError::damaged(m.to_string()),
            other => StoreError::Backend(other.to_string()),
        }
    }
}

/// Free bytes below which a failed write in the data directory is called a full disk.
const DISK_FULL_BELOW: u64 = 4 << 20;

/// Bytes an unprivileged writer could still use on the file system holding `dir` (statvfs).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `st` has room for the struct statvfs fills.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// What to add to the message of a failed write in `dir`: a full disk shows as whatever the
/// failed call made of it (LMDB turns a short write into EIO), so say so when the file system
/// has no room left; empty otherwise.
pub fn disk_full_hint(dir: &Path) -> String {
    match free_bytes(dir) {
        Some(free) if free < DISK_FULL_BELOW => format!(
            " (the file system of {} has {free} bytes free: the disk is full)",
            dir.display()
        ),
        _ => String::new(),
    }
}

/// Whether LMDB's error says the file is damaged, rather than that a limit or the system
/// failed. Damage:
/// - `Corrupted` (a page of the wrong type where the tree points), `PageNotFound` (a page
///   number past the end of the snapshot), `CursorFull` (a tree deeper than LMDB's cursor
///   stack: with 511-byte keys a sound tree never is, so the pages form a loop): what LMDB
///   finds walking pages that are not what they claim.
/// - `Invalid` (no valid meta page), `VersionMismatch` (a meta page of another format) and
///   `Incompatible` (a named database's record is not one: memkeep only ever creates its six
///   databases with fixed flags, so the main tree's record changed under it): the file's own
///   structure is wrong.
/// - `BadTxn`: LMDB answers it to every operation of a transaction an earlier error marked
///   failed. A read transaction is only ever marked so by the errors above, and memkeep's
///   writer abandons a write transaction at its first error (so a transient one, such as a
///   full map, never leaves it going on to meet `BadTxn`): it follows damage.
///
/// Not damage: `MapFull` (`Full`), `ReadersFull`, `TxnFull`, `DbsFull`, `MapResized`,
/// `TlsFull` (limits, transient or configuration), `Panic` (an earlier write of a meta page
/// failed: an I/O error; a restart recovers), `PageFull`, `Problem`, `BadRslot`, `BadDbi`
/// (LMDB's internal or usage errors), `KeyExist`/`NotFound` (answers, not failures).
pub fn is_damage(e: &heed::MdbError) -> bool {
    use heed::MdbError as M;
    matches!(
        e,
        M::Corrupted
            | M::PageNotFound
            | M::CursorFull
            | M::Invalid
            | M::VersionMismatch
            | M::Incompatible
            | M::BadTxn
    )
}

/// How a string's new value was made from its old one: `prepend` new bytes in front of the
/// old value, then (after the length changed, zero-filled) `len` bytes written from offset
/// `at`; both in the new value's coordinates. What a `PATCH` log record carries instead of
/// the whole value (APPEND, SETRANGE, SETBIT and the like on large values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Edit {
    pub prepend: usize,
    pub at: usize,
    pub len: usize,
}

/// `WriteView::edit` called for a key that holds nothing (a caller's mistake).
pub fn edit_gone() -> StoreError {
    StoreError::Backend("an edit found no item to edit".into())
}

/// `WriteView::edit` called with data that does not fit the edit (a caller's mistake).
pub fn bad_edit() -> StoreError {
    StoreError::Backend("an edit whose data does not fit it".into())
}

/// A piece of an edited value (`Edit::pieces`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    Bytes(&'a [u8]),
    Zeros(usize),
}

/// Values below this are logged whole: a patch record saves little there, and costs a CRC.
pub const PATCH_MIN: usize = 4096;

impl Edit {
    /// `data` appended to a value of `old_len` bytes.
    pub fn append(old_len: usize, data: usize) -> Edit {
        Edit {
            prepend: 0,
            at: old_len,
            len: data,
        }
    }

    /// `data` bytes put in front of the value.
    pub fn prepend(data: usize) -> Edit {
        Edit {
            prepend: data,
            at: 0,
            len: 0,
        }
    }

    /// `len` bytes written from `at` (the value zero-filled up to there if it was shorter).
    pub fn write(at: usize, len: usize) -> Edit {
        Edit {
            prepend: 0,
            at,
            len,
        }
    }

    /// The length of the value this edit makes of one of `old_len` bytes.
    pub fn new_len(&self, old_len: usize) -> usize {
        self.prepend
            .saturating_add(old_len)
            .max(self.at.saturating_add(self.len))
    }

    /// The pieces, in order, of the value this edit makes of `old` with `data` (the bytes put
    /// in front, or the bytes written at `at`): old bytes, new bytes, and a run of zeros where
    /// a write starts past the old end. `None` for an edit that is neither a prepend nor a
    /// write of exactly `data` (no caller makes one).
    pub fn pieces<'a>(&self, old: &'a [u8], data: &'a [u8]) -> Option<[Piece<'a>; 4]> {
        use Piece::{Bytes, Zeros};
        if self.prepend > 0 {
            return (self.len == 0 && data.len() == self.prepend).then_some([
                Bytes(data),
                Bytes(old),
                Zeros(0),
                Zeros(0),
            ]);
        }
        if data.len() != self.len {
            return None;
        }
        let head = old.get(..self.at).unwrap_or(old);
        let tail = old
            .get(self.at.saturating_add(self.len)..)
            .unwrap_or_default();
        Some([
            Bytes(head),
            Zeros(self.at - head.len()),
            Bytes(data),
            Bytes(tail),
        ])
    }

    /// The value this edit makes of `old` with `data` (see `pieces`).
    pub fn apply(&self, old: &[u8], data: &[u8]) -> Option<Vec<u8>> {
        let mut value = Vec::with_capacity(self.new_len(old.len()));
        for piece in self.pieces(old, data)? {
            match piece {
                Piece::Bytes(b) => value.extend_from_slice(b),
                Piece::Zeros(n) => value.resize(value.len() + n, 0),
            }
        }
        Some(value)
    }

    /// Whether logging this change of a value that ends `new_len` bytes long beats logging
    /// the whole value: a large value, at most half of it new.
    pub fn worth_it(&self, new_len: usize) -> bool {
        new_len >= PATCH_MIN
            && self.at.saturating_add(self.len) <= new_len
            && self.prepend <= new_len
            && self.prepend.saturating_add(self.len) <= new_len / 2
    }
}

/// Read access to items, as the semantics see it.
pub trait ReadView {
    /// The stored item under `key`, expired or not.
    fn get(&self, key: &[u8]) -> Result<Option<ItemRef<'_>>, StoreError>;
}

/// Write access inside one transaction.
pub trait WriteView: ReadView {
    /// Stores `parts` concatenated as the value of `key`, replacing any old item.
    fn put(&mut self, key: &[u8], meta: &ItemMeta, parts: &[&[u8]]) -> Result<(), StoreError>;
    /// Stores `parts` concatenated as `key`'s new string value (with `meta`), made from the
    /// string item `old` of `old_len` value bytes as `edit` says. The same as `put` to
    /// readers; a store with a log may log only the change.
    fn patch(
        &mut self,
        key: &[u8],
        old: &ItemMeta,
        old_len: usize,
        meta: &ItemMeta,
        parts: &[&[u8]],
        edit: &Edit,
    ) -> Result<(), StoreError> {
        let _ = (old, old_len, edit);
        self.put(key, meta, parts)
    }
    /// Makes `key`'s new string value from the one it holds (an item with meta `old`, which
    /// the caller read in this transaction) by putting `data` where `edit` says, and stores
    /// it with `meta`, as `patch` would. The caller copies no old value: a store may build
    /// the new item straight from the old one, one copy in all.
    fn edit(
        &mut self,
        key: &[u8],
        old: &ItemMeta,
        meta: &ItemMeta,
        data: &[u8],
        edit: &Edit,
    ) -> Result<(), StoreError> {
        let (value, old_len) = {
            let item = self.get(key)?.ok_or_else(edit_gone)?;
            let value = edit.apply(item.value, data).ok_or_else(bad_edit)?;
            (value, item.value.len())
        };
        self.patch(key, old, old_len, meta, &[&value], edit)
    }
    /// Removes `key` (and, for a collection, its elements); true if it was there.
    fn delete(&mut self, key: &[u8]) -> Result<bool, StoreError>;
    /// Removes `key`'s record but keeps a collection's elements, whose metadata the caller is
    /// moving under another key (RENAME).
    fn take(&mut self, key: &[u8]) -> Result<bool, StoreError>;
    /// Removes every item.
    fn clear(&mut self) -> Result<(), StoreError>;
    /// Arranges for every item to be removed at `at_ms` (a delayed `flush_all`).
    fn schedule_flush(&mut self, at_ms: u64) -> Result<(), StoreError>;
    /// A fresh CAS unique, larger than every one handed out before, across restarts.
    fn next_cas(&mut self) -> u64;
}

#[cfg(test)]
mod tests {
    use super::Edit;

    #[test]
    fn edits_make_the_values_they_describe() {
        let old = b"hello".as_slice();
        let made = |e: Edit, data: &[u8]| e.apply(old, data);
        assert_eq!(
            made(Edit::append(5, 3), b"abc").as_deref(),
            Some(&b"helloabc"[..])
        );
        assert_eq!(
            made(Edit::prepend(2), b"ab").as_deref(),
            Some(&b"abhello"[..])
        );
        assert_eq!(
            made(Edit::write(1, 2), b"XY").as_deref(),
            Some(&b"hXYlo"[..])
        );
        assert_eq!(
            made(Edit::write(4, 3), b"XYZ").as_deref(),
            Some(&b"hellXYZ"[..])
        );
        assert_eq!(
            made(Edit::write(7, 2), b"XY").as_deref(),
            Some(&b"hello\0\0XY"[..]),
            "zeros between the old end and a write past it"
        );
        assert_eq!(made(Edit::write(0, 0), b"").as_deref(), Some(old));
        for (e, data) in [
            (Edit::append(5, 3), &b"abc"[..]),
            (Edit::prepend(2), b"ab"),
            (Edit::write(7, 2), b"XY"),
        ] {
            let v = e.apply(old, data).expect("fits");
            assert_eq!(v.len(), e.new_len(old.len()));
        }
        // Data that is not what the edit says: refused, not guessed at.
        assert_eq!(made(Edit::write(1, 2), b"XYZ"), None);
        assert_eq!(made(Edit::prepend(2), b"abc"), None);
    }
}
