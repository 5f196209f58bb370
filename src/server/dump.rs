//! Key dumps: `stats cachedump <class> <limit>` and `lru_crawler metadump <classes>`.
//!
//! memkeep has no slab classes: the whole store is reported as class 1 (`stats items`,
//! `stats slabs`), so both dumps walk the `items` table in key order. A dump may cover millions
//! of keys, and must neither hold one read transaction for as long as that takes (it would pin
//! every page the writer frees meanwhile) nor keep an event loop from its other connections: it
//! is answered in chunks of at most `CHUNK` records, each from the snapshot of the pass that
//! runs it (a new read transaction each pass). Between chunks the connection keeps the last key
//! sent, and its request stays in the input; the next pass resumes after that key, and a client
//! that does not read its replies pauses the dump as it pauses a large `get`. Keys written or
//! deleted during a dump may or may not appear in it; a key present throughout appears once.
//!
//! What is listed: live string items. Collections (Redis lists, hashes, ...) and expired items
//! are skipped; `cachedump` also skips keys the memcached protocol cannot name (over 250 bytes,
//! or with spaces or control bytes), which `metadump` lists URI-encoded as memcached does.

use std::ops::Bound;

use log::error;

use super::memcache::{line, number};
use super::worker::Pass;
use crate::storage::hits::Seen;
use crate::storage::{Kind, StoreError};

/// Records looked at per pass, at most (each may cost a page fault for a large value's header).
pub const CHUNK: usize = 256;
/// memcached builds a cachedump reply in one 2 MB buffer and stops before it would overflow.
const CACHEDUMP_MAX: usize = 2 * 1024 * 1024;

/// Which dump a connection is answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpKind {
    /// `stats cachedump`: at most `limit` keys (0: no limit), within `CACHEDUMP_MAX` bytes.
    Cache { limit: u64 },
    /// `lru_crawler metadump`.
    Meta,
}

/// Where a dump in progress stands (kept on the connection between passes).
#[derive(Debug, Default)]
pub struct Cursor {
    /// The last key looked at; None before the first chunk.
    after: Option<Box<[u8]>>,
    /// Items listed so far.
    items: u64,
    /// Reply bytes sent so far.
    bytes: usize,
}

/// Whether the dump has ended (its `END` written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Done,
    More,
}

/// Writes the next chunk of the dump to `out`, from `cursor` on; stops early once `room`
/// bytes are written (the client must read them first).
pub fn step(
    kind: DumpKind,
    cursor: &mut Cursor,
    out: &mut Vec<u8>,
    pass: &mut Pass<'_>,
    room: usize,
) -> Step {
    let start = out.len();
    match walk(kind, cursor, out, pass, room) {
        Ok(Step::Done) => {
            line(out, "END");
            Step::Done
        }
        Ok(Step::More) => Step::More,
        Err(e) => {
            if !e.is_damage() {
                error!("key dump failed: {e}");
            }
            // The lines of this chunk are dropped; earlier chunks are out already.
            out.truncate(start);
            line(out, e.mc_read_reply());
            Step::Done
        }
    }
}

fn walk(
    kind: DumpKind,
    cursor: &mut Cursor,
    out: &mut Vec<u8>,
    pass: &mut Pass<'_>,
    room: usize,
) -> Result<Step, StoreError> {
    let flushed = pass.flushed();
    let now = pass.now_ms;
    let shared = pass.shared;
    let hits = shared.store.hits();
    let store = pass.snap()?;
    let start = out.len();
    let lo = match &cursor.after {
        Some(k) => Bound::Excluded(&k[..]),
        None => Bound::Unbounded,
    };
    let mut last: Option<&[u8]> = None;
    for (looked, entry) in store.range(lo, Bound::Unbounded)?.enumerate() {
        if looked == CHUNK || out.len() - start >= room {
            if let Some(k) = last {
                cursor.after = Some(k.into());
            }
            return Ok(Step::More);
        }
        let (key, bytes) = entry?;
        last = Some(key);
        let item = crate::storage::item::decode(bytes)?;
        let meta = item.meta;
        if flushed || meta.is_expired(now) || meta.kind != Kind::String {
            continue;
        }
        let at = out.len();
        match kind {
            DumpKind::Cache { limit } => {
                if !crate::protocol::memcache::valid_key(key) {
                    continue;
                }
                out.extend_from_slice(b"ITEM ");
                out.extend_from_slice(key);
                out.extend_from_slice(b" [");
                number(out, item.value.len());
                out.extend_from_slice(b" b; ");
                number(out, meta.expire_at.div_ceil(1000));
                out.extend_from_slice(b" s]\r\n");
                // memcached keeps room for its `END`.
                if cursor.bytes + (out.len() - at) + 6 > CACHEDUMP_MAX {
                    out.truncate(at);
                    return Ok(Step::Done);
                }
                cursor.bytes += out.len() - at;
                cursor.items += 1;
                if cursor.items == limit {
                    return Ok(Step::Done);
                }
            }
            DumpKind::Meta => {
                let seen = hits.map(|h| h.seen(key, meta.cas)).unwrap_or(Seen {
                    fetched: false,
                    last_s: now / 1000,
                });
                out.extend_from_slice(b"key=");
                uri_encode(out, key);
                out.extend_from_slice(b" exp=");
                if meta.expire_at == 0 {
                    out.extend_from_slice(b"-1");
                } else {
                    number(out, meta.expire_at.div_ceil(1000));
                }
                out.extend_from_slice(b" la=");
                number(out, seen.last_s);
                out.extend_from_slice(b" cas=");
                number(out, meta.cas);
                out.extend_from_slice(if seen.fetched {
                    b" fetch=yes cls=1 size="
                } else {
                    b" fetch=no cls=1 size="
                });
                number(out, key.len() + item.value.len());
                // memcached ends metadump lines (but not its END) with a bare newline.
                out.push(b'\n');
                cursor.items += 1;
            }
        }
    }
    Ok(Step::Done)
}

/// memcached's URI encoding of keys in dumps: letters, digits and `-._~` as they are, every
/// other byte as `%XX`.
fn uri_encode(out: &mut Vec<u8>, key: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_uri_encoded_as_memcached_does() {
        let mut out = Vec::new();
        uri_encode(&mut out, b"a:3 b/\x00~Z-._");
        assert_eq!(out, b"a%3A3%20b%2F%00~Z-._");
    }
}
