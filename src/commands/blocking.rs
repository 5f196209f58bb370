//! Pop commands that may block (BLPOP, BRPOP, BRPOPLPUSH, BLMOVE, BLMPOP, BZPOPMIN, BZPOPMAX,
//! BZMPOP) and their multi-key non-blocking forms (LMPOP, ZMPOP): the table, and Redis 7.0's
//! argument rules, parsing a request into a `types::blocking::PopForm` and its timeout. The
//! pops themselves, and the rules they follow, are `types::blocking`'s.

use std::time::Duration;

use super::args::{Args, SYNTAX, key_ok};
use super::list::side;
use super::table::{Cmd, NOKEY, Spec, W, spec};
use crate::protocol::resp::parse_i64;
use crate::types::blocking::PopForm;

const BLPOP: u8 = 0;
const BRPOP: u8 = 1;
const BRPOPLPUSH: u8 = 2;
const BLMOVE: u8 = 3;
const BLMPOP: u8 = 4;
const LMPOP: u8 = 5;
const BZPOPMIN: u8 = 6;
const BZPOPMAX: u8 = 7;
const BZMPOP: u8 = 8;
const ZMPOP: u8 = 9;

const fn pop(name: &'static str, arity: i32, keys: (i32, i32, i32), code: u8) -> Spec {
    spec(name, arity, W, keys, Cmd::Pop(code))
}

pub static COMMANDS: &[Spec] = &[
    pop("blpop", -3, (1, -2, 1), BLPOP),
    pop("brpop", -3, (1, -2, 1), BRPOP),
    pop("brpoplpush", 4, (1, 2, 1), BRPOPLPUSH),
    pop("blmove", 6, (1, 2, 1), BLMOVE),
    // Their keys follow a count (Redis's "movablekeys"), so the key triple says none.
    pop("blmpop", -5, NOKEY, BLMPOP),
    pop("lmpop", -4, NOKEY, LMPOP),
    pop("bzpopmin", -3, (1, -2, 1), BZPOPMIN),
    pop("bzpopmax", -3, (1, -2, 1), BZPOPMAX),
    pop("bzmpop", -5, NOKEY, BZMPOP),
    pop("zmpop", -4, NOKEY, ZMPOP),
];

/// A parsed pop: its form, and for a blocking command how long it may wait (`Some(None)`:
/// forever).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub form: PopForm,
    pub timeout: Option<Option<Duration>>,
}

const NOT_FLOAT: &str = "ERR timeout is not a float or out of range";

const NEGATIVE: &str = "ERR timeout is negative";

const NUMKEYS: &str = "ERR numkeys should be greater than 0";

const COUNT: &str = "ERR count should be greater than 0";

/// A blocking command's timeout in seconds: None waits forever.
pub fn parse_timeout(b: &[u8]) -> Result<Option<Duration>, String> {
    let secs = crate::semantics::parse_float(b).ok_or(NOT_FLOAT)?;
    let ms = secs * 1000.0;
    // Redis converts the milliseconds to a 64-bit integer; what does not fit (infinity
    // included) comes out negative there.
    if !ms.is_finite() || ms.abs() >= 9.223_372_036_854_775e18 {
        return Err(NEGATIVE.into());
    }
    if ms.trunc() < 0.0 {
        return Err(NEGATIVE.into());
    }
    // A positive timeout too small for an f64 (`1e-400`) is still positive to Redis's long
    // double: it times out at once rather than waiting forever.
    let tiny = secs == 0.0 && !b.starts_with(b"-") && {
        let mantissa = b.split(|&c| c == b'e' || c == b'E').next().unwrap_or(b"");
        mantissa.iter().any(|c| (b'1'..=b'9').contains(c))
    };
    if tiny {
        return Ok(Some(Duration::from_nanos(1)));
    }
    Ok((secs > 0.0).then(|| Duration::from_secs_f64(secs)))
}

/// Whether a pop command may block (outside MULTI).
pub fn blocks(code: u8) -> bool {
    !matches!(code, LMPOP | ZMPOP)
}

fn keys_of(args: Args<'_>, range: std::ops::Range<usize>) -> Result<Vec<Vec<u8>>, String> {
    range
        .map(|i| {
            key_ok(args.get(i))?;
            Ok(args.get(i).to_vec())
        })
        .collect()
}

