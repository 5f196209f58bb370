//! Configuration: one `Config` whose `Default` holds every default in one place. A TOML file
//! (`--config FILE`) overrides the defaults, and command-line flags override the file. Short flags
//! follow memcached and MemcacheDB (`-p -l -c -t -I -H -N -v`).

use std::fmt;
use std::path::{Path, PathBuf};

use clap::{ArgAction, Parser, ValueEnum};
use serde::Deserialize;

/// When a committed write reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Every reply is sent only after the write it acknowledges is fsynced.
    Always,
    /// Commits are not fsynced; a timer fsyncs every `sync_interval_ms`.
    Periodic,
    /// Commits are not fsynced; the OS writes pages back when it likes.
    Never,
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyncMode::Always => "always",
            SyncMode::Periodic => "periodic",
            SyncMode::Never => "never",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// memcached text protocol port; 0 disables it.
    pub port: u16,
    /// Redis RESP port; 0 disables it.
    pub resp_port: u16,
    /// Address both ports listen on.
    pub listen: String,
    /// Most client connections served at once; the next one is told and closed.
    pub max_connections: usize,
    /// Worker threads running event loops; 0 means one per core.
    pub threads: usize,
    /// Reader threads that bring values not in memory in from disk, so event loops never
    /// wait on it; 0 reads them in the event loop.
    pub io_threads: usize,
    /// Microseconds an idle worker keeps polling its sockets before it sleeps (in `never` and
    /// `periodic`; one worker at a time); 0 never.
    pub spin_us: u64,
    /// Largest value accepted, in bytes (suffixes k, m, g in the file and on the command line).
    #[serde(deserialize_with = "de_size")]
    pub max_item_size: u64,
    /// Longest RESP bulk string accepted, and longest string APPEND/SETRANGE may make, in bytes
    /// (Redis's `proto-max-bulk-len`; 1m to 1g). Independent of `max_item_size`, which bounds
    /// memcached values. A RESP connection's input buffer may grow to twice this.
    #[serde(deserialize_with = "de_size")]
    pub proto_max_bulk_len: u64,
    /// A script running longer than this (ms) makes other clients get `-BUSY` until it ends
    /// or `SCRIPT KILL` stops it (Redis's `lua-time-limit`/`busy-reply-threshold`; 0: never).
    pub lua_time_limit: u64,
    /// Directory holding the LMDB environment.
    pub data_dir: PathBuf,
    /// always | periodic | never.
    pub sync: SyncMode,
    /// fsync interval for `sync = "periodic"`.
    pub sync_interval_ms: u64,
    /// LMDB map size: the most data the store can hold. The file grows only as it is used.
    #[serde(deserialize_with = "de_size")]
    pub map_size: u64,
    /// Most write requests the writer applies in one transaction.
    pub max_batch: usize,
    /// Cache mode: the most disk the data may occupy (LMDB's pages in use in `data.mdb`),
    /// past which memkeep evicts instead of refusing writes; 0 keeps it a store (no eviction).
    #[serde(deserialize_with = "de_size")]
    pub max_disk: u64,
    /// String values of at least this many bytes are stored only in the write-ahead log, with
    /// a pointer in LMDB (`storage/vlog.rs`); 0 (the default) stores every value in LMDB.
    #[serde(deserialize_with = "de_size")]
    pub value_log_min: u64,
    /// Password RESP clients must give (AUTH / HELLO AUTH); empty means none.
    pub requirepass: String,
    /// Start as a replica of this primary (`HOST:PORT`, its RESP port); empty: a primary.
    pub replica_of: String,
    /// Bytes of replication stream a primary keeps for replicas that reconnect (`PSYNC`).
    #[serde(deserialize_with = "de_size")]
    pub repl_backlog_size: u64,
    /// Redis's `replica-priority` (INFO `slave_priority`): Redis Sentinel promotes the replica
    /// with the lowest one, never one with 0. CONFIG SET changes it at run time.
    pub replica_priority: u32,
    /// Redis's `replica-announce-ip`: the address a replica gives its primary (which lists it
    /// in INFO, where Sentinel finds replicas) instead of its connection's source address;
    /// empty: that address.
    pub replica_announce_ip: String,
    /// Redis's `replica-announce-port`: the port a replica gives its primary instead of its
    /// `resp_port`; 0: `resp_port`.
    pub replica_announce_port: u16,
    /// Redis's `min-replicas-to-write`: a primary refuses writes (RESP `-NOREPLICAS`) while
    /// fewer than this many replicas have acknowledged within `min_replicas_max_lag` seconds;
    /// 0: never refuses. CONFIG SET changes it at run time.
    pub min_replicas_to_write: u32,
    /// Redis's `min-replicas-max-lag`, in seconds (see `min_replicas_to_write`).
    pub min_replicas_max_lag: u32,
    /// The config file the server was started with (`--config`), which CONFIG REWRITE
    /// updates; not a setting of the file itself.
    #[serde(skip)]
    pub config_file: Option<PathBuf>,
    /// Redis ACL users: a file of `user <name> <rules...>` lines (Redis's `aclfile`).
    pub aclfile: Option<PathBuf>,
    /// Close client connections that send nothing for this many seconds; 0 never does.
    pub idle_timeout: u64,
    /// memcached ASCII authentication (-Y): a file of `user:password` lines; none when absent.
    pub auth_file: Option<PathBuf>,
    /// Users of `auth_file` who may only read on the memcached port: their writes (text, meta
    /// and binary) are refused.
    pub auth_readonly: Vec<String>,
    /// When started as root, continue as this user once the ports are bound (-u).
    pub user: Option<String>,
    /// Where online backups (`db_compact`, `db_archive`, RESP `BGSAVE`) write their copy.
    pub backup_dir: PathBuf,
    /// Verbosity: 0 warnings, 1 info, 2 debug, 3 trace.
    pub verbosity: u8,
    /// RESP over TLS on this port, beside `resp_port` (Redis's `tls-port`); 0 disables it.
    pub tls_port: u16,
    /// The memcached port speaks TLS only (memcached's `-Z`).
    pub memcache_tls: bool,
    /// The server's certificate chain (PEM), for every TLS port.
    pub tls_cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM).
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) client certificates are verified against.
    pub tls_ca_cert_file: Option<PathBuf>,
    /// Client certificates: "yes" (required), "optional", "no"; unset: "yes" with a CA file,
    /// "no" without.
    pub tls_auth_clients: Option<TlsAuth>,
}

