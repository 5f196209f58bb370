//! Crash safety: a real memkeep is killed with SIGKILL again and again on one data directory --
//! at a random moment under write load on both protocols, during startup, and while the expiry
//! sweep deletes items -- and after every restart the whole keyspace is compared with an exact
//! client-side model.
//!
//! How the model stays exact: every client connection owns its keys and does one request at a
//! time, so its thread knows each key's last acknowledged state, and at most one of its writes
//! is unacknowledged when the server dies. For the key (or keys, for MSET) of that write the
//! state before it and the state after it are both acceptable, and nothing else: anything else
//! is a lost acknowledged write, a half-done write or a foreign value. Values carry the writing
//! connection and a sequence number, so a stale or mixed-up value cannot pass. memcached CAS
//! uniques read with `gets` must come back unchanged after a restart, every write's CAS must
//! exceed every CAS its connection saw before it, and the first CAS handed out after a restart
//! must exceed every CAS seen before.
//!
//! `MEMKEEP_CRASH_KILLS` sets the number of kills of the `--sync always` run (default 6; the
//! runs in `periodic` and `never` mode get a sixth of it, at least 2), `MEMKEEP_CRASH_SEED`
//! replays the random choices of a run (the kill moments still depend on timing). `make crash`
//! runs 60 kills.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{Options, Server, now_ms};

const BIN: &str = env!("CARGO_BIN_EXE_memkeep");
/// Read and write timeout of every test socket: a lost reply fails the test instead of hanging.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections per protocol, each with its own thread and keys.
const MC_CONNS: usize = 4;
const RESP_CONNS: usize = 4;
/// Keys per memcached connection; strings, lists and hashes per RESP connection.
const MC_KEYS: usize = 16;
/// The load's connections: the first models; sweep rounds add models of their own after them.
const LOAD_CONNS: usize = MC_CONNS + RESP_CONNS;
const R_STRS: usize = 6;
const R_LISTS: usize = 5;
const R_HASHES: usize = 5;
/// Most requests one connection sends in one load round (a bound in case the kill never comes).
const MAX_OPS_PER_ROUND: usize = 50_000;
/// Keys written for an expiry-sweep kill; most expire after 1 s.
const SWEEP_KEYS: usize = 5000;
/// Expired sweep keys still checked in later rounds (all are checked once, after the kill).
const SWEEP_KEEP_GONE: usize = 100;
/// Slack in ms when comparing an expiry time read back with the window it was set in.
const EXP_SLACK: u64 = 50;
/// Values longer than this are replaced rather than appended to.
const APPEND_LIMIT: usize = 200_000;
/// Open upper end of an expiry window whose write has not been answered yet.
const OPEN: u64 = u64::MAX;

// ---------------------------------------------------------------------------------------------
// Random numbers

