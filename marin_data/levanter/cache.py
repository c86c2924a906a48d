"""A Levanter cache opened for reading: its ledger, its parts, the chunk files of its arrays, and their
values, decoded from bytes read through a store.

A cache root holds ``shard_ledger.json`` and, in the ``consolidated`` layout, the Zarr arrays
``input_ids/offsets`` (int64: ``[0]`` = rows, ``[i+1]`` = end of row i in the flat tokens) and
``input_ids/data`` (the flat tokens). In the ``sharded`` layout the rows live in sub-caches (each a
consolidated cache with its own ledger and a ``.success`` marker) that the top ledger names in row order.
Either way a cache is a list of `CachePart`s whose tokens, concatenated, are the cache's flat token array.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from marin_data.corpus.names import safe_relpath
from marin_data.errors import CacheFormatError, CacheUnfinishedError, UnsafePathError
from marin_data.levanter.arraymeta import ZARR_JSON, ArrayMeta, parse_array_meta
from marin_data.levanter.chunkfile import decode_chunk
from marin_data.levanter.jsonio import MAX_JSON_BYTES
from marin_data.levanter.ledger import LEDGER, SHARDED, SUCCESS, TOKENS_FIELD, Ledger, parse_ledger
from marin_data.transfer.read import join, read_file
from marin_data.stores.base import Store

__all__ = ["DATA_ARRAY", "OFFSETS_ARRAY", "CachePart", "ChunkFile", "ChunkFiles", "LevanterCache", "open_cache",
           "max_chunk_file_bytes", "chunk_documents"]

DATA_ARRAY = f"{TOKENS_FIELD}/data"
OFFSETS_ARRAY = f"{TOKENS_FIELD}/offsets"


@dataclass(frozen=True)
class ChunkFile:
    """One chunk file of an array: elements ``[start, stop)`` of it (``stop - start`` are stored values)."""

    path: str  # relative to the store's root
    index: int  # k of ``c/<k>``
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class CachePart:
    """One consolidated cache: the root itself, or one sub-cache of the sharded layout."""

    prefix: str  # its folder relative to the store's root ("" for the root)
    ledger: Ledger
    data: ArrayMeta
    offsets: ArrayMeta
    has_success: bool  # a `.success` marker beside its ledger

    @property
    def rows(self) -> int:
        return self.ledger.total_num_rows

    @property
    def tokens(self) -> int:
        return self.ledger.tokens or 0

    def data_chunks(self) -> ChunkFiles:
        """The chunk files that hold its ``tokens`` values, in order."""
        return ChunkFiles(join(self.prefix, DATA_ARRAY), self.data, self.tokens)

    def offsets_chunks(self) -> ChunkFiles:
        """The chunk files of its offsets array: ``rows + 1`` values."""
        return ChunkFiles(join(self.prefix, OFFSETS_ARRAY), self.offsets, self.rows + 1)


class ChunkFiles(Sequence):
    """The chunk files of an array of ``n`` values, made as they are asked for: a query that reads a few of
    them (`marin_data.levanter.order`) costs nothing for the ones it skips, whatever count a ledger claims."""

    def __init__(self, array: str, meta: ArrayMeta, n: int) -> None:
        self.array, self.meta, self.n = array, meta, n

    def __len__(self) -> int:
        return -(-self.n // self.meta.chunk)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        k = range(len(self))[k]  # negative indices, and IndexError past the end
        return ChunkFile(join(self.array, self.meta.chunk_key(k)), k, k * self.meta.chunk,
                         min(self.n, (k + 1) * self.meta.chunk))


def max_chunk_file_bytes(meta: ArrayMeta) -> int:
    """The most bytes a well-formed chunk file of ``meta`` can have (blosc adds at most 16 bytes a frame)."""
    return meta.inner_per_chunk * (meta.inner * meta.itemsize + 16) + meta.index_bytes


@dataclass(frozen=True)
class LevanterCache:
    """A cache root on a store: its top ledger and its parts in row order."""

    store: Store
    prefix: str
    ledger: Ledger
    parts: tuple[CachePart, ...]

    @property
    def rows(self) -> int:
        return self.ledger.total_num_rows

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.parts)

    @property
    def dtype(self) -> str:
        return self.parts[0].data.dtype if self.parts else "int32"

    @property
    def codec(self) -> str:
        """Its token array's codec (`ArrayMeta.codec`; ``raw`` for a cache without parts)."""
        return self.parts[0].data.codec if self.parts else "raw"

    def where(self, path: str) -> str:
        return self.store.describe(path)

    def read_chunk(self, chunk: ChunkFile, meta: ArrayMeta) -> np.ndarray:
        """The ``chunk.count`` values of one chunk file (a missing file is a `CacheFormatError`)."""
        data = read_file(self.store, chunk.path, limit=max_chunk_file_bytes(meta))
        if data is None:
            raise CacheFormatError("chunk file missing (Levanter would read zeros in its place)",
                                   path=self.where(chunk.path))
        return decode_chunk(data, meta, chunk.count, self.where(chunk.path))

    def document_ends(self, part: CachePart) -> np.ndarray:
        """``[rows]`` int64: where each of ``part``'s rows ends in its flat tokens (``offsets[1:]``)."""
        values = [self.read_chunk(c, part.offsets) for c in part.offsets_chunks()]
        return np.concatenate(values)[1:]

    def iter_tokens(self, part: CachePart) -> Iterator[tuple[ChunkFile, np.ndarray]]:
        """``part``'s tokens chunk file by chunk file."""
        for chunk in part.data_chunks():
            yield chunk, self.read_chunk(chunk, part.data)


