#!/usr/bin/env python3
"""Benchmarks memkeep against memcached and redis-server side by side; writes BENCHMARKS.md.

Usage (from the repo root; `make bench` / `make bench-quick` run it through ./.venv/bin/python):

    bench/run.py [--only W1,W2,W3,W3b,W3z,W4,restart,scaling,multi,queue,eval,edits] [--scale 0.1] [--out BENCHMARKS.md]
                 [--chart bench/throughput.svg] [--keep-json PATH] [--servers a,b,...]
    bench/run.py --from-json results.jsonl --out BENCHMARKS.md   # re-render a finished run

Every server is started by this script on free loopback ports with its own temporary data
directory, fresh for each workload, and stopped again (SIGTERM, then SIGKILL) when the workload
ends, on an exception, on Ctrl-C or on SIGTERM. Every child process runs with a timeout.

Servers:
  memkeep-always / -periodic / -never  memkeep in each sync mode (memcached text protocol on -p,
                                       RESP on --resp-port)
  memcached                            memcached -l 127.0.0.1 -U 0 -m 4096 -t 2
  redis-nopersist / -everysec / -always redis-server with persistence off, AOF fsync'd every
                                       second, AOF fsync'd on every write

Workloads (N is multiplied by --scale):
  W1       memkeep-bench, 16 connections, 100-byte values, SET all N keys then GET all
  W2       the same with 20 KiB values
  W3       redis-benchmark -t set,get,incr,lpush,lpop,lrange,mset (one test per invocation)
  W3b      redis-benchmark custom hash / sorted-set commands, in order, on one fresh server
  W3z      rank reads on one sorted set of 100,000 members (ZRANK, ZREVRANK, ZRANGE by rank in
           the middle, ZCOUNT), redis-benchmark -c 50 -r 100000; memkeep-never vs redis-nopersist
  W4       pogreb-bench shapes over the memcached protocol: (a) 16-64-byte keys with
           128-512-byte values, 2 connections; (b) 8-byte keys with 16-byte values at 10 and 100
           connections; on-disk size after the puts and after the gets
  restart  after W1, stop each durable server and time from process start to the first GET of
           an old key that succeeds; then verify every key
  scaling  W1's SET (100-byte values) at 1, 2, 4, 16 and 64 connections, each point a fresh
           server stopped after --scaling-secs seconds, for memkeep-always vs redis-always,
           memkeep-never vs memcached and memkeep-periodic vs memkeep-never; a table of those
           ratios per connection count (runs alone with --only scaling); every point runs
           --rounds times (default 2), the servers in turn, every other round in reverse order,
           and the report takes the median (so do multi and queue)
  multi    memkeep-bench --multi 10 over RESP: transactions of MULTI, 10 SETs (100-byte
           values), EXEC, at 1 and 16 connections, then every key read back; memkeep-always vs
           redis-always, each point a fresh server, at most --durable-secs seconds of SETs
  eval     redis-benchmark -n 50000 EVAL "return redis.call('INCR', KEYS[1])" 1 counter (50
           clients): memkeep-always vs redis-always, memkeep-never vs redis-nopersist
  edits    small edits of large values: redis-benchmark -c 16 APPEND of 16 bytes to a 1 MiB
           string, SETRANGE of 16 bytes inside it, BITFIELD INCRBY of a byte of a 1 MiB bitmap:
           memkeep-always vs redis-always, memkeep-never vs redis-nopersist
  queue    memkeep-bench's queue phase: P producers LPUSH 100-byte messages, C consumers BRPOP
           them, every message checked delivered exactly once; (P, C) = (1, 1) and (8, 8);
           memkeep-always vs redis-always, messages per second, at most --durable-secs seconds
           of pushes

The `## Data larger than memory` section that bench/bigdata.py (`make bench-bigdata`) writes
into --out is kept as it is when this script rewrites the file.

Per server and phase it records throughput and latency (memkeep-bench --json / redis-benchmark
--csv), server CPU seconds (utime+stime of /proc/PID/stat, plus cutime+cstime of reaped children:
redis's AOF-rewrite forks), peak memory (VmHWM of /proc/PID/status, and RssAnon sampled every
100 ms since LMDB's mapped pages count as file RSS), and the data directory's allocated size.
Python 3.11 standard library; matplotlib only for the chart (skipped with a warning if missing).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import os
import platform
import re
import shlex
import statistics
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
ALL_WORKLOADS = ["W1", "W2", "W3", "W3b", "W3z", "W4", "restart", "scaling", "multi", "queue", "tls", "eval",
                 "edits"]

MEMKEEP_MODES = {
    "memkeep-always": ["--sync", "always"],
    "memkeep-periodic": ["--sync", "periodic", "--sync-interval-ms", "1000"],
    "memkeep-never": ["--sync", "never"],
}
# W2 only: memkeep with values of 8 KiB and more only in the log (value_log_min, off by
# default), beside the same sync mode without.
VLOG_MODES = {
    "memkeep-always-vlog": ["--sync", "always", "--value-log-min", "8k"],
    "memkeep-never-vlog": ["--sync", "never", "--value-log-min", "8k"],
}
REDIS_MODES = {
    "redis-nopersist": ["--appendonly", "no"],
    "redis-everysec": ["--appendonly", "yes", "--appendfsync", "everysec"],
    "redis-always": ["--appendonly", "yes", "--appendfsync", "always"],
}
ALL_SERVERS = list(MEMKEEP_MODES) + ["memcached"] + list(REDIS_MODES)
# The connection sweep: (server, reference, what the pair compares).
SCALING_CONNS = (1, 2, 4, 16, 64)
SCALING_PAIRS = [
    ("memkeep-always", "redis-always", "every write fsync'd before the reply"),
    ("memkeep-never", "memcached", "no fsync"),
    ("memkeep-periodic", "memkeep-never", "cost of an fsync every second"),
]
DURABLE = ["memkeep-always", "memkeep-periodic", "memkeep-never", "redis-everysec", "redis-always"]
# The transaction and queue workloads compare the servers that make every write durable before
# its reply.
DURABLE_PAIR = ("memkeep-always", "redis-always")
MULTI_SIZE = 10
MULTI_CONNS = (1, 16)
QUEUE_SHAPES = ((1, 1), (8, 8))  # (producers, consumers)

W3_TESTS = ["set", "get", "incr", "lpush", "lpop", "lrange", "mset"]
W3B_COMMANDS = [
    "HSET h __rand_int__ __rand_int__",
    "HGET h __rand_int__",
    "HINCRBY h c:__rand_int__ 1",
    "HDEL h __rand_int__",
    "ZADD z __rand_int__ __rand_int__",
    "ZINCRBY z 1 __rand_int__",
    "ZRANGE z 0 9",
    "ZRANGE z 0 49",
    "ZRANGEBYSCORE z __rand_int__ +inf WITHSCORES LIMIT 0 100",
    "ZREVRANGE z 0 9",
    "ZREVRANGE z 0 49",
    "ZREVRANGEBYSCORE z __rand_int__ -inf WITHSCORES LIMIT 0 100",
    "ZREM z __rand_int__",
]
# W3z: a set of W3Z_MEMBERS members named as redis-benchmark's __rand_int__ prints them (12
# digits), member i scored i; every command reads at a random member or rank.
W3Z_MEMBERS = 100_000
W3Z_COMMANDS = [
    "ZRANK z __rand_int__",
    "ZREVRANK z __rand_int__",
    "ZRANGE z 50000 50009",
    "ZCOUNT z __rand_int__ +inf",
]
W3Z_SERVERS = ["memkeep-never", "redis-nopersist"]
# tls: redis-benchmark --tls (16 clients) and openssl s_time's full handshakes per second on the
# TLS port of each server, both with one self-signed RSA-2048 certificate made for the run.
TLS_SERVERS = ["memkeep-never", "redis-nopersist"]
# eval: one Lua script per request, each a durable INCR (compared at the same durability).
EVAL_SERVERS = ["memkeep-always", "memkeep-never", "redis-nopersist", "redis-always"]
EVAL_SCRIPT = "return redis.call('INCR', KEYS[1])"
EVAL_TESTS = ["eval"]
# edits: a 1 MiB string and a 1 MiB bitmap, each request changing a few bytes of one of them (a
# whole-value write per request in a store that logs whole values; memkeep logs the change).
EDITS_SERVERS = EVAL_SERVERS
EDITS_SIZE = 1 << 20
EDITS_COMMANDS = [
    "APPEND big 0123456789abcdef",
    "SETRANGE big 500000 0123456789abcdef",
    "BITFIELD bits INCRBY u8 #70000 1",
]
TLS_TESTS = ["set", "get"]

# Every live server process, so that `finally` can stop whatever is left.
LIVE: dict[int, "Server"] = {}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class BenchError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# /proc readings
# ---------------------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float | None:
    """utime+stime+cutime+cstime of a process, in seconds (all threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); utime=14, stime=15, cutime=16, cstime=17.
    return sum(int(rest[i]) for i in (11, 12, 13, 14)) / CLK_TCK


