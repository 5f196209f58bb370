//! The `struct` library as Redis 7.0 ships it (Roberto Ierusalimschy's struct.c, with Redis's
//! bounds checks), on a 64-bit little-endian machine: `struct.pack(fmt, ...)`,
//! `struct.unpack(fmt, data [, pos])` (the values, then the position after them) and
//! `struct.size(fmt)`. No crate implements this format, so it is ours: a format walk over
//! these options, each with the size and alignment struct.c gives it:
//!
//! `>` big endian, `<` little endian (the default: the machine's), `![n]` alignment n (default
//! 8; a power of 2), `x` a zero byte, `b`/`B` signed/unsigned char, `h`/`H` short, `l`/`L`
//! long (8), `T` size_t (8), `i[n]`/`I[n]` an integer of n bytes (default 4, at most 32), `f`
//! float, `d` double, `c[n]` n chars (`c0`: pack the whole string; unpack as many as the
//! previous value read), `s` a zero-terminated string, ` ` nothing.
//!
//! Numbers go through C's conversions of a double to `long`/`unsigned long`, as the C library
//! does on x86-64, so out-of-range values come out as Redis's do.

use mlua::{Lua, MultiValue, Table, Value};

use super::libs::{self, MLUA_SLOTS, arg_error, check_number, check_string, opt_integer};

/// Largest size of an `i`/`I` option.
const MAXINTSIZE: usize = 32;
/// The default of `!`: the alignment of a double.
const MAXALIGN: usize = 8;
/// Lua 5.1's LUAI_MAXCSTACK (unpack checks for room for each result).
const MAX_STACK: usize = 8000;

pub fn struct_lib(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("pack", lua.create_function(pack)?)?;
    t.raw_set("unpack", lua.create_function(unpack)?)?;
    t.raw_set("size", lua.create_function(size)?)?;
    Ok(t)
}

struct Header {
    big: bool,
    align: usize,
}

impl Default for Header {
    fn default() -> Header {
        Header {
            big: false,
            align: 1,
        }
    }
}

/// The format as C reads it: up to its first NUL.
struct Fmt<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Fmt<'a> {
    fn new(b: &'a [u8]) -> Fmt<'a> {
        let end = memchr::memchr(0, b).unwrap_or(b.len());
        Fmt {
            b: &b[..end],
            at: 0,
        }
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.b.get(self.at).copied();
        self.at += c.is_some() as usize;
        c
    }

    /// The digits after an option, or `default`; more than an `int` holds is an error.
    fn num(&mut self, lua: &Lua, default: usize) -> mlua::Result<usize> {
        if !self.b.get(self.at).is_some_and(u8::is_ascii_digit) {
            return Ok(default);
        }
        let mut a: i32 = 0;
        while let Some(&d) = self.b.get(self.at).filter(|c| c.is_ascii_digit()) {
            let d = (d - b'0') as i32;
            if a > i32::MAX / 10 || a * 10 > i32::MAX - d {
                return Err(libs::error(lua, "integral size overflow"));
            }
            a = a * 10 + d;
            self.at += 1;
        }
        Ok(a as usize)
    }
}

/// How many bytes an option stands for (0 for those that are no value).
fn optsize(lua: &Lua, opt: u8, fmt: &mut Fmt<'_>) -> mlua::Result<usize> {
    Ok(match opt {
        b'b' | b'B' | b'x' => 1,
        b'h' | b'H' => 2,
        b'l' | b'L' | b'T' | b'd' => 8,
        b'f' => 4,
        b'c' => fmt.num(lua, 1)?,
        b'i' | b'I' => {
            let size = fmt.num(lua, 4)?;
            if size > MAXINTSIZE {
                return Err(libs::error(
                    lua,
                    format!("integral size {size} is larger than limit of {MAXINTSIZE}"),
                ));
            }
            size
        }
        _ => 0,
    })
}

/// Padding before a value of `size` bytes at offset `len` (struct.c's formula, which assumes
/// a power of two).
fn gettoalign(len: usize, h: &Header, opt: u8, size: usize) -> usize {
    if size == 0 || opt == b'c' {
        return 0;
    }
    let size = size.min(h.align);
    size.wrapping_sub(len & size.wrapping_sub(1)) & size.wrapping_sub(1)
}

/// The options that are not values: endianness, alignment, spaces; anything else is invalid.
fn control(lua: &Lua, opt: u8, fmt: &mut Fmt<'_>, h: &mut Header) -> mlua::Result<()> {
    match opt {
        b' ' => {}
        b'>' => h.big = true,
        b'<' => h.big = false,
        b'!' => {
            let a = fmt.num(lua, MAXALIGN)?;
            if !a.is_power_of_two() {
                return Err(libs::error(
                    lua,
                    format!("alignment {a} is not a power of 2"),
                ));
            }
            h.align = a;
        }
        _ => {
            return Err(arg_error(
                lua,
                1,
                format!("invalid format option '{}'", opt as char),
            ));
        }
    }
    Ok(())
}

