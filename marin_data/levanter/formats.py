"""The Levanter plug-in's formats, as the registry (`marin_data.formats`) knows them.

- ``levanter-cache``: one cache, ``shard_ledger.json`` at its root.
- ``levanter-store``: a tree of caches whose folders are subset names (``cluster=3/quality=4``).

Each is found two ways: without a manifest (`detect`: an unpinned source, whose bytes nothing vouches for),
and as the ``format`` of a manifest `marin-data adopt` wrote beside the caches (`open_corpus`: pinned in
place, every chunk file a row of the shard index). The loader reads a pinned one through `PinnedCells`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marin_data.corpus.manifest import Corpus, Manifest
from marin_data.errors import NotApplicableError
from marin_data.formats.base import MARIN, Downloaded, Reader, Source
from marin_data.formats.corpus import CorpusSource
from marin_data.levanter.cells import PinnedCells
from marin_data.levanter.detect import CACHE, CORPUS, STORE, cache_tree
from marin_data.levanter.detect import Source as Found
from marin_data.levanter.ledger import LEDGER
from marin_data.levanter.pinned import LEVANTER_CACHE, LEVANTER_STORE, cell_prefixes
from marin_data.stores.base import Store
from marin_data.stores.local import LocalStore

__all__ = ["LevanterCacheFormat", "LevanterStoreFormat", "CacheSource", "PinnedSource", "write_caches"]

NO_IDS = "a Levanter cache's rows have no ids: pass --row N"
RAY = "--engine ray checks Parquet corpora; a Levanter cache is checked here"


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

    def info(self, *, manifest_sha256: str | None = None) -> Any:
        from marin_data.levanter.summary import summarize

        if manifest_sha256:
            raise NotApplicableError("--manifest-sha256 pins a corpus; this Levanter cache has no manifest yet")
        return summarize(self.found, self.given)

    def tokenizer_for(self, given: str | None) -> tuple[str | None, str | None]:
        """``given``, else the tokenizer the caches' ledgers name when it is on this machine (`ledger_tokenizer`),
        said so; else None, and the command asks for ``--tokenizer`` as before."""
        from marin_data.levanter.ledgermeta import tokenizer_of

        return tokenizer_of(self.found, given)

    def show(self, *, subset: str | None, n: int, doc_id: str | None = None, row: int | None = None,
             tokenizer: str | None = None, manifest_sha256: str | None = None) -> list:
        from marin_data.levanter.summary import show_found

        if tokenizer is None:
            raise NotApplicableError("a Levanter cache carries no tokenizer: pass --tokenizer (the one it was built "
                                     "with)")
        if doc_id:
            raise NotApplicableError(NO_IDS)
        return show_found(self.found, self.given, tokenizer=tokenizer, subset=subset, n=n, row=row,
                          manifest_sha256=manifest_sha256)

    def verify(self, *, subsets: Sequence[str] = (), workers: int | None = None, deep: bool = False,
               tokenizer: str | None = None, expect_bos: int | None = None, manifest_sha256: str | None = None,
               engine: str = "local", engine_address: str | None = None) -> Any:
        from marin_data.levanter.verify import verify_found
        from marin_data.raw.tokenizer import load_tokenizer

        if isinstance(self.store, LocalStore) and self.options:
            raise NotApplicableError("the store options apply to s3:// and hf:// URLs")
        if engine != "local" or engine_address:
            raise NotApplicableError(RAY)
        vocab = load_tokenizer(tokenizer).info.vocab_size if tokenizer else None
        return verify_found(self.found, self.given, subsets=list(subsets) or None,
                            tokens=deep or expect_bos is not None, vocab_size=vocab, expect_bos=expect_bos,
                            manifest_sha256=manifest_sha256, workers=workers)

    def download(self, *, subsets: Sequence[str], dest: str | Path, mirrors: Sequence[str] = (),
                 manifest_sha256: str | None = None, workers: int = 8, part_bytes: int, dry_run: bool = False,
                 ) -> Downloaded:
        from marin_data.levanter.download import download_cache

        if manifest_sha256:
            raise NotApplicableError("--manifest-sha256 pins a corpus; this Levanter cache has no manifest yet "
                                     "(`marin-data adopt` makes one)")
        return download_cache(self.found, subsets=list(subsets), dest=dest, mirrors=list(mirrors), workers=workers,
                              part_bytes=part_bytes, dry_run=dry_run, **self.options).downloaded()

    def convert(self, *, to: str, dest: str | Path, subsets: Sequence[str] = (), **settings: Any) -> Any:
        if to != MARIN:
            raise NotApplicableError(f"{self.given} is a Levanter {self.found.kind}: --format marin writes it as a "
                                     "Parquet corpus")
        if settings.get("tokenizer") is None:
            raise NotApplicableError("a Levanter cache carries no tokenizer: pass --tokenizer (the one it was built "
                                     "with)")
        return _to_marin(self.found, self.given, dest, subsets, settings, self.options)

    def adopt(self, *, tokenizer: str, name: str | None = None, license: str = "unknown",
              workers: int | None = None, tokenizer_name: str | None = None, meta: str | Path | None = None,
              **where: Any) -> Any:
        """Pinned in place (`adopt_found`) when it is a local folder and ``where`` (as `Source.adopt`) asks
        nothing else; else where it lives (`adopt_store`)."""
        from marin_data.levanter.adopt import adopt_found

        settings = {"tokenizer": tokenizer, "name": name, "license": license, "workers": workers,
                    "tokenizer_name": tokenizer_name, "meta": meta}
        if isinstance(self.store, LocalStore) and not _elsewhere(where):
            if self.options:
                raise NotApplicableError("the store options apply to s3:// and hf:// URLs")
            return adopt_found(self.found, self.given, **settings)
        return _adopt_store(self, settings, where)


class PinnedSource(CorpusSource):
    """A Levanter cache or store pinned in place by ``marin-data adopt``: a corpus whose shards are the
    caches' chunk files."""

    def describe(self) -> str:
        return "pinned Levanter cache"

    def datasheet(self, url: str | None = None) -> Any:
        from marin_data.levanter.datasheet import pinned_datasheet

        return pinned_datasheet(self.store, self.manifest, url, self.options)

    @property
    def found(self) -> Found:
        return Found(CORPUS, self.files_store(), pinned_cache=True)

    def show(self, *, subset: str | None, n: int, doc_id: str | None = None, row: int | None = None,
             tokenizer: str | None = None, manifest_sha256: str | None = None) -> list:
        from marin_data.levanter.summary import show_found

        if tokenizer:
            raise NotApplicableError("a pinned Levanter cache decodes with its own tokenizer: drop --tokenizer")
        if doc_id:
            raise NotApplicableError(NO_IDS)
        return show_found(self.found, self.given, subset=subset, n=n, row=row, manifest_sha256=manifest_sha256)

    def verify(self, *, subsets: Sequence[str] = (), workers: int | None = None, deep: bool = False,
               tokenizer: str | None = None, expect_bos: int | None = None, manifest_sha256: str | None = None,
               engine: str = "local", engine_address: str | None = None) -> Any:
        from marin_data.levanter.verify import verify_found

        if not isinstance(self.store, LocalStore):
            raise self.published(tokenizer, expect_bos)
        if self.apart():
            data = self.apart()
            raise NotApplicableError(f"{self.given} is a pin kept apart from its data, which is at {data}: check "
                                     f"the data against it with `marin-data verify {self.given} --remote [--deep]`, "
                                     f"or download it (`marin-data download {self.given}`)")
        if tokenizer:
            raise NotApplicableError("a pinned cache has its own tokenizer: drop --tokenizer")
        if engine != "local" or engine_address:
            raise NotApplicableError(RAY)
        return verify_found(self.found, self.given, subsets=list(subsets) or None,
                            tokens=deep or expect_bos is not None, expect_bos=expect_bos,
                            manifest_sha256=manifest_sha256, workers=workers)

    def adopt(self, *, tokenizer: str, name: str | None = None, license: str = "unknown",
              workers: int | None = None, tokenizer_name: str | None = None, meta: str | Path | None = None,
              **where: Any) -> Any:
        """A pin a killed local run committed, finished (`adopt_corpus`); or, for a store pinned where it lives
        or with ``where`` asking more, cells added to its pin (`adopt_store`)."""
        from marin_data.levanter.adopt import adopt_corpus

        if isinstance(self.store, LocalStore) and not _elsewhere(where):
            return adopt_corpus(self.given)
        return _adopt_store(self, {"tokenizer": tokenizer, "name": name, "license": license, "workers": workers,
                                   "tokenizer_name": tokenizer_name, "meta": meta}, where)

    def remote_checks(self, data: Store, options: dict[str, Any], subsets: Sequence[str]) -> list:
        """The structural checks of each chosen cell in ``data``, a job per cell (`CellJob`): the hashes say the
        bytes are the pinned ones, these say the caches they make are whole (as a local verify checks them)."""
        from marin_data.levanter.verify import CellJob

        prefixes, opened = cell_prefixes(self.manifest), tuple(sorted(options.items()))
        return [CellJob(data.reopen_url(), opened, subset, prefixes[subset]) for subset in subsets]

    def convert(self, *, to: str, dest: str | Path, subsets: Sequence[str] = (), **settings: Any) -> Any:
        if to != MARIN:
            raise NotApplicableError(f"{self.given} is a pinned Levanter cache: --format marin writes it as a Parquet "
                                     "corpus")
        if settings.get("tokenizer") is not None:
            raise NotApplicableError("a pinned Levanter cache converts with its own tokenizer: drop --tokenizer")
        return _to_marin(self.found, self.given, dest, subsets, settings, self.options)


