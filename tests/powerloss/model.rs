//! What the load wrote, and the judge of what a store gives back after a power cut.
//!
//! Every key belongs to one client connection, which sends one request at a time: its history
//! is the sequence of operations sent for it (a set of a new version, or a delete), each with
//! the moment its success reply arrived, if it did. Operation `i` (from 0) carries version
//! `i + 1`; a set's value is `value(key, version)`, which starts with the version and is
//! otherwise filled from a generator seeded by the key and version, so a value read back names
//! the one operation that can have written it, and any other byte string (torn, mixed up, from
//! another key) is wrong.
//!
//! A read after the cut is judged against the history: a value must be exactly one of the
//! versions set for that key; an absent key stands for the latest delete sent (or the time
//! before the first operation). The operations acknowledged before the cut that come after
//! the state read back are lost.

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

/// The version a value claims to be.
pub fn version_of(v: &[u8]) -> Option<u32> {
    let colon = v.iter().take(11).position(|&b| b == b':')?;
    std::str::from_utf8(&v[..colon]).ok()?.parse().ok()
}

#[derive(Debug, Clone)]
pub struct Op {
    pub version: u32,
    /// A set of `value(key, version)`, else a delete.
    pub set: bool,
    /// When the success reply arrived.
    pub acked_at: Option<Instant>,
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
    pub fn push(&mut self, set: bool) -> usize {
        let version = self.ops.len() as u32 + 1;
        self.ops.push(Op {
            version,
            set,
            acked_at: None,
        });
        self.ops.len() - 1
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
        Read::Absent => h.ops.iter().rposition(|o| !o.set),
        Read::Value(v) => {
            let found =
                version_of(v).and_then(|ver| h.ops.iter().position(|o| o.version == ver && o.set));
            match found {
                Some(i) if *v == value(&h.key, h.ops[i].version) => Some(i),
                Some(i) => {
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
                None => {
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
        if let Some(t) = op.acked_at.filter(|t| *t < cut_at) {
            out.lost += 1;
            let age = cut_at.saturating_duration_since(t);
            out.oldest_lost = Some(out.oldest_lost.map_or(age, |a| a.max(age)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history of `ops` (true: set), acknowledged `acked` ms before the cut (None: never).
    fn history(key: &str, ops: &[(bool, Option<u64>)], cut: Instant) -> History {
        let mut h = History::new(key.into());
        for &(set, acked) in ops {
            let i = h.push(set);
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
}
