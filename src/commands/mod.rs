//! The Redis command layer: everything a RESP command is, short of a socket.
//!
//! - `table`: the command table (name, arity, read or write, key positions) and its lookup;
//! - `args`: a request's arguments and the parsers shared by all commands (keys, integers,
//!   expiry times, SCAN options, globs) with Redis's error texts;
//! - `strings`, `keys`: the string and keyspace commands; `list`, `hash`, `set`, `zset` and
//!   `blocking`: each collection family's commands (its table, the parse of its writes into the
//!   typed operations of `crate::types`, and its reads);
//! - `server`: the server commands that need no connection (COMMAND, LATENCY);
//! - `reply`: encoding an `Outcome` as a RESP reply.
//!
//! Everything here is a plain function of the arguments and a store view: a write is parsed
//! into a `WriteOp` (`write_op`) that the writer thread applies in its transaction, and a read
//! runs against a `View` (a worker's snapshot, or EXEC's write transaction) and encodes its
//! reply into a buffer (`read_view`). Connections, sessions, MULTI queueing, pub/sub, the
//! writer hand-off and the commands that need them live in `crate::server`, which calls this
//! layer; nothing here imports `crate::server`.

/// The item under the command's key (argument 1) for a read, or return the reply to a failed
/// read.
macro_rules! lookup1 {
    ($view:expr, $args:expr, $out:expr) => {
        match $view.live($args.get(1)) {
            Ok(item) => item,
            Err(e) => return $crate::commands::failed($out, e),
        }
    };
}

pub mod args;
pub mod bits;
pub mod blocking;
pub mod hash;
pub mod keys;
pub mod list;
pub mod reply;
pub mod server;
pub mod set;
pub mod strings;
pub mod table;
pub mod zset;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use log::error;

pub use args::{
    Args, BAD_KEY, NOT_INTEGER, OwnedArgs, SYNTAX, ScanOpts, glob_match, int_arg, key_ok, scan_opts,
};
pub use keys::ScanCursors;
pub use reply::{RespReply, complete};
pub use table::{Cmd, Family, KEY1, NOKEY, R, Spec, W, all_specs, lookup, reads_store, spec};

use crate::command::{Outcome, Step, TxnRead, WriteOp};
use crate::protocol::resp::enc;
use crate::storage::lmdb::LmdbStore;
use crate::storage::overlay::Found;
use crate::storage::{ItemRef, StoreError};
use crate::types::{self, CollOp};

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
    pub counters: Option<Hits<'a>>,
    /// RESP's `proto_max_bulk_len`: bounds bit offsets (GETBIT) and LCS's table.
    pub max_bulk: usize,
}

impl<'a> View<'a, '_> {
    /// The live item under a key, or None. An item not in memory reads as None here, but the
    /// snapshot notes it, and the caller throws this reply away (the server's `data_read`).
    pub fn live(&self, key: &[u8]) -> Result<Option<ItemRef<'a>>, StoreError> {
        let (flushed, now) = (self.flushed, self.now);
        Ok(match self.store.lookup(key)? {
            Found::Item(item) => Some(item),
            Found::Missing | Found::Cold => None,
        }
        .filter(|item| !flushed && !item.meta.is_expired(now)))
    }

    /// Counts a read's hit or miss (not when a value it needs is being read in).
    pub fn hit(&self, found: bool) {
        if let Some(c) = self.counters
            && !self.store.found_cold()
            && !self.store.is_pending()
        {
            c.count(found);
        }
    }
}

/// The keyspace hit and miss counters of the worker running a read.
#[derive(Clone, Copy)]
pub struct Hits<'a> {
    pub hits: &'a AtomicU64,
    pub misses: &'a AtomicU64,
}

impl Hits<'_> {
    /// Adds one to the hits or the misses. As the server's other counters, each has one
    /// writing thread (its worker), so a plain load and store suffices.
    pub fn count(&self, found: bool) {
        let c = if found { self.hits } else { self.misses };
        c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }
}

/// What a collection read runs against: the storage view (`types::ReadCx`, which it derefs
/// to) and the server-side scan cursors (HSCAN, SSCAN, ZSCAN: a cursor names the sub-key to
/// resume after).
pub struct Cx<'a, 't> {
    pub data: types::ReadCx<'a, 't>,
    pub cursors: &'a Mutex<ScanCursors>,
}

impl<'a, 't> std::ops::Deref for Cx<'a, 't> {
    type Target = types::ReadCx<'a, 't>;

    fn deref(&self) -> &types::ReadCx<'a, 't> {
        &self.data
    }
}

