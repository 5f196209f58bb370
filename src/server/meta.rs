//! Runs memcached meta commands on the memcached port: `mg` without `T`/`N`/`R` is answered
//! from the pass's read transaction; `ms`, `md`, `ma` and item-changing `mg`s go to the writer
//! as `MetaOp`s. Replies echo the request's return flags in request order, as memcached 1.6.18
//! formats them (`proto/memcache/meta-*.txt` pin them byte for byte).

use std::collections::VecDeque;

use log::error;

use super::memcache::{WRONGTYPE, line, number};
use super::stats::Counters;
use super::worker::Pass;
use crate::command::{KeyValue, MetaCode, MetaItem, MetaOp, MetaStore, Outcome, WriteOp};
use crate::protocol::meta::{MetaCmd, MetaRequest, flag_tokens};
use crate::semantics::expire_at;
use crate::semantics::meta::ttl_secs;
use crate::storage::hits::{Hits, Peek, Seen};
use crate::storage::overlay::Found;
use crate::storage::{ItemRef, Kind};

/// What a meta write's reply needs from its request, kept on the connection until the write
/// commits (completions come back in request order).
#[derive(Debug)]
pub struct Echo {
    cmd: MetaCmd,
    raw_key: Vec<u8>,
    flag_text: Vec<u8>,
    /// The key looked up (decoded from base64 with `b`), for the use table.
    key: Vec<u8>,
    /// What the use table said of the key before the write (an `mg` with `h`, `l` or `u`).
    before: Option<Peek>,
}

pub type EchoQueue = VecDeque<Echo>;

impl Echo {
    /// A binary GATK's key, which its reply carries.
    pub fn key_only(key: Vec<u8>) -> Echo {
        Echo {
            cmd: MetaCmd::Get,
            raw_key: key,
            flag_text: Vec::new(),
            key: Vec::new(),
            before: None,
        }
    }

    pub fn into_key(self) -> Vec<u8> {
        self.raw_key
    }

    pub fn new(m: &MetaRequest<'_>, hits: Option<&Hits>) -> Echo {
        let f = &m.flags;
        let tracked = m.cmd == MetaCmd::Get;
        let before = hits
            .filter(|_| tracked && (f.has(b'h') || f.has(b'l') || f.has(b'u')))
            .map(|h| h.peek(&m.key));
        Echo {
            cmd: m.cmd,
            raw_key: m.raw_key.to_vec(),
            flag_text: m.flag_text.to_vec(),
            key: if tracked { m.key.to_vec() } else { Vec::new() },
            before,
        }
    }
}

/// The TTL a request's items are created with when it has `N`: its last `T` or `N`, as
/// memcached applies them in request order (`N` only to an item it creates).
fn creation_ttl(m: &MetaRequest<'_>) -> Option<i64> {
    let vivify = m.flags.vivify?;
    let last = flag_tokens(m.flag_text)
        .filter(|t| matches!(t[0], b'T' | b'N'))
        .last()
        .map(|t| t[0]);
    Some(match (last, m.flags.ttl) {
        (Some(b'T'), Some(ttl)) => ttl,
        _ => vivify,
    })
}

/// The write a meta request turns into, if it is one (`mg` only when it may change the item).
pub fn write_op(m: &MetaRequest<'_>) -> Option<WriteOp> {
    let f = &m.flags;
    let key = || m.key.to_vec();
    let op = match m.cmd {
        MetaCmd::Set => MetaOp::Store(MetaStore {
            mode: f.store_mode(),
            kv: KeyValue::new(&m.key, m.data),
            flags: f.client_flags,
            exptime: f.ttl.unwrap_or(0),
            compare: f.compare,
            invalidate: f.has(b'I'),
            vivify: f.vivify,
            new_cas: f.new_cas,
        }),
        MetaCmd::Delete => MetaOp::Delete {
            key: key(),
            compare: f.compare,
            invalidate: f.has(b'I'),
            exptime: f.ttl,
            keep: f.has(b'x'),
            new_cas: f.new_cas,
        },
        MetaCmd::Arith => MetaOp::Arith {
            key: key(),
            incr: f.incr(),
            delta: f.delta,
            compare: f.compare,
            vivify: creation_ttl(m),
            initial: f.initial,
            exptime: f.ttl,
            new_cas: f.new_cas,
        },
        MetaCmd::Get if f.ttl.is_some() || f.vivify.is_some() || f.recache.is_some() => get_op(m),
        MetaCmd::Get | MetaCmd::Debug | MetaCmd::Noop => return None,
    };
    Some(WriteOp::Meta(Box::new(op)))
}

