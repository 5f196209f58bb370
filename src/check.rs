//! `memkeep check DATA_DIR`: verifies a store offline, without changing a byte of it.
//!
//! What it checks, in the order recovery would meet it:
//! 1. the `checkpoint` record (its checksum and meta page), that `data.mdb` is as long as the
//!    checkpoint's snapshot needs and that the snapshot's root pages are the ones recorded;
//! 2. the write-ahead log from the checkpoint's first segment on: the whole batches recovery
//!    would replay, and where and why the log ends. A torn tail is what a crash leaves and is
//!    only reported; a batch that passes its checksum but whose records do not parse, and
//!    batches stranded after the end of the log, are damage;
//! 3. LMDB's contents as recovery leaves them. The store is never opened in place (recovery
//!    writes the checkpoint's meta page into `data.mdb` and cuts the log): `data.mdb`, the
//!    checkpoint and the log are copied into a temporary directory (`$TMPDIR`, which needs
//!    room for `data.mdb`), recovered there as a server would, and walked with one read
//!    transaction: every item decodes; every collection's metadata decodes and counts exactly
//!    the elements stored under its id (list positions within head..tail, each sorted-set
//!    member's score in the score index and back); every item with an expiry has its `expiry`
//!    entry, and every `expiry` entry names an item expiring then or is stale (fine: the sweep
//!    drops it); no id in `gc` is still some key's collection; no element belongs to no
//!    collection; the CAS counter is not behind any unique handed out.
//!
//! A directory a process holds (its `memkeep.lock` is locked) is refused: stop the server
//! first. The check holds that lock itself while it runs, so a server cannot start on the
//! directory meanwhile. One line per problem on the output, then a summary; the exit code is
//! 0 when no problem was found, 1 when the store is damaged, 2 when it could not be checked.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::storage::item::{self, Kind};
use crate::storage::lmdb::{DB_GC, INDEX_KEY_MAX, LmdbStore, META_CAS, META_COLLS, META_FLUSH_AT};
use crate::storage::wal::{self, Checkpoint, SegmentReader};
use crate::types::CollMeta;

/// At most this many problem lines are printed (all are counted).
const MAX_SHOWN: u64 = 1000;

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    Damaged,
}

/// The problems found and the notes worth telling, written as they are found.
struct Checker<'a> {
    out: &'a mut dyn Write,
    problems: u64,
}

impl Checker<'_> {
    fn problem(&mut self, what: impl AsRef<str>) {
        self.problems += 1;
        if self.problems <= MAX_SHOWN {
            let _ = writeln!(self.out, "problem: {}", what.as_ref());
        } else if self.problems == MAX_SHOWN + 1 {
            let _ = writeln!(
                self.out,
                "problem: ... (more problems are counted, not shown)"
            );
        }
    }

    fn note(&mut self, what: impl AsRef<str>) {
        let _ = writeln!(self.out, "note: {}", what.as_ref());
    }
}

/// A key as a line can show it: printable ASCII as is, other bytes escaped, long keys cut.
fn show(key: &[u8]) -> String {
    let cut = key.len() > 100;
    let mut s = format!("\"{}\"", key[..key.len().min(100)].escape_ascii());
    if cut {
        s.push_str("...");
    }
    s
}

