"""Which documents a window of a cache's flat tokens touches, from its offsets alone, read in ranges (and, for
``--with-text``, the window's tokens, read the same way).

A cache part's ``input_ids/offsets`` holds ``rows + 1`` int64 values: ``[0]`` is the row count and ``[r+1]``
the end of row ``r``. A trace needs the rows around a few thousand positions, not the array (~1 GB a cell
at Marin's scale), so `Offsets` reads one chunk file's shard index (its tail) and then only the inner chunks
(262,144 values) a lookup lands on, each a ranged read of one index entry, decoded and kept in a small LRU.
A lookup guesses the inner chunk by interpolation (documents have similar lengths on average), then bisects.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from marin_data.errors import CacheCheckError, CacheFormatError
from marin_data.levanter.cache import CachePart, LevanterCache
from marin_data.levanter.chunkfile import EMPTY, decode_inner, read_index
from marin_data.levanter.source import read_tail
from marin_data.retry import retry_call
from marin_data.transfer.plan import DOWNLOAD_POLICY

__all__ = ["Ranged", "Offsets", "InnerChunks", "Document", "documents_in"]

_KEPT_INNER = 32  # decoded inner chunks kept (2 MB each)


@dataclass(frozen=True)
class Document:
    """A row of the cache touched by a window: its number and the first and last of its tokens (offsets in
    the document, inclusive) inside the window."""

    row: int
    first: int
    last: int


class InnerChunks:
    """Decoded inner chunks kept for reuse, the least recently used dropped first past ``kept`` (2 MB each):
    one budget for every cache of a trace, so memory does not grow with the number of cells."""

    def __init__(self, kept: int = _KEPT_INNER) -> None:
        self.kept, self._values = kept, OrderedDict()

    def get(self, key: tuple) -> np.ndarray | None:
        if key in self._values:
            self._values.move_to_end(key)
        return self._values.get(key)

    def spare(self) -> np.ndarray | None:
        """The array of the least recently used entry, dropped to be decoded into again (None until full):
        reusing its pages spares a fresh 2 MB allocation's page faults on every read."""
        return self._values.popitem(last=False)[1] if len(self._values) >= self.kept else None

    def put(self, key: tuple, values: np.ndarray) -> None:
        self._values[key] = values


class Ranged:
    """Random access to one array of a part (its offsets, or its tokens), one inner chunk at a time."""

    def __init__(self, cache: LevanterCache, part: CachePart, kept: InnerChunks | None = None, *,
                 tokens: bool = False) -> None:
        self.cache, self.part = cache, part
        self.meta = part.data if tokens else part.offsets
        self.chunks = part.data_chunks() if tokens else part.offsets_chunks()
        self.count = part.tokens if tokens else part.rows + 1
        self._index: dict[int, np.ndarray] = {}
        self._inner = kept if kept is not None else InnerChunks()
        self.inner_reads = 0

    def _table(self, k: int) -> np.ndarray:
        if k not in self._index:
            path = self.chunks[k].path
            info = self.cache.store.head(path)
            if info is None:
                raise CacheFormatError("chunk file missing", path=self.cache.where(path))
            tail = read_tail(self.cache.store, path, info.size, self.meta.index_bytes)
            self._index[k] = read_index(tail, info.size, self.meta, self.cache.where(path))
        return self._index[k]

    def _inner_chunk(self, k: int, i: int) -> np.ndarray:
        found = self._inner.get((id(self), k, i))
        if found is not None:
            return found
        offset, size = (int(v) for v in self._table(k)[i])
        path, where = self.chunks[k].path, f"{self.cache.where(self.chunks[k].path)} inner chunk {i}"
        frame = None if offset == EMPTY else retry_call(lambda: self._read(path, offset, size), policy=DOWNLOAD_POLICY,
                                                        what=where)
        values = decode_inner(frame, self.meta, where, out=self._inner.spare())
        self.inner_reads += 1
        self._inner.put((id(self), k, i), values)
        return values

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
        """The inner chunk holding element ``e``: its first element, one past its last, and its values."""
        k, within = divmod(e, self.meta.chunk)
        i = within // self.meta.inner
        lo = k * self.meta.chunk + i * self.meta.inner
        hi = min(lo + self.meta.inner, self.count)
        return lo, hi, self._inner_chunk(k, i)[:hi - lo]

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
        guess = 1 + min(rows - 1, t * rows // max(tokens, 1))
        for _ in range(64):
            a, b, v = self.span(guess)
            first = max(a, 1)
            head = v[first - a:]
            if head.size and head[0] > t:
                hi = first
            elif head.size and head[-1] <= t:
                lo = b
            else:
                return first + int(np.searchsorted(head, t, side="right")) - 1
            if lo >= hi:  # offsets[hi] > t, and every element below it is <= t
                return hi - 1
            guess = (lo + hi) // 2
        raise CacheCheckError("offsets do not increase: no row holds the position", path=self.cache.where(
            self.chunks[0].path))


def documents_in(offsets: Offsets, start: int, stop: int, row_base: int = 0) -> list[Document]:
    """The rows of the part that tokens ``[start, stop)`` (part positions) touch, in order."""
    if start >= stop:
        return []
    r0, r1 = offsets.row_of(start), offsets.row_of(stop - 1)
    bounds = offsets.values(r0, r1 + 2)
    return [Document(row_base + r0 + n, int(max(start, bounds[n]) - bounds[n]),
                     int(min(stop, bounds[n + 1]) - 1 - bounds[n]))
            for n in range(r1 - r0 + 1) if bounds[n + 1] > bounds[n]]  # an empty row holds no token
