//! Values not in memory are read by reader threads, never by an event loop (`server/cold.rs`):
//! every protocol's reads answer them right and in request order, whether the pages were really
//! evicted (the file's page cache dropped between runs) or the server is told to treat every
//! large value as cold (`MEMKEEP_TEST_ALL_COLD=1`, which sends each one through the readers).
//! The readers are each worker's own io_uring (`server/uring.rs`) where the kernel allows one,
//! and the reader threads otherwise or with `MEMKEEP_COLD_URING=0`: the pipelines run on both.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIG: usize = 20_000;

/// A value that says which key and version it is, `BIG` bytes long.
fn value(key: &str, version: u32) -> Vec<u8> {
    let tag = format!("{key}:{version}:");
    tag.bytes().cycle().take(BIG).collect()
}

fn start(args: &[&str], env: &[(&str, &str)], data_dir: Option<&Path>) -> Server {
    Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            args: args.iter().map(|s| s.to_string()).collect(),
            resp: true,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            data_dir: data_dir.map(Path::to_path_buf),
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
        c.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Mc {
            r: BufReader::new(c.try_clone().expect("clone")),
            w: c,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).expect("send");
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
        assert_eq!(&v[n..], b"\r\n", "value not followed by CRLF");
        v.truncate(n);
        v
    }

    fn set_cmd(key: &str, v: &[u8]) -> Vec<u8> {
        let mut out = format!("set {key} 7 0 {}\r\n", v.len()).into_bytes();
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
        out
    }

    /// Reads a `get`'s reply: (key, value) pairs up to END.
    fn values(&mut self) -> Vec<(String, Vec<u8>)> {
        let mut got = Vec::new();
        loop {
            let l = self.line();
            if l == "END" {
                return got;
            }
            let parts: Vec<&str> = l.split(' ').collect();
            assert!(
                parts.len() >= 4 && parts[0] == "VALUE",
                "unexpected get reply line {l:?}"
            );
            assert_eq!(parts[2], "7", "flags of {}", parts[1]);
            let n: usize = parts[3].parse().expect("length");
            let key = parts[1].to_string();
            got.push((key, self.bytes(n)));
        }
    }
}

fn stat(s: &Server, name: &str) -> Option<u64> {
    let mut mc = Mc::open(s);
    mc.send(b"stats\r\n");
    let mut found = None;
    loop {
        let l = mc.line();
        if l == "END" {
            return found;
        }
        if let Some(v) = l.strip_prefix(&format!("STAT {name} ")) {
            found = v.parse().ok();
        }
    }
}

/// A binary-protocol GET of `key`; returns the value (None on a miss).
fn bin_get(c: &mut TcpStream, key: &str) -> Option<Vec<u8>> {
    let mut req = vec![0x80, 0x00];
    req.extend_from_slice(&(key.len() as u16).to_be_bytes());
    req.extend_from_slice(&[0, 0, 0, 0]);
    req.extend_from_slice(&(key.len() as u32).to_be_bytes());
    req.extend_from_slice(&[0; 12]);
    req.extend_from_slice(key.as_bytes());
    c.write_all(&req).expect("send binary get");
    let mut head = [0u8; 24];
    c.read_exact(&mut head).expect("binary header");
    assert_eq!(head[0], 0x81, "response magic");
    let status = u16::from_be_bytes([head[6], head[7]]);
    let extras = head[4] as usize;
    let key_len = u16::from_be_bytes([head[2], head[3]]) as usize;
    let body = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
    let mut rest = vec![0u8; body];
    c.read_exact(&mut rest).expect("binary body");
    match status {
        0 => Some(rest[extras + key_len..].to_vec()),
        1 => None,
        other => panic!("binary get of {key}: status {other:#x}"),
    }
}

/// Writes back and drops `file`'s pages from the page cache (pages nobody maps).
fn evict(file: &Path) {
    let f = std::fs::File::open(file).expect("open data file");
    f.sync_all().expect("fsync data file");
    // SAFETY: a valid descriptor; advice only.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise(DONTNEED) failed");
}

