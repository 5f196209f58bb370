//! Keyspace commands: DEL, EXISTS, the EXPIRE and TTL families, PERSIST, TYPE, RENAME, KEYS,
//! SCAN (with the server-side cursors the SCAN family shares), RANDOMKEY, DBSIZE, OBJECT and
//! FLUSHDB/FLUSHALL.

use std::sync::Mutex;

use super::args::{
    Args, NOT_INTEGER, SYNTAX, ScanOpts, expire_arg, glob_match, help, key_ok, scan_opts,
    sub_arity, unknown_sub,
};
use super::{Cmd, RespReply, View, failed};
use crate::command::{ExpireCond, WriteOp};
use crate::protocol::resp::enc;
use crate::protocol::resp::parse_i64;
use crate::storage::{ItemRef, Kind, StoreError};
use crate::types::keys::{KeyOp, RestoreOp};
use crate::types::rdb::{self, BadPayload};
use crate::types::{self, CollOp};

/// FLUSHDB / FLUSHALL [ASYNC|SYNC]: either way the store is cleared before the reply.
pub(super) fn flush(args: Args<'_>) -> Result<(WriteOp, RespReply), String> {
    match args.len() {
        1 => Ok((WriteOp::FlushAll { delay: 0 }, RespReply::Plain)),
        2 if args.is(1, "ASYNC") || args.is(1, "SYNC") => {
            Ok((WriteOp::FlushAll { delay: 0 }, RespReply::Plain))
        }
        _ => Err(SYNTAX.into()),
    }
}

/// Parses a key write (its key, argument 1, already checked).
pub(super) fn write_op(cmd: Cmd, args: Args<'_>, now: u64) -> Result<(WriteOp, RespReply), String> {
    let key = args.get(1);
    let plain = |op| Ok((op, RespReply::Plain));
    match cmd {
        Cmd::Del => {
            let keys = (1..args.len()).map(|i| args.get(i).to_vec()).collect();
            plain(WriteOp::Del { keys })
        }
        Cmd::Expire | Cmd::PExpire | Cmd::ExpireAt | Cmd::PExpireAt => {
            let (unit, absolute, name) = match cmd {
                Cmd::Expire => (1000, false, "expire"),
                Cmd::PExpire => (1, false, "pexpire"),
                Cmd::ExpireAt => (1000, true, "expireat"),
                _ => (1, true, "pexpireat"),
            };
            let at_ms = expire_arg(args.get(2), unit, absolute, now, name, false)?;
            // Redis reads every option first, then checks how they combine.
            let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
            for i in 3..args.len() {
                if args.is(i, "NX") {
                    nx = true;
                } else if args.is(i, "XX") {
                    xx = true;
                } else if args.is(i, "GT") {
                    gt = true;
                } else if args.is(i, "LT") {
                    lt = true;
                } else {
                    return Err(format!(
                        "ERR Unsupported option {}",
                        String::from_utf8_lossy(args.get(i))
                    ));
                }
            }
            if nx && (xx || gt || lt) {
                return Err(
                    "ERR NX and XX, GT or LT options at the same time are not compatible".into(),
                );
            }
            if gt && lt {
                return Err("ERR GT and LT options at the same time are not compatible".into());
            }
            let cond = match (nx, xx, gt, lt) {
                (true, ..) => ExpireCond::Nx,
                // GT already needs an expiry (none counts as infinitely late), so XX adds nothing.
                (_, _, true, _) => ExpireCond::Gt,
                (_, true, _, true) => ExpireCond::XxLt,
                (_, false, _, true) => ExpireCond::Lt,
                (_, true, ..) => ExpireCond::Xx,
                _ => ExpireCond::Always,
            };
            plain(WriteOp::Expire {
                key: key.to_vec(),
                at_ms,
                cond,
            })
        }
        Cmd::Persist => plain(WriteOp::Persist { key: key.to_vec() }),
        Cmd::Rename | Cmd::RenameNx => {
            key_ok(args.get(2))?;
            plain(WriteOp::Rename {
                from: key.to_vec(),
                to: args.get(2).to_vec(),
                nx: cmd == Cmd::RenameNx,
            })
        }
        Cmd::Copy => {
            let dst = args.get(2);
            key_ok(dst)?;
            let mut replace = false;
            let mut i = 3;
            while i < args.len() {
                if args.is(i, "REPLACE") {
                    replace = true;
                    i += 1;
                } else if args.is(i, "DB") && i + 1 < args.len() {
                    let db = parse_i64(args.get(i + 1)).ok_or(NOT_INTEGER)?;
                    if i32::try_from(db).is_err() {
                        return Err(
                            "ERR value is out of range, value must between -2147483648 and 2147483647"
                                .into(),
                        );
                    }
                    // memkeep has database 0 only (as Redis with `databases 1`).
                    if db != 0 {
                        return Err("ERR DB index is out of range".into());
                    }
                    i += 2;
                } else {
                    return Err(SYNTAX.into());
                }
            }
            if key == dst {
                return Err("ERR source and destination objects are the same".into());
            }
            plain(WriteOp::Coll(CollOp::Key(KeyOp::Copy {
                src: key.to_vec(),
                dst: dst.to_vec(),
                replace,
            })))
        }
        _ => Err(SYNTAX.into()),
    }
}

/// RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME s] [FREQ f]: the options are checked
/// here (Redis's texts, in its order); the TTL and the payload too, but their errors go with
/// the write, since an existing key without REPLACE answers BUSYKEY first. IDLETIME and FREQ
/// are checked and ignored (memkeep tracks neither). The payload decodes to at most twice
/// `max_bulk` bytes.
pub(super) fn restore_op(
    args: Args<'_>,
    now: u64,
    max_bulk: usize,
) -> Result<(WriteOp, RespReply), String> {
    let (mut replace, mut absttl) = (false, false);
    let (mut idle, mut freq) = (false, false);
    let mut j = 4;
    while j < args.len() {
        let more = j + 1 < args.len();
        if args.is(j, "REPLACE") {
            replace = true;
        } else if args.is(j, "ABSTTL") {
            absttl = true;
        } else if args.is(j, "IDLETIME") && more && !freq {
            let v = parse_i64(args.get(j + 1)).ok_or(NOT_INTEGER)?;
            if v < 0 {
                return Err("ERR Invalid IDLETIME value, must be >= 0".into());
            }
            idle = true;
            j += 1;
        } else if args.is(j, "FREQ") && more && !idle {
            let v = parse_i64(args.get(j + 1)).ok_or(NOT_INTEGER)?;
            if !(0..=255).contains(&v) {
                return Err("ERR Invalid FREQ value, must be >= 0 and <= 255".into());
            }
            freq = true;
            j += 1;
        } else {
            return Err(SYNTAX.into());
        }
        j += 1;
    }
    let mut expire_at = 0;
    let value = match parse_i64(args.get(2)) {
        None => Err(NOT_INTEGER),
        Some(t) if t < 0 => Err("ERR Invalid TTL value, must be >= 0"),
        Some(ttl) => {
            expire_at = match ttl {
                0 => 0,
                t if absttl => t as u64,
                t => now.saturating_add(t as u64),
            };
            rdb::decode(args.get(3), max_bulk.saturating_mul(2))
                .map_err(BadPayload::message)
                .and_then(|v| storable(v, max_bulk))
        }
    };
    Ok((
        WriteOp::Coll(CollOp::Key(KeyOp::Restore(Box::new(RestoreOp {
            key: args.get(1).to_vec(),
            value,
            expire_at,
            replace,
        })))),
        RespReply::Plain,
    ))
}

/// A decoded value memkeep can store: hash fields, set and sorted-set members of at most
/// `MAX_SUB` bytes, strings and elements of at most `max_bulk` (an LZF string may decode to
/// more than the payload held).
fn storable(v: rdb::Value, max_bulk: usize) -> Result<rdb::Value, &'static str> {
    use rdb::Value as V;
    let long = |s: &Vec<u8>| s.len() > types::MAX_SUB;
    let huge = |s: &Vec<u8>| s.len() > max_bulk;
    let too_big = match &v {
        V::String(s) => huge(s),
        V::List(items) | V::Set(items) => items.iter().any(huge),
        V::Hash(p) => p.iter().any(|(f, v)| huge(f) || huge(v)),
        V::ZSet(p) => p.iter().any(|(m, _)| huge(m)),
    };
    if too_big {
        return Err("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
    }
    let bad = match &v {
        V::String(_) | V::List(_) => None,
        V::Hash(p) => p
            .iter()
            .any(|(f, _)| long(f))
            .then_some("ERR memkeep: hash field longer than 495 bytes"),
        V::Set(m) => m
            .iter()
            .any(long)
            .then_some("ERR memkeep: set member longer than 495 bytes"),
        V::ZSet(p) => p
            .iter()
            .any(|(m, _)| long(m))
            .then_some("ERR memkeep: sorted-set member longer than 495 bytes"),
    };
    match bad {
        Some(msg) => Err(msg),
        None => Ok(v),
    }
}

