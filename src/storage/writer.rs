//! The group-commit writer: the only thread that writes to LMDB.
//!
//! Workers send `Submission`s (every write a worker parsed in one event-loop pass). The writer
//! takes everything waiting, up to `max_batch` writes, applies it in one transaction, appends
//! the transaction's physical changes to the write-ahead log as one batch, commits LMDB without
//! syncing, fdatasyncs the log (in `always`), and only then hands each write's `Outcome` back
//! to its worker's `Mailbox` and wakes that worker. So nothing is acknowledged before it is
//! durable per the sync mode, and one sequential fsync covers every write of the batch.
//!
//! Between batches the writer starts checkpoints (`durable.rs`) once enough log has built up,
//! or the log has been idle a moment: the log's length bounds what a recovery replays.
//!
//! A write that fails (the map is full) must not fail its batch-mates: the batch is then
//! aborted and replayed one transaction per write, so each write gets its own outcome.
//!
//! Housekeeping happens here too, between batches: a delayed `flush_all` that has come due,
//! the expiry sweep, and the periodic fsync of the log.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{debug, error, warn};

use super::StoreError;
use super::durable::{Checkpointer, Durable};
use super::lmdb::{LmdbStore, LmdbWrite, LogTxn};
use super::wal::{LogBuf, Wal};
use super::watch::{Touched, Watches};
use crate::clock::Clock;
use crate::command::{ExecOp, Outcome, REPLY_MAX, Step, WriteOp};
use crate::config::SyncMode;
use crate::semantics::{self, Ctx};

/// One write and the tag its worker uses to route and encode the reply.
pub struct WriteRequest<T> {
    pub tag: T,
    pub op: WriteOp,
}

/// Writes from one worker's event-loop pass, in the order they were received.
pub struct Submission<T> {
    pub worker: usize,
    pub reqs: Vec<WriteRequest<T>>,
}

pub struct Completion<T> {
    pub tag: T,
    pub outcome: Outcome,
}

/// Where the writer leaves a worker's completions; the worker drains it when woken.
pub struct Mailbox<T> {
    queue: Mutex<Vec<Completion<T>>>,
    waker: mio::Waker,
}

impl<T> Mailbox<T> {
    pub fn new(waker: mio::Waker) -> Mailbox<T> {
        Mailbox {
            queue: Mutex::new(Vec::new()),
            waker,
        }
    }

