#!/usr/bin/env python3
"""Runs Redis 7.0.15's own tcl unit tests for the data types against memkeep, and the same files
against redis-server 7.0.15 as the baseline, and prints the pass rate (issue 16).

The suite is not in this repository: the upstream source tarball that Debian's redis 7.0.15 is
built from is downloaded once into a cache outside git (checked against the sha256 below), and
its `runtest` and `tests/` are unpacked into a temp dir for each run.

Each test file runs alone, against a fresh server (a fresh memkeep on a temp data dir with
`--sync never`, or a redis-server with no persistence), with Redis's framework in its "external
server" mode (`--host/--port`), which leaves out the tests tagged `external:skip`. The other
framework options, the same for both servers:

  --singledb          memkeep has one database (SELECT 0 only, a design non-goal); the tests
                      tagged singledb:skip (MOVE, SELECT 9, COPY ... DB) are left out.
  --ignore-encoding   OBJECT ENCODING's listpack/intset/quicklist/skiplist are Redis's internal
                      representations; memkeep stores every collection one way on LMDB.
  --tags -needs:debug the tests that need the DEBUG command (DEBUG RELOAD, LOADAOF, SLEEP,
                      set-active-expire, ...), a Redis-internal tool memkeep does not have.
  --tags -needs:repl  the tests that attach to Redis's replication stream (SYNC) to check
                      which commands a write propagates as; memkeep's replicas receive its
                      physical write-ahead log, not commands. They time out against an
                      external redis-server too.
  --tags -needs:config-maxmemory  the tests that set maxmemory (eviction policies); memkeep
                      refuses writes when its disk is full and has no maxmemory.

SKIPS below lists single tests left out (for both servers) with the reason each.

The denominator is, per file, the tests that pass against redis-server in the same run; a test
counts as passed for memkeep when it passes against memkeep too (test names can repeat, as in
the encoding loops, so names are counted as a multiset). A test that never ran against memkeep
because an exception stopped its file counts as failed. Exits 1 when the rate is below
--threshold.
"""

import argparse
import collections
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

REDIS_VERSION = "7.0.15"
TARBALL_URL = (
    "http://deb.debian.org/debian/pool/main/r/redis/redis_" + REDIS_VERSION + ".orig.tar.gz"
)
TARBALL_SHA256 = "4b1dc4ee6d622a09fff9c6777191209750fb5e5a725ef78ea012d6eef4c22982"
TARBALL_SIZE = 3025940

FILES = [
    "unit/type/incr",
    "unit/type/string",
    "unit/type/list",
    "unit/type/list-2",
    "unit/type/list-3",
    "unit/type/set",
    "unit/type/zset",
    "unit/type/hash",
    "unit/keyspace",
    "unit/expire",
    "unit/scan",
    "unit/multi",
]

DENY_TAGS = ["needs:debug", "needs:repl", "needs:config-maxmemory"]

# Single tests left out for both servers, as the framework's --skiptest takes them (a name, or
# a regexp after '/'), each with its reason.
SKIPS = [
    # It reads the pid of the server's fork child, which the framework only knows for servers
    # it started itself: an exception against any external server, which ends the file.
    ("SRANDMEMBER with a dict containing long chain",
     "needs the pid of a server the framework spawned (an exception on any external server)"),
    # Streams are not among memkeep's types (XADD is an unknown command: an exception).
    ("COPY basic usage for stream", "streams (XADD) are not implemented"),
    ("COPY basic usage for stream-cgroups", "streams (XADD) are not implemented"),
    # SORT is not implemented (an unknown command: an exception that ends unit/multi).
    ("EXEC fail on WATCHed key modified by SORT with STORE even if the result is empty",
     "SORT is not implemented"),
    (r"/^(BLPOP|BRPOP|BLMPOP_LEFT|BLMPOP_RIGHT) when result key is created by SORT\.\.STORE$",
     "SORT is not implemented (2 tests: BLPOP, BLMPOP_LEFT)"),
    # Its transaction ends with XREAD and XREADGROUP, after the list and sorted-set pops.
    ("Blocking commands ignores the timeout", "streams (XGROUP, XREADGROUP) are not implemented"),
    # Runs only where INFO reports jemalloc, and checks through MEMORY USAGE that Redis trims
    # the query buffer it keeps as a big value's string: Redis's memory internals.
    ("trim on SET with big value", "Redis's query-buffer trimming under jemalloc"),
]

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE = re.compile(r"^\[(ok|err|skip|ignore|exception|TIMEOUT)\]: ?(.*)$")


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "memkeep")


