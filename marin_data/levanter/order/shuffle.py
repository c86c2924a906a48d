"""Levanter's component shuffles in numpy (``levanter/data/_prp.py`` and ``BlockShufflingDataset`` of
``levanter/data/dataset.py``), each with its inverse.

A shuffle maps a position ``p`` of the shuffled component to the sequence it reads, ``perm(p)``; ``inverse``
answers the other way (which position reads sequence ``j``) without enumerating the domain, so a document is
found by inverting, never by scanning. Levanter seeds both pseudo-random permutations from the same place: a
numpy ``PCG64`` generator whose seed is ``jax.random.randint(key, (), 0, 2**30)``.

- ``FeistelPermutation``: five rounds of ``F(r) = (r * 2654435761 + k) mod 2**rb`` on the halves of a
  power-of-two domain, cycle-walking back into ``[0, n)``;
- ``LcgPermutation``: ``(a*x + b) % n`` with ``gcd(a, n) == 1``, evaluated as numpy evaluates Levanter's
  expression (an int64 times a uint64 array is float64, exact while ``a*x < 2**53``);
- ``BlockShuffle``: permute whole blocks of ``io_block_size`` sequences, then permute positions inside each
  window of ``window_blocks`` blocks; a final partial block stays at the end, permuted within itself;
- ``Identity``: ``shuffle: false``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from marin_data.errors import TrainConfigError
from marin_data.levanter.order.threefry import fold_in, randint, split

__all__ = ["Permutation", "Identity", "Feistel", "Linear", "BlockShuffle", "make_permutation", "numpy_rng",
           "PERM_TYPES"]

PERM_TYPES = ("feistel", "linear")
_FEISTEL_ROUNDS = 5
_MAX_WALK = 1000  # Levanter's own bound on cycle-walking
_EXACT_FLOAT = 2**53


def numpy_rng(key: np.ndarray) -> np.random.Generator:
    """Levanter's ``_np_rng_from_jax_key``: ``PCG64(randint(key, (), 0, 2**30))``."""
    return np.random.Generator(np.random.PCG64(int(randint(key, 1, 0, 2**30)[0])))


