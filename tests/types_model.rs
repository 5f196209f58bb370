//! The collections on LMDB against the in-memory model, with no server: a seeded stream of
//! typed writes (`types::apply`, `Model::apply`) and typed reads (`types::read::CollRead` on an
//! LMDB `ReadCx` and on the `Model`) over lists, hashes, sets and sorted sets, with strings in
//! the keyspace for WRONGTYPE. Every write's outcome, every read's result and, after every
//! step, the whole content of every key are compared.
//!
//! Writes run in batches of a few in one write transaction, as the writer runs them; reads
//! inside a batch see it through the transaction (as EXEC and scripts read), reads after it
//! through a snapshot of the committed store (as a worker reads). A few sorted sets grow past
//! the rank directory's chunk size, so ranks come from the directory too.
//!
//! Arguments cover the edges: negative and out-of-range indexes, empty ranges, exclusive score
//! bounds and infinities (parsed by the commands' own parsers), lex bounds `[`, `(`, `-`, `+`
//! and ones longer than any member, LIMIT offsets (negative too), reverse, missing keys, keys
//! holding other kinds, the empty member.

mod common;

use common::Rng;
use memkeep::commands::zset::{parse_lex_range, parse_score_range};
use memkeep::storage::lmdb::LmdbStore;
use memkeep::storage::overlay::Snap;
use memkeep::storage::{ItemMeta, Kind, WriteView};
use memkeep::types::hash::HashOp;
use memkeep::types::list::ListOp;
use memkeep::types::model::{Model, Value};
use memkeep::types::read::{CollRead, PosQuery, ReadError, ZInput};
use memkeep::types::set::{Combine, SetOp};
use memkeep::types::zcombine::Aggregate;
use memkeep::types::zset::{AddFlags, RangeBy, RangeQuery, RangeSpec, ZSetOp};
use memkeep::types::{self, CollOp, ReadCx};

/// The keyspace: two or three keys that each kind's operations name most of the time (so
/// collections grow and reads find them), and now and then another kind's (WRONGTYPE).
const KEYS: [&[u8]; 9] = [
    b"l1", b"l2", b"h1", b"h2", b"s1", b"s2", b"s3", b"z1", b"z2",
];

fn home(kind: Kind) -> &'static [&'static [u8]] {
    match kind {
        Kind::List => &KEYS[0..2],
        Kind::Hash => &KEYS[2..4],
        Kind::Set => &KEYS[4..7],
        _ => &KEYS[7..9],
    }
}

/// Elements, fields and members: few, so they repeat; the empty one too.
const SUBS: [&[u8]; 10] = [
    b"", b"a", b"ab", b"b", b"ba", b"c", b"m1", b"m2", b"x", b"zz",
];

/// Hash values and list elements, some of them integers for HINCRBY.
const VALUES: [&[u8]; 8] = [
    b"1",
    b"-5",
    b"0",
    b"v",
    b"ab",
    b"",
    b"9223372036854775807",
    b"x",
];

/// Scores, with repeats (equal scores order by member), -0 and the infinities.
const SCORES: [f64; 10] = [
    f64::NEG_INFINITY,
    -2.5,
    -1.0,
    -0.0,
    0.0,
    1.0,
    1.0,
    3.5,
    1e300,
    f64::INFINITY,
];

/// WEIGHTS, with the ones whose products are NaN (`inf * 0`).
const WEIGHTS: [f64; 6] = [1.0, 2.0, -1.0, 0.0, 0.5, f64::INFINITY];

/// Score range ends as a client writes them.
const SCORE_ENDS: [&[u8]; 10] = [
    b"-inf", b"+inf", b"(1", b"1", b"0", b"(0", b"-2.5", b"(3.5", b"1e300", b"(-inf",
];

struct Gen(Rng);

