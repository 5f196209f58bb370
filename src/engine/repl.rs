//! Replication below the server: the primary's backlog of committed log batches, the map from
//! LMDB commits to the last batch they hold (where a full copy's stream begins), and how a
//! replica applies its primary's batches.
//!
//! The stream. A primary's replication stream is its write-ahead log's batches, in sequence
//! order, each framed as `b'B'`, the payload's length (u32 LE) and the payload (the batch's
//! physical records, `storage::wal::ops`). The stream offset (`master_repl_offset`) counts the
//! bytes of those frames since the primary's replication id was made (a fresh one at every
//! start and at a promotion), so it grows by `5 + payload` per batch, as Redis's counts the
//! bytes of its command stream.
//!
//! Invariants:
//! - a batch enters the backlog only once it can no longer be taken back and is durable per
//!   the primary's sync mode: the writer releases what the log tapped after the batch's
//!   fdatasync (in `always`), or when its replies are released (`periodic`, `never`), and
//!   never while the log is broken;
//! - batches are released in sequence order with no gap; a gap (which would be a bug) resets
//!   the backlog, so a replica whose position falls in it takes a full copy;
//! - the backlog holds at most `repl_backlog_size` bytes of frames (the oldest go first),
//!   except frames a sender still has to send (`Pin`: each sender's position, a full copy's
//!   from its snapshot on), which stay up to `PINNED_MAX` bytes in all:
//!   so a copy that outlasts the backlog under heavy writes still continues where its
//!   snapshot ended, as Redis buffers a replica's stream in its output buffer during a full
//!   sync (`client-output-buffer-limit replica 256mb`), instead of being taken again from the
//!   start, for ever;
//! - a replica stores the primary's replication id and the offset a batch brings it to in the
//!   same LMDB transaction and log batch as the batch's records (`REPL_KEY` in `meta`), so
//!   after a crash its recovered position is exactly what its recovered store holds.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::command::{Outcome, Replicated};
use crate::storage::StoreError;
use crate::storage::item;
use crate::storage::lmdb::{DB_ELEMS, DB_META, LmdbStore, LmdbWrite, LogTxn, META_CAS, Table};
use crate::storage::wal::{Op, Patch, Tapped, ops};

/// Where a replica keeps its primary's replication id and its offset, in `meta`.
pub const REPL_KEY: &[u8] = b"repl_primary";
/// A frame's header: kind and payload length.
pub const FRAME_HEADER: usize = 5;
/// How many LMDB commits the commit -> batch map remembers.
const COMMITS_KEPT: usize = 256;
/// Most bytes of frames the backlog keeps for senders still to send them (`Pin`), when that
/// is more than `repl_backlog_size`; past it the oldest go, and a sender behind them loses
/// its place (its replica takes a full copy). Redis's hard limit for a replica's output
/// buffer has the same default.
pub const PINNED_MAX: usize = 256 << 20;

/// One batch as the stream carries it.
#[derive(Debug, Clone)]
pub struct Frame {
    pub seq: u64,
    /// The stream offset just past this frame.
    pub end: u64,
    pub data: Arc<[u8]>,
}

/// Frames a batch payload for the stream.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(FRAME_HEADER + payload.len());
    v.push(b'B');
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

#[derive(Debug)]
struct Backlog {
    replid: String,
    cap: usize,
    frames: VecDeque<Frame>,
    bytes: usize,
    /// The last batch released, and the stream offset just past it.
    last_seq: u64,
    offset: u64,
    /// The position just before the oldest frame (or, with none, `last_seq`/`offset`).
    first_seq: u64,
    first_offset: u64,
    /// Frames are kept only once a replica has asked for the stream (as Redis creates its
    /// backlog with the first replica): until then only the position moves.
    active: bool,
    /// After a promotion: the previous primary's replication id and the offset the stream
    /// had reached under it (Redis's `master_replid2` and `second_repl_offset` less one). A
    /// replica of that primary at exactly that offset holds what this server held at its
    /// promotion, and may continue here without a full copy.
    previous: Option<(String, u64)>,
    /// Senders' positions (pin id, stream offset): frames past them are kept up to
    /// `pinned_max` bytes.
    pins: Vec<(u64, u64)>,
    next_pin: u64,
    pinned_max: usize,
}

