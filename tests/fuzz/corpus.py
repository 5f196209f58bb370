#!/usr/bin/env python3
"""Rebuilds the committed fuzz corpus (tests/fuzz/corpus/<target>/), small and minimized.

For each target, the new corpus is:
- `regression-*`: the minimized inputs of failures found so far, kept as they are;
- `seed-*` (parser targets): inputs derived from the golden transcripts and the binary vectors
  (proto/README.md), one per case: the bytes its `>` lines send, behind a 0x00 header byte (the
  targets' "default limits"); `${var}` captures become `1` (8 zero bytes in binary vectors), `@`
  directives are dropped, a seed stops at 4 KiB.
  Only the seeds libFuzzer's set-cover merge picks (those reaching code the others miss) stay;
- fuzzer finds (named by hash) from the current corpus and from the scratch corpus of
  `make fuzz` (FUZZ_SCRATCH, default /tmp/memkeep-fuzz), again only those the set-cover merge
  picks, counting edges only (`-use_counters=0`).

Needs what `make fuzz` needs (cargo-fuzz, nightly). Run from anywhere:

    python3 tests/fuzz/corpus.py
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
MAX_LEN = 4096
# Target, its transcripts (None: no seeds), their dialect, sanitizer (as tests/fuzz/run.sh).
TARGETS = [
    ("memcache_parser", "memcache", "text", "none"),
    ("resp_parser", "resp", "resp", "none"),
    ("binary_parser", "binary", "binary", "none"),
    ("command_stream", None, None, "address"),
]


def unescape(text):
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "x":
            out.append(int(text[i + 2 : i + 4], 16))
            i += 4
        else:
            out += {"r": b"\r", "n": b"\n", "\\": b"\\"}[nxt]
            i += 2
    return bytes(out)


def resp_array(text):
    words = [w.encode() for w in text.split(" ")]
    out = b"*%d\r\n" % len(words)
    for w in words:
        out += b"$%d\r\n%s\r\n" % (len(w), w)
    return out


def binary_bytes(text):
    """The bytes of a binary vector's `>` operands: hex groups, `${var}`, quoted strings."""
    out = bytearray()
    for tok in re.findall(r'"(?:[^"\\]|\\.)*"|\$\{\w+\}|[0-9a-fA-F]+', text):
        if tok.startswith('"'):
            body = tok[1:-1].replace("\\0", "\\x00").replace('\\"', '"')
            out += unescape(body)
        elif tok.startswith("$"):
            out += bytes(8)
        else:
            out += bytes.fromhex(tok)
    return bytes(out)


def sent(line, dialect):
    """The bytes a `>` directive sends, or None for any other line."""
    if dialect == "binary":
        if line.startswith(">repeat "):
            _, n, unit = line.split(" ", 2)
            unit = binary_bytes(unit)
            return unit * min(int(n), MAX_LEN // len(unit) + 1)
        return binary_bytes(line[2:]) if line.startswith("> ") else None
    resp = dialect == "resp"
    line = re.sub(r"\$\{\w+\}", "1", line)
    if line.startswith(">raw "):
        return unescape(line[5:])
    if line.startswith(">repeat "):
        _, n, unit = line.split(" ", 2)
        unit = unescape(unit)
        return unit * min(int(n), MAX_LEN // len(unit) + 1)
    if resp and line.startswith(">inline "):
        return line[8:].encode() + b"\r\n"
    if line == ">":
        return b"\r\n"
    if line.startswith("> "):
        return resp_array(line[2:]) if resp else line[2:].encode() + b"\r\n"
    return None


def cases(path, dialect):
    name, data = None, b""
    for line in path.read_text().split("\n"):
        if line.startswith("== "):
            if name:
                yield name, data
            name, data = line[3:].strip(), b""
        elif name:
            data += sent(line, dialect) or b""
    if name:
        yield name, data


def write_seeds(proto, dialect, out):
    for path in sorted((ROOT / "proto" / proto).glob("*.txt")):
        for name, data in cases(path, dialect):
            (out / f"seed-{path.stem}-{name}").write_bytes((b"\x00" + data)[:MAX_LEN])


def set_cover_merge(target, sanitizer, out, inputs):
    """Adds to `out` the inputs (from the `inputs` dirs) that reach code `out` does not."""
    cmd = ["cargo", "+nightly", "fuzz", "run", "--fuzz-dir", "tests/fuzz", "-s", sanitizer,
           target, str(out), *map(str, inputs), "--",
           "-set_cover_merge=1", "-use_counters=0", f"-max_len={MAX_LEN}"]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def sha1(path):
    return hashlib.sha1(path.read_bytes()).hexdigest()


def main():
    scratch = pathlib.Path(os.environ.get("FUZZ_SCRATCH", "/tmp/memkeep-fuzz"))
    for target, proto, dialect, sanitizer in TARGETS:
        corpus = CORPUS / target
        corpus.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            new, finds = tmp / "new", tmp / "finds"
            new.mkdir()
            finds.mkdir()
            for f in corpus.iterdir():
                if f.name.startswith("regression-"):
                    shutil.copy(f, new / f.name)
                elif not f.name.startswith("seed-"):
                    shutil.copy(f, finds / f.name)
            if proto:
                seeds, picked = tmp / "seeds", tmp / "picked"
                seeds.mkdir()
                picked.mkdir()
                write_seeds(proto, dialect, seeds)
                set_cover_merge(target, sanitizer, picked, [seeds])
                chosen = {f.name for f in picked.iterdir()}
                for f in seeds.iterdir():
                    if sha1(f) in chosen:
                        shutil.copy(f, new / f.name)
            inputs = [finds] + ([scratch / target] if (scratch / target).is_dir() else [])
            set_cover_merge(target, sanitizer, new, inputs)
            shutil.rmtree(corpus)
            shutil.copytree(new, corpus)
        files = list(corpus.iterdir())
        size = sum(f.stat().st_size for f in files)
        seeds = sum(f.name.startswith("seed-") for f in files)
        print(f"{target}: {len(files)} files ({seeds} seeds), {size} bytes")


if __name__ == "__main__":
    main()
