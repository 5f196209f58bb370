//! Writes that are durable in the log but not yet committed to LMDB, as readers see them.
//!
//! The writer keeps one LMDB write transaction open across many batches and commits it only
//! every so often (`writer.rs`): every LMDB commit takes fresh pages for the B-tree paths it
//! touches, and while a checkpoint's snapshot is pinned those pages cannot be reused, so a
//! commit per batch made the data file grow by about 20 KiB per batch. A batch is still
//! acknowledged as soon as it is in the log (and synced, per the sync mode); what it changed
//! in `items` is published here first, so readers see it before LMDB does.
//!
//! Invariants:
//! - A `State` is immutable once published: a view (`Map`) of the item records changed since
//!   LMDB transaction `base` (None = deleted), over that very LMDB snapshot. Views share one
//!   list of versions that only grows; a view sees the versions up to its batch, so what a
//!   published state answers never changes. A reader takes one state per event-loop pass and opens an LMDB read
//!   transaction; it uses them together only if that transaction is `base` (or the map is
//!   empty), so a pass sees exactly the store after some batch: MGET and EXEC are atomic,
//!   and nothing a reader saw can be "unseen" later in its pass.
//! - Each batch is published in one swap, before any of its replies leaves.
//! - An edit of a large string (a `PATCH` record) is published as the whole new item, or, when
//!   the key has a version here already, as the edit over that version (`Edited`), made
//!   whole by the first reader that asks.
//! - Every `items` record lives here: strings, deletions, and collections' metadata. A
//!   collection's elements (`elems`, `zscore`) do not: the state names, in `dirty`, every
//!   collection id whose elements changed since `base`. A reader that is about to read the
//!   elements of a dirty collection stops (`Snap::note_pending`, `StoreError::Pending`) and the
//!   server runs that read inside the writer's transaction instead, which has them; reads of
//!   other collections, and of any `items` record, stay on the snapshot. So collection writes
//!   no longer commit LMDB per batch (each commit took fresh pages for every B-tree path it
//!   touched, which a pinned checkpoint kept from reuse: the data file grew 10x faster than
//!   the data). A batch that clears a database is still committed to LMDB before it is
//!   acknowledged, and adds nothing here.
//! - After an LMDB commit the writer publishes an empty state on the new transaction; states
//!   still held by readers stay valid (their transaction is older, their map covers the rest).

use std::cell::{Cell, RefCell};
use std::ops::Bound;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_epoch::Guard;
use crossbeam_skiplist::base::SkipList;
use heed::types::Bytes;
use heed::{RoTxn, WithoutTls};

use super::StoreError;
use super::item::{self, ItemRef};
use super::lmdb::{LmdbStore, Reader};
use super::resident::Fetched;

/// An item record, or None for a deleted key.
pub type Val = Option<Rec>;

/// An item record the overlay serves, without a copy of its own: a span of the log batch that
/// wrote it (one buffer shared by every version of that batch and by the writer's copy for a
/// rebuild), or the whole item a `PATCH` record stands for. Until 2026-12-07 each version was
/// copied into an `Arc<[u8]>` of its own, and the writer copied each batch's records once more
/// for a rebuild: with 16 clients SETting 20 KiB values those two copies were 4% of the
/// server's samples.
#[derive(Clone, Debug)]
pub struct Rec(Backing);

#[derive(Clone, Debug)]
enum Backing {
    Batch {
        buf: Arc<Vec<u8>>,
        start: usize,
        end: usize,
    },
    Whole(Arc<[u8]>),
    /// An edit (a `PATCH` record) of the key's previous version, made into the whole item
    /// only when a reader asks (`Edited`).
    Edited(Arc<Edited>),
}

impl std::ops::Deref for Rec {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Backing::Batch { buf, start, end } => buf.get(*start..*end).unwrap_or_default(),
            Backing::Whole(b) => b,
            Backing::Edited(e) => e.item(),
        }
    }
}

impl Rec {
    /// Bytes this version keeps to itself (an edit's whole item only once a reader made it).
    fn held(&self) -> u64 {
        match &self.0 {
            Backing::Batch { start, end, .. } => end.saturating_sub(*start) as u64,
            Backing::Whole(b) => b.len() as u64,
            Backing::Edited(e) => e.patch_len() as u64 + e.made.get().map_or(0, |m| m.len() as u64),
        }
    }
}

/// Where a `PATCH` record's fields lie in its batch's buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PatchSpan {
    header: (usize, usize),
    new_len: usize,
    prepend: (usize, usize),
    at: usize,
    bytes: (usize, usize),
}

impl PatchSpan {
    fn shifted(self, by: usize) -> PatchSpan {
        let s = |(a, b): (usize, usize)| (a + by, b + by);
        PatchSpan {
            header: s(self.header),
            prepend: s(self.prepend),
            bytes: s(self.bytes),
            ..self
        }
    }
}

/// An item made by an edit of the key's previous version: an in-place edit of a large
/// string (`LmdbWrite::edit_in_place`) after an earlier store of it in the same LMDB
/// transaction. The writer publishes the edit alone (where it copied the whole item, 1 MiB
/// for each APPEND to a 1 MiB value); the first reader that asks makes the item, from the
/// nearest version at hand and the edits since, once (`item`). Those bytes count toward the
/// list's `made`, which makes the writer commit LMDB sooner, as superseded versions do.
pub struct Edited {
    /// The key's version before this edit (None only while dropping, see `Drop`).
    prev: Option<Rec>,
    /// The batch buffer holding the `PATCH` record, and where its fields are in it.
    buf: Arc<Vec<u8>>,
    span: PatchSpan,
    made: std::sync::OnceLock<Box<[u8]>>,
    /// Bytes made by readers, for the whole list (`Map::made`).
    made_total: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Edited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edited")
            .field("span", &self.span)
            .field("made", &self.made.get().map(|m| m.len()))
            .finish()
    }
}

impl Edited {
    fn part(&self, (a, b): (usize, usize)) -> &[u8] {
        self.buf.get(a..b).unwrap_or_default()
    }

    fn patch_len(&self) -> usize {
        let s = self.span;
        (s.header.1 - s.header.0) + (s.prepend.1 - s.prepend.0) + (s.bytes.1 - s.bytes.0)
    }

    /// The whole item (header and value), made on first use.
    fn item(&self) -> &[u8] {
        self.made.get_or_init(|| {
            let made = self.make();
            self.made_total
                .fetch_add(made.len() as u64, Ordering::Relaxed);
            made
        })
    }

