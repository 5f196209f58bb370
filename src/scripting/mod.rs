//! Lua scripting: EVAL, EVALSHA, EVAL_RO, EVALSHA_RO and SCRIPT, as Redis 7.0 runs them.
//!
//! A script is a transaction whose next command depends on the previous reply, so it runs
//! where the transaction is: inside the batch's one LMDB write transaction (`WriteOp::Script`,
//! which the writer runs through `command::TxnScript`), on whichever thread commits the batch:
//! the worker's own when it leads (no hand-off to the writer thread and back, which cost a
//! one-line EVAL more than the script itself), else the writer thread. A leader never keeps a
//! script that could not be undone or that holds its worker's clients: one that runs past
//! `LEAD_MS`, or calls PUBLISH, stops and fails its batch with `command::MOVED`; the batch is
//! rolled back and requeued, and the writer thread runs the script again from the start (so
//! BUSY and SCRIPT KILL reach every long script from every client, as before). Each
//! `redis.call` is parsed by the command layer (`commands::write_op` for writes, a
//! `commands::QueuedRead` for reads, which sees the script's writes before it) and applied at
//! once; its reply is encoded as RESP and converted to Lua values as Redis converts them. The
//! script's reply goes out once the batch is durable, as any write's. Read-only scripts
//! (EVAL_RO, EVALSHA_RO) run the same way, for simplicity: they only refuse writes.
//!
//! A script that errors after writing keeps its writes (Redis 7); a failure of the store
//! fails the whole batch. The Lua VM (Lua 5.1, from `mlua`) is one per thread that runs
//! scripts (the writer, and each worker that leads one), kept across scripts as Redis keeps
//! its one; its globals are read-only, so which VM runs a script does not show. Only one
//! script runs at a time (the writer's lock). The script cache is in
//! memory only (after a restart EVALSHA answers NOSCRIPT, as Redis does).
//!
//! The libraries: `string`, `table`, `math` (Lua's), `bit` (ours, `bitlib`), `cjson`
//! (encode/decode through serde_json), `cmsgpack` (`cmsgpack`: MessagePack through the `rmp`
//! crate, Lua glue ours) and `struct` (`structlib`: ours). The last three raise their errors as
//! Lua's C libraries do (`libs`): text with the caller's line in front, a string to `pcall`.
//! Commands called from a script are checked against the caller's ACL permissions (`Permit`).
//!
//! Time limit: a script running past `lua_time_limit` ms sets `Scripts::busy`; workers then
//! answer other clients `-BUSY`; `SCRIPT KILL` sets a flag that a Lua hook checks (only while
//! the script has not written: else `-UNKILLABLE`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mlua::{Lua, LuaOptions, StdLib, Value, ffi};
use sha1::{Digest, Sha1};

use crate::command::{MOVED, Outcome, REPLY_MAX, ScriptOp, ScriptTxn, TxnScript, WriteOp};
use crate::commands::{Args, Cmd, OwnedArgs, QueuedRead, ScanCursors, lookup, reads_store};
use crate::protocol::resp::enc;
use crate::storage::StoreError;

mod bitlib;
mod cmsgpack;
mod convert;
mod libs;
mod structlib;

/// The caller's ACL check for each command a script calls (None: the caller may run anything).
/// Err is the ACL's refusal (`NOPERM ...`).
pub type Permit = Arc<dyn Fn(&crate::commands::Spec, &[&[u8]]) -> Result<(), String> + Send + Sync>;

/// PUBLISH for scripts: delivers a message on a channel, answering the receivers (the server's
/// pub/sub registry, which sits above this layer).
pub type Publish = Arc<dyn Fn(&[u8], &[u8]) -> usize + Send + Sync>;

