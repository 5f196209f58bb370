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

/// This process's resident memory, in bytes: anonymous (heap, stacks: what memkeep allocates)
/// and file-backed (LMDB's map of `data.mdb` that is resident and mapped here: page cache the
/// kernel may take back at any time). Zero where `/proc/self/status` is unreadable.
#[derive(Debug, Default, Clone, Copy)]
pub struct Resident {
    pub anon: u64,
    pub file: u64,
}

pub fn resident() -> Resident {
    let mut r = Resident::default();
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return r;
    };
    for l in status.lines() {
        let kib = |rest: &str| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
                * 1024
        };
        if let Some(rest) = l.strip_prefix("RssAnon:") {
            r.anon = kib(rest);
        } else if let Some(rest) = l.strip_prefix("RssFile:") {
            r.file = kib(rest);
        }
    }
    r
}
