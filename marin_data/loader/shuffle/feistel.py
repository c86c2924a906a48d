"""A keyed pseudo-random permutation of ``[0, n)`` that is never materialised: a cycle-walking Feistel network.

`feistel1` maps one index (from jitted code); `feistel_many` maps an array of them. See docs/data.md for why
a Feistel network, the round count and the domain.
"""

from __future__ import annotations

import numba
import numpy as np

from marin_data.loader.shuffle.keys import GOLDEN, mix

__all__ = ["ROUNDS", "feistel1", "feistel_many"]

ROUNDS = 6  # >= 4 (Luby–Rackoff); see docs/data.md


@numba.njit(cache=True, inline="always")
def feistel1(n, key, i):
    """One index through a keyed permutation of [0, n) (cycle-walking Feistel)."""
    if n <= 1:
        return i
    bits = 1
    while (np.int64(1) << bits) < n:
        bits += 1
    half = (bits + 1) // 2
    mask = np.uint64((1 << half) - 1)
    ukey = np.uint64(key)
    x = np.uint64(i)
    while True:
        left = x >> np.uint64(half)
        right = x & mask
        for r in range(ROUNDS):
            f = mix(right ^ mix(ukey + np.uint64(r) * GOLDEN)) & mask
            left, right = right, left ^ f
        x = (left << np.uint64(half)) | right
        if x < np.uint64(n):
            return np.int64(x)


@numba.njit(cache=True, nogil=True)
def feistel_many(n, key, i):
    out = np.empty(i.shape[0], np.int64)
    for k in range(i.shape[0]):
        out[k] = feistel1(n, key, i[k])
    return out
