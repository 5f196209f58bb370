//! Encoding a write's `Outcome` (or a queued read's bytes) as its command's RESP reply.

use log::error;

use super::args::BAD_KEY;
use crate::command::Outcome;
use crate::protocol::resp::enc;

/// How to answer a RESP write once it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespReply {
    /// The outcome maps directly (Done is +OK).
    Plain,
    /// SETNX: set is 1, not set is 0.
    SetNx,
    /// EXEC: an array of its steps' outcomes, each answered as its command's kind
    /// (`Session::exec_kinds`).
    Exec,
    /// A blocking pop, by its registry id: answered when it pops, times out or is unblocked.
    Block(u64),
}

/// Encodes one outcome as its command's reply.
pub fn complete(out: &mut Vec<u8>, v3: bool, kind: RespReply, outcome: Outcome) {
    match (kind, outcome) {
        (_, Outcome::Reply(bytes)) => out.extend_from_slice(&bytes),
        (RespReply::SetNx, Outcome::Done) => enc::int(out, 1),
        (RespReply::SetNx, Outcome::Nil) => enc::int(out, 0),
        (_, Outcome::Done) => enc::ok(out),
        (_, Outcome::Int(n)) => enc::int(out, n),
        (_, Outcome::Bulk(b)) => enc::bulk(out, &b),
        (_, Outcome::Nil) => enc::null(out, v3),
        (_, Outcome::Err(msg)) => enc::error(out, msg),
        (_, Outcome::BadKey) => enc::error(out, BAD_KEY),
        (_, Outcome::Full) => enc::error(
            out,
            "OOM command not allowed when used memory > 'maxmemory'.",
        ),
        (_, Outcome::WrongType) => enc::error(out, super::args::WRONGTYPE),
        (_, Outcome::Damaged) => enc::error(out, crate::storage::RESP_DAMAGED),
        (_, Outcome::Double(d)) => enc::double(out, d, v3),
        (_, Outcome::NilArray) => enc::null_array(out, v3),
        (_, Outcome::Set(items)) => {
            enc::set(out, items.len(), v3);
            for item in items {
                complete(out, v3, RespReply::Plain, item);
            }
        }
        (_, Outcome::Pairs(pairs)) => {
            if v3 {
                enc::array(out, pairs.len());
                for (a, b) in pairs {
                    enc::array(out, 2);
                    complete(out, v3, RespReply::Plain, a);
                    complete(out, v3, RespReply::Plain, b);
                }
            } else {
                enc::array(out, pairs.len() * 2);
                for (a, b) in pairs {
                    complete(out, v3, RespReply::Plain, a);
                    complete(out, v3, RespReply::Plain, b);
                }
            }
        }
        (_, Outcome::Array(items)) => {
            enc::array(out, items.len());
            for item in items {
                complete(out, v3, RespReply::Plain, item);
            }
        }
        (_, Outcome::TooLarge) => enc::error(
            out,
            "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
        ),
        (_, other) => {
            if other != Outcome::Failed {
                error!("unexpected outcome for a RESP write: {other:?}");
            }
            enc::error(out, "ERR storage failure")
        }
    }
}
