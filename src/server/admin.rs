//! The RESP commands answered on the worker that need the connection's session or the
//! server's shared state: PING, QUIT, SELECT, TIME, AUTH, HELLO, RESET, CLIENT, CONFIG, INFO,
//! BGSAVE, LASTSAVE, WAIT, WATCH and UNWATCH, the pub/sub commands, and MGET (whose reply may
//! pause at the output limit). Reads of the store go through `crate::commands` against the
//! pass's snapshot.

use std::io::Write as _;
use std::sync::atomic::Ordering;

use log::error;

use super::resp::{Session, WATCH_MAX_KEYS};
use super::stats::{Counters, Totals, rusage};
use super::worker::Pass;
use crate::commands::args::{help, sub_arity, unknown_sub};
use crate::commands::server::{REDIS_VERSION, command, function, latency};
use crate::commands::strings::mget_view;
use crate::commands::{Args, Cmd, Hits, NOT_INTEGER, SYNTAX, View, glob_match, read_view};
use crate::protocol::resp::{enc, parse_i64};
use crate::storage::watch::WatchedKey;
use crate::types;

/// A worker's keyspace hit and miss counters, for a read.
fn hits(c: &Counters) -> Hits<'_> {
    Hits {
        hits: &c.get_hits,
        misses: &c.get_misses,
    }
}

/// Runs a command answered on the worker; returns true when the connection should close.
pub(super) fn read(
    cmd: Cmd,
    args: Args<'_>,
    out: &mut Vec<u8>,
    sess: &mut Session,
    pass: &mut Pass<'_>,
) -> bool {
    let v3 = sess.v3;
    match cmd {
        // RESP2 subscribed mode answers PING as a message-shaped array.
        Cmd::Ping if !v3 && sess.subs.count() > 0 => {
            enc::array(out, 2);
            enc::bulk(out, b"pong");
            enc::bulk(out, if args.len() > 1 { args.get(1) } else { b"" });
        }
        Cmd::Ping => match args.len() {
            1 => enc::simple(out, "PONG"),
            2 => enc::bulk(out, args.get(1)),
            _ => enc::error(out, "ERR wrong number of arguments for 'ping' command"),
        },
        Cmd::Echo => enc::bulk(out, args.get(1)),
        Cmd::Quit => {
            enc::ok(out);
            return true;
        }
        Cmd::Select => match parse_i64(args.get(1)) {
            Some(0) => enc::ok(out),
            Some(_) => enc::error(out, "ERR DB index is out of range"),
            None => enc::error(out, NOT_INTEGER),
        },
        Cmd::Time => {
            let now_us = pass.shared.clock.now_ms() * 1000;
            enc::array(out, 2);
            enc::bulk(out, (now_us / 1_000_000).to_string().as_bytes());
            enc::bulk(out, (now_us % 1_000_000).to_string().as_bytes());
        }
        Cmd::Auth => auth(args, out, sess, pass),
        Cmd::BgSave => {
            // A compacting copy of the store into `backup_dir`, while writes go on.
            let shared = pass.shared;
            if shared
                .backups
                .start(&shared.store, &shared.config.backup_dir, pass.now_ms / 1000)
            {
                enc::simple(out, "Background saving started");
            } else {
                enc::error(out, "ERR Background save already in progress");
            }
        }
        Cmd::LastSave => enc::int(
            out,
            pass.shared.backups.last_ok.load(Ordering::Acquire) as i64,
        ),
        Cmd::Hello => hello(args, out, sess, pass),
        Cmd::Client => return client(args, out, sess, pass),
        Cmd::Config => config(args, out, sess, pass),
        Cmd::Command => command(args, out, v3),
        Cmd::Info => info(args, out, v3, pass),
        Cmd::MGet => mget(args, out, sess, pass),
        Cmd::Watch => watch(args, out, sess, pass),
        Cmd::Unwatch => {
            sess.watching.clear();
            enc::ok(out);
        }
        Cmd::Subscribe
        | Cmd::Unsubscribe
        | Cmd::PSubscribe
        | Cmd::PUnsubscribe
        | Cmd::Publish
        | Cmd::PubSub => pubsub(cmd, args, out, sess, pass),
        Cmd::Reset => {
            // Redis's RESET: the connection as it was when accepted (its id stays).
            sess.multi = None;
            sess.exec_kinds.clear();
            sess.exec_slots.clear();
            sess.watching.clear();
            sess.subs.clear();
            sess.v3 = false;
            sess.authed = false;
            sess.user = None;
            sess.name = None;
            if let Some(i) = &sess.info {
                i.set_name(None);
            }
            enc::simple(out, "RESET");
        }
        Cmd::Latency => latency(args, out, v3),
        Cmd::Shutdown => return shutdown(args, out),
        Cmd::Function => function(args, out),
        Cmd::Script => pass.shared.scripts.script_cmd(args, out),
        Cmd::Acl => acl(args, out, sess, pass, v3),
        Cmd::Wait | Cmd::ReplConf | Cmd::Psync | Cmd::Sync | Cmd::Role | Cmd::ReplicaOf => {
            super::repl::run(cmd, args, out, sess, pass)
        }
        _ => data_read(cmd, args, out, v3, pass),
    }
    false
}

/// A subscribe or unsubscribe confirmation: `[kind, name or null, count]`, a push in RESP3.
fn confirm(out: &mut Vec<u8>, kind: &str, name: Option<&[u8]>, count: usize, v3: bool) {
    super::pubsub::push_header(out, 3, v3);
    enc::bulk(out, kind.as_bytes());
    match name {
        Some(n) => enc::bulk(out, n),
        None => enc::null(out, v3),
    }
    enc::int(out, count as i64);
}

/// SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH and PUBSUB.
fn pubsub(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) {
    use super::pubsub::Kind;
    let registry = &pass.shared.pubsub;
    let v3 = sess.v3;
    let (kind, word) = match cmd {
        Cmd::Subscribe => (Kind::Channel, "subscribe"),
        Cmd::Unsubscribe => (Kind::Channel, "unsubscribe"),
        Cmd::PSubscribe => (Kind::Pattern, "psubscribe"),
        Cmd::PUnsubscribe => (Kind::Pattern, "punsubscribe"),
        Cmd::Publish => {
            let mut mine = Vec::new();
            let n = registry.publish(args.get(1), args.get(2), sess.subs.who, &mut mine);
            // Redis writes a RESP3 publisher's own message before PUBLISH's reply.
            for m in mine {
                m.encode(out, v3);
            }
            return enc::int(out, n as i64);
        }
        _ => return pubsub_info(args, out, registry),
    };
    if matches!(cmd, Cmd::Subscribe | Cmd::PSubscribe) {
        for i in 1..args.len() {
            sess.subs.subscribe(registry, kind, args.get(i));
            confirm(out, word, Some(args.get(i)), sess.subs.count(), v3);
        }
        return;
    }
    let names: Vec<Vec<u8>> = if args.len() > 1 {
        (1..args.len()).map(|i| args.get(i).to_vec()).collect()
    } else {
        sess.subs.names(kind).iter().map(|n| n.to_vec()).collect()
    };
    if names.is_empty() {
        return confirm(out, word, None, sess.subs.count(), v3);
    }
    for n in names {
        sess.subs.unsubscribe(kind, &n);
        confirm(out, word, Some(&n), sess.subs.count(), v3);
    }
}

/// PUBSUB CHANNELS / NUMSUB / NUMPAT / SHARDCHANNELS / SHARDNUMSUB / HELP (memkeep has no
/// shard channels: those answer as Redis does with none).
fn pubsub_info(args: Args<'_>, out: &mut Vec<u8>, registry: &super::pubsub::PubSub) {
    let n = args.len();
    let syntax = |out: &mut Vec<u8>| {
        enc::error(
            out,
            &format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'. Try PUBSUB HELP.",
                String::from_utf8_lossy(&args.get(1)[..args.get(1).len().min(128)])
            ),
        )
    };
    if args.is(1, "HELP") && n == 2 {
        help(
            out,
            &[
                "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CHANNELS [<pattern>]",
                "    Return the currently active channels matching a <pattern> (default: '*').",
                "NUMPAT",
                "    Return number of subscriptions to patterns.",
                "NUMSUB [<channel> ...]",
                "    Return the number of subscribers for the specified channels, excluding",
                "    pattern subscriptions(default: no channels).",
                "SHARDCHANNELS [<pattern>]",
                "    Return the currently active shard level channels matching a <pattern> (default: '*').",
                "SHARDNUMSUB [<shardchannel> ...]",
                "    Return the number of subscribers for the specified shard level channel(s)",
                "HELP",
                "    Prints this help.",
            ],
        );
    } else if args.is(1, "CHANNELS") {
        if n > 3 {
            return syntax(out);
        }
        let channels = registry.channels((n == 3).then(|| args.get(2)));
        enc::array(out, channels.len());
        for c in channels {
            enc::bulk(out, &c);
        }
    } else if args.is(1, "NUMSUB") || args.is(1, "SHARDNUMSUB") {
        let shard = args.is(1, "SHARDNUMSUB");
        enc::array(out, (n - 2) * 2);
        for i in 2..n {
            enc::bulk(out, args.get(i));
            enc::int(
                out,
                if shard {
                    0
                } else {
                    registry.numsub(args.get(i)) as i64
                },
            );
        }
    } else if args.is(1, "NUMPAT") {
        if n != 2 {
            return sub_arity(out, "pubsub", args);
        }
        enc::int(out, registry.numpat() as i64);
    } else if args.is(1, "SHARDCHANNELS") {
        if n > 3 {
            return syntax(out);
        }
        enc::array(out, 0);
    } else {
        unknown_sub(out, "PUBSUB", args);
    }
}

/// WATCH key...: remembers each key's version, then (on a fresh snapshot, see
/// `storage::watch`) whether it is live with a TTL, whose passing will count as a change.
fn watch(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &mut Pass<'_>) {
    let shared = pass.shared;
    let registry = &shared.watches;
    let w = &mut sess.watching;
    if w.registry.is_none() {
        w.registry = Some(registry.clone());
    }
    let first_new = w.keys.len();
    for i in 1..args.len() {
        let key = args.get(i);
        if w.keys.iter().any(|k| k.key == key) {
            continue;
        }
        if w.keys.len() >= WATCH_MAX_KEYS {
            return enc::error(
                out,
                &format!(
                    "ERR too many watched keys (memkeep watches at most {WATCH_MAX_KEYS} per connection)"
                ),
            );
        }
        let version = registry.watch(key);
        w.keys.push(WatchedKey {
            key: key.to_vec(),
            version,
            expires: None,
        });
    }
    pass.fresh_snapshot();
    let (now, flushed) = (pass.now_ms, pass.flushed());
    if let Ok(store) = pass.snap() {
        for k in &mut sess.watching.keys[first_new..] {
            if let Ok(Some(item)) = store.get(&k.key)
                && !flushed
                && !item.meta.is_expired(now)
                && item.meta.expire_at != 0
            {
                k.expires = Some(item.meta.expire_at);
            }
        }
    }
    enc::ok(out);
}

/// MGET. Once the reply has added `sess.room` bytes it pauses after the value at hand and notes
/// the next key in `sess.mget_resume`: the caller keeps the request and runs it again when the
/// client has read most of its replies, so one MGET naming a big value many times cannot make
/// the reply without bound. Each piece reads from its own pass's snapshot.
fn mget(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &mut Pass<'_>) {
    let first = sess.mget_resume.max(1);
    sess.mget_resume = 0;
    let (v3, room) = (sess.v3, sess.room);
    let (now, flushed, counters, shared) =
        (pass.now_ms, pass.flushed(), pass.counters, pass.shared);
    match pass.snap() {
        Ok(store) => {
            let view = View {
                store,
                txn: store.txn(),
                now,
                flushed,
                cursors: &shared.scan_cursors,
                counters: Some(hits(counters)),
                max_bulk: shared.config.proto_max_bulk_len as usize,
            };
            sess.mget_resume = mget_view(args, out, v3, room, first, &view);
        }
        Err(e) => {
            if !e.is_damage() {
                error!("cannot open read transaction: {e}");
            }
            if first == 1 {
                return enc::error(out, &e.resp_reply());
            }
            // The array has begun: the rest reads as absent.
            for _ in first..args.len() {
                Counters::bump(&counters.get_misses);
                enc::null(out, v3);
            }
        }
    }
}

