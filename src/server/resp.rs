//! A RESP connection's session and its pass over the input: parse requests, dispatch them,
//! queue them under MULTI, hand writes and blocking pops to the writer, and answer writes once
//! they commit. Over the same keyspace as the memcached port.
//!
//! What each command means is `crate::commands`'s: its table (`commands::lookup`) gives the
//! name, arity, write or not and key positions; unknown names, authentication and arity are
//! checked here once before dispatch. Writes are parsed by `commands::write_op` into `WriteOp`s
//! for the writer; reads run on the worker (`admin::read`, which calls `commands::read_view`
//! for reads of the store) against the pass's LMDB read transaction. EXEC turns the queue into
//! one `WriteOp::Exec` whose reads (`commands::QueuedRead`) run in the writer's transaction.
//! Replies follow the connection's protocol version (RESP2, or RESP3 after `HELLO 3`).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::admin;
use super::conn::{Conn, WRITE_HIGH};
use super::stats::{CallEnd, CommandStats, Counters};
use super::worker::{Pass, Reply, Stop, Tag};

use crate::command::{ExecOp, Outcome, ReadStep, Step, WriteOp};
pub use crate::commands::RespReply;
use crate::commands::args::unknown_command;
use crate::commands::blocking;
use crate::commands::table::{index, spec_count};
use crate::commands::{
    Args, Cmd, OwnedArgs, QueuedRead, Spec, all_specs, complete, fixed, lookup, reads_store,
    write_op,
};
use crate::protocol::resp::{self, Incomplete, Parsed, enc};
use crate::storage::watch::{WatchedKey, Watches};
use crate::types;

/// Per-connection RESP state.
#[derive(Debug, Default)]
pub struct Session {
    /// PSYNC was sent (replication id, offset): once its output is out, the worker hands the
    /// connection to a replication sender (`repl.rs`).
    pub psync: Option<(String, i64)>,
    /// REPLCONF listening-port: the port a replica says it serves on.
    pub repl_port: u16,
    /// REPLCONF ip-address: the address a replica announces (`replica-announce-ip`).
    pub repl_ip: Option<String>,
    /// WAIT in progress: the offset it waits for and when it gives up.
    pub wait: Option<(u64, Option<std::time::Instant>)>,
    /// MULTI was sent: commands are queued until EXEC or DISCARD.
    pub multi: Option<Multi>,
    /// While EXEC answers its queued commands that do not touch the store: how many were
    /// queued (CLIENT LIST and CLIENT INFO then show the client as Redis does inside EXEC:
    /// `flags=x`, `multi=<queued>`, `cmd=exec`).
    pub in_exec: Option<usize>,
    /// The keys WATCHed, until EXEC, DISCARD, UNWATCH or the connection closes.
    pub watching: Watching,
    /// For each EXEC in flight, how to answer each of its writes.
    pub exec_kinds: std::collections::VecDeque<Vec<RespReply>>,
    /// For each EXEC in flight, the INFO commandstats slot of each of its commands.
    pub exec_slots: std::collections::VecDeque<Vec<u32>>,
    pub v3: bool,
    pub authed: bool,
    /// The ACL user logged in (AUTH / HELLO AUTH); None: `default`.
    pub user: Option<String>,
    pub name: Option<Vec<u8>>,
    pub id: u64,
    /// An MGET whose reply was paused at the output limit: the index of its next key to answer;
    /// 0 when none is paused. The request stays in the input until it is answered in full.
    pub mget_resume: usize,
    /// How many bytes the command being run may add to the output before a reply that can be
    /// sent in pieces (MGET) pauses.
    pub room: usize,
    /// SUBSCRIBE/PSUBSCRIBE channels and patterns (RESP2 connections with any are in
    /// subscribed mode).
    pub subs: super::pubsub::Subscriptions,
    /// A blocking pop is outstanding (registered in `Shared::blocking`): the connection reads
    /// no further request until its completion arrives.
    pub block: Option<BlockWait>,
    /// This connection in `Shared::clients` (CLIENT LIST, CLIENT KILL).
    pub info: Option<Arc<super::clients::ClientInfo>>,
    /// The last command run (CLIENT LIST's `cmd`), and the one `info` was last told of.
    pub last_cmd: Option<&'static str>,
    shown_cmd: Option<&'static str>,
    /// The INFO commandstats slot of the request being dispatched, and whether it was refused
    /// before running (`stat_slot`); None for an unknown command or one queued by MULTI.
    stat: Option<(u32, bool)>,
    /// For each write or blocking pop in flight, in order: its slot (`NO_SLOT`: none) and when
    /// it was dispatched.
    stat_inflight: std::collections::VecDeque<(u32, std::time::Instant)>,
}

