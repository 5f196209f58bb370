//! Cache mode (`--max-disk`): past the cap memkeep evicts instead of refusing writes: expired
//! items first, then the least recently used (a read spares an item; nothing read goes by age);
//! collections go whole; `stats` `evictions`/`evicted_unfetched` and INFO `evicted_keys` count
//! it; the cap holds across restarts and a crash (a store reopened over a smaller cap shrinks
//! to it); without the flag nothing is ever evicted.
//!
//! Values are 10 KB: each lives in overflow pages of its own, so evicting one frees its pages
//! at once and the tests can reason in items (small values share leaf pages, which LMDB frees
//! only once they have emptied).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::resp::{Reply, Resp};
use common::{Options, Server};

const VALUE: usize = 10_000;
const CAP: u64 = 4 << 20;

fn value(key: &str) -> Vec<u8> {
    let mut v = key.as_bytes().to_vec();
    v.resize(VALUE, b'.');
    v
}

struct Mc {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Mc {
    fn connect(addr: SocketAddr) -> Mc {
        let s = Server::connect_to(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Mc {
            r: BufReader::new(s.try_clone().expect("clone")),
            w: s,
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("reply");
        l
    }

    fn set(&mut self, key: &str, exptime: u64) -> String {
        let v = value(key);
        let mut req = format!("set {key} 0 {exptime} {}\r\n", v.len()).into_bytes();
        req.extend_from_slice(&v);
        req.extend_from_slice(b"\r\n");
        self.w.write_all(&req).expect("send");
        self.line()
    }

    /// Sets every key and asserts each was stored.
    fn set_all(&mut self, keys: &[String], exptime: u64) {
        for k in keys {
            assert_eq!(self.set(k, exptime), "STORED\r\n", "set {k}");
        }
    }

    /// The value under `key` (checked to be the one set), or None on a miss.
    fn get(&mut self, key: &str) -> Option<()> {
        self.w
            .write_all(format!("get {key}\r\n").as_bytes())
            .expect("send");
        let head = self.line();
        if head == "END\r\n" {
            return None;
        }
        assert_eq!(head, format!("VALUE {key} 0 {VALUE}\r\n"));
        let mut data = vec![0; VALUE + 2];
        self.r.read_exact(&mut data).expect("value");
        assert_eq!(&data[..VALUE], &value(key)[..], "value of {key}");
        assert_eq!(self.line(), "END\r\n");
        Some(())
    }

    fn present(&mut self, keys: &[String]) -> usize {
        keys.iter().filter(|k| self.get(k).is_some()).count()
    }

    fn stats(&mut self, sub: &str) -> HashMap<String, String> {
        let cmd = if sub.is_empty() {
            "stats\r\n".to_string()
        } else {
            format!("stats {sub}\r\n")
        };
        self.w.write_all(cmd.as_bytes()).expect("send");
        let mut m = HashMap::new();
        loop {
            let l = self.line();
            if l == "END\r\n" || l.is_empty() {
                return m;
            }
            let mut parts = l.trim_end().splitn(3, ' ');
            let (_, k, v) = (parts.next(), parts.next(), parts.next());
            m.insert(
                k.expect("name").to_string(),
                v.unwrap_or_default().to_string(),
            );
        }
    }

    fn stat(&mut self, name: &str) -> u64 {
        let s = self.stats("");
        s.get(name)
            .unwrap_or_else(|| panic!("no stat {name} in {s:?}"))
            .parse()
            .expect("number")
    }

    /// Waits until the writer has brought the data under the cap (eviction runs in the
    /// writer's own passes, after the batches that went over); returns the stats then.
    fn settled(&mut self, cap: u64) -> HashMap<String, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.stats("");
            let used: u64 = s["disk_used"].parse().expect("disk_used");
            if used <= cap {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the data never came under the cap: {s:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn n(s: &HashMap<String, String>, name: &str) -> u64 {
    s.get(name)
        .unwrap_or_else(|| panic!("no stat {name} in {s:?}"))
        .parse()
        .expect("number")
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:05}")).collect()
}

fn start(data: &Path, extra: &[&str], clock: Option<u64>) -> Server {
    Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            args: extra.iter().map(|s| s.to_string()).collect(),
            resp: true,
            data_dir: Some(data.to_path_buf()),
            debug_clock_ms: clock,
            ..Options::default()
        },
    )
}

fn cap_args(cap: u64) -> Vec<String> {
    vec!["--max-disk".into(), cap.to_string()]
}

fn start_capped(data: &Path, cap: u64) -> Server {
    let a = cap_args(cap);
    start(data, &[&a[0], &a[1]], None)
}

#[test]
fn sets_never_fail_while_the_data_far_exceeds_the_cap_and_it_stays_under() {
    let data = tempfile::tempdir().expect("tempdir");
    let s = start_capped(data.path(), CAP);
    let mut c = Mc::connect(s.addr());
    // 20 MB of values into a 4 MiB cap.
    let all = keys("k", 2000);
    c.set_all(&all, 0);
    let st = c.settled(CAP);
    let evictions = n(&st, "evictions");
    let items = n(&st, "curr_items");
    // Every item written is either still there or counted as evicted; none was read.
    assert_eq!(items + evictions, 2000, "{st:?}");
    assert!(evictions > 1000, "{st:?}");
    assert_eq!(n(&st, "evicted_unfetched"), evictions, "{st:?}");
    assert_eq!(c.present(&all) as u64, items);
    // The latest writes are the youngest items: all still there.
    assert_eq!(c.present(&all[1950..]), 50, "{st:?}");
    assert_eq!(n(&st, "limit_maxbytes"), CAP);
    assert_eq!(n(&st, "max_disk"), CAP);
    // LMDB's own count agrees, once the writer has committed its transaction (a quarter of a
    // second at most; `stats lmdb` reads the last commit).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lmdb = c.stats("lmdb");
        if n(&lmdb, "data_bytes") <= CAP {
            assert_eq!(n(&lmdb, "max_disk"), CAP);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "LMDB never under the cap: {lmdb:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let settings = c.stats("settings");
    assert_eq!(settings["evictions"], "on");
    assert_eq!(n(&settings, "maxbytes"), CAP);
    // The same count over RESP.
    let mut r = Resp::connect(s.resp_addr().expect("resp"));
    let info = match r.cmd("INFO") {
        Reply::Bulk(Some(b)) | Reply::Verbatim(b) => String::from_utf8(b).expect("utf8"),
        other => panic!("INFO: {other:?}"),
    };
    assert!(
        info.contains(&format!("\r\nevicted_keys:{evictions}\r\n")),
        "{info}"
    );
    assert!(
        info.contains("\r\nmaxmemory_policy:allkeys-lru\r\n"),
        "{info}"
    );
    assert!(info.contains(&format!("\r\nmaxmemory:{CAP}\r\n")), "{info}");
    // stats reset zeroes the counters.
    c.w.write_all(b"stats reset\r\n").expect("send");
    assert_eq!(c.line(), "RESET\r\n");
    assert_eq!(c.stat("evictions"), 0);
    assert_eq!(c.stat("evicted_unfetched"), 0);
}

#[test]
fn expired_items_go_first_then_unread_ones_and_read_ones_stay() {
    // Every GET is a use, so what is present is checked only where that cannot change what
    // the test goes on to show; until then the counts say it.
    let data = tempfile::tempdir().expect("tempdir");
    let a = cap_args(CAP);
    let mut s = start(data.path(), &[&a[0], &a[1]], Some(common::now_ms()));
    let mut c = Mc::connect(s.addr());
    // 4 MiB holds about 330 of these items (3 pages each). 100 expire, 100 are never read,
    // 100 are read.
    let (expiring, cold, hot) = (keys("e", 100), keys("c", 100), keys("h", 100));
    c.set_all(&expiring, 100);
    c.set_all(&cold, 0);
    c.set_all(&hot, 0);
    assert_eq!(c.present(&hot), 100);
    s.advance_clock(200).expect("clock");
    // 100 more fit only in the expired ones' room: nothing live goes.
    let first = keys("n", 100);
    c.set_all(&first, 0);
    let st = c.settled(CAP);
    assert_eq!(
        n(&st, "evictions"),
        0,
        "a live item went before expired ones: {st:?}"
    );
    // (Expired items are removed only as far as the room is needed, or by the sweeper.)
    assert!((300..400).contains(&n(&st, "curr_items")), "{st:?}");
    // 80 more: about 50 live items must go, unread ones (the cold) before the read ones,
    // which in turn are older than the new ones.
    let second = keys("m", 80);
    c.set_all(&second, 0);
    let st = c.settled(CAP);
    let evictions = n(&st, "evictions");
    assert!(evictions > 30 && evictions < 100, "{st:?}");
    assert_eq!(n(&st, "evicted_unfetched"), evictions, "{st:?}");
    assert_eq!(c.present(&expiring), 0);
    assert_eq!(c.present(&hot), 100, "a read item was evicted: {st:?}");
    assert_eq!(c.present(&second), 80, "a newer item was evicted: {st:?}");
    assert_eq!(c.present(&first), 100, "a newer item was evicted: {st:?}");
    assert_eq!(c.present(&cold) as u64, 100 - evictions, "{st:?}");
    // Everything live has just been read (time is counted in writes, so all at one time).
    // After one more write, the hot ones are read again. The next 100 writes must evict
    // items read at that earlier time, and count them as fetched, not the hot ones.
    c.set_all(&keys("sep", 1), 0);
    assert_eq!(c.present(&hot), 100);
    let third = keys("t", 100);
    c.set_all(&third, 0);
    let st = c.settled(CAP);
    let more = n(&st, "evictions") - evictions;
    assert!((70..=130).contains(&more), "{st:?}");
    assert_eq!(
        n(&st, "evicted_unfetched"),
        evictions,
        "a read item counted unfetched: {st:?}"
    );
    assert_eq!(c.present(&hot), 100, "{st:?}");
    assert_eq!(c.present(&third), 100, "{st:?}");
    let rest = c.present(&cold) + c.present(&first) + c.present(&second);
    assert_eq!(rest as u64, 100 - evictions + 180 - more, "{st:?}");
}

fn info(r: &mut Resp) -> String {
    match r.cmd("INFO") {
        Reply::Bulk(Some(b)) | Reply::Verbatim(b) => String::from_utf8(b).expect("utf8"),
        other => panic!("INFO: {other:?}"),
    }
}

fn info_field(info: &str, name: &str) -> u64 {
    info.split("\r\n")
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {info}"))
        .parse()
        .expect("number")
}

/// Waits until the data is under `cap` (the INFO side of `Mc::settled`).
fn resp_settled(r: &mut Resp, cap: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let i = info(r);
        if info_field(&i, "memkeep_disk_used") <= cap {
            return i;
        }
        assert!(Instant::now() < deadline, "never under the cap: {i}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn resp_sets_never_fail_and_collections_are_evicted_whole() {
    let data = tempfile::tempdir().expect("tempdir");
    let s = start_capped(data.path(), CAP);
    let mut r = Resp::connect(s.resp_addr().expect("resp"));
    let field = vec![b'f'; 1000];
    // Two collections of ~300 KB each: one read all along, one never read.
    for i in 0..300 {
        let f = format!("field{i}");
        assert_eq!(
            r.call(&[b"HSET", b"cold-hash", f.as_bytes(), &field]),
            Reply::Int(1)
        );
        assert_eq!(
            r.call(&[b"HSET", b"hot-hash", f.as_bytes(), &field]),
            Reply::Int(1)
        );
        assert_eq!(r.call(&[b"RPUSH", b"cold-list", &field]), Reply::Int(i + 1));
    }
    // A client watching the cold list sees its eviction as a change (as Redis does).
    let mut watcher = Resp::connect(s.resp_addr().expect("resp"));
    assert_eq!(watcher.cmd("WATCH cold-list"), Reply::Simple("OK".into()));
    let strings = keys("s", 1200);
    for (i, k) in strings.iter().enumerate() {
        let v = value(k);
        assert_eq!(
            r.call(&[b"SET", k.as_bytes(), &v]),
            Reply::Simple("OK".into()),
            "SET {k}"
        );
        if i % 50 == 0 {
            assert_eq!(r.cmd("HLEN hot-hash"), Reply::Int(300));
        }
    }
    let i = resp_settled(&mut r, CAP);
    let evicted = info_field(&i, "evicted_keys");
    // Gone whole, never in part: no element of them is left to read.
    for (cmd, key) in [("HLEN", "cold-hash"), ("LLEN", "cold-list")] {
        assert_eq!(r.cmd(&format!("{cmd} {key}")), Reply::Int(0), "{key}");
        assert_eq!(r.cmd(&format!("EXISTS {key}")), Reply::Int(0), "{key}");
    }
    assert_eq!(r.cmd("HGET cold-hash field7"), Reply::Bulk(None));
    assert_eq!(r.cmd("LINDEX cold-list 0"), Reply::Bulk(None));
    assert_eq!(r.cmd("HLEN hot-hash"), Reply::Int(300), "{i}");
    let left = strings
        .iter()
        .filter(|k| r.call(&[b"EXISTS", k.as_bytes()]) == Reply::Int(1))
        .count() as u64;
    // Each key evicted once: the strings that went and the two cold collections.
    assert_eq!(evicted, 1200 - left + 2, "{i}");
    assert_eq!(
        r.call(&[b"EXISTS", strings[1199].as_bytes()]),
        Reply::Int(1)
    );
    // The same count on the memcached port.
    let mut c = Mc::connect(s.addr());
    assert_eq!(c.stat("evictions"), evicted);
    assert_eq!(watcher.cmd("MULTI"), Reply::Simple("OK".into()));
    assert_eq!(watcher.cmd("SET w 1"), Reply::Simple("QUEUED".into()));
    assert_eq!(
        watcher.cmd("EXEC"),
        Reply::Array(None),
        "WATCH missed the eviction"
    );
}

/// The data's pages as the writer last counted them.
fn disk_used(c: &mut Mc) -> u64 {
    c.stat("disk_used")
}

#[test]
fn the_cap_holds_across_restarts_a_crash_and_a_smaller_cap() {
    let data = tempfile::tempdir().expect("tempdir");
    // About 330 items fit under the cap.
    let all = keys("k", 1200);
    let (before, after) = all.split_at(1000);
    {
        let s = start_capped(data.path(), CAP);
        let mut c = Mc::connect(s.addr());
        c.set_all(before, 0);
        c.settled(CAP);
    } // dropped: killed with SIGKILL, so the restart recovers from the log
    let left = {
        let mut s = start_capped(data.path(), CAP);
        let mut c = Mc::connect(s.addr());
        let st = c.settled(CAP);
        let left = n(&st, "curr_items");
        assert!(left > 100 && left < 1000, "{st:?}");
        assert_eq!(c.present(before) as u64, left);
        // More writes after the crash: all stored, still under the cap.
        c.set_all(after, 0);
        let st = c.settled(CAP);
        assert_eq!(c.present(after), 200, "{st:?}");
        s.stop();
        n(&st, "curr_items")
    };
    {
        // A clean restart with the same cap: already under it, nothing to evict.
        let s = start_capped(data.path(), CAP);
        let mut c = Mc::connect(s.addr());
        assert!(disk_used(&mut c) <= CAP);
        assert_eq!(c.stat("curr_items"), left);
        assert_eq!(c.stat("evictions"), 0);
    }
    let half = {
        // A smaller cap: the store shrinks to it at startup, by evicting the oldest.
        let mut s = start_capped(data.path(), CAP / 2);
        let mut c = Mc::connect(s.addr());
        let st = c.settled(CAP / 2);
        let now = n(&st, "curr_items");
        assert!(now < left, "{st:?}");
        assert_eq!(n(&st, "evictions"), left - now, "{st:?}");
        assert_eq!(c.present(&all[1150..]), 50, "the newest went: {st:?}");
        s.stop();
        now
    };
    {
        // Without the flag: a store again, nothing is evicted, all of it is still there.
        let s = start(data.path(), &[], None);
        let mut c = Mc::connect(s.addr());
        let st = c.stats("");
        assert_eq!(n(&st, "curr_items"), half);
        assert_eq!(n(&st, "evictions"), 0);
        assert!(!st.contains_key("disk_used"), "{st:?}");
        assert_eq!(c.stats("settings")["evictions"], "off");
        assert_eq!(c.present(&all) as u64, half);
    }
}

#[test]
fn without_the_cap_a_full_store_refuses_and_never_evicts() {
    let data = tempfile::tempdir().expect("tempdir");
    let s = start(data.path(), &["--map-size", "2m", "-I", "64k"], None);
    let mut c = Mc::connect(s.addr());
    let mut stored = Vec::new();
    let mut full = false;
    for k in keys("k", 400) {
        match c.set(&k, 0).as_str() {
            "STORED\r\n" => stored.push(k),
            "SERVER_ERROR out of memory storing object\r\n" => {
                full = true;
                break;
            }
            other => panic!("unexpected reply {other:?}"),
        }
    }
    assert!(full && stored.len() > 50, "{} stored", stored.len());
    let st = c.stats("");
    assert_eq!(n(&st, "evictions"), 0);
    assert_eq!(n(&st, "curr_items"), stored.len() as u64);
    assert_eq!(c.present(&stored), stored.len());
    assert_eq!(c.stats("settings")["evictions"], "off");
}

#[test]
fn expired_keys_counts_what_the_sweeper_removed() {
    // No cap: the sweeper's removals alone.
    let data = tempfile::tempdir().expect("tempdir");
    let mut s = start(data.path(), &[], Some(common::now_ms()));
    let mut r = Resp::connect(s.resp_addr().expect("resp"));
    assert_eq!(info_field(&info(&mut r), "expired_keys"), 0);
    for i in 0..5 {
        let k = format!("short{i}");
        assert_eq!(
            r.call(&[b"SET", k.as_bytes(), b"v", b"PX", b"100"]),
            Reply::Simple("OK".into())
        );
    }
    assert_eq!(r.call(&[b"SET", b"long", b"v"]), Reply::Simple("OK".into()));
    s.advance_clock(200).expect("clock");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = info_field(&info(&mut r), "expired_keys");
        if n == 5 {
            break;
        }
        assert!(n < 5, "expired_keys {n}: more than expired");
        assert!(Instant::now() < deadline, "the sweeper never counted: {n}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(r.call(&[b"DBSIZE"]), Reply::Int(1));
}
