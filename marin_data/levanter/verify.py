"""``verify`` on a Levanter cache or store: the structural checks of every selected cell
(`marin_data.levanter.checks`), read through its store (local, ``s3://``, ``hf://``), and, for a store
pinned by `adopt`, the hashes of every listed file first (`marin_data.corpus.verify.verify_corpus`); for
a local copy an unpinned download made, its files re-hashed against the download's record
(`marin_data.levanter.checked`).

A cell that cannot be opened (a missing or malformed ledger or ``zarr.json``) is one finding; the others
are still checked. The report is the one ``verify`` prints for a corpus (`VerifyReport`).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.names import select_subsets
from marin_data.corpus.verify import Problem, ProblemKind, VerifyReport, verify_corpus
from marin_data.engines.local import default_workers
from marin_data.errors import CacheFormatError, InvalidManifestError, UnknownSubsetError
from marin_data.levanter.cache import LevanterCache, open_cache
from marin_data.levanter.checked import read_checked, recheck
from marin_data.levanter.checks import check_cache
from marin_data.levanter.detect import CACHE, CORPUS, Source, detect
from marin_data.levanter.pinned import cell_prefixes, is_pinned_cache
from marin_data.stores.base import Store
from marin_data.stores.local import LocalStore
from marin_data.transfer.rehash import job_store

__all__ = ["REMOTE_WORKERS", "CellJob", "verify_source", "verify_found", "check_cells"]

REMOTE_WORKERS = 16  # cells checked at once over s3:// or hf://


def check_cells(store: Store, cells: dict[str, str | LevanterCache], *, tokens: bool = False,
                vocab_size: int | None = None, expect_bos: int | None = None,
                workers: int | None = None) -> tuple[list[Problem], int, int]:
    """The structural findings of each cell (subset name -> its cache root on ``store``, or the cache already
    opened there: its ledgers and ``zarr.json`` are not read again), cells in parallel, how many chunk files
    were examined and how many token bytes decoded."""
    lock, decoded = threading.Lock(), [0]

    def count(n: int) -> None:
        with lock:
            decoded[0] += n

    def one(prefix: str | LevanterCache) -> tuple[list[Problem], int]:
        try:
            cache = prefix if isinstance(prefix, LevanterCache) else open_cache(store, prefix, require_finished=False)
        except CacheFormatError as e:
            where = e.path or store.describe(prefix)
            rel = where[len(store.url.rstrip("/")) + 1:] if where.startswith(store.url.rstrip("/") + "/") else where
            return [Problem(rel, ProblemKind.BAD_CACHE_FILE, e.message)], 0
        files = sum(len(p.data_chunks()) + len(p.offsets_chunks()) for p in cache.parts)
        return check_cache(cache, tokens=tokens, vocab_size=vocab_size, expect_bos=expect_bos, on_bytes=count), files

    # a remote store's checks wait on round trips (a ranged read per chunk file), not on cores
    default = default_workers() if isinstance(store, LocalStore) else REMOTE_WORKERS
    with ThreadPoolExecutor(max_workers=max(1, min(workers or default, len(cells) or 1))) as pool:
        results = list(pool.map(one, cells.values()))
    return [p for found, _ in results for p in found], sum(n for _, n in results), decoded[0]


@dataclass(frozen=True)
class CellJob:
    """The structural checks of one cell (``subset``, its cache root ``prefix``) of the store at ``url``
    (opened with ``options``, as sorted pairs), as plain data: a job any engine runs
    (`marin_data.transfer.remote_verify.check_listing`'s ``also``); calling it returns the findings."""

    url: str
    options: tuple[tuple[str, Any], ...]
    subset: str
    prefix: str

    def __call__(self) -> list[Problem]:
        problems, _, _ = check_cells(job_store(self.url, self.options), {self.subset: self.prefix}, workers=1)
        return problems


def verify_source(url: str | os.PathLike, *, subsets: list[str] | None = None, tokens: bool = False,
                  vocab_size: int | None = None, expect_bos: int | None = None, manifest_sha256: str | None = None,
                  workers: int | None = None, progress: bool | None = None, **store_options) -> VerifyReport:
    """Verify the Levanter cache, store, or pinned store at ``url``.

    Args:
        subsets: cell names or globs (all cells when None).
        tokens: also decode every data chunk: ids inside the vocabulary, and ``expect_bos``.
        vocab_size: token ids must be below it (a pinned store: its tokenizer's, unless given).
        expect_bos: with ``tokens``, the id every non-empty document must start with.
        manifest_sha256: a pinned store's manifest must have this sha256.

    Raises:
        UnknownSourceError: ``url`` holds no cache; InvalidManifestError: a marin corpus of Parquet shards
            (`verify_corpus` checks those) or an untrustworthy manifest.
    """
    return verify_found(detect(url, **store_options), url, subsets=subsets, tokens=tokens, vocab_size=vocab_size,
                        expect_bos=expect_bos, manifest_sha256=manifest_sha256, workers=workers, progress=progress)


def verify_found(found: Source, url: str | os.PathLike, *, subsets: list[str] | None = None, tokens: bool = False,
                 vocab_size: int | None = None, expect_bos: int | None = None, manifest_sha256: str | None = None,
                 workers: int | None = None, progress: bool | None = None) -> VerifyReport:
    """`verify_source` of the source ``found`` (`detect`) at ``url`` (a pinned store's: local)."""
    t0 = time.perf_counter()
    if found.kind == CORPUS:
        corpus = load_corpus(url, manifest_sha256=manifest_sha256)
        if not is_pinned_cache(corpus.manifest):
            raise InvalidManifestError("a corpus of Parquet shards, not of Levanter caches", path=str(url))
        prefixes = cell_prefixes(corpus.manifest)
        hashed = verify_corpus(url, subsets=subsets, workers=workers, progress=progress,
                               manifest_sha256=corpus.manifest_sha256, folders=prefixes)
        cells = {s: p for s, p in prefixes.items() if s in hashed.subsets}
        problems, _, _ = check_cells(found.store, cells, tokens=tokens, expect_bos=expect_bos, workers=workers,
                                     vocab_size=vocab_size or corpus.manifest.tokenizer.vocab_size)
        return replace(hashed, deep=tokens, seconds=time.perf_counter() - t0,
                       problems=tuple(sorted([*hashed.problems, *problems], key=lambda p: (p.path, p.kind.value))))
    cells = {"": ""} if found.kind == CACHE else {c: c for c in select_subsets(found.cells, subsets, what="cell")}
    if found.kind == CACHE and subsets:
        raise UnknownSubsetError("--subset selects cells of a store; this is one cache", actual=subsets)
    problems, files, nbytes = check_cells(found.store, cells, tokens=tokens, vocab_size=vocab_size,
                                  expect_bos=expect_bos, workers=workers)
    record = read_checked(found.store.root) if isinstance(found.store, LocalStore) else None
    if record is not None:
        hashed, nfiles, hashed_bytes = recheck(found.store.root, record[1], cells,
                                               workers=workers or default_workers())
        problems, files, nbytes = [*problems, *hashed], files + nfiles, nbytes + hashed_bytes
    return VerifyReport(root=str(url), manifest_sha256="", subsets=tuple(c for c in cells if c), deep=tokens,
                        files_checked=files, bytes_checked=nbytes, seconds=time.perf_counter() - t0, workers=1,
                        problems=tuple(sorted(problems, key=lambda p: (p.path, p.kind.value))), partial_files=(),
                        ignored=found.skipped, recorded=record is not None)
