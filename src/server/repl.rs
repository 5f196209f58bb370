//! Replication over the network: a primary's sender threads (one per replica) and a
//! replica's receiver thread, on plain blocking sockets, off the event loops.
//!
//! Handshake (as a Redis replica does it, on the primary's RESP port): `PING`,
//! `REPLCONF listening-port <port>`, `REPLCONF capa eof capa psync2`, then
//! `PSYNC <replid> <offset+1>` (`PSYNC ? -1` with no position). The worker that runs PSYNC
//! hands the connection to a sender thread (`serve_replica`), which answers:
//! - `+CONTINUE <replid>` when the backlog still holds the replica's position; or
//! - `+FULLRESYNC <replid> <offset>`, then the full copy: every record of every database as
//!   one LMDB read transaction sees it (the primary keeps serving; the snapshot is an LMDB
//!   commit whose last log batch is known, `Hub::seq_of_commit`, so `offset` is exactly where
//!   the stream goes on), in frames `b'S'`, length u32 LE, records; then `b'E'`, 0.
//!
//! Then the stream: `b'B'` frames (one log batch each, counted in the offset) and, when idle,
//! `b'P'` heartbeats each second (not counted). The replica answers `REPLCONF ACK <offset>`
//! after each applied group and each heartbeat.
//!
//! Memory: a sender holds the frames it is writing (shared with the backlog) and one chunk of
//! the full copy. Its position pins the backlog (`engine::repl::Pin`): the frames it has still
//! to send, from its copy's snapshot on, stay past the backlog's size up to `PINNED_MAX`
//! bytes in all (Redis's replica output buffer limit), so a copy that outlasts the backlog
//! is not taken again; a replica further behind than that loses its place and takes a full
//! copy. A replica that hangs up releases its pin at once (its acknowledgements' reader sees
//! the end). A replica hands a full copy's chunks to
//! its writer as they arrive, over a channel of `COPY_QUEUE` chunks, which writes them into
//! one transaction (`engine::writer::replica`); it applies at most `APPLY_MAX` bytes of
//! batches per write.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use mio::{Events, Poll, Token, Waker};

use super::Shared;
use super::worker::{Reply, Tag};
use crate::command::{CopyChunk, CopySource, Outcome, ReplInstall, Replicated, WriteOp};
use crate::engine::repl::{FRAME_HEADER, Gone, Hub, Pin, stored_position};
use crate::engine::writer::{Gate, Mailbox, Submission, WriteRequest};
use crate::storage::wal::LogBuf;

/// Largest chunk of a full copy, and most batch bytes a replica applies in one write.
const CHUNK: usize = 1 << 20;
const APPLY_MAX: usize = 4 << 20;
/// How long a replica waits for anything from its primary (heartbeats come every second).
const LINK_TIMEOUT: Duration = Duration::from_secs(5);
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Chunks of a full copy received and not yet written (the writer is slower than a loopback
/// link): the TCP window holds the rest, so the primary sends as fast as the copy is written.
const COPY_QUEUE: usize = 4;
const RECEIVER_WAKER: Token = Token(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A replica as its primary sees it.
#[derive(Debug)]
pub struct Peer {
    pub id: u64,
    pub ip: String,
    pub port: u16,
    /// "wait_bgsave" while the full copy is being prepared, "send_bulk" while it is sent,
    /// "online" once it streams.
    pub state: Mutex<&'static str>,
    pub ack: AtomicU64,
    pub ack_at: Mutex<Instant>,
    /// The replica's side of the connection ended (its acknowledgements' reader saw it): the
    /// sender stops, and its pin on the backlog goes with it.
    pub gone: std::sync::atomic::AtomicBool,
}

/// A replica's link to its primary.
#[derive(Debug, Clone)]
pub struct Link {
    pub host: String,
    pub port: u16,
    /// "connect", "connecting", "sync", "connected" (ROLE's words).
    pub state: &'static str,
    pub last_io: Instant,
    pub down_since: Instant,
    /// The primary's replication id and the offset applied.
    pub replid: String,
    pub offset: u64,
}

/// Replication state shared by the workers, the sender threads and the receiver.
pub struct Repl {
    hub: OnceLock<Arc<Hub>>,
    /// Taken at shutdown: the writer stops only once every gate is gone.
    gate: Mutex<Option<Gate<Tag>>>,
    /// Where the receiver's writes are answered (the writer's mailbox past the workers').
    pub mailbox: Arc<Mailbox<Tag>>,
    pub mailbox_index: usize,
    poll: Mutex<Option<Poll>>,
    /// Bumped by every REPLICAOF: a receiver of an older generation stops.
    generation: AtomicU64,
    link: Mutex<Option<Link>>,
    peers: Mutex<Vec<Arc<Peer>>>,
    next_peer: AtomicU64,
    /// Counters (INFO): full copies served and continuations granted (primary), full copies
    /// taken and continuations obtained (replica).
    pub sync_full: AtomicU64,
    pub sync_partial_ok: AtomicU64,
    pub copies_taken: AtomicU64,
    pub resumes: AtomicU64,
    receivers: AtomicUsize,
    me: OnceLock<std::sync::Weak<Shared>>,
    /// The receiver's socket, shut down to end its link at once (REPLICAOF).
    sock: Mutex<Option<TcpStream>>,
    /// INFO's `run_id`: made at every start, as Redis does (Sentinel tells restarts by it).
    pub run_id: String,
    /// What CONFIG SET may change at run time (`replica-priority`, `replica-announce-*`).
    settings: Mutex<Settings>,
    /// `settings.min_to_write`, read by every write without the lock.
    min_to_write: AtomicU64,
}

/// The replication settings CONFIG SET changes and CONFIG REWRITE saves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Redis's `replica-priority`: Sentinel promotes the lowest non-zero one; 0 never.
    pub priority: u32,
    /// Redis's `replica-announce-ip` and `replica-announce-port`: the address a replica
    /// tells its primary (shown in the primary's INFO, where Sentinel finds replicas) instead
    /// of its connection's source address and its RESP port; empty and 0: those.
    pub announce_ip: String,
    pub announce_port: u16,
    /// Redis's `min-replicas-to-write` and `min-replicas-max-lag` (seconds).
    pub min_to_write: u32,
    pub max_lag: u32,
}

impl Settings {
    pub fn from_config(c: &crate::config::Config) -> Settings {
        Settings {
            priority: c.replica_priority,
            announce_ip: c.replica_announce_ip.clone(),
            announce_port: c.replica_announce_port,
            min_to_write: c.min_replicas_to_write,
            max_lag: c.min_replicas_max_lag,
        }
    }
}

impl Repl {
    /// `workers` mailboxes come first in the writer's list; this one is at that index.
    pub fn new(workers: usize, config: &crate::config::Config) -> io::Result<Repl> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), RECEIVER_WAKER)?;
        Ok(Repl {
            hub: OnceLock::new(),
            gate: Mutex::new(None),
            mailbox: Arc::new(Mailbox::new(waker)),
            mailbox_index: workers,
            poll: Mutex::new(Some(poll)),
            generation: AtomicU64::new(0),
            link: Mutex::new(None),
            peers: Mutex::new(Vec::new()),
            next_peer: AtomicU64::new(0),
            sync_full: AtomicU64::new(0),
            sync_partial_ok: AtomicU64::new(0),
            copies_taken: AtomicU64::new(0),
            resumes: AtomicU64::new(0),
            receivers: AtomicUsize::new(0),
            me: OnceLock::new(),
            sock: Mutex::new(None),
            run_id: super::replication_id(),
            settings: Mutex::new(Settings::from_config(config)),
            min_to_write: AtomicU64::new(config.min_replicas_to_write as u64),
        })
    }

    /// Whether a primary refuses writes now: `min-replicas-to-write` is set and fewer
    /// replicas than that are online with an acknowledgement within `min-replicas-max-lag`
    /// seconds (Redis's "good replicas"). Never on a replica (it refuses writes anyway).
    pub fn too_few_replicas(&self) -> bool {
        let min = self.min_to_write.load(Ordering::Relaxed);
        if min == 0 || self.is_replica() {
            return false;
        }
        let max_lag = lock(&self.settings).max_lag as u64;
        let good = lock(&self.peers)
            .iter()
            .filter(|p| {
                *lock(&p.state) == "online" && lock(&p.ack_at).elapsed().as_secs() <= max_lag
            })
            .count();
        (good as u64) < min
    }

    pub fn settings(&self) -> Settings {
        lock(&self.settings).clone()
    }

    pub fn set_settings(&self, s: Settings) {
        self.min_to_write
            .store(s.min_to_write as u64, Ordering::Relaxed);
        *lock(&self.settings) = s;
    }

    /// `replica_of` as it stands now ("host:port", or empty on a primary), for CONFIG
    /// REWRITE.
    pub fn target(&self) -> String {
        match self.link() {
            Some(l) if l.host.contains(':') => format!("[{}]:{}", l.host, l.port),
            Some(l) => format!("{}:{}", l.host, l.port),
            None => String::new(),
        }
    }

    pub fn set_hub(&self, hub: Arc<Hub>) {
        let _ = self.hub.set(hub);
    }

    /// The server this belongs to (threads started from a command need their own handle).
    pub fn set_shared(&self, me: std::sync::Weak<Shared>) {
        let _ = self.me.set(me);
    }

    fn shared(&self) -> Option<Arc<Shared>> {
        self.me.get().and_then(|w| w.upgrade())
    }

    pub fn set_gate(&self, gate: Gate<Tag>) {
        *lock(&self.gate) = Some(gate);
    }

    /// Shutdown: the receiver stops (its link is cut) and the writer's gate is let go, so the
    /// writer can stop; senders see the shutdown flag and end.
    pub fn close(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.cut_link();
        lock(&self.gate).take();
    }

    pub fn hub(&self) -> Option<&Arc<Hub>> {
        self.hub.get()
    }

    pub fn is_replica(&self) -> bool {
        self.hub.get().is_some_and(|h| h.is_replica())
    }

    pub fn link(&self) -> Option<Link> {
        lock(&self.link).clone()
    }

    pub fn peers(&self) -> Vec<Arc<Peer>> {
        lock(&self.peers).clone()
    }

    /// The replication id and offset INFO and ROLE show: the stream's on a primary, the
    /// primary's and the applied offset on a replica.
    pub fn position(&self) -> (String, u64) {
        if let Some(l) = self.link() {
            return (l.replid, l.offset);
        }
        self.hub.get().map_or((String::new(), 0), |h| h.position())
    }

    /// How many replicas have acknowledged `offset`.
    pub fn acked(&self, offset: u64) -> usize {
        lock(&self.peers)
            .iter()
            .filter(|p| p.ack.load(Ordering::Acquire) >= offset)
            .count()
    }

    /// Ends the current receiver's connection (it notices its generation changed).
    fn cut_link(&self) {
        if let Some(s) = lock(&self.sock).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn set_link(&self, f: impl FnOnce(&mut Link)) {
        if let Some(l) = lock(&self.link).as_mut() {
            f(l);
        }
    }
}