/// EXISTS, TTL family, OBJECT, TYPE, DBSIZE, KEYS, SCAN, RANDOMKEY.
pub(super) fn read(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, v3: bool, view: &View<'_, '_>) {
    let View {
        store,
        txn,
        now,
        flushed,
        cursors,
        ..
    } = *view;
    let lookup = |key: &[u8]| view.live(key);
    match cmd {
        Cmd::Exists => {
            let mut n = 0;
            for i in 1..args.len() {
                match lookup(args.get(i)) {
                    Ok(found) => n += i64::from(found.is_some()),
                    Err(e) => return failed(out, e),
                }
            }
            enc::int(out, n);
        }
        Cmd::Ttl | Cmd::PTtl | Cmd::ExpireTime | Cmd::PExpireTime => {
            let v = match lookup1!(view, args, out) {
                None => -2,
                Some(i) if i.meta.expire_at == 0 => -1,
                Some(i) => {
                    let at = i.meta.expire_at as i64;
                    let left = at - now as i64;
                    match cmd {
                        Cmd::Ttl => (left + 500) / 1000,
                        Cmd::PTtl => left,
                        Cmd::ExpireTime => (at + 500) / 1000,
                        _ => at,
                    }
                }
            };
            enc::int(out, v);
        }
        Cmd::Object => {
            let sub = String::from_utf8_lossy(args.get(1)).to_ascii_uppercase();
            let known = ["ENCODING", "REFCOUNT", "IDLETIME", "FREQ"];
            if sub == "HELP" && args.len() == 2 {
                return help(out, OBJECT_HELP);
            }
            if !known.contains(&sub.as_str()) && sub != "HELP" {
                return unknown_sub(out, "OBJECT", args);
            }
            if args.len() != 3 {
                return sub_arity(out, "object", args);
            }
            let item = match lookup(args.get(2)) {
                Ok(Some(item)) => item,
                Ok(None) => return enc::null(out, v3),
                Err(e) => return failed(out, e),
            };
            match sub.as_str() {
                "ENCODING" => match object_encoding(store, txn, &item) {
                    Ok(name) => enc::bulk(out, name.as_bytes()),
                    Err(e) => failed(out, e),
                },
                // Redis shares the objects of the integers 0..9999 (OBJ_SHARED_INTEGERS).
                "REFCOUNT" => enc::int(
                    out,
                    if item.meta.kind == Kind::String
                        && redis_int(item.value).is_some_and(|n| (0..10_000).contains(&n))
                    {
                        i32::MAX as i64
                    } else {
                        1
                    },
                ),
                // memkeep does not track access times: every key reads as just used.
                "IDLETIME" => enc::int(out, 0),
                _ => enc::error(
                    out,
                    "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.",
                ),
            }
        }
        Cmd::Memory => {
            if args.is(1, "HELP") {
                return help(out, MEMORY_HELP);
            }
            // USAGE key [SAMPLES count]; 0 samples: every element.
            let mut samples = 5u64;
            let mut i = 3;
            while i < args.len() {
                if !(args.is(i, "SAMPLES") && i + 1 < args.len()) {
                    return enc::error(out, SYNTAX);
                }
                samples = match parse_i64(args.get(i + 1)) {
                    None => return enc::error(out, NOT_INTEGER),
                    Some(n) if n < 0 => return enc::error(out, SYNTAX),
                    Some(0) => u64::MAX,
                    Some(n) => n as u64,
                };
                i += 2;
            }
            let item = match lookup(args.get(2)) {
                Ok(Some(item)) => item,
                Ok(None) => return enc::null(out, v3),
                Err(e) => return failed(out, e),
            };
            match memory_usage(store, txn, args.get(2), &item, samples) {
                Ok(n) => enc::int(out, n as i64),
                Err(e) => failed(out, e),
            }
        }
        Cmd::Dump => {
            let item = lookup1!(view, args, out);
            view.hit(item.is_some());
            let Some(item) = item else {
                return enc::null(out, v3);
            };
            if item.meta.kind != Kind::String
                && let Ok(c) = types::CollMeta::decode(item.value)
                && store.coll_dirty(c.id)
            {
                return failed(out, store.note_pending());
            }
            match types::keys::dump(&store.elems, txn, &item) {
                Ok(payload) => enc::bulk(out, &payload),
                Err(e) => failed(out, e),
            }
        }
        Cmd::Type => {
            let item = lookup1!(view, args, out);
            enc::simple(out, item.map_or("none", |i| i.meta.kind.name()))
        }
        Cmd::DbSize => match store.len() {
            Ok(n) => enc::int(out, n as i64),
            Err(e) => failed(out, e),
        },
        Cmd::Keys => {
            let pattern = args.get(1);
            let mut found: Vec<&[u8]> = Vec::new();
            let mut walk = || -> Result<(), StoreError> {
                use std::ops::Bound::Unbounded;
                for entry in store.range(Unbounded, Unbounded)? {
                    let (key, bytes) = entry?;
                    let item = crate::storage::item::decode(bytes)?;
                    if !flushed && !item.meta.is_expired(now) && glob_match(pattern, key) {
                        found.push(key);
                    }
                }
                Ok(())
            };
            if let Err(e) = walk() {
                return failed(out, e);
            }
            enc::array(out, found.len());
            for k in found {
                enc::bulk(out, k);
            }
        }
        Cmd::Scan => scan(
            args,
            out,
            ScanView {
                store,
                now,
                flushed,
            },
            cursors,
        ),
        Cmd::RandomKey => match random_key(store) {
            Ok(Some(k)) => enc::bulk(out, &k),
            Ok(None) => enc::null(out, v3),
            Err(e) => failed(out, e),
        },
        _ => enc::error(out, "ERR command not available here"),
    }
}

