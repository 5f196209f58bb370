//! Runs Redis RESP commands for one connection over the same keyspace as the memcached port.
//!
//! Every command is declared once in `COMMANDS` (name, arity, write or not, key positions);
//! unknown names, authentication and arity are checked once before dispatch. Reads run on the
//! worker against the pass's LMDB read transaction; writes become `WriteOp`s for the writer
//! and are answered when they commit. Replies follow the connection's protocol version (RESP2,
//! or RESP3 after `HELLO 3`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write as _;
use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use log::error;

use super::conn::{Conn, WRITE_HIGH};
use super::stats::{Counters, Totals, rusage};
use super::worker::{Pass, Reply, Stop, Tag};
use std::sync::{Arc, Mutex};

use crate::command::{
    ExecOp, ExpireCond, Expiry, KeyValue, Outcome, SetCond, Step, TxnRead, WriteOp,
};
use crate::protocol::resp::{self, Incomplete, Parsed, enc, parse_i64};
use crate::storage::lmdb::LmdbStore;
use crate::storage::overlay::Found;
use crate::storage::watch::{WatchedKey, Watches};
use crate::storage::{ItemRef, Kind, MAX_KEY, StoreError};
use crate::types::{self, CollOp};

/// Per-connection RESP state.
#[derive(Debug, Default)]
pub struct Session {
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
    pub v3: bool,
    pub authed: bool,
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
fn multi_max_bytes(item_size_max: usize) -> usize {
    MULTI_MIN_BYTES.max(item_size_max.saturating_add(2048).saturating_mul(2))
}

/// The keys one connection watches, registered in the server's `Watches` while held (dropping
/// it, as closing the connection does, unregisters them).
#[derive(Debug, Default)]
pub struct Watching {
    registry: Option<Arc<Watches>>,
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

/// A request's arguments, copied out of the input buffer (a command queued by MULTI).
#[derive(Debug, Clone, Default)]
pub struct OwnedArgs {
    buf: Vec<u8>,
    ranges: Vec<Range<usize>>,
}

impl OwnedArgs {
    fn new(args: Args<'_>) -> OwnedArgs {
        let mut o = OwnedArgs::default();
        for i in 0..args.len() {
            let a = args.get(i);
            o.ranges.push(o.buf.len()..o.buf.len() + a.len());
            o.buf.extend_from_slice(a);
        }
        o
    }

    pub fn args(&self) -> Args<'_> {
        Args {
            src: &self.buf,
            ranges: &self.ranges,
        }
    }

    /// What it costs to hold (its bytes, plus its ranges).
    fn cost(&self) -> usize {
        self.buf.len() + self.ranges.len() * std::mem::size_of::<Range<usize>>()
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

/// How to answer a RESP write once it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespReply {
    /// The outcome maps directly (Done is +OK).
    Plain,
    /// SETNX: set is 1, not set is 0.
    SetNx,
    /// EXEC: an array of its steps' outcomes, each answered as its command's kind
    /// (`Session::exec_kinds`).
    Exec,
    /// A blocking pop, by its registry id: answered when it pops, times out or is unblocked.
    Block(u64),
}

/// The collection families whose commands live in `crate::types`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    List,
    Hash,
    Set,
    ZSet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    /// A collection command: its family and its code within the family's table.
    Coll(Family, u8),
    /// A pop that may block, or a multi-key pop (`types::blocking`), by its code.
    Pop(u8),
    Get,
    Set,
    SetNx,
    SetEx,
    PSetEx,
    GetSet,
    GetDel,
    GetEx,
    MGet,
    MSet,
    MSetNx,
    Incr,
    IncrBy,
    Decr,
    DecrBy,
    IncrByFloat,
    Append,
    StrLen,
    GetRange,
    SetRange,
    Del,
    Exists,
    Expire,
    PExpire,
    ExpireAt,
    PExpireAt,
    Ttl,
    PTtl,
    ExpireTime,
    PExpireTime,
    Persist,
    Type,
    Rename,
    RenameNx,
    Keys,
    Scan,
    RandomKey,
    DbSize,
    FlushDb,
    Ping,
    Echo,
    Quit,
    Select,
    Info,
    Command,
    Config,
    Client,
    Time,
    Auth,
    Hello,
    BgSave,
    LastSave,
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
    Subscribe,
    Unsubscribe,
    PSubscribe,
    PUnsubscribe,
    Publish,
    PubSub,
    Reset,
    Object,
    Latency,
    Wait,
}

/// One command: Redis's arity rule (n: exactly n arguments including the name; -n: at least n),
/// whether it writes, and where its keys are (first, last, step; last -1 = to the end).
pub struct Spec {
    pub name: &'static str,
    pub arity: i32,
    pub write: bool,
    pub keys: (i32, i32, i32),
    pub cmd: Cmd,
}

pub const fn spec(
    name: &'static str,
    arity: i32,
    write: bool,
    keys: (i32, i32, i32),
    cmd: Cmd,
) -> Spec {
    Spec {
        name,
        arity,
        write,
        keys,
        cmd,
    }
}

pub const W: bool = true;
pub const R: bool = false;
pub const NOKEY: (i32, i32, i32) = (0, 0, 0);
pub const KEY1: (i32, i32, i32) = (1, 1, 1);

/// Every command table: the string, key and server commands here, then each collection family's.
fn tables() -> [&'static [Spec]; 6] {
    use crate::types::{blocking, hash, list, set, zset};
    [
        COMMANDS,
        list::COMMANDS,
        hash::COMMANDS,
        set::COMMANDS,
        zset::COMMANDS,
        blocking::COMMANDS,
    ]
}

fn all_specs() -> impl Iterator<Item = &'static Spec> {
    tables().into_iter().flatten()
}

static COMMANDS: &[Spec] = &[
    spec("get", 2, R, KEY1, Cmd::Get),
    spec("set", -3, W, KEY1, Cmd::Set),
    spec("setnx", 3, W, KEY1, Cmd::SetNx),
    spec("setex", 4, W, KEY1, Cmd::SetEx),
    spec("psetex", 4, W, KEY1, Cmd::PSetEx),
    spec("getset", 3, W, KEY1, Cmd::GetSet),
    spec("getdel", 2, W, KEY1, Cmd::GetDel),
    spec("getex", -2, W, KEY1, Cmd::GetEx),
    spec("mget", -2, R, (1, -1, 1), Cmd::MGet),
    spec("mset", -3, W, (1, -1, 2), Cmd::MSet),
    spec("msetnx", -3, W, (1, -1, 2), Cmd::MSetNx),
    spec("incr", 2, W, KEY1, Cmd::Incr),
    spec("incrby", 3, W, KEY1, Cmd::IncrBy),
    spec("decr", 2, W, KEY1, Cmd::Decr),
    spec("decrby", 3, W, KEY1, Cmd::DecrBy),
    spec("incrbyfloat", 3, W, KEY1, Cmd::IncrByFloat),
    spec("append", 3, W, KEY1, Cmd::Append),
    spec("strlen", 2, R, KEY1, Cmd::StrLen),
    spec("getrange", 4, R, KEY1, Cmd::GetRange),
    spec("substr", 4, R, KEY1, Cmd::GetRange),
    spec("setrange", 4, W, KEY1, Cmd::SetRange),
    spec("del", -2, W, (1, -1, 1), Cmd::Del),
    spec("unlink", -2, W, (1, -1, 1), Cmd::Del),
    spec("exists", -2, R, (1, -1, 1), Cmd::Exists),
    spec("expire", -3, W, KEY1, Cmd::Expire),
    spec("pexpire", -3, W, KEY1, Cmd::PExpire),
    spec("expireat", -3, W, KEY1, Cmd::ExpireAt),
    spec("pexpireat", -3, W, KEY1, Cmd::PExpireAt),
    spec("ttl", 2, R, KEY1, Cmd::Ttl),
    spec("pttl", 2, R, KEY1, Cmd::PTtl),
    spec("expiretime", 2, R, KEY1, Cmd::ExpireTime),
    spec("pexpiretime", 2, R, KEY1, Cmd::PExpireTime),
    spec("persist", 2, W, KEY1, Cmd::Persist),
    spec("type", 2, R, KEY1, Cmd::Type),
    spec("rename", 3, W, (1, 2, 1), Cmd::Rename),
    spec("renamenx", 3, W, (1, 2, 1), Cmd::RenameNx),
    spec("keys", 2, R, NOKEY, Cmd::Keys),
    spec("scan", -2, R, NOKEY, Cmd::Scan),
    spec("randomkey", 1, R, NOKEY, Cmd::RandomKey),
    spec("dbsize", 1, R, NOKEY, Cmd::DbSize),
    spec("flushdb", -1, W, NOKEY, Cmd::FlushDb),
    spec("flushall", -1, W, NOKEY, Cmd::FlushDb),
    spec("ping", -1, R, NOKEY, Cmd::Ping),
    spec("echo", 2, R, NOKEY, Cmd::Echo),
    spec("quit", -1, R, NOKEY, Cmd::Quit),
    spec("select", 2, R, NOKEY, Cmd::Select),
    spec("info", -1, R, NOKEY, Cmd::Info),
    spec("command", -1, R, NOKEY, Cmd::Command),
    spec("config", -2, R, NOKEY, Cmd::Config),
    spec("client", -2, R, NOKEY, Cmd::Client),
    spec("time", 1, R, NOKEY, Cmd::Time),
    spec("auth", -2, R, NOKEY, Cmd::Auth),
    spec("hello", -1, R, NOKEY, Cmd::Hello),
    spec("bgsave", -1, R, NOKEY, Cmd::BgSave),
    spec("lastsave", 1, R, NOKEY, Cmd::LastSave),
    spec("multi", 1, R, NOKEY, Cmd::Multi),
    spec("exec", 1, R, NOKEY, Cmd::Exec),
    spec("discard", 1, R, NOKEY, Cmd::Discard),
    spec("watch", -2, R, (1, -1, 1), Cmd::Watch),
    spec("unwatch", 1, R, NOKEY, Cmd::Unwatch),
    spec("subscribe", -2, R, NOKEY, Cmd::Subscribe),
    spec("unsubscribe", -1, R, NOKEY, Cmd::Unsubscribe),
    spec("psubscribe", -2, R, NOKEY, Cmd::PSubscribe),
    spec("punsubscribe", -1, R, NOKEY, Cmd::PUnsubscribe),
    spec("publish", 3, R, NOKEY, Cmd::Publish),
    spec("pubsub", -2, R, NOKEY, Cmd::PubSub),
    spec("reset", 1, R, NOKEY, Cmd::Reset),
    spec("object", -2, R, (2, 2, 1), Cmd::Object),
    spec("latency", -2, R, NOKEY, Cmd::Latency),
    spec("wait", 3, R, NOKEY, Cmd::Wait),
];