/// Becomes a replica of `host:port` (REPLICAOF, `replica_of`): refuses writes from now on and
/// starts a receiver (an earlier one stops).
/// `starting`: the server is starting with `replica_of` (the stored position is trusted).
pub fn replicate_from(
    shared: &Arc<Shared>,
    host: String,
    port: u16,
    starting: bool,
) -> Result<(), String> {
    let repl = &shared.repl;
    let hub = repl.hub().ok_or("replication is not set up")?;
    let was_replica = hub.is_replica();
    hub.set_replica(true);
    // Where to ask the primary to go on from: the position applied (a replica changing
    // primaries), the one stored with the data (a replica starting), or none (a primary
    // becoming a replica: its data may have diverged, so it takes a full copy).
    let known = repl.link().map(|l| (l.replid, l.offset));
    let (replid, offset) = match (was_replica, known) {
        (true, Some(p)) => p,
        (false, _) if !starting => (String::new(), 0),
        _ => match stored_position(&shared.store) {
            Ok(Some(p)) => p,
            Ok(None) => (String::new(), 0),
            Err(e) => {
                warn!("cannot read the stored replication position: {e}");
                (String::new(), 0)
            }
        },
    };
    let now = Instant::now();
    *lock(&repl.link) = Some(Link {
        host: host.clone(),
        port,
        state: "connect",
        last_io: now,
        down_since: now,
        replid,
        offset,
    });
    let generation = repl.generation.fetch_add(1, Ordering::AcqRel) + 1;
    repl.cut_link();
    let s = shared.clone();
    std::thread::Builder::new()
        .name("memkeep-repl-in".into())
        .spawn(move || receiver(s, generation, host, port))
        .map_err(|e| format!("cannot start the replication thread: {e}"))?;
    Ok(())
}

/// REPLICAOF NO ONE: stops replicating and accepts writes, going on from the offset applied
/// under a new replication id.
pub fn promote(shared: &Arc<Shared>) {
    let repl = &shared.repl;
    repl.generation.fetch_add(1, Ordering::AcqRel);
    repl.cut_link();
    // The receiver may be applying a group: wait for it to notice (it checks between groups),
    // so the link's offset is what the store holds (a replica of the old primary may continue
    // here from exactly that offset).
    let deadline = Instant::now() + Duration::from_secs(5);
    while repl.receivers.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stopped = repl.receivers.load(Ordering::Acquire) == 0;
    let mut link = lock(&repl.link).take();
    if !stopped {
        // Its last group may land after the offset is read: no replica may continue here.
        warn!("promoted while the replication receiver was still applying a write");
        if let Some(l) = &mut link {
            l.replid.clear();
        }
    }
    if let Some(hub) = repl.hub() {
        let (offset, previous) = match link {
            Some(l) => (l.offset, Some(l.replid)),
            None => (hub.offset(), None),
        };
        hub.set_replica(false);
        hub.restart_stream(super::replication_id(), offset, previous);
        info!("promoted to primary at offset {offset}");
    }
    // The stored position no longer describes the data once it takes writes of its own: it
    // is cleared (through the writer, off this thread), so a restart as a replica takes a
    // full copy instead of continuing on top of them.
    let s = shared.clone();
    let generation = repl.generation.load(Ordering::Acquire);
    let spawned = std::thread::Builder::new()
        .name("memkeep-repl-forget".into())
        .spawn(move || {
            let repl = &s.repl;
            let Some(poll) = lock(&repl.poll).take() else {
                // A new receiver holds it: it stores its own position soon enough.
                return;
            };
            let mut r = Receiving {
                shared: &s,
                generation,
                poll,
                events: Events::with_capacity(4),
            };
            let cleared = r.write(WriteOp::Replicate(Box::new(Replicated {
                payloads: Vec::new(),
                replid: String::new(),
                offset: 0,
            })));
            if let Err(e) = cleared {
                warn!("cannot clear the stored replication position: {e}");
            }
            let Receiving { poll, .. } = r;
            *lock(&repl.poll) = Some(poll);
        });
    if let Err(e) = spawned {
        warn!("cannot clear the stored replication position: {e}");
    }
}

