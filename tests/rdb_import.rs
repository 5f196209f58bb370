//! `memkeep import --rdb FILE` against RDB files a real redis-server 7.0 writes: with `SAVE`
//! (every encoding Redis 7.0 writes: strings raw, integer and LZF-compressed, keys too; lists
//! as quicklists of listpack nodes, compressed nodes included; sets as intsets and hash
//! tables; sorted sets as listpacks and skiplists; hashes as listpacks and hash tables; TTLs;
//! a stream with a consumer group, a function library and a second database, which are skipped
//! and counted) and with `redis-cli --rdb` (the replication stream's file). Every key's type,
//! whole value and TTL must be the same in memkeep as in Redis. A 100,000-key mixed dataset
//! goes the same way (its rate is printed, not asserted). Truncated and damaged files are
//! refused with the byte offset and a non-zero exit, before anything is loaded.
//!
//! redis-server (and redis-cli) come from `$REDIS_SERVER_BIN` / `PATH`
//! (`scripts/install-test-deps.sh`). Without them the tests say so on stderr and skip, except
//! under CI (`CI` set), where they fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

fn missing(bin: &str) -> Option<String> {
    match Command::new(bin).arg("--version").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!("{bin} --version failed: {:?}", out.status)),
        Err(e) => Some(format!("{bin} not runnable: {e}")),
    }
}

/// Whether the test can run: redis-server (and redis-cli when `cli`) present; under CI their
/// absence fails the test.
fn have_redis(test: &str, cli: bool) -> bool {
    let server = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    let why = missing(&server).or_else(|| if cli { missing("redis-cli") } else { None });
    if let Some(why) = why {
        assert!(
            std::env::var_os("CI").is_none(),
            "redis-server and redis-cli are needed here: {why} (scripts/install-test-deps.sh)"
        );
        eprintln!("SKIPPED {test}: {why}");
        return false;
    }
    true
}

fn memkeep() -> Server {
    Server::start_with(
        BIN,
        Options {
            resp: true,
            ..Options::default()
        },
    )
}

fn ok(c: &mut Resp, cmd: &[&[u8]]) -> Reply {
    let r = c.call(cmd);
    assert!(
        !matches!(r, Reply::Error(_)),
        "{:?}: {r:?}",
        cmd.iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
    );
    r
}

fn words(s: &str) -> Vec<Vec<u8>> {
    s.split_whitespace()
        .map(|w| w.as_bytes().to_vec())
        .collect()
}

fn run(c: &mut Resp, s: &str) -> Reply {
    let w = words(s);
    let refs: Vec<&[u8]> = w.iter().map(Vec::as_slice).collect();
    ok(c, &refs)
}

/// Sends every command, then reads every reply (a pipeline), checking none is an error.
fn pipeline(c: &mut Resp, cmds: &[Vec<Vec<u8>>]) -> Vec<Reply> {
    let mut replies = Vec::with_capacity(cmds.len());
    for chunk in cmds.chunks(500) {
        for cmd in chunk {
            let refs: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
            c.send(&refs);
        }
        for cmd in chunk {
            let r = c.read();
            assert!(
                !matches!(r, Reply::Error(_)),
                "{:?}: {r:?}",
                String::from_utf8_lossy(&cmd[0])
            );
            replies.push(r);
        }
    }
    replies
}

fn bulk(r: Reply) -> Vec<u8> {
    match r {
        Reply::Bulk(Some(b)) => b,
        other => panic!("expected a bulk, got {other:?}"),
    }
}

fn bulks(r: Reply) -> Vec<Vec<u8>> {
    match r {
        Reply::Array(Some(items)) => items.into_iter().map(bulk).collect(),
        other => panic!("expected an array, got {other:?}"),
    }
}

/// A key as both servers can give it: type, contents (sets and hashes sorted), PTTL.
#[derive(Debug, Clone, PartialEq)]
struct Snap {
    ty: String,
    items: Vec<Vec<u8>>,
    pttl: i64,
}

