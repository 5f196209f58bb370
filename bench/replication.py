#!/usr/bin/env python3
"""Replication figures for issue 20 (stdout only; BENCHMARKS.md is not touched).

    bench/replication.py [--lag-secs 20] [--copy-gb 1.0] [--only lag,copy] [--keep]
                         [--copy-rounds N] [--compare OTHER_MEMKEEP] [--copy-data DIR] [--detail]

lag   A primary (--sync always) and one replica (--sync always). W1's SET load (memkeep-bench,
      16 connections, 100-byte values, RESP) runs on the primary for --lag-secs; meanwhile a
      probe writes a fresh key on the primary every 20 ms and, once the primary has
      acknowledged it, polls the replica (every 0.2 ms) until the key is there. Lag = the time
      from the primary's acknowledgement to the key being readable on the replica: p50, p99,
      max, and the load's throughput.
copy  A primary (--sync always) filled with --copy-gb of 1000-byte values (loaded under
      --sync periodic, then restarted under always), then: the primary's SET throughput (16
      connections, keys beside the stored ones) alone for 10 s, and again while a new replica
      takes its full copy. Reports the copy's time (replica started -> its link up with the
      whole store) and the throughput ratio. --copy-rounds repeats it (the primary restarted
      on the same store each round); --compare runs another build in each round too, the two in
      alternating order, so a before/after pair shares the machine's state; --copy-data keeps
      the loaded store for later runs. Each round first reads the store's file through, so it
      starts in the page cache (a copy of a cold store is a different measurement). --detail adds, for both windows, the primary's CPU per
      thread, the replica's and the load's, the disk's writes and flushes, and the primary's
      log fsyncs.

Needs target/release/memkeep and memkeep-bench (cargo build --release). Everything runs on
loopback ports in a temporary directory, removed at the end unless --keep.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEMKEEP = Path(os.environ.get("MEMKEEP_BIN", ROOT / "target/release/memkeep"))
BENCH = ROOT / "target/release/memkeep-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Resp:
    """A minimal blocking RESP client."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb")

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        return self.read()

    def read(self):
        line = self.f.readline()
        if not line:
            raise ConnectionError("closed")
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"bad reply {line!r}")

    def info(self, section="replication") -> dict:
        text = self.call("INFO", section).decode()
        return dict(l.split(":", 1) for l in text.splitlines() if ":" in l)

    def close(self):
        self.s.close()


class Node:
    def __init__(self, tmp: Path, name: str, sync: str, extra=(), memkeep: Path = MEMKEEP):
        self.dir = tmp / name
        self.memkeep = memkeep
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.mc = free_port()
        self.sync = sync
        self.extra = list(extra)
        self.proc = None

    def start(self, sync=None):
        argv = [str(self.memkeep), "--resp-port", str(self.port), "-p", str(self.mc), "-H",
                str(self.dir / "data"), "--sync", sync or self.sync, *self.extra]
        log = open(self.dir / "log", "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                r = Resp(self.port, 1)
                r.call("PING")
                r.close()
                return self
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"memkeep on {self.port} did not start: {(self.dir / 'log').read_text()[-2000:]}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def bench(port: int, keys: int, value: int, secs: float, conns: int = 16, offset_keys: int = 0) -> dict:
    argv = [str(BENCH), "--port", str(port), "--protocol", "resp", "--connections", str(conns),
            "--keys", str(keys), "--value-size", str(value), "--phases", "set", "--json",
            "--timeout", "30", "--duration-limit", f"{secs:g}"]
    if offset_keys:
        # Keys beside the stored ones: padded to a length the stored keys do not have.
        argv += ["--key-size-min", "24", "--key-size-max", "24"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=secs + 120)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"memkeep-bench failed ({p.returncode}): {p.stderr[-800:]}")
    return json.loads(lines[-1])


