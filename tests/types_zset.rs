//! Sorted sets over RESP: every command's replies and errors (checked against redis-server
//! 7.0.15), WRONGTYPE both ways, empty sets disappearing, DEL of a big set, persistence across a
//! restart, RESP3 reply shapes, and a seeded model test of 2,000 random operations against an
//! in-test reference (member -> score maps, sorted on demand) with a restart in the middle.
//!
//! Invariants: every socket has a read timeout, so a missing reply fails instead of hanging;
//! there are no timing assertions; every loop is bounded; each test owns its server.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Options, Server};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
const IO_TIMEOUT: Duration = Duration::from_secs(30);
const WRONGTYPE: &str = "-WRONGTYPE Operation against a key holding the wrong kind of value";

// ---------------------------------------------------------------------------------------------
// A tiny RESP client

#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
    Double(String),
    Null,
    Map(Vec<(Reply, Reply)>),
    Other(String),
}

/// A compact rendering for assertions: `:1`, `$a`, `$nil`, `+OK`, `-ERR ..`, `,1.5`, `_`,
/// `[$a $1]`, `*nil`, `{$k $v}`.
fn render(r: &Reply) -> String {
    match r {
        Reply::Simple(s) => format!("+{s}"),
        Reply::Error(s) => format!("-{s}"),
        Reply::Int(n) => format!(":{n}"),
        Reply::Bulk(Some(b)) => format!("${}", String::from_utf8_lossy(b)),
        Reply::Bulk(None) => "$nil".into(),
        Reply::Array(Some(v)) => {
            let items: Vec<String> = v.iter().map(render).collect();
            format!("[{}]", items.join(" "))
        }
        Reply::Array(None) => "*nil".into(),
        Reply::Double(s) => format!(",{s}"),
        Reply::Null => "_".into(),
        Reply::Map(kv) => {
            let items: Vec<String> = kv
                .iter()
                .map(|(k, v)| format!("{} {}", render(k), render(v)))
                .collect();
            format!("{{{}}}", items.join(" "))
        }
        Reply::Other(s) => format!("?{s}"),
    }
}

struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Client {
    fn connect(server: &Server) -> Client {
        let addr = server.resp_addr().expect("RESP port");
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        s.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
        Client {
            r: BufReader::new(s.try_clone().expect("clone")),
            w: s,
        }
    }

    fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            let a = a.as_ref();
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&buf).expect("write request");
    }

    fn line(&mut self) -> String {
        let mut l = Vec::new();
        self.r.read_until(b'\n', &mut l).expect("read reply line");
        assert!(l.ends_with(b"\r\n"), "truncated reply line {l:?}");
        l.truncate(l.len() - 2);
        String::from_utf8(l).expect("utf-8 reply line")
    }

    fn read(&mut self) -> Reply {
        let l = self.line();
        let (t, rest) = l.split_at(1);
        let n = || rest.parse::<i64>().expect("length");
        match t {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(n()),
            "," => Reply::Double(rest.into()),
            "_" => Reply::Null,
            "$" if n() < 0 => Reply::Bulk(None),
            "$" => {
                let mut b = vec![0u8; n() as usize + 2];
                self.r.read_exact(&mut b).expect("read bulk");
                b.truncate(b.len() - 2);
                Reply::Bulk(Some(b))
            }
            "*" | "~" if n() < 0 => Reply::Array(None),
            "*" | "~" => Reply::Array(Some((0..n()).map(|_| self.read()).collect())),
            "%" => Reply::Map((0..n()).map(|_| (self.read(), self.read())).collect()),
            _ => Reply::Other(l.clone()),
        }
    }

    fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        self.send(args);
        self.read()
    }

    /// Sends `cmd` split on spaces; the rendered reply.
    fn q(&mut self, cmd: &str) -> String {
        let args: Vec<&str> = cmd.split(' ').collect();
        render(&self.call(&args))
    }
}

fn start() -> Server {
    Server::start_with(
        BIN,
        Options {
            resp: true,
            ..Options::default()
        },
    )
}

/// Checks each (command, rendered reply) in order on one connection.
fn check(c: &mut Client, cases: &[(&str, &str)]) {
    for (cmd, want) in cases {
        assert_eq!(c.q(cmd), *want, "{cmd}");
    }
}

fn assert_healthy(server: &mut Server) {
    let stderr = server.stderr();
    assert!(!stderr.contains("panicked"), "server panicked:\n{stderr}");
    assert!(server.is_running(), "server exited:\n{stderr}");
}

// ---------------------------------------------------------------------------------------------
// Replies and errors, command by command

#[test]
fn zadd_options_and_errors() {
    let mut server = start();
    let mut c = Client::connect(&server);
    check(
        &mut c,
        &[
            (
                "ZADD z",
                "-ERR wrong number of arguments for 'zadd' command",
            ),
            (
                "ZADD z 1",
                "-ERR wrong number of arguments for 'zadd' command",
            ),
            (
                "ZADD z NX",
                "-ERR wrong number of arguments for 'zadd' command",
            ),
            ("ZADD z 1 a 2", "-ERR syntax error"),
            ("ZADD z NX XX", "-ERR syntax error"),
            ("ZADD z x a", "-ERR value is not a valid float"),
            ("ZADD z 1 a x b", "-ERR value is not a valid float"),
            ("ZADD z nan a", "-ERR value is not a valid float"),
            ("ZADD z 1e400 a", "-ERR value is not a valid float"),
            ("ZADD z 1e-400 a", "-ERR value is not a valid float"),
            (
                "ZADD z NX XX 1 a",
                "-ERR XX and NX options at the same time are not compatible",
            ),
            (
                "ZADD z GT LT 1 a",
                "-ERR GT, LT, and/or NX options at the same time are not compatible",
            ),
            (
                "ZADD z NX GT 1 a",
                "-ERR GT, LT, and/or NX options at the same time are not compatible",
            ),
            (
                "ZADD z NX LT 1 a",
                "-ERR GT, LT, and/or NX options at the same time are not compatible",
            ),
            (
                "ZADD z INCR 1 a 2 b",
                "-ERR INCR option supports a single increment-element pair",
            ),
            ("EXISTS z", ":0"),
            // XX on a missing key creates nothing.
            ("ZADD z XX 1 a", ":0"),
            ("ZADD z XX INCR 1 a", "$nil"),
            ("EXISTS z", ":0"),
            ("ZADD z 1 a", ":1"),
            ("ZADD z +1 a", ":0"),
            ("ZADD z .5 b inf c Infinity d -INF e", ":4"),
            ("ZADD z 1 a", ":0"),
            ("ZADD z CH 2 a 3 b 4 f", ":3"),
            ("ZADD z XX CH 5 a 6 newone", ":1"),
            ("ZADD z NX 9 a 9 g", ":1"),
            ("ZADD z GT CH 1 a 10 b", ":1"),
            ("ZADD z LT CH 100 a 1 b", ":1"),
            // GT/LT never stop a new member.
            ("ZADD z GT 1 newmem", ":1"),
            (
                "ZRANGE z 0 -1 WITHSCORES",
                "[$e $-inf $b $1 $newmem $1 $f $4 $a $5 $g $9 $c $inf $d $inf]",
            ),
            ("ZADD z INCR inf a", "$inf"),
            (
                "ZADD z INCR -inf a",
                "-ERR resulting score is not a number (NaN)",
            ),
            ("ZSCORE z a", "$inf"),
            ("ZADD z GT INCR 1 a", "$nil"),
            ("ZADD z LT INCR -1 a", "$nil"),
            ("ZADD z NX INCR 1 a", "$nil"),
            ("ZADD z XX INCR 1 zz", "$nil"),
            ("ZADD z CH INCR 1 a", "$inf"),
            // The last of repeated members wins; counted once.
            ("ZADD y 1 a 1 a 2 a", ":1"),
            ("ZSCORE y a", "$2"),
            ("ZADD y CH 3 a 3 a", ":1"),
            ("ZADD y XX GT CH 5 a 0 m", ":1"),
            ("ZRANGE y 0 -1 WITHSCORES", "[$a $5]"),
            ("ZADD y INCR 2.5 a", "$7.5"),
            ("TYPE y", "+zset"),
        ],
    );
    assert_healthy(&mut server);
}

