"""The corpus's metadata at production scale: bytes of ``shards.parquet``, ``SHA256SUMS``, ``manifest.json``
and ``croissant.json`` for 100,000 shards in 200 subsets, and the time and memory `load_corpus` needs to
read and check them (for docs/scale.md).

The index is written by the real code (`commit_corpus`, `render_croissant`) with no shard data: rows have
random sha256 digests (incompressible, like real ones), sizes around the default shard of 2^28 tokens at
1.32 bytes/token, and names shaped like production ones (``data/pretrain/subset-007/part-00042.parquet``).
Each subset also gets its ``sources/<subset>.json`` record listed in the manifest, as `marin-data shard`
writes one, so the manifest's per-subset cost includes it.

    .venv/bin/python benchmarks/bench_index_size.py                        # 100,000 rows, 200 subsets
    .venv/bin/python benchmarks/bench_index_size.py --shards 10000 --subsets 20   # quick check
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from marin_data.corpus.sources import sources_path
from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import Manifest, load_corpus
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import shard_path
from marin_data.docs.croissant import render_croissant
from marin_data.docs.questions import Metadata
from marin_data.docs.stats import CorpusStats, LengthStats, SubsetStats
from marin_data.layout import MANIFEST, SHARDS_INDEX, SUMS, TOKENIZER
from marin_data.raw.tokenizer import TokenizerInfo

SHARD_TOKENS = 1 << 28  # marin_data.corpus.build.DEFAULT_SHARD_TOKENS
BYTES_PER_TOKEN = 1.32  # docs/design.md: shards measure 0.33x of raw uint32
TOKENIZER_JSON = b'{"model": {"type": "index-only", "vocab_size": 128256}}'


def subset_name(s: int, subsets: int) -> str:
    return f"{'pretrain' if s < subsets * 3 // 4 else 'midtrain'}/subset-{s:03d}"


def write_index(root: Path, shards: int, subsets: int, seed: int = 0) -> None:
    """Commit an index-only corpus of ``shards`` rows spread evenly over ``subsets`` subsets."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    (root / TOKENIZER).write_bytes(TOKENIZER_JSON)
    tokens = rng.integers(SHARD_TOKENS // 2, SHARD_TOKENS, size=shards)
    digests = rng.bytes(32 * shards)
    per = -(-shards // subsets)
    records = []
    for k, t in enumerate(tokens.tolist()):
        subset = subset_name(k // per, subsets)
        records.append(ShardRecord(path=shard_path(subset, k % per), subset=subset, bytes=int(t * BYTES_PER_TOKEN),
                                   sha256=digests[32 * k : 32 * k + 32].hex(), docs=t // 700, tokens=t,
                                   row_groups=max(1, t >> 20)))
    names = sorted({r.subset for r in records})
    for name in names:  # what `marin-data shard` records per subset (here: one input file each)
        record = root / sources_path(name)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(f'{{"inputs": [{{"name": "{name}.jsonl.zst", "sha256": "{"0" * 64}"}}]}}\n')
    tokenizer = TokenizerInfo(name="index-only", sha256=hashlib.sha256(TOKENIZER_JSON).hexdigest(),
                              vocab_size=128_256, eos_id=128_001)
    manifest = Manifest(name="scale", version="1.0.0", tokenizer=tokenizer,
                        subsets={n: SubsetInfo(0, 0, 0, 0, license="ODC-By-1.0") for n in names})
    commit_corpus(root, manifest, records, extra_files=[sources_path(n) for n in names])


def croissant_bytes(root: Path) -> int:
    """Bytes of the Croissant document `marin-data datasheet` would write for this corpus (one FileObject
    per shard); the document-length statistics, which need shard data, are left empty."""
    corpus = load_corpus(root)
    empty = LengthStats(np.zeros(0, np.int64), np.zeros(0, np.int64), 0, False)
    total = sum(s.tokens for s in corpus.shards)
    subsets = [SubsetStats(n, i.docs, i.tokens, i.bytes, i.shards, i.license, i.tokens / total, empty)
               for n, i in sorted(corpus.manifest.subsets.items())]
    return len(render_croissant(corpus, CorpusStats.of(subsets), Metadata()).encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=100_000)
    ap.add_argument("--subsets", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3, help="timed load_corpus calls")
    args = ap.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="bench_index_"))
    try:
        small, big = scratch / "half", scratch / "full"
        t0 = time.perf_counter()
        write_index(big, args.shards, args.subsets)
        commit_s = time.perf_counter() - t0
        write_index(small, args.shards // 2, args.subsets // 2)  # for the per-subset slope of the manifest
        sizes = {f: (big / f).stat().st_size for f in (SHARDS_INDEX, SUMS, MANIFEST)}
        per_subset = (sizes[MANIFEST] - (small / MANIFEST).stat().st_size) / (args.subsets - args.subsets // 2)
        load_corpus(big)  # imports
        seconds = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            load_corpus(big)
            seconds.append(time.perf_counter() - t0)
        tracemalloc.start()
        load_corpus(big)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        croissant = croissant_bytes(big)

        print(f"{args.shards:,} shards in {args.subsets} subsets; commit_corpus {commit_s:.1f}s\n")
        print("| file | bytes | per shard row | per subset |")
        print("|---|---:|---:|---:|")
        for name, size in [*sizes.items(), ("croissant.json", croissant)]:
            subset_col = f"{per_subset:,.0f} (slope)" if name == MANIFEST else ""
            print(f"| {name} | {size:,} | {size / args.shards:,.1f} | {subset_col} |")
        print(f"\nload_corpus (read and check manifest + index): {statistics.median(seconds):.2f}s median of "
              f"{args.repeats}, peak traced memory {peak / 2**20:.0f} MiB")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
