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

/// Process-wide gauges.
#[derive(Debug, Default)]
pub struct Gauges {
    pub curr_connections: AtomicUsize,
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
