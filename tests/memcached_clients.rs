//! memcached port integration tests with real client libraries and tools: pymemcache (including
//! its serde flags, default `noreply` and `HashClient` over three servers), python-memcached,
//! meta-memcache (including hit status and last access), spymemcached (Java, 8 threads),
//! php-memcached (text and binary, `getAllKeys`), dalli (Ruby, binary), and libmemcached's
//! `memccp`, `memccat`, `memcstat` and `memcdump` (which lists every key).
//!
//! The clients come from `scripts/install-test-deps.sh` (`make deps`): a virtualenv at `.venv`
//! with pymemcache and python-memcached, and from apt libmemcached-tools, libspymemcached-java
//! and a JDK. A missing client fails the test with that hint rather than skipping it.
//!
//! Invariants: every child process has a deadline (it is killed past it) and every socket a
//! read timeout, so nothing hangs; a failure message carries the client's stdout and stderr and
//! the server's stderr; every test ends by checking the server still runs and logged no panic.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::programs::{CLIENT_DEADLINE, Run, assert_healthy, python, run_bounded, tool};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
/// Read and write timeout of every test socket.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for compiling the Java program.
const JAVAC_DEADLINE: Duration = Duration::from_secs(240);

/// Sends one memcached text command and reads lines until one of `ends` (or an error line).
fn mc_command(addr: SocketAddr, cmd: &str, ends: &[&str]) -> Vec<String> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut w = s.try_clone().unwrap();
    w.write_all(format!("{cmd}\r\n").as_bytes())
        .unwrap_or_else(|e| panic!("write {cmd:?} to {addr}: {e}"));
    let mut r = BufReader::new(s);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = r
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{cmd:?} to {addr}: read: {e} after {lines:?}"));
        assert!(
            n > 0,
            "{cmd:?} to {addr}: connection closed after {lines:?}"
        );
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        let done = ends.contains(&line.as_str())
            || line == "ERROR"
            || line.starts_with("CLIENT_ERROR")
            || line.starts_with("SERVER_ERROR");
        lines.push(line);
        if done {
            return lines;
        }
    }
}

