//! memkeep's entry point: flags and config file -> `Config`, logging, then the server.
//! Every startup failure is one line on stderr and a non-zero exit, never a panic trace.

use std::process::ExitCode;

use clap::Parser;
use memkeep::clock::Clock;
use memkeep::config::{Action, Cli, Config};

/// glibc serves an allocation past its mmap threshold (128 KiB, raised to the largest block
/// freed so far) with a fresh mapping, and unmaps it at free: every large value a request
/// copies (an APPEND to a 1 MiB value, LMDB's dirty overflow pages, a 1 MiB `set`) then
/// faults in and zeroes each page anew, which cost more than the copies themselves (perf: a
/// quarter of an APPEND's time in page faults, and the threshold never caught up with a value
/// that grows). Blocks up to 8 MiB come from the heap instead, and freed memory up to 32 MiB
/// stays for the next one rather than going back at once.
fn tune_malloc() {
    // SAFETY: mallopt only sets allocator parameters; called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 8 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 32 << 20);
    }
}

fn main() -> ExitCode {
    tune_malloc();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                print!("{e}");
                return ExitCode::SUCCESS;
            }
            let text = e.to_string();
            eprintln!(
                "memkeep: {}",
                text.lines()
                    .next()
                    .unwrap_or("invalid arguments")
                    .trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    let mut config = match Config::from_cli(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("memkeep: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Action::Check { data_dir }) = &cli.action {
        let dir = data_dir.as_deref().unwrap_or(&config.data_dir);
        return ExitCode::from(memkeep::check::run(dir, config.map_size));
    }
    if let Some(action) = &cli.action {
        return match run_action(action, &config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("memkeep: {e}");
                ExitCode::from(1)
            }
        };
    }
    if cli.daemon {
        // Before any thread exists: fork, detach, keep the working directory (relative paths in
        // the config stay valid), send the standard streams to /dev/null.
        // Safety: no other thread has been started yet.
        if unsafe { libc::daemon(1, 0) } != 0 {
            eprintln!(
                "memkeep: cannot run in the background: {}",
                std::io::Error::last_os_error()
            );
            return ExitCode::from(1);
        }
    }
    // Written beside it and renamed, so a reader never sees the file empty.
    if let Some(pid_file) = &cli.pid_file
        && let Err(e) = {
            let tmp = pid_file.with_extension("pid.tmp");
            std::fs::write(&tmp, format!("{}\n", std::process::id()))
                .and_then(|()| std::fs::rename(&tmp, pid_file))
        }
    {
        eprintln!("memkeep: cannot write pid file {}: {e}", pid_file.display());
        return ExitCode::from(1);
    }
    let level = match config.verbosity {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    let clock = match cli.debug_clock {
        Some(ms) => Clock::manual(ms),
        None => Clock::System,
    };
    for warning in cli.ignored() {
        log::warn!("{warning}");
    }
    if let Some(cap) = raise_open_files_limit(config.max_connections) {
        config.max_connections = cap;
    }
    let data_dir = config.data_dir.clone();
    match memkeep::server::run(config, clock) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "memkeep: {e}{}",
                memkeep::storage::disk_full_hint(&data_dir)
            );
            ExitCode::from(1)
        }
    }
}

/// Descriptors kept for memkeep's own files (data and lock files, log segments and spares,
/// value-log segments being read, pollers, wakers, rings) when the open-files limit caps the
/// clients; Redis keeps 32, memkeep opens more.
const RESERVED_FDS: u64 = 128;

/// Raises the open-files soft limit to the hard limit, as memcached and Redis do: every client
/// is a descriptor, and the usual default soft limit (1024) is below what `max_connections` may
/// allow. When even that leaves too few descriptors for `max_connections` clients and
/// memkeep's own files, returns the lower cap (as Redis lowers maxclients): without it, clients
/// took every descriptor and checkpoints failed ("cannot start a new log segment: Too many
/// open files").
fn raise_open_files_limit(max_connections: usize) -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // Safety: a plain system call on a local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // Safety: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        } else {
            log::debug!(
                "cannot raise the open-files limit: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    // Under a tiny limit, still a quarter for clients (memkeep itself opens about 35 files
    // at startup: the data file once per reader thread, pollers, wakers, rings, the log).
    let reserve = RESERVED_FDS.min(lim.rlim_cur * 3 / 4);
    let room = usize::try_from(lim.rlim_cur.saturating_sub(reserve)).unwrap_or(usize::MAX);
    if room < max_connections {
        let cap = room.max(1);
        log::warn!(
            "max_connections lowered from {max_connections} to {cap}: the open-files limit is {} \
             and memkeep keeps {reserve} descriptors for its own files; clients past it are \
             refused ('ERROR Too many open connections', '-ERR max number of clients reached')",
            lim.rlim_cur
        );
        return Some(cap);
    }
    None
}

