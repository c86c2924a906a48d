"""A pin kept apart from its data, read as one store: the shard files from where the data is, the rest from the pin.

``adopt --pin-to`` writes a pin (manifest, shard index, ``SHA256SUMS``, tokenizer, card) somewhere other than the
data it pins, and names the data's URL in the manifest's ``data`` field. A download or a remote verify of such
a pin reads the files its shard index lists from that URL (opened with the same store options) and everything
else from the pin; each file is still checked against the pin's digests, so the data's store is trusted for
nothing. `ApartStore` is that routing; it writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from marin_data.errors import RemoteError
from marin_data.stores.base import ObjectInfo, ReadStream, Store

__all__ = ["ApartStore"]


class ApartStore(Store):
    """``pin`` for every path but ``shards`` (the paths the pin's shard index lists), which ``data`` holds."""

    def __init__(self, pin: Store, data: Store, shards: Iterable[str]) -> None:
        self.pin, self.data, self.url = pin, data, pin.url
        self.shards = frozenset(shards)
        self.max_put_bytes = pin.max_put_bytes

    def _of(self, path: str) -> Store:
        return self.data if path in self.shards else self.pin

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.pin.list(prefix)

    def head(self, path: str) -> ObjectInfo | None:
        return self._of(path).head(path)

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        return self._of(path).read(path, start, end)

    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        raise RemoteError("a pin kept apart from its data is read here, not written", path=self.describe(path))

    def vouched(self, info: ObjectInfo) -> ObjectInfo:
        return self._of(info.path).vouched(info)

    def describe(self, path: str) -> str:
        return self._of(path).describe(path)
