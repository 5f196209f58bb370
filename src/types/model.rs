//! The collections in memory: a `BTreeMap` of keys to plain Rust collections, which runs the
//! same typed reads as the LMDB store (`read::CollRead`) and the collection writes
//! (`CollOp`) with the same outcomes, written the obvious way. Model-based tests run one
//! stream of operations on both and compare every result (as `storage::model` is for strings).
//!
//! Not modelled (`Model::apply` answers None): the writes that pick at random (SPOP, the
//! blocking pops' forms), COPY and RESTORE.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::hash::HashOp;
use super::list::ListOp;
use super::read::{CollRead, PosQuery, ReadError, ZInput};
use super::set::{Combine, SetOp};
use super::zcombine::{Aggregate, aggregate, weighted};
use super::zset::{Lex, LexRange, RangeBy, RangeQuery, RangeSpec, ScoreRange, ZSetOp, score_key};
use super::{CollOp, MAX_SUB, clamp_range};
use crate::int::parse_i64;
use crate::outcome::Outcome;
use crate::storage::{Kind, MAX_KEY, StoreError};

/// A sorted set: each member's score, and (score key, member) in the order ZRANGE gives.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ZSet {
    scores: BTreeMap<Vec<u8>, f64>,
    order: BTreeSet<(u64, Vec<u8>)>,
}

impl ZSet {
    fn insert(&mut self, member: &[u8], score: f64) {
        // As the store: -0 is kept as 0.
        let score = if score == 0.0 { 0.0 } else { score };
        self.remove(member);
        self.scores.insert(member.to_vec(), score);
        self.order.insert((score_key(score), member.to_vec()));
    }

    fn remove(&mut self, member: &[u8]) -> Option<f64> {
        let s = self.scores.remove(member)?;
        self.order.remove(&(score_key(s), member.to_vec()));
        Some(s)
    }

    /// (member, score) by score, then member.
    fn ranked(&self) -> impl DoubleEndedIterator<Item = (&[u8], f64)> {
        self.order
            .iter()
            .map(|(_, m)| (m.as_slice(), self.scores.get(m).copied().unwrap_or(0.0)))
    }

    fn in_lex(range: &LexRange, m: &[u8]) -> bool {
        let above = match &range.min {
            Lex::Min => true,
            Lex::Max => false,
            Lex::Incl(v) => m >= v.as_slice(),
            Lex::Excl(v) => m > v.as_slice(),
        };
        let below = match &range.max {
            Lex::Max => true,
            Lex::Min => false,
            Lex::Incl(v) => m <= v.as_slice(),
            Lex::Excl(v) => m < v.as_slice(),
        };
        above && below
    }

    fn in_scores(range: &ScoreRange, s: f64) -> bool {
        (range.lo..=range.hi).contains(&score_key(s))
    }

    /// The members `spec` selects, in the reply's order.
    fn select(&self, spec: &RangeSpec) -> Vec<(&[u8], f64)> {
        let mut all: Vec<(&[u8], f64)> = match &spec.query {
            RangeQuery::Rank(start, stop) => {
                let Some((s, e)) = clamp_range(*start, *stop, self.scores.len() as u64) else {
                    return Vec::new();
                };
                let mut v: Vec<_> = if spec.rev {
                    self.ranked().rev().collect()
                } else {
                    self.ranked().collect()
                };
                v.truncate(e as usize + 1);
                v.drain(..s as usize);
                return v;
            }
            RangeQuery::Score(r) => self
                .ranked()
                .filter(|(_, s)| Self::in_scores(r, *s))
                .collect(),
            RangeQuery::Lex(r) => self
                .scores
                .iter()
                .filter(|(m, _)| Self::in_lex(r, m))
                .map(|(m, s)| (m.as_slice(), *s))
                .collect(),
        };
        if spec.rev {
            all.reverse();
        }
        if spec.offset < 0 {
            return Vec::new();
        }
        let take = usize::try_from(spec.limit).unwrap_or(usize::MAX);
        all.into_iter()
            .skip(spec.offset as usize)
            .take(take)
            .collect()
    }
}

/// What a key holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A value of no collection kind (a string): every collection command on it is WRONGTYPE.
    Other(Vec<u8>),
    List(VecDeque<Vec<u8>>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    Set(BTreeSet<Vec<u8>>),
    ZSet(ZSet),
}

