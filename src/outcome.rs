//! What a write answers: protocol-neutral `Outcome`s (and the meta protocol's item reports)
//! that the writer returns and each protocol encodes. They sit below `command` (the requests)
//! and the collection types, which return them, so that neither needs the other's module.

/// How a meta write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaCode {
    /// Done (`HD`, or `VA` when a value is asked for).
    Ok,
    /// `mg` miss (`EN`).
    Miss,
    NotStored,
    Exists,
    NotFound,
}

/// A meta write's answer: its code and, when the command reports on the item, the item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaOut {
    pub code: MetaCode,
    pub item: Option<MetaItem>,
}

/// What a meta reply can say about an item: its fields as the command left them, except
/// `expire_at`, which is the expiry *before* the command's own TTL changes (0 for an item the
/// command created): memcached applies `T` and `N` in request order, and a `t` reports the TTL
/// as of its place among them, so the reply replays them (`server::meta`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaItem {
    /// The command created the item (`N` on a miss): its `N` sets the TTL `t` reports after it.
    pub created: bool,
    pub flags: u32,
    pub cas: u64,
    pub expire_at: u64,
    pub value: Vec<u8>,
    pub stale: bool,
    /// This request won the recache token (`W`).
    pub won: bool,
    /// The token had been handed out before this request (`Z`).
    pub win_was_sent: bool,
}

/// One item returned by a write that also reads (gat).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueOut {
    pub key: Vec<u8>,
    pub flags: u32,
    pub cas: u64,
    pub value: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq)]
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
    /// The store is damaged (`StoreError::Damaged`); the write was not applied.
    Damaged,
    /// RESP integer reply.
    Int(i64),
    /// RESP bulk string reply.
    Bulk(Vec<u8>),
    /// RESP null reply.
    Nil,
    /// A command error the client sees, e.g. "ERR value is not an integer or out of range".
    Err(&'static str),
    /// The key (or a key) is not one memkeep can store (empty, or longer than LMDB allows).
    BadKey,
    /// The key holds another kind of value (a list where a string is needed, ...).
    WrongType,
    /// RESP double (a bulk string in RESP2).
    Double(f64),
    /// RESP array of outcomes (e.g. LPOP with a count).
    Array(Vec<Outcome>),
    /// RESP null array (RESP2 `*-1`).
    NilArray,
    /// A RESP3 set (RESP2: an array), e.g. SPOP with a count.
    Set(Vec<Outcome>),
    /// Pairs (e.g. ZPOPMIN with a count): a flat array in RESP2, an array of 2-element arrays
    /// in RESP3.
    Pairs(Vec<(Outcome, Outcome)>),
    /// A meta or binary write's answer.
    Meta(Box<MetaOut>),
    /// A reply already encoded (a read run inside EXEC, see `TxnRead`).
    Reply(Vec<u8>),
    /// A blocking pop found nothing and now waits: no reply yet (the writer delivers nothing
    /// for it; `engine::blocking` does, later).
    Blocked,
}