/// A sender's place in the stream: while it lives, the backlog keeps the frames after its
/// offset (up to `PINNED_MAX` bytes in all).
#[derive(Debug)]
pub struct Pin<'a> {
    hub: &'a Hub,
    id: u64,
}

impl Pin<'_> {
    /// The sender has sent everything up to `offset`.
    pub fn advance(&self, offset: u64) {
        let mut b = lock(&self.hub.backlog);
        if let Some(p) = b.pins.iter_mut().find(|p| p.0 == self.id) {
            p.1 = p.1.max(offset);
        }
        b.trim();
    }

    /// Whether the backlog has dropped frames this pin still needed (past `pinned_max`): the
    /// sender can no longer continue from its place, and its replica must take a full copy.
    pub fn lost(&self) -> bool {
        let b = lock(&self.hub.backlog);
        b.pins
            .iter()
            .find(|p| p.0 == self.id)
            .is_none_or(|p| p.1 < b.first_offset)
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let mut b = lock(&self.hub.backlog);
        b.pins.retain(|p| p.0 != self.id);
        b.trim();
    }
}

impl Backlog {
    /// Drops the oldest frames past `cap` that no sender still needs, and past `pinned_max`
    /// any (the newest frame always stays). A pin the backlog has already passed holds
    /// nothing: its sender cannot continue anyway (`Pin::lost`).
    fn trim(&mut self) {
        let first = self.first_offset;
        let held = self.pins.iter().map(|p| p.1).filter(|&o| o >= first).min();
        while self.bytes > self.cap
            && self.frames.len() > 1
            && (self.bytes > self.pinned_max
                || held.is_none_or(|h| self.frames.front().is_some_and(|f| f.end <= h)))
        {
            if let Some(f) = self.frames.pop_front() {
                self.bytes -= f.data.len();
                self.first_seq = f.seq;
                self.first_offset = f.end;
            }
        }
    }
}

/// Why frames could not be served from a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// The backlog no longer holds it (or never did: another replication id, a gap).
    NotHeld,
}

