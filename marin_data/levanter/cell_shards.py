"""One cell of a Levanter cache written as Parquet shards (`write_cell`), what ``convert --format marin`` does
per cell (`marin_data.levanter.to_marin`), and the same work as plain data (`CellWork`) for an engine.

A cell's documents come chunk file by chunk file (`_documents`: a document crossing chunk files carried to
the one it ends in), every token id checked against the vocabulary, and are cut into shards as
`marin-data shard` cuts them (`_Shards`). Each shard is written under ``staging/levanter-<key>/`` with its
done marker beside it, then ``done.json`` once the cell is whole, so a killed run resumes at the cell's
first unfinished shard. `CellWork` names the cell by its store's URL and options and its cache root, so a
Ray task on another node opens it again and writes the very bytes a thread here would (the destination on
a file system every node sees).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marin_data.corpus.markers import canonical, read_marker
from marin_data.corpus.shard import ShardStats, ShardWriter, shard_path
from marin_data.errors import CacheCheckError
from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.levanter.cache import CachePart, ChunkFile, LevanterCache, open_cache
from marin_data.levanter.convert import Run
from marin_data.raw.tokenizer import TokenizerInfo
from marin_data.transfer.rehash import job_store
from marin_data.ui import progress

__all__ = ["Cell", "CellWork", "read_values", "write_cell"]

_DONE = "done.json"  # a cell's staging: every shard written, their stats in order


@dataclass(frozen=True)
class Cell:
    """One cell to convert: its subset name, its layout, how its values are read, and what it holds."""

    subset: str
    cache: LevanterCache
    ends: Callable[[CachePart], np.ndarray]  # a part's document ends (`LevanterCache.document_ends`)
    values: Callable[[CachePart, ChunkFile], np.ndarray]  # one chunk file's values, decoded
    identity: str  # a digest of what the source holds for it: work staged for another is not reused
    license: str = "unknown"  # its license where the source records one (a pinned cache's manifest)


def read_values(cache: LevanterCache, part: CachePart, chunk: ChunkFile) -> np.ndarray:
    return cache.read_chunk(chunk, part.data)


def write_cell(staging: Path, key: str, cell: Cell, info: TokenizerInfo, vocab: int, shard_tokens: int,
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


def _documents(cell: Cell, first_row: int, vocab: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
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


@dataclass(frozen=True)
class CellWork:
    """`write_cell` of one unpinned cell as plain data: the cell ``subset`` at ``prefix`` of the store at
    ``url`` (opened with ``options``, sorted pairs), staged under ``staging`` with ``key``. Calling it (in any
    process) opens the cell again and returns ``(staged paths, their stats)``."""

    url: str
    options: tuple[tuple[str, Any], ...]
    subset: str
    prefix: str
    identity: str
    staging: str
    key: str
    info: TokenizerInfo
    vocab: int
    shard_tokens: int

    def __call__(self) -> tuple[list[str], list[ShardStats]]:
        cache = open_cache(job_store(self.url, self.options), self.prefix)
        cell = Cell(self.subset, cache, cache.document_ends, lambda part, chunk: read_values(cache, part, chunk),
                    self.identity)
        with progress(None, "", disable=True) as bar:  # a task elsewhere moves no bar here
            return write_cell(Path(self.staging), self.key, cell, self.info, self.vocab, self.shard_tokens, Run(bar))
