//! Counters behind memcached's `stats` (and later Redis `INFO`). Each worker owns one `Counters`
//! (relaxed atomics on its own cache lines, so workers never contend); `stats` sums them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Per-worker request counters, named as memcached names them.
        #[derive(Debug, Default)]
        #[repr(align(128))]
        pub struct Counters { $(pub $name: AtomicU64,)* }

        /// A summed snapshot of every worker's counters.
        #[derive(Debug, Default, Clone, Copy)]
        pub struct Totals { $(pub $name: u64,)* }

        impl Totals {
            pub fn add(&mut self, c: &Counters) {
                $(self.$name += c.$name.load(Ordering::Relaxed);)*
            }
        }

        impl Counters {
            pub fn reset(&self) {
                $(self.$name.store(0, Ordering::Relaxed);)*
            }
        }
    };
}

counters!(
    cmd_get,
    cmd_set,
    cmd_flush,
    cmd_touch,
    get_hits,
    get_misses,
    get_expired,
    get_flushed,
    delete_misses,
    delete_hits,
    incr_misses,
    incr_hits,
    decr_misses,
    decr_hits,
    cas_misses,
    cas_hits,
    cas_badval,
    touch_hits,
    touch_misses,
    store_too_large,
    store_no_memory,
    bytes_read,
    bytes_written,
    total_items,
    total_connections,
    rejected_connections,
    resp_commands,
    idle_kicks,
    auth_cmds,
    auth_errors,
    output_limit_disconnections,
    reads_in_writer,
);

impl Counters {
    /// Adds one. Each counter has one writing thread (its worker; the acceptor only writes
    /// `rejected_connections`), so a plain load and store suffices where a locked add would
    /// cost more on every request. A `stats reset` racing with a bump may be lost.
    #[inline]
    pub fn bump(c: &AtomicU64) {
        Counters::add(c, 1);
    }

    #[inline]
    pub fn add(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
}

/// memcached's per-prefix statistics (`stats detail on|off|dump`): for each key prefix (the
/// key up to its first `:`; keys without one are not counted), the gets, get hits, stores and
/// deletes over the classic text and binary protocols (meta commands are not counted, as in
/// memcached). Off by default; while off, counting costs one relaxed load per request.
///
/// memcached keeps every prefix it ever saw; memkeep keeps at most `PREFIXES_MAX` of them (a
/// key of a new prefix past that is not counted), so the table and `stats detail dump` stay
/// bounded (under 3 MB).
#[derive(Debug, Default)]
pub struct Prefixes {
    enabled: std::sync::atomic::AtomicBool,
    table: std::sync::Mutex<std::collections::BTreeMap<Box<[u8]>, PrefixCounts>>,
}

/// Most prefixes `Prefixes` keeps.
pub const PREFIXES_MAX: usize = 10_000;

/// The prefix delimiter (memcached's `-D` default).
const DELIMITER: u8 = b':';

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCounts {
    pub get: u64,
    pub hit: u64,
    pub set: u64,
    pub del: u64,
}

impl Prefixes {
    /// `stats detail on|off`.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Whether requests are being counted now.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn record(&self, key: &[u8], count: impl FnOnce(&mut PrefixCounts)) {
        if !self.enabled() {
            return;
        }
        // memcached also stops at a NUL byte.
        let Some(end) = key.iter().position(|&b| b == DELIMITER || b == 0) else {
            return;
        };
        if key[end] == 0 {
            return;
        }
        let prefix = &key[..end];
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = table.get_mut(prefix) {
            count(c);
        } else if table.len() < PREFIXES_MAX {
            let mut c = PrefixCounts::default();
            count(&mut c);
            table.insert(prefix.into(), c);
        }
    }

    pub fn record_get(&self, key: &[u8], hit: bool) {
        self.record(key, |c| {
            c.get += 1;
            c.hit += u64::from(hit);
        });
    }

    /// A get counted (as a miss) before it ran turned out to hit (`gat`).
    pub fn record_hit(&self, key: &[u8]) {
        self.record(key, |c| c.hit += 1);
    }

