//! DUMP and RESTORE against a real redis-server 7.0: values of every type, in every encoding
//! Redis 7.0 dumps (strings raw, integer and LZF-compressed; lists as quicklists of listpack
//! nodes, LZF-compressed nodes included; sets as intsets and hash tables; sorted sets as
//! listpacks and skiplists; hashes as listpacks and hash tables), are DUMPed by redis-server and
//! RESTOREd into memkeep, then DUMPed by memkeep and RESTOREd into redis-server, and their
//! contents compared each way; the TTL goes along. memkeep's DUMP of a short string is byte
//! for byte Redis's. The store passes `memkeep check` afterwards.
//!
//! redis-server comes from `$REDIS_SERVER_BIN` or `PATH` (`scripts/install-test-deps.sh`).
//! Without it the test says so on stderr and skips, except under CI (`CI` set), where it fails.

mod common;

use common::resp::{Reply, Resp};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

fn redis_missing() -> Option<String> {
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    match std::process::Command::new(&bin).arg("--version").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!("{bin} --version failed: {:?}", out.status)),
        Err(e) => Some(format!("{bin} not runnable: {e}")),
    }
}

fn args(s: &str) -> Vec<&[u8]> {
    s.split_whitespace().map(str::as_bytes).collect()
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

/// A key's contents in a form both servers give alike: sets and hashes sorted.
fn contents(c: &mut Resp, key: &str) -> (String, Vec<Vec<u8>>) {
    let k = key.as_bytes();
    let ty = match c.call(&[b"TYPE", k]) {
        Reply::Simple(t) => t,
        other => panic!("TYPE {key}: {other:?}"),
    };
    let items = match ty.as_str() {
        "string" => vec![bulk(ok(c, &[b"GET", k]))],
        "list" => bulks(ok(c, &[b"LRANGE", k, b"0", b"-1"])),
        "set" => {
            let mut m = bulks(ok(c, &[b"SMEMBERS", k]));
            m.sort();
            m
        }
        "zset" => bulks(ok(c, &[b"ZRANGE", k, b"0", b"-1", b"WITHSCORES"])),
        "hash" => {
            let flat = bulks(ok(c, &[b"HGETALL", k]));
            let mut pairs: Vec<Vec<u8>> = flat
                .chunks(2)
                .map(|p| [p[0].as_slice(), b"=", p[1].as_slice()].concat())
                .collect();
            pairs.sort();
            pairs
        }
        other => panic!("{key}: unexpected type {other}"),
    };
    (ty, items)
}

fn pttl(c: &mut Resp, key: &str) -> i64 {
    match c.call(&[b"PTTL", key.as_bytes()]) {
        Reply::Int(n) => n,
        other => panic!("PTTL {key}: {other:?}"),
    }
}

/// Fills redis-server with one key per encoding; their names.
fn fill(r: &mut Resp) -> Vec<String> {
    // Inner quicklist nodes LZF-compressed in the DUMP.
    ok(r, &args("CONFIG SET list-compress-depth 1"));
    let mut keys = Vec::new();
    let mut put = |r: &mut Resp, key: &str, cmds: Vec<Vec<Vec<u8>>>| {
        for c in cmds {
            let refs: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
            ok(r, &refs);
        }
        keys.push(key.to_string());
    };
    let v = |parts: &[&[u8]]| parts.iter().map(|p| p.to_vec()).collect::<Vec<Vec<u8>>>();
    put(r, "s:short", vec![v(&[b"SET", b"s:short", b"hello"])]);
    put(r, "s:empty", vec![v(&[b"SET", b"s:empty", b""])]);
    for (k, n) in [
        ("s:i8", "-7"),
        ("s:i16", "3000"),
        ("s:i32", "-2000000000"),
        ("s:i64", "12345678901"),
        ("s:lead0", "007"),
    ] {
        put(r, k, vec![v(&[b"SET", k.as_bytes(), n.as_bytes()])]);
    }
    let lzf = "abcabcabc-".repeat(50);
    put(
        r,
        "s:lzf",
        vec![v(&[b"SET", b"s:lzf", lzf.as_bytes(), b"PX", b"500000"])],
    );
    let binary: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    put(r, "s:binary", vec![v(&[b"SET", b"s:binary", &binary])]);

    put(
        r,
        "l:small",
        vec![v(&[
            b"RPUSH",
            b"l:small",
            b"a",
            b"1",
            b"-5",
            b"300",
            b"70000",
            b"-9000000",
            b"5000000000",
            b"",
        ])],
    );
    let mut big = v(&[b"RPUSH", b"l:big"]);
    for i in 0..3000 {
        big.push(match i % 3 {
            0 => i.to_string().into_bytes(),
            1 => format!("element-{i}-{}", "x".repeat(i % 90)).into_bytes(),
            _ => vec![b'y'; 100 + i % 5000],
        });
    }
    put(r, "l:big", vec![big]);

    put(
        r,
        "set:intset",
        vec![v(&[
            b"SADD",
            b"set:intset",
            b"3",
            b"-1",
            b"70000",
            b"5000000000",
        ])],
    );
    put(
        r,
        "set:hash",
        vec![v(&[b"SADD", b"set:hash", b"a", b"b", b"c", b"1"])],
    );
    let mut ints = v(&[b"SADD", b"set:bigint"]);
    ints.extend((0..700).map(|i| (i * 7).to_string().into_bytes()));
    put(r, "set:bigint", vec![ints]);

    put(
        r,
        "z:listpack",
        vec![v(&[
            b"ZADD",
            b"z:listpack",
            b"1",
            b"a",
            b"2.5",
            b"b",
            b"-inf",
            b"c",
            b"inf",
            b"d",
            b"100",
            b"e",
        ])],
    );
    let mut zbig = v(&[b"ZADD", b"z:skiplist"]);
    for i in 0..400 {
        zbig.push(format!("{}", (i as f64) / 7.0 - 20.0).into_bytes());
        zbig.push(format!("member-{i}").into_bytes());
    }
    put(
        r,
        "z:skiplist",
        vec![zbig, v(&[b"EXPIRE", b"z:skiplist", b"1000"])],
    );

    put(
        r,
        "h:listpack",
        vec![v(&[
            b"HSET",
            b"h:listpack",
            b"f",
            b"v",
            b"n",
            b"12",
            b"neg",
            b"-300",
            b"e",
            b"",
        ])],
    );
    let mut hbig = v(&[b"HSET", b"h:table"]);
    for i in 0..300 {
        hbig.push(format!("field{i}").into_bytes());
        hbig.push(format!("value {i} {}", "z".repeat(i % 70)).into_bytes());
    }
    put(r, "h:table", vec![hbig]);
    put(
        r,
        "h:longvalue",
        vec![v(&[
            b"HSET",
            b"h:longvalue",
            b"f",
            "q".repeat(100).as_bytes(),
        ])],
    );
    keys
}

#[test]
fn dump_and_restore_interoperate_with_redis_server() {
    if let Some(why) = redis_missing() {
        assert!(
            std::env::var_os("CI").is_none(),
            "redis-server is needed here: {why} (scripts/install-test-deps.sh)"
        );
        eprintln!("SKIPPED dump_and_restore_interoperate_with_redis_server: {why}");
        return;
    }
    let redis_server = Server::redis();
    let mut memkeep_server = Server::start_with(
        BIN,
        Options {
            resp: true,
            ..Options::default()
        },
    );
    let mut r = Resp::connect(redis_server.resp_addr().expect("redis port"));
    let mut m = Resp::connect(memkeep_server.resp_addr().expect("memkeep port"));
    ok(&mut r, &args("FLUSHALL"));
    ok(&mut m, &args("FLUSHALL"));
    let keys = fill(&mut r);

    // The encodings Redis dumps are the ones this test means to cover.
    let enc = |r: &mut Resp, k: &str| bulk(ok(r, &[b"OBJECT", b"ENCODING", k.as_bytes()]));
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
        assert_eq!(enc(&mut r, k), want.as_bytes(), "{k}");
    }

    // Redis -> memkeep.
    for k in &keys {
        let payload = bulk(ok(&mut r, &[b"DUMP", k.as_bytes()]));
        let ttl = pttl(&mut r, k).max(0).to_string();
        let got = m.call(&[b"RESTORE", k.as_bytes(), ttl.as_bytes(), &payload]);
        assert_eq!(got, Reply::Simple("OK".into()), "RESTORE {k} into memkeep");
        assert_eq!(contents(&mut m, k), contents(&mut r, k), "{k} in memkeep");
        let (tr, tm) = (pttl(&mut r, k), pttl(&mut m, k));
        assert!(
            (tr == -1 && tm == -1) || (tr > 0 && tm > 0 && (tr - tm).abs() < 5000),
            "{k}: TTL {tr} in Redis, {tm} in memkeep"
        );
    }

    // memkeep -> Redis, under new names (REPLACE over an existing key too).
    ok(&mut r, &args("SET back:s:short old"));
    for k in &keys {
        let payload = bulk(ok(&mut m, &[b"DUMP", k.as_bytes()]));
        let back = format!("back:{k}");
        let ttl = pttl(&mut m, k).max(0).to_string();
        let got = r.call(&[
            b"RESTORE",
            back.as_bytes(),
            ttl.as_bytes(),
            &payload,
            b"REPLACE",
        ]);
        assert_eq!(got, Reply::Simple("OK".into()), "RESTORE {k} into Redis");
        assert_eq!(
            contents(&mut r, &back),
            contents(&mut m, k),
            "{k} back in Redis"
        );
        // And Redis's own checks of what it loaded (its DEBUG-free way: a full re-dump).
        let again = bulk(ok(&mut r, &[b"DUMP", back.as_bytes()]));
        let got = m.call(&[b"RESTORE", b"again", b"0", &again, b"REPLACE"]);
        assert_eq!(got, Reply::Simple("OK".into()), "re-RESTORE {k}");
        assert_eq!(contents(&mut m, "again"), contents(&mut m, k), "{k} again");
    }
    assert_eq!(pttl(&mut r, "back:s:short"), -1);
    assert!(pttl(&mut r, "back:z:skiplist") > 990_000);

    // Byte for byte where Redis does not compress: short strings and integers.
    for k in [
        "s:short", "s:empty", "s:i8", "s:i16", "s:i32", "s:i64", "s:lead0", "l:small",
    ] {
        assert_eq!(
            bulk(ok(&mut m, &[b"DUMP", k.as_bytes()])),
            bulk(ok(&mut r, &[b"DUMP", k.as_bytes()])),
            "DUMP {k}"
        );
    }

    // Values made in memkeep itself go to Redis too.
    ok(&mut m, &args("RPUSH native:l 1 two 3"));
    ok(&mut m, &args("ZADD native:z 1 a 2 b"));
    ok(&mut m, &args("SADD native:s 1 2 3"));
    ok(&mut m, &args("HSET native:h a 1"));
    for k in ["native:l", "native:z", "native:s", "native:h"] {
        let payload = bulk(ok(&mut m, &[b"DUMP", k.as_bytes()]));
        ok(&mut r, &[b"RESTORE", k.as_bytes(), b"0", &payload]);
        assert_eq!(contents(&mut r, k), contents(&mut m, k), "{k}");
    }
    assert_eq!(enc(&mut r, "native:s"), b"intset");
    assert_eq!(enc(&mut r, "native:z"), b"listpack");

    drop(m);
    memkeep_server.stop();
    memkeep_server.assert_check_clean();
}