/// One number from the server's `stats`.
fn stat(addr: SocketAddr, name: &str) -> u64 {
    let lines = mc_command(addr, "stats", &["END"]);
    let prefix = format!("STAT {name} ");
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in stats of {addr}: {lines:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{name} in stats of {addr}: {e}: {lines:?}"))
}

// ---------------------------------------------------------------------------------------------
// pymemcache

const PYMEMCACHE_SCRIPT: &str = r#"
import os, socket, sys
from pymemcache.client.base import Client
from pymemcache import serde
from pymemcache.exceptions import MemcacheClientError

host, port = sys.argv[1], int(sys.argv[2])

def check(what, got, want):
    if got != want:
        print(f"MISMATCH {what}: got {got!r}, want {want!r}")
        sys.exit(1)

def raw(cmd):
    # One command on its own connection; returns everything up to END/OK/a single reply line.
    s = socket.create_connection((host, port), timeout=30)
    s.sendall(cmd)
    buf = b""
    while not (buf.endswith(b"END\r\n") or buf.endswith(b"OK\r\n")
               or (buf.endswith(b"\r\n") and not buf.startswith(b"VALUE"))):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    return buf

c = Client((host, port), connect_timeout=10, timeout=30)

# set/get of 100-byte and 20 KB binary values (set uses pymemcache's default noreply=True; the
# following get on the same connection would read a stray reply if the server sent one).
small = os.urandom(100)
large = os.urandom(20 * 1024)
check("default set (noreply)", c.set("small", small), True)
check("default set (noreply) large", c.set("large", large), True)
check("get small", c.get("small"), small)
check("get large", c.get("large"), large)
for i in range(50):
    c.set(f"nr{i}", f"v{i}".encode())
check("get after 50 noreply sets", c.get("nr49"), b"v49")
check("set with reply", c.set("small2", small, noreply=False), True)
check("get_many", c.get_many(["small", "large", "small2", "missing"]),
      {"small": small, "large": large, "small2": small})

# add / replace / append / prepend
check("add existing", c.add("small", b"x", noreply=False), False)
check("add new", c.add("added", b"a", noreply=False), True)
check("get added", c.get("added"), b"a")
check("replace missing", c.replace("nokey", b"x", noreply=False), False)
check("replace existing", c.replace("added", b"b", noreply=False), True)
check("append", c.append("added", b"cd", noreply=False), True)
check("prepend", c.prepend("added", b"_", noreply=False), True)
check("after append/prepend", c.get("added"), b"_bcd")
check("append missing", c.append("nokey", b"x", noreply=False), False)

# gets / cas: success, then a conflict, then not found
v, token = c.gets("added")
check("gets value", v, b"_bcd")
check("cas success", c.cas("added", b"new", token, noreply=False), True)
check("after cas", c.get("added"), b"new")
check("cas conflict (stale token)", c.cas("added", b"stale", token, noreply=False), False)
check("after cas conflict", c.get("added"), b"new")
check("cas not found", c.cas("nokey", b"x", token, noreply=False), None)
v2, token2 = c.gets("added")
if token2 == token:
    print(f"MISMATCH cas unique unchanged after a cas: {token!r}")
    sys.exit(1)
c.set("other", b"1", noreply=False)
check("gets_many", c.gets_many(["added", "other"])["added"], (b"new", token2))

# incr / decr
c.set("n", b"10", noreply=False)
check("incr", c.incr("n", 5), 15)
check("decr", c.decr("n", 3), 12)
check("decr floors at 0", c.decr("n", 100), 0)
check("incr missing", c.incr("nokey", 1), None)
c.set("big", b"18446744073709551615", noreply=False)
check("incr wraps at 2^64", c.incr("big", 2), 1)
try:
    c.incr("small2", 1)
    print("MISMATCH incr on a non-numeric value did not fail")
    sys.exit(1)
except MemcacheClientError as e:
    check("incr non-numeric error", "non-numeric" in str(e), True)

# delete
check("delete", c.delete("other", noreply=False), True)
check("get deleted", c.get("other"), None)
check("delete missing", c.delete("other", noreply=False), False)

# touch and expiry on the server's manual clock (--debug-clock)
c.set("ttl", b"short", expire=5, noreply=False)
c.set("touched", b"long", expire=5, noreply=False)
check("touch", c.touch("touched", 100, noreply=False), True)
check("touch missing", c.touch("nokey", 100, noreply=False), False)
check("ttl before", c.get("ttl"), b"short")
check("advance clock", raw(b"debug_advance_clock 10\r\n"), b"OK\r\n")
check("ttl expired", c.get("ttl"), None)
check("touched survives", c.get("touched"), b"long")
check("advance clock", raw(b"debug_advance_clock 100\r\n"), b"OK\r\n")
check("touched expired", c.get("touched"), None)

# flags through pymemcache's pickle serde: bytes, str, int, pickled objects
s = Client((host, port), serde=serde.pickle_serde, connect_timeout=10, timeout=30)
values = {
    "f_bytes": (b"raw\x00bytes", 0),
    "f_str": ("héllo wörld", 16),
    "f_int": (42, 2),
    "f_obj": ({"a": [1, 2.5, "x"], "b": None}, 1),
}
for k, (v, _) in values.items():
    check(f"serde set {k}", s.set(k, v, noreply=False), True)
for k, (v, flags) in values.items():
    got = s.get(k)
    check(f"serde get {k}", got, v)
    check(f"serde type {k}", type(got), type(v))
    header = raw(f"get {k}\r\n".encode()).split(b"\r\n")[0].split()
    check(f"flags of {k} on the wire", int(header[2]), flags)
check("serde get_many", s.get_many(list(values)), {k: v for k, (v, _) in values.items()})

# set with explicit flags through the plain client, read with flags
c.set("flagged", b"x", noreply=False, flags=123456)
check("raw flags", raw(b"get flagged\r\n"), b"VALUE flagged 123456 1\r\nx\r\nEND\r\n")

print("OK")
"#;

/// Runs a Python client script (`host port` as arguments; it prints OK when every check
/// passed) against a fresh server on the manual clock, which must stay healthy.
fn python_check(script: &str) {
    let mut server = Server::start_with(
        BIN,
        Options {
            debug_clock_ms: Some(common::now_ms()),
            ..Options::default()
        },
    );
    let run = python(script, &["127.0.0.1".into(), server.port().to_string()]).success(&[&server]);
    assert!(run.stdout.contains("OK"), "{}", run.describe());
    assert_healthy(&mut server);
}

#[test]
fn pymemcache_client() {
    python_check(PYMEMCACHE_SCRIPT);
}

/// meta-memcache (a Python client that speaks only the meta protocol): values through its
/// serializer, base64 keys, modes, CAS, counters, touch, delete, leases (mg N: W then Z),
/// invalidation (md I: X W, then stale data served) and early recache (mg R). The same script
/// passes against memcached 1.6.18.
const META_MEMCACHE_SCRIPT: &str = r#"
import sys
import socket
from meta_memcache import (CacheClient, Key, LeasePolicy, RecachePolicy, RequestFlags,
                           ServerAddress, SetMode, StalePolicy, Success, Value,
                           connection_pool_factory_builder)

port = int(sys.argv[2])
c = CacheClient.cache_client_from_servers(
    servers=[ServerAddress(host="127.0.0.1", port=port)],
    connection_pool_factory_fn=connection_pool_factory_builder(),
)


def check(cond, what):
    if not cond:
        print("MISMATCH", what)
        sys.exit(1)


# Plain values through the client's serializer (str, bytes, int, dict), with TTLs.
values = {"s": "hello", "b": b"\x00\x01\xff", "i": 12345, "d": {"a": [1, 2, 3]}, "big": "x" * 300000}
for k, v in values.items():
    check(c.set(key=k, value=v, ttl=300), "set " + k)
for k, v in values.items():
    check(c.get(key=k) == v, "get " + k)
got = c.multi_get(keys=[Key(k) for k in values] + [Key("missing")])
check(got[Key("missing")] is None, "multi_get miss")
for k, v in values.items():
    check(got[Key(k)] == v, "multi_get " + k)
# Keys that are not plain text go base64 (the b flag).
weird = Key("key with spaces and \u00e9")
check(c.set(key=weird, value="w", ttl=60), "set weird key")
check(c.get(key=weird) == "w", "get weird key")

# Modes.
check(not c.set(key="s", value="x", ttl=60, set_mode=SetMode.ADD), "add existing")
check(c.set(key="new", value="n", ttl=60, set_mode=SetMode.ADD), "add new")
check(not c.set(key="never-set", value="x", ttl=60, set_mode=SetMode.REPLACE), "replace missing")
check(c.set(key="s", value="replaced", ttl=60, set_mode=SetMode.REPLACE), "replace")
check(c.get(key="s") == "replaced", "after replace")

# CAS.
v, cas = c.get_cas(key="s")
check(v == "replaced" and cas, "get_cas")
check(c.set(key="s", value="cas1", ttl=60, cas_token=cas), "cas ok")
check(not c.set(key="s", value="cas2", ttl=60, cas_token=cas), "cas conflict")
check(c.get(key="s") == "cas1", "after cas")

# Counters.
check(c.delta_initialize(key="n", delta=1, initial_value=10, initial_ttl=60), "delta init")
check(c.delta_and_get(key="n", delta=5) == 15, "delta_and_get")
check(c.delta(key="n", delta=-3), "delta down")
check(c.delta_and_get(key="n", delta=0) == 12, "after delta down")
check(c.delta_and_get(key="never-counter", delta=1) is None, "delta miss")

# Touch, delete.
check(c.touch(key="s", ttl=100), "touch")
check(not c.touch(key="never-touched", ttl=100), "touch miss")
check(c.delete(key="s"), "delete")
check(c.get(key="s") is None, "deleted")

# Leases: the first caller of a missing key wins the lease (N flag, W); a second one sees Z
# and waits, then gives up with None; once the winner fills it, everyone reads the value.
lease = LeasePolicy(ttl=30, miss_retries=2, miss_retry_wait=0.01, miss_max_retry_wait=0.02)
check(c.get_or_lease(key="leased", lease_policy=lease) is None, "lease winner sees a miss")
check(c.get_or_lease(key="leased", lease_policy=lease) is None, "lease loser waits then misses")
check(c.set(key="leased", value="filled", ttl=60), "fill leased")
check(c.get_or_lease(key="leased", lease_policy=lease) == "filled", "lease read")

# Invalidation: the item goes stale (md I); the first reader may recache (X W), stale data is
# served meanwhile; a refill clears it.
check(c.set(key="st", value="v1", ttl=60), "set st")
check(c.invalidate(key="st", stale_policy=StalePolicy(mark_stale_on_deletion_ttl=30)), "invalidate")
check(c.get(key="st") is None, "stale winner is told to recache")
check(c.get(key="st") == "v1", "stale data served to others")
check(c.set(key="st", value="v2", ttl=60), "recache st")
check(c.get(key="st") == "v2", "after refill")

# refill adds, so it only fills a missing key.
check(c.refill(key="fresh", value="f", ttl=60), "refill missing")
check(not c.refill(key="fresh", value="g", ttl=60), "refill present")
check(c.get(key="fresh") == "f", "after refill")

# Recache: when less TTL than asked remains, one reader wins a early recache (R flag).
check(c.set(key="rc", value="r", ttl=20), "set rc")
early = RecachePolicy(ttl=30)
first = c.get(key="rc", recache_policy=early)
second = c.get(key="rc", recache_policy=early)
check({first, second} == {None, "r"}, "recache: one winner, then the value (%r, %r)" % (first, second))

# Hit status and last access (h, l; u does not count as a fetch).
def meta(key, **kw):
    r = c.meta_get(Key(key), flags=RequestFlags(return_fetched=True, return_last_access=True, **kw))
    check(isinstance(r, (Success, Value)), "meta_get %s: %r" % (key, r))
    return r.flags.fetched, r.flags.last_access

check(c.set(key="hs", value="h", ttl=600), "set hs")
fetched, la = meta("hs", no_update_lru=True)
check(fetched is False and la in (0, 1), "fresh item not fetched (%r, %r)" % (fetched, la))
fetched, _ = meta("hs")
check(fetched is False, "no_update_lru did not count as a fetch")
fetched, _ = meta("hs")
check(fetched is True, "fetched once before")
check(c.get(key="hs") == "h", "get hs")
check(meta("hs")[0] is True, "still fetched")
check(c.set(key="hs", value="h2", ttl=600), "reset hs")
check(meta("hs")[0] is False, "a set starts over")
# Last access counts seconds: memkeep's test clock moves on command, memcached's by sleeping.
raw = socket.create_connection(("127.0.0.1", port))
raw.sendall(b"debug_advance_clock 5\r\n")
manual = raw.recv(100).startswith(b"OK")
if not manual:
    import time
    time.sleep(2.2)
_, la = meta("hs")
check(la == 5 if manual else la >= 1, "last access after waiting: %r" % la)
_, la = meta("hs")
check(la in (0, 1), "last access right after a fetch: %r" % la)

print("OK")
"#;

#[test]
fn meta_memcache_client() {
    python_check(META_MEMCACHE_SCRIPT);
}

const PYTHON_MEMCACHED_SCRIPT: &str = r#"
import os, socket, sys
import memcache

host, port = sys.argv[1], int(sys.argv[2])

def check(what, got, want):
    if got != want:
        print(f"MISMATCH {what}: got {got!r}, want {want!r}")
        sys.exit(1)

def advance(secs):
    s = socket.create_connection((host, port), timeout=30)
    s.sendall(f"debug_advance_clock {secs}\r\n".encode())
    buf = b""
    while not buf.endswith(b"\r\n"):
        chunk = s.recv(100)
        if not chunk:
            break
        buf += chunk
    s.close()
    check("debug_advance_clock", buf, b"OK\r\n")

mc = memcache.Client([f"{host}:{port}"], cache_cas=True, socket_timeout=30)

small = os.urandom(100)
large = os.urandom(20 * 1024)
check("set small", mc.set("small", small), True)
check("set large", mc.set("large", large), True)
check("get small", mc.get("small"), small)
check("get large", mc.get("large"), large)
check("get_multi", mc.get_multi(["small", "large", "missing"]), {"small": small, "large": large})
check("set_multi", mc.set_multi({"m1": b"one", "m2": b"two"}), [])
check("get_multi after set_multi", mc.get_multi(["m1", "m2"]), {"m1": b"one", "m2": b"two"})

check("add existing", mc.add("small", b"x"), False)
check("add new", mc.add("added", b"a"), True)
check("replace missing", mc.replace("nokey", b"x"), False)
check("replace existing", mc.replace("added", b"b"), True)
check("append", mc.append("added", b"cd"), True)
check("prepend", mc.prepend("added", b"_"), True)
check("after append/prepend", mc.get("added"), b"_bcd")

# gets / cas: python-memcached remembers the unique from gets
check("gets", mc.gets("added"), b"_bcd")
check("cas success", mc.cas("added", b"new"), True)
other = memcache.Client([f"{host}:{port}"], cache_cas=True, socket_timeout=30)
check("gets (second client)", other.gets("added"), b"new")
check("gets (first client)", mc.gets("added"), b"new")
check("set by the second client", other.set("added", b"theirs"), True)
check("cas conflict", mc.cas("added", b"mine"), False)
check("after cas conflict", mc.get("added"), b"theirs")

check("set counter", mc.set("n", "10"), True)
check("incr", mc.incr("n", 5), 15)
check("decr", mc.decr("n", 3), 12)
check("decr floors at 0", mc.decr("n", 100), 0)
check("incr missing", mc.incr("nokey"), None)

check("delete", mc.delete("m1"), 1)
check("get deleted", mc.get("m1"), None)
check("delete_multi", mc.delete_multi(["m2"]), 1)
check("get_multi after delete_multi", mc.get_multi(["m1", "m2"]), {})

check("set ttl", mc.set("ttl", b"short", time=5), True)
check("set touched", mc.set("touched", b"long", time=5), True)
check("touch", bool(mc.touch("touched", 100)), True)
check("ttl before", mc.get("ttl"), b"short")
advance(10)
check("ttl expired", mc.get("ttl"), None)
check("touched survives", mc.get("touched"), b"long")

# python-memcached's own flags: str, int and pickled objects round-trip with their types
for k, v in {"s": "héllo", "i": 7, "o": {"x": (1, 2)}, "l": [1, "two", 3.0]}.items():
    check(f"typed set {k}", mc.set(k, v), True)
    got = mc.get(k)
    check(f"typed get {k}", got, v)
    check(f"typed type {k}", type(got), type(v))

print("OK")
"#;

#[test]
fn python_memcached_client() {
    python_check(PYTHON_MEMCACHED_SCRIPT);
}

const HASHCLIENT_SCRIPT: &str = r#"
import sys
from pymemcache.client.hash import HashClient

ports = [int(p) for p in sys.argv[1:]]
c = HashClient([("127.0.0.1", p) for p in ports], connect_timeout=10, timeout=30,
               retry_attempts=3, ignore_exc=False)
N = 1000
want = {f"hk:{i}": f"value-{i}-".encode() * (1 + i % 7) for i in range(N)}
for k, v in want.items():
    if not c.set(k, v, noreply=False):
        print(f"MISMATCH set {k} failed")
        sys.exit(1)
got = {}
keys = list(want)
for i in range(0, N, 100):
    got.update(c.get_many(keys[i:i + 100]))
for k, v in want.items():
    if c.get(k) != v or got.get(k) != v:
        print(f"MISMATCH {k}: get {c.get(k)!r}, get_many {got.get(k)!r}, want {v!r}")
        sys.exit(1)
print("OK")
"#;

#[test]
fn pymemcache_hash_client_three_servers() {
    let mut servers: Vec<Server> = (0..3).map(|_| Server::start(BIN, &[])).collect();
    let args: Vec<String> = servers.iter().map(|s| s.port().to_string()).collect();
    let refs: Vec<&Server> = servers.iter().collect();
    let run = python(HASHCLIENT_SCRIPT, &args).success(&refs);
    assert!(run.stdout.contains("OK"), "{}", run.describe());
    let counts: Vec<u64> = servers
        .iter()
        .map(|s| stat(s.addr(), "curr_items"))
        .collect();
    assert!(
        counts.iter().all(|&n| n > 0),
        "every server should hold a share of the keys: curr_items {counts:?}"
    );
    assert_eq!(counts.iter().sum::<u64>(), 1000, "curr_items {counts:?}");
    for s in &mut servers {
        assert_healthy(s);
    }
}

// ---------------------------------------------------------------------------------------------
// spymemcached (Java)

const SPY_JAR: &str = "/usr/share/java/spymemcached.jar";

const SPY_PROGRAM: &str = r#"
import java.net.InetSocketAddress;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import net.spy.memcached.*;

public class SpyCheck {
    static void fail(String msg) {
        System.out.println("MISMATCH " + msg);
        System.out.flush();
        System.exit(1);
    }

    static byte[] pattern(int thread, int i, int len) {
        byte[] b = new byte[len];
        Random r = new Random(thread * 100003L + i);
        r.nextBytes(b);
        return b;
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        ConnectionFactory cf = new ConnectionFactoryBuilder()
            .setOpTimeout(30000)
            .setProtocol(ConnectionFactoryBuilder.Protocol.valueOf(args[1]))
            .build();
        final MemcachedClient c = new MemcachedClient(cf,
            Collections.singletonList(new InetSocketAddress("127.0.0.1", port)));
        try {
            run(c);
        } finally {
            c.shutdown(5, TimeUnit.SECONDS);
        }
        System.out.println("OK");
        System.exit(0);
    }

    static void run(final MemcachedClient c) throws Exception {
        final int threads = 8, per = 60;
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        List<Future<String>> results = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int th = t;
            results.add(pool.submit(() -> {
                for (int i = 0; i < per; i++) {
                    int len = (i % 2 == 0) ? 100 : 20 * 1024;
                    byte[] v = pattern(th, i, len);
                    String k = "spy:" + th + ":" + i;
                    if (!c.set(k, 0, v).get(30, TimeUnit.SECONDS)) return "set " + k;
                    Object got = c.get(k);
                    if (!(got instanceof byte[]) || !Arrays.equals((byte[]) got, v))
                        return "get " + k + " (" + len + " bytes)";
                }
                // a bulk get of this thread's keys
                List<String> keys = new ArrayList<>();
                for (int i = 0; i < per; i++) keys.add("spy:" + th + ":" + i);
                Map<String, Object> bulk = c.getBulk(keys);
                for (int i = 0; i < per; i++) {
                    int len = (i % 2 == 0) ? 100 : 20 * 1024;
                    Object got = bulk.get("spy:" + th + ":" + i);
                    if (!(got instanceof byte[]) || !Arrays.equals((byte[]) got, pattern(th, i, len)))
                        return "getBulk spy:" + th + ":" + i;
                }
                // a shared counter: every thread adds 100 times
                for (int i = 0; i < 100; i++) {
                    if (c.incr("spy:counter", 1, 1) < 0) return "incr spy:counter";
                }
                return null;
            }));
        }
        for (Future<String> f : results) {
            String err = f.get(150, TimeUnit.SECONDS);
            if (err != null) fail(err);
        }
        pool.shutdown();
        // incr with default 1 creates the counter at 1 on the first call: 8*100 calls -> 800
        Object counter = c.get("spy:counter");
        if (!"800".equals(String.valueOf(counter).trim())) fail("counter " + counter);

        // incr / decr
        if (!c.set("n", 0, "10").get()) fail("set n");
        if (c.incr("n", 5) != 15) fail("incr n");
        if (c.decr("n", 3) != 12) fail("decr n");
        if (c.decr("n", 100) != 0) fail("decr floors at 0");
        if (c.incr("missing", 1) != -1) fail("incr missing");

        // gets / cas: success, conflict, not found
        if (!c.set("casme", 0, "one").get()) fail("set casme");
        CASValue<Object> cv = c.gets("casme");
        if (!"one".equals(cv.getValue())) fail("gets value " + cv.getValue());
        if (c.cas("casme", cv.getCas(), "two") != CASResponse.OK) fail("cas ok");
        if (!"two".equals(c.get("casme"))) fail("after cas");
        if (c.cas("casme", cv.getCas(), "three") != CASResponse.EXISTS) fail("cas conflict");
        if (!"two".equals(c.get("casme"))) fail("after cas conflict");
        if (c.cas("nokey", cv.getCas(), "x") != CASResponse.NOT_FOUND) fail("cas not found");

        // add / replace / append / prepend / delete / touch
        if (c.add("casme", 0, "x").get()) fail("add existing");
        if (!c.add("added", 0, "b").get()) fail("add new");
        if (!c.append(0, "added", "c").get()) fail("append");
        if (!c.prepend(0, "added", "a").get()) fail("prepend");
        if (!"abc".equals(c.get("added"))) fail("after append/prepend " + c.get("added"));
        if (!c.touch("added", 100).get()) fail("touch");
        if (!c.delete("added").get()) fail("delete");
        if (c.get("added") != null) fail("get deleted");

        // spymemcached's own serialization: Integer, Long and Serializable objects via flags
        c.set("int", 0, 12345).get();
        if (!Integer.valueOf(12345).equals(c.get("int"))) fail("Integer " + c.get("int"));
        c.set("long", 0, 1234567890123L).get();
        if (!Long.valueOf(1234567890123L).equals(c.get("long"))) fail("Long " + c.get("long"));
        HashMap<String, Integer> m = new HashMap<>();
        m.put("a", 1);
        c.set("obj", 0, m).get();
        if (!m.equals(c.get("obj"))) fail("object " + c.get("obj"));
    }
}
"#;