    /// Moves every waiting completion into `out` (in commit order).
    pub fn drain_into(&self, out: &mut Vec<Completion<T>>) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        out.append(&mut q);
    }

    fn deliver(&self, items: &mut Vec<Completion<T>>, wake: bool) {
        if items.is_empty() {
            return;
        }
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(items);
        if wake && let Err(e) = self.waker.wake() {
            error!("cannot wake worker: {e}");
        }
    }

    pub fn wake(&self) {
        if let Err(e) = self.waker.wake() {
            error!("cannot wake worker: {e}");
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct WriterConfig {
    pub sync: SyncMode,
    pub sync_interval: Duration,
    pub max_batch: usize,
    pub item_size_max: usize,
}

/// Applies one write: collection commands run on LMDB directly, EXEC's steps one after the
/// other, the rest through `semantics`. While anyone watches keys, a write that logged
/// something notes its keys in `touched` (published once the batch commits).
fn apply(
    w: &mut LmdbWrite<'_, '_>,
    op: &WriteOp,
    ctx: Ctx,
    watches: &Watches,
    touched: &mut Touched,
) -> Result<Outcome, StoreError> {
    if let WriteOp::Exec(x) = op {
        return exec(w, x, ctx, watches, touched);
    }
    let watching = watches.active();
    if watching
        && let WriteOp::FlushAll { delay } = op
        && semantics::flush_deadline(*delay, ctx.now_ms).is_none()
    {
        let (store, txn) = w.parts();
        let txn: &LogTxn = txn;
        watches.note_flush(touched, |k| matches!(store.get(txn, k), Ok(Some(_))));
    }
    let before = if watching { w.parts().1.logged() } else { 0 };
    let outcome = match op {
        WriteOp::Coll(c) => match crate::types::apply(w, c, ctx.now_ms) {
            Err(StoreError::BadKey) => Ok(Outcome::BadKey),
            other => other,
        },
        _ => semantics::apply(w, op, ctx),
    };
    if watching && w.parts().1.logged() != before {
        op.for_each_key(&mut |k| watches.note(k, touched));
    }
    outcome
}

/// EXEC: a null array if a watched key changed, else each step in order against the one
/// transaction (reads see the steps before them). A step's error (WRONGTYPE, ...) is its own
/// outcome; a failure of the store fails the whole transaction, which then applies nothing.
fn exec(
    w: &mut LmdbWrite<'_, '_>,
    x: &ExecOp,
    ctx: Ctx,
    watches: &Watches,
    touched: &mut Touched,
) -> Result<Outcome, StoreError> {
    if x.watched
        .iter()
        .any(|k| watches.fired(k, touched, ctx.now_ms))
    {
        return Ok(Outcome::NilArray);
    }
    let mut outs = Vec::with_capacity(x.steps.len());
    let mut reply = 0usize;
    for step in &x.steps {
        let o = match step {
            Step::Write(op) => apply(w, op, ctx, watches, touched)?,
            // Bounds what one EXEC of many large reads can make the server hold.
            Step::Read(_) if reply > REPLY_MAX => {
                Outcome::Err("ERR EXEC reply larger than memkeep's limit")
            }
            Step::Read(r) => {
                let (store, txn) = w.parts();
                let o = r.run(store, txn, ctx.now_ms);
                if let Outcome::Reply(b) = &o {
                    reply += b.len();
                }
                o
            }
        };
        outs.push(o);
    }
    Ok(Outcome::Array(outs))
}

/// The writes `op` applied, for `publish_flush`: itself, and an EXEC's steps when it ran (a
/// FLUSHALL inside EXEC cancels a pending delayed flush as one outside does).
fn applied<'a>(op: &'a WriteOp, outcome: &Outcome) -> impl Iterator<Item = &'a WriteOp> {
    let steps: &'a [Step] = match (op, outcome) {
        (WriteOp::Exec(x), Outcome::Array(_)) => &x.steps,
        _ => &[],
    };
    std::iter::once(op).chain(steps.iter().filter_map(|s| match s {
        Step::Write(w) => Some(w),
        Step::Read(_) => None,
    }))
}

/// Group commit with fsync: how long to wait for one more submission, and for all of them.
const GATHER_GAP: Duration = Duration::from_micros(50);
const GATHER_MAX: Duration = Duration::from_micros(200);

/// Most elements of deleted collections reclaimed per batch.
const GC_CHUNK: usize = 1000;

/// A checkpoint starts once this much log has been written since the last one began, or once
/// the log has anything and the last checkpoint is `CHECKPOINT_EVERY` old: what recovery
/// replays after a crash is bounded by both.
const CHECKPOINT_BYTES: u64 = 32 << 20;
const CHECKPOINT_EVERY: Duration = Duration::from_millis(1000);
/// Pages freed after the pinned snapshot cannot be reused until the next checkpoint moves the
/// pin, so every batch until then takes fresh pages: a checkpoint also starts once the data
/// file has grown this much since the last one began, which bounds that growth.
const CHECKPOINT_GROWTH: u64 = 4 << 20;
/// Backpressure: every commit takes fresh pages while a snapshot is pinned (about 16-24 KiB
/// each, written out by the next checkpoint), so a high rate of small commits can produce
/// pages faster than checkpoints write them, and the file grows without bound. Once the data
/// file has grown this much since the last checkpoint began, commits are paced: workers queue
/// instead of committing by themselves, and the writer gathers for `PACED_GATHER` per commit.
const PRESSURE_GROWTH: u64 = 32 << 20;
const PACED_GATHER: Duration = Duration::from_micros(1000);