impl Gen {
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.0.below(xs.len() as u64) as usize]
    }
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.0.below((hi - lo + 1) as u64) as i64
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.0.below(one_in) == 0
    }
    /// A key for an operation on `kind`: one of its own, or one in twenty times any.
    fn key(&mut self, kind: Kind) -> Vec<u8> {
        if self.chance(20) {
            self.pick(&KEYS).to_vec()
        } else {
            self.pick(home(kind)).to_vec()
        }
    }
    fn sub(&mut self) -> Vec<u8> {
        self.pick(&SUBS).to_vec()
    }
    fn subs(&mut self, max: i64) -> Vec<Vec<u8>> {
        (0..self.int(1, max)).map(|_| self.sub()).collect()
    }
    fn value(&mut self) -> Vec<u8> {
        self.pick(&VALUES).to_vec()
    }
    /// A sub-key a read may ask for: usually one of `SUBS`, sometimes longer than any stored.
    fn probe(&mut self) -> Vec<u8> {
        if self.chance(20) {
            let mut long = b"m".to_vec();
            long.resize(600, b'z');
            long
        } else {
            self.sub()
        }
    }
    /// A key a read may name: usually one of `KEYS`, sometimes one no write uses (absent),
    /// empty, or too long to be a key.
    fn read_key(&mut self, kind: Kind) -> Vec<u8> {
        match self.0.below(30) {
            0 => b"absent".to_vec(),
            1 => Vec::new(),
            2 => vec![b'k'; 600],
            _ => self.key(kind),
        }
    }
    fn lex_end(&mut self) -> Vec<u8> {
        match self.0.below(8) {
            0 => b"-".to_vec(),
            1 => b"+".to_vec(),
            n => {
                let mut e = vec![if n % 2 == 0 { b'[' } else { b'(' }];
                e.extend_from_slice(&self.probe());
                e
            }
        }
    }
    fn range_query(&mut self) -> RangeQuery {
        match self.0.below(3) {
            0 => RangeQuery::Rank(self.int(-7, 7), self.int(-7, 7)),
            1 => {
                let (a, b) = (self.pick(&SCORE_ENDS), self.pick(&SCORE_ENDS));
                RangeQuery::Score(parse_score_range(a, b).expect("valid score range"))
            }
            _ => {
                let (a, b) = (self.lex_end(), self.lex_end());
                RangeQuery::Lex(parse_lex_range(&a, &b).expect("valid lex range"))
            }
        }
    }
    fn range_spec(&mut self) -> RangeSpec {
        let query = self.range_query();
        let limited = !matches!(query, RangeQuery::Rank(..)) && self.chance(2);
        RangeSpec {
            query,
            rev: self.chance(2),
            offset: if limited { self.int(-1, 3) } else { 0 },
            limit: if limited { self.int(-1, 4) } else { -1 },
        }
    }
    fn count(&mut self) -> Option<u64> {
        self.chance(2).then(|| self.int(0, 4) as u64)
    }

    /// A collection write, with arguments the commands would accept.
    fn write(&mut self) -> CollOp {
        let n = self.0.below(22);
        let kind = match n {
            0..=7 => Kind::List,
            8..=11 => Kind::Hash,
            12..=16 => Kind::Set,
            _ => Kind::ZSet,
        };
        let key = self.key(kind);
        match n {
            0 | 1 => CollOp::List(ListOp::Push {
                key,
                values: (0..self.int(1, 4)).map(|_| self.value()).collect(),
                left: self.chance(2),
                existing_only: self.chance(6),
            }),
            2 => CollOp::List(ListOp::Pop {
                key,
                left: self.chance(2),
                count: self.count(),
            }),
            3 => CollOp::List(ListOp::Set {
                key,
                index: self.int(-6, 6),
                value: self.value(),
            }),
            4 => CollOp::List(ListOp::Rem {
                key,
                count: self.int(-3, 3),
                value: self.value(),
            }),
            5 => CollOp::List(ListOp::Trim {
                key,
                start: self.int(-6, 6),
                stop: self.int(-6, 6),
            }),
            6 => CollOp::List(ListOp::Insert {
                key,
                before: self.chance(2),
                pivot: self.value(),
                value: self.value(),
            }),
            7 => CollOp::List(ListOp::Move {
                src: key,
                dst: self.key(Kind::List),
                from_left: self.chance(2),
                to_left: self.chance(2),
            }),
            8 | 9 => {
                let nx = self.chance(5);
                let n = if nx { 1 } else { self.int(1, 4) };
                CollOp::Hash(HashOp::Set {
                    key,
                    pairs: (0..n).map(|_| (self.sub(), self.value())).collect(),
                    nx,
                    ok: !nx && self.chance(3),
                })
            }
            10 => CollOp::Hash(HashOp::Del {
                key,
                fields: self.subs(3),
            }),
            11 if self.chance(3) => CollOp::Hash(HashOp::IncrByFloat {
                key,
                field: self.sub(),
                delta: self.pick(&[&b"1.5"[..], b"-0.25", b"3e2", b"0"]).to_vec(),
            }),
            11 => CollOp::Hash(HashOp::IncrBy {
                key,
                field: self.sub(),
                delta: if self.chance(10) {
                    i64::MAX
                } else {
                    self.int(-100, 100)
                },
            }),
            12 | 13 => CollOp::Set(SetOp::Add {
                key,
                members: self.subs(4),
            }),
            14 => CollOp::Set(SetOp::Rem {
                key,
                members: self.subs(3),
            }),
            15 => CollOp::Set(SetOp::Move {
                src: key,
                dst: self.key(Kind::Set),
                member: self.sub(),
            }),
            16 => CollOp::Set(SetOp::Store {
                how: self.pick(&[Combine::Inter, Combine::Union, Combine::Diff]),
                dst: key,
                keys: (0..self.int(1, 3)).map(|_| self.key(Kind::Set)).collect(),
            }),
            17 | 18 => {
                let mut flags = AddFlags::default();
                match self.0.below(6) {
                    0 => flags.nx = true,
                    1 => flags.xx = true,
                    2 => flags.gt = true,
                    3 => flags.lt = true,
                    _ => {}
                }
                flags.ch = self.chance(3);
                flags.incr = self.chance(5);
                let n = if flags.incr { 1 } else { self.int(1, 4) };
                CollOp::ZSet(ZSetOp::Add {
                    key,
                    flags,
                    pairs: (0..n).map(|_| (self.pick(&SCORES), self.sub())).collect(),
                })
            }
            19 => CollOp::ZSet(ZSetOp::Rem {
                key,
                members: self.subs(3),
            }),
            20 => CollOp::ZSet(match self.0.below(4) {
                3 => {
                    let keys = self.zinputs();
                    ZSetOp::Store {
                        dst: key,
                        how: self.pick(&[Combine::Inter, Combine::Union, Combine::Diff]),
                        weights: (0..self.int(0, keys.len() as i64))
                            .map(|_| self.pick(&WEIGHTS))
                            .collect(),
                        keys,
                        agg: self.pick(&[Aggregate::Sum, Aggregate::Min, Aggregate::Max]),
                        deferred: self.chance(20).then_some("ERR syntax error"),
                    }
                }
                0 => ZSetOp::RemRange {
                    key,
                    by: match self.range_query() {
                        RangeQuery::Rank(s, e) => RangeBy::Rank(s, e),
                        RangeQuery::Score(r) => RangeBy::Score(r),
                        RangeQuery::Lex(r) => RangeBy::Lex(r),
                    },
                },
                1 => ZSetOp::Pop {
                    key,
                    max: self.chance(2),
                    count: self.count(),
                },
                _ => ZSetOp::RangeStore {
                    dst: key,
                    src: self.key(Kind::ZSet),
                    range: self.range_spec(),
                },
            }),
            _ => CollOp::ZSet(ZSetOp::Add {
                key,
                flags: AddFlags::default(),
                pairs: self.big_zset(),
            }),
        }
    }

    /// The inputs of a ZUNION-style command: sorted sets, sets, or anything.
    fn zinputs(&mut self) -> Vec<Vec<u8>> {
        (0..self.int(1, 3))
            .map(|_| {
                let kind = if self.chance(3) {
                    Kind::Set
                } else {
                    Kind::ZSet
                };
                self.read_key(kind)
            })
            .filter(|k| !k.is_empty() && k.len() <= 511)
            .collect::<Vec<_>>()
            .into_iter()
            .chain(std::iter::once(self.key(Kind::ZSet)))
            .collect()
    }

    /// Members enough to span several chunks of the rank directory, often with equal scores.
    fn big_zset(&mut self) -> Vec<(f64, Vec<u8>)> {
        let n = if self.chance(4) {
            self.int(300, 900)
        } else {
            1
        };
        (0..n)
            .map(|_| {
                let score = (self.int(-20, 20) as f64) / 2.0;
                (score, format!("m{:04}", self.int(0, 999)).into_bytes())
            })
            .collect()
    }
}