    /// Walks back to the nearest version whose bytes are at hand, then replays the edits
    /// since, oldest first, on one buffer (no recursion: a chain can be thousands long).
    fn make(&self) -> Box<[u8]> {
        let mut chain: Vec<&Edited> = vec![self];
        let mut cur = self.prev.as_ref();
        let base: &[u8] = loop {
            match cur.map(|r| &r.0) {
                Some(Backing::Edited(e)) => match e.made.get() {
                    Some(m) => break m,
                    None => {
                        chain.push(e);
                        cur = e.prev.as_ref();
                    }
                },
                Some(_) => break cur.map_or(&[][..], |r| &r[..]),
                None => break &[],
            }
        };
        let value = match item::decode(base) {
            Ok(it) => it.value,
            // Damaged (or missing): readers' own decode says so.
            Err(_) => return base.into(),
        };
        let hlen = self.span.header.1 - self.span.header.0;
        if let Some(out) = self.make_in_one(&chain, value, hlen) {
            return out;
        }
        let mut out = Vec::with_capacity(hlen + self.span.new_len.max(value.len()));
        out.resize(hlen, 0);
        out.extend_from_slice(value);
        for e in chain.iter().rev() {
            let s = e.span;
            let prepend = e.part(s.prepend);
            if !prepend.is_empty() {
                out.splice(hlen..hlen, prepend.iter().copied());
            }
            out.resize(hlen + s.new_len, 0);
            let bytes = e.part(s.bytes);
            if let Some(dst) = out.get_mut(hlen + s.at..hlen + s.at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        }
        if let Some(h) = out.get_mut(..hlen) {
            h.copy_from_slice(self.part(self.span.header));
        }
        out.into_boxed_slice()
    }
}

impl Edited {
    /// `make`'s replay in one buffer of the final size, each byte written about once: edits
    /// only ever lengthen a value (appends, writes, zero fill, prepends), so the old value is
    /// put where the prepends to come leave it, and each prepend then writes in front of the
    /// bytes so far instead of shifting them (a chain of prepends to a large value would
    /// otherwise shift the whole value once per prepend). None if an edit would shorten the
    /// value (no edit makes one; `make` then replays step by step).
    fn make_in_one(&self, chain: &[&Edited], value: &[u8], hlen: usize) -> Option<Box<[u8]>> {
        let total = hlen.checked_add(self.span.new_len)?;
        let shift: usize = chain
            .iter()
            .map(|e| e.span.prepend.1.saturating_sub(e.span.prepend.0))
            .sum();
        let mut out = vec![0u8; total];
        // Where the value's first byte is, and its length, after each edit.
        let mut start = hlen.checked_add(shift)?;
        let mut len = value.len();
        out.get_mut(start..start.checked_add(len)?)?
            .copy_from_slice(value);
        for e in chain.iter().rev() {
            let s = e.span;
            let prepend = e.part(s.prepend);
            let bytes = e.part(s.bytes);
            if s.new_len < len + prepend.len() {
                return None;
            }
            start = start.checked_sub(prepend.len())?;
            out.get_mut(start..start + prepend.len())?
                .copy_from_slice(prepend);
            // Past the old end the buffer is still zeros: no edit wrote there, since none
            // shortens the value.
            len = s.new_len;
            if start + len > total || s.at + bytes.len() > len {
                return None;
            }
            out.get_mut(start + s.at..start + s.at + bytes.len())?
                .copy_from_slice(bytes);
        }
        if start != hlen || len != self.span.new_len {
            return None;
        }
        out.get_mut(..hlen)?
            .copy_from_slice(self.part(self.span.header));
        Some(out.into_boxed_slice())
    }
}

impl Drop for Edited {
    /// Frees a chain of edits one link at a time (a recursive drop of thousands of links
    /// could overflow a thread's stack).
    fn drop(&mut self) {
        let mut next = self.prev.take();
        while let Some(Rec(Backing::Edited(e))) = next {
            match Arc::try_unwrap(e) {
                Ok(mut inner) => next = inner.prev.take(),
                Err(_) => break,
            }
        }
    }
}

impl From<Arc<[u8]>> for Rec {
    fn from(b: Arc<[u8]>) -> Rec {
        Rec(Backing::Whole(b))
    }
}

/// A batch's changes of item records, in write order, with each record as a span of the
/// batch's records (`absorb`); `changes` makes them `Changes` once the batch's buffer is
/// shared (`LogBuf::share`).
#[derive(Debug, PartialEq)]
pub struct Absorbed(Vec<(Box<[u8]>, Option<Place>)>);

/// Where an absorbed record is.
#[derive(Debug, PartialEq)]
enum Place {
    /// Bytes `start..end` of the records.
    At(usize, usize),
    Whole(Arc<[u8]>),
    /// A `PATCH` record to apply to the key's previous version.
    Edited(PatchSpan),
}

impl Absorbed {
    /// Whether every edit has a version of its key to apply to: earlier in the batch, or in
    /// `map` (then `changes` makes them all). Checked before the batch is logged, so that a
    /// batch readers cannot see is treated as one from the start (`Handled::Held`).
    pub fn edits_resolve(&self, map: &Map) -> bool {
        if !self
            .0
            .iter()
            .any(|(_, p)| matches!(p, Some(Place::Edited(_))))
        {
            return true;
        }
        let guard = crossbeam_epoch::pin();
        // Whether each key's latest change so far in the batch left a record.
        let mut seen = std::collections::HashMap::new();
        for (key, place) in &self.0 {
            if matches!(place, Some(Place::Edited(_))) {
                let there = match seen.get(&key[..]) {
                    Some(&record) => record,
                    None => map.get(key, &guard).is_some_and(|v| v.is_some()),
                };
                if !there {
                    return false;
                }
            }
            seen.insert(&key[..], place.is_some());
        }
        true
    }

    /// The changes, reading spans from `buf`, where the records start at byte `offset`; an
    /// edit applies to the key's version before it: earlier in the batch, or in `map` (the
    /// writer's latest view). None when an edit has no previous version there (its batch
    /// then waits for an LMDB commit).
    pub fn changes(self, buf: &Arc<Vec<u8>>, offset: usize, map: &Map) -> Option<Changes> {
        let mut out: Changes = Vec::with_capacity(self.0.len());
        // Index of each key's latest change in `out`, made only if the batch has an edit.
        let mut latest: Option<std::collections::HashMap<Box<[u8]>, usize>> = None;
        let guard = crossbeam_epoch::pin();
        for (key, place) in self.0 {
            let rec = match place {
                None => None,
                Some(Place::At(start, end)) => Some(Rec(Backing::Batch {
                    buf: buf.clone(),
                    start: offset + start,
                    end: offset + end,
                })),
                Some(Place::Whole(b)) => Some(Rec(Backing::Whole(b))),
                Some(Place::Edited(span)) => {
                    let seen = latest.get_or_insert_with(|| {
                        out.iter()
                            .enumerate()
                            .map(|(i, (k, _))| (k.clone(), i))
                            .collect()
                    });
                    let prev = match seen.get(&key) {
                        Some(&i) => out.get(i).and_then(|(_, v)| v.clone()),
                        None => map.get(&key, &guard).and_then(|v| v.clone()),
                    }?;
                    Some(Rec(Backing::Edited(Arc::new(Edited {
                        prev: Some(prev),
                        buf: buf.clone(),
                        span: span.shifted(offset),
                        made: std::sync::OnceLock::new(),
                        made_total: map.made.clone(),
                    }))))
                }
            };
            if let Some(seen) = latest.as_mut() {
                seen.insert(key.clone(), out.len());
            }
            out.push((key, rec));
        }
        Some(out)
    }
}

/// A batch's changes of item records, in write order.
pub type Changes = Vec<(Box<[u8]>, Val)>;
/// Ids of the collections whose elements changed after `base` (rank-directory bit cleared).
pub type Dirty = rpds::HashTrieSetSync<u64>;

/// How versions are ordered: by key, then newest first, so that the first entry at or after
/// `(key, seq)` is the newest version of `key` a view at batch `seq` may see.
trait Versioned {
    fn key(&self) -> &[u8];
    fn seq(&self) -> u64;
}

/// One version's place in the list: its key and the number of the batch that wrote it.
struct VKey {
    key: Box<[u8]>,
    seq: u64,
}

/// A key and a batch number to search by.
struct Probe<'a> {
    key: &'a [u8],
    seq: u64,
}

