//! memkeep-bench: a closed-loop load generator that speaks the memcached text protocol and
//! Redis RESP, so one tool measures memkeep, memcached and redis-server side by side.
//!
//! Model: keys `1..=N` are split across C connections (connection i, counted from 0, does keys
//! i+1, i+1+C, ...). Each connection is one thread with a blocking `TcpStream` (TCP_NODELAY)
//! that writes `--pipeline` requests in one `write`, then reads exactly that many replies, and
//! repeats. Values are a pure function of the key (length and bytes, and the memcached flags),
//! so every GET is checked byte for byte without keeping anything in memory.
//!
//! `--order random` visits the keys of the set and get phases in a pseudo-random permutation
//! (a Feistel network, so still every key exactly once and nothing stored per key). The `mixed`
//! phase makes `--requests` requests on keys drawn with replacement (`--key-dist uniform` or
//! `zipf`), each a GET with probability `--get-fraction` and otherwise a SET of the key's
//! value, so GETs stay verifiable; its JSON splits gets/sets/hits and their latencies
//! (`--set-on-miss` makes it a cache-aside client that SETs each key whose GET missed). With
//! `--duration-limit` a phase ends at the deadline and reports the rate over what it did; the
//! sequential set phase then tells, as `prefix_done`, the K such that keys 1..=K all got a
//! reply, for a following get phase to use as `--keys`.
//!
//! With `--protocol resp`, `--multi N` makes the set phase send its SETs as transactions
//! (`MULTI`, N `SET`s, `EXEC`, in one write; `--pipeline` transactions per batch), checking
//! every reply of each. The `queue` phase is a durable-queue load: `--connections` producers
//! LPUSH messages 1..=N onto `--queue-key` while `--consumers` consumers BRPOP them (0.1 s
//! timeout, looping until every acknowledged message is delivered); each message carries its
//! id, its send time and the key's value bytes, so every delivery is checked intact and new.
//! Its rate is distinct messages delivered per second, its latency (p50/p99) the end-to-end
//! time from the LPUSH being written to the BRPOP reply being read (`set_*` latencies are the
//! pushes' round trips, `get_*` the pops'), `misses` the acknowledged messages never delivered
//! and `duplicates` those delivered twice: either fails the run. Under `--duration-limit` the
//! producers stop at the deadline and the consumers then drain what was acknowledged.
//!
//! Latency: for each request, the time from the moment its batch starts being written to the
//! moment its reply has been completely read and parsed. With `--pipeline 1` that is the plain
//! round trip; with deeper pipelines, later requests of a batch include the time the server
//! spent on the earlier ones (which is what a pipelining client sees). Values go into a
//! log-bucketed histogram with 64 linear sub-buckets per power of two (relative error below
//! 1.6%), so percentiles cost no memory per sample and merge exactly across threads.
//!
//! Counting: an op is a request whose reply was read. A GET that finds nothing is a *miss*
//! (reported, not fatal); a GET whose value has the wrong length, bytes, key or flags is a
//! *mismatch*; an error reply (`-ERR`, `SERVER_ERROR`, `NOT_STORED`, ...) or an unexpected reply
//! type is an *error* and the connection goes on; a broken connection, a timeout or an
//! unparseable reply is an *error* that ends that connection (the stream cannot be resynced).
//!
//! Exit codes: 0 all phases clean, 1 some phase had mismatches or errors, 2 bad arguments or a
//! server that cannot be reached.

use std::fmt::Write as _;
use std::io::{self, IsTerminal, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};

/// `println!` that ignores a closed stdout (e.g. piped into `head`) instead of panicking.
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(io::stdout(), $($t)*);
    }};
}

/// `eprintln!` that ignores a closed stderr.
macro_rules! say_err {
    ($($t:tt)*) => {{
        let _ = writeln!(io::stderr(), $($t)*);
    }};
}

/// The wire protocol spoken to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Protocol {
    /// memcached text protocol (`set`/`get`)
    Memcache,
    /// Redis RESP (`SET`/`GET`)
    Resp,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Memcache => "memcache",
            Protocol::Resp => "resp",
        }
    }
}

/// One phase of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Phase {
    /// store every key's value (once each, in --order)
    Set,
    /// read every key back once (in --order) and verify it
    Get,
    /// --requests requests on keys drawn from --key-dist: GETs (verified) with probability
    /// --get-fraction, SETs of the key's value otherwise
    Mixed,
    /// a queue (RESP only): --connections producers LPUSH messages 1..=N (--keys) onto
    /// --queue-key, --consumers consumers BRPOP them; every message checked delivered exactly
    /// once and intact
    Queue,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Set => "set",
            Phase::Get => "get",
            Phase::Mixed => "mixed",
            Phase::Queue => "queue",
        }
    }
}

/// The kind of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Set,
    Get,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Set => "set",
            Op::Get => "get",
        }
    }
}

/// The order in which the set and get phases visit keys 1..=N.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Order {
    /// 1, 2, 3, ... (connection i, counted from 0, does the (i+1)-th, (i+1+C)-th, ... key)
    Sequential,
    /// a pseudo-random permutation of 1..=N fixed by --seed: every key still exactly once
    Random,
}

impl Order {
    fn name(self) -> &'static str {
        match self {
            Order::Sequential => "sequential",
            Order::Random => "random",
        }
    }
}

/// How the mixed phase picks each request's key (with replacement).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum KeyDist {
    /// every key of 1..=N equally likely
    Uniform,
    /// key of rank k has weight 1/k^s (s = --zipf-exponent); ranks are scattered over 1..=N by
    /// the --seed permutation, so the hot keys are not just the first ones written
    Zipf,
}

impl KeyDist {
    fn name(self) -> &'static str {
        match self {
            KeyDist::Uniform => "uniform",
            KeyDist::Zipf => "zipf",
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "memkeep-bench",
    version,
    about = "Load generator for memkeep, memcached and redis-server (memcached text protocol or RESP)",
    after_help = "Latency is per request: from the start of writing the request's pipeline batch \
                  to its reply being fully parsed.\nExit codes: 0 clean, 1 mismatches or errors \
                  in some phase, 2 bad arguments or server unreachable."
)]
struct Args {
    /// Server host name or address
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Server port [default: 11211 for memcache, 6379 for resp]
    #[arg(long)]
    port: Option<u16>,
    /// Wire protocol
    #[arg(long, value_enum, default_value_t = Protocol::Memcache)]
    protocol: Protocol,
    /// Concurrent connections, one thread each
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    connections: u64,
    /// Number of keys (1..=N)
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Value size in bytes (the lower bound when --value-size-max is given)
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// Upper bound of value sizes: each key's size is drawn uniformly in
    /// [value-size, value-size-max], deterministically from the key
    #[arg(long)]
    value_size_max: Option<usize>,
    /// Pad keys to at least this length (deterministic per key); default keys are "1".."N"
    #[arg(long)]
    key_size_min: Option<usize>,
    /// Pad keys to at most this length (deterministic per key)
    #[arg(long)]
    key_size_max: Option<usize>,
    /// Requests written per batch before reading their replies
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pipeline: u64,
    /// Phases to run, in order (comma-separated)
    #[arg(long, value_enum, value_delimiter = ',', default_value = "set,get")]
    phases: Vec<Phase>,
    /// Print one JSON object per phase on stdout instead of the human-readable lines
    #[arg(long)]
    json: bool,
    /// Order of the keys in the set and get phases
    #[arg(long, value_enum, default_value_t = Order::Sequential)]
    order: Order,
    /// Requests of the mixed phase [default: --keys]
    #[arg(long)]
    requests: Option<u64>,
    /// Share of GETs in the mixed phase (the rest are SETs), 0..=1
    #[arg(long, default_value_t = 0.9)]
    get_fraction: f64,
    /// Key distribution of the mixed phase
    #[arg(long, value_enum, default_value_t = KeyDist::Uniform)]
    key_dist: KeyDist,
    /// Exponent s of --key-dist zipf (weight of rank k is 1/k^s), > 0
    #[arg(long, default_value_t = 0.99)]
    zipf_exponent: f64,
    /// Seed of the random order, the key draws and the GET/SET choice of the mixed phase
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Mixed phase as a cache-aside client: a GET that misses is followed by a SET of that key
    /// (counted in `sets`, not in --requests)
    #[arg(long)]
    set_on_miss: bool,
    /// Stop each phase after this many seconds (a safety cap; the phase is then reported as
    /// incomplete, which alone does not fail the run)
    #[arg(long, value_name = "SECS")]
    duration_limit: Option<f64>,
    /// Socket connect/read/write timeout; a timeout is an error that ends the connection
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    timeout: f64,
    /// RESP only: the set phase sends its SETs as transactions of N (MULTI, N SETs, EXEC; a
    /// connection's last one may be shorter). --pipeline then counts transactions, latency is
    /// per transaction, and every reply of each is checked (+OK, +QUEUED, EXEC's +OKs)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    multi: Option<u64>,
    /// The queue phase's consumers, one connection each (--connections are its producers)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    consumers: u64,
    /// The list the queue phase uses (deleted when the phase starts)
    #[arg(long, default_value = "memkeep-bench:queue")]
    queue_key: String,
}

/// Longest key the memcached text protocol allows.
const MEMCACHE_MAX_KEY: usize = 250;
/// Number of distinct start offsets into the value pattern.
const PATTERN_OFFSETS: usize = 4096;

// ---------------------------------------------------------------------------------------------
// Deterministic keys and values
// ---------------------------------------------------------------------------------------------

/// splitmix64: a cheap, well-mixed hash of the key number.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

const SALT_KEY_LEN: u64 = 0x6b65_796c_656e;
const SALT_VALUE_LEN: u64 = 0x7661_6c6c_656e;
const SALT_VALUE_OFF: u64 = 0x7661_6c6f_6666;
const SALT_FLAGS: u64 = 0x666c_6167_7300;

/// Which keys exist and what each key's value is; pure functions of the key number.
struct Workload {
    keys: u64,
    key_len: Option<(usize, usize)>,
    value_min: usize,
    value_max: usize,
    /// Pseudo-random bytes (all 256 values, CR and LF included) that values are cut from.
    pattern: Vec<u8>,
}

impl Workload {
    fn new(keys: u64, key_len: Option<(usize, usize)>, value_min: usize, value_max: usize) -> Self {
        let mut pattern = Vec::with_capacity(value_max + PATTERN_OFFSETS);
        let mut s: u64 = 0x2545_F491_4F6C_DD1D;
        while pattern.len() < value_max + PATTERN_OFFSETS {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            pattern.extend_from_slice(&s.to_le_bytes());
        }
        pattern.truncate(value_max + PATTERN_OFFSETS);
        Workload {
            keys,
            key_len,
            value_min,
            value_max,
            pattern,
        }
    }

    /// Key `id` as bytes: its decimal form, padded with `-` and letters when a key length
    /// range is set. The decimal prefix ends at the first `-`, so keys stay unique.
    fn key(&self, id: u64, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
        if let Some((lo, hi)) = self.key_len {
            let want = lo + (mix(id ^ SALT_KEY_LEN) % (hi - lo + 1) as u64) as usize;
            if want > out.len() {
                out.push(b'-');
                let mut h = mix(id);
                while out.len() < want {
                    out.push(b'a' + (h % 26) as u8);
                    h = (h / 26) ^ (h << 59);
                    if h == 0 {
                        h = mix(id.wrapping_add(out.len() as u64));
                    }
                }
            }
        }
    }

    fn value_len(&self, id: u64) -> usize {
        if self.value_max == self.value_min {
            self.value_min
        } else {
            let span = (self.value_max - self.value_min + 1) as u64;
            self.value_min + (mix(id ^ SALT_VALUE_LEN) % span) as usize
        }
    }

    fn flags(&self, id: u64) -> u32 {
        (mix(id ^ SALT_FLAGS) >> 32) as u32
    }

