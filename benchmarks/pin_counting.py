"""Counting what a client asks of a store, for `bench_pin_costs.py`: requests as the server saw them, bytes as
the client read them.

`recorded_requests` turns on moto's request recorder (``MOTO_RECORDER_FILEPATH`` set before the server
started) for the length of a ``with`` block and yields the list it fills on exit: one ``(kind, key)`` per
request, kind ``LIST``, ``HEAD``, ``GET`` (a whole object) or ``GET range``. It counts requests from every
process (a Ray worker's too), since the server records them. `CountingStore` wraps a `Store` and counts the
reads it opens and the body bytes they deliver, which the server's log does not say for a read stopped early.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from marin_data.stores.base import ObjectInfo, ReadStream, Store

__all__ = ["CountingStore", "recorded_requests"]


@contextlib.contextmanager
def recorded_requests(endpoint: str) -> Iterator[list[tuple[str, str]]]:
    """The requests moto answered during the block, as ``(kind, key)``, filled in when it ends."""
    _recorder(endpoint, "reset-recording")
    _recorder(endpoint, "start-recording")
    out: list[tuple[str, str]] = []
    try:
        yield out
    finally:
        _recorder(endpoint, "stop-recording")
        lines = _recorder(endpoint, "download-recording").splitlines()
        out.extend(_kind(json.loads(line)) for line in lines if line.strip())


def _recorder(endpoint: str, action: str) -> str:
    with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method="POST"),
                                timeout=30) as r:
        return r.read().decode()


def _kind(entry: dict) -> tuple[str, str]:
    """A recorded request's kind and object key (bucket left out; a listing: the prefix it asked for)."""
    parts = urlsplit(entry["url"])
    key = unquote(parts.path).lstrip("/").partition("/")[2]
    headers = {k.lower(): v for k, v in entry.get("headers", {}).items()}
    if entry["method"] == "GET" and not key:
        return "LIST", parse_qs(parts.query).get("prefix", [""])[0]
    if entry["method"] == "GET":
        return ("GET range" if "range" in headers else "GET"), key
    return entry["method"], key


class CountingStore(Store):
    """``store`` with the reads it opens (``reads``) and the body bytes they deliver (``bytes``) counted by path."""

    def __init__(self, store: Store) -> None:
        self.store, self.url = store, store.url
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.reads, self.bytes = Counter(), Counter()  # path -> reads opened, body bytes delivered

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.store.list(prefix)

    def head(self, path: str) -> ObjectInfo | None:
        return self.store.head(path)

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        stream = self.store.read(path, start, end)
        with self._lock:
            self.reads[path] += 1

        def counted() -> Iterator[bytes]:
            for piece in stream:
                with self._lock:
                    self.bytes[path] += len(piece)
                yield piece

        return ReadStream(counted(), start=stream.start, stop=stream.stop, close=stream.close)

    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        self.store.put(path, src, sha256=sha256, size=size)

    def vouched(self, info: ObjectInfo) -> ObjectInfo:
        return self.store.vouched(info)

    def describe(self, path: str) -> str:
        return self.store.describe(path)
