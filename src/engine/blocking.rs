//! The registry of clients blocked in a blocking pop (BLPOP, BLMOVE, BZPOPMIN, ...), shared by
//! the workers and the writer.
//!
//! A worker registers a blocking pop here before it submits the `WriteOp::Block` that names it,
//! so the registry always knows of it before the writer sees it. The writer, in its one
//! serialised pass over a batch, tries the pop; finding nothing, it queues the waiter under
//! each of its keys (FIFO by the order the writer queued them). After every write of a batch
//! that may have fed a key with waiters, the writer pops for the first waiter of that key in
//! the same transaction and the same log batch, and the waiter's reply travels as a completion
//! like any write's, sent only once the batch is durable. So there are no lost wake-ups: a
//! push is either applied before the waiter is queued (and the pop finds its element) or after
//! (and the push serves it), both inside the writer.
//!
//! Invariants:
//! - Every registered pop gets exactly one completion: the writer's answer, the element a
//!   push served it, or the outcome of a cancel (timeout, disconnect, CLIENT UNBLOCK).
//! - A waiter is served only while it is queued. Ending it (`settle`: a timeout, CLIENT
//!   UNBLOCK, a hang-up; `cancel`: its connection closed) takes a queued waiter out at once and
//!   delivers the outcome itself. A pop the writer has not tried yet is not a waiter: settled,
//!   it becomes `Once` (the writer pops what is there, else answers the outcome, and never
//!   queues it, as Redis only times out a client that found nothing); cancelled, it becomes
//!   `Cancelled` (the writer answers without popping: nothing is popped for a closed
//!   connection).
//! - The writer never holds the lock across LMDB work: it claims a waiter (out of the
//!   queues), pops for it unlocked, then keeps it or puts it back in its place.
//! - Entries the writer touches in a batch stay invisible to cancels until the batch is
//!   delivered (`finalize`): a cancel then only records its outcome. So a waiter's completion
//!   never overtakes the completions of the connection's earlier writes in that batch, and a
//!   batch that fails (`rollback`) leaves the registry as it was, cancels included.
//! - The registry holds at most one entry per connection with a blocking pop outstanding (the
//!   connection reads no further request meanwhile), and each entry's keys are its request's
//!   arguments, which the request size limit bounds.
//! - While nobody is queued, the writer's cost is one atomic load per write (`any_queued`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::writer::{Completion, Mailbox};
use crate::command::Outcome;
use crate::types::blocking::PopForm;

/// Where an entry stands.
#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Registered by its worker; the writer has not applied its `WriteOp::Block` yet.
    Pending,
    /// As `Pending`, but settled before the writer tried it (a timeout, CLIENT UNBLOCK, a
    /// hang-up): the writer pops if it can, else answers this; it never queues it.
    Once(Outcome),
    /// Cancelled before the writer applied it: the writer answers this without popping.
    Cancelled(Outcome),
    /// Queued under its keys since an earlier batch, at this position.
    Waiting(u64),
    /// Touched by the batch the writer is applying.
    Batch {
        prior: Prior,
        /// Queued under its keys (at this position) by this batch, so later writes of the
        /// batch may serve it.
        queued: Option<u64>,
        /// A cancel arrived meanwhile: its outcome.
        cancel: Option<Outcome>,
    },
}

/// The state a batch found an entry in (restored if the batch fails).
#[derive(Debug, Clone, PartialEq)]
enum Prior {
    Pending,
    Once(Outcome),
    Cancelled(Outcome),
    Waiting(u64),
}

#[derive(Debug)]
struct Entry<T> {
    worker: usize,
    tag: T,
    client: u64,
    form: Arc<PopForm>,
    state: State,
}

#[derive(Debug)]
struct Inner<T> {
    entries: HashMap<u64, Entry<T>>,
    /// key -> (position -> entry id): the waiters queued under the key, first come first.
    keys: HashMap<Vec<u8>, BTreeMap<u64, u64>>,
    /// RESP client id -> its entry (CLIENT UNBLOCK).
    by_client: HashMap<u64, u64>,
    next_id: u64,
    next_pos: u64,
}

