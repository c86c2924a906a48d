"""Parsing JSON from untrusted bytes: every JSON the library reads goes through `loads`.

Python's parser recurses once per nesting level, so a record, manifest or server answer of 100,000 nested
``[`` raises `RecursionError`, which no ``except ValueError`` catches: the command ended as an internal
error (exit 70) instead of a bad record or an untrusted manifest. `loads` measures the nesting first and
refuses anything deeper than `MAX_DEPTH` levels with a `ValueError`, which every caller already turns into
its own typed error. Measuring costs one ``bytes.count`` pair when the text holds fewer brackets than the
limit (almost every record), and a numpy pass over the bytes otherwise.
``tests/test_architecture.py`` fails on ``json.loads`` anywhere else in ``marin_data``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["MAX_DEPTH", "loads", "depth"]

MAX_DEPTH = 64  # the deepest marin writes is 4 (a manifest); a Hub answer or a record rarely passes 10

_OPEN, _CLOSE = np.zeros(256, np.int8), np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_CLOSE[[ord("]"), ord("}")]] = 1


def loads(data: bytes | bytearray | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)``, refusing JSON nested deeper than ``max_depth`` with a ValueError."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if raw.count(b"[") + raw.count(b"{") > max_depth and (found := depth(raw)) > max_depth:
        raise ValueError(f"JSON nested {found:,} levels deep, over the {max_depth} this reader takes")
    return json.loads(data)


def depth(raw: bytes, chunk: int = 1 << 20) -> int:
    """The deepest nesting of arrays and objects in JSON text, brackets inside strings not counted; read
    ``chunk`` bytes at a time, so the work arrays stay small whatever the text's size."""
    deepest = level = run = 0  # run: backslashes right before the chunk
    inside = False
    for start in range(0, len(raw), chunk):
        b = np.frombuffer(raw, np.uint8, min(chunk, len(raw) - start), start)
        positions = np.arange(len(b), dtype=np.int64)
        plain = np.where(b != ord("\\"), positions, -1)
        last_plain = np.maximum.accumulate(plain)
        # backslashes right before each byte: since the last other byte, or the carried run at the start
        before = np.concatenate(([-1], last_plain[:-1]))
        slashes = np.where(before >= 0, positions - 1 - before, positions + run)
        real = (b == ord('"')) & (slashes % 2 == 0)  # a quote after an odd run of backslashes is escaped
        quotes = np.cumsum(real)
        within = ((quotes - real) % 2 == 1) ^ inside  # after an odd number of real quotes, counting the carry
        steps = np.where(within, 0, _OPEN[b].astype(np.int64) - _CLOSE[b])
        levels = level + np.cumsum(steps)
        deepest = max(deepest, int(levels.max()))
        level, inside = int(levels[-1]), bool(inside ^ (quotes[-1] % 2 == 1))
        run = len(b) - 1 - int(last_plain[-1]) if last_plain[-1] >= 0 else run + len(b)
    return deepest
