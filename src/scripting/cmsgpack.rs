//! The `cmsgpack` library as Redis 7.0 ships it (lua-cmsgpack 0.4.0 on Lua 5.1): `pack`,
//! `unpack`, `unpack_one` and `unpack_limit`. The MessagePack encoding of each value (which
//! marker for which integer, string length, array or map size) is the `rmp` crate's, which
//! picks the smallest form exactly as lua-cmsgpack does; the mapping between Lua values and
//! MessagePack is ours, following Redis's:
//!
//! - pack: a number that is an integer in the int64 range -> the smallest integer form
//!   (non-negative ones as unsigned), another number -> float 32 when it is exact as one, else
//!   float 64; a string -> str (never bin); a boolean; a table whose keys are exactly 1..n ->
//!   array (so `{}` is an empty array), any other table -> map; anything else -> nil. Tables
//!   nested 16 deep become nil (cycles end there). Several arguments: their packs concatenated.
//! - unpack: every value of the input, in order; integers and floats -> numbers (uint 64 read
//!   as a signed 64-bit integer, as Redis's Lua does); str 8/16/32 -> string; array -> table
//!   1..n; map -> table; bin, ext and 0xc1 -> "Bad data format in input."; short input ->
//!   "Missing bytes in input.".
//! - `unpack_one(s [, offset])` and `unpack_limit(s, limit [, offset])`: the offset after what
//!   was read (-1 once the input is used up) first, then up to `limit` values (one).

use mlua::{Lua, MultiValue, Table, Value};
use rmp::Marker;
use rmp::decode::RmpRead;

use super::libs::{self, MLUA_SLOTS, arg_error, check_integer, check_string, opt_integer};

/// Tables nested deeper are packed as nil (lua-cmsgpack's LUACMSGPACK_MAX_NESTING).
const MAX_NESTING: usize = 16;

/// Lua 5.1's LUAI_MAXCSTACK: the most stack slots a C function may use; lua-cmsgpack checks
/// for one more slot before each value it decodes, so a long stream or deep nesting fails
/// there, with its message.
const MAX_STACK: usize = 8000;

const TOO_MANY: &str =
    "stack overflow (too many return values at once; use unpack_one or unpack_limit instead.)";

pub fn cmsgpack_lib(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("pack", lua.create_function(pack)?)?;
    t.raw_set(
        "unpack",
        lua.create_function(|lua, args: MultiValue| {
            let base = args.len();
            unpack_full(lua, &args, 0, 0, base)
        })?,
    )?;
    t.raw_set(
        "unpack_one",
        lua.create_function(|lua, args: MultiValue| {
            let offset = opt_integer(lua, &args, 2, 0)?;
            unpack_full(lua, &args, 1, offset, 1)
        })?,
    )?;
    t.raw_set(
        "unpack_limit",
        lua.create_function(|lua, args: MultiValue| {
            let limit = check_integer(lua, &args, 2)?;
            let offset = opt_integer(lua, &args, 3, 0)?;
            unpack_full(lua, &args, limit, offset, 1)
        })?,
    )?;
    t.raw_set("_NAME", "cmsgpack")?;
    t.raw_set("_VERSION", "lua-cmsgpack 0.4.0")?;
    t.raw_set("_COPYRIGHT", "Copyright (C) 2012, Salvatore Sanfilippo")?;
    t.raw_set("_DESCRIPTION", "MessagePack C implementation for Lua")?;
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// pack

fn pack(lua: &Lua, args: MultiValue) -> mlua::Result<mlua::LuaString> {
    if args.is_empty() {
        return Err(arg_error(lua, 0, "MessagePack pack needs input."));
    }
    let mut out = Vec::new();
    for v in args.iter() {
        encode(&mut out, v, 0)?;
    }
    lua.create_string(&out)
}

/// Lua 5.1 numbers are doubles: lua-cmsgpack packs one as an integer when a cast to int64
/// gives it back (not infinite, not NaN, no fraction, within int64).
fn as_int64(n: f64) -> Option<i64> {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    (n.is_finite() && n.trunc() == n && (-TWO_63..TWO_63).contains(&n)).then_some(n as i64)
}

fn encode(out: &mut Vec<u8>, v: &Value, level: usize) -> mlua::Result<()> {
    // Writing to a Vec cannot fail: the results are ignored.
    match v {
        Value::String(s) => {
            let b = s.as_bytes();
            let _ = rmp::encode::write_str_len(out, b.len() as u32);
            out.extend_from_slice(&b);
        }
        Value::Boolean(b) => {
            let _ = rmp::encode::write_bool(out, *b);
        }
        Value::Integer(i) => encode_number(out, *i as f64),
        Value::Number(n) => encode_number(out, *n),
        Value::Table(t) if level < MAX_NESTING => encode_table(out, t, level)?,
        _ => {
            let _ = rmp::encode::write_nil(out);
        }
    }
    Ok(())
}

fn encode_number(out: &mut Vec<u8>, n: f64) {
    match as_int64(n) {
        Some(i) => {
            let _ = rmp::encode::write_sint(out, i);
        }
        // Float 32 when the double survives the round trip through one (infinities do).
        None if (n as f32) as f64 == n => {
            let _ = rmp::encode::write_f32(out, n as f32);
        }
        None => {
            let _ = rmp::encode::write_f64(out, n);
        }
    }
}

/// lua-cmsgpack's test for an array: every key a positive number that is a C `int`, and the
/// largest key equal to the number of keys (so the keys are 1..n; `{}` is an array too).
fn is_array(t: &Table) -> mlua::Result<bool> {
    let (mut count, mut max) = (0i64, 0i64);
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let n = match k {
            Value::Integer(i) => i as f64,
            Value::Number(n) => n,
            _ => return Ok(false),
        };
        if n <= 0.0 || n > i32::MAX as f64 || n.trunc() != n {
            return Ok(false);
        }
        max = max.max(n as i64);
        count += 1;
    }
    Ok(max == count)
}