/// The spymemcached jar and its dependencies (Debian's libspymemcached-java), as a classpath.
fn spy_classpath() -> String {
    assert!(
        Path::new(SPY_JAR).exists(),
        "{SPY_JAR} is missing (Debian package libspymemcached-java): \
         run ./scripts/install-test-deps.sh (make deps)"
    );
    // The jar's manifest Class-Path names its dependencies (slf4j etc.) relative to itself.
    SPY_JAR.to_string()
}

/// spymemcached with its text connection factory and with its binary one, each against a fresh
/// server.
#[test]
fn spymemcached_client_text_and_binary() {
    let cp = spy_classpath();
    tool("javac");
    tool("java");
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("SpyCheck.java"), SPY_PROGRAM).expect("write java");
    for protocol in ["TEXT", "BINARY"] {
        let mut server = Server::start(BIN, &[]);
        if protocol == "TEXT" {
            let mut javac = Command::new("javac");
            javac
                .args(["-nowarn", "-cp", &cp, "-d"])
                .arg(dir.path())
                .arg(dir.path().join("SpyCheck.java"));
            javac_run(javac).success(&[&server]);
        }
        let mut java = Command::new("java");
        java.arg("-cp")
            .arg(format!("{cp}:{}", dir.path().display()))
            .args(["-Xss512k", "-XX:+UseSerialGC", "SpyCheck"])
            .arg(server.port().to_string())
            .arg(protocol);
        let run = run_bounded(java, b"", CLIENT_DEADLINE).success(&[&server]);
        assert!(run.stdout.contains("OK"), "{protocol}: {}", run.describe());
        assert_healthy(&mut server);
    }
}

