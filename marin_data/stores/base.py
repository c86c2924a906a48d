"""The store interface: what publish, download and remote verify ask of wherever a corpus lives.

A corpus has the same layout everywhere (docs/design.md), so publish, download and remote verify only need four
operations on a *store* rooted at the corpus: ``list`` files, ``head`` one (size, and its SHA-256 when the
store keeps one), ``read`` a byte range as a stream, and ``put`` a file. Paths are the corpus's relative
POSIX paths (``data/pretrain/code/part-00000.parquet``); each store maps them to its own keys.

Failures come out typed (`marin_data.retry.status_error`): `RetryableRemoteError` for what may pass
(dropped connection, 429, 5xx), `RemoteError` for what will not (404, 403, a bad URL). Retrying is the
caller's business, through `marin_data.retry.retry_call`, so it happens in one place.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from marin_data.errors import RemoteError, RetryableRemoteError

__all__ = ["ObjectInfo", "ReadStream", "Store", "READ_CHUNK", "METADATA_LIMIT", "body_start", "range_header"]

# Bytes per chunk of a streaming read: large enough that per-chunk Python overhead is noise at GB/s, small
# enough that a dropped connection loses little and memory stays bounded (one chunk per worker).
READ_CHUNK = 1 << 20
# The most bytes of remote metadata (a manifest, a JSON answer of an API) buffered to parse it; more is refused
# as it arrives. A manifest lists subsets and metadata files, not shards: real ones are kilobytes.
METADATA_LIMIT = 64 << 20


@dataclass(frozen=True)
class ObjectInfo:
    """What a store says about one file without reading it."""

    path: str  # relative to the store's root
    size: int
    sha256: str | None = None  # hex; None when the store keeps no full-object SHA-256 for it
    sha256_source: str | None = None  # "checksum" (computed by the store at upload) or "metadata" (ours)
    git_sha1: str | None = None  # Hugging Face: a regular (non-LFS) file's git blob id, its only content hash


class ReadStream:
    """An open streaming read. Iterate it for ``bytes`` chunks; use it as a context manager so the
    connection is released even when the reader stops early.

    ``start`` is where the body really begins: a server that ignores ``Range`` answers 200 with the whole
    object, and the reader must notice.
    """

    def __init__(self, chunks: Iterator[bytes], *, start: int, close: Callable[[], None]):
        self._chunks = chunks
        self.start = start
        self._close = close

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        self._close()

    def __enter__(self) -> ReadStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def range_header(start: int, end: int | None) -> str | None:
    """The ``Range`` header value asking for bytes ``[start, end)`` (``end`` None: to the end); None for all."""
    if end is not None:
        return f"bytes={start}-{end - 1}"
    return f"bytes={start}-" if start else None


def body_start(status: int, content_range: str | None, where: str, close: Callable[[], None]) -> int:
    """Where a GET's body begins in the object: 0 for a 200 (the whole object, whatever ``Range`` asked),
    the first byte of ``Content-Range`` for a 206. A 206 without a usable ``Content-Range`` is closed and
    retried (`RetryableRemoteError`): writing its bytes at a guessed offset would corrupt the file."""
    if status != 206:
        return 0
    m = re.match(r"bytes (\d+)-", content_range or "")
    if m is None:
        close()
        raise RetryableRemoteError(f"206 without a usable Content-Range {content_range!r}", path=where)
    return int(m[1])


class Store(abc.ABC):
    """A corpus root on some backend. Implementations must be safe to call from several threads."""

    url: str
    max_put_bytes: int | None = None  # largest file one ``put`` accepts (S3: 5 GiB); None: no limit

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every file under ``prefix`` (a relative folder path, "" for all)."""

    @abc.abstractmethod
    def head(self, path: str) -> ObjectInfo | None:
        """Size and, when known, SHA-256 of ``path``; None when it does not exist."""

    @abc.abstractmethod
    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        """Stream bytes ``[start, end)`` of ``path`` (``end`` None: to its end) in one request, with ``Range``
        unless that is the whole file (`range_header`). A server may still answer with the whole object:
        check ``ReadStream.start``."""

    @abc.abstractmethod
    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        """Store the file ``src`` (whose SHA-256 and size the caller has checked) at ``path``, whole."""

    def mirror_record(self) -> dict:
        """How ``mirrors.json`` (`marin_data.corpus.mirrors`) names this store."""
        return {"url": self.url}

    def read_bytes(self, path: str, *, limit: int) -> bytes:
        """The whole of a small file (a manifest, an index), refusing more than ``limit`` bytes."""
        out = bytearray()
        with self.read(path) as stream:
            for chunk in stream:
                out += chunk
                if len(out) > limit:
                    raise RemoteError(f"larger than the {limit} bytes expected of it", path=self.describe(path))
        return bytes(out)

    def describe(self, path: str) -> str:
        """A full URL for messages."""
        return f"{self.url.rstrip('/')}/{path}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