/// The replication state the writer and the server share.
#[derive(Debug)]
pub struct Hub {
    replica: AtomicBool,
    /// `Backlog::active`, readable without the lock: the writer's log copies each batch's
    /// payload for the backlog only once it is set (`Wal::share_tap_copy`).
    wants_frames: Arc<AtomicBool>,
    backlog: Mutex<Backlog>,
    grew: Condvar,
    /// (LMDB transaction id, last batch it holds), newest last.
    commits: Mutex<VecDeque<(u64, u64)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hub {
    /// A hub for a store whose log's last batch is `last_seq` and whose last LMDB commit is
    /// `txnid` (holding every batch up to `last_seq`: recovery commits what it replays).
    pub fn new(replid: String, cap: u64, last_seq: u64, txnid: u64) -> Hub {
        let mut commits = VecDeque::new();
        commits.push_back((txnid, last_seq));
        Hub {
            replica: AtomicBool::new(false),
            wants_frames: Arc::default(),
            backlog: Mutex::new(Backlog {
                replid,
                cap: cap.min(usize::MAX as u64) as usize,
                frames: VecDeque::new(),
                bytes: 0,
                last_seq,
                offset: 0,
                first_seq: last_seq,
                first_offset: 0,
                active: false,
                previous: None,
                pins: Vec::new(),
                next_pin: 0,
                pinned_max: PINNED_MAX.max(cap.min(usize::MAX as u64) as usize),
            }),
            grew: Condvar::new(),
            commits: Mutex::new(commits),
        }
    }

    pub fn is_replica(&self) -> bool {
        self.replica.load(Ordering::Acquire)
    }

    pub fn set_replica(&self, on: bool) {
        self.replica.store(on, Ordering::Release);
    }

    /// Becomes a primary under a new replication id whose stream starts at `offset` (a
    /// promoted replica goes on from the offset it had applied); the backlog starts empty and
    /// keeps frames from now on (the other replicas of the old primary are about to ask).
    /// `previous`: the replication id of the primary it replicated, valid here up to `offset`.
    pub fn restart_stream(&self, replid: String, offset: u64, previous: Option<String>) {
        let mut b = lock(&self.backlog);
        b.replid = replid;
        b.previous = previous.filter(|id| !id.is_empty()).map(|id| (id, offset));
        b.active = true;
        self.wants_frames.store(true, Ordering::Release);
        b.frames.clear();
        b.bytes = 0;
        b.offset = offset;
        b.first_offset = offset;
        b.first_seq = b.last_seq;
        // A sender still running (a full copy that began before this server was made a
        // replica and promoted again) holds a place in the old stream: it has lost it.
        b.pins.clear();
        drop(b);
        self.grew.notify_all();
    }

    /// The writer committed LMDB transaction `txnid`, holding every batch up to `seq`.
    pub fn committed(&self, txnid: u64, seq: u64) {
        let mut c = lock(&self.commits);
        c.push_back((txnid, seq));
        while c.len() > COMMITS_KEPT {
            c.pop_front();
        }
    }

    /// The last batch the LMDB snapshot `txnid` holds, if that commit is remembered.
    pub fn seq_of_commit(&self, txnid: u64) -> Option<u64> {
        lock(&self.commits)
            .iter()
            .rev()
            .find(|(t, _)| *t == txnid)
            .map(|(_, s)| *s)
    }

    /// Batches the writer has made durable, in sequence order. On a replica only the sequence
    /// number is kept (its batches are its primary's, already in the primary's stream).
    pub fn release(&self, batches: &mut Vec<Tapped>) {
        if batches.is_empty() {
            return;
        }
        let replica = self.is_replica();
        let mut b = lock(&self.backlog);
        let mut grew = false;
        for t in batches.drain(..) {
            if replica {
                b.last_seq = t.seq;
                b.frames.clear();
                b.bytes = 0;
                b.first_seq = t.seq;
                b.first_offset = b.offset;
                continue;
            }
            let seq = t.seq;
            if seq != b.last_seq + 1 {
                log::warn!(
                    "replication backlog: batch {seq} follows {}; replicas behind it take a full copy",
                    b.last_seq
                );
                b.frames.clear();
                b.bytes = 0;
                b.first_seq = seq - 1;
                b.first_offset = b.offset;
            }
            let payload = match t.payload {
                Some(p) if b.active => p,
                _ => {
                    // No backlog yet, or a batch appended before the log was told to keep
                    // copies: only the position moves, and nothing before it can be served.
                    b.offset += (FRAME_HEADER + t.len) as u64;
                    b.last_seq = seq;
                    b.frames.clear();
                    b.bytes = 0;
                    b.first_seq = seq;
                    b.first_offset = b.offset;
                    continue;
                }
            };
            let data: Arc<[u8]> = frame(&payload).into();
            b.offset += data.len() as u64;
            b.bytes += data.len();
            b.last_seq = seq;
            let end = b.offset;
            b.frames.push_back(Frame { seq, end, data });
            grew = true;
            b.trim();
        }
        drop(b);
        // Only senders wait, and only for frames (a system call saved per batch otherwise).
        if grew {
            self.grew.notify_all();
        }
    }

    /// Whether batches should be tapped with their payloads (a replica has asked).
    pub fn wants_frames(&self) -> bool {
        self.wants_frames.load(Ordering::Acquire)
    }

    /// The flag behind `wants_frames`, for the log to read at each append.
    pub fn frames_flag(&self) -> Arc<AtomicBool> {
        self.wants_frames.clone()
    }

    /// A replica asked for the stream: keep frames from now on.
    pub fn activate(&self) {
        lock(&self.backlog).active = true;
        self.wants_frames.store(true, Ordering::Release);
    }

    /// Whether frames are kept (INFO's `repl_backlog_active`).
    pub fn active(&self) -> bool {
        lock(&self.backlog).active
    }

    /// The replication id and the offset past the last batch released.
    pub fn position(&self) -> (String, u64) {
        let b = lock(&self.backlog);
        (b.replid.clone(), b.offset)
    }

    pub fn offset(&self) -> u64 {
        lock(&self.backlog).offset
    }

    /// The last batch released.
    pub fn last_seq(&self) -> u64 {
        lock(&self.backlog).last_seq
    }

    /// Bytes of the stream released past `offset`, and what the backlog keeps for a pinned
    /// sender: how much of it a replica that continues from `offset` has used up while it
    /// takes its copy.
    pub fn used_since(&self, offset: u64) -> (u64, u64) {
        let b = lock(&self.backlog);
        (b.offset.saturating_sub(offset), b.pinned_max as u64)
    }

    /// Pins the stream at `offset` for a sender (see `Pin`); None if the backlog no longer
    /// holds that position (it is checked and pinned under one lock, so nothing goes between).
    pub fn pin(&self, offset: u64) -> Option<Pin<'_>> {
        let mut b = lock(&self.backlog);
        if offset < b.first_offset || offset > b.offset {
            return None;
        }
        let id = b.next_pin;
        b.next_pin += 1;
        b.pins.push((id, offset));
        Some(Pin { hub: self, id })
    }