/// The server commands a script may call whose answer needs the server's state (INFO,
/// LASTSAVE, PUBSUB): writes the reply, with the script's protocol (`true` for RESP3). The
/// pair is the keys and the keys with a TTL as the script's transaction sees them (INFO's
/// keyspace section).
pub type ServerRead = Arc<dyn Fn(Cmd, Args<'_>, &mut Vec<u8>, bool, (u64, u64)) + Send + Sync>;

/// How much memory the Lua VM may hold.
const LUA_MEMORY: usize = 256 << 20;

/// How long a leader runs a script before moving it to the writer thread, in ms.
const LEAD_MS: u64 = 20;

pub const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";
pub const BUSY: &str =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";
const UNKILLABLE: &str = "UNKILLABLE Sorry the script already executed write commands against the dataset. You can either wait the script termination or kill the server in a hard way using the SHUTDOWN NOSAVE command.";
const NOTBUSY: &str = "NOTBUSY No scripts in execution right now.";

/// The script cache and the state of the running script, shared by the workers and the writer.
#[derive(Default)]
pub struct Scripts {
    bodies: Mutex<Cache>,
    /// Bumped by SCRIPT FLUSH: the VM drops its compiled functions.
    generation: AtomicU64,
    /// A script is running (set by the writer for each script).
    running: AtomicBool,
    /// When it started, in ms since `epoch`.
    started_ms: AtomicU64,
    /// It has run past the time limit: other clients get BUSY.
    busy: AtomicBool,
    /// SCRIPT KILL asked for it to stop.
    kill: AtomicBool,
    /// It has written (it cannot be killed).
    wrote: AtomicBool,
    /// `lua_time_limit` in ms (0: no limit).
    pub time_limit_ms: AtomicU64,
    /// PUBLISH from scripts (None: answered as not allowed).
    publisher: std::sync::OnceLock<Publish>,
    /// INFO, LASTSAVE, PUBSUB from scripts (None: answered as not allowed).
    server_read: std::sync::OnceLock<ServerRead>,
}

/// The script cache: bodies by SHA-1, and the SHA-1 of each body, so that an EVAL of a cached
/// script finds its name by one hash lookup of the body instead of a SHA-1 of it (a tenth of
/// a one-line EVAL's time on the worker).
#[derive(Default)]
struct Cache {
    by_sha: HashMap<Arc<str>, Arc<Script>>,
    by_body: HashMap<Arc<[u8]>, Arc<Script>>,
}

/// A cached script.
#[derive(Debug)]
struct Script {
    sha: Arc<str>,
    body: Arc<[u8]>,
    /// It has moved from a leader to the writer thread (it ran long, or publishes): it runs
    /// there from now on, so leaders' batches are not rolled back for it again and again.
    writer_only: AtomicBool,
}

impl Script {
    fn new(body: &[u8]) -> Arc<Script> {
        Arc::new(Script {
            sha: sha1hex(body).into(),
            body: body.into(),
            writer_only: AtomicBool::new(false),
        })
    }
}

impl Cache {
    /// The cached script of `body`, caching it if new.
    fn load(&mut self, body: &[u8]) -> Arc<Script> {
        if let Some(script) = self.by_body.get(body) {
            return script.clone();
        }
        let script = Script::new(body);
        self.by_sha.insert(script.sha.clone(), script.clone());
        self.by_body.insert(script.body.clone(), script.clone());
        script
    }

    fn clear(&mut self) {
        self.by_sha.clear();
        self.by_body.clear();
    }
}

/// The SHA-1 of a script body in lowercase hex.
pub fn sha1hex(body: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let d = Sha1::digest(body);
    let mut s = String::with_capacity(40);
    for b in d {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

impl std::fmt::Debug for Scripts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scripts")
            .field("running", &self.running)
            .field("busy", &self.busy)
            .finish()
    }
}

impl Scripts {
    /// Where INFO, LASTSAVE and PUBSUB from scripts are answered (set once, at start).
    pub fn set_server_read(&self, r: ServerRead) {
        if self.server_read.set(r).is_err() {
            log::debug!("the scripts' server reads were set already");
        }
    }

    /// Where PUBLISH from scripts goes (set once, at start).
    pub fn set_publisher(&self, p: Publish) {
        if self.publisher.set(p).is_err() {
            log::debug!("the scripts' publisher was set already");
        }
    }

    pub fn new(time_limit_ms: u64) -> Scripts {
        let s = Scripts::default();
        s.time_limit_ms.store(time_limit_ms, Ordering::Relaxed);
        s
    }

    /// Other clients must be answered BUSY.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }

    pub fn load(&self, body: &[u8]) -> String {
        self.load_body(body).sha.to_string()
    }

    /// Caches `body` (one lock).
    fn load_body(&self, body: &[u8]) -> Arc<Script> {
        match self.bodies.lock() {
            Ok(mut m) => m.load(body),
            Err(_) => Script::new(body),
        }
    }

    /// The cached script named `sha` (any case).
    fn get(&self, sha: &[u8]) -> Option<Arc<Script>> {
        let sha = std::str::from_utf8(sha).ok()?.to_ascii_lowercase();
        self.bodies.lock().ok()?.by_sha.get(sha.as_str()).cloned()
    }

    /// SCRIPT LOAD|EXISTS|FLUSH|KILL|HELP (the arity is checked by the caller).
    pub fn script_cmd(&self, args: Args<'_>, out: &mut Vec<u8>) {
        if args.is(1, "load") {
            let sha = self.load(args.get(2));
            enc::bulk(out, sha.as_bytes());
        } else if args.is(1, "exists") {
            let m = self.bodies.lock().ok();
            enc::array(out, args.len() - 2);
            for i in 2..args.len() {
                let sha = String::from_utf8_lossy(args.get(i)).to_ascii_lowercase();
                let found = m
                    .as_ref()
                    .is_some_and(|m| m.by_sha.contains_key(sha.as_str()));
                enc::int(out, found as i64);
            }
        } else if args.is(1, "flush") {
            if args.len() > 3 || (args.len() == 3 && !args.is(2, "sync") && !args.is(2, "async")) {
                return enc::error(out, "ERR SCRIPT FLUSH only support SYNC|ASYNC option");
            }
            if let Ok(mut m) = self.bodies.lock() {
                m.clear();
            }
            self.generation.fetch_add(1, Ordering::Relaxed);
            enc::ok(out);
        } else if args.is(1, "kill") {
            if !self.running.load(Ordering::Relaxed) {
                enc::error(out, NOTBUSY)
            } else if self.wrote.load(Ordering::Relaxed) {
                enc::error(out, UNKILLABLE)
            } else {
                self.kill.store(true, Ordering::Relaxed);
                enc::ok(out)
            }
        } else {
            enc::array(out, 5);
            for line in [
                "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "LOAD <script>",
                "EXISTS <sha1> [<sha1> ...]",
                "FLUSH [ASYNC|SYNC]",
                "KILL",
            ] {
                enc::simple(out, line);
            }
        }
    }

    /// EVAL, EVALSHA, EVAL_RO, EVALSHA_RO: the write that runs the script, or the error reply.
    pub fn eval_op(
        self: &Arc<Self>,
        cmd: Cmd,
        args: Args<'_>,
        v3: bool,
        max_bulk: usize,
        cursors: Arc<Mutex<ScanCursors>>,
        permit: Option<Permit>,
    ) -> Result<WriteOp, String> {
        let by_sha = matches!(cmd, Cmd::EvalSha | Cmd::EvalShaRo);
        let read_only = matches!(cmd, Cmd::EvalRo | Cmd::EvalShaRo);
        let numkeys = std::str::from_utf8(args.get(2))
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| crate::commands::NOT_INTEGER.to_string())?;
        if numkeys < 0 {
            return Err("ERR Number of keys can't be negative".into());
        }
        if numkeys as usize > args.len() - 3 {
            return Err("ERR Number of keys can't be greater than number of args".into());
        }
        let script = if by_sha {
            self.get(args.get(1)).ok_or_else(|| NOSCRIPT.to_string())?
        } else {
            // EVAL caches its script, as Redis does.
            self.load_body(args.get(1))
        };
        // KEYS then ARGV, in one buffer (two allocations, whatever their number).
        let words = Words::new(args, 3);
        let run = ScriptRun {
            scripts: self.clone(),
            script,
            nkeys: numkeys as usize,
            words,
            read_only,
            v3,
            max_bulk,
            cursors,
            permit,
        };
        Ok(WriteOp::Script(Box::new(ScriptOp { run: Arc::new(run) })))
    }
}