/// Whether TLS clients must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TlsAuth {
    Yes,
    Optional,
    No,
}

impl TlsAuth {
    pub fn name(self) -> &'static str {
        match self {
            TlsAuth::Yes => "yes",
            TlsAuth::Optional => "optional",
            TlsAuth::No => "no",
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            port: 11211,
            resp_port: 6380,
            listen: "127.0.0.1".to_string(),
            max_connections: 1024,
            threads: 0,
            io_threads: 16,
            spin_us: 50,
            max_item_size: 1024 * 1024,
            proto_max_bulk_len: 512 << 20,
            lua_time_limit: 5000,
            data_dir: PathBuf::from("./data"),
            sync: SyncMode::Always,
            sync_interval_ms: 1000,
            map_size: 64 << 30,
            max_batch: 1024,
            max_disk: 0,
            value_log_min: 0,
            requirepass: String::new(),
            replica_of: String::new(),
            repl_backlog_size: 16 << 20,
            replica_priority: 100,
            replica_announce_ip: String::new(),
            replica_announce_port: 0,
            min_replicas_to_write: 0,
            min_replicas_max_lag: 10,
            config_file: None,
            aclfile: None,
            idle_timeout: 0,
            auth_file: None,
            auth_readonly: Vec::new(),
            user: None,
            backup_dir: PathBuf::from("./backup"),
            verbosity: 0,
            tls_port: 0,
            memcache_tls: false,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_cert_file: None,
            tls_auth_clients: None,
        }
    }
}

