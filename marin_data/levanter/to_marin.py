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
import shutil
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath

import numpy as np

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.corpus.build import DEFAULT_SHARD_TOKENS, check_corpus, place_shards, remove_staging
from marin_data.corpus.commit import commit_corpus, finish_commit
from marin_data.corpus.manifest import Corpus, Manifest, load_corpus, shards_fingerprint
from marin_data.corpus.foreign import foreign
from marin_data.corpus.markers import canonical, read_marker
from marin_data.corpus.names import as_subset_name, check_subset_name, select_subsets
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import ShardStats, ShardWriter, shard_path
from marin_data.corpus.sources import check_recorded, sources_path
from marin_data.engines.local import default_workers
from marin_data.errors import CacheCheckError, InvalidManifestError, InvalidTokenizerError, UnknownSubsetError, \
    UnsupportedFormatError
from marin_data.layout import MANIFEST, SHARDS_INDEX, STAGING, SUMS, TOKENIZER
from marin_data.levanter.arraymeta import render_array_meta
from marin_data.levanter.cache import CachePart, ChunkFile, LevanterCache, open_cache
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
from marin_data.stores.local import LocalStore

__all__ = ["convert_to_marin", "convert_found_to_marin"]

_DONE = "done.json"  # a cell's staging: every shard written, their stats in order


@dataclass(frozen=True)
class _Cell:
    """One cell to convert: its subset name, its layout, how its values are read, and what it holds."""

    subset: str
    cache: LevanterCache
    ends: Callable[[CachePart], np.ndarray]  # a part's document ends (`LevanterCache.document_ends`)
    values: Callable[[CachePart, ChunkFile], np.ndarray]  # one chunk file's values, decoded
    identity: str  # a digest of what the source holds for it: work staged for another is not reused
    license: str = "unknown"  # its license where the source records one (a pinned cache's manifest)


def convert_to_marin(source: str | os.PathLike, *, dest: str | os.PathLike, tokenizer: str | None = None,
                     name: str | None = None, subsets: Sequence[str] | None = None, license: str | None = None,
                     shard_tokens: int = DEFAULT_SHARD_TOKENS, workers: int | None = None,
                     manifest_sha256: str | None = None, **store_options) -> ConvertReport:
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
                                  manifest_sha256=manifest_sha256)


def convert_found_to_marin(found: Source, source: str | os.PathLike, *, dest: str | os.PathLike,
                           tokenizer: str | None = None, name: str | None = None, subsets: Sequence[str] | None = None,
                           license: str | None = None, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                           workers: int | None = None, manifest_sha256: str | None = None) -> ConvertReport:
    """`convert_to_marin` of the source ``found`` (`detect`), named ``source``."""
    t0 = time.perf_counter()
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be positive, not {shard_tokens}")
    refuse_inside(found, dest)
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
        written = _write_cells(root, todo, info, loaded.info.vocab_size, shard_tokens, workers)
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
                    subsets: Sequence[str] | None) -> tuple[LoadedTokenizer, list[_Cell]]:
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
    return loaded, [_Cell(subset, cache, cache.document_ends, functools.partial(_read_values, cache),
                          _identity(cache, sorted(files.get(subset, ()))))
                    for subset, cache in caches.items()]


def _read_values(cache: LevanterCache, part: CachePart, chunk: ChunkFile) -> np.ndarray:
    return cache.read_chunk(chunk, part.data)


