//! Sorted-set algebra: ZUNION, ZINTER, ZDIFF, their STORE forms, and ZINTERCARD, as Redis 7.0
//! computes them (`zunionInterDiffGenericCommand`).
//!
//! Inputs are sorted sets or plain sets (each member of a set scores 1); a missing key is an
//! empty input. Scores are multiplied by the input's weight (default 1) and combined with the
//! aggregate (SUM, the default, MIN or MAX), with Redis's rules for the undefined cases:
//! - a weighted score that is NaN (`inf * 0`) counts as 0 where Redis checks it: every score
//!   of a union, and the first input's score of an intersection;
//! - the other inputs of an intersection are weighted without that check, so a NaN reaches
//!   the aggregate: SUM then gives 0 (as any sum that is NaN, `inf + -inf`, does), MIN and MAX
//!   keep what they had (a comparison with NaN is false);
//! - union and intersection take the inputs from the smallest to the largest (a stable sort
//!   by cardinality, as Redis's), which decides the order of a SUM and so its rounding, and
//!   whether `inf + -inf + x` is `x` or 0.
//!
//! No result score is NaN, so every result can be stored.
//!
//! Cost, for inputs of n_1 <= ... <= n_k members and r results:
//! - union: a merge of the inputs' walks (each in member order), O(sum n_i log k), O(k) memory
//!   beyond the result;
//! - intersection: a walk of the smallest input and a lookup per member in each other input,
//!   O(n_1 k log n); ZINTERCARD stops at its LIMIT;
//! - difference: a walk of the first input and lookups in the others, O(n_1 k log n).
//!
//! The reads sort the result by score, then member (O(r log r)); the STORE forms write it as a
//! new sorted set in the write's transaction (`zset::replace_with`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use heed::types::Bytes;
use heed::{Database, RoTxn};

use super::hash::elements;
use super::set::Combine;
use super::{CollMeta, FoundAny, Tx};
use crate::outcome::Outcome;
use crate::storage::{Kind, StoreError};

/// How the weighted scores of a member meet (AGGREGATE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregate {
    #[default]
    Sum,
    Min,
    Max,
}

/// One input: a set or sorted set (None: a missing key, an empty input), and its weight.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    pub kind: Kind,
    pub coll: Option<CollMeta>,
    pub weight: f64,
}

impl Source {
    fn len(&self) -> u64 {
        self.coll.map_or(0, |c| c.len)
    }

    /// The score of an element record's value: a sorted set's score, or 1 for a set member.
    fn score(&self, v: &[u8]) -> Result<f64, StoreError> {
        if self.kind != Kind::ZSet {
            return Ok(1.0);
        }
        let b: [u8; 8] = v
            .try_into()
            .map_err(|_| StoreError::damaged("sorted-set element has a malformed score"))?;
        Ok(f64::from_bits(u64::from_be_bytes(b)))
    }
}

/// Redis's `zunionInterAggregate`.
pub(super) fn aggregate(target: &mut f64, v: f64, agg: Aggregate) {
    match agg {
        Aggregate::Sum => {
            *target += v;
            if target.is_nan() {
                *target = 0.0;
            }
        }
        Aggregate::Min => {
            if v < *target {
                *target = v;
            }
        }
        Aggregate::Max => {
            if v > *target {
                *target = v;
            }
        }
    }
}

/// A weighted score, NaN counted as 0.
pub(super) fn weighted(score: f64, weight: f64) -> f64 {
    let w = score * weight;
    if w.is_nan() { 0.0 } else { w }
}

/// The score of `member` in input `src`, if it is there; `buf` is scratch for the key.
fn lookup(
    db: Database<Bytes, Bytes>,
    txn: &RoTxn<'_>,
    src: &Source,
    member: &[u8],
    buf: &mut Vec<u8>,
) -> Result<Option<f64>, StoreError> {
    let Some(c) = src.coll else {
        return Ok(None);
    };
    buf.clear();
    buf.extend_from_slice(&c.id.to_be_bytes());
    buf.extend_from_slice(member);
    match db.get(txn, buf)? {
        None => Ok(None),
        Some(v) => src.score(v).map(Some),
    }
}

