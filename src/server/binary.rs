//! Runs memcached binary-protocol requests for a memcached-port connection whose first byte was
//! the request magic (0x80). Gets are answered from the pass's read transaction; every write is a
//! `MetaOp` (or a delete/flush) for the writer, encoded here when it commits. SASL PLAIN checks
//! the same credentials as the text protocol's `auth_file`.
//!
//! Quiet requests (`GETQ`, `SETQ`, ...) answer nothing on a get miss or a successful write;
//! errors are always sent. Replies leave in request order like the text protocol's, so `NOOP`
//! needs no special flushing.

use log::{debug, error};

use super::conn::Conn;
use super::memcache::WRONGTYPE;
use super::stats::Counters;
use super::worker::{Pass, Reply, Stop, Tag};
use crate::command::{KeyValue, MetaCode, MetaOp, MetaStore, Outcome, StoreMode, WriteOp};
use crate::engine::writer::WriteRequest;
use crate::protocol::binary::{
    self as bin, ARITH_NO_CREATE, Command, Frame, Request, auth_exempt, opcode, parse, status,
};
use crate::storage::overlay::Found;
use crate::storage::{ItemRef, Kind};

/// How to answer a binary write once it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinKind {
    Store(StoreMode),
    /// `SET` of an over-size value: the old value was deleted; the answer is `E2BIG`.
    TooLarge,
    Delete,
    Arith,
    /// `GAT*`; `with_key` when the key waits in the connection's echo queue.
    Gat {
        with_key: bool,
    },
    Touch,
    Flush,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinReply {
    pub opcode: u8,
    pub opaque: u32,
    pub quiet: bool,
    pub kind: BinKind,
}

/// Parses and runs up to `budget` binary requests from `conn`'s input.
pub fn process(conn: &mut Conn, pass: &mut Pass<'_>, slot: u32, budget: usize) -> Stop {
    let mut left = budget;
    loop {
        if let Some(stop) = conn.why_stop(left, false) {
            return stop;
        }
        let (epoch, inflight, authed, peer) =
            (conn.epoch, conn.inflight, conn.mc_authed, conn.peer);
        let readonly = conn.mc_readonly;
        let conn_sasl = conn.sasl_continue;
        let must_auth = pass.shared.mc_auth.is_some() && !authed;
        let (input, out, echoes) = conn.io();
        let parsed = match parse(input, &pass.limits) {
            Err(_) => return Stop::NeedInput,
            Ok(p) => p,
        };
        let (consumed, swallow) = (parsed.consumed, parsed.swallow);
        let write = match &parsed.frame {
            Frame::Request(req) if !must_auth || auth_exempt(req.opcode) => {
                write_op(req).map(|(op, kind, key)| {
                    record_prefixes(&pass.shared.prefixes, req);
                    let reply = BinReply {
                        opcode: req.opcode,
                        opaque: req.opaque,
                        quiet: req.quiet,
                        kind,
                    };
                    (op, reply, key)
                })
            }
            _ => None,
        };
        if !matches!(parsed.frame, Frame::Close) && pass.shared.pause.holds(write.is_some()) {
            // CLIENT PAUSE, as on the text protocol.
            return Stop::Paused;
        }
        // A replica's data is its primary's; a read-only user (`auth_readonly`) may not write.
        // Either way the write is refused (quiet or not: errors are always sent), and the
        // connection stays.
        let refusal = || -> Option<(u16, &[u8])> {
            if pass.shared.repl.is_replica() {
                Some((
                    status::NOT_STORED,
                    b"You can't write against a read only replica.",
                ))
            } else if readonly {
                Some((status::AUTH_ERROR, b"Read-only user"))
            } else if pass.shared.repl.too_few_replicas() {
                Some((status::NOT_STORED, b"Not enough good replicas to write."))
            } else {
                None
            }
        };
        if let Some((_, reply, _)) = &write
            && let Some((code, text)) = refusal()
        {
            if inflight > 0 {
                return Stop::Blocked;
            }
            bin::error_text(out, reply.opcode, reply.opaque, code, text);
            conn.consume(consumed);
            conn.swallow = swallow;
            left -= 1;
            continue;
        }
        match write {
            Some((op, reply, key)) => {
                if let Some(key) = key {
                    echoes.push_back(super::meta::Echo::key_only(key));
                }
                let tag = Tag {
                    slot,
                    epoch,
                    reply: Reply::Bin(reply),
                };
                count_submit(pass.counters, reply.kind);
                pass.pending.push(WriteRequest { tag, op });
                conn.inflight += 1;
            }
            // Everything else answers at once, so it waits for earlier writes' replies.
            None if inflight > 0 => return Stop::Blocked,
            None => {
                let mut auth = None;
                let close = match parsed.frame {
                    Frame::Close => true,
                    // Before authenticating, memcached answers any refused request (but the SASL
                    // ones and a short body) with an auth error, and closes.
                    Frame::Error(e) if must_auth && !e.before_auth && !auth_exempt(e.opcode) => {
                        bin::error(out, e.opcode, e.opaque, status::AUTH_ERROR);
                        true
                    }
                    Frame::Error(e) => {
                        debug!("{peer:?}: binary request refused: {e:?}");
                        bin::encode_error(out, &e);
                        e.close
                    }
                    Frame::Request(req) if must_auth && !auth_exempt(req.opcode) => {
                        bin::error(out, req.opcode, req.opaque, status::AUTH_ERROR);
                        true
                    }
                    Frame::Request(req) => {
                        let sasl = Sasl {
                            continuing: conn_sasl,
                            result: &mut auth,
                        };
                        immediate(&req, out, pass, sasl)
                    }
                };
                if pass.deferred() {
                    // A get whose item is being read in: the request stays, and runs again then.
                    return Stop::Blocked;
                }
                match auth {
                    Some(AuthResult::Authenticated { readonly }) => {
                        conn.mc_authed = true;
                        conn.mc_readonly = readonly;
                        conn.sasl_continue = false;
                    }
                    Some(AuthResult::Failed) => {
                        conn.mc_authed = false;
                        conn.mc_readonly = false;
                        conn.sasl_continue = false;
                    }
                    Some(AuthResult::Continue) => conn.sasl_continue = true,
                    None => {}
                }
                if close {
                    conn.consume(consumed);
                    conn.closing = true;
                    return Stop::Close;
                }
            }
        }
        conn.consume(consumed);
        conn.swallow = swallow;
        left -= 1;
    }
}