fn encode_table(out: &mut Vec<u8>, t: &Table, level: usize) -> mlua::Result<()> {
    if is_array(t)? {
        let len = t.raw_len();
        let _ = rmp::encode::write_array_len(out, len as u32);
        for i in 1..=len {
            // lua_gettable: an __index metamethod answers as it would in Lua.
            let v: Value = t.get(i)?;
            encode(out, &v, level + 1)?;
        }
    } else {
        let pairs: Vec<(Value, Value)> = t.pairs::<Value, Value>().collect::<mlua::Result<_>>()?;
        let _ = rmp::encode::write_map_len(out, pairs.len() as u32);
        for (k, v) in &pairs {
            encode(out, k, level + 1)?;
            encode(out, v, level + 1)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// unpack

enum Fail {
    /// The input ends inside a value.
    Eof,
    /// A byte that starts no value lua-cmsgpack reads (bin, ext, 0xc1).
    BadFormat,
    /// A Lua error (the stack limit, memory, a nil or NaN map key).
    Lua(mlua::Error),
}

impl From<mlua::Error> for Fail {
    fn from(e: mlua::Error) -> Fail {
        Fail::Lua(e)
    }
}

/// `unpack_full`: `limit` and `offset` both 0 decode everything and answer only the values;
/// else at most `limit` values from byte `offset`, after the next offset. `base` is how many
/// stack slots the arguments hold (for the stack limit).
fn unpack_full(
    lua: &Lua,
    args: &MultiValue,
    limit: i64,
    offset: i64,
    base: usize,
) -> mlua::Result<MultiValue> {
    let s = check_string(lua, args, 1)?;
    let data = s.as_bytes();
    let len = data.len();
    let all = limit == 0 && offset == 0;
    if offset < 0 || limit < 0 {
        // Redis's message names the input's length as the limit.
        return Err(libs::error(
            lua,
            format!(
                "Invalid request to unpack with offset of {} and limit of {}.",
                offset as i32, len as i32
            ),
        ));
    }
    if offset as u64 > len as u64 {
        return Err(libs::error(
            lua,
            format!(
                "Start offset {} greater than input length {}.",
                offset as i32, len as i32
            ),
        ));
    }
    let limit = if all { i32::MAX as i64 } else { limit };
    let mut rd: &[u8] = &data[offset as usize..];
    let mut values = Vec::new();
    // mlua needs a few stack slots more than the C function did to return the values: values
    // that come close to Lua's limit (Redis returns at most 7999 at once) fail here, a few
    // short of that, with Redis's message for too many.
    let extra = if all { 1 } else { 2 } + MLUA_SLOTS;
    while !rd.is_empty() && (values.len() as i64) < limit {
        let used = base + values.len();
        if used + extra + 1 > MAX_STACK {
            return Err(libs::error(lua, TOO_MANY));
        }
        match decode(lua, &mut rd, used) {
            Ok(v) => values.push(v),
            Err(Fail::Eof) => return Err(libs::error(lua, "Missing bytes in input.")),
            Err(Fail::BadFormat) => return Err(libs::error(lua, "Bad data format in input.")),
            Err(Fail::Lua(e)) => return Err(e),
        }
    }
    let mut out = MultiValue::with_capacity(values.len() + 1);
    if !all {
        let next = if rd.is_empty() {
            -1
        } else {
            (len - rd.len()) as i64
        };
        out.push_back(Value::Integer(next));
    }
    out.extend(values);
    Ok(out)
}

/// One value from the front of `rd`; `used` is how many stack slots lua-cmsgpack would hold.
fn decode(lua: &Lua, rd: &mut &[u8], used: usize) -> Result<Value, Fail> {
    if rd.is_empty() {
        return Err(Fail::Eof);
    }
    if used + 1 > MAX_STACK {
        return Err(Fail::Lua(libs::error(lua, TOO_MANY)));
    }
    let marker = rmp::decode::read_marker(rd).map_err(|_| Fail::Eof)?;
    let num = |n: f64| Ok(Value::Number(n));
    match marker {
        Marker::FixPos(n) => num(n as f64),
        Marker::FixNeg(n) => num(n as f64),
        Marker::Null => Ok(Value::Nil),
        Marker::True => Ok(Value::Boolean(true)),
        Marker::False => Ok(Value::Boolean(false)),
        Marker::U8 => num(rd.read_data_u8().map_err(|_| Fail::Eof)? as f64),
        Marker::U16 => num(rd.read_data_u16().map_err(|_| Fail::Eof)? as f64),
        Marker::U32 => num(rd.read_data_u32().map_err(|_| Fail::Eof)? as f64),
        // Pushed as a lua_Integer (signed): the top half of the range reads negative.
        Marker::U64 => num(rd.read_data_u64().map_err(|_| Fail::Eof)? as i64 as f64),
        Marker::I8 => num(rd.read_data_i8().map_err(|_| Fail::Eof)? as f64),
        Marker::I16 => num(rd.read_data_i16().map_err(|_| Fail::Eof)? as f64),
        Marker::I32 => num(rd.read_data_i32().map_err(|_| Fail::Eof)? as f64),
        Marker::I64 => num(rd.read_data_i64().map_err(|_| Fail::Eof)? as f64),
        Marker::F32 => num(rd.read_data_f32().map_err(|_| Fail::Eof)? as f64),
        Marker::F64 => num(rd.read_data_f64().map_err(|_| Fail::Eof)?),
        Marker::FixStr(n) => string(lua, rd, n as usize),
        Marker::Str8 => {
            let n = rd.read_data_u8().map_err(|_| Fail::Eof)?;
            string(lua, rd, n as usize)
        }
        Marker::Str16 => {
            let n = rd.read_data_u16().map_err(|_| Fail::Eof)?;
            string(lua, rd, n as usize)
        }
        Marker::Str32 => {
            let n = rd.read_data_u32().map_err(|_| Fail::Eof)?;
            string(lua, rd, n as usize)
        }
        Marker::FixArray(n) => array(lua, rd, n as usize, used),
        Marker::Array16 => {
            let n = rd.read_data_u16().map_err(|_| Fail::Eof)?;
            array(lua, rd, n as usize, used)
        }
        Marker::Array32 => {
            let n = rd.read_data_u32().map_err(|_| Fail::Eof)?;
            array(lua, rd, n as usize, used)
        }
        Marker::FixMap(n) => map(lua, rd, n as usize, used),
        Marker::Map16 => {
            let n = rd.read_data_u16().map_err(|_| Fail::Eof)?;
            map(lua, rd, n as usize, used)
        }
        Marker::Map32 => {
            let n = rd.read_data_u32().map_err(|_| Fail::Eof)?;
            map(lua, rd, n as usize, used)
        }
        _ => Err(Fail::BadFormat),
    }
}

fn string(lua: &Lua, rd: &mut &[u8], n: usize) -> Result<Value, Fail> {
    if rd.len() < n {
        return Err(Fail::Eof);
    }
    let (s, rest) = rd.split_at(n);
    *rd = rest;
    Ok(Value::String(lua.create_string(s)?))
}

/// Tables start empty and grow as lua-cmsgpack's do (`lua_newtable`), so `pairs` visits a
/// decoded table in the order it does in Redis (and a declared length allocates nothing).
fn array(lua: &Lua, rd: &mut &[u8], n: usize, used: usize) -> Result<Value, Fail> {
    // lua-cmsgpack checks for room for the index once the table is on the stack.
    if used + 2 > MAX_STACK {
        return Err(Fail::Lua(libs::error(
            lua,
            "stack overflow (in function mp_decode_to_lua_array)",
        )));
    }
    let t = lua.create_table()?;
    for i in 1..=n {
        // The table and the index are on the stack while the element decodes.
        let v = decode(lua, rd, used + 2)?;
        t.raw_set(i, v)?;
    }
    Ok(Value::Table(t))
}

fn map(lua: &Lua, rd: &mut &[u8], n: usize, used: usize) -> Result<Value, Fail> {
    let t = lua.create_table()?;
    for _ in 0..n {
        let k = decode(lua, rd, used + 1)?;
        let v = decode(lua, rd, used + 2)?;
        match &k {
            // lua_settable's own errors, raised inside the C function: no position.
            Value::Nil => return Err(Fail::Lua(libs::plain(lua, "table index is nil"))),
            Value::Number(x) if x.is_nan() => {
                return Err(Fail::Lua(libs::plain(lua, "table index is NaN")));
            }
            _ => t.raw_set(k, v)?,
        }
    }
    Ok(Value::Table(t))
}