/// Arguments of a request from one index on, copied into one buffer.
struct Words {
    buf: Vec<u8>,
    ranges: Vec<std::ops::Range<usize>>,
}

impl Words {
    fn new(args: Args<'_>, from: usize) -> Words {
        let n = args.len().saturating_sub(from);
        let size = (from..args.len()).map(|i| args.get(i).len()).sum();
        let mut w = Words {
            buf: Vec::with_capacity(size),
            ranges: Vec::with_capacity(n),
        };
        for i in from..args.len() {
            let a = args.get(i);
            w.ranges.push(w.buf.len()..w.buf.len() + a.len());
            w.buf.extend_from_slice(a);
        }
        w
    }

    /// Words `range` (by index) as byte slices.
    fn slices(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = &[u8]> {
        self.ranges[range].iter().map(|r| &self.buf[r.clone()])
    }
}

/// One script call, for the writer.
struct ScriptRun {
    scripts: Arc<Scripts>,
    script: Arc<Script>,
    /// How many of `words` are KEYS (the rest are ARGV).
    nkeys: usize,
    words: Words,
    read_only: bool,
    /// The caller's protocol: the script's reply is encoded in it.
    v3: bool,
    max_bulk: usize,
    cursors: Arc<Mutex<ScanCursors>>,
    permit: Option<Permit>,
}

impl std::fmt::Debug for ScriptRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptRun")
            .field("sha", &self.script.sha)
            .field("keys", &self.nkeys)
            .field("argv", &(self.words.ranges.len() - self.nkeys))
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// The writer thread's Lua VM and the scripts compiled in it.
struct Vm {
    lua: Lua,
    funcs: HashMap<Arc<str>, mlua::Function>,
    /// The last script run, and its function.
    last: Option<(Arc<str>, mlua::Function)>,
    generation: u64,
    /// The names "KEYS" and "ARGV", made once.
    names: [mlua::LuaString; 2],
}

thread_local! {
    static VM: RefCell<Option<Vm>> = const { RefCell::new(None) };
}

/// What the running script's callbacks share.
struct RunState<'a> {
    txn: RefCell<&'a mut dyn ScriptTxn>,
    resp3: Cell<bool>,
    /// The line of the last `redis.call` that failed (for the error's "on @user_script:N").
    err_line: Cell<usize>,
    /// A failure of the store: the batch fails.
    failed: RefCell<Option<StoreError>>,
    /// Run by a leader (not on the writer thread): it may be moved there.
    leader: bool,
    /// It is being moved: it stops, and its batch goes to the writer thread undone.
    moved: Cell<bool>,
}

/// Runs `f`, which makes Lua values from Rust, with the VM's memory limit lifted. With a limit
/// set, `mlua` makes every string and table in protected mode (a C closure each time), which
/// cost a fifth of a short script's time on the writer thread; what `f` makes is bounded by the arguments or by
/// `REPLY_MAX`, and the limit is back before any Lua code allocates again (a script past it
/// then fails at its next allocation, as before).
fn unbounded<R>(lua: &Lua, f: impl FnOnce() -> mlua::Result<R>) -> mlua::Result<R> {
    if let Err(e) = lua.set_memory_limit(0) {
        log::debug!("Lua memory limit not lifted: {e}");
    }
    let r = f();
    if let Err(e) = lua.set_memory_limit(LUA_MEMORY) {
        log::warn!("Lua memory limit not restored: {e}");
    }
    r
}

/// The script running on this thread, for the `redis.call`, `redis.pcall` and `redis.setresp`
/// callbacks, which are made once per VM and so cannot borrow the run.
struct Current<'a> {
    run: &'a ScriptRun,
    state: &'a RunState<'a>,
}

thread_local! {
    /// Points at the `Current` of the script this thread runs, null between scripts.
    static CURRENT: Cell<*const Current<'static>> = const { Cell::new(std::ptr::null()) };
}

/// Sets `CURRENT` for a script's run and clears it when dropped (on an unwind too).
struct Running {
    prev: *const Current<'static>,
}

impl Running {
    fn enter(cur: &Current<'_>) -> Running {
        let p = std::ptr::from_ref(cur).cast::<Current<'static>>();
        Running {
            prev: CURRENT.with(|c| c.replace(p)),
        }
    }