/// `stats detail`: what a write counts, by key prefix, as memcached's binary protocol counts
/// it (a touch or gat is a get; its hit is counted when it completes).
fn record_prefixes(p: &super::stats::Prefixes, req: &Request<'_>) {
    if !p.enabled() {
        return;
    }
    match req.command {
        Command::Store { key, .. } | Command::TooLarge { key, .. } => p.record_set(key),
        Command::Delete { key } => p.record_delete(key),
        Command::Gat { key, .. } | Command::Touch { key, .. } => p.record_get(key, false),
        _ => {}
    }
}

/// The write a request turns into, if it is one, and the key its reply needs (GAT, TOUCH).
fn write_op(req: &Request<'_>) -> Option<(WriteOp, BinKind, Option<Vec<u8>>)> {
    let compare = (req.cas != 0).then_some(req.cas);
    let meta = |op: MetaOp| WriteOp::Meta(Box::new(op));
    Some(match req.command {
        Command::Store {
            mode,
            key,
            flags,
            exptime,
            value,
        } => (
            meta(MetaOp::Store(MetaStore {
                mode,
                kv: KeyValue::new(key, value),
                flags,
                exptime: i64::from(exptime),
                compare,
                invalidate: false,
                vivify: None,
                new_cas: None,
            })),
            BinKind::Store(mode),
            None,
        ),
        Command::TooLarge {
            mode: StoreMode::Set,
            key,
        } => (
            WriteOp::Delete { key: key.to_vec() },
            BinKind::TooLarge,
            None,
        ),
        Command::Delete { key } => (
            meta(MetaOp::Delete {
                key: key.to_vec(),
                compare,
                invalidate: false,
                exptime: None,
                keep: false,
                new_cas: None,
            }),
            BinKind::Delete,
            None,
        ),
        Command::Arith {
            incr,
            key,
            delta,
            initial,
            exptime,
        } => (
            meta(MetaOp::Arith {
                key: key.to_vec(),
                incr,
                delta,
                compare,
                vivify: (exptime != ARITH_NO_CREATE).then_some(i64::from(exptime)),
                initial,
                exptime: None,
                new_cas: None,
            }),
            BinKind::Arith,
            None,
        ),
        Command::Gat {
            key,
            exptime,
            with_key,
        } => (
            touch_op(key, exptime),
            BinKind::Gat { with_key },
            Some(key.to_vec()),
        ),
        Command::Touch { key, exptime } => {
            (touch_op(key, exptime), BinKind::Touch, Some(key.to_vec()))
        }
        Command::Flush { exptime } => (
            WriteOp::FlushAll {
                delay: i64::from(exptime),
            },
            BinKind::Flush,
            None,
        ),
        _ => return None,
    })
}

