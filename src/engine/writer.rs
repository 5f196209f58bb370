//! The group-commit writer: the only code that writes to LMDB.
//!
//! Workers send `Submission`s (every write a worker parsed in one event-loop pass). A batch
//! (one submission a leader applies on its own thread, or everything the writer thread found
//! queued, up to `max_batch` writes) is applied to the open LMDB write transaction, its
//! physical changes are appended to the write-ahead log as one batch, what it changed in
//! `items` is published to readers (`overlay.rs`), the log is fdatasynced (in `always`), and
//! only then does each write's `Outcome` go back to its worker's `Mailbox`. So nothing is
//! acknowledged before it is durable per the sync mode, and one sequential fsync covers every
//! write of the batch.
//!
//! The LMDB transaction spans many batches and is committed (no sync) every 4 MiB of log or
//! 250 ms, before checkpoints, and at once for a batch that clears a database or that the
//! overlay cannot take (near a full map). Readers see the rest through the overlay: every
//! `items` record, and which collections' elements changed, whose reads then run here, on this
//! transaction (`WriteOp::Read`). Only the writer thread begins, commits or aborts it (LMDB's
//! write lock is owned by a thread); leaders hand it what needs that.
//!
//! Between batches the writer starts checkpoints (`durable.rs`) once enough log has built up,
//! or the log has been idle a moment: the log's length bounds what a recovery replays.
//!
//! A write that fails (the map is full) must not fail its batch-mates, nor the acknowledged
//! batches already in the transaction: the transaction is aborted and rebuilt from their log
//! records, and the failed batch's writes run one transaction each.
//!
//! Housekeeping happens here too, between batches: a delayed `flush_all` that has come due,
//! the expiry sweep, the periodic fsync of the log, and in cache mode (`max_disk`) eviction:
//! after every batch the writer reads the pages the data occupies (O(1), `cache.rs`); past the
//! cap, leaders leave their batches to the writer thread, which runs eviction passes (batches
//! of their own, with no replies waiting on them) until the data is back under the cap.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};

use super::blocking::{Begin, Blocking, Journal};
use crate::clock::Clock;
use crate::command::{ExecOp, Outcome, REPLY_MAX, ScriptOp, ScriptTxn, Step, TxnRead, WriteOp};
use crate::config::SyncMode;
use crate::semantics::{self, Ctx};
use crate::storage::StoreError;
use crate::storage::cache::{Cache, CacheStats};
use crate::storage::durable::{Checkpointer, Durable};
use crate::storage::lmdb::{LmdbStore, LmdbWrite, LogTxn, OpenTxn};
use crate::storage::overlay::{self, Dirty, Map};
use crate::storage::wal::{EndSync, HEADER, LogBuf, Wal};
use crate::storage::watch::{Touched, Watches};
use crate::types::CollOp;
use crate::types::set::SetOp;

mod replica;

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

    /// Leaves one completion and wakes the worker (a cancelled blocking pop's answer).
    pub fn push(&self, c: Completion<T>) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        self.wake();
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
    /// Cache mode: the cap on the data's pages, in bytes (0: off, the store refuses when full).
    pub max_disk: u64,
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
    if let WriteOp::Script(x) = op {
        return script(w, x, ctx, watches, touched, &mut Vec::new());
    }
    if let WriteOp::Read(r) = op {
        // Changes nothing, so notes no key.
        let (store, txn) = w.parts();
        return Ok(r.0.run(store, txn, ctx.now_ms));
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
    // SMOVE changes its destination only when the member was not there yet (Redis signals
    // the destination only then): its record (the set's length) is compared across the move.
    let smove_dst = match op {
        WriteOp::Coll(CollOp::Set(SetOp::Move { dst, .. })) if watching => {
            Some((dst, items_record(w, dst)))
        }
        _ => None,
    };
    let outcome = match op {
        WriteOp::Coll(c) => match crate::types::apply(w, c, ctx.now_ms) {
            Err(StoreError::BadKey) => Ok(Outcome::BadKey),
            other => other,
        },
        WriteOp::Replicate(r) => super::repl::apply(w, r),
        _ => semantics::apply(w, op, ctx),
    };
    if watching && w.parts().1.logged() != before {
        match smove_dst {
            Some((dst, was)) if items_record(w, dst) == was => {
                op.for_each_key(&mut |k| {
                    if k != dst.as_slice() {
                        watches.note(k, touched)
                    }
                });
            }
            _ => op.for_each_key(&mut |k| watches.note(k, touched)),
        }
    }
    outcome
}

/// The bytes of `key`'s record in `items` (None when it has none, or it cannot be read: then
/// the key counts as changed).
fn items_record(w: &mut LmdbWrite<'_, '_>, key: &[u8]) -> Option<Vec<u8>> {
    let (store, txn) = w.parts();
    let txn: &LogTxn = txn;
    store.items.get(txn, key).ok().flatten().map(<[u8]>::to_vec)
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

/// A script: it runs in the writer's transaction and calls back for each command (its writes
/// through `apply`, its reads against the transaction). The keys its writes fed go to `fed`.
fn script(
    w: &mut LmdbWrite<'_, '_>,
    x: &ScriptOp,
    ctx: Ctx,
    watches: &Watches,
    touched: &mut Touched,
    fed: &mut Vec<Vec<u8>>,
) -> Result<Outcome, StoreError> {
    let start = w.parts().1.logged();
    let mut cx = ScriptCx {
        w,
        ctx,
        watches,
        touched,
        fed,
        start,
    };
    x.run.run(&mut cx)
}

struct ScriptCx<'a, 't, 'e> {
    w: &'a mut LmdbWrite<'t, 'e>,
    ctx: Ctx,
    watches: &'a Watches,
    touched: &'a mut Touched,
    fed: &'a mut Vec<Vec<u8>>,
    start: usize,
}

impl ScriptTxn for ScriptCx<'_, '_, '_> {
    fn write(&mut self, op: &WriteOp) -> Result<Outcome, StoreError> {
        let o = apply(self.w, op, self.ctx, self.watches, self.touched)?;
        let fed = &mut *self.fed;
        fed_keys(op, &mut |k| fed.push(k.to_vec()));
        Ok(o)
    }

    fn read(&mut self, read: &dyn TxnRead) -> Outcome {
        let (store, txn) = self.w.parts();
        read.run(store, txn, self.ctx.now_ms)
    }

    fn now_ms(&self) -> u64 {
        self.ctx.now_ms
    }

    fn wrote(&mut self) -> bool {
        self.w.parts().1.logged() != self.start
    }
}

/// What a batch did to blocking pops: the registry entries it touched and the completions of
/// the waiters it served (delivered after the batch's own, once the batch is durable).
struct Waiters<T> {
    journal: Journal,
    served: Vec<(usize, Completion<T>)>,
}

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Waiters {
            journal: Journal::default(),
            served: Vec::new(),
        }
    }
}

impl<T: Clone> Waiters<T> {
    /// The batch failed and was taken back: so are its registry changes.
    fn rollback(&mut self, blocking: &Blocking<T>) {
        if !self.journal.is_empty() {
            blocking.writer().rollback(&mut self.journal);
        }
        self.served.clear();
    }

    /// The batch is delivered (`failed`: with every outcome Failed): the completions its
    /// waiters get, after the batch's own.
    fn finish(&mut self, blocking: &Blocking<T>, failed: bool) -> Vec<(usize, Completion<T>)> {
        let mut out = std::mem::take(&mut self.served);
        if failed {
            out.iter_mut()
                .for_each(|(_, c)| c.outcome = Outcome::Failed);
        }
        if !self.journal.is_empty() {
            blocking
                .writer()
                .finalize(&mut self.journal, failed, &mut out);
        }
        out
    }

    fn append(&mut self, other: Waiters<T>) {
        let Waiters { journal, served } = other;
        self.journal.extend(journal);
        self.served.extend(served);
    }
}

/// Marks every outcome of a batch Failed, except a blocking pop that went to wait: the
/// registry answers that one (`Waiters::finish`).
fn fail_all(outcomes: &mut [Outcome]) {
    for o in outcomes.iter_mut() {
        if *o != Outcome::Blocked {
            *o = Outcome::Failed;
        }
    }
}

/// Calls `f` with each key `op` may have given elements to (EXEC: its writes' keys).
fn fed_keys(op: &WriteOp, f: &mut dyn FnMut(&[u8])) {
    match op {
        WriteOp::Exec(x) => {
            for s in &x.steps {
                if let Step::Write(w) = s {
                    fed_keys(w, f);
                }
            }
        }
        op => op.for_each_key(f),
    }
}

