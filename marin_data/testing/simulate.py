"""An index-only corpus of production scale, for the loader's scale test and start-up benchmark.

The loader's metadata must grow with shards, not tokens: building it over the full 23T-token
corpus (~100,000 shards) must take under a second and 300 MB. Measuring that needs the *description* of
such a corpus, not its data: `simulated_corpus` builds one in memory, and `write_simulated_index` commits
it to disk (manifest, ``shards.parquet``, ``SHA256SUMS``; no data files) so `load_corpus` can be timed too.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import Corpus, Manifest, summarize_subsets
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.layout import TOKENIZER
from marin_data.raw.tokenizer import TokenizerInfo

__all__ = ["simulated_corpus", "write_simulated_index"]

_TOKENIZER_JSON = b'{"model": {"type": "simulated", "vocab_size": 128256}}'


def simulated_corpus(root: str | os.PathLike = "/nonexistent", *, shards: int = 100_000, subsets: int = 200,
                     tokens: int = 23 * 10**12, seed: int = 0) -> Corpus:
    """A corpus description: ``subsets`` subsets (3/4 under ``pre/``, the rest under ``mid/``) of equal shard
    counts, shard sizes uniform within +-50% of the mean, about ``tokens`` tokens in all. No files."""
    rng = np.random.default_rng(seed)
    mean = tokens // shards
    sizes = rng.integers(mean // 2, mean * 3 // 2, size=shards)
    per = max(1, shards // subsets)
    records = []
    for k, size in enumerate(sizes.tolist()):
        s, n = divmod(k, per)
        name = f"{'pre' if s < subsets * 3 // 4 else 'mid'}/s{s:03d}"
        records.append(ShardRecord(path=f"data/{name}/part-{n:05d}.parquet", subset=name, bytes=size * 4 // 3,
                                   sha256=f"{k:064x}", docs=max(1, size // 3000), tokens=size,
                                   row_groups=max(1, size >> 20)))
    tokenizer = TokenizerInfo(name="simulated", sha256=hashlib.sha256(_TOKENIZER_JSON).hexdigest(),
                              vocab_size=128_256, eos_id=128_001)
    manifest = Manifest(name="simulated", version="0", tokenizer=tokenizer, subsets=summarize_subsets(records, {}))
    return Corpus(root=Path(root), manifest=manifest, manifest_sha256="0" * 64, shards=tuple(records))


def write_simulated_index(root: str | os.PathLike, **kwargs) -> None:
    """Commit `simulated_corpus` 's description under ``root`` (no shard files are written)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / TOKENIZER).write_bytes(_TOKENIZER_JSON)
    corpus = simulated_corpus(root, **kwargs)
    manifest = Manifest(name="simulated", version="0", tokenizer=corpus.manifest.tokenizer,
                        subsets={k: SubsetInfo(0, 0, 0, 0) for k in corpus.manifest.subsets})
    commit_corpus(root, manifest, corpus.shards)