fn touch_op(key: &[u8], exptime: u32) -> WriteOp {
    WriteOp::Meta(Box::new(MetaOp::Get {
        key: key.to_vec(),
        touch: Some(i64::from(exptime)),
        vivify: None,
        recache: None,
        new_cas: None,
    }))
}

fn count_submit(c: &Counters, kind: BinKind) {
    match kind {
        BinKind::Store(_) | BinKind::TooLarge => Counters::bump(&c.cmd_set),
        BinKind::Flush => Counters::bump(&c.cmd_flush),
        BinKind::Touch | BinKind::Gat { .. } => Counters::bump(&c.cmd_touch),
        _ => {}
    }
}

/// What a SASL request did to the connection's authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AuthResult {
    /// `readonly`: the user is one of `auth_readonly`.
    Authenticated { readonly: bool },
    /// A failed attempt also logs an authenticated connection out, as memcached does.
    Failed,
    /// `SASL_AUTH` without data: the credentials follow in `SASL_STEP`.
    Continue,
}

/// A connection's SASL state, as one request sees and changes it.
struct Sasl<'a> {
    /// An earlier `SASL_AUTH` asked for a step.
    continuing: bool,
    result: &'a mut Option<AuthResult>,
}

/// Runs a request answered on the worker; returns true when the connection should close.
fn immediate(req: &Request<'_>, out: &mut Vec<u8>, pass: &mut Pass<'_>, sasl: Sasl<'_>) -> bool {
    let (op, opaque) = (req.opcode, req.opaque);
    match req.command {
        Command::Get { key, with_key } => get(req, key, with_key, out, pass),
        Command::TooLarge { .. } => {
            Counters::bump(&pass.counters.store_too_large);
            bin::error(out, op, opaque, status::E2BIG);
        }
        Command::Noop => bin::ok(out, op, opaque, 0),
        Command::Version => bin::text(out, op, opaque, super::memcache::VERSION.as_bytes()),
        Command::Quit => {
            if !req.quiet {
                bin::ok(out, op, opaque, 0);
            }
            return true;
        }
        Command::Stat { group } => stats(group, opaque, out, pass),
        // Without an auth file there is no SASL, as memcached without -S.
        Command::SaslListMechs | Command::SaslAuth { .. } | Command::SaslStep { .. }
            if pass.shared.mc_auth.is_none() =>
        {
            bin::error(out, op, opaque, status::UNKNOWN_COMMAND)
        }
        Command::SaslListMechs => bin::text(out, op, opaque, b"PLAIN"),
        Command::SaslAuth { mechanism, .. } | Command::SaslStep { mechanism, .. }
            if mechanism.len() > bin::SASL_MECH_MAX =>
        {
            bin::error(out, op, opaque, status::EINVAL)
        }
        Command::SaslAuth { data: b"", .. } => {
            *sasl.result = Some(AuthResult::Continue);
            bin::response(out, op, status::AUTH_CONTINUE, opaque, 0, &[], &[], &[]);
        }
        Command::SaslAuth { mechanism, data } => plain(req, mechanism, data, out, pass, sasl),
        Command::SaslStep { mechanism, data } if sasl.continuing => {
            plain(req, mechanism, data, out, pass, sasl)
        }
        Command::SaslStep { .. } => {
            Counters::bump(&pass.counters.auth_errors);
            *sasl.result = Some(AuthResult::Failed);
            bin::error(out, op, opaque, status::AUTH_ERROR);
        }
        Command::Store { .. }
        | Command::Delete { .. }
        | Command::Arith { .. }
        | Command::Gat { .. }
        | Command::Touch { .. }
        | Command::Flush { .. } => {
            error!("binary write request reached the read path");
            bin::error(out, op, opaque, status::EINVAL);
        }
    }
    false
}

/// Checks a SASL PLAIN attempt and answers it.
fn plain(
    req: &Request<'_>,
    mechanism: &[u8],
    data: &[u8],
    out: &mut Vec<u8>,
    pass: &Pass<'_>,
    sasl: Sasl<'_>,
) {
    let (op, opaque) = (req.opcode, req.opaque);
    Counters::bump(&pass.counters.auth_cmds);
    if mechanism == b"PLAIN"
        && let Some(user) = plain_ok(data, pass)
    {
        let readonly = pass.shared.mc_readonly.contains(user);
        *sasl.result = Some(AuthResult::Authenticated { readonly });
        bin::text(out, op, opaque, b"Authenticated");
    } else {
        Counters::bump(&pass.counters.auth_errors);
        *sasl.result = Some(AuthResult::Failed);
        bin::error(out, op, opaque, status::AUTH_ERROR);
    }
}

