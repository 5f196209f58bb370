//! Value separation (`value_log_min`, `src/storage/vlog.rs`): string values of at least that
//! many bytes live only in the write-ahead log, with a pointer in LMDB. Every way of reading a
//! value sees the same bytes whichever way it is stored: through the overlay before LMDB has
//! the batch, through the pointer after a clean restart, inline again after a crash's replay,
//! cold through the reader threads, in a backup, and on a replica.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::resp::{Reply, Resp};
use common::{Options, Rng, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
/// Value sizes around the threshold (4 KiB) and well past it.
const SIZES: [usize; 8] = [10, 300, 4095, 4096, 4097, 20_000, 70_000, 300_000];

fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
    Server::start_with(
        BIN,
        Options {
            args: args.iter().map(|s| s.to_string()).collect(),
            resp: true,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Options::default()
        },
    )
}

struct Mc {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Mc {
    fn open(s: &Server) -> Mc {
        let c = s.connect();
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        Mc {
            r: BufReader::new(c.try_clone().expect("clone")),
            w: c,
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("reply line");
        assert!(l.ends_with("\r\n"), "truncated reply line {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n + 2];
        self.r.read_exact(&mut v).expect("value bytes");
        assert_eq!(&v[n..], b"\r\n");
        v.truncate(n);
        v
    }

    fn store(&mut self, verb: &str, key: &str, flags: u32, v: &[u8]) -> String {
        let mut req = format!("{verb} {key} {flags} 0 {}\r\n", v.len()).into_bytes();
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n");
        self.w.write_all(&req).expect("send");
        self.line()
    }

    /// `get key`: (flags, value), or None on a miss.
    fn get(&mut self, key: &str) -> Option<(u32, Vec<u8>)> {
        self.w
            .write_all(format!("get {key}\r\n").as_bytes())
            .expect("send");
        let l = self.line();
        if l == "END" {
            return None;
        }
        let parts: Vec<&str> = l.split(' ').collect();
        assert_eq!(parts[0], "VALUE", "{l}");
        let flags = parts[2].parse().expect("flags");
        let v = self.bytes(parts[3].parse().expect("length"));
        assert_eq!(self.line(), "END");
        Some((flags, v))
    }

    /// `mg key s v`: the size the meta protocol reports and the value.
    fn mg(&mut self, key: &str) -> Option<(usize, Vec<u8>)> {
        self.w
            .write_all(format!("mg {key} s v\r\n").as_bytes())
            .expect("send");
        let l = self.line();
        if l == "EN" {
            return None;
        }
        let parts: Vec<&str> = l.split(' ').collect();
        assert_eq!(parts[0], "VA", "{l}");
        let n: usize = parts[1].parse().expect("length");
        let s = parts
            .iter()
            .find_map(|p| p.strip_prefix('s'))
            .and_then(|s| s.parse().ok())
            .expect("s flag");
        Some((s, self.bytes(n)))
    }

    /// Asks for `n` checkpoints, one after the other, each seen to start (a new log segment).
    fn checkpoints(&mut self, dir: &std::path::Path, n: usize) {
        let newest = || {
            std::fs::read_dir(dir)
                .expect("data dir")
                .filter_map(|e| {
                    let name = e.ok()?.file_name().into_string().ok()?;
                    let hex = name.strip_prefix("wal-")?.strip_suffix(".log")?;
                    u64::from_str_radix(hex, 16).ok()
                })
                .max()
                .unwrap_or(0)
        };
        for _ in 0..n {
            let before = newest();
            self.w.write_all(b"db_checkpoint\r\n").expect("send");
            assert_eq!(self.line(), "OK");
            let deadline = Instant::now() + Duration::from_secs(10);
            while newest() == before {
                assert!(Instant::now() < deadline, "no checkpoint began");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    fn stat(&mut self, name: &str) -> Option<u64> {
        self.w.write_all(b"stats\r\n").expect("send");
        let mut found = None;
        loop {
            let l = self.line();
            if l == "END" {
                return found;
            }
            if let Some(v) = l.strip_prefix(&format!("STAT {name} ")) {
                found = v.parse().ok();
            }
        }
    }
}

/// A value that names its key and version, `n` bytes long.
fn value(key: &str, version: u64, n: usize) -> Vec<u8> {
    format!("{key}/{version};")
        .bytes()
        .cycle()
        .take(n)
        .collect()
}

/// One round of writes through both protocols: sets of every size, appends and prepends to
/// large values, SETRANGE inside them, overwrites with small values and deletes.
fn write_round(
    s: &Server,
    model: &mut BTreeMap<String, (u32, Vec<u8>)>,
    rng: &mut Rng,
    round: u64,
) {
    let mut mc = Mc::open(s);
    let mut r = Resp::connect(s.resp_addr().expect("resp"));
    for i in 0..48 {
        let key = format!("k{i}");
        let n = SIZES[rng.below(SIZES.len() as u64) as usize];
        let v = value(&key, round * 100 + i, n);
        if i % 2 == 0 {
            let flags = (round * 7 + i) as u32;
            assert_eq!(mc.store("set", &key, flags, &v), "STORED");
            model.insert(key, (flags, v));
        } else {
            assert_eq!(
                r.call(&[b"SET", key.as_bytes(), &v]),
                Reply::Simple("OK".into())
            );
            model.insert(key, (0, v));
        }
    }
    for i in (0..48).step_by(5) {
        let key = format!("k{i}");
        let Some((_, v)) = model.get_mut(&key) else {
            continue;
        };
        match i % 4 {
            0 => {
                assert_eq!(mc.store("append", &key, 0, b"-tail"), "STORED");
                v.extend_from_slice(b"-tail");
            }
            1 => {
                let n = r.call(&[b"APPEND", key.as_bytes(), b"+more"]);
                v.extend_from_slice(b"+more");
                assert_eq!(n, Reply::Int(v.len() as i64));
            }
            2 => {
                assert_eq!(mc.store("prepend", &key, 0, b"head-"), "STORED");
                v.splice(0..0, b"head-".iter().copied());
            }
            _ => {
                let at = v.len() / 2;
                let n = r.call(&[
                    b"SETRANGE",
                    key.as_bytes(),
                    at.to_string().as_bytes(),
                    b"XYZ",
                ]);
                let end = (at + 3).max(v.len());
                v.resize(end, 0);
                v[at..at + 3].copy_from_slice(b"XYZ");
                assert_eq!(n, Reply::Int(v.len() as i64));
            }
        }
    }
    for i in (3..48).step_by(11) {
        let key = format!("k{i}");
        assert_eq!(r.call(&[b"DEL", key.as_bytes()]), Reply::Int(1));
        model.remove(&key);
    }
    // A large value overwritten by a small one, and a small one by a large one.
    for (key, n) in [("k1", 50), ("k2", 90_000)] {
        let v = value(key, round * 1000, n);
        assert_eq!(mc.store("set", key, 3, &v), "STORED");
        model.insert(key.to_string(), (3, v));
    }
}

/// Every key reads back as the model has it, through memcached's get and mg and RESP's GET,
/// STRLEN and GETRANGE.
fn verify(s: &Server, model: &BTreeMap<String, (u32, Vec<u8>)>, when: &str) {
    let mut mc = Mc::open(s);
    let mut r = Resp::connect(s.resp_addr().expect("resp"));
    for i in 0..48 {
        let key = format!("k{i}");
        let want = model.get(&key);
        let got = mc.get(&key);
        assert_eq!(
            got.as_ref().map(|(f, v)| (*f, v.len())),
            want.map(|(f, v)| (*f, v.len())),
            "{key} {when}: flags and length"
        );
        assert!(
            got.as_ref().map(|g| &g.1) == want.map(|w| &w.1),
            "{key} {when}: bytes"
        );
        match want {
            None => {
                assert_eq!(mc.mg(&key), None, "{key} {when}");
                assert_eq!(r.call(&[b"GET", key.as_bytes()]), Reply::Bulk(None));
            }
            Some((_, v)) => {
                assert_eq!(mc.mg(&key), Some((v.len(), v.clone())), "{key} {when}: mg");
                assert_eq!(
                    r.call(&[b"GET", key.as_bytes()]),
                    Reply::Bulk(Some(v.clone())),
                    "{key} {when}: GET"
                );
                assert_eq!(
                    r.call(&[b"STRLEN", key.as_bytes()]),
                    Reply::Int(v.len() as i64)
                );
                let (a, b) = (v.len() / 3, v.len() / 3 + 100);
                let want_range = v[a.min(v.len())..(b + 1).min(v.len())].to_vec();
                assert_eq!(
                    r.call(&[
                        b"GETRANGE",
                        key.as_bytes(),
                        a.to_string().as_bytes(),
                        b.to_string().as_bytes()
                    ]),
                    Reply::Bulk(Some(want_range)),
                    "{key} {when}: GETRANGE"
                );
            }
        }
    }
}

/// How many strings `memkeep check` finds with their value in the log; asserts it finds no
/// problem.
fn checked_in_log(dir: &std::path::Path) -> u64 {
    let out = Command::new(BIN)
        .arg("check")
        .arg(dir)
        .output()
        .expect("memkeep check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "memkeep check: {stdout}");
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary: "))
        .unwrap_or_else(|| panic!("no summary in {stdout}"));
    summary
        .split(" of them with their value in the log")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {summary}"))
}

fn every_read_path(env: &[(&str, &str)]) -> (Server, BTreeMap<String, (u32, Vec<u8>)>) {
    let mut s = start(&["--value-log-min", "4k", "--sync", "always"], env);
    let mut model = BTreeMap::new();
    let mut rng = Rng(0x005e_ed0f_u64 ^ env.len() as u64);
    write_round(&s, &mut model, &mut rng, 1);
    verify(&s, &model, "as written");
    // A clean stop commits and checkpoints: the values are read through their pointers.
    s.restart();
    verify(&s, &model, "after a clean restart");
    write_round(&s, &mut model, &mut rng, 2);
    verify(&s, &model, "after a second round");
    // A crash: the checkpoint's pointers, and the log's batches since replayed inline.
    s.kill9();
    s.relaunch();
    verify(&s, &model, "after kill -9");
    write_round(&s, &mut model, &mut rng, 3);
    s.restart();
    verify(&s, &model, "after the last restart");
    s.stop();
    assert!(
        checked_in_log(s.data_dir()) > 0,
        "memkeep check found no value in the log"
    );
    s.relaunch();
    (s, model)
}

/// Outside `always` the log's appends are copies into a mapping of the segment, which skip the
/// separated values the writer has already written at their place (`wal::LogBuf::written`):
/// the log read back after a crash still holds every batch whole.
#[test]
fn values_in_the_log_written_through_its_mapping_survive_a_crash() {
    let mut s = start(&["--value-log-min", "4k", "--sync", "never"], &[]);
    let mut model = BTreeMap::new();
    let mut rng = Rng(0x0005_ca1e_u64);
    write_round(&s, &mut model, &mut rng, 1);
    // Two checkpoints (each after a write: one begins only when the log has something): the
    // log goes on in a spare segment, long enough to be mapped.
    let mut mc = Mc::open(&s);
    for _ in 0..2 {
        assert_eq!(mc.store("set", "tick", 0, b"t"), "STORED");
        mc.checkpoints(s.data_dir(), 1);
    }
    for round in 2..5 {
        write_round(&s, &mut model, &mut rng, round);
    }
    verify(&s, &model, "as written");
    // The batches since the last checkpoint are replayed from the log.
    s.kill9();
    s.relaunch();
    verify(&s, &model, "after kill -9");
    // Replay wrote those values inline; new ones go to the log again.
    write_round(&s, &mut model, &mut rng, 5);
    s.restart();
    verify(&s, &model, "after a clean restart");
    s.stop();
    assert!(
        checked_in_log(s.data_dir()) > 0,
        "memkeep check found no value in the log"
    );
}

#[test]
fn every_read_path_sees_the_values_that_live_in_the_log() {
    let (s, model) = every_read_path(&[]);
    verify(&s, &model, "after check");
}

#[test]
fn values_in_the_log_not_in_memory_are_read_by_the_reader_threads() {
    let (s, model) = every_read_path(&[("MEMKEEP_TEST_ALL_COLD", "1")]);
    verify(&s, &model, "after check");
    let reads = Mc::open(&s).stat("cold_reads").expect("cold_reads");
    assert!(reads > 0, "no value went through the reader threads");
}

#[test]
fn turning_value_log_min_off_keeps_the_values_already_in_the_log() {
    let mut s = start(&["--value-log-min", "1k"], &[]);
    let mut mc = Mc::open(&s);
    for i in 0..100 {
        assert_eq!(
            mc.store("set", &format!("v{i}"), 1, &value("v", i, 9000)),
            "STORED"
        );
        if i % 30 == 0 {
            // Values spread over several segments, each checkpointed.
            mc.checkpoints(s.data_dir(), 1);
        }
    }
    s.stop();
    let before = checked_in_log(s.data_dir());
    assert_eq!(before, 100);
    s.relaunch();
    let mut mc = Mc::open(&s);
    let segments = mc.stat("log_value_segments").expect("log_value_segments");
    let bytes = mc.stat("log_value_bytes").expect("log_value_bytes");
    assert!(segments >= 2, "values went into {segments} segments");
    assert!(
        bytes >= 100 * 9000,
        "{bytes} bytes kept for 900,000 bytes of values"
    );
    let info = Resp::connect(s.resp_addr().expect("resp")).cmd("INFO persistence");
    let Reply::Bulk(Some(info)) = info else {
        panic!("INFO: {info:?}")
    };
    let info = String::from_utf8_lossy(&info).into_owned();
    assert!(
        info.contains(&format!("memkeep_log_value_segments:{segments}\r\n")),
        "{info}"
    );
    drop(mc);
    s.stop();
    // Relaunched without the option (the harness's own flags only), and checkpointed many
    // times over: the segments holding the values stay.
    let dir = s.data_dir().to_path_buf();
    let plain = Server::start_with(
        BIN,
        Options {
            data_dir: Some(dir.clone()),
            ..Options::default()
        },
    );
    let mut mc = Mc::open(&plain);
    for round in 0..3 {
        for i in 0..100 {
            assert_eq!(
                mc.store("set", &format!("x{i}"), 0, &value("x", round, 9000)),
                "STORED"
            );
        }
        mc.checkpoints(&dir, 1);
    }
    let read_all = |mc: &mut Mc| {
        for i in 0..100 {
            assert_eq!(
                mc.get(&format!("v{i}")),
                Some((1, value("v", i, 9000))),
                "v{i}"
            );
        }
    };
    read_all(&mut mc);
    drop(mc);
    let mut plain = plain;
    plain.restart();
    read_all(&mut Mc::open(&plain));
    plain.stop();
    assert_eq!(checked_in_log(&dir), 100, "new values stay inline");
}

#[test]
fn a_backup_of_a_store_with_values_in_the_log_holds_them_inline() {
    let mut s = start(&["--value-log-min", "4k"], &[]);
    let mut model = BTreeMap::new();
    let mut rng = Rng(7);
    write_round(&s, &mut model, &mut rng, 1);
    // Into LMDB as pointers, then more writes the backup takes from the running server's log.
    s.restart();
    write_round(&s, &mut model, &mut rng, 2);
    let dest = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .arg("-H")
        .arg(s.data_dir())
        .arg("backup")
        .arg(dest.path())
        .output()
        .expect("run memkeep backup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The backup is one data.mdb: restored into a fresh directory, alone.
    let restored_dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        dest.path().join("data.mdb"),
        restored_dir.path().join("data.mdb"),
    )
    .expect("copy");
    let restored = Server::start_with(
        BIN,
        Options {
            resp: true,
            data_dir: Some(restored_dir.path().to_path_buf()),
            ..Options::default()
        },
    );
    verify(&restored, &model, "in the backup");
    let mut restored = restored;
    restored.stop();
    assert_eq!(checked_in_log(restored_dir.path()), 0);
}

fn info(s: &Server, field: &str) -> String {
    let mut r = Resp::connect(s.resp_addr().expect("resp"));
    let Reply::Bulk(Some(text)) = r.cmd("INFO replication") else {
        panic!("INFO");
    };
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(str::to_string))
        .unwrap_or_default()
}

fn converge(p: &Server, r: &Server) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let po = info(p, "master_repl_offset");
        if info(r, "master_link_status") == "up" && info(r, "slave_repl_offset") == po {
            return;
        }
        assert!(Instant::now() < deadline, "replica did not converge");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_replica_gets_the_values_whole_and_keeps_its_own_in_its_log() {
    let mut p = start(&["--value-log-min", "4k"], &[]);
    let mut model = BTreeMap::new();
    let mut rng = Rng(11);
    write_round(&p, &mut model, &mut rng, 1);
    // Pointers in the primary's LMDB when the full copy is taken.
    p.restart();
    let port = p.resp_addr().expect("resp").port().to_string();
    let mut r = start(
        &[
            "--value-log-min",
            "4k",
            "--replica-of",
            &format!("127.0.0.1:{port}"),
        ],
        &[],
    );
    converge(&p, &r);
    verify(&r, &model, "on the replica after its full copy");
    // Streamed writes go into the replica's own log.
    write_round(&p, &mut model, &mut rng, 2);
    converge(&p, &r);
    verify(&r, &model, "on the replica, streamed");
    r.restart();
    converge(&p, &r);
    verify(&r, &model, "on the replica after its restart");
    r.stop();
    assert!(
        checked_in_log(r.data_dir()) > 0,
        "the replica keeps values in its log"
    );
}

/// Lists the data directory's log segments (spares excluded).
fn segment_files(dir: &std::path::Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir)
        .expect("data dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let hex = name.strip_prefix("wal-")?.strip_suffix(".log")?;
            u64::from_str_radix(hex, 16).ok()
        })
        .collect();
    v.sort_unstable();
    v
}

/// Asks for checkpoints until `done` holds (the collector runs after each), for up to 30 s.
/// Each is preceded by a small write: a checkpoint begins only when the log has something.
fn checkpoint_until(
    mc: &mut Mc,
    dir: &std::path::Path,
    what: &str,
    done: impl Fn(&mut Mc) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(mc) {
        assert!(Instant::now() < deadline, "never: {what}");
        assert_eq!(mc.store("set", "tick", 0, b"t"), "STORED");
        mc.checkpoints(dir, 1);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stores `v` under `key` and notes it in `model`.
fn set_noted(mc: &mut Mc, model: &mut BTreeMap<String, Vec<u8>>, key: String, v: Vec<u8>) {
    assert_eq!(mc.store("set", &key, 0, &v), "STORED", "{key}");
    model.insert(key, v);
}

#[test]
fn collection_frees_the_segments_whose_values_died_and_moves_the_rest() {
    let mut s = start(&["--value-log-min", "1k", "--sync", "always"], &[]);
    let dir = s.data_dir().to_path_buf();
    let mut mc = Mc::open(&s);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // First 120 values, all overwritten below; then 100 values of which every fifth stays,
    // with a value read all along after each of those (20), so that however checkpoints
    // split them into segments, each segment is mostly dead: theirs are moved.
    for i in 0..120 {
        set_noted(&mut mc, &mut model, format!("a{i}"), value("a", i, 9000));
    }
    mc.checkpoints(&dir, 1);
    for i in 0..100 {
        set_noted(&mut mc, &mut model, format!("b{i}"), value("b", i, 9000));
        if i % 5 == 0 {
            let r = i / 5;
            set_noted(&mut mc, &mut model, format!("r{r}"), value("r", r, 5000));
        }
    }
    mc.checkpoints(&dir, 1);
    let first = segment_files(&dir);
    let old: Vec<u64> = first[..first.len() - 1].to_vec();
    assert!(!old.is_empty(), "segments {first:?}");
    let before = mc.stat("log_value_bytes").expect("log_value_bytes");
    assert!(before >= 220 * 9000, "{before} bytes kept for the values");

    // A reader of the r keys, through both protocols, while segments are moved and retired.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let addr = s.resp_addr().expect("resp");
        let mut rmc = Mc::open(&s);
        std::thread::spawn(move || {
            let mut r = Resp::connect(addr);
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for i in 0..20u64 {
                    let key = format!("r{i}");
                    let want = value("r", i, 5000);
                    assert_eq!(rmc.get(&key), Some((0, want.clone())), "{key}");
                    assert_eq!(
                        r.call(&[b"GET", key.as_bytes()]),
                        Reply::Bulk(Some(want)),
                        "{key}"
                    );
                    reads += 2;
                }
            }
            reads
        })
    };

    for i in 0..120 {
        set_noted(&mut mc, &mut model, format!("a{i}"), value("a2", i, 3000));
    }
    for i in (0..100).filter(|i| i % 5 != 0) {
        if i % 2 == 0 {
            set_noted(&mut mc, &mut model, format!("b{i}"), value("b2", i, 2000));
        } else {
            mc.w.write_all(format!("delete b{i}\r\n").as_bytes())
                .expect("send");
            assert_eq!(mc.line(), "DELETED");
            model.remove(&format!("b{i}"));
        }
    }
    checkpoint_until(&mut mc, &dir, "live values moved", |mc| {
        mc.stat("log_value_moved_bytes").unwrap_or(0) >= 20 * 9000
    });
    checkpoint_until(&mut mc, &dir, "every old segment retired", |mc| {
        let now = segment_files(&dir);
        old.iter().all(|n| !now.contains(n))
            && mc.stat("log_value_segments_retired").unwrap_or(0) >= old.len() as u64
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().expect("the reader saw every value");
    assert!(reads > 0);

    // Every value the model holds is at least 1k, so in the log: the last scan counted them.
    let live = mc
        .stat("log_value_live_bytes")
        .expect("log_value_live_bytes");
    let want: usize = model.values().map(Vec::len).sum();
    assert_eq!(live, want as u64, "live bytes at the last scan");
    let after = mc.stat("log_value_bytes").expect("log_value_bytes");
    assert!(
        after >= live,
        "{live} live bytes in {after} bytes of segments"
    );
    let read_all = |s: &Server, when: &str| {
        let mut mc = Mc::open(s);
        let mut r = Resp::connect(s.resp_addr().expect("resp"));
        for p in ["a", "b", "r"] {
            for i in 0..120 {
                let key = format!("{p}{i}");
                let want = model.get(&key);
                assert_eq!(mc.get(&key).map(|(_, v)| v), want.cloned(), "{key} {when}");
                assert_eq!(
                    r.call(&[b"GET", key.as_bytes()]),
                    Reply::Bulk(want.cloned()),
                    "{key} {when}"
                );
            }
        }
    };
    read_all(&s, "after collection");
    drop(mc);
    s.restart();
    read_all(&s, "after a clean restart");
    s.kill9();
    s.relaunch();
    read_all(&s, "after kill -9");
    s.stop();
    checked_in_log(&dir);
}

#[test]
fn a_trickle_of_values_leaves_a_bounded_number_of_segments() {
    // One value per checkpoint: each lands in a segment of its own and stays live, so without
    // merging every one of them would be kept (a day of one write a second: 86,400 files).
    let mut s = start(&["--value-log-min", "1k", "--sync", "never"], &[]);
    let dir = s.data_dir().to_path_buf();
    let mut mc = Mc::open(&s);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    const VALUES: u64 = 60;
    for i in 0..VALUES {
        set_noted(&mut mc, &mut model, format!("t{i}"), value("t", i, 3000));
        mc.checkpoints(&dir, 1);
    }
    // The collector keeps at most 16 small segments, plus the one being written and those it
    // moves values into meanwhile.
    checkpoint_until(&mut mc, &dir, "small segments merged", |mc| {
        mc.stat("log_value_segments").unwrap_or(u64::MAX) <= 20
    });
    assert!(
        mc.stat("log_value_moved_bytes").unwrap_or(0) >= 3000 * (VALUES - 20),
        "values were moved"
    );
    let files = segment_files(&dir).len();
    assert!(files <= 24, "{files} segment files for {VALUES} values");
    let read_all = |s: &Server, when: &str| {
        let mut mc = Mc::open(s);
        let mut r = Resp::connect(s.resp_addr().expect("resp"));
        for (key, want) in &model {
            assert_eq!(mc.get(key), Some((0, want.clone())), "{key} {when}");
            assert_eq!(
                r.call(&[b"GET", key.as_bytes()]),
                Reply::Bulk(Some(want.clone())),
                "{key} {when}"
            );
        }
    };
    read_all(&s, "after merging");
    drop(mc);
    s.kill9();
    s.relaunch();
    read_all(&s, "after kill -9");
    s.stop();
    checked_in_log(&dir);
}