/// Every given key's `Snap`, pipelined.
fn snapshot(c: &mut Resp, keys: &[Vec<u8>]) -> Vec<Snap> {
    let types: Vec<String> = pipeline(
        c,
        &keys
            .iter()
            .map(|k| vec![b"TYPE".to_vec(), k.clone()])
            .collect::<Vec<_>>(),
    )
    .into_iter()
    .map(|r| match r {
        Reply::Simple(t) => t,
        other => panic!("TYPE: {other:?}"),
    })
    .collect();
    let mut cmds = Vec::new();
    for (k, ty) in keys.iter().zip(&types) {
        let read: &[&[u8]] = match ty.as_str() {
            "string" => &[b"GET"],
            "list" => &[b"LRANGE", b"0", b"-1"],
            "set" => &[b"SMEMBERS"],
            "zset" => &[b"ZRANGE", b"0", b"-1", b"WITHSCORES"],
            "hash" => &[b"HGETALL"],
            "none" => &[b"EXISTS"],
            other => panic!("{}: type {other}", String::from_utf8_lossy(k)),
        };
        let mut cmd = vec![read[0].to_vec(), k.clone()];
        cmd.extend(read[1..].iter().map(|a| a.to_vec()));
        cmds.push(cmd);
        cmds.push(vec![b"PTTL".to_vec(), k.clone()]);
    }
    let mut replies = pipeline(c, &cmds).into_iter();
    let mut out = Vec::new();
    for ty in types {
        let (Some(value), Some(Reply::Int(pttl))) = (replies.next(), replies.next()) else {
            panic!("a reply missing");
        };
        let items = match ty.as_str() {
            "string" => vec![bulk(value)],
            "none" => Vec::new(),
            "set" => {
                let mut m = bulks(value);
                m.sort();
                m
            }
            "hash" => {
                let flat = bulks(value);
                let mut pairs: Vec<Vec<u8>> = flat
                    .chunks(2)
                    .map(|p| [p[0].as_slice(), b"=", p[1].as_slice()].concat())
                    .collect();
                pairs.sort();
                pairs
            }
            _ => bulks(value),
        };
        out.push(Snap { ty, items, pttl });
    }
    out
}

/// Every key of the current database.
fn all_keys(c: &mut Resp) -> Vec<Vec<u8>> {
    let mut keys = bulks(ok(c, &[b"KEYS", b"*"]));
    keys.sort();
    keys
}

/// memkeep holds exactly Redis's keys (less `absent`), each with the same type and value and
/// a TTL within 5 s of Redis's.
fn assert_same(r: &mut Resp, m: &mut Resp, absent: &[&[u8]]) {
    let mut want = all_keys(r);
    want.retain(|k| !absent.contains(&k.as_slice()));
    let got = all_keys(m);
    assert_eq!(got.len(), want.len(), "key count");
    assert!(got == want, "memkeep's keys differ from Redis's");
    let (rs, ms) = (snapshot(r, &want), snapshot(m, &want));
    for ((k, a), b) in want.iter().zip(rs).zip(ms) {
        let k = String::from_utf8_lossy(k);
        assert_eq!(b.ty, a.ty, "{k}: type");
        assert!(b.items == a.items, "{k}: value differs ({})", a.ty);
        assert!(
            (a.pttl == -1 && b.pttl == -1)
                || (a.pttl > 0 && b.pttl > 0 && (a.pttl - b.pttl).abs() < 5000),
            "{k}: PTTL {} in Redis, {} in memkeep",
            a.pttl,
            b.pttl
        );
    }
}

