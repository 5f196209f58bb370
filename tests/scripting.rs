//! Lua scripts (EVAL, EVALSHA, SCRIPT) through real clients and across processes: redis-py's
//! `Lock` (acquire, extend, release across two connections) and a token-bucket rate limiter
//! (`register_script`: EVALSHA, falling back to EVAL on NOSCRIPT), both on RESP2 and RESP3; a
//! writing script's reply means its writes are durable (kill -9 right after it); a script past
//! the time limit makes other clients get -BUSY until SCRIPT KILL stops it, and a script that
//! wrote cannot be killed. The cmsgpack and struct libraries round-trip random values, and
//! random bytes into their unpacking fail as Lua errors (their exact bytes and texts are
//! goldens in proto/resp/scripting.txt).
//!
//! `MEMKEEP_CONFORMANCE=redis` runs the client and BUSY tests against a redis-server the test
//! starts instead (`make conformance`); the kill -9 test is memkeep's alone.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::programs::{assert_healthy, python};
use common::{Kind, Options, Rng, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");

fn memkeep(args: &[&str]) -> Server {
    Server::start_with(
        BIN,
        Options {
            args: args.iter().map(|s| s.to_string()).collect(),
            resp: true,
            ..Options::default()
        },
    )
}

/// memkeep (two workers), or redis-server under `MEMKEEP_CONFORMANCE=redis`.
fn target(args: &[&str]) -> Server {
    match std::env::var("MEMKEEP_CONFORMANCE").as_deref() {
        Err(_) | Ok("") => {
            let mut all = vec!["-t", "2"];
            all.extend_from_slice(args);
            memkeep(&all)
        }
        Ok("redis") => Server::redis(),
        Ok(other) => panic!("MEMKEEP_CONFORMANCE={other:?}: expected unset or `redis`"),
    }
}

fn port(server: &Server) -> u16 {
    server.resp_addr().expect("a RESP port").port()
}

/// A raw RESP connection for the few replies these tests read (one line, or a bulk).
struct Conn {
    out: TcpStream,
    input: BufReader<TcpStream>,
}

impl Conn {
    fn open(server: &Server) -> Conn {
        let s = Server::connect_to(server.resp_addr().expect("a RESP port")).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        Conn {
            out: s.try_clone().expect("clone"),
            input: BufReader::new(s),
        }
    }

    fn send(&mut self, args: &[&str]) {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.out.write_all(&b).expect("send");
    }

    /// One reply: a line, or a bulk's contents (`(nil)` for a null).
    fn reply(&mut self) -> String {
        let mut line = String::new();
        self.input.read_line(&mut line).expect("reply");
        let line = line.trim_end().to_string();
        if let Some(n) = line.strip_prefix('$') {
            let Ok(n) = n.parse::<usize>() else {
                return "(nil)".into();
            };
            let mut body = vec![0u8; n + 2];
            std::io::Read::read_exact(&mut self.input, &mut body).expect("bulk");
            body.truncate(n);
            return String::from_utf8_lossy(&body).into_owned();
        }
        line
    }

    fn cmd(&mut self, args: &[&str]) -> String {
        self.send(args);
        self.reply()
    }
}

const REDIS_PY_LOCK_AND_RATE_LIMIT: &str = r#"
import sys, redis
from redis.exceptions import LockNotOwnedError
port, proto = int(sys.argv[1]), int(sys.argv[2])
a = redis.Redis(port=port, protocol=proto)
b = redis.Redis(port=port, protocol=proto)
a.delete("lock:res", "bucket:user")

# redis-py's Lock: SET NX PX to acquire, Lua to extend and release (token compared).
la = a.lock("lock:res", timeout=10, blocking=False)
lb = b.lock("lock:res", timeout=10, blocking=False)
assert la.acquire(), "a acquires"
assert not lb.acquire(), "b must not acquire a held lock"
assert la.extend(20), "a extends"
ttl = a.pttl("lock:res")
assert 10000 < ttl <= 30000, ttl
try:
    lb.release()
    raise SystemExit("b released a lock it does not own")
except Exception:
    pass
assert la.owned() and not lb.owned()
la.release()
assert a.get("lock:res") is None
assert lb.acquire(), "b acquires once a released"
# A holder with a stale token cannot extend (the Lua script compares tokens).
stale = a.lock("lock:res", timeout=10)
stale.local.token = b"not-the-token"
try:
    stale.extend(5)
    raise SystemExit("extended a lock with the wrong token")
except LockNotOwnedError:
    pass
assert lb.owned()
lb.release()

# A token bucket: capacity 3, refilled at 1 token/s, the time passed in by the caller.
BUCKET = """
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + (now - ts) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', key, 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', key, 60)
return {allowed, tostring(tokens)}
"""
take = a.register_script(BUCKET)
got = [take(keys=["bucket:user"], args=[3, 1, 1000])[0] for _ in range(4)]
assert got == [1, 1, 1, 0], got
# Two seconds later two tokens are back (seen from the other connection).
got = [take(keys=["bucket:user"], args=[3, 1, 1002], client=b)[0] for _ in range(3)]
assert got == [1, 1, 0], got
assert a.script_exists(take.sha) == [True]
assert b.ttl("bucket:user") > 0
print("ok: lock and token bucket, protocol", proto)
"#;

fn redis_py(proto: u32) {
    let mut server = target(&[]);
    let run = python(
        REDIS_PY_LOCK_AND_RATE_LIMIT,
        &[port(&server).to_string(), proto.to_string()],
    )
    .success(&[&server]);
    assert!(run.stdout.contains("ok: "), "{}", run.describe());
    assert_healthy(&mut server);
}

#[test]
fn redis_py_lock_and_token_bucket_resp2() {
    redis_py(2);
}

#[test]
fn redis_py_lock_and_token_bucket_resp3() {
    redis_py(3);
}

#[test]
fn a_writing_script_is_durable_once_it_answers() {
    if std::env::var("MEMKEEP_CONFORMANCE").is_ok_and(|v| !v.is_empty()) {
        return;
    }
    let mut server = memkeep(&["--sync", "always"]);
    let mut c = Conn::open(&server);
    let script = "for i = 1, 50 do redis.call('SET', KEYS[1] .. i, ARGV[1] .. i) end \
                  redis.call('RPUSH', KEYS[1] .. 'list', 'a', 'b') \
                  return redis.call('INCRBY', KEYS[1] .. 'n', 7)";
    assert_eq!(c.cmd(&["EVAL", script, "1", "dur:", "v"]), ":7");
    server.kill9();
    server.relaunch();
    let mut c = Conn::open(&server);
    assert_eq!(c.cmd(&["GET", "dur:1"]), "v1");
    assert_eq!(c.cmd(&["GET", "dur:50"]), "v50");
    assert_eq!(c.cmd(&["GET", "dur:n"]), "7");
    assert_eq!(c.cmd(&["LLEN", "dur:list"]), ":2");
    // The script cache did not survive (as Redis's).
    let sha = c.cmd(&["SCRIPT", "LOAD", "return 1"]);
    server.kill9();
    server.relaunch();
    let mut c = Conn::open(&server);
    assert_eq!(
        c.cmd(&["EVALSHA", &sha, "0"]),
        "-NOSCRIPT No matching script. Please use EVAL."
    );
    assert_healthy(&mut server);
}

#[test]
fn a_script_push_serves_a_blocked_pop() {
    let mut server = target(&[]);
    let mut waiter = Conn::open(&server);
    let mut pusher = Conn::open(&server);
    assert!(pusher.cmd(&["DEL", "feed:q"]).starts_with(':'));
    waiter.send(&["BLPOP", "feed:q", "0"]);
    // The pop is waiting once CLIENT LIST shows a client in blpop.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        pusher.send(&["CLIENT", "LIST"]);
        if pusher.reply().contains("cmd=blpop") {
            break;
        }
        assert!(Instant::now() < deadline, "BLPOP never waited");
        std::thread::sleep(Duration::from_millis(10));
    }
    let script = "redis.call('RPUSH', KEYS[1], 'a', 'b') return redis.call('LLEN', KEYS[1])";
    assert_eq!(pusher.cmd(&["EVAL", script, "1", "feed:q"]), ":2");
    assert_eq!(waiter.reply(), "*2");
    assert_eq!(waiter.reply(), "feed:q");
    assert_eq!(waiter.reply(), "a");
    assert_eq!(pusher.cmd(&["LRANGE", "feed:q", "0", "-1"]), "*1");
    assert_healthy(&mut server);
}

