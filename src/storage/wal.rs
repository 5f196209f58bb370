//! The write-ahead log and the checkpoint record: one sequential fdatasync makes a batch
//! durable, and LMDB reopens after any power cut.
//!
//! Files in the data directory, beside LMDB's `data.mdb` and `lock.mdb`:
//! - `wal-<segment, 16 hex digits>.log`: batches, appended in commit order. A batch is a
//!   20-byte header (magic `MKWB`, payload length u32 LE, sequence number u64 LE, CRC-32 of the
//!   length, the sequence number and the payload) and a payload of physical records, each
//!   `PUT db key value`, `DEL db key` or `CLEAR db`. Records say what the bytes became, not what
//!   command made them, so replaying a batch twice, or onto a store that already holds part of
//!   it, gives the same store.
//! - `checkpoint`: the last checkpoint: the LMDB transaction id and meta page of a snapshot
//!   whose pages are all on disk, the sequence number of the last batch that snapshot holds, and
//!   the first segment to replay after it. Replaced atomically (write, fsync, rename, fsync the
//!   directory), so it is either the old record or the new one.
//!
//! Invariants that recovery relies on:
//! - sequence numbers grow by one per batch with no gap, across segments and restarts; a batch
//!   is applied only if every batch before it was, so a torn or missing batch ends the log there;
//! - a segment is fdatasynced before the next one is created, so a later segment never holds a
//!   batch while an earlier one lost its tail;
//! - a torn tail found at recovery is cut off and the cut is fsynced before anything is appended,
//!   so no stale bytes past the cut can ever be read as a batch;
//! - the snapshot a checkpoint names stays readable until a newer checkpoint record is durable:
//!   LMDB never reuses a page that a live read transaction can see, and the writer keeps one open
//!   on that snapshot (see `writer.rs`). Its meta page is kept here because LMDB, committing
//!   without sync, may write its own two meta pages past that snapshot before their pages.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Batch header: magic, payload length, sequence number, checksum.
pub const HEADER: usize = 20;
const BATCH_MAGIC: &[u8; 4] = b"MKWB";
const CKPT_MAGIC: &[u8; 4] = b"MKCP";
const CKPT_VERSION: u32 = 1;
pub const CHECKPOINT_FILE: &str = "checkpoint";

const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;
const OP_CLEAR: u8 = 3;

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
}

impl Default for LogBuf {
    fn default() -> Self {
        LogBuf {
            buf: vec![0; HEADER],
        }
    }
}

/// Keep at most this much buffer between batches (a batch of large values can grow it far).
const KEEP_CAPACITY: usize = 4 << 20;

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
    }

    /// Payload bytes recorded so far.
    pub fn payload_len(&self) -> usize {
        self.buf.len() - HEADER
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

    /// Fills in the header for sequence number `seq`; the whole batch, ready to write.
    fn seal(&mut self, seq: u64) -> io::Result<&[u8]> {
        let len = u32::try_from(self.buf.len() - HEADER).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "batch too large for the log")
        })?;
        self.buf[0..4].copy_from_slice(BATCH_MAGIC);
        self.buf[4..8].copy_from_slice(&len.to_le_bytes());
        self.buf[8..16].copy_from_slice(&seq.to_le_bytes());
        let crc = batch_crc(&self.buf[4..16], &self.buf[HEADER..]);
        self.buf[16..20].copy_from_slice(&crc.to_le_bytes());
        Ok(&self.buf)
    }
}

fn batch_crc(len_seq: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
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
            _ => return bad(),
        };
        at += used;
        Some(Ok(op))
    })
}

pub fn segment_name(n: u64) -> String {
    format!("wal-{n:016x}.log")
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

/// Fsyncs a directory, making the names created or renamed in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn fdatasync(f: &File) -> io::Result<()> {
    f.sync_data()
}

/// A batch read back from a segment.
pub struct Batch {
    pub seq: u64,
    pub payload: Vec<u8>,
}

