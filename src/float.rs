//! INCRBYFLOAT and HINCRBYFLOAT arithmetic as Redis 7.0 does it: both operands are parsed with
//! `strtold` into the platform's `long double` (x86-64: 80-bit extended precision, a 64-bit
//! mantissa), added there, and the sum written with `%.17Lf` less its trailing zeros, never as
//! `-0`. Rust has no `long double`, so the arithmetic runs in `csrc/longdouble.c` (built by
//! `build.rs`), which makes the results the same as Redis's on the same platform: `0.1 + 0.2`
//! is `0.3`, and adding then subtracting `0.024390243902439025` leaves exactly `0`.

use std::os::raw::{c_char, c_int, c_long};

unsafe extern "C" {
    fn mk_ld_check(s: *const c_char, len: usize) -> c_int;
    fn mk_ld_add(
        a: *const c_char,
        alen: usize,
        b: *const c_char,
        blen: usize,
        out: *mut c_char,
        outlen: usize,
    ) -> c_long;
}

/// The longest text a sum may have (Redis's `MAX_LONG_DOUBLE_CHARS`).
const MAX_TEXT: usize = 5 * 1024;

/// How a float argument parses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatArg {
    /// Not a float (`strtold` refuses it, or leaves bytes over, or it is NaN or out of range).
    Invalid,
    /// A finite float.
    Finite,
    /// `inf` or `-inf`.
    Infinite,
}

/// Classifies `b` as `strtold` with Redis's checks would (no leading space, nothing after the
/// number, no NaN; hex floats and `inf` are accepted).
pub fn check(b: &[u8]) -> FloatArg {
    // SAFETY: the C side reads exactly `len` bytes from the pointer and keeps nothing.
    match unsafe { mk_ld_check(b.as_ptr().cast(), b.len()) } {
        1 => FloatArg::Finite,
        2 => FloatArg::Infinite,
        _ => FloatArg::Invalid,
    }
}

/// Why a sum has no text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddError {
    /// The stored value is not a float.
    BadValue,
    /// The increment is not a float.
    BadIncrement,
    /// The sum is NaN or infinite.
    NotFinite,
    /// The sum's text would be longer than 5 KiB (cannot happen with an 80-bit or 128-bit
    /// long double, whose largest value has 4,933 digits; kept for platforms without them).
    TooLong,
}

/// `value + incr` in long double, as Redis's text (`%.17Lf`, trailing zeros removed, no `-0`).
pub fn add(value: &[u8], incr: &[u8]) -> Result<Vec<u8>, AddError> {
    let mut out = vec![0u8; MAX_TEXT];
    // SAFETY: both inputs are read for exactly their lengths; `out` is writable for its whole
    // length, and the C side writes at most `outlen` bytes (snprintf) and returns how many.
    let n = unsafe {
        mk_ld_add(
            value.as_ptr().cast(),
            value.len(),
            incr.as_ptr().cast(),
            incr.len(),
            out.as_mut_ptr().cast(),
            out.len(),
        )
    };
    match n {
        -1 => Err(AddError::BadValue),
        -2 => Err(AddError::BadIncrement),
        -3 => Err(AddError::NotFinite),
        n if n < 0 || n as usize > out.len() => Err(AddError::TooLong),
        n => {
            out.truncate(n as usize);
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(a: &str, b: &str) -> String {
        String::from_utf8(add(a.as_bytes(), b.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn sums_read_as_redis_writes_them() {
        assert_eq!(sum("0", "0.024390243902439025"), "0.02439024390243902");
        assert_eq!(sum("0.02439024390243902", "-0.024390243902439025"), "0");
        assert_eq!(sum("0.1", "0.2"), "0.3");
        assert_eq!(sum("10.5", "0.1"), "10.6");
        assert_eq!(sum("5.0e3", "2.0e2"), "5200");
        assert_eq!(sum("-0.5", "0.5"), "0");
        assert_eq!(sum("1", "1.0000000000000001"), "2.0000000000000001");
        assert_eq!(sum("2.0000000000000001", "-1e-18"), "2.0000000000000001");
        assert_eq!(sum("0", "-1e-18"), "0");
        assert_eq!(sum("16", "0x10"), "32");
        assert_eq!(sum("0", "1e-400"), "0");
        assert_eq!(sum("1e308", "1e308").len(), 309);
    }

    #[test]
    fn refusals() {
        assert_eq!(add(b"abc", b"1"), Err(AddError::BadValue));
        assert_eq!(add(b"1", b" 1"), Err(AddError::BadIncrement));
        assert_eq!(add(b"1", b"1 "), Err(AddError::BadIncrement));
        assert_eq!(add(b"1", b""), Err(AddError::BadIncrement));
        assert_eq!(add(b"1", b"nan"), Err(AddError::BadIncrement));
        assert_eq!(add(b"1", b"1e99999"), Err(AddError::BadIncrement));
        assert_eq!(add(b"1", b"inf"), Err(AddError::NotFinite));
        assert_eq!(add(b"1e4000", b"1e4000").map(|t| t.len()), Ok(4001));
        assert_eq!(add(b"1e5200", b"1"), Err(AddError::BadValue));
        assert_eq!(add(b"1e4932", b"1e4932"), Err(AddError::NotFinite));
        assert_eq!(check(b"inf"), FloatArg::Infinite);
        assert_eq!(check(b"-1.5e3"), FloatArg::Finite);
        assert_eq!(check(b"1.5x"), FloatArg::Invalid);
        // A NUL byte inside the value ends C's string, not the value (SETRANGE can put one).
        assert_eq!(add(b"1\x002", b"1"), Err(AddError::BadValue));
        assert_eq!(check(b"1\x00"), FloatArg::Invalid);
    }
}
