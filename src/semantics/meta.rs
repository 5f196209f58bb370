//! The rules of memcached's meta commands (`ms`, `md`, `ma`, and `mg` when it changes the item),
//! as memcached 1.6 applies them; the binary protocol's writes are special cases of these.
//!
//! Stale items and win tokens: `md I` (or `ms I` with an older CAS) marks an item stale; the
//! first `mg` of a stale item wins the right to recache it (`W`) and later fetches see `Z`.
//! `mg N` creates an empty item on a miss and wins for its caller; `mg R` wins when less TTL
//! than asked remains. Both marks are stored with the item, so they survive restarts.

use super::{Ctx, expire_at, live, parse_counter};
use crate::command::{MetaCode, MetaItem, MetaOp, MetaOut, MetaStore, Outcome, StoreMode};
use crate::storage::{Edit, ItemMeta, Kind, StoreError, WriteView};

pub(super) fn apply<S: WriteView>(s: &mut S, op: &MetaOp, ctx: Ctx) -> Result<Outcome, StoreError> {
    match op {
        MetaOp::Store(a) => store(s, a, ctx),
        MetaOp::Delete {
            key,
            compare,
            invalidate,
            exptime,
            keep,
            new_cas,
        } => {
            let Some((mut meta, value)) = live(s, key, ctx.now_ms)? else {
                return Ok(code(MetaCode::NotFound));
            };
            if compare.is_some_and(|c| c != meta.cas) {
                return Ok(code(MetaCode::Exists));
            }
            if !*invalidate && !*keep {
                s.delete(key)?;
                return Ok(code(MetaCode::Ok));
            }
            if meta.kind != Kind::String {
                return Ok(Outcome::WrongType);
            }
            meta.cas = new_cas.unwrap_or_else(|| s.next_cas());
            if *invalidate {
                meta.stale = true;
                meta.win_sent = false;
                if let Some(t) = exptime {
                    meta.expire_at = expire_at(*t, ctx.now_ms);
                }
            }
            let value: &[u8] = if *keep { b"" } else { &value };
            s.put(key, &meta, &[value])?;
            Ok(code(MetaCode::Ok))
        }
        MetaOp::Arith {
            key,
            incr,
            delta,
            compare,
            vivify,
            initial,
            exptime,
            new_cas,
        } => {
            let Some((mut meta, value)) = live(s, key, ctx.now_ms)? else {
                let Some(ttl) = vivify else {
                    return Ok(code(MetaCode::NotFound));
                };
                let cas = new_cas.unwrap_or_else(|| s.next_cas());
                let meta = ItemMeta::new(Kind::String, 0, expire_at(*ttl, ctx.now_ms), cas);
                let text = initial.to_string().into_bytes();
                s.put(key, &meta, &[&text])?;
                return Ok(created(hit(&meta, 0, text)));
            };
            if meta.kind != Kind::String {
                return Ok(Outcome::WrongType);
            }
            if compare.is_some_and(|c| c != meta.cas) {
                return Ok(code(MetaCode::Exists));
            }
            let Some(n) = parse_counter(&value) else {
                return Ok(Outcome::NonNumeric);
            };
            let new = if *incr {
                n.wrapping_add(*delta)
            } else {
                n.saturating_sub(*delta)
            };
            let text = new.to_string().into_bytes();
            // Stored as the classic incr stores it: a shorter number keeps the old length.
            let mut stored = text.clone();
            if stored.len() < value.len() {
                stored.resize(value.len(), b' ');
            }
            let before = meta.expire_at;
            meta.cas = new_cas.unwrap_or_else(|| s.next_cas());
            if let Some(t) = exptime {
                meta.expire_at = expire_at(*t, ctx.now_ms);
            }
            s.put(key, &meta, &[&stored])?;
            Ok(hit(&meta, before, text))
        }
        MetaOp::Get {
            key,
            touch,
            vivify,
            recache,
            new_cas,
        } => {
            let Some((mut meta, value)) = live(s, key, ctx.now_ms)? else {
                let Some(ttl) = vivify else {
                    return Ok(code(MetaCode::Miss));
                };
                let cas = new_cas.unwrap_or_else(|| s.next_cas());
                let mut meta = ItemMeta::new(Kind::String, 0, expire_at(*ttl, ctx.now_ms), cas);
                meta.win_sent = true;
                s.put(key, &meta, &[b""])?;
                let mut out = created(hit(&meta, 0, Vec::new()));
                set_win(&mut out, true, false);
                return Ok(out);
            };
            if meta.kind != Kind::String {
                return Ok(Outcome::WrongType);
            }
            let was_sent = meta.win_sent;
            let wants_win = meta.stale
                || recache.is_some_and(|r| {
                    meta.expire_at != 0 && ttl_secs(meta.expire_at, ctx.now_ms) < r
                });
            let won = wants_win && !was_sent;
            let before = meta.expire_at;
            let mut changed = false;
            if won {
                meta.win_sent = true;
                changed = true;
            }
            if let Some(t) = touch {
                meta.expire_at = expire_at(*t, ctx.now_ms);
                changed = true;
            }
            if changed {
                s.put(key, &meta, &[&value])?;
            }
            let mut out = hit(&meta, before, value);
            set_win(&mut out, won, was_sent);
            Ok(out)
        }
    }
}

