//! Hashes: one element record per field, `id ++ field -> value`, so fields come back in byte
//! order (Redis's order is its own and unspecified). HSET/HGET/HDEL/HEXISTS are O(log n) per
//! field, HLEN is O(1) (the metadata's count), HGETALL/HKEYS/HVALS are one cursor walk.
//!
//! Fields are at most `MAX_SUB` (495) bytes: LMDB keys are short and the element key carries
//! the collection id. A longer field in a write answers `ERR memkeep: field longer than 495
//! bytes`; in a read it is simply absent.
//!
//! Also here, shared with sets (and usable by sorted sets): the element walk and the random
//! picks behind HRANDFIELD/SRANDMEMBER/SPOP (`Picker`: O(log n) seeks per pick, biased, used
//! for a few picks from a large collection; exact sampling by one walk otherwise). The
//! commands' parsing and replies are `crate::commands::hash`'s.

use std::collections::HashSet;
use std::ops::Bound;

use heed::types::Bytes;
use heed::{Database, RoTxn};

use super::{CollMeta, Found, MAX_SUB, Tx, elem_key, random_u64};
use crate::float;
use crate::int::parse_i64;
use crate::outcome::Outcome;
use crate::storage::lmdb::{LmdbStore, LmdbWrite};
use crate::storage::{Kind, StoreError};

#[derive(Debug, Clone, PartialEq)]
pub enum HashOp {
    /// HSET (answers how many fields are new), HMSET (`nx` false, answers +OK), HSETNX (one
    /// pair, `nx`: only if the field is absent).
    Set {
        key: Vec<u8>,
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        nx: bool,
        ok: bool,
    },
    Del {
        key: Vec<u8>,
        fields: Vec<Vec<u8>>,
    },
    IncrBy {
        key: Vec<u8>,
        field: Vec<u8>,
        delta: i64,
    },
    IncrByFloat {
        key: Vec<u8>,
        field: Vec<u8>,
        /// The increment's text, checked finite (`float`).
        delta: Vec<u8>,
    },
}

/// Whether element `sub` of collection `id` exists (no copy of its value).
fn has(tx: &mut Tx<'_, '_, '_>, id: u64, sub: &[u8]) -> Result<bool, StoreError> {
    if sub.len() > MAX_SUB {
        return Ok(false);
    }
    let (store, txn) = tx.store_txn();
    Ok(store.elems.get(txn, &elem_key(id, sub))?.is_some())
}

