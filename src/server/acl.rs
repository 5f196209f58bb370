//! Redis ACL users, the part clients use: users with passwords (kept as SHA-256, compared in
//! constant time), key and channel patterns, and the commands they may run, by name or by
//! category; from an ACL file (`aclfile`, Redis's `user <name> <rules>` lines) and `ACL
//! SETUSER` at run time.
//!
//! The `default` user is `on nopass ~* &* +@all` unless `requirepass` gives it a password;
//! a connection starts as `default`, authenticated if it needs no password. While every user
//! may run everything on every key (`restricted()` false), requests skip the checks entirely.
//!
//! Rules (`ACL SETUSER name rule...`, applied in order): `on`, `off`, `nopass`, `resetpass`,
//! `>password`, `<password`, `#sha256hex`, `!sha256hex`, `~pattern`, `allkeys`, `resetkeys`,
//! `&pattern`, `allchannels`, `resetchannels`, `+command`, `-command`, `+@category`,
//! `-@category`, `allcommands`, `nocommands`, `reset`. A new user starts `off`, with no
//! password, keys, channels or commands. Categories (`ACL CAT`): the ones memkeep's commands
//! fall in, derived from the command table (`categories`). Differences from Redis 7.0 (also in
//! proto/SPEC.md): `ACL LIST` shows command rules as given, not rewritten into Redis's
//! per-command form; selectors, `%R~`/`%W~` key permissions and `+cmd|subcommand` rules are
//! refused with a syntax error; a user deleted or switched off while connected has its next
//! commands refused (`NOPERM`) rather than its connections closed.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

use crate::commands::args::glob_match;
use crate::commands::table::{Cmd, Family, Spec, all_specs, counted_keys, reads_store};

/// Every category `ACL CAT` lists.
pub const CATEGORIES: &[&str] = &[
    "keyspace",
    "read",
    "write",
    "set",
    "sortedset",
    "list",
    "hash",
    "string",
    "bitmap",
    "pubsub",
    "admin",
    "blocking",
    "dangerous",
    "connection",
    "transaction",
    "scripting",
];

