#!/usr/bin/env python3
"""Replication figures for issue 20 (stdout only; BENCHMARKS.md is not touched).

    bench/replication.py [--lag-secs 20] [--copy-gb 1.0] [--only lag,copy] [--keep]

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
      whole store) and the throughput ratio.

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
MEMKEEP = ROOT / "target/release/memkeep"
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
    def __init__(self, tmp: Path, name: str, sync: str, extra=()):
        self.dir = tmp / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.mc = free_port()
        self.sync = sync
        self.extra = list(extra)
        self.proc = None

    def start(self, sync=None):
        argv = [str(MEMKEEP), "--resp-port", str(self.port), "-p", str(self.mc), "-H",
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
    deadline = time.time() + timeout
    while time.time() < deadline:
        p, r = primary.info(), replica.info()
        if r.get("master_link_status") == "up" and r.get("slave_repl_offset") == p.get("master_repl_offset"):
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


def copy(tmp: Path, gb: float) -> None:
    keys = int(gb * 1e9 / 1000)
    p = Node(tmp, "copy-primary", "always").start(sync="periodic")
    try:
        t0 = time.time()
        fill = bench(p.port, keys, 1000, 3600)
        print(f"copy: loaded {keys} keys of 1000 bytes in {time.time() - t0:.1f} s "
              f"({fill.get('ops_per_sec', 0):.0f} SET/s)")
        p.stop()
        p.start()
        used = int(Resp(p.port).info("memory").get("used_memory", 0))
        print(f"copy: primary store {used / 1e9:.2f} GB (used_memory), restarted with --sync always")
        pc = Resp(p.port)

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
        r = Node(tmp, "copy-replica", "always", ["--replica-of", f"127.0.0.1:{p.port}"])
        try:
            time.sleep(3)
            a = commands()
            time.sleep(10)
            b = commands()
            alone = rate(a, b)
            print(f"copy: primary alone: {alone:.0f} commands/s (SET, 16 connections, 100-byte values)")
            copy_start = time.time()
            c0 = commands()
            r.start()
            rc = Resp(r.port)
            while True:
                i = rc.info()
                if i.get("master_link_status") == "up" and i.get("memkeep_full_copies_taken") == "1":
                    break
                if time.time() - copy_start > 1200:
                    raise SystemExit("the full copy did not finish in 20 minutes")
                time.sleep(0.05)
            c1 = commands()
            copied = time.time() - copy_start
            during = rate(c0, c1)
            print(f"copy: full copy of {used / 1e9:.2f} GB to a new replica: {copied:.1f} s "
                  f"(replica process started -> link up with the copy installed)")
            print(f"copy: primary during the copy: {during:.0f} commands/s = {during / max(alone, 1):.2f}x alone")
            t0 = time.time()
            wait_synced(pc, rc)
            print(f"copy: replica caught up with the writes made meanwhile {time.time() - t0:.1f} s later")
        finally:
            load.terminate()
            load.wait(30)
            r.stop()
    finally:
        p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lag-secs", type=float, default=20)
    ap.add_argument("--copy-gb", type=float, default=1.0)
    ap.add_argument("--only", default="lag,copy")
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
            copy(tmp, args.copy_gb)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
