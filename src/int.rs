//! Integers as Redis reads them from text: one parser for RESP arguments (`protocol::resp`
//! re-exports it) and for the numbers stored in hashes and strings (HINCRBY, INCR), so the
//! storage layer (`types`, `semantics`) needs nothing from a protocol.

/// Parses Redis's signed decimal (string2ll rules: no leading zeros, no '+', no spaces).
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return None;
    }
    if neg && digits == b"0" {
        return None;
    }
    let mut v: i128 = 0;
    for &d in digits {
        v = v * 10 + (d - b'0') as i128;
    }
    if neg {
        v = -v;
    }
    i64::try_from(v).ok()
}
