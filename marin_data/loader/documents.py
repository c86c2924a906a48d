"""A stream's documents by where their tokens lie: which documents a window of a subset's tokens touches, and
where a document's tokens lie (what `marin_data.loader.trace` needs on top of the order).

Positions are tokens of a subset's concatenated stream (`packing.SubsetTokens`), the coordinates the loader
cuts its windows in. Two kinds, by the corpus's format (`documents_of` picks):

- `ParquetDocuments`: only the row groups a window touches are read (ids and token lists, ~1M tokens
  each), found from the shard's footer (each row group's token count), through `open_parquet` from the
  local file or, for a remote corpus, in byte ranges (`StoreFile`), as ``show`` reads them: not the whole
  shard, and unverified (the order itself never depends on them). A footer whose counts do not add up to
  the index's falls back to the loader's own decode of the shard. Finding a document by id reads the ``id``
  column of its subset's shards until it turns up; an id starting with ``SUBSET:`` searches that subset
  first.
- `CellDocuments`: a pinned Levanter cache has no ids: a document is ``SUBSET:ROW``, its row in its cell
  (the ids `marin-data convert` gives such rows too). Its boundaries are its part's offsets, read from the
  pinned ledgers and offsets chunk files alone; no token data is read.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from marin_data.corpus.records import SHARD, ShardRecord
from marin_data.corpus.shard import MAX_ROW_GROUP_BYTES, TOKENS_VALUES
from marin_data.errors import RemoteError, ShardFormatError, UnknownDocumentError, shown
from marin_data.loader.remote.stream import RemoteStream
from marin_data.loader.stream import TokenStream
from marin_data.fileio.parquet_io import decoded_bound, open_parquet
from marin_data.stores import open_store
from marin_data.transfer.remote_corpus import StoreFile

__all__ = ["Document", "ParquetDocuments", "CellDocuments", "documents_of"]

_KEPT = 64  # shards' footers, and row groups' ids and boundaries, kept (a step reads a few per subset)


@dataclass(frozen=True)
class Document:
    """One document a window touches: its id and the first and last of its tokens inside the window, counted
    from the document's first token (both inclusive)."""

    id: str
    first: int
    last: int