    /// Runs `f` with the running script; an error if none runs (a function kept from an
    /// earlier script and called outside one, which Lua code cannot do: it runs only inside
    /// `run_in`).
    fn with<R>(f: impl FnOnce(&ScriptRun, &RunState<'_>) -> mlua::Result<R>) -> mlua::Result<R> {
        let p = CURRENT.with(Cell::get);
        if p.is_null() {
            return Err(mlua::Error::RuntimeError(
                "ERR redis.call outside a script".into(),
            ));
        }
        // SAFETY: `p` was set by `Running::enter` from a `Current` that lives on `run_in`'s
        // stack for as long as the `Running` guard does, and the guard restores the previous
        // value when dropped, so a non-null `CURRENT` always points at a live `Current`. The
        // pointer is thread-local, and the VM that calls us is this thread's, so nothing else
        // reads it. The reference does not leave this call.
        let cur = unsafe { &*p };
        f(cur.run, cur.state)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.prev));
    }
}

impl TxnScript for ScriptRun {
    fn leads(&self) -> bool {
        !self.script.writer_only.load(Ordering::Relaxed)
    }

    fn run(&self, txn: &mut dyn ScriptTxn) -> Result<Outcome, StoreError> {
        let s = &self.scripts;
        s.kill.store(false, Ordering::Relaxed);
        s.wrote.store(false, Ordering::Relaxed);
        s.started_ms.store(now_ms(), Ordering::Relaxed);
        s.running.store(true, Ordering::Release);
        let r = VM.with(|vm| {
            let mut vm = vm.borrow_mut();
            if vm.is_none() {
                match new_vm(s.clone()) {
                    Ok(v) => *vm = Some(v),
                    Err(e) => {
                        log::error!("cannot start the Lua VM: {e}");
                        let mut out = Vec::new();
                        enc::error(&mut out, "ERR cannot start the Lua VM");
                        return Ok(Outcome::Reply(out));
                    }
                }
            }
            let Some(v) = vm.as_mut() else {
                return Ok(Outcome::Reply(b"-ERR no Lua VM\r\n".to_vec()));
            };
            let r = self.run_in(v, txn);
            // A script that filled the VM (up to its memory limit) leaves garbage the
            // incremental collector has not reached: without a full collection every later
            // script would fail to compile with "not enough memory". If even that does not
            // free it, the VM is made anew (compiled scripts recompile from the cache).
            if v.lua.used_memory() > LUA_MEMORY / 2 {
                if let Err(e) = v.lua.gc_collect() {
                    log::warn!("Lua garbage collection failed: {e}");
                }
                if v.lua.used_memory() > LUA_MEMORY / 2 {
                    log::warn!(
                        "the Lua VM holds {} bytes after a full collection: starting a new one",
                        v.lua.used_memory()
                    );
                    *vm = None;
                }
            }
            r
        });
        s.running.store(false, Ordering::Release);
        s.busy.store(false, Ordering::Relaxed);
        s.kill.store(false, Ordering::Relaxed);
        r
    }
}

fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl ScriptRun {
    fn run_in(&self, vm: &mut Vm, txn: &mut dyn ScriptTxn) -> Result<Outcome, StoreError> {
        let generation = self.scripts.generation.load(Ordering::Relaxed);
        if vm.generation != generation {
            vm.funcs.clear();
            vm.last = None;
            vm.generation = generation;
        }
        let mut out = Vec::new();
        let func = match &vm.last {
            // The script of the EVAL before (most often the same one): no lookup.
            Some((sha, f)) if Arc::ptr_eq(sha, &self.script.sha) || **sha == *self.script.sha => {
                f.clone()
            }
            _ => match vm.funcs.get(&self.script.sha) {
                Some(f) => f.clone(),
                None => match vm
                    .lua
                    .load(&self.script.body[..])
                    .set_name("@user_script")
                    .into_function()
                {
                    Ok(f) => {
                        vm.funcs.insert(self.script.sha.clone(), f.clone());
                        f
                    }
                    Err(e) => {
                        let msg = match &e {
                            mlua::Error::SyntaxError { message, .. } => message.clone(),
                            other => other.to_string(),
                        };
                        enc::error(
                            &mut out,
                            &format!("ERR Error compiling script (new function): {msg}"),
                        );
                        return Ok(Outcome::Reply(out));
                    }
                },
            },
        };
        vm.last = Some((self.script.sha.clone(), func.clone()));
        let lua = &vm.lua;
        let state = RunState {
            txn: RefCell::new(txn),
            resp3: Cell::new(false),
            err_line: Cell::new(0),
            failed: RefCell::new(None),
            leader: !crate::command::on_writer_thread(),
            moved: Cell::new(false),
        };
        let result = (|| -> mlua::Result<Vec<u8>> {
            let current = Current {
                run: self,
                state: &state,
            };
            let _running = Running::enter(&current);
            let r = self.call_protected(lua, &vm.names, &func);
            // Back in place whether or not the tables were made (a memory error there skips
            // the restore inside).
            if let Err(e) = lua.set_memory_limit(LUA_MEMORY) {
                log::warn!("Lua memory limit not restored: {e}");
            }
            let r: (bool, Value) = r?;
            let mut out = Vec::new();
            match r {
                (true, v) => convert::encode_reply(&mut out, &v, self.v3, state.resp3.get(), 0),
                (false, err) => self.error_reply(&mut out, &err, &state),
            }
            Ok(out)
        })();
        if state.moved.get() {
            // Whatever it answered: nothing it did is kept, the writer thread runs it again.
            self.script.writer_only.store(true, Ordering::Relaxed);
            return Err(StoreError::Backend(MOVED.into()));
        }
        if let Some(e) = state.failed.borrow_mut().take() {
            return Err(e);
        }
        match result {
            Ok(out) => Ok(Outcome::Reply(out)),
            Err(e) => {
                enc::error(
                    &mut out,
                    &format!(
                        "ERR Error running script {}: {}",
                        self.script.sha,
                        e.to_string().lines().next().unwrap_or("")
                    ),
                );
                Ok(Outcome::Reply(out))
            }
        }
    }

    /// Sets KEYS and ARGV and calls `func` under `lua_pcall`: (true, its first result) or
    /// (false, the error value), as Lua's `pcall(func)` answers (the error stays a Lua value).
    /// One protected call on the raw stack: made through `mlua`'s handles, the two tables, each
    /// string in them and a Lua-side `pcall` wrapper cost a fifth of a one-line script's time
    /// on the writer thread (a registry reference for each value, a protected call for each
    /// step). The tables are made with the VM's memory limit lifted (they are bounded by the
    /// request); the caller restores it.
    fn call_protected(
        &self,
        lua: &Lua,
        names: &[mlua::LuaString; 2],
        func: &mlua::Function,
    ) -> mlua::Result<(bool, Value)> {
        let n = self.words.ranges.len();
        let nk = self.nkeys.min(n);
        // SAFETY: `exec_raw` runs the closure in a protected call, with `func` and the two
        // names at stack indexes 1, 2 and 3. A Lua error inside (out of memory) unwinds it by
        // longjmp, so it holds nothing to drop: borrowed slices, and `Result`s of plain
        // numbers. Each step keeps at most three values on the stack over the arguments,
        // within the LUA_MINSTACK (20) slots a C function is given. What it leaves on the
        // stack are the two results.
        unsafe {
            lua.exec_raw::<(bool, Value)>((func, &names[0], &names[1]), |state| {
                let _ = lua.set_memory_limit(0);
                for (name, range) in [(2, 0..nk), (3, nk..n)] {
                    ffi::lua_pushvalue(state, name);
                    ffi::lua_createtable(state, range.len() as i32, 0);
                    for (i, w) in self.words.slices(range).enumerate() {
                        ffi::lua_pushlstring(state, w.as_ptr().cast(), w.len());
                        ffi::lua_rawseti(state, -2, i as ffi::lua_Integer + 1);
                    }
                    // Raw: the globals' metatable refuses writes.
                    ffi::lua_rawset(state, ffi::LUA_GLOBALSINDEX);
                }
                let _ = lua.set_memory_limit(LUA_MEMORY);
                ffi::lua_settop(state, 1);
                let status = ffi::lua_pcall(state, 0, 1, 0);
                ffi::lua_pushboolean(state, (status == 0) as std::ffi::c_int);
                ffi::lua_insert(state, 1);
            })
        }
    }

    /// The reply for an error the script raised: Redis's text, then where it happened.
    fn error_reply(&self, out: &mut Vec<u8>, err: &Value, state: &RunState<'_>) {
        // A string error (the script's own, or a library's): "user_script:3: message", the
        // line Lua put in front.
        let located = |text: String| {
            let line = text
                .strip_prefix("user_script:")
                .and_then(|r| r.split(':').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            (format!("ERR {text}"), line)
        };
        let (msg, line) = match err {
            Value::Table(t) => {
                let msg = t
                    .raw_get::<mlua::LuaString>("err")
                    .map(|s| s.to_string_lossy())
                    .unwrap_or_else(|_| "ERR unknown error".into());
                (msg, state.err_line.get())
            }
            Value::String(s) => located(s.to_string_lossy()),
            Value::Error(e) if let Some(lib) = libs::lib_error(e) => {
                (format!("ERR {}", lib.text), lib.line)
            }
            Value::Error(e) if call_error(e).is_some() => {
                (call_error(e).unwrap_or_default(), state.err_line.get())
            }
            Value::Error(e) => {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or("").to_string();
                let first = first
                    .strip_prefix("runtime error: ")
                    .unwrap_or(&first)
                    .to_string();
                if first.starts_with("ERR ") {
                    (first, 0)
                } else {
                    (format!("ERR {first}"), 0)
                }
            }
            other => (format!("ERR {}", other.type_name()), 0),
        };
        let msg = if msg.contains(" script: ") {
            msg
        } else if line > 0 {
            format!("{msg} script: {}, on @user_script:{line}.", self.script.sha)
        } else {
            format!("{msg} script: {}, on @user_script.", self.script.sha)
        };
        enc::error(out, &msg);
    }

    /// `redis.call`/`redis.pcall`: runs one command, answering its reply as a Lua value (an error
    /// reply as `{err = ...}`; `redis.call` raises it).
    fn command(
        &self,
        lua: &Lua,
        state: &RunState<'_>,
        args: mlua::MultiValue,
    ) -> mlua::Result<Value> {
        if state.moved.get() {
            return Err(mlua::Error::RuntimeError(MOVED.into()));
        }
        // The command's words in one buffer, as the command layer takes them.
        // Enough for most calls' words at once (growing from empty took two reallocations).
        let mut buf = Vec::with_capacity(128);
        let mut ranges = Vec::with_capacity(args.len());
        for a in args.iter() {
            let start = buf.len();
            match a {
                Value::String(s) => buf.extend_from_slice(&s.as_bytes()),
                Value::Integer(n) => {
                    buf.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes())
                }
                Value::Number(n) => buf.extend_from_slice(convert::number_text(*n).as_bytes()),
                _ => {
                    state.err_line.set(current_line(lua));
                    return convert::error_table(
                        lua,
                        "ERR Lua redis lib command arguments must be strings or integers",
                    );
                }
            }
            ranges.push(start..buf.len());
        }
        drop(args);
        let v3 = state.resp3.get();
        let reply = {
            let mut txn = state.txn.borrow_mut();
            self.call(&mut **txn, Args::new(&buf, &ranges), v3, state)
        };
        if self.scripts.kill.load(Ordering::Relaxed) {
            return Err(mlua::Error::RuntimeError(
                "ERR Script killed by user with SCRIPT KILL...".into(),
            ));
        }
        if state.moved.get() {
            return Err(mlua::Error::RuntimeError(MOVED.into()));
        }
        if reply.first() == Some(&b'-') {
            // Still inside the call: the stack shows the script's line.
            state.err_line.set(current_line(lua));
        }
        unbounded(lua, || convert::reply_to_lua(lua, &reply))
    }

    /// Runs one command against the transaction: its RESP reply.
    fn call(
        &self,
        txn: &mut dyn ScriptTxn,
        args: Args<'_>,
        v3: bool,
        state: &RunState<'_>,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        if args.is_empty() {
            enc::error(
                &mut out,
                "ERR Please specify at least one argument for this redis lib call",
            );
            return out;
        }
        let Some(spec) = lookup(args.get(0)) else {
            enc::error(&mut out, "ERR Unknown Redis command called from script");
            return out;
        };
        let n = args.len() as i32;
        if (spec.arity > 0 && n != spec.arity) || (spec.arity < 0 && n < -spec.arity) {
            enc::error(
                &mut out,
                "ERR Wrong number of args calling Redis command from script",
            );
            return out;
        }
        if !allowed(spec.cmd) {
            enc::error(
                &mut out,
                "ERR This Redis command is not allowed from script",
            );
            return out;
        }
        if let Some(permit) = &self.permit {
            let all: Vec<&[u8]> = (0..args.len()).map(|i| args.get(i)).collect();
            if let Err(why) = permit(spec, &all) {
                let msg = if why.contains("to run the") {
                    "ERR The user executing the script can't run this command or subcommand"
                } else if why.contains("channels") {
                    "ERR The user executing the script can't publish to the channel mentioned in the command"
                } else {
                    "ERR The user executing the script can't access at least one of the keys mentioned in the command arguments"
                };
                enc::error(&mut out, msg);
                return out;
            }
        }
        if spec.write {
            if self.read_only {
                enc::error(
                    &mut out,
                    "ERR Write commands are not allowed from read-only scripts.",
                );
                return out;
            }
            let (op, kind) =
                match crate::commands::write_op(spec.cmd, args, txn.now_ms(), self.max_bulk) {
                    Ok(x) => x,
                    Err(msg) => {
                        enc::error(&mut out, &msg);
                        return out;
                    }
                };
            match txn.write(&op) {
                Ok(o) => crate::commands::complete(&mut out, v3, kind, o),
                Err(e) => {
                    enc::error(&mut out, &e.resp_reply());
                    *state.failed.borrow_mut() = Some(e);
                }
            }
            if txn.wrote() {
                self.scripts.wrote.store(true, Ordering::Relaxed);
            }
        } else if reads_store(spec.cmd) {
            let read = QueuedRead {
                cmd: spec.cmd,
                args: OwnedArgs::new(args),
                v3,
                cursors: self.cursors.clone(),
                max_bulk: self.max_bulk,
                hits: None,
            };
            match txn.read(&read) {
                Outcome::Reply(b) if b.len() <= REPLY_MAX => out = b,
                Outcome::Reply(_) => enc::error(&mut out, "ERR reply larger than memkeep's limit"),
                o => crate::commands::complete(&mut out, v3, crate::commands::RespReply::Plain, o),
            }
        } else {
            match spec.cmd {
                Cmd::Ping if args.len() > 1 => enc::bulk(&mut out, args.get(1)),
                Cmd::Ping => enc::simple(&mut out, "PONG"),
                Cmd::Echo => enc::bulk(&mut out, args.get(1)),
                // PUBLISH may replicate: Redis refuses it in read-only scripts too.
                Cmd::Publish if self.read_only => enc::error(
                    &mut out,
                    "ERR Write commands are not allowed from read-only scripts.",
                ),
                // A message cannot be taken back: a leader leaves the script to the writer
                // thread, which never gives a batch back.
                Cmd::Publish if state.leader => {
                    log::debug!("a script publishes: it moves to the writer thread");
                    state.moved.set(true);
                    enc::error(&mut out, MOVED);
                }
                Cmd::Publish => match self.scripts.publisher.get() {
                    Some(publish) => enc::int(&mut out, publish(args.get(1), args.get(2)) as i64),
                    None => enc::error(
                        &mut out,
                        "ERR This Redis command is not allowed from script",
                    ),
                },
                Cmd::Select => match crate::protocol::resp::parse_i64(args.get(1)) {
                    Some(0) => enc::ok(&mut out),
                    Some(_) => enc::error(&mut out, "ERR DB index is out of range"),
                    None => enc::error(&mut out, "ERR value is not an integer or out of range"),
                },
                Cmd::Command => crate::commands::server::command(args, &mut out, v3),
                Cmd::Info | Cmd::LastSave | Cmd::PubSub => match self.scripts.server_read.get() {
                    Some(read) => {
                        let keyspace = if spec.cmd == Cmd::Info {
                            self.keyspace(txn)
                        } else {
                            (0, 0)
                        };
                        read(spec.cmd, args, &mut out, v3, keyspace)
                    }
                    None => enc::error(
                        &mut out,
                        "ERR This Redis command is not allowed from script",
                    ),
                },
                Cmd::Time => {
                    let t = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    enc::array(&mut out, 2);
                    enc::bulk(&mut out, t.as_secs().to_string().as_bytes());
                    enc::bulk(&mut out, t.subsec_micros().to_string().as_bytes());
                }
                _ => enc::error(
                    &mut out,
                    "ERR This Redis command is not allowed from script",
                ),
            }
        }
        out
    }
}