/// Applies one write of a batch, then serves waiters on the keys it fed: a blocking pop pops
/// at once or goes to wait; any other write runs through `apply`. Blocking pops are served
/// only after the whole write (a whole EXEC included), in the same transaction.
fn apply_req<T: Clone>(
    w: &mut LmdbWrite<'_, '_>,
    op: &WriteOp,
    ctx: Ctx,
    watches: &Watches,
    touched: &mut Touched,
    blocking: &Blocking<T>,
    waiters: &mut Waiters<T>,
) -> Result<Outcome, StoreError> {
    let mut fed: Vec<Vec<u8>> = Vec::new();
    // The registry's lock is taken for each step and never held across LMDB work (which may
    // fault pages in from disk): workers take it too.
    let outcome = if let WriteOp::Block { id } = op {
        let begin = blocking.writer().begin(*id, &mut waiters.journal);
        match begin {
            Begin::Gone => Outcome::Blocked,
            Begin::Cancelled(o) => o,
            Begin::Pop { form, once } => {
                let before = w.parts().1.logged();
                match crate::types::blocking::try_all(w, &form, ctx.now_ms)? {
                    Some(o) => {
                        if w.parts().1.logged() != before {
                            if watches.active() {
                                form.for_each_key(&mut |k| watches.note(k, touched));
                            }
                            fed.extend(form.fed().map(<[u8]>::to_vec));
                        }
                        o
                    }
                    None => match once {
                        // Settled before it was tried (a timeout, a hang-up, CLIENT UNBLOCK):
                        // it does not wait.
                        Some(o) => o,
                        None => {
                            blocking.writer().wait(*id);
                            Outcome::Blocked
                        }
                    },
                }
            }
        }
    } else if let WriteOp::Script(x) = op {
        script(w, x, ctx, watches, touched, &mut fed)?
    } else {
        let o = apply(w, op, ctx, watches, touched)?;
        if blocking.any_queued() {
            fed_keys(op, &mut |k| fed.push(k.to_vec()));
        }
        o
    };
    if !fed.is_empty() && blocking.any_queued() {
        serve(w, fed, ctx, watches, touched, blocking, waiters)?;
    }
    Ok(outcome)
}