fn lookup(name: &[u8]) -> Option<&'static Spec> {
    if name.len() > 16 {
        return None;
    }
    let mut lower = [0u8; 16];
    for (d, s) in lower.iter_mut().zip(name) {
        *d = s.to_ascii_lowercase();
    }
    let lower = &lower[..name.len()];
    // Built once: every request looks its name up here.
    static INDEX: OnceLock<HashMap<&'static [u8], &'static Spec, BuildHasherDefault<Fnv>>> =
        OnceLock::new();
    INDEX
        .get_or_init(|| all_specs().map(|s| (s.name.as_bytes(), s)).collect())
        .get(lower)
        .copied()
}

/// FNV-1a: command names are short and trusted-length, so a cheap hash beats SipHash here.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        self.0 = h;
    }
}

/// The arguments of one request (argument 0 is the command name).
#[derive(Clone, Copy)]
pub struct Args<'a> {
    src: &'a [u8],
    ranges: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn get(&self, i: usize) -> &'a [u8] {
        &self.src[self.ranges[i].clone()]
    }

    /// Argument `i` equals `word`, ignoring ASCII case.
    pub fn is(&self, i: usize, word: &str) -> bool {
        self.get(i).eq_ignore_ascii_case(word.as_bytes())
    }
}

pub const SYNTAX: &str = "ERR syntax error";
pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const BAD_KEY: &str = "ERR invalid key: memkeep keys are 1 to 511 bytes";

