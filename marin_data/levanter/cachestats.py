"""Statistics of a Levanter cache or store for its documentation: the `CorpusStats` a Parquet corpus gets, and
what only a cache has (its layout, token type, codec and parts, Marin's registry columns, a first document).

- Totals come from the ledgers (documents, tokens) and the files (bytes; data chunk files count as shards).
- Document lengths come from the offsets arrays, every document of every cell, with no token decoded:
  8 bytes a document, streamed one offsets chunk file at a time (`marin_data.levanter.documents`), so memory
  is one decoded chunk file whatever the store's size.
- Exact duplicates and the first document's text need token values: each cell's data chunk files are read up
  to ``scan_tokens`` tokens, above that files spread evenly over the cell (`marin_data.docs.stats.spread`),
  in runs of consecutive files. A document is digested when it lies wholly inside a run (one cut by a run's
  edge is not), hashed piece by piece across the files it spans, so a long document costs no memory;
  `Duplicates.sampled` says which cells were sampled. Every value read is checked against the vocabulary.
- Marin's token-count registry keeps, per source, the columns `REGISTRY_COLUMNS` (docs/design.md, "The
  datasheet of a cache"); a cell shows those its ledger's ``preprocessor_metadata`` has, and
  ``marin_tokens`` from its ``.stats.json``, which is where the registry reads it.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marin_data.corpus.records import SubsetInfo
from marin_data.docs.stats import DIGEST_BYTES, SCAN_TOKENS, CorpusStats, DigestBuckets, LengthStats, SubsetStats, \
    merge_lengths, spread
from marin_data.errors import CacheCheckError
from marin_data.levanter.cache import ChunkFile, LevanterCache
from marin_data.levanter.checks import read_stats, stats_mismatches
from marin_data.levanter.documents import TokenReader, iter_ends
from marin_data.levanter.ledger import LEDGER, STATS
from marin_data.levanter.ledgermeta import ledger_metadata
from marin_data.transfer.read import join
from marin_data.raw.tokenizer import LoadedTokenizer
from marin_data.ui import printable, progress

__all__ = ["REGISTRY_COLUMNS", "FIRST_CHARS", "FirstDocument", "CellFacts", "CacheStats", "registry_columns",
           "cache_stats"]

# The per-source columns of Marin's token-count registry (`experiments/count_tokens.py` in
# marin-community/marin, published as data/token_counts.csv in the Hub dataset marin-community/token-counts).
REGISTRY_COLUMNS = ("marin_name", "marin_tokens", "category", "synthetic", "machine_translated", "pdf", "hf_repo",
                    "hf_subset", "license", "transform_tldr")
FIRST_CHARS = 300  # of the first document scanned in a cell, quoted in the datasheet
_FIRST_TOKENS = 1024  # decoded for it: enough for FIRST_CHARS characters of any text
_SLICE = 1 << 22  # document ends handled at a time: temporaries of ~100 MB at most
_VALUE_CHARS = 200  # of a registry value from the metadata


@dataclass(frozen=True)
class FirstDocument:
    row: int  # its row in the cell
    tokens: int
    text: str  # its first FIRST_CHARS characters, decoded with the tokenizer


@dataclass(frozen=True)
class CellFacts:
    """What a cell is besides its numbers: how it is stored, what its metadata says, what was scanned."""

    name: str
    parts: int
    layout: str  # consolidated or sharded
    dtype: str  # of its token values
    codec: str  # `ArrayMeta.codec`
    registry: dict[str, str]  # `REGISTRY_COLUMNS` found for it
    metadata: dict  # its ledger's preprocessor_metadata ({} when null)
    files_scanned: int  # data chunk files read for digests
    first: FirstDocument | None  # None: no whole document was scanned


@dataclass(frozen=True)
class CacheStats:
    corpus: CorpusStats  # totals, lengths (every document, from the offsets), duplicates (the scanned files)
    cells: tuple[CellFacts, ...]  # in the order of ``corpus.subsets``


def registry_columns(cache: LevanterCache) -> dict[str, str]:
    """The registry columns a cell's metadata has: scalars of its ledger's ``preprocessor_metadata`` (a
    sharded cache's first part's when the top ledger has none), ``marin_tokens`` from ``.stats.json``.

    Raises:
        CacheFormatError: a malformed ``.stats.json``; CacheCheckError: one that contradicts the ledger.
    """
    metadata = ledger_metadata(cache)
    found = {k: printable(metadata[k])[:_VALUE_CHARS] for k in REGISTRY_COLUMNS
             if isinstance(metadata.get(k), (str, int, float, bool)) and k != "marin_tokens"}
    stats = read_stats(cache) or {}
    wrong = stats_mismatches(cache, stats)
    if wrong:
        raise CacheCheckError("; ".join(f"{k} is {v}, the ledger says {want}" for k, (v, want) in wrong.items()),
                              path=cache.where(join(cache.prefix, STATS)))
    if "total_tokens" in stats:
        found["marin_tokens"] = str(stats["total_tokens"])
    return {k: found[k] for k in REGISTRY_COLUMNS if k in found}


def _check_ledgers(name: str, cache: LevanterCache, expected: SubsetInfo | None) -> None:
    """The top ledger adds up its parts (a sharded cache), and agrees with a pinned manifest's totals."""
    rows, tokens = sum(p.rows for p in cache.parts), cache.tokens
    if (rows, tokens) != (cache.rows, cache.ledger.tokens if cache.ledger.tokens is not None else tokens):
        raise CacheCheckError(f"the ledger counts {cache.rows} rows and {cache.ledger.tokens} tokens, its parts "
                              f"{rows} and {tokens}", path=cache.where(join(cache.prefix, LEDGER)))
    if expected is not None and (expected.docs, expected.tokens) != (rows, tokens):
        raise CacheCheckError(f"the manifest gives subset {name!r} {expected.docs} documents and {expected.tokens} "
                              f"tokens, its ledgers {rows} and {tokens}: `marin-data verify` names what changed",
                              path=cache.where(join(cache.prefix, LEDGER)))


