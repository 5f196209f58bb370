//! The `bit` library (LuaBitOp 1.0, as Redis 7.0 ships it): `tobit`, `tohex`, `bnot`, `band`,
//! `bor`, `bxor`, `lshift`, `rshift`, `arshift`, `rol`, `ror`, `bswap`, on 32-bit integers.
//!
//! LuaBitOp turns a number into 32 bits by adding 2^52 + 2^51 and keeping the low word of the
//! double: the number is rounded half to even and taken modulo 2^32 (NaN and the infinities
//! give 0), which is what [`tobit`] does. Arguments are checked as `luaL_checknumber` checks
//! them, with its messages.

use mlua::{Lua, MultiValue, Table};

use super::libs::{arg, check_number};

/// A number as LuaBitOp sees it (see the module's note).
fn tobit(n: f64) -> i32 {
    (n + 6_755_399_441_055_744.0).to_bits() as u32 as i32
}

/// Argument `n` as 32 bits.
fn barg(lua: &Lua, args: &MultiValue, n: usize) -> mlua::Result<i32> {
    Ok(tobit(check_number(lua, args, n)?))
}

pub fn bit_lib(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let unary = |f: fn(i32) -> i32| {
        lua.create_function(move |lua, args: MultiValue| Ok(f(barg(lua, &args, 1)?)))
    };
    t.raw_set("tobit", unary(|a| a)?)?;
    t.raw_set("bnot", unary(|a| !a)?)?;
    t.raw_set("bswap", unary(i32::swap_bytes)?)?;
    // The first argument, then the others from the last down (LuaBitOp's order, which decides
    // which bad argument is named).
    let fold = |f: fn(i32, i32) -> i32| {
        lua.create_function(move |lua, args: MultiValue| {
            let mut acc = barg(lua, &args, 1)?;
            for i in (2..=args.len()).rev() {
                acc = f(acc, barg(lua, &args, i)?);
            }
            Ok(acc)
        })
    };
    t.raw_set("band", fold(|a, b| a & b)?)?;
    t.raw_set("bor", fold(|a, b| a | b)?)?;
    t.raw_set("bxor", fold(|a, b| a ^ b)?)?;
    let shift = |f: fn(i32, u32) -> i32| {
        lua.create_function(move |lua, args: MultiValue| {
            let a = barg(lua, &args, 1)?;
            let n = barg(lua, &args, 2)? as u32 & 31;
            Ok(f(a, n))
        })
    };
    t.raw_set("lshift", shift(|a, n| ((a as u32) << n) as i32)?)?;
    t.raw_set("rshift", shift(|a, n| ((a as u32) >> n) as i32)?)?;
    t.raw_set("arshift", shift(|a, n| a >> n)?)?;
    t.raw_set("rol", shift(|a, n| (a as u32).rotate_left(n) as i32)?)?;
    t.raw_set("ror", shift(|a, n| (a as u32).rotate_right(n) as i32)?)?;
    t.raw_set(
        "tohex",
        lua.create_function(|lua, args: MultiValue| {
            let v = barg(lua, &args, 1)? as u32;
            // Absent: 8 digits; nil is a bad argument, as in LuaBitOp.
            let n = match arg(&args, 2) {
                None => 8,
                Some(_) => barg(lua, &args, 2)?,
            };
            let upper = n < 0;
            // -INT_MIN stays negative in C: no digits.
            let width = n.checked_abs().map_or(0, |w| w.min(8)) as usize;
            let s = if upper {
                format!("{v:08X}")
            } else {
                format!("{v:08x}")
            };
            Ok(s[8 - width..].to_string())
        })?,
    )?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::tobit;

    #[test]
    fn tobit_rounds_half_to_even_modulo_2_32() {
        assert_eq!(tobit(1.5), 2);
        assert_eq!(tobit(2.5), 2);
        assert_eq!(tobit(-0.5), 0);
        assert_eq!(tobit(-1.5), -2);
        assert_eq!(tobit(4_294_967_295.0), -1);
        assert_eq!(tobit(4_294_967_301.0), 5);
        assert_eq!(tobit(f64::NAN), 0);
        assert_eq!(tobit(f64::INFINITY), 0);
        assert_eq!(tobit(-2_147_483_648.5), i32::MIN);
    }
}
