//! The rules of every write, as one match over `WriteOp`, pure apart from the `WriteView` it is
//! given: the LMDB store and the in-memory model run exactly this code.
//!
//! memcached's rules: append/prepend keep the old flags and expiry; touch and gat keep the CAS
//! unique; every other change takes a fresh one; incr wraps at 2^64, decr floors at 0, and a
//! shorter result keeps the old length padded with spaces (as memcached's in-place update does).

use crate::command::{
    ExpireCond, Expiry, KeyValue, Outcome, SetCond, StoreMode, ValueOut, WriteOp,
};
use crate::storage::{Edit, ItemMeta, Kind, StoreError, WriteView};

pub mod bits;
pub mod meta;

/// memcached's REALTIME_MAXDELTA: exptimes up to 30 days are relative, larger are unix times.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// Absolute expiry in unix ms for a memcached exptime (0 = never; negative = already expired).
pub fn expire_at(exptime: i64, now_ms: u64) -> u64 {
    if exptime == 0 {
        0
    } else if exptime < 0 {
        1
    } else if exptime <= REALTIME_MAXDELTA {
        now_ms.saturating_add(exptime as u64 * 1000)
    } else {
        (exptime as u64).saturating_mul(1000)
    }
}

/// When a `flush_all <delay>` takes effect: None for now, else the future unix ms. The delay
/// follows the exptime rule (relative up to 30 days, else a unix time).
pub fn flush_deadline(delay: i64, now_ms: u64) -> Option<u64> {
    let at = if delay <= 0 {
        0
    } else {
        expire_at(delay, now_ms)
    };
    (at > now_ms).then_some(at)
}

/// What a write needs besides the store: the time and the size limit.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    pub now_ms: u64,
    pub item_size_max: usize,
}

/// Applies one write. `Err` is a failure of the store; the caller decides what the client sees.
pub fn apply<S: WriteView>(s: &mut S, op: &WriteOp, ctx: Ctx) -> Result<Outcome, StoreError> {
    match apply_inner(s, op, ctx) {
        Err(StoreError::BadKey) => Ok(Outcome::BadKey),
        other => other,
    }
}