    /// Key `id`'s value: `"<id>:"` followed by pattern bytes from a key-dependent offset, cut to
    /// the key's length. The tag makes a value served for the wrong key of the same length
    /// differ even when the offsets collide.
    fn value(&self, id: u64, out: &mut Vec<u8>) {
        out.clear();
        let len = self.value_len(id);
        let mut tag = itoa::Buffer::new();
        let tag = tag.format(id).as_bytes();
        let head = tag.len().min(len);
        out.extend_from_slice(&tag[..head]);
        if out.len() < len {
            out.push(b':');
        }
        let off = (mix(id ^ SALT_VALUE_OFF) % PATTERN_OFFSETS as u64) as usize;
        let rest = len - out.len();
        out.extend_from_slice(&self.pattern[off..off + rest]);
    }
}

// ---------------------------------------------------------------------------------------------
// Key orders and key draws
// ---------------------------------------------------------------------------------------------

/// A pseudo-random permutation of 0..n: a 4-round Feistel network on the smallest even number
/// of bits that covers n, cycle-walked until the result falls below n (each walk step stays a
/// bijection of the larger domain, so the composite is a bijection of 0..n). The domain is at
/// most 4n, so a walk takes under 4 steps on average. Nothing is stored per key.
struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    fn new(n: u64, seed: u64) -> Self {
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let half_bits = bits.div_ceil(2);
        let mut keys = [0; 4];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = mix(seed ^ (0x7065_726d_0000 + i as u64));
        }
        Permutation { n, half_bits, keys }
    }

    fn round(&self, x: u64) -> u64 {
        let half_mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & half_mask);
        for k in self.keys {
            let f = mix(r ^ k) & half_mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half_bits) | r
    }

    /// The image of `i` (< n).
    fn at(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = self.round(i);
        while x >= self.n {
            x = self.round(x);
        }
        x
    }
}

