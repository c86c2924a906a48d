"""``jax.random.permutation(key, x)`` in numpy, bit for bit (``jax._src.random._shuffle``).

JAX does not run Fisher-Yates: it sorts the values by fresh random 32-bit keys, stably, in
``ceil(3 * ln(n) / ln(2**32 - 1))`` rounds (one round up to n = 1,625, two up to about 2.6 million), each
round taking ``key, subkey = split(key)`` and sorting by ``bits(subkey, n)``. Equal keys keep their order,
so a stable sort is part of the answer, not a detail.
"""

from __future__ import annotations

import numpy as np

from marin_data.levanter.order.threefry import random_bits, split

__all__ = ["num_rounds", "permutation", "inverse"]

_UINT32_MAX = np.iinfo(np.uint32).max


def num_rounds(n: int) -> int:
    """How many sort rounds JAX runs for ``n`` values (the same float64 expression; 0 for n <= 1)."""
    return int(np.ceil(3 * np.log(max(1, n)) / np.log(_UINT32_MAX)))


def permutation(key: np.ndarray, x: int | np.ndarray) -> np.ndarray:
    """``jax.random.permutation(key, x)`` of a 1-D array, or of ``arange(x)`` for an int."""
    x = np.arange(x) if np.ndim(x) == 0 else np.asarray(x)
    for _ in range(num_rounds(x.size)):
        key, subkey = split(key, 2)
        x = x[np.argsort(random_bits(subkey, x.size), kind="stable")]
    return x


def inverse(perm: np.ndarray) -> np.ndarray:
    """The inverse of a permutation of ``arange(n)``: ``inverse(p)[p[i]] == i``."""
    out = np.empty_like(perm)
    out[perm] = np.arange(perm.size, dtype=perm.dtype)
    return out