// ---------------------------------------------------------------------------------------
// Primary side.

/// Serves a replica that sent PSYNC on `stream` (taken out of its event loop).
/// `announced`: the address and port the replica gave with REPLCONF (none and 0: its
/// connection's).
pub fn serve_replica(
    shared: Arc<Shared>,
    stream: TcpStream,
    replid: String,
    offset: i64,
    announced: (Option<String>, u16),
) {
    let peer_addr = stream.peer_addr().ok();
    let (announced_ip, listening_port) = announced;
    let spawned = std::thread::Builder::new()
        .name("memkeep-repl-out".into())
        .spawn(move || {
            let ip = announced_ip.unwrap_or_else(|| {
                peer_addr.map_or_else(|| "?".to_string(), |a| a.ip().to_string())
            });
            let port = if listening_port != 0 {
                listening_port
            } else {
                peer_addr.map_or(0, |a| a.port())
            };
            let peer = Arc::new(Peer {
                id: shared.repl.next_peer.fetch_add(1, Ordering::Relaxed),
                ip,
                port,
                state: Mutex::new("wait_bgsave"),
                ack: AtomicU64::new(0),
                ack_at: Mutex::new(Instant::now()),
                gone: std::sync::atomic::AtomicBool::new(false),
            });
            lock(&shared.repl.peers).push(peer.clone());
            match send(&shared, stream, &replid, offset, &peer) {
                Ok(()) => info!("replica {}:{} gone", peer.ip, peer.port),
                Err(e) => info!("replica {}:{} dropped: {e}", peer.ip, peer.port),
            }
            lock(&shared.repl.peers).retain(|p| p.id != peer.id);
        });
    if let Err(e) = spawned {
        error!("cannot start a replication sender: {e}");
    }
}

fn send(
    shared: &Arc<Shared>,
    stream: TcpStream,
    replid: &str,
    offset: i64,
    peer: &Arc<Peer>,
) -> io::Result<()> {
    let hub = shared
        .repl
        .hub()
        .ok_or_else(|| io::Error::other("replication is not set up"))?
        .clone();
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    // A replica that takes more than this to accept bytes is dropped (it reconnects).
    stream.set_write_timeout(Some(Duration::from_secs(30)))?;
    let acks = stream.try_clone()?;
    let ctl = stream.try_clone()?;
    let p = peer.clone();
    std::thread::Builder::new()
        .name("memkeep-repl-ack".into())
        .spawn(move || read_acks(acks, &p))?;
    let result = stream_to(shared, &hub, stream, replid, offset, peer);
    // Ends the acknowledgement reader too, and tells the replica at once.
    let _ = ctl.shutdown(std::net::Shutdown::Both);
    result
}

fn stream_to(
    shared: &Arc<Shared>,
    hub: &Arc<Hub>,
    stream: TcpStream,
    replid: &str,
    offset: i64,
    peer: &Arc<Peer>,
) -> io::Result<()> {
    hub.activate();
    let mut out = io::BufWriter::with_capacity(64 << 10, stream);
    let continued = (offset > 0 && !hub.is_replica())
        .then(|| offset as u64 - 1)
        .filter(|&from| hub.can_continue(replid, from))
        .and_then(|from| hub.pin(from).map(|pin| (from, pin)));
    let (from, pin) = if let Some((from, pin)) = continued {
        let (id, _) = hub.position();
        write!(out, "+CONTINUE {id}\r\n")?;
        shared.repl.sync_partial_ok.fetch_add(1, Ordering::Relaxed);
        info!(
            "replica {}:{} continues from offset {from}",
            peer.ip, peer.port
        );
        (from, pin)
    } else {
        if hub.is_replica() {
            return Err(io::Error::other("this server is a replica itself"));
        }
        shared.repl.sync_full.fetch_add(1, Ordering::Relaxed);
        full_copy(shared, hub, &mut out, peer)?
    };
    *lock(&peer.state) = "online";
    out.flush()?;
    let mut at = from;
    let mut last_sent = Instant::now();
    loop {
        if shared.shutdown.load(Ordering::Acquire) || hub.is_replica() {
            return Ok(());
        }
        if peer.gone.load(Ordering::Acquire) {
            return Err(io::Error::other("the replica closed the connection"));
        }
        if pin.lost() {
            // The backlog dropped what this replica still needed, or a new stream began (this
            // server was a replica in between): it must ask again.
            return Err(io::Error::other("lost its place in the stream"));
        }
        let frames = hub
            .frames_after(at, APPLY_MAX, Duration::from_millis(200))
            .map_err(|Gone::NotHeld| io::Error::other("fell behind the backlog"))?;
        for f in &frames {
            out.write_all(&f.data)?;
            at = f.end;
        }
        if !frames.is_empty() {
            out.flush()?;
            pin.advance(at);
            last_sent = Instant::now();
        } else if last_sent.elapsed() >= HEARTBEAT {
            out.write_all(&[b'P', 0, 0, 0, 0])?;
            out.flush()?;
            last_sent = Instant::now();
        }
    }
}

/// Reads `REPLCONF ACK <offset>` from a replica until the connection ends.
fn read_acks(stream: TcpStream, peer: &Peer) {
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    let mut prev_ack = false;
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => {
                peer.gone.store(true, Ordering::Release);
                return;
            }
            Ok(_) => {}
        }
        let t = line.trim_end();
        if prev_ack && let Ok(n) = t.parse::<u64>() {
            peer.ack.fetch_max(n, Ordering::AcqRel);
            *lock(&peer.ack_at) = Instant::now();
        }
        prev_ack = t.eq_ignore_ascii_case("ack") || (prev_ack && t.starts_with('$'));
    }
}

/// How long a full copy pauses, as a multiple of the time it was busy since its last pause:
/// it takes at most a third of the time of the CPU and the disk it uses, on both ends (the
/// replica writes as it receives), so a primary sharing them with the copy's work, or with
/// its replica, keeps more of its throughput. Never so long that the copy goes slower than
/// `COPY_FLOOR`, and not once a quarter of what the backlog keeps for a pinned sender is used
/// up since the snapshot (the replica continues from the snapshot's position: a copy that
/// outlasts that is taken again from the start).
const COPY_YIELD: u32 = 2;
/// Bytes a second of records under which a copy does not pause: 1 GB in about 16 s.
const COPY_FLOOR: u64 = 64 << 20;
/// Bytes sent between two pauses.
const PACE_EVERY: usize = 32 << 20;
/// The longest pause (the replica waits for bytes at most `LINK_TIMEOUT`).
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// A full copy's pacing on the primary (`COPY_YIELD`).
struct Pace {
    /// The snapshot's stream offset.
    offset: u64,
    started: Instant,
    busy_since: Instant,
    bytes: u64,
    since_pause: usize,
}