/// Time between expiry sweeps, and the most items one sweep deletes.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
const SWEEP_LIMIT: usize = 1000;

/// A delayed `flush_all` deadline in unix ms (0 = none), shared with the workers so reads treat
/// every item as gone once it has passed, even before the writer has cleared the store.
pub type FlushAt = Arc<AtomicU64>;

pub struct Writer<T> {
    store: LmdbStore,
    wal: Wal,
    checkpointer: Checkpointer,
    last_checkpoint: Instant,
    /// The data file's last page when the last checkpoint began, and the page size.
    checkpoint_pgno: u64,
    page_size: u64,
    /// Set while commits are paced (see `PRESSURE_GROWTH`); read by workers without the lock.
    paced: Arc<std::sync::atomic::AtomicBool>,
    /// The batch's log records, kept between batches for its buffer.
    log: LogBuf,
    /// Set when the log could not be written or synced: durability is unknown from then on, so
    /// every later write is refused (reads go on) until a restart recovers.
    broken: Option<String>,
    clock: Arc<Clock>,
    cfg: WriterConfig,
    cas: u64,
    flush_at: FlushAt,
    mailboxes: Vec<Arc<Mailbox<T>>>,
    outboxes: Vec<Vec<Completion<T>>>,
    /// Deleted collections still have elements to reclaim.
    gc_more: bool,
    /// The keys RESP clients watch: told of every key a committed batch changed.
    watches: Arc<Watches>,
}

impl<T: Send> Writer<T> {
    pub fn new(
        durable: Durable,
        clock: Arc<Clock>,
        cfg: WriterConfig,
        flush_at: FlushAt,
        mailboxes: Vec<Arc<Mailbox<T>>>,
    ) -> Writer<T> {
        let Durable {
            store,
            persisted,
            wal,
            checkpointer,
            ..
        } = durable;
        flush_at.store(persisted.flush_at.unwrap_or(0), Ordering::Release);
        let checkpoint_pgno = store.env().info().last_page_number as u64;
        let page_size = store.env().stat().page_size as u64;
        let outboxes = mailboxes.iter().map(|_| Vec::new()).collect();
        Writer {
            store,
            wal,
            checkpointer,
            last_checkpoint: Instant::now(),
            checkpoint_pgno,
            page_size,
            paced: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            log: LogBuf::default(),
            broken: None,
            clock,
            cfg,
            cas: persisted.cas,
            flush_at,
            mailboxes,
            outboxes,
            gc_more: true,
            watches: Arc::default(),
        }
    }

    /// Shares the registry of watched keys with the workers (WATCH).
    pub fn with_watches(mut self, watches: Arc<Watches>) -> Writer<T> {
        self.watches = watches;
        self
    }

