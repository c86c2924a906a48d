"""The structural checks Levanter never makes, each finding a `Problem` naming the file.

Metadata (always): the ledgers finished, every sub-cache's ``.success``, sub-cache totals adding up to the
top ledger, ``.stats.json`` agreeing, the arrays' element types. Offsets (always; every offsets chunk
file is decoded): ``offsets[0]`` = rows, non-decreasing, the last = the ledger's token count. Data
(always): every chunk file of ``[0, tokens)`` present (`open_cache` refuses a cell whose ledger counts more
than its listed chunk files hold) with an index that passes its crc32c and names ranges covering the file's
data part. Tokens (``tokens=True``; every data chunk decoded): ids in ``[0, vocab_size)`` and, with
``expect_bos``, every non-empty document starting with it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from marin_data.corpus.verify import Problem, ProblemKind
from marin_data.errors import CacheCheckError, CacheFormatError, CacheUnfinishedError, RemoteError
from marin_data.levanter.cache import CachePart, LevanterCache, max_chunk_file_bytes
from marin_data.levanter.chunkfile import read_index
from marin_data.levanter.ledger import LEDGER, SHARDED, STATS, SUCCESS, TOKENS_FIELD, parse_stats
from marin_data.transfer.read import join, read_file, read_tail
from marin_data.ui import plural

__all__ = ["TOKEN_DTYPES", "check_cache", "read_stats", "refuse_problems", "stats_mismatches"]

TOKEN_DTYPES = ("int32", "int64")  # what Levanter's token caches hold


def check_cache(cache: LevanterCache, *, tokens: bool = False, vocab_size: int | None = None,
                expect_bos: int | None = None, on_bytes: Callable[[int], None] | None = None) -> list[Problem]:
    """Every structural finding on ``cache`` (opened with ``require_finished=False`` so that an unfinished
    one is reported, not refused). Paths are relative to the cache's store."""
    problems = _ledgers(cache) + _stats(cache)
    for part in cache.parts:
        problems += _dtypes(part)
        ends, found = _offsets(cache, part)
        problems += found
        problems += _chunk_files(cache, part, tokens=tokens, vocab_size=vocab_size,
                                 starts=_starts(ends) if expect_bos is not None and ends is not None else None,
                                 expect_bos=expect_bos, on_bytes=on_bytes)
    return problems


def refuse_problems(problems: list[Problem], where: str) -> None:
    """Raise for structural findings before anything is written (the first five in the message): a writer
    never finished a cache (`CacheUnfinishedError`), a file is missing or damaged (`CacheFormatError`), or the
    cache contradicts itself (`CacheCheckError`, listing them all)."""
    if not problems:
        return
    listing = "; ".join(f"{p.path}: {p.message}" for p in problems[:5])
    message = f"{plural(len(problems), 'structural problem')}, nothing written: {listing}"
    kinds = {p.kind for p in problems}
    if ProblemKind.UNFINISHED in kinds:
        raise CacheUnfinishedError(message, path=where)
    if ProblemKind.BAD_CACHE_FILE in kinds:
        raise CacheFormatError(message, path=where)
    raise CacheCheckError(message, path=where, problems=problems)


def _p(path: str, kind: ProblemKind, message: str, expected=None, actual=None) -> Problem:
    return Problem(path, kind, message, expected=expected, actual=actual)