    pub fn record_set(&self, key: &[u8]) {
        self.record(key, |c| c.set += 1);
    }

    pub fn record_delete(&self, key: &[u8]) {
        self.record(key, |c| c.del += 1);
    }

    /// `stats reset` forgets them all, as memcached's does.
    pub fn clear(&self) {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// `stats detail dump`: one `PREFIX` line per prefix, in byte order, then `END`.
    pub fn dump(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        for (prefix, c) in table.iter() {
            out.extend_from_slice(b"PREFIX ");
            out.extend_from_slice(prefix);
            let _ = write!(
                out,
                " get {} hit {} set {} del {}\r\n",
                c.get, c.hit, c.set, c.del
            );
        }
        out.extend_from_slice(b"END\r\n");
    }
}

/// Process-wide gauges.
#[derive(Debug, Default)]
pub struct Gauges {
    pub curr_connections: AtomicUsize,
    /// The acceptor is not accepting for now (out of descriptors): memcached's
    /// `accepting_conns` 0.
    pub accept_paused: std::sync::atomic::AtomicBool,
    /// Times the acceptor stopped accepting (memcached's `listen_disabled_num`).
    pub listen_disabled: AtomicU64,
}

/// CPU time this process has used, in seconds (user, system).
pub fn rusage() -> (f64, f64) {
    // Safety: getrusage fills the zeroed struct we pass; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

/// Resident memory, in bytes: anonymous (heap, stacks: memkeep's own) and file-backed (the
/// LMDB map's pages in the page cache, and the binary), from `/proc/self/status`. Zeros where
/// the file is missing or unreadable.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rss {
    pub anon: u64,
    pub file: u64,
}

pub fn rss() -> Rss {
    std::fs::read_to_string("/proc/self/status").map_or(Rss::default(), |t| parse_rss(&t))
}

fn parse_rss(status: &str) -> Rss {
    let mut r = Rss::default();
    for line in status.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let kb = rest
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .unwrap_or(0);
        match name {
            "RssAnon" => r.anon = kb * 1024,
            "RssFile" | "RssShmem" => r.file += kb * 1024,
            _ => {}
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_count_only_while_on_and_stay_bounded() {
        let p = Prefixes::default();
        p.record_set(b"a:1");
        p.set_enabled(true);
        p.record_set(b"a:1");
        p.record_get(b"a:2", true);
        p.record_get(b"a:3", false);
        p.record_delete(b"b:x:y");
        p.record_get(b"nocolon", true);
        p.record_get(b":empty", false);
        p.record_get(b"n\0ul:x", false);
        let mut out = Vec::new();
        p.dump(&mut out);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "PREFIX  get 1 hit 0 set 0 del 0\r\nPREFIX a get 2 hit 1 set 1 del 0\r\n\
             PREFIX b get 0 hit 0 set 0 del 1\r\nEND\r\n"
        );
        for i in 0..PREFIXES_MAX + 10 {
            p.record_set(format!("p{i}:k").as_bytes());
        }
        assert_eq!(p.table.lock().expect("lock").len(), PREFIXES_MAX);
        p.clear();
        out.clear();
        p.dump(&mut out);
        assert_eq!(out, b"END\r\n");
    }

    #[test]
    fn rss_reads_anonymous_and_file_backed_apart() {
        let t = "VmRSS:\t  3000 kB\nRssAnon:\t  1000 kB\nRssFile:\t  1800 kB\nRssShmem:\t 200 kB\n";
        assert_eq!(
            parse_rss(t),
            Rss {
                anon: 1000 * 1024,
                file: 2000 * 1024
            }
        );
        // This process has a heap.
        assert!(rss().anon > 0);
    }
}

/// How a RESP command ended, for INFO commandstats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// It ran and answered (an error reply included: then `failed_calls` counts it too).
    Ran { failed: bool },
    /// Refused before it ran (arity, authentication, ACL, a bad subcommand): `rejected_calls`.
    Rejected,
}

#[derive(Debug, Default)]
struct CmdSlot {
    calls: AtomicU64,
    usec: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
}

