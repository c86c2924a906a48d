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

Exact duplicates are found in the same pass over the same shards: each document's token bytes get a
128-bit BLAKE2b digest, and each shard's list of (digest, subset, length) rows is appended to one of
several bucket files on disk, chosen by the digest. Each bucket is then sorted on its own, so memory is
bounded by one bucket (`BUCKET_ROWS` rows of 28 bytes) whatever the corpus size, and a digest's copies
always meet in one bucket. Two documents are duplicates when their stored tokens (EOS included) are the
same; a document contained in a longer one is not found.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marin_data.corpus.manifest import Corpus
from marin_data.corpus.records import ShardRecord
from marin_data.corpus.shard import MAX_ROW_GROUP_BYTES
from marin_data.errors import ShardFormatError
from marin_data.fileio.parquet_io import decoded_bound, open_parquet
from marin_data.ui import progress

__all__ = ["PERCENTILES", "SCAN_TOKENS", "BUCKET_ROWS", "DIGEST_BYTES", "LengthStats", "SubsetStats", "Duplicates",
           "CorpusStats", "DigestBuckets", "nearest_rank", "spread", "merge_lengths", "corpus_stats"]

PERCENTILES = (50, 90, 99)
SCAN_TOKENS = 1 << 26  # per subset: ~0.5 s of decoding per subset, ~2 min for the ~200 subsets of 23T tokens
BUCKET_ROWS = 1 << 22  # digests sorted in memory at a time: ~120 MB
DIGEST_BYTES = 16  # a document's BLAKE2b digest: 128 bits
_ROW = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("subset", "<u4"), ("length", "<u8")])


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


@dataclass(frozen=True, eq=False)
class Duplicates:
    """Exact-duplicate documents among the scanned shards, indexed like ``CorpusStats.subsets``.

    ``within_docs[s]``/``within_tokens[s]``: copies beyond the first of every document that occurs more
    than once in subset ``s`` (so removing them leaves one of each). ``cross_docs[a, b]``/
    ``cross_tokens[a, b]`` (``a != b``): the documents of ``a`` that also occur in ``b``, every copy in
    ``a`` counted. ``scanned_docs[s]``/``scanned_tokens[s]``: the documents digested and their tokens (what
    the shares are fractions of); ``sampled[s]``: only some of the subset's files were read.
    """

    within_docs: np.ndarray  # int64 [S]
    within_tokens: np.ndarray  # int64 [S]
    cross_docs: np.ndarray  # int64 [S, S], zero diagonal
    cross_tokens: np.ndarray  # int64 [S, S]
    scanned_docs: np.ndarray  # int64 [S]
    scanned_tokens: np.ndarray  # int64 [S]
    sampled: np.ndarray  # bool [S]

    @classmethod
    def empty(cls, subsets: int) -> Duplicates:
        return cls(*(np.zeros(shape, np.int64) for shape in (subsets, subsets, (subsets, subsets),
                                                              (subsets, subsets), subsets, subsets)),
                   sampled=np.zeros(subsets, bool))


@dataclass(frozen=True)
class CorpusStats:
    subsets: tuple[SubsetStats, ...]  # sorted by name
    docs: int  # corpus totals: sums over the subsets
    tokens: int
    bytes: int
    shards: int
    duplicates: Duplicates | None = None  # None when not computed

    @classmethod
    def of(cls, subsets: Sequence[SubsetStats], duplicates: Duplicates | None = None) -> CorpusStats:
        totals = {f: sum(getattr(s, f) for s in subsets) for f in ("docs", "tokens", "bytes", "shards")}
        return cls(subsets=tuple(subsets), duplicates=duplicates, **totals)


def nearest_rank(lengths_L: np.ndarray, counts_L: np.ndarray, p: float) -> int:
    """The nearest-rank ``p``-th percentile of a histogram (0 for an empty one)."""
    total = int(counts_L.sum())
    if total == 0:
        return 0
    rank = max(1, math.ceil(p / 100 * total))  # 1-based rank of the document at the percentile
    return int(lengths_L[int(np.searchsorted(np.cumsum(counts_L), rank, "left"))])