/// The server-wide registry of blocking pops.
pub struct Blocking<T> {
    inner: Mutex<Inner<T>>,
    /// Entries queued under their keys (`Waiting`, or queued by the batch being applied).
    queued: AtomicUsize,
    /// Each worker's mailbox: a cancel of a queued waiter delivers its outcome there.
    mailboxes: Vec<Arc<Mailbox<T>>>,
}

impl<T> std::fmt::Debug for Blocking<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blocking")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish()
    }
}

/// What the writer found when it began applying a `WriteOp::Block`.
#[derive(Debug)]
pub enum Begin {
    /// Try the pop, and queue the waiter if nothing is there, unless `once`: then nothing
    /// there answers that (it was settled before the writer tried it).
    Pop {
        form: Arc<PopForm>,
        once: Option<Outcome>,
    },
    /// Cancelled before it ran: answer this.
    Cancelled(Outcome),
    /// Nothing to answer: it was answered already (a batch that ran it failed, and a cancel
    /// delivered its outcome meanwhile).
    Gone,
}

/// The entries one batch has touched, in order (writer only).
#[derive(Debug, Default)]
pub struct Journal {
    ids: Vec<u64>,
}

impl Journal {
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn extend(&mut self, other: Journal) {
        self.ids.extend(other.ids);
    }
}

/// A waiter the writer may serve from a key: its id, worker, tag and form.
#[derive(Debug)]
pub struct Candidate<T> {
    pub id: u64,
    pub worker: usize,
    pub tag: T,
    pub form: Arc<PopForm>,
}

impl<T: Clone> Blocking<T> {
    pub fn new(mailboxes: Vec<Arc<Mailbox<T>>>) -> Blocking<T> {
        Blocking {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                keys: HashMap::new(),
                by_client: HashMap::new(),
                next_id: 1,
                next_pos: 1,
            }),
            queued: AtomicUsize::new(0),
            mailboxes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Someone is queued under some key: the writer must look for waiters after its writes.
    pub fn any_queued(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
    }

    /// Waiters queued under their keys (INFO's `blocked_clients`): a pop the writer has not
    /// tried yet does not count until it finds nothing.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Entries of any state.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers a blocking pop (worker); its id goes into the `WriteOp::Block` submitted next
    /// (and into its tag, which `tag` makes).
    pub fn register(
        &self,
        worker: usize,
        client: u64,
        form: PopForm,
        tag: impl FnOnce(u64) -> T,
    ) -> u64 {
        let mut g = self.lock();
        let id = g.next_id;
        g.next_id += 1;
        let tag = tag(id);
        g.entries.insert(
            id,
            Entry {
                worker,
                tag,
                client,
                form: Arc::new(form),
                state: State::Pending,
            },
        );
        g.by_client.insert(client, id);
        id
    }

    /// Ends a blocking pop whose connection closed, with the outcome its (dropped) completion
    /// carries: nothing is ever popped for it from now on. Returns whether it takes effect
    /// (false: it is being served, or was answered already). Either way exactly one completion
    /// follows.
    pub fn cancel(&self, id: u64, outcome: Outcome) -> bool {
        self.end(id, outcome, false)
    }

    /// Ends a blocking pop with `outcome` (a timeout, CLIENT UNBLOCK, its client hanging up,
    /// the server stopping), as Redis, which only ends a client that really waits: one the
    /// writer has not tried yet still pops what is there, but will not wait. Returns whether
    /// it takes effect (false: it is being served, or was answered already). Either way exactly
    /// one completion follows.
    pub fn settle(&self, id: u64, outcome: Outcome) -> bool {
        self.end(id, outcome, true)
    }