def _touching(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> list[int]:
    """The documents ``d`` (``[starts[d], ends[d])``, sorted, back to back) that share a token with ``[lo, hi)``
    (an empty one shares none)."""
    first, stop = int(np.searchsorted(ends, lo, side="right")), int(np.searchsorted(starts, hi, side="left"))
    return [d for d in range(first, stop) if ends[d] > starts[d]]


class ParquetDocuments:
    """The documents of a Parquet corpus's stream (module docstring)."""

    def __init__(self, stream: TokenStream) -> None:
        self.stream = stream
        self._groups: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._read: OrderedDict[tuple[str, int], tuple[np.ndarray, object]] = OrderedDict()
        self._store = None  # a remote corpus's, opened once

    def _file(self, shard: ShardRecord) -> object:
        if isinstance(self.stream, RemoteStream):
            if self._store is None:
                self._store = open_store(self.stream.plan.urls[0], **self.stream.plan.store_options)
            return StoreFile(self._store, shard.path, shard.bytes)
        return str(self.stream.corpus.root / shard.path)

    def groups(self, shard: ShardRecord) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, rows)`` before each row group of ``shard`` and at its end (``[groups + 1]`` int64 each),
        from its footer. A footer whose token counts do not add up to the index's (a list column counts one
        slot for an empty document) is one group: the whole shard, read through the loader's decode."""
        hit = _kept(self._groups, shard.sha256)
        if hit is None:
            with _reading(shard):
                with open_parquet(self._file(shard), pre_buffer=False) as pf:
                    md = pf.metadata
                    leaf = [md.row_group(0).column(j).path_in_schema for j in range(md.num_columns)].index(
                        TOKENS_VALUES) if md.num_row_groups else 0
                    counts = [(md.row_group(g).column(leaf).num_values, md.row_group(g).num_rows)
                              for g in range(md.num_row_groups)]
            tokens, rows = (np.concatenate(([0], np.cumsum(c, dtype=np.int64))) for c in zip(*counts or [(0, 0)]))
            if (tokens[-1], rows[-1]) != (shard.tokens, shard.docs):
                tokens, rows = np.array([0, shard.tokens]), np.array([0, shard.docs])
            hit = _keep(self._groups, shard.sha256, (tokens, rows))
        return hit

    def _group(self, shard: ShardRecord, g: int) -> tuple[np.ndarray, object]:
        """``(offsets [rows + 1] int64, ids)`` of row group ``g`` of ``shard`` (`groups`), token 0 its first."""
        hit = _kept(self._read, (shard.sha256, g))
        if hit is None:
            if len(self.groups(shard)[0]) == 2:  # the whole shard: the loader's decode and the id column
                hit = (np.asarray(self.stream.source.open(shard).offsets), _read_ids(self._file(shard), shard))
            else:
                hit = _read_group(self._file(shard), shard, g)
                tokens, rows = self.groups(shard)
                want = (int(rows[g + 1] - rows[g]), int(tokens[g + 1] - tokens[g]))
                if (len(hit[0]) - 1, int(hit[0][-1]), len(hit[1])) != (*want, want[0]):
                    raise ShardFormatError(f"row group {g} holds {len(hit[1])} documents of {int(hit[0][-1])} "
                                           f"tokens, its footer says {want[0]} of {want[1]}", path=shard.path)
            hit = _keep(self._read, (shard.sha256, g), hit)
        return hit

    def touching(self, s: int, lo: int, hi: int) -> list[Document]:
        """The documents of subset ``s`` that tokens ``[lo, hi)`` of its stream meet, in order."""
        tokens = self.stream.subset_tokens[s]
        cum = tokens.cumulative
        out = []
        for k in range(int(np.searchsorted(cum, lo, side="right")) - 1, int(np.searchsorted(cum, hi, side="left"))):
            shard, base = tokens.shards[k], int(cum[k])
            starts = self.groups(shard)[0]
            for g in _touching(starts[:-1], starts[1:], lo - base, hi - base):
                offsets, ids = self._group(shard, g)
                at = base + int(starts[g])
                for d in _touching(offsets[:-1], offsets[1:], lo - at, hi - at):
                    begin = at + int(offsets[d])
                    out.append(Document(ids[d].as_py(), max(lo, begin) - begin,
                                        min(hi, at + int(offsets[d + 1])) - 1 - begin))
        return out

    def find(self, doc_id: str) -> tuple[int, int, int]:
        """``(subset index, first token, one past its last token)`` of the document ``doc_id`` in its subset's
        stream; subset -1 for a document of a subset the stream does not read (a weight of 0).

        Raises:
            UnknownDocumentError: no subset of the corpus holds a document with that id.
        """
        import pyarrow.compute as pc

        names = self.stream.subsets
        named = [k for k, name in enumerate(names) if doc_id.startswith(name + ":")]
        for s in [*named, *(k for k in range(len(names)) if k not in named)]:
            tokens = self.stream.subset_tokens[s]
            for k, shard in enumerate(tokens.shards):
                d = pc.index(_read_ids(self._file(shard), shard), doc_id).as_py()
                if d >= 0:
                    starts, rows = self.groups(shard)
                    g = int(np.searchsorted(rows, d, side="right")) - 1
                    offsets, _ = self._group(shard, g)
                    at = int(tokens.cumulative[k] + starts[g])
                    return s, at + int(offsets[d - rows[g]]), at + int(offsets[d - rows[g] + 1])
        for shard in self.stream.corpus.shards:
            if shard.subset not in names and shard.kind == SHARD and \
                    pc.index(_read_ids(self._file(shard), shard), doc_id).as_py() >= 0:
                return -1, 0, 0
        raise UnknownDocumentError(f"no document with id {shown(doc_id)} in this corpus", actual=doc_id)


def _kept(kept: OrderedDict, key):
    hit = kept.get(key)
    if hit is not None:
        kept.move_to_end(key)
    return hit


def _keep(kept: OrderedDict, key, value):
    kept[key] = value
    while len(kept) > _KEPT:
        kept.popitem(last=False)
    return value


@contextlib.contextmanager
def _reading(shard: ShardRecord) -> Iterator[None]:
    """pyarrow's and a store's own errors as the shard's `ShardFormatError`."""
    try:
        yield
    except (ShardFormatError, RemoteError):  # already typed (pyarrow passes a store's failure on as is)
        raise
    except (OSError, ValueError, KeyError) as e:  # pyarrow raises ArrowInvalid (a ValueError) on garbage
        raise ShardFormatError(f"not a readable shard: {e}", path=shard.path) from e


def _bounded(pf, group: int, columns: tuple[str, ...], shard: ShardRecord) -> None:
    bound = decoded_bound(pf.metadata, columns, row_groups=[group])
    if bound > MAX_ROW_GROUP_BYTES:
        raise ShardFormatError(f"row group {group} may decode to {bound:,} bytes, over the "
                               f"{MAX_ROW_GROUP_BYTES:,} a row group may take", path=shard.path)