/// How many of `file`'s pages are in the page cache, and of how many (mincore on a map).
fn resident_pages(file: &Path) -> (usize, usize) {
    let f = std::fs::File::open(file).expect("open data file");
    let len = f.metadata().expect("metadata").len() as usize;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    // SAFETY: a fresh read-only shared map of a file we opened, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED, "mmap data file");
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: the map covers `len` bytes; `vec` has one entry per page.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr().cast()) };
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(addr, len) };
    assert_eq!(rc, 0, "mincore");
    (vec.iter().filter(|&&b| b & 1 != 0).count(), pages)
}

#[test]
fn values_evicted_from_memory_are_served_on_every_protocol() {
    // On a disk file system (the page cache of a tmpfs cannot be dropped).
    let dir = tempfile::Builder::new()
        .prefix("memkeep-cold-")
        .tempdir_in("/var/tmp")
        .expect("temp dir in /var/tmp");
    let mut s = start(&[], &[], Some(dir.path()));
    let keys: Vec<String> = (0..200).map(|i| format!("cold:{i}")).collect();
    let mut mc = Mc::open(&s);
    for k in &keys {
        mc.send(&Mc::set_cmd(k, &value(k, 1)));
        assert_eq!(mc.line(), "STORED");
    }
    drop(mc);
    // A graceful stop commits everything to data.mdb; the next run maps it afresh.
    s.stop();
    let data = dir.path().join("data.mdb");
    evict(&data);
    let (resident, pages) = resident_pages(&data);
    assert!(
        resident * 4 < pages,
        "the test needs the data file out of the page cache: {resident} of {pages} pages stayed"
    );
    s.relaunch();

    let mut mc = Mc::open(&s);
    // One multi-get over many cold values, with misses and repeats among them.
    let mut line = String::from("get");
    let mut want = Vec::new();
    for k in &keys[..60] {
        line.push(' ');
        line.push_str(k);
        want.push(k.clone());
        if want.len() % 10 == 0 {
            line.push_str(" missing:key ");
            line.push_str(&keys[0]);
            want.push(keys[0].clone());
        }
    }
    mc.send(format!("{line}\r\n").as_bytes());
    let got = mc.values();
    let multi_hits = got.len() as u64;
    assert_eq!(
        got.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        want,
        "multi-get answered other keys or another order"
    );
    for (k, v) in &got {
        assert!(*v == value(k, 1), "wrong value for {k}");
    }
    // Meta gets, pipelined with a no-op.
    let mut batch = Vec::new();
    for k in &keys[60..80] {
        batch.extend_from_slice(format!("mg {k} v f\r\n").as_bytes());
    }
    batch.extend_from_slice(b"mn\r\n");
    mc.send(&batch);
    for k in &keys[60..80] {
        assert_eq!(mc.line(), format!("VA {BIG} f7"), "mg {k}");
        assert!(mc.bytes(BIG) == value(k, 1), "mg value of {k}");
    }
    assert_eq!(mc.line(), "MN");
    drop(mc);
    // The binary protocol.
    let mut bin = s.connect();
    bin.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    for k in &keys[80..100] {
        assert!(
            bin_get(&mut bin, k) == Some(value(k, 1)),
            "binary get of {k}"
        );
    }
    // RESP: GET and MGET (its reply array spans values read in several rounds).
    let mut r = Resp::connect(s.resp_addr().expect("resp port"));
    for k in &keys[100..120] {
        assert_eq!(
            r.call(&[b"GET", k.as_bytes()]),
            Reply::Bulk(Some(value(k, 1))),
            "GET {k}"
        );
    }
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(keys[120..200].iter().map(|k| k.as_bytes()));
    args.push(b"missing:key");
    let mut want: Vec<Reply> = keys[120..200]
        .iter()
        .map(|k| Reply::Bulk(Some(value(k, 1))))
        .collect();
    want.push(Reply::Bulk(None));
    assert_eq!(r.call(&args), Reply::Array(Some(want)), "MGET");

    let waits = stat(&s, "cold_reads").expect("stats cold_reads");
    assert!(
        waits > 0,
        "no read waited for a reader thread, so this test did not reach the path it tests"
    );
    if io_uring_allowed() {
        assert!(
            stat(&s, "cold_reads_direct").expect("cold_reads_direct") > 0,
            "no cold value was read bypassing the page cache (ext4 under /var/tmp takes O_DIRECT)"
        );
    }
    assert_eq!(stat(&s, "cold_read_errors"), Some(0));
    // Every value of the multi-get above counted once, however many rounds it took.
    assert_eq!(stat(&s, "get_hits"), Some(multi_hits + 20 + 20 + 20 + 80));
}

