//! memkeep: a persistent cache server that speaks the memcached text protocol (and Redis RESP)
//! over one keyspace kept in LMDB.
//!
//! Data flow: socket bytes land in a connection's read buffer; a pure protocol parser turns
//! them into requests. Reads run on the worker thread inside a short LMDB read transaction and
//! are encoded straight from LMDB's map into the connection's write buffer (a collection read
//! is a typed `types::read` operation whose elements, borrowed from the map, `commands` encodes
//! as they are walked). Writes go to the
//! single writer thread, which applies everything waiting in one transaction, commits (fsyncing
//! per the sync mode) and only then hands the outcomes back to the worker, which encodes the
//! replies strictly in request order.
//!
//! Layout, from the bottom up (each layer imports only those below it; `tests/layering.rs`
//! checks that no import circle spans two top-level modules):
//! - `protocol`: pure parsers and encoders for the memcached text, meta and binary protocols
//!   and RESP (bytes in, requests out; replies into a buffer); `clock`, `config`, `float`
//!   (INCRBYFLOAT's long-double arithmetic) and `int` (Redis's integer parse, which the
//!   storage layer needs too) beside it;
//! - `outcome`: what a write answers (`Outcome`), protocol-neutral;
//! - `storage`: LMDB (`lmdb`), the write-ahead log (`wal`, `durable`), the in-memory overlay
//!   readers see uncommitted batches through (`overlay`), the cache-mode evictor (`cache`), and
//!   the registry of watched keys;
//! - `types`: the Redis collections as protocol-neutral storage: their layout on `storage`'s
//!   transaction, typed writes (`CollOp`, applied by the writer) and typed reads
//!   (`read::CollRead`: typed arguments such as ranges, score and lex bounds, LIMIT and
//!   direction; typed results such as elements, `(member, score)` pairs, scores and ranks,
//!   walked straight from the map into a callback), and an in-memory model (`model`) that runs
//!   the same writes and reads for model-based tests; no reply encoding;
//! - `command`: the protocol-neutral write operations (`WriteOp`, which carries `types`'
//!   collection writes) the workers hand to the writer;
//! - `semantics`: how the string/item writes behave, shared by both protocols;
//! - `engine`: the writer thread that group-commits every write (`writer`) and the registry of
//!   blocked pops it serves (`blocking`);
//! - `commands`: the Redis command layer, which knows no sockets: the command table, argument
//!   parsing into `WriteOp`s and into `types`' typed reads (run against a snapshot or EXEC's
//!   transaction), and the encoding of their results as RESP2/RESP3 replies, as plain
//!   functions;
//! - `scripting`: Lua scripts (EVAL, EVALSHA, SCRIPT): the script cache, and the runner the
//!   writer thread calls (through `command::TxnScript`) to run a script in its transaction,
//!   each `redis.call` parsed and answered by `commands`;
//! - `server`: listeners, worker event loops, connections (plain or TLS: `tls`) and sessions,
//!   MULTI queueing, pub/sub, ACL users (`acl`), the hand-off to the writer, and the commands
//!   that need a session or the server;
//! - `check` and `backup`: the offline `memkeep check` and the backup/restore commands.
//!
//! Nothing below `server` imports it. The only import circles are inside one folder: the
//! modules of `storage` use one another, and so do `engine`'s writer and registry (the
//! registry delivers through the writer's mailboxes; the writer serves the registry's
//! waiters).
//!
//! Goals: every memcached and Redis client works unchanged; no acknowledged write is lost with
//! `sync = always`; throughput at or above memcached and Redis. Eviction happens only in cache
//! mode (`max_disk`); otherwise a full store refuses writes and keeps serving reads. Not yet:
//! UDP, replication.

pub mod backup;
pub mod check;
pub mod clock;
pub mod command;
pub mod commands;
pub mod config;
pub mod engine;
pub mod float;
pub mod int;
pub mod migrate;
pub mod outcome;
pub mod protocol;
pub mod scripting;
pub mod semantics;
pub mod server;
pub mod storage;
#[cfg(test)]
pub(crate) mod test_rng;
pub mod types;
