//! Bit and LCS commands on strings: SETBIT, BITOP and BITFIELD parse into `WriteOp`s (run by
//! `crate::semantics::bits` in the writer); GETBIT, BITCOUNT, BITPOS, BITFIELD_RO and LCS
//! answer from a `View`, reading the values in place. Arguments are checked in Redis 7.0's
//! order, so each bad request answers the error Redis does.

use super::args::{Args, NOT_INTEGER, SYNTAX, key_ok};
use super::{Cmd, RespReply, View};
use crate::command::{BitOpKind, Field, FieldOp, Overflow, WriteOp};
use crate::protocol::resp::{enc, parse_i64};
use crate::semantics::bits::{count_bits, find_bit, get_bit, get_field};
use crate::storage::Kind;

const BIT_OFFSET: &str = "ERR bit offset is not an integer or out of range";
const BIT_VALUE: &str = "ERR bit is not an integer or out of range";
const BAD_TYPE: &str = "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.";
const LCS_TYPES: &str = "ERR The specified keys must contain string values";

/// A bit offset argument: a non-negative integer whose byte is below `max_bulk` (Redis's
/// bound, `proto_max_bulk_len`: 2^32 bits by default). With `hash_bits`, `#N` means N fields
/// of that width (BITFIELD).
fn bit_offset(arg: &[u8], hash_bits: Option<u32>, max_bulk: usize) -> Result<u64, String> {
    let (mul, digits) = match (arg.first(), hash_bits) {
        (Some(b'#'), Some(bits)) => (i64::from(bits), &arg[1..]),
        _ => (1, arg),
    };
    let n = parse_i64(digits)
        .and_then(|n| n.checked_mul(mul))
        .ok_or(BIT_OFFSET)?;
    if n < 0 || (n as u64 >> 3) >= max_bulk as u64 {
        return Err(BIT_OFFSET.into());
    }
    Ok(n as u64)
}

/// A BITFIELD type: `i1`..`i64` or `u1`..`u63`.
fn field_type(arg: &[u8]) -> Result<(bool, u32), String> {
    let signed = match arg.first() {
        Some(b'i') => true,
        Some(b'u') => false,
        _ => return Err(BAD_TYPE.into()),
    };
    match parse_i64(&arg[1..]) {
        Some(n) if n >= 1 && n <= if signed { 64 } else { 63 } => Ok((signed, n as u32)),
        _ => Err(BAD_TYPE.into()),
    }
}

/// BITFIELD's and BITFIELD_RO's operations, from argument 2 on.
fn field_ops(args: Args<'_>, max_bulk: usize) -> Result<Vec<FieldOp>, String> {
    let mut ops = Vec::new();
    let mut ow = Overflow::Wrap;
    let n = args.len();
    let mut j = 2;
    while j < n {
        let more = n - j - 1;
        let (get, set) = (args.is(j, "GET"), args.is(j, "SET"));
        if args.is(j, "OVERFLOW") && more >= 1 {
            ow = if args.is(j + 1, "WRAP") {
                Overflow::Wrap
            } else if args.is(j + 1, "SAT") {
                Overflow::Sat
            } else if args.is(j + 1, "FAIL") {
                Overflow::Fail
            } else {
                return Err("ERR Invalid OVERFLOW type specified".into());
            };
            j += 2;
            continue;
        }
        let ok = (get && more >= 2) || ((set || args.is(j, "INCRBY")) && more >= 3);
        if !ok {
            return Err(SYNTAX.into());
        }
        let (signed, bits) = field_type(args.get(j + 1))?;
        let offset = bit_offset(args.get(j + 2), Some(bits), max_bulk)?;
        let f = Field {
            offset,
            bits,
            signed,
        };
        if get {
            ops.push(FieldOp::Get(f));
            j += 3;
            continue;
        }
        let v = parse_i64(args.get(j + 3)).ok_or(NOT_INTEGER)?;
        ops.push(if set {
            FieldOp::Set(f, v, ow)
        } else {
            FieldOp::IncrBy(f, v, ow)
        });
        j += 4;
    }
    Ok(ops)
}

