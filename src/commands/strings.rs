//! String commands: GET, SET and its variants, MGET, MSET, the INCR family, APPEND, STRLEN,
//! GETRANGE and SETRANGE. Writes parse into `WriteOp`s (run by `crate::semantics` in the
//! writer); reads answer from a `View`.

use log::error;

use super::args::{Args, NOT_INTEGER, SYNTAX, expire_arg, int_arg, key_ok};
use super::{Cmd, RespReply, View};
use crate::command::{Expiry, KeyValue, SetCond, WriteOp};
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::Kind;
use crate::storage::overlay::Found;

/// Parses a string write (its key, argument 1, already checked).
pub(super) fn write_op(
    cmd: Cmd,
    args: Args<'_>,
    now: u64,
    max_bulk: usize,
) -> Result<(WriteOp, RespReply), String> {
    let key = args.get(1);
    let plain = |op| Ok((op, RespReply::Plain));
    match cmd {
        Cmd::Set => {
            let (mut cond, mut expiry, mut get) = (SetCond::Always, Expiry::Clear, false);
            let mut expiry_given = false;
            let mut i = 3;
            while i < args.len() {
                let has_next = i + 1 < args.len();
                let mut set_expiry = |e: Expiry| {
                    if expiry_given {
                        return Err(SYNTAX.to_string());
                    }
                    expiry_given = true;
                    expiry = e;
                    Ok(())
                };
                if args.is(i, "NX") && cond != SetCond::Xx {
                    cond = SetCond::Nx;
                } else if args.is(i, "XX") && cond != SetCond::Nx {
                    cond = SetCond::Xx;
                } else if args.is(i, "GET") {
                    get = true;
                } else if args.is(i, "KEEPTTL") {
                    set_expiry(Expiry::Keep)?;
                } else if has_next
                    && (args.is(i, "EX")
                        || args.is(i, "PX")
                        || args.is(i, "EXAT")
                        || args.is(i, "PXAT"))
                {
                    let unit = if args.is(i, "EX") || args.is(i, "EXAT") {
                        1000
                    } else {
                        1
                    };
                    let absolute = args.is(i, "EXAT") || args.is(i, "PXAT");
                    let at = expire_arg(args.get(i + 1), unit, absolute, now, "set", true)?;
                    set_expiry(Expiry::At(at))?;
                    i += 1;
                } else {
                    return Err(SYNTAX.into());
                }
                i += 1;
            }
            plain(WriteOp::Set {
                kv: KeyValue::new(key, args.get(2)),
                cond,
                expiry,
                get,
            })
        }
        Cmd::SetNx => Ok((
            WriteOp::Set {
                kv: KeyValue::new(key, args.get(2)),
                cond: SetCond::Nx,
                expiry: Expiry::Clear,
                get: false,
            },
            RespReply::SetNx,
        )),
        Cmd::SetEx | Cmd::PSetEx => {
            let (unit, name) = if cmd == Cmd::SetEx {
                (1000, "setex")
            } else {
                (1, "psetex")
            };
            let at = expire_arg(args.get(2), unit, false, now, name, true)?;
            plain(WriteOp::Set {
                kv: KeyValue::new(key, args.get(3)),
                cond: SetCond::Always,
                expiry: Expiry::At(at),
                get: false,
            })
        }
        Cmd::GetSet => plain(WriteOp::Set {
            kv: KeyValue::new(key, args.get(2)),
            cond: SetCond::Always,
            expiry: Expiry::Clear,
            get: true,
        }),
        Cmd::GetDel => plain(WriteOp::GetDel { key: key.to_vec() }),
        Cmd::GetEx => {
            let expiry = match args.len() {
                2 => Expiry::Keep,
                3 if args.is(2, "PERSIST") => Expiry::Clear,
                4 => {
                    let unit = if args.is(2, "EX") || args.is(2, "EXAT") {
                        1000
                    } else {
                        1
                    };
                    let absolute = args.is(2, "EXAT") || args.is(2, "PXAT");
                    if !(args.is(2, "EX")
                        || args.is(2, "PX")
                        || args.is(2, "EXAT")
                        || args.is(2, "PXAT"))
                    {
                        return Err(SYNTAX.into());
                    }
                    Expiry::At(expire_arg(args.get(3), unit, absolute, now, "getex", true)?)
                }
                _ => return Err(SYNTAX.into()),
            };
            plain(WriteOp::GetEx {
                key: key.to_vec(),
                expiry,
            })
        }
        Cmd::MSet | Cmd::MSetNx => {
            if args.len().is_multiple_of(2) {
                let name = if cmd == Cmd::MSet { "mset" } else { "msetnx" };
                return Err(format!(
                    "ERR wrong number of arguments for '{name}' command"
                ));
            }
            let mut kvs = Vec::with_capacity(args.len() / 2);
            for i in (1..args.len()).step_by(2) {
                key_ok(args.get(i))?;
                kvs.push(KeyValue::new(args.get(i), args.get(i + 1)));
            }
            plain(WriteOp::MSet {
                kvs,
                nx: cmd == Cmd::MSetNx,
            })
        }
        Cmd::Incr => plain(WriteOp::IncrBy {
            key: key.to_vec(),
            delta: 1,
        }),
        Cmd::Decr => plain(WriteOp::IncrBy {
            key: key.to_vec(),
            delta: -1,
        }),
        Cmd::IncrBy => plain(WriteOp::IncrBy {
            key: key.to_vec(),
            delta: int_arg(args.get(2))?,
        }),
        Cmd::DecrBy => {
            let d = int_arg(args.get(2))?;
            let delta = d.checked_neg().ok_or("ERR decrement would overflow")?;
            plain(WriteOp::IncrBy {
                key: key.to_vec(),
                delta,
            })
        }
        Cmd::IncrByFloat => {
            use crate::float::{FloatArg, check};
            if check(args.get(2)) == FloatArg::Invalid {
                return Err("ERR value is not a valid float".into());
            }
            plain(WriteOp::IncrByFloat {
                key: key.to_vec(),
                delta: args.get(2).to_vec(),
            })
        }
        Cmd::Append => plain(WriteOp::Append {
            kv: KeyValue::new(key, args.get(2)),
            max: max_bulk,
        }),
        Cmd::SetRange => {
            let offset = int_arg(args.get(2))?;
            if offset < 0 {
                return Err("ERR offset is out of range".into());
            }
            if offset as u64 + args.get(3).len() as u64 > max_bulk as u64 {
                return Err("ERR string exceeds maximum allowed size (proto-max-bulk-len)".into());
            }
            plain(WriteOp::SetRange {
                kv: KeyValue::new(key, args.get(3)),
                offset: offset as usize,
                max: max_bulk,
            })
        }
        _ => Err(SYNTAX.into()),
    }
}

