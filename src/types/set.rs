//! Setes: not implemented yet (the command table is empty).

use super::{ReadCx, Tx};
use crate::command::Outcome;
use crate::protocol::resp::enc;
use crate::server::resp::{Args, SYNTAX, Spec};
use crate::storage::StoreError;
use crate::storage::lmdb::LmdbWrite;

pub static COMMANDS: &[Spec] = &[];

#[derive(Debug, Clone, PartialEq)]
pub enum SetOp {}

/// Parses a write's arguments (arity is already checked).
pub fn write_op(_code: u8, _args: Args<'_>) -> Result<SetOp, String> {
    Err(SYNTAX.into())
}

/// Runs a write in the writer's transaction.
pub fn apply(w: &mut LmdbWrite<'_, '_>, op: &SetOp, now: u64) -> Result<Outcome, StoreError> {
    let _tx = Tx { w, now };
    match *op {}
}

/// Answers a read from the worker's transaction, writing RESP into `out`.
pub fn read(_code: u8, _args: Args<'_>, _cx: &ReadCx<'_, '_>, out: &mut Vec<u8>, _v3: bool) {
    enc::error(out, SYNTAX)
}