/// Sends PING on `c` until it answers -BUSY (the script has run past the limit).
fn wait_busy(c: &mut Conn) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = c.cmd(&["PING"]);
        if r.starts_with("-BUSY") {
            assert_eq!(
                r,
                "-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."
            );
            return;
        }
        assert_eq!(r, "+PONG");
        assert!(Instant::now() < deadline, "never BUSY");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn busy_server() -> Server {
    let server = target(&["--lua-time-limit", "100"]);
    if *server.kind() == Kind::Redis {
        let mut c = Conn::open(&server);
        assert_eq!(c.cmd(&["CONFIG", "SET", "lua-time-limit", "100"]), "+OK");
    }
    server
}

#[test]
fn a_long_script_makes_others_busy_until_script_kill() {
    let mut server = busy_server();
    let mut runner = Conn::open(&server);
    let mut other = Conn::open(&server);
    assert_eq!(
        other.cmd(&["SCRIPT", "KILL"]),
        "-NOTBUSY No scripts in execution right now."
    );
    runner.send(&["EVAL", "local i = 0 while true do i = i + 1 end", "0"]);
    wait_busy(&mut other);
    assert_eq!(other.cmd(&["SCRIPT", "KILL"]), "+OK");
    let r = runner.reply();
    assert!(
        r.starts_with("-ERR Script killed by user with SCRIPT KILL..."),
        "{r}"
    );
    // Everyone is served again, the script's connection too.
    assert_eq!(other.cmd(&["PING"]), "+PONG");
    assert_eq!(runner.cmd(&["EVAL", "return 5", "0"]), ":5");
    assert_healthy(&mut server);
}