/// The categories a command falls in (besides `all`).
pub fn categories(spec: &Spec) -> Vec<&'static str> {
    let mut c = Vec::new();
    if spec.write {
        c.push("write");
    } else if reads_store(spec.cmd) || matches!(spec.cmd, Cmd::Keys | Cmd::Scan | Cmd::RandomKey) {
        c.push("read");
    }
    match spec.cmd {
        Cmd::Eval | Cmd::EvalSha | Cmd::EvalRo | Cmd::EvalShaRo | Cmd::Script | Cmd::Function => {
            c.push("scripting")
        }
        Cmd::Coll(Family::List, _) => c.push("list"),
        Cmd::Coll(Family::Hash, _) => c.push("hash"),
        Cmd::Coll(Family::Set, _) => c.push("set"),
        Cmd::Coll(Family::ZSet, _) => c.push("sortedset"),
        Cmd::Pop(_) => {
            c.push(if spec.name.contains('z') {
                "sortedset"
            } else {
                "list"
            });
            if spec.name.starts_with('b') {
                c.push("blocking");
            }
        }
        Cmd::Get
        | Cmd::Set
        | Cmd::SetNx
        | Cmd::SetEx
        | Cmd::PSetEx
        | Cmd::GetSet
        | Cmd::GetDel
        | Cmd::GetEx
        | Cmd::MGet
        | Cmd::MSet
        | Cmd::MSetNx
        | Cmd::Incr
        | Cmd::IncrBy
        | Cmd::Decr
        | Cmd::DecrBy
        | Cmd::IncrByFloat
        | Cmd::Append
        | Cmd::StrLen
        | Cmd::GetRange
        | Cmd::SetRange
        | Cmd::Lcs => c.push("string"),
        Cmd::SetBit
        | Cmd::GetBit
        | Cmd::BitCount
        | Cmd::BitPos
        | Cmd::BitOp
        | Cmd::BitField
        | Cmd::BitFieldRo => c.push("bitmap"),
        Cmd::Del
        | Cmd::Exists
        | Cmd::Expire
        | Cmd::PExpire
        | Cmd::ExpireAt
        | Cmd::PExpireAt
        | Cmd::Ttl
        | Cmd::PTtl
        | Cmd::ExpireTime
        | Cmd::PExpireTime
        | Cmd::Persist
        | Cmd::Type
        | Cmd::Rename
        | Cmd::RenameNx
        | Cmd::Scan
        | Cmd::RandomKey
        | Cmd::DbSize
        | Cmd::Object
        | Cmd::Copy
        | Cmd::Dump => c.push("keyspace"),
        Cmd::Memory => {}
        Cmd::Restore => c.extend(["keyspace", "dangerous"]),
        Cmd::Keys | Cmd::FlushDb => c.extend(["keyspace", "dangerous"]),
        Cmd::Subscribe
        | Cmd::Unsubscribe
        | Cmd::PSubscribe
        | Cmd::PUnsubscribe
        | Cmd::Publish
        | Cmd::PubSub => c.push("pubsub"),
        Cmd::Multi | Cmd::Exec | Cmd::Discard | Cmd::Watch | Cmd::Unwatch => c.push("transaction"),
        Cmd::Ping | Cmd::Echo | Cmd::Quit | Cmd::Select | Cmd::Auth | Cmd::Hello | Cmd::Reset => {
            c.push("connection")
        }
        Cmd::Client => c.extend(["connection", "admin", "dangerous"]),
        Cmd::Config | Cmd::BgSave | Cmd::LastSave | Cmd::Latency | Cmd::Acl => {
            c.extend(["admin", "dangerous"])
        }
        Cmd::Info => c.push("dangerous"),
        Cmd::Wait => c.push("blocking"),
        Cmd::ReplConf | Cmd::Psync | Cmd::Sync | Cmd::ReplicaOf | Cmd::Shutdown => {
            c.extend(["admin", "slow", "dangerous"])
        }
        Cmd::Role => c.extend(["admin", "fast", "dangerous"]),
        Cmd::Command | Cmd::Time => {}
    }
    c
}

/// One user.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    on: bool,
    nopass: bool,
    passwords: Vec<[u8; 32]>,
    keys: Vec<Vec<u8>>,
    channels: Vec<Vec<u8>>,
    /// Commands allowed, by name.
    allowed: HashSet<&'static str>,
    /// The command rules applied since the last `allcommands`/`nocommands`/`reset`, for
    /// `ACL LIST` (starting with the one that set the base: `+@all` or `-@all`).
    rules: Vec<String>,
}

fn sha(password: &[u8]) -> [u8; 32] {
    Sha256::digest(password).into()
}

