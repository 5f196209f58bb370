//! RESP port integration tests with real clients: redis-py (RESP2 and RESP3), redis-cli (one-shot,
//! `--pipe` and an interactive session in a pty), redis-benchmark, plus raw-socket checks of
//! framing errors, HELLO and `--requirepass`, and of the keyspace shared with the memcached port.
//!
//! The clients come from `scripts/install-test-deps.sh` (`make deps`): redis-tools from apt, and
//! a virtualenv at `.venv` with redis-py. A missing client fails the test with that hint rather
//! than skipping it.
//!
//! Invariants: every socket has a read timeout and every child process a deadline (it is killed
//! past it), so nothing hangs; a test's failure message carries the client's stdout and stderr
//! and the server's stderr; every test ends by checking the server is still running and logged
//! no panic.

mod common;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::programs::{CLIENT_DEADLINE, Run, assert_healthy, python, run_bounded, tool};
use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
/// Read and write timeout of every test socket.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
const NOAUTH: &str = "NOAUTH Authentication required.";

// ---------------------------------------------------------------------------------------------
// Servers and client programs

fn start_resp(args: &[&str]) -> Server {
    Server::start_with(
        BIN,
        Options {
            args: args.iter().map(|s| s.to_string()).collect(),
            resp: true,
            ..Options::default()
        },
    )
}

fn resp_port(server: &Server) -> u16 {
    server.resp_addr().expect("server has a RESP port").port()
}

fn redis_cli(port: u16, args: &[&str], stdin: &[u8]) -> Run {
    let mut cmd = Command::new(tool("redis-cli"));
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args);
    run_bounded(cmd, stdin, CLIENT_DEADLINE)
}

// ---------------------------------------------------------------------------------------------
// A raw RESP client

#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// `$-1`, `*-1` (RESP2) or `_` (RESP3).
    Nil,
    Array(Vec<Resp>),
    Map(Vec<(Resp, Resp)>),
    /// Any other RESP3 type: its marker and line.
    Other(char, String),
}

fn bulk(s: &str) -> Resp {
    Resp::Bulk(s.as_bytes().to_vec())
}

fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn open_stream(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// A connection that records every byte it reads, so tests can check exact framing.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    raw: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = open_stream(addr);
        Conn {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
            raw: Vec::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.writer
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("write of {} bytes: {e}", bytes.len()));
    }

    /// Sends one command (split on spaces) as a RESP array and reads its reply.
    fn cmd(&mut self, line: &str) -> Resp {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        self.cmd_args(&args)
    }

    fn cmd_args(&mut self, args: &[&[u8]]) -> Resp {
        self.send(&encode(args));
        self.reply()
            .unwrap_or_else(|e| panic!("reply to {:?}: {e}", String::from_utf8_lossy(args[0])))
    }

    /// The bytes read since the last call.
    fn take_raw(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.raw)
    }

    fn line(&mut self) -> io::Result<String> {
        let mut buf = Vec::new();
        let n = self.reader.read_until(b'\n', &mut buf)?;
        self.raw.extend_from_slice(&buf);
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        let text = buf
            .strip_suffix(b"\r\n")
            .ok_or_else(|| io::Error::other(format!("line without CRLF: {buf:?}")))?;
        Ok(String::from_utf8_lossy(text).into_owned())
    }

    fn reply(&mut self) -> io::Result<Resp> {
        let line = self.line()?;
        let (marker, rest) = line.split_at(line.chars().next().map_or(0, char::len_utf8));
        let number = |s: &str| -> io::Result<i64> {
            s.parse()
                .map_err(|_| io::Error::other(format!("bad length or integer {line:?}")))
        };
        Ok(match marker {
            "+" => Resp::Simple(rest.to_string()),
            "-" => Resp::Error(rest.to_string()),
            ":" => Resp::Int(number(rest)?),
            "_" => Resp::Nil,
            "$" => {
                let n = number(rest)?;
                if n < 0 {
                    return Ok(Resp::Nil);
                }
                let mut data = vec![0u8; n as usize + 2];
                self.reader.read_exact(&mut data)?;
                self.raw.extend_from_slice(&data);
                if !data.ends_with(b"\r\n") {
                    return Err(io::Error::other("bulk not followed by CRLF"));
                }
                data.truncate(n as usize);
                Resp::Bulk(data)
            }
            "*" | "~" | ">" => {
                let n = number(rest)?;
                if n < 0 {
                    return Ok(Resp::Nil);
                }
                let mut items = Vec::new();
                for _ in 0..n {
                    items.push(self.reply()?);
                }
                Resp::Array(items)
            }
            "%" => {
                let n = number(rest)?;
                let mut pairs = Vec::new();
                for _ in 0..n {
                    let k = self.reply()?;
                    let v = self.reply()?;
                    pairs.push((k, v));
                }
                Resp::Map(pairs)
            }
            "=" => {
                // Verbatim string: `=N\r\ntxt:...\r\n`; keep the text after the format.
                let n = number(rest)?;
                let mut data = vec![0u8; n as usize + 2];
                self.reader.read_exact(&mut data)?;
                self.raw.extend_from_slice(&data);
                data.truncate(n as usize);
                Resp::Bulk(data.get(4..).unwrap_or_default().to_vec())
            }
            _ => Resp::Other(marker.chars().next().unwrap_or('?'), rest.to_string()),
        })
    }

    /// Everything until the server closes the connection; panics if it stays open.
    fn read_to_close(&mut self) -> Vec<u8> {
        let mut rest = Vec::new();
        match self.reader.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!(
                "expected the server to close the connection, got {e} after {:?}",
                String::from_utf8_lossy(&rest)
            ),
        }
        self.raw.extend_from_slice(&rest);
        rest
    }
}