/// splitmix64 as a stream: small, fast, and good enough for picking keys.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Self {
        Rng(mix(seed ^ mix(stream ^ 0x7374_7265_616d)))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in 0..n (n > 0); the bias of the multiply-shift is below n / 2^64.
    fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Zipf ranks 1..=n with P(k) proportional to k^-s, by rejection-inversion (Hörmann and
/// Derflinger, "Rejection-inversion to generate variates from monotone discrete
/// distributions", 1996): invert the integral H of the continuous hat x^-s, round to the
/// nearest rank, and accept unless the point falls outside the rank's own bar. O(1) memory and
/// time per draw for any n; s = 1 is handled by the limits of the helpers below.
struct Zipf {
    n: f64,
    s: f64,
    h_x1: f64,
    h_n: f64,
    squeeze: f64,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Self {
        let mut z = Zipf {
            n: n as f64,
            s,
            h_x1: 0.0,
            h_n: 0.0,
            squeeze: 0.0,
        };
        z.h_x1 = z.big_h(1.5) - 1.0;
        z.h_n = z.big_h(z.n + 0.5);
        z.squeeze = 2.0 - z.big_h_inv(z.big_h(2.5) - z.h(2.0));
        z
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// An antiderivative of h: (x^(1-s) - 1) / (1-s), and ln x at s = 1.
    fn big_h(&self, x: f64) -> f64 {
        let lx = x.ln();
        expm1_over((1.0 - self.s) * lx) * lx
    }

    fn big_h_inv(&self, y: f64) -> f64 {
        let t = (y * (1.0 - self.s)).max(-1.0);
        (ln1p_over(t) * y).exp()
    }

    fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_n + rng.unit() * (self.h_x1 - self.h_n);
            let x = self.big_h_inv(u);
            let k = x.round().clamp(1.0, self.n);
            if k - x <= self.squeeze || u >= self.big_h(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }
}

/// (e^y - 1) / y, continuous at 0.
fn expm1_over(y: f64) -> f64 {
    if y.abs() > 1e-8 {
        y.exp_m1() / y
    } else {
        1.0 + y / 2.0 + y * y / 6.0
    }
}

/// ln(1 + t) / t, continuous at 0.
fn ln1p_over(t: f64) -> f64 {
    if t.abs() > 1e-8 {
        t.ln_1p() / t
    } else {
        1.0 - t / 2.0 + t * t / 3.0
    }
}

/// Where one connection's requests come from.
enum KeySource {
    /// Positions idx, idx+C, ... < keys of the key sequence (in order, or through the
    /// permutation), all of one kind.
    Pass {
        op: Op,
        next: u64,
        step: u64,
        keys: u64,
        perm: Option<Arc<Permutation>>,
    },
    /// `left` draws of (GET or SET, key).
    Draws {
        left: u64,
        rng: Rng,
        get_fraction: f64,
        keys: u64,
        zipf: Option<Arc<Zipf>>,
        perm: Arc<Permutation>,
    },
}

impl KeySource {
    /// The next request, or None when this connection's share is done.
    fn next(&mut self) -> Option<(Op, u64)> {
        match self {
            KeySource::Pass {
                op,
                next,
                step,
                keys,
                perm,
            } => {
                if *next >= *keys {
                    return None;
                }
                let pos = *next;
                *next = next.saturating_add(*step);
                let id = perm.as_ref().map_or(pos, |p| p.at(pos)) + 1;
                Some((*op, id))
            }
            KeySource::Draws {
                left,
                rng,
                get_fraction,
                keys,
                zipf,
                perm,
            } => {
                if *left == 0 || *keys == 0 {
                    return None;
                }
                *left -= 1;
                let op = if rng.unit() < *get_fraction {
                    Op::Get
                } else {
                    Op::Set
                };
                let id = match zipf {
                    Some(z) => perm.at(z.sample(rng) - 1) + 1,
                    None => rng.below(*keys) + 1,
                };
                Some((op, id))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Request encoding
// ---------------------------------------------------------------------------------------------

fn encode_set(proto: Protocol, key: &[u8], flags: u32, value: &[u8], out: &mut Vec<u8>) {
    let mut n = itoa::Buffer::new();
    match proto {
        Protocol::Memcache => {
            out.extend_from_slice(b"set ");
            out.extend_from_slice(key);
            out.push(b' ');
            out.extend_from_slice(n.format(flags).as_bytes());
            out.extend_from_slice(b" 0 ");
            out.extend_from_slice(n.format(value.len()).as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        Protocol::Resp => {
            out.extend_from_slice(b"*3\r\n$3\r\nSET\r\n");
            resp_bulk(key, out);
            resp_bulk(value, out);
        }
    }
}

fn encode_get(proto: Protocol, key: &[u8], out: &mut Vec<u8>) {
    match proto {
        Protocol::Memcache => {
            out.extend_from_slice(b"get ");
            out.extend_from_slice(key);
            out.extend_from_slice(b"\r\n");
        }
        Protocol::Resp => {
            out.extend_from_slice(b"*2\r\n$3\r\nGET\r\n");
            resp_bulk(key, out);
        }
    }
}

fn resp_bulk(data: &[u8], out: &mut Vec<u8>) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(data.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

// ---------------------------------------------------------------------------------------------
// Reply parsing: pure functions over a byte slice. `Ok(None)` means "need more bytes".
// ---------------------------------------------------------------------------------------------

/// A reply, with byte ranges into the slice that was parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    /// `STORED` or `+OK`.
    Stored,
    /// A value: memcached `VALUE <key> <flags> <bytes>` (key and flags set) or a RESP bulk.
    Value {
        key: Option<Range<usize>>,
        flags: Option<u32>,
        data: Range<usize>,
    },
    /// memcached `END` with no value, RESP `$-1` (or `*-1`, `_`).
    Miss,
    /// An error reply or a reply of the wrong kind; the stream is still in sync.
    Error(String),
}

/// The reply stream cannot be understood any more; the connection has to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProtoError(String);

/// Longest header line accepted before the stream is declared garbage.
const MAX_LINE: usize = 64 * 1024;
/// Largest value accepted in a reply.
const MAX_VALUE: usize = 1 << 30;

/// Finds the `\r\n`-terminated line starting at `pos`; returns (line without CRLF, end).
fn line_at(buf: &[u8], pos: usize) -> Result<Option<(&[u8], usize)>, ProtoError> {
    let rest = &buf[pos..];
    match memchr::memchr(b'\n', rest) {
        Some(i) => {
            if i == 0 || rest[i - 1] != b'\r' {
                return Err(ProtoError(format!(
                    "line not ended by CRLF: {}",
                    printable(&rest[..i])
                )));
            }
            Ok(Some((&rest[..i - 1], pos + i + 1)))
        }
        None if rest.len() > MAX_LINE => Err(ProtoError(format!(
            "no line end within {MAX_LINE} bytes: {}",
            printable(&rest[..80])
        ))),
        None => Ok(None),
    }
}

/// A short, printable rendering of protocol bytes for messages.
fn printable(b: &[u8]) -> String {
    let mut s = String::new();
    for &c in b.iter().take(120) {
        if (0x20..0x7f).contains(&c) {
            s.push(c as char);
        } else {
            let _ = write!(s, "\\x{c:02x}");
        }
    }
    if b.len() > 120 {
        s.push_str("...");
    }
    s
}

fn is_memcache_error_line(line: &[u8]) -> bool {
    line == b"ERROR"
        || line.starts_with(b"ERROR ")
        || line.starts_with(b"CLIENT_ERROR")
        || line.starts_with(b"SERVER_ERROR")
}

/// Parses the reply to one memcached `set`.
fn parse_memcache_store(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtoError> {
    let Some((line, end)) = line_at(buf, 0)? else {
        return Ok(None);
    };
    let reply = if line == b"STORED" {
        Reply::Stored
    } else if line.starts_with(b"VALUE ") || line == b"END" {
        return Err(ProtoError(format!(
            "unexpected reply to set: {}",
            printable(line)
        )));
    } else {
        // NOT_STORED, EXISTS, NOT_FOUND, ERROR, CLIENT_ERROR ..., SERVER_ERROR ...
        Reply::Error(printable(line))
    };
    Ok(Some((reply, end)))
}

/// Parses the reply to one single-key memcached `get`.
fn parse_memcache_get(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtoError> {
    let Some((line, end)) = line_at(buf, 0)? else {
        return Ok(None);
    };
    if line == b"END" {
        return Ok(Some((Reply::Miss, end)));
    }
    if is_memcache_error_line(line) {
        return Ok(Some((Reply::Error(printable(line)), end)));
    }
    let Some(rest) = line.strip_prefix(b"VALUE ") else {
        return Err(ProtoError(format!(
            "unexpected reply to get: {}",
            printable(line)
        )));
    };
    // VALUE <key> <flags> <bytes> [<cas>]
    let mut fields = rest.split(|&c| c == b' ');
    let bad = || ProtoError(format!("malformed VALUE line: {}", printable(line)));
    let key = fields.next().filter(|k| !k.is_empty()).ok_or_else(bad)?;
    let flags: u32 = fields.next().and_then(parse_num).ok_or_else(bad)?;
    let bytes: usize = fields.next().and_then(parse_num).ok_or_else(bad)?;
    if let Some(cas) = fields.next() {
        parse_num::<u64>(cas).ok_or_else(bad)?;
    }
    if fields.next().is_some() || bytes > MAX_VALUE {
        return Err(bad());
    }
    let key_start = "VALUE ".len();
    let key_range = key_start..key_start + key.len();
    let data = end..end + bytes;
    if buf.len() < data.end + 2 {
        return Ok(None);
    }
    if &buf[data.end..data.end + 2] != b"\r\n" {
        return Err(ProtoError(format!(
            "value of {bytes} bytes not followed by CRLF"
        )));
    }
    let Some((tail, end)) = line_at(buf, data.end + 2)? else {
        return Ok(None);
    };
    if tail != b"END" {
        return Err(ProtoError(format!(
            "expected END after a value, got: {}",
            printable(tail)
        )));
    }
    Ok(Some((
        Reply::Value {
            key: Some(key_range),
            flags: Some(flags),
            data,
        },
        end,
    )))
}

fn parse_num<T: std::str::FromStr>(b: &[u8]) -> Option<T> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// One RESP value as far as this tool cares.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resp {
    Simple(Range<usize>),
    Error(Range<usize>),
    Integer(i64),
    Bulk(Range<usize>),
    Nil,
    Array(usize),
}

/// Parses one complete RESP2 value (arrays included, recursively) at `pos`.
fn parse_resp_value(
    buf: &[u8],
    pos: usize,
    depth: u32,
) -> Result<Option<(Resp, usize)>, ProtoError> {
    let Some((line, end)) = line_at(buf, pos)? else {
        return Ok(None);
    };
    let Some((&kind, body)) = line.split_first() else {
        return Err(ProtoError("empty RESP line".into()));
    };
    let body_range = pos + 1..pos + 1 + body.len();
    let int = |b: &[u8]| -> Result<i64, ProtoError> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ProtoError(format!("bad RESP length/integer: {}", printable(line))))
    };
    match kind {
        b'+' => Ok(Some((Resp::Simple(body_range), end))),
        b'-' => Ok(Some((Resp::Error(body_range), end))),
        b':' => Ok(Some((Resp::Integer(int(body)?), end))),
        b'_' => Ok(Some((Resp::Nil, end))),
        b'$' => {
            let n = int(body)?;
            if n < 0 {
                return Ok(Some((Resp::Nil, end)));
            }
            let n = n as usize;
            if n > MAX_VALUE {
                return Err(ProtoError(format!("bulk of {n} bytes is too large")));
            }
            if buf.len() < end + n + 2 {
                return Ok(None);
            }
            if &buf[end + n..end + n + 2] != b"\r\n" {
                return Err(ProtoError(format!(
                    "bulk of {n} bytes not followed by CRLF"
                )));
            }
            Ok(Some((Resp::Bulk(end..end + n), end + n + 2)))
        }
        b'*' => {
            let n = int(body)?;
            if n < 0 {
                return Ok(Some((Resp::Nil, end)));
            }
            if depth > 32 {
                return Err(ProtoError("RESP arrays nested too deep".into()));
            }
            let mut at = end;
            for _ in 0..n {
                match parse_resp_value(buf, at, depth + 1)? {
                    Some((_, next)) => at = next,
                    None => return Ok(None),
                }
            }
            Ok(Some((Resp::Array(n as usize), at)))
        }
        _ => Err(ProtoError(format!(
            "unknown RESP type byte: {}",
            printable(line)
        ))),
    }
}

/// Parses the reply to one RESP `SET`.
fn parse_resp_store(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtoError> {
    let Some((v, end)) = parse_resp_value(buf, 0, 0)? else {
        return Ok(None);
    };
    let reply = match v {
        Resp::Simple(r) if &buf[r.clone()] == b"OK" => Reply::Stored,
        Resp::Error(r) => Reply::Error(format!("-{}", printable(&buf[r]))),
        other => Reply::Error(format!(
            "unexpected reply to SET: {}",
            describe_resp(buf, &other)
        )),
    };
    Ok(Some((reply, end)))
}

/// Parses the reply to one RESP `GET`.
fn parse_resp_get(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtoError> {
    let Some((v, end)) = parse_resp_value(buf, 0, 0)? else {
        return Ok(None);
    };
    let reply = match v {
        Resp::Bulk(data) => Reply::Value {
            key: None,
            flags: None,
            data,
        },
        Resp::Nil => Reply::Miss,
        Resp::Error(r) => Reply::Error(format!("-{}", printable(&buf[r]))),
        other => Reply::Error(format!(
            "unexpected reply to GET: {}",
            describe_resp(buf, &other)
        )),
    };
    Ok(Some((reply, end)))
}

/// Parses the replies to one transaction of `k` SETs: MULTI's `+OK`, `k` times `+QUEUED`, then
/// EXEC's array of `k` `+OK`s. Anything else in any place makes the whole transaction an
/// `Error` naming the first surprise, once all of its replies have been read.
fn parse_resp_tx(buf: &[u8], k: usize) -> Result<Option<(Reply, usize)>, ProtoError> {
    let mut problem: Option<String> = None;
    let mut expect = |v: &Resp, want: &[u8], what: &str| {
        if problem.is_none() && !matches!(v, Resp::Simple(r) if &buf[r.clone()] == want) {
            problem = Some(format!("{what} answered {}", describe_resp(buf, v)));
        }
    };
    let Some((v, mut at)) = parse_resp_value(buf, 0, 0)? else {
        return Ok(None);
    };
    expect(&v, b"OK", "MULTI");
    for _ in 0..k {
        let Some((v, next)) = parse_resp_value(buf, at, 0)? else {
            return Ok(None);
        };
        expect(&v, b"QUEUED", "a SET after MULTI");
        at = next;
    }
    let Some((line, end)) = line_at(buf, at)? else {
        return Ok(None);
    };
    let count = line
        .strip_prefix(b"*")
        .and_then(|n| std::str::from_utf8(n).ok()?.parse::<i64>().ok());
    match count {
        Some(n) if n < 0 => {
            expect(&Resp::Nil, b"", "EXEC");
            at = end;
        }
        Some(n) => {
            at = end;
            for _ in 0..n {
                let Some((v, next)) = parse_resp_value(buf, at, 1)? else {
                    return Ok(None);
                };
                expect(&v, b"OK", "a SET inside EXEC");
                at = next;
            }
            if n as usize != k && problem.is_none() {
                problem = Some(format!("EXEC answered {n} replies for {k} SETs"));
            }
        }
        None => {
            let Some((v, next)) = parse_resp_value(buf, at, 0)? else {
                return Ok(None);
            };
            expect(&v, b"", "EXEC");
            at = next;
        }
    }
    Ok(Some((problem.map_or(Reply::Stored, Reply::Error), at)))
}

fn describe_resp(buf: &[u8], v: &Resp) -> String {
    match v {
        Resp::Simple(r) => format!("+{}", printable(&buf[r.clone()])),
        Resp::Error(r) => format!("-{}", printable(&buf[r.clone()])),
        Resp::Integer(i) => format!(":{i}"),
        Resp::Bulk(r) => format!("bulk of {} bytes", r.len()),
        Resp::Nil => "nil".into(),
        Resp::Array(n) => format!("array of {n}"),
    }
}

fn parse_reply(proto: Protocol, op: Op, buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtoError> {
    match (proto, op) {
        (Protocol::Memcache, Op::Set) => parse_memcache_store(buf),
        (Protocol::Memcache, Op::Get) => parse_memcache_get(buf),
        (Protocol::Resp, Op::Set) => parse_resp_store(buf),
        (Protocol::Resp, Op::Get) => parse_resp_get(buf),
    }
}

// ---------------------------------------------------------------------------------------------
// Receive buffer
// ---------------------------------------------------------------------------------------------

struct RecvBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl RecvBuf {
    fn new() -> Self {
        RecvBuf {
            buf: vec![0; 64 * 1024],
            start: 0,
            end: 0,
        }
    }

    fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads at least one more byte from `r`; a closed connection is an error.
    fn fill(&mut self, r: &mut impl Read) -> io::Result<()> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            let len = self.buf.len() * 2;
            self.buf.resize(len, 0);
        }
        loop {
            match r.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed by the server",
                    ));
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Histogram
// ---------------------------------------------------------------------------------------------

/// Log-bucketed histogram of u64 values (nanoseconds here): values below 128 have their own
/// bucket, above that each power of two is split into 64 equal sub-buckets, so any recorded
/// value is reported within 1/64 of itself. 3776 counters cover the whole u64 range.
#[derive(Clone)]
struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS as usize) * SUB as usize) + SUB as usize;

impl Histogram {
    fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < 2 * SUB {
            return v as usize;
        }
        let shift = 63 - v.leading_zeros() - SUB_BITS;
        let top = v >> shift; // in [SUB, 2*SUB)
        (shift as u64 * SUB + top) as usize
    }

    /// The highest value that lands in bucket `i`.
    fn highest(i: usize) -> u64 {
        let i = i as u64;
        if i < 2 * SUB {
            return i;
        }
        let shift = (i - SUB) / SUB;
        let top = i - shift * SUB;
        ((top + 1) << shift).wrapping_sub(1)
    }

    fn record(&mut self, v: u64) {
        self.counts[Self::index(v)] += 1;
        self.total += 1;
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    /// The value at quantile `q` (0..=1): the highest value of the bucket that holds it.
    fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::highest(i);
            }
        }
        Self::highest(BUCKETS - 1)
    }
}

// ---------------------------------------------------------------------------------------------
// One connection's work
// ---------------------------------------------------------------------------------------------

struct ConnConfig {
    proto: Protocol,
    phase: Phase,
    connections: u64,
    pipeline: u64,
    duration_limit: Option<Duration>,
    /// The set/get phases' permutation (None: sequential order).
    order: Option<Arc<Permutation>>,
    /// Mixed phase: total requests, GET share, key draws.
    requests: u64,
    get_fraction: f64,
    zipf: Option<Arc<Zipf>>,
    /// Scatters zipf ranks over the keys.
    scatter: Arc<Permutation>,
    seed: u64,
    set_on_miss: bool,
    /// SETs per MULTI/EXEC transaction (0: plain requests).
    multi: u64,
}

impl ConnConfig {
    /// A set or get phase in sequential order, or a mixed one of `keys` uniform requests.
    #[cfg(test)]
    fn plain(proto: Protocol, phase: Phase, connections: u64, pipeline: u64, keys: u64) -> Self {
        ConnConfig {
            proto,
            phase,
            connections,
            pipeline,
            duration_limit: None,
            order: None,
            requests: keys,
            get_fraction: 0.9,
            zipf: None,
            scatter: Arc::new(Permutation::new(keys, 1)),
            seed: 1,
            set_on_miss: false,
            multi: 0,
        }
    }

    /// Connection `idx`'s share of the phase.
    fn source(&self, idx: u64, keys: u64) -> KeySource {
        match self.phase {
            Phase::Set | Phase::Get => KeySource::Pass {
                op: if self.phase == Phase::Set {
                    Op::Set
                } else {
                    Op::Get
                },
                next: idx,
                step: self.connections,
                keys,
                perm: self.order.clone(),
            },
            Phase::Mixed | Phase::Queue => {
                let c = self.connections;
                let left = self.requests / c + u64::from(idx < self.requests % c);
                KeySource::Draws {
                    left,
                    rng: Rng::new(self.seed, idx),
                    get_fraction: self.get_fraction,
                    keys,
                    zipf: self.zipf.clone(),
                    perm: self.scatter.clone(),
                }
            }
        }
    }
}

struct ConnResult {
    ops: u64,
    /// MULTI/EXEC transactions whose replies were read.
    transactions: u64,
    /// Requests of each kind whose reply was read, and GETs that found a value.
    gets: u64,
    sets: u64,
    hits: u64,
    /// Value bytes sent by SETs plus value bytes received by GETs.
    bytes: u64,
    misses: u64,
    mismatches: u64,
    errors: u64,
    /// First few error or mismatch descriptions, for stderr.
    notes: Vec<String>,
    hist: Histogram,
    /// The same latencies split by kind: [GET, SET].
    op_hist: [Histogram; 2],
    begin: Instant,
    end: Instant,
    stopped_early: bool,
}

impl ConnResult {
    fn note(&mut self, s: String) {
        if self.notes.len() < 3 {
            self.notes.push(s);
        }
    }
}

/// Runs connection `idx` (0-based) over its share of the keys.
fn run_connection<S: Read + Write>(
    stream: &mut S,
    idx: u64,
    cfg: &ConnConfig,
    wl: &Workload,
    progress: &AtomicU64,
    start: &Barrier,
) -> ConnResult {
    start.wait();
    let begin = Instant::now();
    let mut res = ConnResult {
        ops: 0,
        transactions: 0,
        gets: 0,
        sets: 0,
        hits: 0,
        bytes: 0,
        misses: 0,
        mismatches: 0,
        errors: 0,
        notes: Vec::new(),
        hist: Histogram::new(),
        op_hist: [Histogram::new(), Histogram::new()],
        begin,
        end: begin,
        stopped_early: false,
    };
    let deadline = cfg.duration_limit.map(|d| begin + d);
    let mut source = cfg.source(idx, wl.keys);
    let mut pending = source.next();
    // Keys whose GET missed, to be SET next (--set-on-miss).
    let mut refill: Vec<u64> = Vec::new();
    let mut wbuf = Vec::new();
    let mut key = Vec::new();
    let mut value = Vec::new();
    let mut inflight: Vec<(Op, u64)> = Vec::with_capacity(cfg.pipeline as usize);
    let mut rbuf = RecvBuf::new();

    // Requests per batch: --pipeline requests, or --pipeline transactions of --multi SETs.
    let per_batch = cfg.pipeline.saturating_mul(cfg.multi.max(1));
    'batches: loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            res.stopped_early = pending.is_some() || !refill.is_empty();
            break;
        }
        inflight.clear();
        wbuf.clear();
        while (inflight.len() as u64) < per_batch {
            let next = if let Some(id) = refill.pop() {
                (Op::Set, id)
            } else if let Some(next) = pending {
                pending = source.next();
                next
            } else {
                break;
            };
            inflight.push(next);
        }
        if inflight.is_empty() {
            break;
        }
        let tx = cfg.multi as usize;
        for (n, &(op, id)) in inflight.iter().enumerate() {
            if tx > 0 && n % tx == 0 {
                wbuf.extend_from_slice(b"*1\r\n$5\r\nMULTI\r\n");
            }
            wl.key(id, &mut key);
            match op {
                Op::Set => {
                    wl.value(id, &mut value);
                    encode_set(cfg.proto, &key, wl.flags(id), &value, &mut wbuf);
                }
                Op::Get => encode_get(cfg.proto, &key, &mut wbuf),
            }
            if tx > 0 && ((n + 1) % tx == 0 || n + 1 == inflight.len()) {
                wbuf.extend_from_slice(b"*1\r\n$4\r\nEXEC\r\n");
            }
        }
        let t0 = Instant::now();
        if let Err(e) = stream.write_all(&wbuf).and_then(|()| stream.flush()) {
            res.errors += 1;
            res.note(format!("write failed: {}", io_text(&e)));
            break;
        }
        if tx > 0 {
            for chunk in inflight.chunks(tx) {
                let Some((reply, used)) = read_reply(stream, &mut rbuf, &mut res, |b| {
                    parse_resp_tx(b, chunk.len())
                }) else {
                    break 'batches;
                };
                let lat = t0.elapsed().as_nanos() as u64;
                res.hist.record(lat);
                res.op_hist[1].record(lat);
                res.ops += chunk.len() as u64;
                res.transactions += 1;
                if let Reply::Error(msg) = &reply {
                    res.sets += chunk.len() as u64;
                    res.errors += 1;
                    res.note(format!("transaction failed: {msg}"));
                } else {
                    for &(op, id) in chunk {
                        check_reply(
                            op,
                            wl,
                            id,
                            &reply,
                            rbuf.data(),
                            &mut key,
                            &mut value,
                            &mut res,
                        );
                    }
                }
                rbuf.consume(used);
            }
        } else {
            for &(op, id) in &inflight {
                let Some((reply, used)) = read_reply(stream, &mut rbuf, &mut res, |b| {
                    parse_reply(cfg.proto, op, b)
                }) else {
                    break 'batches;
                };
                let lat = t0.elapsed().as_nanos() as u64;
                res.hist.record(lat);
                res.op_hist[usize::from(op == Op::Set)].record(lat);
                res.ops += 1;
                check_reply(
                    op,
                    wl,
                    id,
                    &reply,
                    rbuf.data(),
                    &mut key,
                    &mut value,
                    &mut res,
                );
                if cfg.set_on_miss && op == Op::Get && reply == Reply::Miss {
                    refill.push(id);
                }
                rbuf.consume(used);
            }
        }
        progress.fetch_add(inflight.len() as u64, Ordering::Relaxed);
    }
    res.end = Instant::now();
    res
}

/// Reads until `parse` finds a whole reply at the start of the buffer. None when the connection
/// has to stop (a read failed or the stream cannot be understood), which `res` then notes.
fn read_reply<S: Read>(
    stream: &mut S,
    rbuf: &mut RecvBuf,
    res: &mut ConnResult,
    parse: impl Fn(&[u8]) -> Result<Option<(Reply, usize)>, ProtoError>,
) -> Option<(Reply, usize)> {
    loop {
        match parse(rbuf.data()) {
            Ok(Some(r)) => return Some(r),
            Ok(None) => {
                if let Err(e) = rbuf.fill(stream) {
                    res.errors += 1;
                    res.note(format!("read failed: {}", io_text(&e)));
                    return None;
                }
            }
            Err(ProtoError(msg)) => {
                res.errors += 1;
                res.note(format!("bad reply, connection stopped: {msg}"));
                return None;
            }
        }
    }
}

/// Classifies one reply: ok, miss, mismatch or error.
#[allow(clippy::too_many_arguments)]
fn check_reply(
    op: Op,
    wl: &Workload,
    id: u64,
    reply: &Reply,
    buf: &[u8],
    key: &mut Vec<u8>,
    value: &mut Vec<u8>,
    res: &mut ConnResult,
) {
    match op {
        Op::Set => res.sets += 1,
        Op::Get => res.gets += 1,
    }
    match (op, reply) {
        (Op::Set, Reply::Stored) => res.bytes += wl.value_len(id) as u64,
        (Op::Get, Reply::Miss) => res.misses += 1,
        (
            Op::Get,
            Reply::Value {
                key: k,
                flags,
                data,
            },
        ) => {
            res.hits += 1;
            res.bytes += data.len() as u64;
            wl.key(id, key);
            wl.value(id, value);
            let got = &buf[data.clone()];
            let problem = if k
                .as_ref()
                .is_some_and(|k| &buf[k.clone()] != key.as_slice())
            {
                Some(format!(
                    "asked for key {}, got key {}",
                    printable(key),
                    printable(&buf[k.clone().unwrap_or_default()])
                ))
            } else if flags.is_some_and(|f| f != wl.flags(id)) {
                Some(format!(
                    "key {}: flags {:?}, expected {}",
                    printable(key),
                    flags,
                    wl.flags(id)
                ))
            } else if got.len() != value.len() {
                Some(format!(
                    "key {}: value of {} bytes, expected {}",
                    printable(key),
                    got.len(),
                    value.len()
                ))
            } else if got != value.as_slice() {
                let at = got.iter().zip(value.iter()).position(|(a, b)| a != b);
                Some(format!(
                    "key {}: value differs from byte {}",
                    printable(key),
                    at.unwrap_or(0)
                ))
            } else {
                None
            };
            if let Some(p) = problem {
                res.mismatches += 1;
                res.note(format!("mismatch: {p}"));
            }
        }
        (_, Reply::Error(msg)) => {
            res.errors += 1;
            res.note(format!("error reply: {msg}"));
        }
        (op, other) => {
            res.errors += 1;
            res.note(format!(
                "unexpected reply to {}: {}",
                op.name(),
                match other {
                    Reply::Stored => "stored",
                    Reply::Value { .. } => "a value",
                    Reply::Miss => "a miss",
                    Reply::Error(_) => "an error",
                }
            ));
        }
    }
}

fn io_text(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "timed out".into(),
        _ => e.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Phases
// ---------------------------------------------------------------------------------------------

struct PhaseResult {
    phase: Phase,
    ops: u64,
    gets: u64,
    sets: u64,
    hits: u64,
    bytes: u64,
    /// Requests the phase meant to make: --keys, or --requests for mixed.
    planned: u64,
    /// Sequential set/get: the largest K such that keys 1..=K all got a reply.
    prefix_done: Option<u64>,
    secs: f64,
    misses: u64,
    mismatches: u64,
    errors: u64,
    hist: Histogram,
    op_hist: [Histogram; 2],
    conn_secs_min: f64,
    conn_secs_max: f64,
    /// Every key got a reply (false after --duration-limit or a broken connection).
    complete: bool,
    /// Some connection stopped because of --duration-limit.
    stopped_early: bool,
    notes: Vec<String>,
    /// MULTI/EXEC transactions (--multi).
    transactions: u64,
    /// Queue phase: messages delivered more than once (also counted in `mismatches`).
    duplicates: u64,
}

impl PhaseResult {
    fn new(phase: Phase, planned: u64) -> PhaseResult {
        PhaseResult {
            phase,
            ops: 0,
            gets: 0,
            sets: 0,
            hits: 0,
            bytes: 0,
            planned,
            prefix_done: None,
            secs: 0.0,
            misses: 0,
            mismatches: 0,
            errors: 0,
            hist: Histogram::new(),
            op_hist: [Histogram::new(), Histogram::new()],
            conn_secs_min: f64::MAX,
            conn_secs_max: 0.0,
            complete: true,
            stopped_early: false,
            notes: Vec::new(),
            transactions: 0,
            duplicates: 0,
        }
    }

    /// Adds connection `i`'s counts (its ops, latencies, errors, notes).
    fn add(&mut self, i: usize, r: &ConnResult) {
        self.ops += r.ops;
        self.transactions += r.transactions;
        self.gets += r.gets;
        self.sets += r.sets;
        self.hits += r.hits;
        self.bytes += r.bytes;
        self.op_hist[0].merge(&r.op_hist[0]);
        self.op_hist[1].merge(&r.op_hist[1]);
        self.misses += r.misses;
        self.mismatches += r.mismatches;
        self.errors += r.errors;
        self.hist.merge(&r.hist);
        let s = r.end.duration_since(r.begin).as_secs_f64();
        self.conn_secs_min = self.conn_secs_min.min(s);
        self.conn_secs_max = self.conn_secs_max.max(s);
        self.stopped_early |= r.stopped_early;
        for n in &r.notes {
            if self.notes.len() < 10 {
                self.notes.push(format!("conn {i}: {n}"));
            }
        }
    }
}

/// A failure that ends the whole run with exit code 2.
struct Fatal(String);

fn connect(addrs: &[SocketAddr], timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn run_phase(
    args: &Args,
    addrs: &[SocketAddr],
    target: &str,
    wl: &Arc<Workload>,
    phase: Phase,
) -> Result<PhaseResult, Fatal> {
    let timeout = Duration::from_secs_f64(args.timeout);
    let mut streams = Vec::with_capacity(args.connections as usize);
    for _ in 0..args.connections {
        let s = connect(addrs, timeout)
            .map_err(|e| Fatal(format!("cannot connect to {target}: {}", io_text(&e))))?;
        streams.push(s);
    }
    let requests = args.requests.unwrap_or(args.keys);
    let planned = if phase == Phase::Mixed {
        requests
    } else {
        wl.keys
    };
    let cfg = Arc::new(ConnConfig {
        proto: args.protocol,
        phase,
        connections: args.connections,
        pipeline: args.pipeline,
        duration_limit: args.duration_limit.map(Duration::from_secs_f64),
        order: (args.order == Order::Random)
            .then(|| Arc::new(Permutation::new(wl.keys, args.seed))),
        requests,
        get_fraction: args.get_fraction,
        zipf: (args.key_dist == KeyDist::Zipf && wl.keys > 0)
            .then(|| Arc::new(Zipf::new(wl.keys, args.zipf_exponent))),
        scatter: Arc::new(Permutation::new(wl.keys.max(1), args.seed)),
        seed: args.seed,
        set_on_miss: args.set_on_miss && phase == Phase::Mixed,
        multi: if phase == Phase::Set {
            args.multi.unwrap_or(0)
        } else {
            0
        },
    });
    let progress = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(streams.len()));
    let mut handles = Vec::with_capacity(streams.len());
    for (i, mut s) in streams.into_iter().enumerate() {
        let (cfg, wl, progress, barrier) =
            (cfg.clone(), wl.clone(), progress.clone(), barrier.clone());
        let h = thread::Builder::new()
            .name(format!("conn-{i}"))
            .stack_size(256 * 1024)
            .spawn(move || run_connection(&mut s, i as u64, &cfg, &wl, &progress, &barrier));
        match h {
            Ok(h) => handles.push(h),
            Err(e) => {
                // The threads already started wait at the barrier forever; nothing to join.
                return Err(Fatal(format!("cannot start thread {i}: {e}")));
            }
        }
    }

    let show = io::stderr().is_terminal();
    let total = planned;
    while !handles.iter().all(|h| h.is_finished()) {
        thread::sleep(Duration::from_millis(200));
        if show {
            let done = progress.load(Ordering::Relaxed);
            let pct = if total == 0 {
                100.0
            } else {
                done as f64 * 100.0 / total as f64
            };
            let _ = write!(
                io::stderr(),
                "\r{} {done}/{total} ({pct:.0}%)\x1b[K",
                phase.name()
            );
        }
    }
    if show {
        let _ = write!(io::stderr(), "\r\x1b[K");
    }

    let mut results = Vec::with_capacity(handles.len());
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(r) => results.push(r),
            Err(_) => return Err(Fatal(format!("connection thread {i} panicked"))),
        }
    }
    let mut out = PhaseResult::new(phase, planned);
    let begin = results.iter().map(|r| r.begin).min();
    let end = results.iter().map(|r| r.end).max();
    if let (Some(b), Some(e)) = (begin, end) {
        out.secs = e.duration_since(b).as_secs_f64();
    }
    for (i, r) in results.iter().enumerate() {
        out.add(i, r);
    }
    if results.is_empty() {
        out.conn_secs_min = 0.0;
    }
    out.complete = out.ops == planned;
    if phase != Phase::Mixed && args.order == Order::Sequential {
        // Connection i's replies cover positions i, i+C, ... in order, so its first position
        // without a reply is i + ops*C; keys below the smallest of those are all done.
        let c = args.connections;
        let first_missing = results
            .iter()
            .enumerate()
            .map(|(i, r)| (i as u64).saturating_add(r.ops.saturating_mul(c)))
            .min()
            .unwrap_or(0);
        out.prefix_done = Some(first_missing.min(wl.keys));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The queue phase
// ---------------------------------------------------------------------------------------------

/// One bit per message id (1..=n), set atomically.
struct Bits {
    n: u64,
    words: Vec<AtomicU64>,
}

impl Bits {
    fn new(n: u64) -> Bits {
        Bits {
            n,
            words: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Sets id's bit; whether it was set before. Ids out of range count as set (never new).
    fn set(&self, id: u64) -> bool {
        if id == 0 || id > self.n {
            return true;
        }
        let i = id - 1;
        match self.words.get((i / 64) as usize) {
            Some(w) => w.fetch_or(1 << (i % 64), Ordering::AcqRel) & (1 << (i % 64)) != 0,
            None => true,
        }
    }

    /// Bits set here and not in `other`.
    fn count_missing_from(&self, other: &Bits) -> u64 {
        self.words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| {
                (a.load(Ordering::Acquire) & !b.load(Ordering::Acquire)).count_ones() as u64
            })
            .sum()
    }
}

/// What the queue's producers and consumers share.
struct QueueState {
    /// Message timestamps count from here.
    epoch: Instant,
    /// Messages the server acknowledged (LPUSH answered an integer).
    acked: Bits,
    /// Messages delivered to a consumer.
    seen: Bits,
    pushed: AtomicU64,
    /// Distinct messages delivered.
    delivered: AtomicU64,
    producers_left: AtomicU64,
    /// When (ns after `epoch`) the last new message was delivered.
    last_delivery_ns: AtomicU64,
    duplicates: AtomicU64,
}

/// A message: `<id>:<ns after epoch when its LPUSH was written>:` then the key's value bytes.
fn encode_message(wl: &Workload, id: u64, sent_ns: u64, value: &mut Vec<u8>, out: &mut Vec<u8>) {
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(n.format(id).as_bytes());
    out.push(b':');
    out.extend_from_slice(n.format(sent_ns).as_bytes());
    out.push(b':');
    wl.value(id, value);
    out.extend_from_slice(value);
}

/// The id and send time of a message, if it is one whose bytes are intact.
fn decode_message(wl: &Workload, msg: &[u8], value: &mut Vec<u8>) -> Option<(u64, u64)> {
    let mut parts = msg.splitn(3, |&b| b == b':');
    let id: u64 = parse_num(parts.next()?)?;
    let sent: u64 = parse_num(parts.next()?)?;
    let rest = parts.next()?;
    if id == 0 || id > wl.keys {
        return None;
    }
    wl.value(id, value);
    (rest == value.as_slice()).then_some((id, sent))
}

/// What one BRPOP answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pop {
    /// The popped element's bytes.
    Item(Range<usize>),
    /// The timeout passed (a null array).
    Empty,
    Error(String),
}

/// Parses the reply to one `BRPOP key timeout` (RESP2).
fn parse_resp_pop(buf: &[u8]) -> Result<Option<(Pop, usize)>, ProtoError> {
    let Some((line, end)) = line_at(buf, 0)? else {
        return Ok(None);
    };
    if line == b"*-1" {
        return Ok(Some((Pop::Empty, end)));
    }
    if line != b"*2" {
        let Some((v, end)) = parse_resp_value(buf, 0, 0)? else {
            return Ok(None);
        };
        return Ok(Some((
            Pop::Error(format!("BRPOP answered {}", describe_resp(buf, &v))),
            end,
        )));
    }
    let Some((_, at)) = parse_resp_value(buf, end, 1)? else {
        return Ok(None);
    };
    match parse_resp_value(buf, at, 1)? {
        None => Ok(None),
        Some((Resp::Bulk(r), next)) => Ok(Some((Pop::Item(r), next))),
        Some((v, next)) => Ok(Some((
            Pop::Error(format!("BRPOP's element is {}", describe_resp(buf, &v))),
            next,
        ))),
    }
}

/// Parses the reply to one LPUSH: an integer is `Stored`.
fn parse_resp_push(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtoError> {
    let Some((v, end)) = parse_resp_value(buf, 0, 0)? else {
        return Ok(None);
    };
    let reply = match v {
        Resp::Integer(_) => Reply::Stored,
        other => Reply::Error(format!("LPUSH answered {}", describe_resp(buf, &other))),
    };
    Ok(Some((reply, end)))
}

fn new_conn_result(begin: Instant) -> ConnResult {
    ConnResult {
        ops: 0,
        transactions: 0,
        gets: 0,
        sets: 0,
        hits: 0,
        bytes: 0,
        misses: 0,
        mismatches: 0,
        errors: 0,
        notes: Vec::new(),
        hist: Histogram::new(),
        op_hist: [Histogram::new(), Histogram::new()],
        begin,
        end: begin,
        stopped_early: false,
    }
}

/// Producer `idx` of `producers`: LPUSHes messages idx+1, idx+1+producers, ... in batches of
/// `pipeline`, each reply checked. Its push latencies go to `op_hist[1]`.
#[allow(clippy::too_many_arguments)]
fn run_producer<S: Read + Write>(
    stream: &mut S,
    idx: u64,
    producers: u64,
    pipeline: u64,
    key: &[u8],
    deadline: Option<Duration>,
    wl: &Workload,
    q: &QueueState,
    start: &Barrier,
) -> ConnResult {
    start.wait();
    let mut res = new_conn_result(Instant::now());
    let deadline = deadline.map(|d| res.begin + d);
    let (mut wbuf, mut msg, mut value) = (Vec::new(), Vec::new(), Vec::new());
    let mut rbuf = RecvBuf::new();
    let mut next = idx;
    let mut batch = Vec::with_capacity(pipeline as usize);
    'batches: while next < wl.keys {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            res.stopped_early = true;
            break;
        }
        wbuf.clear();
        batch.clear();
        let t0 = Instant::now();
        let sent_ns = q.epoch.elapsed().as_nanos() as u64;
        while (batch.len() as u64) < pipeline && next < wl.keys {
            let id = next + 1;
            next = next.saturating_add(producers);
            msg.clear();
            encode_message(wl, id, sent_ns, &mut value, &mut msg);
            wbuf.extend_from_slice(b"*3\r\n$5\r\nLPUSH\r\n");
            resp_bulk(key, &mut wbuf);
            resp_bulk(&msg, &mut wbuf);
            batch.push(id);
        }
        if let Err(e) = stream.write_all(&wbuf).and_then(|()| stream.flush()) {
            res.errors += 1;
            res.note(format!("write failed: {}", io_text(&e)));
            break;
        }
        for &id in &batch {
            let Some((reply, used)) = read_reply(stream, &mut rbuf, &mut res, parse_resp_push)
            else {
                break 'batches;
            };
            res.op_hist[1].record(t0.elapsed().as_nanos() as u64);
            res.sets += 1;
            match reply {
                Reply::Error(m) => {
                    res.errors += 1;
                    res.note(format!("push of message {id}: {m}"));
                }
                _ => {
                    q.acked.set(id);
                    q.pushed.fetch_add(1, Ordering::AcqRel);
                    res.bytes += wl.value_len(id) as u64;
                }
            }
            rbuf.consume(used);
        }
    }
    res.end = Instant::now();
    q.producers_left.fetch_sub(1, Ordering::AcqRel);
    res
}

/// A consumer: BRPOPs (0.1 s timeout) until every acknowledged message has been delivered and
/// the producers are done, or nothing came for `idle` after they were. Each message is checked
/// intact and new; its end-to-end latency (LPUSH written to BRPOP's reply read) goes to `hist`,
/// the BRPOP round trips to `op_hist[0]`.
fn run_consumer<S: Read + Write>(
    stream: &mut S,
    key: &[u8],
    idle: Duration,
    wl: &Workload,
    q: &QueueState,
    start: &Barrier,
) -> ConnResult {
    start.wait();
    let mut res = new_conn_result(Instant::now());
    let mut request = Vec::new();
    request.extend_from_slice(b"*3\r\n$5\r\nBRPOP\r\n");
    resp_bulk(key, &mut request);
    resp_bulk(b"0.1", &mut request);
    let mut rbuf = RecvBuf::new();
    let mut value = Vec::new();
    // Since when no consumer has had a new message (once the producers are done).
    let mut quiet_since: Option<(Instant, u64)> = None;
    loop {
        if q.producers_left.load(Ordering::Acquire) == 0 {
            let delivered = q.delivered.load(Ordering::Acquire);
            if delivered >= q.pushed.load(Ordering::Acquire) {
                break;
            }
            if quiet_since.is_none_or(|(_, seen)| seen != delivered) {
                quiet_since = Some((Instant::now(), delivered));
            }
            if quiet_since.is_some_and(|(since, _)| since.elapsed() > idle) {
                res.note(format!(
                    "nothing delivered for {idle:?} after the producers were done"
                ));
                break;
            }
        }
        let t0 = Instant::now();
        if let Err(e) = stream.write_all(&request).and_then(|()| stream.flush()) {
            res.errors += 1;
            res.note(format!("write failed: {}", io_text(&e)));
            break;
        }
        let got = loop {
            match parse_resp_pop(rbuf.data()) {
                Ok(Some(r)) => break Some(r),
                Ok(None) => {
                    if let Err(e) = rbuf.fill(stream) {
                        res.errors += 1;
                        res.note(format!("read failed: {}", io_text(&e)));
                        break None;
                    }
                }
                Err(ProtoError(msg)) => {
                    res.errors += 1;
                    res.note(format!("bad reply, connection stopped: {msg}"));
                    break None;
                }
            }
        };
        let Some((pop, used)) = got else { break };
        res.op_hist[0].record(t0.elapsed().as_nanos() as u64);
        match pop {
            Pop::Empty => {}
            Pop::Error(m) => {
                res.errors += 1;
                res.note(m);
                break;
            }
            Pop::Item(r) => {
                res.gets += 1;
                let msg = &rbuf.data()[r];
                res.bytes += msg.len() as u64;
                match decode_message(wl, msg, &mut value) {
                    None => {
                        res.mismatches += 1;
                        res.note(format!(
                            "a popped message is not one pushed: {}",
                            printable(msg)
                        ));
                    }
                    Some((id, sent_ns)) => {
                        if q.seen.set(id) {
                            res.mismatches += 1;
                            q.duplicates.fetch_add(1, Ordering::AcqRel);
                            res.note(format!("message {id} delivered twice"));
                        } else {
                            let now = q.epoch.elapsed().as_nanos() as u64;
                            res.hist.record(now.saturating_sub(sent_ns));
                            res.ops += 1;
                            res.hits += 1;
                            q.delivered.fetch_add(1, Ordering::AcqRel);
                            q.last_delivery_ns.fetch_max(now, Ordering::AcqRel);
                        }
                    }
                }
            }
        }
        rbuf.consume(used);
    }
    res.end = Instant::now();
    res
}

/// The queue phase: --connections producers and --consumers consumers on their own
/// connections. The rate is distinct messages delivered per second, from the start to the
/// last delivery; `misses` are acknowledged messages never delivered.
fn run_queue_phase(
    args: &Args,
    addrs: &[SocketAddr],
    target: &str,
    wl: &Arc<Workload>,
) -> Result<PhaseResult, Fatal> {
    let timeout = Duration::from_secs_f64(args.timeout);
    let key = args.queue_key.as_bytes().to_vec();
    let open = || {
        connect(addrs, timeout)
            .map_err(|e| Fatal(format!("cannot connect to {target}: {}", io_text(&e))))
    };
    // Start from an empty queue.
    let mut first = open()?;
    let mut del = b"*2\r\n$3\r\nDEL\r\n".to_vec();
    resp_bulk(&key, &mut del);
    first
        .write_all(&del)
        .map_err(|e| Fatal(format!("DEL {}: {}", args.queue_key, io_text(&e))))?;
    let mut rbuf = RecvBuf::new();
    loop {
        match parse_resp_value(rbuf.data(), 0, 0) {
            Ok(Some((Resp::Integer(_), _))) => break,
            Ok(Some((v, _))) => {
                return Err(Fatal(format!(
                    "DEL {} answered {}",
                    args.queue_key,
                    describe_resp(rbuf.data(), &v)
                )));
            }
            Ok(None) => rbuf
                .fill(&mut first)
                .map_err(|e| Fatal(format!("DEL {}: {}", args.queue_key, io_text(&e))))?,
            Err(ProtoError(m)) => return Err(Fatal(format!("DEL {}: {m}", args.queue_key))),
        }
    }
    drop(first);
    let producers = args.connections;
    let consumers = args.consumers;
    let q = Arc::new(QueueState {
        epoch: Instant::now(),
        acked: Bits::new(wl.keys),
        seen: Bits::new(wl.keys),
        pushed: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        producers_left: AtomicU64::new(producers),
        last_delivery_ns: AtomicU64::new(0),
        duplicates: AtomicU64::new(0),
    });
    let mut streams = Vec::new();
    for _ in 0..producers + consumers {
        streams.push(open()?);
    }
    let barrier = Arc::new(Barrier::new(streams.len()));
    let deadline = args.duration_limit.map(Duration::from_secs_f64);
    let mut handles = Vec::with_capacity(streams.len());
    for (i, mut s) in streams.into_iter().enumerate() {
        let (q, wl, barrier, key) = (q.clone(), wl.clone(), barrier.clone(), key.clone());
        let i = i as u64;
        let (pipeline, idle) = (args.pipeline, timeout);
        let h = thread::Builder::new()
            .name(format!("queue-{i}"))
            .stack_size(256 * 1024)
            .spawn(move || {
                if i < producers {
                    run_producer(
                        &mut s, i, producers, pipeline, &key, deadline, &wl, &q, &barrier,
                    )
                } else {
                    run_consumer(&mut s, &key, idle, &wl, &q, &barrier)
                }
            });
        match h {
            Ok(h) => handles.push(h),
            // The threads already started wait at the barrier forever; nothing to join.
            Err(e) => return Err(Fatal(format!("cannot start thread {i}: {e}"))),
        }
    }
    let mut results = Vec::with_capacity(handles.len());
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(r) => results.push(r),
            Err(_) => return Err(Fatal(format!("queue thread {i} panicked"))),
        }
    }
    let mut out = PhaseResult::new(Phase::Queue, wl.keys);
    for (i, r) in results.iter().enumerate() {
        out.add(i, r);
    }
    if results.is_empty() {
        out.conn_secs_min = 0.0;
    }
    let begin = results.iter().map(|r| r.begin).min();
    let last = q.epoch + Duration::from_nanos(q.last_delivery_ns.load(Ordering::Acquire));
    if let Some(b) = begin {
        out.secs = last.saturating_duration_since(b).as_secs_f64();
    }
    out.misses = q.acked.count_missing_from(&q.seen);
    out.duplicates = q.duplicates.load(Ordering::Acquire);
    out.complete = out.ops == wl.keys && out.misses == 0;
    Ok(out)
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn fmt_ms(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.3}")
    } else if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn ops_per_sec(r: &PhaseResult) -> f64 {
    if r.secs > 0.0 {
        r.ops as f64 / r.secs
    } else {
        0.0
    }
}