/// Seconds of TTL left, rounded up as memcached's second clock shows it; -1 for no expiry.
pub fn ttl_secs(expire_at: u64, now_ms: u64) -> i64 {
    if expire_at == 0 {
        -1
    } else {
        (expire_at.saturating_sub(now_ms).div_ceil(1000)) as i64
    }
}

fn code(code: MetaCode) -> Outcome {
    Outcome::Meta(Box::new(MetaOut { code, item: None }))
}

/// A success reporting on the item: `expire_at` is the expiry before the command's TTL change.
fn hit(meta: &ItemMeta, expire_at: u64, value: Vec<u8>) -> Outcome {
    Outcome::Meta(Box::new(MetaOut {
        code: MetaCode::Ok,
        item: Some(MetaItem {
            created: false,
            flags: meta.flags,
            cas: meta.cas,
            expire_at,
            value,
            stale: meta.stale,
            won: false,
            win_was_sent: false,
        }),
    }))
}

/// Marks a success as having created its item.
fn created(mut out: Outcome) -> Outcome {
    if let Outcome::Meta(m) = &mut out
        && let Some(item) = &mut m.item
    {
        item.created = true;
    }
    out
}

fn set_win(out: &mut Outcome, won: bool, was_sent: bool) {
    if let Outcome::Meta(m) = out
        && let Some(item) = &mut m.item
    {
        item.won = won;
        item.win_was_sent = was_sent;
    }
}

