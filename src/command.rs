//! Protocol-neutral write operations and their outcomes. Workers turn parsed requests into
//! `WriteOp`s for the writer thread; the writer answers each with an `Outcome`, which the
//! worker encodes in the connection's protocol. Outcomes are values, not errors: only a failure
//! of the store itself is an `Outcome::Failed`.

pub use crate::protocol::memcache::StoreMode;

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
        KeyValue { buf, key_len: key.len() }
    }

    pub fn key(&self) -> &[u8] {
        &self.buf[..self.key_len]
    }

    pub fn value(&self) -> &[u8] {
        &self.buf[self.key_len..]
    }
}

/// A change to the store, applied by the writer inside a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// set/add/replace/append/prepend/cas. `exptime` follows memcached's rule (see
    /// `semantics::expire_at`); `cas` is only read in `Cas` mode.
    Store { mode: StoreMode, kv: KeyValue, flags: u32, exptime: i64, cas: u64 },
    Delete { key: Vec<u8> },
    Arith { key: Vec<u8>, incr: bool, delta: u64 },
    Touch { key: Vec<u8>, exptime: i64 },
    /// Get-and-touch: `keys` is the space-separated key list of the request.
    Gat { keys: Vec<u8>, exptime: i64 },
    /// `delay` follows the exptime rule: 0 (or negative) now, else relative or absolute.
    FlushAll { delay: i64 },
}

/// One item returned by a write that also reads (gat).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueOut {
    pub key: Vec<u8>,
    pub flags: u32,
    pub cas: u64,
    pub value: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Stored,
    NotStored,
    /// cas: the item changed since it was fetched.
    Exists,
    NotFound,
    Deleted,
    Touched,
    Done,
    /// The new value after incr/decr.
    Number(u64),
    /// incr/decr on a value that is not a decimal u64.
    NonNumeric,
    /// gat/gats: the live items found, in request order.
    Values(Vec<ValueOut>),
    /// A value (e.g. after append) would exceed the item size limit.
    TooLarge,
    /// The store is full: the write was not applied.
    Full,
    /// The store failed; the write was not applied.
    Failed,
}
