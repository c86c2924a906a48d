"""JAX's threefry2x32 random numbers in numpy, bit for bit, as JAX >= 0.5.0 derives them
(``jax_threefry_partitionable=True``, the default since then): keys, ``split``, ``fold_in``, 32-bit random
bits and ``randint``.

A key is a ``uint32`` array of shape ``(2,)``. Under the partitionable derivation, element ``i`` of any
random array (a split's subkeys, a draw's bits) is threefry2x32 of the key and the 64-bit counter ``i``, so a
single element costs one hash: that is what lets a trace answer one step without drawing the others.
"""

from __future__ import annotations

import numpy as np

__all__ = ["threefry2x32", "prng_key", "split", "fold_in", "random_bits", "randint"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(key: np.ndarray, x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds (Salmon et al., 2011) of counters ``(x0, x1)`` under ``key``, as
    ``jax._src.prng._threefry2x32_lowering`` computes it: five groups of four rounds, a key injection after
    each group. Arrays of any (equal) shape, uint32, wrapping."""
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    with np.errstate(over="ignore"):
        x0 = np.asarray(x0, dtype=np.uint32) + ks[0]
        x1 = np.asarray(x1, dtype=np.uint32) + ks[1]
        for group in range(5):
            for r in _ROTATIONS[group % 2]:
                x0 = x0 + x1
                x1 = _rotl(x1, r) ^ x0
            x0 = x0 + ks[(group + 1) % 3]
            x1 = x1 + ks[(group + 2) % 3] + np.uint32(group + 1)
    return x0, x1


def prng_key(seed: int) -> np.ndarray:
    """``jax.random.PRNGKey(seed)`` for a seed that fits JAX's default int32: ``[0, seed mod 2**32]`` (the high
    word is a logical shift by 32 of an int32, which is 0)."""
    seed = int(seed)
    if not -2**31 <= seed < 2**31:
        raise ValueError(f"seed {seed} does not fit int32, JAX's default seed type")
    return np.array([0, seed & 0xFFFFFFFF], dtype=np.uint32)


def _counters(n: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit counters ``0..n-1`` (or the given indices) as (high, low) uint32 words."""
    i = np.arange(n, dtype=np.uint64) if np.ndim(n) == 0 else np.asarray(n, dtype=np.uint64)
    return (i >> np.uint64(32)).astype(np.uint32), (i & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def split(key: np.ndarray, num: int = 2) -> np.ndarray:
    """``jax.random.split(key, num)``: subkey ``i`` is threefry2x32(key, counter i). Shape ``(num, 2)``."""
    hi, lo = _counters(num)
    y0, y1 = threefry2x32(key, hi, lo)
    return np.stack([y0, y1], axis=-1)


def fold_in(key: np.ndarray, data: int) -> np.ndarray:
    """``jax.random.fold_in(key, data)``: threefry2x32 of the key and ``(0, uint32(data))``."""
    y0, y1 = threefry2x32(key, np.uint32(0), np.uint32(int(data) & 0xFFFFFFFF))
    return np.array([y0, y1], dtype=np.uint32)


def random_bits(key: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    """``jax.random.bits(key, (n,), uint32)``: element ``i`` is the XOR of the two words of threefry2x32(key,
    counter i). ``n`` may instead be an array of the indices wanted, to draw only those elements."""
    y0, y1 = threefry2x32(key, *_counters(n))
    return y0 ^ y1


def randint(key: np.ndarray, n: int, minval: int, maxval: int) -> np.ndarray:
    """``jax.random.randint(key, (n,), minval, maxval)`` for int32 bounds (``jax._src.random._randint``):
    two draws of 32 bits from ``split(key)``, combined modulo the span in uint32 arithmetic, wrapping as
    XLA does. Returns int32 values."""
    lo, hi = (int(np.clip(v, -2**31, 2**31 - 1)) for v in (minval, maxval))
    k1, k2 = split(key, 2)
    higher, lower = random_bits(k1, n), random_bits(k2, n)
    span = np.uint32(1) if hi <= lo else np.uint32((hi - lo) & 0xFFFFFFFF)
    if maxval > 2**31 - 1 and hi > lo:  # the span 2**32 - lo cannot be held: JAX adds one and wraps
        span = np.uint32((int(span) + 1) & 0xFFFFFFFF)
    with np.errstate(over="ignore"):
        multiplier = np.uint32(2**16) % span
        multiplier = (multiplier * multiplier) % span
        offset = ((higher % span) * multiplier + lower % span) % span
    return (np.int64(lo) + offset.astype(np.int64)).astype(np.int32)
