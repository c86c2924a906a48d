"""The Levanter plug-in's formats, as the registry (`marin_data.formats`) knows them.

- ``levanter-cache``: one cache, ``shard_ledger.json`` at its root.
- ``levanter-store``: a tree of caches whose folders are subset names (``cluster=3/quality=4``).

Each is found two ways: without a manifest (`detect`: an unpinned source, whose bytes nothing vouches for),
and as the ``format`` of a manifest `marin-data adopt` wrote beside the caches (`open_corpus`: pinned in
place, every chunk file a row of the shard index). The loader reads a pinned one through `PinnedCells`.
"""

from __future__ import annotations

from typing import Any

from marin_data.corpus.manifest import Corpus, Manifest
from marin_data.formats.base import Reader, Source
from marin_data.formats.corpus import CorpusSource
from marin_data.levanter.cells import PinnedCells
from marin_data.levanter.detect import CACHE, STORE, cache_roots
from marin_data.levanter.detect import Source as Found
from marin_data.levanter.ledger import LEDGER
from marin_data.levanter.pinned import LEVANTER_CACHE, LEVANTER_STORE
from marin_data.stores.base import Store

__all__ = ["LevanterCacheFormat", "LevanterStoreFormat", "CacheSource", "PinnedSource"]


class CacheSource(Source):
    """An unpinned Levanter cache or store: ``found`` says which, and a store's cells."""

    pinned = False

    def __init__(self, found: Found) -> None:
        super().__init__(found.store)
        self.found = found

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.found.kind

    @property
    def format(self) -> str:
        return LEVANTER_CACHE if self.found.kind == CACHE else LEVANTER_STORE

    def describe(self) -> str:
        return f"Levanter {self.found.kind}"

    def datasheet(self, url: str | None = None) -> Any:
        from marin_data.levanter.datasheet import CacheDatasheet

        return CacheDatasheet(self.found, url or self.url, self.options)


class PinnedSource(CorpusSource):
    """A Levanter cache or store pinned in place by ``marin-data adopt``: a corpus whose shards are the
    caches' chunk files."""

    def describe(self) -> str:
        return "pinned Levanter cache"

    def datasheet(self, url: str | None = None) -> Any:
        from marin_data.levanter.datasheet import pinned_datasheet

        return pinned_datasheet(self.store, self.manifest, url)


class _Levanter:
    marker = LEDGER
    what = "a Levanter cache"

    def open_corpus(self, store: Store, manifest: Manifest) -> PinnedSource:
        return PinnedSource(store, manifest)

    def decoder(self, corpus: Corpus, read: Reader) -> PinnedCells:
        return PinnedCells(corpus, read)


class LevanterCacheFormat(_Levanter):
    name = LEVANTER_CACHE

    def detect(self, store: Store) -> CacheSource | None:
        return CacheSource(Found(CACHE, store)) if store.head(LEDGER) is not None else None


class LevanterStoreFormat(_Levanter):
    name = LEVANTER_STORE

    def detect(self, store: Store) -> CacheSource | None:
        cells = cache_roots(store)
        return CacheSource(Found(STORE, store, cells)) if cells else None