fn get_op(m: &MetaRequest<'_>) -> MetaOp {
    MetaOp::Get {
        key: m.key.to_vec(),
        touch: m.flags.ttl,
        vivify: creation_ttl(m),
        recache: m.flags.recache,
        new_cas: m.flags.new_cas,
    }
}

/// Answers a meta request that needs no write. A fetch of a stale item whose win token is
/// still to be handed out must change the item: that returns the write to submit instead.
pub fn immediate(m: &MetaRequest<'_>, out: &mut Vec<u8>, pass: &mut Pass<'_>) -> Option<WriteOp> {
    match m.cmd {
        MetaCmd::Noop => line(out, "MN"),
        MetaCmd::Get => {
            let (counters, now) = (pass.counters, pass.now_ms);
            let hits = pass.shared.store.hits();
            let found = lookup(m, pass);
            if !matches!(found, Err(COLD)) {
                Counters::bump(&counters.cmd_get);
            }
            match found {
                // Not in memory: nothing is answered; the request runs again once it is read in.
                Err(COLD) => {}
                Err(msg) => line(out, msg),
                Ok(None) => {
                    Counters::bump(&counters.get_misses);
                    reply(
                        out,
                        m.cmd,
                        m.raw_key,
                        m.flag_text,
                        MetaCode::Miss,
                        None,
                        None,
                        now,
                    );
                }
                Ok(Some((item, _))) if item.stale && !item.win_was_sent => {
                    return Some(WriteOp::Meta(Box::new(get_op(m))));
                }
                Ok(Some((item, value))) => {
                    Counters::bump(&counters.get_hits);
                    let hit = Some((&item, value));
                    let seen = hits.map(|h| h.seen(&m.key, item.cas));
                    reply(
                        out,
                        m.cmd,
                        m.raw_key,
                        m.flag_text,
                        MetaCode::Ok,
                        hit,
                        seen,
                        now,
                    );
                    // A fetch is a use, unless `u` says not to count it.
                    if let Some(h) = hits
                        && !m.flags.has(b'u')
                    {
                        h.fetched(&m.key, item.cas, now);
                    }
                }
            }
        }
        MetaCmd::Debug => {
            let now = pass.now_ms;
            let hits = pass.shared.store.hits().cloned();
            match lookup(m, pass) {
                Err(COLD) => {}
                Err(msg) => line(out, msg),
                Ok(None) => line(out, "EN"),
                Ok(Some((item, value))) => {
                    out.extend_from_slice(b"ME ");
                    out.extend_from_slice(m.raw_key);
                    out.extend_from_slice(b" exp=");
                    number(out, ttl_secs(item.expire_at, now));
                    // What the use table knows (`me` itself is not a use).
                    let seen = hits.map(|h| h.seen(&m.key, item.cas)).unwrap_or(Seen {
                        fetched: false,
                        last_s: now / 1000,
                    });
                    out.extend_from_slice(b" la=");
                    number(out, seen.idle_secs(now));
                    out.extend_from_slice(b" cas=");
                    number(out, item.cas);
                    out.extend_from_slice(b" fetch=");
                    out.extend_from_slice(if seen.fetched { b"yes" } else { b"no" });
                    out.extend_from_slice(b" cls=1 size=");
                    number(out, m.key.len() + value.len());
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
        MetaCmd::Set | MetaCmd::Delete | MetaCmd::Arith => {
            error!("a meta write reached the read path");
            line(out, "SERVER_ERROR internal error");
        }
    }
    None
}

/// `lookup`'s answer for an item not in memory (`Pass::deferred` then holds).
const COLD: &str = "";

/// The live string item under the request's key, and its value borrowed from the snapshot.
fn lookup<'p>(
    m: &MetaRequest<'_>,
    pass: &'p mut Pass<'_>,
) -> Result<Option<(MetaItem, &'p [u8])>, &'static str> {
    let flushed = pass.flushed();
    let now = pass.now_ms;
    let store = pass.snap().map_err(|e| {
        if !e.is_damage() {
            error!("cannot open read transaction: {e}");
        }
        e.mc_read_reply()
    })?;
    let found = match store.lookup(&m.key) {
        Ok(Found::Cold) => return Err(COLD),
        Ok(Found::Item(item)) => Ok(Some(item)),
        Ok(Found::Missing) => Ok(None),
        Err(e) => Err(e),
    };
    match found {
        Ok(Some(ItemRef { meta, value })) if !flushed && !meta.is_expired(now) => {
            if meta.kind != Kind::String {
                return Err(WRONGTYPE);
            }
            let item = MetaItem {
                created: false,
                flags: meta.flags,
                cas: meta.cas,
                expire_at: meta.expire_at,
                value: Vec::new(),
                stale: meta.stale,
                won: false,
                win_was_sent: meta.win_sent,
            };
            Ok(Some((item, value)))
        }
        Ok(_) => Ok(None),
        Err(e) => {
            if !e.is_damage() {
                error!("read of a stored item failed: {e}");
            }
            Err(e.mc_read_reply())
        }
    }
}

/// Encodes a meta write's reply once it has committed.
pub fn complete(
    out: &mut Vec<u8>,
    echoes: &mut EchoQueue,
    outcome: Outcome,
    hits: Option<&Hits>,
    now_ms: u64,
) {
    let Some(echo) = echoes.pop_front() else {
        error!("a meta completion without its request");
        return line(out, "SERVER_ERROR internal error");
    };
    match outcome {
        Outcome::Meta(m) => {
            let item = m.item.as_ref().map(|i| (i, i.value.as_slice()));
            // An item the request created was never used before it; else what the table said
            // before the write (which, keeping the CAS, counted as a use).
            let seen = match (item, echo.before) {
                (Some((i, _)), _) if i.created => Some(Seen {
                    fetched: false,
                    last_s: now_ms / 1000,
                }),
                (Some((i, _)), Some(p)) => Some(p.resolve(i.cas)),
                _ => None,
            };
            reply(
                out,
                echo.cmd,
                &echo.raw_key,
                &echo.flag_text,
                m.code,
                item,
                seen,
                now_ms,
            );
            if let (Some(h), Some((i, _)), MetaCmd::Get) = (hits, item, echo.cmd) {
                let quiet_use = flag_tokens(&echo.flag_text).any(|t| t[0] == b'u');
                match (quiet_use, seen) {
                    (false, _) => h.fetched(&echo.key, i.cas, now_ms),
                    // `u`: the write's touch must not count as a use either.
                    (true, Some(before)) if !i.created => h.restore(&echo.key, i.cas, before),
                    (true, _) => {}
                }
            }
        }
        Outcome::WrongType => line(out, WRONGTYPE),
        Outcome::NonNumeric => line(
            out,
            "CLIENT_ERROR cannot increment or decrement non-numeric value",
        ),
        Outcome::TooLarge => line(out, "SERVER_ERROR object too large for cache"),
        Outcome::Full => line(out, "SERVER_ERROR out of memory storing object"),
        Outcome::Damaged => line(out, crate::storage::MC_DAMAGED),
        Outcome::BadKey => line(out, "CLIENT_ERROR bad command line format"),
        other => {
            if !matches!(other, Outcome::Failed) {
                error!("unexpected outcome for a meta write: {other:?}");
            }
            line(out, "SERVER_ERROR storage failure");
        }
    }
}

/// Writes a meta reply; `item` is the item the reply reports on, with its value, and `seen`
/// what the use table knew of it before this request.
#[allow(clippy::too_many_arguments)]
fn reply(
    out: &mut Vec<u8>,
    cmd: MetaCmd,
    raw_key: &[u8],
    flag_text: &[u8],
    code: MetaCode,
    item: Option<(&MetaItem, &[u8])>,
    seen: Option<Seen>,
    now_ms: u64,
) {
    let has = |c: u8| flag_tokens(flag_text).any(|t| t[0] == c);
    let quiet = has(b'q');
    let with_value = has(b'v') && matches!(cmd, MetaCmd::Get | MetaCmd::Arith);
    let head: &[u8] = match code {
        // memcached 1.6.18: `q` hides `EN` for mg and `HD` for the others.
        MetaCode::Miss if quiet => return,
        MetaCode::Miss => b"EN",
        MetaCode::Ok if with_value && item.is_some() => b"VA",
        MetaCode::Ok if quiet && cmd != MetaCmd::Get => return,
        MetaCode::Ok => b"HD",
        MetaCode::NotStored => b"NS",
        MetaCode::Exists => b"EX",
        MetaCode::NotFound => b"NF",
    };
    out.extend_from_slice(head);
    let value = item.filter(|_| head == b"VA").map(|(_, v)| v);
    if let Some(v) = value {
        out.push(b' ');
        number(out, v.len());
    }
    let base64 = has(b'b');
    // memcached applies `T` and `N` in request order: a `t` reports the TTL as of its place.
    let mut expiry = item.map_or(0, |(i, _)| i.expire_at);
    let ttl_arg = |tok: &[u8]| {
        std::str::from_utf8(&tok[1..])
            .ok()
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(0)
    };
    for tok in flag_tokens(flag_text) {
        match (tok[0], item) {
            (b'T', Some(_)) if matches!(cmd, MetaCmd::Get | MetaCmd::Arith) => {
                expiry = expire_at(ttl_arg(tok), now_ms);
            }
            (b'N', Some((i, _))) if i.created => expiry = expire_at(ttl_arg(tok), now_ms),
            (b'O', _) => {
                out.push(b' ');
                out.extend_from_slice(tok);
            }
            (b'k', _) => {
                out.extend_from_slice(b" k");
                out.extend_from_slice(raw_key);
                if base64 {
                    out.extend_from_slice(b" b");
                }
            }
            // memcached 1.6.18: a set that did not store answers the CAS as 0.
            (b'c', _)
                if cmd == MetaCmd::Set
                    && matches!(
                        code,
                        MetaCode::Exists | MetaCode::NotFound | MetaCode::NotStored
                    ) =>
            {
                out.extend_from_slice(b" c0");
            }
            (b'c', Some((i, _))) if cmd != MetaCmd::Delete => {
                out.extend_from_slice(b" c");
                number(out, i.cas);
            }
            (b't', Some(_)) if matches!(cmd, MetaCmd::Get | MetaCmd::Arith) => {
                out.extend_from_slice(b" t");
                number(out, ttl_secs(expiry, now_ms));
            }
            (b'f', Some((i, _))) if cmd == MetaCmd::Get => {
                out.extend_from_slice(b" f");
                number(out, i.flags);
            }
            (b's', Some((_, v))) if cmd == MetaCmd::Get => {
                out.extend_from_slice(b" s");
                number(out, v.len());
            }
            // From the use table, as it was before this request (`hits.rs`).
            (b'h', Some(_)) if cmd == MetaCmd::Get => {
                let fetched = seen.is_some_and(|s| s.fetched);
                out.extend_from_slice(if fetched { b" h1" } else { b" h0" });
            }
            (b'l', Some(_)) if cmd == MetaCmd::Get => {
                out.extend_from_slice(b" l");
                number(out, seen.map_or(0, |s| s.idle_secs(now_ms)));
            }
            _ => {}
        }
    }
    if let (MetaCmd::Get, Some((i, _))) = (cmd, item) {
        if i.win_was_sent {
            out.extend_from_slice(b" Z");
        }
        if i.stale {
            out.extend_from_slice(b" X");
        }
        if i.won {
            out.extend_from_slice(b" W");
        }
    }
    out.extend_from_slice(b"\r\n");
    if let Some(v) = value {
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
}