def spread(sizes: Sequence[int], budget: int) -> list[int]:
    """Which of ``sizes`` (tokens of each file, in order) to scan: all of them when they fit ``budget`` (or it
    is 0), else files spread evenly over the list until their tokens reach it. Deterministic, ascending."""
    n, total = len(sizes), sum(sizes)
    if budget <= 0 or total <= budget:
        return list(range(n))
    want = max(1, math.ceil(n * budget / total))
    while True:  # grow the stride's sample until it holds the budget (uneven file sizes)
        picked = [(2 * i + 1) * n // (2 * want) for i in range(want)]
        if sum(sizes[i] for i in picked) >= budget or want == n:
            return picked
        want = min(n, want * 2)


def _shards_to_scan(shards: Sequence[ShardRecord], scan_tokens: int) -> list[ShardRecord]:
    """All shards when they fit the budget, else shards spread evenly over the subset (`spread`)."""
    shards = sorted(shards, key=lambda s: s.path)
    return [shards[i] for i in spread([s.tokens for s in shards], scan_tokens)]


def merge_lengths(acc: tuple[np.ndarray, np.ndarray], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The histogram ``acc`` (distinct lengths ascending, their counts) with ``lengths`` added."""
    values, counts = np.unique(lengths, return_counts=True)
    all_values = np.concatenate([acc[0], values])
    all_counts = np.concatenate([acc[1], counts])
    merged, inverse = np.unique(all_values, return_inverse=True)
    totals = np.zeros(len(merged), dtype=np.int64)
    np.add.at(totals, inverse, all_counts)
    return merged.astype(np.int64), totals


class DigestBuckets:
    """Every scanned document's digest, spilled by digest into bucket files that are each sorted alone.

    ``docs``: how many documents will be added at most (it sets the number of buckets); ``subsets``: the
    indices ``add`` is given range over ``[0, subsets)``.
    """

    def __init__(self, directory: Path, docs: int, subsets: int):
        self.paths = [directory / f"bucket-{b}" for b in range(max(1, math.ceil(docs / BUCKET_ROWS)))]
        self.subsets = subsets

    def add(self, subset: int, chunk) -> None:
        """The documents of one chunk of a ``tokens`` column (a pyarrow list array)."""
        offsets = chunk.offsets.to_numpy()
        if len(offsets) < 2:
            return
        data = memoryview(chunk.values.to_numpy()).cast("B")  # the uint32 tokens as stored, little-endian
        bounds = (4 * offsets).tolist()
        digests = b"".join(hashlib.blake2b(data[a:b], digest_size=DIGEST_BYTES).digest()
                           for a, b in zip(bounds, bounds[1:]))
        self.add_digests(subset, digests, np.diff(offsets))

    def add_digests(self, subset: int, digests: bytes, lengths: np.ndarray) -> None:
        """Documents by their digests (`DIGEST_BYTES` each, over their uint32 little-endian tokens)."""
        if not len(lengths):
            return
        pairs = np.frombuffer(digests, "<u8").reshape(-1, 2)
        rows = np.empty(len(pairs), _ROW)
        rows["hi"], rows["lo"], rows["subset"], rows["length"] = pairs[:, 0], pairs[:, 1], subset, lengths
        bucket = rows["hi"] % len(self.paths)
        for b in np.unique(bucket):
            with open(self.paths[b], "ab") as f:
                rows[bucket == b].tofile(f)

    def result(self, scanned_docs: np.ndarray, scanned_tokens: np.ndarray, sampled: np.ndarray) -> Duplicates:
        dup = Duplicates.empty(self.subsets)
        dup.scanned_docs[:], dup.scanned_tokens[:], dup.sampled[:] = scanned_docs, scanned_tokens, sampled
        for path in self.paths:
            if path.exists():
                self._count(np.fromfile(path, _ROW), dup)
        return dup

    @staticmethod
    def _count(rows: np.ndarray, dup: Duplicates) -> None:
        """Add one bucket's duplicates: sorted by (digest, subset), a *run* is one document's copies in one subset."""
        rows = rows[np.lexsort((rows["subset"], rows["lo"], rows["hi"]))]
        new_doc = np.r_[True, (rows["hi"][1:] != rows["hi"][:-1]) | (rows["lo"][1:] != rows["lo"][:-1])]
        starts = np.flatnonzero(new_doc | np.r_[True, rows["subset"][1:] != rows["subset"][:-1]])
        copies = np.diff(np.r_[starts, len(rows)])
        subset = rows["subset"][starts].astype(np.intp)
        length = rows["length"][starts].astype(np.int64)
        tokens = copies * length
        np.add.at(dup.within_docs, subset, copies - 1)
        np.add.at(dup.within_tokens, subset, tokens - length)
        doc = np.cumsum(new_doc)[starts]  # which document each run is a copy of
        shared = np.flatnonzero(np.bincount(doc)[doc] > 1)  # runs of documents found in several subsets
        for run in np.split(shared, np.flatnonzero(np.diff(doc[shared])) + 1) if len(shared) else ():
            for a in run:
                for b in run:
                    if a != b:
                        dup.cross_docs[subset[a], subset[b]] += copies[a]
                        dup.cross_tokens[subset[a], subset[b]] += tokens[a]


def _scan(root, shards: Sequence[ShardRecord], bar, digests: DigestBuckets, subset: int, *,
          max_row_group_bytes: int = MAX_ROW_GROUP_BYTES) -> tuple[np.ndarray, np.ndarray]:
    """Histogram of the document lengths of ``shards``, one row group in memory at a time; their digests.

    Each shard's document and token counts are checked against its row in the index: a datasheet must not
    describe bytes that differ from the ones the manifest vouches for. Each row group is bounded from the
    footer before it is decoded (``max_row_group_bytes``).
    """
    import pyarrow.compute as pc

    acc = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    for shard in shards:
        path = root / shard.path
        docs = tokens = 0
        try:
            pf = open_parquet(path)
            for rg in range(pf.metadata.num_row_groups):
                bound = decoded_bound(pf.metadata, ("tokens",), row_groups=[rg])
                if bound > max_row_group_bytes:
                    raise ShardFormatError(f"row group {rg} may decode to {bound:,} bytes, over the "
                                           f"{max_row_group_bytes:,} a row group may take", path=str(path))
                for chunk in pf.read_row_group(rg, columns=["tokens"]).column("tokens").chunks:
                    lengths = pc.list_value_length(chunk).to_numpy(zero_copy_only=False).astype(np.int64)
                    acc = merge_lengths(acc, lengths)
                    digests.add(subset, chunk)
                    docs += len(lengths)
                    tokens += int(lengths.sum())
                bar.update(pf.metadata.row_group(rg).num_rows)
        except ShardFormatError:
            raise
        except (OSError, ValueError, KeyError) as e:
            raise ShardFormatError(f"cannot read document lengths: {e}", path=str(path)) from e
        if (docs, tokens) != (shard.docs, shard.tokens):
            raise ShardFormatError(
                f"holds {docs} documents / {tokens} tokens, the index says {shard.docs} / {shard.tokens}",
                path=str(path), expected=(shard.docs, shard.tokens), actual=(docs, tokens),
            )
    return acc


def corpus_stats(corpus: Corpus, *, scan_tokens: int = SCAN_TOKENS) -> CorpusStats:
    """Per-subset totals from the manifest; document-length histograms and exact duplicates from the shards.

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
    with (progress(docs_to_scan, "document lengths and digests", "doc", unit_scale=True) as bar,
          tempfile.TemporaryDirectory(prefix="marin-digests-") as tmp):
        digests = DigestBuckets(Path(tmp), docs_to_scan, len(plan))
        for index, (name, shards) in enumerate(plan.items()):
            info = manifest.subsets[name]
            lengths_L, counts_L = _scan(corpus.root, shards, bar, digests, index)
            lengths = LengthStats(lengths_L=lengths_L, counts_L=counts_L, shards_scanned=len(shards),
                                  sampled=len(shards) < info.shards)
            subsets.append(SubsetStats(
                name=name, docs=info.docs, tokens=info.tokens, bytes=info.bytes, shards=info.shards,
                license=info.license, token_share=info.tokens / total_tokens if total_tokens else 0.0,
                lengths=lengths,
            ))
        scanned = np.array([int((s.lengths.lengths_L * s.lengths.counts_L).sum()) for s in subsets], np.int64)
        duplicates = digests.result(np.array([s.lengths.docs for s in subsets], np.int64), scanned,
                                    np.array([s.lengths.sampled for s in subsets]))
    return CorpusStats.of(subsets, duplicates)