def wait_synced(primary: Resp, replica: Resp, timeout: float = 600) -> None:
    """Until the replica has applied what the primary had released just before: under a
    load that goes on, the two offsets are rarely equal at the same instant."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        p = int(primary.info().get("master_repl_offset", 0))
        r = replica.info()
        if r.get("master_link_status") == "up" and int(r.get("slave_repl_offset", -1)) >= p:
            return
        time.sleep(0.05)
    raise SystemExit("the replica did not catch up")


def pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))]


def lag(tmp: Path, secs: float) -> None:
    p = Node(tmp, "lag-primary", "always").start()
    r = Node(tmp, "lag-replica", "always", ["--replica-of", f"127.0.0.1:{p.port}"]).start()
    try:
        pc, rc = Resp(p.port), Resp(r.port)
        wait_synced(pc, rc)
        lags: list[float] = []
        stop = threading.Event()

        def probe():
            pw, rr = Resp(p.port), Resp(r.port)
            i = 0
            while not stop.is_set():
                i += 1
                key = f"lagprobe:{i}"
                pw.call("SET", key, "x")
                t0 = time.perf_counter()
                while rr.call("EXISTS", key) != 1:
                    if time.perf_counter() - t0 > 30:
                        raise SystemExit(f"{key} never reached the replica")
                    time.sleep(0.0002)
                lags.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.02)

        t = threading.Thread(target=probe, daemon=True)
        t.start()
        time.sleep(0.5)
        idle = list(lags)
        load = bench(p.port, 10_000_000, 100, secs)
        stop.set()
        t.join(35)
        under = lags[len(idle):]
        print(f"lag: W1 SET load on the primary (16 connections, 100-byte values, both --sync always): "
              f"{load.get('ops_per_sec', 0):.0f} SET/s for {load.get('elapsed_s', secs):.1f} s")
        print(f"lag: acknowledged on the primary -> readable on the replica, {len(under)} probes: "
              f"p50 {statistics.median(under):.2f} ms, p99 {pct(under, 0.99):.2f} ms, max {max(under):.2f} ms")
        pi = pc.info()
        print(f"lag: primary offset {pi.get('master_repl_offset')}, {pi.get('slave0')}")
    finally:
        r.stop()
        p.stop()


class Usage:
    """Counters read at the start and end of a window: per-thread CPU of the primary (grouped
    by thread name), the replica's and the load generator's CPU, the disk's writes and flushes
    (/proc/diskstats), the bytes each server wrote (/proc/<pid>/io), and the primary's log
    fsyncs (INFO persistence)."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, primary: "Node", pc: Resp, others: dict):
        self.primary, self.pc, self.others = primary, pc, others

    @staticmethod
    def threads(pid: int) -> dict:
        out: dict = {}
        for t in Path(f"/proc/{pid}/task").iterdir():
            try:
                st = (t / "stat").read_text()
            except OSError:
                continue
            name = st[st.index("(") + 1:st.rindex(")")].rstrip("0123456789-")
            f = st[st.rindex(")") + 2:].split()
            out[name] = out.get(name, 0) + int(f[11]) + int(f[12])
        return out

    @staticmethod
    def cpu(pid) -> int:
        try:
            st = Path(f"/proc/{pid}/stat").read_text()
        except (OSError, TypeError):
            return 0
        f = st[st.rindex(")") + 2:].split()
        return int(f[11]) + int(f[12])

    @staticmethod
    def written(pid) -> int:
        try:
            for l in Path(f"/proc/{pid}/io").read_text().splitlines():
                if l.startswith("write_bytes:"):
                    return int(l.split()[1])
        except (OSError, TypeError):
            pass
        return 0

    @staticmethod
    def disk() -> list:
        dev = os.stat(ROOT).st_dev
        name = None
        for l in Path("/proc/self/mountinfo").read_text().splitlines():
            f = l.split()
            maj, mnr = f[2].split(":")
            if os.makedev(int(maj), int(mnr)) == dev:
                name = f[f.index("-") + 2].rsplit("/", 1)[-1]
        for l in Path("/proc/diskstats").read_text().splitlines():
            f = l.split()
            if name and f[2] == name:
                return [int(x) for x in f[3:]]
        return [0] * 17

    def read(self) -> dict:
        i = self.pc.info("persistence")
        return {
            "t": time.time(),
            "threads": self.threads(self.primary.proc.pid),
            "cpu": {k: self.cpu(p() if callable(p) else p) for k, p in self.others.items()},
            "pwritten": self.written(self.primary.proc.pid),
            "disk": self.disk(),
            "fsyncs": int(i.get("memkeep_log_fsyncs", 0)),
            "fsync_writes": int(i.get("memkeep_log_fsync_writes", 0)),
        }

    @staticmethod
    def report(a: dict, b: dict, replica_written: int = 0) -> str:
        dt = max(b["t"] - a["t"], 1e-9)
        tick = Usage.TICK
        th = sorted(((b["threads"].get(k, 0) - a["threads"].get(k, 0)) / tick / dt, k)
                    for k in b["threads"])
        th = [f"{k} {v:.2f}" for v, k in reversed(th) if v >= 0.02]
        cpu = [f"{k} {(b['cpu'][k] - a['cpu'][k]) / tick / dt:.2f}" for k in b["cpu"]]
        d = [y - x for x, y in zip(a["disk"], b["disk"])]
        # diskstats after the name: 4 writes completed, 6 sectors written, 7 ms writing, 15 flushes, 16 ms flushing.
        w_ios, w_mb, w_ms = d[4], d[6] * 512 / 1e6, d[7]
        fl, fl_ms = (d[15], d[16]) if len(d) > 16 else (0, 0)
        fs = b["fsyncs"] - a["fsyncs"]
        fw = b["fsync_writes"] - a["fsync_writes"]
        return (f"primary threads (CPU s/s): {', '.join(th)}; other processes: {', '.join(cpu)}; "
                f"disk: {w_mb / dt:.0f} MB/s written in {w_ios / dt:.0f} writes/s "
                f"({w_ms / max(w_ios, 1):.2f} ms each), {fl / dt:.0f} flushes/s "
                f"({fl_ms / max(fl, 1):.2f} ms each); primary wrote {(b['pwritten'] - a['pwritten']) / dt / 1e6:.0f} MB/s"
                + (f", replica {replica_written / dt / 1e6:.0f} MB/s" if replica_written else "")
                + f"; primary log: {fs / dt:.0f} fsyncs/s, {fw / max(fs, 1):.1f} writes each")