fn apply_inner<S: WriteView>(s: &mut S, op: &WriteOp, ctx: Ctx) -> Result<Outcome, StoreError> {
    match op {
        // Collections run on the LMDB store directly (`types`), never through a WriteView.
        WriteOp::Coll(_) => Ok(Outcome::Err(
            "ERR collections are not supported by this store",
        )),
        // Transactions run in the writer (`engine::writer`), which sees the LMDB store.
        WriteOp::Exec(_) => Ok(Outcome::Err(
            "ERR transactions are not supported by this store",
        )),
        // Scripts run in the writer, on its transaction.
        WriteOp::Script(_) => Ok(Outcome::Err("ERR scripts are not supported by this store")),
        // Reads for the writer run on its transaction.
        WriteOp::Read(_) => Ok(Outcome::Err("ERR reads are not supported by this store")),
        // Replication runs in the writer, on the LMDB store (`engine::repl`).
        WriteOp::Replicate(_) | WriteOp::ReplInstall(_) => Ok(Outcome::Err(
            "ERR replication is not supported by this store",
        )),
        // Blocking pops run in the writer, which holds their registry.
        WriteOp::Block { .. } => Ok(Outcome::Err(
            "ERR blocking commands are not supported by this store",
        )),
        WriteOp::Store {
            mode,
            kv,
            flags,
            exptime,
            cas,
        } => store(s, *mode, kv, *flags, *exptime, *cas, ctx),
        WriteOp::Delete { key } => {
            let live = live_meta(s, key, ctx.now_ms)?.is_some();
            if s.delete(key)? && live {
                Ok(Outcome::Deleted)
            } else {
                Ok(Outcome::NotFound)
            }
        }
        WriteOp::Arith { key, incr, delta } => arith(s, key, *incr, *delta, ctx),
        WriteOp::Touch { key, exptime } => {
            if touch(s, key, expire_at(*exptime, ctx.now_ms), ctx.now_ms)?.is_some() {
                Ok(Outcome::Touched)
            } else {
                Ok(Outcome::NotFound)
            }
        }
        WriteOp::Gat { keys, exptime } => {
            let at = expire_at(*exptime, ctx.now_ms);
            let mut out = Vec::new();
            let mut size = 0usize;
            for key in keys.split(|&b| b == b' ').filter(|k| !k.is_empty()) {
                match s.get(key)?.filter(|i| !i.meta.is_expired(ctx.now_ms)) {
                    Some(i) if i.meta.kind != Kind::String => return Ok(Outcome::WrongType),
                    Some(i) => size = size.saturating_add(i.value.len()),
                    None => {}
                }
            }
            if size > crate::command::REPLY_MAX {
                return Ok(Outcome::Err(
                    "SERVER_ERROR out of memory writing get response",
                ));
            }
            for key in keys.split(|&b| b == b' ').filter(|k| !k.is_empty()) {
                if let Some(v) = touch(s, key, at, ctx.now_ms)? {
                    out.push(v);
                }
            }
            Ok(Outcome::Values(out))
        }
        WriteOp::Set {
            kv,
            cond,
            expiry,
            get,
        } => resp_set(s, kv, *cond, *expiry, *get, ctx),
        WriteOp::IncrBy { key, delta } => incr_by(s, key, *delta, ctx),
        WriteOp::IncrByFloat { key, delta } => incr_by_float(s, key, delta, ctx),
        WriteOp::Append { kv, max } => set_range(s, kv.key(), None, kv.value(), *max, ctx),
        WriteOp::SetRange { kv, offset, max } => {
            set_range(s, kv.key(), Some(*offset), kv.value(), *max, ctx)
        }
        WriteOp::SetBit {
            key,
            offset,
            on,
            max,
        } => bits::set_bit_op(s, key, *offset, *on, *max, ctx),
        WriteOp::BitField { key, ops, max } => bits::bit_field(s, key, ops, *max, ctx),
        WriteOp::BitOp { op, dest, srcs } => bits::bit_op(s, *op, dest, srcs, ctx),
        WriteOp::GetDel { key } => match live(s, key, ctx.now_ms)? {
            None => Ok(Outcome::Nil),
            Some((meta, _)) if meta.kind != Kind::String => Ok(Outcome::WrongType),
            Some((_, value)) => {
                s.delete(key)?;
                Ok(Outcome::Bulk(value))
            }
        },
        WriteOp::GetEx { key, expiry } => match live(s, key, ctx.now_ms)? {
            None => Ok(Outcome::Nil),
            Some((meta, _)) if meta.kind != Kind::String => Ok(Outcome::WrongType),
            Some((mut meta, value)) => {
                let at = match expiry {
                    Expiry::Keep => meta.expire_at,
                    Expiry::Clear => 0,
                    Expiry::At(at) => *at,
                };
                if at != meta.expire_at {
                    if at != 0 && at <= ctx.now_ms {
                        s.delete(key)?;
                    } else {
                        meta.expire_at = at;
                        s.put(key, &meta, &[&value])?;
                    }
                }
                Ok(Outcome::Bulk(value))
            }
        },
        WriteOp::MSet { kvs, nx } => {
            if *nx {
                for kv in kvs {
                    if live_meta(s, kv.key(), ctx.now_ms)?.is_some() {
                        return Ok(Outcome::Int(0));
                    }
                }
            }
            for kv in kvs {
                let meta = ItemMeta::string(s.next_cas());
                s.put(kv.key(), &meta, &[kv.value()])?;
            }
            Ok(if *nx { Outcome::Int(1) } else { Outcome::Done })
        }
        WriteOp::Del { keys } => {
            let mut n = 0;
            for key in keys {
                let was_live = live_meta(s, key, ctx.now_ms)?.is_some();
                if s.delete(key)? && was_live {
                    n += 1;
                }
            }
            Ok(Outcome::Int(n))
        }
        WriteOp::Expire { key, at_ms, cond } => {
            let Some((mut meta, value)) = live(s, key, ctx.now_ms)? else {
                return Ok(Outcome::Int(0));
            };
            let current = meta.expire_at;
            let apply = match cond {
                ExpireCond::Always => true,
                ExpireCond::Nx => current == 0,
                ExpireCond::Xx => current != 0,
                // No expiry counts as an infinitely late one.
                ExpireCond::Gt => current != 0 && *at_ms > current,
                ExpireCond::Lt => current == 0 || *at_ms < current,
                ExpireCond::XxLt => current != 0 && *at_ms < current,
            };
            if !apply {
                return Ok(Outcome::Int(0));
            }
            if *at_ms <= ctx.now_ms {
                s.delete(key)?;
            } else {
                meta.expire_at = *at_ms;
                s.put(key, &meta, &[&value])?;
            }
            Ok(Outcome::Int(1))
        }
        WriteOp::Persist { key } => match live(s, key, ctx.now_ms)? {
            Some((mut meta, value)) if meta.expire_at != 0 => {
                meta.expire_at = 0;
                s.put(key, &meta, &[&value])?;
                Ok(Outcome::Int(1))
            }
            _ => Ok(Outcome::Int(0)),
        },
        WriteOp::Rename { from, to, nx } => {
            let Some((mut meta, value)) = live(s, from, ctx.now_ms)? else {
                return Ok(Outcome::Err("ERR no such key"));
            };
            if *nx && live_meta(s, to, ctx.now_ms)?.is_some() {
                return Ok(Outcome::Int(0));
            }
            if from != to {
                meta.cas = s.next_cas();
                s.put(to, &meta, &[&value])?;
                // The elements of a collection stay where they are: they follow its id.
                s.take(from)?;
            }
            Ok(if *nx { Outcome::Int(1) } else { Outcome::Done })
        }
        WriteOp::Meta(op) => meta::apply(s, op, ctx),
        WriteOp::FlushAll { delay } => {
            match flush_deadline(*delay, ctx.now_ms) {
                None => s.clear()?,
                Some(at) => s.schedule_flush(at)?,
            }
            Ok(Outcome::Done)
        }
    }
}

