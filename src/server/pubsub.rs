//! Redis pub/sub across worker threads.
//!
//! One `PubSub` registry lives in `Shared`: channel -> subscribers and pattern -> subscribers,
//! each subscriber named by its worker, slab slot and epoch (`Sub`). PUBLISH, on whichever
//! worker, looks the receivers up under the registry's read lock and leaves one `Delivery` per
//! receiver in the receiving worker's outbox, waking that worker's loop through its Waker (the
//! same one the writer uses for completions). No thread ever touches another worker's
//! connections: the receiving worker encodes the message (RESP2 array or RESP3 push) into the
//! connection's output itself, and closes a subscriber whose unsent output passes
//! `OUTPUT_LIMIT` (Redis's `client-output-buffer-limit pubsub` hard limit), so a subscriber that
//! stops reading costs at most that much memory and never slows the publisher.
//!
//! A connection's own subscriptions are a `Subscriptions` in its RESP session; dropping it (as
//! closing the connection does) leaves every channel and pattern.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use crate::commands::glob_match;
use crate::protocol::resp::enc;

/// A subscriber's unsent output (replies and messages) past which it is disconnected.
pub const OUTPUT_LIMIT: usize = 32 << 20;

/// A subscribed connection: its worker, slab slot and epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sub {
    pub worker: u32,
    pub slot: u32,
    pub epoch: u32,
}

/// One published message as one receiver gets it.
#[derive(Debug, Clone)]
pub struct Message {
    /// The pattern that matched (a `pmessage`), or none (a `message`).
    pub pattern: Option<Arc<[u8]>>,
    pub channel: Arc<[u8]>,
    pub payload: Arc<[u8]>,
}

impl Message {
    /// `message`/`pmessage` as a RESP2 array or a RESP3 push.
    pub fn encode(&self, out: &mut Vec<u8>, v3: bool) {
        match &self.pattern {
            Some(p) => {
                push_header(out, 4, v3);
                enc::bulk(out, b"pmessage");
                enc::bulk(out, p);
            }
            None => {
                push_header(out, 3, v3);
                enc::bulk(out, b"message");
            }
        }
        enc::bulk(out, &self.channel);
        enc::bulk(out, &self.payload);
    }

    /// About the bytes `encode` adds.
    pub fn size(&self) -> usize {
        self.pattern.as_ref().map_or(0, |p| p.len() + 16)
            + self.channel.len()
            + self.payload.len()
            + 48
    }
}

/// `*n` in RESP2, `>n` (a push) in RESP3.
pub fn push_header(out: &mut Vec<u8>, n: usize, v3: bool) {
    out.push(if v3 { b'>' } else { b'*' });
    out.extend_from_slice(n.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A message on its way to one connection of the worker whose outbox holds it.
#[derive(Debug)]
pub struct Delivery {
    pub slot: u32,
    pub epoch: u32,
    pub msg: Message,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Channel,
    Pattern,
}

#[derive(Debug, Default)]
struct Registry {
    channels: HashMap<Arc<[u8]>, HashSet<Sub>>,
    patterns: HashMap<Arc<[u8]>, HashSet<Sub>>,
}

impl Registry {
    fn map(&mut self, kind: Kind) -> &mut HashMap<Arc<[u8]>, HashSet<Sub>> {
        match kind {
            Kind::Channel => &mut self.channels,
            Kind::Pattern => &mut self.patterns,
        }
    }
}

type Wake = Box<dyn Fn() + Send + Sync>;

/// The server's channels and patterns, and one outbox per worker.
pub struct PubSub {
    registry: RwLock<Registry>,
    outboxes: Vec<Mutex<Vec<Delivery>>>,
    wakers: Vec<Wake>,
}

impl std::fmt::Debug for PubSub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSub")
            .field("workers", &self.wakers.len())
            .finish()
    }
}

