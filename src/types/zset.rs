//! Sorted sets: each member is an element record `elems[id ++ member] = score` (the f64's bits,
//! 8 bytes big-endian) and an index record `zscore[id ++ score_key(score) ++ member] = ""`,
//! always written and deleted together. `score_key` maps a score to 8 bytes whose byte order is
//! the numeric order (-0.0 is stored as 0.0; NaN never is), so the index is in Redis's order:
//! by score, then by member bytes.
//!
//! Complexity (n members, k returned). LMDB keeps no counts, so positions come from the rank
//! directory (`zrank`: the index cut into chunks of at most 256 entries, with their counts),
//! about n/380 + 128 cursor steps on average, "O(r)" below:
//! - ZADD, ZINCRBY, ZREM, ZSCORE, ZMSCORE: O(log n) per member (the directory's count of the
//!   member's chunk is updated with it). ZCARD: O(1) (the metadata).
//! - ZRANK, ZREVRANK: O(r). ZRANGE by rank, ZREVRANGE: O(r + k).
//! - BYSCORE forms (ZRANGEBYSCORE, ZREVRANGEBYSCORE, ZRANGE .. BYSCORE [REV]): the cursor seeks
//!   straight to the first score in range: O(log n + offset + k).
//! - BYLEX forms: the same seek over the element records, which are in member order: O(log n +
//!   offset + k). Redis defines lex ranges only when all scores are equal; memkeep then gives
//!   the same answer, and with mixed scores answers in member order.
//! - ZCOUNT: two ranks, O(r). ZLEXCOUNT: count inside the range or outside it, whichever ends
//!   first: O(log n + min(k, n - k)).
//! - ZREMRANGEBYRANK: O(r) to the first, then O(log n) per removal; BYSCORE/BYLEX,
//!   ZPOPMIN/ZPOPMAX: a seek, then O(log n) per removal.
//! - A set stored by a memkeep before the directory (metadata `head` 0) answers ranks by
//!   walking from the nearer end, O(min(rank, n - rank)), until its first write builds one.
//! - ZSCAN: `COUNT` element records per call, in member order, from a server-side cursor.
//! - ZRANGESTORE: the ZRANGE walk (`range_each`), then the destination written as a new set:
//!   O(log n) per member, the rank directory built in one pass (`replace_with`). ZUNION, ZINTER,
//!   ZDIFF, their STORE forms and ZINTERCARD: `zcombine`.
//! - ZRANDMEMBER: one walk for sets up to 4,096 members or counts over 1/256 of the set, else a
//!   random rank looked up in the directory per pick, O(r) each; exactly uniform either way.
//!
//! Limits and differences from Redis 7.0 (deliberate):
//! - A member is at most `MAX_SUB` (495) bytes (LMDB's key limit less the id and score): ZADD
//!   and ZINCRBY answer `ERR sorted-set member longer than 495 bytes (memkeep's limit)`; reads
//!   and removals of such a member find nothing.
//! - Score arguments parse as Redis's `strtod` does, except hexadecimal floats (`0x10`), which
//!   memkeep rejects.
//! - ZSCAN walks members in byte order (Redis: score order for small sets, hash order for big
//!   ones); its cursors are server-side resume points, so an unknown cursor is `ERR invalid
//!   cursor`. Its scores are formatted as Redis formats a small set's (an integral score within
//!   ±2^62 as an integer, else `%.17g`).
//! - A score of -0 is stored as 0 (Redis keeps -0 in sets of more than 128 members and prints
//!   `-0`; in small sets it prints `0`, as memkeep always does).
//! - Scores are formatted as Redis 7.0 replies with them (`%.17g`, `enc::fmt_double`), in reads
//!   and in write replies (ZINCRBY, ZADD INCR, ZPOPMIN/ZPOPMAX) alike.
//!
//! This module is the storage side (layout, `apply`, and the walks, counts and rank lookups the
//! reads use); the argument rules and the replies are `crate::commands::zset`'s.

use std::ops::Bound;

use heed::types::Bytes;
use heed::{Database, RoRange, RoRevRange, RoTxn};

use super::hash::{sample_distinct, sample_repeats};
use super::set::Combine;
use super::zcombine::Aggregate;
use super::zrank::{self, RANKED};
use super::{CollMeta, Found, MAX_SUB, ReadCx, Tx, clamp_range, elem_key, random_u64};
use crate::outcome::Outcome;
use crate::storage::ItemMeta;
use crate::storage::lmdb::LmdbWrite;
use crate::storage::{Kind, StoreError, WriteView};

const NAN_SCORE: &str = "ERR resulting score is not a number (NaN)";

/// ZADD's options (ZINCRBY is ZADD INCR).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddFlags {
    pub nx: bool,
    pub xx: bool,
    pub gt: bool,
    pub lt: bool,
    pub ch: bool,
    pub incr: bool,
}

/// Scores from `lo` to `hi` inclusive, as score keys (`score_key`); empty when lo > hi.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreRange {
    pub lo: u64,
    pub hi: u64,
}

