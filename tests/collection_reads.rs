//! Collections through the overlay (`storage/overlay.rs`): a batch that writes collection
//! elements is acknowledged without an LMDB commit, so a reader's snapshot may predate it. A
//! read of such a collection must still see every acknowledged write: it runs in the writer's
//! transaction instead (`WriteOp::Read`, counted in INFO `memkeep_reads_in_writer`).
//!
//! - Reads pipelined right behind writes, of every collection type and in `always` and
//!   `never`, answer what the writes made, and at least some of them ran in the writer (so the
//!   test exercises that path, not only reads after a commit).
//! - A second connection reads, right after each acknowledged write of the first, what it
//!   wrote (acknowledged means visible to everyone).
//! - Many small collection batches no longer grow the data file by fresh pages per batch.

mod common;

use std::collections::BTreeMap;

use common::resp::{Reply, Resp};
use common::{Options, Rng, Server};

fn server(sync: &str) -> Server {
    Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            args: vec!["--sync".into(), sync.into()],
            ..Options::default()
        },
    )
}

fn connect(s: &Server) -> Resp {
    Resp::connect(s.resp_addr().expect("RESP port"))
}

/// An INFO field as a number.
fn info_u64(c: &mut Resp, field: &str) -> u64 {
    let Reply::Bulk(Some(text)) = c.cmd("INFO stats") else {
        panic!("INFO stats did not answer a bulk string");
    };
    let text = String::from_utf8_lossy(&text).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO stats has no {field}: {text}"))
        .trim()
        .parse()
        .expect("a number")
}

/// Sends `lines` (words split at spaces) in one write and reads a reply to each.
fn pipelined(c: &mut Resp, lines: &[String]) -> Vec<Reply> {
    let cmds: Vec<Vec<u8>> = lines
        .iter()
        .map(|line| {
            let words: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            Resp::encode(&words)
        })
        .collect();
    c.send_raw(&cmds.concat());
    (0..cmds.len()).map(|_| c.read()).collect()
}

fn bulks(items: &[String]) -> Reply {
    Reply::array(items.iter().map(|s| Reply::bulk(s)).collect())
}

#[test]
fn reads_pipelined_behind_collection_writes_see_them() {
    for sync in ["always", "never"] {
        let s = server(sync);
        let mut c = connect(&s);
        for round in 0..20 {
            let replies = pipelined(
                &mut c,
                &[
                    format!("RPUSH l{round} a b c"),
                    format!("LRANGE l{round} 0 -1"),
                    format!("LLEN l{round}"),
                    format!("HSET h{round} f v g w"),
                    format!("HGETALL h{round}"),
                    format!("SADD s{round} x"),
                    format!("SISMEMBER s{round} x"),
                    format!("ZADD z{round} 1 m 2 n"),
                    format!("ZRANGE z{round} 0 -1 WITHSCORES"),
                    format!("ZRANK z{round} n"),
                    format!("OBJECT ENCODING h{round}"),
                    format!("TYPE z{round}"),
                ],
            );
            let want = vec![
                Reply::Int(3),
                Reply::bulks(&["a", "b", "c"]),
                Reply::Int(3),
                Reply::Int(2),
                Reply::bulks(&["f", "v", "g", "w"]),
                Reply::Int(1),
                Reply::Int(1),
                Reply::Int(2),
                Reply::bulks(&["m", "1", "n", "2"]),
                Reply::Int(1),
                Reply::bulk("listpack"),
                Reply::Simple("zset".into()),
            ];
            assert_eq!(replies, want, "round {round}, --sync {sync}");
        }
        // Each round's reads came in one send with its writes, long before the writer's next
        // LMDB commit (every 250 ms): some of them must have run in the writer.
        let ran = info_u64(&mut c, "memkeep_reads_in_writer");
        assert!(ran > 0, "--sync {sync}: no read ran in the writer");
        // Once LMDB has them, reads come from the snapshot again.
        std::thread::sleep(std::time::Duration::from_millis(800));
        assert_eq!(c.cmd("LRANGE l0 0 -1"), Reply::bulks(&["a", "b", "c"]));
        assert_eq!(info_u64(&mut c, "memkeep_reads_in_writer"), ran);
    }
}

