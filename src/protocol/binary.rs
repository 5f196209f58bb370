//! memcached binary protocol codec (memcached 1.6 `doc/protocol-binary.txt`), validating as
//! memcached 1.6.18 does.
//!
//! A connection speaks binary when its first byte is `REQUEST_MAGIC` (`is_binary`). `parse`
//! looks at the start of the read buffer and returns one frame and how many bytes it used, like
//! the text parser (`super::memcache`): the caller advances by `consumed`, then discards
//! `swallow` further bytes, which may not have arrived yet (an over-size value, the body of an
//! unknown command). For every frame except `Frame::Close` and errors that close,
//! `consumed + swallow` is exactly one packet: 24 header bytes plus the declared body.
//!
//! memcached decides about a packet once its header, extras and key are in; only then does it
//! read the value. `parse` does the same: errors and over-size values are answered without
//! waiting for (or buffering) the value; a valid request waits for the whole body and borrows
//! its key and value from the buffer.
//!
//! The encoders append response packets to an output buffer. Replies echo the request's opcode
//! (quiet variants included) and opaque. What a quiet request suppresses is the executor's job:
//! memcached sends nothing for a successful quiet store, delete, incr/decr, append/prepend or
//! flush, nothing for a quiet get/gat miss, and closes without a reply on `QUITQ`; every error
//! reply (and every get/gat hit) is still sent.

pub use super::memcache::{Incomplete, KEY_MAX, Limits, StoreMode};

/// First byte of every request.
pub const REQUEST_MAGIC: u8 = 0x80;
/// First byte of every response.
pub const RESPONSE_MAGIC: u8 = 0x81;
/// Fixed header length of requests and responses.
pub const HEADER_LEN: usize = 24;
/// Longest SASL mechanism name memcached accepts in `SASL_AUTH`/`SASL_STEP` (longer ones are
/// answered `status::EINVAL` when SASL is on); the executor checks it, since memcached answers
/// `UNKNOWN_COMMAND` instead when SASL is off.
pub const SASL_MECH_MAX: usize = 32;
/// `Arith::exptime` value that means "do not create a missing counter": answer `KEY_ENOENT`.
pub const ARITH_NO_CREATE: u32 = 0xffff_ffff;

/// Whether a connection whose first byte is `first` speaks the binary protocol.
pub fn is_binary(first: u8) -> bool {
    first == REQUEST_MAGIC
}

/// Request opcodes. The `Q` variants are quiet; `GATK`/`GATKQ`/`GETK`/`GETKQ` return the key.
pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    /// Defined by the protocol, but memcached 1.6.18 answers it `UNKNOWN_COMMAND`, and so does
    /// `parse`.
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// Response status codes memcached sends.
pub mod status {
    pub const OK: u16 = 0x0000;
    pub const KEY_ENOENT: u16 = 0x0001;
    pub const KEY_EEXISTS: u16 = 0x0002;
    pub const E2BIG: u16 = 0x0003;
    pub const EINVAL: u16 = 0x0004;
    pub const NOT_STORED: u16 = 0x0005;
    pub const DELTA_BADVAL: u16 = 0x0006;
    pub const AUTH_ERROR: u16 = 0x0020;
    pub const AUTH_CONTINUE: u16 = 0x0021;
    pub const UNKNOWN_COMMAND: u16 = 0x0081;
    pub const ENOMEM: u16 = 0x0082;
    /// memcached's PROTOCOL_BINARY_RESPONSE_EINTERNAL; memkeep sends it (with the body
    /// `storage corrupted`) when the store is damaged.
    pub const EINTERNAL: u16 = 0x0084;
}

/// The body memcached sends with an error status (byte for byte, memcached 1.6.18).
pub fn status_text(st: u16) -> &'static str {
    match st {
        status::KEY_ENOENT => "Not found",
        status::KEY_EEXISTS => "Data exists for key.",
        status::E2BIG => "Too large.",
        status::EINVAL => "Invalid arguments",
        status::NOT_STORED => "Not stored.",
        status::DELTA_BADVAL => "Non-numeric server-side value for incr or decr",
        status::AUTH_ERROR => "Auth failure.",
        status::UNKNOWN_COMMAND => "Unknown command",
        status::ENOMEM => "Out of memory",
        _ => "",
    }
}

/// The 24-byte header of a request or response, decoded (integers are big-endian on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub magic: u8,
    pub opcode: u8,
    pub key_len: u16,
    pub extras_len: u8,
    pub data_type: u8,
    /// vbucket id in requests, status in responses.
    pub vbucket_or_status: u16,
    /// Extras + key + value.
    pub body_len: u32,
    pub opaque: u32,
    pub cas: u64,
}

impl Header {
    /// Decode the first 24 bytes of `buf`; `None` if there are fewer.
    pub fn decode(buf: &[u8]) -> Option<Header> {
        let h = buf.get(..HEADER_LEN)?;
        Some(Header {
            magic: h[0],
            opcode: h[1],
            key_len: u16::from_be_bytes([h[2], h[3]]),
            extras_len: h[4],
            data_type: h[5],
            vbucket_or_status: u16::from_be_bytes([h[6], h[7]]),
            body_len: be32(&h[8..12]),
            opaque: be32(&h[12..16]),
            cas: be64(&h[16..24]),
        })
    }

