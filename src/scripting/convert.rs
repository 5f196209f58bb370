//! Conversions between RESP replies and Lua values, as Redis 7.0 makes them, and the `cjson`
//! library.
//!
//! Replies to Lua (RESP2 after `redis.setresp(2)`, the default): integer -> number, bulk ->
//! string, null bulk or null array -> false, array -> table, status -> `{ok=...}`, error ->
//! `{err=...}`; RESP3 adds null -> nil, boolean -> boolean, double -> `{double=n}`, map ->
//! `{map={...}}`, set -> `{set={member=true}}`, big number -> `{big_number=s}`, verbatim ->
//! `{verbatim_string={format=, string=}}`.
//! Lua to the reply: number -> integer (truncated), string -> bulk, true -> 1 (a RESP3 boolean
//! under `setresp(3)`), false and nil -> null, `{ok=}` -> status, `{err=}` -> error, `{double=}`,
//! `{map=}`, `{set=}`, `{big_number=}`, else a table -> array up to its first nil.

use mlua::{Lua, Table, Value};

use crate::protocol::resp::enc;

/// Deepest table nesting a reply converts (a table holding itself stops here).
const DEPTH_MAX: usize = 200;

/// A Lua number as a command argument: integers without a fraction, else 17 digits.
pub fn number_text(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e17 {
        format!("{}", n as i64)
    } else {
        let s = format!("{n:.17e}");
        // Shortest round-trip form reads better and parses to the same double.
        let short = format!("{n}");
        if short.parse::<f64>().ok() == Some(n) {
            short
        } else {
            s
        }
    }
}

pub fn error_table(lua: &Lua, msg: &str) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    t.raw_set("err", msg)?;
    Ok(Value::Table(t))
}

/// Converts one RESP reply (the whole of `bytes`) to a Lua value.
pub fn reply_to_lua(lua: &Lua, bytes: &[u8]) -> mlua::Result<Value> {
    let mut pos = 0;
    parse(lua, bytes, &mut pos, 0)
}

fn line<'b>(bytes: &'b [u8], pos: &mut usize) -> &'b [u8] {
    let start = *pos;
    let end = memchr::memmem::find(&bytes[start..], b"\r\n").map_or(bytes.len(), |i| start + i);
    *pos = (end + 2).min(bytes.len());
    &bytes[start..end]
}

fn num(b: &[u8]) -> i64 {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn tagged(lua: &Lua, tag: &str, v: impl mlua::IntoLua) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    t.raw_set(tag, v)?;
    Ok(Value::Table(t))
}

