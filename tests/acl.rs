//! Redis ACL users (src/server/acl.rs) through redis-py and raw RESP: ACL SETUSER/GETUSER/
//! LIST/USERS/WHOAMI/CAT/DELUSER, AUTH and HELLO AUTH with a user name, NOPERM for commands,
//! keys and channels, users from an ACL file, and INFO's refusal counts. The script that checks
//! replies Redis also gives runs against a real redis-server first, so what it asserts is
//! Redis's behaviour, then against memkeep.
//!
//! Invariants: every client has a deadline; each test ends by checking the server still runs
//! and logged no panic.

mod common;

use common::programs::{assert_healthy, python};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

fn start(args: &[&str]) -> Server {
    Server::start_with(
        BIN,
        Options {
            args: args.iter().map(|s| s.to_string()).collect(),
            resp: true,
            ..Options::default()
        },
    )
}

/// What both servers must answer alike (Redis 7.0's wording).
const SHARED: &str = r#"
import sys, redis
port = int(sys.argv[1])
admin = redis.Redis(port=port)
admin.execute_command("ACL", "SETUSER", "alice", "on", ">pw", "~k*", "&news", "+@read", "+set", "+publish", "+subscribe")
assert b"alice" in admin.execute_command("ACL", "USERS")
a = redis.Redis(port=port, username="alice", password="pw")
assert a.set("k1", "v") is True
assert a.get("k1") == b"v"
def noperm(f, want):
    try:
        f()
    except redis.exceptions.NoPermissionError as e:
        assert str(e) == want, (str(e), want)
        return
    raise AssertionError("allowed: " + want)
noperm(lambda: a.get("x"), "this user has no permissions to access one of the keys used as arguments")
noperm(lambda: a.mget("k1", "x"), "this user has no permissions to access one of the keys used as arguments")
noperm(lambda: a.delete("k1"), "this user has no permissions to run the 'del' command")
noperm(lambda: a.execute_command("CONFIG", "GET", "maxmemory"), "this user has no permissions to run the 'config|get' command")
noperm(lambda: a.execute_command("ACL", "WHOAMI"), "this user has no permissions to run the 'acl|whoami' command")
noperm(lambda: a.publish("other", "m"), "this user has no permissions to access one of the channels used as arguments")
assert a.publish("news", "m") == 0
# Wrong passwords, unknown users, and a user switched off.
for user, pw in (("alice", "bad"), ("nobody", "pw")):
    try:
        redis.Redis(port=port, username=user, password=pw).ping()
        raise AssertionError("logged in")
    except redis.exceptions.AuthenticationError as e:
        assert "invalid username-password pair or user is disabled" in str(e), str(e)
# HELLO 3 AUTH with a user name.
r3 = redis.Redis(port=port, username="alice", password="pw", protocol=3)
assert r3.get("k1") == b"v"
# Rule errors.
try:
    admin.execute_command("ACL", "SETUSER", "x", "badrule")
    raise AssertionError("accepted")
except redis.exceptions.ResponseError as e:
    assert str(e) == "Error in ACL SETUSER modifier 'badrule': Syntax error", str(e)
got = admin.execute_command("ACL", "GETUSER", "alice")
d = dict(zip(got[::2], got[1::2])) if isinstance(got, list) else got
assert d[b"flags"] == [b"on"], d
assert d[b"keys"] == b"~k*", d
assert d[b"channels"] == b"&news", d
assert admin.execute_command("ACL", "GETUSER", "nobody") is None
admin.execute_command("ACL", "SETUSER", "alice", "off")
try:
    redis.Redis(port=port, username="alice", password="pw").ping()
    raise AssertionError("a user switched off logged in")
except redis.exceptions.AuthenticationError:
    pass
assert admin.execute_command("ACL", "DELUSER", "alice", "nobody") == 1
try:
    admin.execute_command("ACL", "DELUSER", "default")
    raise AssertionError("deleted default")
except redis.exceptions.ResponseError as e:
    assert "default" in str(e), str(e)
print("ok")
"#;