/// Checks the store in `dir`, writing problems, notes and the summary to `out`. Err: the
/// store could not be checked (the reason, one line).
pub fn check(dir: &Path, map_size: u64, out: &mut dyn Write) -> Result<Verdict, String> {
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let data_path = dir.join("data.mdb");
    if !data_path.exists() {
        return Err(format!("no data.mdb in {}", dir.display()));
    }
    let _lock = hold_lock(dir)?;
    let mut ck = Checker { out, problems: 0 };
    let mut summary = Summary::default();

    // 1. The checkpoint and the data file it describes.
    let segments = wal::segments(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let data =
        File::open(&data_path).map_err(|e| format!("cannot open {}: {e}", data_path.display()))?;
    let data_len = data
        .metadata()
        .map_err(|e| format!("cannot stat {}: {e}", data_path.display()))?
        .len();
    // Whether recovery would get as far as opening LMDB.
    let mut openable = true;
    let ckpt = match wal::read_checkpoint(dir) {
        Ok(c) => c,
        Err(e) => {
            ck.problem(e);
            openable = false;
            None
        }
    };
    match &ckpt {
        None if openable && !segments.is_empty() => {
            ck.problem(format!(
                "{} has log files but no checkpoint: recovery refuses it",
                dir.display()
            ));
            openable = false;
        }
        None if openable => ck.note(
            "no checkpoint: the store was never opened by a memkeep with the write-ahead log; \
             it is checked as LMDB's own meta pages describe it",
        ),
        None => {}
        Some(c) => {
            ck.note(format!(
                "checkpoint: LMDB transaction {}, batch {}, log from {}",
                c.txnid,
                c.seq,
                wal::segment_name(c.segment)
            ));
            let need = wal::meta_needs(&c.page);
            if data_len < need {
                ck.problem(format!(
                    "{} is truncated: {data_len} bytes, but the checkpoint's snapshot needs {need}",
                    data_path.display()
                ));
                openable = false;
            } else {
                match wal::root_digest(&data, &c.page) {
                    Ok(d) if d == c.roots => {}
                    Ok(_) => {
                        ck.problem(format!(
                            "{} is not the file the checkpoint describes: its snapshot's root pages differ",
                            data_path.display()
                        ));
                        openable = false;
                    }
                    Err(e) => {
                        ck.problem(format!(
                            "cannot read the checkpoint's root pages from {}: {e}",
                            data_path.display()
                        ));
                        openable = false;
                    }
                }
            }
        }
    }
    drop(data);

    // 2. The log.
    let mut cut = None;
    if let Some(c) = &ckpt {
        cut = check_log(&mut ck, &segments, c, &mut summary)?;
    }

    // 3. LMDB as recovery leaves it, on a copy.
    if openable {
        let tmp = TempDir::new()?;
        copy_store(dir, tmp.path(), ckpt.as_ref(), &segments, cut)?;
        match crate::storage::durable::open(tmp.path(), map_size, 126) {
            Err(e) => ck.problem(format!(
                "recovery fails: {}",
                e.0.replace(
                    &tmp.path().display().to_string(),
                    &dir.display().to_string()
                )
            )),
            Ok(d) => {
                walk(&d.store, &mut ck, &mut summary);
                drop(d);
            }
        }
    } else {
        ck.note("LMDB's contents were not checked: recovery would refuse this store (see above)");
    }

    let problems = ck.problems;
    summary.write(ck.out, dir, problems);
    Ok(if problems == 0 {
        Verdict::Healthy
    } else {
        Verdict::Damaged
    })
}

/// Runs the check for the command line: its exit code (0 healthy, 1 damaged, 2 not checked).
pub fn run(dir: &Path, map_size: u64) -> u8 {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match check(dir, map_size, &mut out) {
        Ok(Verdict::Healthy) => 0,
        Ok(Verdict::Damaged) => 1,
        Err(e) => {
            let _ = out.flush();
            eprintln!("memkeep: cannot check {}: {e}", dir.display());
            2
        }
    }
}

/// Takes the data directory's lock (if it has one) for the time of the check; Err if a
/// process holds it.
fn hold_lock(dir: &Path) -> Result<Option<File>, String> {
    let path = dir.join("memkeep.lock");
    let f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    // Safety: flock on a file descriptor this function owns; released when `f` closes.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            format!(
                "{} is in use by a running memkeep: stop the server first",
                dir.display()
            )
        } else {
            format!("cannot lock {}: {e}", path.display())
        });
    }
    Ok(Some(f))
}

/// Where recovery's copy of the log must be cut: a batch that does not parse (segment, offset).
type Cut = Option<(u64, u64)>;

