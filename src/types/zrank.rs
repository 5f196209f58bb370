//! Ranks in sorted sets: the score index cut into chunks, with a directory of their counts.
//!
//! LMDB keeps no counts in its B-tree, so the rank of a member (how many index entries sort
//! before it) would be a walk over everything before it. Each sorted set's score index is cut
//! into consecutive chunks, and a directory records where each chunk starts and how many
//! entries it holds. The directory lives in `zscore` itself, under the set's id with its top
//! bit set (`ZRANK_DIR`), so it sorts apart from every index entry:
//!
//!   `zscore[(id | ZRANK_DIR) ++ boundary] = count` (u64 little-endian)
//!
//! where `boundary` is the suffix (score key ++ member) of the first index key a chunk may
//! hold, or empty for a chunk open at the bottom; a chunk holds every index entry from its
//! boundary up to the next chunk's, and the chunk holding an index key is the directory's last
//! record at or below that key's suffix. Invariants, kept in the same write transaction as the
//! index (so the log and every snapshot see both or neither): the counts are exact and
//! non-zero, and they sum to the set's length; `memkeep check` verifies them.
//!
//! A chunk splits in halves when it passes `CHUNK_MAX` entries, and merges with a neighbour
//! when a removal leaves it under `CHUNK_MIN` and the two fit in `MERGE_MAX`; an emptied chunk
//! is dropped. Costs, for n members in about n/190 chunks:
//! - an insert or removal: one directory seek and one put (a split walks 128 entries);
//! - the rank of a key: the directory summed from its nearer end, then one walk inside a chunk:
//!   for 100,000 members about 130 + 95 cursor steps, where the plain walk took up to 50,000
//!   from each end;
//! - the key at a rank: the same.
//!
//! A sorted set written by an older memkeep has no directory: its metadata's `head` word is 0
//! (lists use it; collections of the other kinds leave it 0). The first write to such a set
//! builds its directory in one pass (`build`) and sets `head` to `RANKED`; until then its
//! reads walk the index as before.

use std::ops::Bound;

use heed::RoTxn;
use heed::types::Bytes;

use crate::storage::StoreError;
use crate::storage::lmdb::{LogTxn, Table, ZRANK_DIR};

/// `CollMeta::head` of a sorted set whose directory is kept.
pub const RANKED: i64 = 1;
/// A chunk past this many entries splits in two.
pub const CHUNK_MAX: u64 = 256;
/// A chunk a removal leaves under this many entries merges with a neighbour...
const CHUNK_MIN: u64 = 64;
/// ...if the two then hold at most this many.
const MERGE_MAX: u64 = 192;
/// The size of the chunks `build` cuts.
const BUILD_CHUNK: u64 = 128;

type Db = heed::Database<Bytes, Bytes>;
type Range = (Bound<Vec<u8>>, Bound<Vec<u8>>);

fn damaged(what: &str) -> StoreError {
    StoreError::damaged(format!("sorted-set rank directory: {what}"))
}

fn count_of(v: &[u8]) -> Result<u64, StoreError> {
    let b: [u8; 8] = v.try_into().map_err(|_| damaged("malformed count"))?;
    Ok(u64::from_le_bytes(b))
}

/// The directory's prefix for set `id`.
fn dir_id(id: u64) -> [u8; 8] {
    (id | ZRANK_DIR).to_be_bytes()
}

/// The directory key of a chunk starting at index key `ix` (`id ++ suffix`).
fn dir_key(id: u64, ix: &[u8]) -> Vec<u8> {
    let mut k = dir_id(id).to_vec();
    k.extend_from_slice(ix.get(8..).unwrap_or_default());
    k
}

/// The index key where the chunk at directory key `d` starts.
fn ix_start(id: u64, d: &[u8]) -> Vec<u8> {
    let mut k = id.to_be_bytes().to_vec();
    k.extend_from_slice(d.get(8..).unwrap_or_default());
    k
}

