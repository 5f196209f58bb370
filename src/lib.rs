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
//! Goals: every memcached and Redis client works unchanged; no acknowledged write is lost with
//! `sync = always`; throughput at or above memcached and Redis. Non-goals for now: LRU eviction
//! (a full store refuses writes and keeps serving reads), UDP, scripting.

pub mod backup;
pub mod check;
pub mod clock;
pub mod command;
pub mod commands;
pub mod config;
pub mod protocol;
pub mod semantics;
pub mod server;
pub mod storage;
pub mod types;
