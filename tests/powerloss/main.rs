//! Power loss: a real memkeep keeps its data directory on cutfs (`cutfs.rs`), a FUSE file
//! system that holds every unsynced write in memory, and the test cuts the power under load:
//! it freezes the file system (dropping all unsynced writes, persisting a random subset of
//! them, or doing that inside the next fsync), kills memkeep with SIGKILL, unmounts, mounts a
//! fresh cutfs on the same backing directory (the reboot: the old page cache is gone),
//! restarts memkeep and reads every key back through both protocols.
//!
//! The load: memcached-text and RESP connections at once, each owning its keys, each writing
//! successive versions (values of 10 B to 20 KiB that name their key and version, see
//! `model.rs`) and some deletes, one request at a time, recording when each reply came. What
//! each mode must show after every cut:
//! - every mode: memkeep starts, no read fails, every value is exactly one version written for
//!   its key (or the key is absent as some state of it allows) -- else the store is damaged;
//! - `always`: nothing acknowledged before the cut is lost;
//! - `periodic` (`--sync-interval-ms 200`): the oldest lost acknowledged write is reported, and
//!   must be younger than the interval plus 2 s of slack for a loaded machine;
//! - `never`: only the first rule.
//!
//! The test fails if any store is damaged, if `always` loses anything acknowledged, or if
//! `periodic` loses more than its window. It prints a table per mode and cut kind.
//!
//! Each sync mode runs twice: as it is, and with `--value-log-min 4k` (`+vlog`: values of
//! 4 KiB and more live only in the log, with a pointer in LMDB, `src/storage/vlog.rs`), under
//! the same rules.
//!
//! Environment: `MEMKEEP_POWERLOSS_CUTS` cuts per mode (default 6, spread over the three cut
//! kinds; `make powerloss` runs 50), `MEMKEEP_POWERLOSS_MODES` (default
//! `always,periodic,never,always+vlog,periodic+vlog,never+vlog`), `MEMKEEP_POWERLOSS_SEED` to replay the random choices (the cut
//! moments still depend on timing). Without /dev/fuse or fusermount3 the tests print SKIPPED
//! and why.

#[path = "../common/mod.rs"]
mod common;

mod client;
mod cutfs;
mod model;
mod toy;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use client::{LoadLog, Proto};
use common::{Options, Server};
use cutfs::{Cut, Mounted};
use model::{History, Read, Rng, judge};
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
const MC_CONNS: usize = 3;
const RESP_CONNS: usize = 3;
const KEYS_PER_CONN: usize = 12;
/// `periodic` mode's fsync interval, and the slack its loss window gets.
const SYNC_INTERVAL_MS: u64 = 200;
const PERIODIC_SLACK: Duration = Duration::from_secs(2);
/// When the cut comes, after the load starts: long enough for several checkpoints (one a
/// second, or sooner on growth) to have run or to be running.
const CUT_AFTER_MS: (u64, u64) = (250, 3000);
/// How long an armed in-fsync cut may wait for an fsync before it becomes a random-subset
/// cut (`never` mode does not fsync).
const FSYNC_WAIT: Duration = Duration::from_secs(1);
const DEFAULT_CUTS: usize = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Sync {
    Always,
    Periodic,
    Never,
}

/// A sync mode, and whether large values live in the log (`--value-log-min`, `vlog.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Mode {
    sync: Sync,
    value_log: bool,
}

/// `--value-log-min` in the `+vlog` modes: about a sixth of the load's values are larger.
const VALUE_LOG_MIN: &str = "4k";

impl Mode {
    fn name(self) -> &'static str {
        match (self.sync, self.value_log) {
            (Sync::Always, false) => "always",
            (Sync::Periodic, false) => "periodic",
            (Sync::Never, false) => "never",
            (Sync::Always, true) => "always+vlog",
            (Sync::Periodic, true) => "periodic+vlog",
            (Sync::Never, true) => "never+vlog",
        }
    }

    fn args(self) -> Vec<String> {
        let sync = match self.sync {
            Sync::Always => "always",
            Sync::Periodic => "periodic",
            Sync::Never => "never",
        };
        let mut a = vec!["--sync".to_string(), sync.to_string()];
        if self.sync == Sync::Periodic {
            a.extend(["--sync-interval-ms".into(), SYNC_INTERVAL_MS.to_string()]);
        }
        if self.value_log {
            a.extend(["--value-log-min".into(), VALUE_LOG_MIN.into()]);
        }
        a.extend(["--map-size".into(), "1g".into()]);
        a
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    DropAll,
    RandomSubset,
    InNextFsync,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::DropAll, Kind::RandomSubset, Kind::InNextFsync];

    fn name(self) -> &'static str {
        match self {
            Kind::DropAll => "drop-all",
            Kind::RandomSubset => "random-subset",
            Kind::InNextFsync => "in-fsync",
        }
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

