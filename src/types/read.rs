//! The collections' reads as typed operations: typed arguments (indexes, score and lex ranges,
//! LIMIT, direction, counts) and typed results (elements, `(member, score)` pairs, scores,
//! ranks, counts), no reply encoding.
//!
//! `CollRead` is implemented twice: by `ReadCx` (LMDB: a worker's snapshot, or EXEC's and a
//! script's write transaction seen as a read one, so a transaction reads its own writes) and
//! by the in-memory model (`super::model::Model`), so a model-based test runs the same
//! operations on both and compares their results. `crate::commands` parses a command's
//! arguments into these calls and encodes what they give.
//!
//! A read first opens its key as a collection of one kind (`open`: missing, the wrong kind, or
//! a handle), then reads through the handle. Walks hand their elements to a callback,
//! borrowed from the store (LMDB's map, or the model), so a reply is encoded straight from
//! them with no copy. What is not here: the random picks (HRANDFIELD, SRANDMEMBER,
//! ZRANDMEMBER), which `commands` runs on `hash` and `zset` directly and no model can
//! reproduce.

use super::set::Combine;
use super::zcombine::{self, Aggregate};
use super::zset::{LexRange, RangeSpec, ScoreRange};
use super::{
    CollMeta, Found, FoundAny, MAX_SUB, ReadCx, clamp_range, elem_key, hash, list, set, zset,
};
use crate::storage::{Kind, StoreError};

/// Why `open` gives no collection.
#[derive(Debug)]
pub enum ReadError {
    /// The key holds a value of another kind.
    WrongType,
    Store(StoreError),
}

impl From<StoreError> for ReadError {
    fn from(e: StoreError) -> ReadError {
        ReadError::Store(e)
    }
}

/// LPOS's query: which match to start from (`rank`: 1 the first, -1 the last, never 0), how
/// many positions to give at most (`want`), and how many elements to look at (`maxlen`, 0:
/// all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PosQuery {
    pub rank: i64,
    pub want: usize,
    pub maxlen: u64,
}

/// One input of ZUNION, ZINTER, ZDIFF (and their STORE forms, ZINTERCARD): a set or a sorted
/// set (`coll` None: a missing key, an empty input; its `kind` then does not matter) and its
/// weight.
#[derive(Debug, Clone, Copy)]
pub struct ZInput<C> {
    pub kind: Kind,
    pub coll: Option<C>,
    pub weight: f64,
}

/// The typed reads of lists, hashes, sets and sorted sets. A missing key is not an error:
/// `open` answers None and the command answers as for an empty collection.
pub trait CollRead {
    /// An open collection.
    type Coll<'s>: Copy
    where
        Self: 's;

    /// The collection of `kind` under `key`: None when absent (or expired, or flushed).
    fn open(&self, key: &[u8], kind: Kind) -> Result<Option<Self::Coll<'_>>, ReadError>;

    /// Its element count.
    fn len(&self, c: Self::Coll<'_>) -> u64;

    /// The element count of the collection of `kind` under `key`, 0 when absent (LLEN, HLEN,
    /// SCARD, ZCARD). The same as `open` then `len`, but a store whose snapshot may lag behind
    /// a collection's elements while its metadata is current answers it anyway.
    fn count(&self, key: &[u8], kind: Kind) -> Result<u64, ReadError> {
        Ok(self.open(key, kind)?.map_or(0, |c| self.len(c)))
    }

    // Lists

    /// LINDEX: the element at `index` (negative from the end).
    fn lindex<'s>(&'s self, c: Self::Coll<'s>, index: i64) -> Result<Option<&'s [u8]>, StoreError>;

    /// LRANGE: the elements from `start` to `stop` (`clamp_range`'s rules), in order; as many
    /// as `clamp_range` says.
    fn lrange<'s>(
        &'s self,
        c: Self::Coll<'s>,
        start: i64,
        stop: i64,
        each: impl FnMut(&'s [u8]),
    ) -> Result<(), StoreError>;

    /// LPOS: the indexes of the elements equal to `target`, as `q` asks.
    fn lpos(&self, c: Self::Coll<'_>, target: &[u8], q: PosQuery) -> Result<Vec<u64>, StoreError>;

    // Hashes

    /// HGET: the value of `field`.
    fn hget<'s>(&'s self, c: Self::Coll<'s>, field: &[u8]) -> Result<Option<&'s [u8]>, StoreError>;

    /// HGETALL, HKEYS, HVALS: every (field, value), in field order; `len` of them.
    fn hwalk<'s>(
        &'s self,
        c: Self::Coll<'s>,
        each: impl FnMut(&'s [u8], &'s [u8]),
    ) -> Result<(), StoreError>;

    /// HSCAN: up to `count` (field, value) after `after` (from the first when None), in field
    /// order; the last field given when more follow (the cursor to resume after), else None.
    fn hscan<'s>(
        &'s self,
        c: Self::Coll<'s>,
        after: Option<&[u8]>,
        count: usize,
        each: impl FnMut(&'s [u8], &'s [u8]),
    ) -> Result<Option<&'s [u8]>, StoreError>;

