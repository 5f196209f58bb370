//! The fuzz targets (tests/fuzz, run by `make fuzz`) as property tests, so every `cargo test`
//! exercises their invariants without cargo-fuzz: the committed corpus is replayed as it is,
//! then a bounded number of mutants of it (and of random bytes) run through each target.
//! `PROPTEST_CASES` overrides the number of mutants per target.

#[path = "fuzz/src/lib.rs"]
mod fuzzing;

use std::path::Path;
use std::sync::LazyLock;

use proptest::prelude::*;
use proptest::sample::Index;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 4] = [
    ("memcache_parser", fuzzing::memcache_parser),
    ("resp_parser", fuzzing::resp_parser),
    ("binary_parser", fuzzing::binary_parser),
    ("command_stream", fuzzing::command_stream),
];

/// The committed corpus of `target` (seeds, fuzzer finds, regressions), in name order.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).expect("a corpus file"))
        .collect()
}

static CORPORA: LazyLock<Vec<Vec<Vec<u8>>>> =
    LazyLock::new(|| TARGETS.iter().map(|(name, _)| corpus(name)).collect());

#[test]
fn every_corpus_input_passes() {
    for (i, (name, target)) in TARGETS.iter().enumerate() {
        assert!(!CORPORA[i].is_empty(), "the {name} corpus is empty");
        for input in &CORPORA[i] {
            target(input);
        }
    }
}

/// One change to an input, as libFuzzer's mutators make them.
#[derive(Debug, Clone)]
enum Edit {
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
    /// Copies a slice of the input over another place in it.
    Copy(Index, Index, usize),
    Truncate(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    // Bytes the parsers care about, more often than their share.
    let byte = prop_oneof![
        3 => any::<u8>(),
        1 => prop::sample::select(b"\r\n *$0-+9\"\\x".to_vec()),
    ];
    prop_oneof![
        4 => (any::<Index>(), byte.clone()).prop_map(|(i, b)| Edit::Set(i, b)),
        2 => (any::<Index>(), prop::collection::vec(byte, 1..8)).prop_map(|(i, b)| Edit::Insert(i, b)),
        2 => (any::<Index>(), 1usize..16).prop_map(|(i, n)| Edit::Remove(i, n)),
        1 => (any::<Index>(), any::<Index>(), 1usize..64).prop_map(|(a, b, n)| Edit::Copy(a, b, n)),
        1 => any::<Index>().prop_map(Edit::Truncate),
    ]
}

fn apply(input: &mut Vec<u8>, e: &Edit) {
    let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len) };
    let len = input.len();
    match e {
        Edit::Set(i, b) if len > 0 => input[at(i, len)] = *b,
        Edit::Set(..) => input.push(0),
        Edit::Insert(i, bytes) => {
            let i = at(i, len + 1);
            input.splice(i..i, bytes.iter().copied());
        }
        Edit::Remove(i, n) => {
            let i = at(i, len);
            input.drain(i..(i + n).min(len));
        }
        Edit::Copy(from, to, n) => {
            let (from, to) = (at(from, len), at(to, len));
            let n = (*n).min(len - from).min(len - to);
            input.copy_within(from..from + n, to);
        }
        Edit::Truncate(i) => input.truncate(at(i, len + 1)),
    }
}

/// A corpus input of target `t` with a few edits, or random bytes.
fn input(t: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (any::<Index>(), prop::collection::vec(edit(), 0..6)).prop_map(move |(i, edits)| {
            let corpus = &CORPORA[t];
            let mut input = corpus[i.index(corpus.len())].clone();
            edits.iter().for_each(|e| apply(&mut input, e));
            input
        }),
        1 => prop::collection::vec(any::<u8>(), 0..1024),
    ]
}

fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(n.unwrap_or(default))
}

proptest! {
    #![proptest_config(cases(10000))]

    #[test]
    fn memcache_parser(buf in input(0)) {
        fuzzing::memcache_parser(&buf);
    }

    #[test]
    fn resp_parser(buf in input(1)) {
        fuzzing::resp_parser(&buf);
    }

    #[test]
    fn binary_parser(buf in input(2)) {
        fuzzing::binary_parser(&buf);
    }
}

proptest! {
    #![proptest_config(cases(4000))]

    #[test]
    fn command_stream(buf in input(3)) {
        fuzzing::command_stream(&buf);
    }
}