fn javac_run(cmd: Command) -> Run {
    run_bounded(cmd, b"", JAVAC_DEADLINE)
}

// ---------------------------------------------------------------------------------------------
// libmemcached tools

fn servers_arg(server: &Server) -> String {
    format!("--servers=127.0.0.1:{}", server.port())
}

#[test]
fn libmemcached_tools() {
    let mut server = Server::start(BIN, &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    // A 200 KB binary file (every byte value, including \r\n sequences).
    let content: Vec<u8> = (0..200 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, &content).expect("write payload");

    // memccp stores the file under its base name.
    let mut cp = Command::new(tool("memccp"));
    cp.arg(servers_arg(&server)).arg(&file);
    cp.current_dir(dir.path());
    run_bounded(cp, b"", CLIENT_DEADLINE).success(&[&server]);
    assert_eq!(stat(server.addr(), "curr_items"), 1);

    // memccat writes it back byte for byte (to a file: on stdout memccat appends a newline,
    // against real memcached too).
    let back = dir.path().join("back.bin");
    let mut cat = Command::new(tool("memccat"));
    cat.arg(servers_arg(&server))
        .arg(format!("--file={}", back.display()))
        .arg("payload.bin");
    run_bounded(cat, b"", CLIENT_DEADLINE).success(&[&server]);
    let got = std::fs::read(&back).expect("read memccat's file");
    assert!(
        got == content,
        "memccat returned {} bytes, not the {} stored (or different bytes)",
        got.len(),
        content.len()
    );

    // memcstat shows the server's stats, curr_items among them.
    let mut st = Command::new(tool("memcstat"));
    st.arg(servers_arg(&server));
    let run = run_bounded(st, b"", CLIENT_DEADLINE).success(&[&server]);
    let line = run
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("curr_items"))
        .unwrap_or_else(|| panic!("no curr_items in memcstat output:\n{}", run.describe()));
    assert!(
        line.split(':').nth(1).map(str::trim) == Some("1"),
        "memcstat curr_items should be 1: {line:?}\n{}",
        run.describe()
    );

    // memcdump walks `stats items` / `stats cachedump <class> 0`: memkeep reports its store as
    // class 1 and lists every key (memcached lists only the items in its cold LRU). 3000 keys
    // take several of the dump's chunks.
    let keys: Vec<String> = (0..3000).map(|i| format!("dump:{i:05}")).collect();
    let mut conn = TcpStream::connect(server.addr()).expect("connect");
    let mut pipeline = Vec::new();
    for k in &keys {
        pipeline.extend_from_slice(format!("set {k} 0 0 1 noreply\r\nx\r\n").as_bytes());
    }
    // `version` is answered after the writes before it are acknowledged.
    pipeline.extend_from_slice(b"version\r\n");
    conn.write_all(&pipeline).expect("send sets");
    conn.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut reply = String::new();
    BufReader::new(&conn)
        .read_line(&mut reply)
        .expect("version reply");
    assert!(reply.starts_with("VERSION "), "{reply:?}");
    let mut dump = Command::new(tool("memcdump"));
    dump.arg(servers_arg(&server));
    let run = run_bounded(dump, b"", CLIENT_DEADLINE).success(&[&server]);
    let mut listed: Vec<&str> = run.stdout.lines().map(str::trim).collect();
    listed.sort_unstable();
    let mut want: Vec<&str> = keys.iter().map(String::as_str).collect();
    want.push("payload.bin");
    want.sort_unstable();
    assert!(
        listed == want,
        "memcdump listed {} keys, want {} (every key once): {}",
        listed.len(),
        want.len(),
        run.describe()
    );
    assert_healthy(&mut server);
}