@dataclass(frozen=True)
class _Run:
    """Consecutive scanned data chunk files of one part: tokens ``[start, stop)``; ``to_end`` when the run
    reaches the part's end (it then also holds the empty documents there)."""

    start: int
    stop: int
    to_end: bool


@dataclass(frozen=True)
class _Plan:
    """What of a cell to digest: runs per part index, how many data chunk files they hold, whether a sample."""

    runs: dict[int, list[_Run]]
    files: int
    sampled: bool

    def expected_docs(self, cache: LevanterCache) -> int:
        """The documents it should digest (to size the digest buckets): all, or a share by tokens scanned,
        doubled since the scanned files may hold shorter documents than the cell's average."""
        if not self.sampled or not cache.tokens:
            return cache.rows
        scanned = sum(r.stop - r.start for runs in self.runs.values() for r in runs)
        return math.ceil(2 * cache.rows * scanned / cache.tokens)


def _plan(cache: LevanterCache, scan_tokens: int) -> _Plan:
    """The cell's data chunk files up to ``scan_tokens`` tokens (`spread`), grouped into runs."""
    chunks: list[tuple[int, ChunkFile]] = [(p, c) for p, part in enumerate(cache.parts) for c in part.data_chunks()]
    picked = spread([c.count for _, c in chunks], scan_tokens)
    if len(picked) == len(chunks):  # everything: whole parts, empty ones too
        return _Plan({p: [_Run(0, part.tokens, True)] for p, part in enumerate(cache.parts)}, len(chunks), False)
    runs: dict[int, list[_Run]] = {}
    for p, c in (chunks[i] for i in picked):
        mine, last = runs.setdefault(p, []), c.stop >= cache.parts[p].tokens
        if mine and mine[-1].stop == c.start:
            mine[-1] = _Run(mine[-1].start, c.stop, last)
        else:
            mine.append(_Run(c.start, c.stop, last))
    return _Plan(runs, len(picked), True)


