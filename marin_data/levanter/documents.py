"""A cache part's documents in bounded memory: their ends streamed from the offsets chunk files, checked as
they come, and their tokens read from the data chunk files in order, one decoded chunk file at a time.

`LevanterCache.document_ends` holds a part's ends whole (8 bytes a document), which suits the loader's parts.
A pass over every document of a store (the datasheet's document lengths: ~23 billion documents at Marin's
scale) streams them instead: `iter_ends` yields one offsets chunk file's ends at a time and refuses offsets
that contradict the ledger before anyone counts them. `TokenReader` serves the tokens of ``[start, stop)``
ranges asked in increasing order, decoding each data chunk file once and keeping only the last.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from marin_data.errors import CacheCheckError
from marin_data.levanter.cache import CachePart, LevanterCache

__all__ = ["iter_ends", "TokenReader", "refuse_ids"]

_UINT32 = 2 ** 32


def iter_ends(cache: LevanterCache, part: CachePart) -> Iterator[np.ndarray]:
    """``part``'s document ends (int64, ascending: where each document stops in the part's flat tokens), one
    offsets chunk file's worth at a time; together, ``part.rows`` of them.

    Raises:
        CacheFormatError: an offsets chunk file missing or unreadable.
        CacheCheckError: ``offsets[0]`` is not the ledger's row count, an end lies below 0 or before the one
            before it, or the last end is not the ledger's token count (the file is named).
    """
    previous, where = 0, ""
    for k, chunk in enumerate(part.offsets_chunks()):
        values, where = cache.read_chunk(chunk, part.offsets), cache.where(chunk.path)
        if k == 0:
            if values[0] != part.rows:
                raise CacheCheckError(f"offsets[0] is {values[0]}, the ledger says {part.rows} rows", path=where)
            values = values[1:]
        if len(values) and (values[0] < previous or bool(np.any(values[1:] < values[:-1]))):
            raise CacheCheckError("offsets decrease (or start below 0): a document ends before the one before "
                                  "it", path=where)
        if len(values):
            previous = int(values[-1])
        yield values
    if previous != part.tokens:
        raise CacheCheckError(f"the last offset is {previous}, the ledger counts {part.tokens} tokens", path=where)


class TokenReader:
    """The tokens of one part by flat position, as uint32, for ranges asked in increasing order.

    Each data chunk file is read and decoded when first needed and kept until the next one is: memory is
    one decoded chunk file. Every value is checked to lie in ``[0, vocab_size)`` (in uint32 without one).

    Raises (from `pieces`):
        CacheFormatError: a data chunk file missing or unreadable.
        CacheCheckError: a token id outside the vocabulary (the file and the ids are named).
    """

    def __init__(self, cache: LevanterCache, part: CachePart, *, vocab_size: int | None = None) -> None:
        self.cache, self.part = cache, part
        self.bound = vocab_size or _UINT32
        self.chunks = part.data_chunks()
        self._k, self._values = -1, np.zeros(0, np.uint32)

    def pieces(self, start: int, stop: int) -> Iterator[np.ndarray]:
        """Tokens ``[start, stop)`` of the part, one piece per data chunk file they lie in."""
        while start < stop:
            k = start // self.part.data.chunk
            chunk, values = self.chunks[k], self._load(k)
            end = min(stop, chunk.stop)
            yield values[start - chunk.start:end - chunk.start]
            start = end

    def _load(self, k: int) -> np.ndarray:
        if k != self._k:
            chunk = self.chunks[k]
            self._values = None  # the previous chunk file's values go before the next one is decoded
            values = self.cache.read_chunk(chunk, self.part.data)
            refuse_ids(values, None if self.bound == _UINT32 else self.bound, self.cache.where(chunk.path))
            self._k, self._values = k, values.view("<u4") if values.dtype.itemsize == 4 else values.astype("<u4")
        return self._values


def refuse_ids(values: np.ndarray, vocab_size: int | None, where: str) -> None:
    """Raise `CacheCheckError` naming ``where`` if a token id of ``values`` lies outside ``[0, vocab_size)``
    (outside uint32 without a vocabulary)."""
    bound = vocab_size or _UINT32
    if values.size and (values.min() < 0 or values.max() >= bound):
        what = f"the tokenizer's vocabulary [0, {bound})" if vocab_size else "uint32"
        raise CacheCheckError(f"token ids from {values.min()} to {values.max()}: outside {what}", path=where)
