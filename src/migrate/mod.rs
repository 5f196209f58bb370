//! Migration from Redis: `memkeep import --rdb FILE` loads a Redis RDB file (`dump.rdb`, or
//! what `redis-cli --rdb` fetched) into a running memkeep, through its RESP port.
//!
//! The file is read twice, streaming (`rdbfile`: one value in memory at a time). The first pass
//! checks it whole without sending anything: its framing, every value of a type memkeep holds
//! decoded as RESTORE would (`rdb::decode`), the checksum at the end. A truncated or damaged
//! file is refused there, naming the byte, and nothing is loaded. The second pass sends each
//! key of the chosen database (0 unless `--db`) as `RESTORE key <expiry> <value> REPLACE
//! ABSTTL`, the value's bytes exactly as the file holds them: the writes go through the
//! server's writer and log like any client's, so the import is as durable as the server's sync
//! mode, and the server may serve clients meanwhile. Keys go over `CONNECTIONS` connections,
//! each pipelined `WINDOW` commands deep (replies are read by one thread per connection), so
//! the group commit fills its batches.
//!
//! Skipped, and counted in the summary: keys already expired (their absolute expiry past at
//! the time they are sent), keys of other databases, values of types memkeep does not hold
//! (streams, module types), function libraries and module auxiliary data. A key the server
//! refuses (memkeep's own limits: a key over 511 bytes, a hash field or set member over 495
//! bytes) is reported with its reason and the import goes on; the exit status then says so.

pub mod rdbfile;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdbfile::{FileError, RdbReader, escape, seal, type_name};

use crate::types::rdb;

/// Connections the keys are spread over.
const CONNECTIONS: usize = 4;
/// Commands in flight per connection.
const WINDOW: usize = 1024;
/// Consecutive keys sent on one connection before the next takes over.
const RUN: u64 = 32;
/// Output bytes gathered per connection before they are written.
const FLUSH_BYTES: usize = 256 << 10;
/// Refusals reported one by one; the rest are counted.
const REPORTED: usize = 20;

/// Where and how to load.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server's RESP address.
    pub addr: String,
    /// Sent with AUTH first when not empty (the server's `requirepass`).
    pub password: String,
    /// The Redis database whose keys are loaded.
    pub db: u64,
    /// A progress line on stderr (when it is a terminal).
    pub progress: bool,
}

/// What an import did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub version: u16,
    /// The `redis-ver` AUX field, if the file has one.
    pub redis_version: Option<String>,
    pub bytes: u64,
    /// Keys the server stored.
    pub loaded: u64,
    /// Keys already expired, not sent.
    pub expired: u64,
    /// Keys of other databases, per database.
    pub other_dbs: BTreeMap<u64, u64>,
    /// Values of types memkeep does not hold, per type.
    pub skipped: BTreeMap<String, u64>,
    pub functions: u64,
    pub module_aux: u64,
    /// Keys the server refused, and the first few (key, offset, reply).
    pub refused: u64,
    pub refusals: Vec<String>,
    pub secs: f64,
}

impl Summary {
    /// The summary, line by line, for stderr.
    pub fn lines(&self, file: &Path) -> Vec<String> {
        let rate = self.loaded as f64 / self.secs.max(1e-6);
        let from = match &self.redis_version {
            Some(v) => format!("RDB version {}, Redis {v}", self.version),
            None => format!("RDB version {}", self.version),
        };
        let mut out = vec![format!(
            "loaded {} keys from {} ({from}, {:.1} MB) in {:.2} s ({rate:.0} keys/s)",
            self.loaded,
            file.display(),
            self.bytes as f64 / 1e6,
            self.secs
        )];
        out.push(format!("{} keys already expired, skipped", self.expired));
        for (ty, n) in &self.skipped {
            out.push(format!(
                "{n} keys of type {ty} skipped (memkeep has no such type)"
            ));
        }
        for (db, n) in &self.other_dbs {
            out.push(format!(
                "{n} keys of database {db} skipped (memkeep has one database; --db picks which \
                 is loaded)"
            ));
        }
        if self.functions > 0 {
            out.push(format!(
                "{} function libraries skipped (memkeep has no FUNCTION)",
                self.functions
            ));
        }
        if self.module_aux > 0 {
            out.push(format!("{} blocks of module data skipped", self.module_aux));
        }
        if self.refused > 0 {
            out.push(format!("{} keys refused by the server:", self.refused));
            out.extend(self.refusals.iter().map(|r| format!("  {r}")));
            if self.refused > self.refusals.len() as u64 {
                out.push(format!(
                    "  ... and {} more",
                    self.refused - self.refusals.len() as u64
                ));
            }
        }
        out
    }
}

