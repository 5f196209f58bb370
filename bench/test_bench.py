#!/usr/bin/env python3
"""Unit tests of the benchmark scripts' pure helpers (no servers, no timings):

    python3 -m unittest bench/test_bench.py
"""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bigdata  # noqa: E402
import run  # noqa: E402

DOC = """# memkeep benchmarks

intro

## W1

a table

```sh
## not a heading: inside a code fence
```

## Data larger than memory

old body

### a subsection

more

## Failures and anomalies

None.
"""


class Sections(unittest.TestCase):
    def test_replace_in_place_leaves_the_rest(self):
        new = run.replace_section(DOC, run.BIGDATA_SECTION, "## Data larger than memory\n\nnew body\n")
        self.assertIn("new body", new)
        self.assertNotIn("old body", new)
        self.assertNotIn("a subsection", new)
        self.assertTrue(new.startswith("# memkeep benchmarks\n\nintro\n\n## W1\n"))
        self.assertIn("## not a heading: inside a code fence", new)
        self.assertTrue(new.endswith("## Failures and anomalies\n\nNone.\n"))
        # Idempotent.
        again = run.replace_section(new, run.BIGDATA_SECTION, "## Data larger than memory\n\nnew body\n")
        self.assertEqual(again, new)

    def test_append_when_missing(self):
        text = "# T\n\n## W1\n\nx\n"
        new = run.replace_section(text, run.BIGDATA_SECTION, "## Data larger than memory\n\nbody")
        self.assertEqual(new, "# T\n\n## W1\n\nx\n\n## Data larger than memory\n\nbody\n")
        self.assertEqual(run.replace_section("", run.BIGDATA_SECTION, "## Data larger than memory\n"),
                         "## Data larger than memory\n")

    def test_extract_then_carry_over(self):
        kept = run.extract_section(DOC, run.BIGDATA_SECTION)
        self.assertEqual(kept, "## Data larger than memory\n\nold body\n\n### a subsection\n\nmore\n")
        self.assertIsNone(run.extract_section("# T\n\n## W1\n", run.BIGDATA_SECTION))
        # What write_report does: a fresh run.py report keeps the old section.
        fresh = "# memkeep benchmarks\n\n## W1\n\nnew table\n"
        merged = run.replace_section(fresh, run.BIGDATA_SECTION, kept)
        self.assertIn("new table", merged)
        self.assertIn("old body", merged)


class MachineTable(unittest.TestCase):
    def test_free_page_reporting_is_shown_only_where_the_kernel_has_it(self):
        meta = {"type": "meta", "scale": 1, "date": "today",
                "machine": {"nproc": 2, "kernel": "k", "page_reporting_min_free_ms": 0}}
        md = run.Report([meta]).markdown(None)
        self.assertIn("| free page reporting (VM) | on (`min_free_ms` 0)", md)
        del meta["machine"]["page_reporting_min_free_ms"]
        self.assertNotIn("free page reporting", run.Report([meta]).markdown(None))


class DurableReport(unittest.TestCase):
    @staticmethod
    def phase(workload, server, conns, ops, consumers=None, **more):
        rec = {"type": "phase", "workload": workload, "server": server, "proto": "resp",
               "phase": "queue" if workload == "queue" else "set", "connections": conns,
               "ops_per_sec": ops, "p50_ms": 1.0, "p99_ms": 2.0, "secs": 8.0}
        if consumers is not None:
            rec["consumers"] = consumers
        rec.update(more)
        return rec

    def test_multi_and_queue_rows_and_ratios(self):
        recs = [{"type": "meta", "scale": 1, "date": "today"},
                self.phase("multi", "memkeep-always", 16, 3000.0),
                self.phase("multi", "redis-always", 16, 2000.0),
                self.phase("queue", "memkeep-always", 8, 500.0, consumers=8, duplicates=1),
                self.phase("queue", "redis-always", 8, 1000.0, consumers=8),
                self.phase("queue", "redis-always", 1, 900.0, consumers=1)]
        rep = run.Report(recs)
        md = rep.markdown(None)
        self.assertIn("## Transactions and a durable queue", md)
        self.assertIn("| MULTI + 10 SETs + EXEC, 16 conns | 3,000 | 2,000 | **1.50** |", md)
        self.assertIn("| queue, 8 producers / 8 consumers | 500 | 1,000 | **0.50** |", md)
        self.assertIn("duplicates=1", md, "a duplicate delivery is shown")
        # A point only one server ran has no ratio row, and its table row says n/a.
        self.assertIn("| queue, 1 producers / 1 consumers | n/a | 900 | n/a |", md)
        rows = [r for r in rep.ratio_rows() if r[0].startswith("Transactions")]
        self.assertEqual([(r[1], r[2], round(r[7], 2)) for r in rows],
                         [("MULTI + 10 SETs + EXEC, 16 conns", "SET/s", 1.5),
                          ("MULTI + 10 SETs + EXEC, 16 conns", "p99 ms", 1.0),
                          ("queue, 8 producers / 8 consumers", "messages/s", 0.5),
                          ("queue, 8 producers / 8 consumers", "p99 ms", 1.0)])