fn store<S: WriteView>(s: &mut S, a: &MetaStore, ctx: Ctx) -> Result<Outcome, StoreError> {
    let key = a.kv.key();
    let old = s
        .get(key)?
        .filter(|i| !i.meta.is_expired(ctx.now_ms))
        .map(|i| i.meta);
    let appending = matches!(a.mode, StoreMode::Append | StoreMode::Prepend);
    let Some(old) = old else {
        return match (a.mode, a.vivify) {
            (StoreMode::Set | StoreMode::Add, _) if a.compare.is_none() => {
                put_fresh(s, a, a.exptime, false, false, ctx)
            }
            // A compared CAS needs an item, whatever the mode (memcached's binary add too).
            (StoreMode::Set | StoreMode::Add | StoreMode::Cas, _) => Ok(code(MetaCode::NotFound)),
            (StoreMode::Append | StoreMode::Prepend, Some(exptime)) => {
                put_fresh(s, a, exptime, false, false, ctx)
            }
            _ => Ok(code(MetaCode::NotStored)),
        };
    };
    if a.mode == StoreMode::Add {
        return Ok(code(MetaCode::NotStored));
    }
    if appending && old.kind != Kind::String {
        return Ok(Outcome::WrongType);
    }
    // A compared CAS that doesn't match fails, unless `I` accepts an older one (marking stale).
    let stale = match a.compare {
        Some(c) if c == old.cas => false,
        Some(c) if a.invalidate && c < old.cas => true,
        Some(_) => return Ok(code(MetaCode::Exists)),
        None => false,
    };
    if !appending {
        return put_fresh(s, a, a.exptime, stale, stale && old.win_sent, ctx);
    }
    let Some(item) = s.get(key)? else {
        return Ok(code(MetaCode::NotStored));
    };
    if item.value.len() + a.kv.value().len() > ctx.item_size_max {
        return Ok(Outcome::TooLarge);
    }
    let old_len = item.value.len();
    let item_meta = item.meta;
    let mut meta = old;
    meta.cas = a.new_cas.unwrap_or_else(|| s.next_cas());
    meta.stale = stale;
    meta.win_sent = stale && old.win_sent;
    let data = a.kv.value();
    let edit = if a.mode == StoreMode::Append {
        Edit::append(old_len, data.len())
    } else {
        Edit::prepend(data.len())
    };
    s.edit(key, &item_meta, &meta, data, &edit)?;
    Ok(hit(&meta, meta.expire_at, Vec::new()))
}