impl Value {
    fn kind(&self) -> Kind {
        match self {
            Value::Other(_) => Kind::String,
            Value::List(_) => Kind::List,
            Value::Hash(_) => Kind::Hash,
            Value::Set(_) => Kind::Set,
            Value::ZSet(_) => Kind::ZSet,
        }
    }

    fn empty(kind: Kind) -> Value {
        match kind {
            Kind::List => Value::List(VecDeque::new()),
            Kind::Hash => Value::Hash(BTreeMap::new()),
            Kind::Set => Value::Set(BTreeSet::new()),
            Kind::ZSet => Value::ZSet(ZSet::default()),
            _ => Value::Other(Vec::new()),
        }
    }

    /// Whether it is a collection with no elements (which the store never keeps).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its element count (1 for a string).
    pub fn len(&self) -> usize {
        match self {
            Value::Other(_) => 1,
            Value::List(l) => l.len(),
            Value::Hash(h) => h.len(),
            Value::Set(s) => s.len(),
            Value::ZSet(z) => z.scores.len(),
        }
    }
}

/// The keyspace: keys to values. An empty collection is deleted, as the store does.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Model {
    keys: BTreeMap<Vec<u8>, Value>,
}

/// The model's answer to a handle of the wrong kind (a caller's mistake, not the data's).
fn not_kind() -> StoreError {
    StoreError::damaged("model: a handle of another kind")
}

/// A list write's or read's position `index` (negative from the end) in a list of `len`.
fn index_in(index: i64, len: usize) -> Option<usize> {
    let i = if index < 0 { len as i64 + index } else { index };
    (0..len as i64).contains(&i).then_some(i as usize)
}

/// Up to `count` items after `after`, and the last of them when more follow.
fn scan_page<'s, T>(
    items: impl Iterator<Item = (&'s [u8], T)>,
    after: Option<&[u8]>,
    count: usize,
    mut each: impl FnMut(&'s [u8], T),
) -> Option<&'s [u8]> {
    let mut rest = items.skip_while(|(k, _)| after.is_some_and(|a| *k <= a));
    let mut last = None;
    for _ in 0..count {
        match rest.next() {
            Some((k, v)) => {
                last = Some(k);
                each(k, v);
            }
            None => return None,
        }
    }
    rest.next().and(last)
}

impl Model {
    /// Puts a value of no collection kind (a string) under `key`.
    pub fn put_other(&mut self, key: &[u8], value: &[u8]) {
        self.keys.insert(key.to_vec(), Value::Other(value.to_vec()));
    }

    /// Deletes whatever is under `key`.
    pub fn delete(&mut self, key: &[u8]) {
        self.keys.remove(key);
    }

    /// Every key and its value, in key order.
    pub fn keys(&self) -> &BTreeMap<Vec<u8>, Value> {
        &self.keys
    }

    /// The value of `kind` under `key` for a write: WrongType, or the value (created empty
    /// when missing and `create`).
    fn get_mut(&mut self, key: &[u8], kind: Kind, create: bool) -> Result<Option<&mut Value>, ()> {
        match self.keys.get(key).map(Value::kind) {
            Some(k) if k != kind => Err(()),
            Some(_) => Ok(self.keys.get_mut(key)),
            None if create => Ok(Some(
                self.keys
                    .entry(key.to_vec())
                    .or_insert_with(|| Value::empty(kind)),
            )),
            None => Ok(None),
        }
    }

    /// Runs a collection write; None for the writes the model does not run (see the module).
    pub fn apply(&mut self, op: &CollOp) -> Option<Outcome> {
        let out = match op {
            CollOp::List(op) => self.list(op),
            CollOp::Hash(op) => self.hash(op),
            CollOp::Set(op) => self.set(op)?,
            CollOp::ZSet(op) => self.zset(op)?,
            CollOp::Pop(_) | CollOp::Key(_) => return None,
        };
        self.keys.retain(|_, v| !v.is_empty());
        Some(out)
    }

    fn list_mut(
        &mut self,
        key: &[u8],
        create: bool,
    ) -> Result<Option<&mut VecDeque<Vec<u8>>>, Outcome> {
        match self.get_mut(key, Kind::List, create) {
            Err(()) => Err(Outcome::WrongType),
            Ok(Some(Value::List(l))) => Ok(Some(l)),
            Ok(_) => Ok(None),
        }
    }