impl Versioned for VKey {
    fn key(&self) -> &[u8] {
        &self.key
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

impl Versioned for Probe<'_> {
    fn key(&self) -> &[u8] {
        self.key
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

impl Ord for dyn Versioned + '_ {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key()
            .cmp(other.key())
            .then_with(|| other.seq().cmp(&self.seq()))
    }
}

impl PartialOrd for dyn Versioned + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for dyn Versioned + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for dyn Versioned + '_ {}

impl<'a> std::borrow::Borrow<dyn Versioned + 'a> for VKey {
    fn borrow(&self) -> &(dyn Versioned + 'a) {
        self
    }
}

impl Ord for VKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self as &dyn Versioned).cmp(other as &dyn Versioned)
    }
}

impl PartialOrd for VKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for VKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for VKey {}

/// Key bounds turned into bounds on versions (all of a key's versions lie between
/// `(key, u64::MAX)` and `(key, 0)`; batch numbers start at 1).
struct Span {
    lo: Bound<VKey>,
    hi: Bound<VKey>,
}

impl Span {
    fn new(lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Span {
        let v = |key: &[u8], seq| VKey {
            key: key.into(),
            seq,
        };
        Span {
            lo: match lo {
                Bound::Included(k) => Bound::Included(v(k, u64::MAX)),
                Bound::Excluded(k) => Bound::Excluded(v(k, 0)),
                Bound::Unbounded => Bound::Unbounded,
            },
            hi: match hi {
                Bound::Included(k) => Bound::Included(v(k, 0)),
                Bound::Excluded(k) => Bound::Excluded(v(k, u64::MAX)),
                Bound::Unbounded => Bound::Unbounded,
            },
        }
    }
}

impl std::ops::RangeBounds<dyn Versioned> for Span {
    fn start_bound(&self) -> Bound<&(dyn Versioned + 'static)> {
        self.lo.as_ref().map(|k| k as &(dyn Versioned + 'static))
    }
    fn end_bound(&self) -> Bound<&(dyn Versioned + 'static)> {
        self.hi.as_ref().map(|k| k as &(dyn Versioned + 'static))
    }
}

/// Bytes a version costs besides its key and value (the list's node, the value's `Arc`).
const VERSION_OVERHEAD: u64 = 96;

/// The item records changed since an LMDB transaction, as one view sees them.
///
/// All views over one LMDB transaction share a single list holding every version written
/// since it: the writer adds each batch's records under the batch's number (`with`), never
/// changes or removes an entry, and a view sees the versions up to its own batch. Adding a
/// batch is one insertion per record, where a persistent tree copied a path of nodes (and
/// freed the old path later) for each. The list and everything in it is freed with the last
/// view, after the writer has moved on to the next transaction (`Map::new`). A version that
/// a later one hides stays until then, so the writer commits LMDB once such versions add up
/// (`superseded`).
///
/// Searching needs an epoch guard (`crossbeam_epoch::pin`); nothing is ever retired through
/// it, since nothing is removed, so a guard held for a reader's whole pass holds nothing back.
#[derive(Clone)]
pub struct Map {
    list: Arc<SkipList<VKey, Val>>,
    /// Bytes readers made of edits in the list (`Edited`), which it holds until it goes.
    made: Arc<std::sync::atomic::AtomicU64>,
    /// The last batch this view sees (0: none).
    seq: u64,
    /// Versions this view sees.
    len: usize,
    /// Bytes of the versions this view sees that a later one hides.
    superseded: u64,
}

impl Map {
    pub fn new() -> Map {
        Map {
            list: Arc::new(SkipList::new(crossbeam_epoch::default_collector().clone())),
            made: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            seq: 0,
            len: 0,
            superseded: 0,
        }
    }

    /// Nothing changed in this view.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether another view shares this one's list (a published state, a reader's).
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.list) > 1
    }

    /// Bytes of versions a later version of the same key hides (held until the list goes).
    pub fn superseded(&self) -> u64 {
        self.superseded + self.made.load(Ordering::Relaxed)
    }

    /// A view with `changes` (in write order; a later change of a key wins) added as the next
    /// batch. The writer only, on its latest view.
    pub fn with(&self, changes: Changes) -> Map {
        let seq = self.seq + 1;
        let mut next = Map {
            list: self.list.clone(),
            made: self.made.clone(),
            seq,
            len: self.len,
            superseded: self.superseded,
        };
        // One version per key and batch (an equal entry would replace, and retire, the
        // earlier one): a key written twice in the batch keeps its last write.
        let mut hidden = Vec::new();
        if changes.len() > 1 {
            let mut seen = std::collections::HashSet::with_capacity(changes.len());
            hidden = vec![false; changes.len()];
            for (i, (key, _)) in changes.iter().enumerate().rev() {
                hidden[i] = !seen.insert(&key[..]);
            }
        }
        let size =
            |k: &[u8], v: &Val| k.len() as u64 + v.as_ref().map_or(0, Rec::held) + VERSION_OVERHEAD;
        let guard = crossbeam_epoch::pin();
        for (i, (key, val)) in changes.into_iter().enumerate() {
            if hidden.get(i).copied().unwrap_or(false) {
                continue;
            }
            let added = next.list.insert(VKey { key, seq }, val, &guard);
            // The entry after the new one is the key's previous version, if it has one.
            if let Some(older) = added.next(&guard) {
                if older.key().key == added.key().key {
                    next.superseded += size(&older.key().key, older.value());
                }
                older.release(&guard);
            }
            added.release(&guard);
            next.len += 1;
        }
        next
    }

    /// The newest version of `key` this view sees: Some(None) for a deletion, None when the
    /// key did not change.
    pub fn get<'g>(&'g self, key: &[u8], guard: &'g Guard) -> Option<&'g Val> {
        if self.len == 0 {
            return None;
        }
        let probe = Probe { key, seq: self.seq };
        let e = self
            .list
            .lower_bound(Bound::Included(&probe as &dyn Versioned), guard)?;
        (*e.key().key == *key).then(|| e.value())
    }

    /// The newest version this view sees of each key within the bounds, in key order.
    pub fn range<'g>(
        &'g self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        guard: &'g Guard,
    ) -> impl Iterator<Item = (&'g [u8], &'g Val)> + 'g {
        let seq = self.seq;
        let mut last: Option<&'g [u8]> = None;
        self.list
            .range(Span::new(lo, hi), guard)
            .filter_map(move |e| {
                let k: &'g VKey = e.key();
                if k.seq > seq || last == Some(&k.key[..]) {
                    return None;
                }
                last = Some(&k.key[..]);
                Some((&k.key[..], e.value()))
            })
    }
}

impl Default for Map {
    fn default() -> Map {
        Map::new()
    }
}

/// The published view: item records changed after LMDB transaction `base`, and the
/// collections whose elements did.
pub struct State {
    pub base: usize,
    pub map: Map,
    pub dirty: Dirty,
}

impl State {
    /// Nothing changed after `base`.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty() && self.dirty.is_empty()
    }
}

/// The current state, swapped by the writer, cloned by readers.
pub struct Overlay {
    current: Mutex<Arc<State>>,
    /// Someone (a backup) wants LMDB to hold every acknowledged write: commit soon.
    pub commit_asked: AtomicBool,
}

impl Overlay {
    pub fn new(base: usize) -> Overlay {
        Overlay {
            current: Mutex::new(Arc::new(State {
                base,
                map: Map::new(),
                dirty: Dirty::new_sync(),
            })),
            commit_asked: AtomicBool::new(false),
        }
    }

