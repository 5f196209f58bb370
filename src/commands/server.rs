//! Server commands that need nothing but their arguments and the command table: COMMAND and
//! LATENCY (the ones that read or change a connection or the server's state, such as CLIENT,
//! CONFIG, INFO and AUTH, are `crate::server::admin`'s).

use super::args::{Args, help, sub_arity, unknown_sub};
use super::table::{Cmd, Spec, all_specs, lookup};
use crate::protocol::resp::enc;

/// The Redis version memkeep reports, so clients enable what it implements.
pub const REDIS_VERSION: &str = "7.0.0";

/// LATENCY: memkeep has no latency monitor and no per-command histograms, so it answers as
/// Redis does with `latency-monitor-threshold 0` and `latency-tracking no`: no events, nothing
/// to reset, DOCTOR's "disabled" text.
pub fn latency(args: Args<'_>, out: &mut Vec<u8>, v3: bool) {
    let n = args.len();
    let arity = |ok: bool, out: &mut Vec<u8>| {
        if !ok {
            sub_arity(out, "latency", args);
        }
        ok
    };
    if args.is(1, "HELP") {
        if arity(n == 2, out) {
            help(
                out,
                &[
                    "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                    "DOCTOR",
                    "    Return a human readable latency analysis report.",
                    "GRAPH <event>",
                    "    Return an ASCII latency graph for the <event> class.",
                    "HISTORY <event>",
                    "    Return time-latency samples for the <event> class.",
                    "LATEST",
                    "    Return the latest latency samples for all events.",
                    "RESET [<event> ...]",
                    "    Reset latency data of one or more <event> classes.",
                    "    (default: reset all data for all event classes)",
                    "HISTOGRAM [COMMAND ...]",
                    "    Return a cumulative distribution of latencies in the format of a histogram for the specified command names.",
                    "    If no commands are specified then all histograms are replied.",
                    "HELP",
                    "    Prints this help.",
                ],
            );
        }
    } else if args.is(1, "LATEST") {
        if arity(n == 2, out) {
            enc::array(out, 0);
        }
    } else if args.is(1, "HISTORY") {
        if arity(n == 3, out) {
            enc::array(out, 0);
        }
    } else if args.is(1, "GRAPH") {
        if arity(n == 3, out) {
            enc::error(
                out,
                &format!(
                    "ERR No samples available for event '{}'",
                    String::from_utf8_lossy(args.get(2))
                ),
            );
        }
    } else if args.is(1, "RESET") {
        enc::int(out, 0);
    } else if args.is(1, "HISTOGRAM") {
        enc::map(out, 0, v3);
    } else if args.is(1, "DOCTOR") {
        if arity(n == 2, out) {
            enc::verbatim(
                out,
                b"I'm sorry, Dave, I can't do that. Latency monitoring is disabled in this Redis instance. You may use \"CONFIG SET latency-monitor-threshold <milliseconds>.\" in order to enable it. If we weren't in a deep space mission I'd suggest to take a look at https://redis.io/topics/latency-monitor.\n",
                v3,
            );
        }
    } else {
        unknown_sub(out, "LATENCY", args);
    }
}

/// FUNCTION: memkeep has EVAL scripts but no function libraries, so there is never a library
/// to list or flush: FLUSH succeeds with nothing to do, LIST is empty. (LOAD and the rest are
/// unknown subcommands.)
pub fn function(args: Args<'_>, out: &mut Vec<u8>) {
    if args.is(1, "FLUSH") {
        match args.len() {
            2 => enc::ok(out),
            3 if args.is(2, "SYNC") || args.is(2, "ASYNC") => enc::ok(out),
            3 => enc::error(out, "ERR FUNCTION FLUSH only supports SYNC|ASYNC option"),
            _ => enc::error(
                out,
                &format!(
                    "ERR unknown subcommand or wrong number of arguments for '{}'. Try FUNCTION HELP.",
                    String::from_utf8_lossy(args.get(1))
                ),
            ),
        }
    } else if args.is(1, "LIST") {
        // The options are checked as Redis does, though no library can match them.
        let mut i = 2;
        while i < args.len() {
            if args.is(i, "WITHCODE") {
                i += 1;
            } else if args.is(i, "LIBRARYNAME") {
                if i + 1 >= args.len() {
                    enc::error(out, "ERR library name argument was not given");
                    return;
                }
                i += 2;
            } else {
                let a = String::from_utf8_lossy(args.get(i));
                enc::error(out, &format!("ERR Unknown argument {a}"));
                return;
            }
        }
        enc::array(out, 0);
    } else if args.is(1, "HELP") {
        help(
            out,
            &[
                "FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "LIST [WITHCODE] [LIBRARYNAME PATTERN]",
                "    Return general information on all the libraries (memkeep has none).",
                "FLUSH [ASYNC|SYNC]",
                "    Delete all the libraries (memkeep has none).",
                "HELP",
                "    Prints this help.",
            ],
        );
    } else {
        unknown_sub(out, "FUNCTION", args);
    }
}

pub fn command(args: Args<'_>, out: &mut Vec<u8>, v3: bool) {
    let describe = |out: &mut Vec<u8>, s: &Spec| {
        enc::array(out, 10);
        enc::bulk(out, s.name.as_bytes());
        enc::int(out, s.arity as i64);
        // Keys after a count (ZUNION, SINTERCARD, LMPOP, EVAL, ...): Redis's `movablekeys`.
        let movable = crate::commands::table::numkeys_at(s.name).is_some()
            || matches!(
                s.cmd,
                Cmd::Eval | Cmd::EvalSha | Cmd::EvalRo | Cmd::EvalShaRo
            );
        enc::set(out, 1 + usize::from(movable), v3);
        enc::simple(out, if s.write { "write" } else { "readonly" });
        if movable {
            enc::simple(out, "movablekeys");
        }
        enc::int(out, s.keys.0 as i64);
        enc::int(out, s.keys.1 as i64);
        enc::int(out, s.keys.2 as i64);
        enc::set(out, 0, v3);
        enc::array(out, 0);
        enc::array(out, 0);
        enc::array(out, 0);
    };
    if args.len() == 1 {
        enc::array(out, all_specs().count());
        for s in all_specs() {
            describe(out, s);
        }
    } else if args.is(1, "COUNT") {
        enc::int(out, all_specs().count() as i64);
    } else if args.is(1, "INFO") {
        enc::array(out, args.len() - 2);
        for i in 2..args.len() {
            match lookup(args.get(i)) {
                Some(s) => describe(out, s),
                None => enc::null(out, v3),
            }
        }
    } else if args.is(1, "DOCS") {
        // No docs: clients fall back to plain input without hints.
        enc::map(out, 0, v3);
    } else {
        unknown_sub(out, "COMMAND", args);
    }
}
