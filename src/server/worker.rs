//! One worker thread: a mio `Poll`, a `Slab` of connections, and one event-loop pass at a time.
//!
//! A pass has two phases, so that every read sees every write acknowledged before its request
//! arrived:
//! 1. take new connections, drain write completions from the writer (encoding their replies),
//!    and read every readable socket into its buffer;
//! 2. take one snapshot (lazily, only if a read needs it; see `storage/overlay.rs`), run the buffered
//!    requests of each touched connection (up to a budget each, so no client starves the
//!    others), flush replies, then hand the pass's writes to the writer in one submission.
//!
//! A connection with writes in flight may queue more writes behind them, but anything answered
//! at once (a read, an error, `stats`) waits until those writes' replies are out: replies leave
//! strictly in request order.

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{debug, error, info};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::Shared;
use super::conn::{Conn, Proto};
use super::memcache::{self, McReply};
use super::stats::Counters;
use super::uring::ColdRing;
use crate::command::Outcome;
use crate::engine::writer::{Completion, Gate, Mailbox, Submission, Submitted, WriteRequest};
use crate::protocol::memcache::Limits;
use crate::storage::StoreError;
use crate::storage::lmdb::LmdbStore;
use crate::storage::overlay::Snap;
use crate::storage::overlay::{ColdKey, KeptTxn};
use crate::storage::resident::Fetched;

pub const WAKER: Token = Token(usize::MAX);
/// Most connections a worker may have and still spin before sleeping (`Worker::spin_poll`):
/// with more, other clients are likely runnable and would lose the CPU to the spin (at 16
/// connections, 8 per worker, a limit of 64 measured 62.8k SET/s against 75.9k not spinning
/// in one sweep, and the other way round in another: no clear gain for the risk).
const SPIN_CONNS: usize = 4;

/// Whether some worker is spinning (`Worker::spin_poll`): one at a time.
static SPINNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Workers not asleep in their poll (`Worker::spin_poll` spins only when it is alone).
static AWAKE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The worker's ring of cold reads (`uring.rs`): readable when reads have finished.
const RING: Token = Token(usize::MAX - 1);
/// Requests one connection may run per pass before others get their turn.
const BUDGET: usize = 64;
/// How long a stopping worker waits for in-flight writes and unsent replies.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Routes a write completion back to its connection and says how to encode it.
#[derive(Debug, Clone, Copy)]
pub struct Tag {
    pub slot: u32,
    pub epoch: u32,
    pub reply: Reply,
}

#[derive(Debug, Clone, Copy)]
pub enum Reply {
    Mc { noreply: bool, kind: McReply },
    Resp { kind: super::resp::RespReply },
    Bin(super::binary::BinReply),
}

/// Why a connection's processing stopped this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Nothing complete is buffered.
    NeedInput,
    /// The budget ran out with input left: revisit next pass.
    Budget,
    /// Waiting for write completions or for the client to read its replies.
    Blocked,
    /// Held back by CLIENT PAUSE: revisit when the pause ends.
    Paused,
    /// WAIT for replicas' acknowledgements: revisit in a few milliseconds.
    ReplWait,
    /// Close after flushing.
    Close,
}

/// What the acceptor and the writer share with a worker.
pub struct WorkerHandle {
    pub mailbox: Arc<Mailbox<Tag>>,
    pub incoming: Mutex<Vec<(std::net::TcpStream, Proto, bool)>>,
    /// Connections (slot, epoch) whose cold values a reader thread has read (`cold.rs`).
    pub warmed: Mutex<Vec<(u32, u32, Vec<Fetched>)>>,
}

/// How many times in a row one connection's request may wait for a reader thread; past that
/// (its pages were evicted again before it ran: memory is very short) it reads from the map.
const COLD_TRIES: u8 = 3;

/// At most this much output of a pass waits for the writes the pass queued (see `phase_two`).
const HOLD_OUTPUT: usize = 16 * 1024;

/// Per-pass context handed to protocol code.
pub struct Pass<'a> {
    pub shared: &'a Shared,
    /// The worker running the pass.
    pub worker: usize,
    /// Blocking pops begun this pass that time out: (deadline, registry id).
    pub timers: &'a mut Vec<(Instant, u64)>,
    pub counters: &'a Counters,
    pub limits: Limits,
    pub now_ms: u64,
    flush_at: u64,
    pub pending: &'a mut Vec<WriteRequest<Tag>>,
    store: &'a LmdbStore,
    snap: Option<Snap<'a>>,
    /// Whether reads check large records for residency (`storage/resident.rs`) for the
    /// connection at hand.
    cold_checks: bool,
    /// Records read for the connection at hand, until the snapshot opens.
    fetched: Vec<Fetched>,
}

