"""Statistics of a corpus for its documentation: totals from the manifest, lengths from the shards.

Totals (documents, tokens, bytes, shards, licenses) are read from the manifest, which `load_corpus` has
already checked against ``shards.parquet``: at 23T tokens they cost nothing. Document lengths are not in any
metadata (Parquet keeps no statistics of list lengths), so they are computed by streaming the ``tokens``
column one row group (~1M tokens) at a time and keeping only a histogram of *distinct* lengths: memory is
bounded by one row group plus the number of distinct document lengths, whatever the corpus size.

Decoding runs at ~124M tokens/s/core (docs/design.md), so scanning 23T tokens would take days. Each subset is
therefore scanned in full up to ``scan_tokens`` tokens; above that, whole shards spread evenly over the
subset are scanned until the budget is reached, and `LengthStats.sampled` says so — the datasheet then
labels the percentiles as estimated from the stated number of documents and the maximum as the largest
seen. Nothing is ever extrapolated.

Percentiles use the nearest-rank definition (the smallest length L such that at least p% of documents
have at most L tokens; numpy's ``method="inverted_cdf"``): always an actual document length, an integer,
and reproducible from the histogram alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from marin_data.corpus.manifest import Corpus, ShardRecord
from marin_data.errors import ShardFormatError
from marin_data.ui import progress

__all__ = ["PERCENTILES", "SCAN_TOKENS", "LengthStats", "SubsetStats", "CorpusStats", "nearest_rank",
           "corpus_stats"]

PERCENTILES = (50, 90, 99)
SCAN_TOKENS = 1 << 26  # per subset: ~0.5 s of decoding per subset, ~2 min for the ~200 subsets of 23T tokens


@dataclass(frozen=True, eq=False)
class LengthStats:
    """Distribution of document lengths (tokens per document as stored, EOS included) over scanned shards.

    ``lengths_L``/``counts_L``: the distinct lengths, ascending, and how many documents have each.
    """

    lengths_L: np.ndarray  # int64
    counts_L: np.ndarray  # int64
    shards_scanned: int
    sampled: bool  # True when only some of the subset's shards were scanned

    @property
    def docs(self) -> int:
        return int(self.counts_L.sum())

    @property
    def max(self) -> int:
        return int(self.lengths_L[-1]) if len(self.lengths_L) else 0

    def percentile(self, p: float) -> int:
        return nearest_rank(self.lengths_L, self.counts_L, p)


@dataclass(frozen=True)
class SubsetStats:
    name: str
    docs: int
    tokens: int
    bytes: int
    shards: int
    license: str
    token_share: float  # fraction of the corpus's tokens, in [0, 1]
    lengths: LengthStats


@dataclass(frozen=True)
class CorpusStats:
    subsets: tuple[SubsetStats, ...]  # sorted by name
    docs: int  # corpus totals: sums over the subsets
    tokens: int
    bytes: int
    shards: int

    @classmethod
    def of(cls, subsets: Sequence[SubsetStats]) -> CorpusStats:
        totals = {f: sum(getattr(s, f) for s in subsets) for f in ("docs", "tokens", "bytes", "shards")}
        return cls(subsets=tuple(subsets), **totals)


def nearest_rank(lengths_L: np.ndarray, counts_L: np.ndarray, p: float) -> int:
    """The nearest-rank ``p``-th percentile of a histogram (0 for an empty one)."""
    total = int(counts_L.sum())
    if total == 0:
        return 0
    rank = max(1, math.ceil(p / 100 * total))  # 1-based rank of the document at the percentile
    return int(lengths_L[int(np.searchsorted(np.cumsum(counts_L), rank, "left"))])


def _shards_to_scan(shards: Sequence[ShardRecord], scan_tokens: int) -> list[ShardRecord]:
    """All shards when they fit the budget, else shards spread evenly over the subset (deterministic)."""
    shards = sorted(shards, key=lambda s: s.path)
    total = sum(s.tokens for s in shards)
    if scan_tokens <= 0 or total <= scan_tokens:
        return shards
    want = max(1, math.ceil(len(shards) * scan_tokens / total))
    while True:  # grow the stride's sample until it holds the budget (uneven shard sizes)
        picked = [shards[(2 * i + 1) * len(shards) // (2 * want)] for i in range(want)]
        if sum(s.tokens for s in picked) >= scan_tokens or want == len(shards):
            return picked
        want = min(len(shards), want * 2)


def _merge(acc: tuple[np.ndarray, np.ndarray], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values, counts = np.unique(lengths, return_counts=True)
    all_values = np.concatenate([acc[0], values])
    all_counts = np.concatenate([acc[1], counts])
    merged, inverse = np.unique(all_values, return_inverse=True)
    totals = np.zeros(len(merged), dtype=np.int64)
    np.add.at(totals, inverse, all_counts)
    return merged.astype(np.int64), totals


def _scan(root, shards: Sequence[ShardRecord], bar) -> tuple[np.ndarray, np.ndarray]:
    """Histogram of the document lengths of ``shards``, one row group in memory at a time.

    Each shard's document and token counts are checked against its row in the index: a datasheet must not
    describe bytes that differ from the ones the manifest vouches for.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    acc = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    for shard in shards:
        path = root / shard.path
        docs = tokens = 0
        try:
            pf = pq.ParquetFile(path)
            for rg in range(pf.metadata.num_row_groups):
                for chunk in pf.read_row_group(rg, columns=["tokens"]).column("tokens").chunks:
                    lengths = pc.list_value_length(chunk).to_numpy(zero_copy_only=False).astype(np.int64)
                    acc = _merge(acc, lengths)
                    docs += len(lengths)
                    tokens += int(lengths.sum())
                bar.update(pf.metadata.row_group(rg).num_rows)
        except (OSError, ValueError, KeyError) as e:
            raise ShardFormatError(f"cannot read document lengths: {e}", path=str(path)) from e
        if (docs, tokens) != (shard.docs, shard.tokens):
            raise ShardFormatError(
                f"holds {docs} documents / {tokens} tokens, the index says {shard.docs} / {shard.tokens}",
                path=str(path), expected=(shard.docs, shard.tokens), actual=(docs, tokens),
            )
    return acc