def _read_group(source: object, shard: ShardRecord, g: int) -> tuple[np.ndarray, object]:
    """Row group ``g``'s document offsets (from its ``tokens`` lists) and ids, its size bounded first."""
    with _reading(shard), open_parquet(source, pre_buffer=False) as pf:
        _bounded(pf, g, ("id", "tokens"), shard)
        table = pf.read_row_group(g, columns=["id", "tokens"])
    column = table.column("tokens").combine_chunks()
    offsets = np.asarray(column.offsets, dtype=np.int64)
    return offsets - offsets[0], table.column("id").combine_chunks()


def _read_ids(source: object, shard: ShardRecord):
    """The ``id`` column of a shard (a pyarrow string array), each row group bounded before it is decoded.

    Raises:
        ShardFormatError: unreadable, a row group over its bound, or another number of ids than the index says.
    """
    import pyarrow as pa

    with _reading(shard), open_parquet(source, pre_buffer=False) as pf:
        parts = []
        for group in range(pf.num_row_groups):
            _bounded(pf, group, ("id",), shard)
            parts.append(pf.read_row_group(group, columns=["id"]).column("id"))
    ids = pa.chunked_array(parts, pa.string()).combine_chunks() if parts else pa.array([], pa.string())
    if len(ids) != shard.docs:
        raise ShardFormatError(f"holds {len(ids)} ids, the index says {shard.docs} documents", path=shard.path,
                               expected=shard.docs, actual=len(ids))
    return ids


@dataclass(frozen=True)
class _Part:
    """One part of a cell: its rows and tokens start at these in the cell (and in its subset's stream)."""

    part: object  # marin_data.levanter.cache.CachePart
    row: int
    token: int


class CellDocuments:
    """The documents of a pinned Levanter cache's stream: ``SUBSET:ROW`` (module docstring)."""

    def __init__(self, stream: TokenStream) -> None:
        self.stream = stream
        self._parts: dict[int, list[_Part]] = {}

    def parts(self, s: int) -> list[_Part]:
        hit = self._parts.get(s)
        if hit is None:
            hit, row, token = [], 0, 0
            for part in self.stream.decoder.cache(self.stream.subsets[s]).parts:
                hit.append(_Part(part, row, token))
                row, token = row + part.rows, token + part.tokens
            self._parts[s] = hit
        return hit

    def _ends(self, s: int, part: _Part) -> np.ndarray:
        return np.asarray(self.stream.decoder.ends(self.stream.subsets[s], part.part), dtype=np.int64)

    def touching(self, s: int, lo: int, hi: int) -> list[Document]:
        """As `ParquetDocuments.touching`."""
        name, out = self.stream.subsets[s], []
        for p in self.parts(s):
            if p.token >= hi or p.token + p.part.tokens <= lo:
                continue
            ends = self._ends(s, p)
            starts = np.concatenate(([0], ends[:-1]))
            for d in _touching(starts, ends, lo - p.token, hi - p.token):
                begin = p.token + int(starts[d])
                out.append(Document(f"{name}:{p.row + d}", max(lo, begin) - begin,
                                    min(hi, p.token + int(ends[d])) - 1 - begin))
        return out

    def find(self, doc_id: str) -> tuple[int, int, int]:
        """As `ParquetDocuments.find`, for an id ``SUBSET:ROW``."""
        name, _, row = doc_id.rpartition(":")
        if name not in self.stream.corpus.manifest.subsets or not row.isdigit():
            raise UnknownDocumentError(f"a pinned cache's documents are SUBSET:ROW of one of its subsets, not "
                                       f"{shown(doc_id)}", actual=doc_id)
        if name not in self.stream.subsets:
            return -1, 0, 0
        s, row = self.stream.subsets.index(name), int(row)
        for p in self.parts(s):
            if p.row <= row < p.row + p.part.rows:
                ends = self._ends(s, p)
                d = row - p.row
                return s, p.token + (int(ends[d - 1]) if d else 0), p.token + int(ends[d])
        raise UnknownDocumentError(f"subset {name!r} has {sum(p.part.rows for p in self.parts(s)):,} rows, no row "
                                   f"{row:,}", actual=doc_id)


def documents_of(stream: TokenStream) -> ParquetDocuments | CellDocuments:
    """The documents of ``stream``'s corpus: a pinned cache's cells, or Parquet shards."""
    return CellDocuments(stream) if stream.decoder.pieces else ParquetDocuments(stream)