/// Reads a segment's batches in order; stops at the first one that is torn, fails its
/// checksum or does not follow its predecessor.
pub struct SegmentReader {
    file: io::BufReader<File>,
    /// Bytes of whole, valid batches read so far.
    pub valid_len: u64,
    /// Why reading stopped before the end of the file, if it did.
    pub stop: Option<String>,
}

impl SegmentReader {
    pub fn open(path: &Path) -> io::Result<SegmentReader> {
        Ok(SegmentReader {
            file: io::BufReader::with_capacity(1 << 20, File::open(path)?),
            valid_len: 0,
            stop: None,
        })
    }

    /// The next batch, or None at the end of the valid part (see `stop`).
    pub fn next_batch(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<u64>> {
        let mut hdr = [0u8; HEADER];
        match read_full(&mut self.file, &mut hdr)? {
            0 => return Ok(None),
            n if n < HEADER => {
                self.stop = Some(format!("torn batch header ({n} bytes)"));
                return Ok(None);
            }
            _ => {}
        }
        if &hdr[0..4] != BATCH_MAGIC {
            self.stop = Some("no batch header".into());
            return Ok(None);
        }
        let len = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
        let seq = u64::from_le_bytes(hdr[8..16].try_into().unwrap_or([0; 8]));
        let crc = u32::from_le_bytes([hdr[16], hdr[17], hdr[18], hdr[19]]);
        buf.clear();
        // Read in bounded steps: a torn header may claim any length.
        let mut left = len;
        while left > 0 {
            let step = left.min(1 << 20);
            let start = buf.len();
            buf.resize(start + step, 0);
            let got = read_full(&mut self.file, &mut buf[start..])?;
            if got < step {
                self.stop = Some(format!("torn batch {seq}"));
                return Ok(None);
            }
            left -= step;
        }
        if batch_crc(&hdr[4..16], buf) != crc {
            self.stop = Some(format!("batch {seq} fails its checksum"));
            return Ok(None);
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

/// The log as the writer appends to it.
pub struct Wal {
    dir: PathBuf,
    file: File,
    segment: u64,
    len: u64,
    next_seq: u64,
    /// Bytes appended since the last checkpoint began (what a recovery would replay).
    pub since_checkpoint: u64,
    /// Bytes appended and not yet fdatasynced.
    unsynced: bool,
}

impl Wal {
    /// Continues segment `segment` at `len` bytes (truncating anything past it, durably), or
    /// creates it; the next batch gets `next_seq`.
    pub fn resume(dir: &Path, segment: u64, len: u64, next_seq: u64) -> io::Result<Wal> {
        let path = dir.join(segment_name(segment));
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if file.metadata()?.len() != len {
            file.set_len(len)?;
            fdatasync(&file)?;
        }
        if !existed {
            sync_dir(dir)?;
        }
        Ok(Wal {
            dir: dir.to_path_buf(),
            file,
            segment,
            len,
            next_seq,
            since_checkpoint: len,
            unsynced: false,
        })
    }

    pub fn segment(&self) -> u64 {
        self.segment
    }

    /// The sequence number of the last batch appended (0: none ever).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Where the next batch will start (to undo an append whose commit then failed).
    pub fn position(&self) -> u64 {
        self.len
    }

    /// Appends `batch` (page cache only; see `sync`) and returns its sequence number.
    pub fn append(&mut self, batch: &mut LogBuf) -> io::Result<u64> {
        let seq = self.next_seq;
        let bytes = batch.seal(seq)?;
        self.file.write_all_at(bytes, self.len)?;
        self.len += bytes.len() as u64;
        self.since_checkpoint += bytes.len() as u64;
        self.next_seq += 1;
        self.unsynced = true;
        Ok(seq)
    }

    /// Takes back the last append (its LMDB commit failed, so no reply will claim it).
    pub fn undo(&mut self, position: u64, seq: u64) -> io::Result<()> {
        self.since_checkpoint -= self.len - position;
        self.len = position;
        self.next_seq = seq;
        self.file.set_len(position)
    }

    /// Makes every append so far durable.
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced {
            fdatasync(&self.file)?;
            self.unsynced = false;
        }
        Ok(())
    }

    pub fn unsynced(&self) -> bool {
        self.unsynced
    }

    /// Ends the current segment (durably) and starts the next; returns the new segment number.
    /// Batches appended from now on are the ones a checkpoint taken now does not hold.
    pub fn rotate(&mut self) -> io::Result<u64> {
        self.sync()?;
        let next = self.segment + 1;
        let path = self.dir.join(segment_name(next));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        sync_dir(&self.dir)?;
        self.file = file;
        self.segment = next;
        self.len = 0;
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

#[cfg(test)]
mod tests {
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

    fn wal_with(dir: &Path, batches: &[&[u8]]) -> Wal {
        let mut w = Wal::resume(dir, 1, 0, 1).expect("wal");
        for v in batches {
            let mut b = LogBuf::default();
            b.put(0, b"k", &[v]);
            w.append(&mut b).expect("append");
        }
        w.sync().expect("sync");
        w
    }

    fn read_all(path: &Path) -> (Vec<u64>, SegmentReader) {
        let mut r = SegmentReader::open(path).expect("open");
        let mut seqs = Vec::new();
        let mut buf = Vec::new();
        while let Some(s) = r.next_batch(&mut buf).expect("read") {
            seqs.push(s);
        }
        (seqs, r)
    }

    #[test]
    fn torn_and_damaged_tails_end_the_segment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = wal_with(dir.path(), &[b"one", b"two", b"three"]);
        let path = dir.path().join(segment_name(1));
        let full = fs::read(&path).expect("read");
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1, 2, 3]);
        assert_eq!(r.valid_len, full.len() as u64);
        assert!(r.stop.is_none());
        drop(w);
        // Cut inside the last batch: two batches stay.
        fs::write(&path, &full[..full.len() - 2]).expect("write");
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1, 2]);
        assert!(r.stop.is_some());
        // A flipped byte in the second batch's payload: only the first stays.
        let mut bad = full.clone();
        let second = r.valid_len as usize - 1;
        bad[second] ^= 0x40;
        fs::write(&path, &bad).expect("write");
        let (seqs, _) = read_all(&path);
        assert_eq!(seqs, vec![1]);
        // Zeros where a batch should start (a page that never reached the disk).
        let mut zeroed = full.clone();
        let first_len = HEADER + 8 + 1 + 3;
        zeroed[first_len..first_len + HEADER].fill(0);
        fs::write(&path, &zeroed).expect("write");
        let (seqs, _) = read_all(&path);
        assert_eq!(seqs, vec![1]);
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
        let mut w = Wal::resume(dir.path(), 1, keep, 3).expect("resume");
        let mut b = LogBuf::default();
        b.del(0, b"k");
        assert_eq!(w.append(&mut b).expect("append"), 3);
        w.sync().expect("sync");
        let (seqs, r) = read_all(&path);
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(r.stop.is_none());
    }

    #[test]
    fn undo_takes_back_the_last_append() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = wal_with(dir.path(), &[b"a"]);
        let (pos, seq) = (w.position(), w.last_seq() + 1);
        let mut b = LogBuf::default();
        b.put(0, b"x", &[b"y"]);
        w.append(&mut b).expect("append");
        w.undo(pos, seq).expect("undo");
        let mut b = LogBuf::default();
        b.put(0, b"z", &[b"w"]);
        assert_eq!(w.append(&mut b).expect("append"), seq);
        w.sync().expect("sync");
        let (seqs, _) = read_all(&dir.path().join(segment_name(1)));
        assert_eq!(seqs, vec![1, 2]);
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