fn parse(lua: &Lua, bytes: &[u8], pos: &mut usize, depth: usize) -> mlua::Result<Value> {
    if *pos >= bytes.len() || depth > DEPTH_MAX {
        return Ok(Value::Nil);
    }
    let t = bytes[*pos];
    *pos += 1;
    let head = line(bytes, pos);
    Ok(match t {
        b'+' => tagged(lua, "ok", lua.create_string(head)?)?,
        b'-' => tagged(lua, "err", lua.create_string(head)?)?,
        b':' => Value::Number(num(head) as f64),
        b'$' | b'=' => {
            let n = num(head);
            if n < 0 {
                return Ok(Value::Boolean(false));
            }
            let start = *pos;
            let end = (start + n as usize).min(bytes.len());
            *pos = (end + 2).min(bytes.len());
            let body = &bytes[start..end];
            if t == b'=' {
                let v = lua.create_table()?;
                let (fmt, text) = if body.len() >= 4 {
                    (&body[..3], &body[4..])
                } else {
                    (&b"txt"[..], body)
                };
                v.raw_set("format", lua.create_string(fmt)?)?;
                v.raw_set("string", lua.create_string(text)?)?;
                tagged(lua, "verbatim_string", v)?
            } else {
                Value::String(lua.create_string(body)?)
            }
        }
        b'*' | b'>' => {
            let n = num(head);
            if n < 0 {
                return Ok(Value::Boolean(false));
            }
            let arr = lua.create_table()?;
            for i in 0..n {
                arr.raw_set(i + 1, parse(lua, bytes, pos, depth + 1)?)?;
            }
            Value::Table(arr)
        }
        b'%' => {
            let m = lua.create_table()?;
            for _ in 0..num(head) {
                let k = parse(lua, bytes, pos, depth + 1)?;
                let v = parse(lua, bytes, pos, depth + 1)?;
                if !k.is_nil() {
                    m.raw_set(k, v)?;
                }
            }
            tagged(lua, "map", m)?
        }
        b'~' => {
            let s = lua.create_table()?;
            for _ in 0..num(head) {
                let k = parse(lua, bytes, pos, depth + 1)?;
                if !k.is_nil() {
                    s.raw_set(k, true)?;
                }
            }
            tagged(lua, "set", s)?
        }
        b'_' => Value::Nil,
        b'#' => Value::Boolean(head == b"t"),
        b',' => {
            let d = std::str::from_utf8(head)
                .ok()
                .and_then(|s| match s {
                    "inf" => Some(f64::INFINITY),
                    "-inf" => Some(f64::NEG_INFINITY),
                    s => s.parse().ok(),
                })
                .unwrap_or(f64::NAN);
            tagged(lua, "double", d)?
        }
        b'(' => tagged(lua, "big_number", lua.create_string(head)?)?,
        _ => Value::Nil,
    })
}

/// Encodes a script's return value as the reply (`v3`: the caller speaks RESP3; `lua3`: the
/// script chose RESP3 with `redis.setresp(3)`, which makes booleans RESP3 booleans).
pub fn encode_reply(out: &mut Vec<u8>, v: &Value, v3: bool, lua3: bool, depth: usize) {
    if depth > DEPTH_MAX {
        return enc::null(out, v3);
    }
    match v {
        Value::Nil => enc::null(out, v3),
        Value::Boolean(b) if lua3 => enc::boolean(out, *b, v3),
        Value::Boolean(true) => enc::int(out, 1),
        Value::Boolean(false) => enc::null(out, v3),
        Value::Integer(n) => enc::int(out, *n),
        Value::Number(n) => enc::int(out, truncate(*n)),
        Value::String(s) => enc::bulk(out, &s.as_bytes()),
        Value::Table(t) => encode_table(out, t, v3, lua3, depth),
        _ => enc::null(out, v3),
    }
}

fn truncate(n: f64) -> i64 {
    if n.is_nan() { 0 } else { n as i64 }
}

fn encode_table(out: &mut Vec<u8>, t: &Table, v3: bool, lua3: bool, depth: usize) {
    if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
        let text = e.to_string_lossy();
        return enc::error(out, &text);
    }
    if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
        return enc::simple(out, &s.to_string_lossy().replace(['\r', '\n'], " "));
    }
    if let Ok(d) = t.raw_get::<Value>("double")
        && let Some(d) = d.as_number().or_else(|| d.as_integer().map(|i| i as f64))
    {
        return enc::double(out, d, v3);
    }
    if let Ok(Value::String(s)) = t.raw_get::<Value>("big_number") {
        let b = s.as_bytes();
        if v3 {
            out.push(b'(');
            out.extend_from_slice(&b);
            out.extend_from_slice(b"\r\n");
        } else {
            enc::bulk(out, &b);
        }
        return;
    }
    if let Ok(Value::Table(m)) = t.raw_get::<Value>("map") {
        let pairs: Vec<(Value, Value)> = m.pairs::<Value, Value>().filter_map(Result::ok).collect();
        enc::map(out, pairs.len(), v3);
        for (k, v) in &pairs {
            encode_reply(out, k, v3, lua3, depth + 1);
            encode_reply(out, v, v3, lua3, depth + 1);
        }
        return;
    }
    if let Ok(Value::Table(s)) = t.raw_get::<Value>("set") {
        let keys: Vec<Value> = s
            .pairs::<Value, Value>()
            .filter_map(Result::ok)
            .map(|(k, _)| k)
            .collect();
        enc::set(out, keys.len(), v3);
        for k in &keys {
            encode_reply(out, k, v3, lua3, depth + 1);
        }
        return;
    }
    let mut items = Vec::new();
    for i in 1.. {
        match t.raw_get::<Value>(i) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(v) => items.push(v),
        }
    }
    enc::array(out, items.len());
    for v in &items {
        encode_reply(out, v, v3, lua3, depth + 1);
    }
}