/// Command-line flags. Every option is optional so that an absent flag leaves the config file's
/// (or the default) value in place.
#[derive(Debug, Parser)]
#[command(
    name = "memkeep",
    version,
    about = "A persistent memcached- and Redis-compatible cache on LMDB"
)]
pub struct Cli {
    /// TOML configuration file; flags given here override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// memcached text protocol TCP port (0 disables) [default: 11211]
    #[arg(short = 'p', long)]
    pub port: Option<u16>,
    /// Redis RESP TCP port (0 disables) [default: 6380]
    #[arg(long)]
    pub resp_port: Option<u16>,
    /// Listen address [default: 127.0.0.1]
    #[arg(short = 'l', long)]
    pub listen: Option<String>,
    /// Maximum simultaneous connections [default: 1024]
    #[arg(short = 'c', long)]
    pub max_connections: Option<usize>,
    /// Worker threads (0 = number of cores) [default: 0]
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Reader threads for values not in memory (0 = event loops read them) [default: 16]
    #[arg(long)]
    pub io_threads: Option<usize>,
    /// Microseconds an idle worker polls before sleeping, in never/periodic (0 = off) [default: 50]
    #[arg(long)]
    pub spin_us: Option<u64>,
    /// Maximum item size, e.g. 1m, 512k [default: 1m]
    #[arg(short = 'I', long, value_parser = parse_size)]
    pub max_item_size: Option<u64>,
    /// Longest RESP bulk string (Redis's proto-max-bulk-len), 1m to 1g [default: 512m]
    #[arg(long, value_parser = parse_size)]
    pub proto_max_bulk_len: Option<u64>,
    /// Milliseconds a script runs before other clients get -BUSY (0: never) [default: 5000]
    #[arg(long)]
    pub lua_time_limit: Option<u64>,
    /// Data directory (LMDB environment home) [default: ./data]
    #[arg(short = 'H', long)]
    pub data_dir: Option<PathBuf>,
    /// Sync mode [default: always]
    #[arg(long, value_enum)]
    pub sync: Option<SyncMode>,
    /// fsync interval in milliseconds for --sync periodic [default: 1000]
    #[arg(long)]
    pub sync_interval_ms: Option<u64>,
    /// Do not fsync commits: the same as --sync never (MemcacheDB's -N)
    #[arg(short = 'N', action = ArgAction::SetTrue)]
    pub no_sync: bool,
    /// LMDB map size, the store's capacity, e.g. 64g [default: 64g]
    #[arg(long, value_parser = parse_size)]
    pub map_size: Option<u64>,
    /// Most writes committed in one transaction [default: 1024]
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Cache mode: cap the disk the data uses (LMDB's pages in use in data.mdb, not the
    /// file's length, which never shrinks), e.g. 10g; past it memkeep evicts expired, then
    /// least recently used items instead of refusing writes [default: 0 = off, never evict]
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_disk: Option<u64>,
    /// Store string values of at least SIZE bytes only in the write-ahead log, with a pointer
    /// in LMDB, so each is written to disk once (e.g. 8k); a store that used it cannot be
    /// opened by a memkeep older than it. Segments holding values are kept until a later
    /// release collects them [default: 0 = off]
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub value_log_min: Option<u64>,
    /// Password RESP clients must send with AUTH before anything else
    #[arg(long)]
    pub requirepass: Option<String>,
    /// Replicate the primary at HOST:PORT (its RESP port) and refuse writes [default: none]
    #[arg(long, value_name = "HOST:PORT")]
    pub replica_of: Option<String>,
    /// Replication backlog a primary keeps for reconnecting replicas, e.g. 16m [default: 16m]
    #[arg(long, value_parser = parse_size)]
    pub repl_backlog_size: Option<u64>,
    /// Sentinel promotes the replica with the lowest priority, never 0 [default: 100]
    #[arg(long)]
    pub replica_priority: Option<u32>,
    /// Address a replica announces to its primary (Redis's replica-announce-ip) [default: its
    /// connection's source address]
    #[arg(long, value_name = "IP")]
    pub replica_announce_ip: Option<String>,
    /// Port a replica announces to its primary (Redis's replica-announce-port) [default: 0 =
    /// its RESP port]
    #[arg(long, value_name = "PORT")]
    pub replica_announce_port: Option<u16>,
    /// A primary refuses writes while fewer replicas than this acknowledged within
    /// --min-replicas-max-lag seconds (Redis's min-replicas-to-write) [default: 0 = never]
    #[arg(long)]
    pub min_replicas_to_write: Option<u32>,
    /// Seconds within which a replica must have acknowledged to count for
    /// --min-replicas-to-write [default: 10]
    #[arg(long)]
    pub min_replicas_max_lag: Option<u32>,
    /// Redis ACL users: a file of `user <name> <rules...>` lines (Redis's aclfile)
    #[arg(long, value_name = "FILE")]
    pub aclfile: Option<PathBuf>,
    /// memcached ASCII authentication: a file of user:password lines (memcached's -Y)
    #[arg(short = 'Y', long, value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// Users of the auth file who may only read on the memcached port (comma-separated)
    #[arg(long, value_name = "USER,...", value_delimiter = ',')]
    pub auth_readonly: Option<Vec<String>>,
    /// Close connections idle this many seconds (0 = never) [default: 0]
    #[arg(long)]
    pub idle_timeout: Option<u64>,
    /// Directory online backups (db_compact, db_archive, BGSAVE) write to [default: ./backup]
    #[arg(long)]
    pub backup_dir: Option<PathBuf>,
    /// RESP over TLS on this port, beside --resp-port (Redis's tls-port) [default: 0 = off]
    #[arg(long)]
    pub tls_port: Option<u16>,
    /// The memcached port speaks TLS only (memcached's -Z / --enable-ssl)
    #[arg(short = 'Z', long = "enable-ssl", action = ArgAction::SetTrue)]
    pub memcache_tls: bool,
    /// Server certificate chain, PEM (memcached's -o ssl_chain_cert=)
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The certificate's private key, PEM (memcached's -o ssl_key=)
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates client certificates are verified against, PEM (-o ssl_ca_cert=)
    #[arg(long, value_name = "FILE")]
    pub tls_ca_cert_file: Option<PathBuf>,
    /// Client certificates required (yes), optional, or never asked for (no) [default: yes
    /// with a CA file, no without]
    #[arg(long, value_enum)]
    pub tls_auth_clients: Option<TlsAuth>,
    /// memcached's extended options, comma-separated key=value: memkeep reads ssl_chain_cert,
    /// ssl_key, ssl_ca_cert and ssl_verify_mode (0 none, 1 optional, 2 and 3 required) and
    /// says at startup which others it ignores
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub extended: Vec<String>,
    /// Run in the background (MemcacheDB's and memcached's -d)
    #[arg(short = 'd', long, action = ArgAction::SetTrue)]
    pub daemon: bool,
    /// Write the process id to this file (MemcacheDB's and memcached's -P)
    #[arg(short = 'P', long, value_name = "FILE")]
    pub pid_file: Option<PathBuf>,
    /// MemcacheDB's map size in megabytes (its LMDB port's -m); the same as --map-size <N>m
    #[arg(short = 'm', value_name = "MB")]
    pub map_size_mb: Option<u64>,
    /// MemcacheDB's checkpoint interval in seconds (-C): with -N, fsync that often
    /// (--sync periodic)
    #[arg(short = 'C', value_name = "SECS")]
    pub checkpoint_secs: Option<u64>,
    /// When started as root, run as this user once the ports are bound (memcached's -u)
    #[arg(short = 'u', long, value_name = "USER")]
    pub user: Option<String>,
    // MemcacheDB options memkeep accepts and ignores (Berkeley DB tuning, replication); memkeep
    // says at startup why each one is ignored.
    #[arg(short = 'A', hide = true)]
    pub bdb_page_size: Option<String>,
    #[arg(short = 'B', hide = true)]
    pub bdb_type: Option<String>,
    #[arg(short = 'L', hide = true)]
    pub bdb_log_buffer: Option<String>,
    #[arg(short = 'T', hide = true)]
    pub bdb_trickle: Option<String>,
    #[arg(short = 'e', hide = true)]
    pub bdb_trickle_percent: Option<String>,
    #[arg(short = 'D', hide = true)]
    pub bdb_deadlock: Option<String>,
    #[arg(short = 'G', hide = true)]
    pub bdb_log_dir: Option<String>,
    #[arg(short = 'E', hide = true, action = ArgAction::SetTrue)]
    pub bdb_log_remove: bool,
    #[arg(short = 'X', hide = true, action = ArgAction::SetTrue)]
    pub bdb_private: bool,
    #[arg(short = 'b', hide = true)]
    pub item_buf_size: Option<String>,
    #[arg(short = 'f', hide = true)]
    pub bdb_file: Option<String>,
    #[arg(short = 'R', hide = true)]
    pub rep_local: Option<String>,
    #[arg(short = 'O', hide = true)]
    pub rep_remote: Option<String>,
    #[arg(short = 'M', hide = true, action = ArgAction::SetTrue)]
    pub rep_master: bool,
    #[arg(short = 'S', hide = true, action = ArgAction::SetTrue)]
    pub rep_slave: bool,
    #[arg(short = 'n', hide = true)]
    pub rep_sites: Option<String>,
    #[command(subcommand)]
    pub action: Option<Action>,
    /// Verbose logging; repeat for more (-vv)
    #[arg(short = 'v', action = ArgAction::Count)]
    pub verbose: u8,
    /// Test only: run on a frozen manual clock starting at this unix time in milliseconds,
    /// moved by the `debug_advance_clock <seconds>` command.
    #[arg(long, hide = true, value_name = "UNIX_MS")]
    pub debug_clock: Option<u64>,
}

