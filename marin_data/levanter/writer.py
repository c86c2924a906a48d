"""Writing Levanter caches with Levanter's exact array specs (`marin_data.levanter.arraymeta`): what the
tests build caches with, and what converting a corpus to caches is a thin layer over.

`CacheWriter` writes one consolidated cache from batches of documents in bounded memory (what a converter
streams into); `write_cache` writes one cache root from documents (arrays of token ids) in either layout: ``consolidated``
(``input_ids/{offsets,data}`` at the root) or ``sharded`` (``parts`` sub-caches ``part-NNNNN-of-MMMMM/``,
each consolidated with its own ledger and ``.success``, and a top ledger that adds them up). The ledger's
``preprocessor_metadata`` records the tokenizer's name and vocabulary. Every file is written atomically, the
ledger last, so a crash never leaves a ledger behind arrays that are not there. The chunk grid is a
parameter so that tests can make small caches of many chunk files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.levanter.arraymeta import LEVANTER_CHUNK, LEVANTER_INNER, LZ4, ZARR_JSON, ArrayMeta, Blosc, \
    render_array_meta
from marin_data.levanter.cache import DATA_ARRAY, OFFSETS_ARRAY
from marin_data.levanter.chunkfile import encode_chunk
from marin_data.levanter.ledger import CONSOLIDATED, LEDGER, SHARDED, STATS, SUCCESS, TOKENS_FIELD, Ledger, \
    render_ledger

__all__ = ["part_name", "write_cache", "CacheWriter"]


def part_name(i: int, n: int) -> str:
    """The folder of sub-cache ``i`` of ``n`` in the sharded layout."""
    return f"part-{i:05d}-of-{n:05d}"


def write_cache(
    root: str | os.PathLike,
    documents: Sequence[np.ndarray],
    *,
    dtype: str = "int32",
    codec: Blosc | None = LZ4,
    chunk: int = LEVANTER_CHUNK,
    inner: int = LEVANTER_INNER,
    layout: str = CONSOLIDATED,
    parts: int = 1,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
    stats: bool = False,
) -> Ledger:
    """Write ``documents`` as one Levanter cache at ``root`` (created; files already there are replaced).

    Args:
        documents: each document's token ids, in row order.
        dtype: of the token values, ``int32`` or ``int64`` (offsets are always int64).
        codec: blosc settings (`LZ4`, the default every Levanter reads, or `ZSTD`); None stores raw chunks.
        chunk, inner: elements per chunk file and per inner chunk (``inner`` must divide ``chunk``).
        layout: ``consolidated`` or ``sharded`` (``parts`` sub-caches, the documents split evenly in order).
        tokenizer, vocab_size: recorded in the ledger's ``preprocessor_metadata`` when given.
        stats: also write Marin's ``.stats.json`` beside the ledger.

    Returns:
        The top ledger, as written.
    """
    if chunk % inner:
        raise ValueError(f"inner chunk {inner} does not divide the chunk {chunk}")
    root = Path(root)
    data = ArrayMeta(dtype=dtype, chunk=chunk, inner=inner, blosc=codec)
    offsets = replace(data, dtype="int64")
    meta = {k: v for k, v in {"tokenizer": tokenizer, "vocab_size": vocab_size}.items() if v is not None} or None
    if layout == CONSOLIDATED:
        ledger = _write_part(root, root, documents, data, offsets, meta)
    elif layout == SHARDED:
        bounds = np.linspace(0, len(documents), parts + 1).astype(int)
        names = [part_name(i, parts) for i in range(parts)]
        subs = [_write_part(root, root / name, documents[a:b], data, offsets, meta, success=True)
                for name, a, b in zip(names, bounds[:-1], bounds[1:])]
        ledger = Ledger(total_num_rows=sum(s.total_num_rows for s in subs),
                        shard_rows={n: s.total_num_rows for n, s in zip(names, subs)}, is_finished=True,
                        finished_shards=names, field_counts={TOKENS_FIELD: sum(s.tokens for s in subs)},
                        field_counts_by_shard={n: dict(s.field_counts) for n, s in zip(names, subs)},
                        layout=SHARDED, preprocessor_metadata=meta)
    else:
        raise ValueError(f"layout {layout!r}: {CONSOLIDATED!r} or {SHARDED!r}")
    if stats:
        atomic_write_bytes(root / STATS, json.dumps({"total_tokens": ledger.tokens,
                                                     "total_elements": ledger.total_num_rows}).encode(), root=root)
    if layout == SHARDED:  # the top ledger last: it vouches for sub-caches complete on disk
        atomic_write_bytes(root / LEDGER, render_ledger(ledger), root=root)
    return ledger


class _ArrayWriter:
    """One array written chunk file by chunk file: values fill a one-chunk buffer (allocated once: appending by
    concatenation would copy the buffer at every batch), which is encoded and written when full. With
    ``hold_first`` the first chunk is kept until `finish` (offsets[0] is the row count, known only at the end:
    at most one chunk of int64, 1 GiB at Levanter's grid)."""

    def __init__(self, folder: Path, meta: ArrayMeta, top: Path, *, hold_first: bool = False) -> None:
        self.folder, self.meta, self.top, self.hold_first = folder, meta, top, hold_first
        self.buffer = np.empty(meta.chunk, meta.dtype)  # pages are touched only as values arrive
        self.filled = 0
        self.first: np.ndarray | None = None
        self.k = 0  # the chunk file the buffer belongs to

    def append(self, values: np.ndarray) -> None:
        values = np.asarray(values)
        while len(values):
            n = min(len(values), self.meta.chunk - self.filled)
            self.buffer[self.filled:self.filled + n] = values[:n]  # cast to the array's type as it is copied
            self.filled += n
            values = values[n:]
            if self.filled == self.meta.chunk:
                self._flush()

    def _flush(self) -> None:
        values = self.buffer[:self.filled]
        if self.k == 0 and self.hold_first:
            self.first = values.copy()
        else:
            atomic_write_bytes(self.folder / self.meta.chunk_key(self.k), encode_chunk(values, self.meta),
                               root=self.top)
        self.filled, self.k = 0, self.k + 1

    def finish(self, first_value: int | None = None) -> None:
        if self.filled:
            self._flush()
        if self.first is not None:
            self.first[0] = first_value
            atomic_write_bytes(self.folder / self.meta.chunk_key(0), encode_chunk(self.first, self.meta),
                               root=self.top)
        atomic_write_bytes(self.folder / ZARR_JSON, render_array_meta(self.meta), root=self.top)


class CacheWriter:
    """Write one consolidated cache document batch by document batch, in bounded memory (one chunk of
    tokens and the first chunk of offsets); `close` writes ``zarr.json`` files and the ledger last.

    Args:
        root: the cache root (created). ``top``: the folder atomic writes may not leave (default ``root``).
        data, offsets: the two arrays' specs (`ArrayMeta`; offsets are int64).
        metadata: the ledger's ``preprocessor_metadata``.
        success: also write ``.success`` (a sub-cache of the sharded layout).
    """

    def __init__(self, root: str | os.PathLike, data: ArrayMeta, offsets: ArrayMeta, *,
                 metadata: dict | None = None, top: str | os.PathLike | None = None, success: bool = False) -> None:
        self.root, self.top = Path(root), Path(top or root)
        self.metadata, self.success = metadata, success
        self.data = _ArrayWriter(self.root / DATA_ARRAY, data, self.top)
        self.offsets = _ArrayWriter(self.root / OFFSETS_ARRAY, offsets, self.top, hold_first=True)
        self.offsets.append(np.zeros(1, np.int64))  # offsets[0]: the row count, set by `close`
        self.rows = self.tokens = 0

    def write(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents: ``tokens`` their ids concatenated, ``lengths`` each one's length."""
        lengths = np.asarray(lengths, np.int64)
        if int(lengths.sum()) != len(tokens) or np.any(lengths < 0):
            raise ValueError(f"lengths add up to {int(lengths.sum())}, not the {len(tokens)} tokens given")
        self.data.append(tokens)
        self.offsets.append(self.tokens + np.cumsum(lengths))
        self.rows, self.tokens = self.rows + len(lengths), self.tokens + len(tokens)

    def close(self) -> Ledger:
        """Write what is buffered, the ``zarr.json`` files and the ledger; return the ledger."""
        self.data.finish()
        self.offsets.finish(first_value=self.rows)
        ledger = Ledger(total_num_rows=self.rows, shard_rows={"0": self.rows}, is_finished=True,
                        finished_shards=["0"], field_counts={TOKENS_FIELD: self.tokens},
                        preprocessor_metadata=self.metadata)
        atomic_write_bytes(self.root / LEDGER, render_ledger(ledger), root=self.top)
        if self.success:
            atomic_write_bytes(self.root / SUCCESS, b"", root=self.top)
        return ledger


def _write_part(top: Path, root: Path, documents: Sequence[np.ndarray], data: ArrayMeta, offsets: ArrayMeta,
                meta: dict | None, *, success: bool = False) -> Ledger:
    writer = CacheWriter(root, data, offsets, metadata=meta, top=top, success=success)
    if len(documents):
        writer.write(np.concatenate([np.asarray(d, data.dtype) for d in documents]),
                     np.fromiter((len(d) for d in documents), np.int64, len(documents)))
    return writer.close()
