"""``marin-data convert``, both ways: every document the same tokens in the same rows.

A cache becomes a corpus (one subset per cell, ids ``<cell>:<row>``, shards of the configured size, a corpus
that verify passes) and a corpus a store of caches (one consolidated cache per subset, which our reader and
zarr-python read alike, its ledger naming the tokenizer). Round trips run over both layouts, both token
types and both codecs; the golden caches real Levanter wrote convert to what Levanter read from them
(EXPECTED.json); a pinned source is read through its pin, a remote one through its store.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from levanter_env import BOS, CHUNK, FIXTURES, INNER, VOCAB, cache_documents, corpus_documents, documents, \
    make_store, same_document, wide_tokenizer
from s3_env import bucket_url, moto, s3_client  # noqa: F401 - fixtures
from shard_env import run_cli, tiny_tokenizer, tree_bytes  # noqa: F401 - tiny_tokenizer is a fixture

from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.verify import verify_corpus
from marin_data.errors import InvalidTokenizerError, ShardChecksumError
from marin_data.layout import MANIFEST
from marin_data.levanter import LZ4, ZSTD, check_cache, detect, open_cache, write_cache
from marin_data.levanter.adopt import adopt
from marin_data.levanter.to_levanter import convert_to_levanter
from marin_data.levanter.to_marin import convert_to_marin
from marin_data.raw.tokenizer import load_tokenizer
from marin_data.testing.mirror import running_mirror

EXPECTED = json.loads((FIXTURES / "EXPECTED.json").read_text())["caches"]
SHARD_TOKENS = 700  # a few shards per cell


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    return wide_tokenizer(tmp_path_factory.mktemp("wide") / "wide")


def edge_documents() -> list[np.ndarray]:
    """Empty rows first, in the middle and last, and one document longer than two chunk files and a shard."""
    docs = documents(40, seed=3)
    long = np.concatenate([[BOS], np.arange(2 * CHUNK + 300) % (VOCAB - 2) + 2])
    return [np.zeros(0, np.int64), *docs[:20], np.zeros(0, np.int64), long, *docs[20:], np.zeros(0, np.int64)]


def make_source(root: Path, *, layout: str, dtype: str, codec) -> dict[str, list[np.ndarray]]:
    options = {"layout": layout, "parts": 3, "dtype": dtype, "codec": codec}
    cells = make_store(root, {"cluster=0/quality=1": 120, "cluster=1/quality=4": 60}, **options)
    cells["cluster=2/quality=0"] = edge_documents()
    cells["cluster=3/quality=0"] = [np.zeros(0, np.int64)] * 3  # rows without a token: parts with no chunk file
    for cell in ("cluster=2/quality=0", "cluster=3/quality=0"):
        write_cache(root / cell, cells[cell], chunk=CHUNK, inner=INNER, tokenizer="tiny", vocab_size=VOCAB,
                    **options)
    return cells


def assert_subset_equal(corpus: Path, subset: str, want: list) -> None:
    ids, docs = corpus_documents(corpus, subset)
    assert ids == [f"{subset}:{row}" for row in range(len(want))]
    assert [row for row, (a, b) in enumerate(zip(docs, want)) if not same_document(a, b)] == []
    assert len(docs) == len(want)


def zarr_documents(cache: Path) -> list[np.ndarray]:
    """A consolidated cache's documents as zarr-python reads its two arrays."""
    ledger = json.loads((cache / "shard_ledger.json").read_text())
    offsets = zarr.open_array(str(cache / "input_ids/offsets"), mode="r")[0:ledger["total_num_rows"] + 1]
    data = zarr.open_array(str(cache / "input_ids/data"), mode="r")[0:int(offsets[-1])]
    assert offsets[0] == ledger["total_num_rows"]
    ends = offsets[1:]
    return [data[a:b] for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]


@pytest.mark.parametrize("dtype,codec", [("int32", LZ4), ("int64", ZSTD), ("int64", LZ4), ("int32", ZSTD)],
                         ids=["int32-lz4", "int64-zstd", "int64-lz4", "int32-zstd"])
