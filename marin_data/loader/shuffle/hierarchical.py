"""The shard-grouped shuffle: each epoch permutes a subset's shards, cuts them into groups of ``window``
shards, and shuffles the items of a group among themselves, so a pass reads each shard in one stretch.

`shard_order` builds one epoch's `ShardOrder` (``O(shards)``); `hierarchical1` places one pass position
(from jitted code); `hierarchical_many` maps an array of them and `unhierarchical_many` inverts it. See
docs/data.md for the reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from marin_data.loader.shuffle.feistel import feistel1, unfeistel1
from marin_data.loader.shuffle.keys import sub_key

__all__ = ["ShardOrder", "shard_order", "hierarchical1", "hierarchical_many", "unhierarchical_many"]


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
def hierarchical_many(starts, order, groups, key, window, t):
    out = np.empty(t.shape[0], np.int64)
    for r in range(t.shape[0]):
        out[r] = hierarchical1(starts, order, groups, key, window, t[r])
    return out


@numba.njit(cache=True, nogil=True)
def _unhierarchical(starts, order, where, groups, key, window, u):
    out = np.empty(u.shape[0], np.int64)
    for r in range(u.shape[0]):
        k = np.searchsorted(starts, u[r], side="right") - 1  # the (non-empty) shard holding item u
        p = where[k]
        g = p // window
        o = u[r] - starts[k]
        for q in range(g * window, p):  # the items of the shards before it in its group
            o += starts[order[q] + 1] - starts[order[q]]
        out[r] = groups[g] + unfeistel1(groups[g + 1] - groups[g], sub_key(key, np.uint64(g)), o)
    return out


def unhierarchical_many(starts: np.ndarray, order: ShardOrder, key: int, window: int, u: np.ndarray) -> np.ndarray:
    """The inverse of `hierarchical_many`: the pass position of each item ``u`` (``[k]`` int64), given the
    epoch's `ShardOrder`; ``O(shards)`` once, then ``O(window)`` an item."""
    where = np.empty_like(order.order)
    where[order.order] = np.arange(len(order.order))
    return _unhierarchical(np.ascontiguousarray(starts, dtype=np.int64), order.order, where, order.groups,
                           np.uint64(key), int(window), np.ascontiguousarray(u, dtype=np.int64))