    /// Pins the oldest position the backlog holds (a full copy's sender, before it knows its
    /// snapshot's position: `Pin::advance` moves it there).
    pub fn pin_oldest(&self) -> Pin<'_> {
        let mut b = lock(&self.backlog);
        let id = b.next_pin;
        b.next_pin += 1;
        let at = b.first_offset;
        b.pins.push((id, at));
        Pin { hub: self, id }
    }

    #[cfg(test)]
    fn set_pinned_max(&self, n: usize) {
        lock(&self.backlog).pinned_max = n;
    }

    /// (first offset held, bytes held), for INFO.
    pub fn backlog_span(&self) -> (u64, u64) {
        let b = lock(&self.backlog);
        (b.first_offset, b.offset - b.first_offset)
    }

    /// The stream offset just past batch `seq`: Some while the backlog can serve the batches
    /// after it; Err when it no longer can; Ok(None) when `seq` is not released yet.
    pub fn offset_of_seq(&self, seq: u64) -> Result<Option<u64>, Gone> {
        let b = lock(&self.backlog);
        if seq > b.last_seq {
            return Ok(None);
        }
        if seq == b.last_seq {
            return Ok(Some(b.offset));
        }
        if seq == b.first_seq {
            return Ok(Some(b.first_offset));
        }
        if seq < b.first_seq {
            return Err(Gone::NotHeld);
        }
        b.frames
            .iter()
            .find(|f| f.seq == seq)
            .map(|f| Some(f.end))
            .ok_or(Gone::NotHeld)
    }

    /// The previous primary's replication id and the offset this server took over at, after a
    /// promotion (INFO's `master_replid2`, `second_repl_offset`).
    pub fn previous(&self) -> Option<(String, u64)> {
        lock(&self.backlog).previous.clone()
    }

    /// Whether a replica of `replid` at `offset` can continue from the backlog: of this
    /// stream, or of the previous primary's up to where this server took over (a replica
    /// re-pointed here by a failover, no further than this server had applied).
    pub fn can_continue(&self, replid: &str, offset: u64) -> bool {
        let b = lock(&self.backlog);
        let same = b.replid == replid
            || b.previous
                .as_ref()
                .is_some_and(|(id, until)| id == replid && offset <= *until);
        same && offset >= b.first_offset
            && offset <= b.offset
            && (offset == b.offset
                || offset == b.first_offset
                || b.frames.iter().any(|f| f.end == offset))
    }

    /// The frames after stream offset `from` (a frame boundary), up to about `max` bytes,
    /// waiting up to `wait` for one when there is none yet.
    pub fn frames_after(&self, from: u64, max: usize, wait: Duration) -> Result<Vec<Frame>, Gone> {
        let mut b = lock(&self.backlog);
        if b.offset == from {
            b = self
                .grew
                .wait_timeout_while(b, wait, |b| b.offset == from)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if from < b.first_offset || from > b.offset {
            return Err(Gone::NotHeld);
        }
        let mut out = Vec::new();
        let mut size = 0;
        // Frames are in offset order: skip to the first past `from`.
        let start = b.frames.partition_point(|f| f.end <= from);
        if start > 0 && b.frames[start - 1].end != from && from != b.first_offset {
            return Err(Gone::NotHeld);
        }
        for f in b.frames.iter().skip(start) {
            if size > 0 && size + f.data.len() > max {
                break;
            }
            size += f.data.len();
            out.push(f.clone());
        }
        Ok(out)
    }
}

/// The position a replica stored with its data: (primary's replication id, offset).
pub fn stored_position(store: &LmdbStore) -> Result<Option<(String, u64)>, StoreError> {
    let txn = store.read_txn()?;
    let Some(meta) = store.table(DB_META) else {
        return Ok(None);
    };
    Ok(meta.get(&txn, REPL_KEY)?.and_then(decode_position))
}