impl PubSub {
    /// One waker per worker: each wakes that worker's event loop.
    pub fn new(wakers: Vec<Wake>) -> PubSub {
        PubSub {
            registry: RwLock::default(),
            outboxes: wakers.iter().map(|_| Mutex::default()).collect(),
            wakers,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, kind: Kind, name: &Arc<[u8]>, who: Sub) {
        self.write()
            .map(kind)
            .entry(name.clone())
            .or_default()
            .insert(who);
    }

    fn remove(&self, kind: Kind, name: &[u8], who: Sub) {
        let mut reg = self.write();
        let map = reg.map(kind);
        if let Some(subs) = map.get_mut(name) {
            subs.remove(&who);
            if subs.is_empty() {
                map.remove(name);
            }
        }
    }

    /// Hands `payload` to every subscriber of `channel` and of each pattern matching it, and
    /// returns how many receivers there were (a connection subscribed twice, to the channel
    /// and a pattern, counts twice, as in Redis). Messages for `me` (the publishing connection,
    /// a RESP3 subscriber) come back in `mine`, so they precede PUBLISH's reply as in Redis.
    pub fn publish(
        &self,
        channel: &[u8],
        payload: &[u8],
        me: Option<Sub>,
        mine: &mut Vec<Message>,
    ) -> usize {
        let channel: Arc<[u8]> = channel.into();
        let payload: Arc<[u8]> = payload.into();
        let mut per_worker: Vec<Vec<Delivery>> = self.outboxes.iter().map(|_| Vec::new()).collect();
        let mut receivers = 0;
        {
            let reg = self.read();
            let mut send = |who: &Sub, pattern: Option<&Arc<[u8]>>| {
                receivers += 1;
                let msg = Message {
                    pattern: pattern.cloned(),
                    channel: channel.clone(),
                    payload: payload.clone(),
                };
                if Some(*who) == me {
                    mine.push(msg);
                } else if let Some(v) = per_worker.get_mut(who.worker as usize) {
                    v.push(Delivery {
                        slot: who.slot,
                        epoch: who.epoch,
                        msg,
                    });
                }
            };
            if let Some(subs) = reg.channels.get(&channel) {
                subs.iter().for_each(|w| send(w, None));
            }
            for (pattern, subs) in &reg.patterns {
                if glob_match(pattern, &channel) {
                    subs.iter().for_each(|w| send(w, Some(pattern)));
                }
            }
        }
        for (worker, mut items) in per_worker.into_iter().enumerate() {
            if items.is_empty() {
                continue;
            }
            let was_empty = {
                let mut q = self.outboxes[worker]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let was_empty = q.is_empty();
                q.append(&mut items);
                was_empty
            };
            // A non-empty outbox has a wake-up pending already: the worker drains it whole.
            if was_empty {
                (self.wakers[worker])();
            }
        }
        receivers
    }

    /// Moves the messages waiting for `worker`'s connections into `out`.
    pub fn drain(&self, worker: usize, out: &mut Vec<Delivery>) {
        if let Some(q) = self.outboxes.get(worker) {
            out.append(&mut q.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }

    /// Channels with at least one subscriber, matching `pattern` if given.
    pub fn channels(&self, pattern: Option<&[u8]>) -> Vec<Arc<[u8]>> {
        let reg = self.read();
        let mut v: Vec<Arc<[u8]>> = reg
            .channels
            .keys()
            .filter(|c| pattern.is_none_or(|p| glob_match(p, c)))
            .cloned()
            .collect();
        v.sort();
        v
    }

    /// Subscribers of `channel` (pattern subscriptions excluded, as in Redis).
    pub fn numsub(&self, channel: &[u8]) -> usize {
        self.read().channels.get(channel).map_or(0, |s| s.len())
    }

    /// Distinct patterns subscribed to.
    pub fn numpat(&self) -> usize {
        self.read().patterns.len()
    }

    /// (active channels, distinct patterns), for INFO.
    pub fn sizes(&self) -> (usize, usize) {
        let reg = self.read();
        (reg.channels.len(), reg.patterns.len())
    }
}

/// One connection's channels and patterns, registered in the server's `PubSub` while held.
#[derive(Debug, Default)]
pub struct Subscriptions {
    registry: Option<Arc<PubSub>>,
    /// This connection, as deliveries name it (set when the connection is accepted).
    pub who: Option<Sub>,
    channels: HashSet<Arc<[u8]>>,
    patterns: HashSet<Arc<[u8]>>,
    /// Messages that arrived while a reply was half written (a paused MGET), and their size.
    held: Vec<Message>,
    held_bytes: usize,
}

impl Subscriptions {
    /// Channels, and patterns (CLIENT LIST's `sub` and `psub`).
    pub fn counts(&self) -> (usize, usize) {
        (self.channels.len(), self.patterns.len())
    }

    /// Channels plus patterns: the count subscribe confirmations carry.
    pub fn count(&self) -> usize {
        self.channels.len() + self.patterns.len()
    }

    fn set(&mut self, kind: Kind) -> &mut HashSet<Arc<[u8]>> {
        match kind {
            Kind::Channel => &mut self.channels,
            Kind::Pattern => &mut self.patterns,
        }
    }

    /// Subscribes; false when already subscribed.
    pub fn subscribe(&mut self, registry: &Arc<PubSub>, kind: Kind, name: &[u8]) -> bool {
        let Some(who) = self.who else {
            return false;
        };
        if self.set(kind).contains(name) {
            return false;
        }
        let name: Arc<[u8]> = name.into();
        registry.add(kind, &name, who);
        self.registry.get_or_insert_with(|| registry.clone());
        self.set(kind).insert(name);
        true
    }

    pub fn unsubscribe(&mut self, kind: Kind, name: &[u8]) {
        if self.set(kind).remove(name)
            && let (Some(r), Some(who)) = (&self.registry, self.who)
        {
            r.remove(kind, name, who);
        }
    }

    /// Every channel (or pattern) subscribed to, sorted.
    pub fn names(&self, kind: Kind) -> Vec<Arc<[u8]>> {
        let set = match kind {
            Kind::Channel => &self.channels,
            Kind::Pattern => &self.patterns,
        };
        let mut v: Vec<Arc<[u8]>> = set.iter().cloned().collect();
        v.sort();
        v
    }

    /// Still subscribed to what `msg` came through (it may have been published just before an
    /// UNSUBSCRIBE that has been answered since).
    pub fn wants(&self, msg: &Message) -> bool {
        match &msg.pattern {
            Some(p) => self.patterns.contains(p),
            None => self.channels.contains(&msg.channel),
        }
    }

    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    pub fn hold(&mut self, msg: Message) {
        self.held_bytes += msg.size();
        self.held.push(msg);
    }

    /// Writes the held messages out (once no reply is half written).
    pub fn release(&mut self, out: &mut Vec<u8>, v3: bool) {
        for m in self.held.drain(..) {
            m.encode(out, v3);
        }
        self.held_bytes = 0;
    }

    /// Leaves every channel and pattern (RESET, closing).
    pub fn clear(&mut self) {
        for kind in [Kind::Channel, Kind::Pattern] {
            for name in self.names(kind) {
                self.unsubscribe(kind, &name);
            }
        }
        self.held.clear();
        self.held_bytes = 0;
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        self.clear();
    }
}
