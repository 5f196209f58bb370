//! The server: listeners and the acceptor on the main thread, worker threads each running an
//! event loop, and the writer thread. Shutdown (SIGINT/SIGTERM) stops accepting, lets workers
//! finish what is in flight, lets the writer commit and sync, then closes the environment;
//! SIGHUP reloads the TLS certificates (`tls`). A TLS listener's connections carry a rustls
//! session in their `Conn` (`conn.rs` runs the records over the socket); RESP users and their
//! permissions are `acl`'s, checked once per request in `resp::check`.
//!
//! Per protocol: `memcache`, `meta` and `binary` run the memcached port's requests; `resp` is a
//! RESP connection's session and loop (dispatch, MULTI, the writer hand-off), `admin` the RESP
//! commands that need a session or the server's state (CLIENT, CONFIG, INFO, AUTH, HELLO,
//! WATCH, pub/sub), over the socket-free command layer in `crate::commands`. `worker` is the
//! event loop, `conn` a connection's buffers, `pubsub` and `clients` the cross-thread
//! registries, `cold` the reader pool for values not in memory, `stats` the counters.

pub mod acl;
pub mod admin;
pub mod binary;
pub mod clients;
pub mod cold;
pub mod conn;
pub mod dump;
pub mod encodings;
pub mod memcache;
pub mod meta;
pub mod pubsub;
pub mod repl;
pub mod resp;
pub mod stats;
pub mod tls;
pub mod uring;
pub mod worker;

use std::io::{self, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use log::{error, info, warn};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};

use self::conn::Proto;
use self::stats::{Counters, Gauges};
use self::worker::{WAKER, Worker, WorkerHandle};
use crate::clock::Clock;
use crate::config::Config;
use crate::engine::writer::{FlushAt, Mailbox, Writer, WriterConfig};
use crate::storage::lmdb::LmdbStore;

/// State every thread reads.
pub struct Shared {
    pub config: Config,
    pub clock: Arc<Clock>,
    pub store: LmdbStore,
    pub flush_at: FlushAt,
    /// Checkpoint figures, and where `db_checkpoint` asks for one.
    pub checkpoints: Arc<crate::storage::durable::CheckpointStats>,
    /// One per worker.
    /// Per worker: INFO commandstats and errorstats.
    pub command_stats: Vec<stats::CommandStats>,
    pub counters: Vec<Counters>,
    /// Keyspace hits and misses of the reads the writer ran for connections (`WriteOp::Read`).
    pub writer_hits: Arc<crate::commands::ReadHits>,
    /// INFO replication's `master_replid`: made at start, as Redis does.
    pub replid: String,
    /// Replication: the backlog's hub, the receiver, the replicas connected (`repl.rs`).
    pub repl: repl::Repl,
    pub gauges: Gauges,
    pub started: Instant,
    pub shutdown: AtomicBool,
    /// Client ids for RESP `CLIENT ID` / `HELLO`.
    pub next_client_id: AtomicU64,
    pub scan_cursors: Arc<Mutex<crate::commands::ScanCursors>>,
    /// The keys RESP connections WATCH (shared with the writer, which moves their versions).
    pub watches: Arc<crate::storage::watch::Watches>,
    pub backups: Arc<crate::backup::Backups>,
    /// memcached ASCII authentication: user -> password, from `auth_file` (-Y).
    pub mc_auth: Option<std::collections::HashMap<Vec<u8>, Vec<u8>>>,
    /// Users of `mc_auth` who may only read (`auth_readonly`).
    pub mc_readonly: std::collections::HashSet<Vec<u8>>,
    /// Redis pub/sub channels and patterns, and each worker's outbox of messages.
    pub pubsub: Arc<pubsub::PubSub>,
    /// CLIENT PAUSE.
    pub pause: Pause,
    /// Every RESP client (CLIENT LIST, CLIENT KILL).
    pub clients: clients::Clients,
    /// Each worker's mailbox (to wake them all: CLIENT UNPAUSE).
    pub mailboxes: Vec<Arc<Mailbox<worker::Tag>>>,
    /// Clients blocked in a blocking pop (shared with the writer, which serves them).
    pub blocking: Arc<crate::engine::blocking::Blocking<worker::Tag>>,
    /// Reader threads for values not in memory; none with `io_threads = 0`.
    pub cold: Option<cold::ColdPool>,
    /// Cache mode's figures (evictions; all zero when `max_disk` is off).
    pub cache: Arc<crate::storage::cache::CacheStats>,
    /// The TLS configuration, when a port speaks TLS (`tls_port`, `memcache_tls`).
    pub tls: Option<Arc<tls::TlsContext>>,
    /// RESP users (`requirepass`, `aclfile`, ACL SETUSER).
    pub acl: Arc<acl::Acl>,
    /// memcached's per-prefix statistics (`stats detail`).
    pub prefixes: stats::Prefixes,
    /// The Lua script cache and the running script's state (shared with the writer thread).
    pub scripts: Arc<crate::scripting::Scripts>,
    /// Redis's encoding thresholds, as CONFIG SET last set them (they change nothing here).
    pub encodings: encodings::Encodings,
}