impl<'a> Pass<'a> {
    /// The pass's snapshot (an LMDB read transaction and the acknowledged writes LMDB has
    /// not committed yet), taken on first use: after phase one has drained the completions,
    /// so it holds every write acknowledged before a request of this pass was read.
    pub fn snap(&mut self) -> Result<&Snap<'a>, StoreError> {
        if self.snap.is_none() {
            let mut snap = Snap::open(self.store)?;
            snap.set_cold_checks(self.cold_checks);
            snap.set_fetched(std::mem::take(&mut self.fetched));
            self.snap = Some(snap);
        }
        self.snap
            .as_ref()
            .ok_or_else(|| StoreError::Backend("read transaction missing".into()))
    }

    /// Closes the pass's read transaction, so the next read opens a newer snapshot (WATCH: the
    /// reads after it must not come from a snapshot older than the versions it took).
    pub fn fresh_snapshot(&mut self) {
        self.snap = None;
    }

    /// Whether a read of this connection's found a cold record: the request that found it
    /// stays in the input (or keeps its resume point), and runs again once it is read in.
    pub fn deferred(&self) -> bool {
        self.snap.as_ref().is_some_and(|s| s.found_cold())
    }

    /// Whether the last request's read stopped at a collection changed after the pass's
    /// snapshot (`Snap::note_pending`); forgets it.
    pub fn take_pending(&self) -> bool {
        self.snap.as_ref().is_some_and(|s| s.take_pending())
    }

    /// Sets up reads for the next connection: residency checks on or off, and the records
    /// read for it (replacing the previous connection's, which are dropped).
    fn for_conn(&mut self, checks: bool, fetched: Vec<Fetched>) {
        self.cold_checks = checks;
        match &mut self.snap {
            Some(s) => {
                s.set_cold_checks(checks);
                s.set_fetched(fetched);
            }
            None => self.fetched = fetched,
        }
    }

    /// The cold records the last request found, and the transaction whose snapshot found
    /// them (to keep open while they are read).
    fn take_cold(&mut self) -> (Vec<ColdKey>, Option<KeptTxn>) {
        let cold = match self.snap.as_ref() {
            Some(s) => s.take_cold(),
            None => return (Vec::new(), None),
        };
        if cold.is_empty() {
            return (cold, None);
        }
        match self.snap.take() {
            Some(s) => {
                let (s, txn) = s.keep();
                self.snap = Some(s);
                (cold, txn)
            }
            None => (cold, None),
        }
    }

    /// A delayed flush_all has come due: every item read now is gone.
    pub fn flushed(&self) -> bool {
        self.flush_at != 0 && self.flush_at <= self.now_ms
    }
}

pub struct Worker {
    id: usize,
    poll: Poll,
    conns: Slab<Conn>,
    shared: Arc<Shared>,
    handle: Arc<WorkerHandle>,
    gate: Gate<Tag>,
    /// The last pass committed its own writes: their outcomes wait in the mailbox.
    completed_here: bool,
    pending: Vec<WriteRequest<Tag>>,
    completions: Vec<Completion<Tag>>,
    deliveries: Vec<super::pubsub::Delivery>,
    /// Blocking pops of this worker's connections that time out, by deadline: (deadline, id).
    timers: BTreeSet<(Instant, u64)>,
    new_timers: Vec<(Instant, u64)>,
    /// Connections whose next request waits for CLIENT PAUSE to end.
    paused: Vec<usize>,
    /// Connections in WAIT (see `Stop::ReplWait`).
    repl_wait: Vec<usize>,
    /// Connections CLIENT KILL asked this worker to close: (slot, epoch).
    kills: Vec<(u32, u32)>,
    dirty: Vec<usize>,
    next: Vec<usize>,
    next_epoch: u32,
    /// Close connections idle this long (`idle_timeout`), checked every half of it (at most 1 s).
    idle: Option<Duration>,
    next_idle_check: Instant,
    limits: Limits,
    read_cap: usize,
    /// A RESP connection's input may hold a request of two full-size bulks
    /// (`proto_max_bulk_len`), plus their header lines.
    resp_read_cap: usize,
    ring_done: Vec<super::uring::Done>,
}

