//! What memcached's meta protocol reports of an item's use: whether it was fetched since it was
//! written (`mg h`, `me`'s `fetch=`, metadump's `fetch=`) and when it was last used (`mg l`,
//! `me`'s `la=`, metadump's `la=`).
//!
//! memcached keeps both in the item; memkeep keeps them in memory only, so that a read never
//! becomes a write to disk: `Hits` is a fixed table (4 MiB, whatever the number of keys) of one
//! 64-bit word per slot, eight slots to a bucket, a key's hash choosing its bucket:
//!
//! ```text
//! bits 49..64  fingerprint of the key's hash (never 0: an empty slot matches no key)
//! bit  48      fetched since written
//! bits 30..48  the low 18 bits of the item's CAS when the slot was last set
//! bits  0..30  last use, in seconds since the table was made
//! ```
//!
//! - The writer notes every item it stores (`written`, from `LmdbWrite::put`): a store that
//!   gives the item a new CAS starts it over (not fetched, used now); one that keeps the CAS
//!   (`touch`, `gat`, `mg T`, a win token handed out, RESP `EXPIRE`) is a use, as memcached's
//!   touch is a fetch.
//! - Workers note fetches (`fetched`: `get`, `gets`, binary gets, `mg` without `u`).
//! - A slot whose CAS bits differ from the item's speaks of an older version: it counts as
//!   unknown, like a key the table does not hold. An unknown item reads as not fetched, last
//!   used at its bucket's *horizon*: the latest use the bucket has forgotten (a slot given to
//!   another key), or the table's creation. Either way, it was not used after that as far as
//!   the table can tell, so the idle time reported is a lower bound.
//! - A key not in its bucket takes the slot whose use is oldest: the table remembers about the
//!   last half-million keys used. Nothing is persisted: after a restart every item reads as not
//!   fetched, last used when the server started.
//!
//! Every operation is a few relaxed atomic loads and at most one store; concurrent notes of
//! one bucket may lose one of them, which only makes the answer a little older.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::clock::Clock;

const BUCKET_SLOTS: usize = 8;
const BUCKETS: usize = 1 << 16;
const SECS_BITS: u32 = 30;
const SECS_MASK: u64 = (1 << SECS_BITS) - 1;
const TAG_BITS: u32 = 18;
const TAG_SHIFT: u32 = SECS_BITS;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
const FETCHED: u64 = 1 << (TAG_SHIFT + TAG_BITS);
const FP_SHIFT: u32 = TAG_SHIFT + TAG_BITS + 1;

#[repr(align(64))]
struct Bucket([AtomicU64; BUCKET_SLOTS]);

/// The use table (see the module documentation).
pub struct Hits {
    buckets: Box<[Bucket]>,
    /// Per bucket: the latest use (table seconds) of a slot it gave to another key.
    horizons: Box<[AtomicU32]>,
    seed: u64,
    /// Unix seconds the table counts from.
    base_s: u64,
    clock: Arc<Clock>,
}

/// What the table says of one item's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Fetched since it was last written.
    pub fetched: bool,
    /// Last used, in unix seconds.
    pub last_s: u64,
}

impl Seen {
    /// Seconds since the last use, at `now_ms`.
    pub fn idle_secs(&self, now_ms: u64) -> u64 {
        (now_ms / 1000).saturating_sub(self.last_s)
    }
}

/// A slot as read before a write that may change it: resolved against the item's CAS once the
/// write's outcome is known (`resolve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peek {
    word: Option<u64>,
    horizon_s: u64,
    base_s: u64,
}

impl Peek {
    /// What the slot said of the item with CAS `cas`.
    pub fn resolve(&self, cas: u64) -> Seen {
        match self.word {
            Some(w) if (w >> TAG_SHIFT) & TAG_MASK == cas & TAG_MASK => Seen {
                fetched: w & FETCHED != 0,
                last_s: self.base_s + (w & SECS_MASK),
            },
            _ => Seen {
                fetched: false,
                last_s: self.horizon_s,
            },
        }
    }
}