// ---------------------------------------------------------------------------------------------
// php-memcached and dalli (Debian's php-memcached and ruby-dalli)

/// php-memcached (libmemcached underneath): storage, gets, CAS, counters, and `getAllKeys()`,
/// which walks `stats items` / `stats cachedump`. In text mode it lists every key; in binary
/// mode libmemcached refuses the dump before sending anything (`ACTION NOT SUPPORTED`, against
/// memcached too), while the binary protocol's storage and gets work. `php` runs it with `host
/// port mode` and it prints OK when every check passed.
const PHP_SCRIPT: &str = r#"<?php
[$_, $host, $port, $mode] = $argv;
$bin = $mode === "binary";
function check($cond, $what) { if (!$cond) { echo "MISMATCH $what\n"; exit(1); } }
$m = new Memcached();
$m->setOption(Memcached::OPT_BINARY_PROTOCOL, $bin);
$m->setOption(Memcached::OPT_COMPRESSION, false);
$m->addServer($host, (int)$port);
check($m->flush(), "flush");
$keys = [];
for ($i = 0; $i < 700; $i++) {
    $k = "$mode:k$i";
    $keys[] = $k;
    check($m->set($k, "v$i", 600), "set $k");
}
check($m->get("$mode:k7") === "v7", "get");
check($m->get("$mode:none") === false && $m->getResultCode() === Memcached::RES_NOTFOUND, "miss");
check($m->set("$mode:arr", [1, "two" => 2]), "set array");
check($m->get("$mode:arr") === [1, "two" => 2], "array through flags");
$keys[] = "$mode:arr";
$got = $m->getMulti(["$mode:k1", "$mode:k2", "$mode:none"]);
check($got === ["$mode:k1" => "v1", "$mode:k2" => "v2"], "getMulti");
$r = $m->get("$mode:k3", null, Memcached::GET_EXTENDED);
check($r["value"] === "v3" && $r["cas"] > 0, "get with cas");
check($m->cas($r["cas"], "$mode:k3", "w3"), "cas");
check(!$m->cas($r["cas"], "$mode:k3", "x3"), "cas conflict");
check($m->get("$mode:k3") === "w3", "after cas");
check($m->add("$mode:n", 10), "add counter");
$keys[] = "$mode:n";
check($m->increment("$mode:n", 5) === 15, "increment");
check($m->decrement("$mode:n", 20) === 0, "decrement floors at 0");
check(!$m->add("$mode:k1", "x"), "add existing");
check($m->touch("$mode:k4", 100), "touch");
check($m->delete("$mode:k5"), "delete");
$keys = array_values(array_diff($keys, ["$mode:k5"]));
$all = $m->getAllKeys();
if ($bin) {
    check($all === false && $m->getResultCode() === Memcached::RES_NOT_SUPPORTED,
          "getAllKeys over binary: libmemcached does not dump over binary");
} else {
    check(is_array($all), "getAllKeys: " . $m->getResultMessage());
    sort($all);
    sort($keys);
    check($all === $keys, "getAllKeys lists every key (" . count($all) . " of " . count($keys) . ")");
}
echo "OK\n";
"#;

