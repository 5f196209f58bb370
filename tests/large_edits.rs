//! Small edits of large values (memcached `append`/`prepend` and meta `ms` MA/MP, RESP APPEND,
//! SETRANGE, SETBIT, BITFIELD) are logged as patches (the bytes that changed, not the whole
//! value). These tests check what that must not change: every acknowledged edit is there
//! after kill -9 (replayed from the log, across checkpoints), readers see each edit at once,
//! and `memkeep check` finds the store clean; and what it is for: the log grows by about
//! what the edits wrote, not by the value's size each time.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::resp::{Reply, Resp};
use common::{Options, Rng, Server};

/// `n` random lowercase letters.
fn letters(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| b'a' + rng.below(26) as u8).collect()
}

/// The memcached text port, one request at a time.
struct Mc {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Mc {
    fn connect(server: &Server) -> Mc {
        let s = server.connect();
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        Mc {
            r: BufReader::new(s.try_clone().expect("clone")),
            w: s,
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("read a reply line");
        l
    }

    fn store(&mut self, verb: &str, key: &str, data: &[u8]) -> String {
        let mut req = format!("{verb} {key} 7 0 {}\r\n", data.len()).into_bytes();
        req.extend_from_slice(data);
        req.extend_from_slice(b"\r\n");
        self.w.write_all(&req).expect("send");
        self.line()
    }

    /// meta set in append (`MA`) or prepend (`MP`) mode.
    fn meta_append(&mut self, mode: &str, key: &str, data: &[u8]) -> String {
        let mut req = format!("ms {key} {} M{mode}\r\n", data.len()).into_bytes();
        req.extend_from_slice(data);
        req.extend_from_slice(b"\r\n");
        self.w.write_all(&req).expect("send");
        self.line()
    }

    fn get(&mut self, key: &str) -> Option<(u32, Vec<u8>)> {
        self.w
            .write_all(format!("get {key}\r\n").as_bytes())
            .expect("send");
        let head = self.line();
        if head == "END\r\n" {
            return None;
        }
        let parts: Vec<&str> = head.split_whitespace().collect();
        assert_eq!(parts.first(), Some(&"VALUE"), "{head:?}");
        let flags: u32 = parts[2].parse().expect("flags");
        let len: usize = parts[3].parse().expect("length");
        let mut v = vec![0; len + 2];
        self.r.read_exact(&mut v).expect("value");
        v.truncate(len);
        assert_eq!(self.line(), "END\r\n");
        Some((flags, v))
    }

    fn stat(&mut self, name: &str) -> u64 {
        self.w.write_all(b"stats\r\n").expect("send");
        let mut found = None;
        loop {
            let l = self.line();
            if l == "END\r\n" {
                break;
            }
            let parts: Vec<&str> = l.split_whitespace().collect();
            if parts.get(1) == Some(&name) {
                found = parts.get(2).and_then(|v| v.parse().ok());
            }
        }
        found.unwrap_or_else(|| panic!("no stat {name}"))
    }
}

fn start(sync: &str) -> Server {
    Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            args: vec!["--sync".into(), sync.into(), "-I".into(), "4m".into()],
            resp: true,
            ..Options::default()
        },
    )
}

fn resp(server: &Server) -> Resp {
    let r = Resp::connect(server.resp_addr().expect("resp port"));
    r.set_read_timeout(Duration::from_secs(30));
    r
}

/// One random edit of one of the model's keys, over either port; the model follows.
fn edit(rng: &mut Rng, mc: &mut Mc, rs: &mut Resp, model: &mut BTreeMap<String, Vec<u8>>) {
    let keys: Vec<String> = model.keys().cloned().collect();
    let key = keys[rng.below(keys.len() as u64) as usize].clone();
    edit_key(rng, mc, rs, model, &key);
    // Now and then read it back at once, by either protocol: a read between two edits of a
    // key in one LMDB transaction makes that version's item from the edits before it
    // (`overlay::Edited`), and the edits after it build on that.
    match rng.below(6) {
        0 => {
            let got = mc.get(&key).map(|(_, v)| v);
            assert!(
                got.as_deref() == model.get(&key).map(|v| &v[..]),
                "get {key} right after an edit: {} bytes, expected {}",
                got.map_or(0, |g| g.len()),
                model.get(&key).map_or(0, |v| v.len())
            );
        }
        1 => {
            let want = model.get(&key).cloned();
            assert_eq!(
                rs.call(&[b"GET", key.as_bytes()]),
                Reply::Bulk(want),
                "GET {key} right after an edit"
            );
        }
        _ => {}
    }
}