/// `memkeep import --rdb FILE` against `server`'s RESP port.
fn import(server: &Server, file: &Path, extra: &[&str]) -> Output {
    let port = server.resp_addr().expect("RESP port").port().to_string();
    Command::new(BIN)
        .args(["-l", "127.0.0.1", "--resp-port", &port, "import", "--rdb"])
        .arg(file)
        .args(extra)
        .output()
        .expect("run memkeep import")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn import_ok(server: &Server, file: &Path, extra: &[&str]) -> String {
    let out = import(server, file, extra);
    let err = stderr(&out);
    assert!(out.status.success(), "import failed: {err}");
    err
}

fn dump_file(redis: &Server) -> PathBuf {
    redis.data_dir().join("dump.rdb")
}

/// Fills Redis with every encoding it writes, in database 0, plus what is skipped: a stream
/// with a consumer group and a pending entry, a function library, keys in database 1.
fn fill(r: &mut Resp) {
    run(r, "FLUSHALL");
    // Inner quicklist nodes LZF-compressed in the file.
    run(r, "CONFIG SET list-compress-depth 1");
    run(r, "CONFIG SET rdbcompression yes");
    let mut cmds: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut add = |parts: Vec<Vec<u8>>| cmds.push(parts);
    let w = |s: &str| words(s);
    add(w("SET s:short hello"));
    add(w("SET s:i8 -7"));
    add(w("SET s:i16 3000"));
    add(w("SET s:i32 -2000000000"));
    add(w("SET s:i64 12345678901"));
    add(w("SET s:lead0 007"));
    add(vec![b"SET".to_vec(), b"s:empty".to_vec(), Vec::new()]);
    add(vec![
        b"SET".to_vec(),
        b"s:lzf".to_vec(),
        "abcabcabc-".repeat(50).into_bytes(),
        b"PX".to_vec(),
        b"500000".to_vec(),
    ]);
    add(vec![
        b"SET".to_vec(),
        b"s:binary".to_vec(),
        (0..=255u8).cycle().take(3000).collect(),
    ]);
    // A big value (LZF-compressed, well over LMDB's page size) and one that does not compress.
    add(vec![
        b"SET".to_vec(),
        b"s:big".to_vec(),
        "0123456789abcdef".repeat(128 * 1024).into_bytes(),
    ]);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<u8> = (0..300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    add(vec![b"SET".to_vec(), b"s:noise".to_vec(), noise]);
    // Keys Redis writes as integers, and a long one it compresses.
    add(w("SET 12345 int-key"));
    add(w("SET -77 negative-int-key"));
    add(vec![
        b"SET".to_vec(),
        format!("long-key-{}", "k".repeat(300)).into_bytes(),
        b"v".to_vec(),
    ]);
    add(vec![
        b"SET".to_vec(),
        b"MARKER".to_vec(),
        b"MARKER-VALUE-0123".to_vec(),
    ]);

    add(w("RPUSH l:small a 1 -5 300 70000 -9000000 5000000000"));
    add(vec![b"RPUSH".to_vec(), b"l:small".to_vec(), Vec::new()]);
    let mut big = w("RPUSH l:big");
    for i in 0..3000 {
        big.push(match i % 3 {
            0 => i.to_string().into_bytes(),
            1 => format!("element-{i}-{}", "x".repeat(i % 90)).into_bytes(),
            _ => vec![b'y'; 100 + i % 5000],
        });
    }
    add(big);
    add(w("EXPIRE l:big 3000"));

    add(w("SADD set:intset 3 -1 70000 5000000000"));
    add(w("SADD set:hash a b c 1"));
    let mut ints = w("SADD set:bigint");
    ints.extend((0..700).map(|i| (i * 7).to_string().into_bytes()));
    add(ints);

    add(w("ZADD z:listpack 1 a 2.5 b -inf c inf d 100 e 0.1 f"));
    let mut zbig = w("ZADD z:skiplist");
    for i in 0..400 {
        zbig.push(format!("{}", (i as f64) / 7.0 - 20.0).into_bytes());
        zbig.push(format!("member-{i}").into_bytes());
    }
    add(zbig);
    add(w("EXPIRE z:skiplist 1000"));

    add(w("HSET h:listpack f v n 12 neg -300"));
    add(vec![
        b"HSET".to_vec(),
        b"h:listpack".to_vec(),
        b"e".to_vec(),
        Vec::new(),
    ]);
    let mut hbig = w("HSET h:table");
    for i in 0..300 {
        hbig.push(format!("field{i}").into_bytes());
        hbig.push(format!("value {i} {}", "z".repeat(i % 70)).into_bytes());
    }
    add(hbig);
    add(vec![
        b"HSET".to_vec(),
        b"h:longvalue".to_vec(),
        b"f".to_vec(),
        "q".repeat(100).into_bytes(),
    ]);
    add(w("PEXPIRE h:longvalue 7200000"));

    // Skipped: a stream with a group, a consumer and a pending entry; a function library.
    add(w("XADD stream 1-1 f v"));
    add(w("XADD stream 2-1 g w"));
    add(w("XGROUP CREATE stream grp 0"));
    add(w("XREADGROUP GROUP grp alice COUNT 1 STREAMS stream >"));
    add(vec![
        b"FUNCTION".to_vec(),
        b"LOAD".to_vec(),
        b"#!lua name=mylib\nredis.register_function('one', function() return 1 end)".to_vec(),
    ]);
    pipeline(r, &cmds);
    // Database 1.
    run(r, "SELECT 1");
    run(r, "SET other:a 1");
    run(r, "RPUSH other:l x y");
    run(r, "SELECT 0");

    // The encodings the test means to cover.
    for (k, want) in [
        ("s:short", "embstr"),
        ("s:i16", "int"),
        ("s:lzf", "raw"),
        ("l:big", "quicklist"),
        ("set:intset", "intset"),
        ("set:hash", "hashtable"),
        ("set:bigint", "hashtable"),
        ("z:listpack", "listpack"),
        ("z:skiplist", "skiplist"),
        ("h:listpack", "listpack"),
        ("h:table", "hashtable"),
        ("h:longvalue", "hashtable"),
    ] {
        let got = bulk(ok(r, &[b"OBJECT", b"ENCODING", k.as_bytes()]));
        assert_eq!(got, want.as_bytes(), "{k}");
    }
}

/// A key saved alive that has expired by the time the file is imported: set with a short
/// TTL, saved, seen alive after the save, then waited out.
fn save_with_expired_key(r: &mut Resp) {
    for ttl in [2000, 10_000, 30_000] {
        let ttl_s = ttl.to_string();
        ok(r, &[b"SET", b"expired", b"soon", b"PX", ttl_s.as_bytes()]);
        run(r, "SAVE");
        if matches!(r.call(&[b"PTTL", b"expired"]), Reply::Int(n) if n > 0) {
            let deadline = Instant::now() + Duration::from_millis(ttl + 5000);
            while r.call(&[b"EXISTS", b"expired"]) != Reply::Int(0) {
                assert!(Instant::now() < deadline, "the key never expired in Redis");
                std::thread::sleep(Duration::from_millis(50));
            }
            return;
        }
    }
    panic!("SAVE never finished before a 30 s TTL ran out");
}

#[test]
fn rdb_files_of_redis_load_with_every_encoding() {
    if !have_redis("rdb_files_of_redis_load_with_every_encoding", true) {
        return;
    }
    let redis = Server::redis();
    let mut mk = memkeep();
    let mut r = Resp::connect(redis.resp_addr().expect("redis port"));
    let mut m = Resp::connect(mk.resp_addr().expect("memkeep port"));
    fill(&mut r);
    save_with_expired_key(&mut r);
    let file = dump_file(&redis);

    // A key memkeep already has is replaced.
    run(&mut m, "SET s:short old");
    run(&mut m, "RPUSH l:small old");
    let err = import_ok(&mk, &file, &[]);
    assert!(err.contains("RDB version 10, Redis 7.0.15"), "{err}");
    assert!(err.contains("1 keys already expired, skipped"), "{err}");
    assert!(err.contains("1 keys of type stream skipped"), "{err}");
    assert!(err.contains("2 keys of database 1 skipped"), "{err}");
    assert!(err.contains("1 function libraries skipped"), "{err}");
    assert_same(&mut r, &mut m, &[b"stream"]);
    assert!(matches!(m.call(&[b"PTTL", b"z:skiplist"]), Reply::Int(n) if n > 990_000));

    // --db 1 loads the other database instead.
    run(&mut m, "FLUSHALL");
    let err = import_ok(&mk, &file, &["--db", "1"]);
    assert!(err.contains("loaded 2 keys"), "{err}");
    run(&mut r, "SELECT 1");
    assert_same(&mut r, &mut m, &[]);
    run(&mut r, "SELECT 0");

    // The file redis-cli fetches over replication.
    let fetched = redis.data_dir().join("fetched.rdb");
    let port = redis.port().to_string();
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port, "--rdb"])
        .arg(&fetched)
        .output()
        .expect("run redis-cli --rdb");
    assert!(out.status.success(), "redis-cli --rdb: {}", stderr(&out));
    run(&mut m, "FLUSHALL");
    let err = import_ok(&mk, &fetched, &[]);
    assert!(err.contains("1 keys of type stream skipped"), "{err}");
    assert_same(&mut r, &mut m, &[b"stream"]);

    drop(m);
    mk.stop();
    mk.assert_check_clean();
}