/// Reads that touch the store, on the pass's snapshot.
fn data_read(cmd: Cmd, args: Args<'_>, out: &mut Vec<u8>, v3: bool, pass: &mut Pass<'_>) {
    let (now, flushed, counters, shared) =
        (pass.now_ms, pass.flushed(), pass.counters, pass.shared);
    let store = match pass.snap() {
        Ok(t) => t,
        Err(e) => {
            if !e.is_damage() {
                error!("cannot open read transaction: {e}");
            }
            return enc::error(out, &e.resp_reply());
        }
    };
    let view = View {
        store,
        txn: store.txn(),
        now,
        flushed,
        cursors: &shared.scan_cursors,
        counters: Some(hits(counters)),
        max_bulk: shared.config.proto_max_bulk_len as usize,
    };
    let start = out.len();
    read_view(cmd, args, out, v3, &view);
    if store.found_cold() {
        // An item is being read in: no answer yet (`Pass::deferred`); it runs again then.
        out.truncate(start);
    }
}

/// INFO memory's size of the data file (what the store takes on disk, free pages included).
fn data_file_line(cfg: &crate::config::Config) -> String {
    format!(
        "memkeep_data_file_bytes:{}\r\n",
        std::fs::metadata(cfg.data_dir.join("data.mdb")).map_or(0, |m| m.len()),
    )
}

fn auth(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) {
    let acl = &pass.shared.acl;
    let (user, pass_arg) = match args.len() {
        2 => (&b"default"[..], args.get(1)),
        3 => (args.get(1), args.get(2)),
        _ => return enc::error(out, SYNTAX),
    };
    if args.len() == 2 && !acl.default_has_password() {
        return enc::error(
            out,
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        );
    }
    if acl.authenticate(user, pass_arg) {
        log_in(sess, user);
        enc::ok(out);
    } else {
        enc::error(out, WRONGPASS);
    }
}

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

fn log_in(sess: &mut Session, user: &[u8]) {
    sess.authed = true;
    sess.user = (user != b"default").then(|| String::from_utf8_lossy(user).into_owned());
}

/// ACL WHOAMI, USERS, LIST, GETUSER, SETUSER, DELUSER, CAT, HELP.
fn acl(args: Args<'_>, out: &mut Vec<u8>, sess: &Session, pass: &Pass<'_>, v3: bool) {
    use super::acl::{CATEGORIES, categories};
    let acl = &pass.shared.acl;
    let n = args.len();
    let text = |i: usize| String::from_utf8_lossy(args.get(i)).into_owned();
    let bulks = |out: &mut Vec<u8>, items: &[String]| {
        enc::array(out, items.len());
        for i in items {
            enc::bulk(out, i.as_bytes());
        }
    };
    if args.is(1, "WHOAMI") && n == 2 {
        enc::bulk(out, sess.user.as_deref().unwrap_or("default").as_bytes());
    } else if args.is(1, "USERS") && n == 2 {
        bulks(out, &acl.user_names());
    } else if args.is(1, "LIST") && n == 2 {
        bulks(out, &acl.list());
    } else if args.is(1, "CAT") && n == 2 {
        let cats: Vec<String> = CATEGORIES.iter().map(|c| c.to_string()).collect();
        bulks(out, &cats);
    } else if args.is(1, "CAT") && n == 3 {
        let cat = text(2).to_ascii_lowercase();
        if !CATEGORIES.contains(&cat.as_str()) {
            return enc::error(out, &format!("ERR Unknown category '{cat}'"));
        }
        let names: Vec<String> = crate::commands::table::all_specs()
            .filter(|s| categories(s).contains(&cat.as_str()))
            .map(|s| s.name.to_string())
            .collect();
        bulks(out, &names);
    } else if args.is(1, "SETUSER") && n >= 3 {
        let rules: Vec<String> = (3..n).map(text).collect();
        let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
        match acl.set_user(&text(2), &rules) {
            Ok(()) => enc::ok(out),
            Err(e) => enc::error(out, &e),
        }
    } else if args.is(1, "DELUSER") && n >= 3 {
        let names: Vec<String> = (2..n).map(text).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        match acl.del_users(&names) {
            Ok(k) => enc::int(out, k as i64),
            Err(e) => enc::error(out, &e),
        }
    } else if args.is(1, "GETUSER") && n == 3 {
        let Some(super::acl::UserView {
            flags,
            passwords,
            commands,
            keys,
            channels,
        }) = acl.get_user(&text(2))
        else {
            return enc::null(out, v3);
        };
        let pairs = 6;
        if v3 {
            out.extend_from_slice(format!("%{pairs}\r\n").as_bytes());
        } else {
            enc::array(out, pairs * 2);
        }
        enc::bulk(out, b"flags");
        bulks(out, &flags);
        enc::bulk(out, b"passwords");
        bulks(out, &passwords);
        enc::bulk(out, b"commands");
        enc::bulk(out, commands.as_bytes());
        enc::bulk(out, b"keys");
        enc::bulk(out, keys.as_bytes());
        enc::bulk(out, b"channels");
        enc::bulk(out, channels.as_bytes());
        enc::bulk(out, b"selectors");
        enc::array(out, 0);
    } else if args.is(1, "HELP") && n == 2 {
        help(
            out,
            &[
                "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CAT [<category>]",
                "    List all commands that belong to <category>, or all command categories",
                "    when no category is specified.",
                "DELUSER <username> [<username> ...]",
                "    Delete a list of users.",
                "GETUSER <username>",
                "    Get the user's details.",
                "LIST",
                "    Show users details in config file format.",
                "SETUSER <username> <attribute> [<attribute> ...]",
                "    Create or modify a user with the specified attributes.",
                "USERS",
                "    List all the registered usernames.",
                "WHOAMI",
                "    Return the current connection username.",
                "HELP",
                "    Prints this help.",
            ],
        );
    } else if [
        "WHOAMI", "USERS", "LIST", "CAT", "SETUSER", "DELUSER", "GETUSER", "HELP",
    ]
    .iter()
    .any(|s| args.is(1, s))
    {
        sub_arity(out, "acl", args);
    } else {
        unknown_sub(out, "ACL", args);
    }
}