/// Just past every key under the 8-byte prefix `p`.
fn end_of(p: [u8; 8]) -> Bound<Vec<u8>> {
    match u64::from_be_bytes(p).checked_add(1) {
        Some(n) => Bound::Excluded(n.to_be_bytes().to_vec()),
        None => Bound::Unbounded,
    }
}

/// Every directory record of set `id`.
fn whole_dir(id: u64) -> Range {
    (Bound::Included(dir_id(id).to_vec()), end_of(dir_id(id)))
}

fn slices(b: &Range) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (
        b.0.as_ref().map(Vec::as_slice),
        b.1.as_ref().map(Vec::as_slice),
    )
}

fn entry(r: Option<heed::Result<(&[u8], &[u8])>>) -> Result<Option<(Vec<u8>, u64)>, StoreError> {
    match r {
        None => Ok(None),
        Some(r) => {
            let (k, v) = r?;
            Ok(Some((k.to_vec(), count_of(v)?)))
        }
    }
}

/// The chunk holding index key `ix` of set `id`: (directory key, count), or None when no
/// chunk starts at or below it (then no entry of the set sorts at or below `ix`).
fn chunk_of(
    db: &Db,
    txn: &RoTxn,
    id: u64,
    ix: &[u8],
) -> Result<Option<(Vec<u8>, u64)>, StoreError> {
    let range = (
        Bound::Included(dir_id(id).to_vec()),
        Bound::Included(dir_key(id, ix)),
    );
    entry(db.rev_range(txn, &slices(&range))?.next())
}

/// The chunk after (or before) the one at directory key `at`.
fn neighbour(
    db: &Db,
    txn: &RoTxn,
    id: u64,
    at: &[u8],
    next: bool,
) -> Result<Option<(Vec<u8>, u64)>, StoreError> {
    if next {
        let range = (Bound::Excluded(at.to_vec()), end_of(dir_id(id)));
        entry(db.range(txn, &slices(&range))?.next())
    } else {
        let range = (
            Bound::Included(dir_id(id).to_vec()),
            Bound::Excluded(at.to_vec()),
        );
        entry(db.rev_range(txn, &slices(&range))?.next())
    }
}

/// Notes that index key `ix` (just put into `zscore`) joined set `id`.
pub fn inserted(db: &Table, txn: &mut LogTxn, id: u64, ix: &[u8]) -> Result<(), StoreError> {
    let Some((at, n)) = chunk_of(db, txn, id, ix)? else {
        // Below every chunk (or the set's first entry): a chunk open at the bottom takes it.
        db.put(txn, &dir_id(id), &1u64.to_le_bytes())?;
        return Ok(());
    };
    let n = n + 1;
    if n <= CHUNK_MAX {
        db.put(txn, &at, &n.to_le_bytes())?;
        return Ok(());
    }
    // Split: the second half starts at the entry after the first half.
    let half = n / 2;
    let range = (Bound::Included(ix_start(id, &at)), end_of(id.to_be_bytes()));
    let second = match db.range(txn, &slices(&range))?.nth(half as usize) {
        Some(r) => dir_key(id, r?.0),
        None => return Err(damaged("a chunk counts more entries than the index holds")),
    };
    db.put(txn, &at, &half.to_le_bytes())?;
    db.put(txn, &second, &(n - half).to_le_bytes())?;
    Ok(())
}

