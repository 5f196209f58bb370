//! TLS on both ports (src/server/tls.rs), with real clients: redis-cli `--tls` (with and
//! without a client certificate), redis-py `ssl=True`, pymemcache with an `ssl.SSLContext` on
//! the memcached port (`-Z`), `openssl s_client` for the handshake and the certificate served,
//! and raw sockets for hostile input. Certificates are made per test by the `openssl` command
//! (a CA, a server certificate for 127.0.0.1, a client certificate), never committed.
//!
//! Invariants: every client has a deadline and every socket a timeout; each test ends by
//! checking the server still runs and logged no panic.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::programs::{CLIENT_DEADLINE, assert_healthy, python, run_bounded, tool};
use common::{Options, Server, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

/// A CA, and a server and a client certificate it signed.
struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn new() -> Certs {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = Certs { dir };
        certs.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=memkeep test CA",
        ]);
        certs.issue("server", "/CN=memkeep test server", true);
        certs.issue("client", "/CN=memkeep test client", false);
        certs
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn p(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }

    fn openssl(&self, args: &[&str]) {
        let mut cmd = Command::new(tool("openssl"));
        cmd.args(args).current_dir(self.dir.path());
        let run = run_bounded(cmd, b"", CLIENT_DEADLINE);
        assert!(
            run.status.is_some_and(|s| s.success()),
            "{}",
            run.describe()
        );
    }

    /// `name.key` and `name.crt`, signed by the CA; a server certificate names 127.0.0.1.
    fn issue(&self, name: &str, subject: &str, server: bool) {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        self.openssl(&[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ]);
        let ext = format!("{name}.ext");
        let san = if server {
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        } else {
            "extendedKeyUsage=clientAuth\n"
        };
        std::fs::write(self.path(&ext), san).expect("write ext");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
    }

    /// The flags for a server certificate (and, with `ca`, client verification).
    fn server_args(&self, ca: bool) -> Vec<String> {
        let mut v = vec![
            "--tls-cert-file".into(),
            self.p("server.crt"),
            "--tls-key-file".into(),
            self.p("server.key"),
        ];
        if ca {
            v.push("--tls-ca-cert-file".into());
            v.push(self.p("ca.crt"));
        }
        v
    }
}

/// memkeep with RESP on a plain and a TLS port; returns the TLS port.
fn start_resp_tls(certs: &Certs, extra: &[&str]) -> (Server, u16) {
    let tls_port = free_port();
    let mut args = vec!["--tls-port".to_string(), tls_port.to_string()];
    args.extend(certs.server_args(extra.contains(&"--tls-ca-cert-file")));
    args.extend(
        extra
            .iter()
            .filter(|a| **a != "--tls-ca-cert-file")
            .map(|s| s.to_string()),
    );
    let server = Server::start_with(
        BIN,
        Options {
            args,
            resp: true,
            ..Options::default()
        },
    );
    (server, tls_port)
}

fn redis_cli(port: u16, certs: &Certs, client_cert: bool, args: &[&str]) -> common::programs::Run {
    let mut cmd = Command::new(tool("redis-cli"));
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--tls",
        "--cacert",
    ])
    .arg(certs.path("ca.crt"));
    if client_cert {
        cmd.arg("--cert")
            .arg(certs.path("client.crt"))
            .arg("--key")
            .arg(certs.path("client.key"));
    }
    cmd.args(args);
    run_bounded(cmd, b"", CLIENT_DEADLINE)
}

/// `openssl s_client` sending `input` once the handshake is done: its whole output.
fn s_client(port: u16, certs: &Certs, input: &[u8]) -> String {
    let mut cmd = Command::new(tool("openssl"));
    cmd.args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args([
            "-CAfile",
            &certs.p("ca.crt"),
            "-verify_return_error",
            "-quiet",
        ])
        .arg("-ign_eof");
    let run = run_bounded(cmd, input, Duration::from_secs(20));
    format!("{}{}", run.stdout, run.stderr)
}