/// GET, STRLEN, GETRANGE.
pub(super) fn read(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, v3: bool, view: &View<'_, '_>) {
    let item = lookup1!(view, args, out);
    if item.is_some_and(|i| i.meta.kind != Kind::String) {
        if cmd == Cmd::Get {
            // Redis found the key: a hit, then the type check.
            view.hit(true);
        }
        return enc::error(out, super::args::WRONGTYPE);
    }
    match cmd {
        Cmd::Get => match item {
            Some(item) => {
                view.hit(true);
                enc::bulk(out, item.value)
            }
            None => {
                view.hit(false);
                enc::null(out, v3)
            }
        },
        Cmd::StrLen => enc::int(out, item.map_or(0, |i| i.value.len() as i64)),
        _ => {
            let (Some(start), Some(end)) = (parse_i64(args.get(2)), parse_i64(args.get(3))) else {
                return enc::error(out, NOT_INTEGER);
            };
            let value = item.map_or(&[][..], |i| i.value);
            enc::bulk(out, substr(value, start, end));
        }
    }
}

/// MGET's keys from `first` on, against `view`; the index of the key to resume at when the
/// reply paused at `room` bytes, else 0.
pub fn mget_view(
    args: Args<'_>,
    out: &mut Vec<u8>,
    v3: bool,
    room: usize,
    first: usize,
    view: &View<'_, '_>,
) -> usize {
    let start = out.len();
    let hit = |found: bool| {
        if let Some(c) = view.counters {
            c.count(found);
        }
    };
    if first == 1 {
        enc::array(out, args.len() - 1);
    }
    for i in first..args.len() {
        // Storage errors are logged and read as absent, except damage: the whole reply is
        // then the error, or, once a piece has been sent, the key's element is.
        let item = match view.store.lookup(args.get(i)) {
            Ok(Found::Cold) => {
                // Not in memory: go on from this key once it is read in (with the cold ones
                // among the next few). Nothing sent yet: the request runs again whole.
                for j in (i + 1..args.len()).take(crate::storage::overlay::COLD_AHEAD) {
                    view.store.note_cold(args.get(j));
                }
                if i == 1 {
                    out.truncate(start);
                    return 0;
                }
                return i;
            }
            Ok(Found::Item(item)) => Ok(Some(item)),
            Ok(Found::Missing) => Ok(None),
            Err(e) => Err(e),
        };
        let item = match item {
            Ok(Some(item))
                if !view.flushed
                    && !item.meta.is_expired(view.now)
                    && item.meta.kind == Kind::String =>
            {
                Some(item)
            }
            Ok(_) => None,
            Err(e) if e.is_damage() => {
                if first == 1 {
                    out.truncate(start);
                }
                enc::error(out, crate::storage::RESP_DAMAGED);
                if first == 1 {
                    return 0;
                }
                continue;
            }
            Err(e) => {
                error!("read of a stored item failed: {e}");
                None
            }
        };
        match item {
            Some(item) => {
                hit(true);
                enc::bulk(out, item.value);
                if out.len() - start >= room && i + 1 < args.len() {
                    return i + 1;
                }
            }
            None => {
                hit(false);
                enc::null(out, v3)
            }
        }
    }
    0
}

/// GETRANGE's index rules: negatives count from the end, both ends inclusive, clamped.
pub(super) fn substr(v: &[u8], start: i64, end: i64) -> &[u8] {
    let len = v.len() as i64;
    if len == 0 || (start < 0 && end < 0 && start > end) {
        return &[];
    }
    let mut s = if start < 0 { len + start } else { start };
    let mut e = if end < 0 { len + end } else { end };
    s = s.max(0);
    e = e.max(0).min(len - 1);
    if s > e || s >= len {
        &[]
    } else {
        &v[s as usize..=e as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getrange_indexes_like_redis() {
        let v = b"This is a string";
        assert_eq!(substr(v, 0, 3), b"This");
        assert_eq!(substr(v, -3, -1), b"ing");
        assert_eq!(substr(v, 0, -1), v);
        assert_eq!(substr(v, 10, 100), b"string");
        assert_eq!(substr(v, 5, 3), b"");
        assert_eq!(substr(b"", 0, -1), b"");
    }
}