/// The `cjson` library: `encode` and `decode`, through serde_json.
pub fn cjson_lib(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "encode",
        lua.create_function(|_, v: Value| {
            let j = to_json(&v, 0).map_err(mlua::Error::RuntimeError)?;
            Ok(j.to_string())
        })?,
    )?;
    t.raw_set(
        "decode",
        lua.create_function(|lua, s: mlua::LuaString| {
            let j: serde_json::Value = serde_json::from_slice(&s.as_bytes()).map_err(|e| {
                mlua::Error::RuntimeError(format!("Expected value but found invalid token: {e}"))
            })?;
            from_json(lua, &j)
        })?,
    )?;
    t.raw_set("null", Value::NULL)?;
    Ok(t)
}

fn to_json(v: &Value, depth: usize) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    if depth > 1000 {
        return Err("Cannot serialise, excessive nesting (1001)".into());
    }
    Ok(match v {
        Value::Nil => J::Null,
        Value::LightUserData(p) if p.0.is_null() => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(n) => J::from(*n),
        Value::Number(n) if n.fract() == 0.0 && n.abs() < 1e15 => J::from(*n as i64),
        Value::Number(n) => serde_json::Number::from_f64(*n)
            .map(J::Number)
            .ok_or("Cannot serialise number: must not be NaN or Inf")?,
        Value::String(s) => J::String(s.to_string_lossy()),
        Value::Table(t) => {
            let n = t.raw_len();
            let count = t.pairs::<Value, Value>().count();
            if n > 0 && count == n {
                let mut a = Vec::with_capacity(n);
                for i in 1..=n {
                    a.push(to_json(
                        &t.raw_get::<Value>(i).map_err(|e| e.to_string())?,
                        depth + 1,
                    )?);
                }
                J::Array(a)
            } else {
                let mut m = serde_json::Map::new();
                for pair in t.pairs::<Value, Value>() {
                    let (k, v) = pair.map_err(|e| e.to_string())?;
                    let key = match &k {
                        Value::String(s) => s.to_string_lossy(),
                        Value::Integer(i) => i.to_string(),
                        Value::Number(n) => number_text(*n),
                        _ => {
                            return Err(
                                "Cannot serialise table: table key must be a number or string"
                                    .into(),
                            );
                        }
                    };
                    m.insert(key, to_json(&v, depth + 1)?);
                }
                J::Object(m)
            }
        }
        other => {
            return Err(format!(
                "Cannot serialise {}: type not supported",
                other.type_name()
            ));
        }
    })
}

fn from_json(lua: &Lua, j: &serde_json::Value) -> mlua::Result<Value> {
    use serde_json::Value as J;
    Ok(match j {
        J::Null => Value::NULL,
        J::Bool(b) => Value::Boolean(*b),
        J::Number(n) => Value::Number(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Value::String(lua.create_string(s)?),
        J::Array(a) => {
            let t = lua.create_table_with_capacity(a.len(), 0)?;
            for (i, v) in a.iter().enumerate() {
                t.raw_set(i + 1, from_json(lua, v)?)?;
            }
            Value::Table(t)
        }
        J::Object(m) => {
            let t = lua.create_table()?;
            for (k, v) in m {
                t.raw_set(k.as_str(), from_json(lua, v)?)?;
            }
            Value::Table(t)
        }
    })
}