/// CLIENT PAUSE's state: until when (ms since `origin`, 0 = not paused) and whether it holds
/// every command or only writes. Checked with one atomic load per request while not paused.
#[derive(Debug)]
pub struct Pause {
    origin: Instant,
    until_ms: AtomicU64,
    all: AtomicBool,
}

impl Default for Pause {
    fn default() -> Pause {
        Pause {
            origin: Instant::now(),
            until_ms: AtomicU64::new(0),
            all: AtomicBool::new(false),
        }
    }
}

impl Pause {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64 + 1
    }

    /// Pauses for `ms`: the pause ends at the latest end asked for, and holds the most that
    /// any pause still running asked for (ALL over WRITE), as in Redis.
    pub fn pause(&self, ms: u64, all: bool) {
        let end = self.now_ms().saturating_add(ms);
        let running = self.active();
        if all || !running {
            self.all.store(
                all || (running && self.all.load(Ordering::Acquire)),
                Ordering::Release,
            );
        }
        self.until_ms.fetch_max(end, Ordering::AcqRel);
        if !running {
            self.until_ms.store(end, Ordering::Release);
        }
    }

    pub fn unpause(&self) {
        self.until_ms.store(0, Ordering::Release);
    }

    pub fn active(&self) -> bool {
        let until = self.until_ms.load(Ordering::Acquire);
        if until == 0 {
            return false;
        }
        if self.now_ms() < until {
            return true;
        }
        // Over: later checks are one load again.
        let _ = self
            .until_ms
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Acquire);
        false
    }

    /// While paused: whether every command waits (else only writes).
    pub fn mode(&self) -> Option<bool> {
        self.active().then(|| self.all.load(Ordering::Acquire))
    }

    /// Whether a request is held back now: any under ALL, a write (`write`) under WRITE.
    pub fn holds(&self, write: bool) -> bool {
        self.mode().is_some_and(|all| all || write)
    }

    /// When the running pause ends.
    pub fn ends(&self) -> Option<Instant> {
        let until = self.until_ms.load(Ordering::Acquire);
        (until != 0).then(|| self.origin + Duration::from_millis(until - 1))
    }
}

/// A startup failure, one line for the operator.
#[derive(Debug)]
pub struct ServerError(pub String);

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ServerError {}

const MC_LISTENER: Token = Token(0);
const RESP_LISTENER: Token = Token(1);
const TLS_LISTENER: Token = Token(3);

fn bind(listen: &str, port: u16) -> Result<TcpListener, ServerError> {
    let addr: SocketAddr = (listen, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ServerError(format!("cannot resolve listen address '{listen}'")))?;
    TcpListener::bind(addr).map_err(|e| ServerError(format!("cannot listen on {addr}: {e}")))
}