/// Reads the log as recovery would, without applying it.
fn check_log(
    ck: &mut Checker<'_>,
    segments: &[(u64, PathBuf)],
    c: &Checkpoint,
    summary: &mut Summary,
) -> Result<Cut, String> {
    let mut next_seq = c.seq + 1;
    // The last segment the log reached.
    let mut last: Option<u64> = None;
    // Why the log ended before its files did, once it has.
    let mut ended: Option<String> = None;
    // Where the log's batches end in its last segment, and why, reported once it is known.
    let mut tail: Option<String> = None;
    let mut cut: Cut = None;
    let mut buf = Vec::new();
    if !segments.iter().any(|(n, _)| *n >= c.segment) {
        ck.note("no log segment after the checkpoint: nothing to replay");
    }
    let read_err = |path: &Path, e: std::io::Error| format!("cannot read {}: {e}", path.display());
    for (n, path) in segments {
        let name = wal::segment_name(*n);
        if *n < c.segment {
            ck.note(format!(
                "{name} is covered by the checkpoint (recovery makes it a spare, or keeps it \
                 if the store's values may live in it: value_log_min)"
            ));
            continue;
        }
        let follows = match last {
            None => *n == c.segment || *n == c.segment + 1,
            Some(l) => *n == l + 1,
        };
        if ended.is_none() && !follows {
            let missing = last.map_or(c.segment, |l| l + 1);
            ended = Some(format!("{} is missing", wal::segment_name(missing)));
        }
        if ended.is_none() {
            let mut reader =
                SegmentReader::open(path, *n, Some(next_seq)).map_err(|e| read_err(path, e))?;
            let (mut batches, mut bytes) = (0u64, 0u64);
            let mut unparsed = None;
            while let Some(seq) = reader.next_batch(&mut buf).map_err(|e| read_err(path, e))? {
                let start = reader.valid_len - (wal::HEADER + buf.len()) as u64;
                let bad = wal::ops(&buf).find_map(|op| match op {
                    Err(e) => Some(e),
                    Ok(
                        wal::Op::Put { db, .. }
                        | wal::Op::Del { db, .. }
                        | wal::Op::Clear { db }
                        | wal::Op::Patch { db, .. },
                    ) if db > DB_GC => Some(format!("a record names unknown database {db}")),
                    Ok(_) => None,
                });
                if let Some(e) = bad {
                    ck.problem(format!(
                        "{name}: batch {seq} at byte {start} passes its checksum but does not parse: {e}; recovery refuses the store"
                    ));
                    // The copy is recovered up to the batch before, so the rest can be checked.
                    cut = Some((*n, start));
                    unparsed = Some(seq);
                    break;
                }
                batches += 1;
                bytes += buf.len() as u64;
                next_seq += 1;
            }
            let first_does_not_follow = batches == 0
                && last.is_some()
                && matches!(reader.stop, Some(wal::Stop::Unexpected { .. }));
            if unparsed.is_none() && first_does_not_follow {
                // Recovery ends the log in the previous segment and removes this one.
                ended = Some(format!(
                    "its first batch does not follow the previous segment's last: {}",
                    reader
                        .stop
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default()
                ));
            } else {
                summary.batches += batches;
                summary.log_bytes += bytes;
                ck.note(format!(
                    "{name}: {batches} batches ({bytes} bytes) to replay"
                ));
                last = Some(*n);
                let len = std::fs::metadata(path).map_or(0, |m| m.len());
                tail = match (&reader.stop, unparsed) {
                    (_, Some(seq)) => {
                        ended = Some(format!("batch {seq} of {name} does not parse"));
                        None
                    }
                    (Some(why), None) if reader.torn() => Some(format!(
                        "the log ends in {name} at byte {} of {len}: {why} (a torn tail, as a crash leaves; recovery cuts it there)",
                        reader.valid_len
                    )),
                    (Some(why), None) => Some(format!(
                        "the log's batches in {name} end at byte {} of {len}: {why} (space not written since the file became this segment)",
                        reader.valid_len
                    )),
                    (None, None) => None,
                };
                continue;
            }
        }
        // Past the end of the log: recovery removes this segment with whatever it holds.
        let why = ended.clone().unwrap_or_default();
        let mut reader = SegmentReader::open(path, *n, None).map_err(|e| read_err(path, e))?;
        let mut whole = 0u64;
        while reader
            .next_batch(&mut buf)
            .map_err(|e| read_err(path, e))?
            .is_some()
        {
            whole += 1;
        }
        if whole > 0 {
            ck.problem(format!(
                "{name} holds {whole} whole batches after the end of the log ({why}): they would not be replayed"
            ));
        } else {
            ck.note(format!(
                "{name} follows the end of the log and holds no batch (recovery removes it)"
            ));
        }
    }
    if let Some(t) = tail {
        ck.note(t);
    }
    Ok(cut)
}

