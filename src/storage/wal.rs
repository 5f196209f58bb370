//! The write-ahead log and the checkpoint record: one sequential fdatasync makes a batch
//! durable, and LMDB reopens after any power cut.
//!
//! Files in the data directory, beside LMDB's `data.mdb` and `lock.mdb`:
//! - `wal-<segment, 16 hex digits>.log`: a 32-byte segment header (magic `MKWS`, format
//!   version, a random 64-bit salt, the segment's number, CRC-32 of those), then batches in
//!   commit order. A batch is a 20-byte header (magic `MKWB`, payload length u32 LE, sequence
//!   number u64 LE, CRC-32 of the salt, the length, the sequence number and the payload) and a
//!   payload of physical records, each `PUT db key value`, `DEL db key`, `CLEAR db` or
//!   `PATCH db key old new change`. Records say what the bytes became, not what command made
//!   them, so replaying a batch twice, or onto a store that already holds part of it, gives the
//!   same store. A `PATCH` (an APPEND, SETRANGE, SETBIT... on a large value) carries only the
//!   bytes that changed, with the item it was made against (header and value length) and the
//!   new item (header, length, CRC-32 of the whole value): replay applies it only onto that
//!   old item, skips it where the new item is already stored, and anything else is damage
//!   (recovery, which starts from the checkpoint's exact snapshot) or a later state
//!   (`durable::replay_live`, onto a copy that may be ahead of the log position it starts at:
//!   skipped, a later record of the key makes it right). Segments written before the header
//!   existed (batches from byte 0, CRC without a salt) are still read, never written.
//! - `wal-spare-<16 hex digits>`: segments a checkpoint no longer needs, kept (at most
//!   `MAX_SPARES`) to become later segments, and extended with written zeros beforehand. An
//!   fdatasync after an append must commit the file's new size to the journal (on ext4
//!   without one, write the inode and extent tree synchronously); one after an overwrite of
//!   blocks already written flushes only the data (1.5x more syncs per second on ext4 here).
//!   So the log is written into recycled files, and does not grow while it fits. Recovery
//!   never reads a spare: the name does not parse as a segment's.
//! - `checkpoint`: the last checkpoint: the LMDB transaction id and meta page of a snapshot
//!   whose pages are all on disk, the sequence number of the last batch that snapshot holds, and
//!   the first segment to replay after it. Replaced atomically (write, fsync, rename, fsync the
//!   directory), so it is either the old record or the new one.
//!
//! Invariants that recovery relies on:
//! - sequence numbers grow by one per batch with no gap, across segments and restarts; a batch
//!   is applied only if it has exactly the next number and passes its checksum under its
//!   segment's salt, so a torn, missing or stale batch ends the segment there;
//! - bytes not written in a segment's current life never pass: a recycled file's old batches,
//!   and a batch a client planted inside a value, were checksummed under another salt or none
//!   (a 64-bit salt from the OS's random source, chosen at each rotation and never sent
//!   anywhere; CRC-32 is no MAC, but without the salt a forged header passes 1 time in 2^32);
//! - a segment's new header is on disk before the file has the segment's name, so a renamed
//!   spare never shows its previous life's header (and salt) under a live segment's name;
//! - a segment is fdatasynced before the next one is created, so a later segment never holds a
//!   batch while an earlier one lost its tail: when a segment ends (at a torn batch, zeros or
//!   stale bytes) and a next segment exists, the log goes on there if that segment's first
//!   batch has the next sequence number;
//! - a torn tail found at recovery is cut off and the cut is fsynced before anything is appended
//!   to that segment, so a batch of the current life past the cut (one that reached the disk
//!   while the batch before it did not) can never follow a new batch later;
//! - an append taken back (`Wal::undo`) has its batch header zeroed and synced, not the file
//!   shortened; what stays of its payload past a later, shorter batch is client bytes that do
//!   not carry the salt;
//! - the snapshot a checkpoint names stays readable until a newer checkpoint record is durable:
//!   LMDB never reuses a page that a live read transaction can see, and the writer keeps one open
//!   on that snapshot (see `writer.rs`). Its meta page is kept here because LMDB, committing
//!   without sync, may write its own two meta pages past that snapshot before their pages.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Batch header: magic, payload length, sequence number, checksum.
pub const HEADER: usize = 20;
const BATCH_MAGIC: &[u8; 4] = b"MKWB";
/// Segment header: magic, format version, salt, segment number, reserved, checksum.
pub const SEGMENT_HEADER: usize = 32;
const SEGMENT_MAGIC: &[u8; 4] = b"MKWS";
const SEGMENT_VERSION: u32 = 1;
/// Spares kept for later segments; more are deleted.
pub const MAX_SPARES: usize = 2;
/// A covered segment longer than this (a burst, a late checkpoint) is deleted, not kept as a
/// spare: a spare is disk the store holds on to, and this is twice what one normally needs.
const SPARE_KEEP_MAX: u64 = 64 << 20;
/// Where a spare is extended, out of the writer's reach (see `prepare_spare`).
const SPARE_PREP: &str = "wal-spare.tmp";
const CKPT_MAGIC: &[u8; 4] = b"MKCP";
const CKPT_VERSION: u32 = 1;
pub const CHECKPOINT_FILE: &str = "checkpoint";

const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;
const OP_CLEAR: u8 = 3;
const OP_PATCH: u8 = 4;

/// Offsets in an LMDB meta page (64-bit build: a 16-byte page header, then `MDB_meta`).
const META_MAGIC_AT: usize = 16;
const META_TXNID_AT: usize = 144;
const META_END: usize = 152;
const META_FREE_ROOT_AT: usize = 80;
const META_MAIN_ROOT_AT: usize = 128;
const META_LAST_PG_AT: usize = 136;
const LMDB_MAGIC: u32 = 0xBEEF_C0DE;

/// One batch's records as the writer builds them. The header's room is reserved at the front
/// so the batch goes to the log in one write.
#[derive(Debug)]
pub struct LogBuf {
    buf: Vec<u8>,
    /// The whole new items (header and value) of the batch's `PATCH` records, in record
    /// order: the writer publishes them to readers (`overlay::absorb`), which cannot rebuild
    /// them from the record alone. Never written to the log.
    patched: Vec<Option<std::sync::Arc<[u8]>>>,
    /// Value bytes the `PATCH` records stand for: what replaying them rewrites, though the
    /// log holds only the change.
    patched_bytes: u64,
    /// Of those, what LMDB had to take new pages for (see `LogTxn::patch_charge`): a value
    /// edited again in the same LMDB transaction is rewritten in the dirty pages it already
    /// has, so it counts only when it needs more pages.
    patched_dirty: u64,
    /// Ranges of `buf` (start, length) that a `vlog::Sink` has already written at their
    /// place in the segment, the same bytes: an append through the segment's mapping skips
    /// them (`Mapping::put_except`) rather than copy each separated value into the page cache
    /// twice. In buffer order.
    written: Vec<(usize, usize)>,
}

impl Default for LogBuf {
    fn default() -> Self {
        LogBuf {
            buf: vec![0; HEADER],
            patched: Vec::new(),
            patched_bytes: 0,
            patched_dirty: 0,
            written: Vec::new(),
        }
    }
}

/// What a `PATCH` record says: the item `key` held `old` (its header, as `item` encodes
/// it, and its value's length) and now holds `new`: the old value with `prepend` in front,
/// zero-filled or cut to `new_len`, then `bytes` laid over it from offset `at`. `crc` is the
/// CRC-32 of the whole new value, so a replay can tell a patch it already applied from one
/// still to apply, and never makes a value other than the one that was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patch<'a> {
    pub old_header: &'a [u8],
    pub old_len: u32,
    pub new_header: &'a [u8],
    pub new_len: u32,
    pub crc: u32,
    pub prepend: &'a [u8],
    pub at: u32,
    pub bytes: &'a [u8],
}

impl Patch<'_> {
    /// The new value, from the old one this patch was made against.
    pub fn apply(&self, old: &[u8]) -> Result<Vec<u8>, String> {
        let new_len = self.new_len as usize;
        let at = self.at as usize;
        if at + self.bytes.len() > new_len || self.prepend.len() > new_len {
            return Err("a log patch writes past the value it makes".into());
        }
        let mut v = Vec::with_capacity(new_len.max(self.prepend.len() + old.len()));
        v.extend_from_slice(self.prepend);
        v.extend_from_slice(old);
        v.resize(new_len, 0);
        v[at..at + self.bytes.len()].copy_from_slice(self.bytes);
        Ok(v)
    }
}

/// The CRC-32 of a value after an edit, from the CRC of the value before it and the bytes the
/// edit touched: what a `PATCH` record of an edit made in place carries, without a pass over
/// the whole value (`LmdbWrite::edit_in_place`). CRC-32 is affine in its input, so the CRC of
/// `A || B` is the CRC of `A` moved past `|B|` bytes, xor the CRC of `B` (zlib's
/// `crc32_combine`, which `crc32fast::Hasher::combine` implements).
pub mod crc_edit {
    use crc32fast::Hasher;

    /// `crc` moved past `n` bytes: the CRC of `A || Z` xor the CRC of `Z`, for `A` with CRC
    /// `crc` and any `Z` of `n` bytes.
    fn shift(crc: u32, n: u64) -> u32 {
        let mut h = Hasher::new_with_initial_len(crc, 0);
        h.combine(&Hasher::new_with_initial_len(0, n));
        h.finalize()
    }

    /// The value (CRC `crc`, `len` bytes) followed by `zeros` zero bytes and `data`.
    pub fn append(crc: u32, len: usize, zeros: usize, data: &[u8]) -> u32 {
        const Z: [u8; 4096] = [0; 4096];
        let mut h = Hasher::new_with_initial_len(crc, len as u64);
        let mut left = zeros;
        while left > 0 {
            let n = left.min(Z.len());
            h.update(&Z[..n]);
            left -= n;
        }
        h.update(data);
        h.finalize()
    }

    /// The value (CRC `crc`, `len` bytes) with the bytes `old` at offset `at` replaced by
    /// `new`, as many: for equal lengths the CRCs of two strings xor to the CRC of their xor
    /// (less that of zeros), and zeros in front change nothing of it.
    pub fn overwrite(crc: u32, len: usize, at: usize, old: &[u8], new: &[u8]) -> Option<u32> {
        if old.len() != new.len() {
            return None;
        }
        let after = len.checked_sub(at)?.checked_sub(old.len())?;
        Some(crc ^ shift(crc32fast::hash(old) ^ crc32fast::hash(new), after as u64))
    }