    // Sets

    /// SISMEMBER.
    fn sismember(&self, c: Self::Coll<'_>, member: &[u8]) -> Result<bool, StoreError>;

    /// SMEMBERS: every member, in byte order; `len` of them.
    fn smembers<'s>(
        &'s self,
        c: Self::Coll<'s>,
        each: impl FnMut(&'s [u8]),
    ) -> Result<(), StoreError>;

    /// SSCAN: `hscan`'s walk over a set's members.
    fn sscan<'s>(
        &'s self,
        c: Self::Coll<'s>,
        after: Option<&[u8]>,
        count: usize,
        each: impl FnMut(&'s [u8]),
    ) -> Result<Option<&'s [u8]>, StoreError>;

    /// SINTER, SUNION, SDIFF (and SINTERCARD's count): the members of the sets' combination
    /// (None: a missing key, an empty set), in byte order, at most `limit` of them.
    fn scombine<'s>(
        &'s self,
        how: Combine,
        sets: &[Option<Self::Coll<'s>>],
        limit: usize,
    ) -> Result<Vec<&'s [u8]>, StoreError>;

    // Sorted sets

    /// ZSCORE, ZMSCORE.
    fn zscore(&self, c: Self::Coll<'_>, member: &[u8]) -> Result<Option<f64>, StoreError>;

    /// ZRANK: the member's rank from the lowest score (ZREVRANK is `len - 1 - rank`).
    fn zrank(&self, c: Self::Coll<'_>, member: &[u8]) -> Result<Option<u64>, StoreError>;

    /// ZCOUNT: the members whose scores are in `range`.
    fn zcount(&self, c: Self::Coll<'_>, range: &ScoreRange) -> Result<u64, StoreError>;

    /// ZLEXCOUNT: the members in `range`.
    fn zlexcount(&self, c: Self::Coll<'_>, range: &LexRange) -> Result<u64, StoreError>;

    /// ZRANGE in all its forms: each (member, score) `spec` selects, in the reply's order.
    fn zrange<'s>(
        &'s self,
        c: Self::Coll<'s>,
        spec: &RangeSpec,
        each: impl FnMut(&'s [u8], f64),
    ) -> Result<(), StoreError>;

    /// ZSCAN: `hscan`'s walk over a sorted set's (member, score), in member order.
    fn zscan<'s>(
        &'s self,
        c: Self::Coll<'s>,
        after: Option<&[u8]>,
        count: usize,
        each: impl FnMut(&'s [u8], f64),
    ) -> Result<Option<&'s [u8]>, StoreError>;

    /// An input of `zcombine`: the set or sorted set under `key`, and which it is.
    fn open_scored(&self, key: &[u8]) -> Result<Option<(Kind, Self::Coll<'_>)>, ReadError>;

    /// ZUNION, ZINTER, ZDIFF, ZINTERCARD: each (member, score) of the inputs' combination
    /// (Redis 7.0's arithmetic: `zcombine`), in member order for a union and in no given order
    /// otherwise, until `each` answers false.
    fn zcombine<'s>(
        &'s self,
        how: Combine,
        inputs: &[ZInput<Self::Coll<'s>>],
        agg: Aggregate,
        each: impl FnMut(&'s [u8], f64) -> bool,
    ) -> Result<(), StoreError>;
}

impl CollRead for ReadCx<'_, '_> {
    type Coll<'s>
        = CollMeta
    where
        Self: 's;

    fn open(&self, key: &[u8], kind: Kind) -> Result<Option<CollMeta>, ReadError> {
        match self.find(key, kind)? {
            Found::Missing => Ok(None),
            Found::WrongType => Err(ReadError::WrongType),
            Found::Coll(_, c) => Ok(Some(c)),
        }
    }

    fn len(&self, c: CollMeta) -> u64 {
        c.len
    }

    fn count(&self, key: &[u8], kind: Kind) -> Result<u64, ReadError> {
        // The count is in the metadata record, which the overlay holds current: no need to
        // send the read to the writer when the elements are being changed (`current`).
        match self.find_record(key, kind)? {
            Found::Missing => Ok(0),
            Found::WrongType => Err(ReadError::WrongType),
            Found::Coll(_, c) => Ok(c.len),
        }
    }

    fn lindex(&self, c: CollMeta, index: i64) -> Result<Option<&[u8]>, StoreError> {
        let i = if index < 0 {
            c.len as i64 + index
        } else {
            index
        };
        if i < 0 || i >= c.len as i64 {
            return Ok(None);
        }
        let k = elem_key(c.id, &list::pos(c.head + i));
        Ok(self.store.elems.get(self.txn, &k)?)
    }

    fn lrange<'s>(
        &'s self,
        c: CollMeta,
        start: i64,
        stop: i64,
        each: impl FnMut(&'s [u8]),
    ) -> Result<(), StoreError> {
        match clamp_range(start, stop, c.len) {
            None => Ok(()),
            Some(r) => list::range(&self.store.elems, self.txn, &c, r, each),
        }
    }

    fn lpos(&self, c: CollMeta, target: &[u8], q: PosQuery) -> Result<Vec<u64>, StoreError> {
        list::positions(&self.store.elems, self.txn, &c, target, q)
    }

    fn hget(&self, c: CollMeta, field: &[u8]) -> Result<Option<&[u8]>, StoreError> {
        if field.len() > MAX_SUB {
            return Ok(None);
        }
        Ok(self.store.elems.get(self.txn, &elem_key(c.id, field))?)
    }

    fn hwalk<'s>(
        &'s self,
        c: CollMeta,
        each: impl FnMut(&'s [u8], &'s [u8]),
    ) -> Result<(), StoreError> {
        hash::walk(self.store, self.txn, &c, each)
    }

    fn hscan<'s>(
        &'s self,
        c: CollMeta,
        after: Option<&[u8]>,
        count: usize,
        each: impl FnMut(&'s [u8], &'s [u8]),
    ) -> Result<Option<&'s [u8]>, StoreError> {
        hash::scan(&self.store.elems, self.txn, &c, after, count, each)
    }

    fn sismember(&self, c: CollMeta, member: &[u8]) -> Result<bool, StoreError> {
        set::contains(*self.store.elems, self.txn, c.id, member, &mut Vec::new())
    }

    fn smembers<'s>(
        &'s self,
        c: CollMeta,
        mut each: impl FnMut(&'s [u8]),
    ) -> Result<(), StoreError> {
        hash::walk(self.store, self.txn, &c, |m, _| each(m))
    }

    fn sscan<'s>(
        &'s self,
        c: CollMeta,
        after: Option<&[u8]>,
        count: usize,
        mut each: impl FnMut(&'s [u8]),
    ) -> Result<Option<&'s [u8]>, StoreError> {
        hash::scan(&self.store.elems, self.txn, &c, after, count, |m, _| {
            each(m)
        })
    }

    fn scombine<'s>(
        &'s self,
        how: Combine,
        sets: &[Option<CollMeta>],
        limit: usize,
    ) -> Result<Vec<&'s [u8]>, StoreError> {
        set::combine(*self.store.elems, self.txn, how, sets, limit)
    }

    fn zscore(&self, c: CollMeta, member: &[u8]) -> Result<Option<f64>, StoreError> {
        zset::read_score(self, c.id, member)
    }

    fn zrank(&self, c: CollMeta, member: &[u8]) -> Result<Option<u64>, StoreError> {
        zset::rank(self, c, member)
    }

    fn zcount(&self, c: CollMeta, range: &ScoreRange) -> Result<u64, StoreError> {
        match range.bounds(c.id) {
            None => Ok(0),
            Some(b) if c.head == super::zrank::RANKED => zset::count_ranked(self, c, &b),
            Some(b) => zset::count_in(&self.store.zscore, self.txn, c.id, c.len, &b),
        }
    }

    fn zlexcount(&self, c: CollMeta, range: &LexRange) -> Result<u64, StoreError> {
        match range.bounds(c.id) {
            None => Ok(0),
            Some(b) => zset::count_in(&self.store.elems, self.txn, c.id, c.len, &b),
        }
    }

    fn zrange<'s>(
        &'s self,
        c: CollMeta,
        spec: &RangeSpec,
        each: impl FnMut(&'s [u8], f64),
    ) -> Result<(), StoreError> {
        let store = self.store;
        zset::range_each(&store.zscore, &store.elems, self.txn, c, spec, each)
    }

    fn zscan<'s>(
        &'s self,
        c: CollMeta,
        after: Option<&[u8]>,
        count: usize,
        mut each: impl FnMut(&'s [u8], f64),
    ) -> Result<Option<&'s [u8]>, StoreError> {
        let mut failed = None;
        let last =
            hash::scan(
                &self.store.elems,
                self.txn,
                &c,
                after,
                count,
                |m, v| match zset::elem_score(v) {
                    Ok(s) => each(m, s),
                    Err(e) => failed = Some(e),
                },
            )?;
        failed.map_or(Ok(last), Err)
    }

    fn open_scored(&self, key: &[u8]) -> Result<Option<(Kind, CollMeta)>, ReadError> {
        match self.find_any(key, &[Kind::Set, Kind::ZSet])? {
            FoundAny::Missing => Ok(None),
            FoundAny::WrongType => Err(ReadError::WrongType),
            FoundAny::Coll(kind, c) => Ok(Some((kind, c))),
        }
    }

    fn zcombine<'s>(
        &'s self,
        how: Combine,
        inputs: &[ZInput<CollMeta>],
        agg: Aggregate,
        each: impl FnMut(&'s [u8], f64) -> bool,
    ) -> Result<(), StoreError> {
        let sources: Vec<zcombine::Source> = inputs
            .iter()
            .map(|i| zcombine::Source {
                kind: i.kind,
                coll: i.coll,
                weight: i.weight,
            })
            .collect();
        zcombine::combine(*self.store.elems, self.txn, how, &sources, agg, each)
    }
}