/// A directory under `$TMPDIR` removed (with what it holds) when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, String> {
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for attempt in 0..100u32 {
            let p = base.join(format!(
                "memkeep-check-{}-{nanos}-{attempt}",
                std::process::id()
            ));
            match std::fs::create_dir(&p) {
                Ok(()) => return Ok(TempDir(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(format!(
                        "cannot create a working directory in {}: {e}",
                        base.display()
                    ));
                }
            }
        }
        Err(format!(
            "cannot create a working directory in {}",
            base.display()
        ))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies what recovery reads (data file, checkpoint, the log from the checkpoint's first
/// segment on, cut at `cut`) into `to`.
fn copy_store(
    from: &Path,
    to: &Path,
    ckpt: Option<&Checkpoint>,
    segments: &[(u64, PathBuf)],
    cut: Cut,
) -> Result<(), String> {
    let copy = |src: &Path, name: &str| -> Result<(), String> {
        std::fs::copy(src, to.join(name)).map(|_| ()).map_err(|e| {
            format!(
                "cannot copy {} into {} (TMPDIR needs room for the data file): {e}",
                src.display(),
                to.display()
            )
        })
    };
    copy(&from.join("data.mdb"), "data.mdb")?;
    let Some(c) = ckpt else {
        return Ok(());
    };
    copy(&from.join(wal::CHECKPOINT_FILE), wal::CHECKPOINT_FILE)?;
    for (n, path) in segments {
        if *n < c.segment {
            // Read only where values may live in it (`vlog.rs`): linked, not copied.
            std::os::unix::fs::symlink(path, to.join(wal::segment_name(*n))).map_err(|e| {
                format!("cannot link {} into {}: {e}", path.display(), to.display())
            })?;
            continue;
        }
        if cut.is_some_and(|(s, _)| *n > s) {
            continue;
        }
        let name = wal::segment_name(*n);
        copy(path, &name)?;
        if let Some((s, at)) = cut
            && s == *n
        {
            File::options()
                .write(true)
                .open(to.join(&name))
                .and_then(|f| f.set_len(at))
                .map_err(|e| format!("cannot cut the copy of {name}: {e}"))?;
        }
    }
    Ok(())
}

/// What the store holds, for the summary.
#[derive(Debug, Default)]
struct Summary {
    items: u64,
    strings: u64,
    /// Strings whose value lives in the log (`vlog.rs`).
    separated: u64,
    lists: u64,
    hashes: u64,
    sets: u64,
    zsets: u64,
    elements: u64,
    expiry: u64,
    stale_expiry: u64,
    gc: u64,
    gc_elements: u64,
    batches: u64,
    log_bytes: u64,
}

impl Summary {
    fn write(&self, out: &mut dyn Write, dir: &Path, problems: u64) {
        let _ = writeln!(
            out,
            "summary: {} items ({} strings, {} of them with their value in the log, {} collections: \
             {} lists, {} hashes, {} sets, {} sorted sets), \
             {} elements, {} expiry entries ({} stale), {} deleted collections awaiting reclaim ({} elements), \
             {} log batches to replay ({} bytes)",
            self.items,
            self.strings,
            self.separated,
            self.lists + self.hashes + self.sets + self.zsets,
            self.lists,
            self.hashes,
            self.sets,
            self.zsets,
            self.elements,
            self.expiry,
            self.stale_expiry,
            self.gc,
            self.gc_elements,
            self.batches,
            self.log_bytes
        );
        let _ = match problems {
            0 => writeln!(out, "memkeep check {}: no problems found", dir.display()),
            1 => writeln!(out, "memkeep check {}: 1 problem found", dir.display()),
            n => writeln!(out, "memkeep check {}: {n} problems found", dir.display()),
        };
    }
}

/// A collection as its metadata record describes it.
struct Coll {
    key: Vec<u8>,
    kind: Kind,
    meta: CollMeta,
    /// Element records found under its id.
    elems: u64,
    /// Score-index records found under its id (sorted sets).
    scores: u64,
}

/// Walks every database of the recovered store. Each database is read in a transaction of
/// its own: LMDB fails every later read of a transaction that met a damaged page, and damage
/// in one database must not hide the state of the others. Nothing writes meanwhile, so every
/// transaction sees the same snapshot.
fn walk(store: &LmdbStore, ck: &mut Checker<'_>, sum: &mut Summary) {
    let Ok(txn) = fresh_txn(store, ck) else {
        return;
    };
    let txn = &txn;
    // The meta records.
    let u64_of = |ck: &mut Checker<'_>, name: &[u8]| -> Option<u64> {
        match store.meta.get(txn, name) {
            Ok(None) => None,
            Ok(Some(b)) => match <[u8; 8]>::try_from(b) {
                Ok(a) => Some(u64::from_le_bytes(a)),
                Err(_) => {
                    ck.problem(format!(
                        "meta record {} is {} bytes, not 8",
                        show(name),
                        b.len()
                    ));
                    None
                }
            },
            Err(e) => {
                ck.problem(format!("cannot read meta record {}: {e}", show(name)));
                None
            }
        }
    };
    let cas_counter = u64_of(ck, META_CAS).unwrap_or(0);
    let _ = u64_of(ck, META_FLUSH_AT);
    let colls_marked = matches!(store.meta.get(txn, META_COLLS), Ok(Some(_)));

    // Items.
    let mut colls: HashMap<u64, Coll> = HashMap::new();
    let mut max_unique = 0u64;
    match store.items.iter(txn) {
        Err(e) => ck.problem(format!("cannot read the items: {e}")),
        Ok(iter) => {
            let mut last: Option<Vec<u8>> = None;
            for entry in iter {
                let (key, bytes) = match entry {
                    Ok(kv) => kv,
                    Err(e) => {
                        ck.problem(match &last {
                            Some(k) => format!("cannot read the items after {}: {e}", show(k)),
                            None => format!("cannot read the items database: {e}"),
                        });
                        break;
                    }
                };
                last = Some(key.to_vec());
                sum.items += 1;
                let it = match item::decode(bytes) {
                    Ok(it) => it,
                    Err(e) => {
                        ck.problem(format!("item {}: {e}", show(key)));
                        continue;
                    }
                };
                max_unique = max_unique.max(it.meta.cas);
                if it.meta.expire_at != 0 {
                    let mut ix = it.meta.expire_at.to_be_bytes().to_vec();
                    ix.extend_from_slice(&key[..key.len().min(INDEX_KEY_MAX)]);
                    match store.expiry.get(txn, &ix) {
                        Ok(Some(_)) => {}
                        Ok(None) => ck.problem(format!(
                            "item {} expires at {} ms but has no expiry index entry: the sweep would never remove it",
                            show(key),
                            it.meta.expire_at
                        )),
                        Err(e) => ck.problem(format!(
                            "cannot read the expiry index for {}: {e}",
                            show(key)
                        )),
                    }
                }
                let kind = it.meta.kind;
                match kind {
                    Kind::String => {
                        sum.strings += 1;
                        if let Some((_, p)) = item::pointer_of(bytes) {
                            sum.separated += 1;
                            if crc32fast::hash(it.value) != p.crc {
                                ck.problem(format!(
                                    "item {}: its value in log segment {} (bytes {}..{}) does not match its checksum",
                                    show(key),
                                    wal::segment_name(p.segment),
                                    p.offset,
                                    p.offset + u64::from(p.len)
                                ));
                            }
                        }
                        continue;
                    }
                    Kind::List => sum.lists += 1,
                    Kind::Hash => sum.hashes += 1,
                    Kind::Set => sum.sets += 1,
                    Kind::ZSet => sum.zsets += 1,
                }
                let meta = match CollMeta::decode(it.value) {
                    Ok(m) => m,
                    Err(e) => {
                        ck.problem(format!("{} {}: {e}", kind.name(), show(key)));
                        continue;
                    }
                };
                max_unique = max_unique.max(meta.id);
                if kind == Kind::List && meta.tail - meta.head != meta.len as i64 {
                    ck.problem(format!(
                        "list {}: metadata counts {} elements but spans positions {}..{}",
                        show(key),
                        meta.len,
                        meta.head,
                        meta.tail
                    ));
                }
                if let Some(other) = colls.get(&meta.id) {
                    ck.problem(format!(
                        "{} and {} share collection id {}",
                        show(&other.key),
                        show(key),
                        meta.id
                    ));
                    continue;
                }
                colls.insert(
                    meta.id,
                    Coll {
                        key: key.to_vec(),
                        kind,
                        meta,
                        elems: 0,
                        scores: 0,
                    },
                );
            }
        }
    }
    if !colls.is_empty() && !colls_marked {
        ck.problem(
            "collections are stored but the meta record `colls` is missing: overwriting one would not reclaim its elements",
        );
    }
    if max_unique > cas_counter {
        ck.problem(format!(
            "the CAS counter ({cas_counter}) is behind a unique already handed out ({max_unique}): new CAS uniques would repeat"
        ));
    }

    // Deleted collections awaiting reclaim.
    let Ok(txn) = fresh_txn(store, ck) else {
        return;
    };
    let txn = &txn;
    let mut gc: HashSet<u64> = HashSet::new();
    match store.gc.iter(txn) {
        Err(e) => ck.problem(format!("cannot read the reclaim queue: {e}")),
        Ok(iter) => {
            for entry in iter {
                let key = match entry {
                    Ok((k, _)) => k,
                    Err(e) => {
                        ck.problem(format!("cannot read the reclaim queue: {e}"));
                        break;
                    }
                };
                let Ok(id) = <[u8; 8]>::try_from(key).map(u64::from_be_bytes) else {
                    ck.problem(format!("reclaim queue entry {} is not an id", show(key)));
                    continue;
                };
                sum.gc += 1;
                gc.insert(id);
                if let Some(c) = colls.get(&id) {
                    ck.problem(format!(
                        "collection id {id} is queued for reclaiming while {} {} still uses it: its elements would be deleted",
                        c.kind.name(),
                        show(&c.key)
                    ));
                }
            }
        }
    }

    // Elements.
    let Ok(txn) = fresh_txn(store, ck) else {
        return;
    };
    let txn = &txn;
    let mut orphans: HashMap<u64, u64> = HashMap::new();
    match store.elems.iter(txn) {
        Err(e) => ck.problem(format!("cannot read the elements: {e}")),
        Ok(iter) => {
            for entry in iter {
                let (key, value) = match entry {
                    Ok(kv) => kv,
                    Err(e) => {
                        ck.problem(format!("cannot read the elements: {e}"));
                        break;
                    }
                };
                let Some((id, sub)) = key.split_first_chunk::<8>() else {
                    ck.problem(format!(
                        "element record {} is shorter than an id",
                        show(key)
                    ));
                    continue;
                };
                let id = u64::from_be_bytes(*id);
                let Some(c) = colls.get_mut(&id) else {
                    if gc.contains(&id) {
                        sum.gc_elements += 1;
                    } else {
                        *orphans.entry(id).or_default() += 1;
                    }
                    continue;
                };
                c.elems += 1;
                sum.elements += 1;
                check_element(store, txn, ck, c, sub, value);
            }
        }
    }
    for (id, n) in &orphans {
        ck.problem(format!(
            "{n} element records of collection id {id} belong to no key and are not queued for reclaiming"
        ));
    }

    // The sorted sets' score index.
    let Ok(txn) = fresh_txn(store, ck) else {
        return;
    };
    let txn = &txn;
    let mut score_orphans: HashMap<u64, u64> = HashMap::new();
    let mut dir_owners: HashSet<u64> = HashSet::new();
    match store.zscore.iter(txn) {
        Err(e) => ck.problem(format!("cannot read the score index: {e}")),
        Ok(iter) => {
            for entry in iter {
                let key = match entry {
                    Ok((k, _)) => k,
                    Err(e) => {
                        ck.problem(format!("cannot read the score index: {e}"));
                        break;
                    }
                };
                if crate::types::zrank::is_directory(key) {
                    if let Some(id) = crate::types::zrank::directory_owner(key) {
                        dir_owners.insert(id);
                    }
                    continue;
                }
                if key.len() < 16 {
                    ck.problem(format!(
                        "score index record {} is shorter than an id and a score",
                        show(key)
                    ));
                    continue;
                }
                let id = u64::from_be_bytes(key[..8].try_into().unwrap_or([0; 8]));
                let sk = u64::from_be_bytes(key[8..16].try_into().unwrap_or([0; 8]));
                let member = &key[16..];
                match colls.get_mut(&id) {
                    Some(c) if c.kind == Kind::ZSet => {
                        c.scores += 1;
                        let mut ek = id.to_be_bytes().to_vec();
                        ek.extend_from_slice(member);
                        match store.elems.get(txn, &ek) {
                            Ok(Some(v)) if score_of(v).map(crate::types::zset::score_key) == Some(sk) => {}
                            Ok(Some(_)) => ck.problem(format!(
                                "sorted set {}: member {} is indexed under score {} but holds another",
                                show(&c.key),
                                show(member),
                                crate::types::zset::key_score(sk)
                            )),
                            Ok(None) => ck.problem(format!(
                                "sorted set {}: the score index names member {}, which is not stored",
                                show(&c.key),
                                show(member)
                            )),
                            Err(e) => ck.problem(format!(
                                "sorted set {}: cannot read member {}: {e}",
                                show(&c.key),
                                show(member)
                            )),
                        }
                    }
                    Some(c) => ck.problem(format!(
                        "{} {} has score index records",
                        c.kind.name(),
                        show(&c.key)
                    )),
                    None if gc.contains(&id) => sum.gc_elements += 1,
                    None => *score_orphans.entry(id).or_default() += 1,
                }
            }
        }
    }
    for (id, n) in &score_orphans {
        ck.problem(format!(
            "{n} score index records of collection id {id} belong to no key and are not queued for reclaiming"
        ));
    }
    let mut counted: Vec<&Coll> = colls.values().collect();
    counted.sort_by(|a, b| a.key.cmp(&b.key));
    for c in counted {
        if c.elems != c.meta.len {
            ck.problem(format!(
                "{} {}: metadata counts {} elements, {} are stored",
                c.kind.name(),
                show(&c.key),
                c.meta.len,
                c.elems
            ));
        }
        if c.kind == Kind::ZSet && c.scores != c.meta.len {
            ck.problem(format!(
                "sorted set {}: metadata counts {} members, the score index holds {}",
                show(&c.key),
                c.meta.len,
                c.scores
            ));
        }
        if c.kind == Kind::ZSet && c.meta.head == crate::types::zrank::RANKED {
            match crate::types::zrank::verify(&store.zscore, txn, c.meta.id, c.meta.len) {
                Ok(found) => {
                    for p in found {
                        ck.problem(format!("sorted set {}: {p}", show(&c.key)));
                    }
                }
                Err(e) => ck.problem(format!(
                    "sorted set {}: cannot read its rank directory: {e}",
                    show(&c.key)
                )),
            }
        }
    }
    let mut stray: Vec<u64> = dir_owners
        .into_iter()
        .filter(|id| {
            !gc.contains(id)
                && !colls.get(id).is_some_and(|c| {
                    c.kind == Kind::ZSet && c.meta.head == crate::types::zrank::RANKED
                })
        })
        .collect();
    stray.sort_unstable();
    for id in stray {
        ck.problem(format!(
            "rank directory records of collection id {id} belong to no sorted set that keeps one"
        ));
    }

    // The expiry index.
    let Ok(txn) = fresh_txn(store, ck) else {
        return;
    };
    let txn = &txn;
    match store.expiry.iter(txn) {
        Err(e) => ck.problem(format!("cannot read the expiry index: {e}")),
        Ok(iter) => {
            for entry in iter {
                let key = match entry {
                    Ok((k, _)) => k,
                    Err(e) => {
                        ck.problem(format!("cannot read the expiry index: {e}"));
                        break;
                    }
                };
                let Some((t, prefix)) = key.split_first_chunk::<8>() else {
                    ck.problem(format!(
                        "expiry index entry {} is shorter than a time",
                        show(key)
                    ));
                    continue;
                };
                sum.expiry += 1;
                let t = u64::from_be_bytes(*t);
                let expires_then =
                    |bytes: &[u8]| item::decode(bytes).is_ok_and(|i| i.meta.expire_at == t);
                let live = if prefix.len() < INDEX_KEY_MAX {
                    match store.items.get(txn, prefix) {
                        Ok(found) => found.is_some_and(expires_then),
                        Err(e) => {
                            ck.problem(format!(
                                "cannot read item {} named by the expiry index: {e}",
                                show(prefix)
                            ));
                            continue;
                        }
                    }
                } else {
                    // An entry for keys too long for the index stands for every key it prefixes.
                    match store.items.prefix_iter(txn, prefix) {
                        Ok(mut it) => it.any(|r| r.is_ok_and(|(_, v)| expires_then(v))),
                        Err(e) => {
                            ck.problem(format!(
                                "cannot read items under {} named by the expiry index: {e}",
                                show(prefix)
                            ));
                            continue;
                        }
                    }
                };
                if !live {
                    sum.stale_expiry += 1;
                }
            }
        }
    }
}

/// A new read transaction on the recovered store (Err: reported).
fn fresh_txn<'s>(
    store: &'s LmdbStore,
    ck: &mut Checker<'_>,
) -> Result<crate::storage::lmdb::Reader<'s>, ()> {
    store.read_txn().map_err(|e| {
        ck.problem(format!("cannot read the recovered store: {e}"));
    })
}