#[test]
fn counts_of_collections_being_written_are_answered_from_the_snapshot() {
    // LLEN, HLEN, SCARD and ZCARD need only the collection's metadata record, which readers
    // see at once (the overlay), so they never go to the writer, even right behind a write of
    // the collection they count.
    for sync in ["always", "never"] {
        let s = server(sync);
        let mut c = connect(&s);
        for round in 0..20 {
            let replies = pipelined(
                &mut c,
                &[
                    format!("RPUSH l{round} a b c"),
                    format!("LLEN l{round}"),
                    format!("HSET h{round} f v g w"),
                    format!("HLEN h{round}"),
                    format!("SADD s{round} x y z q"),
                    format!("SCARD s{round}"),
                    format!("ZADD z{round} 1 m 2 n 3 o 4 p 5 q"),
                    format!("ZCARD z{round}"),
                    format!("LLEN h{round}"),
                    format!("ZCARD nothing{round}"),
                ],
            );
            let wrong = "WRONGTYPE Operation against a key holding the wrong kind of value";
            let want = vec![
                Reply::Int(3),
                Reply::Int(3),
                Reply::Int(2),
                Reply::Int(2),
                Reply::Int(4),
                Reply::Int(4),
                Reply::Int(5),
                Reply::Int(5),
                Reply::Error(wrong.into()),
                Reply::Int(0),
            ];
            assert_eq!(replies, want, "round {round}, --sync {sync}");
        }
        assert_eq!(
            info_u64(&mut c, "memkeep_reads_in_writer"),
            0,
            "--sync {sync}: a count went to the writer"
        );
    }
}

#[test]
fn another_connection_sees_each_acknowledged_collection_write() {
    let s = server("never");
    let mut w = connect(&s);
    let mut r = connect(&s);
    let mut rng = Rng(0x5eed_c011);
    let mut hash: BTreeMap<String, String> = BTreeMap::new();
    let mut list: Vec<String> = Vec::new();
    let mut zset: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..600 {
        match rng.below(3) {
            0 => {
                let (f, v) = (format!("f{}", rng.below(40)), format!("v{i}"));
                w.cmd(&format!("HSET h {f} {v}"));
                hash.insert(f, v);
                let got = r.cmd("HGETALL h");
                let want: Vec<String> = hash
                    .iter()
                    .flat_map(|(f, v)| [f.clone(), v.clone()])
                    .collect();
                // HGETALL answers in field order here (memkeep keeps fields sorted).
                assert_eq!(got, bulks(&want), "step {i}");
            }
            1 => {
                let e = format!("e{i}");
                assert_eq!(
                    w.cmd(&format!("RPUSH l {e}")),
                    Reply::Int(list.len() as i64 + 1)
                );
                list.push(e);
                assert_eq!(
                    r.cmd("LRANGE l -3 -1"),
                    bulks(&list[list.len().saturating_sub(3)..])
                );
            }
            _ => {
                let (m, score) = (format!("m{}", rng.below(30)), rng.below(1000) as i64);
                w.cmd(&format!("ZADD z {score} {m}"));
                zset.insert(m.clone(), score);
                assert_eq!(
                    r.cmd(&format!("ZSCORE z {m}")),
                    Reply::bulk(&score.to_string()),
                    "step {i}"
                );
                assert_eq!(r.cmd("ZCARD z"), Reply::Int(zset.len() as i64));
            }
        }
    }
}

#[test]
fn small_collection_batches_do_not_grow_the_data_file_per_batch() {
    let s = server("never");
    let mut c = connect(&s);
    let mut rng = Rng(0x2a11);
    // 1,000 sends of 50 ZADDs each: one batch apiece. Committed to LMDB one by one (each
    // commit takes fresh pages for every B-tree path it touches while a checkpoint is pinned)
    // these grew data.mdb to about 85 MB; through the overlay, about 3 MB.
    for _ in 0..1000 {
        let sends: Vec<Vec<u8>> = (0..50)
            .map(|_| {
                let score = rng.below(1_000_000).to_string();
                let member = format!("m{}", rng.below(10_000));
                Resp::encode(&[b"ZADD", b"z", score.as_bytes(), member.as_bytes()])
            })
            .collect();
        c.send_raw(&sends.concat());
        for _ in 0..50 {
            assert!(matches!(c.read(), Reply::Int(_)));
        }
    }
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(s.data_dir().join("data.mdb")).expect("data.mdb");
    let allocated = meta.blocks() * 512;
    assert!(
        allocated < 24 << 20,
        "data.mdb takes {allocated} bytes after 50,000 ZADDs to a 10,000-member set"
    );
    assert!(matches!(c.cmd("ZCARD z"), Reply::Int(n) if n > 9_000));
}
