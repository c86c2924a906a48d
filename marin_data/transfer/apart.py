"""A pin kept apart from its data, read as one store: the shard files from where the data is, the rest from the pin.

``adopt --pin-to`` writes a pin (manifest, shard index, ``SHA256SUMS``, tokenizer, card) somewhere other than the
data it pins, and names the data's URL in the manifest's ``data`` field. Whatever reads such a pin's files (a
download, a remote verify, ``show``, a datasheet, the loader, a trace) reads the files its shard index lists
from that URL (opened with the same store options) and everything else from the pin, through `kept_apart`
(one store) or `apart_order` (the primary of a `StoreOrder`, mirrors being whole copies). Each file is still
checked against the pin's digests, so the data's store is trusted for nothing. `ApartStore` is that routing; it
writes nothing. `refuse_publish` is why ``publish`` takes no such pin.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from marin_data.corpus.manifest import Corpus, Manifest
from marin_data.errors import NotApplicableError, RemoteError
from marin_data.layout import RECORD
from marin_data.stores.base import ObjectInfo, ReadStream, Store
from marin_data.stores.order import StoreOrder

__all__ = ["ApartStore", "data_url", "kept_apart", "apart_order", "refuse_publish"]


class ApartStore(Store):
    """``pin`` for every path but ``shards`` (the paths the pin's shard index lists), which ``data`` holds. A
    listing is the pin's, then the data's objects that are shards (a cell's files, as its reader lists them)."""

    def __init__(self, pin: Store, data: Store, shards: Iterable[str]) -> None:
        self.pin, self.data, self.url = pin, data, pin.url
        self.shards = frozenset(shards)
        self.max_put_bytes = pin.max_put_bytes

    def _of(self, path: str) -> Store:
        return self.data if path in self.shards else self.pin

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        yield from self.pin.list(prefix)
        yield from (o for o in self.data.list(prefix) if o.path in self.shards)

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


def data_url(manifest: Manifest, root: str | Path | None = None) -> str:
    """Where a pin's shards are read from when not beside it: its manifest's ``data``; or "" when it names none,
    or when the local folder ``root`` holds them: a download of a pin kept apart keeps the manifest as it is
    (its digest is the pin's), ``data`` and all, and records itself in ``RECORD``."""
    if root is not None and (Path(root) / RECORD).is_file():
        return ""
    return manifest.data


def kept_apart(pin: Store, data: str, shards: Iterable[str], options: dict[str, Any]) -> Store:
    """``pin`` read as one store with its data: itself when ``data`` (`data_url`) is "", else an `ApartStore`
    reading ``shards`` (the paths its index lists) from the store at ``data`` opened with ``options``."""
    if not data:
        return pin
    from marin_data.stores import open_store

    return ApartStore(pin, open_store(data, **options), shards)


def apart_order(stores: StoreOrder, data: str, shards: Iterable[str], options: dict[str, Any]) -> StoreOrder:
    """``stores`` with its primary read by `kept_apart`; mirrors are whole copies, read as they are."""
    if not data:
        return stores
    primary, shards = stores.primary, frozenset(shards)
    return stores.using(lambda s: kept_apart(s, data, shards, options) if s is primary else s)


def refuse_publish(corpus: Corpus) -> None:
    """Raise `NotApplicableError` when ``corpus`` is a pin kept apart from its data: publish uploads a corpus's
    shards with its pin, and these are not in the folder. The pin alone is its folder's files, copied as they
    are (it stays a pin of the same data, its manifest's digest unchanged)."""
    if data_url(corpus.manifest, corpus.root):
        raise NotApplicableError(
            f"{corpus.root} is a pin kept apart from its data, which is at {corpus.manifest.data}: publish uploads "
            f"a corpus with its shards. To put the pin elsewhere, copy the files of {corpus.root} as they are (or "
            f"`marin-data adopt {corpus.manifest.data} --pin-to DEST`); to publish the data too, `marin-data "
            f"download {corpus.root}` and publish the copy")
