"""A stream's documents by where their tokens lie: which documents a window of a subset's tokens touches, and
where a document's tokens lie (what `marin_data.loader.trace` needs on top of the order).

Positions are tokens of a subset's concatenated stream (`packing.SubsetTokens`), the coordinates the loader
cuts its windows in. Two kinds, by the corpus's format (`documents_of` picks):

- `ParquetDocuments`: a shard's document boundaries are the loader's own decode of it (its ``offsets``,
  through the stream's shard source: a local decode, or the remote shard cache), and its ids the ``id``
  column, read through `open_parquet` from the local file or, for a remote corpus, in byte ranges
  (`StoreFile`). Finding a document by id reads the ``id`` column of its subset's shards until it turns up;
  an id starting with ``SUBSET:`` searches that subset first.
- `CellDocuments`: a pinned Levanter cache has no ids: a document is ``SUBSET:ROW``, its row in its cell
  (the ids `marin-data convert` gives such rows too). Its boundaries are its part's offsets, read from the
  pinned ledgers and offsets chunk files alone; no token data is read.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from marin_data.corpus.records import SHARD, ShardRecord
from marin_data.corpus.shard import MAX_ROW_GROUP_BYTES
from marin_data.errors import ShardFormatError, UnknownDocumentError, shown
from marin_data.loader.remote.stream import RemoteStream
from marin_data.loader.stream import TokenStream
from marin_data.parquet_io import decoded_bound, open_parquet
from marin_data.stores import open_store
from marin_data.transfer.remote_corpus import StoreFile

__all__ = ["Document", "ParquetDocuments", "CellDocuments", "documents_of"]

_KEPT = 8  # shards whose ids and boundaries are kept (a step's windows come from a few shards per subset)


@dataclass(frozen=True)
class Document:
    """One document a window touches: its id and the first and last of its tokens inside the window, counted
    from the document's first token (both inclusive)."""

    id: str
    first: int
    last: int


def _touching(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> range:
    """The documents ``d`` (``[starts[d], ends[d])``, sorted, back to back) that meet ``[lo, hi)``."""
    return range(int(np.searchsorted(ends, lo, side="right")), int(np.searchsorted(starts, hi, side="left")))


class ParquetDocuments:
    """The documents of a Parquet corpus's stream (module docstring)."""

    def __init__(self, stream: TokenStream) -> None:
        self.stream = stream
        self._kept: OrderedDict[str, tuple[np.ndarray, object]] = OrderedDict()

    def _file(self, shard: ShardRecord) -> object:
        if isinstance(self.stream, RemoteStream):
            plan = self.stream.plan
            return StoreFile(open_store(plan.urls[0], **plan.store_options), shard.path, shard.bytes)
        return str(self.stream.corpus.root / shard.path)

    def _shard(self, shard: ShardRecord) -> tuple[np.ndarray, object]:
        """``(offsets [docs + 1] int64, ids)`` of a shard: its document boundaries and its ``id`` column."""
        hit = self._kept.get(shard.sha256)
        if hit is None:
            hit = (np.asarray(self.stream.source.open(shard).offsets), _read_ids(self._file(shard), shard))
            self._kept[shard.sha256] = hit
            while len(self._kept) > _KEPT:
                self._kept.popitem(last=False)
        self._kept.move_to_end(shard.sha256)
        return hit

    def touching(self, s: int, lo: int, hi: int) -> list[Document]:
        """The documents of subset ``s`` that tokens ``[lo, hi)`` of its stream meet, in order."""
        tokens = self.stream.subset_tokens[s]
        cum = tokens.cumulative
        out = []
        for k in range(int(np.searchsorted(cum, lo, side="right")) - 1, int(np.searchsorted(cum, hi, side="left"))):
            offsets, ids = self._shard(tokens.shards[k])
            base = int(cum[k])
            for d in _touching(offsets[:-1], offsets[1:], lo - base, hi - base):
                begin = base + int(offsets[d])
                out.append(Document(ids[d].as_py(), max(lo, begin) - begin,
                                    min(hi, base + int(offsets[d + 1])) - 1 - begin))
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
                    offsets, _ = self._shard(shard)
                    base = int(tokens.cumulative[k])
                    return s, base + int(offsets[d]), base + int(offsets[d + 1])
        for shard in self.stream.corpus.shards:
            if shard.subset not in names and shard.kind == SHARD and \
                    pc.index(_read_ids(self._file(shard), shard), doc_id).as_py() >= 0:
                return -1, 0, 0
        raise UnknownDocumentError(f"no document with id {shown(doc_id)} in this corpus", actual=doc_id)


def _read_ids(source: object, shard: ShardRecord):
    """The ``id`` column of a shard (a pyarrow string array), each row group bounded before it is decoded.

    Raises:
        ShardFormatError: unreadable, a row group over its bound, or another number of ids than the index says.
    """
    import pyarrow as pa

    try:
        with open_parquet(source, pre_buffer=False) as pf:
            parts = []
            for group in range(pf.num_row_groups):
                bound = decoded_bound(pf.metadata, ("id",), row_groups=[group])
                if bound > MAX_ROW_GROUP_BYTES:
                    raise ShardFormatError(f"row group {group}'s ids may decode to {bound:,} bytes, over the "
                                           f"{MAX_ROW_GROUP_BYTES:,} a row group may take", path=shard.path)
                parts.append(pf.read_row_group(group, columns=["id"]).column("id"))
    except ShardFormatError:
        raise
    except (OSError, ValueError, KeyError) as e:  # pyarrow raises ArrowInvalid (a ValueError) on garbage
        raise ShardFormatError(f"not a readable shard: {e}", path=shard.path) from e
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
            for part in self.stream.cells.cache(self.stream.subsets[s]).parts:
                hit.append(_Part(part, row, token))
                row, token = row + part.rows, token + part.tokens
            self._parts[s] = hit
        return hit

    def _ends(self, s: int, part: _Part) -> np.ndarray:
        return np.asarray(self.stream.cells.ends(self.stream.subsets[s], part.part), dtype=np.int64)

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
    return CellDocuments(stream) if stream.cells is not None else ParquetDocuments(stream)