    /// Append the 24 header bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.magic);
        out.push(self.opcode);
        out.extend_from_slice(&self.key_len.to_be_bytes());
        out.push(self.extras_len);
        out.push(self.data_type);
        out.extend_from_slice(&self.vbucket_or_status.to_be_bytes());
        out.extend_from_slice(&self.body_len.to_be_bytes());
        out.extend_from_slice(&self.opaque.to_be_bytes());
        out.extend_from_slice(&self.cas.to_be_bytes());
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// One decoded request: the header fields every reply needs plus the typed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The opcode as sent (a quiet variant stays quiet); replies echo it.
    pub opcode: u8,
    /// Echoed in the reply.
    pub opaque: u32,
    /// The request's CAS: for stores, delete and incr/decr a non-zero value must match the
    /// item's (memcached ignores it for other commands).
    pub cas: u64,
    /// A quiet variant (`GETQ`, `SETQ`, ...): see the module documentation.
    pub quiet: bool,
    pub command: Command<'a>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// `GET`/`GETQ`/`GETK`/`GETKQ`; `with_key` for the `K` variants.
    Get {
        key: &'a [u8],
        with_key: bool,
    },
    /// `GAT`/`GATQ`/`GATK`/`GATKQ`: get and set the expiration.
    Gat {
        key: &'a [u8],
        exptime: u32,
        with_key: bool,
    },
    /// `TOUCH`: a hit replies with the flags (extras) and CAS, no value.
    Touch {
        key: &'a [u8],
        exptime: u32,
    },
    /// `SET`/`ADD`/`REPLACE` (with flags and exptime) and `APPEND`/`PREPEND` (flags and exptime
    /// 0, unused), quiet or not. `mode` is never `StoreMode::Cas`: a non-zero `Request::cas`
    /// makes any of them a compare-and-swap.
    Store {
        mode: StoreMode,
        key: &'a [u8],
        flags: u32,
        exptime: u32,
        value: &'a [u8],
    },
    /// A store whose value exceeds `Limits::item_size_max`; the value is in
    /// `Parsed::swallow`. memcached answers `status::E2BIG` (even when quiet) and, for `SET`,
    /// deletes the old value.
    TooLarge {
        mode: StoreMode,
        key: &'a [u8],
    },
    /// `DELETE`/`DELETEQ`.
    Delete {
        key: &'a [u8],
    },
    /// `INCREMENT`/`DECREMENT` (+Q). A missing key is created with `initial` unless `exptime`
    /// is `ARITH_NO_CREATE`.
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        initial: u64,
        exptime: u32,
    },
    /// `FLUSH`/`FLUSHQ`; `exptime` is 0 when the request has no extras.
    Flush {
        exptime: u32,
    },
    Noop,
    Version,
    /// `QUIT`/`QUITQ`: reply (unless quiet), then close.
    Quit,
    /// `STAT`: the key names the group (empty: all stats).
    Stat {
        group: &'a [u8],
    },
    SaslListMechs,
    /// `SASL_AUTH`: the key is the mechanism, the value its data.
    SaslAuth {
        mechanism: &'a [u8],
        data: &'a [u8],
    },
    /// `SASL_STEP`: the key is the mechanism, the value its data.
    SaslStep {
        mechanism: &'a [u8],
        data: &'a [u8],
    },
}

/// A request rejected before it ran: reply with `encode_error` (the status's text as body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorReply {
    pub opcode: u8,
    pub opaque: u32,
    pub status: u16,
    /// Close the connection once the reply is written.
    pub close: bool,
    /// memcached sends this error before it checks SASL authentication (a body shorter than
    /// its key and extras). For every other error and request, a connection that must
    /// authenticate first gets `status::AUTH_ERROR` and is closed instead, unless the opcode
    /// is exempt (`auth_exempt`).
    pub before_auth: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    Request(Request<'a>),
    Error(ErrorReply),
    /// Not a request packet (bad magic): memcached closes without a reply.
    Close,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub frame: Frame<'a>,
    /// Bytes of the buffer this frame used.
    pub consumed: usize,
    /// Bytes after `consumed` to discard unseen (a refused value or an unknown command's body).
    pub swallow: usize,
}

/// Opcodes memcached runs before a SASL-requiring connection has authenticated.
pub fn auth_exempt(op: u8) -> bool {
    matches!(
        op,
        opcode::SASL_LIST_MECHS | opcode::SASL_AUTH | opcode::SASL_STEP | opcode::VERSION
    )
}

/// The parts of a packet known once its header, extras and key are in.
struct Packet<'a> {
    h: Header,
    extras: &'a [u8],
    key: &'a [u8],
    /// Header + extras + key.
    fixed: usize,
    /// Body bytes after the key.
    value_len: usize,
}

impl Packet<'_> {
    fn ext(&self) -> usize {
        self.extras.len()
    }
    fn body(&self) -> usize {
        self.h.body_len as usize
    }
    fn no_body(&self) -> bool {
        self.body() == 0
    }
    fn error(&self, status: u16, close: bool, swallow: usize) -> Parsed<'static> {
        self.reply(status, close, false, swallow)
    }
    /// memcached's reply to a body shorter than its extras and key: unknown command, then
    /// close, sent before any authentication check.
    fn short_body(&self) -> Parsed<'static> {
        self.reply(status::UNKNOWN_COMMAND, true, true, 0)
    }
    fn reply(
        &self,
        status: u16,
        close: bool,
        before_auth: bool,
        swallow: usize,
    ) -> Parsed<'static> {
        let e = ErrorReply {
            opcode: self.h.opcode,
            opaque: self.h.opaque,
            status,
            close,
            before_auth,
        };
        Parsed {
            frame: Frame::Error(e),
            consumed: self.fixed,
            swallow,
        }
    }
    /// memcached's reply to a request whose lengths do not fit its opcode: invalid, then close.
    fn invalid(&self) -> Parsed<'static> {
        self.error(status::EINVAL, true, 0)
    }
}

/// What an opcode asks for, before its lengths are checked.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Get { with_key: bool },
    Gat { with_key: bool },
    Touch,
    Store(StoreMode),
    Delete,
    Arith { incr: bool },
    Flush,
    Noop,
    Version,
    Quit,
    Stat,
    SaslListMechs,
    SaslAuth,
    SaslStep,
}

/// The kind of a known opcode and whether it is quiet.
fn kind(op: u8) -> Option<(Kind, bool)> {
    use opcode::*;
    let (k, quiet) = match op {
        GET => (Kind::Get { with_key: false }, false),
        GETQ => (Kind::Get { with_key: false }, true),
        GETK => (Kind::Get { with_key: true }, false),
        GETKQ => (Kind::Get { with_key: true }, true),
        GAT => (Kind::Gat { with_key: false }, false),
        GATQ => (Kind::Gat { with_key: false }, true),
        GATK => (Kind::Gat { with_key: true }, false),
        GATKQ => (Kind::Gat { with_key: true }, true),
        TOUCH => (Kind::Touch, false),
        SET => (Kind::Store(StoreMode::Set), false),
        SETQ => (Kind::Store(StoreMode::Set), true),
        ADD => (Kind::Store(StoreMode::Add), false),
        ADDQ => (Kind::Store(StoreMode::Add), true),
        REPLACE => (Kind::Store(StoreMode::Replace), false),
        REPLACEQ => (Kind::Store(StoreMode::Replace), true),
        APPEND => (Kind::Store(StoreMode::Append), false),
        APPENDQ => (Kind::Store(StoreMode::Append), true),
        PREPEND => (Kind::Store(StoreMode::Prepend), false),
        PREPENDQ => (Kind::Store(StoreMode::Prepend), true),
        DELETE => (Kind::Delete, false),
        DELETEQ => (Kind::Delete, true),
        INCREMENT => (Kind::Arith { incr: true }, false),
        INCREMENTQ => (Kind::Arith { incr: true }, true),
        DECREMENT => (Kind::Arith { incr: false }, false),
        DECREMENTQ => (Kind::Arith { incr: false }, true),
        FLUSH => (Kind::Flush, false),
        FLUSHQ => (Kind::Flush, true),
        NOOP => (Kind::Noop, false),
        VERSION => (Kind::Version, false),
        QUIT => (Kind::Quit, false),
        QUITQ => (Kind::Quit, true),
        STAT => (Kind::Stat, false),
        SASL_LIST_MECHS => (Kind::SaslListMechs, false),
        SASL_AUTH => (Kind::SaslAuth, false),
        SASL_STEP => (Kind::SaslStep, false),
        _ => return None,
    };
    Some((k, quiet))
}

