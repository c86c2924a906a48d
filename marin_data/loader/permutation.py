"""Keyed permutations of ``[0, n)`` that are never materialised: the loader's shuffle (issue 8).

Why a Feistel network: a shuffled pass over a subset of a billion sequences must not hold a billion
indices (8 GB) nor replay anything on resume. A keyed Feistel network is a bijection on ``2h``-bit
integers computed in a few dozen integer operations per index; *cycle-walking* (apply it again until the
value falls below ``n``) restricts it to ``[0, n)`` for any ``n``. We use 6 rounds (Luby–Rackoff needs 4
for a pseudo-random permutation; the two spare rounds cost nanoseconds) and the splitmix64 finaliser as
the round function. The domain is the smallest even bit width that covers ``n``, so it is below ``4n``
and a walk takes under 4 steps on average.

Why hierarchical: a fully random order touches a different shard at every sequence, so a bounded local
cache of shards (issue 9) would thrash. `hierarchical` cuts ``[0, n)`` into blocks of ``block``
consecutive indices (the loader makes a block about one shard of sequences), permutes the blocks, and
shuffles the indices of each run of ``window`` consecutive (permuted) blocks among themselves. A pass
therefore reads each block once, at most ``window`` blocks at a time, while any sequence can land
anywhere in the pass. This is MosaicML streaming's "py1br" idea with O(1) arithmetic instead of
materialised arrays.

Every algorithm is a pure function ``(n, key, i, block, window) -> indices`` of the same shape, chosen by
name from `SHUFFLES` (STYLE.md rule 12). ``key`` carries the seed, subset, epoch and purpose at once: derive
it with `derive_key` so that different subsets and epochs get independent permutations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numba
import numpy as np

__all__ = ["ROUNDS", "SHUFFLES", "derive_key", "sub_key", "feistel", "hierarchical", "identity", "shuffle"]

ROUNDS = 6  # >= 4 (Luby–Rackoff); see the module docstring

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def derive_key(seed: int, *parts: object) -> int:
    """A 64-bit key from a seed and any labels (subset name, purpose, phase...), stable across runs.

    blake2b rather than Python's ``hash`` (salted per process) so every rank and every restart agrees.
    """
    h = hashlib.blake2b(repr((int(seed), *parts)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") >> 1  # 63 bits: numba types a Python int as int64


@numba.njit(cache=True, inline="always")
def _mix(z):
    # splitmix64's finaliser: a bijection on uint64 with full avalanche.
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True)
def sub_key(key, label):
    """Key for a sub-problem (an epoch, a group, a mixture block) of the permutation keyed ``key``."""
    return _mix(np.uint64(key) ^ _mix(np.uint64(label) + _GOLDEN))


@numba.njit(cache=True, inline="always")
def _feistel1(n, key, i):
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
            f = _mix(right ^ _mix(ukey + np.uint64(r) * _GOLDEN)) & mask
            left, right = right, left ^ f
        x = (left << np.uint64(half)) | right
        if x < np.uint64(n):
            return np.int64(x)


@numba.njit(cache=True, inline="always")
def _hierarchical1(n, key, i, block, window):
    """One index through the blockwise permutation described in the module docstring."""
    if n <= 1:
        return i
    block = max(1, min(block, n))
    nblocks = (n + block - 1) // block
    padded = nblocks * block
    span = block * max(1, window)
    bkey = sub_key(key, np.uint64(0xB10C))
    t = i
    while True:  # cycle-walk over the padded range: fewer than `block` <= n values lie past n
        group = t // span
        base = group * span
        size = min(span, padded - base)
        o = _feistel1(size, sub_key(key, np.uint64(group)), t - base)
        blk = _feistel1(nblocks, bkey, group * max(1, window) + o // block)
        t = blk * block + o % block
        if t < n:
            return t


@numba.njit(cache=True, nogil=True)
def _feistel_many(n, key, i):
    out = np.empty(i.shape[0], np.int64)
    for k in range(i.shape[0]):
        out[k] = _feistel1(n, key, i[k])
    return out


@numba.njit(cache=True, nogil=True)
def _hierarchical_many(n, key, i, block, window):
    out = np.empty(i.shape[0], np.int64)
    for k in range(i.shape[0]):
        out[k] = _hierarchical1(n, key, i[k], block, window)
    return out


def _indices(n: int, i) -> np.ndarray:
    i = np.ascontiguousarray(i, dtype=np.int64).reshape(-1)
    if n < 0:
        raise ValueError(f"permutation size must be >= 0, got {n}")
    if i.size and (i.min() < 0 or i.max() >= n):
        raise ValueError(f"indices must lie in [0, {n})")
    return i


def feistel(n: int, key: int, i, block: int = 1, window: int = 1) -> np.ndarray:
    """A keyed pseudo-random permutation of ``[0, n)`` applied to ``i`` (``block``/``window`` unused).

    Args:
        n: the domain size (any n >= 0; cycle-walking handles non-powers of two).
        key: a 64-bit key from `derive_key`.
        i: ``[k]`` int64 indices in ``[0, n)``.

    Returns:
        ``[k]`` int64: the images of ``i``.
    """
    return _feistel_many(int(n), np.uint64(key), _indices(n, i))


def hierarchical(n: int, key: int, i, block: int = 1, window: int = 1) -> np.ndarray:
    """The locality-preserving permutation: blocks of ``block`` indices permuted, shuffled ``window`` at a time.

    Args:
        n, key, i: as in `feistel`.
        block: consecutive indices kept together (about one shard's sequences).
        window: blocks whose indices are shuffled among each other; the reader's working set.

    Returns:
        ``[k]`` int64: the images of ``i``.
    """
    if block < 1 or window < 1:
        raise ValueError(f"block and window must be >= 1, got {block}, {window}")
    return _hierarchical_many(int(n), np.uint64(key), _indices(n, i), int(block), int(window))


def identity(n: int, key: int, i, block: int = 1, window: int = 1) -> np.ndarray:
    """No shuffle: sequence order follows the corpus (debugging, evaluation, throughput floors)."""
    return _indices(n, i).copy()


SHUFFLES: dict[str, Callable[..., np.ndarray]] = {
    "hierarchical": hierarchical,
    "feistel": feistel,
    "none": identity,
}


def shuffle(name: str, n: int, key: int, i, block: int = 1, window: int = 1) -> np.ndarray:
    """Apply the shuffle algorithm ``name`` from `SHUFFLES`; an unknown name is a `ValueError` listing them."""
    try:
        fn = SHUFFLES[name]
    except KeyError:
        raise ValueError(f"unknown shuffle {name!r}; choose one of {', '.join(SHUFFLES)}") from None
    return fn(n, key, i, block, window)