def _ledgers(cache: LevanterCache) -> list[Problem]:
    top = join(cache.prefix, LEDGER)
    found = []
    if not cache.ledger.is_finished:
        found.append(_p(top, ProblemKind.UNFINISHED, "the ledger says is_finished: false"))
    if cache.ledger.layout != SHARDED:
        return found
    rows = tokens = 0
    for part in cache.parts:
        name = part.prefix[len(cache.prefix):].strip("/")
        if not part.ledger.is_finished:
            found.append(_p(join(part.prefix, LEDGER), ProblemKind.UNFINISHED, "the sub-cache's ledger says "
                                                                                "is_finished: false"))
        if not part.has_success:
            found.append(_p(join(part.prefix, SUCCESS), ProblemKind.UNFINISHED,
                            "missing: the sub-cache's writer never marked it finished"))
        listed = cache.ledger.shard_rows.get(name)
        if listed != part.rows:
            found.append(_p(top, ProblemKind.COUNT_MISMATCH, f"shard_rows[{name!r}] is {listed}, the sub-cache "
                                                             f"has {part.rows} rows", part.rows, listed))
        counted = cache.ledger.field_counts_by_shard.get(name, {}).get(TOKENS_FIELD)
        if counted is not None and counted != part.tokens:
            found.append(_p(top, ProblemKind.COUNT_MISMATCH, f"field_counts_by_shard[{name!r}] is {counted} "
                                                             f"tokens, the sub-cache has {part.tokens}",
                            part.tokens, counted))
        rows, tokens = rows + part.rows, tokens + part.tokens
    if len(set(cache.ledger.finished_shards)) != len(cache.ledger.finished_shards):
        found.append(_p(top, ProblemKind.COUNT_MISMATCH, "finished_shards names a sub-cache twice"))
    if rows != cache.ledger.total_num_rows:
        found.append(_p(top, ProblemKind.COUNT_MISMATCH, f"total_num_rows is {cache.ledger.total_num_rows}, the "
                                                         f"sub-caches add up to {rows}", rows,
                        cache.ledger.total_num_rows))
    if cache.ledger.tokens != tokens:
        found.append(_p(top, ProblemKind.COUNT_MISMATCH, f"field_counts says {cache.ledger.tokens} tokens, the "
                                                         f"sub-caches add up to {tokens}", tokens,
                        cache.ledger.tokens))
    return found


def read_stats(cache: LevanterCache) -> dict[str, int] | None:
    """Marin's ``.stats.json`` beside the cache's ledger (`parse_stats`), None when there is none.

    Raises:
        CacheFormatError: it is malformed or larger than such a file may be.
    """
    data = read_file(cache.store, join(cache.prefix, STATS), limit=1 << 20)
    return None if data is None else parse_stats(data, cache.where(join(cache.prefix, STATS)))


def stats_mismatches(cache: LevanterCache, stats: dict[str, int]) -> dict[str, tuple[int, int | None]]:
    """The fields of ``stats`` (`read_stats`) that contradict the ledger: name -> (stated, the ledger's)."""
    want = {"total_tokens": cache.ledger.tokens, "total_elements": cache.ledger.total_num_rows}
    return {k: (v, want[k]) for k, v in stats.items() if v != want[k]}


def _stats(cache: LevanterCache) -> list[Problem]:
    path = join(cache.prefix, STATS)
    try:
        stats = read_stats(cache)
    except CacheFormatError as e:
        return [_p(path, ProblemKind.BAD_CACHE_FILE, e.message)]
    return [_p(path, ProblemKind.STATS_MISMATCH, f"{k} is {v}, the ledger says {want}", want, v)
            for k, (v, want) in stats_mismatches(cache, stats or {}).items()]


def _dtypes(part: CachePart) -> list[Problem]:
    found = []
    if part.data.dtype not in TOKEN_DTYPES:
        found.append(_p(join(part.prefix, "input_ids/data/zarr.json"), ProblemKind.WRONG_DTYPE,
                        f"tokens are {part.data.dtype}; a token cache holds int32 or int64", TOKEN_DTYPES,
                        part.data.dtype))
    if part.offsets.dtype != "int64":
        found.append(_p(join(part.prefix, "input_ids/offsets/zarr.json"), ProblemKind.WRONG_DTYPE,
                        f"offsets are {part.offsets.dtype}, not int64", "int64", part.offsets.dtype))
    return found


