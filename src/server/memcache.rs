//! Runs memcached text-protocol requests for one connection: reads are answered at once from
//! the pass's LMDB read transaction, writes become `WriteOp`s for the writer, and write
//! completions are encoded here when they come back.

use std::sync::atomic::Ordering;

use log::error;

use super::conn::{Conn, WRITE_HIGH};
use super::meta::Echo;
use super::stats::{Counters, Totals, rusage};
use super::worker::{Pass, Reply, Stop, Tag};
use crate::command::{KeyValue, Outcome, StoreMode, WriteOp};
use crate::protocol::memcache::{Frame, Incomplete, KeyList, Request, parse};
use crate::storage::overlay::{COLD_AHEAD, Found};
use crate::storage::{ItemRef, Kind, StoreError};

/// How to answer a memcached write once it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McReply {
    Store(StoreMode),
    /// `set` of an over-size value: the old value was deleted; the answer is an error.
    TooLarge,
    Delete,
    Incr,
    Decr,
    Touch,
    Gat {
        with_cas: bool,
    },
    Flush,
    /// A meta command; the reply's shape waits in the connection's echo queue.
    Meta,
}

/// What a memcached client sees when a key holds a Redis collection (a list, hash, ...) where a
/// string value is needed.
pub const WRONGTYPE: &str =
    "CLIENT_ERROR WRONGTYPE Operation against a key holding the wrong kind of value";

/// A write from a user of `auth_readonly`.
pub const READONLY_ERROR: &str = "CLIENT_ERROR read-only user";
pub const VERSION: &str = concat!("1.6.18-memkeep-", env!("CARGO_PKG_VERSION"));

