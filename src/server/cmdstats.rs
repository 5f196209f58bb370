//! INFO `commandstats` and `errorstats`: per RESP command, the calls, the microseconds spent,
//! the calls refused before they ran (unknown subcommand, arity, authentication, ACL, BUSY:
//! Redis's `rejected_calls`) and those that ran and answered an error (`failed_calls`); per
//! error prefix (the reply's first word: `ERR`, `WRONGTYPE`, `NOAUTH`...), how many replies
//! carried it.
//!
//! Each worker keeps its own table behind an uncontended lock (INFO, on any worker, is the only
//! other taker), so a command costs one lock and a hash lookup, no shared cache line. The time
//! is what the worker spent on the command: for a write, its parsing and hand-off, not the
//! writer's transaction or the fsync (the reply's wait for durability is not work, and Redis
//! does not count its fsync there either).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// How many distinct error prefixes are counted (Redis's limit too); later ones are not.
const ERROR_KINDS_MAX: usize = 128;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CmdStat {
    pub calls: u64,
    pub usec: u64,
    pub rejected: u64,
    pub failed: u64,
}

/// One worker's figures.
#[derive(Debug, Default)]
pub struct CmdStats {
    cmds: HashMap<String, CmdStat>,
    errors: HashMap<String, u64>,
}

impl CmdStats {
    /// A command that ran: `reply` is its reply's first byte (`-` for an error), with the reply
    /// for the error count.
    pub fn call(&mut self, name: &str, usec: u64, reply: &[u8]) {
        let failed = reply.first() == Some(&b'-');
        self.update(name, |s| {
            s.calls += 1;
            s.usec += usec;
            s.failed += failed as u64;
        });
        if failed {
            self.error(reply);
        }
    }

    /// A write's reply arrived after its commit: an error counts as a failed call (its call
    /// was counted when it was handed to the writer).
    pub fn completed(&mut self, name: &str, reply: &[u8]) {
        if reply.first() == Some(&b'-') {
            self.update(name, |s| s.failed += 1);
            self.error(reply);
        }
    }

    /// A command refused before it ran (`name` None: not a command at all).
    pub fn rejected(&mut self, name: Option<&str>, msg: &str) {
        if let Some(name) = name {
            self.update(name, |s| s.rejected += 1);
        }
        self.error(msg.as_bytes());
    }

    /// Updates the figures of `name`, allocating its key only the first time.
    fn update(&mut self, name: &str, f: impl FnOnce(&mut CmdStat)) {
        match self.cmds.get_mut(name) {
            Some(s) => f(s),
            None => {
                let mut s = CmdStat::default();
                f(&mut s);
                self.cmds.insert(name.to_string(), s);
            }
        }
    }

    /// Counts an error reply (`-PREFIX rest\r\n`, or the message without the dash) by prefix.
    fn error(&mut self, reply: &[u8]) {
        let text = reply.strip_prefix(b"-").unwrap_or(reply);
        let end = text
            .iter()
            .position(|&b| b == b' ' || b == b'\r' || b == b'\n')
            .unwrap_or(text.len());
        let prefix = &text[..end.min(64)];
        if prefix.is_empty() {
            return;
        }
        let prefix = String::from_utf8_lossy(prefix);
        if let Some(n) = self.errors.get_mut(prefix.as_ref()) {
            *n += 1;
        } else if self.errors.len() < ERROR_KINDS_MAX {
            self.errors.insert(prefix.into_owned(), 1);
        }
    }
}

/// Summed figures: per command and per error prefix, by name.
pub type Merged = (Vec<(String, CmdStat)>, Vec<(String, u64)>);

/// Every worker's tables.
#[derive(Debug)]
pub struct AllCmdStats(Box<[Mutex<CmdStats>]>);

impl AllCmdStats {
    pub fn new(workers: usize) -> AllCmdStats {
        AllCmdStats((0..workers.max(1)).map(|_| Mutex::default()).collect())
    }