class Permutation:
    """A bijection of ``[0, length)``: ``__call__`` (position -> sequence) and ``inverse``, both on int64 arrays."""

    length: int

    def __call__(self, p: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def inverse(self, j: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class Identity(Permutation):
    length: int

    def __call__(self, p: np.ndarray) -> np.ndarray:
        return np.asarray(p, dtype=np.int64)

    inverse = __call__


@dataclass(frozen=True)
class Linear(Permutation):
    """``(a*x + b) % n``, exactly as Levanter's numpy expression computes it."""

    length: int
    a: int
    b: int

    @classmethod
    def from_key(cls, length: int, key: np.ndarray) -> Linear:
        rng = numpy_rng(key)
        if length == 1:
            return cls(1, 1, 0)
        while True:
            a = rng.integers(1, length)
            if np.gcd(a, length) == 1:
                break
        return cls(length, int(a), int(rng.integers(0, length)))

    def __call__(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=np.int64)
        out = (np.int64(self.a) * p.astype(np.uint64) + np.int64(self.b)) % self.length
        return out.astype(np.int64)

    def inverse(self, j: np.ndarray) -> np.ndarray:
        if self.a * (self.length - 1) + self.b >= _EXACT_FLOAT:
            raise TrainConfigError(f"the linear permutation of {self.length:,} sequences is computed in float64 by "
                             "Levanter and is not exactly invertible at that length")
        a_inv = pow(self.a, -1, self.length)
        j = np.asarray(j, dtype=object)
        return np.asarray((j - self.b) * a_inv % self.length, dtype=np.int64)


@dataclass(frozen=True)
class Feistel(Permutation):
    """Levanter's ``FeistelPermutation`` (five rounds, cycle-walking), with its inverse."""

    length: int
    keys: tuple[int, ...]
    right_bits: int = field(init=False)

    def __post_init__(self) -> None:
        bits = max(0, (self.length - 1).bit_length())
        object.__setattr__(self, "right_bits", bits - bits // 2)

    @classmethod
    def from_key(cls, length: int, key: np.ndarray) -> Feistel:
        bits = max(0, (length - 1).bit_length())
        right = bits - bits // 2
        keys = numpy_rng(key).integers(0, 1 << right, size=_FEISTEL_ROUNDS, dtype=np.uint64)
        return cls(length, tuple(int(k) for k in keys))

    def _f(self, r: np.ndarray, k: int) -> np.ndarray:
        mask = np.uint64((1 << self.right_bits) - 1)
        return ((r & mask) * np.uint64(2654435761) + np.uint64(k)) & mask

    def _rounds(self, x: np.ndarray) -> np.ndarray:
        rb, mask = np.uint64(self.right_bits), np.uint64((1 << self.right_bits) - 1)
        left, right = x >> rb, x & mask
        for k in self.keys:
            left, right = right, left ^ self._f(right, k)
        return (left << rb) | right

    def _unrounds(self, x: np.ndarray) -> np.ndarray:
        rb, mask = np.uint64(self.right_bits), np.uint64((1 << self.right_bits) - 1)
        left, right = x >> rb, x & mask
        for k in reversed(self.keys):
            left, right = right ^ self._f(left, k), left
        return (left << rb) | right

    def _walk(self, x: np.ndarray, step) -> np.ndarray:
        x = np.atleast_1d(np.asarray(x, dtype=np.int64)).astype(np.uint64)
        if self.length == 1:
            return np.zeros(x.shape, dtype=np.int64)
        out = step(x)
        for _ in range(_MAX_WALK):
            outside = out >= np.uint64(self.length)
            if not outside.any():
                return out.astype(np.int64)
            out[outside] = step(out[outside])
        raise RuntimeError("Feistel cycle-walking did not return to the domain")

    def __call__(self, p: np.ndarray) -> np.ndarray:
        return self._walk(p, self._rounds)

    def inverse(self, j: np.ndarray) -> np.ndarray:
        return self._walk(j, self._unrounds)


def make_permutation(kind: str, length: int, key: np.ndarray) -> Permutation:
    """Levanter's ``Permutation.make(kind, length, key)``."""
    if kind == "feistel":
        return Feistel.from_key(length, key)
    if kind == "linear":
        return Linear.from_key(length, key)
    raise ValueError(f"unknown permutation kind {kind!r}; Levanter knows {', '.join(PERM_TYPES)}")


@dataclass
class BlockShuffle(Permutation):
    """Levanter's ``BlockShufflingDataset`` index map: blocks permuted, then positions within each window."""

    length: int
    io_block_size: int
    window_blocks: int
    key: np.ndarray
    perm_type: str = "feistel"

    def __post_init__(self) -> None:
        self._block_key, self._full_key, self._tail_key = split(self.key, 3)
        self.full_blocks, self.tail = divmod(self.length, self.io_block_size)
        self.window = self.io_block_size * self.window_blocks
        total_blocks = self.full_blocks + (self.tail > 0)
        self.windows = math.ceil(total_blocks / self.window_blocks)
        self._blocks = make_permutation(self.perm_type, self.full_blocks, self._block_key) \
            if self.full_blocks > 1 else Identity(self.full_blocks)
        self._cache: dict[tuple[str, int], Permutation] = {}

    def _full_region(self, w: int) -> int:
        """Sequences in the full blocks of window ``w``."""
        return (min(self.window_blocks, self.full_blocks - w * self.window_blocks)) * self.io_block_size

    def _perm(self, which: str, w: int, size: int) -> Permutation:
        if size <= 1:
            return Identity(size)
        if (which, w) not in self._cache:
            if len(self._cache) > 64:
                self._cache.clear()
            key = self._full_key if which == "full" else self._tail_key
            self._cache[(which, w)] = make_permutation(self.perm_type, size, fold_in(key, w))
        return self._cache[(which, w)]

    def __call__(self, p: np.ndarray) -> np.ndarray:
        p = np.atleast_1d(np.asarray(p, dtype=np.int64))
        out = np.empty_like(p)
        w_of = np.minimum(p // self.window, self.windows - 1)
        for w in np.unique(w_of):
            sel = w_of == w
            off = p[sel] - w * self.window
            full = self._full_region(int(w))
            res = np.empty_like(off)
            inside = off < full
            permuted = self._perm("full", int(w), full)(off[inside])
            blk, within = np.divmod(permuted, self.io_block_size)
            res[inside] = self._blocks(w * self.window_blocks + blk) * self.io_block_size + within
            tail = self._perm("tail", int(w), self.tail)(off[~inside] - full)
            res[~inside] = self.full_blocks * self.io_block_size + tail
            out[sel] = res
        return out

    def inverse(self, j: np.ndarray) -> np.ndarray:
        j = np.atleast_1d(np.asarray(j, dtype=np.int64))
        out = np.empty_like(j)
        in_tail = j >= self.full_blocks * self.io_block_size
        last = self.windows - 1
        if in_tail.any():
            full = self._full_region(last)
            back = self._perm("tail", last, self.tail).inverse(j[in_tail] - self.full_blocks * self.io_block_size)
            out[in_tail] = last * self.window + full + back
        if (~in_tail).any():
            blk, within = np.divmod(j[~in_tail], self.io_block_size)
            position = self._blocks.inverse(blk)
            w, slot = np.divmod(position, self.window_blocks)
            res = np.empty_like(position)
            for wi in np.unique(w):
                sel = w == wi
                perm = self._perm("full", int(wi), self._full_region(int(wi)))
                res[sel] = wi * self.window + perm.inverse(slot[sel] * self.io_block_size + within[sel])
            out[~in_tail] = res
        return out