/// A read's result, comparable across the two stores.
#[derive(Debug, PartialEq)]
enum Got {
    WrongType,
    Missing,
    Bytes(Option<Vec<u8>>),
    Elems(Vec<Vec<u8>>),
    Pairs(Vec<(Vec<u8>, Vec<u8>)>),
    Scored(Vec<(Vec<u8>, u64)>),
    Positions(Vec<u64>),
    Bool(bool),
    Score(Option<u64>),
    Rank(Option<u64>),
    Count(u64),
    Page(Vec<(Vec<u8>, Vec<u8>)>, Option<Vec<u8>>),
}

/// One typed read, as a test names it.
#[derive(Debug, Clone)]
enum Read {
    LIndex(Vec<u8>, i64),
    LRange(Vec<u8>, i64, i64),
    LPos(Vec<u8>, Vec<u8>, PosQuery),
    HGet(Vec<u8>, Vec<u8>),
    HScan(Vec<u8>, Option<Vec<u8>>, usize),
    SIsMember(Vec<u8>, Vec<u8>),
    SScan(Vec<u8>, Option<Vec<u8>>, usize),
    SCombine(Combine, Vec<Vec<u8>>, usize),
    ZScore(Vec<u8>, Vec<u8>),
    ZRank(Vec<u8>, Vec<u8>),
    ZCount(Vec<u8>, Vec<u8>, Vec<u8>),
    ZLexCount(Vec<u8>, Vec<u8>, Vec<u8>),
    ZRange(Vec<u8>, RangeSpec),
    ZScan(Vec<u8>, Option<Vec<u8>>, usize),
    /// ZUNION/ZINTER/ZDIFF (inputs, weights) and ZINTERCARD's count (`limit` Some).
    ZCombine(Combine, Vec<(Vec<u8>, f64)>, Aggregate, Option<u64>),
    /// The whole value under a key, whatever its kind.
    Whole(Vec<u8>),
}

