"""Which documents a window of a cache's flat tokens touches, from its offsets alone, read in ranges (and, for
``--with-text``, the window's tokens, read the same way).

A cache part's ``input_ids/offsets`` holds ``rows + 1`` int64 values: ``[0]`` is the row count and ``[r+1]``
the end of row ``r``. A trace needs the rows around a few thousand positions, not the array (~1 GB a cell
at Marin's scale), so `Offsets` reads one chunk file's shard index (its tail) and then only the inner chunks
(262,144 values) a lookup lands on, each a ranged read of one index entry, and decodes only the blosc blocks of
them it needs (`marin_data.levanter.chunkfile.decode_block`); frames and blocks are kept in a small LRU.
A lookup guesses the row by interpolation (documents have similar lengths on average), narrowing the guess
with the values each probe reads, and bisects where interpolation stalls.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from marin_data.errors import CacheCheckError, CacheFormatError
from marin_data.levanter.cache import CachePart, LevanterCache
from marin_data.levanter.chunkfile import EMPTY, block_items, decode_block, read_index
from marin_data.transfer.read import read_tail
from marin_data.retry import retry_call
from marin_data.transfer.plan import DOWNLOAD_POLICY

__all__ = ["Ranged", "Offsets", "InnerChunks", "Document", "documents_in"]

_KEPT_BYTES = 128 * 2**20  # stored frames and decoded blocks kept, every cache of a trace together
_INTERPOLATE = 8  # probes guessed by interpolation before a lookup bisects

class Document(NamedTuple):
    """A row of the cache touched by a window: its number and the first and last of its tokens (offsets in
    the document, inclusive) inside the window. A tuple: a step makes tens of thousands."""

    row: int
    first: int
    last: int


class InnerChunks:
    """Stored inner chunk frames and decoded blocks kept for reuse, the least recently used dropped first past
    ``budget`` bytes: one budget for every cache of a trace, so memory does not grow with the number of cells."""

    def __init__(self, budget: int = _KEPT_BYTES) -> None:
        self.budget, self.held, self._values = budget, 0, OrderedDict()

    def get(self, key: tuple):
        found = self._values.get(key)
        if found is None:
            return None
        self._values.move_to_end(key)
        return found[0]

    def put(self, key: tuple, value, size: int) -> None:
        self._values[key] = (value, size)
        self.held += size
        while self.held > self.budget and len(self._values) > 1:
            self.held -= self._values.popitem(last=False)[1][1]


class Ranged:
    """Random access to one array of a part (its offsets, or its tokens), one block of an inner chunk at a time."""

    def __init__(self, cache: LevanterCache, part: CachePart, kept: InnerChunks | None = None, *,
                 tokens: bool = False) -> None:
        self.cache, self.part = cache, part
        self.meta = part.data if tokens else part.offsets
        self.chunks = part.data_chunks() if tokens else part.offsets_chunks()
        self.count = part.tokens if tokens else part.rows + 1
        self._index: dict[int, np.ndarray] = {}
        self._inner = kept if kept is not None else InnerChunks()
        self.inner_reads = self.block_reads = 0  # inner chunks read from the store, blocks decoded

    def _table(self, k: int) -> np.ndarray:
        if k not in self._index:
            path = self.chunks[k].path
            info = self.cache.store.head(path)
            if info is None:
                raise CacheFormatError("chunk file missing", path=self.cache.where(path))
            tail = read_tail(self.cache.store, path, info.size, self.meta.index_bytes)
            self._index[k] = read_index(tail, info.size, self.meta, self.cache.where(path))
        return self._index[k]

    def _stored(self, k: int, i: int) -> tuple[bytes | None, int]:
        """Inner chunk ``i`` of chunk file ``k`` as stored (None: not stored, all fill value) and the elements
        per block `decode_block` decodes of it, kept."""
        found = self._inner.get((id(self), k, i))
        if found is not None:
            return found
        offset, size = (int(v) for v in self._table(k)[i])
        path, where = self.chunks[k].path, self._where(k, i)
        frame = None if offset == EMPTY else retry_call(lambda: self._read(path, offset, size), policy=DOWNLOAD_POLICY,
                                                        what=where)
        found = frame, block_items(frame, self.meta, where)
        self.inner_reads += 1
        self._inner.put((id(self), k, i), found, 0 if frame is None else len(frame))
        return found

    def _where(self, k: int, i: int) -> str:
        return f"{self.cache.where(self.chunks[k].path)} inner chunk {i}"

    def _read(self, path: str, offset: int, size: int) -> bytes:
        with self.cache.store.read(path, offset, offset + size) as stream:
            skip, pieces, got = offset - stream.start, [], 0
            for piece in stream:
                pieces.append(piece)
                got += len(piece)
                if got >= skip + size:
                    break
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return data if (skip, len(data)) == (0, size) else data[skip:skip + size]

    def span(self, e: int) -> tuple[int, int, np.ndarray]:
        """The block holding element ``e`` (a blosc block of its inner chunk, or the inner chunk): its first
        element, one past its last, and its values."""
        k, within = divmod(e, self.meta.chunk)
        i, r = divmod(within, self.meta.inner)
        frame, items = self._stored(k, i)
        j = r // items
        values = self._inner.get((id(self), k, i, j))
        if values is None:
            values = decode_block(frame, self.meta, j, items, self._where(k, i))
            self.block_reads += 1
            self._inner.put((id(self), k, i, j), values, values.nbytes)
        lo = k * self.meta.chunk + i * self.meta.inner + j * items
        hi = min(lo + len(values), self.count)
        return lo, hi, values[:hi - lo]

    def values(self, lo: int, hi: int) -> np.ndarray:
        """Elements ``[lo, hi)`` as int64."""
        out, e = [np.zeros(0, np.int64)], lo
        while e < hi:
            a, b, v = self.span(e)
            out.append(v[e - a:min(hi, b) - a])
            e = min(hi, b)
        return np.concatenate(out).astype(np.int64)


class Offsets(Ranged):
    """A part's offsets: where its rows end, and which row holds a token."""

    def values(self, lo: int, hi: int) -> np.ndarray:
        """Elements ``[lo, hi)``, element 0 read as 0 (where row 0 starts)."""
        values = super().values(lo, hi)
        if lo == 0 and len(values):
            values[0] = 0
        return values

    def row_of(self, t: int) -> int:
        """The row holding token ``t`` of the part: the ``r`` with ``offsets[r] <= t < offsets[r+1]``."""
        rows, tokens = self.part.rows, self.part.tokens
        lo, hi = 1, rows  # the answer e (offsets[e] > t, smallest) lies in [lo, hi]
        below, above = 0, tokens  # offsets[lo - 1] <= t < offsets[hi]
        for n in range(_INTERPOLATE + 64):
            guess = lo + (t - below) * (hi - lo) // max(above - below, 1) if n < _INTERPOLATE else (lo + hi) // 2
            a, b, v = self.span(min(max(guess, lo), hi))
            first = max(a, 1)
            head = v[first - a:]
            if head.size and head[0] > t:
                hi, above = first, int(head[0])
            elif head.size and head[-1] <= t:
                lo, below = b, int(head[-1])
            else:
                return first + int(np.searchsorted(head, t, side="right")) - 1
            if lo >= hi:  # offsets[hi] > t, and every element below it is <= t
                return hi - 1
        raise CacheCheckError("offsets do not increase: no row holds the position", path=self.cache.where(
            self.chunks[0].path))


def documents_in(offsets: Offsets, start: int, stop: int, row_base: int = 0) -> list[Document]:
    """The rows of the part that tokens ``[start, stop)`` (part positions) touch, in order."""
    if start >= stop:
        return []
    r0 = offsets.row_of(start)
    a, _, v = offsets.span(r0)
    # most windows end inside the block their first row is in: the ends of its rows are read there
    n = int(np.searchsorted(v[r0 - a:], stop)) if r0 else len(v)  # element 0 is the row count, not an end
    if r0 - a + n < len(v):
        bounds = v[r0 - a:r0 - a + n + 1]
    else:
        bounds = offsets.values(r0, offsets.row_of(stop - 1) + 2)
    ends = bounds.tolist()  # a handful of values: plain ints are faster than numpy here
    return [Document(row_base + r0 + m, max(start, lo) - lo, min(stop, hi) - 1 - lo)
            for m, (lo, hi) in enumerate(zip(ends, ends[1:])) if hi > lo]  # an empty row holds no token