/// A write in flight that INFO commandstats does not count (a command EXEC runs).
const NO_SLOT: u32 = u32::MAX;

/// INFO commandstats slots: one per command (`table::index`), then one per container
/// subcommand, in `SUBCOMMANDS` order (`config|get` ...), as Redis counts them.
pub fn stat_slots() -> usize {
    spec_count() + SUBCOMMANDS.iter().map(|(_, _, s)| s.len()).sum::<usize>()
}

/// The slot a request counts in.
pub fn stat_slot(spec: &Spec, args: Args<'_>) -> u32 {
    if args.len() >= 2 {
        let mut base = spec_count();
        for (cmd, _, subs) in SUBCOMMANDS {
            if *cmd == spec.cmd {
                if let Some(j) = subs.iter().position(|(n, _)| args.is(1, n)) {
                    return (base + j) as u32;
                }
                break;
            }
            base += subs.len();
        }
    }
    index(spec) as u32
}

/// The name of each slot, as INFO commandstats shows it.
pub fn stat_names() -> Vec<String> {
    all_specs()
        .map(|s| s.name.to_string())
        .chain(SUBCOMMANDS.iter().flat_map(|(_, lower, subs)| {
            subs.iter()
                .map(move |(n, _)| format!("{lower}|{}", n.to_ascii_lowercase()))
        }))
        .collect()
}

/// Tells the connection's entry in `Shared::clients` what changed in its session (its worker,
/// after each pass that ran its requests).
pub fn refresh_info(
    info: &super::clients::ClientInfo,
    sess: &mut Session,
    last_active: std::time::Instant,
) {
    if let Some(cmd) = sess.last_cmd
        && sess.shown_cmd.is_none_or(|s| !std::ptr::eq(s, cmd))
    {
        info.set_cmd(cmd);
        sess.shown_cmd = Some(cmd);
    }
    use super::clients::{FLAG_BLOCKED, FLAG_MULTI, FLAG_PUBSUB};
    let (sub, psub) = sess.subs.counts();
    let flags = if sess.multi.is_some() { FLAG_MULTI } else { 0 }
        | if sub + psub > 0 { FLAG_PUBSUB } else { 0 }
        | if sess.block.is_some() {
            FLAG_BLOCKED
        } else {
            0
        };
    info.flags.store(flags, Ordering::Relaxed);
    info.resp
        .store(if sess.v3 { 3 } else { 2 }, Ordering::Relaxed);
    info.sub.store(sub as u32, Ordering::Relaxed);
    info.multi.store(
        sess.multi.as_ref().map_or(0, |m| m.queued.len() as u32 + 1),
        Ordering::Relaxed,
    );
    info.psub.store(psub as u32, Ordering::Relaxed);
    info.active_ms.store(
        last_active
            .saturating_duration_since(info.connected)
            .as_millis() as u64,
        Ordering::Relaxed,
    );
}

/// A connection's outstanding blocking pop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockWait {
    /// Its id in the registry.
    pub id: u64,
    /// When it times out (None: never).
    pub deadline: Option<std::time::Instant>,
    /// The client hung up meanwhile: a timeout is not sent, and the connection closes.
    pub hung_up: bool,
}

/// A transaction being queued.
#[derive(Debug, Default)]
pub struct Multi {
    pub queued: Vec<OwnedArgs>,
    /// Bytes of the queued commands' arguments.
    pub bytes: usize,
    /// A command was refused while queuing (unknown, wrong arity): EXEC answers EXECABORT.
    pub failed: bool,
}

/// Most commands one transaction may queue, and (with the item size limit) most bytes: past
/// either, the transaction is discarded with an error, so a client cannot make the server hold
/// unbounded work (Redis sets no limit).
pub const MULTI_MAX_COMMANDS: usize = 100_000;
const MULTI_MIN_BYTES: usize = 16 << 20;
/// Most keys one connection may watch.
pub const WATCH_MAX_KEYS: usize = 4096;

/// The bytes a transaction may queue: 16 MiB, or two of the largest requests if that is more.
fn multi_max_bytes(max_bulk: usize) -> usize {
    MULTI_MIN_BYTES.max(max_bulk.saturating_add(2048).saturating_mul(2))
}

/// The keys one connection watches, registered in the server's `Watches` while held (dropping
/// it, as closing the connection does, unregisters them).
#[derive(Debug, Default)]
pub struct Watching {
    pub(super) registry: Option<Arc<Watches>>,
    pub keys: Vec<WatchedKey>,
}