    /// `data` followed by the value (CRC `crc`, `len` bytes).
    pub fn prepend(crc: u32, len: usize, data: &[u8]) -> u32 {
        let mut h = Hasher::new_with_initial_len(crc32fast::hash(data), data.len() as u64);
        h.combine(&Hasher::new_with_initial_len(crc, len as u64));
        h.finalize()
    }
}

/// Keep at most this much buffer between batches (a batch of large values can grow it far).
const KEEP_CAPACITY: usize = 4 << 20;
/// The least capacity `LogBuf::share` starts a buffer with.
const SHARE_MIN: usize = 256;

/// The most payload one batch record carries (its length is a u32). A group-commit batch of
/// large values can pass it (RESP values reach `proto_max_bulk_len`, up to 1 GiB): the writer
/// then runs that batch's writes one by one (`LogBuf::fits`). `MEMKEEP_TEST_LOG_BATCH_MAX`
/// lowers it, so a test can take that path without gigabytes.
fn batch_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let cap = u32::MAX as usize;
        std::env::var("MEMKEEP_TEST_LOG_BATCH_MAX")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(cap, |v| v.min(cap))
    })
}

impl LogBuf {
    /// True when the batch changed nothing.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == HEADER
    }

    /// Forgets the records (after they were written, or when the batch was aborted).
    pub fn reset(&mut self) {
        self.buf.truncate(HEADER);
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf.shrink_to(KEEP_CAPACITY);
        }
        self.patched.clear();
        self.patched_bytes = 0;
        self.patched_dirty = 0;
        self.written.clear();
    }

    /// Notes that `buf[start..start + len]`, the value of the record just put, is already in
    /// the segment where this batch will be appended (`vlog::Sink::write`).
    pub fn note_written(&mut self, (start, len): (usize, usize)) {
        self.written.push((start, len));
    }

    /// The whole new items of the batch's `PATCH` records, in record order; None for one
    /// that readers make from the record and the key's previous version (`overlay::Edited`).
    pub fn patched(&self) -> &[Option<std::sync::Arc<[u8]>>] {
        &self.patched
    }

    /// Value bytes the batch's `PATCH` records stand for (see the field).
    pub fn patched_bytes(&self) -> u64 {
        self.patched_bytes
    }

    /// Bytes of new LMDB pages the batch's `PATCH` records took (see the field).
    pub fn patched_dirty(&self) -> u64 {
        self.patched_dirty
    }

    /// Whether the records fit in one batch record (`batch_max`).
    pub fn fits(&self) -> bool {
        self.payload_len() <= batch_max()
    }

    /// Payload bytes recorded so far.
    pub fn payload_len(&self) -> usize {
        self.buf.len() - HEADER
    }

    /// Hands the batch's buffer (header, then the records from `HEADER` on, as appended)
    /// over to be shared by the overlay's versions and the writer's copy for a rebuild, and
    /// starts an empty one, sized for a batch like this one.
    pub fn share(&mut self) -> std::sync::Arc<Vec<u8>> {
        let mut next = Vec::with_capacity(self.buf.len().clamp(SHARE_MIN, KEEP_CAPACITY));
        next.resize(HEADER, 0);
        self.written.clear();
        std::sync::Arc::new(std::mem::replace(&mut self.buf, next))
    }

    /// The records (what `ops` reads back).
    pub fn payload(&self) -> &[u8] {
        &self.buf[HEADER..]
    }

    pub fn put(&mut self, db: u8, key: &[u8], parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.buf.reserve(8 + key.len() + len);
        self.buf.push(OP_PUT);
        self.buf.push(db);
        self.buf
            .extend_from_slice(&(key.len() as u16).to_le_bytes());
        self.buf.extend_from_slice(&(len as u32).to_le_bytes());
        self.buf.extend_from_slice(key);
        for p in parts {
            self.buf.extend_from_slice(p);
        }
    }

    /// Where, in the buffer (header included: the offset from the batch's first byte in its
    /// segment), the value of a `put` of a key of `key_len` bytes made next would start.
    pub fn put_value_at(&self, key_len: usize) -> usize {
        self.buf.len() + 8 + key_len
    }

    pub fn del(&mut self, db: u8, key: &[u8]) {
        self.buf.push(OP_DEL);
        self.buf.push(db);
        self.buf
            .extend_from_slice(&(key.len() as u16).to_le_bytes());
        self.buf.extend_from_slice(key);
    }

    pub fn clear(&mut self, db: u8) {
        self.buf.push(OP_CLEAR);
        self.buf.push(db);
    }

    /// Records that `key` in `db` was changed as `p` says; `item` is the whole new item
    /// (header and value), kept for readers, or None when they make it (see `patched`);
    /// `dirty` is what LMDB took new pages for (see `patched_dirty`).
    pub fn patch(
        &mut self,
        db: u8,
        key: &[u8],
        p: &Patch,
        item: Option<std::sync::Arc<[u8]>>,
        dirty: u64,
    ) {
        let b = &mut self.buf;
        b.reserve(32 + key.len() + p.old_header.len() + p.new_header.len() + p.bytes.len());
        b.push(OP_PATCH);
        b.push(db);
        b.extend_from_slice(&(key.len() as u16).to_le_bytes());
        b.extend_from_slice(key);
        b.push(p.old_header.len() as u8);
        b.extend_from_slice(p.old_header);
        b.extend_from_slice(&p.old_len.to_le_bytes());
        b.push(p.new_header.len() as u8);
        b.extend_from_slice(p.new_header);
        b.extend_from_slice(&p.new_len.to_le_bytes());
        b.extend_from_slice(&p.crc.to_le_bytes());
        b.extend_from_slice(&(p.prepend.len() as u32).to_le_bytes());
        b.extend_from_slice(p.prepend);
        b.extend_from_slice(&p.at.to_le_bytes());
        b.extend_from_slice(&(p.bytes.len() as u32).to_le_bytes());
        b.extend_from_slice(p.bytes);
        self.patched_bytes += u64::from(p.new_len);
        self.patched_dirty += dirty;
        self.patched.push(item);
    }

    /// Fills in the header for sequence number `seq` in a segment salted `salt`; the whole
    /// batch, ready to write.
    fn seal(&mut self, seq: u64, salt: u64) -> io::Result<&[u8]> {
        let len = u32::try_from(self.buf.len() - HEADER)
            .ok()
            .filter(|_| self.fits())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "batch too large for the log")
            })?;
        self.buf[0..4].copy_from_slice(BATCH_MAGIC);
        self.buf[4..8].copy_from_slice(&len.to_le_bytes());
        self.buf[8..16].copy_from_slice(&seq.to_le_bytes());
        let crc = batch_crc(Some(salt), &self.buf[4..16], &self.buf[HEADER..]);
        self.buf[16..20].copy_from_slice(&crc.to_le_bytes());
        Ok(&self.buf)
    }
}

/// A batch's checksum; `salt` is its segment's (None: a segment from before segment headers).
fn batch_crc(salt: Option<u64>, len_seq: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    if let Some(salt) = salt {
        h.update(&salt.to_le_bytes());
    }
    h.update(len_seq);
    h.update(payload);
    h.finalize()
}

/// One physical record of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    Put {
        db: u8,
        key: &'a [u8],
        value: &'a [u8],
    },
    Del {
        db: u8,
        key: &'a [u8],
    },
    Clear {
        db: u8,
    },
    /// The item under `key` changed as the patch says (the log holds only the change).
    Patch {
        db: u8,
        key: &'a [u8],
        patch: Patch<'a>,
    },
}

/// Reads a patch record's fields after its key (`rest`); the patch and the bytes it took.
fn parse_patch(rest: &[u8]) -> Option<(Patch<'_>, usize)> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = rest.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let u32_of = |s: &[u8]| -> Option<u32> { Some(u32::from_le_bytes(s.try_into().ok()?)) };
    let old_hlen = *take(1)?.first()? as usize;
    let old_header = take(old_hlen)?;
    let old_len = u32_of(take(4)?)?;
    let new_hlen = *take(1)?.first()? as usize;
    let new_header = take(new_hlen)?;
    let new_len = u32_of(take(4)?)?;
    let crc = u32_of(take(4)?)?;
    let plen = u32_of(take(4)?)? as usize;
    let prepend = take(plen)?;
    let pat = u32_of(take(4)?)?;
    let blen = u32_of(take(4)?)? as usize;
    let bytes = take(blen)?;
    Some((
        Patch {
            old_header,
            old_len,
            new_header,
            new_len,
            crc,
            prepend,
            at: pat,
            bytes,
        },
        at,
    ))
}

/// The records of a batch's payload, in order; an error if the payload does not parse (which,
/// behind a valid checksum, means a bug or a different format, never a torn write).
pub fn ops(payload: &[u8]) -> impl Iterator<Item = Result<Op<'_>, String>> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at >= payload.len() {
            return None;
        }
        let rest = &payload[at..];
        let bad = || Some(Err(format!("malformed log record at payload offset {at}")));
        let (op, used) = match rest {
            [OP_PUT, db, k0, k1, v0, v1, v2, v3, tail @ ..] => {
                let klen = u16::from_le_bytes([*k0, *k1]) as usize;
                let vlen = u32::from_le_bytes([*v0, *v1, *v2, *v3]) as usize;
                if tail.len() < klen + vlen {
                    return bad();
                }
                (
                    Op::Put {
                        db: *db,
                        key: &tail[..klen],
                        value: &tail[klen..klen + vlen],
                    },
                    8 + klen + vlen,
                )
            }
            [OP_DEL, db, k0, k1, tail @ ..] => {
                let klen = u16::from_le_bytes([*k0, *k1]) as usize;
                if tail.len() < klen {
                    return bad();
                }
                (
                    Op::Del {
                        db: *db,
                        key: &tail[..klen],
                    },
                    4 + klen,
                )
            }
            [OP_CLEAR, db, ..] => (Op::Clear { db: *db }, 2),
            [OP_PATCH, db, k0, k1, tail @ ..] => {
                let klen = u16::from_le_bytes([*k0, *k1]) as usize;
                let Some(key) = tail.get(..klen) else {
                    return bad();
                };
                let Some((patch, used)) = parse_patch(&tail[klen..]) else {
                    return bad();
                };
                (
                    Op::Patch {
                        db: *db,
                        key,
                        patch,
                    },
                    4 + klen + used,
                )
            }
            _ => return bad(),
        };
        at += used;
        Some(Ok(op))
    })
}

