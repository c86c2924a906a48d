"""What a path or URL holds, decided from its files and never guessed: a marin corpus (``manifest.json`` at
its root, Parquet shards or pinned caches), one Levanter cache (``shard_ledger.json`` at its root), or a
store: a tree of caches whose folders, relative to the root, are their subset names
(``cluster=3/quality=4``), such as Marin's ``CELL/train`` and ``CELL/validation``. Other tools' bookkeeping
in a tree (`marin_data.corpus.foreign`: a ``hf download --local-dir`` copy's ``.cache/huggingface/``, Marin's
executor's ``.executor_info`` and ``.executor_status``) is skipped, and a store's `Source` says what was. Anything
else is an `UnknownSourceError` that names what was expected."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePosixPath

from marin_data.corpus.foreign import foreign
from marin_data.corpus.manifest import Manifest
from marin_data.corpus.names import check_subset_name
from marin_data.errors import InvalidManifestError, UnknownSourceError
from marin_data.layout import CARD, CHECKED, COMMIT, LOCK_NAME, MANIFEST, STAGING
from marin_data.levanter.ledger import LEDGER
from marin_data.levanter.pinned import is_pinned_cache
from marin_data.transfer.read import read_file
from marin_data.stores import open_store
from marin_data.stores.base import METADATA_LIMIT, Store
from marin_data.stores.local import LocalStore

__all__ = ["CORPUS", "CACHE", "STORE", "Source", "detect", "detect_store", "find_cells", "cache_tree"]

CORPUS = "corpus"
CACHE = "cache"
STORE = "store"
_SHOWN = 5  # stray files named in an error


@dataclass(frozen=True)
class Source:
    """What `detect` found: ``kind`` (`CORPUS`, `CACHE` or `STORE`), the store, and for a store its cells
    (subset name = folder of a cache root, sorted) and the other tools' bookkeeping its listing skipped
    (`foreign` of each such file: a folder, or an executor file's path; sorted)."""

    kind: str
    store: Store
    cells: tuple[str, ...] = ()
    pinned_cache: bool = False  # a corpus whose manifest pins Levanter caches (`marin_data.levanter.adopt`)
    skipped: tuple[str, ...] = ()


def detect(url: str | os.PathLike, **store_options) -> Source:
    """Open ``url`` (a local path, ``s3://...``, ``hf://datasets/...``; options as `open_store`) and say
    what it holds (`detect_store`)."""
    return detect_store(open_store(url, **store_options))


def detect_store(store: Store) -> Source:
    """What ``store`` holds: a corpus if ``manifest.json`` is at its root, a cache if ``shard_ledger.json``
    is, else a store of caches (`find_cells`).

    Raises:
        UnknownSourceError: none of these, or a tree with files outside every cache.
        InvalidManifestError: a ``manifest.json`` that does not parse.
        RemoteError: the store cannot be listed.
    """
    at = MANIFEST if store.head(MANIFEST) is not None else _moving_in(store)
    if at is not None:
        data = read_file(store, at, limit=METADATA_LIMIT)
        manifest = Manifest.from_json(data or b"", store.describe(at))
        return Source(CORPUS, store, pinned_cache=is_pinned_cache(manifest))
    if store.head(LEDGER) is not None:
        return Source(CACHE, store)
    cells, skipped = find_cells(store)
    return Source(STORE, store, cells, skipped=skipped)


def _moving_in(store: Store) -> str | None:
    """The manifest of a local commit that a crash left moving in (`finish_commit`), which is the corpus's
    until the next writer finishes it: ``adopt`` killed midway leaves its own files beside the caches."""
    journal = f"{COMMIT}/{MANIFEST}"
    return journal if isinstance(store, LocalStore) and store.head(journal) is not None else None


def find_cells(store: Store) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The cache roots of a tree and the bookkeeping skipped (`cache_tree`). Raises UnknownSourceError: there
    are no cache roots."""
    roots, skipped = cache_tree(store)
    if not roots:
        files = [f for f in _own_files(store) if not foreign(f)]
        shown = ", ".join(files[:_SHOWN]) or "no files at all"
        raise UnknownSourceError(
            f"no {MANIFEST} (a marin corpus) and no {LEDGER} (a Levanter cache) at its root or in any folder "
            f"below it (found: {shown})", path=store.url, expected=[MANIFEST, LEDGER])
    return roots, skipped


def _own_files(store: Store) -> list[str]:
    """The files of a tree but a writer's own (a download's record among them) and the card a Hub repo of
    caches has at its root."""
    return [o.path for o in store.list() if o.path.split("/")[0] not in (LOCK_NAME, STAGING, CHECKED)
            and o.path != CARD]


def cache_tree(store: Store) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The cache roots of a tree: folders holding a ``shard_ledger.json`` that no other cache root holds
    (a sharded cache's sub-caches have ledgers too); () when there are none. Every other file must lie
    inside one of them (Marin's ``.stats.json`` sits inside its cache's root) or be other tools' bookkeeping
    (`foreign`), skipped and returned second (sorted, each bookkeeping folder once).

    Raises:
        UnknownSourceError: files outside every cache, or a cache folder that cannot name a subset.
    """
    listed = _own_files(store)
    files = [p for p in listed if not foreign(p)]
    skipped = tuple(sorted({foreign(p) or "" for p in listed} - {""}))
    ledgers = sorted({str(PurePosixPath(p).parent) for p in files if PurePosixPath(p).name == LEDGER})
    roots: list[str] = []
    for folder in ledgers:  # sorted: a root comes before the folders inside it
        if not any(folder.startswith(r + "/") for r in roots):
            roots.append(folder)
    if not roots:
        return (), skipped
    stray = [p for p in files if not any(p.startswith(r + "/") for r in roots)]
    if stray:
        raise UnknownSourceError(
            f"{len(stray)} files lie outside every Levanter cache of this tree ({', '.join(stray[:_SHOWN])}"
            f"{', ...' if len(stray) > _SHOWN else ''}): a store holds only cache folders",
            path=store.url, actual=stray[:_SHOWN])
    for r in roots:
        try:
            check_subset_name(r, store.url)
        except InvalidManifestError as e:
            raise UnknownSourceError(f"the cache folder {r!r} cannot name a subset (letters, digits, _ . - = "
                                     "and / only)", path=store.url, actual=r) from e
    return tuple(roots), skipped
