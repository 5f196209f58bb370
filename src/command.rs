//! Protocol-neutral write operations. Workers turn parsed requests into `WriteOp`s for the
//! writer thread; the writer answers each with an `Outcome` (`crate::outcome`, re-exported
//! here), which the worker encodes in the connection's protocol. Outcomes are values, not
//! errors: only a failure of the store itself is an `Outcome::Failed` (`Outcome::Damaged` when
//! the store is damaged).

pub use crate::outcome::{MetaCode, MetaItem, MetaOut, Outcome, ValueOut};
pub use crate::protocol::memcache::StoreMode;

/// Largest reply a request that repeats stored data may build (a `gat` naming one key many
/// times, HMGET repeating a field, HRANDFIELD/SRANDMEMBER with a negative count): past this it
/// answers an error instead, so a few bytes of request cannot make the server buffer gigabytes.
pub const REPLY_MAX: usize = 64 * 1024 * 1024;

/// A key and its value in one allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    buf: Vec<u8>,
    key_len: usize,
}

impl KeyValue {
    pub fn new(key: &[u8], value: &[u8]) -> KeyValue {
        let mut buf = Vec::with_capacity(key.len() + value.len());
        buf.extend_from_slice(key);
        buf.extend_from_slice(value);
        KeyValue {
            buf,
            key_len: key.len(),
        }
    }

    pub fn key(&self) -> &[u8] {
        &self.buf[..self.key_len]
    }

    pub fn value(&self) -> &[u8] {
        &self.buf[self.key_len..]
    }
}

/// When a RESP `SET`-like write applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetCond {
    Always,
    /// Only if the key does not exist (NX).
    Nx,
    /// Only if it exists (XX).
    Xx,
}

/// What a RESP write does to the key's expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Keep the current expiry (KEEPTTL; the default for GETEX).
    Keep,
    /// No expiry (a plain SET; PERSIST).
    Clear,
    /// Expire at this unix time in ms.
    At(u64),
}

/// The EXPIRE family's conditions (Redis 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpireCond {
    Always,
    /// Only if the key has no expiry.
    Nx,
    /// Only if it has one.
    Xx,
    /// Only if the new expiry is later (no expiry counts as infinitely late).
    Gt,
    /// Only if the new expiry is earlier.
    Lt,
    /// XX and LT: only if the key has an expiry and the new one is earlier.
    XxLt,
}