/// SASL PLAIN: `authzid \0 authcid \0 password`, checked against the auth file's users; the
/// authzid may be empty or the same user.
fn plain_ok<'d>(data: &'d [u8], pass: &Pass<'_>) -> Option<&'d [u8]> {
    let mut parts = data.split(|&b| b == 0);
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let ok = (authzid.is_empty() || authzid == user)
        && pass
            .shared
            .mc_auth
            .as_ref()
            .and_then(|users| users.get(user))
            .is_some_and(|p| super::acl::secret_eq(password, p));
    ok.then_some(user)
}

fn get(req: &Request<'_>, key: &[u8], with_key: bool, out: &mut Vec<u8>, pass: &mut Pass<'_>) {
    let (op, opaque) = (req.opcode, req.opaque);
    let flushed = pass.flushed();
    let now = pass.now_ms;
    let counters = pass.counters;
    let shared = pass.shared;
    let store = match pass.snap() {
        Ok(t) => t,
        Err(e) => {
            if e.is_damage() {
                return damaged(out, op, opaque);
            }
            error!("cannot open read transaction: {e}");
            return bin::error(out, op, opaque, status::ENOMEM);
        }
    };
    let echo_key: &[u8] = if with_key { key } else { b"" };
    let found = match store.lookup(key) {
        // Not in memory: no answer yet; the request runs again once it is read in.
        Ok(Found::Cold) => return,
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
        Ok(Some(ItemRef { meta, value })) if !flushed && !meta.is_expired(now) => {
            if meta.kind != Kind::String {
                return wrong_type(out, op, opaque);
            }
            Counters::bump(&counters.get_hits);
            bin::hit(out, op, opaque, meta.cas, meta.flags, echo_key, value);
            if let Some(h) = shared.store.hits() {
                h.fetched(key, meta.cas, now);
            }
        }
        Ok(_) => {
            Counters::bump(&counters.get_misses);
            if !req.quiet {
                bin::miss(out, op, opaque, echo_key);
            }
        }
        Err(e) if e.is_damage() => damaged(out, op, opaque),
        Err(e) => {
            error!("read of a stored item failed: {e}");
            bin::error(out, op, opaque, status::ENOMEM);
        }
    }
}

/// The store is damaged: status internal error, saying so.
fn damaged(out: &mut Vec<u8>, op: u8, opaque: u32) {
    let text = crate::storage::BIN_DAMAGED.as_bytes();
    bin::response(out, op, status::EINTERNAL, opaque, 0, &[], &[], text);
}

/// A key holding a Redis collection where a string is needed.
fn wrong_type(out: &mut Vec<u8>, op: u8, opaque: u32) {
    let text = WRONGTYPE.trim_start_matches("CLIENT_ERROR ");
    bin::response(
        out,
        op,
        status::EINVAL,
        opaque,
        0,
        &[],
        &[],
        text.as_bytes(),
    );
}

/// `STAT [group]`: the text protocol's `stats` lines, one packet each, then the empty packet.
fn stats(group: &[u8], opaque: u32, out: &mut Vec<u8>, pass: &mut Pass<'_>) {
    // memcached's binary `detail` group: ` on`/` off` switch the prefix statistics, ` dump`
    // answers the text dump as one statistic named `detailed` (matched as prefixes, as
    // memcached compares them).
    if let Some(sub) = group.strip_prefix(b"detail") {
        let prefixes = &pass.shared.prefixes;
        if sub.starts_with(b" dump") {
            let mut text = Vec::new();
            prefixes.dump(&mut text);
            bin::stat(out, opaque, b"detailed", &text);
        } else if sub.starts_with(b" on") {
            prefixes.set_enabled(true);
        } else if sub.starts_with(b" off") {
            prefixes.set_enabled(false);
        } else {
            return bin::error(out, opcode::STAT, opaque, status::KEY_ENOENT);
        }
        return bin::stat_end(out, opaque);
    }
    let mut text = Vec::new();
    super::memcache::stats(group, &mut text, pass);
    let mut any = false;
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(stat) = line.strip_prefix(b"STAT ") {
            let sp = stat.iter().position(|&b| b == b' ').unwrap_or(stat.len());
            let value = stat.get(sp + 1..).unwrap_or(b"");
            bin::stat(out, opaque, &stat[..sp], value);
            any = true;
        } else if line == b"ERROR" && !any {
            return bin::error(out, opcode::STAT, opaque, status::KEY_ENOENT);
        }
    }
    bin::stat_end(out, opaque);
}