fn live_meta<S: WriteView>(s: &S, key: &[u8], now: u64) -> Result<Option<ItemMeta>, StoreError> {
    Ok(s.get(key)?.map(|i| i.meta).filter(|m| !m.is_expired(now)))
}

fn store<S: WriteView>(
    s: &mut S,
    mode: StoreMode,
    kv: &KeyValue,
    flags: u32,
    exptime: i64,
    cas_in: u64,
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    let key = kv.key();
    let fresh = |s: &mut S| {
        ItemMeta::new(
            Kind::String,
            flags,
            expire_at(exptime, ctx.now_ms),
            s.next_cas(),
        )
    };
    match mode {
        StoreMode::Set => {}
        StoreMode::Add => {
            if live_meta(s, key, ctx.now_ms)?.is_some() {
                return Ok(Outcome::NotStored);
            }
        }
        StoreMode::Replace => {
            if live_meta(s, key, ctx.now_ms)?.is_none() {
                return Ok(Outcome::NotStored);
            }
        }
        StoreMode::Cas => match live_meta(s, key, ctx.now_ms)? {
            None => return Ok(Outcome::NotFound),
            Some(m) if m.cas != cas_in => return Ok(Outcome::Exists),
            Some(_) => {}
        },
        StoreMode::Append | StoreMode::Prepend => {
            let Some(item) = s.get(key)?.filter(|i| !i.meta.is_expired(ctx.now_ms)) else {
                return Ok(Outcome::NotStored);
            };
            if item.meta.kind != Kind::String {
                return Ok(Outcome::WrongType);
            }
            if item.value.len() + kv.value().len() > ctx.item_size_max {
                return Ok(Outcome::TooLarge);
            }
            let old_len = item.value.len();
            let old_meta = item.meta;
            let mut meta = item.meta;
            meta.cas = s.next_cas();
            let data = kv.value();
            let edit = if mode == StoreMode::Append {
                Edit::append(old_len, data.len())
            } else {
                Edit::prepend(data.len())
            };
            s.edit(key, &old_meta, &meta, data, &edit)?;
            return Ok(Outcome::Stored);
        }
    }
    let meta = fresh(s);
    s.put(key, &meta, &[kv.value()])?;
    Ok(Outcome::Stored)
}