    /// Waits until LMDB holds every write acknowledged before the call (the overlay of that
    /// moment has been committed), asking the writer to commit soon; false on timeout.
    pub fn wait_committed(&self, timeout: std::time::Duration) -> bool {
        let then = self.current();
        if then.is_empty() {
            return true;
        }
        self.commit_asked.store(true, Ordering::Release);
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if self.current().base > then.base {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        false
    }

    pub fn current(&self) -> Arc<State> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Publishes a new state (the writer only).
    pub fn publish(&self, base: usize, map: Map, dirty: Dirty) {
        let state = Arc::new(State { base, map, dirty });
        let old = std::mem::replace(
            &mut *self.current.lock().unwrap_or_else(|p| p.into_inner()),
            state,
        );
        // The old state's nodes are freed here or by the last reader holding it, never under
        // the lock.
        drop(old);
    }
}

/// The collection an element record (`elems`, or `zscore` with its rank directory) belongs
/// to: its key's first 8 bytes, big-endian, without the rank-directory bit.
fn owner(key: &[u8]) -> Option<u64> {
    let id: [u8; 8] = key.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(id) & !super::lmdb::ZRANK_DIR)
}

/// The `items` records of a batch's log payload, in order, for `Map::with`; notes in `dirty`
/// the collections whose elements the batch changed. Returns None (and leaves `dirty` as it
/// may be, partly updated: the caller discards it) when the batch did something a reader must
/// not see through the overlay: a clear.
///
/// `patched` holds the whole new items of the payload's `PATCH` records, in order (the log's
/// records carry only the change): `LogBuf::patched`.
pub fn absorb(
    dirty: &mut Dirty,
    payload: &[u8],
    patched: &[Option<Arc<[u8]>>],
) -> Result<Option<Absorbed>, String> {
    use super::lmdb::{DB_ELEMS, DB_ITEMS, DB_ZSCORE};
    use super::wal::Op;
    let mut patched = patched.iter();
    let mut changes = Vec::new();
    let base = payload.as_ptr() as usize;
    for op in super::wal::ops(payload) {
        match op? {
            Op::Put { db, key, value } if db == DB_ITEMS => {
                // `value` is a slice of `payload`: where it lies in it.
                let start = (value.as_ptr() as usize).wrapping_sub(base);
                let end = start.wrapping_add(value.len());
                if end < start || end > payload.len() {
                    return Err("a record's value outside its batch".into());
                }
                changes.push((key.into(), Some(Place::At(start, end))));
            }
            Op::Del { db, key } if db == DB_ITEMS => changes.push((key.into(), None)),
            Op::Patch { db, key, patch } if db == DB_ITEMS => {
                // Only strings are patched; without the whole item, readers wait for LMDB.
                let Some(item) = patched.next() else {
                    return Ok(None);
                };
                let place = match item {
                    Some(item) => Place::Whole(item.clone()),
                    None => {
                        let span = |s: &[u8]| {
                            let start = (s.as_ptr() as usize).wrapping_sub(base);
                            (start, start.wrapping_add(s.len()))
                        };
                        let spans = [
                            span(patch.new_header),
                            span(patch.prepend),
                            span(patch.bytes),
                        ];
                        if spans.iter().any(|&(a, b)| b < a || b > payload.len()) {
                            return Err("a patch's fields outside its batch".into());
                        }
                        Place::Edited(PatchSpan {
                            header: spans[0],
                            new_len: patch.new_len as usize,
                            prepend: spans[1],
                            at: patch.at as usize,
                            bytes: spans[2],
                        })
                    }
                };
                changes.push((key.into(), Some(place)));
            }
            Op::Put { db, key, .. } | Op::Del { db, key } if db == DB_ELEMS || db == DB_ZSCORE => {
                match owner(key) {
                    Some(id) => dirty.insert_mut(id),
                    None => return Err("an element record shorter than its collection id".into()),
                }
            }
            Op::Clear { .. } => return Ok(None),
            // The expiry index, the CAS counter and reclaimed elements of deleted collections
            // are the writer's own business: no reader looks at them.
            _ => {}
        }
    }
    Ok(Some(Absorbed(changes)))
}

/// A multi-key read that stopped at a cold key looks this many keys further for other cold
/// ones, so that their reads go to the disk together (`Snap::note_cold`).
pub const COLD_AHEAD: usize = 64;

/// A reader's view for one pass: an LMDB snapshot and the overlay state over it; or, inside
/// the writer (EXEC's reads), its own write transaction, which holds everything.
pub struct Snap<'s> {
    store: &'s LmdbStore,
    state: Arc<State>,
    txn: SnapTxn<'s>,
    /// Whether `lookup` checks large records for residency (`resident.rs`), and the keys it
    /// found cold, for the caller to have read before it asks again.
    cold_checks: Cell<bool>,
    cold: RefCell<Vec<ColdKey>>,
    /// Records a reader thread read for the connection at hand (`server/cold.rs`): `lookup`
    /// answers from them first.
    fetched: Vec<Fetched>,
    /// A read met a collection whose elements changed after this snapshot (`note_pending`).
    pending: Cell<bool>,
    /// Pinned while the overlay has records (its list is searched under a guard).
    guard: Option<Guard>,
}

/// What `Snap::lookup` found under a key.
pub enum Found<'a> {
    Item(ItemRef<'a>),
    Missing,
    /// The record is not in memory: its key is noted (`Snap::take_cold`), nothing touched.
    Cold,
}

/// A key whose record was found not in memory, and where that record lies in `data.mdb` as of
/// the snapshot that found it (valid while that snapshot's transaction is open: see
/// `Snap::keep`).
pub struct ColdKey {
    pub key: Box<[u8]>,
    pub offset: u64,
    pub len: usize,
    /// The value lives in a log segment (`vlog.rs`), not in `data.mdb`: where `offset` is
    /// (the value's first byte), and `len` is the header's and the value's.
    pub in_log: Option<InLog>,
}

/// A cold value in the log: the item's header as stored inline, and its segment's
/// descriptors, buffered and `O_DIRECT` (open for the life of the process).
pub struct InLog {
    pub header: Vec<u8>,
    pub fd: std::os::fd::RawFd,
    pub direct: Option<std::os::fd::RawFd>,
}

/// A read transaction kept open past its pass, so that the pages of the records it found stay
/// unreused while they are read asynchronously (`server/uring.rs`).
pub type KeptTxn = Rc<Reader<'static>>;

enum SnapTxn<'s> {
    Own(Reader<'static>),
    /// Shared with reads still in flight, which keep it open after the pass (`Snap::keep`).
    Kept(KeptTxn),
    Within(&'s RoTxn<'s, WithoutTls>),
}

/// How many times a reader retries when a commit lands between its two loads (each retry is
/// a fresh read transaction; the writer publishes right after it commits).
const OPEN_TRIES: usize = 10_000;