pub fn encode_position(replid: &str, offset: u64) -> Vec<u8> {
    let mut v = offset.to_le_bytes().to_vec();
    v.extend_from_slice(replid.as_bytes());
    v
}

fn decode_position(b: &[u8]) -> Option<(String, u64)> {
    let (off, id) = b.split_first_chunk::<8>()?;
    let id = std::str::from_utf8(id).ok()?;
    Some((id.to_string(), u64::from_le_bytes(*off)))
}

/// The item a primary's `PATCH` record makes of the one the replica holds (None: it holds
/// the new item already). The replica is exactly where the record was made, so any other
/// item is damage, as in recovery (`lmdb::replay_patch`).
fn patched(
    table: &Table,
    txn: &LogTxn<'_>,
    key: &[u8],
    p: &Patch<'_>,
) -> Result<Option<Vec<u8>>, StoreError> {
    let bad = |why: &str| {
        StoreError::damaged(format!(
            "a replicated patch of key {:?} {why}",
            String::from_utf8_lossy(&key[..key.len().min(64)])
        ))
    };
    let old = item::decode(p.old_header).map_err(|_| bad("has a bad old header"))?;
    let new = item::decode(p.new_header).map_err(|_| bad("has a bad new header"))?;
    let stored = table.get(txn, key)?.ok_or_else(|| bad("meets no item"))?;
    let i = item::decode(stored).map_err(|_| bad("meets an undecodable item"))?;
    if i.meta == new.meta
        && i.value.len() == p.new_len as usize
        && crc32fast::hash(i.value) == p.crc
    {
        return Ok(None);
    }
    if i.meta != old.meta || i.value.len() != p.old_len as usize {
        return Err(bad("does not match the item stored before it"));
    }
    let value = p.apply(i.value).map_err(|e| bad(&e))?;
    if crc32fast::hash(&value) != p.crc {
        return Err(bad("does not make the value it recorded"));
    }
    let mut bytes = Vec::with_capacity(p.new_header.len() + value.len());
    bytes.extend_from_slice(p.new_header);
    bytes.extend_from_slice(&value);
    Ok(Some(bytes))
}