impl Watching {
    pub fn clear(&mut self) {
        if let Some(r) = &self.registry {
            for k in self.keys.drain(..) {
                r.unwatch(&k.key);
            }
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Per-connection parse buffers, reused across requests.
#[derive(Debug, Default)]
pub struct ArgBufs {
    /// Argument ranges of the request being run.
    pub args: Vec<Range<usize>>,
    /// Unescaped inline arguments.
    pub scratch: Vec<u8>,
}

/// Parses and runs up to `budget` requests from `conn`'s input.
pub fn process(conn: &mut Conn, pass: &mut Pass<'_>, slot: u32, budget: usize) -> Stop {
    let limits = resp::Limits {
        max_bulk: pass.shared.config.proto_max_bulk_len as usize,
    };
    let mut left = budget;
    loop {
        if conn.resp.block.is_some() {
            // Nothing more is read until the blocking pop is answered (reply order).
            return Stop::Blocked;
        }
        if conn.resp.mget_resume == 0 && conn.resp.subs.held_bytes() > 0 {
            let v3 = conn.resp.v3;
            let (_, out, _, sess) = conn.resp_io();
            sess.subs.release(out, v3);
        }
        if let Some(stop) = conn.why_stop(left, conn.resp.mget_resume > 0) {
            return stop;
        }
        let room = WRITE_HIGH - conn.pending_output();
        let epoch = conn.epoch;
        let inflight = conn.inflight;
        let full = conn.input_full();
        let (input, out, bufs, sess) = conn.resp_io();
        let parsed = match resp::parse(input, &limits, &mut bufs.args, &mut bufs.scratch) {
            Err(Incomplete) if full => Parsed::Error("request larger than memkeep's limit".into()),
            Err(Incomplete) => return Stop::NeedInput,
            Ok(p) => p,
        };
        let (consumed, inline) = match parsed {
            Parsed::Empty { consumed } => {
                conn.consume(consumed);
                continue;
            }
            Parsed::Error(msg) => {
                if inflight > 0 {
                    return Stop::Blocked;
                }
                enc::error(out, &format!("ERR Protocol error: {msg}"));
                log::debug!("closing {:?}: protocol error: {msg}", conn.peer);
                conn.closing = true;
                return Stop::Close;
            }
            Parsed::Command { consumed, inline } => (consumed, inline),
        };
        let args = Args::new(if inline { &bufs.scratch } else { input }, &bufs.args);
        if pass.shared.pause.active() && postponed(args, sess, pass) {
            // CLIENT PAUSE: the request waits in the input until the pause ends.
            return Stop::Paused;
        }
        if sess.mget_resume == 0 {
            Counters::bump(&pass.counters.resp_commands);
        }
        let t0 = std::time::Instant::now();
        sess.stat = None;
        let action = dispatch(args, sess, pass);
        if matches!(action, Action::Write(..) | Action::Block(..)) {
            let slot = sess.stat.map_or(NO_SLOT, |(slot, _)| slot);
            sess.stat_inflight.push_back((slot, t0));
        }
        match action {
            Action::Write(op, kind) => {
                pass.pending.push(crate::engine::writer::WriteRequest {
                    tag: Tag {
                        slot,
                        epoch,
                        reply: Reply::Resp { kind },
                    },
                    op,
                });
                conn.inflight += 1;
            }
            Action::Block(form, timeout) => {
                // Registered before it is submitted, so the writer always finds its entry.
                let client = sess.id;
                let id = pass
                    .shared
                    .blocking
                    .register(pass.worker, client, form, |id| Tag {
                        slot,
                        epoch,
                        reply: Reply::Resp {
                            kind: RespReply::Block(id),
                        },
                    });
                let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
                sess.block = Some(BlockWait {
                    id,
                    deadline,
                    hung_up: false,
                });
                if let Some(d) = deadline {
                    pass.timers.push((d, id));
                }
                pass.pending.push(crate::engine::writer::WriteRequest {
                    tag: Tag {
                        slot,
                        epoch,
                        reply: Reply::Resp {
                            kind: RespReply::Block(id),
                        },
                    },
                    op: WriteOp::Block { id },
                });
                conn.inflight += 1;
            }
            Action::Immediate(_) if inflight > 0 => return Stop::Blocked,
            Action::Immediate(run) => {
                sess.room = room;
                let start = out.len();
                let close = run.run(args, out, sess, pass);
                if pass.take_pending()
                    && sess.mget_resume == 0
                    && let Some(spec) = lookup(args.get(0))
                {
                    // A collection it reads changed after the pass's snapshot (collections
                    // reach LMDB at its next commit): the writer runs it on its transaction,
                    // which holds the change, and it is answered as a write is.
                    out.truncate(start);
                    Counters::bump(&pass.counters.reads_in_writer);
                    let slot_stat = sess.stat.map_or(NO_SLOT, |(s, _)| s);
                    sess.stat_inflight.push_back((slot_stat, t0));
                    let read = QueuedRead {
                        cmd: spec.cmd,
                        args: OwnedArgs::new(args),
                        v3: sess.v3,
                        cursors: pass.shared.scan_cursors.clone(),
                        max_bulk: pass.shared.config.proto_max_bulk_len as usize,
                        hits: Some(pass.shared.writer_hits.clone()),
                    };
                    pass.pending.push(crate::engine::writer::WriteRequest {
                        tag: Tag {
                            slot,
                            epoch,
                            reply: Reply::Resp {
                                kind: RespReply::Plain,
                            },
                        },
                        op: WriteOp::Read(ReadStep(Arc::new(read))),
                    });
                    conn.inflight += 1;
                    conn.consume(consumed);
                    left -= 1;
                    continue;
                }
                if sess.mget_resume > 0 {
                    // Paused at the output limit, or at a value being read in: run it again,
                    // from where it stopped, later.
                    return Stop::Blocked;
                }
                if pass.deferred() {
                    // A value it reads is being read in: it runs again, whole, then (and is
                    // counted then).
                    pass.counters.resp_commands.fetch_sub(1, Ordering::Relaxed);
                    return Stop::Blocked;
                }
                if sess.wait.is_some() {
                    // WAIT: not enough acknowledgements yet; it runs again shortly.
                    pass.counters.resp_commands.fetch_sub(1, Ordering::Relaxed);
                    return Stop::ReplWait;
                }
                let stats = &pass.shared.command_stats[pass.worker];
                let failed = out.get(start) == Some(&b'-');
                if failed {
                    stats.error_reply(&out[start..]);
                }
                if let Some((slot, rejected)) = sess.stat {
                    let end = if rejected {
                        CallEnd::Rejected
                    } else {
                        CallEnd::Ran { failed }
                    };
                    stats.record(slot as usize, t0.elapsed().as_micros() as u64, end);
                }
                conn.consume(consumed);
                if close {
                    conn.closing = true;
                    return Stop::Close;
                }
                left -= 1;
                continue;
            }
        }
        conn.consume(consumed);
        left -= 1;
    }
}

/// Whether CLIENT PAUSE holds this request back: every command under `ALL`; under `WRITE`,
/// those that write (queued ones too, and EXEC of a transaction that writes) and PUBLISH, as
/// Redis 7.0 does.
fn postponed(args: Args<'_>, sess: &Session, pass: &Pass<'_>) -> bool {
    let Some(spec) = lookup(args.get(0)) else {
        return false;
    };
    let Some(all) = pass.shared.pause.mode() else {
        return false;
    };
    all || spec.write
        || spec.cmd == Cmd::Publish
        || (spec.cmd == Cmd::Exec
            && sess.multi.as_ref().is_some_and(|m| {
                m.queued
                    .iter()
                    .any(|q| lookup(q.args().get(0)).is_some_and(|s| s.write))
            }))
}

/// What a request turns into: a write for the writer, a blocking pop (with how long it may
/// wait; None: forever), or something answered now.
enum Action {
    Write(WriteOp, RespReply),
    Block(types::blocking::PopForm, Option<std::time::Duration>),
    Immediate(Now),
}

/// An immediate answer: run a read command, send an error, or change the transaction state
/// (only when it runs: a request blocked behind writes in flight is dispatched again later).
enum Now {
    Run(&'static Spec),
    Error(String),
    Txn(TxnNow),
}

enum TxnNow {
    /// MULTI.
    Begin,
    /// A command inside MULTI: +QUEUED (or, past the limits, the transaction is discarded).
    Queue,
    /// DISCARD.
    Discard,
    /// EXEC of a transaction that cannot run: discard it and answer this error.
    Abort(String),
    /// A command refused while queuing: answer the error, and EXEC will answer EXECABORT.
    Refuse(String),
}

impl Now {
    fn run(
        self,
        args: Args<'_>,
        out: &mut Vec<u8>,
        sess: &mut Session,
        pass: &mut Pass<'_>,
    ) -> bool {
        match self {
            Now::Error(msg) => {
                enc::error(out, &msg);
                false
            }
            Now::Run(spec) => admin::read(spec.cmd, args, out, sess, pass),
            Now::Txn(t) => {
                txn_now(t, args, out, sess, pass);
                false
            }
        }
    }
}

fn txn_now(t: TxnNow, args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) {
    match t {
        TxnNow::Begin => {
            sess.multi = Some(Multi::default());
            enc::ok(out);
        }
        TxnNow::Queue => {
            let Some(m) = &mut sess.multi else {
                return enc::error(out, "ERR EXEC without MULTI");
            };
            let q = OwnedArgs::new(args);
            let cap = multi_max_bytes(pass.shared.config.proto_max_bulk_len as usize);
            let msg = if m.queued.len() >= MULTI_MAX_COMMANDS {
                format!("ERR Transaction discarded: more than {MULTI_MAX_COMMANDS} commands queued")
            } else if m.bytes + q.cost() > cap {
                format!(
                    "ERR Transaction discarded: the queued commands exceed memkeep's limit of {cap} bytes"
                )
            } else {
                m.bytes += q.cost();
                m.queued.push(q);
                return enc::simple(out, "QUEUED");
            };
            sess.multi = None;
            sess.watching.clear();
            enc::error(out, &msg);
        }
        TxnNow::Discard => {
            sess.multi = None;
            sess.watching.clear();
            enc::ok(out);
        }
        TxnNow::Abort(msg) => {
            sess.multi = None;
            sess.watching.clear();
            enc::error(out, &msg);
        }
        TxnNow::Refuse(msg) => {
            if let Some(m) = &mut sess.multi {
                m.failed = true;
            }
            enc::error(out, &msg);
        }
    }
}

/// Subcommand names with their arities.
type SubArities = &'static [(&'static str, i32)];

/// The subcommands each container command knows, with Redis 7.0's arity for each (negative:
/// at least that many arguments, the command and subcommand included). These are exactly the
/// ones its handler answers; the handler parses the rest.
const SUBCOMMANDS: &[(Cmd, &str, SubArities)] = &[
    (
        Cmd::Client,
        "client",
        &[
            ("SETNAME", 3),
            ("GETNAME", 2),
            ("ID", 2),
            ("INFO", 2),
            ("LIST", -2),
            ("SETINFO", 4),
            ("UNBLOCK", -3),
            ("PAUSE", -3),
            ("UNPAUSE", 2),
            ("NO-EVICT", 3),
            ("NO-TOUCH", 3),
            ("KILL", -3),
        ],
    ),
    (
        Cmd::Config,
        "config",
        &[("GET", -3), ("SET", -4), ("RESETSTAT", 2), ("REWRITE", 2)],
    ),
    (
        Cmd::Command,
        "command",
        &[("COUNT", 2), ("INFO", -2), ("DOCS", -2)],
    ),
    (
        Cmd::PubSub,
        "pubsub",
        &[
            ("HELP", 2),
            ("CHANNELS", -2),
            ("NUMSUB", -2),
            ("NUMPAT", 2),
            ("SHARDCHANNELS", -2),
            ("SHARDNUMSUB", -2),
        ],
    ),
    (
        Cmd::Object,
        "object",
        &[
            ("ENCODING", 3),
            ("REFCOUNT", 3),
            ("IDLETIME", 3),
            ("FREQ", 3),
            ("HELP", 2),
        ],
    ),
    (
        Cmd::Script,
        "script",
        &[
            ("LOAD", 3),
            ("EXISTS", -3),
            ("FLUSH", -2),
            ("KILL", 2),
            ("HELP", 2),
        ],
    ),
    (
        Cmd::Latency,
        "latency",
        &[
            ("HELP", 2),
            ("LATEST", 2),
            ("HISTORY", 3),
            ("GRAPH", 3),
            ("RESET", -2),
            ("HISTOGRAM", -2),
            ("DOCTOR", 2),
        ],
    ),
    (Cmd::Memory, "memory", &[("USAGE", -3), ("HELP", 2)]),
    (
        Cmd::Function,
        "function",
        &[("FLUSH", -2), ("LIST", -2), ("HELP", 2)],
    ),
];

/// A container command's subcommand checked as Redis's command lookup does, before the
/// command runs or is queued: an unknown subcommand or a wrong argument count is refused (so
/// inside MULTI it aborts the transaction, as an unknown command does). None for every other
/// command, and for COMMAND alone (which lists every command).
fn subcommand_error(spec: &Spec, args: Args<'_>) -> Option<String> {
    let (_, lower, subs) = SUBCOMMANDS.iter().find(|(cmd, ..)| *cmd == spec.cmd)?;
    if args.len() < 2 {
        return None;
    }
    let Some((sub, arity)) = subs.iter().find(|(name, _)| args.is(1, name)) else {
        return Some(format!(
            "ERR unknown subcommand '{}'. Try {} HELP.",
            String::from_utf8_lossy(args.get(1)),
            lower.to_ascii_uppercase()
        ));
    };
    let n = args.len() as i32;
    ((*arity > 0 && n != *arity) || (*arity < 0 && n < -*arity)).then(|| {
        format!(
            "ERR wrong number of arguments for '{lower}|{}' command",
            sub.to_ascii_lowercase()
        )
    })
}

/// The checks every request passes before it runs or is queued: a known name, authentication,
/// arity (a container command's subcommand too).
fn check(args: Args<'_>, sess: &Session, pass: &Pass<'_>) -> Result<&'static Spec, String> {
    let name = args.get(0);
    let Some(spec) = lookup(name) else {
        return Err(unknown_command(args));
    };
    let acl = &pass.shared.acl;
    let needs_auth = !sess.authed && !acl.open();
    if needs_auth && !matches!(spec.cmd, Cmd::Auth | Cmd::Hello | Cmd::Quit) {
        return Err("NOAUTH Authentication required.".into());
    }
    // Redis's `allow-busy` commands: a client may open (or drop) a transaction and watch
    // keys while a script runs; what it queues meanwhile is refused, which fails its EXEC.
    if pass.shared.scripts.busy()
        && !(spec.cmd == Cmd::Script && args.is(1, "kill"))
        && !matches!(
            spec.cmd,
            Cmd::Auth
                | Cmd::Hello
                | Cmd::Quit
                | Cmd::Multi
                | Cmd::Discard
                | Cmd::Watch
                | Cmd::Unwatch
                | Cmd::Reset
        )
    {
        return Err(crate::scripting::BUSY.into());
    }
    let n = args.len() as i32;
    if (spec.arity > 0 && n != spec.arity) || (spec.arity < 0 && n < -spec.arity) {
        return Err(format!(
            "ERR wrong number of arguments for '{}' command",
            spec.name
        ));
    }
    if let Some(msg) = subcommand_error(spec, args) {
        return Err(msg);
    }
    // A replica's data is its primary's: writes (and scripts that may write) are refused.
    if (spec.write || matches!(spec.cmd, Cmd::Eval | Cmd::EvalSha)) && pass.shared.repl.is_replica()
    {
        return Err(super::repl::readonly_error());
    }
    // A primary with too few replicas acknowledging (`min-replicas-to-write`).
    if (spec.write || matches!(spec.cmd, Cmd::Eval | Cmd::EvalSha))
        && pass.shared.repl.too_few_replicas()
    {
        return Err(super::repl::NOREPLICAS.into());
    }
    if acl.restricted() || sess.user.is_some() {
        let all: Vec<&[u8]> = (0..args.len()).map(|i| args.get(i)).collect();
        acl.permit(sess.user.as_deref(), spec, &all)?;
    }
    // RESP2 subscribed mode (Redis's processCommand): only these may run.
    let allowed = matches!(
        spec.cmd,
        Cmd::Subscribe
            | Cmd::Unsubscribe
            | Cmd::PSubscribe
            | Cmd::PUnsubscribe
            | Cmd::Ping
            | Cmd::Quit
            | Cmd::Reset
    );
    if !sess.v3 && sess.subs.count() > 0 && !allowed {
        let sub = (args.len() > 1).then(|| args.get(1));
        let name = super::acl::command_name(spec, sub);
        return Err(format!(
            "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
        ));
    }
    Ok(spec)
}

/// A request while MULTI is open: Redis 7.0's rules (multi.c, processCommand).
fn dispatch_in_multi(args: Args<'_>, sess: &mut Session, pass: &mut Pass<'_>) -> Action {
    let failed = sess.multi.as_ref().is_some_and(|m| m.failed);
    let spec = match check(args, sess, pass) {
        Ok(spec) => {
            sess.last_cmd = Some(spec.name);
            // Queued commands are counted by EXEC's run, as a part of EXEC.
            if matches!(
                spec.cmd,
                Cmd::Multi | Cmd::Watch | Cmd::Discard | Cmd::Quit | Cmd::Reset | Cmd::Exec
            ) {
                sess.stat = Some((stat_slot(spec, args), false));
            }
            spec
        }
        Err(msg) => {
            sess.stat = lookup(args.get(0)).map(|s| (stat_slot(s, args), true));
            return refused_in_multi(args, msg);
        }
    };
    // Redis's `no-multi` commands: refused, which fails the transaction.
    if matches!(spec.cmd, Cmd::Shutdown | Cmd::Sync | Cmd::Psync) {
        sess.stat = Some((stat_slot(spec, args), true));
        return refused_in_multi(
            args,
            "ERR Command not allowed inside a transaction".to_string(),
        );
    }
    multi_action(spec, failed, sess, pass)
}

/// A request refused while MULTI is open.
fn refused_in_multi(args: Args<'_>, msg: String) -> Action {
    if args.is(0, "exec") {
        // A refused EXEC discards the transaction at once, naming why.
        let why = msg.strip_prefix("ERR ").unwrap_or(&msg);
        return Action::Immediate(Now::Txn(TxnNow::Abort(format!(
            "EXECABORT Transaction discarded because of: {why}"
        ))));
    }
    Action::Immediate(Now::Txn(TxnNow::Refuse(msg)))
}

fn multi_action(
    spec: &'static Spec,
    failed: bool,
    sess: &mut Session,
    pass: &mut Pass<'_>,
) -> Action {
    let now = match spec.cmd {
        Cmd::Multi => Now::Error("ERR MULTI calls can not be nested".into()),
        Cmd::Watch => Now::Error("ERR WATCH inside MULTI is not allowed".into()),
        Cmd::Discard => Now::Txn(TxnNow::Discard),
        Cmd::Quit | Cmd::Reset => Now::Run(spec),
        Cmd::Exec if failed => Now::Txn(TxnNow::Abort(
            "EXECABORT Transaction discarded because of previous errors.".into(),
        )),
        Cmd::Exec => return exec(sess, pass),
        _ => Now::Txn(TxnNow::Queue),
    };
    Action::Immediate(now)
}

/// EXEC: turns the queued commands into one `WriteOp::Exec` for the writer. Writes are parsed
/// now (a bad argument becomes that step's error reply, as in Redis); reads of the store run
/// in the writer's transaction; commands that do not touch the store are answered now.
fn exec(sess: &mut Session, pass: &mut Pass<'_>) -> Action {
    let Some(multi) = sess.multi.take() else {
        return Action::Immediate(Now::Error("ERR EXEC without MULTI".into()));
    };
    let mut steps = Vec::with_capacity(multi.queued.len());
    let mut kinds = Vec::with_capacity(multi.queued.len());
    sess.in_exec = Some(multi.queued.len());
    let mut slots = Vec::with_capacity(multi.queued.len());
    for q in multi.queued {
        let args = q.args();
        let Some(spec) = lookup(args.get(0)) else {
            continue;
        };
        slots.push(stat_slot(spec, args));
        let (step, kind) = if is_eval(spec.cmd) {
            match script_op(spec.cmd, args, sess, pass) {
                Ok(op) => (Step::Write(op), RespReply::Plain),
                Err(msg) => {
                    let mut out = Vec::new();
                    enc::error(&mut out, &msg);
                    (fixed(out), RespReply::Plain)
                }
            }
        } else if spec.write {
            match write_op(
                spec.cmd,
                args,
                pass.now_ms,
                pass.shared.config.proto_max_bulk_len as usize,
            ) {
                Ok((op, kind)) => (Step::Write(op), kind),
                Err(msg) => {
                    let mut out = Vec::new();
                    enc::error(&mut out, &msg);
                    (fixed(out), RespReply::Plain)
                }
            }
        } else if reads_store(spec.cmd) {
            let read = QueuedRead {
                cmd: spec.cmd,
                v3: sess.v3,
                cursors: pass.shared.scan_cursors.clone(),
                max_bulk: pass.shared.config.proto_max_bulk_len as usize,
                args: q,
                hits: None,
            };
            (Step::Read(Arc::new(read)), RespReply::Plain)
        } else {
            let mut out = Vec::new();
            if spec.cmd == Cmd::Unwatch {
                // EXEC unwatches when it is done; the watches still guard this transaction.
                enc::ok(&mut out);
            } else {
                sess.room = usize::MAX;
                admin::read(spec.cmd, args, &mut out, sess, pass);
            }
            (fixed(out), RespReply::Plain)
        };
        steps.push(step);
        kinds.push(kind);
    }
    sess.in_exec = None;
    sess.exec_kinds.push_back(kinds);
    sess.exec_slots.push_back(slots);
    let op = ExecOp {
        watched: sess.watching.keys.clone(),
        steps,
    };
    Action::Write(WriteOp::Exec(Box::new(op)), RespReply::Exec)
}

fn dispatch(args: Args<'_>, sess: &mut Session, pass: &mut Pass<'_>) -> Action {
    if sess.multi.is_some() {
        return dispatch_in_multi(args, sess, pass);
    }
    let spec = match check(args, sess, pass) {
        Ok(spec) => spec,
        Err(msg) => {
            sess.stat = lookup(args.get(0)).map(|s| (stat_slot(s, args), true));
            return Action::Immediate(Now::Error(msg));
        }
    };
    sess.stat = Some((stat_slot(spec, args), false));
    sess.last_cmd = Some(spec.name);
    match spec.cmd {
        Cmd::Multi => return Action::Immediate(Now::Txn(TxnNow::Begin)),
        Cmd::Exec => return Action::Immediate(Now::Error("ERR EXEC without MULTI".into())),
        Cmd::Discard => {
            return Action::Immediate(Now::Error("ERR DISCARD without MULTI".into()));
        }
        _ => {}
    }
    if is_eval(spec.cmd) {
        return match script_op(spec.cmd, args, sess, pass) {
            Ok(op) => Action::Write(op, RespReply::Plain),
            Err(msg) => Action::Immediate(Now::Error(msg)),
        };
    }
    if !spec.write {
        return Action::Immediate(Now::Run(spec));
    }
    if let Cmd::Pop(code) = spec.cmd
        && blocking::blocks(code)
    {
        return match blocking::parse(code, args) {
            Ok(p) => Action::Block(p.form, p.timeout.flatten()),
            Err(msg) => Action::Immediate(Now::Error(msg)),
        };
    }
    match write_op(
        spec.cmd,
        args,
        pass.now_ms,
        pass.shared.config.proto_max_bulk_len as usize,
    ) {
        Ok((op, kind)) => Action::Write(op, kind),
        Err(msg) => Action::Immediate(Now::Error(msg)),
    }
}

fn is_eval(cmd: Cmd) -> bool {
    matches!(cmd, Cmd::Eval | Cmd::EvalSha | Cmd::EvalRo | Cmd::EvalShaRo)
}

/// EVAL and its kin: the script as a write for the writer thread (`crate::scripting`).
fn script_op(cmd: Cmd, args: Args<'_>, sess: &Session, pass: &Pass<'_>) -> Result<WriteOp, String> {
    // The script's commands are checked against the caller's permissions (as Redis does).
    let acl = &pass.shared.acl;
    let permit: Option<crate::scripting::Permit> =
        (acl.restricted() || sess.user.is_some()).then(|| {
            let acl = acl.clone();
            let user = sess.user.clone();
            let p: crate::scripting::Permit =
                Arc::new(move |spec, args| acl.permit(user.as_deref(), spec, args));
            p
        });
    pass.shared.scripts.eval_op(
        cmd,
        args,
        sess.v3,
        pass.shared.config.proto_max_bulk_len as usize,
        pass.shared.scan_cursors.clone(),
        permit,
    )
}

/// Encodes a write's reply once it has committed, and counts it (INFO commandstats and
/// errorstats).
pub fn complete_write(
    out: &mut Vec<u8>,
    sess: &mut Session,
    kind: RespReply,
    outcome: Outcome,
    stats: &CommandStats,
) {
    let start = out.len();
    let exec_slots = if kind == RespReply::Exec {
        sess.exec_slots.pop_front().unwrap_or_default()
    } else {
        Vec::new()
    };
    let steps = encode_write(out, sess, kind, outcome);
    // The commands EXEC ran: each a call (its time is EXEC's), failed if it answered an error.
    for (&at, &slot) in steps.iter().zip(&exec_slots) {
        let failed = out.get(at) == Some(&b'-');
        if failed {
            stats.error_reply(&out[at..]);
        }
        stats.record(slot as usize, 0, CallEnd::Ran { failed });
    }
    let failed = out.get(start) == Some(&b'-');
    if failed {
        stats.error_reply(&out[start..]);
    }
    if let Some((slot, t0)) = sess.stat_inflight.pop_front()
        && slot != NO_SLOT
    {
        let usec = t0.elapsed().as_micros() as u64;
        stats.record(slot as usize, usec, CallEnd::Ran { failed });
    }
}

/// Encodes a write's reply. EXEC's ends the transaction: its watches go; for an EXEC that
/// ran, where each of its commands' replies starts in `out`.
fn encode_write(
    out: &mut Vec<u8>,
    sess: &mut Session,
    kind: RespReply,
    outcome: Outcome,
) -> Vec<usize> {
    let mut starts = Vec::new();
    if let RespReply::Block(_) = kind {
        sess.block = None;
        complete(out, sess.v3, RespReply::Plain, outcome);
        return starts;
    }
    if kind != RespReply::Exec {
        complete(out, sess.v3, kind, outcome);
        return starts;
    }
    let kinds = sess.exec_kinds.pop_front().unwrap_or_default();
    sess.watching.clear();
    match outcome {
        Outcome::Array(items) => {
            enc::array(out, items.len());
            starts.reserve(items.len());
            for (i, item) in items.into_iter().enumerate() {
                let kind = kinds.get(i).copied().unwrap_or(RespReply::Plain);
                starts.push(out.len());
                complete(out, sess.v3, kind, item);
            }
        }
        other => complete(out, sess.v3, RespReply::Plain, other),
    }
    starts
}
