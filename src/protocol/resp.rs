//! Redis RESP request parser (RESP2 multibulk and inline commands) and reply encoders for RESP2
//! and RESP3.
//!
//! `parse` reads one request from the start of a buffer. Multibulk arguments are ranges into the
//! buffer itself (no copy); inline arguments, which may carry quote escapes, are copied into a
//! scratch buffer and their ranges point there. Framing errors carry the message Redis sends
//! before it closes the connection.

use std::ops::Range;

/// Longest inline command, multibulk count line or bulk length line (Redis: 64 KiB).
pub const INLINE_MAX: usize = 64 * 1024;
/// Most arguments in one multibulk request (Redis: 1024*1024).
pub const MULTIBULK_MAX: i64 = 1024 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest single argument accepted (memkeep's item size limit, not Redis's 512 MB).
    pub max_bulk: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A command whose arguments are now in `args`; they index the buffer, or the scratch
    /// buffer when `inline`.
    Command { consumed: usize, inline: bool },
    /// An empty request (`*0`, `*-1`, a blank inline line): nothing to run.
    Empty { consumed: usize },
    /// A framing error: reply `-ERR Protocol error: <msg>` and close, as Redis does.
    Error(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Incomplete;

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    memchr::memchr(b'\r', &buf[from..])
        .map(|i| from + i)
        .and_then(|i| {
            if i + 1 < buf.len() {
                if buf[i + 1] == b'\n' {
                    Some(i)
                } else {
                    find_crlf(buf, i + 1)
                }
            } else {
                None
            }
        })
}

/// Redis's strict signed decimal, shared by both protocols and the storage layer.
pub use crate::int::parse_i64;

/// Parses one request from the start of `buf`.
pub fn parse(
    buf: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
    scratch: &mut Vec<u8>,
) -> Result<Parsed, Incomplete> {
    args.clear();
    match buf.first() {
        None => Err(Incomplete),
        Some(b'*') => multibulk(buf, limits, args),
        Some(_) => inline(buf, args, scratch),
    }
}