/// Whether the file system under the server's data dir takes `O_DIRECT` opens (tmpfs does not).
fn direct_allowed(s: &Server) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(s.data_dir().join("data.mdb"))
        .is_ok()
}

/// Whether this kernel lets a process set up an io_uring (`server/uring.rs` falls back to the
/// reader threads where it does not).
fn io_uring_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|v| v.trim() == "0")
        .unwrap_or(false)
}

#[test]
fn pipelines_through_the_workers_rings_keep_request_order_and_see_their_own_writes() {
    let s = pipelines(&[("MEMKEEP_TEST_ALL_COLD", "1")]);
    if io_uring_allowed() {
        assert!(
            stat(&s, "cold_reads_ring").expect("cold_reads_ring") > 0,
            "the workers' rings read none of the cold values"
        );
        // The data dir is on a disk file system (ext4 under `target/` here): first reads of a
        // record bypass the page cache, and the values above, read again and again, were
        // also read through it; both kinds were checked byte for byte.
        if direct_allowed(&s) {
            assert!(
                stat(&s, "cold_reads_direct").expect("cold_reads_direct") > 0,
                "no cold read bypassed the page cache"
            );
        }
    }
}

#[test]
fn pipelines_through_the_reader_threads_keep_request_order_and_see_their_own_writes() {
    let s = pipelines(&[("MEMKEEP_TEST_ALL_COLD", "1"), ("MEMKEEP_COLD_URING", "0")]);
    assert_eq!(
        stat(&s, "cold_reads_ring"),
        Some(0),
        "with the rings off, every cold read goes to the reader threads"
    );
}

