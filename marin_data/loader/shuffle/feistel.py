"""A keyed pseudo-random permutation of ``[0, n)`` that is never materialised: a cycle-walking Feistel network.

`feistel1` maps one index (from jitted code); `feistel_many` maps an array of them; `unfeistel1` and
`unfeistel_many` invert them (which position a given index was served at). See docs/data.md for why a
Feistel network, the round count and the domain.
"""

from __future__ import annotations

import numba
import numpy as np

from marin_data.loader.shuffle.keys import GOLDEN, mix

__all__ = ["ROUNDS", "feistel1", "feistel_many", "unfeistel1", "unfeistel_many"]

ROUNDS = 6  # >= 4 (Luby–Rackoff); see docs/data.md


@numba.njit(cache=True, inline="always")
def _halves(n):
    """The bits of one half of the network's domain (the smallest even-width power of two >= ``n``), and its mask."""
    bits = 1
    while (np.int64(1) << bits) < n:
        bits += 1
    half = (bits + 1) // 2
    return np.uint64(half), np.uint64((1 << half) - 1)


@numba.njit(cache=True, inline="always")
def _f(x, ukey, r, mask):
    """Round ``r``'s function."""
    return mix(x ^ mix(ukey + np.uint64(r) * GOLDEN)) & mask


@numba.njit(cache=True, inline="always")
def feistel1(n, key, i):
    """One index through a keyed permutation of [0, n) (cycle-walking Feistel)."""
    if n <= 1:
        return i
    half, mask = _halves(n)
    ukey = np.uint64(key)
    x = np.uint64(i)
    while True:
        left, right = x >> half, x & mask
        for r in range(ROUNDS):
            left, right = right, left ^ _f(right, ukey, r, mask)
        x = (left << half) | right
        if x < np.uint64(n):
            return np.int64(x)


@numba.njit(cache=True, inline="always")
def unfeistel1(n, key, x):
    """The inverse of `feistel1`: the index ``i`` with ``feistel1(n, key, i) == x``.

    Each round ``(l, r) -> (r, l ^ f(r))`` is undone as ``(a, b) -> (b ^ f(a), a)``, last round first; cycle
    walking is undone by walking backwards until the value falls inside ``[0, n)`` again.
    """
    if n <= 1:
        return x
    half, mask = _halves(n)
    ukey = np.uint64(key)
    y = np.uint64(x)
    while True:
        left, right = y >> half, y & mask
        for r in range(ROUNDS - 1, -1, -1):
            left, right = right ^ _f(left, ukey, r, mask), left
        y = (left << half) | right
        if y < np.uint64(n):
            return np.int64(y)


@numba.njit(cache=True, nogil=True)
def unfeistel_many(n, key, x):
    out = np.empty(x.shape[0], np.int64)
    for k in range(x.shape[0]):
        out[k] = unfeistel1(n, key, x[k])
    return out


@numba.njit(cache=True, nogil=True)
def feistel_many(n, key, i):
    out = np.empty(i.shape[0], np.int64)
    for k in range(i.shape[0]):
        out[k] = feistel1(n, key, i[k])
    return out