/// A change to the store, applied by the writer inside a transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOp {
    /// set/add/replace/append/prepend/cas. `exptime` follows memcached's rule (see
    /// `semantics::expire_at`); `cas` is only read in `Cas` mode.
    Store {
        mode: StoreMode,
        kv: KeyValue,
        flags: u32,
        exptime: i64,
        cas: u64,
    },
    Delete {
        key: Vec<u8>,
    },
    Arith {
        key: Vec<u8>,
        incr: bool,
        delta: u64,
    },
    Touch {
        key: Vec<u8>,
        exptime: i64,
    },
    /// Get-and-touch: `keys` is the space-separated key list of the request.
    Gat {
        keys: Vec<u8>,
        exptime: i64,
    },
    /// `delay` follows the exptime rule: 0 (or negative) now, else relative or absolute.
    FlushAll {
        delay: i64,
    },
    /// RESP SET/SETNX/SETEX/PSETEX/GETSET: answers `Done` (set), `Nil` (condition failed), or
    /// with `get` the old value as `Bulk`/`Nil`.
    Set {
        kv: KeyValue,
        cond: SetCond,
        expiry: Expiry,
        get: bool,
    },
    /// INCR/DECR/INCRBY/DECRBY: `Int` or `Err`.
    IncrBy {
        key: Vec<u8>,
        delta: i64,
    },
    /// INCRBYFLOAT: the new value as `Bulk`, or `Err`.
    IncrByFloat {
        key: Vec<u8>,
        /// The increment as the client wrote it (checked to be a float): the sum is computed
        /// in long double from the texts (`float`).
        delta: Vec<u8>,
    },
    /// APPEND (creating the key): the new length as `Int`.
    Append {
        kv: KeyValue,
        /// The longest the string may become (RESP's `proto_max_bulk_len`).
        max: usize,
    },
    /// SETRANGE: the new length as `Int`.
    SetRange {
        kv: KeyValue,
        offset: usize,
        /// The longest the string may become (RESP's `proto_max_bulk_len`).
        max: usize,
    },
    /// SETBIT (creating and zero-padding the string as needed): the old bit as `Int`.
    SetBit {
        key: Vec<u8>,
        /// The bit's offset, counted from the first byte's most significant bit.
        offset: u64,
        on: bool,
        /// The longest the string may become (RESP's `proto_max_bulk_len`).
        max: usize,
    },
    /// BITOP: `dest` becomes the sources combined (a fresh string, as SET makes), or is
    /// deleted when they are all empty; its new length as `Int`.
    BitOp {
        op: BitOpKind,
        dest: Vec<u8>,
        srcs: Vec<Vec<u8>>,
    },
    /// BITFIELD: its operations in order, each answering `Int` (or `Nil` for an overflow
    /// under FAIL), as `Array`.
    BitField {
        key: Vec<u8>,
        ops: Vec<FieldOp>,
        /// The longest the string may become (RESP's `proto_max_bulk_len`).
        max: usize,
    },
    /// GETDEL: the old value as `Bulk`, or `Nil`.
    GetDel {
        key: Vec<u8>,
    },
    /// GETEX: the value as `Bulk` (after changing the expiry), or `Nil`.
    GetEx {
        key: Vec<u8>,
        expiry: Expiry,
    },
    /// MSET (`Done`) and MSETNX (`Int` 1 if all were set, 0 if none was).
    MSet {
        kvs: Vec<KeyValue>,
        nx: bool,
    },
    /// DEL/UNLINK: how many existed, as `Int`.
    Del {
        keys: Vec<Vec<u8>>,
    },
    /// EXPIRE family with an absolute time: `Int` 1 if applied, 0 if not. A time already past
    /// deletes the key.
    Expire {
        key: Vec<u8>,
        at_ms: u64,
        cond: ExpireCond,
    },
    /// PERSIST: `Int` 1 if an expiry was removed.
    Persist {
        key: Vec<u8>,
    },
    /// RENAME (`Done`) and RENAMENX (`Int`); `Err` when the source does not exist.
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
        nx: bool,
    },
    /// A list, hash, set or sorted-set command (see `types`).
    Coll(crate::types::CollOp),
    /// A meta-protocol (`mg` with T/N/R, or a stale item) or binary-protocol write; answers
    /// `Outcome::Meta`.
    Meta(Box<MetaOp>),
    /// A RESP transaction's EXEC: its commands in order, in the batch's one transaction, with
    /// nothing between them. Answers `Outcome::Array` (one outcome per step), or `NilArray`
    /// when a watched key changed.
    Exec(Box<ExecOp>),
    /// A read whose snapshot was too old for it (a collection it reads changed after the
    /// snapshot: `overlay::Snap::note_pending`): run against the writer's transaction, which
    /// holds every acknowledged write, changing nothing. Answers `Outcome::Reply`.
    Read(ReadStep),
    /// A blocking pop registered in `engine::blocking` under this id: the writer pops at once
    /// if it can, else queues the waiter (answering `Outcome::Blocked`, which is never sent;
    /// the waiter's reply comes later, through the registry).
    Block {
        id: u64,
    },
    /// EVAL/EVALSHA: a Lua script run by the writer in the batch's transaction, each of its
    /// `redis.call`s applied at once (`TxnScript`). Answers `Outcome::Reply`.
    Script(Box<ScriptOp>),
    /// A replica applies one or more of its primary's log batches (physical records, in
    /// order) and records the stream position they bring it to, in the same log batch and
    /// LMDB transaction (`engine::repl`). Answers `Done`.
    Replicate(Box<Replicated>),
    /// A replica replaces its whole store with a primary's full copy, in one LMDB transaction,
    /// then checkpoints it (writer thread; `engine::writer::replica`). Answers `Done`.
    ReplInstall(Box<ReplInstall>),
}

/// What `WriteOp::Replicate` carries: the payloads of the primary's batches (log records, as
/// `storage::wal::ops` reads them), and where they leave the replica in the primary's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replicated {
    pub payloads: Vec<Vec<u8>>,
    pub replid: String,
    /// The stream offset just past the last of `payloads`.
    pub offset: u64,
}

/// What `WriteOp::ReplInstall` carries: where the primary's full copy arrives as the replica
/// receives it (chunks of log records, `storage::wal::ops`, holding every record of every
/// database of the primary's snapshot, in each database's key order), and the snapshot's
/// position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplInstall {
    pub source: CopySource,
    pub replid: String,
    pub offset: u64,
}

/// One step of a full copy, from the replica's receiver to its writer.
#[derive(Debug)]
pub enum CopyChunk {
    Records(Vec<u8>),
    /// The whole copy has arrived. A source that ends without it was cut short.
    End,
}

/// The receiving end of a full copy's chunks: a bounded channel, taken once by the writer.
#[derive(Debug, Clone)]
pub struct CopySource(
    std::sync::Arc<std::sync::Mutex<Option<std::sync::mpsc::Receiver<CopyChunk>>>>,
);

impl CopySource {
    pub fn new(rx: std::sync::mpsc::Receiver<CopyChunk>) -> CopySource {
        CopySource(std::sync::Arc::new(std::sync::Mutex::new(Some(rx))))
    }