pub fn segment_name(n: u64) -> String {
    format!("wal-{n:016x}.log")
}

/// The name of a spare made from segment `n` (segment numbers never repeat, so neither do
/// these; 0, which no segment has, names a spare made from nothing).
pub fn spare_name(n: u64) -> String {
    format!("wal-spare-{n:016x}")
}

/// The log's segments in `dir`, oldest first.
pub fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(hex) = name
            .strip_prefix("wal-")
            .and_then(|s| s.strip_suffix(".log"))
            && hex.len() == 16
            && let Ok(n) = u64::from_str_radix(hex, 16)
        {
            out.push((n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// A file kept to become a later segment.
#[derive(Debug, Clone)]
pub struct Spare {
    pub path: PathBuf,
    /// The number in its name.
    pub n: u64,
    pub len: u64,
}

/// The spares in `dir`, longest first.
pub fn spares(dir: &Path) -> io::Result<Vec<Spare>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(hex) = name.strip_prefix("wal-spare-")
            && hex.len() == 16
            && let Ok(n) = u64::from_str_radix(hex, 16)
        {
            // Gone since the listing: the writer has just made it a segment.
            let Ok(meta) = entry.metadata() else { continue };
            out.push(Spare {
                path: entry.path(),
                n,
                len: meta.len(),
            });
        }
    }
    out.sort_by(|a, b| b.len.cmp(&a.len).then(a.n.cmp(&b.n)));
    Ok(out)
}

/// Fsyncs a directory, making the names created or renamed in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn fdatasync(f: &File) -> io::Result<()> {
    f.sync_data()
}

fn new_salt() -> io::Result<u64> {
    getrandom::u64()
        .map_err(|e| io::Error::other(format!("cannot read the OS's random source: {e}")))
}

fn segment_header(salt: u64, segment: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[0..4].copy_from_slice(SEGMENT_MAGIC);
    h[4..8].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[8..16].copy_from_slice(&salt.to_le_bytes());
    h[16..24].copy_from_slice(&segment.to_le_bytes());
    let crc = crc32fast::hash(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// How a segment file's batches are to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Written before segments had a header: batches from byte 0, checksums without a salt.
    Legacy,
    /// A header naming this segment: batches after it, checksummed with this salt.
    Salted(u64),
    /// No header of this segment's own (a file being created when the power went, or one
    /// never written): it holds no batch.
    Blank,
}

impl Format {
    /// The format of a segment file numbered `segment` whose first bytes are `head`.
    fn of(head: &[u8], segment: u64) -> io::Result<Format> {
        if head.starts_with(BATCH_MAGIC) {
            return Ok(Format::Legacy);
        }
        if head.len() < SEGMENT_HEADER || &head[0..4] != SEGMENT_MAGIC {
            return Ok(Format::Blank);
        }
        let field = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap_or([0; 8]));
        let crc = u32::from_le_bytes(head[28..32].try_into().unwrap_or([0; 4]));
        if crc32fast::hash(&head[..28]) != crc {
            return Ok(Format::Blank);
        }
        let version = u32::from_le_bytes(head[4..8].try_into().unwrap_or([0; 4]));
        if version != SEGMENT_VERSION {
            // Whole and checksummed: a newer memkeep wrote it. Reading it as empty would drop
            // its batches.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "log segment {} has format version {version}; this memkeep reads {SEGMENT_VERSION}",
                    segment_name(segment)
                ),
            ));
        }
        if field(16) != segment {
            // A header another segment wrote: never this segment's own (a new header is on
            // disk before a spare takes a segment's name), so its salt must not be trusted.
            return Ok(Format::Blank);
        }
        Ok(Format::Salted(field(8)))
    }

    fn salt(self) -> Option<u64> {
        match self {
            Format::Salted(s) => Some(s),
            Format::Legacy | Format::Blank => None,
        }
    }

    /// Where the first batch starts.
    fn start(self) -> u64 {
        match self {
            Format::Salted(_) => SEGMENT_HEADER as u64,
            Format::Legacy | Format::Blank => 0,
        }
    }
}

/// Why a segment's batches ended before the file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The segment has no header of its own (`Format::Blank`).
    NoSegmentHeader,
    /// Zeros where the next batch would start: space not written in this life (preallocated,
    /// or an append taken back).
    Unused,
    /// The file ends inside a batch header.
    TornHeader(usize),
    /// Bytes that are not a batch header (what a recycled file held before, or what stays of a
    /// taken-back batch past a shorter one).
    NotABatch,
    /// The file ends inside batch `seq`.
    Torn { seq: u64 },
    /// A batch claiming sequence number `seq` fails its checksum.
    Checksum { seq: u64 },
    /// A whole batch, but not the next one.
    Unexpected { expected: u64, found: u64 },
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::NoSegmentHeader => write!(f, "no segment header"),
            Stop::Unused => write!(f, "zeros where the next batch would start"),
            Stop::TornHeader(n) => write!(f, "torn batch header ({n} bytes)"),
            Stop::NotABatch => write!(f, "no batch header"),
            Stop::Torn { seq } => write!(f, "torn batch {seq}"),
            Stop::Checksum { seq } => write!(f, "batch {seq} fails its checksum"),
            Stop::Unexpected { expected, found } => {
                write!(f, "batch {expected} is missing (found {found})")
            }
        }
    }
}

/// Reads a segment's batches in order; stops at the first one that is torn, fails its
/// checksum under the segment's salt, or (when reading for recovery) does not have exactly the
/// next sequence number.
pub struct SegmentReader {
    file: io::BufReader<File>,
    file_len: u64,
    pub format: Format,
    /// The sequence number the next batch must have (None: any, to count what a file holds).
    expect: Option<u64>,
    /// The offset just past the last whole, valid batch (the segment header counts).
    pub valid_len: u64,
    /// Why reading stopped before the end of the file, if it did.
    pub stop: Option<Stop>,
}

impl SegmentReader {
    /// Opens segment file `path`, numbered `segment`; with `expect`, its first batch must
    /// have that sequence number and each later one the next.
    pub fn open(path: &Path, segment: u64, expect: Option<u64>) -> io::Result<SegmentReader> {
        let mut file = File::open(path)?;
        let file_len = file.metadata()?.len();
        let mut head = [0u8; SEGMENT_HEADER];
        let got = read_full(&mut file, &mut head)?;
        let format = Format::of(&head[..got], segment)?;
        io::Seek::seek(&mut file, io::SeekFrom::Start(format.start()))?;
        Ok(SegmentReader {
            file: io::BufReader::with_capacity(1 << 20, file),
            file_len,
            format,
            expect,
            valid_len: format.start(),
            stop: (format == Format::Blank && file_len > 0).then_some(Stop::NoSegmentHeader),
        })
    }

    /// Whether reading stopped at what a crash in the middle of writing leaves, or at damage,
    /// rather than at the end of what the segment's current life wrote.
    pub fn torn(&self) -> bool {
        let Some(stop) = &self.stop else { return false };
        if self.format == Format::Legacy {
            // Appended and cut, never recycled: it ends at the end of the file.
            return true;
        }
        match stop {
            Stop::NoSegmentHeader | Stop::Unused | Stop::NotABatch => false,
            Stop::TornHeader(_) | Stop::Unexpected { .. } => true,
            // Another sequence number than the next: a batch of the file's earlier life.
            Stop::Torn { seq } | Stop::Checksum { seq } => self.expect.is_none_or(|e| e == *seq),
        }
    }

