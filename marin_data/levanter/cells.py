"""A pinned cache's cells as the loader reads them: each subset's data chunk files in the order of its flat
tokens, and each one decoded, from the very bytes that were hashed, into the loader's local form.

The loader knows a shard only as a row of the index. For a pinned cache (`marin_data.levanter.adopt`) that
row is a data chunk file, and decoding it needs its array's ``zarr.json``, where it starts in its part and
the part's document ends (its offsets chunk files). `PinnedCells` opens a cell when it is first asked for,
reading its ledgers and ``zarr.json`` files through ``read`` (which returns a row's bytes only once they
match its sha256: local disk or a store, the caller's choice), and checks that the index lists exactly the
cache's data and offsets chunk files, with their token counts. A part's document ends are decoded once and
kept in memory, the least recently used part dropped first past ``ends_bytes``.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marin_data.corpus.manifest import Corpus
from marin_data.corpus.records import OFFSETS, SHARD, ShardRecord
from marin_data.corpus.readers import read_checked
from marin_data.errors import CacheFormatError, InvalidManifestError, RemoteError, ShardFormatError
from marin_data.fileio.arrays import write_npy
from marin_data.fileio.parquet_io import ArrowBytes
from marin_data.formats.base import Reader
from marin_data.levanter.arraymeta import ZARR_JSON
from marin_data.levanter.cache import DATA_ARRAY, OFFSETS_ARRAY, CachePart, ChunkFile, LevanterCache, \
    chunk_documents, open_cache
from marin_data.levanter.cell_documents import CellDocuments
from marin_data.levanter.chunkfile import decode_chunk
from marin_data.levanter.ledger import LEDGER
from marin_data.levanter.pinned import cell_prefixes
from marin_data.transfer.read import join
from marin_data.stores.base import ObjectInfo, ReadStream, Store

__all__ = ["PinnedCells", "DEFAULT_ENDS_BYTES"]

DEFAULT_ENDS_BYTES = 1 << 30  # document ends kept decoded: 8 bytes a document, ~134M documents
_UINT32 = 2 ** 32


@dataclass(frozen=True)
class _Chunk:
    """What decoding one data chunk file needs besides its bytes."""

    subset: str
    part: CachePart
    chunk: ChunkFile
    context: str  # digest of everything but the file's own bytes that its decode depends on


class PinnedCells:
    """The cells of a pinned cache (``corpus.manifest.format`` a Levanter one), opened as they are needed: the
    loader's shard decoder of such a corpus (`marin_data.formats.ShardDecoder`; its shards decode to ``pieces``
    of documents, cut at the chunk file's ends).

    Args:
        corpus: the pinned corpus (its manifest and index; the files may be elsewhere: ``read`` fetches).
        read: the checked bytes of a row (`Reader`).
        ends_bytes: bound on the document ends kept decoded in this process.
    """

    pieces = True

    def __init__(self, corpus: Corpus, read: Reader, *, ends_bytes: int = DEFAULT_ENDS_BYTES) -> None:
        self.corpus = corpus
        self.read = read
        self.ends_bytes = ends_bytes
        self._prefixes = cell_prefixes(corpus.manifest)
        self._rows: dict[str, dict[str, ShardRecord]] = {s: {} for s in self._prefixes}  # subset -> path -> row
        for row in corpus.shards:
            self._rows.setdefault(row.subset, {})[row.path] = row
        self._caches: dict[str, LevanterCache] = {}
        self._chunks: dict[str, _Chunk] = {}  # data chunk path -> what decoding it needs
        self._by_sha: dict[str, str] = {}  # data chunk sha256 -> its context (`context`)
        self._ends: OrderedDict[str, np.ndarray] = OrderedDict()  # part prefix -> its document ends
        self._lock = threading.Lock()  # the loader may decode on several threads
        self._reading: dict[str, threading.Lock] = {}  # part prefix -> held while its ends are read

    def __getstate__(self) -> dict:  # DataLoader workers: the layout travels, the decoded ends do not
        return {**self.__dict__, "_ends": OrderedDict(), "_lock": None, "_reading": {}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def chunks(self, subset: str) -> tuple[ShardRecord, ...]:
        """``subset``'s data chunk files (rows of the index) in the order of its flat tokens: its parts in
        ledger order, each part's chunk files by index.

        Raises:
            InvalidManifestError: the index and the cache's ledgers disagree on its chunk files or tokens.
            CacheFormatError, ShardChecksumError, ShardMissingError: a ledger or ``zarr.json`` is unreadable,
                modified or missing.
        """
        cache = self._open(subset)
        rows = {p: r for p, r in self._rows[subset].items() if r.kind in (SHARD, OFFSETS)}  # each claimed once
        out = []
        for part in cache.parts:
            for chunk in part.data_chunks():
                row = self._listed(rows, chunk, SHARD, subset)
                if row.tokens != chunk.count:
                    raise InvalidManifestError(f"the shard index gives {row.path} {row.tokens} tokens, its cache's "
                                               f"ledger {chunk.count}", path=row.path, expected=chunk.count,
                                               actual=row.tokens)
                out.append(row)
                self._remember(row, _Chunk(subset, part, chunk, self._context(subset, part, chunk)))
            for chunk in part.offsets_chunks():
                self._listed(rows, chunk, OFFSETS, subset)
        if rows:
            extra = sorted(rows)
            raise InvalidManifestError(f"the shard index lists {len(extra)} chunk files of subset {subset!r} that "
                                       f"its cache's ledgers do not ({', '.join(extra[:3])})", path=extra[0])
        return tuple(out)

    def chunks_of(self, subsets: Sequence[str], *, workers: int = 16) -> list[tuple[ShardRecord, ...]]:
        """`chunks` of each of ``subsets``, their cells opened ``workers`` at a time: opening one reads about
        four small files per part, which over a store is round trips, not work."""
        if len(subsets) <= 1:
            return [self.chunks(s) for s in subsets]
        with ThreadPoolExecutor(max_workers=min(workers, len(subsets)), thread_name_prefix="marin-cells") as pool:
            return list(pool.map(self.chunks, subsets))

    def context(self, shard: ShardRecord) -> str:
        """What a data chunk file's decode depends on besides its bytes (its place in its part, its part's
        ledger, ``zarr.json`` files and offsets chunk files), as a digest: a decode sealed for one context is
        never served for another."""
        return self._chunk(shard).context

    def decode(self, shard: ShardRecord, data: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
        """A data chunk file's ``(tokens [N] uint32, offsets [pieces + 1] int64)`` (`chunk_documents`) from
        its bytes, which the caller has checked against ``shard.sha256``.

        Raises:
            CacheFormatError: the file does not decode, or holds token ids outside uint32.
        """
        c = self._chunk(shard)
        where = f"{self.corpus.root}/{shard.path}"
        values = decode_chunk(data, c.part.data, c.chunk.count, where)
        if values.size and (values.min() < 0 or (values.dtype.itemsize > 4 and values.max() >= _UINT32)):
            raise CacheFormatError(f"token ids from {values.min()} to {values.max()}: outside the loader's uint32",
                                   path=where, actual=(int(values.min()), int(values.max())))
        return chunk_documents(values.view(np.uint32) if values.dtype.itemsize == 4 else values,
                               self.ends(c.subset, c.part), c.chunk.start)

    def order(self, subsets: Sequence[str]) -> list[tuple[ShardRecord, ...]]:
        """`chunks_of`: each cell's data chunk files in the order of its flat tokens (the loader's
        `marin_data.formats.ShardDecoder`)."""
        return self.chunks_of(subsets)

    def decode_into(self, source: Path | ArrowBytes, shard: ShardRecord, tokens_path: Path, offsets_path: Path, *,
                    verify: bool) -> None:
        """Decode the data chunk file at ``source`` (or its bytes, checked as they were fetched) into ``.npy``
        files, from the bytes that were hashed.

        Raises:
            ShardMissingError, ShardChecksumError: as `read_checked`.
            CacheFormatError: the file does not decode (`decode`).
            ShardFormatError: it holds another number of tokens than the index says.
        """
        body = isinstance(source, ArrowBytes)
        tokens, offsets = self.decode(shard, source.view if body else read_checked(source, shard, verify=verify))
        if len(tokens) != shard.tokens:
            raise ShardFormatError(f"decodes to {len(tokens)} tokens, the index says {shard.tokens}",
                                   path=shard.path if body else str(source),
                                   expected=shard.tokens, actual=len(tokens))
        for out, array in ((tokens_path, tokens), (offsets_path, offsets)):
            write_npy(out, array.dtype, len(array), [np.ascontiguousarray(array)])

    def documents(self, stream: Any) -> CellDocuments:
        """Where ``stream``'s documents (``SUBSET:ROW``) lie: its cells' offsets."""
        return CellDocuments(stream, self)

    def cache(self, subset: str) -> LevanterCache:
        """``subset``'s cache as its ledgers and ``zarr.json`` files (read through ``read``) describe it."""
        return self._open(subset)

    def values(self, subset: str, part: CachePart, chunk: ChunkFile) -> np.ndarray:
        """The values of one chunk file of ``subset``'s ``part``, read through ``read`` (checked) and decoded."""
        with _unwrapped():
            return self._open(subset).read_chunk(chunk, part.data)

    def ends(self, subset: str, part: CachePart) -> np.ndarray:
        """Where each row of ``subset``'s ``part`` ends (`LevanterCache.document_ends`), decoded once and kept."""
        with self._lock:
            reading = self._reading.setdefault(part.prefix, threading.Lock())
        with reading:  # one thread reads a part's offsets; the others decoding its chunk files wait for it
            with self._lock:
                ends = self._ends.get(part.prefix)
                if ends is not None:
                    self._ends.move_to_end(part.prefix)
                    return ends
            with _unwrapped():
                ends = self._open(subset).document_ends(part)
            with self._lock:
                self._ends[part.prefix] = ends
                while len(self._ends) > 1 and sum(e.nbytes for e in self._ends.values()) > self.ends_bytes:
                    self._ends.popitem(last=False)
        return ends

    # --- opening cells ---------------------------------------------------------------------------------
    def _open(self, subset: str) -> LevanterCache:
        with self._lock:
            cache = self._caches.get(subset)
        if cache is None:
            if subset not in self._prefixes:
                raise InvalidManifestError(f"no subset {subset!r} in this pinned cache", path=str(self.corpus.root))
            with _unwrapped():
                cache = open_cache(_IndexedFiles(self._rows[subset], self.read, str(self.corpus.root)),
                                   self._prefixes[subset])
            with self._lock:
                self._caches[subset] = cache
        return cache

    @staticmethod
    def _listed(rows: dict[str, ShardRecord], chunk: ChunkFile, kind: str, subset: str) -> ShardRecord:
        row = rows.pop(chunk.path, None)
        if row is None or row.kind != kind:
            raise InvalidManifestError(f"the cache's ledger has the chunk file {chunk.path}, which the shard index "
                                       f"does not list as a {kind} of subset {subset!r}", path=chunk.path)
        return row

    def _context(self, subset: str, part: CachePart, chunk: ChunkFile) -> str:
        rows = self._rows[subset]
        depends = [join(part.prefix, LEDGER), join(part.prefix, f"{DATA_ARRAY}/{ZARR_JSON}"),
                   join(part.prefix, f"{OFFSETS_ARRAY}/{ZARR_JSON}"), *(c.path for c in part.offsets_chunks())]
        # contents, not names: the same part under two cell names decodes alike
        h = hashlib.sha256(f"levanter chunk at {chunk.start}".encode())
        for path in depends:
            h.update(f"\n{rows[path].sha256 if path in rows else '-'}".encode())
        return h.hexdigest()

    def _remember(self, row: ShardRecord, chunk: _Chunk) -> None:
        with self._lock:
            seen = self._by_sha.setdefault(row.sha256, chunk.context)
            self._chunks[row.path] = chunk
        if seen != chunk.context:
            raise InvalidManifestError(f"{row.path} holds the same bytes as another data chunk file of this corpus "
                                       "but lies among other document boundaries; the loader keys a decode by the "
                                       "file's sha256 and cannot tell them apart", path=row.path)

    def _chunk(self, shard: ShardRecord) -> _Chunk:
        c = self._chunks.get(shard.path)
        if c is None:
            self.chunks(shard.subset)
            c = self._chunks[shard.path]
        return c