def load_store(tmp: Path, gb: float, data: Path | None) -> Path:
    """A data directory holding --copy-gb of 1000-byte values (reused with --copy-data)."""
    keys = int(gb * 1e9 / 1000)
    base = data or tmp / "copy-primary"
    marker = base / f"loaded-{keys}"
    if marker.exists():
        print(f"copy: reusing the store in {base} ({keys} keys of 1000 bytes)")
        return base
    shutil.rmtree(base, ignore_errors=True)
    base.parent.mkdir(parents=True, exist_ok=True)
    p = Node(base.parent, base.name, "always")
    p.start(sync="periodic")
    try:
        t0 = time.time()
        fill = bench(p.port, keys, 1000, 3600)
        print(f"copy: loaded {keys} keys of 1000 bytes in {time.time() - t0:.1f} s "
              f"({fill.get('ops_per_sec', 0):.0f} SET/s)")
    finally:
        p.stop()
    marker.touch()
    return base


def warm(path: Path) -> None:
    """Reads a file through once, so each round starts with the store in the page cache
    (whatever else on the machine has evicted meanwhile)."""
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 20):
            pass


def copy_round(tmp: Path, base: Path, memkeep: Path, label: str, detail: bool,
               backlog: str = "") -> dict:
    warm(base / "data" / "data.mdb")
    extra = ["--repl-backlog-size", backlog] if backlog else []
    p = Node(base.parent, base.name, "always", extra, memkeep=memkeep).start()
    try:
        pc = Resp(p.port)
        used = int(pc.info("memory").get("used_memory", 0))

        def commands() -> tuple[float, int]:
            return time.time(), int(pc.info("stats").get("total_commands_processed", 0))

        def rate(a, b) -> float:
            return (b[1] - a[1]) / max(b[0] - a[0], 1e-9)

        # One long SET load (16 connections, 100-byte values, keys beside the stored ones);
        # its rate is read from the primary's command count over each window.
        argv = [str(BENCH), "--port", str(p.port), "--protocol", "resp", "--connections", "16",
                "--keys", "100000000", "--value-size", "100", "--key-size-min", "24",
                "--key-size-max", "24", "--phases", "set", "--timeout", "30",
                "--duration-limit", "900"]
        load = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rdir = tmp / f"copy-replica-{label}"
        shutil.rmtree(rdir, ignore_errors=True)
        r = Node(tmp, rdir.name, "always", ["--replica-of", f"127.0.0.1:{p.port}"], memkeep=memkeep)
        usage = Usage(p, pc, {"replica": lambda: r.proc.pid if r.proc else None, "load": load.pid})
        try:
            time.sleep(3)
            a, ua = commands(), usage.read()
            time.sleep(10)
            b, ub = commands(), usage.read()
            alone = rate(a, b)
            copy_start = time.time()
            c0 = commands()
            r.start()
            u0 = usage.read()
            rc = Resp(r.port)
            while True:
                i = rc.info()
                copies = int(i.get("memkeep_full_copies_taken", 0))
                if i.get("master_link_status") == "up" and copies >= 1:
                    break
                if time.time() - copy_start > 1200:
                    raise SystemExit("the full copy did not finish in 20 minutes")
                time.sleep(0.05)
            c1, u1 = commands(), usage.read()
            r_written = Usage.written(r.proc.pid)
            copied = time.time() - copy_start
            during = rate(c0, c1)
            t0 = time.time()
            wait_synced(pc, rc)
            caught = time.time() - t0
            records = int(pc.info("keyspace").get("db0", "keys=0").split(",")[0].split("=")[1])
            res = {"label": label, "gb": used / 1e9, "alone": alone, "during": during,
                   "ratio": during / max(alone, 1), "copy_s": copied, "catchup_s": caught,
                   "copies": copies, "keys": records}
            if detail:
                res["alone_usage"] = Usage.report(ua, ub)
                res["copy_usage"] = Usage.report(u0, u1, r_written)
            return res
        finally:
            load.terminate()
            load.wait(30)
            r.stop()
            shutil.rmtree(rdir, ignore_errors=True)
    finally:
        p.stop()