fn hello(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) {
    let mut v3 = sess.v3;
    let mut i = 1;
    if args.len() > 1 {
        match parse_i64(args.get(1)) {
            Some(2) => v3 = false,
            Some(3) => v3 = true,
            Some(_) => return enc::error(out, "NOPROTO unsupported protocol version"),
            None => {
                return enc::error(
                    out,
                    "ERR Protocol version is not an integer or out of range",
                );
            }
        }
        i = 2;
    }
    let mut authed = sess.authed;
    let mut user = None;
    let mut name = None;
    while i < args.len() {
        if args.is(i, "AUTH") && i + 2 < args.len() {
            if !pass
                .shared
                .acl
                .authenticate(args.get(i + 1), args.get(i + 2))
            {
                return enc::error(out, WRONGPASS);
            }
            authed = true;
            user = Some(args.get(i + 1));
            i += 3;
        } else if args.is(i, "SETNAME") && i + 1 < args.len() {
            name = Some(args.get(i + 1).to_vec());
            i += 2;
        } else {
            return enc::error(
                out,
                &format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(args.get(i))
                ),
            );
        }
    }
    if !pass.shared.acl.open() && !authed {
        return enc::error(
            out,
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        );
    }
    sess.v3 = v3;
    sess.authed = authed;
    if let Some(u) = user {
        log_in(sess, u);
    }
    if name.is_some() {
        sess.name = name;
        if let Some(i) = &sess.info {
            i.set_name(sess.name.as_deref());
        }
    }
    enc::map(out, 7, v3);
    enc::bulk(out, b"server");
    enc::bulk(out, b"redis");
    enc::bulk(out, b"version");
    enc::bulk(out, REDIS_VERSION.as_bytes());
    enc::bulk(out, b"proto");
    enc::int(out, if v3 { 3 } else { 2 });
    enc::bulk(out, b"id");
    enc::int(out, sess.id as i64);
    enc::bulk(out, b"mode");
    enc::bulk(out, b"standalone");
    enc::bulk(out, b"role");
    enc::bulk(out, b"master");
    enc::bulk(out, b"modules");
    enc::array(out, 0);
}