/// Runs a hash write in the writer's transaction.
pub fn apply(w: &mut LmdbWrite<'_, '_>, op: &HashOp, now: u64) -> Result<Outcome, StoreError> {
    let mut tx = Tx { w, now };
    match op {
        HashOp::Set { key, pairs, nx, ok } => {
            let (meta, mut coll) = match tx.find(key, Kind::Hash)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => tx.create(Kind::Hash)?,
                Found::Coll(m, c) => (m, c),
            };
            let mut added = 0;
            for (field, value) in pairs {
                if has(&mut tx, coll.id, field)? {
                    if *nx {
                        continue;
                    }
                } else {
                    added += 1;
                }
                tx.elem_put(coll.id, field, value)?;
            }
            if *nx && added == 0 {
                return Ok(Outcome::Int(0));
            }
            coll.len += added;
            tx.save(key, &meta, &coll)?;
            Ok(if *ok {
                Outcome::Done
            } else {
                Outcome::Int(added as i64)
            })
        }
        HashOp::Del { key, fields } => tx.remove_subs(key, Kind::Hash, fields),
        HashOp::IncrBy { key, field, delta } => {
            let (meta, mut coll) = match tx.find(key, Kind::Hash)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => tx.create(Kind::Hash)?,
                Found::Coll(m, c) => (m, c),
            };
            let old = match tx.elem_get(coll.id, field)? {
                Some(v) => match parse_i64(&v) {
                    Some(n) => n,
                    None => return Ok(Outcome::Err("ERR hash value is not an integer")),
                },
                None => {
                    coll.len += 1;
                    0
                }
            };
            let Some(new) = old.checked_add(*delta) else {
                return Ok(Outcome::Err("ERR increment or decrement would overflow"));
            };
            tx.elem_put(coll.id, field, itoa::Buffer::new().format(new).as_bytes())?;
            tx.save(key, &meta, &coll)?;
            Ok(Outcome::Int(new))
        }
        HashOp::IncrByFloat { key, field, delta } => {
            let (meta, mut coll) = match tx.find(key, Kind::Hash)? {
                Found::WrongType => return Ok(Outcome::WrongType),
                Found::Missing => tx.create(Kind::Hash)?,
                Found::Coll(m, c) => (m, c),
            };
            let old = match tx.elem_get(coll.id, field)? {
                Some(v) => v,
                None => {
                    coll.len += 1;
                    b"0".to_vec()
                }
            };
            let text = match float::add(&old, delta) {
                Ok(text) => text,
                Err(float::AddError::NotFinite) => {
                    return Ok(Outcome::Err("ERR increment would produce NaN or Infinity"));
                }
                Err(float::AddError::TooLong) => {
                    return Ok(Outcome::Err("ERR value is not a valid float"));
                }
                Err(_) => return Ok(Outcome::Err("ERR hash value is not a float")),
            };
            tx.elem_put(coll.id, field, &text)?;
            tx.save(key, &meta, &coll)?;
            Ok(Outcome::Bulk(text))
        }
    }
}

/// Calls `each(sub-key, value)` for every element of `coll` in order, straight from the map;
/// damage when the count disagrees with the metadata.
pub(crate) fn walk<'t>(
    store: &LmdbStore,
    txn: &'t RoTxn,
    coll: &CollMeta,
    mut each: impl FnMut(&'t [u8], &'t [u8]),
) -> Result<(), StoreError> {
    let iter = store.elems.prefix_iter(txn, &coll.id.to_be_bytes()[..])?;
    let mut n = 0u64;
    for r in iter {
        let (k, v) = r?;
        each(&k[8..], v);
        n += 1;
    }
    if n == coll.len {
        Ok(())
    } else {
        Err(StoreError::damaged("collection elements missing"))
    }
}

/// The walk of HSCAN, SSCAN and ZSCAN: up to `count` elements (sub-key, value) of `coll`
/// after the sub-key `after` (from the first when None), in order; the last sub-key given
/// when elements follow it (where the next call resumes), else None.
pub(crate) fn scan<'t>(
    elems: &Database<Bytes, Bytes>,
    txn: &'t RoTxn,
    coll: &CollMeta,
    after: Option<&[u8]>,
    count: usize,
    mut each: impl FnMut(&'t [u8], &'t [u8]),
) -> Result<Option<&'t [u8]>, StoreError> {
    let prefix = coll.id.to_be_bytes();
    let lo = match after {
        Some(sub) => elem_key(coll.id, sub),
        None => prefix.to_vec(),
    };
    let range = (
        if after.is_some() {
            Bound::Excluded(&lo[..])
        } else {
            Bound::Included(&lo[..])
        },
        Bound::Unbounded,
    );
    let mut last = None;
    for (examined, entry) in elems.range(txn, &range)?.enumerate() {
        let (k, v) = entry?;
        if !k.starts_with(&prefix) {
            break;
        }
        if examined == count {
            return Ok(last);
        }
        let sub = &k[8..];
        last = Some(sub);
        each(sub, v);
    }
    Ok(None)
}

// ---------------------------------------------------------------------------------------------
// Random picks (HRANDFIELD, SRANDMEMBER, SPOP)

/// Collections up to this size are sampled exactly (a walk: at most 4,096 cursor steps, as
/// RANDOMKEY's); larger ones use `Picker` only for counts below 1/`SPARSE` of their size,
/// where seeks beat one walk of the whole.
const SMALL: u64 = 4096;
const SPARSE: u64 = 256;

