//! The bit commands (SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP, BITFIELD, BITFIELD_RO) and LCS
//! over the RESP port, as a model test: seeded random commands against a naive model written
//! here bit by bit (a map of byte strings), compared reply by reply, across a restart, then
//! every value read back, and the stopped store checked by `memkeep check`. With
//! `MEMKEEP_CONFORMANCE=redis` the same commands run against redis-server 7.0 instead (no
//! restart), which proves the model right. The goldens (`proto/resp/bits.txt`) pin the errors.
//!
//! Invariants: every read has the client's timeout; the run is deterministic (its seed); field
//! values stay within 2^40, where Redis's overflow arithmetic is exact.

mod common;

use std::collections::HashMap;

use common::resp::{Reply, Resp};
use common::{Options, Server};

const KEYS: [&str; 4] = ["b1", "b2", "b3", "l"];
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Deterministic pseudo-random numbers (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }
}

/// The strings (the list under `l` is only there to be refused).
type Model = HashMap<String, Vec<u8>>;

fn bit(v: &[u8], i: u64) -> bool {
    let byte = (i / 8) as usize;
    byte < v.len() && v[byte] & (1 << (7 - i % 8)) != 0
}

fn put_bit(v: &mut Vec<u8>, i: u64, on: bool) {
    let byte = (i / 8) as usize;
    if v.len() <= byte {
        v.resize(byte + 1, 0);
    }
    if on {
        v[byte] |= 1 << (7 - i % 8);
    } else {
        v[byte] &= !(1 << (7 - i % 8));
    }
}

/// A range argument (often negative or past the end).
fn index(rng: &mut Rng) -> i64 {
    if rng.below(4) == 0 {
        rng.range(-200, 200)
    } else {
        rng.pick(&[
            0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 40, -1, -2, -3, -8, -9, -17, -100,
        ])
    }
}

/// Redis's range rule: negatives from the end, clamped; bits `first..=last`, or None.
fn bits_of(start: i64, end: i64, bit_mode: bool, len: usize) -> Option<(u64, u64)> {
    let total = len as i64 * if bit_mode { 8 } else { 1 };
    let mut s = if start < 0 { total + start } else { start };
    let mut e = if end < 0 { total + end } else { end };
    s = s.max(0);
    e = e.max(0);
    if e >= total {
        e = total - 1;
    }
    if s > e {
        return None;
    }
    let (s, e) = (s as u64, e as u64);
    Some(if bit_mode { (s, e) } else { (s * 8, e * 8 + 7) })
}

/// A BITFIELD field: (signed, width, bit offset) and how it was written.
fn field(rng: &mut Rng) -> (bool, u32, u64, String, String) {
    let signed = rng.below(2) == 0;
    let bits = rng.pick(&[1u32, 2, 3, 4, 5, 7, 8, 9, 15, 16, 31, 32, 33, 62, 63, 64]);
    let bits = if !signed && bits == 64 { 63 } else { bits };
    let (offset, text) = if rng.below(5) == 0 {
        let n = rng.below(10);
        (n * u64::from(bits), format!("#{n}"))
    } else {
        let o = rng.below(120);
        (o, o.to_string())
    };
    let ty = format!("{}{bits}", if signed { 'i' } else { 'u' });
    (signed, bits, offset, ty, text)
}

fn get_field(v: &[u8], signed: bool, bits: u32, offset: u64) -> i128 {
    let mut u: i128 = 0;
    for i in 0..u64::from(bits) {
        u = (u << 1) | i128::from(bit(v, offset + i));
    }
    if signed && u >= 1 << (bits - 1) {
        u -= 1 << bits;
    }
    u
}

fn put_field(v: &mut Vec<u8>, bits: u32, offset: u64, value: i128) {
    let u = value.rem_euclid(1 << bits);
    for i in 0..u64::from(bits) {
        put_bit(v, offset + i, (u >> (u64::from(bits) - 1 - i)) & 1 == 1);
    }
}

