//! Property tests for the memcached text-protocol parser.

use memkeep::protocol::memcache::*;
use proptest::prelude::*;

/// An owned description of a valid request, rendered to bytes and compared with the parse.
#[derive(Debug, Clone)]
enum Req {
    Get {
        keys: Vec<Vec<u8>>,
        with_cas: bool,
    },
    Gat {
        exptime: i64,
        keys: Vec<Vec<u8>>,
        with_cas: bool,
    },
    Store {
        mode: StoreMode,
        key: Vec<u8>,
        flags: u32,
        exptime: i64,
        cas: u64,
        data: Vec<u8>,
        noreply: bool,
    },
    Delete {
        key: Vec<u8>,
        zero: bool,
        noreply: bool,
    },
    Arith {
        key: Vec<u8>,
        incr: bool,
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: Vec<u8>,
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: Option<i64>,
        noreply: bool,
    },
    Stats {
        args: Vec<Vec<u8>>,
    },
    Version,
    Verbosity {
        level: u32,
        noreply: bool,
    },
    Quit,
    DebugAdvanceClock {
        seconds: u64,
    },
}

/// A request plus how it is spelled: separator width, leading spaces, line ending.
#[derive(Debug, Clone)]
struct Spelled {
    req: Req,
    sep: usize,
    lead: usize,
    crlf: bool,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::collection::vec(prop_oneof![0x21u8..0x7f, 0x80u8..=0xff], 1..12),
        1 => prop::collection::vec(prop_oneof![0x21u8..0x7f, 0x80u8..=0xff], 1..=KEY_MAX),
    ]
}

fn data() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        // Data full of line endings.
        prop::collection::vec(
            prop_oneof![Just(b'\r'), Just(b'\n'), Just(b' '), any::<u8>()],
            0..64
        ),
    ]
}

fn mode() -> impl Strategy<Value = StoreMode> {
    prop_oneof![
        Just(StoreMode::Set),
        Just(StoreMode::Add),
        Just(StoreMode::Replace),
        Just(StoreMode::Append),
        Just(StoreMode::Prepend),
        Just(StoreMode::Cas),
    ]
}

fn req() -> impl Strategy<Value = Req> {
    let stat_arg = prop::collection::vec(0x21u8..0x7f, 1..10);
    prop_oneof![
        (prop::collection::vec(key(), 1..8), any::<bool>())
            .prop_map(|(keys, with_cas)| Req::Get { keys, with_cas }),
        (
            any::<i64>(),
            prop::collection::vec(key(), 0..8),
            any::<bool>()
        )
            .prop_map(|(exptime, keys, with_cas)| Req::Gat {
                exptime,
                keys,
                with_cas
            }),
        (
            mode(),
            key(),
            any::<u32>(),
            any::<i64>(),
            any::<u64>(),
            data(),
            any::<bool>()
        )
            .prop_map(|(mode, key, flags, exptime, cas, data, noreply)| {
                let cas = if mode == StoreMode::Cas { cas } else { 0 };
                Req::Store {
                    mode,
                    key,
                    flags,
                    exptime,
                    cas,
                    data,
                    noreply,
                }
            }),
        (key(), any::<bool>(), any::<bool>()).prop_map(|(key, zero, noreply)| Req::Delete {
            key,
            zero,
            noreply
        }),
        (key(), any::<bool>(), any::<u64>(), any::<bool>()).prop_map(
            |(key, incr, delta, noreply)| Req::Arith {
                key,
                incr,
                delta,
                noreply
            }
        ),
        (key(), any::<i64>(), any::<bool>()).prop_map(|(key, exptime, noreply)| Req::Touch {
            key,
            exptime,
            noreply
        }),
        (prop::option::of(any::<i64>()), any::<bool>())
            .prop_map(|(delay, noreply)| Req::FlushAll { delay, noreply }),
        prop::collection::vec(stat_arg, 0..4).prop_map(|args| Req::Stats { args }),
        Just(Req::Version),
        (any::<u32>(), any::<bool>())
            .prop_map(|(level, noreply)| Req::Verbosity { level, noreply }),
        Just(Req::Quit),
        any::<u64>().prop_map(|seconds| Req::DebugAdvanceClock { seconds }),
    ]
}

fn spelled() -> impl Strategy<Value = Spelled> {
    (req(), 1usize..4, 0usize..3, any::<bool>()).prop_map(|(req, sep, lead, crlf)| Spelled {
        req,
        sep,
        lead,
        crlf,
    })
}

fn mode_name(mode: StoreMode) -> &'static str {
    match mode {
        StoreMode::Set => "set",
        StoreMode::Add => "add",
        StoreMode::Replace => "replace",
        StoreMode::Append => "append",
        StoreMode::Prepend => "prepend",
        StoreMode::Cas => "cas",
    }
}