impl ScriptRun {
    /// The keys and the keys with a TTL as the script's transaction sees them (its own writes
    /// and the batch's included).
    fn keyspace(&self, txn: &mut dyn ScriptTxn) -> (u64, u64) {
        let name = std::slice::from_ref(&(0..4));
        let read = QueuedRead {
            cmd: Cmd::Info,
            args: OwnedArgs::new(Args::new(b"INFO", name)),
            v3: false,
            cursors: self.cursors.clone(),
            max_bulk: self.max_bulk,
            hits: None,
        };
        match txn.read(&read) {
            Outcome::Reply(b) => {
                let v: Vec<u64> = b
                    .split(|&c| c == b'\n')
                    .filter_map(|l| l.strip_prefix(b":"))
                    .filter_map(|l| std::str::from_utf8(l).ok()?.trim().parse().ok())
                    .collect();
                (
                    v.first().copied().unwrap_or(0),
                    v.get(1).copied().unwrap_or(0),
                )
            }
            _ => (0, 0),
        }
    }
}

/// A `redis.call` whose command answered an error: the script stops with it.
#[derive(Debug)]
struct CallError(String);

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CallError {}

fn call_error(e: &mlua::Error) -> Option<String> {
    match e {
        mlua::Error::CallbackError { cause, .. } => call_error(cause),
        mlua::Error::ExternalError(x) => x.downcast_ref::<CallError>().map(|c| c.0.clone()),
        _ => None,
    }
}

