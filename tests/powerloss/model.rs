//! What the load wrote, and the judge of what a store gives back after a power cut.
//!
//! Every key belongs to one client connection, which sends one request at a time: its history
//! is the sequence of operations sent for it (a set of a new version, an append, or a delete),
//! each with the moment its success reply arrived, if it did. Operation `i` (from 0) carries
//! version `i + 1`; a set's value is `value(key, version)`, which starts with the version and
//! is otherwise filled from a generator seeded by the key and version, and an append adds
//! `chunk(key, version)`, which starts with `+<version>:` and has a length of its own. So a
//! value read back names the operations that made it (a set, then the appends after it, in
//! order), and any other byte string (torn, mixed up, from another key) is wrong. Appends go
//! to values the load knows are there; on values of 4 KiB and more memkeep logs them as
//! patches (only the appended bytes), which is what they are here to put under power cuts.
//!
//! A read after the cut is judged against the history: a value must be exactly one of the
//! states the key went through (a set and every append after it up to some operation, skipping
//! only appends the server refused); an absent key stands for the latest delete sent (or the
//! time before the first operation). The operations acknowledged before the cut that come
//! after the state read back are lost.

use std::time::{Duration, Instant};

/// splitmix64: small, seedable, good enough to pick operations and pages.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }

    pub fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// FNV-1a, to seed a key's values.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The value of `key` at `version`: 10 B to 20 KiB, mostly small, any bytes after a