#[test]
fn damaged_rdb_files_are_refused_before_anything_is_loaded() {
    if !have_redis(
        "damaged_rdb_files_are_refused_before_anything_is_loaded",
        false,
    ) {
        return;
    }
    let redis = Server::redis();
    let mk = memkeep();
    let mut r = Resp::connect(redis.resp_addr().expect("redis port"));
    let mut m = Resp::connect(mk.resp_addr().expect("memkeep port"));
    fill(&mut r);
    run(&mut r, "SAVE");
    let good = std::fs::read(dump_file(&redis)).expect("read dump.rdb");
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = dir.path().join("bad.rdb");

    let refused = |bytes: &[u8], m: &mut Resp| -> String {
        std::fs::write(&bad, bytes).expect("write the damaged file");
        let out = import(&mk, &bad, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(m.call(&[b"DBSIZE"]), Reply::Int(0), "loaded anyway: {err}");
        err
    };

    // Cut anywhere: inside the header, inside a value, before the end marker, in the checksum.
    let marker = good
        .windows(17)
        .position(|w| w == b"MARKER-VALUE-0123")
        .expect("the marker value is in the file");
    for cut in [4, marker + 5, good.len() - 9, good.len() - 3] {
        let err = refused(&good[..cut], &mut m);
        assert!(
            err.contains(&format!("byte {cut}")) && err.contains("truncated"),
            "cut at {cut}: {err}"
        );
        if cut == marker + 5 {
            assert!(err.contains("key \"MARKER\""), "{err}");
        }
    }

    // A flipped byte inside a string value: only the checksum can tell.
    let mut flipped = good.clone();
    flipped[marker + 3] ^= 0x20;
    let err = refused(&flipped, &mut m);
    assert!(
        err.contains(&format!("byte {}: checksum mismatch", good.len() - 8)),
        "{err}"
    );
    // A flipped byte where a key's type is: the byte and what was expected are named.
    let key_at = good
        .windows(7)
        .position(|w| w == b"\x06MARKER")
        .expect("the marker key is in the file")
        - 1;
    assert_eq!(good[key_at], 0, "a string's type byte");
    let mut flipped = good.clone();
    flipped[key_at] = 0x42;
    let err = refused(&flipped, &mut m);
    assert!(
        err.contains(&format!(
            "byte {key_at}: expected an opcode or a value type, found byte 0x42"
        )),
        "{err}"
    );
    // Not an RDB file at all, and a version from the future.
    let err = refused(b"hello world, this is not redis", &mut m);
    assert!(err.contains("byte 0: not an RDB file"), "{err}");
    let mut newer = good.clone();
    newer[5..9].copy_from_slice(b"0012");
    let err = refused(&newer, &mut m);
    assert!(err.contains("RDB version 12"), "{err}");
}

#[test]
fn keys_memkeep_cannot_hold_are_listed_and_the_rest_load() {
    if !have_redis(
        "keys_memkeep_cannot_hold_are_listed_and_the_rest_load",
        false,
    ) {
        return;
    }
    let redis = Server::redis();
    let mk = memkeep();
    let mut r = Resp::connect(redis.resp_addr().expect("redis port"));
    let mut m = Resp::connect(mk.resp_addr().expect("memkeep port"));
    run(&mut r, "FLUSHALL");
    let long_key = vec![b'K'; 600];
    ok(&mut r, &[b"SET", &long_key, b"v"]);
    ok(&mut r, &[b"HSET", b"h:longfield", &[b'F'; 600], b"v"]);
    run(&mut r, "SET fine 1");
    run(&mut r, "SAVE");
    let out = import(&mk, &dump_file(&redis), &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("loaded 1 keys"), "{err}");
    assert!(err.contains("2 keys refused by the server"), "{err}");
    assert!(
        err.contains("key \"h:longfield\" (byte ")
            && err.contains("hash field longer than 495 bytes"),
        "{err}"
    );
    assert!(err.contains("keys are 1 to 511 bytes"), "{err}");
    assert_eq!(m.call(&[b"GET", b"fine"]), Reply::bulk("1"));
}

#[test]
fn a_server_with_a_password_is_authenticated_to_first() {
    if !have_redis("a_server_with_a_password_is_authenticated_to_first", false) {
        return;
    }
    let redis = Server::redis();
    let mk = Server::start_with(
        BIN,
        Options {
            resp: true,
            args: vec!["--requirepass".into(), "sekrit".into()],
            ..Options::default()
        },
    );
    let mut r = Resp::connect(redis.resp_addr().expect("redis port"));
    run(&mut r, "FLUSHALL");
    run(&mut r, "SET a 1");
    run(&mut r, "SAVE");
    let port = mk.resp_addr().expect("RESP port").port().to_string();
    let with = |pass: Option<&str>| {
        let mut c = Command::new(BIN);
        c.args(["-l", "127.0.0.1", "--resp-port", &port]);
        if let Some(p) = pass {
            c.args(["--requirepass", p]);
        }
        c.args(["import", "--rdb"]).arg(dump_file(&redis));
        c.output().expect("run memkeep import")
    };
    let out = with(None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("answered PING with `-NOAUTH"),
        "{}",
        stderr(&out)
    );
    let out = with(Some("wrong"));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("refused AUTH: -WRONGPASS"),
        "{}",
        stderr(&out)
    );
    let out = with(Some("sekrit"));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut m = Resp::connect(mk.resp_addr().expect("memkeep port"));
    ok(&mut m, &[b"AUTH", b"sekrit"]);
    assert_eq!(m.call(&[b"GET", b"a"]), Reply::bulk("1"));
}

