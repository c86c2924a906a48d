"""Metadata cost grows with shards, not tokens: a 23T-token, 100,000-shard index builds in bounded memory."""

from __future__ import annotations

import tracemalloc

import numpy as np

from marin_data.corpus.manifest import load_corpus
from marin_data.loader import LoaderConfig, TokenStream
from marin_data.testing.simulate import simulated_corpus, write_simulated_index

SUBSETS = 200


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


def test_the_simulated_index_commits_and_loads_as_a_corpus(tmp_path):
    write_simulated_index(tmp_path, shards=2_000, subsets=20, tokens=10**10)
    corpus = load_corpus(tmp_path)
    assert len(corpus.shards) == 2_000 and len(corpus.manifest.subsets) == 20
    assert TokenStream(corpus, LoaderConfig(mixture={"pre": 1, "mid": 1})).subsets == tuple(corpus.manifest.subsets)
