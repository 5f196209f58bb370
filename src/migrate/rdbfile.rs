//! A streaming reader of Redis RDB files (RDB versions 1 to 11: Redis 2.x to 7.2), key by key.
//!
//! The file is "REDIS" and a 4-digit version, then a sequence of opcodes and keys, then `0xFF`
//! and (from version 5) a CRC-64 of everything before it (8 bytes, little-endian; 0 when Redis
//! ran with `rdbchecksum no`). A key is its value's type byte, the key as an RDB string and the
//! value in that type's RDB encoding; `SELECTDB` (the database of the keys that follow),
//! `EXPIRETIME_MS`/`EXPIRETIME` (the next key's absolute expiry), `IDLE` and `FREQ` (its LRU or
//! LFU data) come before it. `AUX` (name and value), `RESIZEDB` (size hints), `SLOT_INFO`,
//! `MODULE_AUX` and `FUNCTION2` (a function library's code) stand between keys.
//!
//! The reader never holds more than one value: for each key it keeps the value's bytes exactly
//! as the file has them (type byte first), which is a DUMP payload without its footer, so the
//! value can go to RESTORE (or `rdb::decode`) untouched. Values of types memkeep does not hold
//! (streams, module types) are walked over without being kept. Every length is read before
//! what it counts: a file that ends early, or names a length past its end, is refused at the
//! byte where that shows, with what was being read there; the CRC is checked at the end.

use std::fmt;
use std::io::{BufRead, BufReader, Read};

use crate::types::rdb;

const OP_SLOT_INFO: u8 = 244;
const OP_FUNCTION2: u8 = 245;
const OP_FUNCTION_PRE_GA: u8 = 246;
const OP_MODULE_AUX: u8 = 247;
const OP_IDLE: u8 = 248;
const OP_FREQ: u8 = 249;
const OP_AUX: u8 = 250;
const OP_RESIZEDB: u8 = 251;
const OP_EXPIRETIME_MS: u8 = 252;
const OP_EXPIRETIME: u8 = 253;
const OP_SELECTDB: u8 = 254;
const OP_EOF: u8 = 255;

/// The newest RDB version read (Redis 7.2 writes 11).
pub const MAX_VERSION: u16 = 11;

/// Value types (the type byte before a key).
const T_MODULE_PRE_GA: u8 = 6;
const T_MODULE_2: u8 = 7;
const T_STREAM: u8 = 15;
const T_STREAM_2: u8 = 19;
const T_STREAM_3: u8 = 21;

/// What a value type is, in Redis's words (`TYPE`) and its encoding; None for bytes that are
/// no type.
pub fn type_name(ty: u8) -> Option<&'static str> {
    Some(match ty {
        0 => "string",
        1 => "list (plain)",
        2 => "set (plain)",
        3 => "zset (plain, text scores)",
        4 => "hash (plain)",
        5 => "zset (plain)",
        6 => "module (pre-GA)",
        7 => "module",
        9 => "hash (zipmap)",
        10 => "list (ziplist)",
        11 => "set (intset)",
        12 => "zset (ziplist)",
        13 => "hash (ziplist)",
        14 => "list (quicklist)",
        15 => "stream",
        16 => "hash (listpack)",
        17 => "zset (listpack)",
        18 => "list (quicklist 2)",
        19 => "stream (v2)",
        20 => "set (listpack)",
        21 => "stream (v3)",
        _ => return None,
    })
}

/// Why a file cannot be read: the byte where it showed, and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    pub offset: u64,
    pub what: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "byte {}: {}", self.offset, self.what)
    }
}

/// One key of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The database it belongs to (`SELECTDB`).
    pub db: u64,
    pub key: Vec<u8>,
    /// Absolute expiry in unix ms, if it has one.
    pub expire_ms: Option<u64>,
    /// The value's type byte.
    pub ty: u8,
    /// Where the key starts in the file (its type byte).
    pub offset: u64,
    /// The value as the file holds it, type byte first (a DUMP payload without its footer);
    /// empty when `skipped`.
    pub value: Vec<u8>,
    /// A type memkeep has no place for, by name ("stream", "module ReJSON-RL"): walked over,
    /// not kept.
    pub skipped: Option<String>,
}