/// Notes that index key `ix` (just deleted from `zscore`) left set `id`.
pub fn removed(db: &Table, txn: &mut LogTxn, id: u64, ix: &[u8]) -> Result<(), StoreError> {
    let Some((at, n)) = chunk_of(db, txn, id, ix)? else {
        return Err(damaged("an index entry below every chunk"));
    };
    let n = n
        .checked_sub(1)
        .ok_or_else(|| damaged("a chunk counted empty"))?;
    if n == 0 {
        db.delete(txn, &at)?;
        return Ok(());
    }
    if n < CHUNK_MIN {
        if let Some((next, m)) = neighbour(db, txn, id, &at, true)?
            && n + m <= MERGE_MAX
        {
            db.delete(txn, &next)?;
            db.put(txn, &at, &(n + m).to_le_bytes())?;
            return Ok(());
        }
        if let Some((prev, m)) = neighbour(db, txn, id, &at, false)?
            && n + m <= MERGE_MAX
        {
            db.delete(txn, &at)?;
            db.put(txn, &prev, &(n + m).to_le_bytes())?;
            return Ok(());
        }
    }
    db.put(txn, &at, &n.to_le_bytes())?;
    Ok(())
}

/// Builds the directory of set `id` from its index (a set written before directories were
/// kept, which has none).
pub fn build(db: &Table, txn: &mut LogTxn, id: u64) -> Result<(), StoreError> {
    let prefix = id.to_be_bytes();
    // Chunk starts and counts first: the index cannot be walked while the directory is written.
    let mut chunks: Vec<(Vec<u8>, u64)> = Vec::new();
    for (i, r) in db.prefix_iter(txn, &prefix[..])?.enumerate() {
        let (k, _) = r?;
        if (i as u64).is_multiple_of(BUILD_CHUNK) {
            let start = if i == 0 {
                dir_id(id).to_vec()
            } else {
                dir_key(id, k)
            };
            chunks.push((start, 0));
        }
        if let Some(last) = chunks.last_mut() {
            last.1 += 1;
        }
    }
    for (k, n) in chunks {
        db.put(txn, &k, &n.to_le_bytes())?;
    }
    Ok(())
}

/// The number of index entries of set `id` (of `len` members) that sort before index key `ix`.
pub fn below(db: &Db, txn: &RoTxn, id: u64, len: u64, ix: &[u8]) -> Result<u64, StoreError> {
    let Some((at, _)) = chunk_of(db, txn, id, ix)? else {
        return Ok(0);
    };
    let before = counted_before(db, txn, id, len, &at)?;
    let inside = (
        Bound::Included(ix_start(id, &at)),
        Bound::Excluded(ix.to_vec()),
    );
    let mut within = 0u64;
    for r in db.range(txn, &slices(&inside))? {
        r?;
        within += 1;
    }
    Ok(before + within)
}

/// The entries of the chunks before the one at directory key `at`, summed from the nearer end
/// of the directory (both ends walked in step until one reaches it).
fn counted_before(db: &Db, txn: &RoTxn, id: u64, len: u64, at: &[u8]) -> Result<u64, StoreError> {
    let lower = (
        Bound::Included(dir_id(id).to_vec()),
        Bound::Excluded(at.to_vec()),
    );
    let upper = (Bound::Included(at.to_vec()), end_of(dir_id(id)));
    let mut fwd = db.range(txn, &slices(&lower))?;
    let mut bwd = db.rev_range(txn, &slices(&upper))?;
    let (mut sum_below, mut sum_above) = (0u64, 0u64);
    loop {
        match fwd.next() {
            None => return Ok(sum_below),
            Some(r) => sum_below += count_of(r?.1)?,
        }
        match bwd.next() {
            None => {
                return len
                    .checked_sub(sum_above)
                    .ok_or_else(|| damaged("the counts exceed the set's length"));
            }
            Some(r) => sum_above += count_of(r?.1)?,
        }
    }
}

