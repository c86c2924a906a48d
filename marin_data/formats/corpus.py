"""A corpus: a source whose ``manifest.json`` (and through it the shard index) vouches for every file, whatever
its shards are. The format its manifest names subclasses `CorpusSource` for what its shards change."""

from __future__ import annotations

from typing import Any

from marin_data.corpus.manifest import Manifest
from marin_data.formats.base import Source
from marin_data.stores.base import Store

__all__ = ["CorpusSource"]


class CorpusSource(Source):
    """A corpus at ``store``, with its parsed ``manifest`` (its digest is checked where it is pinned)."""

    kind = "corpus"
    pinned = True

    def __init__(self, store: Store, manifest: Manifest, options: dict[str, Any] | None = None) -> None:
        super().__init__(store, options)
        self.manifest = manifest

    @property
    def format(self) -> str:
        return self.manifest.format

    def describe(self) -> str:
        return "marin corpus"

    def datasheet(self, url: str | None = None) -> Any:
        from marin_data.formats.marin.datasheet import parquet_datasheet

        return parquet_datasheet(self.store, self.manifest, url)