    /// Starts the writer thread; workers submit through the returned gate (and its clones).
    pub fn start(self) -> std::io::Result<(Gate<T>, std::thread::JoinHandle<()>)>
    where
        T: 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        let paced = self.paced.clone();
        let gate = Gate {
            paced,
            core: Arc::new(Mutex::new(self)),
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
        };
        let (core, queued) = (gate.core.clone(), gate.queued.clone());
        let thread = std::thread::Builder::new()
            .name("memkeep-writer".into())
            .spawn(move || run(core, rx, queued))?;
        Ok((gate, thread))
    }

    /// The data file's last page now, and the bytes it has grown since the last checkpoint
    /// began.
    fn growth(&self) -> (u64, u64) {
        let pgno = self.store.env().info().last_page_number as u64;
        (
            pgno,
            pgno.saturating_sub(self.checkpoint_pgno) * self.page_size,
        )
    }

    /// Whether the file has grown far past the pinned snapshot: commits are paced until a
    /// checkpoint catches up.
    fn update_pressure(&self) {
        let paced = self.growth().1 >= PRESSURE_GROWTH;
        if paced != self.paced.load(Ordering::Relaxed) {
            debug!("commit pacing {}", if paced { "on" } else { "off" });
            self.paced.store(paced, Ordering::Release);
        }
    }

    /// Starts a checkpoint when one is due (or, with `now`, whenever the log holds anything)
    /// and none is running.
    fn maybe_checkpoint(&mut self, now: bool) {
        if self.checkpointer.busy() || self.broken.is_some() {
            return;
        }
        let now = now
            || self
                .checkpointer
                .stats
                .requested
                .swap(false, Ordering::AcqRel);
        if self.wal.since_checkpoint == 0 {
            return;
        }
        let (pgno, grown) = self.growth();
        let due = now
            || self.wal.since_checkpoint >= CHECKPOINT_BYTES
            || grown >= CHECKPOINT_GROWTH
            || self.last_checkpoint.elapsed() >= CHECKPOINT_EVERY;
        if !due {
            return;
        }
        self.last_checkpoint = Instant::now();
        self.checkpoint_pgno = pgno;
        if let Err(e) = self.checkpointer.begin(&self.store, &mut self.wal) {
            error!("cannot start a checkpoint: {e}");
        }
    }

    /// Waits for a running checkpoint, then takes one of the store as it is and waits for it
    /// too: the map is full, and the pages freed since the pinned snapshot are reusable only
    /// once the pin has moved to the latest one.
    fn checkpoint_now(&mut self) {
        let wait = |c: &Checkpointer| {
            while c.busy() {
                std::thread::sleep(Duration::from_micros(200));
            }
        };
        wait(&self.checkpointer);
        self.maybe_checkpoint(true);
        wait(&self.checkpointer);
    }

    fn flush_due(&self) -> bool {
        let at = self.flush_at.load(Ordering::Acquire);
        at != 0 && at <= self.clock.now_ms()
    }

    /// Makes the log durable; a failure breaks the writer (see `broken`).
    fn sync_log(&mut self) -> bool {
        if self.broken.is_some() {
            return false;
        }
        match self.wal.sync() {
            Ok(()) => true,
            Err(e) => {
                self.break_log(format!("fdatasync of the write-ahead log failed: {e}"));
                false
            }
        }
    }

    fn break_log(&mut self, why: String) {
        error!("{why}; refusing writes until memkeep is restarted");
        self.broken = Some(why);
    }

    /// Logs and commits a transaction the batch has filled: the log append first (so no
    /// committed change is missing from it), then LMDB's commit (no sync). On error nothing
    /// of the transaction is kept, in LMDB or in the log.
    fn log_and_commit(&mut self, txn: LogTxn<'_>) -> Result<(), StoreError> {
        let (txn, mut log) = txn.into_parts();
        let result = if log.is_empty() {
            // Nothing changed: no batch, no LMDB transaction id.
            drop(txn);
            Ok(())
        } else {
            let (pos, seq) = (self.wal.position(), self.wal.last_seq() + 1);
            match self.wal.append(&mut log) {
                Err(e) => {
                    drop(txn);
                    let why = format!("cannot append to the write-ahead log: {e}");
                    self.break_log(why.clone());
                    Err(StoreError::Backend(why))
                }
                Ok(_) => match txn.commit() {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        if let Err(u) = self.wal.undo(pos, seq) {
                            self.break_log(format!(
                                "cannot take back a log batch whose commit failed: {u}"
                            ));
                        }
                        Err(e.into())
                    }
                },
            }
        };
        log.reset();
        self.log = log;
        result
    }

    /// Applies and commits `batch` (emptying it), then delivers the outcomes, waking each
    /// worker but `awake` (the one committing, which looks at its mailbox next anyway). Returns
    /// how many expired items the sweep removed.
    fn commit(
        &mut self,
        batch: &mut Vec<Submission<T>>,
        sweep: bool,
        awake: Option<usize>,
    ) -> usize {
        let ctx = Ctx {
            now_ms: self.clock.now_ms(),
            item_size_max: self.cfg.item_size_max,
        };
        let mut outcomes: Vec<Outcome> =
            Vec::with_capacity(batch.iter().map(|s| s.reqs.len()).sum());
        let mut swept = 0;
        let mut ran_due = false;
        let mut gc_more = self.gc_more;
        let watches = self.watches.clone();
        let mut touched = Touched::default();
        let result = if self.broken.is_some() {
            Err(StoreError::Backend("the write-ahead log is broken".into()))
        } else {
            let store = self.store.clone();
            let log = std::mem::take(&mut self.log);
            (|| -> Result<(), StoreError> {
                let mut txn = store.write_txn_with(log)?;
                ran_due = self.housekeeping(&store, &mut txn, ctx.now_ms, sweep, &mut swept)?;
                if ran_due && watches.active() {
                    watches.note_all(&mut touched);
                }
                let mut cas = self.cas;
                for sub in batch.iter() {
                    for req in &sub.reqs {
                        let mut w = store.writer(&mut txn, &mut cas);
                        outcomes.push(apply(&mut w, &req.op, ctx, &watches, &mut touched)?);
                    }
                }
                if cas != self.cas {
                    store.put_cas(&mut txn, cas)?;
                }
                if store.gc_pending(&txn)? {
                    store.collect_garbage(&mut txn, GC_CHUNK)?;
                    gc_more = store.gc_pending(&txn)?;
                } else {
                    gc_more = false;
                }
                self.log_and_commit(txn)?;
                self.cas = cas;
                Ok(())
            })()
        };
        self.gc_more = gc_more;
        match result {
            Ok(()) => {
                // Committed (durable or not): watchers of what it changed must hear of it.
                watches.publish(&mut touched);
                let durable = self.cfg.sync != SyncMode::Always || self.sync_log();
                if durable {
                    let ops = batch
                        .iter()
                        .flat_map(|s| s.reqs.iter().map(|r| &r.op))
                        .zip(outcomes.iter())
                        .flat_map(|(op, o)| applied(op, o));
                    self.publish_flush(ran_due, ops, ctx.now_ms);
                } else {
                    // Committed but not known durable: no write of the batch is acknowledged.
                    outcomes.iter_mut().for_each(|o| *o = Outcome::Failed);
                }
            }
            Err(e) => {
                outcomes.clear();
                if self.broken.is_some() {
                    outcomes.extend(
                        batch
                            .iter()
                            .flat_map(|s| s.reqs.iter().map(|_| Outcome::Failed)),
                    );
                } else {
                    if e.is_damage() {
                        // Logged once where it was found; the writes that meet it say so.
                        debug!("batch met damage, retrying each write alone: {e}");
                    } else if !matches!(e, StoreError::Full) {
                        error!("batch commit failed, retrying each write alone: {e}");
                    } else {
                        debug!("store full: checkpointing, then retrying one write at a time");
                        self.checkpoint_now();
                    }
                    for sub in batch.iter() {
                        for req in &sub.reqs {
                            let o = self.commit_one(&req.op, ctx);
                            outcomes.push(o);
                        }
                    }
                    if self.cfg.sync == SyncMode::Always && !self.sync_log() {
                        outcomes.iter_mut().for_each(|o| *o = Outcome::Failed);
                    }
                }
            }
        }
        let mut outcomes = outcomes.into_iter();
        for sub in batch.drain(..) {
            let outbox = &mut self.outboxes[sub.worker];
            for req in sub.reqs {
                let outcome = outcomes.next().unwrap_or(Outcome::Failed);
                outbox.push(Completion {
                    tag: req.tag,
                    outcome,
                });
            }
        }
        for (i, (mailbox, outbox)) in self
            .mailboxes
            .iter()
            .zip(self.outboxes.iter_mut())
            .enumerate()
        {
            mailbox.deliver(outbox, awake != Some(i));
        }
        swept
    }

    /// Publishes what a committed batch did to the delayed-flush deadline: a due flush that ran
    /// clears it, and each `flush_all` in the batch sets (or cancels) it, in order.
    fn publish_flush<'a>(&self, ran_due: bool, ops: impl Iterator<Item = &'a WriteOp>, now: u64) {
        let mut state = ran_due.then_some(0);
        for op in ops {
            if let WriteOp::FlushAll { delay } = op {
                state = Some(semantics::flush_deadline(*delay, now).unwrap_or(0));
            }
        }
        if let Some(at) = state {
            self.flush_at.store(at, Ordering::Release);
        }
    }

    /// Runs a due delayed flush (returning true if it ran) and, when asked, the expiry sweep.
    fn housekeeping(
        &self,
        store: &LmdbStore,
        txn: &mut LogTxn,
        now: u64,
        sweep: bool,
        swept: &mut usize,
    ) -> Result<bool, StoreError> {
        let ran = self.flush_due() && store.run_due_flush(txn, now)?;
        if sweep {
            *swept = store.sweep_expired(txn, now, SWEEP_LIMIT)?;
        }
        Ok(ran)
    }

    /// One write in its own transaction: the fallback when a batch could not commit. The
    /// caller syncs the log.
    fn commit_one(&mut self, op: &WriteOp, ctx: Ctx) -> Outcome {
        let mut cas = self.cas;
        let store = self.store.clone();
        let watches = self.watches.clone();
        let mut touched = Touched::default();
        let result = (|| -> Result<Outcome, StoreError> {
            let mut txn = store.write_txn_with(std::mem::take(&mut self.log))?;
            let mut w = store.writer(&mut txn, &mut cas);
            let outcome = apply(&mut w, op, ctx, &watches, &mut touched)?;
            store.put_cas(&mut txn, cas)?;
            self.log_and_commit(txn)?;
            watches.publish(&mut touched);
            Ok(outcome)
        })();
        // CAS uniques handed out by an aborted write are skipped, never reused.
        self.cas = cas;
        match result {
            Ok(o) => {
                self.publish_flush(false, applied(op, &o), ctx.now_ms);
                o
            }
            Err(StoreError::Full) => Outcome::Full,
            Err(StoreError::Damaged(_)) => Outcome::Damaged,
            Err(e) => {
                warn!("write failed: {e}");
                Outcome::Failed
            }
        }
    }
}

