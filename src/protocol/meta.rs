//! memcached's meta commands (`mg ms md ma mn me`, memcached 1.6 `doc/protocol.txt`, "Meta
//! Commands"): `<cm> <key> <datalen*> <flag>*`, each flag one character with an optional token.
//!
//! The parser checks every flag as memcached 1.6.18 does and keeps the flag text, so the reply
//! can echo the flags that return something (`k`, `O`, `c`, `t`, ...) in request order. Error
//! lines follow memcached: `mg`/`ms` name the problem (`invalid flag`, `duplicate flag`, `bad
//! token in command line format`), `md`/`ma` answer `invalid or duplicate flag` for all of them.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::memcache::{
    BAD_DATA_CHUNK, BAD_FORMAT, BYTES_MAX, ERROR, Frame, Incomplete, KEY_MAX, Limits, Parsed,
    Request, StoreMode, valid_key,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaCmd {
    Get,
    Set,
    Delete,
    Arith,
    Debug,
    Noop,
}

/// The flags of one meta request, checked and decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaFlags {
    /// One bit per flag letter present (`a`..`z` are bits 0..26, `A`..`Z` 26..52).
    present: u64,
    /// `C`: compare this CAS.
    pub compare: Option<u64>,
    /// `E`: give a changed item this CAS.
    pub new_cas: Option<u64>,
    /// `F`: client flags to store.
    pub client_flags: u32,
    /// `T`: TTL to set.
    pub ttl: Option<i64>,
    /// `N`: create on a miss with this TTL.
    pub vivify: Option<i64>,
    /// `R`: win the recache token when less TTL than this remains.
    pub recache: Option<i64>,
    /// `M`: the mode character.
    pub mode: Option<u8>,
    /// `J`: `ma`'s initial value on a vivifying miss.
    pub initial: u64,
    /// `D`: `ma`'s delta.
    pub delta: u64,
}

impl MetaFlags {
    pub fn has(&self, flag: u8) -> bool {
        bit(flag).is_some_and(|b| self.present & b != 0)
    }

    /// The store mode of `ms` (`M` token; `S` when absent).
    pub fn store_mode(&self) -> StoreMode {
        match self.mode {
            Some(b'E') => StoreMode::Add,
            Some(b'A') => StoreMode::Append,
            Some(b'P') => StoreMode::Prepend,
            Some(b'R') => StoreMode::Replace,
            _ => StoreMode::Set,
        }
    }

    /// `ma`: increment (the default) or decrement.
    pub fn incr(&self) -> bool {
        !matches!(self.mode, Some(b'D' | b'-'))
    }
}

fn bit(flag: u8) -> Option<u64> {
    match flag {
        b'a'..=b'z' => Some(1 << (flag - b'a')),
        b'A'..=b'Z' => Some(1 << (26 + flag - b'A')),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest<'a> {
    pub cmd: MetaCmd,
    /// The key to look up (base64-decoded with `b`).
    pub key: Cow<'a, [u8]>,
    /// The key as sent, which `k` echoes.
    pub raw_key: &'a [u8],
    /// The flag tokens as sent (everything after the key, and after `ms`'s datalen).
    pub flag_text: &'a [u8],
    pub flags: MetaFlags,
    /// `ms`'s data block.
    pub data: &'a [u8],
}

const INVALID_FLAG: &str = "CLIENT_ERROR invalid flag";
const DUPLICATE_FLAG: &str = "CLIENT_ERROR duplicate flag";
const BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format";
const OPAQUE_TOO_LONG: &str = "CLIENT_ERROR opaque token too long";
const INVALID_OR_DUPLICATE: &str = "CLIENT_ERROR invalid or duplicate flag";
const BAD_KEY_ENCODING: &str = "CLIENT_ERROR error decoding key";
const MS_BAD_MODE: &str = "CLIENT_ERROR invalid mode for ms M token";
const MA_BAD_MODE: &str = "CLIENT_ERROR invalid mode for ma M token";
const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";

/// Longest opaque (`O`) token, the `O` included.
const OPAQUE_MAX: usize = 32;

/// Parses a meta command line (`line` without its `\r\n`, `line_len` with it); `buf` is the
/// whole input, for `ms`'s data block.
pub fn parse<'a>(
    cmd: MetaCmd,
    line: &'a [u8],
    line_len: usize,
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Parsed<'a>, Incomplete> {
    let mut tokens = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
    tokens.next();
    if cmd == MetaCmd::Noop {
        return ok(request(cmd, b"", b"", MetaFlags::default()), line_len);
    }
    let Some(raw_key) = tokens.next() else {
        return err(ERROR, line_len, 0);
    };
    let after_key = rest_after(line, raw_key);
    if raw_key.len() > KEY_MAX {
        return err(BAD_FORMAT, line_len, 0);
    }
    let (bytes, flag_text) = if cmd == MetaCmd::Set {
        let Some(len_token) = tokens.next() else {
            return err(BAD_FORMAT, line_len, 0);
        };
        match super::memcache::parse_i64(len_token) {
            Some(n) if (0..=BYTES_MAX).contains(&n) => (n as usize, rest_after(line, len_token)),
            _ => return err(BAD_FORMAT, line_len, 0),
        }
    } else {
        (0, after_key)
    };
    // From here on, `ms`'s data block is known: a refused `ms` swallows it.
    let swallow = if cmd == MetaCmd::Set { bytes + 2 } else { 0 };
    let flags = match parse_flags(flag_text) {
        Ok(flags) => flags,
        Err(e) if matches!(cmd, MetaCmd::Delete | MetaCmd::Arith) && e != OPAQUE_TOO_LONG => {
            return err(INVALID_OR_DUPLICATE, line_len, swallow);
        }
        Err(e) => return err(e, line_len, swallow),
    };
    if let Some(e) = check_mode(cmd, &flags) {
        return err(e, line_len, swallow);
    }
    let key: Cow<'a, [u8]> = if flags.has(b'b') {
        match BASE64.decode(raw_key) {
            Ok(k) if !k.is_empty() && k.len() <= KEY_MAX => Cow::Owned(k),
            _ => return err(BAD_KEY_ENCODING, line_len, swallow),
        }
    } else if valid_key(raw_key) {
        Cow::Borrowed(raw_key)
    } else {
        return err(BAD_FORMAT, line_len, 0);
    };
    let mut req = request(cmd, raw_key, flag_text, flags);
    req.key = key;
    if cmd != MetaCmd::Set {
        return ok(req, line_len);
    }
    if bytes > limits.item_size_max {
        return err(TOO_LARGE, line_len, swallow);
    }
    let data_end = line_len.saturating_add(bytes);
    let total = data_end.saturating_add(2);
    if buf.len() < total {
        return Err(Incomplete);
    }
    if &buf[data_end..total] != b"\r\n" {
        return err(BAD_DATA_CHUNK, total, 0);
    }
    req.data = &buf[line_len..data_end];
    ok(req, total)
}

