//! The RESP clients connected to any worker, for CLIENT LIST and CLIENT KILL.
//!
//! Each RESP connection has a `ClientInfo` here from accept to close. Its fixed facts (id,
//! addresses, when it connected) are set once; what changes (name, flags, subscription
//! counts, last command, when it last sent something) is refreshed by the connection's own
//! worker after each pass that ran its requests, with plain atomic stores (the name under a
//! small lock, only when it changes). CLIENT LIST reads whatever the table holds; CLIENT KILL
//! leaves the victims in their workers' kill lists and wakes those workers, which close them
//! at their next pass: no thread ever touches another worker's connections.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A connection's flags as CLIENT LIST shows them.
pub const FLAG_MULTI: u8 = 1;
pub const FLAG_PUBSUB: u8 = 2;
pub const FLAG_BLOCKED: u8 = 4;

#[derive(Debug)]
pub struct ClientInfo {
    pub id: u64,
    pub worker: usize,
    pub slot: u32,
    pub epoch: u32,
    pub addr: Option<SocketAddr>,
    pub laddr: Option<SocketAddr>,
    pub fd: i32,
    pub connected: Instant,
    /// Milliseconds after `connected` when the client last sent a request.
    pub active_ms: AtomicU64,
    pub flags: AtomicU8,
    pub resp: AtomicU8,
    pub sub: AtomicU32,
    pub psub: AtomicU32,
    /// Inside MULTI: the commands queued, plus one (0: not in MULTI).
    pub multi: AtomicU32,
    /// The last command run ("NULL" before the first).
    cmd: Mutex<&'static str>,
    name: Mutex<Option<Vec<u8>>>,
}

impl ClientInfo {
    pub fn set_name(&self, name: Option<&[u8]>) {
        *self.name.lock().unwrap_or_else(|p| p.into_inner()) = name.map(<[u8]>::to_vec);
    }

    pub fn name(&self) -> Vec<u8> {
        self.name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default()
    }

    pub fn set_cmd(&self, cmd: &'static str) {
        *self.cmd.lock().unwrap_or_else(|p| p.into_inner()) = cmd;
    }

    pub fn cmd(&self) -> &'static str {
        *self.cmd.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What CLIENT KILL matches on (all given filters must match).
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub id: Option<u64>,
    pub addr: Option<String>,
    pub laddr: Option<String>,
    /// TYPE: Some(true) pubsub only, Some(false) normal only.
    pub pubsub: Option<bool>,
    /// TYPE master/replica: nothing matches (memkeep has no replication links).
    pub none: bool,
    /// Skip the calling client (SKIPME yes, the default).
    pub skip: Option<u64>,
}

impl Filter {
    pub fn matches(&self, c: &ClientInfo) -> bool {
        let shown = |a: &Option<SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
        !self.none
            && self.skip != Some(c.id)
            && self.id.is_none_or(|id| id == c.id)
            && self.addr.as_ref().is_none_or(|a| *a == shown(&c.addr))
            && self.laddr.as_ref().is_none_or(|a| *a == shown(&c.laddr))
            && self
                .pubsub
                .is_none_or(|p| p == (c.flags.load(Ordering::Relaxed) & FLAG_PUBSUB != 0))
    }
}

/// Every RESP client, and each worker's list of connections to close.
#[derive(Debug)]
pub struct Clients {
    map: Mutex<HashMap<u64, Arc<ClientInfo>>>,
    kills: Vec<Mutex<Vec<(u32, u32)>>>,
}

impl Clients {
    pub fn new(workers: usize) -> Clients {
        Clients {
            map: Mutex::new(HashMap::new()),
            kills: (0..workers).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ClientInfo>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A RESP connection was accepted.
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &self,
        id: u64,
        worker: usize,
        slot: u32,
        epoch: u32,
        addr: Option<SocketAddr>,
        laddr: Option<SocketAddr>,
        fd: i32,
    ) -> Arc<ClientInfo> {
        let info = Arc::new(ClientInfo {
            id,
            worker,
            slot,
            epoch,
            addr,
            laddr,
            fd,
            connected: Instant::now(),
            active_ms: AtomicU64::new(0),
            flags: AtomicU8::new(0),
            resp: AtomicU8::new(2),
            sub: AtomicU32::new(0),
            psub: AtomicU32::new(0),
            multi: AtomicU32::new(0),
            cmd: Mutex::new("NULL"),
            name: Mutex::new(None),
        });
        self.lock().insert(id, info.clone());
        info
    }

    pub fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Every client, by id.
    pub fn all(&self) -> Vec<Arc<ClientInfo>> {
        let mut v: Vec<Arc<ClientInfo>> = self.lock().values().cloned().collect();
        v.sort_by_key(|c| c.id);
        v
    }

    /// Asks the workers to close every client `filter` matches (but `keep`, the caller, which
    /// closes itself after its reply); returns how many matched, `keep` included.
    pub fn kill(&self, filter: &Filter, keep: Option<u64>, wake: impl Fn(usize)) -> usize {
        let victims: Vec<Arc<ClientInfo>> = self
            .lock()
            .values()
            .filter(|c| filter.matches(c))
            .cloned()
            .collect();
        let mut woken = vec![false; self.kills.len()];
        for v in &victims {
            if Some(v.id) == keep {
                continue;
            }
            if let Some(list) = self.kills.get(v.worker) {
                list.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((v.slot, v.epoch));
                woken[v.worker] = true;
            }
        }
        for (w, yes) in woken.into_iter().enumerate() {
            if yes {
                wake(w);
            }
        }
        victims.len()
    }

    /// The connections this worker must close.
    pub fn take_kills(&self, worker: usize, out: &mut Vec<(u32, u32)>) {
        if let Some(list) = self.kills.get(worker) {
            out.append(&mut list.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }
}