/// What to do instead of serving.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Action {
    /// Copy the store (consistent, compacted) into DEST while the server may keep running.
    Backup {
        /// Directory to create the copy in (it must not already hold a data.mdb).
        dest: PathBuf,
    },
    /// Write every string item as memcached `set` commands (replayable into any memcached).
    Export {
        /// File to write; standard output when absent.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
    },
    /// Send a dump of `set` commands (an export, or memcdump+memccat output turned into `set`s)
    /// to the server at --listen/--port, counting what it stored; or, with --rdb, load a Redis
    /// RDB file into the server at --listen/--resp-port.
    Import {
        /// The dump; standard input when `-`.
        #[arg(required_unless_present = "rdb", conflicts_with = "rdb")]
        file: Option<PathBuf>,
        /// A Redis RDB file (dump.rdb, `redis-cli --rdb`; RDB versions up to 11, Redis 7.2) to load through
        /// the RESP port: checked whole first, then sent as RESTORE commands.
        #[arg(long, value_name = "FILE")]
        rdb: Option<PathBuf>,
        /// With --rdb: the Redis database whose keys are loaded (memkeep has one); keys of
        /// the others are counted and skipped [default: 0]
        #[arg(long, value_name = "N", requires = "rdb")]
        db: Option<u64>,
    },
    /// Verify a stopped store without changing it: the checkpoint, the log, every record.
    /// Exits 0 when healthy, 1 when damaged (one line per problem), 2 when it cannot check.
    Check {
        /// The data directory; the configured one (-H / data_dir) when absent.
        data_dir: Option<PathBuf>,
    },
}