impl Pace {
    fn new(offset: u64) -> Pace {
        let now = Instant::now();
        Pace {
            offset,
            started: now,
            busy_since: now,
            bytes: 0,
            since_pause: 0,
        }
    }

    fn sent(&mut self, n: usize) {
        self.bytes += n as u64;
        self.since_pause += n;
    }

    /// Every `PACE_EVERY` bytes: sleeps `COPY_YIELD` times the time busy since the last pause,
    /// within what keeps the copy at `COPY_FLOOR` and the backlog at a quarter used.
    fn maybe_pause(&mut self, hub: &Hub) {
        if self.since_pause < PACE_EVERY {
            return;
        }
        self.since_pause = 0;
        let (used, cap) = hub.used_since(self.offset);
        let floor = Duration::from_secs_f64(self.bytes as f64 / COPY_FLOOR as f64);
        let pause = (self.busy_since.elapsed() * COPY_YIELD)
            .min(floor.saturating_sub(self.started.elapsed()))
            .min(MAX_PAUSE);
        if used.saturating_mul(4) < cap && !pause.is_zero() {
            std::thread::sleep(pause);
        }
        self.busy_since = Instant::now();
    }
}

/// Sends `+FULLRESYNC` and a consistent copy of the store; returns the offset it is at, pinned
/// from the moment the snapshot was taken (the stream goes on from there however long the
/// copy takes, within `PINNED_MAX`).
fn full_copy<'h>(
    shared: &Arc<Shared>,
    hub: &'h Hub,
    out: &mut impl Write,
    peer: &Peer,
) -> io::Result<(u64, Pin<'h>)> {
    let store = shared.store.clone();
    let started = Instant::now();
    let give_up = started + Duration::from_secs(30);
    // A snapshot whose last batch is known and whose position the backlog still has.
    // Held from the oldest frame the backlog has now, so the snapshot's position, a little
    // older than the log's end (LMDB commits lag it), stays in it however fast writes come.
    let pin = hub.pin_oldest();
    let (txn, offset) = loop {
        if Instant::now() > give_up {
            return Err(io::Error::other("no snapshot with a known position"));
        }
        let txn = store
            .read_txn()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let id = txn.id() as u64;
        match hub.seq_of_commit(id).map(|s| hub.offset_of_seq(s)) {
            Some(Ok(Some(off))) => break (txn, off),
            Some(Ok(None)) => {
                // The commit holds a batch not yet released (its fdatasync is running).
                drop(txn);
                std::thread::sleep(Duration::from_millis(2));
            }
            _ => {
                drop(txn);
                store.overlay().commit_asked.store(true, Ordering::Release);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    pin.advance(offset);
    let (replid, _) = hub.position();
    write!(out, "+FULLRESYNC {replid} {offset}\r\n")?;
    *lock(&peer.state) = "send_bulk";
    let mut buf = LogBuf::default();
    let mut records = 0u64;
    let mut pace = Pace::new(offset);
    let flush = |buf: &mut LogBuf, out: &mut dyn Write| -> io::Result<()> {
        if !buf.is_empty() {
            let p = buf.payload();
            out.write_all(b"S")?;
            out.write_all(&(p.len() as u32).to_le_bytes())?;
            out.write_all(p)?;
            buf.reset();
        }
        Ok(())
    };
    for db in 0..=5u8 {
        let Some(table) = store.table(db) else {
            continue;
        };
        let iter = table
            .iter(&txn)
            .map_err(|e| io::Error::other(e.to_string()))?;
        for kv in iter {
            let (k, v) = kv.map_err(|e| io::Error::other(e.to_string()))?;
            if db == crate::storage::lmdb::DB_META && k == crate::storage::lmdb::META_VLOG {
                // This store's own: the replica's pointers name its own value log.
                continue;
            }
            // A value that lives in this store's log goes whole: the replica has no such log.
            let v = if db == crate::storage::lmdb::DB_ITEMS {
                crate::storage::item::inline(v).map_err(|e| io::Error::other(e.to_string()))?
            } else {
                std::borrow::Cow::Borrowed(v)
            };
            buf.put(db, k, &[&v]);
            records += 1;
            if buf.payload_len() >= CHUNK {
                pace.sent(buf.payload_len());
                flush(&mut buf, out)?;
                if pin.lost() {
                    // The writes since the snapshot passed what the backlog keeps: the
                    // replica could not continue from it. Stop now rather than finish a copy
                    // that must be taken again (Redis drops such a replica at its output
                    // buffer's hard limit too).
                    return Err(io::Error::other(
                        "the backlog no longer holds the copy's position (too many writes during the copy)",
                    ));
                }
                pace.maybe_pause(hub);
            }
        }
    }
    flush(&mut buf, out)?;
    drop(txn);
    out.write_all(&[b'E', 0, 0, 0, 0])?;
    info!(
        "full copy for replica {}:{}: {records} records at offset {offset} in {} ms",
        peer.ip,
        peer.port,
        started.elapsed().as_millis()
    );
    Ok((offset, pin))
}

// ---------------------------------------------------------------------------------------
// Replica side.

#[derive(Debug)]
enum LinkError {
    Io(io::Error),
    Proto(String),
    /// This replica could not write what it received (its own store refuses writes: a full
    /// disk, say): links are tried again less and less often (`LOCAL_RETRY_MAX`).
    Local(String),
    /// REPLICAOF changed the target (or NO ONE): stop.
    Superseded,
}

impl From<io::Error> for LinkError {
    fn from(e: io::Error) -> Self {
        LinkError::Io(e)
    }
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Io(e) => write!(f, "{e}"),
            LinkError::Proto(m) | LinkError::Local(m) => f.write_str(m),
            LinkError::Superseded => f.write_str("replication target changed"),
        }
    }
}

struct Receiving<'a> {
    shared: &'a Arc<Shared>,
    generation: u64,
    poll: Poll,
    events: Events,
}

impl Receiving<'_> {
    fn current(&self) -> bool {
        self.shared.repl.generation.load(Ordering::Acquire) == self.generation
            && !self.shared.shutdown.load(Ordering::Acquire)
    }

    /// Submits one write for the writer thread and waits for its outcome.
    fn write(&mut self, op: WriteOp) -> Result<(), LinkError> {
        self.submit(op)?;
        self.outcome()
    }

    /// Submits one write for the writer thread; `outcome` gets its answer.
    fn submit(&mut self, op: WriteOp) -> Result<(), LinkError> {
        if !self.current() {
            return Err(LinkError::Superseded);
        }
        let repl = &self.shared.repl;
        let gate = lock(&repl.gate)
            .clone()
            .ok_or_else(|| LinkError::Proto("the writer has stopped".into()))?;
        let tag = Tag {
            slot: u32::MAX,
            epoch: 0,
            reply: Reply::Resp {
                kind: super::resp::RespReply::Plain,
            },
        };
        let sub = Submission {
            worker: repl.mailbox_index,
            reqs: vec![WriteRequest { tag, op }],
        };
        if gate.submit(sub) == crate::engine::writer::Submitted::Refused {
            return Err(LinkError::Proto("the writer has stopped".into()));
        }
        Ok(())
    }

    /// Waits for the outcome of the write submitted last.
    fn outcome(&mut self) -> Result<(), LinkError> {
        let repl = &self.shared.repl;
        let mut got = Vec::new();
        loop {
            repl.mailbox.drain_into(&mut got);
            if let Some(c) = got.pop() {
                return match c.outcome {
                    Outcome::Done => Ok(()),
                    o => Err(LinkError::Local(format!(
                        "this replica could not write what it received ({o:?}; see above)"
                    ))),
                };
            }
            if let Err(e) = self
                .poll
                .poll(&mut self.events, Some(Duration::from_millis(100)))
                && e.kind() != io::ErrorKind::Interrupted
            {
                return Err(LinkError::Io(e));
            }
        }
    }
}