impl Gen {
    fn after(&mut self) -> Option<Vec<u8>> {
        self.chance(3).then(|| self.sub())
    }
    fn read(&mut self) -> Read {
        let n = self.0.below(16);
        let kind = match n {
            0..=2 => Kind::List,
            3 | 4 => Kind::Hash,
            5..=7 => Kind::Set,
            _ => Kind::ZSet,
        };
        let key = self.read_key(kind);
        match n {
            0 => Read::LIndex(key, self.int(-7, 7)),
            1 => Read::LRange(key, self.int(-7, 7), self.int(-7, 7)),
            2 => {
                let rank = if self.chance(2) {
                    self.int(1, 3)
                } else {
                    self.int(-3, -1)
                };
                let want = if self.chance(3) {
                    usize::MAX
                } else {
                    self.int(1, 3) as usize
                };
                let maxlen = self.int(0, 5) as u64;
                Read::LPos(key, self.value(), PosQuery { rank, want, maxlen })
            }
            3 => Read::HGet(key, self.probe()),
            4 => Read::HScan(key, self.after(), self.int(0, 4) as usize),
            5 => Read::SIsMember(key, self.probe()),
            6 => Read::SScan(key, self.after(), self.int(0, 4) as usize),
            7 => {
                let mut keys = vec![key];
                keys.extend((0..self.int(0, 2)).map(|_| self.read_key(Kind::Set)));
                let limit = if self.chance(3) {
                    self.int(1, 3) as usize
                } else {
                    usize::MAX
                };
                Read::SCombine(
                    self.pick(&[Combine::Inter, Combine::Union, Combine::Diff]),
                    keys,
                    limit,
                )
            }
            8 => Read::ZScore(key, self.probe()),
            9 => Read::ZRank(
                key,
                if self.chance(2) {
                    format!("m{:04}", self.int(0, 999)).into_bytes()
                } else {
                    self.probe()
                },
            ),
            10 => Read::ZCount(
                key,
                self.pick(&SCORE_ENDS).to_vec(),
                self.pick(&SCORE_ENDS).to_vec(),
            ),
            11 => Read::ZLexCount(key, self.lex_end(), self.lex_end()),
            12 | 13 => Read::ZRange(key, self.range_spec()),
            14 => Read::ZScan(key, self.after(), self.int(0, 4) as usize),
            _ => {
                let inputs = self
                    .zinputs()
                    .into_iter()
                    .map(|k| (k, self.pick(&WEIGHTS)))
                    .collect();
                Read::ZCombine(
                    self.pick(&[Combine::Inter, Combine::Union, Combine::Diff]),
                    inputs,
                    self.pick(&[Aggregate::Sum, Aggregate::Min, Aggregate::Max]),
                    self.chance(4).then(|| self.int(0, 3) as u64),
                )
            }
        }
    }
}