    fn end(&self, id: u64, outcome: Outcome, pop_first: bool) -> bool {
        let mut g = self.lock();
        let Some(e) = g.entries.get_mut(&id) else {
            return false;
        };
        match &mut e.state {
            State::Pending => {
                e.state = if pop_first {
                    State::Once(outcome)
                } else {
                    State::Cancelled(outcome)
                };
                true
            }
            State::Once(_) if !pop_first => {
                e.state = State::Cancelled(outcome);
                true
            }
            State::Once(_) | State::Cancelled(_) => false,
            State::Batch { queued, cancel, .. } => {
                let effective = queued.is_some() && cancel.is_none();
                if cancel.is_none() {
                    *cancel = Some(outcome);
                }
                effective
            }
            State::Waiting(pos) => {
                let pos = *pos;
                let e = self.remove(&mut g, id, Some(pos));
                drop(g);
                if let Some(e) = e {
                    self.send(e.worker, e.tag, outcome);
                }
                true
            }
        }
    }

    /// A completion for blocking pop `id` reached its worker: the entry must be gone. It still
    /// is there only if the writer answered without applying it (a broken log): drop it.
    pub fn forget(&self, id: u64) {
        let mut g = self.lock();
        if matches!(
            g.entries.get(&id).map(|e| &e.state),
            Some(State::Pending | State::Once(_) | State::Cancelled(_))
        ) {
            self.remove(&mut g, id, None);
        }
    }

    /// CLIENT UNBLOCK: cancels the blocking pop of RESP client `client`, if it has one.
    pub fn unblock_client(&self, client: u64, outcome: Outcome) -> bool {
        let id = self.lock().by_client.get(&client).copied();
        id.is_some_and(|id| self.settle(id, outcome))
    }

    /// Whether RESP client `client` has a blocking pop outstanding (CLIENT LIST's `b` flag).
    pub fn is_blocked(&self, client: u64) -> bool {
        self.lock().by_client.contains_key(&client)
    }

    fn send(&self, worker: usize, tag: T, outcome: Outcome) {
        if let Some(m) = self.mailboxes.get(worker) {
            m.push(Completion { tag, outcome });
        }
    }

    /// Removes an entry (and its queue positions).
    fn remove(&self, g: &mut Inner<T>, id: u64, pos: Option<u64>) -> Option<Entry<T>> {
        let e = g.entries.remove(&id)?;
        if let Some(pos) = pos {
            self.unqueue(g, &e.form, pos);
        }
        if g.by_client.get(&e.client) == Some(&id) {
            g.by_client.remove(&e.client);
        }
        Some(e)
    }

    fn unqueue(&self, g: &mut Inner<T>, form: &PopForm, pos: u64) {
        form.for_each_wait_key(&mut |k| {
            if let Some(q) = g.keys.get_mut(k) {
                q.remove(&pos);
                if q.is_empty() {
                    g.keys.remove(k);
                }
            }
        });
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }

    fn enqueue(&self, g: &mut Inner<T>, form: &PopForm, id: u64, pos: u64) {
        form.for_each_wait_key(&mut |k| {
            match g.keys.get_mut(k) {
                Some(q) => q.insert(pos, id),
                None => g
                    .keys
                    .insert(k.to_vec(), BTreeMap::from([(pos, id)]))
                    .and(None),
            };
        });
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    /// The writer's access for one batch: the lock, held while it pops for waiters (no other
    /// thread holds it for longer than a map lookup, and the writer never holds it across a
    /// sync).
    pub fn writer(&self) -> WriterView<'_, T> {
        WriterView {
            reg: self,
            g: self.lock(),
        }
    }
}

/// The registry as the writer sees it while applying a batch.
pub struct WriterView<'a, T> {
    reg: &'a Blocking<T>,
    g: MutexGuard<'a, Inner<T>>,
}

