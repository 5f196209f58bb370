//! Item codec: how one item (header + value) is laid out in the `items` database.
//!
//! ```text
//! byte 0      format version (1)
//! byte 1      kind (low 3 bits) | SEPARATED 0x08 | HAS_FLAGS 0x10 | HAS_EXPIRY 0x20
//!             | STALE 0x40 | WIN_SENT 0x80
//! bytes 2..10 cas, u64 little-endian
//! [u32 LE]    client flags, only when HAS_FLAGS
//! [u64 LE]    expire_at in unix ms, only when HAS_EXPIRY
//! rest        the value; when SEPARATED, a pointer to it in the log (`vlog::Pointer`)
//! ```
//! A SEPARATED item's value is resolved by `decode` itself (from a mapping of its log
//! segment, `vlog.rs`), so every reader sees the value whichever way it is stored. Only
//! strings are separated. Stores that may hold such items say so in `meta` (format 2), so an
//! older memkeep refuses them instead of reading pointers as values.
//! Flags and expiry are usually 0, so the common header is 10 bytes: on-disk size matters
//! for small values.

use super::StoreError;

pub const FORMAT_VERSION: u8 = 1;
const HAS_FLAGS: u8 = 0x10;
const HAS_EXPIRY: u8 = 0x20;
/// Meta protocol: the item was invalidated (`md I`, `ms I`); `mg` reports it with `X`.
const STALE: u8 = 0x40;
/// Meta protocol: a client was already told it won the right to recache (`W`); later fetches
/// see `Z`.
const WIN_SENT: u8 = 0x80;
/// The value lives in the log; the record holds a pointer to it (`vlog.rs`).
const SEPARATED: u8 = 0x08;
const KIND_MASK: u8 = 0x07;
const BASE_LEN: usize = 10;
/// Longest possible header.
pub const MAX_HEADER: usize = BASE_LEN + 4 + 8;

/// What an item holds. A string's value is its bytes; a collection's value is its metadata
/// (see `types::CollMeta`), its elements live in the `elems`/`zscore` databases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    String = 0,
    List = 1,
    Hash = 2,
    Set = 3,
    ZSet = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        match b {
            0 => Some(Kind::String),
            1 => Some(Kind::List),
            2 => Some(Kind::Hash),
            3 => Some(Kind::Set),
            4 => Some(Kind::ZSet),
            _ => None,
        }
    }

    /// The name Redis's TYPE command answers.
    pub fn name(self) -> &'static str {
        match self {
            Kind::String => "string",
            Kind::List => "list",
            Kind::Hash => "hash",
            Kind::Set => "set",
            Kind::ZSet => "zset",
        }
    }
}

/// Everything about an item except its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemMeta {
    pub kind: Kind,
    pub flags: u32,
    /// Absolute expiry in unix milliseconds; 0 = never.
    pub expire_at: u64,
    pub cas: u64,
    /// Marked stale by a meta invalidation.
    pub stale: bool,
    /// A meta fetch already handed out the win (recache) token.
    pub win_sent: bool,
}

impl ItemMeta {
    /// A plain string item: no flags, no expiry.
    pub fn string(cas: u64) -> ItemMeta {
        ItemMeta::new(Kind::String, 0, 0, cas)
    }

    /// A fresh item: not stale, no win token handed out.
    pub fn new(kind: Kind, flags: u32, expire_at: u64, cas: u64) -> ItemMeta {
        ItemMeta {
            kind,
            flags,
            expire_at,
            cas,
            stale: false,
            win_sent: false,
        }
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expire_at != 0 && self.expire_at <= now_ms
    }

    pub fn header_len(&self) -> usize {
        BASE_LEN + if self.flags != 0 { 4 } else { 0 } + if self.expire_at != 0 { 8 } else { 0 }
    }

    /// The encoded header: a buffer and how many of its bytes are used.
    pub fn header(&self) -> ([u8; MAX_HEADER], usize) {
        let mut out = [0u8; MAX_HEADER];
        let mut tag = self.kind as u8;
        if self.flags != 0 {
            tag |= HAS_FLAGS;
        }
        if self.expire_at != 0 {
            tag |= HAS_EXPIRY;
        }
        if self.stale {
            tag |= STALE;
        }
        if self.win_sent {
            tag |= WIN_SENT;
        }
        out[0] = FORMAT_VERSION;
        out[1] = tag;
        out[2..10].copy_from_slice(&self.cas.to_le_bytes());
        let mut at = BASE_LEN;
        if self.flags != 0 {
            out[at..at + 4].copy_from_slice(&self.flags.to_le_bytes());
            at += 4;
        }
        if self.expire_at != 0 {
            out[at..at + 8].copy_from_slice(&self.expire_at.to_le_bytes());
            at += 8;
        }
        (out, at)
    }
}