/// Parses and runs up to `budget` requests from `conn`'s input.
pub fn process(conn: &mut Conn, pass: &mut Pass<'_>, slot: u32, budget: usize) -> Stop {
    // The first byte decides, once per connection: the binary request magic, or text.
    if conn.mc_binary.is_none()
        && let Some(&first) = conn.input().first()
    {
        conn.mc_binary = Some(crate::protocol::binary::is_binary(first));
    }
    if conn.mc_binary == Some(true) {
        return super::binary::process(conn, pass, slot, budget);
    }
    let mut left = budget;
    loop {
        if let Some(stop) = conn.why_stop(left, conn.get_resume > 0 || conn.dump.is_some()) {
            return stop;
        }
        let epoch = conn.epoch;
        let inflight = conn.inflight;
        let peer = conn.peer;
        let (authed, readonly) = (conn.mc_authed, conn.mc_readonly);
        let (resume, room) = (
            conn.get_resume,
            WRITE_HIGH.saturating_sub(conn.pending_output()),
        );
        let (input, out, echoes, dump) = conn.io_dump();
        let parsed = match parse(input, &pass.limits) {
            Err(Incomplete) => return Stop::NeedInput,
            Ok(p) => p,
        };
        let (consumed, swallow) = (parsed.consumed, parsed.swallow);
        if let Some(users) = &pass.shared.mc_auth
            && !authed
            && !matches!(parsed.frame, Frame::Close)
        {
            // memcached's ASCII authentication (-Y): until a `set` carrying "user password" as
            // its value succeeds, every request answers `CLIENT_ERROR unauthenticated`.
            if inflight > 0 {
                return Stop::Blocked;
            }
            let mut conn_readonly = false;
            let ok = match parsed.frame {
                Frame::Request(Request::Store {
                    mode: StoreMode::Set,
                    data,
                    ..
                }) => {
                    Counters::bump(&pass.counters.auth_cmds);
                    match data.iter().position(|&b| b == b' ') {
                        None => {
                            Counters::bump(&pass.counters.auth_errors);
                            line(out, "CLIENT_ERROR bad authentication token format");
                            false
                        }
                        Some(sp)
                            if users
                                .get(&data[..sp])
                                .is_some_and(|p| super::acl::secret_eq(&data[sp + 1..], p)) =>
                        {
                            conn_readonly = pass.shared.mc_readonly.contains(&data[..sp]);
                            line(out, "STORED");
                            true
                        }
                        Some(_) => {
                            Counters::bump(&pass.counters.auth_errors);
                            log::debug!("{peer:?}: authentication failure");
                            line(out, "CLIENT_ERROR authentication failure");
                            false
                        }
                    }
                }
                _ => {
                    line(out, "CLIENT_ERROR unauthenticated");
                    false
                }
            };
            conn.consume(consumed);
            conn.swallow = swallow;
            conn.mc_authed = ok;
            conn.mc_readonly = conn_readonly;
            left -= 1;
            continue;
        }
        let tag = |noreply: bool, kind: McReply| Tag {
            slot,
            epoch,
            reply: Reply::Mc { noreply, kind },
        };
        let write = match parsed.frame {
            Frame::Close => {
                log::debug!(
                    "closing {:?}: a line with no newline past the limit",
                    conn.peer
                );
                conn.closing = true;
                return Stop::Close;
            }
            Frame::Request(Request::Meta(ref m)) => super::meta::write_op(m).map(|op| {
                let echo = Echo::new(m, pass.shared.store.hits().map(|h| &**h));
                (op, tag(false, McReply::Meta), Some(echo))
            }),
            Frame::Request(ref req) => write_op(req).map(|(op, noreply, kind)| {
                record_prefixes(&pass.shared.prefixes, req);
                (op, tag(noreply, kind), None)
            }),
            Frame::Error(_) => None,
        };
        if pass.shared.pause.holds(write.is_some()) {
            // CLIENT PAUSE holds the memcached port's writes (every request under ALL) as it
            // holds RESP's: the request waits in the input until the pause ends.
            return Stop::Paused;
        }
        let replica = write.is_some() && pass.shared.repl.is_replica();
        let too_few = write.is_some() && !replica && pass.shared.repl.too_few_replicas();
        if (readonly || replica || too_few) && write.is_some() {
            // A read-only user (`auth_readonly`), or a replica: the write is refused, even
            // with noreply (as memcached sends its errors).
            if inflight > 0 {
                return Stop::Blocked;
            }
            line(
                out,
                if replica {
                    super::repl::MC_READONLY
                } else if too_few {
                    super::repl::MC_NOREPLICAS
                } else {
                    READONLY_ERROR
                },
            );
            conn.consume(consumed);
            conn.swallow = swallow;
            left -= 1;
            continue;
        }
        match write {
            Some((op, tag, echo)) => {
                echoes.extend(echo);
                count_submit(pass.counters, &tag);
                pass.pending
                    .push(crate::engine::writer::WriteRequest { tag, op });
                conn.inflight += 1;
            }
            // Everything else answers at once, so it waits for earlier writes' replies.
            None if inflight > 0 => return Stop::Blocked,
            None => match parsed.frame {
                Frame::Error(msg) => {
                    log::debug!("{peer:?}: {msg}");
                    line(out, msg)
                }
                Frame::Request(Request::Meta(m)) => {
                    // A fetch that turns out to change the item (a stale one's win token).
                    let op = super::meta::immediate(&m, out, pass);
                    if pass.deferred() {
                        // Its item is being read in: the request stays, and runs again then.
                        return Stop::Blocked;
                    }
                    if let Some(op) = op {
                        let hits = pass.shared.store.hits().map(|h| &**h);
                        echoes.push_back(Echo::new(&m, hits));
                        let tag = tag(false, McReply::Meta);
                        pass.pending
                            .push(crate::engine::writer::WriteRequest { tag, op });
                        conn.inflight += 1;
                    }
                }
                Frame::Request(Request::CacheDump { class: 1, limit }) => {
                    let kind = super::dump::DumpKind::Cache { limit };
                    if dump_step(kind, dump, out, pass, room) {
                        return Stop::Budget;
                    }
                }
                Frame::Request(Request::MetaDump { any: true }) => {
                    if dump_step(super::dump::DumpKind::Meta, dump, out, pass, room) {
                        return Stop::Budget;
                    }
                }
                Frame::Request(Request::Get { keys, with_cas }) => {
                    // A reply past `room` pauses; the request is kept and resumed later.
                    if let Some(next) = get(keys, with_cas, out, pass, resume, room) {
                        conn.get_resume = next;
                        return Stop::Blocked;
                    }
                    conn.get_resume = 0;
                }
                Frame::Request(req) => {
                    if immediate(req, out, pass) {
                        conn.closing = true;
                        conn.consume(consumed);
                        return Stop::Close;
                    }
                }
                Frame::Close => unreachable!("handled above"),
            },
        }
        conn.consume(consumed);
        conn.swallow = swallow;
        left -= 1;
    }
}

/// Runs the next chunk of a key dump; true if it goes on (the request stays in the input and
/// runs again next pass, from where this chunk stopped).
fn dump_step(
    kind: super::dump::DumpKind,
    dump: &mut Option<super::dump::Cursor>,
    out: &mut Vec<u8>,
    pass: &mut Pass<'_>,
    room: usize,
) -> bool {
    let mut cursor = dump.take().unwrap_or_default();
    match super::dump::step(kind, &mut cursor, out, pass, room) {
        super::dump::Step::More => {
            *dump = Some(cursor);
            true
        }
        super::dump::Step::Done => false,
    }
}