fn request<'a>(
    cmd: MetaCmd,
    raw_key: &'a [u8],
    flag_text: &'a [u8],
    flags: MetaFlags,
) -> MetaRequest<'a> {
    MetaRequest {
        cmd,
        key: Cow::Borrowed(raw_key),
        raw_key,
        flag_text,
        flags,
        data: b"",
    }
}

fn ok(req: MetaRequest<'_>, consumed: usize) -> Result<Parsed<'_>, Incomplete> {
    Ok(Parsed {
        frame: Frame::Request(Request::Meta(req)),
        consumed,
        swallow: 0,
    })
}

fn err<'a>(msg: &'static str, consumed: usize, swallow: usize) -> Result<Parsed<'a>, Incomplete> {
    Ok(Parsed {
        frame: Frame::Error(msg),
        consumed,
        swallow,
    })
}

/// The part of `line` after `token` (a subslice of it), without leading spaces.
fn rest_after<'a>(line: &'a [u8], token: &'a [u8]) -> &'a [u8] {
    let end = token.as_ptr() as usize - line.as_ptr() as usize + token.len();
    let rest = &line[end..];
    let skip = rest.iter().take_while(|&&b| b == b' ').count();
    &rest[skip..]
}

/// Each flag token of a meta request, in order.
pub fn flag_tokens(flag_text: &[u8]) -> impl Iterator<Item = &[u8]> {
    flag_text.split(|&b| b == b' ').filter(|t| !t.is_empty())
}

fn parse_flags(flag_text: &[u8]) -> Result<MetaFlags, &'static str> {
    use super::memcache::{parse_i64, parse_u32, parse_u64};
    let mut f = MetaFlags {
        delta: 1,
        ..MetaFlags::default()
    };
    for tok in flag_tokens(flag_text) {
        let (c, arg) = (tok[0], &tok[1..]);
        let b = bit(c).ok_or(INVALID_FLAG)?;
        if f.present & b != 0 {
            return Err(DUPLICATE_FLAG);
        }
        f.present |= b;
        let i64_arg = || parse_i64(arg).ok_or(BAD_TOKEN);
        let u64_arg = || parse_u64(arg).ok_or(BAD_TOKEN);
        match c {
            b'b' | b'c' | b'f' | b'h' | b'k' | b'l' | b'q' | b's' | b't' | b'u' | b'v' | b'x'
            | b'I' | b'P' | b'L' => {}
            b'O' if tok.len() > OPAQUE_MAX => return Err(OPAQUE_TOO_LONG),
            b'O' => {}
            b'T' => f.ttl = Some(i64_arg()?),
            b'N' => f.vivify = Some(i64_arg()?),
            b'R' => f.recache = Some(i64_arg()?),
            b'C' => f.compare = Some(u64_arg()?),
            b'E' => f.new_cas = Some(u64_arg()?),
            b'J' => f.initial = u64_arg()?,
            b'D' => f.delta = u64_arg()?,
            b'F' => f.client_flags = parse_u32(arg).ok_or(BAD_FORMAT)?,
            b'M' => f.mode = Some(arg.first().copied().unwrap_or(0)),
            _ => return Err(INVALID_FLAG),
        }
    }
    Ok(f)
}