    fn zset_mut(&mut self, key: &[u8], create: bool) -> Result<Option<&mut ZSet>, Outcome> {
        match self.get_mut(key, Kind::ZSet, create) {
            Err(()) => Err(Outcome::WrongType),
            Ok(Some(Value::ZSet(z))) => Ok(Some(z)),
            Ok(_) => Ok(None),
        }
    }

    fn list(&mut self, op: &ListOp) -> Outcome {
        match op {
            ListOp::Push {
                key,
                values,
                left,
                existing_only,
            } => match self.list_mut(key, !*existing_only) {
                Err(o) => o,
                Ok(None) => Outcome::Int(0),
                Ok(Some(list)) => {
                    for v in values {
                        if *left {
                            list.push_front(v.clone());
                        } else {
                            list.push_back(v.clone());
                        }
                    }
                    Outcome::Int(list.len() as i64)
                }
            },
            ListOp::Pop { key, left, count } => match self.list_mut(key, false) {
                Err(o) => o,
                Ok(None) if count.is_some() => Outcome::NilArray,
                Ok(None) => Outcome::Nil,
                Ok(Some(list)) => {
                    let n = count.unwrap_or(1).min(list.len() as u64);
                    let mut got = Vec::new();
                    for _ in 0..n {
                        let v = if *left {
                            list.pop_front()
                        } else {
                            list.pop_back()
                        };
                        got.extend(v.map(Outcome::Bulk));
                    }
                    match count {
                        Some(_) => Outcome::Array(got),
                        None => got.pop().unwrap_or(Outcome::Nil),
                    }
                }
            },
            ListOp::Set { key, index, value } => match self.list_mut(key, false) {
                Err(o) => o,
                Ok(None) => Outcome::Err("ERR no such key"),
                Ok(Some(list)) => match index_in(*index, list.len()) {
                    None => Outcome::Err("ERR index out of range"),
                    Some(i) => {
                        list[i] = value.clone();
                        Outcome::Done
                    }
                },
            },
            ListOp::Rem { key, count, value } => match self.list_mut(key, false) {
                Err(o) => o,
                Ok(None) => Outcome::Int(0),
                Ok(Some(list)) => {
                    let limit = if *count == 0 {
                        usize::MAX
                    } else {
                        count.unsigned_abs() as usize
                    };
                    let mut hits: Vec<usize> =
                        (0..list.len()).filter(|&i| list[i] == *value).collect();
                    if *count < 0 {
                        hits.reverse();
                    }
                    hits.truncate(limit);
                    hits.sort_unstable();
                    for &i in hits.iter().rev() {
                        list.remove(i);
                    }
                    Outcome::Int(hits.len() as i64)
                }
            },
            ListOp::Trim { key, start, stop } => match self.list_mut(key, false) {
                Err(o) => o,
                Ok(None) => Outcome::Done,
                Ok(Some(list)) => {
                    match clamp_range(*start, *stop, list.len() as u64) {
                        None => list.clear(),
                        Some((s, e)) => {
                            list.truncate(e as usize + 1);
                            list.drain(..s as usize);
                        }
                    }
                    Outcome::Done
                }
            },
            ListOp::Insert {
                key,
                before,
                pivot,
                value,
            } => match self.list_mut(key, false) {
                Err(o) => o,
                Ok(None) => Outcome::Int(0),
                Ok(Some(list)) => match list.iter().position(|v| v == pivot) {
                    None => Outcome::Int(-1),
                    Some(at) => {
                        list.insert(if *before { at } else { at + 1 }, value.clone());
                        Outcome::Int(list.len() as i64)
                    }
                },
            },
            ListOp::Move {
                src,
                dst,
                from_left,
                to_left,
            } => {
                match self.list_mut(src, false) {
                    Err(o) => return o,
                    Ok(None) => return Outcome::Nil,
                    Ok(Some(_)) => {}
                }
                if self.get_mut(dst, Kind::List, false).is_err() {
                    return Outcome::WrongType;
                }
                let Ok(Some(s)) = self.list_mut(src, false) else {
                    return Outcome::Nil;
                };
                let Some(v) = (if *from_left {
                    s.pop_front()
                } else {
                    s.pop_back()
                }) else {
                    return Outcome::Nil;
                };
                if s.is_empty() {
                    self.keys.remove(src.as_slice());
                }
                let Ok(Some(d)) = self.list_mut(dst, true) else {
                    return Outcome::WrongType;
                };
                if *to_left {
                    d.push_front(v.clone());
                } else {
                    d.push_back(v.clone());
                }
                Outcome::Bulk(v)
            }
        }
    }