impl Worker {
    pub fn new(
        id: usize,
        poll: Poll,
        shared: Arc<Shared>,
        handle: Arc<WorkerHandle>,
        gate: Gate<Tag>,
    ) -> Worker {
        let item_max = shared.config.max_item_size as usize;
        let limits = Limits {
            item_size_max: item_max,
            ..Limits::default()
        };
        // Room for the largest request: a full-size value with its command line, or a long get.
        let read_cap = (item_max + limits.max_line + 2).max(limits.max_multiget_line + 1);
        let resp_read_cap = (shared.config.proto_max_bulk_len as usize)
            .saturating_mul(2)
            .saturating_add(128 << 10)
            .max(read_cap);
        let idle = (shared.config.idle_timeout > 0)
            .then(|| Duration::from_secs(shared.config.idle_timeout));
        Worker {
            id,
            poll,
            conns: Slab::new(),
            shared,
            handle,
            gate,
            completed_here: false,
            pending: Vec::new(),
            completions: Vec::new(),
            deliveries: Vec::new(),
            timers: BTreeSet::new(),
            new_timers: Vec::new(),
            paused: Vec::new(),
            repl_wait: Vec::new(),
            kills: Vec::new(),
            dirty: Vec::new(),
            next: Vec::new(),
            next_epoch: 0,
            idle,
            next_idle_check: Instant::now(),
            limits,
            read_cap,
            resp_read_cap,
            ring_done: Vec::new(),
        }
    }

    /// Sets up the worker's ring of cold reads, when there are reader threads at all (the
    /// ring shares their budget and descriptor) and the kernel allows one.
    ///
    /// The ring lives on the worker's thread (`run`), not in `Worker`: the transactions it
    /// keeps open are the thread's.
    fn start_ring(&mut self) -> Option<ColdRing> {
        let pool = self.shared.cold.as_ref()?;
        if std::env::var_os("MEMKEEP_COLD_URING").is_some_and(|v| v == "0") {
            return None;
        }
        let ring = pool
            .file()
            .and_then(|f| ColdRing::new(f, pool.direct_file(), pool.held()))
            .and_then(|r| {
                self.poll.registry().register(
                    &mut mio::unix::SourceFd(&r.fd()),
                    RING,
                    Interest::READABLE,
                )?;
                Ok(r)
            });
        match ring {
            Ok(r) => Some(r),
            Err(e) => {
                if self.id == 0 {
                    info!("no io_uring for cold reads ({e}): reader threads read them");
                }
                None
            }
        }
    }

    /// Polls the sockets without sleeping for up to `spin`, before the event loop would sleep;
    /// true when that found events (in `events`).
    ///
    /// Why: a client with one request at a time leaves the worker idle between replies, and on
    /// a VM whose idle CPUs halt (this machine's `haltpoll` polls for 0 ns), waking a sleeping
    /// worker costs tens of microseconds on top of the client's own wake-up. W1 SET at one
    /// connection in `never`: 12.6k and 13.4k/s sleeping, 28.6k and 29.2k/s spinning 50 us
    /// (same run, alternating). It must not take CPU that others need, so a worker spins only
    /// when every other worker is asleep in its poll, no other worker is spinning, and it has
    /// nothing in flight (no write waiting for the writer, no disk read on its ring) and at most
    /// `SPIN_CONNS` connections. Without the first rule, two connections on two workers ran
    /// 10-30% slower (one worker spinning on a core the clients needed); with it, 2 and 4
    /// connections ran within noise of not spinning over three alternating rounds, and W4a (2
    /// connections, 300k SETs then GETs) ran SET 65.1k/s against 47.0k/s, with less CPU per
    /// request (17.0 s per million against 20.9: no sleep and wake-up per request).
    fn spin_poll(&mut self, events: &mut Events, spin: Duration, ring: Option<&ColdRing>) -> bool {
        if ring.is_some_and(|r| r.in_flight())
            || self.conns.len() > SPIN_CONNS
            || self.conns.iter().any(|(_, c)| c.inflight > 0)
            || AWAKE.load(Ordering::Relaxed) > 1
            || SPINNING
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let until = Instant::now() + spin;
        let found = loop {
            if self.poll.poll(events, Some(Duration::ZERO)).is_err() {
                break false;
            }
            if !events.is_empty() {
                break true;
            }
            if Instant::now() >= until || self.shared.shutdown.load(Ordering::Relaxed) {
                break false;
            }
            std::hint::spin_loop();
        };
        SPINNING.store(false, Ordering::Release);
        found
    }

