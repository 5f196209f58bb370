#!/usr/bin/env python3
"""Writes the parser targets' seed corpus from the golden transcripts (proto/README.md).

One seed per transcript case: the bytes its `>` lines send, in order, behind a 0x00 header byte
(the targets' "default limits"). `${var}` captures become `1`; `@` directives are dropped; a
seed is cut at 4 KiB (libFuzzer's default maximum input length). Run from anywhere:

    python3 tests/fuzz/seeds.py

Existing `seed-*` files are replaced; other corpus files (fuzzer finds, regressions) stay.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
MAX_LEN = 4096


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


def sent(line, resp):
    """The bytes a `>` directive sends, or None for any other line."""
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


def cases(path, resp):
    name, data = None, b""
    for line in path.read_text().split("\n"):
        if line.startswith("== "):
            if name:
                yield name, data
            name, data = line[3:].strip(), b""
        elif name:
            data += sent(line, resp) or b""
    if name:
        yield name, data


def main():
    for proto, target, resp in [("memcache", "memcache_parser", False), ("resp", "resp_parser", True)]:
        out = CORPUS / target
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("seed-*"):
            old.unlink()
        count = 0
        for path in sorted((ROOT / "proto" / proto).glob("*.txt")):
            for name, data in cases(path, resp):
                (out / f"seed-{path.stem}-{name}").write_bytes((b"\x00" + data)[:MAX_LEN])
                count += 1
        print(f"{target}: {count} seeds")


if __name__ == "__main__":
    main()