    fn hash(&mut self, op: &HashOp) -> Outcome {
        let (key, create) = match op {
            HashOp::Set { key, .. }
            | HashOp::IncrBy { key, .. }
            | HashOp::IncrByFloat { key, .. } => (key, true),
            HashOp::Del { key, .. } => (key, false),
        };
        let h = match self.get_mut(key, Kind::Hash, create) {
            Err(()) => return Outcome::WrongType,
            Ok(Some(Value::Hash(h))) => h,
            Ok(_) => return Outcome::Int(0),
        };
        match op {
            HashOp::Set { pairs, nx, ok, .. } => {
                let mut added = 0;
                for (f, v) in pairs {
                    if h.contains_key(f) {
                        if *nx {
                            continue;
                        }
                    } else {
                        added += 1;
                    }
                    h.insert(f.clone(), v.clone());
                }
                if *ok && !(*nx && added == 0) {
                    Outcome::Done
                } else {
                    Outcome::Int(added)
                }
            }
            HashOp::Del { fields, .. } => {
                let mut removed = 0;
                for f in fields {
                    removed += h.remove(f).is_some() as i64;
                }
                Outcome::Int(removed)
            }
            HashOp::IncrBy { field, delta, .. } => {
                let old = match h.get(field) {
                    None => 0,
                    Some(v) => match parse_i64(v) {
                        Some(n) => n,
                        None => return Outcome::Err("ERR hash value is not an integer"),
                    },
                };
                let Some(new) = old.checked_add(*delta) else {
                    return Outcome::Err("ERR increment or decrement would overflow");
                };
                h.insert(field.clone(), new.to_string().into_bytes());
                Outcome::Int(new)
            }
            HashOp::IncrByFloat { field, delta, .. } => {
                let old = h.get(field).map_or(&b"0"[..], Vec::as_slice);
                match crate::float::add(old, delta) {
                    Ok(text) => {
                        h.insert(field.clone(), text.clone());
                        Outcome::Bulk(text)
                    }
                    Err(crate::float::AddError::NotFinite) => {
                        Outcome::Err("ERR increment would produce NaN or Infinity")
                    }
                    Err(crate::float::AddError::TooLong) => {
                        Outcome::Err("ERR value is not a valid float")
                    }
                    Err(_) => Outcome::Err("ERR hash value is not a float"),
                }
            }
        }
    }