/// A read's value; a storage failure fails the test.
fn ok<T>(r: Result<T, memkeep::storage::StoreError>) -> T {
    r.unwrap_or_else(|e| panic!("storage failed: {e}"))
}

fn bits(s: f64) -> u64 {
    s.to_bits()
}

/// Runs `read` on a store; storage failures fail the test.
fn run<S: CollRead>(s: &S, read: &Read) -> Got {
    let open = |key: &[u8], kind: Kind| match s.open(key, kind) {
        Ok(c) => Ok(c),
        Err(ReadError::WrongType) => Err(Got::WrongType),
        Err(ReadError::Store(e)) => panic!("storage failed: {e}"),
    };
    macro_rules! coll {
        ($key:expr, $kind:expr) => {
            match open($key, $kind) {
                Err(g) => return g,
                Ok(None) => return Got::Missing,
                Ok(Some(c)) => c,
            }
        };
    }
    match read {
        Read::LIndex(k, i) => {
            let c = coll!(k, Kind::List);
            Got::Bytes(ok(s.lindex(c, *i)).map(<[u8]>::to_vec))
        }
        Read::LRange(k, a, b) => {
            let c = coll!(k, Kind::List);
            let mut v = Vec::new();
            ok(s.lrange(c, *a, *b, |e| v.push(e.to_vec())));
            // As many as the reply's header says (`clamp_range`).
            let n = types::clamp_range(*a, *b, s.len(c)).map_or(0, |(x, y)| y - x + 1);
            assert_eq!(v.len() as u64, n, "LRANGE count");
            Got::Elems(v)
        }
        Read::LPos(k, target, q) => {
            let c = coll!(k, Kind::List);
            Got::Positions(ok(s.lpos(c, target, *q)))
        }
        Read::HGet(k, f) => {
            let c = coll!(k, Kind::Hash);
            Got::Bytes(ok(s.hget(c, f)).map(<[u8]>::to_vec))
        }
        Read::HScan(k, after, count) => {
            let c = coll!(k, Kind::Hash);
            let mut v = Vec::new();
            let next = ok(s.hscan(c, after.as_deref(), *count, |f, x| {
                v.push((f.to_vec(), x.to_vec()))
            }));
            Got::Page(v, next.map(<[u8]>::to_vec))
        }
        Read::SIsMember(k, m) => {
            let c = coll!(k, Kind::Set);
            Got::Bool(ok(s.sismember(c, m)))
        }
        Read::SScan(k, after, count) => {
            let c = coll!(k, Kind::Set);
            let mut v = Vec::new();
            let next = ok(s.sscan(c, after.as_deref(), *count, |m| {
                v.push((m.to_vec(), Vec::new()))
            }));
            Got::Page(v, next.map(<[u8]>::to_vec))
        }
        Read::SCombine(how, keys, limit) => {
            let mut sets = Vec::new();
            for k in keys {
                match open(k, Kind::Set) {
                    Err(g) => return g,
                    Ok(c) => sets.push(c),
                }
            }
            Got::Elems(
                ok(s.scombine(*how, &sets, *limit))
                    .into_iter()
                    .map(<[u8]>::to_vec)
                    .collect(),
            )
        }
        Read::ZScore(k, m) => {
            let c = coll!(k, Kind::ZSet);
            Got::Score(ok(s.zscore(c, m)).map(bits))
        }
        Read::ZRank(k, m) => {
            let c = coll!(k, Kind::ZSet);
            Got::Rank(ok(s.zrank(c, m)))
        }
        Read::ZCount(k, a, b) => {
            let c = coll!(k, Kind::ZSet);
            let r = parse_score_range(a, b).expect("valid");
            Got::Count(ok(s.zcount(c, &r)))
        }
        Read::ZLexCount(k, a, b) => {
            let c = coll!(k, Kind::ZSet);
            let r = parse_lex_range(a, b).expect("valid");
            Got::Count(ok(s.zlexcount(c, &r)))
        }
        Read::ZRange(k, spec) => {
            let c = coll!(k, Kind::ZSet);
            let mut v = Vec::new();
            ok(s.zrange(c, spec, |m, sc| v.push((m.to_vec(), bits(sc)))));
            Got::Scored(v)
        }
        Read::ZScan(k, after, count) => {
            let c = coll!(k, Kind::ZSet);
            let mut v = Vec::new();
            let next = ok(s.zscan(c, after.as_deref(), *count, |m, sc| {
                v.push((m.to_vec(), bits(sc).to_be_bytes().to_vec()))
            }));
            Got::Page(v, next.map(<[u8]>::to_vec))
        }
        Read::ZCombine(how, keys, agg, limit) => {
            let mut inputs = Vec::new();
            for (k, weight) in keys {
                let (kind, coll) = match s.open_scored(k) {
                    Err(ReadError::WrongType) => return Got::WrongType,
                    Err(ReadError::Store(e)) => panic!("storage failed: {e}"),
                    Ok(None) => (Kind::ZSet, None),
                    Ok(Some((kind, c))) => (kind, Some(c)),
                };
                inputs.push(ZInput {
                    kind,
                    coll,
                    weight: *weight,
                });
            }
            let mut v = Vec::new();
            ok(s.zcombine(*how, &inputs, *agg, |m, sc| {
                v.push((m.to_vec(), bits(sc)));
                limit.is_none_or(|l| l == 0 || (v.len() as u64) < l)
            }));
            if limit.is_some() {
                return Got::Count(v.len() as u64);
            }
            // The reply's order: by score, then member.
            v.sort_by(|a, b| {
                f64::from_bits(a.1)
                    .total_cmp(&f64::from_bits(b.1))
                    .then_with(|| a.0.cmp(&b.0))
            });
            Got::Scored(v)
        }
        Read::Whole(k) => whole(s, k),
    }
}