fn json_line(args: &Args, r: &PhaseResult) -> String {
    let opt = |v: Option<usize>| v.map_or("null".to_string(), |v| v.to_string());
    format!(
        "{{\"phase\":{},\"protocol\":{},\"connections\":{},\"pipeline\":{},\"value_size\":{},\
         \"value_size_max\":{},\"keys\":{},\"ops\":{},\"secs\":{:.6},\"ops_per_sec\":{:.1},\
         \"p50_ms\":{:.4},\"p99_ms\":{:.4},\"p999_ms\":{:.4},\"misses\":{},\"mismatches\":{},\
         \"errors\":{},\"complete\":{},\"conn_secs_min\":{:.6},\"conn_secs_max\":{:.6},\
         \"stopped_early\":{},\"planned\":{},\"prefix_done\":{},\"order\":{},\"key_dist\":{},\
         \"get_fraction\":{},\"zipf_exponent\":{},\"seed\":{},\"gets\":{},\"sets\":{},\"hits\":{},\
         \"bytes\":{},\"mb_per_sec\":{:.3},\"get_p50_ms\":{:.4},\"get_p99_ms\":{:.4},\
         \"set_p50_ms\":{:.4},\"set_p99_ms\":{:.4},\"multi\":{},\"transactions\":{},\
         \"consumers\":{},\"duplicates\":{}}}",
        json_str(r.phase.name()),
        json_str(args.protocol.name()),
        args.connections,
        args.pipeline,
        args.value_size,
        opt(args.value_size_max),
        args.keys,
        r.ops,
        r.secs,
        ops_per_sec(r),
        ms(r.hist.quantile(0.50)),
        ms(r.hist.quantile(0.99)),
        ms(r.hist.quantile(0.999)),
        r.misses,
        r.mismatches,
        r.errors,
        r.complete,
        r.conn_secs_min,
        r.conn_secs_max,
        r.stopped_early,
        r.planned,
        r.prefix_done.map_or("null".to_string(), |v| v.to_string()),
        json_str(args.order.name()),
        json_str(args.key_dist.name()),
        args.get_fraction,
        args.zipf_exponent,
        args.seed,
        r.gets,
        r.sets,
        r.hits,
        r.bytes,
        if r.secs > 0.0 {
            r.bytes as f64 / r.secs / 1e6
        } else {
            0.0
        },
        ms(r.op_hist[0].quantile(0.50)),
        ms(r.op_hist[0].quantile(0.99)),
        ms(r.op_hist[1].quantile(0.50)),
        ms(r.op_hist[1].quantile(0.99)),
        match (r.phase, args.multi) {
            (Phase::Set, Some(m)) => m.to_string(),
            _ => "null".into(),
        },
        r.transactions,
        if r.phase == Phase::Queue {
            args.consumers.to_string()
        } else {
            "null".into()
        },
        r.duplicates,
    )
}

