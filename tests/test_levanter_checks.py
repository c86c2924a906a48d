"""Every structural defect Levanter never checks, planted in a cache and caught by name: ledger unfinished
or missing, ``zarr.json`` missing, ``offsets[0]`` != rows, offsets decreasing, last offset != the ledger's
tokens, sub-cache totals != the top ledger, ``.success`` missing, ``.stats.json`` disagreeing, a wrong
dtype, a missing or damaged chunk file, token ids outside the vocabulary, documents without their BOS."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from levanter_env import BOS, CHUNK, INNER, VOCAB, make_cache, make_store

from marin_data.corpus.verify import ProblemKind
from marin_data.errors import UnknownSourceError
from marin_data.levanter.arraymeta import ZARR_JSON, parse_array_meta
from marin_data.levanter.chunkfile import decode_chunk, encode_chunk
from marin_data.levanter.verify import verify_source


def found(root: Path, **options) -> set[tuple[str, ProblemKind]]:
    return {(p.path, p.kind) for p in verify_source(root, **options).problems}


def edit_json(path: Path, **changes) -> None:
    doc = json.loads(path.read_bytes())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def rewrite_chunk(array: Path, k: int, change) -> None:
    """Re-encode chunk file ``k`` of ``array`` with ``change(values)`` applied (a valid file, wrong values)."""
    meta = parse_array_meta((array / ZARR_JSON).read_bytes(), "zarr.json")
    path = array / meta.chunk_key(k)
    values = decode_chunk(path.read_bytes(), meta, meta.chunk, str(path))
    change(values)
    path.write_bytes(encode_chunk(np.trim_zeros(values, "b") if k else values, meta))


@pytest.fixture
def cache(tmp_path) -> Path:
    make_cache(tmp_path / "c", 300, stats=True)
    return tmp_path / "c"


@pytest.fixture
def sharded(tmp_path) -> Path:
    make_cache(tmp_path / "s", 300, layout="sharded", parts=3, dtype="int64")
    return tmp_path / "s"


def test_a_sound_cache_and_store_pass_every_check(cache, sharded, tmp_path):
    assert found(cache, tokens=True, vocab_size=VOCAB, expect_bos=BOS) == set()
    assert found(sharded, tokens=True, vocab_size=VOCAB, expect_bos=BOS) == set()
    make_store(tmp_path / "store", {"cluster=0/quality=0": 50, "cluster=0/quality=1": 60})
    assert found(tmp_path / "store", tokens=True, vocab_size=VOCAB, expect_bos=BOS) == set()


def test_an_unfinished_ledger(cache):
    edit_json(cache / "shard_ledger.json", is_finished=False)
    assert found(cache) == {("shard_ledger.json", ProblemKind.UNFINISHED)}


def test_a_missing_ledger_in_a_store_cell(tmp_path):
    make_store(tmp_path, {"cluster=0/quality=0": 20, "cluster=1/quality=0": 20})
    (tmp_path / "cluster=1/quality=0/shard_ledger.json").unlink()
    with pytest.raises(UnknownSourceError, match="outside every Levanter cache"):  # its files belong to no cache
        found(tmp_path)


def test_a_missing_ledger_in_a_sub_cache(sharded):
    (sharded / "part-00001-of-00003/shard_ledger.json").unlink()
    assert found(sharded) == {("part-00001-of-00003/shard_ledger.json", ProblemKind.BAD_CACHE_FILE)}


def test_a_missing_zarr_json(cache):
    (cache / "input_ids/offsets/zarr.json").unlink()
    assert found(cache) == {("input_ids/offsets/zarr.json", ProblemKind.BAD_CACHE_FILE)}


def test_offsets_zero_is_not_the_row_count(cache):
    rewrite_chunk(cache / "input_ids/offsets", 0, lambda v: v.__setitem__(0, 299))
    assert found(cache) == {("input_ids/offsets/c/0", ProblemKind.BAD_OFFSETS)}


def test_offsets_that_decrease(cache):
    rewrite_chunk(cache / "input_ids/offsets", 0, lambda v: v.__setitem__(5, v[4] - 1))
    assert found(cache) == {("input_ids/offsets/c/0", ProblemKind.BAD_OFFSETS)}


def test_the_last_offset_is_not_the_ledgers_token_count(cache):
    ledger = json.loads((cache / "shard_ledger.json").read_bytes())
    tokens = ledger["field_counts"]["input_ids"]
    edit_json(cache / "shard_ledger.json", field_counts={"input_ids": tokens - 1})
    edit_json(cache / ".stats.json", total_tokens=tokens - 1)
    assert found(cache) == {("input_ids/offsets/c/0", ProblemKind.BAD_OFFSETS)}


def test_sub_cache_totals_that_do_not_add_up_to_the_top_ledger(sharded):
    ledger = json.loads((sharded / "shard_ledger.json").read_bytes())
    edit_json(sharded / "shard_ledger.json", total_num_rows=ledger["total_num_rows"] + 1,
              shard_rows={**ledger["shard_rows"], "part-00001-of-00003": 7})
    problems = verify_source(sharded).problems
    assert {(p.path, p.kind) for p in problems} == {("shard_ledger.json", ProblemKind.COUNT_MISMATCH)}
    assert any("shard_rows['part-00001-of-00003'] is 7" in p.message for p in problems)
    assert any("sub-caches add up to 300" in p.message for p in problems)


def test_a_sub_cache_without_its_success_marker(sharded):
    (sharded / "part-00002-of-00003/.success").unlink()
    assert found(sharded) == {("part-00002-of-00003/.success", ProblemKind.UNFINISHED)}


def test_stats_json_that_disagrees(cache):
    edit_json(cache / ".stats.json", total_elements=3)
    assert found(cache) == {(".stats.json", ProblemKind.STATS_MISMATCH)}


def test_a_wrong_dtype(cache):
    edit_json(cache / "input_ids/data/zarr.json", data_type="uint16")
    meta = json.loads((cache / "input_ids/data/zarr.json").read_bytes())
    meta["codecs"][0]["configuration"]["codecs"][1]["configuration"]["typesize"] = 2
    (cache / "input_ids/data/zarr.json").write_text(json.dumps(meta))
    assert ("input_ids/data/zarr.json", ProblemKind.WRONG_DTYPE) in found(cache)


def test_a_missing_chunk_file_is_named(cache):
    (cache / "input_ids/data/c/2").unlink()
    assert found(cache) == {("input_ids/data/c/2", ProblemKind.BAD_CACHE_FILE)}
    assert "1 of them are not there" in verify_source(cache).problems[0].message


def test_a_damaged_chunk_file(cache):
    data = bytearray((cache / "input_ids/data/c/1").read_bytes())
    data[-10] ^= 0xFF  # inside the shard index: its crc32c no longer matches
    (cache / "input_ids/data/c/1").write_bytes(bytes(data))
    assert found(cache) == {("input_ids/data/c/1", ProblemKind.BAD_CACHE_FILE)}


def test_a_chunk_file_larger_than_its_array_allows_is_refused_unread(cache):
    from marin_data.levanter.cache import max_chunk_file_bytes

    meta = parse_array_meta((cache / "input_ids/data/zarr.json").read_bytes(), "zarr.json")
    path = cache / "input_ids/data/c/0"
    path.write_bytes(b"\0" * (max_chunk_file_bytes(meta) + 1) + path.read_bytes()[-meta.index_bytes:])
    assert found(cache) == found(cache, tokens=True) == {("input_ids/data/c/0", ProblemKind.BAD_CACHE_FILE)}
    assert "larger than" in verify_source(cache, tokens=True).problems[0].message


def test_token_ids_outside_the_vocabulary(cache):
    rewrite_chunk(cache / "input_ids/data", 1, lambda v: v.__setitem__(17, VOCAB))
    assert found(cache) == set()  # the metadata checks do not decode tokens
    assert found(cache, tokens=True, vocab_size=VOCAB) == {("input_ids/data/c/1", ProblemKind.OUT_OF_VOCAB)}
    assert found(cache, tokens=True, vocab_size=VOCAB + 1) == set()


def test_documents_whose_bos_was_dropped(cache):
    ends = json.loads((cache / "shard_ledger.json").read_bytes())["field_counts"]["input_ids"]
    assert ends > 2 * CHUNK
    meta = parse_array_meta((cache / "input_ids/offsets/zarr.json").read_bytes(), "zarr.json")
    offsets = decode_chunk((cache / "input_ids/offsets/c/0").read_bytes(), meta, 301, "o")
    start = int(offsets[100])  # document 100 starts where document 99 ends
    k, i = divmod(start, CHUNK)
    rewrite_chunk(cache / "input_ids/data", k, lambda v: v.__setitem__(i, 7))
    assert found(cache, tokens=True, vocab_size=VOCAB, expect_bos=BOS) == {
        (f"input_ids/data/c/{k}", ProblemKind.MISSING_BOS)}
    assert found(cache, tokens=True, vocab_size=VOCAB) == set()
    assert INNER < CHUNK