/// Commands a script may call (Redis refuses those flagged `noscript`, and blocking ones).
fn allowed(cmd: Cmd) -> bool {
    match cmd {
        Cmd::Pop(code) => !crate::commands::blocking::blocks(code),
        Cmd::Multi
        | Cmd::Exec
        | Cmd::Discard
        | Cmd::Watch
        | Cmd::Unwatch
        | Cmd::Subscribe
        | Cmd::Unsubscribe
        | Cmd::PSubscribe
        | Cmd::PUnsubscribe
        | Cmd::Auth
        | Cmd::Hello
        | Cmd::Quit
        | Cmd::Reset
        | Cmd::Client
        | Cmd::Wait
        | Cmd::Eval
        | Cmd::EvalSha
        | Cmd::EvalRo
        | Cmd::EvalShaRo
        | Cmd::Script
        | Cmd::Function
        | Cmd::Shutdown => false,
        _ => true,
    }
}

/// The line of the innermost frame of the user's script.
fn current_line(lua: &Lua) -> usize {
    for level in 1..8 {
        let found = lua.inspect_stack(level, |d| {
            let src = d.source();
            let ours = src
                .source
                .as_deref()
                .is_some_and(|s| s.ends_with("user_script"));
            ours.then(|| d.current_line())
        });
        match found {
            None => break,
            Some(Some(line)) => return line.unwrap_or(0),
            Some(None) => continue,
        }
    }
    0
}

/// The Lua prelude: the libraries in Lua, and read-only globals and libraries.
const PRELUDE: &str = r#"
local redis = redis
redis.error_reply = function(e)
  if type(e) ~= 'string' then error('wrong number or type of arguments', 2) end
  if string.sub(e, 1, 1) == '-' then e = string.sub(e, 2) end
  return {err = e}
end
redis.status_reply = function(s)
  if type(s) ~= 'string' then error('wrong number or type of arguments', 2) end
  return {ok = s}
end
redis.LOG_DEBUG = 0
redis.LOG_VERBOSE = 1
redis.LOG_NOTICE = 2
redis.LOG_WARNING = 3
-- Effects replication is the only kind in Redis 7: these are kept for older scripts.
redis.replicate_commands = function() return true end
redis.set_repl = function(flags) end
redis.REPL_NONE = 0
redis.REPL_AOF = 1
redis.REPL_SLAVE = 2
redis.REPL_REPLICA = 2
redis.REPL_ALL = 3
redis.breakpoint = function() return false end
redis.debug = function(...) end
redis.REDIS_VERSION = '7.0.0'
redis.REDIS_VERSION_NUM = 0x070000
loadfile = nil
dofile = nil
print = nil
-- Redis's pcall hands the script the text of an error raised as a table ({err=}: a failed
-- redis.call), and xpcall's handler gets Redis's table; a failed redis.call raises a Rust error
-- here, which `err_of` turns into either.
local real_pcall, real_xpcall = pcall, xpcall
local err_of = __memkeep_err_of
__memkeep_err_of = nil
local function caught(ok, ...)
  if ok then return ok, ... end
  return false, err_of((...), false)
end
pcall = function(...) return caught(real_pcall(...)) end
xpcall = function(f, h)
  return real_xpcall(f, function(e) return h(err_of(e, true)) end)
end
local readonly = function(t, k, v) error('Attempt to modify a readonly table', 2) end
for _, name in ipairs({'redis', 'string', 'table', 'math', 'bit', 'cjson', 'cmsgpack', 'struct'}) do
  local real = _G[name]
  _G[name] = setmetatable({}, {__index = real, __newindex = readonly, __metatable = false})