/// Whether the extras, key and body lengths are the ones memcached accepts for `kind`.
fn lengths_ok(kind: Kind, p: &Packet<'_>) -> bool {
    let (ext, key, body) = (p.ext(), p.key.len(), p.body());
    match kind {
        Kind::Get { .. } | Kind::Delete => ext == 0 && key > 0 && body == key,
        Kind::Gat { .. } | Kind::Touch => ext == 4 && key > 0,
        Kind::Store(StoreMode::Append | StoreMode::Prepend) => ext == 0 && key > 0,
        Kind::Store(_) => ext == 8 && key > 0,
        Kind::Arith { .. } => ext == 20 && key > 0 && body == key + ext,
        Kind::Flush => key == 0 && body == ext && (ext == 0 || ext == 4),
        Kind::Noop | Kind::Version | Kind::Quit | Kind::SaslListMechs => p.no_body(),
        Kind::Stat => ext == 0,
        Kind::SaslAuth | Kind::SaslStep => ext == 0 && key > 0,
    }
}

/// Parse one frame from the start of `buf`.
///
/// Deviations from memcached 1.6.18, all deliberate:
/// - an unknown opcode's body is swallowed exactly (memcached swallows `body length` bytes
///   *after* the extras and key it already read, eating into the next request);
/// - a value sent with `STAT`, `TOUCH` or `GAT*` is swallowed (memcached leaves it in the stream
///   and parses it as the next request);
/// - a SASL value over `item_size_max` is `ENOMEM` with the value swallowed even when the
///   executor has SASL off (memcached then says `UNKNOWN_COMMAND`).
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Result<Parsed<'a>, Incomplete> {
    let h = Header::decode(buf).ok_or(Incomplete)?;
    if h.magic != REQUEST_MAGIC {
        return Ok(Parsed {
            frame: Frame::Close,
            consumed: 0,
            swallow: 0,
        });
    }
    let ext = usize::from(h.extras_len);
    let key_len = usize::from(h.key_len);
    let fixed = HEADER_LEN + ext + key_len;
    if buf.len() < fixed {
        return Err(Incomplete);
    }
    let body = h.body_len as usize;
    let p = Packet {
        h,
        extras: &buf[HEADER_LEN..HEADER_LEN + ext],
        key: &buf[HEADER_LEN + ext..fixed],
        fixed,
        value_len: body.saturating_sub(ext + key_len),
    };
    if ext + key_len > body {
        return Ok(p.short_body());
    }
    if key_len > KEY_MAX {
        return Ok(p.invalid());
    }
    let Some((kind, quiet)) = kind(h.opcode) else {
        return Ok(p.error(status::UNKNOWN_COMMAND, false, p.value_len));
    };
    if !lengths_ok(kind, &p) {
        return Ok(p.invalid());
    }
    request(kind, quiet, p, buf, limits)
}

/// Build the request for a packet whose lengths fit its opcode.
fn request<'a>(
    kind: Kind,
    quiet: bool,
    p: Packet<'a>,
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Parsed<'a>, Incomplete> {
    let too_large = p.value_len > limits.item_size_max;
    if too_large && matches!(kind, Kind::SaslAuth | Kind::SaslStep) {
        return Ok(p.error(status::ENOMEM, false, p.value_len));
    }
    let command = match kind {
        Kind::Store(mode) if too_large => Command::TooLarge { mode, key: p.key },
        _ => command(kind, &p, buf)?,
    };
    // Stores and SASL use their value; the others swallow whatever follows the key (nothing,
    // unless the opcode lets memcached ignore a value).
    let uses_value = matches!(
        command,
        Command::Store { .. } | Command::SaslAuth { .. } | Command::SaslStep { .. }
    );
    let (consumed, swallow) = if uses_value {
        (p.fixed + p.value_len, 0)
    } else {
        (p.fixed, p.value_len)
    };
    let request = Request {
        opcode: p.h.opcode,
        opaque: p.h.opaque,
        cas: p.h.cas,
        quiet,
        command,
    };
    Ok(Parsed {
        frame: Frame::Request(request),
        consumed,
        swallow,
    })
}