/// Everything under `key`: its kind, its length and its elements in order.
fn whole<S: CollRead>(s: &S, key: &[u8]) -> Got {
    for kind in [Kind::List, Kind::Hash, Kind::Set, Kind::ZSet] {
        let c = match s.open(key, kind) {
            Err(ReadError::WrongType) => continue,
            Err(ReadError::Store(e)) => panic!("storage failed: {e}"),
            Ok(None) => return Got::Missing,
            Ok(Some(c)) => c,
        };
        let mut v: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        match kind {
            Kind::List => ok(s.lrange(c, 0, -1, |e| v.push((e.to_vec(), Vec::new())))),
            Kind::Hash => ok(s.hwalk(c, |f, x| v.push((f.to_vec(), x.to_vec())))),
            Kind::Set => ok(s.smembers(c, |m| v.push((m.to_vec(), Vec::new())))),
            _ => {
                let all = RangeSpec {
                    query: RangeQuery::Rank(0, -1),
                    rev: false,
                    offset: 0,
                    limit: -1,
                };
                ok(s.zrange(c, &all, |m, sc| {
                    v.push((m.to_vec(), sc.to_bits().to_be_bytes().to_vec()))
                }));
            }
        }
        assert_eq!(
            v.len() as u64,
            s.len(c),
            "{kind:?} length against its elements"
        );
        v.insert(0, (format!("{kind:?}").into_bytes(), Vec::new()));
        return Got::Pairs(v);
    }
    // No collection kind: a string.
    Got::WrongType
}

