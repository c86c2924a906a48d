"""Caches crafted to mislead or exhaust the reader: an inner chunk marked not stored over real tokens (it
would read as zeros), a frame no index entry names, a ``zarr.json`` shape smaller than the ledger's count,
ledger counts no file can hold (10^15 tokens or rows, locally and over S3), a geometry that makes a chunk
file almost all index, and token ids outside the vocabulary (``adopt``, ``show``, the trainer's loader).
Each is refused or reported by name, in bounded memory, and never as a traceback."""

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
from test_levanter_checks import edit_json, found, rewrite_chunk

from marin_data.corpus.verify import ProblemKind
from marin_data.errors import CacheCheckError, CacheFormatError
from marin_data.levanter import ArrayMeta, adopt, cache_info, convert_to_marin
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


def test_a_fill_value_outside_the_arrays_type_is_refused_by_name(cache):
    edit_json(cache / DATA / ZARR_JSON, fill_value=2 ** 40)  # int32 tokens: numpy cannot fill with it
    assert found(cache) == found(cache, tokens=True) == {(f"{DATA}/{ZARR_JSON}", ProblemKind.BAD_CACHE_FILE)}


@pytest.mark.parametrize("bad", [VOCAB, -5])
def test_adopt_refuses_token_ids_outside_the_vocabulary_while_it_hashes(cache, tiny_tokenizer, bad):
    rewrite_chunk(cache / DATA, 1, lambda v: v.__setitem__(17, bad))
    before = tree_bytes(cache)
    with pytest.raises(CacheCheckError, match=f"token ids from .*{bad}.*vocabulary \\[0, {VOCAB}\\)") as refused:
        adopt(cache, tokenizer=str(tiny_tokenizer))
    assert f"{DATA}/c/1" in refused.value.path
    assert set(tree_bytes(cache)) <= set(before) | {".marin.lock"}
    done = cli("adopt", cache, "--tokenizer", tiny_tokenizer)
    assert done.returncode == 21 and f"{DATA}/c/1" in done.stderr


def test_show_names_a_negative_token_id(cache, tiny_tokenizer):
    rewrite_chunk(cache / DATA, 0, lambda v: v.__setitem__(1, -5))  # row 0: BOS and at least one token
    done = cli("show", cache, "--tokenizer", tiny_tokenizer, "-n", 2)
    assert done.returncode == 21, done.stderr
    assert "row 0: token 1 is -5" in done.stderr and f"{DATA}/c/0" in done.stderr and "Traceback" not in done.stderr


def parquet_corpus(root: Path, tokenizer: Path, tokens: np.ndarray) -> Path:
    """A one-shard Parquet corpus of ``tokens`` (documents of 50) whose manifest names ``tokenizer``."""
    from marin_data.corpus.commit import commit_corpus
    from marin_data.corpus.manifest import Manifest
    from marin_data.corpus.records import ShardRecord, SubsetInfo
    from marin_data.corpus.shard import shard_path, write_shard
    from marin_data.layout import TOKENIZER
    from marin_data.raw.tokenizer import load_tokenizer

    loaded = load_tokenizer(str(tokenizer))
    root.mkdir(parents=True)
    (root / TOKENIZER).write_bytes(loaded.data)
    offsets = np.arange(0, len(tokens) + 1, 50, dtype=np.int64)
    st = write_shard(root / shard_path("web", 0), [str(i) for i in range(len(offsets) - 1)],
                     tokens.astype(np.uint32), offsets, loaded.info)
    commit_corpus(root, Manifest("stray", "0", loaded.info, {"web": SubsetInfo(0, 0, 0, 0)}),
                  [ShardRecord(shard_path("web", 0), "web", st.bytes, st.sha256, st.docs, st.tokens, st.row_groups)])
    return root


def test_marin_train_refuses_a_token_id_past_the_vocabulary_before_step_1(tmp_path, tiny_tokenizer, capsys):
    from marin_train.cli import main

    tokens = np.random.default_rng(0).integers(2, VOCAB, 5000)
    tokens[1234] = VOCAB  # an id its tokenizer does not have: past the model's embedding
    root = parquet_corpus(tmp_path / "corpus", tiny_tokenizer, tokens)
    with pytest.raises(SystemExit) as exit_:
        main(["--data", str(root), "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--log-every", "1",
              "--cache-dir", str(tmp_path / "decoded")])
    out = capsys.readouterr()
    assert exit_.value.code == 21, out.err
    assert "token 1234 is 400, outside the model's vocabulary [0, 400)" in out.err and "data/web/" in out.err
    assert "loss" not in out.out and "Traceback" not in out.err  # no step ran


def test_the_loader_refuses_ids_past_a_smaller_model_vocabulary_once_per_shard(cache, tiny_tokenizer, tmp_path):
    from marin_data.loader import LoaderConfig, TokenStream

    adopt(cache, tokenizer=str(tiny_tokenizer))
    config = LoaderConfig(seq_len=16, batch_size=2, val_fraction=0.0)
    assert TokenStream(cache, config, cache_dir=tmp_path / "d").read(range(2)).input_ids.max() < VOCAB
    stream = TokenStream(cache, LoaderConfig(seq_len=16, batch_size=2, val_fraction=0.0, vocab_size=300),
                         cache_dir=tmp_path / "d")
    with pytest.raises(CacheCheckError, match=r"outside the model's vocabulary \[0, 300\)") as refused:
        stream.read(range(2))
    assert refused.value.path.startswith(f"{DATA}/c/")


def test_a_cache_opened_without_its_listing_makes_chunk_files_only_as_asked(cache):
    """A trace reads a few chunk files by position and lists nothing: whatever count a ledger and its shapes
    claim, the chunk files are made one at a time as a query asks for them."""
    from marin_data.levanter.cache import open_cache
    from marin_data.stores.local import LocalStore

    claim = 10 ** 9  # a million chunk files of the test cache's 1,024 values: ~150 MB as a list
    edit_json(cache / DATA / ZARR_JSON, shape=[claim])
    edit_json(cache / "shard_ledger.json", field_counts={"input_ids": claim})
    tracemalloc.start()
    try:
        chunks = open_cache(LocalStore(cache), listed=False).parts[0].data_chunks()
        last, few = chunks[-1], chunks[3:5]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    assert len(chunks) > 900_000 and last.stop == claim and [c.index for c in few] == [3, 4]
    with pytest.raises(CacheFormatError, match="not there"):
        open_cache(LocalStore(cache))  # the listing still refuses it where every file is read
