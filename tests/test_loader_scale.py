"""Metadata cost grows with shards, not tokens: a 23T-token, 100,000-shard index builds in bounded memory."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np

from marin_data.loader import LoaderConfig, TokenStream
from marin_data.manifest import Corpus, Manifest, ShardRecord, SubsetInfo, TokenizerInfo

SHARDS = 100_000
SUBSETS = 200
TOTAL_TOKENS = 23 * 10**12


def simulated_corpus(root: Path = Path("/nonexistent")) -> Corpus:
    """A corpus description only (no data files): 200 subsets of 500 shards, 23T tokens in all."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(TOTAL_TOKENS // SHARDS // 2, TOTAL_TOKENS // SHARDS * 3 // 2, size=SHARDS)
    shards = tuple(
        ShardRecord(path=f"data/{'pre' if s < 150 else 'mid'}/s{s:03d}/part-{n:05d}.parquet",
                    subset=f"{'pre' if s < 150 else 'mid'}/s{s:03d}", bytes=int(t) * 4 // 3,
                    sha256=f"{k:064x}", docs=int(t) // 3000, tokens=int(t), row_groups=int(t) >> 20)
        for k, (s, n, t) in enumerate(zip(np.arange(SHARDS) // (SHARDS // SUBSETS),
                                          np.arange(SHARDS) % (SHARDS // SUBSETS), tokens)))
    subsets: dict[str, list[int]] = {}
    for sh in shards:
        subsets.setdefault(sh.subset, []).append(sh.tokens)
    tokenizer = TokenizerInfo(name="llama3", sha256="0" * 64, vocab_size=128_256, eos_id=128_001)
    manifest = Manifest(name="sim", version="0", tokenizer=tokenizer, subsets={
        name: SubsetInfo(docs=sum(t) // 3000, tokens=sum(t), bytes=sum(t) * 4 // 3, shards=len(t))
        for name, t in subsets.items()})
    return Corpus(root=root, manifest=manifest, manifest_sha256="0" * 64, shards=shards)


def test_a_100k_shard_23t_token_index_builds_in_under_300_mb_and_resumes_a_million_steps_in():
    corpus = simulated_corpus()
    config = LoaderConfig(mixture={"pre": 0.8, "mid/*": 0.2}, seed=1)
    tracemalloc.start()
    try:
        stream = TokenStream(corpus, config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 300 * 2**20, f"building the loader took {peak / 2**20:.0f} MiB"
    assert len(stream.subsets) == SUBSETS
    assert sum(t.tokens for t in stream.subset_tokens) == sum(sh.tokens for sh in corpus.shards)
    # Step 1,000,000 of the hero run (global batch 11,264): located by arithmetic, nothing replayed.
    far = 1_000_000 * 11_264
    subset, start = stream.locate(np.arange(far, far + 11_264))
    sizes = np.array([t.tokens for t in stream.subset_tokens])
    assert np.all(start + config.seq_len + 1 <= sizes[subset])
    served = stream.served(far)
    assert sum(served.values()) == far
    pre = sum(v for k, v in served.items() if k.startswith("pre/"))
    assert abs(pre - 0.8 * far) <= SUBSETS