impl<'s> Snap<'s> {
    pub fn open(store: &'s LmdbStore) -> Result<Snap<'s>, StoreError> {
        for _ in 0..OPEN_TRIES {
            let state = store.overlay().current();
            let txn = store.read_txn_static()?;
            if state.is_empty() || txn.id() == state.base {
                let guard = (!state.map.is_empty()).then(crossbeam_epoch::pin);
                return Ok(Snap {
                    store,
                    guard,
                    state,
                    txn: SnapTxn::Own(txn),
                    cold_checks: Cell::new(false),
                    cold: RefCell::new(Vec::new()),
                    fetched: Vec::new(),
                    pending: Cell::new(false),
                });
            }
            drop(txn);
            std::thread::yield_now();
        }
        Err(StoreError::Backend(
            "no read snapshot matches the published writes".into(),
        ))
    }

    /// The writer's view through its own transaction (no overlay: the transaction has it).
    pub fn within(store: &'s LmdbStore, txn: &'s RoTxn<'s, WithoutTls>) -> Snap<'s> {
        Snap {
            store,
            state: Arc::new(State {
                base: 0,
                map: Map::new(),
                dirty: Dirty::new_sync(),
            }),
            guard: None,
            txn: SnapTxn::Within(txn),
            cold_checks: Cell::new(false),
            cold: RefCell::new(Vec::new()),
            fetched: Vec::new(),
            pending: Cell::new(false),
        }
    }

    /// Turns residency checks in `lookup` on or off (off: `lookup` is `get`).
    pub fn set_cold_checks(&self, on: bool) {
        self.cold_checks.set(on);
    }

    /// The cold keys `lookup` and `note_cold` noted since the last call.
    pub fn take_cold(&self) -> Vec<ColdKey> {
        std::mem::take(&mut self.cold.borrow_mut())
    }

    /// This snapshot, and its own read transaction shared, to keep open while the cold
    /// records it found are read (their offsets hold only as long as it is open); None inside
    /// the writer. (Shared only when asked: most passes find nothing cold, and sharing costs
    /// an allocation.)
    pub fn keep(self) -> (Snap<'s>, Option<KeptTxn>) {
        let Snap {
            store,
            state,
            txn,
            cold_checks,
            cold,
            fetched,
            pending,
            guard,
        } = self;
        let (txn, kept) = match txn {
            SnapTxn::Own(t) => {
                let t = Rc::new(t);
                (SnapTxn::Kept(t.clone()), Some(t))
            }
            SnapTxn::Kept(t) => (SnapTxn::Kept(t.clone()), Some(t)),
            SnapTxn::Within(t) => (SnapTxn::Within(t), None),
        };
        let snap = Snap {
            store,
            state,
            txn,
            cold_checks,
            cold,
            fetched,
            pending,
            guard,
        };
        (snap, kept)
    }

    /// Notes `key`, whose record `bytes` is cold, for reading.
    fn push_cold(&self, key: &[u8], bytes: &[u8]) {
        // `cold` answered true only for a record in the map, which has an offset.
        if let Some(offset) = self.store.file_offset(bytes) {
            self.cold.borrow_mut().push(ColdKey {
                key: key.into(),
                offset,
                len: bytes.len(),
                in_log: None,
            });
        }
    }

    /// Whether `bytes`, a record of this store, is not in memory: the record itself in
    /// `data.mdb`, or the value it points to in the log (`vlog.rs`). Noted for reading if so.
    fn check_cold(&self, key: &[u8], bytes: &[u8]) -> bool {
        if self.store.cold(bytes) {
            self.push_cold(key, bytes);
            return true;
        }
        let Some((header, p)) = item::inline_header(bytes) else {
            return false;
        };
        // Unresolvable: the lookup's own decode says why.
        let (Ok(value), Some((fd, direct))) = (super::vlog::resolve(&p), super::vlog::raw_fds(&p))
        else {
            return false;
        };
        if value.len() < super::resident::CHECK_FROM || !super::vlog::cold(value, p.id) {
            return false;
        }
        self.cold.borrow_mut().push(ColdKey {
            key: key.into(),
            offset: p.offset,
            len: header.len() + value.len(),
            in_log: Some(InLog { header, fd, direct }),
        });
        true
    }

    /// Records read for the connection about to run (replacing any earlier ones).
    pub fn set_fetched(&mut self, fetched: Vec<Fetched>) {
        self.fetched = fetched;
    }

    /// Whether the elements of collection `id` changed after this snapshot: a read of them
    /// must not come from it (`note_pending`).
    pub fn coll_dirty(&self, id: u64) -> bool {
        !self.state.dirty.is_empty() && self.state.dirty.contains(&id)
    }

    /// Notes that a read stopped at a dirty collection: the caller throws its reply away and
    /// has the writer run it (`take_pending`). The error to stop with.
    pub fn note_pending(&self) -> StoreError {
        self.pending.set(true);
        StoreError::Pending
    }

    /// Whether a read stopped at a dirty collection (its reply is to be thrown away).
    pub fn is_pending(&self) -> bool {
        self.pending.get()
    }

    /// Whether a read stopped at a dirty collection since the last call (and forgets it).
    pub fn take_pending(&self) -> bool {
        self.pending.replace(false)
    }

    /// Whether a lookup has found a cold record since the last `take_cold`.
    pub fn found_cold(&self) -> bool {
        !self.cold.borrow().is_empty()
    }

    /// Like `get`, but with residency checks on, a record some of whose pages are not in
    /// memory is not touched (not even its header): its range is noted and `Cold` returned.
    pub fn lookup(&self, key: &[u8]) -> Result<Found<'_>, StoreError> {
        if key.is_empty() || key.len() > super::MAX_KEY {
            return Ok(Found::Missing);
        }
        if let Some(f) = self.fetched.iter().find(|f| *f.key == *key) {
            return item::decode(f.record()).map(Found::Item);
        }
        let Some(bytes) = self.record(key)? else {
            return Ok(Found::Missing);
        };
        if self.cold_checks.get() && self.check_cold(key, bytes) {
            return Ok(Found::Cold);
        }
        item::decode(bytes).map(Found::Item)
    }

    /// Notes `key`'s record for reading in if it is cold (a multi-key read that stopped at an
    /// earlier cold key asks for the ones after it too, so they arrive together). Returns
    /// whether it was.
    pub fn note_cold(&self, key: &[u8]) -> bool {
        if !self.cold_checks.get() || key.is_empty() || key.len() > super::MAX_KEY {
            return false;
        }
        if self.fetched.iter().any(|f| *f.key == *key) {
            return false;
        }
        match self.record(key) {
            Ok(Some(bytes)) => self.check_cold(key, bytes),
            _ => false,
        }
    }

    pub fn txn(&self) -> &RoTxn<'s, WithoutTls> {
        match &self.txn {
            SnapTxn::Own(t) => t,
            SnapTxn::Kept(t) => t,
            SnapTxn::Within(t) => t,
        }
    }

    /// The overlay's newest version of `key`, if it changed after `base`.
    fn overlaid(&self, key: &[u8]) -> Option<&Val> {
        self.guard.as_ref().and_then(|g| self.state.map.get(key, g))
    }