fn human_line(r: &PhaseResult) -> String {
    if r.phase == Phase::Queue {
        let mut s = format!(
            "queue {:>8} msgs {:>6.2} s  {:>8.0} msgs/s  end-to-end p50 {} ms  p99 {} ms  \
             push p50 {} ms  p99 {} ms  pushes {}  pops {}  lost {}  duplicates {}  errors {}",
            r.ops,
            r.secs,
            ops_per_sec(r),
            fmt_ms(ms(r.hist.quantile(0.50))),
            fmt_ms(ms(r.hist.quantile(0.99))),
            fmt_ms(ms(r.op_hist[1].quantile(0.50))),
            fmt_ms(ms(r.op_hist[1].quantile(0.99))),
            r.sets,
            r.gets,
            r.misses,
            r.duplicates,
            r.errors,
        );
        if r.stopped_early {
            s.push_str("  [incomplete: stopped by --duration-limit]");
        } else if !r.complete {
            s.push_str("  [incomplete]");
        }
        return s;
    }
    let mut s = format!(
        "{:<5} {:>8} ops  {:>6.2} s  {:>8.0} ops/s  p50 {} ms  p99 {} ms  p99.9 {} ms  \
         misses {}  mismatches {}  errors {}  (conns {:.2}-{:.2} s)",
        r.phase.name(),
        r.ops,
        r.secs,
        ops_per_sec(r),
        fmt_ms(ms(r.hist.quantile(0.50))),
        fmt_ms(ms(r.hist.quantile(0.99))),
        fmt_ms(ms(r.hist.quantile(0.999))),
        r.misses,
        r.mismatches,
        r.errors,
        r.conn_secs_min,
        r.conn_secs_max,
    );
    if r.phase == Phase::Mixed {
        let _ = write!(
            s,
            "  gets {} (hits {})  sets {}  get p99 {} ms  set p99 {} ms",
            r.gets,
            r.hits,
            r.sets,
            fmt_ms(ms(r.op_hist[0].quantile(0.99))),
            fmt_ms(ms(r.op_hist[1].quantile(0.99))),
        );
    }
    if r.transactions > 0 {
        let _ = write!(
            s,
            "  transactions {} (latency per transaction)",
            r.transactions
        );
    }
    if r.stopped_early {
        s.push_str("  [incomplete: stopped by --duration-limit]");
    } else if !r.complete {
        s.push_str("  [incomplete]");
    }
    s
}