def corpus_stats(corpus: Corpus, *, scan_tokens: int = SCAN_TOKENS) -> CorpusStats:
    """Per-subset totals from the manifest and document-length histograms from the shards.

    Args:
        corpus: a loaded corpus (`marin_data.corpus.manifest.load_corpus`); its shards must be on disk.
        scan_tokens: per-subset budget of tokens to decode for the length statistics; 0 scans everything.

    Raises:
        ShardFormatError: a shard that should be scanned is missing or unreadable.
    """
    manifest = corpus.manifest
    total_tokens = sum(s.tokens for s in manifest.subsets.values())
    by_subset: dict[str, list[ShardRecord]] = {name: [] for name in manifest.subsets}
    for shard in corpus.shards:  # one pass: ~100,000 shards at full scale
        by_subset[shard.subset].append(shard)
    plan = {name: _shards_to_scan(by_subset[name], scan_tokens) for name in sorted(manifest.subsets)}
    docs_to_scan = sum(s.docs for shards in plan.values() for s in shards)
    subsets = []
    with progress(docs_to_scan, "document lengths", "doc", unit_scale=True) as bar:
        for name, shards in plan.items():
            info = manifest.subsets[name]
            lengths_L, counts_L = _scan(corpus.root, shards, bar)
            lengths = LengthStats(lengths_L=lengths_L, counts_L=counts_L, shards_scanned=len(shards),
                                  sampled=len(shards) < info.shards)
            subsets.append(SubsetStats(
                name=name, docs=info.docs, tokens=info.tokens, bytes=info.bytes, shards=info.shards,
                license=info.license, token_share=info.tokens / total_tokens if total_tokens else 0.0,
                lengths=lengths,
            ))
    return CorpusStats.of(subsets)