def fetch_tarball():
    """The tarball's path in the cache, downloaded and checked if it is not there yet."""
    d = cache_dir()
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "redis_" + REDIS_VERSION + ".orig.tar.gz")
    if os.path.exists(path) and sha256_of(path) == TARBALL_SHA256:
        return path
    print(f"downloading {TARBALL_URL} into {d}", flush=True)
    part = path + ".part"
    try:
        with urllib.request.urlopen(TARBALL_URL, timeout=60) as resp, open(part, "wb") as out:
            shutil.copyfileobj(resp, out)
    except OSError as e:
        sys.exit(f"redis-tcl-suite: cannot download {TARBALL_URL}: {e}")
    got = sha256_of(part)
    if got != TARBALL_SHA256:
        os.unlink(part)
        sys.exit(f"redis-tcl-suite: {TARBALL_URL} has sha256 {got}, expected {TARBALL_SHA256}")
    os.replace(part, path)
    return path


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def unpack(tarball, dest):
    """Unpacks `runtest` and `tests/` only; returns the directory runtest runs from."""
    top = "redis-" + REDIS_VERSION
    with tarfile.open(tarball) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.name == top + "/runtest" or m.name.startswith(top + "/tests/")
        ]
        for m in members:
            if not (m.isfile() or m.isdir()) or ".." in m.name.split("/"):
                continue
            tar.extract(m, dest)
    return os.path.join(dest, top)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def framework_baseport():
    """A --baseport for the framework. Its test server listens on the first port of
    [baseport-32, baseport) it can bind (and port+10000 too), but its probe binds the wildcard
    address while the server binds 127.0.0.1, so two runs at once both pick baseport-32 and the
    second fails: each run starts at a random port whose two ports are free now."""
    for _attempt in range(100):
        port = random.randrange(20000, 30000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port + 32
        except OSError:
            continue
    return 21111


def wait_ping(port, proc, secs=30):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"*1\r\n$4\r\nPING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


class Server:
    """One server for one test file: memkeep or redis-server on a free loopback port."""

    def __init__(self, kind, memkeep_bin, workdir):
        self.kind = kind
        self.dir = tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir)
        self.proc = None
        self.port = None
        for _attempt in range(5):
            self.port = free_port()
            if kind == "memkeep":
                cmd = [memkeep_bin, "-H", self.dir, "--sync", "never", "-p", "0",
                       "--resp-port", str(self.port), "-l", "127.0.0.1"]
            else:
                cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                       "--save", "", "--appendonly", "no", "--dir", self.dir]
            log = open(os.path.join(self.dir, "server.log"), "wb")
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            if wait_ping(self.port, self.proc):
                return
            self.stop()
        raise RuntimeError(f"{kind} did not start; see {self.dir}/server.log")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def parse(output):
    """Counts of ok/err names, skipped names, and whether an exception or timeout ended the run."""
    ok, err, skipped = collections.Counter(), collections.Counter(), collections.Counter()
    aborted = None
    for raw in output.splitlines():
        line = ANSI.sub("", raw)
        m = LINE.match(line)
        if not m:
            continue
        status, rest = m.groups()
        if status == "ok":
            ok[re.sub(r" \(\d+ ms\)$", "", rest)] += 1
        elif status == "err":
            err[re.sub(r" in tests/\S+\.tcl$", "", rest)] += 1
        elif status in ("skip", "ignore"):
            skipped[rest] += 1
        elif aborted is None:
            aborted = f"{status}: {rest}"
    return ok, err, skipped, aborted


