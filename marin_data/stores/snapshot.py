"""A store seen through one listing: every ``list`` and ``head`` answered from the same snapshot.

A command that lists a tree, decides what it holds, checks it and then reads every file (``adopt`` of a
store) must reason about one state of it: a listing whose pages change between calls, or a ``head`` that
disagrees with the listing, would otherwise give each step another tree. `SnapshotStore` lists its store
once, on first use (bounded as the store bounds any listing), and answers ``list`` and ``head`` from that
listing alone; ``read`` and ``vouched`` go to the store (a reader checks what it reads against the size the
snapshot gave), except a read of a path the listing does not hold, answered "not found" (404) without asking
(an optional file such as a cache's ``.stats.json`` costs no request where it is absent); ``reopen_url`` is
the store's (an ``hf://`` store's names the commit the listing was taken at). ``hide`` leaves out paths (a
pin's own files beside the data it pins). It writes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from marin_data.errors import RemoteError
from marin_data.stores.base import ObjectInfo, ReadStream, Store

__all__ = ["SnapshotStore"]


class SnapshotStore(Store):
    """``store`` as one listing of it showed it; ``hide(path)`` true for paths to leave out."""

    def __init__(self, store: Store, hide: Callable[[str], bool] = lambda path: False) -> None:
        self.store, self.url, self.hide = store, store.url, hide
        self._lock = threading.Lock()
        self._listing: dict[str, ObjectInfo] | None = None

    def listing(self) -> dict[str, ObjectInfo]:
        """path -> what the one listing said of it (taken now if not yet)."""
        with self._lock:
            if self._listing is None:
                self._listing = {o.path: o for o in self.store.list() if not self.hide(o.path)}
            return self._listing

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        top = prefix.strip("/")
        for path, info in sorted(self.listing().items()):
            if not top or path.startswith(top + "/"):
                yield info

    def head(self, path: str) -> ObjectInfo | None:
        return self.listing().get(path)

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        if path not in self.listing():  # absent from the tree the listing showed: no request asks again
            raise RemoteError("not in the listing", path=self.describe(path), status=404)
        return self.store.read(path, start, end)

    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        raise RemoteError("a snapshot of a store is read-only", path=self.describe(path))

    def vouched(self, info: ObjectInfo) -> ObjectInfo:
        return self.store.vouched(info)

    def reopen_url(self) -> str:
        return self.store.reopen_url()

    def describe(self, path: str) -> str:
        return self.store.describe(path)