    /// The table of worker `i` (a worker past the table shares the last one).
    pub fn worker(&self, i: usize) -> MutexGuard<'_, CmdStats> {
        let m = &self.0[i.min(self.0.len() - 1)];
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sums over every worker: commands and error prefixes, each sorted by name.
    pub fn merged(&self) -> Merged {
        let mut cmds: HashMap<String, CmdStat> = HashMap::new();
        let mut errors: HashMap<String, u64> = HashMap::new();
        for m in self.0.iter() {
            let t = m.lock().unwrap_or_else(|p| p.into_inner());
            for (name, s) in &t.cmds {
                let e = cmds.entry(name.clone()).or_default();
                e.calls += s.calls;
                e.usec += s.usec;
                e.rejected += s.rejected;
                e.failed += s.failed;
            }
            for (p, n) in &t.errors {
                *errors.entry(p.clone()).or_default() += n;
            }
        }
        let mut cmds: Vec<_> = cmds.into_iter().collect();
        cmds.sort_by(|a, b| a.0.cmp(&b.0));
        let mut errors: Vec<_> = errors.into_iter().collect();
        errors.sort();
        (cmds, errors)
    }

    /// CONFIG RESETSTAT.
    pub fn reset(&self) {
        for m in self.0.iter() {
            let mut t = m.lock().unwrap_or_else(|p| p.into_inner());
            t.cmds.clear();
            t.errors.clear();
        }
    }

    /// The `commandstats` section's lines, Redis's format.
    pub fn commandstats(&self) -> String {
        use std::fmt::Write;
        let (cmds, _) = self.merged();
        let mut s = String::new();
        for (name, c) in cmds {
            let per = if c.calls > 0 {
                c.usec as f64 / c.calls as f64
            } else {
                0.0
            };
            let _ = write!(
                s,
                "cmdstat_{name}:calls={},usec={},usec_per_call={per:.2},rejected_calls={},failed_calls={}\r\n",
                c.calls, c.usec, c.rejected, c.failed
            );
        }
        s
    }

    /// The `errorstats` section's lines, and the total of errors (`total_error_replies`).
    pub fn errorstats(&self) -> (String, u64) {
        use std::fmt::Write;
        let (_, errors) = self.merged();
        let mut s = String::new();
        let mut total = 0;
        for (p, n) in errors {
            total += n;
            let _ = write!(s, "errorstat_{p}:count={n}\r\n");
        }
        (s, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_failures_rejections_and_error_prefixes_add_up_over_workers() {
        let all = AllCmdStats::new(2);
        all.worker(0).call("get", 3, b"$1\r\nv\r\n");
        all.worker(1)
            .call("get", 5, b"-WRONGTYPE Operation against a key\r\n");
        all.worker(1).rejected(
            Some("get"),
            "ERR wrong number of arguments for 'get' command",
        );
        all.worker(0).rejected(None, "ERR unknown command 'nope'");
        all.worker(0).call("set", 2, b"+OK\r\n");
        all.worker(0)
            .completed("set", b"-OOM command not allowed\r\n");
        all.worker(7).call("set", 1, b"+OK\r\n");
        assert_eq!(
            all.commandstats(),
            "cmdstat_get:calls=2,usec=8,usec_per_call=4.00,rejected_calls=1,failed_calls=1\r\n\
             cmdstat_set:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=1\r\n"
        );
        let (errs, total) = all.errorstats();
        assert_eq!(
            errs,
            "errorstat_ERR:count=2\r\nerrorstat_OOM:count=1\r\nerrorstat_WRONGTYPE:count=1\r\n"
        );
        assert_eq!(total, 4);
        all.reset();
        assert_eq!(all.commandstats(), "");
        assert_eq!(all.errorstats(), (String::new(), 0));
    }

    #[test]
    fn error_kinds_are_bounded() {
        let all = AllCmdStats::new(1);
        for i in 0..500 {
            all.worker(0).rejected(None, &format!("E{i} x"));
        }
        all.worker(0).rejected(None, "E0 again");
        let (errs, total) = all.errorstats();
        assert_eq!(errs.lines().count(), ERROR_KINDS_MAX);
        assert!(errs.contains("errorstat_E0:count=2\r\n"));
        assert_eq!(total, ERROR_KINDS_MAX as u64 + 1);
    }
}