/// One end of a lex range: `-`, `+`, `[member` or `(member`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lex {
    Min,
    Max,
    Incl(Vec<u8>),
    Excl(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LexRange {
    pub min: Lex,
    pub max: Lex,
}

/// Which members a ZREMRANGEBY* removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeBy {
    Rank(i64, i64),
    Score(ScoreRange),
    Lex(LexRange),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ZSetOp {
    /// ZADD and ZINCRBY: (score, member) pairs, in order.
    Add {
        key: Vec<u8>,
        flags: AddFlags,
        pairs: Vec<(f64, Vec<u8>)>,
    },
    Rem {
        key: Vec<u8>,
        members: Vec<Vec<u8>>,
    },
    RemRange {
        key: Vec<u8>,
        by: RangeBy,
    },
    /// ZPOPMIN/ZPOPMAX; `count` None: one member.
    Pop {
        key: Vec<u8>,
        max: bool,
        count: Option<u64>,
    },
    /// ZUNIONSTORE/ZINTERSTORE/ZDIFFSTORE (`zcombine`): `keys` (sets or sorted sets) combined
    /// into `dst`, which is replaced (deleted when the result is empty). `deferred`: an error
    /// in the options, which Redis finds only after checking the sources' types, so it is
    /// answered after that check.
    Store {
        dst: Vec<u8>,
        how: Combine,
        keys: Vec<Vec<u8>>,
        weights: Vec<f64>,
        agg: Aggregate,
        deferred: Option<&'static str>,
    },
    /// ZRANGESTORE: the members `range` selects from `src`, with their scores, into `dst`.
    RangeStore {
        dst: Vec<u8>,
        src: Vec<u8>,
        range: RangeSpec,
    },
}

/// What a ZRANGE-style command selects: ranks, scores or a lex range.
#[derive(Debug, Clone, PartialEq)]
pub enum RangeQuery {
    Rank(i64, i64),
    Score(ScoreRange),
    Lex(LexRange),
}

/// A ZRANGE (or ZRANGESTORE) query: the range, its direction, and LIMIT's `offset` and
/// `limit` (< 0: all; BYSCORE and BYLEX only).
#[derive(Debug, Clone, PartialEq)]
pub struct RangeSpec {
    pub query: RangeQuery,
    pub rev: bool,
    pub offset: i64,
    pub limit: i64,
}

// ---------------------------------------------------------------------------------------------
// Scores

/// A score as 8 bytes (big-endian) whose order is the numeric order: positive scores get the
/// sign bit set, negative ones all bits flipped. -0.0 maps as 0.0.
pub fn score_key(d: f64) -> u64 {
    let d = if d == 0.0 { 0.0 } else { d };
    let b = d.to_bits();
    if b >> 63 == 0 { b | (1 << 63) } else { !b }
}

/// The inverse of `score_key`.
pub fn key_score(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// An element record's value.
fn score_bytes(d: f64) -> [u8; 8] {
    let d = if d == 0.0 { 0.0 } else { d };
    d.to_bits().to_be_bytes()
}

fn score_from(v: &[u8]) -> Option<f64> {
    let b: [u8; 8] = v.try_into().ok()?;
    Some(f64::from_bits(u64::from_be_bytes(b)))
}

/// The score an element record's value holds.
pub fn elem_score(v: &[u8]) -> Result<f64, StoreError> {
    score_from(v).ok_or_else(corrupt)
}

fn corrupt() -> StoreError {
    StoreError::damaged("sorted-set element has a malformed score")
}

impl LexRange {
    /// Redis's `zslIsInLexRange` emptiness test: min above max, or equal with an open end.
    pub fn is_empty(&self) -> bool {
        use std::cmp::Ordering::*;
        let rank = |l: &Lex| match l {
            Lex::Min => 0,
            Lex::Max => 2,
            _ => 1,
        };
        let open = |l: &Lex| !matches!(l, Lex::Incl(_));
        let cmp = match (&self.min, &self.max) {
            (Lex::Incl(a) | Lex::Excl(a), Lex::Incl(b) | Lex::Excl(b)) => a.cmp(b),
            (a, b) => rank(a).cmp(&rank(b)),
        };
        cmp == Greater || (cmp == Equal && (open(&self.min) || open(&self.max)))
    }

    /// The element-record key bounds of this range in collection `id`; None when empty.
    /// A bound longer than any member (> MAX_SUB) is cut to MAX_SUB bytes: members are never
    /// longer, so "above the cut" is the same set as "above the bound".
    pub fn bounds(&self, id: u64) -> Option<KeyBounds> {
        if self.is_empty() {
            return None;
        }
        let start = match &self.min {
            Lex::Min => Bound::Included(id.to_be_bytes().to_vec()),
            Lex::Max => return None,
            Lex::Incl(v) if v.len() <= MAX_SUB => Bound::Included(elem_key(id, v)),
            Lex::Incl(v) | Lex::Excl(v) => {
                Bound::Excluded(elem_key(id, &v[..v.len().min(MAX_SUB)]))
            }
        };
        let end = match &self.max {
            Lex::Max => prefix_end(id),
            Lex::Min => return None,
            Lex::Excl(v) if v.len() <= MAX_SUB => Bound::Excluded(elem_key(id, v)),
            Lex::Incl(v) | Lex::Excl(v) => {
                Bound::Included(elem_key(id, &v[..v.len().min(MAX_SUB)]))
            }
        };
        Some((start, end))
    }
}

impl ScoreRange {
    /// The index key bounds of this range in collection `id`; None when empty.
    pub fn bounds(&self, id: u64) -> Option<KeyBounds> {
        if self.lo > self.hi {
            return None;
        }
        let start = Bound::Included(ix_prefix(id, self.lo));
        let end = match self.hi.checked_add(1) {
            Some(h) => Bound::Excluded(ix_prefix(id, h)),
            None => prefix_end(id),
        };
        Some((start, end))
    }
}

/// A key range in one database: (start, end).
pub type KeyBounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// `id ++ score key`: where the index entries of one score start.
fn ix_prefix(id: u64, sk: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&sk.to_be_bytes());
    k
}

/// The index key of `member` with score key `sk` in collection `id`.
fn ix_key(id: u64, sk: u64, member: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + member.len());
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&sk.to_be_bytes());
    k.extend_from_slice(member);
    k
}

