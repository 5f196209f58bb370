//! Bits of strings: SETBIT, BITFIELD and BITOP as writes (run by `super::apply`, so the LMDB
//! store and the in-memory model run the same code), and the pieces the bit reads share
//! (GETBIT, BITCOUNT, BITPOS, BITFIELD_RO in `crate::commands::bits`).
//!
//! Bit 0 is the most significant bit of the first byte, as in Redis. SETBIT and BITFIELD change
//! a string in place as SETRANGE does: the item keeps its flags and expiry and takes a fresh
//! CAS; a missing key becomes a zero-filled string with flags 0. A write that changes no byte
//! and grows nothing writes nothing (Redis then does not signal the key either, so WATCH does
//! not fire). BITOP replaces its destination as SET does (flags 0, no expiry, a fresh CAS).

use super::Ctx;
use crate::command::{BitOpKind, Field, FieldOp, Outcome, Overflow};
use crate::storage::{Edit, ItemMeta, Kind, StoreError, WriteView};

/// SETRANGE's refusal of a result longer than `proto_max_bulk_len`.
pub const TOO_LARGE: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";

/// Whether bit `offset` of `v` is set (bits past the end read as 0).
pub fn get_bit(v: &[u8], offset: u64) -> bool {
    usize::try_from(offset >> 3)
        .ok()
        .and_then(|i| v.get(i))
        .is_some_and(|b| b & (0x80 >> (offset & 7)) != 0)
}

/// Sets or clears bit `offset`, which must be inside `v`.
fn set_bit(v: &mut [u8], offset: u64, on: bool) {
    let mask = 0x80u8 >> (offset & 7);
    if let Some(b) = usize::try_from(offset >> 3).ok().and_then(|i| v.get_mut(i)) {
        if on {
            *b |= mask;
        } else {
            *b &= !mask;
        }
    }
}

/// A field's value (bits past the end read as 0), sign-extended for a signed field.
pub fn get_field(v: &[u8], f: Field) -> i64 {
    let mut u = 0u64;
    for i in 0..u64::from(f.bits) {
        u = (u << 1) | u64::from(get_bit(v, f.offset + i));
    }
    if f.signed && f.bits < 64 && (u >> (f.bits - 1)) & 1 == 1 {
        u |= !0u64 << f.bits;
    }
    u as i64
}

/// Writes the low `f.bits` bits of `value` into the field, which must be inside `v`.
fn set_field(v: &mut [u8], f: Field, value: u64) {
    for i in 0..u64::from(f.bits) {
        let bit = (value >> (u64::from(f.bits) - 1 - i)) & 1 == 1;
        set_bit(v, f.offset + i, bit);
    }
}

/// The value a field holds after `value + incr` (a SET passes its value and 0), or None when
/// it does not fit and the policy is FAIL. The overflow tests are Redis's, done in wrapping
/// 64-bit arithmetic as its build does, so even the extremes answer as Redis 7.0 does (SET i8
/// to -2^63 saturates to 127 there).
fn fit(f: Field, value: i64, incr: i64, ow: Overflow) -> Option<i64> {
    let bits = f.bits;
    if f.signed {
        let max: i64 = if bits == 64 {
            i64::MAX
        } else {
            (1i64 << (bits - 1)) - 1
        };
        let min = -max - 1;
        let max_incr = max.wrapping_sub(value);
        let min_incr = min.wrapping_sub(value);
        let up = value > max
            || (bits != 64 && incr > max_incr)
            || (value >= 0 && incr > 0 && incr > max_incr);
        let down = !up
            && (value < min
                || (bits != 64 && incr < min_incr)
                || (value < 0 && incr < 0 && incr < min_incr));
        if !up && !down {
            return Some(value.wrapping_add(incr));
        }
        match ow {
            Overflow::Fail => None,
            Overflow::Sat => Some(if up { max } else { min }),
            Overflow::Wrap => {
                let mut c = (value as u64).wrapping_add(incr as u64);
                if bits < 64 {
                    let mask = !0u64 << bits;
                    if c & (1u64 << (bits - 1)) != 0 {
                        c |= mask;
                    } else {
                        c &= !mask;
                    }
                }
                Some(c as i64)
            }
        }
    } else {
        let value = value as u64;
        let max: u64 = (1u64 << bits) - 1;
        let max_incr = max.wrapping_sub(value) as i64;
        let min_incr = (value as i64).wrapping_neg();
        let up = value > max || (incr > 0 && incr > max_incr);
        let down = !up && incr < 0 && incr < min_incr;
        if !up && !down {
            return Some(value.wrapping_add(incr as u64) as i64);
        }
        match ow {
            Overflow::Fail => None,
            Overflow::Sat => Some(if up { max as i64 } else { 0 }),
            Overflow::Wrap => Some((value.wrapping_add(incr as u64) & max) as i64),
        }
    }
}