fn modes() -> Vec<Mode> {
    let spec = std::env::var("MEMKEEP_POWERLOSS_MODES")
        .unwrap_or_else(|_| "always,periodic,never,always+vlog,periodic+vlog,never+vlog".into());
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (sync, value_log) = match s.strip_suffix("+vlog") {
                Some(base) => (base, true),
                None => (s, false),
            };
            let sync = match sync {
                "always" => Sync::Always,
                "periodic" => Sync::Periodic,
                "never" => Sync::Never,
                other => panic!(
                    "MEMKEEP_POWERLOSS_MODES: unknown mode {other:?} (always, periodic, never, each with or without +vlog)"
                ),
            };
            Mode { sync, value_log }
        })
        .collect()
}

fn base_seed() -> u64 {
    match std::env::var("MEMKEEP_POWERLOSS_SEED") {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => v.parse().ok(),
            };
            parsed.unwrap_or_else(|| panic!("MEMKEEP_POWERLOSS_SEED={v:?} is not a number"))
        }
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    }
}

/// Why power-loss tests cannot run here, if they cannot: no FUSE device or helper, or no
/// permission to mount (checked by mounting a cutfs once).
fn skip_reason() -> Option<String> {
    if let Some(why) = cutfs::unavailable() {
        return Some(why);
    }
    let dir = tempfile::Builder::new()
        .prefix("memkeep-powerloss-probe-")
        .tempdir()
        .expect("create a temp dir");
    let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
    std::fs::create_dir(&backing).expect("mkdir backing");
    std::fs::create_dir(&mnt).expect("mkdir mnt");
    match Mounted::mount(&backing, &mnt) {
        Ok(mut m) => {
            m.unmount().expect("unmount the probe mount");
            None
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Some(format!(
            "mounting a FUSE file system is not permitted here ({e})"
        )),
        Err(e) => panic!("mounting cutfs failed: {e}"),
    }
}

/// Prints SKIPPED and why, straight to stderr (so the test harness does not capture it),
/// where FUSE is not to be had.
fn skipped(test: &str) -> bool {
    use std::io::Write as _;
    match skip_reason() {
        Some(why) => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "SKIPPED: {test}: the power-loss test needs FUSE, because {why}"
            );
            true
        }
        None => false,
    }
}

/// A temporary directory with a backing dir and a mount point in it, and what runs on them.
/// Fields drop in order: the server dies before the unmount, the unmount comes before the
/// directories go.
struct Rig {
    server: Option<Server>,
    mount: Option<Mounted>,
    backing: PathBuf,
    mnt: PathBuf,
    _dir: TempDir,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::Builder::new()
            .prefix("memkeep-powerloss-")
            .tempdir()
            .expect("create a temp dir");
        let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
        std::fs::create_dir(&backing).expect("mkdir backing");
        std::fs::create_dir(&mnt).expect("mkdir mnt");
        Rig {
            server: None,
            mount: None,
            backing,
            mnt,
            _dir: dir,
        }
    }

    fn mount(&mut self) -> &Mounted {
        let m = Mounted::mount(&self.backing, &self.mnt)
            .unwrap_or_else(|e| panic!("mount cutfs on {}: {e}", self.mnt.display()));
        self.mount.insert(m)
    }

    fn mounted(&self) -> &Mounted {
        self.mount.as_ref().expect("mounted")
    }

    fn unmount(&mut self) {
        if let Some(mut m) = self.mount.take() {
            m.unmount().unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Freezes the file system with `kind`'s cut; for an in-fsync cut, waits (bounded) for the
    /// fsync that fires it. Returns the cut's moment and whether an in-fsync cut fired.
    fn cut(&self, kind: Kind, seed: u64) -> (Instant, bool) {
        let m = self.mounted();
        match kind {
            Kind::DropAll => m.cut(Cut::DropAll),
            Kind::RandomSubset => m.cut(Cut::RandomSubset(seed)),
            Kind::InNextFsync => {
                m.cut(Cut::InNextFsync(seed));
                let deadline = Instant::now() + FSYNC_WAIT;
                while m.cut_at().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if m.cut_at().is_none() {
                    m.cut(Cut::RandomSubset(seed));
                    return (m.cut_at().expect("frozen"), false);
                }
            }
        }
        (m.cut_at().expect("frozen"), true)
    }
}

/// One connection's keys.
fn conn_keys(proto: Proto, conn: usize) -> Vec<String> {
    let p = match proto {
        Proto::Mc => "mc",
        Proto::Resp => "resp",
    };
    (0..KEYS_PER_CONN)
        .map(|k| format!("pl-{p}{conn}-k{k}"))
        .collect()
}

/// The kernel's flusher, sped up: every 50 to 150 ms, writes the mount's dirty page-cache pages
/// (memkeep's writable map in `periodic` and `never`) back to cutfs, where they are unsynced
/// writes like any other (syncfs on FUSE sends no fsync); runs until `stop`.
fn flusher(mnt: PathBuf, seed: u64, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let Ok(dir) = std::fs::File::open(&mnt) else {
            return;
        };
        let mut rng = Rng(seed);
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(rng.range(50, 150)));
            // Safety: an open descriptor. Errors (a frozen mount) do not matter.
            unsafe { libc::syncfs(dir.as_raw_fd()) };
        }
    })
}

