#!/usr/bin/env python3
"""Data larger than memory: each server alone in a memory-capped cgroup, against fio's figures.

Usage (from the repo root, as root; `make bench-bigdata` runs it through ./.venv/bin/python):

    bench/bigdata.py [--cap 1g] [--big-keys 150000] [--small-keys 5000000] [--max-secs 120]
                     [--servers memkeep-never,...] [--workloads big,small,cache]
                     [--out BENCHMARKS.md] [--keep-json PATH] [--tmp DIR]
    bench/bigdata.py --cap 256m --big-keys 40000 --small-keys 500000 --max-secs 30 \\
                     --fio-secs 10 --out /tmp/bigdata/BENCHMARKS.md        # a quick run
    bench/bigdata.py --from-json results.jsonl --out BENCHMARKS.md        # re-render
    bench/bigdata.py --servers memkeep-never --workloads big --phases get \
                     --fio-jobs seqwrite,randread --out /tmp/bigdata/BENCHMARKS.md  # the cold GET alone

It rewrites only the `## Data larger than memory` section of --out (appending it when
missing) and leaves the rest of the file alone.

Servers (each started fresh per workload, alone, in its own cgroup with the memory cap):
  memkeep-never / -always / -periodic   memkeep --sync MODE (memcached text protocol)
  memkeep-never-vlog / -always-vlog     the same with --value-log-min 8k (values only in the log)
  redis-everysec                        redis-server, AOF fsync'd every second, maxmemory
                                        --redis-maxmemory-frac of the cap with noeviction (past
                                        it SETs get "-OOM" errors, which are counted; without a
                                        maxmemory the kernel's OOM killer ends it)
  memcached                             memcached -m (--memcached-mem-frac of the cap)

Physical reference (fio, in the same kind of cgroup, on the file system of the data dirs):
  sequential write of one file of the 20 KiB data set's size (1 MiB blocks, fsync at the end),
  then 16 jobs of random 20 KiB preads (psync, buffered like the servers) on that file.

Workloads (16 connections, one request in flight each; every phase stops after --max-secs and
reports the rate over what it did; every GET value is verified byte for byte):
  big    --big-keys values of --value-size (20 KiB): SET all in key order, then GET all of the
         keys that were written in random order, then a mixed phase of 90% GETs / 10% SETs on
         uniformly drawn keys
  small  --small-keys values of 100 bytes: the same three phases
  cache  memkeep --max-disk (half the big data set) vs memcached at the same memory: SET all,
         then zipfian GETs; hit rates. Skipped for memkeep when it rejects --max-disk.

Before each server: `sync; echo 3 > /proc/sys/vm/drop_caches`. The load generator
(memkeep-bench) runs outside the cgroup. At the end of each workload the server's RssAnon
(/proc/PID/status) and the cgroup's peak usage and OOM kills are recorded. The machine is
shared: the figures are noisy, and this script only measures (no pass/fail on timings).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as common  # noqa: E402  (bench/run.py: /proc readings, ports, environment)

REPO = common.REPO
SECTION = common.BIGDATA_SECTION
MEMKEEP_MODES = {
    "memkeep-never": ["--sync", "never"],
    "memkeep-always": ["--sync", "always"],
    # Values of 8 KiB and more only in the log (value_log_min, off by default).
    "memkeep-never-vlog": ["--sync", "never", "--value-log-min", "8k"],
    "memkeep-always-vlog": ["--sync", "always", "--value-log-min", "8k"],
    "memkeep-periodic": ["--sync", "periodic", "--sync-interval-ms", "1000"],
}
ALL_SERVERS = list(MEMKEEP_MODES) + ["redis-everysec", "memcached"]
ALL_WORKLOADS = ["big", "small", "cache"]
ALL_PHASES = ["get", "mixed"]
ALL_FIO_JOBS = ["seqwrite", "randread", "randread-mmap-random", "randread-mmap-readaround"]
log = common.log


class BenchError(Exception):
    pass


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1g, 256m)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * mult)


def show(argv: list[str]) -> str:
    """A shell command line for the report; `$PORT`-style placeholders stay unquoted."""
    return " ".join(a if re.fullmatch(r"[\w./=,:-]*\$[A-Z_]+[\w./=,:-]*", a) else shlex.quote(a) for a in argv)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------------------------
# Memory-capped cgroups (v1 and v2; systemd-run scopes where systemd runs the machine)
# ---------------------------------------------------------------------------------------------


class CgroupHost:
    """Finds how to make memory-capped cgroups here; `make(name, cap)` returns a Cgroup."""

    def __init__(self, mode: str = "auto"):
        self.version, self.root = self._detect()
        self.own = self._own_path()
        self.systemd = False
        if mode in ("auto", "systemd"):
            self.systemd = self._systemd_works()
            if mode == "systemd" and not self.systemd:
                raise BenchError("--cgroup-mode systemd: systemd-run --scope does not work here")

    @staticmethod
    def _detect() -> tuple[int, Path]:
        if Path("/sys/fs/cgroup/cgroup.controllers").exists():
            return 2, Path("/sys/fs/cgroup")
        if Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists():
            return 1, Path("/sys/fs/cgroup/memory")
        uni = Path("/sys/fs/cgroup/unified")
        if (uni / "cgroup.controllers").exists() and "memory" in (uni / "cgroup.controllers").read_text().split():
            return 2, uni
        raise BenchError("no cgroup memory controller found (neither /sys/fs/cgroup/memory nor a cgroup2 "
                         "mount with the memory controller); `mount | grep cgroup` shows what there is")

    def _own_path(self) -> str:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            num, ctrls, path = line.split(":", 2)
            if self.version == 1 and "memory" in ctrls.split(","):
                return path
            if self.version == 2 and num == "0" and ctrls == "":
                return path
        return "/"

    def _systemd_works(self) -> bool:
        if not Path("/run/systemd/system").is_dir() or not shutil.which("systemd-run"):
            return False
        prop = "MemoryMax" if self.version == 2 else "MemoryLimit"
        try:
            p = subprocess.run(["systemd-run", "--scope", "--quiet", "-p", f"{prop}=64M", "true"],
                               capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
            return p.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def describe(self) -> str:
        how = "systemd-run --scope" if self.systemd else "a cgroup directory made by the script"
        return f"cgroup v{self.version} ({self.root}), {how}"

    def _v2_parent(self) -> Path:
        """The nearest ancestor of our own cgroup whose children get the memory controller."""
        path = Path(self.own)
        while True:
            d = self.root / str(path).lstrip("/")
            ctl = d / "cgroup.subtree_control"
            if ctl.exists() and "memory" in ctl.read_text().split():
                return d
            if str(path) == "/":
                break
            path = path.parent
        try:
            (self.root / "cgroup.subtree_control").write_text("+memory")
        except OSError as e:
            raise BenchError(f"cannot enable the memory controller in {self.root}: {e}") from e
        return self.root

    def make(self, name: str, cap: int) -> "Cgroup":
        unit = f"{name}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
        if self.systemd:
            return Cgroup(self, None, unit, cap)
        if self.version == 1:
            # A child of our own memory cgroup: the capped servers stay inside whatever holds us.
            parent = self.root / self.own.lstrip("/")
        else:
            parent = self._v2_parent()
        d = parent / unit
        d.mkdir()
        cg = Cgroup(self, d, unit, cap)
        try:
            if self.version == 1:
                (d / "memory.limit_in_bytes").write_text(str(cap))
                # No swap here normally; if there is, the cap covers it too.
                sw = d / "memory.memsw.limit_in_bytes"
                if sw.exists():
                    try:
                        sw.write_text(str(cap))
                    except OSError:
                        pass
            else:
                (d / "memory.max").write_text(str(cap))
                if (d / "memory.swap.max").exists():
                    (d / "memory.swap.max").write_text("0")
        except OSError:
            cg.remove()
            raise
        return cg


class Cgroup:
    def __init__(self, host: CgroupHost, path: Path | None, unit: str, cap: int):
        self.host, self.path, self.unit, self.cap = host, path, unit, cap
        self.pid: int | None = None

    def wrap(self, argv: list[str]) -> list[str]:
        """argv that runs `argv` inside this cgroup (the exec'd process keeps the Popen pid)."""
        if self.host.systemd:
            prop = "MemoryMax" if self.host.version == 2 else "MemoryLimit"
            extra = ["-p", "MemorySwapMax=0"] if self.host.version == 2 else []
            return ["systemd-run", "--scope", "--quiet", f"--unit={self.unit}", "-p", f"{prop}={self.cap}",
                    *extra, "--"] + argv
        assert self.path is not None
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")] + argv

    def dir(self) -> Path | None:
        """The cgroup directory (for systemd scopes, found through the process)."""
        if self.path is not None:
            return self.path
        if self.pid is None:
            return None
        try:
            for line in Path(f"/proc/{self.pid}/cgroup").read_text().splitlines():
                num, ctrls, p = line.split(":", 2)
                if (self.host.version == 1 and "memory" in ctrls.split(",")) or (
                        self.host.version == 2 and num == "0"):
                    d = self.host.root / p.lstrip("/")
                    self._scope_dir = d
                    return d
        except OSError:
            pass
        return getattr(self, "_scope_dir", None)

    def _read(self, name: str) -> str | None:
        d = self.dir()
        try:
            return (d / name).read_text() if d else None
        except OSError:
            return None

    def usage(self) -> int | None:
        v = self._read("memory.usage_in_bytes" if self.host.version == 1 else "memory.current")
        return int(v) if v and v.strip().isdigit() else None

    def stats(self) -> dict:
        """Peak usage, OOM kills, times the limit was hit, the limit as the kernel has it."""
        out: dict = {}
        if self.host.version == 1:
            for key, f in (("peak_bytes", "memory.max_usage_in_bytes"), ("limit_bytes", "memory.limit_in_bytes"),
                           ("failcnt", "memory.failcnt")):
                v = self._read(f)
                out[key] = int(v) if v and v.strip().isdigit() else None
            oc = self._read("memory.oom_control") or ""
            m = re.search(r"oom_kill (\d+)", oc)
            out["oom_kills"] = int(m.group(1)) if m else None
        else:
            v = self._read("memory.peak")
            out["peak_bytes"] = int(v) if v and v.strip().isdigit() else None
            v = self._read("memory.max")
            out["limit_bytes"] = int(v) if v and v.strip().isdigit() else None
            ev = self._read("memory.events") or ""
            m = re.search(r"oom_kill (\d+)", ev)
            out["oom_kills"] = int(m.group(1)) if m else None
            m = re.search(r"^max (\d+)", ev, re.M)
            out["failcnt"] = int(m.group(1)) if m else None
        st = self._read("memory.stat") or ""
        for key in ("cache", "rss", "mapped_file", "dirty", "writeback", "anon", "file", "file_dirty"):
            m = re.search(rf"^{key} (\d+)", st, re.M)
            if m:
                out[f"stat_{key}"] = int(m.group(1))
        return out

    def remove(self) -> None:
        d = self.path
        if d is None or not d.exists():
            return
        for _ in range(100):
            try:
                procs = (d / "cgroup.procs").read_text().split()
            except OSError:
                procs = []
            for p in procs:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            try:
                d.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        log(f"could not remove cgroup {d}")


# ---------------------------------------------------------------------------------------------
# Servers in cgroups
# ---------------------------------------------------------------------------------------------


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError as e:
        log(f"cannot drop caches ({e}); the page cache stays warm")
        return False


def ping_memcache(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(1)
            s.sendall(b"version\r\n")
            return s.recv(4096).startswith(b"VERSION")
    except OSError:
        return False


def ping_resp(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(1)
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(4096).startswith(b"+PONG")
    except OSError:
        return False


class CappedServer:
    def __init__(self, name: str, args, bins: dict, tmp: Path, tag: str, host: CgroupHost,
                 max_disk: int | None = None):
        self.name, self.args, self.bins, self.tag = name, args, bins, tag
        self.port = common.free_ports(1)[0]
        self.proto = "resp" if name.startswith("redis") else "memcache"
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"{name}.{tag}.", dir=tmp / "data"))
        self.logfile = tmp / "logs" / f"{name}.{tag}.log"
        self.cg = host.make(f"memkeep-bench-{name}", args.cap)
        self.max_disk = max_disk
        self.proc: subprocess.Popen | None = None
        self.peak_anon_kb = 0
        self._stop_sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    def argv(self, port: str = None, data_dir: str = None, logfile: str = None) -> list[str]:
        port = port or str(self.port)
        data_dir = data_dir or str(self.data_dir)
        logfile = logfile or str(self.logfile)
        cap_mib = self.args.cap >> 20
        if self.name in MEMKEEP_MODES:
            argv = [self.bins["memkeep"], "-p", port, "--resp-port", "0", "-l", "127.0.0.1", "-H", data_dir]
            argv += MEMKEEP_MODES[self.name]
            if self.max_disk is not None:
                argv += ["--max-disk", str(self.max_disk)]
            return argv
        if self.name == "memcached":
            mb = max(8, int(cap_mib * self.args.memcached_mem_frac))
            argv = [self.bins["memcached"], "-p", port, "-l", "127.0.0.1", "-U", "0", "-m", str(mb), "-t", "2"]
            if os.geteuid() == 0:
                argv += ["-u", "root"]
            return argv
        if self.name == "redis-everysec":
            argv = [self.bins["redis-server"], "--port", port, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "yes", "--appendfsync", "everysec", "--dir", data_dir, "--logfile", logfile]
            if self.args.redis_maxmemory_frac > 0:
                argv += ["--maxmemory", str(int(self.args.cap * self.args.redis_maxmemory_frac)),
                         "--maxmemory-policy", "noeviction"]
            return argv
        raise ValueError(self.name)

    def argv_template(self) -> str:
        a = self.argv("$PORT", "$DIR", "$DIR/redis.log")
        a[0] = Path(a[0]).name
        return show(a)

    def start(self, timeout: float = 60.0) -> None:
        out = open(self.logfile, "ab")
        self.proc = subprocess.Popen(self.cg.wrap(self.argv()), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.cg.pid = self.proc.pid
        ping = ping_resp if self.proto == "resp" else ping_memcache
        deadline = time.monotonic() + timeout
        while not ping(self.port):
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode} at start: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name} not ready within {timeout} s: {self.log_tail()}")
            time.sleep(0.01)
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop_sampling.wait(0.5):
            self.mem()

    def mem(self) -> dict:
        if not self.proc or self.proc.poll() is not None:
            return {}
        m = common.proc_mem(self.proc.pid)
        self.peak_anon_kb = max(self.peak_anon_kb, m.get("RssAnon", 0))
        return m

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 8) -> str:
        try:
            return " / ".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> int | None:
        self._stop_sampling.set()
        if not self.proc:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                log(f"{self.name}: no exit 120 s after SIGTERM; SIGKILL")
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode

    def cleanup(self) -> None:
        try:
            self.stop()
        finally:
            self.cg.remove()
            shutil.rmtree(self.data_dir, ignore_errors=True)