fn open(path: &Path) -> Result<RdbReader<File>, String> {
    let f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let size = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    RdbReader::new(f, size).map_err(|e| at(path, e))
}

fn at(path: &Path, e: FileError) -> String {
    format!("{}: {e}", path.display())
}

/// A progress line on stderr, at most four times a second.
struct Progress {
    on: bool,
    size: u64,
    started: Instant,
    last: Instant,
    verb: &'static str,
}

impl Progress {
    fn new(on: bool, size: u64, verb: &'static str) -> Progress {
        let now = Instant::now();
        Progress {
            on,
            size,
            started: now,
            last: now,
            verb,
        }
    }

    fn show(&mut self, keys: u64, bytes: u64, force: bool) {
        if !self.on || (!force && self.last.elapsed() < Duration::from_millis(250)) {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let pct = if self.size > 0 {
            format!(" ({:.0}%)", bytes as f64 * 100.0 / self.size as f64)
        } else {
            String::new()
        };
        eprint!(
            "\r\x1b[Kmemkeep: {} {keys} keys, {:.1} of {:.1} MB{pct}, {:.0} keys/s",
            self.verb,
            bytes as f64 / 1e6,
            self.size as f64 / 1e6,
            keys as f64 / secs
        );
        if force {
            eprintln!();
        }
    }
}

/// Checks the whole file without sending anything: framing, every value memkeep would load
/// decoded as RESTORE decodes it, the checksum.
pub fn check(path: &Path, db: u64, progress: bool) -> Result<u64, String> {
    let mut r = open(path)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut p = Progress::new(progress, size, "checked");
    let mut keys = 0u64;
    while let Some(rec) = r.next_key().map_err(|e| at(path, e))? {
        keys += 1;
        if rec.skipped.is_none() && rec.db == db {
            let ty = rec.ty;
            let (key, offset) = (rec.key, rec.offset);
            if let Err(e) = rdb::decode(&seal(rec.value), usize::MAX) {
                let why = match e {
                    rdb::BadPayload::Format => "malformed",
                    _ => "unreadable",
                };
                return Err(at(
                    path,
                    FileError {
                        offset,
                        what: format!(
                            "the value of key {} ({}) is {why}: the file is damaged",
                            escape(&key),
                            type_name(ty).unwrap_or("?")
                        ),
                    },
                ));
            }
        }
        if keys.is_multiple_of(256) {
            p.show(keys, r.offset(), false);
        }
    }
    p.show(keys, r.offset(), true);
    Ok(keys)
}

/// One connection to the server: commands gathered in `out`, the keys awaiting replies told to
/// its reader thread through `pending` (bounded: the window).
struct Conn {
    stream: TcpStream,
    out: Vec<u8>,
    pending: Option<SyncSender<Pending>>,
    reader: Option<JoinHandle<Result<Refusals, String>>>,
}

/// A command sent, awaiting its reply.
struct Pending {
    key: Vec<u8>,
    offset: u64,
}

#[derive(Default)]
struct Refusals {
    count: u64,
    first: Vec<String>,
}

/// Reads one reply line (`+...` or `-...`); Err for anything else or a closed connection.
fn reply(r: &mut BufReader<TcpStream>, line: &mut Vec<u8>) -> Result<Result<(), String>, String> {
    line.clear();
    match r.read_until(b'\n', line) {
        Ok(0) => Err("the server closed the connection".into()),
        Ok(_) => {
            let text = String::from_utf8_lossy(line).trim_end().to_string();
            match line.first() {
                Some(b'+') => Ok(Ok(())),
                Some(b'-') => Ok(Err(text[1..].to_string())),
                _ => Err(format!("unexpected reply from the server: {text}")),
            }
        }
        Err(e) => Err(format!("no reply from the server: {e}")),
    }
}

fn read_replies(
    stream: TcpStream,
    pending: Receiver<Pending>,
    loaded: Arc<AtomicU64>,
) -> Result<Refusals, String> {
    let mut r = BufReader::with_capacity(64 << 10, stream);
    let mut line = Vec::new();
    let mut refused = Refusals::default();
    for p in pending {
        match reply(&mut r, &mut line)? {
            Ok(()) => {
                loaded.fetch_add(1, Ordering::Relaxed);
            }
            Err(msg) => {
                refused.count += 1;
                if refused.first.len() < REPORTED {
                    refused.first.push(format!(
                        "key {} (byte {}): {msg}",
                        escape(&p.key),
                        p.offset
                    ));
                }
            }
        }
    }
    Ok(refused)
}

/// Sends one command and reads its one-line reply, byte by byte (nothing else is in flight,
/// and nothing past the reply may be taken from the socket).
fn call(stream: &TcpStream, args: &[&[u8]]) -> std::io::Result<String> {
    let mut cmd = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        bulk(&mut cmd, a);
    }
    let mut s = stream;
    s.write_all(&cmd)?;
    let mut byte = [0u8; 1];
    let mut line = Vec::new();
    while byte[0] != b'\n' {
        std::io::Read::read_exact(&mut s, &mut byte)?;
        line.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&line).trim_end().to_string())
}

fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(b.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

impl Conn {
    fn open(addr: &str, password: &str, loaded: &Arc<AtomicU64>) -> Result<Conn, String> {
        let stream =
            TcpStream::connect(addr).map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        // A RESTORE of a large value may take a while; a server that says nothing for this
        // long is gone.
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(|e| e.to_string())?;
        let read_half = stream.try_clone().map_err(|e| e.to_string())?;
        if !password.is_empty() {
            let line = call(&stream, &[b"AUTH", password.as_bytes()])
                .map_err(|e| format!("no reply to AUTH from {addr}: {e}"))?;
            if !line.starts_with('+') {
                return Err(format!("{addr} refused AUTH: {line}"));
            }
        }
        // Before any key: a server that wants a password (or is no RESP server) says so here.
        let line = call(&stream, &[b"PING"]).map_err(|e| format!("no reply from {addr}: {e}"))?;
        if line != "+PONG" {
            return Err(format!(
                "{addr} answered PING with `{line}`{}",
                if line.starts_with("-NOAUTH") {
                    ": give the server's password with --requirepass (or its --config)"
                } else {
                    ""
                }
            ));
        }
        let (tx, rx) = sync_channel(WINDOW);
        let loaded = loaded.clone();
        let reader = std::thread::Builder::new()
            .name("memkeep-import".into())
            .spawn(move || read_replies(read_half, rx, loaded))
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        Ok(Conn {
            stream,
            out: Vec::with_capacity(FLUSH_BYTES * 2),
            pending: Some(tx),
            reader: Some(reader),
        })
    }

    fn flush(&mut self) -> Result<(), String> {
        if !self.out.is_empty() {
            let r = (&self.stream).write_all(&self.out);
            self.out.clear();
            if let Err(e) = r {
                return Err(self.failure(format!("cannot send to the server: {e}")));
            }
        }
        Ok(())
    }

    /// The reader's error if it stopped with one (it says why better than the writer can).
    fn failure(&mut self, fallback: String) -> String {
        self.pending = None;
        match self.reader.take().map(JoinHandle::join) {
            Some(Ok(Err(e))) => e,
            _ => fallback,
        }
    }

    /// Sends one command (`write` appends it to the output) awaiting a reply about `key`.
    fn send(
        &mut self,
        key: Vec<u8>,
        offset: u64,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), String> {
        let Some(tx) = &self.pending else {
            return Err("connection closed".into());
        };
        // The reader learns of the command before its reply can come.
        match tx.try_send(Pending { key, offset }) {
            Ok(()) => {}
            Err(TrySendError::Full(p)) => {
                // The window is full: send what is gathered, then wait for room.
                self.flush()?;
                let sent = self.pending.as_ref().map(|tx| tx.send(p));
                if !matches!(sent, Some(Ok(()))) {
                    return Err(self.failure("the reply reader stopped".into()));
                }
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(self.failure("the reply reader stopped".into()));
            }
        }
        write(&mut self.out);
        if self.out.len() >= FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }
}

/// Loads the file into the server: `check`, then every key of `opts.db` as a RESTORE.
pub fn import(path: &Path, opts: &Options) -> Result<Summary, String> {
    if path.as_os_str() == "-" {
        return Err(
            "--rdb reads its file twice (checked whole, then loaded): give a file, not standard \
             input"
                .into(),
        );
    }
    let started = Instant::now();
    let show = opts.progress && std::io::stderr().is_terminal();
    check(path, opts.db, show)?;

    let loaded = Arc::new(AtomicU64::new(0));
    let mut conns = (0..CONNECTIONS)
        .map(|_| Conn::open(&opts.addr, &opts.password, &loaded))
        .collect::<Result<Vec<_>, _>>()?;
    let mut r = open(path)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut p = Progress::new(show, size, "loaded");
    let mut s = Summary::default();
    let mut sent = 0u64;
    while let Some(rec) = r.next_key().map_err(|e| at(path, e))? {
        if rec.db != opts.db {
            *s.other_dbs.entry(rec.db).or_default() += 1;
            continue;
        }
        if let Some(ty) = &rec.skipped {
            *s.skipped.entry(ty.clone()).or_default() += 1;
            continue;
        }
        let now = crate::clock::Clock::System.now_ms();
        let expire = rec.expire_ms.unwrap_or(0);
        if expire != 0 && expire <= now {
            s.expired += 1;
            continue;
        }
        let c = &mut conns[((sent / RUN) % CONNECTIONS as u64) as usize];
        sent += 1;
        let value = rec.value;
        c.send(rec.key.clone(), rec.offset, |out| {
            out.extend_from_slice(b"*6\r\n");
            bulk(out, b"RESTORE");
            bulk(out, &rec.key);
            bulk(out, itoa::Buffer::new().format(expire).as_bytes());
            // The value as a DUMP payload, its footer written in place.
            let version = rdb::RDB_VERSION.to_le_bytes();
            let crc = rdb::crc64(rdb::crc64(0, &value), &version);
            out.push(b'$');
            out.extend_from_slice(itoa::Buffer::new().format(value.len() + 10).as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&value);
            out.extend_from_slice(&version);
            out.extend_from_slice(&crc.to_le_bytes());
            out.extend_from_slice(b"\r\n");
            bulk(out, b"REPLACE");
            bulk(out, b"ABSTTL");
        })?;
        if sent.is_multiple_of(256) {
            p.show(loaded.load(Ordering::Relaxed), r.offset(), false);
        }
    }
    for c in &mut conns {
        c.flush()?;
    }
    for c in &mut conns {
        c.pending = None;
        let refusals = match c.reader.take().map(JoinHandle::join) {
            Some(Ok(r)) => r?,
            Some(Err(_)) => return Err("a reply reader panicked".into()),
            None => return Err("a connection failed".into()),
        };
        s.refused += refusals.count;
        for f in refusals.first {
            if s.refusals.len() < REPORTED {
                s.refusals.push(f);
            }
        }
    }
    s.loaded = loaded.load(Ordering::Relaxed);
    p.show(s.loaded, r.offset(), true);
    s.version = r.extras.version;
    s.redis_version = r
        .extras
        .aux
        .iter()
        .find(|(k, _)| k == "redis-ver")
        .map(|(_, v)| v.clone());
    s.functions = r.extras.functions;
    s.module_aux = r.extras.module_aux;
    s.bytes = r.offset();
    s.secs = started.elapsed().as_secs_f64();
    Ok(s)
}