/// A decoded item borrowing its value from the store (zero-copy out of LMDB's map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemRef<'a> {
    pub meta: ItemMeta,
    pub value: &'a [u8],
}

/// Decodes an item record.
pub fn decode(bytes: &[u8]) -> Result<ItemRef<'_>, StoreError> {
    let corrupt = |m: &str| StoreError::damaged(m.to_string());
    if bytes.len() < BASE_LEN {
        return Err(corrupt("item shorter than its header"));
    }
    if bytes[0] != FORMAT_VERSION {
        return Err(StoreError::damaged(format!(
            "unknown item format version {}",
            bytes[0]
        )));
    }
    let tag = bytes[1];
    let kind = Kind::from_u8(tag & KIND_MASK).ok_or_else(|| corrupt("unknown item kind"))?;
    if tag & SEPARATED != 0 && kind != Kind::String {
        return Err(corrupt("a collection's record holds a value pointer"));
    }
    let mut at = 2;
    let mut take = |n: usize| -> Result<&[u8], StoreError> {
        let s = bytes
            .get(at..at + n)
            .ok_or_else(|| corrupt("item header truncated"))?;
        at += n;
        Ok(s)
    };
    let cas = u64::from_le_bytes(take(8)?.try_into().map_err(|_| corrupt("cas"))?);
    let flags = if tag & HAS_FLAGS != 0 {
        u32::from_le_bytes(take(4)?.try_into().map_err(|_| corrupt("flags"))?)
    } else {
        0
    };
    let expire_at = if tag & HAS_EXPIRY != 0 {
        u64::from_le_bytes(take(8)?.try_into().map_err(|_| corrupt("expiry"))?)
    } else {
        0
    };
    let value = if tag & SEPARATED != 0 {
        let p = super::vlog::Pointer::decode(&bytes[at..])
            .ok_or_else(|| corrupt("value pointer of the wrong length"))?;
        super::vlog::resolve(&p)?
    } else {
        &bytes[at..]
    };
    Ok(ItemRef {
        meta: ItemMeta {
            kind,
            flags,
            expire_at,
            cas,
            stale: tag & STALE != 0,
            win_sent: tag & WIN_SENT != 0,
        },
        value,
    })
}

/// The length of the header that starts `bytes` (its first two bytes are enough).
pub fn header_len_of(bytes: &[u8]) -> Option<usize> {
    let tag = *bytes.get(1)?;
    Some(
        BASE_LEN
            + if tag & HAS_FLAGS != 0 { 4 } else { 0 }
            + if tag & HAS_EXPIRY != 0 { 8 } else { 0 },
    )
}

/// Whether `bytes` is a record holding its value itself (not a pointer into the log).
pub fn is_inline(bytes: &[u8]) -> bool {
    bytes.get(1).is_some_and(|t| t & SEPARATED == 0)
}

/// If `header` (the start of an item record being stored, as `ItemMeta::header` makes it) is
/// a string's, not already separated, the length of its header: such a value may be stored
/// in the log (`vlog.rs`).
pub fn separable(header: &[u8]) -> Option<usize> {
    let tag = *header.get(1)?;
    (header.first() == Some(&FORMAT_VERSION)
        && tag & SEPARATED == 0
        && tag & KIND_MASK == Kind::String as u8)
        .then(|| header_len_of(header))
        .flatten()
}

/// The record of a separated item: `header` (a string's, as `separable` accepted it) marked
/// SEPARATED, then `p`.
pub fn pointer_record(
    header: &[u8],
    p: &super::vlog::Pointer,
) -> ([u8; MAX_HEADER + super::vlog::POINTER_LEN], usize) {
    let mut out = [0u8; MAX_HEADER + super::vlog::POINTER_LEN];
    let n = header.len().min(MAX_HEADER);
    out[..n].copy_from_slice(&header[..n]);
    if n > 1 {
        out[1] |= SEPARATED;
    }
    out[n..n + super::vlog::POINTER_LEN].copy_from_slice(&p.encode());
    (out, n + super::vlog::POINTER_LEN)
}

/// If `bytes` is a separated item's record: its header's length and the pointer (nothing is
/// resolved).
pub fn pointer_of(bytes: &[u8]) -> Option<(usize, super::vlog::Pointer)> {
    if bytes.len() < BASE_LEN || bytes[0] != FORMAT_VERSION || bytes[1] & SEPARATED == 0 {
        return None;
    }
    let n = header_len_of(bytes)?;
    Some((n, super::vlog::Pointer::decode(bytes.get(n..)?)?))
}

/// A separated item's header as it would be stored inline (the SEPARATED mark cleared), and
/// its pointer: a reader thread puts the value it reads after it.
pub fn inline_header(bytes: &[u8]) -> Option<(Vec<u8>, super::vlog::Pointer)> {
    let (n, p) = pointer_of(bytes)?;
    let mut h = bytes.get(..n)?.to_vec();
    h[1] &= !SEPARATED;
    Some((h, p))
}