fn edit_key(
    rng: &mut Rng,
    mc: &mut Mc,
    rs: &mut Resp,
    model: &mut BTreeMap<String, Vec<u8>>,
    key: &str,
) {
    let key = key.to_string();
    let v = model.get_mut(&key).expect("modelled key");
    let n = 1 + rng.below(300) as usize;
    let data = letters(rng, n);
    match rng.below(10) {
        9 => {
            // The whole value replaced by one as long (the CRC the next patch carries must
            // not come from the edits before it).
            let fresh = letters(rng, v.len());
            assert_eq!(mc.store("set", &key, &fresh), "STORED\r\n");
            *v = fresh;
        }
        0 => {
            assert_eq!(mc.store("append", &key, &data), "STORED\r\n");
            v.extend_from_slice(&data);
        }
        1 => {
            assert_eq!(mc.store("prepend", &key, &data), "STORED\r\n");
            v.splice(0..0, data);
        }
        2 => {
            let mode = if rng.below(2) == 0 { "A" } else { "P" };
            assert_eq!(mc.meta_append(mode, &key, &data), "HD\r\n");
            if mode == "A" {
                v.extend_from_slice(&data);
            } else {
                v.splice(0..0, data);
            }
        }
        3 => {
            let r = rs.call(&[b"APPEND", key.as_bytes(), &data]);
            v.extend_from_slice(&data);
            assert_eq!(r, Reply::Int(v.len() as i64));
        }
        4 | 5 => {
            // Inside, or a little past the end (zero-filled).
            let at = rng.below(v.len() as u64 + 50) as usize;
            let r = rs.call(&[
                b"SETRANGE",
                key.as_bytes(),
                at.to_string().as_bytes(),
                &data,
            ]);
            if v.len() < at + data.len() {
                v.resize(at + data.len(), 0);
            }
            v[at..at + data.len()].copy_from_slice(&data);
            assert_eq!(r, Reply::Int(v.len() as i64));
        }
        6 | 7 => {
            let bit = rng.below(v.len() as u64 * 8 + 64);
            let on = rng.below(2) == 1;
            let r = rs.call(&[
                b"SETBIT",
                key.as_bytes(),
                bit.to_string().as_bytes(),
                if on { b"1" } else { b"0" },
            ]);
            let byte = (bit / 8) as usize;
            if v.len() <= byte {
                v.resize(byte + 1, 0);
            }
            let mask = 0x80u8 >> (bit % 8);
            let old = v[byte] & mask != 0;
            if on {
                v[byte] |= mask;
            } else {
                v[byte] &= !mask;
            }
            assert_eq!(r, Reply::Int(i64::from(old)));
        }
        _ => {
            // BITFIELD SET of a u8 at a byte boundary, and an INCRBY of a u16 further on.
            let at = rng.below(v.len() as u64) as usize;
            let b = rng.below(256) as u8;
            let at2 = rng.below(v.len() as u64 - 1) as usize;
            let r = rs.call(&[
                b"BITFIELD",
                key.as_bytes(),
                b"SET",
                b"u8",
                format!("#{at}").as_bytes(),
                b.to_string().as_bytes(),
                b"INCRBY",
                b"u16",
                (at2 * 8).to_string().as_bytes(),
                b"1",
            ]);
            let old = v[at];
            v[at] = b;
            let n = u16::from_be_bytes([v[at2], v[at2 + 1]]).wrapping_add(1);
            v[at2..at2 + 2].copy_from_slice(&n.to_be_bytes());
            assert_eq!(
                r,
                Reply::array(vec![Reply::Int(i64::from(old)), Reply::Int(i64::from(n))])
            );
        }
    }
}

/// Every key reads back as the model has it, over both ports.
fn check(server: &Server, model: &BTreeMap<String, Vec<u8>>, when: &str) {
    let mut mc = Mc::connect(server);
    let mut rs = resp(server);
    for (k, v) in model {
        let got = mc.get(k).map(|(_, v)| v);
        assert!(
            got.as_deref() == Some(&v[..]),
            "{when}: memcached get {k}: {} bytes, expected {}",
            got.map_or(0, |g| g.len()),
            v.len()
        );
        assert_eq!(
            rs.call(&[b"GET", k.as_bytes()]),
            Reply::Bulk(Some(v.clone())),
            "{when}: GET {k}"
        );
    }
}

