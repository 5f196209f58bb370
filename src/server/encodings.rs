//! Redis's encoding thresholds (`hash-max-listpack-entries`, `set-max-intset-entries`,
//! `list-max-listpack-size`, ...): CONFIG SET takes them and CONFIG GET answers what was set, so
//! clients and tools that tune them keep working, but they change nothing. In Redis they pick
//! a collection's in-memory representation (a compact listpack or intset below the threshold, a
//! hash table or skiplist above); memkeep keeps every collection one way on LMDB, so no reply
//! depends on them. Values are checked as Redis checks them (integers within its ranges).

use std::sync::Mutex;

use crate::commands::args::Args;
use crate::protocol::resp::{enc, parse_i64};

/// Each threshold: its name, Redis 7's older alias, its default, and its range.
const PARAMS: &[(&str, &str, i64, i64, i64)] = &[
    (
        "hash-max-listpack-entries",
        "hash-max-ziplist-entries",
        128,
        0,
        i64::MAX,
    ),
    (
        "hash-max-listpack-value",
        "hash-max-ziplist-value",
        64,
        0,
        i64::MAX,
    ),
    (
        "zset-max-listpack-entries",
        "zset-max-ziplist-entries",
        128,
        0,
        i64::MAX,
    ),
    (
        "zset-max-listpack-value",
        "zset-max-ziplist-value",
        64,
        0,
        i64::MAX,
    ),
    (
        "list-max-listpack-size",
        "list-max-ziplist-size",
        -2,
        i32::MIN as i64,
        i32::MAX as i64,
    ),
    ("list-compress-depth", "", 0, 0, i32::MAX as i64),
    ("set-max-intset-entries", "", 512, 0, i64::MAX),
];

/// The thresholds' current values, in `PARAMS` order.
pub struct Encodings {
    values: Mutex<Vec<i64>>,
}

impl Default for Encodings {
    fn default() -> Self {
        Encodings {
            values: Mutex::new(PARAMS.iter().map(|p| p.2).collect()),
        }
    }
}

fn position(name: &[u8]) -> Option<usize> {
    PARAMS.iter().position(|p| {
        name.eq_ignore_ascii_case(p.0.as_bytes())
            || (!p.1.is_empty() && name.eq_ignore_ascii_case(p.1.as_bytes()))
    })
}

impl Encodings {
    /// Whether `name` is one of the thresholds (by its name or its alias).
    pub fn known(name: &[u8]) -> bool {
        position(name).is_some()
    }

    /// CONFIG SET of `name value` pairs from argument 2 on, all of them thresholds: every value
    /// is checked before any is applied, as Redis applies a CONFIG SET whole or not at all.
    pub fn config_set(&self, args: Args<'_>, out: &mut Vec<u8>) {
        let mut next = match self.values.lock() {
            Ok(v) => v.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let mut seen = Vec::new();
        for i in (2..args.len()).step_by(2) {
            let (name, value) = (args.get(i), args.get(i + 1));
            let Some(at) = position(name) else {
                return enc::error(out, "ERR syntax error");
            };
            let (_, _, _, lo, hi) = PARAMS[at];
            let why = if seen.contains(&at) {
                Some("duplicate parameter".to_string())
            } else {
                seen.push(at);
                match parse_i64(value) {
                    None => Some("argument couldn't be parsed into an integer".to_string()),
                    Some(n) if !(lo..=hi).contains(&n) => {
                        Some(format!("argument must be between {lo} and {hi} inclusive"))
                    }
                    Some(n) => {
                        next[at] = n;
                        None
                    }
                }
            };
            if let Some(why) = why {
                return enc::error(
                    out,
                    &format!(
                        "ERR CONFIG SET failed (possibly related to argument '{}') - {why}",
                        String::from_utf8_lossy(name)
                    ),
                );
            }
        }
        match self.values.lock() {
            Ok(mut v) => *v = next,
            Err(p) => *p.into_inner() = next,
        }
        enc::ok(out);
    }

    /// `(name, value)` for CONFIG GET: each threshold under its name and its alias.
    pub fn params(&self) -> Vec<(&'static str, String)> {
        let values = match self.values.lock() {
            Ok(v) => v.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let mut out = Vec::new();
        for (p, v) in PARAMS.iter().zip(values) {
            out.push((p.0, v.to_string()));
            if !p.1.is_empty() {
                out.push((p.1, v.to_string()));
            }
        }
        out
    }
}