    /// The next batch, or None at the end of the valid part (see `stop`).
    pub fn next_batch(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<u64>> {
        if self.stop.is_some() || self.format == Format::Blank {
            return Ok(None);
        }
        let mut hdr = [0u8; HEADER];
        let got = read_full(&mut self.file, &mut hdr)?;
        if got == 0 {
            return Ok(None);
        }
        let zeros = hdr[..got].iter().all(|b| *b == 0);
        if got < HEADER {
            let magic = got.min(BATCH_MAGIC.len());
            self.stop = Some(if zeros {
                Stop::Unused
            } else if hdr[..magic] == BATCH_MAGIC[..magic] {
                Stop::TornHeader(got)
            } else {
                // The file ends in bytes that do not begin a batch: what stays of an undone
                // one, or of the file's earlier life.
                Stop::NotABatch
            });
            return Ok(None);
        }
        if &hdr[0..4] != BATCH_MAGIC {
            self.stop = Some(if zeros { Stop::Unused } else { Stop::NotABatch });
            return Ok(None);
        }
        let len = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
        let seq = u64::from_le_bytes(hdr[8..16].try_into().unwrap_or([0; 8]));
        let crc = u32::from_le_bytes([hdr[16], hdr[17], hdr[18], hdr[19]]);
        buf.clear();
        // A torn or stale header may claim any length: past the end of the file it is torn
        // without reading (or allocating) anything.
        if self.valid_len + (HEADER + len) as u64 > self.file_len {
            self.stop = Some(Stop::Torn { seq });
            return Ok(None);
        }
        let mut left = len;
        while left > 0 {
            let step = left.min(1 << 20);
            let start = buf.len();
            buf.resize(start + step, 0);
            let got = read_full(&mut self.file, &mut buf[start..])?;
            if got < step {
                self.stop = Some(Stop::Torn { seq });
                return Ok(None);
            }
            left -= step;
        }
        if batch_crc(self.format.salt(), &hdr[4..16], buf) != crc {
            self.stop = Some(Stop::Checksum { seq });
            return Ok(None);
        }
        if let Some(expected) = self.expect {
            if seq != expected {
                self.stop = Some(Stop::Unexpected {
                    expected,
                    found: seq,
                });
                return Ok(None);
            }
            self.expect = Some(expected + 1);
        }
        self.valid_len += (HEADER + len) as u64;
        Ok(Some(seq))
    }
}

/// Reads until `buf` is full or the file ends; how many bytes were read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Makes segment `n` a file with a fresh header (a new salt), durably: a spare if one is left,
/// else a new file. Returns the file and its salt.
fn start_segment(dir: &Path, n: u64, end: EndSync) -> io::Result<(File, u64)> {
    let salt = new_salt()?;
    let header = segment_header(salt, n);
    let path = dir.join(segment_name(n));
    for spare in spares(dir)? {
        let file = match OpenOptions::new().read(true).write(true).open(&spare.path) {
            Ok(f) => f,
            // The checkpointer moved it away to extend it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // The header goes to disk before the file takes the segment's name: after any crash,
        // a file under this name shows this header, never the one of its previous life (whose
        // salt its stale batches pass). An overwrite of a written block: a cheap sync.
        if end == EndSync::Now {
            file.write_all_at(&header, 0)?;
            fdatasync(&file)?;
        } else {
            // Outside `always` the spare's earlier life may still have dirty pages (its
            // segment was never synced): an fdatasync would write them all on this thread.
            // A write through an O_DSYNC descriptor syncs the header's own page (and the
            // device's cache) and nothing else.
            write_header_dsync(&spare.path, &header)?;
        }
        match fs::rename(&spare.path, &path) {
            Ok(()) => {
                // Outside `always` the new name is made durable by the next `Wal::sync` (the
                // periodic timer, a clean stop) or the next checkpoint's directory sync: a
                // crash that loses it loses only batches `periodic`'s timer had not synced
                // yet, or that `never` does not promise.
                if end == EndSync::Now {
                    sync_dir(dir)?;
                }
                return Ok((file, salt));
            }
            // Moved away meanwhile: it will get a new header again when it is used.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    file.write_all_at(&header, 0)?;
    fdatasync(&file)?;
    sync_dir(dir)?;
    Ok((file, salt))
}

/// Writes `header` at the start of the file at `path` through a descriptor opened with
/// `O_DSYNC`: the write returns once that range (and nothing else of the file) is durable.
fn write_header_dsync(path: &Path, header: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(path)?;
    f.write_all_at(header, 0)
}

/// Turns segment `n` (file `path`), which a checkpoint covers, into a spare, or deletes it if
/// `MAX_SPARES` are kept already or it is too long to keep. Its contents stay: they are
/// checksummed under a salt no later segment has.
pub fn retire(dir: &Path, n: u64, path: &Path) -> io::Result<()> {
    let keep = spares(dir)?.len() < MAX_SPARES && fs::metadata(path)?.len() <= SPARE_KEEP_MAX;
    if keep {
        fs::rename(path, dir.join(spare_name(n)))
    } else {
        fs::remove_file(path)
    }
}

/// Spares are extended to at least this...
const SPARE_MIN: u64 = 1 << 20;
/// ...and to at most this: a checkpoint, which ends a segment, starts once the log holds
/// 32 MiB (`CHECKPOINT_BYTES` in writer.rs), so a segment seldom grows past it.
const SPARE_MAX_TARGET: u64 = 32 << 20;

/// The length a spare should have for a segment after one that held `used` bytes: twice that
/// (the load may grow between two checkpoints, which come once a second), rounded up to a
/// MiB, within `SPARE_MIN..=SPARE_MAX_TARGET`. Sized by the load, so an idle store does not
/// write 32 MiB of zeros for nothing, and a busy one seldom appends.
pub fn spare_target(used: u64) -> u64 {
    let mib = 1u64 << 20;
    used.saturating_mul(2)
        .div_ceil(mib)
        .saturating_mul(mib)
        .clamp(SPARE_MIN, SPARE_MAX_TARGET)
}

/// Makes sure a spare of at least `target` bytes exists, extending the longest one (or a new
/// file) with zeros actually written (fallocate's unwritten extents would still need a journal
/// commit, or synchronous metadata writes without a journal, at the first write into them)
/// and synced, so the writer's fdatasyncs in it never flush them or a size change. Slow (up
/// to `SPARE_MAX_TARGET` of writes): for the checkpointer thread, never the writer. The spare
/// being extended has a name the writer does not take (`SPARE_PREP`); renames decide which of
/// the two threads gets a file.
pub fn prepare_spare(dir: &Path, target: u64) -> io::Result<()> {
    let prep = dir.join(SPARE_PREP);
    // Left by a crash while it was being extended: start again.
    match fs::remove_file(&prep) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let list = spares(dir)?;
    if list.iter().any(|s| s.len >= target) {
        return Ok(());
    }
    let name = match list.first() {
        Some(s) => match fs::rename(&s.path, &prep) {
            Ok(()) => s.n,
            // The writer has just made it a segment; the next checkpoint tries again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        },
        None => 0,
    };
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&prep)?;
    let mut at = file.metadata()?.len();
    let zeros = vec![0u8; 1 << 20];
    while at < target {
        let n = (target - at).min(zeros.len() as u64);
        file.write_all_at(&zeros[..n as usize], at)?;
        at += n;
        // A few MiB at a time: a metadata sync the writer waits for (its log growing past a
        // spare's end) must not also wait for tens of MiB of these zeros.
        if at % (4 << 20) == 0 {
            fdatasync(&file)?;
        }
    }
    fdatasync(&file)?;
    fs::rename(&prep, dir.join(spare_name(name)))
}

/// Makes a spare of `target` bytes out of nothing, with `fallocate` (unwritten extents: no
/// zeros written) when no spare exists, for a log whose segments are kept for the values in
/// them (`vlog.rs`): none ever comes back as a spare, and writing each new one's length in
/// zeros first would write the log twice. Appends into it are copies into its mapping
/// (`Mapping`) in `never` and `periodic`, as into a recycled spare; the extents are converted
/// as they are written back. Where `fallocate` is refused, nothing is made (the log grows its
/// file as it is written).
pub fn prepare_spare_unwritten(dir: &Path, target: u64) -> io::Result<()> {
    if !spares(dir)?.is_empty() {
        return prepare_spare(dir, target);
    }
    use std::os::fd::AsRawFd;
    let prep = dir.join(SPARE_PREP);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&prep)?;
    let len = libc::off_t::try_from(target).map_err(io::Error::other)?;
    // SAFETY: a plain system call on a descriptor this function owns.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
        let e = io::Error::last_os_error();
        drop(file);
        let _ = fs::remove_file(&prep);
        return Err(e);
    }
    fdatasync(&file)?;
    fs::rename(&prep, dir.join(spare_name(0)))
}

/// The log as the writer appends to it.
pub struct Wal {
    dir: PathBuf,
    /// Shared with the writer's `vlog::Sink`, which writes separated values into it.
    file: Arc<File>,
    segment: u64,
    salt: u64,
    len: u64,
    next_seq: u64,
    /// Batch bytes appended since the last checkpoint began (what a recovery would replay).
    pub since_checkpoint: u64,
    /// Bytes appended and not yet fdatasynced.
    unsynced: bool,
    /// When replication is on: the batches appended and not yet taken (`take_tapped`); an
    /// undone append leaves it too.
    tap: Option<Vec<Tapped>>,
    /// Whether tapped batches keep a copy of their payload (a replica may want it), or only
    /// their size (no backlog is kept: a copy per batch would be wasted). Shared with the
    /// replication hub, which sets it when a replica asks for the stream, and read at each
    /// append.
    tap_copy: Arc<std::sync::atomic::AtomicBool>,
    /// What the last append added to `since_checkpoint` beyond its bytes (its patches'
    /// values), for `undo`.
    last_patched: u64,
    /// Whether appends may be copies into a shared mapping of the segment (`set_mapped`).
    mapped: bool,
    /// The current segment's mapping, when there is one (see `Mapping`).
    map: Option<Mapping>,
    /// What `rotate` does with the segment it ends (`set_end_sync`).
    end_sync: EndSync,
    /// Segments `rotate` ended with appends not yet synced (`EndSync::Later`), by number:
    /// `sync` syncs them first, unless a checkpoint has covered them since (`drop_covered`).
    behind: Vec<(u64, Arc<File>)>,
    /// A segment took its name since the directory was last synced (outside `EndSync::Now`).
    dir_unsynced: bool,
}

/// Most ended segments `EndSync::Later` keeps for the timer's sync. Each checkpoint that
/// completes forgets the ones it covers (`Wal::drop_covered`), so this is reached only while
/// checkpoints fail.
const BEHIND_MAX: usize = 16;

/// What ending a segment (`Wal::rotate`, once per checkpoint) syncs. In `always` every batch
/// is synced before its reply, so the ended segment has nothing left to sync; outside it, a
/// segment may end with megabytes the kernel has not written back, and syncing them on the
/// writer's thread stalled every write for milliseconds at each checkpoint (20 KiB SETs under
/// a memory cap, `never`: 2.4 ms per rotation, 82 rotations a second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndSync {
    /// `always`: the ended segment, the new header and the directory, before the next append.
    Now,
    /// `periodic`: the new header at once; the ended segment and the directory at the next
    /// `sync` (the timer's), so what the timer promises still holds.
    Later,
    /// `never`: the new header at once; the rest is the kernel's write-back, or the
    /// checkpoint's (whose data file sync and record make the ended segment unneeded).
    Never,
}

/// A shared, writable mapping of a segment file's first `len` bytes, all of them written
/// (a spare's zeros or an earlier life's batches), through which `Wal::append` copies batches
/// in `never` and `periodic` instead of calling `pwrite`.
///
/// Why: at low concurrency every batch is one or two small writes, and the `pwrite` (a system
/// call, ext4's write path for one page) was the largest part of what a SET costs the server
/// beyond what memcached spends (perf, 2 connections of 128-512 byte SETs: 6.8% of the
/// workers' samples). A copy into the mapping puts the bytes in the same page-cache pages a
/// `pwrite` would: they survive the process dying, reach the disk when the kernel writes the
/// file back or at an `fdatasync` (which writes the mapping's dirty pages too), and readers of
/// the file (recovery, replication, `memkeep backup`) see them. What a power cut can leave is
/// what it could leave before: any subset of the dirty pages, some of them half-copied, which
/// the batches' checksums and sequence numbers cut at the first batch not whole.
///
/// Not in `always`: there every batch is followed by an fdatasync, which write-protects the
/// pages it cleans, so the next copy into the same page would take a write fault each time.
/// Only bytes the file already holds on disk are mapped (never past its length, never a
/// block not yet allocated), so a store through the mapping never needs a block the file
/// system could fail to find (which would be SIGBUS rather than an error).
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// The mapping is only written through `&mut Wal`; moving it between threads is safe.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `file`'s first `len` bytes, or None (too short to be worth it, or refused).
    fn new(file: &File, len: u64) -> Option<Mapping> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(len).ok()?;
        if len < MAP_MIN {
            return None;
        }
        // Safety: a fresh shared mapping of a file we hold open; nothing aliases it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            log::debug!(
                "cannot map a log segment ({}): appends are written",
                io::Error::last_os_error()
            );
            return None;
        }
        Some(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Copies `bytes` to `at` in the mapping (false, copying nothing, if they do not fit),
    /// except for the ranges of `bytes` in `skip` (start, length; in order, inside
    /// `bytes`), which are in the file already. Ranges out of order or out of bounds make it
    /// copy everything.
    fn put_except(&mut self, at: u64, bytes: &[u8], skip: &[(usize, usize)]) -> bool {
        let Ok(at) = usize::try_from(at) else {
            return false;
        };
        if at.checked_add(bytes.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        let mut ordered = true;
        let mut from = 0;
        for &(start, len) in skip {
            if start < from || start.checked_add(len).is_none_or(|end| end > bytes.len()) {
                ordered = false;
                break;
            }
            from = start + len;
        }
        let copy = |from: usize, to: usize| {
            // Safety: `at..at + bytes.len()` is inside the mapping (checked above), which
            // lives as long as `self`, `from..to` is inside `bytes`, and `bytes` is ordinary
            // memory, never part of the mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr().add(from),
                    self.ptr.add(at + from),
                    to - from,
                )
            };
        };
        if !ordered {
            copy(0, bytes.len());
            return true;
        }
        let mut from = 0;
        for &(start, len) in skip {
            copy(from, start);
            from = start + len;
        }
        copy(from, bytes.len());
        true
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Safety: unmaps exactly what `new` mapped; the dirty pages stay in the page cache.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Segments shorter than this are written, not mapped (a new file holds only its header).
const MAP_MIN: usize = 1 << 20;

/// How many bytes of value a `PATCH` record's replay rewrites for one byte of log it counts
/// as toward the next checkpoint (`Wal::since_checkpoint`). Replaying a patch is a few copies
/// of one value (read, patch, checksum, put into pages the transaction already holds), far
/// cheaper per byte than replaying small records, each a B-tree descent. At par, 1,000 appends
/// of 16 bytes to a 1 MiB value forced a checkpoint every 32 appends and an LMDB commit every
/// 4; at 8 to 1 a full checkpoint interval of such patches (256 of 1 MiB) replays in tens of
/// milliseconds.
const PATCH_REPLAY_DISCOUNT: u64 = 8;

/// A batch the log appended, as replication sees it (`Wal::take_tapped`).
#[derive(Debug)]
pub struct Tapped {
    pub seq: u64,
    /// The payload's length (its stream frame's size follows from it).
    pub len: usize,
    /// The payload, if copies were being kept when it was appended.
    pub payload: Option<Vec<u8>>,
}

impl Wal {
    /// Continues segment `segment`, of `format`, after its first `len` bytes (truncating
    /// anything past them, durably: see the module's invariants), or starts it afresh when it
    /// is `Format::Blank`; the next batch gets `next_seq`. A legacy segment is not written
    /// any more: the log goes on in the next segment.
    pub fn resume(
        dir: &Path,
        segment: u64,
        format: Format,
        len: u64,
        next_seq: u64,
    ) -> io::Result<Wal> {
        let path = dir.join(segment_name(segment));
        let (file, salt, len) = match format {
            Format::Blank => {
                let (file, salt) = start_segment(dir, segment, EndSync::Now)?;
                (file, salt, SEGMENT_HEADER as u64)
            }
            Format::Salted(_) | Format::Legacy => {
                let file = OpenOptions::new().read(true).write(true).open(&path)?;
                if file.metadata()?.len() != len {
                    file.set_len(len)?;
                    fdatasync(&file)?;
                }
                (file, format.salt().unwrap_or(0), len)
            }
        };
        let mut w = Wal {
            dir: dir.to_path_buf(),
            file: Arc::new(file),
            segment,
            salt,
            len,
            next_seq,
            since_checkpoint: len.saturating_sub(format.start()),
            unsynced: false,
            tap: None,
            tap_copy: Arc::default(),
            last_patched: 0,
            mapped: false,
            map: None,
            end_sync: EndSync::Now,
            behind: Vec::new(),
            dir_unsynced: false,
        };
        if format == Format::Legacy {
            // Its checksums carry no salt, so what `undo` leaves in it would not be safe.
            w.rotate()?;
        }
        Ok(w)
    }

    pub fn segment(&self) -> u64 {
        self.segment
    }

    /// The directory the log (and the store) lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The sequence number of the last batch appended (0: none ever).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Where the next batch will start (to undo an append whose commit then failed).
    pub fn position(&self) -> u64 {
        self.len
    }

    /// The current segment's file (separated values are written into it: `vlog::Sink`).
    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    /// Appends `batch` (page cache only; see `sync`) and returns its sequence number.
    pub fn append(&mut self, batch: &mut LogBuf) -> io::Result<u64> {
        let seq = self.next_seq;
        let patched = batch.patched_bytes() / PATCH_REPLAY_DISCOUNT;
        // Taken out while `seal` borrows the batch, then given back (its capacity kept).
        let mut written = std::mem::take(&mut batch.written);
        let bytes = batch.seal(seq, self.salt)?;
        if !self
            .map
            .as_mut()
            .is_some_and(|m| m.put_except(self.len, bytes, &written))
        {
            self.file.write_all_at(bytes, self.len)?;
        }
        let n = bytes.len() as u64;
        written.clear();
        batch.written = written;
        self.len += n;
        // A patch replays as a rewrite of its whole value: that is what the log's length
        // since the checkpoint stands for (the recovery's work), so it counts too, at the
        // discount below.
        self.since_checkpoint += n + patched;
        self.last_patched = patched;
        self.next_seq += 1;
        self.unsynced = true;
        if let Some(tap) = self.tap.as_mut() {
            let payload = batch.payload();
            tap.push(Tapped {
                seq,
                len: payload.len(),
                payload: self
                    .tap_copy
                    .load(std::sync::atomic::Ordering::Acquire)
                    .then(|| payload.to_vec()),
            });
        }
        Ok(seq)
    }

    /// Notes every batch appended from now on, for `take_tapped` (replication).
    pub fn set_tap(&mut self, on: bool) {
        self.tap = on.then(Vec::new);
    }

    /// The flag that says whether the batches tapped from now on keep a copy of their
    /// payload (the replication hub's).
    pub fn share_tap_copy(&mut self, flag: Arc<std::sync::atomic::AtomicBool>) {
        self.tap_copy = flag;
    }

    /// Moves the batches tapped since the last call into `out`, in sequence order.
    pub fn take_tapped(&mut self, out: &mut Vec<Tapped>) {
        if let Some(tap) = self.tap.as_mut() {
            out.append(tap);
        }
    }

    /// Takes back the last append (its LMDB commit failed, so no reply will claim it), which
    /// started at `position` with sequence number `seq`. The file keeps its length (shrinking
    /// it would make the next appends grow it again): the batch's header becomes zeros, which
    /// end the segment there until the next append overwrites them. What stays of its payload
    /// past a shorter next batch holds client bytes, but no checksum under this segment's
    /// salt, which no client knows. Synced, so a power cut cannot bring back a batch whose
    /// writes were answered with an error.
    pub fn undo(&mut self, position: u64, seq: u64) -> io::Result<()> {
        self.file.write_all_at(&[0u8; HEADER], position)?;
        fdatasync(&self.file)?;
        self.unsynced = false;
        self.since_checkpoint = self
            .since_checkpoint
            .saturating_sub(self.len - position + self.last_patched);
        self.last_patched = 0;
        self.len = position;
        self.next_seq = seq;
        if let Some(tap) = self.tap.as_mut() {
            tap.retain(|t| t.seq < seq);
        }
        Ok(())
    }

    /// Lets appends copy into a mapping of the segment (`Mapping`; `never` and `periodic`),
    /// from the current segment on. Off drops the mapping.
    pub fn set_mapped(&mut self, on: bool) {
        self.mapped = on;
        self.map = None;
        if on {
            self.map = self
                .file
                .metadata()
                .ok()
                .and_then(|m| Mapping::new(&self.file, m.len()));
        }
    }

    /// Sets what `rotate` syncs of the segment it ends (see `EndSync`).
    pub fn set_end_sync(&mut self, end: EndSync) {
        self.end_sync = end;
    }

    /// Makes every append so far durable, in segments `rotate` ended unsynced too, and the
    /// current segment's name.
    pub fn sync(&mut self) -> io::Result<()> {
        for (_, f) in self.behind.drain(..) {
            fdatasync(&f)?;
        }
        if self.unsynced {
            fdatasync(&self.file)?;
            self.unsynced = false;
        }
        if self.dir_unsynced {
            sync_dir(&self.dir)?;
            self.dir_unsynced = false;
        }
        Ok(())
    }

    pub fn unsynced(&self) -> bool {
        self.unsynced || !self.behind.is_empty() || self.dir_unsynced
    }

    /// Forgets the ended segments before `first_needed`, the first segment the last completed
    /// checkpoint replays from: their batches are in its snapshot, synced with the data file,
    /// so they need no sync of their own.
    pub fn drop_covered(&mut self, first_needed: u64) {
        self.behind.retain(|(n, _)| *n >= first_needed);
    }

    /// Ends the current segment and starts the next, in a spare when one is left; returns the
    /// new segment number. Batches appended from now on are the ones a checkpoint taken now
    /// does not hold. In `EndSync::Now` the ended segment is synced first, and the new
    /// segment's header and name are durable before it returns (two small syncs); otherwise
    /// only its header is (see `EndSync`). No zero-filling: spares are extended on the
    /// checkpointer thread (`prepare_spare`).
    pub fn rotate(&mut self) -> io::Result<u64> {
        if self.end_sync == EndSync::Now {
            self.sync()?;
        }
        let next = self.segment + 1;
        let (file, salt) = start_segment(&self.dir, next, self.end_sync)?;
        self.map = None;
        if self.mapped {
            self.map = Mapping::new(&file, file.metadata()?.len());
        }
        let ended = std::mem::replace(&mut self.file, Arc::new(file));
        if self.end_sync != EndSync::Now {
            self.dir_unsynced = true;
            if self.unsynced && self.end_sync == EndSync::Later {
                self.behind.push((self.segment, ended));
                if self.behind.len() > BEHIND_MAX {
                    // Checkpoints are not completing: sync here rather than hold more files.
                    for (_, f) in self.behind.drain(..) {
                        fdatasync(&f)?;
                    }
                }
            }
            self.unsynced = false;
        }
        self.segment = next;
        self.salt = salt;
        self.len = SEGMENT_HEADER as u64;
        self.since_checkpoint = 0;
        Ok(next)
    }
}

/// The recovery point: an LMDB snapshot that is entirely on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The snapshot's LMDB transaction id.
    pub txnid: u64,
    /// The last batch the snapshot holds (0: none).
    pub seq: u64,
    /// The first log segment that may hold batches after `seq`.
    pub segment: u64,
    /// The snapshot's meta page, as LMDB wrote it (one page, `page.len()` is the page size).
    pub page: Vec<u8>,
    /// CRC-32 of the snapshot's two root pages (`root_digest`): recovery checks the data file
    /// still holds them before it writes this meta page into it.
    pub roots: u32,
}

