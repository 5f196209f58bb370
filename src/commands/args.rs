//! A request's arguments and the parsers every command shares: keys, integers, expiry times,
//! SCAN-family options, Redis's glob, and the error texts Redis answers with.

use std::ops::Range;

use crate::protocol::resp::{enc, parse_i64};
use crate::storage::MAX_KEY;

/// A request's arguments, copied out of the input buffer (a command queued by MULTI).
#[derive(Debug, Clone, Default)]
pub struct OwnedArgs {
    buf: Vec<u8>,
    ranges: Vec<Range<usize>>,
}

impl OwnedArgs {
    pub fn new(args: Args<'_>) -> OwnedArgs {
        let mut o = OwnedArgs::default();
        for i in 0..args.len() {
            let a = args.get(i);
            o.ranges.push(o.buf.len()..o.buf.len() + a.len());
            o.buf.extend_from_slice(a);
        }
        o
    }

    pub fn args(&self) -> Args<'_> {
        Args {
            src: &self.buf,
            ranges: &self.ranges,
        }
    }

    /// What it costs to hold (its bytes, plus its ranges).
    pub fn cost(&self) -> usize {
        self.buf.len() + self.ranges.len() * std::mem::size_of::<Range<usize>>()
    }
}

/// The arguments of one request (argument 0 is the command name).
#[derive(Clone, Copy)]
pub struct Args<'a> {
    src: &'a [u8],
    ranges: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    /// Arguments `src[r]` for each range `r` (argument 0 the command name).
    pub fn new(src: &'a [u8], ranges: &'a [Range<usize>]) -> Args<'a> {
        Args { src, ranges }
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn get(&self, i: usize) -> &'a [u8] {
        &self.src[self.ranges[i].clone()]
    }

    /// Argument `i` equals `word`, ignoring ASCII case.
    pub fn is(&self, i: usize, word: &str) -> bool {
        self.get(i).eq_ignore_ascii_case(word.as_bytes())
    }
}

pub const SYNTAX: &str = "ERR syntax error";
/// The message Redis gives for a command on the wrong kind of value.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
pub const BAD_KEY: &str = "ERR invalid key: memkeep keys are 1 to 511 bytes";

pub fn key_ok(k: &[u8]) -> Result<(), String> {
    if k.is_empty() || k.len() > MAX_KEY {
        Err(BAD_KEY.into())
    } else {
        Ok(())
    }
}

pub fn int_arg(b: &[u8]) -> Result<i64, String> {
    parse_i64(b).ok_or_else(|| NOT_INTEGER.into())
}

/// An expiry given relative (`unit_ms` per unit) or absolute, as an absolute unix ms; Redis's
/// "invalid expire time" when it is not positive (for SET-style options) or overflows.
pub fn expire_arg(
    b: &[u8],
    unit_ms: i64,
    absolute: bool,
    now_ms: u64,
    cmd: &str,
    positive: bool,
) -> Result<u64, String> {
    let n = int_arg(b)?;
    let invalid = || format!("ERR invalid expire time in '{cmd}' command");
    if positive && n <= 0 {
        return Err(invalid());
    }
    let ms = n.checked_mul(unit_ms).ok_or_else(invalid)?;
    let at = if absolute {
        ms
    } else {
        ms.checked_add(now_ms as i64).ok_or_else(invalid)?
    };
    // A time at or before now (including negative) means "already expired".
    Ok(if at <= 0 { 1 } else { at as u64 })
}

/// Redis 7's message, quoting the name and the first arguments (at most 128 bytes each).
pub fn unknown_command(args: Args<'_>) -> String {
    let clip = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(128)]).into_owned();
    let mut msg = format!(
        "ERR unknown command '{}', with args beginning with: ",
        clip(args.get(0))
    );
    // As Redis: the quoted list stops growing at 128 bytes, quotes and spaces included, and
    // each argument is clipped to what is left.
    let mut list = String::new();
    for i in 1..args.len() {
        if list.len() >= 128 {
            break;
        }
        let a = args.get(i);
        let take = a.len().min(128 - list.len());
        list.push_str(&format!("'{}' ", String::from_utf8_lossy(&a[..take])));
    }
    msg.push_str(&list);
    msg
}

/// An array of help lines as simple strings, as Redis's `addReplyHelp` sends them.
pub fn help(out: &mut Vec<u8>, lines: &[&str]) {
    enc::array(out, lines.len());
    for l in lines {
        enc::simple(out, l);
    }
}