/// LMPOP/BLMPOP/ZMPOP/BZMPOP after the timeout: `numkeys key... WHERE [COUNT n]` from `at`.
fn mpop(args: Args<'_>, at: usize, zset: bool) -> Result<PopForm, String> {
    let numkeys = parse_i64(args.get(at)).filter(|&n| n >= 1).ok_or(NUMKEYS)? as u64;
    let first = at + 1;
    if numkeys > (args.len() - first) as u64 {
        return Err(SYNTAX.into());
    }
    let where_at = first + numkeys as usize;
    if where_at >= args.len() {
        return Err(SYNTAX.into());
    }
    let keys = keys_of(args, first..where_at)?;
    let (a, b) = if zset {
        ("MIN", "MAX")
    } else {
        ("LEFT", "RIGHT")
    };
    let first_side = if args.is(where_at, a) {
        true
    } else if args.is(where_at, b) {
        false
    } else {
        return Err(SYNTAX.into());
    };
    let mut count = None;
    let mut i = where_at + 1;
    while i < args.len() {
        if args.is(i, "COUNT") && count.is_none() && i + 1 < args.len() {
            let n = parse_i64(args.get(i + 1))
                .filter(|&n| n >= 1)
                .ok_or(COUNT)?;
            count = Some(n as u64);
            i += 2;
        } else {
            return Err(SYNTAX.into());
        }
    }
    let count = Some(count.unwrap_or(1));
    Ok(if zset {
        PopForm::ZSet {
            keys,
            max: !first_side,
            count,
        }
    } else {
        PopForm::List {
            keys,
            left: first_side,
            count,
        }
    })
}

/// Parses a pop command's arguments (arity is already checked), in Redis's order of checks.
pub fn parse(code: u8, args: Args<'_>) -> Result<Parsed, String> {
    let n = args.len();
    let (form, timeout) = match code {
        BLPOP | BRPOP | BZPOPMIN | BZPOPMAX => {
            let timeout = parse_timeout(args.get(n - 1))?;
            let keys = keys_of(args, 1..n - 1)?;
            let form = match code {
                BLPOP | BRPOP => PopForm::List {
                    keys,
                    left: code == BLPOP,
                    count: None,
                },
                _ => PopForm::ZSet {
                    keys,
                    max: code == BZPOPMAX,
                    count: None,
                },
            };
            (form, Some(timeout))
        }
        BRPOPLPUSH | BLMOVE => {
            let (from_left, to_left) = if code == BLMOVE {
                (side(args, 3)?, side(args, 4)?)
            } else {
                (false, true)
            };
            let timeout = parse_timeout(args.get(n - 1))?;
            key_ok(args.get(1))?;
            key_ok(args.get(2))?;
            let form = PopForm::Move {
                src: args.get(1).to_vec(),
                dst: args.get(2).to_vec(),
                from_left,
                to_left,
            };
            (form, Some(timeout))
        }
        BLMPOP | BZMPOP => {
            let form = mpop(args, 2, code == BZMPOP)?;
            (form, Some(parse_timeout(args.get(1))?))
        }
        LMPOP | ZMPOP => (mpop(args, 1, code == ZMPOP)?, None),
        _ => return Err(SYNTAX.into()),
    };
    Ok(Parsed { form, timeout })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_follow_redis_7_0() {
        assert_eq!(parse_timeout(b"0"), Ok(None));
        assert_eq!(parse_timeout(b"0.0"), Ok(None));
        assert_eq!(parse_timeout(b"-0"), Ok(None));
        assert_eq!(parse_timeout(b"-0.0005"), Ok(None));
        assert_eq!(parse_timeout(b"1.5"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(parse_timeout(b".5"), Ok(Some(Duration::from_millis(500))));
        assert_eq!(parse_timeout(b"+1"), Ok(Some(Duration::from_secs(1))));
        assert_eq!(parse_timeout(b"1e3"), Ok(Some(Duration::from_secs(1000))));
        assert!(parse_timeout(b"0.0001").is_ok_and(|d| d.is_some()));
        assert!(parse_timeout(b"1e-400").is_ok_and(|d| d.is_some()));
        assert_eq!(parse_timeout(b"-1e-400"), Ok(None));
        assert_eq!(parse_timeout(b"0e5"), Ok(None));
        for neg in ["-1", "-0.01", "inf", "-inf", "1e16", "9223372036854775807"] {
            assert_eq!(parse_timeout(neg.as_bytes()), Err(NEGATIVE.into()), "{neg}");
        }
        for bad in ["", "abc", "nan", " 1", "1 ", "1s"] {
            assert_eq!(
                parse_timeout(bad.as_bytes()),
                Err(NOT_FLOAT.into()),
                "{bad}"
            );
        }
    }
}
