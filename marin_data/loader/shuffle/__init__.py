"""Keyed permutations of ``[0, n)`` that are never materialised: the loader's shuffle.

`SHUFFLES` names the algorithms (``"hierarchical"``, the default, ``"feistel"`` and ``"none"``), `shuffle`
applies one by name to an array of indices and `unshuffle` inverts it; the loader's stream calls the
per-index forms from jitted code (`feistel.feistel1`, `hierarchical.hierarchical1`). ``key`` carries the
seed, subset, epoch and purpose at once: derive it with `keys.derive_key` (and `keys.sub_key` per epoch) so
that different subsets and epochs get independent permutations. How each algorithm works, and why: docs/data.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from marin_data.loader.shuffle.feistel import feistel_many, unfeistel_many
from marin_data.loader.shuffle.hierarchical import hierarchical_many, shard_order, unhierarchical_many

__all__ = ["SHUFFLES", "ALGORITHMS", "INVERSES", "shuffle", "unshuffle", "feistel", "hierarchical"]


def _hierarchical(starts: np.ndarray, key: int, i: np.ndarray, window: int) -> np.ndarray:
    order = shard_order(starts, key, window)
    return hierarchical_many(starts, order.order, order.groups, np.uint64(key), int(window), i)


def _feistel(starts: np.ndarray, key: int, i: np.ndarray, window: int) -> np.ndarray:
    return feistel_many(int(starts[-1]), np.uint64(key), i)


def _unhierarchical(starts: np.ndarray, key: int, u: np.ndarray, window: int) -> np.ndarray:
    return unhierarchical_many(starts, shard_order(starts, key, window), key, window, u)


def _unfeistel(starts: np.ndarray, key: int, u: np.ndarray, window: int) -> np.ndarray:
    return unfeistel_many(int(starts[-1]), np.uint64(key), u)


def _none(starts: np.ndarray, key: int, i: np.ndarray, window: int) -> np.ndarray:
    return i.copy()


# name -> algorithm(starts, key, indices, window); the order is the loader's (its jitted code dispatches on
# the position of the name in `SHUFFLES`).
ALGORITHMS: dict[str, Callable[[np.ndarray, int, np.ndarray, int], np.ndarray]] = {
    "hierarchical": _hierarchical,  # the default: locality for a bounded shard cache
    "feistel": _feistel,  # a full-range keyed permutation
    "none": _none,  # corpus order (debugging, evaluation, throughput floors)
}
SHUFFLES = tuple(ALGORITHMS)
# name -> the inverse of ALGORITHMS[name], same arguments: the indices that were mapped to the values given
INVERSES: dict[str, Callable[[np.ndarray, int, np.ndarray, int], np.ndarray]] = {
    "hierarchical": _unhierarchical,
    "feistel": _unfeistel,
    "none": _none,
}


def shuffle(name: str, starts, key: int, i, window: int = 1) -> np.ndarray:
    """Apply the shuffle ``name`` (one of `SHUFFLES`) of ``[0, n)`` to indices ``i``.

    Args:
        name: ``"hierarchical"``, ``"feistel"`` or ``"none"``.
        starts: ``[shards + 1]`` int64, the items of shard ``k`` are ``[starts[k], starts[k+1])``; the domain
            is ``[0, n = starts[-1])``. Only ``hierarchical`` looks at the shards.
        key: a 64-bit key from `keys.derive_key` / `keys.sub_key`.
        i: ``[k]`` int64 indices in ``[0, n)``.
        window: shards whose items are shuffled among each other (hierarchical only).

    Returns:
        ``[k]`` int64: the images of ``i``.
    """
    starts, i = _checked(name, starts, i, window)
    return ALGORITHMS[name](starts, key, i, window)


def unshuffle(name: str, starts, key: int, u, window: int = 1) -> np.ndarray:
    """The inverse of `shuffle` (same arguments): the indices ``i`` whose images are ``u``."""
    starts, u = _checked(name, starts, u, window)
    return INVERSES[name](starts, key, u, window)


def _checked(name: str, starts, i, window: int) -> tuple[np.ndarray, np.ndarray]:
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
    return starts, i


def feistel(n: int, key: int, i) -> np.ndarray:
    """The keyed pseudo-random permutation of ``[0, n)`` applied to ``i``; see `shuffle`."""
    return shuffle("feistel", [0, n], key, i)


def hierarchical(starts, key: int, i, window: int) -> np.ndarray:
    """The shard-grouped permutation of ``[0, starts[-1])`` applied to ``i``; see `shuffle`."""
    return shuffle("hierarchical", starts, key, i, window)