/// What the file says besides its keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extras {
    /// The RDB version of the header.
    pub version: u16,
    /// `AUX` fields (redis-ver, ctime, used-mem, ...), in file order.
    pub aux: Vec<(String, String)>,
    /// Function libraries (`FUNCTION2`), skipped.
    pub functions: u64,
    /// Module auxiliary data blocks (`MODULE_AUX`), skipped.
    pub module_aux: u64,
    /// The checksum at the end, once read (0: the writer did not compute one).
    pub checksum: Option<u64>,
}

/// An RDB length, or the code of a specially encoded string.
enum Len {
    Plain(u64),
    Special(u8),
}

/// Reads an RDB file key by key (`next_key`), checking its checksum at the end.
pub struct RdbReader<R: Read> {
    r: BufReader<R>,
    /// Bytes consumed so far: the offset of the next one.
    pos: u64,
    /// CRC-64 of the bytes consumed.
    crc: u64,
    /// The file's length, when known: lengths past it are refused before reading.
    size: Option<u64>,
    db: u64,
    /// While true, consumed bytes are appended to `kept` (the value being read).
    keep: bool,
    kept: Vec<u8>,
    /// What is being read, for errors.
    ctx: String,
    done: bool,
    pub extras: Extras,
}

impl<R: Read> RdbReader<R> {
    /// Reads the header. `size` is the file's length if known.
    pub fn new(inner: R, size: Option<u64>) -> Result<RdbReader<R>, FileError> {
        let mut r = RdbReader {
            r: BufReader::with_capacity(1 << 20, inner),
            pos: 0,
            crc: 0,
            size,
            db: 0,
            keep: false,
            kept: Vec::new(),
            ctx: "the header (\"REDIS\" and a 4-digit version)".into(),
            done: false,
            extras: Extras::default(),
        };
        let mut head = [0u8; 9];
        r.exact(&mut head)?;
        let version = std::str::from_utf8(&head[5..])
            .ok()
            .filter(|v| v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<u16>().ok());
        let version = match version {
            Some(v) if &head[..5] == b"REDIS" => v,
            _ => {
                return Err(FileError {
                    offset: 0,
                    what: format!(
                        "not an RDB file: expected \"REDIS\" and a 4-digit version, found {}",
                        escape(&head)
                    ),
                });
            }
        };
        if version == 0 || version > MAX_VERSION {
            return Err(FileError {
                offset: 5,
                what: format!(
                    "RDB version {version}: this import reads versions 1 to {MAX_VERSION} \
                     (Redis 2.x to 7.2)"
                ),
            });
        }
        r.extras.version = version;
        Ok(r)
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.pos
    }

    fn err(&self, offset: u64, what: impl fmt::Display) -> FileError {
        FileError {
            offset,
            what: if self.ctx.is_empty() {
                what.to_string()
            } else {
                format!("{what}, reading {}", self.ctx)
            },
        }
    }

    fn truncated(&self, at: u64, wanted: u64) -> FileError {
        let end = self.size.unwrap_or(self.pos);
        FileError {
            offset: end,
            what: format!(
                "the file ends here, inside {} ({wanted} bytes expected from byte {at}): the \
                 file is truncated",
                self.ctx
            ),
        }
    }