/// Whether `count` picks from `coll` should seek (`Picker`) rather than walk it.
fn sparse(coll: &CollMeta, count: u64) -> bool {
    coll.len > SMALL && count.saturating_mul(SPARSE) < coll.len
}

/// How many consecutive elements after a random seek a `Picker` draws its pick from.
pub(crate) const WINDOW: usize = 64;

/// How many draws a `descend` level makes to even out gaps between bytes before it settles.
const TRIES: usize = 64;

/// An element borrowed from the map: (sub-key, value).
pub(crate) type Elem<'t> = (&'t [u8], &'t [u8]);

/// A collection's elements in order, straight from the map: (sub-key, value).
pub(crate) fn elements<'t>(
    db: Database<Bytes, Bytes>,
    txn: &'t RoTxn,
    id: u64,
) -> Result<impl Iterator<Item = Result<Elem<'t>, StoreError>> + 't, StoreError> {
    Ok(db
        .prefix_iter(txn, &id.to_be_bytes()[..])?
        .map(|r| r.map(|(k, v)| (&k[8..], v)).map_err(StoreError::from)))
}

/// A random index below `n` (n > 0).
fn below(n: u64) -> u64 {
    random_u64() % n
}

/// The smallest key greater than every key starting with `prefix` (None: there is none).
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut s = prefix.to_vec();
    while s.last() == Some(&0xff) {
        s.pop();
    }
    let last = s.last_mut()?;
    *last += 1;
    Some(s)
}

/// Random elements of one large collection without reading it: a pick walks down the byte
/// trie of its sub-keys to a start (`descend`: each branch of a level equally likely), then
/// returns one of the `WINDOW` elements from the start on (wrapping to the first), drawn
/// uniformly. The window spreads what a branch gets over its 64 neighbours, so sub-keys of
/// one shape (`user:00001`.., ids, hashes) come out close to uniform; sub-keys of unequal
/// shapes do not (a lone `a` beside 10,000 `b:` members: `a` gets 1/128 of the draws and
/// the 63 members after it share half). Exactness would need counts LMDB does not keep: small
/// collections and counts that ask for more than a small share of one read it instead,
/// exactly uniform (`sample_distinct`, `sample_repeats`, `pick_one`). Cost: a seek per trie
/// level and at most 2 x `WINDOW` cursor steps.
pub(crate) struct Picker {
    prefix: [u8; 8],
}

impl Picker {
    /// None when the collection has no elements.
    pub(crate) fn new(
        db: Database<Bytes, Bytes>,
        txn: &RoTxn,
        id: u64,
    ) -> Result<Option<Picker>, StoreError> {
        let prefix = id.to_be_bytes();
        Ok(match db.get_greater_than_or_equal_to(txn, &prefix[..])? {
            Some((k, _)) if k.starts_with(&prefix) => Some(Picker { prefix }),
            _ => None,
        })
    }

    /// One random element: (sub-key, value).
    pub(crate) fn pick<'t>(
        &self,
        db: Database<Bytes, Bytes>,
        txn: &'t RoTxn,
    ) -> Result<Elem<'t>, StoreError> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let p = &self.prefix[..];
        let (start, _) = descend(db, txn, p)?;
        let mut window: Vec<Elem<'t>> = Vec::with_capacity(WINDOW);
        for r in db.range(txn, &(Included(start), Unbounded))? {
            let (k, v) = r?;
            if !k.starts_with(p) || window.len() == WINDOW {
                break;
            }
            window.push((&k[8..], v));
        }
        if window.len() < WINDOW {
            // Wrap around to the first elements (never reaching `start` again: a picker is
            // used only on collections larger than the window).
            for r in db.range(txn, &(Included(p), Excluded(start)))? {
                let (k, v) = r?;
                if !k.starts_with(p) || window.len() == WINDOW {
                    break;
                }
                window.push((&k[8..], v));
            }
        }
        match window.len() {
            0 => Err(StoreError::damaged("collection elements missing")),
            n => Ok(window[below(n as u64) as usize]),
        }
    }
}

