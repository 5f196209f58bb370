//! Redis 7.0's DUMP format, for DUMP and RESTORE: one value in RDB encoding, then the RDB
//! version (2 bytes, little-endian; Redis 7.0 writes 10) and a CRC-64 of everything before it
//! (8 bytes, little-endian; the Jones polynomial, reflected, as Redis's `crc64.c` computes it).
//!
//! The value is its RDB object type (one byte) and its encoding:
//! - lengths: 6 bits (`00`), 14 bits (`01`, big-endian), `0x80` + 32 bits or `0x81` + 64 bits
//!   (big-endian); `11` marks a specially encoded string: an 8, 16 or 32-bit integer
//!   (little-endian) or an LZF-compressed string (compressed length, length, data);
//! - strings: a length and the bytes, or one of the special encodings;
//! - listpacks (`lp` below): total bytes (u32 LE), element count (u16 LE, 65535 = unknown),
//!   entries (encoding, data, back-length), `0xFF`; intsets: encoding width (u32 LE: 2, 4 or
//!   8), count (u32 LE), the integers little-endian in ascending order.
//!
//! `decode` reads what redis-server 7.0 writes, and what older ones wrote: strings (types 0),
//! lists (1: plain, 10: ziplist, 14: quicklist of ziplists (Redis 3.2 to 6.2), 18: quicklist 2
//! with plain or listpack nodes), sets (2: plain, 11: intset, 20: listpack, as Redis 7.2
//! writes), sorted sets (3: text scores, 5: binary scores, 12: ziplist, 17: listpack) and
//! hashes (4: plain, 9: zipmap, 13: ziplist, 16: listpack). Streams and modules are refused as
//! a bad format, as are empty collections and duplicate members, fields or NaN scores (Redis
//! refuses those too). Every length is checked against the bytes left before anything is
//! allocated for it, and what a payload decodes to is bounded (`decode`'s `limit`): an LZF
//! string can grow about 88-fold.
//!
//! `encode` writes plain forms that any Redis 7.0 restores: strings as Redis writes them without
//! compression (a canonical integer that fits 32 bits in its integer encoding, else raw), lists
//! as a quicklist of listpack nodes of about 8 KiB, sets as type 2, sorted sets as type 5,
//! hashes as type 4.

use std::collections::HashSet;

/// The RDB version written after the value, and the newest one read.
pub const RDB_VERSION: u16 = 10;

const T_STRING: u8 = 0;
const T_LIST: u8 = 1;
const T_SET: u8 = 2;
const T_ZSET: u8 = 3;
const T_HASH: u8 = 4;
const T_ZSET_2: u8 = 5;
const T_HASH_ZIPMAP: u8 = 9;
const T_LIST_ZIPLIST: u8 = 10;
const T_SET_INTSET: u8 = 11;
const T_ZSET_ZIPLIST: u8 = 12;
const T_HASH_ZIPLIST: u8 = 13;
const T_LIST_QUICKLIST: u8 = 14;
const T_HASH_LISTPACK: u8 = 16;
const T_ZSET_LISTPACK: u8 = 17;
const T_LIST_QUICKLIST_2: u8 = 18;
const T_SET_LISTPACK: u8 = 20;

/// Quicklist node containers.
const NODE_PLAIN: u64 = 1;
const NODE_PACKED: u64 = 2;

/// What each decoded element is charged against the limit besides its bytes.
const ELEM_COST: usize = 16;

/// A listpack node of a dumped list is closed once it passes this many bytes (Redis's default
/// `list-max-listpack-size -2`).
const NODE_BYTES: usize = 8192;

/// A decoded value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    String(Vec<u8>),
    List(Vec<Vec<u8>>),
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    Set(Vec<Vec<u8>>),
    ZSet(Vec<(Vec<u8>, f64)>),
}

/// Why a payload was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadPayload {
    /// Shorter than its footer, a version newer than `RDB_VERSION`, or a wrong checksum.
    Checksum,
    /// Not a value `decode` reads (or a malformed one).
    Format,
    /// It would decode to more than the limit.
    TooLarge,
}