def run_file(kind, unit, rdir, memkeep_bin, workdir, timeout, logdir):
    server = Server(kind, memkeep_bin, workdir)
    args = ["tclsh", "tests/test_helper.tcl", "--host", "127.0.0.1", "--port", str(server.port),
            "--singledb", "--ignore-encoding", "--tags", " ".join("-" + t for t in DENY_TAGS),
            "--single", unit, "--timeout", str(timeout), "--clients", "1",
            "--baseport", str(framework_baseport())]
    for name, _why in SKIPS:
        args += ["--skiptest", name]
    # Its own session, so a run stopped by the wall clock takes the test clients it spawned
    # (tclsh processes of their own) with it.
    proc = subprocess.Popen(args, cwd=rdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        raw, _ = proc.communicate(timeout=max(900, 5 * timeout))
        out = raw.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raw, _ = proc.communicate()
        out = raw.decode("utf-8", "replace") + "\n[TIMEOUT]: wall clock\n"
    finally:
        server.stop()
    if logdir:
        with open(os.path.join(logdir, f"{kind}-{unit.replace('/', '_')}.log"), "w") as f:
            f.write(out)
    return parse(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memkeep", default="target/release/memkeep")
    ap.add_argument("--files", default=",".join(FILES), help="comma-separated units")
    ap.add_argument("--threshold", type=float, default=95.0, help="percent; exit 1 below")
    ap.add_argument("--timeout", type=int, default=120, help="seconds without progress")
    ap.add_argument("--logs", help="keep each run's output in this directory")
    ap.add_argument("--failures", action="store_true", help="list memkeep's failing tests")
    ap.add_argument("--baseline", help="a JSON file of redis-server's results: read when it "
                    "exists (the redis-server runs are then skipped), written when it does not")
    opts = ap.parse_args()

    if shutil.which("tclsh") is None:
        sys.exit("redis-tcl-suite: tclsh not found (Debian package `tcl`; `make deps`)")
    if shutil.which("redis-server") is None:
        sys.exit("redis-tcl-suite: redis-server not found (`make deps`)")
    memkeep_bin = os.path.abspath(opts.memkeep)
    if not os.access(memkeep_bin, os.X_OK):
        sys.exit(f"redis-tcl-suite: no memkeep at {memkeep_bin} (cargo build --release)")
    version = subprocess.run(["redis-server", "--version"], stdout=subprocess.PIPE).stdout
    if f"v={REDIS_VERSION}".encode() not in version:
        print(f"warning: the baseline redis-server is not {REDIS_VERSION}: {version.decode().strip()}")
    if opts.logs:
        os.makedirs(opts.logs, exist_ok=True)

    tarball = fetch_tarball()
    workdir = tempfile.mkdtemp(prefix="memkeep-redis-tcl-")
    started = time.monotonic()
    try:
        rdir = unpack(tarball, workdir)
        rows, failures = [], []
        saved = {}
        if opts.baseline and os.path.exists(opts.baseline):
            with open(opts.baseline) as f:
                saved = json.load(f)
        for unit in opts.files.split(","):
            if unit in saved:
                ok, err, skip, base_abort = saved[unit]
                base_ok, base_err, base_skip = (collections.Counter(c) for c in (ok, err, skip))
            else:
                base_ok, base_err, base_skip, base_abort = run_file(
                    "redis", unit, rdir, memkeep_bin, workdir, opts.timeout, opts.logs)
                saved[unit] = (base_ok, base_err, base_skip, base_abort)
            mk_ok, mk_err, mk_skip, mk_abort = run_file(
                "memkeep", unit, rdir, memkeep_bin, workdir, opts.timeout, opts.logs)
            denom = sum(base_ok.values())
            passed = sum(min(n, mk_ok[name]) for name, n in base_ok.items())
            for name, n in base_ok.items():
                for _ in range(n - min(n, mk_ok[name])):
                    why = "failed" if mk_err[name] else "did not run"
                    failures.append((unit, name, why))
            rows.append((unit, denom, passed, sum(base_err.values()), sum(base_skip.values()),
                         sum(mk_skip.values()), base_abort, mk_abort,
                         sum(n for name, n in mk_ok.items() if name not in base_ok)))
            print(f"{unit}: {passed}/{denom}" + (f"  ({mk_abort})" if mk_abort else ""),
                  flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if opts.baseline:
        with open(opts.baseline, "w") as f:
            json.dump(saved, f, indent=1)

    print()
    print("| file | redis ok | redis err | skipped | memkeep ok | memkeep failed | "
          "memkeep rate |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    tot_d = tot_p = 0
    for unit, denom, passed, berr, bskip, mskip, babort, mabort, _extra in rows:
        tot_d += denom
        tot_p += passed
        rate = 100.0 * passed / denom if denom else 100.0
        print(f"| {unit} | {denom} | {berr} | {bskip} | {passed} | {denom - passed} | "
              f"{rate:.1f}% |")
    total = 100.0 * tot_p / tot_d if tot_d else 0.0
    print(f"| **total** | {tot_d} | | | {tot_p} | {tot_d - tot_p} | **{total:.1f}%** |")
    for unit, *_r, babort, mabort, _extra in rows:
        if babort:
            print(f"note: redis-server's run of {unit} ended early: {babort.splitlines()[0]}")
        if mabort:
            print(f"note: memkeep's run of {unit} ended early: {mabort.splitlines()[0]}")
    # What redis-server's runs left out, and why (an `ignore` line can stand for a block).
    why = collections.Counter()
    for unit in opts.files.split(","):
        for name, n in collections.Counter(saved[unit][2]).items():
            m = re.search(r"(?:^|: )(Tag: \S+ denied|Not supported on .*|large memory flag .*)$",
                          name)
            why[m.group(1) if m else "the skip list (SKIPS)"] += n
    print("left out of redis-server's runs: " + ", ".join(f"{n} by {r}" for r, n in why.most_common()))
    print(f"{time.monotonic() - started:.0f} s")
    if opts.failures:
        for unit, name, why in failures:
            print(f"FAIL {unit}: {name} ({why})")
    # The denominator is only honest if redis-server ran every file to its end.
    broken = [unit for unit, denom, *_r, babort, _mabort, _extra in rows if babort or not denom]
    if broken:
        print(f"redis-tcl-suite: the baseline redis-server runs of {', '.join(broken)} ended "
              "early or passed nothing; the rate would be over a partial denominator")
        return 1
    if total < opts.threshold:
        print(f"redis-tcl-suite: {total:.1f}% passed, below the {opts.threshold}% threshold")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