/// A live item's meta and a copy of its value.
pub(super) fn live<S: WriteView>(
    s: &S,
    key: &[u8],
    now: u64,
) -> Result<Option<(ItemMeta, Vec<u8>)>, StoreError> {
    Ok(s.get(key)?
        .filter(|i| !i.meta.is_expired(now))
        .map(|i| (i.meta, i.value.to_vec())))
}

/// RESP SET: a fresh item (flags 0, a new CAS) replaces the old one, whatever it held.
fn resp_set<S: WriteView>(
    s: &mut S,
    kv: &KeyValue,
    cond: SetCond,
    expiry: Expiry,
    get: bool,
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    let old = live(s, kv.key(), ctx.now_ms)?;
    if get && old.as_ref().is_some_and(|(m, _)| m.kind != Kind::String) {
        return Ok(Outcome::WrongType);
    }
    let apply = match cond {
        SetCond::Always => true,
        SetCond::Nx => old.is_none(),
        SetCond::Xx => old.is_some(),
    };
    let old_reply = |old: Option<(ItemMeta, Vec<u8>)>| match old {
        Some((_, v)) => Outcome::Bulk(v),
        None => Outcome::Nil,
    };
    if !apply {
        return Ok(if get { old_reply(old) } else { Outcome::Nil });
    }
    let expire_at = match expiry {
        Expiry::Keep => old.as_ref().map_or(0, |(m, _)| m.expire_at),
        Expiry::Clear => 0,
        Expiry::At(at) => at,
    };
    let meta = ItemMeta::new(Kind::String, 0, expire_at, s.next_cas());
    s.put(kv.key(), &meta, &[kv.value()])?;
    Ok(if get { old_reply(old) } else { Outcome::Done })
}

const NOT_INTEGER: &str = "ERR value is not an integer or out of range";

/// INCRBY: a missing key counts as 0; the item keeps its flags and expiry.
fn incr_by<S: WriteView>(
    s: &mut S,
    key: &[u8],
    delta: i64,
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    let (mut meta, n) = match s.get(key)?.filter(|i| !i.meta.is_expired(ctx.now_ms)) {
        None => (ItemMeta::string(0), 0),
        Some(item) if item.meta.kind != Kind::String => return Ok(Outcome::WrongType),
        Some(item) => match crate::int::parse_i64(item.value) {
            Some(n) => (item.meta, n),
            None => return Ok(Outcome::Err(NOT_INTEGER)),
        },
    };
    let Some(new) = n.checked_add(delta) else {
        return Ok(Outcome::Err("ERR increment or decrement would overflow"));
    };
    meta.cas = s.next_cas();
    s.put(key, &meta, &[itoa::Buffer::new().format(new).as_bytes()])?;
    Ok(Outcome::Int(new))
}

/// Parses a float argument or stored value as Redis does (strtold: no spaces, no NaN).
pub fn parse_float(b: &[u8]) -> Option<f64> {
    let t = std::str::from_utf8(b).ok()?;
    if t.is_empty()
        || t.starts_with(|c: char| c.is_whitespace())
        || t.ends_with(|c: char| c.is_whitespace())
    {
        return None;
    }
    let v: f64 = match t.to_ascii_lowercase().as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => f64::INFINITY,
        "-inf" | "-infinity" => f64::NEG_INFINITY,
        _ => t.parse().ok()?,
    };
    (!v.is_nan()).then_some(v)
}

fn incr_by_float<S: WriteView>(
    s: &mut S,
    key: &[u8],
    delta: &[u8],
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    let (mut meta, old) = match s.get(key)?.filter(|i| !i.meta.is_expired(ctx.now_ms)) {
        None => (ItemMeta::string(0), b"0".to_vec()),
        Some(item) if item.meta.kind != Kind::String => return Ok(Outcome::WrongType),
        Some(item) => (item.meta, item.value.to_vec()),
    };
    let text = match crate::float::add(&old, delta) {
        Ok(text) => text,
        Err(crate::float::AddError::NotFinite) => {
            return Ok(Outcome::Err("ERR increment would produce NaN or Infinity"));
        }
        Err(_) => return Ok(Outcome::Err("ERR value is not a valid float")),
    };
    meta.cas = s.next_cas();
    s.put(key, &meta, &[&text])?;
    Ok(Outcome::Bulk(text))
}