impl Checkpoint {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(40 + self.page.len());
        b.extend_from_slice(CKPT_MAGIC);
        b.extend_from_slice(&CKPT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.txnid.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.segment.to_le_bytes());
        b.extend_from_slice(&self.roots.to_le_bytes());
        b.extend_from_slice(&(self.page.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.page);
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Checkpoint, String> {
        let bad = |why: &str| Err(format!("checkpoint record is damaged: {why}"));
        if b.len() < 44 || &b[0..4] != CKPT_MAGIC {
            return bad("no header");
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return bad("checksum mismatch");
        }
        let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or([0; 8]));
        if u32_at(4) != CKPT_VERSION {
            return bad("unknown version");
        }
        let plen = u32_at(36) as usize;
        if body.len() != 40 + plen || plen < META_END {
            return bad("bad length");
        }
        let c = Checkpoint {
            txnid: u64_at(8),
            seq: u64_at(16),
            segment: u64_at(24),
            roots: u32_at(32),
            page: body[40..].to_vec(),
        };
        if meta_txnid(&c.page) != Some(c.txnid) {
            return bad("meta page does not match its transaction id");
        }
        Ok(c)
    }
}

/// The transaction id an LMDB meta page records, if `page` is one.
pub fn meta_txnid(page: &[u8]) -> Option<u64> {
    let magic = u32::from_le_bytes(
        page.get(META_MAGIC_AT..META_MAGIC_AT + 4)?
            .try_into()
            .ok()?,
    );
    if magic != LMDB_MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(
        page.get(META_TXNID_AT..META_TXNID_AT + 8)?
            .try_into()
            .ok()?,
    ))
}