/// The subject of the certificate a TLS port serves.
fn served_subject(port: u16, certs: &Certs) -> String {
    let mut cmd = Command::new(tool("openssl"));
    cmd.args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-CAfile", &certs.p("ca.crt"), "-verify_return_error"]);
    let run = run_bounded(cmd, b"", Duration::from_secs(20));
    run.stdout
        .lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_else(|| panic!("no subject in {}", run.describe()))
        .to_string()
}

fn stdout_ok(run: common::programs::Run, servers: &[&Server]) -> String {
    run.success(servers).stdout.trim().to_string()
}

#[test]
fn resp_over_tls_beside_the_plain_port_with_one_keyspace() {
    let certs = Certs::new();
    let (mut server, tls) = start_resp_tls(&certs, &[]);
    let plain = server.resp_addr().expect("resp").port();
    assert_eq!(
        stdout_ok(
            redis_cli(tls, &certs, false, &["SET", "k", "over tls"]),
            &[&server]
        ),
        "OK"
    );
    let mut cmd = Command::new(tool("redis-cli"));
    cmd.args(["-p", &plain.to_string(), "GET", "k"]);
    assert_eq!(
        stdout_ok(run_bounded(cmd, b"", CLIENT_DEADLINE), &[&server]),
        "over tls"
    );
    // A large value both ways, through many records.
    let big = "x".repeat(300_000);
    let mut cmd = Command::new(tool("redis-cli"));
    cmd.args(["-p", &plain.to_string(), "-x", "SET", "big"]);
    run_bounded(cmd, big.as_bytes(), CLIENT_DEADLINE).success(&[&server]);
    assert_eq!(
        stdout_ok(
            redis_cli(tls, &certs, false, &["STRLEN", "big"]),
            &[&server]
        ),
        "300000"
    );
    let got = stdout_ok(redis_cli(tls, &certs, false, &["GET", "big"]), &[&server]);
    assert_eq!(got, big);
    // The handshake verifies against the CA, and a pipeline after it is answered in order.
    let out = s_client(tls, &certs, b"PING\r\nECHO hello\r\nQUIT\r\n");
    assert!(out.contains("+PONG\r\n$5\r\nhello\r\n+OK"), "{out}");
    assert_healthy(&mut server);
}

#[test]
fn redis_py_with_ssl() {
    let certs = Certs::new();
    let (mut server, tls) = start_resp_tls(&certs, &[]);
    let script = r#"
import sys, redis
port, ca = int(sys.argv[1]), sys.argv[2]
for proto in (2, 3):
    r = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=ca, protocol=proto)
    assert r.ping()
    r.set("py", b"\x00\xffbinary")
    assert r.get("py") == b"\x00\xffbinary"
    p = r.pipeline()
    for i in range(200):
        p.incr("counter")
    assert p.execute()[-1] == (200 if proto == 2 else 400), "counter"
    r.rpush("l", *range(50))
    assert r.lrange("l", 0, -1)[-1] == b"49"
    r.delete("l")
    r.close()
print("ok")
"#;
    let run = python(script, &[tls.to_string(), certs.p("ca.crt")]);
    assert_eq!(run.success(&[&server]).stdout.trim(), "ok");
    assert_healthy(&mut server);
}