#[test]
fn php_memcached_text_and_binary() {
    let mut server = Server::start(BIN, &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("check.php");
    std::fs::write(&path, PHP_SCRIPT).expect("write script");
    for mode in ["text", "binary"] {
        let mut cmd = Command::new(tool("php"));
        cmd.arg(&path)
            .arg("127.0.0.1")
            .arg(server.port().to_string())
            .arg(mode);
        let run = run_bounded(cmd, b"", CLIENT_DEADLINE).success(&[&server]);
        assert!(
            run.stdout.contains("OK"),
            "php-memcached ({mode}): {}",
            run.describe()
        );
    }
    assert_healthy(&mut server);
}

/// dalli (Ruby; Debian's ruby-dalli 3.0.6, which speaks the binary protocol only: its meta
/// protocol and `get_with_metadata` hit status came in later versions): values through its
/// serializer, get_multi, CAS, counters, touch/gat, delete, and `stats(:items)`, whose class 1
/// counts the store's items. Run with `host port`; prints OK when every check passed.
const DALLI_SCRIPT: &str = r##"
require "dalli"
host, port = ARGV
def check(cond, what)
  unless cond
    puts "MISMATCH #{what}"
    exit 1
  end
end
dc = Dalli::Client.new("#{host}:#{port}", compress: false, socket_timeout: 10)
check(dc.flush, "flush")
check(dc.set("s", "hello", 300), "set")
check(dc.get("s") == "hello", "get")
check(dc.get("missing").nil?, "miss")
check(dc.set("h", { "a" => [1, 2, 3] }), "set hash")
check(dc.get("h") == { "a" => [1, 2, 3] }, "marshalled value")
check(dc.set("raw", "bytes\x00\xff".b, 0, raw: true), "set raw")
check(dc.get("raw") == "bytes\x00\xff".b, "get raw")
check(dc.get_multi("s", "h", "missing") == { "s" => "hello", "h" => { "a" => [1, 2, 3] } },
      "get_multi")
check(!dc.add("s", "x"), "add existing")
check(dc.add("new", "n"), "add new")
dc.replace("never", "x")
check(dc.get("never").nil?, "replace of a missing key stores nothing")
check(dc.cas("s") { |v| v + "!" }, "cas")
check(dc.get("s") == "hello!", "after cas")
v, cas = dc.get_cas("s")
check(v == "hello!" && cas > 0, "get_cas")
check(dc.set_cas("s", "again", cas), "set_cas")
check(!dc.set_cas("s", "stale", cas), "set_cas conflict")
check(dc.incr("n", 1, nil, 10) == 10, "incr creates with initial")
check(dc.incr("n", 5) == 15, "incr")
check(dc.decr("n", 20) == 0, "decr floors at 0")
check(dc.touch("s", 100), "touch")
check(dc.gat("s", 100) == "again", "gat")
check(dc.delete("new"), "delete")
check(dc.get("new").nil?, "deleted")
items = dc.stats(:items).values.first
# s, h, raw, n (memcached may also count flushed items it has not reclaimed yet)
check(items && items["items:1:number"].to_i == 4, "stats items: #{items.inspect}")
stats = dc.stats.values.first
check(stats["curr_items"].to_i == 4, "stats curr_items")
puts "OK"
"##;

#[test]
fn dalli_client() {
    let mut server = Server::start(BIN, &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("check.rb");
    std::fs::write(&path, DALLI_SCRIPT).expect("write script");
    let mut cmd = Command::new(tool("ruby"));
    cmd.arg(&path)
        .arg("127.0.0.1")
        .arg(server.port().to_string());
    let run = run_bounded(cmd, b"", CLIENT_DEADLINE).success(&[&server]);
    assert!(run.stdout.contains("OK"), "dalli: {}", run.describe());
    assert_healthy(&mut server);
}
