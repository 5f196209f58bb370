//! Soak test: mixed read/write load on both protocols for a bounded time, with periodic
//! restarts (graceful SIGTERM and kill -9), every reply checked against a client-side model,
//! and the server's memory sampled to check that it stays flat.
//!
//! Knobs (environment): `MEMKEEP_SOAK_SECS` is the load time (default 20 s, the form `make test`
//! runs; `make soak` runs 300 s); `MEMKEEP_SOAK_RESTART_SECS` the period between restarts
//! (default 30 s for runs of two minutes or more, else a third of the run, so even the short
//! form restarts under load, both ways); `MEMKEEP_SOAK_THREADS` the client threads (default 8,
//! or 12 for runs of two minutes or more; half lean on the memcached port, half on RESP);
//! `MEMKEEP_SOAK_SEED` the random seed (printed; default from the clock).
//!
//! The server runs with `--sync always`, the default and the mode the README recommends, so
//! every acknowledged write must survive both kinds of restart. Restarts alternate: graceful,
//! kill -9, graceful, ...; one more restart after the load stops, then every key is read back.
//! A graceful stop finishes the requests it has read and answers them, so a write whose reply
//! a graceful restart swallowed must turn out not applied (after kill -9 it may be either).
//!
//! The model: each client thread owns a disjoint range of keys, so it knows what each key holds.
//! A key's model is a short list of candidate states: normally exactly one; after a request whose
//! reply was lost to a restart, "applied" and "not applied" both, until a read tells them apart
//! (each thread re-reads all its keys after every restart). A key with a TTL is known to expire
//! between the earliest and the latest instant the server can have computed for it; before that
//! window the key must be there, after it the key must be gone (the server checks expiry on
//! every read, so this does not depend on when its sweeper runs), inside it either. Every reply
//! must be what some candidate predicts; a mismatch fails the test with the key, the request, the
//! reply, what each candidate predicted and the key's recent history.
//!
//! Memory: the server's VmRSS, RssAnon and RssFile are sampled every 500 ms. LMDB's map counts
//! in RssFile as pages are touched, so flatness is judged on RssAnon: in each server lifetime
//! long enough to judge, the maximum of the last quarter must not exceed the maximum of the
//! second quarter (the first after warm-up) by more than max(50%, 64 MiB); and no lifetime's
//! post-warm-up maximum may exceed the first lifetime's by more than that.

mod common;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::resp::{Reply, Resp};
use common::{Options, Server, now_ms};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
/// Keys each client thread owns; small enough that values are overwritten many times.
const KEYS_PER_THREAD: usize = 2000;
/// Keys `0..VOLATILE_KEYS` of each thread get TTLs of 1-3 s; the others never expire.
const VOLATILE_KEYS: usize = 200;
/// memkeep's default item size limit (`-I 1m`), and the RESP bulk limit the soak sets.
const MAX_ITEM: usize = 1 << 20;
/// Every socket read and write gives up after this long: a lost reply fails, never hangs.
const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a client waits for a restarted server before failing.
const COMEBACK_TIMEOUT: Duration = Duration::from_secs(60);
/// Margin on the expiry window against clock rounding (both sides read the same clock).
const SLACK_MS: u64 = 5;
const SAMPLE_EVERY: Duration = Duration::from_millis(500);
const MIB: u64 = 1 << 20;
/// Most candidate states a key may have before the model is considered broken.
const MAX_CANDIDATES: usize = 16;

const MC_WRONGTYPE: &str =
    "CLIENT_ERROR WRONGTYPE Operation against a key holding the wrong kind of value";
const R_WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NON_NUMERIC: &str = "CLIENT_ERROR cannot increment or decrement non-numeric value";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const OVERFLOW: &str = "ERR increment or decrement would overflow";
const TOO_BIG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";

// ---------------------------------------------------------------------------------------------
// Configuration and randomness

struct Config {
    secs: u64,
    restart_every: u64,
    threads: usize,
    seed: u64,
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

impl Config {
    fn from_env() -> Config {
        let secs = env_u64("MEMKEEP_SOAK_SECS").unwrap_or(20).max(4);
        let long = secs >= 120;
        let restart_every = env_u64("MEMKEEP_SOAK_RESTART_SECS")
            .unwrap_or(if long { 30 } else { secs / 3 })
            .max(2);
        let threads = env_u64("MEMKEEP_SOAK_THREADS").unwrap_or(if long { 12 } else { 8 });
        let seed = env_u64("MEMKEEP_SOAK_SEED")
            .unwrap_or_else(|| now_ms().wrapping_mul(0x9e37_79b9) ^ std::process::id() as u64);
        Config {
            secs,
            restart_every,
            threads: (threads as usize).clamp(2, 64),
            seed,
        }
    }
}

/// xorshift64* seeded through splitmix64: fast, and reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }

    /// A string value: mostly small, some up to 64 KiB, a few up to 512 KiB; any bytes.
    fn value(&mut self) -> Vec<u8> {
        let n = match self.below(1000) {
            0..700 => self.range(1, 100),
            700..950 => self.range(101, 8192),
            950..995 => self.range(8193, 64 << 10),
            _ => self.range((64 << 10) + 1, 512 << 10),
        };
        self.bytes(n as usize)
    }

    /// A counter both protocols can increment.
    fn number(&mut self) -> Vec<u8> {
        self.below(1_000_000).to_string().into_bytes()
    }

    fn small(&mut self) -> Vec<u8> {
        let n = self.below(201) as usize;
        self.bytes(n)
    }

    fn flags(&mut self) -> u32 {
        if self.chance(50) {
            0
        } else {
            self.next() as u32
        }
    }

    fn ttl(&mut self) -> u64 {
        self.range(1, 3)
    }

    /// A list element: often from a small pool (so LREM finds duplicates), sometimes empty,
    /// rarely a few KiB.
    fn elem(&mut self) -> Vec<u8> {
        match self.below(100) {
            0..45 => format!("e{}", self.below(8)).into_bytes(),
            45..98 => {
                let n = self.below(65) as usize;
                self.bytes(n)
            }
            _ => {
                let n = self.range(1024, 8192) as usize;
                self.bytes(n)
            }
        }
    }

    fn field(&mut self) -> Vec<u8> {
        if self.chance(5) {
            let n = self.range(1, 200) as usize;
            self.bytes(n)
        } else {
            format!("f{}", self.below(40)).into_bytes()
        }
    }

    fn member(&mut self) -> Vec<u8> {
        if self.chance(5) {
            let n = self.range(1, 300) as usize;
            self.bytes(n)
        } else {
            format!("m{}", self.below(80)).into_bytes()
        }
    }

    fn zmember(&mut self) -> Vec<u8> {
        format!("z{}", self.below(60)).into_bytes()
    }

    /// A sorted-set score in half units (-100.0 to 100.0 in steps of 0.5), exact in binary.
    fn score(&mut self) -> i64 {
        self.below(401) as i64 - 200
    }

    fn index(&mut self) -> i64 {
        self.below(25) as i64 - 12
    }
}

fn score_text(half_units: i64) -> String {
    format!("{}", half_units as f64 / 2.0)
}

// ---------------------------------------------------------------------------------------------
// The model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    List,
    Hash,
    Set,
    Zset,
}

#[derive(Clone, Debug, PartialEq)]
enum Val {
    Str {
        data: Vec<u8>,
        flags: u32,
    },
    List(VecDeque<Vec<u8>>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    Set(BTreeSet<Vec<u8>>),
    /// member -> score in half units
    Zset(BTreeMap<Vec<u8>, i64>),
}

impl Val {
    fn kind(&self) -> Kind {
        match self {
            Val::Str { .. } => Kind::Str,
            Val::List(_) => Kind::List,
            Val::Hash(_) => Kind::Hash,
            Val::Set(_) => Kind::Set,
            Val::Zset(_) => Kind::Zset,
        }
    }

    fn len(&self) -> usize {
        match self {
            Val::Str { data, .. } => data.len(),
            Val::List(l) => l.len(),
            Val::Hash(h) => h.len(),
            Val::Set(s) => s.len(),
            Val::Zset(z) => z.len(),
        }
    }
}

/// What the client knows of an item's CAS unique: its value (seen in a `gets` since the last
/// change), or only that it is larger than a value seen before (uniques only grow).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cas {
    Known(u64),
    After(u64),
}