/// Checks the arguments clap cannot; returns the workload or a one-line complaint.
fn validate(args: &Args) -> Result<Workload, String> {
    let value_max = args.value_size_max.unwrap_or(args.value_size);
    if value_max < args.value_size {
        return Err(format!(
            "--value-size-max {value_max} is below --value-size {}",
            args.value_size
        ));
    }
    if value_max > MAX_VALUE {
        return Err(format!(
            "values larger than {MAX_VALUE} bytes are not supported"
        ));
    }
    let key_len = match (args.key_size_min, args.key_size_max) {
        (None, None) => None,
        (Some(a), None) | (None, Some(a)) => Some((a, a)),
        (Some(a), Some(b)) => Some((a, b)),
    };
    if let Some((lo, hi)) = key_len {
        if lo == 0 || hi < lo {
            return Err(format!("key size range {lo}..{hi} is empty"));
        }
        if args.protocol == Protocol::Memcache && hi > MEMCACHE_MAX_KEY {
            return Err(format!(
                "--key-size-max {hi} exceeds memcached's {MEMCACHE_MAX_KEY}-byte key limit"
            ));
        }
    }
    for (name, v) in [
        ("--duration-limit", args.duration_limit),
        ("--timeout", Some(args.timeout)),
    ] {
        if let Some(v) = v
            && !(v.is_finite() && v > 0.0 && v < 1e9)
        {
            return Err(format!("{name} must be a positive number of seconds"));
        }
    }
    if !(0.0..=1.0).contains(&args.get_fraction) {
        return Err("--get-fraction must be between 0 and 1".into());
    }
    if !(args.zipf_exponent.is_finite() && args.zipf_exponent > 0.0 && args.zipf_exponent < 100.0) {
        return Err("--zipf-exponent must be a positive number".into());
    }
    if args.protocol != Protocol::Resp {
        if args.multi.is_some() {
            return Err("--multi needs --protocol resp".into());
        }
        if args.phases.contains(&Phase::Queue) {
            return Err("the queue phase needs --protocol resp".into());
        }
    }
    if args.queue_key.is_empty() {
        return Err("--queue-key must not be empty".into());
    }
    if args.phases.contains(&Phase::Mixed) && args.keys == 0 && args.requests != Some(0) {
        return Err("the mixed phase needs --keys of at least 1".into());
    }
    Ok(Workload::new(
        args.keys,
        key_len,
        args.value_size,
        value_max,
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let wl = match validate(&args) {
        Ok(w) => Arc::new(w),
        Err(e) => {
            say_err!("memkeep-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let port = args.port.unwrap_or(match args.protocol {
        Protocol::Memcache => 11211,
        Protocol::Resp => 6379,
    });
    let target = if args.host.contains(':') {
        format!("[{}]:{port}", args.host)
    } else {
        format!("{}:{port}", args.host)
    };
    let addrs: Vec<SocketAddr> = match (args.host.as_str(), port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            say_err!("memkeep-bench: cannot resolve {}: {e}", args.host);
            return ExitCode::from(2);
        }
    };
    if addrs.is_empty() {
        say_err!("memkeep-bench: {} resolves to no address", args.host);
        return ExitCode::from(2);
    }
    if !args.json {
        let size = match args.value_size_max {
            Some(m) if m != args.value_size => format!("{}-{m}", args.value_size),
            _ => args.value_size.to_string(),
        };
        say!(
            "# {} {target}  connections {}  pipeline {}  keys {}  value {size} B",
            args.protocol.name(),
            args.connections,
            args.pipeline,
            args.keys
        );
    }
    let mut failed = false;
    for &phase in &args.phases {
        let run = if phase == Phase::Queue {
            run_queue_phase(&args, &addrs, &target, &wl)
        } else {
            run_phase(&args, &addrs, &target, &wl, phase)
        };
        let r = match run {
            Ok(r) => r,
            Err(Fatal(msg)) => {
                say_err!("memkeep-bench: {msg}");
                return ExitCode::from(2);
            }
        };
        if args.json {
            say!("{}", json_line(&args, &r));
        } else {
            say!("{}", human_line(&r));
        }
        for n in &r.notes {
            say_err!("memkeep-bench: {}: {n}", phase.name());
        }
        // A queue must lose nothing it acknowledged.
        if r.mismatches > 0 || r.errors > 0 || (phase == Phase::Queue && r.misses > 0) {
            failed = true;
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mc_get(b: &[u8]) -> Result<Option<(Reply, usize)>, ProtoError> {
        parse_memcache_get(b)
    }

    #[test]
    fn memcache_store_replies() {
        assert_eq!(
            parse_memcache_store(b"STORED\r\n"),
            Ok(Some((Reply::Stored, 8)))
        );
        assert_eq!(parse_memcache_store(b"STOR"), Ok(None));
        assert_eq!(parse_memcache_store(b"STORED\r"), Ok(None));
        assert_eq!(
            parse_memcache_store(b"SERVER_ERROR out of memory storing object\r\nSTORED\r\n"),
            Ok(Some((
                Reply::Error("SERVER_ERROR out of memory storing object".into()),
                43
            )))
        );
        assert_eq!(
            parse_memcache_store(b"NOT_STORED\r\n"),
            Ok(Some((Reply::Error("NOT_STORED".into()), 12)))
        );
        assert!(parse_memcache_store(b"STORED\n").is_err());
        assert!(parse_memcache_store(b"END\r\n").is_err());
    }

    #[test]
    fn memcache_get_replies() {
        let hit = b"VALUE k1 7 5\r\nab\r\nc\r\nEND\r\nEND\r\n";
        let (r, used) = mc_get(hit).unwrap().unwrap();
        assert_eq!(used, hit.len() - 5);
        assert_eq!(
            r,
            Reply::Value {
                key: Some(6..8),
                flags: Some(7),
                data: 14..19
            }
        );
        // Every strict prefix is incomplete, never an error.
        for n in 0..used {
            assert_eq!(mc_get(&hit[..n]), Ok(None), "prefix {n}");
        }
        // gets-style reply with a CAS field.
        assert!(matches!(
            mc_get(b"VALUE k 0 1 99\r\nx\r\nEND\r\n"),
            Ok(Some((Reply::Value { .. }, 24)))
        ));
        assert_eq!(mc_get(b"END\r\n"), Ok(Some((Reply::Miss, 5))));
        assert_eq!(
            mc_get(b"CLIENT_ERROR bad command line format\r\n"),
            Ok(Some((
                Reply::Error("CLIENT_ERROR bad command line format".into()),
                38
            )))
        );
        assert_eq!(
            mc_get(b"ERROR\r\n"),
            Ok(Some((Reply::Error("ERROR".into()), 7)))
        );
        assert!(mc_get(b"VALUE k 0 3\r\nabcd\r\nEND\r\n").is_err());
        assert!(mc_get(b"VALUE k x 3\r\nabc\r\nEND\r\n").is_err());
        assert!(mc_get(b"VALUE k 0 1\r\nx\r\nVALUE k 0 1\r\n").is_err());
        assert!(mc_get(b"STORED\r\n").is_err());
        assert!(mc_get(&[b'x'; MAX_LINE + 10]).is_err());
    }

    #[test]
    fn resp_replies() {
        assert_eq!(parse_resp_store(b"+OK\r\n"), Ok(Some((Reply::Stored, 5))));
        assert_eq!(parse_resp_store(b"+OK\r"), Ok(None));
        assert_eq!(
            parse_resp_store(b"-ERR wrong number of arguments\r\n"),
            Ok(Some((
                Reply::Error("-ERR wrong number of arguments".into()),
                32
            )))
        );
        assert_eq!(
            parse_resp_store(b":1\r\n"),
            Ok(Some((
                Reply::Error("unexpected reply to SET: :1".into()),
                4
            )))
        );
        let hit = b"$4\r\na\r\nb\r\n+OK\r\n";
        assert_eq!(
            parse_resp_get(hit),
            Ok(Some((
                Reply::Value {
                    key: None,
                    flags: None,
                    data: 4..8
                },
                10
            )))
        );
        for n in 0..10 {
            assert_eq!(parse_resp_get(&hit[..n]), Ok(None), "prefix {n}");
        }
        assert_eq!(parse_resp_get(b"$0\r\n\r\n").unwrap().unwrap().1, 6);
        assert_eq!(parse_resp_get(b"$-1\r\n"), Ok(Some((Reply::Miss, 5))));
        assert_eq!(parse_resp_get(b"*-1\r\n"), Ok(Some((Reply::Miss, 5))));
        assert_eq!(parse_resp_get(b"_\r\n"), Ok(Some((Reply::Miss, 3))));
        // An array is skipped whole so the stream stays in sync.
        let arr = b"*2\r\n$1\r\na\r\n*1\r\n:5\r\n$-1\r\n";
        assert_eq!(
            parse_resp_get(arr),
            Ok(Some((
                Reply::Error("unexpected reply to GET: array of 2".into()),
                19
            )))
        );
        assert_eq!(parse_resp_get(&arr[..15]), Ok(None));
        assert!(parse_resp_get(b"$3\r\nabcd\r\n").is_err());
        assert!(parse_resp_get(b"$x\r\n").is_err());
        assert!(parse_resp_get(b"?1\r\n").is_err());
    }

    #[test]
    fn keys_and_values_are_deterministic_and_in_range() {
        let wl = Workload::new(1000, Some((10, 40)), 1, 300);
        let (mut k, mut k2, mut v, mut v2) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        let mut lens = std::collections::HashSet::new();
        for id in 1..=1000 {
            wl.key(id, &mut k);
            wl.key(id, &mut k2);
            assert_eq!(k, k2);
            assert!((10..=40).contains(&k.len()), "{}", printable(&k));
            assert!(k.iter().all(|c| c.is_ascii_graphic()));
            assert!(seen.insert(k.clone()), "duplicate key");
            wl.value(id, &mut v);
            wl.value(id, &mut v2);
            assert_eq!(v, v2);
            assert!((1..=300).contains(&v.len()));
            assert_eq!(v.len(), wl.value_len(id));
            lens.insert(v.len());
        }
        assert!(lens.len() > 100, "sizes should spread over the range");
        let plain = Workload::new(5, None, 100, 100);
        plain.key(42, &mut k);
        assert_eq!(k, b"42");
        plain.value(42, &mut v);
        assert_eq!(v.len(), 100);
        assert!(v.starts_with(b"42:"));
        plain.value(43, &mut v2);
        assert_ne!(v, v2);
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::new();
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=100_000u64 {
            h.record(v * 1000);
        }
        for (q, want) in [
            (0.5, 50_000_000u64),
            (0.99, 99_000_000),
            (0.999, 99_900_000),
        ] {
            let got = h.quantile(q);
            let err = (got as f64 - want as f64).abs() / want as f64;
            assert!(err < 1.0 / 60.0, "q{q}: {got} vs {want}");
        }
        for v in [0u64, 1, 127, 128, 129, 1 << 20, u64::MAX] {
            let i = Histogram::index(v);
            assert!(i < BUCKETS);
            assert!(Histogram::highest(i) >= v);
            assert!(i == 0 || Histogram::highest(i - 1) < v);
        }
        let mut other = Histogram::new();
        other.record(5);
        h.merge(&other);
        assert_eq!(h.total, 100_001);
    }

    /// A canned "server": replies are taken from `replies`, requests go to `sent`.
    struct Fake {
        replies: io::Cursor<Vec<u8>>,
        sent: Vec<u8>,
    }
    impl Read for Fake {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            // Dribble a few bytes at a time to exercise partial replies.
            let n = b.len().min(3);
            self.replies.read(&mut b[..n])
        }
    }
    impl Write for Fake {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.sent.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn connection_counts_hits_misses_mismatches_and_errors() {
        let wl = Workload::new(8, None, 4, 4);
        // Connection 1 of 2 does keys 2, 4, 6, 8.
        let mut replies = Vec::new();
        let mut v = Vec::new();
        wl.value(2, &mut v);
        let _ = write!(replies_str(&mut replies), "VALUE 2 {} 4\r\n", wl.flags(2));
        replies.extend_from_slice(&v);
        replies.extend_from_slice(b"\r\nEND\r\n"); // key 2: good
        replies.extend_from_slice(b"END\r\n"); // key 4: miss
        let _ = write!(
            replies_str(&mut replies),
            "VALUE 6 {} 4\r\nxxxx\r\nEND\r\n",
            wl.flags(6)
        ); // mismatch
        replies.extend_from_slice(b"SERVER_ERROR busy\r\n"); // key 8: error
        let mut fake = Fake {
            replies: io::Cursor::new(replies),
            sent: Vec::new(),
        };
        let cfg = ConnConfig::plain(Protocol::Memcache, Phase::Get, 2, 3, 8);
        let r = run_connection(
            &mut fake,
            1,
            &cfg,
            &wl,
            &AtomicU64::new(0),
            &Barrier::new(1),
        );
        assert_eq!(fake.sent, b"get 2\r\nget 4\r\nget 6\r\nget 8\r\n");
        assert_eq!((r.ops, r.misses, r.mismatches, r.errors), (4, 1, 1, 1));
        assert_eq!((r.gets, r.sets, r.hits, r.bytes), (4, 0, 2, 8));
        assert_eq!(r.hist.total, 4);

        // A server that hangs up mid-reply is one error, and no panic.
        let mut fake = Fake {
            replies: io::Cursor::new(b"+OK\r\n+O".to_vec()),
            sent: Vec::new(),
        };
        let cfg = ConnConfig::plain(Protocol::Resp, Phase::Set, 1, 1, 8);
        let r = run_connection(
            &mut fake,
            0,
            &cfg,
            &wl,
            &AtomicU64::new(0),
            &Barrier::new(1),
        );
        assert_eq!((r.ops, r.errors), (1, 1));
        assert!(
            fake.sent
                .starts_with(b"*3\r\n$3\r\nSET\r\n$1\r\n1\r\n$4\r\n1:")
        );
    }

    #[test]
    fn permutation_is_a_bijection_and_moves_keys() {
        for n in [1u64, 2, 3, 5, 16, 17, 1000, 4097] {
            let p = Permutation::new(n, 7);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let x = p.at(i);
                assert!(x < n, "n {n}: {i} -> {x}");
                assert!(!seen[x as usize], "n {n}: {x} twice");
                seen[x as usize] = true;
            }
        }
        let p = Permutation::new(10_000, 7);
        let fixed = (0..10_000).filter(|&i| p.at(i) == i).count();
        assert!(fixed < 50, "{fixed} fixed points");
        let q = Permutation::new(10_000, 8);
        assert!((0..100).any(|i| p.at(i) != q.at(i)), "the seed must matter");
    }

    #[test]
    fn zipf_frequencies_follow_the_law() {
        for (n, s) in [(1000u64, 0.99), (50, 1.0), (200, 1.5), (10, 0.5)] {
            let z = Zipf::new(n, s);
            let mut rng = Rng::new(3, 0);
            let draws = 200_000;
            let mut counts = vec![0u64; n as usize + 1];
            for _ in 0..draws {
                let k = z.sample(&mut rng);
                assert!((1..=n).contains(&k));
                counts[k as usize] += 1;
            }
            let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
            for k in [1u64, 2, 3, 10] {
                let want = draws as f64 * (k as f64).powf(-s) / norm;
                let got = counts[k as usize] as f64;
                // Five standard deviations of a binomial count.
                let tol = 5.0 * want.sqrt() + 1.0;
                assert!(
                    (got - want).abs() < tol,
                    "n {n} s {s} rank {k}: {got} vs {want:.0}"
                );
            }
        }
    }

    #[test]
    fn key_sources_split_the_work() {
        let keys = 103;
        // Random order: the connections together visit every key exactly once.
        let mut cfg = ConnConfig::plain(Protocol::Memcache, Phase::Get, 4, 1, keys);
        cfg.order = Some(Arc::new(Permutation::new(keys, 9)));
        let mut seen = std::collections::HashSet::new();
        let mut first = Vec::new();
        for idx in 0..4 {
            let mut src = cfg.source(idx, keys);
            while let Some((op, id)) = src.next() {
                assert_eq!(op, Op::Get);
                assert!((1..=keys).contains(&id));
                assert!(seen.insert(id), "key {id} twice");
                if first.len() < 10 {
                    first.push(id);
                }
            }
        }
        assert_eq!(seen.len() as u64, keys);
        assert_ne!(first, (1..=10).collect::<Vec<_>>());
        // Mixed: the requests are shared out exactly, GETs at about the asked fraction.
        let mut cfg = ConnConfig::plain(Protocol::Memcache, Phase::Mixed, 3, 1, keys);
        cfg.requests = 10_001;
        cfg.get_fraction = 0.9;
        let (mut gets, mut total) = (0, 0);
        for idx in 0..3 {
            let mut src = cfg.source(idx, keys);
            while let Some((op, id)) = src.next() {
                assert!((1..=keys).contains(&id));
                total += 1;
                gets += u64::from(op == Op::Get);
            }
        }
        assert_eq!(total, 10_001);
        assert!((8_700..9_300).contains(&gets), "{gets} gets");
        // Zipf draws land on keys in range, the hottest one far more often than the median.
        cfg.zipf = Some(Arc::new(Zipf::new(keys, 0.99)));
        cfg.get_fraction = 1.0;
        let mut counts = vec![0u64; keys as usize + 1];
        let mut src = cfg.source(0, keys);
        while let Some((op, id)) = src.next() {
            assert_eq!(op, Op::Get);
            counts[id as usize] += 1;
        }
        let mut sorted = counts[1..].to_vec();
        sorted.sort_unstable();
        assert!(sorted[sorted.len() - 1] > 10 * sorted[sorted.len() / 2].max(1));
    }

    #[test]
    fn set_on_miss_refills_the_missed_key() {
        let wl = Workload::new(4, None, 4, 4);
        let mut cfg = ConnConfig::plain(Protocol::Resp, Phase::Mixed, 1, 1, 4);
        cfg.requests = 2;
        cfg.get_fraction = 1.0;
        cfg.set_on_miss = true;
        // GET misses, the SET of the same key is stored, the second GET misses too and
        // its SET is stored.
        let mut fake = Fake {
            replies: io::Cursor::new(b"$-1\r\n+OK\r\n$-1\r\n+OK\r\n".to_vec()),
            sent: Vec::new(),
        };
        let r = run_connection(
            &mut fake,
            0,
            &cfg,
            &wl,
            &AtomicU64::new(0),
            &Barrier::new(1),
        );
        assert_eq!((r.ops, r.gets, r.sets, r.misses, r.errors), (4, 2, 2, 2, 0));
        let sent = String::from_utf8_lossy(&fake.sent).to_string();
        let cmds: Vec<&str> = sent
            .matches("$3\r\nGET")
            .chain(sent.matches("$3\r\nSET"))
            .collect();
        assert_eq!(cmds.len(), 4, "{sent}");
        let first_get_key = sent.split("\r\n").nth(4).unwrap().to_string();
        let first_set_key = sent
            .split("*3\r\n")
            .nth(1)
            .unwrap()
            .split("\r\n")
            .nth(3)
            .unwrap()
            .to_string();
        assert_eq!(first_get_key, first_set_key, "{sent}");
    }

    #[test]
    fn transaction_replies() {
        let ok = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n+OK\r\n";
        assert_eq!(parse_resp_tx(ok, 2), Ok(Some((Reply::Stored, ok.len()))));
        // Every prefix needs more bytes.
        for n in 0..ok.len() {
            assert_eq!(parse_resp_tx(&ok[..n], 2), Ok(None), "prefix {n}");
        }
        // A failed SET inside EXEC, a refused queuing, EXECABORT, a null EXEC, a short EXEC:
        // each is one error once the whole transaction's replies are read.
        let cases: [(&[u8], &str); 5] = [
            (
                b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n-ERR oom\r\n",
                "inside EXEC",
            ),
            (
                b"+OK\r\n+QUEUED\r\n-ERR nope\r\n-EXECABORT x\r\n",
                "after MULTI",
            ),
            (
                b"+OK\r\n+QUEUED\r\n+QUEUED\r\n-EXECABORT x\r\n",
                "EXEC answered -EXECABORT",
            ),
            (b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*-1\r\n", "EXEC answered nil"),
            (
                b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*1\r\n+OK\r\n",
                "1 replies for 2",
            ),
        ];
        for (buf, what) in cases {
            match parse_resp_tx(&[buf, b"+OK\r\n".as_slice()].concat(), 2) {
                Ok(Some((Reply::Error(msg), used))) => {
                    assert!(msg.contains(what), "{msg:?} should name {what:?}");
                    assert_eq!(used, buf.len(), "{what}");
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn multi_sends_transactions_and_counts_their_sets() {
        let wl = Workload::new(5, None, 4, 4);
        let mut cfg = ConnConfig::plain(Protocol::Resp, Phase::Set, 1, 2, 5);
        cfg.multi = 2;
        // Keys 1..=5 in transactions of 2, two transactions per batch: [1 2] [3 4], then [5].
        let tx = |k: usize| {
            let mut r = b"+OK\r\n".to_vec();
            for _ in 0..k {
                r.extend_from_slice(b"+QUEUED\r\n");
            }
            r.extend_from_slice(format!("*{k}\r\n").as_bytes());
            for _ in 0..k {
                r.extend_from_slice(b"+OK\r\n");
            }
            r
        };
        let mut replies = tx(2);
        replies.extend(tx(2));
        replies.extend(b"+OK\r\n+QUEUED\r\n-EXECABORT Transaction discarded\r\n");
        let mut fake = Fake {
            replies: io::Cursor::new(replies),
            sent: Vec::new(),
        };
        let r = run_connection(
            &mut fake,
            0,
            &cfg,
            &wl,
            &AtomicU64::new(0),
            &Barrier::new(1),
        );
        assert_eq!((r.ops, r.sets, r.transactions, r.errors), (5, 5, 3, 1));
        assert_eq!(r.bytes, 16, "the stored SETs' value bytes");
        let sent = String::from_utf8_lossy(&fake.sent).into_owned();
        assert_eq!(sent.matches("MULTI").count(), 3, "{sent}");
        assert_eq!(sent.matches("EXEC").count(), 3, "{sent}");
        let order: Vec<&str> = sent
            .split("\r\n")
            .filter(|w| ["MULTI", "SET", "EXEC"].contains(w))
            .collect();
        assert_eq!(
            order,
            [
                "MULTI", "SET", "SET", "EXEC", "MULTI", "SET", "SET", "EXEC", "MULTI", "SET",
                "EXEC"
            ]
        );
    }

    #[test]
    fn queue_messages_pops_and_bits() {
        let wl = Workload::new(10, None, 8, 8);
        let (mut v, mut msg) = (Vec::new(), Vec::new());
        encode_message(&wl, 7, 12345, &mut v, &mut msg);
        assert!(msg.starts_with(b"7:12345:"));
        assert_eq!(decode_message(&wl, &msg, &mut v), Some((7, 12345)));
        let mut bad = msg.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(decode_message(&wl, &bad, &mut v), None, "a changed byte");
        assert_eq!(
            decode_message(&wl, b"11:1:x", &mut v),
            None,
            "an id never pushed"
        );
        assert_eq!(decode_message(&wl, b"7:1", &mut v), None, "a cut message");

        let item = b"*2\r\n$1\r\nq\r\n$3\r\nabc\r\n";
        assert_eq!(
            parse_resp_pop(item),
            Ok(Some((Pop::Item(15..18), item.len())))
        );
        assert_eq!(parse_resp_pop(&item[..item.len() - 1]), Ok(None));
        assert_eq!(parse_resp_pop(b"*-1\r\n"), Ok(Some((Pop::Empty, 5))));
        assert!(matches!(
            parse_resp_pop(b"-ERR nope\r\n"),
            Ok(Some((Pop::Error(_), 11)))
        ));
        assert_eq!(parse_resp_push(b":3\r\n"), Ok(Some((Reply::Stored, 4))));
        assert!(matches!(
            parse_resp_push(b"-OOM full\r\n"),
            Ok(Some((Reply::Error(_), 11)))
        ));

        let (a, b) = (Bits::new(130), Bits::new(130));
        assert!(!a.set(1) && !a.set(65) && !a.set(130));
        assert!(a.set(65), "a second set reports the first");
        assert!(a.set(0) && a.set(131), "ids out of range are never new");
        assert!(!b.set(65));
        assert_eq!(a.count_missing_from(&b), 2);
    }

    /// `write!` into a byte vector.
    fn replies_str(v: &mut Vec<u8>) -> impl std::fmt::Write + '_ {
        struct W<'a>(&'a mut Vec<u8>);
        impl std::fmt::Write for W<'_> {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                self.0.extend_from_slice(s.as_bytes());
                Ok(())
            }
        }
        W(v)
    }
}