/// memcached's and MemcacheDB's `-u`: once the ports are bound and the store is open, a server
/// started as root continues as `user`. Started as anyone else, it keeps its identity.
fn drop_privileges(user: &str) -> Result<(), ServerError> {
    // Safety: plain libc calls; getpwnam's result is read before any other call that could
    // overwrite it, and no other thread runs yet.
    unsafe {
        if libc::geteuid() != 0 {
            warn!("ignoring -u {user}: memkeep was not started as root");
            return Ok(());
        }
        let name = std::ffi::CString::new(user)
            .map_err(|_| ServerError(format!("bad user name '{user}'")))?;
        let pw = libc::getpwnam(name.as_ptr());
        if pw.is_null() {
            return Err(ServerError(format!("no such user '{user}'")));
        }
        let (uid, gid) = ((*pw).pw_uid, (*pw).pw_gid);
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(gid) != 0
            || libc::setuid(uid) != 0
        {
            return Err(ServerError(format!(
                "cannot switch to user '{user}': {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    info!("running as user {user}");
    Ok(())
}

/// Reads memcached's `-Y` file: one `user:password` per line.
fn load_auth_file(
    path: &std::path::Path,
) -> Result<std::collections::HashMap<Vec<u8>, Vec<u8>>, ServerError> {
    let text = std::fs::read(path)
        .map_err(|e| ServerError(format!("cannot read auth file {}: {e}", path.display())))?;
    let mut users = std::collections::HashMap::new();
    for l in text.split(|&b| b == b'\n') {
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        if l.is_empty() {
            continue;
        }
        let Some(c) = l.iter().position(|&b| b == b':') else {
            return Err(ServerError(format!(
                "auth file {}: a line without `user:password`",
                path.display()
            )));
        };
        users.insert(l[..c].to_vec(), l[c + 1..].to_vec());
    }
    if users.is_empty() {
        return Err(ServerError(format!(
            "auth file {} holds no user",
            path.display()
        )));
    }
    Ok(users)
}

fn is_loopback(listen: &str) -> bool {
    (listen, 0u16)
        .to_socket_addrs()
        .map(|mut a| a.all(|s| s.ip().is_loopback()))
        .unwrap_or(false)
}

/// Opens the store, binds the ports and serves until SIGINT or SIGTERM.
pub fn run(config: Config, clock: Clock) -> Result<(), ServerError> {
    let clock = Arc::new(clock);
    let threads = config.worker_threads();
    let mut durable = crate::storage::durable::open(
        &config.data_dir,
        config.map_size,
        // Worker passes and the transactions each keeps open for its reads in flight
        // (`uring.rs`), reader threads, the checkpoint pins (two while one is replaced), backups.
        (threads as u32 * (1 + uring::TXNS_MAX as u32) + config.io_threads as u32 + 8).max(126),
    )
    .map_err(|e| ServerError(e.0))?;
    // Before any clone of the store is made: memcached's `h`/`l` come from here (`hits.rs`).
    durable
        .store
        .set_hits(Some(Arc::new(crate::storage::hits::Hits::new(
            clock.clone(),
        ))));
    // Before any clone of the store is made: the writer's and the readers' clones carry it.
    durable
        .store
        .enable_separation(usize::try_from(config.value_log_min).unwrap_or(usize::MAX))
        .map_err(|e| ServerError(format!("cannot turn value_log_min on: {e}")))?;
    if config.max_disk > 0 {
        // Before any clone of the store is made: every reader notes its hits here.
        durable
            .store
            .set_access(Some(Arc::new(crate::storage::cache::Access::new())));
        if config.max_disk > config.map_size / 4 * 3 {
            warn!(
                "max_disk ({}) is close to map_size ({}): LMDB's free pages count against the map, so writes may fail as out of memory before the cap evicts",
                config.max_disk, config.map_size
            );
        }
    }
    // Before the ports are bound: a client can connect as soon as they are (the kernel
    // queues it), and must never see the server killed by a SIGTERM that arrived before the
    // handlers were in place.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| ServerError(format!("cannot install signal handlers: {e}")))?;
    let mut mc_listener = if config.port != 0 {
        Some(bind(&config.listen, config.port)?)
    } else {
        None
    };
    let mut resp_listener = if config.resp_port != 0 {
        Some(bind(&config.listen, config.resp_port)?)
    } else {
        None
    };
    let mut tls_listener = if config.tls_port != 0 {
        Some(bind(&config.listen, config.tls_port)?)
    } else {
        None
    };
    // Read while memkeep may still be root (a key file is often readable by root only).
    let tls = tls::TlsContext::from_config(&config).map_err(ServerError)?;
    let acl = acl::Acl::new(&config.requirepass, config.aclfile.as_deref()).map_err(ServerError)?;
    // The reader threads' descriptor of the data file, opened while memkeep may still be root.
    let cold_file = match config.io_threads {
        0 => None,
        _ => Some(cold::ColdPool::open_file(&config.data_dir).map_err(|e| {
            ServerError(format!(
                "cannot open {} for the reader threads: {e}",
                config.data_dir.join("data.mdb").display()
            ))
        })?),
    };
    let cold_direct = match cold_file {
        Some(_) => cold::ColdPool::open_direct(&config.data_dir),
        None => None,
    };
    if let Some(user) = &config.user {
        drop_privileges(user)?;
    }

    let mut acceptor = Poll::new().map_err(|e| ServerError(format!("cannot create poll: {e}")))?;
    let accept_waker = Arc::new(
        Waker::new(acceptor.registry(), WAKER)
            .map_err(|e| ServerError(format!("cannot create waker: {e}")))?,
    );
    for (l, token) in [
        (mc_listener.as_mut(), MC_LISTENER),
        (resp_listener.as_mut(), RESP_LISTENER),
        (tls_listener.as_mut(), TLS_LISTENER),
    ] {
        if let Some(l) = l {
            acceptor
                .registry()
                .register(l, token, Interest::READABLE)
                .map_err(|e| ServerError(format!("cannot register listener: {e}")))?;
        }
    }

    let mc_auth = match &config.auth_file {
        Some(path) => Some(load_auth_file(path)?),
        None => None,
    };
    let mut mc_readonly = std::collections::HashSet::new();
    for user in &config.auth_readonly {
        let known = mc_auth
            .as_ref()
            .is_some_and(|users| users.contains_key(user.as_bytes()));
        if !known {
            return Err(ServerError(format!(
                "auth_readonly names {user:?}, who is not a user of the auth file"
            )));
        }
        mc_readonly.insert(user.as_bytes().to_vec());
    }
    // Workers: a Poll each, whose Waker both the acceptor, the writer and
    // publishers on other workers use.
    let mut polls = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..threads {
        let poll = Poll::new().map_err(|e| ServerError(format!("cannot create poll: {e}")))?;
        let waker = Waker::new(poll.registry(), WAKER)
            .map_err(|e| ServerError(format!("cannot create waker: {e}")))?;
        handles.push(Arc::new(WorkerHandle {
            mailbox: Arc::new(Mailbox::new(waker)),
            incoming: Mutex::new(Vec::new()),
            warmed: Mutex::new(Vec::new()),
        }));
        polls.push(poll);
    }
    let wakers = handles
        .iter()
        .map(|h| {
            let mailbox = h.mailbox.clone();
            Box::new(move || mailbox.wake()) as Box<dyn Fn() + Send + Sync>
        })
        .collect();
    let cold = match cold_file {
        None => None,
        Some(file) => Some(
            cold::ColdPool::start(
                durable.store.clone(),
                file,
                cold_direct,
                config.io_threads,
                handles.clone(),
            )
            .map_err(|e| ServerError(format!("cannot start reader threads: {e}")))?,
        ),
    };
    let shared = Arc::new(Shared {
        cold,
        pubsub: Arc::new(pubsub::PubSub::new(wakers)),
        pause: Pause::default(),
        clients: clients::Clients::new(threads),
        mailboxes: handles.iter().map(|h| h.mailbox.clone()).collect(),
        blocking: Arc::new(crate::engine::blocking::Blocking::new(
            handles.iter().map(|h| h.mailbox.clone()).collect(),
        )),
        clock,
        store: durable.store.clone(),
        flush_at: Arc::new(AtomicU64::new(0)),
        checkpoints: durable.checkpointer.stats.clone(),
        counters: (0..threads).map(|_| Counters::default()).collect(),
        writer_hits: Arc::default(),
        replid: replication_id(),
        repl: repl::Repl::new(threads, &config)
            .map_err(|e| ServerError(format!("cannot set up replication: {e}")))?,
        command_stats: (0..threads)
            .map(|_| stats::CommandStats::new(resp::stat_slots()))
            .collect(),
        gauges: Gauges::default(),
        started: Instant::now(),
        shutdown: AtomicBool::new(false),
        next_client_id: AtomicU64::new(0),
        scan_cursors: Arc::new(Mutex::new(crate::commands::ScanCursors::default())),
        watches: Arc::default(),
        backups: Arc::new(crate::backup::Backups::default()),
        mc_auth,
        mc_readonly,
        cache: Arc::default(),
        tls,
        acl: Arc::new(acl),
        prefixes: stats::Prefixes::default(),
        scripts: Arc::new(crate::scripting::Scripts::new(config.lua_time_limit)),
        encodings: encodings::Encodings::default(),
        config,
    });
    // PUBLISH from scripts: the writer thread reaches the subscribers' workers as a worker's
    // PUBLISH does (their outboxes and wakers).
    let registry = shared.pubsub.clone();
    shared
        .scripts
        .set_publisher(Arc::new(move |channel: &[u8], message: &[u8]| {
            registry.publish(channel, message, None, &mut Vec::new())
        }));
    // INFO, LASTSAVE and PUBSUB from scripts, answered on the writer thread.
    let weak = Arc::downgrade(&shared);
    shared.scripts.set_server_read(Arc::new(
        move |cmd: crate::commands::Cmd,
              args: crate::commands::Args<'_>,
              out: &mut Vec<u8>,
              v3,
              keyspace| {
            match weak.upgrade() {
                Some(shared) => admin::script_read(cmd, args, out, v3, keyspace, &shared),
                None => crate::protocol::resp::enc::error(out, "ERR server shutting down"),
            }
        },
    ));
    let cfg = &shared.config;
    let unauthenticated =
        (cfg.port != 0 && cfg.auth_file.is_none()) || (cfg.resp_port != 0 && shared.acl.open());
    if !is_loopback(&cfg.listen) && unauthenticated {
        warn!(
            "listening on {} beyond loopback without authentication: anyone who can reach it can read and change every item",
            cfg.listen
        );
    }

    let writer = Writer::new(
        durable,
        shared.clock.clone(),
        WriterConfig {
            sync: cfg.sync,
            sync_interval: Duration::from_millis(cfg.sync_interval_ms),
            max_batch: cfg.max_batch,
            item_size_max: cfg.max_item_size as usize,
            max_disk: cfg.max_disk,
        },
        shared.flush_at.clone(),
        handles
            .iter()
            .map(|h| h.mailbox.clone())
            .chain([shared.repl.mailbox.clone()])
            .collect(),
    )
    .map_err(|e| ServerError(format!("cannot start the writer: {e}")))?
    .with_watches(shared.watches.clone())
    .with_blocking(shared.blocking.clone())
    .with_cache(shared.cache.clone())
    .map_err(|e| ServerError(format!("cannot start the writer: {e}")))?;
    let (writer, hub) = writer.with_repl(shared.replid.clone(), cfg.repl_backlog_size);
    shared.repl.set_hub(hub);
    let (gate, writer_thread) = writer
        .start()
        .map_err(|e| ServerError(format!("cannot start writer thread: {e}")))?;
    shared.repl.set_gate(gate.clone());
    shared.repl.set_shared(Arc::downgrade(&shared));
    if let Some((host, port)) = cfg.replica_target() {
        repl::replicate_from(&shared, host, port, true).map_err(ServerError)?;
    }
    let mut worker_threads = Vec::new();
    for (id, poll) in polls.into_iter().enumerate() {
        let w = Worker::new(id, poll, shared.clone(), handles[id].clone(), gate.clone());
        worker_threads.push(
            thread::Builder::new()
                .name(format!("memkeep-worker-{id}"))
                .spawn(move || w.run())
                .map_err(|e| ServerError(format!("cannot start worker thread: {e}")))?,
        );
    }
    drop(gate);

    let stop = Arc::new(AtomicBool::new(false));
    let signals_handle = signals.handle();
    {
        let stop = stop.clone();
        let waker = accept_waker.clone();
        let tls = shared.tls.clone();
        thread::Builder::new()
            .name("memkeep-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    if sig == signal_hook::consts::SIGHUP {
                        // SIGHUP reloads the TLS certificates, and does nothing else.
                        match &tls {
                            Some(t) => match t.reload() {
                                Ok(()) => info!("SIGHUP: TLS certificates reloaded"),
                                Err(e) => {
                                    error!("SIGHUP: TLS certificates not reloaded, the old ones stay: {e}")
                                }
                            },
                            None => info!("SIGHUP ignored: no TLS to reload"),
                        }
                        continue;
                    }
                    info!("signal {sig} received: shutting down");
                    stop.store(true, Ordering::Release);
                    let _ = waker.wake();
                    break;
                }
            })
            .map_err(|e| ServerError(format!("cannot start signal thread: {e}")))?;
    }

    info!(
        "memkeep {} serving memcached on {}:{} and RESP on port {} with {} worker threads, data in {}, sync {}{}{}",
        env!("CARGO_PKG_VERSION"),
        cfg.listen,
        cfg.port,
        cfg.resp_port,
        threads,
        cfg.data_dir.display(),
        cfg.sync,
        if cfg.sync == crate::config::SyncMode::Periodic {
            format!(" every {} ms", cfg.sync_interval_ms)
        } else {
            String::new()
        },
        if cfg.max_disk > 0 {
            format!(", cache mode: evicting past {} bytes on disk", cfg.max_disk)
        } else {
            String::new()
        },
    );
    if shared.tls.is_some() {
        info!(
            "TLS{}{}, client certificates: {}",
            if cfg.tls_port != 0 {
                format!(" (RESP) on port {}", cfg.tls_port)
            } else {
                String::new()
            },
            if cfg.memcache_tls {
                format!(" (memcached) on port {}", cfg.port)
            } else {
                String::new()
            },
            cfg.tls_auth().name()
        );
    }

    let mc_tls = shared.config.memcache_tls;
    accept_loop(
        &mut acceptor,
        [
            (mc_listener.as_ref(), Proto::Memcache, mc_tls),
            (resp_listener.as_ref(), Proto::Resp, false),
            (tls_listener.as_ref(), Proto::Resp, true),
        ],
        &shared,
        &handles,
        &stop,
    );

    // Shutdown: no new connections; workers finish in-flight writes and flush replies, then
    // drop their senders, which lets the writer commit what is left, sync and stop.
    drop(mc_listener);
    drop(resp_listener);
    drop(tls_listener);
    shared.shutdown.store(true, Ordering::Release);
    shared.repl.close();
    for h in &handles {
        h.mailbox.wake();
    }
    for t in worker_threads {
        if t.join().is_err() {
            error!("a worker thread panicked");
        }
    }
    if writer_thread.join().is_err() {
        error!("the writer thread panicked");
    }
    if let Some(pool) = &shared.cold {
        pool.stop();
    }
    signals_handle.close();
    drop(handles);
    let env = shared.store.env().clone();
    drop(shared);
    env.prepare_for_closing().wait();
    info!("memkeep stopped");
    Ok(())
}

/// How long the acceptor waits after a failed accept before it tries again.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

fn accept_loop(
    poll: &mut Poll,
    listeners: [(Option<&TcpListener>, Proto, bool); 3],
    shared: &Shared,
    handles: &[Arc<WorkerHandle>],
    stop: &AtomicBool,
) {
    let mut events = Events::with_capacity(64);
    let mut next_worker = 0usize;
    // After a failed accept (out of descriptors, say): no accept before this, whatever events
    // come (each waiting client raised one, and each retry logged a line: about 300 a second
    // with the descriptors used up); then every listener is tried again.
    let mut paused_until: Option<Instant> = None;
    // Accepts failed since the last that worked, for the log.
    let mut failed = 0u64;
    let gauges = &shared.gauges;
    while !stop.load(Ordering::Acquire) {
        let timeout = paused_until.map(|t| t.saturating_duration_since(Instant::now()));
        if let Err(e) = poll.poll(&mut events, timeout)
            && e.kind() != io::ErrorKind::Interrupted
        {
            error!("acceptor poll failed: {e}");
            return;
        }
        if paused_until.is_some_and(|t| Instant::now() < t) {
            continue;
        }
        paused_until = None;
        // Accept on every listener each time: cheap, and it also retries after a failed accept.
        for (listener, proto, tls) in listeners {
            if paused_until.is_some() {
                break;
            }
            let Some(listener) = listener else { continue };
            loop {
                match listener.accept() {
                    Ok((stream, peer)) => {
                        let stream = into_std(stream);
                        let curr = shared.gauges.curr_connections.load(Ordering::Relaxed);
                        if curr >= shared.config.max_connections {
                            Counters::bump(&shared.counters[0].rejected_connections);
                            if !tls {
                                // (A TLS client cannot read a plain-text reason.)
                                reject(stream, proto);
                            }
                            log::debug!("rejected {peer}: too many open connections");
                            continue;
                        }
                        shared
                            .gauges
                            .curr_connections
                            .fetch_add(1, Ordering::Relaxed);
                        let _ = stream.set_nodelay(true);
                        let h = &handles[next_worker % handles.len()];
                        next_worker = next_worker.wrapping_add(1);
                        h.incoming
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((stream, proto, tls));
                        h.mailbox.wake();
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // Out of file descriptors and the like: back off, then try again.
                        if failed == 0 {
                            warn!(
                                "accept failed: {e}; new connections wait until it works again \
                                 (stats listen_disabled_num counts these pauses)"
                            );
                            gauges.listen_disabled.fetch_add(1, Ordering::Relaxed);
                            gauges.accept_paused.store(true, Ordering::Relaxed);
                        }
                        failed += 1;
                        paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                        break;
                    }
                }
            }
        }
        if paused_until.is_none() && failed > 0 {
            // Every listener accepted or had nothing waiting: accepting again.
            info!("accepting connections again ({failed} accepts failed)");
            failed = 0;
            gauges.accept_paused.store(false, Ordering::Relaxed);
        }
    }
}

fn into_std(stream: mio::net::TcpStream) -> std::net::TcpStream {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // Safety: the fd comes straight from an owned mio stream, whose ownership we take.
    unsafe { std::net::TcpStream::from_raw_fd(stream.into_raw_fd()) }
}

/// Tells a client over the connection limit why it is being closed, as memcached does.
fn reject(stream: std::net::TcpStream, proto: Proto) {
    let msg: &[u8] = match proto {
        Proto::Memcache => b"ERROR Too many open connections\r\n",
        Proto::Resp => b"-ERR max number of clients reached\r\n",
    };
    let mut s = stream;
    let _ = s.write(msg);
}

/// A random 40-hex-digit replication id (INFO replication's `master_replid`).
fn replication_id() -> String {
    let mut b = [0u8; 20];
    if getrandom::fill(&mut b).is_err() {
        // No random source: the time still makes ids differ between starts.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b[..16].copy_from_slice(&t.to_le_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}