/// Parses and runs up to `budget` requests from `conn`'s input.
pub fn process(conn: &mut Conn, pass: &mut Pass<'_>, slot: u32, budget: usize) -> Stop {
    let limits = resp::Limits {
        max_bulk: pass.limits.item_size_max,
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
        let args = Args {
            src: if inline { &bufs.scratch } else { input },
            ranges: &bufs.args,
        };
        if pass.shared.pause.active() && postponed(args, sess, pass) {
            // CLIENT PAUSE: the request waits in the input until the pause ends.
            return Stop::Paused;
        }
        if sess.mget_resume == 0 {
            Counters::bump(&pass.counters.resp_commands);
        }
        let action = dispatch(args, sess, pass);
        match action {
            Action::Write(op, kind) => {
                pass.pending.push(crate::storage::writer::WriteRequest {
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
                pass.pending.push(crate::storage::writer::WriteRequest {
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
                let close = run.run(args, out, sess, pass);
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
            Now::Run(spec) => read(spec.cmd, args, out, sess, pass),
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
            let cap = multi_max_bytes(pass.limits.item_size_max);
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
        &[("GET", -3), ("SET", -4), ("RESETSTAT", 2)],
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
    let needs_auth = !pass.shared.config.requirepass.is_empty() && !sess.authed;
    if needs_auth && !matches!(spec.cmd, Cmd::Auth | Cmd::Hello | Cmd::Quit) {
        return Err("NOAUTH Authentication required.".into());
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
        let container = matches!(
            spec.cmd,
            Cmd::Client | Cmd::Config | Cmd::Command | Cmd::PubSub | Cmd::Object | Cmd::Latency
        );
        let name = if container && args.len() > 1 {
            format!(
                "{}|{}",
                spec.name,
                String::from_utf8_lossy(args.get(1)).to_ascii_lowercase()
            )
        } else {
            spec.name.to_string()
        };
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
            spec
        }
        // A refused EXEC discards the transaction at once, naming why.
        Err(msg) if args.is(0, "exec") => {
            let why = msg.strip_prefix("ERR ").unwrap_or(&msg);
            return Action::Immediate(Now::Txn(TxnNow::Abort(format!(
                "EXECABORT Transaction discarded because of: {why}"
            ))));
        }
        Err(msg) => return Action::Immediate(Now::Txn(TxnNow::Refuse(msg))),
    };
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
    for q in multi.queued {
        let args = q.args();
        let Some(spec) = lookup(args.get(0)) else {
            continue;
        };
        let (step, kind) = if spec.write {
            match write_op(spec.cmd, args, pass) {
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
                args: q,
            };
            (Step::Read(Arc::new(read)), RespReply::Plain)
        } else {
            let mut out = Vec::new();
            if spec.cmd == Cmd::Unwatch {
                // EXEC unwatches when it is done; the watches still guard this transaction.
                enc::ok(&mut out);
            } else {
                sess.room = usize::MAX;
                read(spec.cmd, args, &mut out, sess, pass);
            }
            (fixed(out), RespReply::Plain)
        };
        steps.push(step);
        kinds.push(kind);
    }
    sess.in_exec = None;
    sess.exec_kinds.push_back(kinds);
    let op = ExecOp {
        watched: sess.watching.keys.clone(),
        steps,
    };
    Action::Write(WriteOp::Exec(Box::new(op)), RespReply::Exec)
}

/// Commands whose reply depends on the store: inside EXEC they run in the writer.
fn reads_store(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Coll(..)
            | Cmd::Get
            | Cmd::StrLen
            | Cmd::GetRange
            | Cmd::MGet
            | Cmd::Exists
            | Cmd::Ttl
            | Cmd::PTtl
            | Cmd::ExpireTime
            | Cmd::PExpireTime
            | Cmd::Type
            | Cmd::DbSize
            | Cmd::Keys
            | Cmd::Scan
            | Cmd::RandomKey
            | Cmd::Object
    )
}

/// A step whose reply is known when EXEC is built.
fn fixed(reply: Vec<u8>) -> Step {
    Step::Read(Arc::new(FixedReply(reply)))
}

#[derive(Debug)]
struct FixedReply(Vec<u8>);

impl TxnRead for FixedReply {
    fn run(&self, _: &LmdbStore, _: &heed::RoTxn<'_, heed::WithoutTls>, _: u64) -> Outcome {
        Outcome::Reply(self.0.clone())
    }
}

/// A read command queued by MULTI, run by the writer against EXEC's transaction.
#[derive(Debug)]
struct QueuedRead {
    cmd: Cmd,
    args: OwnedArgs,
    v3: bool,
    cursors: Arc<Mutex<ScanCursors>>,
}

impl TxnRead for QueuedRead {
    fn run(
        &self,
        store: &LmdbStore,
        txn: &heed::RoTxn<'_, heed::WithoutTls>,
        now_ms: u64,
    ) -> Outcome {
        // The writer ran any due delayed flush at the start of this transaction.
        let snap = crate::storage::overlay::Snap::within(store, txn);
        let view = View {
            store: &snap,
            txn,
            now: now_ms,
            flushed: false,
            cursors: &self.cursors,
            counters: None,
        };
        let mut out = Vec::new();
        read_view(self.cmd, self.args.args(), &mut out, self.v3, &view);
        Outcome::Reply(out)
    }
}

fn dispatch(args: Args<'_>, sess: &mut Session, pass: &mut Pass<'_>) -> Action {
    if sess.multi.is_some() {
        return dispatch_in_multi(args, sess, pass);
    }
    let spec = match check(args, sess, pass) {
        Ok(spec) => spec,
        Err(msg) => return Action::Immediate(Now::Error(msg)),
    };
    sess.last_cmd = Some(spec.name);
    match spec.cmd {
        Cmd::Multi => return Action::Immediate(Now::Txn(TxnNow::Begin)),
        Cmd::Exec => return Action::Immediate(Now::Error("ERR EXEC without MULTI".into())),
        Cmd::Discard => {
            return Action::Immediate(Now::Error("ERR DISCARD without MULTI".into()));
        }
        _ => {}
    }
    if !spec.write {
        return Action::Immediate(Now::Run(spec));
    }
    if let Cmd::Pop(code) = spec.cmd
        && types::blocking::blocks(code)
    {
        return match types::blocking::parse(code, args) {
            Ok(p) => Action::Block(p.form, p.timeout.flatten()),
            Err(msg) => Action::Immediate(Now::Error(msg)),
        };
    }
    match write_op(spec.cmd, args, pass) {
        Ok((op, kind)) => Action::Write(op, kind),
        Err(msg) => Action::Immediate(Now::Error(msg)),
    }
}

/// Redis 7's message, quoting the name and the first arguments (at most 128 bytes each).
fn unknown_command(args: Args<'_>) -> String {
    let clip = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(128)]).into_owned();
    let mut msg = format!(
        "ERR unknown command '{}', with args beginning with: ",
        clip(args.get(0))
    );
    // As Redis: the quoted list stops growing at 128 bytes, quotes and spaces included, and
    // each argument is clipped to what is left.
    let mut list = String::new();
    for i in 1..args.len() {
        if list.len() >= 128 {
            break;
        }
        let a = args.get(i);
        let take = a.len().min(128 - list.len());
        list.push_str(&format!("'{}' ", String::from_utf8_lossy(&a[..take])));
    }
    msg.push_str(&list);
    msg
}

pub fn key_ok(k: &[u8]) -> Result<(), String> {
    if k.is_empty() || k.len() > MAX_KEY {
        Err(BAD_KEY.into())
    } else {
        Ok(())
    }
}

pub fn int_arg(b: &[u8]) -> Result<i64, String> {
    parse_i64(b).ok_or_else(|| NOT_INTEGER.into())
}

/// An expiry given relative (`unit_ms` per unit) or absolute, as an absolute unix ms; Redis's
/// "invalid expire time" when it is not positive (for SET-style options) or overflows.
fn expire_arg(
    b: &[u8],
    unit_ms: i64,
    absolute: bool,
    now_ms: u64,
    cmd: &str,
    positive: bool,
) -> Result<u64, String> {
    let n = int_arg(b)?;
    let invalid = || format!("ERR invalid expire time in '{cmd}' command");
    if positive && n <= 0 {
        return Err(invalid());
    }
    let ms = n.checked_mul(unit_ms).ok_or_else(invalid)?;
    let at = if absolute {
        ms
    } else {
        ms.checked_add(now_ms as i64).ok_or_else(invalid)?
    };
    // A time at or before now (including negative) means "already expired".
    Ok(if at <= 0 { 1 } else { at as u64 })
}

fn write_op(cmd: Cmd, args: Args<'_>, pass: &Pass<'_>) -> Result<(WriteOp, RespReply), String> {
    let now = pass.now_ms;
    if cmd == Cmd::FlushDb {
        // FLUSHDB / FLUSHALL [ASYNC|SYNC]: either way the store is cleared before the reply.
        return match args.len() {
            1 => Ok((WriteOp::FlushAll { delay: 0 }, RespReply::Plain)),
            2 if args.is(1, "ASYNC") || args.is(1, "SYNC") => {
                Ok((WriteOp::FlushAll { delay: 0 }, RespReply::Plain))
            }
            _ => Err(SYNTAX.into()),
        };
    }
    if let Cmd::Pop(code) = cmd {
        // A pop that never waits: LMPOP, ZMPOP, or a blocking pop inside MULTI.
        let p = types::blocking::parse(code, args)?;
        return Ok((WriteOp::Coll(CollOp::Pop(p.form)), RespReply::Plain));
    }
    // Every other write names its key first (the command table says so).
    let key = args.get(1);
    key_ok(key)?;
    let plain = |op| Ok((op, RespReply::Plain));
    match cmd {
        Cmd::Coll(family, code) => {
            let op = match family {
                Family::List => CollOp::List(types::list::write_op(code, args)?),
                Family::Hash => CollOp::Hash(types::hash::write_op(code, args)?),
                Family::Set => CollOp::Set(types::set::write_op(code, args)?),
                Family::ZSet => CollOp::ZSet(types::zset::write_op(code, args)?),
            };
            plain(WriteOp::Coll(op))
        }
        Cmd::Set => {
            let (mut cond, mut expiry, mut get) = (SetCond::Always, Expiry::Clear, false);
            let mut expiry_given = false;
            let mut i = 3;
            while i < args.len() {
                let has_next = i + 1 < args.len();
                let mut set_expiry = |e: Expiry| {
                    if expiry_given {
                        return Err(SYNTAX.to_string());
                    }
                    expiry_given = true;
                    expiry = e;
                    Ok(())
                };
                if args.is(i, "NX") && cond != SetCond::Xx {
                    cond = SetCond::Nx;
                } else if args.is(i, "XX") && cond != SetCond::Nx {
                    cond = SetCond::Xx;
                } else if args.is(i, "GET") {
                    get = true;
                } else if args.is(i, "KEEPTTL") {
                    set_expiry(Expiry::Keep)?;
                } else if has_next
                    && (args.is(i, "EX")
                        || args.is(i, "PX")
                        || args.is(i, "EXAT")
                        || args.is(i, "PXAT"))
                {
                    let unit = if args.is(i, "EX") || args.is(i, "EXAT") {
                        1000
                    } else {
                        1
                    };
                    let absolute = args.is(i, "EXAT") || args.is(i, "PXAT");
                    let at = expire_arg(args.get(i + 1), unit, absolute, now, "set", true)?;
                    set_expiry(Expiry::At(at))?;
                    i += 1;
                } else {
                    return Err(SYNTAX.into());
                }
                i += 1;
            }
            plain(WriteOp::Set {
                kv: KeyValue::new(key, args.get(2)),
                cond,
                expiry,
                get,
            })
        }
        Cmd::SetNx => Ok((
            WriteOp::Set {
                kv: KeyValue::new(key, args.get(2)),
                cond: SetCond::Nx,
                expiry: Expiry::Clear,
                get: false,
            },
            RespReply::SetNx,
        )),
        Cmd::SetEx | Cmd::PSetEx => {
            let (unit, name) = if cmd == Cmd::SetEx {
                (1000, "setex")
            } else {
                (1, "psetex")
            };
            let at = expire_arg(args.get(2), unit, false, now, name, true)?;
            plain(WriteOp::Set {
                kv: KeyValue::new(key, args.get(3)),
                cond: SetCond::Always,
                expiry: Expiry::At(at),
                get: false,
            })
        }
        Cmd::GetSet => plain(WriteOp::Set {
            kv: KeyValue::new(key, args.get(2)),
            cond: SetCond::Always,
            expiry: Expiry::Clear,
            get: true,
        }),
        Cmd::GetDel => plain(WriteOp::GetDel { key: key.to_vec() }),
        Cmd::GetEx => {
            let expiry = match args.len() {
                2 => Expiry::Keep,
                3 if args.is(2, "PERSIST") => Expiry::Clear,
                4 => {
                    let unit = if args.is(2, "EX") || args.is(2, "EXAT") {
                        1000
                    } else {
                        1
                    };
                    let absolute = args.is(2, "EXAT") || args.is(2, "PXAT");
                    if !(args.is(2, "EX")
                        || args.is(2, "PX")
                        || args.is(2, "EXAT")
                        || args.is(2, "PXAT"))
                    {
                        return Err(SYNTAX.into());
                    }
                    Expiry::At(expire_arg(args.get(3), unit, absolute, now, "getex", true)?)
                }
                _ => return Err(SYNTAX.into()),
            };
            plain(WriteOp::GetEx {
                key: key.to_vec(),
                expiry,
            })
        }
        Cmd::MSet | Cmd::MSetNx => {
            if args.len().is_multiple_of(2) {
                let name = if cmd == Cmd::MSet { "mset" } else { "msetnx" };
                return Err(format!(
                    "ERR wrong number of arguments for '{name}' command"
                ));
            }
            let mut kvs = Vec::with_capacity(args.len() / 2);
            for i in (1..args.len()).step_by(2) {
                key_ok(args.get(i))?;
                kvs.push(KeyValue::new(args.get(i), args.get(i + 1)));
            }
            plain(WriteOp::MSet {
                kvs,
                nx: cmd == Cmd::MSetNx,
            })
        }
        Cmd::Incr => plain(WriteOp::IncrBy {
            key: key.to_vec(),
            delta: 1,
        }),
        Cmd::Decr => plain(WriteOp::IncrBy {
            key: key.to_vec(),
            delta: -1,
        }),
        Cmd::IncrBy => plain(WriteOp::IncrBy {
            key: key.to_vec(),
            delta: int_arg(args.get(2))?,
        }),
        Cmd::DecrBy => {
            let d = int_arg(args.get(2))?;
            let delta = d.checked_neg().ok_or("ERR decrement would overflow")?;
            plain(WriteOp::IncrBy {
                key: key.to_vec(),
                delta,
            })
        }
        Cmd::IncrByFloat => {
            let delta = crate::semantics::parse_float(args.get(2))
                .ok_or("ERR value is not a valid float")?;
            plain(WriteOp::IncrByFloat {
                key: key.to_vec(),
                delta,
            })
        }
        Cmd::Append => plain(WriteOp::Append {
            kv: KeyValue::new(key, args.get(2)),
        }),
        Cmd::SetRange => {
            let offset = int_arg(args.get(2))?;
            if offset < 0 {
                return Err("ERR offset is out of range".into());
            }
            if offset as u64 + args.get(3).len() as u64 > pass.limits.item_size_max as u64 {
                return Err("ERR string exceeds maximum allowed size (proto-max-bulk-len)".into());
            }
            plain(WriteOp::SetRange {
                kv: KeyValue::new(key, args.get(3)),
                offset: offset as usize,
            })
        }
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
        _ => Err(SYNTAX.into()),
    }
}

/// Encodes a write's reply once it has committed. EXEC's ends the transaction: its watches go.
pub fn complete_write(out: &mut Vec<u8>, sess: &mut Session, kind: RespReply, outcome: Outcome) {
    if let RespReply::Block(_) = kind {
        sess.block = None;
        return complete(out, sess.v3, RespReply::Plain, outcome);
    }
    if kind != RespReply::Exec {
        return complete(out, sess.v3, kind, outcome);
    }
    let kinds = sess.exec_kinds.pop_front().unwrap_or_default();
    sess.watching.clear();
    match outcome {
        Outcome::Array(items) => {
            enc::array(out, items.len());
            for (i, item) in items.into_iter().enumerate() {
                let kind = kinds.get(i).copied().unwrap_or(RespReply::Plain);
                complete(out, sess.v3, kind, item);
            }
        }
        other => complete(out, sess.v3, RespReply::Plain, other),
    }
}

/// Encodes one outcome as its command's reply.
pub fn complete(out: &mut Vec<u8>, v3: bool, kind: RespReply, outcome: Outcome) {
    match (kind, outcome) {
        (_, Outcome::Reply(bytes)) => out.extend_from_slice(&bytes),
        (RespReply::SetNx, Outcome::Done) => enc::int(out, 1),
        (RespReply::SetNx, Outcome::Nil) => enc::int(out, 0),
        (_, Outcome::Done) => enc::ok(out),
        (_, Outcome::Int(n)) => enc::int(out, n),
        (_, Outcome::Bulk(b)) => enc::bulk(out, &b),
        (_, Outcome::Nil) => enc::null(out, v3),
        (_, Outcome::Err(msg)) => enc::error(out, msg),
        (_, Outcome::BadKey) => enc::error(out, BAD_KEY),
        (_, Outcome::Full) => enc::error(
            out,
            "OOM command not allowed when used memory > 'maxmemory'.",
        ),
        (_, Outcome::WrongType) => enc::error(out, crate::types::WRONGTYPE),
        (_, Outcome::Damaged) => enc::error(out, crate::storage::RESP_DAMAGED),
        (_, Outcome::Double(d)) => enc::double(out, d, v3),
        (_, Outcome::NilArray) => enc::null_array(out, v3),
        (_, Outcome::Set(items)) => {
            enc::set(out, items.len(), v3);
            for item in items {
                complete(out, v3, RespReply::Plain, item);
            }
        }
        (_, Outcome::Pairs(pairs)) => {
            if v3 {
                enc::array(out, pairs.len());
                for (a, b) in pairs {
                    enc::array(out, 2);
                    complete(out, v3, RespReply::Plain, a);
                    complete(out, v3, RespReply::Plain, b);
                }
            } else {
                enc::array(out, pairs.len() * 2);
                for (a, b) in pairs {
                    complete(out, v3, RespReply::Plain, a);
                    complete(out, v3, RespReply::Plain, b);
                }
            }
        }
        (_, Outcome::Array(items)) => {
            enc::array(out, items.len());
            for item in items {
                complete(out, v3, RespReply::Plain, item);
            }
        }
        (_, Outcome::TooLarge) => enc::error(
            out,
            "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
        ),
        (_, other) => {
            if other != Outcome::Failed {
                error!("unexpected outcome for a RESP write: {other:?}");
            }
            enc::error(out, "ERR storage failure")
        }
    }
}

/// Runs a command answered on the worker; returns true when the connection should close.
fn read(
    cmd: Cmd,
    args: Args<'_>,
    out: &mut Vec<u8>,
    sess: &mut Session,
    pass: &mut Pass<'_>,
) -> bool {
    let v3 = sess.v3;
    match cmd {
        // RESP2 subscribed mode answers PING as a message-shaped array.
        Cmd::Ping if !v3 && sess.subs.count() > 0 => {
            enc::array(out, 2);
            enc::bulk(out, b"pong");
            enc::bulk(out, if args.len() > 1 { args.get(1) } else { b"" });
        }
        Cmd::Ping => match args.len() {
            1 => enc::simple(out, "PONG"),
            2 => enc::bulk(out, args.get(1)),
            _ => enc::error(out, "ERR wrong number of arguments for 'ping' command"),
        },
        Cmd::Echo => enc::bulk(out, args.get(1)),
        Cmd::Quit => {
            enc::ok(out);
            return true;
        }
        Cmd::Select => match parse_i64(args.get(1)) {
            Some(0) => enc::ok(out),
            Some(_) => enc::error(out, "ERR DB index is out of range"),
            None => enc::error(out, NOT_INTEGER),
        },
        Cmd::Time => {
            let now_us = pass.shared.clock.now_ms() * 1000;
            enc::array(out, 2);
            enc::bulk(out, (now_us / 1_000_000).to_string().as_bytes());
            enc::bulk(out, (now_us % 1_000_000).to_string().as_bytes());
        }
        Cmd::Auth => auth(args, out, sess, pass),
        Cmd::BgSave => {
            // A compacting copy of the store into `backup_dir`, while writes go on.
            let shared = pass.shared;
            if shared
                .backups
                .start(&shared.store, &shared.config.backup_dir, pass.now_ms / 1000)
            {
                enc::simple(out, "Background saving started");
            } else {
                enc::error(out, "ERR Background save already in progress");
            }
        }
        Cmd::LastSave => enc::int(
            out,
            pass.shared.backups.last_ok.load(Ordering::Acquire) as i64,
        ),
        Cmd::Hello => hello(args, out, sess, pass),
        Cmd::Client => return client(args, out, sess, pass),
        Cmd::Config => config(args, out, sess, pass),
        Cmd::Command => command(args, out, v3),
        Cmd::Info => info(args, out, v3, pass),
        Cmd::MGet => mget(args, out, sess, pass),
        Cmd::Watch => watch(args, out, sess, pass),
        Cmd::Unwatch => {
            sess.watching.clear();
            enc::ok(out);
        }
        Cmd::Subscribe
        | Cmd::Unsubscribe
        | Cmd::PSubscribe
        | Cmd::PUnsubscribe
        | Cmd::Publish
        | Cmd::PubSub => pubsub(cmd, args, out, sess, pass),
        Cmd::Reset => {
            // Redis's RESET: the connection as it was when accepted (its id stays).
            sess.multi = None;
            sess.exec_kinds.clear();
            sess.watching.clear();
            sess.subs.clear();
            sess.v3 = false;
            sess.authed = false;
            sess.name = None;
            if let Some(i) = &sess.info {
                i.set_name(None);
            }
            enc::simple(out, "RESET");
        }
        Cmd::Latency => latency(args, out, v3),
        Cmd::Wait => {
            // No replica ever acknowledges: 0 at once (Redis, with none, would wait out the
            // timeout first). The writes before it are already durable per the sync mode.
            match (parse_i64(args.get(1)), parse_i64(args.get(2))) {
                (None, _) => enc::error(out, NOT_INTEGER),
                (_, None) => enc::error(out, "ERR timeout is not an integer or out of range"),
                (_, Some(t)) if t < 0 => enc::error(out, "ERR timeout is negative"),
                _ => enc::int(out, 0),
            }
        }
        _ => data_read(cmd, args, out, v3, pass),
    }
    false
}

/// A subscribe or unsubscribe confirmation: `[kind, name or null, count]`, a push in RESP3.
fn confirm(out: &mut Vec<u8>, kind: &str, name: Option<&[u8]>, count: usize, v3: bool) {
    super::pubsub::push_header(out, 3, v3);
    enc::bulk(out, kind.as_bytes());
    match name {
        Some(n) => enc::bulk(out, n),
        None => enc::null(out, v3),
    }
    enc::int(out, count as i64);
}

/// An array of help lines as simple strings, as Redis's `addReplyHelp` sends them.
fn help(out: &mut Vec<u8>, lines: &[&str]) {
    enc::array(out, lines.len());
    for l in lines {
        enc::simple(out, l);
    }
}

/// SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH and PUBSUB.
fn pubsub(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) {
    use super::pubsub::Kind;
    let registry = &pass.shared.pubsub;
    let v3 = sess.v3;
    let (kind, word) = match cmd {
        Cmd::Subscribe => (Kind::Channel, "subscribe"),
        Cmd::Unsubscribe => (Kind::Channel, "unsubscribe"),
        Cmd::PSubscribe => (Kind::Pattern, "psubscribe"),
        Cmd::PUnsubscribe => (Kind::Pattern, "punsubscribe"),
        Cmd::Publish => {
            let mut mine = Vec::new();
            let n = registry.publish(args.get(1), args.get(2), sess.subs.who, &mut mine);
            // Redis writes a RESP3 publisher's own message before PUBLISH's reply.
            for m in mine {
                m.encode(out, v3);
            }
            return enc::int(out, n as i64);
        }
        _ => return pubsub_info(args, out, registry),
    };
    if matches!(cmd, Cmd::Subscribe | Cmd::PSubscribe) {
        for i in 1..args.len() {
            sess.subs.subscribe(registry, kind, args.get(i));
            confirm(out, word, Some(args.get(i)), sess.subs.count(), v3);
        }
        return;
    }
    let names: Vec<Vec<u8>> = if args.len() > 1 {
        (1..args.len()).map(|i| args.get(i).to_vec()).collect()
    } else {
        sess.subs.names(kind).iter().map(|n| n.to_vec()).collect()
    };
    if names.is_empty() {
        return confirm(out, word, None, sess.subs.count(), v3);
    }
    for n in names {
        sess.subs.unsubscribe(kind, &n);
        confirm(out, word, Some(&n), sess.subs.count(), v3);
    }
}

/// PUBSUB CHANNELS / NUMSUB / NUMPAT / SHARDCHANNELS / SHARDNUMSUB / HELP (memkeep has no
/// shard channels: those answer as Redis does with none).
fn pubsub_info(args: Args<'_>, out: &mut Vec<u8>, registry: &super::pubsub::PubSub) {
    let n = args.len();
    let syntax = |out: &mut Vec<u8>| {
        enc::error(
            out,
            &format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'. Try PUBSUB HELP.",
                String::from_utf8_lossy(&args.get(1)[..args.get(1).len().min(128)])
            ),
        )
    };
    if args.is(1, "HELP") && n == 2 {
        help(
            out,
            &[
                "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CHANNELS [<pattern>]",
                "    Return the currently active channels matching a <pattern> (default: '*').",
                "NUMPAT",
                "    Return number of subscriptions to patterns.",
                "NUMSUB [<channel> ...]",
                "    Return the number of subscribers for the specified channels, excluding",
                "    pattern subscriptions(default: no channels).",
                "SHARDCHANNELS [<pattern>]",
                "    Return the currently active shard level channels matching a <pattern> (default: '*').",
                "SHARDNUMSUB [<shardchannel> ...]",
                "    Return the number of subscribers for the specified shard level channel(s)",
                "HELP",
                "    Prints this help.",
            ],
        );
    } else if args.is(1, "CHANNELS") {
        if n > 3 {
            return syntax(out);
        }
        let channels = registry.channels((n == 3).then(|| args.get(2)));
        enc::array(out, channels.len());
        for c in channels {
            enc::bulk(out, &c);
        }
    } else if args.is(1, "NUMSUB") || args.is(1, "SHARDNUMSUB") {
        let shard = args.is(1, "SHARDNUMSUB");
        enc::array(out, (n - 2) * 2);
        for i in 2..n {
            enc::bulk(out, args.get(i));
            enc::int(
                out,
                if shard {
                    0
                } else {
                    registry.numsub(args.get(i)) as i64
                },
            );
        }
    } else if args.is(1, "NUMPAT") {
        if n != 2 {
            return sub_arity(out, "pubsub", args);
        }
        enc::int(out, registry.numpat() as i64);
    } else if args.is(1, "SHARDCHANNELS") {
        if n > 3 {
            return syntax(out);
        }
        enc::array(out, 0);
    } else {
        unknown_sub(out, "PUBSUB", args);
    }
}

/// LATENCY: memkeep has no latency monitor and no per-command histograms, so it answers as
/// Redis does with `latency-monitor-threshold 0` and `latency-tracking no`: no events, nothing
/// to reset, DOCTOR's "disabled" text.
fn latency(args: Args<'_>, out: &mut Vec<u8>, v3: bool) {
    let n = args.len();
    let arity = |ok: bool, out: &mut Vec<u8>| {
        if !ok {
            sub_arity(out, "latency", args);
        }
        ok
    };
    if args.is(1, "HELP") {
        if arity(n == 2, out) {
            help(
                out,
                &[
                    "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                    "DOCTOR",
                    "    Return a human readable latency analysis report.",
                    "GRAPH <event>",
                    "    Return an ASCII latency graph for the <event> class.",
                    "HISTORY <event>",
                    "    Return time-latency samples for the <event> class.",
                    "LATEST",
                    "    Return the latest latency samples for all events.",
                    "RESET [<event> ...]",
                    "    Reset latency data of one or more <event> classes.",
                    "    (default: reset all data for all event classes)",
                    "HISTOGRAM [COMMAND ...]",
                    "    Return a cumulative distribution of latencies in the format of a histogram for the specified command names.",
                    "    If no commands are specified then all histograms are replied.",
                    "HELP",
                    "    Prints this help.",
                ],
            );
        }
    } else if args.is(1, "LATEST") {
        if arity(n == 2, out) {
            enc::array(out, 0);
        }
    } else if args.is(1, "HISTORY") {
        if arity(n == 3, out) {
            enc::array(out, 0);
        }
    } else if args.is(1, "GRAPH") {
        if arity(n == 3, out) {
            enc::error(
                out,
                &format!(
                    "ERR No samples available for event '{}'",
                    String::from_utf8_lossy(args.get(2))
                ),
            );
        }
    } else if args.is(1, "RESET") {
        enc::int(out, 0);
    } else if args.is(1, "HISTOGRAM") {
        enc::map(out, 0, v3);
    } else if args.is(1, "DOCTOR") {
        if arity(n == 2, out) {
            enc::verbatim(
                out,
                b"I'm sorry, Dave, I can't do that. Latency monitoring is disabled in this Redis instance. You may use \"CONFIG SET latency-monitor-threshold <milliseconds>.\" in order to enable it. If we weren't in a deep space mission I'd suggest to take a look at https://redis.io/topics/latency-monitor.\n",
                v3,
            );
        }
    } else {
        unknown_sub(out, "LATENCY", args);
    }
}

/// WATCH key...: remembers each key's version, then (on a fresh snapshot, see
/// `storage::watch`) whether it is live with a TTL, whose passing will count as a change.
fn watch(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &mut Pass<'_>) {
    let shared = pass.shared;
    let registry = &shared.watches;
    let w = &mut sess.watching;
    if w.registry.is_none() {
        w.registry = Some(registry.clone());
    }
    let first_new = w.keys.len();
    for i in 1..args.len() {
        let key = args.get(i);
        if w.keys.iter().any(|k| k.key == key) {
            continue;
        }
        if w.keys.len() >= WATCH_MAX_KEYS {
            return enc::error(
                out,
                &format!(
                    "ERR too many watched keys (memkeep watches at most {WATCH_MAX_KEYS} per connection)"
                ),
            );
        }
        let version = registry.watch(key);
        w.keys.push(WatchedKey {
            key: key.to_vec(),
            version,
            expires: None,
        });
    }
    pass.fresh_snapshot();
    let (now, flushed) = (pass.now_ms, pass.flushed());
    if let Ok(store) = pass.snap() {
        for k in &mut sess.watching.keys[first_new..] {
            if let Ok(Some(item)) = store.get(&k.key)
                && !flushed
                && !item.meta.is_expired(now)
                && item.meta.expire_at != 0
            {
                k.expires = Some(item.meta.expire_at);
            }
        }
    }
    enc::ok(out);
}

/// MGET. Once the reply has added `sess.room` bytes it pauses after the value at hand and notes
/// the next key in `sess.mget_resume`: the caller keeps the request and runs it again when the
/// client has read most of its replies, so one MGET naming a big value many times cannot make
/// the reply without bound. Each piece reads from its own pass's snapshot.
fn mget(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &mut Pass<'_>) {
    let first = sess.mget_resume.max(1);
    sess.mget_resume = 0;
    let (v3, room) = (sess.v3, sess.room);
    let (now, flushed, counters, shared) =
        (pass.now_ms, pass.flushed(), pass.counters, pass.shared);
    match pass.snap() {
        Ok(store) => {
            let view = View {
                store,
                txn: store.txn(),
                now,
                flushed,
                cursors: &shared.scan_cursors,
                counters: Some(counters),
            };
            sess.mget_resume = mget_view(args, out, v3, room, first, &view);
        }
        Err(e) => {
            if !e.is_damage() {
                error!("cannot open read transaction: {e}");
            }
            if first == 1 {
                return enc::error(out, &e.resp_reply());
            }
            // The array has begun: the rest reads as absent.
            for _ in first..args.len() {
                Counters::bump(&counters.get_misses);
                enc::null(out, v3);
            }
        }
    }
}

/// MGET's keys from `first` on, against `view`; the index of the key to resume at when the
/// reply paused at `room` bytes, else 0.
fn mget_view(
    args: Args<'_>,
    out: &mut Vec<u8>,
    v3: bool,
    room: usize,
    first: usize,
    view: &View<'_, '_>,
) -> usize {
    let start = out.len();
    let hit = |found: bool| {
        if let Some(c) = view.counters {
            Counters::bump(if found { &c.get_hits } else { &c.get_misses });
        }
    };
    if first == 1 {
        enc::array(out, args.len() - 1);
    }
    for i in first..args.len() {
        // Storage errors are logged and read as absent, except damage: the whole reply is
        // then the error, or, once a piece has been sent, the key's element is.
        let item = match view.store.lookup(args.get(i)) {
            Ok(Found::Cold) => {
                // Not in memory: go on from this key once it is read in (with the cold ones
                // among the next few). Nothing sent yet: the request runs again whole.
                for j in (i + 1..args.len()).take(super::memcache::COLD_AHEAD) {
                    view.store.note_cold(args.get(j));
                }
                if i == 1 {
                    out.truncate(start);
                    return 0;
                }
                return i;
            }
            Ok(Found::Item(item)) => Ok(Some(item)),
            Ok(Found::Missing) => Ok(None),
            Err(e) => Err(e),
        };
        let item = match item {
            Ok(Some(item))
                if !view.flushed
                    && !item.meta.is_expired(view.now)
                    && item.meta.kind == Kind::String =>
            {
                Some(item)
            }
            Ok(_) => None,
            Err(e) if e.is_damage() => {
                if first == 1 {
                    out.truncate(start);
                }
                enc::error(out, crate::storage::RESP_DAMAGED);
                if first == 1 {
                    return 0;
                }
                continue;
            }
            Err(e) => {
                error!("read of a stored item failed: {e}");
                None
            }
        };
        match item {
            Some(item) => {
                hit(true);
                enc::bulk(out, item.value);
                if out.len() - start >= room && i + 1 < args.len() {
                    return i + 1;
                }
            }
            None => {
                hit(false);
                enc::null(out, v3)
            }
        }
    }
    0
}

/// What a read of the store runs against: the worker pass's snapshot, or, inside EXEC, the
/// writer's transaction (seen as a read transaction, so it sees the steps before it).
#[derive(Clone, Copy)]
pub struct View<'a, 't> {
    /// The pass's snapshot, or the writer's transaction (EXEC).
    pub store: &'a crate::storage::overlay::Snap<'t>,
    pub txn: &'t heed::RoTxn<'t>,
    pub now: u64,
    /// A delayed flush_all has come due: everything reads as missing.
    pub flushed: bool,
    pub cursors: &'a Mutex<ScanCursors>,
    /// Hit and miss counters (a connection's worker; none inside EXEC).
    pub counters: Option<&'a Counters>,
}

/// Reads that touch the store, on the pass's snapshot.
fn data_read(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, v3: bool, pass: &mut Pass<'_>) {
    let (now, flushed, counters, shared) =
        (pass.now_ms, pass.flushed(), pass.counters, pass.shared);
    let store = match pass.snap() {
        Ok(t) => t,
        Err(e) => {
            if !e.is_damage() {
                error!("cannot open read transaction: {e}");
            }
            return enc::error(out, &e.resp_reply());
        }
    };
    let view = View {
        store,
        txn: store.txn(),
        now,
        flushed,
        cursors: &shared.scan_cursors,
        counters: Some(counters),
    };
    let start = out.len();
    read_view(cmd, args, out, v3, &view);
    if store.found_cold() {
        // An item is being read in: no answer yet (`Pass::deferred`); it runs again then.
        out.truncate(start);
    }
}

/// INFO memory's size of the data file (what the store takes on disk, free pages included).
fn data_file_line(cfg: &crate::config::Config) -> String {
    format!(
        "memkeep_data_file_bytes:{}\r\n",
        std::fs::metadata(cfg.data_dir.join("data.mdb")).map_or(0, |m| m.len()),
    )
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

/// Runs a read of the store against `view`: callable from a connection's pass or from EXEC.
pub fn read_view(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, v3: bool, view: &View<'_, '_>) {
    let View {
        store,
        txn,
        now,
        flushed,
        cursors,
        counters,
    } = *view;
    // The live item under a key, or None. An item not in memory reads as None here, but the
    // snapshot notes it, and the caller throws this reply away (`data_read`).
    let lookup = |key: &[u8]| -> Result<Option<ItemRef<'_>>, StoreError> {
        Ok(match store.lookup(key)? {
            Found::Item(item) => Some(item),
            Found::Missing | Found::Cold => None,
        }
        .filter(|item| !flushed && !item.meta.is_expired(now)))
    };
    // Answers a failed read (damage is logged where it was found).
    let failed = |out: &mut Vec<u8>, e: StoreError| {
        if !e.is_damage() {
            error!("read of a stored item failed: {e}");
        }
        enc::error(out, &e.resp_reply())
    };
    // The item under the command's key, or the reply to a failed read.
    macro_rules! lookup1 {
        () => {
            match lookup(args.get(1)) {
                Ok(item) => item,
                Err(e) => return failed(out, e),
            }
        };
    }
    let hit = |found: bool| {
        if let Some(c) = counters
            && !store.found_cold()
        {
            Counters::bump(if found { &c.get_hits } else { &c.get_misses });
        }
    };
    match cmd {
        Cmd::MGet => {
            mget_view(args, out, v3, usize::MAX, 1, view);
        }
        Cmd::Coll(family, code) => {
            let cx = types::ReadCx {
                store,
                txn,
                now,
                flushed,
                cursors,
            };
            match family {
                Family::List => types::list::read(code, args, &cx, out, v3),
                Family::Hash => types::hash::read(code, args, &cx, out, v3),
                Family::Set => types::set::read(code, args, &cx, out, v3),
                Family::ZSet => types::zset::read(code, args, &cx, out, v3),
            }
        }
        Cmd::Get | Cmd::StrLen | Cmd::GetRange => {
            let item = lookup1!();
            if item.is_some_and(|i| i.meta.kind != Kind::String) {
                return enc::error(out, crate::types::WRONGTYPE);
            }
            match cmd {
                Cmd::Get => match item {
                    Some(item) => {
                        hit(true);
                        enc::bulk(out, item.value)
                    }
                    None => {
                        hit(false);
                        enc::null(out, v3)
                    }
                },
                Cmd::StrLen => enc::int(out, item.map_or(0, |i| i.value.len() as i64)),
                _ => {
                    let (Some(start), Some(end)) = (parse_i64(args.get(2)), parse_i64(args.get(3)))
                    else {
                        return enc::error(out, NOT_INTEGER);
                    };
                    let value = item.map_or(&[][..], |i| i.value);
                    enc::bulk(out, substr(value, start, end));
                }
            }
        }
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
            let v = match lookup1!() {
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
        Cmd::Type => {
            let item = lookup1!();
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

/// Up to this many keys, RANDOMKEY draws an index and walks to it: exactly uniform.
const RANDOMKEY_WALK: u64 = 4096;

/// A random key. Small stores: uniform (a random index, walked to). Larger ones: a random
/// probe between the first and the last key, drawn byte by byte from where they differ, then
/// the first key at or after it; keys of one shape (`user:0001`.., hex ids) come out close to
/// uniform, but a key after a wide gap is more likely than one in a dense run.
fn random_key(store: &crate::storage::overlay::Snap<'_>) -> Result<Option<Vec<u8>>, StoreError> {
    use std::ops::Bound::{Included, Unbounded};
    let n = store.len()?;
    if n == 0 {
        return Ok(None);
    }
    let first_at = |lo: std::ops::Bound<&[u8]>| -> Result<Option<Vec<u8>>, StoreError> {
        Ok(match store.range(lo, Unbounded)?.next() {
            Some(r) => Some(r?.0.to_vec()),
            None => None,
        })
    };
    if n <= RANDOMKEY_WALK {
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
    let Some(first) = first_at(Unbounded)? else {
        return Ok(None);
    };
    let last = store
        .items()
        .last(store.txn())?
        .map(|(k, _)| k.to_vec())
        .unwrap_or_else(|| first.clone());
    let common = first.iter().zip(&last).take_while(|(a, b)| a == b).count();
    let mut probe = first[..common].to_vec();
    let lo = first.get(common).copied().unwrap_or(0);
    let hi = last.get(common).copied().unwrap_or(0xff).max(lo);
    probe.push(lo + (types::random_u64() % (u64::from(hi - lo) + 1)) as u8);
    probe.extend((0..8).map(|_| types::random_u64() as u8));
    Ok(first_at(Included(&probe[..]))?.or(Some(first)))
}

/// What SCAN needs from the pass.
struct ScanView<'a, 't> {
    store: &'a crate::storage::overlay::Snap<'t>,
    now: u64,
    flushed: bool,
}

/// The options after a SCAN-family cursor.
pub struct ScanOpts<'a> {
    pub pattern: Option<&'a [u8]>,
    pub count: usize,
    pub type_filter: Option<&'a [u8]>,
}

/// Parses `[MATCH pattern] [COUNT n]` (and `[TYPE t]` when `with_type`) from argument `from` on.
pub fn scan_opts(
    args: Args<'_>,
    from: usize,
    with_type: bool,
) -> Result<ScanOpts<'_>, &'static str> {
    let mut o = ScanOpts {
        pattern: None,
        count: 10,
        type_filter: None,
    };
    let mut i = from;
    while i < args.len() {
        if i + 1 >= args.len() {
            return Err(SYNTAX);
        }
        if args.is(i, "MATCH") {
            o.pattern = Some(args.get(i + 1));
        } else if args.is(i, "COUNT") {
            match parse_i64(args.get(i + 1)) {
                Some(n) if n >= 1 => o.count = n as usize,
                Some(_) => return Err(SYNTAX),
                None => return Err(NOT_INTEGER),
            }
        } else if with_type && args.is(i, "TYPE") {
            o.type_filter = Some(args.get(i + 1));
        } else {
            return Err(SYNTAX);
        }
        i += 2;
    }
    Ok(o)
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

/// GETRANGE's index rules: negatives count from the end, both ends inclusive, clamped.
fn substr(v: &[u8], start: i64, end: i64) -> &[u8] {
    let len = v.len() as i64;
    if len == 0 || (start < 0 && end < 0 && start > end) {
        return &[];
    }
    let mut s = if start < 0 { len + start } else { start };
    let mut e = if end < 0 { len + end } else { end };
    s = s.max(0);
    e = e.max(0).min(len - 1);
    if s > e || s >= len {
        &[]
    } else {
        &v[s as usize..=e as usize]
    }
}

/// Redis's glob (stringmatchlen): `*`, `?`, `[abc]`, `[^a-z]`, `\x` escapes.
pub fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    // Where to resume after the last `*`: (pattern index after it, string index it matched to).
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, i));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => class_match(pattern, p, s[i]),
            Some(b'\\') if p + 1 < pattern.len() => (pattern[p + 1] == s[i]).then_some(p + 2),
            Some(&c) => (c == s[i]).then_some(p + 1),
            None => None,
        };
        match step {
            Some(np) => {
                p = np;
                i += 1;
            }
            None => match star {
                Some((sp, si)) => {
                    p = sp;
                    i = si + 1;
                    star = Some((sp, si + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class starting at `pattern[p] == '['`; the index after the class.
fn class_match(pattern: &[u8], p: usize, c: u8) -> Option<usize> {
    let mut j = p + 1;
    let negate = pattern.get(j) == Some(&b'^');
    if negate {
        j += 1;
    }
    let mut matched = false;
    loop {
        match pattern.get(j) {
            None => {
                // An unterminated class: Redis treats the end of pattern as its end.
                break;
            }
            Some(b']') => {
                j += 1;
                break;
            }
            Some(b'\\') if j + 1 < pattern.len() => {
                matched |= pattern[j + 1] == c;
                j += 2;
            }
            Some(&lo)
                if pattern.get(j + 1) == Some(&b'-')
                    && j + 2 < pattern.len()
                    && pattern[j + 2] != b']' =>
            {
                let hi = pattern[j + 2];
                let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
                matched |= (lo..=hi).contains(&c);
                j += 3;
            }
            Some(&x) => {
                matched |= x == c;
                j += 1;
            }
        }
    }
    (matched != negate).then_some(j)
}

fn auth(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) {
    let required = &pass.shared.config.requirepass;
    let (user, pass_arg) = match args.len() {
        2 => (&b"default"[..], args.get(1)),
        3 => (args.get(1), args.get(2)),
        _ => return enc::error(out, SYNTAX),
    };
    if required.is_empty() && args.len() == 2 {
        return enc::error(
            out,
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        );
    }
    // Without a password the default user takes any password (Redis's `nopass`).
    if user == b"default" && (required.is_empty() || pass_arg == required.as_bytes()) {
        sess.authed = true;
        enc::ok(out);
    } else {
        enc::error(
            out,
            "WRONGPASS invalid username-password pair or user is disabled.",
        );
    }
}

fn hello(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) {
    let mut v3 = sess.v3;
    let mut i = 1;
    if args.len() > 1 {
        match parse_i64(args.get(1)) {
            Some(2) => v3 = false,
            Some(3) => v3 = true,
            Some(_) => return enc::error(out, "NOPROTO unsupported protocol version"),
            None => {
                return enc::error(
                    out,
                    "ERR Protocol version is not an integer or out of range",
                );
            }
        }
        i = 2;
    }
    let mut authed = sess.authed;
    let mut name = None;
    while i < args.len() {
        if args.is(i, "AUTH") && i + 2 < args.len() {
            let required = &pass.shared.config.requirepass;
            let ok = args.get(i + 1) == b"default"
                && (required.is_empty() || args.get(i + 2) == required.as_bytes());
            if !ok {
                return enc::error(
                    out,
                    "WRONGPASS invalid username-password pair or user is disabled.",
                );
            }
            authed = true;
            i += 3;
        } else if args.is(i, "SETNAME") && i + 1 < args.len() {
            name = Some(args.get(i + 1).to_vec());
            i += 2;
        } else {
            return enc::error(
                out,
                &format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(args.get(i))
                ),
            );
        }
    }
    if !pass.shared.config.requirepass.is_empty() && !authed {
        return enc::error(
            out,
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        );
    }
    sess.v3 = v3;
    sess.authed = authed;
    if name.is_some() {
        sess.name = name;
        if let Some(i) = &sess.info {
            i.set_name(sess.name.as_deref());
        }
    }
    enc::map(out, 7, v3);
    enc::bulk(out, b"server");
    enc::bulk(out, b"redis");
    enc::bulk(out, b"version");
    enc::bulk(out, REDIS_VERSION.as_bytes());
    enc::bulk(out, b"proto");
    enc::int(out, if v3 { 3 } else { 2 });
    enc::bulk(out, b"id");
    enc::int(out, sess.id as i64);
    enc::bulk(out, b"mode");
    enc::bulk(out, b"standalone");
    enc::bulk(out, b"role");
    enc::bulk(out, b"master");
    enc::bulk(out, b"modules");
    enc::array(out, 0);
}

/// The Redis version memkeep reports, so clients enable what it implements.
pub const REDIS_VERSION: &str = "7.0.0";

/// Redis 7's error for a subcommand it does not know, e.g. `CLIENT FOO`.
fn unknown_sub(out: &mut Vec<u8>, cmd: &str, args: Args<'_>) {
    let sub = String::from_utf8_lossy(args.get(1));
    enc::error(
        out,
        &format!("ERR unknown subcommand '{sub}'. Try {cmd} HELP."),
    );
}

/// Redis 7's arity error for a subcommand, e.g. `client|setname`.
fn sub_arity(out: &mut Vec<u8>, cmd: &str, args: Args<'_>) {
    let sub = String::from_utf8_lossy(args.get(1)).to_ascii_lowercase();
    enc::error(
        out,
        &format!("ERR wrong number of arguments for '{cmd}|{sub}' command"),
    );
}

/// One client's CLIENT LIST line, in Redis 7.0's field order. memkeep does not account a
/// connection's memory the way Redis does: the buffer and memory fields answer 0. `own` is the
/// session asking (its fields are fresher than the table's, and its command names its
/// subcommand, as Redis's `client|list`).
fn client_line(c: &super::clients::ClientInfo, own: Option<(&Session, Args<'_>)>) -> String {
    use super::clients::{FLAG_BLOCKED, FLAG_MULTI, FLAG_PUBSUB};
    let elapsed = c.connected.elapsed();
    let idle_ms = (elapsed.as_millis() as u64).saturating_sub(c.active_ms.load(Ordering::Relaxed));
    let mut name = c.name();
    let mut flags_bits = c.flags.load(Ordering::Relaxed);
    let mut multi = c.multi.load(Ordering::Relaxed) as i64 - 1;
    let mut cmd = c.cmd().to_string();
    let mut resp = c.resp.load(Ordering::Relaxed);
    let (mut sub, mut psub) = (
        c.sub.load(Ordering::Relaxed) as usize,
        c.psub.load(Ordering::Relaxed) as usize,
    );
    let mut idle = idle_ms / 1000;
    if let Some((sess, args)) = own {
        name = sess.name.clone().unwrap_or_default();
        (sub, psub) = sess.subs.counts();
        flags_bits = if sess.multi.is_some() { FLAG_MULTI } else { 0 }
            | if sub + psub > 0 { FLAG_PUBSUB } else { 0 };
        multi = sess.multi.as_ref().map_or(-1, |m| m.queued.len() as i64);
        cmd = format!(
            "client|{}",
            String::from_utf8_lossy(args.get(1)).to_ascii_lowercase()
        );
        resp = if sess.v3 { 3 } else { 2 };
        idle = 0;
        if let Some(queued) = sess.in_exec {
            // Run by EXEC: Redis shows the transaction, not the subcommand.
            flags_bits |= FLAG_MULTI;
            multi = queued as i64;
            cmd = "exec".into();
        }
    }
    let mut flags = String::new();
    if flags_bits & FLAG_BLOCKED != 0 {
        flags.push('b');
    }
    if flags_bits & FLAG_PUBSUB != 0 {
        flags.push('P');
    }
    if flags_bits & FLAG_MULTI != 0 {
        flags.push('x');
    }
    if flags.is_empty() {
        flags.push('N');
    }
    let addr = |a: Option<std::net::SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
    format!(
        "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db=0 sub={} psub={} ssub=0 \
         multi={} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 \
         tot-mem=0 events=r cmd={} user=default redir=-1 resp={}\n",
        c.id,
        addr(c.addr),
        addr(c.laddr),
        c.fd,
        String::from_utf8_lossy(&name),
        elapsed.as_secs(),
        idle,
        flags,
        sub,
        psub,
        multi,
        cmd,
        resp,
    )
}

/// CLIENT LIST [TYPE type] [ID id ...].
fn client_list(args: Args<'_>, out: &mut Vec<u8>, sess: &Session, pass: &Pass<'_>) {
    let mut ids: Option<Vec<u64>> = None;
    let mut pubsub: Option<bool> = None;
    let mut none = false;
    let mut i = 2;
    while i < args.len() {
        if args.is(i, "TYPE") && i + 1 < args.len() {
            match client_type(args.get(i + 1)) {
                Ok(t) => {
                    pubsub = t;
                    none = t.is_none();
                }
                Err(msg) => return enc::error(out, &msg),
            }
            i += 2;
        } else if args.is(i, "ID") && i + 1 < args.len() {
            let mut v = Vec::new();
            i += 1;
            while i < args.len() {
                match parse_i64(args.get(i)) {
                    Some(n) if n > 0 => v.push(n as u64),
                    _ => return enc::error(out, "ERR Invalid client ID"),
                }
                i += 1;
            }
            ids = Some(v);
        } else {
            return enc::error(out, SYNTAX);
        }
    }
    let mut text = String::new();
    for c in pass.shared.clients.all() {
        let is_pubsub = c.flags.load(Ordering::Relaxed) & super::clients::FLAG_PUBSUB != 0;
        if none
            || pubsub.is_some_and(|p| p != is_pubsub)
            || ids.as_ref().is_some_and(|v| !v.contains(&c.id))
        {
            continue;
        }
        let own = (c.id == sess.id).then_some((sess, args));
        text.push_str(&client_line(&c, own));
    }
    enc::verbatim(out, text.as_bytes(), sess.v3);
}

/// A client TYPE: Some(false) normal, Some(true) pubsub, None a kind memkeep never has
/// (master, replica, slave).
fn client_type(t: &[u8]) -> Result<Option<bool>, String> {
    match t.to_ascii_lowercase().as_slice() {
        b"normal" => Ok(Some(false)),
        b"pubsub" => Ok(Some(true)),
        b"master" | b"replica" | b"slave" => Ok(None),
        _ => Err(format!(
            "ERR Unknown client type '{}'",
            String::from_utf8_lossy(t)
        )),
    }
}

/// CLIENT KILL addr:port, or CLIENT KILL [ID id] [TYPE type] [ADDR a] [LADDR a] [USER u]
/// [SKIPME yes|no]. Returns whether the calling connection is among the killed (it closes
/// once its reply is out).
fn client_kill(args: Args<'_>, out: &mut Vec<u8>, sess: &Session, pass: &Pass<'_>) -> bool {
    use super::clients::Filter;
    let shared = pass.shared;
    let wake = |w: usize| {
        if let Some(m) = shared.mailboxes.get(w) {
            m.wake();
        }
    };
    let own = sess.info.as_deref();
    if args.len() == 3 {
        // The old form: one address, the caller included; an error when nobody has it.
        let filter = Filter {
            addr: Some(String::from_utf8_lossy(args.get(2)).into_owned()),
            ..Filter::default()
        };
        let n = shared.clients.kill(&filter, Some(sess.id), wake);
        if n == 0 {
            enc::error(out, "ERR No such client");
            return false;
        }
        enc::ok(out);
        return own.is_some_and(|c| filter.matches(c));
    }
    if !args.len().is_multiple_of(2) {
        enc::error(out, SYNTAX);
        return false;
    }
    let mut filter = Filter {
        skip: Some(sess.id),
        ..Filter::default()
    };
    for i in (2..args.len()).step_by(2) {
        let v = args.get(i + 1);
        let text = || String::from_utf8_lossy(v).into_owned();
        if args.is(i, "ID") {
            match parse_i64(v) {
                Some(n) if n > 0 => filter.id = Some(n as u64),
                _ => {
                    enc::error(out, "ERR client-id should be greater than 0");
                    return false;
                }
            }
        } else if args.is(i, "TYPE") {
            match client_type(v) {
                Ok(Some(p)) => filter.pubsub = Some(p),
                Ok(None) => filter.none = true,
                Err(msg) => {
                    enc::error(out, &msg);
                    return false;
                }
            }
        } else if args.is(i, "ADDR") {
            filter.addr = Some(text());
        } else if args.is(i, "LADDR") {
            filter.laddr = Some(text());
        } else if args.is(i, "USER") {
            // memkeep's one user is Redis's `default`.
            if v != b"default" {
                enc::error(out, &format!("ERR No such user '{}'", text()));
                return false;
            }
        } else if args.is(i, "SKIPME") {
            if v.eq_ignore_ascii_case(b"yes") {
                filter.skip = Some(sess.id);
            } else if v.eq_ignore_ascii_case(b"no") {
                filter.skip = None;
            } else {
                enc::error(out, SYNTAX);
                return false;
            }
        } else {
            enc::error(out, SYNTAX);
            return false;
        }
    }
    let n = shared.clients.kill(&filter, Some(sess.id), wake);
    enc::int(out, n as i64);
    own.is_some_and(|c| filter.matches(c))
}

/// CLIENT's subcommands; returns true when the connection should close after its reply
/// (CLIENT KILL of itself).
fn client(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) -> bool {
    let known = [
        "SETNAME", "GETNAME", "ID", "LIST", "INFO", "SETINFO", "UNBLOCK", "NO-EVICT", "NO-TOUCH",
        "PAUSE", "UNPAUSE", "KILL",
    ];
    let arity_ok = match () {
        _ if args.is(1, "SETNAME") || args.is(1, "NO-EVICT") || args.is(1, "NO-TOUCH") => {
            args.len() == 3
        }
        _ if args.is(1, "UNBLOCK") || args.is(1, "PAUSE") || args.is(1, "KILL") => args.len() >= 3,
        _ if args.is(1, "UNPAUSE") => args.len() == 2,
        _ if args.is(1, "GETNAME") || args.is(1, "ID") || args.is(1, "INFO") => args.len() == 2,
        _ if args.is(1, "SETINFO") => args.len() == 4,
        _ => true,
    };
    if known.iter().any(|k| args.is(1, k)) && !arity_ok {
        sub_arity(out, "client", args);
        return false;
    }
    if args.is(1, "KILL") {
        return client_kill(args, out, sess, pass);
    }
    if args.is(1, "LIST") {
        client_list(args, out, sess, pass);
    } else {
        client_other(args, out, sess, pass);
    }
    false
}

/// The CLIENT subcommands that answer only this connection (arity already checked).
fn client_other(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) {
    if args.is(1, "SETNAME") && args.len() == 3 {
        let name = args.get(2);
        if name.iter().any(|&b| b <= b' ' || b > b'~') {
            return enc::error(
                out,
                "ERR Client names cannot contain spaces, newlines or special characters.",
            );
        }
        sess.name = (!name.is_empty()).then(|| name.to_vec());
        if let Some(i) = &sess.info {
            i.set_name(sess.name.as_deref());
        }
        enc::ok(out);
    } else if args.is(1, "GETNAME") && args.len() == 2 {
        match &sess.name {
            Some(n) => enc::bulk(out, n),
            None => enc::null(out, sess.v3),
        }
    } else if args.is(1, "ID") && args.len() == 2 {
        enc::int(out, sess.id as i64);
    } else if args.is(1, "INFO") {
        match &sess.info {
            Some(c) => {
                let line = client_line(c, Some((sess, args)));
                enc::verbatim(out, line.as_bytes(), sess.v3);
            }
            None => enc::bulk(out, b""),
        }
    } else if args.is(1, "SETINFO") && args.len() == 4 {
        enc::ok(out);
    } else if args.is(1, "UNBLOCK") && args.len() <= 4 {
        let Some(id) = parse_i64(args.get(2)) else {
            return enc::error(out, NOT_INTEGER);
        };
        let outcome = match args.len() {
            3 => types::blocking::TIMED_OUT,
            _ if args.is(3, "TIMEOUT") => types::blocking::TIMED_OUT,
            _ if args.is(3, "ERROR") => types::blocking::UNBLOCKED,
            _ => return enc::error(out, "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"),
        };
        let done = id > 0 && pass.shared.blocking.unblock_client(id as u64, outcome);
        enc::int(out, done as i64);
    } else if args.is(1, "PAUSE") && args.len() <= 4 {
        let Some(ms) = parse_i64(args.get(2)) else {
            return enc::error(out, "ERR timeout is not an integer or out of range");
        };
        if ms < 0 {
            return enc::error(out, "ERR timeout is negative");
        }
        let all = match args.len() {
            3 => true,
            _ if args.is(3, "ALL") => true,
            _ if args.is(3, "WRITE") => false,
            _ => return enc::error(out, "ERR CLIENT PAUSE mode must be WRITE or ALL"),
        };
        pass.shared.pause.pause(ms as u64, all);
        enc::ok(out);
    } else if args.is(1, "UNPAUSE") {
        pass.shared.pause.unpause();
        for m in &pass.shared.mailboxes {
            m.wake();
        }
        enc::ok(out);
    } else if args.is(1, "NO-EVICT") || args.is(1, "NO-TOUCH") {
        // memkeep evicts nothing, and keeps no access times for eviction to use: both flags
        // are accepted and change nothing.
        if args.is(2, "ON") || args.is(2, "OFF") {
            enc::ok(out);
        } else {
            enc::error(out, SYNTAX);
        }
    } else {
        // Redis's fallback for a known subcommand with an argument count it does not take.
        let sub = String::from_utf8_lossy(args.get(1));
        if args.is(1, "UNBLOCK") || args.is(1, "PAUSE") {
            return enc::error(
                out,
                &format!(
                    "ERR unknown subcommand or wrong number of arguments for '{sub}'. Try CLIENT HELP."
                ),
            );
        }
        unknown_sub(out, "CLIENT", args);
    }
}

fn config(args: Args<'_>, out: &mut Vec<u8>, sess: &Session, pass: &Pass<'_>) {
    let cfg = &pass.shared.config;
    if args.is(1, "GET") && args.len() >= 3 {
        let appendfsync = match cfg.sync {
            crate::config::SyncMode::Always => "always",
            crate::config::SyncMode::Periodic => "everysec",
            crate::config::SyncMode::Never => "no",
        };
        let cache = cfg.max_disk > 0;
        let params: [(&str, String); 12] = [
            ("save", String::new()),
            ("appendonly", "no".into()),
            ("appendfsync", appendfsync.into()),
            (
                "maxmemory",
                if cache { cfg.max_disk } else { cfg.map_size }.to_string(),
            ),
            (
                "maxmemory-policy",
                if cache { "allkeys-lru" } else { "noeviction" }.into(),
            ),
            ("databases", "1".into()),
            ("port", cfg.resp_port.to_string()),
            ("bind", cfg.listen.clone()),
            ("maxclients", cfg.max_connections.to_string()),
            ("timeout", "0".into()),
            ("proto-max-bulk-len", cfg.max_item_size.to_string()),
            ("dir", cfg.data_dir.display().to_string()),
        ];
        // A name without glob characters is echoed as given (Redis does); a pattern answers the
        // parameters' own names.
        let mut hits: Vec<(&[u8], &String)> = Vec::new();
        for i in 2..args.len() {
            let given = args.get(i);
            let pat = given.to_ascii_lowercase();
            let literal = !given
                .iter()
                .any(|b| matches!(b, b'*' | b'?' | b'[' | b'\\'));
            for p in &params {
                let seen = hits
                    .iter()
                    .any(|h| h.1 == &p.1 && h.0.eq_ignore_ascii_case(p.0.as_bytes()));
                if glob_match(&pat, p.0.as_bytes()) && !seen {
                    hits.push((if literal { given } else { p.0.as_bytes() }, &p.1));
                }
            }
        }
        enc::map(out, hits.len(), sess.v3);
        for (k, v) in hits {
            enc::bulk(out, k);
            enc::bulk(out, v.as_bytes());
        }
    } else if args.is(1, "GET") {
        sub_arity(out, "config", args);
    } else if args.is(1, "RESETSTAT") && args.len() == 2 {
        for c in pass.shared.counters.iter() {
            c.reset();
        }
        pass.shared.cache.reset();
        enc::ok(out);
    } else if args.is(1, "SET") {
        enc::error(
            out,
            "ERR CONFIG SET is not supported by memkeep; use its config file or flags",
        );
    } else {
        unknown_sub(out, "CONFIG", args);
    }
}

fn command(args: Args<'_>, out: &mut Vec<u8>, v3: bool) {
    let describe = |out: &mut Vec<u8>, s: &Spec| {
        enc::array(out, 10);
        enc::bulk(out, s.name.as_bytes());
        enc::int(out, s.arity as i64);
        enc::set(out, 1, v3);
        enc::simple(out, if s.write { "write" } else { "readonly" });
        enc::int(out, s.keys.0 as i64);
        enc::int(out, s.keys.1 as i64);
        enc::int(out, s.keys.2 as i64);
        enc::set(out, 0, v3);
        enc::array(out, 0);
        enc::array(out, 0);
        enc::array(out, 0);
    };
    if args.len() == 1 {
        enc::array(out, all_specs().count());
        for s in all_specs() {
            describe(out, s);
        }
    } else if args.is(1, "COUNT") {
        enc::int(out, all_specs().count() as i64);
    } else if args.is(1, "INFO") {
        enc::array(out, args.len() - 2);
        for i in 2..args.len() {
            match lookup(args.get(i)) {
                Some(s) => describe(out, s),
                None => enc::null(out, v3),
            }
        }
    } else if args.is(1, "DOCS") {
        // No docs: clients fall back to plain input without hints.
        enc::map(out, 0, v3);
    } else {
        unknown_sub(out, "COMMAND", args);
    }
}

fn info(args: Args<'_>, out: &mut Vec<u8>, v3: bool, pass: &mut Pass<'_>) {
    let shared = pass.shared;
    let cfg = &shared.config;
    let mut t = Totals::default();
    for c in shared.counters.iter() {
        t.add(c);
    }
    // Before the snapshot (see `CacheStats::figures`).
    let cache = shared.cache.figures();
    let keys = match pass.snap() {
        Ok(store) => store.len().unwrap_or(0),
        Err(_) => 0,
    };
    let used = shared.store.used_bytes();
    let mem = super::stats::rss();
    let (user, sys) = rusage();
    let (channels, patterns) = shared.pubsub.sizes();
    let uptime = shared.started.elapsed().as_secs();
    let wanted: Vec<String> = (1..args.len())
        .map(|i| String::from_utf8_lossy(args.get(i)).to_ascii_lowercase())
        .collect();
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| w == "all" || w == "everything" || w == "default");
    let show = |name: &str| all || wanted.iter().any(|w| w == name);
    let mut s = Vec::new();
    let mut section = |name: &str, title: &str, body: String| {
        if show(name) {
            if !s.is_empty() {
                s.extend_from_slice(b"\r\n");
            }
            let _ = write!(s, "# {title}\r\n{body}");
        }
    };
    section(
        "server",
        "Server",
        format!(
            "redis_version:{REDIS_VERSION}\r\nmemkeep_version:{}\r\nredis_mode:standalone\r\nos:{} {}\r\narch_bits:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\nexecutable:memkeep\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH,
            usize::BITS,
            std::process::id(),
            cfg.resp_port,
            uptime / 86400
        ),
    );
    section(
        "clients",
        "Clients",
        format!(
            // memkeep_blocking_entries: blocking pops known to the registry in any state
            // (queued, or on their way to the writer); 0 when nobody blocks.
            "connected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:{}\r\nmemkeep_blocking_entries:{}\r\n",
            shared.gauges.curr_connections.load(Ordering::Relaxed),
            cfg.max_connections,
            shared.blocking.queued(),
            shared.blocking.len(),
        ),
    );
    section(
        "memory",
        "Memory",
        format!(
            "used_memory:{used}\r\nused_memory_human:{:.2}M\r\nused_memory_rss:{}\r\nmemkeep_rss_anon:{}\r\nmemkeep_rss_file:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:{}\r\n{}",
            used as f64 / 1048576.0,
            mem.anon + mem.file,
            mem.anon,
            mem.file,
            if cfg.max_disk > 0 {
                cfg.max_disk
            } else {
                cfg.map_size
            },
            if cfg.max_disk > 0 {
                "allkeys-lru"
            } else {
                "noeviction"
            },
            if cfg.max_disk > 0 {
                format!(
                    "memkeep_max_disk:{}\r\nmemkeep_disk_used:{}\r\n",
                    cfg.max_disk, cache.data_bytes
                )
            } else {
                String::new()
            }
        ) + &data_file_line(cfg),
    );
    section(
        "persistence",
        "Persistence",
        format!(
            "loading:0\r\nrdb_changes_since_last_save:0\r\nrdb_bgsave_in_progress:0\r\naof_enabled:0\r\nmemkeep_sync:{}\r\n",
            cfg.sync
        ),
    );
    section(
        "stats",
        "Stats",
        format!(
            "total_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:0\r\nrejected_connections:{}\r\nexpired_keys:0\r\nevicted_keys:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\npubsub_channels:{channels}\r\npubsub_patterns:{patterns}\r\npubsubshard_channels:0\r\nclient_output_buffer_limit_disconnections:{}\r\n",
            t.total_connections,
            t.resp_commands + t.cmd_get + t.cmd_set,
            t.rejected_connections,
            cache.evictions,
            t.get_hits,
            t.get_misses,
            t.output_limit_disconnections
        ),
    );
    // Monitoring (redis_exporter and the like) reads the role from here.
    section(
        "replication",
        "Replication",
        "role:master\r\nconnected_slaves:0\r\n".to_string(),
    );
    section(
        "cpu",
        "CPU",
        format!("used_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\n"),
    );
    section(
        "keyspace",
        "Keyspace",
        if keys > 0 {
            format!("db0:keys={keys},expires=0,avg_ttl=0\r\n")
        } else {
            String::new()
        },
    );
    enc::verbatim(out, &s, v3);
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
mod tests {
    use super::*;

    #[test]
    fn glob_matches_like_redis() {
        assert!(glob_match(b"*", b"anything"));
        assert!(glob_match(b"h?llo", b"hello"));
        assert!(glob_match(b"h*llo", b"heeeello"));
        assert!(glob_match(b"h[ae]llo", b"hallo"));
        assert!(!glob_match(b"h[^e]llo", b"hello"));
        assert!(glob_match(b"h[a-b]llo", b"hbllo"));
        assert!(glob_match(b"key:*:x", b"key:1:2:x"));
        assert!(!glob_match(b"key:*:x", b"key:1:2:y"));
        assert!(glob_match(b"a\\*b", b"a*b"));
        assert!(!glob_match(b"a\\*b", b"axb"));
        assert!(glob_match(b"", b""));
        assert!(!glob_match(b"", b"a"));
    }

    #[test]
    fn getrange_indexes_like_redis() {
        let v = b"This is a string";
        assert_eq!(substr(v, 0, 3), b"This");
        assert_eq!(substr(v, -3, -1), b"ing");
        assert_eq!(substr(v, 0, -1), v);
        assert_eq!(substr(v, 10, 100), b"string");
        assert_eq!(substr(v, 5, 3), b"");
        assert_eq!(substr(b"", 0, -1), b"");
    }

    #[test]
    fn writes_other_than_flush_take_a_key_first() {
        // Pops check each of their keys themselves (LMPOP's follow a count).
        let own_keys = |s: &Spec| matches!(s.cmd, Cmd::Pop(_));
        for s in all_specs().filter(|s| s.write && s.cmd != Cmd::FlushDb && !own_keys(s)) {
            assert!(
                s.arity.abs() >= 2 && s.keys.0 == 1,
                "{} must name a key first",
                s.name
            );
        }
    }

    #[test]
    fn command_table_names_are_lowercase_and_unique() {
        let all: Vec<&Spec> = all_specs().collect();
        for (i, s) in all.iter().enumerate() {
            assert_eq!(s.name, s.name.to_ascii_lowercase());
            assert!(
                all[i + 1..].iter().all(|o| o.name != s.name),
                "{} twice",
                s.name
            );
            assert!(lookup(s.name.to_ascii_uppercase().as_bytes()).is_some());
        }
    }
}