/// CRC-32 of the root pages of the main and free-page trees that meta page `meta` names, as
/// the data file holds them now. The pages of a checkpoint's snapshot are never rewritten while
/// it is the recovery point, so after any crash the same file gives the same digest; another
/// file put in its place (a backup copied over it) does not.
pub fn root_digest(data: &File, meta: &[u8]) -> io::Result<u32> {
    let psize = meta.len();
    let mut h = crc32fast::Hasher::new();
    let mut page = vec![0u8; psize];
    for at in [META_MAIN_ROOT_AT, META_FREE_ROOT_AT] {
        let root = u64::from_le_bytes(meta[at..at + 8].try_into().unwrap_or([0xff; 8]));
        if root == u64::MAX {
            // An empty tree has no root page.
            h.update(&root.to_le_bytes());
            continue;
        }
        data.read_exact_at(&mut page, root.saturating_mul(psize as u64))?;
        h.update(&page);
    }
    Ok(h.finalize())
}

/// Bytes of data file the snapshot that meta page `meta` describes needs.
pub fn meta_needs(meta: &[u8]) -> u64 {
    let last = u64::from_le_bytes(
        meta[META_LAST_PG_AT..META_LAST_PG_AT + 8]
            .try_into()
            .unwrap_or([0; 8]),
    );
    last.saturating_add(1).saturating_mul(meta.len() as u64)
}