/// Just past every record of collection `id`.
pub fn prefix_end(id: u64) -> Bound<Vec<u8>> {
    match id.checked_add(1) {
        Some(n) => Bound::Excluded(n.to_be_bytes().to_vec()),
        None => Bound::Unbounded,
    }
}

/// Every record of collection `id`.
pub fn whole(id: u64) -> KeyBounds {
    (Bound::Included(id.to_be_bytes().to_vec()), prefix_end(id))
}

/// The entries of an index record: (member, score).
pub fn ix_entry(k: &[u8]) -> Result<(&[u8], f64), StoreError> {
    let sk = k
        .get(8..16)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(corrupt)?;
    Ok((&k[16..], key_score(u64::from_be_bytes(sk))))
}

/// The entries of an element record: (member, score).
pub fn elem_entry<'a>(k: &'a [u8], v: &[u8]) -> Result<(&'a [u8], f64), StoreError> {
    Ok((&k[8..], score_from(v).ok_or_else(corrupt)?))
}

// ---------------------------------------------------------------------------------------------
// Cursor walks

/// A cursor walk over one database, forwards or backwards.
pub enum Walk<'t> {
    Fwd(RoRange<'t, Bytes, Bytes>),
    Rev(RoRevRange<'t, Bytes, Bytes>),
}

impl<'t> Iterator for Walk<'t> {
    type Item = Result<(&'t [u8], &'t [u8]), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let r = match self {
            Walk::Fwd(it) => it.next(),
            Walk::Rev(it) => it.next(),
        };
        r.map(|r| r.map_err(StoreError::from))
    }
}

pub fn walk<'t>(
    db: &Database<Bytes, Bytes>,
    txn: &'t RoTxn<'_>,
    bounds: &KeyBounds,
    rev: bool,
) -> Result<Walk<'t>, StoreError> {
    let range = (
        bounds.0.as_ref().map(Vec::as_slice),
        bounds.1.as_ref().map(Vec::as_slice),
    );
    Ok(if rev {
        Walk::Rev(db.rev_range(txn, &range)?)
    } else {
        Walk::Fwd(db.range(txn, &range)?)
    })
}

