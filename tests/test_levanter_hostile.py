"""Caches crafted to mislead or exhaust the reader: an inner chunk marked not stored over real tokens (it
would read as zeros), a frame no index entry names, a ``zarr.json`` shape smaller than the ledger's count,
ledger counts no file can hold (10^15 tokens or rows, locally and over S3), and a geometry that makes a
chunk file almost all index. Each is refused or reported by name, in bounded memory, and never as a
traceback."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import crc32c
import numpy as np
import pytest
from levanter_env import VOCAB, make_cache
from s3_env import bucket_url, moto, s3_client  # noqa: F401 - fixtures
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401 - a fixture
from test_levanter_checks import edit_json, found

from marin_data.corpus.verify import ProblemKind
from marin_data.errors import CacheFormatError
from marin_data.levanter import ArrayMeta, cache_info, convert_to_marin
from marin_data.levanter.arraymeta import MAX_CHUNK, MAX_INNER_CHUNKS, ZARR_JSON, parse_array_meta, \
    render_array_meta
from marin_data.levanter.chunkfile import EMPTY
from marin_data.levanter.verify import verify_source

DATA = "input_ids/data"


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marin_data", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def meta_of(cache: Path, array: str = DATA) -> ArrayMeta:
    return parse_array_meta((cache / array / ZARR_JSON).read_bytes(), ZARR_JSON)


def rewrite_index(path: Path, meta: ArrayMeta, change) -> None:
    """Apply ``change(table)`` to a chunk file's shard index and write it back with its crc32c recomputed,
    every frame left where it was."""
    data = path.read_bytes()
    table = np.frombuffer(data[-meta.index_bytes:-4], "<u8").reshape(-1, 2).copy()
    change(table)
    index = table.tobytes()
    path.write_bytes(data[:-meta.index_bytes] + index + struct.pack("<I", crc32c.crc32c(index)))


@pytest.fixture
def cache(tmp_path) -> Path:
    make_cache(tmp_path / "c", 300)
    return tmp_path / "c"


def test_an_inner_chunk_marked_not_stored_over_tokens_is_found_and_refused(cache, tiny_tokenizer, tmp_path):
    rewrite_index(cache / DATA / "c/1", meta_of(cache), lambda t: t.__setitem__(1, EMPTY))  # would read as zeros
    assert found(cache) == found(cache, tokens=True, vocab_size=VOCAB) == {(f"{DATA}/c/1",
                                                                            ProblemKind.BAD_CACHE_FILE)}
    assert "no entry references" in verify_source(cache).problems[0].message
    before = tree_bytes(cache)
    done = cli("adopt", cache, "--tokenizer", tiny_tokenizer)
    assert done.returncode == 19 and f"{DATA}/c/1" in done.stderr and "Traceback" not in done.stderr
    assert tree_bytes(cache) == before
    done = cli("convert", cache, "--format", "marin", "--to", tmp_path / "out", "--tokenizer", tiny_tokenizer)
    assert done.returncode == 19 and f"{DATA}/c/1" in done.stderr, done.stderr
    assert not (tmp_path / "out/manifest.json").exists()


def test_bytes_no_index_entry_names_are_a_finding(cache, tiny_tokenizer):
    path, meta = cache / DATA / "c/2", meta_of(cache)
    data = path.read_bytes()
    path.write_bytes(data[:-meta.index_bytes] + b"\0" * 40 + data[-meta.index_bytes:])  # a frame after the last
    assert found(cache) == {(f"{DATA}/c/2", ProblemKind.BAD_CACHE_FILE)}
    with pytest.raises(CacheFormatError, match="no entry references"):
        convert_to_marin(cache, dest=cache.parent / "out", tokenizer=str(tiny_tokenizer))


def test_a_shape_smaller_than_the_ledgers_tokens_is_found_and_refused(cache, tmp_path, tiny_tokenizer):
    tokens = json.loads((cache / "shard_ledger.json").read_bytes())["field_counts"]["input_ids"]
    edit_json(cache / DATA / ZARR_JSON, shape=[tokens - 10])
    assert found(cache) == {(f"{DATA}/{ZARR_JSON}", ProblemKind.BAD_CACHE_FILE)}
    assert "more than the array's shape" in verify_source(cache).problems[0].message
    done = cli("convert", cache, "--format", "marin", "--to", tmp_path / "out", "--tokenizer", tiny_tokenizer)
    assert done.returncode == 19 and f"{DATA}/{ZARR_JSON}" in done.stderr, done.stderr


@pytest.mark.parametrize("field", ["field_counts", "total_num_rows"])
def test_ledger_counts_no_file_can_hold_are_refused_at_once_in_bounded_memory(cache, field):
    edit_json(cache / "shard_ledger.json", **({"field_counts": {"input_ids": 10 ** 15}} if field == "field_counts"
                                              else {"total_num_rows": 10 ** 15}))
    array = DATA if field == "field_counts" else "input_ids/offsets"
    tracemalloc.start()
    try:
        with pytest.raises(CacheFormatError, match="of them are not there") as refused:
            cache_info(cache)
        problems = verify_source(cache).problems
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert f"{array}/c/" in refused.value.path and "1,000,000,000,000,0" in refused.value.message
    assert [(p.path, p.kind) for p in problems] == [(refused.value.path[len(str(cache)) + 1:],
                                                     ProblemKind.BAD_CACHE_FILE)]


def test_ledger_counts_no_file_can_hold_are_refused_over_s3(cache, moto, bucket_url):  # noqa: F811
    edit_json(cache / "shard_ledger.json", field_counts={"input_ids": 10 ** 15})
    bucket, prefix = bucket_url[len("s3://"):].split("/", 1)
    client = s3_client(moto)
    for rel in tree_bytes(cache):
        client.upload_file(str(cache / rel), bucket, f"{prefix}/{rel}")
    done = cli("info", bucket_url, "--endpoint-url", moto)
    assert done.returncode == 19 and f"{DATA}/c/" in done.stderr and "Traceback" not in done.stderr, done.stderr
    done = cli("verify", bucket_url, "--endpoint-url", moto)
    assert done.returncode == 1 and f"{DATA}/c/" in done.stdout, done.stdout + done.stderr


def test_a_chunk_file_of_more_inner_chunks_than_the_limit_is_refused_by_name(cache):
    meta = json.loads((cache / DATA / ZARR_JSON).read_bytes())
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [1 << 20]
    meta["codecs"][0]["configuration"]["chunk_shape"] = [1]  # a 16 MiB index for 4 MiB of tokens
    (cache / DATA / ZARR_JSON).write_text(json.dumps(meta))
    assert found(cache) == {(f"{DATA}/{ZARR_JSON}", ProblemKind.BAD_CACHE_FILE)}
    with pytest.raises(CacheFormatError, match=f"more than the {MAX_INNER_CHUNKS:,}"):
        cache_info(cache)
    done = cli("info", cache)
    assert done.returncode == 19 and "inner chunks of 1 elements" in done.stderr, done.stderr


def test_levanter_geometry_and_the_limits_own_edge_are_accepted():
    for meta in (ArrayMeta("int64"), ArrayMeta("int32", chunk=MAX_CHUNK, inner=MAX_CHUNK // MAX_INNER_CHUNKS),
                 ArrayMeta("int32", chunk=64, inner=16)):
        assert parse_array_meta(render_array_meta(meta), ZARR_JSON) == meta
    with pytest.raises(CacheFormatError, match="inner chunks of"):
        parse_array_meta(render_array_meta(ArrayMeta("int32", chunk=MAX_CHUNK,
                                                     inner=MAX_CHUNK // MAX_INNER_CHUNKS // 2)), ZARR_JSON)