/// Runs the load against `addr` from one thread per connection (and the flusher on `mnt`)
/// until `cut` returns (it makes the cut and kills the server); returns the histories and
/// refusals.
fn load_until(
    addr: std::net::SocketAddr,
    resp_addr: Option<std::net::SocketAddr>,
    mnt: &Path,
    rng: &mut Rng,
    clock: cutfs::CutClock,
    cut: impl FnOnce(),
) -> (Vec<History>, Vec<String>) {
    let stop = Arc::new(AtomicBool::new(false));
    // Stops the load and the flusher (which holds the mount open) also when `cut` panics.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _guard = StopOnDrop(stop.clone());
    let flush = flusher(mnt.to_path_buf(), rng.next(), stop.clone());
    let mut conns: Vec<(std::net::SocketAddr, Proto, usize)> =
        (0..MC_CONNS).map(|c| (addr, Proto::Mc, c)).collect();
    if let Some(r) = resp_addr {
        conns.extend((0..RESP_CONNS).map(|c| (r, Proto::Resp, c)));
    }
    let threads: Vec<_> = conns
        .into_iter()
        .map(|(a, proto, c)| {
            let (stop, clock, seed) = (stop.clone(), clock.clone(), rng.next());
            std::thread::spawn(move || {
                client::load(a, proto, conn_keys(proto, c), seed, &stop, &|| {
                    clock.cut_at()
                })
            })
        })
        .collect();
    cut();
    stop.store(true, Ordering::Relaxed);
    flush.join().expect("flusher thread panicked");
    let mut histories = Vec::new();
    let mut early = Vec::new();
    for t in threads {
        let LoadLog {
            histories: h,
            early_refusals,
            ..
        } = t.join().expect("load thread panicked");
        histories.extend(h);
        early.extend(early_refusals);
    }
    (histories, early)
}

/// What one cut showed.
#[derive(Debug, Default)]
struct Outcome {
    acked: usize,
    lost: usize,
    oldest_lost: Option<Duration>,
    /// Why the store counts as damaged, if it does.
    damaged: Option<String>,
    /// memkeep did not start after the cut.
    not_started: bool,
    /// Reads that failed, and reads that gave a state the key never had.
    failed_reads: usize,
    wrong_values: usize,
    /// An in-fsync cut that found no fsync and cut as random-subset instead.
    fell_back: bool,
    early_refusals: Vec<String>,
    /// memkeep had its log segment mapped at the cut (`never` and `periodic` append through
    /// a shared mapping of a recycled segment: `wal::Mapping`).
    log_mapped: bool,
    /// `+vlog` modes: value segments the collector had retired, and bytes of values it had
    /// moved, just before the cut (`stats`), so the table shows the cuts came with collection
    /// at work.
    vlog_retired: u64,
    vlog_moved: u64,
}

/// `log_value_segments_retired` and `log_value_moved_bytes` from `stats` (zeros if the server
/// does not answer in time).
fn collection_stats(addr: std::net::SocketAddr) -> (u64, u64) {
    use std::io::{BufRead, BufReader, Write};
    let Ok(c) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return (0, 0);
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let Ok(mut w) = c.try_clone() else {
        return (0, 0);
    };
    if w.write_all(b"stats\r\n").is_err() {
        return (0, 0);
    }
    let (mut retired, mut moved) = (0, 0);
    for line in BufReader::new(c).lines() {
        let Ok(line) = line else { break };
        if line == "END" {
            break;
        }
        let mut f = line.split(' ').skip(1);
        match (f.next(), f.next().and_then(|v| v.parse().ok())) {
            (Some("log_value_segments_retired"), Some(v)) => retired = v,
            (Some("log_value_moved_bytes"), Some(v)) => moved = v,
            _ => {}
        }
    }
    (retired, moved)
}

/// Whether process `pid` has a log segment mapped (in `/proc/PID/maps`).
fn log_mapped(pid: Option<u32>) -> bool {
    pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/maps")).ok())
        .is_some_and(|m| {
            m.lines()
                .any(|l| l.contains("/wal-") && l.ends_with(".log"))
        })
}

/// Judges the reads of every key through both protocols.
fn judge_all(
    histories: &[History],
    reads: &[Vec<Read>],
    cut_at: Instant,
    out: &mut Outcome,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (i, h) in histories.iter().enumerate() {
        let verdicts: Vec<_> = reads.iter().map(|r| judge(h, &r[i], cut_at)).collect();
        out.acked += verdicts[0].acked;
        let lost = verdicts.iter().map(|v| v.lost).max().unwrap_or(0);
        out.lost += lost;
        for v in &verdicts {
            if let Some(age) = v.oldest_lost {
                out.oldest_lost = Some(out.oldest_lost.map_or(age, |a| a.max(age)));
            }
        }
        for (r, v) in reads.iter().zip(&verdicts) {
            if let Some(w) = &v.wrong {
                match r[i] {
                    Read::Failed(_) => out.failed_reads += 1,
                    _ => out.wrong_values += 1,
                }
                wrong.push(w.clone());
            }
        }
        let fine: Vec<&Read> = reads
            .iter()
            .map(|r| &r[i])
            .filter(|r| !matches!(r, Read::Failed(_)))
            .collect();
        if fine.windows(2).any(|w| w[0] != w[1]) {
            out.wrong_values += 1;
            wrong.push(format!(
                "{}: the two protocols read different states",
                h.key
            ));
        }
    }
    wrong
}

