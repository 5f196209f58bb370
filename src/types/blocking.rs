//! Pops that may block (BLPOP, BRPOP, BRPOPLPUSH, BLMOVE, BLMPOP, BZPOPMIN, BZPOPMAX, BZMPOP)
//! and their multi-key non-blocking forms (LMPOP, ZMPOP): one `PopForm` per request, which the
//! writer tries against its transaction (`try_all`, `try_key`), and the replies. Redis 7.0's
//! argument rules, which make the `PopForm`, are `crate::commands::blocking`'s.
//!
//! A blocking pop that finds an element is answered at once, as the write it is. One that
//! finds nothing waits in `engine::blocking`'s registry until a write feeds one of its keys,
//! its timeout passes, or CLIENT UNBLOCK; inside MULTI (and as LMPOP/ZMPOP) it never waits and
//! answers what a timeout would (BLMOVE and BRPOPLPUSH: a null bulk there, as Redis does).
//!
//! Rules pinned against redis-server 7.0.15 (`proto/resp/blocking.txt`):
//! - keys are tried left to right and the first key that exists decides: a list (or sorted
//!   set) pops, anything else is WRONGTYPE, even if a later key could pop;
//! - the timeout is seconds as a float, `0` waits forever; negative (or beyond what a 64-bit
//!   count of milliseconds holds, infinity included) is `ERR timeout is negative`; a timeout
//!   above 0 but under a millisecond still times out (Redis rounds it to nothing only when not
//!   positive: `-0.0005` waits forever, as there);
//! - BLMPOP/BZMPOP check numkeys, the keys' count, the direction and COUNT before the timeout;
//! - a waiter served later is served from the key that was fed, even if an earlier key of its
//!   request exists meanwhile with another type (WRONGTYPE waiters stay blocked), except that a
//!   BLMOVE whose destination now holds another type is answered WRONGTYPE and its element
//!   stays where it was.

use super::list::{self, ListOp};
use super::zset::{self, ZSetOp};
use super::{Found, Tx};
use crate::outcome::Outcome;
use crate::storage::lmdb::LmdbWrite;
use crate::storage::{Kind, StoreError};

/// What one pop request pops, and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PopForm {
    /// BLPOP/BRPOP (`count` None: answers `[key, element]`) and BLMPOP/LMPOP (`count` Some:
    /// up to that many, answering `[key, [elements]]`).
    List {
        keys: Vec<Vec<u8>>,
        left: bool,
        count: Option<u64>,
    },
    /// BLMOVE/BRPOPLPUSH: answers the element moved.
    Move {
        src: Vec<u8>,
        dst: Vec<u8>,
        from_left: bool,
        to_left: bool,
    },
    /// BZPOPMIN/BZPOPMAX (`count` None: `[key, member, score]`) and BZMPOP/ZMPOP (`count`
    /// Some: `[key, [[member, score], ...]]`, nested in RESP2 too).
    ZSet {
        keys: Vec<Vec<u8>>,
        max: bool,
        count: Option<u64>,
    },
}

/// What trying one key came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Try {
    /// Popped (or, for BLMOVE into a key of another type, refused): the reply.
    Popped(Outcome),
    /// The key is missing: nothing to pop there.
    Empty,
    /// The key holds another type.
    WrongType,
}

impl PopForm {
    /// The keys the pop waits on, in the request's order.
    pub fn for_each_wait_key(&self, f: &mut dyn FnMut(&[u8])) {
        match self {
            PopForm::List { keys, .. } | PopForm::ZSet { keys, .. } => {
                keys.iter().for_each(|k| f(k))
            }
            PopForm::Move { src, .. } => f(src),
        }
    }

    /// The keys the pop waits on, in the request's order.
    pub fn wait_keys(&self) -> Vec<&[u8]> {
        match self {
            PopForm::List { keys, .. } | PopForm::ZSet { keys, .. } => {
                keys.iter().map(|k| &k[..]).collect()
            }
            PopForm::Move { src, .. } => vec![src],
        }
    }

