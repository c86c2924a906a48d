"""The Levanter cache format: our writer's caches read back by zarr-python (the Zarr library), zarr-python's
arrays read by our reader, both codec generations and token widths, both layouts; hostile ledgers,
``zarr.json`` files and chunk files refused by name; what a path holds detected, never guessed."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import zarr
from levanter_env import CHUNK, INNER, make_cache, make_store

from marin_data.errors import CacheFormatError, CacheUnfinishedError, UnknownSourceError
from marin_data.levanter import CACHE, CORPUS, LZ4, STORE, ZSTD, chunk_documents, decode_chunk, detect, open_cache
from marin_data.levanter.arraymeta import ArrayMeta, parse_array_meta, render_array_meta
from marin_data.levanter.chunkfile import encode_chunk
from marin_data.levanter.ledger import parse_ledger
from marin_data.stores.local import LocalStore

# zarr.json exactly as tensorstore 0.1.86 writes it for Levanter's spec (int32 tokens, older Levanter's lz4).
TENSORSTORE_LZ4 = (
    b'{"chunk_grid":{"configuration":{"chunk_shape":[134217728]},"name":"regular"},"chunk_key_encoding":'
    b'{"name":"default"},"codecs":[{"configuration":{"chunk_shape":[262144],"codecs":[{"configuration":'
    b'{"endian":"little"},"name":"bytes"},{"configuration":{"blocksize":0,"clevel":5,"cname":"lz4","shuffle":'
    b'"shuffle","typesize":4},"name":"blosc"}],"index_codecs":[{"configuration":{"endian":"little"},"name":'
    b'"bytes"},{"name":"crc32c"}]},"name":"sharding_indexed"}],"data_type":"int32","fill_value":0,"node_type":'
    b'"array","shape":[18014398509481984],"zarr_format":3}')


def flat(docs) -> np.ndarray:
    return np.concatenate(docs)


def test_zarr_json_is_rendered_byte_for_byte_as_tensorstore_writes_it():
    meta = parse_array_meta(TENSORSTORE_LZ4, "zarr.json")
    assert meta == ArrayMeta(dtype="int32")
    assert render_array_meta(meta) == TENSORSTORE_LZ4


@pytest.mark.parametrize("dtype,codec,layout", [("int32", LZ4, "consolidated"), ("int64", ZSTD, "consolidated"),
                                                ("int64", LZ4, "sharded"), ("int32", ZSTD, "sharded")])
def test_the_zarr_library_reads_our_caches_and_we_read_them_back(tmp_path, dtype, codec, layout):
    docs = make_cache(tmp_path, 300, dtype=dtype, codec=codec, layout=layout, parts=3)
    cache = open_cache(LocalStore(tmp_path))
    assert (cache.rows, cache.tokens, cache.dtype) == (300, len(flat(docs)), dtype)
    assert len(cache.parts[0].data_chunks()) > 1  # several chunk files per part
    ours = np.concatenate([v for p in cache.parts for _, v in cache.iter_tokens(p)])
    assert np.array_equal(ours, flat(docs))
    library = []
    for part in cache.parts:
        data = zarr.open_array(tmp_path / (part.prefix or ".") / "input_ids/data", mode="r")
        offsets = zarr.open_array(tmp_path / (part.prefix or ".") / "input_ids/offsets", mode="r")
        assert (data.shape, data.dtype, data.chunks, data.shards) == ((2 ** 54,), np.dtype(dtype), (INNER,), (CHUNK,))
        rows = int(offsets[0])
        assert rows == part.rows
        library.append(data[:int(offsets[rows])])
        assert np.array_equal(offsets[1:rows + 1], cache.document_ends(part))
    assert np.array_equal(np.concatenate(library), flat(docs))


@pytest.mark.parametrize("cname,clevel", [("lz4", 5), ("zstd", 1)])
def test_we_read_arrays_the_zarr_library_wrote(tmp_path, cname, clevel):
    values = np.random.default_rng(1).integers(0, 128_256, 5000).astype(np.int64)
    arr = zarr.create_array(tmp_path / "a", shape=(2 ** 54,), shards=(CHUNK,), chunks=(INNER,), dtype="int64",
                            fill_value=0, compressors=zarr.codecs.BloscCodec(cname=cname, clevel=clevel,
                                                                             shuffle="shuffle"))
    arr[:len(values)] = values
    meta = parse_array_meta((tmp_path / "a/zarr.json").read_bytes(), "zarr.json")
    got = [decode_chunk((tmp_path / "a/c" / str(k)).read_bytes(), meta, min(CHUNK, len(values) - k * CHUNK), "c")
           for k in range(-(-len(values) // CHUNK))]
    assert np.array_equal(np.concatenate(got), values)


def test_a_chunk_cut_at_document_ends_gives_pieces_that_add_up():
    ends = np.array([3, 10, 10, 25, 40])
    tokens, offsets = chunk_documents(np.arange(10, 30), ends, start=10)
    assert tokens.dtype == np.uint32 and offsets.tolist() == [0, 15, 20]  # 10 is this chunk's start: no cut


# --- hostile input -----------------------------------------------------------------------------------
def _ledger(**over) -> bytes:
    doc = {"total_num_rows": 1, "shard_rows": {"a": 1}, "is_finished": True, "finished_shards": ["a"],
           "field_counts": {"input_ids": 3}, "metadata": {"preprocessor_metadata": None}}
    return json.dumps({**doc, **over}).encode()


@pytest.mark.parametrize("data,match", [
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (b"x" * ((64 << 20) + 1), "more than the"),
    (b"[1, 2]", "top level is a list"),
    (_ledger(total_num_rows=-1), "total_num_rows"),
    (_ledger(total_num_rows=True), "total_num_rows"),
    (_ledger(is_finished="yes"), "is_finished"),
    (_ledger(field_counts={"input_ids": "3"}), "field_counts"),
    (_ledger(layout="scattered"), "unknown layout"),
    (_ledger(finished_shards=[1]), "finished_shards"),
    (b"\xff\xfe{}", "not valid JSON"),
])
def test_a_hostile_ledger_is_refused_naming_the_file(data, match):
    with pytest.raises(CacheFormatError, match=match) as e:
        parse_ledger(data, "cell/shard_ledger.json")
    assert e.value.path == "cell/shard_ledger.json"


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.update(data_type="float32"), "data_type"),
    (lambda d: d.update(shape=[10, 10]), "1-D"),
    (lambda d: d["chunk_grid"]["configuration"].update(chunk_shape=[1 << 40]), "chunk grid"),
    (lambda d: d["codecs"][0]["configuration"].update(chunk_shape=[1000]), "does not divide"),
    (lambda d: d["codecs"][0]["configuration"]["codecs"][1]["configuration"].update(cname="brotli"), "blosc"),
    (lambda d: d["codecs"][0]["configuration"].update(index_location="start"), "start of the file"),
    (lambda d: d.update(codecs=[{"name": "bytes"}]), "sharding_indexed"),
    (lambda d: d.update(zarr_format=2), "Zarr v3"),
])
def test_an_unsupported_zarr_json_is_refused_by_name(edit, match):
    doc = json.loads(TENSORSTORE_LZ4)
    edit(doc)
    with pytest.raises(CacheFormatError, match=match):
        parse_array_meta(json.dumps(doc).encode(), "zarr.json")


META = ArrayMeta(dtype="int32", chunk=CHUNK, inner=INNER)


def _tamper_index(data: bytes, entry: int, offset: int, nbytes: int, *, fix_crc: bool = True) -> bytes:
    import crc32c

    n = META.inner_per_chunk
    body, index = data[:-META.index_bytes], bytearray(data[-META.index_bytes:-4])
    index[16 * entry:16 * entry + 16] = struct.pack("<QQ", offset, nbytes)
    crc = crc32c.crc32c(bytes(index)) if fix_crc else struct.unpack("<I", data[-4:])[0]
    assert len(index) == 16 * n
    return body + bytes(index) + struct.pack("<I", crc)


@pytest.mark.parametrize("tamper,match", [
    (lambda d, t: _tamper_index(d, 1, 0, 1 << 40), "outside the file"),
    (lambda d, t: _tamper_index(d, 1, 2 ** 64 - 100, 50), "outside the file"),
    (lambda d, t: _tamper_index(d, 1, int(t[0][0]), int(t[0][1])), "overlap"),
    (lambda d, t: _tamper_index(d, 1, 0, 5, fix_crc=False), "crc32c"),
    (lambda d, t: d[:-8], "crc32c|outside|overlap"),
    (lambda d, t: d[:10], "too short"),
])
def test_a_chunk_file_whose_index_lies_is_refused(tamper, match):
    values = np.arange(CHUNK, dtype=np.int32)
    data = encode_chunk(values, META)
    table = np.frombuffer(data[-META.index_bytes:-4], "<u8").reshape(-1, 2)
    with pytest.raises(CacheFormatError, match=match):
        decode_chunk(tamper(data, table), META, CHUNK, "c/0")


def test_a_blosc_frame_claiming_more_than_an_inner_chunk_is_refused_before_decompressing():
    data = bytearray(encode_chunk(np.arange(CHUNK, dtype=np.int32), META))
    struct.pack_into("<I", data, 4, 1 << 31)  # the first frame's uncompressed size: 2 GiB
    with pytest.raises(CacheFormatError, match="blosc frame claims 2147483648"):
        decode_chunk(bytes(data), META, CHUNK, "c/0")
    data = bytearray(encode_chunk(np.arange(CHUNK, dtype=np.int32), META))
    data[20:40] = b"\xff" * 20  # damaged compressed bytes behind an honest header
    with pytest.raises(CacheFormatError, match="blosc cannot decompress"):
        decode_chunk(bytes(data), META, CHUNK, "c/0")


# --- opening and detecting ---------------------------------------------------------------------------
def test_an_unfinished_or_half_cache_is_refused_by_name(tmp_path):
    make_cache(tmp_path / "c")
    (tmp_path / "c/input_ids/data/zarr.json").unlink()
    with pytest.raises(CacheFormatError, match="zarr.json missing behind the ledger") as e:
        open_cache(LocalStore(tmp_path / "c"))
    assert e.value.path.endswith("input_ids/data/zarr.json")
    make_cache(tmp_path / "u")
    ledger = json.loads((tmp_path / "u/shard_ledger.json").read_bytes())
    (tmp_path / "u/shard_ledger.json").write_text(json.dumps({**ledger, "is_finished": False}))
    with pytest.raises(CacheUnfinishedError, match="is_finished: false"):
        open_cache(LocalStore(tmp_path / "u"))
    assert open_cache(LocalStore(tmp_path / "u"), require_finished=False).rows == 200


def test_a_sharded_ledger_naming_a_folder_outside_the_cache_is_refused(tmp_path):
    make_cache(tmp_path, layout="sharded", parts=2)
    ledger = json.loads((tmp_path / "shard_ledger.json").read_bytes())
    ledger["finished_shards"][1] = "../elsewhere"
    (tmp_path / "shard_ledger.json").write_text(json.dumps(ledger))
    with pytest.raises(CacheFormatError, match="not a folder inside the cache"):
        open_cache(LocalStore(tmp_path))


def test_detect_tells_a_cache_a_store_and_a_corpus_apart(tmp_path, make_corpus):
    make_cache(tmp_path / "one")
    assert detect(tmp_path / "one").kind == CACHE
    make_store(tmp_path / "store", {"cluster=0/quality=1": 20, "cluster=1/quality=4": 20})
    make_cache(tmp_path / "store/cluster=2/quality=4", 20, layout="sharded", parts=2)
    found = detect(tmp_path / "store")
    assert (found.kind, found.cells) == (STORE, ("cluster=0/quality=1", "cluster=1/quality=4", "cluster=2/quality=4"))
    assert detect(make_corpus({"a": [5]}).root).kind == CORPUS


def test_an_unrecognised_tree_is_an_error_naming_what_was_expected(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x/notes.txt").write_text("hello")
    with pytest.raises(UnknownSourceError, match="no manifest.json .* and no shard_ledger.json .*notes.txt"):
        detect(tmp_path / "x")
    make_store(tmp_path / "s", {"cluster=0/quality=0": 10})
    (tmp_path / "s/stray.bin").write_bytes(b"1")
    with pytest.raises(UnknownSourceError, match="outside every Levanter cache .*stray.bin"):
        detect(tmp_path / "s")


def test_the_streaming_writer_spans_offsets_and_data_over_many_chunk_files(tmp_path):
    from dataclasses import replace

    from marin_data.levanter.writer import CacheWriter

    data = ArrayMeta(dtype="int64", chunk=64, inner=16, blosc=ZSTD)
    writer = CacheWriter(tmp_path, data, replace(data, dtype="int64"), metadata={"tokenizer": "t"})
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 100, int(rng.integers(0, 9))) for _ in range(300)]  # empty documents too
    for i in range(0, 300, 37):
        batch = docs[i:i + 37]
        writer.write(np.concatenate(batch), [len(d) for d in batch])
    ledger = writer.close()
    cache = open_cache(LocalStore(tmp_path))
    (part,) = cache.parts
    assert (ledger.total_num_rows, len(part.offsets_chunks()) > 3, len(part.data_chunks()) > 3) == (300, True, True)
    assert np.array_equal(cache.document_ends(part), np.cumsum([len(d) for d in docs]))
    assert np.array_equal(zarr.open_array(tmp_path / "input_ids/data", mode="r")[:cache.tokens], flat(docs))
    assert int(zarr.open_array(tmp_path / "input_ids/offsets", mode="r")[0]) == 300