/// `stats detail`: what a request that goes to the writer counts, by key prefix (gets are
/// counted here as misses; their hits when they complete).
fn record_prefixes(p: &super::stats::Prefixes, req: &Request<'_>) {
    if !p.enabled() {
        return;
    }
    match *req {
        Request::Store { key, .. } | Request::TooLarge { key, .. } => p.record_set(key),
        Request::Delete { key, .. } => p.record_delete(key),
        Request::Gat { keys, .. } => {
            for key in keys.0.split(|&b| b == b' ').filter(|k| !k.is_empty()) {
                p.record_get(key, false);
            }
        }
        _ => {}
    }
}

/// The write a request turns into, if it is one: (op, noreply, how to answer).
fn write_op(req: &Request<'_>) -> Option<(WriteOp, bool, McReply)> {
    Some(match *req {
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            cas,
            data,
            noreply,
        } => (
            WriteOp::Store {
                mode,
                kv: KeyValue::new(key, data),
                flags,
                exptime,
                cas,
            },
            noreply,
            McReply::Store(mode),
        ),
        Request::TooLarge {
            mode: StoreMode::Set,
            key,
            noreply,
        } => (
            WriteOp::Delete { key: key.to_vec() },
            noreply,
            McReply::TooLarge,
        ),
        Request::Delete { key, noreply } => (
            WriteOp::Delete { key: key.to_vec() },
            noreply,
            McReply::Delete,
        ),
        Request::Arith {
            key,
            incr,
            delta,
            noreply,
        } => (
            WriteOp::Arith {
                key: key.to_vec(),
                incr,
                delta,
            },
            noreply,
            if incr { McReply::Incr } else { McReply::Decr },
        ),
        Request::Touch {
            key,
            exptime,
            noreply,
        } => (
            WriteOp::Touch {
                key: key.to_vec(),
                exptime,
            },
            noreply,
            McReply::Touch,
        ),
        Request::Gat {
            exptime,
            keys,
            with_cas,
        } => (
            WriteOp::Gat {
                keys: keys.0.to_vec(),
                exptime,
            },
            false,
            McReply::Gat { with_cas },
        ),
        Request::FlushAll { delay, noreply } => {
            (WriteOp::FlushAll { delay }, noreply, McReply::Flush)
        }
        _ => return None,
    })
}

fn count_submit(c: &Counters, tag: &Tag) {
    let Reply::Mc { kind, .. } = tag.reply else {
        return;
    };
    match kind {
        McReply::Store(_) | McReply::TooLarge => Counters::bump(&c.cmd_set),
        McReply::Flush => Counters::bump(&c.cmd_flush),
        McReply::Touch => Counters::bump(&c.cmd_touch),
        _ => {}
    }
}