/// A bit write's view of a string: the stored value `old`, read where it lies, with bytes
/// `lo..lo + bytes.len()` replaced by `bytes` (the bytes the write covers, copied from `old`,
/// zero past its end). Only those bytes are copied, so a SETBIT or BITFIELD on a large bitmap
/// costs the size of its fields, and the store builds the new value once (`WriteView::edit`).
struct Window<'a> {
    old: &'a [u8],
    lo: u64,
    bytes: Vec<u8>,
}

impl<'a> Window<'a> {
    /// Bytes `lo..=hi` of `old` (zero past its end); `hi - lo` is small (a write's fields).
    fn new(old: &'a [u8], lo: u64, hi: u64) -> Window<'a> {
        let bytes = (lo..=hi).map(|i| byte_at(old, i)).collect();
        Window { old, lo, bytes }
    }

    fn byte(&self, i: u64) -> u8 {
        match i.checked_sub(self.lo).and_then(|d| usize::try_from(d).ok()) {
            Some(d) if d < self.bytes.len() => self.bytes[d],
            _ => byte_at(self.old, i),
        }
    }

    /// The field's value as the string now reads (see `get_field`).
    fn get(&self, f: Field) -> i64 {
        let first = f.offset >> 3;
        let last = (f.offset + u64::from(f.bits) - 1) >> 3;
        // A field spans at most 9 bytes (64 bits from any bit of a byte).
        let mut tmp = [0u8; 9];
        for (t, i) in tmp.iter_mut().zip(first..=last) {
            *t = self.byte(i);
        }
        get_field(
            &tmp,
            Field {
                offset: f.offset - first * 8,
                ..f
            },
        )
    }

    /// Writes the field, which lies inside the window.
    fn set(&mut self, f: Field, value: u64) {
        let shifted = Field {
            offset: f.offset - self.lo * 8,
            ..f
        };
        set_field(&mut self.bytes, shifted, value);
    }
}

/// Byte `i` of `v`, 0 past its end.
fn byte_at(v: &[u8], i: u64) -> u8 {
    usize::try_from(i)
        .ok()
        .and_then(|i| v.get(i))
        .copied()
        .unwrap_or(0)
}

/// Whether a write that must reach byte `last` of a string of `len` bytes makes it longer
/// than `max`.
fn too_long(last: u64, len: usize, max: usize) -> bool {
    last >= len as u64 && last >= max as u64
}

/// Stores the bytes `window` covers into the string: as an edit of the live item `old` (its
/// meta) when there is one, else as a new zero-filled string (flags 0).
fn store_window<S: WriteView>(
    s: &mut S,
    key: &[u8],
    old: Option<ItemMeta>,
    window: &[u8],
    lo: u64,
) -> Result<(), StoreError> {
    // The window lies below `max` (checked by the callers), which is a usize.
    let at = usize::try_from(lo).unwrap_or(usize::MAX);
    let mut meta = old.unwrap_or_else(|| ItemMeta::string(0));
    meta.cas = s.next_cas();
    match old {
        Some(old) => s.edit(key, &old, &meta, window, &Edit::write(at, window.len())),
        None => {
            let mut value = vec![0; at];
            value.extend_from_slice(window);
            s.put(key, &meta, &[&value])
        }
    }
}

/// SETBIT: the old bit as `Int`.
pub(super) fn set_bit_op<S: WriteView>(
    s: &mut S,
    key: &[u8],
    offset: u64,
    on: bool,
    max: usize,
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    let byte = offset >> 3;
    let (old, len, cur) = match s.get(key)?.filter(|i| !i.meta.is_expired(ctx.now_ms)) {
        Some(i) if i.meta.kind != Kind::String => return Ok(Outcome::WrongType),
        Some(i) => (Some(i.meta), i.value.len(), byte_at(i.value, byte)),
        None => (None, 0, 0),
    };
    if too_long(byte, len, max) {
        return Ok(Outcome::Err(TOO_LARGE));
    }
    let mask = 0x80u8 >> (offset & 7);
    let was = cur & mask != 0;
    // A bit that is already as asked, inside the string: nothing is written.
    if was == on && old.is_some() && byte < len as u64 {
        return Ok(Outcome::Int(i64::from(was)));
    }
    let new = if on { cur | mask } else { cur & !mask };
    store_window(s, key, old, &[new], byte)?;
    Ok(Outcome::Int(i64::from(was)))
}

/// BITFIELD: each operation's reply, in order, as `Array`. Only GETs: the key is read, never
/// created. Any SET or INCRBY: a missing key is created (zero-filled up to the farthest field
/// written) even if every write fails under OVERFLOW FAIL, as Redis does.
pub(super) fn bit_field<S: WriteView>(
    s: &mut S,
    key: &[u8],
    ops: &[FieldOp],
    max: usize,
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    let item = s.get(key)?.filter(|i| !i.meta.is_expired(ctx.now_ms));
    if item.as_ref().is_some_and(|i| i.meta.kind != Kind::String) {
        return Ok(Outcome::WrongType);
    }
    let value = item.as_ref().map_or(&[][..], |i| i.value);
    // The bytes the writing operations cover.
    let Some((lo, hi)) = ops
        .iter()
        .filter(|op| !matches!(op, FieldOp::Get(_)))
        .map(|op| {
            let f = op.field();
            (f.offset >> 3, (f.offset + u64::from(f.bits) - 1) >> 3)
        })
        .reduce(|(lo, hi), (a, b)| (lo.min(a), hi.max(b)))
    else {
        // Only reads: answered from the stored value, which is neither copied nor created.
        return Ok(Outcome::Array(
            ops.iter()
                .map(|op| Outcome::Int(get_field(value, op.field())))
                .collect(),
        ));
    };
    if too_long(hi, value.len(), max) {
        return Ok(Outcome::Err(TOO_LARGE));
    }
    let mut w = Window::new(value, lo, hi);
    let mut replies = Vec::with_capacity(ops.len());
    let mut changed = false;
    for op in ops {
        match *op {
            FieldOp::Get(f) => replies.push(Outcome::Int(w.get(f))),
            FieldOp::Set(f, v, ow) | FieldOp::IncrBy(f, v, ow) => {
                let old = w.get(f);
                let is_set = matches!(op, FieldOp::Set(..));
                let new = if is_set {
                    fit(f, v, 0, ow)
                } else {
                    fit(f, old, v, ow)
                };
                match new {
                    None => replies.push(Outcome::Nil),
                    Some(new) => {
                        replies.push(Outcome::Int(if is_set { old } else { new }));
                        w.set(f, new as u64);
                        changed |= w.get(f) != old;
                    }
                }
            }
        }
    }
    let grows = hi >= value.len() as u64;
    let old = item.map(|i| i.meta);
    let window = w.bytes;
    if changed || grows || old.is_none() {
        store_window(s, key, old, &window, lo)?;
    }
    Ok(Outcome::Array(replies))
}

/// BITOP: combines the sources into `dest` (missing ones and the bytes past a shorter one
/// count as zeros), reading each source in place: the only copy made is the result.
pub(super) fn bit_op<S: WriteView>(
    s: &mut S,
    op: BitOpKind,
    dest: &[u8],
    srcs: &[Vec<u8>],
    ctx: Ctx,
) -> Result<Outcome, StoreError> {
    let mut max_len = 0;
    for k in srcs {
        if let Some(item) = s.get(k)?.filter(|i| !i.meta.is_expired(ctx.now_ms)) {
            if item.meta.kind != Kind::String {
                return Ok(Outcome::WrongType);
            }
            max_len = max_len.max(item.value.len());
        }
    }
    if max_len == 0 {
        s.delete(dest)?;
        return Ok(Outcome::Int(0));
    }
    let mut res = vec![0u8; max_len];
    for (i, k) in srcs.iter().enumerate() {
        let item = s.get(k)?.filter(|i| !i.meta.is_expired(ctx.now_ms));
        let v = item.as_ref().map_or(&[][..], |i| i.value);
        if i == 0 {
            res[..v.len()].copy_from_slice(v);
            if op == BitOpKind::Not {
                res.iter_mut().for_each(|b| *b = !*b);
            }
            continue;
        }
        let (head, tail) = res.split_at_mut(v.len());
        match op {
            BitOpKind::And => {
                head.iter_mut().zip(v).for_each(|(r, b)| *r &= b);
                tail.fill(0);
            }
            BitOpKind::Or => head.iter_mut().zip(v).for_each(|(r, b)| *r |= b),
            BitOpKind::Xor => head.iter_mut().zip(v).for_each(|(r, b)| *r ^= b),
            BitOpKind::Not => {}
        }
    }
    let meta = ItemMeta::string(s.next_cas());
    s.put(dest, &meta, &[&res])?;
    Ok(Outcome::Int(max_len as i64))
}

/// Set bits in `v`, eight bytes at a time.
pub fn popcount(v: &[u8]) -> u64 {
    let mut chunks = v.chunks_exact(8);
    let mut n: u64 = 0;
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        n += u64::from(u64::from_ne_bytes(w).count_ones());
    }
    n + chunks
        .remainder()
        .iter()
        .map(|b| u64::from(b.count_ones()))
        .sum::<u64>()
}