impl Cli {
    /// MemcacheDB options given on the command line that memkeep ignores, each with why.
    pub fn ignored(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut note = |given: bool, flag: &str, why: &str| {
            if given {
                v.push(format!("ignoring {flag}: {why}"));
            }
        };
        let bdb = "a Berkeley DB setting; LMDB needs no such tuning";
        note(self.bdb_page_size.is_some(), "-A", bdb);
        note(self.bdb_type.is_some(), "-B", bdb);
        note(self.bdb_log_buffer.is_some(), "-L", bdb);
        note(self.bdb_trickle.is_some(), "-T", bdb);
        note(self.bdb_trickle_percent.is_some(), "-e", bdb);
        note(self.bdb_deadlock.is_some(), "-D", bdb);
        note(
            self.bdb_log_dir.is_some(),
            "-G",
            "LMDB keeps no separate log files",
        );
        note(
            self.bdb_log_remove,
            "-E",
            "LMDB keeps no log files to remove",
        );
        note(self.bdb_private, "-X", bdb);
        note(
            self.item_buf_size.is_some(),
            "-b",
            "memkeep has no item allocator to tune",
        );
        note(
            self.bdb_file.is_some(),
            "-f",
            "the data file is always <data_dir>/data.mdb",
        );
        let rep =
            "memkeep has no replication; put twemproxy in front of several servers to scale out";
        note(self.rep_local.is_some(), "-R", rep);
        note(self.rep_remote.is_some(), "-O", rep);
        note(self.rep_master, "-M", rep);
        note(self.rep_slave, "-S", rep);
        note(self.rep_sites.is_some(), "-n", rep);
        for opts in &self.extended {
            for opt in opts.split(',').filter(|o| !o.is_empty()) {
                let k = opt.split_once('=').map_or(opt, |(k, _)| k);
                if !matches!(
                    k,
                    "ssl_chain_cert" | "ssl_key" | "ssl_ca_cert" | "ssl_verify_mode"
                ) {
                    v.push(format!(
                        "ignoring -o {k}: memcached tuning that does not apply to memkeep"
                    ));
                }
            }
        }
        v
    }
}