/// The most distinct error codes INFO errorstats tracks (Redis's limit too): later new codes
/// are not counted.
pub const ERRORSTATS_MAX: usize = 128;

/// One worker's INFO commandstats and errorstats figures: a slot of counters per command (and
/// per container subcommand, `resp::stat_slot`), written by that worker alone with plain
/// loads and stores as `Counters`; error codes in a map behind a lock only this worker and
/// INFO take (the worker only when it answers an error).
#[derive(Debug)]
pub struct CommandStats {
    slots: Box<[CmdSlot]>,
    errors: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    /// Every error reply (INFO stats `total_error_replies`), codes past the limit included.
    total_errors: AtomicU64,
}

/// The figures of one command, summed over the workers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CmdTotals {
    pub calls: u64,
    pub usec: u64,
    pub rejected: u64,
    pub failed: u64,
}

impl CommandStats {
    pub fn new(slots: usize) -> CommandStats {
        CommandStats {
            slots: (0..slots).map(|_| CmdSlot::default()).collect(),
            errors: std::sync::Mutex::default(),
            total_errors: AtomicU64::new(0),
        }
    }

    /// Counts one command in `slot`.
    #[inline]
    pub fn record(&self, slot: usize, usec: u64, end: CallEnd) {
        let Some(s) = self.slots.get(slot) else {
            return;
        };
        match end {
            CallEnd::Rejected => Counters::bump(&s.rejected),
            CallEnd::Ran { failed } => {
                Counters::bump(&s.calls);
                Counters::add(&s.usec, usec);
                if failed {
                    Counters::bump(&s.failed);
                }
            }
        }
    }

    /// Counts an error reply (`-CODE text\r\n`, or a reply that is not one: nothing) under its
    /// code, the text up to the first space.
    pub fn error_reply(&self, reply: &[u8]) {
        let Some(rest) = reply.strip_prefix(b"-") else {
            return;
        };
        Counters::bump(&self.total_errors);
        let end = rest
            .iter()
            .position(|&b| b == b' ' || b == b'\r')
            .unwrap_or(rest.len());
        let code = String::from_utf8_lossy(&rest[..end]);
        let mut map = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(code.as_ref()) {
            *n += 1;
        } else if map.len() < ERRORSTATS_MAX {
            map.insert(code.into_owned(), 1);
        }
    }

    pub fn reset(&self) {
        for s in self.slots.iter() {
            for c in [&s.calls, &s.usec, &s.rejected, &s.failed] {
                c.store(0, Ordering::Relaxed);
            }
        }
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.total_errors.store(0, Ordering::Relaxed);
    }

    /// Every worker's error replies.
    pub fn total_errors(all: &[CommandStats]) -> u64 {
        all.iter()
            .map(|w| w.total_errors.load(Ordering::Relaxed))
            .sum()
    }

    /// Every worker's figures summed: per slot, and per error code (in code order).
    pub fn merge(
        all: &[CommandStats],
    ) -> (Vec<CmdTotals>, std::collections::BTreeMap<String, u64>) {
        let n = all.first().map_or(0, |w| w.slots.len());
        let mut slots = vec![CmdTotals::default(); n];
        let mut errors = std::collections::BTreeMap::new();
        for w in all {
            for (t, s) in slots.iter_mut().zip(w.slots.iter()) {
                t.calls += s.calls.load(Ordering::Relaxed);
                t.usec += s.usec.load(Ordering::Relaxed);
                t.rejected += s.rejected.load(Ordering::Relaxed);
                t.failed += s.failed.load(Ordering::Relaxed);
            }
            for (k, v) in w.errors.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                *errors.entry(k.clone()).or_insert(0) += v;
            }
        }
        let total: usize = errors.len();
        if total > ERRORSTATS_MAX {
            // Workers may each have met different codes: keep the most frequent.
            let mut by: Vec<(String, u64)> = errors.into_iter().collect();
            by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            by.truncate(ERRORSTATS_MAX);
            errors = by.into_iter().collect();
        }
        (slots, errors)
    }
}