/// How long a cut that waits for the log to be mapped waits at most (the first recycled
/// segment comes at the third checkpoint or so, one a second).
const MAPPED_WAIT: Duration = Duration::from_secs(8);

/// `wait_mapped`: the cut's random delay starts only once memkeep appends through a mapped
/// segment (or `MAPPED_WAIT` passed), so that path meets cuts too.
fn run_cut(mode: Mode, kind: Kind, seed: u64, label: &str, wait_mapped: bool) -> Outcome {
    let mut rng = Rng(seed);
    let mut rig = Rig::new();
    rig.mount();
    let data_dir = rig.mnt.join("data");
    let server = Server::start_with(
        BIN,
        Options {
            args: mode.args(),
            resp: true,
            data_dir: Some(data_dir),
            ..Options::default()
        },
    );
    let (addr, resp_addr) = (server.addr(), server.resp_addr());
    rig.server = Some(server);
    let cut_after = Duration::from_millis(rng.range(CUT_AFTER_MS.0, CUT_AFTER_MS.1));
    let cut_seed = rng.next();
    let started = Instant::now();
    let mut cut_at = None;
    let mut fired = true;
    let mut mapped = false;
    let mut collected = (0, 0);
    let clock = rig.mounted().cut_clock();
    let mnt = rig.mnt.clone();
    let (histories, early) = load_until(addr, resp_addr, &mnt, &mut rng, clock, || {
        let pid = rig.server.as_ref().and_then(|s| s.pid());
        let deadline = Instant::now() + MAPPED_WAIT;
        while wait_mapped && !log_mapped(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(cut_after);
        if mode.value_log {
            collected = collection_stats(addr);
        }
        mapped = log_mapped(pid);
        let (at, f) = rig.cut(kind, cut_seed);
        (cut_at, fired) = (Some(at), f);
        if let Some(s) = rig.server.as_mut() {
            s.kill9();
        }
    });
    let cut_at = cut_at.expect("the cut was made");
    let stats = rig.mounted().stats();
    rig.unmount();
    rig.mount();
    let mut out = Outcome {
        fell_back: !fired,
        early_refusals: early,
        log_mapped: mapped,
        vlog_retired: collected.0,
        vlog_moved: collected.1,
        ..Outcome::default()
    };
    let server = rig.server.as_mut().expect("server");
    let keys: Vec<&str> = histories.iter().map(|h| h.key.as_str()).collect();
    match server.try_relaunch() {
        Err(e) => {
            out.acked = histories.iter().map(|h| h.acked_before(cut_at)).sum();
            // The reason, and the last thing memkeep said.
            let first = e.lines().next().unwrap_or_default();
            let last = e
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default();
            out.damaged = Some(format!(
                "memkeep did not start after the cut: {first} / {last}"
            ));
            out.not_started = true;
        }
        Ok(()) => {
            let reads = vec![
                client::read_back(server.addr(), Proto::Mc, &keys),
                client::read_back(server.resp_addr().expect("resp port"), Proto::Resp, &keys),
            ];
            let wrong = judge_all(&histories, &reads, cut_at, &mut out);
            if !wrong.is_empty() {
                let mut msg = format!(
                    "{} reads failed, {} gave a state the key never had, e.g.:",
                    out.failed_reads, out.wrong_values
                );
                for w in wrong.iter().take(4) {
                    let _ = write!(msg, "\n    {w}");
                }
                let tail = server.stderr_tail(400);
                let _ = write!(msg, "\n  memkeep stderr (tail):\n{tail}");
                out.damaged = Some(msg);
            }
        }
    }
    server.kill9();
    rig.server = None;
    rig.unmount();
    let verdict = match &out.damaged {
        None => "ok".to_string(),
        Some(d) => format!("DAMAGED: {d}"),
    };
    println!(
        "[{label}] seed {seed:#x}: cut at +{} ms{}: {} acked, {} lost{}; cutfs saw {} writes ({} O_DSYNC), {} fsyncs; dirty pages at the cut: {} persisted, {} dropped; {verdict}",
        cut_at.duration_since(started).as_millis(),
        if out.fell_back {
            " (no fsync came: cut as random-subset)"
        } else {
            ""
        },
        out.acked,
        out.lost,
        out.oldest_lost.map_or(String::new(), |a| format!(
            " (oldest {} ms before the cut)",
            a.as_millis()
        )),
        stats.writes,
        stats.sync_writes,
        stats.fsyncs,
        stats.cut_persisted,
        stats.cut_dropped,
    );
    out
}

/// Per mode and cut kind.
#[derive(Default)]
struct Row {
    cuts: usize,
    acked: usize,
    lost: usize,
    damaged: usize,
    /// Of the damaged: did not start, served at least one wrong value, only answered errors.
    not_started: usize,
    wrong_values: usize,
    oldest_lost: Option<Duration>,
    fell_back: usize,
    /// Cuts made while the log was appended through a mapping.
    log_mapped: usize,
    /// `+vlog` modes: value segments retired and bytes moved by the collector before the cuts
    /// (summed), and the cuts that came after at least one retirement.
    vlog_retired: u64,
    vlog_moved: u64,
    cuts_after_retiring: usize,
}

fn notes(r: &Row) -> String {
    let mut n = Vec::new();
    if r.damaged > 0 {
        n.push(format!(
            "damaged: {} did not start, {} served wrong values, {} answered errors",
            r.not_started,
            r.wrong_values,
            r.damaged - r.not_started - r.wrong_values
        ));
    }
    if r.vlog_retired > 0 || r.vlog_moved > 0 {
        n.push(format!(
            "collector before the cuts: {} value segments retired, {} KiB of values moved; {} cuts came after a retirement",
            r.vlog_retired,
            r.vlog_moved / 1024,
            r.cuts_after_retiring
        ));
    }
    if r.fell_back > 0 {
        n.push(format!(
            "{} of {} in-fsync cuts found no fsync and cut as random-subset",
            r.fell_back, r.cuts
        ));
    }
    n.join("; ")
}

fn table(rows: &BTreeMap<(Mode, Kind), Row>) -> String {
    let mut t = format!(
        "{:<13} {:<14} {:>5} {:>9} {:>7} {:>8} {:>15} {:>10}  notes\n",
        "mode", "cut", "cuts", "acked", "lost", "damaged", "oldest lost ms", "log mapped"
    );
    for ((mode, kind), r) in rows {
        let _ = writeln!(
            t,
            "{:<13} {:<14} {:>5} {:>9} {:>7} {:>8} {:>15} {:>10}  {}",
            mode.name(),
            kind.name(),
            r.cuts,
            r.acked,
            r.lost,
            r.damaged,
            r.oldest_lost
                .map_or("-".to_string(), |a| a.as_millis().to_string()),
            r.log_mapped,
            notes(r)
        );
    }
    t
}

#[test]
fn power_cuts_never_damage_a_store_and_always_mode_loses_nothing_acknowledged() {
    if skipped("power_cuts_never_damage_a_store_and_always_mode_loses_nothing_acknowledged") {
        return;
    }
    let cuts: usize = env_or("MEMKEEP_POWERLOSS_CUTS", DEFAULT_CUTS);
    let seed = base_seed();
    let modes = modes();
    println!(
        "power-loss: {cuts} cuts per mode for {:?}, MEMKEEP_POWERLOSS_SEED={seed:#x}",
        modes.iter().map(|m| m.name()).collect::<Vec<_>>()
    );
    let mut seeds = Rng(seed);
    let mut rows: BTreeMap<(Mode, Kind), Row> = BTreeMap::new();
    let mut failures = Vec::new();
    let started = Instant::now();
    for &mode in &modes {
        for i in 0..cuts {
            let kind = Kind::ALL[i % Kind::ALL.len()];
            let label = format!(
                "{} {} #{}",
                mode.name(),
                kind.name(),
                i / Kind::ALL.len() + 1
            );
            // Every second cut in `never` and `periodic` comes while the log is mapped.
            let wait_mapped = mode.sync != Sync::Always && (i / Kind::ALL.len()) % 2 == 1;
            let out = run_cut(mode, kind, seeds.next(), &label, wait_mapped);
            let row = rows.entry((mode, kind)).or_default();
            row.cuts += 1;
            row.acked += out.acked;
            row.lost += out.lost;
            row.fell_back += out.fell_back as usize;
            row.log_mapped += out.log_mapped as usize;
            row.vlog_retired += out.vlog_retired;
            row.vlog_moved += out.vlog_moved;
            row.cuts_after_retiring += usize::from(out.vlog_retired > 0);
            if let Some(age) = out.oldest_lost {
                row.oldest_lost = Some(row.oldest_lost.map_or(age, |a| a.max(age)));
            }
            if let Some(d) = &out.damaged {
                row.damaged += 1;
                row.not_started += out.not_started as usize;
                row.wrong_values += (out.wrong_values > 0) as usize;
                failures.push(format!("[{label}] damaged store: {d}"));
            }
            if !out.early_refusals.is_empty() {
                failures.push(format!(
                    "[{label}] memkeep refused writes before the cut: {:?}",
                    out.early_refusals
                ));
            }
            if mode.sync == Sync::Always && out.lost > 0 {
                failures.push(format!(
                    "[{label}] sync always lost {} acknowledged writes",
                    out.lost
                ));
            }
            let window = Duration::from_millis(SYNC_INTERVAL_MS) + PERIODIC_SLACK;
            if mode.sync == Sync::Periodic
                && let Some(age) = out.oldest_lost.filter(|a| *a > window)
            {
                failures.push(format!(
                    "[{label}] sync periodic lost a write acknowledged {} ms before the cut (window {} ms)",
                    age.as_millis(),
                    window.as_millis()
                ));
            }
        }
    }
    for &mode in &modes {
        let mapped: usize = rows
            .iter()
            .filter(|((m, _), _)| *m == mode)
            .map(|(_, r)| r.log_mapped)
            .sum();
        if mode.sync != Sync::Always && cuts > Kind::ALL.len() && mapped == 0 {
            failures.push(format!(
                "{}: no cut came while the log was mapped, so appends through a mapped segment went untested",
                mode.name()
            ));
        }
    }
    println!(
        "\npower-loss results (MEMKEEP_POWERLOSS_SEED={seed:#x}, {:.1} s):\n{}",
        started.elapsed().as_secs_f64(),
        table(&rows)
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Loads the toy store through memcached text for a moment, cuts with `DropAll`, reboots it
/// and judges it by `always`'s rule: it acknowledges writes it never syncs, so the judge must
/// find acknowledged writes lost.
#[test]
fn the_harness_catches_a_store_that_acknowledges_unsynced_writes() {
    if skipped("the_harness_catches_a_store_that_acknowledges_unsynced_writes") {
        return;
    }
    let mut rig = Rig::new();
    rig.mount();
    let dir: PathBuf = rig.mnt.join("toy");
    std::fs::create_dir(&dir).expect("mkdir on cutfs");
    let mut toy = toy::Toy::start(&dir, 0).expect("start the toy store");
    let addr = toy.addr();
    let mut rng = Rng(base_seed());
    let clock = rig.mounted().cut_clock();
    let mut cut_at = None;
    let mnt = rig.mnt.clone();
    let (histories, early) = load_until(addr, None, &mnt, &mut rng, clock, || {
        std::thread::sleep(Duration::from_millis(400));
        cut_at = Some(rig.cut(Kind::DropAll, 0).0);
        toy.kill();
    });
    drop(toy);
    let cut_at = cut_at.expect("the cut was made");
    assert!(early.is_empty(), "the toy refused writes: {early:?}");
    rig.unmount();
    rig.mount();
    let toy = toy::Toy::start(&dir, addr.port()).expect("restart the toy store");
    let keys: Vec<&str> = histories.iter().map(|h| h.key.as_str()).collect();
    let reads = vec![client::read_back(toy.addr(), Proto::Mc, &keys)];
    drop(toy);
    let mut out = Outcome::default();
    let wrong = judge_all(&histories, &reads, cut_at, &mut out);
    rig.unmount();
    println!(
        "toy store after a drop-all cut: {} acked, {} lost, {} wrong",
        out.acked,
        out.lost,
        wrong.len()
    );
    assert!(
        out.acked > 0,
        "the load got no acknowledgement from the toy"
    );
    assert!(wrong.is_empty(), "the toy's reads judged wrong: {wrong:?}");
    assert!(
        out.lost > 0,
        "the judge found no lost write, though the toy never syncs"
    );
}

/// cutfs itself: a file written and fdatasynced, then written more (inside and past its end):
/// a drop-all cut freezes the mount, and after the reboot only the synced state is there.
#[test]
fn cutfs_keeps_synced_data_and_forgets_the_rest() {
    if skipped("cutfs_keeps_synced_data_and_forgets_the_rest") {
        return;
    }
    let mut rig = Rig::new();
    rig.mount();
    let f = rig.mnt.join("f");
    let write = |p: &Path, data: &[u8], off: u64, sync: bool| {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(p)
            .expect("open on cutfs");
        file.write_all_at(data, off).expect("write on cutfs");
        if sync {
            file.sync_data().expect("fdatasync on cutfs");
        }
    };
    write(&f, &[1u8; 10_000], 0, true);
    write(&f, &[2u8; 100], 5000, false);
    write(&f, &[3u8; 100], 20_000, false);
    let mut seen = std::fs::read(&f).expect("read on cutfs");
    assert_eq!(seen.len(), 20_100, "the unsynced extension is visible");
    assert_eq!((seen[4999], seen[5000], seen[10_001]), (1, 2, 0));
    rig.mounted().cut(Cut::DropAll);
    assert!(
        std::fs::read(&f).is_err(),
        "a frozen file system answers EIO"
    );
    rig.unmount();
    rig.mount();
    seen = std::fs::read(&f).expect("read after the reboot");
    assert_eq!(seen, vec![1u8; 10_000], "only the synced state survives");
    drop(rig);
}

/// A fresh cutfs to test the file system itself, or None (after SKIPPED) without FUSE.
fn cutfs_rig(test: &str) -> Option<Rig> {
    if skipped(test) {
        return None;
    }
    let mut rig = Rig::new();
    rig.mount();
    Some(rig)
}

fn open_rw(p: &Path, custom_flags: i32) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .custom_flags(custom_flags)
        .open(p)
        .expect("open on cutfs")
}

/// Reboots the rig: unmount, mount a fresh cutfs on the same backing directory.
fn reboot(rig: &mut Rig) {
    rig.unmount();
    rig.mount();
}

#[test]
fn cutfs_random_subset_keeps_whole_pages_of_either_state() {
    use std::os::unix::fs::FileExt;
    let Some(mut rig) = cutfs_rig("cutfs_random_subset_keeps_whole_pages_of_either_state") else {
        return;
    };
    let pages = 16usize;
    let page = cutfs::PAGE as usize;
    let f = rig.mnt.join("f");
    let file = open_rw(&f, 0);
    file.write_all_at(&vec![b'a'; pages * page], 0)
        .expect("write");
    file.sync_data().expect("fdatasync");
    // Unaligned, so most pages mix old and new bytes in the overlay.
    file.write_all_at(&vec![b'b'; pages * page - page], (page / 2) as u64)
        .expect("write");
    drop(file);
    rig.mounted().cut(Cut::RandomSubset(7));
    reboot(&mut rig);
    let got = std::fs::read(&f).expect("read after the reboot");
    assert_eq!(got.len(), pages * page);
    let (mut old, mut new) = (0, 0);
    for (i, p) in got.chunks(page).enumerate() {
        let mut want_new = vec![b'b'; page];
        if i == 0 {
            want_new[..page / 2].fill(b'a');
        }
        if i == pages - 1 {
            want_new[page / 2..].fill(b'a');
        }
        if p == vec![b'a'; page].as_slice() {
            old += 1;
        } else if p == want_new.as_slice() {
            new += 1;
        } else {
            panic!("page {i} is neither its synced nor its unsynced state");
        }
    }
    assert!(old > 0 && new > 0, "seed 7 keeps {new} of {pages} pages");
}

#[test]
fn cutfs_o_dsync_writes_are_synced_at_once() {
    use std::os::unix::fs::FileExt;
    let Some(mut rig) = cutfs_rig("cutfs_o_dsync_writes_are_synced_at_once") else {
        return;
    };
    let f = rig.mnt.join("f");
    let plain = open_rw(&f, 0);
    plain.write_all_at(b"unsynced", 100).expect("write");
    let dsync = open_rw(&f, libc::O_DSYNC);
    dsync.write_all_at(b"synced", 0).expect("write O_DSYNC");
    drop((plain, dsync));
    rig.mounted().cut(Cut::DropAll);
    reboot(&mut rig);
    // The O_DSYNC write's data and the size it needs; not the other handle's write.
    assert_eq!(std::fs::read(&f).expect("read"), b"synced");
    // An fsync through an O_DSYNC handle still syncs the whole file.
    let plain = open_rw(&f, 0);
    plain.write_all_at(b"later", 100).expect("write");
    let dsync = open_rw(&f, libc::O_DSYNC);
    dsync.write_all_at(b"SYNCED", 0).expect("write O_DSYNC");
    dsync.sync_data().expect("fdatasync");
    drop((plain, dsync));
    rig.mounted().cut(Cut::DropAll);
    reboot(&mut rig);
    let got = std::fs::read(&f).expect("read");
    assert_eq!((&got[..6], &got[100..]), (&b"SYNCED"[..], &b"later"[..]));
}

#[test]
fn cutfs_in_fsync_cut_fails_that_fsync_and_freezes_the_mount() {
    use std::os::unix::fs::FileExt;
    let Some(mut rig) = cutfs_rig("cutfs_in_fsync_cut_fails_that_fsync_and_freezes_the_mount")
    else {
        return;
    };
    let page = cutfs::PAGE as usize;
    let (f, g) = (rig.mnt.join("f"), rig.mnt.join("g"));
    let file = open_rw(&f, 0);
    file.write_all_at(&vec![b'a'; 8 * page], 0).expect("write");
    std::fs::write(&g, b"other file, never synced").expect("write g");
    rig.mounted().cut(Cut::InNextFsync(3));
    assert!(rig.mounted().cut_at().is_none(), "armed, not cut yet");
    let err = file.sync_data().expect_err("the fsync that cuts fails");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(rig.mounted().cut_at().is_some());
    assert!(file.write_all_at(b"x", 0).is_err(), "frozen");
    drop(file);
    reboot(&mut rig);
    // The file's size persisted or not, and some of its pages.
    let got = std::fs::read(&f).expect("read f");
    assert!(
        got.len() == 8 * page || got.is_empty(),
        "{} bytes",
        got.len()
    );
    assert!(got.iter().all(|&b| b == b'a' || b == 0));
    assert_eq!(std::fs::read(&g).expect("read g"), b"", "g's data is lost");
}

#[test]
fn cutfs_size_changes_follow_the_sync_model() {
    let Some(mut rig) = cutfs_rig("cutfs_size_changes_follow_the_sync_model") else {
        return;
    };
    let (f, g) = (rig.mnt.join("f"), rig.mnt.join("g"));
    std::fs::write(&f, vec![b'a'; 10_000]).expect("write f");
    open_rw(&f, 0).sync_all().expect("fsync f");
    std::fs::write(&g, vec![b'b'; 3000]).expect("write g");
    open_rw(&g, 0).sync_all().expect("fsync g");
    // f shrinks and grows back (the gap must read as zeros), unsynced; g shrinks, synced.
    let file = open_rw(&f, 0);
    file.set_len(100).expect("ftruncate f");
    file.set_len(5000).expect("ftruncate f");
    let now = std::fs::read(&f).expect("read f");
    assert_eq!(now.len(), 5000);
    assert!(now[..100].iter().all(|&b| b == b'a') && now[100..].iter().all(|&b| b == 0));
    drop(file);
    let gf = open_rw(&g, 0);
    gf.set_len(10).expect("ftruncate g");
    gf.sync_all().expect("fsync g");
    drop(gf);
    // h: fallocate extends (synced) and punches a hole (unsynced).
    let h = rig.mnt.join("h");
    let hf = open_rw(&h, 0);
    std::fs::write(&h, vec![b'c'; 8192]).expect("write h");
    use std::os::fd::AsRawFd;
    let fd = hf.as_raw_fd();
    // Safety: an open descriptor.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, 12_288) }, 0, "fallocate");
    hf.sync_all().expect("fsync h");
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(unsafe { libc::fallocate(fd, punch, 100, 5000) }, 0, "punch");
    let now = std::fs::read(&h).expect("read h");
    assert!(now[100..5100].iter().all(|&b| b == 0) && now[5100..8192].iter().all(|&b| b == b'c'));
    drop(hf);
    rig.mounted().cut(Cut::DropAll);
    reboot(&mut rig);
    assert_eq!(std::fs::read(&f).expect("read f"), vec![b'a'; 10_000]);
    assert_eq!(std::fs::read(&g).expect("read g"), vec![b'b'; 10]);
    let mut want = vec![b'c'; 8192];
    want.resize(12_288, 0);
    assert_eq!(std::fs::read(&h).expect("read h"), want);
}

/// cutfs itself: a renamed file can still be opened, stat'ed, written and synced by its new
/// name (memkeep renames spare log segments into place and writes them at once).
#[test]
fn cutfs_files_stay_usable_after_a_rename() {
    let Some(mut rig) = cutfs_rig("cutfs_files_stay_usable_after_a_rename") else {
        return;
    };
    let (a, b) = (rig.mnt.join("a"), rig.mnt.join("b"));
    std::fs::write(&a, b"before").expect("write a");
    std::fs::rename(&a, &b).expect("rename a to b");
    let file = open_rw(&b, 0);
    use std::os::unix::fs::FileExt;
    file.write_all_at(b"after!", 0).expect("write b");
    file.sync_data().expect("fdatasync b");
    file.set_len(6).expect("ftruncate b");
    assert_eq!(std::fs::metadata(&b).expect("stat b").len(), 6);
    drop(file);
    rig.mounted().cut(Cut::DropAll);
    reboot(&mut rig);
    assert_eq!(std::fs::read(&b).expect("read b"), b"after!");
}

/// A shared mapping, unmapped on drop (before the mount goes, even when a check fails).
struct Map(*mut libc::c_void, usize);

impl Map {
    fn bytes(&mut self) -> &mut [u8] {
        // Safety: the mapping is `self.1` bytes long and lives as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.0 as *mut u8, self.1) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // Safety: a mapping made by mmap, unmapped once.
        unsafe { libc::munmap(self.0, self.1) };
    }
}

#[test]
fn cutfs_shared_writable_maps_write_back_and_sync_through_msync() {
    let Some(mut rig) = cutfs_rig("cutfs_shared_writable_maps_write_back_and_sync_through_msync")
    else {
        return;
    };
    use std::os::fd::AsRawFd;
    let len = 4 * cutfs::PAGE as usize;
    let f = rig.mnt.join("f");
    let file = open_rw(&f, 0);
    file.set_len(len as u64).expect("ftruncate");
    // Safety: a shared mapping of `len` bytes of a file that long.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap on cutfs");
    let mut map = Map(ptr, len);
    map.bytes().fill(b'a');
    assert_eq!(unsafe { libc::msync(ptr, len, libc::MS_SYNC) }, 0, "msync");
    map.bytes().fill(b'b');
    // Written back as by the kernel's flusher (syncfs sends FUSE no fsync; the write requests
    // may arrive after it returns), never synced.
    let before = rig.mounted().stats();
    let deadline = Instant::now() + Duration::from_secs(5);
    while rig.mounted().stats().writes == before.writes && Instant::now() < deadline {
        assert_eq!(unsafe { libc::syncfs(file.as_raw_fd()) }, 0, "syncfs");
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = rig.mounted().stats();
    assert!(
        after.writes > before.writes,
        "the dirty pages reached cutfs"
    );
    assert_eq!(after.fsyncs, before.fsyncs, "syncfs is no fsync on FUSE");
    drop(map);
    drop(file);
    assert_eq!(std::fs::read(&f).expect("read"), vec![b'b'; len]);
    rig.mounted().cut(Cut::DropAll);
    reboot(&mut rig);
    assert_eq!(std::fs::read(&f).expect("read"), vec![b'a'; len]);
}