fn render(s: &Spelled) -> Vec<u8> {
    let mut toks: Vec<Vec<u8>> = Vec::new();
    let mut t = |x: &[u8]| toks.push(x.to_vec());
    let mut data = None;
    match &s.req {
        Req::Get { keys, with_cas } => {
            t(if *with_cas { b"gets" } else { b"get" });
            keys.iter().for_each(|k| t(k));
        }
        Req::Gat {
            exptime,
            keys,
            with_cas,
        } => {
            t(if *with_cas { b"gats" } else { b"gat" });
            t(exptime.to_string().as_bytes());
            keys.iter().for_each(|k| t(k));
        }
        Req::Store {
            mode,
            key,
            flags,
            exptime,
            cas,
            data: d,
            noreply,
        } => {
            t(mode_name(*mode).as_bytes());
            t(key);
            t(flags.to_string().as_bytes());
            t(exptime.to_string().as_bytes());
            t(d.len().to_string().as_bytes());
            if *mode == StoreMode::Cas {
                t(cas.to_string().as_bytes());
            }
            if *noreply {
                t(b"noreply");
            }
            data = Some(d.clone());
        }
        Req::Delete { key, zero, noreply } => {
            t(b"delete");
            t(key);
            if *zero {
                t(b"0");
            }
            if *noreply {
                t(b"noreply");
            }
        }
        Req::Arith {
            key,
            incr,
            delta,
            noreply,
        } => {
            t(if *incr { b"incr" } else { b"decr" });
            t(key);
            t(delta.to_string().as_bytes());
            if *noreply {
                t(b"noreply");
            }
        }
        Req::Touch {
            key,
            exptime,
            noreply,
        } => {
            t(b"touch");
            t(key);
            t(exptime.to_string().as_bytes());
            if *noreply {
                t(b"noreply");
            }
        }
        Req::FlushAll { delay, noreply } => {
            t(b"flush_all");
            if let Some(d) = delay {
                t(d.to_string().as_bytes());
            }
            if *noreply {
                t(b"noreply");
            }
        }
        Req::Stats { args } => {
            t(b"stats");
            args.iter().for_each(|a| t(a));
        }
        Req::Version => t(b"version"),
        Req::Verbosity { level, noreply } => {
            t(b"verbosity");
            t(level.to_string().as_bytes());
            if *noreply {
                t(b"noreply");
            }
        }
        Req::Quit => t(b"quit"),
        Req::DebugAdvanceClock { seconds } => {
            t(b"debug_advance_clock");
            t(seconds.to_string().as_bytes());
        }
    }
    let mut out = vec![b' '; s.lead];
    out.extend_from_slice(&toks.join(&vec![b' '; s.sep][..]));
    out.extend_from_slice(if s.crlf { b"\r\n" } else { b"\n" });
    if let Some(d) = data {
        out.extend_from_slice(&d);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn owned_keys(keys: &KeyList<'_>) -> Vec<Vec<u8>> {
    keys.iter().map(<[u8]>::to_vec).collect()
}

fn stat_args(args: &[Vec<u8>], sep: usize) -> Vec<u8> {
    args.join(&vec![b' '; sep][..])
}

/// Does the parsed request say what `s` said?
fn same(s: &Spelled, got: &Request<'_>) -> bool {
    match (&s.req, got) {
        (
            Req::Get { keys, with_cas },
            Request::Get {
                keys: k,
                with_cas: c,
            },
        ) => *keys == owned_keys(k) && with_cas == c,
        (
            Req::Gat {
                exptime,
                keys,
                with_cas,
            },
            Request::Gat {
                exptime: e,
                keys: k,
                with_cas: c,
            },
        ) => exptime == e && *keys == owned_keys(k) && with_cas == c,
        (
            Req::Store {
                mode,
                key,
                flags,
                exptime,
                cas,
                data,
                noreply,
            },
            Request::Store {
                mode: m,
                key: k,
                flags: f,
                exptime: e,
                cas: c,
                data: d,
                noreply: n,
            },
        ) => {
            mode == m
                && key == k
                && flags == f
                && exptime == e
                && cas == c
                && data == d
                && noreply == n
        }
        (Req::Delete { key, noreply, .. }, Request::Delete { key: k, noreply: n }) => {
            key == k && noreply == n
        }
        (
            Req::Arith {
                key,
                incr,
                delta,
                noreply,
            },
            Request::Arith {
                key: k,
                incr: i,
                delta: d,
                noreply: n,
            },
        ) => key == k && incr == i && delta == d && noreply == n,
        (
            Req::Touch {
                key,
                exptime,
                noreply,
            },
            Request::Touch {
                key: k,
                exptime: e,
                noreply: n,
            },
        ) => key == k && exptime == e && noreply == n,
        (
            Req::FlushAll { delay, noreply },
            Request::FlushAll {
                delay: d,
                noreply: n,
            },
        ) => delay.unwrap_or(0) == *d && noreply == n,
        (Req::Stats { args }, Request::Stats { args: a }) => stat_args(args, s.sep) == *a,
        (Req::Version, Request::Version) | (Req::Quit, Request::Quit) => true,
        (
            Req::Verbosity { level, noreply },
            Request::Verbosity {
                level: l,
                noreply: n,
            },
        ) => level == l && noreply == n,
        (Req::DebugAdvanceClock { seconds }, Request::DebugAdvanceClock { seconds: s }) => {
            seconds == s
        }
        _ => false,
    }
}

/// Command words and awkward tokens, to steer fuzz input into the deeper parse paths.
fn fuzz_token() -> impl Strategy<Value = Vec<u8>> {
    let word = prop_oneof![
        Just("get"),
        Just("gets"),
        Just("gat"),
        Just("gats"),
        Just("set"),
        Just("add"),
        Just("replace"),
        Just("append"),
        Just("prepend"),
        Just("cas"),
        Just("delete"),
        Just("incr"),
        Just("decr"),
        Just("touch"),
        Just("flush_all"),
        Just("stats"),
        Just("version"),
        Just("verbosity"),
        Just("quit"),
        Just("debug_advance_clock"),
        Just("noreply"),
        Just("0"),
        Just("1"),
        Just("-1"),
        Just("+3"),
        Just("-0"),
        Just("4294967296"),
        Just("2147483645"),
        Just("18446744073709551616"),
        Just("HTTP/1.1"),
    ]
    .prop_map(|w| w.as_bytes().to_vec());
    prop_oneof![
        3 => word,
        1 => prop::collection::vec(any::<u8>(), 0..6),
        1 => (0usize..300).prop_map(|n| vec![b'k'; n]),
    ]
}

fn fuzz_input() -> impl Strategy<Value = Vec<u8>> {
    let line = (
        prop::collection::vec(fuzz_token(), 0..8),
        1usize..3,
        prop_oneof![Just(&b"\r\n"[..]), Just(&b"\n"[..]), Just(&b""[..])],
    )
        .prop_map(|(toks, sep, end)| {
            let mut l = toks.join(&vec![b' '; sep][..]);
            l.extend_from_slice(end);
            l
        });
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        prop::collection::vec(line, 1..4).prop_map(|ls| ls.concat()),
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    prop_oneof![
        Just(Limits::default()),
        (0usize..64, 0usize..128, 0usize..32).prop_map(
            |(max_line, max_multiget_line, item_size_max)| Limits {
                max_line,
                max_multiget_line,
                item_size_max
            }
        ),
    ]
}

proptest! {
    // 512 cases by default; `PROPTEST_CASES` overrides.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512)
    ))]

    /// Every strict prefix of a valid request is incomplete; the whole request parses to
    /// itself and consumes exactly its bytes.
    #[test]
    fn valid_request_prefixes_are_incomplete(s in spelled()) {
        let bytes = render(&s);
        let limits = Limits::default();
        for end in 0..bytes.len() {
            prop_assert_eq!(parse(&bytes[..end], &limits), Err(Incomplete), "prefix {} of {:?}", end, bytes);
        }
        let parsed = parse(&bytes, &limits).unwrap();
        prop_assert_eq!(parsed.consumed, bytes.len());
        prop_assert_eq!(parsed.swallow, 0);
        match &parsed.frame {
            Frame::Request(r) => prop_assert!(same(&s, r), "{:?} parsed as {:?}", s, r),
            other => prop_assert!(false, "{:?} parsed as {:?}", s, other),
        }
    }

    /// Arbitrary input never panics, stays in bounds, always makes progress, and a frame decided
    /// on any prefix of the input is the frame decided on the whole input.
    #[test]
    fn arbitrary_input_is_safe(buf in fuzz_input(), limits in limits()) {
        let whole = parse(&buf, &limits);
        for end in 0..=buf.len() {
            let Ok(p) = parse(&buf[..end], &limits) else { continue };
            prop_assert!(p.consumed <= end);
            if p.frame != Frame::Close {
                prop_assert!(p.consumed > 0);
            }
            if p.swallow > 0 {
                let too_large = matches!(p.frame, Frame::Request(Request::TooLarge { .. }));
                prop_assert!(too_large);
                prop_assert!(p.swallow <= i32::MAX as usize);
            }
            prop_assert_eq!(&whole, &Ok(p), "prefix {} of {:?}", end, buf);
        }
    }

    /// A pipeline of valid requests parses back to the same sequence.
    #[test]
    fn pipeline_round_trips(reqs in prop::collection::vec(spelled(), 1..8)) {
        let bytes: Vec<u8> = reqs.iter().flat_map(render).collect();
        let limits = Limits::default();
        let mut off = 0;
        for s in &reqs {
            let parsed = parse(&bytes[off..], &limits).unwrap();
            prop_assert_eq!(parsed.swallow, 0);
            match &parsed.frame {
                Frame::Request(r) => prop_assert!(same(s, r), "{:?} parsed as {:?}", s, r),
                other => prop_assert!(false, "{:?} parsed as {:?}", s, other),
            }
            off += parsed.consumed;
        }
        prop_assert_eq!(off, bytes.len());
        prop_assert_eq!(parse(&bytes[off..], &limits), Err(Incomplete));
    }
}