/// Encodes a binary write's reply once it has committed.
pub fn complete(
    out: &mut Vec<u8>,
    echoes: &mut super::meta::EchoQueue,
    counters: &Counters,
    prefixes: &super::stats::Prefixes,
    r: BinReply,
    outcome: Outcome,
) {
    let (op, opaque) = (r.opcode, r.opaque);
    let touched = match r.kind {
        BinKind::Gat { .. } | BinKind::Touch => echoes.pop_front().map(|e| e.into_key()),
        _ => None,
    };
    if let (Some(k), Outcome::Meta(m)) = (&touched, &outcome)
        && m.code == MetaCode::Ok
    {
        prefixes.record_hit(k);
    }
    // The key a GATK's reply carries.
    let key = touched.filter(|_| matches!(r.kind, BinKind::Gat { with_key: true }));
    let fail = |out: &mut Vec<u8>, st: u16| bin::error(out, op, opaque, st);
    match outcome {
        Outcome::Meta(m) => match (m.code, r.kind, m.item) {
            (MetaCode::Ok, BinKind::Store(_), item) => {
                Counters::bump(&counters.total_items);
                if !r.quiet {
                    bin::ok(out, op, opaque, item.map_or(0, |i| i.cas));
                }
            }
            (MetaCode::Ok, BinKind::Delete, _) => {
                Counters::bump(&counters.delete_hits);
                if !r.quiet {
                    bin::ok(out, op, opaque, 0);
                }
            }
            (MetaCode::Ok, BinKind::Arith, Some(i)) => {
                if !r.quiet {
                    let n = crate::semantics::parse_counter(&i.value).unwrap_or(0);
                    bin::counter(out, op, opaque, i.cas, n);
                }
            }
            (MetaCode::Ok, BinKind::Gat { .. }, Some(i)) => {
                Counters::bump(&counters.touch_hits);
                let key = key.as_deref().unwrap_or(b"");
                bin::hit(out, op, opaque, i.cas, i.flags, key, &i.value);
            }
            (MetaCode::Ok, BinKind::Touch, Some(i)) => {
                Counters::bump(&counters.touch_hits);
                bin::hit(out, op, opaque, i.cas, i.flags, b"", b"");
            }
            (MetaCode::Miss, BinKind::Gat { .. } | BinKind::Touch, _) => {
                Counters::bump(&counters.touch_misses);
                if !r.quiet {
                    bin::miss(out, op, opaque, key.as_deref().unwrap_or(b""));
                }
            }
            (MetaCode::Exists, ..) => fail(out, status::KEY_EEXISTS),
            (MetaCode::NotFound, BinKind::Delete, _) => {
                Counters::bump(&counters.delete_misses);
                fail(out, status::KEY_ENOENT)
            }
            (MetaCode::NotFound | MetaCode::Miss, ..) => fail(out, status::KEY_ENOENT),
            // memcached's binary stores say why: add finds the key, replace misses it.
            (MetaCode::NotStored, BinKind::Store(StoreMode::Add), _) => {
                fail(out, status::KEY_EEXISTS)
            }
            (MetaCode::NotStored, BinKind::Store(StoreMode::Replace), _) => {
                fail(out, status::KEY_ENOENT)
            }
            (MetaCode::NotStored, ..) => fail(out, status::NOT_STORED),
            (code, kind, _) => {
                error!("unexpected binary outcome {code:?} for {kind:?}");
                fail(out, status::EINVAL)
            }
        },
        Outcome::Deleted | Outcome::NotFound if r.kind == BinKind::TooLarge => {
            Counters::bump(&counters.store_too_large);
            fail(out, status::E2BIG)
        }
        Outcome::Done if r.kind == BinKind::Flush => {
            if !r.quiet {
                bin::ok(out, op, opaque, 0);
            }
        }
        Outcome::NonNumeric => fail(out, status::DELTA_BADVAL),
        Outcome::TooLarge => {
            Counters::bump(&counters.store_too_large);
            fail(out, status::E2BIG)
        }
        Outcome::Full => {
            Counters::bump(&counters.store_no_memory);
            fail(out, status::ENOMEM)
        }
        Outcome::WrongType => wrong_type(out, op, opaque),
        Outcome::Damaged => damaged(out, op, opaque),
        Outcome::BadKey => fail(out, status::EINVAL),
        other => {
            if !matches!(other, Outcome::Failed) {
                error!("unexpected outcome for a binary write: {other:?}");
            }
            fail(out, status::ENOMEM)
        }
    }
}