    /// The overlay's records within the bounds, newest version of each key, in key order.
    fn overlaid_range<'a>(
        &'a self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
    ) -> Box<dyn Iterator<Item = (&'a [u8], &'a Val)> + 'a> {
        match &self.guard {
            Some(g) => Box::new(self.state.map.range(lo, hi, g)),
            None => Box::new(std::iter::empty()),
        }
    }

    /// The item record under `key`, as of this snapshot.
    pub fn record(&self, key: &[u8]) -> Result<Option<&[u8]>, StoreError> {
        let found = match self.overlaid(key) {
            Some(v) => v.as_deref(),
            None => self.store.items().get(self.txn(), key)?,
        };
        // Cache mode: the evictor spares what was read recently (one relaxed atomic at most).
        if found.is_some()
            && let Some(a) = self.store.access()
        {
            a.note_read(key);
        }
        Ok(found)
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<ItemRef<'_>>, StoreError> {
        if key.is_empty() || key.len() > super::MAX_KEY {
            return Ok(None);
        }
        match self.record(key)? {
            None => Ok(None),
            Some(bytes) => item::decode(bytes).map(Some),
        }
    }

    /// Item records in key order within the bounds.
    pub fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Result<ItemsIter<'_>, StoreError> {
        let lmdb = self.store.items().range(self.txn(), &(lo, hi))?;
        let ov: OverlayRange<'_> = self.overlaid_range(lo, hi);
        Ok(ItemsIter {
            lmdb: lmdb.peekable(),
            ov: ov.peekable(),
        })
    }

    /// The number of keys (live or expired, as LMDB counts them).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> Result<u64, StoreError> {
        let mut n = self.store.items().len(self.txn())? as i64;
        for (k, v) in self.overlaid_range(Bound::Unbounded, Bound::Unbounded) {
            let below = self.store.items().get(self.txn(), k)?.is_some();
            n += i64::from(v.is_some() && !below) - i64::from(v.is_none() && below);
        }
        Ok(n.max(0) as u64)
    }

    /// The number of keys with an expiry (live or expired, as `len` counts them): LMDB's
    /// count, corrected by the overlay's records. None in a data dir older than the count
    /// that no write has updated yet.
    pub fn expires(&self) -> Result<Option<u64>, StoreError> {
        let Some(base) = self.store.expires(self.txn())? else {
            return Ok(None);
        };
        let ttl = |b: Option<&[u8]>| -> Result<i64, StoreError> {
            Ok(match b {
                Some(b) => i64::from(item::decode(b)?.meta.expire_at != 0),
                None => 0,
            })
        };
        let mut n = base as i64;
        for (k, v) in self.overlaid_range(Bound::Unbounded, Bound::Unbounded) {
            n += ttl(v.as_deref())? - ttl(self.store.items().get(self.txn(), k)?)?;
        }
        Ok(Some(n.max(0) as u64))
    }
}

impl std::ops::Deref for Snap<'_> {
    type Target = LmdbStore;
    fn deref(&self) -> &LmdbStore {
        self.store
    }
}

type LmdbRange<'a> = heed::RoRange<'a, Bytes, Bytes>;
type OverlayRange<'a> = Box<dyn Iterator<Item = (&'a [u8], &'a Val)> + 'a>;

/// LMDB's records merged with the overlay's (which win; deletions hide the key).
pub struct ItemsIter<'a> {
    lmdb: std::iter::Peekable<LmdbRange<'a>>,
    ov: std::iter::Peekable<OverlayRange<'a>>,
}