fn check_mode(cmd: MetaCmd, f: &MetaFlags) -> Option<&'static str> {
    let mode = f.mode?;
    match cmd {
        MetaCmd::Set if !b"EAPRS".contains(&mode) => Some(MS_BAD_MODE),
        MetaCmd::Arith if !b"ID+-".contains(&mode) => Some(MA_BAD_MODE),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::memcache::parse as parse_any;
    use super::*;

    fn one(input: &[u8]) -> Parsed<'_> {
        parse_any(input, &Limits::default()).expect("complete")
    }

    fn meta(input: &[u8]) -> MetaRequest<'_> {
        match one(input).frame {
            Frame::Request(Request::Meta(m)) => m,
            other => panic!("not a meta request: {other:?}"),
        }
    }

    fn error(input: &[u8]) -> (&'static str, usize, usize) {
        let p = one(input);
        match p.frame {
            Frame::Error(e) => (e, p.consumed, p.swallow),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn flags_are_decoded_and_kept_in_order() {
        let m = meta(b"mg foo  v c T30 Oab k\r\n");
        assert_eq!(m.cmd, MetaCmd::Get);
        assert_eq!(&*m.key, b"foo");
        assert_eq!(m.flag_text, b"v c T30 Oab k");
        assert!(m.flags.has(b'v') && m.flags.has(b'k') && !m.flags.has(b'q'));
        assert_eq!(m.flags.ttl, Some(30));
        let toks: Vec<&[u8]> = flag_tokens(m.flag_text).collect();
        assert_eq!(toks, vec![&b"v"[..], b"c", b"T30", b"Oab", b"k"]);
    }

    #[test]
    fn ms_reads_its_data_block() {
        let p = one(b"ms k 3 F5 T-1 MA\r\nabc\r\nrest");
        assert_eq!(p.consumed, 18 + 5);
        let Frame::Request(Request::Meta(m)) = p.frame else {
            panic!("not meta");
        };
        assert_eq!(m.data, b"abc");
        assert_eq!(m.flags.client_flags, 5);
        assert_eq!(m.flags.ttl, Some(-1));
        assert_eq!(m.flags.store_mode(), StoreMode::Append);
        assert_eq!(
            parse_any(b"ms k 3\r\nab", &Limits::default()),
            Err(Incomplete)
        );
    }

    #[test]
    fn errors_match_memcached() {
        assert_eq!(error(b"mg k !\r\n").0, INVALID_FLAG);
        assert_eq!(error(b"mg k v v\r\n").0, DUPLICATE_FLAG);
        assert_eq!(error(b"mg k Tabc\r\n").0, BAD_TOKEN);
        assert_eq!(error(b"mg k Fabc\r\n").0, BAD_FORMAT);
        assert_eq!(error(b"md k q q\r\n").0, INVALID_OR_DUPLICATE);
        assert_eq!(error(b"ma k Dx\r\n").0, INVALID_OR_DUPLICATE);
        assert_eq!(
            error(b"md k O12345678901234567890123456789012\r\n").0,
            OPAQUE_TOO_LONG
        );
        assert_eq!(error(b"mg\r\n").0, ERROR);
        assert_eq!(error(b"ma k Mx\r\n").0, MA_BAD_MODE);
        // A refused ms swallows its data block once the length is known; a bad length doesn't.
        assert_eq!(error(b"ms k 2 MX\r\nxx\r\n"), (MS_BAD_MODE, 11, 4));
        assert_eq!(error(b"ms k abc\r\nxx\r\n"), (BAD_FORMAT, 10, 0));
        assert_eq!(error(b"ms Zm9 2 b\r\nxx\r\n"), (BAD_KEY_ENCODING, 12, 4));
        assert_eq!(error(b"ms k 2\r\nxxxx\r\n"), (BAD_DATA_CHUNK, 12, 0));
        let long = format!("mg {} v\r\n", "a".repeat(251));
        assert_eq!(error(long.as_bytes()).0, BAD_FORMAT);
    }

    #[test]
    fn base64_keys_are_decoded() {
        let m = meta(b"mg Zm9v b k v\r\n");
        assert_eq!(&*m.key, b"foo");
        assert_eq!(m.raw_key, b"Zm9v");
        assert_eq!(error(b"mg a=== b\r\n").0, BAD_KEY_ENCODING);
    }

    #[test]
    fn mn_takes_nothing() {
        assert_eq!(meta(b"mn\r\n").cmd, MetaCmd::Noop);
    }
}