/// Pipelines of reads and writes on both protocols with every large value cold, each reply
/// checked in order; returns the server for the caller's checks of how the reads were done.
fn pipelines(env: &[(&str, &str)]) -> Server {
    let mut s = start(&[], env, None);
    let mut mc = Mc::open(&s);
    let keys: Vec<String> = (0..8).map(|i| format!("p:{i}")).collect();
    for k in &keys {
        mc.send(&Mc::set_cmd(k, &value(k, 0)));
        assert_eq!(mc.line(), "STORED");
    }
    // Restarted, the values are read from LMDB's map (fresh writes are answered from the
    // overlay on the heap, which is never cold).
    drop(mc);
    s.restart();
    let mut mc = Mc::open(&s);
    // In one write: read, overwrite, read again, delete, read, meta-read; each reply in order
    // and each read seeing the writes before it.
    let mut versions = vec![0u32; keys.len()];
    for round in 1..=20u32 {
        let a = (round as usize * 3) % keys.len();
        let b = (round as usize * 5 + 1) % keys.len();
        let mut batch = Vec::new();
        batch.extend_from_slice(format!("get {} {}\r\n", keys[a], keys[b]).as_bytes());
        batch.extend_from_slice(&Mc::set_cmd(&keys[a], &value(&keys[a], round)));
        batch.extend_from_slice(format!("get {}\r\n", keys[a]).as_bytes());
        batch.extend_from_slice(format!("delete {}\r\n", keys[b]).as_bytes());
        batch.extend_from_slice(format!("get {} {}\r\n", keys[b], keys[a]).as_bytes());
        batch.extend_from_slice(format!("mg {} v\r\n", keys[a]).as_bytes());
        batch.extend_from_slice(&Mc::set_cmd(&keys[b], &value(&keys[b], round)));
        mc.send(&batch);

        assert_ne!(a, b);
        let before = mc.values();
        let want = vec![
            (keys[a].clone(), value(&keys[a], versions[a])),
            (keys[b].clone(), value(&keys[b], versions[b])),
        ];
        assert!(before == want, "round {round}: first get");
        versions[a] = round;
        assert_eq!(mc.line(), "STORED", "round {round}: set");
        assert!(
            mc.values() == vec![(keys[a].clone(), value(&keys[a], round))],
            "round {round}: get after set"
        );
        assert_eq!(mc.line(), "DELETED", "round {round}: delete");
        assert!(
            mc.values() == vec![(keys[a].clone(), value(&keys[a], round))],
            "round {round}: get after delete"
        );
        assert_eq!(mc.line(), format!("VA {BIG}"), "round {round}: mg");
        assert!(mc.bytes(BIG) == value(&keys[a], round), "round {round}: mg");
        assert_eq!(mc.line(), "STORED", "round {round}: set of b");
        versions[b] = round;
    }
    // RESP: the same shape.
    let mut r = Resp::connect(s.resp_addr().expect("resp port"));
    for round in 21..=30u32 {
        let a = round as usize % keys.len();
        let b = (round as usize + 3) % keys.len();
        let va = value(&keys[a], round);
        let mut batch = Vec::new();
        batch.extend(Resp::encode(&[
            b"MGET",
            keys[a].as_bytes(),
            keys[b].as_bytes(),
        ]));
        batch.extend(Resp::encode(&[b"SET", keys[a].as_bytes(), &va]));
        batch.extend(Resp::encode(&[b"GET", keys[a].as_bytes()]));
        batch.extend(Resp::encode(&[b"STRLEN", keys[b].as_bytes()]));
        r.send_raw(&batch);
        assert_eq!(
            r.read(),
            Reply::Array(Some(vec![
                Reply::Bulk(Some(value(&keys[a], versions[a]))),
                Reply::Bulk(Some(value(&keys[b], versions[b]))),
            ])),
            "round {round}: MGET"
        );
        assert_eq!(r.read(), Reply::Simple("OK".into()), "round {round}: SET");
        assert_eq!(r.read(), Reply::Bulk(Some(va)), "round {round}: GET");
        assert_eq!(r.read(), Reply::Int(BIG as i64), "round {round}: STRLEN");
        versions[a] = round;
    }
    assert!(stat(&s, "cold_reads").expect("cold_reads") > 0);
    assert_eq!(stat(&s, "cold_read_errors"), Some(0));
    s
}

#[test]
fn without_reader_threads_event_loops_read_every_value_themselves() {
    let mut s = start(
        &["--io-threads", "0"],
        &[("MEMKEEP_TEST_ALL_COLD", "1")],
        None,
    );
    let mut mc = Mc::open(&s);
    mc.send(&Mc::set_cmd("k", &value("k", 1)));
    assert_eq!(mc.line(), "STORED");
    drop(mc);
    s.restart();
    let mut mc = Mc::open(&s);
    mc.send(b"get k k\r\n");
    assert!(
        mc.values() == vec![("k".into(), value("k", 1)), ("k".into(), value("k", 1))],
        "get k k"
    );
    assert_eq!(stat(&s, "cold_reads"), None, "no reader pool, no figure");
    mc.send(b"stats settings\r\n");
    let mut io_threads = None;
    loop {
        let l = mc.line();
        if l == "END" {
            break;
        }
        if let Some(v) = l.strip_prefix("STAT io_threads ") {
            io_threads = Some(v.to_string());
        }
    }
    assert_eq!(io_threads.as_deref(), Some("0"));
}
