"""Writing Levanter caches with Levanter's exact array specs (`marin_data.levanter.arraymeta`): what the
tests build caches with, and what converting a corpus to caches is a thin layer over.

`write_cache` writes one cache root from documents (arrays of token ids) in either layout: ``consolidated``
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

from marin_data.atomic import atomic_write_bytes
from marin_data.levanter.arraymeta import LEVANTER_CHUNK, LEVANTER_INNER, LZ4, ZARR_JSON, ArrayMeta, Blosc, \
    render_array_meta
from marin_data.levanter.cache import DATA_ARRAY, OFFSETS_ARRAY
from marin_data.levanter.chunkfile import encode_chunk
from marin_data.levanter.ledger import CONSOLIDATED, LEDGER, SHARDED, STATS, SUCCESS, TOKENS_FIELD, Ledger, \
    render_ledger

__all__ = ["part_name", "write_cache"]


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
    atomic_write_bytes(root / LEDGER, render_ledger(ledger), root=root)
    return ledger


def _write_part(top: Path, root: Path, documents: Sequence[np.ndarray], data: ArrayMeta, offsets: ArrayMeta,
                meta: dict | None, *, success: bool = False) -> Ledger:
    lengths = np.fromiter((len(d) for d in documents), np.int64, len(documents))
    values = np.concatenate([[len(documents)], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate([np.asarray(d, data.dtype) for d in documents]) if len(documents) else \
        np.zeros(0, data.dtype)
    for array, meta_, flat in ((DATA_ARRAY, data, tokens), (OFFSETS_ARRAY, offsets, values)):
        atomic_write_bytes(root / array / ZARR_JSON, render_array_meta(meta_), root=top)
        for k in range(-(-len(flat) // meta_.chunk)):
            atomic_write_bytes(root / array / meta_.chunk_key(k),
                               encode_chunk(flat[k * meta_.chunk:(k + 1) * meta_.chunk], meta_), root=top)
    ledger = Ledger(total_num_rows=len(documents), shard_rows={"0": len(documents)}, is_finished=True,
                    finished_shards=["0"], field_counts={TOKENS_FIELD: int(lengths.sum())},
                    preprocessor_metadata=meta)
    if root != top:
        atomic_write_bytes(root / LEDGER, render_ledger(ledger), root=top)
    if success:
        atomic_write_bytes(root / SUCCESS, b"", root=top)
    return ledger