    pub fn run(mut self) {
        // Reads of cold records on this worker's own ring (`uring.rs`); None where io_uring is
        // unavailable (or `MEMKEEP_COLD_URING=0`): the reader threads read them.
        let mut ring = self.start_ring();
        let mut events = Events::with_capacity(1024);
        let store = self.shared.store.clone();
        let mut give_up: Option<Instant> = None;
        // Polling before sleeping (`spin_us`): not in `always`, where each write waits for the
        // disk anyway and a spinning worker took CPU from the commit path (measured slower).
        let spin = (self.shared.config.spin_us > 0
            && self.shared.config.sync != crate::config::SyncMode::Always)
            .then(|| Duration::from_micros(self.shared.config.spin_us));
        let mut skipped_poll = false;
        AWAKE.fetch_add(1, Ordering::Relaxed);
        loop {
            let stopping = self.shared.shutdown.load(Ordering::Acquire);
            if stopping {
                if give_up.is_none() {
                    // Blocked clients would wait forever: they get their timeout reply now.
                    self.unblock_all();
                }
                // Finish what is in flight, but never wait forever on a client that stopped reading.
                let deadline = *give_up.get_or_insert_with(|| Instant::now() + SHUTDOWN_GRACE);
                if self.drained() || Instant::now() >= deadline {
                    break;
                }
            }
            let timeout = if !self.next.is_empty() || self.completed_here {
                Some(Duration::ZERO)
            } else if ring.as_ref().is_some_and(|r| r.pending_submit()) {
                // The kernel took none of the last reads queued: try again soon.
                Some(Duration::from_millis(1))
            } else if stopping {
                Some(Duration::from_millis(10))
            } else if self.idle.is_some() {
                Some(
                    self.next_idle_check
                        .saturating_duration_since(Instant::now()),
                )
            } else {
                None
            };
            // Wake for the next blocking pop to time out, and for CLIENT PAUSE to end.
            let wake_at = self
                .timers
                .first()
                .map(|&(d, _)| d)
                .into_iter()
                .chain(
                    (!self.paused.is_empty())
                        .then(|| self.shared.pause.ends())
                        .flatten(),
                )
                .min();
            // WAIT polls the replicas' acknowledgements.
            let wake_at = wake_at
                .into_iter()
                .chain(
                    (!self.repl_wait.is_empty()).then(|| Instant::now() + Duration::from_millis(5)),
                )
                .min();
            let timeout = match (timeout, wake_at) {
                (t, None) => t,
                (None, Some(d)) => Some(d.saturating_duration_since(Instant::now())),
                (Some(t), Some(d)) => Some(t.min(d.saturating_duration_since(Instant::now()))),
            };
            // Writes this worker committed itself (leader): their replies are in the mailbox
            // now, so the next pass can run at once, without asking the kernel first (a poll
            // that would return nothing new costs a system call per write at low load). Only
            // once in a row, so sockets are still polled at least every other pass.
            let skip_poll = self.completed_here && !skipped_poll && !stopping;
            skipped_poll = skip_poll;
            let spun = match spin {
                Some(spin) if !skip_poll && timeout != Some(Duration::ZERO) => {
                    self.spin_poll(&mut events, spin, ring.as_ref())
                }
                _ => false,
            };
            if skip_poll {
                events.clear();
            } else if spun {
                // `events` holds what the spin found.
            } else if let Err(e) = {
                let sleeps = timeout != Some(Duration::ZERO);
                if sleeps {
                    AWAKE.fetch_sub(1, Ordering::Relaxed);
                }
                let r = self.poll.poll(&mut events, timeout);
                if sleeps {
                    AWAKE.fetch_add(1, Ordering::Relaxed);
                }
                r
            } && e.kind() != io::ErrorKind::Interrupted
            {
                error!("worker {}: poll failed: {e}", self.id);
                break;
            }
            self.phase_one(&events, stopping, &mut ring);
            self.phase_two(&store, &mut ring);
            self.expire_blocked();
            if !self.paused.is_empty() && !self.shared.pause.active() {
                self.next.append(&mut self.paused);
            }
            self.next.append(&mut self.repl_wait);
            if let Some(idle) = self.idle
                && Instant::now() >= self.next_idle_check
            {
                self.kick_idle(idle);
            }
        }
        // This worker spins no more: it no longer counts as awake (`spin_poll`).
        AWAKE.fetch_sub(1, Ordering::Relaxed);
        for conn in self.conns.drain() {
            if let Some(info) = &conn.resp.info {
                self.shared.clients.remove(info.id);
            }
            drop(conn);
            self.shared
                .gauges
                .curr_connections
                .fetch_sub(1, Ordering::Relaxed);
        }
        debug!("worker {} stopped", self.id);
    }

