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
name from `SHUFFLES` (STYLE.md rule 12) through `shuffle` (numpy arrays) or `permute1` (jitted callers).
``key`` carries the seed, subset, epoch and purpose at once: derive it with `derive_key` (and `sub_key`
per epoch) so that different subsets and epochs get independent permutations.
"""

from __future__ import annotations

import hashlib

import numba
import numpy as np

__all__ = ["ROUNDS", "SHUFFLES", "derive_key", "sub_key", "permute1", "shuffle", "feistel", "hierarchical"]

ROUNDS = 6  # >= 4 (Luby–Rackoff); see the module docstring

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def derive_key(seed: int, *parts: object) -> int:
    """A 63-bit key from a seed and any labels (subset name, purpose, phase...), stable across runs.

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
    """Key for a sub-problem (an epoch, a group, a mixture block) of the permutation keyed ``key``.

    Called from Python it returns a Python int of up to 64 bits: wrap it in ``np.uint64`` before handing
    it to another jitted function (numba types a Python int as int64).
    """
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


# Algorithm codes: the batch kernels dispatch on an integer, since numba recompiles (and will not cache) a
# kernel that takes a jitted function as an argument.
SHUFFLES: dict[str, int] = {
    "hierarchical": 0,  # the default: locality for a bounded shard cache (module docstring)
    "feistel": 1,  # a full-range keyed permutation
    "none": 2,  # corpus order (debugging, evaluation, throughput floors)
}


@numba.njit(cache=True, inline="always")
def permute1(code, n, key, i, block, window):
    """One index through the shuffle with code ``code`` (`SHUFFLES`); jitted callers use this."""
    if code == 0:
        return _hierarchical1(n, key, i, block, window)
    if code == 1:
        return _feistel1(n, key, i)
    return i


@numba.njit(cache=True, nogil=True)
def _permute_many(code, n, key, i, block, window):
    out = np.empty(i.shape[0], np.int64)
    for k in range(i.shape[0]):
        out[k] = permute1(code, n, key, i[k], block, window)
    return out


def shuffle(name: str, n: int, key: int, i, block: int = 1, window: int = 1) -> np.ndarray:
    """Apply the shuffle ``name`` (a key of `SHUFFLES`) of ``[0, n)`` to indices ``i``.

    Args:
        name: ``"hierarchical"``, ``"feistel"`` or ``"none"``.
        n: the domain size (any n >= 0; cycle-walking handles non-powers of two).
        key: a 64-bit key from `derive_key` / `sub_key`.
        i: ``[k]`` int64 indices in ``[0, n)``.
        block: consecutive indices kept together (hierarchical only; about one shard's sequences).
        window: blocks whose indices are shuffled among each other (hierarchical only).

    Returns:
        ``[k]`` int64: the images of ``i``.
    """
    if name not in SHUFFLES:
        raise ValueError(f"unknown shuffle {name!r}; choose one of {', '.join(SHUFFLES)}")
    if block < 1 or window < 1:
        raise ValueError(f"block and window must be >= 1, got {block}, {window}")
    if n < 0:
        raise ValueError(f"permutation size must be >= 0, got {n}")
    i = np.ascontiguousarray(i, dtype=np.int64).reshape(-1)
    if i.size and (i.min() < 0 or i.max() >= n):
        raise ValueError(f"indices must lie in [0, {n})")
    return _permute_many(SHUFFLES[name], int(n), np.uint64(key), i, int(block), int(window))


def feistel(n: int, key: int, i) -> np.ndarray:
    """The keyed pseudo-random permutation of ``[0, n)`` applied to ``i``; see `shuffle`."""
    return shuffle("feistel", n, key, i)


def hierarchical(n: int, key: int, i, block: int, window: int) -> np.ndarray:
    """The locality-preserving permutation of ``[0, n)`` applied to ``i``; see `shuffle`."""
    return shuffle("hierarchical", n, key, i, block, window)