impl<'a> Iterator for ItemsIter<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), heed::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let Some(&(ok, _)) = self.ov.peek() else {
                return self.lmdb.next();
            };
            match self.lmdb.peek() {
                Some(Err(_)) => return self.lmdb.next(),
                Some(Ok((lk, _))) if *lk < ok => return self.lmdb.next(),
                Some(Ok((lk, _))) if *lk == ok => {
                    // Shadowed by the overlay.
                    self.lmdb.next();
                }
                _ => {}
            }
            let (k, v) = self.ov.next()?;
            if let Some(v) = v {
                return Some(Ok((k, &v[..])));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Kind;
    use crate::storage::item::ItemMeta;
    use crate::storage::wal::LogBuf;
    use std::ops::Bound::Unbounded;

    fn record(kind: Kind, value: &[u8]) -> Vec<u8> {
        let (hdr, n) = ItemMeta::new(kind, 0, 0, 1).header();
        [&hdr[..n], value].concat()
    }

    fn store(dir: &std::path::Path) -> LmdbStore {
        LmdbStore::open(dir, 16 << 20, 16).expect("open").0
    }

    fn put_lmdb(s: &LmdbStore, pairs: &[(&[u8], &[u8])]) {
        let mut txn = s.write_txn().expect("txn");
        for (k, v) in pairs {
            s.items
                .put(&mut txn, k, &record(Kind::String, v))
                .expect("put");
        }
        txn.commit_unlogged().expect("commit");
    }

    /// Appends to `log` a `PATCH` of `key` whose readers make the item (no whole item).
    fn log_edit(log: &mut LogBuf, key: &[u8], new_len: u32, prepend: &[u8], at: u32, bytes: &[u8]) {
        let (hdr, n) = ItemMeta::new(Kind::String, 0, 0, 2).header();
        let p = crate::storage::wal::Patch {
            old_header: &hdr[..n],
            old_len: 0,
            new_header: &hdr[..n],
            new_len,
            crc: 0,
            prepend,
            at,
            bytes,
        };
        log.patch(crate::storage::lmdb::DB_ITEMS, key, &p, None, 0);
    }

    /// The next view: `log`'s batch over `map`.
    fn next(map: &Map, log: LogBuf) -> Option<Map> {
        let mut dirty = Dirty::new_sync();
        let mut log = log;
        let a = absorb(&mut dirty, log.payload(), log.patched())
            .expect("readable")
            .expect("absorbable");
        let shared = log.share();
        let changes = a.changes(&shared, crate::storage::wal::HEADER, map)?;
        Some(map.with(changes))
    }

    fn edited_value(map: &Map, key: &[u8]) -> Option<Vec<u8>> {
        let g = crossbeam_epoch::pin();
        let rec = map.get(key, &g)?.as_ref()?;
        Some(
            crate::storage::item::decode(rec)
                .expect("decodes")
                .value
                .to_vec(),
        )
    }

    #[test]
    fn edits_are_made_into_whole_items_from_the_versions_before_them() {
        use crate::storage::lmdb::DB_ITEMS;
        let mut log = LogBuf::default();
        log.put(DB_ITEMS, b"k", &[&record(Kind::String, b"hello world")]);
        let m1 = next(&Map::new(), log).expect("a store");
        // One edit in a batch, then two in the next (the second on the first, in the batch).
        let mut log = LogBuf::default();
        log_edit(&mut log, b"k", 13, b"", 11, b"!!");
        let m2 = next(&m1, log).expect("the key has a version");
        let mut log = LogBuf::default();
        log_edit(&mut log, b"k", 15, b">>", 0, b"");
        log_edit(&mut log, b"k", 21, b"", 20, b"Z");
        let m3 = next(&m2, log).expect("the key has a version");
        let before = m3.superseded();
        // The newest first: made from the stored version and all three edits, in order.
        assert_eq!(
            edited_value(&m3, b"k").as_deref(),
            Some(&b">>hello world!!\0\0\0\0\0Z"[..])
        );
        assert_eq!(
            edited_value(&m2, b"k").as_deref(),
            Some(&b"hello world!!"[..])
        );
        assert_eq!(
            edited_value(&m1, b"k").as_deref(),
            Some(&b"hello world"[..])
        );
        // What readers made counts toward the next LMDB commit.
        assert!(
            m3.superseded() >= before + 2 * 21,
            "{} after {before}",
            m3.superseded()
        );
        // Then an edit on a version already made.
        let mut log = LogBuf::default();
        log_edit(&mut log, b"k", 21, b"", 0, b"<");
        let m4 = next(&m3, log).expect("the key has a version");
        assert_eq!(
            edited_value(&m4, b"k").as_deref(),
            Some(&b"<>hello world!!\0\0\0\0\0Z"[..])
        );
        // An edit of a key with no version here cannot be made: its batch waits for LMDB,
        // which the writer knows before it logs the batch.
        let mut log = LogBuf::default();
        log_edit(&mut log, b"other", 5, b"", 0, b"x");
        let mut dirty = Dirty::new_sync();
        let a = absorb(&mut dirty, log.payload(), log.patched())
            .expect("readable")
            .expect("absorbable");
        assert!(!a.edits_resolve(&m4));
        assert!(next(&m4, log).is_none());
        // Nor after its deletion earlier in the same batch; after a store there, it can.
        let mut log = LogBuf::default();
        log.del(DB_ITEMS, b"k");
        log_edit(&mut log, b"k", 5, b"", 0, b"x");
        let a = absorb(&mut dirty, log.payload(), log.patched())
            .expect("readable")
            .expect("absorbable");
        assert!(!a.edits_resolve(&m4));
        let mut log = LogBuf::default();
        log.put(DB_ITEMS, b"new", &[&record(Kind::String, b"abc")]);
        log_edit(&mut log, b"new", 4, b"", 3, b"d");
        let a = absorb(&mut dirty, log.payload(), log.patched())
            .expect("readable")
            .expect("absorbable");
        assert!(a.edits_resolve(&m4));
        let m5 = next(&m4, log).expect("a version in the batch");
        assert_eq!(edited_value(&m5, b"new").as_deref(), Some(&b"abcd"[..]));
    }

    #[test]
    fn random_chains_of_prepends_writes_and_gaps_make_what_the_edits_made() {
        use crate::storage::lmdb::DB_ITEMS;
        let mut rng = crate::test_rng::Xorshift(0x2545_f491_4f6c_dd1d);
        let mut roll = |n: u64| rng.below(n) as usize;
        let mut model: Vec<u8> = (0..3000).map(|i| (i % 199) as u8).collect();
        let mut log = LogBuf::default();
        log.put(DB_ITEMS, b"k", &[&record(Kind::String, &model)]);
        let mut map = next(&Map::new(), log).expect("a store");
        for _ in 0..40 {
            let mut log = LogBuf::default();
            for _ in 0..1 + roll(8) {
                let data: Vec<u8> = (0..1 + roll(40)).map(|_| roll(256) as u8).collect();
                if roll(3) == 0 {
                    let new_len = (model.len() + data.len()) as u32;
                    log_edit(&mut log, b"k", new_len, &data, 0, b"");
                    model.splice(0..0, data.iter().copied());
                } else {
                    let at = roll(model.len() as u64 + 30);
                    let new_len = model.len().max(at + data.len());
                    log_edit(&mut log, b"k", new_len as u32, b"", at as u32, &data);
                    model.resize(new_len, 0);
                    model[at..at + data.len()].copy_from_slice(&data);
                }
            }
            map = next(&map, log).expect("the key has a version");
            // Read now and then: later versions then start from one already made.
            if roll(4) == 0 {
                assert_eq!(edited_value(&map, b"k").as_deref(), Some(&model[..]));
            }
        }
        assert_eq!(edited_value(&map, b"k").as_deref(), Some(&model[..]));
    }

    #[test]
    fn a_long_chain_of_edits_is_made_and_freed_without_recursion() {
        use crate::storage::lmdb::DB_ITEMS;
        let mut log = LogBuf::default();
        log.put(DB_ITEMS, b"k", &[&record(Kind::String, b"")]);
        let mut map = next(&Map::new(), log).expect("a store");
        // 200,000 one-byte appends, 1,000 to a batch, on a thread with a small stack: a
        // recursive make or drop would need far more than it has.
        let n = 200_000u32;
        let worker = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                for b in 0..n / 1000 {
                    let mut log = LogBuf::default();
                    for i in 0..1000u32 {
                        let at = b * 1000 + i;
                        log_edit(&mut log, b"k", at + 1, b"", at, &[(at % 251) as u8]);
                    }
                    map = next(&map, log).expect("the key has a version");
                }
                let v = edited_value(&map, b"k").expect("a value");
                assert_eq!(v.len(), n as usize);
                assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
                drop(map);
            })
            .expect("spawn");
        worker.join().expect("made and freed");
    }

    #[test]
    fn absorb_takes_items_and_names_changed_collections_and_refuses_clears() {
        use crate::storage::lmdb::{DB_ELEMS, DB_EXPIRY, DB_ITEMS, DB_ZSCORE, ZRANK_DIR};
        let mut dirty = Dirty::new_sync();
        let mut log = LogBuf::default();
        log.put(DB_ITEMS, b"a", &[&record(Kind::String, b"1")]);
        log.del(DB_ITEMS, b"b");
        log.put(DB_EXPIRY, b"x", &[b""]);
        log.put(DB_ITEMS, b"l", &[&record(Kind::List, &[0; 32])]);
        log.put(DB_ELEMS, &[&7u64.to_be_bytes()[..], b"f"].concat(), &[b"v"]);
        log.del(DB_ZSCORE, &[&9u64.to_be_bytes()[..], b"s"].concat());
        log.put(
            DB_ZSCORE,
            &[&(11u64 | ZRANK_DIR).to_be_bytes()[..], b"c"].concat(),
            &[b"n"],
        );
        let absorbed = absorb(&mut dirty, log.payload(), log.patched())
            .expect("readable")
            .expect("visible");
        let shared = log.share();
        let empty = Map::new();
        let changes = absorbed
            .changes(&shared, crate::storage::wal::HEADER, &empty)
            .expect("no edits");
        let map = empty.with(changes);
        let g = crossbeam_epoch::pin();
        // Served from the batch's own bytes, exactly the record written.
        let a = record(Kind::String, b"1");
        assert_eq!(map.get(b"a", &g).and_then(|v| v.as_deref()), Some(&a[..]));
        assert!(map.get(b"b", &g).is_some_and(|v| v.is_none()));
        assert!(map.get(b"x", &g).is_none());
        // A collection's metadata is served from here like a string's record.
        let l = record(Kind::List, &[0; 32]);
        assert_eq!(map.get(b"l", &g).and_then(|v| v.as_deref()), Some(&l[..]));
        let mut ids: Vec<u64> = dirty.iter().copied().collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![7, 9, 11]);
        let mut l = LogBuf::default();
        l.clear(DB_ITEMS);
        assert_eq!(
            absorb(&mut dirty.clone(), l.payload(), l.patched()),
            Ok(None)
        );
        let mut short = LogBuf::default();
        short.put(DB_ELEMS, b"abc", &[b"v"]);
        assert!(absorb(&mut dirty, short.payload(), short.patched()).is_err());
    }

    fn string(v: &[u8]) -> Val {
        Some(Rec::from(Arc::<[u8]>::from(record(Kind::String, v))))
    }

    fn value_of(v: Option<&Val>) -> Option<Option<Vec<u8>>> {
        v.map(|v| {
            v.as_ref()
                .map(|b| item::decode(b).expect("item").value.to_vec())
        })
    }

    #[test]
    fn each_view_sees_the_batches_up_to_its_own_and_the_last_write_of_each() {
        let v0 = Map::new();
        let v1 = v0.with(vec![
            (b"a"[..].into(), string(b"1")),
            (b"b"[..].into(), string(b"1")),
            (b"a"[..].into(), string(b"2")),
        ]);
        let v2 = v1.with(vec![
            (b"a"[..].into(), None),
            (b"c"[..].into(), string(b"3")),
        ]);
        let v3 = v2.with(vec![(b"a"[..].into(), string(b"4"))]);
        let g = crossbeam_epoch::pin();
        assert!(v0.is_empty() && v0.get(b"a", &g).is_none());
        // A key written twice in one batch keeps its last write, as one version.
        assert_eq!(value_of(v1.get(b"a", &g)), Some(Some(b"2".to_vec())));
        assert_eq!(v1.len, 2);
        assert!(v1.get(b"c", &g).is_none());
        assert_eq!(value_of(v2.get(b"a", &g)), Some(None));
        assert_eq!(value_of(v2.get(b"c", &g)), Some(Some(b"3".to_vec())));
        assert_eq!(value_of(v3.get(b"a", &g)), Some(Some(b"4".to_vec())));
        // Unchanged keys answer from the batch that last wrote them; keys between the
        // written ones, and past them, are not there.
        assert_eq!(value_of(v3.get(b"b", &g)), Some(Some(b"1".to_vec())));
        for absent in [&b""[..], b"aa", b"bb", b"d"] {
            assert!(v3.get(absent, &g).is_none(), "{absent:?}");
        }
        let keys = |m: &Map, lo: Bound<&[u8]>, hi: Bound<&[u8]>| -> Vec<(Vec<u8>, bool)> {
            m.range(lo, hi, &g)
                .map(|(k, v)| (k.to_vec(), v.is_some()))
                .collect()
        };
        use Bound::{Excluded, Included, Unbounded};
        assert_eq!(
            keys(&v1, Unbounded, Unbounded),
            vec![(b"a".to_vec(), true), (b"b".to_vec(), true)]
        );
        assert_eq!(
            keys(&v2, Unbounded, Unbounded),
            vec![
                (b"a".to_vec(), false),
                (b"b".to_vec(), true),
                (b"c".to_vec(), true)
            ]
        );
        assert_eq!(
            keys(&v3, Excluded(b"a"), Included(b"c")),
            vec![(b"b".to_vec(), true), (b"c".to_vec(), true)]
        );
        assert_eq!(
            keys(&v3, Included(b"a"), Excluded(b"c")),
            vec![(b"a".to_vec(), true), (b"b".to_vec(), true)]
        );
        assert_eq!(keys(&v3, Included(b"c"), Excluded(b"c")), vec![]);
        // Hidden versions are counted: "a" 2 hidden by its deletion, and that by "a" 4 ("a" 1
        // never became a version).
        let two = record(Kind::String, b"2").len() as u64;
        assert_eq!(v1.superseded(), 0);
        assert_eq!(v2.superseded(), 1 + two + VERSION_OVERHEAD);
        assert_eq!(v3.superseded(), 2 * (1 + VERSION_OVERHEAD) + two);
    }

    #[test]
    fn views_stay_as_published_while_the_writer_adds_batches() {
        // One writer adds batches that set "a" and "b" to the batch's number (and a key of
        // its own); readers take the latest view and check, while batches keep arriving, that
        // it answers a == b, the same on a second look, and no less than the last view they
        // took.
        let current = Arc::new(Mutex::new(Map::new()));
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let current = current.clone();
                let done = done.clone();
                std::thread::spawn(move || {
                    let num = |v: Option<&Val>| -> u64 {
                        let v = v.expect("written").as_ref().expect("not deleted");
                        let item = item::decode(v).expect("item");
                        std::str::from_utf8(item.value)
                            .expect("utf-8")
                            .parse()
                            .expect("number")
                    };
                    let (mut last, mut looks) = (0, 0u64);
                    while !done.load(Ordering::Acquire) || looks == 0 {
                        let view = current.lock().expect("lock").clone();
                        if view.is_empty() {
                            continue;
                        }
                        let g = crossbeam_epoch::pin();
                        let a = num(view.get(b"a", &g));
                        assert_eq!(a, num(view.get(b"b", &g)), "half a batch");
                        assert!(a >= last, "a view went back from {last} to {a}");
                        let seen: Vec<u64> = view
                            .range(Bound::Unbounded, Bound::Included(b"b"), &g)
                            .map(|(_, v)| num(Some(v)))
                            .collect();
                        assert_eq!(seen, vec![a, a], "range");
                        assert_eq!(num(view.get(b"a", &g)), a, "a view changed");
                        last = a;
                        looks += 1;
                    }
                    looks
                })
            })
            .collect();
        let mut view = Map::new();
        for i in 1..=3000u64 {
            let n = string(i.to_string().as_bytes());
            view = view.with(vec![
                (b"a"[..].into(), n.clone()),
                (format!("k{i}").into_bytes().into(), n.clone()),
                (b"b"[..].into(), n),
            ]);
            *current.lock().expect("lock") = view.clone();
        }
        done.store(true, Ordering::Release);
        for r in readers {
            assert!(r.join().expect("reader") > 0);
        }
        let g = crossbeam_epoch::pin();
        assert_eq!(
            view.range(Bound::Unbounded, Bound::Unbounded, &g).count(),
            3002
        );
    }

    #[test]
    fn a_snapshot_pairs_dirty_collections_with_their_base_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path());
        let base = s.read_txn().expect("txn").id();
        let dirty = Dirty::new_sync().insert(5);
        s.overlay().publish(base, Map::new(), dirty);
        let snap = Snap::open(&s).expect("snap");
        assert!(snap.coll_dirty(5) && !snap.coll_dirty(6));
        assert!(!snap.take_pending());
        assert!(matches!(snap.note_pending(), StoreError::Pending));
        assert!(snap.take_pending() && !snap.take_pending());
        drop(snap);
        // Only element changes outstanding: a snapshot still may not pair them with a later
        // LMDB transaction.
        put_lmdb(&s, &[(b"k", b"v")]);
        assert!(Snap::open(&s).is_err());
        assert!(!s.overlay().current().is_empty());
    }

    #[test]
    fn a_snapshot_merges_the_overlay_over_lmdb_in_key_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path());
        put_lmdb(&s, &[(b"a", b"1"), (b"c", b"3"), (b"e", b"5")]);
        let base = s.read_txn().expect("txn").id();
        let map = Map::new().with(vec![
            (b"b"[..].into(), string(b"2")),
            (b"c"[..].into(), None),
            (b"e"[..].into(), string(b"55")),
        ]);
        s.overlay().publish(base, map, Dirty::new_sync());
        let snap = Snap::open(&s).expect("snap");
        let seen: Vec<(Vec<u8>, Vec<u8>)> = snap
            .range(Unbounded, Unbounded)
            .expect("range")
            .map(|r| {
                let (k, v) = r.expect("entry");
                (k.to_vec(), item::decode(v).expect("item").value.to_vec())
            })
            .collect();
        let want: Vec<(Vec<u8>, Vec<u8>)> = [("a", "1"), ("b", "2"), ("e", "55")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(seen, want);
        assert_eq!(snap.len().expect("len"), 3);
        assert!(snap.get(b"c").expect("get").is_none());
        assert_eq!(
            snap.get(b"b").expect("get").map(|i| i.value),
            Some(&b"2"[..])
        );
        let from_c: Vec<Vec<u8>> = snap
            .range(Bound::Included(&b"c"[..]), Unbounded)
            .expect("range")
            .map(|r| r.expect("entry").0.to_vec())
            .collect();
        assert_eq!(from_c, vec![b"e".to_vec()]);
    }

    #[test]
    fn a_snapshot_never_pairs_an_overlay_with_another_lmdb_transaction() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path());
        let base = s.read_txn().expect("txn").id();
        let map = Map::new().with(vec![(b"k"[..].into(), string(b"v"))]);
        s.overlay().publish(base, map, Dirty::new_sync());
        // LMDB moves on without the overlay being republished over it: no snapshot may mix
        // the two.
        put_lmdb(&s, &[(b"k", b"lmdb")]);
        assert!(Snap::open(&s).is_err());
        let now = s.read_txn().expect("txn").id();
        s.overlay().publish(now, Map::new(), Dirty::new_sync());
        let snap = Snap::open(&s).expect("snap");
        assert_eq!(
            snap.get(b"k").expect("get").map(|i| i.value),
            Some(&b"lmdb"[..])
        );
    }
}