def _pinned_cells(found: Source, *, tokenizer: str | None, name: str | None, subsets: Sequence[str] | None,
                  manifest_sha256: str | None) -> tuple[LoadedTokenizer, list[_Cell], str]:
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
        out.append(_Cell(name or subset, cells.cache(subset), functools.partial(cells.ends, subset),
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


def _write_cells(root: Path, cells: Sequence[_Cell], info: TokenizerInfo, vocab: int, shard_tokens: int,
                 workers: int | None) -> dict[str, tuple[list[str], list[ShardStats]]]:
    """Every cell's shards staged, ``workers`` cells at once: subset -> (staged paths, their stats)."""
    def one(cell: _Cell, run: Run) -> tuple[list[str], list[ShardStats]]:
        key = hashlib.sha256(f"{cell.identity} {shard_tokens} {info.sha256}".encode()).hexdigest()[:16]
        return _write_cell(_staging(root, cell.subset), key, cell, info, vocab, shard_tokens, run)

    done = on_threads(one, cells, workers=workers or default_workers(), tokens=sum(c.cache.tokens for c in cells))
    return dict(zip((c.subset for c in cells), done))


def _write_cell(staging: Path, key: str, cell: _Cell, info: TokenizerInfo, vocab: int, shard_tokens: int,
                run: Run) -> tuple[list[str], list[ShardStats]]:
    """One cell's shards in ``staging/levanter-<key>/``, resumed after the shards an earlier run finished."""
    work = staging / f"levanter-{key}"
    for stale in staging.glob("levanter-*") if staging.exists() else ():
        if stale != work:
            shutil.rmtree(stale)  # made from other data or settings
    work.mkdir(parents=True, exist_ok=True)
    done = read_marker(work / _DONE)
    if done is None:
        stats = []
        while (marker := read_marker(_part(work, len(stats)).with_suffix(".json"))) is not None \
                and _part(work, len(stats)).exists():
            stats.append(ShardStats(**marker))
        run.count(sum(s.tokens for s in stats))
        shards = _Shards(work, cell.subset, info, shard_tokens, first=len(stats))
        try:
            for row, tokens, lengths in _documents(cell, sum(s.docs for s in stats), vocab):
                run.check()
                shards.add(row, tokens, lengths)
                run.count(len(tokens))
        except BaseException as e:
            shards.abort(e)
            raise
        stats += shards.close()
        atomic_write_bytes(work / _DONE, canonical({"shards": [asdict(s) for s in stats]}))
    else:
        stats = [ShardStats(**s) for s in done["shards"]]
        run.count(sum(s.tokens for s in stats))
    return [str(_part(work, n)) for n in range(len(stats))], stats


def _part(work: Path, n: int) -> Path:
    return work / f"part-{n:05d}.parquet"


def _documents(cell: _Cell, first_row: int, vocab: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """The cell's documents from row ``first_row`` on, chunk file by chunk file: ``(row of the first, tokens
    uint32, lengths)`` of those that end in it. A document crossing chunk files is carried (copied: the chunk
    it began in is dropped) to the one it ends in and given alone; the others are views of their chunk file's
    values. Empty rows keep their place.

    Raises:
        CacheCheckError: a token id outside ``[0, vocab)``.
    """
    base = 0  # rows of the parts before this one
    for part in cell.cache.parts:
        if base + part.rows <= first_row:
            base += part.rows
            continue
        ends = cell.ends(part)
        d = max(0, first_row - base)  # the next row to give
        pos = int(ends[d - 1]) if d else 0  # where it starts in the part's flat tokens
        carry: list[np.ndarray] = []  # its tokens [pos, chunk.start), read from earlier chunk files
        for chunk in part.data_chunks():
            if chunk.stop <= pos:
                continue  # given before a resume
            values = _checked(cell.values(part, chunk), vocab, cell.cache.where(chunk.path), chunk.start)
            at = max(pos, chunk.start)  # the flat position of values[0] from here on
            values = values[at - chunk.start:]
            e = int(np.searchsorted(ends, chunk.stop, "right"))  # rows [d, e) end by the chunk's end
            if carry:  # row d began in an earlier chunk file
                if e == d:
                    carry.append(values.copy())  # and goes on past this one
                    continue
                yield base + d, np.concatenate([*carry, values[:int(ends[d]) - at]]), np.array([ends[d] - pos])
                carry, pos, d = [], int(ends[d]), d + 1
            if e > d:
                stop = int(ends[e - 1])
                yield base + d, values[pos - at:stop - at], np.diff(ends[d:e], prepend=pos)
                pos, d = stop, e
            if len(rest := values[pos - at:]):
                carry.append(rest.copy())
        if d < part.rows:  # rows ending at the part's last token (empty rows, or a part with no tokens)
            yield base + d, np.zeros(0, np.uint32), np.diff(ends[d:], prepend=pos)
        base += part.rows


def _checked(values: np.ndarray, vocab: int, where: str, start: int) -> np.ndarray:
    """``values`` as uint32 once every one lies in ``[0, vocab)``; else `CacheCheckError` naming the first."""
    bad = np.flatnonzero((values < 0) | (values >= vocab)) if values.size else values
    if len(bad):
        i = int(bad[0])
        raise CacheCheckError(f"token {start + i} is {values[i]}, outside the tokenizer's vocabulary [0, {vocab}) "
                              f"({len(bad)} such tokens in this chunk file); nothing was committed", path=where)
    return values.view(np.uint32) if values.dtype.itemsize == 4 else values.astype(np.uint32)


class _Shards:
    """A cell's documents cut into shards as they arrive, the cut `marin-data shard` makes: a shard closes when
    the next document does not fit in ``shard_tokens``, and a longer document gets a shard of its own. Each
    shard is written to ``work/part-NNNNN.parquet`` with its done marker beside it, numbered from ``first``."""

    def __init__(self, work: Path, subset: str, info: TokenizerInfo, shard_tokens: int, *, first: int) -> None:
        self.work, self.subset, self.info, self.shard_tokens = work, subset, info, shard_tokens
        self.n = first
        self.writer: ShardWriter | None = None
        self.filled = 0
        self.stats: list[ShardStats] = []

    def add(self, row: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Documents ``row``, ``row + 1``... (``lengths``, their ``tokens`` concatenated)."""
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        i = 0
        while i < len(lengths):
            j = int(np.searchsorted(offsets, offsets[i] + self.shard_tokens - self.filled, "right")) - 1
            if j == i and self.filled == 0:
                j = i + 1  # longer than a shard
            if j > i:
                if self.writer is None:
                    shard_path(self.subset, self.n)  # refuses a subset of more shards than a Hub folder holds
                    self.writer = ShardWriter(_part(self.work, self.n), self.info)
                self.writer.write([f"{self.subset}:{r}" for r in range(row + i, row + j)],
                                  tokens[offsets[i]:offsets[j]], offsets[i:j + 1] - offsets[i])
                self.filled += int(offsets[j] - offsets[i])
                i = j
            if i < len(lengths):
                self._close()

    def close(self) -> list[ShardStats]:
        """Close the last shard; the stats of every shard written here."""
        if self.writer is not None:
            self._close()
        return self.stats

    def abort(self, error: BaseException) -> None:
        if self.writer is not None:
            self.writer.abort(error)

    def _close(self) -> None:
        stats = self.writer.close()
        atomic_write_bytes(_part(self.work, self.n).with_suffix(".json"), canonical(asdict(stats)))
        self.stats.append(stats)
        self.writer, self.filled, self.n = None, 0, self.n + 1