/// Removes a directory (a scratch copy) when dropped.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Runs `memkeep backup|export|import` (`check` is `check::run`) against the configured data directory or server.
fn run_action(action: &Action, config: &Config) -> Result<(), String> {
    // A store a server holds is copied as it is (through the page cache it is whole) and the
    // server's log applied to the copy, so it holds every acknowledged write; any other store
    // is recovered first, as a server would, so a power cut's leftovers are never read.
    let mut recovered = None;
    // Beside the data directory, removed when done.
    let copy_dir = {
        let mut name = config.data_dir.as_os_str().to_owned();
        name.push(format!(".copy-{}", std::process::id()));
        std::path::PathBuf::from(name)
    };
    let _cleanup = RemoveOnDrop(copy_dir.clone());
    let mut open = || {
        if !config.data_dir.join("data.mdb").exists() {
            return Err(format!("no data in {}", config.data_dir.display()));
        }
        if memkeep::storage::durable::in_use(&config.data_dir) {
            memkeep::backup::live_copy(&config.data_dir, &copy_dir, config.map_size)
        } else {
            let d = memkeep::storage::durable::open(&config.data_dir, config.map_size, 126)
                .map_err(|e| e.0)?;
            let store = d.store.clone();
            recovered = Some(d);
            Ok(store)
        }
    };
    let now_ms = memkeep::clock::Clock::System.now_ms();
    match action {
        Action::Backup { dest } => {
            let size = memkeep::backup::backup(&open()?, dest, false)?;
            eprintln!(
                "memkeep: backup of {} written to {} ({size} bytes)",
                config.data_dir.display(),
                dest.join("data.mdb").display()
            );
            Ok(())
        }
        Action::Export { output } => {
            let store = open()?;
            let (written, skipped) = match output {
                Some(path) => {
                    let file = std::fs::File::create(path)
                        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                    memkeep::backup::export(&store, now_ms, &mut std::io::BufWriter::new(file))?
                }
                None => memkeep::backup::export(
                    &store,
                    now_ms,
                    &mut std::io::BufWriter::new(std::io::stdout().lock()),
                )?,
            };
            eprintln!(
                "memkeep: exported {written} items ({skipped} lists, hashes, sets and sorted sets have no memcached form and were skipped)"
            );
            Ok(())
        }
        Action::Import {
            rdb: Some(rdb), db, ..
        } => {
            let opts = memkeep::migrate::Options {
                addr: format!("{}:{}", config.listen, config.resp_port),
                password: config.requirepass.clone(),
                db: db.unwrap_or(0),
                progress: true,
            };
            let summary = memkeep::migrate::import(rdb, &opts)?;
            for line in summary.lines(rdb) {
                eprintln!("memkeep: {line}");
            }
            if summary.refused > 0 {
                return Err(format!(
                    "{} keys of {} were not loaded (the server refused them)",
                    summary.refused,
                    rdb.display()
                ));
            }
            Ok(())
        }
        Action::Import { file, db, .. } => {
            if db.is_some() {
                return Err("--db goes with --rdb (a memcached dump has no databases)".into());
            }
            let Some(file) = file else {
                return Err("import needs a dump file, or --rdb FILE".into());
            };
            let addr = format!("{}:{}", config.listen, config.port);
            let (stored, refused) = if file.as_os_str() == "-" {
                memkeep::backup::import(&addr, &mut std::io::stdin().lock())?
            } else {
                let mut f = std::fs::File::open(file)
                    .map_err(|e| format!("cannot open {}: {e}", file.display()))?;
                memkeep::backup::import(&addr, &mut f)?
            };
            eprintln!("memkeep: imported {stored} items into {addr} ({refused} refused)");
            Ok(())
        }
        Action::Check { .. } => Err("check runs through check::run".into()),
    }
}