/// A memcached text-protocol connection on the same server.
struct Mc {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Mc {
    fn open(addr: SocketAddr) -> Mc {
        let s = open_stream(addr);
        Mc {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("memcached write");
    }

    fn line(&mut self) -> String {
        let mut buf = String::new();
        self.reader.read_line(&mut buf).expect("memcached read");
        assert!(buf.ends_with("\r\n"), "memcached reply line {buf:?}");
        buf.truncate(buf.len() - 2);
        buf
    }

    /// Sends `request` and reads `n` reply lines.
    fn ask(&mut self, request: &str, n: usize) -> Vec<String> {
        self.send(request.as_bytes());
        (0..n).map(|_| self.line()).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// redis-py

/// Strings, keys, server commands, pipelines and errors through redis-py. Args: port, protocol.
/// Exits non-zero with a FAIL line at the first wrong answer. Also valid against redis-server
/// 7.0 (that is how it was checked).
const REDIS_PY_STRINGS: &str = r##"
import sys, time
import redis

port, proto = int(sys.argv[1]), int(sys.argv[2])
r = redis.Redis(host="127.0.0.1", port=port, protocol=proto, socket_timeout=30)
checks = 0

def fail(msg):
    print(f"FAIL (protocol {proto}) {msg}", file=sys.stderr)
    sys.exit(1)

def eq(got, want, what):
    global checks
    checks += 1
    if got != want:
        fail(f"{what}: got {got!r}, want {want!r}")

def ok(cond, what):
    eq(bool(cond), True, what)

def raises(fn, needle, what):
    global checks
    checks += 1
    try:
        v = fn()
    except redis.ResponseError as e:
        if needle not in str(e):
            fail(f"{what}: error {str(e)!r} lacks {needle!r}")
        return str(e)
    fail(f"{what}: expected ResponseError, got {v!r}")

def wipe():
    keys = r.keys("*")
    if keys:
        r.delete(*keys)
    # DBSIZE counts expired keys until they are reclaimed (memkeep's sweep runs every second;
    # Redis reclaims on access or in its expire cycle): bounded wait.
    deadline = time.time() + 10
    while r.dbsize() != 0 and time.time() < deadline:
        time.sleep(0.05)
    eq(r.dbsize(), 0, "DBSIZE after deleting every key")

# --- connection and server
eq(r.ping(), True, "PING")
eq(r.echo("hi there"), b"hi there", "ECHO")
wipe()
info = r.info()
ok(isinstance(info, dict), f"INFO parses to a dict: {type(info)}")
ok(str(info.get("redis_version", "")).startswith("7."), f"INFO redis_version: {info.get('redis_version')!r}")
eq(info.get("tcp_port"), port, "INFO tcp_port")
server = r.info("server")
ok("redis_version" in server and "uptime_in_seconds" in server, f"INFO server: {sorted(server)}")
eq(r.client_getname(), None, "CLIENT GETNAME before SETNAME")
eq(r.client_setname("tester"), True, "CLIENT SETNAME")
name = r.client_getname()
eq(name.encode() if isinstance(name, str) else name, b"tester", "CLIENT GETNAME")
eq(r.config_get("port"), {"port": str(port)}, "CONFIG GET port")
eq(r.config_get("nosuchparam"), {}, "CONFIG GET unknown")
secs, usecs = r.time()
ok(abs(secs - time.time()) < 60 and 0 <= usecs < 1_000_000, f"TIME {secs} {usecs}")

# --- SET and its options
eq(r.set("s", "v1"), True, "SET")
eq(r.get("s"), b"v1", "GET")
eq(r.get("missing"), None, "GET missing")
eq(r.set("s", "v2", nx=True), None, "SET NX on an existing key")
eq(r.get("s"), b"v1", "SET NX kept the value")
eq(r.set("n1", "x", nx=True), True, "SET NX on a new key")
eq(r.set("nope", "x", xx=True), None, "SET XX on a missing key")
eq(r.exists("nope"), 0, "SET XX did not create")
eq(r.set("s", "v3", xx=True), True, "SET XX on an existing key")
eq(r.set("s", "v4", get=True), b"v3", "SET GET returns the old value")
eq(r.get("s"), b"v4", "SET GET stored the new value")
eq(r.set("fresh", "v", get=True), None, "SET GET on a missing key")
eq(r.set("e", "v", ex=100), True, "SET EX")
ok(95 <= r.ttl("e") <= 100, f"TTL after SET EX 100: {r.ttl('e')}")
eq(r.set("p", "v", px=50000), True, "SET PX")
ok(45000 <= r.pttl("p") <= 50000, f"PTTL after SET PX 50000: {r.pttl('p')}")
eq(r.set("e", "w", keepttl=True), True, "SET KEEPTTL")
ok(95 <= r.ttl("e") <= 100, "SET KEEPTTL kept the TTL")
eq(r.get("e"), b"w", "SET KEEPTTL set the value")
eq(r.set("e", "z"), True, "plain SET")
eq(r.ttl("e"), -1, "plain SET clears the TTL")
eq(r.set("nxex", "v", nx=True, ex=100), True, "SET NX EX")
ok(95 <= r.ttl("nxex") <= 100, "SET NX EX TTL")
raises(lambda: r.execute_command("SET", "s", "v", "EX", "0"), "invalid expire time in 'set' command", "SET EX 0")
raises(lambda: r.execute_command("SET", "s", "v", "EX", "x"), "value is not an integer or out of range", "SET EX x")
raises(lambda: r.execute_command("SET", "s", "v", "NX", "XX"), "syntax error", "SET NX XX")
raises(lambda: r.execute_command("SET", "s", "v", "EX", "10", "PX", "10"), "syntax error", "SET EX PX")
eq(r.set("px1", "v", px=1), True, "SET PX 1")
time.sleep(0.05)
eq(r.get("px1"), None, "SET PX 1 has expired 50 ms later")
eq(r.exists("px1"), 0, "expired key does not exist")

# --- SETNX, SETEX, PSETEX, GETSET, GETDEL, GETEX
eq(r.setnx("snx", "a"), True, "SETNX on a new key")
eq(r.setnx("snx", "b"), False, "SETNX on an existing key")
eq(r.get("snx"), b"a", "SETNX kept the value")
eq(r.setex("sx", 100, "v"), True, "SETEX")
eq(r.get("sx"), b"v", "SETEX value")
ok(95 <= r.ttl("sx") <= 100, "SETEX TTL")
eq(r.psetex("psx", 100000, "v"), True, "PSETEX")
ok(95000 <= r.pttl("psx") <= 100000, "PSETEX PTTL")
raises(lambda: r.setex("sx", 0, "v"), "invalid expire time in 'setex' command", "SETEX 0")
raises(lambda: r.psetex("sx", -5, "v"), "invalid expire time in 'psetex' command", "PSETEX -5")
eq(r.getset("snx", "c"), b"a", "GETSET returns the old value")
eq(r.get("snx"), b"c", "GETSET stored the new value")
eq(r.getset("gs-new", "c"), None, "GETSET on a missing key")
r.set("gs-ttl", "v", ex=100)
r.getset("gs-ttl", "w")
eq(r.ttl("gs-ttl"), -1, "GETSET clears the TTL")
eq(r.getdel("snx"), b"c", "GETDEL")
eq(r.getdel("snx"), None, "GETDEL again")
eq(r.exists("snx"), 0, "GETDEL deleted")
r.set("gx", "v")
eq(r.getex("gx", ex=100), b"v", "GETEX EX")
ok(95 <= r.ttl("gx") <= 100, "GETEX EX set the TTL")
eq(r.getex("gx", persist=True), b"v", "GETEX PERSIST")
eq(r.ttl("gx"), -1, "GETEX PERSIST cleared the TTL")
eq(r.getex("gx", px=100000), b"v", "GETEX PX")
ok(95000 <= r.pttl("gx") <= 100000, "GETEX PX set the TTL")
eq(r.getex("gx"), b"v", "GETEX without options")
ok(r.ttl("gx") > 0, "GETEX without options keeps the TTL")
eq(r.getex("gx", exat=int(time.time()) + 1000), b"v", "GETEX EXAT")
ok(990 <= r.ttl("gx") <= 1000, "GETEX EXAT TTL")
eq(r.getex("missing"), None, "GETEX on a missing key")
raises(lambda: r.execute_command("GETEX", "gx", "EX"), "syntax error", "GETEX EX without a value")

# --- MSET, MGET, MSETNX
eq(r.mset({"m1": "1", "m2": "2", "m3": "3"}), True, "MSET")
eq(r.mget("m1", "m2", "nope", "m3"), [b"1", b"2", None, b"3"], "MGET")
eq(r.msetnx({"m3": "x", "m4": "4"}), False, "MSETNX with an existing key")
eq(r.exists("m4"), 0, "MSETNX set nothing")
eq(r.get("m3"), b"3", "MSETNX left the existing key")
eq(r.msetnx({"m4": "4", "m5": "5"}), True, "MSETNX with new keys")
eq(r.mget(["m4", "m5"]), [b"4", b"5"], "MSETNX stored both")
raises(lambda: r.execute_command("MSET", "a", "1", "b"), "wrong number of arguments for 'mset' command", "MSET odd")

# --- counters
eq(r.incr("c"), 1, "INCR on a missing key")
eq(r.incr("c"), 2, "INCR")
eq(r.incrby("c", 10), 12, "INCRBY")
eq(r.decr("c"), 11, "DECR")
eq(r.decrby("c", 20), -9, "DECRBY")
eq(r.get("c"), b"-9", "a counter is stored as decimal text")
eq(r.incrby("c", -1), -10, "INCRBY negative")
eq(r.incrbyfloat("f", 1.5), 1.5, "INCRBYFLOAT on a missing key")
eq(r.incrbyfloat("f", "0.25"), 1.75, "INCRBYFLOAT")
eq(r.get("f"), b"1.75", "INCRBYFLOAT stored text")
r.set("f2", "10.50")
eq(r.incrbyfloat("f2", 0.1), 10.6, "INCRBYFLOAT 10.50 + 0.1")
eq(r.get("f2"), b"10.6", "INCRBYFLOAT shortest text")
eq(r.incrbyfloat("f2", -10.6), 0.0, "INCRBYFLOAT to zero")
eq(r.get("f2"), b"0", "INCRBYFLOAT zero text")
r.set("big", str(2**63 - 1))
raises(lambda: r.incr("big"), "increment or decrement would overflow", "INCR past i64::MAX")
eq(r.get("big"), str(2**63 - 1).encode(), "an overflowing INCR changes nothing")
r.set("word", "hello")
e = raises(lambda: r.incr("word"), "value is not an integer or out of range", "INCR on a non-integer")
eq(e, "value is not an integer or out of range", "INCR non-integer message")
raises(lambda: r.incrby("c", "x"), "value is not an integer or out of range", "INCRBY with a bad delta")
raises(lambda: r.incrbyfloat("word", 1), "value is not a valid float", "INCRBYFLOAT on a non-float")
r.set("spaced", " 1")
raises(lambda: r.incr("spaced"), "value is not an integer or out of range", "INCR on ' 1'")
eq(r.get("word"), b"hello", "a failed INCR leaves the value")

# --- APPEND, STRLEN, GETRANGE, SETRANGE
eq(r.append("ap", "Hello"), 5, "APPEND on a missing key")
eq(r.append("ap", " World"), 11, "APPEND")
eq(r.get("ap"), b"Hello World", "APPEND value")
eq(r.strlen("ap"), 11, "STRLEN")
eq(r.strlen("missing"), 0, "STRLEN on a missing key")
eq(r.getrange("ap", 0, 4), b"Hello", "GETRANGE 0 4")
eq(r.getrange("ap", -5, -1), b"World", "GETRANGE -5 -1")
eq(r.getrange("ap", 6, 100), b"World", "GETRANGE past the end")
eq(r.getrange("ap", 5, 3), b"", "GETRANGE start > end")
eq(r.getrange("missing", 0, -1), b"", "GETRANGE on a missing key")
eq(r.setrange("ap", 6, "Redis"), 11, "SETRANGE")
eq(r.get("ap"), b"Hello Redis", "SETRANGE value")
eq(r.setrange("sr", 3, "x"), 4, "SETRANGE past the end pads")
eq(r.get("sr"), b"\x00\x00\x00x", "SETRANGE pads with zero bytes")
raises(lambda: r.setrange("sr", -1, "x"), "offset is out of range", "SETRANGE negative offset")
eq(r.setrange("sr-empty", 5, ""), 0, "SETRANGE of nothing on a missing key")
eq(r.exists("sr-empty"), 0, "SETRANGE of nothing did not create the key")

# --- keys
eq(r.delete("m1", "m2", "nope"), 2, "DEL counts the deleted keys")
eq(r.exists("m1"), 0, "DEL deleted")
eq(r.exists("m3", "m3", "m4", "nope"), 3, "EXISTS counts repeats")
eq(r.type("m3"), b"string", "TYPE of a string")
eq(r.type("nope"), b"none", "TYPE of a missing key")
eq(r.expire("m3", 100), True, "EXPIRE")
ok(95 <= r.ttl("m3") <= 100, "TTL after EXPIRE")
eq(r.expire("nope", 100), False, "EXPIRE on a missing key")
eq(r.pexpire("m3", 200000), True, "PEXPIRE")
ok(195000 <= r.pttl("m3") <= 200000, "PTTL after PEXPIRE")
at = int(time.time()) + 1000
eq(r.expireat("m3", at), True, "EXPIREAT")
ok(990 <= r.ttl("m3") <= 1000, "TTL after EXPIREAT")
eq(r.pexpireat("m3", at * 1000), True, "PEXPIREAT")
ok(990 <= r.ttl("m3") <= 1000, "TTL after PEXPIREAT")
eq(r.persist("m3"), True, "PERSIST")
eq(r.ttl("m3"), -1, "TTL after PERSIST")
eq(r.pttl("m3"), -1, "PTTL without a TTL")
eq(r.persist("m3"), False, "PERSIST without a TTL")
eq(r.ttl("nope"), -2, "TTL of a missing key")
eq(r.pttl("nope"), -2, "PTTL of a missing key")
eq(r.expire("m3", 100, nx=True), True, "EXPIRE NX without a TTL")
eq(r.expire("m3", 50, nx=True), False, "EXPIRE NX with a TTL")
eq(r.expire("m3", 50, gt=True), False, "EXPIRE GT with a smaller TTL")
eq(r.expire("m3", 500, gt=True), True, "EXPIRE GT with a bigger TTL")
ok(495 <= r.ttl("m3") <= 500, "EXPIRE GT set the TTL")
eq(r.expire("m3", 10, lt=True), True, "EXPIRE LT with a smaller TTL")
eq(r.expire("m3", 0), True, "EXPIRE 0")
eq(r.exists("m3"), 0, "EXPIRE 0 deletes the key")
eq(r.get("m3"), None, "EXPIRE 0 deleted the value")
r.set("old", "v", ex=100)
eq(r.rename("old", "new"), True, "RENAME")
eq(r.get("new"), b"v", "RENAME moved the value")
eq(r.exists("old"), 0, "RENAME removed the old key")
ok(95 <= r.ttl("new") <= 100, "RENAME keeps the TTL")
raises(lambda: r.rename("old", "x"), "no such key", "RENAME of a missing key")
r.set("other", "o")
eq(r.renamenx("new", "other"), False, "RENAMENX onto an existing key")
eq(r.get("other"), b"o", "RENAMENX left the target")
eq(r.renamenx("new", "newer"), True, "RENAMENX")
eq(r.get("newer"), b"v", "RENAMENX moved the value")

# --- KEYS, SCAN, DBSIZE
wipe()
r.mset({"user:1": "a", "user:2": "b", "user:10": "c", "other": "d"})
eq(sorted(r.keys("user:*")), [b"user:1", b"user:10", b"user:2"], "KEYS user:*")
eq(sorted(r.keys("user:?")), [b"user:1", b"user:2"], "KEYS user:?")
eq(sorted(r.keys("user:[12]")), [b"user:1", b"user:2"], "KEYS user:[12]")
eq(sorted(r.keys()), [b"other", b"user:1", b"user:10", b"user:2"], "KEYS *")
eq(r.keys("nomatch*"), [], "KEYS without a match")
eq(r.dbsize(), 4, "DBSIZE")
wipe()

pipe = r.pipeline(transaction=False)
for i in range(1000):
    pipe.set(f"key:{i}", str(i))
res = pipe.execute()
eq(len(res), 1000, "1000-command pipeline: reply count")
ok(all(x is True for x in res), "1000-command pipeline: every SET answered OK")
eq(r.dbsize(), 1000, "DBSIZE after 1000 SETs")
every = {f"key:{i}".encode() for i in range(1000)}
for count in (10, 37, 1000):
    seen = list(r.scan_iter(count=count))
    eq(len(seen), 1000, f"scan_iter(count={count}) yields 1000 keys")
    eq(set(seen), every, f"scan_iter(count={count}) yields every key exactly once")
sub = list(r.scan_iter(match="key:1*", count=100))
want = sorted(k for k in every if k.startswith(b"key:1"))
eq(sorted(sub), want, "scan_iter(match='key:1*')")
eq(len(sub), len(set(sub)), "scan_iter(match) yields each key once")
cursor, batch = r.scan(0, count=10)
ok(cursor != 0 and 1 <= len(batch) <= 10, f"SCAN 0 COUNT 10: cursor {cursor}, {len(batch)} keys")
manual, cursor = [], 0
while True:
    cursor, batch = r.scan(cursor, match="key:9*", count=50)
    manual += batch
    if cursor == 0:
        break
eq(sorted(manual), sorted(k for k in every if k.startswith(b"key:9")), "SCAN MATCH loop")
pipe = r.pipeline(transaction=False)
for i in range(1000):
    pipe.get(f"key:{i}")
eq(pipe.execute(), [str(i).encode() for i in range(1000)], "1000 GETs pipelined, in order")
pipe = r.pipeline(transaction=False)
pipe.incr("pc").incr("pc").get("pc").set("word", "x").incr("word").get("pc")
res = pipe.execute(raise_on_error=False)
eq(res[:4], [1, 2, b"2", True], "mixed pipeline")
ok(isinstance(res[4], redis.ResponseError), f"an error inside a pipeline: {res[4]!r}")
eq(res[5], b"2", "the pipeline goes on after an error")

# --- errors
e = raises(lambda: r.execute_command("NOSUCHCMD", "a", "b"), "unknown command", "unknown command")
eq(e, "unknown command 'NOSUCHCMD', with args beginning with: 'a' 'b' ", "unknown command message")
raises(lambda: r.execute_command("GET"), "wrong number of arguments for 'get' command", "GET arity")
raises(lambda: r.execute_command("GET", "a", "b"), "wrong number of arguments for 'get' command", "GET arity 2")
eq(r.ping(), True, "the connection works after errors")
print(f"ok: {checks} checks, protocol {proto}")
"##;

fn redis_py_strings(proto: u32) {
    let mut server = start_resp(&[]);
    let port = resp_port(&server);
    let run = python(REDIS_PY_STRINGS, &[port.to_string(), proto.to_string()]).success(&[&server]);
    assert!(
        run.stdout.contains(&format!("protocol {proto}")),
        "{}",
        run.describe()
    );
    assert_healthy(&mut server);
}

#[test]
fn redis_py_resp2_strings_keys_scan_pipelines_and_errors() {
    redis_py_strings(2);
}

#[test]
fn redis_py_resp3_strings_keys_scan_pipelines_and_errors() {
    redis_py_strings(3);
}

/// Lists, hashes, sets and sorted sets through redis-py: every reply checked by value, in the
/// protocol given (redis-py decodes RESP3 maps, sets and doubles into dicts, sets and floats).
const REDIS_PY_TYPES: &str = r##"
import sys, threading, time
import redis

port, proto = int(sys.argv[1]), int(sys.argv[2])
r = redis.Redis(host="127.0.0.1", port=port, protocol=proto, socket_timeout=10,
                decode_responses=True)
checks = 0
def eq(got, want, what):
    global checks
    if got != want:
        print(f"FAIL (protocol {proto}) {what}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)
    checks += 1

r.flushall()
# Lists
eq(r.rpush("l", "a", "b", "c"), 3, "rpush")
eq(r.lpush("l", "z"), 4, "lpush")
eq(r.lrange("l", 0, -1), ["z", "a", "b", "c"], "lrange")
eq(r.llen("l"), 4, "llen")
eq(r.lindex("l", -1), "c", "lindex")
eq(r.lpop("l"), "z", "lpop")
eq(r.rpop("l", 2), ["c", "b"], "rpop count")
eq(r.lset("l", 0, "A"), True, "lset")
eq(r.linsert("l", "AFTER", "A", "B"), 2, "linsert")
eq(r.lrem("l", 0, "B"), 1, "lrem")
eq(r.lmove("l", "l2", "LEFT", "RIGHT"), "A", "lmove")
eq(r.exists("l"), 0, "emptied list is gone")
eq(r.rpush("big", *range(600)), 600, "rpush 600")
eq(r.lrange("big", 0, 599), [str(i) for i in range(600)], "lrange 600")
eq(r.ltrim("big", 100, 199), True, "ltrim")
eq(r.lrange("big", 0, 2), ["100", "101", "102"], "after ltrim")
eq(r.lpos("big", "150"), 50, "lpos")
# Blocking pops: at once when there is data, None on a timeout, woken by another client.
eq(r.rpush("bq", "j1"), 1, "rpush bq")
eq(tuple(r.blpop(["none", "bq"], timeout=1)), ("bq", "j1"), "blpop at once")
eq(r.blpop(["bq"], timeout=0.05), None, "blpop timeout")
w = redis.Redis(host="127.0.0.1", port=port, protocol=proto, socket_timeout=10,
                decode_responses=True)
got = []
t = threading.Thread(target=lambda: got.append(w.brpop("bq", timeout=10)))
t.start()
deadline = time.time() + 10
while int(r.info("clients")["blocked_clients"]) != 1 and time.time() < deadline:
    time.sleep(0.01)
eq(r.lpush("bq", "j2"), 1, "lpush to a waiter")
t.join(10)
eq([tuple(g) for g in got], [("bq", "j2")], "brpop woken by another client")
eq(r.exists("bq"), 0, "the waiter took the element")
eq(r.blmove("bq", "bq2", 0.05, "LEFT", "RIGHT"), None, "blmove timeout")
# Hashes
eq(r.hset("h", mapping={"f1": "v1", "f2": "v2"}), 2, "hset mapping")
eq(r.hget("h", "f1"), "v1", "hget")
eq(r.hgetall("h"), {"f1": "v1", "f2": "v2"}, "hgetall")
eq(r.hmget("h", ["f1", "nope"]), ["v1", None], "hmget")
eq(r.hincrby("h", "n", 5), 5, "hincrby")
eq(r.hincrbyfloat("h", "x", 1.5), 1.5, "hincrbyfloat")
eq(sorted(r.hkeys("h")), ["f1", "f2", "n", "x"], "hkeys")
eq(r.hlen("h"), 4, "hlen")
eq(r.hexists("h", "f2"), True, "hexists")
eq(r.hdel("h", "f1", "f2"), 2, "hdel")
eq(r.hstrlen("h", "n"), 1, "hstrlen")
eq(dict(r.hscan_iter("h")), {"n": "5", "x": "1.5"}, "hscan")
# Sets
eq(r.sadd("s", "a", "b", "c"), 3, "sadd")
eq(r.smembers("s"), {"a", "b", "c"}, "smembers")
eq(r.sismember("s", "a"), True, "sismember")
eq(r.smismember("s", ["a", "x"]), [True, False], "smismember")
eq(r.scard("s"), 3, "scard")
eq(r.sadd("t", "b", "c", "d"), 3, "sadd t")
eq(r.sinter("s", "t"), {"b", "c"}, "sinter")
eq(r.sunion("s", "t"), {"a", "b", "c", "d"}, "sunion")
eq(r.sdiff("s", "t"), {"a"}, "sdiff")
eq(r.sinterstore("st", ["s", "t"]), 2, "sinterstore")
eq(r.smove("s", "t", "a"), True, "smove")
eq(r.srem("s", "b", "c"), 2, "srem")
eq(r.exists("s"), 0, "emptied set is gone")
popped = r.spop("t")
eq(popped in {"a", "b", "c", "d"}, True, "spop member")
eq(r.scard("t"), 3, "scard after spop")
eq(set(r.sscan_iter("t")) | {popped}, {"a", "b", "c", "d"}, "sscan")
# Sorted sets
eq(r.zadd("z", {"a": 1, "b": 2, "c": 3.5}), 3, "zadd")
eq(r.zscore("z", "c"), 3.5, "zscore")
eq(r.zincrby("z", 2, "a"), 3.0, "zincrby")
eq(r.zrange("z", 0, -1), ["b", "a", "c"], "zrange")
# redis-py gives (member, score) tuples in RESP2 and [member, score] lists in RESP3.
pairs = lambda v: [tuple(p) for p in v]
eq(pairs(r.zrange("z", 0, -1, withscores=True)), [("b", 2.0), ("a", 3.0), ("c", 3.5)], "zrange withscores")
eq(r.zrevrange("z", 0, 0), ["c"], "zrevrange")
eq(r.zrangebyscore("z", 2.5, "+inf"), ["a", "c"], "zrangebyscore")
eq(pairs(r.zrevrangebyscore("z", "+inf", 3, withscores=True)), [("c", 3.5), ("a", 3.0)], "zrevrangebyscore")
eq(r.zrank("z", "c"), 2, "zrank")
eq(r.zcount("z", "-inf", 3), 2, "zcount")
eq(r.zcard("z"), 3, "zcard")
eq(pairs(r.zpopmin("z")) if proto == 2 else r.zpopmin("z"), [("b", 2.0)] if proto == 2 else ["b", 2.0], "zpopmin")
eq(r.zrem("z", "a"), 1, "zrem")
eq(dict(r.zscan_iter("z")), {"c": 3.5}, "zscan")
eq(r.zadd("z", {"c": 10}, gt=True, ch=True), 1, "zadd gt ch")
# Types and errors
eq(r.type("big"), "list", "type list")
eq(r.type("h"), "hash", "type hash")
eq(r.type("t"), "set", "type set")
eq(r.type("z"), "zset", "type zset")
try:
    r.get("h")
    eq("no error", "WRONGTYPE", "get on a hash")
except redis.ResponseError as e:
    eq(str(e).startswith("WRONGTYPE"), True, "get on a hash")
eq(r.delete("big", "h", "t", "z", "st", "l2"), 6, "del all")
eq(r.dbsize(), 0, "empty")
print(f"ok: {checks} checks, protocol {proto}")
"##;

fn redis_py_types(proto: u32) {
    let mut server = start_resp(&[]);
    let port = resp_port(&server);
    let run = python(REDIS_PY_TYPES, &[port.to_string(), proto.to_string()]).success(&[&server]);
    assert!(
        run.stdout.contains(&format!("protocol {proto}")),
        "{}",
        run.describe()
    );
    assert_healthy(&mut server);
}

#[test]
fn redis_py_resp2_lists_hashes_sets_sorted_sets_and_blocking_pops() {
    redis_py_types(2);
}

#[test]
fn redis_py_resp3_lists_hashes_sets_sorted_sets_and_blocking_pops() {
    redis_py_types(3);
}

/// FLUSHDB / FLUSHALL (with and without ASYNC/SYNC) through redis-py, then fresh connections
/// (more than there are workers) must each still be served.
const REDIS_PY_FLUSH: &str = r##"
import sys
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

port, proto = int(sys.argv[1]), int(sys.argv[2])
def client():
    # No retries: a lost reply should fail at once, not after a retry loop.
    return redis.Redis(host="127.0.0.1", port=port, protocol=proto, socket_timeout=10,
                       single_connection_client=True, retry=Retry(NoBackoff(), 0))
def eq(got, want, what):
    if got != want:
        print(f"FAIL (protocol {proto}) {what}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)
r = client()
r.mset({f"f:{i}": i for i in range(20)})
eq(r.dbsize(), 20, "DBSIZE before FLUSHDB")
eq(r.flushdb(), True, "FLUSHDB")
eq(r.dbsize(), 0, "DBSIZE after FLUSHDB")
eq(r.get("f:1"), None, "GET after FLUSHDB")
eq(r.keys(), [], "KEYS after FLUSHDB")
r.set("a", 1)
eq(r.flushdb(asynchronous=True), True, "FLUSHDB ASYNC")
eq(r.exists("a"), 0, "EXISTS after FLUSHDB ASYNC")
r.set("a", 1)
eq(r.flushall(), True, "FLUSHALL")
eq(r.dbsize(), 0, "DBSIZE after FLUSHALL")
r.set("a", 1)
eq(r.execute_command("FLUSHALL", "SYNC"), True, "FLUSHALL SYNC")
eq(r.exists("a"), 0, "EXISTS after FLUSHALL SYNC")
eq(r.set("a", "again"), True, "SET after the flushes")
eq(r.get("a"), b"again", "GET after the flushes")
for i in range(8):
    c = client()
    eq(c.ping(), True, f"PING on fresh connection {i}")
    eq(c.get("a"), b"again", f"GET on fresh connection {i}")
    c.close()
print(f"ok: protocol {proto}")
"##;

fn redis_py_flush(proto: u32) {
    let mut server = start_resp(&[]);
    let port = resp_port(&server);
    python(REDIS_PY_FLUSH, &[port.to_string(), proto.to_string()]).success(&[&server]);
    assert_healthy(&mut server);
}

#[test]
fn redis_py_resp2_flushdb_and_flushall_empty_the_keyspace_and_every_worker_still_serves() {
    redis_py_flush(2);
}

#[test]
fn redis_py_resp3_flushdb_and_flushall_empty_the_keyspace_and_every_worker_still_serves() {
    redis_py_flush(3);
}

// ---------------------------------------------------------------------------------------------
// --requirepass

#[test]
fn requirepass_answers_noauth_to_every_command_until_auth() {
    let mut server = start_resp(&["--requirepass", "secret"]);
    let addr = server.resp_addr().unwrap();
    let mut c = Conn::open(addr);
    let refused = [
        "PING",
        "ECHO x",
        "GET k",
        "SET k v",
        "MSET a 1 b 2",
        "MGET a b",
        "INCR counter",
        "APPEND k v",
        "DEL k",
        "EXISTS k",
        "EXPIRE k 10",
        "TTL k",
        "TYPE k",
        "RENAME k j",
        "KEYS *",
        "SCAN 0",
        "DBSIZE",
        "FLUSHDB",
        "FLUSHALL",
        "INFO",
        "INFO server",
        "CLIENT GETNAME",
        "CLIENT SETNAME x",
        "CONFIG GET port",
        "SELECT 0",
        "TIME",
        "COMMAND",
    ];
    for cmd in refused {
        assert_eq!(c.cmd(cmd), Resp::Error(NOAUTH.into()), "{cmd} before AUTH");
    }
    // HELLO without AUTH is refused with its own message and does not switch protocol.
    match c.cmd("HELLO 3") {
        Resp::Error(e) => assert!(e.starts_with("NOAUTH HELLO must be called"), "{e}"),
        other => panic!("HELLO 3 before AUTH: {other:?}"),
    }
    assert_eq!(
        c.cmd("AUTH wrong"),
        Resp::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(
        c.cmd("GET k"),
        Resp::Error(NOAUTH.into()),
        "after a wrong AUTH"
    );
    assert_eq!(c.cmd("AUTH secret"), Resp::Simple("OK".into()));
    // Nothing the refused commands asked for happened.
    assert_eq!(c.cmd("GET k"), Resp::Nil);
    assert_eq!(c.cmd("DBSIZE"), Resp::Int(0));
    assert_eq!(c.cmd("INCR counter"), Resp::Int(1));
    assert_eq!(c.cmd("CLIENT GETNAME"), Resp::Nil);

    // AUTH default <password> (the ACL form), and HELLO 3 AUTH on a fresh connection.
    let mut d = Conn::open(addr);
    assert_eq!(d.cmd("AUTH default secret"), Resp::Simple("OK".into()));
    assert_eq!(d.cmd("GET counter"), bulk("1"));
    let mut h = Conn::open(addr);
    match h.cmd("HELLO 3 AUTH default secret") {
        Resp::Map(pairs) => assert!(pairs.contains(&(bulk("proto"), Resp::Int(3)))),
        other => panic!("HELLO 3 AUTH default secret: {other:?}"),
    }
    assert_eq!(h.cmd("GET nope"), Resp::Nil);
    assert!(
        h.take_raw().ends_with(b"_\r\n"),
        "RESP3 null after HELLO 3 AUTH"
    );
    let mut w = Conn::open(addr);
    assert_eq!(
        w.cmd("HELLO 3 AUTH default wrong"),
        Resp::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(w.cmd("PING"), Resp::Error(NOAUTH.into()));
    assert_healthy(&mut server);
}

const REDIS_PY_PASSWORD: &str = r##"
import sys
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

port = int(sys.argv[1])
def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)
for proto in (2, 3):
    r = redis.Redis(host="127.0.0.1", port=port, protocol=proto, password="secret", socket_timeout=10)
    if r.ping() is not True:
        fail(f"protocol {proto}: PING")
    r.set(f"pw{proto}", f"value{proto}")
    if r.get(f"pw{proto}") != f"value{proto}".encode():
        fail(f"protocol {proto}: GET after SET")
    pipe = r.pipeline(transaction=False)
    for i in range(100):
        pipe.incr(f"n{proto}")
    if pipe.execute() != list(range(1, 101)):
        fail(f"protocol {proto}: pipelined INCRs")
    if r.client_getname() is not None:
        fail(f"protocol {proto}: CLIENT GETNAME")
    # Without a password, RESP2 clients get NOAUTH on the first command, RESP3 ones on HELLO.
    missing = "Authentication required" if proto == 2 else "HELLO must be called with the client already authenticated"
    for password, needle in ((None, missing), ("wrong", "invalid username-password pair")):
        # No retries: redis-py retries a failed connect with backoff (seconds per attempt).
        bad = redis.Redis(host="127.0.0.1", port=port, protocol=proto, password=password,
                          socket_timeout=10, retry=Retry(NoBackoff(), 0))
        try:
            got = bad.get(f"pw{proto}")
        except redis.AuthenticationError as e:
            if needle not in str(e):
                fail(f"protocol {proto}, password {password!r}: {e}")
        else:
            fail(f"protocol {proto}, password {password!r}: GET answered {got!r}")
print("ok")
"##;

#[test]
fn redis_py_with_password_works_on_resp2_and_resp3_and_without_it_fails_to_authenticate() {
    let mut server = start_resp(&["--requirepass", "secret"]);
    let port = resp_port(&server);
    python(REDIS_PY_PASSWORD, &[port.to_string()]).success(&[&server]);
    assert_healthy(&mut server);
}

// ---------------------------------------------------------------------------------------------
// One keyspace, two protocols

#[test]
fn memcached_set_is_read_by_resp_get_and_resp_set_by_memcached_get_with_flags_zero() {
    let mut server = start_resp(&[]);
    let mut mc = Mc::open(server.addr());
    let mut r = Conn::open(server.resp_addr().unwrap());

    assert_eq!(mc.ask("set k 5 0 5\r\nhello\r\n", 1), ["STORED"]);
    assert_eq!(r.cmd("GET k"), bulk("hello"));
    assert_eq!(r.cmd("STRLEN k"), Resp::Int(5));
    assert_eq!(r.cmd("TYPE k"), Resp::Simple("string".into()));
    assert_eq!(r.cmd("TTL k"), Resp::Int(-1), "exptime 0 is no TTL");

    assert_eq!(r.cmd("SET r world"), Resp::Simple("OK".into()));
    assert_eq!(mc.ask("get r\r\n", 3), ["VALUE r 0 5", "world", "END"]);
    // A RESP SET over a memcached item with flags replaces the flags with 0.
    assert_eq!(r.cmd("SET k bye"), Resp::Simple("OK".into()));
    assert_eq!(mc.ask("get k\r\n", 3), ["VALUE k 0 3", "bye", "END"]);
    // RESP APPEND keeps a memcached item's flags, like memcached's own append.
    assert_eq!(mc.ask("set f 7 0 2\r\nab\r\n", 1), ["STORED"]);
    assert_eq!(r.cmd("APPEND f cd"), Resp::Int(4));
    assert_eq!(mc.ask("get f\r\n", 3), ["VALUE f 7 4", "abcd", "END"]);
    // Binary values survive both ways.
    let bin: &[u8] = b"a\r\nb\x00c";
    assert_eq!(
        r.cmd_args(&[b"SET", b"bin", bin]),
        Resp::Simple("OK".into())
    );
    mc.send(b"get bin\r\n");
    assert_eq!(mc.line(), "VALUE bin 0 6");
    let mut value = [0u8; 8];
    mc.reader.read_exact(&mut value).unwrap();
    assert_eq!(&value, b"a\r\nb\x00c\r\n");
    assert_eq!(mc.line(), "END");
    // MSET over RESP, multi-get over memcached.
    assert_eq!(r.cmd("MSET m1 one m2 two"), Resp::Simple("OK".into()));
    assert_eq!(
        mc.ask("get m1 nope m2\r\n", 5),
        ["VALUE m1 0 3", "one", "VALUE m2 0 3", "two", "END"]
    );
    assert_healthy(&mut server);
}

#[test]
fn resp_expire_is_memcached_expiry_and_memcached_exptime_is_resp_ttl() {
    let mut server = Server::start_with(
        BIN,
        Options {
            resp: true,
            debug_clock_ms: Some(common::now_ms()),
            ..Options::default()
        },
    );
    let mut mc = Mc::open(server.addr());
    let mut r = Conn::open(server.resp_addr().unwrap());

    // memcached exptime (relative seconds) is the RESP TTL; the clock is frozen, so exact.
    assert_eq!(mc.ask("set m 3 100 1\r\nx\r\n", 1), ["STORED"]);
    assert_eq!(r.cmd("TTL m"), Resp::Int(100));
    assert_eq!(r.cmd("PTTL m"), Resp::Int(100_000));
    assert_eq!(mc.ask("touch m 50\r\n", 1), ["TOUCHED"]);
    assert_eq!(r.cmd("TTL m"), Resp::Int(50));
    assert_eq!(r.cmd("PERSIST m"), Resp::Int(1));
    assert_eq!(r.cmd("TTL m"), Resp::Int(-1));

    // RESP EXPIRE (and SET EX) expire the item for memcached too.
    assert_eq!(mc.ask("set k 0 0 5\r\nhello\r\n", 1), ["STORED"]);
    assert_eq!(r.cmd("EXPIRE k 10"), Resp::Int(1));
    assert_eq!(r.cmd("TTL k"), Resp::Int(10));
    assert_eq!(r.cmd("SET s v EX 20"), Resp::Simple("OK".into()));
    assert_eq!(r.cmd("SET p v PX 30000"), Resp::Simple("OK".into()));
    server.advance_clock(9).unwrap();
    assert_eq!(mc.ask("get k\r\n", 3), ["VALUE k 0 5", "hello", "END"]);
    assert_eq!(r.cmd("TTL k"), Resp::Int(1));
    server.advance_clock(2).unwrap();
    assert_eq!(mc.ask("get k\r\n", 1), ["END"], "expired by RESP EXPIRE");
    assert_eq!(r.cmd("EXISTS k"), Resp::Int(0));
    assert_eq!(mc.ask("get s\r\n", 3), ["VALUE s 0 1", "v", "END"]);
    server.advance_clock(10).unwrap();
    assert_eq!(mc.ask("get s\r\n", 1), ["END"], "expired by RESP SET EX");
    assert_eq!(mc.ask("get p\r\n", 3), ["VALUE p 0 1", "v", "END"]);
    server.advance_clock(10).unwrap();
    assert_eq!(mc.ask("get p\r\n", 1), ["END"], "expired by RESP SET PX");
    // The persisted item is still there for both.
    assert_eq!(mc.ask("get m\r\n", 3), ["VALUE m 3 1", "x", "END"]);
    assert_eq!(r.cmd("GET m"), bulk("x"));
    assert_healthy(&mut server);
}

#[test]
fn memcached_incr_counts_on_resp_numbers_and_resp_incr_on_memcached_numbers() {
    let mut server = start_resp(&[]);
    let mut mc = Mc::open(server.addr());
    let mut r = Conn::open(server.resp_addr().unwrap());

    assert_eq!(r.cmd("SET n 41"), Resp::Simple("OK".into()));
    assert_eq!(mc.ask("incr n 1\r\n", 1), ["42"]);
    assert_eq!(r.cmd("GET n"), bulk("42"));
    assert_eq!(r.cmd("INCRBY n 8"), Resp::Int(50));
    assert_eq!(
        r.cmd("DECRBY n 60"),
        Resp::Int(-10),
        "RESP DECR goes below 0"
    );
    assert_eq!(
        mc.ask("incr n 1\r\n", 1),
        ["CLIENT_ERROR cannot increment or decrement non-numeric value"],
        "memcached counters are unsigned"
    );
    assert_eq!(r.cmd("SET n 50"), Resp::Simple("OK".into()));
    assert_eq!(
        mc.ask("decr n 60\r\n", 1),
        ["0"],
        "memcached decr stops at 0"
    );
    // memcached keeps a shortened number's length, padded with spaces (memcached does the
    // same); RESP sees those bytes, and INCR refuses them as Redis refuses "0 ".
    assert_eq!(r.cmd("GET n"), bulk("0 "));
    assert_eq!(
        r.cmd("INCR n"),
        Resp::Error("ERR value is not an integer or out of range".into())
    );
    assert_eq!(mc.ask("incr n 7\r\n", 1), ["7"]);
    assert_eq!(r.cmd("GET n"), bulk("7 "));

    assert_eq!(mc.ask("set c 9 0 2\r\n10\r\n", 1), ["STORED"]);
    assert_eq!(r.cmd("INCR c"), Resp::Int(11));
    assert_eq!(
        mc.ask("get c\r\n", 3),
        ["VALUE c 9 2", "11", "END"],
        "RESP INCR keeps the flags"
    );
    assert_eq!(r.cmd("INCRBYFLOAT c 0.5"), bulk("11.5"));
    assert_eq!(
        mc.ask("incr c 1\r\n", 1),
        ["CLIENT_ERROR cannot increment or decrement non-numeric value"]
    );
    assert_eq!(mc.ask("incr missing 1\r\n", 1), ["NOT_FOUND"]);
    assert_eq!(r.cmd("INCR missing"), Resp::Int(1));
    assert_eq!(mc.ask("incr missing 1\r\n", 1), ["2"]);
    assert_healthy(&mut server);
}

#[test]
fn memcached_delete_makes_resp_exists_zero_and_resp_del_makes_memcached_miss() {
    let mut server = start_resp(&[]);
    let mut mc = Mc::open(server.addr());
    let mut r = Conn::open(server.resp_addr().unwrap());

    assert_eq!(r.cmd("SET k v"), Resp::Simple("OK".into()));
    assert_eq!(r.cmd("EXISTS k"), Resp::Int(1));
    assert_eq!(mc.ask("delete k\r\n", 1), ["DELETED"]);
    assert_eq!(r.cmd("EXISTS k"), Resp::Int(0));
    assert_eq!(r.cmd("GET k"), Resp::Nil);
    assert_eq!(r.cmd("DEL k"), Resp::Int(0));

    assert_eq!(mc.ask("set j 0 0 1\r\nx\r\n", 1), ["STORED"]);
    assert_eq!(r.cmd("DEL j"), Resp::Int(1));
    assert_eq!(mc.ask("get j\r\n", 1), ["END"]);
    assert_eq!(mc.ask("delete j\r\n", 1), ["NOT_FOUND"]);

    assert_eq!(mc.ask("set a 0 0 1\r\n1\r\n", 1), ["STORED"]);
    assert_eq!(r.cmd("RENAME a b"), Resp::Simple("OK".into()));
    assert_eq!(mc.ask("get a b\r\n", 3), ["VALUE b 0 1", "1", "END"]);
    assert_eq!(mc.ask("flush_all\r\n", 1), ["OK"]);
    assert_eq!(
        r.cmd("EXISTS b"),
        Resp::Int(0),
        "memcached flush_all empties RESP too"
    );
    assert_eq!(r.cmd("DBSIZE"), Resp::Int(0));
    assert_healthy(&mut server);
}

// ---------------------------------------------------------------------------------------------
// redis-cli

#[test]
fn redis_cli_one_shot_commands_print_exact_output() {
    let mut server = start_resp(&[]);
    let port = resp_port(&server);
    let cli = |args: &[&str]| redis_cli(port, args, b"").success(&[&server]).stdout;

    assert_eq!(cli(&["SET", "a", "1"]), "OK\n");
    assert_eq!(cli(&["GET", "a"]), "1\n");
    assert_eq!(cli(&["INCR", "a"]), "2\n");
    assert_eq!(cli(&["INCRBY", "a", "40"]), "42\n");
    assert_eq!(cli(&["GET", "missing"]), "\n");
    assert_eq!(cli(&["SET", "w", "hello world"]), "OK\n");
    assert_eq!(cli(&["MGET", "a", "missing", "w"]), "42\n\nhello world\n");
    assert_eq!(
        cli(&["--no-raw", "MGET", "a", "missing", "w"]),
        "1) \"42\"\n2) (nil)\n3) \"hello world\"\n"
    );
    assert_eq!(cli(&["--no-raw", "INCR", "a"]), "(integer) 43\n");
    assert_eq!(cli(&["-3", "--no-raw", "GET", "missing"]), "(nil)\n");
    assert_eq!(
        cli(&["INCR", "w"]),
        "ERR value is not an integer or out of range\n\n"
    );
    assert_eq!(cli(&["PING"]), "PONG\n");
    assert_eq!(cli(&["DBSIZE"]), "2\n");

    // --scan walks SCAN to the end: every key once.
    let mut mset: Vec<String> = vec!["MSET".into()];
    for i in 0..250 {
        mset.push(format!("scan:{i}"));
        mset.push(i.to_string());
    }
    let args: Vec<&str> = mset.iter().map(String::as_str).collect();
    assert_eq!(cli(&args), "OK\n");
    let mut keys: Vec<String> = cli(&["--scan"]).lines().map(String::from).collect();
    keys.sort();
    let mut want: Vec<String> = (0..250).map(|i| format!("scan:{i}")).collect();
    want.extend(["a".to_string(), "w".to_string()]);
    want.sort();
    assert_eq!(keys, want, "redis-cli --scan");
    let mut ones: Vec<String> = cli(&["--scan", "--pattern", "scan:1?"])
        .lines()
        .map(String::from)
        .collect();
    ones.sort();
    let want: Vec<String> = (10..20).map(|i| format!("scan:{i}")).collect();
    assert_eq!(ones, want, "redis-cli --scan --pattern scan:1?");

    // Commands on stdin, one a line.
    let run = redis_cli(port, &[], b"SET x 1\nGET x\nINCR x\nDEL x\n").success(&[&server]);
    assert_eq!(run.stdout, "OK\n1\n2\n1\n");

    // --pipe: mass insertion of inline commands; it counts replies and errors.
    let input: String = (0..500).map(|i| format!("SET pipe:{i} v{i}\n")).collect();
    let run = redis_cli(port, &["--pipe"], input.as_bytes()).success(&[&server]);
    assert!(
        run.stdout.contains("errors: 0, replies: 500"),
        "{}",
        run.describe()
    );
    assert_eq!(cli(&["GET", "pipe:499"]), "v499\n");
    assert_eq!(cli(&["DBSIZE"]), "752\n");
    assert_healthy(&mut server);
}

/// Drives an interactive redis-cli in a pty. Args: redis-cli path, port. Prints each answer as
/// `ANSWER <repr>` after stripping the line editor's escapes.
const PTY_REDIS_CLI: &str = r##"
import os, pty, re, select, signal, struct, sys, time, fcntl, termios

cli, port = sys.argv[1], sys.argv[2]
prompt = f"127.0.0.1:{port}> ".encode()
pid, fd = pty.fork()
if pid == 0:
    os.environ["TERM"] = "xterm"
    os.environ["REDISCLI_HISTFILE"] = "/dev/null"
    os.environ.pop("REDISCLI_AUTH", None)
    os.execvp(cli, [cli, "-h", "127.0.0.1", "-p", port])
# A real window size, or the line editor asks the terminal for its cursor position.
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
buf = b""

def fail(msg):
    print(f"FAIL {msg}; screen so far: {buf!r}", file=sys.stderr)
    os.kill(pid, signal.SIGKILL)
    sys.exit(1)

def read_until(pred, timeout=15):
    global buf
    end = time.time() + timeout
    while not pred(buf):
        left = end - time.time()
        if left <= 0:
            fail("timed out")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                fail("redis-cli exited")
            buf += chunk
    out, buf = buf, b""
    return out

ansi = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")
def answer(command):
    os.write(fd, command.encode() + b"\r")
    # The line editor echoes the command, then the answer follows on the next line, then the
    # prompt again.
    screen = read_until(lambda b: b"\r\n" in b and b.endswith(prompt))
    text = ansi.sub(b"", screen).replace(b"\r\r\n", b"\n").replace(b"\r\n", b"\n")
    body = text.split(b"\n", 1)[1]
    body = body[: -len(prompt)]
    print("ANSWER", repr(body.decode()))
    return body.decode()

read_until(lambda b: b.endswith(prompt))
print("PROMPT", prompt.decode())
answers = [answer("SET a 1"), answer("GET a"), answer("INCR a"), answer("GET nope"), answer("INFO server")]
os.write(fd, b"quit\r")
end = time.time() + 10
while time.time() < end:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    fail("redis-cli did not quit")
if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
    fail(f"redis-cli exit status {status}")
print("EXIT 0")
"##;

#[test]
fn redis_cli_interactive_session_shows_the_prompt_and_prints_answers() {
    let mut server = start_resp(&[]);
    let port = resp_port(&server);
    let cli = tool("redis-cli");
    let run = python(PTY_REDIS_CLI, &[cli.to_string(), port.to_string()]).success(&[&server]);
    let answers: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ANSWER "))
        .collect();
    let show = run.describe();
    assert!(
        run.stdout
            .lines()
            .any(|l| l == format!("PROMPT 127.0.0.1:{port}> ")),
        "{show}"
    );
    assert_eq!(answers.len(), 5, "{show}");
    assert_eq!(answers[0], "'OK\\n'", "SET a 1; {show}");
    assert_eq!(answers[1], "'\"1\"\\n'", "GET a; {show}");
    assert_eq!(answers[2], "'(integer) 2\\n'", "INCR a; {show}");
    assert_eq!(answers[3], "'(nil)\\n'", "GET nope; {show}");
    assert!(
        answers[4].starts_with("'# Server\\n"),
        "INFO server; {show}"
    );
    assert!(answers[4].contains("redis_version:"), "INFO server; {show}");
    assert!(
        answers[4].contains(&format!("tcp_port:{port}\\n")),
        "INFO server; {show}"
    );
    assert!(run.stdout.contains("EXIT 0"), "{show}");
    assert_healthy(&mut server);
}

// ---------------------------------------------------------------------------------------------
// redis-benchmark

fn benchmark(server: &Server, extra: &[&str]) -> Run {
    let mut cmd = Command::new(tool("redis-benchmark"));
    cmd.args(["-h", "127.0.0.1", "-p", &resp_port(server).to_string()])
        .args([
            "-t",
            "set,get,incr,mset,ping,lpush,lpop,lrange",
            "-n",
            "2000",
            "-q",
        ])
        .args(extra);
    let run = run_bounded(cmd, b"", CLIENT_DEADLINE).success(&[server]);
    // -q rewrites a progress line with `\r`; the results are what follows the last one.
    let text = run.stdout.replace('\r', "\n");
    for test in [
        "PING_INLINE: ",
        "PING_MBULK: ",
        "SET: ",
        "GET: ",
        "INCR: ",
        "MSET (10 keys): ",
        "LPUSH: ",
        "LPOP: ",
        "LRANGE_100 (first 100 elements): ",
        "LRANGE_600 (first 600 elements): ",
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(test) && l.contains("requests per second")),
            "no result line for {test:?}\n{}",
            run.describe()
        );
    }
    let all = format!("{}{}", run.stdout, run.stderr);
    assert!(
        !all.contains("ERR") && !all.to_lowercase().contains("error"),
        "{}",
        run.describe()
    );
    run
}

#[test]
fn redis_benchmark_plain_and_pipelined_complete_without_errors() {
    let mut server = start_resp(&[]);
    let mut r = Conn::open(server.resp_addr().unwrap());
    benchmark(&server, &[]);
    // Without -r every request uses the same literal keys: 2000 INCRs count to 2000.
    assert_eq!(r.cmd("GET counter:__rand_int__"), bulk("2000"));
    assert_eq!(r.cmd("GET key:__rand_int__"), bulk("VXK"));
    benchmark(&server, &["-P", "16"]);
    assert_eq!(r.cmd("GET counter:__rand_int__"), bulk("4000"));
    assert_healthy(&mut server);
}

// ---------------------------------------------------------------------------------------------
// Framing

#[test]
fn negative_bulk_length_gets_a_protocol_error_and_the_connection_closes() {
    let mut server = start_resp(&[]);
    let addr = server.resp_addr().unwrap();
    let mut bystander = Conn::open(addr);
    assert_eq!(bystander.cmd("SET k v"), Resp::Simple("OK".into()));

    let mut c = Conn::open(addr);
    c.send(b"*1\r\n$-5\r\n");
    assert_eq!(
        c.read_to_close(),
        b"-ERR Protocol error: invalid bulk length\r\n"
    );
    for bad in [
        &b"*x\r\n"[..],
        b"*2\r\n$3\r\nGET\r\nfoo\r\n",
        b"SET a \"unbalanced\r\n",
    ] {
        let mut c = Conn::open(addr);
        c.send(bad);
        let got = c.read_to_close();
        assert!(
            got.starts_with(b"-ERR Protocol error: ") && got.ends_with(b"\r\n"),
            "{:?} got {:?}",
            String::from_utf8_lossy(bad),
            String::from_utf8_lossy(&got)
        );
    }
    assert_eq!(bystander.cmd("GET k"), bulk("v"), "other connections go on");
    assert_healthy(&mut server);
}

#[test]
fn inline_commands_typed_as_text_are_answered() {
    let mut server = start_resp(&[]);
    let mut c = Conn::open(server.resp_addr().unwrap());
    c.send(b"PING\r\n");
    assert_eq!(c.reply().unwrap(), Resp::Simple("PONG".into()));
    c.send(b"ping\n");
    assert_eq!(c.reply().unwrap(), Resp::Simple("PONG".into()));
    c.send(b"SET greeting \"hello world\"\r\nGET greeting\r\n\r\nEXISTS greeting nope\r\n");
    assert_eq!(c.reply().unwrap(), Resp::Simple("OK".into()));
    assert_eq!(c.reply().unwrap(), bulk("hello world"));
    assert_eq!(c.reply().unwrap(), Resp::Int(1));
    // Inline and multibulk requests mix on one connection.
    c.send(b"INCR n\r\n*2\r\n$4\r\nINCR\r\n$1\r\nn\r\nGET n\r\n");
    assert_eq!(c.reply().unwrap(), Resp::Int(1));
    assert_eq!(c.reply().unwrap(), Resp::Int(2));
    assert_eq!(c.reply().unwrap(), bulk("2"));
    c.take_raw();
    c.send(b"PING\r\n");
    c.reply().unwrap();
    assert_eq!(c.take_raw(), b"+PONG\r\n");
    assert_healthy(&mut server);
}

#[test]
fn bulk_larger_than_the_bulk_limit_gets_a_protocol_error_and_close_while_others_go_on() {
    let mut server = start_resp(&["--proto-max-bulk-len", "1m"]);
    let addr = server.resp_addr().unwrap();
    let mut bystander = Conn::open(addr);
    assert_eq!(bystander.cmd("SET k v"), Resp::Simple("OK".into()));

    // One byte over --proto-max-bulk-len 1m, announced before any of the data is sent.
    let mut c = Conn::open(addr);
    c.send(b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$1048577\r\n");
    assert_eq!(
        c.read_to_close(),
        b"-ERR Protocol error: invalid bulk length\r\n"
    );
    // The same with the data following at once: the error, then the close.
    let mut c = Conn::open(addr);
    let mut req = b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$1048577\r\n".to_vec();
    req.extend(std::iter::repeat_n(b'x', 4096));
    // The server may close before reading it all: a failed write is fine here.
    let _ = c.writer.write_all(&req);
    let got = c.read_to_close();
    assert_eq!(got, b"-ERR Protocol error: invalid bulk length\r\n");

    // Exactly the limit is a valid bulk, stored and read back.
    let big = vec![b'y'; 1 << 20];
    let mut ok = Conn::open(addr);
    assert_eq!(
        ok.cmd_args(&[b"SET", b"big", &big]),
        Resp::Simple("OK".into())
    );
    assert_eq!(ok.cmd("STRLEN big"), Resp::Int(1 << 20));
    assert_eq!(bystander.cmd("GET k"), bulk("v"), "other connections go on");
    assert_eq!(bystander.cmd("EXISTS big"), Resp::Int(1));
    assert_healthy(&mut server);
}

// ---------------------------------------------------------------------------------------------
// HELLO

#[test]
fn hello_3_answers_a_map_with_proto_3_and_then_nulls_are_resp3() {
    let mut server = start_resp(&[]);
    let mut c = Conn::open(server.resp_addr().unwrap());
    let reply = c.cmd("HELLO 3");
    let raw = c.take_raw();
    assert!(
        raw.starts_with(b"%7\r\n"),
        "{:?}",
        String::from_utf8_lossy(&raw)
    );
    let Resp::Map(pairs) = reply else {
        panic!("HELLO 3: {reply:?}")
    };
    let keys: Vec<&Resp> = pairs.iter().map(|(k, _)| k).collect();
    let want: Vec<Resp> = [
        "server", "version", "proto", "id", "mode", "role", "modules",
    ]
    .iter()
    .map(|s| bulk(s))
    .collect();
    assert_eq!(keys, want.iter().collect::<Vec<_>>());
    assert_eq!(pairs[0].1, bulk("redis"));
    assert_eq!(pairs[2].1, Resp::Int(3));
    assert!(
        matches!(pairs[3].1, Resp::Int(id) if id > 0),
        "{:?}",
        pairs[3]
    );
    assert_eq!(pairs[6].1, Resp::Array(vec![]));

    assert_eq!(c.cmd("GET missing"), Resp::Nil);
    assert_eq!(c.take_raw(), b"_\r\n");
    assert_eq!(
        c.cmd("MGET missing missing"),
        Resp::Array(vec![Resp::Nil, Resp::Nil])
    );
    assert_eq!(c.take_raw(), b"*2\r\n_\r\n_\r\n");
    // CONFIG GET answers a map in RESP3.
    c.cmd("CONFIG GET timeout");
    assert_eq!(c.take_raw(), b"%1\r\n$7\r\ntimeout\r\n$1\r\n0\r\n");
    assert_healthy(&mut server);
}

#[test]
fn hello_2_answers_a_flat_array_and_nulls_stay_resp2() {
    let mut server = start_resp(&[]);
    let mut c = Conn::open(server.resp_addr().unwrap());
    // Switch to 3 and back to 2 on one connection.
    assert!(matches!(c.cmd("HELLO 3"), Resp::Map(_)));
    c.take_raw();
    let reply = c.cmd("HELLO 2");
    let raw = c.take_raw();
    assert!(
        raw.starts_with(b"*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n"),
        "{:?}",
        String::from_utf8_lossy(&raw)
    );
    let Resp::Array(items) = reply else {
        panic!("HELLO 2: {reply:?}")
    };
    assert_eq!(items.len(), 14);
    assert_eq!(items[4], bulk("proto"));
    assert_eq!(items[5], Resp::Int(2));
    assert_eq!(c.cmd("GET missing"), Resp::Nil);
    assert_eq!(c.take_raw(), b"$-1\r\n");
    // HELLO without a version reports the current one.
    let Resp::Array(items) = c.cmd("HELLO") else {
        panic!("HELLO")
    };
    assert_eq!(items[5], Resp::Int(2));
    assert_healthy(&mut server);
}

#[test]
fn hello_4_is_noproto_and_leaves_the_protocol_alone() {
    let mut server = start_resp(&[]);
    let mut c = Conn::open(server.resp_addr().unwrap());
    match c.cmd("HELLO 4") {
        Resp::Error(e) => assert!(e.starts_with("NOPROTO "), "{e}"),
        other => panic!("HELLO 4: {other:?}"),
    }
    c.take_raw();
    assert_eq!(c.cmd("GET missing"), Resp::Nil);
    assert_eq!(c.take_raw(), b"$-1\r\n", "still RESP2");
    assert_eq!(
        c.cmd("HELLO x"),
        Resp::Error("ERR Protocol version is not an integer or out of range".into())
    );
    assert!(matches!(c.cmd("HELLO 3"), Resp::Map(_)));
    match c.cmd("HELLO 1") {
        Resp::Error(e) => assert!(e.starts_with("NOPROTO "), "{e}"),
        other => panic!("HELLO 1: {other:?}"),
    }
    c.take_raw();
    assert_eq!(c.cmd("GET missing"), Resp::Nil);
    assert_eq!(c.take_raw(), b"_\r\n", "still RESP3");
    assert_healthy(&mut server);
}