/// MULTI, WATCH and DISCARD pass while a script is busy (Redis's `allow-busy`); a command
/// queued meanwhile is refused with -BUSY, so the transaction's EXEC aborts after the kill.
#[test]
fn a_transaction_opened_while_a_script_is_busy_aborts() {
    let mut server = busy_server();
    let mut runner = Conn::open(&server);
    let mut other = Conn::open(&server);
    let mut killer = Conn::open(&server);
    assert_eq!(other.cmd(&["SET", "busy:x", "1"]), "+OK");
    runner.send(&["EVAL", "while true do end", "0"]);
    wait_busy(&mut other);
    assert_eq!(other.cmd(&["WATCH", "busy:x"]), "+OK");
    assert_eq!(other.cmd(&["MULTI"]), "+OK");
    assert!(other.cmd(&["INCR", "busy:x"]).starts_with("-BUSY"));
    assert_eq!(killer.cmd(&["SCRIPT", "KILL"]), "+OK");
    assert!(runner.reply().starts_with("-ERR Script killed by user"));
    assert_eq!(other.cmd(&["INCR", "busy:x"]), "+QUEUED");
    assert_eq!(
        other.cmd(&["EXEC"]),
        "-EXECABORT Transaction discarded because of previous errors."
    );
    assert_eq!(other.cmd(&["GET", "busy:x"]), "1");
    // DISCARD passes too, and leaves the connection out of MULTI.
    runner.send(&["EVAL", "while true do end", "0"]);
    wait_busy(&mut other);
    assert_eq!(other.cmd(&["MULTI"]), "+OK");
    assert_eq!(other.cmd(&["DISCARD"]), "+OK");
    assert_eq!(killer.cmd(&["SCRIPT", "KILL"]), "+OK");
    assert!(runner.reply().starts_with("-ERR Script killed by user"));
    assert_eq!(other.cmd(&["INCR", "busy:x"]), ":2");
    assert_healthy(&mut server);
}

