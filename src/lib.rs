//! memkeep: a persistent cache server that speaks the memcached text protocol (and Redis RESP)
//! over one keyspace kept in LMDB.
//!
//! Data flow: socket bytes land in a connection's read buffer; a pure protocol parser turns
//! them into requests. Reads run on the worker thread inside a short LMDB read transaction and
//! are encoded straight from LMDB's map into the connection's write buffer. Writes go to the
//! single writer thread, which applies everything waiting in one transaction, commits (fsyncing
//! per the sync mode) and only then hands the outcomes back to the worker, which encodes the
//! replies strictly in request order.
//!
//! Layout, from the bottom up:
//! - `protocol`: pure parsers and encoders for the memcached text, meta and binary protocols
//!   and RESP (bytes in, requests out; replies into a buffer);
//! - `storage`: LMDB (`lmdb`), the write-ahead log (`wal`, `durable`), the in-memory overlay
//!   readers see uncommitted batches through (`overlay`), the writer thread that group-commits
//!   (`writer`), and the registries of watched keys and blocked pops;
//! - `command`: the protocol-neutral write operations (`WriteOp`) and outcomes (`Outcome`)
//!   the workers hand to the writer; `semantics`: how the string/item writes behave, shared by
//!   both protocols; `types`: the Redis collections on LMDB (layout, typed writes, walks);
//! - `commands`: the Redis command layer, which knows no sockets: the command table, argument
//!   parsing into `WriteOp`s, reads against a snapshot or EXEC's transaction, and reply
//!   encoding, as plain functions;
//! - `scripting`: Lua scripts (EVAL, EVALSHA, SCRIPT): the script cache, and the runner the
//!   writer thread calls (through `command::TxnScript`) to run a script in its transaction,
//!   each `redis.call` parsed and answered by `commands`;
//! - `server`: listeners, worker event loops, connections (plain or TLS: `tls`) and sessions,
//!   MULTI queueing, pub/sub, ACL users (`acl`), the hand-off to the writer, and the commands
//!   that need a session or the server.
//!
//! Nothing below `server` imports it. `command`, `semantics`, `storage` and `types` still
//! import one another (the writer in `storage` applies `semantics`' and `types`' writes, which
//! run on `storage`'s transaction and answer `command`'s outcomes): they are one engine,
//! layered by file rather than by folder.
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
pub mod protocol;
pub mod scripting;
pub mod semantics;
pub mod server;
pub mod storage;
pub mod types;
