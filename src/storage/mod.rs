//! Storage: the item codec, the views the semantics run on, the LMDB store, an in-memory model
//! store for tests, and the group-commit writer.
//!
//! Invariants: an item's bytes start with a format-version byte; CAS uniques come from one
//! counter that only grows (persisted with every batch); expiry is absolute unix milliseconds,
//! 0 meaning never.

pub mod durable;
pub mod item;
pub mod lmdb;
pub mod model;
pub mod wal;
pub mod writer;

use std::fmt;

pub use item::{ItemMeta, ItemRef, Kind};

/// Longest key LMDB stores (its default build's limit). memcached keys stop at 250 bytes anyway;
/// longer RESP keys get a clear error.
pub const MAX_KEY: usize = 511;

/// A failure of the store itself (never a protocol-level "not found" or "exists").
#[derive(Debug)]
pub enum StoreError {
    /// The LMDB map is full: the write is refused, reads and deletes keep working.
    Full,
    /// The key cannot be stored: empty, or longer than LMDB's key limit (`MAX_KEY`).
    BadKey,
    /// A stored record could not be decoded.
    Corrupt(String),
    /// Any other LMDB or I/O failure.
    Backend(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Full => f.write_str("store is full"),
            StoreError::BadKey => write!(f, "keys must be 1 to {MAX_KEY} bytes"),
            StoreError::Corrupt(m) => write!(f, "corrupt record: {m}"),
            StoreError::Backend(m) => write!(f, "storage error: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<heed::Error> for StoreError {
    fn from(e: heed::Error) -> Self {
        match e {
            heed::Error::Mdb(heed::MdbError::MapFull) => StoreError::Full,
            heed::Error::Mdb(heed::MdbError::BadValSize) => StoreError::BadKey,
            other => StoreError::Backend(other.to_string()),
        }
    }
}

/// Read access to items, as the semantics see it.
pub trait ReadView {
    /// The stored item under `key`, expired or not.
    fn get(&self, key: &[u8]) -> Result<Option<ItemRef<'_>>, StoreError>;
}

/// Write access inside one transaction.
pub trait WriteView: ReadView {
    /// Stores `parts` concatenated as the value of `key`, replacing any old item.
    fn put(&mut self, key: &[u8], meta: &ItemMeta, parts: &[&[u8]]) -> Result<(), StoreError>;
    /// Removes `key` (and, for a collection, its elements); true if it was there.
    fn delete(&mut self, key: &[u8]) -> Result<bool, StoreError>;
    /// Removes `key`'s record but keeps a collection's elements, whose metadata the caller is
    /// moving under another key (RENAME).
    fn take(&mut self, key: &[u8]) -> Result<bool, StoreError>;
    /// Removes every item.
    fn clear(&mut self) -> Result<(), StoreError>;
    /// Arranges for every item to be removed at `at_ms` (a delayed `flush_all`).
    fn schedule_flush(&mut self, at_ms: u64) -> Result<(), StoreError>;
    /// A fresh CAS unique, larger than every one handed out before, across restarts.
    fn next_cas(&mut self) -> u64;
}