/// C's conversion of a double to `unsigned long` as x86-64 compilers emit it (the source's
/// out-of-range cases are undefined; these are the values Redis's build gives).
fn c_to_u64(x: f64) -> u64 {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if x.is_nan() {
        1 << 63
    } else if x < TWO_63 {
        c_to_i64(x) as u64
    } else if x < 2.0 * TWO_63 {
        ((x - TWO_63) as i64 as u64) ^ (1 << 63)
    } else {
        0
    }
}

/// C's conversion of a double to `long` on x86-64: out of range (or NaN) is i64::MIN.
fn c_to_i64(x: f64) -> i64 {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if x.is_nan() || !(-TWO_63..TWO_63).contains(&x) {
        i64::MIN
    } else {
        x as i64
    }
}

fn put_integer(out: &mut Vec<u8>, n: f64, big: bool, size: usize) {
    let mut value = if n < 0.0 {
        c_to_i64(n) as u64
    } else {
        c_to_u64(n)
    };
    let mut bytes = [0u8; MAXINTSIZE];
    for b in bytes.iter_mut().take(size) {
        *b = (value & 0xff) as u8;
        value >>= 8;
    }
    let bytes = &mut bytes[..size];
    if big {
        bytes.reverse();
    }
    out.extend_from_slice(bytes);
}

fn pack(lua: &Lua, mut args: MultiValue) -> mlua::Result<mlua::LuaString> {
    let fmt_s = check_string(lua, &args, 1)?;
    // struct.c pushes a nil after the arguments: a missing value reads as that nil.
    args.push_back(Value::Nil);
    let fmt_b = fmt_s.as_bytes();
    let mut fmt = Fmt::new(&fmt_b);
    let mut h = Header::default();
    let mut argn = 2;
    let mut out: Vec<u8> = Vec::new();
    while let Some(opt) = fmt.next() {
        let mut size = optsize(lua, opt, &mut fmt)?;
        let pad = gettoalign(out.len(), &h, opt, size);
        out.resize(out.len() + pad, 0);
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let n = check_number(lua, &args, argn)?;
                argn += 1;
                put_integer(&mut out, n, h.big, size);
            }
            b'x' => out.push(0),
            b'f' => {
                let n = check_number(lua, &args, argn)? as f32;
                argn += 1;
                out.extend_from_slice(&if h.big {
                    n.to_be_bytes()
                } else {
                    n.to_le_bytes()
                });
            }
            b'd' => {
                let n = check_number(lua, &args, argn)?;
                argn += 1;
                out.extend_from_slice(&if h.big {
                    n.to_be_bytes()
                } else {
                    n.to_le_bytes()
                });
            }
            b'c' | b's' => {
                let s = check_string(lua, &args, argn)?;
                argn += 1;
                let s = s.as_bytes();
                if size == 0 {
                    size = s.len();
                }
                if s.len() < size {
                    // struct.c names the argument after this one.
                    return Err(arg_error(lua, argn, "string too short"));
                }
                out.extend_from_slice(&s[..size]);
                if opt == b's' {
                    out.push(0);
                }
            }
            _ => control(lua, opt, &mut fmt, &mut h)?,
        }
    }
    lua.create_string(&out)
}

fn get_integer(b: &[u8], big: bool, signed: bool) -> f64 {
    let fold = |l: u64, &byte: &u8| (l << 8) | byte as u64;
    let l = if big {
        b.iter().fold(0, fold)
    } else {
        b.iter().rev().fold(0, fold)
    };
    if !signed {
        return l as f64;
    }
    // The shift as x86 takes it (the count modulo 64; the C is undefined past 63).
    let shift = ((b.len() as i64) * 8 - 1) & 63;
    let mask = u64::MAX << shift;
    let l = if l & mask != 0 { l | mask } else { l };
    l as i64 as f64
}