#[test]
fn zincrby_and_scores() {
    let mut server = start();
    let mut c = Client::connect(&server);
    check(
        &mut c,
        &[
            (
                "ZINCRBY z 1",
                "-ERR wrong number of arguments for 'zincrby' command",
            ),
            ("ZINCRBY z abc a", "-ERR value is not a valid float"),
            ("ZINCRBY z nan a", "-ERR value is not a valid float"),
            ("ZINCRBY z 5 m", "$5"),
            ("ZINCRBY z 2.5 m", "$7.5"),
            ("ZINCRBY z -7.5 m", "$0"),
            ("ZINCRBY z inf m", "$inf"),
            (
                "ZINCRBY z -inf m",
                "-ERR resulting score is not a number (NaN)",
            ),
            ("ZSCORE z m", "$inf"),
            ("ZSCORE z nope", "$nil"),
            ("ZSCORE nokey m", "$nil"),
            (
                "ZSCORE z",
                "-ERR wrong number of arguments for 'zscore' command",
            ),
            (
                "ZMSCORE z",
                "-ERR wrong number of arguments for 'zmscore' command",
            ),
            ("ZMSCORE z m nope m", "[$inf $nil $inf]"),
            ("ZMSCORE nokey a b", "[$nil $nil]"),
            ("ZCARD z", ":1"),
            ("ZCARD nokey", ":0"),
            (
                "ZCARD",
                "-ERR wrong number of arguments for 'zcard' command",
            ),
        ],
    );
    // Score text as Redis 7.0 replies (%.17g), checked against redis-server 7.0.15.
    check(
        &mut c,
        &[(
            "ZADD f 1 a 1.5 b 0.1 c 1e20 d -inf e 3.0000000000000004 f -0 g 0.0001 i 1e-5 j 1e16 k 1e17 l 123456789.125 m",
            ":12",
        )],
    );
    let scores = [
        ("a", "1"),
        ("b", "1.5"),
        ("c", "0.10000000000000001"),
        ("d", "1e+20"),
        ("e", "-inf"),
        ("f", "3.0000000000000004"),
        ("g", "0"),
        ("i", "0.0001"),
        ("j", "1.0000000000000001e-05"),
        ("k", "10000000000000000"),
        ("l", "1e+17"),
        ("m", "123456789.125"),
    ];
    for (m, s) in scores {
        assert_eq!(
            c.q(&format!("ZSCORE f {m}")),
            format!("${s}"),
            "ZSCORE f {m}"
        );
    }
    assert_eq!(
        c.q("ZRANGE f 0 -1 WITHSCORES"),
        "[$e $-inf $g $0 $j $1.0000000000000001e-05 $i $0.0001 $c $0.10000000000000001 $a $1 \
         $b $1.5 $f $3.0000000000000004 $m $123456789.125 $k $10000000000000000 $l $1e+17 \
         $d $1e+20]"
    );
    // ZSCAN shows scores as a small Redis set stores them.
    assert_eq!(
        c.q("ZSCAN f 0 MATCH [jkl] COUNT 100"),
        "[$0 [$j $1.0000000000000001e-05 $k $10000000000000000 $l $100000000000000000]]"
    );
    assert_healthy(&mut server);
}

#[test]
fn ranks_counts_and_removal() {
    let mut server = start();
    let mut c = Client::connect(&server);
    check(
        &mut c,
        &[
            ("ZADD z 1 a 2 b 3 c 4 d 5 e", ":5"),
            ("ZRANK z a", ":0"),
            ("ZRANK z e", ":4"),
            ("ZREVRANK z a", ":4"),
            ("ZREVRANK z d", ":1"),
            ("ZRANK z nope", "$nil"),
            ("ZRANK nokey a", "$nil"),
            (
                "ZRANK z",
                "-ERR wrong number of arguments for 'zrank' command",
            ),
            (
                "ZRANK z a b",
                "-ERR wrong number of arguments for 'zrank' command",
            ),
            ("ZCOUNT z x 1", "-ERR min or max is not a float"),
            ("ZCOUNT nokey x 1", "-ERR min or max is not a float"),
            ("ZCOUNT nokey 0 1", ":0"),
            ("ZCOUNT z -inf +inf", ":5"),
            ("ZCOUNT z (1 (5", ":3"),
            ("ZCOUNT z (1 +inf", ":4"),
            ("ZCOUNT z -inf (5", ":4"),
            ("ZCOUNT z 2 4", ":3"),
            ("ZCOUNT z 3 3", ":1"),
            ("ZCOUNT z (3 3", ":0"),
            ("ZCOUNT z 4 2", ":0"),
            ("ZLEXCOUNT z - +", ":5"),
            ("ZLEXCOUNT z [b (d", ":2"),
            ("ZLEXCOUNT z - -", ":0"),
            ("ZLEXCOUNT z + -", ":0"),
            ("ZLEXCOUNT z [a [a", ":1"),
            (
                "ZLEXCOUNT z x +",
                "-ERR min or max not valid string range item",
            ),
            (
                "ZREM z",
                "-ERR wrong number of arguments for 'zrem' command",
            ),
            ("ZREM z a x a", ":1"),
            ("ZREM nokey a", ":0"),
            (
                "ZREMRANGEBYRANK z x 1",
                "-ERR value is not an integer or out of range",
            ),
            (
                "ZREMRANGEBYRANK z 0 1.5",
                "-ERR value is not an integer or out of range",
            ),
            ("ZREMRANGEBYRANK z 0 0", ":1"),
            ("ZREMRANGEBYRANK z -1 -1", ":1"),
            ("ZREMRANGEBYRANK z 5 9", ":0"),
            ("ZRANGE z 0 -1", "[$c $d]"),
            ("ZREMRANGEBYSCORE z x 1", "-ERR min or max is not a float"),
            ("ZREMRANGEBYSCORE z (3 4", ":1"),
            ("ZREMRANGEBYSCORE nokey (2 3", ":0"),
            ("ZRANGE z 0 -1 WITHSCORES", "[$c $3]"),
            (
                "ZREMRANGEBYLEX z x +",
                "-ERR min or max not valid string range item",
            ),
            ("ZADD l 0 a 0 b 0 c 0 d", ":4"),
            ("ZREMRANGEBYLEX l [a (c", ":2"),
            ("ZRANGE l 0 -1", "[$c $d]"),
        ],
    );
    assert_healthy(&mut server);
}

#[test]
fn pops() {
    let mut server = start();
    let mut c = Client::connect(&server);
    check(
        &mut c,
        &[
            ("ZADD z 1 a 2 b 3 c", ":3"),
            (
                "ZPOPMIN z x",
                "-ERR value is out of range, must be positive",
            ),
            (
                "ZPOPMIN z -1",
                "-ERR value is out of range, must be positive",
            ),
            (
                "ZPOPMIN nokey -1",
                "-ERR value is out of range, must be positive",
            ),
            (
                "ZPOPMAX z 1.5",
                "-ERR value is out of range, must be positive",
            ),
            ("ZPOPMIN z 1 2", "-ERR syntax error"),
            ("ZPOPMIN z 1", "[$a $1]"),
            ("ZPOPMIN z 0", "[]"),
            ("ZPOPMIN nokey", "[]"),
            ("ZPOPMIN nokey 2", "[]"),
            ("ZPOPMAX z 5", "[$c $3 $b $2]"),
            ("EXISTS z", ":0"),
            ("ZADD z 1 a 2 b", ":2"),
            ("ZPOPMAX z", "[$b $2]"),
            ("ZPOPMIN z", "[$a $1]"),
            ("ZPOPMIN z", "[]"),
            ("EXISTS z", ":0"),
        ],
    );
    assert_healthy(&mut server);
}