#[test]
fn a_long_script_that_wrote_cannot_be_killed() {
    let mut server = busy_server();
    let mut runner = Conn::open(&server);
    let mut other = Conn::open(&server);
    runner.send(&[
        "EVAL",
        "redis.call('SET', 'busy:w', '1') while true do end",
        "0",
    ]);
    wait_busy(&mut other);
    let r = other.cmd(&["SCRIPT", "KILL"]);
    assert!(
        r.starts_with(
            "-UNKILLABLE Sorry the script already executed write commands against the dataset."
        ),
        "{r}"
    );
    // Only a hard stop ends it (Redis: SHUTDOWN NOSAVE).
    server.kill9();
}

/// A script that fills the VM up to its memory limit fails with Lua's memory error, and the
/// scripts after it run as before: the VM is collected (or made anew), not left full. Before,
/// every later EVAL failed with "Error compiling script ... not enough memory".
#[test]
fn a_script_past_the_memory_limit_fails_alone() {
    if std::env::var("MEMKEEP_CONFORMANCE").is_ok_and(|v| !v.is_empty()) {
        return; // Redis has no per-VM memory limit.
    }
    let mut server = memkeep(&[]);
    let mut c = Conn::open(&server);
    assert_eq!(c.cmd(&["SET", "mem:k", "v"]), "+OK");
    // 40 strings of 8 MB pass the VM's 256 MiB limit in a second or two.
    let hog = "local t = {} for i = 1, 40 do t[i] = string.rep('x', 8000000) .. i end return #t";
    for _ in 0..2 {
        let r = c.cmd(&["EVAL", hog, "0"]);
        assert!(r.starts_with("-ERR not enough memory"), "{r}");
        assert_eq!(
            c.cmd(&["EVAL", "return redis.call('GET', KEYS[1])", "1", "mem:k"]),
            "v"
        );
        assert_eq!(
            c.cmd(&["EVAL", "return redis.pcall('INCR', 'mem:n')", "0"]),
            ":1"
        );
        assert_eq!(c.cmd(&["DEL", "mem:n"]), ":1");
    }
    assert_healthy(&mut server);
}

/// PUBLISH from a script reaches a subscriber on another connection, and answers the number
/// of receivers (job queues announce work this way).
#[test]
fn a_script_publishes_to_subscribers() {
    let mut server = target(&[]);
    let mut sub = Conn::open(&server);
    let mut publisher = Conn::open(&server);
    sub.send(&["SUBSCRIBE", "jobs"]);
    assert_eq!(sub.reply(), "*3");
    assert_eq!(sub.reply(), "subscribe");
    assert_eq!(sub.reply(), "jobs");
    assert_eq!(sub.reply(), ":1");
    let script = "redis.call('RPUSH', KEYS[1], ARGV[1]) \
                  return redis.call('PUBLISH', 'jobs', ARGV[1])";
    assert_eq!(
        publisher.cmd(&["EVAL", script, "1", "jobs:q", "job-1"]),
        ":1"
    );
    assert_eq!(sub.reply(), "*3");
    assert_eq!(sub.reply(), "message");
    assert_eq!(sub.reply(), "jobs");
    assert_eq!(sub.reply(), "job-1");
    assert_eq!(
        publisher.cmd(&["EVAL", "return redis.call('PUBLISH', 'nobody', 'x')", "0"]),
        ":0"
    );
    assert!(publisher.cmd(&["DEL", "jobs:q"]).starts_with(':'));
    assert_healthy(&mut server);
}