/// Parses SETBIT, BITFIELD and BITOP.
pub(super) fn write_op(
    cmd: Cmd,
    args: Args<'_>,
    max_bulk: usize,
) -> Result<(WriteOp, RespReply), String> {
    let op = match cmd {
        Cmd::SetBit => {
            let offset = bit_offset(args.get(2), None, max_bulk)?;
            let on = match parse_i64(args.get(3)) {
                Some(0) => false,
                Some(1) => true,
                _ => return Err(BIT_VALUE.into()),
            };
            WriteOp::SetBit {
                key: args.get(1).to_vec(),
                offset,
                on,
                max: max_bulk,
            }
        }
        Cmd::BitField => WriteOp::BitField {
            key: args.get(1).to_vec(),
            ops: field_ops(args, max_bulk)?,
            max: max_bulk,
        },
        Cmd::BitOp => {
            let op = if args.is(1, "AND") {
                BitOpKind::And
            } else if args.is(1, "OR") {
                BitOpKind::Or
            } else if args.is(1, "XOR") {
                BitOpKind::Xor
            } else if args.is(1, "NOT") {
                BitOpKind::Not
            } else {
                return Err(SYNTAX.into());
            };
            if op == BitOpKind::Not && args.len() != 4 {
                return Err("ERR BITOP NOT must be called with a single source key.".into());
            }
            let mut srcs = Vec::with_capacity(args.len() - 3);
            for i in 2..args.len() {
                key_ok(args.get(i))?;
                if i > 2 {
                    srcs.push(args.get(i).to_vec());
                }
            }
            WriteOp::BitOp {
                op,
                dest: args.get(2).to_vec(),
                srcs,
            }
        }
        _ => return Err(SYNTAX.into()),
    };
    Ok((op, RespReply::Plain))
}

/// GETBIT, BITCOUNT, BITPOS, BITFIELD_RO, LCS.
pub(super) fn read(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, v3: bool, view: &View<'_, '_>) {
    match cmd {
        Cmd::GetBit => {
            let offset = match bit_offset(args.get(2), None, view.max_bulk) {
                Ok(o) => o,
                Err(e) => return enc::error(out, &e),
            };
            let Some(value) = string(view, args, out) else {
                return;
            };
            enc::int(out, i64::from(get_bit(value.unwrap_or(&[]), offset)));
        }
        Cmd::BitCount => bit_count(args, out, view),
        Cmd::BitPos => bit_pos(args, out, view),
        Cmd::BitFieldRo => {
            let ops = match field_ops(args, view.max_bulk) {
                Ok(ops) => ops,
                Err(e) => return enc::error(out, &e),
            };
            if ops.iter().any(|op| !matches!(op, FieldOp::Get(_))) {
                return enc::error(out, "ERR BITFIELD_RO only supports the GET subcommand");
            }
            let Some(value) = string(view, args, out) else {
                return;
            };
            enc::array(out, ops.len());
            for op in ops {
                enc::int(out, get_field(value.unwrap_or(&[]), op.field()));
            }
        }
        _ => lcs(args, out, v3, view),
    }
}

/// The string under argument 1 (None inside when missing); None after answering WRONGTYPE
/// or a failed read.
fn string<'a>(view: &View<'a, '_>, args: Args<'_>, out: &mut Vec<u8>) -> Option<Option<&'a [u8]>> {
    match view.live(args.get(1)) {
        Ok(Some(item)) if item.meta.kind != Kind::String => {
            enc::error(out, super::args::WRONGTYPE);
            None
        }
        Ok(item) => Some(item.map(|i| i.value)),
        Err(e) => {
            super::failed(out, e);
            None
        }
    }
}

/// A `start end [BYTE|BIT]` range over a value of `len` bytes, turned into bits
/// `first..=last` as Redis does (negative from the end, clamped); None when empty.
fn bit_range(start: i64, end: i64, bit_mode: bool, len: u64) -> Option<(u64, u64)> {
    let total = if bit_mode { len as i64 * 8 } else { len as i64 };
    let norm = |x: i64| if x < 0 { (total + x).max(0) } else { x };
    let (s, e) = (norm(start), norm(end).min(total - 1));
    if s > e {
        return None;
    }
    let (s, e) = (s as u64, e as u64);
    Some(if bit_mode { (s, e) } else { (s * 8, e * 8 + 7) })
}