    /// The channel, the first time only.
    pub fn take(&self) -> Option<std::sync::mpsc::Receiver<CopyChunk>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl PartialEq for CopySource {
    fn eq(&self, other: &CopySource) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CopySource {}

/// BITOP's operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitOpKind {
    And,
    Or,
    Xor,
    Not,
}

/// What BITFIELD does when a SET or INCRBY does not fit its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Keep the low bits (two's complement for signed fields).
    Wrap,
    /// Clamp to the field's least or greatest value.
    Sat,
    /// Change nothing and answer nil.
    Fail,
}

/// A field of BITFIELD: `bits` wide (1 to 64 signed, 1 to 63 unsigned) at bit `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: u64,
    pub bits: u32,
    pub signed: bool,
}

/// One BITFIELD operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOp {
    Get(Field),
    /// Writes the value, answering the old one.
    Set(Field, i64, Overflow),
    /// Adds to the field, answering the new value.
    IncrBy(Field, i64, Overflow),
}

impl FieldOp {
    pub fn field(&self) -> Field {
        match *self {
            FieldOp::Get(f) | FieldOp::Set(f, ..) | FieldOp::IncrBy(f, ..) => f,
        }
    }
}

/// A script to run in the writer's transaction, with what it needs (see `crate::scripting`).
#[derive(Debug, Clone)]
pub struct ScriptOp {
    pub run: std::sync::Arc<dyn TxnScript>,
}

impl PartialEq for ScriptOp {
    fn eq(&self, other: &ScriptOp) -> bool {
        std::sync::Arc::ptr_eq(&self.run, &other.run)
    }
}

/// A script the writer runs: it calls back into `ScriptTxn` for each command. Err is a failure
/// of the store, which fails the whole batch (the script's writes with it), or, for a script a
/// leader runs (any thread but the writer thread), `MOVED`: the script ran long or was about to
/// act outside the transaction (PUBLISH), so its batch goes back, undone, to the writer thread.
pub trait TxnScript: Send + Sync + std::fmt::Debug {
    fn run(&self, txn: &mut dyn ScriptTxn) -> Result<Outcome, crate::storage::StoreError>;
    /// Whether a leader may run it (not once it has moved: it would again).
    fn leads(&self) -> bool {
        true
    }
}

/// The text of the `StoreError::Backend` a script that left its leader for the writer thread
/// fails its leader's batch with (the leader requeues it: see `TxnScript`).
pub const MOVED: &str = "the script moves to the writer thread";

thread_local! {
    static WRITER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as the writer thread (called once, by it).
pub fn mark_writer_thread() {
    WRITER_THREAD.with(|w| w.set(true));
}

/// Whether the calling thread is the writer thread (else a leader: a worker committing its own
/// writes, which may give a batch back to the writer thread).
pub fn on_writer_thread() -> bool {
    WRITER_THREAD.with(std::cell::Cell::get)
}

/// The open write transaction as a script sees it: apply a write, or run a read that sees
/// the writes before it.
pub trait ScriptTxn {
    fn write(&mut self, op: &WriteOp) -> Result<Outcome, crate::storage::StoreError>;
    fn read(&mut self, read: &dyn TxnRead) -> Outcome;
    /// The batch's clock (unix ms).
    fn now_ms(&self) -> u64;
    /// Whether a write so far changed anything (then the script cannot be killed).
    fn wrote(&mut self) -> bool;
}

/// EXEC's commands and the keys its connection watches.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOp {
    pub watched: Vec<crate::storage::watch::WatchedKey>,
    pub steps: Vec<Step>,
}

/// A read for the writer to run (`WriteOp::Read`); equal only to itself.
#[derive(Debug, Clone)]
pub struct ReadStep(pub std::sync::Arc<dyn TxnRead>);