/// A random record whose key starts with `prefix` (Err when there is none): a walk down the
/// byte trie of the keys. Where the keys under the current prefix diverge, it picks one of
/// the branches there (a next byte, or "stop" when a key ends at the prefix) and goes on
/// under it until one key is left; common prefixes are skipped in one step. A branch is drawn
/// as a random byte between the smallest and largest present plus a seek, and accepted with
/// chance 1/(gap to the byte present before it), which makes every branch of a level equally
/// likely (after `TRIES` draws the last one is kept). Every branch, whatever it holds: callers
/// even that out with a window of neighbours (`Picker`, RANDOMKEY).
pub(crate) fn descend<'t>(
    db: Database<Bytes, Bytes>,
    txn: &'t RoTxn,
    prefix: &[u8],
) -> Result<(&'t [u8], &'t [u8]), StoreError> {
    let gone = || StoreError::damaged("records missing under a random pick's prefix");
    // `p` is the prefix every candidate has; `first` the smallest key with it.
    let mut p = prefix.to_vec();
    // (LMDB refuses an empty key to seek to: the whole database starts at its first record.)
    let mut first = if p.is_empty() {
        db.first(txn)?
    } else {
        db.get_greater_than_or_equal_to(txn, &p)?
    }
    .filter(|(k, _)| k.starts_with(&p))
    .ok_or_else(gone)?;
    loop {
        let last = match successor(&p) {
            Some(end) => db.get_lower_than(txn, &end)?,
            None => db.last(txn)?,
        }
        .filter(|(k, _)| k.starts_with(&p))
        .ok_or_else(gone)?;
        if first.0 == last.0 {
            return Ok(first);
        }
        // first < last: they differ at `at`, where `last` has a byte and `first` may end.
        let at = first
            .0
            .iter()
            .zip(last.0)
            .take_while(|(a, b)| a == b)
            .count();
        p.clear();
        p.extend_from_slice(&first.0[..at]);
        let ends = first.0.len() == at;
        let lowest = if ends {
            db.get_greater_than(txn, first.0)?
                .filter(|(k, _)| k.starts_with(&p) && k.len() > at)
                .ok_or_else(gone)?
        } else {
            first
        };
        let (lo, hi) = (u64::from(lowest.0[at]), u64::from(last.0[at]));
        let mut chosen = None;
        for attempt in 0..TRIES {
            let r = below(hi - lo + 1 + u64::from(ends));
            if ends && r == 0 {
                return Ok(first);
            }
            p.push((lo + r - u64::from(ends)) as u8);
            let hit = db
                .get_greater_than_or_equal_to(txn, &p)?
                .filter(|(k, _)| k.starts_with(&p[..at]) && k.len() > at)
                .ok_or_else(gone)?;
            p.pop();
            let b = hit.0[at];
            let gap = if u64::from(b) == lo {
                1
            } else {
                p.push(b);
                let prev = db.get_lower_than(txn, &p)?;
                p.pop();
                match prev {
                    Some((k, _)) if k.starts_with(&p) && k.len() > at => u64::from(b - k[at]),
                    _ => 1,
                }
            };
            if attempt + 1 == TRIES || below(gap) == 0 {
                chosen = Some(hit);
                break;
            }
        }
        first = chosen.ok_or_else(gone)?;
        p.push(first.0[at]);
    }
}