#[test]
fn acl_users_behave_as_in_redis() {
    let mut redis = Server::redis();
    let run = python(SHARED, &[redis.port().to_string()]);
    assert_eq!(
        run.success(&[&redis]).stdout.trim(),
        "ok",
        "against redis-server"
    );
    redis.stop();
    let mut server = start(&[]);
    let port = server.resp_addr().expect("resp").port();
    let run = python(SHARED, &[port.to_string()]);
    assert_eq!(run.success(&[&server]).stdout.trim(), "ok");
    // Each refusal is counted once (raw RESP: no client retries).
    let script = r#"
import sys, socket, redis
port = int(sys.argv[1])
admin = redis.Redis(port=port)
admin.execute_command("ACL", "SETUSER", "bob", "on", ">pw", "~k*", "&news", "+get", "+publish")
def counts():
    i = admin.info("stats")
    return [i["acl_access_denied_" + k] for k in ("auth", "cmd", "key", "channel")]
s = socket.create_connection(("127.0.0.1", port))
def send(line):
    s.sendall(line.encode() + b"\r\n")
    return s.recv(1000)
before = counts()
assert send("AUTH bob bad").startswith(b"-WRONGPASS")
assert send("AUTH bob pw") == b"+OK\r\n"
assert send("SET k1 v").startswith(b"-NOPERM")
assert send("GET x").startswith(b"-NOPERM")
assert send("PUBLISH other m").startswith(b"-NOPERM")
assert send("GET k1").startswith(b"$")
after = counts()
print(*[a - b for a, b in zip(after, before)])
"#;
    let run = python(script, &[port.to_string()]);
    let out = run.success(&[&server]).stdout;
    assert_eq!(out.trim(), "1 1 1 1", "{out}");
    assert_healthy(&mut server);
}

#[test]
fn users_from_an_acl_file_and_requirepass_for_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("users.acl");
    std::fs::write(
        &file,
        "# readers and writers\nuser reader on >r ~cache:* +@read +@connection\nuser writer on >w ~* +@all -@dangerous\n",
    )
    .expect("write");
    let mut server = start(&[
        "--requirepass",
        "root",
        "--aclfile",
        file.to_str().expect("utf8"),
    ]);
    let port = server.resp_addr().expect("resp").port();
    let script = r#"
import sys, redis
port = int(sys.argv[1])
try:
    redis.Redis(port=port).ping()
    raise AssertionError("no AUTH needed")
except redis.exceptions.AuthenticationError:
    pass
root = redis.Redis(port=port, password="root")
assert root.execute_command("ACL", "WHOAMI") == b"default"
w = redis.Redis(port=port, username="writer", password="w")

w.set("cache:a", "1")
w.hset("h", "f", "v")
try:
    w.flushall()
    raise AssertionError("flushall allowed")
except redis.exceptions.NoPermissionError:
    pass
r = redis.Redis(port=port, username="reader", password="r")
assert r.get("cache:a") == b"1"
assert r.ping()
for f in (lambda: r.set("cache:a", "2"), lambda: r.get("h"), lambda: r.hget("h", "f")):
    try:
        f()
        raise AssertionError("allowed")
    except redis.exceptions.NoPermissionError:
        pass
# ACL LIST shows the hashes, never the passwords.
listing = b"\n".join(root.execute_command("ACL", "LIST"))
assert b">r" not in listing and b"root" not in listing, listing
assert b"user reader on #" in listing, listing
# A user deleted while connected can do nothing more.
root.execute_command("ACL", "DELUSER", "reader")
try:
    r.get("cache:a")
    raise AssertionError("a deleted user ran a command")
except redis.exceptions.NoPermissionError:
    pass
print("ok")
"#;
    let run = python(script, &[port.to_string()]);
    assert_eq!(run.success(&[&server]).stdout.trim(), "ok");
    assert_healthy(&mut server);
}

#[test]
fn a_bad_acl_file_stops_startup_naming_the_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("users.acl");
    std::fs::write(&file, "user ok on nopass ~* +@all\nuser bad on +nosuch\n").expect("write");
    let data = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(BIN)
        .args(["-p", "0", "--resp-port", &common::free_port().to_string()])
        .arg("-H")
        .arg(data.path())
        .arg("--aclfile")
        .arg(&file)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("line 2") && err.contains("+nosuch"), "{err}");
}