    /// The sets under `keys` (None: missing); Err when one is not a set.
    fn sets_of(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<&Value>>, ()> {
        keys.iter()
            .map(|k| self.open(k, Kind::Set).map_err(|_| ()))
            .collect()
    }

    fn set(&mut self, op: &SetOp) -> Option<Outcome> {
        Some(match op {
            SetOp::Add { key, members } => match self.get_mut(key, Kind::Set, true) {
                Ok(Some(Value::Set(s))) => {
                    let mut added = 0;
                    for m in members {
                        added += s.insert(m.clone()) as i64;
                    }
                    Outcome::Int(added)
                }
                _ => Outcome::WrongType,
            },
            SetOp::Rem { key, members } => match self.get_mut(key, Kind::Set, false) {
                Err(()) => Outcome::WrongType,
                Ok(Some(Value::Set(s))) => {
                    let mut removed = 0;
                    for m in members {
                        removed += s.remove(m) as i64;
                    }
                    Outcome::Int(removed)
                }
                Ok(_) => Outcome::Int(0),
            },
            SetOp::Pop { .. } => return None,
            SetOp::Move { src, dst, member } => {
                let there = match self.get_mut(src, Kind::Set, false) {
                    Err(()) => return Some(Outcome::WrongType),
                    Ok(None) => return Some(Outcome::Int(0)),
                    Ok(Some(Value::Set(s))) => s.contains(member),
                    Ok(Some(_)) => false,
                };
                if self.get_mut(dst, Kind::Set, false).is_err() {
                    return Some(Outcome::WrongType);
                }
                if member.len() > MAX_SUB || !there {
                    return Some(Outcome::Int(0));
                }
                if src == dst {
                    return Some(Outcome::Int(1));
                }
                if let Ok(Some(Value::Set(s))) = self.get_mut(src, Kind::Set, false) {
                    s.remove(member);
                }
                if let Ok(Some(Value::Set(d))) = self.get_mut(dst, Kind::Set, true) {
                    d.insert(member.clone());
                }
                Outcome::Int(1)
            }
            SetOp::Store { how, dst, keys } => {
                let Ok(sets) = self.sets_of(keys) else {
                    return Some(Outcome::WrongType);
                };
                let members: BTreeSet<Vec<u8>> = match self.scombine(*how, &sets, usize::MAX) {
                    Ok(m) => m.into_iter().map(<[u8]>::to_vec).collect(),
                    Err(_) => return Some(Outcome::Failed),
                };
                let n = members.len() as i64;
                self.keys.insert(dst.clone(), Value::Set(members));
                Outcome::Int(n)
            }
        })
    }

    fn zset(&mut self, op: &ZSetOp) -> Option<Outcome> {
        const NAN_SCORE: &str = "ERR resulting score is not a number (NaN)";
        Some(match op {
            ZSetOp::Add {
                key,
                flags: f,
                pairs,
            } => {
                let z = match self.zset_mut(key, !f.xx) {
                    Err(o) => return Some(o),
                    Ok(Some(z)) => z,
                    Ok(None) => {
                        return Some(if f.incr {
                            Outcome::Nil
                        } else {
                            Outcome::Int(0)
                        });
                    }
                };
                let (mut added, mut updated, mut processed) = (0i64, 0i64, 0i64);
                let mut last = 0.0;
                let mut failed = None;
                for (score, member) in pairs {
                    let mut score = *score;
                    match z.scores.get(member).copied() {
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
                                z.insert(member, score);
                                updated += 1;
                            }
                        }
                        None if f.xx => {}
                        None => {
                            z.insert(member, score);
                            added += 1;
                            processed += 1;
                            last = score;
                        }
                    }
                }
                if let Some(msg) = failed {
                    Outcome::Err(msg)
                } else if f.incr {
                    if processed > 0 {
                        Outcome::Double(if last == 0.0 { 0.0 } else { last })
                    } else {
                        Outcome::Nil
                    }
                } else if f.ch {
                    Outcome::Int(added + updated)
                } else {
                    Outcome::Int(added)
                }
            }
            ZSetOp::Rem { key, members } => match self.zset_mut(key, false) {
                Err(o) => o,
                Ok(None) => Outcome::Int(0),
                Ok(Some(z)) => {
                    let n = members.iter().filter(|m| z.remove(m).is_some()).count();
                    Outcome::Int(n as i64)
                }
            },
            ZSetOp::RemRange { key, by } => match self.zset_mut(key, false) {
                Err(o) => o,
                Ok(None) => Outcome::Int(0),
                Ok(Some(z)) => {
                    let query = match by {
                        RangeBy::Rank(s, e) => RangeQuery::Rank(*s, *e),
                        RangeBy::Score(r) => RangeQuery::Score(*r),
                        RangeBy::Lex(r) => RangeQuery::Lex(r.clone()),
                    };
                    let spec = RangeSpec {
                        query,
                        rev: false,
                        offset: 0,
                        limit: -1,
                    };
                    let victims: Vec<Vec<u8>> = z
                        .select(&spec)
                        .into_iter()
                        .map(|(m, _)| m.to_vec())
                        .collect();
                    for m in &victims {
                        z.remove(m);
                    }
                    Outcome::Int(victims.len() as i64)
                }
            },
            ZSetOp::Pop { key, max, count } => match self.zset_mut(key, false) {
                Err(o) => o,
                Ok(None) => Outcome::Array(Vec::new()),
                Ok(Some(z)) => {
                    let n = count.unwrap_or(1) as usize;
                    let picked: Vec<(Vec<u8>, f64)> = if *max {
                        z.ranked()
                            .rev()
                            .take(n)
                            .map(|(m, s)| (m.to_vec(), s))
                            .collect()
                    } else {
                        z.ranked().take(n).map(|(m, s)| (m.to_vec(), s)).collect()
                    };
                    let mut pairs = Vec::new();
                    for (m, s) in picked {
                        z.remove(&m);
                        pairs.push((Outcome::Bulk(m), Outcome::Double(s)));
                    }
                    match count {
                        Some(_) => Outcome::Pairs(pairs),
                        None => {
                            Outcome::Array(pairs.into_iter().flat_map(|(m, s)| [m, s]).collect())
                        }
                    }
                }
            },
            ZSetOp::RangeStore { dst, src, range } => {
                let picked: Vec<(Vec<u8>, f64)> = match self.open(src, Kind::ZSet) {
                    Err(_) => return Some(Outcome::WrongType),
                    Ok(None) => Vec::new(),
                    Ok(Some(Value::ZSet(z))) => z
                        .select(range)
                        .into_iter()
                        .map(|(m, s)| (m.to_vec(), s))
                        .collect(),
                    Ok(Some(_)) => return Some(Outcome::Failed),
                };
                let mut z = ZSet::default();
                for (m, s) in &picked {
                    z.insert(m, *s);
                }
                self.keys.insert(dst.clone(), Value::ZSet(z));
                Outcome::Int(picked.len() as i64)
            }
            ZSetOp::Store {
                dst,
                how,
                keys,
                weights,
                agg,
                deferred,
            } => {
                let mut inputs = Vec::new();
                for (i, k) in keys.iter().enumerate() {
                    let (kind, coll) = match self.open_scored(k) {
                        Err(_) => return Some(Outcome::WrongType),
                        Ok(None) => (Kind::ZSet, None),
                        Ok(Some((kind, c))) => (kind, Some(c)),
                    };
                    let weight = weights.get(i).copied().unwrap_or(1.0);
                    inputs.push(ZInput { kind, coll, weight });
                }
                if let Some(msg) = deferred {
                    return Some(Outcome::Err(msg));
                }
                let mut result = ZSet::default();
                let combined = self.zcombine(*how, &inputs, *agg, |m, s| {
                    result.insert(m, s);
                    true
                });
                if combined.is_err() {
                    return Some(Outcome::Failed);
                }
                let n = result.scores.len() as i64;
                self.keys.insert(dst.clone(), Value::ZSet(result));
                Outcome::Int(n)
            }
        })
    }
}

