"""Our reader of Levanter caches reads what real Levanter read from its own golden caches.

tests/fixtures/levanter/ was written by real Levanter, which read every document back into EXPECTED.json
(scripts/make_levanter_fixtures.py). Here `marin_data.levanter` reads the same files: every document equal,
in row order, both layouts, int32 and int64, lz4 and zstd, a document crossing an inner chunk and an inner
chunk never stored (the fill value); the structural checks find nothing, and the two-cell tree is a store.
"""

from __future__ import annotations

import json

import pytest
from levanter_env import FIXTURES, cache_documents, same_document

from marin_data.levanter import CACHE, STORE, check_cache, detect, open_cache

CACHES = json.loads((FIXTURES / "EXPECTED.json").read_text())["caches"]


@pytest.mark.parametrize("name", sorted(CACHES))
def test_every_document_reads_as_levanter_read_it(name):
    ours, levanter = cache_documents(FIXTURES / name), CACHES[name]["documents"]
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