def _elsewhere(where: dict) -> bool:
    """Whether `Source.adopt`'s options ask for more than a pin in place hashed on this machine."""
    return bool(where.get("pin_to") or where.get("subsets") or where.get("work_dir") or where.get("engine_address")
                or where.get("engine", "local") != "local")


def _adopt_store(source: Source, settings: dict, where: dict) -> Any:
    from marin_data.levanter.adopt_remote import adopt_store

    return adopt_store(source.given, **settings, pin_to=where.get("pin_to"), subsets=list(where.get("subsets") or ()),
                       engine=where.get("engine", "local"), engine_address=where.get("engine_address"),
                       work_dir=where.get("work_dir"), **source.options)


def _to_marin(found: Found, given: str, dest: str | Path, subsets: Sequence[str], settings: dict,
              options: dict[str, Any]) -> Any:
    from marin_data.levanter.to_marin import convert_found_to_marin

    wanted = ("tokenizer", "name", "license", "shard_tokens", "workers", "manifest_sha256", "engine",
              "engine_address")
    return convert_found_to_marin(found, given, dest=dest, subsets=list(subsets) or None, store_options=options,
                                  **{k: v for k, v in settings.items() if k in wanted})


def write_caches(source: Source, *, dest: str | Path, subsets: Sequence[str] = (), dtype: str = "int32",
                 codec: str | None = None, manifest_sha256: str | None = None, workers: int | None = None,
                 **marin_settings: Any) -> Any:
    """The local Parquet corpus ``source`` written as a store of Levanter caches, ``dest/<subset>/``
    (`convert_corpus_to_levanter`); ``codec``: "lz4" (the default) or "zstd"; ``marin_settings`` (those of
    the other direction) are ignored."""
    from marin_data.levanter.arraymeta import LZ4, ZSTD
    from marin_data.levanter.to_levanter import convert_corpus_to_levanter

    return convert_corpus_to_levanter(source, source.given, dest=dest, subsets=list(subsets) or None, dtype=dtype,
                                      codec=ZSTD if codec == "zstd" else LZ4, manifest_sha256=manifest_sha256,
                                      workers=workers)


class _Levanter:
    marker = LEDGER
    what = "a Levanter cache"

    def open_corpus(self, store: Store, manifest: Manifest) -> PinnedSource:
        return PinnedSource(store, manifest)

    def decoder(self, corpus: Corpus, read: Reader) -> PinnedCells:
        return PinnedCells(corpus, read)

    def open_run(self, config: str, **kw: Any) -> Any:
        """A Levanter ``train_lm`` run's order (`marin_data.levanter.order.trace.open_trace`)."""
        from marin_data.levanter.order.trace import open_trace

        return open_trace(config, **kw)


class LevanterCacheFormat(_Levanter):
    name = LEVANTER_CACHE

    def detect(self, store: Store) -> CacheSource | None:
        return CacheSource(Found(CACHE, store)) if store.head(LEDGER) is not None else None


class LevanterStoreFormat(_Levanter):
    name = LEVANTER_STORE

    def detect(self, store: Store) -> CacheSource | None:
        cells, skipped = cache_tree(store)
        return CacheSource(Found(STORE, store, cells, skipped=skipped)) if cells else None
