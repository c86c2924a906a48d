"""Small Levanter caches for tests, written with `marin_data.levanter.write_cache` (Levanter's exact array
specs, a small chunk grid so that a few thousand tokens span several chunk files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from marin_data.levanter import LZ4, write_cache

__all__ = ["CHUNK", "INNER", "VOCAB", "BOS", "documents", "make_cache", "make_store", "wide_tokenizer"]

CHUNK = 1024  # elements per chunk file
INNER = 256  # elements per inner chunk
VOCAB = 400  # the tiny tokenizer of `shard_env.train_tiny`
BOS = 1


def documents(n: int, seed: int, *, bos: bool = True, max_len: int = 60) -> list[np.ndarray]:
    """``n`` documents of 1..max_len tokens in ``[2, VOCAB)``, each opening with `BOS` when ``bos``."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(2, VOCAB, int(rng.integers(1, max_len))) for _ in range(n)]
    if bos:
        docs = [np.concatenate([[BOS], d]) for d in docs]
    return docs


def make_cache(root: Path, n: int = 200, seed: int = 0, **options) -> list[np.ndarray]:
    """Write a cache of ``n`` documents at ``root`` (options as `write_cache`); return its documents."""
    docs = documents(n, seed)
    options = {"chunk": CHUNK, "inner": INNER, "codec": LZ4, "tokenizer": "tiny", "vocab_size": VOCAB, **options}
    write_cache(root, docs, **options)
    return docs


def make_store(root: Path, cells: dict[str, int], **options) -> dict[str, list[np.ndarray]]:
    """A tree of caches, one per cell name (``cluster=0/quality=1``) with that many documents."""
    return {cell: make_cache(root / cell, n, seed=i, **options) for i, (cell, n) in enumerate(sorted(cells.items()))}


def wide_tokenizer(folder: Path, vocab: int = 128_256) -> Path:
    """A word-level ``tokenizer.json`` as wide as Llama 3's (ids ``t0``... and ``<|end_of_text|>`` last), which
    the golden caches' ids need; it decodes ids to their words joined by spaces."""
    from tokenizers import Tokenizer, models

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab - 1)}, unk_token="t0"))
    tokenizer.add_special_tokens(["<|end_of_text|>"])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"