#[test]
fn range_forms() {
    let mut server = start();
    let mut c = Client::connect(&server);
    let limit_rank =
        "-ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX";
    let lex_scores = "-ERR syntax error, WITHSCORES not supported in combination with BYLEX";
    check(
        &mut c,
        &[
            ("ZADD z 1 a 2 b 3 c 4 d 5 e", ":5"),
            (
                "ZRANGE z",
                "-ERR wrong number of arguments for 'zrange' command",
            ),
            (
                "ZRANGE z a 1",
                "-ERR value is not an integer or out of range",
            ),
            (
                "ZRANGE nokey a 1",
                "-ERR value is not an integer or out of range",
            ),
            ("ZRANGE nokey 0 -1", "[]"),
            ("ZRANGE z 0 -1", "[$a $b $c $d $e]"),
            ("ZRANGE z 1 2 WITHSCORES", "[$b $2 $c $3]"),
            ("ZRANGE z -2 -1", "[$d $e]"),
            ("ZRANGE z -100 100", "[$a $b $c $d $e]"),
            ("ZRANGE z 3 1", "[]"),
            ("ZRANGE z 5 10", "[]"),
            ("ZRANGE z 0 -1 REV", "[$e $d $c $b $a]"),
            ("ZRANGE z 0 1 REV WITHSCORES", "[$e $5 $d $4]"),
            (
                "ZRANGE z 0 -1 WITHSCORES WITHSCORES",
                "[$a $1 $b $2 $c $3 $d $4 $e $5]",
            ),
            ("ZRANGE z 0 -1 LIMIT 0 1", limit_rank),
            ("ZRANGE z 0 -1 LIMIT 0 -1", "[$a $b $c $d $e]"),
            ("ZRANGE z 0 -1 LIMIT 0", "-ERR syntax error"),
            ("ZRANGE z 0 -1 FOO", "-ERR syntax error"),
            ("ZRANGE z 0 -1 REV REV", "-ERR syntax error"),
            ("ZRANGE z 0 -1 BYSCORE BYLEX", "-ERR syntax error"),
            ("ZRANGE z - + BYLEX WITHSCORES", lex_scores),
            ("ZRANGE z - + BYLEX", "[$a $b $c $d $e]"),
            ("ZRANGE z (a [c BYLEX", "[$b $c]"),
            (
                "ZRANGE z a c BYLEX",
                "-ERR min or max not valid string range item",
            ),
            ("ZRANGE z + - BYLEX REV LIMIT 1 2", "[$d $c]"),
            ("ZRANGE z 1 3 BYSCORE LIMIT -1 2", "[]"),
            ("ZRANGE z 1 3 BYSCORE LIMIT 1 -1", "[$b $c]"),
            ("ZRANGE z 1 3 BYSCORE LIMIT 1 0", "[]"),
            ("ZRANGE z 1 3 BYSCORE LIMIT 5 1", "[]"),
            (
                "ZRANGE z 1 3 BYSCORE LIMIT x 1",
                "-ERR value is not an integer or out of range",
            ),
            ("ZRANGE z (1 3 BYSCORE", "[$b $c]"),
            ("ZRANGE z (1 (3 BYSCORE", "[$b]"),
            ("ZRANGE z 3 1 BYSCORE REV", "[$c $b $a]"),
            ("ZRANGE z 3 1 BYSCORE REV WITHSCORES LIMIT 1 1", "[$b $2]"),
            (
                "ZRANGE z +inf -inf BYSCORE REV LIMIT 0 1 WITHSCORES",
                "[$e $5]",
            ),
            ("ZRANGE z 1 x BYSCORE", "-ERR min or max is not a float"),
            ("ZRANGE z (x 1 BYSCORE", "-ERR min or max is not a float"),
            ("ZRANGE z ( 1 BYSCORE", "[$a]"),
            ("ZREVRANGE z 0 1", "[$e $d]"),
            ("ZREVRANGE z 0 1 WITHSCORES", "[$e $5 $d $4]"),
            ("ZREVRANGE z 0 1 REV", "-ERR syntax error"),
            ("ZREVRANGE z 0 1 LIMIT 0 1", limit_rank),
            ("ZRANGEBYSCORE z -inf +inf", "[$a $b $c $d $e]"),
            ("ZRANGEBYSCORE z 1 1e400", "[$a $b $c $d $e]"),
            ("ZRANGEBYSCORE z 1 3 BYSCORE", "-ERR syntax error"),
            ("ZRANGEBYSCORE z 1 3 REV", "-ERR syntax error"),
            ("ZRANGEBYSCORE z nan 3", "-ERR min or max is not a float"),
            (
                "ZRANGEBYSCORE z 1 3 LIMIT 0 1 WITHSCORES LIMIT 1 1",
                "[$b $2]",
            ),
            ("ZRANGEBYSCORE z (2 2", "[]"),
            ("ZRANGEBYSCORE z 2 2", "[$b]"),
            ("ZRANGEBYSCORE z 3 1", "[]"),
            (
                "ZREVRANGEBYSCORE z 3 1 WITHSCORES LIMIT 1 5",
                "[$b $2 $a $1]",
            ),
            ("ZREVRANGEBYSCORE z (3 (1", "[$b]"),
            ("ZREVRANGEBYSCORE z 1 3", "[]"),
            ("ZREVRANGEBYSCORE z +inf -inf LIMIT 0 2", "[$e $d]"),
            ("ZRANGEBYLEX z - +", "[$a $b $c $d $e]"),
            ("ZRANGEBYLEX z [b [b", "[$b]"),
            ("ZRANGEBYLEX z (b (b", "[]"),
            (
                "ZRANGEBYLEX z x +",
                "-ERR min or max not valid string range item",
            ),
            ("ZRANGEBYLEX z - + WITHSCORES", lex_scores),
            ("ZRANGEBYLEX z - + LIMIT 1 2", "[$b $c]"),
            ("ZREVRANGEBYLEX z + - LIMIT 0 2", "[$e $d]"),
            ("ZREVRANGEBYLEX z [c (a", "[$c $b]"),
        ],
    );
    // The empty member, and lex bounds around it.
    assert_eq!(render(&c.call(&["ZADD", "z", "1", ""])), ":1");
    check(
        &mut c,
        &[
            ("ZRANGE z 0 1", "[$ $a]"),
            ("ZRANGEBYLEX z [ +", "[$ $a $b $c $d $e]"),
            ("ZRANGEBYLEX z ( +", "[$a $b $c $d $e]"),
            ("ZRANGEBYLEX z - [", "[$]"),
            ("ZRANK z a", ":1"),
        ],
    );
    assert_eq!(render(&c.call(&["ZSCORE", "z", ""])), "$1");
    assert_eq!(render(&c.call(&["ZRANGEBYSCORE", "z", "", "1"])), "[$ $a]");
    assert_healthy(&mut server);
}