/// The number of records within `bounds` in collection `id` (of `len` records): counts inside
/// and outside the range at once and stops at whichever ends first, O(min(k, n - k)).
pub fn count_in(
    db: &Database<Bytes, Bytes>,
    txn: &RoTxn<'_>,
    id: u64,
    len: u64,
    bounds: &KeyBounds,
) -> Result<u64, StoreError> {
    let flip = |b: &Bound<Vec<u8>>| match b {
        Bound::Included(k) => Bound::Excluded(k.clone()),
        Bound::Excluded(k) => Bound::Included(k.clone()),
        Bound::Unbounded => Bound::Unbounded,
    };
    let mut inside = walk(db, txn, bounds, false)?;
    let below_bounds = (Bound::Included(id.to_be_bytes().to_vec()), flip(&bounds.0));
    let above_bounds = (flip(&bounds.1), prefix_end(id));
    let mut below = Some(walk(db, txn, &below_bounds, false)?);
    let mut above = if matches!(bounds.1, Bound::Unbounded) {
        None
    } else {
        Some(walk(db, txn, &above_bounds, false)?)
    };
    let (mut n_in, mut n_out) = (0u64, 0u64);
    loop {
        match inside.next() {
            None => return Ok(n_in),
            Some(r) => {
                r?;
                n_in += 1;
            }
        }
        loop {
            let side = match (&mut below, &mut above) {
                (Some(w), _) => (w, true),
                (None, Some(w)) => (w, false),
                (None, None) => return Ok(len.saturating_sub(n_out)),
            };
            match side.0.next() {
                Some(r) => {
                    r?;
                    n_out += 1;
                    break;
                }
                None if side.1 => below = None,
                None => above = None,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Writes

fn score_of(tx: &mut Tx<'_, '_, '_>, id: u64, member: &[u8]) -> Result<Option<f64>, StoreError> {
    if member.len() > MAX_SUB {
        return Ok(None);
    }
    match tx.elem_get(id, member)? {
        None => Ok(None),
        Some(v) => score_from(&v).map(Some).ok_or_else(corrupt),
    }
}

fn put_member(
    tx: &mut Tx<'_, '_, '_>,
    coll: &CollMeta,
    member: &[u8],
    score: f64,
) -> Result<(), StoreError> {
    tx.elem_put(coll.id, member, &score_bytes(score))?;
    let (store, txn) = tx.store_txn();
    let ix = ix_key(coll.id, score_key(score), member);
    store.zscore.put(txn, &ix, &[])?;
    if coll.head == RANKED {
        zrank::inserted(&store.zscore, txn, coll.id, &ix)?;
    }
    Ok(())
}

fn del_member(
    tx: &mut Tx<'_, '_, '_>,
    coll: &CollMeta,
    member: &[u8],
    score: f64,
) -> Result<(), StoreError> {
    tx.elem_del(coll.id, member)?;
    let (store, txn) = tx.store_txn();
    let ix = ix_key(coll.id, score_key(score), member);
    if store.zscore.delete(txn, &ix)? && coll.head == RANKED {
        zrank::removed(&store.zscore, txn, coll.id, &ix)?;
    }
    Ok(())
}

/// The sorted set under `key` for a write, with its rank directory: a set stored by a memkeep
/// that kept none gets one now (`zrank::build`), saved with its metadata at once.
fn find_ranked(tx: &mut Tx<'_, '_, '_>, key: &[u8]) -> Result<Found, StoreError> {
    let found = tx.find(key, Kind::ZSet)?;
    let Found::Coll(meta, mut coll) = found else {
        return Ok(found);
    };
    if coll.head != RANKED {
        let (store, txn) = tx.store_txn();
        zrank::build(&store.zscore, txn, coll.id)?;
        coll.head = RANKED;
        tx.save(key, &meta, &coll)?;
        return Ok(Found::Coll(meta, coll));
    }
    Ok(found)
}

/// A new, empty sorted set (its directory kept from the start).
fn create(tx: &mut Tx<'_, '_, '_>) -> Result<(ItemMeta, CollMeta), StoreError> {
    let (meta, mut coll) = tx.create(Kind::ZSet)?;
    coll.head = RANKED;
    Ok((meta, coll))
}

/// Fills `coll`, a new sorted set with no members yet, with these distinct members (RESTORE,
/// the STORE forms), and builds its rank directory once at the end.
pub(crate) fn fill(
    tx: &mut Tx<'_, '_, '_>,
    coll: &mut CollMeta,
    pairs: &[(Vec<u8>, f64)],
) -> Result<(), StoreError> {
    for (m, s) in pairs {
        tx.elem_put(coll.id, m, &score_bytes(*s))?;
        let (store, txn) = tx.store_txn();
        store
            .zscore
            .put(txn, &ix_key(coll.id, score_key(*s), m), &[])?;
    }
    let (store, txn) = tx.store_txn();
    zrank::build(&store.zscore, txn, coll.id)?;
    coll.head = RANKED;
    coll.len = pairs.len() as u64;
    Ok(())
}

/// Up to `take` (member, score) of the index within `bounds`, after skipping `skip`.
fn collect_ix(
    tx: &mut Tx<'_, '_, '_>,
    bounds: &KeyBounds,
    rev: bool,
    skip: u64,
    take: u64,
) -> Result<Vec<(Vec<u8>, f64)>, StoreError> {
    let (store, txn) = tx.store_txn();
    let mut found = Vec::new();
    for r in walk(&store.zscore, txn, bounds, rev)?
        .skip(skip as usize)
        .take(take as usize)
    {
        let (k, _) = r?;
        let (m, s) = ix_entry(k)?;
        found.push((m.to_vec(), s));
    }
    Ok(found)
}

/// Runs a sorted-set write in the writer's transaction.
pub fn apply(w: &mut LmdbWrite<'_, '_>, op: &ZSetOp, now: u64) -> Result<Outcome, StoreError> {
    let mut tx = Tx { w, now };
    match op {
        ZSetOp::Add { key, flags, pairs } => add(&mut tx, key, *flags, pairs),
        ZSetOp::Rem { key, members } => {
            let (meta, mut coll) = match find_ranked(&mut tx, key)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Int(0)),
                Found::Coll(m, c) => (m, c),
            };
            let mut removed = 0;
            for m in members {
                if let Some(s) = score_of(&mut tx, coll.id, m)? {
                    del_member(&mut tx, &coll, m, s)?;
                    coll.len -= 1;
                    removed += 1;
                }
            }
            if removed > 0 {
                tx.save(key, &meta, &coll)?;
            }
            Ok(Outcome::Int(removed))
        }
        ZSetOp::RemRange { key, by } => {
            let (meta, mut coll) = match find_ranked(&mut tx, key)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Int(0)),
                Found::Coll(m, c) => (m, c),
            };
            let id = coll.id;
            let victims = match by {
                RangeBy::Rank(start, stop) => match clamp_range(*start, *stop, coll.len) {
                    None => Vec::new(),
                    Some((s, e)) if coll.head == RANKED => {
                        let (store, txn) = tx.store_txn();
                        let first = zrank::key_at(&store.zscore, txn, id, coll.len, s)?;
                        let from = (Bound::Included(first), prefix_end(id));
                        collect_ix(&mut tx, &from, false, 0, e - s + 1)?
                    }
                    Some((s, e)) => {
                        let k = e - s + 1;
                        // Walk from the nearer end.
                        if s <= coll.len - 1 - e {
                            collect_ix(&mut tx, &whole(id), false, s, k)?
                        } else {
                            collect_ix(&mut tx, &whole(id), true, coll.len - 1 - e, k)?
                        }
                    }
                },
                RangeBy::Score(r) => match r.bounds(id) {
                    None => Vec::new(),
                    Some(b) => collect_ix(&mut tx, &b, false, 0, u64::MAX)?,
                },
                RangeBy::Lex(r) => match r.bounds(id) {
                    None => Vec::new(),
                    Some(b) => {
                        let (store, txn) = tx.store_txn();
                        let mut found = Vec::new();
                        for e in walk(&store.elems, txn, &b, false)? {
                            let (k, v) = e?;
                            let (m, s) = elem_entry(k, v)?;
                            found.push((m.to_vec(), s));
                        }
                        found
                    }
                },
            };
            for (m, s) in &victims {
                del_member(&mut tx, &coll, m, *s)?;
            }
            coll.len = coll.len.saturating_sub(victims.len() as u64);
            if !victims.is_empty() {
                tx.save(key, &meta, &coll)?;
            }
            Ok(Outcome::Int(victims.len() as i64))
        }
        ZSetOp::Store {
            dst,
            how,
            keys,
            weights,
            agg,
            deferred,
        } => super::zcombine::store(&mut tx, dst, *how, keys, weights, *agg, *deferred),
        ZSetOp::RangeStore { dst, src, range } => {
            let c = match tx.find(src, Kind::ZSet)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => None,
                Found::Coll(_, c) => Some(c),
            };
            let mut picked = Vec::new();
            if let Some(c) = c {
                let (store, txn) = tx.store_txn();
                range_each(&store.zscore, &store.elems, txn, c, range, |m, s| {
                    picked.push((m.to_vec(), s))
                })?;
            }
            replace_with(&mut tx, dst, &picked)
        }
        ZSetOp::Pop { key, max, count } => {
            let (meta, mut coll) = match find_ranked(&mut tx, key)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => return Ok(Outcome::Array(Vec::new())),
                Found::Coll(m, c) => (m, c),
            };
            let n = count.unwrap_or(1).min(coll.len);
            let popped = collect_ix(&mut tx, &whole(coll.id), *max, 0, n)?;
            let mut pairs = Vec::with_capacity(popped.len());
            for (m, s) in popped {
                del_member(&mut tx, &coll, &m, s)?;
                coll.len -= 1;
                pairs.push((Outcome::Bulk(m), Outcome::Double(s)));
            }
            if !pairs.is_empty() {
                tx.save(key, &meta, &coll)?;
            }
            // Redis 7: with a count, RESP3 nests each pair; without one, the reply is flat.
            Ok(match count {
                Some(_) => Outcome::Pairs(pairs),
                None => Outcome::Array(pairs.into_iter().flat_map(|(m, s)| [m, s]).collect()),
            })
        }
    }
}