def proc_mem(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssFile in KiB."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def du(path: Path | None) -> int | None:
    """Allocated bytes (st_blocks) under path, each inode once; None without a path."""
    if path is None or not path.exists():
        return None
    seen = set()
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def fsync_probe(directory: Path, n: int = 30) -> dict:
    """fdatasync latency of the data directories' disk: n rewrites of a 4 KiB block, each synced
    (what LMDB's and redis's sync-always commits wait for). The disk is shared, so it drifts."""
    path = directory / f"fsync-probe.{os.getpid()}"
    lat = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        block = os.urandom(4096)
        for i in range(n):
            os.pwrite(fd, block, (i % 16) * 4096)
            t = time.perf_counter()
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    lat.sort()
    return {"p50_ms": lat[len(lat) // 2], "p90_ms": lat[int(len(lat) * 0.9)], "max_ms": lat[-1]}


class MemSampler(threading.Thread):
    """Samples RssAnon (and VmHWM) of every live server every 100 ms; keeps the peaks."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.1):
            for srv in list(LIVE.values()):
                srv.sample_mem()


# ---------------------------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def server_argv(name: str, bins: dict, mc_port: str, resp_port: str, data_dir: str, logfile: str) -> list[str]:
    """The exact command line of a server (placeholders allowed, for the report)."""
    if name in MEMKEEP_MODES or name in VLOG_MODES:
        mode = MEMKEEP_MODES.get(name) or VLOG_MODES[name]
        return [bins["memkeep"], "-p", mc_port, "--resp-port", resp_port, "-l", "127.0.0.1", "-H", data_dir] + mode
    if name == "memcached":
        argv = [bins["memcached"], "-p", mc_port, "-l", "127.0.0.1", "-U", "0", "-m", "4096", "-t", "2"]
        if os.geteuid() == 0:
            argv += ["-u", "root"]
        return argv
    if name in REDIS_MODES:
        return [bins["redis-server"], "--port", resp_port, "--bind", "127.0.0.1", "--save", ""] + REDIS_MODES[name] + [
            "--dir", data_dir, "--logfile", logfile]
    raise ValueError(name)


def protocols(name: str) -> list[str]:
    if name in MEMKEEP_MODES or name in VLOG_MODES:
        return ["memcache", "resp"]
    if name == "memcached":
        return ["memcache"]
    return ["resp"]


def try_get(port: int, proto: str, key: bytes, timeout: float = 1.0) -> bool:
    """One GET of key; True when a value comes back."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            if proto == "memcache":
                s.sendall(b"get " + key + b"\r\n")
                buf = b""
                while not (buf.endswith(b"END\r\n") or b"ERROR" in buf):
                    chunk = s.recv(65536)
                    if not chunk:
                        return False
                    buf += chunk
                return buf.startswith(b"VALUE " + key + b" ")
            s.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key))
            head = s.recv(65536)
            return head.startswith(b"$") and not head.startswith(b"$-1")
    except OSError:
        return False


def ping(port: int, proto: str, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            if proto == "memcache":
                s.sendall(b"version\r\n")
                return s.recv(4096).startswith(b"VERSION")
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(4096).startswith(b"+PONG")
    except OSError:
        return False


class Server:
    def __init__(self, name: str, bins: dict, tmp: Path, tag: str):
        self.name = name
        self.bins = bins
        self.mc_port, self.resp_port = free_ports(2)
        self.data_dir: Path | None = None
        if name != "memcached":
            self.data_dir = Path(tempfile.mkdtemp(prefix=f"{name}.{tag}.", dir=tmp / "data"))
        self.logfile = tmp / "logs" / f"{name}.{tag}.{self.mc_port}.log"
        self.proc: subprocess.Popen | None = None
        # Flags after the usual ones (the tls workload's TLS port and certificate).
        self.extra: list[str] = []
        self.tls_port = 0
        self.peak_anon = 0
        self.peak_hwm = 0
        self.start_s: float | None = None

    @property
    def argv(self) -> list[str]:
        return server_argv(self.name, self.bins, str(self.mc_port), str(self.resp_port),
                           str(self.data_dir or ""), str(self.logfile)) + self.extra

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def port(self, proto: str) -> int:
        return self.mc_port if proto == "memcache" else self.resp_port

    def spawn(self) -> float:
        """Starts the process; returns the monotonic time just before the exec."""
        out = open(self.logfile, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        out.close()
        self.peak_anon = 0
        self.peak_hwm = 0
        LIVE[self.proc.pid] = self
        return t0

    def start(self, timeout: float = 30.0) -> None:
        t0 = self.spawn()
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode} at start:\n{self.log_tail()}")
            if all(ping(self.port(p), p) for p in protocols(self.name)):
                self.start_s = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name} not ready within {timeout} s:\n{self.log_tail()}")
            time.sleep(0.005)

    def log_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def cpu(self) -> float | None:
        return proc_cpu(self.pid) if self.proc else None

    def sample_mem(self) -> dict[str, int]:
        if not self.proc or self.proc.poll() is not None:
            return {}
        m = proc_mem(self.proc.pid)
        self.peak_anon = max(self.peak_anon, m.get("RssAnon", 0))
        self.peak_hwm = max(self.peak_hwm, m.get("VmHWM", 0))
        return m

    def disk(self) -> int | None:
        return du(self.data_dir)

    def stop(self, timeout: float = 60.0) -> tuple[float, int | None]:
        """SIGTERM, wait, SIGKILL if needed; returns (seconds to exit, exit code)."""
        if not self.proc:
            return 0.0, None
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{self.name}: no exit {timeout} s after SIGTERM; SIGKILL")
                self.proc.kill()
                self.proc.wait(10)
        LIVE.pop(self.proc.pid, None)
        return time.monotonic() - t0, self.proc.returncode

    def cleanup(self) -> None:
        self.stop()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def stop_all() -> None:
    for srv in list(LIVE.values()):
        try:
            srv.stop(timeout=15)
        except Exception as e:  # noqa: BLE001 - best effort while tearing down
            log(f"stopping {srv.name}: {e}")
            try:
                srv.proc.kill()
            except Exception:  # noqa: BLE001
                pass


# ---------------------------------------------------------------------------------------------
# Raw key+value bytes of a memkeep-bench workload (mirrors src/bin/memkeep-bench.rs)
# ---------------------------------------------------------------------------------------------

M64 = (1 << 64) - 1
SALT_KEY_LEN = 0x6B65_796C_656E
SALT_VALUE_LEN = 0x7661_6C6C_656E


def mix(x: int) -> int:
    x = (x + 0x9E37_79B9_7F4A_7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58_476D_1CE4_E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D0_49BB_1331_11EB) & M64
    return x ^ (x >> 31)


def raw_bytes(keys: int, vmin: int, vmax: int, kmin: int | None = None, kmax: int | None = None) -> int:
    """Sum of key and value lengths over keys 1..=keys, exactly as memkeep-bench makes them."""
    total = 0
    if kmin is None or kmin == kmax:
        lo = kmin or 0
        d, start = 1, 1
        while start <= keys:
            end = min(keys, start * 10 - 1)
            total += (end - start + 1) * max(d, lo)
            d, start = d + 1, start * 10
    else:
        span = kmax - kmin + 1
        total += sum(max(len(str(i)), kmin + mix(i ^ SALT_KEY_LEN) % span) for i in range(1, keys + 1))
    if vmin == vmax:
        total += keys * vmin
    else:
        span = vmax - vmin + 1
        total += sum(vmin + mix(i ^ SALT_VALUE_LEN) % span for i in range(1, keys + 1))
    return total


# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------


class Runner:
    def __init__(self, args: argparse.Namespace, bins: dict, tmp: Path, jsonl: Path):
        self.args = args
        self.bins = bins
        self.tmp = tmp
        self.jsonl = jsonl
        self.records: list[dict] = []
        self.commands: dict[str, str] = {}
        self.failures: list[str] = []
        self.servers = [s for s in ALL_SERVERS if not args.servers or s in args.servers]

    def n(self, base: int) -> int:
        return max(200, int(round(base * self.args.scale)))

    def record(self, rec: dict) -> None:
        rec["ts"] = time.time()
        self.records.append(rec)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def fail(self, msg: str) -> None:
        log("FAILED: " + msg)
        self.failures.append(msg)

    def new_server(self, name: str, tag: str) -> Server:
        srv = Server(name, self.bins, self.tmp, tag)
        srv.start()
        return srv

    # -- memkeep-bench -------------------------------------------------------------------------

    def bench_argv(self, port: str, proto: str, conns: int, keys: int, phase: str, shape: dict,
                   cap: float | None = None, flags: list[str] | None = None) -> list[str]:
        argv = [self.bins["memkeep-bench"], "--host", "127.0.0.1", "--port", port, "--protocol", proto,
                "--connections", str(conns), "--keys", str(keys), "--value-size", str(shape["vmin"])]
        if shape["vmax"] != shape["vmin"]:
            argv += ["--value-size-max", str(shape["vmax"])]
        if shape.get("kmin") is not None:
            argv += ["--key-size-min", str(shape["kmin"]), "--key-size-max", str(shape["kmax"])]
        argv += ["--phases", phase, "--json", "--timeout", "10", "--duration-limit", f"{cap or self.args.phase_cap:g}"]
        return argv + (flags or [])

    def bench_phase(self, srv: Server, workload: str, proto: str, conns: int, keys: int, phase: str,
                    shape: dict, extra: dict | None = None, cap: float | None = None,
                    flags: list[str] | None = None) -> dict:
        argv = self.bench_argv(str(srv.port(proto)), proto, conns, keys, phase, shape, cap, flags)
        tmpl = self.bench_argv("$PORT", proto, conns, keys, phase, shape, cap, flags)
        tmpl[0] = "memkeep-bench"
        what = f"{conns} conns" + (f", {' '.join(flags)}" if flags else "")
        self.commands.setdefault(f"{workload} {phase} ({proto}, {what})", shlex.join(tmpl))
        probe = (fsync_probe(self.tmp / "data", 20)
                 if srv.name.endswith("-always") and phase in ("set", "queue") else None)
        cpu0 = srv.cpu()
        rec = {"type": "phase", "workload": workload, "server": srv.name, "proto": proto, "phase": phase,
               "connections": conns, "keys": keys, "shape": {k: v for k, v in shape.items() if k != "raw"}}
        rec.update(extra or {})
        if probe:
            rec["fsync_p50_ms"] = probe["p50_ms"]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=(cap or self.args.phase_cap) + 60)
        except subprocess.TimeoutExpired:
            rec["error"] = "memkeep-bench timed out"
            p = None
        cpu1 = srv.cpu()
        m = srv.sample_mem()
        if p is not None:
            rec["exit"] = p.returncode
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if lines:
                rec.update(json.loads(lines[-1]))
            if p.returncode != 0:
                rec["error"] = f"memkeep-bench exit {p.returncode}: {p.stderr.strip()[-400:]}"
        rec["cpu_s"] = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        if rec.get("ops") and rec["cpu_s"] is not None:
            rec["cpu_s_per_M"] = rec["cpu_s"] / rec["ops"] * 1e6
        rec["vmhwm_kb"] = m.get("VmHWM")
        rec["rss_kb"] = m.get("VmRSS")
        rec["rss_anon_kb"] = m.get("RssAnon")
        rec["rss_anon_peak_kb"] = srv.peak_anon
        rec["disk_bytes"] = srv.disk()
        rec["raw_bytes"] = shape["raw"](keys)
        rec["cmd"] = shlex.join(tmpl)
        self.record(rec)
        ops_s = rec.get("ops_per_sec")
        log(f"  {workload} {srv.name:16} {proto:8} c={conns:<3} {phase}: "
            f"{ops_s if ops_s is not None else '-'} ops/s p99 {rec.get('p99_ms', '-')} ms"
            + (f"  disk {rec['disk_bytes'] / 1e6:.1f} MB" if rec["disk_bytes"] is not None else "")
            + (f"  ERROR {rec['error']}" if rec.get("error") else ""))
        if rec.get("error") or rec.get("mismatches") or rec.get("misses"):
            self.fail(f"{workload} {srv.name} {proto} {phase}: error={rec.get('error')} "
                      f"misses={rec.get('misses')} mismatches={rec.get('mismatches')} errors={rec.get('errors')}")
        return rec

    def server_summary(self, srv: Server, workload: str, requests: int | None = None, extra: dict | None = None) -> None:
        m = srv.sample_mem()
        rec = {"type": "server", "workload": workload, "server": srv.name, "start_s": srv.start_s,
               "cpu_s": srv.cpu(), "vmhwm_kb": m.get("VmHWM"), "rss_anon_kb": m.get("RssAnon"),
               "rss_anon_peak_kb": srv.peak_anon, "disk_bytes": srv.disk(), "requests": requests,
               "argv": shlex.join(server_argv(srv.name, {"memkeep": "memkeep", "memcached": "memcached",
                                                         "redis-server": "redis-server"},
                                              "$MC_PORT", "$RESP_PORT", "$DIR", "$DIR/../redis.log"))}
        rec.update(extra or {})
        self.record(rec)

    # -- W1 / W2 / restart ---------------------------------------------------------------------

    def kv_targets(self) -> list[tuple[str, str]]:
        t = [(s, "memcache") for s in self.servers if s in MEMKEEP_MODES or s == "memcached"]
        t += [(s, "resp") for s in self.servers if s in REDIS_MODES]
        t += [(s, "resp") for s in self.servers if s in MEMKEEP_MODES]
        return t

    def run_w12(self, workload: str, keys: int, value: int, do_restart: bool) -> None:
        shape = {"vmin": value, "vmax": value, "raw": lambda k, v=value: raw_bytes(k, v, v)}
        conns = 16
        record_w = workload in self.args.only
        targets = self.kv_targets()
        if workload == "W2" and record_w:
            targets += [(v, "memcache") for v in VLOG_MODES if v.removesuffix("-vlog") in self.servers]
        for name, proto in targets:
            restart_here = do_restart and name in DURABLE and (proto == "memcache" or name in REDIS_MODES)
            if not record_w and not restart_here:
                continue
            srv = self.new_server(name, workload)
            try:
                self.bench_phase(srv, workload if record_w else f"{workload}-load", proto, conns, keys, "set", shape)
                if record_w:
                    self.bench_phase(srv, workload, proto, conns, keys, "get", shape)
                    self.server_summary(srv, workload, requests=2 * keys, extra={"proto": proto})
                if restart_here:
                    self.restart(srv, proto, keys, conns, shape)
            except BenchError as e:
                self.fail(f"{workload} {name} {proto}: {e}")
            finally:
                srv.cleanup()

    def restart(self, srv: Server, proto: str, keys: int, conns: int, shape: dict) -> None:
        disk_before = srv.disk()
        stop_s, code = srv.stop()
        rec = {"type": "restart", "server": srv.name, "proto": proto, "keys": keys, "disk_bytes": disk_before,
               "raw_bytes": shape["raw"](keys), "stop_s": stop_s, "stop_exit": code, "empty_start_s": srv.start_s}
        t0 = srv.spawn()
        deadline = t0 + 120
        first = None
        while time.monotonic() < deadline:
            if srv.proc.poll() is not None:
                rec["error"] = f"exited with {srv.proc.returncode} on restart: {srv.log_tail(5)}"
                break
            if try_get(srv.port(proto), proto, b"1", timeout=2.0):
                first = time.monotonic() - t0
                break
            time.sleep(0.002)
        else:
            rec["error"] = "no successful GET within 120 s of restart"
        rec["first_get_s"] = first
        if first is not None:
            # Wait for the other port too (memkeep), then check every key survived.
            for p in protocols(srv.name):
                end = time.monotonic() + 30
                while not ping(srv.port(p), p) and time.monotonic() < end:
                    time.sleep(0.01)
            v = self.bench_phase(srv, "restart-verify", proto, conns, keys, "get", shape)
            rec["verify_misses"] = v.get("misses")
            rec["verify_mismatches"] = v.get("mismatches")
            rec["verify_errors"] = v.get("errors")
            rec["verify_ops_per_sec"] = v.get("ops_per_sec")
        rec["disk_after_bytes"] = srv.disk()
        self.record(rec)
        log(f"  restart {srv.name:16}: stop {stop_s:.3f} s, first GET {first} s, disk {disk_before}")
        if rec.get("error"):
            self.fail(f"restart {srv.name}: {rec['error']}")

    # -- W3 / W3b ------------------------------------------------------------------------------

    def resp_servers(self) -> list[str]:
        return [s for s in self.servers if s in MEMKEEP_MODES] + [s for s in self.servers if s in REDIS_MODES]

    def redis_benchmark(self, srv: Server, workload: str, argv_tail: list[str], label: str,
                        extra: dict | None = None) -> list[dict]:
        argv = [self.bins["redis-benchmark"], "-h", "127.0.0.1", "-p", str(srv.resp_port)] + argv_tail
        tmpl = ["redis-benchmark", "-h", "127.0.0.1", "-p", "$PORT"] + argv_tail
        self.commands.setdefault(f"{workload} {label}", shlex.join(tmpl))
        t0 = time.monotonic()
        cpu0 = srv.cpu()
        err = None
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=self.args.rb_timeout,
                               stdin=subprocess.DEVNULL)
            out, stderr, code = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr, code = "", None
            err = f"timed out after {self.args.rb_timeout} s"
        cpu1 = srv.cpu()
        rows = []
        for row in csv.reader(io.StringIO(out)):
            if len(row) >= 2 and row[0] != "test":
                try:
                    rows.append((row[0], float(row[1]), row))
                except ValueError:
                    pass
        errtext = " ".join(ln.strip() for ln in (stderr + "\n" + out).splitlines()
                           if "rror" in ln or "ERR" in ln)[:300]
        if code not in (0, None) and err is None:
            err = f"exit {code}: {errtext or stderr.strip()[-300:]}"
        elif errtext and err is None:
            err = errtext
        recs = []
        for test, rps, row in rows:
            rec = {"type": "rb", "workload": workload, "server": srv.name, "label": label, "test": test, "rps": rps,
                   "avg_ms": _f(row, 2), "p50_ms": _f(row, 4), "p99_ms": _f(row, 6), "max_ms": _f(row, 7),
                   "cmd": shlex.join(tmpl)}
            recs.append(rec)
        if err or not rows:
            recs.append({"type": "rb", "workload": workload, "server": srv.name, "label": label,
                         "test": label if not rows else f"{label} (rest)", "rps": None,
                         "error": err or "no result line", "cmd": shlex.join(tmpl)})
        secs = time.monotonic() - t0
        for rec in recs:
            rec["secs"] = secs
            rec["cpu_s"] = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
            rec.update(extra or {})
            self.record(rec)
        summary = ", ".join(f"{r['test']}={r['rps']:.0f}" if r.get("rps") else f"{r['test']}=ERROR" for r in recs)
        log(f"  {workload} {srv.name:16} {summary}" + (f"  [{err}]" if err else ""))
        if err:
            self.fail(f"{workload} {srv.name} {label}: {err}")
        return recs

    def run_w3(self) -> None:
        n = self.n(self.args.n_w3)
        for name in self.resp_servers():
            srv = self.new_server(name, "W3")
            try:
                reqs = 0
                for t in W3_TESTS:
                    recs = self.redis_benchmark(srv, "W3", ["-n", str(n), "-t", t, "--csv"], t)
                    reqs += n * sum(1 for r in recs if r.get("rps"))
                self.server_summary(srv, "W3", requests=reqs)
            except BenchError as e:
                self.fail(f"W3 {name}: {e}")
            finally:
                srv.cleanup()

    def run_rb_series(self, workload: str, names: list[str], n: int, tests: list[str], argv,
                      setup=None, finish=None, extra=None, rounds: int = 1) -> None:
        """A fresh server per name (with `extra(name)`'s flags), `setup(srv)`, then redis-benchmark
        with `argv(srv, test)` for each test, then `finish(srv)`; with `rounds` > 1, all of it that
        many times, every other round in reverse order (see `round_orders`)."""
        for rnd, order in self.round_orders(names, rounds):
            tag = {"round": rnd} if rounds > 1 else None
            for name in order:
                srv = self.new_server_with(name, workload, extra(name) if extra else [])
                try:
                    if setup:
                        setup(srv)
                    reqs = 0
                    for t in tests:
                        recs = self.redis_benchmark(srv, workload, argv(srv, t), t, extra=tag)
                        reqs += n * sum(1 for r in recs if r.get("rps"))
                    if rnd == 0:
                        self.server_summary(srv, workload, requests=reqs)
                    if finish:
                        finish(srv)
                except BenchError as e:
                    self.fail(f"{workload} {name}: {e}")
                finally:
                    srv.cleanup()

    def run_w3b(self) -> None:
        n = self.n(self.args.n_w3b)
        self.run_rb_series("W3b", self.resp_servers(), n, W3B_COMMANDS,
                           lambda srv, c: ["-c", "50", "-n", str(n), "-r", "10000", "--csv"] + c.split())

    def fill_w3z(self, srv: Server) -> None:
        """ZADD z i 000000000i for i < W3Z_MEMBERS, 1000 members per command, pipelined."""
        with socket.create_connection(("127.0.0.1", srv.resp_port), timeout=60) as sock:
            sent = 0
            for start in range(0, W3Z_MEMBERS, 1000):
                args = [b"ZADD", b"z"]
                for i in range(start, min(start + 1000, W3Z_MEMBERS)):
                    args += [str(i).encode(), f"{i:012d}".encode()]
                frame = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
                sock.sendall(frame)
                sent += 1
            buf = b""
            got = 0
            while got < sent:
                chunk = sock.recv(65536)
                if not chunk:
                    raise BenchError("W3z fill: connection closed")
                buf += chunk
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    if not line.startswith(b":"):
                        raise BenchError(f"W3z fill: {line[:100]!r}")
                    got += 1
            sock.sendall(b"*2\r\n$5\r\nZCARD\r\n$1\r\nz\r\n")
            card = sock.recv(100)
            if card != b":%d\r\n" % W3Z_MEMBERS:
                raise BenchError(f"W3z fill: ZCARD answered {card!r}")

    def run_w3z(self) -> None:
        n = self.n(self.args.n_w3b)
        self.run_rb_series("W3z", [s for s in self.resp_servers() if s in W3Z_SERVERS], n, W3Z_COMMANDS,
                           lambda srv, c: ["-c", "50", "-n", str(n), "-r", str(W3Z_MEMBERS), "--csv"] + c.split(),
                           setup=self.fill_w3z)

    def run_eval(self) -> None:
        n = self.n(self.args.n_eval)
        # A one-second sample per server swung from 0.7x to 1.4x between runs: paired rounds.
        self.run_rb_series("eval", [s for s in self.resp_servers() if s in EVAL_SERVERS], n, EVAL_TESTS,
                           lambda srv, t: ["-n", str(n), "--csv", "EVAL", EVAL_SCRIPT, "1", "counter"],
                           rounds=self.args.rounds)

    def fill_edits(self, srv: Server) -> None:
        """`big`: EDITS_SIZE bytes of `x`; `bits`: a bitmap of EDITS_SIZE bytes."""
        with socket.create_connection(("127.0.0.1", srv.resp_port), timeout=60) as sock:
            big = b"x" * EDITS_SIZE
            sock.sendall(b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%d\r\n%s\r\n" % (len(big), big))
            last = str(EDITS_SIZE * 8 - 1).encode()
            sock.sendall(b"*4\r\n$6\r\nSETBIT\r\n$4\r\nbits\r\n$%d\r\n%s\r\n$1\r\n1\r\n" % (len(last), last))
            buf = b""
            while buf.count(b"\r\n") < 2:
                chunk = sock.recv(100)
                if not chunk:
                    raise BenchError("edits fill: connection closed")
                buf += chunk
            if buf != b"+OK\r\n:0\r\n":
                raise BenchError(f"edits fill: {buf[:100]!r}")

    def run_edits(self) -> None:
        n = self.n(self.args.n_edits)
        self.run_rb_series("edits", [s for s in self.resp_servers() if s in EDITS_SERVERS], n, EDITS_COMMANDS,
                           lambda srv, c: ["-c", "16", "-n", str(n), "--csv"] + c.split(),
                           setup=self.fill_edits)

    def tls_cert(self) -> tuple[Path, Path]:
        """A self-signed certificate for 127.0.0.1 (the run's only CA): (cert, key)."""
        d = self.tmp / "tls"
        d.mkdir(exist_ok=True)
        cert, key = d / "server.crt", d / "server.key"
        if not cert.exists():
            subprocess.run([self.bins["openssl"], "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                            str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=memkeep bench",
                            "-addext", "subjectAltName=IP:127.0.0.1"],
                           check=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        return cert, key

    def run_tls(self) -> None:
        n = self.n(self.args.n_w3)
        try:
            cert, key = self.tls_cert()
        except (subprocess.SubprocessError, OSError) as e:
            self.fail(f"tls: cannot make a certificate: {e}")
            return
        self.run_rb_series("tls", [s for s in self.resp_servers() if s in TLS_SERVERS], n, TLS_TESTS,
                           lambda srv, t: ["-p", str(srv.tls_port), "--tls", "--cacert", str(cert), "-c", "16",
                                           "-n", str(n), "-t", t, "--csv"],
                           finish=lambda srv: self.tls_handshakes(srv, srv.tls_port, cert),
                           extra=lambda name: self.tls_flags(name, cert, key))

    def tls_flags(self, name: str, cert: Path, key: Path) -> list[str]:
        port = free_ports(1)[0]
        if name in MEMKEEP_MODES:
            flags = ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
        else:
            flags = ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                     "--tls-auth-clients", "no"]
        return flags

    def new_server_with(self, name: str, tag: str, extra: list[str]) -> Server:
        srv = Server(name, self.bins, self.tmp, tag)
        srv.extra = extra
        if "--tls-port" in extra:
            srv.tls_port = int(extra[extra.index("--tls-port") + 1])
        srv.start()
        return srv

    def tls_handshakes(self, srv: Server, port: int, cert: Path) -> None:
        """openssl s_time: new sessions (no resumption) for 5 s, one at a time."""
        argv = [self.bins["openssl"], "s_time", "-connect", f"127.0.0.1:{port}", "-new", "-time", "5",
                "-CAfile", str(cert)]
        self.commands.setdefault("tls handshakes", shlex.join(["openssl"] + argv[1:]).replace(str(port), "$TLS_PORT"))
        rec = {"type": "rb", "workload": "tls", "server": srv.name, "label": "handshakes", "test": "handshakes"}
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            m = re.search(r"(\d+) connections in (\d+) real seconds", p.stdout)
            rec["rps"] = int(m.group(1)) / int(m.group(2)) if m else None
            if not m:
                rec["error"] = (p.stdout + p.stderr)[-200:]
        except subprocess.TimeoutExpired:
            rec["rps"], rec["error"] = None, "s_time timed out"
        self.record(rec)
        log(f"  tls {srv.name:16} handshakes={rec.get('rps') or 0:.0f}/s")

    # -- W4 ------------------------------------------------------------------------------------

    def run_w4(self) -> None:
        mc = [s for s in self.servers if s in MEMKEEP_MODES or s == "memcached"]
        na, nb = self.n(self.args.n_w4a), self.n(self.args.n_w4b)
        shape_a = {"vmin": 128, "vmax": 512, "kmin": 16, "kmax": 64,
                   "raw": lambda k: raw_bytes(k, 128, 512, 16, 64)}
        shape_b = {"vmin": 16, "vmax": 16, "kmin": 8, "kmax": 8, "raw": lambda k: raw_bytes(k, 16, 16, 8, 8)}
        for wl, keys, shape, conns in (("W4a", na, shape_a, 2), ("W4b", nb, shape_b, 10), ("W4b", nb, shape_b, 100)):
            for name in mc:
                srv = self.new_server(name, wl)
                try:
                    self.bench_phase(srv, wl, "memcache", conns, keys, "set", shape)
                    self.bench_phase(srv, wl, "memcache", conns, keys, "get", shape)
                    self.server_summary(srv, wl, requests=2 * keys, extra={"connections": conns})
                except BenchError as e:
                    self.fail(f"{wl} {name}: {e}")
                finally:
                    srv.cleanup()

    # -- connection scaling --------------------------------------------------------------------

    def scaling_secs(self) -> float:
        """Seconds per sweep point: --scaling-secs, shortened for reduced runs (--scale < 0.2)."""
        return max(1.5, self.args.scaling_secs * min(1.0, self.args.scale * 5))

    def run_scaling(self) -> None:
        # Time-bounded: N is only an upper bound, each point runs --scaling-secs seconds.
        keys = max(self.n(self.args.n_scaling), 1000)
        shape = {"vmin": 100, "vmax": 100, "raw": lambda k: raw_bytes(k, 100, 100)}
        wanted = {s for pair in SCALING_PAIRS for s in pair[:2]}
        targets = [(s, "resp" if s in REDIS_MODES else "memcache") for s in ALL_SERVERS
                   if s in wanted and s in self.servers]
        for conns in SCALING_CONNS:
            for rnd, order in self.round_orders(targets):
                for name, proto in order:
                    srv = self.new_server(name, f"scaling{conns}")
                    try:
                        self.bench_phase(srv, "scaling", proto, conns, keys, "set", shape, cap=self.scaling_secs(),
                                         extra={"round": rnd})
                    except BenchError as e:
                        self.fail(f"scaling {name} c={conns} round {rnd + 1}: {e}")
                    finally:
                        srv.cleanup()

    def round_orders(self, servers: list, rounds: int | None = None) -> list[tuple[int, list]]:
        """The servers of one comparison point, once per --rounds, every other round in reverse
        order (A B, B A, ...): a drift of the machine over the point (the disk's fsync latency
        moves from minute to minute here) then weighs on both sides alike."""
        n = self.args.rounds if rounds is None else rounds
        return [(i, list(servers) if i % 2 == 0 else list(reversed(servers)))
                for i in range(max(1, n))]

    # -- transactions and queues, durable ---------------------------------------------------

    def durable_secs(self) -> float:
        """Seconds of writes per point: --durable-secs, shortened for reduced runs (--scale < 0.2)."""
        return max(1.5, self.args.durable_secs * min(1.0, self.args.scale * 5))

    def run_multi(self) -> None:
        # Time-bounded: N is an upper bound; every key the SETs got to is read back.
        keys = max(self.n(self.args.n_multi), 1000)
        shape = {"vmin": 100, "vmax": 100, "raw": lambda k: raw_bytes(k, 100, 100)}
        for conns in MULTI_CONNS:
            for rnd, order in self.round_orders([s for s in DURABLE_PAIR if s in self.servers]):
                for name in order:
                    srv = self.new_server(name, f"multi{conns}")
                    try:
                        rec = self.bench_phase(srv, "multi", "resp", conns, keys, "set", shape,
                                               cap=self.durable_secs(), flags=["--multi", str(MULTI_SIZE)],
                                               extra={"round": rnd})
                        done = rec.get("prefix_done") or 0
                        if done:
                            self.bench_phase(srv, "multi-verify", "resp", conns, done, "get", shape,
                                             extra={"round": rnd})
                    except BenchError as e:
                        self.fail(f"multi {name} c={conns} round {rnd + 1}: {e}")
                    finally:
                        srv.cleanup()

    def run_queue(self) -> None:
        # Time-bounded like multi: the producers stop at the cap, the consumers drain the rest.
        msgs = max(self.n(self.args.n_queue), 1000)
        shape = {"vmin": 100, "vmax": 100, "raw": lambda k: raw_bytes(k, 100, 100)}
        for producers, consumers in QUEUE_SHAPES:
            for rnd, order in self.round_orders([s for s in DURABLE_PAIR if s in self.servers]):
                for name in order:
                    srv = self.new_server(name, f"queue{producers}x{consumers}")
                    try:
                        self.bench_phase(srv, "queue", "resp", producers, msgs, "queue", shape,
                                         extra={"consumers": consumers, "round": rnd}, cap=self.durable_secs(),
                                         flags=["--consumers", str(consumers)])
                    except BenchError as e:
                        self.fail(f"queue {name} {producers}x{consumers} round {rnd + 1}: {e}")
                    finally:
                        srv.cleanup()

    def probe(self, when: str) -> None:
        pr = fsync_probe(self.tmp / "data")
        self.record({"type": "fsync", "when": when, **pr})
        log(f"fsync probe ({when}): p50 {pr['p50_ms']:.2f} ms, p90 {pr['p90_ms']:.2f} ms, max {pr['max_ms']:.2f} ms")

    def run(self) -> None:
        only = self.args.only
        self.probe("start")
        if "W1" in only or "restart" in only:
            log(f"W1: 100-byte values, {self.n(self.args.n_w1)} keys, 16 connections"
                + (" (+ restart)" if "restart" in only else ""))
            self.run_w12("W1", self.n(self.args.n_w1), 100, "restart" in only)
        if "W2" in only:
            self.probe("before W2")
            log(f"W2: 20 KiB values, {self.n(self.args.n_w2)} keys, 16 connections")
            self.run_w12("W2", self.n(self.args.n_w2), 20480, False)
        if "W3" in only:
            self.probe("before W3")
            log(f"W3: redis-benchmark -n {self.n(self.args.n_w3)}")
            self.run_w3()
        if "W3b" in only:
            self.probe("before W3b")
            log(f"W3b: redis-benchmark -c 50 -n {self.n(self.args.n_w3b)} -r 10000, hashes and sorted sets")
            self.run_w3b()
        if "W3z" in only:
            self.probe("before W3z")
            log(f"W3z: rank reads on a {W3Z_MEMBERS}-member sorted set, redis-benchmark -c 50 "
                f"-n {self.n(self.args.n_w3b)}")
            self.run_w3z()
        if "W4" in only:
            self.probe("before W4")
            log(f"W4: pogreb-bench shapes, {self.n(self.args.n_w4a)} / {self.n(self.args.n_w4b)} keys")
            self.run_w4()
        if "scaling" in only:
            self.probe("before scaling")
            log(f"scaling: SET of 100-byte values for {self.scaling_secs():g} s at "
                f"{', '.join(map(str, SCALING_CONNS))} connections")
            self.run_scaling()
        if "multi" in only:
            self.probe("before multi")
            log(f"multi: MULTI + {MULTI_SIZE} SETs + EXEC for {self.durable_secs():g} s at "
                f"{', '.join(map(str, MULTI_CONNS))} connections, {' vs '.join(DURABLE_PAIR)}")
            self.run_multi()
        if "tls" in only:
            self.probe("before tls")
            log(f"tls: redis-benchmark --tls -c 16 -n {self.n(self.args.n_w3)} and openssl s_time, "
                f"{' vs '.join(TLS_SERVERS)}")
            self.run_tls()
        if "eval" in only:
            self.probe("before eval")
            log(f"eval: redis-benchmark -n {self.n(self.args.n_eval)} EVAL \"{EVAL_SCRIPT}\" 1 counter, "
                f"{', '.join(s for s in self.resp_servers() if s in EVAL_SERVERS)}")
            self.run_eval()
        if "edits" in only:
            self.probe("before edits")
            log(f"edits: redis-benchmark -c 16 -n {self.n(self.args.n_edits)}, "
                f"{'; '.join(EDITS_COMMANDS)}, {', '.join(s for s in self.resp_servers() if s in EDITS_SERVERS)}")
            self.run_edits()
        if "queue" in only:
            self.probe("before queue")
            log(f"queue: LPUSH / BRPOP for {self.durable_secs():g} s, (producers, consumers) "
                f"{', '.join(map(str, QUEUE_SHAPES))}, {' vs '.join(DURABLE_PAIR)}")
            self.run_queue()
        self.probe("end")


def _f(row: list[str], i: int) -> float | None:
    try:
        return float(row[i])
    except (IndexError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


def cmd_out(argv: list[str], timeout: float = 20) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr).strip() else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def git_commit() -> str:
    """HEAD's short hash, read from .git without running git; `git rev-parse` as a fallback."""
    try:
        gitdir = REPO / ".git"
        if gitdir.is_file():  # a worktree: "gitdir: PATH"
            gitdir = Path(gitdir.read_text().split(":", 1)[1].strip())
        head = (gitdir / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head[:7]
        ref = head[4:].strip()
        common = gitdir
        if (gitdir / "commondir").exists():
            common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
        for base in (gitdir, common):
            if (base / ref).exists():
                return (base / ref).read_text().strip()[:7]
            packed = base / "packed-refs"
            if packed.exists():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0][:7]
    except OSError:
        pass
    return cmd_out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])