/// Answers a read whose storage failed.
pub fn storage_error(out: &mut Vec<u8>, e: impl Into<StoreError>) {
    enc::error(out, &e.into().resp_reply())
}

/// LLEN, HLEN, SCARD, ZCARD: the element count of the collection of `kind` under `key`
/// (`CollRead::count`: answered from the snapshot even while the writer changes the elements).
pub fn count(cx: &Cx<'_, '_>, key: &[u8], kind: crate::storage::Kind, out: &mut Vec<u8>) {
    use types::read::CollRead;
    match cx.count(key, kind) {
        Ok(n) => enc::int(out, n as i64),
        Err(e) => read_error(out, e),
    }
}

/// Answers a collection read whose key could not be opened (`CollRead::open`).
pub fn read_error(out: &mut Vec<u8>, e: types::read::ReadError) {
    enc::error(out, &read_error_text(e))
}

/// The error reply (without its `-`) to a key that could not be opened.
pub fn read_error_text(e: types::read::ReadError) -> String {
    match e {
        types::read::ReadError::WrongType => args::WRONGTYPE.to_string(),
        types::read::ReadError::Store(e) => e.resp_reply(),
    }
}

/// Answers a failed read (damage is logged where it was found).
pub fn failed(out: &mut Vec<u8>, e: StoreError) {
    // Damage was logged where it was found; a pending read's reply is thrown away.
    if !e.is_damage() && !matches!(e, StoreError::Pending) {
        error!("read of a stored item failed: {e}");
    }
    enc::error(out, &e.resp_reply())
}

/// A step whose reply is known when EXEC is built.
pub fn fixed(reply: Vec<u8>) -> Step {
    Step::Read(Arc::new(FixedReply(reply)))
}

#[derive(Debug)]
struct FixedReply(Vec<u8>);

impl TxnRead for FixedReply {
    fn run(&self, _: &LmdbStore, _: &heed::RoTxn<'_, heed::WithoutTls>, _: u64) -> Outcome {
        Outcome::Reply(self.0.clone())
    }
}

/// Keyspace hits and misses of the reads the writer runs for connections (`WriteOp::Read`).
/// Only the holder of the writer's lock bumps them, so plain loads and stores suffice.
#[derive(Debug, Default)]
pub struct ReadHits {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

/// A read command queued by MULTI, run by the writer against EXEC's transaction; or a read
/// whose snapshot was too old, run by the writer for its connection (`WriteOp::Read`).
#[derive(Debug)]
pub struct QueuedRead {
    pub cmd: Cmd,
    pub args: OwnedArgs,
    pub v3: bool,
    pub cursors: Arc<Mutex<ScanCursors>>,
    /// RESP's `proto_max_bulk_len` (`View::max_bulk`).
    pub max_bulk: usize,
    /// Where its keyspace hits and misses count (none inside EXEC).
    pub hits: Option<Arc<ReadHits>>,
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
            counters: self.hits.as_ref().map(|h| Hits {
                hits: &h.hits,
                misses: &h.misses,
            }),
            max_bulk: self.max_bulk,
        };
        let mut out = Vec::new();
        read_view(self.cmd, self.args.args(), &mut out, self.v3, &view);
        Outcome::Reply(out)
    }
}

/// Parses a write's arguments into the `WriteOp` the writer applies, and how to answer it;
/// Err is the error reply. `now` (unix ms) turns relative expiry times absolute;
/// `max_bulk` (RESP's `proto_max_bulk_len`) bounds the strings APPEND and SETRANGE make.
pub fn write_op(
    cmd: Cmd,
    args: Args<'_>,
    now: u64,
    max_bulk: usize,
) -> Result<(WriteOp, RespReply), String> {
    if cmd == Cmd::FlushDb {
        return keys::flush(args);
    }
    if cmd == Cmd::BitOp {
        return bits::write_op(cmd, args, max_bulk);
    }
    if let Cmd::Pop(code) = cmd {
        // A pop that never waits: LMPOP, ZMPOP, or a blocking pop inside MULTI.
        let p = blocking::parse(code, args)?;
        return Ok((WriteOp::Coll(CollOp::Pop(p.form)), RespReply::Plain));
    }
    // Every other write names its key first (the command table says so).
    let key = args.get(1);
    key_ok(key)?;
    let plain = |op| Ok((op, RespReply::Plain));
    match cmd {
        Cmd::Coll(family, code) => {
            let op = match family {
                Family::List => CollOp::List(list::write_op(code, args)?),
                Family::Hash => CollOp::Hash(hash::write_op(code, args)?),
                Family::Set => CollOp::Set(set::write_op(code, args)?),
                Family::ZSet => CollOp::ZSet(zset::write_op(code, args)?),
            };
            plain(WriteOp::Coll(op))
        }
        Cmd::Del
        | Cmd::Expire
        | Cmd::PExpire
        | Cmd::ExpireAt
        | Cmd::PExpireAt
        | Cmd::Persist
        | Cmd::Rename
        | Cmd::RenameNx
        | Cmd::Copy => keys::write_op(cmd, args, now),
        Cmd::Restore => keys::restore_op(args, now, max_bulk),
        Cmd::SetBit | Cmd::BitField => bits::write_op(cmd, args, max_bulk),
        _ => strings::write_op(cmd, args, now, max_bulk),
    }
}