impl BadPayload {
    /// The error reply: Redis's texts for the first two.
    pub fn message(self) -> &'static str {
        match self {
            BadPayload::Checksum => "ERR DUMP payload version or checksum are wrong",
            BadPayload::Format => "ERR Bad data format",
            BadPayload::TooLarge => {
                "ERR memkeep: the DUMP payload decodes to more than twice proto-max-bulk-len"
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CRC-64 (Jones polynomial 0xad93d23594c935a9, reflected input and output, initial value 0, no
// final xor): check value 0xe9c6d914c4b8d9ca for "123456789".

const CRC64_REFLECTED_POLY: u64 = 0x95ac_9329_ac4b_c9b5;

const fn crc64_table() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u64;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ CRC64_REFLECTED_POLY
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static CRC64_TABLE: [u64; 256] = crc64_table();

/// Redis's `crc64(crc, data)`.
pub fn crc64(mut crc: u64, data: &[u8]) -> u64 {
    for &b in data {
        crc = CRC64_TABLE[((crc ^ b as u64) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

// ---------------------------------------------------------------------------------------------
// LZF (the decompressor of liblzf's format, which Redis compresses strings with).

/// Decompresses `input` into exactly `len` bytes; None if it is malformed or decompresses to
/// any other length.
pub fn lzf_decompress(input: &[u8], len: usize) -> Option<Vec<u8>> {
    // A back reference of 3 input bytes yields at most 264 output bytes: the output can never
    // exceed 88 times the input, whatever `len` claims.
    let mut out: Vec<u8> = Vec::with_capacity(len.min(input.len().saturating_mul(88)));
    let mut ip = 0;
    while ip < input.len() {
        let ctrl = input[ip] as usize;
        ip += 1;
        if ctrl < 32 {
            let run = ctrl + 1;
            let lit = input.get(ip..ip + run)?;
            if out.len() + run > len {
                return None;
            }
            out.extend_from_slice(lit);
            ip += run;
        } else {
            let mut n = ctrl >> 5;
            if n == 7 {
                n += *input.get(ip)? as usize;
                ip += 1;
            }
            let low = *input.get(ip)? as usize;
            ip += 1;
            let back = ((ctrl & 0x1f) << 8) + low + 1;
            let from = out.len().checked_sub(back)?;
            if out.len() + n + 2 > len {
                return None;
            }
            // Byte by byte: the reference may overlap what it produces.
            for i in 0..n + 2 {
                let b = out[from + i];
                out.push(b);
            }
        }
    }
    (out.len() == len).then_some(out)
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// Checks the footer of a DUMP payload (version, then checksum); the value before it.
pub fn verify(payload: &[u8]) -> Result<&[u8], BadPayload> {
    let Some(body_len) = payload.len().checked_sub(10) else {
        return Err(BadPayload::Checksum);
    };
    let footer = &payload[body_len..];
    let version = u16::from_le_bytes([footer[0], footer[1]]);
    if version > RDB_VERSION {
        return Err(BadPayload::Checksum);
    }
    let mut crc = [0u8; 8];
    crc.copy_from_slice(&footer[2..]);
    if crc64(0, &payload[..body_len + 2]) != u64::from_le_bytes(crc) {
        return Err(BadPayload::Checksum);
    }
    Ok(&payload[..body_len])
}

/// Decodes a DUMP payload (footer included). `limit` bounds the bytes it decodes to (each
/// element also counts `ELEM_COST`).
pub fn decode(payload: &[u8], limit: usize) -> Result<Value, BadPayload> {
    verify(payload)?;
    // As Redis, the value is read from the whole payload: a value that runs into the footer
    // reads its bytes (and nothing past it).
    let mut r = Reader {
        buf: payload,
        pos: 0,
        budget: limit,
    };
    let ty = r.byte()?;
    match ty {
        T_STRING => Ok(Value::String(r.string()?)),
        T_LIST => {
            let n = r.plain_len()?;
            let mut items = Vec::new();
            for _ in 0..n {
                items.push(r.string()?);
            }
            nonempty(&items)?;
            Ok(Value::List(items))
        }
        T_LIST_ZIPLIST => {
            let data = r.string()?;
            let items = ziplist(&data, &mut r.budget)?;
            nonempty(&items)?;
            Ok(Value::List(items))
        }
        T_LIST_QUICKLIST => {
            // Redis 3.2 to 6.2: every node a ziplist (an empty one is passed over, as Redis
            // does).
            let nodes = r.plain_len()?;
            let mut items = Vec::new();
            for _ in 0..nodes {
                let data = r.string()?;
                items.extend(ziplist(&data, &mut r.budget)?);
            }
            nonempty(&items)?;
            Ok(Value::List(items))
        }
        T_LIST_QUICKLIST_2 => {
            let nodes = r.plain_len()?;
            let mut items = Vec::new();
            for _ in 0..nodes {
                let container = r.plain_len()?;
                let data = r.string()?;
                match container {
                    NODE_PLAIN => items.push(data),
                    NODE_PACKED => items.extend(listpack(&data, &mut r.budget)?),
                    _ => return Err(BadPayload::Format),
                }
            }
            nonempty(&items)?;
            Ok(Value::List(items))
        }
        T_SET => {
            let n = r.plain_len()?;
            let mut members = Vec::new();
            for _ in 0..n {
                members.push(r.string()?);
            }
            distinct(members.iter().map(Vec::as_slice))?;
            nonempty(&members)?;
            Ok(Value::Set(members))
        }
        T_SET_INTSET => {
            let data = r.string()?;
            let members = intset(&data, &mut r.budget)?;
            nonempty(&members)?;
            Ok(Value::Set(members))
        }
        T_SET_LISTPACK => {
            let data = r.string()?;
            let members = listpack(&data, &mut r.budget)?;
            distinct(members.iter().map(Vec::as_slice))?;
            nonempty(&members)?;
            Ok(Value::Set(members))
        }
        T_ZSET | T_ZSET_2 => {
            let n = r.plain_len()?;
            let mut pairs = Vec::new();
            for _ in 0..n {
                let m = r.string()?;
                let s = if ty == T_ZSET_2 {
                    f64::from_le_bytes(r.take(8)?.try_into().map_err(|_| BadPayload::Format)?)
                } else {
                    r.text_double()?
                };
                if s.is_nan() {
                    return Err(BadPayload::Format);
                }
                pairs.push((m, s));
            }
            Ok(Value::ZSet(keyed(pairs)?))
        }
        T_ZSET_LISTPACK | T_ZSET_ZIPLIST => {
            let data = r.string()?;
            let flat = if ty == T_ZSET_LISTPACK {
                listpack(&data, &mut r.budget)?
            } else {
                ziplist(&data, &mut r.budget)?
            };
            let mut pairs = Vec::new();
            for (m, s) in flat_pairs(flat)? {
                let s: f64 = std::str::from_utf8(&s)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or(BadPayload::Format)?;
                if s.is_nan() {
                    return Err(BadPayload::Format);
                }
                pairs.push((m, s));
            }
            Ok(Value::ZSet(keyed(pairs)?))
        }
        T_HASH => {
            let n = r.plain_len()?;
            let mut pairs = Vec::new();
            for _ in 0..n {
                let f = r.string()?;
                let v = r.string()?;
                pairs.push((f, v));
            }
            Ok(Value::Hash(keyed(pairs)?))
        }
        T_HASH_LISTPACK => {
            let data = r.string()?;
            let pairs = flat_pairs(listpack(&data, &mut r.budget)?)?;
            Ok(Value::Hash(keyed(pairs)?))
        }
        T_HASH_ZIPLIST => {
            let data = r.string()?;
            let pairs = flat_pairs(ziplist(&data, &mut r.budget)?)?;
            Ok(Value::Hash(keyed(pairs)?))
        }
        T_HASH_ZIPMAP => {
            let data = r.string()?;
            let pairs = zipmap(&data, &mut r.budget)?;
            Ok(Value::Hash(keyed(pairs)?))
        }
        _ => Err(BadPayload::Format),
    }
}

/// (field, value) pairs of a hash, or (member, score text) of a sorted set.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A listpack's entries as pairs: an odd count is damage.
fn flat_pairs(flat: Vec<Vec<u8>>) -> Result<Pairs, BadPayload> {
    if !flat.len().is_multiple_of(2) {
        return Err(BadPayload::Format);
    }
    let mut pairs = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(f), Some(v)) = (it.next(), it.next()) {
        pairs.push((f, v));
    }
    Ok(pairs)
}

/// A decoded hash or sorted set: its fields distinct, and not empty (Redis refuses both).
fn keyed<T>(pairs: Vec<(Vec<u8>, T)>) -> Result<Vec<(Vec<u8>, T)>, BadPayload> {
    distinct(pairs.iter().map(|(f, _)| f.as_slice()))?;
    nonempty(&pairs)?;
    Ok(pairs)
}

fn nonempty<T>(v: &[T]) -> Result<(), BadPayload> {
    if v.is_empty() {
        Err(BadPayload::Format)
    } else {
        Ok(())
    }
}

fn distinct<'a>(items: impl ExactSizeIterator<Item = &'a [u8]>) -> Result<(), BadPayload> {
    let mut seen = HashSet::with_capacity(items.len());
    for i in items {
        if !seen.insert(i) {
            return Err(BadPayload::Format);
        }
    }
    Ok(())
}

/// Charges `n` bytes (and one element) against the budget.
fn charge(budget: &mut usize, n: usize) -> Result<(), BadPayload> {
    let cost = n.checked_add(ELEM_COST).ok_or(BadPayload::TooLarge)?;
    *budget = budget.checked_sub(cost).ok_or(BadPayload::TooLarge)?;
    Ok(())
}

/// An RDB length, or the code of a special string encoding.
enum Len {
    Plain(u64),
    Special(u8),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    budget: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, BadPayload> {
        let b = *self.buf.get(self.pos).ok_or(BadPayload::Format)?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], BadPayload> {
        let end = self.pos.checked_add(n).ok_or(BadPayload::Format)?;
        let s = self.buf.get(self.pos..end).ok_or(BadPayload::Format)?;
        self.pos = end;
        Ok(s)
    }

    fn len(&mut self) -> Result<Len, BadPayload> {
        let b = self.byte()?;
        Ok(match b >> 6 {
            0 => Len::Plain((b & 0x3f) as u64),
            1 => Len::Plain((((b & 0x3f) as u64) << 8) | self.byte()? as u64),
            3 => Len::Special(b & 0x3f),
            _ if b == 0x80 => {
                let s = self.take(4)?;
                Len::Plain(u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as u64)
            }
            _ if b == 0x81 => {
                let s = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(s);
                Len::Plain(u64::from_be_bytes(a))
            }
            _ => return Err(BadPayload::Format),
        })
    }

    fn plain_len(&mut self) -> Result<u64, BadPayload> {
        match self.len()? {
            Len::Plain(n) => Ok(n),
            Len::Special(_) => Err(BadPayload::Format),
        }
    }

    /// A length of bytes still to come in this payload.
    fn bytes_len(&mut self) -> Result<usize, BadPayload> {
        let n = self.plain_len()?;
        if n > (self.buf.len() - self.pos) as u64 {
            return Err(BadPayload::Format);
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<Vec<u8>, BadPayload> {
        let s = match self.len()? {
            Len::Plain(n) => {
                if n > (self.buf.len() - self.pos) as u64 {
                    return Err(BadPayload::Format);
                }
                self.take(n as usize)?.to_vec()
            }
            Len::Special(0) => (self.byte()? as i8).to_string().into_bytes(),
            Len::Special(1) => {
                let s = self.take(2)?;
                i16::from_le_bytes([s[0], s[1]]).to_string().into_bytes()
            }
            Len::Special(2) => {
                let s = self.take(4)?;
                i32::from_le_bytes([s[0], s[1], s[2], s[3]])
                    .to_string()
                    .into_bytes()
            }
            Len::Special(3) => {
                let clen = self.bytes_len()?;
                let len = self.plain_len()?;
                if len > self.budget as u64 {
                    return Err(BadPayload::TooLarge);
                }
                let data = self.take(clen)?;
                lzf_decompress(data, len as usize).ok_or(BadPayload::Format)?
            }
            Len::Special(_) => return Err(BadPayload::Format),
        };
        charge(&mut self.budget, s.len())?;
        Ok(s)
    }

    /// A sorted-set score of RDB type 3: a length byte (253 NaN, 254 +inf, 255 -inf) and the
    /// number as text.
    fn text_double(&mut self) -> Result<f64, BadPayload> {
        match self.byte()? {
            253 => Ok(f64::NAN),
            254 => Ok(f64::INFINITY),
            255 => Ok(f64::NEG_INFINITY),
            n => {
                let t = self.take(n as usize)?;
                std::str::from_utf8(t)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or(BadPayload::Format)
            }
        }
    }
}

/// The back-length of a listpack entry of `l` bytes (encoding and data), as Redis writes it.
fn backlen(l: usize, out: &mut Vec<u8>) {
    if l <= 127 {
        out.push(l as u8);
    } else if l < 16383 {
        out.extend_from_slice(&[(l >> 7) as u8, (l & 127) as u8 | 128]);
    } else if l < 2_097_151 {
        out.extend_from_slice(&[
            (l >> 14) as u8,
            ((l >> 7) & 127) as u8 | 128,
            (l & 127) as u8 | 128,
        ]);
    } else if l < 268_435_455 {
        out.extend_from_slice(&[
            (l >> 21) as u8,
            ((l >> 14) & 127) as u8 | 128,
            ((l >> 7) & 127) as u8 | 128,
            (l & 127) as u8 | 128,
        ]);
    } else {
        out.extend_from_slice(&[
            (l >> 28) as u8,
            ((l >> 21) & 127) as u8 | 128,
            ((l >> 14) & 127) as u8 | 128,
            ((l >> 7) & 127) as u8 | 128,
            (l & 127) as u8 | 128,
        ]);
    }
}

/// The elements of a listpack (integers as their decimal text).
fn listpack(lp: &[u8], budget: &mut usize) -> Result<Vec<Vec<u8>>, BadPayload> {
    let bad = BadPayload::Format;
    if lp.len() < 7 {
        return Err(bad);
    }
    let total = u32::from_le_bytes([lp[0], lp[1], lp[2], lp[3]]) as usize;
    let count = u16::from_le_bytes([lp[4], lp[5]]);
    if total != lp.len() || lp[lp.len() - 1] != 0xff {
        return Err(bad);
    }
    // Entries end before the terminator.
    let end = lp.len() - 1;
    let mut pos = 6;
    let mut out = Vec::new();
    let mut back = Vec::with_capacity(5);
    while pos < end {
        let b = lp[pos];
        let at = |i: usize| -> Result<u8, BadPayload> {
            lp.get(pos + i)
                .copied()
                .filter(|_| pos + i < end)
                .ok_or(bad)
        };
        let str_at = |skip: usize, n: usize| -> Result<Vec<u8>, BadPayload> {
            let from = pos + skip;
            let to = from.checked_add(n).ok_or(bad)?;
            if to > end {
                return Err(bad);
            }
            Ok(lp[from..to].to_vec())
        };
        let int = |n: usize| -> Result<i64, BadPayload> {
            let mut v: u64 = 0;
            for i in 0..n {
                v |= (at(1 + i)? as u64) << (8 * i);
            }
            // Sign-extend from n bytes.
            let shift = 64 - 8 * n as u32;
            Ok(((v << shift) as i64) >> shift)
        };
        let (size, value) = if b & 0x80 == 0 {
            (1, (b & 0x7f).to_string().into_bytes())
        } else if b & 0xc0 == 0x80 {
            let n = (b & 0x3f) as usize;
            (1 + n, str_at(1, n)?)
        } else if b & 0xe0 == 0xc0 {
            let u = (((b & 0x1f) as i64) << 8) | at(1)? as i64;
            let v = if u >= 1 << 12 { u - (1 << 13) } else { u };
            (2, v.to_string().into_bytes())
        } else if b & 0xf0 == 0xe0 {
            let n = (((b & 0x0f) as usize) << 8) | at(1)? as usize;
            (2 + n, str_at(2, n)?)
        } else {
            match b {
                0xf0 => {
                    let n = u32::from_le_bytes([at(1)?, at(2)?, at(3)?, at(4)?]) as usize;
                    (5usize.checked_add(n).ok_or(bad)?, str_at(5, n)?)
                }
                0xf1 => (3, int(2)?.to_string().into_bytes()),
                0xf2 => (4, int(3)?.to_string().into_bytes()),
                0xf3 => (5, int(4)?.to_string().into_bytes()),
                0xf4 => (9, int(8)?.to_string().into_bytes()),
                _ => return Err(bad),
            }
        };
        back.clear();
        backlen(size, &mut back);
        let bl_from = pos + size;
        let bl_to = bl_from.checked_add(back.len()).ok_or(bad)?;
        if bl_to > end || lp[bl_from..bl_to] != back[..] {
            return Err(bad);
        }
        charge(budget, value.len())?;
        out.push(value);
        pos = bl_to;
    }
    if count != u16::MAX && count as usize != out.len() {
        return Err(bad);
    }
    Ok(out)
}

/// The entries of a ziplist (Redis 2.6 to 6.2's compact list; integers as their decimal text).
///
/// Layout: total bytes (u32 LE), offset of the last entry (u32 LE), entry count (u16 LE, 65535
/// = unknown), the entries, `0xFF`. An entry is the previous entry's size (one byte below 254,
/// else `0xFE` and a u32 LE), an encoding and its data: `00` + 6-bit, `01` + 14-bit
/// (big-endian) or `0x80` + 32-bit (big-endian) string lengths; `0xC0`, `0xD0`, `0xE0`,
/// `0xF0`, `0xFE`: a 16, 32, 64, 24 or 8-bit integer (little-endian); `0xF1` to `0xFD`: the
/// integers 0 to 12 in the encoding byte itself. The chain of previous sizes, the last-entry
/// offset and the count are all checked.
fn ziplist(zl: &[u8], budget: &mut usize) -> Result<Vec<Vec<u8>>, BadPayload> {
    let bad = BadPayload::Format;
    const HEADER: usize = 10;
    if zl.len() < HEADER + 1 {
        return Err(bad);
    }
    let total = u32::from_le_bytes([zl[0], zl[1], zl[2], zl[3]]) as usize;
    let tail = u32::from_le_bytes([zl[4], zl[5], zl[6], zl[7]]) as usize;
    let count = u16::from_le_bytes([zl[8], zl[9]]);
    if total != zl.len() || zl[zl.len() - 1] != 0xff {
        return Err(bad);
    }
    let end = zl.len() - 1;
    let mut pos = HEADER;
    let mut prev_size = 0usize;
    let mut last = HEADER;
    let mut out = Vec::new();
    while pos < end {
        let start = pos;
        let take = |from: usize, n: usize| -> Result<&[u8], BadPayload> {
            let to = from.checked_add(n).ok_or(bad)?;
            if to > end {
                return Err(bad);
            }
            Ok(&zl[from..to])
        };
        // The previous entry's size.
        let prev = match zl[pos] {
            0xfe => {
                let b = take(pos + 1, 4)?;
                pos += 5;
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
            }
            0xff => return Err(bad),
            n => {
                pos += 1;
                n as usize
            }
        };
        if prev != prev_size {
            return Err(bad);
        }
        let enc = *take(pos, 1)?.first().ok_or(bad)?;
        let int = |from: usize, n: usize| -> Result<Vec<u8>, BadPayload> {
            let b = take(from, n)?;
            let mut v: u64 = 0;
            for (i, byte) in b.iter().enumerate() {
                v |= (*byte as u64) << (8 * i);
            }
            let shift = 64 - 8 * n as u32;
            Ok((((v << shift) as i64) >> shift).to_string().into_bytes())
        };
        let (size, value) = match enc >> 6 {
            0 => {
                let n = (enc & 0x3f) as usize;
                (1 + n, take(pos + 1, n)?.to_vec())
            }
            1 => {
                let b = take(pos + 1, 1)?;
                let n = (((enc & 0x3f) as usize) << 8) | b[0] as usize;
                (2 + n, take(pos + 2, n)?.to_vec())
            }
            2 => {
                if enc != 0x80 {
                    return Err(bad);
                }
                let b = take(pos + 1, 4)?;
                let n = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
                (
                    5usize.checked_add(n).ok_or(bad)?,
                    take(pos + 5, n)?.to_vec(),
                )
            }
            _ => match enc {
                0xc0 => (3, int(pos + 1, 2)?),
                0xd0 => (5, int(pos + 1, 4)?),
                0xe0 => (9, int(pos + 1, 8)?),
                0xf0 => (4, int(pos + 1, 3)?),
                0xfe => (2, int(pos + 1, 1)?),
                0xf1..=0xfd => (1, ((enc & 0x0f) - 1).to_string().into_bytes()),
                _ => return Err(bad),
            },
        };
        pos += size;
        prev_size = pos - start;
        last = start;
        charge(budget, value.len())?;
        out.push(value);
    }
    if tail != last || (count != u16::MAX && count as usize != out.len()) {
        return Err(bad);
    }
    Ok(out)
}

/// The pairs of a zipmap (the hash encoding of Redis before 2.6).
///
/// Layout: a count byte (254 and up: unknown), then per pair the key's length, the key, the
/// value's length, a count of unused bytes after the value (one byte), the value and those
/// unused bytes; `0xFF` ends it. A length is one byte below 254, else `0xFE` and a u32 LE.
fn zipmap(zm: &[u8], budget: &mut usize) -> Result<Pairs, BadPayload> {
    let bad = BadPayload::Format;
    let count = *zm.first().ok_or(bad)?;
    let mut pos = 1;
    let len = |pos: &mut usize| -> Result<usize, BadPayload> {
        match *zm.get(*pos).ok_or(bad)? {
            0xfe => {
                let b = zm.get(*pos + 1..*pos + 5).ok_or(bad)?;
                *pos += 5;
                Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            }
            0xff => Err(bad),
            n => {
                *pos += 1;
                Ok(n as usize)
            }
        }
    };
    let bytes = |pos: &mut usize, n: usize| -> Result<Vec<u8>, BadPayload> {
        let to = pos.checked_add(n).ok_or(bad)?;
        let b = zm.get(*pos..to).ok_or(bad)?.to_vec();
        *pos = to;
        Ok(b)
    };
    let mut pairs = Vec::new();
    loop {
        match zm.get(pos) {
            None => return Err(bad),
            Some(0xff) => break,
            Some(_) => {}
        }
        let kl = len(&mut pos)?;
        let key = bytes(&mut pos, kl)?;
        let vl = len(&mut pos)?;
        let free = *zm.get(pos).ok_or(bad)? as usize;
        pos += 1;
        let value = bytes(&mut pos, vl)?;
        bytes(&mut pos, free)?;
        charge(budget, key.len())?;
        charge(budget, value.len())?;
        pairs.push((key, value));
    }
    if pos + 1 != zm.len() || (count < 254 && count as usize != pairs.len()) {
        return Err(bad);
    }
    Ok(pairs)
}

/// The members of an intset (as decimal text).
fn intset(is: &[u8], budget: &mut usize) -> Result<Vec<Vec<u8>>, BadPayload> {
    let bad = BadPayload::Format;
    if is.len() < 8 {
        return Err(bad);
    }
    let width = u32::from_le_bytes([is[0], is[1], is[2], is[3]]) as usize;
    let count = u32::from_le_bytes([is[4], is[5], is[6], is[7]]) as usize;
    if ![2, 4, 8].contains(&width) || count.checked_mul(width) != Some(is.len() - 8) {
        return Err(bad);
    }
    let mut out = Vec::with_capacity(count);
    let mut last: Option<i64> = None;
    for c in is[8..].chunks_exact(width) {
        let v = match width {
            2 => i16::from_le_bytes([c[0], c[1]]) as i64,
            4 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64,
            _ => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
        };
        if last.is_some_and(|l| l >= v) {
            return Err(bad);
        }
        last = Some(v);
        let t = v.to_string().into_bytes();
        charge(budget, t.len())?;
        out.push(t);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// The value as a canonical decimal integer (Redis's `string2ll`: no sign but `-`, no leading
/// zeros, no `-0`), if it is one.
fn canonical_int(v: &[u8]) -> Option<i64> {
    if v.is_empty() || v.len() > 20 {
        return None;
    }
    let n: i64 = std::str::from_utf8(v).ok()?.parse().ok()?;
    (n.to_string().as_bytes() == v).then_some(n)
}

fn put_len(out: &mut Vec<u8>, n: u64) {
    if n < 64 {
        out.push(n as u8);
    } else if n < 16384 {
        out.extend_from_slice(&[0x40 | (n >> 8) as u8, n as u8]);
    } else if n <= u32::MAX as u64 {
        out.push(0x80);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// A string as Redis writes it without compression: a canonical integer of at most 11
/// characters that fits 32 bits in the integer encodings, anything else raw.
fn put_string(out: &mut Vec<u8>, v: &[u8]) {
    if v.len() <= 11
        && let Some(n) = canonical_int(v)
    {
        if let Ok(b) = i8::try_from(n) {
            out.extend_from_slice(&[0xc0, b as u8]);
            return;
        }
        if let Ok(h) = i16::try_from(n) {
            out.push(0xc1);
            out.extend_from_slice(&h.to_le_bytes());
            return;
        }
        if let Ok(w) = i32::try_from(n) {
            out.push(0xc2);
            out.extend_from_slice(&w.to_le_bytes());
            return;
        }
    }
    put_len(out, v.len() as u64);
    out.extend_from_slice(v);
}

/// One listpack entry, as Redis's `lpAppend` writes it (integers in their integer encodings).
fn lp_entry(out: &mut Vec<u8>, v: &[u8]) {
    let start = out.len();
    match canonical_int(v) {
        Some(n) if (0..=127).contains(&n) => out.push(n as u8),
        Some(n) if (-4096..=4095).contains(&n) => {
            let u = if n < 0 { (1 << 13) + n } else { n } as u16;
            out.extend_from_slice(&[0xc0 | (u >> 8) as u8, u as u8]);
        }
        Some(n) if i16::try_from(n).is_ok() => {
            out.push(0xf1);
            out.extend_from_slice(&(n as i16).to_le_bytes());
        }
        Some(n) if (-(1 << 23)..(1 << 23)).contains(&n) => {
            out.push(0xf2);
            out.extend_from_slice(&(n as i32).to_le_bytes()[..3]);
        }
        Some(n) if i32::try_from(n).is_ok() => {
            out.push(0xf3);
            out.extend_from_slice(&(n as i32).to_le_bytes());
        }
        Some(n) => {
            out.push(0xf4);
            out.extend_from_slice(&n.to_le_bytes());
        }
        None if v.len() < 64 => {
            out.push(0x80 | v.len() as u8);
            out.extend_from_slice(v);
        }
        None if v.len() < 4096 => {
            out.extend_from_slice(&[0xe0 | (v.len() >> 8) as u8, v.len() as u8]);
            out.extend_from_slice(v);
        }
        None => {
            out.push(0xf0);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    let size = out.len() - start;
    backlen(size, out);
}

/// Builds a DUMP payload, value by value.
pub struct Encoder {
    out: Vec<u8>,
    /// Lists: the listpack nodes so far and the one being filled (its entries, its count).
    nodes: Vec<Vec<u8>>,
    node: Vec<u8>,
    node_len: usize,
}

impl Encoder {
    fn new(ty: u8) -> Encoder {
        Encoder {
            out: vec![ty],
            nodes: Vec::new(),
            node: Vec::new(),
            node_len: 0,
        }
    }

    /// A string value, whole.
    pub fn string(v: &[u8]) -> Vec<u8> {
        let mut e = Encoder::new(T_STRING);
        put_string(&mut e.out, v);
        e.finish()
    }

    /// A list of `len` elements, each given to `element`.
    pub fn list() -> Encoder {
        Encoder::new(T_LIST_QUICKLIST_2)
    }

    /// A set of `len` members, each given to `element`.
    pub fn set(len: u64) -> Encoder {
        let mut e = Encoder::new(T_SET);
        put_len(&mut e.out, len);
        e
    }

    /// A hash of `len` fields, each given to `pair`.
    pub fn hash(len: u64) -> Encoder {
        let mut e = Encoder::new(T_HASH);
        put_len(&mut e.out, len);
        e
    }

    /// A sorted set of `len` members, each given to `scored`.
    pub fn zset(len: u64) -> Encoder {
        let mut e = Encoder::new(T_ZSET_2);
        put_len(&mut e.out, len);
        e
    }

    /// A list element or set member.
    pub fn element(&mut self, v: &[u8]) {
        if self.out[0] != T_LIST_QUICKLIST_2 {
            return put_string(&mut self.out, v);
        }
        if self.node.len() >= NODE_BYTES || self.node_len == u16::MAX as usize - 1 {
            self.close_node();
        }
        lp_entry(&mut self.node, v);
        self.node_len += 1;
    }

    /// A hash field and its value.
    pub fn pair(&mut self, field: &[u8], value: &[u8]) {
        put_string(&mut self.out, field);
        put_string(&mut self.out, value);
    }

    /// A sorted-set member and its score.
    pub fn scored(&mut self, member: &[u8], score: f64) {
        put_string(&mut self.out, member);
        self.out.extend_from_slice(&score.to_le_bytes());
    }

    fn close_node(&mut self) {
        if self.node_len == 0 {
            return;
        }
        let mut lp = Vec::with_capacity(self.node.len() + 7);
        lp.extend_from_slice(&((self.node.len() + 7) as u32).to_le_bytes());
        lp.extend_from_slice(&(self.node_len as u16).to_le_bytes());
        lp.append(&mut self.node);
        lp.push(0xff);
        self.nodes.push(lp);
        self.node_len = 0;
    }

    /// The payload: the value, the RDB version and the checksum.
    pub fn finish(mut self) -> Vec<u8> {
        if self.out[0] == T_LIST_QUICKLIST_2 {
            self.close_node();
            put_len(&mut self.out, self.nodes.len() as u64);
            for n in std::mem::take(&mut self.nodes) {
                put_len(&mut self.out, NODE_PACKED);
                put_len(&mut self.out, n.len() as u64);
                self.out.extend_from_slice(&n);
            }
        }
        let mut out = self.out;
        out.extend_from_slice(&RDB_VERSION.to_le_bytes());
        let crc = crc64(0, &out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

/// Encodes a whole value (tests, and values held in memory).
pub fn encode(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => Encoder::string(s),
        Value::List(items) => {
            let mut e = Encoder::list();
            items.iter().for_each(|i| e.element(i));
            e.finish()
        }
        Value::Set(members) => {
            let mut e = Encoder::set(members.len() as u64);
            members.iter().for_each(|m| e.element(m));
            e.finish()
        }
        Value::Hash(pairs) => {
            let mut e = Encoder::hash(pairs.len() as u64);
            pairs.iter().for_each(|(f, v)| e.pair(f, v));
            e.finish()
        }
        Value::ZSet(pairs) => {
            let mut e = Encoder::zset(pairs.len() as u64);
            pairs.iter().for_each(|(m, s)| e.scored(m, *s));
            e.finish()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: usize = 1 << 30;

    /// Payloads redis-server 7.0.15 answered to DUMP (redis-cli's escapes).
    fn unescape(s: &str) -> Vec<u8> {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' {
                match b[i + 1] {
                    b'x' => {
                        let h = std::str::from_utf8(&b[i + 2..i + 4]).expect("hex");
                        out.push(u8::from_str_radix(h, 16).expect("hex"));
                        i += 4;
                    }
                    b'n' => {
                        out.push(b'\n');
                        i += 2;
                    }
                    b'r' => {
                        out.push(b'\r');
                        i += 2;
                    }
                    b't' => {
                        out.push(b'\t');
                        i += 2;
                    }
                    b'b' => {
                        out.push(8);
                        i += 2;
                    }
                    b'a' => {
                        out.push(7);
                        i += 2;
                    }
                    c => {
                        out.push(c);
                        i += 2;
                    }
                }
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        out
    }

    fn strs(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn crc64_matches_redis() {
        assert_eq!(crc64(0, b"123456789"), 0xe9c6_d914_c4b8_d9ca);
        // SET s hello; DUMP s.
        let p = unescape("\\x00\\x05hello\\n\\x00cr\\xdfve4 \\n");
        assert_eq!(p, Encoder::string(b"hello"));
    }

    #[test]
    fn redis_payloads_decode() {
        let cases: Vec<(&str, Value)> = vec![
            (
                "\\x00\\xc0{\\n\\x00H\\xe2S\\xe1\\x00zg\\xb9",
                Value::String(b"123".to_vec()),
            ),
            (
                "\\x00\\x0b12345678901\\n\\x000NR\\xd7'\\x17e\\x10",
                Value::String(b"12345678901".to_vec()),
            ),
            (
                "\\x00\\xc3\\t8\\x01aa\\xe0+\\x00\\x01aa\\n\\x00\\xf1f\\xd3\\xae\\x13\\xa6bb",
                Value::String(vec![b'a'; 56]),
            ),
            (
                "\\x12\\x01\\x02##\\x00\\x00\\x00\\b\\x00\\x81a\\x02\\x81b\\x02\\x01\\x01\\x02\\x01\\xdf\\xfb\\x02\\xc1,\\x02\\xf2p\\x11\\x01\\x04\\x85hello\\x06\\xff\\n\\x00\\xe1\\xaa\\xab\\x9b\\x8b\\xafPd",
                Value::List(strs(&["a", "b", "1", "2", "-5", "300", "70000", "hello"])),
            ),
            (
                "\\x0b\\x0e\\x02\\x00\\x00\\x00\\x03\\x00\\x00\\x00\\x01\\x00\\x02\\x00\\x03\\x00\\n\\x00\\xa5\\x02\\\\\\xe2mnM\\x1b",
                Value::Set(strs(&["1", "2", "3"])),
            ),
            (
                "\\x02\\x02\\x01b\\x01a\\n\\x00u\\xd9\\x9d\\x83^\\xf8_e",
                Value::Set(strs(&["b", "a"])),
            ),
            (
                "\\x11\\x14\\x14\\x00\\x00\\x00\\x04\\x00\\x81a\\x02\\x01\\x01\\x81b\\x02\\x832.5\\x04\\xff\\n\\x00\\xd4Ln\\xa4\\xf6D\\xd9\\xd7",
                Value::ZSet(vec![(b"a".to_vec(), 1.0), (b"b".to_vec(), 2.5)]),
            ),
            (
                "\\x05\\x02\\x01b\\x00\\x00\\x00\\x00\\x00\\x00\\x04@\\x01a\\x00\\x00\\x00\\x00\\x00\\x00\\xf0?\\n\\x00\\xf4n\\xb79\\x19vr\\x91",
                Value::ZSet(vec![(b"b".to_vec(), 2.5), (b"a".to_vec(), 1.0)]),
            ),
            (
                "\\x10\\r\\r\\x00\\x00\\x00\\x02\\x00\\x81f\\x02\\x81v\\x02\\xff\\n\\x00 \\xf1=D#T\\b\\x9d",
                Value::Hash(vec![(b"f".to_vec(), b"v".to_vec())]),
            ),
            (
                "\\x04\\x01\\x01f\\x01v\\n\\x00\\xad\\xf2CV\\xb1\\x86\\x0e\\xfc",
                Value::Hash(vec![(b"f".to_vec(), b"v".to_vec())]),
            ),
        ];
        for (text, want) in cases {
            let p = unescape(text);
            assert_eq!(decode(&p, BIG), Ok(want), "{text}");
        }
    }

    #[test]
    fn encoded_values_decode_back() {
        let long: Vec<Vec<u8>> = (0..20_000)
            .map(|i| match i % 4 {
                0 => i.to_string().into_bytes(),
                1 => (-(i as i64) * 1_000_003).to_string().into_bytes(),
                2 => vec![b'x'; i % 300],
                _ => format!("e{i}").into_bytes(),
            })
            .filter(|v| !v.is_empty())
            .collect();
        let values = vec![
            Value::String(Vec::new()),
            Value::String(b"-2147483648".to_vec()),
            Value::String(b"2147483648".to_vec()),
            Value::String(b"007".to_vec()),
            Value::String(vec![7; 70_000]),
            Value::List(long.clone()),
            Value::List(strs(&[
                "9223372036854775807",
                "-9223372036854775808",
                "-0",
                "+1",
            ])),
            Value::Set(
                (0..5000)
                    .map(|i| {
                        if i % 2 == 0 {
                            i.to_string()
                        } else {
                            format!("m{i}")
                        }
                    })
                    .map(String::into_bytes)
                    .collect(),
            ),
            Value::Hash(vec![(b"f".to_vec(), vec![1; 20_000])]),
            Value::ZSet(vec![
                (b"a".to_vec(), f64::INFINITY),
                (b"b".to_vec(), -1.5e300),
                (b"c".to_vec(), 0.1),
            ]),
        ];
        for (i, v) in values.iter().enumerate() {
            assert!(decode(&encode(v), BIG) == Ok(v.clone()), "value {i}");
        }
    }

    #[test]
    fn bad_payloads_are_refused() {
        let good = encode(&Value::List(strs(&["a", "b"])));
        assert_eq!(decode(&good[..9], BIG), Err(BadPayload::Checksum));
        let mut flipped = good.clone();
        flipped[3] ^= 1;
        assert_eq!(decode(&flipped, BIG), Err(BadPayload::Checksum));
        // Version 11, checksum fixed: still refused.
        let mut newer = good[..good.len() - 10].to_vec();
        newer.extend_from_slice(&11u16.to_le_bytes());
        let crc = crc64(0, &newer);
        newer.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&newer, BIG), Err(BadPayload::Checksum));
        // A well-checksummed body that is not a value.
        let seal = |body: &[u8]| {
            let mut p = body.to_vec();
            p.extend_from_slice(&RDB_VERSION.to_le_bytes());
            let crc = crc64(0, &p);
            p.extend_from_slice(&crc.to_le_bytes());
            p
        };
        for body in [
            &[15u8, 0][..],                                             // a stream
            &[0, 0x3f, b'a'],                   // a string longer than the payload
            &[0, 0x80, 0xff, 0xff, 0xff, 0xff], // a 4 GiB string claimed
            &[2, 0],                            // an empty set
            &[2, 2, 1, b'a', 1, b'a'],          // a duplicate member
            &[1, 0x81, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // 2^64 list elements
            &[5, 1, 1, b'a', 0, 0, 0, 0, 0, 0, 0xf8, 0x7f], // a NaN score
            &[0, 0xc3, 1, 0x40, 0xff, 0],       // LZF claiming 16 KiB from nothing
        ] {
            assert_eq!(
                decode(&seal(body), BIG),
                Err(BadPayload::Format),
                "{body:?}"
            );
        }
        // Within the format, past the limit.
        let big = encode(&Value::String(vec![1; 1000]));
        assert_eq!(decode(&big, 500), Err(BadPayload::TooLarge));
    }

    /// A DUMP payload around `body` (type byte and value).
    fn seal(body: &[u8]) -> Vec<u8> {
        let mut p = body.to_vec();
        p.extend_from_slice(&RDB_VERSION.to_le_bytes());
        let crc = crc64(0, &p);
        p.extend_from_slice(&crc.to_le_bytes());
        p
    }

    /// `body` as an RDB string (a plain length and the bytes).
    fn rdb_str(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_len(&mut out, body.len() as u64);
        out.extend_from_slice(body);
        out
    }

    /// A ziplist of these entries, built from the format's description (prevlen, the smallest
    /// encoding for integers, string lengths of 6, 14 or 32 bits), as Redis 6 lays them out.
    fn zl_build(entries: &[&[u8]]) -> Vec<u8> {
        let mut body = Vec::new();
        let (mut prev, mut last) = (0usize, 10usize);
        for e in entries {
            let start = body.len();
            last = 10 + start;
            if prev < 254 {
                body.push(prev as u8);
            } else {
                body.push(0xfe);
                body.extend_from_slice(&(prev as u32).to_le_bytes());
            }
            match canonical_int(e) {
                Some(n @ 0..=12) => body.push(0xf1 + n as u8),
                Some(n) if i8::try_from(n).is_ok() => body.extend_from_slice(&[0xfe, n as u8]),
                Some(n) if i16::try_from(n).is_ok() => {
                    body.push(0xc0);
                    body.extend_from_slice(&(n as i16).to_le_bytes());
                }
                Some(n) if (-(1 << 23)..(1 << 23)).contains(&n) => {
                    body.push(0xf0);
                    body.extend_from_slice(&(n as i32).to_le_bytes()[..3]);
                }
                Some(n) if i32::try_from(n).is_ok() => {
                    body.push(0xd0);
                    body.extend_from_slice(&(n as i32).to_le_bytes());
                }
                Some(n) => {
                    body.push(0xe0);
                    body.extend_from_slice(&n.to_le_bytes());
                }
                None if e.len() < 64 => body.push(e.len() as u8),
                None if e.len() < 16384 => {
                    body.extend_from_slice(&[0x40 | (e.len() >> 8) as u8, e.len() as u8])
                }
                None => {
                    body.push(0x80);
                    body.extend_from_slice(&(e.len() as u32).to_be_bytes());
                }
            }
            if canonical_int(e).is_none() {
                body.extend_from_slice(e);
            }
            prev = body.len() - start;
        }
        let mut zl = Vec::new();
        zl.extend_from_slice(&((body.len() + 11) as u32).to_le_bytes());
        zl.extend_from_slice(&(last as u32).to_le_bytes());
        zl.extend_from_slice(&(entries.len().min(65535) as u16).to_le_bytes());
        zl.extend_from_slice(&body);
        zl.push(0xff);
        zl
    }

    /// A ziplist written out byte by byte: "ab", 7, -2, 300, 70000, -10000000, 5000000000 (every
    /// encoding but the long strings).
    const ZIPLIST: [u8; 45] = [
        45, 0, 0, 0, // total bytes
        34, 0, 0, 0, // offset of the last entry
        7, 0, // count
        0x00, 0x02, b'a', b'b', // "ab"
        0x04, 0xf8, // 7, in the encoding byte
        0x02, 0xfe, 0xfe, // -2, 8 bits
        0x03, 0xc0, 0x2c, 0x01, // 300, 16 bits
        0x04, 0xf0, 0x70, 0x11, 0x01, // 70000, 24 bits
        0x05, 0xd0, 0x80, 0x69, 0x67, 0xff, // -10000000, 32 bits
        0x06, 0xe0, 0x00, 0xf2, 0x05, 0x2a, 0x01, 0x00, 0x00, 0x00, // 5000000000, 64 bits
        0xff,
    ];

    #[test]
    fn ziplists_of_redis_6_decode() {
        let want = strs(&["ab", "7", "-2", "300", "70000", "-10000000", "5000000000"]);
        assert_eq!(
            zl_build(&want.iter().map(Vec::as_slice).collect::<Vec<_>>()),
            ZIPLIST
        );
        // A list as Redis before 3.2 wrote it (type 10).
        let p = seal(&[&[T_LIST_ZIPLIST][..], &rdb_str(&ZIPLIST)].concat());
        assert_eq!(decode(&p, BIG), Ok(Value::List(want.clone())));

        // A quicklist of Redis 3.2 to 6.2 (type 14): two ziplist nodes, the second an
        // LZF-compressed string (one literal run), and an empty node, which is passed over.
        let small = zl_build(&[b"x", b"-1"]);
        let mut body = vec![T_LIST_QUICKLIST, 3];
        body.extend(rdb_str(&ZIPLIST));
        body.extend([
            0xc3,
            small.len() as u8 + 1,
            small.len() as u8,
            small.len() as u8 - 1,
        ]);
        body.extend(&small);
        body.extend(rdb_str(&zl_build(&[])));
        let mut all = want.clone();
        all.extend(strs(&["x", "-1"]));
        assert_eq!(decode(&seal(&body), BIG), Ok(Value::List(all)));

        // Long entries: 14 and 32-bit string lengths, previous sizes of 254 and more.
        let long: Vec<Vec<u8>> = vec![
            vec![b'a'; 63],
            vec![b'b'; 64],
            vec![b'c'; 300],
            b"-9223372036854775808".to_vec(),
            vec![b'd'; 16384],
            b"12".to_vec(),
            b"13".to_vec(),
        ];
        let zl = zl_build(&long.iter().map(Vec::as_slice).collect::<Vec<_>>());
        let p = seal(&[&[T_LIST_QUICKLIST, 1][..], &rdb_str(&zl)].concat());
        assert_eq!(decode(&p, BIG), Ok(Value::List(long)));

        // Sorted sets (type 12: member, score as text or integer) and hashes (type 13).
        let zl = zl_build(&[b"a", b"1.5", b"b", b"2", b"c", b"-inf"]);
        let p = seal(&[&[T_ZSET_ZIPLIST][..], &rdb_str(&zl)].concat());
        assert_eq!(
            decode(&p, BIG),
            Ok(Value::ZSet(vec![
                (b"a".to_vec(), 1.5),
                (b"b".to_vec(), 2.0),
                (b"c".to_vec(), f64::NEG_INFINITY)
            ]))
        );
        let zl = zl_build(&[b"f", b"v", b"n", b"12"]);
        let p = seal(&[&[T_HASH_ZIPLIST][..], &rdb_str(&zl)].concat());
        assert_eq!(
            decode(&p, BIG),
            Ok(Value::Hash(vec![
                (b"f".to_vec(), b"v".to_vec()),
                (b"n".to_vec(), b"12".to_vec())
            ]))
        );
    }

    #[test]
    fn damaged_ziplists_are_refused() {
        let list = |zl: &[u8]| seal(&[&[T_LIST_ZIPLIST][..], &rdb_str(zl)].concat());
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut z = ZIPLIST.to_vec();
        z[14] = 5;
        cases.push(("a wrong previous size", z));
        let mut z = ZIPLIST.to_vec();
        z[4] = 28;
        cases.push(("a wrong last-entry offset", z));
        let mut z = ZIPLIST.to_vec();
        z[8] = 6;
        cases.push(("a wrong count", z));
        let mut z = ZIPLIST.to_vec();
        z[0] = 44;
        cases.push(("a wrong total", z));
        let mut z = ZIPLIST.to_vec();
        z[11] = 0x30;
        cases.push(("a string running past the end", z));
        let mut z = ZIPLIST.to_vec();
        z[15] = 0xff;
        cases.push(("the end marker as an encoding", z));
        let mut z = ZIPLIST.to_vec();
        z[44] = 0;
        cases.push(("no end marker", z));
        cases.push(("nothing", Vec::new()));
        for (what, z) in cases {
            assert_eq!(decode(&list(&z), BIG), Err(BadPayload::Format), "{what}");
        }
        // Empty, as a whole list; odd, as pairs; duplicate fields.
        assert_eq!(decode(&list(&zl_build(&[])), BIG), Err(BadPayload::Format));
        let odd = seal(&[&[T_HASH_ZIPLIST][..], &rdb_str(&zl_build(&[b"f"]))].concat());
        assert_eq!(decode(&odd, BIG), Err(BadPayload::Format));
        let dup = zl_build(&[b"f", b"1", b"f", b"2"]);
        let dup = seal(&[&[T_HASH_ZIPLIST][..], &rdb_str(&dup)].concat());
        assert_eq!(decode(&dup, BIG), Err(BadPayload::Format));
        let nan = seal(&[&[T_ZSET_ZIPLIST][..], &rdb_str(&zl_build(&[b"a", b"nan"]))].concat());
        assert_eq!(decode(&nan, BIG), Err(BadPayload::Format));
        // Within the format, past the limit.
        assert_eq!(decode(&list(&ZIPLIST), 60), Err(BadPayload::TooLarge));
    }

    #[test]
    fn zipmaps_decode() {
        // Two pairs, the second value followed by two unused bytes, then a long key (its
        // length in the 5-byte form).
        let mut zm = vec![
            3, 1, b'f', 1, 0, b'v', 1, b'k', 3, 2, b'v', b'a', b'l', 0, 0,
        ];
        zm.extend([0xfe, 44, 1, 0, 0]);
        zm.extend([b'K'; 300]);
        zm.extend([0, 0, 0xff]);
        let p = seal(&[&[T_HASH_ZIPMAP][..], &rdb_str(&zm)].concat());
        assert_eq!(
            decode(&p, BIG),
            Ok(Value::Hash(vec![
                (b"f".to_vec(), b"v".to_vec()),
                (b"k".to_vec(), b"val".to_vec()),
                (vec![b'K'; 300], Vec::new()),
            ]))
        );
        for bad in [
            &[1, 1, b'f', 1, 0, b'v'][..],                        // no end marker
            &[2, 1, b'f', 1, 0, b'v', 0xff],                      // a wrong count
            &[1, 1, b'f', 1, 5, b'v', 0xff],                      // unused bytes past the end
            &[1, 1, b'f', 1, 0, b'v', 0xff, 0],                   // bytes after the end marker
            &[2, 1, b'f', 1, 0, b'v', 1, b'f', 1, 0, b'w', 0xff], // a duplicate field
        ] {
            let p = seal(&[&[T_HASH_ZIPMAP][..], &rdb_str(bad)].concat());
            assert_eq!(decode(&p, BIG), Err(BadPayload::Format), "{bad:?}");
        }
    }

    #[test]
    fn lzf_round_trips_what_redis_wrote() {
        assert_eq!(
            lzf_decompress(&unescape("\\x01aa\\xe0+\\x00\\x01aa"), 56),
            Some(vec![b'a'; 56])
        );
        assert_eq!(lzf_decompress(&[0x20, 0], 3), None);
        assert_eq!(lzf_decompress(&[0x00, b'a'], 2), None);
    }
}