/// Replaces whatever `dst` holds by a new sorted set of `members` (distinct), or deletes it
/// when there are none; answers their count. The index goes in first and the rank directory is
/// built from it in one pass (`zrank::build`), cheaper than keeping it entry by entry.
pub(super) fn replace_with(
    tx: &mut Tx<'_, '_, '_>,
    dst: &[u8],
    members: &[(Vec<u8>, f64)],
) -> Result<Outcome, StoreError> {
    if members.is_empty() {
        tx.w.delete(dst)?;
        return Ok(Outcome::Int(0));
    }
    // A new collection: whatever `dst` held goes to the collector when its metadata is
    // overwritten (a source named as the destination was read in full already).
    let (meta, mut coll) = tx.create(Kind::ZSet)?;
    fill(tx, &mut coll, members)?;
    tx.save(dst, &meta, &coll)?;
    Ok(Outcome::Int(coll.len as i64))
}

/// ZADD (and ZINCRBY): Redis's `zsetAdd` per pair.
fn add(
    tx: &mut Tx<'_, '_, '_>,
    key: &[u8],
    f: AddFlags,
    pairs: &[(f64, Vec<u8>)],
) -> Result<Outcome, StoreError> {
    let (meta, mut coll) = match find_ranked(tx, key)? {
        Found::WrongType => return Ok(Outcome::WrongType),
        Found::Missing if f.xx => {
            return Ok(if f.incr {
                Outcome::Nil
            } else {
                Outcome::Int(0)
            });
        }
        Found::Missing => create(tx)?,
        Found::Coll(m, c) => (m, c),
    };
    let (mut added, mut updated, mut processed) = (0i64, 0i64, 0i64);
    let mut last = 0.0;
    let mut failed = None;
    for (score, member) in pairs {
        let mut score = *score;
        match score_of(tx, coll.id, member)? {
            Some(cur) => {
                if f.nx {
                    continue;
                }
                if f.incr {
                    score += cur;
                    if score.is_nan() {
                        failed = Some(NAN_SCORE);
                        break;
                    }
                }
                if (f.lt && score >= cur) || (f.gt && score <= cur) {
                    continue;
                }
                processed += 1;
                last = score;
                if score != cur {
                    del_member(tx, &coll, member, cur)?;
                    put_member(tx, &coll, member, score)?;
                    updated += 1;
                }
            }
            None if f.xx => {}
            None => {
                put_member(tx, &coll, member, score)?;
                coll.len += 1;
                added += 1;
                processed += 1;
                last = score;
            }
        }
    }
    if added + updated > 0 {
        tx.save(key, &meta, &coll)?;
    }
    if let Some(msg) = failed {
        return Ok(Outcome::Err(msg));
    }
    Ok(if f.incr {
        if processed > 0 {
            Outcome::Double(if last == 0.0 { 0.0 } else { last })
        } else {
            Outcome::Nil
        }
    } else if f.ch {
        Outcome::Int(added + updated)
    } else {
        Outcome::Int(added)
    })
}

