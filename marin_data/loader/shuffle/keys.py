"""Keys for the loader's permutations: one 63-bit key per (seed, subset, purpose...), and sub-keys per epoch,
group or mixture block, so that different subsets and epochs get independent permutations.

`mix` (splitmix64's finaliser, a bijection on uint64 with full avalanche) is also the Feistel round function
(`marin_data.loader.shuffle.feistel`).
"""

from __future__ import annotations

import hashlib

import numba
import numpy as np

__all__ = ["GOLDEN", "derive_key", "mix", "sub_key"]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def derive_key(seed: int, *parts: object) -> int:
    """A 63-bit key from a seed and any labels (subset name, purpose, phase...), stable across runs.

    blake2b rather than Python's ``hash`` (salted per process) so every rank and every restart agrees.
    """
    h = hashlib.blake2b(repr((int(seed), *parts)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") >> 1  # 63 bits: numba types a Python int as int64


@numba.njit(cache=True, inline="always")
def mix(z):
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
    return mix(np.uint64(key) ^ mix(np.uint64(label) + GOLDEN))