end
setmetatable(_G, {
  __newindex = function(t, k, v) error('Attempt to modify a readonly table', 2) end,
  __index = function(t, k)
    error("Script attempted to access nonexistent global variable '" .. tostring(k) .. "'", 2)
  end,
})
"#;

fn new_vm(scripts: Arc<Scripts>) -> mlua::Result<Vm> {
    let lua = Lua::new_with(
        StdLib::TABLE | StdLib::STRING | StdLib::MATH,
        LuaOptions::default(),
    )?;
    if let Err(e) = lua.set_memory_limit(LUA_MEMORY) {
        log::warn!("Lua memory limit not set: {e}");
    }
    let g = lua.globals();
    let redis = lua.create_table()?;
    redis.raw_set(
        "sha1hex",
        lua.create_function(|_, s: mlua::LuaString| Ok(sha1hex(&s.as_bytes())))?,
    )?;
    redis.raw_set(
        "log",
        lua.create_function(|_, (level, msg): (i64, mlua::MultiValue)| {
            let text: Vec<String> = msg
                .iter()
                .map(|v| v.to_string().unwrap_or_default())
                .collect();
            match level {
                3 => log::warn!("script: {}", text.join(" ")),
                2 => log::info!("script: {}", text.join(" ")),
                _ => log::debug!("script: {}", text.join(" ")),
            }
            Ok(())
        })?,
    )?;
    // Made once per VM (making them per script, in an `mlua` scope, cost a fifth of a short
    // script's time): they reach the running script through `Running`. Rust functions, not
    // Lua wrappers: a `return redis.call(...)` is then no tail call, and an error's line is
    // the script's.
    redis.raw_set(
        "call",
        lua.create_function(|lua, args: mlua::MultiValue| {
            Running::with(|run, state| {
                let v = run.command(lua, state, args)?;
                if let Value::Table(t) = &v
                    && let Ok(Value::String(e)) = t.raw_get::<Value>("err")
                {
                    return Err(mlua::Error::external(CallError(e.to_string_lossy())));
                }
                Ok(v)
            })
        })?,
    )?;
    redis.raw_set(
        "pcall",
        lua.create_function(|lua, args: mlua::MultiValue| {
            Running::with(|run, state| run.command(lua, state, args))
        })?,
    )?;
    redis.raw_set(
        "setresp",
        lua.create_function(|_, v: i64| {
            if v != 2 && v != 3 {
                return Err(mlua::Error::RuntimeError(
                    "RESP version must be 2 or 3.".into(),
                ));
            }
            Running::with(|_, state| {
                state.resp3.set(v == 3);
                Ok(())
            })
        })?,
    )?;
    g.raw_set("redis", redis)?;
    // For the prelude's pcall and xpcall, which take it out of the globals.
    g.raw_set(
        "__memkeep_err_of",
        lua.create_function(|lua, (e, table): (Value, bool)| {
            Ok(match e {
                Value::Error(ref x) => match call_error(x) {
                    Some(msg) if table => convert::error_table(lua, &msg)?,
                    Some(msg) => Value::String(lua.create_string(&msg)?),
                    // Our libraries raise strings, as Lua's C libraries do.
                    None => match libs::lib_error(x) {
                        Some(lib) => Value::String(lua.create_string(&lib.text)?),
                        None => e,
                    },
                },
                Value::Table(ref t) if !table => match t.raw_get::<Value>("err")? {
                    Value::String(msg) => Value::String(msg),
                    _ => e,
                },
                other => other,
            })
        })?,
    )?;
    g.raw_set("bit", bitlib::bit_lib(&lua)?)?;
    g.raw_set("cjson", convert::cjson_lib(&lua)?)?;
    g.raw_set("cmsgpack", cmsgpack::cmsgpack_lib(&lua)?)?;
    g.raw_set("struct", structlib::struct_lib(&lua)?)?;
    lua.load(PRELUDE).set_name("=prelude").exec()?;
    let names = [lua.create_string("KEYS")?, lua.create_string("ARGV")?];
    // The time limit and SCRIPT KILL: checked every 100k instructions.
    let s = scripts;
    lua.set_hook(
        mlua::HookTriggers::new().every_nth_instruction(100_000),
        move |_, _| {
            let limit = s.time_limit_ms.load(Ordering::Relaxed);
            let started = s.started_ms.load(Ordering::Relaxed);
            if limit > 0 && now_ms().saturating_sub(started) >= limit {
                s.busy.store(true, Ordering::Relaxed);
            }
            if s.kill.load(Ordering::Relaxed) {
                return Err(mlua::Error::RuntimeError(
                    "ERR Script killed by user with SCRIPT KILL...".into(),
                ));
            }
            // A leader's script that runs long moves to the writer thread, where other clients
            // of the leader's worker get BUSY and can SCRIPT KILL it, as everyone can there.
            let overdue = now_ms().saturating_sub(started) >= LEAD_MS;
            let moves = overdue
                && Running::with(|_, state| {
                    if state.leader && !state.moved.get() {
                        log::debug!(
                            "a script ran {LEAD_MS} ms on a leader: it moves to the writer thread"
                        );
                        state.moved.set(true);
                    }
                    Ok(state.moved.get())
                })
                .unwrap_or(false);
            if moves {
                return Err(mlua::Error::RuntimeError(MOVED.into()));
            }
            Ok(mlua::VmState::Continue)
        },
    )?;
    Ok(Vm {
        lua,
        funcs: HashMap::new(),
        last: None,
        generation: 0,
        names,
    })
}