// ---------------------------------------------------------------------------------------------
// Reads

pub fn read_score(cx: &ReadCx<'_, '_>, id: u64, member: &[u8]) -> Result<Option<f64>, StoreError> {
    if member.len() > MAX_SUB {
        return Ok(None);
    }
    match cx.store.elems.get(cx.txn, &elem_key(id, member))? {
        None => Ok(None),
        Some(v) => score_from(v).map(Some).ok_or_else(corrupt),
    }
}

/// The rank of `member`: from the rank directory, or (a set without one) walking from both
/// ends at once, O(min(rank, n - rank)).
pub fn rank(cx: &ReadCx<'_, '_>, c: CollMeta, member: &[u8]) -> Result<Option<u64>, StoreError> {
    let Some(score) = read_score(cx, c.id, member)? else {
        return Ok(None);
    };
    let target = ix_key(c.id, score_key(score), member);
    if c.head == RANKED {
        return zrank::below(&cx.store.zscore, cx.txn, c.id, c.len, &target).map(Some);
    }
    let before = (
        Bound::Included(c.id.to_be_bytes().to_vec()),
        Bound::Excluded(target.clone()),
    );
    let after = (Bound::Excluded(target), prefix_end(c.id));
    let mut fwd = walk(&cx.store.zscore, cx.txn, &before, false)?;
    let mut bwd = walk(&cx.store.zscore, cx.txn, &after, true)?;
    let (mut n_before, mut n_after) = (0u64, 0u64);
    loop {
        match fwd.next() {
            None => return Ok(Some(n_before)),
            Some(r) => {
                r?;
                n_before += 1;
            }
        }
        match bwd.next() {
            None => return Ok(Some(c.len.saturating_sub(1 + n_after))),
            Some(r) => {
                r?;
                n_after += 1;
            }
        }
    }
}

/// ZCOUNT from the rank directory: the entries below the range's end less those below its
/// start (a score range's bounds are `Included(id ++ lo)` and `Excluded(id ++ hi + 1)` or the
/// set's end).
pub fn count_ranked(cx: &ReadCx<'_, '_>, c: CollMeta, b: &KeyBounds) -> Result<u64, StoreError> {
    let below = |k: &[u8]| zrank::below(&cx.store.zscore, cx.txn, c.id, c.len, k);
    let hi = match &b.1 {
        Bound::Excluded(k) if k.len() > 8 => below(k)?,
        _ => c.len,
    };
    let lo = match &b.0 {
        Bound::Included(k) if k.len() > 8 => below(k)?,
        _ => 0,
    };
    Ok(hi.saturating_sub(lo))
}

