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