    /// Closes connections that have sent nothing for `idle` (slowloris clients holding a
    /// connection with a partial line); never one whose writes are still in flight, nor a
    /// pub/sub subscriber (it only listens; Redis exempts them from its timeout too).
    fn kick_idle(&mut self, idle: Duration) {
        let now = Instant::now();
        let idle_keys: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.inflight == 0
                    && c.resp.subs.count() == 0
                    && now.duration_since(c.last_active) >= idle
            })
            .map(|(k, _)| k)
            .collect();
        let shared = self.shared.clone();
        for key in idle_keys {
            debug!(
                "closing {:?}: idle for {idle:?}",
                self.conns.get(key).and_then(|c| c.peer)
            );
            Counters::bump(&shared.counters[self.id].idle_kicks);
            close_conn(&mut self.conns, &self.poll, &shared, &mut self.timers, key);
            if let Some(pos) = self.next.iter().position(|&k| k == key) {
                self.next.swap_remove(pos);
            }
        }
        self.next_idle_check = now + (idle / 2).min(Duration::from_secs(1));
    }

    /// Cancels the blocking pops whose time is up; each one's timeout reply comes back as its
    /// completion (the registry or the writer sends it, in order with the connection's writes).
    fn expire_blocked(&mut self) {
        self.timers.extend(self.new_timers.drain(..));
        let now = Instant::now();
        while let Some(&(d, id)) = self.timers.first() {
            if d > now {
                break;
            }
            self.timers.pop_first();
            self.shared
                .blocking
                .settle(id, crate::types::blocking::TIMED_OUT);
        }
    }

    /// At shutdown: every blocked client gets its timeout reply.
    fn unblock_all(&mut self) {
        for (_, c) in self.conns.iter() {
            if let Some(b) = c.resp.block {
                self.shared
                    .blocking
                    .settle(b.id, crate::types::blocking::TIMED_OUT);
            }
        }
    }

    /// During shutdown: nothing is waiting on the writer and no reply is unsent.
    fn drained(&self) -> bool {
        self.conns
            .iter()
            .all(|(_, c)| c.inflight == 0 && (c.pending_output() == 0 || c.broken))
    }

    fn mark(&mut self, key: usize) {
        if let Some(conn) = self.conns.get_mut(key)
            && !conn.dirty
        {
            conn.dirty = true;
            self.dirty.push(key);
        }
    }

    fn phase_one(&mut self, events: &Events, stopping: bool, ring: &mut Option<ColdRing>) {
        let shared = self.shared.clone();
        let counters = &shared.counters[self.id];
        // New connections.
        let incoming = std::mem::take(
            &mut *self
                .handle
                .incoming
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for (stream, proto, tls) in incoming {
            self.add_conn(stream, proto, tls);
        }
        // Write completions, in commit order.
        self.completed_here = false;
        self.handle.mailbox.drain_into(&mut self.completions);
        for Completion { tag, outcome } in self.completions.drain(..) {
            let key = tag.slot as usize;
            let block = match tag.reply {
                Reply::Resp {
                    kind: super::resp::RespReply::Block(id),
                } => Some(id),
                _ => None,
            };
            if let Some(id) = block {
                // Answered: its registry entry is gone (or, if the writer failed before
                // applying it, goes now).
                shared.blocking.forget(id);
            }
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            if conn.epoch != tag.epoch {
                continue;
            }
            if let Some(id) = block {
                match conn.resp.block {
                    Some(b) if b.id == id => {
                        if let Some(d) = b.deadline {
                            self.timers.remove(&(d, id));
                        }
                        if b.hung_up && outcome == Outcome::NilArray {
                            // Nothing popped for a client that hung up: it gets no reply, and
                            // its connection closes (it is at EOF).
                            conn.inflight -= 1;
                            conn.resp.block = None;
                            if !conn.dirty {
                                conn.dirty = true;
                                self.dirty.push(key);
                            }
                            continue;
                        }
                    }
                    _ => {
                        error!(
                            "a blocking pop's completion reached a connection not waiting for it"
                        );
                        continue;
                    }
                }
            }
            conn.inflight -= 1;
            match tag.reply {
                Reply::Mc {
                    kind: McReply::Meta,
                    ..
                } => super::meta::complete(
                    &mut conn.wbuf,
                    &mut conn.meta_echo,
                    outcome,
                    shared.store.hits().map(|h| &**h),
                    shared.clock.now_ms(),
                ),
                Reply::Mc { noreply, kind } => memcache::complete(
                    &mut conn.wbuf,
                    counters,
                    &shared.prefixes,
                    noreply,
                    kind,
                    outcome,
                ),
                Reply::Bin(r) => super::binary::complete(
                    &mut conn.wbuf,
                    &mut conn.meta_echo,
                    counters,
                    &shared.prefixes,
                    r,
                    outcome,
                ),
                Reply::Resp { kind } => super::resp::complete_write(
                    &mut conn.wbuf,
                    &mut conn.resp,
                    kind,
                    outcome,
                    &shared.command_stats[self.id],
                ),
            }
            if !conn.dirty {
                conn.dirty = true;
                self.dirty.push(key);
            }
        }
        // Reads finished on the ring: each record to its connection, which runs again once all
        // of its reads are back.
        if let (Some(ring), Some(pool)) = (ring.as_mut(), shared.cold.as_ref())
            && ring.in_flight()
        {
            ring.complete(&mut self.ring_done, pool.stats());
            for done in self.ring_done.drain(..) {
                let key = done.slot as usize;
                let Some(conn) = self.conns.get_mut(key) else {
                    continue;
                };
                if conn.epoch != done.epoch {
                    continue;
                }
                if let Some(r) = done.record {
                    conn.fetched.push(r);
                }
                conn.cold_reads = conn.cold_reads.saturating_sub(1);
                if conn.cold_reads == 0 && conn.cold_wait {
                    conn.cold_wait = false;
                    if !conn.fetched.is_empty() {
                        conn.cold_tries = 0;
                    }
                    if !conn.dirty {
                        conn.dirty = true;
                        self.dirty.push(key);
                    }
                }
            }
        }
        // Connections whose cold values are now in memory.
        let warmed =
            std::mem::take(&mut *self.handle.warmed.lock().unwrap_or_else(|p| p.into_inner()));
        for (slot, epoch, fetched) in warmed {
            let key = slot as usize;
            if let Some(conn) = self.conns.get_mut(key)
                && conn.epoch == epoch
            {
                conn.cold_wait = false;
                // Records to answer from: the request will get further this time. Only waits
                // that brought none count towards reading from the map instead.
                if !fetched.is_empty() {
                    conn.cold_tries = 0;
                }
                conn.fetched = fetched;
                self.mark(key);
            }
        }
        // Published messages for this worker's subscribers.
        shared.pubsub.drain(self.id, &mut self.deliveries);
        for d in self.deliveries.drain(..) {
            let key = d.slot as usize;
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            if conn.epoch != d.epoch || conn.broken || !conn.resp.subs.wants(&d.msg) {
                continue;
            }
            let size = d.msg.size();
            if conn.pending_output() + conn.resp.subs.held_bytes() + size
                > super::pubsub::OUTPUT_LIMIT
            {
                // Redis's pubsub hard limit: a subscriber that does not read is cut off rather
                // than growing the server.
                debug!(
                    "closing {:?}: subscriber output over {} bytes",
                    conn.peer,
                    super::pubsub::OUTPUT_LIMIT
                );
                Counters::bump(&counters.output_limit_disconnections);
                conn.broken = true;
            } else if conn.resp.mget_resume > 0 {
                // An MGET reply is half written: the message follows it.
                conn.resp.subs.hold(d.msg);
            } else {
                d.msg.encode(&mut conn.wbuf, conn.resp.v3);
            }
            if !conn.dirty {
                conn.dirty = true;
                self.dirty.push(key);
            }
        }
        // CLIENT KILL from any worker: close them this pass.
        shared.clients.take_kills(self.id, &mut self.kills);
        for (slot, epoch) in self.kills.drain(..) {
            if let Some(conn) = self.conns.get_mut(slot as usize)
                && conn.epoch == epoch
            {
                conn.broken = true;
                if !conn.dirty {
                    conn.dirty = true;
                    self.dirty.push(slot as usize);
                }
            }
        }
        // Connections left with work from the previous pass.
        for key in std::mem::take(&mut self.next) {
            self.mark(key);
        }
        for event in events.iter() {
            if event.token() == WAKER || event.token() == RING {
                continue;
            }
            let key = event.token().0;
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                conn.readable = true;
                conn.hup |= event.is_read_closed() || event.is_error();
            }
            self.mark(key);
        }
        // Read every touched socket before the read transaction opens.
        for &key in &self.dirty {
            if let Some(conn) = self.conns.get_mut(key)
                && conn.readable
                && !stopping
            {
                conn.fill(counters);
            }
        }
    }

    fn phase_two(&mut self, store: &LmdbStore, ring: &mut Option<ColdRing>) {
        let shared = &*self.shared;
        let counters = &shared.counters[self.id];
        let mut pass = Pass {
            shared,
            worker: self.id,
            timers: &mut self.new_timers,
            counters,
            limits: self.limits,
            now_ms: shared.clock.now_ms(),
            flush_at: shared.flush_at.load(Ordering::Acquire),
            pending: &mut self.pending,
            store,
            snap: None,
            cold_checks: false,
            fetched: Vec::new(),
        };
        let cold = shared.cold.as_ref();
        let stopping = shared.shutdown.load(Ordering::Acquire);
        for key in self.dirty.drain(..) {
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            conn.dirty = false;
            // Nothing owed to this client before this pass: what it asks now starts afresh.
            let fresh = conn.inflight == 0 && conn.pending_output() == 0 && !conn.want_write;
            let stop = if stopping || conn.broken || conn.cold_wait {
                Stop::Blocked
            } else {
                pass.for_conn(
                    cold.is_some() && conn.cold_tries < COLD_TRIES,
                    std::mem::take(&mut conn.fetched),
                );
                // A bug that panics on some request must cost that client its connection, not
                // the worker and every other client on it.
                let run =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match conn.proto {
                        Proto::Memcache => memcache::process(conn, &mut pass, key as u32, BUDGET),
                        Proto::Resp => super::resp::process(conn, &mut pass, key as u32, BUDGET),
                    }));
                let stop = run.unwrap_or_else(|_| {
                    error!(
                        "a request made worker {} panic; its connection is closed",
                        self.id
                    );
                    conn.broken = true;
                    Stop::Blocked
                });
                let (found, txn) = pass.take_cold();
                match cold {
                    Some(pool) if !found.is_empty() => {
                        // On the worker's ring when it can take them, else by a reader thread.
                        let found = match (ring.as_mut(), txn) {
                            (Some(ring), Some(txn)) => {
                                match ring.queue(key as u32, conn.epoch, found, txn) {
                                    Ok(n) => {
                                        pool.stats().waits.fetch_add(1, Ordering::Relaxed);
                                        pool.stats().ring_waits.fetch_add(1, Ordering::Relaxed);
                                        conn.cold_reads = n as u16;
                                        None
                                    }
                                    Err(found) => Some(found),
                                }
                            }
                            (_, _) => Some(found),
                        };
                        if let Some(found) = found {
                            pool.submit(super::cold::Job {
                                worker: self.id,
                                slot: key as u32,
                                epoch: conn.epoch,
                                keys: found.into_iter().map(|c| c.key).collect(),
                            });
                        }
                        conn.cold_wait = true;
                        conn.cold_tries += 1;
                    }
                    _ => conn.cold_tries = 0,
                }
                stop
            };
            if let Some(info) = conn.resp.info.take() {
                super::resp::refresh_info(&info, &mut conn.resp, conn.last_active);
                conn.resp.info = Some(info);
            }
            // The pass queued writes behind replies it already has (`+QUEUED`s before an
            // EXEC, a `get` before a `set`): those replies wait to leave with the writes'
            // replies in one send, as Redis sends its replies after the fsync, instead of
            // waking the client once for a partial answer. Only replies of this pass's own
            // requests wait, only for this pass's writes, and only a little output; never
            // for a blocking pop, which may wait for long.
            let hold = fresh
                && conn.inflight > 0
                && conn.resp.block.is_none()
                && conn.pending_output() <= HOLD_OUTPUT
                && !conn.closing
                && !conn.broken
                && !stopping;
            let more_output = !hold && conn.flush(counters);
            // A client that hangs up while blocked is gone (as in Redis): nothing more will be
            // popped for it, and it closes once the pop is settled.
            if let Some(b) = conn.resp.block.as_mut()
                && (conn.eof || conn.hup)
                && !b.hung_up
            {
                b.hung_up = true;
                shared
                    .blocking
                    .settle(b.id, crate::types::blocking::TIMED_OUT);
            }
            if conn.resp.psync.is_some() && !more_output && conn.inflight == 0 && !conn.broken {
                // PSYNC: the connection becomes a replication sender's, off this loop (plain
                // TCP only: the sender does not speak TLS).
                let psync = conn.resp.psync.take();
                if conn.tls.is_some() {
                    log::warn!("{:?}: PSYNC over TLS is not supported; closing", conn.peer);
                    close_conn(&mut self.conns, &self.poll, shared, &mut self.timers, key);
                    continue;
                }
                let port = conn.resp.repl_port;
                if let (Some((replid, offset)), Some(conn)) = (psync, self.conns.try_remove(key)) {
                    detach(conn, &self.poll, &self.shared, replid, offset, port);
                }
                continue;
            }
            let close = conn.broken
                || (conn.closing && !more_output)
                || (conn.eof && conn.inflight == 0 && !more_output && stop == Stop::NeedInput);
            if close {
                close_conn(&mut self.conns, &self.poll, shared, &mut self.timers, key);
                continue;
            }
            if more_output != conn.want_write {
                conn.want_write = more_output;
                let interest = if more_output {
                    Interest::READABLE | Interest::WRITABLE
                } else {
                    Interest::READABLE
                };
                if let Err(e) =
                    self.poll
                        .registry()
                        .reregister(&mut conn.stream, Token(key), interest)
                {
                    error!("reregister failed: {e}");
                    conn.broken = true;
                }
            }
            // Input left unprocessed, or a socket not yet drained that now has room: next pass.
            let reread = conn.readable && conn.may_read() && stop != Stop::Blocked;
            // Blocked on unsent output that has now all gone out: no writable event will come.
            let unblocked = stop == Stop::Blocked
                && !more_output
                && conn.inflight == 0
                && !conn.cold_wait
                && !stopping;
            if stop == Stop::Paused {
                self.paused.push(key);
            } else if stop == Stop::ReplWait {
                self.repl_wait.push(key);
            } else if stop == Stop::Budget || reread || unblocked || conn.broken {
                self.next.push(key);
            }
        }
        pass.for_conn(false, Vec::new());
        drop(pass);
        if let Some(ring) = ring.as_mut() {
            ring.submit();
        }
        if !self.pending.is_empty() {
            // The next pass likely queues as many: one allocation then, not a chain of
            // regrowths that each copy every (large) request.
            let n = self.pending.len();
            let reqs = std::mem::replace(&mut self.pending, Vec::with_capacity(n));
            let submitted = self.gate.submit(Submission {
                worker: self.id,
                reqs,
            });
            // Committed here: the replies are in the mailbox, and no wake-up will say so.
            self.completed_here = submitted == Submitted::Committed;
            if submitted == Submitted::Refused {
                error!(
                    "worker {}: the writer is gone; writes cannot be applied",
                    self.id
                );
            }
        }
    }

    fn add_conn(&mut self, stream: std::net::TcpStream, proto: Proto, tls: bool) {
        let session = match (tls, &self.shared.tls) {
            (false, _) => None,
            (true, Some(ctx)) => match ctx.session() {
                Ok(s) => Some(Box::new(s)),
                Err(e) => {
                    error!("cannot start a TLS session: {e}");
                    None
                }
            },
            (true, None) => None,
        };
        if tls && session.is_none() {
            // Never serve a TLS port in plain text.
            self.shared
                .gauges
                .curr_connections
                .fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let mut stream = mio::net::TcpStream::from_std(stream);
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(key), Interest::READABLE)
        {
            error!("cannot register connection: {e}");
            self.shared
                .gauges
                .curr_connections
                .fetch_sub(1, Ordering::Relaxed);
            return;
        }
        self.next_epoch = self.next_epoch.wrapping_add(1);
        let cap = if proto == Proto::Resp {
            self.resp_read_cap
        } else {
            self.read_cap
        };
        let mut conn = Conn::new(stream, proto, self.next_epoch, cap);
        conn.tls = session;
        conn.peer = conn.stream.peer_addr().ok();
        debug!("worker {}: connection from {:?}", self.id, conn.peer);
        conn.resp.id = self.shared.next_client_id.fetch_add(1, Ordering::Relaxed) + 1;
        conn.resp.subs.who = Some(super::pubsub::Sub {
            worker: self.id as u32,
            slot: key as u32,
            epoch: self.next_epoch,
        });
        if proto == Proto::Resp {
            use std::os::fd::AsRawFd;
            conn.resp.info = Some(self.shared.clients.add(
                conn.resp.id,
                self.id,
                key as u32,
                self.next_epoch,
                conn.peer,
                conn.stream.local_addr().ok(),
                conn.stream.as_raw_fd(),
            ));
        }
        entry.insert(conn);
        Counters::bump(&self.shared.counters[self.id].total_connections);
        self.mark(key);
    }
}