/// Calls `each(member, score)` for the members `spec` selects from sorted set `c`, in the
/// reply's order (ZRANGE's reads and ZRANGESTORE's write alike).
pub fn range_each<'t>(
    zscore: &Database<Bytes, Bytes>,
    elems: &Database<Bytes, Bytes>,
    txn: &'t RoTxn<'_>,
    c: CollMeta,
    spec: &RangeSpec,
    each: impl FnMut(&'t [u8], f64),
) -> Result<(), StoreError> {
    match &spec.query {
        RangeQuery::Rank(start, stop) => rank_each(zscore, txn, c, *start, *stop, spec.rev, each),
        RangeQuery::Score(r) => match r.bounds(c.id) {
            None => Ok(()),
            Some(b) => walk_each(zscore, txn, &b, spec, false, each),
        },
        RangeQuery::Lex(r) => match r.bounds(c.id) {
            None => Ok(()),
            Some(b) => walk_each(elems, txn, &b, spec, true, each),
        },
    }
}

/// By rank: from the rank directory, a seek to the first rank replied, then a walk; a set
/// without one walks from the nearer end of the index (replying in reverse when that is the
/// far end of the reply).
fn rank_each<'t>(
    zscore: &Database<Bytes, Bytes>,
    txn: &'t RoTxn<'_>,
    c: CollMeta,
    start: i64,
    stop: i64,
    rev: bool,
    mut each: impl FnMut(&'t [u8], f64),
) -> Result<(), StoreError> {
    let Some((s, e)) = clamp_range(start, stop, c.len) else {
        return Ok(());
    };
    let k = (e - s + 1) as usize;
    let from_far_end = c.len - 1 - e;
    if c.head == RANKED {
        // Seek to the first rank replied (counted from the reply's end), then walk.
        let first = if rev { c.len - 1 - s } else { s };
        let at = zrank::key_at(zscore, txn, c.id, c.len, first)?;
        let from = if rev {
            (
                Bound::Included(c.id.to_be_bytes().to_vec()),
                Bound::Included(at),
            )
        } else {
            (Bound::Included(at), prefix_end(c.id))
        };
        for r in walk(zscore, txn, &from, rev)?.take(k) {
            let (m, score) = ix_entry(r?.0)?;
            each(m, score);
        }
    } else if s <= from_far_end {
        for r in walk(zscore, txn, &whole(c.id), rev)?
            .skip(s as usize)
            .take(k)
        {
            let (m, score) = ix_entry(r?.0)?;
            each(m, score);
        }
    } else {
        let mut got: Vec<(&[u8], f64)> = Vec::with_capacity(k);
        for r in walk(zscore, txn, &whole(c.id), !rev)?
            .skip(from_far_end as usize)
            .take(k)
        {
            got.push(ix_entry(r?.0)?);
        }
        for (m, score) in got.into_iter().rev() {
            each(m, score);
        }
    }
    Ok(())
}