def _inside(runs: Sequence[_Run], starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which documents ``[starts, ends)`` lie wholly inside one of ``runs`` (sorted, disjoint)."""
    if not runs:
        return np.zeros(len(starts), bool)
    first = np.array([r.start for r in runs], np.int64)
    stop = np.array([r.stop for r in runs], np.int64)
    limit = np.array([np.iinfo(np.int64).max if r.to_end else r.stop for r in runs], np.int64)
    i = np.searchsorted(first, starts, "right") - 1
    j = np.maximum(i, 0)
    return (i >= 0) & (starts < limit[j]) & (ends <= stop[j])


class _Cell:
    """One cell's pass: the length histogram of every document, the digests of the scanned ones."""

    def __init__(self, index: int, cache: LevanterCache, plan: _Plan, digests: DigestBuckets,
                 tokenizer: LoadedTokenizer) -> None:
        self.index, self.cache, self.plan, self.digests, self.tokenizer = index, cache, plan, digests, tokenizer
        self.histogram = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self.docs = self.tokens = 0  # digested
        self.first: FirstDocument | None = None

    def run(self, bar) -> None:
        row = 0
        for p, part in enumerate(self.cache.parts):
            reader = TokenReader(self.cache, part, vocab_size=self.tokenizer.info.vocab_size)
            previous = 0
            for ends in iter_ends(self.cache, part):
                for a in range(0, len(ends), _SLICE):
                    stops = ends[a:a + _SLICE]
                    starts = np.concatenate([[previous], stops[:-1]])
                    previous = int(stops[-1])
                    self.histogram = merge_lengths(self.histogram, stops - starts)
                    self._digest(reader, self.plan.runs.get(p, ()), starts, stops, row + a)
                row += len(ends)
                bar.update(len(ends))

    def _digest(self, reader: TokenReader, runs: Sequence[_Run], starts: np.ndarray, stops: np.ndarray,
                row: int) -> None:
        chosen = np.flatnonzero(_inside(runs, starts, stops))
        if not len(chosen):
            return
        out = []
        for i, a, b in zip(chosen.tolist(), starts[chosen].tolist(), stops[chosen].tolist()):
            h, kept = hashlib.blake2b(digest_size=DIGEST_BYTES), []
            for piece in reader.pieces(a, b):
                h.update(piece)
                if self.first is None and sum(map(len, kept)) < _FIRST_TOKENS:
                    kept.append(piece[:_FIRST_TOKENS])
            out.append(h.digest())
            if self.first is None:
                self._keep_first(row + i, b - a, kept)
        lengths = stops[chosen] - starts[chosen]
        self.digests.add_digests(self.index, b"".join(out), lengths)
        self.docs, self.tokens = self.docs + len(chosen), self.tokens + int(lengths.sum())

    def _keep_first(self, row: int, tokens: int, pieces: list[np.ndarray]) -> None:
        ids = np.concatenate([np.zeros(0, np.uint32), *pieces])[:_FIRST_TOKENS]
        text = self.tokenizer.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
        self.first = FirstDocument(row=row, tokens=tokens, text=text[:FIRST_CHARS])


def cache_stats(cells: dict[str, LevanterCache], *, sizes: dict[str, int], tokenizer: LoadedTokenizer,
                licenses: dict[str, str] | None = None, expected: dict[str, SubsetInfo] | None = None,
                scan_tokens: int = SCAN_TOKENS) -> CacheStats:
    """The statistics of a cache's or store's cells (subset name -> opened cache), as the module says.

    Args:
        sizes: the bytes of each cell's files; licenses: each cell's SPDX id (default ``unknown``).
        tokenizer: what the cells were tokenized with: ids are checked against its vocabulary, and the
            first document scanned in each cell is decoded with it.
        expected: a pinned cache's manifest totals, which each cell's ledgers must equal.
        scan_tokens: per-cell budget of tokens decoded for duplicates and the first document (0: all).

    Raises:
        CacheFormatError: a file of a cell missing or unreadable; CacheCheckError: a cell contradicts itself,
            its manifest or the tokenizer's vocabulary.
    """
    names = sorted(cells)
    for name in names:
        _check_ledgers(name, cells[name], (expected or {}).get(name))
    total_tokens = sum(cells[n].tokens for n in names)
    docs = sum(cells[n].rows for n in names)
    plans = [_plan(cells[n], scan_tokens) for n in names]
    with (progress(docs, "document lengths (offsets) and digests", "doc", unit_scale=True) as bar,
          tempfile.TemporaryDirectory(prefix="marin-digests-") as tmp):
        digests = DigestBuckets(Path(tmp), sum(p.expected_docs(cells[n]) for n, p in zip(names, plans)), len(names))
        passes = [_Cell(i, cells[n], plan, digests, tokenizer) for i, (n, plan) in enumerate(zip(names, plans))]
        subsets, facts = [], []
        for name, cell in zip(names, passes):
            cell.run(bar)
            cache = cell.cache
            lengths = LengthStats(lengths_L=cell.histogram[0], counts_L=cell.histogram[1],
                                  shards_scanned=sum(len(p.data_chunks()) for p in cache.parts), sampled=False)
            subsets.append(SubsetStats(
                name=name, docs=cache.rows, tokens=cache.tokens, bytes=sizes.get(name, 0),
                shards=lengths.shards_scanned, license=(licenses or {}).get(name, "unknown"),
                token_share=cache.tokens / total_tokens if total_tokens else 0.0, lengths=lengths))
            facts.append(CellFacts(name=name, parts=len(cache.parts), layout=cache.ledger.layout, dtype=cache.dtype,
                                   codec=cache.codec, registry=registry_columns(cache), metadata=ledger_metadata(cache),
                                   files_scanned=cell.plan.files, first=cell.first))
        duplicates = digests.result(np.array([c.docs for c in passes], np.int64),
                                    np.array([c.tokens for c in passes], np.int64),
                                    np.array([p.sampled for p in plans]))
    return CacheStats(corpus=CorpusStats.of(subsets, duplicates), cells=tuple(facts))