class _ReaderError(Exception):
    """A reader's own error carried through `read_file`'s retries (the reader has retried what is worth it:
    a local file that differs from the index does not change by being read again)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def _unwrapped() -> Iterator[None]:
    try:
        yield
    except _ReaderError as e:
        raise e.error from None


class _IndexedFiles(Store):
    """One subset's rows as a read-only store for `open_cache`: a file the index does not list is missing,
    and every read is the caller's checked ``read``."""

    def __init__(self, rows: dict[str, ShardRecord], read: Reader, url: str) -> None:
        self.rows, self._read, self.url = rows, read, url

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for path in sorted(self.rows):
            if not prefix or path.startswith(prefix.rstrip("/") + "/"):
                yield self.head(path)

    def head(self, path: str) -> ObjectInfo | None:
        row = self.rows.get(path)
        return None if row is None else ObjectInfo(path, row.bytes, row.sha256)

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        row = self.rows.get(path)
        if row is None:
            raise RemoteError("not listed in the shard index", path=self.describe(path), status=404)
        try:
            data = self._read(row)
        except Exception as e:  # noqa: BLE001 - re-raised as it was by `_unwrapped`
            raise _ReaderError(e) from e
        return ReadStream(iter([data[start:end]]), start=start, close=lambda: None)

    def put(self, path: str, src, *, sha256: str, size: int) -> None:
        raise RemoteError("a pinned cache is read-only to the loader", path=self.describe(path))
