"""Our reader of Levanter caches reads what real Levanter read from its own golden caches.

tests/fixtures/levanter/ was written by real Levanter, which read every document back into EXPECTED.json
(scripts/make_levanter_fixtures.py). Here `marin_data.levanter` reads the same files: every document equal,
in row order, both layouts, int32 and int64, lz4 and zstd, a document crossing an inner chunk and an inner
chunk never stored (the fill value); the structural checks find nothing, and the two-cell tree is a store.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from marin_data.levanter import CACHE, STORE, check_cache, detect, open_cache

FIXTURES = Path(__file__).parent / "fixtures" / "levanter"
CACHES = json.loads((FIXTURES / "EXPECTED.json").read_text())["caches"]


def read_documents(root: Path) -> list[np.ndarray]:
    """Every document of the cache at ``root`` in row order, as our reader decodes it."""
    cache = open_cache(detect(str(root)).store)
    docs = []
    for part in cache.parts:
        chunks = [tokens for _, tokens in cache.iter_tokens(part)]
        flat = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
        ends = cache.document_ends(part)
        docs += [flat[a:b] for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]
    return docs


def same_document(ours: np.ndarray, levanter: list[int] | dict) -> bool:
    if isinstance(levanter, dict):  # a long document, recorded by its length and digest
        return len(ours) == levanter["length"] and \
            hashlib.sha256(ours.astype("<i8").tobytes()).hexdigest() == levanter["sha256_int64le"]
    return ours.tolist() == levanter


@pytest.mark.parametrize("name", sorted(CACHES))
def test_every_document_reads_as_levanter_read_it(name):
    ours, levanter = read_documents(FIXTURES / name), CACHES[name]["documents"]
    assert len(ours) == len(levanter)
    assert [i for i, (a, b) in enumerate(zip(ours, levanter)) if not same_document(a, b)] == []


@pytest.mark.parametrize("name", sorted(CACHES))
def test_the_structural_checks_pass_a_cache_levanter_wrote(name):
    source = detect(str(FIXTURES / name))
    cache = open_cache(source.store)
    assert source.kind == CACHE
    assert (cache.rows, cache.tokens, str(cache.dtype)) == \
        (CACHES[name]["rows"], CACHES[name]["tokens"], CACHES[name]["dtype"])
    assert check_cache(cache, tokens=True) == []


def test_the_two_cell_tree_is_a_store_of_its_cells():
    source = detect(str(FIXTURES / "store"))
    assert (source.kind, tuple(source.cells)) == (STORE, ("cluster=0/quality=0", "cluster=1/quality=4"))