/// The typed command, decoding the extras; stores and SASL wait for their whole value.
fn command<'a>(kind: Kind, p: &Packet<'a>, buf: &'a [u8]) -> Result<Command<'a>, Incomplete> {
    let (key, x) = (p.key, p.extras);
    let value = || buf.get(p.fixed..p.fixed + p.value_len).ok_or(Incomplete);
    Ok(match kind {
        Kind::Get { with_key } => Command::Get { key, with_key },
        Kind::Gat { with_key } => Command::Gat {
            key,
            exptime: be32(x),
            with_key,
        },
        Kind::Touch => Command::Touch {
            key,
            exptime: be32(x),
        },
        Kind::Store(mode) => {
            // APPEND/PREPEND carry no extras.
            let (flags, exptime) = match x.len() {
                8 => (be32(&x[0..4]), be32(&x[4..8])),
                _ => (0, 0),
            };
            Command::Store {
                mode,
                key,
                flags,
                exptime,
                value: value()?,
            }
        }
        Kind::Delete => Command::Delete { key },
        Kind::Arith { incr } => Command::Arith {
            incr,
            key,
            delta: be64(&x[0..8]),
            initial: be64(&x[8..16]),
            exptime: be32(&x[16..20]),
        },
        Kind::Flush => Command::Flush {
            exptime: if x.is_empty() { 0 } else { be32(x) },
        },
        Kind::Noop => Command::Noop,
        Kind::Version => Command::Version,
        Kind::Quit => Command::Quit,
        Kind::Stat => Command::Stat { group: key },
        Kind::SaslListMechs => Command::SaslListMechs,
        Kind::SaslAuth => Command::SaslAuth {
            mechanism: key,
            data: value()?,
        },
        Kind::SaslStep => Command::SaslStep {
            mechanism: key,
            data: value()?,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Responses

/// Append one response packet. `key` must be at most 65535 bytes and `extras` at most 255
/// (callers send keys the parser accepted, so at most `KEY_MAX`).
#[allow(clippy::too_many_arguments)]
pub fn response(
    out: &mut Vec<u8>,
    opcode: u8,
    status: u16,
    opaque: u32,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    debug_assert!(key.len() <= usize::from(u16::MAX) && extras.len() <= usize::from(u8::MAX));
    let body = extras.len() + key.len() + value.len();
    let h = Header {
        magic: RESPONSE_MAGIC,
        opcode,
        key_len: key.len() as u16,
        extras_len: extras.len() as u8,
        data_type: 0,
        vbucket_or_status: status,
        body_len: body as u32,
        opaque,
        cas,
    };
    out.reserve(HEADER_LEN + body);
    h.encode(out);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// An error reply: `status` with its text (`status_text`) as the body, CAS 0.
pub fn error(out: &mut Vec<u8>, opcode: u8, opaque: u32, status: u16) {
    error_text(out, opcode, opaque, status, status_text(status).as_bytes());
}

/// An error reply with a body of memkeep's own (a read-only user's refused write).
pub fn error_text(out: &mut Vec<u8>, opcode: u8, opaque: u32, status: u16, text: &[u8]) {
    response(out, opcode, status, opaque, 0, &[], &[], text);
}

/// The reply to a rejected request.
pub fn encode_error(out: &mut Vec<u8>, e: &ErrorReply) {
    error(out, e.opcode, e.opaque, e.status);
}

/// An empty success: stores (with the new CAS), delete, flush, noop, quit (CAS 0).
pub fn ok(out: &mut Vec<u8>, opcode: u8, opaque: u32, cas: u64) {
    response(out, opcode, status::OK, opaque, cas, &[], &[], &[]);
}

/// A success whose body is `text`: version, the SASL mechanism list, "Authenticated".
pub fn text(out: &mut Vec<u8>, opcode: u8, opaque: u32, text: &[u8]) {
    response(out, opcode, status::OK, opaque, 0, &[], &[], text);
}

/// A get/gat/touch hit: 4-byte flags as extras, the item's CAS, the key for the `K` variants
/// (else empty) and the value (empty for `TOUCH`).
pub fn hit(
    out: &mut Vec<u8>,
    opcode: u8,
    opaque: u32,
    cas: u64,
    flags: u32,
    key: &[u8],
    value: &[u8],
) {
    response(
        out,
        opcode,
        status::OK,
        opaque,
        cas,
        &flags.to_be_bytes(),
        key,
        value,
    );
}

/// A get/gat/touch miss: the `K` variants answer `KEY_ENOENT` with the key and no text, the
/// others `KEY_ENOENT` with "Not found" (pass an empty `key`).
pub fn miss(out: &mut Vec<u8>, opcode: u8, opaque: u32, key: &[u8]) {
    if key.is_empty() {
        error(out, opcode, opaque, status::KEY_ENOENT);
    } else {
        response(out, opcode, status::KEY_ENOENT, opaque, 0, &[], key, &[]);
    }
}

/// An incr/decr result: the new value as 8 bytes, with the item's new CAS.
pub fn counter(out: &mut Vec<u8>, opcode: u8, opaque: u32, cas: u64, value: u64) {
    response(
        out,
        opcode,
        status::OK,
        opaque,
        cas,
        &[],
        &[],
        &value.to_be_bytes(),
    );
}

/// One `STAT` reply packet; a stat reply is one packet per statistic, then `stat_end`.
pub fn stat(out: &mut Vec<u8>, opaque: u32, name: &[u8], value: &[u8]) {
    response(out, opcode::STAT, status::OK, opaque, 0, &[], name, value);
}

/// The empty packet that ends a `STAT` reply.
pub fn stat_end(out: &mut Vec<u8>, opaque: u32) {
    stat(out, opaque, &[], &[]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lim() -> Limits {
        Limits::default()
    }

    /// A request packet with consistent lengths.
    fn pkt(op: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        pkt_with(op, extras, key, value, 0x0102_0304, 0)
    }

    fn pkt_with(op: u8, extras: &[u8], key: &[u8], value: &[u8], opaque: u32, cas: u64) -> Vec<u8> {
        let body = extras.len() + key.len() + value.len();
        raw(op, extras, key, value, body as u32, opaque, cas)
    }

    /// A request packet whose body length is given, whatever follows.
    fn raw(
        op: u8,
        extras: &[u8],
        key: &[u8],
        value: &[u8],
        body: u32,
        opaque: u32,
        cas: u64,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        Header {
            magic: REQUEST_MAGIC,
            opcode: op,
            key_len: key.len() as u16,
            extras_len: extras.len() as u8,
            data_type: 0,
            vbucket_or_status: 0,
            body_len: body,
            opaque,
            cas,
        }
        .encode(&mut out);
        out.extend_from_slice(extras);
        out.extend_from_slice(key);
        out.extend_from_slice(value);
        out
    }

    fn se(flags: u32, exptime: u32) -> Vec<u8> {
        [flags.to_be_bytes(), exptime.to_be_bytes()].concat()
    }

    fn arith_ext(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
        let mut v = delta.to_be_bytes().to_vec();
        v.extend_from_slice(&initial.to_be_bytes());
        v.extend_from_slice(&exptime.to_be_bytes());
        v
    }

    /// Parses to a request using the whole buffer, nothing swallowed.
    fn req(buf: &[u8]) -> Request<'_> {
        let parsed = parse(buf, &lim()).expect("complete");
        assert_eq!(
            (parsed.consumed, parsed.swallow),
            (buf.len(), 0),
            "{buf:02x?}"
        );
        match parsed.frame {
            Frame::Request(r) => r,
            other => panic!("expected a request, got {other:?}"),
        }
    }

    fn cmd(buf: &[u8]) -> Command<'_> {
        req(buf).command
    }

    /// Parses to an error frame; returns it with consumed and swallow.
    fn err(buf: &[u8]) -> (ErrorReply, usize, usize) {
        let parsed = parse(buf, &lim()).expect("complete");
        match parsed.frame {
            Frame::Error(e) => (e, parsed.consumed, parsed.swallow),
            other => panic!("expected an error for {buf:02x?}, got {other:?}"),
        }
    }

    /// The reply is `Invalid arguments` and the connection closes.
    fn assert_invalid(buf: &[u8]) {
        let (e, _, swallow) = err(buf);
        assert_eq!(
            (e.status, e.close, swallow),
            (status::EINVAL, true, 0),
            "{buf:02x?}"
        );
        assert!(!e.before_auth);
    }

    // ---- header ----

    #[test]
    fn header_round_trips() {
        let h = Header {
            magic: 0x80,
            opcode: 0x01,
            key_len: 0x0203,
            extras_len: 8,
            data_type: 1,
            vbucket_or_status: 0xbeef,
            body_len: 0x0a0b0c0d,
            opaque: 0xdeadbeef,
            cas: 0x0102030405060708,
        };
        let mut out = Vec::new();
        h.encode(&mut out);
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(&out[..8], &[0x80, 0x01, 0x02, 0x03, 8, 1, 0xbe, 0xef]);
        assert_eq!(Header::decode(&out), Some(h));
        assert_eq!(Header::decode(&out[..23]), None);
    }

    #[test]
    fn first_byte_picks_the_protocol() {
        assert!(is_binary(0x80));
        assert!(!is_binary(b'g'));
        assert!(!is_binary(0x81));
    }

    // ---- requests ----

    #[test]
    fn simple_commands() {
        assert_eq!(cmd(&pkt(opcode::NOOP, &[], &[], &[])), Command::Noop);
        assert_eq!(cmd(&pkt(opcode::VERSION, &[], &[], &[])), Command::Version);
        assert_eq!(cmd(&pkt(opcode::QUIT, &[], &[], &[])), Command::Quit);
        assert_eq!(
            cmd(&pkt(opcode::SASL_LIST_MECHS, &[], &[], &[])),
            Command::SaslListMechs
        );
        let quitq = pkt(opcode::QUITQ, &[], &[], &[]);
        let r = req(&quitq);
        assert!(r.quiet);
        assert_eq!((r.opcode, r.command), (opcode::QUITQ, Command::Quit));
    }

    #[test]
    fn header_fields_are_carried() {
        let buf = pkt_with(opcode::DELETE, &[], b"k", &[], 0xcafe_f00d, 77);
        let r = req(&buf);
        assert_eq!(
            (r.opcode, r.opaque, r.cas, r.quiet),
            (opcode::DELETE, 0xcafe_f00d, 77, false)
        );
        assert_eq!(r.command, Command::Delete { key: b"k" });
    }

    #[test]
    fn data_type_and_vbucket_are_ignored() {
        let mut buf = pkt(opcode::NOOP, &[], &[], &[]);
        buf[5] = 1;
        buf[6] = 0x12;
        buf[7] = 0x34;
        assert_eq!(cmd(&buf), Command::Noop);
    }

    #[test]
    fn gets() {
        for (op, with_key, quiet) in [
            (opcode::GET, false, false),
            (opcode::GETQ, false, true),
            (opcode::GETK, true, false),
            (opcode::GETKQ, true, true),
        ] {
            let buf = pkt(op, &[], b"foo", &[]);
            let r = req(&buf);
            assert_eq!(r.quiet, quiet, "{op:#x}");
            assert_eq!(
                r.command,
                Command::Get {
                    key: b"foo",
                    with_key
                }
            );
        }
    }

    #[test]
    fn gat_and_touch() {
        for (op, with_key, quiet) in [
            (opcode::GAT, false, false),
            (opcode::GATQ, false, true),
            (opcode::GATK, true, false),
            (opcode::GATKQ, true, true),
        ] {
            let buf = pkt(op, &100u32.to_be_bytes(), b"k", &[]);
            let r = req(&buf);
            assert_eq!(r.quiet, quiet, "{op:#x}");
            assert_eq!(
                r.command,
                Command::Gat {
                    key: b"k",
                    exptime: 100,
                    with_key
                }
            );
        }
        assert_eq!(
            cmd(&pkt(
                opcode::TOUCH,
                &0xffff_fffeu32.to_be_bytes(),
                b"k",
                &[]
            )),
            Command::Touch {
                key: b"k",
                exptime: 0xffff_fffe
            }
        );
    }

    #[test]
    fn stores() {
        for (op, mode, quiet) in [
            (opcode::SET, StoreMode::Set, false),
            (opcode::SETQ, StoreMode::Set, true),
            (opcode::ADD, StoreMode::Add, false),
            (opcode::ADDQ, StoreMode::Add, true),
            (opcode::REPLACE, StoreMode::Replace, false),
            (opcode::REPLACEQ, StoreMode::Replace, true),
        ] {
            let buf = pkt_with(op, &se(0xdead_beef, 3600), b"key", b"value", 1, 42);
            let r = req(&buf);
            assert_eq!((r.quiet, r.cas), (quiet, 42), "{op:#x}");
            assert_eq!(
                r.command,
                Command::Store {
                    mode,
                    key: b"key",
                    flags: 0xdead_beef,
                    exptime: 3600,
                    value: b"value"
                }
            );
        }
    }

    #[test]
    fn append_prepend_have_no_extras() {
        for (op, mode, quiet) in [
            (opcode::APPEND, StoreMode::Append, false),
            (opcode::APPENDQ, StoreMode::Append, true),
            (opcode::PREPEND, StoreMode::Prepend, false),
            (opcode::PREPENDQ, StoreMode::Prepend, true),
        ] {
            let buf = pkt(op, &[], b"k", b"xyz");
            let r = req(&buf);
            assert_eq!(r.quiet, quiet);
            assert_eq!(
                r.command,
                Command::Store {
                    mode,
                    key: b"k",
                    flags: 0,
                    exptime: 0,
                    value: b"xyz"
                }
            );
            assert_invalid(&pkt(op, &se(0, 0), b"k", b"xyz"));
        }
    }

    #[test]
    fn empty_values_are_values() {
        assert!(matches!(
            cmd(&pkt(opcode::SET, &se(0, 0), b"k", b"")),
            Command::Store { value: b"", .. }
        ));
        assert!(matches!(
            cmd(&pkt(opcode::APPEND, &[], b"k", b"")),
            Command::Store { value: b"", .. }
        ));
    }

    #[test]
    fn keys_are_any_bytes() {
        let key = b"a b\r\n\x00\xff";
        assert_eq!(
            cmd(&pkt(opcode::GET, &[], key, &[])),
            Command::Get {
                key,
                with_key: false
            }
        );
    }

    #[test]
    fn arith() {
        for (op, incr, quiet) in [
            (opcode::INCREMENT, true, false),
            (opcode::INCREMENTQ, true, true),
            (opcode::DECREMENT, false, false),
            (opcode::DECREMENTQ, false, true),
        ] {
            let buf = pkt(op, &arith_ext(u64::MAX, 7, ARITH_NO_CREATE), b"n", &[]);
            let r = req(&buf);
            assert_eq!(r.quiet, quiet);
            assert_eq!(
                r.command,
                Command::Arith {
                    incr,
                    key: b"n",
                    delta: u64::MAX,
                    initial: 7,
                    exptime: ARITH_NO_CREATE
                }
            );
        }
    }

    #[test]
    fn flush_with_and_without_delay() {
        assert_eq!(
            cmd(&pkt(opcode::FLUSH, &[], &[], &[])),
            Command::Flush { exptime: 0 }
        );
        let buf = pkt(opcode::FLUSHQ, &9u32.to_be_bytes(), &[], &[]);
        let r = req(&buf);
        assert!(r.quiet);
        assert_eq!(r.command, Command::Flush { exptime: 9 });
    }

    #[test]
    fn stat_groups() {
        assert_eq!(
            cmd(&pkt(opcode::STAT, &[], &[], &[])),
            Command::Stat { group: b"" }
        );
        assert_eq!(
            cmd(&pkt(opcode::STAT, &[], b"settings", &[])),
            Command::Stat { group: b"settings" }
        );
    }

    #[test]
    fn sasl() {
        assert_eq!(
            cmd(&pkt(opcode::SASL_AUTH, &[], b"PLAIN", b"\0user\0pw")),
            Command::SaslAuth {
                mechanism: b"PLAIN",
                data: b"\0user\0pw"
            }
        );
        assert_eq!(
            cmd(&pkt(opcode::SASL_STEP, &[], b"PLAIN", b"")),
            Command::SaslStep {
                mechanism: b"PLAIN",
                data: b""
            }
        );
        // The mechanism length is the executor's to check (its answer depends on SASL being on).
        let long = [b'M'; SASL_MECH_MAX + 1];
        assert!(matches!(
            cmd(&pkt(opcode::SASL_AUTH, &[], &long, b"x")),
            Command::SaslAuth { .. }
        ));
        assert_invalid(&pkt(opcode::SASL_AUTH, &[], &[], b"\0u\0p"));
        assert_invalid(&pkt(opcode::SASL_AUTH, &[1, 2, 3, 4], b"PLAIN", b"\0u\0p"));
        assert_invalid(&pkt(opcode::SASL_LIST_MECHS, &[], b"x", &[]));
    }

    #[test]
    fn consumed_stops_at_the_first_packet() {
        let mut buf = pkt(opcode::GET, &[], b"a", &[]);
        let first = buf.len();
        buf.extend(pkt(opcode::NOOP, &[], &[], &[]));
        let parsed = parse(&buf, &lim()).unwrap();
        assert_eq!((parsed.consumed, parsed.swallow), (first, 0));
    }

    // ---- framing errors ----

    #[test]
    fn short_header_is_incomplete() {
        assert_eq!(parse(&[], &lim()), Err(Incomplete));
        assert_eq!(parse(&[0x80; 23], &lim()), Err(Incomplete));
        // Even with a bad magic: memcached waits for a whole header first.
        assert_eq!(parse(&[0x00; 23], &lim()), Err(Incomplete));
    }

    #[test]
    fn bad_magic_closes() {
        for magic in [0x00, 0x81, b'g'] {
            let mut buf = pkt(opcode::NOOP, &[], &[], &[]);
            buf[0] = magic;
            let parsed = parse(&buf, &lim()).unwrap();
            assert_eq!(parsed.frame, Frame::Close, "{magic:#x}");
        }
    }

    #[test]
    fn body_shorter_than_key_and_extras_is_unknown_and_closes() {
        let buf = raw(opcode::GET, &[], b"abc", &[], 2, 9, 0);
        let (e, consumed, swallow) = err(&buf);
        assert_eq!(
            e,
            ErrorReply {
                opcode: opcode::GET,
                opaque: 9,
                status: status::UNKNOWN_COMMAND,
                close: true,
                before_auth: true
            }
        );
        assert_eq!((consumed, swallow), (buf.len(), 0));
        // Decided only once the key is in, as memcached does.
        assert_eq!(parse(&buf[..buf.len() - 1], &lim()), Err(Incomplete));
        let ext = raw(opcode::SET, &se(0, 0), b"k", &[], 8, 0, 0);
        assert_eq!(err(&ext).0.status, status::UNKNOWN_COMMAND);
        let unknown = raw(0x50, &[1, 2], &[], &[], 1, 0, 0);
        assert!(err(&unknown).0.close);
    }

    #[test]
    fn key_over_250_is_invalid_and_closes() {
        let key = [b'k'; KEY_MAX + 1];
        for op in [opcode::GET, opcode::DELETE, 0x50] {
            let buf = pkt(op, &[], &key, &[]);
            assert_invalid(&buf);
            assert_eq!(parse(&buf[..buf.len() - 1], &lim()), Err(Incomplete));
        }
        assert!(matches!(
            cmd(&pkt(opcode::GET, &[], &key[..KEY_MAX], &[])),
            Command::Get { .. }
        ));
    }

    /// Opcode, extras, key, value.
    type Shape<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

    #[test]
    fn wrong_lengths_are_invalid_and_close() {
        let k: &[u8] = b"k";
        let e4: &[u8] = &[0; 4];
        let e8 = se(0, 0);
        let e20 = arith_ext(1, 0, 0);
        use opcode::*;
        let cases: Vec<Shape<'_>> = vec![
            (VERSION, &[], k, &[]),
            (VERSION, &[], &[], b"v"),
            (NOOP, e4, &[], &[]),
            (QUIT, &[], k, &[]),
            (QUITQ, &[], &[], b"v"),
            (FLUSH, &[], k, &[]),
            (FLUSH, &e8, &[], &[]),
            (FLUSH, e4, &[], b"v"),
            (SET, &[], k, b"v"),
            (SET, e4, k, b"v"),
            (SETQ, &e8, &[], b"v"),
            (ADD, &e20, k, b"v"),
            (GET, e4, k, &[]),
            (GET, &[], &[], &[]),
            (GETK, &[], k, b"v"),
            (GETQ, &[], &[], b"v"),
            (DELETE, e4, k, &[]),
            (DELETE, &[], k, b"v"),
            (DELETEQ, &[], &[], &[]),
            (INCREMENT, &e8, k, &[]),
            (INCREMENT, &e20, &[], &[]),
            (DECREMENTQ, &e20, k, b"v"),
            (APPEND, &[], &[], b"v"),
            (PREPEND, e4, k, b"v"),
            (STAT, e4, &[], &[]),
            (TOUCH, &[], k, &[]),
            (TOUCH, e4, &[], &[]),
            (GAT, &e8, k, &[]),
            (GATKQ, e4, &[], &[]),
            (SASL_STEP, &[], &[], b"x"),
        ];
        for (op, extras, key, value) in cases {
            assert_invalid(&pkt(op, extras, key, value));
        }
    }

    #[test]
    fn invalid_is_decided_before_the_value_arrives() {
        let buf = pkt(opcode::GET, &[], b"k", b"value");
        let without_value = &buf[..HEADER_LEN + 1];
        assert_invalid(without_value);
    }

    #[test]
    fn unknown_opcodes_swallow_their_body() {
        for op in [0x1f, 0x25, 0x50, 0xff, opcode::VERBOSITY] {
            let buf = pkt_with(op, &[0; 4], b"key", b"value", 5, 0);
            let (e, consumed, swallow) = err(&buf);
            assert_eq!(
                e,
                ErrorReply {
                    opcode: op,
                    opaque: 5,
                    status: status::UNKNOWN_COMMAND,
                    close: false,
                    before_auth: false
                }
            );
            assert_eq!((consumed, swallow), (HEADER_LEN + 7, 5));
            // Answered before the value arrives.
            assert_eq!(err(&buf[..HEADER_LEN + 7]).0, e);
        }
    }

    #[test]
    fn over_size_values_are_swallowed() {
        let l = Limits {
            item_size_max: 4,
            ..Limits::default()
        };
        for (op, extras) in [(opcode::SET, se(1, 2)), (opcode::APPENDQ, vec![])] {
            let head = pkt(op, &extras, b"k", &[]);
            let mut buf = head.clone();
            buf[8..12].copy_from_slice(&((extras.len() + 1 + 5) as u32).to_be_bytes());
            let parsed = parse(&buf, &l).unwrap();
            assert_eq!((parsed.consumed, parsed.swallow), (head.len(), 5));
            let Frame::Request(r) = parsed.frame else {
                panic!("expected TooLarge, got {:?}", parsed.frame);
            };
            assert!(matches!(r.command, Command::TooLarge { key: b"k", .. }));
            assert_eq!(r.quiet, op == opcode::APPENDQ);
        }
        // At the limit: a request, once all of it is in.
        let at = pkt(opcode::SET, &se(0, 0), b"k", b"1234");
        assert_eq!(parse(&at[..at.len() - 1], &l), Err(Incomplete));
        assert!(matches!(parse(&at, &l).unwrap().frame, Frame::Request(_)));
    }

    #[test]
    fn huge_declared_body_is_not_buffered() {
        let mut buf = pkt(opcode::SET, &se(0, 0), b"k", &[]);
        buf[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        let parsed = parse(&buf, &lim()).unwrap();
        assert_eq!(parsed.consumed, buf.len());
        assert_eq!(parsed.swallow, u32::MAX as usize - 9);
    }

    #[test]
    fn over_size_sasl_data_is_out_of_memory() {
        let l = Limits {
            item_size_max: 2,
            ..Limits::default()
        };
        let buf = pkt(opcode::SASL_AUTH, &[], b"PLAIN", b"abc");
        let parsed = parse(&buf, &l).unwrap();
        let Frame::Error(e) = parsed.frame else {
            panic!("{:?}", parsed.frame)
        };
        assert_eq!((e.status, e.close), (status::ENOMEM, false));
        assert_eq!((parsed.consumed, parsed.swallow), (buf.len() - 3, 3));
    }

    #[test]
    fn values_sent_with_stat_touch_gat_are_swallowed() {
        for (op, extras) in [
            (opcode::STAT, vec![]),
            (opcode::TOUCH, vec![0; 4]),
            (opcode::GATQ, vec![0; 4]),
        ] {
            let buf = pkt(op, &extras, b"k", b"junk");
            let parsed = parse(&buf, &lim()).unwrap();
            assert!(matches!(parsed.frame, Frame::Request(_)), "{op:#x}");
            assert_eq!((parsed.consumed, parsed.swallow), (buf.len() - 4, 4));
        }
    }

    // ---- responses ----

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn responses_match_memcached_bytes() {
        // Captured from memcached 1.6.18.
        let mut out = Vec::new();
        text(&mut out, opcode::VERSION, 0, b"1.6.18");
        assert_eq!(
            out,
            hex("810b0000 00000000 00000006 00000000 0000000000000000 312e362e3138")
        );
        out.clear();
        error(&mut out, opcode::GET, 9, status::KEY_ENOENT);
        let mut want = hex("81000000 00000001 00000009 00000009 0000000000000000");
        want.extend_from_slice(b"Not found");
        assert_eq!(out, want);
        out.clear();
        miss(&mut out, opcode::GETK, 1, b"zz");
        let mut want = hex("810c0002 00000001 00000002 00000001 0000000000000000");
        want.extend_from_slice(b"zz");
        assert_eq!(out, want);
        out.clear();
        hit(&mut out, opcode::GETK, 9, 31, 5, b"foo", b"bar");
        let mut want = hex("810c0003 04000000 0000000a 00000009 000000000000001f 00000005");
        want.extend_from_slice(b"foobar");
        assert_eq!(out, want);
    }

    #[test]
    fn response_shapes() {
        let mut out = Vec::new();
        counter(&mut out, opcode::INCREMENT, 1, 8, 10);
        assert_eq!(
            &out[..HEADER_LEN],
            &hex("81050000 00000000 00000008 00000001 0000000000000008")
        );
        assert_eq!(&out[HEADER_LEN..], &10u64.to_be_bytes());
        out.clear();
        ok(&mut out, opcode::SET, 7, 31);
        assert_eq!(
            out,
            hex("81010000 00000000 00000000 00000007 000000000000001f")
        );
        out.clear();
        stat(&mut out, 3, b"pid", b"12");
        stat_end(&mut out, 3);
        assert_eq!(
            out,
            [
                hex("81100003 00000000 00000005 00000003 0000000000000000"),
                b"pid12".to_vec(),
                hex("81100000 00000000 00000000 00000003 0000000000000000"),
            ]
            .concat()
        );
        out.clear();
        let e = ErrorReply {
            opcode: 0x50,
            opaque: 1,
            status: status::UNKNOWN_COMMAND,
            close: false,
            before_auth: false,
        };
        encode_error(&mut out, &e);
        assert_eq!(&out[HEADER_LEN..], b"Unknown command");
        assert_eq!(Header::decode(&out).unwrap().vbucket_or_status, 0x81);
    }

    #[test]
    fn every_error_status_has_memcacheds_text() {
        for (st, text) in [
            (status::KEY_ENOENT, "Not found"),
            (status::KEY_EEXISTS, "Data exists for key."),
            (status::E2BIG, "Too large."),
            (status::EINVAL, "Invalid arguments"),
            (status::NOT_STORED, "Not stored."),
            (
                status::DELTA_BADVAL,
                "Non-numeric server-side value for incr or decr",
            ),
            (status::AUTH_ERROR, "Auth failure."),
            (status::UNKNOWN_COMMAND, "Unknown command"),
            (status::ENOMEM, "Out of memory"),
        ] {
            assert_eq!(status_text(st), text);
        }
        assert_eq!(status_text(status::OK), "");
    }

    #[test]
    fn auth_exemptions() {
        for op in [
            opcode::VERSION,
            opcode::SASL_AUTH,
            opcode::SASL_STEP,
            opcode::SASL_LIST_MECHS,
        ] {
            assert!(auth_exempt(op));
        }
        for op in [opcode::NOOP, opcode::QUIT, opcode::GET, 0x50] {
            assert!(!auth_exempt(op));
        }
    }

    // ---- properties ----

    /// One valid request of every kind, with arbitrary contents.
    fn valid_packet() -> impl Strategy<Value = Vec<u8>> {
        use opcode::*;
        let key = prop::collection::vec(any::<u8>(), 1..=KEY_MAX);
        let value = prop::collection::vec(any::<u8>(), 0..300);
        let no_body =
            prop::sample::select(vec![NOOP, VERSION, QUIT, QUITQ, SASL_LIST_MECHS, FLUSH]);
        let keyed = prop::sample::select(vec![GET, GETQ, GETK, GETKQ, DELETE, DELETEQ, STAT]);
        let stores = prop::sample::select(vec![SET, SETQ, ADD, ADDQ, REPLACE, REPLACEQ]);
        let concat = prop::sample::select(vec![
            APPEND, APPENDQ, PREPEND, PREPENDQ, SASL_AUTH, SASL_STEP,
        ]);
        let touchy = prop::sample::select(vec![TOUCH, GAT, GATQ, GATK, GATKQ, FLUSHQ]);
        let arith = prop::sample::select(vec![INCREMENT, INCREMENTQ, DECREMENT, DECREMENTQ]);
        let header = (any::<u32>(), any::<u64>());
        prop_oneof![
            (no_body, header).prop_map(|(op, (o, c))| pkt_with(op, &[], &[], &[], o, c)),
            (keyed, key.clone(), header).prop_map(|(op, k, (o, c))| pkt_with(
                op,
                &[],
                &k,
                &[],
                o,
                c
            )),
            (stores, any::<[u8; 8]>(), key.clone(), value.clone(), header)
                .prop_map(|(op, x, k, v, (o, c))| pkt_with(op, &x, &k, &v, o, c)),
            (concat, key.clone(), value, header).prop_map(|(op, k, v, (o, c))| pkt_with(
                op,
                &[],
                &k,
                &v,
                o,
                c
            )),
            (touchy, any::<[u8; 4]>(), key.clone(), header).prop_map(|(op, x, k, (o, c))| {
                let k = if op == FLUSHQ { Vec::new() } else { k };
                pkt_with(op, &x, &k, &[], o, c)
            }),
            (arith, any::<[u8; 20]>(), key, header).prop_map(|(op, x, k, (o, c))| pkt_with(
                op,
                &x,
                &k,
                &[],
                o,
                c
            )),
        ]
    }

    /// The extras, key and value a command was decoded from, re-encoded.
    fn parts(c: &Command<'_>) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        match *c {
            Command::Get { key, .. } | Command::Delete { key } => (vec![], key.to_vec(), vec![]),
            Command::Stat { group } => (vec![], group.to_vec(), vec![]),
            Command::Gat { key, exptime, .. } | Command::Touch { key, exptime } => {
                (exptime.to_be_bytes().to_vec(), key.to_vec(), vec![])
            }
            Command::Store {
                mode,
                key,
                flags,
                exptime,
                value,
            } => {
                let x = match mode {
                    StoreMode::Append | StoreMode::Prepend => vec![],
                    _ => se(flags, exptime),
                };
                (x, key.to_vec(), value.to_vec())
            }
            Command::Arith {
                key,
                delta,
                initial,
                exptime,
                ..
            } => (arith_ext(delta, initial, exptime), key.to_vec(), vec![]),
            Command::Flush { exptime } => (exptime.to_be_bytes().to_vec(), vec![], vec![]),
            Command::SaslAuth { mechanism, data } | Command::SaslStep { mechanism, data } => {
                (vec![], mechanism.to_vec(), data.to_vec())
            }
            Command::TooLarge { .. }
            | Command::Noop
            | Command::Version
            | Command::Quit
            | Command::SaslListMechs => (vec![], vec![], vec![]),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn valid_packets_round_trip(buf in valid_packet()) {
            let h = Header::decode(&buf).unwrap();
            let r = req(&buf);
            prop_assert_eq!((r.opcode, r.opaque, r.cas), (h.opcode, h.opaque, h.cas));
            let (x, k, v) = parts(&r.command);
            let no_extras_flush = r.command == Command::Flush { exptime: 0 } && h.extras_len == 0;
            let rebuilt = if no_extras_flush {
                pkt_with(h.opcode, &[], &k, &v, h.opaque, h.cas)
            } else {
                pkt_with(h.opcode, &x, &k, &v, h.opaque, h.cas)
            };
            prop_assert_eq!(rebuilt, buf);
        }

        #[test]
        fn prefixes_of_valid_packets_are_incomplete(buf in valid_packet()) {
            for end in 0..buf.len() {
                prop_assert_eq!(parse(&buf[..end], &lim()), Err(Incomplete), "prefix {}", end);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(buf in prop::collection::vec(any::<u8>(), 0..400)) {
            check_invariants(&buf)?;
        }

        #[test]
        fn arbitrary_headers_never_panic(
            op in any::<u8>(),
            ext in 0u8..24,
            key in 0usize..260,
            body in prop_oneof![0u32..300, any::<u32>()],
            tail in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut buf = raw(op, &vec![7; ext as usize], &vec![b'k'; key], &[], body, 1, 2);
            buf.extend(tail);
            check_invariants(&buf)?;
        }

        #[test]
        fn split_packets_parse_the_same(
            packets in prop::collection::vec(valid_packet(), 1..4),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let stream: Vec<u8> = packets.concat();
            let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
            cuts.push(stream.len());
            cuts.sort_unstable();
            // Deliver the stream in pieces; parse whenever bytes arrive.
            let mut got = Vec::new();
            let (mut start, mut delivered) = (0, 0);
            for cut in cuts {
                delivered = delivered.max(cut);
                while let Ok(p) = parse(&stream[start..delivered], &lim()) {
                    prop_assert_eq!(p.swallow, 0);
                    got.push(stream[start..start + p.consumed].to_vec());
                    start += p.consumed;
                }
            }
            prop_assert_eq!(start, stream.len());
            prop_assert_eq!(got, packets);
        }

        #[test]
        fn every_byte_boundary_parses_the_same(buf in valid_packet(), extra in 0usize..30) {
            // A packet followed by part of another: the first parse is the same at every length
            // from its own end on.
            let mut stream = buf.clone();
            stream.extend(pkt(opcode::NOOP, &[], &[], &[]).into_iter().take(extra));
            let whole = parse(&buf, &lim()).unwrap();
            for end in buf.len()..=stream.len() {
                prop_assert_eq!(&parse(&stream[..end], &lim()).unwrap(), &whole);
            }
        }
    }

    /// Whatever the input: no panic, `consumed` within the buffer, and a frame that keeps the
    /// connection open covers exactly one packet (header + declared body).
    fn check_invariants(buf: &[u8]) -> Result<(), TestCaseError> {
        let Ok(p) = parse(buf, &lim()) else {
            return Ok(());
        };
        prop_assert!(p.consumed <= buf.len());
        let closes = match &p.frame {
            Frame::Close => true,
            Frame::Error(e) => e.close,
            Frame::Request(_) => false,
        };
        if !closes {
            let h = Header::decode(buf).unwrap();
            prop_assert_eq!(p.consumed + p.swallow, HEADER_LEN + h.body_len as usize);
            // Deciding again with more bytes gives the same answer.
            let mut more = buf.to_vec();
            more.extend_from_slice(&[0x80; 8]);
            prop_assert_eq!(parse(&more, &lim()).unwrap(), p);
        }
        Ok(())
    }
}