/// `BYTE` or `BIT` at argument `i`.
fn unit(args: Args<'_>, i: usize) -> Result<bool, &'static str> {
    if args.is(i, "BIT") {
        Ok(true)
    } else if args.is(i, "BYTE") {
        Ok(false)
    } else {
        Err(SYNTAX)
    }
}

/// BITCOUNT key [start end [BYTE|BIT]]: a missing key counts 0 whatever the arguments (Redis
/// 7.0 looks the key up first).
fn bit_count(args: Args<'_>, out: &mut Vec<u8>, view: &View<'_, '_>) {
    let Some(value) = string(view, args, out) else {
        return;
    };
    let Some(v) = value else {
        return enc::int(out, 0);
    };
    let range = match args.len() {
        2 => (!v.is_empty()).then(|| (0, v.len() as u64 * 8 - 1)),
        4 | 5 => {
            let (Some(start), Some(end)) = (parse_i64(args.get(2)), parse_i64(args.get(3))) else {
                return enc::error(out, NOT_INTEGER);
            };
            let bit_mode = match args.len() {
                5 => match unit(args, 4) {
                    Ok(b) => b,
                    Err(e) => return enc::error(out, e),
                },
                _ => false,
            };
            if start < 0 && end < 0 && start > end {
                None
            } else {
                bit_range(start, end, bit_mode, v.len() as u64)
            }
        }
        _ => return enc::error(out, SYNTAX),
    };
    enc::int(
        out,
        range.map_or(0, |(first, last)| count_bits(v, first, last) as i64),
    );
}

/// BITPOS key bit [start [end [BYTE|BIT]]].
fn bit_pos(args: Args<'_>, out: &mut Vec<u8>, view: &View<'_, '_>) {
    let bit = match parse_i64(args.get(2)) {
        None => return enc::error(out, NOT_INTEGER),
        Some(0) => false,
        Some(1) => true,
        Some(_) => return enc::error(out, "ERR The bit argument must be 1 or 0."),
    };
    let Some(value) = string(view, args, out) else {
        return;
    };
    // A missing key is an endless run of zeros.
    let Some(v) = value else {
        return enc::int(out, if bit { -1 } else { 0 });
    };
    let len = v.len() as u64;
    let (range, end_given) = match args.len() {
        3 => ((len > 0).then(|| (0, len * 8 - 1)), false),
        4..=6 => {
            let Some(start) = parse_i64(args.get(3)) else {
                return enc::error(out, NOT_INTEGER);
            };
            let bit_mode = if args.len() == 6 {
                match unit(args, 5) {
                    Ok(b) => b,
                    Err(e) => return enc::error(out, e),
                }
            } else {
                false
            };
            let end = if args.len() >= 5 {
                match parse_i64(args.get(4)) {
                    Some(e) => e,
                    None => return enc::error(out, NOT_INTEGER),
                }
            } else {
                i64::MAX
            };
            (bit_range(start, end, bit_mode, len), args.len() >= 5)
        }
        _ => return enc::error(out, SYNTAX),
    };
    let Some((first, last)) = range else {
        return enc::int(out, -1);
    };
    let pos = match find_bit(v, bit, first, last) {
        Some(p) => p as i64,
        // Looking for a zero with no end given: the string goes on with zeros.
        None if !bit && !end_given => last as i64 + 1,
        None => -1,
    };
    enc::int(out, pos);
}

/// LCS key1 key2 [LEN] [IDX] [MINMATCHLEN len] [WITHMATCHLEN]. Its table of (len1+1)*(len2+1)
/// 32-bit cells is refused past `proto_max_bulk_len` bytes, as Redis 7.0 does; LEN alone keeps
/// only two rows of it.
fn lcs(args: Args<'_>, out: &mut Vec<u8>, v3: bool, view: &View<'_, '_>) {
    let (a, b) = match (view.live(args.get(1)), view.live(args.get(2))) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return super::failed(out, e),
    };
    if [&a, &b]
        .iter()
        .any(|i| i.as_ref().is_some_and(|i| i.meta.kind != Kind::String))
    {
        return enc::error(out, LCS_TYPES);
    }
    let a = a.map_or(&[][..], |i| i.value);
    let b = b.map_or(&[][..], |i| i.value);
    let (mut get_len, mut get_idx, mut with_len, mut min_len) = (false, false, false, 0i64);
    let mut j = 3;
    while j < args.len() {
        if args.is(j, "IDX") {
            get_idx = true;
        } else if args.is(j, "LEN") {
            get_len = true;
        } else if args.is(j, "WITHMATCHLEN") {
            with_len = true;
        } else if args.is(j, "MINMATCHLEN") && j + 1 < args.len() {
            let Some(n) = parse_i64(args.get(j + 1)) else {
                return enc::error(out, NOT_INTEGER);
            };
            min_len = n.max(0);
            j += 1;
        } else {
            return enc::error(out, SYNTAX);
        }
        j += 1;
    }
    if get_idx && get_len {
        return enc::error(
            out,
            "ERR If you want both the length and indexes, please just use IDX.",
        );
    }
    if a.len() as u64 >= u64::from(u32::MAX) - 1 || b.len() as u64 >= u64::from(u32::MAX) - 1 {
        return enc::error(out, "ERR String too long for LCS");
    }
    let cells = (a.len() as u64 + 1) * (b.len() as u64 + 1);
    if cells.saturating_mul(4) > view.max_bulk as u64 {
        return enc::error(
            out,
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len",
        );
    }
    if get_len {
        return enc::int(out, lcs_len(a, b) as i64);
    }
    let cols = b.len() + 1;
    let mut dp: Vec<u32> = Vec::new();
    if dp.try_reserve_exact(cells as usize).is_err() {
        return enc::error(
            out,
            "ERR Insufficient memory, failed allocating transient memory for LCS",
        );
    }
    dp.resize(cells as usize, 0);
    for i in 1..=a.len() {
        for k in 1..=b.len() {
            dp[i * cols + k] = if a[i - 1] == b[k - 1] {
                dp[(i - 1) * cols + k - 1] + 1
            } else {
                dp[(i - 1) * cols + k].max(dp[i * cols + k - 1])
            };
        }
    }
    let total = dp[a.len() * cols + b.len()] as usize;
    let mut text = vec![0u8; total];
    // Matching runs, from the ends of the strings back: (a start, a end, b start, b end).
    let mut runs: Vec<(usize, usize, usize, usize)> = Vec::new();
    let mut run: Option<(usize, usize, usize, usize)> = None;
    let (mut i, mut k, mut left) = (a.len(), b.len(), total);
    while i > 0 && k > 0 {
        let mut emit = false;
        if a[i - 1] == b[k - 1] {
            text[left - 1] = a[i - 1];
            match &mut run {
                None => run = Some((i - 1, i - 1, k - 1, k - 1)),
                Some(r) if r.0 == i && r.2 == k => {
                    r.0 -= 1;
                    r.2 -= 1;
                }
                Some(_) => emit = true,
            }
            if run.is_some_and(|r| r.0 == 0 || r.2 == 0) {
                emit = true;
            }
            left -= 1;
            i -= 1;
            k -= 1;
        } else {
            if dp[(i - 1) * cols + k] > dp[i * cols + k - 1] {
                i -= 1;
            } else {
                k -= 1;
            }
            emit = run.is_some();
        }
        if emit && let Some(r) = run.take() {
            let n = r.1 - r.0 + 1;
            if get_idx && (min_len == 0 || n as i64 >= min_len) {
                runs.push(r);
            }
        }
    }
    if !get_idx {
        return enc::bulk(out, &text);
    }
    enc::map(out, 2, v3);
    enc::bulk(out, b"matches");
    enc::array(out, runs.len());
    for (s1, e1, s2, e2) in runs {
        enc::array(out, if with_len { 3 } else { 2 });
        enc::array(out, 2);
        enc::int(out, s1 as i64);
        enc::int(out, e1 as i64);
        enc::array(out, 2);
        enc::int(out, s2 as i64);
        enc::int(out, e2 as i64);
        if with_len {
            enc::int(out, (e1 - s1 + 1) as i64);
        }
    }
    enc::bulk(out, b"len");
    enc::int(out, total as i64);
}