    /// Consumes `n` bytes: appended to `out` if given, and to `kept` while keeping.
    fn bytes(&mut self, n: u64, mut out: Option<&mut Vec<u8>>) -> Result<(), FileError> {
        let at = self.pos;
        if let Some(size) = self.size
            && at.checked_add(n).is_none_or(|end| end > size)
        {
            return Err(self.truncated(at, n));
        }
        let mut left = n;
        while left > 0 {
            let buf = match self.r.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(FileError {
                        offset: self.pos,
                        what: format!("cannot read: {e}"),
                    });
                }
            };
            if buf.is_empty() {
                return Err(self.truncated(at, n));
            }
            let k = (buf.len() as u64).min(left) as usize;
            let chunk = &buf[..k];
            self.crc = rdb::crc64(self.crc, chunk);
            if self.keep {
                self.kept.extend_from_slice(chunk);
            }
            if let Some(o) = out.as_deref_mut() {
                o.extend_from_slice(chunk);
            }
            self.r.consume(k);
            self.pos += k as u64;
            left -= k as u64;
        }
        Ok(())
    }

    /// Consumes exactly `out.len()` bytes into `out`.
    fn exact(&mut self, out: &mut [u8]) -> Result<(), FileError> {
        let mut v = Vec::with_capacity(out.len());
        self.bytes(out.len() as u64, Some(&mut v))?;
        out.copy_from_slice(&v);
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, FileError> {
        let mut b = [0u8; 1];
        self.exact(&mut b)?;
        Ok(b[0])
    }

    fn len_or_special(&mut self) -> Result<Len, FileError> {
        let at = self.pos;
        let b = self.u8()?;
        Ok(match b >> 6 {
            0 => Len::Plain((b & 0x3f) as u64),
            1 => Len::Plain((((b & 0x3f) as u64) << 8) | self.u8()? as u64),
            3 => Len::Special(b & 0x3f),
            _ if b == 0x80 => {
                let mut s = [0u8; 4];
                self.exact(&mut s)?;
                Len::Plain(u32::from_be_bytes(s) as u64)
            }
            _ if b == 0x81 => {
                let mut s = [0u8; 8];
                self.exact(&mut s)?;
                Len::Plain(u64::from_be_bytes(s))
            }
            _ => return Err(self.err(at, format!("expected a length, found byte 0x{b:02x}"))),
        })
    }

    fn len(&mut self) -> Result<u64, FileError> {
        let at = self.pos;
        match self.len_or_special()? {
            Len::Plain(n) => Ok(n),
            Len::Special(_) => Err(self.err(at, "expected a length, found a string encoding")),
        }
    }

    /// An RDB string: consumed (and kept while keeping); its bytes appended to `out` if given
    /// (integers as decimal text, LZF strings decompressed).
    fn string(&mut self, out: Option<&mut Vec<u8>>) -> Result<(), FileError> {
        let at = self.pos;
        let int = |r: &mut Self, n: usize| -> Result<i64, FileError> {
            let mut b = [0u8; 4];
            r.exact(&mut b[..n])?;
            Ok(match n {
                1 => b[0] as i8 as i64,
                2 => i16::from_le_bytes([b[0], b[1]]) as i64,
                _ => i32::from_le_bytes(b) as i64,
            })
        };
        let n = match self.len_or_special()? {
            Len::Plain(n) => return self.bytes(n, out),
            Len::Special(0) => int(self, 1)?,
            Len::Special(1) => int(self, 2)?,
            Len::Special(2) => int(self, 4)?,
            Len::Special(3) => {
                let clen = self.len()?;
                let len = self.len()?;
                let Some(out) = out else {
                    return self.bytes(clen, None);
                };
                let mut c = Vec::new();
                self.bytes(clen, Some(&mut c))?;
                let d = usize::try_from(len)
                    .ok()
                    .and_then(|len| rdb::lzf_decompress(&c, len))
                    .ok_or_else(|| {
                        self.err(at, "an LZF-compressed string that does not decompress")
                    })?;
                out.extend_from_slice(&d);
                return Ok(());
            }
            Len::Special(k) => return Err(self.err(at, format!("unknown string encoding {k}"))),
        };
        if let Some(out) = out {
            out.extend_from_slice(n.to_string().as_bytes());
        }
        Ok(())
    }

    /// Reads up to the next key; None after the end marker and a matching checksum.
    pub fn next_key(&mut self) -> Result<Option<Record>, FileError> {
        if self.done {
            return Ok(None);
        }
        let mut expire_ms: Option<u64> = None;
        loop {
            let at = self.pos;
            self.ctx = "the next opcode or value type (no end marker yet)".into();
            let op = self.u8()?;
            self.ctx.clear();
            match op {
                OP_EOF => {
                    self.finish()?;
                    return Ok(None);
                }
                OP_SELECTDB => {
                    self.ctx = "SELECTDB".into();
                    self.db = self.len()?;
                }
                OP_RESIZEDB => {
                    self.ctx = "RESIZEDB".into();
                    self.len()?;
                    self.len()?;
                }
                OP_SLOT_INFO => {
                    self.ctx = "SLOT_INFO".into();
                    for _ in 0..3 {
                        self.len()?;
                    }
                }
                OP_AUX => {
                    self.ctx = "an AUX field".into();
                    let (mut k, mut v) = (Vec::new(), Vec::new());
                    self.string(Some(&mut k))?;
                    self.string(Some(&mut v))?;
                    self.extras.aux.push((
                        String::from_utf8_lossy(&k).into_owned(),
                        String::from_utf8_lossy(&v).into_owned(),
                    ));
                }
                OP_EXPIRETIME_MS => {
                    self.ctx = "EXPIRETIME_MS".into();
                    let mut b = [0u8; 8];
                    self.exact(&mut b)?;
                    // A negative time is long past.
                    expire_ms = Some(i64::from_le_bytes(b).max(1) as u64);
                }
                OP_EXPIRETIME => {
                    self.ctx = "EXPIRETIME".into();
                    let mut b = [0u8; 4];
                    self.exact(&mut b)?;
                    expire_ms = Some((i32::from_le_bytes(b) as i64 * 1000).max(1) as u64);
                }
                OP_IDLE => {
                    self.ctx = "IDLE".into();
                    self.len()?;
                }
                OP_FREQ => {
                    self.ctx = "FREQ".into();
                    self.u8()?;
                }
                OP_MODULE_AUX => {
                    self.ctx = format!("module auxiliary data (from byte {at})");
                    self.len()?; // the module id
                    self.len()?; // when_opcode
                    self.len()?; // when
                    self.module_values()?;
                    self.extras.module_aux += 1;
                }
                OP_FUNCTION2 => {
                    self.ctx = format!("a function library (from byte {at})");
                    self.string(None)?;
                    self.extras.functions += 1;
                }
                OP_FUNCTION_PRE_GA => {
                    return Err(self.err(
                        at,
                        "functions in the format of Redis 7.0's release candidates, which no \
                         released Redis reads either",
                    ));
                }
                ty => return self.record(at, ty, expire_ms).map(Some),
            }
        }
    }

    /// A key and its value, the type byte `ty` at `at` already read.
    fn record(&mut self, at: u64, ty: u8, expire_ms: Option<u64>) -> Result<Record, FileError> {
        let Some(name) = type_name(ty) else {
            return Err(self.err(
                at,
                format!("expected an opcode or a value type, found byte 0x{ty:02x} ({ty})"),
            ));
        };
        self.ctx = format!("the key of a {name} (from byte {at})");
        let mut key = Vec::new();
        self.string(Some(&mut key))?;
        self.ctx = format!("the value of key {} ({name}, from byte {at})", escape(&key));
        if ty == T_MODULE_PRE_GA {
            return Err(self.err(
                at,
                "a module value in the pre-GA format (no opcodes), which cannot be skipped",
            ));
        }
        let skipped = match ty {
            T_STREAM | T_STREAM_2 | T_STREAM_3 => {
                self.stream(ty)?;
                Some("stream".to_string())
            }
            T_MODULE_2 => {
                let id = self.len()?;
                self.module_values()?;
                Some(format!("module {}", module_name(id)))
            }
            _ => {
                self.kept.clear();
                self.kept.push(ty);
                self.keep = true;
                let r = self.value(ty);
                self.keep = false;
                r?;
                None
            }
        };
        self.ctx.clear();
        Ok(Record {
            db: self.db,
            key,
            expire_ms,
            ty,
            offset: at,
            value: if skipped.is_some() {
                Vec::new()
            } else {
                std::mem::take(&mut self.kept)
            },
            skipped,
        })
    }

    /// The value of a type memkeep holds, in its RDB encoding (its inner listpacks, ziplists
    /// and intsets are single strings here; `rdb::decode` reads them).
    fn value(&mut self, ty: u8) -> Result<(), FileError> {
        match ty {
            0 | 9..=13 | 16 | 17 | 20 => self.string(None),
            1 | 2 | 14 => {
                for _ in 0..self.len()? {
                    self.string(None)?;
                }
                Ok(())
            }
            3 => {
                for _ in 0..self.len()? {
                    self.string(None)?;
                    // A score as text: its length, or 253-255 for NaN, +inf and -inf.
                    let n = self.u8()?;
                    if n < 253 {
                        self.bytes(n as u64, None)?;
                    }
                }
                Ok(())
            }
            4 => {
                for _ in 0..self.len()? {
                    self.string(None)?;
                    self.string(None)?;
                }
                Ok(())
            }
            5 => {
                for _ in 0..self.len()? {
                    self.string(None)?;
                    self.bytes(8, None)?;
                }
                Ok(())
            }
            18 => {
                for _ in 0..self.len()? {
                    self.len()?; // the node's container: plain or packed
                    self.string(None)?;
                }
                Ok(())
            }
            _ => Err(self.err(self.pos, format!("no reader for value type {ty}"))),
        }
    }

    /// Walks over a stream: its listpacks, its metadata, its consumer groups with their pending
    /// entries and consumers.
    fn stream(&mut self, ty: u8) -> Result<(), FileError> {
        for _ in 0..self.len()? {
            self.string(None)?; // the master entry ID
            self.string(None)?; // the listpack
        }
        // Length, last ID; from v2 first ID, max deleted ID, entries added.
        let fields = if ty >= T_STREAM_2 { 8 } else { 3 };
        for _ in 0..fields {
            self.len()?;
        }
        for _ in 0..self.len()? {
            self.string(None)?; // the group's name
            self.len()?; // its last ID
            self.len()?;
            if ty >= T_STREAM_2 {
                self.len()?; // entries read
            }
            for _ in 0..self.len()? {
                // A pending entry: its ID (16 bytes), delivery time (8), delivery count.
                self.bytes(24, None)?;
                self.len()?;
            }
            for _ in 0..self.len()? {
                self.string(None)?; // the consumer's name
                self.bytes(if ty >= T_STREAM_3 { 16 } else { 8 }, None)?; // seen (active) time
                let at = self.pos;
                let pending = self.len()?;
                let ids = pending
                    .checked_mul(16)
                    .ok_or_else(|| self.err(at, format!("{pending} pending entries")))?;
                self.bytes(ids, None)?;
            }
        }
        Ok(())
    }

    /// Module data in the opcode form (`MODULE_2` values, `MODULE_AUX`), up to its end opcode.
    fn module_values(&mut self) -> Result<(), FileError> {
        loop {
            let at = self.pos;
            match self.len()? {
                0 => return Ok(()),
                1 | 2 => {
                    self.len()?;
                }
                3 => self.bytes(4, None)?,
                4 => self.bytes(8, None)?,
                5 => self.string(None)?,
                op => return Err(self.err(at, format!("unknown module data opcode {op}"))),
            }
        }
    }

    /// After the end marker: the checksum.
    fn finish(&mut self) -> Result<(), FileError> {
        let computed = self.crc;
        if self.extras.version >= 5 {
            self.ctx = "the checksum after the end marker".into();
            let at = self.pos;
            let mut b = [0u8; 8];
            self.exact(&mut b)?;
            let stored = u64::from_le_bytes(b);
            if stored != 0 && stored != computed {
                return Err(FileError {
                    offset: at,
                    what: format!(
                        "checksum mismatch: the file records 0x{stored:016x}, its contents give \
                         0x{computed:016x}: the file is damaged"
                    ),
                });
            }
            self.extras.checksum = Some(stored);
            self.ctx.clear();
        }
        self.done = true;
        Ok(())
    }
}