/// One random element of `coll` (None when it has none): exactly uniform for small
/// collections, a `Picker` seek for larger ones.
pub(crate) fn pick_one<'t>(
    db: Database<Bytes, Bytes>,
    txn: &'t RoTxn,
    coll: &CollMeta,
) -> Result<Option<Elem<'t>>, StoreError> {
    if coll.len == 0 {
        return Ok(None);
    }
    if coll.len <= SMALL {
        return elements(db, txn, coll.id)?
            .nth(below(coll.len) as usize)
            .transpose();
    }
    match Picker::new(db, txn, coll.id)? {
        Some(p) => p.pick(db, txn).map(Some),
        None => Ok(None),
    }
}

/// `count` distinct random elements of `coll` (all of them when count >= its length).
pub(crate) fn sample_distinct<'t>(
    db: Database<Bytes, Bytes>,
    txn: &'t RoTxn,
    coll: &CollMeta,
    count: u64,
) -> Result<Vec<Elem<'t>>, StoreError> {
    if count >= coll.len {
        return elements(db, txn, coll.id)?.collect();
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    if sparse(coll, count)
        && let Some(picker) = Picker::new(db, txn, coll.id)?
    {
        // Random seeks, bounded: the bias may starve some elements, so fall back to the walk
        // below when the seeks keep hitting the same ones.
        let mut seen: HashSet<&[u8]> = HashSet::with_capacity(count as usize);
        let mut picked = Vec::with_capacity(count as usize);
        for _ in 0..count * 8 + 64 {
            let (sub, v) = picker.pick(db, txn)?;
            if seen.insert(sub) {
                picked.push((sub, v));
                if picked.len() as u64 == count {
                    return Ok(picked);
                }
            }
        }
    }
    // Reservoir sampling over one walk: uniform, O(n) time, O(count) memory.
    let k = count as usize;
    let mut res = Vec::with_capacity(k);
    for (i, e) in elements(db, txn, coll.id)?.enumerate() {
        let e = e?;
        if i < k {
            res.push(e);
        } else {
            let j = below(i as u64 + 1) as usize;
            if j < k {
                res[j] = e;
            }
        }
    }
    Ok(res)
}

/// `count` random elements of `coll` (non-empty), repeats allowed, each passed to `each` until
/// it returns false: seeks for a few picks from a large collection, otherwise one walk that
/// collects the elements at `count` random positions (uniform, O(n + count log count) time,
/// O(count) memory).
pub(crate) fn sample_repeats<'t>(
    db: Database<Bytes, Bytes>,
    txn: &'t RoTxn,
    coll: &CollMeta,
    count: u64,
    mut each: impl FnMut(&'t [u8], &'t [u8]) -> bool,
) -> Result<(), StoreError> {
    if sparse(coll, count)
        && let Some(picker) = Picker::new(db, txn, coll.id)?
    {
        for _ in 0..count {
            let (s, v) = picker.pick(db, txn)?;
            if !each(s, v) {
                break;
            }
        }
        return Ok(());
    }
    let mut ranks: Vec<u64> = (0..count).map(|_| below(coll.len.max(1))).collect();
    ranks.sort_unstable();
    let mut picked: Vec<Elem<'t>> = Vec::with_capacity(count as usize);
    let mut next = ranks.iter().peekable();
    for (i, e) in elements(db, txn, coll.id)?.enumerate() {
        if next.peek().is_none() {
            break;
        }
        let e = e?;
        while next.next_if(|&&r| r == i as u64).is_some() {
            picked.push(e);
        }
    }
    if picked.len() as u64 != count {
        return Err(StoreError::damaged("collection elements missing"));
    }
    // The walk collected them in order: shuffle (Fisher-Yates).
    for i in (1..picked.len()).rev() {
        picked.swap(i, below(i as u64 + 1) as usize);
    }
    for (s, v) in picked {
        if !each(s, v) {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successor_is_the_first_key_past_a_prefix() {
        assert_eq!(successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(successor(b"a\xff\xff"), Some(b"b".to_vec()));
        assert_eq!(successor(b"\xff"), None);
        assert_eq!(successor(b""), None);
    }
}