/// One client's CLIENT LIST line, in Redis 7.0's field order. memkeep does not account a
/// connection's memory the way Redis does: the buffer and memory fields answer 0. `own` is the
/// session asking (its fields are fresher than the table's, and its command names its
/// subcommand, as Redis's `client|list`).
fn client_line(c: &super::clients::ClientInfo, own: Option<(&Session, Args<'_>)>) -> String {
    use super::clients::{FLAG_BLOCKED, FLAG_MULTI, FLAG_PUBSUB};
    let elapsed = c.connected.elapsed();
    let idle_ms = (elapsed.as_millis() as u64).saturating_sub(c.active_ms.load(Ordering::Relaxed));
    let mut name = c.name();
    let mut flags_bits = c.flags.load(Ordering::Relaxed);
    let mut multi = c.multi.load(Ordering::Relaxed) as i64 - 1;
    let mut cmd = c.cmd().to_string();
    let mut resp = c.resp.load(Ordering::Relaxed);
    let (mut sub, mut psub) = (
        c.sub.load(Ordering::Relaxed) as usize,
        c.psub.load(Ordering::Relaxed) as usize,
    );
    let mut idle = idle_ms / 1000;
    if let Some((sess, args)) = own {
        name = sess.name.clone().unwrap_or_default();
        (sub, psub) = sess.subs.counts();
        flags_bits = if sess.multi.is_some() { FLAG_MULTI } else { 0 }
            | if sub + psub > 0 { FLAG_PUBSUB } else { 0 };
        multi = sess.multi.as_ref().map_or(-1, |m| m.queued.len() as i64);
        cmd = format!(
            "client|{}",
            String::from_utf8_lossy(args.get(1)).to_ascii_lowercase()
        );
        resp = if sess.v3 { 3 } else { 2 };
        idle = 0;
        if let Some(queued) = sess.in_exec {
            // Run by EXEC: Redis shows the transaction, not the subcommand.
            flags_bits |= FLAG_MULTI;
            multi = queued as i64;
            cmd = "exec".into();
        }
    }
    let mut flags = String::new();
    if flags_bits & FLAG_BLOCKED != 0 {
        flags.push('b');
    }
    if flags_bits & FLAG_PUBSUB != 0 {
        flags.push('P');
    }
    if flags_bits & FLAG_MULTI != 0 {
        flags.push('x');
    }
    if flags.is_empty() {
        flags.push('N');
    }
    let addr = |a: Option<std::net::SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
    format!(
        "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db=0 sub={} psub={} ssub=0 \
         multi={} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 \
         tot-mem=0 events=r cmd={} user=default redir=-1 resp={}\n",
        c.id,
        addr(c.addr),
        addr(c.laddr),
        c.fd,
        String::from_utf8_lossy(&name),
        elapsed.as_secs(),
        idle,
        flags,
        sub,
        psub,
        multi,
        cmd,
        resp,
    )
}

/// CLIENT LIST [TYPE type] [ID id ...].
fn client_list(args: Args<'_>, out: &mut Vec<u8>, sess: &Session, pass: &Pass<'_>) {
    let mut ids: Option<Vec<u64>> = None;
    let mut pubsub: Option<bool> = None;
    let mut none = false;
    let mut i = 2;
    while i < args.len() {
        if args.is(i, "TYPE") && i + 1 < args.len() {
            match client_type(args.get(i + 1)) {
                Ok(t) => {
                    pubsub = t;
                    none = t.is_none();
                }
                Err(msg) => return enc::error(out, &msg),
            }
            i += 2;
        } else if args.is(i, "ID") && i + 1 < args.len() {
            let mut v = Vec::new();
            i += 1;
            while i < args.len() {
                match parse_i64(args.get(i)) {
                    Some(n) if n > 0 => v.push(n as u64),
                    _ => return enc::error(out, "ERR Invalid client ID"),
                }
                i += 1;
            }
            ids = Some(v);
        } else {
            return enc::error(out, SYNTAX);
        }
    }
    let mut text = String::new();
    for c in pass.shared.clients.all() {
        let is_pubsub = c.flags.load(Ordering::Relaxed) & super::clients::FLAG_PUBSUB != 0;
        if none
            || pubsub.is_some_and(|p| p != is_pubsub)
            || ids.as_ref().is_some_and(|v| !v.contains(&c.id))
        {
            continue;
        }
        let own = (c.id == sess.id).then_some((sess, args));
        text.push_str(&client_line(&c, own));
    }
    enc::verbatim(out, text.as_bytes(), sess.v3);
}

/// A client TYPE: Some(false) normal, Some(true) pubsub, None a kind memkeep never has
/// (master, replica, slave).
fn client_type(t: &[u8]) -> Result<Option<bool>, String> {
    match t.to_ascii_lowercase().as_slice() {
        b"normal" => Ok(Some(false)),
        b"pubsub" => Ok(Some(true)),
        b"master" | b"replica" | b"slave" => Ok(None),
        _ => Err(format!(
            "ERR Unknown client type '{}'",
            String::from_utf8_lossy(t)
        )),
    }
}

/// CLIENT KILL addr:port, or CLIENT KILL [ID id] [TYPE type] [ADDR a] [LADDR a] [USER u]
/// [SKIPME yes|no]. Returns whether the calling connection is among the killed (it closes
/// once its reply is out).
fn client_kill(args: Args<'_>, out: &mut Vec<u8>, sess: &Session, pass: &Pass<'_>) -> bool {
    use super::clients::Filter;
    let shared = pass.shared;
    let wake = |w: usize| {
        if let Some(m) = shared.mailboxes.get(w) {
            m.wake();
        }
    };
    let own = sess.info.as_deref();
    if args.len() == 3 {
        // The old form: one address, the caller included; an error when nobody has it.
        let filter = Filter {
            addr: Some(String::from_utf8_lossy(args.get(2)).into_owned()),
            ..Filter::default()
        };
        let n = shared.clients.kill(&filter, Some(sess.id), wake);
        if n == 0 {
            enc::error(out, "ERR No such client");
            return false;
        }
        enc::ok(out);
        return own.is_some_and(|c| filter.matches(c));
    }
    if !args.len().is_multiple_of(2) {
        enc::error(out, SYNTAX);
        return false;
    }
    let mut filter = Filter {
        skip: Some(sess.id),
        ..Filter::default()
    };
    for i in (2..args.len()).step_by(2) {
        let v = args.get(i + 1);
        let text = || String::from_utf8_lossy(v).into_owned();
        if args.is(i, "ID") {
            match parse_i64(v) {
                Some(n) if n > 0 => filter.id = Some(n as u64),
                _ => {
                    enc::error(out, "ERR client-id should be greater than 0");
                    return false;
                }
            }
        } else if args.is(i, "TYPE") {
            match client_type(v) {
                Ok(Some(p)) => filter.pubsub = Some(p),
                Ok(None) => filter.none = true,
                Err(msg) => {
                    enc::error(out, &msg);
                    return false;
                }
            }
        } else if args.is(i, "ADDR") {
            filter.addr = Some(text());
        } else if args.is(i, "LADDR") {
            filter.laddr = Some(text());
        } else if args.is(i, "USER") {
            // memkeep's one user is Redis's `default`.
            if v != b"default" {
                enc::error(out, &format!("ERR No such user '{}'", text()));
                return false;
            }
        } else if args.is(i, "SKIPME") {
            if v.eq_ignore_ascii_case(b"yes") {
                filter.skip = Some(sess.id);
            } else if v.eq_ignore_ascii_case(b"no") {
                filter.skip = None;
            } else {
                enc::error(out, SYNTAX);
                return false;
            }
        } else {
            enc::error(out, SYNTAX);
            return false;
        }
    }
    let n = shared.clients.kill(&filter, Some(sess.id), wake);
    enc::int(out, n as i64);
    own.is_some_and(|c| filter.matches(c))
}

/// CLIENT's subcommands; returns true when the connection should close after its reply
/// (CLIENT KILL of itself).
fn client(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) -> bool {
    let known = [
        "SETNAME", "GETNAME", "ID", "LIST", "INFO", "SETINFO", "UNBLOCK", "NO-EVICT", "NO-TOUCH",
        "PAUSE", "UNPAUSE", "KILL",
    ];
    let arity_ok = match () {
        _ if args.is(1, "SETNAME") || args.is(1, "NO-EVICT") || args.is(1, "NO-TOUCH") => {
            args.len() == 3
        }
        _ if args.is(1, "UNBLOCK") || args.is(1, "PAUSE") || args.is(1, "KILL") => args.len() >= 3,
        _ if args.is(1, "UNPAUSE") => args.len() == 2,
        _ if args.is(1, "GETNAME") || args.is(1, "ID") || args.is(1, "INFO") => args.len() == 2,
        _ if args.is(1, "SETINFO") => args.len() == 4,
        _ => true,
    };
    if known.iter().any(|k| args.is(1, k)) && !arity_ok {
        sub_arity(out, "client", args);
        return false;
    }
    if args.is(1, "KILL") {
        return client_kill(args, out, sess, pass);
    }
    if args.is(1, "LIST") {
        client_list(args, out, sess, pass);
    } else {
        client_other(args, out, sess, pass);
    }
    false
}

/// The CLIENT subcommands that answer only this connection (arity already checked).
fn client_other(args: Args<'_>, out: &mut Vec<u8>, sess: &mut Session, pass: &Pass<'_>) {
    if args.is(1, "SETNAME") && args.len() == 3 {
        let name = args.get(2);
        if name.iter().any(|&b| b <= b' ' || b > b'~') {
            return enc::error(
                out,
                "ERR Client names cannot contain spaces, newlines or special characters.",
            );
        }
        sess.name = (!name.is_empty()).then(|| name.to_vec());
        if let Some(i) = &sess.info {
            i.set_name(sess.name.as_deref());
        }
        enc::ok(out);
    } else if args.is(1, "GETNAME") && args.len() == 2 {
        match &sess.name {
            Some(n) => enc::bulk(out, n),
            None => enc::null(out, sess.v3),
        }
    } else if args.is(1, "ID") && args.len() == 2 {
        enc::int(out, sess.id as i64);
    } else if args.is(1, "INFO") {
        match &sess.info {
            Some(c) => {
                let line = client_line(c, Some((sess, args)));
                enc::verbatim(out, line.as_bytes(), sess.v3);
            }
            None => enc::bulk(out, b""),
        }
    } else if args.is(1, "SETINFO") && args.len() == 4 {
        enc::ok(out);
    } else if args.is(1, "UNBLOCK") && args.len() <= 4 {
        let Some(id) = parse_i64(args.get(2)) else {
            return enc::error(out, NOT_INTEGER);
        };
        let outcome = match args.len() {
            3 => types::blocking::TIMED_OUT,
            _ if args.is(3, "TIMEOUT") => types::blocking::TIMED_OUT,
            _ if args.is(3, "ERROR") => types::blocking::UNBLOCKED,
            _ => return enc::error(out, "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"),
        };
        let done = id > 0 && pass.shared.blocking.unblock_client(id as u64, outcome);
        enc::int(out, done as i64);
    } else if args.is(1, "PAUSE") && args.len() <= 4 {
        let Some(ms) = parse_i64(args.get(2)) else {
            return enc::error(out, "ERR timeout is not an integer or out of range");
        };
        if ms < 0 {
            return enc::error(out, "ERR timeout is negative");
        }
        let all = match args.len() {
            3 => true,
            _ if args.is(3, "ALL") => true,
            _ if args.is(3, "WRITE") => false,
            _ => return enc::error(out, "ERR CLIENT PAUSE mode must be WRITE or ALL"),
        };
        pass.shared.pause.pause(ms as u64, all);
        enc::ok(out);
    } else if args.is(1, "UNPAUSE") {
        pass.shared.pause.unpause();
        for m in &pass.shared.mailboxes {
            m.wake();
        }
        enc::ok(out);
    } else if args.is(1, "NO-EVICT") || args.is(1, "NO-TOUCH") {
        // memkeep evicts nothing, and keeps no access times for eviction to use: both flags
        // are accepted and change nothing.
        if args.is(2, "ON") || args.is(2, "OFF") {
            enc::ok(out);
        } else {
            enc::error(out, SYNTAX);
        }
    } else {
        // Redis's fallback for a known subcommand with an argument count it does not take.
        let sub = String::from_utf8_lossy(args.get(1));
        if args.is(1, "UNBLOCK") || args.is(1, "PAUSE") {
            return enc::error(
                out,
                &format!(
                    "ERR unknown subcommand or wrong number of arguments for '{sub}'. Try CLIENT HELP."
                ),
            );
        }
        unknown_sub(out, "CLIENT", args);
    }
}

/// The parameters CONFIG GET answers, with their values.
fn config_params(pass: &Pass<'_>) -> Vec<(&'static str, String)> {
    let cfg = &pass.shared.config;
    let appendfsync = match cfg.sync {
        crate::config::SyncMode::Always => "always",
        crate::config::SyncMode::Periodic => "everysec",
        crate::config::SyncMode::Never => "no",
    };
    let cache = cfg.max_disk > 0;
    let mut params: Vec<(&str, String)> = vec![
        ("save", String::new()),
        ("appendonly", "no".into()),
        ("appendfsync", appendfsync.into()),
        (
            "maxmemory",
            if cache { cfg.max_disk } else { cfg.map_size }.to_string(),
        ),
        (
            "maxmemory-policy",
            if cache { "allkeys-lru" } else { "noeviction" }.into(),
        ),
        ("databases", "1".into()),
        ("port", cfg.resp_port.to_string()),
        ("bind", cfg.listen.clone()),
        ("maxclients", cfg.max_connections.to_string()),
        ("timeout", "0".into()),
        ("proto-max-bulk-len", cfg.proto_max_bulk_len.to_string()),
        ("dir", cfg.data_dir.display().to_string()),
    ];
    params.extend(super::repl::config_params(&pass.shared.repl));
    params.extend(pass.shared.encodings.params());
    let busy = pass
        .shared
        .scripts
        .time_limit_ms
        .load(std::sync::atomic::Ordering::Relaxed)
        .to_string();
    params.push(("busy-reply-threshold", busy.clone()));
    params.push(("lua-time-limit", busy));
    params
}

fn config(args: Args<'_>, out: &mut Vec<u8>, sess: &Session, pass: &Pass<'_>) {
    if args.is(1, "GET") && args.len() >= 3 {
        let params = config_params(pass);
        // A name without glob characters is echoed as given (Redis does); a pattern answers the
        // parameters' own names.
        let mut hits: Vec<(&[u8], &String)> = Vec::new();
        for i in 2..args.len() {
            let given = args.get(i);
            let pat = given.to_ascii_lowercase();
            let literal = !given
                .iter()
                .any(|b| matches!(b, b'*' | b'?' | b'[' | b'\\'));
            for p in &params {
                let seen = hits
                    .iter()
                    .any(|h| h.1 == &p.1 && h.0.eq_ignore_ascii_case(p.0.as_bytes()));
                if glob_match(&pat, p.0.as_bytes()) && !seen {
                    hits.push((if literal { given } else { p.0.as_bytes() }, &p.1));
                }
            }
        }
        enc::map(out, hits.len(), sess.v3);
        for (k, v) in hits {
            enc::bulk(out, k);
            enc::bulk(out, v.as_bytes());
        }
    } else if args.is(1, "GET") {
        sub_arity(out, "config", args);
    } else if args.is(1, "RESETSTAT") && args.len() == 2 {
        for c in pass.shared.counters.iter() {
            c.reset();
        }
        for c in pass.shared.command_stats.iter() {
            c.reset();
        }
        let w = &pass.shared.writer_hits;
        w.hits.store(0, Ordering::Relaxed);
        w.misses.store(0, Ordering::Relaxed);
        pass.shared.cache.reset();
        enc::ok(out);
    } else if args.is(1, "SET") {
        // The replication settings Sentinel and operators change, and Redis's encoding
        // thresholds (accepted, changing nothing); nothing else.
        let thresholds = args.len().is_multiple_of(2)
            && (2..args.len())
                .step_by(2)
                .all(|i| super::encodings::Encodings::known(args.get(i)));
        let busy =
            args.len() == 4 && (args.is(2, "busy-reply-threshold") || args.is(2, "lua-time-limit"));
        if busy {
            // How long a script runs before other clients get -BUSY (`lua_time_limit`).
            match parse_i64(args.get(3)) {
                Some(ms) if ms >= 0 => {
                    let limit = &pass.shared.scripts.time_limit_ms;
                    limit.store(ms as u64, std::sync::atomic::Ordering::Relaxed);
                    enc::ok(out);
                }
                parsed => enc::error(
                    out,
                    &format!(
                        "ERR CONFIG SET failed (possibly related to argument '{}') - {}",
                        String::from_utf8_lossy(args.get(2)),
                        if parsed.is_some() {
                            "argument must be between 0 and 9223372036854775807 inclusive"
                        } else {
                            "argument couldn't be parsed into an integer"
                        }
                    ),
                ),
            }
        } else if thresholds {
            pass.shared.encodings.config_set(args, out);
        } else if args.len().is_multiple_of(2) && unchanged(args, &config_params(pass)) {
            // Setting what is already so (`save ""`, `appendonly no`): nothing to do.
            enc::ok(out);
        } else if !super::repl::config_set(args, out, &pass.shared.repl) {
            config_set_refused(args, out, &config_params(pass));
        }
    } else if args.is(1, "REWRITE") && args.len() == 2 {
        super::repl::config_rewrite(out, pass.shared);
    } else {
        unknown_sub(out, "CONFIG", args);
    }
}

/// SHUTDOWN [NOSAVE|SAVE] [NOW] [FORCE] [ABORT]: stops the server as SIGTERM does (no new
/// connections, in-flight writes committed and synced, then exit). memkeep has no snapshot to
/// save or skip (every acknowledged write is already in its log, per the sync mode), so the
/// flags only have Redis's syntax checked; a shutdown is never left pending, so ABORT has
/// nothing to abort. As in Redis, the connection gets no reply: it closes. Returns true to
/// close it.
fn shutdown(args: Args<'_>, out: &mut Vec<u8>) -> bool {
    let (mut save, mut nosave, mut other, mut abort) = (false, false, false, false);
    for i in 1..args.len() {
        if args.is(i, "NOSAVE") {
            nosave = true;
        } else if args.is(i, "SAVE") {
            save = true;
        } else if args.is(i, "NOW") || args.is(i, "FORCE") {
            other = true;
        } else if args.is(i, "ABORT") {
            abort = true;
        } else {
            enc::error(out, SYNTAX);
            return false;
        }
    }
    if (abort && (save || nosave || other)) || (save && nosave) {
        enc::error(out, SYNTAX);
        return false;
    }
    if abort {
        enc::error(out, "ERR No shutdown in progress.");
        return false;
    }
    log::info!("SHUTDOWN from a client: stopping as on SIGTERM");
    // The signal thread runs the shutdown it runs for SIGTERM.
    if let Err(e) = signal_hook::low_level::raise(signal_hook::consts::SIGTERM) {
        log::error!("SHUTDOWN: cannot signal the server to stop: {e}");
        enc::error(out, "ERR Errors trying to SHUTDOWN. Check logs.");
        return false;
    }
    true
}

/// CONFIG SET of what memkeep cannot change at run time, in Redis's shapes: a parameter
/// CONFIG GET reports fails ("CONFIG SET failed ... - why"), any other is unknown.
fn config_set_refused(args: Args<'_>, out: &mut Vec<u8>, params: &[(&str, String)]) {
    if !args.len().is_multiple_of(2) {
        return enc::error(out, SYNTAX);
    }
    for i in (2..args.len()).step_by(2) {
        let name = args.get(i);
        let known = params
            .iter()
            .any(|(p, _)| name.eq_ignore_ascii_case(p.as_bytes()));
        let text = String::from_utf8_lossy(name);
        if !known {
            return enc::error(
                out,
                &format!("ERR Unknown option or number of arguments for CONFIG SET - '{text}'"),
            );
        }
    }
    // Every name is known; the first whose value differs is the one refused.
    let first = (2..args.len())
        .step_by(2)
        .find(|&i| {
            !params.iter().any(|(p, v)| {
                args.get(i).eq_ignore_ascii_case(p.as_bytes()) && args.get(i + 1) == v.as_bytes()
            })
        })
        .unwrap_or(2);
    enc::error(
        out,
        &format!(
            "ERR CONFIG SET failed (possibly related to argument '{}') - memkeep sets it by flag or config file only",
            String::from_utf8_lossy(args.get(first))
        ),
    );
}

/// Whether every `name value` pair of a CONFIG SET names a parameter CONFIG GET answers and
/// gives the value it already has.
fn unchanged(args: Args<'_>, params: &[(&str, String)]) -> bool {
    (2..args.len()).step_by(2).all(|i| {
        params.iter().any(|(name, value)| {
            args.get(i).eq_ignore_ascii_case(name.as_bytes()) && args.get(i + 1) == value.as_bytes()
        })
    })
}

fn info(args: Args<'_>, out: &mut Vec<u8>, v3: bool, pass: &mut Pass<'_>) {
    let shared = pass.shared;
    info_with(args, out, v3, shared, || keyspace(pass.snap().ok()));
}

/// INFO, LASTSAVE and PUBSUB called by a script (`scripting::ServerRead`).
pub(super) fn script_read(
    cmd: Cmd,
    args: Args<'_>,
    out: &mut Vec<u8>,
    v3: bool,
    keyspace: (u64, u64),
    shared: &super::Shared,
) {
    match cmd {
        Cmd::Info => info_with(args, out, v3, shared, || keyspace),
        Cmd::LastSave => enc::int(out, shared.backups.last_ok.load(Ordering::Acquire) as i64),
        Cmd::PubSub => pubsub_info(args, out, &shared.pubsub),
        _ => enc::error(out, "ERR This Redis command is not allowed from script"),
    }
}

/// The keys and the keys with a TTL in a snapshot (0 and 0 without one).
fn keyspace(snap: Option<&crate::storage::overlay::Snap<'_>>) -> (u64, u64) {
    match snap {
        Some(store) => (
            store.len().unwrap_or(0),
            store.expires().ok().flatten().unwrap_or(0),
        ),
        None => (0, 0),
    }
}

fn info_with(
    args: Args<'_>,
    out: &mut Vec<u8>,
    v3: bool,
    shared: &super::Shared,
    keyspace: impl FnOnce() -> (u64, u64),
) {
    let cfg = &shared.config;
    let mut t = Totals::default();
    for c in shared.counters.iter() {
        t.add(c);
    }
    // Reads the writer ran for connections count as Redis counts any read.
    t.get_hits += shared.writer_hits.hits.load(Ordering::Relaxed);
    t.get_misses += shared.writer_hits.misses.load(Ordering::Relaxed);
    // Before the snapshot (see `CacheStats::figures`).
    let cache = shared.cache.figures();
    let (keys, expires) = keyspace();
    let used = shared.store.used_bytes();
    let mem = super::stats::rss();
    let (user, sys) = rusage();
    let (channels, patterns) = shared.pubsub.sizes();
    let uptime = shared.started.elapsed().as_secs();
    let wanted: Vec<String> = (1..args.len())
        .map(|i| String::from_utf8_lossy(args.get(i)).to_ascii_lowercase())
        .collect();
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| w == "all" || w == "everything" || w == "default");
    // As Redis: commandstats only when asked for, or with `all` / `everything`.
    let every = wanted.iter().any(|w| w == "all" || w == "everything");
    let show = |name: &str| {
        if name == "commandstats" {
            every || wanted.iter().any(|w| w == name)
        } else {
            all || wanted.iter().any(|w| w == name)
        }
    };
    let (cmd_totals, error_totals) = if show("commandstats") || show("errorstats") {
        super::stats::CommandStats::merge(&shared.command_stats)
    } else {
        Default::default()
    };
    let mut s = Vec::new();
    let mut section = |name: &str, title: &str, body: String| {
        if show(name) {
            if !s.is_empty() {
                s.extend_from_slice(b"\r\n");
            }
            let _ = write!(s, "# {title}\r\n{body}");
        }
    };
    section(
        "server",
        "Server",
        format!(
            "redis_version:{REDIS_VERSION}\r\nmemkeep_version:{}\r\nredis_mode:standalone\r\nos:{} {}\r\narch_bits:{}\r\nprocess_id:{}\r\nrun_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\nexecutable:memkeep\r\nconfig_file:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH,
            usize::BITS,
            std::process::id(),
            shared.repl.run_id,
            cfg.resp_port,
            uptime / 86400,
            cfg.config_file
                .as_ref()
                .map_or_else(String::new, |p| p.display().to_string()),
        ),
    );
    section(
        "clients",
        "Clients",
        format!(
            // memkeep_blocking_entries: blocking pops known to the registry in any state
            // (queued, or on their way to the writer); 0 when nobody blocks.
            "connected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:{}\r\nmemkeep_blocking_entries:{}\r\n",
            shared.gauges.curr_connections.load(Ordering::Relaxed),
            cfg.max_connections,
            shared.blocking.queued(),
            shared.blocking.len(),
        ),
    );
    section(
        "memory",
        "Memory",
        format!(
            "used_memory:{used}\r\nused_memory_human:{:.2}M\r\nused_memory_rss:{}\r\nmemkeep_rss_anon:{}\r\nmemkeep_rss_file:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:{}\r\n{}",
            used as f64 / 1048576.0,
            mem.anon + mem.file,
            mem.anon,
            mem.file,
            if cfg.max_disk > 0 {
                cfg.max_disk
            } else {
                cfg.map_size
            },
            if cfg.max_disk > 0 {
                "allkeys-lru"
            } else {
                "noeviction"
            },
            if cfg.max_disk > 0 {
                format!(
                    "memkeep_max_disk:{}\r\nmemkeep_disk_used:{}\r\n",
                    cfg.max_disk, cache.data_bytes
                )
            } else {
                String::new()
            }
        ) + &data_file_line(cfg),
    );
    section(
        "persistence",
        "Persistence",
        format!(
            "loading:0\r\nrdb_changes_since_last_save:0\r\nrdb_bgsave_in_progress:0\r\naof_enabled:0\r\nmemkeep_sync:{}\r\nmemkeep_log_fsyncs:{}\r\nmemkeep_log_fsync_writes:{}\r\nmemkeep_log_bytes:{}\r\n{}",
            cfg.sync,
            cache.log_fsyncs,
            cache.log_fsync_writes,
            cache.log_bytes,
            shared.store.vlog().map_or_else(String::new, |v| {
                let f = v.footprint();
                format!(
                    "memkeep_log_value_segments:{}\r\nmemkeep_log_value_bytes:{}\r\nmemkeep_log_value_live_bytes:{}\r\nmemkeep_log_value_moved_bytes:{}\r\nmemkeep_log_value_segments_retired:{}\r\n",
                    f.segments, f.bytes, f.live_bytes, f.moved_bytes, f.retired
                )
            })
        ),
    );
    section(
        "stats",
        "Stats",
        format!(
            "total_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:0\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nevicted_keys:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\npubsub_channels:{channels}\r\npubsub_patterns:{patterns}\r\npubsubshard_channels:0\r\nclient_output_buffer_limit_disconnections:{}\r\nacl_access_denied_auth:{}\r\nacl_access_denied_cmd:{}\r\nacl_access_denied_key:{}\r\nacl_access_denied_channel:{}\r\ntotal_error_replies:{}\r\nmemkeep_reads_in_writer:{}\r\n",
            t.total_connections,
            t.resp_commands + t.cmd_get + t.cmd_set,
            t.rejected_connections,
            cache.expired,
            cache.evictions,
            t.get_hits,
            t.get_misses,
            t.output_limit_disconnections,
            shared.acl.denied_auth.load(Ordering::Relaxed),
            shared.acl.denied_cmd.load(Ordering::Relaxed),
            shared.acl.denied_key.load(Ordering::Relaxed),
            shared.acl.denied_channel.load(Ordering::Relaxed),
            super::stats::CommandStats::total_errors(&shared.command_stats),
            t.reads_in_writer,
        ),
    );
    // Monitoring (redis_exporter and the like) reads the role from here.
    section(
        "replication",
        "Replication",
        super::repl::info(&shared.repl, shared.config.repl_backlog_size),
    );
    section(
        "cpu",
        "CPU",
        format!("used_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\n"),
    );
    let mut cmdstats = String::new();
    use std::fmt::Write as _;
    if show("commandstats") {
        for (name, t) in super::resp::stat_names().iter().zip(&cmd_totals) {
            if t.calls + t.rejected + t.failed == 0 {
                continue;
            }
            let per = if t.calls > 0 {
                t.usec as f64 / t.calls as f64
            } else {
                0.0
            };
            let _ = write!(
                cmdstats,
                "cmdstat_{name}:calls={},usec={},usec_per_call={per:.2},rejected_calls={},failed_calls={}\r\n",
                t.calls, t.usec, t.rejected, t.failed
            );
        }
    }
    section("commandstats", "Commandstats", cmdstats);
    let mut errstats = String::new();
    for (code, n) in &error_totals {
        let _ = write!(errstats, "errorstat_{code}:count={n}\r\n");
    }
    section("errorstats", "Errorstats", errstats);
    section(
        "keyspace",
        "Keyspace",
        if keys > 0 {
            format!("db0:keys={keys},expires={expires},avg_ttl=0\r\n")
        } else {
            String::new()
        },
    );
    enc::verbatim(out, &s, v3);
}