def memkeep_has_max_disk(memkeep: str) -> bool:
    try:
        p = subprocess.run([memkeep, "--help"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        return "--max-disk" in p.stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


class Runner:
    def __init__(self, args, bins: dict, tmp: Path, jsonl: Path, host: CgroupHost):
        self.args, self.bins, self.tmp, self.jsonl, self.host = args, bins, tmp, jsonl, host
        self.records: list[dict] = []
        self.commands: dict[str, str] = {}
        self.failures: list[str] = []
        self.live: list[CappedServer] = []

    def record(self, rec: dict) -> dict:
        rec["ts"] = time.time()
        self.records.append(rec)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
        return rec

    def fail(self, msg: str) -> None:
        log("PROBLEM: " + msg)
        self.failures.append(msg)

    # -- fio -----------------------------------------------------------------------------------

    def fio(self) -> None:
        a = self.args
        d = self.tmp / "data" / "fio"
        d.mkdir()
        size = a.big_keys * a.value_size
        f = d / "fio.dat"
        seq = ["--name=seqwrite", f"--filename={f}", "--rw=write", "--bs=1M", f"--size={size}",
               "--ioengine=psync", "--end_fsync=1", "--output-format=json"]
        rnd = ["--name=randread", f"--filename={f}", "--rw=randread", f"--bs={a.value_size // 1024}k",
               f"--size={size}", "--numjobs=16", "--ioengine=psync", "--randrepeat=0", "--time_based",
               f"--runtime={a.fio_secs:g}", "--group_reporting", "--output-format=json"]
        # The same reads through a memory map, as an mmap-based store (LMDB) does them: with
        # madvise(MADV_RANDOM) (fio --fadvise_hint=1 on a random job), and with the kernel's
        # default fault read-around (--fadvise_hint=0). For reference; ratios use the psync row.
        base = [x for x in rnd if not x.startswith("--name=")]
        mm_rnd = ["--name=randread-mmap-madv-random", *base, "--ioengine=mmap", "--fadvise_hint=1"]
        mm_ra = ["--name=randread-mmap-readaround", *base, "--ioengine=mmap", "--fadvise_hint=0"]
        mm_rnd.remove("--ioengine=psync")
        mm_ra.remove("--ioengine=psync")
        tmpl = lambda argv: show(["fio"] + [x.replace(str(f), "$DIR/fio.dat") for x in argv])  # noqa: E731
        self.commands["fio sequential write (in the cgroup)"] = tmpl(seq)
        self.commands["fio random read (in the cgroup)"] = tmpl(rnd)
        self.commands["fio random read through mmap, MADV_RANDOM (in the cgroup)"] = tmpl(mm_rnd)
        self.commands["fio random read through mmap, default read-around (in the cgroup)"] = tmpl(mm_ra)
        try:
            for kind, argv in (("seqwrite", seq), ("randread", rnd), ("randread-mmap-random", mm_rnd),
                               ("randread-mmap-readaround", mm_ra)):
                if kind not in a.fio_jobs:
                    continue
                dropped = drop_caches()
                cg = self.host.make(f"memkeep-bench-fio-{kind}", a.cap)
                rec = {"type": "fio", "kind": kind, "size": size, "caches_dropped": dropped}
                try:
                    p = subprocess.run(cg.wrap([self.bins["fio"]] + argv), capture_output=True, text=True,
                                       timeout=a.fio_secs + 1800, stdin=subprocess.DEVNULL)
                    rec["cgroup"] = cg.stats()
                finally:
                    cg.remove()
                if p.returncode != 0:
                    rec["error"] = f"fio exit {p.returncode}: {p.stderr.strip()[-300:]}"
                else:
                    j = json.loads(p.stdout[p.stdout.index("{"):])
                    job = j["jobs"][0]
                    side = job["write"] if kind == "seqwrite" else job["read"]
                    rec["bw_mb_s"] = side["bw_bytes"] / 1e6
                    rec["iops"] = side["iops"]
                    rec["secs"] = job.get("job_runtime", side.get("runtime", 0)) / 1000
                    pct = (side.get("clat_ns") or {}).get("percentile") or {}
                    rec["p50_ms"] = pct.get("50.000000", 0) / 1e6 if pct else None
                    rec["p99_ms"] = pct.get("99.000000", 0) / 1e6 if pct else None
                self.record(rec)
                if rec.get("error"):
                    self.fail(f"fio {kind}: {rec['error']}")
                else:
                    log(f"  fio {kind}: {rec['bw_mb_s']:.1f} MB/s, {rec['iops']:.0f} IOPS, "
                        f"p99 {rec['p99_ms']} ms, cgroup peak {fmt_bytes(rec['cgroup'].get('peak_bytes'))}")
        finally:
            shutil.rmtree(d, ignore_errors=True)

    # -- memkeep-bench -------------------------------------------------------------------------

    def bench(self, srv: CappedServer, workload: str, label: str, keys: int, value: int, phase: str,
              extra: list[str]) -> dict:
        def argv(port: str) -> list[str]:
            return [self.bins["memkeep-bench"], "--host", "127.0.0.1", "--port", port, "--protocol", srv.proto,
                    "--connections", str(self.args.connections), "--keys", str(keys), "--value-size", str(value),
                    "--phases", phase, *extra, "--json", "--timeout", "30",
                    "--duration-limit", f"{self.args.max_secs:g}"]
        tmpl = argv("$PORT")
        tmpl[0] = "memkeep-bench"
        self.commands.setdefault(f"{workload} {label} ({srv.proto})", show(tmpl))
        rec = {"type": "phase", "workload": workload, "server": srv.name, "label": label, "keys_arg": keys,
               "value_size": value}
        cpu0 = common.proc_cpu(srv.proc.pid)
        for attempt in (1, 2):
            try:
                p = subprocess.run(argv(str(srv.port)), capture_output=True, text=True,
                                   timeout=self.args.max_secs + 120, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                rec["error"] = "memkeep-bench timed out"
                break
            if p.returncode < 0 and attempt == 1 and srv.alive():
                # Killed by a signal this script never sends (on a shared machine, someone's
                # kill by name): run the phase once more, and say so.
                rec["retried"] = f"memkeep-bench was killed by signal {-p.returncode} from outside; phase run again"
                log(f"  {workload} {srv.name} {label}: {rec['retried']}")
                cpu0 = common.proc_cpu(srv.proc.pid)
                continue
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if lines:
                rec.update(json.loads(lines[-1]))
            rec["exit"] = p.returncode
            notes = [ln for ln in p.stderr.splitlines() if ln.strip()]
            if notes:
                rec["notes"] = notes[:6]
            if p.returncode < 0:
                rec["error"] = f"memkeep-bench killed by signal {-p.returncode} (not sent by bench/bigdata.py)"
            elif p.returncode == 2 or not lines:
                rec["error"] = f"memkeep-bench exit {p.returncode}: {p.stderr.strip()[-300:]}"
            break
        cpu1 = common.proc_cpu(srv.proc.pid) if srv.alive() else None
        rec["server_cpu_s"] = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        rec["server_alive"] = srv.alive()
        rec["cgroup_usage_bytes"] = srv.cg.usage()
        self.record(rec)
        if rec.get("error"):
            self.fail(f"{workload} {srv.name} {label}: {rec['error']}")
        ops = rec.get("ops_per_sec")
        log(f"  {workload} {srv.name:16} {label:10} {rec.get('ops', 0):>9,}/{rec.get('planned', keys):,} ops in "
            f"{rec.get('secs', 0):.1f} s: {ops if ops is not None else '-'} ops/s, "
            f"{rec.get('mb_per_sec', 0):.1f} MB/s, p99 {rec.get('p99_ms', '-')} ms, misses {rec.get('misses')}, "
            f"errors {rec.get('errors')}, mismatches {rec.get('mismatches')}"
            + ("" if srv.alive() else f"  SERVER DIED (exit {srv.proc.returncode})")
            + (f"  ERROR {rec['error']}" if rec.get("error") else ""))
        return rec

    def instance_summary(self, srv: CappedServer, workload: str, extra: dict | None = None) -> None:
        m = srv.mem()
        alive = srv.alive()
        rec = {"type": "instance", "workload": workload, "server": srv.name, "argv": srv.argv_template(),
               "rss_anon_kb_end": m.get("RssAnon"), "rss_file_kb_end": m.get("RssFile"),
               "rss_anon_peak_kb": srv.peak_anon_kb, "alive_at_end": alive,
               "exit": None if alive else srv.proc.returncode, "disk_bytes": common.du(srv.data_dir),
               "cgroup": srv.cg.stats()}
        rec.update(extra or {})
        if not alive:
            rec["log_tail"] = srv.log_tail()
        self.record(rec)
        cg = rec["cgroup"]
        log(f"  {workload} {srv.name:16} RssAnon end {rec['rss_anon_kb_end']} kB, cgroup peak "
            f"{fmt_bytes(cg.get('peak_bytes'))}, OOM kills {cg.get('oom_kills')}, disk {fmt_bytes(rec['disk_bytes'])}")
        if not alive:
            self.fail(f"{workload} {srv.name}: server exited ({srv.proc.returncode}) during the workload; OOM kills "
                      f"{cg.get('oom_kills')}; log: {rec.get('log_tail', '')[:300]}")

    def new_server(self, name: str, workload: str, max_disk: int | None = None) -> CappedServer:
        dropped = drop_caches()
        srv = CappedServer(name, self.args, self.bins, self.tmp, workload, self.host, max_disk)
        self.live.append(srv)
        srv.caches_dropped = dropped
        srv.start()
        return srv

    def done(self, srv: CappedServer) -> None:
        srv.cleanup()
        if srv in self.live:
            self.live.remove(srv)

    def kv_workload(self, workload: str, keys: int, value: int) -> None:
        a = self.args
        for name in a.servers:
            try:
                srv = self.new_server(name, workload)
            except (BenchError, OSError) as e:
                self.fail(f"{workload} {name}: {e}")
                continue
            try:
                s = self.bench(srv, workload, "SET", keys, value, "set", ["--order", "sequential"])
                written = s.get("prefix_done")
                if written is None:
                    written = keys if s.get("complete") else 0
                if srv.alive() and written and "get" in a.phases:
                    self.bench(srv, workload, "GET", written, value, "get", ["--order", "random"])
                if srv.alive() and written and "mixed" in a.phases:
                    self.bench(srv, workload, "mixed 90/10", written, value, "mixed",
                               ["--requests", str(a.mixed_requests), "--get-fraction", "0.9", "--key-dist", "uniform"])
                self.instance_summary(srv, workload, {"keys_written": written, "keys_planned": keys,
                                                      "caches_dropped": srv.caches_dropped})
            except (BenchError, OSError) as e:
                self.fail(f"{workload} {name}: {e}")
            finally:
                self.done(srv)

    def cache_workload(self) -> None:
        a = self.args
        keys, value = a.big_keys, a.value_size
        max_disk = keys * value // 2
        has = memkeep_has_max_disk(self.bins["memkeep"])
        self.record({"type": "cache_meta", "max_disk": max_disk, "memkeep_has_max_disk": has,
                     "zipf_exponent": a.zipf_exponent})
        if not has:
            log("  cache: skipped: memkeep has no --max-disk (memcached's hit rate is still measured)")
        for name in ("memkeep-never", "memcached"):
            # memcached is the reference and always runs; memkeep only when it has the flag.
            if name == "memkeep-never" and (not has or name not in a.servers):
                continue
            try:
                srv = self.new_server(name, "cache", max_disk if name.startswith("memkeep") else None)
            except (BenchError, OSError) as e:
                self.fail(f"cache {name}: {e}")
                continue
            try:
                s = self.bench(srv, "cache", "SET", keys, value, "set", ["--order", "sequential"])
                if srv.alive():
                    self.bench(srv, "cache", "zipf GET", keys, value, "mixed",
                               ["--requests", str(keys), "--get-fraction", "1", "--key-dist", "zipf",
                                "--zipf-exponent", f"{a.zipf_exponent:g}", "--set-on-miss"])
                self.instance_summary(srv, "cache", {"keys_written": s.get("prefix_done"), "keys_planned": keys,
                                                     "max_disk": max_disk if name.startswith("memkeep") else None,
                                                     "caches_dropped": srv.caches_dropped})
            except (BenchError, OSError) as e:
                self.fail(f"cache {name}: {e}")
            finally:
                self.done(srv)

    def run(self) -> None:
        a = self.args
        log(f"fio: sequential write and 16-job random {a.value_size // 1024} KiB reads on "
            f"{fmt_bytes(a.big_keys * a.value_size)}, cap {fmt_bytes(a.cap)}")
        self.fio()
        if "big" in a.workloads:
            log(f"big: {a.big_keys:,} x {a.value_size} B = {fmt_bytes(a.big_keys * a.value_size)}, cap "
                f"{fmt_bytes(a.cap)}")
            self.kv_workload("big", a.big_keys, a.value_size)
        if "small" in a.workloads:
            log(f"small: {a.small_keys:,} x {a.small_value_size} B, cap {fmt_bytes(a.cap)}")
            self.kv_workload("small", a.small_keys, a.small_value_size)
        if "cache" in a.workloads:
            log(f"cache: {a.big_keys:,} x {a.value_size} B, memkeep --max-disk half of it vs memcached, zipf "
                f"{a.zipf_exponent}")
            self.cache_workload()

    def stop_all(self) -> None:
        for srv in list(self.live):
            try:
                self.done(srv)
            except Exception as e:  # noqa: BLE001 - best effort while tearing down
                log(f"stopping {srv.name}: {e}")


# ---------------------------------------------------------------------------------------------
# Report: the `## Data larger than memory` section of BENCHMARKS.md
# ---------------------------------------------------------------------------------------------


replace_section = common.replace_section


def fmt_ms(v) -> str:
    return common.fmt_ms(v) if isinstance(v, (int, float)) else "n/a"


def fmt_r(v) -> str:
    return "n/a" if v is None else f"{v:.2f}" if v >= 0.1 else f"{v:.3f}" if v >= 0.01 else f"{v:.4f}"


def render(records: list[dict]) -> str:
    meta = next((r for r in records if r["type"] == "meta"), {})
    end = next((r for r in records if r["type"] == "end"), {})
    fio = {r["kind"]: r for r in records if r["type"] == "fio"}
    phases = [r for r in records if r["type"] == "phase"]
    inst = {(r["workload"], r["server"]): r for r in records if r["type"] == "instance"}
    cmeta = next((r for r in records if r["type"] == "cache_meta"), None)
    cmds = next((r["commands"] for r in records if r["type"] == "meta_commands"), meta.get("commands", {}))
    a = meta.get("args", {})
    o: list[str] = []
    w = o.append
    w(SECTION + "\n")
    w(f"Written by `bench/bigdata.py` (`make bench-bigdata`) on {meta.get('date', '?')}, memkeep "
      f"{meta.get('memkeep', '?')}; run time {(end.get('elapsed_s') or 0) / 60:.1f} min. Arguments: "
      f"`{' '.join(meta.get('argv', [])) or '(defaults)'}`. The rest of this file comes from `bench/run.py`; "
      "this section is rewritten in place by each bigdata run.\n")
    w("**Caveats.** A shared 2-core VM with a virtual disk: other jobs ran at the same time, so every figure "
      "is noisy (tens of percent between runs) and one run is one sample. The load generator runs on the same "
      "two cores, outside the cgroup. The servers get the page cache that fits in the cap and nothing else.\n")
    for n in (r for r in records if r["type"] == "note"):
        w(f"**Note.** {n['text']}\n")
    w("| | |\n|---|---|")
    w(f"| memory cap per server | {fmt_bytes(a.get('cap'))} ({meta.get('cgroup', '?')}); the load generator "
      "runs outside it |")
    w(f"| page cache | dropped before each server and each fio job: "
      f"{'yes' if all(r.get('caches_dropped', True) for r in list(inst.values()) + list(fio.values())) else 'NOT everywhere (see JSON)'} |")
    big_b = (a.get("big_keys") or 0) * (a.get("value_size") or 0)
    w(f"| big | {a.get('big_keys', 0):,} values of {a.get('value_size')} B = {big_b / 1e9:.2f} GB = "
      f"{fmt_bytes(big_b)} of values ({big_b / max(1, a.get('cap') or 1):.2f}x the cap; on disk more, see "
      "*disk* below) |")
    w(f"| small | {a.get('small_keys', 0):,} values of {a.get('small_value_size')} B (keys `1`..`N`) |")
    w(f"| connections | {a.get('connections')}, one request in flight each |")
    w(f"| phase limit | {a.get('max_secs')} s: a phase still running then is stopped and its rate taken over "
      "what it did (*done/planned* below) |")
    mi = meta.get("machine", {})
    w(f"| machine | {mi.get('cpu', '?')}, nproc {mi.get('nproc', '?')}, {mi.get('mem_gib', '?')} GiB, kernel "
      f"{mi.get('kernel', '?')} |")
    w(f"| data directories | {mi.get('data_fs', '?')} |")
    if (pr := common.page_reporting_text(mi)) is not None:
        w(f"| free page reporting (VM) | {pr} |")
    for k, v in meta.get("versions", {}).items():
        w(f"| {k} | {v} |")
    w("")

    w("### Physical reference: fio on the data directories' file system\n")
    w("| job | size | MB/s | IOPS | p50 ms | p99 ms | cgroup peak |")
    w("|---|---|---|---|---|---|---|")
    kib = (a.get('value_size') or 0) // 1024
    for kind, label in (("seqwrite", "sequential write, 1 MiB blocks, fsync at end"),
                        ("randread", f"random read, {kib} KiB blocks, 16 jobs, psync, buffered"),
                        ("randread-mmap-random", f"for reference: the same {kib} KiB random reads through mmap "
                                                 "with madvise(MADV_RANDOM)"),
                        ("randread-mmap-readaround", f"for reference: the same through mmap with the kernel's "
                                                     "default fault read-around (no madvise)")):
        r = fio.get(kind)
        if not r:
            continue
        if r.get("error"):
            w(f"| {label} | {fmt_bytes(r.get('size'))} | error: {r['error'][:100]} | | | | |")
            continue
        w(f"| {label} | {fmt_bytes(r.get('size'))} | {r['bw_mb_s']:,.1f} | {r['iops']:,.0f} | "
          f"{fmt_ms(r.get('p50_ms'))} | {fmt_ms(r.get('p99_ms'))} | "
          f"{fmt_bytes((r.get('cgroup') or {}).get('peak_bytes'))} |")
    w("")
    if "randread-mmap-readaround" in fio:
        w("The ratios below divide by the first two rows (the issue's references). The mmap rows are the same "
          "random reads as an mmap-based store makes them, once with `madvise(MADV_RANDOM)` and once with the "
          "kernel's default read-around (each fault reads a window of pages around it, which under a memory "
          "cap evicts what the next reads need).\n")
    fio_iops = (fio.get("randread") or {}).get("iops")
    fio_mbs = (fio.get("seqwrite") or {}).get("bw_mb_s")

    def target(r: dict) -> str:
        """The issue's targets, for memkeep's rows of the big workload."""
        if not r["server"].startswith("memkeep") or r["workload"] != "big":
            return ""
        lab = r["label"]
        if lab == "SET":
            want = 0.3 if r["server"].startswith("memkeep-always") else 0.5
            v = ratio(r.get("mb_per_sec"), fio_mbs)
            return f"≥ {want}x fio: {'met' if v is not None and v >= want else 'NOT met'}"
        if lab == "GET":
            v = ratio((r.get("hits") or 0) / r["secs"] if r.get("secs") else None, fio_iops)
            ok = (v is not None and v >= 0.5 and (r.get("p99_ms") or 1e9) < 20 and not r.get("misses")
                  and not r.get("errors") and not r.get("mismatches"))
            return f"≥ 0.5x fio, p99 < 20 ms: {'met' if ok else 'NOT met'}"
        return ""

    def ratio(x, y):
        return None if x is None or not y else x / y

    for wl, title in (("big", f"big: {a.get('big_keys', 0):,} values of {a.get('value_size')} bytes, "
                              f"{big_b / 1e9:.2f} GB"),
                      ("small", f"small: {a.get('small_value_size')}-byte values, {a.get('small_keys', 0):,} keys")):
        rows = [r for r in phases if r["workload"] == wl]
        if not rows:
            continue
        w(f"### {title}\n")
        w("SET writes keys 1..N in order; GET reads every key that SET wrote (*done/planned* of the SET row) "
          "once, in a random permutation; *mixed* draws keys uniformly, 90% GETs and 10% SETs (of the same "
          "value, so GETs stay verifiable). *ops/s* counts every reply, error replies included; *MB/s* counts "
          "value bytes stored (SET) or returned (GET). Ratios: SET MB/s / fio sequential-write MB/s; *values/s* "
          "(GETs that returned a value, per second; misses excluded) / fio random-read IOPS. A server that "
          "cannot hold the data (memcached evicts, redis refuses SETs past maxmemory) shows it as misses and "
          "errors.\n")
        w("| server | phase | done / planned | secs | ops/s | MB/s | p50 ms | p99 ms | misses | errors | "
          "mismatches | SET MB/s / fio | values/s / fio IOPS | target (issue) | notes |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            notes = []
            if r.get("error"):
                notes.append("ERROR: " + r["error"][:120].replace("|", "/"))
            if r.get("retried"):
                notes.append(r["retried"])
            if r.get("stopped_early"):
                notes.append(f"stopped at the {a.get('max_secs')} s limit")
            if not r.get("server_alive", True):
                notes.append("server died")
            seen_notes = set()
            for n in r.get("notes") or []:
                n = re.sub(r"conn \d+: ", "", n.replace("memkeep-bench: ", ""))[:110].replace("|", "/")
                if n not in seen_notes and len(seen_notes) < 2:
                    seen_notes.add(n)
                    notes.append(n)
            lab = r["label"]
            gets_per_s = hits_per_s = None
            if r.get("secs"):
                gets_per_s = (r.get("gets") or 0) / r["secs"]
                hits_per_s = (r.get("hits") or 0) / r["secs"]
            set_ratio = ratio(r.get("mb_per_sec"), fio_mbs) if lab == "SET" else None
            get_ratio = ratio(hits_per_s, fio_iops) if lab != "SET" else None
            p50, p99 = (r.get("get_p50_ms"), r.get("get_p99_ms")) if lab == "mixed 90/10" else (
                r.get("p50_ms"), r.get("p99_ms"))
            lat_note = " (GETs)" if lab == "mixed 90/10" else ""
            w(f"| {r['server']} | {lab} | {r.get('ops', 0):,} / {r.get('planned', r.get('keys_arg', 0)):,} | "
              f"{r.get('secs', 0):.1f} | {common.fmt_n(r.get('ops_per_sec'))}"
              + (f" ({common.fmt_n(gets_per_s)} GET/s)" if lab == "mixed 90/10" else "")
              + f" | {r.get('mb_per_sec', 0):,.1f} | {fmt_ms(p50)}{lat_note} | {fmt_ms(p99)}{lat_note} | "
              f"{r.get('misses', 'n/a')} | {r.get('errors', 'n/a')} | {r.get('mismatches', 'n/a')} | "
              f"{fmt_r(set_ratio) if lab == 'SET' else ''} | {fmt_r(get_ratio) if lab != 'SET' else ''} | "
              f"{target(r)} | {'; '.join(notes)} |")
        w("")

    if inst:
        w("### Memory and disk of each server at the end of its workload\n")
        w("*RssAnon* is the server's anonymous resident memory (`/proc/PID/status`) at the end (and its peak, "
          "sampled every 0.5 s); LMDB's mapped file pages are page cache, charged to the cgroup but not "
          "anonymous. *cgroup peak* is the cgroup's peak charge (anonymous + page cache), *limit hits* how "
          "often it reached the cap (v1 `memory.failcnt`, v2 `memory.events` max).\n")
        w("| workload | server | keys written | RssAnon end | RssAnon peak | cgroup peak | limit hits | OOM kills | "
          "disk | alive at end |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        for (wl, name), r in inst.items():
            cg = r.get("cgroup") or {}
            kb = r.get("rss_anon_kb_end")
            w(f"| {wl} | {name} | {common.fmt_n(r.get('keys_written'))} / {common.fmt_n(r.get('keys_planned'))} | "
              f"{fmt_bytes(kb * 1024) if kb is not None else 'n/a'} | {fmt_bytes((r.get('rss_anon_peak_kb') or 0) * 1024)} | "
              f"{fmt_bytes(cg.get('peak_bytes'))} | {common.fmt_n(cg.get('failcnt'))} | "
              f"{common.fmt_n(cg.get('oom_kills'))} | {fmt_bytes(r.get('disk_bytes')) if name != 'memcached' else 'n/a'} | "
              f"{'yes' if r.get('alive_at_end') else 'NO (exit ' + str(r.get('exit')) + ')'} |")
        w("")

    if cmeta is not None:
        w("### Cache mode: zipfian GETs with `--max-disk` at half the data size\n")
        w(f"SET all {a.get('big_keys', 0):,} values of the big workload, then {a.get('big_keys', 0):,} GETs with "
          f"zipfian keys (exponent {cmeta.get('zipf_exponent')}, ranks scattered over the keys), as a "
          "cache-aside client: each GET that misses is followed by a SET of that key (`--set-on-miss`), so "
          "the hit rate shows what the eviction policy keeps. memkeep runs "
          f"with `--max-disk {cmeta.get('max_disk')}` in the same cgroup cap as memcached.\n")
        if not cmeta.get("memkeep_has_max_disk"):
            w("memkeep: **skipped: memkeep has no --max-disk** (the flag is not in `memkeep --help`). "
              "memcached's figure below is the reference for when it has.\n")
        w("| server | SET errors | SET/s | GETs | hits | hit rate | refill SETs (errors) | GET/s | GET p99 ms |")
        w("|---|---|---|---|---|---|---|---|---|")
        for name in ("memkeep-never", "memcached"):
            s = next((r for r in phases if r["workload"] == "cache" and r["server"] == name and r["label"] == "SET"), None)
            g = next((r for r in phases if r["workload"] == "cache" and r["server"] == name and r["label"] == "zipf GET"),
                     None)
            if not s:
                if name.startswith("memkeep") and not cmeta.get("memkeep_has_max_disk"):
                    w(f"| {name} | skipped: memkeep has no --max-disk | | | | | | | |")
                continue
            gets = (g or {}).get("gets") or 0
            hits = (g or {}).get("hits") or 0
            gps = gets / g["secs"] if g and g.get("secs") else None
            w(f"| {name} | {s.get('errors')} | {common.fmt_n(s.get('ops_per_sec'))} | {gets:,} | {hits:,} | "
              f"{(hits / gets * 100) if gets else 0:.1f}% | {(g or {}).get('sets', 0):,} ({(g or {}).get('errors', 0)}) | "
              f"{common.fmt_n(gps)} | {fmt_ms((g or {}).get('get_p99_ms'))} |")
        w("")

    w("### Commands\n")
    w("Each server runs in its own cgroup (`$PORT`, `$DIR` filled in per run); memkeep-bench runs outside it.\n")
    w("```sh")
    seen = set()
    for r in inst.values():
        if r["server"] not in seen:
            seen.add(r["server"])
            w(f"# {r['server']}\n{r['argv']}")
    w("")
    for k, v in cmds.items():
        w(f"# {k}\n{v}")
    w("```\n")

    probs = end.get("failures") or []
    w("### Problems seen\n")
    if not probs:
        w("None: no server died, no phase failed to run. (Misses, errors and mismatches are in the tables.)\n")
    else:
        for p in probs:
            w(f"- {p}")
        w("")
    return "\n".join(o) + "\n"


def write_report(records: list[dict], out: Path) -> None:
    body = render(records)
    text = out.read_text() if out.exists() else ""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(replace_section(text, SECTION, body))
    log(f"report: {SECTION!r} in {out}")


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--cap", type=parse_size, default=parse_size("1g"), help="memory cap per server (default 1g)")
    p.add_argument("--big-keys", type=int, default=150_000, help="values of the big workload (default 150000)")
    p.add_argument("--value-size", type=int, default=20480, help="big workload value size (default 20480)")
    p.add_argument("--small-keys", type=int, default=5_000_000, help="keys of the small workload (default 5000000)")
    p.add_argument("--small-value-size", type=int, default=100, help="small workload value size (default 100)")
    p.add_argument("--connections", type=int, default=16, help="connections (default 16)")
    p.add_argument("--max-secs", type=float, default=120.0, help="time limit of every phase (default 120)")
    p.add_argument("--mixed-requests", type=int, default=1_000_000,
                   help="requests of each mixed 90/10 phase (default 1000000; --max-secs ends it first if slow)")
    p.add_argument("--fio-secs", type=float, default=30.0, help="fio random-read run time (default 30)")
    p.add_argument("--zipf-exponent", type=float, default=0.99, help="cache workload zipf exponent (default 0.99)")
    p.add_argument("--redis-maxmemory-frac", type=float, default=0.75,
                   help="redis maxmemory as a share of the cap, noeviction; 0 for none (default 0.75)")
    p.add_argument("--memcached-mem-frac", type=float, default=0.9,
                   help="memcached -m as a share of the cap (default 0.9: the rest is its hash table and buffers)")
    p.add_argument("--servers", default=",".join(ALL_SERVERS), help=f"default all: {','.join(ALL_SERVERS)}")
    p.add_argument("--workloads", default=",".join(ALL_WORKLOADS), help=f"default all: {','.join(ALL_WORKLOADS)}")
    p.add_argument("--phases", default=",".join(ALL_PHASES),
                   help=f"phases of the big and small workloads after SET, default all: {','.join(ALL_PHASES)}")
    p.add_argument("--fio-jobs", default=",".join(ALL_FIO_JOBS),
                   help=f"fio jobs to run, default all: {','.join(ALL_FIO_JOBS)} (the ratios need the first two)")
    p.add_argument("--cgroup-mode", choices=["auto", "systemd", "manual"], default="auto",
                   help="auto: systemd-run --scope where systemd runs the machine, else a cgroup dir made here")
    p.add_argument("--out", default=str(REPO / "BENCHMARKS.md"), help="report whose section is rewritten")
    p.add_argument("--keep-json", metavar="PATH", help="append the JSON result lines here")
    p.add_argument("--from-json", metavar="PATH", help="render --out from a results file; run nothing")
    p.add_argument("--no-build", action="store_true", help="skip `cargo build --release`")
    p.add_argument("--bin-dir", default=str(REPO / "target" / "release"), help="where memkeep and memkeep-bench are")
    p.add_argument("--tmp", default="/var/tmp",
                   help="parent of the data directories, on the disk to measure (default /var/tmp; not a tmpfs)")
    a = p.parse_args(argv)
    a.servers = [s.strip() for s in a.servers.split(",") if s.strip()]
    bad = [s for s in a.servers if s not in ALL_SERVERS]
    if bad:
        p.error(f"unknown server(s) {bad}; choose from {ALL_SERVERS}")
    a.workloads = [s.strip() for s in a.workloads.split(",") if s.strip()]
    bad = [s for s in a.workloads if s not in ALL_WORKLOADS]
    if bad:
        p.error(f"unknown workload(s) {bad}; choose from {ALL_WORKLOADS}")
    for name, choices in (("phases", ALL_PHASES), ("fio_jobs", ALL_FIO_JOBS)):
        got = [x.strip() for x in getattr(a, name).split(",") if x.strip()]
        bad = [x for x in got if x not in choices]
        if bad:
            p.error(f"unknown --{name.replace('_', '-')} {bad}; choose from {choices}")
        setattr(a, name, got)
    if a.value_size % 1024:
        p.error("--value-size must be a multiple of 1024 (fio reads blocks of that size)")
    if a.cap < (16 << 20):
        p.error("--cap below 16 MiB leaves a server no room to start")
    return a


def fs_type(path: Path) -> str:
    best = ("", "?")
    for line in open("/proc/mounts"):
        _dev, mnt, fstype = line.split()[:3]
        if (str(path) + "/").startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best[0]):
            best = (mnt, fstype)
    return best[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    if args.from_json:
        records = [json.loads(ln) for ln in Path(args.from_json).read_text().splitlines() if ln.strip()]
        starts = [i for i, r in enumerate(records) if r.get("type") == "meta"]
        write_report(records[starts[-1]:] if starts else records, out)
        return 0
    if os.geteuid() != 0:
        log("bench/bigdata.py needs root: it makes cgroups and drops the page cache")
        return 2

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    t0 = time.monotonic()
    parent = Path(args.tmp)
    parent.mkdir(parents=True, exist_ok=True)
    if fs_type(parent) in ("tmpfs", "ramfs"):
        log(f"{parent} is a {fs_type(parent)}: the data would live in memory; pass --tmp on a disk")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="memkeep-bigdata.", dir=parent))
    (tmp / "data").mkdir()
    (tmp / "logs").mkdir()
    jsonl = Path(args.keep_json).resolve() if args.keep_json else tmp / "results.jsonl"
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    runner = None
    rc = 0
    try:
        host = CgroupHost(args.cgroup_mode)
        if not host.systemd:
            try:  # fail now, not after the build, when no cgroup can be made here
                host.make("memkeep-bench-probe", args.cap).remove()
            except OSError as e:
                raise BenchError(f"cannot make a memory cgroup ({host.describe()}): {e}") from e
        if not args.no_build:
            log("cargo build --release")
            p = subprocess.run(["cargo", "build", "--release"], cwd=REPO, timeout=1800, stdin=subprocess.DEVNULL)
            if p.returncode != 0:
                raise BenchError("cargo build --release failed")
        bins = {"memkeep": str(Path(args.bin_dir) / "memkeep"),
                "memkeep-bench": str(Path(args.bin_dir) / "memkeep-bench"),
                "memcached": shutil.which("memcached"), "redis-server": shutil.which("redis-server"),
                "fio": shutil.which("fio")}
        missing = [k for k, v in bins.items() if not v or not os.access(v, os.X_OK)]
        if missing:
            raise BenchError(f"missing: {', '.join(missing)} (run bench/deps.sh; cargo build --release)")
        (tmp / "bin").mkdir()
        for k in ("memkeep", "memkeep-bench"):
            bins[k] = str(shutil.copy2(bins[k], tmp / "bin" / k))
        runner = Runner(args, bins, tmp, jsonl, host)
        runner.record({
            "type": "meta", "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
            "argv": sys.argv[1:] if argv is None else argv, "args": {k: v for k, v in vars(args).items()},
            "cgroup": host.describe(), "machine": common.machine_info(tmp),
            "memkeep": f"commit {common.git_commit()}",
            "versions": {"memkeep": common.cmd_out([bins["memkeep"], "--version"]),
                         "memcached": common.cmd_out([bins["memcached"], "-V"]),
                         "redis-server": common.cmd_out([bins["redis-server"], "--version"]),
                         "fio": common.cmd_out([bins["fio"], "--version"])},
        })
        log(f"cgroups: {host.describe()}; data in {tmp}")
        runner.run()
    except KeyboardInterrupt:
        log("interrupted: stopping servers")
        rc = 130
    except (BenchError, OSError) as e:
        log(f"error: {e}")
        rc = 1
    finally:
        if runner is not None:
            runner.stop_all()
        elapsed = time.monotonic() - t0
        if runner is not None:
            runner.record({"type": "end", "elapsed_s": elapsed, "failures": runner.failures, "interrupted": rc == 130})
            with open(jsonl, "a") as f:
                f.write(json.dumps({"type": "meta_commands", "commands": runner.commands}) + "\n")
            runner.records.append({"type": "meta_commands", "commands": runner.commands})
            if rc != 130:
                try:
                    write_report(runner.records, out)
                except Exception as e:  # noqa: BLE001 - the raw results are still in the JSON file
                    log(f"report failed: {e!r}; raw results in {jsonl}")
                    rc = rc or 1
        shutil.rmtree(tmp / "data", ignore_errors=True)
        shutil.rmtree(tmp / "bin", ignore_errors=True)
        if args.keep_json:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"results (JSON lines) and server logs: {tmp}")
        log(f"done in {elapsed:.0f} s" + (f"; {len(runner.failures)} problem(s)" if runner and runner.failures else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
