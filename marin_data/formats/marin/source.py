"""A corpus of Parquet shards as the commands speak to it: ``show`` decodes a subset's documents (local, or a
published copy read in byte ranges), ``verify`` re-hashes a local copy against its manifest, ``convert``
writes it as a store of Levanter caches (the Levanter plug-in's writer). ``info``, ``download`` and ``adopt``
are every corpus's (`marin_data.formats.corpus.CorpusSource`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marin_data.errors import NotApplicableError
from marin_data.formats.base import LEVANTER
from marin_data.formats.corpus import CorpusSource

__all__ = ["MarinSource", "verify_folder"]


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

    def verify(self, *, subsets: Sequence[str] = (), workers: int | None = None, deep: bool = False,
               tokenizer: str | None = None, expect_bos: int | None = None, manifest_sha256: str | None = None,
               engine: str = "local", engine_address: str | None = None) -> Any:
        if not self.local:
            raise self.published(tokenizer, expect_bos)
        return verify_folder(self.given, self.options, subsets=subsets, workers=workers, deep=deep,
                             tokenizer=tokenizer, expect_bos=expect_bos, manifest_sha256=manifest_sha256,
                             engine=engine, engine_address=engine_address)

    def convert(self, *, to: str, dest: str | Path, subsets: Sequence[str] = (), **settings: Any) -> Any:
        if to != LEVANTER:
            raise NotApplicableError(f"{self.given} is a marin corpus already: --format levanter writes it as "
                                     "Levanter caches")
        from marin_data.levanter.formats import write_caches

        return write_caches(self, dest=dest, subsets=subsets, **settings)


def verify_folder(path: str, options: dict[str, Any], *, subsets: Sequence[str] = (), workers: int | None = None,
                  deep: bool = False, tokenizer: str | None = None, expect_bos: int | None = None,
                  manifest_sha256: str | None = None, engine: str = "local",
                  engine_address: str | None = None) -> Any:
    """``verify`` of the local corpus folder ``path`` (`marin_data.corpus.verify.verify_corpus`), refusing the
    options that do not apply to one; also what a path that is no folder gets (its error names what is
    missing). ``options``: the store options given (a local folder takes none)."""
    from marin_data.corpus.verify import verify_corpus

    if tokenizer or expect_bos is not None:
        raise NotApplicableError("--tokenizer and --expect-bos apply to Levanter caches")
    if options:
        raise NotApplicableError("store options (--endpoint-url, --endpoint, --token, ...) need --remote URL")
    if engine_address is not None and engine != "ray":
        raise NotApplicableError("--ray-address needs --engine ray")
    return verify_corpus(Path(path), subsets=subsets or None, workers=workers, deep=deep,
                         manifest_sha256=manifest_sha256, engine=engine, engine_address=engine_address)