fn hex(d: &[u8; 32]) -> String {
    let mut s = String::with_capacity(64);
    for b in d {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn unhex(t: &str) -> Option<[u8; 32]> {
    if t.len() != 64 {
        return None;
    }
    let mut d = [0u8; 32];
    for (i, out) in d.iter_mut().enumerate() {
        *out = u8::from_str_radix(t.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(d)
}

/// Whether a password given equals the one configured, in time that does not depend on where
/// they differ (only on their lengths): for the memcached port's users (`-Y`, SASL PLAIN).
pub fn secret_eq(given: &[u8], known: &[u8]) -> bool {
    let (a, b) = (sha(given), sha(known));
    same(&a, &b)
}

/// Equal digests, in time that does not depend on where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl User {
    fn new(name: &str) -> User {
        User {
            name: name.to_string(),
            on: false,
            nopass: false,
            passwords: Vec::new(),
            keys: Vec::new(),
            channels: Vec::new(),
            allowed: HashSet::new(),
            rules: vec!["-@all".into()],
        }
    }

    /// `on nopass ~* &* +@all`, or with `password`.
    fn default_user(password: &str) -> User {
        let mut u = User::new("default");
        let mut rules = vec!["on", "~*", "&*", "+@all"];
        let given = format!(">{password}");
        if password.is_empty() {
            rules.push("nopass");
        } else {
            rules.push(&given);
        }
        for r in rules {
            // The rules are fixed and valid.
            let _ = u.apply(r);
        }
        u
    }

    /// Whether this user may run anything on any key and channel (no check needed).
    fn unrestricted(&self) -> bool {
        self.on
            && self.keys.iter().any(|k| k == b"*")
            && self.channels.iter().any(|k| k == b"*")
            && all_specs().all(|s| self.allowed.contains(s.name))
    }

    fn set_commands(&mut self, category: Option<&str>, name: Option<&str>, allow: bool) {
        for s in all_specs() {
            let hit = match (category, name) {
                (Some("all"), _) => true,
                (Some(cat), _) => categories(s).contains(&cat),
                (None, Some(n)) => s.name == n,
                (None, None) => false,
            };
            if hit {
                if allow {
                    self.allowed.insert(s.name);
                } else {
                    self.allowed.remove(s.name);
                }
            }
        }
    }

    /// Applies one rule; Err: Redis's reason (`Syntax error`, ...).
    fn apply(&mut self, rule: &str) -> Result<(), &'static str> {
        let lower = rule.to_ascii_lowercase();
        match lower.as_str() {
            "on" => self.on = true,
            "off" => self.on = false,
            "nopass" => {
                self.nopass = true;
                self.passwords.clear();
            }
            "resetpass" => {
                self.nopass = false;
                self.passwords.clear();
            }
            "allkeys" => self.keys = vec![b"*".to_vec()],
            "resetkeys" => self.keys.clear(),
            "allchannels" => self.channels = vec![b"*".to_vec()],
            "resetchannels" => self.channels.clear(),
            "allcommands" | "+@all" => {
                self.set_commands(Some("all"), None, true);
                self.rules = vec!["+@all".into()];
            }
            "nocommands" | "-@all" => {
                self.allowed.clear();
                self.rules = vec!["-@all".into()];
            }
            "reset" => *self = User::new(&self.name),
            _ => {
                let (first, rest) = rule.split_at(rule.chars().next().map_or(0, char::len_utf8));
                match first {
                    ">" => {
                        let d = sha(rest.as_bytes());
                        if !self.passwords.iter().any(|p| same(p, &d)) {
                            self.passwords.push(d);
                        }
                        self.nopass = false;
                    }
                    "<" => {
                        let d = sha(rest.as_bytes());
                        self.passwords.retain(|p| !same(p, &d));
                    }
                    "#" => {
                        let d = unhex(&rest.to_ascii_lowercase()).ok_or(
                            "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters",
                        )?;
                        if !self.passwords.contains(&d) {
                            self.passwords.push(d);
                        }
                        self.nopass = false;
                    }
                    "!" => {
                        let d = unhex(&rest.to_ascii_lowercase()).ok_or(
                            "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters",
                        )?;
                        self.passwords.retain(|p| p != &d);
                    }
                    "~" => {
                        if !self.keys.iter().any(|k| k == rest.as_bytes()) {
                            self.keys.push(rest.as_bytes().to_vec());
                        }
                    }
                    "&" => {
                        if !self.channels.iter().any(|k| k == rest.as_bytes()) {
                            self.channels.push(rest.as_bytes().to_vec());
                        }
                    }
                    "+" | "-" => {
                        let allow = first == "+";
                        let target = rest.to_ascii_lowercase();
                        if let Some(cat) = target.strip_prefix('@') {
                            if !CATEGORIES.contains(&cat) {
                                return Err("Unknown command or category name in ACL");
                            }
                            self.set_commands(Some(cat), None, allow);
                        } else {
                            if target.contains('|') || !all_specs().any(|s| s.name == target) {
                                return Err("Unknown command or category name in ACL");
                            }
                            self.set_commands(None, Some(&target), allow);
                        }
                        self.rules.push(format!("{first}{target}"));
                    }
                    _ => return Err("Syntax error"),
                }
            }
        }
        Ok(())
    }

    /// The user as `ACL LIST` shows it.
    fn describe(&self) -> String {
        let mut s = format!("user {} {}", self.name, if self.on { "on" } else { "off" });
        if self.nopass {
            s.push_str(" nopass");
        }
        for p in &self.passwords {
            let _ = write!(s, " #{}", hex(p));
        }
        if self.keys.is_empty() {
            s.push_str(" resetkeys");
        }
        for k in &self.keys {
            let _ = write!(s, " ~{}", String::from_utf8_lossy(k));
        }
        if self.channels.is_empty() {
            s.push_str(" resetchannels");
        }
        for c in &self.channels {
            let _ = write!(s, " &{}", String::from_utf8_lossy(c));
        }
        for r in &self.rules {
            let _ = write!(s, " {r}");
        }
        s
    }
}

/// A user as `ACL GETUSER` shows it.
#[derive(Debug, PartialEq, Eq)]
pub struct UserView {
    pub flags: Vec<String>,
    /// SHA-256 digests, in hex.
    pub passwords: Vec<String>,
    pub commands: String,
    pub keys: String,
    pub channels: String,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    Command,
    Key,
    Channel,
}

/// The users, and counts of what was refused (INFO).
pub struct Acl {
    users: RwLock<BTreeMap<String, Arc<User>>>,
    /// Some user may not run everything: requests are checked.
    restricted: AtomicBool,
    /// `default` needs no password: connections start authenticated.
    open: AtomicBool,
    pub denied_auth: AtomicU64,
    pub denied_cmd: AtomicU64,
    pub denied_key: AtomicU64,
    pub denied_channel: AtomicU64,
}

impl Acl {
    /// The users `requirepass` and the ACL file (if any) define; Err: the file's first bad
    /// line, for the operator.
    pub fn new(requirepass: &str, file: Option<&Path>) -> Result<Acl, String> {
        let mut users = BTreeMap::new();
        users.insert(
            "default".to_string(),
            Arc::new(User::default_user(requirepass)),
        );
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the ACL file {}: {e}", path.display()))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let mut words = line.split_ascii_whitespace();
                let (Some("user"), Some(name)) = (words.next(), words.next()) else {
                    return Err(format!(
                        "{} line {}: expected `user <name> <rules...>`",
                        path.display(),
                        n + 1
                    ));
                };
                let mut u = User::new(name);
                for rule in words {
                    u.apply(rule).map_err(|why| {
                        format!("{} line {}: '{rule}': {why}", path.display(), n + 1)
                    })?;
                }
                users.insert(name.to_string(), Arc::new(u));
            }
        }
        let acl = Acl {
            users: RwLock::new(users),
            restricted: AtomicBool::new(false),
            open: AtomicBool::new(false),
            denied_auth: AtomicU64::new(0),
            denied_cmd: AtomicU64::new(0),
            denied_key: AtomicU64::new(0),
            denied_channel: AtomicU64::new(0),
        };
        acl.refresh();
        Ok(acl)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<User>>> {
        self.users.read().unwrap_or_else(|p| p.into_inner())
    }

    fn refresh(&self) {
        let users = self.read();
        let restricted = users.values().any(|u| !u.unrestricted());
        let open = users.get("default").is_some_and(|u| u.on && u.nopass);
        drop(users);
        self.restricted.store(restricted, Ordering::Release);
        self.open.store(open, Ordering::Release);
    }

    /// Some user may not run every command on every key: requests of `default` are checked
    /// (those of a named user always are).
    pub fn restricted(&self) -> bool {
        self.restricted.load(Ordering::Acquire)
    }

    /// Connections need no AUTH (the default user is on and has no password).
    pub fn open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Whether `password` logs `user` in; a refusal is counted.
    pub fn authenticate(&self, user: &[u8], password: &[u8]) -> bool {
        let d = sha(password);
        let ok = std::str::from_utf8(user)
            .ok()
            .and_then(|u| self.read().get(u).cloned())
            .is_some_and(|u| {
                u.on && (u.nopass || u.passwords.iter().fold(false, |hit, p| hit | same(p, &d)))
            });
        if !ok {
            self.denied_auth.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Whether the default user has a password (`AUTH <password>` needs one).
    pub fn default_has_password(&self) -> bool {
        self.read()
            .get("default")
            .is_some_and(|u| !u.nopass && !u.passwords.is_empty())
    }

    /// May `user` (None: `default`) run `spec` with `args`? Err: the NOPERM reply.
    pub fn permit(&self, user: Option<&str>, spec: &Spec, args: &[&[u8]]) -> Result<(), String> {
        // (A named user is looked up even then: it may have been deleted.)
        if user.is_none() && !self.restricted() {
            return Ok(());
        }
        let u = self.read().get(user.unwrap_or("default")).cloned();
        let refused = match u {
            Some(u) if u.on => check(&u, spec, args),
            _ => Err(Denied::Command),
        };
        match refused {
            Ok(()) => Ok(()),
            Err(why) => {
                let (counter, msg) = match why {
                    Denied::Command => (
                        &self.denied_cmd,
                        format!(
                            "NOPERM this user has no permissions to run the '{}' command",
                            command_name(spec, args.get(1).copied())
                        ),
                    ),
                    Denied::Key => (
                        &self.denied_key,
                        "NOPERM this user has no permissions to access one of the keys used as arguments".to_string(),
                    ),
                    Denied::Channel => (
                        &self.denied_channel,
                        "NOPERM this user has no permissions to access one of the channels used as arguments".to_string(),
                    ),
                };
                counter.fetch_add(1, Ordering::Relaxed);
                Err(msg)
            }
        }
    }

    /// `ACL SETUSER name rules...`: Err is the error reply.
    pub fn set_user(&self, name: &str, rules: &[&str]) -> Result<(), String> {
        let mut users = self.users.write().unwrap_or_else(|p| p.into_inner());
        let mut u = users
            .get(name)
            .map_or_else(|| User::new(name), |u| (**u).clone());
        for r in rules {
            u.apply(r)
                .map_err(|why| format!("ERR Error in ACL SETUSER modifier '{r}': {why}"))?;
        }
        users.insert(name.to_string(), Arc::new(u));
        drop(users);
        self.refresh();
        Ok(())
    }

    /// `ACL DELUSER`: how many of `names` existed (`default` cannot be deleted: Err).
    pub fn del_users(&self, names: &[&str]) -> Result<usize, String> {
        if names.contains(&"default") {
            return Err("ERR The 'default' user cannot be removed".into());
        }
        let mut users = self.users.write().unwrap_or_else(|p| p.into_inner());
        let n = names.iter().filter(|n| users.remove(**n).is_some()).count();
        drop(users);
        self.refresh();
        Ok(n)
    }

    pub fn user_names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    pub fn list(&self) -> Vec<String> {
        self.read().values().map(|u| u.describe()).collect()
    }

    /// `ACL GETUSER`: what it shows of a user, or None.
    pub fn get_user(&self, name: &str) -> Option<UserView> {
        let users = self.read();
        let u = users.get(name)?;
        let mut flags = vec![if u.on { "on" } else { "off" }.to_string()];
        if u.nopass {
            flags.push("nopass".into());
        }
        let keys = u
            .keys
            .iter()
            .map(|k| format!("~{}", String::from_utf8_lossy(k)))
            .collect::<Vec<_>>()
            .join(" ");
        let channels = u
            .channels
            .iter()
            .map(|k| format!("&{}", String::from_utf8_lossy(k)))
            .collect::<Vec<_>>()
            .join(" ");
        Some(UserView {
            flags,
            passwords: u.passwords.iter().map(hex).collect(),
            commands: u.rules.join(" "),
            keys,
            channels,
        })
    }
}

/// How Redis names a command in its refusals (NOPERM, subscribed mode): `name`, or
/// `name|subcommand` for a container given a subcommand (`sub`, argument 1).
pub(crate) fn command_name(spec: &Spec, sub: Option<&[u8]>) -> String {
    let container = matches!(
        spec.cmd,
        Cmd::Client
            | Cmd::Config
            | Cmd::Command
            | Cmd::PubSub
            | Cmd::Object
            | Cmd::Memory
            | Cmd::Latency
            | Cmd::Function
            | Cmd::Acl
    );
    match sub {
        Some(sub) if container => format!(
            "{}|{}",
            spec.name,
            String::from_utf8_lossy(sub).to_ascii_lowercase()
        ),
        _ => spec.name.to_string(),
    }
}

fn check(u: &User, spec: &Spec, args: &[&[u8]]) -> Result<(), Denied> {
    // Everyone may log in, change protocol and leave (as in Redis, ACL WHOAMI needs a grant).
    if matches!(spec.cmd, Cmd::Auth | Cmd::Hello | Cmd::Quit) {
        return Ok(());
    }
    if !u.allowed.contains(spec.name) {
        return Err(Denied::Command);
    }
    let (first, last, step) = spec.keys;
    if first > 0 && step > 0 {
        let n = args.len() as i32;
        let last = if last < 0 { n + last } else { last.min(n - 1) };
        let mut i = first;
        while i <= last && i < n {
            let key = args[i as usize];
            if !u.keys.iter().any(|p| glob_match(p, key)) {
                return Err(Denied::Key);
            }
            i += step;
        }
    }
    // Keys after a count (ZUNION, SINTERCARD, LMPOP, ...).
    if counted_keys(spec, args)
        .iter()
        .any(|key| !u.keys.iter().any(|p| glob_match(p, key)))
    {
        return Err(Denied::Key);
    }
    let channels: &[&[u8]] = match spec.cmd {
        Cmd::Subscribe => &args[1..],
        Cmd::Publish => &args[1..2.min(args.len())],
        _ => &[],
    };
    if channels
        .iter()
        .any(|c| !u.channels.iter().any(|p| glob_match(p, c)))
    {
        return Err(Denied::Channel);
    }
    // A pattern subscription must be one the user has (or all of them).
    if spec.cmd == Cmd::PSubscribe
        && args[1..]
            .iter()
            .any(|p| !u.channels.iter().any(|c| c == b"*" || c == p))
    {
        return Err(Denied::Channel);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::table::lookup;

    fn permit(acl: &Acl, user: &str, line: &str) -> Result<(), String> {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let spec = lookup(args[0]).expect("known command");
        acl.permit(Some(user), spec, &args)
    }

    #[test]
    fn rules_grant_commands_keys_and_channels() {
        let acl = Acl::new("", None).expect("acl");
        assert!(acl.open());
        assert!(permit(&acl, "default", "FLUSHALL").is_ok());
        acl.set_user(
            "alice",
            &["on", ">pw", "~k*", "&news", "+@read", "+set", "-@dangerous"],
        )
        .expect("setuser");
        assert!(acl.authenticate(b"alice", b"pw"));
        assert!(!acl.authenticate(b"alice", b"PW"));
        assert!(!acl.authenticate(b"nobody", b"pw"));
        assert_eq!(acl.denied_auth.load(Ordering::Relaxed), 2);
        assert!(permit(&acl, "alice", "GET k1").is_ok());
        assert!(permit(&acl, "alice", "SET k2 v").is_ok());
        assert!(permit(&acl, "alice", "MGET k1 k2").is_ok());
        assert_eq!(
            permit(&acl, "alice", "GET x").unwrap_err(),
            "NOPERM this user has no permissions to access one of the keys used as arguments"
        );
        assert!(permit(&acl, "alice", "MGET k1 x").is_err());
        assert_eq!(
            permit(&acl, "alice", "DEL k1").unwrap_err(),
            "NOPERM this user has no permissions to run the 'del' command"
        );
        assert!(
            permit(&acl, "alice", "KEYS *").is_err(),
            "dangerous taken back"
        );
        assert!(permit(&acl, "alice", "ZRANGE k 0 1").is_ok());
        // Keys after a count are checked too.
        assert!(permit(&acl, "alice", "ZUNION 2 k1 k2").is_ok());
        assert!(permit(&acl, "alice", "ZUNION 2 k1 x").is_err());
        assert!(permit(&acl, "alice", "ZINTERCARD 1 x").is_err());
        assert!(permit(&acl, "alice", "SINTERCARD 2 k1 x LIMIT 1").is_err());
        assert!(
            permit(&acl, "alice", "ZUNION 1 k1 x").is_ok(),
            "x is an option"
        );
        assert!(
            permit(&acl, "alice", "ZUNION 9 k1").is_ok(),
            "fails by itself"
        );
        assert!(
            permit(&acl, "alice", "PUBLISH news x").is_err(),
            "no pubsub commands"
        );
        acl.set_user("alice", &["+@pubsub"]).expect("setuser");
        assert!(permit(&acl, "alice", "PUBLISH news x").is_ok());
        assert_eq!(
            permit(&acl, "alice", "SUBSCRIBE news other").unwrap_err(),
            "NOPERM this user has no permissions to access one of the channels used as arguments"
        );
        assert_eq!(
            permit(&acl, "alice", "CONFIG GET x").unwrap_err(),
            "NOPERM this user has no permissions to run the 'config|get' command"
        );
        assert!(permit(&acl, "alice", "ACL WHOAMI").is_err(), "as in Redis");
        assert!(permit(&acl, "alice", "AUTH alice pw").is_ok());
        // Off, or gone: refused.
        acl.set_user("alice", &["off"]).expect("setuser");
        assert!(!acl.authenticate(b"alice", b"pw"));
        assert!(permit(&acl, "alice", "GET k1").is_err());
        assert_eq!(acl.del_users(&["alice", "nope"]), Ok(1));
        assert!(permit(&acl, "alice", "GET k1").is_err());
        assert!(acl.del_users(&["default"]).is_err());
    }

    #[test]
    fn listing_and_errors_read_like_redis() {
        let acl = Acl::new("secret", None).expect("acl");
        assert!(!acl.open());
        assert!(acl.default_has_password());
        assert!(acl.authenticate(b"default", b"secret"));
        acl.set_user("bob", &["on", "nopass", "allkeys", "allcommands"])
            .expect("setuser");
        let list = acl.list();
        assert_eq!(
            list[0], "user bob on nopass ~* resetchannels +@all",
            "{list:?}"
        );
        assert!(list[1].starts_with("user default on #2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b ~* &* +@all"), "{list:?}");
        assert_eq!(
            acl.set_user("x", &["badrule"]).unwrap_err(),
            "ERR Error in ACL SETUSER modifier 'badrule': Syntax error"
        );
        assert_eq!(
            acl.set_user("x", &["+@nosuch"]).unwrap_err(),
            "ERR Error in ACL SETUSER modifier '+@nosuch': Unknown command or category name in ACL"
        );
        assert_eq!(
            acl.user_names(),
            vec!["bob", "default"],
            "a failed SETUSER adds nobody"
        );
        let v = acl.get_user("bob").expect("bob");
        assert_eq!(
            v,
            UserView {
                flags: vec!["on".into(), "nopass".into()],
                passwords: vec![],
                commands: "+@all".into(),
                keys: "~*".into(),
                channels: String::new(),
            }
        );
    }

    #[test]
    fn an_acl_file_defines_users_and_names_its_bad_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("users.acl");
        std::fs::write(
            &f,
            "# users\nuser ro on >r ~* +@read\n\nuser default on nopass ~* &* +@all\n",
        )
        .expect("write");
        let acl = Acl::new("", Some(&f)).expect("acl");
        assert!(acl.authenticate(b"ro", b"r"));
        assert!(permit(&acl, "ro", "GET a").is_ok());
        assert!(permit(&acl, "ro", "SET a b").is_err());
        std::fs::write(&f, "user ro on ~* +@read\nuser bad on +nosuchcommand\n").expect("write");
        let e = Acl::new("", Some(&f)).err().expect("refused");
        assert!(e.contains("line 2") && e.contains("+nosuchcommand"), "{e}");
    }
}