/// APPEND (`offset` None) and SETRANGE: write `data` into the string, creating it (and
/// zero-padding) as needed, up to `max` bytes (RESP's `proto_max_bulk_len`, not memcached's
/// item size); the item keeps its flags and expiry. Answers the new length.
fn set_range<S: WriteView>(
    s: &mut S,
    key: &[u8],
    offset: Option<usize>,
    data: &[u8],
    max: usize,
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    // The old item's meta and length only: `edit` builds the new value from the old one where
    // it lies, so an APPEND to a large value copies it once, not twice.
    let existing = s
        .get(key)?
        .filter(|i| !i.meta.is_expired(ctx.now_ms))
        .map(|i| (i.meta, i.value.len()));
    if existing.is_some_and(|(m, _)| m.kind != Kind::String) {
        return Ok(Outcome::WrongType);
    }
    let old_len = existing.map_or(0, |(_, n)| n);
    let at = offset.unwrap_or(old_len);
    if offset.is_some() && data.is_empty() {
        // SETRANGE with nothing to write changes nothing, and creates nothing.
        return Ok(Outcome::Int(old_len as i64));
    }
    let new_len = old_len.max(at + data.len());
    if new_len > max {
        return Ok(Outcome::Err(
            "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
        ));
    }
    let (mut meta, existed) = match existing {
        Some((m, _)) => (m, true),
        None => (ItemMeta::string(0), false),
    };
    let old_meta = meta;
    meta.cas = s.next_cas();
    if existed {
        s.edit(key, &old_meta, &meta, data, &Edit::write(at, data.len()))?;
    } else {
        // A new key: zeros up to `at` (SETRANGE), then the data.
        let mut value = vec![0; at];
        value.extend_from_slice(data);
        s.put(key, &meta, &[&value])?;
    }
    Ok(Outcome::Int(new_len as i64))
}