def machine_info(tmp: Path) -> dict:
    info = {"nproc": os.cpu_count(), "kernel": platform.release()}
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                info["mem_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # The file system the data directories live on.
    best = ("", "?", "?")
    try:
        for line in open("/proc/mounts"):
            dev, mnt, fstype = line.split()[:3]
            if str(tmp).startswith(mnt) and len(mnt) > len(best[0]):
                best = (mnt, fstype, dev)
    except OSError:
        pass
    info["data_fs"] = f"{best[1]} ({best[2]} on {best[0]})"
    try:
        info["loadavg_start"] = open("/proc/loadavg").read().split()[:3]
    except OSError:
        pass
    # A VM's free page reporting (virtio-balloon) hands pages the guest freed back to the host;
    # with it on, page-cache writes cost up to twice the system time from one run to the next
    # (memkeep W2 SET `never`: 13k or 19k/s; memcached, which writes no page cache, unchanged).
    try:
        p = "/sys/module/page_reporting/parameters/min_free_ms"
        info["page_reporting_min_free_ms"] = int(open(p).read().strip())
    except (OSError, ValueError):
        pass
    return info


def page_reporting_text(mi: dict) -> str | None:
    """The machine table's line on free page reporting, or None where the kernel has none."""
    ms = mi.get("page_reporting_min_free_ms")
    if ms is None:
        return None
    return (f"on (`min_free_ms` {ms}): pages the guest frees go back to the host; measured here, "
            "memkeep's page-cache writes then cost up to twice the system time from one run to the "
            "next (W2 SET `never` 13k or 19k/s), while memcached, which writes no page cache, did "
            "not move")


def find_bins(args: argparse.Namespace) -> dict:
    bins = {
        "memkeep": str(Path(args.bin_dir) / "memkeep"),
        "memkeep-bench": str(Path(args.bin_dir) / "memkeep-bench"),
        "memcached": shutil.which("memcached"),
        "redis-server": shutil.which("redis-server"),
        "redis-benchmark": shutil.which("redis-benchmark"),
        "openssl": shutil.which("openssl"),
    }
    missing = [k for k, v in bins.items() if not v or not os.access(v, os.X_OK)]
    if missing:
        raise BenchError(f"missing: {', '.join(missing)} (run bench/deps.sh; cargo build --release)")
    return bins


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

SERVER_ORDER = {s: i for i, s in enumerate(ALL_SERVERS + list(VLOG_MODES))}


def fmt_n(v, digits=0) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and digits:
        return f"{v:,.{digits}f}"
    return f"{v:,.0f}"


def fmt_ms(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 10 else f"{v:.1f}"


def fmt_mb(b) -> str:
    if b is None:
        return "n/a"
    return f"{b / 1e6:,.1f} MB"


def fmt_kb_mb(kb) -> str:
    if kb is None:
        return "n/a"
    return f"{kb / 1024:,.1f} MiB"


def fmt_ratio(r) -> str:
    if r is None:
        return "n/a"
    return f"**{r:.2f}**" if r >= 0.1 else f"**{r:.3f}**" if r >= 0.01 else f"**{r:.4f}**"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def per_round(r: dict) -> str:
    """Each round's rate of a merged point, for a table cell ("" for a single run)."""
    ops = r.get("round_ops") or []
    if len(ops) < 2:
        return ""
    return " [" + " / ".join(fmt_n(v) if v else "-" for v in ops) + "]"


def group_rounds(records: list[dict], key, grouped) -> list:
    """`records` in order, those `grouped(r)` says came from --rounds gathered into one list per
    `key(r)` (at the place of the first), the others as they are."""
    groups: dict = {}
    out: list = []
    for r in records:
        if not grouped(r):
            out.append(r)
            continue
        k = key(r)
        if k not in groups:
            groups[k] = []
            out.append(groups[k])
        groups[k].append(r)
    return out


def median_of(rs: list[dict], fields) -> dict:
    """The first record with each of `fields` the median over `rs` (None where none has one)."""
    m = dict(rs[0])
    for f in fields:
        vals = [r[f] for r in rs if isinstance(r.get(f), (int, float))]
        m[f] = statistics.median(vals) if vals else None
    return m


def merge_rb_rounds(rbs: list[dict]) -> list[dict]:
    """One redis-benchmark record per (workload, server, test) from its --rounds repeats
    (records with a "round"): the median rate and latencies, each round's rate in "round_rps";
    a round's error is kept. Other records pass as they are."""
    merged = []
    for item in group_rounds(rbs, lambda r: (r["workload"], r["server"], r["label"], r["test"]),
                             lambda r: "round" in r and r.get("rps") is not None):
        if isinstance(item, dict):
            merged.append(item)
            continue
        m = median_of(item, ("rps", "avg_ms", "p50_ms", "p99_ms", "max_ms"))
        if len(item) > 1:
            m["round_rps"] = [r["rps"] for r in item]
        merged.append(m)
    return merged


def merge_rounds(phases: list[dict]) -> list[dict]:
    """One record per point from the --rounds repeats of a point (records with a "round"):
    rates and latencies are the median over the rounds (the mean of two), the per-round rates
    are kept in "round_ops", and errors, misses and mismatches add up. Other records pass as
    they are."""
    merged = []
    for item in group_rounds(phases, lambda r: (r["workload"], r["server"], r["proto"], r["phase"],
                                                r["connections"], r.get("consumers")),
                             lambda r: "round" in r):
        if isinstance(item, dict):
            merged.append(item)
            continue
        if len(item) == 1:
            merged.append(item[0])
            continue
        m = median_of(item, ("ops_per_sec", "p50_ms", "p99_ms", "p999_ms", "secs", "cpu_s_per_M",
                             "fsync_p50_ms"))
        for f in ("misses", "mismatches", "errors", "duplicates"):
            vals = [r[f] for r in item if isinstance(r.get(f), (int, float))]
            if vals:
                m[f] = sum(vals)
        errs = [r["error"] for r in item if r.get("error")]
        m["error"] = "; ".join(errs) if errs else None
        m["round_ops"] = [r.get("ops_per_sec") for r in item]
        merged.append(m)
    return merged


class Report:
    def __init__(self, records: list[dict]):
        self.meta = next((r for r in records if r["type"] == "meta"), {})
        self.phases = merge_rounds([r for r in records if r["type"] == "phase"])
        self.rbs = merge_rb_rounds([r for r in records if r["type"] == "rb"])
        self.restarts = [r for r in records if r["type"] == "restart"]
        self.summaries = [r for r in records if r["type"] == "server"]
        self.end = next((r for r in records if r["type"] == "end"), {})
        self.fsyncs = [r for r in records if r["type"] == "fsync"]
        cmds = next((r for r in records if r["type"] == "meta_commands"), None)
        if cmds and not self.meta.get("commands"):
            self.meta["commands"] = cmds["commands"]

    def phase(self, workload, server, proto, phase, conns=None):
        for r in self.phases:
            if (r["workload"] == workload and r["server"] == server and r["proto"] == proto
                    and r["phase"] == phase and (conns is None or r["connections"] == conns)):
                return r
        return None

    def ops(self, *a, **k):
        r = self.phase(*a, **k)
        return r.get("ops_per_sec") if r else None

    def kv_value(self, workload, server, proto, phase, conns):
        """ops/s, "error" for a phase that failed without a figure, None for one never run."""
        r = self.phase(workload, server, proto, phase, conns)
        if r is None:
            return None
        return r.get("ops_per_sec") or ("error" if r.get("error") else None)

    def rb_value(self, workload, server, test):
        rps, err = self.rb_cell(workload, server, test)
        return rps if rps is not None else ("error" if err else None)

    def rb(self, workload, server, test):
        for r in self.rbs:
            if (r["workload"] == workload and r["server"] == server and r.get("rps") is not None
                    and (r["test"] == test or r["label"] == test)):
                return r
        return None

    def rb_tests(self, workload):
        seen = []
        for r in self.rbs:
            if r["workload"] == workload and r.get("rps") is not None and r["test"] not in seen:
                seen.append(r["test"])
        return seen

    def rb_cell(self, workload, server, label_or_test):
        r = self.rb(workload, server, label_or_test)
        if r and r.get("rps") is not None:
            return r["rps"], None
        stem = label_or_test.lower().split(" ")[0].split("_")[0]
        for e in self.rbs:
            if e["workload"] == workload and e["server"] == server and e.get("error") and (
                    e["label"] == label_or_test or e["test"] == label_or_test or e["label"] == stem):
                return None, e["error"]
        return None, None

    # -- markdown ------------------------------------------------------------------------------

    def markdown(self, chart_rel: str | None) -> str:
        m = self.meta
        o: list[str] = []
        w = o.append
        w("# memkeep benchmarks: memkeep vs memcached vs Redis\n")
        how = "`make bench`" if m.get("scale") == 1 else f"`--scale {m.get('scale')}`"
        w(f"Generated by `bench/run.py` ({how}) "
          f"on {m.get('date', '?')}; total run time {fmt_n(self.end.get('elapsed_s'))} s "
          f"({(self.end.get('elapsed_s') or 0) / 60:.1f} min, build included). "
          "Every figure below comes from this one run: ratios compare servers measured minutes apart "
          "on the same machine.\n")
        w("**Caveats.** This is a shared 2-core VM: other jobs (compilers, test suites) ran at the same time, "
          "so absolute numbers are noisy (a few tens of percent between runs is normal here). The load "
          "generator runs on the same two cores as the server, so every figure is client-bound as much as "
          "server-bound; no server is CPU-pinned. Treat ratios near 1 as ties. Write throughput of the "
          "`always` modes follows the shared disk's sync latency, which moves by an order of magnitude from "
          "hour to hour here: see *Disk sync latency during the run* before reading those rows.\n")
        if m.get("scale", 1) != 1:
            w(f"**This was a reduced run (`--scale {m.get('scale')}`)**: N is {m.get('scale')} of the defaults.\n")
        w("## Machine and versions\n")
        mi = m.get("machine", {})
        w("| | |\n|---|---|")
        w(f"| CPU | {mi.get('cpu', '?')}, nproc {mi.get('nproc', '?')} |")
        w(f"| memory | {mi.get('mem_gib', '?')} GiB |")
        w(f"| kernel | {mi.get('kernel', '?')} |")
        w(f"| data directories | {mi.get('data_fs', '?')} |")
        w(f"| load average at start | {' '.join(mi.get('loadavg_start', []))} |")
        if (pr := page_reporting_text(mi)) is not None:
            w(f"| free page reporting (VM) | {pr} |")
        for k, v in m.get("versions", {}).items():
            w(f"| {k} | {v} |")
        w("")

        w("## Commands\n")
        w("Each workload gets fresh servers (new temporary data directory, free loopback ports). "
          "`$MC_PORT`/`$RESP_PORT`/`$PORT`/`$DIR` are filled in per run.\n")
        w("```sh")
        argvs = {}
        for s in self.summaries:
            argvs.setdefault(s["server"], s["argv"])
        for name in sorted(argvs, key=lambda s: SERVER_ORDER.get(s, 99)):
            w(f"# {name}\n{argvs[name]}")
        w("")
        for k, v in m.get("commands", {}).items():
            w(f"# {k}\n{v}")
        w("```\n")
        w("memkeep-bench: keys `1..N` split over the connections, one request in flight per connection "
          "(`--pipeline 1`), every GET value checked byte for byte; latency is per request. W3 runs one "
          "redis-benchmark invocation per `-t` test so that one failing command does not stop the rest "
          "(redis-benchmark exits on the first error reply). Server CPU is utime+stime from "
          "`/proc/PID/stat` (plus cutime+cstime: redis's AOF-rewrite children) over the phase. "
          "*VmHWM* is peak RSS (LMDB's mapped file pages count there); *RssAnon* is the peak anonymous "
          "RSS sampled every 100 ms. *disk* is the data directory's allocated blocks (`du`), measured "
          "right after the phase while the server still runs; memcached has no disk (n/a).\n")

        self.md_fsync(w)
        self.md_ratios(w)
        if chart_rel:
            w(f"## Chart\n\n![throughput per workload and server]({chart_rel})\n")
        self.md_kv(w)
        self.md_rb(w, "W3", "W3: redis-benchmark (requests/s, 50 clients)")
        self.md_rb(w, "W3b", "W3b: hashes and sorted sets (requests/s, 50 clients, -r 10000)")
        self.md_rb(w, "W3z", f"W3z: ranks in a sorted set of {W3Z_MEMBERS:,} members (requests/s, 50 clients)")
        self.md_rb(w, "tls", "TLS: redis-benchmark --tls (requests/s, 16 clients) and full handshakes/s (openssl s_time)")
        self.md_rb(w, "eval", "eval: one Lua script per request, `EVAL \"return redis.call('INCR', KEYS[1])\" 1 counter` (requests/s, 50 clients)")
        self.md_rb(w, "edits", "edits: a few bytes of a 1 MiB string or bitmap changed per request (requests/s, 16 clients)")
        self.md_restart(w)
        self.md_scaling(w)
        self.md_durable(w)
        self.md_failures(w)
        return "\n".join(o) + "\n"

    def md_fsync(self, w) -> None:
        if not self.fsyncs:
            return
        w("## Disk sync latency during the run\n")
        w("`always` modes (memkeep `--sync always`, redis `appendfsync always`) wait for the disk on every "
          "group of writes, so their write throughput follows the shared disk's sync latency, which drifts "
          "with the other jobs on this machine. `bench/run.py` probes it (30 `fdatasync`s of a rewritten "
          "4 KiB block in the data directories' file system) before each workload, and again (20) just "
          "before every SET phase of an `always` server (shown in the notes column below).\n")
        w("| when | p50 ms | p90 ms | max ms |")
        w("|---|---|---|---|")
        for r in self.fsyncs:
            w(f"| {r['when']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['max_ms']:.2f} |")
        w("")

    def md_kv(self, w) -> None:
        w("## Absolute figures: memkeep-bench workloads\n")
        w("W1: 100-byte values, 16 connections. W2: 20 KiB values, 16 connections. W4a: 16-64-byte keys, "
          "128-512-byte values, 2 connections. W4b: 8-byte keys, 16-byte values, 10 and 100 connections. "
          "CPU s/M = server CPU seconds per million requests. `raw` = key+value bytes stored.\n")
        w("| workload | server | protocol | conns | phase | N | ops/s | p50 ms | p99 ms | p99.9 ms | "
          "CPU s/M | VmHWM | RssAnon peak | disk | disk / raw | notes |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        order = {"W1": 0, "W2": 1, "W4a": 2, "W4b": 3}
        rows = [r for r in self.phases if r["workload"] in order]
        # memcached-protocol rows, then redis, then memkeep's extra RESP rows.
        rows.sort(key=lambda r: (order[r["workload"]], r["connections"],
                                 r["proto"] == "resp" and r["server"] in MEMKEEP_MODES,
                                 SERVER_ORDER.get(r["server"], 99), r["phase"] != "set"))
        for r in rows:
            notes = []
            if r.get("error"):
                notes.append("ERROR: " + r["error"][:120].replace("|", "/"))
            for k in ("misses", "mismatches", "errors"):
                if r.get(k):
                    notes.append(f"{k} {r[k]}")
            if r.get("complete") is False:
                notes.append("incomplete (phase cap)")
            if r.get("fsync_p50_ms") is not None:
                notes.append(f"fsync p50 {r['fsync_p50_ms']:.2f} ms just before")
            w(f"| {r['workload']} | {r['server']} | {r['proto']} | {r['connections']} | {r['phase'].upper()} | "
              f"{r['keys']:,} | {fmt_n(r.get('ops_per_sec'))} | {fmt_ms(r.get('p50_ms'))} | "
              f"{fmt_ms(r.get('p99_ms'))} | {fmt_ms(r.get('p999_ms'))} | {fmt_n(r.get('cpu_s_per_M'), 2)} | "
              f"{fmt_kb_mb(r.get('vmhwm_kb'))} | {fmt_kb_mb(r.get('rss_anon_peak_kb'))} | "
              f"{fmt_mb(r.get('disk_bytes'))} | {fmt_n(ratio(r.get('disk_bytes'), r.get('raw_bytes')), 2)} | "
              f"{'; '.join(notes)} |")
        w("")

    def md_rb(self, w, workload: str, title: str) -> None:
        servers = sorted({r["server"] for r in self.rbs if r["workload"] == workload},
                         key=lambda s: SERVER_ORDER.get(s, 99))
        if not servers:
            return
        w(f"## {title}\n")
        w("| test | " + " | ".join(servers) + " |")
        w("|---|" + "---|" * len(servers))
        labels = {"W3b": W3B_COMMANDS, "W3z": W3Z_COMMANDS, "tls": TLS_TESTS + ["handshakes"],
                  "eval": EVAL_TESTS, "edits": EDITS_COMMANDS}.get(workload)
        tests = self.rb_tests(workload)
        if labels:
            tests = labels
        else:
            # Tests that failed everywhere still get a row.
            for r in self.rbs:
                if r["workload"] == workload and r.get("error") and r["label"] not in tests and not any(
                        t.lower().startswith(r["label"]) for t in tests):
                    tests.append(r["label"])
        for t in tests:
            cells = []
            for s in servers:
                rps, err = self.rb_cell(workload, s, t)
                if rps is None and labels is None:
                    # W3: the label is the -t name, the csv test name differs; find the error by label.
                    pass
                r = self.rb(workload, s, t)
                rounds = (r or {}).get("round_rps") or []
                each = " [" + " / ".join(fmt_n(v) for v in rounds) + "]" if len(rounds) > 1 else ""
                cells.append(fmt_n(rps) + each if rps is not None else ("error" if err else "n/a"))
            w(f"| `{t}` | " + " | ".join(cells) + " |")
        cpu = {s["server"]: s for s in self.summaries if s["workload"] == workload}
        w("| server CPU s per M requests | " + " | ".join(
            fmt_n(ratio(cpu[s]["cpu_s"], (cpu[s].get("requests") or 0) / 1e6), 2) if s in cpu else "n/a"
            for s in servers) + " |")
        w("| VmHWM / RssAnon peak | " + " | ".join(
            f"{fmt_kb_mb(cpu[s].get('vmhwm_kb'))} / {fmt_kb_mb(cpu[s].get('rss_anon_peak_kb'))}" if s in cpu else "n/a"
            for s in servers) + " |")
        w("| disk at end | " + " | ".join(fmt_mb(cpu[s].get("disk_bytes")) if s in cpu else "n/a"
                                          for s in servers) + " |")
        errs = [r for r in self.rbs if r["workload"] == workload and r.get("error")]
        if errs:
            w("\nErrors (recorded, the run went on):\n")
            for r in errs:
                w(f"- {r['server']}, `{r['label']}`: {r['error'][:200]}")
        w("")

    def md_restart(self, w) -> None:
        if not self.restarts:
            return
        w("## Restart after W1\n")
        w("The server is stopped with SIGTERM after W1 (SET then GET of every key), then started again on the same data "
          "directory; *first GET* is the time from the exec until a GET of key `1` (written first) returns "
          "its value, polled every 2 ms. *empty start* is the same time for the fresh, empty server before "
          "W1. Every key is then read back and checked (*verify*).\n")
        w("| server | protocol | keys | raw key+value | disk | disk / raw | stop (SIGTERM→exit) | first GET after restart | "
          "empty start | verify misses / mismatches |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        for r in sorted(self.restarts, key=lambda r: SERVER_ORDER.get(r["server"], 99)):
            w(f"| {r['server']} | {r['proto']} | {r['keys']:,} | {fmt_mb(r['raw_bytes'])} | {fmt_mb(r['disk_bytes'])} | "
              f"{fmt_n(ratio(r['disk_bytes'], r['raw_bytes']), 2)} | {fmt_n(r['stop_s'] * 1000, 1)} ms | "
              f"{fmt_n((r['first_get_s'] or 0) * 1000, 1) + ' ms' if r.get('first_get_s') is not None else 'FAILED'} | "
              f"{fmt_n((r.get('empty_start_s') or 0) * 1000, 1)} ms | "
              f"{r.get('verify_misses', 'n/a')} / {r.get('verify_mismatches', 'n/a')} |")
        w("")

    def md_scaling(self, w) -> None:
        rows = [r for r in self.phases if r["workload"] == "scaling"]
        if not rows:
            return
        conns = sorted({r["connections"] for r in rows})
        servers = sorted({(r["server"], r["proto"]) for r in rows}, key=lambda s: SERVER_ORDER.get(s[0], 99))
        secs = max((r.get("secs") or 0) for r in rows)
        w("## Connection sweep: W1 SET (100-byte values) at 1 to 64 connections\n")
        w(f"Each point is a fresh server that gets SETs of keys 1, 2, 3, ... from C connections, one request in "
          f"flight each, for about {secs:.0f} s (`--scaling-secs`); the rate is taken over the keys written in "
          "that time. memkeep speaks the memcached protocol, redis RESP. "
          f"{self.rounds_text('scaling')} On a shared 2-core machine (the load generator runs on the same "
          "cores) differences under ~20% are noise, and the `always` rows follow the disk's fsync latency of "
          "the moment.\n")
        w("### Ratios (ops/s of the first server / ops/s of the second)\n")
        w("| pair | compares | " + " | ".join(f"{c} conns" for c in conns) + " |")
        w("|---|---|" + "---|" * len(conns))
        for a, b, what in SCALING_PAIRS:
            pa = "resp" if a in REDIS_MODES else "memcache"
            pb = "resp" if b in REDIS_MODES else "memcache"
            cells = []
            for c in conns:
                ra = self.phase("scaling", a, pa, "set", c)
                rb = self.phase("scaling", b, pb, "set", c)
                v = ratio((ra or {}).get("ops_per_sec"), (rb or {}).get("ops_per_sec"))
                cells.append(fmt_ratio(v))
            w(f"| {a} / {b} | {what} | " + " | ".join(cells) + " |")
        w("")
        w("### Absolute: SET ops/s (p99 ms)\n")
        w("| server | protocol | " + " | ".join(f"{c} conns" for c in conns) + " |")
        w("|---|---|" + "---|" * len(conns))
        for s, p in servers:
            cells = []
            for c in conns:
                r = self.phase("scaling", s, p, "set", c)
                if not r:
                    cells.append("n/a")
                elif r.get("error") and not r.get("ops_per_sec"):
                    cells.append("error")
                else:
                    cells.append(f"{fmt_n(r.get('ops_per_sec'))} ({fmt_ms(r.get('p99_ms'))})" + per_round(r))
            w(f"| {s} | {p} | " + " | ".join(cells) + " |")
        w("")

    def durable_points(self) -> list[tuple[str, str, int, int | None]]:
        """(workload, label, connections or producers, consumers) of the multi and queue runs."""
        pts = []
        for r in self.phases:
            if r["workload"] == "multi":
                key = ("multi", f"MULTI + {MULTI_SIZE} SETs + EXEC, {r['connections']} conns", r["connections"], None)
            elif r["workload"] == "queue":
                c = r.get("consumers")
                key = ("queue", f"queue, {r['connections']} producers / {c} consumers", r["connections"], c)
            else:
                continue
            if key not in pts:
                pts.append(key)
        return pts

    def durable_phase(self, workload, server, conns, consumers):
        for r in self.phases:
            if (r["workload"] == workload and r["server"] == server and r["connections"] == conns
                    and (consumers is None or r.get("consumers") == consumers)):
                return r
        return None

    def rounds_text(self, *workloads: str) -> str:
        n = max((len(r.get("round_ops") or [None]) for r in self.phases if r["workload"] in workloads), default=1)
        if n < 2:
            return "One sample per point."
        return (f"Each point ran {n} times, the servers in turn and every other round in reverse order "
                "(A B, B A), so that a drift of the machine during the point weighs on both; the figure is "
                "the median of the rounds (each round's rate in brackets), and ratios divide medians.")

    def md_durable(self, w) -> None:
        pts = self.durable_points()
        if not pts:
            return
        mk, ref = DURABLE_PAIR
        secs = max((r.get("secs") or 0) for r in self.phases if r["workload"] in ("multi", "queue"))
        w("## Transactions and a durable queue: memkeep `--sync always` vs Redis `appendfsync always`\n")
        w(f"Both servers make every write durable before its reply. *multi*: memkeep-bench sends "
          f"MULTI, {MULTI_SIZE} SETs of 100-byte values and EXEC in one write per transaction, one "
          "transaction in flight per connection, and checks every reply (`+OK`, `+QUEUED`, EXEC's "
          f"array); the rate counts SETs (transactions/s is a tenth of it) and the latency is per "
          "transaction; every key written is then read back. *queue*: producers LPUSH 100-byte "
          "messages onto one list, consumers BRPOP them (0.1 s timeout, looping); every message is "
          "checked delivered exactly once and intact; the rate is messages delivered per second "
          "from the start to the last delivery, the latency end to end (LPUSH written to BRPOP's "
          f"reply read). Each point is a fresh server with about {secs:.0f} s of writes "
          f"(`--durable-secs`); both follow the disk's fsync latency of the moment. "
          f"{self.rounds_text('multi', 'queue')}\n")
        w(f"| workload | {mk} ops/s | {ref} ops/s | ratio | {mk} p50 / p99 ms | {ref} p50 / p99 ms | notes |")
        w("|---|---|---|---|---|---|---|")
        for wl, label, conns, consumers in pts:
            a = self.durable_phase(wl, mk, conns, consumers)
            b = self.durable_phase(wl, ref, conns, consumers)
            cell = lambda r: (fmt_n(r.get("ops_per_sec")) + per_round(r) if r and r.get("ops_per_sec")
                              else ("error" if r else "n/a"))
            lat = lambda r: f"{fmt_ms(r.get('p50_ms'))} / {fmt_ms(r.get('p99_ms'))}" if r else "n/a"
            notes = []
            for r in (a, b):
                if r and (r.get("error") or r.get("misses") or r.get("mismatches") or r.get("duplicates")):
                    notes.append(f"{r['server']}: error={r.get('error')} lost/misses={r.get('misses')} "
                                 f"mismatches={r.get('mismatches')} duplicates={r.get('duplicates')}")
                if r and r.get("fsync_p50_ms") is not None:
                    notes.append(f"{r['server']} fsync p50 {r['fsync_p50_ms']:.2f} ms just before")
            ratio_v = ratio((a or {}).get("ops_per_sec"), (b or {}).get("ops_per_sec"))
            w(f"| {label} | {cell(a)} | {cell(b)} | {fmt_ratio(ratio_v)} | {lat(a)} | {lat(b)} | "
              f"{'; '.join(notes).replace('|', '/')} |")
        w("")

    def md_failures(self, w) -> None:
        fails = self.end.get("failures") or []
        w("## Failures and anomalies\n")
        if not fails:
            w("None: every phase completed with no errors, misses or mismatches.\n")
            return
        for f in fails:
            w(f"- {f}")
        w("")

    def ratio_rows(self) -> list[tuple]:
        """(group, target, metric, memkeep, reference, memkeep value, reference value, ratio, better)."""
        rows = []
        group = ""

        def kv(workload, mk, mk_proto, ref, ref_proto, phase, conns=None, what="ops/s"):
            a = self.phase(workload, mk, mk_proto, phase, conns)
            b = self.phase(workload, ref, ref_proto, phase, conns)
            if not a or not b:
                return
            label = f"{workload}{'' if conns is None or workload in ('W1', 'W2') else f' c={conns}'} {phase.upper()}"
            if what == "ops/s":
                rows.append((group, label, "ops/s", f"{mk} ({mk_proto})", f"{ref} ({ref_proto})",
                             a.get("ops_per_sec"), b.get("ops_per_sec"),
                             ratio(a.get("ops_per_sec"), b.get("ops_per_sec")), "higher"))
                rows.append((group, label, "p99 ms", f"{mk} ({mk_proto})", f"{ref} ({ref_proto})", a.get("p99_ms"),
                             b.get("p99_ms"), ratio(a.get("p99_ms"), b.get("p99_ms")), "lower"))
            elif what == "cpu":
                rows.append((group, label, "CPU s / M req", mk, ref, a.get("cpu_s_per_M"), b.get("cpu_s_per_M"),
                             ratio(a.get("cpu_s_per_M"), b.get("cpu_s_per_M")), "lower"))

        group = "W1 (100 B) and W2 (20 KiB), memkeep-bench, 16 connections"
        for wl in ("W1", "W2"):
            kv(wl, "memkeep-never", "memcache", "memcached", "memcache", "set")
            kv(wl, "memkeep-never", "memcache", "memcached", "memcache", "get")
            kv(wl, "memkeep-always", "memcache", "redis-always", "resp", "set")
            kv(wl, "memkeep-always", "resp", "redis-always", "resp", "set")
            kv(wl, "memkeep-always", "memcache", "memcached", "memcache", "get")
        for ph in ("set", "get"):
            kv("W2", "memkeep-always-vlog", "memcache", "redis-always", "resp", ph)
            kv("W2", "memkeep-never-vlog", "memcache", "memcached", "memcache", ph)
        for wl, title in (("W3", "W3 redis-benchmark"), ("W3b", "W3b hashes and sorted sets"),
                          ("W3z", "W3z ranks in a 100,000-member sorted set"),
                          ("tls", "TLS (redis-benchmark --tls, openssl s_time)"),
                          ("edits", "Small edits of 1 MiB values (APPEND, SETRANGE, BITFIELD)")):
            group = title
            for mk, ref in (("memkeep-always", "redis-always"), ("memkeep-never", "redis-nopersist")):
                tests = {"W3b": W3B_COMMANDS, "W3z": W3Z_COMMANDS, "edits": EDITS_COMMANDS,
                         "tls": TLS_TESTS + ["handshakes"]}.get(wl) or self.rb_tests(wl)
                for t in tests:
                    a, ea = self.rb_cell(wl, mk, t)
                    b, eb = self.rb_cell(wl, ref, t)
                    if a is None and b is None and not ea:
                        continue
                    rows.append((group, f"{wl} `{t}`", "req/s", mk, ref, "error" if ea else a,
                                 "error" if eb else b, ratio(a, b), "higher"))
        group = "W4 pogreb-bench shapes vs memcached (memcached protocol)"
        for wl, conns in (("W4a", 2), ("W4b", 10), ("W4b", 100)):
            for mk in ("memkeep-never", "memkeep-always"):
                for ph in ("set", "get"):
                    kv(wl, mk, "memcache", "memcached", "memcache", ph, conns)
        group = "Restart after W1: exec to first successful GET of an old key"
        refs = {r["server"]: r for r in self.restarts}
        for mk in ("memkeep-always", "memkeep-periodic", "memkeep-never"):
            for ref in ("redis-always", "redis-everysec"):
                if mk in refs and ref in refs:
                    a, b = refs[mk].get("first_get_s"), refs[ref].get("first_get_s")
                    rows.append((group, f"restart ({refs[mk]['keys']:,} keys)", "s to first GET", mk, ref,
                                 a, b, ratio(a, b), "lower"))
        group = "Transactions and a durable queue (memkeep --sync always vs Redis appendfsync always)"
        mk, ref = DURABLE_PAIR
        for wl, label, conns, consumers in self.durable_points():
            a = self.durable_phase(wl, mk, conns, consumers)
            b = self.durable_phase(wl, ref, conns, consumers)
            if not a or not b:
                continue
            unit = "SET/s" if wl == "multi" else "messages/s"
            rows.append((group, label, unit, mk, ref, a.get("ops_per_sec"), b.get("ops_per_sec"),
                         ratio(a.get("ops_per_sec"), b.get("ops_per_sec")), "higher"))
            rows.append((group, label, "p99 ms", mk, ref, a.get("p99_ms"), b.get("p99_ms"),
                         ratio(a.get("p99_ms"), b.get("p99_ms")), "lower"))
        group = "Server CPU seconds per million requests vs memcached"
        for wl, conns in (("W1", None), ("W2", None), ("W4a", 2), ("W4b", 10), ("W4b", 100)):
            for mk in ("memkeep-never", "memkeep-always"):
                for ph in ("set", "get"):
                    kv(wl, mk, "memcache", "memcached", "memcache", ph, conns, what="cpu")
        group = "On-disk size after the SET phase vs raw key+value bytes"
        for wl, conns in (("W1", None), ("W2", None), ("W4a", 2), ("W4b", 10)):
            for srv, proto in (("memkeep-always", "memcache"), ("memkeep-periodic", "memcache"),
                               ("memkeep-never", "memcache"), ("redis-always", "resp"), ("redis-everysec", "resp")):
                r = self.phase(wl, srv, proto, "set", conns)
                if r and r.get("disk_bytes") is not None:
                    rows.append((group, f"{wl}{'' if conns is None else f' c={conns}'} ({r['keys']:,} keys)",
                                 "disk / raw", srv, "raw key+value", r["disk_bytes"], r["raw_bytes"],
                                 ratio(r["disk_bytes"], r["raw_bytes"]), "lower"))
        return rows

    @staticmethod
    def _v(metric, x) -> str:
        if isinstance(x, str):
            return x
        if x is None:
            return "n/a"
        if metric.startswith("disk"):
            return fmt_mb(x)
        if metric.startswith("s to"):
            return f"{x * 1000:,.1f} ms"
        if metric == "p99 ms":
            return fmt_ms(x)
        if metric.startswith("CPU"):
            return f"{x:,.2f}"
        return fmt_n(x)

    def md_ratios(self, w) -> None:
        rows = self.ratio_rows()
        if not rows:
            return
        w("## Ratios: memkeep / reference, same run\n")
        w("*better* says which direction favours memkeep: for throughput a ratio above 1 means memkeep is "
          "faster; for latency, CPU, restart time and disk a ratio below 1 means memkeep is better. Where the "
          "reference is redis, memkeep's memcached-protocol and RESP rows are both shown.\n")
        # Headline: geometric mean of the ratios per group, memkeep server, reference and metric.
        agg: dict[tuple, list[float]] = {}
        for g, _t, metric, mk, ref, _a, _b, r, better in rows:
            if r is not None and r > 0 and metric != "p99 ms":
                agg.setdefault((g, mk, ref, metric, better), []).append(r)
        w("### Summary (geometric mean of the ratios below)\n")
        w("| group | memkeep | reference | metric | rows | geometric mean ratio | better |")
        w("|---|---|---|---|---|---|---|")
        for (g, mk, ref, metric, better), rs in agg.items():
            gm = 1.0
            for x in rs:
                gm *= x
            gm **= 1 / len(rs)
            w(f"| {g} | {mk} | {ref} | {metric} | {len(rs)} | {fmt_ratio(gm)} | {better} |")
        w("")
        current = None
        for g, target, metric, mk, ref, a, b, r, better in rows:
            if g != current:
                current = g
                w(f"\n### {g}\n")
                w("| target | metric | memkeep | reference | memkeep value | reference value | ratio | better |")
                w("|---|---|---|---|---|---|---|---|")
            w(f"| {target} | {metric} | {mk} | {ref} | {self._v(metric, a)} | {self._v(metric, b)} | "
              f"{fmt_ratio(r)} | {better} |")
        w("")

    # -- chart ---------------------------------------------------------------------------------

    def chart(self, path: Path) -> bool:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log("matplotlib not importable: no chart (run bench/deps.sh and use .venv/bin/python)")
            return False
        def kv_panel(shapes):
            groups = []
            for wl, conns in shapes:
                for ph in ("set", "get"):
                    if any(r["workload"] == wl and r["connections"] == conns and r["phase"] == ph for r in self.phases):
                        groups.append((wl, conns, ph))
            wls = {g[0] for g in groups}
            series = sorted({(r["server"], r["proto"]) for r in self.phases if r["workload"] in wls},
                            key=lambda s: (s[1] == "resp" and s[0] in MEMKEEP_MODES, SERVER_ORDER.get(s[0], 99)))
            return groups, series

        w12_groups, w12_series = kv_panel((("W1", 16), ("W2", 16)))
        w4_groups, w4_series = kv_panel((("W4a", 2), ("W4b", 10), ("W4b", 100)))
        rb3 = self.rb_tests("W3")
        rb3s = sorted({r["server"] for r in self.rbs if r["workload"] == "W3"}, key=lambda s: SERVER_ORDER.get(s, 99))
        rb3b = W3B_COMMANDS
        rb3bs = sorted({r["server"] for r in self.rbs if r["workload"] == "W3b"}, key=lambda s: SERVER_ORDER.get(s, 99))
        sc = [r for r in self.phases if r["workload"] == "scaling"]
        panels = [p for p in (("W12", w12_groups), ("W4", w4_groups), ("W3", rb3), ("W3b", rb3bs), ("scaling", sc))
                  if p[1]]
        if not panels:
            return False
        colors = {"memkeep-always": "#1f4e79", "memkeep-periodic": "#2e75b6", "memkeep-never": "#9dc3e6",
                  "memcached": "#548235", "redis-nopersist": "#f4b183", "redis-everysec": "#c55a11",
                  "redis-always": "#843c0c"}
        fig, axes = plt.subplots(len(panels), 1, figsize=(15, 5.2 * len(panels)))
        if len(panels) == 1:
            axes = [axes]

        def bars(ax, groups, names, value, title, labels):
            width = 0.85 / max(1, len(names))
            top = 0.0
            for j, nm in enumerate(names):
                xs, ys = [], []
                for i, g in enumerate(groups):
                    v = value(g, nm)
                    xs.append(i + (j - (len(names) - 1) / 2) * width)
                    if v == "error":
                        ax.text(xs[-1], 0, "×", ha="center", va="bottom", fontsize=8, color="red")
                        v = None
                    ys.append(v or 0)
                    top = max(top, v or 0)
                srv = nm[0] if isinstance(nm, tuple) else nm
                hatch = "//" if isinstance(nm, tuple) and nm[1] == "resp" and srv in MEMKEEP_MODES else None
                ax.bar(xs, ys, width, label=(f"{nm[0]} ({nm[1]})" if isinstance(nm, tuple) else nm),
                       color=colors.get(srv, "grey"), hatch=hatch, edgecolor="white" if not hatch else "black",
                       linewidth=0.3)
            ax.set_xticks(range(len(groups)))
            ax.set_xticklabels(labels, rotation=20 if len(groups) > 8 else 0, ha="right" if len(groups) > 8 else "center",
                               fontsize=8)
            ax.set_ylabel("requests / s")
            ax.set_title(title)
            ax.grid(axis="y", alpha=0.3)
            ax.set_ylim(0, top * 1.3 if top else 1)
            ax.legend(fontsize=7, ncol=5, loc="upper left")

        k = 0
        for kind, data in panels:
            ax = axes[k]
            k += 1
            if kind in ("W12", "W4"):
                groups, series = (w12_groups, w12_series) if kind == "W12" else (w4_groups, w4_series)
                bars(ax, groups, series,
                     lambda g, nm: self.kv_value(g[0], nm[0], nm[1], g[2], g[1]),
                     "memkeep-bench W1 (100 B values) and W2 (20 KiB values), 16 connections; hatched = memkeep over RESP"
                     if kind == "W12" else
                     "memkeep-bench W4 (pogreb-bench shapes, memcached protocol): W4a 16-64 B keys, 128-512 B values; "
                     "W4b 8 B keys, 16 B values",
                     [f"{g[0]}" + ("" if kind == "W12" else f" c={g[1]}") + f" {g[2].upper()}" for g in groups])
            elif kind == "W3":
                bars(ax, rb3, rb3s, lambda t, s: self.rb_value("W3", s, t),
                     "W3: redis-benchmark (50 clients; × = error)",
                     [t.replace(" (needed to benchmark LRANGE)", " (for LRANGE)").split(" (first")[0] for t in rb3])
            elif kind == "W3b":
                bars(ax, rb3b, rb3bs, lambda t, s: self.rb_value("W3b", s, t),
                     "W3b: hashes and sorted sets (50 clients, -r 10000; × = error)",
                     [t.replace("__rand_int__", "r").replace("WITHSCORES LIMIT 0 100", "WS L100") for t in rb3b])
            else:
                for s, p in sorted({(r["server"], r["proto"]) for r in sc}, key=lambda s: SERVER_ORDER.get(s[0], 99)):
                    pts = sorted((r["connections"], r.get("ops_per_sec") or 0) for r in sc
                                 if r["server"] == s and r["proto"] == p)
                    ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=f"{s} ({p})",
                            color=colors.get(s, "grey"))
                ax.set_xscale("log", base=2)
                ticks = sorted({r["connections"] for r in sc})
                ax.set_xticks(ticks)
                ax.set_xticklabels([str(t) for t in ticks])
                ax.set_xlabel("connections")
                ax.set_ylabel("SET / s")
                ax.set_title("Connection scaling: W1 SET")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7, ncol=4)
        fig.suptitle(f"memkeep vs memcached vs Redis, {self.meta.get('date', '')}, "
                     f"{self.meta.get('machine', {}).get('nproc', '?')} cores shared with the client "
                     f"(scale {self.meta.get('scale', 1)})", fontsize=11)
        fig.tight_layout(rect=(0, 0, 1, 0.98))
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        plt.close(fig)
        return True


def write_report(records: list[dict], out: Path, chart: Path | None) -> None:
    rep = Report(records)
    chart_rel = None
    if chart is not None and rep.chart(chart):
        chart_rel = os.path.relpath(chart, out.parent)
        log(f"chart: {chart}")
    out.parent.mkdir(parents=True, exist_ok=True)
    text = rep.markdown(chart_rel)
    # bench/bigdata.py's section is not this run's: carry it over as it was.
    kept = extract_section(out.read_text(), BIGDATA_SECTION) if out.exists() else None
    if kept:
        text = replace_section(text, BIGDATA_SECTION, kept)
    out.write_text(text)
    log(f"report: {out}" + (f" (kept its {BIGDATA_SECTION!r} section)" if kept else ""))


BIGDATA_SECTION = "## Data larger than memory"


def section_span(text: str, title: str) -> tuple[int, int] | None:
    """Character span of the level-2 section `title` of a markdown text: from its heading to the
    next level-2 heading outside a code fence (or the end); None when there is none."""
    pos, start, fence = 0, None, False
    for ln in text.splitlines(keepends=True):
        if ln.startswith("```"):
            fence = not fence
        elif not fence:
            if start is None and ln.rstrip("\n") == title:
                start = pos
            elif start is not None and ln.startswith("## "):
                return start, pos
        pos += len(ln)
    return None if start is None else (start, len(text))


def replace_section(text: str, title: str, body: str) -> str:
    """`text` with its section `title` replaced by `body`, or `body` appended after the rest."""
    body = body.rstrip("\n") + "\n"
    span = section_span(text, title)
    if span is None:
        return (text.rstrip("\n") + "\n\n" if text.strip() else "") + body
    a, b = span
    return text[:a] + body + ("\n" + text[b:] if b < len(text) else "")


def extract_section(text: str, title: str) -> str | None:
    """The section `title` of `text`, heading included, or None."""
    span = section_span(text, title)
    return None if span is None else text[span[0]:span[1]].rstrip("\n") + "\n"


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--only", default=",".join(ALL_WORKLOADS),
                   help=f"comma-separated workloads (default all: {','.join(ALL_WORKLOADS)})")
    p.add_argument("--servers", default="", help=f"comma-separated servers (default all: {','.join(ALL_SERVERS)})")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every N (keys, requests) by this")
    p.add_argument("--out", default=str(REPO / "BENCHMARKS.md"), help="markdown report (default BENCHMARKS.md)")
    p.add_argument("--chart", default=str(REPO / "bench" / "throughput.svg"),
                   help="chart path (default bench/throughput.svg); '' for none")
    p.add_argument("--keep-json", metavar="PATH", help="append the JSON result lines here (default: a temp dir)")
    p.add_argument("--from-json", metavar="PATH", help="render --out/--chart from a results file; run nothing")
    p.add_argument("--no-build", action="store_true", help="skip `cargo build --release`")
    p.add_argument("--bin-dir", default=str(REPO / "target" / "release"), help="where memkeep and memkeep-bench are")
    p.add_argument("--tmp", default=None, help="parent of the temporary data directories (default $TMPDIR or /tmp)")
    p.add_argument("--n-w1", type=int, default=300_000, help="W1 keys (default 300000)")
    p.add_argument("--n-w2", type=int, default=20_000, help="W2 keys (default 20000)")
    p.add_argument("--n-w3", type=int, default=50_000, help="W3 redis-benchmark -n (default 50000)")
    p.add_argument("--n-w3b", type=int, default=30_000, help="W3b redis-benchmark -n (default 30000)")
    p.add_argument("--n-eval", type=int, default=100_000,
                   help="eval redis-benchmark -n per round (default 100000)")
    p.add_argument("--n-edits", type=int, default=20_000, help="edits redis-benchmark -n per command (default 20000)")
    p.add_argument("--n-w4a", type=int, default=300_000, help="W4a keys (default 300000)")
    p.add_argument("--n-w4b", type=int, default=1_000_000, help="W4b keys (default 1000000)")
    p.add_argument("--n-scaling", type=int, default=2_000_000,
                   help="connection sweep: most keys one point writes (default 2000000; the time ends it first)")
    p.add_argument("--phase-cap", type=float, default=300.0,
                   help="memkeep-bench --duration-limit per phase, seconds (default 300)")
    p.add_argument("--scaling-secs", "--scaling-cap", dest="scaling_secs", type=float, default=4.0,
                   help="connection sweep: seconds of SET per point (default 4; 1.5-4 s below --scale 0.2)")
    p.add_argument("--rb-timeout", type=float, default=180.0, help="timeout per redis-benchmark run (default 180)")
    p.add_argument("--n-multi", type=int, default=1_000_000,
                   help="multi: most keys one point writes (default 1000000; the time ends it first)")
    p.add_argument("--n-queue", type=int, default=1_000_000,
                   help="queue: most messages one point pushes (default 1000000; the time ends it first)")
    p.add_argument("--rounds", type=int, default=2,
                   help="scaling, multi and queue: runs of each point, every other one in reverse server order; "
                        "the report gives the median (default 2)")
    p.add_argument("--durable-secs", type=float, default=8.0,
                   help="multi and queue: seconds of writes per point (default 8; 1.5-8 s below --scale 0.2)")
    a = p.parse_args(argv)
    a.only = [w.strip() for w in a.only.split(",") if w.strip()]
    bad = [w for w in a.only if w not in ALL_WORKLOADS]
    if bad:
        p.error(f"unknown workload(s) {bad}; choose from {ALL_WORKLOADS}")
    a.servers = [s.strip() for s in a.servers.split(",") if s.strip()]
    bad = [s for s in a.servers if s not in ALL_SERVERS]
    if bad:
        p.error(f"unknown server(s) {bad}; choose from {ALL_SERVERS}")
    if not (0 < a.scale <= 100):
        p.error("--scale must be in (0, 100]")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    chart = Path(args.chart).resolve() if args.chart else None
    if args.from_json:
        records = [json.loads(ln) for ln in Path(args.from_json).read_text().splitlines() if ln.strip()]
        # The file may hold several runs (--keep-json appends): render the last one.
        starts = [i for i, r in enumerate(records) if r.get("type") == "meta"]
        records = records[starts[-1]:] if starts else records
        write_report(records, out, chart)
        return 0

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="memkeep-bench.", dir=args.tmp))
    (tmp / "data").mkdir()
    (tmp / "logs").mkdir()
    jsonl = Path(args.keep_json).resolve() if args.keep_json else tmp / "results.jsonl"
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    sampler = MemSampler()
    runner = None
    rc = 0
    try:
        if not args.no_build:
            log("cargo build --release")
            p = subprocess.run(["cargo", "build", "--release"], cwd=REPO, timeout=1800, stdin=subprocess.DEVNULL)
            if p.returncode != 0:
                raise BenchError("cargo build --release failed")
        bins = find_bins(args)
        # Snapshot the binaries: another build of the tree during the run must not change them.
        (tmp / "bin").mkdir()
        for k in ("memkeep", "memkeep-bench"):
            bins[k] = str(shutil.copy2(bins[k], tmp / "bin" / k))
        runner = Runner(args, bins, tmp, jsonl)
        meta = {
            "type": "meta", "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
            "scale": args.scale, "only": args.only, "machine": machine_info(tmp),
            "versions": {
                "memkeep": f"{cmd_out([bins['memkeep'], '--version'])}, commit {git_commit()} "
                           f"(`cargo build --release` of the working tree)",
                "memcached": cmd_out([bins["memcached"], "-V"]),
                "redis-server": cmd_out([bins["redis-server"], "--version"]),
                "redis-benchmark": cmd_out([bins["redis-benchmark"], "--version"]),
                "rustc": cmd_out(["rustc", "--version"]),
                "python": sys.version.split()[0],
            },
            "argv": sys.argv[1:],
        }
        runner.record(meta)
        sampler.start()
        runner.run()
    except KeyboardInterrupt:
        log("interrupted: stopping servers")
        rc = 130
    except BenchError as e:
        log(f"error: {e}")
        rc = 1
    finally:
        sampler.stop_event.set()
        stop_all()
        elapsed = time.monotonic() - t_start
        try:
            rc = finish(runner, rc, elapsed, out, chart, jsonl)
        finally:
            if args.keep_json:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                shutil.rmtree(tmp / "data", ignore_errors=True)
                log(f"results (JSON lines) and server logs: {tmp}")
        log(f"done in {elapsed:.0f} s" + (f"; {len(runner.failures)} failure(s)" if runner and runner.failures else ""))
    return rc


def finish(runner: Runner | None, rc: int, elapsed: float, out: Path, chart: Path | None, jsonl: Path) -> int:
    """Records the end of the run and writes the report (not after Ctrl-C); returns the exit code."""
    if runner is None:
        return rc
    runner.record({"type": "end", "elapsed_s": elapsed, "failures": runner.failures, "interrupted": rc == 130,
                   "loadavg_end": open("/proc/loadavg").read().split()[:3]})
    # The commands are known only once they ran; put them into the meta record.
    for r in runner.records:
        if r["type"] == "meta":
            r["commands"] = runner.commands
    with open(jsonl, "a") as f:
        f.write(json.dumps({"type": "meta_commands", "commands": runner.commands}) + "\n")
    if rc != 130:
        try:
            write_report(runner.records, out, chart)
        except Exception as e:  # noqa: BLE001 - the raw results are still in the JSON file
            log(f"report failed: {e!r}; raw results in {jsonl}")
            rc = rc or 1
    return rc

if __name__ == "__main__":
    sys.exit(main())