#[test]
fn zscan_walks_every_member() {
    let mut server = start();
    let mut c = Client::connect(&server);
    check(
        &mut c,
        &[
            ("ZSCAN nokey 0", "[$0 []]"),
            ("ZSCAN nokey 0 COUNT 0", "[$0 []]"),
            ("ZSCAN nokey x", "-ERR invalid cursor"),
            ("ZADD z 1 a 2 b 3 c", ":3"),
            ("ZSCAN z x", "-ERR invalid cursor"),
            ("ZSCAN z 0 COUNT 0", "-ERR syntax error"),
            (
                "ZSCAN z 0 COUNT x",
                "-ERR value is not an integer or out of range",
            ),
            ("ZSCAN z 0 MATCH", "-ERR syntax error"),
            ("ZSCAN z 0 FOO bar", "-ERR syntax error"),
            ("ZSCAN z 0", "[$0 [$a $1 $b $2 $c $3]]"),
            ("ZSCAN z 0 MATCH [a-b]", "[$0 [$a $1 $b $2]]"),
        ],
    );
    // 1000 members, 7 per call: every member exactly once, in member order.
    let mut args: Vec<String> = vec!["ZADD".into(), "big".into()];
    for i in 0..1000 {
        args.push((i % 13).to_string());
        args.push(format!("m{i:04}"));
    }
    assert_eq!(render(&c.call(&args)), ":1000");
    let mut cursor = "0".to_string();
    let mut seen = Vec::new();
    for _ in 0..1000 {
        let Reply::Array(Some(r)) = c.call(&["ZSCAN", "big", &cursor, "COUNT", "7"]) else {
            panic!("ZSCAN reply");
        };
        let (Reply::Bulk(Some(next)), Reply::Array(Some(items))) = (&r[0], &r[1]) else {
            panic!("ZSCAN shape {r:?}");
        };
        assert!(items.len() <= 14);
        for pair in items.chunks(2) {
            let (Reply::Bulk(Some(m)), Reply::Bulk(Some(s))) = (&pair[0], &pair[1]) else {
                panic!("ZSCAN pair {pair:?}");
            };
            let m = String::from_utf8(m.clone()).unwrap();
            let i: usize = m[1..].parse().unwrap();
            assert_eq!(s, (i % 13).to_string().as_bytes());
            seen.push(m);
        }
        cursor = String::from_utf8(next.clone()).unwrap();
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(cursor, "0", "ZSCAN did not finish");
    let want: Vec<String> = (0..1000).map(|i| format!("m{i:04}")).collect();
    assert_eq!(seen, want);
    let Reply::Array(Some(r)) = c.call(&["ZSCAN", "big", "0", "MATCH", "m00*", "COUNT", "2000"])
    else {
        panic!("ZSCAN reply");
    };
    assert_eq!(render(&r[0]), "$0");
    let Reply::Array(Some(items)) = &r[1] else {
        panic!("items");
    };
    assert_eq!(items.len(), 200);
    assert_healthy(&mut server);
}

#[test]
fn members_longer_than_the_limit_are_refused() {
    let mut server = start();
    let mut c = Client::connect(&server);
    let ok = "x".repeat(495);
    let long = "y".repeat(496);
    let err = "-ERR sorted-set member longer than 495 bytes (memkeep's limit)";
    assert_eq!(render(&c.call(&["ZADD", "z", "1", &ok])), ":1");
    assert_eq!(render(&c.call(&["ZADD", "z", "1", &long])), err);
    assert_eq!(render(&c.call(&["ZADD", "z", "1", "a", "2", &long])), err);
    assert_eq!(render(&c.call(&["ZINCRBY", "z", "1", &long])), err);
    assert_eq!(render(&c.call(&["ZSCORE", "z", &long])), "$nil");
    assert_eq!(render(&c.call(&["ZRANK", "z", &long])), "$nil");
    assert_eq!(render(&c.call(&["ZREM", "z", &long])), ":0");
    assert_eq!(c.q("ZCARD z"), ":1");
    assert_eq!(
        render(&c.call(&["ZSCORE", "z", &ok])),
        "$1",
        "a member of exactly 495 bytes is stored"
    );
    // Lex bounds longer than any member still order correctly.
    let above = format!("[{}", "x".repeat(600));
    let below = format!("({}", "w".repeat(600));
    assert_eq!(render(&c.call(&["ZLEXCOUNT", "z", "-", &above])), ":1");
    assert_eq!(render(&c.call(&["ZLEXCOUNT", "z", &below, &above])), ":1");
    assert_eq!(render(&c.call(&["ZLEXCOUNT", "z", &above, "+"])), ":0");
    assert_healthy(&mut server);
}

// ---------------------------------------------------------------------------------------------
// Types, lifetime, persistence, RESP3

#[test]
fn wrongtype_both_ways() {
    let mut server = start();
    let mut c = Client::connect(&server);
    check(&mut c, &[("SET s v", "+OK"), ("ZADD z 1 a", ":1")]);
    for cmd in [
        "ZADD s 1 a",
        "ZINCRBY s 1 a",
        "ZREM s a",
        "ZREMRANGEBYRANK s 0 1",
        "ZREMRANGEBYSCORE s 0 1",
        "ZREMRANGEBYLEX s - +",
        "ZPOPMIN s",
        "ZPOPMIN s 0",
        "ZPOPMAX s 2",
        "ZSCORE s a",
        "ZMSCORE s a",
        "ZRANK s a",
        "ZREVRANK s a",
        "ZCARD s",
        "ZCOUNT s 0 1",
        "ZLEXCOUNT s - +",
        "ZRANGE s 0 1",
        "ZREVRANGE s 0 1",
        "ZRANGEBYSCORE s 0 1",
        "ZREVRANGEBYSCORE s 1 0",
        "ZRANGEBYLEX s - +",
        "ZREVRANGEBYLEX s + -",
        "ZSCAN s 0",
        "ZSCAN s 0 COUNT 0",
        "ZADD s XX 1 a",
        "GET z",
        "LPUSH z x",
        "LLEN z",
        "INCR z",
        "APPEND z x",
    ] {
        assert_eq!(c.q(cmd), WRONGTYPE, "{cmd}");
    }
    // Argument errors come first, as in Redis.
    check(
        &mut c,
        &[
            (
                "ZRANGE s a b",
                "-ERR value is not an integer or out of range",
            ),
            ("ZRANGEBYSCORE s x 1", "-ERR min or max is not a float"),
            ("ZSCAN s x", "-ERR invalid cursor"),
            ("ZINCRBY s x a", "-ERR value is not a valid float"),
            ("TYPE z", "+zset"),
            ("GET s", "$v"),
            ("SET z v", "+OK"),
            ("ZCARD z", WRONGTYPE),
            ("ZADD z 1 a", WRONGTYPE),
        ],
    );
    assert_healthy(&mut server);
}

#[test]
fn empty_sets_disappear() {
    let mut server = start();
    let mut c = Client::connect(&server);
    for (fill, empty) in [
        ("ZADD z 1 a 2 b", "ZREM z a b c"),
        ("ZADD z 1 a 2 b", "ZPOPMIN z 5"),
        ("ZADD z 1 a 2 b", "ZPOPMAX z 2"),
        ("ZADD z 1 a 2 b", "ZREMRANGEBYRANK z 0 -1"),
        ("ZADD z 1 a 2 b", "ZREMRANGEBYSCORE z -inf +inf"),
        ("ZADD z 0 a 0 b", "ZREMRANGEBYLEX z - +"),
    ] {
        assert_eq!(c.q(fill), ":2", "{fill}");
        assert!(c.q(empty).len() > 1, "{empty}");
        check(
            &mut c,
            &[
                ("EXISTS z", ":0"),
                ("TYPE z", "+none"),
                ("ZCARD z", ":0"),
                ("ZRANGE z 0 -1", "[]"),
                ("KEYS *", "[]"),
            ],
        );
    }
    check(
        &mut c,
        &[
            ("ZADD z 1 a", ":1"),
            ("ZPOPMIN z", "[$a $1]"),
            ("EXISTS z", ":0"),
            // Nothing to remove creates nothing.
            ("ZREM z a", ":0"),
            ("ZADD z XX 1 a", ":0"),
            ("EXISTS z", ":0"),
        ],
    );
    assert_healthy(&mut server);
}

#[test]
fn del_of_a_big_zset_returns_and_leaves_nothing() {
    let mut server = start();
    let mut c = Client::connect(&server);
    for batch in 0..20 {
        let mut args: Vec<String> = vec!["ZADD".into(), "big".into()];
        for i in 0..1000 {
            let n = batch * 1000 + i;
            args.push(n.to_string());
            args.push(format!("member:{n}"));
        }
        assert_eq!(render(&c.call(&args)), ":1000");
    }
    check(
        &mut c,
        &[
            ("ZCARD big", ":20000"),
            ("ZRANK big member:19999", ":19999"),
            ("ZRANGE big 9999 10000", "[$member:9999 $member:10000]"),
            (
                "ZRANGE big 19998 -1 WITHSCORES",
                "[$member:19998 $19998 $member:19999 $19999]",
            ),
            ("DEL big", ":1"),
            ("EXISTS big", ":0"),
            ("ZCARD big", ":0"),
            ("ZSCORE big member:5", "$nil"),
            // A new set under the same name sees none of the old members.
            ("ZADD big 1 fresh", ":1"),
            ("ZRANGE big 0 -1", "[$fresh]"),
            ("ZCOUNT big -inf +inf", ":1"),
            ("ZLEXCOUNT big - +", ":1"),
            ("ZSCAN big 0", "[$0 [$fresh $1]]"),
        ],
    );
    // Whatever the collector has or has not reclaimed yet, the replies stay right.
    for _ in 0..50 {
        assert_eq!(c.q("ZRANGE big 0 -1 WITHSCORES"), "[$fresh $1]");
    }
    assert_healthy(&mut server);
}

#[test]
fn data_survives_restart() {
    let mut server = start();
    {
        let mut c = Client::connect(&server);
        check(
            &mut c,
            &[
                ("ZADD z 1 a 2.5 b -inf c 0.1 d", ":4"),
                ("ZINCRBY z 1 a", "$2"),
                ("ZADD gone 1 x", ":1"),
                ("ZREM gone x", ":1"),
                ("RENAME z z2", "+OK"),
            ],
        );
    }
    server.restart();
    let mut c = Client::connect(&server);
    check(
        &mut c,
        &[
            ("EXISTS gone z", ":0"),
            ("ZCARD z2", ":4"),
            (
                "ZRANGE z2 0 -1 WITHSCORES",
                "[$c $-inf $d $0.10000000000000001 $a $2 $b $2.5]",
            ),
            ("ZRANK z2 b", ":3"),
            ("ZSCORE z2 d", "$0.10000000000000001"),
            ("ZADD z2 3 e", ":1"),
            ("ZREVRANGE z2 0 0", "[$e]"),
        ],
    );
    assert_healthy(&mut server);
}

/// FLUSHALL deletes the meta record `colls` (whether collections may exist); the next
/// collection written must put it back, or `memkeep check` reports "collections are stored but
/// the meta record `colls` is missing" (and a restart would not reclaim the elements of an
/// overwritten collection).
#[test]
fn a_collection_written_after_flushall_restores_the_colls_record() {
    let mut server = start();
    let mut c = Client::connect(&server);
    check(
        &mut c,
        &[
            ("ZADD z 1 a", ":1"),
            ("FLUSHALL", "+OK"),
            ("ZADD z 1 a", ":1"),
        ],
    );
    assert_healthy(&mut server);
    server.stop();
    server.assert_check_clean();
    server.restart();
    let mut c = Client::connect(&server);
    check(
        &mut c,
        &[
            ("FLUSHALL", "+OK"),
            ("SADD s x y", ":2"),
            ("ZUNIONSTORE u 2 s z", ":2"),
            ("ZUNIONSTORE u 1 s WEIGHTS 3", ":2"),
            ("ZRANGE u 0 -1 WITHSCORES", "[$x $3 $y $3]"),
        ],
    );
    assert_healthy(&mut server);
    server.stop();
    server.assert_check_clean();
}

/// A STORE form's destination serves a client blocked on it (whether the write comes before
/// or after the pop registers, the pop gets the stored member).
#[test]
fn store_forms_serve_a_blocked_pop() {
    let mut server = start();
    let mut a = Client::connect(&server);
    let mut b = Client::connect(&server);
    check(&mut b, &[("ZADD src 1 x 2 y", ":2")]);
    a.send(&["BZPOPMIN", "d", "10"]);
    check(&mut b, &[("ZINTERSTORE d 1 src WEIGHTS 2", ":2")]);
    assert_eq!(render(&a.read()), "[$d $x $2]");
    a.send(&["BZPOPMAX", "e", "10"]);
    check(&mut b, &[("ZRANGESTORE e src 0 0", ":1")]);
    assert_eq!(render(&a.read()), "[$e $x $1]");
    check(&mut b, &[("ZRANGE d 0 -1 WITHSCORES", "[$y $4]")]);
    assert_healthy(&mut server);
}

#[test]
fn resp3_reply_shapes() {
    let mut server = start();
    let mut c = Client::connect(&server);
    assert!(c.q("HELLO 3").starts_with('{'));
    check(
        &mut c,
        &[
            ("ZADD z 1 a 2 b 0.1 c", ":3"),
            ("ZSCORE z c", ",0.10000000000000001"),
            ("ZSCORE z nope", "_"),
            ("ZRANK z nope", "_"),
            ("ZMSCORE z a nope", "[,1 _]"),
            ("ZRANGE z 0 -1", "[$c $a $b]"),
            (
                "ZRANGE z 0 1 WITHSCORES",
                "[[$c ,0.10000000000000001] [$a ,1]]",
            ),
            ("ZREVRANGE z 0 0 WITHSCORES", "[[$b ,2]]"),
            ("ZRANGEBYSCORE z 1 +inf WITHSCORES", "[[$a ,1] [$b ,2]]"),
            (
                "ZREVRANGEBYSCORE z +inf 1 WITHSCORES LIMIT 0 1",
                "[[$b ,2]]",
            ),
            ("ZRANGE nokey 0 -1 WITHSCORES", "[]"),
            ("ZINCRBY z 1 b", ",3"),
            ("ZADD z INCR 1 b", ",4"),
            ("ZADD z XX INCR 1 nope", "_"),
            // ZSCAN's scores stay bulk strings.
            ("ZSCAN z 0", "[$0 [$a $1 $b $4 $c $0.10000000000000001]]"),
            ("ZPOPMAX z", "[$b ,4]"),
            ("ZPOPMIN nokey", "[]"),
        ],
    );
    assert_healthy(&mut server);
}

#[test]
fn rank_ranges_from_both_ends_of_a_large_set() {
    let mut server = start();
    let mut c = Client::connect(&server);
    let n = 3000usize;
    let mut args: Vec<String> = vec!["ZADD".into(), "z".into()];
    for i in 0..n {
        args.push((i / 3).to_string()); // ties: member order decides
        args.push(format!("m{:05}", n - i));
    }
    assert_eq!(render(&c.call(&args)), format!(":{n}"));
    // The reference order: by score, then member.
    let mut order: Vec<(usize, String)> =
        (0..n).map(|i| (i / 3, format!("m{:05}", n - i))).collect();
    order.sort();
    let names = |r: std::ops::Range<usize>, rev: bool| -> String {
        let v: Vec<String> = if rev {
            order
                .iter()
                .rev()
                .skip(r.start)
                .take(r.len())
                .map(|(_, m)| format!("${m}"))
                .collect()
        } else {
            order[r].iter().map(|(_, m)| format!("${m}")).collect()
        };
        format!("[{}]", v.join(" "))
    };
    for (s, e) in [
        (0, 49),
        (10, 20),
        (1500, 1510),
        (2900, 2999),
        (2990, 3005),
        (0, 0),
        (2999, 2999),
    ] {
        assert_eq!(
            c.q(&format!("ZRANGE z {s} {e}")),
            names(s..(e + 1).min(n), false),
            "{s} {e}"
        );
        assert_eq!(
            c.q(&format!("ZREVRANGE z {s} {e}")),
            names(s..(e + 1).min(n), true),
            "rev {s} {e}"
        );
        assert_eq!(
            c.q(&format!("ZRANGE z {s} {e} REV")),
            names(s..(e + 1).min(n), true),
            "REV {s} {e}"
        );
    }
    assert_eq!(c.q("ZRANGE z -3 -1"), names(n - 3..n, false));
    for i in [0, 1, 2, 3, 777, 1499, 1500, 2998, 2999] {
        let m = &order[i].1;
        assert_eq!(c.q(&format!("ZRANK z {m}")), format!(":{i}"));
        assert_eq!(c.q(&format!("ZREVRANK z {m}")), format!(":{}", n - 1 - i));
    }
    for (lo, hi) in [
        ("-inf", "+inf"),
        ("0", "0"),
        ("(0", "5"),
        ("10", "(900"),
        ("990", "+inf"),
    ] {
        let inside = |s: usize| {
            let s = s as f64;
            let ok_lo = match lo {
                "-inf" => true,
                l if l.starts_with('(') => s > l[1..].parse::<f64>().unwrap(),
                l => s >= l.parse::<f64>().unwrap(),
            };
            let ok_hi = match hi {
                "+inf" => true,
                h if h.starts_with('(') => s < h[1..].parse::<f64>().unwrap(),
                h => s <= h.parse::<f64>().unwrap(),
            };
            ok_lo && ok_hi
        };
        let want = order.iter().filter(|(s, _)| inside(*s)).count();
        assert_eq!(
            c.q(&format!("ZCOUNT z {lo} {hi}")),
            format!(":{want}"),
            "{lo} {hi}"
        );
    }
    check(
        &mut c,
        &[
            (
                "ZRANGEBYSCORE z 500 +inf WITHSCORES LIMIT 0 2",
                "[$m01498 $500 $m01499 $500]",
            ),
            (
                "ZREVRANGEBYSCORE z 500 -inf WITHSCORES LIMIT 0 2",
                "[$m01500 $500 $m01499 $500]",
            ),
            ("ZREMRANGEBYRANK z 2990 -1", ":10"),
            ("ZREMRANGEBYRANK z 0 9", ":10"),
            ("ZCARD z", ":2980"),
        ],
    );
    assert_healthy(&mut server);
}

// ---------------------------------------------------------------------------------------------
// Model test

/// splitmix64: a seeded generator for the model test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn float(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What a reply must be.
#[derive(Debug, Clone)]
enum Exp {
    Int(i64),
    Bulk(Vec<u8>),
    /// A score: a RESP3 double or a RESP2 bulk string, compared as numbers.
    Score(f64),
    Nil,
    /// An error starting with this text.
    Err(&'static str),
    Arr(Vec<Exp>),
    /// Members with scores: RESP2 a flat array, RESP3 an array of pairs.
    Pairs(Vec<(Vec<u8>, f64)>),
    /// Members with scores, flat in both protocols (ZPOPMIN/ZPOPMAX without a count).
    Flat(Vec<(Vec<u8>, f64)>),
    /// ZRANDMEMBER key count [WITHSCORES]: members of `z` (with their scores), `count` distinct
    /// ones (at most all of them), or -`count` with repeats.
    Sample {
        z: ZSet,
        count: i64,
        scores: bool,
    },
}

/// ZUNION/ZINTER/ZDIFF as Redis 7.0 computes them: inputs from the smallest (a stable sort,
/// except for DIFF), weighted scores that are NaN count as 0 (every input of a union, the
/// first of an intersection), a SUM that is NaN is 0, MIN and MAX ignore NaN.
fn combine_model(how: &str, mut inputs: Vec<(ZSet, f64)>, agg: &str) -> ZSet {
    let weighted = |s: f64, w: f64| if (s * w).is_nan() { 0.0 } else { s * w };
    let aggregate = |t: &mut f64, v: f64| match agg {
        "MIN" => {
            if v < *t {
                *t = v
            }
        }
        "MAX" => {
            if v > *t {
                *t = v
            }
        }
        _ => {
            *t += v;
            if t.is_nan() {
                *t = 0.0
            }
        }
    };
    if how != "DIFF" {
        inputs.sort_by_key(|(z, _)| z.len());
    }
    let mut out = ZSet::new();
    match how {
        "UNION" => {
            for (z, w) in &inputs {
                for (m, s) in z {
                    let v = weighted(*s, *w);
                    match out.get_mut(m) {
                        Some(t) => aggregate(t, v),
                        None => {
                            out.insert(m.clone(), v);
                        }
                    }
                }
            }
        }
        "INTER" => {
            let (first, rest) = inputs.split_first().expect("an input");
            'm: for (m, s) in &first.0 {
                let mut t = weighted(*s, first.1);
                for (z, w) in rest {
                    match z.get(m) {
                        Some(x) => aggregate(&mut t, x * w),
                        None => continue 'm,
                    }
                }
                out.insert(m.clone(), t);
            }
        }
        _ => {
            let (first, rest) = inputs.split_first().expect("an input");
            for (m, s) in &first.0 {
                if rest.iter().all(|(z, _)| !z.contains_key(m)) {
                    out.insert(m.clone(), *s);
                }
            }
        }
    }
    out
}

fn num(r: &Reply) -> Option<f64> {
    match r {
        Reply::Double(s) => s.parse().ok(),
        Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn matches(r: &Reply, e: &Exp, v3: bool) -> bool {
    match (e, r) {
        (Exp::Int(n), Reply::Int(m)) => n == m,
        (Exp::Bulk(b), Reply::Bulk(Some(x))) => b == x,
        (Exp::Score(s), r) => {
            // RESP3 must carry a double, RESP2 a bulk string.
            let typed = if v3 {
                matches!(r, Reply::Double(_))
            } else {
                matches!(r, Reply::Bulk(Some(_)))
            };
            typed && num(r) == Some(*s)
        }
        (Exp::Nil, Reply::Bulk(None)) => !v3,
        (Exp::Nil, Reply::Null) => v3,
        (Exp::Err(p), Reply::Error(m)) => m.starts_with(p),
        (Exp::Arr(es), Reply::Array(Some(rs))) => {
            es.len() == rs.len() && es.iter().zip(rs).all(|(e, r)| matches(r, e, v3))
        }
        (Exp::Pairs(ps), Reply::Array(Some(rs))) if v3 => {
            ps.len() == rs.len()
                && ps.iter().zip(rs).all(|((m, s), r)| {
                    matches(r, &Exp::Arr(vec![Exp::Bulk(m.clone()), Exp::Score(*s)]), v3)
                })
        }
        (Exp::Pairs(ps) | Exp::Flat(ps), Reply::Array(Some(rs))) => {
            ps.len() * 2 == rs.len()
                && ps.iter().zip(rs.chunks(2)).all(|((m, s), r)| {
                    matches(&r[0], &Exp::Bulk(m.clone()), v3) && matches(&r[1], &Exp::Score(*s), v3)
                })
        }
        (Exp::Sample { z, count, scores }, Reply::Array(Some(rs))) => {
            let want = if z.is_empty() {
                0
            } else if *count >= 0 {
                (*count as usize).min(z.len())
            } else {
                count.unsigned_abs() as usize
            };
            let items: Vec<(&Reply, Option<&Reply>)> = if !*scores {
                rs.iter().map(|r| (r, None)).collect()
            } else if v3 {
                let mut v = Vec::new();
                for r in rs {
                    match r {
                        Reply::Array(Some(p)) if p.len() == 2 => v.push((&p[0], Some(&p[1]))),
                        _ => return false,
                    }
                }
                v
            } else {
                if rs.len() % 2 != 0 {
                    return false;
                }
                rs.chunks(2).map(|p| (&p[0], Some(&p[1]))).collect()
            };
            let mut seen = std::collections::BTreeSet::new();
            items.len() == want
                && items.iter().all(|(m, s)| {
                    let Reply::Bulk(Some(m)) = m else {
                        return false;
                    };
                    let fresh = seen.insert(m.clone());
                    let Some(want_s) = z.get(m) else {
                        return false;
                    };
                    (*count < 0 || fresh) && s.is_none_or(|s| matches(s, &Exp::Score(*want_s), v3))
                })
        }
        _ => false,
    }
}

type ZSet = BTreeMap<Vec<u8>, f64>;

/// (score, member) in Redis order.
fn sorted(z: &ZSet) -> Vec<(f64, Vec<u8>)> {
    let mut v: Vec<(f64, Vec<u8>)> = z.iter().map(|(m, s)| (*s, m.clone())).collect();
    v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then_with(|| a.1.cmp(&b.1)));
    v
}

/// A score bound as sent: text, value, exclusive.
fn bound(rng: &mut Rng) -> (String, f64, bool) {
    let (t, v) = match rng.below(10) {
        0 => ("-inf".to_string(), f64::NEG_INFINITY),
        1 => ("+inf".to_string(), f64::INFINITY),
        _ => {
            let v = score(rng);
            (format!("{v}"), v)
        }
    };
    if rng.chance(0.3) {
        (format!("({t}"), v, true)
    } else {
        (t, v, false)
    }
}

/// Two score bounds, usually in order (an empty range now and then).
fn bounds(rng: &mut Rng) -> ((String, f64, bool), (String, f64, bool)) {
    let (a, b) = (bound(rng), bound(rng));
    if a.1 > b.1 && rng.chance(0.8) {
        (b, a)
    } else {
        (a, b)
    }
}

fn score(rng: &mut Rng) -> f64 {
    match rng.below(10) {
        0..=3 => rng.range(-5, 5) as f64,
        4..=5 => rng.range(-40, 40) as f64 / 4.0,
        6 => [f64::INFINITY, f64::NEG_INFINITY, 0.1, 1e20, 1e-5][rng.below(5) as usize],
        _ => (rng.float() - 0.5) * 10f64.powi(rng.range(-6, 20) as i32),
    }
}

fn fmt_arg(s: f64) -> String {
    if s == f64::INFINITY {
        "+inf".into()
    } else {
        format!("{s}")
    }
}

fn in_bounds(s: f64, lo: &(String, f64, bool), hi: &(String, f64, bool)) -> bool {
    let above = if lo.2 { s > lo.1 } else { s >= lo.1 };
    let below = if hi.2 { s < hi.1 } else { s <= hi.1 };
    above && below
}

#[derive(Debug, Clone)]
enum LexB {
    Min,
    Max,
    Incl(Vec<u8>),
    Excl(Vec<u8>),
}

fn lex_bound(rng: &mut Rng, members: &[Vec<u8>]) -> (String, LexB) {
    match rng.below(10) {
        0 => ("-".into(), LexB::Min),
        1 => ("+".into(), LexB::Max),
        _ => {
            let m = members[rng.below(members.len() as u64) as usize].clone();
            let t = String::from_utf8(m.clone()).unwrap();
            if rng.chance(0.5) {
                (format!("[{t}"), LexB::Incl(m))
            } else {
                (format!("({t}"), LexB::Excl(m))
            }
        }
    }
}

/// Two lex bounds, usually in order.
fn lex_bounds(rng: &mut Rng, members: &[Vec<u8>]) -> ((String, LexB), (String, LexB)) {
    let (a, b) = (lex_bound(rng, members), lex_bound(rng, members));
    let key = |l: &LexB| match l {
        LexB::Min => (0, Vec::new()),
        LexB::Incl(v) | LexB::Excl(v) => (1, v.clone()),
        LexB::Max => (2, Vec::new()),
    };
    if key(&a.1) > key(&b.1) && rng.chance(0.8) {
        (b, a)
    } else {
        (a, b)
    }
}

fn lex_in(m: &[u8], lo: &LexB, hi: &LexB) -> bool {
    let above = match lo {
        LexB::Min => true,
        LexB::Max => false,
        LexB::Incl(v) => m >= v.as_slice(),
        LexB::Excl(v) => m > v.as_slice(),
    };
    let below = match hi {
        LexB::Min => false,
        LexB::Max => true,
        LexB::Incl(v) => m <= v.as_slice(),
        LexB::Excl(v) => m < v.as_slice(),
    };
    above && below
}

/// Redis's offset/limit rule: a negative offset gives nothing, a negative limit everything.
fn page<T: Clone>(v: Vec<T>, limit: Option<(i64, i64)>) -> Vec<T> {
    match limit {
        None => v,
        Some((off, _)) if off < 0 => Vec::new(),
        Some((off, cnt)) => {
            let it = v.into_iter().skip(off as usize);
            if cnt < 0 {
                it.collect()
            } else {
                it.take(cnt as usize).collect()
            }
        }
    }
}

fn rank_slice(len: usize, start: i64, stop: i64) -> Option<(usize, usize)> {
    let len = len as i64;
    let s = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let e = if stop < 0 {
        len + stop
    } else {
        stop.min(len - 1)
    };
    (s <= e && s < len && e >= 0).then_some((s as usize, e as usize))
}

/// One random command and the reply the model expects (applying it to the model).
/// The shape of a model run: how many keys, members to draw from, and members per ZADD.
#[derive(Clone, Copy)]
struct Shape {
    keys: u64,
    pool: usize,
    add_max: i64,
}

/// Small sets: every member is met often, options and edge cases collide.
const SMALL: Shape = Shape {
    keys: 4,
    pool: 30,
    add_max: 12,
};

/// Sets of hundreds to thousands of members: the rank directory (`types::zrank`) splits and
/// merges its chunks under the same operations.
const LARGE: Shape = Shape {
    keys: 2,
    pool: 4000,
    add_max: 120,
};

fn step(rng: &mut Rng, model: &mut BTreeMap<String, ZSet>, shape: Shape) -> (Vec<String>, Exp) {
    let mut key = format!("k{}", rng.below(shape.keys));
    let mut members: Vec<Vec<u8>> = (0..shape.pool)
        .map(|i| format!("m{i}").into_bytes())
        .collect();
    members.push(Vec::new());
    let member = |rng: &mut Rng| members[rng.below(members.len() as u64) as usize].clone();
    let text = |m: &[u8]| String::from_utf8(m.to_vec()).unwrap();
    let z = model.get(&key).cloned().unwrap_or_default();
    let mut cmd: Vec<String> = Vec::new();
    let exp;
    let mut new_z = z.clone();
    match rng.below(37) {
        0..=6 => {
            // ZADD with options.
            let (nx, mut xx, mut gt, mut lt, ch) = (
                rng.chance(0.1),
                rng.chance(0.1),
                rng.chance(0.1),
                rng.chance(0.1),
                rng.chance(0.2),
            );
            if nx {
                xx = false;
                gt = false;
                lt = false;
            }
            if gt {
                lt = false;
            }
            let incr = rng.chance(0.1);
            let n = if incr { 1 } else { rng.range(1, shape.add_max) };
            cmd.push("ZADD".into());
            cmd.push(key.clone());
            for (on, name) in [(nx, "NX"), (xx, "XX"), (gt, "GT"), (lt, "LT"), (ch, "CH")] {
                if on {
                    cmd.push(name.into());
                }
            }
            if incr {
                cmd.push("INCR".into());
            }
            let (mut added, mut changed, mut last) = (0, 0, None);
            let mut nan = false;
            for _ in 0..n {
                let s = score(rng);
                let m = member(rng);
                cmd.push(fmt_arg(s));
                cmd.push(text(&m));
                match new_z.get(&m).copied() {
                    Some(cur) => {
                        if nx {
                            continue;
                        }
                        let s = if incr { s + cur } else { s };
                        if s.is_nan() {
                            nan = true;
                            break;
                        }
                        if (lt && s >= cur) || (gt && s <= cur) {
                            continue;
                        }
                        last = Some(s);
                        if s != cur {
                            new_z.insert(m, s);
                            changed += 1;
                        }
                    }
                    None if xx => {}
                    None => {
                        new_z.insert(m, s);
                        added += 1;
                        last = Some(s);
                    }
                }
            }
            exp = if nan {
                Exp::Err("ERR resulting score is not a number (NaN)")
            } else if incr {
                last.map_or(Exp::Nil, Exp::Score)
            } else if ch {
                Exp::Int(added + changed)
            } else {
                Exp::Int(added)
            };
        }
        7 => {
            let by = score(rng);
            let m = member(rng);
            cmd = vec!["ZINCRBY".into(), key.clone(), fmt_arg(by), text(&m)];
            let s = new_z.get(&m).copied().unwrap_or(0.0) + by;
            if s.is_nan() {
                exp = Exp::Err("ERR resulting score is not a number (NaN)");
            } else {
                new_z.insert(m, s);
                exp = Exp::Score(s);
            }
        }
        8 => {
            cmd = vec!["ZREM".into(), key.clone()];
            let mut n = 0;
            for _ in 0..rng.range(1, 4) {
                let m = member(rng);
                cmd.push(text(&m));
                if new_z.remove(&m).is_some() {
                    n += 1;
                }
            }
            exp = Exp::Int(n);
        }
        9 => {
            let (s, e) = (rng.range(-15, 15), rng.range(-15, 15));
            cmd = vec![
                "ZREMRANGEBYRANK".into(),
                key.clone(),
                s.to_string(),
                e.to_string(),
            ];
            let order = sorted(&z);
            let mut n = 0;
            if let Some((a, b)) = rank_slice(order.len(), s, e) {
                for (_, m) in &order[a..=b] {
                    new_z.remove(m);
                    n += 1;
                }
            }
            exp = Exp::Int(n);
        }
        10 => {
            let (lo, hi) = bounds(rng);
            cmd = vec![
                "ZREMRANGEBYSCORE".into(),
                key.clone(),
                lo.0.clone(),
                hi.0.clone(),
            ];
            let before = new_z.len();
            new_z.retain(|_, s| !in_bounds(*s, &lo, &hi));
            exp = Exp::Int((before - new_z.len()) as i64);
        }
        11 => {
            let max = rng.chance(0.5);
            let count = rng.chance(0.6).then(|| rng.range(0, 5));
            cmd = vec![if max { "ZPOPMAX" } else { "ZPOPMIN" }.into(), key.clone()];
            if let Some(n) = count {
                cmd.push(n.to_string());
            }
            let mut order = sorted(&z);
            if max {
                order.reverse();
            }
            let take = count.unwrap_or(1) as usize;
            let popped: Vec<(Vec<u8>, f64)> =
                order.into_iter().take(take).map(|(s, m)| (m, s)).collect();
            for (m, _) in &popped {
                new_z.remove(m);
            }
            // Redis 7: with a count, RESP3 nests [member, score] pairs; without one, flat.
            exp = if count.is_some() {
                Exp::Pairs(popped)
            } else {
                Exp::Flat(popped)
            };
        }
        12..=13 => {
            let m = member(rng);
            cmd = vec!["ZSCORE".into(), key.clone(), text(&m)];
            exp = z.get(&m).map_or(Exp::Nil, |s| Exp::Score(*s));
        }
        14 => {
            let ms = [member(rng), member(rng), member(rng)];
            cmd = vec!["ZMSCORE".into(), key.clone()];
            cmd.extend(ms.iter().map(|m| text(m)));
            exp = Exp::Arr(
                ms.iter()
                    .map(|m| z.get(m).map_or(Exp::Nil, |s| Exp::Score(*s)))
                    .collect(),
            );
        }
        15..=16 => {
            let rev = rng.chance(0.5);
            let m = member(rng);
            cmd = vec![
                if rev { "ZREVRANK" } else { "ZRANK" }.into(),
                key.clone(),
                text(&m),
            ];
            let order = sorted(&z);
            exp = match order.iter().position(|(_, x)| *x == m) {
                None => Exp::Nil,
                Some(i) if rev => Exp::Int((order.len() - 1 - i) as i64),
                Some(i) => Exp::Int(i as i64),
            };
        }
        17 => {
            cmd = vec!["ZCARD".into(), key.clone()];
            exp = Exp::Int(z.len() as i64);
        }
        18..=19 => {
            let (lo, hi) = bounds(rng);
            cmd = vec!["ZCOUNT".into(), key.clone(), lo.0.clone(), hi.0.clone()];
            exp = Exp::Int(z.values().filter(|s| in_bounds(**s, &lo, &hi)).count() as i64);
        }
        20..=22 => {
            // By rank: ZRANGE [REV] or ZREVRANGE, maybe WITHSCORES.
            let (s, e) = (rng.range(-20, 20), rng.range(-20, 20));
            let old = rng.chance(0.3);
            let rev = rng.chance(0.4);
            let ws = rng.chance(0.5);
            cmd = vec![
                if old && rev { "ZREVRANGE" } else { "ZRANGE" }.into(),
                key.clone(),
                s.to_string(),
                e.to_string(),
            ];
            if rev && !old {
                cmd.push("REV".into());
            }
            if ws {
                cmd.push("WITHSCORES".into());
            }
            let mut order = sorted(&z);
            if rev {
                order.reverse();
            }
            let got: Vec<(Vec<u8>, f64)> = match rank_slice(order.len(), s, e) {
                None => Vec::new(),
                Some((a, b)) => order[a..=b].iter().map(|(s, m)| (m.clone(), *s)).collect(),
            };
            exp = if ws {
                Exp::Pairs(got)
            } else {
                Exp::Arr(got.into_iter().map(|(m, _)| Exp::Bulk(m)).collect())
            };
        }
        23..=25 => {
            // By score, in any of the three spellings.
            let (lo, hi) = bounds(rng);
            let rev = rng.chance(0.5);
            let ws = rng.chance(0.5);
            let limit = rng
                .chance(0.5)
                .then(|| (rng.range(-1, 10), rng.range(-2, 10)));
            let (a, b) = if rev { (&hi, &lo) } else { (&lo, &hi) };
            if rng.chance(0.5) {
                cmd = vec![
                    "ZRANGE".into(),
                    key.clone(),
                    a.0.clone(),
                    b.0.clone(),
                    "BYSCORE".into(),
                ];
                if rev {
                    cmd.push("REV".into());
                }
            } else {
                let name = if rev {
                    "ZREVRANGEBYSCORE"
                } else {
                    "ZRANGEBYSCORE"
                };
                cmd = vec![name.into(), key.clone(), a.0.clone(), b.0.clone()];
            }
            if ws {
                cmd.push("WITHSCORES".into());
            }
            if let Some((o, n)) = limit {
                cmd.extend(["LIMIT".into(), o.to_string(), n.to_string()]);
            }
            let mut order: Vec<(Vec<u8>, f64)> = sorted(&z)
                .into_iter()
                .filter(|(s, _)| in_bounds(*s, &lo, &hi))
                .map(|(s, m)| (m, s))
                .collect();
            if rev {
                order.reverse();
            }
            let got = page(order, limit);
            exp = if ws {
                Exp::Pairs(got)
            } else {
                Exp::Arr(got.into_iter().map(|(m, _)| Exp::Bulk(m)).collect())
            };
        }
        26 => {
            // Lex ranges: memkeep answers in member order (Redis only defines them for equal
            // scores, where the two orders agree).
            let (lo, hi) = lex_bounds(rng, &members);
            let rev = rng.chance(0.5);
            let limit = rng
                .chance(0.4)
                .then(|| (rng.range(-1, 10), rng.range(-2, 10)));
            let (a, b) = if rev { (&hi, &lo) } else { (&lo, &hi) };
            let name = if rev { "ZREVRANGEBYLEX" } else { "ZRANGEBYLEX" };
            cmd = vec![name.into(), key.clone(), a.0.clone(), b.0.clone()];
            if let Some((o, n)) = limit {
                cmd.extend(["LIMIT".into(), o.to_string(), n.to_string()]);
            }
            let mut got: Vec<Vec<u8>> = z
                .keys()
                .filter(|m| lex_in(m, &lo.1, &hi.1))
                .cloned()
                .collect();
            if rev {
                got.reverse();
            }
            exp = Exp::Arr(page(got, limit).into_iter().map(Exp::Bulk).collect());
        }
        27 => {
            let (lo, hi) = lex_bounds(rng, &members);
            if rng.chance(0.5) {
                cmd = vec!["ZLEXCOUNT".into(), key.clone(), lo.0, hi.0];
                exp = Exp::Int(z.keys().filter(|m| lex_in(m, &lo.1, &hi.1)).count() as i64);
            } else {
                cmd = vec!["ZREMRANGEBYLEX".into(), key.clone(), lo.0, hi.0];
                let before = new_z.len();
                new_z.retain(|m, _| !lex_in(m, &lo.1, &hi.1));
                exp = Exp::Int((before - new_z.len()) as i64);
            }
        }
        28 => {
            cmd = vec![
                "ZSCAN".into(),
                key.clone(),
                "0".into(),
                "COUNT".into(),
                "1000".into(),
            ];
            let items = z
                .iter()
                .flat_map(|(m, s)| [Exp::Bulk(m.clone()), Exp::Bulk(scan_text(*s))])
                .collect();
            exp = Exp::Arr(vec![Exp::Bulk(b"0".to_vec()), Exp::Arr(items)]);
        }
        30..=32 => {
            // ZUNIONSTORE / ZINTERSTORE / ZDIFFSTORE into `key`, or the read forms.
            let how = ["UNION", "INTER", "DIFF"][rng.below(3) as usize];
            let store = rng.chance(0.6);
            let n = rng.range(1, 3) as usize;
            let srcs: Vec<String> = (0..n)
                .map(|_| format!("k{}", rng.below(shape.keys + 1)))
                .collect();
            let mut weights = vec![1.0; n];
            let mut agg = "SUM";
            let mut opts: Vec<String> = Vec::new();
            if how != "DIFF" && rng.chance(0.5) {
                opts.push("WEIGHTS".into());
                for w in weights.iter_mut() {
                    *w = [1.0, 2.0, -1.0, 0.5, 0.0, 3.25][rng.below(6) as usize];
                    opts.push(fmt_arg(*w));
                }
            }
            if how != "DIFF" && rng.chance(0.5) {
                agg = ["SUM", "MIN", "MAX"][rng.below(3) as usize];
                opts.extend(["AGGREGATE".into(), agg.into()]);
            }
            let inputs: Vec<(ZSet, f64)> = srcs
                .iter()
                .zip(&weights)
                .map(|(k, w)| (model.get(k).cloned().unwrap_or_default(), *w))
                .collect();
            let result = combine_model(how, inputs, agg);
            if store && rng.chance(0.5) {
                // Often into a key of its own, so the big sets live on.
                key = format!("k{}", shape.keys);
            }
            let name = format!("Z{how}{}", if store { "STORE" } else { "" });
            cmd = vec![name];
            if store {
                cmd.push(key.clone());
            }
            cmd.push(n.to_string());
            cmd.extend(srcs);
            cmd.extend(opts);
            if store {
                exp = Exp::Int(result.len() as i64);
                new_z = result;
            } else {
                let ws = rng.chance(0.7);
                let order: Vec<(Vec<u8>, f64)> =
                    sorted(&result).into_iter().map(|(s, m)| (m, s)).collect();
                if ws {
                    cmd.push("WITHSCORES".into());
                    exp = Exp::Pairs(order);
                } else {
                    exp = Exp::Arr(order.into_iter().map(|(m, _)| Exp::Bulk(m)).collect());
                }
            }
        }
        33 => {
            let n = rng.range(1, 3) as usize;
            let srcs: Vec<String> = (0..n)
                .map(|_| format!("k{}", rng.below(shape.keys + 1)))
                .collect();
            let inputs: Vec<(ZSet, f64)> = srcs
                .iter()
                .map(|k| (model.get(k).cloned().unwrap_or_default(), 1.0))
                .collect();
            let all = combine_model("INTER", inputs, "SUM").len() as i64;
            cmd = vec!["ZINTERCARD".into(), n.to_string()];
            cmd.extend(srcs);
            let limit = rng.chance(0.5).then(|| rng.range(0, 20));
            if let Some(l) = limit {
                cmd.extend(["LIMIT".into(), l.to_string()]);
            }
            exp = Exp::Int(match limit {
                Some(l) if l > 0 => all.min(l),
                _ => all,
            });
        }
        34..=35 => {
            // ZRANGESTORE from another key into `key`, by rank or by score.
            let src = format!("k{}", rng.below(shape.keys + 1));
            let from = model.get(&src).cloned().unwrap_or_default();
            if rng.chance(0.5) {
                key = format!("k{}", shape.keys);
            }
            let rev = rng.chance(0.4);
            let mut order: Vec<(Vec<u8>, f64)>;
            if rng.chance(0.5) {
                let (s, e) = (rng.range(-20, 20), rng.range(-20, 20));
                cmd = vec![
                    "ZRANGESTORE".into(),
                    key.clone(),
                    src,
                    s.to_string(),
                    e.to_string(),
                ];
                order = sorted(&from).into_iter().map(|(s, m)| (m, s)).collect();
                if rev {
                    cmd.push("REV".into());
                    order.reverse();
                }
                order = match rank_slice(order.len(), s, e) {
                    None => Vec::new(),
                    Some((a, b)) => order[a..=b].to_vec(),
                };
            } else {
                let (lo, hi) = bounds(rng);
                let (a, b) = if rev { (&hi, &lo) } else { (&lo, &hi) };
                cmd = vec![
                    "ZRANGESTORE".into(),
                    key.clone(),
                    src,
                    a.0.clone(),
                    b.0.clone(),
                    "BYSCORE".into(),
                ];
                if rev {
                    cmd.push("REV".into());
                }
                let limit = rng
                    .chance(0.5)
                    .then(|| (rng.range(-1, 10), rng.range(-2, 10)));
                if let Some((o, n)) = limit {
                    cmd.extend(["LIMIT".into(), o.to_string(), n.to_string()]);
                }
                order = sorted(&from)
                    .into_iter()
                    .filter(|(s, _)| in_bounds(*s, &lo, &hi))
                    .map(|(s, m)| (m, s))
                    .collect();
                if rev {
                    order.reverse();
                }
                order = page(order, limit);
            }
            exp = Exp::Int(order.len() as i64);
            new_z = order.into_iter().collect();
        }
        36 => {
            let n = rng.range(-12, 12);
            let ws = rng.chance(0.5);
            cmd = vec!["ZRANDMEMBER".into(), key.clone(), n.to_string()];
            if ws {
                cmd.push("WITHSCORES".into());
            }
            exp = Exp::Sample {
                z: z.clone(),
                count: n,
                scores: ws,
            };
        }
        29 if rng.chance(0.3) => {
            cmd = vec!["DEL".into(), key.clone()];
            new_z.clear();
            exp = Exp::Int(!z.is_empty() as i64);
        }
        // Rarely with large sets, which must grow past the directory's chunks.
        29 if rng.chance(if shape.pool > 256 { 0.05 } else { 0.3 }) && shape.keys > 1 => {
            // COPY from another key over this one: a new set with its own rank directory.
            let other =
                (key[1..].parse::<u64>().unwrap() + 1 + rng.below(shape.keys - 1)) % shape.keys;
            let src = format!("k{other}");
            cmd = vec!["COPY".into(), src.clone(), key.clone(), "REPLACE".into()];
            match model.get(&src) {
                Some(from) => {
                    new_z = from.clone();
                    exp = Exp::Int(1);
                }
                None => exp = Exp::Int(0),
            }
        }
        _ => {
            cmd = vec!["EXISTS".into(), key.clone()];
            exp = Exp::Int(!z.is_empty() as i64);
        }
    }
    if new_z.is_empty() {
        model.remove(&key);
    } else {
        model.insert(key, new_z);
    }
    (cmd, exp)
}

/// ZSCAN's score text for the values the model test uses: integral scores within ±2^62 as
/// integers; other scores are compared through this same text only when it round-trips.
fn scan_text(s: f64) -> Vec<u8> {
    if s.is_finite() && s.fract() == 0.0 && s.abs() <= 4611686018427387904.0 {
        format!("{}", s as i64).into_bytes()
    } else if s.is_infinite() {
        if s > 0.0 {
            b"inf".to_vec()
        } else {
            b"-inf".to_vec()
        }
    } else {
        // Replaced by a numeric comparison in `scan_matches`.
        format!("{s:e}").into_bytes()
    }
}

/// ZSCAN replies compare scores by value where the text is not an integer.
fn scan_matches(r: &Reply, e: &Exp) -> bool {
    let (Reply::Array(Some(rs)), Exp::Arr(es)) = (r, e) else {
        return false;
    };
    let (Some(Reply::Array(Some(ritems))), Some(Exp::Arr(eitems))) = (rs.get(1), es.get(1)) else {
        return false;
    };
    rs.len() == 2
        && rs[0] == Reply::Bulk(Some(b"0".to_vec()))
        && ritems.len() == eitems.len()
        && ritems.iter().zip(eitems).enumerate().all(|(i, (r, e))| {
            let Exp::Bulk(want) = e else { return false };
            let Reply::Bulk(Some(got)) = r else {
                return false;
            };
            if i % 2 == 0 || got == want {
                return got == want;
            }
            let (g, w) = (std::str::from_utf8(got), std::str::from_utf8(want));
            matches!((g, w), (Ok(g), Ok(w)) if g.parse::<f64>().ok() == w.parse::<f64>().ok())
        })
}

fn model_run(shape: Shape, seed: u64, ops: usize) {
    let mut server = start();
    let mut c = Client::connect(&server);
    let mut rng = Rng(seed);
    let mut model: BTreeMap<String, ZSet> = BTreeMap::new();
    let mut v3 = false;
    let mut biggest = 0;
    for i in 0..ops {
        if i == ops / 2 {
            server.restart();
            c = Client::connect(&server);
            v3 = false;
        }
        if rng.chance(0.02) {
            v3 = !v3;
            let r = c.q(if v3 { "HELLO 3" } else { "HELLO 2" });
            assert!(r.starts_with('{') || r.starts_with('['), "HELLO: {r}");
        }
        let (cmd, exp) = step(&mut rng, &mut model, shape);
        biggest = biggest.max(model.values().map(|z| z.len()).max().unwrap_or(0));
        let got = c.call(&cmd);
        let ok = if cmd[0] == "ZSCAN" {
            scan_matches(&got, &exp)
        } else {
            matches(&got, &exp, v3)
        };
        assert!(
            ok,
            "op {i} {cmd:?} (resp{}):\n  got  {}\n  want {exp:?}",
            if v3 { 3 } else { 2 },
            render(&got)
        );
    }
    // Everything the model holds, read back in full.
    for (key, z) in &model {
        let got = c.call(&["ZRANGE", key.as_str(), "0", "-1", "WITHSCORES"]);
        let want = Exp::Pairs(sorted(z).into_iter().map(|(s, m)| (m, s)).collect());
        assert!(matches(&got, &want, v3), "{key}: {}", render(&got));
    }
    assert!(!model.is_empty());
    if shape.pool > 256 {
        // Past one chunk of the rank directory (256 members), so splits were exercised.
        assert!(biggest > 512, "largest set {biggest}");
    }
    assert_healthy(&mut server);
    // And the store is sound offline: every set's score index and rank directory agree.
    server.stop();
    server.assert_check_clean();
}

#[test]
fn model_test_random_operations() {
    model_run(SMALL, 0x5eed_2024_0001, 2000);
}

#[test]
fn model_test_random_operations_on_large_sets() {
    model_run(LARGE, 0x5eed_2026_1202, 1500);
}
