#!/usr/bin/env python3
"""Writes the parser targets' seed corpus from the golden transcripts and the binary vectors
(proto/README.md).

One seed per case: the bytes its `>` lines send, in order, behind a 0x00 header byte (the
targets' "default limits"). `${var}` captures become `1` (8 zero bytes in binary vectors); `@`
directives are dropped; a seed is cut at 4 KiB (libFuzzer's default maximum input length). Run
from anywhere:

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


def main():
    for proto, target, dialect in [
        ("memcache", "memcache_parser", "text"),
        ("resp", "resp_parser", "resp"),
        ("binary", "binary_parser", "binary"),
    ]:
        out = CORPUS / target
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("seed-*"):
            old.unlink()
        count = 0
        for path in sorted((ROOT / "proto" / proto).glob("*.txt")):
            for name, data in cases(path, dialect):
                (out / f"seed-{path.stem}-{name}").write_bytes((b"\x00" + data)[:MAX_LEN])
                count += 1
        print(f"{target}: {count} seeds")


if __name__ == "__main__":
    main()