/// Stores `a`'s value as a new item expiring by `exptime`.
fn put_fresh<S: WriteView>(
    s: &mut S,
    a: &MetaStore,
    exptime: i64,
    stale: bool,
    win_sent: bool,
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    let cas = a.new_cas.unwrap_or_else(|| s.next_cas());
    let mut meta = ItemMeta::new(Kind::String, a.flags, expire_at(exptime, ctx.now_ms), cas);
    meta.stale = stale;
    meta.win_sent = win_sent;
    s.put(a.kv.key(), &meta, &[a.kv.value()])?;
    Ok(hit(&meta, meta.expire_at, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::super::apply as apply_op;
    use super::*;
    use crate::command::{KeyValue, WriteOp};
    use crate::storage::ReadView;
    use crate::storage::model::ModelStore;

    const NOW: u64 = 1_700_000_000_000;

    fn run(s: &mut ModelStore, op: MetaOp) -> Outcome {
        let ctx = Ctx {
            now_ms: NOW,
            item_size_max: 1024,
        };
        apply_op(s, &WriteOp::Meta(Box::new(op)), ctx).expect("model never fails")
    }

    fn set(mode: StoreMode, v: &str, compare: Option<u64>, invalidate: bool) -> MetaOp {
        MetaOp::Store(MetaStore {
            mode,
            kv: KeyValue::new(b"k", v.as_bytes()),
            flags: 4,
            exptime: 0,
            compare,
            invalidate,
            vivify: None,
            new_cas: None,
        })
    }

    fn get(recache: Option<i64>) -> MetaOp {
        MetaOp::Get {
            key: b"k".to_vec(),
            touch: None,
            vivify: None,
            recache,
            new_cas: None,
        }
    }

    fn item(o: &Outcome) -> MetaItem {
        match o {
            Outcome::Meta(m) if m.code == MetaCode::Ok => m.item.clone().expect("item"),
            other => panic!("not a hit: {other:?}"),
        }
    }

    fn code_of(o: &Outcome) -> MetaCode {
        match o {
            Outcome::Meta(m) => m.code,
            other => panic!("not meta: {other:?}"),
        }
    }

    #[test]
    fn compare_and_invalidate() {
        let mut s = ModelStore::default();
        assert_eq!(
            code_of(&run(&mut s, set(StoreMode::Set, "a", Some(1), false))),
            MetaCode::NotFound
        );
        let cas = item(&run(&mut s, set(StoreMode::Set, "a", None, false))).cas;
        assert_eq!(
            code_of(&run(&mut s, set(StoreMode::Set, "b", Some(cas + 1), false))),
            MetaCode::Exists
        );
        // An older CAS with I stores, marked stale; the first fetch wins, the next sees Z.
        let stale = item(&run(&mut s, set(StoreMode::Set, "c", Some(cas - 1), true)));
        assert!(stale.stale);
        let first = item(&run(&mut s, get(None)));
        assert!(first.stale && first.won && !first.win_was_sent);
        let second = item(&run(&mut s, get(None)));
        assert!(second.stale && !second.won && second.win_was_sent);
        assert_eq!(second.value, b"c");
        // A plain set clears both marks.
        run(&mut s, set(StoreMode::Set, "d", None, false));
        let fresh = item(&run(&mut s, get(None)));
        assert!(!fresh.stale && !fresh.won && !fresh.win_was_sent);
    }

    #[test]
    fn modes_and_append_keep_flags() {
        let mut s = ModelStore::default();
        assert_eq!(
            code_of(&run(&mut s, set(StoreMode::Append, "x", None, false))),
            MetaCode::NotStored
        );
        run(&mut s, set(StoreMode::Add, "1", None, false));
        assert_eq!(
            code_of(&run(&mut s, set(StoreMode::Add, "2", None, false))),
            MetaCode::NotStored
        );
        run(&mut s, set(StoreMode::Append, "2", None, false));
        run(&mut s, set(StoreMode::Prepend, "0", None, false));
        let got = s.get(b"k").expect("get").expect("present");
        assert_eq!(got.value, b"012");
        assert_eq!(got.meta.flags, 4);
        let too_big = "z".repeat(1024);
        assert_eq!(
            run(&mut s, set(StoreMode::Append, &too_big, None, false)),
            Outcome::TooLarge
        );
    }

    #[test]
    fn arith_vivifies_and_reports_ttl_before_change() {
        let mut s = ModelStore::default();
        let op = |vivify, exptime| MetaOp::Arith {
            key: b"n".to_vec(),
            incr: true,
            delta: 5,
            compare: None,
            vivify,
            initial: 10,
            exptime,
            new_cas: None,
        };
        assert_eq!(code_of(&run(&mut s, op(None, None))), MetaCode::NotFound);
        let created = item(&run(&mut s, op(Some(100), None)));
        assert_eq!(created.value, b"10");
        // Reported as before the request's TTL flags (it had none: it did not exist).
        assert!(created.created);
        assert_eq!(created.expire_at, 0);
        let stored = s.get(b"n").expect("get").expect("present");
        assert_eq!(ttl_secs(stored.meta.expire_at, NOW), 100);
        let bumped = item(&run(&mut s, op(Some(100), Some(0))));
        assert_eq!(bumped.value, b"15");
        assert_eq!(ttl_secs(bumped.expire_at, NOW), 100);
        let stored = s.get(b"n").expect("get").expect("present");
        assert_eq!(stored.meta.expire_at, 0);
    }

    #[test]
    fn recache_wins_only_below_the_threshold() {
        let mut s = ModelStore::default();
        let mut op = set(StoreMode::Set, "v", None, false);
        if let MetaOp::Store(a) = &mut op {
            a.exptime = 100;
        }
        run(&mut s, op);
        assert!(!item(&run(&mut s, get(Some(30)))).won);
        assert!(item(&run(&mut s, get(Some(200)))).won);
        let again = item(&run(&mut s, get(Some(200))));
        assert!(!again.won && again.win_was_sent);
    }

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_secs(0, NOW), -1);
        assert_eq!(ttl_secs(NOW + 100_000, NOW), 100);
        assert_eq!(ttl_secs(NOW + 99_001, NOW), 100);
        assert_eq!(ttl_secs(NOW + 1, NOW), 1);
    }
}