impl Cas {
    fn floor(self) -> u64 {
        match self {
            Cas::Known(c) | Cas::After(c) => c,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    val: Val,
    /// The expiry lies in [lo, hi] (unix ms); None: never expires.
    exp: Option<(u64, u64)>,
    cas: Cas,
}

type State = Option<Entry>;

/// When a request was sent and its reply read, unix ms: the server acted in between.
#[derive(Clone, Copy, Debug)]
struct Times {
    s: u64,
    r: u64,
}

enum Live {
    Yes,
    No,
    Maybe,
}

fn liveness(e: &Entry, t: Times) -> Live {
    match e.exp {
        None => Live::Yes,
        Some((lo, _)) if t.r + SLACK_MS < lo => Live::Yes,
        Some((_, hi)) if t.s >= hi + SLACK_MS => Live::No,
        Some(_) => Live::Maybe,
    }
}

/// The states a candidate can be in when the server acts on it, and whether each is "expired".
fn branches(cand: &State, t: Times) -> Vec<(Option<&Entry>, bool)> {
    match cand {
        None => vec![(None, false)],
        Some(e) => match liveness(e, t) {
            Live::Yes => vec![(Some(e), false)],
            Live::No => vec![(None, true)],
            Live::Maybe => vec![(Some(e), false), (None, true)],
        },
    }
}

fn kind_of(s: &State) -> Kind {
    s.as_ref().map_or(Kind::Str, |e| e.val.kind())
}

struct KeySt {
    cands: Vec<State>,
    /// The largest CAS unique seen for this key: any later change gets a larger one.
    floor: u64,
    /// A request on this key whose reply a restart swallowed, until a read tells whether the
    /// server applied it.
    lost: Option<Lost>,
}

struct Lost {
    graceful: bool,
    unapplied: Vec<State>,
    applied: Vec<State>,
}

/// Whether a state read back can be `s` (CAS knowledge aside; an item with a TTL may be gone).
fn could_be(s: &State, seen: &State) -> bool {
    match (s, seen) {
        (None, None) => true,
        (Some(e), None) => e.exp.is_some(),
        (None, Some(_)) => false,
        (Some(a), Some(b)) => a.val == b.val && a.exp == b.exp,
    }
}

// ---------------------------------------------------------------------------------------------
// Requests

#[derive(Clone, Copy, Debug)]
enum Mode {
    Set,
    Add,
    Replace,
}

#[derive(Clone, Copy, Debug)]
enum Cond {
    Always,
    Nx,
    Xx,
}

#[derive(Clone, Copy, Debug)]
enum Ttl {
    Ex(u64),
    Px(u64),
}

#[derive(Clone, Debug)]
enum Op {
    // memcached text protocol
    MStore {
        mode: Mode,
        flags: u32,
        ttl: u64,
        data: Vec<u8>,
    },
    MCas {
        flags: u32,
        data: Vec<u8>,
        unique: u64,
    },
    MCat {
        prepend: bool,
        data: Vec<u8>,
    },
    MArith {
        incr: bool,
        delta: u64,
    },
    MDelete,
    MTouch {
        ttl: u64,
    },
    MGet {
        gets: bool,
    },
    // RESP strings and keys
    RSet {
        data: Vec<u8>,
        ttl: Option<Ttl>,
        cond: Cond,
        get: bool,
    },
    RGet,
    RAppend {
        data: Vec<u8>,
    },
    RIncrBy {
        delta: i64,
    },
    RStrlen,
    RDel,
    RExists,
    RType,
    RExpire {
        secs: u64,
    },
    RPersist,
    RPttl,
    // lists
    LPush {
        left: bool,
        elems: Vec<Vec<u8>>,
    },
    LPop {
        left: bool,
        count: Option<usize>,
    },
    LRange {
        start: i64,
        stop: i64,
    },
    LLen,
    LIndex {
        index: i64,
    },
    LSet {
        index: i64,
        elem: Vec<u8>,
    },
    LRem {
        count: i64,
        elem: Vec<u8>,
    },
    LTrim {
        start: i64,
        stop: i64,
    },
    // hashes
    HSet {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    HGet {
        field: Vec<u8>,
    },
    HDel {
        fields: Vec<Vec<u8>>,
    },
    HGetAll,
    HLen,
    // sets
    SAdd {
        members: Vec<Vec<u8>>,
    },
    SRem {
        members: Vec<Vec<u8>>,
    },
    SMembers,
    SIsMember {
        member: Vec<u8>,
    },
    SCard,
    // sorted sets
    ZAdd {
        pairs: Vec<(i64, Vec<u8>)>,
    },
    ZRem {
        members: Vec<Vec<u8>>,
    },
    ZRange {
        start: i64,
        stop: i64,
        scores: bool,
    },
    ZScore {
        member: Vec<u8>,
    },
    ZCard,
}

/// Bytes for a message: short printable ones as text, others as length and hash.
fn show(b: &[u8]) -> String {
    if b.len() <= 24 && b.iter().all(|c| c.is_ascii_graphic() || *c == b' ') {
        format!("{:?}", String::from_utf8_lossy(b))
    } else {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &c in b {
            h = (h ^ c as u64).wrapping_mul(0x100_0000_01b3);
        }
        format!("<{} bytes #{:08x}>", b.len(), h as u32)
    }
}

fn show_list(items: &[Vec<u8>]) -> String {
    let v: Vec<String> = items.iter().map(|b| show(b)).collect();
    format!("[{}]", v.join(" "))
}

impl Op {
    fn is_mc(&self) -> bool {
        matches!(
            self,
            Op::MStore { .. }
                | Op::MCas { .. }
                | Op::MCat { .. }
                | Op::MArith { .. }
                | Op::MDelete
                | Op::MTouch { .. }
                | Op::MGet { .. }
        )
    }

    fn is_read(&self) -> bool {
        matches!(
            self,
            Op::MGet { .. }
                | Op::RGet
                | Op::RStrlen
                | Op::RExists
                | Op::RType
                | Op::RPttl
                | Op::LRange { .. }
                | Op::LLen
                | Op::LIndex { .. }
                | Op::HGet { .. }
                | Op::HGetAll
                | Op::HLen
                | Op::SMembers
                | Op::SIsMember { .. }
                | Op::SCard
                | Op::ZRange { .. }
                | Op::ZScore { .. }
                | Op::ZCard
        )
    }

    fn describe(&self) -> String {
        match self {
            Op::MStore {
                mode,
                flags,
                ttl,
                data,
            } => format!(
                "{} flags={flags} exptime={ttl} {}",
                format!("{mode:?}").to_lowercase(),
                show(data)
            ),
            Op::MCas {
                flags,
                data,
                unique,
            } => format!("cas flags={flags} unique={unique} {}", show(data)),
            Op::MCat { prepend, data } => format!(
                "{} {}",
                if *prepend { "prepend" } else { "append" },
                show(data)
            ),
            Op::MArith { incr, delta } => {
                format!("{} {delta}", if *incr { "incr" } else { "decr" })
            }
            Op::MDelete => "delete".into(),
            Op::MTouch { ttl } => format!("touch {ttl}"),
            Op::MGet { gets } => (if *gets { "gets" } else { "get" }).into(),
            Op::RSet {
                data,
                ttl,
                cond,
                get,
            } => format!("SET {} {ttl:?} {cond:?} get={get}", show(data)),
            Op::RAppend { data } => format!("APPEND {}", show(data)),
            Op::RIncrBy { delta } => format!("INCRBY {delta}"),
            Op::RExpire { secs } => format!("EXPIRE {secs}"),
            Op::LPush { left, elems } => format!(
                "{} {}",
                if *left { "LPUSH" } else { "RPUSH" },
                show_list(elems)
            ),
            Op::LPop { left, count } => {
                format!("{} {count:?}", if *left { "LPOP" } else { "RPOP" })
            }
            Op::LSet { index, elem } => format!("LSET {index} {}", show(elem)),
            Op::LRem { count, elem } => format!("LREM {count} {}", show(elem)),
            Op::HSet { pairs } => {
                let v: Vec<String> = pairs
                    .iter()
                    .map(|(f, v)| format!("{}={}", show(f), show(v)))
                    .collect();
                format!("HSET {}", v.join(" "))
            }
            Op::HGet { field } => format!("HGET {}", show(field)),
            Op::HDel { fields } => format!("HDEL {}", show_list(fields)),
            Op::SAdd { members } => format!("SADD {}", show_list(members)),
            Op::SRem { members } => format!("SREM {}", show_list(members)),
            Op::SIsMember { member } => format!("SISMEMBER {}", show(member)),
            Op::ZAdd { pairs } => {
                let v: Vec<String> = pairs
                    .iter()
                    .map(|(s, m)| format!("{} {}", score_text(*s), show(m)))
                    .collect();
                format!("ZADD {}", v.join(" "))
            }
            Op::ZRem { members } => format!("ZREM {}", show_list(members)),
            Op::ZScore { member } => format!("ZSCORE {}", show(member)),
            other => format!("{other:?}"),
        }
    }

    fn mc_request(&self, key: &str) -> Vec<u8> {
        let block = |head: String, data: &[u8]| {
            let mut v = head.into_bytes();
            v.extend_from_slice(data);
            v.extend_from_slice(b"\r\n");
            v
        };
        match self {
            Op::MStore {
                mode,
                flags,
                ttl,
                data,
            } => {
                let cmd = match mode {
                    Mode::Set => "set",
                    Mode::Add => "add",
                    Mode::Replace => "replace",
                };
                block(
                    format!("{cmd} {key} {flags} {ttl} {}\r\n", data.len()),
                    data,
                )
            }
            Op::MCas {
                flags,
                data,
                unique,
            } => block(
                format!("cas {key} {flags} 0 {} {unique}\r\n", data.len()),
                data,
            ),
            Op::MCat { prepend, data } => {
                let cmd = if *prepend { "prepend" } else { "append" };
                block(format!("{cmd} {key} 0 0 {}\r\n", data.len()), data)
            }
            Op::MArith { incr, delta } => {
                let cmd = if *incr { "incr" } else { "decr" };
                format!("{cmd} {key} {delta}\r\n").into_bytes()
            }
            Op::MDelete => format!("delete {key}\r\n").into_bytes(),
            Op::MTouch { ttl } => format!("touch {key} {ttl}\r\n").into_bytes(),
            Op::MGet { gets } => {
                format!("{} {key}\r\n", if *gets { "gets" } else { "get" }).into_bytes()
            }
            _ => unreachable!("not a memcached request: {self:?}"),
        }
    }

    fn resp_args(&self, key: &str) -> Vec<Vec<u8>> {
        let k = key.as_bytes().to_vec();
        let w = |s: &str| s.as_bytes().to_vec();
        let n = |i: i64| i.to_string().into_bytes();
        let mut a: Vec<Vec<u8>>;
        match self {
            Op::RSet {
                data,
                ttl,
                cond,
                get,
            } => {
                a = vec![w("SET"), k, data.clone()];
                match ttl {
                    Some(Ttl::Ex(s)) => a.extend([w("EX"), n(*s as i64)]),
                    Some(Ttl::Px(ms)) => a.extend([w("PX"), n(*ms as i64)]),
                    None => {}
                }
                match cond {
                    Cond::Always => {}
                    Cond::Nx => a.push(w("NX")),
                    Cond::Xx => a.push(w("XX")),
                }
                if *get {
                    a.push(w("GET"));
                }
            }
            Op::RGet => a = vec![w("GET"), k],
            Op::RAppend { data } => a = vec![w("APPEND"), k, data.clone()],
            Op::RIncrBy { delta } => {
                a = match *delta {
                    1 => vec![w("INCR"), k],
                    -1 => vec![w("DECR"), k],
                    d if d < 0 => vec![w("DECRBY"), k, n(-d)],
                    d => vec![w("INCRBY"), k, n(d)],
                }
            }
            Op::RStrlen => a = vec![w("STRLEN"), k],
            Op::RDel => a = vec![w("DEL"), k],
            Op::RExists => a = vec![w("EXISTS"), k],
            Op::RType => a = vec![w("TYPE"), k],
            Op::RExpire { secs } => a = vec![w("EXPIRE"), k, n(*secs as i64)],
            Op::RPersist => a = vec![w("PERSIST"), k],
            Op::RPttl => a = vec![w("PTTL"), k],
            Op::LPush { left, elems } => {
                a = vec![w(if *left { "LPUSH" } else { "RPUSH" }), k];
                a.extend(elems.iter().cloned());
            }
            Op::LPop { left, count } => {
                a = vec![w(if *left { "LPOP" } else { "RPOP" }), k];
                if let Some(c) = count {
                    a.push(n(*c as i64));
                }
            }
            Op::LRange { start, stop } => a = vec![w("LRANGE"), k, n(*start), n(*stop)],
            Op::LLen => a = vec![w("LLEN"), k],
            Op::LIndex { index } => a = vec![w("LINDEX"), k, n(*index)],
            Op::LSet { index, elem } => a = vec![w("LSET"), k, n(*index), elem.clone()],
            Op::LRem { count, elem } => a = vec![w("LREM"), k, n(*count), elem.clone()],
            Op::LTrim { start, stop } => a = vec![w("LTRIM"), k, n(*start), n(*stop)],
            Op::HSet { pairs } => {
                a = vec![w("HSET"), k];
                for (f, v) in pairs {
                    a.push(f.clone());
                    a.push(v.clone());
                }
            }
            Op::HGet { field } => a = vec![w("HGET"), k, field.clone()],
            Op::HDel { fields } => {
                a = vec![w("HDEL"), k];
                a.extend(fields.iter().cloned());
            }
            Op::HGetAll => a = vec![w("HGETALL"), k],
            Op::HLen => a = vec![w("HLEN"), k],
            Op::SAdd { members } => {
                a = vec![w("SADD"), k];
                a.extend(members.iter().cloned());
            }
            Op::SRem { members } => {
                a = vec![w("SREM"), k];
                a.extend(members.iter().cloned());
            }
            Op::SMembers => a = vec![w("SMEMBERS"), k],
            Op::SIsMember { member } => a = vec![w("SISMEMBER"), k, member.clone()],
            Op::SCard => a = vec![w("SCARD"), k],
            Op::ZAdd { pairs } => {
                a = vec![w("ZADD"), k];
                for (s, m) in pairs {
                    a.push(score_text(*s).into_bytes());
                    a.push(m.clone());
                }
            }
            Op::ZRem { members } => {
                a = vec![w("ZREM"), k];
                a.extend(members.iter().cloned());
            }
            Op::ZRange {
                start,
                stop,
                scores,
            } => {
                a = vec![w("ZRANGE"), k, n(*start), n(*stop)];
                if *scores {
                    a.push(w("WITHSCORES"));
                }
            }
            Op::ZScore { member } => a = vec![w("ZSCORE"), k, member.clone()],
            Op::ZCard => a = vec![w("ZCARD"), k],
            _ => unreachable!("not a RESP request: {self:?}"),
        }
        a
    }
}

/// The read that shows a key's whole state when it holds `kind` (or nothing).
fn inspect_op(kind: Kind) -> Op {
    match kind {
        Kind::Str => Op::MGet { gets: true },
        Kind::List => Op::LRange { start: 0, stop: -1 },
        Kind::Hash => Op::HGetAll,
        Kind::Set => Op::SMembers,
        Kind::Zset => Op::ZRange {
            start: 0,
            stop: -1,
            scores: true,
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Replies and what the model expects of them

#[derive(Debug, Clone, PartialEq)]
struct McItem {
    key: String,
    flags: u32,
    data: Vec<u8>,
    cas: Option<u64>,
}

/// A reply as read from the wire.
#[derive(Debug)]
enum Act {
    /// A memcached one-line reply.
    Line(String),
    /// A memcached retrieval reply: VALUE items up to END.
    Values(Vec<McItem>),
    R(Reply),
}

#[derive(Debug, Clone, Copy)]
enum CasRule {
    Absent,
    Eq(u64),
    Gt(u64),
}

#[derive(Debug)]
struct ExpItem {
    key: String,
    flags: u32,
    data: Vec<u8>,
    cas: CasRule,
}

#[derive(Debug)]
enum Expect {
    Line(String),
    LinePrefix(&'static str),
    Values(Vec<ExpItem>),
    R(Reply),
    RIntIn(i64, i64),
}

fn show_reply(r: &Reply) -> String {
    match r {
        Reply::Bulk(Some(b)) => show(b),
        Reply::Array(Some(items)) => {
            let v: Vec<String> = items.iter().map(show_reply).collect();
            let s = format!("[{}]", v.join(" "));
            if s.len() > 400 {
                let head: String = s.chars().take(400).collect();
                format!("{head}...] ({} items)", items.len())
            } else {
                s
            }
        }
        other => format!("{other:?}"),
    }
}

impl Act {
    fn describe(&self) -> String {
        match self {
            Act::Line(l) => format!("{l:?}"),
            Act::Values(items) => {
                let v: Vec<String> = items
                    .iter()
                    .map(|i| {
                        format!(
                            "VALUE {} flags={} cas={:?} {}",
                            i.key,
                            i.flags,
                            i.cas,
                            show(&i.data)
                        )
                    })
                    .collect();
                format!("[{}] END", v.join("; "))
            }
            Act::R(r) => show_reply(r),
        }
    }
}

impl Expect {
    fn describe(&self) -> String {
        match self {
            Expect::Line(l) => format!("{l:?}"),
            Expect::LinePrefix(p) => format!("{p:?}..."),
            Expect::Values(items) => {
                let v: Vec<String> = items
                    .iter()
                    .map(|i| {
                        format!(
                            "VALUE {} flags={} cas={:?} {}",
                            i.key,
                            i.flags,
                            i.cas,
                            show(&i.data)
                        )
                    })
                    .collect();
                format!("[{}] END", v.join("; "))
            }
            Expect::R(r) => show_reply(r),
            Expect::RIntIn(lo, hi) => format!("an integer in {lo}..={hi}"),
        }
    }
}

/// Whether `act` is what `exp` predicts; Some(Some(cas)) when it also showed a CAS unique.
fn check(exp: &Expect, act: &Act) -> Option<Option<u64>> {
    match (exp, act) {
        (Expect::Line(l), Act::Line(a)) => (l == a).then_some(None),
        (Expect::LinePrefix(p), Act::Line(a)) => a.starts_with(p).then_some(None),
        (Expect::Values(want), Act::Values(got)) => {
            if want.len() != got.len() {
                return None;
            }
            let mut learned = None;
            for (w, g) in want.iter().zip(got) {
                if w.key != g.key || w.flags != g.flags || w.data != g.data {
                    return None;
                }
                match (w.cas, g.cas) {
                    (CasRule::Absent, None) => {}
                    (CasRule::Eq(c), Some(x)) if c == x => learned = Some(x),
                    (CasRule::Gt(f), Some(x)) if x > f => learned = Some(x),
                    _ => return None,
                }
            }
            Some(learned)
        }
        (Expect::R(r), Act::R(a)) => (r == a).then_some(None),
        (Expect::RIntIn(lo, hi), Act::R(Reply::Int(n))) => (lo <= n && n <= hi).then_some(None),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// What each request does to a state: memcached's and Redis's documented rules, as memkeep's
// README and proto/SPEC.md state them for one keyspace.

fn next_cas(old: Option<&Entry>, floor: u64) -> Cas {
    Cas::After(old.map_or(floor, |e| e.cas.floor().max(floor)))
}

fn window(t: Times, ms: u64) -> Option<(u64, u64)> {
    Some((t.s + ms, t.r + ms))
}

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(Some(b.to_vec()))
}

fn arr(items: Vec<Reply>) -> Reply {
    Reply::Array(Some(items))
}

fn rerr(s: &str) -> Reply {
    Reply::Error(s.to_string())
}

fn int(n: usize) -> Reply {
    Reply::Int(n as i64)
}

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

/// Redis's index range rule (LRANGE, LTRIM, ZRANGE): inclusive bounds, negative from the end.
fn index_range(len: usize, start: i64, stop: i64) -> Option<(usize, usize)> {
    let n = len as i64;
    let s = if start < 0 { (start + n).max(0) } else { start };
    let e = if stop < 0 { stop + n } else { stop.min(n - 1) };
    (s <= e && s < n).then_some((s as usize, e as usize))
}

fn index_at(len: usize, i: i64) -> Option<usize> {
    let n = len as i64;
    let i = if i < 0 { i + n } else { i };
    (0..n).contains(&i).then_some(i as usize)
}

/// memcached's counter rule: optional surrounding spaces, digits, fits 64 bits.
fn parse_counter(v: &[u8]) -> Option<u64> {
    let t = v.trim_ascii();
    if t.is_empty() || t.len() > 20 || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// Redis's integer rule: canonical decimal, no spaces, no leading zeros, no "-0".
fn parse_i64(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty()
        || !digits.bytes().all(|c| c.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
        || s == "-0"
    {
        return None;
    }
    s.parse().ok()
}

type Outcomes = Vec<(Expect, State)>;

/// Every (reply, new state) the server may produce for `op` on `old` (a live item or nothing).
fn outcomes(op: &Op, key: &str, old: Option<&Entry>, floor: u64, t: Times) -> Outcomes {
    let keep = || old.cloned();
    let one = |e: Expect, s: State| vec![(e, s)];
    let r = |rep: Reply, s: State| vec![(Expect::R(rep), s)];
    let wrong = || vec![(Expect::R(rerr(R_WRONGTYPE)), old.cloned())];
    let line = |l: &str| Expect::Line(l.to_string());
    let cas = next_cas(old, floor);
    let str_of = || match old {
        None => Ok(None),
        Some(Entry {
            val: Val::Str { data, flags },
            exp,
            ..
        }) => Ok(Some((data, *flags, *exp))),
        Some(_) => Err(()),
    };
    // A changed collection: deleted when empty, else keeping the old expiry.
    let coll = |val: Val| -> State {
        (val.len() > 0).then(|| Entry {
            val,
            exp: old.and_then(|e| e.exp),
            cas,
        })
    };
    macro_rules! coll_of {
        ($variant:ident) => {
            match old {
                None => None,
                Some(Entry {
                    val: Val::$variant(c),
                    ..
                }) => Some(c),
                Some(_) => return wrong(),
            }
        };
    }
    match op {
        Op::MStore {
            mode,
            flags,
            ttl,
            data,
        } => {
            let stored = match mode {
                Mode::Set => true,
                Mode::Add => old.is_none(),
                Mode::Replace => old.is_some(),
            };
            if stored {
                let exp = if *ttl > 0 {
                    window(t, ttl * 1000)
                } else {
                    None
                };
                let new = Entry {
                    val: Val::Str {
                        data: data.clone(),
                        flags: *flags,
                    },
                    exp,
                    cas,
                };
                one(line("STORED"), Some(new))
            } else {
                one(line("NOT_STORED"), keep())
            }
        }
        Op::MCas {
            flags,
            data,
            unique,
        } => {
            let Some(e) = old else {
                return one(line("NOT_FOUND"), None);
            };
            let new = Some(Entry {
                val: Val::Str {
                    data: data.clone(),
                    flags: *flags,
                },
                exp: None,
                cas,
            });
            match e.cas {
                Cas::Known(c) if c == *unique => one(line("STORED"), new),
                Cas::Known(_) => one(line("EXISTS"), keep()),
                Cas::After(f) if *unique <= f => one(line("EXISTS"), keep()),
                Cas::After(_) => vec![(line("STORED"), new), (line("EXISTS"), keep())],
            }
        }
        Op::MCat { prepend, data } => match str_of() {
            Ok(None) => one(line("NOT_STORED"), None),
            Err(()) => one(line(MC_WRONGTYPE), keep()),
            Ok(Some((d, flags, exp))) => {
                if d.len() + data.len() > MAX_ITEM {
                    return one(Expect::LinePrefix("SERVER_ERROR"), keep());
                }
                let nd = if *prepend {
                    [data.as_slice(), d].concat()
                } else {
                    [d.as_slice(), data].concat()
                };
                let val = Val::Str { data: nd, flags };
                one(line("STORED"), Some(Entry { val, exp, cas }))
            }
        },
        Op::MArith { incr, delta } => match str_of() {
            Ok(None) => one(line("NOT_FOUND"), None),
            Err(()) => one(line(MC_WRONGTYPE), keep()),
            Ok(Some((d, flags, exp))) => match parse_counter(d) {
                None => one(line(NON_NUMERIC), keep()),
                Some(n) => {
                    let v = if *incr {
                        n.wrapping_add(*delta)
                    } else {
                        n.saturating_sub(*delta)
                    };
                    // memcached rewrites a shorter number in place, padded with spaces.
                    let mut text = v.to_string().into_bytes();
                    if text.len() < d.len() {
                        text.resize(d.len(), b' ');
                    }
                    let val = Val::Str { data: text, flags };
                    one(line(&v.to_string()), Some(Entry { val, exp, cas }))
                }
            },
        },
        Op::MDelete => match old {
            None => one(line("NOT_FOUND"), None),
            Some(_) => one(line("DELETED"), None),
        },
        Op::MTouch { ttl } => match old {
            None => one(line("NOT_FOUND"), None),
            Some(e) => {
                let exp = if *ttl > 0 {
                    window(t, ttl * 1000)
                } else {
                    None
                };
                one(line("TOUCHED"), Some(Entry { exp, ..e.clone() }))
            }
        },
        Op::MGet { gets } => match old {
            None => one(Expect::Values(vec![]), None),
            Some(Entry {
                val: Val::Str { data, flags },
                cas,
                ..
            }) => {
                let rule = match (gets, cas) {
                    (false, _) => CasRule::Absent,
                    (true, Cas::Known(c)) => CasRule::Eq(*c),
                    (true, Cas::After(f)) => CasRule::Gt(*f),
                };
                let item = ExpItem {
                    key: key.to_string(),
                    flags: *flags,
                    data: data.clone(),
                    cas: rule,
                };
                one(Expect::Values(vec![item]), keep())
            }
            Some(_) => one(line(MC_WRONGTYPE), keep()),
        },
        Op::RSet {
            data,
            ttl,
            cond,
            get,
        } => {
            let old_str = match str_of() {
                Ok(s) => s.map(|(d, _, _)| d),
                Err(()) if *get => return wrong(),
                Err(()) => None,
            };
            let apply = match cond {
                Cond::Always => true,
                Cond::Nx => old.is_none(),
                Cond::Xx => old.is_some(),
            };
            let reply = if *get {
                Reply::Bulk(old_str.cloned())
            } else if apply {
                ok()
            } else {
                Reply::Bulk(None)
            };
            if !apply {
                return r(reply, keep());
            }
            let exp = match ttl {
                None => None,
                Some(Ttl::Ex(s)) => window(t, s * 1000),
                Some(Ttl::Px(ms)) => window(t, *ms),
            };
            let val = Val::Str {
                data: data.clone(),
                flags: 0,
            };
            r(reply, Some(Entry { val, exp, cas }))
        }
        Op::RGet => match str_of() {
            Ok(d) => r(Reply::Bulk(d.map(|(d, _, _)| d.clone())), keep()),
            Err(()) => wrong(),
        },
        Op::RAppend { data } => match str_of() {
            Err(()) => wrong(),
            Ok(cur) => {
                let (d, flags, exp) = cur.map_or((&[][..], 0, None), |(d, f, e)| (&d[..], f, e));
                if d.len() + data.len() > MAX_ITEM {
                    return r(rerr(TOO_BIG), keep());
                }
                let nd = [d, data].concat();
                let n = nd.len();
                let val = Val::Str { data: nd, flags };
                r(int(n), Some(Entry { val, exp, cas }))
            }
        },
        Op::RIncrBy { delta } => match str_of() {
            Err(()) => wrong(),
            Ok(cur) => {
                let (n, flags, exp) = match cur {
                    None => (0, 0, None),
                    Some((d, f, e)) => match parse_i64(d) {
                        Some(n) => (n, f, e),
                        None => return r(rerr(NOT_INTEGER), keep()),
                    },
                };
                let Some(v) = n.checked_add(*delta) else {
                    return r(rerr(OVERFLOW), keep());
                };
                let val = Val::Str {
                    data: v.to_string().into_bytes(),
                    flags,
                };
                r(Reply::Int(v), Some(Entry { val, exp, cas }))
            }
        },
        Op::RStrlen => match str_of() {
            Ok(d) => r(int(d.map_or(0, |(d, _, _)| d.len())), keep()),
            Err(()) => wrong(),
        },
        Op::RDel => r(int(old.is_some() as usize), None),
        Op::RExists => r(int(old.is_some() as usize), keep()),
        Op::RType => {
            let name = match old.map(|e| e.val.kind()) {
                None => "none",
                Some(Kind::Str) => "string",
                Some(Kind::List) => "list",
                Some(Kind::Hash) => "hash",
                Some(Kind::Set) => "set",
                Some(Kind::Zset) => "zset",
            };
            r(Reply::Simple(name.into()), keep())
        }
        Op::RExpire { secs } => match old {
            None => r(int(0), None),
            Some(e) => r(
                int(1),
                Some(Entry {
                    exp: window(t, secs * 1000),
                    ..e.clone()
                }),
            ),
        },
        Op::RPersist => match old {
            Some(e) if e.exp.is_some() => r(
                int(1),
                Some(Entry {
                    exp: None,
                    ..e.clone()
                }),
            ),
            _ => r(int(0), keep()),
        },
        Op::RPttl => match old {
            None => r(Reply::Int(-2), None),
            Some(Entry { exp: None, .. }) => r(Reply::Int(-1), keep()),
            Some(Entry {
                exp: Some((lo, hi)),
                ..
            }) => {
                let least = (*lo as i64 - t.r as i64 - SLACK_MS as i64).max(1);
                let most = *hi as i64 - t.s as i64 + SLACK_MS as i64;
                vec![(Expect::RIntIn(least, most), keep())]
            }
        },
        Op::LPush { left, elems } => {
            let mut l = coll_of!(List).cloned().unwrap_or_default();
            for e in elems {
                if *left {
                    l.push_front(e.clone());
                } else {
                    l.push_back(e.clone());
                }
            }
            r(int(l.len()), coll(Val::List(l)))
        }
        Op::LPop { left, count } => {
            let Some(l) = coll_of!(List) else {
                return r(
                    if count.is_some() {
                        Reply::Array(None)
                    } else {
                        Reply::Bulk(None)
                    },
                    None,
                );
            };
            let mut l = l.clone();
            let mut popped = Vec::new();
            for _ in 0..count.unwrap_or(1) {
                let e = if *left { l.pop_front() } else { l.pop_back() };
                match e {
                    Some(e) => popped.push(bulk(&e)),
                    None => break,
                }
            }
            let reply = if count.is_some() {
                arr(popped)
            } else {
                popped.remove(0)
            };
            r(reply, coll(Val::List(l)))
        }
        Op::LRange { start, stop } => {
            let l = coll_of!(List);
            let items = l
                .and_then(|l| {
                    index_range(l.len(), *start, *stop)
                        .map(|(s, e)| l.range(s..=e).map(|x| bulk(x)).collect())
                })
                .unwrap_or_default();
            r(arr(items), keep())
        }
        Op::LLen => {
            let l = coll_of!(List);
            r(int(l.map_or(0, |l| l.len())), keep())
        }
        Op::LIndex { index } => {
            let l = coll_of!(List);
            let got = l.and_then(|l| index_at(l.len(), *index).map(|i| l[i].clone()));
            r(Reply::Bulk(got), keep())
        }
        Op::LSet { index, elem } => {
            let Some(l) = coll_of!(List) else {
                return r(rerr("ERR no such key"), None);
            };
            let Some(i) = index_at(l.len(), *index) else {
                return r(rerr("ERR index out of range"), keep());
            };
            let mut l = l.clone();
            l[i] = elem.clone();
            r(ok(), coll(Val::List(l)))
        }
        Op::LRem { count, elem } => {
            let Some(l) = coll_of!(List) else {
                return r(int(0), None);
            };
            let limit = if *count == 0 {
                usize::MAX
            } else {
                count.unsigned_abs() as usize
            };
            let mut removed = 0;
            let mut kept: Vec<Vec<u8>> = Vec::with_capacity(l.len());
            let mut walk = |x: &Vec<u8>| {
                if removed < limit && x == elem {
                    removed += 1;
                } else {
                    kept.push(x.clone());
                }
            };
            if *count < 0 {
                l.iter().rev().for_each(&mut walk);
                kept.reverse();
            } else {
                l.iter().for_each(&mut walk);
            }
            if removed == 0 {
                return r(int(0), keep());
            }
            r(int(removed), coll(Val::List(kept.into())))
        }
        Op::LTrim { start, stop } => {
            let Some(l) = coll_of!(List) else {
                return r(ok(), None);
            };
            let kept: VecDeque<Vec<u8>> = match index_range(l.len(), *start, *stop) {
                Some((s, e)) => l.range(s..=e).cloned().collect(),
                None => VecDeque::new(),
            };
            if kept.len() == l.len() {
                return r(ok(), keep());
            }
            r(ok(), coll(Val::List(kept)))
        }
        Op::HSet { pairs } => {
            let mut h = coll_of!(Hash).cloned().unwrap_or_default();
            let mut added = 0;
            for (f, v) in pairs {
                if h.insert(f.clone(), v.clone()).is_none() {
                    added += 1;
                }
            }
            r(int(added), coll(Val::Hash(h)))
        }
        Op::HGet { field } => {
            let h = coll_of!(Hash);
            r(Reply::Bulk(h.and_then(|h| h.get(field).cloned())), keep())
        }
        Op::HDel { fields } => {
            let Some(h) = coll_of!(Hash) else {
                return r(int(0), None);
            };
            let mut h = h.clone();
            let removed = fields.iter().filter(|f| h.remove(*f).is_some()).count();
            if removed == 0 {
                return r(int(0), keep());
            }
            r(int(removed), coll(Val::Hash(h)))
        }
        Op::HGetAll => {
            let h = coll_of!(Hash);
            let items = h.map_or(vec![], |h| {
                h.iter().flat_map(|(f, v)| [bulk(f), bulk(v)]).collect()
            });
            r(arr(items), keep())
        }
        Op::HLen => {
            let h = coll_of!(Hash);
            r(int(h.map_or(0, |h| h.len())), keep())
        }
        Op::SAdd { members } => {
            let mut s = coll_of!(Set).cloned().unwrap_or_default();
            let added = members.iter().filter(|m| s.insert((*m).clone())).count();
            r(int(added), coll(Val::Set(s)))
        }
        Op::SRem { members } => {
            let Some(s) = coll_of!(Set) else {
                return r(int(0), None);
            };
            let mut s = s.clone();
            let removed = members.iter().filter(|m| s.remove(*m)).count();
            if removed == 0 {
                return r(int(0), keep());
            }
            r(int(removed), coll(Val::Set(s)))
        }
        Op::SMembers => {
            let s = coll_of!(Set);
            r(
                arr(s.map_or(vec![], |s| s.iter().map(|m| bulk(m)).collect())),
                keep(),
            )
        }
        Op::SIsMember { member } => {
            let s = coll_of!(Set);
            r(int(s.is_some_and(|s| s.contains(member)) as usize), keep())
        }
        Op::SCard => {
            let s = coll_of!(Set);
            r(int(s.map_or(0, |s| s.len())), keep())
        }
        Op::ZAdd { pairs } => {
            let mut z = coll_of!(Zset).cloned().unwrap_or_default();
            let mut added = 0;
            for (s, m) in pairs {
                if z.insert(m.clone(), *s).is_none() {
                    added += 1;
                }
            }
            r(int(added), coll(Val::Zset(z)))
        }
        Op::ZRem { members } => {
            let Some(z) = coll_of!(Zset) else {
                return r(int(0), None);
            };
            let mut z = z.clone();
            let removed = members.iter().filter(|m| z.remove(*m).is_some()).count();
            if removed == 0 {
                return r(int(0), keep());
            }
            r(int(removed), coll(Val::Zset(z)))
        }
        Op::ZRange {
            start,
            stop,
            scores,
        } => {
            let z = coll_of!(Zset);
            let mut sorted: Vec<(i64, &Vec<u8>)> =
                z.map_or(vec![], |z| z.iter().map(|(m, s)| (*s, m)).collect());
            sorted.sort();
            let mut items = Vec::new();
            if let Some((s, e)) = index_range(sorted.len(), *start, *stop) {
                for (score, m) in &sorted[s..=e] {
                    items.push(bulk(m));
                    if *scores {
                        items.push(bulk(score_text(*score).as_bytes()));
                    }
                }
            }
            r(arr(items), keep())
        }
        Op::ZScore { member } => {
            let z = coll_of!(Zset);
            let got = z
                .and_then(|z| z.get(member))
                .map(|s| score_text(*s).into_bytes());
            r(Reply::Bulk(got), keep())
        }
        Op::ZCard => {
            let z = coll_of!(Zset);
            r(int(z.map_or(0, |z| z.len())), keep())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Connections (fallible: a restart breaks them, and the caller decides what that means)

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Conn {
    fn open(addr: SocketAddr) -> io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        if s.local_addr()? == s.peer_addr()? {
            return Err(io::Error::other("connected to itself"));
        }
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Conn {
            reader: BufReader::with_capacity(64 << 10, s.try_clone()?),
            writer: s,
        })
    }

    fn line(&mut self) -> io::Result<String> {
        let mut buf = Vec::new();
        self.reader.read_until(b'\n', &mut buf)?;
        if !buf.ends_with(b"\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("connection closed ({} bytes of a line)", buf.len()),
            ));
        }
        if !buf.ends_with(b"\r\n") {
            return Err(bad(format!("reply line without CRLF: {}", show(&buf))));
        }
        buf.truncate(buf.len() - 2);
        String::from_utf8(buf).map_err(|e| bad(format!("non-UTF-8 reply line: {e}")))
    }

    fn block(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut b = vec![0; n + 2];
        self.reader.read_exact(&mut b)?;
        if !b.ends_with(b"\r\n") {
            return Err(bad(format!("data block of {n} bytes not ended by CRLF")));
        }
        b.truncate(n);
        Ok(b)
    }

    fn mc_call(&mut self, req: &[u8]) -> io::Result<Act> {
        self.writer.write_all(req)?;
        let mut l = self.line()?;
        if l != "END" && !l.starts_with("VALUE ") {
            return Ok(Act::Line(l));
        }
        let mut items = Vec::new();
        while l != "END" {
            let f: Vec<&str> = l.split(' ').collect();
            if !(4..=5).contains(&f.len()) || f[0] != "VALUE" {
                return Err(bad(format!("bad line in a retrieval reply: {l:?}")));
            }
            let num = |s: &str| {
                s.parse::<u64>()
                    .map_err(|_| bad(format!("bad number in {l:?}")))
            };
            let flags = num(f[2])? as u32;
            let n = num(f[3])? as usize;
            let cas = f.get(4).map(|c| num(c)).transpose()?;
            let key = f[1].to_string();
            let data = self.block(n)?;
            items.push(McItem {
                key,
                flags,
                data,
                cas,
            });
            l = self.line()?;
        }
        Ok(Act::Values(items))
    }

    fn resp_call(&mut self, args: &[Vec<u8>]) -> io::Result<Reply> {
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        self.writer.write_all(&Resp::encode(&refs))?;
        self.resp_read()
    }

    fn resp_read(&mut self) -> io::Result<Reply> {
        let l = self.line()?;
        let Some(t) = l.get(..1) else {
            return Err(bad("empty RESP reply line".into()));
        };
        let rest = &l[1..];
        let num = || {
            rest.parse::<i64>()
                .map_err(|_| bad(format!("bad length in {l:?}")))
        };
        Ok(match t {
            "+" => Reply::Simple(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(num()?),
            "$" => match num()? {
                -1 => Reply::Bulk(None),
                n if n >= 0 => Reply::Bulk(Some(self.block(n as usize)?)),
                _ => return Err(bad(format!("bad bulk length in {l:?}"))),
            },
            "*" => match num()? {
                -1 => Reply::Array(None),
                n if n >= 0 => {
                    let mut v = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        v.push(self.resp_read()?);
                    }
                    Reply::Array(Some(v))
                }
                _ => return Err(bad(format!("bad array length in {l:?}"))),
            },
            _ => return Err(bad(format!("unknown RESP reply {l:?}"))),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Client threads

/// State every thread shares with the coordinator.
struct Shared {
    mc_addr: SocketAddr,
    resp_addr: SocketAddr,
    /// False from just before a restart's signal until the new process accepts connections.
    up: AtomicBool,
    /// Bumped once per restart, after the new process is up.
    epoch: AtomicU64,
    stop: AtomicBool,
    failed: AtomicBool,
    /// How each restart so far was done, in order (restart i ends epoch i).
    kinds: Mutex<Vec<Restart>>,
    start: Instant,
    seed: u64,
    mc_ops: AtomicU64,
    resp_ops: AtomicU64,
    verified: AtomicU64,
}

#[derive(Default, Clone, Debug)]
struct Stats {
    mc_ops: u64,
    resp_ops: u64,
    reads_verified: u64,
    writes_verified: u64,
    lost_replies: u64,
    /// Lost replies by restart kind and what a read showed: [graceful, kill -9] x
    /// [applied, not applied, cannot tell].
    lost_outcome: [[u64; 3]; 2],
    expiries_seen: u64,
    sweeps: u64,
    keys_swept: u64,
    cas_learned: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.mc_ops += o.mc_ops;
        self.resp_ops += o.resp_ops;
        self.reads_verified += o.reads_verified;
        self.writes_verified += o.writes_verified;
        self.lost_replies += o.lost_replies;
        for i in 0..2 {
            for j in 0..3 {
                self.lost_outcome[i][j] += o.lost_outcome[i][j];
            }
        }
        self.expiries_seen += o.expiries_seen;
        self.sweeps += o.sweeps;
        self.keys_swept += o.keys_swept;
        self.cas_learned += o.cas_learned;
    }
}

/// What the op generator looks at: the key's first candidate state.
#[derive(Clone, Copy)]
struct Peek {
    kind: Option<Kind>,
    len: usize,
    mc_num: bool,
    r_num: bool,
    cas: Option<Cas>,
    single: bool,
    vol: bool,
}

type Make = Box<dyn FnOnce(&mut Rng) -> Op>;

fn choose(rng: &mut Rng, menu: Vec<(u64, Make)>) -> Op {
    let total: u64 = menu.iter().map(|m| m.0).sum();
    let mut x = rng.below(total);
    for (w, make) in menu {
        if x < w {
            return make(rng);
        }
        x -= w;
    }
    unreachable!("weights add up")
}

fn m_store(rng: &mut Rng, vol: bool, mode: Mode, numeric: bool) -> Op {
    Op::MStore {
        mode,
        flags: rng.flags(),
        ttl: if vol && rng.chance(70) { rng.ttl() } else { 0 },
        data: if numeric { rng.number() } else { rng.value() },
    }
}

fn r_set(rng: &mut Rng, vol: bool, cond: Cond, get: bool) -> Op {
    let ttl = if vol && rng.chance(70) {
        Some(if rng.chance(50) {
            Ttl::Ex(rng.ttl())
        } else {
            Ttl::Px(rng.range(800, 3000))
        })
    } else {
        None
    };
    Op::RSet {
        data: if rng.chance(20) {
            rng.number()
        } else {
            rng.value()
        },
        ttl,
        cond,
        get,
    }
}

fn elems(rng: &mut Rng) -> Vec<Vec<u8>> {
    let n = rng.range(1, 4);
    (0..n).map(|_| rng.elem()).collect()
}

fn h_set(rng: &mut Rng) -> Op {
    let n = rng.range(1, 3);
    Op::HSet {
        pairs: (0..n).map(|_| (rng.field(), rng.small())).collect(),
    }
}

fn s_add(rng: &mut Rng) -> Op {
    let n = rng.range(1, 4);
    Op::SAdd {
        members: (0..n).map(|_| rng.member()).collect(),
    }
}

fn z_add(rng: &mut Rng) -> Op {
    let n = rng.range(1, 3);
    Op::ZAdd {
        pairs: (0..n).map(|_| (rng.score(), rng.zmember())).collect(),
    }
}

fn l_push(rng: &mut Rng) -> Op {
    Op::LPush {
        left: rng.chance(50),
        elems: elems(rng),
    }
}

struct Worker {
    id: usize,
    /// Leans on the memcached port (even ids) or on RESP (odd ids).
    mc_heavy: bool,
    rng: Rng,
    keys: Vec<KeySt>,
    history: Vec<VecDeque<String>>,
    mc: Option<Conn>,
    rc: Option<Conn>,
    /// The restart generation our connections belong to.
    epoch: u64,
    need_sweep: bool,
    shared: Arc<Shared>,
    st: Stats,
    /// Keys whose write a graceful stop applied without answering.
    graceful_applied_unanswered: Vec<String>,
}

fn key_name(thread: usize, k: usize) -> String {
    format!("soak:{thread}:{k}")
}

impl Worker {
    fn new(id: usize, shared: Arc<Shared>) -> Worker {
        Worker {
            id,
            mc_heavy: id.is_multiple_of(2),
            rng: Rng::new(shared.seed ^ (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            keys: (0..KEYS_PER_THREAD)
                .map(|_| KeySt {
                    cands: vec![None],
                    floor: 0,
                    lost: None,
                })
                .collect(),
            history: vec![VecDeque::new(); KEYS_PER_THREAD],
            mc: None,
            rc: None,
            epoch: u64::MAX,
            need_sweep: false,
            shared,
            st: Stats::default(),
            graceful_applied_unanswered: Vec::new(),
        }
    }

    fn elapsed(&self) -> f64 {
        self.shared.start.elapsed().as_secs_f64()
    }

    /// The load loop, until the coordinator says stop.
    fn run(&mut self) -> Result<(), String> {
        self.reconnect()?;
        self.need_sweep = false; // a fresh store holds nothing the model does not know
        while !self.shared.stop.load(SeqCst) {
            if self.shared.epoch.load(SeqCst) != self.epoch {
                self.reconnect()?;
            }
            if self.need_sweep {
                self.sweep()?;
                continue;
            }
            let k = self.rng.below(KEYS_PER_THREAD as u64) as usize;
            let op = self.gen_op(k);
            self.exec(k, &op)?;
        }
        Ok(())
    }

    /// After the final restart: read every key back.
    fn final_check(&mut self) -> Result<(), String> {
        self.reconnect()?;
        while self.need_sweep {
            self.sweep()?;
        }
        Ok(())
    }

    /// Waits (bounded) for the server of a newer generation and connects to both ports.
    fn reconnect(&mut self) -> Result<(), String> {
        self.mc = None;
        self.rc = None;
        let deadline = Instant::now() + COMEBACK_TIMEOUT;
        let mut last = String::from("server not up");
        loop {
            if self.shared.failed.load(SeqCst) && !self.shared.stop.load(SeqCst) {
                return Err(String::new()); // another thread failed; its report says why
            }
            let g = self.shared.epoch.load(SeqCst);
            if self.shared.up.load(SeqCst) && g != self.epoch {
                match (
                    Conn::open(self.shared.mc_addr),
                    Conn::open(self.shared.resp_addr),
                ) {
                    (Ok(m), Ok(r)) => {
                        self.mc = Some(m);
                        self.rc = Some(r);
                        self.epoch = g;
                        self.need_sweep = true;
                        return Ok(());
                    }
                    (Err(e), _) | (_, Err(e)) => last = e.to_string(),
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "thread {}: could not reconnect within {COMEBACK_TIMEOUT:?}: {last}",
                    self.id
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// A broken connection is fine only when a restart broke it.
    fn on_io_error(&mut self, e: io::Error, k: usize, op: &Op) -> Result<(), String> {
        let restarted =
            !self.shared.up.load(SeqCst) || self.shared.epoch.load(SeqCst) != self.epoch;
        if e.kind() == io::ErrorKind::InvalidData || !restarted {
            return Err(format!(
                "thread {} seed {}: {} on key {} op {} failed with no restart under way: {e}",
                self.id,
                self.shared.seed,
                if e.kind() == io::ErrorKind::InvalidData {
                    "malformed reply"
                } else {
                    "connection"
                },
                key_name(self.id, k),
                op.describe()
            ));
        }
        self.reconnect()
    }

    fn exec(&mut self, k: usize, op: &Op) -> Result<(), String> {
        let key = key_name(self.id, k);
        if op.is_mc() {
            self.st.mc_ops += 1;
            self.shared.mc_ops.fetch_add(1, SeqCst);
        } else {
            self.st.resp_ops += 1;
            self.shared.resp_ops.fetch_add(1, SeqCst);
        }
        let s = now_ms();
        let res = if op.is_mc() {
            let req = op.mc_request(&key);
            self.mc.as_mut().expect("connected").mc_call(&req)
        } else {
            let args = op.resp_args(&key);
            self.rc
                .as_mut()
                .expect("connected")
                .resp_call(&args)
                .map(Act::R)
        };
        let r = now_ms();
        match res {
            Ok(act) => self.settle(k, &key, op, &act, Times { s, r }),
            Err(e) => {
                let lost_epoch = self.epoch;
                self.on_io_error(e, k, op)?;
                let graceful = self
                    .shared
                    .kinds
                    .lock()
                    .expect("lock")
                    .get(lost_epoch as usize)
                    == Some(&Restart::Graceful);
                // The request may or may not have been applied before the server went away:
                // keep both possibilities until a read decides.
                let t = Times { s, r: now_ms() };
                let ks = &self.keys[k];
                let mut next = ks.cands.clone();
                let mut applied = Vec::new();
                for cand in &ks.cands {
                    for (b, _) in branches(cand, t) {
                        for (_, new) in outcomes(op, &key, b, ks.floor, t) {
                            if !applied.contains(&new) {
                                applied.push(new.clone());
                            }
                            if !next.contains(&new) {
                                next.push(new);
                            }
                        }
                    }
                }
                let lost = Lost {
                    graceful,
                    unapplied: ks.cands.clone(),
                    applied,
                };
                self.st.lost_replies += 1;
                self.note(
                    k,
                    format!(
                        "{:.3}s {} -> reply lost to a restart; {} candidates",
                        self.elapsed(),
                        op.describe(),
                        next.len()
                    ),
                );
                if next.len() > MAX_CANDIDATES {
                    return Err(self.report(k, &key, op, None, t, &["(model ambiguity)".into()]));
                }
                self.keys[k].cands = next;
                self.keys[k].lost = Some(lost);
                Ok(())
            }
        }
    }

    /// Once a read has pinned a key down after a lost reply: was the request applied?
    fn judge_lost(&mut self, k: usize, is_read: bool) {
        let ks = &mut self.keys[k];
        let Some(lost) = ks.lost.as_ref() else {
            return;
        };
        let row = if lost.graceful { 0 } else { 1 };
        if !is_read {
            // A write came first (the read-back after a restart should prevent this).
            self.st.lost_outcome[row][2] += 1;
            ks.lost = None;
            return;
        }
        if ks.cands.len() != 1 {
            return;
        }
        let seen = &ks.cands[0];
        let a = lost.applied.iter().any(|s| could_be(s, seen));
        let u = lost.unapplied.iter().any(|s| could_be(s, seen));
        let col = match (a, u) {
            (true, false) => 0,
            (false, true) => 1,
            _ => 2,
        };
        self.st.lost_outcome[row][col] += 1;
        if row == 0 && col == 0 {
            self.graceful_applied_unanswered.push(format!(
                "{} (history: {})",
                key_name(self.id, k),
                self.history[k]
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
        self.keys[k].lost = None;
    }

    fn note(&mut self, k: usize, s: String) {
        let h = &mut self.history[k];
        if h.len() == 12 {
            h.pop_front();
        }
        h.push_back(s);
    }

    fn settle(&mut self, k: usize, key: &str, op: &Op, act: &Act, t: Times) -> Result<(), String> {
        let ks = &self.keys[k];
        let mut next: Vec<State> = Vec::new();
        let mut expected = Vec::new();
        let mut learned = None;
        let (mut live_match, mut expired_match) = (false, false);
        for cand in &ks.cands {
            for (b, expired) in branches(cand, t) {
                for (exp, new) in outcomes(op, key, b, ks.floor, t) {
                    match check(&exp, act) {
                        Some(l) => {
                            let mut new = new;
                            if let Some(c) = l {
                                if let Some(e) = new.as_mut() {
                                    e.cas = Cas::Known(c);
                                }
                                learned = Some(c);
                            }
                            if expired {
                                expired_match = true;
                            } else {
                                live_match = true;
                            }
                            if !next.contains(&new) {
                                next.push(new);
                            }
                        }
                        None => expected.push(exp.describe()),
                    }
                }
            }
        }
        if next.is_empty() {
            return Err(self.report(k, key, op, Some(act), t, &expected));
        }
        if next.len() > MAX_CANDIDATES {
            return Err(self.report(k, key, op, Some(act), t, &["(model ambiguity)".into()]));
        }
        if expired_match && !live_match {
            self.st.expiries_seen += 1;
        }
        if let Some(c) = learned {
            self.st.cas_learned += 1;
            let ks = &mut self.keys[k];
            ks.floor = ks.floor.max(c);
        }
        if op.is_read() {
            self.st.reads_verified += 1;
            self.shared.verified.fetch_add(1, SeqCst);
        } else {
            self.st.writes_verified += 1;
        }
        let line = format!(
            "{:.3}s {} -> {}",
            self.elapsed(),
            op.describe(),
            act.describe()
        );
        self.note(k, line);
        self.keys[k].cands = next;
        self.judge_lost(k, op.is_read());
        Ok(())
    }

    fn report(
        &self,
        k: usize,
        key: &str,
        op: &Op,
        act: Option<&Act>,
        t: Times,
        expected: &[String],
    ) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "MISMATCH in thread {} ({}-heavy), seed {}, at {:.3}s",
            self.id,
            if self.mc_heavy { "memcached" } else { "RESP" },
            self.shared.seed,
            self.elapsed()
        );
        let _ = writeln!(s, "  key:      {key}");
        let _ = writeln!(s, "  request:  {}", op.describe());
        let _ = writeln!(
            s,
            "  reply:    {}",
            act.map_or("(lost)".into(), |a| a.describe())
        );
        let _ = writeln!(s, "  sent at {} ms, reply at {} ms (unix)", t.s, t.r);
        let _ = writeln!(s, "  expected one of:");
        for e in expected {
            let _ = writeln!(s, "    {e}");
        }
        let _ = writeln!(s, "  model candidates before the request:");
        for c in &self.keys[k].cands {
            let d = match c {
                None => "absent".to_string(),
                Some(e) => {
                    let v = match &e.val {
                        Val::Str { data, flags } => format!("string flags={flags} {}", show(data)),
                        other => {
                            let full = format!("{other:?}");
                            full.chars().take(300).collect()
                        }
                    };
                    format!("{v} exp={:?} cas={:?}", e.exp, e.cas)
                }
            };
            let _ = writeln!(s, "    {d}");
        }
        let _ = writeln!(s, "  recent history of the key (oldest first):");
        for h in &self.history[k] {
            let _ = writeln!(s, "    {h}");
        }
        s
    }

    /// Reads every key back and checks it against the model (after each restart).
    fn sweep(&mut self) -> Result<(), String> {
        self.need_sweep = false;
        let epoch = self.epoch;
        for k in 0..KEYS_PER_THREAD {
            self.resolve(k)?;
            if self.epoch != epoch {
                self.need_sweep = true; // restarted meanwhile: start over
                return Ok(());
            }
        }
        self.st.sweeps += 1;
        Ok(())
    }

    /// Reads one key until its candidates are told apart (as far as reads can), and checks its
    /// TTL when it has one.
    fn resolve(&mut self, k: usize) -> Result<(), String> {
        let mut tried: Vec<Kind> = Vec::new();
        self.st.keys_swept += 1;
        while self.keys[k].cands.len() > 1 || tried.is_empty() {
            let next = self.keys[k]
                .cands
                .iter()
                .map(kind_of)
                .find(|kd| !tried.contains(kd));
            let Some(kind) = next else { break };
            tried.push(kind);
            self.exec(k, &inspect_op(kind))?;
        }
        if self.keys[k]
            .cands
            .iter()
            .any(|c| c.as_ref().is_some_and(|e| e.exp.is_some()))
        {
            self.exec(k, &Op::RPttl)?;
        }
        Ok(())
    }

    fn gen_op(&mut self, k: usize) -> Op {
        let ks = &self.keys[k];
        let p = {
            let c = ks.cands[0].as_ref();
            let data = c.and_then(|e| match &e.val {
                Val::Str { data, .. } => Some(data),
                _ => None,
            });
            Peek {
                kind: c.map(|e| e.val.kind()),
                len: c.map_or(0, |e| e.val.len()),
                mc_num: data.is_some_and(|d| parse_counter(d).is_some()),
                r_num: data.is_some_and(|d| parse_i64(d).is_some()),
                cas: c.map(|e| e.cas),
                single: ks.cands.len() == 1,
                vol: k < VOLATILE_KEYS,
            }
        };
        let vol = p.vol;
        let mc = self.mc_heavy;
        let mut menu: Vec<(u64, Make)> = Vec::new();
        macro_rules! add {
            ($w:expr, $make:expr) => {
                if $w > 0 {
                    menu.push(($w, Box::new($make)));
                }
            };
        }
        let v = |w: u64| if vol { w } else { 0 };
        let appendable = p.len < (600 << 10);
        match p.kind {
            None => {
                if mc {
                    add!(40, move |g: &mut Rng| m_store(g, vol, Mode::Set, false));
                    add!(15, move |g: &mut Rng| m_store(g, vol, Mode::Add, false));
                    add!(10, move |g: &mut Rng| m_store(g, vol, Mode::Set, true));
                    add!(3, move |g: &mut Rng| m_store(g, vol, Mode::Replace, false));
                    add!(8, move |g: &mut Rng| r_set(g, vol, Cond::Always, false));
                    add!(3, |g: &mut Rng| Op::RAppend { data: g.small() });
                    add!(3, |g: &mut Rng| Op::RIncrBy {
                        delta: g.below(2001) as i64 - 1000
                    });
                    add!(8, |_: &mut Rng| Op::MGet { gets: false });
                    add!(4, |_: &mut Rng| Op::RGet);
                    add!(3, |_: &mut Rng| Op::MDelete);
                    add!(2, |g: &mut Rng| Op::MArith {
                        incr: true,
                        delta: g.below(100)
                    });
                    add!(2, |g: &mut Rng| Op::MCat {
                        prepend: false,
                        data: g.small()
                    });
                } else {
                    add!(20, move |g: &mut Rng| r_set(g, vol, Cond::Always, false));
                    add!(4, move |g: &mut Rng| r_set(g, vol, Cond::Nx, false));
                    add!(4, |g: &mut Rng| Op::RIncrBy {
                        delta: g.below(2001) as i64 - 1000
                    });
                    add!(3, |g: &mut Rng| Op::RAppend { data: g.small() });
                    add!(20, l_push);
                    add!(12, h_set);
                    add!(12, s_add);
                    add!(12, z_add);
                    add!(5, move |g: &mut Rng| m_store(g, vol, Mode::Set, false));
                    add!(3, |_: &mut Rng| Op::RGet);
                    add!(1, |_: &mut Rng| Op::LRange { start: 0, stop: -1 });
                    add!(1, |_: &mut Rng| Op::HGetAll);
                    add!(1, |_: &mut Rng| Op::RType);
                    add!(1, |_: &mut Rng| Op::RExists);
                    add!(1, |_: &mut Rng| Op::LPop {
                        left: true,
                        count: None
                    });
                    add!(1, |_: &mut Rng| Op::LPop {
                        left: false,
                        count: Some(2)
                    });
                    add!(1, |_: &mut Rng| Op::RPttl);
                }
            }
            Some(Kind::Str) => {
                let known = match p.cas {
                    Some(Cas::Known(c)) if p.single => Some(c),
                    _ => None,
                };
                let stale = match p.cas {
                    Some(Cas::Known(c)) => c.saturating_sub(1),
                    Some(Cas::After(f)) => f,
                    None => 0,
                };
                let w = |m: u64, r: u64| if mc { m } else { r };
                add!(w(20, 8), |_: &mut Rng| Op::MGet { gets: false });
                add!(w(8, 4), |_: &mut Rng| Op::MGet { gets: true });
                add!(w(8, 20), |_: &mut Rng| Op::RGet);
                add!(w(12, 3), move |g: &mut Rng| m_store(
                    g,
                    vol,
                    Mode::Set,
                    false
                ));
                add!(w(4, 1), move |g: &mut Rng| m_store(g, vol, Mode::Set, true));
                add!(w(3, 1), move |g: &mut Rng| m_store(
                    g,
                    vol,
                    Mode::Replace,
                    false
                ));
                add!(w(2, 1), move |g: &mut Rng| m_store(
                    g,
                    vol,
                    Mode::Add,
                    false
                ));
                if appendable {
                    add!(w(4, 2), |g: &mut Rng| Op::MCat {
                        prepend: false,
                        data: g.small()
                    });
                    add!(w(3, 1), |g: &mut Rng| Op::MCat {
                        prepend: true,
                        data: g.small()
                    });
                    add!(w(2, 5), |g: &mut Rng| Op::RAppend { data: g.small() });
                }
                let num = if p.mc_num { 5 } else { 1 };
                add!(w(2 * num, num), |g: &mut Rng| Op::MArith {
                    incr: true,
                    delta: g.below(1001)
                });
                add!(w(2 * num, num), |g: &mut Rng| Op::MArith {
                    incr: false,
                    delta: g.below(1001)
                });
                let rnum = if p.r_num { 5 } else { 1 };
                add!(w(rnum, 2 * rnum), |g: &mut Rng| Op::RIncrBy {
                    delta: match g.below(4) {
                        0 => 1,
                        1 => -1,
                        _ => g.below(2001) as i64 - 1000,
                    }
                });
                if let Some(c) = known {
                    add!(w(5, 2), move |g: &mut Rng| Op::MCas {
                        flags: g.flags(),
                        data: g.value(),
                        unique: c
                    });
                }
                add!(w(2, 1), move |g: &mut Rng| Op::MCas {
                    flags: g.flags(),
                    data: g.value(),
                    unique: stale
                });
                add!(w(4, 2), |_: &mut Rng| Op::MDelete);
                add!(w(3, 1), move |g: &mut Rng| Op::MTouch {
                    ttl: if vol && g.chance(80) { g.ttl() } else { 0 }
                });
                add!(w(2, 10), move |g: &mut Rng| r_set(
                    g,
                    vol,
                    Cond::Always,
                    false
                ));
                add!(w(1, 4), move |g: &mut Rng| r_set(
                    g,
                    vol,
                    Cond::Always,
                    true
                ));
                add!(w(1, 2), move |g: &mut Rng| r_set(g, vol, Cond::Nx, false));
                add!(w(1, 2), move |g: &mut Rng| {
                    let get = g.chance(30);
                    r_set(g, vol, Cond::Xx, get)
                });
                add!(w(2, 3), |_: &mut Rng| Op::RStrlen);
                add!(w(1, 4), |_: &mut Rng| Op::RDel);
                add!(w(1, 2), |_: &mut Rng| Op::RExists);
                add!(w(1, 2), |_: &mut Rng| Op::RType);
                add!(w(2, 2), |_: &mut Rng| Op::RPttl);
                add!(v(w(2, 4)), |g: &mut Rng| Op::RExpire { secs: g.ttl() });
                add!(w(1, 2), |_: &mut Rng| Op::RPersist);
                add!(w(1, 1), l_push); // WRONGTYPE
                add!(w(0, 1), h_set); // WRONGTYPE
                add!(w(0, 1), |_: &mut Rng| Op::LRange { start: 0, stop: -1 });
            }
            Some(Kind::List) => {
                let big = p.len > 40;
                add!(15, |_: &mut Rng| Op::LRange { start: 0, stop: -1 });
                add!(8, |g: &mut Rng| Op::LRange {
                    start: g.index(),
                    stop: g.index()
                });
                add!(if big { 4 } else { 20 }, l_push);
                add!(if big { 30 } else { 8 }, |g: &mut Rng| Op::LPop {
                    left: g.chance(50),
                    count: None
                });
                add!(5, |g: &mut Rng| Op::LPop {
                    left: g.chance(50),
                    count: Some(g.range(1, 4) as usize)
                });
                add!(4, |_: &mut Rng| Op::LLen);
                add!(5, |g: &mut Rng| Op::LIndex { index: g.index() });
                add!(4, |g: &mut Rng| Op::LSet {
                    index: g.index(),
                    elem: g.elem()
                });
                add!(3, |g: &mut Rng| Op::LRem {
                    count: g.below(5) as i64 - 2,
                    elem: format!("e{}", g.below(8)).into_bytes()
                });
                add!(if big { 6 } else { 2 }, |g: &mut Rng| Op::LTrim {
                    start: g.below(5) as i64,
                    stop: -(g.below(5) as i64) - 1
                });
                add!(2, |_: &mut Rng| Op::RDel);
                add!(2, |_: &mut Rng| Op::RType);
                add!(1, |_: &mut Rng| Op::RExists);
                add!(1, |_: &mut Rng| Op::RPttl);
                add!(v(2), |g: &mut Rng| Op::RExpire { secs: g.ttl() });
                // Other families and the memcached port on a list.
                add!(2, |_: &mut Rng| Op::MGet { gets: false });
                add!(1, |_: &mut Rng| Op::RGet);
                add!(1, |g: &mut Rng| Op::RAppend { data: g.small() });
                add!(1, |g: &mut Rng| Op::MCat {
                    prepend: false,
                    data: g.small()
                });
                add!(1, |g: &mut Rng| Op::MArith {
                    incr: true,
                    delta: g.below(10)
                });
                add!(1, move |g: &mut Rng| m_store(g, vol, Mode::Add, false));
                add!(1, move |g: &mut Rng| m_store(g, vol, Mode::Set, false));
                add!(1, move |g: &mut Rng| r_set(g, vol, Cond::Always, false));
                add!(1, move |g: &mut Rng| Op::MTouch {
                    ttl: if vol { g.ttl() } else { 0 }
                });
                add!(1, |_: &mut Rng| Op::MDelete);
                add!(1, h_set);
            }
            Some(Kind::Hash) => {
                add!(15, |_: &mut Rng| Op::HGetAll);
                add!(15, |g: &mut Rng| Op::HGet { field: g.field() });
                add!(if p.len > 30 { 5 } else { 20 }, h_set);
                add!(if p.len > 30 { 30 } else { 10 }, |g: &mut Rng| {
                    let n = g.range(1, 2);
                    Op::HDel {
                        fields: (0..n).map(|_| g.field()).collect(),
                    }
                });
                add!(4, |_: &mut Rng| Op::HLen);
                add!(2, |_: &mut Rng| Op::RDel);
                add!(1, |_: &mut Rng| Op::RType);
                add!(1, |_: &mut Rng| Op::RPttl);
                add!(v(2), |g: &mut Rng| Op::RExpire { secs: g.ttl() });
                add!(1, |_: &mut Rng| Op::RPersist);
                add!(1, |_: &mut Rng| Op::MGet { gets: true });
                add!(1, |_: &mut Rng| Op::RGet);
                add!(1, s_add);
                add!(1, move |g: &mut Rng| r_set(g, vol, Cond::Always, false));
            }
            Some(Kind::Set) => {
                add!(15, |_: &mut Rng| Op::SMembers);
                add!(12, |g: &mut Rng| Op::SIsMember { member: g.member() });
                add!(if p.len > 50 { 5 } else { 20 }, s_add);
                add!(if p.len > 50 { 30 } else { 12 }, |g: &mut Rng| {
                    let n = g.range(1, 3);
                    Op::SRem {
                        members: (0..n).map(|_| g.member()).collect(),
                    }
                });
                add!(4, |_: &mut Rng| Op::SCard);
                add!(2, |_: &mut Rng| Op::RDel);
                add!(1, |_: &mut Rng| Op::RType);
                add!(1, |_: &mut Rng| Op::RPttl);
                add!(v(2), |g: &mut Rng| Op::RExpire { secs: g.ttl() });
                add!(1, |_: &mut Rng| Op::MGet { gets: false });
                add!(1, z_add);
                add!(1, move |g: &mut Rng| m_store(g, vol, Mode::Set, false));
            }
            Some(Kind::Zset) => {
                add!(10, |g: &mut Rng| Op::ZRange {
                    start: 0,
                    stop: -1,
                    scores: g.chance(50)
                });
                add!(6, |g: &mut Rng| Op::ZRange {
                    start: g.index(),
                    stop: g.index(),
                    scores: g.chance(50)
                });
                add!(10, |g: &mut Rng| Op::ZScore {
                    member: g.zmember()
                });
                add!(if p.len > 40 { 5 } else { 20 }, z_add);
                add!(if p.len > 40 { 30 } else { 12 }, |g: &mut Rng| {
                    let n = g.range(1, 2);
                    Op::ZRem {
                        members: (0..n).map(|_| g.zmember()).collect(),
                    }
                });
                add!(4, |_: &mut Rng| Op::ZCard);
                add!(2, |_: &mut Rng| Op::RDel);
                add!(1, |_: &mut Rng| Op::RType);
                add!(1, |_: &mut Rng| Op::RPttl);
                add!(v(2), |g: &mut Rng| Op::RExpire { secs: g.ttl() });
                add!(1, |_: &mut Rng| Op::MGet { gets: false });
                add!(1, l_push);
                add!(1, move |g: &mut Rng| r_set(g, vol, Cond::Always, false));
            }
        }
        choose(&mut self.rng, menu)
    }
}

// ---------------------------------------------------------------------------------------------
// Memory sampling

#[derive(Clone, Copy, Debug)]
struct Sample {
    /// Seconds since the test started.
    at: f64,
    lifetime: usize,
    /// Seconds since this server process started.
    age: f64,
    rss_kb: u64,
    anon_kb: u64,
    file_kb: u64,
}

/// VmRSS, RssAnon and RssFile of `pid` in kB, from /proc.
fn proc_memory(pid: u32) -> Option<(u64, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let l = text.lines().find(|l| l.starts_with(name))?;
        l[name.len()..].split_whitespace().next()?.parse().ok()
    };
    Some((field("VmRSS:")?, field("RssAnon:")?, field("RssFile:")?))
}

struct Watched {
    pid: u32,
    lifetime: usize,
    since: Instant,
}

#[derive(Debug)]
struct Lifetime {
    start: f64,
    end: f64,
    /// How it ended: "graceful", "kill -9" or "end of test".
    ended_by: &'static str,
    /// Only the final read-back ran in it (not judged for memory).
    final_check: bool,
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// The memory checks; returns a failure per breach, and prints a table as it goes.
fn memory_report(samples: &[Sample], lifetimes: &[Lifetime]) -> Vec<String> {
    let mut failures = Vec::new();
    let bound = |base: u64| base + (base / 2).max(64 * MIB / 1024);
    let mut baseline: Option<u64> = None;
    println!(
        "memory per server lifetime (MiB; quarters by age; flatness judged on RssAnon):\n  \
         life  span            ended by     samples  RSS min-max      RssAnon min-max  \
         anon Q2 max  anon Q4 max  RssFile max"
    );
    for (i, l) in lifetimes.iter().enumerate() {
        let s: Vec<&Sample> = samples.iter().filter(|s| s.lifetime == i).collect();
        if s.is_empty() {
            println!("  L{i}: no samples");
            continue;
        }
        let span = l.end - l.start;
        let q = |a: f64, b: f64| {
            s.iter()
                .filter(|x| x.age >= a * span && x.age < b * span)
                .map(|x| x.anon_kb)
                .max()
        };
        let minmax = |f: fn(&Sample) -> u64| {
            let v: Vec<u64> = s.iter().map(|&x| f(x)).collect();
            (
                *v.iter().min().expect("samples"),
                *v.iter().max().expect("samples"),
            )
        };
        let (rmin, rmax) = minmax(|x| x.rss_kb);
        let (amin, amax) = minmax(|x| x.anon_kb);
        let (_, fmax) = minmax(|x| x.file_kb);
        let (q2, q4, post) = (q(0.25, 0.5), q(0.75, 1.01), q(0.25, 1.01));
        let fmt = |v: Option<u64>| v.map_or("-".into(), |v| format!("{:.1}", mb(v)));
        println!(
            "  L{i:<3} {:>6.1}s-{:>6.1}s  {:<11}  {:>7}  {:>6.1}-{:<8.1}  {:>6.1}-{:<8.1}  {:>11}  \
             {:>11}  {:>10.1}{}",
            l.start,
            l.end,
            l.ended_by,
            s.len(),
            mb(rmin),
            mb(rmax),
            mb(amin),
            mb(amax),
            fmt(q2),
            fmt(q4),
            mb(fmax),
            if l.final_check {
                "  (final read-back only)"
            } else {
                ""
            }
        );
        if l.final_check {
            continue;
        }
        let (Some(q2), Some(q4), Some(post)) = (q2, q4, post) else {
            println!("        too short to judge");
            continue;
        };
        if s.len() < 8 {
            println!("        too short to judge");
            continue;
        }
        if q4 > bound(q2) {
            failures.push(format!(
                "RssAnon grew within lifetime L{i}: last-quarter max {:.1} MiB vs second-quarter \
                 max {:.1} MiB (bound {:.1} MiB)",
                mb(q4),
                mb(q2),
                mb(bound(q2))
            ));
        }
        match baseline {
            None => baseline = Some(post),
            Some(b) if post > bound(b) => failures.push(format!(
                "RssAnon of lifetime L{i} (max {:.1} MiB after warm-up) exceeds the first \
                 lifetime's {:.1} MiB beyond the bound {:.1} MiB",
                mb(post),
                mb(b),
                mb(bound(b))
            )),
            Some(_) => {}
        }
    }
    failures
}

// ---------------------------------------------------------------------------------------------
// The test

#[derive(Clone, Copy, PartialEq)]
enum Restart {
    Graceful,
    Kill,
}

struct Coordinator {
    server: Server,
    shared: Arc<Shared>,
    watched: Arc<Mutex<Watched>>,
    lifetimes: Vec<Lifetime>,
    restarts: Vec<(f64, Restart, f64)>,
    failures: Vec<String>,
}

/// The LMDB data file's length and the disk it occupies, in MiB (it may be sparse).
fn data_file_mib(dir: &std::path::Path) -> (f64, f64) {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir.join("data.mdb")).map_or((0.0, 0.0), |m| {
        (
            m.len() as f64 / MIB as f64,
            (m.blocks() * 512) as f64 / MIB as f64,
        )
    })
}

impl Coordinator {
    fn restart(&mut self, how: Restart) {
        let at = self.shared.start.elapsed().as_secs_f64();
        self.shared.kinds.lock().expect("lock").push(how);
        self.watched.lock().expect("lock").pid = 0;
        self.shared.up.store(false, SeqCst);
        let t0 = Instant::now();
        match how {
            Restart::Graceful => match self.server.terminate() {
                Some(st) if st.success() => {}
                Some(st) => self.failures.push(format!(
                    "graceful stop at {at:.1}s exited with {st}; stderr:\n{}",
                    self.server.stderr_tail(2000)
                )),
                None => self.failures.push(format!(
                    "graceful stop at {at:.1}s: the server ignored SIGTERM for 10 s and was killed"
                )),
            },
            Restart::Kill => self.server.kill9(),
        }
        self.server.relaunch();
        let down = t0.elapsed().as_secs_f64();
        let now = self.shared.start.elapsed().as_secs_f64();
        let last = self.lifetimes.last_mut().expect("a lifetime");
        last.end = now;
        last.ended_by = match how {
            Restart::Graceful => "graceful",
            Restart::Kill => "kill -9",
        };
        self.lifetimes.push(Lifetime {
            start: now,
            end: now,
            ended_by: "end of test",
            final_check: false,
        });
        {
            let mut w = self.watched.lock().expect("lock");
            w.pid = self.server.pid().expect("relaunched server has a pid");
            w.lifetime = self.lifetimes.len() - 1;
            w.since = Instant::now();
        }
        self.shared.epoch.fetch_add(1, SeqCst);
        self.shared.up.store(true, SeqCst);
        self.restarts.push((at, how, down));
        let (len, disk) = data_file_mib(self.server.data_dir());
        println!(
            "[{at:6.1}s] restart {} ({}): down {down:.2}s; data.mdb {len:.1} MiB ({disk:.1} MiB \
             on disk)",
            self.restarts.len(),
            last_kind(how)
        );
    }
}

fn last_kind(how: Restart) -> &'static str {
    match how {
        Restart::Graceful => "graceful SIGTERM",
        Restart::Kill => "kill -9",
    }
}

/// The n-th restart (1-based) alternates: graceful, kill -9, graceful, ...
fn restart_kind(n: usize) -> Restart {
    if n.is_multiple_of(2) {
        Restart::Kill
    } else {
        Restart::Graceful
    }
}

type Handle = thread::JoinHandle<(Worker, Result<(), String>)>;

fn join_all(handles: Vec<Handle>, workers: &mut Vec<Worker>, mismatches: &mut Vec<String>) {
    for h in handles {
        match h.join() {
            Ok((w, r)) => {
                if let Err(e) = r
                    && !e.is_empty()
                {
                    mismatches.push(e);
                }
                workers.push(w);
            }
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

#[test]
fn soak_mixed_load_with_restarts() {
    let cfg = Config::from_env();
    println!(
        "soak: {} s of load, restart every {} s, {} client threads ({} keys each, {} with TTLs), \
         seed {} (MEMKEEP_SOAK_SEED to repeat), --sync always",
        cfg.secs, cfg.restart_every, cfg.threads, KEYS_PER_THREAD, VOLATILE_KEYS, cfg.seed
    );
    let server = Server::start_with(
        BIN,
        Options {
            // RESP APPEND stops at proto_max_bulk_len, memcached append at -I: the model holds
            // both to MAX_ITEM.
            args: vec![
                "--sync".into(),
                "always".into(),
                "--proto-max-bulk-len".into(),
                "1m".into(),
            ],
            resp: true,
            ..Options::default()
        },
    );
    let shared = Arc::new(Shared {
        mc_addr: server.addr(),
        resp_addr: server.resp_addr().expect("RESP port"),
        up: AtomicBool::new(true),
        epoch: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        kinds: Mutex::new(Vec::new()),
        start: Instant::now(),
        seed: cfg.seed,
        mc_ops: AtomicU64::new(0),
        resp_ops: AtomicU64::new(0),
        verified: AtomicU64::new(0),
    });
    let watched = Arc::new(Mutex::new(Watched {
        pid: server.pid().expect("server pid"),
        lifetime: 0,
        since: Instant::now(),
    }));
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (watched, samples, stop, shared) = (
            watched.clone(),
            samples.clone(),
            sampler_stop.clone(),
            shared.clone(),
        );
        thread::spawn(move || {
            while !stop.load(SeqCst) {
                let (pid, lifetime, since) = {
                    let w = watched.lock().expect("lock");
                    (w.pid, w.lifetime, w.since)
                };
                if pid != 0
                    && let Some((rss_kb, anon_kb, file_kb)) = proc_memory(pid)
                {
                    samples.lock().expect("lock").push(Sample {
                        at: shared.start.elapsed().as_secs_f64(),
                        lifetime,
                        age: since.elapsed().as_secs_f64(),
                        rss_kb,
                        anon_kb,
                        file_kb,
                    });
                }
                thread::sleep(SAMPLE_EVERY);
            }
        })
    };

    let spawn = |mut w: Worker, final_phase: bool| {
        let shared = w.shared.clone();
        thread::Builder::new()
            .name(format!("soak-{}", w.id))
            .spawn(move || {
                let r = if final_phase {
                    w.final_check()
                } else {
                    w.run()
                };
                if r.is_err() {
                    shared.failed.store(true, SeqCst);
                }
                (w, r)
            })
            .expect("spawn a client thread")
    };
    let handles: Vec<_> = (0..cfg.threads)
        .map(|i| spawn(Worker::new(i, shared.clone()), false))
        .collect();

    let mut co = Coordinator {
        server,
        shared: shared.clone(),
        watched,
        lifetimes: vec![Lifetime {
            start: 0.0,
            end: 0.0,
            ended_by: "end of test",
            final_check: false,
        }],
        restarts: Vec::new(),
        failures: Vec::new(),
    };
    let progress_every = (cfg.secs / 30).max(5) as f64;
    let mut next_progress = progress_every;
    let mut next_restart = cfg.restart_every as f64;
    loop {
        let el = shared.start.elapsed().as_secs_f64();
        if shared.failed.load(SeqCst) || el >= cfg.secs as f64 {
            break;
        }
        if el >= next_restart {
            co.restart(restart_kind(co.restarts.len() + 1));
            next_restart += cfg.restart_every as f64;
        }
        if el >= next_progress {
            let last = samples.lock().expect("lock").last().copied();
            println!(
                "[{el:6.1}s] ops: memcached {} RESP {}; reads verified {}; server {}",
                shared.mc_ops.load(SeqCst),
                shared.resp_ops.load(SeqCst),
                shared.verified.load(SeqCst),
                last.map_or("-".into(), |s| format!(
                    "L{} RSS {:.1} MiB (anon {:.1}, file {:.1})",
                    s.lifetime,
                    mb(s.rss_kb),
                    mb(s.anon_kb),
                    mb(s.file_kb)
                ))
            );
            next_progress += progress_every;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let load_secs = shared.start.elapsed().as_secs_f64();
    shared.stop.store(true, SeqCst);

    let mut mismatches = Vec::new();
    let mut workers = Vec::new();
    let mut stats = Stats::default();
    join_all(handles, &mut workers, &mut mismatches);

    // One more restart with the load stopped, then every thread reads all its keys back.
    if mismatches.is_empty() {
        co.restart(restart_kind(co.restarts.len() + 1));
        co.lifetimes.last_mut().expect("lifetime").final_check = true;
        let handles: Vec<_> = workers.drain(..).map(|w| spawn(w, true)).collect();
        join_all(handles, &mut workers, &mut mismatches);
    }
    let total_secs = shared.start.elapsed().as_secs_f64();
    co.lifetimes.last_mut().expect("lifetime").end = total_secs;
    sampler_stop.store(true, SeqCst);
    sampler.join().expect("sampler thread");
    match co.server.terminate() {
        Some(st) if st.success() => {}
        other => co.failures.push(format!(
            "final graceful stop: {other:?}; stderr:\n{}",
            co.server.stderr_tail(2000)
        )),
    }
    let stderr = co.server.stderr();
    if stderr.contains("panicked") {
        co.failures.push(format!(
            "the server logged a panic:\n{}",
            co.server.stderr_tail(4000)
        ));
    }

    for w in &workers {
        stats.add(&w.st);
    }
    let ambiguous: usize = workers
        .iter()
        .map(|w| w.keys.iter().filter(|k| k.cands.len() > 1).count())
        .sum();
    let live_keys: usize = workers
        .iter()
        .map(|w| w.keys.iter().filter(|k| k.cands[0].is_some()).count())
        .sum();
    let kinds = |kind: Kind| -> usize {
        workers
            .iter()
            .map(|w| {
                w.keys
                    .iter()
                    .filter(|k| k.cands[0].as_ref().is_some_and(|e| e.val.kind() == kind))
                    .count()
            })
            .sum()
    };
    let samples = samples.lock().expect("lock").clone();
    println!("\n==== soak summary (seed {}) ====", cfg.seed);
    println!(
        "load {load_secs:.1}s, whole run {total_secs:.1}s; {} client threads",
        cfg.threads
    );
    println!(
        "requests: memcached {}, RESP {} ({:.0}/s overall)",
        stats.mc_ops,
        stats.resp_ops,
        (stats.mc_ops + stats.resp_ops) as f64 / total_secs
    );
    println!(
        "verified replies: reads {}, writes {}; expired keys seen gone {}; CAS uniques checked {}",
        stats.reads_verified, stats.writes_verified, stats.expiries_seen, stats.cas_learned
    );
    println!(
        "restarts: {} ({} graceful, {} kill -9); replies lost to restarts {}; full read-backs {} \
         ({} key reads)",
        co.restarts.len(),
        co.restarts
            .iter()
            .filter(|r| r.1 == Restart::Graceful)
            .count(),
        co.restarts.iter().filter(|r| r.1 == Restart::Kill).count(),
        stats.lost_replies,
        stats.sweeps,
        stats.keys_swept
    );
    let lo = &stats.lost_outcome;
    println!(
        "  lost replies were: graceful stop: {} applied, {} not applied, {} undecidable (reads, \
         or expired meanwhile); kill -9: {} applied, {} not applied, {} undecidable",
        lo[0][0], lo[0][1], lo[0][2], lo[1][0], lo[1][1], lo[1][2]
    );
    for (at, how, down) in &co.restarts {
        println!("  at {at:6.1}s {:<17} down {down:.2}s", last_kind(*how));
    }
    println!(
        "keys at the end: {live_keys} live (strings {}, lists {}, hashes {}, sets {}, zsets {}); \
         {ambiguous} still with more than one candidate state",
        kinds(Kind::Str),
        kinds(Kind::List),
        kinds(Kind::Hash),
        kinds(Kind::Set),
        kinds(Kind::Zset)
    );
    let series_every = (total_secs / 30.0).max(5.0);
    println!("memory over time (every {series_every:.0}s):");
    let mut next = 0.0;
    for s in &samples {
        if s.at >= next {
            println!(
                "  {:6.1}s L{:<2} RSS {:7.1} MiB  RssAnon {:7.1} MiB  RssFile {:7.1} MiB",
                s.at,
                s.lifetime,
                mb(s.rss_kb),
                mb(s.anon_kb),
                mb(s.file_kb)
            );
            next = s.at + series_every;
        }
    }
    co.failures.extend(memory_report(&samples, &co.lifetimes));
    for w in &workers {
        for g in &w.graceful_applied_unanswered {
            co.failures.push(format!(
                "a graceful stop applied a write but closed the connection without its reply: {g}"
            ));
        }
    }

    assert!(
        mismatches.is_empty(),
        "{} client thread(s) failed (seed {}):\n{}",
        mismatches.len(),
        cfg.seed,
        mismatches.join("\n")
    );
    assert!(
        co.failures.is_empty(),
        "soak failures (seed {}):\n{}",
        cfg.seed,
        co.failures.join("\n")
    );
    // The run did what it claims: restarts happened, reads were checked, TTLs ran out.
    assert!(co.restarts.len() >= 2, "fewer than two restarts");
    assert!(
        stats.sweeps as usize >= cfg.threads * 2,
        "only {} full read-backs by {} threads",
        stats.sweeps,
        cfg.threads
    );
    assert!(
        stats.reads_verified > 1000,
        "only {} reads verified",
        stats.reads_verified
    );
    assert!(stats.expiries_seen > 0, "no key was seen to expire");
    assert!(stats.mc_ops > 0 && stats.resp_ops > 0);
    assert!(samples.len() >= 4, "too few memory samples");
}