impl PartialEq for ReadStep {
    fn eq(&self, other: &ReadStep) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// One command of a transaction.
#[derive(Debug, Clone)]
pub enum Step {
    Write(WriteOp),
    /// A read, run against the write transaction so it sees the steps before it.
    Read(std::sync::Arc<dyn TxnRead>),
}

impl PartialEq for Step {
    fn eq(&self, other: &Step) -> bool {
        match (self, other) {
            (Step::Write(a), Step::Write(b)) => a == b,
            (Step::Read(a), Step::Read(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// A read command that runs without a connection: against any read view of the store (the
/// writer's transaction inside EXEC), answering the bytes of its reply as `Outcome::Reply`.
pub trait TxnRead: Send + Sync + std::fmt::Debug {
    fn run(
        &self,
        store: &crate::storage::lmdb::LmdbStore,
        txn: &heed::RoTxn<'_, heed::WithoutTls>,
        now_ms: u64,
    ) -> Outcome;
}

impl WriteOp {
    /// Calls `f` with every key the write may change. `FlushAll`, `Exec`, `Script` and `Block`
    /// name none: the writer treats a flush as changing everything, an EXEC's steps speak for
    /// themselves, and a blocking pop's keys are in its registry entry.
    pub fn for_each_key(&self, f: &mut dyn FnMut(&[u8])) {
        match self {
            WriteOp::Store { kv, .. }
            | WriteOp::Set { kv, .. }
            | WriteOp::Append { kv, .. }
            | WriteOp::SetRange { kv, .. } => f(kv.key()),
            WriteOp::Delete { key }
            | WriteOp::Arith { key, .. }
            | WriteOp::Touch { key, .. }
            | WriteOp::IncrBy { key, .. }
            | WriteOp::IncrByFloat { key, .. }
            | WriteOp::GetDel { key }
            | WriteOp::GetEx { key, .. }
            | WriteOp::SetBit { key, .. }
            | WriteOp::BitField { key, .. }
            | WriteOp::BitOp { dest: key, .. }
            | WriteOp::Expire { key, .. }
            | WriteOp::Persist { key } => f(key),
            WriteOp::Gat { keys, .. } => keys
                .split(|&b| b == b' ')
                .filter(|k| !k.is_empty())
                .for_each(f),
            WriteOp::MSet { kvs, .. } => kvs.iter().for_each(|kv| f(kv.key())),
            WriteOp::Del { keys } => keys.iter().for_each(|k| f(k)),
            WriteOp::Rename { from, to, .. } => {
                f(from);
                f(to);
            }
            WriteOp::Coll(c) => c.for_each_key(f),
            WriteOp::Meta(m) => f(match &**m {
                MetaOp::Store(s) => s.kv.key(),
                MetaOp::Delete { key, .. }
                | MetaOp::Arith { key, .. }
                | MetaOp::Get { key, .. } => key,
            }),
            // A primary's batches: the keys whose item records they write.
            WriteOp::Replicate(r) => {
                use crate::storage::wal::{Op, ops};
                for p in &r.payloads {
                    for op in ops(p).flatten() {
                        match op {
                            Op::Put { db, key, .. }
                            | Op::Del { db, key }
                            | Op::Patch { db, key, .. }
                                if db == crate::storage::lmdb::DB_ITEMS =>
                            {
                                f(key)
                            }
                            _ => {}
                        }
                    }
                }
            }
            WriteOp::FlushAll { .. }
            | WriteOp::Read(_)
            | WriteOp::Exec(_)
            | WriteOp::Block { .. }
            | WriteOp::Script(_)
            | WriteOp::ReplInstall(_) => {}
        }
    }
}

/// The writes of memcached's meta commands (`ms`, `md`, `ma`, and `mg` when it changes the
/// item), which the binary protocol's commands are special cases of. Every `exptime` follows
/// memcached's exptime rule; `new_cas` is the `E` flag (the CAS to give a changed item).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaOp {
    /// `ms` (and the binary stores).
    Store(MetaStore),
    /// `md`: delete, or with `invalidate` mark stale (new CAS, optional new TTL), or with
    /// `keep` empty the value and keep the item.
    Delete {
        key: Vec<u8>,
        compare: Option<u64>,
        invalidate: bool,
        exptime: Option<i64>,
        keep: bool,
        new_cas: Option<u64>,
    },
    /// `ma`: add or subtract `delta`; a miss with `vivify` creates the item holding `initial`
    /// with that TTL (the request's last `T` or `N`, as memcached applies them in order);
    /// `exptime` (`T`) sets the TTL of an item that was there.
    Arith {
        key: Vec<u8>,
        incr: bool,
        delta: u64,
        compare: Option<u64>,
        vivify: Option<i64>,
        initial: u64,
        exptime: Option<i64>,
        new_cas: Option<u64>,
    },
    /// `mg` that may change the item: `touch` (`T`) sets its TTL, `vivify` (`N`) creates an
    /// empty item on a miss with that TTL (the request's last `T` or `N`: memcached applies
    /// them in order), `recache` (`R`) hands out the win token when less TTL than this
    /// remains; a stale item hands out the win token on its first fetch.
    Get {
        key: Vec<u8>,
        touch: Option<i64>,
        vivify: Option<i64>,
        recache: Option<i64>,
        new_cas: Option<u64>,
    },
}

/// `ms`: store in `mode` (never `Cas`: a `compare` turns `Set` into a compare-and-set).
/// `invalidate` (`I`) stores even when `compare` is older than the item's CAS, marking the new
/// item stale; `vivify` (`N`) lets append/prepend create a missing item with that TTL.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaStore {
    pub mode: StoreMode,
    pub kv: KeyValue,
    pub flags: u32,
    pub exptime: i64,
    pub compare: Option<u64>,
    pub invalidate: bool,
    pub vivify: Option<i64>,
    pub new_cas: Option<u64>,
}