/// A sorted-set element's score (its value: the f64's bits, big-endian).
fn score_of(v: &[u8]) -> Option<f64> {
    let b: [u8; 8] = v.try_into().ok()?;
    let d = f64::from_bits(u64::from_be_bytes(b));
    (!d.is_nan()).then_some(d)
}

/// Checks one element record of collection `c` (sub-key `sub`, value `value`).
fn check_element(
    store: &LmdbStore,
    txn: &heed::RoTxn<'_>,
    ck: &mut Checker<'_>,
    c: &Coll,
    sub: &[u8],
    value: &[u8],
) {
    match c.kind {
        Kind::List => match <[u8; 8]>::try_from(sub) {
            Ok(p) => {
                let seq = (u64::from_be_bytes(p) ^ (1 << 63)) as i64;
                if seq < c.meta.head || seq >= c.meta.tail {
                    ck.problem(format!(
                        "list {}: an element at position {seq}, outside {}..{}",
                        show(&c.key),
                        c.meta.head,
                        c.meta.tail
                    ));
                }
            }
            Err(_) => ck.problem(format!(
                "list {}: an element whose position is {} bytes, not 8",
                show(&c.key),
                sub.len()
            )),
        },
        Kind::Set if !value.is_empty() => ck.problem(format!(
            "set {}: member {} has a value",
            show(&c.key),
            show(sub)
        )),
        Kind::ZSet => match score_of(value) {
            None => ck.problem(format!(
                "sorted set {}: member {} has no valid score",
                show(&c.key),
                show(sub)
            )),
            Some(score) => {
                let mut ix = c.meta.id.to_be_bytes().to_vec();
                ix.extend_from_slice(&crate::types::zset::score_key(score).to_be_bytes());
                ix.extend_from_slice(sub);
                match store.zscore.get(txn, &ix) {
                    Ok(Some(_)) => {}
                    Ok(None) => ck.problem(format!(
                        "sorted set {}: member {} (score {score}) is missing from the score index",
                        show(&c.key),
                        show(sub)
                    )),
                    Err(e) => ck.problem(format!(
                        "sorted set {}: cannot read the score index: {e}",
                        show(&c.key)
                    )),
                }
            }
        },
        Kind::Set | Kind::Hash | Kind::String => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::durable::{self, Durable};

    const MAP: u64 = 1 << 26;

    /// Commits one batch of puts the way the writer does: log append, LMDB commit, log sync.
    fn batch(d: &mut Durable, puts: &[(&[u8], &[u8])]) {
        let store = d.store.clone();
        let mut txn = store.write_txn().expect("txn");
        for (k, v) in puts {
            store.items.put(&mut txn, k, v).expect("put");
        }
        let (txn, mut log) = txn.into_parts();
        d.wal.append(&mut log).expect("append");
        txn.commit().expect("commit");
        d.wal.sync().expect("sync");
    }

    /// A store whose log holds two batches of string items after its first checkpoint; the
    /// path of that log segment.
    fn store_with_log(dir: &Path) -> PathBuf {
        let mut d = durable::open(dir, MAP, 16).expect("open");
        let item = |v: &[u8]| {
            let (h, n) = crate::storage::ItemMeta::string(1).header();
            let mut b = h[..n].to_vec();
            b.extend_from_slice(v);
            b
        };
        batch(&mut d, &[(b"a", &item(b"1"))]);
        batch(&mut d, &[(b"b", &item(b"2"))]);
        let seg = dir.join(wal::segment_name(d.wal.segment()));
        // The CAS counter must cover the uniques handed out.
        let store = d.store.clone();
        let mut txn = store.write_txn().expect("txn");
        store.put_cas(&mut txn, 1).expect("cas");
        let (txn, mut log) = txn.into_parts();
        d.wal.append(&mut log).expect("append");
        txn.commit().expect("commit");
        d.wal.sync().expect("sync");
        seg
    }

    fn run_check(dir: &Path) -> (Verdict, String) {
        let mut out = Vec::new();
        let v = check(dir, MAP, &mut out).expect("checkable");
        (v, String::from_utf8_lossy(&out).into_owned())
    }

    /// A batch header and payload with a valid checksum in segment file `seg` (numbered 1).
    fn raw_batch(seg: &Path, seq: u64, payload: &[u8]) -> Vec<u8> {
        let format = SegmentReader::open(seg, 1, None).expect("open").format;
        wal::raw_batch(format, seq, payload)
    }

    #[test]
    fn a_torn_log_tail_is_reported_but_is_not_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let seg = store_with_log(dir.path());
        let mut bytes = std::fs::read(&seg).expect("read");
        bytes.extend_from_slice(&raw_batch(&seg, 4, b"\x01\x00")[..15]);
        std::fs::write(&seg, &bytes).expect("write");
        let (v, out) = run_check(dir.path());
        assert_eq!(v, Verdict::Healthy, "{out}");
        assert!(out.contains("3 batches"), "{out}");
        assert!(out.contains("torn batch header"), "{out}");
        assert!(out.contains("2 items (2 strings"), "{out}");
        // Nothing of the store was changed: the torn tail is still there.
        assert_eq!(std::fs::read(&seg).expect("read"), bytes);
    }

    #[test]
    fn a_batch_that_passes_its_checksum_but_does_not_parse_is_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let seg = store_with_log(dir.path());
        let mut bytes = std::fs::read(&seg).expect("read");
        // An opcode no record has.
        bytes.extend_from_slice(&raw_batch(&seg, 4, b"\x09\x00\x00"));
        std::fs::write(&seg, &bytes).expect("write");
        let (v, out) = run_check(dir.path());
        assert_eq!(v, Verdict::Damaged, "{out}");
        assert!(
            out.lines().any(|l| l.starts_with("problem: ")
                && l.contains("batch 4")
                && l.contains("does not parse")),
            "{out}"
        );
        // The store up to the batch before was still checked.
        assert!(out.contains("2 items (2 strings"), "{out}");
        assert!(out.contains("1 problem found"), "{out}");
    }

    /// Takes a checkpoint and waits for it and for the spare the checkpointer prepares after.
    fn checkpoint(d: &mut Durable) {
        let settled = |d: &Durable| {
            let s = &d.checkpointer.stats;
            !d.checkpointer.busy()
                && s.spare_rounds.load(std::sync::atomic::Ordering::Acquire)
                    >= 1 + s.count.load(std::sync::atomic::Ordering::Acquire)
                        + s.failures.load(std::sync::atomic::Ordering::Acquire)
        };
        let wait = |d: &Durable| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !settled(d) {
                assert!(std::time::Instant::now() < deadline, "checkpointer stuck");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        wait(d);
        let store = d.store.clone();
        d.checkpointer.begin(&store, &mut d.wal).expect("begin");
        wait(d);
    }

    #[test]
    fn a_recycled_segment_whose_batches_end_before_its_file_is_no_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let item = |v: &[u8]| {
            let (h, n) = crate::storage::ItemMeta::string(1).header();
            let mut b = h[..n].to_vec();
            b.extend_from_slice(v);
            b
        };
        {
            let mut d = durable::open(dir.path(), MAP, 16).expect("open");
            batch(&mut d, &[(b"a", &item(b"1"))]);
            checkpoint(&mut d);
            batch(&mut d, &[(b"b", &item(b"2"))]);
            checkpoint(&mut d);
            // Segment 3 is segment 1's file again: its old batch lies after the new one.
            assert_eq!(d.wal.segment(), 3);
            batch(&mut d, &[(b"c", &item(b"3"))]);
            // A rotation whose checkpoint never got written (a crash in the middle of one).
            d.wal.rotate().expect("rotate");
            batch(&mut d, &[(b"d", &item(b"4"))]);
            let store = d.store.clone();
            let mut txn = store.write_txn().expect("txn");
            store.put_cas(&mut txn, 1).expect("cas");
            let (txn, mut log) = txn.into_parts();
            d.wal.append(&mut log).expect("append");
            txn.commit().expect("commit");
            d.wal.sync().expect("sync");
        }
        let (v, out) = run_check(dir.path());
        assert_eq!(v, Verdict::Healthy, "{out}");
        assert!(out.contains("wal-0000000000000003.log: 1 batches"), "{out}");
        assert!(out.contains("wal-0000000000000004.log: 2 batches"), "{out}");
        assert!(!out.contains("torn tail"), "{out}");
        assert!(out.contains("4 items (4 strings"), "{out}");
    }

    #[test]
    fn an_expiring_item_without_its_index_entry_and_a_stale_entry_are_told_apart() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let d = durable::open(dir.path(), MAP, 16).expect("open");
            let store = d.store.clone();
            let mut txn = store.write_txn().expect("txn");
            let mut cas = 0;
            let mut w = store.writer(&mut txn, &mut cas);
            use crate::storage::WriteView;
            let c = w.next_cas();
            let meta = crate::storage::ItemMeta::new(Kind::String, 0, 5_000, c);
            w.put(b"kept", &meta, &[b"v"]).expect("put");
            let c = w.next_cas();
            let meta = crate::storage::ItemMeta::new(Kind::String, 0, 9_000, c);
            w.put(b"moved", &meta, &[b"v"]).expect("put");
            // The item's expiry moves: its first index entry is stale.
            let meta = crate::storage::ItemMeta::new(Kind::String, 0, 10_000, c);
            w.put(b"moved", &meta, &[b"v"]).expect("put");
            store.put_cas(&mut txn, cas).expect("cas");
            // And one entry goes missing, as no code path of memkeep's would do.
            let mut ix = 5_000u64.to_be_bytes().to_vec();
            ix.extend_from_slice(b"kept");
            store.expiry.delete(&mut txn, &ix).expect("delete");
            txn.commit_unlogged().expect("commit");
        }
        // The writes went unlogged: make the checkpoint describe the store as it is now.
        std::fs::remove_file(dir.path().join(wal::CHECKPOINT_FILE)).expect("rm");
        for (_, p) in wal::segments(dir.path()).expect("list") {
            std::fs::remove_file(p).expect("rm");
        }
        let (v, out) = run_check(dir.path());
        assert_eq!(v, Verdict::Damaged, "{out}");
        assert!(
            out.contains("problem: item \"kept\" expires at 5000 ms but has no expiry index entry"),
            "{out}"
        );
        assert!(out.contains("2 expiry entries (1 stale)"), "{out}");
        assert!(out.contains("1 problem found"), "{out}");
    }
}