/// The last checkpoint in `dir`, if one was ever written.
pub fn read_checkpoint(dir: &Path) -> Result<Option<Checkpoint>, String> {
    let path = dir.join(CHECKPOINT_FILE);
    match fs::read(&path) {
        Ok(b) => Checkpoint::decode(&b)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Replaces the checkpoint record durably.
pub fn write_checkpoint(dir: &Path, c: &Checkpoint) -> io::Result<()> {
    let tmp = dir.join("checkpoint.tmp");
    {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all_at(&c.encode(), 0)?;
        fdatasync(&f)?;
    }
    fs::rename(&tmp, dir.join(CHECKPOINT_FILE))?;
    sync_dir(dir)
}

/// Reads the meta page LMDB wrote for transaction `txnid` from the data file (page cache).
pub fn read_meta_page(data: &File, txnid: u64, page_size: usize) -> io::Result<Vec<u8>> {
    let mut page = vec![0u8; page_size];
    data.read_exact_at(&mut page, (txnid & 1) * page_size as u64)?;
    match meta_txnid(&page) {
        Some(t) if t == txnid => Ok(page),
        other => Err(io::Error::other(format!(
            "meta page {} holds transaction {other:?}, not {txnid}",
            txnid & 1
        ))),
    }
}

/// Puts the checkpoint's meta page into both meta slots of the data file and syncs it, so LMDB
/// opens at the checkpoint's snapshot whatever its own meta pages say.
pub fn restore_meta(data: &File, c: &Checkpoint) -> io::Result<()> {
    for slot in 0..2u64 {
        let mut page = c.page.clone();
        // The page header's own page number.
        page[0..8].copy_from_slice(&slot.to_le_bytes());
        data.write_all_at(&page, slot * c.page.len() as u64)?;
    }
    fdatasync(data)
}

/// A batch with a valid checksum as a segment of `format` holds it (tests plant and damage
/// batches with it).
#[cfg(test)]
pub(crate) fn raw_batch(format: Format, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = BATCH_MAGIC.to_vec();
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    let crc = batch_crc(format.salt(), &b[4..16], payload);
    b.extend_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(payload);
    b
}

#[cfg(test)]
mod tests {
    #[test]
    fn crcs_of_edits_follow_the_crc_of_the_value_before() {
        use super::crc_edit;
        let mut rng = crate::test_rng::Xorshift(0x9e37_79b9_7f4a_7c15);
        let mut next = |n: u64| rng.below(n) as usize;
        let mut v: Vec<u8> = (0..5000).map(|i| (i * 7 % 251) as u8).collect();
        let mut crc = crc32fast::hash(&v);
        for _ in 0..2000 {
            let data: Vec<u8> = (0..1 + next(300)).map(|_| next(256) as u8).collect();
            match next(4) {
                0 => {
                    crc = crc_edit::prepend(crc, v.len(), &data);
                    v.splice(0..0, data.iter().copied());
                }
                1 => {
                    let gap = next(3) * next(50);
                    crc = crc_edit::append(crc, v.len(), gap, &data);
                    v.resize(v.len() + gap, 0);
                    v.extend_from_slice(&data);
                }
                _ => {
                    let at = next((v.len() - data.len()) as u64 + 1);
                    let old = v[at..at + data.len()].to_vec();
                    crc = crc_edit::overwrite(crc, v.len(), at, &old, &data).expect("fits");
                    v[at..at + data.len()].copy_from_slice(&data);
                }
            }
            assert_eq!(crc, crc32fast::hash(&v), "after an edit, {} bytes", v.len());
        }
        assert_eq!(crc_edit::overwrite(crc, 10, 8, b"abc", b"xyz"), None);
    }

    use super::*;

    #[test]
    fn records_round_trip() {
        let mut b = LogBuf::default();
        assert!(b.is_empty());
        b.put(3, b"key", &[b"he", b"llo"]);
        b.del(0, b"gone");
        b.clear(5);
        b.put(1, b"", &[]);
        let payload = b.buf[HEADER..].to_vec();
        let got: Vec<Op> = ops(&payload).collect::<Result<_, _>>().expect("parses");
        assert_eq!(
            got,
            vec![
                Op::Put {
                    db: 3,
                    key: b"key",
                    value: b"hello"
                },
                Op::Del {
                    db: 0,
                    key: b"gone"
                },
                Op::Clear { db: 5 },
                Op::Put {
                    db: 1,
                    key: b"",
                    value: b""
                },
            ]
        );
        assert!(ops(&payload[..payload.len() - 3]).any(|r| r.is_err()));
    }

    fn put_batch(v: &[u8]) -> LogBuf {
        let mut b = LogBuf::default();
        b.put(0, b"k", &[v]);
        b
    }

    fn wal_with(dir: &Path, batches: &[&[u8]]) -> Wal {
        let mut w = Wal::resume(dir, 1, Format::Blank, 0, 1).expect("wal");
        for v in batches {
            w.append(&mut put_batch(v)).expect("append");
        }
        w.sync().expect("sync");
        w
    }

    /// Appends copied into a mapping of a recycled segment (`Mapping`) are in the file, for
    /// recovery's reader, without any sync, past a taken-back append, and across a rotation
    /// into a file too short to map.
    #[test]
    fn appends_through_a_mapping_read_back_like_written_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        prepare_spare(dir.path(), 2 << 20).expect("spare");
        let mut w = Wal::resume(dir.path(), 1, Format::Blank, 0, 1).expect("wal");
        w.set_mapped(true);
        assert!(w.map.is_some(), "a 2 MiB spare is mapped");
        let big = vec![7u8; 100_000];
        for v in [&b"one"[..], &big, b"two"] {
            w.append(&mut put_batch(v)).expect("append");
        }
        let at = w.position();
        w.append(&mut put_batch(b"taken back")).expect("append");
        w.undo(at, 4).expect("undo");
        w.append(&mut put_batch(b"four")).expect("append");
        let n = w.rotate().expect("rotate");
        assert!(w.map.is_none(), "a new file holds only its header");
        w.append(&mut put_batch(b"five")).expect("append");
        drop(w);
        let (seqs, _) = read_from(&dir.path().join(segment_name(1)), 1, 1);
        assert_eq!(seqs, vec![1, 2, 3, 4]);
        let values = put_values(&dir.path().join(segment_name(1)), 1);
        assert_eq!(
            values,
            vec![b"one".to_vec(), big, b"two".to_vec(), b"four".to_vec()]
        );
        let (seqs, _) = read_from(&dir.path().join(segment_name(n)), n, 5);
        assert_eq!(seqs, vec![5]);
    }

    /// Through a mapping, the ranges a batch notes as already written (a separated value the
    /// sink wrote at its place) are not copied again: what is in the file there stays. With
    /// the sink's bytes there, the batch reads back whole; ranges out of order are copied.
    #[test]
    fn an_append_through_a_mapping_skips_the_values_already_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        prepare_spare(dir.path(), 2 << 20).expect("spare");
        let mut w = Wal::resume(dir.path(), 1, Format::Blank, 0, 1).expect("wal");
        w.set_mapped(true);
        assert!(w.map.is_some(), "a 2 MiB spare is mapped");
        let at_value = HEADER + 8 + 1;
        let file = w.file();
        // The first batch's value range holds other bytes: the append must leave them.
        let first = vec![b'v'; 30_000];
        let start = w.position();
        file.write_all_at(&vec![b's'; first.len()], start + at_value as u64)
            .expect("sink write");
        let mut b = put_batch(&first);
        b.note_written((at_value, first.len()));
        w.append(&mut b).expect("append");
        let mut there = vec![0u8; first.len() + 2];
        file.read_exact_at(&mut there, start + at_value as u64 - 1)
            .expect("read");
        assert!(
            there[1..=first.len()].iter().all(|&c| c == b's'),
            "a noted range was copied again"
        );
        assert_eq!(there[0], b'k', "the key before the range was copied");
        // Undone, and written again the way the writer does: the sink's bytes first.
        w.undo(start, 1).expect("undo");
        let second = vec![b'w'; 30_000];
        file.write_all_at(&second, start + at_value as u64)
            .expect("sink write");
        let mut b = put_batch(&second);
        b.note_written((at_value, second.len()));
        w.append(&mut b).expect("append");
        // Ranges out of order: everything is copied.
        let third = vec![b'x'; 5_000];
        let mut b = put_batch(&third);
        b.note_written((at_value + 10, 10));
        b.note_written((at_value, 5));
        w.append(&mut b).expect("append");
        drop(w);
        let values = put_values(&dir.path().join(segment_name(1)), 1);
        assert_eq!(values, vec![second, third]);
    }

    /// The values of every `PUT` in segment file `path`, numbered `n`, in log order.
    fn put_values(path: &Path, n: u64) -> Vec<Vec<u8>> {
        let mut r = SegmentReader::open(path, n, Some(1)).expect("open");
        let mut buf = Vec::new();
        let mut values = Vec::new();
        while r.next_batch(&mut buf).expect("read").is_some() {
            for op in ops(&buf) {
                if let Ok(Op::Put { value, .. }) = op {
                    values.push(value.to_vec());
                }
            }
        }
        values
    }

    /// Reads segment file `path`, numbered `n`, as recovery does with `first` next.
    fn read_from(path: &Path, n: u64, first: u64) -> (Vec<u64>, SegmentReader) {
        let mut r = SegmentReader::open(path, n, Some(first)).expect("open");
        let mut seqs = Vec::new();
        let mut buf = Vec::new();
        while let Some(s) = r.next_batch(&mut buf).expect("read") {
            seqs.push(s);
        }
        (seqs, r)
    }

    fn read_all(path: &Path) -> (Vec<u64>, SegmentReader) {
        read_from(path, 1, 1)
    }

    fn salt_of(path: &Path, n: u64) -> u64 {
        match SegmentReader::open(path, n, None).expect("open").format {
            Format::Salted(s) => s,
            other => panic!("{} is {other:?}", path.display()),
        }
    }

    fn ino(path: &Path) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&fs::metadata(path).expect("stat"))
    }

    /// Bytes of a batch `put_batch(v)` makes.
    fn put_len(v: &[u8]) -> usize {
        HEADER + 8 + 1 + v.len()
    }

    #[test]
    fn torn_and_damaged_tails_end_the_segment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = wal_with(dir.path(), &[b"one", b"two", b"three"]);
        let path = dir.path().join(segment_name(1));
        let full = fs::read(&path).expect("read");
        assert_eq!(&full[..4], SEGMENT_MAGIC);
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1, 2, 3]);
        assert_eq!(r.valid_len, full.len() as u64);
        assert!(r.stop.is_none());
        drop(w);
        // Cut inside the last batch: two batches stay.
        fs::write(&path, &full[..full.len() - 2]).expect("write");
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1, 2]);
        assert_eq!(r.stop, Some(Stop::Torn { seq: 3 }));
        assert!(r.torn());
        // A flipped byte in the second batch's payload: only the first stays.
        let mut bad = full.clone();
        let second = r.valid_len as usize - 1;
        bad[second] ^= 0x40;
        fs::write(&path, &bad).expect("write");
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1]);
        assert_eq!(r.stop, Some(Stop::Checksum { seq: 2 }));
        // Zeros where a batch should start (a page that never reached the disk).
        let mut zeroed = full.clone();
        let second_at = SEGMENT_HEADER + put_len(b"one");
        zeroed[second_at..second_at + HEADER].fill(0);
        fs::write(&path, &zeroed).expect("write");
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1]);
        assert_eq!(r.stop, Some(Stop::Unused));
        assert!(!r.torn());
    }

    #[test]
    fn a_batch_must_have_exactly_the_next_sequence_number() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(wal_with(dir.path(), &[b"a", b"b", b"c"]));
        let path = dir.path().join(segment_name(1));
        // Expecting batch 2 first (as if batch 1 were covered by a checkpoint): nothing is read.
        let (seqs, r) = read_from(&path, 1, 2);
        assert!(seqs.is_empty());
        assert_eq!(
            r.stop,
            Some(Stop::Unexpected {
                expected: 2,
                found: 1
            })
        );
        assert_eq!(r.valid_len, SEGMENT_HEADER as u64);
        // A header naming another segment is not this segment's: nothing in it is read.
        let (seqs, r) = read_from(&path, 7, 1);
        assert!(seqs.is_empty());
        assert_eq!(r.format, Format::Blank);
    }

    #[test]
    fn resume_cuts_the_tail_and_continues_the_sequence() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(wal_with(dir.path(), &[b"a", b"b"]));
        let path = dir.path().join(segment_name(1));
        let (_, r) = read_all(&path);
        let keep = r.valid_len;
        let mut bytes = fs::read(&path).expect("read");
        bytes.extend_from_slice(b"MKWBgarbage");
        fs::write(&path, &bytes).expect("write");
        let salt = salt_of(&path, 1);
        let mut w = Wal::resume(dir.path(), 1, Format::Salted(salt), keep, 3).expect("resume");
        assert_eq!(fs::metadata(&path).expect("stat").len(), keep);
        let mut b = LogBuf::default();
        b.del(0, b"k");
        assert_eq!(w.append(&mut b).expect("append"), 3);
        w.sync().expect("sync");
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(r.stop.is_none());
    }

    #[test]
    fn undo_zeroes_the_batch_without_shrinking_the_file_and_the_next_append_goes_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(segment_name(1));
        let mut w = wal_with(dir.path(), &[b"a"]);
        let (pos, seq) = (w.position(), w.last_seq() + 1);
        w.append(&mut put_batch(b"a long value that the undo takes back"))
            .expect("append");
        let grown = fs::metadata(&path).expect("stat").len();
        w.undo(pos, seq).expect("undo");
        assert_eq!(fs::metadata(&path).expect("stat").len(), grown);
        assert_eq!(w.position(), pos);
        // Taken back: the zeroed header ends the segment, and it is no torn tail.
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1]);
        assert_eq!(r.stop, Some(Stop::Unused));
        assert!(!r.torn());
        // A shorter batch in its place, then one more: both follow, nothing of the undone one.
        assert_eq!(w.append(&mut put_batch(b"z")).expect("append"), seq);
        assert_eq!(w.append(&mut put_batch(b"y")).expect("append"), seq + 1);
        w.sync().expect("sync");
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(!r.torn(), "{:?}", r.stop);
        assert_eq!(fs::metadata(&path).expect("stat").len(), grown);
    }

    #[test]
    fn a_batch_planted_in_a_value_behind_an_undo_is_not_replayed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(segment_name(1));
        let mut w = wal_with(dir.path(), &[b"a"]);
        let salt = salt_of(&path, 1);
        // A client's value: 16 filler bytes, then a whole fake batch 3 that sets "k".
        let mut fake_payload = LogBuf::default();
        fake_payload.put(0, b"k", &[b"planted"]);
        let fake_payload = fake_payload.buf[HEADER..].to_vec();
        let filler = [b'x'; 16];
        for (format, planted_in_this_salt) in [
            (Format::Legacy, false),
            (Format::Salted(salt ^ 1), false),
            (Format::Salted(0), false),
            // The control: with the segment's own salt the same bytes would be replayed.
            (Format::Salted(salt), true),
        ] {
            let fake = raw_batch(format, 3, &fake_payload);
            let mut value = filler.to_vec();
            value.extend_from_slice(&fake);
            let (pos, seq) = (w.position(), w.last_seq() + 1);
            w.append(&mut put_batch(&value)).expect("append");
            w.undo(pos, seq).expect("undo");
            // The next batch ends exactly where the fake starts in the undone payload.
            assert_eq!(w.append(&mut put_batch(&filler)).expect("append"), 2);
            assert_eq!(w.position(), pos + put_len(&filler) as u64);
            w.sync().expect("sync");
            let (seqs, r) = read_all(&path);
            if planted_in_this_salt {
                assert_eq!(seqs, vec![1, 2, 3]);
            } else {
                assert_eq!(seqs, vec![1, 2], "{format:?}");
                assert_eq!(r.stop, Some(Stop::Checksum { seq: 3 }), "{format:?}");
            }
            w.undo(pos, seq).expect("undo");
        }
    }

    #[test]
    fn a_recycled_segment_replays_only_what_its_new_life_wrote() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |n| dir.path().join(segment_name(n));
        let v = [7u8; 100];
        let mut w = wal_with(dir.path(), &[&v, &v, &v, &v, &v]);
        let old = fs::read(p(1)).expect("read");
        assert_eq!(w.rotate().expect("rotate"), 2);
        assert!(spares(dir.path()).expect("spares").is_empty());
        // A checkpoint covers segment 1: it becomes a spare, contents and all.
        retire(dir.path(), 1, &p(1)).expect("retire");
        let spare = dir.path().join(spare_name(1));
        assert_eq!(fs::read(&spare).expect("read"), old);
        let spare_ino = ino(&spare);
        w.append(&mut put_batch(&v)).expect("append");
        assert_eq!(w.rotate().expect("rotate"), 3);
        // Segment 3 is the spare's file, which keeps its length.
        assert_eq!(ino(&p(3)), spare_ino);
        assert!(spares(dir.path()).expect("spares").is_empty());
        assert_eq!(fs::metadata(p(3)).expect("stat").len(), old.len() as u64);
        // One batch of the new life, as long as the old ones: right behind it lies old batch 2,
        // whole and checksummed under the old salt.
        assert_eq!(w.append(&mut put_batch(&v)).expect("append"), 7);
        w.sync().expect("sync");
        let (seqs, r) = read_from(&p(3), 3, 7);
        assert_eq!(seqs, vec![7]);
        assert_eq!(r.stop, Some(Stop::Checksum { seq: 2 }));
        assert!(!r.torn(), "stale bytes are not a torn tail");
        assert_eq!(r.valid_len, (SEGMENT_HEADER + put_len(&v)) as u64);
        // Even with the sequence number the reader wants next, the old batch does not pass.
        let (seqs, r) = read_from(&p(3), 3, 2);
        assert!(seqs.is_empty());
        assert_eq!(
            r.stop,
            Some(Stop::Unexpected {
                expected: 2,
                found: 7
            })
        );
    }

    #[test]
    fn rotate_takes_a_prepared_spare_and_spares_are_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |n| dir.path().join(segment_name(n));
        let mut w = wal_with(dir.path(), &[b"a"]);
        // No spare yet: the checkpointer makes one of zeros.
        prepare_spare(dir.path(), 1 << 20).expect("prepare");
        let s = spares(dir.path()).expect("spares");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].len, 1 << 20);
        assert!(fs::read(&s[0].path).expect("read").iter().all(|b| *b == 0));
        // Long enough already: nothing to do.
        prepare_spare(dir.path(), 1 << 20).expect("prepare again");
        assert_eq!(spares(dir.path()).expect("spares").len(), 1);
        let spare_ino = ino(&s[0].path);
        assert_eq!(w.rotate().expect("rotate"), 2);
        assert_eq!(ino(&p(2)), spare_ino);
        assert_eq!(fs::metadata(p(2)).expect("stat").len(), 1 << 20);
        assert!(spares(dir.path()).expect("spares").is_empty());
        w.append(&mut put_batch(b"b")).expect("append");
        w.sync().expect("sync");
        let (seqs, r) = read_from(&p(2), 2, 2);
        assert_eq!(seqs, vec![2]);
        assert_eq!(r.stop, Some(Stop::Unused));
        // The log does not grow its file while it fits.
        assert_eq!(fs::metadata(p(2)).expect("stat").len(), 1 << 20);
        // A short spare is extended with zeros after what it holds.
        w.rotate().expect("rotate");
        w.rotate().expect("rotate");
        retire(dir.path(), 1, &p(1)).expect("retire");
        let held = fs::read(dir.path().join(spare_name(1))).expect("read");
        prepare_spare(dir.path(), 2 << 20).expect("prepare");
        let extended = fs::read(dir.path().join(spare_name(1))).expect("read");
        assert_eq!(extended.len(), 2 << 20);
        assert_eq!(&extended[..held.len()], &held[..]);
        assert!(extended[held.len()..].iter().all(|b| *b == 0));
        // At most MAX_SPARES: the next covered segments are deleted.
        retire(dir.path(), 2, &p(2)).expect("retire");
        retire(dir.path(), 3, &p(3)).expect("retire");
        assert_eq!(spares(dir.path()).expect("spares").len(), MAX_SPARES);
        assert!(!p(3).exists());
        assert_eq!(
            segments(dir.path())
                .expect("segments")
                .iter()
                .map(|s| s.0)
                .collect::<Vec<_>>(),
            vec![4]
        );
    }

    /// Outside `always` a rotation syncs neither the ended segment nor the directory (see
    /// `EndSync`): `periodic` keeps the ended segment for its next `sync`, `never` leaves it to
    /// the kernel; both still give the spare its own header before it takes the name.
    #[test]
    fn segments_ended_outside_always_wait_for_the_next_sync() {
        for end in [EndSync::Later, EndSync::Never] {
            let dir = tempfile::tempdir().expect("tempdir");
            let p = |n| dir.path().join(segment_name(n));
            let mut w = wal_with(dir.path(), &[b"a"]);
            w.set_end_sync(end);
            // A spare with an earlier life: segment 1's header and batch, another salt.
            let earlier = fs::read(p(1)).expect("read");
            let spare = dir.path().join(spare_name(9));
            fs::write(&spare, &earlier).expect("write");
            prepare_spare(dir.path(), 1 << 20).expect("prepare");
            w.append(&mut put_batch(b"b")).expect("append");
            assert!(w.unsynced());
            assert_eq!(w.rotate().expect("rotate"), 2, "{end:?}");
            assert_eq!(
                w.behind.len(),
                usize::from(end == EndSync::Later),
                "{end:?}"
            );
            assert!(w.dir_unsynced, "{end:?}");
            assert!(w.unsynced(), "{end:?}");
            w.append(&mut put_batch(b"c")).expect("append");
            assert_eq!(read_from(&p(1), 1, 1).0, vec![1, 2], "{end:?}");
            let (seqs, r) = read_from(&p(2), 2, 3);
            assert_eq!(seqs, vec![3], "{end:?}");
            assert_ne!(r.format, Format::Blank);
            assert_ne!(salt_of(&p(2), 2), salt_of(&p(1), 1));
            w.sync().expect("sync");
            assert!(!w.unsynced(), "{end:?}");
            assert!(w.behind.is_empty() && !w.dir_unsynced, "{end:?}");
            if end == EndSync::Later {
                // A checkpoint from segment 3 on covers segment 2: it needs no sync of its own.
                w.append(&mut put_batch(b"d")).expect("append");
                assert_eq!(w.rotate().expect("rotate"), 3);
                w.drop_covered(2);
                assert_eq!(w.behind.iter().map(|b| b.0).collect::<Vec<_>>(), vec![2]);
                w.drop_covered(3);
                assert!(w.behind.is_empty());
            }
        }
    }

    #[test]
    fn an_old_format_segment_is_read_and_not_written_any_more() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |n| dir.path().join(segment_name(n));
        // Batches from byte 0, checksums without a salt: what the previous format wrote.
        let payload = put_batch(b"v").buf[HEADER..].to_vec();
        let mut old = Vec::new();
        for seq in 1..=3 {
            old.extend_from_slice(&raw_batch(Format::Legacy, seq, &payload));
        }
        fs::write(p(1), &old).expect("write");
        let (seqs, r) = read_all(&p(1));
        assert_eq!(r.format, Format::Legacy);
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(r.stop.is_none());
        // Resumed: the old segment is left as it is, and the log goes on in a new one.
        let mut w = Wal::resume(dir.path(), 1, Format::Legacy, r.valid_len, 4).expect("resume");
        assert_eq!(w.segment(), 2);
        w.append(&mut put_batch(b"w")).expect("append");
        w.sync().expect("sync");
        assert_eq!(fs::read(p(1)).expect("read"), old);
        let (seqs, r) = read_from(&p(2), 2, 4);
        assert!(matches!(r.format, Format::Salted(_)));
        assert_eq!(seqs, vec![4]);
        // A salted checksum does not pass in an old-format segment, nor the reverse.
        let mut mixed = old.clone();
        mixed.extend_from_slice(&raw_batch(Format::Salted(5), 4, &payload));
        fs::write(p(1), &mixed).expect("write");
        let (seqs, r) = read_all(&p(1));
        assert_eq!(seqs, vec![1, 2, 3]);
        assert_eq!(r.stop, Some(Stop::Checksum { seq: 4 }));
    }

    #[test]
    fn a_segment_header_from_a_newer_format_is_refused_not_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(segment_name(1));
        let mut h = segment_header(9, 1);
        h[4..8].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32fast::hash(&h[..28]);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        fs::write(&path, h).expect("write");
        let err = SegmentReader::open(&path, 1, Some(1))
            .err()
            .expect("must fail");
        assert!(err.to_string().contains("format version 2"), "{err}");
        // A damaged header is no header: the segment holds no batch.
        h[10] ^= 1;
        fs::write(&path, h).expect("write");
        let (seqs, r) = read_all(&path);
        assert!(seqs.is_empty());
        assert_eq!(r.format, Format::Blank);
        assert_eq!(r.stop, Some(Stop::NoSegmentHeader));
    }

    #[test]
    fn spare_targets_follow_the_load_within_bounds() {
        assert_eq!(spare_target(0), 1 << 20);
        assert_eq!(spare_target(300 << 10), 1 << 20);
        assert_eq!(spare_target((3 << 20) + 1), 7 << 20);
        assert_eq!(spare_target(1 << 30), 32 << 20);
    }

    #[test]
    fn checkpoint_record_round_trips_and_rejects_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_checkpoint(dir.path()).expect("read"), None);
        let mut page = vec![0u8; 4096];
        page[META_MAGIC_AT..META_MAGIC_AT + 4].copy_from_slice(&LMDB_MAGIC.to_le_bytes());
        page[META_TXNID_AT..META_TXNID_AT + 8].copy_from_slice(&77u64.to_le_bytes());
        let c = Checkpoint {
            txnid: 77,
            seq: 12,
            segment: 3,
            roots: 0xdead_beef,
            page,
        };
        write_checkpoint(dir.path(), &c).expect("write");
        assert_eq!(read_checkpoint(dir.path()).expect("read"), Some(c.clone()));
        let path = dir.path().join(CHECKPOINT_FILE);
        let mut b = fs::read(&path).expect("read");
        b[20] ^= 1;
        fs::write(&path, &b).expect("write");
        assert!(read_checkpoint(dir.path()).is_err());
    }
}