/// The LCS's length alone, keeping two rows of the table.
fn lcs_len(a: &[u8], b: &[u8]) -> u32 {
    let mut prev = vec![0u32; b.len() + 1];
    let mut cur = vec![0u32; b.len() + 1];
    for &x in a {
        for k in 1..=b.len() {
            cur[k] = if x == b[k - 1] {
                prev[k - 1] + 1
            } else {
                prev[k].max(cur[k - 1])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_redis() {
        assert_eq!(bit_range(0, -1, false, 3), Some((0, 23)));
        assert_eq!(bit_range(1, 1, false, 3), Some((8, 15)));
        assert_eq!(bit_range(5, 30, true, 3), Some((5, 23)));
        assert_eq!(bit_range(-100, -200, false, 3), Some((0, 7)));
        assert_eq!(bit_range(2, 1, false, 3), None);
        assert_eq!(bit_range(0, -1, false, 0), None);
    }

    #[test]
    fn offsets_and_types_parse_as_redis() {
        assert_eq!(bit_offset(b"7", None, 1), Ok(7));
        assert!(bit_offset(b"8", None, 1).is_err());
        assert!(bit_offset(b"-1", None, 1).is_err());
        assert!(bit_offset(b"#1", None, 1).is_err());
        assert_eq!(bit_offset(b"#2", Some(8), 16), Ok(16));
        assert_eq!(field_type(b"i64"), Ok((true, 64)));
        assert_eq!(field_type(b"u63"), Ok((false, 63)));
        assert!(field_type(b"u64").is_err());
        assert!(field_type(b"i0").is_err());
        assert!(field_type(b"I8").is_err());
    }

    #[test]
    fn lcs_len_counts_the_longest_subsequence() {
        assert_eq!(lcs_len(b"ohmytext", b"mynewtext"), 6);
        assert_eq!(lcs_len(b"", b"abc"), 0);
    }
}