const OBJECT_HELP: &[&str] = &[
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    Return the kind of internal representation used in order to store the value",
    "    associated with a <key>.",
    "FREQ <key>",
    "    Return the access frequency index of the <key>. The returned integer is",
    "    proportional to the logarithm of the recent access frequency of the key.",
    "IDLETIME <key>",
    "    Return the idle time of the <key>, that is the approximated number of",
    "    seconds elapsed since the last access to the key.",
    "REFCOUNT <key>",
    "    Return the number of references of the value associated with the specified",
    "    <key>.",
    "HELP",
    "    Prints this help.",
];

/// The value as Redis's `string2ll` reads it: a canonical decimal i64 of at most 20 bytes.
fn redis_int(v: &[u8]) -> Option<i64> {
    if v.is_empty() || v.len() > 20 {
        return None;
    }
    let n: i64 = std::str::from_utf8(v).ok()?.parse().ok()?;
    (n.to_string().as_bytes() == v).then_some(n)
}

/// The encoding Redis 7.0 would report for this value, by its rules and default thresholds:
/// strings `int` / `embstr` (up to 44 bytes) / `raw`; lists `quicklist`; hashes `listpack` up
/// to 128 fields of at most 64 bytes each (fields and values), else `hashtable`; sets `intset`
/// up to 512 integer members, else `hashtable`; sorted sets `listpack` up to 128 members of at
/// most 64 bytes, else `skiplist`. Small collections are walked (at most 512 elements).
fn object_encoding(
    store: &crate::storage::overlay::Snap<'_>,
    txn: &heed::RoTxn<'_>,
    item: &ItemRef<'_>,
) -> Result<&'static str, StoreError> {
    let small = |max_len: u64, ok: &dyn Fn(&[u8], &[u8]) -> bool| -> Result<bool, StoreError> {
        let coll = types::CollMeta::decode(item.value)?;
        if coll.len > max_len {
            return Ok(false);
        }
        if store.coll_dirty(coll.id) {
            return Err(store.note_pending());
        }
        for r in store.elems.prefix_iter(txn, &coll.id.to_be_bytes()[..])? {
            let (k, v) = r?;
            if !ok(&k[8..], v) {
                return Ok(false);
            }
        }
        Ok(true)
    };
    Ok(match item.meta.kind {
        Kind::String if redis_int(item.value).is_some() => "int",
        Kind::String if item.value.len() <= 44 => "embstr",
        Kind::String => "raw",
        Kind::List => "quicklist",
        Kind::Hash if small(128, &|f, v| f.len() <= 64 && v.len() <= 64)? => "listpack",
        Kind::Hash => "hashtable",
        Kind::Set if small(512, &|m, _| redis_int(m).is_some())? => "intset",
        Kind::Set => "hashtable",
        // A member's element value is its score's 8 bytes.
        Kind::ZSet if small(128, &|m, _| m.len() <= 64)? => "listpack",
        Kind::ZSet => "skiplist",
    })
}

const MEMORY_HELP: &[&str] = &[
    "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "USAGE <key> [SAMPLES <count>]",
    "    Return the bytes the key and its value take in the store (an estimate for",
    "    collections, from <count> sampled elements; 0 samples all of them; default 5).",
    "HELP",
    "    Prints this help.",
];