/// The longest wait between links that failed on this replica's own writes (`LinkError::Local`).
const LOCAL_RETRY_MAX: u64 = 32;

fn receiver(shared: Arc<Shared>, generation: u64, host: String, port: u16) {
    let repl = &shared.repl;
    // One receiver at a time: the previous one gives the poll back when it stops.
    let poll = loop {
        if repl.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if let Some(p) = lock(&repl.poll).take() {
            break p;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    repl.receivers.fetch_add(1, Ordering::AcqRel);
    let mut r = Receiving {
        shared: &shared,
        generation,
        poll,
        events: Events::with_capacity(4),
    };
    info!("replicating {host}:{port}");
    // Seconds until the next link: 1, or, after links that failed on this replica's own
    // writes, doubling up to LOCAL_RETRY_MAX. (Retrying every second, a replica with a full
    // disk took a full copy of the primary's data every second: 13 in 12 s.)
    let mut wait = 1u64;
    while r.current() {
        match link_once(&mut r, &host, port) {
            Err(LinkError::Superseded) => break,
            Err(e @ LinkError::Local(_)) => {
                warn!("replication link to {host}:{port}: {e}; next try in {wait} s");
                wait = (wait * 2).min(LOCAL_RETRY_MAX);
            }
            Err(e) => {
                warn!("replication link to {host}:{port}: {e}");
                wait = 1;
            }
            Ok(()) => wait = 1,
        }
        let now = Instant::now();
        repl.set_link(|l| {
            if l.state == "connected" {
                l.down_since = now;
            }
            l.state = "connect";
        });
        // Retry after `wait` seconds, checking for REPLICAOF meanwhile.
        for _ in 0..wait * 10 {
            if !r.current() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let Receiving { poll, .. } = r;
    *lock(&repl.poll) = Some(poll);
    repl.receivers.fetch_sub(1, Ordering::AcqRel);
    debug!("replication receiver for {host}:{port} stopped");
}

fn command(out: &mut impl Write, args: &[&str]) -> io::Result<()> {
    let mut v = format!("*{}\r\n", args.len());
    for a in args {
        v.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    out.write_all(v.as_bytes())
}

fn read_line(r: &mut impl BufRead) -> Result<String, LinkError> {
    let mut line = String::new();
    let mut limited = r.take(1024);
    if limited.read_line(&mut line)? == 0 {
        return Err(LinkError::Proto("the primary closed the connection".into()));
    }
    Ok(line.trim_end().to_string())
}

fn expect_ok(r: &mut impl BufRead, what: &str) -> Result<(), LinkError> {
    let l = read_line(r)?;
    if l.starts_with('+') {
        Ok(())
    } else {
        Err(LinkError::Proto(format!("{what}: {l}")))
    }
}

fn connect(host: &str, port: u16) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    let mut last = io::Error::other("no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_secs(5)) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// One connection to the primary: handshake, full copy or continuation, then the stream,
/// until an error.
fn link_once(r: &mut Receiving<'_>, host: &str, port: u16) -> Result<(), LinkError> {
    let shared = r.shared;
    let repl = &shared.repl;
    repl.set_link(|l| l.state = "connecting");
    let stream = connect(host, port)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(LINK_TIMEOUT))?;
    stream.set_write_timeout(Some(LINK_TIMEOUT))?;
    *lock(&repl.sock) = Some(stream.try_clone()?);
    if !r.current() {
        return Err(LinkError::Superseded);
    }
    let mut out = stream.try_clone()?;
    let mut input = BufReader::with_capacity(256 << 10, stream);
    let touch = |repl: &Repl| repl.set_link(|l| l.last_io = Instant::now());
    if !shared.config.requirepass.is_empty() {
        command(&mut out, &["AUTH", &shared.config.requirepass])?;
        expect_ok(&mut input, "AUTH")?;
    }
    command(&mut out, &["PING"])?;
    expect_ok(&mut input, "PING")?;
    let settings = repl.settings();
    let my_port = match settings.announce_port {
        0 => shared.config.resp_port,
        p => p,
    }
    .to_string();
    command(&mut out, &["REPLCONF", "listening-port", &my_port])?;
    expect_ok(&mut input, "REPLCONF listening-port")?;
    if !settings.announce_ip.is_empty() {
        command(&mut out, &["REPLCONF", "ip-address", &settings.announce_ip])?;
        expect_ok(&mut input, "REPLCONF ip-address")?;
    }
    command(&mut out, &["REPLCONF", "capa", "eof", "capa", "psync2"])?;
    expect_ok(&mut input, "REPLCONF capa")?;
    let (replid, offset) = repl
        .link()
        .map(|l| (l.replid, l.offset))
        .unwrap_or_default();
    if replid.is_empty() {
        command(&mut out, &["PSYNC", "?", "-1"])?;
    } else {
        command(&mut out, &["PSYNC", &replid, &(offset + 1).to_string()])?;
    }
    let reply = read_line(&mut input)?;
    touch(repl);
    let mut words = reply.split_whitespace();
    let (replid, mut offset) = match words.next() {
        Some("+FULLRESYNC") => {
            let id = words.next().unwrap_or_default().to_string();
            let off = words
                .next()
                .and_then(|w| w.parse::<u64>().ok())
                .ok_or_else(|| LinkError::Proto(format!("bad reply to PSYNC: {reply}")))?;
            repl.set_link(|l| l.state = "sync");
            take_copy(r, &mut input, &id, off)?;
            repl.copies_taken.fetch_add(1, Ordering::Relaxed);
            (id, off)
        }
        Some("+CONTINUE") => {
            let id = words.next().map_or(replid, |w| w.to_string());
            repl.resumes.fetch_add(1, Ordering::Relaxed);
            info!("replication continues from offset {offset} of {id}");
            (id, offset)
        }
        _ => return Err(LinkError::Proto(format!("PSYNC refused: {reply}"))),
    };
    repl.set_link(|l| {
        l.state = "connected";
        l.replid = replid.clone();
        l.offset = offset;
        l.last_io = Instant::now();
    });
    info!("replication link up at offset {offset} of {replid}");
    ack(&mut out, offset)?;
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    loop {
        if !r.current() {
            return Err(LinkError::Superseded);
        }
        let (kind, body) = read_frame(&mut input)?;
        touch(repl);
        match kind {
            b'P' => {
                ack(&mut out, offset)?;
                continue;
            }
            b'B' => {}
            k => return Err(LinkError::Proto(format!("unexpected frame {k}"))),
        }
        let mut next = offset + (FRAME_HEADER + body.len()) as u64;
        let mut size = body.len();
        payloads.push(body);
        // Whatever further batches have already arrived go in the same write.
        while size < APPLY_MAX && frame_buffered(&input) {
            let (kind, body) = read_frame(&mut input)?;
            match kind {
                b'P' => {}
                b'B' => {
                    next += (FRAME_HEADER + body.len()) as u64;
                    size += body.len();
                    payloads.push(body);
                }
                k => return Err(LinkError::Proto(format!("unexpected frame {k}"))),
            }
        }
        r.write(WriteOp::Replicate(Box::new(Replicated {
            payloads: std::mem::take(&mut payloads),
            replid: replid.clone(),
            offset: next,
        })))?;
        offset = next;
        repl.set_link(|l| l.offset = offset);
        ack(&mut out, offset)?;
    }
}

fn ack(out: &mut impl Write, offset: u64) -> io::Result<()> {
    command(out, &["REPLCONF", "ACK", &offset.to_string()])
}

/// Whether a whole frame is already in the reader's buffer.
fn frame_buffered(input: &BufReader<TcpStream>) -> bool {
    let b = input.buffer();
    b.len() >= FRAME_HEADER
        && b.len() >= FRAME_HEADER + u32::from_le_bytes([b[1], b[2], b[3], b[4]]) as usize
}

fn read_frame(input: &mut impl Read) -> Result<(u8, Vec<u8>), LinkError> {
    let mut h = [0u8; FRAME_HEADER];
    input.read_exact(&mut h)?;
    let len = u32::from_le_bytes([h[1], h[2], h[3], h[4]]) as usize;
    // A batch can be as large as the log allows; read it in steps, never trusting the length
    // for one allocation.
    let mut body = Vec::with_capacity(len.min(CHUNK));
    input.take(len as u64).read_to_end(&mut body)?;
    if body.len() != len {
        return Err(LinkError::Proto("the primary closed the connection".into()));
    }
    Ok((h[0], body))
}

/// Receives a full copy and installs it: the writer takes the chunks as they arrive.
fn take_copy(
    r: &mut Receiving<'_>,
    input: &mut BufReader<TcpStream>,
    replid: &str,
    offset: u64,
) -> Result<(), LinkError> {
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::sync_channel(COPY_QUEUE);
    r.submit(WriteOp::ReplInstall(Box::new(ReplInstall {
        source: CopySource::new(rx),
        replid: replid.to_string(),
        offset,
    })))?;
    // The writer waits on the channel: whatever happens here, the sender is dropped before
    // the outcome is awaited (a copy that ends without `End` is abandoned).
    let received = pass_copy(r, input, tx);
    let installed = r.outcome();
    received?;
    installed?;
    info!(
        "full copy received and installed in {} ms",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// Hands a full copy's chunks to the writer as they arrive, until the end frame.
fn pass_copy(
    r: &Receiving<'_>,
    input: &mut BufReader<TcpStream>,
    tx: std::sync::mpsc::SyncSender<CopyChunk>,
) -> Result<(), LinkError> {
    let gone =
        |_| LinkError::Local("this replica could not install the full copy (see above)".into());
    loop {
        if !r.current() {
            return Err(LinkError::Superseded);
        }
        let (kind, body) = read_frame(input)?;
        r.shared.repl.set_link(|l| l.last_io = Instant::now());
        match kind {
            b'S' => tx.send(CopyChunk::Records(body)).map_err(gone)?,
            b'E' => return tx.send(CopyChunk::End).map_err(gone),
            b'P' => {}
            k => return Err(LinkError::Proto(format!("unexpected frame {k} in a copy"))),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Commands: REPLCONF, PSYNC/SYNC, ROLE, REPLICAOF/SLAVEOF, WAIT, and INFO's section.

use crate::commands::{Args, Cmd};
use crate::protocol::resp::{enc, parse_i64};

const READONLY: &str = "READONLY You can't write against a read only replica.";

/// The error a write gets on a replica (RESP).
pub fn readonly_error() -> String {
    READONLY.to_string()
}

/// The same words for memcached's text and meta protocols.
pub const MC_READONLY: &str = "SERVER_ERROR You can't write against a read only replica.";

/// A write refused for want of replicas (`min-replicas-to-write`): RESP, and memcached's text
/// and meta protocols with the same words.
pub const NOREPLICAS: &str = "NOREPLICAS Not enough good replicas to write.";
pub const MC_NOREPLICAS: &str = "SERVER_ERROR Not enough good replicas to write.";

/// Runs a replication command (WAIT may leave `sess.wait` set and write nothing: not yet).
pub fn run(
    cmd: Cmd,
    args: Args<'_>,
    out: &mut Vec<u8>,
    sess: &mut super::resp::Session,
    pass: &super::worker::Pass<'_>,
) {
    let shared = pass.shared;
    let repl = &shared.repl;
    let text = |i: usize| String::from_utf8_lossy(args.get(i)).into_owned();
    match cmd {
        Cmd::ReplConf => {
            let mut i = 1;
            while i + 1 < args.len() {
                if args.is(i, "listening-port") {
                    match text(i + 1).parse::<u16>() {
                        Ok(p) => sess.repl_port = p,
                        Err(_) => return enc::error(out, "ERR value is out of range"),
                    }
                } else if args.is(i, "ip-address") {
                    let ip = text(i + 1);
                    // Redis keeps at most NET_HOST_STR_LEN - 1 bytes of it.
                    if ip.len() >= 256 {
                        return enc::error(
                            out,
                            &format!(
                                "ERR REPLCONF ip-address provided by replica instance is too long: {} bytes",
                                ip.len()
                            ),
                        );
                    }
                    sess.repl_ip = (!ip.is_empty()).then_some(ip);
                }
                i += 2;
            }
            if args.len().is_multiple_of(2) {
                return enc::error(out, "ERR syntax error");
            }
            enc::ok(out);
        }
        Cmd::Psync | Cmd::Sync => {
            if repl.hub().is_none() {
                return enc::error(out, "ERR replication is not set up");
            }
            if repl.is_replica() {
                return enc::error(
                    out,
                    "ERR memkeep replicas do not serve replicas of their own (no chained replication)",
                );
            }
            let (id, off) = if cmd == Cmd::Psync {
                match parse_i64(args.get(2)) {
                    Some(o) => (text(1), o),
                    None => return enc::error(out, crate::commands::NOT_INTEGER),
                }
            } else {
                ("?".to_string(), -1)
            };
            // Answered by the sender thread once the worker hands the connection over.
            sess.psync = Some((id, off));
        }
        Cmd::Role => role(out, repl),
        Cmd::ReplicaOf => {
            if args.is(1, "no") && args.is(2, "one") {
                if repl.is_replica() {
                    match repl.shared() {
                        Some(s) => promote(&s),
                        None => return enc::error(out, "ERR replication is not set up"),
                    }
                }
                return enc::ok(out);
            }
            let host = text(1);
            let Some(port) = text(2).parse::<u16>().ok().filter(|&p| p != 0) else {
                return enc::error(out, "ERR Invalid master port");
            };
            if let Some(l) = repl.link()
                && l.host == host
                && l.port == port
            {
                return enc::simple(out, "OK Already connected to specified master");
            }
            let Some(s) = repl.shared() else {
                return enc::error(out, "ERR replication is not set up");
            };
            match replicate_from(&s, host, port, false) {
                Ok(()) => enc::ok(out),
                Err(e) => enc::error(out, &format!("ERR {e}")),
            }
        }
        Cmd::Wait => wait(args, out, sess, repl),
        _ => enc::error(out, "ERR unknown replication command"),
    }
}

/// WAIT numreplicas timeout: answers once that many replicas acknowledged the stream as it
/// was when WAIT arrived (which covers every write of this client before it), or at the
/// timeout. Until then `sess.wait` stays set and nothing is written: the worker runs it again.
fn wait(args: Args<'_>, out: &mut Vec<u8>, sess: &mut super::resp::Session, repl: &Repl) {
    let (Some(n), Some(t)) = (parse_i64(args.get(1)), parse_i64(args.get(2))) else {
        sess.wait = None;
        return match parse_i64(args.get(1)) {
            None => enc::error(out, crate::commands::NOT_INTEGER),
            Some(_) => enc::error(out, "ERR timeout is not an integer or out of range"),
        };
    };
    if t < 0 {
        sess.wait = None;
        return enc::error(out, "ERR timeout is negative");
    }
    if repl.is_replica() {
        sess.wait = None;
        return enc::error(
            out,
            "ERR WAIT cannot be used with replica instances. Please also note that since Redis 4.0 if a replica is configured to be writable (which is not the default) writes to replicas are just local and are not propagated.",
        );
    }
    let offset = repl.hub().map_or(0, |h| h.offset());
    let (target, deadline) = *sess.wait.get_or_insert_with(|| {
        (
            offset,
            (t > 0).then(|| Instant::now() + Duration::from_millis(t as u64)),
        )
    });
    let acked = repl.acked(target);
    // Inside EXEC it cannot wait (the transaction's replies go out together): it answers how
    // many have acknowledged now, as Redis does for a blocking command in MULTI.
    let in_exec = sess.in_exec.is_some();
    if in_exec || n <= 0 || acked >= n as usize || deadline.is_some_and(|d| Instant::now() >= d) {
        sess.wait = None;
        enc::int(out, acked as i64);
    }
}

fn role(out: &mut Vec<u8>, repl: &Repl) {
    match repl.link() {
        Some(l) => {
            enc::array(out, 5);
            enc::bulk(out, b"slave");
            enc::bulk(out, l.host.as_bytes());
            enc::int(out, l.port as i64);
            enc::bulk(out, l.state.as_bytes());
            enc::int(out, l.offset as i64);
        }
        None => {
            let peers = repl.peers();
            enc::array(out, 3);
            enc::bulk(out, b"master");
            enc::int(out, repl.position().1 as i64);
            enc::array(out, peers.len());
            for p in peers {
                enc::array(out, 3);
                enc::bulk(out, p.ip.as_bytes());
                enc::bulk(out, p.port.to_string().as_bytes());
                enc::bulk(out, p.ack.load(Ordering::Acquire).to_string().as_bytes());
            }
        }
    }
}

/// INFO's replication section, with Redis's fields.
pub fn info(repl: &Repl, backlog_size: u64) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let (replid, offset) = repl.position();
    let link = repl.link();
    let peers = repl.peers();
    match &link {
        Some(l) => {
            let up = l.state == "connected";
            let _ = write!(
                s,
                "role:slave\r\nmaster_host:{}\r\nmaster_port:{}\r\nmaster_link_status:{}\r\nmaster_last_io_seconds_ago:{}\r\nmaster_sync_in_progress:{}\r\nslave_read_repl_offset:{offset}\r\nslave_repl_offset:{offset}\r\n",
                l.host,
                l.port,
                if up { "up" } else { "down" },
                if up {
                    l.last_io.elapsed().as_secs() as i64
                } else {
                    -1
                },
                u8::from(l.state == "sync"),
            );
            if !up {
                let _ = write!(
                    s,
                    "master_link_down_since_seconds:{}\r\n",
                    l.down_since.elapsed().as_secs()
                );
            }
            let _ = write!(
                s,
                "slave_priority:{}\r\nslave_read_only:1\r\nreplica_announced:1\r\n",
                repl.settings().priority
            );
        }
        None => s.push_str("role:master\r\n"),
    }
    let _ = write!(s, "connected_slaves:{}\r\n", peers.len());
    for (i, p) in peers.iter().enumerate() {
        let lag = lock(&p.ack_at).elapsed().as_secs();
        let _ = write!(
            s,
            "slave{i}:ip={},port={},state={},offset={},lag={lag}\r\n",
            p.ip,
            p.port,
            lock(&p.state),
            p.ack.load(Ordering::Acquire)
        );
    }
    let (first, histlen) = repl.hub().map_or((0, 0), |h| h.backlog_span());
    // After a promotion, the old primary's id and where this server took over (Redis's
    // second_repl_offset is the first byte no longer served under it).
    let (replid2, second) = match repl
        .hub()
        .and_then(|h| h.previous())
        .filter(|_| link.is_none())
    {
        Some((id, until)) => (id, (until + 1) as i64),
        None => ("0".repeat(40), -1),
    };
    let _ = write!(
        s,
        "master_failover_state:no-failover\r\nmaster_replid:{replid}\r\nmaster_replid2:{replid2}\r\nmaster_repl_offset:{offset}\r\nsecond_repl_offset:{second}\r\nrepl_backlog_active:{}\r\nrepl_backlog_size:{backlog_size}\r\nrepl_backlog_first_byte_offset:{}\r\nrepl_backlog_histlen:{histlen}\r\n",
        u8::from(link.is_none() && repl.hub().is_some_and(|h| h.active())),
        first + 1,
    );
    let _ = write!(
        s,
        "memkeep_full_copies_served:{}\r\nmemkeep_continues_served:{}\r\nmemkeep_full_copies_taken:{}\r\nmemkeep_continues_taken:{}\r\n",
        repl.sync_full.load(Ordering::Relaxed),
        repl.sync_partial_ok.load(Ordering::Relaxed),
        repl.copies_taken.load(Ordering::Relaxed),
        repl.resumes.load(Ordering::Relaxed),
    );
    s
}

// ---------------------------------------------------------------------------------------
// CONFIG GET / SET / REWRITE of the replication settings.

/// The replication parameters CONFIG GET answers, Redis's names and aliases with their values.
pub fn config_params(repl: &Repl) -> Vec<(&'static str, String)> {
    let s = repl.settings();
    let replicaof = repl
        .link()
        .map_or_else(String::new, |l| format!("{} {}", l.host, l.port));
    vec![
        ("replica-priority", s.priority.to_string()),
        ("slave-priority", s.priority.to_string()),
        ("replica-announce-ip", s.announce_ip.clone()),
        ("slave-announce-ip", s.announce_ip),
        ("replica-announce-port", s.announce_port.to_string()),
        ("slave-announce-port", s.announce_port.to_string()),
        ("replica-read-only", "yes".into()),
        ("slave-read-only", "yes".into()),
        ("replicaof", replicaof.clone()),
        ("slaveof", replicaof),
        ("min-replicas-to-write", s.min_to_write.to_string()),
        ("min-slaves-to-write", s.min_to_write.to_string()),
        ("min-replicas-max-lag", s.max_lag.to_string()),
        ("min-slaves-max-lag", s.max_lag.to_string()),
    ]
}

/// CONFIG SET name value [name value ...] for the replication settings, all or none (as Redis
/// 7 applies several). Returns false, having written nothing, when a parameter is not one of
/// them (the caller answers for it).
pub fn config_set(args: Args<'_>, out: &mut Vec<u8>, repl: &Repl) -> bool {
    if !args.len().is_multiple_of(2) {
        enc::error(out, "ERR syntax error");
        return true;
    }
    let mut next = repl.settings();
    let mut seen: Vec<&'static str> = Vec::new();
    for i in (2..args.len()).step_by(2) {
        let (name, value) = (args.get(i), args.get(i + 1));
        let Some(canonical) = setting_name(name) else {
            return false;
        };
        let why = if seen.contains(&canonical) {
            Some("duplicate parameter".to_string())
        } else {
            seen.push(canonical);
            set_one(&mut next, canonical, value).err()
        };
        if let Some(why) = why {
            enc::error(
                out,
                &format!(
                    "ERR CONFIG SET failed (possibly related to argument '{}') - {why}",
                    String::from_utf8_lossy(name)
                ),
            );
            return true;
        }
    }
    repl.set_settings(next);
    enc::ok(out);
    true
}

/// A settable replication parameter's canonical name (Redis's `slave-*` aliases included).
fn setting_name(name: &[u8]) -> Option<&'static str> {
    Some(match name.to_ascii_lowercase().as_slice() {
        b"replica-priority" | b"slave-priority" => "replica-priority",
        b"replica-announce-ip" | b"slave-announce-ip" => "replica-announce-ip",
        b"replica-announce-port" | b"slave-announce-port" => "replica-announce-port",
        b"replica-read-only" | b"slave-read-only" => "replica-read-only",
        b"min-replicas-to-write" | b"min-slaves-to-write" => "min-replicas-to-write",
        b"min-replicas-max-lag" | b"min-slaves-max-lag" => "min-replicas-max-lag",
        _ => return None,
    })
}

/// Applies one parameter to `s`, or says why not in Redis's words.
fn set_one(s: &mut Settings, name: &str, value: &[u8]) -> Result<(), String> {
    let int = |max: i64| match parse_i64(value) {
        None => Err("argument couldn't be parsed into an integer".to_string()),
        Some(n) if !(0..=max).contains(&n) => {
            Err(format!("argument must be between 0 and {max} inclusive"))
        }
        Some(n) => Ok(n),
    };
    match name {
        "replica-priority" => s.priority = int(i32::MAX as i64)? as u32,
        "replica-announce-port" => s.announce_port = int(u16::MAX as i64)? as u16,
        "replica-announce-ip" => s.announce_ip = String::from_utf8_lossy(value).into_owned(),
        "min-replicas-to-write" => s.min_to_write = int(i32::MAX as i64)? as u32,
        "min-replicas-max-lag" => s.max_lag = int(i32::MAX as i64)? as u32,
        // memkeep replicas always refuse writes: `yes` is what they are already.
        _ if value.eq_ignore_ascii_case(b"yes") => {}
        _ if value.eq_ignore_ascii_case(b"no") => {
            return Err("memkeep replicas are always read-only".into());
        }
        _ => return Err("argument must be 'yes' or 'no'".into()),
    }
    Ok(())
}

/// CONFIG REWRITE: writes the replication settings in force (`replica_of` after REPLICAOF,
/// and what CONFIG SET changed) into the config file the server was started with, keeping
/// every other line as it is. Without a config file it answers as Redis does.
pub fn config_rewrite(out: &mut Vec<u8>, shared: &Shared) {
    let Some(path) = &shared.config.config_file else {
        return enc::error(out, "ERR The server is running without a config file");
    };
    let repl = &shared.repl;
    let s = repl.settings();
    let defaults = crate::config::Config::default();
    let entries: [(&str, toml::Value, bool); 6] = [
        (
            "replica_of",
            toml::Value::String(repl.target()),
            repl.link().is_some(),
        ),
        (
            "replica_priority",
            toml::Value::Integer(s.priority as i64),
            s.priority != defaults.replica_priority,
        ),
        (
            "replica_announce_ip",
            toml::Value::String(s.announce_ip.clone()),
            !s.announce_ip.is_empty(),
        ),
        (
            "replica_announce_port",
            toml::Value::Integer(s.announce_port as i64),
            s.announce_port != 0,
        ),
        (
            "min_replicas_to_write",
            toml::Value::Integer(s.min_to_write as i64),
            s.min_to_write != defaults.min_replicas_to_write,
        ),
        (
            "min_replicas_max_lag",
            toml::Value::Integer(s.max_lag as i64),
            s.max_lag != defaults.min_replicas_max_lag,
        ),
    ];
    match rewrite_file(path, &entries) {
        Ok(()) => enc::ok(out),
        Err(e) => {
            warn!("CONFIG REWRITE of {}: {e}", path.display());
            enc::error(out, &format!("ERR Rewriting config file: {e}"));
        }
    }
}

/// Sets each `key = value` of `entries` in the TOML file at `path`: a line that sets the key
/// is replaced; a key with no line is added at the end when its flag says
/// it differs from the default. The new text must parse as a memkeep config; it is written
/// beside the file, synced and renamed over it, so a crash leaves the old file or the new.
fn rewrite_file(path: &std::path::Path, entries: &[(&str, toml::Value, bool)]) -> io::Result<()> {
    let old = std::fs::read_to_string(path)?;
    let mut done = vec![false; entries.len()];
    let mut lines: Vec<String> = Vec::new();
    // memkeep's settings are all top-level keys (a table would not parse as its config).
    for line in old.lines() {
        let t = line.trim_start();
        let key = t.split('=').next().map(str::trim).unwrap_or("");
        let hit = if t.starts_with('#') || !t.contains('=') {
            None
        } else {
            entries.iter().position(|(k, ..)| *k == key)
        };
        match hit {
            // A second line for the same key (TOML would refuse it anyway) is dropped.
            Some(i) if done[i] => {}
            Some(i) => {
                lines.push(format!("{} = {}", entries[i].0, entries[i].1));
                done[i] = true;
            }
            None => lines.push(line.to_string()),
        }
    }
    let mut added = false;
    for (i, (k, v, differs)) in entries.iter().enumerate() {
        if !done[i] && *differs {
            if !added {
                lines.push("# Written by CONFIG REWRITE.".into());
                added = true;
            }
            lines.push(format!("{k} = {v}"));
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    crate::config::Config::from_toml(&text)
        .map_err(|e| io::Error::other(format!("the rewritten file would not parse: {e}")))?;
    let tmp = path.with_extension("rewrite.tmp");
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        drop(f);
        // Keep the file's permissions.
        if let Ok(m) = std::fs::metadata(path) {
            std::fs::set_permissions(&tmp, m.permissions())?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