/// A script begun on a leader (a worker that found the writer idle) that runs long, or that
/// publishes, is taken back and run again from the start on the writer thread: its writes
/// happen once, its message goes out once, and the next run of the same body goes straight to
/// the writer thread. Redis has no such path; the answers are what Redis gives.
#[test]
fn a_script_moved_off_a_leader_writes_and_publishes_once() {
    // `never`: no cohort rule, so whichever worker runs the EVAL leads when the writer is idle
    // (both moves were seen in the server's debug log with these scripts).
    let mut server = target(&["--sync", "never"]);
    let mut c = Conn::open(&server);
    let mut sub = Conn::open(&server);
    sub.send(&["SUBSCRIBE", "moved"]);
    for want in ["*3", "subscribe", "moved", ":1"] {
        assert_eq!(sub.reply(), want);
    }
    assert_eq!(
        c.cmd(&["DEL", "moved:n", "moved:s"]).chars().next(),
        Some(':')
    );
    // Past the leader's 20 ms after its INCR: a loop of a few tens of millions of additions
    // (Lua 5.1 runs it in well over 20 ms and far under the 5 s time limit).
    let slow = "local n = redis.call('INCR', KEYS[1]) \
                local x = 0 for i = 1, 20000000 do x = x + i end \
                return n";
    for want in [":1", ":2"] {
        let t = Instant::now();
        assert_eq!(c.cmd(&["EVAL", slow, "1", "moved:n"]), want);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
    assert_eq!(c.cmd(&["GET", "moved:n"]), "2");
    // A write, then a message: each happens once.
    let publishing = "redis.call('SET', KEYS[1], ARGV[1]) \
                      return redis.call('PUBLISH', 'moved', ARGV[1])";
    for (i, v) in ["a", "b", "c"].into_iter().enumerate() {
        assert_eq!(
            c.cmd(&["EVAL", publishing, "1", "moved:s", v]),
            ":1",
            "run {i}"
        );
        for want in ["*3", "message", "moved", v] {
            assert_eq!(sub.reply(), want, "run {i}");
        }
        assert_eq!(c.cmd(&["GET", "moved:s"]), v);
    }
    // Nothing more was published.
    sub.input
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut extra = String::new();
    assert!(
        sub.input.read_line(&mut extra).is_err(),
        "a message published twice: {extra:?}"
    );
    assert_healthy(&mut server);
}

/// A random Lua value as source text: numbers at MessagePack's boundaries, strings with NUL
/// bytes, nested arrays and maps (no nils or NaNs, which do not round-trip).
fn lua_value(rng: &mut Rng, depth: u32) -> String {
    const NUMS: &[&str] = &[
        "0",
        "1",
        "-1",
        "127",
        "128",
        "255",
        "256",
        "-32",
        "-33",
        "-128",
        "-129",
        "65535",
        "65536",
        "-32768",
        "-32769",
        "2^31",
        "-2^31",
        "2^32",
        "-2^32",
        "2^53",
        "-2^53",
        "2^62",
        "-2^63",
        "0.5",
        "-2.25",
        "0.1",
        "1e300",
        "-1e-300",
        "1/0",
        "-1/0",
        "3.4028234663852886e38",
    ];
    match rng.below(if depth > 3 { 3 } else { 5 }) {
        0 => NUMS[rng.below(NUMS.len() as u64) as usize].to_string(),
        1 => format!("{}", rng.next() as i64 >> rng.below(64)),
        2 => {
            let n = rng.below(3) * 20 + rng.below(20);
            format!("string.rep('a' .. string.char(0), {n})")
        }
        3 => {
            let items: Vec<String> = (0..rng.below(6))
                .map(|_| lua_value(rng, depth + 1))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        _ => {
            let items: Vec<String> = (0..rng.below(6))
                .map(|i| format!("k{i} = {}", lua_value(rng, depth + 1)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

const DEEP_EQUAL: &str = "local function eq(a, b) if type(a) ~= type(b) then return false end \
     if type(a) ~= 'table' then return a == b end \
     for k, v in pairs(a) do if not eq(v, b[k]) then return false end end \
     for k in pairs(b) do if a[k] == nil then return false end end return true end ";

/// cmsgpack.unpack gives back what cmsgpack.pack was given, value by value, for random nested
/// values packed together (and unpack_one walks the same stream); struct.unpack reads back
/// what struct.pack wrote. Against redis-server too under `MEMKEEP_CONFORMANCE=redis`.
#[test]
fn cmsgpack_and_struct_round_trip_random_values() {
    let mut server = target(&[]);
    let mut c = Conn::open(&server);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..60 {
        let values: Vec<String> = (0..1 + rng.below(4))
            .map(|_| lua_value(&mut rng, 0))
            .collect();
        let script = format!(
            "{DEEP_EQUAL} local v = {{{list}}} local p = cmsgpack.pack({list}) \
             local u = {{cmsgpack.unpack(p)}} if #u ~= #v then return 'count ' .. #u end \
             for i = 1, #v do if not eq(v[i], u[i]) then return 'value ' .. i end end \
             local off, i = 0, 0 repeat local r = {{cmsgpack.unpack_one(p, off)}} off = r[1] \
             i = i + 1 if not eq(r[2], v[i]) then return 'one ' .. i end until off == -1 \
             return 'ok'",
            list = values.join(", ")
        );
        assert_eq!(
            c.cmd(&["EVAL", &script, "0"]),
            "ok",
            "round {round}: {values:?}"
        );
    }
    // Every option once, in both byte orders and with alignment; c0 packs the whole string, and
    // is read back as c4.
    let struct_script = "local f = '<!4 b B h H i I l L T f d c3 s >i2 I3 i16 x c0' \
        local vals = {-5, 200, -30000, 60000, -2^31, 2^32 - 1, -2^53, 2^53, 12345, 0.5, -1e300, \
        'abc', 'zero', -2, 2^24 - 1, -77, 'tail'} \
        local p = struct.pack(f, unpack(vals)) \
        local r = {struct.unpack((string.gsub(f, 'c0', 'c4')), p)} \
        for i = 1, #vals do if r[i] ~= vals[i] then return 'field ' .. i .. ' ' .. tostring(r[i]) end end \
        if r[#vals + 1] ~= #p + 1 then return 'position' end return 'ok'";
    assert_eq!(c.cmd(&["EVAL", struct_script, "0"]), "ok");
    assert_healthy(&mut server);
}

/// Random bytes into cmsgpack.unpack and struct.unpack: each call answers values or a Lua
/// error the script catches, never anything worse (the server stays up and answers).
#[test]
fn library_unpacking_of_random_bytes_fails_cleanly() {
    let mut server = target(&[]);
    let mut c = Conn::open(&server);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..40 {
        let bytes: Vec<String> = (0..rng.below(40))
            .map(|_| rng.below(256).to_string())
            .collect();
        let data = if bytes.is_empty() {
            "''".to_string()
        } else {
            format!("string.char({})", bytes.join(", "))
        };
        let fmt: String = (0..1 + rng.below(6))
            .map(|_| {
                [
                    "b", "H", "i3", "l", "f", "d", "c0", "c2", "s", "!", ">", "x",
                ][rng.below(12) as usize]
            })
            .collect();
        let script = format!(
            "local d = {data} local n = 0 \
             for _, f in ipairs({{function() return cmsgpack.unpack(d) end, \
             function() return cmsgpack.unpack_limit(d, 2, 1) end, \
             function() return struct.unpack('{fmt}', d) end}}) do \
             local ok, e = pcall(f) if ok or type(e) == 'string' then n = n + 1 end end return n"
        );
        assert_eq!(c.cmd(&["EVAL", &script, "0"]), ":3", "{script}");
    }
    assert_healthy(&mut server);
}