/// Compares every read in `reads` and the whole keyspace on the model and on LMDB (`cx`).
fn compare(model: &Model, cx: &ReadCx<'_, '_>, reads: &[Read], at: &str) {
    for read in reads {
        assert_eq!(run(cx, read), run(model, read), "{at}: {read:?}");
    }
    for k in KEYS {
        let read = Read::Whole(k.to_vec());
        assert_eq!(
            run(cx, &read),
            run(model, &read),
            "{at}: key {:?}",
            String::from_utf8_lossy(k)
        );
    }
}

fn run_seed(seed: u64, steps: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = LmdbStore::open(dir.path(), 1 << 30, 16).expect("open store");
    let mut model = Model::default();
    let mut g = Gen(Rng(seed));
    let mut cas = 1u64;
    let mut step = 0;
    let (mut writes, mut reads, mut biggest_zset) = (0usize, 0usize, 0usize);
    while step < steps {
        let mut txn = store.write_txn().expect("write txn");
        for _ in 0..g.int(1, 6) {
            step += 1;
            let at = format!("seed {seed} step {step}");
            if g.chance(12) {
                // DEL of whatever is there.
                let key = g.pick(&KEYS);
                store
                    .writer(&mut txn, &mut cas)
                    .delete(key)
                    .expect("delete");
                model.delete(key);
            } else if g.chance(40) {
                // A string: collection commands on it are WRONGTYPE; STORE forms replace it.
                let (key, value) = (g.pick(&KEYS).to_vec(), g.value());
                let mut w = store.writer(&mut txn, &mut cas);
                let meta = ItemMeta::new(Kind::String, 0, 0, w.next_cas());
                w.put(&key, &meta, &[&value]).expect("put string");
                model.put_other(&key, &value);
            } else {
                let op = g.write();
                let Some(want) = model.apply(&op) else {
                    panic!("{at}: the model runs no {op:?}");
                };
                let got = types::apply(&mut store.writer(&mut txn, &mut cas), &op, 0)
                    .unwrap_or_else(|e| panic!("{at}: {op:?}: storage failed: {e}"));
                assert_eq!(got, want, "{at}: {op:?}");
                writes += 1;
            }
            // Read inside the transaction, as EXEC and scripts do.
            let batch: Vec<Read> = (0..g.int(0, 3)).map(|_| g.read()).collect();
            reads += batch.len();
            let snap = Snap::within(&store, &txn);
            let cx = ReadCx {
                store: &snap,
                txn: &txn,
                now: 0,
                flushed: false,
            };
            compare(&model, &cx, &batch, &format!("{at} (in its transaction)"));
        }
        txn.commit_unlogged().expect("commit");
        for v in model.keys().values() {
            if let Value::ZSet(_) = v {
                biggest_zset = biggest_zset.max(v.len());
            }
        }
        // And from a snapshot of what was committed, as a worker reads.
        let snap = Snap::open(&store).expect("snapshot");
        let cx = ReadCx {
            store: &snap,
            txn: snap.txn(),
            now: 0,
            flushed: false,
        };
        let batch: Vec<Read> = (0..g.int(1, 4)).map(|_| g.read()).collect();
        reads += batch.len();
        compare(
            &model,
            &cx,
            &batch,
            &format!("seed {seed} after step {step}"),
        );
    }
    // The stream did what it is for: kinds met, and reads found things.
    assert!(writes > steps / 2, "{writes} writes");
    assert!(reads > steps, "{reads} reads");
    // More than one chunk of the rank directory (256 entries each).
    assert!(
        biggest_zset > 256,
        "largest sorted set: {biggest_zset} members"
    );
}

#[test]
fn typed_collection_operations_match_the_model() {
    for seed in [0x9e37_79b9_7f4a_7c15, 7, 0xdead_beef, 1 << 40 | 12345] {
        run_seed(seed, 1500);
    }
}