fn lock<T>(core: &Mutex<Writer<T>>) -> std::sync::MutexGuard<'_, Writer<T>> {
    core.lock().unwrap_or_else(|p| p.into_inner())
}

/// The writer thread: takes what workers could not commit themselves (another commit was
/// running, or submissions were already queued), gathers it into batches, and does the
/// housekeeping. Runs until every gate is gone, then checkpoints and returns.
fn run<T: Send>(
    core: Arc<Mutex<Writer<T>>>,
    rx: Receiver<Submission<T>>,
    queued: Arc<AtomicUsize>,
) {
    let mut batch: Vec<Submission<T>> = Vec::new();
    let mut next_sweep = Instant::now();
    let (sync, sync_interval, max_batch) = {
        let w = lock(&core);
        (w.cfg.sync, w.cfg.sync_interval, w.cfg.max_batch)
    };
    let mut next_sync = Instant::now() + sync_interval;
    let mut last_batch = 0usize;
    loop {
        let now = Instant::now();
        // Workers commit while this thread sleeps, so it wakes in time for whatever their
        // commits may have made due: the periodic sync and a checkpoint.
        let mut wait = next_sweep
            .saturating_duration_since(now)
            .min(CHECKPOINT_EVERY);
        if sync == SyncMode::Periodic {
            wait = wait.min(next_sync.saturating_duration_since(now));
        }
        if lock(&core).gc_more {
            // Deleted collections still hold elements: keep reclaiming between batches.
            wait = Duration::ZERO;
        }
        let mut disconnected = false;
        match rx.recv_timeout(wait) {
            Ok(sub) => batch.push(sub),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => disconnected = true,
        }
        let mut count: usize = batch.iter().map(|s| s.reqs.len()).sum();
        // With fsync per commit, a commit costs far more than a short wait: when fewer
        // writes are in hand than the last batch carried, give their writers' next
        // requests a moment to arrive, so one fsync covers them all.
        let paced = count > 0 && lock(&core).paced.load(Ordering::Acquire);
        let gather = paced || (sync == SyncMode::Always && count > 0 && count < last_batch);
        let deadline = Instant::now() + if paced { PACED_GATHER } else { GATHER_MAX };
        while count < max_batch {
            let next = if gather && (paced || count < last_batch) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                rx.recv_timeout(left.min(GATHER_GAP)).map_err(|_| ())
            } else {
                rx.try_recv().map_err(|_| ())
            };
            match next {
                Ok(sub) => {
                    count += sub.reqs.len();
                    batch.push(sub);
                }
                Err(()) => break,
            }
        }
        if count > 0 {
            last_batch = count;
        }
        let subs = batch.len();
        let mut w = lock(&core);
        let sweep = Instant::now() >= next_sweep;
        if count > 0 || sweep || w.flush_due() || w.gc_more {
            let swept = w.commit(&mut batch, sweep, None);
            if sweep {
                // A full sweep means more are due: come back soon rather than in a second.
                next_sweep = Instant::now()
                    + if swept >= SWEEP_LIMIT {
                        Duration::ZERO
                    } else {
                        SWEEP_EVERY
                    };
            }
        }
        // Only now may a worker commit by itself again: nothing it submitted is still queued.
        queued.fetch_sub(subs, Ordering::AcqRel);
        if sync == SyncMode::Periodic && Instant::now() >= next_sync {
            if w.wal.unsynced() {
                w.sync_log();
            }
            next_sync = Instant::now() + sync_interval;
        }
        if disconnected {
            break;
        }
        w.maybe_checkpoint(false);
        w.update_pressure();
    }
    let mut w = lock(&core);
    w.sync_log();
    // A clean stop leaves nothing to replay: the last checkpoint covers every batch.
    w.checkpoint_now();
    w.checkpointer.finish();
}