fn multibulk(
    buf: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<Parsed, Incomplete> {
    let Some(end) = find_crlf(buf, 1) else {
        return if buf.len() > INLINE_MAX {
            Ok(Parsed::Error("too big mbulk count string".into()))
        } else {
            Err(Incomplete)
        };
    };
    if end > INLINE_MAX {
        return Ok(Parsed::Error("too big mbulk count string".into()));
    }
    let count = match parse_i64(&buf[1..end]) {
        Some(n) if n <= i32::MAX as i64 => n,
        _ => return Ok(Parsed::Error("invalid multibulk length".into())),
    };
    let mut at = end + 2;
    if count <= 0 {
        return Ok(Parsed::Empty { consumed: at });
    }
    if count > MULTIBULK_MAX {
        return Ok(Parsed::Error("invalid multibulk length".into()));
    }
    for _ in 0..count {
        match buf.get(at) {
            None => return Err(Incomplete),
            Some(b'$') => {}
            Some(&c) => return Ok(Parsed::Error(format!("expected '$', got '{}'", c as char))),
        }
        let Some(end) = find_crlf(buf, at + 1) else {
            return if buf.len() - at > INLINE_MAX {
                Ok(Parsed::Error("too big bulk count string".into()))
            } else {
                Err(Incomplete)
            };
        };
        if end - at > INLINE_MAX {
            return Ok(Parsed::Error("too big bulk count string".into()));
        }
        let len = match parse_i64(&buf[at + 1..end]) {
            Some(n) if n >= 0 && n as u64 <= limits.max_bulk as u64 => n as usize,
            _ => return Ok(Parsed::Error("invalid bulk length".into())),
        };
        let start = end + 2;
        // Like Redis, the two bytes after the data are skipped, not checked.
        if buf.len() < start + len + 2 {
            return Err(Incomplete);
        }
        args.push(start..start + len);
        at = start + len + 2;
    }
    Ok(Parsed::Command {
        consumed: at,
        inline: false,
    })
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn inline(
    buf: &[u8],
    args: &mut Vec<Range<usize>>,
    scratch: &mut Vec<u8>,
) -> Result<Parsed, Incomplete> {
    let Some(nl) = memchr::memchr(b'\n', buf) else {
        return if buf.len() > INLINE_MAX {
            Ok(Parsed::Error("too big inline request".into()))
        } else {
            Err(Incomplete)
        };
    };
    if nl > INLINE_MAX {
        return Ok(Parsed::Error("too big inline request".into()));
    }
    let consumed = nl + 1;
    let line = if nl > 0 && buf[nl - 1] == b'\r' {
        &buf[..nl - 1]
    } else {
        &buf[..nl]
    };
    scratch.clear();
    if split_args(line, args, scratch).is_none() {
        return Ok(Parsed::Error("unbalanced quotes in request".into()));
    }
    if args.is_empty() {
        return Ok(Parsed::Empty { consumed });
    }
    Ok(Parsed::Command {
        consumed,
        inline: true,
    })
}

/// Splits an inline line as Redis's sdssplitargs does: spaces separate, "double quotes" take
/// \\ \" \n \r \t \b \a and \xHH escapes, 'single quotes' take \'. None on unbalanced quotes.
fn split_args(line: &[u8], args: &mut Vec<Range<usize>>, out: &mut Vec<u8>) -> Option<()> {
    let mut i = 0;
    loop {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i == line.len() {
            return Some(());
        }
        let start = out.len();
        let (mut in_dq, mut in_sq) = (false, false);
        loop {
            if in_dq {
                match line.get(i) {
                    None => return None,
                    Some(b'\\') if line.get(i + 1) == Some(&b'x') => {
                        match (
                            line.get(i + 2).copied().and_then(hex),
                            line.get(i + 3).copied().and_then(hex),
                        ) {
                            (Some(h), Some(l)) => {
                                out.push(h * 16 + l);
                                i += 3;
                            }
                            _ => out.push(b'\\'),
                        }
                    }
                    Some(b'\\') if i + 1 < line.len() => {
                        i += 1;
                        out.push(match line[i] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 8,
                            b'a' => 7,
                            c => c,
                        });
                    }
                    Some(b'"') => {
                        // The closing quote must be followed by a space or the end.
                        if i + 1 < line.len() && !is_space(line[i + 1]) {
                            return None;
                        }
                        in_dq = false;
                        i += 1;
                        break;
                    }
                    Some(&c) => out.push(c),
                }
            } else if in_sq {
                match line.get(i) {
                    None => return None,
                    Some(b'\\') if line.get(i + 1) == Some(&b'\'') => {
                        i += 1;
                        out.push(b'\'');
                    }
                    Some(b'\'') => {
                        if i + 1 < line.len() && !is_space(line[i + 1]) {
                            return None;
                        }
                        in_sq = false;
                        i += 1;
                        break;
                    }
                    Some(&c) => out.push(c),
                }
            } else {
                match line.get(i) {
                    None => break,
                    Some(&c) if is_space(c) => break,
                    Some(b'"') => in_dq = true,
                    Some(b'\'') => in_sq = true,
                    Some(&c) => out.push(c),
                }
            }
            i += 1;
        }
        debug_assert!(!in_dq && !in_sq);
        args.push(start..out.len());
    }
}

/// Reply encoders. `v3` selects RESP3 types where RESP2 has none.
pub mod enc {
    pub fn simple(out: &mut Vec<u8>, s: &str) {
        out.push(b'+');
        out.extend_from_slice(s.as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    pub fn ok(out: &mut Vec<u8>) {
        out.extend_from_slice(b"+OK\r\n");
    }

    /// `msg` is the whole error text after '-', e.g. "ERR syntax error".
    /// An error reply. Errors may quote client bytes: a CR or LF among them becomes a space (as
    /// Redis does), so the reply stays one line.
    pub fn error(out: &mut Vec<u8>, msg: &str) {
        out.push(b'-');
        out.extend(
            msg.bytes()
                .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
        out.extend_from_slice(b"\r\n");
    }

    pub fn int(out: &mut Vec<u8>, n: i64) {
        out.push(b':');
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    fn header(out: &mut Vec<u8>, t: u8, n: usize) {
        out.push(t);
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    pub fn bulk(out: &mut Vec<u8>, b: &[u8]) {
        header(out, b'$', b.len());
        out.extend_from_slice(b);
        out.extend_from_slice(b"\r\n");
    }

    pub fn null(out: &mut Vec<u8>, v3: bool) {
        out.extend_from_slice(if v3 { b"_\r\n" } else { b"$-1\r\n" });
    }

    pub fn null_array(out: &mut Vec<u8>, v3: bool) {
        out.extend_from_slice(if v3 { b"_\r\n" } else { b"*-1\r\n" });
    }

    pub fn array(out: &mut Vec<u8>, n: usize) {
        header(out, b'*', n);
    }

    /// A map of `n` pairs (RESP2: a flat array of 2n).
    pub fn map(out: &mut Vec<u8>, n: usize, v3: bool) {
        if v3 {
            header(out, b'%', n)
        } else {
            header(out, b'*', 2 * n)
        }
    }

    pub fn set(out: &mut Vec<u8>, n: usize, v3: bool) {
        header(out, if v3 { b'~' } else { b'*' }, n);
    }

    pub fn boolean(out: &mut Vec<u8>, b: bool, v3: bool) {
        if v3 {
            out.extend_from_slice(if b { b"#t\r\n" } else { b"#f\r\n" });
        } else {
            int(out, b as i64);
        }
    }

    /// A score as text, without allocating.
    pub struct ScoreText {
        buf: [u8; 40],
        len: usize,
    }

    impl Default for ScoreText {
        fn default() -> Self {
            ScoreText::new()
        }
    }

    impl ScoreText {
        /// An integer's text.
        pub fn integer(n: i64) -> ScoreText {
            let mut t = ScoreText::new();
            t.push(itoa::Buffer::new().format(n).as_bytes());
            t
        }

        pub fn as_bytes(&self) -> &[u8] {
            &self.buf[..self.len]
        }

        pub fn new() -> ScoreText {
            ScoreText {
                buf: [0; 40],
                len: 0,
            }
        }

        pub fn push(&mut self, b: &[u8]) {
            self.buf[self.len..self.len + b.len()].copy_from_slice(b);
            self.len += b.len();
        }
    }

    /// A score as Redis 7.0 replies with it (`addReplyDouble`: C's `%.17g`, `inf`, `-inf`), e.g.
    /// `1`, `1.5`, `0.10000000000000001`, `1e+20`, `1.0000000000000001e-05`.
    pub fn fmt_double(d: f64) -> ScoreText {
        let mut t = ScoreText::new();
        if d.is_nan() {
            t.push(b"nan");
        } else if d.is_infinite() {
            t.push(if d > 0.0 { b"inf" } else { b"-inf" });
        } else if d == 0.0 {
            t.push(if d.is_sign_negative() { b"-0" } else { b"0" });
        } else if d.fract() == 0.0 && d.abs() < 1e17 {
            // At most 17 digits: %.17g prints the integer itself.
            t.push(itoa::Buffer::new().format(d as i64).as_bytes());
        } else {
            g17(d, &mut t);
        }
        t
    }

    /// `%.17g` for a finite non-zero `d`: 17 significant digits (correctly rounded, as glibc), fixed
    /// notation for exponents -4..16, else `d.ddde±XX`; trailing zeros dropped.
    fn g17(d: f64, t: &mut ScoreText) {
        use std::io::Write as _;
        let mut sci = [0u8; 40];
        let n = {
            let mut w = &mut sci[..];
            let _ = write!(w, "{d:.16e}");
            40 - w.len()
        };
        let s = &sci[..n];
        let (neg, s) = match s.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, s),
        };
        let epos = s.iter().position(|&c| c == b'e').unwrap_or(s.len());
        let mut digits = [0u8; 17];
        let mut nd = 0;
        for &c in &s[..epos] {
            if c.is_ascii_digit() && nd < 17 {
                digits[nd] = c;
                nd += 1;
            }
        }
        let exp: i32 = std::str::from_utf8(&s[(epos + 1).min(s.len())..])
            .ok()
            .and_then(|e| e.parse().ok())
            .unwrap_or(0);
        // Significant digits without trailing zeros.
        let mut last = nd;
        while last > 1 && digits[last - 1] == b'0' {
            last -= 1;
        }
        if neg {
            t.push(b"-");
        }
        if !(-4..17).contains(&exp) {
            t.push(&digits[..1]);
            if last > 1 {
                t.push(b".");
                t.push(&digits[1..last]);
            }
            t.push(if exp < 0 { b"e-" } else { b"e+" });
            let e = exp.unsigned_abs();
            if e < 10 {
                t.push(b"0");
            }
            t.push(itoa::Buffer::new().format(e).as_bytes());
        } else if exp >= 0 {
            let int = exp as usize + 1;
            t.push(&digits[..int]);
            if last > int {
                t.push(b".");
                t.push(&digits[int..last]);
            }
        } else {
            t.push(b"0.");
            for _ in 0..(-exp - 1) {
                t.push(b"0");
            }
            t.push(&digits[..last]);
        }
    }

    pub fn double(out: &mut Vec<u8>, d: f64, v3: bool) {
        let s = fmt_double(d);
        if v3 {
            out.push(b',');
            out.extend_from_slice(s.as_bytes());
            out.extend_from_slice(b"\r\n");
        } else {
            bulk(out, s.as_bytes());
        }
    }

    /// A verbatim text (RESP3 `=`, RESP2 a bulk string), e.g. INFO's reply.
    pub fn verbatim(out: &mut Vec<u8>, text: &[u8], v3: bool) {
        if v3 {
            header(out, b'=', text.len() + 4);
            out.extend_from_slice(b"txt:");
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        } else {
            bulk(out, text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits { max_bulk: 1 << 20 };

    fn args_of(buf: &[u8]) -> Result<(Parsed, Vec<Vec<u8>>), Incomplete> {
        let mut args = Vec::new();
        let mut scratch = Vec::new();
        let p = parse(buf, &L, &mut args, &mut scratch)?;
        let src: &[u8] = match p {
            Parsed::Command { inline: true, .. } => &scratch,
            _ => buf,
        };
        Ok((p, args.iter().map(|r| src[r.clone()].to_vec()).collect()))
    }

    #[test]
    fn multibulk_arguments_are_read_in_order() {
        let buf = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhe\r\nl\r\n";
        let (p, a) = args_of(buf).expect("complete");
        assert_eq!(
            p,
            Parsed::Command {
                consumed: buf.len(),
                inline: false
            }
        );
        assert_eq!(a, vec![b"SET".to_vec(), b"k".to_vec(), b"he\r\nl".to_vec()]);
    }

    #[test]
    fn every_strict_prefix_is_incomplete() {
        let reqs: [&[u8]; 4] = [
            b"*2\r\n$4\r\nECHO\r\n$0\r\n\r\n",
            b"PING\r\n",
            b"set a \"b c\"\n",
            b"*1\r\n$4\r\nPING\r\n",
        ];
        for req in reqs {
            for n in 0..req.len() {
                assert_eq!(
                    args_of(&req[..n]).err(),
                    Some(Incomplete),
                    "prefix {n} of {req:?}"
                );
            }
            assert!(args_of(req).is_ok());
        }
    }

    #[test]
    fn inline_commands_split_like_redis() {
        let (_, a) = args_of(b"SET k \"a b\\n\\x41\" 'it\\'s'\r\n").expect("complete");
        assert_eq!(
            a,
            vec![
                b"SET".to_vec(),
                b"k".to_vec(),
                b"a b\nA".to_vec(),
                b"it's".to_vec()
            ]
        );
        assert_eq!(
            args_of(b"SET \"k\r\n").expect("done").0,
            Parsed::Error("unbalanced quotes in request".into())
        );
        assert_eq!(
            args_of(b"SET \"k\"x\r\n").expect("done").0,
            Parsed::Error("unbalanced quotes in request".into())
        );
        assert_eq!(
            args_of(b"   \r\n").expect("done").0,
            Parsed::Empty { consumed: 5 }
        );
    }

    #[test]
    fn framing_errors_match_redis() {
        assert_eq!(
            args_of(b"*x\r\n").expect("done").0,
            Parsed::Error("invalid multibulk length".into())
        );
        assert_eq!(
            args_of(b"*1\r\n:1\r\n").expect("done").0,
            Parsed::Error("expected '$', got ':'".into())
        );
        assert_eq!(
            args_of(b"*1\r\n$-2\r\n").expect("done").0,
            Parsed::Error("invalid bulk length".into())
        );
        let big = format!("*1\r\n${}\r\n", (1 << 20) + 1);
        assert_eq!(
            args_of(big.as_bytes()).expect("done").0,
            Parsed::Error("invalid bulk length".into())
        );
        assert_eq!(
            args_of(b"*2147483648\r\n").expect("done").0,
            Parsed::Error("invalid multibulk length".into())
        );
        assert_eq!(
            args_of(b"*0\r\n").expect("done").0,
            Parsed::Empty { consumed: 4 }
        );
        assert_eq!(
            args_of(b"*-1\r\n").expect("done").0,
            Parsed::Empty { consumed: 5 }
        );
        let long = vec![b'a'; INLINE_MAX + 1];
        assert_eq!(
            args_of(&long).expect("done").0,
            Parsed::Error("too big inline request".into())
        );
    }

    #[test]
    fn integers_parse_like_string2ll() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"9223372036854775808",
            b"-0",
            b"1.0",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn resp3_types_fall_back_in_resp2() {
        let mut out = Vec::new();
        enc::map(&mut out, 2, false);
        enc::map(&mut out, 2, true);
        enc::null(&mut out, false);
        enc::null(&mut out, true);
        enc::boolean(&mut out, true, false);
        enc::boolean(&mut out, true, true);
        enc::double(&mut out, 1.5, true);
        enc::double(&mut out, f64::INFINITY, false);
        assert_eq!(
            out,
            b"*4\r\n%2\r\n$-1\r\n_\r\n:1\r\n#t\r\n,1.5\r\n$3\r\ninf\r\n"
        );
    }
}
