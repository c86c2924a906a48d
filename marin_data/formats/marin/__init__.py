"""The ``marin`` format: a corpus of Parquet shards under ``data/<subset>/`` (docs/design.md, "The corpus
format"). It has no life without a manifest, so `MarinFormat.detect` recognises nothing on its own."""

from __future__ import annotations

from marin_data.corpus.manifest import MARIN, Corpus, Manifest
from marin_data.formats.base import Reader
from marin_data.formats.marin.decode import ParquetDecoder
from marin_data.formats.marin.source import MarinSource
from marin_data.layout import MANIFEST
from marin_data.stores.base import Store

__all__ = ["MarinFormat", "ParquetDecoder", "MarinSource"]


class MarinFormat:
    name = MARIN
    marker = MANIFEST
    what = "a marin corpus"

    def detect(self, store: Store) -> None:
        return None

    def open_corpus(self, store: Store, manifest: Manifest) -> MarinSource:
        return MarinSource(store, manifest)

    def decoder(self, corpus: Corpus, read: Reader) -> ParquetDecoder:
        return ParquetDecoder(corpus)
