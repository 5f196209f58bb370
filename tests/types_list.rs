//! Lists over the RESP port: replies, WRONGTYPE across types and protocols, O(1) DEL of a big
//! list, and a model test (seeded random operations against an in-test VecDeque, compared reply
//! by reply, across a restart).

mod common;

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use common::resp::{Reply, Resp};
use common::{Options, Server};

fn server() -> Server {
    Server::start_with(
        env!("CARGO_BIN_EXE_memkeep"),
        Options {
            resp: true,
            ..Options::default()
        },
    )
}

fn connect(s: &Server) -> Resp {
    Resp::connect(s.resp_addr().expect("RESP port"))
}

fn int(n: i64) -> Reply {
    Reply::Int(n)
}

#[test]
fn push_pop_range_and_index_answer_like_redis() {
    let s = server();
    let mut c = connect(&s);
    assert_eq!(c.cmd("RPUSH l a b c"), int(3));
    assert_eq!(c.cmd("LPUSH l z"), int(4));
    assert_eq!(c.cmd("LRANGE l 0 -1"), Reply::bulks(&["z", "a", "b", "c"]));
    assert_eq!(c.cmd("LRANGE l -2 100"), Reply::bulks(&["b", "c"]));
    assert_eq!(c.cmd("LRANGE l 3 1"), Reply::bulks(&[]));
    assert_eq!(c.cmd("LINDEX l -1"), Reply::bulk("c"));
    assert_eq!(c.cmd("LINDEX l 9"), Reply::Bulk(None));
    assert_eq!(c.cmd("LPOP l"), Reply::bulk("z"));
    assert_eq!(c.cmd("RPOP l 2"), Reply::bulks(&["c", "b"]));
    assert_eq!(c.cmd("LPOP nolist 2"), Reply::Array(None));
    assert_eq!(c.cmd("LPOP nolist"), Reply::Bulk(None));
    assert_eq!(c.cmd("LPUSHX nolist a"), int(0));
    assert_eq!(
        c.cmd("LSET l 5 x"),
        Reply::Error("ERR index out of range".into())
    );
    assert_eq!(
        c.cmd("LSET nolist 0 x"),
        Reply::Error("ERR no such key".into())
    );
    assert_eq!(c.cmd("LINSERT l BEFORE a first"), int(2));
    assert_eq!(c.cmd("LINSERT l AFTER missing x"), int(-1));
    assert_eq!(c.cmd("LPOS l a"), int(1));
    assert_eq!(c.cmd("LLEN l"), int(2));
    assert_eq!(c.cmd("TYPE l"), Reply::Simple("list".into()));
    // Popping the last element deletes the key.
    assert_eq!(c.cmd("RPOP l 5"), Reply::bulks(&["a", "first"]));
    assert_eq!(c.cmd("EXISTS l"), int(0));
    assert_eq!(c.cmd("TYPE l"), Reply::Simple("none".into()));
}

#[test]
fn lists_and_strings_refuse_each_other_on_both_protocols() {
    let s = server();
    let mut c = connect(&s);
    let wrong =
        Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into());
    assert_eq!(c.cmd("SET s v"), Reply::Simple("OK".into()));
    assert_eq!(c.cmd("LPUSH s x"), wrong);
    assert_eq!(c.cmd("RPUSH l x"), int(1));
    assert_eq!(c.cmd("GET l"), wrong);
    assert_eq!(c.cmd("INCR l"), wrong);
    assert_eq!(c.cmd("APPEND l x"), wrong);
    assert_eq!(
        c.cmd("MGET l s"),
        Reply::array(vec![Reply::Bulk(None), Reply::bulk("v")])
    );
    // memcached clients see a client error for the whole get, and for in-place changes.
    let mut mc = s.connect();
    mc.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    mc.write_all(b"get s l\r\nincr l 1\r\nappend l 0 0 1\r\nx\r\nget s\r\n")
        .expect("send");
    let mut r = BufReader::new(mc);
    let mut lines = Vec::new();
    for _ in 0..6 {
        let mut l = String::new();
        r.read_line(&mut l).expect("reply");
        lines.push(l);
    }
    let wt = "CLIENT_ERROR WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
    assert_eq!(lines, [wt, wt, wt, "VALUE s 0 1\r\n", "v\r\n", "END\r\n"]);
    // A plain SET replaces a list, as in Redis.
    assert_eq!(c.cmd("SET l now-a-string"), Reply::Simple("OK".into()));
    assert_eq!(c.cmd("GET l"), Reply::bulk("now-a-string"));
    assert_eq!(c.cmd("LLEN l"), wrong);
}