#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads a TOML config file; unknown keys are errors so typos are caught.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config file {}: {e}", path.display())))?;
        Config::from_toml(&text)
            .map_err(|e| ConfigError(format!("config file {}: {}", path.display(), e.0)))
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError(e.message().to_string()))
    }

    /// Defaults, then the config file if one is named, then the flags.
    pub fn from_cli(cli: &Cli) -> Result<Config, ConfigError> {
        let mut c = match &cli.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        // Absolute, so CONFIG REWRITE finds it whatever the working directory becomes.
        c.config_file = cli
            .config
            .as_ref()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()));
        macro_rules! take {
            ($($field:ident),*) => { $( if let Some(v) = &cli.$field { c.$field = v.clone(); } )* };
        }
        take!(
            port,
            resp_port,
            listen,
            max_connections,
            threads,
            io_threads,
            spin_us,
            max_item_size,
            proto_max_bulk_len,
            lua_time_limit,
            data_dir,
            sync,
            sync_interval_ms,
            map_size,
            max_batch,
            max_disk,
            value_log_min,
            requirepass,
            replica_of,
            repl_backlog_size,
            replica_priority,
            replica_announce_ip,
            replica_announce_port,
            min_replicas_to_write,
            min_replicas_max_lag,
            idle_timeout,
            backup_dir,
            tls_port
        );
        if cli.memcache_tls {
            c.memcache_tls = true;
        }
        for (flag, field) in [
            (&cli.tls_cert_file, &mut c.tls_cert_file),
            (&cli.tls_key_file, &mut c.tls_key_file),
            (&cli.tls_ca_cert_file, &mut c.tls_ca_cert_file),
        ] {
            if let Some(f) = flag {
                *field = Some(f.clone());
            }
        }
        if let Some(a) = cli.tls_auth_clients {
            c.tls_auth_clients = Some(a);
        }
        for opts in &cli.extended {
            for opt in opts.split(',').filter(|o| !o.is_empty()) {
                let (k, v) = opt.split_once('=').unwrap_or((opt, ""));
                match k {
                    "ssl_chain_cert" => c.tls_cert_file = Some(PathBuf::from(v)),
                    "ssl_key" => c.tls_key_file = Some(PathBuf::from(v)),
                    "ssl_ca_cert" => c.tls_ca_cert_file = Some(PathBuf::from(v)),
                    "ssl_verify_mode" => {
                        c.tls_auth_clients = Some(match v {
                            "0" => TlsAuth::No,
                            "1" => TlsAuth::Optional,
                            "2" | "3" => TlsAuth::Yes,
                            _ => {
                                return Err(ConfigError(format!(
                                    "-o ssl_verify_mode={v}: expected 0, 1, 2 or 3"
                                )));
                            }
                        })
                    }
                    _ => {}
                }
            }
        }
        if let Some(f) = &cli.auth_file {
            c.auth_file = Some(f.clone());
        }
        if let Some(u) = &cli.auth_readonly {
            c.auth_readonly = u.clone();
        }
        if let Some(f) = &cli.aclfile {
            c.aclfile = Some(f.clone());
        }
        if let Some(u) = &cli.user {
            c.user = Some(u.clone());
        }
        if let Some(mb) = cli.map_size_mb {
            c.map_size = mb.saturating_mul(1 << 20);
        }
        if let Some(secs) = cli.checkpoint_secs
            && secs > 0
        {
            c.sync_interval_ms = secs.saturating_mul(1000);
            if cli.no_sync {
                // MemcacheDB: -N with a checkpoint every -C seconds.
                c.sync = SyncMode::Periodic;
            }
        }
        if cli.no_sync && cli.checkpoint_secs.unwrap_or(0) == 0 {
            c.sync = SyncMode::Never;
        }
        if cli.verbose > 0 {
            c.verbosity = cli.verbose;
        }
        c.validate()?;
        Ok(c)
    }

    /// `replica_of` as host and port (None: a primary).
    pub fn replica_target(&self) -> Option<(String, u16)> {
        let (host, port) = self.replica_of.trim().rsplit_once(':')?;
        let port = port.parse::<u16>().ok().filter(|&p| p != 0)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        (!host.is_empty()).then(|| (host.to_string(), port))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: &str| Err(ConfigError(m.to_string()));
        if !self.replica_of.trim().is_empty() && self.replica_target().is_none() {
            return err("replica_of must be HOST:PORT");
        }
        if self.max_connections == 0 {
            return err("max_connections must be at least 1");
        }
        if self.max_item_size == 0 || self.max_item_size > 1 << 30 {
            return err("max_item_size must be between 1 byte and 1g");
        }
        if !(1 << 20..=1 << 30).contains(&self.proto_max_bulk_len) {
            return err("proto_max_bulk_len must be between 1m and 1g");
        }
        if self.map_size < 1 << 20 {
            return err("map_size must be at least 1m");
        }
        if self.max_item_size.saturating_mul(2) > self.map_size {
            return err("map_size must be at least twice max_item_size");
        }
        if self.max_batch == 0 {
            return err("max_batch must be at least 1");
        }
        if self.io_threads > 256 {
            return err("io_threads must be at most 256");
        }
        if self.spin_us > 1000 {
            return err("spin_us must be at most 1000");
        }
        if self.max_disk != 0 && self.max_disk < 1 << 20 {
            return err("max_disk must be at least 1m (or 0 for no cap)");
        }
        if self.value_log_min != 0 && !(256..=(1 << 30)).contains(&self.value_log_min) {
            return err("value_log_min must be 0 (off) or 256 bytes to 1g");
        }
        if self.value_log_min != 0 && self.max_disk != 0 {
            // The cap counts LMDB's pages; values in the log would pass it unseen.
            return err("value_log_min cannot be combined with max_disk yet");
        }
        if self.max_disk > self.map_size {
            return err("max_disk must not exceed map_size (the map is the store's hard limit)");
        }
        if self.sync == SyncMode::Periodic && self.sync_interval_ms == 0 {
            return err("sync_interval_ms must be at least 1 with sync = periodic");
        }
        if !self.auth_readonly.is_empty() && self.auth_file.is_none() {
            return err("auth_readonly names users of auth_file, and no auth_file is given");
        }
        if self.port == 0 && self.resp_port == 0 {
            return err("both ports are disabled: nothing to serve");
        }
        if self.port != 0 && self.port == self.resp_port {
            return err("port and resp_port must differ");
        }
        if self.tls_port != 0 && (self.tls_port == self.port || self.tls_port == self.resp_port) {
            return err("tls_port must differ from port and resp_port");
        }
        if self.memcache_tls && self.port == 0 {
            return err("memcache_tls (-Z) needs the memcached port");
        }
        Ok(())
    }

    /// The client-certificate policy in force (`tls_auth_clients`, or its default).
    pub fn tls_auth(&self) -> TlsAuth {
        self.tls_auth_clients
            .unwrap_or(if self.tls_ca_cert_file.is_some() {
                TlsAuth::Yes
            } else {
                TlsAuth::No
            })
    }

    /// Worker threads to start.
    pub fn worker_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }
    }
}