class Rounds(unittest.TestCase):
    def test_rounds_of_a_point_merge_into_medians(self):
        ph = DurableReport.phase
        recs = [{"type": "meta", "scale": 1, "date": "today"},
                ph("multi", "memkeep-always", 1, 3000.0, round=0, errors=0),
                ph("multi", "redis-always", 1, 1000.0, round=0, errors=0),
                ph("multi", "redis-always", 1, 3000.0, round=1, errors=2, p99_ms=4.0),
                ph("multi", "memkeep-always", 1, 5000.0, round=1, errors=0),
                # A record without rounds (an older results file) is left alone.
                ph("multi", "memkeep-always", 16, 700.0)]
        rep = run.Report(recs)
        mk = rep.durable_phase("multi", "memkeep-always", 1, None)
        rd = rep.durable_phase("multi", "redis-always", 1, None)
        self.assertEqual((mk["ops_per_sec"], mk["round_ops"]), (4000.0, [3000.0, 5000.0]))
        self.assertEqual((rd["ops_per_sec"], rd["p99_ms"], rd["errors"]), (2000.0, 3.0, 2))
        self.assertEqual(rep.durable_phase("multi", "memkeep-always", 16, None)["ops_per_sec"], 700.0)
        md = rep.markdown(None)
        self.assertIn("| MULTI + 10 SETs + EXEC, 1 conns | 4,000 [3,000 / 5,000] | 2,000 [1,000 / 3,000] | **2.00** |", md)
        self.assertIn("ran 2 times", md)

    def test_redis_benchmark_rounds_merge_into_medians(self):
        def rb(server, rps, rnd):
            return {"type": "rb", "workload": "eval", "server": server, "label": "eval", "test": "EVAL x",
                    "rps": rps, "p50_ms": 1.0, "p99_ms": 2.0, "round": rnd}
        recs = [{"type": "meta", "scale": 1, "date": "today"},
                rb("memkeep-never", 40000.0, 0), rb("redis-nopersist", 60000.0, 0),
                rb("redis-nopersist", 40000.0, 1), rb("memkeep-never", 60000.0, 1)]
        rep = run.Report(recs)
        self.assertEqual(rep.rb("eval", "memkeep-never", "eval")["rps"], 50000.0)
        self.assertEqual(rep.rb("eval", "redis-nopersist", "eval")["round_rps"], [60000.0, 40000.0])
        self.assertIn("50,000 [40,000 / 60,000]", rep.markdown(None))

    def test_every_other_round_runs_in_reverse(self):
        b = run.Runner.__new__(run.Runner)
        b.args = type("A", (), {"rounds": 3})()
        self.assertEqual(b.round_orders(["a", "b"]), [(0, ["a", "b"]), (1, ["b", "a"]), (2, ["a", "b"])])
        self.assertEqual(b.round_orders(["a", "b"], 1), [(0, ["a", "b"])])


class Helpers(unittest.TestCase):
    def test_parse_size(self):
        self.assertEqual(bigdata.parse_size("1g"), 1 << 30)
        self.assertEqual(bigdata.parse_size("256m"), 256 << 20)
        self.assertEqual(bigdata.parse_size("256MiB"), 256 << 20)
        self.assertEqual(bigdata.parse_size("1.5g"), 3 << 29)
        self.assertEqual(bigdata.parse_size("4096"), 4096)
        with self.assertRaises(Exception):
            bigdata.parse_size("lots")

    def test_show_keeps_placeholders_unquoted(self):
        self.assertEqual(bigdata.show(["memkeep", "-p", "$PORT", "-H", "$DIR", "--save", ""]),
                         "memkeep -p $PORT -H $DIR --save ''")
        self.assertEqual(bigdata.show(["fio", "--filename=$DIR/fio.dat", "a b"]),
                         "fio --filename=$DIR/fio.dat 'a b'")


if __name__ == "__main__":
    unittest.main()