/// The LCS by the usual table, walking back as Redis does (up when that cell is larger, else
/// left).
fn lcs(a: &[u8], b: &[u8]) -> Vec<u8> {
    let w = b.len() + 1;
    let mut t = vec![0u32; (a.len() + 1) * w];
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            t[i * w + j] = if a[i - 1] == b[j - 1] {
                t[(i - 1) * w + j - 1] + 1
            } else {
                t[(i - 1) * w + j].max(t[i * w + j - 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (a.len(), b.len(), Vec::new());
    while i > 0 && j > 0 {
        if a[i - 1] == b[j - 1] {
            out.push(a[i - 1]);
            i -= 1;
            j -= 1;
        } else if t[(i - 1) * w + j] > t[i * w + j - 1] {
            i -= 1;
        } else {
            j -= 1;
        }
    }
    out.reverse();
    out
}

/// One random command and the reply the model expects (applying it to the model).
fn step(rng: &mut Rng, m: &mut Model) -> (Vec<Vec<u8>>, Reply) {
    let key = rng.pick(&KEYS).to_string();
    let is_list = key == "l";
    let mut cmd: Vec<Vec<u8>> = Vec::new();
    let mut arg = |s: &str| cmd.push(s.as_bytes().to_vec());
    let wrong = Reply::Error(WRONGTYPE.into());
    let reply = match rng.below(11) {
        0 | 1 => {
            let (i, on) = (rng.below(100), rng.below(2) == 1);
            for a in ["SETBIT", &key, &i.to_string(), if on { "1" } else { "0" }] {
                arg(a);
            }
            if is_list {
                wrong
            } else {
                let v = m.entry(key).or_default();
                let old = bit(v, i);
                put_bit(v, i, on);
                Reply::Int(old.into())
            }
        }
        2 => {
            let i = rng.below(100);
            for a in ["GETBIT", &key, &i.to_string()] {
                arg(a);
            }
            match m.get(&key) {
                _ if is_list => wrong,
                v => Reply::Int(bit(v.map_or(&[][..], |v| v), i).into()),
            }
        }
        3 => {
            arg("BITCOUNT");
            arg(&key);
            let range = (rng.below(5) != 0).then(|| (index(rng), index(rng)));
            let unit = (range.is_some() && rng.below(2) == 0).then(|| rng.below(2) == 0);
            if let Some((s, e)) = range {
                arg(&s.to_string());
                arg(&e.to_string());
            }
            if let Some(b) = unit {
                arg(if b { "BIT" } else { "BYTE" });
            }
            match m.get(&key) {
                _ if is_list => wrong,
                None => Reply::Int(0),
                Some(v) => {
                    let r = match range {
                        None => (!v.is_empty()).then(|| (0, v.len() as u64 * 8 - 1)),
                        Some((s, e)) if s < 0 && e < 0 && s > e => None,
                        Some((s, e)) => bits_of(s, e, unit.unwrap_or(false), v.len()),
                    };
                    Reply::Int(r.map_or(0, |(f, l)| (f..=l).filter(|&i| bit(v, i)).count()) as i64)
                }
            }
        }
        4 => {
            let want = rng.below(2) == 1;
            arg("BITPOS");
            arg(&key);
            arg(if want { "1" } else { "0" });
            let n = rng.below(4);
            let start = (n >= 1).then(|| index(rng));
            let end = (n >= 2).then(|| index(rng));
            let unit = n >= 3 && rng.below(2) == 0;
            for x in [start, end].into_iter().flatten() {
                arg(&x.to_string());
            }
            if n >= 3 {
                arg(if unit { "BIT" } else { "BYTE" });
            }
            match m.get(&key) {
                _ if is_list => wrong,
                None => Reply::Int(if want { -1 } else { 0 }),
                Some(v) => {
                    let r = match start {
                        None => (!v.is_empty()).then(|| (0, v.len() as u64 * 8 - 1)),
                        Some(s) => bits_of(s, end.unwrap_or(i64::MAX), unit, v.len()),
                    };
                    Reply::Int(match r {
                        None => -1,
                        Some((f, l)) => match (f..=l).find(|&i| bit(v, i) == want) {
                            Some(i) => i as i64,
                            None if !want && end.is_none() => l as i64 + 1,
                            None => -1,
                        },
                    })
                }
            }
        }
        5 | 6 => {
            let ro = rng.below(3) == 0;
            arg(if ro { "BITFIELD_RO" } else { "BITFIELD" });
            arg(&key);
            let mut ops = Vec::new();
            let mut ow = 0;
            for _ in 0..rng.range(1, 4) {
                let kind = if ro && rng.below(4) != 0 {
                    0
                } else {
                    rng.below(4)
                };
                if kind == 3 {
                    ow = rng.below(3);
                    arg("OVERFLOW");
                    arg(["WRAP", "SAT", "FAIL"][ow as usize]);
                    continue;
                }
                let (signed, bits, offset, ty, text) = field(rng);
                let value = i128::from(rng.range(-(1 << 40), 1 << 40)) >> rng.below(40);
                arg(["GET", "SET", "INCRBY"][kind as usize]);
                arg(&ty);
                arg(&text);
                if kind > 0 {
                    arg(&value.to_string());
                }
                ops.push((kind, signed, bits, offset, value, ow));
            }
            let writes = ops.iter().any(|o| o.0 != 0);
            if ro && writes {
                Reply::Error("ERR BITFIELD_RO only supports the GET subcommand".into())
            } else if is_list {
                wrong
            } else {
                let mut v = m.get(&key).cloned().unwrap_or_default();
                if let Some(last) = ops
                    .iter()
                    .filter(|o| o.0 != 0)
                    .map(|o| o.3 + u64::from(o.2))
                    .max()
                {
                    let was = bit(&v, last - 1);
                    put_bit(&mut v, last - 1, was);
                }
                let mut out = Vec::new();
                for (kind, signed, bits, offset, value, ow) in ops {
                    let old = get_field(&v, signed, bits, offset);
                    if kind == 0 {
                        out.push(Reply::Int(old as i64));
                        continue;
                    }
                    let (min, max) = if signed {
                        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
                    } else {
                        (0, (1i128 << bits) - 1)
                    };
                    let x = match (kind, signed) {
                        // An unsigned SET takes the value as Redis does: as a u64.
                        (1, false) => i128::from(value as i64 as u64),
                        (1, true) => value,
                        _ => old + value,
                    };
                    let new = if (min..=max).contains(&x) {
                        Some(x)
                    } else {
                        match ow {
                            0 => {
                                let u = x.rem_euclid(1 << bits);
                                Some(if signed && u > max {
                                    u - (1 << bits)
                                } else {
                                    u
                                })
                            }
                            1 => Some(if x > max { max } else { min }),
                            _ => None,
                        }
                    };
                    match new {
                        None => out.push(Reply::Bulk(None)),
                        Some(n) => {
                            out.push(Reply::Int(if kind == 1 { old } else { n } as i64));
                            put_field(&mut v, bits, offset, n);
                        }
                    }
                }
                if writes {
                    m.insert(key, v);
                }
                Reply::Array(Some(out))
            }
        }
        7 => {
            let op = rng.pick(&["AND", "OR", "XOR", "NOT"]);
            let dest = rng.pick(&KEYS[..3]).to_string();
            let n = if op == "NOT" { 1 } else { rng.range(1, 3) };
            let srcs: Vec<String> = (0..n).map(|_| rng.pick(&KEYS).to_string()).collect();
            arg("BITOP");
            arg(op);
            arg(&dest);
            for s in &srcs {
                arg(s);
            }
            if srcs.iter().any(|s| s == "l") {
                wrong
            } else {
                let vals: Vec<Vec<u8>> = srcs
                    .iter()
                    .map(|s| m.get(s).cloned().unwrap_or_default())
                    .collect();
                let len = vals.iter().map(Vec::len).max().unwrap_or(0);
                let byte = |v: &Vec<u8>, i: usize| v.get(i).copied().unwrap_or(0);
                let res: Vec<u8> = (0..len)
                    .map(|i| {
                        let mut r = byte(&vals[0], i);
                        for v in &vals[1..] {
                            match op {
                                "AND" => r &= byte(v, i),
                                "OR" => r |= byte(v, i),
                                _ => r ^= byte(v, i),
                            }
                        }
                        if op == "NOT" { !r } else { r }
                    })
                    .collect();
                if len == 0 {
                    m.remove(&dest);
                } else {
                    m.insert(dest, res);
                }
                Reply::Int(len as i64)
            }
        }
        8 => {
            let other = rng.pick(&KEYS).to_string();
            let len = rng.below(2) == 0;
            arg("LCS");
            arg(&key);
            arg(&other);
            if len {
                arg("LEN");
            }
            if is_list || other == "l" {
                Reply::Error("ERR The specified keys must contain string values".into())
            } else {
                let empty = Vec::new();
                let a = m.get(&key).unwrap_or(&empty);
                let b = m.get(&other).unwrap_or(&empty);
                let s = lcs(a, b);
                if len {
                    Reply::Int(s.len() as i64)
                } else {
                    Reply::Bulk(Some(s))
                }
            }
        }
        9 if !is_list => {
            // A small string from a few letters, so LCS finds runs.
            let v: Vec<u8> = (0..rng.below(12))
                .map(|_| rng.pick(b"abcd\x00\xff"))
                .collect();
            arg("SET");
            arg(&key);
            cmd.push(v.clone());
            m.insert(key, v);
            Reply::Simple("OK".into())
        }
        _ => {
            arg("GET");
            arg(&key);
            match m.get(&key) {
                _ if is_list => wrong,
                v => Reply::Bulk(v.cloned()),
            }
        }
    };
    (cmd, reply)
}

fn run(server: &mut Server, restart: bool, seed: u64, steps: usize) {
    let addr = server.resp_addr().expect("a RESP port");
    let mut c = Resp::connect(addr);
    assert_eq!(c.cmd("FLUSHALL"), Reply::Simple("OK".into()));
    assert_eq!(c.cmd("RPUSH l x"), Reply::Int(1));
    let mut rng = Rng(seed);
    let mut model = Model::new();
    for i in 0..steps {
        if restart && i == steps / 2 {
            server.restart();
            c = Resp::connect(server.resp_addr().expect("a RESP port"));
        }
        let (cmd, want) = step(&mut rng, &mut model);
        let args: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
        let got = c.call(&args);
        assert_eq!(
            got,
            want,
            "step {i}: {}",
            String::from_utf8_lossy(&cmd.join(&b' '))
        );
    }
    for k in &KEYS[..3] {
        let want = Reply::Bulk(model.get(*k).cloned());
        assert_eq!(c.call(&[b"GET", k.as_bytes()]), want, "final value of {k}");
    }
}

#[test]
fn random_bit_commands_match_a_model() {
    if std::env::var("MEMKEEP_CONFORMANCE").as_deref() == Ok("redis") {
        let mut redis = Server::redis();
        run(&mut redis, false, 0x5eed_b175_0001, 4000);
        return;
    }
    let mut s = Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            ..Options::default()
        },
    );
    run(&mut s, true, 0x5eed_b175_0001, 4000);
    common::programs::assert_healthy(&mut s);
    s.stop();
    s.assert_check_clean();
}