pub(super) fn line(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

pub(super) fn number(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn value_line(out: &mut Vec<u8>, key: &[u8], flags: u32, value: &[u8], cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    number(out, flags);
    out.push(b' ');
    number(out, value.len());
    if let Some(cas) = cas {
        out.push(b' ');
        number(out, cas);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Runs a request answered on the worker; returns true when the connection should close.
fn immediate(req: Request<'_>, out: &mut Vec<u8>, pass: &mut Pass<'_>) -> bool {
    match req {
        Request::Get { keys, with_cas } => {
            get(keys, with_cas, out, pass, 0, usize::MAX);
        }
        Request::TooLarge { key, .. } => {
            // memcached counts a refused store as a set (`stats detail`) too.
            pass.shared.prefixes.record_set(key);
            Counters::bump(&pass.counters.store_too_large);
            line(out, "SERVER_ERROR object too large for cache")
        }
        Request::Stats { args } => stats(args, out, pass),
        // Only memkeep's one class has items (class 1 is dumped by `process`, in chunks).
        Request::CacheDump { .. } | Request::MetaDump { .. } => line(out, "END"),
        Request::Version => {
            out.extend_from_slice(b"VERSION ");
            line(out, VERSION);
        }
        Request::Verbosity { noreply, .. } => {
            if !noreply {
                line(out, "OK");
            }
        }
        // memcached rejects these but, the line ending in noreply, says nothing.
        Request::NoReplyError { reply } => log::debug!("silent error (noreply): {reply}"),
        Request::Quit => return true,
        Request::Rget {
            start,
            end,
            left_open,
            right_open,
            max,
        } => rget(start, end, left_open, right_open, max, out, pass),
        Request::DbCompact => {
            let shared = pass.shared;
            let now_s = pass.now_ms / 1000;
            if shared
                .backups
                .start(&shared.store, &shared.config.backup_dir, now_s)
            {
                line(out, "OK");
            } else {
                line(out, "SERVER_ERROR a backup is already running");
            }
        }
        Request::DbCheckpoint => {
            // The writer takes it at its next turn (within a second); a worker never waits on
            // the disk. Every acknowledged write is already durable per the sync mode.
            pass.shared
                .checkpoints
                .requested
                .store(true, std::sync::atomic::Ordering::Release);
            line(out, "OK")
        }
        Request::DebugAdvanceClock { seconds } => {
            if pass.shared.clock.advance(seconds.saturating_mul(1000)) {
                pass.now_ms = pass.shared.clock.now_ms();
                line(out, "OK");
            } else {
                line(out, "ERROR");
            }
        }
        // Writes never get here.
        Request::Store { .. }
        | Request::Delete { .. }
        | Request::Arith { .. }
        | Request::Touch { .. }
        | Request::Gat { .. }
        | Request::FlushAll { .. }
        | Request::Meta(_) => {
            error!("write request reached the read path");
            line(out, "SERVER_ERROR internal error");
        }
    }
    false
}

/// Answers `get`/`gets` from byte `from` of the key list on (0 for a new request). Once the reply
/// has added `room` bytes it stops after the value at hand and returns the offset of the next
/// key: the caller keeps the request and resumes it when the client has read its replies, so one
/// request naming a big value thousands of times cannot make the reply without bound. Each piece
/// reads from its own pass's snapshot.
fn get(
    keys: KeyList<'_>,
    with_cas: bool,
    out: &mut Vec<u8>,
    pass: &mut Pass<'_>,
    from: usize,
    room: usize,
) -> Option<usize> {
    let start = out.len();
    let flushed = pass.flushed();
    let now = pass.now_ms;
    let counters = pass.counters;
    let shared = pass.shared;
    let hits = shared.store.hits();
    let store = match pass.snap() {
        Ok(t) => t,
        Err(e) => {
            if !e.is_damage() {
                error!("cannot open read transaction: {e}");
            }
            line(out, e.mc_read_reply());
            return None;
        }
    };
    let list = keys.0.get(from..).unwrap_or_default();
    let mut at = from;
    for key in list.split(|&b| b == b' ') {
        // `at` becomes the offset just past this key's separator: where the next key starts.
        at += key.len() + 1;
        if key.is_empty() {
            continue;
        }
        let found = match store.lookup(key) {
            Ok(Found::Cold) => {
                // Not in memory: answer from this key on once a reader has read it in (and
                // the cold ones among the next few keys with it).
                let rest = keys.0.get(at..).unwrap_or_default();
                for k in rest.split(|&b| b == b' ').take(COLD_AHEAD) {
                    store.note_cold(k);
                }
                return Some(at - key.len() - 1);
            }
            Ok(Found::Item(item)) => Ok(Some(item)),
            Ok(Found::Missing) => Ok(None),
            Err(e) => Err(e),
        };
        Counters::bump(&counters.cmd_get);
        if shared.prefixes.enabled() {
            let hit = matches!(&found, Ok(Some(i)) if !flushed && !i.meta.is_expired(now));
            shared.prefixes.record_get(key, hit);
        }
        match found {
            Ok(Some(ItemRef { meta, .. }))
                if !flushed && !meta.is_expired(now) && meta.kind != Kind::String =>
            {
                // A Redis collection: the whole reply becomes the error, as for a bad key (a
                // reply paused before ends with it, after the values already sent).
                out.truncate(start);
                line(out, WRONGTYPE);
                return None;
            }
            Ok(Some(ItemRef { meta, value })) if !flushed && !meta.is_expired(now) => {
                Counters::bump(&counters.get_hits);
                value_line(out, key, meta.flags, value, with_cas.then_some(meta.cas));
                if let Some(h) = hits {
                    h.fetched(key, meta.cas, now);
                }
                if out.len() - start >= room && at < keys.0.len() {
                    return Some(at);
                }
            }
            Ok(Some(_)) => {
                Counters::bump(&counters.get_misses);
                Counters::bump(if flushed {
                    &counters.get_flushed
                } else {
                    &counters.get_expired
                });
            }
            Ok(None) => Counters::bump(&counters.get_misses),
            Err(e) => {
                if !e.is_damage() {
                    error!("read of a stored item failed: {e}");
                }
                out.truncate(start);
                line(out, e.mc_read_reply());
                return None;
            }
        }
    }
    line(out, "END");
    None
}

/// MemcacheDB's range get: live string items with keys in the range, in key order. LMDB keeps
/// keys sorted, so this is one cursor walk.
fn rget(
    start: &[u8],
    end: &[u8],
    left_open: bool,
    right_open: bool,
    max: u32,
    out: &mut Vec<u8>,
    pass: &mut Pass<'_>,
) {
    use std::ops::Bound;
    let flushed = pass.flushed();
    let now = pass.now_ms;
    let store = match pass.snap() {
        Ok(t) => t,
        Err(e) => {
            if !e.is_damage() {
                error!("cannot open read transaction: {e}");
            }
            return line(out, e.mc_read_reply());
        }
    };
    let lo = if left_open {
        Bound::Excluded(start)
    } else {
        Bound::Included(start)
    };
    let hi = if right_open {
        Bound::Excluded(end)
    } else {
        Bound::Included(end)
    };
    if start > end || (start == end && (left_open || right_open)) {
        // An empty range (heed would refuse bounds that cross).
        return line(out, "END");
    }
    let start_len = out.len();
    if max > 0 {
        let walk = |out: &mut Vec<u8>| -> Result<(), StoreError> {
            let mut sent = 0;
            for entry in store.range(lo, hi)? {
                let (key, bytes) = entry?;
                let item = crate::storage::item::decode(bytes)?;
                if flushed || item.meta.is_expired(now) || item.meta.kind != Kind::String {
                    continue;
                }
                value_line(out, key, item.meta.flags, item.value, None);
                sent += 1;
                if sent == max {
                    break;
                }
            }
            Ok(())
        };
        if let Err(e) = walk(out) {
            if !e.is_damage() {
                error!("rget failed: {e}");
            }
            out.truncate(start_len);
            return line(out, e.mc_read_reply());
        }
    }
    line(out, "END");
}

/// Encodes a write's reply once it has committed.
pub fn complete(
    out: &mut Vec<u8>,
    counters: &Counters,
    prefixes: &super::stats::Prefixes,
    noreply: bool,
    kind: McReply,
    outcome: Outcome,
) {
    let c = counters;
    match (&outcome, kind) {
        (Outcome::Stored, McReply::Store(mode)) => {
            Counters::bump(&c.total_items);
            if mode == StoreMode::Cas {
                Counters::bump(&c.cas_hits);
            }
        }
        (Outcome::Exists, _) => Counters::bump(&c.cas_badval),
        (Outcome::NotFound, McReply::Store(StoreMode::Cas)) => Counters::bump(&c.cas_misses),
        (Outcome::Deleted, _) => Counters::bump(&c.delete_hits),
        (Outcome::NotFound, McReply::Delete) => Counters::bump(&c.delete_misses),
        (Outcome::Number(_), McReply::Incr) => Counters::bump(&c.incr_hits),
        (Outcome::Number(_), McReply::Decr) => Counters::bump(&c.decr_hits),
        (Outcome::NotFound, McReply::Incr) => Counters::bump(&c.incr_misses),
        (Outcome::NotFound, McReply::Decr) => Counters::bump(&c.decr_misses),
        (Outcome::Touched, _) => Counters::bump(&c.touch_hits),
        (Outcome::NotFound, McReply::Touch) => Counters::bump(&c.touch_misses),
        (Outcome::Full, _) => Counters::bump(&c.store_no_memory),
        (_, McReply::TooLarge) | (Outcome::TooLarge, _) => Counters::bump(&c.store_too_large),
        _ => {}
    }
    // Failures of the store are errors the client must see, even with noreply.
    let failed = matches!(outcome, Outcome::Full | Outcome::Failed | Outcome::Damaged);
    if noreply && !failed {
        return;
    }
    if kind == McReply::TooLarge && !failed {
        return line(out, "SERVER_ERROR object too large for cache");
    }
    match outcome {
        Outcome::Stored => line(out, "STORED"),
        Outcome::NotStored => line(out, "NOT_STORED"),
        Outcome::Exists => line(out, "EXISTS"),
        Outcome::NotFound => line(out, "NOT_FOUND"),
        Outcome::Deleted => line(out, "DELETED"),
        Outcome::Touched => line(out, "TOUCHED"),
        Outcome::Done => line(out, "OK"),
        Outcome::Number(n) => {
            number(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Outcome::NonNumeric => line(
            out,
            "CLIENT_ERROR cannot increment or decrement non-numeric value",
        ),
        Outcome::Values(values) => {
            let with_cas = matches!(kind, McReply::Gat { with_cas: true });
            for v in &values {
                Counters::bump(&c.cmd_get);
                Counters::bump(&c.get_hits);
                prefixes.record_hit(&v.key);
                value_line(out, &v.key, v.flags, &v.value, with_cas.then_some(v.cas));
            }
            line(out, "END");
        }
        Outcome::TooLarge => line(out, "SERVER_ERROR object too large for cache"),
        Outcome::Full => line(out, "SERVER_ERROR out of memory storing object"),
        // The writer logged why (once); a reply per failed write would flood the log.
        Outcome::Failed => line(out, "SERVER_ERROR storage failure"),
        Outcome::Damaged => line(out, crate::storage::MC_DAMAGED),
        Outcome::BadKey => line(out, "CLIENT_ERROR bad command line format"),
        Outcome::WrongType => line(out, WRONGTYPE),
        // A refusal worded for memcached clients (a gat reply over `REPLY_MAX`).
        Outcome::Err(msg) => line(out, msg),
        // RESP-only outcomes never answer a memcached write.
        Outcome::Reply(_)
        | Outcome::Int(_)
        | Outcome::Bulk(_)
        | Outcome::Nil
        | Outcome::Double(_)
        | Outcome::Array(_)
        | Outcome::NilArray
        | Outcome::Pairs(_)
        | Outcome::Set(_)
        | Outcome::Meta(_)
        | Outcome::Blocked => {
            error!("a RESP outcome reached a memcached reply");
            line(out, "SERVER_ERROR internal error")
        }
    }
}

/// memcached's memory limit as memkeep has one: the cap in cache mode, else the map.
fn limit_maxbytes(cfg: &crate::config::Config) -> u64 {
    if cfg.max_disk > 0 {
        cfg.max_disk
    } else {
        cfg.map_size
    }
}

fn stat(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    use std::io::Write;
    let _ = write!(out, "STAT {name} {value}\r\n");
}

/// `stats items` / `stats slabs`: the store as memcached's slab class 1 (memkeep has no slabs:
/// every item is in it), with the counts memkeep has; an empty store lists no class, as
/// memcached does. Figures memkeep has no equivalent for are 0.
fn slab_stats(items: bool, out: &mut Vec<u8>, pass: &mut Pass<'_>) {
    let shared = pass.shared;
    let mut t = Totals::default();
    for c in shared.counters.iter() {
        t.add(c);
    }
    let cache = shared.cache.figures();
    let (n, bytes) = match pass.snap() {
        Ok(store) => (store.len().unwrap_or(0), store.used_bytes()),
        Err(_) => (0, 0),
    };
    if items {
        if n > 0 {
            let item = |out: &mut Vec<u8>, name: &str, v: u64| {
                stat(out, &format!("items:1:{name}"), v);
            };
            item(out, "number", n);
            item(out, "number_hot", 0);
            item(out, "number_warm", 0);
            item(out, "number_cold", n);
            item(out, "age_hot", 0);
            item(out, "age_warm", 0);
            item(out, "age", 0);
            item(out, "mem_requested", bytes);
            item(out, "evicted", cache.evictions);
            item(out, "evicted_nonzero", 0);
            item(out, "evicted_time", 0);
            item(out, "outofmemory", t.store_no_memory);
            item(out, "tailrepairs", 0);
            item(out, "reclaimed", 0);
            item(out, "expired_unfetched", 0);
            item(out, "evicted_unfetched", cache.evicted_unfetched);
            item(out, "evicted_active", 0);
            item(out, "crawler_reclaimed", 0);
            item(out, "crawler_items_checked", 0);
            item(out, "lrutail_reflocked", 0);
            item(out, "moves_to_cold", 0);
            item(out, "moves_to_warm", 0);
            item(out, "moves_within_lru", 0);
            item(out, "direct_reclaims", 0);
            item(out, "hits_to_hot", 0);
            item(out, "hits_to_warm", 0);
            item(out, "hits_to_cold", t.get_hits);
            item(out, "hits_to_temp", 0);
        }
    } else {
        if n > 0 {
            let slab = |out: &mut Vec<u8>, name: &str, v: u64| {
                stat(out, &format!("1:{name}"), v);
            };
            // One chunk per item, as large as the largest item may be.
            slab(out, "chunk_size", shared.config.max_item_size);
            slab(out, "chunks_per_page", 1);
            slab(out, "total_pages", n);
            slab(out, "total_chunks", n);
            slab(out, "used_chunks", n);
            slab(out, "free_chunks", 0);
            slab(out, "free_chunks_end", 0);
            slab(out, "get_hits", t.get_hits);
            slab(out, "cmd_set", t.cmd_set);
            slab(out, "delete_hits", t.delete_hits);
            slab(out, "incr_hits", t.incr_hits);
            slab(out, "decr_hits", t.decr_hits);
            slab(out, "cas_hits", t.cas_hits);
            slab(out, "cas_badval", t.cas_badval);
            slab(out, "touch_hits", t.touch_hits);
        }
        stat(out, "active_slabs", u64::from(n > 0));
        stat(out, "total_malloced", if n > 0 { bytes } else { 0 });
    }
    line(out, "END");
}

pub(super) fn stats(args: &[u8], out: &mut Vec<u8>, pass: &mut Pass<'_>) {
    let shared = pass.shared;
    let cfg = &shared.config;
    match args {
        b"" => {
            let mut t = Totals::default();
            for c in shared.counters.iter() {
                t.add(c);
            }
            let now_s = pass.now_ms / 1000;
            let (user, sys) = rusage();
            // Before the snapshot (see `CacheStats::figures`).
            let cache = shared.cache.figures();
            let (curr_items, bytes) = match pass.snap() {
                Ok(store) => (store.len().unwrap_or(0), store.used_bytes()),
                Err(_) => (0, 0),
            };
            let mem = super::stats::rss();
            stat(out, "pid", std::process::id());
            stat(out, "uptime", shared.started.elapsed().as_secs());
            stat(out, "time", now_s);
            stat(out, "version", VERSION);
            stat(out, "pointer_size", usize::BITS);
            stat(out, "rusage_user", format!("{user:.6}"));
            stat(out, "rusage_system", format!("{sys:.6}"));
            stat(out, "max_connections", cfg.max_connections);
            stat(
                out,
                "curr_connections",
                shared.gauges.curr_connections.load(Ordering::Relaxed),
            );
            stat(out, "total_connections", t.total_connections);
            stat(out, "rejected_connections", t.rejected_connections);
            stat(out, "idle_kicks", t.idle_kicks);
            stat(out, "cmd_get", t.cmd_get);
            stat(out, "cmd_set", t.cmd_set);
            stat(out, "cmd_flush", t.cmd_flush);
            stat(out, "cmd_touch", t.cmd_touch);
            stat(out, "get_hits", t.get_hits);
            stat(out, "get_misses", t.get_misses);
            stat(out, "get_expired", t.get_expired);
            stat(out, "get_flushed", t.get_flushed);
            stat(out, "delete_misses", t.delete_misses);
            stat(out, "delete_hits", t.delete_hits);
            stat(out, "incr_misses", t.incr_misses);
            stat(out, "incr_hits", t.incr_hits);
            stat(out, "decr_misses", t.decr_misses);
            stat(out, "decr_hits", t.decr_hits);
            stat(out, "cas_misses", t.cas_misses);
            stat(out, "cas_hits", t.cas_hits);
            stat(out, "cas_badval", t.cas_badval);
            stat(out, "touch_hits", t.touch_hits);
            stat(out, "touch_misses", t.touch_misses);
            stat(out, "store_too_large", t.store_too_large);
            stat(out, "store_no_memory", t.store_no_memory);
            stat(out, "auth_cmds", t.auth_cmds);
            stat(out, "auth_errors", t.auth_errors);
            stat(out, "bytes_read", t.bytes_read);
            stat(out, "bytes_written", t.bytes_written);
            // In cache mode the cap is the limit items are evicted at.
            stat(out, "limit_maxbytes", limit_maxbytes(cfg));
            let g = &shared.gauges;
            stat(
                out,
                "accepting_conns",
                u64::from(!g.accept_paused.load(Ordering::Relaxed)),
            );
            stat(
                out,
                "listen_disabled_num",
                g.listen_disabled.load(Ordering::Relaxed),
            );
            stat(out, "threads", cfg.worker_threads());
            stat(out, "conn_yields", 0);
            stat(out, "malloc_fails", 0);
            stat(out, "curr_items", curr_items);
            stat(out, "total_items", t.total_items);
            stat(out, "bytes", bytes);
            stat(out, "expired_unfetched", 0);
            stat(out, "evicted_unfetched", cache.evicted_unfetched);
            stat(out, "evictions", cache.evictions);
            stat(out, "reclaimed", 0);
            // memkeep's own: resident memory apart (the page cache holding the map is the
            // kernel's, and shrinks under pressure), and in cache mode the measure the cap is
            // held to.
            stat(out, "rss_anon", mem.anon);
            stat(out, "rss_file", mem.file);
            // Group commit (`always`): the log's fdatasyncs and the writes they acknowledged.
            stat(out, "log_fsyncs", cache.log_fsyncs);
            stat(out, "log_fsync_writes", cache.log_fsync_writes);
            stat(out, "log_bytes", cache.log_bytes);
            if let Some(v) = shared.store.vlog() {
                // Values in the log (`value_log_min`): the segments kept for them, the
                // bytes of values in them still live (at the collector's last scan), and
                // the collector's work.
                let f = v.footprint();
                stat(out, "log_value_segments", f.segments);
                stat(out, "log_value_bytes", f.bytes);
                stat(out, "log_value_live_bytes", f.live_bytes);
                stat(out, "log_value_moved_bytes", f.moved_bytes);
                stat(out, "log_value_segments_retired", f.retired);
            }
            if cfg.max_disk > 0 {
                stat(out, "max_disk", cfg.max_disk);
                stat(out, "disk_used", cache.data_bytes);
            }
            // Reads of values not in memory, done by reader threads (`cold.rs`).
            if let Some(pool) = &shared.cold {
                let c = pool.stats();
                stat(out, "cold_reads", c.waits.load(Ordering::Relaxed));
                stat(out, "cold_reads_ring", c.ring_waits.load(Ordering::Relaxed));
                stat(out, "cold_reads_direct", c.direct.load(Ordering::Relaxed));
                stat(out, "cold_read_bytes", c.bytes.load(Ordering::Relaxed));
                stat(out, "cold_read_errors", c.errors.load(Ordering::Relaxed));
            }
            line(out, "END");
        }
        b"settings" => {
            stat(out, "maxbytes", limit_maxbytes(cfg));
            stat(out, "maxconns", cfg.max_connections);
            stat(out, "idle_time", cfg.idle_timeout);
            stat(out, "tcpport", cfg.port);
            stat(out, "udpport", 0);
            stat(out, "inter", &cfg.listen);
            stat(out, "verbosity", cfg.verbosity);
            // memcached's -M: "off" refuses writes when full, as the store does without a cap.
            stat(
                out,
                "evictions",
                if cfg.max_disk > 0 { "on" } else { "off" },
            );
            stat(out, "num_threads", cfg.worker_threads());
            stat(out, "cas_enabled", "yes");
            stat(out, "item_size_max", cfg.max_item_size);
            stat(out, "data_dir", cfg.data_dir.display());
            stat(out, "sync", cfg.sync);
            stat(out, "sync_interval_ms", cfg.sync_interval_ms);
            stat(out, "resp_port", cfg.resp_port);
            stat(out, "io_threads", cfg.io_threads);
            stat(out, "max_disk", cfg.max_disk);
            // memcached's names: the `stats detail` prefix delimiter and whether it counts.
            stat(out, "stat_key_prefix", ":");
            stat(
                out,
                "detail_enabled",
                if shared.prefixes.enabled() {
                    "yes"
                } else {
                    "no"
                },
            );
            stat(out, "track_sizes", "no");
            line(out, "END");
        }
        b"reset" => {
            for c in shared.counters.iter() {
                c.reset();
            }
            shared.cache.reset();
            shared.prefixes.clear();
            line(out, "RESET");
        }
        // LMDB environment figures (MemcacheDB's `stats mdb`; memkeep also answers `stats lmdb`).
        b"lmdb" | b"mdb" => {
            let env = shared.store.env();
            let info = env.info();
            let st = env.stat();
            let (entries, depth) = match pass.snap() {
                Ok(store) => (
                    store.len().unwrap_or(0),
                    store
                        .items()
                        .stat(store.txn())
                        .map(|s| s.depth)
                        .unwrap_or(0),
                ),
                Err(_) => (0, 0),
            };
            let file = cfg.data_dir.join("data.mdb");
            let (file_len, file_blocks) = std::fs::metadata(&file)
                .map(|m| {
                    use std::os::unix::fs::MetadataExt;
                    (m.len(), m.blocks() * 512)
                })
                .unwrap_or((0, 0));
            stat(out, "env_home", cfg.data_dir.display());
            stat(out, "map_size", info.map_size);
            stat(out, "page_size", st.page_size);
            stat(out, "last_pgno", info.last_page_number);
            stat(out, "used_bytes", shared.store.used_bytes());
            // The pages LMDB's trees occupy now (what max_disk caps; free pages excluded).
            let data = pass
                .snap()
                .and_then(|s| s.data_pages(s.txn()))
                .map_or(0, |p| p * st.page_size as u64);
            stat(out, "data_bytes", data);
            stat(out, "max_disk", cfg.max_disk);
            stat(out, "last_txnid", info.last_txn_id);
            stat(out, "max_readers", info.maximum_number_of_readers);
            stat(out, "num_readers", info.number_of_readers);
            stat(out, "items", entries);
            stat(out, "items_depth", depth);
            stat(out, "file_size", file_len);
            stat(out, "file_allocated", file_blocks);
            stat(out, "sync", cfg.sync);
            line(out, "END");
        }
        b"items" | b"slabs" => slab_stats(args == b"items", out, pass),
        // memcached without `-o track_sizes`.
        b"sizes" => {
            stat(out, "sizes_status", "disabled");
            line(out, "END");
        }
        // memkeep does not list its connections here (RESP's CLIENT LIST does).
        b"conns" => line(out, "END"),
        _ if args.starts_with(b"detail") && args.get(6).is_none_or(|&b| b == b' ') => {
            // memcached looks at the word after `detail` only.
            let word = args.split(|&b| b == b' ').filter(|w| !w.is_empty()).nth(1);
            match word {
                Some(b"on") => {
                    shared.prefixes.set_enabled(true);
                    line(out, "OK");
                }
                Some(b"off") => {
                    shared.prefixes.set_enabled(false);
                    line(out, "OK");
                }
                Some(b"dump") => shared.prefixes.dump(out),
                _ => line(out, "CLIENT_ERROR usage: stats detail on|off|dump"),
            }
        }
        _ => line(out, "ERROR"),
    }
}
