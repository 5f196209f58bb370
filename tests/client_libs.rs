//! Redis client libraries in other languages against a real memkeep: ioredis and node-redis
//! (RESP2 and RESP3), phpredis and redis-rb (RESP2). Each runs one program from
//! `tests/client_programs/` that checks values, not just that calls returned: MULTI/EXEC with a
//! runtime error inside and (where the library can send one) a queuing error, a WATCH conflict
//! made by a second connection (EXEC answers null) and a WATCH retry loop racing another
//! connection, blocking pops woken by a push from another connection, pub/sub round trips on
//! channels and patterns, and in RESP3 the protocol's own types (and, for node-redis, ordinary
//! commands on a subscribed connection).
//!
//! The same programs pass against redis-server: `MEMKEEP_CONFORMANCE=redis` runs every test
//! here against a redis-server the test starts instead (`make conformance`), proving the
//! programs' expectations are Redis's.
//!
//! The clients come from `scripts/install-test-deps.sh` (`make deps`): php-cli, php-redis, ruby
//! and ruby-redis from apt, ioredis and redis (node-redis) from npm into
//! `tests/client_programs/node/node_modules` (pinned by its package-lock.json). A missing client
//! fails the test with that hint; nothing is skipped.
//!
//! Invariants: every program runs under a deadline (killed past it) and has its own 60 s
//! limit; each test has its own server on free loopback ports with a temporary data dir, and
//! ends by checking the server still runs and logged no panic.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::programs::{CLIENT_DEADLINE, Run, assert_healthy, repo_root, run_bounded, tool};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
const INSTALL_HINT: &str = "run ./scripts/install-test-deps.sh (make deps)";

/// The server under test: memkeep (two workers, so the connections of one program are served
/// by different event loops), or redis-server under `MEMKEEP_CONFORMANCE=redis`.
fn target() -> Server {
    match std::env::var("MEMKEEP_CONFORMANCE").as_deref() {
        Err(_) | Ok("") => Server::start_with(
            BIN,
            Options {
                args: vec!["-t".into(), "2".into()],
                resp: true,
                ..Options::default()
            },
        ),
        Ok("redis") => Server::redis(),
        Ok(other) => panic!(
            "MEMKEEP_CONFORMANCE={other:?}: these are Redis clients; expected unset or `redis`"
        ),
    }
}

fn programs() -> PathBuf {
    repo_root().join("tests/client_programs")
}

/// Fails with the install hint unless `probe` (a quick command) exits 0.
fn require(mut probe: Command, what: &str) {
    let shown = format!("{probe:?}");
    probe.current_dir(repo_root());
    let run = run_bounded(probe, b"", Duration::from_secs(60));
    assert!(
        run.status.is_some_and(|s| s.success()),
        "{what} is not usable ({shown} failed): {INSTALL_HINT}\n{}",
        run.describe()
    );
}

/// Runs one client program with the server's RESP port and the protocol version, and checks
/// it reported success for that protocol.
fn run_program(server: &mut Server, mut cmd: Command, proto: u32, client: &str) {
    let port = server.resp_addr().expect("a RESP port").port();
    cmd.arg(port.to_string()).arg(proto.to_string());
    let run: Run = run_bounded(cmd, b"", CLIENT_DEADLINE).success(&[server]);
    assert!(
        run.stdout.starts_with("ok: ") && run.stdout.contains(&format!("protocol {proto}")),
        "{client} did not report its checks for protocol {proto}:\n{}",
        run.describe()
    );
    eprintln!(
        "{client} against {:?}: {}",
        server.kind(),
        run.stdout.trim()
    );
    assert_healthy(server);
}

fn node(script: &str, proto: u32, client: &str, module: &str) {
    let node = tool("node");
    let dir = programs().join("node");
    assert!(
        dir.join("node_modules")
            .join(module)
            .join("package.json")
            .is_file(),
        "{} has no {module}: {INSTALL_HINT}",
        dir.join("node_modules").display()
    );
    let mut server = target();
    let mut cmd = Command::new(node);
    cmd.current_dir(&dir).arg(dir.join(script));
    run_program(&mut server, cmd, proto, client);
}

#[test]
fn ioredis_resp2_transactions_watch_blocking_pops_and_pubsub() {
    node("ioredis_check.js", 2, "ioredis", "ioredis");
}

#[test]
fn ioredis_resp3_transactions_watch_blocking_pops_pubsub_and_resp3_types() {
    node("ioredis_check.js", 3, "ioredis", "ioredis");
}

#[test]
fn node_redis_resp2_transactions_watch_blocking_pops_and_pubsub() {
    node("node_redis_check.js", 2, "node-redis", "redis");
}

#[test]
fn node_redis_resp3_transactions_watch_blocking_pops_pubsub_and_push_frames() {
    node("node_redis_check.js", 3, "node-redis", "redis");
}

#[test]
fn phpredis_transactions_watch_blocking_pops_and_pubsub() {
    let php = tool("php");
    let mut probe = Command::new(php);
    probe.args([
        "-r",
        "exit(extension_loaded('redis') && extension_loaded('pcntl') ? 0 : 1);",
    ]);
    require(probe, "php with the redis (php-redis) and pcntl extensions");
    let mut server = target();
    let mut cmd = Command::new(php);
    cmd.arg(programs().join("php/phpredis_check.php"));
    run_program(&mut server, cmd, 2, "phpredis");
}

#[test]
fn redis_rb_transactions_watch_blocking_pops_and_pubsub() {
    let ruby = tool("ruby");
    let mut probe = Command::new(ruby);
    probe.args(["-e", "require 'redis'"]);
    require(probe, "ruby with redis-rb (ruby-redis)");
    let mut server = target();
    let mut cmd = Command::new(ruby);
    cmd.arg(programs().join("ruby/redis_rb_check.rb"));
    run_program(&mut server, cmd, 2, "redis-rb");
}