/// The index key at rank `rank` (0-based, in score order) of set `id` (of `len` members).
pub fn key_at(db: &Db, txn: &RoTxn, id: u64, len: u64, rank: u64) -> Result<Vec<u8>, StoreError> {
    if rank >= len {
        return Err(damaged("a rank past the set's length"));
    }
    // (chunk start, rank of its first entry), from the nearer end.
    let mut found = None;
    if rank < len / 2 {
        let mut first = 0u64;
        for r in db.range(txn, &slices(&whole_dir(id)))? {
            let (k, v) = r?;
            let n = count_of(v)?;
            if rank < first + n {
                found = Some((k.to_vec(), first));
                break;
            }
            first += n;
        }
    } else {
        let mut end = len;
        for r in db.rev_range(txn, &slices(&whole_dir(id)))? {
            let (k, v) = r?;
            let first = end
                .checked_sub(count_of(v)?)
                .ok_or_else(|| damaged("the counts exceed the set's length"))?;
            if rank >= first {
                found = Some((k.to_vec(), first));
                break;
            }
            end = first;
        }
    }
    let Some((at, first)) = found else {
        return Err(damaged("the counts fall short of the set's length"));
    };
    let inside = (Bound::Included(ix_start(id, &at)), end_of(id.to_be_bytes()));
    match db
        .range(txn, &slices(&inside))?
        .nth((rank - first) as usize)
    {
        Some(r) => Ok(r?.0.to_vec()),
        None => Err(damaged("a chunk counts more entries than the index holds")),
    }
}

/// Whether `key` (a `zscore` key) is a directory record rather than an index entry.
pub fn is_directory(key: &[u8]) -> bool {
    key.first().is_some_and(|b| b & 0x80 != 0)
}

/// The set id a directory record belongs to.
pub fn directory_owner(key: &[u8]) -> Option<u64> {
    let id: [u8; 8] = key.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(id) & !ZRANK_DIR)
}

fn count(db: &Db, txn: &RoTxn, range: &Range) -> Result<u64, StoreError> {
    let mut n = 0;
    for r in db.range(txn, &slices(range))? {
        r?;
        n += 1;
    }
    Ok(n)
}