/// A module type's name from its 64-bit id: nine characters of 6 bits each, then a 10-bit
/// encoding version.
pub fn module_name(id: u64) -> String {
    const CHARS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    (0..9)
        .map(|j| CHARS[((id >> (58 - 6 * j)) & 63) as usize] as char)
        .collect()
}

/// Bytes as a quoted, escaped string for messages (at most 80 bytes of them).
pub fn escape(b: &[u8]) -> String {
    let mut s = String::from("\"");
    for &c in b.iter().take(80) {
        s.extend(std::ascii::escape_default(c).map(char::from));
    }
    if b.len() > 80 {
        s.push_str("...");
    }
    s.push('"');
    s
}

/// The DUMP payload of a kept value: the value, then the RDB version `rdb` reads and the CRC-64.
pub fn seal(mut value: Vec<u8>) -> Vec<u8> {
    value.extend_from_slice(&rdb::RDB_VERSION.to_le_bytes());
    let crc = rdb::crc64(0, &value);
    value.extend_from_slice(&crc.to_le_bytes());
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdb::Value;

    /// An RDB string of plain length.
    fn s(b: &[u8]) -> Vec<u8> {
        assert!(b.len() < 64);
        [&[b.len() as u8][..], b].concat()
    }

    /// A ziplist of "a", 1 and one of "f", "v", written out by hand (see `rdb::ziplist`).
    const ZL_A1: [u8; 16] = [16, 0, 0, 0, 13, 0, 0, 0, 2, 0, 0, 1, b'a', 3, 0xf2, 0xff];
    const ZL_FV: [u8; 17] = [17, 0, 0, 0, 13, 0, 0, 0, 2, 0, 0, 1, b'f', 3, 1, b'v', 0xff];

    /// A file as Redis 6.2 would write it, with every opcode and the types this reader walks
    /// over; `crc` picks the checksum: the right one, zero, or a wrong one.
    fn redis6_file(version: &[u8; 4], crc: Option<u64>) -> Vec<u8> {
        let mut f = b"REDIS".to_vec();
        f.extend(version);
        f.push(OP_AUX);
        f.extend(s(b"redis-ver"));
        f.extend(s(b"6.2.6"));
        f.push(OP_AUX);
        f.extend(s(b"ctime"));
        f.extend([0xc2, 1, 2, 3, 4]); // an integer-encoded AUX value
        f.push(OP_MODULE_AUX);
        f.extend([0x81, 1, 2, 3, 4, 5, 6, 7, 8]); // module id (64-bit length form)
        f.extend([2, 2]); // when_opcode (UINT), when
        f.extend([5, 3, b'a', b'u', b'x', 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // STRING, DOUBLE, EOF
        f.extend([OP_SELECTDB, 0, OP_RESIZEDB, 6, 2]);
        // A quicklist of ziplists (type 14), expiring, with LFU data.
        f.extend([OP_EXPIRETIME_MS]);
        f.extend(4_000_000_000_000u64.to_le_bytes());
        f.extend([OP_FREQ, 5, 14]);
        f.extend(s(b"ql"));
        f.push(2);
        f.extend(s(&ZL_A1));
        f.extend(s(&ZL_A1));
        // A hash ziplist (13) with LRU data, an integer key.
        f.extend([OP_IDLE, 0x40, 200, 13, 0xc1, 0x39, 0x30]);
        f.extend(s(&ZL_FV));
        // A sorted set with text scores (3), expiring in seconds (an old file's way).
        f.push(OP_EXPIRETIME);
        f.extend(2_000_000_000u32.to_le_bytes());
        f.extend([3]);
        f.extend(s(b"z"));
        f.extend([2]);
        f.extend(s(b"m"));
        f.extend([3, b'1', b'.', b'5']);
        f.extend(s(b"n"));
        f.push(254); // +inf
        // A stream (15): one listpack, metadata, a group with a pending entry and a consumer.
        f.push(15);
        f.extend(s(b"st"));
        f.extend([1]);
        f.extend(s(&[0; 16]));
        f.extend(s(b"not really a listpack"));
        f.extend([1, 5, 0]); // length, last ID
        f.extend([1]);
        f.extend(s(b"grp"));
        f.extend([5, 0]); // last ID
        f.extend([1]);
        f.extend([7; 24]);
        f.extend([1]);
        f.extend([1]);
        f.extend(s(b"alice"));
        f.extend([0; 8]);
        f.extend([1]);
        f.extend([7; 16]);
        // A module value (7): its id, then opcodes to EOF.
        f.push(7);
        f.extend(s(b"mod"));
        f.extend([0x81]);
        f.extend(0x6162_6364_6566_6768u64.to_be_bytes());
        f.extend([1, 5, 3, 0, 0, 0, 0, 0]);
        // A key of database 2, and a zipmap hash (9) there.
        f.extend([OP_SELECTDB, 2, 9]);
        f.extend(s(b"zm"));
        f.extend(s(&[1, 1, b'k', 1, 0, b'v', 0xff]));
        f.push(OP_EOF);
        let sum = crc64_of(&f);
        if version >= b"0005" {
            f.extend(crc.map_or(sum, |c| c).to_le_bytes());
        }
        f
    }

    fn crc64_of(b: &[u8]) -> u64 {
        rdb::crc64(0, b)
    }

    fn read_all(f: &[u8]) -> Result<(Vec<Record>, Extras), FileError> {
        let mut r = RdbReader::new(f, Some(f.len() as u64))?;
        let mut out = Vec::new();
        while let Some(rec) = r.next_key()? {
            out.push(rec);
        }
        Ok((out, r.extras))
    }

    #[test]
    fn a_redis_6_file_reads_key_by_key() {
        let f = redis6_file(b"0009", None);
        let (recs, extras) = read_all(&f).expect("the file reads");
        let names: Vec<(&[u8], u8, u64)> = recs
            .iter()
            .map(|r| (r.key.as_slice(), r.ty, r.db))
            .collect();
        assert_eq!(
            names,
            [
                (&b"ql"[..], 14, 0),
                (b"12345", 13, 0),
                (b"z", 3, 0),
                (b"st", 15, 0),
                (b"mod", 7, 0),
                (b"zm", 9, 2)
            ]
        );
        assert_eq!(recs[0].expire_ms, Some(4_000_000_000_000));
        assert_eq!(recs[1].expire_ms, None);
        assert_eq!(recs[2].expire_ms, Some(2_000_000_000_000));
        assert_eq!(recs[3].skipped.as_deref(), Some("stream"));
        // The id's bytes "abcdefgh" read as nine 6-bit characters (base64's alphabet).
        assert_eq!(recs[4].skipped.as_deref(), Some("module YWJjZGVmZ"));
        let values: Vec<Value> = recs
            .iter()
            .filter(|r| r.skipped.is_none())
            .map(|r| rdb::decode(&seal(r.value.clone()), usize::MAX).expect("decodes"))
            .collect();
        let v = |x: &str| x.as_bytes().to_vec();
        assert_eq!(
            values,
            [
                Value::List(vec![v("a"), v("1"), v("a"), v("1")]),
                Value::Hash(vec![(v("f"), v("v"))]),
                Value::ZSet(vec![(v("m"), 1.5), (v("n"), f64::INFINITY)]),
                Value::Hash(vec![(v("k"), v("v"))]),
            ]
        );
        assert_eq!(extras.version, 9);
        assert_eq!(extras.module_aux, 1);
        assert_eq!(
            extras.aux,
            [
                ("redis-ver".to_string(), "6.2.6".to_string()),
                ("ctime".to_string(), "67305985".to_string())
            ]
        );
        assert_eq!(extras.checksum, Some(crc64_of(&f[..f.len() - 8])));

        // Checksum 0: not computed by the writer, accepted. A version before 5 has none.
        assert!(read_all(&redis6_file(b"0009", Some(0))).is_ok());
        let old = redis6_file(b"0004", None);
        assert_eq!(read_all(&old).map(|(r, _)| r.len()), Ok(6));
    }

    #[test]
    fn damage_is_named_with_its_byte() {
        let f = redis6_file(b"0010", None);
        let e = read_all(&redis6_file(b"0010", Some(1))).expect_err("wrong checksum");
        assert_eq!(e.offset, f.len() as u64 - 8);
        assert!(e.what.starts_with("checksum mismatch"), "{e}");
        // Every cut short of the whole file is refused at the cut.
        for cut in 0..f.len() {
            let e = read_all(&f[..cut]).expect_err("a cut file");
            assert_eq!(e.offset, cut as u64, "{e}");
            assert!(e.what.contains("truncated"), "cut at {cut}: {e}");
        }
        // The same without knowing the file's size.
        let cut = &f[..f.len() - 20];
        let mut r = RdbReader::new(cut, None).expect("header");
        let e = loop {
            match r.next_key() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("a cut file read whole"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.offset, cut.len() as u64, "{e}");
        // An unknown type byte; a module value of the pre-GA format; a future version.
        let mut g = f.clone();
        let at = g
            .windows(3)
            .position(|w| w == [3, 1, b'z'])
            .expect("the zset");
        g[at] = 30;
        let e = read_all(&g).expect_err("type 30");
        assert_eq!(e.offset, at as u64);
        assert!(e.what.contains("found byte 0x1e"), "{e}");
        g[at] = 6;
        let e = read_all(&g).expect_err("type 6");
        assert!(e.what.contains("pre-GA"), "{e}");
        let mut g = f.clone();
        g[5..9].copy_from_slice(b"0012");
        assert_eq!(read_all(&g).expect_err("version 12").offset, 5);
    }

    #[test]
    fn module_names_come_from_their_ids() {
        // "ReJSON-RL" at encoding version 3 (its 54 bits of name, then 10 of version).
        let chars = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut id = 0u64;
        for c in b"ReJSON-RL" {
            id = (id << 6) | chars.iter().position(|x| x == c).expect("in the set") as u64;
        }
        id = (id << 10) | 3;
        assert_eq!(module_name(id), "ReJSON-RL");
    }
}
