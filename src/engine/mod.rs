//! The engine: the group-commit writer thread (`writer`), which applies every write (the
//! string and item rules of `semantics`, the collections of `types`, EXEC's transactions) to
//! `storage`'s LMDB transaction and log, and the registry of blocked pops it serves
//! (`blocking`). It sits above all of those and below `commands` and `server`; `writer` and
//! `blocking` use each other (the registry delivers through the writer's mailboxes, the writer
//! serves the registry's waiters), the one import circle of this folder.

pub mod blocking;
pub mod repl;
pub mod writer;