fn unpack(lua: &Lua, args: MultiValue) -> mlua::Result<MultiValue> {
    let fmt_s = check_string(lua, &args, 1)?;
    let data_s = check_string(lua, &args, 2)?;
    let (fmt_b, data) = (fmt_s.as_bytes(), data_s.as_bytes());
    let ld = data.len();
    // size_t in C: a negative position wraps to a huge one (and then is past the data).
    let pos = opt_integer(lua, &args, 3, 1)? as u64 as usize;
    if pos == 0 {
        return Err(arg_error(lua, 3, "offset must be 1 or greater"));
    }
    let mut pos = pos - 1;
    let mut fmt = Fmt::new(&fmt_b);
    let mut h = Header::default();
    let mut out: Vec<Value> = Vec::new();
    let too_short = |lua: &Lua| arg_error(lua, 2, "data string too short");
    while let Some(opt) = fmt.next() {
        let mut size = optsize(lua, opt, &mut fmt)?;
        pos = pos.wrapping_add(gettoalign(pos, &h, opt, size));
        if size > ld || pos > ld - size {
            return Err(too_short(lua));
        }
        // (mlua takes a few slots more to return them: this stops a few short of Redis.)
        if args.len() + out.len() + 2 + MLUA_SLOTS > MAX_STACK {
            return Err(libs::error(lua, "stack overflow (too many results)"));
        }
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let signed = opt.is_ascii_lowercase();
                out.push(Value::Number(get_integer(
                    &data[pos..pos + size],
                    h.big,
                    signed,
                )));
            }
            b'x' => {}
            b'f' => {
                let mut b = [0u8; 4];
                b.copy_from_slice(&data[pos..pos + 4]);
                let f = if h.big {
                    f32::from_be_bytes(b)
                } else {
                    f32::from_le_bytes(b)
                };
                out.push(Value::Number(f as f64));
            }
            b'd' => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&data[pos..pos + 8]);
                let d = if h.big {
                    f64::from_be_bytes(b)
                } else {
                    f64::from_le_bytes(b)
                };
                out.push(Value::Number(d));
            }
            b'c' => {
                if size == 0 {
                    let prev = match out.last() {
                        Some(v) => lua.coerce_number(v.clone())?,
                        None => None,
                    };
                    let Some(n) = prev else {
                        return Err(libs::error(lua, "format 'c0' needs a previous size"));
                    };
                    size = c_to_u64(n) as usize;
                    out.pop();
                    if size > ld || pos > ld - size {
                        return Err(too_short(lua));
                    }
                }
                out.push(Value::String(lua.create_string(&data[pos..pos + size])?));
            }
            b's' => {
                let Some(end) = memchr::memchr(0, &data[pos..]) else {
                    return Err(libs::error(lua, "unfinished string in data"));
                };
                out.push(Value::String(lua.create_string(&data[pos..pos + end])?));
                size = end + 1;
            }
            _ => control(lua, opt, &mut fmt, &mut h)?,
        }
        pos += size;
    }
    out.push(Value::Number(pos as f64 + 1.0));
    Ok(out.into_iter().collect())
}

fn size(lua: &Lua, args: MultiValue) -> mlua::Result<f64> {
    let fmt_s = check_string(lua, &args, 1)?;
    let fmt_b = fmt_s.as_bytes();
    let mut fmt = Fmt::new(&fmt_b);
    let mut h = Header::default();
    let mut pos: usize = 0;
    while let Some(opt) = fmt.next() {
        let size = optsize(lua, opt, &mut fmt)?;
        pos = pos.wrapping_add(gettoalign(pos, &h, opt, size));
        if opt == b's' {
            return Err(arg_error(lua, 1, "option 's' has no fixed size"));
        } else if opt == b'c' && size == 0 {
            return Err(arg_error(lua, 1, "option 'c0' has no fixed size"));
        }
        if !opt.is_ascii_alphanumeric() {
            control(lua, opt, &mut fmt, &mut h)?;
        }
        pos = pos.wrapping_add(size);
    }
    Ok(pos as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_as_struct_c_writes_and_reads_them() {
        let mut out = Vec::new();
        put_integer(&mut out, -2.0, false, 2);
        assert_eq!(out, [0xfe, 0xff]);
        out.clear();
        put_integer(&mut out, 258.0, true, 4);
        assert_eq!(out, [0, 0, 1, 2]);
        out.clear();
        // Wider than a long: the bytes past the eighth are zero, even for a negative number.
        put_integer(&mut out, -1.0, false, 10);
        assert_eq!(out, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0]);
        assert_eq!(get_integer(&[0xfe, 0xff], false, true), -2.0);
        assert_eq!(get_integer(&[0xfe, 0xff], false, false), 65534.0);
        assert_eq!(get_integer(&[0, 0, 1, 2], true, true), 258.0);
        assert_eq!(get_integer(&[0x80], true, true), -128.0);
    }

    #[test]
    fn alignment_is_struct_c_formula() {
        let h = Header {
            big: false,
            align: 8,
        };
        assert_eq!(gettoalign(1, &h, b'i', 4), 3);
        assert_eq!(gettoalign(4, &h, b'i', 4), 0);
        assert_eq!(gettoalign(1, &h, b'd', 8), 7);
        assert_eq!(gettoalign(1, &h, b'c', 8), 0);
        let h = Header {
            big: false,
            align: 2,
        };
        assert_eq!(gettoalign(1, &h, b'd', 8), 1);
    }

    #[test]
    fn doubles_convert_as_c_does_on_x86_64() {
        assert_eq!(c_to_u64(-1.0), u64::MAX);
        assert_eq!(c_to_u64(1e19), 10_000_000_000_000_000_000);
        assert_eq!(c_to_u64(1e20), 0);
        assert_eq!(c_to_u64(f64::NAN), 1 << 63);
        assert_eq!(c_to_i64(-1e30), i64::MIN);
    }
}
