"""Keyed permutations of ``[0, n)`` that are never materialised: the loader's shuffle (issue 8).

Why a Feistel network: a shuffled pass over a subset of a billion sequences must not hold a billion
indices (8 GB) nor replay anything on resume. A keyed Feistel network is a bijection on ``2h``-bit
integers computed in a few dozen integer operations per index; *cycle-walking* (apply it again until the
value falls below ``n``) restricts it to ``[0, n)`` for any ``n``. We use 6 rounds (Luby–Rackoff needs 4
for a pseudo-random permutation; the two spare rounds cost nanoseconds) and the splitmix64 finaliser as
the round function. The domain is the smallest even bit width that covers ``n``, so it is below ``4n``
and a walk takes under 4 steps on average.

Why hierarchical: a fully random order touches a different shard at every sequence, so a bounded local
cache of shards (issue 9) would thrash. `hierarchical` works on a subset's *shards*: each epoch it permutes
the shards (a Feistel permutation of the shard ids), cuts the permuted list into groups of ``window``
shards, and shuffles all the items (sequences) of a group among themselves. A pass therefore reads each
shard in exactly one stretch — its group's — with at most ``window`` shards of a subset in use at a time,
while any sequence can land anywhere in the pass. This is MosaicML streaming's "py1br" idea with shards as
the blocks. Why shards and not fixed-size blocks of sequences: a fixed block straddles two shards, so a
shard is read in two stretches at unrelated times of the pass, and a cache smaller than the corpus fetches
it twice. Placing a pass position in its group needs the groups' item counts in the epoch's order: one
``O(shards)`` array per epoch (`ShardOrder`), built in milliseconds; everything else is arithmetic.

``key`` carries the seed, subset, epoch and purpose at once: derive it with `derive_key` (and `sub_key`
per epoch) so that different subsets and epochs get independent permutations.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numba
import numpy as np

__all__ = ["ROUNDS", "SHUFFLES", "derive_key", "sub_key", "feistel1", "ShardOrder", "shard_order", "hierarchical1",
           "shuffle", "feistel", "hierarchical"]

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
            f = _mix(right ^ _mix(ukey + np.uint64(r) * _GOLDEN)) & mask
            left, right = right, left ^ f
        x = (left << np.uint64(half)) | right
        if x < np.uint64(n):
            return np.int64(x)


@dataclass(frozen=True)
class ShardOrder:
    """One epoch's keyed order of a subset's shards, cut into groups of ``window``: what `hierarchical` reads.

    ``order[p]`` is the shard at permuted position ``p``; group ``g`` is positions ``[g·window, g·window +
    window)``, and ``groups[g]`` counts the items (sequences) of the groups before it, so a pass position is
    placed in its group by one ``searchsorted``. ``O(shards)`` per epoch: 1.6 MB at 100,000 shards.
    """

    order: np.ndarray  # [n] int64
    groups: np.ndarray  # [ceil(n / window) + 1] int64


@numba.njit(cache=True, nogil=True)
def _order(n, key):
    out = np.empty(n, np.int64)
    for p in range(n):
        out[p] = feistel1(n, key, p)
    return out


def shard_order(starts: np.ndarray, key: int, window: int) -> ShardOrder:
    """The `ShardOrder` of shards holding items ``[starts[k], starts[k+1])``, keyed ``key`` (one epoch's)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    n = len(starts) - 1
    order = _order(n, np.uint64(sub_key(np.uint64(key), np.uint64(0xB10C))))
    counts = np.diff(starts)[order]
    per_group = np.add.reduceat(counts, np.arange(0, n, window)) if n else counts
    return ShardOrder(order=order, groups=np.concatenate(([0], np.cumsum(per_group))).astype(np.int64))


@numba.njit(cache=True, inline="always")
def hierarchical1(starts, order, groups, key, window, t):
    """Pass position ``t`` -> item, through the grouped shard order of the module docstring (jitted callers)."""
    g = np.searchsorted(groups, t, side="right") - 1
    o = feistel1(groups[g + 1] - groups[g], sub_key(key, np.uint64(g)), t - groups[g])
    for p in range(g * window, min(order.shape[0], g * window + window)):
        k = order[p]
        if o < starts[k + 1] - starts[k]:
            return starts[k] + o
        o -= starts[k + 1] - starts[k]
    return -1  # unreachable: the group's items are its shards' items


@numba.njit(cache=True, nogil=True)
def _hierarchical(starts, order, groups, key, window, t):
    out = np.empty(t.shape[0], np.int64)
    for r in range(t.shape[0]):
        out[r] = hierarchical1(starts, order, groups, key, window, t[r])
    return out


SHUFFLES = (
    "hierarchical",  # the default: locality for a bounded shard cache (module docstring)
    "feistel",  # a full-range keyed permutation
    "none",  # corpus order (debugging, evaluation, throughput floors)
)


@numba.njit(cache=True, nogil=True)
def _feistel(n, key, i):
    out = np.empty(i.shape[0], np.int64)
    for k in range(i.shape[0]):
        out[k] = feistel1(n, key, i[k])
    return out


def shuffle(name: str, starts, key: int, i, window: int = 1) -> np.ndarray:
    """Apply the shuffle ``name`` (one of `SHUFFLES`) of ``[0, n)`` to indices ``i``.

    Args:
        name: ``"hierarchical"``, ``"feistel"`` or ``"none"``.
        starts: ``[shards + 1]`` int64, the items of shard ``k`` are ``[starts[k], starts[k+1])``; the domain
            is ``[0, n = starts[-1])``. Only ``hierarchical`` looks at the shards.
        key: a 64-bit key from `derive_key` / `sub_key`.
        i: ``[k]`` int64 indices in ``[0, n)``.
        window: shards whose items are shuffled among each other (hierarchical only).

    Returns:
        ``[k]`` int64: the images of ``i``.
    """
    if name not in SHUFFLES:
        raise ValueError(f"unknown shuffle {name!r}; choose one of {', '.join(SHUFFLES)}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    starts = np.ascontiguousarray(starts, dtype=np.int64).reshape(-1)
    if len(starts) < 1 or starts[0] != 0 or np.any(np.diff(starts) < 0):
        raise ValueError("starts must be cumulative item counts from 0")
    n = int(starts[-1])
    i = np.ascontiguousarray(i, dtype=np.int64).reshape(-1)
    if i.size and (i.min() < 0 or i.max() >= n):
        raise ValueError(f"indices must lie in [0, {n})")
    if name == "none":
        return i.copy()
    if name == "feistel":
        return _feistel(n, np.uint64(key), i)
    order = shard_order(starts, key, window)
    return _hierarchical(starts, order.order, order.groups, np.uint64(key), int(window), i)


def feistel(n: int, key: int, i) -> np.ndarray:
    """The keyed pseudo-random permutation of ``[0, n)`` applied to ``i``; see `shuffle`."""
    return shuffle("feistel", [0, n], key, i)


def hierarchical(starts, key: int, i, window: int) -> np.ndarray:
    """The shard-grouped permutation of ``[0, starts[-1])`` applied to ``i``; see `shuffle`."""
    return shuffle("hierarchical", starts, key, i, window)