impl Hits {
    pub fn new(clock: Arc<Clock>) -> Hits {
        let base_s = clock.now_ms() / 1000;
        // A per-process seed: which keys share a bucket is not something a client can aim at.
        let seed = getrandom::u64().unwrap_or(0x4528_21e6_38d0_1377);
        Hits {
            buckets: (0..BUCKETS)
                .map(|_| Bucket(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            horizons: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            seed,
            base_s,
            clock,
        }
    }

    /// Unix seconds the table counts from (uses before it are unknown).
    pub fn base_s(&self) -> u64 {
        self.base_s
    }

    fn hash(&self, key: &[u8]) -> u64 {
        super::cache::key_hash(self.seed, key)
    }

    /// The key's bucket index and fingerprint (never 0).
    fn place(&self, key: &[u8]) -> (usize, u64) {
        let h = self.hash(key);
        ((h as usize) & (BUCKETS - 1), (h >> FP_SHIFT).max(1))
    }

    fn secs(&self, now_ms: u64) -> u64 {
        (now_ms / 1000).saturating_sub(self.base_s).min(SECS_MASK)
    }

    /// The slot word of `key`, if its bucket holds it, and the bucket's horizon.
    pub fn peek(&self, key: &[u8]) -> Peek {
        let (b, fp) = self.place(key);
        let word = self.buckets[b]
            .0
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .find(|w| w >> FP_SHIFT == fp);
        Peek {
            word,
            horizon_s: self.base_s + u64::from(self.horizons[b].load(Ordering::Relaxed)),
            base_s: self.base_s,
        }
    }

    /// What the table knows of the use of `key`'s item whose CAS is `cas`.
    pub fn seen(&self, key: &[u8], cas: u64) -> Seen {
        self.peek(key).resolve(cas)
    }

    /// Sets `key`'s slot to `word` (a key not in its bucket takes the slot used longest ago).
    fn note(&self, key: &[u8], word_for: impl Fn(Option<u64>) -> u64) {
        let (b, fp) = self.place(key);
        let bucket = &self.buckets[b].0;
        let mut victim = 0;
        let mut oldest = u64::MAX;
        for (i, slot) in bucket.iter().enumerate() {
            let w = slot.load(Ordering::Relaxed);
            if w >> FP_SHIFT == fp {
                let new = word_for(Some(w));
                // A key read many times a second keeps its word: no store, no cache line taken.
                if new != w {
                    slot.store(new, Ordering::Relaxed);
                }
                return;
            }
            let age = if w == 0 { 0 } else { (w & SECS_MASK) + 1 };
            if age < oldest {
                oldest = age;
                victim = i;
            }
        }
        if oldest > 0 {
            // The bucket forgets a use: keys it does not hold were not used after that one.
            let forgotten = (oldest - 1) as u32;
            self.horizons[b].fetch_max(forgotten, Ordering::Relaxed);
        }
        bucket[victim].store(word_for(None) | (fp << FP_SHIFT), Ordering::Relaxed);
    }

    fn word(fetched: bool, cas: u64, secs: u64) -> u64 {
        (if fetched { FETCHED } else { 0 }) | ((cas & TAG_MASK) << TAG_SHIFT) | (secs & SECS_MASK)
    }

    /// A reader fetched `key`'s item (CAS `cas`) at `now_ms`.
    pub fn fetched(&self, key: &[u8], cas: u64, now_ms: u64) {
        let secs = self.secs(now_ms);
        self.note(key, |old| {
            let fp = old.map_or(0, |w| w & !((1 << FP_SHIFT) - 1));
            // A reader's clock may lag a writer's: time never goes back.
            let secs = old
                .filter(|w| (w >> TAG_SHIFT) & TAG_MASK == cas & TAG_MASK)
                .map_or(secs, |w| secs.max(w & SECS_MASK));
            fp | Hits::word(true, cas, secs)
        });
    }

    /// Puts back what the table said of `key`'s item before a request that must not count as
    /// a use (`mg ... u` that the writer ran, e.g. with `T`).
    pub fn restore(&self, key: &[u8], cas: u64, seen: Seen) {
        let secs = seen.last_s.saturating_sub(self.base_s).min(SECS_MASK);
        self.note(key, |old| {
            let fp = old.map_or(0, |w| w & !((1 << FP_SHIFT) - 1));
            fp | Hits::word(seen.fetched, cas, secs)
        });
    }

    /// The writer stored `key`'s item with CAS `cas`: a new CAS starts its history over; the
    /// same CAS (a touch) is a use.
    pub fn written(&self, key: &[u8], cas: u64) {
        let secs = self.secs(self.clock.now_ms());
        self.note(key, |old| {
            let fp = old.map_or(0, |w| w & !((1 << FP_SHIFT) - 1));
            let same = old.is_some_and(|w| (w >> TAG_SHIFT) & TAG_MASK == cas & TAG_MASK);
            fp | Hits::word(same, cas, secs)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000;

    fn table() -> (Arc<Clock>, Hits) {
        let clock = Arc::new(Clock::manual(T0));
        let hits = Hits::new(clock.clone());
        (clock, hits)
    }

    #[test]
    fn a_write_starts_over_and_a_fetch_marks_it() {
        let (clock, h) = table();
        let base = T0 / 1000;
        assert_eq!(
            h.seen(b"k", 5),
            Seen {
                fetched: false,
                last_s: base
            }
        );
        clock.advance(3_000);
        h.written(b"k", 5);
        assert_eq!(h.seen(b"k", 5).last_s, base + 3);
        assert!(!h.seen(b"k", 5).fetched);
        clock.advance(2_000);
        h.fetched(b"k", 5, clock.now_ms());
        let s = h.seen(b"k", 5);
        assert!(s.fetched);
        assert_eq!(s.idle_secs(clock.now_ms()), 0);
        // A touch (same CAS) is a use; a new CAS is a new item.
        clock.advance(4_000);
        h.written(b"k", 5);
        assert!(h.seen(b"k", 5).fetched);
        assert_eq!(h.seen(b"k", 5).idle_secs(clock.now_ms()), 0);
        h.written(b"k", 6);
        assert!(!h.seen(b"k", 6).fetched);
        // The slot speaks of CAS 6 now: asking about another version is unknown.
        assert!(!h.seen(b"k", 5).fetched);
        assert_eq!(h.seen(b"k", 5).last_s, base);
    }

    #[test]
    fn a_lagging_reader_never_moves_time_back() {
        let (clock, h) = table();
        clock.advance(10_000);
        h.written(b"k", 1);
        h.fetched(b"k", 1, T0 + 2_000);
        assert_eq!(h.seen(b"k", 1).last_s, T0 / 1000 + 10);
    }

    #[test]
    fn forgotten_keys_read_as_unused_since_the_horizon() {
        let (clock, h) = table();
        // Far more keys than the table holds: the early ones are forgotten, and what is said
        // of them is never later than a use the table dropped.
        for i in 0..(BUCKETS * BUCKET_SLOTS * 2) as u64 {
            if i % 100_000 == 0 {
                clock.advance(1_000);
            }
            h.written(&i.to_le_bytes(), i);
        }
        let now = clock.now_ms();
        let mut forgotten = 0;
        for i in 0..1000u64 {
            let s = h.seen(&i.to_le_bytes(), i);
            assert!(!s.fetched);
            assert!(s.last_s > T0 / 1000 && s.last_s <= now / 1000);
            forgotten += usize::from(s.last_s > T0 / 1000 + 1);
        }
        assert!(
            forgotten > 900,
            "{forgotten} of the first keys were forgotten"
        );
        // The newest keys are remembered exactly.
        let last = (BUCKETS * BUCKET_SLOTS * 2) as u64 - 1;
        assert_eq!(h.seen(&last.to_le_bytes(), last).last_s, now / 1000);
    }

    #[test]
    fn peek_resolves_after_the_write() {
        let (clock, h) = table();
        h.written(b"k", 9);
        h.fetched(b"k", 9, clock.now_ms());
        let before = h.peek(b"k");
        clock.advance(1_000);
        h.written(b"k", 9);
        assert!(before.resolve(9).fetched);
        assert!(!before.resolve(10).fetched);
        h.restore(
            b"k",
            9,
            Seen {
                fetched: false,
                last_s: T0 / 1000,
            },
        );
        assert_eq!(
            h.seen(b"k", 9),
            Seen {
                fetched: false,
                last_s: T0 / 1000
            }
        );
    }
}