/// A BYSCORE or BYLEX range: one seek, then `offset` skipped and up to `limit` (< 0: all)
/// given. A negative offset gives nothing, as in Redis.
fn walk_each<'t>(
    db: &Database<Bytes, Bytes>,
    txn: &'t RoTxn<'_>,
    bounds: &KeyBounds,
    spec: &RangeSpec,
    elems: bool,
    mut each: impl FnMut(&'t [u8], f64),
) -> Result<(), StoreError> {
    if spec.offset < 0 {
        return Ok(());
    }
    let take = usize::try_from(spec.limit).unwrap_or(usize::MAX);
    let it = walk(db, txn, bounds, spec.rev)?;
    for r in it.skip(spec.offset as usize).take(take) {
        let (k, v) = r?;
        let (m, score) = if elems {
            elem_entry(k, v)?
        } else {
            ix_entry(k)?
        };
        each(m, score);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Random picks (ZRANDMEMBER)

/// Sets above this size with the rank directory are drawn from by rank when the count asks
/// for less than 1/`SPARSE` of them: exactly uniform, each pick about n/380 + 128 cursor
/// steps. Otherwise one walk (exactly uniform too, `hash::sample_*`).
const SMALL: u64 = 4096;
const SPARSE: u64 = 256;

/// Random members of sorted set `c` (non-empty), each passed to `each(member, score)` until it
/// returns false: `count` of them, repeats allowed (`repeats`), else `count` distinct ones
/// (all of them, highest score first as Redis, when `count` >= its length). Memory: O(count) for the
/// distinct picks (count < length), O(1) beyond the reply for repeats drawn by rank; a walk's
/// repeats keep `count` borrowed members.
pub fn random_members(
    zscore: &Database<Bytes, Bytes>,
    elems: Database<Bytes, Bytes>,
    txn: &RoTxn<'_>,
    c: &CollMeta,
    count: u64,
    repeats: bool,
    mut each: impl FnMut(&[u8], f64) -> bool,
) -> Result<(), StoreError> {
    if c.len == 0 || count == 0 {
        return Ok(());
    }
    if !repeats && count >= c.len {
        // Redis 7.0 answers the whole set as ZREVRANGE does (its iterator starts at the tail).
        for r in walk(zscore, txn, &whole(c.id), true)? {
            let (m, s) = ix_entry(r?.0)?;
            if !each(m, s) {
                break;
            }
        }
        return Ok(());
    }
    let by_rank = c.head == RANKED && c.len > SMALL && count.saturating_mul(SPARSE) < c.len;
    if by_rank {
        let mut at_rank = |r: u64| -> Result<bool, StoreError> {
            let k = zrank::key_at(zscore, txn, c.id, c.len, r)?;
            let (m, s) = ix_entry(&k)?;
            Ok(each(m, s))
        };
        if repeats {
            for _ in 0..count {
                if !at_rank(random_u64() % c.len)? {
                    break;
                }
            }
        } else {
            // count < len / 256: a drawn rank repeats rarely.
            let mut seen = std::collections::HashSet::with_capacity(count as usize);
            while (seen.len() as u64) < count {
                let r = random_u64() % c.len;
                if seen.insert(r) && !at_rank(r)? {
                    break;
                }
            }
        }
        return Ok(());
    }
    let mut failed = None;
    let mut give = |m: &[u8], v: &[u8]| match score_from(v) {
        Some(s) => each(m, s),
        None => {
            failed = Some(corrupt());
            false
        }
    };
    if repeats {
        sample_repeats(elems, txn, c, count, give)?;
    } else {
        for (m, v) in sample_distinct(elems, txn, c, count)? {
            if !give(m, v) {
                break;
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::WriteView;
    use crate::storage::lmdb::{LmdbStore, ZRANK_DIR};

    /// The sorted set under `key` as the store holds it.
    fn coll_of(store: &LmdbStore, txn: &RoTxn, key: &[u8]) -> (ItemMeta, CollMeta) {
        let bytes = store.items.get(txn, key).expect("get").expect("present");
        let it = crate::storage::item::decode(bytes).expect("decode");
        (it.meta, CollMeta::decode(it.value).expect("meta"))
    }

    #[test]
    fn a_set_without_a_rank_directory_gets_one_at_its_first_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = LmdbStore::open(dir.path(), 64 << 20, 16).expect("open");
        let mut cas = 1;
        let mut txn = store.write_txn().expect("txn");
        let add = |n: std::ops::Range<u32>| ZSetOp::Add {
            key: b"z".to_vec(),
            flags: AddFlags::default(),
            pairs: n
                .map(|i| (f64::from(i % 97), format!("m{i}").into_bytes()))
                .collect(),
        };
        apply(&mut store.writer(&mut txn, &mut cas), &add(0..700), 0).expect("zadd");
        let (meta, mut coll) = coll_of(&store, &txn, b"z");
        assert_eq!((coll.len, coll.head), (700, RANKED));
        // Make it a set an older memkeep wrote: no directory, head 0.
        let dir_prefix = (coll.id | ZRANK_DIR).to_be_bytes();
        let records: Vec<Vec<u8>> = store
            .zscore
            .prefix_iter(&txn, &dir_prefix[..])
            .expect("iter")
            .map(|r| r.expect("record").0.to_vec())
            .collect();
        assert!(records.len() >= 3, "{} chunks", records.len());
        for k in records {
            store.zscore.delete(&mut txn, &k).expect("delete");
        }
        coll.head = 0;
        store
            .writer(&mut txn, &mut cas)
            .put(b"z", &meta, &[&coll.encode()])
            .expect("put");
        // A write that changes nothing still builds the directory, and later writes keep it.
        let none = ZSetOp::Rem {
            key: b"z".to_vec(),
            members: vec![b"absent".to_vec()],
        };
        apply(&mut store.writer(&mut txn, &mut cas), &none, 0).expect("zrem");
        let (_, coll) = coll_of(&store, &txn, b"z");
        assert_eq!((coll.len, coll.head), (700, RANKED));
        assert_eq!(
            zrank::verify(&store.zscore, &txn, coll.id, 700).expect("verify"),
            Vec::<String>::new()
        );
        apply(&mut store.writer(&mut txn, &mut cas), &add(650..900), 0).expect("zadd");
        let by_rank = ZSetOp::RemRange {
            key: b"z".to_vec(),
            by: RangeBy::Rank(100, 399),
        };
        let out =
            apply(&mut store.writer(&mut txn, &mut cas), &by_rank, 0).expect("zremrangebyrank");
        assert_eq!(out, Outcome::Int(300));
        let (_, coll) = coll_of(&store, &txn, b"z");
        assert_eq!(coll.len, 600);
        assert_eq!(
            zrank::verify(&store.zscore, &txn, coll.id, 600).expect("verify"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn score_keys_keep_numeric_order() {
        let xs = [
            f64::NEG_INFINITY,
            -1e300,
            -2.0,
            -1.5,
            -5e-324,
            0.0,
            5e-324,
            0.1,
            1.0,
            2.0,
            1e300,
            f64::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(score_key(w[0]) < score_key(w[1]), "{} < {}", w[0], w[1]);
        }
        for &x in &xs {
            assert_eq!(key_score(score_key(x)), x);
        }
        assert_eq!(score_key(-0.0), score_key(0.0));
        assert!(key_score(score_key(-0.0)).is_sign_positive());
    }
}