#[test]
fn client_certificates_required_optional_and_refused() {
    let certs = Certs::new();
    let (mut server, tls) = start_resp_tls(&certs, &["--tls-ca-cert-file"]);
    // Required (the default with a CA file): without one the handshake fails.
    let run = redis_cli(tls, &certs, false, &["PING"]);
    assert!(
        !run.stdout.contains("PONG"),
        "served without a client certificate: {}",
        run.describe()
    );
    assert_eq!(
        stdout_ok(redis_cli(tls, &certs, true, &["PING"]), &[&server]),
        "PONG"
    );
    assert_healthy(&mut server);
    drop(server);

    let (mut server, tls) = start_resp_tls(
        &certs,
        &["--tls-ca-cert-file", "--tls-auth-clients", "optional"],
    );
    assert_eq!(
        stdout_ok(redis_cli(tls, &certs, false, &["PING"]), &[&server]),
        "PONG"
    );
    assert_eq!(
        stdout_ok(redis_cli(tls, &certs, true, &["PING"]), &[&server]),
        "PONG"
    );
    // A certificate from another CA is refused even when one is optional.
    let other = Certs::new();
    let mut cmd = Command::new(tool("redis-cli"));
    cmd.args([
        "-p",
        &tls.to_string(),
        "--tls",
        "--cacert",
        &certs.p("ca.crt"),
    ])
    .args([
        "--cert",
        &other.p("client.crt"),
        "--key",
        &other.p("client.key"),
        "PING",
    ]);
    let run = run_bounded(cmd, b"", CLIENT_DEADLINE);
    assert!(!run.stdout.contains("PONG"), "{}", run.describe());
    assert_healthy(&mut server);
}

#[test]
fn memcached_port_over_tls_with_pymemcache() {
    let certs = Certs::new();
    let mut args = vec!["-Z".to_string(), "-o".to_string()];
    args.push(format!(
        "ssl_chain_cert={},ssl_key={}",
        certs.p("server.crt"),
        certs.p("server.key")
    ));
    let mut server = Server::start_with(
        BIN,
        Options {
            args,
            resp: true,
            ..Options::default()
        },
    );
    let script = r#"
import sys, ssl
from pymemcache.client.base import Client
port, ca = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context(cafile=ca)
c = Client(("127.0.0.1", port), tls_context=ctx, timeout=10)
c.set("mc", b"value", expire=0)
assert c.get("mc") == b"value", c.get("mc")
c.set("big", b"v" * 500000)
assert c.get("big") == b"v" * 500000
assert c.incr("n", 1) is None
c.set("n", b"41")
assert c.incr("n", 1) == 42
print(c.version())
c.close()
print("ok")
"#;
    let run = python(script, &[server.port().to_string(), certs.p("ca.crt")]);
    assert_eq!(
        run.success(&[&server]).stdout.trim().lines().last(),
        Some("ok")
    );
    // The same keyspace over plain RESP.
    let mut cmd = Command::new(tool("redis-cli"));
    cmd.args([
        "-p",
        &server.resp_addr().expect("resp").port().to_string(),
        "GET",
        "mc",
    ]);
    assert_eq!(
        stdout_ok(run_bounded(cmd, b"", CLIENT_DEADLINE), &[&server]),
        "value"
    );
    // Plain text on the TLS port is not served: the connection is closed without a reply.
    let mut s = TcpStream::connect(server.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"get mc\r\n").expect("send");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(
        !String::from_utf8_lossy(&buf).contains("VALUE"),
        "plain text answered on the TLS port: {buf:?}"
    );
    assert_healthy(&mut server);
}

#[test]
fn hostile_clients_on_the_tls_port_cost_only_their_connection() {
    let certs = Certs::new();
    let (mut server, tls) = start_resp_tls(&certs, &[]);
    let addr = format!("127.0.0.1:{tls}");
    // Garbage instead of a ClientHello.
    let mut junk = TcpStream::connect(&addr).expect("connect");
    junk.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    junk.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3])
        .expect("send");
    junk.write_all(b"GET k\r\n").expect("send");
    let mut buf = Vec::new();
    let _ = junk.read_to_end(&mut buf);
    assert!(
        !String::from_utf8_lossy(&buf).contains("$"),
        "garbage was answered: {buf:?}"
    );
    // A client that stops in the middle of its ClientHello, and 200 idle ones: others are
    // served meanwhile.
    let hello = [
        0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00, 0xc4, 0x03, 0x03,
    ];
    let mut stalled = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(&addr).expect("connect");
        s.write_all(&hello).expect("send");
        stalled.push(s);
    }
    assert_eq!(
        stdout_ok(redis_cli(tls, &certs, false, &["PING"]), &[&server]),
        "PONG"
    );
    // Garbage after a good handshake: the connection closes, the next one works.
    let out = s_client(tls, &certs, b"*1\r\n$4\r\nPING\r\n*x\r\n");
    assert!(out.contains("+PONG"), "{out}");
    assert!(out.contains("-ERR Protocol error"), "{out}");
    drop(stalled);
    assert_eq!(
        stdout_ok(redis_cli(tls, &certs, false, &["PING"]), &[&server]),
        "PONG"
    );
    assert_healthy(&mut server);
}