#[test]
fn edits_of_large_values_survive_kill9_across_checkpoints() {
    for sync in ["never", "always"] {
        let mut server = start(sync);
        let mut rng = Rng(0x5eed_1234_abcd_0001 ^ sync.len() as u64);
        let mut model = BTreeMap::new();
        {
            let mut mc = Mc::connect(&server);
            // Large enough to be patched (4 KiB and more), one of them far larger than the
            // log's commit and checkpoint steps are counted in.
            for (i, len) in [5_000usize, 40_000, 300_000].into_iter().enumerate() {
                let k = format!("big{i}");
                let v = letters(&mut rng, len);
                assert_eq!(mc.store("set", &k, &v), "STORED\r\n");
                model.insert(k, v);
            }
        }
        // Rounds of edits, each ended by kill -9: what was acknowledged must be there after.
        // A checkpoint is asked for half-way through each round, so a recovery replays
        // patches both onto a checkpoint taken among them and onto one taken before.
        let rounds = if sync == "always" { 2 } else { 4 };
        let edits = if sync == "always" { 150 } else { 400 };
        for round in 0..rounds {
            {
                let mut mc = Mc::connect(&server);
                let mut rs = resp(&server);
                for i in 0..edits {
                    if i == edits / 2 {
                        mc.w.write_all(b"db_checkpoint\r\n").expect("send");
                        assert_eq!(mc.line(), "OK\r\n");
                    }
                    edit(&mut rng, &mut mc, &mut rs, &mut model);
                }
            }
            // Readers see every edit at once, through the overlay or LMDB.
            check(
                &server,
                &model,
                &format!("{sync} round {round} before kill -9"),
            );
            server.kill9();
            server.relaunch();
            check(
                &server,
                &model,
                &format!("{sync} round {round} after kill -9"),
            );
        }
        // The flags memcached's append keeps.
        let mut mc = Mc::connect(&server);
        assert_eq!(mc.get("big0").map(|(f, _)| f), Some(7));
        drop(mc);
        server.stop();
        server.assert_check_clean();
    }
}

#[test]
fn appends_to_a_large_value_log_what_they_append() {
    let mut server = start("never");
    let mut mc = Mc::connect(&server);
    let big = vec![b'x'; 1 << 20];
    assert_eq!(mc.store("set", "v", &big), "STORED\r\n");
    let before = mc.stat("log_bytes");
    let mut rs = resp(&server);
    for i in 0..200u32 {
        let data = format!("[{i:05}]");
        assert_eq!(mc.store("append", "v", data.as_bytes()), "STORED\r\n");
        assert_eq!(
            rs.call(&[
                b"SETBIT",
                b"bits",
                (8_000_000 + i * 9).to_string().as_bytes(),
                b"1"
            ]),
            Reply::Int(0)
        );
    }
    let logged = mc.stat("log_bytes") - before;
    // 400 writes; logged whole they would be over 200 MiB (a 1 MiB value and a 1 MB bitmap
    // each time). Each record is the key, two item headers and the bytes changed; the
    // bitmap's first SETBIT makes it, logged whole (1 MB).
    assert!(
        logged < 1_000_000 + 400 * 200,
        "{logged} bytes logged for 400 small edits"
    );
    let got = mc.get("v").expect("v").1;
    assert_eq!(got.len(), (1 << 20) + 200 * 7);
    assert!(got.ends_with(b"[00199]"));
    drop((mc, rs));
    server.kill9();
    server.relaunch();
    let mut mc = Mc::connect(&server);
    assert_eq!(mc.get("v").expect("v after kill -9").1, got);
    let mut rs = resp(&server);
    assert_eq!(
        rs.call(&[b"BITCOUNT", b"bits"]),
        Reply::Int(200),
        "every SETBIT after kill -9"
    );
}

/// Small edits (appends and prepends) of one large value, one after another, are made where
/// LMDB holds the value, and readers make the edited value only when they read it: the
/// server's peak memory stays near the size of the value. A copy of the whole value per edit,
/// kept until LMDB's next commit, made it grow by 70 MiB over 3,000 appends to a 1 MiB value.
#[test]
fn many_small_edits_of_a_large_value_keep_memory_near_its_size() {
    let mut server = start("never");
    let pid = server.pid().expect("a running server");
    let status = |field: &str| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        s.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("field")
    };
    let mut mc = Mc::connect(&server);
    let mut rs = resp(&server);
    let mut want = vec![b'x'; 1 << 20];
    assert_eq!(mc.store("set", "v", &want), "STORED\r\n");
    let hwm_before = status("VmHWM:");
    for i in 0..3_000u32 {
        let data = format!("<{i:06}>");
        if i % 3 == 0 {
            // A prepend shifts the value within the same pages.
            assert_eq!(mc.store("prepend", "v", data.as_bytes()), "STORED\r\n");
            want.splice(0..0, data.bytes());
        } else {
            let r = rs.call(&[b"APPEND", b"v", data.as_bytes()]);
            want.extend_from_slice(data.as_bytes());
            assert_eq!(r, Reply::Int(want.len() as i64));
        }
        if i % 500 == 499 {
            // A read now and then makes that version whole, once.
            assert_eq!(mc.get("v").map(|(_, v)| v).as_deref(), Some(&want[..]));
        }
    }
    let grown_mib = (status("VmHWM:").saturating_sub(hwm_before)) / 1024;
    assert!(
        grown_mib < 48,
        "peak memory grew by {grown_mib} MiB over 3,000 appends and prepends of 8 bytes to a 1 MiB value"
    );
    assert_eq!(rs.call(&[b"GET", b"v"]), Reply::Bulk(Some(want.clone())));
    drop((mc, rs));
    server.kill9();
    server.relaunch();
    let mut mc = Mc::connect(&server);
    assert_eq!(mc.get("v").map(|(_, v)| v).as_deref(), Some(&want[..]));
    drop(mc);
    server.stop();
    server.assert_check_clean();
}