impl<T: Clone> WriterView<'_, T> {
    fn touch(&mut self, id: u64, journal: &mut Journal) -> Option<&mut State> {
        let e = self.g.entries.get_mut(&id)?;
        let prior = match &e.state {
            State::Batch { .. } => return Some(&mut e.state),
            State::Pending => Prior::Pending,
            State::Once(o) => Prior::Once(o.clone()),
            State::Cancelled(o) => Prior::Cancelled(o.clone()),
            State::Waiting(pos) => Prior::Waiting(*pos),
        };
        journal.ids.push(id);
        e.state = State::Batch {
            prior,
            queued: None,
            cancel: None,
        };
        Some(&mut e.state)
    }

    /// The writer begins applying `WriteOp::Block(id)`.
    pub fn begin(&mut self, id: u64, journal: &mut Journal) -> Begin {
        let Some(e) = self.g.entries.get(&id) else {
            return Begin::Gone;
        };
        if !matches!(
            e.state,
            State::Pending | State::Once(_) | State::Cancelled(_)
        ) {
            // Applied twice cannot happen; answer nothing rather than twice.
            return Begin::Gone;
        }
        let form = e.form.clone();
        match self.touch(id, journal) {
            Some(State::Batch {
                prior: Prior::Cancelled(o),
                ..
            }) => Begin::Cancelled(o.clone()),
            Some(State::Batch {
                prior: Prior::Pending,
                ..
            }) => Begin::Pop { form, once: None },
            Some(State::Batch {
                prior: Prior::Once(o),
                ..
            }) => Begin::Pop {
                form,
                once: Some(o.clone()),
            },
            _ => Begin::Gone,
        }
    }

    /// Nothing to pop: queue the waiter under its keys, behind those already there.
    pub fn wait(&mut self, id: u64) {
        let pos = self.g.next_pos;
        let Some(e) = self.g.entries.get_mut(&id) else {
            return;
        };
        let State::Batch { queued, .. } = &mut e.state else {
            return;
        };
        *queued = Some(pos);
        let form = e.form.clone();
        self.g.next_pos += 1;
        self.reg.enqueue(&mut self.g, &form, id, pos);
    }

    /// Whether anyone is queued under `key`.
    pub fn has_waiters(&self, key: &[u8]) -> bool {
        self.g.keys.contains_key(key)
    }

    /// Takes the first waiter queued under `key` after position `after` out of the queues for
    /// the writer to try a pop for (without the lock held): a cancel meanwhile only records
    /// itself. The writer then either keeps it (`finalize` removes it) or puts it back
    /// (`unclaim`).
    pub fn claim(
        &mut self,
        key: &[u8],
        after: u64,
        journal: &mut Journal,
    ) -> Option<(u64, Candidate<T>)> {
        let (pos, c) = self.next_waiter(key, after)?;
        if let Some(State::Batch { queued, .. }) = self.touch(c.id, journal) {
            *queued = None;
        }
        self.reg.unqueue(&mut self.g, &c.form, pos);
        Some((pos, c))
    }

    /// A claimed waiter could not be served from that key: back into the queues where it was.
    pub fn unclaim(&mut self, id: u64, pos: u64) {
        let Some(e) = self.g.entries.get_mut(&id) else {
            return;
        };
        let State::Batch { queued, .. } = &mut e.state else {
            return;
        };
        *queued = Some(pos);
        let form = e.form.clone();
        self.reg.enqueue(&mut self.g, &form, id, pos);
    }

    /// The first waiter queued under `key` after position `after`, and its position.
    pub fn next_waiter(&self, key: &[u8], after: u64) -> Option<(u64, Candidate<T>)> {
        let q = self.g.keys.get(key)?;
        let (&pos, &id) = q.range(after + 1..).next()?;
        let e = self.g.entries.get(&id)?;
        Some((
            pos,
            Candidate {
                id,
                worker: e.worker,
                tag: e.tag.clone(),
                form: e.form.clone(),
            },
        ))
    }

    /// The batch is durable (or `failed`: it is known not to be) and its completions are being
    /// delivered: entries it answered or served go; those it queued become `Waiting` (or, when
    /// a cancel came meanwhile or the batch failed, go with the cancel's outcome, or `Failed`,
    /// which `out` collects for delivery after the batch's own completions).
    pub fn finalize(
        &mut self,
        journal: &mut Journal,
        failed: bool,
        out: &mut Vec<(usize, Completion<T>)>,
    ) {
        for id in journal.ids.drain(..) {
            let Some(e) = self.g.entries.get_mut(&id) else {
                continue;
            };
            let State::Batch { queued, cancel, .. } = &mut e.state else {
                continue;
            };
            match (queued.take(), cancel.take()) {
                (Some(pos), None) if !failed => e.state = State::Waiting(pos),
                (Some(pos), cancel) => {
                    let outcome = if failed {
                        Outcome::Failed
                    } else {
                        cancel.unwrap_or(Outcome::NilArray)
                    };
                    if let Some(e) = self.reg.remove(&mut self.g, id, Some(pos)) {
                        out.push((
                            e.worker,
                            Completion {
                                tag: e.tag,
                                outcome,
                            },
                        ));
                    }
                }
                (None, _) => {
                    self.reg.remove(&mut self.g, id, None);
                }
            }
        }
    }

    /// The batch failed and was taken back: every entry it touched returns to the state it
    /// found it in, keeping any cancel that arrived meanwhile.
    pub fn rollback(&mut self, journal: &mut Journal) {
        while let Some(id) = journal.ids.pop() {
            let Some(e) = self.g.entries.get_mut(&id) else {
                continue;
            };
            let State::Batch {
                prior,
                queued,
                cancel,
            } = std::mem::replace(&mut e.state, State::Pending)
            else {
                continue;
            };
            let form = e.form.clone();
            if let Some(pos) = queued {
                self.reg.unqueue(&mut self.g, &form, pos);
            }
            let Some(e) = self.g.entries.get_mut(&id) else {
                continue;
            };
            match (prior, cancel) {
                (Prior::Pending, None) => e.state = State::Pending,
                (Prior::Once(o), None) => e.state = State::Once(o),
                (Prior::Pending | Prior::Once(_), Some(o)) | (Prior::Cancelled(o), _) => {
                    e.state = State::Cancelled(o)
                }
                (Prior::Waiting(pos), None) => {
                    e.state = State::Waiting(pos);
                    self.reg.enqueue(&mut self.g, &form, id, pos);
                }
                (Prior::Waiting(_), Some(o)) => {
                    if let Some(e) = self.reg.remove(&mut self.g, id, None) {
                        self.reg.send(e.worker, e.tag, o);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(keys: &[&str]) -> PopForm {
        PopForm::List {
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            left: true,
            count: None,
        }
    }

    fn registry() -> (Blocking<u32>, Arc<Mailbox<u32>>) {
        let poll = mio::Poll::new().expect("poll");
        let waker = mio::Waker::new(poll.registry(), mio::Token(0)).expect("waker");
        let m = Arc::new(Mailbox::new(waker));
        (Blocking::new(vec![m.clone()]), m)
    }

    fn drained(m: &Mailbox<u32>) -> Vec<(u32, Outcome)> {
        let mut v = Vec::new();
        m.drain_into(&mut v);
        v.into_iter().map(|c| (c.tag, c.outcome)).collect()
    }

    /// Applies `Block(id)` finding nothing, and delivers the batch.
    fn queue(r: &Blocking<u32>, id: u64) {
        let mut j = Journal::default();
        let mut w = r.writer();
        assert!(matches!(w.begin(id, &mut j), Begin::Pop { once: None, .. }));
        w.wait(id);
        let mut out = Vec::new();
        w.finalize(&mut j, false, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn waiters_are_served_first_come_first_served() {
        let (r, _m) = registry();
        let a = r.register(0, 1, form(&["k"]), |_| 1);
        let b = r.register(0, 2, form(&["j", "k"]), |_| 2);
        queue(&r, a);
        queue(&r, b);
        assert!(r.any_queued());
        let w = r.writer();
        let (pos, first) = w.next_waiter(b"k", 0).expect("a waiter");
        assert_eq!(first.id, a);
        let (_, second) = w.next_waiter(b"k", pos).expect("another");
        assert_eq!(second.id, b);
        assert_eq!(w.next_waiter(b"j", 0).map(|c| c.1.id), Some(b));
        drop(w);
        let mut j = Journal::default();
        let mut w = r.writer();
        assert_eq!(w.claim(b"k", 0, &mut j).map(|c| c.1.id), Some(a));
        assert_eq!(w.next_waiter(b"k", 0).map(|c| c.1.id), Some(b));
        let mut out = Vec::new();
        w.finalize(&mut j, false, &mut out);
        drop(w);
        assert_eq!(r.len(), 1);
        assert!(r.is_blocked(2) && !r.is_blocked(1));
    }

    #[test]
    fn a_close_after_a_settle_still_pops_nothing() {
        let (r, _m) = registry();
        let a = r.register(0, 1, form(&["k"]), |_| 7);
        assert!(r.settle(a, Outcome::NilArray));
        assert!(
            r.cancel(a, Outcome::NilArray),
            "the connection closed meanwhile"
        );
        let mut j = Journal::default();
        assert!(matches!(r.writer().begin(a, &mut j), Begin::Cancelled(_)));
    }

    #[test]
    fn a_cancel_before_the_writer_runs_is_answered_by_the_writer() {
        let (r, m) = registry();
        let a = r.register(0, 1, form(&["k"]), |_| 7);
        assert!(r.cancel(a, Outcome::NilArray));
        assert!(
            !r.cancel(a, Outcome::Nil),
            "a second cancel changes nothing"
        );
        let mut j = Journal::default();
        let mut w = r.writer();
        assert!(matches!(
            w.begin(a, &mut j),
            Begin::Cancelled(Outcome::NilArray)
        ));
        let mut out = Vec::new();
        w.finalize(&mut j, false, &mut out);
        drop(w);
        assert!(out.is_empty() && drained(&m).is_empty());
        assert!(r.is_empty());
    }

    #[test]
    fn a_cancel_of_a_queued_waiter_delivers_its_outcome_and_unqueues_it() {
        let (r, m) = registry();
        let a = r.register(0, 1, form(&["k", "j"]), |_| 7);
        queue(&r, a);
        assert!(r.unblock_client(1, Outcome::Err("UNBLOCKED")));
        assert_eq!(drained(&m), vec![(7, Outcome::Err("UNBLOCKED"))]);
        assert!(!r.any_queued() && r.is_empty());
        assert!(!r.unblock_client(1, Outcome::NilArray));
    }

    #[test]
    fn a_cancel_during_the_batch_waits_for_the_batch() {
        let (r, m) = registry();
        let a = r.register(0, 1, form(&["k"]), |_| 7);
        let mut j = Journal::default();
        let mut w = r.writer();
        assert!(matches!(w.begin(a, &mut j), Begin::Pop { once: None, .. }));
        w.wait(a);
        drop(w);
        // The batch is being synced: the cancel is recorded, nothing is delivered yet.
        assert!(r.cancel(a, Outcome::NilArray));
        assert!(drained(&m).is_empty());
        let mut out = Vec::new();
        r.writer().finalize(&mut j, false, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.outcome, Outcome::NilArray);
        assert!(r.is_empty() && !r.any_queued());
    }

    #[test]
    fn a_served_waiter_ignores_a_late_cancel() {
        let (r, m) = registry();
        let a = r.register(0, 1, form(&["k"]), |_| 7);
        queue(&r, a);
        let mut j = Journal::default();
        assert!(r.writer().claim(b"k", 0, &mut j).is_some());
        assert!(
            !r.cancel(a, Outcome::NilArray),
            "too late: it is being served"
        );
        let mut out = Vec::new();
        r.writer().finalize(&mut j, false, &mut out);
        assert!(out.is_empty() && drained(&m).is_empty());
        assert!(r.is_empty());
    }

    #[test]
    fn rollback_restores_states_and_keeps_cancels() {
        let (r, m) = registry();
        let a = r.register(0, 1, form(&["k"]), |_| 1);
        let b = r.register(0, 2, form(&["k"]), |_| 2);
        let c = r.register(0, 3, form(&["k"]), |_| 3);
        queue(&r, a);
        // A batch serves a, queues b, then fails; c was cancelled during it.
        let mut j = Journal::default();
        let mut w = r.writer();
        assert!(w.claim(b"k", 0, &mut j).is_some());
        assert!(matches!(w.begin(b, &mut j), Begin::Pop { once: None, .. }));
        w.wait(b);
        assert!(matches!(w.begin(c, &mut j), Begin::Pop { once: None, .. }));
        drop(w);
        assert!(!r.cancel(c, Outcome::NilArray));
        r.writer().rollback(&mut j);
        assert!(drained(&m).is_empty());
        let w = r.writer();
        assert_eq!(w.next_waiter(b"k", 0).map(|c| c.1.id), Some(a));
        let (pos, _) = w.next_waiter(b"k", 0).expect("a");
        assert!(w.next_waiter(b"k", pos).is_none(), "b is pending again");
        drop(w);
        let mut j = Journal::default();
        let mut w = r.writer();
        assert!(matches!(w.begin(b, &mut j), Begin::Pop { once: None, .. }));
        assert!(matches!(w.begin(c, &mut j), Begin::Cancelled(_)));
        w.rollback(&mut j);
    }

    #[test]
    fn an_unclaimed_waiter_keeps_its_place_and_a_cancel_meanwhile() {
        let (r, m) = registry();
        let a = r.register(0, 1, form(&["k"]), |_| 1);
        let b = r.register(0, 2, form(&["k"]), |_| 2);
        queue(&r, a);
        queue(&r, b);
        let mut j = Journal::default();
        let (pos, c) = r.writer().claim(b"k", 0, &mut j).expect("a");
        assert_eq!(c.id, a);
        // The writer found another type there: a goes back ahead of b.
        r.writer().unclaim(a, pos);
        assert_eq!(r.writer().next_waiter(b"k", 0).map(|c| c.1.id), Some(a));
        // Claimed and put back while a cancel came: the cancel is answered at delivery.
        let (pos, _) = r.writer().claim(b"k", pos, &mut j).expect("b");
        assert!(!r.cancel(b, Outcome::NilArray));
        r.writer().unclaim(b, pos);
        let mut out = Vec::new();
        r.writer().finalize(&mut j, false, &mut out);
        assert!(drained(&m).is_empty());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.tag, 2);
        assert_eq!(r.writer().next_waiter(b"k", 0).map(|c| c.1.id), Some(a));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn settling_pops_what_is_there_but_never_waits() {
        let (r, m) = registry();
        let a = r.register(0, 1, form(&["k"]), |_| 7);
        assert!(r.settle(a, Outcome::NilArray));
        let mut j = Journal::default();
        let mut w = r.writer();
        assert!(matches!(
            w.begin(a, &mut j),
            Begin::Pop { once: Some(_), .. }
        ));
        let mut out = Vec::new();
        w.finalize(&mut j, false, &mut out);
        drop(w);
        assert!(r.is_empty() && out.is_empty());
        // Settled while queued: out at once, with its outcome.
        let b = r.register(0, 2, form(&["k"]), |_| 8);
        queue(&r, b);
        assert!(r.settle(b, Outcome::NilArray));
        assert_eq!(drained(&m), vec![(8, Outcome::NilArray)]);
        assert!(r.is_empty() && !r.any_queued());
    }

    #[test]
    fn a_failed_batch_answers_the_waiters_it_queued() {
        let (r, _m) = registry();
        let a = r.register(0, 1, form(&["k"]), |_| 1);
        let mut j = Journal::default();
        let mut w = r.writer();
        assert!(matches!(w.begin(a, &mut j), Begin::Pop { once: None, .. }));
        w.wait(a);
        let mut out = Vec::new();
        w.finalize(&mut j, true, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.outcome, Outcome::Failed);
        drop(w);
        assert!(r.is_empty() && !r.any_queued());
    }
}