/// Runs a read of the store against `view`: callable from a connection's pass or from EXEC.
pub fn read_view(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, v3: bool, view: &View<'_, '_>) {
    let start = out.len();
    read_view_uncounted(cmd, args, out, v3, view);
    // GET, MGET and DUMP count their own lookups; the key-less reads count none.
    if !matches!(
        cmd,
        Cmd::Get
            | Cmd::MGet
            | Cmd::Dump
            | Cmd::DbSize
            | Cmd::Keys
            | Cmd::Scan
            | Cmd::RandomKey
            | Cmd::Info
    ) {
        count_lookups(args, &out[start..], view);
    }
}

/// Counts a keyspace hit or miss for each key a read named, as Redis 7.0's `lookupKeyRead`
/// does for every read command (a key of the wrong type is a hit). A command refused before
/// it looked at its keys (a syntax error, a bad number) counts nothing.
fn count_lookups(args: Args<'_>, reply: &[u8], view: &View<'_, '_>) {
    if view.counters.is_none()
        || (reply.first() == Some(&b'-')
            && !reply.starts_with(b"-WRONGTYPE")
            && !reply.starts_with(b"-ERR An LFU"))
    {
        return;
    }
    let Some(spec) = table::lookup(args.get(0)) else {
        return;
    };
    let all: Vec<&[u8]> = (0..args.len()).map(|i| args.get(i)).collect();
    let (first, last, step) = spec.keys;
    let mut keys: Vec<&[u8]> = Vec::new();
    if first > 0 && step > 0 {
        let n = all.len() as i32;
        let last = if last < 0 { n + last } else { last.min(n - 1) };
        let mut i = first;
        while i <= last && i < n {
            keys.push(all[i as usize]);
            i += step;
        }
    }
    keys.extend_from_slice(table::counted_keys(spec, &all));
    for key in keys {
        if let Ok(item) = view.live(key) {
            view.hit(item.is_some());
        }
    }
}

fn read_view_uncounted(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, v3: bool, view: &View<'_, '_>) {
    match cmd {
        Cmd::MGet => {
            strings::mget_view(args, out, v3, usize::MAX, 1, view);
        }
        Cmd::Coll(family, code) => {
            let View {
                store,
                txn,
                now,
                flushed,
                cursors,
                ..
            } = *view;
            let cx = Cx {
                data: types::ReadCx {
                    store,
                    txn,
                    now,
                    flushed,
                },
                cursors,
            };
            match family {
                Family::List => list::read(code, args, &cx, out, v3),
                Family::Hash => hash::read(code, args, &cx, out, v3),
                Family::Set => set::read(code, args, &cx, out, v3),
                Family::ZSet => zset::read(code, args, &cx, out, v3),
            }
        }
        Cmd::Get | Cmd::StrLen | Cmd::GetRange => strings::read(cmd, args, out, v3, view),
        Cmd::GetBit | Cmd::BitCount | Cmd::BitPos | Cmd::BitFieldRo | Cmd::Lcs => {
            bits::read(cmd, args, out, v3, view)
        }
        Cmd::Exists
        | Cmd::Ttl
        | Cmd::PTtl
        | Cmd::ExpireTime
        | Cmd::PExpireTime
        | Cmd::Object
        | Cmd::Memory
        | Cmd::Type
        | Cmd::DbSize
        | Cmd::Keys
        | Cmd::Scan
        | Cmd::RandomKey
        | Cmd::Dump => keys::read(cmd, args, out, v3, view),
        // Only a script's INFO gets here: the keyspace figures its keyspace section needs, as
        // its transaction sees them (`[keys, keys with a TTL]`).
        Cmd::Info => {
            enc::array(out, 2);
            enc::int(out, view.store.len().map_or(0, |n| n as i64));
            enc::int(
                out,
                view.store.expires().ok().flatten().map_or(0, |n| n as i64),
            );
        }
        _ => enc::error(out, "ERR command not available here"),
    }
}