@pytest.mark.parametrize("layout", ["consolidated", "sharded"])
def test_a_store_round_trips_through_a_corpus_equal_in_every_document(tmp_path, tiny_tokenizer, layout, dtype,
                                                                       codec):
    cells = make_source(tmp_path / "store", layout=layout, dtype=dtype, codec=codec)
    report = convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer),
                              shard_tokens=SHARD_TOKENS)
    assert report.subsets == tuple(sorted(cells)) and report.docs == sum(map(len, cells.values()))
    for cell, docs in cells.items():
        assert_subset_equal(tmp_path / "corpus", cell, docs)
    corpus = load_corpus(tmp_path / "corpus")
    long = max(len(d) for d in cells["cluster=2/quality=0"])
    assert all(s.tokens <= SHARD_TOKENS or s.tokens == long for s in corpus.shards)
    assert len(corpus.shards_of(["cluster=0/quality=1"])) > 1
    assert verify_corpus(tmp_path / "corpus", deep=True, progress=False).ok

    back = convert_to_levanter(tmp_path / "corpus", dest=tmp_path / "caches", dtype=dtype, codec=codec,
                               chunk=CHUNK, inner=INNER)
    assert back.subsets == tuple(sorted(cells))
    name = load_tokenizer(str(tiny_tokenizer)).info.name
    for cell, docs in cells.items():
        cache = open_cache(detect(str(tmp_path / "caches" / cell)).store)
        framed = all(len(d) and d[0] == BOS for d in docs)  # BOS-led, never EOS-closed: as the ledger says
        assert cache.ledger.preprocessor_metadata == {"tokenizer": name, "vocab_size": VOCAB, "append_bos": framed,
                                                      "append_eos": False}
        assert (cache.ledger.layout, cache.parts[0].data.dtype, cache.parts[0].data.blosc) == \
            ("consolidated", dtype, codec)
        assert check_cache(cache, tokens=True, vocab_size=VOCAB) == []
        for read in (cache_documents, zarr_documents):
            ours = read(tmp_path / "caches" / cell)
            assert len(ours) == len(docs) and all(np.array_equal(a, b) for a, b in zip(ours, docs)), read.__name__


def test_the_golden_caches_convert_to_what_levanter_read_from_them_and_back(tmp_path, wide):
    """Every cache real Levanter wrote, to a corpus and back to caches: each document as Levanter read it."""
    wordlevel = FIXTURES / "levanter-fixture-wordlevel/tokenizer.json"
    for name in ("consolidated-int32-lz4", "tokenized-int64-lz4", "sharded-int32-lz4", "consolidated-int64-zstd",
                 "store"):
        corpus, caches = tmp_path / f"{name}-corpus", tmp_path / f"{name}-caches"
        tokenizer = wordlevel if name.startswith("tokenized") else wide
        convert_to_marin(FIXTURES / name, dest=corpus, tokenizer=str(tokenizer), shard_tokens=100_000)
        cells = {k.removeprefix("store/"): v for k, v in EXPECTED.items() if k.startswith("store/")} \
            if name == "store" else {name: EXPECTED[name]}
        for cell, expected in cells.items():
            assert_subset_equal(corpus, cell, expected["documents"])
        assert verify_corpus(corpus, deep=True, progress=False).ok
        convert_to_levanter(corpus, dest=caches, dtype=expected["dtype"])
        for cell, expected in cells.items():
            docs = cache_documents(caches / cell)
            assert len(docs) == expected["rows"] and all(map(same_document, docs, expected["documents"]))


def test_a_single_cache_is_one_subset_named_after_its_folder_or_name(tmp_path, wide):
    convert_to_marin(FIXTURES / "consolidated-int32-lz4", dest=tmp_path / "a", tokenizer=str(wide))
    convert_to_marin(FIXTURES / "consolidated-int32-lz4", dest=tmp_path / "b", tokenizer=str(wide), name="web/2024")
    assert list(load_corpus(tmp_path / "a").manifest.subsets) == ["consolidated-int32-lz4"]
    assert corpus_documents(tmp_path / "b", "web/2024")[0][:2] == ["web/2024:0", "web/2024:1"]


def test_subset_globs_select_cells_and_a_second_run_adds_the_others(tmp_path, tiny_tokenizer):
    cells = make_store(tmp_path / "store", {f"cluster={c}/quality={q}": 10 + c for c in range(3) for q in (0, 4)})
    first = convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer),
                             subsets=["cluster=*/quality=4"])
    assert first.subsets == ("cluster=0/quality=4", "cluster=1/quality=4", "cluster=2/quality=4")
    second = convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer))
    assert second.reused == first.subsets and len(second.subsets) == 3
    assert sorted(load_corpus(tmp_path / "corpus").manifest.subsets) == sorted(cells)
    again = convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer))
    assert (again.subsets, again.manifest_sha256) == ((), second.manifest_sha256)  # nothing to do
    caches = convert_to_levanter(tmp_path / "corpus", dest=tmp_path / "caches", subsets=["cluster=1"])
    assert caches.subsets == ("cluster=1/quality=0", "cluster=1/quality=4")
    assert detect(str(tmp_path / "caches")).cells == caches.subsets


