"""The store interface: what publish, download and remote verify ask of wherever a corpus lives.

A corpus has the same layout everywhere (docs/design.md), so publish, download and remote verify only need four
operations on a *store* rooted at the corpus: ``list`` files, ``head`` one (size, and its SHA-256 when the
store keeps one), ``read`` a byte range as a stream, and ``put`` a file. Paths are the corpus's relative
POSIX paths (``data/pretrain/code/part-00000.parquet``); each store maps them to its own keys.

Failures come out typed (`marin_data.retry.status_error`): `RetryableRemoteError` for what may pass
(dropped connection, 429, 5xx, a server too slow for its `marin_data.stores.limits.RequestClock`),
`RemoteError` for what will not (404, 403, a bad URL, `RemoteLimitError` for an answer past a bound).
Every failure of a transport, whatever the server sent, comes out as one of them. Retrying is the caller's
business, through `marin_data.retry.retry_call`, so it happens in one place.
"""

from __future__ import annotations

import abc
import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from marin_data.errors import RemoteError, RemoteLimitError, RetryableRemoteError
from marin_data.stores.limits import RequestClock

__all__ = ["ObjectInfo", "ReadStream", "Store", "READ_CHUNK", "METADATA_LIMIT", "body_span", "collect",
           "range_header"]

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
    checksums: tuple[tuple[str, str], ...] = ()  # other digests the store vouches for: (algorithm, hex), as
    # `marin_data.stores.checksums` names them (md5, crc32c, crc32)
    unfetched: tuple[str, ...] = ()  # algorithms a listing says the store keeps but did not give (`Store.vouched`)

    def digests(self) -> dict[str, str]:
        """Every digest the store vouches for: ``algorithm -> hex``, the SHA-256 among them when it has one."""
        return {**dict(self.checksums), **({"sha256": self.sha256} if self.sha256 else {})}


class ReadStream:
    """An open streaming read. Iterate it for ``bytes`` chunks; use it as a context manager so the
    connection is released even when the reader stops early.

    ``start`` is where the body really begins: a server that ignores ``Range`` answers 200 with the whole
    object, and the reader must notice. The stream ends at ``stop`` (the end of the range asked for, or of the
    ``Content-Range`` answered, whichever is first) whatever the server goes on sending, and the request's
    ``clock`` (`marin_data.stores.limits.RequestClock`) cuts a server that sends too slowly. ``pieces`` are
    the body's bytes as they arrive (each socket read's), joined here into chunks of up to `READ_CHUNK`.
    """

    def __init__(self, pieces: Iterator[bytes], *, start: int, close: Callable[[], None],
                 stop: int | None = None, clock: RequestClock | None = None):
        self._pieces = pieces
        self.start = start
        self.stop = stop
        self._close = close
        self.clock = clock  # None: no deadline (a local file)

    def __iter__(self) -> Iterator[bytes]:
        left = None if self.stop is None else self.stop - self.start
        clock = self.clock
        held: list[bytes] = []
        size = 0
        while left is None or left > 0:
            try:
                with clock.running() if clock is not None else contextlib.nullcontext():
                    piece = next(self._pieces, None)
            except RemoteError as e:
                if clock is not None and clock.remaining() < 0:  # the socket read was cut at the clock's end
                    raise clock.late() from e
                raise
            if piece is None:
                break
            if clock is not None:
                clock.got(len(piece))
                clock.check()
            if left is not None:
                piece = piece[:left]
                left -= len(piece)
            held.append(piece)
            size += len(piece)
            if size >= READ_CHUNK:
                yield b"".join(held) if len(held) > 1 else held[0]
                held, size = [], 0
        if held:
            yield b"".join(held)

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


def body_span(status: int, content_range: str | None, start: int, end: int | None, where: str,
              close: Callable[[], None]) -> tuple[int, int | None]:
    """Where a GET's body begins in the object and where the reader must stop: ``(0, end)`` for a 200 (the
    whole object, whatever ``Range`` asked), the ``Content-Range`` for a 206, cut at ``end``. A 206 without
    a usable ``Content-Range``, or one that does not start where we asked, is closed and retried
    (`RetryableRemoteError`): writing its bytes at a guessed offset would corrupt the file."""
    if status != 206:
        return 0, end
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", (content_range or "").strip())
    if m is None or int(m[1]) != start or int(m[2]) < int(m[1]):
        close()
        raise RetryableRemoteError(f"asked for bytes from {start}, got a 206 with Content-Range {content_range!r}",
                                   path=where)
    last = int(m[2]) + 1
    return start, last if end is None else min(end, last)


def collect(stream: ReadStream, *, limit: int, where: str) -> bytes:
    """The whole body of ``stream``, refusing (`RemoteLimitError`) more than ``limit`` bytes as they arrive."""
    out = bytearray()
    with stream:
        for chunk in stream:
            out += chunk
            if len(out) > limit:
                raise RemoteLimitError(f"larger than the {limit:,} bytes expected of it", path=where)
    return bytes(out)


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
        check ``ReadStream.start``. The stream never yields past ``end``."""

    @abc.abstractmethod
    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        """Store the file ``src`` (whose SHA-256 and size the caller has checked) at ``path``, whole."""

    def vouched(self, info: ObjectInfo) -> ObjectInfo:
        """``info`` (from `list`) with every digest the store keeps for the object: a store whose listing only
        names some (S3's ``ChecksumAlgorithm``) asks for them (one HEAD); the others return ``info``."""
        return info

    def reopen_url(self) -> str:
        """The URL `marin_data.stores.open_store` opens this very store again with (in another process)."""
        return self.url

    def mirror_record(self) -> dict:
        """How ``mirrors.json`` (`marin_data.corpus.mirrors`) names this store."""
        return {"url": self.url}

    def read_bytes(self, path: str, *, limit: int) -> bytes:
        """The whole of a small file (a manifest, an index), refusing more than ``limit`` bytes."""
        return collect(self.read(path), limit=limit, where=self.describe(path))

    def describe(self, path: str) -> str:
        """A full URL for messages."""
        return f"{self.url.rstrip('/')}/{path}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