/// The record as it would be stored inline: a separated item's header (unmarked) and its
/// value; any other record as it is. For copies that leave the store (a replica's full copy,
/// a backup), which have no log segments of their own to point into.
pub fn inline(bytes: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, StoreError> {
    let Some((n, _)) = pointer_of(bytes) else {
        return Ok(std::borrow::Cow::Borrowed(bytes));
    };
    let item = decode(bytes)?;
    let mut out = Vec::with_capacity(n + item.value.len());
    out.extend_from_slice(&bytes[..n]);
    out[1] &= !SEPARATED;
    out.extend_from_slice(item.value);
    Ok(std::borrow::Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(meta: ItemMeta, value: &[u8]) {
        let (hdr, n) = meta.header();
        assert_eq!(n, meta.header_len());
        let mut buf = hdr[..n].to_vec();
        buf.extend_from_slice(value);
        let item = decode(&buf).expect("decodes");
        assert_eq!(item.meta, meta);
        assert_eq!(item.value, value);
    }

    #[test]
    fn items_roundtrip_with_and_without_optional_fields() {
        roundtrip(ItemMeta::new(Kind::String, 0, 0, 1), b"v");
        roundtrip(ItemMeta::new(Kind::String, u32::MAX, 0, 7), b"");
        roundtrip(ItemMeta::new(Kind::String, 0, 99, u64::MAX), b"xy");
        roundtrip(ItemMeta::new(Kind::String, 5, 1 << 40, 3), &[0; 300]);
    }

    #[test]
    fn meta_marks_roundtrip() {
        for (stale, win_sent) in [(true, false), (false, true), (true, true)] {
            let mut meta = ItemMeta::new(Kind::String, 3, 77, 9);
            meta.stale = stale;
            meta.win_sent = win_sent;
            roundtrip(meta, b"v");
        }
    }

    #[test]
    fn common_header_is_ten_bytes() {
        assert_eq!(ItemMeta::new(Kind::String, 0, 0, 9).header_len(), 10);
    }

    #[test]
    fn damaged_records_are_errors_not_panics() {
        assert!(decode(b"").is_err());
        assert!(decode(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode(&[1, 0x30, 0, 0, 0, 0, 0, 0, 0, 0, 1]).is_err());
        assert!(decode(&[1, 0x0f, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode(&[1, 0x05, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }

    /// A separated record keeps its header (marked), carries its pointer, decodes to the
    /// value in the log, and goes back inline whole; collections and short or foreign
    /// pointers are damage.
    #[test]
    fn separated_records_resolve_and_go_back_inline() {
        use crate::storage::vlog::{Pointer, Sink, ValueLog};
        let dir = tempfile::tempdir().expect("dir");
        let file = std::sync::Arc::new(
            std::fs::File::create(dir.path().join(crate::storage::wal::segment_name(1)))
                .expect("segment"),
        );
        let id = getrandom::u64().expect("random");
        let vlog = ValueLog::register(dir.path(), id, Default::default());
        let sink = Sink {
            vlog,
            min: 1,
            segment: 1,
            base: 0,
            file,
        };
        let meta = ItemMeta::new(Kind::String, 7, 1_900_000_000_000, 42);
        let (hdr, n) = meta.header();
        assert_eq!(separable(&hdr[..n]), Some(n));
        let p = sink
            .write(100, &[b"a value ", b"in the log"])
            .expect("write");
        let (record, len) = pointer_record(&hdr[..n], &p);
        let record = &record[..len];
        assert_eq!(separable(record), None, "already separated");
        assert_eq!(pointer_of(record), Some((n, p)));
        let item = decode(record).expect("decodes");
        assert_eq!(item.meta, meta);
        assert_eq!(item.value, b"a value in the log");
        let mut whole = hdr[..n].to_vec();
        whole.extend_from_slice(b"a value in the log");
        assert_eq!(&*inline(record).expect("inline"), &whole[..]);
        assert_eq!(
            &*inline(&whole).expect("inline"),
            &whole[..],
            "inline stays"
        );
        let (h, q) = inline_header(record).expect("separated");
        assert_eq!((&h[..], q), (&hdr[..n], p));
        // Damage: a pointer cut short, one into another store's log, a collection marked.
        assert!(decode(&record[..len - 1]).is_err_and(|e| e.is_damage()));
        let (other, len2) = pointer_record(&hdr[..n], &Pointer { id: id ^ 1, ..p });
        assert!(decode(&other[..len2]).is_err_and(|e| e.is_damage()));
        let mut coll = record.to_vec();
        coll[1] = (coll[1] & !KIND_MASK) | Kind::Hash as u8;
        assert!(decode(&coll).is_err_and(|e| e.is_damage()));
        assert_eq!(
            separable(&ItemMeta::new(Kind::List, 0, 0, 1).header().0),
            None
        );
    }
}
