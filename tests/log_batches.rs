//! A group-commit batch too large for one write-ahead-log record (its length is a u32, and
//! RESP values reach `proto_max_bulk_len`) is not an error: the writer runs its writes one by
//! one, each in a record of its own, and every one is durable. The record limit is lowered
//! with `MEMKEEP_TEST_LOG_BATCH_MAX` so the test needs kilobytes, not gigabytes.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use common::programs::assert_healthy;
use common::{Options, Server};

fn value(i: usize) -> Vec<u8> {
    (0..20_000)
        .map(|j| b'a' + ((i * 7 + j) % 26) as u8)
        .collect()
}

#[test]
fn a_batch_past_the_log_record_limit_is_written_one_write_at_a_time() {
    for sync in ["always", "never"] {
        one_mode(sync);
    }
}

fn one_mode(sync: &str) {
    let mut server = Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            args: vec!["--sync".into(), sync.into()],
            env: vec![("MEMKEEP_TEST_LOG_BATCH_MAX".into(), "65536".into())],
            ..Options::default()
        },
    );
    // One pipeline of 40 sets of 20 KB: one submission, 800 KB of records in a batch.
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    // First an acknowledged write LMDB has not committed yet (commits come every 250 ms): the
    // batch too large for a record makes the writer rebuild its open transaction, and this
    // write must be replayed into the rebuilt one.
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    s.write_all(b"set before 0 0 6\r\nbefore\r\n")
        .expect("send");
    let mut line = String::new();
    r.read_line(&mut line).expect("reply");
    assert_eq!(line, "STORED\r\n");
    let mut req = Vec::new();
    for i in 0..40 {
        let v = value(i);
        req.extend_from_slice(format!("set big{i} 0 0 {}\r\n", v.len()).as_bytes());
        req.extend_from_slice(&v);
        req.extend_from_slice(b"\r\n");
    }
    s.write_all(&req).expect("send");
    for i in 0..40 {
        let mut line = String::new();
        r.read_line(&mut line).expect("reply");
        assert_eq!(line, "STORED\r\n", "set {i}");
    }
    assert!(
        server.stderr().contains("too large for one log record"),
        "the batch went into one record: {}",
        server.stderr_tail(2000)
    );
    // Once LMDB has committed the rebuilt transaction (the overlay no longer answers for
    // it), the earlier write is still there.
    std::thread::sleep(Duration::from_millis(800));
    let mut c = server.connect();
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    c.write_all(b"get before\r\n").expect("get");
    let mut got = String::new();
    let mut cr = BufReader::new(c);
    cr.read_line(&mut got).expect("reply");
    assert_eq!(got, "VALUE before 0 6\r\n", "{sync}");
    for _ in 0..2 {
        cr.read_line(&mut got).expect("reply");
    }
    assert_eq!(got, "VALUE before 0 6\r\nbefore\r\nEND\r\n", "{sync}");
    // Every write was logged on its own: a crash loses none of them (`never` too: the log
    // was written, and the process's death does not drop the page cache).
    server.kill9();
    server.relaunch();
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    for i in 0..40 {
        s.write_all(format!("get big{i}\r\n").as_bytes())
            .expect("get");
        let mut head = String::new();
        r.read_line(&mut head).expect("VALUE");
        let v = value(i);
        assert_eq!(head, format!("VALUE big{i} 0 {}\r\n", v.len()), "key {i}");
        let mut body = vec![0u8; v.len() + 2];
        std::io::Read::read_exact(&mut r, &mut body).expect("body");
        assert_eq!(&body[..v.len()], &v[..], "key {i}");
        let mut end = String::new();
        r.read_line(&mut end).expect("END");
        assert_eq!(end, "END\r\n");
    }
    assert_healthy(&mut server);
}