/// Parses a stored counter as memcached does: optional surrounding whitespace, then decimal
/// digits that fit a u64.
pub fn parse_counter(v: &[u8]) -> Option<u64> {
    let t = v.trim_ascii();
    if t.is_empty() || t.len() > 20 || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

fn arith<S: WriteView>(
    s: &mut S,
    key: &[u8],
    incr: bool,
    delta: u64,
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    let Some(item) = s.get(key)?.filter(|i| !i.meta.is_expired(ctx.now_ms)) else {
        return Ok(Outcome::NotFound);
    };
    if item.meta.kind != Kind::String {
        return Ok(Outcome::WrongType);
    }
    let Some(n) = parse_counter(item.value) else {
        return Ok(Outcome::NonNumeric);
    };
    let old_len = item.value.len();
    let mut meta = item.meta;
    let new = if incr {
        n.wrapping_add(delta)
    } else {
        n.saturating_sub(delta)
    };
    let mut text = new.to_string().into_bytes();
    if text.len() < old_len {
        text.resize(old_len, b' ');
    }
    meta.cas = s.next_cas();
    s.put(key, &meta, &[&text])?;
    Ok(Outcome::Number(new))
}

/// Sets a live item's expiry, keeping its value and CAS; returns it, or None when absent.
fn touch<S: WriteView>(
    s: &mut S,
    key: &[u8],
    at: u64,
    now: u64,
) -> Result<Option<ValueOut>, StoreError> {
    let Some(item) = s.get(key)?.filter(|i| !i.meta.is_expired(now)) else {
        return Ok(None);
    };
    let mut meta = item.meta;
    let value = item.value.to_vec();
    meta.expire_at = at;
    s.put(key, &meta, &[&value])?;
    Ok(Some(ValueOut {
        key: key.to_vec(),
        flags: meta.flags,
        cas: meta.cas,
        value,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ReadView;
    use crate::storage::model::ModelStore;

    const NOW: u64 = 1_700_000_000_000;

    fn ctx() -> Ctx {
        Ctx {
            now_ms: NOW,
            item_size_max: 1024,
        }
    }

    fn set(
        s: &mut ModelStore,
        mode: StoreMode,
        k: &str,
        v: &str,
        exptime: i64,
        cas: u64,
    ) -> Outcome {
        let op = WriteOp::Store {
            mode,
            kv: KeyValue::new(k.as_bytes(), v.as_bytes()),
            flags: 3,
            exptime,
            cas,
        };
        apply(s, &op, ctx()).expect("model never fails")
    }

    fn value(s: &ModelStore, k: &str) -> Option<Vec<u8>> {
        s.get(k.as_bytes())
            .expect("get")
            .filter(|i| !i.meta.is_expired(NOW))
            .map(|i| i.value.to_vec())
    }

    #[test]
    fn exptime_rule_matches_memcached() {
        assert_eq!(expire_at(0, NOW), 0);
        assert_eq!(expire_at(-1, NOW), 1);
        assert_eq!(expire_at(10, NOW), NOW + 10_000);
        assert_eq!(
            expire_at(REALTIME_MAXDELTA, NOW),
            NOW + REALTIME_MAXDELTA as u64 * 1000
        );
        assert_eq!(
            expire_at(REALTIME_MAXDELTA + 1, NOW),
            (REALTIME_MAXDELTA as u64 + 1) * 1000
        );
    }

    #[test]
    fn add_and_replace_depend_on_a_live_item() {
        let mut s = ModelStore::default();
        assert_eq!(
            set(&mut s, StoreMode::Replace, "k", "a", 0, 0),
            Outcome::NotStored
        );
        assert_eq!(set(&mut s, StoreMode::Add, "k", "a", 0, 0), Outcome::Stored);
        assert_eq!(
            set(&mut s, StoreMode::Add, "k", "b", 0, 0),
            Outcome::NotStored
        );
        assert_eq!(
            set(&mut s, StoreMode::Replace, "k", "c", 0, 0),
            Outcome::Stored
        );
        assert_eq!(value(&s, "k"), Some(b"c".to_vec()));
        // An expired item counts as absent.
        assert_eq!(
            set(&mut s, StoreMode::Set, "e", "x", -1, 0),
            Outcome::Stored
        );
        assert_eq!(set(&mut s, StoreMode::Add, "e", "y", 0, 0), Outcome::Stored);
    }

    #[test]
    fn append_prepend_keep_flags_and_expiry() {
        let mut s = ModelStore::default();
        assert_eq!(
            set(&mut s, StoreMode::Append, "k", "x", 0, 0),
            Outcome::NotStored
        );
        set(&mut s, StoreMode::Set, "k", "mid", 100, 0);
        let before = s.get(b"k").expect("get").expect("present").meta;
        let op = WriteOp::Store {
            mode: StoreMode::Append,
            kv: KeyValue::new(b"k", b">"),
            flags: 9,
            exptime: 0,
            cas: 0,
        };
        assert_eq!(apply(&mut s, &op, ctx()).expect("ok"), Outcome::Stored);
        set(&mut s, StoreMode::Prepend, "k", "<", 0, 0);
        let after = s.get(b"k").expect("get").expect("present");
        assert_eq!(after.value, b"<mid>");
        assert_eq!(after.meta.flags, before.flags);
        assert_eq!(after.meta.expire_at, before.expire_at);
        assert!(after.meta.cas > before.cas);
    }

    #[test]
    fn append_beyond_item_limit_is_refused() {
        let mut s = ModelStore::default();
        set(&mut s, StoreMode::Set, "k", &"a".repeat(1000), 0, 0);
        assert_eq!(
            set(&mut s, StoreMode::Append, "k", &"b".repeat(100), 0, 0),
            Outcome::TooLarge
        );
        assert_eq!(value(&s, "k").map(|v| v.len()), Some(1000));
    }

    #[test]
    fn cas_checks_the_unique() {
        let mut s = ModelStore::default();
        assert_eq!(
            set(&mut s, StoreMode::Cas, "k", "a", 0, 1),
            Outcome::NotFound
        );
        set(&mut s, StoreMode::Set, "k", "a", 0, 0);
        let cas = s.get(b"k").expect("get").expect("present").meta.cas;
        assert_eq!(
            set(&mut s, StoreMode::Cas, "k", "b", 0, cas + 1),
            Outcome::Exists
        );
        assert_eq!(
            set(&mut s, StoreMode::Cas, "k", "b", 0, cas),
            Outcome::Stored
        );
        assert_eq!(
            set(&mut s, StoreMode::Cas, "k", "c", 0, cas),
            Outcome::Exists
        );
    }

    #[test]
    fn incr_wraps_decr_floors_and_pads() {
        let mut s = ModelStore::default();
        let arith = |s: &mut ModelStore, k: &str, incr, delta| {
            apply(
                s,
                &WriteOp::Arith {
                    key: k.as_bytes().to_vec(),
                    incr,
                    delta,
                },
                ctx(),
            )
            .expect("ok")
        };
        assert_eq!(arith(&mut s, "n", true, 1), Outcome::NotFound);
        set(&mut s, StoreMode::Set, "n", "18446744073709551615", 0, 0);
        assert_eq!(arith(&mut s, "n", true, 1), Outcome::Number(0));
        set(&mut s, StoreMode::Set, "n", "5", 0, 0);
        assert_eq!(arith(&mut s, "n", false, 9), Outcome::Number(0));
        set(&mut s, StoreMode::Set, "n", "100", 0, 0);
        assert_eq!(arith(&mut s, "n", false, 1), Outcome::Number(99));
        assert_eq!(value(&s, "n"), Some(b"99 ".to_vec()));
        assert_eq!(arith(&mut s, "n", true, 1), Outcome::Number(100));
        set(&mut s, StoreMode::Set, "n", "x1", 0, 0);
        assert_eq!(arith(&mut s, "n", true, 1), Outcome::NonNumeric);
    }

    #[test]
    fn touch_and_gat_keep_cas_and_set_expiry() {
        let mut s = ModelStore::default();
        set(&mut s, StoreMode::Set, "k", "v", 0, 0);
        let cas = s.get(b"k").expect("get").expect("present").meta.cas;
        let out = apply(
            &mut s,
            &WriteOp::Gat {
                keys: b"k missing".to_vec(),
                exptime: 5,
            },
            ctx(),
        )
        .expect("ok");
        assert_eq!(
            out,
            Outcome::Values(vec![ValueOut {
                key: b"k".to_vec(),
                flags: 3,
                cas,
                value: b"v".to_vec()
            }])
        );
        assert_eq!(
            s.get(b"k").expect("get").expect("present").meta.expire_at,
            NOW + 5000
        );
        let t = apply(
            &mut s,
            &WriteOp::Touch {
                key: b"nope".to_vec(),
                exptime: 1,
            },
            ctx(),
        )
        .expect("ok");
        assert_eq!(t, Outcome::NotFound);
    }

    #[test]
    fn delete_of_expired_item_is_not_found() {
        let mut s = ModelStore::default();
        set(&mut s, StoreMode::Set, "k", "v", -1, 0);
        let d = apply(&mut s, &WriteOp::Delete { key: b"k".to_vec() }, ctx()).expect("ok");
        assert_eq!(d, Outcome::NotFound);
        set(&mut s, StoreMode::Set, "k", "v", 0, 0);
        let d = apply(&mut s, &WriteOp::Delete { key: b"k".to_vec() }, ctx()).expect("ok");
        assert_eq!(d, Outcome::Deleted);
    }

    #[test]
    fn counters_parse_like_strtoull() {
        assert_eq!(parse_counter(b"42"), Some(42));
        assert_eq!(parse_counter(b"99 "), Some(99));
        assert_eq!(parse_counter(b""), None);
        assert_eq!(parse_counter(b"-1"), None);
        assert_eq!(parse_counter(b"18446744073709551616"), None);
    }
}
