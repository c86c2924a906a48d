"""The golden Levanter caches in tests/fixtures/levanter/ agree with themselves and with the format Levanter writes.

Real Levanter wrote them and read them back (scripts/make_levanter_fixtures.py); EXPECTED.json holds what it
read. These checks need numpy alone, never Levanter: every file is the one recorded (a hand edit is caught),
ledgers add up to what Levanter read and a sharded ledger to its parts, each zarr.json is Levanter's spec, each
shard index matches its crc32c, offsets match the documents, and the long documents follow their rule.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "levanter"
EXPECTED = json.loads((FIXTURES / "EXPECTED.json").read_text())
CACHES = EXPECTED["caches"]
ZARR_JSONS = sorted(FIXTURES.rglob("zarr.json"))
INNER = EXPECTED["inner_chunk_elements"]
OUTER = 134_217_728  # elements per chunk file (levanter's DEFAULT_WRITE_CHUNK_SIZE)
NO_CHUNK = 2**64 - 1  # a shard index entry (offset, nbytes) of a chunk never written: both all ones


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        for _ in range(8):
            n = (n >> 1) ^ 0x82F63B78 if n & 1 else n >> 1  # Castagnoli, reflected
        table.append(n)
    return table


TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def doc_tokens(doc: list | dict) -> np.ndarray:
    """A document of EXPECTED.json: verbatim, or regenerated from its rule and held to its sha256."""
    if isinstance(doc, list):
        return np.asarray(doc, dtype=np.int64)
    j = np.arange(doc["length"], dtype=np.int64)
    tokens = {"1000 + j // 1024": 1000 + j // 1024, "0": np.zeros_like(j)}[doc["rule"]]
    assert hashlib.sha256(tokens.astype("<i8").tobytes()).hexdigest() == doc["sha256_int64le"]
    return tokens


def ledger(path: Path) -> dict:
    return json.loads((path / "shard_ledger.json").read_text())


def test_every_fixture_file_is_the_one_levanter_wrote():
    on_disk = {p.relative_to(FIXTURES).as_posix(): p for p in FIXTURES.rglob("*") if p.is_file()}
    on_disk = {k: v for k, v in on_disk.items() if k not in ("EXPECTED.json", "README.md")}
    assert sorted(on_disk) == sorted(EXPECTED["files"])
    for name, path in on_disk.items():
        data = path.read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == tuple(EXPECTED["files"][name].values()), name


def test_the_fixtures_stay_small():
    assert sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file()) < 300_000


@pytest.mark.parametrize("name", CACHES)
def test_ledger_totals_are_what_levanter_read(name):
    cache, top = CACHES[name], ledger(FIXTURES / name)
    docs = [doc_tokens(d) for d in cache["documents"]]
    assert top == cache["ledger"] and top["is_finished"] and top["layout"] == cache["layout"]
    assert top["total_num_rows"] == cache["rows"] == len(docs)
    assert top["field_counts"] == {"input_ids": cache["tokens"]} == {"input_ids": sum(map(len, docs))}
    assert cache["flat_field_length"] == cache["tokens"]


@pytest.mark.parametrize("name", [n for n, c in CACHES.items() if c["layout"] == "sharded"])
def test_a_sharded_ledger_adds_up_over_its_parts(name):
    top = ledger(FIXTURES / name)
    parts = sorted(p.name for p in (FIXTURES / name).iterdir() if p.is_dir())
    assert top["finished_shards"] == parts and not (FIXTURES / name / "input_ids").exists()
    for part in parts:
        own = ledger(FIXTURES / name / part)
        assert own["layout"] == "consolidated" and own["is_finished"]
        assert top["shard_rows"][part] == own["total_num_rows"] == CACHES[name]["caches"][part]["rows"]
        assert top["field_counts_by_shard"][part] == own["field_counts"]
        assert (FIXTURES / name / part / ".success").read_bytes() == b""
    assert sum(top["shard_rows"].values()) == top["total_num_rows"]
    assert sum(c["input_ids"] for c in top["field_counts_by_shard"].values()) == top["field_counts"]["input_ids"]


@pytest.mark.parametrize("path", ZARR_JSONS, ids=lambda p: p.relative_to(FIXTURES).as_posix())
def test_zarr_json_is_the_spec_levanter_writes(path):
    meta = json.loads(path.read_text())
    array = path.parent.name
    cache = next(CACHES[n] for n in sorted(CACHES, key=len, reverse=True) if path.is_relative_to(FIXTURES / n))
    zstd = "zstd clevel 1" in cache["made_by"]
    dtype = "int64" if array == "offsets" else cache["dtype"]
    assert meta.keys() == {"chunk_grid", "chunk_key_encoding", "codecs", "data_type", "fill_value", "node_type",
                           "shape", "zarr_format"}
    assert (meta["zarr_format"], meta["node_type"], meta["shape"], meta["fill_value"]) == (3, "array", [2**54], 0)
    assert meta["data_type"] == dtype
    assert meta["chunk_grid"] == {"configuration": {"chunk_shape": [OUTER]}, "name": "regular"}
    assert meta["chunk_key_encoding"] == {"name": "default"}
    [sharding] = meta["codecs"]
    assert sharding["name"] == "sharding_indexed" and sharding["configuration"].keys() == {"chunk_shape", "codecs",
                                                                                           "index_codecs"}
    assert sharding["configuration"]["chunk_shape"] == [INNER]
    blosc = {"blocksize": 0, "clevel": 1 if zstd else 5, "cname": "zstd" if zstd else "lz4", "shuffle": "shuffle",
             "typesize": np.dtype(dtype).itemsize}
    assert sharding["configuration"]["codecs"] == [{"configuration": {"endian": "little"}, "name": "bytes"},
                                                   {"configuration": blosc, "name": "blosc"}]
    assert sharding["configuration"]["index_codecs"] == [{"configuration": {"endian": "little"}, "name": "bytes"},
                                                         {"name": "crc32c"}]


@pytest.mark.parametrize("path", ZARR_JSONS, ids=lambda p: p.relative_to(FIXTURES).as_posix())
def test_each_shard_index_sits_at_the_end_of_its_chunk_file_under_its_crc32c(path):
    files = sorted(p.relative_to(path.parent).as_posix() for p in path.parent.rglob("*") if p.is_file())
    assert files == ["c/0", "zarr.json"]  # a 2^54-element array this small has one chunk file
    raw = (path.parent / "c" / "0").read_bytes()
    n_inner = OUTER // INNER
    index, stored = raw[-(n_inner * 16 + 4):-4], int.from_bytes(raw[-4:], "little")
    assert crc32c(index) == stored
    entries = np.frombuffer(index, dtype="<u8").reshape(n_inner, 2)
    present = [[i, int(o), int(n)] for i, (o, n) in enumerate(entries) if not o == n == NO_CHUNK]
    assert all(o == n == NO_CHUNK for i, (o, n) in enumerate(entries) if i not in {p[0] for p in present})
    position = 0
    for _, offset, nbytes in present:  # packed from byte 0 in chunk order, then the index
        assert offset == position
        position += nbytes
    assert position == len(raw) - (n_inner * 16 + 4)
    cache_dir = path.parent.parent.parent
    name = next(n for n in sorted(CACHES, key=len, reverse=True) if cache_dir.is_relative_to(FIXTURES / n))
    key = cache_dir.relative_to(FIXTURES / name).as_posix()
    recorded = CACHES[name]["caches"][key][path.parent.name]["chunk_files"]["c/0"]
    assert recorded == {"bytes": len(raw), "index_crc32c": f"{stored:08x}", "inner_chunks": present}


@pytest.mark.parametrize("name", CACHES)
def test_offsets_hold_the_row_count_then_each_documents_end(name):
    cache = CACHES[name]
    lengths = [len(doc_tokens(d)) for d in cache["documents"]]
    parts = cache["caches"]
    if cache["layout"] == "sharded":  # each part's offsets restart at 0; together they are the documents
        lengths_read = []
        for part in cache["ledger"]["finished_shards"]:
            offsets = parts[part]["offsets_read"]
            assert offsets[0] == parts[part]["rows"]
            lengths_read += np.diff([0, *offsets[1:]]).tolist()
    else:
        offsets = parts["."]["offsets_read"]
        assert offsets[0] == cache["rows"] and offsets[-1] == cache["tokens"]
        lengths_read = np.diff([0, *offsets[1:]]).tolist()
    assert lengths_read == lengths


def test_a_run_of_zeros_over_a_whole_inner_chunk_is_not_stored():
    cache = CACHES["consolidated-int64-zstd"]
    ends = np.cumsum([len(doc_tokens(d)) for d in cache["documents"]])
    zeros = next(i for i, d in enumerate(cache["documents"]) if isinstance(d, dict) and d["rule"] == "0")
    assert ends[zeros - 1] < 2 * INNER and ends[zeros] > 3 * INNER
    stored = [c[0] for c in cache["caches"]["."]["data"]["chunk_files"]["c/0"]["inner_chunks"]]
    assert stored == [0, 1, 3]


def test_a_long_document_crosses_an_inner_chunk_boundary():
    for name in ("consolidated-int32-lz4", "consolidated-int64-zstd"):
        docs = CACHES[name]["documents"]
        ends = np.cumsum([len(doc_tokens(d)) for d in docs])
        long = next(i for i, d in enumerate(docs) if isinstance(d, dict) and d["rule"] != "0")
        assert ends[long - 1] < INNER < ends[long]


def test_stats_json_agrees_with_the_ledger_of_its_cell():
    for store, cells in EXPECTED["stores"].items():
        for cell in cells:
            top = ledger(FIXTURES / store / cell)
            stats = json.loads((FIXTURES / store / cell / ".stats.json").read_text())
            assert stats == {"total_tokens": top["field_counts"]["input_ids"], "total_elements": top["total_num_rows"]}


def test_the_tokenized_cache_carries_its_tokenizer_and_bos_eos():
    cache = CACHES["tokenized-int64-lz4"]
    meta = cache["ledger"]["metadata"]["preprocessor_metadata"]
    tokenizer = json.loads((FIXTURES / meta["tokenizer"] / "tokenizer.json").read_text())
    config = json.loads((FIXTURES / meta["tokenizer"] / "tokenizer_config.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert meta["vocab_size"] == len(vocab) and meta["append_bos"] and meta["append_eos"]
    for doc in cache["documents"]:
        assert doc[0] == vocab[config["bos_token"]] and doc[-1] == vocab[config["eos_token"]]
        assert max(doc) < meta["vocab_size"]