/// Checks set `id`'s directory against its index (`memkeep check`): the problems found.
pub fn verify(db: &Db, txn: &RoTxn, id: u64, len: u64) -> Result<Vec<String>, StoreError> {
    let mut problems = Vec::new();
    let chunks: Vec<(Vec<u8>, u64)> = db
        .range(txn, &slices(&whole_dir(id)))?
        .map(|r| {
            let (k, v) = r?;
            Ok((k.to_vec(), count_of(v)?))
        })
        .collect::<Result<_, StoreError>>()?;
    let total: u64 = chunks.iter().map(|c| c.1).sum();
    if total != len {
        problems.push(format!(
            "its rank directory counts {total} members, the set has {len}"
        ));
    }
    if let Some((first, _)) = chunks.first() {
        let below = (
            Bound::Included(id.to_be_bytes().to_vec()),
            Bound::Excluded(ix_start(id, first)),
        );
        let n = count(db, txn, &below)?;
        if n > 0 {
            problems.push(format!(
                "{n} score index entries sort below its first rank chunk"
            ));
        }
    }
    for (i, (start, n)) in chunks.iter().enumerate() {
        let end = match chunks.get(i + 1) {
            Some((next, _)) => Bound::Excluded(ix_start(id, next)),
            None => end_of(id.to_be_bytes()),
        };
        let range = (Bound::Included(ix_start(id, start)), end);
        let held = count(db, txn, &range)?;
        if *n == 0 || held != *n {
            problems.push(format!(
                "rank chunk {i} counts {n} entries, the score index holds {held} there"
            ));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::lmdb::LmdbStore;
    use std::collections::BTreeSet;

    const ID: u64 = 42;

    fn ix(score: u64, member: &[u8]) -> Vec<u8> {
        let mut k = ID.to_be_bytes().to_vec();
        k.extend_from_slice(&score.to_be_bytes());
        k.extend_from_slice(member);
        k
    }

    fn check(store: &LmdbStore, txn: &RoTxn, model: &BTreeSet<Vec<u8>>) {
        let len = model.len() as u64;
        let problems = verify(&store.zscore, txn, ID, len).expect("verify");
        assert!(problems.is_empty(), "{problems:?}");
        for (rank, k) in model.iter().enumerate().step_by(37) {
            assert_eq!(
                below(&store.zscore, txn, ID, len, k).expect("below"),
                rank as u64
            );
            assert_eq!(
                &key_at(&store.zscore, txn, ID, len, rank as u64).expect("key_at"),
                k
            );
        }
        if let Some(last) = model.iter().next_back() {
            let past = ix(u64::MAX, b"\xff\xff");
            assert!(past > *last);
            assert_eq!(
                below(&store.zscore, txn, ID, len, &past).expect("below"),
                len
            );
            assert_eq!(
                &key_at(&store.zscore, txn, ID, len, len - 1).expect("key_at"),
                last
            );
        }
        assert_eq!(
            below(&store.zscore, txn, ID, len, &ix(0, b"")).expect("below"),
            0
        );
    }

    #[test]
    fn ranks_stay_exact_through_inserts_removals_splits_and_merges() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = LmdbStore::open(dir.path(), 64 << 20, 16).expect("open");
        let mut model = BTreeSet::new();
        let mut rng = crate::test_rng::Xorshift(0x9e37_79b9_7f4a_7c15);
        // Grow to a few thousand (many splits), shrink to a few (merges, emptied chunks), grow
        // again; every phase checked against the model.
        for (phase, (steps, insert_pct)) in
            [(6000, 85), (4000, 10), (3000, 70)].into_iter().enumerate()
        {
            let mut txn = store.write_txn().expect("txn");
            for _ in 0..steps {
                let r = rng.next_u64();
                if r % 100 < insert_pct || model.is_empty() {
                    let k = ix(
                        rng.below(500),
                        format!("m{}", rng.below(100_000)).as_bytes(),
                    );
                    if model.insert(k.clone()) {
                        store.zscore.put(&mut txn, &k, &[]).expect("put");
                        inserted(&store.zscore, &mut txn, ID, &k).expect("inserted");
                    }
                } else {
                    let nth = rng.below(model.len() as u64) as usize;
                    let k = model.iter().nth(nth).cloned().expect("nth");
                    model.remove(&k);
                    assert!(store.zscore.delete(&mut txn, &k).expect("delete"));
                    removed(&store.zscore, &mut txn, ID, &k).expect("removed");
                }
            }
            check(&store, &txn, &model);
            txn.commit_unlogged().expect("commit");
            let rtxn = store.read_txn().expect("read");
            check(&store, &rtxn, &model);
            drop(rtxn);
            assert!(!model.is_empty(), "phase {phase} emptied the set");
        }
        // Removing everything leaves no directory record behind.
        let mut txn = store.write_txn().expect("txn");
        for k in std::mem::take(&mut model) {
            store.zscore.delete(&mut txn, &k).expect("delete");
            removed(&store.zscore, &mut txn, ID, &k).expect("removed");
        }
        check(&store, &txn, &model);
        assert_eq!(store.zscore.iter(&txn).expect("iter").count(), 0);
    }

    #[test]
    fn a_directory_built_from_an_index_matches_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, _) = LmdbStore::open(dir.path(), 64 << 20, 16).expect("open");
        let mut model = BTreeSet::new();
        let mut txn = store.write_txn().expect("txn");
        for i in 0..1000u64 {
            let k = ix(i * 7 % 311, format!("{i}").as_bytes());
            store.zscore.put(&mut txn, &k, &[]).expect("put");
            model.insert(k);
        }
        build(&store.zscore, &mut txn, ID).expect("build");
        check(&store, &txn, &model);
        // A miscount is reported, not trusted.
        let first = dir_id(ID);
        store
            .zscore
            .put(&mut txn, &first, &5u64.to_le_bytes())
            .expect("put");
        let problems = verify(&store.zscore, &txn, ID, 1000).expect("verify");
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
