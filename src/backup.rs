//! Getting data in and out: consistent online backups, and a dump of `set` commands that any
//! memcached (memkeep, memcached, MemcacheDB) can replay.
//!
//! A backup is LMDB's compacting copy: it reads one snapshot inside a read transaction, so it is
//! consistent while writes go on, and it leaves out free pages (the only way to shrink a data
//! file). Restore by stopping memkeep and putting the copy's `data.mdb` in the data directory.
//!
//! The dump format is the memcached text protocol itself: one
//! `set <key> <flags> <exptime> <bytes>\r\n<data>\r\n` per item, with exptime 0 or an absolute
//! unix time. `memkeep import` sends it to a server and counts the `STORED` replies.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use heed::CompactionOption;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use log::{error, info};

use crate::storage::Kind;
use crate::storage::lmdb::LmdbStore;

/// The state of online backups, shared by every worker.
#[derive(Debug, Default)]
pub struct Backups {
    running: AtomicBool,
    /// Unix seconds of the last backup that completed (0: none yet).
    pub last_ok: AtomicU64,
}

impl Backups {
    /// Starts a background backup of `store` into `dir`; false if one is already running.
    pub fn start(self: &Arc<Self>, store: &LmdbStore, dir: &Path, now_s: u64) -> bool {
        if self.running.swap(true, Ordering::AcqRel) {
            return false;
        }
        let (me, store, dir) = (self.clone(), store.clone(), dir.to_path_buf());
        let spawned = std::thread::Builder::new()
            .name("memkeep-backup".into())
            .spawn(move || {
                match backup(&store, &dir, true) {
                    Ok(size) => {
                        info!(
                            "backup written to {} ({size} bytes)",
                            dir.join("data.mdb").display()
                        );
                        me.last_ok.store(now_s, Ordering::Release);
                    }
                    Err(e) => error!("{e}"),
                }
                me.running.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            error!("cannot start the backup thread: {e}");
            self.running.store(false, Ordering::Release);
            return false;
        }
        true
    }
}

/// Writes a consistent, compacted copy of the store to `dest/data.mdb` (replacing an older one
/// only when `replace`); returns its size. The copy appears under its name only when complete.
pub fn backup(store: &LmdbStore, dest: &Path, replace: bool) -> Result<u64, String> {
    std::fs::create_dir_all(dest).map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    let file = dest.join("data.mdb");
    if file.exists() && !replace {
        return Err(format!(
            "{} already exists: move it away first",
            file.display()
        ));
    }
    let tmp = dest.join("data.mdb.partial");
    let _ = std::fs::remove_file(&tmp);
    // Writes acknowledged but not yet committed to LMDB (served from the overlay) belong in
    // the copy: wait for the writer's next commit.
    if !store
        .overlay()
        .wait_committed(std::time::Duration::from_secs(10))
    {
        return Err("the writer did not commit to LMDB within 10 s; backup not taken".into());
    }
    let f = match store.vlog() {
        None => store
            .env()
            .copy_to_path(&tmp, CompactionOption::Enabled)
            .map_err(|e| format!("backup to {} failed: {e}", tmp.display()))?,
        Some(_) => copy_inline(store, &tmp)?,
    };
    f.sync_all()
        .map_err(|e| format!("cannot sync {}: {e}", tmp.display()))?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    drop(f);
    std::fs::rename(&tmp, &file).map_err(|e| format!("cannot rename {}: {e}", tmp.display()))?;
    Ok(size)
}

/// Writes to `tmp` a copy of one snapshot of `store` (which may hold values in its log,
/// `storage/vlog.rs`) with every value inline, as a store that never separated values: a
/// backup is one file, with no log beside it. Record by record (LMDB's own copy would keep the
/// pointers), each database in key order, so every page is filled whole as in a compacting
/// copy.
fn copy_inline(store: &LmdbStore, tmp: &Path) -> Result<std::fs::File, String> {
    use crate::storage::lmdb::{DB_ITEMS, DB_META, DB_NAMES, META_FORMAT, META_VLOG};
    use heed::types::Bytes;
    let work = tmp.with_extension("d");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let fail = |e: &dyn std::fmt::Display| format!("backup to {} failed: {e}", work.display());
    {
        let mut opts = heed::EnvOpenOptions::new().read_txn_without_tls();
        opts.map_size(store.env().info().map_size).max_dbs(8);
        // Safety: a new environment in a directory of our own, opened once.
        let env = unsafe { opts.open(&work) }.map_err(|e| fail(&e))?;
        let rtxn = store.read_txn().map_err(|e| fail(&e))?;
        let mut w = env.write_txn().map_err(|e| fail(&e))?;
        for (name, id) in DB_NAMES {
            let db = env
                .create_database::<Bytes, Bytes>(&mut w, Some(name))
                .map_err(|e| fail(&e))?;
            let Some(table) = store.table(id) else {
                continue;
            };
            for kv in table.iter(&rtxn).map_err(|e| fail(&e))? {
                let (k, v) = kv.map_err(|e| fail(&e))?;
                let v = match (id, k) {
                    (DB_META, META_VLOG) => continue,
                    (DB_META, META_FORMAT) => {
                        std::borrow::Cow::Borrowed(&[crate::storage::item::FORMAT_VERSION][..])
                    }
                    (DB_ITEMS, _) => crate::storage::item::inline(v).map_err(|e| fail(&e))?,
                    _ => std::borrow::Cow::Borrowed(v),
                };
                db.put_with_flags(&mut w, heed::PutFlags::APPEND, k, &v)
                    .map_err(|e| fail(&e))?;
            }
        }
        w.commit().map_err(|e| fail(&e))?;
    }
    std::fs::rename(work.join("data.mdb"), tmp).map_err(|e| fail(&e))?;
    let _ = std::fs::remove_dir_all(&work);
    std::fs::File::open(tmp).map_err(|e| format!("cannot open {}: {e}", tmp.display()))
}

/// A consistent copy of a store a running server holds, in the new directory `tmp`, with
/// every batch the server's log holds applied (acknowledged writes the server has not yet
/// committed to LMDB included): what `memkeep backup` and `export` read beside a server.
pub fn live_copy(dir: &Path, tmp: &Path, map_size: u64) -> Result<LmdbStore, String> {
    use crate::storage::{durable, wal};
    for _ in 0..5 {
        let c = wal::read_checkpoint(dir)?
            .ok_or_else(|| format!("{} has no checkpoint record", dir.display()))?;
        let _ = std::fs::remove_dir_all(tmp);
        std::fs::create_dir_all(tmp)
            .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        {
            let (live, _) = LmdbStore::open(dir, map_size, 126).map_err(|e| e.0)?;
            live.env()
                .copy_to_path(tmp.join("data.mdb"), CompactionOption::Enabled)
                .map_err(|e| format!("cannot copy {}: {e}", dir.display()))?;
        }
        let (copy, _) = LmdbStore::open(tmp, map_size, 126).map_err(|e| e.0)?;
        durable::replay_live(dir, &copy, &c)?;
        if wal::read_checkpoint(dir)?.as_ref() == Some(&c) {
            return Ok(copy);
        }
        // A checkpoint ran meanwhile and may have recycled a segment being read: again.
    }
    Err(format!(
        "{} kept checkpointing while it was copied; try again",
        dir.display()
    ))
}

/// Writes every live string item as a `set` command; returns (items written, collections
/// skipped: lists, hashes, sets and sorted sets have no memcached form).
pub fn export(store: &LmdbStore, now_ms: u64, out: &mut dyn Write) -> Result<(u64, u64), String> {
    let txn = store.read_txn().map_err(|e| e.to_string())?;
    let iter = store.items().iter(&txn).map_err(|e| e.to_string())?;
    let (mut written, mut skipped) = (0, 0);
    for entry in iter {
        let (key, bytes) = entry.map_err(|e| e.to_string())?;
        let item = crate::storage::item::decode(bytes).map_err(|e| e.to_string())?;
        if item.meta.is_expired(now_ms) {
            continue;
        }
        if item.meta.kind != Kind::String {
            skipped += 1;
            continue;
        }
        let exptime = item.meta.expire_at.div_ceil(1000);
        write!(out, "set ",).map_err(|e| e.to_string())?;
        out.write_all(key).map_err(|e| e.to_string())?;
        write!(
            out,
            " {} {} {}\r\n",
            item.meta.flags,
            exptime,
            item.value.len()
        )
        .map_err(|e| e.to_string())?;
        out.write_all(item.value).map_err(|e| e.to_string())?;
        out.write_all(b"\r\n").map_err(|e| e.to_string())?;
        written += 1;
    }
    out.flush().map_err(|e| e.to_string())?;
    Ok((written, skipped))
}

/// Sends a dump of `set` commands to the server at `addr`, reading every reply; returns
/// (stored, refused). Stops at the first reply that is neither STORED nor NOT_STORED.
pub fn import(addr: &str, dump: &mut dyn Read) -> Result<(u64, u64), String> {
    let stream = TcpStream::connect(addr).map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let mut replies = BufReader::new(stream);
    let mut input = BufReader::new(dump);
    let (mut stored, mut refused) = (0, 0);
    let mut line = Vec::new();
    loop {
        line.clear();
        if input
            .read_until(b'\n', &mut line)
            .map_err(|e| e.to_string())?
            == 0
        {
            break;
        }
        let text = String::from_utf8_lossy(&line);
        let words: Vec<&str> = text.split_whitespace().collect();
        let bytes: usize = match words.as_slice() {
            ["set", _, _, _, n] => n
                .parse()
                .map_err(|_| format!("bad dump line: {}", text.trim_end()))?,
            [] => continue,
            _ => {
                return Err(format!(
                    "bad dump line (expected `set <key> <flags> <exptime> <bytes>`): {}",
                    text.trim_end()
                ));
            }
        };
        // One write per item: the command line and its data block together.
        let head = line.len();
        line.resize(head + bytes + 2, 0);
        input
            .read_exact(&mut line[head..])
            .map_err(|e| format!("dump ends inside a value: {e}"))?;
        writer.write_all(&line).map_err(|e| e.to_string())?;
        let mut reply = String::new();
        replies
            .read_line(&mut reply)
            .map_err(|e| format!("no reply from {addr}: {e}"))?;
        match reply.trim_end() {
            "STORED" => stored += 1,
            "NOT_STORED" => refused += 1,
            other => {
                return Err(format!(
                    "the server answered `{other}` after {stored} items"
                ));
            }
        }
    }
    Ok((stored, refused))
}