/// Pops for the waiters of each `ready` key, first come first served, while the key has
/// elements: a waiter of another type stays blocked; a BLMOVE's destination becomes ready in
/// turn.
fn serve<T: Clone>(
    w: &mut LmdbWrite<'_, '_>,
    mut ready: Vec<Vec<u8>>,
    ctx: Ctx,
    watches: &Watches,
    touched: &mut Touched,
    blocking: &Blocking<T>,
    waiters: &mut Waiters<T>,
) -> Result<(), StoreError> {
    use crate::types::blocking::{Try, try_key};
    let mut i = 0;
    // Each pass either serves a waiter (who leaves the registry) or moves past one: it ends.
    while i < ready.len() {
        let key = std::mem::take(&mut ready[i]);
        i += 1;
        let mut after = 0;
        loop {
            let claimed = blocking.writer().claim(&key, after, &mut waiters.journal);
            let Some((pos, c)) = claimed else { break };
            after = pos;
            let tried = try_key(w, &c.form, &key, ctx.now_ms);
            let outcome = match tried {
                Ok(Try::Popped(o)) => o,
                Ok(Try::Empty) => {
                    blocking.writer().unclaim(c.id, pos);
                    break;
                }
                Ok(Try::WrongType) => {
                    blocking.writer().unclaim(c.id, pos);
                    continue;
                }
                Err(e) => {
                    // The batch fails and is rolled back, claim included.
                    return Err(e);
                }
            };
            if outcome != Outcome::WrongType {
                if watches.active() {
                    c.form.for_each_key(&mut |k| {
                        if k == key.as_slice() || Some(k) == c.form.fed() {
                            watches.note(k, touched);
                        }
                    });
                }
                if let Some(d) = c.form.fed()
                    && !ready[i..].iter().any(|r| r.as_slice() == d)
                {
                    ready.push(d.to_vec());
                }
            }
            waiters.served.push((
                c.worker,
                Completion {
                    tag: c.tag,
                    outcome,
                },
            ));
        }
    }
    Ok(())
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

/// Paced commits (see `PRESSURE_GROWTH`): how long to wait for one more submission; also the
/// shortest wait for the last commits' writers (`Cohort`).
const GATHER_GAP: Duration = Duration::from_micros(50);
/// The longest the writer thread waits for the last commits' writers (`Cohort`).
const COHORT_WAIT_MAX: Duration = Duration::from_micros(1000);
/// A batch with this many writes waits for no more (`Cohort`).
const COHORT_ENOUGH: usize = 8;

/// How far above the last CAS unique handed out the stored bound goes (`cas_bound`): a
/// restart skips up to this many uniques.
const CAS_RESERVE: u64 = 1 << 20;

/// Most elements of deleted collections reclaimed per batch.
const GC_CHUNK: usize = 1000;

/// Bytes of live values the value log's collector moves per batch, about (`vlog::Move`).
const MOVE_BUDGET: usize = 2 << 20;

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

/// With the writer broken by a full disk, how often it tries again (`try_resume`).
const RESUME_EVERY: Duration = Duration::from_secs(2);

/// With the writer broken (a log or LMDB write failed), how often the log recalls it and
/// counts the writes refused meanwhile.
const REFUSED_REMINDER: Duration = Duration::from_secs(60);

/// After a commit did not fit the map, how long before the writer tries again by itself.
const FULL_RETRY: Duration = Duration::from_millis(100);

/// Most steps of one eviction pass (an item evicted, or a chunk of reclaimed elements or
/// expired items): a pass is a batch of its own, and client batches wait for it.
const EVICT_BUDGET: usize = 1024;

/// Time between expiry sweeps, and the most items one sweep deletes.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
const SWEEP_LIMIT: usize = 1000;

/// A delayed `flush_all` deadline in unix ms (0 = none), shared with the workers so reads treat
/// every item as gone once it has passed, even before the writer has cleared the store.
pub type FlushAt = Arc<AtomicU64>;

/// LMDB commits: the open write transaction is committed once the log holds this much since
/// it began, or its first batch is this old (and at once for a batch that cleared a database
/// or that the overlay could not take, before any checkpoint, and at a stop). What it holds is served meanwhile from
/// the overlay (`overlay.rs`) and kept in `uncommitted` for a rebuild.
const COMMIT_BYTES: usize = 4 << 20;
const COMMIT_EVERY: Duration = Duration::from_millis(250);
/// ... or once the overlay holds this many bytes of versions that later ones hide (a value
/// rewritten or edited again and again): they are freed only with the overlay's list.
const SUPERSEDED_MAX: u64 = 32 << 20;

pub struct Writer<T> {
    store: LmdbStore,
    wal: Wal,
    checkpointer: Checkpointer,
    last_checkpoint: Instant,
    /// Checkpoints that could not start, in a row (see `maybe_checkpoint`).
    checkpoints_failing: u64,
    /// The data file's last page when the last checkpoint began, and the page size.
    checkpoint_pgno: u64,
    page_size: u64,
    /// Set while commits are paced (see `PRESSURE_GROWTH`); read by workers without the lock.
    paced: Arc<std::sync::atomic::AtomicBool>,
    /// The batch's log records, kept between batches for its buffer (None only while a batch
    /// has it, or after a batch that failed: then the next one starts a new buffer).
    log: Option<LogBuf>,
    /// Set when the log could not be written or synced: durability is unknown from then on, so
    /// every later write is refused (reads go on) until a restart recovers.
    broken: Option<String>,
    clock: Arc<Clock>,
    cfg: WriterConfig,
    cas: u64,
    /// What the stored CAS counter (`META_CAS`) says in the open transaction: a bound above
    /// every CAS unique handed out, raised `CAS_RESERVE` at a time, so a batch writes it only
    /// when its uniques pass it, not every batch (one B-tree put and log record fewer per
    /// batch). A restart starts above it, so uniques never repeat. 0 on a replica: its
    /// primary's records write it.
    cas_bound: u64,
    /// `CAS_RESERVE`; `MEMKEEP_TEST_CAS_RESERVE` makes it small for tests.
    cas_reserve: u64,
    flush_at: FlushAt,
    mailboxes: Vec<Arc<Mailbox<T>>>,
    outboxes: Vec<Vec<Completion<T>>>,
    /// Deleted collections still have elements to reclaim.
    gc_more: bool,
    /// The keys RESP clients watch: told of every key a logged batch changed.
    watches: Arc<Watches>,
    /// Clients blocked in a blocking pop, which the batches' writes may serve.
    blocking: Arc<Blocking<T>>,
    /// The LMDB write transaction batches go into (begun and ended on the writer thread only).
    open: Option<OpenTxn>,
    /// What the open transaction changed in `items`, as last published to readers.
    map: Map,
    /// Overlays of committed transactions, kept until no reader holds them, so that freeing
    /// their lists (every version since their transaction began) falls to the writer thread,
    /// outside the lock, never to a worker between two requests.
    retired: Vec<Map>,
    /// The collections whose elements the open transaction changed, as last published.
    dirty: Dirty,
    /// Writes refused since the last reminder in the log, and when that was (see `refuse`).
    refused: (u64, Instant),
    /// Broken by a failed LMDB commit or a full disk under the log: when to try again
    /// (`try_resume`).
    resume_at: Option<Instant>,
    /// Set while `try_resume` tries: failures are not news.
    resuming: bool,
    /// Every batch in the open transaction, in order, as appended (`LogBuf::share`; the
    /// overlay's versions share the same buffers): their records are replayed into a fresh
    /// transaction when this one must be aborted (a write failed half-way).
    uncommitted: Vec<Arc<Vec<u8>>>,
    /// Bytes of records in `uncommitted`.
    uncommitted_bytes: usize,
    /// Bytes of new pages LMDB took for the `PATCH` records in `uncommitted`
    /// (`LogBuf::patched_dirty`): it holds that much dirty though the records are small, so
    /// it counts toward the commit. A value patched again in the same transaction counts only
    /// when it outgrows its pages, so rebuilding (rare) may replay up to `COMMIT_EVERY` of
    /// such patches.
    uncommitted_patched: u64,
    /// When the open transaction got its first batch.
    since: Option<Instant>,
    /// A write failed inside the open transaction, which LMDB then refuses to commit (or a
    /// batch reached it but not the log): the writer thread aborts it and rebuilds it from
    /// `uncommitted` before anything else goes in.
    poisoned: bool,
    /// Completions of batches a leader applied that readers may see only once LMDB has them
    /// (the overlay could not take them, near a full map): delivered by the writer thread's
    /// next commit.
    held: Vec<(usize, Completion<T>)>,
    /// The last commit did not fit the map: none is tried again before this (unless asked).
    full_until: Option<Instant>,
    /// The map's size, and whether the data is close to it (see `near_full`), refreshed
    /// between batches; leaders leave batches to the writer thread while it is set.
    map_size: u64,
    nearly_full: Arc<std::sync::atomic::AtomicBool>,
    /// LMDB's data file (to keep it covering every page LMDB counts).
    data: std::fs::File,
    /// Cache mode: the evictor and what it shares (None: the store is a store).
    cache: Option<Cache>,
    /// Where the sweeper's expired items are counted (`with_cache` sets it, cap or not).
    counters: Option<Arc<CacheStats>>,
    /// Cache mode: the data is past the cap; leaders leave batches to the writer thread,
    /// which evicts until it is under again.
    over: Arc<std::sync::atomic::AtomicBool>,
    /// Group commit in `always` (see `Cohort`): who wrote in the last commits, and how long
    /// the log's fdatasyncs take.
    cohort: Cohort,
    /// Replication (`replica.rs`): where durable batches go, and a buffer for them.
    repl: Option<Arc<super::repl::Hub>>,
    tapped: Vec<crate::storage::wal::Tapped>,
}

/// Group commit in `always`: which workers' connections wrote in the last two commits (writes
/// per worker), and a running mean of the fdatasync's time.
///
/// Why: connections are spread over the workers, and the first worker to submit would commit
/// alone while the others' writes, arriving a few microseconds later, waited a whole fdatasync
/// for the next commit. The two halves then alternate for good, each fdatasync covering half
/// the clients (7.7 writes per fdatasync at 16 connections, against Redis's 16, whose one
/// loop reads every client before it syncs). So a worker commits by itself only when no other
/// worker wrote in the last two commits, and the writer thread, once it holds the lock, waits
/// up to half an fdatasync for the writers of the last two commits to come back. Closed-loop
/// clients do, a round trip after their replies, and the cohorts merge into one. A worker
/// whose clients stopped writing drops out after two commits without it, so an idle client
/// costs at most two such waits.
///
/// The wait ends once the batch holds `COHORT_ENOUGH` writes: every write already in it
/// pays for the wait, and past a handful that costs more than the stragglers gain (they go
/// in the next fdatasync, which starts at once). Waiting for everyone, W1 SETs at 16
/// connections got 11.8 writes per fdatasync and 34,000/s; stopping at 8, 8.0 per fdatasync
/// and 40,000/s (Redis `appendfsync always` 35,000-37,000/s, same minutes); at 64
/// connections 66,000/s against 75,000/s; at 2 and 4 connections no change (2026-12-03).
#[derive(Debug, Default)]
struct Cohort {
    last: Vec<u32>,
    before: Vec<u32>,
    sync_mean: Duration,
}

impl Cohort {
    /// A commit of a client batch: its writes per worker.
    fn commit<T>(&mut self, batch: &[Submission<T>], workers: usize) {
        if batch.iter().all(|s| s.reqs.is_empty()) {
            // Housekeeping (a sweep, an eviction pass, a poke): not a cohort.
            return;
        }
        let mut now = std::mem::take(&mut self.before);
        now.clear();
        now.resize(workers, 0);
        for sub in batch {
            if let Some(n) = now.get_mut(sub.worker) {
                *n += sub.reqs.len() as u32;
            }
        }
        self.before = std::mem::replace(&mut self.last, now);
    }

    fn expected(&self, worker: usize) -> u32 {
        let at = |v: &Vec<u32>| v.get(worker).copied().unwrap_or(0);
        at(&self.last).max(at(&self.before))
    }

    /// Whether a worker's submission should go to the writer thread to be gathered with
    /// another worker's, rather than commit alone.
    fn others_wrote(&self, worker: usize) -> bool {
        let workers = self.last.len().max(self.before.len());
        (0..workers).any(|w| w != worker && self.expected(w) > 0)
    }

    /// How many writes of the last two commits' workers are not in `batch` yet (none once it
    /// holds `COHORT_ENOUGH`).
    fn missing<T>(&self, batch: &[Submission<T>]) -> u32 {
        let have: usize = batch.iter().map(|s| s.reqs.len()).sum();
        if have >= COHORT_ENOUGH {
            return 0;
        }
        let workers = self.last.len().max(self.before.len());
        (0..workers)
            .map(|w| {
                let have: u32 = batch
                    .iter()
                    .filter(|s| s.worker == w)
                    .map(|s| s.reqs.len() as u32)
                    .sum();
                self.expected(w).saturating_sub(have)
            })
            .sum()
    }

    /// How long the writer thread waits for them: half an fdatasync, within bounds.
    fn window(&self) -> Duration {
        (self.sync_mean / 2).clamp(GATHER_GAP, COHORT_WAIT_MAX)
    }

    fn synced(&mut self, took: Duration) {
        self.sync_mean = if self.sync_mean.is_zero() {
            took
        } else {
            (self.sync_mean * 7 + took) / 8
        };
    }
}

/// What a leader's attempt at committing came to.
enum Handled {
    /// Applied, logged, and the outcomes delivered.
    Done,
    /// Applied and logged; the outcomes wait for the writer thread's LMDB commit.
    Held,
    /// Not applied: the writer thread must take this batch.
    Requeue,
}

impl<T: Send + Clone> Writer<T> {
    pub fn new(
        durable: Durable,
        clock: Arc<Clock>,
        cfg: WriterConfig,
        flush_at: FlushAt,
        mailboxes: Vec<Arc<Mailbox<T>>>,
    ) -> std::io::Result<Writer<T>> {
        let Durable {
            store,
            persisted,
            mut wal,
            checkpointer,
            ..
        } = durable;
        // Outside `always`, appends are copies into a mapping of the segment (`wal::Mapping`);
        // `MEMKEEP_LOG_MAP=0` turns that off, for A/B runs.
        let map_off = std::env::var_os("MEMKEEP_LOG_MAP").is_some_and(|v| v == "0");
        wal.set_mapped(cfg.sync != SyncMode::Always && !map_off);
        // What ending a segment at a checkpoint syncs (`wal::EndSync`);
        // `MEMKEEP_LOG_END_SYNC=now` makes every mode sync it at once, for A/B runs.
        let end_now = std::env::var_os("MEMKEEP_LOG_END_SYNC").is_some_and(|v| v == "now");
        wal.set_end_sync(match cfg.sync {
            _ if end_now => EndSync::Now,
            SyncMode::Always => EndSync::Now,
            SyncMode::Periodic => EndSync::Later,
            SyncMode::Never => EndSync::Never,
        });
        flush_at.store(persisted.flush_at.unwrap_or(0), Ordering::Release);
        let checkpoint_pgno = store.env().info().last_page_number as u64;
        let page_size = store.env().stat().page_size as u64;
        let map_size = store.env().info().map_size as u64;
        let data = store
            .env()
            .try_clone_inner_file()
            .map_err(|e| std::io::Error::other(format!("cannot open LMDB's data file: {e}")))?;
        let outboxes = mailboxes.iter().map(|_| Vec::new()).collect();
        let blocking = Arc::new(Blocking::new(mailboxes.clone()));
        Ok(Writer {
            store,
            wal,
            checkpointer,
            last_checkpoint: Instant::now(),
            checkpoints_failing: 0,
            checkpoint_pgno,
            page_size,
            paced: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            log: Some(LogBuf::default()),
            broken: None,
            refused: (0, Instant::now()),
            resume_at: None,
            resuming: false,
            clock,
            cfg,
            cas: persisted.cas,
            cas_bound: persisted.cas,
            cas_reserve: std::env::var("MEMKEEP_TEST_CAS_RESERVE")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .unwrap_or(CAS_RESERVE),
            flush_at,
            mailboxes,
            outboxes,
            gc_more: true,
            watches: Arc::default(),
            blocking,
            open: None,
            map: Map::new(),
            retired: Vec::new(),
            dirty: Dirty::new_sync(),
            uncommitted: Vec::new(),
            uncommitted_bytes: 0,
            uncommitted_patched: 0,
            since: None,
            poisoned: false,
            held: Vec::new(),
            full_until: None,
            map_size,
            nearly_full: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            data,
            cache: None,
            counters: None,
            over: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            cohort: Cohort::default(),
            repl: None,
            tapped: Vec::new(),
        })
    }

    /// Cache mode (`cfg.max_disk` > 0): evict past the cap, counting into `stats`. Uses of
    /// keys are read from the store's access table (`LmdbStore::set_access`, set before the
    /// workers' clones were made); a store without one gets its own, which then knows only
    /// writes. A store already over the cap is brought under it by the writer thread's first
    /// passes.
    pub fn with_cache(mut self, stats: Arc<CacheStats>) -> Result<Writer<T>, StoreError> {
        self.counters = Some(stats.clone());
        if self.cfg.max_disk == 0 {
            return Ok(self);
        }
        let access = match self.store.access() {
            Some(a) => a.clone(),
            None => {
                warn!("cache mode without an access table: evicting by write order only");
                Arc::new(crate::storage::cache::Access::new())
            }
        };
        access.set_tick(self.cas);
        let cache = Cache::new(self.cfg.max_disk, self.page_size, access, stats);
        let pages = {
            let txn = self.store.read_txn()?;
            self.store.data_pages(&txn)?
        };
        cache
            .stats
            .data_bytes
            .store(pages * self.page_size, Ordering::Relaxed);
        if pages > cache.cap_pages {
            log::info!(
                "the data occupies {} bytes, over max_disk ({}): evicting",
                pages * self.page_size,
                self.cfg.max_disk
            );
            self.over.store(true, Ordering::Release);
        }
        self.cache = Some(cache);
        Ok(self)
    }

    /// Cache mode, after a batch: publishes the CAS counter as the readers' clock, and the
    /// data's pages; past the cap, sets `over` (the eviction pass clears it).
    fn check_cap(&mut self) {
        let Some(cache) = &self.cache else {
            return;
        };
        cache.access.set_tick(self.cas);
        let Some(open) = self.open.as_mut() else {
            return;
        };
        let Ok(txn) = open.txn() else {
            return;
        };
        if let Ok(pages) = self.store.data_pages(txn) {
            cache
                .stats
                .data_bytes
                .store(pages * cache.page_size, Ordering::Release);
            if pages > cache.cap_pages {
                self.over.store(true, Ordering::Release);
            }
        }
    }

    /// Whether an eviction pass is due (cache mode, over the cap).
    fn over(&self) -> bool {
        self.over.load(Ordering::Acquire) && self.broken.is_none()
    }

    /// Whether the value log's collector left values to move (`vlog::Move`).
    fn moves_due(&self) -> bool {
        let Some(v) = self.store.vlog() else {
            return false;
        };
        let moving = !self.is_replica();
        v.set_moving(moving);
        moving && self.broken.is_none() && v.has_moves()
    }

    /// Shares the registry of watched keys with the workers (WATCH).
    pub fn with_watches(mut self, watches: Arc<Watches>) -> Writer<T> {
        self.watches = watches;
        self
    }

    /// Shares the registry of blocked clients with the workers (blocking pops).
    pub fn with_blocking(mut self, blocking: Arc<Blocking<T>>) -> Writer<T> {
        self.blocking = blocking;
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
            always: self.cfg.sync == SyncMode::Always,
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
        self.nearly_full.store(self.near_full(0), Ordering::Release);
        let paced = self.growth().1 >= PRESSURE_GROWTH;
        if paced != self.paced.load(Ordering::Relaxed) {
            debug!("commit pacing {}", if paced { "on" } else { "off" });
            self.paced.store(paced, Ordering::Release);
        }
    }

    /// Starts a checkpoint when one is due (or, with `now`, whenever the log holds anything)
    /// and none is running. Writer thread only: the checkpoint pins the last LMDB commit, so
    /// the open transaction is committed first.
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
        if self.commit_lmdb().is_err() {
            return;
        }
        self.last_checkpoint = Instant::now();
        self.checkpoint_pgno = pgno;
        debug!("checkpoint begins at batch {}", self.wal.last_seq());
        self.forget_covered();
        match self.checkpointer.begin(&self.store, &mut self.wal) {
            // Tried again each second: said once, and once more when one starts (out of
            // descriptors it was an ERROR line a second).
            Err(e) if self.checkpoints_failing == 0 => {
                error!("cannot start a checkpoint: {e}; trying again each second");
                self.checkpoints_failing = 1;
            }
            Err(e) => {
                debug!("cannot start a checkpoint: {e}");
                self.checkpoints_failing += 1;
            }
            Ok(()) if self.checkpoints_failing > 0 => {
                info!(
                    "checkpoints start again ({} attempts failed)",
                    self.checkpoints_failing
                );
                self.checkpoints_failing = 0;
            }
            Ok(()) => {}
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

    /// Lets the log forget the ended segments the last completed checkpoint covers
    /// (`Wal::drop_covered`): they need no sync of their own.
    fn forget_covered(&mut self) {
        let first = self
            .checkpointer
            .stats
            .first_segment
            .load(Ordering::Acquire);
        self.wal.drop_covered(first);
    }

    /// Makes the log durable; a failure breaks the writer (see `broken`).
    fn sync_log(&mut self) -> bool {
        if self.broken.is_some() {
            return false;
        }
        self.forget_covered();
        match self.wal.sync() {
            Ok(()) => true,
            Err(e) => {
                self.break_log(format!("fdatasync of the write-ahead log failed: {e}"));
                false
            }
        }
    }

    /// The retired overlays no reader holds any more, for the caller to drop outside the lock.
    fn unused_overlays(&mut self) -> Vec<Map> {
        let (held, unused) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(|m| m.in_use());
        self.retired = held;
        unused
    }

    /// Refuses every later write (see `broken`). Logged once: what keeps failing afterwards is
    /// counted and recalled every `REFUSED_REMINDER` (`refuse`), never logged per attempt.
    fn break_log(&mut self, why: String) {
        if self.broken.is_some() || self.resuming {
            debug!("also: {why}");
            self.broken.get_or_insert(why);
            return;
        }
        // A full disk shows as whatever the failed call made of it (LMDB turns a short write
        // into EIO): say so when the data directory's file system has no room left.
        let why = format!("{why}{}", crate::storage::disk_full_hint(self.wal.dir()));
        if self.resume_at.is_some() {
            error!(
                "{why}; refusing writes until there is room again (tried every {} s) or memkeep is restarted",
                RESUME_EVERY.as_secs()
            );
        } else {
            error!("{why}; refusing writes until memkeep is restarted");
        }
        self.broken = Some(why);
        self.refused = (0, Instant::now());
    }

    /// An append to the log failed with `e`, which is about to break the writer: a full disk
    /// (or quota) left the log as it was (the failed batch's bytes lie past its end, where the
    /// next append overwrites them, as after `Wal::undo`), so writes may resume
    /// (`try_resume`). Any other failure, and any failed sync, stays broken: after a failed
    /// fdatasync the kernel may have dropped the dirty pages it could not write.
    fn note_resumable(&mut self, e: &std::io::Error) {
        if self.broken.is_none() && matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
            self.resume_at = Some(Instant::now() + RESUME_EVERY);
        }
    }

    /// Broken by a failed LMDB commit or a log append that found the disk full (not by a
    /// failed sync), so the log holds every acknowledged batch: every `RESUME_EVERY`, rebuilds
    /// the open transaction from those batches and commits it; writes resume if that works.
    /// LMDB writes a commit's meta page after its pages, so a commit that failed changed
    /// nothing it would read; one whose meta page failed makes LMDB refuse every later
    /// transaction (MDB_PANIC), and the writer stays broken.
    fn try_resume(&mut self) {
        let Some(at) = self.resume_at else {
            return;
        };
        if self.broken.is_none() || Instant::now() < at {
            return;
        }
        // No look at the free space first: root may write into blocks statvfs does not count
        // as available, and a try costs a replay of at most `COMMIT_BYTES` of records.
        let why = self.broken.take();
        self.resuming = true;
        self.rebuild();
        let ok = self.broken.is_none() && self.commit_lmdb().is_ok();
        self.resuming = false;
        if ok {
            info!(
                "writes resume: LMDB committed again ({} writes refused since the last reminder; it was: {})",
                self.refused.0,
                why.unwrap_or_default()
            );
            self.resume_at = None;
        } else {
            // Still failing (said at debug level): keep the first reason, try again later.
            self.broken = why;
            self.resume_at = Some(Instant::now() + RESUME_EVERY);
        }
    }

    /// Counts `writes` refused because the writer is broken, and says so in the log at most
    /// once per `REFUSED_REMINDER`.
    fn refuse(&mut self, writes: usize) {
        let Some(why) = &self.broken else {
            return;
        };
        self.refused.0 += writes as u64;
        if self.refused.1.elapsed() >= REFUSED_REMINDER {
            let then = if self.resume_at.is_some() {
                "writes resume by themselves once there is room again"
            } else {
                "restart memkeep once the cause is fixed"
            };
            warn!(
                "{} writes refused in the last {} s: {why}; {then}",
                self.refused.0,
                self.refused.1.elapsed().as_secs()
            );
            self.refused = (0, Instant::now());
        }
    }

    /// Publishes (and keeps) an empty overlay over LMDB transaction `base`, which holds
    /// everything.
    fn publish_empty(&mut self, base: usize) {
        let old = std::mem::take(&mut self.map);
        if !old.is_empty() {
            self.retired.push(old);
        }
        self.dirty = Dirty::new_sync();
        self.store
            .overlay()
            .publish(base, self.map.clone(), Dirty::new_sync());
    }

    /// Begins the write transaction batches go into (writer thread only) and publishes the
    /// empty overlay over the snapshot it starts from.
    fn begin(&mut self) -> Result<(), StoreError> {
        if self.open.is_none() {
            let open = OpenTxn::begin(&self.store)?;
            self.publish_empty(open.id().saturating_sub(1));
            self.open = Some(open);
        }
        Ok(())
    }

    /// Counts a batch just appended to the log (`stats` `log_bytes`).
    fn count_log_bytes(&self, log: &LogBuf) {
        if let Some(c) = &self.counters {
            let bytes = (crate::storage::wal::HEADER + log.payload_len()) as u64;
            c.log_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Whether the open transaction should be committed now.
    fn commit_due(&self) -> bool {
        if self.broken.is_some() {
            // Nothing reaches LMDB any more (the log holds what was acknowledged; a restart
            // replays it): only completions held for a commit are due, to fail them.
            return !self.held.is_empty();
        }
        if self.full_until.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        !self.held.is_empty()
            || (!self.uncommitted.is_empty()
                && (self.uncommitted_bytes as u64 + self.uncommitted_patched
                    >= COMMIT_BYTES as u64
                    || self.map.superseded() >= SUPERSEDED_MAX
                    || self.since.is_some_and(|t| t.elapsed() >= COMMIT_EVERY)
                    || self.store.overlay().commit_asked.load(Ordering::Acquire)))
    }

    /// Commits the open transaction to LMDB (without sync: the log has it), publishes the
    /// empty overlay over the new snapshot, delivers held completions, and begins the next
    /// transaction. Writer thread only. A commit that does not fit the map (LMDB allocates
    /// pages for its free list as it commits) leaves the transaction as it was, rebuilt, and
    /// is tried again later; any other failure is retried once on a rebuilt transaction, then
    /// breaks the writer (the log holds every acknowledged batch; a restart replays them).
    fn commit_lmdb(&mut self) -> Result<(), StoreError> {
        self.store
            .overlay()
            .commit_asked
            .store(false, Ordering::Release);
        if let Some(why) = &self.broken {
            let e = StoreError::Backend(why.clone());
            for (worker, mut c) in self.held.drain(..) {
                c.outcome = Outcome::Failed;
                self.outboxes[worker].push(c);
            }
            self.deliver(None);
            return Err(e);
        }
        if self.poisoned {
            self.rebuild();
        }
        if self.uncommitted.is_empty() && self.held.is_empty() {
            return Ok(());
        }
        let mut result = Err(StoreError::Backend("no write transaction".into()));
        for attempt in 0..2 {
            if attempt > 0 {
                self.rebuild();
            }
            let Some(open) = self.open.take() else {
                continue;
            };
            result = open.commit();
            match &result {
                Ok(_) => break,
                Err(StoreError::Full) => {
                    self.rebuild();
                    self.full_until = Some(Instant::now() + FULL_RETRY);
                    return Err(StoreError::Full);
                }
                Err(e) if self.resuming => debug!("LMDB commit failed again: {e}"),
                Err(e) => error!("LMDB commit failed: {e}"),
            }
        }
        let delivered = match result {
            Ok(id) => {
                if let Some(hub) = &self.repl {
                    hub.committed(id as u64, self.wal.last_seq());
                }
                // Pages LMDB counts but never wrote (allocated and freed again in the
                // transaction) must still be inside the file: see `durable::cover`.
                let need = (self.store.env().info().last_page_number as u64 + 1) * self.page_size;
                if let Err(e) = crate::storage::durable::cover(&self.data, need) {
                    warn!("cannot extend the data file: {e}");
                }
                self.publish_empty(id);
                self.uncommitted.clear();
                self.uncommitted_bytes = 0;
                self.uncommitted_patched = 0;
                self.since = None;
                self.full_until = None;
                Ok(())
            }
            Err(e) => {
                if self.broken.is_none() {
                    // The log is intact: try again once there may be room (`try_resume`).
                    self.resume_at = Some(Instant::now() + RESUME_EVERY);
                }
                self.break_log(format!("cannot commit to LMDB: {e}"));
                for (_, c) in self.held.iter_mut() {
                    c.outcome = Outcome::Failed;
                }
                Err(e)
            }
        };
        for (worker, c) in self.held.drain(..) {
            self.outboxes[worker].push(c);
        }
        self.deliver(None);
        if self.broken.is_none()
            && let Err(e) = self.begin()
        {
            error!("cannot begin a write transaction: {e}");
        }
        delivered
    }

    /// Logs a batch already applied to the open transaction and commits LMDB before anyone
    /// is told (writer thread): for batches readers may see only through LMDB, and for every
    /// batch while the map is nearly full. If the commit fails, the batch is taken back out
    /// of the log and of the transaction (rebuilt from the batches before it).
    fn log_and_commit(&mut self, log: &mut LogBuf) -> Result<(), StoreError> {
        let (pos, seq) = (self.wal.position(), self.wal.last_seq() + 1);
        if !log.fits() {
            // Too much for one log record (a group of large values): nothing was logged. The
            // transaction holds the batch, so it is rebuilt, and the caller runs each write
            // alone, in a record of its own.
            self.poisoned = true;
            self.rebuild();
            return Err(StoreError::Backend(format!(
                "a batch of {} bytes is too large for one log record",
                log.payload_len()
            )));
        }
        if let Err(e) = self.wal.append(log) {
            let why = format!("cannot append to the write-ahead log: {e}");
            self.note_resumable(&e);
            self.break_log(why.clone());
            self.poisoned = true;
            return Err(StoreError::Backend(why));
        }
        self.count_log_bytes(log);
        let before = (self.uncommitted_bytes, self.uncommitted_patched);
        self.uncommitted_patched += log.patched_dirty();
        self.keep_uncommitted(log.share());
        self.since.get_or_insert_with(Instant::now);
        match self.commit_lmdb() {
            Ok(()) => Ok(()),
            Err(e) => {
                if self.broken.is_none() {
                    if let Err(u) = self.wal.undo(pos, seq) {
                        self.break_log(format!(
                            "cannot take back a log batch whose commit failed: {u}"
                        ));
                    }
                    self.uncommitted.pop();
                    self.uncommitted_bytes = before.0;
                    self.uncommitted_patched = before.1;
                    self.poisoned = true;
                    self.rebuild();
                }
                Err(e)
            }
        }
    }

    /// Keeps a batch just appended (`LogBuf::share`) for a rebuild of the open transaction.
    fn keep_uncommitted(&mut self, batch: Arc<Vec<u8>>) {
        self.uncommitted_bytes += batch.len().saturating_sub(HEADER);
        self.uncommitted.push(batch);
    }

    /// Whether the map is close enough to full that every batch must commit LMDB before it
    /// is acknowledged (as a commit that does not fit then refuses only that batch), counting
    /// `extra` more log bytes into the open transaction. Acknowledged batches in the open
    /// transaction must always fit at its commit, so the estimate is pessimistic: the data
    /// file's high-water mark (free pages inside it are not counted), twice the bytes logged
    /// into the transaction (pages, branch pages, the free list's own pages), and a margin.
    fn near_full(&self, extra: usize) -> bool {
        let used = (self.store.env().info().last_page_number as u64 + 1) * self.page_size;
        let pending = 2 * (self.uncommitted_bytes as u64 + self.uncommitted_patched + extra as u64);
        let margin = (4 * COMMIT_BYTES as u64).min(self.map_size / 4);
        used + pending + margin > self.map_size
    }

    /// Aborts the open transaction and replays `uncommitted` into a fresh one (writer thread
    /// only): the state every acknowledged batch left, without the batch that failed.
    fn rebuild(&mut self) {
        self.open = None;
        self.poisoned = false;
        if self.broken.is_some() {
            return;
        }
        let store = self.store.clone();
        let r = OpenTxn::begin(&store)
            .map_err(|e| e.to_string())
            .and_then(|mut open| {
                for batch in &self.uncommitted {
                    open.replay(&store, batch.get(HEADER..).unwrap_or_default())?;
                }
                Ok(open)
            });
        match r {
            Ok(open) => self.open = Some(open),
            Err(e) => self.break_log(format!(
                "cannot rebuild the write transaction from the log: {e}"
            )),
        }
    }

    /// Delivers every outbox, waking each worker but `awake` (the one committing, which looks
    /// at its mailbox next anyway).
    fn deliver(&mut self, awake: Option<usize>) {
        // Before the replies: a client's WAIT after its write counts its batch in.
        self.release_repl();
        for (i, (mailbox, outbox)) in self
            .mailboxes
            .iter()
            .zip(self.outboxes.iter_mut())
            .enumerate()
        {
            mailbox.deliver(outbox, awake != Some(i));
        }
    }

    /// Applies `batch` to the open transaction and logs it as one batch, then delivers the
    /// outcomes once it is durable per the sync mode and visible to readers (in the overlay,
    /// or committed to LMDB for a batch the overlay cannot take).
    ///
    /// `leader` is the worker committing on its own thread, or None on the writer thread. A
    /// leader never begins or ends the LMDB transaction (see `OpenTxn`): what needs that comes
    /// back as `Requeue` (nothing applied) or `Held`. Returns how many expired items the sweep
    /// removed.
    ///
    /// `evict` (writer thread, cache mode) makes this an eviction pass: `batch` is empty, and
    /// after it applies, the evictor runs in the same transaction and log batch.
    fn commit(
        &mut self,
        batch: &mut Vec<Submission<T>>,
        sweep: bool,
        leader: Option<usize>,
        evict: bool,
    ) -> (Handled, usize) {
        if leader.is_some() {
            if self.poisoned
                || self.open.is_none()
                || !self.held.is_empty()
                || self.flush_due()
                || self.nearly_full.load(Ordering::Acquire)
                || self.blocking.any_queued()
                || self.over.load(Ordering::Acquire)
            {
                // (With waiters queued, any write may feed one: the writer thread serves them.)
                return (Handled::Requeue, 0);
            }
        } else {
            if !self.held.is_empty() || self.poisoned {
                let _ = self.commit_lmdb();
            }
            if self.open.is_none()
                && self.broken.is_none()
                && let Err(e) = self.begin()
            {
                error!("cannot begin a write transaction: {e}");
            }
        }
        let ctx = Ctx {
            now_ms: self.clock.now_ms(),
            item_size_max: self.cfg.item_size_max,
        };
        let mut outcomes: Vec<Outcome> =
            Vec::with_capacity(batch.iter().map(|s| s.reqs.len()).sum());
        let mut swept = 0;
        let mut ran_due = false;
        let mut gc_more = self.gc_more;
        let mut cas = self.cas;
        let watches = self.watches.clone();
        let mut touched = Touched::default();
        let blocking = self.blocking.clone();
        let mut waiters = Waiters::default();
        let mut open = self.open.take();
        let replica = self.is_replica();
        let mut cache = if evict { self.cache.take() } else { None };
        let mut evicted = None;
        let spare = self.log.take().unwrap_or_default();
        // The stored CAS bound this batch raises, once it is logged (see `cas_bound`).
        let mut bound = None;
        // Where this batch will be appended (nothing else is, before it, under the lock).
        let sink = self
            .store
            .sink(self.wal.segment(), self.wal.position(), || self.wal.file());
        let applied_log: Result<LogBuf, StoreError> = match (&self.broken, open.as_mut()) {
            (Some(_), _) => Err(StoreError::Backend("the write-ahead log is broken".into())),
            (None, None) => Err(StoreError::Backend("no write transaction".into())),
            (None, Some(open)) => {
                let store = self.store.clone();
                let due = leader.is_none() && self.flush_due();
                (|| -> Result<LogBuf, StoreError> {
                    let txn = open.txn()?;
                    txn.set_sink(sink);
                    if due {
                        ran_due = store.run_due_flush(txn, ctx.now_ms)?;
                        if ran_due && watches.active() {
                            watches.note_all(&mut touched);
                        }
                    }
                    if sweep {
                        swept = store.sweep_expired(txn, ctx.now_ms, SWEEP_LIMIT)?;
                    }
                    for sub in batch.iter() {
                        for req in &sub.reqs {
                            let mut w = store.writer(txn, &mut cas);
                            outcomes.push(apply_req(
                                &mut w,
                                &req.op,
                                ctx,
                                &watches,
                                &mut touched,
                                &blocking,
                                &mut waiters,
                            )?);
                        }
                    }
                    if replica {
                        // Its counter follows its primary's records (`repl::apply`), which
                        // write the stored one too: kept exact, as they leave it.
                        if cas != self.cas {
                            store.put_cas(txn, cas)?;
                        }
                    } else if cas > self.cas_bound {
                        let b = cas.saturating_add(self.cas_reserve);
                        store.put_cas(txn, b)?;
                        bound = Some(b);
                    }
                    // A replica reclaims nothing itself: its primary's reclaiming comes along.
                    if !replica && store.gc_pending(txn)? {
                        store.collect_garbage(txn, GC_CHUNK)?;
                        gc_more = store.gc_pending(txn)?;
                    } else {
                        gc_more = false;
                    }
                    if let Some(c) = cache.as_mut() {
                        // An evicted key changes for whoever watches it, as in Redis.
                        let watching = watches.active();
                        let pass = c.evict(&store, txn, ctx.now_ms, EVICT_BUDGET, &mut |k| {
                            if watching {
                                watches.note(k, &mut touched);
                            }
                        })?;
                        gc_more = store.gc_pending(txn)?;
                        evicted = Some(pass);
                    }
                    // The value log's collection: live values of mostly dead segments written
                    // again at the log's end (`vlog::Collector`), a budget per batch. Not by a
                    // leader (the writer thread does it) nor by a replica (its primary's moves
                    // come along as writes).
                    if leader.is_none()
                        && !replica
                        && let Some(v) = store.vlog()
                    {
                        for m in v.take_moves(MOVE_BUDGET) {
                            if store.relocate(txn, &m)? {
                                v.note_moved(m.value.len() as u64);
                            }
                        }
                        gc_more = gc_more || v.has_moves();
                    }
                    Ok(txn.take_log(spare))
                })()
            }
        };
        // A batch that failed half-way did not take its log (nor its sink, whose position
        // holds only for this batch).
        if let Some(Ok(t)) = open.as_mut().map(OpenTxn::txn) {
            t.set_sink(None);
        }
        self.open = open;
        if let Some(c) = cache {
            self.cache = Some(c);
        }
        if evict {
            // Done, or to be tried again after the next batch (which sets it again if the
            // data is still over the cap): a pass that failed must not spin.
            let done = evicted.is_none_or(|p| p.done);
            self.over.store(!done, Ordering::Release);
        }
        // CAS uniques handed out by a failed batch are skipped, never reused.
        self.cas = cas;
        if replica {
            // Unknown once a primary's records have written it: the first batch after a
            // promotion stores a bound of its own.
            self.cas_bound = 0;
        }
        let mut log = match applied_log {
            Ok(log) => {
                self.gc_more = gc_more;
                log
            }
            Err(e) => {
                waiters.rollback(&blocking);
                if self.broken.is_none() {
                    // LMDB refuses to commit a transaction a write failed in, and this batch
                    // may be half in it: it is aborted and rebuilt from the log.
                    self.poisoned = true;
                }
                if leader.is_some() && self.broken.is_none() {
                    return (Handled::Requeue, 0);
                }
                self.fallback(batch, e, ctx);
                return (Handled::Done, swept);
            }
        };
        let mut handled = Handled::Done;
        let mut failed = false;
        if !log.fits() {
            // Too much for one log record (a group of large values): nothing was logged. The
            // transaction holds the batch, so it is rebuilt, and each write runs alone, in a
            // record of its own.
            let e = StoreError::Backend(format!(
                "a batch of {} bytes is too large for one log record",
                log.payload_len()
            ));
            self.poisoned = true;
            log.reset();
            self.log = Some(log);
            waiters.rollback(&blocking);
            if leader.is_some() {
                // Only the writer thread begins and ends LMDB transactions: it runs this.
                return (Handled::Requeue, 0);
            }
            self.rebuild();
            self.fallback(batch, e, ctx);
            return (Handled::Done, swept);
        }
        if !log.is_empty() {
            let mut dirty = self.dirty.clone();
            let changes = match overlay::absorb(&mut dirty, log.payload(), log.patched()) {
                Ok(c) => c.filter(|a| {
                    !self.near_full(log.payload_len() + log.patched_dirty() as usize)
                        && a.edits_resolve(&self.map)
                }),
                Err(e) => {
                    error!("cannot read back a batch's records: {e}");
                    None
                }
            };
            let visible_now = changes.is_some();
            if !visible_now && leader.is_some() && !waiters.journal.is_empty() {
                // Held replies wait for the writer thread's LMDB commit, but a blocking pop
                // this batch touched would be settled (and could be answered by a timeout)
                // at once, ahead of its connection's earlier replies: the writer thread runs
                // such a batch (it commits before it delivers). Nothing is logged yet.
                self.poisoned = true;
                log.reset();
                self.log = Some(log);
                waiters.rollback(&blocking);
                return (Handled::Requeue, 0);
            }
            if visible_now || leader.is_some() {
                match self.wal.append(&mut log) {
                    Err(e) => {
                        self.note_resumable(&e);
                        self.break_log(format!("cannot append to the write-ahead log: {e}"));
                        self.poisoned = true;
                        failed = true;
                    }
                    Ok(_) => {
                        if let Some(b) = bound {
                            self.cas_bound = b;
                        }
                        self.count_log_bytes(&log);
                        self.uncommitted_patched += log.patched_dirty();
                        let shared = log.share();
                        self.keep_uncommitted(shared.clone());
                        self.since.get_or_insert_with(Instant::now);
                        if let Some(changes) =
                            changes.and_then(|a| a.changes(&shared, HEADER, &self.map))
                        {
                            let base = self.open.as_ref().map_or(0, |o| o.id().saturating_sub(1));
                            let map = self.map.with(changes);
                            self.store
                                .overlay()
                                .publish(base, map.clone(), dirty.clone());
                            self.map = map;
                            self.dirty = dirty;
                        } else {
                            handled = Handled::Held;
                        }
                    }
                }
            } else if let Err(e) = self.log_and_commit(&mut log).inspect(|()| {
                if let Some(b) = bound {
                    self.cas_bound = b;
                }
            }) {
                log.reset();
                if self.broken.is_some() {
                    failed = true;
                } else {
                    // Taken back out: run each write alone.
                    waiters.rollback(&blocking);
                    self.fallback(batch, e, ctx);
                    return (Handled::Done, swept);
                }
            }
        }
        log.reset();
        self.log = Some(log);
        // Counted once readers see the items gone, so `stats` never shows an eviction whose
        // item it still counts.
        if let (Some(p), Some(c), None) = (evicted, &self.cache, &self.broken) {
            let st = &c.stats;
            st.evictions.fetch_add(p.evicted, Ordering::Release);
            st.evicted_unfetched
                .fetch_add(p.unfetched, Ordering::Release);
            st.expired_reclaimed.fetch_add(p.expired, Ordering::Release);
            st.data_bytes
                .store(p.pages * c.page_size, Ordering::Release);
            if p.evicted + p.expired > 0 {
                debug!(
                    "evicted {} items ({} unfetched, {} expired), {} elements reclaimed; data now {} pages",
                    p.evicted, p.unfetched, p.expired, p.reclaimed, p.pages
                );
            }
        }
        // Logged and visible (or failed): watchers of what it changed must hear of it.
        watches.publish(&mut touched);
        // An eviction pass answers no one, so it need not wait for an fdatasync of its own:
        // the next batch's covers it (the log is one sequence). Lost in a crash, its items
        // come back and are evicted again.
        let unanswered = evict && batch.is_empty() && !ran_due;
        let durable = self.cfg.sync != SyncMode::Always || unanswered || {
            let t = Instant::now();
            let ok = self.sync_log();
            self.cohort.synced(t.elapsed());
            ok
        };
        if self.cfg.sync == SyncMode::Always {
            self.cohort.commit(batch, self.outboxes.len());
            let writes: usize = batch.iter().map(|s| s.reqs.len()).sum();
            if let (Some(c), true) = (&self.counters, writes > 0 && !unanswered) {
                c.log_fsyncs.fetch_add(1, Ordering::Relaxed);
                c.log_fsync_writes
                    .fetch_add(writes as u64, Ordering::Relaxed);
            }
        }
        if failed {
            fail_all(&mut outcomes);
        }
        if durable {
            let ops = batch
                .iter()
                .flat_map(|s| s.reqs.iter().map(|r| &r.op))
                .zip(outcomes.iter())
                .flat_map(|(op, o)| applied(op, o));
            self.publish_flush(ran_due, ops, ctx.now_ms);
        } else {
            // Not known durable: no write of the batch is acknowledged.
            fail_all(&mut outcomes);
        }
        let mut outcomes = outcomes.into_iter();
        for sub in batch.drain(..) {
            for req in sub.reqs {
                let c = Completion {
                    tag: req.tag,
                    outcome: outcomes.next().unwrap_or(Outcome::Failed),
                };
                if c.outcome == Outcome::Blocked {
                    continue;
                }
                match handled {
                    Handled::Held => self.held.push((sub.worker, c)),
                    _ => self.outboxes[sub.worker].push(c),
                }
            }
        }
        for (worker, c) in waiters.finish(&blocking, failed || !durable) {
            match handled {
                Handled::Held => self.held.push((worker, c)),
                _ => self.outboxes[worker].push(c),
            }
        }
        // Before the replies: a client that reads `stats` after its write sees the data's
        // size as this batch left it (and whether an eviction pass is due).
        self.check_cap();
        if let (Some(c), false) = (&self.counters, failed) {
            // Published (committed) before counted, as evictions are.
            c.expired_swept.fetch_add(swept as u64, Ordering::Release);
        }
        self.deliver(leader);
        self.nearly_full.store(self.near_full(0), Ordering::Release);
        (handled, swept)
    }

    /// A batch failed part-way (writer thread): rebuild the transaction without it, commit
    /// what is there, and run each write alone, so one write's failure (the map is full) does
    /// not fail its batch-mates.
    fn fallback(&mut self, batch: &mut Vec<Submission<T>>, e: StoreError, ctx: Ctx) {
        if self.broken.is_some() {
            // Said once when it broke: every write fails, quietly.
            self.refuse(batch.iter().map(|s| s.reqs.len()).sum());
        } else if e.is_damage() {
            // Logged once where it was found; the writes that meet it say so.
            debug!("batch met damage, retrying each write alone: {e}");
        } else if !matches!(e, StoreError::Full) {
            error!("batch failed, retrying each write alone: {e}");
        }
        let _ = self.commit_lmdb();
        if matches!(e, StoreError::Full) {
            debug!("store full: checkpointing, then retrying one write at a time");
            self.checkpoint_now();
            // A fresh transaction, begun after the pin moved, looks for reusable pages anew.
            self.rebuild();
        }
        let mut outcomes = Vec::new();
        let mut waiters = Waiters::default();
        for sub in batch.iter() {
            for req in &sub.reqs {
                outcomes.push(self.commit_one(&req.op, ctx, &mut waiters));
            }
        }
        let failed = self.cfg.sync == SyncMode::Always && !self.sync_log();
        if failed {
            fail_all(&mut outcomes);
        }
        let mut outcomes = outcomes.into_iter();
        for sub in batch.drain(..) {
            for req in sub.reqs {
                let outcome = outcomes.next().unwrap_or(Outcome::Failed);
                if outcome != Outcome::Blocked {
                    self.outboxes[sub.worker].push(Completion {
                        tag: req.tag,
                        outcome,
                    });
                }
            }
        }
        let blocking = self.blocking.clone();
        for (worker, c) in waiters.finish(&blocking, failed) {
            self.outboxes[worker].push(c);
        }
        self.check_cap();
        self.deliver(None);
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

    /// One write in its own LMDB transaction, committed before it is answered (writer thread,
    /// the fallback when a batch could not go in whole). The caller syncs the log.
    fn commit_one(&mut self, op: &WriteOp, ctx: Ctx, waiters: &mut Waiters<T>) -> Outcome {
        if self.broken.is_some() {
            return Outcome::Failed;
        }
        if self.open.is_none()
            && let Err(e) = self.begin()
        {
            warn!("write failed: {e}");
            return Outcome::Failed;
        }
        let mut cas = self.cas;
        let store = self.store.clone();
        let watches = self.watches.clone();
        let mut touched = Touched::default();
        let blocking = self.blocking.clone();
        let mut mine = Waiters::default();
        let mut open = self.open.take();
        let (replica, cas_bound, reserve) = (self.is_replica(), self.cas_bound, self.cas_reserve);
        let mut bound = None;
        let sink = self
            .store
            .sink(self.wal.segment(), self.wal.position(), || self.wal.file());
        let result = (|| -> Result<(Outcome, LogBuf), StoreError> {
            let open = open
                .as_mut()
                .ok_or_else(|| StoreError::Backend("no write transaction".into()))?;
            let txn = open.txn()?;
            txn.set_sink(sink);
            let mut w = store.writer(txn, &mut cas);
            let outcome = apply_req(
                &mut w,
                op,
                ctx,
                &watches,
                &mut touched,
                &blocking,
                &mut mine,
            )?;
            if replica {
                store.put_cas(txn, cas)?;
            } else if cas > cas_bound {
                let b = cas.saturating_add(reserve);
                store.put_cas(txn, b)?;
                bound = Some(b);
            }
            Ok((outcome, txn.take_log(LogBuf::default())))
        })();
        if let Some(Ok(t)) = open.as_mut().map(OpenTxn::txn) {
            t.set_sink(None);
        }
        self.open = open;
        // CAS uniques handed out by an aborted write are skipped, never reused.
        self.cas = cas;
        if replica {
            self.cas_bound = 0;
        }
        match result {
            Ok((o, mut log)) => {
                if !log.is_empty()
                    && let Err(e) = self.log_and_commit(&mut log)
                {
                    mine.rollback(&blocking);
                    return failed_outcome(e);
                }
                if let Some(b) = bound {
                    self.cas_bound = b;
                }
                waiters.append(mine);
                watches.publish(&mut touched);
                self.publish_flush(false, applied(op, &o), ctx.now_ms);
                o
            }
            Err(e) => {
                mine.rollback(&blocking);
                self.poisoned = true;
                self.rebuild();
                failed_outcome(e)
            }
        }
    }

    /// A clean stop (writer thread): everything into LMDB and a last checkpoint, so nothing is
    /// left to replay, and the transaction ended on the thread that began it.
    fn stop(&mut self) {
        self.sync_log();
        let _ = self.commit_lmdb();
        self.checkpoint_now();
        self.open = None;
        self.checkpointer.finish();
    }
}

/// What a write that failed in the store answers.
fn failed_outcome(e: StoreError) -> Outcome {
    match e {
        StoreError::Full => Outcome::Full,
        StoreError::Damaged(_) => Outcome::Damaged,
        e => {
            warn!("write failed: {e}");
            Outcome::Failed
        }
    }
}

fn lock<T>(core: &Mutex<Writer<T>>) -> std::sync::MutexGuard<'_, Writer<T>> {
    core.lock().unwrap_or_else(|p| p.into_inner())
}

/// The writer thread: takes what workers could not commit themselves (another commit was
/// running, or submissions were already queued), gathers it into batches, commits LMDB when
/// due, and does the housekeeping. Runs until every gate is gone, then checkpoints and returns.
fn run<T: Send + Clone>(
    core: Arc<Mutex<Writer<T>>>,
    rx: Receiver<Submission<T>>,
    queued: Arc<AtomicUsize>,
) {
    crate::command::mark_writer_thread();
    let mut batch: Vec<Submission<T>> = Vec::new();
    let mut next_sweep = Instant::now();
    let (sync, sync_interval, max_batch) = {
        let mut w = lock(&core);
        if let Err(e) = w.begin() {
            error!("cannot begin a write transaction: {e}");
        }
        (w.cfg.sync, w.cfg.sync_interval, w.cfg.max_batch)
    };
    let mut next_sync = Instant::now() + sync_interval;
    loop {
        let now = Instant::now();
        // Workers commit while this thread sleeps, so it wakes in time for whatever their
        // commits may have made due: the periodic sync, an LMDB commit and a checkpoint.
        let mut wait = next_sweep
            .saturating_duration_since(now)
            .min(CHECKPOINT_EVERY)
            .min(COMMIT_EVERY);
        if sync == SyncMode::Periodic {
            wait = wait.min(next_sync.saturating_duration_since(now));
        }
        let unused = {
            let mut w = lock(&core);
            if w.broken.is_some() {
                // Nothing more can be written: no commit, reclaim or eviction will come due
                // (spinning on them burnt a core with the disk full). Submissions still wake
                // this thread, to be refused, and held completions to be failed; after a full
                // disk the commit is tried again now and then.
                w.try_resume();
                if w.commit_due() {
                    wait = Duration::ZERO;
                } else if let Some(at) = w.resume_at {
                    wait = wait.min(at.saturating_duration_since(Instant::now()));
                }
            } else if w.gc_more || w.commit_due() || w.over() || w.moves_due() {
                // Deleted collections still hold elements, a commit is due, or the data is
                // over the cap: no sleep.
                wait = Duration::ZERO;
            } else if let Some(t) = w.since {
                wait = wait.min(COMMIT_EVERY.saturating_sub(t.elapsed()));
            }
            w.unused_overlays()
        };
        drop(unused);
        let mut disconnected = false;
        match rx.recv_timeout(wait) {
            Ok(sub) => batch.push(sub),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => disconnected = true,
        }
        let mut count: usize = batch.iter().map(|s| s.reqs.len()).sum();
        let paced = count > 0 && lock(&core).paced.load(Ordering::Acquire);
        // Paced commits gather here; in `always` the gather happens below, under the lock
        // (`Cohort`).
        let deadline = Instant::now() + PACED_GATHER;
        while count < max_batch {
            let next = if paced {
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
        let mut w = lock(&core);
        if sync == SyncMode::Always && !paced && count > 0 && count < max_batch {
            // Holding the lock, so no worker commits alone meanwhile: what they submit comes
            // here. Waits for the writers of the last two commits (see `Cohort`).
            let deadline = Instant::now() + w.cohort.window();
            while count < max_batch && w.cohort.missing(&batch) > 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match rx.recv_timeout(left) {
                    Ok(sub) => {
                        count += sub.reqs.len();
                        batch.push(sub);
                    }
                    Err(_) => break,
                }
            }
        }
        let subs = batch.len();
        w.install_first(&mut batch);
        // A replica expires nothing itself: its primary's deletions come along. It still moves
        // the sweep's time on, or the wait above would stay zero and this loop would spin.
        let sweep_due = Instant::now() >= next_sweep;
        let sweep = sweep_due && !w.is_replica();
        if sweep_due && !sweep {
            next_sweep = Instant::now() + SWEEP_EVERY;
        }
        if count > 0 || sweep || w.flush_due() || w.gc_more || w.poisoned || w.moves_due() {
            let (_, swept) = w.commit(&mut batch, sweep, None, false);
            batch.clear();
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
        batch.clear();
        if w.over() {
            // After the batch, whose replies are out: no one waits on this but the next batch.
            w.commit(&mut batch, false, None, true);
        }
        if w.commit_due() {
            let _ = w.commit_lmdb();
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
    lock(&core).stop();
}

/// How workers hand their writes to the writer. When no commit is running and nothing is
/// queued, the worker commits its own submission at once, on its own thread (RocksDB's
/// leader writer, with one member): no wake-up of the writer thread and none back, which is
/// what a lone client waits for. Otherwise the submission is queued for the writer thread,
/// which commits it with whatever else has gathered meanwhile (group commit under load).
/// Either way the outcomes arrive in the worker's mailbox, in commit order.
pub struct Gate<T> {
    core: Arc<Mutex<Writer<T>>>,
    /// `--sync always`: a lock holder may be in an fdatasync.
    always: bool,
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
            always: self.always,
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

/// How many times a worker tries for the writer's lock (yielding between tries) before it
/// queues its writes instead, outside `always`.
const LEAD_TRIES: usize = 8;

/// How long a worker spins for the writer's lock before it starts yielding, outside `always`.
const LEAD_SPIN: Duration = Duration::from_micros(30);

/// Writes a leader leaves to the writer thread: they clear the store (readers may see that
/// only once LMDB has it, and only the writer thread commits) or replicate, or are a
/// transaction with such a step. A blocking pop is led like any write: whoever holds the
/// writer's lock is "the writer" of `blocking.rs` (it pops, or queues the waiter, in its
/// serialised pass; while anyone waits, writes are not led, so the writer thread serves
/// waiters); handing every BRPOP to the writer thread cost a queue consumer two thread hops
/// per message (`--sync never`, one producer and one consumer: 9-12k messages/s led by the
/// writer thread, 26-37k led). A led batch that touched a blocking pop and that the overlay
/// cannot take goes back to the writer thread (`Writer::commit`). Collection writes are
/// led like string writes: readers see them through the overlay (`overlay.rs`). A script is
/// led too; one that runs long or publishes fails its batch with `command::MOVED`, which comes
/// back `Requeue` (see `scripting`), and is not led again. (A batch the overlay cannot take,
/// near a full map, comes back `Held`: its replies wait for the writer thread's LMDB commit.)
fn for_writer_thread(op: &WriteOp) -> bool {
    match op {
        WriteOp::FlushAll { .. } | WriteOp::Replicate(_) | WriteOp::ReplInstall(_) => true,
        WriteOp::Script(x) => !x.run.leads(),
        WriteOp::Exec(x) => x.steps.iter().any(|s| match s {
            Step::Write(w) => for_writer_thread(w),
            Step::Read(_) => false,
        }),
        _ => false,
    }
}

impl<T: Send + Clone> Gate<T> {
    /// Commits or queues `sub`.
    pub fn submit(&self, sub: Submission<T>) -> Submitted {
        let mut sub = sub;
        if self.queued.load(Ordering::Acquire) == 0
            && !self.paced.load(Ordering::Acquire)
            && !sub.reqs.iter().any(|r| for_writer_thread(&r.op))
            && let Some(mut w) = self.try_lead()
            && !(self.always && w.cohort.others_wrote(sub.worker))
        {
            let worker = sub.worker;
            let mut batch = vec![sub];
            let (handled, _) = w.commit(&mut batch, false, Some(worker), false);
            w.update_pressure();
            let poke = w.commit_due() || w.over();
            drop(w);
            match handled {
                Handled::Done => {
                    if poke {
                        self.poke();
                    }
                    return Submitted::Committed;
                }
                Handled::Held => {
                    self.poke();
                    return Submitted::Queued;
                }
                Handled::Requeue => match batch.pop() {
                    Some(s) => sub = s,
                    None => return Submitted::Refused,
                },
            }
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.tx.send(sub).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Submitted::Refused;
        }
        Submitted::Queued
    }

    /// The writer's lock if it can be had without waiting on the disk. In `always` the holder
    /// may be in an fdatasync, so only an uncontended lock will do; otherwise the holder is
    /// only applying and logging a batch (a few microseconds), and waiting that long beats
    /// handing the submission to the writer thread and being woken back.
    fn try_lead(&self) -> Option<std::sync::MutexGuard<'_, Writer<T>>> {
        if let Ok(w) = self.core.try_lock() {
            return Some(w);
        }
        if self.always {
            return None;
        }
        // The holder runs on another core for a few microseconds: spinning that long costs
        // less than a yield, which on a busy machine hands the core to another thread and
        // costs a context switch each way.
        let start = Instant::now();
        while start.elapsed() < LEAD_SPIN {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
            if let Ok(w) = self.core.try_lock() {
                return Some(w);
            }
        }
        for _ in 0..LEAD_TRIES {
            std::thread::yield_now();
            if let Ok(w) = self.core.try_lock() {
                return Some(w);
            }
        }
        None
    }

    /// Wakes the writer thread (an LMDB commit is due, or held completions wait for one).
    fn poke(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let empty = Submission {
            worker: 0,
            reqs: Vec::new(),
        };
        if self.tx.send(empty).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(worker: usize, writes: usize) -> Submission<()> {
        let reqs = (0..writes)
            .map(|i| WriteRequest {
                tag: (),
                op: WriteOp::Delete {
                    key: format!("k{i}").into_bytes(),
                },
            })
            .collect();
        Submission { worker, reqs }
    }

    #[test]
    fn a_lone_worker_commits_alone_and_two_workers_are_gathered() {
        let mut c = Cohort::default();
        // Nothing yet: anyone leads.
        assert!(!c.others_wrote(0) && !c.others_wrote(1));
        assert_eq!(c.missing(&[sub(0, 1)]), 0);
        // One client on worker 0: it keeps leading, nothing is waited for.
        c.commit(&[sub(0, 1)], 2);
        c.commit(&[sub(0, 1)], 2);
        assert!(!c.others_wrote(0));
        assert_eq!(c.missing(&[sub(0, 1)]), 0);
        // Worker 1's 3 clients committed while worker 0's 3 waited: the next batch waits for
        // both halves, and neither worker commits alone.
        c.commit(&[sub(1, 3)], 2);
        c.commit(&[sub(0, 3)], 2);
        assert!(c.others_wrote(0) && c.others_wrote(1));
        assert_eq!(c.missing(&[sub(0, 3)]), 3);
        assert_eq!(c.missing(&[sub(0, 3), sub(1, 2)]), 1);
        assert_eq!(c.missing(&[sub(0, 3), sub(1, 1), sub(1, 2)]), 0);
        // Housekeeping batches (no writes) change nothing.
        c.commit(&[sub(0, 0)], 2);
        c.commit::<()>(&[], 2);
        assert_eq!(c.missing(&[sub(0, 3)]), 3);
        // Both in one commit, then worker 1's clients stop: after two commits without them
        // it is no longer waited for.
        c.commit(&[sub(0, 3), sub(1, 3)], 2);
        c.commit(&[sub(0, 3)], 2);
        assert_eq!(c.missing(&[sub(0, 3)]), 3);
        c.commit(&[sub(0, 3)], 2);
        assert_eq!(c.missing(&[sub(0, 3)]), 0);
        assert!(!c.others_wrote(0) && c.others_wrote(1));
        // A worker index past the table (more workers later) is simply not expected.
        assert_eq!(c.missing(&[sub(0, 3), sub(5, 1)]), 0);
    }

    #[test]
    fn a_batch_of_enough_writes_waits_for_no_more() {
        let mut c = Cohort::default();
        // 40 clients on each worker, and worker 0's are in.
        c.commit(&[sub(0, 40), sub(1, 40)], 2);
        assert_eq!(
            c.missing(&[sub(0, COHORT_ENOUGH - 1)]),
            40 - (COHORT_ENOUGH as u32 - 1) + 40
        );
        assert_eq!(c.missing(&[sub(0, COHORT_ENOUGH)]), 0);
        assert_eq!(c.missing(&[sub(0, 1), sub(1, COHORT_ENOUGH - 1)]), 0);
    }

    #[test]
    fn the_wait_is_half_an_fdatasync_within_bounds() {
        let mut c = Cohort::default();
        assert_eq!(c.window(), GATHER_GAP);
        c.synced(Duration::from_micros(800));
        assert_eq!(c.window(), Duration::from_micros(400));
        for _ in 0..100 {
            c.synced(Duration::from_millis(20));
        }
        assert_eq!(c.window(), COHORT_WAIT_MAX);
        for _ in 0..100 {
            c.synced(Duration::from_micros(10));
        }
        assert_eq!(c.window(), GATHER_GAP);
    }
}