/// splitmix64: small, seedable, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }

    fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    fn fork(&mut self) -> Rng {
        Rng(self.next())
    }

    /// Random bytes (any byte, CR and LF included) of a length that is mostly small, sometimes
    /// a few pages and now and then large enough for LMDB overflow pages.
    fn filler(&mut self) -> Vec<u8> {
        let len = match self.below(100) {
            0..60 => self.below(100),
            60..90 => self.range(100, 3000),
            90..98 => self.range(3000, 20_000),
            _ => self.range(20_000, 150_000),
        } as usize;
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(len);
        v
    }

    fn flags(&mut self) -> u32 {
        match self.below(3) {
            0 => 0,
            1 => self.below(100) as u32,
            _ => self.next() as u32,
        }
    }

    /// A memcached exptime: mostly none, else far enough ahead that no key of the load expires
    /// during a run (relative seconds, below memcached's 30-day limit).
    fn exptime(&mut self) -> u64 {
        if self.pct(70) {
            0
        } else {
            self.range(1000, 100_000)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Clients: any I/O error means the server went away, except InvalidData (a malformed reply),
// which is a failure of its own.

struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Conn {
    fn open(addr: SocketAddr) -> io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Conn {
            r: BufReader::with_capacity(256 * 1024, s.try_clone()?),
            w: s,
        })
    }

    fn must_open(addr: SocketAddr) -> Conn {
        Conn::open(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    }

    fn send(&mut self, b: &[u8]) -> io::Result<()> {
        self.w.write_all(b)
    }

    /// One reply line without its CRLF; EOF (also in mid-line) is an error.
    fn line(&mut self) -> io::Result<Vec<u8>> {
        let mut l = Vec::new();
        self.r.read_until(b'\n', &mut l)?;
        if !l.ends_with(b"\r\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        l.truncate(l.len() - 2);
        Ok(l)
    }

    /// `n` bytes of data and their CRLF.
    fn block(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut b = vec![0; n + 2];
        self.r.read_exact(&mut b)?;
        if &b[n..] != b"\r\n" {
            return Err(bad(format!("data block of {n} bytes not followed by CRLF")));
        }
        b.truncate(n);
        Ok(b)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A value for messages: its start and its length.
fn brief(v: &[u8]) -> String {
    let head = &v[..v.len().min(24)];
    format!("{:?}..({} bytes)", text(head), v.len())
}

fn store_req(
    cmd: &str,
    key: &str,
    flags: u32,
    exptime: u64,
    value: &[u8],
    cas: Option<u64>,
) -> Vec<u8> {
    let mut r = match cas {
        Some(c) => format!("{cmd} {key} {flags} {exptime} {} {c}\r\n", value.len()),
        None => format!("{cmd} {key} {flags} {exptime} {}\r\n", value.len()),
    }
    .into_bytes();
    r.extend_from_slice(value);
    r.extend_from_slice(b"\r\n");
    r
}

/// What `gets` returned for one key: flags, value, CAS unique.
type Got = (u32, Vec<u8>, u64);

/// memcached `gets` of `keys`.
fn mc_gets(c: &mut Conn, keys: &[String]) -> io::Result<HashMap<String, Got>> {
    c.send(format!("gets {}\r\n", keys.join(" ")).as_bytes())?;
    let mut got = HashMap::new();
    loop {
        let l = c.line()?;
        if l == b"END" {
            return Ok(got);
        }
        let t = text(&l);
        let f: Vec<&str> = t.split(' ').collect();
        let parsed = (f.len() == 5 && f[0] == "VALUE")
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?, f[4].parse().ok()?)))
            .flatten();
        let Some((flags, len, cas)) = parsed else {
            return Err(bad(format!("unexpected gets reply line {t:?}")));
        };
        let v = c.block(len)?;
        got.insert(f[1].to_string(), (flags, v, cas));
    }
}

/// `stats` `curr_items` (items in the store, expired ones not yet swept included).
fn curr_items(c: &mut Conn) -> u64 {
    c.send(b"stats\r\n").expect("send stats");
    let mut n = None;
    loop {
        let l = text(&c.line().expect("stats reply"));
        if l == "END" {
            return n.expect("stats without curr_items");
        }
        if let Some(v) = l.strip_prefix("STAT curr_items ") {
            n = v.parse().ok();
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum R {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Arr(Option<Vec<R>>),
}

fn resp_req(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn resp_read(c: &mut Conn) -> io::Result<R> {
    let l = c.line()?;
    if l.is_empty() {
        return Err(bad("empty RESP reply line".into()));
    }
    let rest = text(&l[1..]);
    let num = || -> io::Result<i64> {
        rest.parse()
            .map_err(|_| bad(format!("bad number in {:?}", text(&l))))
    };
    Ok(match l[0] {
        b'+' => R::Simple(rest.clone()),
        b'-' => R::Err(rest.clone()),
        b':' => R::Int(num()?),
        b'$' => match num()? {
            -1 => R::Bulk(None),
            n => R::Bulk(Some(c.block(n as usize)?)),
        },
        b'*' => match num()? {
            -1 => R::Arr(None),
            n => {
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(resp_read(c)?);
                }
                R::Arr(Some(items))
            }
        },
        _ => return Err(bad(format!("unknown RESP reply {:?}", text(&l)))),
    })
}

fn resp_show(r: &R) -> String {
    match r {
        R::Bulk(Some(v)) => format!("Bulk({})", brief(v)),
        other => {
            let s = format!("{other:?}");
            if s.len() > 200 {
                format!("{}...", &s[..200])
            } else {
                s
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The model

/// When an item expires: never, or at a unix ms time inside a window (the server takes its
/// clock when it commits, somewhere between request and reply).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Exp {
    Never,
    At(u64, u64),
}

impl Exp {
    /// The window of an exptime sent at `t0` (upper end still open).
    fn of(exptime: u64, t0: u64) -> Exp {
        if exptime == 0 {
            Exp::Never
        } else {
            Exp::At(t0 + exptime * 1000, OPEN)
        }
    }

    fn matches(self, seen: Exp) -> bool {
        match (self, seen) {
            (Exp::Never, Exp::Never) => true,
            (Exp::At(lo, hi), Exp::At(slo, shi)) => {
                slo <= hi.saturating_add(EXP_SLACK) && shi + EXP_SLACK >= lo
            }
            _ => false,
        }
    }

    /// Closes an open window: the write was sent at `t0` and answered (or found dead) at `t1`.
    fn close(self, t0: u64, t1: u64) -> Exp {
        match self {
            Exp::At(lo, OPEN) => Exp::At(lo, lo + (t1 - t0)),
            e => e,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct McItem {
    value: Vec<u8>,
    flags: u32,
    exp: Exp,
}

/// What is known of a memcached item's CAS unique.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cas {
    /// Read back with `gets` after the item's last write.
    Exact(u64),
    /// Not read back; the write came after the connection had seen this CAS.
    Above(u64),
}

impl Cas {
    fn admits(self, c: u64) -> bool {
        match self {
            Cas::Exact(e) => c == e,
            Cas::Above(f) => c > f,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum RVal {
    Str(Vec<u8>, Exp),
    List(VecDeque<Vec<u8>>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Mc(Option<McItem>, Cas),
    R(Option<RVal>),
}

impl State {
    fn present(&self) -> bool {
        matches!(self, State::Mc(Some(_), _) | State::R(Some(_)))
    }

    fn close(&mut self, t0: u64, t1: u64) {
        match self {
            State::Mc(Some(it), _) => it.exp = it.exp.close(t0, t1),
            State::R(Some(RVal::Str(_, e))) => *e = e.close(t0, t1),
            _ => {}
        }
    }

    fn show(&self) -> String {
        match self {
            State::Mc(None, _) | State::R(None) => "missing".into(),
            State::Mc(Some(it), cas) => format!(
                "value {} flags {} exp {:?} cas {cas:?}",
                brief(&it.value),
                it.flags,
                it.exp
            ),
            State::R(Some(RVal::Str(v, e))) => format!("string {} exp {e:?}", brief(v)),
            State::R(Some(RVal::List(l))) => format!(
                "list of {}: [{}]",
                l.len(),
                l.iter().map(|e| brief(e)).collect::<Vec<_>>().join(", ")
            ),
            State::R(Some(RVal::Hash(h))) => format!(
                "hash of {}: {{{}}}",
                h.len(),
                h.iter()
                    .map(|(f, v)| format!("{}: {}", text(f), brief(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// What the server holds under a key after a restart.
#[derive(Debug, Clone)]
enum Seen {
    /// memcached item and its CAS unique (expiry as read with PTTL).
    Mc(Option<(McItem, u64)>),
    R(Option<RVal>),
}

impl Seen {
    fn show(&self) -> String {
        match self {
            Seen::Mc(None) | Seen::R(None) => "missing".into(),
            Seen::Mc(Some((it, cas))) => State::Mc(Some(it.clone()), Cas::Exact(*cas)).show(),
            Seen::R(v) => State::R(v.clone()).show(),
        }
    }
}

/// Whether the server's `seen` state is the modelled `state`.
fn admits(state: &State, seen: &Seen) -> bool {
    match (state, seen) {
        (State::Mc(None, _), Seen::Mc(None)) => true,
        (State::Mc(Some(it), cas), Seen::Mc(Some((s, c)))) => {
            it.value == s.value && it.flags == s.flags && it.exp.matches(s.exp) && cas.admits(*c)
        }
        (State::R(None), Seen::R(None)) => true,
        (State::R(Some(RVal::Str(v, e))), Seen::R(Some(RVal::Str(sv, se)))) => {
            v == sv && e.matches(*se)
        }
        (State::R(Some(a)), Seen::R(Some(b))) if !matches!(a, RVal::Str(..)) => a == b,
        _ => false,
    }
}

/// The model after `seen` was found to match `state`: memcached CAS uniques become exact.
fn settle(state: &State, seen: &Seen) -> State {
    match (state, seen) {
        (State::Mc(it, _), Seen::Mc(Some((_, c)))) => State::Mc(it.clone(), Cas::Exact(*c)),
        _ => state.clone(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Proto {
    Mc,
    Resp,
}

/// RESP key kinds, fixed by key name.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RKind {
    Str,
    List,
    Hash,
}

/// A write sent whose reply has not been read.
struct Inflight {
    what: String,
    after: Vec<(usize, State)>,
}

/// One connection's keys and what is known about them.
struct Model {
    name: String,
    proto: Proto,
    keys: Vec<String>,
    kinds: Vec<RKind>,
    states: Vec<State>,
    /// Largest CAS unique this connection has seen.
    max_cas: u64,
    /// Values written so far: makes each value unique.
    seq: u64,
    inflight: Option<Inflight>,
    /// Acknowledged writes.
    acked: u64,
    /// Written by a sweep round and not verified yet (then trimmed).
    sweep_fresh: bool,
}

impl Model {
    fn mc(name: String, keys: Vec<String>) -> Model {
        let n = keys.len();
        Model {
            name,
            proto: Proto::Mc,
            keys,
            kinds: vec![RKind::Str; n],
            states: vec![State::Mc(None, Cas::Above(0)); n],
            max_cas: 0,
            seq: 0,
            inflight: None,
            acked: 0,
            sweep_fresh: false,
        }
    }

    fn resp(id: usize) -> Model {
        let mut keys = Vec::new();
        let mut kinds = Vec::new();
        for (kind, n, tag) in [
            (RKind::Str, R_STRS, "s"),
            (RKind::List, R_LISTS, "l"),
            (RKind::Hash, R_HASHES, "h"),
        ] {
            for i in 0..n {
                keys.push(format!("r{id}:{tag}{i}"));
                kinds.push(kind);
            }
        }
        let n = keys.len();
        Model {
            name: format!("resp conn {id}"),
            proto: Proto::Resp,
            keys,
            kinds,
            states: vec![State::R(None); n],
            max_cas: 0,
            seq: 0,
            inflight: None,
            acked: 0,
            sweep_fresh: false,
        }
    }

    fn mc_state(&self, i: usize) -> (Option<McItem>, Cas) {
        match &self.states[i] {
            State::Mc(it, cas) => (it.clone(), *cas),
            State::R(_) => panic!("{}: key {} is not a memcached key", self.name, self.keys[i]),
        }
    }

    fn r_state(&self, i: usize) -> Option<RVal> {
        match &self.states[i] {
            State::R(v) => v.clone(),
            State::Mc(..) => panic!("{}: key {} is not a RESP key", self.name, self.keys[i]),
        }
    }

    /// A fresh value: a unique tag, then random bytes.
    fn value(&mut self, rng: &mut Rng) -> Vec<u8> {
        self.seq += 1;
        let mut v = format!("<{}#{}>", self.name.replace(' ', ""), self.seq).into_bytes();
        v.extend(rng.filler());
        v
    }

    /// A short unique element or append: the tag and up to 40 random bytes.
    fn piece(&mut self, rng: &mut Rng) -> Vec<u8> {
        self.seq += 1;
        let mut v = format!("<{}#{}>", self.name.replace(' ', ""), self.seq).into_bytes();
        let n = rng.below(40) as usize;
        v.extend((0..n).map(|_| rng.next() as u8));
        v
    }

    /// Sends one write and reads its reply. Until the reply is read the write is in flight; a
    /// reply that differs from `expect` fails the test (the model predicts every reply).
    #[allow(clippy::too_many_arguments)]
    fn write<T: PartialEq + std::fmt::Debug>(
        &mut self,
        c: &mut Conn,
        what: String,
        req: &[u8],
        t0: u64,
        after: Vec<(usize, State)>,
        expect: T,
        read: impl FnOnce(&mut Conn) -> io::Result<T>,
    ) -> io::Result<()> {
        self.inflight = Some(Inflight { what, after });
        let reply = c.send(req).and_then(|()| read(c));
        let t1 = now_ms();
        let inflight = self.inflight.as_mut().expect("in flight");
        for (_, st) in &mut inflight.after {
            st.close(t0, t1);
        }
        let reply = reply?;
        let inflight = self.inflight.take().expect("in flight");
        assert!(
            reply == expect,
            "{}: {}: expected reply {expect:?}, got {reply:?}",
            self.name,
            inflight.what
        );
        for (i, st) in inflight.after {
            self.states[i] = st;
        }
        self.acked += 1;
        Ok(())
    }

    fn mc_write(
        &mut self,
        c: &mut Conn,
        what: String,
        req: &[u8],
        t0: u64,
        after: Vec<(usize, State)>,
        expect: &str,
    ) -> io::Result<()> {
        self.write(c, what, req, t0, after, expect.to_string(), |c| {
            c.line().map(|l| text(&l))
        })
    }

    fn resp_write(
        &mut self,
        c: &mut Conn,
        args: &[&[u8]],
        t0: u64,
        after: Vec<(usize, State)>,
        expect: R,
    ) -> io::Result<()> {
        let what = args
            .iter()
            .take(2)
            .map(|a| text(a))
            .collect::<Vec<_>>()
            .join(" ");
        self.write(c, what, &resp_req(args), t0, after, expect, resp_read)
    }

    /// `gets` one key right after its writes: it must hold the modelled state, and its CAS
    /// becomes known exactly.
    fn mc_observe(&mut self, c: &mut Conn, i: usize) -> io::Result<()> {
        let key = self.keys[i].clone();
        let got = mc_gets(c, std::slice::from_ref(&key))?;
        let (item, cas) = self.mc_state(i);
        match (&item, got.get(&key)) {
            (None, None) => {}
            (Some(it), Some((flags, value, c))) if it.value == *value && it.flags == *flags => {
                assert!(
                    cas.admits(*c),
                    "{}: gets {key}: CAS {c} out of order (expected {cas:?})",
                    self.name
                );
                self.states[i] = State::Mc(item.clone(), Cas::Exact(*c));
                self.max_cas = self.max_cas.max(*c);
            }
            (_, got) => panic!(
                "{}: gets {key} right after its acknowledged writes: expected {}, got {:?}",
                self.name,
                self.states[i].show(),
                got.map(|(f, v, c)| format!("flags {f} value {} cas {c}", brief(v)))
            ),
        }
        Ok(())
    }
}

/// memcached's counter rule: digits with optional surrounding whitespace, fitting a u64.
fn counter(v: &[u8]) -> Option<u64> {
    let t = v.trim_ascii();
    if t.is_empty() || t.len() > 20 || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// A RESP integer string: exactly how Redis prints an i64.
fn resp_int(v: &[u8]) -> Option<i64> {
    let n: i64 = std::str::from_utf8(v).ok()?.parse().ok()?;
    (n.to_string().as_bytes() == v).then_some(n)
}

// ---------------------------------------------------------------------------------------------
// Load: one random write (and sometimes a read) per step

fn mc_step(m: &mut Model, c: &mut Conn, rng: &mut Rng) -> io::Result<()> {
    let i = rng.below(m.keys.len() as u64) as usize;
    let key = m.keys[i].clone();
    let (item, cas) = m.mc_state(i);
    let t0 = now_ms();
    let floor = m.max_cas;
    let fresh = |it: McItem| State::Mc(Some(it), Cas::Above(floor));
    let same = State::Mc(item.clone(), cas);
    let mut roll = rng.below(100);
    if (38..62).contains(&roll)
        && item
            .as_ref()
            .is_some_and(|it| it.value.len() > APPEND_LIMIT)
    {
        roll = 0;
    }
    if (50..62).contains(&roll) && item.as_ref().is_some_and(|it| counter(&it.value).is_none()) {
        roll = 90;
    }
    match roll {
        // set, sometimes with a number to count with
        0..25 | 85..100 => {
            let flags = rng.flags();
            let exptime = rng.exptime();
            let value = if roll >= 85 {
                rng.below(1_000_000_000).to_string().into_bytes()
            } else {
                m.value(rng)
            };
            let req = store_req("set", &key, flags, exptime, &value, None);
            let exp = Exp::of(exptime, t0);
            let after = fresh(McItem { value, flags, exp });
            m.mc_write(
                c,
                format!("set {key}"),
                &req,
                t0,
                vec![(i, after)],
                "STORED",
            )?;
        }
        // add / replace
        25..38 => {
            let add = roll < 33;
            let flags = rng.flags();
            let exptime = rng.exptime();
            let value = m.value(rng);
            let cmd = if add { "add" } else { "replace" };
            let req = store_req(cmd, &key, flags, exptime, &value, None);
            let stores = item.is_none() == add;
            let exp = Exp::of(exptime, t0);
            let (after, expect) = if stores {
                (fresh(McItem { value, flags, exp }), "STORED")
            } else {
                (same, "NOT_STORED")
            };
            m.mc_write(
                c,
                format!("{cmd} {key}"),
                &req,
                t0,
                vec![(i, after)],
                expect,
            )?;
        }
        // append / prepend: keep flags and expiry
        38..50 => {
            let append = roll < 44;
            let data = m.piece(rng);
            let cmd = if append { "append" } else { "prepend" };
            let req = store_req(cmd, &key, 0, 0, &data, None);
            let (after, expect) = match &item {
                None => (same, "NOT_STORED"),
                Some(it) => {
                    let value = if append {
                        [&it.value[..], &data[..]].concat()
                    } else {
                        [&data[..], &it.value[..]].concat()
                    };
                    (
                        fresh(McItem {
                            value,
                            ..it.clone()
                        }),
                        "STORED",
                    )
                }
            };
            m.mc_write(
                c,
                format!("{cmd} {key}"),
                &req,
                t0,
                vec![(i, after)],
                expect,
            )?;
        }
        // incr / decr: decr floors at 0 and pads a shorter result with spaces
        50..62 => {
            let incr = roll < 56;
            let delta = rng.below(1000);
            let cmd = if incr { "incr" } else { "decr" };
            let req = format!("{cmd} {key} {delta}\r\n").into_bytes();
            let (after, expect) = match &item {
                None => (same, "NOT_FOUND".to_string()),
                Some(it) => {
                    let n = counter(&it.value).expect("numeric, checked above");
                    let new = if incr {
                        n.wrapping_add(delta)
                    } else {
                        n.saturating_sub(delta)
                    };
                    let mut value = new.to_string().into_bytes();
                    if value.len() < it.value.len() {
                        value.resize(it.value.len(), b' ');
                    }
                    (
                        fresh(McItem {
                            value,
                            ..it.clone()
                        }),
                        new.to_string(),
                    )
                }
            };
            m.mc_write(
                c,
                format!("{cmd} {key}"),
                &req,
                t0,
                vec![(i, after)],
                &expect,
            )?;
        }
        62..70 => {
            let req = format!("delete {key}\r\n").into_bytes();
            let expect = if item.is_some() {
                "DELETED"
            } else {
                "NOT_FOUND"
            };
            let after = State::Mc(None, Cas::Above(floor));
            m.mc_write(
                c,
                format!("delete {key}"),
                &req,
                t0,
                vec![(i, after)],
                expect,
            )?;
        }
        // gets, then cas with that unique (now and then a stale one)
        70..80 => {
            m.mc_observe(c, i)?;
            let (item, cas) = m.mc_state(i);
            let floor = m.max_cas;
            let flags = rng.flags();
            let exptime = rng.exptime();
            let value = m.value(rng);
            let t0 = now_ms();
            let (unique, after, expect) = match (item, cas) {
                (Some(it), Cas::Exact(u)) => {
                    if rng.pct(15) {
                        (u + 1 + rng.below(1000), State::Mc(Some(it), cas), "EXISTS")
                    } else {
                        let exp = Exp::of(exptime, t0);
                        let st = State::Mc(
                            Some(McItem {
                                value: value.clone(),
                                flags,
                                exp,
                            }),
                            Cas::Above(floor),
                        );
                        (u, st, "STORED")
                    }
                }
                (None, cas) => (1 + rng.below(1 << 40), State::Mc(None, cas), "NOT_FOUND"),
                (Some(_), Cas::Above(_)) => unreachable!("gets made the CAS exact"),
            };
            let req = store_req("cas", &key, flags, exptime, &value, Some(unique));
            m.mc_write(c, format!("cas {key}"), &req, t0, vec![(i, after)], expect)?;
        }
        // touch: a new expiry, the same CAS unique
        _ => {
            let exptime = rng.exptime();
            let req = format!("touch {key} {exptime}\r\n").into_bytes();
            let (after, expect) = match item {
                None => (same, "NOT_FOUND"),
                Some(it) => {
                    let exp = Exp::of(exptime, t0);
                    (State::Mc(Some(McItem { exp, ..it }), cas), "TOUCHED")
                }
            };
            m.mc_write(
                c,
                format!("touch {key}"),
                &req,
                t0,
                vec![(i, after)],
                expect,
            )?;
        }
    }
    if rng.pct(50) {
        m.mc_observe(c, i)?;
    }
    Ok(())
}

fn resp_step(m: &mut Model, c: &mut Conn, rng: &mut Rng) -> io::Result<()> {
    let i = rng.below(m.keys.len() as u64) as usize;
    let key = m.keys[i].clone().into_bytes();
    let cur = m.r_state(i);
    let t0 = now_ms();
    let roll = rng.below(100);
    match m.kinds[i] {
        RKind::Str => {
            let (value, exp) = match &cur {
                Some(RVal::Str(v, e)) => (Some(v.clone()), *e),
                _ => (None, Exp::Never),
            };
            let mut roll = roll;
            if (30..45).contains(&roll) && value.as_ref().is_some_and(|v| resp_int(v).is_none()) {
                roll = 29; // SET a number first
            }
            if (45..65).contains(&roll) && value.as_ref().is_some_and(|v| v.len() > APPEND_LIMIT) {
                roll = 0;
            }
            match roll {
                0..30 => {
                    let v = if roll >= 20 {
                        rng.below(1_000_000_000).to_string().into_bytes()
                    } else {
                        m.value(rng)
                    };
                    let exptime = if rng.pct(30) {
                        rng.range(1000, 100_000)
                    } else {
                        0
                    };
                    let secs = exptime.to_string();
                    let mut args: Vec<&[u8]> = vec![b"SET", &key, &v];
                    if exptime > 0 {
                        args.extend([&b"EX"[..], secs.as_bytes()]);
                    }
                    let after = State::R(Some(RVal::Str(v.clone(), Exp::of(exptime, t0))));
                    m.resp_write(c, &args, t0, vec![(i, after)], R::Simple("OK".into()))?;
                }
                30..45 => {
                    let delta = rng.below(2000) as i64 - 1000;
                    let new = value.as_deref().and_then(resp_int).unwrap_or(0) + delta;
                    let d = delta.to_string();
                    let after = State::R(Some(RVal::Str(new.to_string().into_bytes(), exp)));
                    m.resp_write(
                        c,
                        &[b"INCRBY", &key, d.as_bytes()],
                        t0,
                        vec![(i, after)],
                        R::Int(new),
                    )?;
                }
                45..65 => {
                    let data = m.piece(rng);
                    let new = [value.as_deref().unwrap_or(b""), &data[..]].concat();
                    let n = new.len() as i64;
                    let after = State::R(Some(RVal::Str(new, exp)));
                    m.resp_write(
                        c,
                        &[b"APPEND", &key, &data],
                        t0,
                        vec![(i, after)],
                        R::Int(n),
                    )?;
                }
                65..80 => {
                    let n = i64::from(cur.is_some());
                    m.resp_write(c, &[b"DEL", &key], t0, vec![(i, State::R(None))], R::Int(n))?;
                }
                // MSET over two of this connection's strings: both or neither
                _ => {
                    let j = (i + 1 + rng.below(R_STRS as u64 - 1) as usize) % R_STRS;
                    let key2 = m.keys[j].clone().into_bytes();
                    let (v1, v2) = (m.value(rng), m.value(rng));
                    let after = vec![
                        (i, State::R(Some(RVal::Str(v1.clone(), Exp::Never)))),
                        (j, State::R(Some(RVal::Str(v2.clone(), Exp::Never)))),
                    ];
                    m.resp_write(
                        c,
                        &[b"MSET", &key, &v1, &key2, &v2],
                        t0,
                        after,
                        R::Simple("OK".into()),
                    )?;
                }
            }
        }
        RKind::List => {
            let list = match cur {
                Some(RVal::List(l)) => l,
                _ => VecDeque::new(),
            };
            let mut roll = roll;
            if roll < 55 && list.len() > 40 {
                roll = 60;
            }
            match roll {
                0..55 => {
                    let right = roll < 30;
                    let elems: Vec<Vec<u8>> = (0..1 + rng.below(4)).map(|_| m.piece(rng)).collect();
                    let mut new = list.clone();
                    for e in &elems {
                        if right {
                            new.push_back(e.clone());
                        } else {
                            new.push_front(e.clone());
                        }
                    }
                    let n = new.len() as i64;
                    let cmd: &[u8] = if right { b"RPUSH" } else { b"LPUSH" };
                    let mut args: Vec<&[u8]> = vec![cmd, &key];
                    args.extend(elems.iter().map(|e| &e[..]));
                    let after = State::R(Some(RVal::List(new)));
                    m.resp_write(c, &args, t0, vec![(i, after)], R::Int(n))?;
                }
                55..90 => {
                    let left = roll < 75;
                    let mut new = list.clone();
                    let popped = if left {
                        new.pop_front()
                    } else {
                        new.pop_back()
                    };
                    let after = State::R((!new.is_empty()).then_some(RVal::List(new)));
                    let cmd: &[u8] = if left { b"LPOP" } else { b"RPOP" };
                    m.resp_write(c, &[cmd, &key], t0, vec![(i, after)], R::Bulk(popped))?;
                }
                _ => {
                    let n = i64::from(!list.is_empty());
                    m.resp_write(c, &[b"DEL", &key], t0, vec![(i, State::R(None))], R::Int(n))?;
                }
            }
        }
        RKind::Hash => {
            let hash = match cur {
                Some(RVal::Hash(h)) => h,
                _ => BTreeMap::new(),
            };
            match roll {
                0..55 => {
                    let f1 = rng.below(8);
                    let f2 = (f1 + 1 + rng.below(7)) % 8;
                    let fields: Vec<Vec<u8>> = if rng.pct(50) { vec![f1] } else { vec![f1, f2] }
                        .into_iter()
                        .map(|f| format!("f{f}").into_bytes())
                        .collect();
                    let vals: Vec<Vec<u8>> = fields.iter().map(|_| m.piece(rng)).collect();
                    let mut new = hash.clone();
                    let mut added = 0;
                    let mut args: Vec<&[u8]> = vec![b"HSET", &key];
                    for (f, v) in fields.iter().zip(&vals) {
                        added += i64::from(new.insert(f.clone(), v.clone()).is_none());
                        args.extend([&f[..], &v[..]]);
                    }
                    let after = State::R(Some(RVal::Hash(new)));
                    m.resp_write(c, &args, t0, vec![(i, after)], R::Int(added))?;
                }
                55..85 => {
                    let f = format!("f{}", rng.below(8)).into_bytes();
                    let mut new = hash.clone();
                    let n = i64::from(new.remove(&f).is_some());
                    let after = State::R((!new.is_empty()).then_some(RVal::Hash(new)));
                    m.resp_write(c, &[b"HDEL", &key, &f], t0, vec![(i, after)], R::Int(n))?;
                }
                _ => {
                    let n = i64::from(!hash.is_empty());
                    m.resp_write(c, &[b"DEL", &key], t0, vec![(i, State::R(None))], R::Int(n))?;
                }
            }
        }
    }
    Ok(())
}

/// One connection's load: random steps until the connection dies (the kill) or the step bound.
/// Returns the number of steps.
fn worker(m: &mut Model, mut c: Conn, mut rng: Rng, killed: &AtomicBool) -> usize {
    for n in 0..MAX_OPS_PER_ROUND {
        let r = match m.proto {
            Proto::Mc => mc_step(m, &mut c, &mut rng),
            Proto::Resp => resp_step(m, &mut c, &mut rng),
        };
        if let Err(e) = r {
            assert!(
                e.kind() != io::ErrorKind::InvalidData,
                "{}: malformed reply: {e}",
                m.name
            );
            assert!(
                killed.load(Ordering::SeqCst),
                "{}: connection failed before the kill: {e}",
                m.name
            );
            return n;
        }
    }
    MAX_OPS_PER_ROUND
}

// ---------------------------------------------------------------------------------------------
// Verification after a restart

#[derive(Default)]
struct Totals {
    kills: usize,
    load_kills: usize,
    startup_kills: usize,
    /// Startup kills that came only after the server logged that it serves (so after its store
    /// opened and its ports were bound).
    startup_after_open: usize,
    sweep_kills: usize,
    /// Sweep kills that landed while expired items were still in the store.
    sweep_mid: usize,
    restarts: usize,
    /// Key states compared with the model, over all verifications.
    key_checks: u64,
    /// In-flight writes found applied, not applied, or indistinguishable.
    inflight_applied: u64,
    inflight_not_applied: u64,
    inflight_either: u64,
    /// Acknowledged writes whose effect was found missing or changed.
    lost: u64,
    /// Largest CAS unique seen (the probe written after each restart included).
    max_cas: u64,
}

/// Reads every key of `m` from the server, through both protocols where both apply.
fn observe(m: &Model, mc: &mut Conn, rs: &mut Conn, problems: &mut Vec<String>) -> Vec<Seen> {
    let mut seen = Vec::with_capacity(m.keys.len());
    let io = |e: io::Error| -> ! { panic!("verification of {}: {e}", m.name) };
    for (chunk_no, keys) in m.keys.chunks(100).enumerate() {
        let base = chunk_no * 100;
        match m.proto {
            Proto::Mc => {
                let mut got = mc_gets(mc, keys).unwrap_or_else(|e| io(e));
                let mut req = Vec::new();
                for k in keys {
                    req.extend(resp_req(&[b"PTTL", k.as_bytes()]));
                    req.extend(resp_req(&[b"GET", k.as_bytes()]));
                }
                let q0 = now_ms();
                rs.send(&req).unwrap_or_else(|e| io(e));
                let mut replies = Vec::new();
                for _ in 0..keys.len() * 2 {
                    replies.push(resp_read(rs).unwrap_or_else(|e| io(e)));
                }
                let q1 = now_ms();
                for (n, k) in keys.iter().enumerate() {
                    let (pttl, get) = (&replies[2 * n], &replies[2 * n + 1]);
                    let item = got.remove(k);
                    let resp_value = match get {
                        R::Bulk(v) => v.clone(),
                        other => {
                            problems.push(format!("{k}: RESP GET answered {}", resp_show(other)));
                            None
                        }
                    };
                    if item.as_ref().map(|(_, v, _)| v) != resp_value.as_ref() {
                        problems.push(format!(
                            "{k}: memcached and RESP disagree: gets {:?}, GET {:?}",
                            item.as_ref().map(|(_, v, _)| brief(v)),
                            resp_value.as_ref().map(|v| brief(v))
                        ));
                    }
                    let exp = expiry(k, pttl, q0, q1, item.is_some(), problems);
                    seen.push(Seen::Mc(
                        item.map(|(flags, value, cas)| (McItem { value, flags, exp }, cas)),
                    ));
                }
            }
            Proto::Resp => {
                let mut req = Vec::new();
                for (n, k) in keys.iter().enumerate() {
                    let k = k.as_bytes();
                    req.extend(resp_req(&[b"TYPE", k]));
                    match m.kinds[base + n] {
                        RKind::Str => {
                            req.extend(resp_req(&[b"GET", k]));
                            req.extend(resp_req(&[b"PTTL", k]));
                        }
                        RKind::List => req.extend(resp_req(&[b"LRANGE", k, b"0", b"-1"])),
                        RKind::Hash => req.extend(resp_req(&[b"HGETALL", k])),
                    }
                }
                let q0 = now_ms();
                rs.send(&req).unwrap_or_else(|e| io(e));
                let strs: Vec<String> = keys
                    .iter()
                    .enumerate()
                    .filter(|(n, _)| m.kinds[base + n] == RKind::Str)
                    .map(|(_, k)| k.clone())
                    .collect();
                let mut read = || resp_read(rs).unwrap_or_else(|e| io(e));
                let mut per_key = Vec::new();
                for n in 0..keys.len() {
                    let ty = read();
                    let rest = if m.kinds[base + n] == RKind::Str {
                        vec![read(), read()]
                    } else {
                        vec![read()]
                    };
                    per_key.push((ty, rest));
                }
                let q1 = now_ms();
                let mut mc_view = mc_gets(mc, &strs).unwrap_or_else(|e| io(e));
                for (n, k) in keys.iter().enumerate() {
                    let (ty, rest) = &per_key[n];
                    let kind = m.kinds[base + n];
                    let ty = match ty {
                        R::Simple(t) => t.as_str(),
                        other => {
                            problems.push(format!("{k}: TYPE answered {}", resp_show(other)));
                            "?"
                        }
                    };
                    let val = match (kind, ty, &rest[..]) {
                        (_, "none", _) => None,
                        (RKind::Str, "string", [R::Bulk(Some(v)), pttl]) => {
                            let exp = expiry(k, pttl, q0, q1, true, problems);
                            Some(RVal::Str(v.clone(), exp))
                        }
                        (RKind::List, "list", [R::Arr(Some(items))]) => Some(RVal::List(
                            items.iter().map(|e| bulk(k, e, problems)).collect(),
                        )),
                        (RKind::Hash, "hash", [R::Arr(Some(items))]) if items.len() % 2 == 0 => {
                            Some(RVal::Hash(
                                items
                                    .chunks(2)
                                    .map(|p| (bulk(k, &p[0], problems), bulk(k, &p[1], problems)))
                                    .collect(),
                            ))
                        }
                        (_, ty, rest) => {
                            problems.push(format!(
                                "{k}: foreign state: TYPE {ty}, then {:?}",
                                rest.iter().map(resp_show).collect::<Vec<_>>()
                            ));
                            Some(RVal::Str(b"<foreign>".to_vec(), Exp::Never))
                        }
                    };
                    if kind == RKind::Str {
                        let mcv = mc_view.remove(k);
                        let want = match &val {
                            Some(RVal::Str(v, _)) => Some((0u32, v)),
                            _ => None,
                        };
                        if mcv.as_ref().map(|(f, v, _)| (*f, v)) != want {
                            problems.push(format!(
                                "{k}: memcached gets {:?} disagrees with RESP {:?}",
                                mcv.map(|(f, v, _)| (f, brief(&v))),
                                want.map(|(f, v)| (f, brief(v)))
                            ));
                        }
                    }
                    seen.push(Seen::R(val));
                }
            }
        }
    }
    seen
}

fn bulk(k: &str, r: &R, problems: &mut Vec<String>) -> Vec<u8> {
    match r {
        R::Bulk(Some(v)) => v.clone(),
        other => {
            problems.push(format!("{k}: element {}", resp_show(other)));
            Vec::new()
        }
    }
}

/// The expiry a PTTL reply reveals, read between `q0` and `q1`.
fn expiry(k: &str, pttl: &R, q0: u64, q1: u64, present: bool, problems: &mut Vec<String>) -> Exp {
    match (pttl, present) {
        (R::Int(-2), false) => Exp::Never,
        (R::Int(-1), true) => Exp::Never,
        (R::Int(p), true) if *p >= 0 => Exp::At(q0 + *p as u64, q1 + *p as u64),
        (other, _) => {
            problems.push(format!(
                "{k}: PTTL {} for an item that is {}",
                resp_show(other),
                if present { "present" } else { "missing" }
            ));
            Exp::Never
        }
    }
}

/// Compares the server with every model (settling what was uncertain); Err lists every
/// difference found.
fn verify(server: &Server, models: &mut [Model], t: &mut Totals) -> Result<(), String> {
    let mut mc = Conn::must_open(server.addr());
    let mut rs = Conn::must_open(server.resp_addr().expect("RESP port"));
    let mut problems = Vec::new();
    let mut live = BTreeSet::new();
    let mut cas_before = t.max_cas;
    for m in models.iter_mut() {
        let seen = observe(m, &mut mc, &mut rs, &mut problems);
        let inflight = m.inflight.take();
        let touched: BTreeSet<usize> = inflight
            .iter()
            .flat_map(|f| f.after.iter().map(|(i, _)| *i))
            .collect();
        for (i, s) in seen.iter().enumerate() {
            t.key_checks += 1;
            if touched.contains(&i) {
                continue;
            }
            if admits(&m.states[i], s) {
                m.states[i] = settle(&m.states[i], s);
            } else {
                t.lost += 1;
                problems.push(format!(
                    "{} key {}: acknowledged state lost or changed: expected {}, found {}",
                    m.name,
                    m.keys[i],
                    m.states[i].show(),
                    s.show()
                ));
            }
        }
        if let Some(f) = inflight {
            let before = f
                .after
                .iter()
                .all(|(i, _)| admits(&m.states[*i], &seen[*i]));
            let after = f.after.iter().all(|(i, st)| admits(st, &seen[*i]));
            match (before, after) {
                (true, true) => t.inflight_either += 1,
                (true, false) => t.inflight_not_applied += 1,
                (false, true) => t.inflight_applied += 1,
                (false, false) => problems.push(format!(
                    "{}: unacknowledged {} is neither done nor undone: {}",
                    m.name,
                    f.what,
                    f.after
                        .iter()
                        .map(|(i, st)| format!(
                            "{}: before {}, after {}, found {}",
                            m.keys[*i],
                            m.states[*i].show(),
                            st.show(),
                            seen[*i].show()
                        ))
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
            }
            for (i, st) in &f.after {
                let pick = if after && !before { st } else { &m.states[*i] };
                m.states[*i] = settle(pick, &seen[*i]);
            }
        }
        for (i, st) in m.states.iter().enumerate() {
            if let State::Mc(_, Cas::Exact(c)) = st {
                m.max_cas = m.max_cas.max(*c);
            }
            if st.present() {
                live.insert(m.keys[i].clone());
            }
        }
        cas_before = cas_before.max(m.max_cas);
        if m.sweep_fresh {
            // Every expired key was checked once; keep the survivors and a sample.
            m.sweep_fresh = false;
            let mut gone = 0;
            let keep: Vec<bool> = m
                .states
                .iter()
                .map(|s| {
                    s.present() || {
                        gone += 1;
                        gone <= SWEEP_KEEP_GONE
                    }
                })
                .collect();
            let mut it = keep.iter();
            m.keys.retain(|_| *it.next().unwrap());
            let mut it = keep.iter();
            m.states.retain(|_| *it.next().unwrap());
            m.kinds.truncate(m.keys.len());
        }
    }
    // No key beyond the modelled ones is live (nothing deleted came back, nothing foreign).
    rs.send(&resp_req(&[b"KEYS", b"*"])).expect("KEYS");
    match resp_read(&mut rs).expect("KEYS reply") {
        R::Arr(Some(keys)) => {
            let keys: BTreeSet<String> = keys
                .iter()
                .map(|k| match k {
                    R::Bulk(Some(k)) => text(k),
                    other => panic!("KEYS element {other:?}"),
                })
                .collect();
            for k in keys.difference(&live) {
                problems.push(format!(
                    "{k}: live on the server but deleted or never written"
                ));
            }
            for k in live.difference(&keys) {
                problems.push(format!("{k}: missing from KEYS *"));
            }
        }
        other => problems.push(format!("KEYS * answered {}", resp_show(&other))),
    }
    // CAS order across the restart: a new write's unique exceeds every one seen so far.
    let probe = format!("probe:{}", t.restarts);
    mc.send(&store_req("set", &probe, 0, 0, b"p", None))
        .expect("probe set");
    assert_eq!(text(&mc.line().expect("probe reply")), "STORED");
    let got = mc_gets(&mut mc, std::slice::from_ref(&probe)).expect("probe gets");
    let cas = got.get(&probe).expect("probe stored").2;
    if cas <= cas_before {
        problems.push(format!(
            "CAS went backwards across the restart: a new write got {cas}, {cas_before} was seen before"
        ));
    }
    mc.send(format!("delete {probe}\r\n").as_bytes())
        .expect("probe delete");
    assert_eq!(text(&mc.line().expect("probe delete reply")), "DELETED");
    t.max_cas = cas.max(cas_before);
    t.restarts += 1;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} problems ({} acknowledged states lost or changed):\n{}",
            problems.len(),
            t.lost,
            problems
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Kill rounds

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kill {
    /// SIGKILL at a random moment of the write load.
    Load,
    /// SIGKILL a few ms after the spawn, before or while the store opens.
    Startup,
    /// SIGKILL while the expiry sweep deletes thousands of expired items (load running too).
    Sweep,
}

/// The kills after the first (a startup kill on an empty data dir), repeated: every kind early
/// on, load kills the most.
const SCHEDULE: [Kill; 6] = [
    Kill::Load,
    Kill::Startup,
    Kill::Load,
    Kill::Sweep,
    Kill::Startup,
    Kill::Load,
];

/// Writes `SWEEP_KEYS` keys (most with exptime 1 s), acknowledged; returns their model (keys
/// with exptime 1 modelled as missing: they must not be checked before the returned unix ms
/// time, when all have expired) and how many expire.
fn sweep_setup(server: &Server, rng: &mut Rng, round: usize) -> (Model, u64, u64) {
    let mut c = Conn::must_open(server.addr());
    let keys: Vec<String> = (0..SWEEP_KEYS).map(|i| format!("x{round}:{i}")).collect();
    let mut m = Model::mc(format!("sweep keys {round}"), keys.clone());
    m.sweep_fresh = true;
    let mut expiring = 0;
    let mut expired_by = 0;
    for (chunk_no, chunk) in keys.chunks(500).enumerate() {
        let mut req = Vec::new();
        let mut items = Vec::new();
        for k in chunk {
            let exptime = match rng.below(100) {
                0..85 => 1,
                85..95 => 0,
                _ => 5000,
            };
            let flags = rng.flags();
            let mut value = format!("<{k}>").into_bytes();
            value.extend((0..rng.below(64)).map(|_| rng.next() as u8));
            req.extend(store_req("set", k, flags, exptime, &value, None));
            items.push((exptime, flags, value));
        }
        let t0 = now_ms();
        c.send(&req).expect("send sweep keys");
        for k in chunk {
            let l = text(&c.line().expect("sweep set reply"));
            assert_eq!(l, "STORED", "set {k}");
        }
        let t1 = now_ms();
        expired_by = t1 + 1000 + EXP_SLACK;
        for (n, (exptime, flags, value)) in items.into_iter().enumerate() {
            let i = chunk_no * 500 + n;
            if exptime == 1 {
                expiring += 1;
                continue; // missing once expired
            }
            let exp = Exp::of(exptime, t0).close(t0, t1);
            m.states[i] = State::Mc(Some(McItem { value, flags, exp }), Cas::Above(0));
        }
    }
    m.acked = SWEEP_KEYS as u64;
    (m, expiring, expired_by)
}

/// Sync-mode arguments by name.
fn sync_args(mode: &str) -> Vec<String> {
    let mut a = vec!["--sync".to_string(), mode.to_string()];
    if mode == "periodic" {
        a.extend(["--sync-interval-ms".to_string(), "50".to_string()]);
    }
    a
}

fn env_num(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// One crash run: a server on one data dir, the load's models and the tallies.
struct Run {
    label: String,
    server: Server,
    rng: Rng,
    models: Vec<Model>,
    t: Totals,
    /// How long a start has taken until it accepted connections (startup kills spread over it).
    start_ms: u64,
    rounds: usize,
}

impl Run {
    fn new(mode: &str, seed: u64) -> Run {
        let server = Server::start_with(
            BIN,
            Options {
                args: sync_args(mode),
                resp: true,
                ..Options::default()
            },
        );
        let models = (0..MC_CONNS)
            .map(|id| {
                let keys = (0..MC_KEYS).map(|k| format!("m{id}:{k}")).collect();
                Model::mc(format!("memcached conn {id}"), keys)
            })
            .chain((0..RESP_CONNS).map(Model::resp))
            .collect();
        Run {
            label: format!(
                "crash test, --sync {mode}, seed {seed} (replay: MEMKEEP_CRASH_SEED={seed})"
            ),
            server,
            rng: Rng(seed),
            models,
            t: Totals::default(),
            start_ms: 30,
            rounds: 0,
        }
    }

    /// Starts the (killed) server again and checks every model against it.
    fn relaunch_and_verify(&mut self, when: &str) {
        let t0 = Instant::now();
        self.server.relaunch();
        self.start_ms = self.start_ms.max(t0.elapsed().as_millis() as u64);
        if let Err(e) = verify(&self.server, &mut self.models, &mut self.t) {
            panic!("{}, {when}: {e}", self.label);
        }
    }

    /// SIGKILL a start of the (stopped) server at a random moment of its startup.
    fn startup_kill(&mut self) {
        // Log-uniform from 20 us to the longest start seen: most kills land in the first few
        // ms, while the process execs, opens the store and binds, some after it serves.
        let (lo, hi) = (20f64.ln(), ((self.start_ms * 1000) as f64).ln());
        let u = self.rng.below(1 << 20) as f64 / (1u64 << 20) as f64;
        let delay = Duration::from_micros((lo + u * (hi - lo)).exp() as u64);
        if let Some(status) = self.server.kill9_during_startup(delay) {
            panic!(
                "{}: a start exited by itself with {status}:\n{}",
                self.label,
                self.server.stderr_tail(2000)
            );
        }
        // Whether that start got as far as serving (its log line follows the store's opening).
        let log = self.server.stderr();
        let last = log.rsplit("---- launch").next().unwrap_or("");
        if last.contains(" serving ") {
            self.t.startup_after_open += 1;
        }
        self.t.startup_kills += 1;
        self.t.kills += 1;
    }

    /// Load on every connection, then SIGKILL: after a random time, or (`sweep`) while the
    /// expiry sweep deletes thousands of items. The server must be up and verified.
    fn load_kill(&mut self, sweep: bool) {
        let server = &mut self.server;
        let rng = &mut self.rng;
        let t = &mut self.t;
        let sweep = sweep.then(|| {
            let (m, expiring, expired_by) = sweep_setup(server, rng, self.rounds);
            let mut c = Conn::must_open(server.addr());
            let base = curr_items(&mut c);
            (m, expiring, expired_by, base, c)
        });
        let conns: Vec<Conn> = self.models[..LOAD_CONNS]
            .iter()
            .map(|m| match m.proto {
                Proto::Mc => Conn::must_open(server.addr()),
                Proto::Resp => Conn::must_open(server.resp_addr().expect("RESP port")),
            })
            .collect();
        let killed = AtomicBool::new(false);
        let forks: Vec<Rng> = (0..LOAD_CONNS).map(|_| rng.fork()).collect();
        let load_ms = rng.range(50, 800);
        let pause_ms = rng.below(20);
        let mut sweep_model = None;
        let steps = thread::scope(|s| {
            let handles: Vec<_> = self.models[..LOAD_CONNS]
                .iter_mut()
                .zip(conns)
                .zip(forks)
                .map(|((m, c), r)| {
                    let killed = &killed;
                    s.spawn(move || worker(m, c, r, killed))
                })
                .collect();
            match sweep {
                None => thread::sleep(Duration::from_millis(load_ms)),
                Some((m, expiring, expired_by, base, mut c)) => {
                    // Wait until the sweeper has deleted a first batch, then a little more.
                    let deadline = Instant::now() + Duration::from_secs(5);
                    let threshold = base.saturating_sub(400);
                    while curr_items(&mut c) > threshold && Instant::now() < deadline {
                        thread::sleep(Duration::from_millis(2));
                    }
                    thread::sleep(Duration::from_millis(pause_ms));
                    let left = curr_items(&mut c);
                    // Items the sweep had still to delete (the load moves the count a little).
                    let unswept = left.saturating_sub(base - expiring);
                    if unswept > 150 {
                        t.sweep_mid += 1;
                    }
                    eprintln!(
                        "  sweep kill: {expiring} of {SWEEP_KEYS} keys expiring, about {unswept} not yet swept at the kill"
                    );
                    sweep_model = Some((m, expired_by));
                }
            }
            killed.store(true, Ordering::SeqCst);
            server.kill9();
            handles
                .into_iter()
                .map(|h| h.join().expect("load thread"))
                .sum::<usize>()
        });
        if let Some((m, expired_by)) = sweep_model {
            // The next check reads every expiring key as missing: make sure all have expired
            // (a slow write of the keys may have started the sweep on the first ones only).
            while now_ms() < expired_by {
                thread::sleep(Duration::from_millis(10));
            }
            self.models.push(m);
            self.t.sweep_kills += 1;
        } else {
            self.t.load_kills += 1;
        }
        self.t.kills += 1;
        self.rounds += 1;
        eprintln!(
            "  kill {}: {steps} requests in this round, {} writes acknowledged so far",
            self.t.kills,
            self.acked()
        );
    }

    fn acked(&self) -> u64 {
        self.models.iter().map(|m| m.acked).sum()
    }
}

fn crash_run(mode: &str, kills: usize) {
    let seed = env_num("MEMKEEP_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let started = Instant::now();
    let mut run = Run::new(mode, seed);
    eprintln!("{}: {kills} kills", run.label);

    // First kill: during the very first start, on an empty data dir.
    run.server.kill9();
    for entry in std::fs::read_dir(run.server.data_dir()).expect("read the data dir") {
        let _ = std::fs::remove_file(entry.expect("dir entry").path());
    }
    run.startup_kill();
    while run.t.kills < kills {
        match SCHEDULE[(run.t.kills - 1) % SCHEDULE.len()] {
            Kill::Startup => run.startup_kill(),
            kind => {
                let when = format!("after kill {}", run.t.kills);
                run.relaunch_and_verify(&when);
                run.load_kill(kind == Kill::Sweep);
            }
        }
    }
    run.relaunch_and_verify("after the last kill");
    // A clean stop and start keeps everything too.
    run.server.stop();
    run.relaunch_and_verify("after a clean restart");
    assert!(
        !run.server.stderr().contains("panicked"),
        "{}: the server panicked:\n{}",
        run.label,
        run.server.stderr_tail(4000)
    );
    let t = &run.t;
    let acked = run.acked();
    eprintln!(
        "{}: {} kills survived ({} under load, {} during startup ({} of them once it was serving), \
         {} during the expiry sweep ({} with the sweep unfinished)); {acked} acknowledged writes, \
         {} key states checked over {} restarts, {} acknowledged writes lost; unacknowledged writes \
         found applied {}, not applied {}, indistinguishable {}; {:.1} s",
        run.label,
        t.kills,
        t.load_kills,
        t.startup_kills,
        t.startup_after_open,
        t.sweep_kills,
        t.sweep_mid,
        t.key_checks,
        t.restarts,
        t.lost,
        t.inflight_applied,
        t.inflight_not_applied,
        t.inflight_either,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(t.lost, 0);
    assert!(acked > 0, "{}: no write was acknowledged", run.label);
}

fn kills(default: usize, share: usize) -> usize {
    match env_num("MEMKEEP_CRASH_KILLS") {
        Some(n) => (n as usize / share).max(default.min(n as usize)),
        None => default,
    }
}

/// The promise of `--sync always`: nothing acknowledged is lost, whenever the process dies.
#[test]
fn kill9_loses_no_acknowledged_write_with_sync_always() {
    crash_run("always", kills(6, 1));
}

/// `periodic` and `never` promise the same for a process crash (the page cache keeps every
/// commit); only an OS crash or power loss may cost them recent writes.
#[test]
fn kill9_loses_no_acknowledged_write_with_sync_periodic() {
    crash_run("periodic", kills(2, 6));
}

#[test]
fn kill9_loses_no_acknowledged_write_with_sync_never() {
    crash_run("never", kills(2, 6));
}

/// The checker itself: after a crash round, damage the store behind the models' back in each
/// way the crash test looks for; every one must be reported, and nothing else.
#[test]
fn verification_reports_lost_changed_half_done_and_foreign_state() {
    let mut run = Run::new("never", 7);
    run.load_kill(false);
    run.relaunch_and_verify("after the kill");
    let mut rng = Rng(11);
    let mut mc = Conn::must_open(run.server.addr());
    let mut rs = Conn::must_open(run.server.resp_addr().expect("RESP port"));
    // Known states to damage: three memcached items, one list.
    let m = &mut run.models[0];
    for i in 0..3 {
        let t0 = now_ms();
        let value = m.value(&mut rng);
        let req = store_req("set", &m.keys[i], 5, 0, &value, None);
        let after = State::Mc(
            Some(McItem {
                value,
                flags: 5,
                exp: Exp::Never,
            }),
            Cas::Above(m.max_cas),
        );
        m.mc_write(&mut mc, "set".into(), &req, t0, vec![(i, after)], "STORED")
            .expect("set");
    }
    m.mc_observe(&mut mc, 2).expect("gets");
    let State::Mc(Some(item2), Cas::Exact(_)) = m.states[2].clone() else {
        panic!("m0:2 was just read back");
    };
    let r = &mut run.models[MC_CONNS];
    let list = R_STRS;
    let elem = r.piece(&mut rng);
    let mut new = match r.r_state(list) {
        Some(RVal::List(l)) => l,
        _ => VecDeque::new(),
    };
    new.push_back(elem.clone());
    let len = new.len() as i64;
    let key = r.keys[list].clone();
    r.resp_write(
        &mut rs,
        &[b"RPUSH", key.as_bytes(), &elem],
        now_ms(),
        vec![(list, State::R(Some(RVal::List(new))))],
        R::Int(len),
    )
    .expect("rpush");
    // An MSET "in flight" of which only the first key landed (over a key that exists, so
    // only the half-done check can see it).
    let v0 = r.value(&mut rng);
    let after = State::R(Some(RVal::Str(v0.clone(), Exp::Never)));
    r.resp_write(
        &mut rs,
        &[b"SET", b"r0:s0", &v0],
        now_ms(),
        vec![(0, after)],
        R::Simple("OK".into()),
    )
    .expect("set");
    let (v1, v2) = (r.value(&mut rng), r.value(&mut rng));
    r.inflight = Some(Inflight {
        what: "MSET r0:s0 r0:s1 (half applied on purpose)".into(),
        after: vec![
            (0, State::R(Some(RVal::Str(v1.clone(), Exp::Never)))),
            (1, State::R(Some(RVal::Str(v2, Exp::Never)))),
        ],
    });

    let send = |c: &mut Conn, req: Vec<u8>, proto: Proto| {
        c.send(&req).expect("send");
        match proto {
            Proto::Mc => drop(c.line().expect("reply")),
            Proto::Resp => drop(resp_read(c).expect("reply")),
        }
    };
    send(
        &mut mc,
        store_req("set", "m0:0", 5, 0, b"changed", None),
        Proto::Mc,
    );
    send(&mut mc, b"delete m0:1\r\n".to_vec(), Proto::Mc);
    // The same value and flags again: only the CAS unique tells.
    send(
        &mut mc,
        store_req("set", "m0:2", 5, 0, &item2.value, None),
        Proto::Mc,
    );
    send(
        &mut rs,
        resp_req(&[b"RPUSH", key.as_bytes(), b"extra"]),
        Proto::Resp,
    );
    send(&mut rs, resp_req(&[b"SET", b"r0:s0", &v1]), Proto::Resp);
    send(
        &mut rs,
        resp_req(&[b"SET", b"m0:foreign", b"x"]),
        Proto::Resp,
    );

    let err =
        verify(&run.server, &mut run.models, &mut run.t).expect_err("the damage must be found");
    for want in [
        "key m0:0: acknowledged state lost or changed",
        "key m0:1: acknowledged state lost or changed",
        "key m0:2: acknowledged state lost or changed",
        &format!("key {key}: acknowledged state lost or changed"),
        "unacknowledged MSET r0:s0 r0:s1 (half applied on purpose) is neither done nor undone",
        "m0:foreign: live on the server but deleted or never written",
        "m0:1: missing from KEYS *",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    assert!(
        err.starts_with("7 problems (4 acknowledged states lost or changed)"),
        "{err}"
    );
}