def _offsets(cache: LevanterCache, part: CachePart) -> tuple[np.ndarray | None, list[Problem]]:
    """The documents' end offsets (``[rows]``), or None when they cannot be read, and the findings."""
    pieces = []
    for chunk in part.offsets_chunks():
        try:
            pieces.append(cache.read_chunk(chunk, part.offsets))
        except CacheFormatError as e:
            return None, [_p(chunk.path, ProblemKind.BAD_CACHE_FILE, e.message)]
    values = np.concatenate(pieces)
    first = part.offsets_chunks()[0].path
    found = []
    if values[0] != part.rows:
        found.append(_p(first, ProblemKind.BAD_OFFSETS, f"offsets[0] is {values[0]}, the ledger says {part.rows} "
                                                        "rows", part.rows, int(values[0])))
    ends = values[1:]
    drops = np.flatnonzero(np.diff(ends) < 0) if len(ends) else []
    if len(ends) and ends[0] < 0:
        found.append(_p(first, ProblemKind.BAD_OFFSETS, f"row 0 ends at {ends[0]}", actual=int(ends[0])))
    if len(drops):
        i = int(drops[0]) + 1
        found.append(_p(first, ProblemKind.BAD_OFFSETS, f"offsets decrease: row {i} ends at {ends[i]}, before row "
                                                        f"{i - 1}'s end {ends[i - 1]} ({len(drops)} such rows)"))
    last = int(ends[-1]) if len(ends) else 0
    if last != part.tokens:
        found.append(_p(first, ProblemKind.BAD_OFFSETS, f"the last offset is {last}, the ledger counts "
                                                        f"{part.tokens} tokens", part.tokens, last))
    return (None if found else ends), found


def _starts(ends: np.ndarray) -> np.ndarray:
    """The first token of every non-empty document."""
    starts = np.concatenate([[0], ends[:-1]])
    return starts[ends > starts]


def _chunk_files(cache: LevanterCache, part: CachePart, *, tokens: bool, vocab_size: int | None,
                 starts: np.ndarray | None, expect_bos: int | None,
                 on_bytes: Callable[[int], None] | None) -> list[Problem]:
    found = []
    for chunk in part.data_chunks():
        try:
            if tokens:
                values = cache.read_chunk(chunk, part.data)
                if on_bytes:
                    on_bytes(values.nbytes)
            else:
                _check_index(cache, part, chunk.path)
                continue
        except CacheFormatError as e:
            found.append(_p(chunk.path, ProblemKind.BAD_CACHE_FILE, e.message))
            continue
        bad = np.flatnonzero((values < 0) | (values >= vocab_size)) if vocab_size else np.flatnonzero(values < 0)
        if len(bad):
            i = int(bad[0])
            found.append(_p(chunk.path, ProblemKind.OUT_OF_VOCAB,
                            f"token {chunk.start + i} is {values[i]}, outside the vocabulary [0, {vocab_size}) "
                            f"({len(bad)} such tokens in this chunk file)", vocab_size, int(values[i])))
        if starts is not None:
            here = starts[(starts >= chunk.start) & (starts < chunk.stop)] - chunk.start
            wrong = here[values[here] != expect_bos]
            if len(wrong):
                found.append(_p(chunk.path, ProblemKind.MISSING_BOS,
                                f"{len(wrong)} of its {len(here)} documents do not start with BOS {expect_bos} "
                                f"(the first at token {chunk.start + int(wrong[0])} is {values[wrong[0]]})",
                                expect_bos, int(values[wrong[0]])))
    return found


def _check_index(cache: LevanterCache, part: CachePart, path: str) -> None:
    info = cache.store.head(path)
    if info is None:
        raise CacheFormatError("chunk file missing (Levanter would read zeros in its place)", path=cache.where(path))
    if info.size > max_chunk_file_bytes(part.data):
        raise CacheFormatError(f"{info.size} bytes: more than a chunk file of this array can hold",
                               path=cache.where(path))
    try:
        tail = read_tail(cache.store, path, info.size, part.data.index_bytes)
    except RemoteError as e:
        raise CacheFormatError(f"cannot be read: {e}", path=cache.where(path)) from e
    read_index(tail, info.size, part.data, cache.where(path))