def test_a_pinned_store_converts_with_its_own_tokenizer_every_file_checked(tmp_path, tiny_tokenizer):
    cells = make_store(tmp_path / "store", {"cluster=0/quality=0": 50, "cluster=0/quality=4": 70})
    adopt(tmp_path / "store", tokenizer=str(tiny_tokenizer))
    with pytest.raises(InvalidTokenizerError, match="its own tokenizer"):
        convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer))
    convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus", subsets=["cluster=0/quality=4"])
    assert_subset_equal(tmp_path / "corpus", "cluster=0/quality=4", cells["cluster=0/quality=4"])
    assert load_corpus(tmp_path / "corpus").manifest.tokenizer == load_corpus(tmp_path / "store").manifest.tokenizer
    chunk = tmp_path / "store/cluster=0/quality=0/input_ids/data/c/0"
    chunk.write_bytes(bytes([chunk.read_bytes()[0] ^ 1]) + chunk.read_bytes()[1:])
    before = tree_bytes(tmp_path / "corpus")
    with pytest.raises(ShardChecksumError):
        convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus")
    assert {k: v for k, v in tree_bytes(tmp_path / "corpus").items() if not k.startswith(".")} == \
        {k: v for k, v in before.items() if not k.startswith(".")}


def test_the_cli_converts_both_ways_and_prints_what_it_did(tmp_path, tiny_tokenizer):
    cells = make_store(tmp_path / "store", {"cluster=0/quality=4": 30, "cluster=3/quality=4": 20})
    done = run_cli("convert", tmp_path / "store", "--to", tmp_path / "corpus", "--format", "marin", "--tokenizer",
                   tiny_tokenizer, "--subset", "cluster=*/quality=4", "--shard-tokens", "300")
    assert done.returncode == 0, done.stderr
    assert "converted 2 subsets" in done.stdout and load_corpus(tmp_path / "corpus").manifest_sha256 in done.stdout
    done = run_cli("convert", tmp_path / "corpus", "--to", tmp_path / "caches", "--format", "levanter",
                   "--token-dtype", "int64", "--codec", "zstd")
    assert done.returncode == 0, done.stderr
    for cell, docs in cells.items():
        assert all(np.array_equal(a, b) for a, b in zip(zarr_documents(tmp_path / "caches" / cell), docs))
    assert json.loads((tmp_path / "caches/cluster=3/quality=4/input_ids/data/zarr.json").read_text())[
        "data_type"] == "int64"
    assert not (tmp_path / "caches" / MANIFEST).exists() and not (tmp_path / "caches/.staging").exists()


@pytest.mark.slow  # a moto server and a Hub mirror
def test_an_unpinned_store_converts_from_s3_and_the_hub_to_the_same_shards(tmp_path, tiny_tokenizer, moto,
                                                                           bucket_url):
    make_store(tmp_path / "store", {"cluster=0/quality=4": 40, "cluster=1/quality=4": 30})
    convert_to_marin(tmp_path / "store", dest=tmp_path / "local", tokenizer=str(tiny_tokenizer))
    local = {s.path: s.sha256 for s in load_corpus(tmp_path / "local").shards}
    bucket, prefix = bucket_url[len("s3://"):].split("/", 1)
    for rel in tree_bytes(tmp_path / "store"):
        s3_client(moto).upload_file(str(tmp_path / "store" / rel), bucket, f"{prefix}/{rel}")
    convert_to_marin(bucket_url, dest=tmp_path / "s3", tokenizer=str(tiny_tokenizer), endpoint_url=moto)
    shutil.copytree(tmp_path / "store", tmp_path / "mirror/team/raw")
    with running_mirror(tmp_path / "mirror") as mirror:
        convert_to_marin("hf://datasets/team/raw", dest=tmp_path / "hf", tokenizer=str(tiny_tokenizer),
                         endpoint=mirror.url)
    for dest in ("s3", "hf"):
        assert {s.path: s.sha256 for s in load_corpus(tmp_path / dest).shards} == local