#[test]
fn deleting_a_big_list_is_immediate_and_the_key_is_reusable() {
    let s = server();
    let mut c = connect(&s);
    // 50,000 elements in 50 pipelined pushes.
    let values: Vec<String> = (0..1000).map(|i| format!("v{i}")).collect();
    let mut args: Vec<&[u8]> = vec![b"RPUSH", b"big"];
    args.extend(values.iter().map(|v| v.as_bytes()));
    for _ in 0..50 {
        c.send(&args);
    }
    let mut last = Reply::Null;
    for _ in 0..50 {
        last = c.read();
    }
    assert_eq!(last, int(50_000));
    let t = Instant::now();
    assert_eq!(c.cmd("DEL big"), int(1));
    let del_time = t.elapsed();
    assert_eq!(c.cmd("EXISTS big"), int(0));
    assert_eq!(c.cmd("RPUSH big fresh"), int(1));
    assert_eq!(c.cmd("LRANGE big 0 -1"), Reply::bulks(&["fresh"]));
    // Generous bound: reclaiming 50,000 elements happens later, in the writer's spare time.
    assert!(del_time < Duration::from_secs(5), "DEL took {del_time:?}");
}

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
}

/// Redis's range clamp on a model list.
fn clamp(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
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

fn bulks(v: impl IntoIterator<Item = String>) -> Reply {
    Reply::Array(Some(
        v.into_iter()
            .map(|s| Reply::Bulk(Some(s.into_bytes())))
            .collect(),
    ))
}

/// Applies one random command to the model and returns (command, expected reply).
fn step(rng: &mut Rng, model: &mut HashMap<String, VecDeque<String>>) -> (Vec<String>, Reply) {
    let keys = ["a", "b", "c"];
    let key = keys[rng.below(3) as usize].to_string();
    let val = || -> String { String::new() };
    let _ = val;
    let v = |rng: &mut Rng| format!("v{}", rng.below(6));
    let list = model.entry(key.clone()).or_default();
    let cmd: Vec<String>;
    let reply = match rng.below(13) {
        0 | 1 => {
            let left = rng.below(2) == 0;
            let n = 1 + rng.below(3);
            let vals: Vec<String> = (0..n).map(|_| v(rng)).collect();
            for x in &vals {
                if left {
                    list.push_front(x.clone())
                } else {
                    list.push_back(x.clone())
                }
            }
            cmd = [
                if left { "LPUSH" } else { "RPUSH" }.to_string(),
                key.clone(),
            ]
            .into_iter()
            .chain(vals)
            .collect();
            Reply::Int(list.len() as i64)
        }
        2 => {
            let left = rng.below(2) == 0;
            let name = if left { "LPOP" } else { "RPOP" };
            if rng.below(2) == 0 {
                cmd = vec![name.into(), key.clone()];
                let x = if left {
                    list.pop_front()
                } else {
                    list.pop_back()
                };
                Reply::Bulk(x.map(String::into_bytes))
            } else {
                let n = rng.below(4);
                cmd = vec![name.into(), key.clone(), n.to_string()];
                if list.is_empty() {
                    Reply::Array(None)
                } else {
                    let got: Vec<String> = (0..n)
                        .filter_map(|_| {
                            if left {
                                list.pop_front()
                            } else {
                                list.pop_back()
                            }
                        })
                        .collect();
                    bulks(got)
                }
            }
        }
        3 | 4 => {
            let (s, e) = (rng.range(-6, 6), rng.range(-6, 6));
            cmd = vec!["LRANGE".into(), key.clone(), s.to_string(), e.to_string()];
            match clamp(s, e, list.len()) {
                Some((s, e)) => bulks(list.range(s..=e).cloned()),
                None => bulks(Vec::new()),
            }
        }
        5 => {
            cmd = vec!["LLEN".into(), key.clone()];
            Reply::Int(list.len() as i64)
        }
        6 => {
            let i = rng.range(-5, 5);
            cmd = vec!["LINDEX".into(), key.clone(), i.to_string()];
            let idx = if i < 0 { list.len() as i64 + i } else { i };
            Reply::Bulk(
                usize::try_from(idx)
                    .ok()
                    .and_then(|i| list.get(i))
                    .map(|s| s.clone().into_bytes()),
            )
        }
        7 => {
            let i = rng.range(-4, 4);
            let x = v(rng);
            cmd = vec!["LSET".into(), key.clone(), i.to_string(), x.clone()];
            let idx = if i < 0 { list.len() as i64 + i } else { i };
            if list.is_empty() {
                Reply::Error("ERR no such key".into())
            } else if let Some(slot) = usize::try_from(idx).ok().and_then(|i| list.get_mut(i)) {
                *slot = x;
                Reply::Simple("OK".into())
            } else {
                Reply::Error("ERR index out of range".into())
            }
        }
        8 => {
            let count = rng.range(-2, 2);
            let x = v(rng);
            cmd = vec!["LREM".into(), key.clone(), count.to_string(), x.clone()];
            let limit = if count == 0 {
                usize::MAX
            } else {
                count.unsigned_abs() as usize
            };
            let mut removed = 0;
            let order: Vec<usize> = if count < 0 {
                (0..list.len()).rev().collect()
            } else {
                (0..list.len()).collect()
            };
            let mut drop = vec![false; list.len()];
            for i in order {
                if removed < limit && list[i] == x {
                    drop[i] = true;
                    removed += 1;
                }
            }
            let mut it = drop.iter();
            list.retain(|_| !*it.next().unwrap_or(&false));
            Reply::Int(removed as i64)
        }
        9 => {
            let (s, e) = (rng.range(-5, 5), rng.range(-5, 5));
            cmd = vec!["LTRIM".into(), key.clone(), s.to_string(), e.to_string()];
            match clamp(s, e, list.len()) {
                Some((s, e)) => {
                    *list = list.range(s..=e).cloned().collect();
                }
                None => list.clear(),
            }
            Reply::Simple("OK".into())
        }
        10 => {
            let before = rng.below(2) == 0;
            let (pivot, x) = (v(rng), v(rng));
            cmd = vec![
                "LINSERT".into(),
                key.clone(),
                if before { "BEFORE" } else { "AFTER" }.into(),
                pivot.clone(),
                x.clone(),
            ];
            if list.is_empty() {
                Reply::Int(0)
            } else if let Some(at) = list.iter().position(|e| *e == pivot) {
                list.insert(if before { at } else { at + 1 }, x);
                Reply::Int(list.len() as i64)
            } else {
                Reply::Int(-1)
            }
        }
        11 => {
            let x = v(rng);
            cmd = vec!["LPOS".into(), key.clone(), x.clone()];
            Reply::Int(match list.iter().position(|e| *e == x) {
                Some(i) => i as i64,
                None => return (cmd, Reply::Bulk(None)),
            })
        }
        _ => {
            let dst = keys[rng.below(3) as usize].to_string();
            let (from_left, to_left) = (rng.below(2) == 0, rng.below(2) == 0);
            let side = |l: bool| if l { "LEFT" } else { "RIGHT" }.to_string();
            cmd = vec![
                "LMOVE".into(),
                key.clone(),
                dst.clone(),
                side(from_left),
                side(to_left),
            ];
            let x = if from_left {
                list.pop_front()
            } else {
                list.pop_back()
            };
            match x {
                None => Reply::Bulk(None),
                Some(x) => {
                    let d = model.entry(dst).or_default();
                    if to_left {
                        d.push_front(x.clone())
                    } else {
                        d.push_back(x.clone())
                    }
                    Reply::Bulk(Some(x.into_bytes()))
                }
            }
        }
    };
    (cmd, reply)
}

#[test]
fn random_list_operations_match_a_model_across_a_restart() {
    let mut s = server();
    let mut c = connect(&s);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut model: HashMap<String, VecDeque<String>> = HashMap::new();
    for i in 0..3000 {
        if i == 1500 {
            s.restart();
            c = connect(&s);
        }
        let (cmd, want) = step(&mut rng, &mut model);
        let args: Vec<&[u8]> = cmd.iter().map(|a| a.as_bytes()).collect();
        let got = c.call(&args);
        assert_eq!(got, want, "step {i}: {}", cmd.join(" "));
    }
    // The model's final state, read back in full.
    for (k, list) in &model {
        let got = c.call(&[b"LRANGE", k.as_bytes(), b"0", b"-1"]);
        assert_eq!(got, bulks(list.iter().cloned()), "final state of {k}");
        let exists = c.call(&[b"EXISTS", k.as_bytes()]);
        assert_eq!(
            exists,
            Reply::Int(!list.is_empty() as i64),
            "empty lists are deleted: {k}"
        );
    }
}