/// Hands a replica's connection to a replication sender thread (`repl.rs`).
fn detach(conn: Conn, poll: &Poll, shared: &Arc<Shared>, replid: String, offset: i64, port: u16) {
    let ip = conn.resp.repl_ip.clone();
    if let Some(info) = &conn.resp.info {
        shared.clients.remove(info.id);
    }
    shared
        .gauges
        .curr_connections
        .fetch_sub(1, Ordering::Relaxed);
    let mut stream = conn.stream;
    if let Err(e) = poll.registry().deregister(&mut stream) {
        debug!("deregister failed: {e}");
    }
    let stream = super::into_std(stream);
    super::repl::serve_replica(shared.clone(), stream, replid, offset, (ip, port));
}

/// Removes a connection: deregisters its socket and closes it. A late write completion for it
/// finds another epoch (or no connection) and is dropped. Its blocking pop, if any, is
/// cancelled before the slot can be reused: a waiter is never served once it is gone, except
/// when the writer had already popped for it in a batch not yet delivered (as in Redis, that
/// element then goes with the connection).
fn close_conn(
    conns: &mut Slab<Conn>,
    poll: &Poll,
    shared: &Shared,
    timers: &mut BTreeSet<(Instant, u64)>,
    key: usize,
) {
    let Some(conn) = conns.try_remove(key) else {
        return;
    };
    if let Some(info) = &conn.resp.info {
        shared.clients.remove(info.id);
    }
    if let Some(b) = conn.resp.block {
        shared
            .blocking
            .cancel(b.id, crate::types::blocking::TIMED_OUT);
        if let Some(d) = b.deadline {
            timers.remove(&(d, b.id));
        }
    }
    if let Err(e) = poll.registry().deregister(&mut { conn.stream }) {
        debug!("deregister failed: {e}");
    }
    shared
        .gauges
        .curr_connections
        .fetch_sub(1, Ordering::Relaxed);
}