/// MEMORY USAGE: the bytes a key's records take in LMDB (key, item header and value; for a
/// collection, its metadata plus its element records, the elements' average size estimated
/// from the first `samples` of them), LMDB's per-record overhead not counted.
fn memory_usage(
    store: &crate::storage::overlay::Snap<'_>,
    txn: &heed::RoTxn<'_>,
    key: &[u8],
    item: &ItemRef<'_>,
    samples: u64,
) -> Result<u64, StoreError> {
    // The item header: format, type, flags, expiry, CAS (DESIGN.md's item record).
    const HEADER: u64 = 22;
    let base = key.len() as u64 + HEADER + item.value.len() as u64;
    if item.meta.kind == Kind::String {
        return Ok(base);
    }
    let coll = types::CollMeta::decode(item.value)?;
    let (mut seen, mut bytes) = (0u64, 0u64);
    for r in store.elems.prefix_iter(txn, &coll.id.to_be_bytes()[..])? {
        if seen >= samples {
            break;
        }
        let (k, v) = r?;
        bytes += (k.len() + v.len()) as u64;
        seen += 1;
    }
    let elems = match seen {
        0 => 0,
        n if n >= coll.len => bytes,
        n => bytes / n * coll.len,
    };
    Ok(base + elems)
}

/// Up to this many keys, RANDOMKEY draws an index and walks to it: exactly uniform.
const RANDOMKEY_WALK: u64 = 4096;

/// ... and up to this many while most keys are uncommitted (see `random_key`).
const RANDOMKEY_WALK_UNCOMMITTED: u64 = 65_536;

/// Above that, RANDOMKEY draws from this many keys after a random seek.
const WINDOW: usize = crate::types::hash::WINDOW;

/// A random key. Small stores: uniform (a random index, walked to). Larger ones: a random
/// walk down the byte trie of the keys (`types::hash::descend`), then one of the `WINDOW` keys
/// from there on (wrapping to the first), drawn uniformly: close to uniform for keys of one
/// shape, not exactly (proto/SPEC.md).
fn random_key(store: &crate::storage::overlay::Snap<'_>) -> Result<Option<Vec<u8>>, StoreError> {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    let n = store.len()?;
    if n == 0 {
        return Ok(None);
    }
    // The trie walk below sees committed keys only: while most keys are still in the overlay
    // (a bulk load not yet committed), a walk to a random index is the uniform way.
    let committed = store.items().len(store.txn())?;
    if n <= RANDOMKEY_WALK || (committed < n / 2 && n <= RANDOMKEY_WALK_UNCOMMITTED) {
        let skip = (types::random_u64() % n) as usize;
        let mut last = None;
        for (i, r) in store.range(Unbounded, Unbounded)?.enumerate() {
            let (k, _) = r?;
            last = Some(k.to_vec());
            if i == skip {
                break;
            }
        }
        return Ok(last);
    }
    // The window starts at a random committed key (the overlay's few uncommitted keys are
    // reached through the window only).
    let items = *store.items();
    let start = match items.first(store.txn())? {
        Some(_) => Some(types::hash::descend(items, store.txn(), &[])?.0.to_vec()),
        None => None,
    };
    let mut window: Vec<Vec<u8>> = Vec::with_capacity(WINDOW);
    let lo = start.as_deref().map_or(Unbounded, Included);
    for r in store.range(lo, Unbounded)?.take(WINDOW) {
        window.push(r?.0.to_vec());
    }
    if window.len() < WINDOW {
        let more = WINDOW - window.len();
        let hi = start.as_deref().map_or(Unbounded, Excluded);
        for r in store.range(Unbounded, hi)?.take(more) {
            window.push(r?.0.to_vec());
        }
    }
    if window.is_empty() {
        return Ok(None);
    }
    let at = (types::random_u64() % window.len() as u64) as usize;
    Ok(Some(window.swap_remove(at)))
}