impl CollRead for Model {
    type Coll<'s>
        = &'s Value
    where
        Self: 's;

    fn open(&self, key: &[u8], kind: Kind) -> Result<Option<&Value>, ReadError> {
        if key.is_empty() || key.len() > MAX_KEY {
            return Ok(None);
        }
        match self.keys.get(key) {
            None => Ok(None),
            Some(v) if v.kind() == kind => Ok(Some(v)),
            Some(_) => Err(ReadError::WrongType),
        }
    }

    fn len(&self, c: &Value) -> u64 {
        c.len() as u64
    }

    fn lindex<'s>(&'s self, c: &'s Value, index: i64) -> Result<Option<&'s [u8]>, StoreError> {
        let Value::List(l) = c else {
            return Err(not_kind());
        };
        Ok(index_in(index, l.len()).map(|i| l[i].as_slice()))
    }

    fn lrange<'s>(
        &'s self,
        c: &'s Value,
        start: i64,
        stop: i64,
        mut each: impl FnMut(&'s [u8]),
    ) -> Result<(), StoreError> {
        let Value::List(l) = c else {
            return Err(not_kind());
        };
        if let Some((s, e)) = clamp_range(start, stop, l.len() as u64) {
            l.range(s as usize..=e as usize).for_each(|v| each(v));
        }
        Ok(())
    }

    fn lpos(&self, c: &Value, target: &[u8], q: PosQuery) -> Result<Vec<u64>, StoreError> {
        let Value::List(l) = c else {
            return Err(not_kind());
        };
        let n = l.len();
        let look = if q.maxlen == 0 {
            n
        } else {
            (q.maxlen as usize).min(n)
        };
        let order: Vec<usize> = if q.rank > 0 {
            (0..look).collect()
        } else {
            (0..look).map(|i| n - 1 - i).collect()
        };
        Ok(order
            .into_iter()
            .filter(|&i| l[i] == target)
            .skip(q.rank.unsigned_abs() as usize - 1)
            .take(q.want)
            .map(|i| i as u64)
            .collect())
    }

