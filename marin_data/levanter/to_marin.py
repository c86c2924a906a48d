"""``convert --format marin``: a Levanter cache, or a store of them, into a Parquet corpus.

Each cell becomes one subset: its rows, in row order, are the subset's documents (id ``<subset>:<row>``, the
same token ids as uint32), cut into shards of at most ``shard_tokens`` tokens as `marin-data shard` cuts
them, written by the corpus's own `ShardWriter` and committed as a build is (`place_shards`, the record
``sources/<subset>.json`` of where it came from, `commit_corpus`: the manifest last). Nothing is written
before the source passes its checks: the structural checks for an unpinned cache, for a pinned one the
SHA-256 of every file as it is read. A cache names no tokenizer, so the caller names it (a pinned one has
its own); every token id must lie inside its vocabulary.

Work in progress lives in ``DEST/.staging/<subset>/levanter-<key>/``, keyed by what the source holds and the
shard size: each shard with its done marker, then ``done.json`` when the cell is whole. A run killed at any
point resumes each cell at its first unfinished shard, and a cell already in the corpus is left as it is
(and refused if it came from other data). docs/design.md, "Converting between the formats".
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.corpus.build import DEFAULT_SHARD_TOKENS, check_corpus, place_shards, remove_staging
from marin_data.corpus.commit import commit_corpus, finish_commit
from marin_data.corpus.manifest import Corpus, Manifest, load_corpus, shards_fingerprint
from marin_data.corpus.foreign import foreign
from marin_data.corpus.markers import canonical
from marin_data.corpus.names import as_subset_name, check_subset_name, select_subsets
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import ShardStats
from marin_data.corpus.sources import check_recorded, sources_path
from marin_data.engines import run_jobs
from marin_data.engines.local import default_workers
from marin_data.errors import InvalidManifestError, NotApplicableError, InvalidTokenizerError, UnknownSubsetError, \
    UnsupportedFormatError
from marin_data.layout import MANIFEST, SHARDS_INDEX, STAGING, SUMS, TOKENIZER
from marin_data.levanter.arraymeta import render_array_meta
from marin_data.levanter.cache import LevanterCache, open_cache
from marin_data.levanter.cell_shards import Cell, CellWork, read_values, write_cell
from marin_data.levanter.cells import PinnedCells
from marin_data.levanter.checks import refuse_problems
from marin_data.levanter.convert import MARIN, ConvertReport, Run, on_threads, refuse_inside
from marin_data.levanter.detect import CACHE, CORPUS, Source, detect
from marin_data.levanter.ledger import render_ledger
from marin_data.levanter.pinned import cell_prefixes
from marin_data.corpus.readers import LocalFiles
from marin_data.levanter.verify import REMOTE_WORKERS, check_cells
from marin_data.fileio.lock import corpus_lock
from marin_data.raw.tokenizer import LoadedTokenizer, TokenizerInfo, load_tokenizer, tokenizer_from_bytes
from marin_data.stores.base import Store
from marin_data.stores.local import LocalStore
from marin_data.transfer.rehash import run_job

__all__ = ["convert_to_marin", "convert_found_to_marin"]

def convert_to_marin(source: str | os.PathLike, *, dest: str | os.PathLike, tokenizer: str | None = None,
                     name: str | None = None, subsets: Sequence[str] | None = None, license: str | None = None,
                     shard_tokens: int = DEFAULT_SHARD_TOKENS, workers: int | None = None,
                     manifest_sha256: str | None = None, engine: str = "local", engine_address: str | None = None,
                     **store_options) -> ConvertReport:
    """Convert the Levanter cache or store at ``source`` into subsets of the corpus at ``dest``.

    Args:
        source: a local path, ``s3://...`` or ``hf://datasets/...`` (options as `open_store`); a pinned cache
            or store (`marin_data.levanter.adopt`) is read from local disk, every file checked against the pin.
        dest: the corpus (created; an existing one gains the subsets, if its tokenizer is the same).
        tokenizer: what the cache was built with (a ``tokenizer.json`` path or a Hub repo id); a pinned
            source has its own and takes none.
        name: the subset of a single cache (default: its folder's name); a store's subsets are its cells.
        subsets: cell names or globs of a store (default: all).
        license: the SPDX id recorded for each new subset (default: a pinned source's own, subset by subset;
            else ``unknown``). A new corpus made from a pinned source takes its name.
        shard_tokens: the most tokens a shard holds (a longer document gets a shard of its own).
        workers: cells converted at once, each on a thread holding one decoded chunk file (0.5 GiB of int32 at
            Levanter's grid, 1.5 GiB of int64 with its uint32 copy) and a row group (default: one per core).
        manifest_sha256: a pinned source's manifest must have this sha256.
        engine, engine_address: where the cells are written (`marin_data.engines`): ``"local"`` on threads
            here, ``"ray"`` one Ray task per cell of an unpinned source (each opening the source again, with
            ``store_options``, and writing into ``dest``, which every node must see): the same bytes.

    Raises:
        UnknownSourceError: no cache at ``source``; UnsupportedFormatError: a Parquet corpus, or a pinned
            source that is not local.
        InvalidTokenizerError: no tokenizer for an unpinned cache, or one for a pinned one.
        CacheFormatError, CacheUnfinishedError, CacheCheckError: a structural check failed (nothing written),
            or a token id outside the vocabulary (the corpus unchanged).
        ShardChecksumError, ShardMissingError: a pinned file differs from its pin or is missing.
        TokenizerMismatchError: ``dest`` has another tokenizer; CorpusConflictError: it holds the subset made
            from other data, or is a folder that is no corpus; ConvertConflictError: it lies inside the source.
    """
    return convert_found_to_marin(detect(source, **store_options), source, dest=dest, tokenizer=tokenizer, name=name,
                                  subsets=subsets, license=license, shard_tokens=shard_tokens, workers=workers,
                                  manifest_sha256=manifest_sha256, engine=engine, engine_address=engine_address,
                                  store_options=store_options)


def convert_found_to_marin(found: Source, source: str | os.PathLike, *, dest: str | os.PathLike,
                           tokenizer: str | None = None, name: str | None = None, subsets: Sequence[str] | None = None,
                           license: str | None = None, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                           workers: int | None = None, manifest_sha256: str | None = None, engine: str = "local",
                           engine_address: str | None = None,
                           store_options: dict[str, Any] | None = None) -> ConvertReport:
    """`convert_to_marin` of the source ``found`` (`detect`), named ``source``, opened with ``store_options``."""
    t0 = time.perf_counter()
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be positive, not {shard_tokens}")
    refuse_inside(found, dest)
    if engine != "local" and found.kind == CORPUS:
        raise NotApplicableError("--engine ray converts the cells of a cache nobody pinned; a pinned one is "
                                 "converted here, every file read through its pin")
    if manifest_sha256 and found.kind != CORPUS:
        raise InvalidManifestError("a Levanter cache has no manifest to pin until it is adopted: pass no "
                                   "manifest sha256", path=str(source))
    if found.kind == CORPUS:
        loaded, cells, corpus_name = _pinned_cells(found, tokenizer=tokenizer, name=name, subsets=subsets,
                                                   manifest_sha256=manifest_sha256)
    else:
        (loaded, cells), corpus_name = _unpinned_cells(found, source, tokenizer=tokenizer, name=name,
                                                       subsets=subsets), None
    empty = tuple(c.subset for c in cells if c.cache.rows == 0)
    cells = [c for c in cells if c.cache.rows]
    root = Path(dest)
    with corpus_lock(root):
        finish_commit(root)  # a commit a crash interrupted is finished first
        existing = load_corpus(root) if (root / MANIFEST).exists() else None
        info = check_corpus(root, existing, loaded, name=None, version=None, extra_files=())
        recipes = {c.subset: {"format": 1, "levanter_cache": c.identity, "shard_tokens": shard_tokens}
                   for c in cells}
        have = existing.manifest.subsets if existing else {}
        reused = tuple(sorted(c.subset for c in cells if c.subset in have))
        for subset in reused:
            check_recorded(root, subset, recipes[subset])  # the same data, or a CorpusConflictError
        todo = [c for c in cells if c.subset not in have]
        if not todo:
            return ConvertReport(str(source), str(dest), MARIN, (), reused, empty, 0, 0, 0, 0,
                                 time.perf_counter() - t0, existing.manifest_sha256 if existing else "")
        written = _write_cells(root, todo, info, loaded.info.vocab_size, shard_tokens, workers,
                               engine=(engine, engine_address, found.store, store_options or {}))
        if existing is None:
            atomic_write_bytes(root / TOKENIZER, loaded.data, root=root)
        records = []
        for c in todo:
            staged, stats = written[c.subset]
            records += place_shards(root, c.subset, staged, stats)
            record = {**recipes[c.subset], "source": str(source), "cell": c.cache.prefix, "subset": c.subset,
                      "tokenizer_sha256": info.sha256, "docs": sum(s.docs for s in stats),
                      "tokens": sum(s.tokens for s in stats)}
            atomic_write_bytes(root / sources_path(c.subset), canonical(record), root=root)
        digest = _commit(root, existing, info, {c.subset: license or c.license for c in todo}, records,
                         name=corpus_name)
    return ConvertReport(str(source), str(dest), MARIN, tuple(c.subset for c in todo), reused, empty,
                         docs=sum(r.docs for r in records), tokens=sum(r.tokens for r in records),
                         files=len(records), bytes=sum(r.bytes for r in records),
                         seconds=time.perf_counter() - t0, manifest_sha256=digest)


def _commit(root: Path, existing: Corpus | None, info: TokenizerInfo, licenses: dict[str, str],
            records: list[ShardRecord], *, name: str | None = None) -> str:
    """Commit the new subsets (their shards placed, their records written) into the corpus (a new one named
    ``name``, default its folder's), the manifest last; drop their staging. Returns the manifest's sha256."""
    manifest = existing.manifest if existing else Manifest(name=name or root.resolve().name, version="0.1.0",
                                                           tokenizer=info)
    manifest = replace(manifest, subsets={**manifest.subsets,
                                          **{s: SubsetInfo(0, 0, 0, 0, license=lic) for s, lic in licenses.items()}})
    kept = [f for f in manifest.files if f not in (TOKENIZER, SHARDS_INDEX, SUMS)]
    digest = commit_corpus(root, manifest, [*(existing.shards if existing else ()), *records],
                           extra_files=sorted({*kept, *map(sources_path, licenses)}))
    for subset in licenses:
        remove_staging(root, _staging(root, subset))
    return digest


# --- the source's cells ----------------------------------------------------------------------------------
def _unpinned_cells(found: Source, source: str | os.PathLike, *, tokenizer: str | None, name: str | None,
                    subsets: Sequence[str] | None) -> tuple[LoadedTokenizer, list[Cell]]:
    """An unpinned cache's or store's selected cells, opened after the structural checks pass."""
    if tokenizer is None:
        raise InvalidTokenizerError("a Levanter cache carries no tokenizer: name the one it was built with",
                                    path=str(source))
    if found.kind == CACHE:
        if subsets:
            raise UnknownSubsetError("--subset selects cells of a store; this is one cache", actual=list(subsets))
        prefixes = {_single_name(name, source): ""}
    else:
        if name:
            raise UnknownSubsetError("a name is given to the one subset of a single cache; a store's subsets are "
                                     "its cells", path=str(source), actual=name)
        prefixes = {c: c for c in select_subsets(found.cells, subsets, what="cell")}
    loaded = load_tokenizer(tokenizer)
    problems, _, _ = check_cells(found.store, prefixes, vocab_size=loaded.info.vocab_size)
    refuse_problems(problems, str(source))
    cell_of = {p: c for c, p in prefixes.items()}
    files: dict[str, list[str]] = {}  # cell -> "path size sha256" of each of its files
    listed = (o for o in found.store.list() if not foreign(o.path))  # other tools' bookkeeping is no cell's
    for o in listed:  # a single cache ("") holds every file; a store's cell, those below it
        folder = next((str(f) for f in PurePosixPath(o.path).parents if str(f) in cell_of),
                      "" if "" in cell_of else None)
        if folder is not None:
            files.setdefault(cell_of[folder], []).append(f"{o.path[len(folder):]} {o.size} {o.sha256 or ''}")
    local = isinstance(found.store, LocalStore)
    with ThreadPoolExecutor(max_workers=max(1, min(default_workers() if local else REMOTE_WORKERS,
                                                   len(prefixes)))) as pool:
        caches = dict(zip(prefixes, pool.map(lambda p: open_cache(found.store, p), prefixes.values())))
    return loaded, [Cell(subset, cache, cache.document_ends, functools.partial(read_values, cache),
                          _identity(cache, sorted(files.get(subset, ()))))
                    for subset, cache in caches.items()]


def _pinned_cells(found: Source, *, tokenizer: str | None, name: str | None, subsets: Sequence[str] | None,
                  manifest_sha256: str | None) -> tuple[LoadedTokenizer, list[Cell], str]:
    """A pinned cache's selected cells (each with its license), every file read through the pin
    (`LocalFiles`), and the pinned corpus's name."""
    where = found.store.url
    if not found.pinned_cache:
        raise UnsupportedFormatError("a marin corpus of Parquet shards already: nothing to convert to marin",
                                     path=where)
    if not isinstance(found.store, LocalStore):
        raise UnsupportedFormatError("a pinned cache is converted from local disk: `marin-data download` the cells "
                                     "you want first (every file checked), then convert the copy", path=where)
    if tokenizer is not None:
        raise InvalidTokenizerError("a pinned cache converts with its own tokenizer: pass none", path=where)
    corpus = load_corpus(found.store.root, manifest_sha256=manifest_sha256)
    reader = LocalFiles(corpus.root)
    loaded = tokenizer_from_bytes((corpus.root / TOKENIZER).read_bytes(), corpus.manifest.tokenizer,
                                  where=str(corpus.root / TOKENIZER))
    prefixes = cell_prefixes(corpus.manifest)
    single = len(prefixes) == 1 and not next(iter(prefixes.values()))
    if name and not single:
        raise UnknownSubsetError("a name is given to the one subset of a single cache; a store's subsets are its "
                                 "cells", path=where, actual=name)
    if name:
        check_subset_name(name, "the name given")
    chosen = select_subsets(prefixes, subsets, what="cell")
    cells = PinnedCells(corpus, reader)
    cells.chunks_of(chosen)  # the index lists exactly each cache's chunk files, with the ledger's token counts
    out = []
    for subset in chosen:
        rows = [r for r in corpus.shards if r.subset == subset]
        out.append(Cell(name or subset, cells.cache(subset), functools.partial(cells.ends, subset),
                         functools.partial(cells.values, subset),
                         shards_fingerprint(rows, corpus.manifest.tokenizer.sha256),
                         corpus.manifest.subsets[subset].license))
    return loaded, out, corpus.manifest.name


def _single_name(name: str | None, source: str | os.PathLike) -> str:
    """The subset of a single cache: ``name``, or its folder's (the last part of a URL)."""
    if name:
        check_subset_name(name, "the name given")
        return name
    text = str(source).rstrip("/")
    return as_subset_name(PurePosixPath(text).name if "://" in text else Path(text).resolve().name)


def _identity(cache: LevanterCache, files: list[str]) -> str:
    """What an unpinned cell holds, as a digest: its ledgers and array specs, and every file's size (and the
    store's SHA-256 where it keeps one). Staged work and a converted subset are reused only under it."""
    h = hashlib.sha256(render_ledger(cache.ledger))
    for part in cache.parts:
        h.update(render_ledger(part.ledger) + render_array_meta(part.data) + render_array_meta(part.offsets))
    h.update("\n".join(files).encode())
    return h.hexdigest()


# --- writing -----------------------------------------------------------------------------------------------
def _staging(root: Path, subset: str) -> Path:
    return root / STAGING / urllib.parse.quote(subset, safe="")


def _write_cells(root: Path, cells: Sequence[Cell], info: TokenizerInfo, vocab: int, shard_tokens: int,
                 workers: int | None, *, engine: tuple[str, str | None, Store, dict[str, Any]]
                 ) -> dict[str, tuple[list[str], list[ShardStats]]]:
    """Every cell's shards staged, ``workers`` cells at once: subset -> (staged paths, their stats). ``engine``:
    its name and address, and the source's store and options, which a cell's job elsewhere opens again."""
    def key(cell: Cell) -> str:
        return hashlib.sha256(f"{cell.identity} {shard_tokens} {info.sha256}".encode()).hexdigest()[:16]

    def one(cell: Cell, run: Run) -> tuple[list[str], list[ShardStats]]:
        return write_cell(_staging(root, cell.subset), key(cell), cell, info, vocab, shard_tokens, run)

    name, address, store, options = engine
    if name == "local" and address is None:
        done = on_threads(one, cells, workers=workers or default_workers(), tokens=sum(c.cache.tokens for c in cells))
    else:
        opened = tuple(sorted(options.items()))
        jobs = [CellWork(store.reopen_url(), opened, c.subset, c.cache.prefix, c.identity,
                         str(_staging(root, c.subset).resolve()), key(c), info, vocab, shard_tokens) for c in cells]
        done, _ = run_jobs(run_job, jobs, engine=name, workers=workers, address=address)
    return dict(zip((c.subset for c in cells), done))