/// `<version>:` header.
pub fn value(key: &str, version: u32) -> Vec<u8> {
    let mut rng = Rng(hash(key) ^ (version as u64).wrapping_mul(0xA24B_AED4_963E_E407));
    let len = match rng.below(100) {
        0..50 => rng.range(10, 200),
        50..85 => rng.range(200, 4000),
        _ => rng.range(4000, 20 * 1024 + 1),
    } as usize;
    let mut v = format!("{version}:").into_bytes();
    let len = len.max(v.len() + 1);
    while v.len() < len {
        v.extend_from_slice(&rng.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// What an append of `version` adds to `key`'s value: 8 to 300 bytes after a `+<version>:`
/// header.
pub fn chunk(key: &str, version: u32) -> Vec<u8> {
    let mut rng = Rng(hash(key) ^ (version as u64).wrapping_mul(0x9FB2_1C65_1E98_DF25) ^ 1);
    let len = rng.range(8, 301) as usize;
    let mut v = format!("+{version}:").into_bytes();
    let len = len.max(v.len() + 1);
    while v.len() < len {
        v.extend_from_slice(&rng.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The version a value claims to be.
pub fn version_of(v: &[u8]) -> Option<u32> {
    let colon = v.iter().take(11).position(|&b| b == b':')?;
    std::str::from_utf8(&v[..colon]).ok()?.parse().ok()
}

/// The version an append's chunk at the start of `v` claims to be.
fn chunk_version(v: &[u8]) -> Option<u32> {
    version_of(v.strip_prefix(b"+")?)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// A set of `value(key, version)`.
    Set,
    /// `chunk(key, version)` appended to the value there.
    Append,
    Delete,
}

#[derive(Debug, Clone)]
pub struct Op {
    pub version: u32,
    pub kind: OpKind,
    /// When the success reply arrived.
    pub acked_at: Option<Instant>,
    /// The server answered with a refusal: the operation changed nothing.
    pub refused: bool,
}

#[derive(Debug, Clone)]
pub struct History {
    pub key: String,
    pub ops: Vec<Op>,
}

impl History {
    pub fn new(key: String) -> History {
        History {
            key,
            ops: Vec::new(),
        }
    }

    /// Records the next operation as sent; returns its index.
    pub fn push(&mut self, kind: OpKind) -> usize {
        let version = self.ops.len() as u32 + 1;
        self.ops.push(Op {
            version,
            kind,
            acked_at: None,
            refused: false,
        });
        self.ops.len() - 1
    }

    /// The length of the value the key holds for sure, if it holds one: every operation
    /// since its last set was acknowledged (so an append goes onto a value that is there).
    pub fn sure_len(&self) -> Option<usize> {
        let mut len = 0;
        for o in &self.ops {
            o.acked_at?;
            match o.kind {
                OpKind::Set => len = value(&self.key, o.version).len(),
                OpKind::Append => len += chunk(&self.key, o.version).len(),
                OpKind::Delete => len = 0,
            }
        }
        (len > 0).then_some(len)
    }

    pub fn acked_before(&self, cut_at: Instant) -> usize {
        self.ops
            .iter()
            .filter(|o| o.acked_at.is_some_and(|t| t < cut_at))
            .count()
    }
}

/// What one read after the restart gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Absent,
    Value(Vec<u8>),
    /// An error reply, a malformed reply, or no reply.
    Failed(String),
}

/// The judgement of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Operations acknowledged before the cut.
    pub acked: usize,
    /// Of those, how many come after the state read back.
    pub lost: usize,
    /// How long before the cut the oldest lost one was acknowledged.
    pub oldest_lost: Option<Duration>,
    /// Why the read is not a state the key ever had (a damaged store), if it is not.
    pub wrong: Option<String>,
}

fn describe(v: &[u8]) -> String {
    let head = &v[..v.len().min(16)];
    format!("{:?}.. ({} bytes)", String::from_utf8_lossy(head), v.len())
}

/// Judges what a read of `h.key` gave, for a cut at `cut_at`.
pub fn judge(h: &History, read: &Read, cut_at: Instant) -> Verdict {
    let acked = h.acked_before(cut_at);
    let mut out = Verdict {
        acked,
        ..Verdict::default()
    };
    // The index of the operation whose state was read (None: before the first one).
    let state: Option<usize> = match read {
        Read::Failed(e) => {
            out.wrong = Some(format!("{}: read failed: {e}", h.key));
            return out;
        }
        Read::Absent => h.ops.iter().rposition(|o| o.kind == OpKind::Delete),
        Read::Value(v) => {
            let found = version_of(v).and_then(|ver| {
                h.ops
                    .iter()
                    .position(|o| o.version == ver && o.kind == OpKind::Set)
            });
            let base = found.map(|i| value(&h.key, h.ops[i].version));
            match (found, base) {
                (Some(i), Some(base)) if v.starts_with(&base) => {
                    match appended(h, i, &v[base.len()..]) {
                        Ok(last) => Some(last),
                        Err(why) => {
                            out.wrong = Some(format!(
                                "{}: value {} is version {} with appends that are not the ones sent after it: {why}",
                                h.key,
                                describe(v),
                                h.ops[i].version
                            ));
                            return out;
                        }
                    }
                }
                (Some(i), _) => {
                    let want = value(&h.key, h.ops[i].version);
                    let at = v.iter().zip(&want).position(|(a, b)| a != b);
                    out.wrong = Some(format!(
                        "{}: value {} starts as version {} but is not it (torn, or another key's): {} bytes instead of {}, first difference at byte {}",
                        h.key,
                        describe(v),
                        h.ops[i].version,
                        v.len(),
                        want.len(),
                        at.map_or("-".into(), |a| a.to_string())
                    ));
                    return out;
                }
                (None, _) => {
                    out.wrong = Some(format!(
                        "{}: value {} is no version written for this key (versions 1..={} sent)",
                        h.key,
                        describe(v),
                        h.ops.len()
                    ));
                    return out;
                }
            }
        }
    };
    let after = state.map_or(0, |i| i + 1);
    for op in &h.ops[after.min(h.ops.len())..] {
        if op.refused {
            continue;
        }
        if let Some(t) = op.acked_at.filter(|t| *t < cut_at) {
            out.lost += 1;
            let age = cut_at.saturating_duration_since(t);
            out.oldest_lost = Some(out.oldest_lost.map_or(age, |a| a.max(age)));
        }
    }
    out
}

/// The index of the last operation whose chunk `rest` (what follows the value set by
/// operation `set`) ends with: `rest` must be the chunks of the appends after `set`, in order,
/// each next one the next operation but for appends the server refused.
fn appended(h: &History, set: usize, mut rest: &[u8]) -> Result<usize, String> {
    let mut last = set;
    while !rest.is_empty() {
        let ver = chunk_version(rest).ok_or("bytes that are no append's chunk")?;
        let i = h.ops[last + 1..]
            .iter()
            .position(|o| o.version == ver)
            .map(|p| last + 1 + p)
            .ok_or(format!(
                "a chunk of version {ver}, no operation after {}",
                last + 1
            ))?;
        if h.ops[i].kind != OpKind::Append {
            return Err(format!("a chunk of version {ver}, which was no append"));
        }
        if let Some(skipped) = h.ops[last + 1..i].iter().find(|o| !o.refused) {
            return Err(format!(
                "version {ver}'s chunk without version {}'s before it",
                skipped.version
            ));
        }
        let want = chunk(&h.key, ver);
        if !rest.starts_with(&want) {
            return Err(format!("version {ver}'s chunk is torn or not its own"));
        }
        rest = &rest[want.len()..];
        last = i;
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history of `ops` (true: set), acknowledged `acked` ms before the cut (None: never).
    fn history(key: &str, ops: &[(bool, Option<u64>)], cut: Instant) -> History {
        let mut h = History::new(key.into());
        for &(set, acked) in ops {
            let i = h.push(if set { OpKind::Set } else { OpKind::Delete });
            h.ops[i].acked_at = acked.map(|ms| cut - Duration::from_millis(ms));
        }
        h
    }

    #[test]
    fn values_name_their_version_and_vary_in_size() {
        let sizes: Vec<usize> = (1..200).map(|v| value("k", v).len()).collect();
        assert!(sizes.iter().all(|&n| (10..=20 * 1024).contains(&n)));
        assert!(sizes.iter().any(|&n| n < 200) && sizes.iter().any(|&n| n > 4000));
        for v in [1, 9, 10, 12345] {
            assert_eq!(version_of(&value("k", v)), Some(v));
        }
        assert_ne!(value("k", 1), value("j", 1));
    }

    #[test]
    fn the_last_acknowledged_version_or_a_later_one_loses_nothing() {
        let cut = Instant::now() + Duration::from_secs(10);
        let h = history(
            "k",
            &[(true, Some(30)), (true, Some(20)), (true, None)],
            cut,
        );
        for v in [2, 3] {
            let got = judge(&h, &Read::Value(value("k", v)), cut);
            assert_eq!(
                (got.acked, got.lost, got.wrong),
                (2, 0, None),
                "version {v}"
            );
        }
    }

    #[test]
    fn an_older_version_or_absence_counts_the_acknowledged_writes_lost() {
        let cut = Instant::now() + Duration::from_secs(10);
        let h = history(
            "k",
            &[(true, Some(30)), (true, Some(20)), (true, None)],
            cut,
        );
        let got = judge(&h, &Read::Value(value("k", 1)), cut);
        assert_eq!((got.lost, got.wrong.clone()), (1, None));
        assert_eq!(got.oldest_lost, Some(Duration::from_millis(20)));
        let got = judge(&h, &Read::Absent, cut);
        assert_eq!(
            (got.lost, got.oldest_lost),
            (2, Some(Duration::from_millis(30)))
        );
        assert_eq!(got.wrong, None);
    }

    #[test]
    fn absence_matches_a_delete() {
        let cut = Instant::now() + Duration::from_secs(10);
        let h = history("k", &[(true, Some(30)), (false, Some(20))], cut);
        assert_eq!(judge(&h, &Read::Absent, cut).lost, 0);
        // An unacknowledged delete may have happened too.
        let h = history("k", &[(true, Some(30)), (false, None)], cut);
        assert_eq!(judge(&h, &Read::Absent, cut).lost, 0);
        // Acknowledgements after the cut promise nothing.
        let h = history("k", &[(true, None)], cut);
        let mut late = h.clone();
        late.ops[0].acked_at = Some(cut + Duration::from_millis(1));
        assert_eq!(judge(&late, &Read::Absent, cut), Verdict::default());
    }

    #[test]
    fn a_torn_foreign_or_unknown_value_is_wrong() {
        let cut = Instant::now() + Duration::from_secs(10);
        let h = history("k", &[(true, Some(30)), (true, Some(20))], cut);
        let mut torn = value("k", 2);
        let mid = torn.len() / 2;
        torn[mid] ^= 0x55;
        let cases = [
            Read::Value(torn),
            Read::Value(value("k", 2)[..9].to_vec()),
            Read::Value(value("other", 2)),
            Read::Value(value("k", 7)),
            Read::Value(b"garbage".to_vec()),
            Read::Failed("SERVER_ERROR".into()),
        ];
        for read in cases {
            let got = judge(&h, &read, cut);
            assert!(got.wrong.is_some(), "{read:?} passed as {got:?}");
        }
        // A delete's version never has a value.
        let h = history("k", &[(true, Some(30)), (false, Some(20))], cut);
        assert!(judge(&h, &Read::Value(value("k", 2)), cut).wrong.is_some());
    }

    #[test]
    fn appends_are_judged_in_order_and_only_refused_ones_may_be_missing() {
        let cut = Instant::now() + Duration::from_secs(10);
        // set 1, append 2, append 3 (refused), append 4, append 5 (not acknowledged).
        let mut h = history("k", &[(true, Some(50))], cut);
        for (acked, refused) in [
            (Some(40), false),
            (None, true),
            (Some(30), false),
            (None, false),
        ] {
            let i = h.push(OpKind::Append);
            h.ops[i].acked_at = acked.map(|ms| cut - Duration::from_millis(ms));
            h.ops[i].refused = refused;
        }
        let with = |vers: &[u32]| {
            let mut v = value("k", 1);
            for &ver in vers {
                v.extend_from_slice(&chunk("k", ver));
            }
            Read::Value(v)
        };
        // Each state the key went through, and what it loses.
        // A refused append may still be there (a cut inside the fdatasync that failed it).
        for (vers, lost) in [
            (&[][..], 2),
            (&[2][..], 1),
            (&[2, 4][..], 0),
            (&[2, 4, 5][..], 0),
            (&[2, 3, 4][..], 0),
        ] {
            let got = judge(&h, &with(vers), cut);
            assert_eq!((got.wrong.clone(), got.lost), (None, lost), "{vers:?}");
        }
        // Out of order, a skipped append that was not refused, a torn chunk, a chunk of
        // another key.
        for vers in [&[4, 2][..], &[4][..], &[3, 2][..]] {
            assert!(judge(&h, &with(vers), cut).wrong.is_some(), "{vers:?}");
        }
        let Read::Value(mut torn) = with(&[2, 4]) else {
            unreachable!()
        };
        let last = torn.len() - 1;
        torn[last] ^= 1;
        assert!(judge(&h, &Read::Value(torn), cut).wrong.is_some());
        let mut foreign = value("k", 1);
        foreign.extend_from_slice(&chunk("j", 2));
        assert!(judge(&h, &Read::Value(foreign), cut).wrong.is_some());
        // What the load may append to: only a value every operation of which was answered.
        assert_eq!(h.sure_len(), None);
        let h2 = history("k", &[(true, Some(50))], cut);
        assert_eq!(h2.sure_len(), Some(value("k", 1).len()));
    }
}
