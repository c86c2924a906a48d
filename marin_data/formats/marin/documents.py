"""A Parquet corpus's documents by where their tokens lie (`marin_data.formats.documents`), for the loader's
trace: only the row groups a window touches are read (ids and token lists, ~1M tokens each), found from the
shard's footer (each row group's token count), through `open_parquet` from the local file or, for a remote
corpus, in byte ranges (`StoreFile`), as ``show`` reads them: not the whole shard, and unverified (the order
itself never depends on them). A footer whose counts do not add up to the index's falls back to the loader's
own decode of the shard. Finding a document by id reads the ``id`` column of its subset's shards until it
turns up; an id starting with ``SUBSET:`` searches that subset first.

The stream is the loader's ``TokenStream``, read by duck typing (this stage comes before the loader): its
``subsets``, ``subset_tokens``, ``corpus`` and ``source`` (the decoded shards), and ``shard_files()`` (where a
shard's bytes are read from at random: a local path, or ranges of a store).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from marin_data.corpus.records import SHARD, ShardRecord
from marin_data.corpus.shard import MAX_ROW_GROUP_BYTES, TOKENS_VALUES
from marin_data.errors import RemoteError, ShardFormatError, UnknownDocumentError, shown
from marin_data.fileio.parquet_io import decoded_bound, open_parquet
from marin_data.formats.documents import Document, touching

__all__ = ["ParquetDocuments"]

_KEPT = 64  # shards' footers, and row groups' ids and boundaries, kept (a step reads a few per subset)


class ParquetDocuments:
    """The documents of a Parquet corpus's stream (module docstring); ``files``: a shard's bytes to read at
    random (the stream's ``shard_files()``)."""

    def __init__(self, stream: Any, files: Callable[[ShardRecord], object]) -> None:
        self.stream = stream
        self._file = files
        self._groups: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._read: OrderedDict[tuple[str, int], tuple[np.ndarray, object]] = OrderedDict()

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
            for g in touching(starts[:-1], starts[1:], lo - base, hi - base):
                offsets, ids = self._group(shard, g)
                at = base + int(starts[g])
                for d in touching(offsets[:-1], offsets[1:], lo - at, hi - at):
                    begin = at + int(offsets[d])
                    out.append(Document(ids[d].as_py(), max(lo, begin) - begin,
                                        min(hi, at + int(offsets[d + 1])) - 1 - begin))
        return out

    def find(self, doc_id: str) -> tuple[int, int, int]:
        """As `marin_data.formats.documents.Documents.find`."""
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