    /// Every key the pop may change.
    pub fn for_each_key(&self, f: &mut dyn FnMut(&[u8])) {
        self.for_each_wait_key(f);
        if let PopForm::Move { dst, .. } = self {
            f(dst);
        }
    }

    /// The key a successful pop may have fed (BLMOVE's destination).
    pub fn fed(&self) -> Option<&[u8]> {
        match self {
            PopForm::Move { dst, .. } => Some(dst),
            _ => None,
        }
    }

    /// The reply when nothing could be popped and the pop may not wait (inside MULTI, LMPOP,
    /// ZMPOP).
    pub fn nothing(&self) -> Outcome {
        match self {
            PopForm::Move { .. } => Outcome::Nil,
            _ => Outcome::NilArray,
        }
    }
}

/// The reply to a blocking pop whose time ran out (CLIENT UNBLOCK's default too): a null array,
/// for every form.
pub const TIMED_OUT: Outcome = Outcome::NilArray;
/// CLIENT UNBLOCK ... ERROR.
pub const UNBLOCKED: Outcome = Outcome::Err("UNBLOCKED client unblocked via CLIENT UNBLOCK");

/// Tries the pop on `key`, one of the form's keys, in the writer's transaction.
pub fn try_key(
    w: &mut LmdbWrite<'_, '_>,
    form: &PopForm,
    key: &[u8],
    now: u64,
) -> Result<Try, StoreError> {
    let kind = match form {
        PopForm::ZSet { .. } => Kind::ZSet,
        _ => Kind::List,
    };
    match (Tx { w: &mut *w, now }).find(key, kind)? {
        Found::Missing => return Ok(Try::Empty),
        Found::WrongType => return Ok(Try::WrongType),
        Found::Coll(..) => {}
    }
    let name = || Outcome::Bulk(key.to_vec());
    let out = match form {
        PopForm::List { left, count, .. } => {
            let op = ListOp::Pop {
                key: key.to_vec(),
                left: *left,
                count: *count,
            };
            match list::apply(w, &op, now)? {
                v @ (Outcome::Bulk(_) | Outcome::Array(_)) => Outcome::Array(vec![name(), v]),
                other => other,
            }
        }
        PopForm::Move {
            dst,
            from_left,
            to_left,
            ..
        } => {
            let op = ListOp::Move {
                src: key.to_vec(),
                dst: dst.clone(),
                from_left: *from_left,
                to_left: *to_left,
            };
            list::apply(w, &op, now)?
        }
        PopForm::ZSet { max, count, .. } => {
            let op = ZSetOp::Pop {
                key: key.to_vec(),
                max: *max,
                count: *count,
            };
            match zset::apply(w, &op, now)? {
                Outcome::Array(flat) if count.is_none() => {
                    let mut v = vec![name()];
                    v.extend(flat);
                    Outcome::Array(v)
                }
                Outcome::Pairs(pairs) => Outcome::Array(vec![
                    name(),
                    Outcome::Array(
                        pairs
                            .into_iter()
                            .map(|(m, s)| Outcome::Array(vec![m, s]))
                            .collect(),
                    ),
                ]),
                other => other,
            }
        }
    };
    Ok(Try::Popped(out))
}

/// Tries the form's keys left to right: the first that exists decides (its pop, or
/// WRONGTYPE). None: every key is missing.
pub fn try_all(
    w: &mut LmdbWrite<'_, '_>,
    form: &PopForm,
    now: u64,
) -> Result<Option<Outcome>, StoreError> {
    for key in form.wait_keys() {
        match try_key(w, form, key, now)? {
            Try::Empty => continue,
            Try::WrongType => return Ok(Some(Outcome::WrongType)),
            Try::Popped(o) => return Ok(Some(o)),
        }
    }
    Ok(None)
}

/// A pop that may not wait (LMPOP, ZMPOP, a blocking pop inside MULTI).
pub fn apply(w: &mut LmdbWrite<'_, '_>, form: &PopForm, now: u64) -> Result<Outcome, StoreError> {
    Ok(try_all(w, form, now)?.unwrap_or_else(|| form.nothing()))
}
