//! The keys RESP clients WATCH, and a version per watched key that the writer moves on whenever
//! a committed batch changed the key, whichever protocol changed it.
//!
//! Invariants:
//! - A key is in the registry exactly while some connection watches it (a count of watchers);
//!   with nobody watching, the writer's only cost is one atomic load per write (`active`).
//! - Versions come from one counter that only grows, so a version a connection remembers can
//!   never be seen again for its key, even if the key left the registry in between.
//! - The writer bumps versions only after the batch that changed the keys has committed
//!   (`publish`), and a worker reads a key's version before it opens the snapshot later reads
//!   use: a change either shows in that snapshot or moves the version past the one remembered,
//!   so EXEC never misses it. Changes earlier in EXEC's own batch are in its `Touched`.
//! - Expiry is not a write: a key that was live with a TTL when watched counts as changed once
//!   that TTL has passed (Redis 7's rule; a key already expired when watched is ignored).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One key as a connection watches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedKey {
    pub key: Vec<u8>,
    /// The registry's version of the key when it was watched.
    pub version: u64,
    /// The key was live with this expiry (unix ms) when watched.
    pub expires: Option<u64>,
}

#[derive(Debug)]
struct Entry {
    watchers: usize,
    version: u64,
}

/// The server-wide registry of watched keys.
#[derive(Debug, Default)]
pub struct Watches {
    map: Mutex<HashMap<Vec<u8>, Entry>>,
    /// Keys in `map`: 0 means nobody watches anything.
    keys: AtomicUsize,
    next_version: AtomicU64,
}

/// The watched keys one batch has changed so far (and whether it emptied the store), kept by
/// the writer until the batch commits.
#[derive(Debug, Default)]
pub struct Touched {
    keys: HashSet<Vec<u8>>,
    all: bool,
}

impl Touched {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && !self.all
    }

    fn has(&self, key: &[u8]) -> bool {
        self.all || self.keys.contains(key)
    }
}

impl Watches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Entry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Anyone watches anything.
    pub fn active(&self) -> bool {
        self.keys.load(Ordering::Acquire) > 0
    }

    /// Adds a watcher of `key`; the key's version now.
    pub fn watch(&self, key: &[u8]) -> u64 {
        let mut map = self.lock();
        if let Some(e) = map.get_mut(key) {
            e.watchers += 1;
            return e.version;
        }
        let version = self.next_version.fetch_add(1, Ordering::AcqRel);
        map.insert(
            key.to_vec(),
            Entry {
                watchers: 1,
                version,
            },
        );
        self.keys.store(map.len(), Ordering::Release);
        version
    }

    /// Removes one watcher of `key`.
    pub fn unwatch(&self, key: &[u8]) {
        let mut map = self.lock();
        if let Some(e) = map.get_mut(key) {
            e.watchers -= 1;
            if e.watchers == 0 {
                map.remove(key);
            }
        }
        self.keys.store(map.len(), Ordering::Release);
    }

    /// Notes, in the writer, that the batch changed `key`.
    pub fn note(&self, key: &[u8], touched: &mut Touched) {
        if !touched.all && self.lock().contains_key(key) {
            touched.keys.insert(key.to_vec());
        }
    }

    /// Notes that the batch removed every key that exists now: `exists` says which watched
    /// keys do (Redis fires the watches of keys a flush actually deleted).
    pub fn note_flush(&self, touched: &mut Touched, mut exists: impl FnMut(&[u8]) -> bool) {
        let map = self.lock();
        for key in map.keys() {
            if exists(key) {
                touched.keys.insert(key.clone());
            }
        }
    }

    /// Notes that the batch emptied the store in a way nobody can check key by key (a delayed
    /// flush coming due).
    pub fn note_all(&self, touched: &mut Touched) {
        touched.all = true;
    }

    /// Whether `w` changed since it was watched: by a committed batch, by an earlier write of
    /// the batch running now (`touched`), or by expiring (at `now_ms`).
    pub fn fired(&self, w: &WatchedKey, touched: &Touched, now_ms: u64) -> bool {
        if touched.has(&w.key) || w.expires.is_some_and(|at| at <= now_ms) {
            return true;
        }
        self.lock()
            .get(&w.key[..])
            .is_none_or(|e| e.version != w.version)
    }

    /// After the batch committed: moves the version of every key it changed.
    pub fn publish(&self, touched: &mut Touched) {
        if touched.is_empty() {
            return;
        }
        let mut map = self.lock();
        for (key, e) in map.iter_mut() {
            if touched.has(key) {
                e.version = self.next_version.fetch_add(1, Ordering::AcqRel);
            }
        }
        touched.keys.clear();
        touched.all = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(w: &Watches, key: &[u8]) -> WatchedKey {
        WatchedKey {
            key: key.to_vec(),
            version: w.watch(key),
            expires: None,
        }
    }

    #[test]
    fn a_published_change_fires_and_an_unrelated_one_does_not() {
        let w = Watches::default();
        let a = watched(&w, b"a");
        let b = watched(&w, b"b");
        let mut t = Touched::default();
        w.note(b"a", &mut t);
        w.note(b"zzz", &mut t);
        assert!(w.fired(&a, &t, 0), "a change earlier in the batch counts");
        assert!(!w.fired(&b, &t, 0));
        w.publish(&mut t);
        assert!(t.is_empty());
        assert!(w.fired(&a, &t, 0));
        assert!(!w.fired(&b, &t, 0));
    }

    #[test]
    fn nobody_watching_is_inactive_and_versions_never_repeat() {
        let w = Watches::default();
        assert!(!w.active());
        let a = watched(&w, b"a");
        assert!(w.active());
        w.unwatch(b"a");
        assert!(!w.active());
        let again = watched(&w, b"a");
        assert_ne!(a.version, again.version);
    }

    #[test]
    fn expiry_and_flush_fire() {
        let w = Watches::default();
        let mut a = watched(&w, b"a");
        a.expires = Some(100);
        let t = Touched::default();
        assert!(!w.fired(&a, &t, 99));
        assert!(w.fired(&a, &t, 100));
        let b = watched(&w, b"b");
        let c = watched(&w, b"c");
        let mut t = Touched::default();
        w.note_flush(&mut t, |k| k == b"b");
        assert!(w.fired(&b, &t, 0));
        assert!(!w.fired(&c, &t, 0));
        w.note_all(&mut t);
        assert!(w.fired(&c, &t, 0));
    }
}