/// How workers hand their writes to the writer. When no commit is running and nothing is
/// queued, the worker commits its own submission at once, on its own thread (RocksDB's
/// leader writer, with one member): no wake-up of the writer thread and none back, which is
/// what a lone client waits for. Otherwise the submission is queued for the writer thread,
/// which commits it with whatever else has gathered meanwhile (group commit under load).
/// Either way the outcomes arrive in the worker's mailbox, in commit order.
pub struct Gate<T> {
    core: Arc<Mutex<Writer<T>>>,
    /// Commits are paced (the writer's `paced`): queue, never commit alone.
    paced: Arc<std::sync::atomic::AtomicBool>,
    tx: std::sync::mpsc::Sender<Submission<T>>,
    /// Submissions queued and not yet committed. A worker commits by itself only at 0, so a
    /// connection's writes never overtake its own earlier ones still in the queue.
    queued: Arc<AtomicUsize>,
}

impl<T> Clone for Gate<T> {
    fn clone(&self) -> Self {
        Gate {
            core: self.core.clone(),
            paced: self.paced.clone(),
            tx: self.tx.clone(),
            queued: self.queued.clone(),
        }
    }
}

/// What became of a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// Committed on the caller's thread: its outcomes are in the caller's mailbox already, and
    /// no wake-up comes for them.
    Committed,
    /// Queued for the writer thread, which wakes the worker when the outcomes are in.
    Queued,
    /// The writer has stopped.
    Refused,
}

impl<T: Send> Gate<T> {
    /// Commits or queues `sub`.
    pub fn submit(&self, sub: Submission<T>) -> Submitted {
        if self.queued.load(Ordering::Acquire) == 0
            && !self.paced.load(Ordering::Acquire)
            && let Ok(mut w) = self.core.try_lock()
        {
            let worker = sub.worker;
            let mut batch = vec![sub];
            w.commit(&mut batch, false, Some(worker));
            w.update_pressure();
            return Submitted::Committed;
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.tx.send(sub).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Submitted::Refused;
        }
        Submitted::Queued
    }
}