/// COPY and RESTORE are writes like any other: a blocked BLPOP is served by a list they
/// create, and a WATCH on their destination makes the watcher's EXEC fail.
#[test]
fn copy_and_restore_serve_blocked_pops_and_break_watches() {
    let server = match std::env::var("MEMKEEP_CONFORMANCE").as_deref() {
        Ok("redis") => Server::redis(),
        _ => Server::start_with(
            BIN,
            Options {
                resp: true,
                ..Options::default()
            },
        ),
    };
    let addr = server.resp_addr().expect("RESP port");
    let mut a = Resp::connect(addr);
    let mut b = Resp::connect(addr);
    ok(&mut a, &args("FLUSHALL"));
    ok(&mut a, &args("RPUSH src x y"));
    let payload = bulk(ok(&mut a, &args("DUMP src")));

    for how in ["copy", "restore"] {
        b.send(&args("BLPOP q 10"));
        // BLPOP is registered once CLIENT LIST shows it blocked.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let list = bulk(ok(&mut a, &args("CLIENT LIST")));
            if String::from_utf8_lossy(&list).contains("cmd=blpop") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "BLPOP never blocked");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if how == "copy" {
            assert_eq!(a.call(&args("COPY src q")), Reply::Int(1));
        } else {
            let r = a.call(&[b"RESTORE", b"q", b"0", &payload]);
            assert_eq!(r, Reply::Simple("OK".into()));
        }
        assert_eq!(
            b.read(),
            Reply::Array(Some(vec![Reply::bulk("q"), Reply::bulk("x")])),
            "{how}"
        );
        assert_eq!(
            a.call(&args("LRANGE q 0 -1")),
            Reply::bulks(&["y"]),
            "{how}"
        );
        ok(&mut a, &args("DEL q"));

        ok(&mut b, &args("WATCH w"));
        if how == "copy" {
            assert_eq!(a.call(&args("COPY src w")), Reply::Int(1));
        } else {
            let r = a.call(&[b"RESTORE", b"w", b"0", &payload]);
            assert_eq!(r, Reply::Simple("OK".into()));
        }
        ok(&mut b, &args("MULTI"));
        ok(&mut b, &args("LLEN w"));
        assert_eq!(b.call(&args("EXEC")), Reply::Array(None), "{how}");
        ok(&mut a, &args("DEL w"));
    }
}
