//! The command table: every RESP command's name, arity, whether it writes, and where its keys
//! are, declared once (string, key and server commands here, each collection family's in its
//! own module), and looked up by name for every request.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

/// The collection families, whose commands live in `commands::{list, hash, set, zset}` (and
/// whose storage is `crate::types`').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    List,
    Hash,
    Set,
    ZSet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    /// A collection command: its family and its code within the family's table.
    Coll(Family, u8),
    /// A pop that may block, or a multi-key pop (`types::blocking`), by its code.
    Pop(u8),
    Get,
    Set,
    SetNx,
    SetEx,
    PSetEx,
    GetSet,
    GetDel,
    GetEx,
    MGet,
    MSet,
    MSetNx,
    Incr,
    IncrBy,
    Decr,
    DecrBy,
    IncrByFloat,
    Append,
    StrLen,
    GetRange,
    SetRange,
    SetBit,
    GetBit,
    BitCount,
    BitPos,
    BitOp,
    BitField,
    BitFieldRo,
    Lcs,
    Del,
    Exists,
    Expire,
    PExpire,
    ExpireAt,
    PExpireAt,
    Ttl,
    PTtl,
    ExpireTime,
    PExpireTime,
    Persist,
    Type,
    Rename,
    RenameNx,
    Copy,
    Dump,
    Restore,
    Keys,
    Scan,
    RandomKey,
    DbSize,
    FlushDb,
    Ping,
    Echo,
    Quit,
    Select,
    Info,
    Command,
    Config,
    Client,
    Time,
    Auth,
    Hello,
    BgSave,
    LastSave,
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
    Subscribe,
    Unsubscribe,
    PSubscribe,
    PUnsubscribe,
    Publish,
    PubSub,
    Reset,
    Object,
    Memory,
    Latency,
    Function,
    Wait,
    Acl,
    Eval,
    EvalSha,
    EvalRo,
    EvalShaRo,
    Script,
    ReplConf,
    Psync,
    Sync,
    Role,
    ReplicaOf,
    Shutdown,
}

/// One command: Redis's arity rule (n: exactly n arguments including the name; -n: at least n),
/// whether it writes, and where its keys are (first, last, step; last -1 = to the end).
pub struct Spec {
    pub name: &'static str,
    pub arity: i32,
    pub write: bool,
    pub keys: (i32, i32, i32),
    pub cmd: Cmd,
}

pub const fn spec(
    name: &'static str,
    arity: i32,
    write: bool,
    keys: (i32, i32, i32),
    cmd: Cmd,
) -> Spec {
    Spec {
        name,
        arity,
        write,
        keys,
        cmd,
    }
}

pub const W: bool = true;
pub const R: bool = false;
pub const NOKEY: (i32, i32, i32) = (0, 0, 0);
pub const KEY1: (i32, i32, i32) = (1, 1, 1);

/// Every command table: the string, key and server commands here, then each collection family's.
fn tables() -> [&'static [Spec]; 6] {
    use super::{blocking, hash, list, set, zset};
    [
        COMMANDS,
        list::COMMANDS,
        hash::COMMANDS,
        set::COMMANDS,
        zset::COMMANDS,
        blocking::COMMANDS,
    ]
}

pub fn all_specs() -> impl Iterator<Item = &'static Spec> {
    tables().into_iter().flatten()
}

/// How many commands the tables hold.
pub fn spec_count() -> usize {
    tables().iter().map(|t| t.len()).sum()
}

/// The position of `spec` in `all_specs()` (for per-command counters), found from where it
/// lies in its table: no lookup by name.
pub fn index(spec: &Spec) -> usize {
    let p = spec as *const Spec as usize;
    let mut base = 0;
    for t in tables() {
        let start = t.as_ptr() as usize;
        let end = start + std::mem::size_of_val(t);
        if (start..end).contains(&p) {
            return base + (p - start) / std::mem::size_of::<Spec>();
        }
        base += t.len();
    }
    // Not a table entry (cannot happen: every Spec handed out is one).
    usize::MAX
}