def copy(tmp: Path, gb: float, rounds: int = 1, compare: Path | None = None,
         data: Path | None = None, detail: bool = False, backlog: str = "") -> None:
    base = load_store(tmp, gb, data)
    builds = [("this", MEMKEEP)] + ([("compare", compare)] if compare else [])
    print(f"copy: each round: the primary (--sync always) under SET load (16 connections, 100-byte "
          f"values, keys beside the stored ones) for 10 s alone, then while a new replica takes its "
          f"full copy; the rate is the primary's command count over each window"
          + (f"; builds: this = {MEMKEEP}, compare = {compare}, order alternating" if compare else ""))
    results: list[dict] = []
    for n in range(rounds):
        order = builds if n % 2 == 0 else list(reversed(builds))
        for label, binary in order:
            res = copy_round(tmp, base, binary, label, detail, backlog)
            results.append(res)
            again = f", {res['copies']} copies (the first outlasted the backlog)" if res["copies"] > 1 else ""
            print(f"copy: round {n + 1} {label}: store {res['gb']:.2f} GB, {res['keys']} keys; "
                  f"alone {res['alone']:.0f}/s, during the copy {res['during']:.0f}/s = "
                  f"{res['ratio']:.2f}x; copy {res['copy_s']:.1f} s (replica started -> link up "
                  f"with the copy installed{again}), caught up {res['catchup_s']:.1f} s later",
                  flush=True)
            if detail:
                print(f"copy:   alone: {res['alone_usage']}")
                print(f"copy:   copy:  {res['copy_usage']}", flush=True)
    for label, _ in builds:
        mine = [x for x in results if x["label"] == label]
        ratios = ", ".join(f"{x['ratio']:.2f}" for x in mine)
        times = ", ".join(f"{x['copy_s']:.1f}" for x in mine)
        print(f"copy: {label}: median over {len(mine)} rounds: ratio "
              f"{statistics.median(x['ratio'] for x in mine):.2f}x (each: {ratios}), copy "
              f"{statistics.median(x['copy_s'] for x in mine):.1f} s (each: {times})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lag-secs", type=float, default=20)
    ap.add_argument("--copy-gb", type=float, default=1.0)
    ap.add_argument("--only", default="lag,copy")
    ap.add_argument("--copy-rounds", type=int, default=1,
                    help="paired rounds of the copy phase (with --compare: each build once a round)")
    ap.add_argument("--compare", type=Path,
                    help="another memkeep binary: each copy round runs it too, in alternating order")
    ap.add_argument("--copy-data", type=Path,
                    help="keep the loaded store here and reuse it on later runs")
    ap.add_argument("--backlog", default="",
                    help="the primary's --repl-backlog-size in the copy phase (default: memkeep's)")
    ap.add_argument("--detail", action="store_true",
                    help="per-thread CPU, disk and log-fsync figures for each window")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    for b in (MEMKEEP, BENCH):
        if not b.exists():
            raise SystemExit(f"{b} is missing: cargo build --release")
    tmp = Path(tempfile.mkdtemp(prefix="memkeep-repl-bench-"))
    try:
        only = args.only.split(",")
        if "lag" in only:
            lag(tmp, args.lag_secs)
        if "copy" in only:
            copy(tmp, args.copy_gb, args.copy_rounds, args.compare, args.copy_data, args.detail,
                 args.backlog)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
