"""A corpus of Parquet shards as the commands speak to it: ``show`` decodes a subset's documents (local, or a
published copy read in byte ranges), ``convert`` writes it as a store of Levanter caches (the Levanter
plug-in's writer), and the datasheet describes its Parquet shards. ``info``, ``verify``, ``download`` and
``adopt`` are every corpus's (`marin_data.formats.corpus.CorpusSource`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marin_data.errors import NotApplicableError
from marin_data.formats.base import LEVANTER
from marin_data.formats.corpus import CorpusSource

__all__ = ["MarinSource"]


class MarinSource(CorpusSource):
    """A marin corpus of Parquet shards, local or published."""

    def datasheet(self, url: str | None = None) -> Any:
        from marin_data.formats.marin.datasheet import parquet_datasheet

        return parquet_datasheet(self.store, self.manifest, url)

    def show(self, *, subset: str | None, n: int, doc_id: str | None = None, row: int | None = None,
             tokenizer: str | None = None, manifest_sha256: str | None = None) -> list:
        if subset is None or tokenizer or row is not None:
            raise NotApplicableError("a marin corpus: --subset is required; --tokenizer and --row apply to Levanter "
                                     "caches")
        if not self.local:
            from marin_data.transfer.remote_corpus import remote_show

            return remote_show(self.given, subset=subset, n=n, doc_id=doc_id, manifest_sha256=manifest_sha256,
                               **self.options)
        if manifest_sha256 or self.options:
            raise NotApplicableError("--manifest-sha256 and the store options apply to s3:// and hf:// URLs only")
        from marin_data.corpus.show import show_documents

        return show_documents(self.given, subset=subset, n=n, doc_id=doc_id)

    def convert(self, *, to: str, dest: str | Path, subsets: Sequence[str] = (), **settings: Any) -> Any:
        if to != LEVANTER:
            raise NotApplicableError(f"{self.given} is a marin corpus already: --format levanter writes it as "
                                     "Levanter caches")
        from marin_data.levanter.formats import write_caches

        return write_caches(self, dest=dest, subsets=subsets, **settings)