static COMMANDS: &[Spec] = &[
    spec("get", 2, R, KEY1, Cmd::Get),
    spec("set", -3, W, KEY1, Cmd::Set),
    spec("setnx", 3, W, KEY1, Cmd::SetNx),
    spec("setex", 4, W, KEY1, Cmd::SetEx),
    spec("psetex", 4, W, KEY1, Cmd::PSetEx),
    spec("getset", 3, W, KEY1, Cmd::GetSet),
    spec("getdel", 2, W, KEY1, Cmd::GetDel),
    spec("getex", -2, W, KEY1, Cmd::GetEx),
    spec("mget", -2, R, (1, -1, 1), Cmd::MGet),
    spec("mset", -3, W, (1, -1, 2), Cmd::MSet),
    spec("msetnx", -3, W, (1, -1, 2), Cmd::MSetNx),
    spec("incr", 2, W, KEY1, Cmd::Incr),
    spec("incrby", 3, W, KEY1, Cmd::IncrBy),
    spec("decr", 2, W, KEY1, Cmd::Decr),
    spec("decrby", 3, W, KEY1, Cmd::DecrBy),
    spec("incrbyfloat", 3, W, KEY1, Cmd::IncrByFloat),
    spec("append", 3, W, KEY1, Cmd::Append),
    spec("strlen", 2, R, KEY1, Cmd::StrLen),
    spec("getrange", 4, R, KEY1, Cmd::GetRange),
    spec("substr", 4, R, KEY1, Cmd::GetRange),
    spec("setrange", 4, W, KEY1, Cmd::SetRange),
    spec("setbit", 4, W, KEY1, Cmd::SetBit),
    spec("getbit", 3, R, KEY1, Cmd::GetBit),
    spec("bitcount", -2, R, KEY1, Cmd::BitCount),
    spec("bitpos", -3, R, KEY1, Cmd::BitPos),
    // The operation comes first, then the destination and the sources.
    spec("bitop", -4, W, (2, -1, 1), Cmd::BitOp),
    spec("bitfield", -2, W, KEY1, Cmd::BitField),
    spec("bitfield_ro", -2, R, KEY1, Cmd::BitFieldRo),
    spec("lcs", -3, R, (1, 2, 1), Cmd::Lcs),
    spec("del", -2, W, (1, -1, 1), Cmd::Del),
    spec("unlink", -2, W, (1, -1, 1), Cmd::Del),
    spec("exists", -2, R, (1, -1, 1), Cmd::Exists),
    spec("expire", -3, W, KEY1, Cmd::Expire),
    spec("pexpire", -3, W, KEY1, Cmd::PExpire),
    spec("expireat", -3, W, KEY1, Cmd::ExpireAt),
    spec("pexpireat", -3, W, KEY1, Cmd::PExpireAt),
    spec("ttl", 2, R, KEY1, Cmd::Ttl),
    spec("pttl", 2, R, KEY1, Cmd::PTtl),
    spec("expiretime", 2, R, KEY1, Cmd::ExpireTime),
    spec("pexpiretime", 2, R, KEY1, Cmd::PExpireTime),
    spec("persist", 2, W, KEY1, Cmd::Persist),
    spec("type", 2, R, KEY1, Cmd::Type),
    spec("rename", 3, W, (1, 2, 1), Cmd::Rename),
    spec("renamenx", 3, W, (1, 2, 1), Cmd::RenameNx),
    spec("copy", -3, W, (1, 2, 1), Cmd::Copy),
    spec("dump", 2, R, KEY1, Cmd::Dump),
    spec("restore", -4, W, KEY1, Cmd::Restore),
    spec("keys", 2, R, NOKEY, Cmd::Keys),
    spec("scan", -2, R, NOKEY, Cmd::Scan),
    spec("randomkey", 1, R, NOKEY, Cmd::RandomKey),
    spec("dbsize", 1, R, NOKEY, Cmd::DbSize),
    spec("flushdb", -1, W, NOKEY, Cmd::FlushDb),
    spec("flushall", -1, W, NOKEY, Cmd::FlushDb),
    spec("ping", -1, R, NOKEY, Cmd::Ping),
    spec("echo", 2, R, NOKEY, Cmd::Echo),
    spec("quit", -1, R, NOKEY, Cmd::Quit),
    spec("select", 2, R, NOKEY, Cmd::Select),
    spec("info", -1, R, NOKEY, Cmd::Info),
    spec("command", -1, R, NOKEY, Cmd::Command),
    spec("config", -2, R, NOKEY, Cmd::Config),
    spec("client", -2, R, NOKEY, Cmd::Client),
    spec("time", 1, R, NOKEY, Cmd::Time),
    spec("auth", -2, R, NOKEY, Cmd::Auth),
    spec("hello", -1, R, NOKEY, Cmd::Hello),
    spec("bgsave", -1, R, NOKEY, Cmd::BgSave),
    spec("lastsave", 1, R, NOKEY, Cmd::LastSave),
    spec("multi", 1, R, NOKEY, Cmd::Multi),
    spec("exec", 1, R, NOKEY, Cmd::Exec),
    spec("discard", 1, R, NOKEY, Cmd::Discard),
    spec("watch", -2, R, (1, -1, 1), Cmd::Watch),
    spec("unwatch", 1, R, NOKEY, Cmd::Unwatch),
    spec("subscribe", -2, R, NOKEY, Cmd::Subscribe),
    spec("unsubscribe", -1, R, NOKEY, Cmd::Unsubscribe),
    spec("psubscribe", -2, R, NOKEY, Cmd::PSubscribe),
    spec("punsubscribe", -1, R, NOKEY, Cmd::PUnsubscribe),
    spec("publish", 3, R, NOKEY, Cmd::Publish),
    spec("pubsub", -2, R, NOKEY, Cmd::PubSub),
    spec("reset", 1, R, NOKEY, Cmd::Reset),
    spec("object", -2, R, (2, 2, 1), Cmd::Object),
    spec("memory", -2, R, (2, 2, 1), Cmd::Memory),
    spec("latency", -2, R, NOKEY, Cmd::Latency),
    spec("function", -2, R, NOKEY, Cmd::Function),
    spec("wait", 3, R, NOKEY, Cmd::Wait),
    spec("replconf", -1, R, NOKEY, Cmd::ReplConf),
    spec("psync", -3, R, NOKEY, Cmd::Psync),
    spec("sync", 1, R, NOKEY, Cmd::Sync),
    spec("role", 1, R, NOKEY, Cmd::Role),
    spec("replicaof", 3, R, NOKEY, Cmd::ReplicaOf),
    spec("slaveof", 3, R, NOKEY, Cmd::ReplicaOf),
    spec("shutdown", -1, R, NOKEY, Cmd::Shutdown),
    spec("acl", -2, R, NOKEY, Cmd::Acl),
    // Scripts name their keys after a count: dispatched before the write path.
    spec("eval", -3, R, NOKEY, Cmd::Eval),
    spec("evalsha", -3, R, NOKEY, Cmd::EvalSha),
    spec("eval_ro", -3, R, NOKEY, Cmd::EvalRo),
    spec("evalsha_ro", -3, R, NOKEY, Cmd::EvalShaRo),
    spec("script", -2, R, NOKEY, Cmd::Script),
];

pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    if name.len() > 16 {
        return None;
    }
    let mut lower = [0u8; 16];
    for (d, s) in lower.iter_mut().zip(name) {
        *d = s.to_ascii_lowercase();
    }
    let lower = &lower[..name.len()];
    // Built once: every request looks its name up here.
    static INDEX: OnceLock<HashMap<&'static [u8], &'static Spec, BuildHasherDefault<Fnv>>> =
        OnceLock::new();
    INDEX
        .get_or_init(|| all_specs().map(|s| (s.name.as_bytes(), s)).collect())
        .get(lower)
        .copied()
}

/// FNV-1a: command names are short and trusted-length, so a cheap hash beats SipHash here.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        self.0 = h;
    }
}

/// Where the count sits in a command whose keys follow one (Redis's "movable keys": their key
/// triple names at most a destination): ZUNION, SINTERCARD, LMPOP, ZUNIONSTORE, BLMPOP, ...
pub fn numkeys_at(name: &str) -> Option<usize> {
    match name {
        "zunion" | "zinter" | "zdiff" | "zintercard" | "sintercard" | "lmpop" | "zmpop" => Some(1),
        "zunionstore" | "zinterstore" | "zdiffstore" | "blmpop" | "bzmpop" => Some(2),
        _ => None,
    }
}

/// The keys after the count of such a command (none when the count is not a positive
/// integer: the command then fails by itself), as far as the arguments go.
pub fn counted_keys<'a>(spec: &Spec, args: &'a [&'a [u8]]) -> &'a [&'a [u8]] {
    let Some(at) = numkeys_at(spec.name) else {
        return &[];
    };
    match args
        .get(at)
        .and_then(|b| crate::protocol::resp::parse_i64(b))
    {
        Some(n) if n > 0 && at < args.len() => {
            let end = (at + 1).saturating_add(n as usize).min(args.len());
            &args[at + 1..end]
        }
        _ => &[],
    }
}

/// Commands whose reply depends on the store: inside EXEC they run in the writer.
pub fn reads_store(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Coll(..)
            | Cmd::Get
            | Cmd::StrLen
            | Cmd::GetRange
            | Cmd::GetBit
            | Cmd::BitCount
            | Cmd::BitPos
            | Cmd::BitFieldRo
            | Cmd::Lcs
            | Cmd::MGet
            | Cmd::Exists
            | Cmd::Ttl
            | Cmd::PTtl
            | Cmd::ExpireTime
            | Cmd::PExpireTime
            | Cmd::Type
            | Cmd::DbSize
            | Cmd::Keys
            | Cmd::Scan
            | Cmd::RandomKey
            | Cmd::Object
            | Cmd::Memory
            | Cmd::Dump
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_other_than_flush_take_a_key_first() {
        // Pops check each of their keys themselves (LMPOP's follow a count); BITOP names its
        // operation first.
        let own_keys = |s: &Spec| matches!(s.cmd, Cmd::Pop(_) | Cmd::BitOp);
        for s in all_specs().filter(|s| s.write && s.cmd != Cmd::FlushDb && !own_keys(s)) {
            assert!(
                s.arity.abs() >= 2 && s.keys.0 == 1,
                "{} must name a key first",
                s.name
            );
        }
    }

    #[test]
    fn index_is_the_position_in_all_specs() {
        for (i, s) in all_specs().enumerate() {
            assert_eq!(index(s), i, "{}", s.name);
            assert_eq!(index(lookup(s.name.as_bytes()).expect("known")), i);
        }
        assert_eq!(spec_count(), all_specs().count());
    }

    #[test]
    fn command_table_names_are_lowercase_and_unique() {
        let all: Vec<&Spec> = all_specs().collect();
        for (i, s) in all.iter().enumerate() {
            assert_eq!(s.name, s.name.to_ascii_lowercase());
            assert!(
                all[i + 1..].iter().all(|o| o.name != s.name),
                "{} twice",
                s.name
            );
            assert!(lookup(s.name.to_ascii_uppercase().as_bytes()).is_some());
        }
    }
}
