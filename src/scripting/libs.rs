//! What the libraries written in Rust share: their errors, worded and placed as Lua's C
//! libraries word and place them (`luaL_error`, `luaL_argerror`), and the argument checks of
//! Lua's auxiliary library (`luaL_checklstring`, `luaL_checknumber`, `luaL_optinteger`).
//!
//! A C function's `luaL_error` puts its caller's position in front ("user_script:3: ..."), and
//! `luaL_argerror` names the function as the caller called it ("bad argument #2 to 'unpack'").
//! Redis's cmsgpack and struct raise their errors that way, and a script sees them as strings
//! (`pcall` answers the text), so ours are [`LibError`]s carrying that text: `err_of` hands it
//! to `pcall` as a string and the reply of a script that does not catch it is Redis's.

use mlua::{Lua, MultiValue, Value};

/// The stack slots mlua's return of a callback's values takes beyond a C function's: a
/// library that returns many values stops this much short of Lua's limit (LUAI_MAXCSTACK,
/// 8000), with the C library's message for too many.
pub const MLUA_SLOTS: usize = 32;

/// An error raised by one of our libraries: the text a Lua C library would raise, and the
/// line of the script that called the library (for the reply's "on @user_script:N.").
#[derive(Debug)]
pub struct LibError {
    pub text: String,
    pub line: usize,
}

impl std::fmt::Display for LibError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for LibError {}

/// The [`LibError`] (through mlua's callback wrapping), if `e` is one.
pub fn lib_error(e: &mlua::Error) -> Option<&LibError> {
    match e {
        mlua::Error::CallbackError { cause, .. } => lib_error(cause),
        mlua::Error::ExternalError(x) => x.downcast_ref::<LibError>(),
        _ => None,
    }
}

/// The source and line of the function that called the running one, if that is a Lua one.
fn caller(lua: &Lua) -> Option<(String, usize)> {
    lua.inspect_stack(1, |d| {
        let line = d.current_line()?;
        let src = d.source().short_src?.into_owned();
        Some((src, line))
    })
    .flatten()
}

/// `luaL_error`: `msg` after the position of the function that called the running one (none
/// when that is a C function, such as `pcall`).
pub fn error(lua: &Lua, msg: impl AsRef<str>) -> mlua::Error {
    let (text, line) = match caller(lua) {
        Some((src, line)) => (format!("{src}:{line}: {}", msg.as_ref()), line),
        None => (msg.as_ref().to_string(), 0),
    };
    mlua::Error::external(LibError { text, line })
}

/// An error with no position in front (one Lua raises inside a C function, such as
/// `lua_settable`'s "table index is nil").
pub fn plain(lua: &Lua, msg: impl Into<String>) -> mlua::Error {
    let line = caller(lua).map_or(0, |(_, line)| line);
    mlua::Error::external(LibError {
        text: msg.into(),
        line,
    })
}

/// `luaL_argerror`: "bad argument #n to 'name' (msg)", the name being the one the caller used;
/// for a method call (`struct:size()`) the count leaves out the table, which as the first
/// argument is "calling 'name' on bad self".
pub fn arg_error(lua: &Lua, narg: usize, msg: impl AsRef<str>) -> mlua::Error {
    let (name, method) = lua
        .inspect_stack(0, |d| {
            let names = d.names();
            let method = names.name_what == Some("method");
            (names.name.map(|n| n.into_owned()), method)
        })
        .unwrap_or((None, false));
    let name = name.unwrap_or_else(|| "?".into());
    let msg = msg.as_ref();
    let text = match (method, narg) {
        (true, 1) => format!("calling '{name}' on bad self ({msg})"),
        (true, n) => format!("bad argument #{} to '{name}' ({msg})", n.saturating_sub(1)),
        (false, n) => format!("bad argument #{n} to '{name}' ({msg})"),
    };
    error(lua, text)
}

/// Argument `n` (1-based) of a call, or None past the last one ("no value").
pub fn arg(args: &MultiValue, n: usize) -> Option<&Value> {
    args.get(n - 1)
}

/// Lua's name of a value's type, as `luaL_typename` gives it.
fn type_name(v: Option<&Value>) -> &'static str {
    match v {
        None => "no value",
        Some(Value::Nil) => "nil",
        Some(Value::Boolean(_)) => "boolean",
        Some(Value::Integer(_) | Value::Number(_)) => "number",
        Some(Value::String(_)) => "string",
        Some(Value::Table(_)) => "table",
        Some(Value::Function(_)) => "function",
        Some(Value::Thread(_)) => "thread",
        Some(_) => "userdata",
    }
}

fn type_error(lua: &Lua, args: &MultiValue, n: usize, want: &str) -> mlua::Error {
    let got = type_name(arg(args, n));
    arg_error(lua, n, format!("{want} expected, got {got}"))
}

/// `luaL_checklstring`: a string, or a number as Lua writes it.
pub fn check_string(lua: &Lua, args: &MultiValue, n: usize) -> mlua::Result<mlua::LuaString> {
    match arg(args, n) {
        Some(v @ (Value::String(_) | Value::Integer(_) | Value::Number(_))) => {
            match lua.coerce_string(v.clone())? {
                Some(s) => Ok(s),
                None => Err(type_error(lua, args, n, "string")),
            }
        }
        _ => Err(type_error(lua, args, n, "string")),
    }
}

/// `luaL_checknumber`: a number, or a string Lua reads as one.
pub fn check_number(lua: &Lua, args: &MultiValue, n: usize) -> mlua::Result<f64> {
    match arg(args, n) {
        Some(Value::Integer(i)) => Ok(*i as f64),
        Some(Value::Number(x)) => Ok(*x),
        Some(v @ Value::String(_)) => lua
            .coerce_number(v.clone())?
            .ok_or_else(|| type_error(lua, args, n, "number")),
        _ => Err(type_error(lua, args, n, "number")),
    }
}

/// `luaL_checkinteger`: the number truncated toward zero, as Lua 5.1 converts it.
pub fn check_integer(lua: &Lua, args: &MultiValue, n: usize) -> mlua::Result<i64> {
    Ok(to_integer(check_number(lua, args, n)?))
}

/// `luaL_optinteger`: `default` when the argument is absent or nil.
pub fn opt_integer(lua: &Lua, args: &MultiValue, n: usize, default: i64) -> mlua::Result<i64> {
    match arg(args, n) {
        None | Some(Value::Nil) => Ok(default),
        _ => check_integer(lua, args, n),
    }
}

/// A Lua number as a `lua_Integer` (a C cast: truncation; out of range saturates here).
pub fn to_integer(n: f64) -> i64 {
    n as i64
}
