//! memkeep-bench's transaction and queue modes against a real memkeep with `--sync always`
//! (what `make bench` runs at scale): the SETs of `--multi 10` transactions all land and read
//! back, and a queue of producers LPUSHing while consumers BRPOP delivers every acknowledged
//! message exactly once. memkeep-bench checks each reply and each message itself and exits
//! non-zero on any error, loss or duplicate; this test also checks its JSON counts.
//!
//! Invariants: each run has a deadline and its own server on free loopback ports with a
//! temporary data dir; the test ends by checking the server still runs and logged no panic.

mod common;

use std::process::Command;
use std::time::Duration;

use common::programs::{assert_healthy, run_bounded};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
const BENCH: &str = env!("CARGO_BIN_EXE_memkeep-bench");

fn start() -> Server {
    Server::start_with(
        BIN,
        Options {
            args: ["-t", "2", "--sync", "always"].map(String::from).to_vec(),
            resp: true,
            ..Options::default()
        },
    )
}

/// Runs memkeep-bench with `args` (plus the server's RESP port and --json) and returns its JSON
/// line per phase (flat objects).
fn bench(server: &Server, args: &[&str]) -> Vec<String> {
    let port = server.resp_addr().expect("RESP port").port().to_string();
    let mut cmd = Command::new(BENCH);
    cmd.args([
        "--protocol",
        "resp",
        "--port",
        &port,
        "--json",
        "--timeout",
        "20",
    ])
    .args(args);
    let run = run_bounded(cmd, b"", Duration::from_secs(120)).success(&[server]);
    run.stdout
        .lines()
        .filter(|l| l.starts_with('{') && l.ends_with('}'))
        .map(str::to_string)
        .collect()
}

/// An integer field of a flat JSON object.
fn int(json: &str, field: &str) -> u64 {
    let key = format!("\"{field}\":");
    json.split_once(&key)
        .and_then(|(_, rest)| rest.split([',', '}']).next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no integer {field} in {json}"))
}

#[test]
fn multi_exec_sets_all_land_and_read_back() {
    let mut server = start();
    let phases = bench(
        &server,
        &[
            "--connections",
            "3",
            "--keys",
            "1003",
            "--multi",
            "10",
            "--phases",
            "set,get",
        ],
    );
    assert_eq!(phases.len(), 2, "{phases:?}");
    let (set, get) = (&phases[0], &phases[1]);
    assert_eq!((int(set, "ops"), int(set, "errors")), (1003, 0), "{set}");
    assert_eq!(int(set, "multi"), 10);
    // 1003 keys over 3 connections: 335, 334, 334, in transactions of 10.
    assert_eq!(int(set, "transactions"), 34 + 34 + 34, "{set}");
    assert_eq!(
        (int(get, "hits"), int(get, "misses"), int(get, "mismatches")),
        (1003, 0, 0),
        "{get}"
    );
    assert_healthy(&mut server);
}

#[test]
fn a_queue_of_producers_and_consumers_delivers_each_message_exactly_once() {
    let mut server = start();
    let phases = bench(
        &server,
        &[
            "--connections",
            "3",
            "--consumers",
            "3",
            "--keys",
            "3000",
            "--phases",
            "queue",
        ],
    );
    assert_eq!(phases.len(), 1, "{phases:?}");
    let q = &phases[0];
    assert_eq!(int(q, "ops"), 3000, "every message delivered: {q}");
    assert_eq!(int(q, "sets"), 3000, "every push answered: {q}");
    assert_eq!(
        (
            int(q, "misses"),
            int(q, "duplicates"),
            int(q, "mismatches"),
            int(q, "errors")
        ),
        (0, 0, 0, 0),
        "{q}"
    );
    assert_eq!(int(q, "consumers"), 3);
    // The queue is empty afterwards.
    let mut r = common::resp::Resp::connect(server.resp_addr().expect("RESP port"));
    assert_eq!(
        r.cmd("LLEN memkeep-bench:queue"),
        common::resp::Reply::Int(0)
    );
    assert_healthy(&mut server);
}
