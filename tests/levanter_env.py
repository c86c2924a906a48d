"""Small Levanter caches for tests, written with `marin_data.levanter.write_cache` (Levanter's exact array
specs, a small chunk grid so that a few thousand tokens span several chunk files), the golden caches real
Levanter wrote (`FIXTURES`), and every document of a cache or a corpus subset read back in row order."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.shard import read_shard
from marin_data.levanter import LZ4, detect, open_cache, write_cache

__all__ = ["CHUNK", "INNER", "VOCAB", "BOS", "FIXTURES", "LLAMA3_VOCAB", "documents", "make_cache", "make_store",
           "cache_documents", "corpus_documents", "same_document", "wide_tokenizer", "pinned_store", "PINNED_CELLS"]

FIXTURES = Path(__file__).parent / "fixtures" / "levanter"  # written by real Levanter: README.md there
LLAMA3_VOCAB = 128_256  # the golden caches' token ids lie below it

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


def cache_documents(root: Path) -> list[np.ndarray]:
    """Every document of the cache at ``root`` in row order, as our reader decodes it."""
    cache = open_cache(detect(str(root)).store)
    docs = []
    for part in cache.parts:
        chunks = [tokens for _, tokens in cache.iter_tokens(part)]
        flat = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
        ends = cache.document_ends(part)
        docs += [flat[a:b] for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]
    return docs


def corpus_documents(root: Path, subset: str) -> tuple[list[str], list[np.ndarray]]:
    """The ids and tokens of every document of a corpus subset, its shards in order."""
    corpus, ids, docs = load_corpus(root), [], []
    for shard in sorted(corpus.shards_of([subset]), key=lambda s: s.path):
        shard_ids, tokens, offsets = read_shard(root / shard.path)
        ids += shard_ids
        docs += [tokens[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    return ids, docs


def same_document(ours: np.ndarray, want: np.ndarray | list[int] | dict) -> bool:
    """Whether ``ours`` holds the token ids of ``want``: an array, or a document as EXPECTED.json records it
    (a list, or a long one by its length and digest)."""
    ours = np.asarray(ours).astype(np.int64)
    if isinstance(want, dict):
        return len(ours) == want["length"] and hashlib.sha256(ours.astype("<i8").tobytes()).hexdigest() == \
            want["sha256_int64le"]
    return np.array_equal(ours, np.asarray(want, dtype=np.int64))


def wide_tokenizer(folder: Path, vocab: int = LLAMA3_VOCAB) -> Path:
    """A word-level ``tokenizer.json`` of ``vocab`` ids (EOS ``<|end_of_text|>`` = 0): a vocabulary the size of
    Llama 3's, for caches of ids up to 128,255, without a download."""
    from tokenizers import Tokenizer, models

    words = {"<|end_of_text|>": 0, **{f"t{i}": i for i in range(1, vocab)}}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t1"))
    tokenizer.add_special_tokens(["<|end_of_text|>"])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


PINNED_CELLS = {"cluster=1/quality=4": 200, "cluster=2/quality=4": 120}


@pytest.fixture(scope="session")
def pinned_store(tmp_path_factory, tiny_tokenizer) -> Path:
    """A Levanter store of the two `PINNED_CELLS` pinned in place by ``adopt`` (with ``tiny_tokenizer``, which
    the test module imports from shard_env), built once: copy it before changing it."""
    from marin_data.levanter import adopt

    root = tmp_path_factory.mktemp("pinned") / "store"
    make_store(root, PINNED_CELLS)
    adopt(root, tokenizer=str(tiny_tokenizer), name="store")
    return root