/// Applies a primary's batches to the replica's write transaction (logging them in the
/// replica's own log batch), then records the position they bring it to.
pub fn apply(w: &mut LmdbWrite<'_, '_>, r: &Replicated) -> Result<Outcome, StoreError> {
    let mut cas = 0u64;
    let (store, txn) = w.parts();
    for payload in &r.payloads {
        for op in ops(payload) {
            let op = op.map_err(StoreError::Backend)?;
            let (Op::Put { db, .. } | Op::Del { db, .. } | Op::Clear { db } | Op::Patch { db, .. }) =
                op;
            let table = store.table(db).ok_or_else(|| {
                StoreError::Backend(format!("replicated record for database {db}"))
            })?;
            match op {
                Op::Put { key, value, .. } => {
                    if db == DB_ELEMS {
                        store.mark_collections(txn)?;
                    }
                    if db == DB_META
                        && key == META_CAS
                        && let Ok(v) = <[u8; 8]>::try_from(value)
                    {
                        cas = cas.max(u64::from_le_bytes(v));
                    }
                    table.put(txn, key, value)?
                }
                Op::Del { key, .. } => {
                    table.delete(txn, key)?;
                }
                Op::Clear { .. } => table.clear(txn)?,
                // Logged here as the whole new item: the replica's log stands on its own.
                Op::Patch { key, patch, .. } => {
                    if let Some(item) = patched(&table, txn, key, &patch)? {
                        table.put(txn, key, &item)?;
                    }
                }
            }
        }
    }
    let meta = store
        .table(DB_META)
        .ok_or_else(|| StoreError::Backend("no meta database".into()))?;
    meta.put(txn, REPL_KEY, &encode_position(&r.replid, r.offset))?;
    w.raise_cas(cas);
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tap(seq: u64, byte: u8, len: usize) -> Tapped {
        Tapped {
            seq,
            len,
            payload: Some(vec![byte; len]),
        }
    }

    #[test]
    fn the_backlog_serves_from_any_batch_boundary_it_still_holds() {
        let hub = Hub::new("a".repeat(40), 40, 7, 3);
        hub.activate();
        let mut batches = vec![tap(8, 1u8, 10), tap(9, 2u8, 10)];
        hub.release(&mut batches);
        assert_eq!(hub.offset(), 30);
        assert_eq!(hub.offset_of_seq(7), Ok(Some(0)));
        assert_eq!(hub.offset_of_seq(8), Ok(Some(15)));
        assert_eq!(hub.offset_of_seq(10), Ok(None));
        let f = hub.frames_after(15, 1 << 20, Duration::ZERO).expect("held");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].seq, 9);
        assert!(hub.can_continue(&"a".repeat(40), 15));
        assert!(!hub.can_continue(&"b".repeat(40), 15));
        assert!(!hub.can_continue(&"a".repeat(40), 14));
        // Past the cap the oldest frames go.
        let mut more = vec![tap(10, 3u8, 10), tap(11, 4u8, 10)];
        hub.release(&mut more);
        assert_eq!(
            hub.frames_after(0, 1 << 20, Duration::ZERO).err(),
            Some(Gone::NotHeld)
        );
        assert_eq!(hub.offset_of_seq(8), Err(Gone::NotHeld));
        let f = hub.frames_after(30, 1 << 20, Duration::ZERO).expect("held");
        assert_eq!(f.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![10, 11]);
    }

    #[test]
    fn a_pinned_position_keeps_its_frames_past_the_cap_up_to_the_pinned_limit() {
        let hub = Hub::new("a".repeat(40), 40, 0, 1);
        hub.set_pinned_max(100);
        hub.activate();
        hub.release(&mut vec![tap(1, 1, 10)]);
        // A full copy's snapshot ends after batch 1 (offset 15).
        let pin = hub.pin(15).expect("held");
        assert!(hub.pin(16).is_none(), "past the end");
        for seq in 2..=5 {
            hub.release(&mut vec![tap(seq, seq as u8, 10)]);
        }
        // 75 bytes > the 40-byte cap, but the copy's sender still needs batches 2..5.
        let f = hub
            .frames_after(15, 1 << 20, Duration::ZERO)
            .expect("pinned");
        assert_eq!(
            f.iter().map(|f| f.seq).collect::<Vec<_>>(),
            vec![2, 3, 4, 5]
        );
        // What is before the pin goes as usual.
        assert_eq!(hub.offset_of_seq(0), Err(Gone::NotHeld));
        assert!(!pin.lost());
        // The sender moves on: what it sent may go.
        pin.advance(45);
        hub.release(&mut vec![tap(6, 6, 10)]);
        assert_eq!(
            hub.frames_after(15, 1 << 20, Duration::ZERO).err(),
            Some(Gone::NotHeld)
        );
        let f = hub
            .frames_after(45, 1 << 20, Duration::ZERO)
            .expect("pinned");
        assert_eq!(f.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![4, 5, 6]);
        // Past the pinned limit the oldest go even so: the sender loses its place.
        for seq in 7..=14 {
            hub.release(&mut vec![tap(seq, seq as u8, 10)]);
        }
        assert_eq!(
            hub.frames_after(45, 1 << 20, Duration::ZERO).err(),
            Some(Gone::NotHeld)
        );
        assert!(pin.lost());
        // A pin the backlog has passed holds nothing: the backlog is back to its cap while
        // that sender still lives.
        hub.release(&mut vec![tap(15, 15, 10)]);
        let (first, held) = hub.backlog_span();
        assert!(held <= 40, "{held} bytes held from {first}");
        drop(pin);
        // A sender that goes releases what it held at once, without waiting for a write.
        let (_, end) = hub.position();
        let other = hub.pin(end).expect("held");
        for seq in 16..=19 {
            hub.release(&mut vec![tap(seq, seq as u8, 10)]);
        }
        assert!(!other.lost());
        assert!(hub.backlog_span().1 > 40, "pinned frames kept past the cap");
        drop(other);
        let (first, held) = hub.backlog_span();
        assert!(
            held <= 40,
            "{held} bytes held from {first} after the pin went"
        );
        // A new stream (a promotion) takes every sender's place in the old one.
        let (_, end) = hub.position();
        let old = hub.pin(end).expect("held");
        assert!(!old.lost());
        hub.restart_stream("b".repeat(40), end, None);
        assert!(old.lost());
    }

    #[test]
    fn a_gap_resets_the_backlog() {
        let hub = Hub::new("x".into(), 1 << 20, 0, 1);
        hub.activate();
        hub.release(&mut vec![tap(1, 0, 3)]);
        hub.release(&mut vec![tap(5, 0, 3)]);
        assert_eq!(
            hub.frames_after(0, 1 << 20, Duration::ZERO).err(),
            Some(Gone::NotHeld)
        );
        assert_eq!(
            hub.frames_after(8, 1 << 20, Duration::ZERO)
                .map(|f| f.len()),
            Ok(1)
        );
    }

    #[test]
    fn until_a_replica_asks_only_the_position_moves() {
        let hub = Hub::new("x".into(), 1 << 20, 4, 1);
        hub.release(&mut vec![tap(5, 0, 3), tap(6, 0, 5)]);
        assert_eq!(hub.offset(), 18);
        assert_eq!(hub.backlog_span(), (18, 0));
        assert_eq!(hub.offset_of_seq(6), Ok(Some(18)));
        assert_eq!(hub.offset_of_seq(5), Err(Gone::NotHeld));
        hub.activate();
        hub.release(&mut vec![tap(7, 0, 1)]);
        assert_eq!(hub.offset_of_seq(6), Ok(Some(18)));
        let f = hub.frames_after(18, 1 << 20, Duration::ZERO).expect("held");
        assert_eq!(f.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![7]);
    }

    #[test]
    fn a_batch_tapped_without_its_payload_is_a_gap_for_the_senders() {
        let hub = Hub::new("x".into(), 1 << 20, 0, 1);
        assert!(!hub.wants_frames());
        hub.activate();
        assert!(hub.wants_frames());
        hub.release(&mut vec![tap(1, 0, 3)]);
        // Appended before the log kept copies: nothing up to it can be served.
        let bare = Tapped {
            seq: 2,
            len: 4,
            payload: None,
        };
        hub.release(&mut vec![bare, tap(3, 0, 2)]);
        assert_eq!(hub.offset(), 8 + 9 + 7);
        assert_eq!(hub.offset_of_seq(1), Err(Gone::NotHeld));
        assert_eq!(hub.offset_of_seq(2), Ok(Some(17)));
        let f = hub.frames_after(17, 1 << 20, Duration::ZERO).expect("held");
        assert_eq!(f.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![3]);
    }

    #[test]
    fn a_promoted_replica_continues_its_old_primarys_stream_only_where_it_took_over() {
        let (old, new) = ("o".repeat(40), "n".repeat(40));
        // A replica: its own batches only move the sequence.
        let hub = Hub::new("r".repeat(40), 1 << 20, 0, 1);
        hub.set_replica(true);
        hub.release(&mut vec![tap(1, 0, 3)]);
        hub.set_replica(false);
        hub.restart_stream(new.clone(), 100, Some(old.clone()));
        assert_eq!(hub.previous(), Some((old.clone(), 100)));
        assert!(hub.can_continue(&old, 100), "exactly where it took over");
        assert!(
            !hub.can_continue(&old, 90),
            "behind: the backlog starts at 100"
        );
        assert!(!hub.can_continue(&old, 110), "ahead: data it never had");
        assert!(hub.can_continue(&new, 100));
        // Its own writes go on in the backlog (kept from the promotion on) past 100.
        hub.release(&mut vec![tap(2, 0, 5)]);
        assert_eq!(hub.offset(), 110);
        assert!(hub.can_continue(&old, 100));
        assert!(
            !hub.can_continue(&old, 110),
            "110 is the new stream's, not the old one's"
        );
        assert!(hub.can_continue(&new, 110));
        let f = hub
            .frames_after(100, 1 << 20, Duration::ZERO)
            .expect("held");
        assert_eq!(f.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![2]);
        // A replica that was never linked has no previous id to offer.
        hub.restart_stream("m".repeat(40), 110, Some(String::new()));
        assert_eq!(hub.previous(), None);
    }

    #[test]
    fn positions_round_trip() {
        let v = encode_position("abc", 42);
        assert_eq!(decode_position(&v), Some(("abc".to_string(), 42)));
        assert_eq!(decode_position(&[1, 2]), None);
    }
}