#[test]
fn a_100k_key_mixed_dataset_round_trips() {
    if !have_redis("a_100k_key_mixed_dataset_round_trips", false) {
        return;
    }
    let redis = Server::redis();
    let mk = memkeep();
    let mut r = Resp::connect(redis.resp_addr().expect("redis port"));
    let mut m = Resp::connect(mk.resp_addr().expect("memkeep port"));
    run(&mut r, "FLUSHALL");
    let mut cmds = Vec::with_capacity(100_000);
    for i in 0..100_000u64 {
        let k = format!("k:{i}");
        let mut c = match i % 10 {
            0..=4 => vec![
                "SET".to_string(),
                k,
                format!("value-{i}-{}", "x".repeat((i % 50) as usize)),
            ],
            5 => {
                let mut c = vec!["RPUSH".to_string(), k];
                c.extend((0..=i % 7).map(|j| format!("e{j}")));
                c
            }
            6 => {
                let mut c = vec!["SADD".to_string(), k];
                c.extend((0..=i % 5).map(|j| (j * i).to_string()));
                c
            }
            7 => {
                let mut c = vec!["HSET".to_string(), k];
                c.extend((0..=i % 4).flat_map(|j| [format!("f{j}"), format!("v{j}")]));
                c
            }
            8 => {
                let mut c = vec!["ZADD".to_string(), k];
                c.extend((0..=i % 6).flat_map(|j| [(j as f64 * 1.5).to_string(), format!("m{j}")]));
                c
            }
            _ => vec![
                "SET".to_string(),
                k,
                i.to_string(),
                "EX".to_string(),
                (10_000 + i).to_string(),
            ],
        };
        cmds.push(c.drain(..).map(String::into_bytes).collect::<Vec<_>>());
    }
    pipeline(&mut r, &cmds);
    run(&mut r, "SAVE");
    let started = Instant::now();
    let err = import_ok(&mk, &dump_file(&redis), &[]);
    let secs = started.elapsed().as_secs_f64();
    assert!(err.contains("loaded 100000 keys"), "{err}");
    eprintln!(
        "100,000 keys imported in {secs:.2} s: {:.0} keys/s, check pass included\n{err}",
        100_000.0 / secs
    );
    assert_same(&mut r, &mut m, &[]);
}