/// The options after a SCAN-family cursor.
pub struct ScanOpts<'a> {
    pub pattern: Option<&'a [u8]>,
    pub count: usize,
    pub type_filter: Option<&'a [u8]>,
}

/// Parses `[MATCH pattern] [COUNT n]` (and `[TYPE t]` when `with_type`) from argument `from` on.
pub fn scan_opts(
    args: Args<'_>,
    from: usize,
    with_type: bool,
) -> Result<ScanOpts<'_>, &'static str> {
    let mut o = ScanOpts {
        pattern: None,
        count: 10,
        type_filter: None,
    };
    let mut i = from;
    while i < args.len() {
        if i + 1 >= args.len() {
            return Err(SYNTAX);
        }
        if args.is(i, "MATCH") {
            o.pattern = Some(args.get(i + 1));
        } else if args.is(i, "COUNT") {
            match parse_i64(args.get(i + 1)) {
                Some(n) if n >= 1 => o.count = n as usize,
                Some(_) => return Err(SYNTAX),
                None => return Err(NOT_INTEGER),
            }
        } else if with_type && args.is(i, "TYPE") {
            o.type_filter = Some(args.get(i + 1));
        } else {
            return Err(SYNTAX);
        }
        i += 2;
    }
    Ok(o)
}

/// Redis's glob (stringmatchlen): `*`, `?`, `[abc]`, `[^a-z]`, `\x` escapes.
pub fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    // Where to resume after the last `*`: (pattern index after it, string index it matched to).
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, i));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => class_match(pattern, p, s[i]),
            Some(b'\\') if p + 1 < pattern.len() => (pattern[p + 1] == s[i]).then_some(p + 2),
            Some(&c) => (c == s[i]).then_some(p + 1),
            None => None,
        };
        match step {
            Some(np) => {
                p = np;
                i += 1;
            }
            None => match star {
                Some((sp, si)) => {
                    p = sp;
                    i = si + 1;
                    star = Some((sp, si + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class starting at `pattern[p] == '['`; the index after the class.
fn class_match(pattern: &[u8], p: usize, c: u8) -> Option<usize> {
    let mut j = p + 1;
    let negate = pattern.get(j) == Some(&b'^');
    if negate {
        j += 1;
    }
    let mut matched = false;
    loop {
        match pattern.get(j) {
            None => {
                // An unterminated class: Redis treats the end of pattern as its end.
                break;
            }
            Some(b']') => {
                j += 1;
                break;
            }
            Some(b'\\') if j + 1 < pattern.len() => {
                matched |= pattern[j + 1] == c;
                j += 2;
            }
            Some(&lo)
                if pattern.get(j + 1) == Some(&b'-')
                    && j + 2 < pattern.len()
                    && pattern[j + 2] != b']' =>
            {
                let hi = pattern[j + 2];
                let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
                matched |= (lo..=hi).contains(&c);
                j += 3;
            }
            Some(&x) => {
                matched |= x == c;
                j += 1;
            }
        }
    }
    (matched != negate).then_some(j)
}

/// Redis 7's error for a subcommand it does not know, e.g. `CLIENT FOO`.
pub fn unknown_sub(out: &mut Vec<u8>, cmd: &str, args: Args<'_>) {
    let sub = String::from_utf8_lossy(args.get(1));
    enc::error(
        out,
        &format!("ERR unknown subcommand '{sub}'. Try {cmd} HELP."),
    );
}

/// Redis 7's arity error for a subcommand, e.g. `client|setname`.
pub fn sub_arity(out: &mut Vec<u8>, cmd: &str, args: Args<'_>) {
    let sub = String::from_utf8_lossy(args.get(1)).to_ascii_lowercase();
    enc::error(
        out,
        &format!("ERR wrong number of arguments for '{cmd}|{sub}' command"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_like_redis() {
        assert!(glob_match(b"*", b"anything"));
        assert!(glob_match(b"h?llo", b"hello"));
        assert!(glob_match(b"h*llo", b"heeeello"));
        assert!(glob_match(b"h[ae]llo", b"hallo"));
        assert!(!glob_match(b"h[^e]llo", b"hello"));
        assert!(glob_match(b"h[a-b]llo", b"hbllo"));
        assert!(glob_match(b"key:*:x", b"key:1:2:x"));
        assert!(!glob_match(b"key:*:x", b"key:1:2:y"));
        assert!(glob_match(b"a\\*b", b"a*b"));
        assert!(!glob_match(b"a\\*b", b"axb"));
        assert!(glob_match(b"", b""));
        assert!(!glob_match(b"", b"a"));
    }
}