def chunk_documents(tokens: np.ndarray, ends: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """One data chunk file in the loader's local form: ``tokens`` (``[N]``, the first at flat position
    ``start``) as uint32, and ``offsets`` (int64, ``[pieces + 1]``): 0, every document end strictly inside
    the chunk, N. A document crossing a chunk boundary is two pieces, the head ending this chunk and the
    tail opening the next; ``ends`` are the part's document ends (`LevanterCache.document_ends`)."""
    stop = start + len(tokens)
    inside = ends[np.searchsorted(ends, start, "right"):np.searchsorted(ends, stop, "left")] - start
    return tokens.astype(np.uint32, copy=False), np.concatenate([[0], inside, [len(tokens)]]).astype(np.int64)


def _read_json(store: Store, path: str, parse, *, missing: str):
    data = read_file(store, path, limit=MAX_JSON_BYTES)
    if data is None:
        raise CacheFormatError(missing, path=store.describe(path))
    return parse(data, store.describe(path))


def _open_part(store: Store, prefix: str, ledger: Ledger, listed: bool) -> CachePart:
    if TOKENS_FIELD not in ledger.field_counts and ledger.total_num_rows:
        raise CacheFormatError(f"the ledger counts no {TOKENS_FIELD!r} field (it has "
                               f"{', '.join(ledger.field_counts) or 'none'}): not a token cache Marin reads",
                               path=store.describe(join(prefix, LEDGER)))
    metas = [_read_json(store, join(prefix, f"{a}/{ZARR_JSON}"), parse_array_meta,
                        missing=f"{ZARR_JSON} missing behind the ledger: the array cannot be read")
             for a in (DATA_ARRAY, OFFSETS_ARRAY)]
    success = store.head(join(prefix, SUCCESS)) is not None
    part = CachePart(prefix, ledger, metas[0], metas[1], success)
    _check_counts(store, part, listed)
    return part


def _check_counts(store: Store, part: CachePart, listed: bool) -> None:
    """Refuse a ledger whose counts its arrays cannot hold, before anything sizes a list by them: more values
    than a ``zarr.json`` shape declares, or more chunk files than the store lists (so a ledger claiming 10^15
    tokens costs one listing of the part's arrays, never a Python object per claimed chunk file)."""
    arrays = ((DATA_ARRAY, part.data, part.tokens, "tokens"), (OFFSETS_ARRAY, part.offsets, part.rows + 1,
                                                               "offsets (rows + 1)"))
    for array, meta, n, what in arrays:
        if n > meta.shape:
            raise CacheFormatError(f"the ledger counts {n:,} {what}, more than the array's shape {meta.shape:,}",
                                   path=store.describe(join(part.prefix, f"{array}/{ZARR_JSON}")), expected=n,
                                   actual=meta.shape)
    if not listed:
        return
    base = join(part.prefix, TOKENS_FIELD)
    listed = [o.path[len(base) + 1:] for o in store.list(base) if o.path.startswith(base + "/")]
    for array, meta, n, what in arrays:
        need = -(-n // meta.chunk)
        have = sorted(k for k in _chunk_keys(listed, array[len(TOKENS_FIELD) + 1:], meta) if k < need)
        if len(have) < need:
            first = next((i for i, k in enumerate(have) if i != k), len(have))
            raise CacheFormatError(f"chunk file missing (Levanter would read zeros in its place): the ledger counts "
                                   f"{n:,} {what}, {need:,} chunk files of {meta.chunk:,}, and "
                                   f"{need - len(have):,} of them are not there",
                                   path=store.describe(join(part.prefix, f"{array}/{meta.chunk_key(first)}")),
                                   expected=need, actual=len(have))


def _chunk_keys(listed: list[str], name: str, meta: ArrayMeta) -> set[int]:
    """The ``k`` of every chunk file ``name/c<sep><k>`` among ``listed`` (paths below the part's field)."""
    head = f"{name}/{meta.chunk_key('')}"
    digits = (p[len(head):] for p in listed if p.startswith(head))
    return {int(d) for d in digits if 0 < len(d) <= 19 and d.isdigit() and d.isascii() and str(int(d)) == d}


def open_cache(store: Store, prefix: str = "", *, require_finished: bool = True, listed: bool = True) -> LevanterCache:
    """Open the cache whose root is ``prefix`` on ``store``: its ledgers and ``zarr.json`` files (no data), and
    (``listed``) one listing of each part's arrays. Without the listing, a ledger's counts are bounded by the
    ``zarr.json`` shapes alone: for callers that read a few chunk files by position (`ChunkFiles`), never all.

    Raises:
        CacheFormatError: a ledger or ``zarr.json`` missing, malformed or of an unsupported form; a ledger
            counting more than a ``zarr.json`` shape, or chunk files the store does not list (the first named).
        CacheUnfinishedError: (with ``require_finished``) a ledger not finished.
        UnsafePathError: a sharded ledger naming a sub-cache outside the cache.
    """
    prefix = prefix.strip("/")
    ledger = _read_json(store, join(prefix, LEDGER), parse_ledger, missing=f"no {LEDGER}: not a Levanter cache")
    if require_finished and not ledger.is_finished:
        raise CacheUnfinishedError("the ledger says is_finished: false", path=store.describe(join(prefix, LEDGER)))
    if ledger.layout != SHARDED:
        return LevanterCache(store, prefix, ledger, (_open_part(store, prefix, ledger, listed),))
    parts = []
    for name in ledger.finished_shards:
        try:
            rel = safe_relpath(name, where=store.describe(join(prefix, LEDGER)))
        except UnsafePathError as e:
            raise CacheFormatError(f"finished_shards names {name!r}, which is not a folder inside the cache",
                                   path=e.path, actual=name) from e
        sub = join(prefix, rel)
        sub_ledger = _read_json(store, join(sub, LEDGER), parse_ledger, missing=f"no {LEDGER} in sub-cache {rel}")
        if require_finished and not sub_ledger.is_finished:
            raise CacheUnfinishedError("the sub-cache's ledger says is_finished: false",
                                       path=store.describe(join(sub, LEDGER)))
        parts.append(_open_part(store, sub, sub_ledger, listed))
    return LevanterCache(store, prefix, ledger, tuple(parts))