/// Set bits among bits `first..=last` of `v` (both inside it).
pub fn count_bits(v: &[u8], first: u64, last: u64) -> u64 {
    let (fb, lb) = ((first >> 3) as usize, (last >> 3) as usize);
    if fb == lb {
        return (first..=last).filter(|&i| get_bit(v, i)).count() as u64;
    }
    let head = (first..(fb as u64 + 1) * 8)
        .filter(|&i| get_bit(v, i))
        .count() as u64;
    let tail = (lb as u64 * 8..=last).filter(|&i| get_bit(v, i)).count() as u64;
    head + tail + popcount(&v[fb + 1..lb])
}

/// The first bit equal to `bit` among bits `first..=last` of `v` (both inside it).
pub fn find_bit(v: &[u8], bit: bool, first: u64, last: u64) -> Option<u64> {
    let (fb, lb) = ((first >> 3) as usize, (last >> 3) as usize);
    let edge = |from: u64, to: u64| (from..=to).find(|&i| get_bit(v, i) == bit);
    if fb == lb {
        return edge(first, last);
    }
    if let Some(i) = edge(first, (fb as u64 + 1) * 8 - 1) {
        return Some(i);
    }
    let skip = if bit { 0x00 } else { 0xff };
    if let Some(j) = v[fb + 1..lb].iter().position(|&b| b != skip) {
        let byte = (fb + 1 + j) as u64;
        return edge(byte * 8, byte * 8 + 7);
    }
    edge(lb as u64 * 8, last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::WriteOp;
    use crate::storage::ReadView;
    use crate::storage::model::ModelStore;

    fn ctx() -> Ctx {
        Ctx {
            now_ms: 1_700_000_000_000,
            item_size_max: 1024,
        }
    }

    fn f(signed: bool, bits: u32, offset: u64) -> Field {
        Field {
            offset,
            bits,
            signed,
        }
    }

    #[test]
    fn fields_read_msb_first_and_sign_extend() {
        let v = [0b1010_0000, 0xff];
        assert_eq!(get_field(&v, f(false, 4, 0)), 0b1010);
        assert_eq!(get_field(&v, f(true, 4, 0)), -6);
        assert_eq!(get_field(&v, f(false, 8, 4)), 0x0f);
        assert_eq!(get_field(&v, f(false, 8, 12)), 0xf0);
        assert_eq!(
            get_field(&v, f(true, 64, 0)),
            0xa0ff_0000_0000_0000u64 as i64
        );
    }

    #[test]
    fn overflow_policies_match_redis() {
        let u8f = f(false, 8, 0);
        let i8f = f(true, 8, 0);
        assert_eq!(fit(u8f, 250, 10, Overflow::Wrap), Some(4));
        assert_eq!(fit(u8f, 250, 10, Overflow::Sat), Some(255));
        assert_eq!(fit(u8f, 250, 10, Overflow::Fail), None);
        assert_eq!(fit(u8f, 5, -10, Overflow::Sat), Some(0));
        assert_eq!(fit(u8f, 5, -10, Overflow::Wrap), Some(251));
        assert_eq!(fit(u8f, -1, 0, Overflow::Sat), Some(255));
        assert_eq!(fit(i8f, 120, 10, Overflow::Wrap), Some(-126));
        assert_eq!(fit(i8f, 120, 10, Overflow::Sat), Some(127));
        assert_eq!(fit(i8f, -120, -10, Overflow::Sat), Some(-128));
        assert_eq!(fit(i8f, 200, 0, Overflow::Wrap), Some(-56));
        // Redis's wrapping arithmetic: the most negative value saturates upwards.
        assert_eq!(fit(i8f, i64::MIN, 0, Overflow::Sat), Some(127));
        let i64f = f(true, 64, 0);
        assert_eq!(fit(i64f, i64::MAX, 1, Overflow::Sat), Some(i64::MAX));
        assert_eq!(fit(i64f, i64::MAX, 1, Overflow::Wrap), Some(i64::MIN));
        assert_eq!(fit(i64f, i64::MIN, -1, Overflow::Fail), None);
    }

    #[test]
    fn counting_and_finding_bits() {
        let v = [0xff, 0xf0, 0x00, 0x01];
        assert_eq!(popcount(&v), 13);
        assert_eq!(count_bits(&v, 0, 31), 13);
        assert_eq!(count_bits(&v, 5, 13), 7);
        assert_eq!(count_bits(&v, 9, 10), 2);
        assert_eq!(find_bit(&v, false, 0, 31), Some(12));
        assert_eq!(find_bit(&v, true, 12, 31), Some(31));
        assert_eq!(find_bit(&v, true, 12, 30), None);
        assert_eq!(find_bit(&v, false, 0, 7), None);
    }

    /// The plain way, on a whole copy of the value, as these writes were made before they
    /// took a window: the reference the windowed writes must agree with.
    fn reference(value: &mut Vec<u8>, ops: &[FieldOp], max: usize) -> Outcome {
        let Some(last) = ops
            .iter()
            .filter(|op| !matches!(op, FieldOp::Get(_)))
            .map(|op| op.field().offset + u64::from(op.field().bits) - 1)
            .max()
        else {
            return Outcome::Array(
                ops.iter()
                    .map(|op| Outcome::Int(get_field(value, op.field())))
                    .collect(),
            );
        };
        let len = (last >> 3) as usize + 1;
        if len > value.len() {
            if len > max {
                return Outcome::Err(TOO_LARGE);
            }
            value.resize(len, 0);
        }
        let mut replies = Vec::new();
        for op in ops {
            match *op {
                FieldOp::Get(f) => replies.push(Outcome::Int(get_field(value, f))),
                FieldOp::Set(f, v, ow) | FieldOp::IncrBy(f, v, ow) => {
                    let old = get_field(value, f);
                    let is_set = matches!(op, FieldOp::Set(..));
                    let new = if is_set {
                        fit(f, v, 0, ow)
                    } else {
                        fit(f, old, v, ow)
                    };
                    match new {
                        None => replies.push(Outcome::Nil),
                        Some(new) => {
                            replies.push(Outcome::Int(if is_set { old } else { new }));
                            set_field(value, f, new as u64);
                        }
                    }
                }
            }
        }
        Outcome::Array(replies)
    }

    #[test]
    fn windowed_bit_writes_agree_with_writing_a_whole_copy() {
        // Random BITFIELDs (reads inside, across and outside the bytes the writes cover,
        // past the end, signed and unsigned, every overflow policy) and SETBITs on short
        // strings, against `reference`.
        let mut rng = crate::test_rng::Xorshift(0x9e37_79b9_7f4a_7c15);
        let mut next = |n: u64| rng.below(n);
        let max = 48;
        for round in 0..3_000 {
            let mut s = ModelStore::default();
            let len = next(56) as usize;
            let mut want: Vec<u8> = (0..len).map(|_| next(256) as u8).collect();
            let cas = s.next_cas();
            let existed = next(5) != 0;
            if existed {
                let meta = ItemMeta::new(Kind::String, 3, 0, cas);
                s.put(b"k", &meta, &[&want]).expect("put");
            } else {
                want.clear();
            }
            let op = if round % 4 == 0 {
                let offset = next(8 * 60);
                let on = next(2) == 1;
                let mut w = want.clone();
                let byte = (offset >> 3) as usize;
                let expect = if byte >= w.len() && byte >= max {
                    Outcome::Err(TOO_LARGE)
                } else {
                    if byte >= w.len() {
                        w.resize(byte + 1, 0);
                    }
                    let old = get_bit(&w, offset);
                    set_bit(&mut w, offset, on);
                    Outcome::Int(i64::from(old))
                };
                let got = super::super::apply(
                    &mut s,
                    &WriteOp::SetBit {
                        key: b"k".to_vec(),
                        offset,
                        on,
                        max,
                    },
                    ctx(),
                )
                .expect("apply");
                assert_eq!(got, expect, "round {round}: SETBIT {offset} {on}");
                if expect != Outcome::Err(TOO_LARGE) {
                    want = w;
                }
                None
            } else {
                let n = 1 + next(4);
                let ops: Vec<FieldOp> = (0..n)
                    .map(|_| {
                        let signed = next(2) == 1;
                        let bits = 1 + next(if signed { 64 } else { 63 }) as u32;
                        let field = f(signed, bits, next(8 * 62));
                        let ow = [Overflow::Wrap, Overflow::Sat, Overflow::Fail][next(3) as usize];
                        let v = next(1 << 20) as i64 - (1 << 19);
                        match next(3) {
                            0 => FieldOp::Get(field),
                            1 => FieldOp::Set(field, v, ow),
                            _ => FieldOp::IncrBy(field, v, ow),
                        }
                    })
                    .collect();
                Some(ops)
            };
            if let Some(ops) = op {
                let mut w = want.clone();
                let expect = reference(&mut w, &ops, max);
                let got = super::super::apply(
                    &mut s,
                    &WriteOp::BitField {
                        key: b"k".to_vec(),
                        ops: ops.clone(),
                        max,
                    },
                    ctx(),
                )
                .expect("apply");
                assert_eq!(got, expect, "round {round}: {ops:?} on {want:?}");
                let writes = ops.iter().any(|op| !matches!(op, FieldOp::Get(_)));
                if expect != Outcome::Err(TOO_LARGE) && (writes || existed) {
                    want = w;
                }
                let stored = s.get(b"k").expect("get").map(|i| i.value.to_vec());
                if writes || existed {
                    if expect != Outcome::Err(TOO_LARGE) {
                        assert_eq!(stored, Some(want), "round {round}: {ops:?}");
                    }
                } else {
                    assert_eq!(stored, None, "round {round}: reads create nothing");
                }
                continue;
            }
            let stored = s.get(b"k").expect("get").map(|i| i.value.to_vec());
            if stored.is_some() || !want.is_empty() {
                assert_eq!(stored, Some(want), "round {round}: SETBIT");
            }
        }
    }

    #[test]
    fn setbit_and_bitfield_keep_flags_and_expiry_and_skip_no_change() {
        let mut s = ModelStore::default();
        let cas = s.next_cas();
        let meta = ItemMeta::new(Kind::String, 7, ctx().now_ms + 10_000, cas);
        s.put(b"k", &meta, &[b"a"]).expect("put");
        let setbit = |s: &mut ModelStore, offset, on| {
            super::super::apply(
                s,
                &WriteOp::SetBit {
                    key: b"k".to_vec(),
                    offset,
                    on,
                    max: 16,
                },
                ctx(),
            )
            .expect("apply")
        };
        // 'a' is 0x61: bit 1 is set.
        assert_eq!(setbit(&mut s, 1, true), Outcome::Int(1));
        assert_eq!(s.get(b"k").expect("get").expect("there").meta.cas, cas);
        assert_eq!(setbit(&mut s, 6, true), Outcome::Int(0));
        let item = s.get(b"k").expect("get").expect("there");
        assert_eq!(item.value, b"c");
        assert_eq!((item.meta.flags, item.meta.expire_at), (7, meta.expire_at));
        assert!(item.meta.cas > cas);
        assert_eq!(setbit(&mut s, 127, true), Outcome::Int(0));
        assert_eq!(
            setbit(&mut s, 128, true),
            Outcome::Err(TOO_LARGE),
            "past the limit"
        );
        let ops = vec![
            FieldOp::IncrBy(f(false, 8, 0), 1, Overflow::Wrap),
            FieldOp::Get(f(false, 4, 0)),
        ];
        let out = super::super::apply(
            &mut s,
            &WriteOp::BitField {
                key: b"k".to_vec(),
                ops,
                max: 16,
            },
            ctx(),
        )
        .expect("apply");
        assert_eq!(
            out,
            Outcome::Array(vec![Outcome::Int(0x64), Outcome::Int(6)])
        );
        assert_eq!(s.get(b"k").expect("get").expect("there").meta.flags, 7);
    }

    #[test]
    fn bitop_combines_and_deletes_on_empty() {
        let mut s = ModelStore::default();
        s.put(b"a", &ItemMeta::string(1), &[b"\xff\x0f"])
            .expect("put");
        s.put(b"b", &ItemMeta::string(2), &[b"\x0f"]).expect("put");
        let run = |s: &mut ModelStore, op, srcs: &[&[u8]]| {
            super::super::apply(
                s,
                &WriteOp::BitOp {
                    op,
                    dest: b"d".to_vec(),
                    srcs: srcs.iter().map(|k| k.to_vec()).collect(),
                },
                ctx(),
            )
            .expect("apply")
        };
        let value = |s: &ModelStore| s.get(b"d").expect("get").map(|i| i.value.to_vec());
        assert_eq!(run(&mut s, BitOpKind::And, &[b"a", b"b"]), Outcome::Int(2));
        assert_eq!(value(&s), Some(b"\x0f\x00".to_vec()));
        assert_eq!(run(&mut s, BitOpKind::Or, &[b"b", b"a"]), Outcome::Int(2));
        assert_eq!(value(&s), Some(b"\xff\x0f".to_vec()));
        assert_eq!(
            run(&mut s, BitOpKind::Xor, &[b"a", b"b", b"x"]),
            Outcome::Int(2)
        );
        assert_eq!(value(&s), Some(b"\xf0\x0f".to_vec()));
        assert_eq!(run(&mut s, BitOpKind::Not, &[b"b"]), Outcome::Int(1));
        assert_eq!(value(&s), Some(b"\xf0".to_vec()));
        assert_eq!(run(&mut s, BitOpKind::Or, &[b"x", b"y"]), Outcome::Int(0));
        assert_eq!(value(&s), None);
    }
}