/// Combines `sources` (weights applied, `agg` for union and intersection) and calls
/// `each(member, score)` for each member of the result, in member order for union, in no
/// particular order otherwise, until it returns false.
pub fn combine<'t>(
    db: Database<Bytes, Bytes>,
    txn: &'t RoTxn<'_>,
    how: Combine,
    sources: &[Source],
    agg: Aggregate,
    mut each: impl FnMut(&'t [u8], f64) -> bool,
) -> Result<(), StoreError> {
    let mut buf = Vec::new();
    // Union and intersection take the inputs from the smallest (stable, as Redis's sort).
    let mut order: Vec<&Source> = sources.iter().collect();
    if how != Combine::Diff {
        order.sort_by_key(|s| s.len());
    }
    match how {
        Combine::Inter => {
            let Some((first, others)) = order.split_first() else {
                return Ok(());
            };
            let Some(c) = first.coll.filter(|c| c.len > 0) else {
                return Ok(());
            };
            'members: for e in elements(db, txn, c.id)? {
                let (m, v) = e?;
                let mut score = weighted(first.score(v)?, first.weight);
                for o in others {
                    match lookup(db, txn, o, m, &mut buf)? {
                        Some(s) => aggregate(&mut score, s * o.weight, agg),
                        None => continue 'members,
                    }
                }
                if !each(m, score) {
                    break;
                }
            }
        }
        Combine::Diff => {
            let Some((first, others)) = order.split_first() else {
                return Ok(());
            };
            let Some(c) = first.coll else {
                return Ok(());
            };
            'members: for e in elements(db, txn, c.id)? {
                let (m, v) = e?;
                for o in others {
                    if lookup(db, txn, o, m, &mut buf)?.is_some() {
                        continue 'members;
                    }
                }
                if !each(m, first.score(v)?) {
                    break;
                }
            }
        }
        Combine::Union => {
            // A merge of the inputs' walks, each in member order; equal members come off the
            // heap in input order, so each is aggregated as Redis does, input after input.
            let mut walks = Vec::with_capacity(order.len());
            let mut heads: Vec<f64> = vec![0.0; order.len()];
            let mut heap = BinaryHeap::with_capacity(order.len());
            for (i, src) in order.iter().enumerate() {
                let Some(c) = src.coll else {
                    walks.push(None);
                    continue;
                };
                let mut w = elements(db, txn, c.id)?;
                if let Some(e) = w.next() {
                    let (m, v) = e?;
                    heads[i] = src.score(v)?;
                    heap.push(Reverse((m, i)));
                }
                walks.push(Some(w));
            }
            let mut current: Option<(&'t [u8], f64)> = None;
            while let Some(Reverse((m, i))) = heap.pop() {
                let score = weighted(heads[i], order[i].weight);
                current = match current {
                    Some((cm, mut acc)) if cm == m => {
                        aggregate(&mut acc, score, agg);
                        Some((cm, acc))
                    }
                    Some((cm, acc)) => {
                        if !each(cm, acc) {
                            return Ok(());
                        }
                        Some((m, score))
                    }
                    None => Some((m, score)),
                };
                if let Some(Some(w)) = walks.get_mut(i)
                    && let Some(e) = w.next()
                {
                    let (nm, v) = e?;
                    heads[i] = order[i].score(v)?;
                    heap.push(Reverse((nm, i)));
                }
            }
            if let Some((cm, acc)) = current {
                each(cm, acc);
            }
        }
    }
    Ok(())
}

/// The result sorted as a sorted set is: by score, then member bytes (scores are never NaN).
pub fn sort_result(v: &mut [(&[u8], f64)]) {
    v.sort_by(|a, b| {
        a.1.partial_cmp(&b.1)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.0.cmp(b.0))
    });
}

/// ZUNIONSTORE/ZINTERSTORE/ZDIFFSTORE in the writer's transaction: WRONGTYPE if a source is
/// neither a set nor a sorted set, then the deferred option error if any, else `dst` replaced
/// by the result (deleted when it is empty); answers the result's count.
pub fn store(
    tx: &mut Tx<'_, '_, '_>,
    dst: &[u8],
    how: Combine,
    keys: &[Vec<u8>],
    weights: &[f64],
    agg: Aggregate,
    deferred: Option<&'static str>,
) -> Result<Outcome, StoreError> {
    let mut sources = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        let weight = weights.get(i).copied().unwrap_or(1.0);
        sources.push(match tx.find_any(k, &[Kind::Set, Kind::ZSet])? {
            FoundAny::WrongType => return Ok(Outcome::WrongType),
            FoundAny::Missing => Source {
                kind: Kind::ZSet,
                coll: None,
                weight,
            },
            FoundAny::Coll(kind, c) => Source {
                kind,
                coll: Some(c),
                weight,
            },
        });
    }
    if let Some(msg) = deferred {
        return Ok(Outcome::Err(msg));
    }
    let mut members: Vec<(Vec<u8>, f64)> = Vec::new();
    {
        let (store, txn) = tx.store_txn();
        combine(*store.elems, txn, how, &sources, agg, |m, s| {
            members.push((m.to_vec(), s));
            true
        })?;
    }
    super::zset::replace_with(tx, dst, &members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregates_follow_redis_for_nan_and_infinities() {
        let mut t = f64::INFINITY;
        aggregate(&mut t, f64::NEG_INFINITY, Aggregate::Sum);
        assert_eq!(t, 0.0);
        let mut t = 3.0;
        aggregate(&mut t, f64::NAN, Aggregate::Sum);
        assert_eq!(t, 0.0);
        let mut t = 3.0;
        aggregate(&mut t, f64::NAN, Aggregate::Min);
        assert_eq!(t, 3.0);
        aggregate(&mut t, f64::NAN, Aggregate::Max);
        assert_eq!(t, 3.0);
        aggregate(&mut t, 1.0, Aggregate::Min);
        assert_eq!(t, 1.0);
        aggregate(&mut t, 5.0, Aggregate::Max);
        assert_eq!(t, 5.0);
        assert_eq!(weighted(f64::INFINITY, 0.0), 0.0);
        assert_eq!(weighted(2.0, -1.5), -3.0);
    }

    #[test]
    fn results_sort_by_score_then_member() {
        let mut v: Vec<(&[u8], f64)> = vec![
            (b"b", 1.0),
            (b"a", 2.0),
            (b"c", -0.0),
            (b"a0", 0.0),
            (b"z", f64::NEG_INFINITY),
        ];
        sort_result(&mut v);
        let names: Vec<&[u8]> = v.iter().map(|e| e.0).collect();
        assert_eq!(names, [&b"z"[..], b"a0", b"c", b"b", b"a"]);
    }
}