    fn hget<'s>(&'s self, c: &'s Value, field: &[u8]) -> Result<Option<&'s [u8]>, StoreError> {
        let Value::Hash(h) = c else {
            return Err(not_kind());
        };
        Ok(h.get(field).map(Vec::as_slice))
    }

    fn hwalk<'s>(
        &'s self,
        c: &'s Value,
        mut each: impl FnMut(&'s [u8], &'s [u8]),
    ) -> Result<(), StoreError> {
        let Value::Hash(h) = c else {
            return Err(not_kind());
        };
        h.iter().for_each(|(f, v)| each(f, v));
        Ok(())
    }

    fn hscan<'s>(
        &'s self,
        c: &'s Value,
        after: Option<&[u8]>,
        count: usize,
        each: impl FnMut(&'s [u8], &'s [u8]),
    ) -> Result<Option<&'s [u8]>, StoreError> {
        let Value::Hash(h) = c else {
            return Err(not_kind());
        };
        let items = h.iter().map(|(f, v)| (f.as_slice(), v.as_slice()));
        Ok(scan_page(items, after, count, each))
    }

    fn sismember(&self, c: &Value, member: &[u8]) -> Result<bool, StoreError> {
        let Value::Set(s) = c else {
            return Err(not_kind());
        };
        Ok(s.contains(member))
    }

    fn smembers<'s>(
        &'s self,
        c: &'s Value,
        mut each: impl FnMut(&'s [u8]),
    ) -> Result<(), StoreError> {
        let Value::Set(s) = c else {
            return Err(not_kind());
        };
        s.iter().for_each(|m| each(m));
        Ok(())
    }

    fn sscan<'s>(
        &'s self,
        c: &'s Value,
        after: Option<&[u8]>,
        count: usize,
        mut each: impl FnMut(&'s [u8]),
    ) -> Result<Option<&'s [u8]>, StoreError> {
        let Value::Set(s) = c else {
            return Err(not_kind());
        };
        let items = s.iter().map(|m| (m.as_slice(), ()));
        Ok(scan_page(items, after, count, |m, ()| each(m)))
    }

    fn scombine<'s>(
        &'s self,
        how: Combine,
        sets: &[Option<&'s Value>],
        limit: usize,
    ) -> Result<Vec<&'s [u8]>, StoreError> {
        let mut members: Vec<&BTreeSet<Vec<u8>>> = Vec::new();
        for s in sets.iter().flatten() {
            match s {
                Value::Set(s) => members.push(s),
                _ => return Err(not_kind()),
            }
        }
        let found: Vec<&[u8]> = match how {
            Combine::Inter if members.len() < sets.len() => Vec::new(),
            Combine::Inter => match members.split_first() {
                None => Vec::new(),
                Some((first, others)) => first
                    .iter()
                    .filter(|m| others.iter().all(|o| o.contains(*m)))
                    .map(Vec::as_slice)
                    .collect(),
            },
            Combine::Union => {
                let all: BTreeSet<&[u8]> = members
                    .iter()
                    .flat_map(|s| s.iter().map(Vec::as_slice))
                    .collect();
                all.into_iter().collect()
            }
            Combine::Diff => match sets.first() {
                Some(Some(Value::Set(first))) => {
                    let others: Vec<&BTreeSet<Vec<u8>>> = sets[1..]
                        .iter()
                        .flatten()
                        .filter_map(|v| match v {
                            Value::Set(s) => Some(s),
                            _ => None,
                        })
                        .collect();
                    first
                        .iter()
                        .filter(|m| !others.iter().any(|o| o.contains(*m)))
                        .map(Vec::as_slice)
                        .collect()
                }
                _ => Vec::new(),
            },
        };
        Ok(found.into_iter().take(limit).collect())
    }

    fn zscore(&self, c: &Value, member: &[u8]) -> Result<Option<f64>, StoreError> {
        let Value::ZSet(z) = c else {
            return Err(not_kind());
        };
        Ok(z.scores.get(member).copied())
    }

    fn zrank(&self, c: &Value, member: &[u8]) -> Result<Option<u64>, StoreError> {
        let Value::ZSet(z) = c else {
            return Err(not_kind());
        };
        Ok(z.ranked().position(|(m, _)| m == member).map(|r| r as u64))
    }

    fn zcount(&self, c: &Value, range: &ScoreRange) -> Result<u64, StoreError> {
        let Value::ZSet(z) = c else {
            return Err(not_kind());
        };
        Ok(z.ranked()
            .filter(|(_, s)| ZSet::in_scores(range, *s))
            .count() as u64)
    }

    fn zlexcount(&self, c: &Value, range: &LexRange) -> Result<u64, StoreError> {
        let Value::ZSet(z) = c else {
            return Err(not_kind());
        };
        Ok(z.scores.keys().filter(|m| ZSet::in_lex(range, m)).count() as u64)
    }

    fn zrange<'s>(
        &'s self,
        c: &'s Value,
        spec: &RangeSpec,
        mut each: impl FnMut(&'s [u8], f64),
    ) -> Result<(), StoreError> {
        let Value::ZSet(z) = c else {
            return Err(not_kind());
        };
        z.select(spec).into_iter().for_each(|(m, s)| each(m, s));
        Ok(())
    }

    fn zscan<'s>(
        &'s self,
        c: &'s Value,
        after: Option<&[u8]>,
        count: usize,
        each: impl FnMut(&'s [u8], f64),
    ) -> Result<Option<&'s [u8]>, StoreError> {
        let Value::ZSet(z) = c else {
            return Err(not_kind());
        };
        let items = z.scores.iter().map(|(m, s)| (m.as_slice(), *s));
        Ok(scan_page(items, after, count, each))
    }

    fn open_scored(&self, key: &[u8]) -> Result<Option<(Kind, &Value)>, ReadError> {
        match self.open(key, Kind::Set) {
            Ok(found) => Ok(found.map(|c| (Kind::Set, c))),
            Err(_) => self
                .open(key, Kind::ZSet)
                .map(|c| c.map(|c| (Kind::ZSet, c))),
        }
    }

    fn zcombine<'s>(
        &'s self,
        how: Combine,
        inputs: &[ZInput<&'s Value>],
        agg: Aggregate,
        mut each: impl FnMut(&'s [u8], f64) -> bool,
    ) -> Result<(), StoreError> {
        // Each input as (member, score) in member order; a set's members score 1.
        let mut scored: Vec<(BTreeMap<&'s [u8], f64>, f64)> = Vec::new();
        for i in inputs {
            let members: BTreeMap<&[u8], f64> = match i.coll {
                None => BTreeMap::new(),
                Some(Value::Set(s)) => s.iter().map(|m| (m.as_slice(), 1.0)).collect(),
                Some(Value::ZSet(z)) => z.scores.iter().map(|(m, s)| (m.as_slice(), *s)).collect(),
                Some(_) => return Err(not_kind()),
            };
            scored.push((members, i.weight));
        }
        // Union and intersection aggregate from the smallest input on (a stable sort).
        if how != Combine::Diff {
            scored.sort_by_key(|(m, _)| m.len());
        }
        let Some(((first, w1), others)) = scored.split_first() else {
            return Ok(());
        };
        match how {
            Combine::Inter => {
                for (m, s) in first {
                    let mut score = weighted(*s, *w1);
                    let mut everywhere = true;
                    for (o, w) in others {
                        match o.get(m) {
                            Some(s) => aggregate(&mut score, s * w, agg),
                            None => everywhere = false,
                        }
                    }
                    if everywhere && !each(m, score) {
                        break;
                    }
                }
            }
            Combine::Diff => {
                for (m, s) in first {
                    if !others.iter().any(|(o, _)| o.contains_key(m)) && !each(m, *s) {
                        break;
                    }
                }
            }
            Combine::Union => {
                let all: BTreeSet<&[u8]> =
                    scored.iter().flat_map(|(m, _)| m.keys().copied()).collect();
                for m in all {
                    let mut acc: Option<f64> = None;
                    for (input, w) in &scored {
                        if let Some(s) = input.get(m) {
                            let v = weighted(*s, *w);
                            match &mut acc {
                                None => acc = Some(v),
                                Some(a) => aggregate(a, v, agg),
                            }
                        }
                    }
                    if let Some(a) = acc
                        && !each(m, a)
                    {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}