/// Parses a byte size: a decimal number with an optional k/m/g suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, mult) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| {
            format!("invalid size '{s}': expected a number with an optional k, m or g suffix")
        })
}

fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Num(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Num(n) => Ok(n),
        Size::Text(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_file_equals_builtin_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/memkeep.toml");
        let from_file = Config::from_file(&path).expect("conf/memkeep.toml parses");
        assert_eq!(from_file, Config::default());
        // Every field must be spelled out in the example file, not left to the default.
        let text = std::fs::read_to_string(&path).expect("read");
        for key in [
            "port",
            "resp_port",
            "listen",
            "max_connections",
            "threads",
            "io_threads",
            "spin_us",
            "max_item_size",
            "proto_max_bulk_len",
            "lua_time_limit",
            "data_dir",
            "sync",
            "sync_interval_ms",
            "map_size",
            "max_batch",
            "max_disk",
            "value_log_min",
            "requirepass",
            "replica_of",
            "repl_backlog_size",
            "replica_priority",
            "replica_announce_ip",
            "replica_announce_port",
            "min_replicas_to_write",
            "min_replicas_max_lag",
            "backup_dir",
            "idle_timeout",
            "verbosity",
            "tls_port",
            "memcache_tls",
        ] {
            assert!(
                text.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{key} ="))),
                "conf/memkeep.toml does not list {key}"
            );
        }
    }

    #[test]
    fn flags_override_file_and_n_means_never() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("m.toml");
        std::fs::write(
            &file,
            "port = 2000\nsync = \"periodic\"\nmax_item_size = \"2m\"\n",
        )
        .expect("write");
        let cli = Cli::parse_from([
            "memkeep",
            "--config",
            file.to_str().expect("utf8"),
            "-p",
            "3000",
            "-N",
        ]);
        let c = Config::from_cli(&cli).expect("valid");
        assert_eq!(c.port, 3000);
        assert_eq!(c.sync, SyncMode::Never);
        assert_eq!(c.max_item_size, 2 << 20);
    }

    #[test]
    fn max_disk_takes_a_size_and_is_checked() {
        let cli = Cli::parse_from(["memkeep", "--max-disk", "256m"]);
        assert_eq!(Config::from_cli(&cli).expect("valid").max_disk, 256 << 20);
        let c = Config::from_toml("max_disk = \"2g\"\n").expect("file");
        assert_eq!(c.max_disk, 2 << 30);
        assert_eq!(Config::default().max_disk, 0, "off by default");
        let cli = Cli::parse_from(["memkeep", "--max-disk", "100k"]);
        assert!(Config::from_cli(&cli).is_err(), "below 1m");
        let cli = Cli::parse_from(["memkeep", "--max-disk", "2g", "--map-size", "1g"]);
        assert!(Config::from_cli(&cli).is_err(), "past the map");
    }

    #[test]
    fn unknown_key_in_file_is_an_error() {
        let e = Config::from_toml("prot = 1\n").expect_err("typo must fail");
        assert!(e.0.contains("prot"), "{}", e.0);
    }

    #[test]
    fn sizes_take_suffixes() {
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("1x").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn invalid_values_are_rejected() {
        let cli = Cli::parse_from(["memkeep", "-c", "0"]);
        assert!(Config::from_cli(&cli).is_err());
        let cli = Cli::parse_from(["memkeep", "-p", "7000", "--resp-port", "7000"]);
        assert!(Config::from_cli(&cli).is_err());
        let cli = Cli::parse_from(["memkeep", "--spin-us", "1001"]);
        assert!(Config::from_cli(&cli).is_err());
        let cli = Cli::parse_from(["memkeep", "--spin-us", "0"]);
        assert_eq!(Config::from_cli(&cli).map(|c| c.spin_us).ok(), Some(0));
    }
}