#[test]
fn sighup_reloads_the_certificate_for_new_connections() {
    let certs = Certs::new();
    let (mut server, tls) = start_resp_tls(&certs, &[]);
    assert!(
        served_subject(tls, &certs).contains("memkeep test server"),
        "first certificate"
    );
    // Replace the certificate in place, then SIGHUP.
    certs.issue("server", "/CN=memkeep renewed server", true);
    let pid = server.pid().expect("pid") as libc::pid_t;
    // SAFETY: signals the server process this test started.
    unsafe {
        libc::kill(pid, libc::SIGHUP);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if server.stderr().contains("TLS certificates reloaded") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reload logged: {}",
            server.stderr_tail(2000)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        served_subject(tls, &certs).contains("memkeep renewed server"),
        "the renewed certificate is served"
    );
    // A broken file on the next reload: logged, the renewed certificate stays.
    std::fs::write(certs.path("server.crt"), b"not a certificate").expect("write");
    // SAFETY: as above.
    unsafe {
        libc::kill(pid, libc::SIGHUP);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !server.stderr().contains("not reloaded") {
        assert!(std::time::Instant::now() < deadline, "no failure logged");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(served_subject(tls, &certs).contains("memkeep renewed server"));
    assert_healthy(&mut server);
}

#[test]
fn tls_configuration_errors_stop_startup_with_a_reason() {
    let certs = Certs::new();
    let data = tempfile::tempdir().expect("tempdir");
    let run = |args: &[String]| {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "-p",
            &free_port().to_string(),
            "--resp-port",
            &free_port().to_string(),
        ])
        .arg("-H")
        .arg(data.path())
        .args(args);
        run_bounded(cmd, b"", Duration::from_secs(30))
    };
    let port = free_port().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--tls-port".into(), port.clone()], "tls_cert_file"),
        (
            {
                let mut v = vec!["--tls-port".into(), port.clone()];
                v.extend(certs.server_args(false));
                v.extend(["--tls-auth-clients".into(), "yes".into()]);
                v
            },
            "tls_ca_cert_file",
        ),
        (
            {
                let mut v = vec!["--tls-port".into(), port.clone()];
                v.extend([
                    "--tls-cert-file".into(),
                    certs.p("server.crt"),
                    "--tls-key-file".into(),
                    certs.p("client.key"),
                ]);
                v
            },
            "do not make a TLS identity",
        ),
        (
            {
                let mut v = vec!["--tls-port".into(), port.clone()];
                v.extend([
                    "--tls-cert-file".into(),
                    certs.p("missing.crt"),
                    "--tls-key-file".into(),
                    certs.p("server.key"),
                ]);
                v
            },
            "missing.crt",
        ),
        (
            vec!["-Z".into(), "-o".into(), "ssl_verify_mode=9".into()],
            "ssl_verify_mode",
        ),
    ];
    for (args, want) in cases {
        let r = run(&args);
        assert!(
            r.status.is_some_and(|s| !s.success()),
            "{args:?} started: {}",
            r.describe()
        );
        assert!(r.stderr.contains(want), "{args:?}: {}", r.describe());
    }
}