/// What SCAN needs from the pass.
struct ScanView<'a, 't> {
    store: &'a crate::storage::overlay::Snap<'t>,
    now: u64,
    flushed: bool,
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE t]: keys in LMDB's order; the cursor names the
/// last key returned (kept server-side), so keys present for the whole scan are returned even
/// while others are written.
fn scan(args: Args<'_>, out: &mut Vec<u8>, view: ScanView<'_, '_>, cursors: &Mutex<ScanCursors>) {
    let Some(cursor) = std::str::from_utf8(args.get(1))
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return enc::error(out, "ERR invalid cursor");
    };
    let ScanOpts {
        pattern,
        count,
        type_filter,
    } = match scan_opts(args, 2, true) {
        Ok(o) => o,
        Err(msg) => return enc::error(out, msg),
    };
    let after: Option<Vec<u8>> = if cursor == 0 {
        None
    } else {
        match cursors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(cursor)
        {
            Some(k) => Some(k),
            None => return enc::error(out, "ERR invalid cursor"),
        }
    };
    let range = match &after {
        None => (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded),
        Some(k) => (
            std::ops::Bound::Excluded(&k[..]),
            std::ops::Bound::Unbounded,
        ),
    };
    let iter = match view.store.range(range.0, range.1) {
        Ok(it) => it,
        Err(e) => return enc::error(out, &e.resp_reply()),
    };
    let mut found: Vec<&[u8]> = Vec::new();
    let mut last: Option<&[u8]> = None;
    let mut exhausted = true;
    for (examined, entry) in iter.enumerate() {
        let (key, bytes) = match entry {
            Ok(kv) => kv,
            Err(e) => {
                let e = StoreError::from(e);
                if e.is_damage() {
                    return enc::error(out, crate::storage::RESP_DAMAGED);
                }
                break;
            }
        };
        if examined == count {
            exhausted = false;
            break;
        }
        last = Some(key);
        let item = match crate::storage::item::decode(bytes) {
            Ok(item) => Some(item),
            Err(e) => return enc::error(out, &e.resp_reply()),
        };
        let live = item.is_some_and(|i| !view.flushed && !i.meta.is_expired(view.now));
        let type_ok = type_filter.is_none_or(|t| {
            item.is_some_and(|i| t.eq_ignore_ascii_case(i.meta.kind.name().as_bytes()))
        });
        if live && type_ok && pattern.is_none_or(|p| glob_match(p, key)) {
            found.push(key);
        }
    }
    let next = match (exhausted, last) {
        (false, Some(k)) => cursors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(k.to_vec()),
        _ => 0,
    };
    enc::array(out, 2);
    enc::bulk(out, next.to_string().as_bytes());
    enc::array(out, found.len());
    for k in found {
        enc::bulk(out, k);
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The scan cursors handed out, so a cursor names the key to resume after. Bounded: the oldest
/// are forgotten (a forgotten cursor answers "ERR invalid cursor").
#[derive(Debug, Default)]
pub struct ScanCursors {
    next: u64,
    map: std::collections::HashMap<u64, Vec<u8>>,
    order: std::collections::VecDeque<u64>,
}

const SCAN_CURSORS_MAX: usize = 16 * 1024;

impl ScanCursors {
    /// Remembers `key` as a resume point; the cursor id to hand out.
    pub fn insert(&mut self, key: Vec<u8>) -> u64 {
        self.next += 1;
        // Not guessable from the count alone, never 0.
        let id = (splitmix(self.next) >> 1) | 1;
        if self.order.len() == SCAN_CURSORS_MAX
            && let Some(old) = self.order.pop_front()
        {
            self.map.remove(&old);
        }
        self.map.insert(id, key);
        self.order.push_back(id);
        id
    }

    /// The resume point of cursor `id`, if still remembered.
    pub fn get(&self, id: u64) -> Option<Vec<u8>> {
        self.map.get(&id).cloned()
    }
}

#[cfg(test)]
mod restore_tests {
    use super::*;

    #[test]
    fn restored_values_must_fit_memkeep_s_limits() {
        use rdb::Value as V;
        assert!(storable(V::String(vec![1; 100]), 100).is_ok());
        assert_eq!(
            storable(V::String(vec![1; 101]), 100),
            Err("ERR string exceeds maximum allowed size (proto-max-bulk-len)")
        );
        assert!(storable(V::List(vec![vec![1; 101]]), 100).is_err());
        let field = vec![b'f'; types::MAX_SUB + 1];
        assert_eq!(
            storable(V::Hash(vec![(field.clone(), b"v".to_vec())]), 1 << 20),
            Err("ERR memkeep: hash field longer than 495 bytes")
        );
        assert!(storable(V::Set(vec![field.clone()]), 1 << 20).is_err());
        assert!(storable(V::ZSet(vec![(field, 1.0)]), 1 << 20).is_err());
        assert!(storable(V::ZSet(vec![(vec![b'm'; types::MAX_SUB], 1.0)]), 1 << 20).is_ok());
    }
}
